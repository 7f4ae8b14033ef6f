//! The configuration file as a careless operator or an attacker leaves it:
//! a FIFO, a device or a directory at its path, a file deleted or too
//! large, bytes that are not UTF-8. `--check`, the start and the reload
//! watcher read it by one rule, never block on it, and say when they refuse.
//! The TLS files it names are re-read when they change, and a bad new pair
//! keeps the old one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use reprise_testkit::sidecar::{free_addr, write_temp, Running};

use crate::cli::{config_file, start, status};
use crate::support::{api, Action, Upstream, UpstreamConfig};

const BIN: &str = env!("CARGO_BIN_EXE_reprise-sidecar");

/// Runs the binary with `args` to its end, or kills it after `within`
/// (`None`: it was still running).
fn run_within(args: &[&std::ffi::OsStr], within: Duration) -> Option<Output> {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run reprise-sidecar");
    let started = Instant::now();
    while started.elapsed() < within {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// `--config path --check`, bounded.
fn check_within(path: &Path, within: Duration) -> Option<Output> {
    run_within(
        &["--config".as_ref(), path.as_os_str(), "--check".as_ref()],
        within,
    )
}

/// A FIFO at a fresh path of its own for `label`.
fn fifo(label: &str) -> PathBuf {
    let path = write_temp(label, "").with_file_name("fifo.yaml");
    let _ = std::fs::remove_file(&path);
    let made = Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
    path
}

/// A valid configuration's text for upstream `api` on `up`, padded with a
/// comment to at least `size` bytes.
fn padded(up: &Upstream, size: usize) -> String {
    let mut text = crate::support::Config::from(api(&[up])).to_yaml();
    if text.len() < size {
        text.push('#');
        text.push_str(&" ".repeat(size - text.len()));
        text.push('\n');
    }
    text
}

/// The bytes the process has read so far (`rchar` in `/proc/PID/io`).
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar")
}

const REFUSED: [(&str, &str); 1] = [("result", "refused")];

/// Waits until the refused reloads reach `at_least`; returns the last count.
async fn refused_reaches(sidecar: &Running, at_least: f64, within: Duration) -> f64 {
    sidecar
        .wait_for_metric("reprise_config_reloads_total", &REFUSED, within, |v| {
            v >= at_least
        })
        .await
        .unwrap_or(0.0)
}

/// Log lines saying a reload was refused, once one says `what` (the log is
/// written out every 50 ms, after the counter moved) or 5 s have passed.
async fn refusal_lines(sidecar: &Running, what: &str) -> Vec<String> {
    let lines = || -> Vec<String> {
        sidecar
            .lines()
            .into_iter()
            .filter(|l| l.contains("reload refused"))
            .collect()
    };
    for _ in 0..100 {
        if lines().iter().any(|l| l.contains(what)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Anything logged with it is out too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    lines()
}

#[test]
fn check_refuses_a_fifo_at_once() {
    let path = fifo("check-fifo");
    let out = check_within(&path, Duration::from_secs(10))
        .expect("--check on a FIFO returns instead of waiting for a writer");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a regular file (a FIFO)"), "{stderr}");
}

#[test]
fn check_refuses_a_device_and_a_directory() {
    for (path, kind) in [
        (PathBuf::from("/dev/zero"), "a character device"),
        (std::env::temp_dir(), "a directory"),
    ] {
        let out = check_within(&path, Duration::from_secs(10)).expect("--check returns");
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("not a regular file ({kind})")),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn check_refuses_a_file_over_16_mib_naming_the_limit() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = write_temp("check-large", &padded(&up, (16 << 20) + 1));
    let out = check_within(&path, Duration::from_secs(60)).expect("--check returns");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("over the 16777216-byte limit"), "{stderr}");
}

#[tokio::test]
async fn check_and_the_start_refuse_text_that_is_not_utf8_naming_the_byte() {
    let up = Upstream::always(Action::Reply(200)).await;
    // "# café" in Latin-1 (é is the byte 0xE9, at offset 5), then a valid file.
    let mut bytes = b"# caf\xE9\n".to_vec();
    bytes.extend_from_slice(padded(&up, 0).as_bytes());
    let path = write_temp("latin1", "");
    std::fs::write(&path, &bytes).expect("write");
    let out = check_within(&path, Duration::from_secs(10)).expect("--check returns");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not valid UTF-8 at byte 5"), "{stderr}");
    // The sidecar itself refuses it at start, by the same rule.
    let (listen, admin) = (free_addr().to_string(), free_addr().to_string());
    let args: Vec<&std::ffi::OsStr> = vec![
        "--config".as_ref(),
        path.as_os_str(),
        "--listen".as_ref(),
        listen.as_ref(),
        "--admin".as_ref(),
        admin.as_ref(),
    ];
    let out = run_within(&args, Duration::from_secs(10))
        .expect("the sidecar exits at start instead of serving");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not valid UTF-8 at byte 5"), "{stderr}");
}

#[tokio::test]
async fn a_reload_refuses_text_that_is_not_utf8_and_keeps_serving() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file("reload-latin1", api(&[&up]));
    let sidecar = start(&path, &[]).await;
    let mut bytes = b"# caf\xE9\n".to_vec();
    bytes.extend_from_slice(padded(&up, 0).as_bytes());
    std::fs::write(&path, &bytes).expect("write");
    assert_eq!(
        refused_reaches(&sidecar, 1.0, Duration::from_secs(5)).await,
        1.0
    );
    let ok = sidecar
        .metric("reprise_config_reloads_total", &[("result", "ok")])
        .await;
    assert_eq!(ok, Some(0.0), "the Latin-1 file was not loaded");
    let lines = refusal_lines(&sidecar, "not valid UTF-8 at byte 5").await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("not valid UTF-8 at byte 5")),
        "{:?}",
        sidecar.lines()
    );
}

#[tokio::test]
async fn a_fifo_at_the_path_is_refused_and_sigterm_still_exits() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file("reload-fifo", api(&[&up]));
    let mut sidecar = start(&path, &[]).await;
    std::fs::remove_file(&path).expect("remove");
    let made = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
    assert!(made.success());
    // Refused on every check while it stays, and logged once.
    assert!(refused_reaches(&sidecar, 2.0, Duration::from_secs(6)).await >= 2.0);
    let lines = refusal_lines(&sidecar, "a FIFO").await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("not a regular file (a FIFO)"),
        "{lines:?}"
    );
    assert_eq!(
        status(sidecar.listen, "api", "/").await,
        Some(200),
        "the running configuration still serves"
    );
    let exit = sidecar
        .stop(Duration::from_secs(10))
        .await
        .expect("SIGTERM ends the process");
    assert_eq!(exit.code, Some(0));
}

#[tokio::test]
async fn a_deleted_or_directory_config_is_logged_once_and_counted_on_every_check_and_sighup() {
    let up = Upstream::always(Action::Reply(200)).await;
    let path = config_file("reload-deleted", api(&[&up]));
    let sidecar = start(&path, &[]).await;
    std::fs::remove_file(&path).expect("remove");
    let counted = refused_reaches(&sidecar, 3.0, Duration::from_secs(8)).await;
    assert!(counted >= 3.0, "refused {counted} times");
    let lines = refusal_lines(&sidecar, "cannot read").await;
    assert_eq!(lines.len(), 1, "one line per distinct error: {lines:?}");
    // SIGHUP counts too.
    let before = sidecar
        .metric("reprise_config_reloads_total", &REFUSED)
        .await
        .expect("metric");
    sidecar.signal("HUP").expect("SIGHUP");
    assert!(refused_reaches(&sidecar, before + 1.0, Duration::from_secs(3)).await > before);
    // A directory in its place is another error: one more line.
    std::fs::create_dir(&path).expect("mkdir");
    let now = sidecar
        .metric("reprise_config_reloads_total", &REFUSED)
        .await
        .expect("metric");
    refused_reaches(&sidecar, now + 2.0, Duration::from_secs(6)).await;
    let lines = refusal_lines(&sidecar, "a directory").await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("not a regular file (a directory)")),
        "{lines:?}"
    );
    assert_eq!(
        status(sidecar.listen, "api", "/").await,
        Some(200),
        "the running configuration still serves"
    );
    std::fs::remove_dir(&path).expect("rmdir");
}

#[tokio::test]
async fn an_unchanged_file_is_not_read_again_every_second() {
    let up = Upstream::always(Action::Reply(200)).await;
    // 4 MiB: a second's re-read would show plainly in the bytes read.
    let size = 4 << 20;
    let path = write_temp("unchanged", &padded(&up, size));
    // Written long enough ago that its metadata vouches for it (a file
    // written within the last 2 s is read once more, in case a second write
    // in the same clock tick left the metadata as it was).
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now() - Duration::from_secs(10)))
        .expect("age the file");
    let sidecar = start(&path, &[]).await;
    let before = bytes_read(sidecar.pid());
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let read = bytes_read(sidecar.pid()) - before;
    assert!(
        read < size as u64,
        "{read} bytes read in 3.5 s of an unchanged {size}-byte file"
    );
    // A change is still seen, and SIGHUP still reads it.
    std::fs::write(&path, padded(&up, size + 1)).expect("write");
    let ok = [("result", "ok")];
    let reloaded = sidecar
        .wait_for_metric(
            "reprise_config_reloads_total",
            &ok,
            Duration::from_secs(5),
            |v| v >= 1.0,
        )
        .await;
    assert_eq!(reloaded, Some(1.0));
    sidecar.signal("HUP").expect("SIGHUP");
    let forced = sidecar
        .wait_for_metric(
            "reprise_config_reloads_total",
            &ok,
            Duration::from_secs(5),
            |v| v >= 2.0,
        )
        .await;
    assert_eq!(forced, Some(2.0));
}

/// Waits (at most 10 s) until `reprise_tls_file_reloads_total{result}`
/// reaches `at_least`, and returns it.
async fn tls_reloads(sidecar: &Running, result: &str, at_least: f64) -> f64 {
    sidecar
        .wait_for_metric(
            "reprise_tls_file_reloads_total",
            &[("result", result)],
            Duration::from_secs(10),
            |v| v >= at_least,
        )
        .await
        .unwrap_or(0.0)
}

/// Replaces `path`'s content at once (a rename, as a Secret's swap is seen).
fn swap(path: &Path, content: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, content).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

#[tokio::test]
async fn changed_tls_files_are_applied_and_a_bad_new_pair_keeps_the_old_one() {
    use reprise_testkit::tls::{FrontSettings, TestCa, TlsFront};
    let first = TestCa::new("rotate-old");
    let second = TestCa::new("rotate-new");
    let up = Upstream::always(Action::Reply(200)).await;
    // The endpoint's certificate is from the second authority, and it asks
    // for a client certificate from it too.
    let front = TlsFront::start(
        up.addr,
        FrontSettings::new(second.issue("api", &["api.test"]))
            .require_client_cert(&second.cert_pem),
    )
    .await;
    let dir = write_temp("rotate-tls", "").with_extension("d");
    std::fs::create_dir_all(&dir).expect("folder");
    let (trust, cert, key) = (dir.join("ca.pem"), dir.join("tls.crt"), dir.join("tls.key"));
    let client = second.issue("client", &["client.test"]);
    swap(&trust, &first.cert_pem);
    swap(&cert, &client.cert_pem);
    swap(&key, &client.key_pem);
    let path = config_file(
        "rotate-tls",
        UpstreamConfig::new("api")
            .endpoint(front.addr)
            .tls(Some(&trust), Some("api.test"))
            .client_cert(&cert, &key),
    );
    let sidecar = start(&path, &[]).await;
    assert_eq!(
        status(sidecar.listen, "api", "/").await,
        Some(502),
        "the endpoint's issuer is not trusted yet"
    );
    // The trust bundle rotates to the right authority.
    swap(&trust, &second.cert_pem);
    assert!(tls_reloads(&sidecar, "ok", 1.0).await >= 1.0);
    assert_eq!(status(sidecar.listen, "api", "/").await, Some(200));
    // A key that does not match the certificate: refused, the old pair stays.
    let other = second.issue("other", &["client.test"]);
    swap(&key, &other.key_pem);
    assert_eq!(tls_reloads(&sidecar, "refused", 1.0).await, 1.0);
    assert_eq!(
        refusal_lines(&sidecar, "does not match").await.len(),
        1,
        "{:?}",
        sidecar.lines()
    );
    assert_eq!(status(sidecar.listen, "api", "/").await, Some(200));
    // The matching certificate arrives: the new pair serves.
    swap(&cert, &other.cert_pem);
    assert!(tls_reloads(&sidecar, "ok", 2.0).await >= 2.0);
    assert_eq!(status(sidecar.listen, "api", "/").await, Some(200));
    assert_eq!(
        front.handshakes(),
        2,
        "one with the rotated bundle, one with the new pair (the refused change kept the pool)"
    );
}

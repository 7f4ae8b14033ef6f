//! Reloads the configuration file when it changes and on SIGHUP. An invalid
//! file is refused with a log line; the running configuration stays.
//!
//! Each check runs on tokio's blocking pool, never on a thread that serves
//! requests: the file's metadata is compared with what was last read (the
//! file is read only when it changed, or on SIGHUP), and reading, parsing,
//! validating and building the new routes all happen there. The file is read
//! by `reprise_crds::file::read`'s rule, the one `--check` and the start use:
//! a regular file, opened without blocking, of at most 16 MiB, UTF-8.
//!
//! The TLS files the configuration names (`ca_file`, `client_cert_file`,
//! `client_key_file`) are watched the same way: when one changes (cert-manager
//! rotates a Secret by swapping its symlink), the configuration is read and
//! checked again as a whole, so a new pair is applied only once it is valid;
//! a bad new pair is refused like any invalid file, the old pair stays, and
//! the change is counted in `reprise_tls_file_reloads_total`.
//!
//! While the file cannot be read (deleted, unreadable, not a regular file,
//! too large, not UTF-8), every check and every SIGHUP counts a refused
//! reload, and each distinct error is logged once (and again on SIGHUP). A
//! file that reads but is refused (YAML or validation) is counted and
//! logged once per change, as it does not change by itself.

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reprise_crds::config::TrustAnchors;
use reprise_crds::file::FileText;
use reprise_crds::Config;

use crate::proxy::Proxy;

/// How often the file's metadata is compared with what was last read.
/// Polling (rather than inotify) also sees Kubernetes ConfigMap updates,
/// which swap a symlink.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A file modified this recently before it was read is read again at the
/// next check even if its metadata has not changed: a filesystem's
/// timestamps are coarse (a clock tick, up to 2 s on some), so a second
/// write of the same size within that tick would leave the metadata as it
/// was and go unseen.
const RECENT: Duration = Duration::from_secs(2);

/// Watches `path` forever, reloading `proxy` on change or SIGHUP; `loaded`
/// is what the start read.
pub(crate) async fn watch(path: PathBuf, proxy: Arc<Proxy>, loaded: FileText) {
    let mut watcher = Some(Watcher::new(path.clone(), &loaded, &proxy.config()));
    drop(loaded);
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reloading on file change only");
            None
        }
    };
    loop {
        let forced = tokio::select! {
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            () = tokio::time::sleep(POLL_INTERVAL) => false,
        };
        let mut w = watcher
            .take()
            .unwrap_or_else(|| Watcher::unread(path.clone()));
        let proxy = Arc::clone(&proxy);
        let checked = tokio::task::spawn_blocking(move || {
            w.check(forced, &proxy);
            w
        })
        .await;
        match checked {
            Ok(w) => watcher = Some(w),
            // A panic while checking: the next check reads the file afresh.
            Err(e) => tracing::error!(error = %e, "the configuration check failed"),
        }
    }
}

/// What identifies a file's version without reading it: which file the path
/// leads to (a ConfigMap's symlink swap leads to another) and its size and
/// times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The file as last read.
#[derive(Debug)]
struct Seen {
    stamp: Stamp,
    /// A hash of the text, to tell a touched file from a changed one.
    hash: u64,
    /// False when the stamp cannot vouch for the content (modified
    /// [`RECENT`]ly before the read): the next check reads it again.
    settled: bool,
}

/// A read that failed, and the file's stamp then when it had one.
#[derive(Debug)]
struct Failed {
    stamp: Option<Stamp>,
    error: String,
}

/// What one check did, for the tests.
#[derive(Debug, PartialEq, Eq)]
enum Checked {
    /// The metadata is what was read last: not read.
    Unchanged,
    /// Read, and the text is the one read last: nothing to do.
    Same,
    /// Read, and the new configuration is serving.
    Reloaded,
    /// Read, and the text was refused (YAML or validation).
    Invalid,
    /// Could not be read; `logged` when this check logged it.
    Unreadable { logged: bool },
}

/// The watcher's memory between checks.
#[derive(Debug)]
struct Watcher {
    path: PathBuf,
    seen: Option<Seen>,
    failed: Option<Failed>,
    /// The TLS files of the configuration in force, as they were when it
    /// was built (`None`: missing then).
    tls: BTreeMap<PathBuf, Option<Stamp>>,
    /// Reads so far (the tests count them).
    reads: u64,
}

impl Watcher {
    /// A watcher of `path`, whose text `loaded` is serving as `config`.
    fn new(path: PathBuf, loaded: &FileText, config: &Config) -> Self {
        let mut w = Self::unread(path);
        w.seen = Some(Seen::of(loaded, None));
        w.tls = tls_stamps(config);
        w
    }

    /// A watcher that has not read `path` yet.
    fn unread(path: PathBuf) -> Self {
        Self {
            path,
            seen: None,
            failed: None,
            tls: BTreeMap::new(),
            reads: 0,
        }
    }

    /// One check (blocking: run it off the runtime's threads): reads the
    /// file when its metadata changed, or always when `forced`, and reloads
    /// `proxy` when its text changed and is valid.
    fn check(&mut self, forced: bool, proxy: &Proxy) -> Checked {
        let rotated = !self.tls.is_empty() && tls_stamps_now(&self.tls) != self.tls;
        let checked = self.check_file(forced || rotated, proxy);
        if rotated {
            let applied = checked == Checked::Reloaded;
            let counter = if applied {
                &proxy.metrics.tls_reloads_ok
            } else {
                &proxy.metrics.tls_reloads_refused
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if applied {
                tracing::info!("TLS files changed; the new ones are serving");
            } else {
                tracing::error!("TLS files changed but were refused; the ones loaded before stay");
            }
        }
        if rotated || checked == Checked::Reloaded {
            // What is on disk now: a refused change is not tried again
            // until the files change once more.
            self.tls = tls_stamps(&proxy.config());
        }
        checked
    }

    /// One check of the configuration file itself.
    fn check_file(&mut self, forced: bool, proxy: &Proxy) -> Checked {
        let label = self.path.display().to_string();
        let stamp = match std::fs::metadata(&self.path) {
            Ok(m) => Some(Stamp::of(&m)),
            Err(source) => {
                let e = reprise_crds::Error::Read {
                    path: label,
                    source,
                };
                return self.unreadable(None, &e, forced, proxy);
            }
        };
        if !forced {
            if let Some(failed) = &self.failed {
                // The same file that could not be read: still refused.
                if failed.stamp == stamp {
                    proxy
                        .metrics
                        .reloads_refused
                        .fetch_add(1, Ordering::Relaxed);
                    return Checked::Unreadable { logged: false };
                }
            }
            if let Some(seen) = &self.seen {
                if self.failed.is_none() && seen.settled && Some(seen.stamp) == stamp {
                    return Checked::Unchanged;
                }
            }
        }
        self.reads += 1;
        let file = match reprise_crds::file::read(&self.path) {
            Ok(f) => f,
            Err(e) => return self.unreadable(stamp, &e, forced, proxy),
        };
        self.failed = None;
        let seen = Seen::of(&file, self.seen.as_ref());
        let same = self.seen.as_ref().is_some_and(|s| s.hash == seen.hash);
        self.seen = Some(seen);
        if same && !forced {
            return Checked::Same;
        }
        match reprise_crds::file::parse(&file.text, &label) {
            Ok(config) => {
                proxy.reload(config);
                tracing::info!(path = %label, forced, "configuration reloaded");
                Checked::Reloaded
            }
            Err(e) => {
                proxy
                    .metrics
                    .reloads_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "reload refused; keeping the running configuration");
                Checked::Invalid
            }
        }
    }

    /// Counts a read that failed and logs it unless the last one failed the
    /// same way (a SIGHUP logs it again).
    fn unreadable(
        &mut self,
        stamp: Option<Stamp>,
        e: &reprise_crds::Error,
        forced: bool,
        proxy: &Proxy,
    ) -> Checked {
        proxy
            .metrics
            .reloads_refused
            .fetch_add(1, Ordering::Relaxed);
        let error = e.to_string();
        let logged = forced || self.failed.as_ref().is_none_or(|f| f.error != error);
        if logged {
            tracing::error!(error = %error, "reload refused: cannot read the file; keeping the running configuration");
        }
        self.failed = Some(Failed { stamp, error });
        Checked::Unreadable { logged }
    }
}

/// The TLS files `config` names, with no stamp yet.
fn tls_stamps(config: &Config) -> BTreeMap<PathBuf, Option<Stamp>> {
    let mut files = BTreeMap::new();
    for tls in config.upstreams.iter().filter_map(|u| u.tls.as_ref()) {
        if let TrustAnchors::Bundle(bundle) = &tls.trust {
            files.insert(bundle.file.clone(), None);
        }
        if let Some(identity) = &tls.client_identity {
            files.insert(identity.cert_file.clone(), None);
            files.insert(identity.key_file.clone(), None);
        }
    }
    tls_stamps_now(&files)
}

/// `files` as they are now (through symlinks: a Secret's swap shows).
fn tls_stamps_now(files: &BTreeMap<PathBuf, Option<Stamp>>) -> BTreeMap<PathBuf, Option<Stamp>> {
    files
        .keys()
        .map(|p| (p.clone(), std::fs::metadata(p).ok().map(|m| Stamp::of(&m))))
        .collect()
}

impl Seen {
    /// What `file` was, read just now; `before` is what the last read saw.
    fn of(file: &FileText, before: Option<&Seen>) -> Self {
        let stamp = Stamp::of(&file.metadata);
        let mut h = std::hash::DefaultHasher::new();
        file.text.hash(&mut h);
        let hash = h.finish();
        // Unknown, or in the future, counts as recent.
        let age = file
            .metadata
            .modified()
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok());
        let recent = age.is_none_or(|age| age < RECENT);
        // Read twice with the same stamp and text: the stamp vouches for it
        // now, even with a modification time in the future.
        let again = before.is_some_and(|b| b.stamp == stamp && b.hash == hash);
        Self {
            stamp,
            hash,
            settled: !recent || again,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const CONFIG: &str =
        "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n";

    /// A fresh folder for `name`'s files.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("reprise-reload-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir
    }

    /// Sets the file's modification time `ago` in the past, as an older
    /// file's would be.
    fn age(path: &Path, ago: Duration) {
        let f = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        f.set_modified(SystemTime::now() - ago).expect("set mtime");
    }

    /// A proxy serving `CONFIG` and a watcher of `path` that loaded it.
    fn started(path: &Path) -> (Arc<Proxy>, Watcher) {
        std::fs::write(path, CONFIG).expect("write");
        age(path, Duration::from_secs(10));
        let loaded = reprise_crds::file::read(path).expect("read");
        let config = reprise_crds::file::parse(&loaded.text, "t").expect("valid");
        let watcher = Watcher::new(path.to_path_buf(), &loaded, &config);
        (Proxy::new(config), watcher)
    }

    fn refused(proxy: &Proxy) -> u64 {
        proxy.metrics.reloads_refused.load(Ordering::Relaxed)
    }

    #[test]
    fn an_unchanged_file_is_not_read_and_a_changed_one_is() {
        let path = scratch("unchanged").join("reprise.yaml");
        let (proxy, mut w) = started(&path);
        for _ in 0..5 {
            assert_eq!(w.check(false, &proxy), Checked::Unchanged);
        }
        assert_eq!(w.reads, 0);
        // SIGHUP reads it (and reloads it) all the same.
        assert_eq!(w.check(true, &proxy), Checked::Reloaded);
        assert_eq!(w.reads, 1);
        // Touched: read, found the same, not reloaded.
        age(&path, Duration::from_secs(5));
        assert_eq!(w.check(false, &proxy), Checked::Same);
        assert_eq!(w.check(false, &proxy), Checked::Unchanged);
        // Changed (another endpoint, same size class): reloaded.
        std::fs::write(&path, CONFIG.replace("port: 1 ", "port: 2 ")).expect("write");
        assert_eq!(w.check(false, &proxy), Checked::Reloaded);
        assert_eq!(proxy.config().upstreams[0].endpoints[0].addr.port(), 2);
    }

    #[test]
    fn a_file_modified_just_before_it_was_read_is_read_once_more() {
        let path = scratch("recent").join("reprise.yaml");
        let (proxy, mut w) = started(&path);
        // Written just now: its metadata may not tell a second write within
        // the same clock tick, so the next check reads it again.
        std::fs::write(&path, CONFIG.replace("port: 1 ", "port: 3 ")).expect("write");
        assert_eq!(w.check(false, &proxy), Checked::Reloaded);
        assert_eq!(w.check(false, &proxy), Checked::Same);
        assert_eq!(w.check(false, &proxy), Checked::Unchanged);
        assert_eq!(w.reads, 2);
    }

    #[test]
    fn a_missing_file_is_counted_on_every_check_and_logged_once_per_error() {
        let dir = scratch("missing");
        let path = dir.join("reprise.yaml");
        let (proxy, mut w) = started(&path);
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(w.check(false, &proxy), Checked::Unreadable { logged: true });
        assert_eq!(
            w.check(false, &proxy),
            Checked::Unreadable { logged: false }
        );
        assert_eq!(
            w.check(false, &proxy),
            Checked::Unreadable { logged: false }
        );
        assert_eq!(refused(&proxy), 3);
        // SIGHUP counts and says it again.
        assert_eq!(w.check(true, &proxy), Checked::Unreadable { logged: true });
        assert_eq!(refused(&proxy), 4);
        // Another error: logged.
        std::fs::create_dir(&path).expect("mkdir");
        assert_eq!(w.check(false, &proxy), Checked::Unreadable { logged: true });
        assert_eq!(
            w.check(false, &proxy),
            Checked::Unreadable { logged: false }
        );
        assert_eq!(refused(&proxy), 6);
        assert_eq!(
            w.reads, 1,
            "the directory was opened once, then known by its metadata"
        );
        // Back as it was: read afresh, and found to be the text serving.
        std::fs::remove_dir(&path).expect("rmdir");
        std::fs::write(&path, CONFIG).expect("write");
        assert_eq!(w.check(false, &proxy), Checked::Same);
        assert_eq!(refused(&proxy), 6);
    }

    #[test]
    fn an_invalid_file_is_refused_once_per_change() {
        let path = scratch("invalid").join("reprise.yaml");
        let (proxy, mut w) = started(&path);
        std::fs::write(&path, "upstreams: []\n").expect("write");
        age(&path, Duration::from_secs(5));
        assert_eq!(w.check(false, &proxy), Checked::Invalid);
        assert_eq!(w.check(false, &proxy), Checked::Unchanged);
        assert_eq!(refused(&proxy), 1);
        assert_eq!(w.check(true, &proxy), Checked::Invalid);
        assert_eq!(refused(&proxy), 2);
    }
}

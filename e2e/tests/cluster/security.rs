//! The push stream lets in only the pod a token was issued for: checked
//! through the real API server's TokenReview.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reprise_e2e::cluster::{free, Cluster};

/// Status of `GET /v1/snapshots` with this token for `pod`.
fn subscribe(c: &Cluster, push: SocketAddr, token: Option<&str>, pod: &str) -> u16 {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "3",
    ])
    .args([
        "--cacert",
        c.work.join("tls/ca.crt").to_str().expect("path"),
    ])
    .args(["--resolve", &format!("localhost:{}:127.0.0.1", push.port())])
    .args(["-H", &format!("x-reprise-namespace: {}", c.ns)])
    .args(["-H", &format!("x-reprise-pod: {pod}")]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("authorization: Bearer {t}")]);
    }
    // A granted stream stays open: curl stops at --max-time, having printed the status.
    let out = cmd
        .arg(format!("https://localhost:{}/v1/snapshots", push.port()))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

/// A service-account token for `pod`, signed with the cluster's own signing
/// key, expiring at `exp` (Unix seconds): the API server cannot tell it from
/// one it issued, so only its expiry decides.
fn forged_token(key: &Path, c: &Cluster, pod: &str, exp: i64) -> String {
    let get = |kind: &str, name: &str| {
        c.kubectl(&[
            "-n",
            &c.ns,
            "get",
            kind,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .expect("uid")
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let claims = serde_json::json!({
        "iss": "https://kubernetes.default.svc",
        "aud": ["reprise"],
        "sub": format!("system:serviceaccount:{}:default", c.ns),
        "iat": now - 7200, "nbf": now - 7200, "exp": exp,
        "kubernetes.io": {
            "namespace": c.ns,
            "serviceaccount": {"name": "default", "uid": get("serviceaccount", "default")},
            "pod": {"name": pod, "uid": get("pod", pod)},
        }
    });
    let signing_input = format!(
        "{}.{}",
        b64url(br#"{"alg":"RS256","typ":"JWT"}"#),
        b64url(claims.to_string().as_bytes())
    );
    let input_path = c.work.join("jwt-input");
    std::fs::write(&input_path, &signing_input).expect("write");
    let sig = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .arg(&input_path)
        .output()
        .expect("openssl");
    assert!(
        sig.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&sig.stderr)
    );
    format!("{signing_input}.{}", b64url(&sig.stdout))
}

fn token_for(c: &Cluster, pod: &str, audience: &str) -> String {
    let uid = c
        .kubectl(&[
            "-n",
            &c.ns,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .expect("uid");
    c.kubectl(&[
        "-n",
        &c.ns,
        "create",
        "token",
        "default",
        "--audience",
        audience,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        pod,
        "--bound-object-uid",
        &uid,
    ])
    .expect("token")
    .trim()
    .to_string()
}

#[test]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
fn the_push_stream_refuses_every_token_but_the_pods_own() {
    let c = Cluster::new("security");
    let octet = c.octet;
    c.pod("alpha", "app: client", Some(&format!("10.244.{octet}.1")));
    c.pod("beta", "app: client", Some(&format!("10.244.{octet}.2")));
    let push = free();
    let _controller = c.controller(push, free());
    c.until("the controller's CA", Duration::from_secs(30), || {
        c.work.join("tls/ca.crt").exists()
    });
    let own = token_for(&c, "alpha", "reprise");
    c.until("the push server", Duration::from_secs(30), || {
        subscribe(&c, push, Some(&own), "alpha") == 200
    });

    assert_eq!(subscribe(&c, push, None, "alpha"), 401, "no token");
    assert_eq!(
        subscribe(&c, push, Some("not-a-jwt"), "alpha"),
        403,
        "garbage token"
    );
    let wrong_audience = token_for(&c, "alpha", "https://kubernetes.default.svc");
    assert_eq!(
        subscribe(&c, push, Some(&wrong_audience), "alpha"),
        403,
        "wrong audience"
    );
    let betas = token_for(&c, "beta", "reprise");
    assert_eq!(
        subscribe(&c, push, Some(&betas), "alpha"),
        403,
        "another pod's token"
    );
    assert_eq!(
        subscribe(&c, push, Some(&betas), "beta"),
        200,
        "that token for its own pod"
    );

    let key = PathBuf::from(&c.kubeconfig)
        .parent()
        .expect("cluster dir")
        .join("pki/sa.key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let live = forged_token(&key, &c, "alpha", now + 3600);
    assert_eq!(
        subscribe(&c, push, Some(&live), "alpha"),
        200,
        "control: the same token, unexpired, is accepted"
    );
    let expired = forged_token(&key, &c, "alpha", now - 3600);
    assert_eq!(
        subscribe(&c, push, Some(&expired), "alpha"),
        403,
        "expired token"
    );

    // A token outlives nothing: once its pod is deleted it is refused. (The
    // controller caches reviews for a minute, so use a token not seen yet.)
    let fresh = token_for(&c, "beta", "reprise");
    c.kubectl(&[
        "-n",
        &c.ns,
        "delete",
        "pod",
        "beta",
        "--grace-period=0",
        "--force",
    ])
    .expect("delete");
    c.until(
        "the deleted pod's token to be refused",
        Duration::from_secs(20),
        || subscribe(&c, push, Some(&fresh), "beta") == 403,
    );

    // Refusals are logged, but never the tokens themselves.
    let mut logs = String::new();
    for entry in std::fs::read_dir(&c.work).expect("work dir").flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("controller-")
        {
            logs.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    assert!(logs.contains("sidecar refused"), "the refusals are logged");
    for (what, token) in [
        ("alpha's", &own),
        ("beta's", &betas),
        ("the expired", &expired),
    ] {
        // A JWT's signature part is unique to it.
        let signature = token.rsplit('.').next().expect("jwt");
        assert!(
            !logs.contains(signature),
            "{what} token appears in the controller's log"
        );
    }
}

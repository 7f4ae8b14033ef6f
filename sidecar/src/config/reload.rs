//! Reloads the configuration file when it changes and on SIGHUP. An invalid
//! file is refused with a log line; the running configuration stays.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::proxy::Proxy;

/// How often the file is compared with what was last loaded. Polling (rather
/// than inotify) also sees Kubernetes ConfigMap updates, which swap a symlink.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Watches `path` forever, reloading `proxy` on change or SIGHUP.
pub(crate) async fn watch(path: PathBuf, proxy: Arc<Proxy>, loaded: Vec<u8>) {
    let mut last = loaded;
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
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                if forced {
                    tracing::error!(path = %path.display(), error = %e, "reload refused: cannot read the file; keeping the running configuration");
                }
                continue;
            }
        };
        if bytes == last && !forced {
            continue;
        }
        last.clone_from(&bytes);
        let label = path.display().to_string();
        let text = String::from_utf8_lossy(&bytes);
        match reprise_crds::file::parse(&text, &label) {
            Ok(config) => {
                proxy.reload(config);
                tracing::info!(path = %label, forced, "configuration reloaded");
            }
            Err(e) => {
                proxy
                    .metrics
                    .reloads_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "reload refused; keeping the running configuration");
            }
        }
    }
}

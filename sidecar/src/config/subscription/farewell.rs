//! The final traffic report: when the sidecar stops (SIGTERM, after the
//! drain), what its rules counted since the last report goes to the
//! controller at once, marked final, instead of waiting for the next report
//! interval the pod will not live to see. A pod that made its calls and
//! exited within one interval (a Job, a test pod, the last seconds of a
//! pod in a rollout) is counted so.
//!
//! The process asks ([`Farewell::say`]) and waits, at most
//! [`FAREWELL_TIMEOUT`], until the line is written; a stream that is down
//! then is dialled once. A SIGKILL (or an OOM kill) still loses what was
//! counted since the last report.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// Longest the sidecar waits for its final report to be written before it
/// exits: well within a pod's termination grace (30 s by default), which
/// the drain shares.
pub const FAREWELL_TIMEOUT: Duration = Duration::from_secs(3);

/// The process asking the subscription for its final report, and the
/// subscription saying it was written.
#[derive(Clone, Debug)]
pub struct Farewell(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    asked: watch::Sender<bool>,
    said: watch::Sender<bool>,
}

impl Default for Farewell {
    fn default() -> Self {
        Farewell(Arc::new(Inner {
            asked: watch::Sender::new(false),
            said: watch::Sender::new(false),
        }))
    }
}

impl Farewell {
    /// Asks for the final report and waits until it is written, or
    /// `within`; true when it was (or there was nothing to report).
    pub async fn say(&self, within: Duration) -> bool {
        self.0.asked.send_replace(true);
        let mut said = self.0.said.subscribe();
        tokio::time::timeout(within, said.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Resolves once the final report is asked for.
    pub(crate) async fn asked(&self) {
        let mut asked = self.0.asked.subscribe();
        let _ = asked.wait_for(|a| *a).await;
    }

    /// The final report is written (or there was none to write).
    pub(crate) fn said(&self) {
        self.0.said.send_replace(true);
    }

    /// Whether the final report is written.
    pub(crate) fn is_said(&self) -> bool {
        *self.0.said.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn saying_waits_for_the_line_and_no_longer_than_asked() {
        let farewell = Farewell::default();
        let writer = {
            let f = farewell.clone();
            tokio::spawn(async move {
                f.asked().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                f.said();
            })
        };
        assert!(farewell.say(FAREWELL_TIMEOUT).await, "written in time");
        assert!(farewell.is_said());
        writer.await.expect("writer");

        let silent = Farewell::default();
        let started = tokio::time::Instant::now();
        assert!(!silent.say(Duration::from_secs(2)).await, "never written");
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }
}

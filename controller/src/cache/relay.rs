//! Hands items from a long-lived producer (a watch, the push server's ACKs)
//! to a consumer that comes and goes (the reconciler, which runs only while
//! this replica leads).

use std::sync::Mutex;

use futures_util::Stream;
use tokio::sync::mpsc;

/// Sends each item to the latest subscriber and drops it while there is
/// none, so a replica that does not lead holds nothing back for later.
pub(crate) struct Relay<T>(Mutex<Option<mpsc::UnboundedSender<T>>>);

impl<T> Default for Relay<T> {
    fn default() -> Self {
        Relay(Mutex::new(None))
    }
}

impl<T> std::fmt::Debug for Relay<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("subscribed", &self.lock().is_some())
            .finish()
    }
}

impl<T: Send + 'static> Relay<T> {
    /// Hands `item` to the subscriber, if one listens.
    pub(crate) fn send(&self, item: T) {
        let mut tx = self.lock();
        if tx.as_ref().is_some_and(|tx| tx.send(item).is_err()) {
            // The subscriber is gone: stop queueing for it.
            *tx = None;
        }
    }

    /// The items sent from now on. Replaces an earlier subscription, whose
    /// stream then ends.
    pub(crate) fn subscribe(&self) -> impl Stream<Item = T> + Send + Unpin + 'static {
        let (tx, mut rx) = mpsc::unbounded_channel();
        *self.lock() = Some(tx);
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}

impl<T> Relay<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<T>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    #[tokio::test]
    async fn items_reach_the_latest_subscriber_only_and_are_dropped_meanwhile() {
        let relay = Relay::default();
        relay.send(1);
        let first = relay.subscribe();
        relay.send(2);
        let mut second = relay.subscribe();
        relay.send(3);
        assert_eq!(
            first.collect::<Vec<_>>().await,
            vec![2],
            "a replaced subscription ends"
        );
        assert_eq!(
            second.next().await,
            Some(3),
            "1 was sent before anyone listened"
        );
        drop(second);
        relay.send(4);
        assert!(
            relay.lock().is_none(),
            "nothing queues for a gone subscriber"
        );
    }
}

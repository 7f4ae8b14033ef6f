//! Caps on the connections each listener holds open. Every accepted
//! connection takes a slot of its listener's, held until the connection's
//! task ends; one accepted while all are taken is closed at once with a
//! reset and counted (`reprise_connections_refused_total`), as Envoy's
//! listener connection limit closes its overflow. The cost is per connection
//! (an atomic update each way), never per request.

use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::TcpStream;

use crate::observe::metrics::Listener;
use crate::proxy::Proxy;

/// One open connection's place under its listener's cap.
#[derive(Debug)]
pub(crate) struct Slot {
    proxy: Arc<Proxy>,
    listener: Listener,
}

impl Slot {
    /// A slot of `listener`'s for `stream`, unless `cap` connections hold
    /// one already: then the refusal is counted and `stream` is reset (a
    /// reset leaves no TIME_WAIT behind on this side, however many come).
    pub(crate) fn take(
        proxy: &Arc<Proxy>,
        listener: Listener,
        cap: u64,
        stream: &TcpStream,
    ) -> Option<Slot> {
        if proxy.metrics.connections(listener).open(cap) {
            return Some(Slot {
                proxy: Arc::clone(proxy),
                listener,
            });
        }
        let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
        None
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.proxy.metrics.connections(self.listener).close();
    }
}

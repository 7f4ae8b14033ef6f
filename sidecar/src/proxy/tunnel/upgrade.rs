//! A client's HTTP/1 connection changing hands: after a `101` to an upgrade
//! request, or a `2xx` to CONNECT, its bytes are the new protocol's.
//!
//! The sidecar's HTTP/1 server puts a [`PendingUpgrade`] in such a
//! request's extensions; once it has written the response head it hands the
//! connection over through [`Handover::hand_over`], with the bytes it had
//! already read behind the head. Whoever took the [`PendingUpgrade`] out
//! (with [`ClientUpgrade::take`]) gets it. Connections inside a CONNECT
//! tunnel are served by the same server, so their upgrades work alike.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::Request;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use crate::exchange::body::ClientBody;
use crate::exchange::prefixed::Prefixed;

/// A byte stream a tunnel can carry.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The client's connection after the switch.
pub(crate) type Upgraded = Box<dyn Stream>;

/// The connection, before its answer is written. A request extension, so it
/// must be `Clone`; only the first to take it gets the connection.
#[derive(Clone)]
pub(crate) struct PendingUpgrade(Arc<Mutex<Option<oneshot::Receiver<Upgraded>>>>);

/// The server's half: hands the connection over once the answer is out.
pub(crate) struct Handover(oneshot::Sender<Upgraded>);

impl std::fmt::Debug for PendingUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingUpgrade")
    }
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handover")
    }
}

impl std::fmt::Debug for ClientUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientUpgrade")
    }
}

/// A connection that may change hands, and the way to hand it over.
pub(crate) fn pending() -> (PendingUpgrade, Handover) {
    let (tx, rx) = oneshot::channel();
    (PendingUpgrade(Arc::new(Mutex::new(Some(rx)))), Handover(tx))
}

impl Handover {
    /// Hands `io` over, the `read` bytes (already read behind the head)
    /// first; dropped if nobody waits for it.
    pub(crate) fn hand_over<T: Stream>(self, io: T, read: Bytes) {
        let upgraded: Upgraded = if read.is_empty() {
            Box::new(io)
        } else {
            Box::new(Prefixed::new(read, io))
        };
        let _ = self.0.send(upgraded);
    }
}

/// The proxy's claim on a client connection that may change hands: none
/// when the request did not come from the sidecar's HTTP/1 server, or the
/// connection was claimed before.
pub(crate) struct ClientUpgrade(Option<oneshot::Receiver<Upgraded>>);

impl ClientUpgrade {
    /// Takes the claim out of `req`.
    pub(crate) fn take(req: &mut Request<ClientBody>) -> Self {
        ClientUpgrade(req.extensions_mut().remove::<PendingUpgrade>().and_then(
            |PendingUpgrade(rx)| rx.lock().unwrap_or_else(PoisonError::into_inner).take(),
        ))
    }

    /// The connection once switched; `None` when it never will be (the
    /// answer was no switch, or the connection ended first).
    pub(crate) async fn switched(self) -> Option<Upgraded> {
        self.0?.await.ok()
    }
}

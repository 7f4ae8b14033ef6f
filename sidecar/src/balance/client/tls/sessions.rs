//! Session resumption per endpoint, not per server name.
//!
//! rustls keys its session cache by the server name, but every endpoint of
//! an upstream shares one name while each pod has its own ticket keys: a
//! ticket one pod issued, offered to another, is refused and spent, and the
//! handshake is a full one. nginx keeps its upstream sessions per peer for
//! the same reason. So each endpoint gets its own store.
//!
//! A TLS 1.3 ticket is used once (RFC 8446 §C.4: reuse would let an
//! observer link connections; rustls takes it from the store), and a
//! connection holds the one it took until the server's next ticket arrives
//! after the handshake. With a connection per request, as many tickets are
//! out as connections are open to the endpoint at once, so the store keeps
//! [`TLS13_TICKETS`] per endpoint, not rustls' eight per server: with eight,
//! a burst of new connections ran out and made full handshakes.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::ServerName;
use rustls::NamedGroup;

/// TLS 1.3 tickets kept per endpoint, the oldest dropped first.
pub(super) const TLS13_TICKETS: usize = 64;

/// Endpoints remembered per upstream. Past it the stores are dropped and
/// begin again (endpoints come and go with pods and DNS answers; the next
/// handshake to each is a full one).
pub(super) const ENDPOINTS: usize = 4096;

/// One upstream's stores, one per endpoint address.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_endpoint: Mutex<HashMap<SocketAddr, Arc<EndpointSessions>>>,
}

impl Sessions {
    /// The store for `endpoint`, made on its first handshake.
    pub(super) fn of(&self, endpoint: SocketAddr) -> Arc<EndpointSessions> {
        let mut map = super::lock(&self.by_endpoint);
        if let Some(store) = map.get(&endpoint) {
            return Arc::clone(store);
        }
        if map.len() >= ENDPOINTS {
            map.clear();
        }
        Arc::clone(map.entry(endpoint).or_default())
    }
}

/// What one endpoint gave to resume with. Every connection to it is made
/// with one server name (the upstream's), so the name rustls passes is
/// checked rather than used as a key: a store never answers for a name it
/// was not given.
#[derive(Debug, Default)]
pub(super) struct EndpointSessions {
    state: Mutex<Option<(ServerName<'static>, State)>>,
}

#[derive(Debug, Default)]
struct State {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl EndpointSessions {
    /// Runs `f` on the state kept for `name`, begun anew for a new name.
    fn with<R>(&self, name: &ServerName<'_>, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = super::lock(&self.state);
        match &mut *state {
            Some((kept, s)) if kept.to_str() == name.to_str() => f(s),
            _ => {
                let (_, s) = state.insert((name.to_owned(), State::default()));
                f(s)
            }
        }
    }

    /// Reads the state kept for `name`, if any.
    fn read<R>(&self, name: &ServerName<'_>, f: impl FnOnce(&mut State) -> Option<R>) -> Option<R> {
        match &mut *super::lock(&self.state) {
            Some((kept, s)) if kept.to_str() == name.to_str() => f(s),
            _ => None,
        }
    }

    #[cfg(test)]
    fn tickets(&self) -> usize {
        super::lock(&self.state)
            .as_ref()
            .map_or(0, |(_, s)| s.tls13.len())
    }
}

impl ClientSessionStore for EndpointSessions {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.with(&name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.read(name, |s| s.kx_hint)
    }

    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.with(&name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.read(name, |s| s.tls12.clone())
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.read(name, |s| s.tls12.take());
    }

    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.with(&name, |s| {
            if s.tls13.len() == TLS13_TICKETS {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        // The newest first: it has the most of its lifetime left.
        self.read(name, |s| s.tls13.pop_back())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_has_its_own_store_and_the_same_one_each_time() {
        let sessions = Sessions::default();
        let a: SocketAddr = "10.0.0.1:443".parse().expect("an address");
        let b: SocketAddr = "10.0.0.2:443".parse().expect("an address");
        assert!(Arc::ptr_eq(&sessions.of(a), &sessions.of(a)));
        assert!(!Arc::ptr_eq(&sessions.of(a), &sessions.of(b)));
    }

    #[test]
    fn a_store_answers_only_for_the_name_it_was_given() {
        let store = EndpointSessions::default();
        let name = ServerName::try_from("api.example").expect("a name");
        let other = ServerName::try_from("other.example").expect("a name");
        store.set_kx_hint(name.clone(), NamedGroup::X25519);
        assert_eq!(store.kx_hint(&name), Some(NamedGroup::X25519));
        assert_eq!(store.kx_hint(&other), None);
        assert_eq!(store.tickets(), 0);
    }
}

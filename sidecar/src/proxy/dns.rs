//! Endpoints named by DNS: every address a name resolves to is an endpoint
//! of its upstream, which the picker and the alternate-endpoint rule treat
//! like any other.
//!
//! One task per proxy resolves the names the configuration holds, through
//! the system's resolver configuration (`/etc/resolv.conf`: its servers,
//! search domains and `ndots`; `/etc/hosts` too) or the file's
//! `proxy.dns_resolvers`, A and AAAA records both. Each name is resolved
//! again when its answer's TTL runs out, within [`MIN_REFRESH`] and
//! [`MAX_REFRESH`]. When a name's addresses change the routes are built
//! again, as a reload builds them, so the endpoints that stay keep their
//! health, in-flight counts and pools. A refresh that fails keeps the last
//! addresses (logged when it starts failing, counted every time); a name
//! that never resolved has no endpoint, and its upstream's requests are
//! answered at once (`dns_unresolved`), never held.
//!
//! What a name resolves to is filtered: a Service's ExternalName or a DNS
//! record is anyone's to point anywhere, and the pod's own loopback (the
//! sidecar's admin port, whose `PUT /log-level` changes it) or the node's
//! metadata service must not become an upstream. Loopback addresses
//! (`::ffff:127.0.0.1` too), link-local ones (`169.254.0.0/16`, the metadata
//! service's `169.254.169.254`, `fe80::/10`) and unspecified ones are left
//! out unless the file's `proxy.dns_allow_local` lets them in (standalone
//! use); an address and port the sidecar itself listens on is left out
//! always.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use reprise_crds::Config;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Proxy;

/// The soonest a name is resolved again, whatever its TTL says (Envoy's
/// default refresh rate for DNS clusters).
pub(crate) const MIN_REFRESH: Duration = Duration::from_secs(5);

/// The latest a name is resolved again, whatever its TTL says: a record
/// with a day's TTL still follows a move within minutes.
pub(crate) const MAX_REFRESH: Duration = Duration::from_secs(300);

/// How long one lookup may take before it counts as failed.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The addresses each name resolved to last, and the task that keeps them.
#[derive(Debug, Default)]
pub(crate) struct Dns {
    names: Mutex<BTreeMap<String, Name>>,
    /// The configuration changed: the names to resolve may have.
    changed: Notify,
    /// A task resolves names (started on the first configuration with one).
    started: AtomicBool,
    /// The addresses this process listens on: never an endpoint.
    own: Mutex<Vec<SocketAddr>>,
}

/// One name: its last addresses and how its lookups went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Name {
    /// The addresses of its last answer (kept while refreshes fail).
    pub(crate) addresses: Vec<IpAddr>,
    /// Lookups that answered.
    pub(crate) resolved: u64,
    /// Lookups that failed or timed out.
    pub(crate) failed: u64,
}

impl Dns {
    /// The addresses `host` resolved to last (none before its first answer).
    pub(crate) fn addresses(&self, host: &str) -> Vec<IpAddr> {
        lock(&self.names)
            .get(host)
            .map(|n| n.addresses.clone())
            .unwrap_or_default()
    }

    /// The addresses this process listens on (which no name may lead to).
    pub(crate) fn set_own_listeners(&self, addrs: Vec<SocketAddr>) {
        *lock(&self.own) = addrs;
    }

    /// Whether `addr`, from a name, is one of this process's listeners:
    /// the same address, or the same port on a local address for one
    /// bound to all addresses.
    pub(crate) fn is_own(&self, addr: SocketAddr) -> bool {
        lock(&self.own).iter().any(|own| {
            own.port() == addr.port()
                && (own.ip() == addr.ip() || (own.ip().is_unspecified() && is_local(addr.ip())))
        })
    }

    /// Every name the configuration holds that has been looked up, for the
    /// metrics.
    pub(crate) fn names(&self) -> Vec<(String, Name)> {
        lock(&self.names)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The configuration in force changed: resolve its names, starting the
    /// task if none runs yet and a runtime is at hand.
    pub(crate) fn configured(self: &Arc<Self>, proxy: Weak<Proxy>, config: &Config) {
        if config.upstreams.iter().all(|u| u.dns.is_empty()) {
            return;
        }
        if !self.started.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(refresh(proxy, Arc::clone(self)));
                }
                Err(_) => self.started.store(false, Ordering::Release),
            }
        }
        self.changed.notify_one();
    }
}

/// Resolves the names of the proxy's configuration, each when its last
/// answer runs out, until the proxy is gone.
async fn refresh(proxy: Weak<Proxy>, dns: Arc<Dns>) {
    let mut resolver: Option<(Vec<SocketAddr>, TokioResolver)> = None;
    let mut due: BTreeMap<String, Instant> = BTreeMap::new();
    let mut failing: BTreeSet<String> = BTreeSet::new();
    // Names already warned about for resolving to addresses left out.
    let mut warned: BTreeSet<String> = BTreeSet::new();
    loop {
        let Some(config) = proxy.upgrade().map(|p| p.config()) else {
            return;
        };
        let names: BTreeSet<String> = config
            .upstreams
            .iter()
            .flat_map(|u| u.dns.iter().map(|d| d.host.clone()))
            .collect();
        due.retain(|name, _| names.contains(name));
        lock(&dns.names).retain(|name, _| names.contains(name));
        let servers = &config.proxy.dns_resolvers;
        if resolver.as_ref().is_none_or(|(s, _)| s != servers) {
            resolver = build(servers).map(|r| (servers.clone(), r));
        }
        let now = Instant::now();
        let mut changed = false;
        for name in &names {
            if due.get(name).is_some_and(|at| *at > now) {
                continue;
            }
            let Some((_, r)) = &resolver else {
                due.insert(name.clone(), now + MIN_REFRESH);
                continue;
            };
            let looked = tokio::time::timeout(LOOKUP_TIMEOUT, r.lookup_ip(name.as_str())).await;
            match looked {
                Ok(Ok(answer)) => {
                    let mut addrs: Vec<IpAddr> = answer.iter().collect();
                    addrs.sort();
                    addrs.dedup();
                    if !config.proxy.dns_allow_local {
                        let (kept, refused): (Vec<IpAddr>, Vec<IpAddr>) =
                            addrs.into_iter().partition(|ip| !is_refused(*ip));
                        if !refused.is_empty() && !warned.contains(name) {
                            tracing::warn!(host = %name, refused = ?refused, kept = kept.len(), "a DNS name resolves to loopback or link-local addresses: they are not endpoints");
                            warned.insert(name.clone());
                        }
                        addrs = kept;
                    }
                    let ttl = answer
                        .valid_until()
                        .saturating_duration_since(std::time::Instant::now());
                    due.insert(name.clone(), now + ttl.clamp(MIN_REFRESH, MAX_REFRESH));
                    if failing.remove(name) {
                        tracing::info!(host = %name, "DNS name resolves again");
                    }
                    let mut names = lock(&dns.names);
                    let entry = names.entry(name.clone()).or_default();
                    entry.resolved += 1;
                    if entry.addresses != addrs {
                        entry.addresses = addrs;
                        changed = true;
                    }
                }
                failed => {
                    lock(&dns.names).entry(name.clone()).or_default().failed += 1;
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {LOOKUP_TIMEOUT:?}"),
                    };
                    if failing.insert(name.clone()) {
                        let kept = dns.addresses(name).len();
                        tracing::warn!(host = %name, %error, kept, "DNS refresh failed; keeping the last addresses");
                    }
                    due.insert(name.clone(), now + MIN_REFRESH);
                }
            }
        }
        if changed {
            let Some(proxy) = proxy.upgrade() else {
                return;
            };
            // On the blocking pool, as a reload builds its routes: a large
            // configuration takes milliseconds to build.
            let _ = tokio::task::spawn_blocking(move || proxy.rebuild_routes()).await;
        }
        let next = due.values().min().copied().unwrap_or(now + MAX_REFRESH);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = dns.changed.notified() => {}
        }
    }
}

/// A resolver of the system's configuration, or of `servers`.
fn build(servers: &[SocketAddr]) -> Option<TokioResolver> {
    let built = if servers.is_empty() {
        TokioResolver::builder_tokio()
    } else {
        let name_servers = servers
            .iter()
            .map(|s| {
                let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                for c in &mut ns.connections {
                    c.port = s.port();
                }
                ns
            })
            .collect();
        Ok(TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(name_servers),
            TokioRuntimeProvider::default(),
        ))
    };
    match built {
        Ok(mut builder) => {
            let options = builder.options_mut();
            options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
            options.timeout = Duration::from_secs(2);
            options.attempts = 2;
            match builder.build() {
                Ok(resolver) => Some(resolver),
                Err(e) => {
                    tracing::error!(error = %e, "cannot build the DNS resolver; host-named endpoints stay unresolved");
                    None
                }
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the system's resolver configuration; host-named endpoints stay unresolved");
            None
        }
    }
}

/// Whether a name's address is left out unless local ones are allowed:
/// loopback, link-local (the metadata service among them) or unspecified,
/// IPv4-mapped IPv6 forms included.
pub(crate) fn is_refused(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                // fe80::/10
                || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Whether `ip` is an address of this network namespace: binding a socket
/// to it succeeds only then. Asked only for a port the sidecar listens on.
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_link_local_and_unspecified_addresses_are_refused_in_every_form() {
        for refused in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "169.254.169.254",
            "169.254.1.1",
            "::ffff:169.254.169.254",
            "fe80::1",
            "febf::1",
            "0.0.0.0",
            "::",
        ] {
            assert!(is_refused(refused.parse().expect("ip")), "{refused}");
        }
        for kept in [
            "10.0.0.7",
            "192.168.1.1",
            "8.8.8.8",
            "fd00::1",
            "fec0::1",
            "2001:db8::1",
        ] {
            assert!(!is_refused(kept.parse().expect("ip")), "{kept}");
        }
    }

    #[test]
    fn the_sidecars_own_listeners_are_never_endpoints() {
        let dns = Dns::default();
        dns.set_own_listeners(vec![
            "127.0.0.1:15000".parse().expect("admin"),
            "0.0.0.0:15021".parse().expect("health"),
        ]);
        assert!(dns.is_own("127.0.0.1:15000".parse().expect("addr")));
        assert!(
            dns.is_own("127.0.0.1:15021".parse().expect("addr")),
            "a wildcard listener on loopback"
        );
        assert!(!dns.is_own("127.0.0.1:8080".parse().expect("addr")));
        assert!(!dns.is_own("10.255.255.1:15000".parse().expect("addr")));
    }
}

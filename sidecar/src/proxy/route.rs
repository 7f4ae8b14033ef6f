//! The route phase: the routing table (which upstream a host names, or a
//! transparently captured connection's original destination, and which retry
//! policy a request gets), swapped atomically as a whole on every reload, and
//! the host a request addresses.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HOST;
use http::{HeaderMap, Request};
use reprise_crds::cel_match::CelRequest;
use reprise_crds::snapshot::Fnv1a;
use reprise_crds::{Config, Endpoint, RetryPolicy, Upstream};

use super::dns::Dns;

use crate::exchange::report::PolicySource;
use crate::observe::traffic::RuleTraffic;
use crate::retry::upstream::UpstreamState;
use reprise_crds::traffic::{TrafficCounts, TrafficReport};

/// A configuration ready to serve.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The configuration it was built from.
    pub config: Arc<Config>,
    /// Upstreams by lower-case name and by each alias.
    pub upstreams: HashMap<String, Arc<UpstreamState>, ConfigKeys>,
    /// Upstreams by each virtual address (a Service's `ClusterIP:port`) and
    /// each endpoint address (a pod's `IP:port`, which is how a client of a
    /// headless Service dials it).
    pub by_address: HashMap<SocketAddr, Arc<UpstreamState>, ConfigKeys>,
    /// Each rule's traffic, in the order of `config.rules`; a rule's counts
    /// carry over a reload while its id stays.
    pub traffic: Vec<Arc<RuleTraffic>>,
    /// Rules a reload took out, by the id they report as, while they hold
    /// counts not yet reported: the next report still carries them (a
    /// route replaced between two reports loses nothing it counted).
    pub retired: Vec<(String, Arc<RuleTraffic>)>,
}

/// The routing maps' hasher: FNV-1a, not std's SipHash. Every key comes from
/// the configuration; a request only looks one up, so a client choosing its
/// host cannot lengthen a chain (the collisions SipHash guards against need
/// the attacker's keys inserted). SipHash cost more per lookup of a short
/// host, and every request makes one (measured, with the byte scans below:
/// `e2e/bench/results/2026-12-02-issue18-attempt-head.md`).
pub(crate) type ConfigKeys = BuildHasherDefault<Fnv1a>;

/// Where a request goes when its host is not the whole story.
#[derive(Clone, Debug)]
pub(crate) enum Destination {
    /// The explicit proxy: the upstream the request's host names.
    Host,
    /// Inside a CONNECT tunnel to the upstream of this name: the request's
    /// own host wins when it names another upstream.
    Tunnel(Arc<str>),
    /// A transparently captured connection to this original destination:
    /// the upstream answering to that address, whatever the `Host` header
    /// says (the header is forwarded unchanged).
    Original(SocketAddr),
}

/// The endpoints added to and removed from one upstream, resolved.
#[derive(Clone, Debug, Default)]
pub(crate) struct EndpointsChange {
    /// The upstream's name.
    pub upstream: String,
    /// Endpoints added, each with its position after the change, lowest first.
    pub added: Vec<(usize, Endpoint)>,
    /// Endpoints removed, each with its position before the change, highest first.
    pub removed: Vec<(usize, Endpoint)>,
}

/// What rules match on: the request as the route phase sees it.
#[derive(Debug)]
pub(crate) struct RequestFacts<'a> {
    /// The method.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query, without `?`, when the target has one.
    pub query: Option<&'a str>,
    /// The host the request addressed, without a port.
    pub host: &'a str,
    /// Its end-to-end headers.
    pub headers: &'a HeaderMap,
}

/// `u` with an endpoint for each address its host names resolved to last,
/// after its own (named by the host; one address listed twice counts once).
fn with_dns(u: &Upstream, dns: &Dns) -> Upstream {
    let mut out = u.clone();
    for d in &u.dns {
        for ip in dns.addresses(&d.host) {
            let addr = SocketAddr::new(ip, d.port);
            // A name that leads back to the sidecar itself is no endpoint.
            if dns.is_own(addr) {
                continue;
            }
            if !out.endpoints.iter().any(|e| e.addr == addr) {
                out.endpoints.push(Endpoint {
                    addr,
                    name: Some(d.host.as_str().into()),
                    zone: d.zone.as_deref().map(Into::into),
                });
            }
        }
    }
    out
}

/// Where [`Routes::route`] sends a request.
#[derive(Debug)]
pub(crate) enum Routed {
    /// To this upstream, with its retries.
    Upstream(Arc<UpstreamState>),
    /// Captured, to an address no upstream has now: forwarded there once.
    Captured(SocketAddr),
    /// Nowhere: the request names no host.
    NoHost,
    /// Nowhere: its host names no upstream.
    Unknown,
}

/// The policy chosen for one request and where it came from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChosenPolicy<'a> {
    /// `rule:<id>` or `upstream:<name>`.
    pub source: PolicySource<'a>,
    /// The policy.
    pub policy: &'a RetryPolicy,
    /// The rule's traffic counts, when a rule was chosen.
    pub traffic: Option<&'a Arc<RuleTraffic>>,
}

impl Routes {
    /// Builds routes for `config`, carrying live state over from `previous`.
    pub(crate) fn new(config: Arc<Config>, previous: Option<&Routes>, dns: &Dns) -> Self {
        let mut upstreams = HashMap::default();
        let mut by_address = HashMap::default();
        for u in &config.upstreams {
            let prev = previous
                .and_then(|p| p.upstreams.get(&u.name))
                .map(Arc::as_ref);
            let state = Arc::new(UpstreamState::new(with_dns(u, dns), prev));
            for alias in &u.aliases {
                upstreams
                    .entry(alias.to_ascii_lowercase())
                    .or_insert_with(|| Arc::clone(&state));
            }
            // Virtual addresses are unique across upstreams (validated); an
            // endpoint shared by two upstreams maps to the first, and never
            // shadows another upstream's virtual address.
            for addr in &u.addresses {
                by_address.insert(*addr, Arc::clone(&state));
            }
            upstreams.insert(u.name.clone(), state);
        }
        for u in &config.upstreams {
            if let Some(state) = upstreams.get(&u.name) {
                for e in &state.endpoints {
                    by_address
                        .entry(e.endpoint.addr)
                        .or_insert_with(|| Arc::clone(state));
                }
            }
        }
        let traffic = config
            .rules
            .iter()
            .map(|r| {
                previous
                    .and_then(|p| {
                        let i = p.config.rules.iter().position(|old| old.id == r.id)?;
                        p.traffic.get(i).cloned()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let retired = previous.map_or_else(Vec::new, |p| {
            let gone = p
                .config
                .rules
                .iter()
                .zip(&p.traffic)
                .filter(|(old, _)| !config.rules.iter().any(|r| r.id == old.id))
                .map(|(old, t)| (old.report_id().to_string(), Arc::clone(t)));
            gone.chain(p.retired.iter().cloned())
                .filter(|(_, t)| t.has_unreported())
                .collect()
        });
        Self {
            config,
            upstreams,
            by_address,
            traffic,
            retired,
        }
    }

    /// These routes with some upstreams' endpoints patched, as
    /// [`Routes::new`] would build them from the patched configuration, but
    /// at the cost of the change: the patched upstreams' states are derived
    /// from the running ones ([`UpstreamState::with_endpoints`]), every
    /// other upstream is shared, and only the addresses that changed are
    /// looked up again. `None` when a patch does not fit (an upstream or an
    /// endpoint these routes do not have, an upstream patched twice) or names an upstream with
    /// DNS-named endpoints, whose resolved addresses only a whole build merges.
    pub(crate) fn with_endpoints(&self, patches: &[EndpointsChange]) -> Option<Routes> {
        let mut config = Config::clone(&self.config);
        let mut upstreams = self.upstreams.clone();
        let mut by_address = self.by_address.clone();
        let mut changed: Vec<SocketAddr> = Vec::new();
        for (n, patch) in patches.iter().enumerate() {
            // One patch an upstream: a second would start from what the
            // first replaced.
            if patches[..n].iter().any(|p| p.upstream == patch.upstream) {
                return None;
            }
            let i = config
                .upstreams
                .iter()
                .position(|u| u.name == patch.upstream)?;
            if !config.upstreams[i].dns.is_empty() {
                return None;
            }
            let old = self.upstreams.get(&patch.upstream)?;
            let new = Arc::new(old.with_endpoints(&patch.added, &patch.removed)?);
            let list = &mut config.upstreams[i].endpoints;
            for (at, _) in &patch.removed {
                list.remove(*at);
            }
            for (at, e) in &patch.added {
                list.insert(*at, e.clone());
            }
            for state in upstreams.values_mut().chain(by_address.values_mut()) {
                if Arc::ptr_eq(state, old) {
                    *state = Arc::clone(&new);
                }
            }
            changed.extend(patch.added.iter().map(|(_, e)| e.addr));
            changed.extend(patch.removed.iter().map(|(_, e)| e.addr));
        }
        // Who answers a changed address now: as in `new`, a virtual address
        // first, else the first upstream in configuration order with an
        // endpoint there (its states', which hold resolved DNS names too).
        for addr in changed {
            let state = |u: &Upstream| upstreams.get(&u.name);
            let owner = config
                .upstreams
                .iter()
                .find(|u| u.addresses.contains(&addr))
                .and_then(state)
                .or_else(|| {
                    config
                        .upstreams
                        .iter()
                        .filter_map(state)
                        .find(|s| s.endpoints.iter().any(|e| e.endpoint.addr == addr))
                });
            match owner {
                Some(state) => by_address.insert(addr, Arc::clone(state)),
                None => by_address.remove(&addr),
            };
        }
        Some(Routes {
            config: Arc::new(config),
            upstreams,
            by_address,
            traffic: self.traffic.clone(),
            retired: self.retired.clone(),
        })
    }

    /// Each rule's traffic since the last report, for rules that saw any.
    /// Rules of one policy (a route rule's matches) report as one.
    pub(crate) fn traffic_report(&self) -> TrafficReport {
        let mut traffic: BTreeMap<String, TrafficCounts> = BTreeMap::new();
        let live = self
            .config
            .rules
            .iter()
            .zip(&self.traffic)
            .map(|(r, t)| (r.report_id(), t));
        let retired = self.retired.iter().map(|(id, t)| (id.as_str(), t));
        for (id, t) in live.chain(retired) {
            let counts = t.take_since_report();
            if counts.is_empty() {
                continue;
            }
            match traffic.get_mut(id) {
                Some(sum) => sum.add(&counts),
                None => {
                    traffic.insert(id.to_string(), counts);
                }
            }
        }
        TrafficReport {
            traffic,
            ..TrafficReport::default()
        }
    }

    /// Where a request routed as `dest` goes: the upstream its host names
    /// (inside a tunnel, the tunnel's unless the host names another), or on
    /// a captured connection the one its original destination belongs to.
    pub(crate) fn route<B>(&self, req: &Request<B>, dest: &Destination) -> Routed {
        let by_host = || request_host(req).and_then(|h| self.upstream(h)).cloned();
        let found = match dest {
            Destination::Host => by_host(),
            Destination::Tunnel(name) => by_host().or_else(|| self.upstream(name).cloned()),
            Destination::Original(addr) => match self.upstream_at(addr) {
                Some(u) => Some(Arc::clone(u)),
                // The address left the configuration after the connection
                // was captured: the request goes where the app sent it, once.
                None => return Routed::Captured(*addr),
            },
        };
        match found {
            Some(upstream) => Routed::Upstream(upstream),
            None if request_host(req).is_none() => Routed::NoHost,
            None => Routed::Unknown,
        }
    }

    /// The upstream a transparently captured connection to `addr` belongs to.
    pub(crate) fn upstream_at(&self, addr: &SocketAddr) -> Option<&Arc<UpstreamState>> {
        self.by_address.get(addr)
    }

    /// The upstream a host names (case-insensitive; any port already removed).
    pub(crate) fn upstream(&self, host: &str) -> Option<&Arc<UpstreamState>> {
        match self.upstreams.get(host) {
            Some(u) => Some(u),
            None if host.bytes().any(|b| b.is_ascii_uppercase()) => {
                self.upstreams.get(&host.to_ascii_lowercase())
            }
            None => None,
        }
    }

    /// The first enabled rule matching the request, else the upstream's own
    /// retries block when it has attempts, else none. A rule's CEL condition
    /// runs only once its other conditions hold; one that fails to evaluate
    /// is no match, and `cel_error` hears of it.
    pub(crate) fn policy_for<'a>(
        &'a self,
        upstream: &'a UpstreamState,
        request: &RequestFacts<'_>,
        cel_error: impl Fn(&str),
    ) -> Option<ChosenPolicy<'a>> {
        let header = |name: &str| request.headers.get(name).map(|v| v.as_bytes());
        let mut cel_headers: Option<Vec<(&str, &str)>> = None;
        let found = self.config.rules.iter().position(|r| {
            if !r.matches(
                &upstream.config.name,
                request.method,
                request.path,
                request.query,
                header,
            ) {
                return false;
            }
            let Some(cel) = &r.cel else {
                return true;
            };
            let headers = cel_headers.get_or_insert_with(|| {
                request
                    .headers
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
                    .collect()
            });
            let facts = CelRequest {
                method: request.method,
                path: request.path,
                host: request.host,
                headers,
            };
            match cel.evaluate(&facts) {
                Ok(matched) => matched,
                Err(e) => {
                    tracing::debug!(rule = %r.id, error = %e.0, "CEL condition failed; no match");
                    cel_error(&r.id);
                    false
                }
            }
        });
        if let Some(i) = found {
            let rule = &self.config.rules[i];
            return Some(ChosenPolicy {
                source: PolicySource::Rule(&rule.id),
                policy: &rule.policy,
                traffic: self.traffic.get(i),
            });
        }
        upstream.config.retries.enabled().then_some(ChosenPolicy {
            source: PolicySource::Upstream,
            policy: &upstream.config.retries,
            traffic: None,
        })
    }
}

/// `authority`'s host, as `Authority::host` gives it (userinfo and port
/// left out, IPv6 brackets kept), by one byte scan: `Authority::host` splits
/// strings, which cost more on every request (measured:
/// `e2e/bench/results/2026-12-02-issue18-attempt-head.md`).
pub(crate) fn authority_host(authority: &http::uri::Authority) -> &str {
    let s = authority.as_str();
    let b = s.as_bytes();
    let start = b.iter().rposition(|&c| c == b'@').map_or(0, |i| i + 1);
    let rest = &b[start..];
    let len = if rest.first() == Some(&b'[') {
        rest.iter()
            .position(|&c| c == b']')
            .map_or(rest.len(), |i| i + 1)
    } else {
        rest.iter().position(|&c| c == b':').unwrap_or(rest.len())
    };
    &s[start..start + len]
}

/// A `host` field of `headers` names another authority than `target`
/// (compared whole, port included, case aside): two hosts in one request.
pub(crate) fn names_another_host(target: &http::uri::Authority, headers: &HeaderMap) -> bool {
    headers.get_all(HOST).iter().any(|h| {
        !h.as_bytes()
            .eq_ignore_ascii_case(target.as_str().as_bytes())
    })
}

/// The host a request addresses: the absolute-form URI's host, else the Host
/// header's, without a port.
pub(crate) fn request_host<B>(req: &Request<B>) -> Option<&str> {
    // Every HTTP/2 request has one (`:authority`); `authority_host` is the
    // cheaper `Authority::host`.
    if let Some(a) = req.uri().authority() {
        return Some(
            authority_host(a)
                .trim_start_matches('[')
                .trim_end_matches(']'),
        );
    }
    let host = req.headers().get(HOST)?.to_str().ok()?;
    // A byte scan: `str::rfind` cost more, even on a short host (measured:
    // `e2e/bench/results/2026-12-02-issue18-attempt-head.md`).
    let host = match host.as_bytes().iter().rposition(|&b| b == b':') {
        Some(i)
            if !host[i + 1..].is_empty() && host[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            &host[..i]
        }
        _ => host,
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hasher};

    use http::uri::Authority;

    use super::*;

    #[test]
    fn a_rule_a_reload_takes_out_reports_what_it_counted_once_more() {
        use crate::exchange::outcome::Outcome;
        use crate::observe::traffic::Finished;
        let config = |rules: &str| {
            let yaml = format!(
                "upstreams:\n  - name: api\n    endpoints: [{{ address: 127.0.0.1, port: 1 }}]\nrules:\n{rules}"
            );
            Arc::new(reprise_crds::file::parse(&yaml, "test.yaml").expect("valid"))
        };
        let both = "  - { id: kept, upstreams: [api] }\n  - { id: gone, upstreams: [api] }\n";
        let dns = Dns::default();
        let before = Routes::new(config(both), None, &dns);
        let ok = Finished {
            outcome: Outcome::Ok,
            success: true,
            attempts: 1,
            first_error: None,
            elapsed: std::time::Duration::from_millis(1),
        };
        for t in &before.traffic {
            t.record(&ok);
        }
        // A reload between two reports drops `gone`: its request is still
        // reported, under its id, then never again.
        let after = Routes::new(
            config("  - { id: kept, upstreams: [api] }\n"),
            Some(&before),
            &dns,
        );
        let report = after.traffic_report();
        let requests: Vec<(&str, u64)> = report
            .traffic
            .iter()
            .map(|(id, c)| (id.as_str(), c.requests))
            .collect();
        assert_eq!(requests, [("gone", 1), ("kept", 1)]);
        assert!(after.traffic_report().traffic.is_empty());
        let again = Routes::new(
            config("  - { id: kept, upstreams: [api] }\n"),
            Some(&after),
            &dns,
        );
        assert!(
            again.retired.is_empty(),
            "reported: forgotten at the next reload"
        );
    }

    #[test]
    fn authority_host_is_https_without_its_splits() {
        for a in [
            "api",
            "api:8080",
            "API.Example:1",
            "user@api:80",
            "u:p@api",
            "[::1]",
            "[::1]:8080",
            "u@[fe80::1]:80",
            "10.0.0.1:80",
        ] {
            let authority = Authority::from_static(a);
            assert_eq!(authority_host(&authority), authority.host(), "{a}");
        }
    }

    #[test]
    fn request_host_drops_only_a_numeric_port() {
        let host = |h: &'static str| {
            let req = Request::builder()
                .uri("/")
                .header(HOST, h)
                .body(())
                .expect("request");
            request_host(&req).map(str::to_owned)
        };
        assert_eq!(host("api:8080").as_deref(), Some("api"));
        assert_eq!(host("api").as_deref(), Some("api"));
        assert_eq!(host("api:").as_deref(), Some("api:"));
        assert_eq!(host("[::1]:80").as_deref(), Some("[::1]"));
        assert_eq!(host(":80"), None);
        let absolute = Request::builder()
            .uri("http://[::1]:9/x")
            .body(())
            .expect("request");
        assert_eq!(request_host(&absolute), Some("::1"));
    }

    #[test]
    fn the_routing_hasher_is_fnv1a() {
        // The published FNV-1a 64 test vectors.
        let hash = |bytes: &[u8]| {
            let mut h = ConfigKeys::default().build_hasher();
            h.write(bytes);
            h.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
    }
}

//! Typed builders for the sidecar's configuration file.
//!
//! Contract: each builder wraps the file's own serde type from
//! `reprise_crds::file` ([`ConfigFile`], [`UpstreamSpec`], [`RetriesSpec`],
//! [`RuleSpec`], [`ProxySpec`]); a setter sets the field of the same name (so
//! a test reads like the YAML it stands for), and [`Config::to_yaml`] renders
//! the file with `serde_yaml`. What a builder renders is exactly what the
//! types serialize: no indentation to get wrong, and a field renamed in the
//! file format fails to compile here instead of being silently ignored.
//! [`Config::resolve`] loads the rendered text the way the sidecar does.

use std::net::SocketAddr;
use std::path::Path;

pub use reprise_crds::file::{
    ConfigFile, DeadlinesSpec, EndpointSpec, HedgeSpec, ProxySpec, RetriesSpec, RuleSpec,
    StatusEntry, TlsSpec, UpstreamSpec,
};
pub use reprise_crds::policy::{FailureBoundary, Protocol, RetryLayers};

/// Setters that put `Some(value)` into the wrapped spec's field of the same
/// name (`field: type`), or into that field of a nested block (`field in
/// block: type`).
macro_rules! setters {
    ($($field:ident $(in $block:ident)?: $ty:ty),* $(,)?) => {
        $(
            #[doc = concat!("Sets `", $(stringify!($block), ".",)? stringify!($field), "`.")]
            pub fn $field(mut self, value: $ty) -> Self {
                self.0 $(.$block)? .$field = Some(value);
                self
            }
        )*
    };
}

/// A status list entry: a code (`503`) or a preset name (`"gateway"`).
pub trait IntoStatus {
    /// The entry.
    fn into_status(self) -> StatusEntry;
}

impl IntoStatus for u16 {
    fn into_status(self) -> StatusEntry {
        StatusEntry::Code(i64::from(self))
    }
}

impl IntoStatus for &str {
    fn into_status(self) -> StatusEntry {
        StatusEntry::Preset(self.to_string())
    }
}

/// `deadlines: { propagate, accept_incoming }`.
fn deadlines(propagate: bool, accept_incoming: bool) -> DeadlinesSpec {
    DeadlinesSpec {
        propagate: Some(propagate),
        accept_incoming: Some(accept_incoming),
    }
}

fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    items.into_iter().map(str::to_string).collect()
}

/// A whole configuration file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config(ConfigFile);

impl Config {
    /// An empty file (no upstreams yet).
    pub fn new() -> Config {
        Config::default()
    }

    /// Adds an upstream.
    pub fn upstream(mut self, upstream: UpstreamConfig) -> Config {
        self.0.upstreams.push(upstream.0);
        self
    }

    /// Adds a retry rule.
    pub fn rule(mut self, rule: Rule) -> Config {
        self.0.rules.push(rule.0);
        self
    }

    /// Sets the `proxy` block.
    pub fn proxy(mut self, proxy: ProxyConfig) -> Config {
        self.0.proxy = proxy.0;
        self
    }

    /// The file's value.
    pub fn file(&self) -> &ConfigFile {
        &self.0
    }

    /// The file as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(&self.0).expect("a ConfigFile renders as YAML")
    }

    /// Parses and validates the rendered YAML as the sidecar does; panics
    /// with the YAML and every error when the sidecar would refuse it.
    pub fn resolve(&self) -> reprise_crds::config::Config {
        let yaml = self.to_yaml();
        reprise_crds::file::parse(&yaml, "test.yaml")
            .unwrap_or_else(|e| panic!("the sidecar refuses this config: {e}\n{yaml}"))
    }

    /// Writes the YAML to `path` (in place, as an editor does).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_yaml())
    }
}

impl From<UpstreamConfig> for Config {
    fn from(upstream: UpstreamConfig) -> Config {
        Config::new().upstream(upstream)
    }
}

/// One upstream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpstreamConfig(UpstreamSpec);

impl UpstreamConfig {
    /// An upstream addressed as `name`, with no endpoints yet.
    pub fn new(name: &str) -> UpstreamConfig {
        UpstreamConfig(UpstreamSpec {
            name: name.to_string(),
            ..UpstreamSpec::default()
        })
    }

    /// Adds an endpoint.
    pub fn endpoint(mut self, addr: SocketAddr) -> UpstreamConfig {
        self.0.endpoints.push(EndpointSpec {
            address: addr.ip().to_string(),
            port: addr.port(),
            ..EndpointSpec::default()
        });
        self
    }

    /// Adds endpoints named by DNS: every address `host` resolves to, on `port`.
    pub fn host_endpoint(mut self, host: &str, port: u16) -> UpstreamConfig {
        self.0.endpoints.push(EndpointSpec {
            host: Some(host.to_string()),
            port,
            ..EndpointSpec::default()
        });
        self
    }

    /// Adds an endpoint with a name (shown in logs and traces).
    pub fn named_endpoint(self, addr: SocketAddr, name: &str) -> UpstreamConfig {
        let mut me = self.endpoint(addr);
        if let Some(e) = me.0.endpoints.last_mut() {
            e.name = Some(name.to_string());
        }
        me
    }

    /// Adds endpoints.
    pub fn endpoints(self, addrs: impl IntoIterator<Item = SocketAddr>) -> UpstreamConfig {
        addrs.into_iter().fold(self, UpstreamConfig::endpoint)
    }

    /// Adds a virtual address: transparently captured connections to it go
    /// to this upstream.
    pub fn address(mut self, addr: SocketAddr) -> UpstreamConfig {
        self.0.addresses.push(addr.to_string());
        self
    }

    /// Speaks h2c to the endpoints.
    pub fn h2c(mut self) -> UpstreamConfig {
        self.0.protocol = Protocol::H2c;
        self
    }

    /// Offers HTTP/2 and HTTP/1.1 over TLS (`auto`), speaking what each
    /// endpoint selects; needs [`Self::tls`].
    pub fn auto(mut self) -> UpstreamConfig {
        self.0.protocol = Protocol::Auto;
        self
    }

    /// Speaks HTTP/2 over TLS (`h2`) to the endpoints; needs [`Self::tls`].
    pub fn h2(mut self) -> UpstreamConfig {
        self.0.protocol = Protocol::H2;
        self
    }

    /// Opens TLS to the endpoints, trusting the roots in `ca_file`
    /// (none: the public roots), verifying `server_name` (none: the
    /// upstream's name).
    pub fn tls(mut self, ca_file: Option<&Path>, server_name: Option<&str>) -> UpstreamConfig {
        self.0.tls = Some(TlsSpec {
            server_name: server_name.map(str::to_string),
            ca_file: ca_file.map(|p| p.display().to_string()),
            ..TlsSpec::default()
        });
        self
    }

    /// Accepts a certificate for any of `names` instead of the server name
    /// (after [`Self::tls`]).
    pub fn subject_alt_names(mut self, names: &[&str]) -> UpstreamConfig {
        let tls = self.0.tls.get_or_insert_with(TlsSpec::default);
        tls.subject_alt_names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// Presents the client certificate in `cert_file` with `key_file`
    /// (after [`Self::tls`]).
    pub fn client_cert(mut self, cert_file: &Path, key_file: &Path) -> UpstreamConfig {
        let tls = self.0.tls.get_or_insert_with(TlsSpec::default);
        tls.client_cert_file = Some(cert_file.display().to_string());
        tls.client_key_file = Some(key_file.display().to_string());
        self
    }

    /// Sends `host` as every attempt's `Host` instead of the client's.
    pub fn host_rewrite(mut self, host: &str) -> UpstreamConfig {
        self.0.host_rewrite = Some(host.to_string());
        self
    }

    setters! {
        connect_ms in timeouts: u64,
        read_ms in timeouts: u64,
        consecutive_failures in passive_health: u32,
        ejection_ms in passive_health: u64,
    }

    /// Sets the `retries` block.
    pub fn retries(mut self, retries: Retries) -> UpstreamConfig {
        self.0.retries = retries.0;
        self
    }

    /// The spec.
    pub fn spec(&self) -> &UpstreamSpec {
        &self.0
    }
}

/// An upstream's `retries` block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Retries(RetriesSpec);

impl Retries {
    /// No keys: retries off.
    pub fn new() -> Retries {
        Retries::default()
    }

    setters! {
        attempts: u32,
        retry_post: bool,
        backoff_base_ms: u64,
        backoff_cap_ms: u64,
        retry_transport: bool,
        budget_percent: f64,
        buffer_max_bytes: u64,
        total_deadline_ms: u64,
        failure_boundary: FailureBoundary,
        acknowledge_duplicate_risk: bool,
        reuse_endpoints: bool,
        budget_window_ms: u64,
        budget_min_retries_per_second: u32,
        retry_after_max_ms: u64,
        retry_layers: RetryLayers,
    }

    /// Sets `deadlines: { propagate, accept_incoming }`.
    pub fn deadlines(mut self, propagate: bool, accept_incoming: bool) -> Retries {
        self.0.deadlines = deadlines(propagate, accept_incoming);
        self
    }

    /// Sets `hedge: { delay_ms }`.
    pub fn hedge_delay_ms(mut self, delay_ms: u64) -> Retries {
        self.0.hedge = Some(HedgeSpec::Delay { delay_ms });
        self
    }

    /// Sets `methods`.
    pub fn methods<'a>(mut self, methods: impl IntoIterator<Item = &'a str>) -> Retries {
        self.0.methods = Some(strings(methods));
        self
    }

    /// Sets `grpc_statuses` (names such as `unavailable`).
    pub fn grpc_statuses<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Retries {
        self.0.grpc_statuses = Some(
            names
                .into_iter()
                .map(|n| reprise_crds::grpc::GrpcStatusEntry::Name(n.to_string()))
                .collect(),
        );
        self
    }

    /// Sets `retry_statuses`.
    pub fn retry_statuses<S: IntoStatus>(
        mut self,
        statuses: impl IntoIterator<Item = S>,
    ) -> Retries {
        self.0.retry_statuses = Some(statuses.into_iter().map(S::into_status).collect());
        self
    }
}

/// A retry rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rule(RuleSpec);

impl Rule {
    /// A rule with this id and every other field at its default.
    pub fn new(id: &str) -> Rule {
        Rule(RuleSpec {
            id: id.to_string(),
            ..RuleSpec::default()
        })
    }

    setters! {
        priority: i32,
        enabled: bool,
        failure_boundary: FailureBoundary,
        replay_limit_bytes: u64,
        acknowledge_duplicate_risk: bool,
        attempts: u32,
        retry_transport: bool,
        backoff_base_ms: u64,
        backoff_cap_ms: u64,
        total_deadline_ms: u64,
        attempt_timeout_ms: u64,
        reuse_endpoints: bool,
        retry_after_max_ms: u64,
        retry_layers: RetryLayers,
    }

    /// Sets `methods`.
    pub fn methods<'a>(mut self, methods: impl IntoIterator<Item = &'a str>) -> Rule {
        self.0.methods = Some(strings(methods));
        self
    }

    /// Sets `statuses`.
    pub fn statuses<S: IntoStatus>(mut self, statuses: impl IntoIterator<Item = S>) -> Rule {
        self.0.statuses = statuses.into_iter().map(S::into_status).collect();
        self
    }

    /// Sets `upstreams`.
    pub fn upstreams<'a>(mut self, names: impl IntoIterator<Item = &'a str>) -> Rule {
        self.0.upstreams = strings(names);
        self
    }

    /// Sets `deadlines: { propagate, accept_incoming }`.
    pub fn deadlines(mut self, propagate: bool, accept_incoming: bool) -> Rule {
        self.0.deadlines = deadlines(propagate, accept_incoming);
        self
    }

    /// Sets `hedge: { delay_ms }`.
    pub fn hedge_delay_ms(mut self, delay_ms: u64) -> Rule {
        self.0.hedge = Some(HedgeSpec::Delay { delay_ms });
        self
    }

    /// Sets `match.cel`.
    pub fn cel(mut self, expression: &str) -> Rule {
        self.0.request_match.cel = Some(expression.to_string());
        self
    }
}

/// The `proxy` block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxyConfig(ProxySpec);

impl ProxyConfig {
    /// No keys: every default.
    pub fn new() -> ProxyConfig {
        ProxyConfig::default()
    }

    setters! {
        replay_reservation_bytes: u64,
        drain_timeout_ms: u64,
        max_request_header_bytes: usize,
        access_log: bool,
        max_connections: u64,
        diagnostics_retained: usize,
    }

    /// Sets `deadlines: { propagate, accept_incoming }`.
    pub fn deadlines(mut self, propagate: bool, accept_incoming: bool) -> ProxyConfig {
        self.0.deadlines = deadlines(propagate, accept_incoming);
        self
    }

    /// Resolves host-named endpoints with the DNS server at `server`
    /// instead of the system's.
    pub fn dns_resolver(mut self, server: SocketAddr) -> ProxyConfig {
        self.0.dns_resolvers.push(server.to_string());
        self
    }

    /// Lets host-named endpoints resolve to loopback addresses (tests run
    /// their upstreams there).
    pub fn dns_allow_local(mut self, allow: bool) -> ProxyConfig {
        self.0.dns_allow_local = Some(allow);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Config {
        let a: SocketAddr = "127.0.0.1:8081".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:8082".parse().expect("addr");
        Config::new()
            .upstream(
                UpstreamConfig::new("api")
                    .named_endpoint(a, "a-503")
                    .endpoint(b)
                    .read_ms(400)
                    .consecutive_failures(5)
                    .retries(
                        Retries::new()
                            .attempts(2)
                            .budget_percent(20.0)
                            .hedge_delay_ms(100)
                            .retry_statuses([503, 429]),
                    ),
            )
            .upstream(UpstreamConfig::new("grpc").h2c().endpoint(b))
            .rule(
                Rule::new("puts")
                    .methods(["PUT"])
                    .statuses(["gateway"])
                    .failure_boundary(FailureBoundary::BeforeHeaders)
                    .acknowledge_duplicate_risk(true),
            )
            .proxy(ProxyConfig::new().drain_timeout_ms(5000))
    }

    #[test]
    fn the_yaml_reads_back_as_the_same_file_and_the_sidecar_accepts_it() {
        let config = sample();
        let yaml = config.to_yaml();
        let back: ConfigFile = serde_yaml::from_str(&yaml).expect("reads back");
        assert_eq!(&back, config.file(), "{yaml}");
        let resolved = config.resolve();
        assert_eq!(resolved.upstreams.len(), 2);
        assert_eq!(resolved.rules.len(), 1);
        let api = &resolved.upstreams[0];
        assert_eq!(api.endpoints[0].name.as_deref(), Some("a-503"));
        assert_eq!(api.retries.max_retries, 2);
        assert_eq!(resolved.upstreams[1].protocol, Protocol::H2c);
    }

    #[test]
    #[should_panic(expected = "upstreams[0].endpoints")]
    fn a_config_the_sidecar_refuses_panics_naming_the_field() {
        Config::from(UpstreamConfig::new("api")).resolve();
    }
}

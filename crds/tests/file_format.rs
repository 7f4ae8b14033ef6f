//! The standalone file format: the gateway example loads unchanged, defaults
//! resolve as documented, and every validation rule names its field and rule.

use std::time::Duration;

use reprise_crds::file::parse;
use reprise_crds::{Error, FailureBoundary};

/// The gateway format's example (examples/gateway.yaml), byte for byte.
const GATEWAY_EXAMPLE: &str = include_str!("../../examples/gateway.yaml");

fn invalid(yaml: &str) -> String {
    match parse(yaml, "test.yaml") {
        Err(Error::Invalid { source, .. }) => source.to_string(),
        Err(other) => panic!("expected a validation error, got {other}"),
        Ok(cfg) => panic!("expected a validation error, got {cfg:?}"),
    }
}

fn upstream_with(retries: &str) -> String {
    format!("upstreams:\n  - name: api\n    endpoints: [{{ address: 127.0.0.1, port: 8080 }}]\n    retries: {retries}\n")
}

fn rule_with(rule: &str) -> String {
    format!("upstreams:\n  - name: api\n    endpoints: [{{ address: 127.0.0.1, port: 8080 }}]\nrules:\n  - {rule}\n")
}

#[test]
fn gateway_example_loads_unchanged_with_documented_defaults() {
    let cfg = parse(GATEWAY_EXAMPLE, "gateway.yaml").expect("the gateway example is valid");
    let api = cfg.upstream("api").expect("upstream api");
    assert_eq!(api.endpoints.len(), 2);
    assert_eq!(api.endpoints[1].addr.to_string(), "10.0.0.2:8080");
    let r = &api.retries;
    assert_eq!(r.max_retries, 2);
    assert_eq!(r.replay_limit_bytes, 16384);
    assert_eq!(r.total_deadline, Some(Duration::from_millis(10_000)));
    assert_eq!(r.backoff_base, Duration::from_millis(25));
    assert_eq!(r.backoff_cap, Duration::from_millis(250));
    assert_eq!(r.retry_statuses.statuses(), vec![429, 502, 503, 504]);
    assert_eq!(r.grpc_statuses.codes(), vec![14], "unavailable by default");
    assert!(r.retry_transport);
    assert_eq!(r.failure_boundary, FailureBoundary::BeforeHeaders);
    assert!(
        r.methods.contains("GET") && r.methods.contains("HEAD") && r.methods.contains("OPTIONS")
    );
    assert!(
        !r.methods.contains("POST"),
        "POST is never retried without retry_post"
    );
    assert!(
        !r.methods.contains("PUT"),
        "PUT needs an explicit acknowledgement"
    );
    assert_eq!(r.hedge_delay, None);
    assert!((api.budget.percent - 10.0).abs() < f64::EPSILON);
    assert_eq!(api.read_timeout, Some(Duration::from_millis(15_000)));
    assert_eq!(cfg.proxy.diagnostics_retained, 100);
}

#[test]
fn empty_retries_block_is_off() {
    let cfg = parse(&upstream_with("{}"), "t").expect("valid");
    assert!(!cfg.upstreams[0].retries.enabled());
}

#[test]
fn retry_post_adds_post_and_counts_as_acknowledgement() {
    let cfg = parse(&upstream_with("{ attempts: 1, retry_post: true }"), "t").expect("valid");
    let r = &cfg.upstreams[0].retries;
    assert!(r.methods.contains("POST"));
    assert!(r.duplicate_risk_acknowledged);
}

#[test]
fn empty_status_list_disables_status_retries_including_429() {
    let cfg = parse(&upstream_with("{ attempts: 1, retry_statuses: [] }"), "t").expect("valid");
    assert!(cfg.upstreams[0].retries.retry_statuses.is_empty());
}

#[test]
fn rules_default_to_the_safe_starting_configuration_and_sort() {
    let yaml = "upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\nrules:\n  - id: b\n    priority: 5\n  - id: a\n    priority: 5\n  - id: z\n    priority: 1\n";
    let cfg = parse(yaml, "t").expect("valid");
    let ids: Vec<_> = cfg.rules.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["z", "a", "b"]);
    let p = &cfg.rules[0].policy;
    assert_eq!(p.max_retries, 1);
    assert_eq!(p.failure_boundary, FailureBoundary::Connect);
    assert!(p.retry_statuses.is_empty());
    assert_eq!(p.replay_limit_bytes, 0);
    assert!(
        p.methods.contains("GET") && p.methods.contains("HEAD") && !p.methods.contains("OPTIONS")
    );
}

#[test]
fn status_presets_expand() {
    let cfg = parse(
        &rule_with("{ id: r, statuses: [transient, 418], acknowledge_duplicate_risk: true }"),
        "t",
    )
    .expect("valid");
    assert_eq!(
        cfg.rules[0].policy.retry_statuses.statuses(),
        vec![408, 418, 425, 429, 500, 502, 503, 504]
    );
}

#[test]
fn every_validation_rule_names_field_and_rule() {
    let cases: Vec<(String, &str)> = vec![
        (upstream_with("{ attempts: 11 }"), "upstreams[0].retries.attempts: must be at most 10 (got 11)"),
        (upstream_with("{ attempts: 1, backoff_base_ms: 100, backoff_cap_ms: 50 }"), "upstreams[0].retries.backoff_cap_ms: must be >= backoff_base_ms (100) (got 50)"),
        (upstream_with("{ attempts: 1, retry_statuses: [200] }"), "upstreams[0].retries.retry_statuses[0]: must be a 4xx or 5xx status in 400..=599 (got 200)"),
        (upstream_with("{ attempts: 1, retry_statuses: [600] }"), "upstreams[0].retries.retry_statuses[0]: must be a 4xx or 5xx status in 400..=599 (got 600)"),
        (upstream_with("{ attempts: 1, retry_statuses: [flaky] }"), "upstreams[0].retries.retry_statuses[0]: must be a status code or a preset (gateway, transient) (got \"flaky\")"),
        (upstream_with("{ budget_percent: 0 }"), "upstreams[0].retries.budget_percent: must be in (0, 100] (got 0)"),
        (upstream_with("{ budget_percent: 100.5 }"), "upstreams[0].retries.budget_percent: must be in (0, 100] (got 100.5)"),
        (upstream_with("{ buffer_max_bytes: 4194305 }"), "upstreams[0].retries.buffer_max_bytes: must be at most 4194304 (4 MiB) (got 4194305)"),
        (upstream_with("{ total_deadline_ms: 0 }"), "upstreams[0].retries.total_deadline_ms: must not be 0; omit the field for an unbounded deadline"),
        (upstream_with("{ total_deadline_ms: 600001 }"), "upstreams[0].retries.total_deadline_ms: must be at most 600000 (got 600001)"),
        (upstream_with("{ hedge: { delay_ms: 0 } }"), "upstreams[0].retries.hedge.delay_ms: must be at least 1 (got 0)"),
        (upstream_with("{ hedge: on }"), "upstreams[0].retries.hedge: must be off or { delay_ms: N } (got \"on\")"),
        (upstream_with("{ hedge: true }"), "upstreams[0].retries.hedge: must be off or { delay_ms: N }: a hedge needs its delay"),
        (upstream_with("{ methods: [GET, POST] }"), "upstreams[0].retries.methods: POST needs retry_post: true (a retried POST may replay a body the upstream already processed)"),
        (upstream_with("{ methods: [GET, PUT] }"), "upstreams[0].retries.acknowledge_duplicate_risk: must be true to retry PUT, DELETE, PATCH or * (a retry may duplicate the operation)"),
        (upstream_with("{ methods: [CONNECT] }"), "upstreams[0].retries.methods[0]: CONNECT is never retried"),
        (upstream_with("{ methods: [trace] }"), "upstreams[0].retries.methods[0]: TRACE is never retried"),
        (upstream_with("{ methods: [FETCH] }"), "upstreams[0].retries.methods[0]: must be one of GET, HEAD, OPTIONS, PUT, DELETE, POST, PATCH or * (got \"FETCH\")"),
        (upstream_with("{ budget_window_ms: 10 }"), "upstreams[0].retries.budget_window_ms: must be at least 1000 (got 10)"),
        ("upstreams: []\n".to_string(), "upstreams: must list at least one upstream"),
        ("upstreams:\n  - name: Api_1\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n".to_string(), "upstreams[0].name: must be a DNS name: lowercase letters, digits, '-' and '.', at most 253 characters (got \"Api_1\")"),
        ("upstreams:\n  - name: api\n    endpoints: []\n".to_string(), "upstreams[0].endpoints: must list at least one endpoint"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: example.com, port: 1 }]\n".to_string(), "upstreams[0].endpoints[0].address: must be an IPv4 or IPv6 address (got \"example.com\")"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 0 }]\n".to_string(), "upstreams[0].endpoints[0].port: must be in 1..=65535 (got 0)"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, host: api.example, port: 1 }]\n".to_string(), "upstreams[0].endpoints[0]: must have an address or a host, not both"),
        ("upstreams:\n  - name: api\n    endpoints: [{ port: 1 }]\n".to_string(), "upstreams[0].endpoints[0].address: must be set (or host)"),
        ("upstreams:\n  - name: api\n    endpoints: [{ host: 'api_1.example', port: 1 }]\n".to_string(), "upstreams[0].endpoints[0].host: must be a DNS name (got \"api_1.example\")"),
        ("upstreams:\n  - name: api\n    endpoints: [{ host: a.example, port: 443 }, { host: A.example, port: 443 }]\n".to_string(), "upstreams[0].endpoints[1]: must be unique (A.example:443 is also endpoints[0])"),
        ("upstreams:\n  - name: api\n    endpoints: [{ host: a.example, port: 443 }, { host: b.example, port: 443 }]\n    tls: {}\n".to_string(), "upstreams[0].tls.server_name: must be set when host-named endpoints have different names"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\nproxy: { dns_resolvers: ['10.96.0.10'] }\n".to_string(), "proxy.dns_resolvers[0]: must be IP:PORT (got \"10.96.0.10\")"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }, { address: 127.0.0.1, port: 1 }]\n".to_string(), "upstreams[0].endpoints[1]: must be unique (127.0.0.1:1 is also endpoints[0])"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 2 }]\n".to_string(), "upstreams[1].name: must be unique (\"api\" is also upstreams[0])"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    addresses: [10.96.0.10]\n".to_string(), "upstreams[0].addresses[0]: must be IP:PORT, e.g. 10.96.0.10:80 or [fd00::10]:80 (got \"10.96.0.10\")"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    addresses: ['10.96.0.10:0']\n".to_string(), "upstreams[0].addresses[0]: must have a port in 1..=65535 (got \"10.96.0.10:0\")"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    addresses: ['10.96.0.10:80']\n  - name: web\n    endpoints: [{ address: 127.0.0.1, port: 2 }]\n    addresses: ['[fd00::1]:80', '10.96.0.10:80']\n".to_string(), "upstreams[1].addresses[1]: must be unique (10.96.0.10:80 is also an address of upstreams[0])"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\n    timeouts: { connect_ms: 0 }\n".to_string(), "upstreams[0].timeouts.connect_ms: must be at least 1 (got 0)"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\nproxy: { max_request_header_bytes: 100 }\n".to_string(), "proxy.max_request_header_bytes: must be at least 8192 (got 100)"),
        ("upstreams:\n  - name: api\n    endpoints: [{ address: 127.0.0.1, port: 1 }]\nproxy: { diagnostics_retained: 1001 }\n".to_string(), "proxy.diagnostics_retained: must be at most 1000 (got 1001)"),
        (rule_with("{ id: r, statuses: [503] }"), "rules[0].acknowledge_duplicate_risk: must be true for status retries (a retry may duplicate an upstream operation)"),
        (rule_with("{ id: r, methods: [POST] }"), "rules[0].acknowledge_duplicate_risk: must be true for methods other than GET, HEAD and OPTIONS (a retry may duplicate an upstream operation)"),
        (rule_with("{ id: r, methods: ['*'], failure_boundary: before_headers }"), "rules[0].acknowledge_duplicate_risk: must be true for methods other than GET, HEAD and OPTIONS, failure_boundary: before_headers (a retry may duplicate an upstream operation)"),
        (rule_with("{ id: r, replay_limit_bytes: 5000000 }"), "rules[0].replay_limit_bytes: must be at most 4194304 (4 MiB) (got 5000000)"),
        (rule_with("{ id: r, attempts: 11 }"), "rules[0].attempts: must be at most 10 (got 11)"),
        (rule_with("{ id: r, upstreams: [web] }"), "rules[0].upstreams[0]: no upstream named \"web\""),
        (rule_with("{ id: '' }"), "rules[0].id: must not be empty"),
        (rule_with("{ id: r, methods: [] }"), "rules[0].methods: must list at least one method"),
        (rule_with("{ id: r, statuses: [399], acknowledge_duplicate_risk: true }"), "rules[0].statuses[0]: must be a 4xx or 5xx status in 400..=599 (got 399)"),
        (rule_with("{ id: r, attempt_timeout_ms: 0 }"), "rules[0].attempt_timeout_ms: must be at least 1 (got 0)"),
        (rule_with("{ id: r, grpc_statuses: [unavailable] }"), "rules[0].acknowledge_duplicate_risk: must be true for gRPC status retries (a retry may duplicate an upstream operation)"),
        (upstream_with("{ grpc_statuses: [busy] }"), "upstreams[0].retries.grpc_statuses[0]: must be a gRPC status name (cancelled, unknown, invalid-argument, deadline-exceeded, not-found, already-exists, permission-denied, resource-exhausted, failed-precondition, aborted, out-of-range, unimplemented, internal, unavailable, data-loss, unauthenticated) or a number in 1..=16 (got \"busy\")"),
        (upstream_with("{ grpc_statuses: [17] }"), "upstreams[0].retries.grpc_statuses[0]: must be a gRPC status name (cancelled, unknown, invalid-argument, deadline-exceeded, not-found, already-exists, permission-denied, resource-exhausted, failed-precondition, aborted, out-of-range, unimplemented, internal, unavailable, data-loss, unauthenticated) or a number in 1..=16 (got 17)"),
        (rule_with("{ id: r, match: { cel: \"request.path ==\" } }"), "rules[0].match.cel: line 1, column 16: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}"),
        (rule_with("{ id: r, match: { cel: \"req.path == '/'\" } }"), "rules[0].match.cel: unknown variable `req`: only `request` (method, path, host, headers) is defined"),
    ];
    for (yaml, want) in cases {
        assert_eq!(invalid(&yaml), want, "for:\n{yaml}");
    }
}

#[test]
fn several_broken_rules_are_all_reported() {
    let msg = invalid(&upstream_with("{ attempts: 12, budget_percent: -1 }"));
    assert!(
        msg.contains("attempts: must be at most 10 (got 12)"),
        "{msg}"
    );
    assert!(
        msg.contains("budget_percent: must be in (0, 100] (got -1)"),
        "{msg}"
    );
}

#[test]
fn unknown_and_mistyped_fields_are_refused_with_their_location() {
    let err = parse(&upstream_with("{ atempts: 2 }"), "typo.yaml").expect_err("typo refused");
    let msg = err.to_string();
    assert!(msg.starts_with("typo.yaml: "), "{msg}");
    assert!(msg.contains("unknown field `atempts`"), "{msg}");
    let err = parse(&upstream_with("{ attempts: many }"), "t.yaml").expect_err("type refused");
    assert!(err.to_string().contains("attempts"), "{err}");
}

#[test]
fn a_cel_condition_is_compiled_when_the_file_loads() {
    let cfg = parse(
        &rule_with("{ id: tenant-a, match: { cel: \"request.headers['x-tenant'] == 'a'\" } }"),
        "cel.yaml",
    )
    .expect("valid");
    let rule = &cfg.rules[0];
    assert_eq!(
        rule.cel.as_ref().map(|c| c.source()),
        Some("request.headers['x-tenant'] == 'a'")
    );
    assert_eq!(rule.request_match.cel, None, "held compiled, once");
}

#[test]
fn host_named_endpoints_are_resolved_later_and_name_the_tls_server() {
    let yaml = "upstreams:\n  - name: payments\n    endpoints: [{ host: API.Payments.Example, port: 443 }, { address: 10.0.0.7, port: 8443 }, { host: api.payments.example, port: 8443 }]\n    tls: {}\nproxy: { dns_resolvers: ['127.0.0.1:5353', '[::1]:53'] }\n";
    let config = parse(yaml, "test.yaml").expect("valid");
    let up = &config.upstreams[0];
    assert_eq!(up.endpoints.len(), 1, "only the address is an endpoint now");
    let hosts: Vec<(&str, u16)> = up.dns.iter().map(|d| (d.host.as_str(), d.port)).collect();
    assert_eq!(
        hosts,
        [
            ("api.payments.example", 443),
            ("api.payments.example", 8443)
        ]
    );
    assert_eq!(
        up.tls.as_ref().map(|t| t.server_name.as_str()),
        Some("api.payments.example"),
        "the endpoints' shared host name, not the upstream's"
    );
    assert_eq!(
        config.proxy.dns_resolvers,
        [
            "127.0.0.1:5353".parse().expect("addr"),
            "[::1]:53".parse().expect("addr")
        ]
    );
}

#[test]
fn deadlines_are_on_by_default_and_each_way_turns_off_where_it_is_written() {
    use reprise_crds::policy::DeadlinePolicy;
    let cfg = parse(&upstream_with("{ attempts: 1 }"), "t.yaml").expect("valid");
    assert_eq!(cfg.proxy.deadlines, DeadlinePolicy::ON);
    assert_eq!(cfg.upstreams[0].retries.deadlines, DeadlinePolicy::ON);
    let off = |propagate, accept_incoming| DeadlinePolicy {
        propagate,
        accept_incoming,
    };
    let yaml = "upstreams:
  - name: api
    endpoints: [{ address: 127.0.0.1, port: 8080 }]
    retries: { attempts: 1, deadlines: { propagate: false } }
rules:
  - { id: r, deadlines: { accept_incoming: false } }
proxy:
  deadlines: { propagate: true, accept_incoming: false }
";
    let cfg = parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(cfg.upstreams[0].retries.deadlines, off(false, true));
    assert_eq!(cfg.rules[0].policy.deadlines, off(true, false));
    assert_eq!(cfg.proxy.deadlines, off(true, false));
    let e = invalid_or_parse_error(&upstream_with("{ deadlines: { propagate: 1 } }"));
    assert!(e.contains("propagate"), "{e}");
    let e = invalid_or_parse_error(&upstream_with("{ deadlines: { honour: false } }"));
    assert!(e.contains("unknown field `honour`"), "{e}");
}

fn invalid_or_parse_error(yaml: &str) -> String {
    parse(yaml, "t.yaml").expect_err("refused").to_string()
}

//! Snapshots: content-addressed versions, shared validation of pushed policies,
//! and resolution into the configuration a sidecar runs.

use reprise_crds::retry_rule::{Boundary, Hedge, HttpMethod, RetryRule, StatusPreset};
use reprise_crds::snapshot::{Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream};
use reprise_crds::FailureBoundary;

fn upstream(name: &str, ports: &[u16]) -> SnapshotUpstream {
    SnapshotUpstream {
        name: name.into(),
        hosts: vec![name.split('.').next().unwrap_or(name).into()],
        protocol: Default::default(),
        addresses: vec![],
        endpoints: ports
            .iter()
            .map(|p| SnapshotEndpoint {
                address: "127.0.0.1".into(),
                port: *p,
                pod: Some(format!("pod-{p}")),
                zone: None,
            })
            .collect(),
        ..Default::default()
    }
}

fn policy(name: &str, upstream: &str, rule: RetryRule) -> SnapshotPolicy {
    SnapshotPolicy {
        namespace: "default".into(),
        name: name.into(),
        generation: 1,
        upstream: upstream.into(),
        rule,
        precedence: 0,
        route: None,
    }
}

#[test]
fn versions_are_content_hashes_independent_of_order() {
    let a = Snapshot::new(
        vec![
            upstream("api.default", &[1, 2]),
            upstream("web.default", &[3]),
        ],
        vec![policy("p", "api.default", RetryRule::default())],
    );
    let b = Snapshot::new(
        vec![
            upstream("web.default", &[3]),
            upstream("api.default", &[2, 1]),
        ],
        vec![policy("p", "api.default", RetryRule::default())],
    );
    assert_eq!(a.version, b.version);
    let c = Snapshot::new(
        vec![upstream("api.default", &[1])],
        vec![policy("p", "api.default", RetryRule::default())],
    );
    assert_ne!(a.version, c.version, "an endpoint change is a new version");
    let mut tampered = a.clone();
    tampered.upstreams[0].endpoints.pop();
    let err = tampered.resolve().expect_err("version mismatch");
    assert_eq!(
        err.to_string(),
        "version: does not match the snapshot's content"
    );
}

#[test]
fn a_valid_snapshot_resolves_rules_budget_and_aliases() {
    let rule = RetryRule {
        priority: 5,
        status_presets: vec![StatusPreset::Gateway],
        acknowledge_duplicate_risk: true,
        failure_boundary: Boundary::BeforeHeaders,
        retries: reprise_crds::retry_rule::Retries {
            attempts: 3,
            budget_percent: 25.0,
            hedge: Some(Hedge { delay_ms: 50 }),
            ..Default::default()
        },
        ..RetryRule::default()
    };
    let snap = Snapshot::new(
        vec![upstream("api.default", &[1, 2, 3])],
        vec![policy("p", "api.default", rule)],
    );
    let cfg = snap.resolve().expect("valid");
    let up = cfg.upstream("api.default").expect("upstream");
    assert_eq!(up.aliases, vec!["api".to_string()]);
    assert_eq!(up.endpoints.len(), 3);
    assert_eq!(up.endpoints[0].name.as_deref(), Some("pod-1"));
    assert!((up.budget.percent - 25.0).abs() < 1e-9);
    assert!(!up.retries.enabled(), "only the rule retries");
    let r = &cfg.rules[0];
    assert_eq!(r.id, "default/p");
    assert_eq!(r.upstreams, vec!["api.default".to_string()]);
    assert_eq!(r.policy.max_retries, 3);
    assert_eq!(r.policy.failure_boundary, FailureBoundary::BeforeHeaders);
    assert_eq!(r.policy.retry_statuses.statuses(), vec![502, 503, 504]);
    assert_eq!(
        r.policy.hedge_delay,
        Some(std::time::Duration::from_millis(50))
    );
}

#[test]
fn the_shared_validation_refuses_what_the_schema_should_have() {
    // A snapshot from a misbehaving or older controller must still be refused by
    // the sidecar with the field named, so the last good config stays.
    let bad = RetryRule {
        methods: vec![HttpMethod::Post],
        statuses: vec![200],
        replay_limit_bytes: 5_000_000,
        retries: reprise_crds::retry_rule::Retries {
            attempts: 11,
            backoff_base_ms: 100,
            backoff_cap_ms: 50,
            total_deadline_ms: Some(0),
            budget_percent: 0.0,
            ..Default::default()
        },
        ..RetryRule::default()
    };
    let snap = Snapshot::new(
        vec![upstream("api.default", &[1])],
        vec![policy("bad", "web.default", bad)],
    );
    let err = snap.resolve().expect_err("refused");
    let got: Vec<String> = err.0.iter().map(ToString::to_string).collect();
    let want = [
        "default/bad.upstream: no upstream named \"web.default\" in the snapshot",
        "default/bad: spec.statuses[0]: must be a 4xx or 5xx status in 400..=599 (got 200)",
        "default/bad: spec.acknowledgeDuplicateRisk: must be true for methods other than GET, HEAD and OPTIONS (a retry may duplicate an upstream operation)",
        "default/bad: spec.retries.attempts: must be in 0..=10 (got 11)",
        "default/bad: spec.retries.backoffCapMs: must be >= backoffBaseMs (100) (got 50)",
        "default/bad: spec.retries.totalDeadlineMs: must not be 0; omit the field for an unbounded deadline",
        "default/bad: spec.replayLimitBytes: must be at most 4194304 (4 MiB) (got 5000000)",
        "default/bad: spec.retries.budgetPercent: must be in (0, 100] (got 0)",
    ];
    for w in want {
        assert!(got.iter().any(|g| g == w), "missing {w:?} in {got:#?}");
    }
}

#[test]
fn the_first_policy_by_priority_sets_the_budget() {
    let low = RetryRule {
        priority: 1,
        retries: reprise_crds::retry_rule::Retries {
            budget_percent: 20.0,
            ..Default::default()
        },
        ..RetryRule::default()
    };
    let high = RetryRule {
        priority: 0,
        retries: reprise_crds::retry_rule::Retries {
            budget_percent: 30.0,
            ..Default::default()
        },
        ..RetryRule::default()
    };
    let snap = Snapshot::new(
        vec![upstream("api.default", &[1])],
        vec![
            policy("a", "api.default", low),
            policy("b", "api.default", high),
        ],
    );
    let cfg = snap.resolve().expect("valid");
    assert!((cfg.upstreams[0].budget.percent - 30.0).abs() < 1e-9);
    let ids: Vec<&str> = cfg.rules.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["default/b", "default/a"]);
}

#[test]
fn tls_and_dns_upstreams_resolve_and_broken_ones_are_refused_naming_the_field() {
    use reprise_crds::config::TrustAnchors;
    use reprise_crds::snapshot::{SnapshotDnsEndpoint, SnapshotTls};
    use reprise_crds::Protocol;
    let tls = |ca: Option<&str>| SnapshotTls {
        server_name: "api.payments.example".into(),
        ca_certificates: ca.map(str::to_string),
        subject_alt_names: Vec::new(),
    };
    let mut pay = upstream("pay.shop", &[443]);
    pay.protocol = Protocol::Auto;
    pay.tls = Some(tls(None));
    pay.host_rewrite = Some("api.payments.example".into());
    pay.dns = vec![SnapshotDnsEndpoint {
        host: "API.payments.example".into(),
        port: 443,
    }];
    let cfg = Snapshot::new(vec![pay.clone()], vec![])
        .resolve()
        .expect("valid");
    let up = &cfg.upstreams[0];
    let t = up.tls.as_ref().expect("tls");
    assert_eq!(t.server_name, "api.payments.example");
    assert_eq!(
        t.trust,
        TrustAnchors::WellKnown,
        "no bundle: the public roots"
    );
    assert_eq!(up.dns[0].host, "api.payments.example");
    assert_eq!(up.host_rewrite.as_deref(), Some("api.payments.example"));

    let mut bad_ca = pay.clone();
    bad_ca.tls = Some(tls(Some("not a certificate")));
    let mut no_tls = pay.clone();
    no_tls.tls = None;
    let mut bad_dns = pay.clone();
    bad_dns.dns[0].host = "bad_name".into();
    for (u, want) in [
        (bad_ca, "upstreams[0].tls.caCertificates: must hold at least one PEM certificate (the snapshot's CA certificates has none)"),
        (no_tls, "upstreams[0].protocol: h2 and auto are over TLS and need tls"),
        (bad_dns, "upstreams[0].dns[0]: must be a DNS name and a port in 1..=65535 (got \"bad_name:443\")"),
    ] {
        let err = Snapshot::new(vec![u], vec![])
            .resolve()
            .expect_err("refused")
            .to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn a_sidecar_that_does_not_announce_a_capability_gets_the_snapshot_without_what_needs_it() {
    use reprise_crds::snapshot::SnapshotTls;
    let mut pay = upstream("pay.shop", &[443]);
    pay.tls = Some(SnapshotTls {
        server_name: "pay".into(),
        ca_certificates: None,
        subject_alt_names: Vec::new(),
    });
    let full = Snapshot::new(
        vec![upstream("api.shop", &[80]), pay],
        vec![
            policy("reads", "api.shop", RetryRule::default()),
            policy("pays", "pay.shop", RetryRule::default()),
        ],
    );
    let entries = reprise_crds::snapshot::Entries::from_snapshot(full);
    let all: std::collections::BTreeSet<String> = ["tls".to_string(), "dns".to_string()].into();
    let mut same = entries.clone();
    assert!(same.for_capabilities(&all).is_empty());
    assert_eq!(same, entries);
    let mut old = entries.clone();
    assert_eq!(old.for_capabilities(&Default::default()), ["pay.shop"]);
    assert_eq!(old.upstreams.len(), 1);
    assert_eq!(old.policies.len(), 1);
    assert_eq!(
        old.policies.values().next().map(|p| p.policy.name.as_str()),
        Some("reads")
    );
    assert_ne!(old.version(), entries.version(), "its own version");
    assert!(old.to_snapshot().resolve().is_ok());
}

#[test]
fn a_sidecar_without_routes_gets_no_route_rule_producer_policy_or_service_budget() {
    use reprise_crds::snapshot::{RouteKind, SnapshotBudget, SnapshotRoute};
    let mut budgeted = upstream("db.shop", &[5432]);
    budgeted.budget = Some(SnapshotBudget {
        percent: 0.0,
        interval_ms: 10_000,
        min_retries: 1,
        min_retries_per_ms: 10_000,
    });
    let mut producer = policy("theirs", "api.shop", RetryRule::default());
    producer.namespace = "catalog".into();
    producer.precedence = 2;
    let mut route = policy("HTTPRoute:r:0:api.shop", "api.shop", RetryRule::default());
    route.route = Some(SnapshotRoute {
        kind: RouteKind::Http,
        route: "r".into(),
        rule: "0".into(),
        matches: Vec::new(),
        deadline_answers_timeout: false,
        no_attempt_timeout: false,
    });
    let full = Snapshot::new(
        vec![upstream("api.shop", &[80]), budgeted],
        vec![
            policy("mine", "api.shop", RetryRule::default()),
            producer,
            route,
            policy("db", "db.shop", RetryRule::default()),
        ],
    );
    let entries = reprise_crds::snapshot::Entries::from_snapshot(full);
    let current: std::collections::BTreeSet<String> = reprise_crds::protocol::CAPABILITIES
        .split(',')
        .map(str::to_string)
        .collect();
    let mut same = entries.clone();
    assert!(same.for_capabilities(&current).is_empty());
    assert_eq!(same, entries);
    // A sidecar from before routes: only its own namespace's plain policy.
    let before: std::collections::BTreeSet<String> =
        ["tls".to_string(), "dns".to_string(), "delta".to_string()].into();
    let mut old = entries.clone();
    assert_eq!(old.for_capabilities(&before), ["db.shop"]);
    let names: Vec<String> = old.policies.values().map(|p| p.policy.id()).collect();
    assert_eq!(names, ["default/mine"]);
    assert!(old.to_snapshot().resolve().is_ok());
    // And what a current sidecar gets resolves, the route's rule first by
    // precedence (0, 0, 0 then 2), the budget the Service's own.
    let config = entries.to_snapshot().resolve().expect("valid");
    let order: Vec<(u8, &str)> = config
        .rules
        .iter()
        .map(|r| (r.precedence, r.id.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            (0, "default/HTTPRoute:r:0:api.shop"),
            (0, "default/db"),
            (0, "default/mine"),
            (2, "catalog/theirs")
        ]
    );
    let db = config.upstream("db.shop").expect("db");
    assert_eq!(db.budget.percent, 0.0);
    assert!((db.budget.min_retries_per_second - 0.1).abs() < 1e-9);
}

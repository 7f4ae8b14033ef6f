use std::collections::BTreeMap;

use super::*;
use crate::policy::route::{GRPCRoute, HTTPRoute};

fn http(yaml: &str) -> HTTPRoute {
    serde_yaml::from_str(yaml).expect("an HTTPRoute")
}

fn read_http(route: &HTTPRoute) -> Result<Read, Refused> {
    let empty = BTreeMap::new();
    let r = Route {
        kind: RouteKind::Http,
        namespace: "shop",
        name: "api",
        annotations: route.metadata.annotations.as_ref().unwrap_or(&empty),
        rules: Rules::Http(&route.spec.rules),
    };
    read(&r, &parent())
}

fn parent() -> ServiceParent {
    ServiceParent {
        namespace: "shop".into(),
        name: "api".into(),
        port: Some(8080),
    }
}

/// The conformance test `HTTPRouteRetry`'s route, attached to a Service.
const RETRIES: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: { name: api, namespace: shop }
spec:
  parentRefs: [{ group: "", kind: Service, name: api, port: 8080 }]
  rules:
    - matches: [{ path: { type: PathPrefix, value: /retry/code-500-attempts-3 } }]
      retry: { codes: [500], attempts: 3 }
      backendRefs: [{ name: api, port: 8080 }]
    - matches: [{ path: { type: PathPrefix, value: /retry-on-connection-errors } }]
      retry: { attempts: 100, backoff: 50ms }
      backendRefs: [{ name: api, port: 8080 }]
    - name: timed
      matches: [{ path: { type: PathPrefix, value: /request-timeout } }]
      timeouts: { request: 500ms, backendRequest: "0s" }
      backendRefs: [{ name: api, port: 8080 }]
"#;

#[test]
fn retry_and_timeouts_map_to_the_rule_a_sidecar_runs() {
    let read = read_http(&http(RETRIES)).expect("applied");
    assert_eq!(read.rules.len(), 3);
    let codes = &read.rules[0];
    assert_eq!(codes.rule.statuses, vec![500]);
    assert_eq!(codes.rule.retries.attempts, 3);
    assert_eq!(codes.rule.failure_boundary, Boundary::Connect);
    assert!(codes.rule.retries.reuse_endpoints);
    assert_eq!(
        codes.rule.methods,
        vec![HttpMethod::Get, HttpMethod::Head, HttpMethod::Options]
    );
    assert_eq!(
        codes.route.matches[0].path_segment_prefix.as_deref(),
        Some("/retry/code-500-attempts-3")
    );
    assert_eq!(codes.route.rule, "0");
    assert!(!codes.route.deadline_answers_timeout);

    let clamped = &read.rules[1];
    assert_eq!(
        clamped.rule.retries.attempts, 10,
        "clamped to Reprise's maximum"
    );
    assert!(clamped.rule.statuses.is_empty(), "connection errors only");
    assert_eq!(
        (
            clamped.rule.retries.backoff_base_ms,
            clamped.rule.retries.backoff_cap_ms
        ),
        (50, 500)
    );
    assert!(
        read.notes
            .iter()
            .any(|n| n.contains("spec.rules[1].retry.attempts 100 is above Reprise's maximum: 10")),
        "{:?}",
        read.notes
    );

    let timed = &read.rules[2];
    assert_eq!(timed.route.rule, "timed");
    assert_eq!(timed.rule.retries.attempts, 0, "no retry block: no retries");
    assert_eq!(timed.rule.retries.total_deadline_ms, Some(500));
    assert!(timed.route.deadline_answers_timeout);
    assert!(
        timed.route.no_attempt_timeout,
        "0s turns the attempt timeout off"
    );
    assert_eq!(timed.rule.retries.attempt_timeout_ms, None);

    // And the sidecar's shared validation takes every rule.
    for r in &read.rules {
        let mut errs = reprise_crds::ValidationErrors::default();
        let (rule, _) = r.rule.resolve("shop/x", "api.shop", "spec", &mut errs);
        let _ = r.route.rules(rule, "shop/x", "route", &mut errs);
        assert!(errs.is_empty(), "{errs}");
    }
}

#[test]
fn the_acknowledgement_annotation_retries_every_method() {
    let mut route = http(RETRIES);
    route.metadata.annotations = Some(BTreeMap::from([(
        ACKNOWLEDGE_ANNOTATION.to_string(),
        "true".to_string(),
    )]));
    let read = read_http(&route).expect("applied");
    assert_eq!(read.rules[0].rule.methods, vec![HttpMethod::Any]);
    route.metadata.annotations = Some(BTreeMap::from([(
        ACKNOWLEDGE_ANNOTATION.to_string(),
        "yes".to_string(),
    )]));
    let refused = read_http(&route).expect_err("refused");
    assert!(
        refused.message.contains("must be \"true\" or \"false\""),
        "{refused:?}"
    );
}

#[test]
fn what_reprise_cannot_apply_whole_is_refused_naming_the_field() {
    let cases = [
        (
            "filters: [{ type: RequestRedirect, requestRedirect: { statusCode: 302 } }]\n      backendRefs: [{ name: api, port: 8080 }]",
            "spec.rules[0].filters: Reprise implements no filter (RequestRedirect)",
        ),
        (
            "backendRefs: [{ name: api, port: 8080, weight: 90 }, { name: api-v2, port: 8080, weight: 10 }]",
            "spec.rules[0].backendRefs: 2 backends: Reprise does not split traffic",
        ),
        (
            "backendRefs: [{ name: other, port: 8080 }]",
            "spec.rules[0].backendRefs[0]: must be the parent Service shop/api itself",
        ),
        (
            "backendRefs: [{ name: api, port: 8080 }]\n      sessionPersistence: { sessionName: s }",
            "spec.rules[0].sessionPersistence: not implemented by Reprise",
        ),
        (
            "matches: [{ queryParams: [{ type: RegularExpression, name: a, value: b.* }] }]\n      backendRefs: [{ name: api }]",
            "spec.rules[0].matches[0].queryParams[0].type: RegularExpression query parameter matches are not supported",
        ),
        (
            "retry: { backoff: 1x }\n      backendRefs: [{ name: api }]",
            "spec.rules[0].retry.backoff: \"1x\" is not a Gateway API duration",
        ),
    ];
    for (rule, want) in cases {
        let yaml = format!(
            "metadata: {{ name: api, namespace: shop }}\nspec:\n  parentRefs: [{{ kind: Service, group: \"\", name: api }}]\n  rules:\n    - {rule}\n"
        );
        let refused = read_http(&http(&yaml)).expect_err(want);
        assert_eq!(refused.reason, "UnsupportedValue");
        assert!(
            refused.message.starts_with(want),
            "{} does not start with {want}",
            refused.message
        );
        assert!(refused
            .message
            .ends_with("Reprise does not apply the route"));
    }
}

#[test]
fn matches_keep_their_kind() {
    let route = http(
        r#"
metadata: { name: api, namespace: shop }
spec:
  parentRefs: [{ kind: Service, group: "", name: api }]
  rules:
    - matches:
        - path: { type: Exact, value: /a }
          method: PUT
          headers: [{ name: X-Tenant, value: blue }, { type: RegularExpression, name: x-v, value: "v[0-9]" }]
          queryParams: [{ name: q, value: "1" }]
        - path: { type: RegularExpression, value: "/items/[0-9]+" }
      backendRefs: [{ name: api }]
"#,
    );
    let read = read_http(&route).expect("applied");
    let m = &read.rules[0].route.matches;
    assert_eq!(m[0].path_exact.as_deref(), Some("/a"));
    assert_eq!(m[0].method.as_deref(), Some("PUT"));
    assert_eq!(m[0].headers[0].name, "x-tenant");
    assert_eq!(m[0].header_regexes[0].value.as_deref(), Some("v[0-9]"));
    assert_eq!(m[0].query[0].name, "q");
    assert_eq!(m[1].path_regex.as_deref(), Some("/items/[0-9]+"));
}

#[test]
fn a_grpc_route_retries_the_statuses_its_annotation_names() {
    let route: GRPCRoute = serde_yaml::from_str(
        r#"
metadata:
  name: say
  namespace: shop
  annotations:
    reprise.dev/retry-grpc-statuses: "UNAVAILABLE, resource-exhausted"
    reprise.dev/retry-attempts: "2"
    reprise.dev/request-timeout: 2s
spec:
  parentRefs: [{ kind: Service, group: "", name: api }]
  rules:
    - matches: [{ method: { service: helloworld.Greeter, method: SayHello } }, { method: { service: helloworld.Greeter } }]
      backendRefs: [{ name: api }]
    - backendRefs: [{ name: api }]
"#,
    )
    .expect("a GRPCRoute");
    let empty = BTreeMap::new();
    let r = Route {
        kind: RouteKind::Grpc,
        namespace: "shop",
        name: "say",
        annotations: route.metadata.annotations.as_ref().unwrap_or(&empty),
        rules: Rules::Grpc(&route.spec.rules),
    };
    let read = read(&r, &parent()).expect("applied");
    let first = &read.rules[0];
    assert_eq!(first.rule.retries.attempts, 2);
    assert_eq!(first.rule.retries.total_deadline_ms, Some(2_000));
    assert_eq!(
        first.rule.grpc_statuses,
        vec![
            GrpcStatusEntry::Name("unavailable".into()),
            GrpcStatusEntry::Name("resource-exhausted".into())
        ]
    );
    assert_eq!(
        first.route.matches[0].path_exact.as_deref(),
        Some("/helloworld.Greeter/SayHello")
    );
    assert_eq!(
        first.route.matches[1].path_prefix.as_deref(),
        Some("/helloworld.Greeter/")
    );
    // A rule without matches takes every gRPC call, and nothing else.
    let any = &read.rules[1].route.matches[0];
    assert_eq!(any.header_regexes[0].name, "content-type");
    let mut errs = reprise_crds::ValidationErrors::default();
    let (rule, _) = read.rules[1]
        .rule
        .resolve("shop/x", "api.shop", "spec", &mut errs);
    let rules = read.rules[1]
        .route
        .rules(rule, "shop/x", "route", &mut errs);
    assert!(errs.is_empty(), "{errs}");
    let cel = rules[0].cel.as_ref().expect("the content-type condition");
    let call = |ct: &str| {
        let headers = [("content-type", ct)];
        cel.evaluate(&reprise_crds::cel_match::CelRequest {
            method: "POST",
            path: "/x.Y/Z",
            host: "api",
            headers: &headers,
        })
    };
    assert_eq!(call("application/grpc"), Ok(true));
    assert_eq!(call("application/grpc+proto"), Ok(true));
    assert_eq!(call("application/json"), Ok(false));
}

#[test]
fn gateway_api_durations() {
    for (d, ms) in [
        ("500ms", 500),
        ("2s", 2_000),
        ("1m30s", 90_000),
        ("1h", 3_600_000),
        ("0s", 0),
    ] {
        assert_eq!(duration_ms("f", d), Ok(ms), "{d}");
    }
    for d in ["", "1", "s", "1.5s", "123456s", "1s1s1s1s1s", "-1s"] {
        assert!(duration_ms("f", d).is_err(), "{d}");
    }
}

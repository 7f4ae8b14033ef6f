//! Policies applied, refused, pushed and followed through faults.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reprise_e2e::upstream_server;

use reprise_e2e::cluster::*;

#[test]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
fn invalid_policies_are_refused_at_apply_with_the_field_named() {
    let c = Cluster::new("invalid");
    let cases = [
        ("retries: { attempts: 11 }", "spec.retries.attempts"),
        (
            "retries: { backoffBaseMs: 100, backoffCapMs: 50 }",
            "backoffCapMs must be >= backoffBaseMs",
        ),
        (
            "statuses: [200]\n  acknowledgeDuplicateRisk: true",
            "spec.statuses[0]",
        ),
        (
            "retries: { totalDeadlineMs: 0 }",
            "spec.retries.totalDeadlineMs",
        ),
        ("methods: [POST]", "acknowledgeDuplicateRisk must be true"),
        ("replayLimitBytes: 5000000", "spec.replayLimitBytes"),
    ];
    for (i, (spec, field)) in cases.iter().enumerate() {
        let yaml = format!("apiVersion: reprise.dev/v1alpha1\nkind: RetryPolicy\nmetadata: {{ name: bad-{i} }}\nspec:\n  targetRef: {{ name: api }}\n  {spec}\n");
        let err = c.apply(&yaml).expect_err("refused");
        assert!(err.contains(field), "case {spec:?}: {err}");
    }
    assert!(
        c.kubectl(&["-n", &c.ns, "get", "rp", "-o", "name"])
            .expect("list")
            .trim()
            .is_empty(),
        "nothing was stored"
    );
    let explain = c
        .kubectl(&["explain", "retrypolicy.spec.retries.attempts"])
        .expect("explain");
    assert!(
        explain.contains("Retries beyond the first attempt"),
        "{explain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
async fn a_flaky_pool_is_recovered_follows_readiness_and_survives_a_controller_restart() {
    let c = Cluster::new("flow");
    let o = c.octet;
    // Three api pods, one failing half its requests with 503.
    let mut servers = Vec::new();
    for (i, fail) in [(0u8, 50u32), (1, 0), (2, 0)] {
        let addr: SocketAddr = format!("127.1.{o}.{}:8080", 21 + i).parse().expect("addr");
        servers.push(
            upstream_server::start(addr, "api", fail)
                .await
                .expect("upstream"),
        );
        c.pod(
            &format!("api-{i}"),
            "app: api",
            Some(&format!("10.244.{o}.{}", 21 + i)),
        );
    }
    c.apply("apiVersion: v1\nkind: Service\nmetadata: { name: api }\nspec:\n  selector: { app: api }\n  ports: [{ name: http, port: 80, targetPort: 8080 }]\n")
        .expect("service");
    c.pod("web-1", "app: web", None);
    let (push, metrics, listen, admin) = (free(), free(), free(), free());
    let controller = c.controller(push, metrics);
    // Spans go to the cluster's Jaeger under a service name of this test's own.
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .expect("OTEL_EXPORTER_OTLP_ENDPOINT (run e2e/test.sh)");
    let service = format!("reprise-sidecar-{}", c.ns);
    let _sidecar = c.sidecar_with(
        "web-1",
        push,
        listen,
        admin,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", &service),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    c.apply("apiVersion: reprise.dev/v1alpha1\nkind: RetryPolicy\nmetadata: { name: reads }\nspec:\n  targetRef: { name: api }\n  podSelector: { matchLabels: { app: web } }\n  statusPresets: [Gateway]\n  acknowledgeDuplicateRisk: true\n  retries: { attempts: 2, budgetPercent: 50, budgetMinRetriesPerSecond: 20 }\n")
        .expect("policy");
    c.until(
        "In-Sync 1/1 with 3 endpoints",
        Duration::from_secs(60),
        || {
            c.policy_field("reads", "{.status.inSync}") == "1/1"
                && c.policy_field("reads", "{.status.endpoints}") == "3"
        },
    );
    assert_eq!(
        c.policy_field("reads", "{.status.conditions[0].status}"),
        "True"
    );

    // Every request succeeds; the flaky pod's 503s were retried on the others.
    for _ in 0..150 {
        let (status, _) = get(listen, "api", "/").await.expect("response");
        assert_eq!(status, 200);
    }
    let (_, m) = get(admin, "localhost", "/metrics").await.expect("metrics");
    let recovered: f64 = m
        .lines()
        .find(|l| {
            l.starts_with("reprise_requests_total{upstream=\"api.")
                && l.contains("outcome=\"recovered\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(
        recovered > 0.0,
        "the flaky pod's failures were recovered:\n{m}"
    );
    assert!(
        servers[0].requests.load(Ordering::Relaxed) > 0,
        "the flaky pod took traffic"
    );

    // Jaeger shows each attempt of a recovered request as its own span, with
    // the endpoint, the failure, and the resend count.
    let jaeger = std::env::var("JAEGER_QUERY").expect("JAEGER_QUERY (run e2e/test.sh)");
    let mut trace = None;
    let start = std::time::Instant::now();
    while trace.is_none() && start.elapsed() < Duration::from_secs(30) {
        trace =
            reprise_e2e::jaeger::find(&jaeger, &service, &[("reprise.outcome", "recovered")], 5)
                .await
                .ok()
                .and_then(|t| t.into_iter().next());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let trace = trace.expect("a recovered request's trace in Jaeger");
    let drawn = reprise_e2e::jaeger::waterfall(&trace, 40);
    let root = trace
        .spans
        .iter()
        .find(|s| s.parent.is_none())
        .expect("a root span");
    assert_eq!(root.tag("span.kind"), Some("server"), "{drawn}");
    let attempts: Vec<_> = trace
        .spans
        .iter()
        .filter(|s| s.parent.as_deref() == Some(root.id.as_str()))
        .collect();
    assert!(attempts.len() >= 2, "one span per attempt:\n{drawn}");
    assert!(
        attempts
            .iter()
            .all(|s| s.tag("span.kind") == Some("client")),
        "{drawn}"
    );
    let (first, last) = (attempts[0], attempts[attempts.len() - 1]);
    assert_eq!(first.tag("reprise.endpoint.pod"), Some("api-0"), "{drawn}");
    assert_eq!(
        first.tag("error.type"),
        Some("upstream_status_503"),
        "{drawn}"
    );
    assert_eq!(
        first.tag("http.response.status_code"),
        Some("503"),
        "{drawn}"
    );
    assert_eq!(first.tag("http.request.resend_count"), None, "{drawn}");
    assert_eq!(
        last.tag("http.request.resend_count"),
        Some(&*(attempts.len() - 1).to_string()),
        "{drawn}"
    );
    assert_eq!(
        last.tag("http.response.status_code"),
        Some("200"),
        "{drawn}"
    );
    assert!(
        matches!(last.tag("reprise.endpoint.pod"), Some("api-1" | "api-2")),
        "the retry went to another pod:\n{drawn}"
    );
    assert!(
        last.tag("server.address").is_some() && last.tag("server.port") == Some("8080"),
        "{drawn}"
    );

    // The controller's side: a reconcile span that accepted the policy, and
    // a push span that the sidecar ACKed.
    let controller_service = format!("reprise-controller-{}", c.ns);
    for (tags, what) in [
        (
            &[("reprise.reconcile.result", "accepted")][..],
            "an accepting reconcile",
        ),
        (&[("reprise.push.result", "acked")][..], "an ACKed push"),
    ] {
        let mut found = None;
        let start = std::time::Instant::now();
        while found.is_none() && start.elapsed() < Duration::from_secs(30) {
            found = reprise_e2e::jaeger::find(&jaeger, &controller_service, tags, 5)
                .await
                .ok()
                .and_then(|t| t.into_iter().next());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let trace = found.unwrap_or_else(|| panic!("{what} in Jaeger"));
        let span = &trace.spans[0];
        assert_eq!(
            span.tag("k8s.namespace.name"),
            Some(c.ns.as_str()),
            "{what}"
        );
    }

    // A pod made unready leaves the sidecar's endpoints; after the ACK no request reaches it.
    c.set_ready("api-1", &format!("10.244.{o}.22"), false);
    c.until("2 endpoints in status", Duration::from_secs(30), || {
        c.policy_field("reads", "{.status.endpoints}") == "2"
    });
    let sidecar_sees = |n: usize| {
        let out = Command::new("curl")
            .args(["-s", &format!("http://{admin}/config")])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .matches("\"addr\"")
                    .count()
            });
        out.is_ok_and(|count| count == n)
    };
    c.until("sidecar has 2 endpoints", Duration::from_secs(30), || {
        sidecar_sees(2)
    });
    let before = servers[1].requests.load(Ordering::Relaxed);
    for _ in 0..60 {
        assert_eq!(get(listen, "api", "/").await.expect("response").0, 200);
    }
    assert_eq!(
        servers[1].requests.load(Ordering::Relaxed),
        before,
        "no request reached the unready pod"
    );

    // The controller killed and restarted during traffic: no failed request; the sidecar resyncs.
    let traffic = tokio::spawn(async move {
        let mut failures = 0;
        for _ in 0..200 {
            if get(listen, "api", "/").await.map(|r| r.0) != Some(200) {
                failures += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        failures
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(controller);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _controller = c.controller(push, metrics);
    assert_eq!(
        traffic.await.expect("traffic"),
        0,
        "no request failed while the controller was away"
    );
    c.until("sidecar reconnected", Duration::from_secs(30), || {
        Command::new("curl")
            .args(["-s", &format!("http://{metrics}/metrics")])
            .output()
            .is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .contains("reprise_controller_connected_sidecars 1")
            })
    });
    c.until(
        "In-Sync 1/1 after the restart",
        Duration::from_secs(30),
        || c.policy_field("reads", "{.status.inSync}") == "1/1",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e cluster: run e2e/test.sh"]
async fn two_replicas_one_leader_and_in_sync_counts_from_the_follower() {
    let c = Cluster::new("replicas");
    let o = c.octet;
    let _up = upstream_server::start(
        format!("127.1.{o}.31:8080").parse().expect("addr"),
        "api",
        0,
    )
    .await
    .expect("upstream");
    c.pod("api-0", "app: api", Some(&format!("10.244.{o}.31")));
    c.apply("apiVersion: v1\nkind: Service\nmetadata: { name: api }\nspec:\n  selector: { app: api }\n  ports: [{ port: 80, targetPort: 8080 }]\n").expect("service");
    c.pod("web-1", "app: web", None);
    // Both replicas share one TLS directory (one CA), as they share a Secret in a cluster.
    let lease = |id: &'static str| {
        [
            "--leader-election",
            "--lease-namespace",
            c.ns.as_str(),
            "--identity",
            id,
        ]
    };
    let (push_a, push_b) = (free(), free());
    let _a = c.controller_with(push_a, free(), &lease("replica-a"));
    c.until("replica-a holds the lease", Duration::from_secs(30), || {
        c.kubectl(&[
            "-n",
            &c.ns,
            "get",
            "lease",
            "reprise-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .is_ok_and(|h| h == "replica-a")
    });
    let _b = c.controller_with(push_b, free(), &lease("replica-b"));
    let (listen, admin) = (free(), free());
    let _sidecar = c.sidecar("web-1", push_b, listen, admin);
    c.apply("apiVersion: reprise.dev/v1alpha1\nkind: RetryPolicy\nmetadata: { name: reads }\nspec:\n  targetRef: { name: api }\n  retries: { attempts: 1 }\n").expect("policy");
    // The sidecar talks to the follower; the leader writes the count the follower reports.
    c.until(
        "In-Sync 1/1 via the follower",
        Duration::from_secs(60),
        || c.policy_field("reads", "{.status.inSync}") == "1/1",
    );
    let managers = c
        .kubectl(&[
            "-n",
            &c.ns,
            "get",
            "rp",
            "reads",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ])
        .expect("managers");
    assert!(managers.contains("reprise-controller"), "{managers}");
    assert_eq!(get(listen, "api", "/").await.map(|r| r.0), Some(200));
    assert_eq!(
        c.kubectl(&[
            "-n",
            &c.ns,
            "get",
            "lease",
            "reprise-controller",
            "-o",
            "jsonpath={.spec.holderIdentity}"
        ])
        .expect("lease"),
        "replica-a"
    );
}

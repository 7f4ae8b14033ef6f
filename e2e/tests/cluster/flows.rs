//! Policies applied, refused, and pushed by two replicas (API-only: the
//! flaky pool, rolling restarts and controller restarts run in real pods in
//! `node.rs`).

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

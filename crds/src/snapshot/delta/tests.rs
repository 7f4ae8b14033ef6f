use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::retry_rule::RetryRule;
use crate::snapshot::{SnapshotDnsEndpoint, SnapshotTls};

fn endpoint(i: u32) -> SnapshotEndpoint {
    SnapshotEndpoint {
        address: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
        port: 8080,
        pod: Some(format!("api-{i}")),
        zone: None,
    }
}

fn upstream(name: &str, endpoints: impl IntoIterator<Item = u32>) -> SnapshotUpstream {
    SnapshotUpstream {
        name: name.into(),
        hosts: vec![name.split('.').next().unwrap_or(name).into()],
        endpoints: endpoints.into_iter().map(endpoint).collect(),
        ..SnapshotUpstream::default()
    }
}

fn policy(name: &str, upstream: &str, attempts: i32) -> SnapshotPolicy {
    let mut rule = RetryRule::default();
    rule.retries.attempts = attempts;
    SnapshotPolicy {
        namespace: "shop".into(),
        name: name.into(),
        generation: i64::from(attempts),
        upstream: upstream.into(),
        rule,
        precedence: 0,
        route: None,
    }
}

fn entries(upstreams: Vec<SnapshotUpstream>, policies: Vec<SnapshotPolicy>) -> Entries {
    Entries::from_snapshot(Snapshot::new(upstreams, policies))
}

#[test]
fn the_head_digest_covers_every_field_but_the_endpoints() {
    let u = SnapshotUpstream {
        name: "api.shop".into(),
        hosts: vec!["api".into()],
        protocol: crate::policy::Protocol::H2,
        endpoints: vec![endpoint(1)],
        addresses: vec!["10.96.0.10:80".into()],
        dns: vec![SnapshotDnsEndpoint {
            host: "example.com".into(),
            port: 443,
        }],
        host_rewrite: Some("example.com".into()),
        tls: Some(SnapshotTls {
            server_name: "example.com".into(),
            ca_certificates: Some("pem".into()),
            subject_alt_names: vec!["a.example.com".into()],
        }),
        budget: Some(crate::snapshot::SnapshotBudget {
            percent: 20.0,
            interval_ms: 10_000,
            min_retries: 1,
            min_retries_per_ms: 1_000,
        }),
    };
    let mut whole = serde_json::to_value(&u).expect("json");
    whole.as_object_mut().expect("object").remove("endpoints");
    assert_eq!(serde_json::to_value(Head(&u)).expect("json"), whole);
    // And with the optional fields absent, as the upstream leaves them out.
    let bare = upstream("api.shop", [1]);
    let mut whole = serde_json::to_value(&bare).expect("json");
    whole.as_object_mut().expect("object").remove("endpoints");
    assert_eq!(serde_json::to_value(Head(&bare)).expect("json"), whole);
}

#[test]
fn one_endpoint_replaced_of_five_hundred_is_a_patch_of_two_endpoints() {
    let before = entries(
        vec![
            upstream("big.shop", 0..500),
            upstream("small.shop", 1000..1003),
        ],
        vec![
            policy("reads", "big.shop", 3),
            policy("writes", "small.shop", 2),
        ],
    );
    let after = entries(
        vec![
            upstream("big.shop", (0..500).filter(|i| *i != 250).chain([777])),
            upstream("small.shop", 1000..1003),
        ],
        vec![
            policy("reads", "big.shop", 3),
            policy("writes", "small.shop", 2),
        ],
    );
    let delta = before.delta_to(&after);
    assert_eq!(delta.upstreams, []);
    assert_eq!(delta.policies, []);
    assert_eq!(
        delta.endpoints,
        [EndpointsPatch {
            upstream: "big.shop".into(),
            added: vec![endpoint(777)],
            removed: vec![endpoint(250)],
        }]
    );
    let line = serde_json::to_vec(&DeltaLine {
        delta: delta.clone(),
    })
    .expect("json");
    assert!(line.starts_with(DELTA_PREFIX));
    let whole = serde_json::to_vec(&after.to_snapshot()).expect("json");
    assert!(
        line.len() * 50 < whole.len(),
        "a delta of {} bytes against a snapshot of {}",
        line.len(),
        whole.len()
    );
    let mut running = before.clone();
    running.apply(&delta).expect("applies");
    assert_eq!(running, after);
    assert_eq!(running.version(), after.version());
}

#[test]
fn whole_entries_replace_added_and_removed_ones() {
    let before = entries(
        vec![upstream("a.shop", 0..3), upstream("b.shop", 10..12)],
        vec![policy("p", "a.shop", 2), policy("q", "b.shop", 2)],
    );
    let mut a = upstream("a.shop", 0..3);
    a.protocol = crate::policy::Protocol::H2c;
    let after = entries(
        vec![a.clone(), upstream("c.shop", 20..21)],
        vec![policy("p", "a.shop", 4), policy("r", "c.shop", 2)],
    );
    let delta = before.delta_to(&after);
    let mut names: Vec<&str> = delta.upstreams.iter().map(|u| u.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["a.shop", "c.shop"], "a's head changed; c is new");
    assert_eq!(delta.removed_upstreams, ["b.shop"]);
    assert_eq!(delta.endpoints, []);
    let policies: Vec<&str> = delta.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(policies, ["p", "r"]);
    assert_eq!(
        delta.removed_policies,
        [PolicyRef {
            namespace: "shop".into(),
            name: "q".into()
        }]
    );
    let mut running = before;
    running.apply(&delta).expect("applies");
    assert_eq!(running, after);
}

#[test]
fn a_delta_that_does_not_fit_is_refused_and_changes_nothing() {
    let before = entries(
        vec![upstream("a.shop", 0..3)],
        vec![policy("p", "a.shop", 2)],
    );
    let after = entries(
        vec![upstream("a.shop", 1..4)],
        vec![policy("p", "a.shop", 2)],
    );
    let good = before.delta_to(&after);
    let cases: Vec<(SnapshotDelta, &str)> = vec![
        (
            SnapshotDelta {
                base: "0000000000000000".into(),
                ..good.clone()
            },
            "its base is 0000000000000000",
        ),
        (
            SnapshotDelta {
                version: "0000000000000000".into(),
                ..good.clone()
            },
            "not the 0000000000000000 announced",
        ),
        (
            SnapshotDelta {
                endpoints: vec![EndpointsPatch {
                    upstream: "z.shop".into(),
                    ..EndpointsPatch::default()
                }],
                ..good.clone()
            },
            "upstream \"z.shop\", which is not here",
        ),
        (
            SnapshotDelta {
                endpoints: vec![EndpointsPatch {
                    upstream: "a.shop".into(),
                    added: vec![],
                    removed: vec![endpoint(9)],
                }],
                ..good.clone()
            },
            "removes endpoint 10.0.0.9:8080",
        ),
        (
            SnapshotDelta {
                endpoints: vec![EndpointsPatch {
                    upstream: "a.shop".into(),
                    added: vec![],
                    removed: vec![endpoint(0), endpoint(0)],
                }],
                ..good.clone()
            },
            "removes endpoint 10.0.0.0:8080",
        ),
        (
            SnapshotDelta {
                removed_policies: vec![PolicyRef {
                    namespace: "shop".into(),
                    name: "nope".into(),
                }],
                ..good.clone()
            },
            "removes policy shop/nope",
        ),
    ];
    for (delta, reason) in cases {
        let mut running = before.clone();
        let err = running.apply(&delta).expect_err(reason).to_string();
        assert!(err.contains(reason), "{err:?} should say {reason:?}");
        assert_eq!(running, before, "unchanged after: {err}");
    }
    let mut running = before;
    running.apply(&good).expect("the good one applies");
    assert_eq!(running, after);
}

#[test]
fn the_version_is_the_same_however_the_entries_were_reached() {
    let a = entries(
        vec![upstream("a.shop", [3, 1, 2])],
        vec![policy("p", "a.shop", 2)],
    );
    let b = entries(
        vec![upstream("a.shop", [1, 2, 3])],
        vec![policy("p", "a.shop", 2)],
    );
    assert_eq!(a.version(), b.version());
    // Endpoints are bound to their upstream: the same endpoint under
    // another upstream is another snapshot.
    let moved = entries(
        vec![upstream("a.shop", [1, 2]), upstream("b.shop", [3])],
        vec![policy("p", "a.shop", 2)],
    );
    let stayed = entries(
        vec![upstream("a.shop", [1, 2, 3]), upstream("b.shop", [])],
        vec![policy("p", "a.shop", 2)],
    );
    assert_ne!(moved.version(), stayed.version());
    // A whole snapshot versioned by its entries is accepted as the legacy one is.
    let s = a.to_snapshot();
    assert!(s.version_matches());
    assert_ne!(s.version, s.content_hash());
    let legacy = Snapshot::new(s.upstreams.clone(), s.policies.clone());
    assert!(legacy.version_matches());
}

/// A random step: endpoints come and go, upstreams appear, change and go,
/// policies are edited.
fn step(rng: &mut StdRng, ups: &mut BTreeMap<String, Vec<u32>>, pols: &mut BTreeMap<String, i32>) {
    match rng.random_range(0..10) {
        0..=5 => {
            // Rolling restart: one endpoint out, another in.
            if let Some(name) = ups
                .keys()
                .nth(rng.random_range(0..ups.len().max(1)))
                .cloned()
            {
                let eps = ups.get_mut(&name).expect("there");
                if !eps.is_empty() && rng.random_bool(0.7) {
                    eps.remove(rng.random_range(0..eps.len()));
                }
                if rng.random_bool(0.7) {
                    eps.push(rng.random_range(0..2000));
                }
            }
        }
        6 => {
            ups.insert(
                format!("u{}.shop", rng.random_range(0..8)),
                (0..rng.random_range(0..30))
                    .map(|_| rng.random_range(0..2000))
                    .collect(),
            );
        }
        7 => {
            if let Some(name) = ups
                .keys()
                .nth(rng.random_range(0..ups.len().max(1)))
                .cloned()
            {
                ups.remove(&name);
            }
        }
        _ => {
            pols.insert(
                format!("p{}", rng.random_range(0..6)),
                rng.random_range(1..6),
            );
        }
    }
}

#[test]
fn random_change_sequences_applied_as_deltas_give_the_full_recomputation() {
    for seed in 0..40u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ups: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut pols: BTreeMap<String, i32> = BTreeMap::new();
        let build = |ups: &BTreeMap<String, Vec<u32>>, pols: &BTreeMap<String, i32>| {
            let mut upstreams: Vec<SnapshotUpstream> = ups
                .iter()
                .map(|(n, eps)| upstream(n, eps.iter().copied()))
                .collect();
            if seed % 2 == 1 {
                // A head change now and then: another protocol.
                for u in upstreams.iter_mut().filter(|u| u.endpoints.len() % 5 == 1) {
                    u.protocol = crate::policy::Protocol::H2c;
                }
            }
            entries(
                upstreams,
                pols.iter().map(|(n, a)| policy(n, "u0.shop", *a)).collect(),
            )
        };
        let mut sent = build(&ups, &pols);
        let mut sidecar = sent.clone();
        for _ in 0..60 {
            for _ in 0..rng.random_range(1..4) {
                step(&mut rng, &mut ups, &mut pols);
            }
            let next = build(&ups, &pols);
            let delta = sent.delta_to(&next);
            // Over the wire and back, as the sidecar reads it.
            let line = serde_json::to_vec(&DeltaLine { delta }).expect("json");
            let read: DeltaLine = serde_json::from_slice(&line).expect("parse");
            sidecar
                .apply(&read.delta)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(sidecar, next, "seed {seed}");
            sent = next;
        }
    }
}

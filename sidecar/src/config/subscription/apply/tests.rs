use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use http::Uri;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reprise_crds::retry_rule::RetryRule;
use reprise_crds::snapshot::{
    DeltaLine, Entries, Snapshot, SnapshotEndpoint, SnapshotPolicy, SnapshotUpstream,
};

use super::*;
use crate::config::subscription::TrustedCa;
use crate::proxy::dns::Dns;
use crate::proxy::route::Routes;

fn subscription(name: &str) -> Subscription {
    let dir = std::env::temp_dir().join(format!("reprise-apply-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Subscription {
        controller: Uri::from_static("https://controller:15010"),
        server_name: None,
        pod: "p".into(),
        namespace: "shop".into(),
        token_path: PathBuf::from("/t"),
        ca: TrustedCa::Pem(String::new()),
        snapshot_path: dir.join("snapshot.json"),
        address_map: None,
        report_every: Duration::from_secs(10),
        diagnostics_retained: None,
        deadlines: reprise_crds::policy::DeadlinePolicy::ON,
    }
}

/// Endpoint `n` of a small pool, so that upstreams share addresses and one
/// lands on another's virtual address; `n` also picks the pod and zone.
fn endpoint(n: u32) -> SnapshotEndpoint {
    SnapshotEndpoint {
        address: format!("10.0.0.{}", n % 13),
        port: 80 + (n / 13 % 2) as u16,
        pod: (!n.is_multiple_of(5)).then(|| format!("pod-{}", n % 7)),
        zone: n.is_multiple_of(3).then(|| "z1".into()),
    }
}

fn snapshot(ups: &BTreeMap<&'static str, Vec<u32>>, attempts: i32) -> Snapshot {
    let upstreams = ups
        .iter()
        .map(|(name, eps)| SnapshotUpstream {
            name: (*name).into(),
            hosts: vec![name.split('.').next().unwrap_or(name).into()],
            endpoints: eps.iter().copied().map(endpoint).collect(),
            addresses: match *name {
                "b.shop" => vec!["10.0.0.1:80".into()],
                "c.shop" => vec!["10.96.0.3:80".into()],
                _ => Vec::new(),
            },
            ..SnapshotUpstream::default()
        })
        .collect();
    let mut rule = RetryRule::default();
    rule.retries.attempts = attempts;
    let policy = SnapshotPolicy {
        namespace: "shop".into(),
        name: "p".into(),
        generation: i64::from(attempts),
        upstream: "a.shop".into(),
        rule,
        precedence: 0,
        route: None,
    };
    Entries::from_snapshot(Snapshot::new(upstreams, vec![policy])).to_snapshot()
}

fn line(value: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

fn delta_line(delta: &SnapshotDelta) -> Vec<u8> {
    line(&DeltaLine {
        delta: delta.clone(),
    })
}

/// Each upstream's endpoints with their states' addresses.
fn states(routes: &Routes) -> HashMap<String, Vec<(reprise_crds::Endpoint, usize)>> {
    routes
        .config
        .upstreams
        .iter()
        .map(|u| {
            let state = routes.upstream(&u.name).expect("there");
            let eps = state
                .endpoints
                .iter()
                .map(|e| (e.endpoint.clone(), Arc::as_ptr(e) as usize))
                .collect();
            (u.name.clone(), eps)
        })
        .collect()
}

fn owners(routes: &Routes) -> BTreeMap<std::net::SocketAddr, String> {
    routes
        .by_address
        .iter()
        .map(|(a, u)| (*a, u.config.name.clone()))
        .collect()
}

#[test]
fn random_endpoint_changes_patched_in_give_what_a_whole_reload_gives() {
    for seed in 0..30u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let sub = subscription(&format!("random-{seed}"));
        let mut ups: BTreeMap<&'static str, Vec<u32>> = BTreeMap::new();
        for name in ["a.shop", "b.shop", "c.shop"] {
            let n = rng.random_range(0..12);
            ups.insert(name, (0..n).map(|_| rng.random_range(0..60)).collect());
        }
        let mut attempts = 2;
        let first = snapshot(&ups, attempts);
        let proxy = Proxy::new(first.resolve().expect("valid"));
        let mut running = Running::default();
        assert!(sub
            .apply(&proxy, &line(&first), &mut running)
            .error
            .is_none());
        let mut sent = Entries::from_snapshot(first);
        let mut patched = 0;
        for _ in 0..60 {
            if rng.random_bool(0.8) {
                // A rolling restart's step, sometimes two at once.
                for _ in 0..rng.random_range(1..3) {
                    let name = ["a.shop", "b.shop", "c.shop"][rng.random_range(0..3)];
                    let eps = ups.get_mut(name).expect("there");
                    if !eps.is_empty() && rng.random_bool(0.6) {
                        eps.remove(rng.random_range(0..eps.len()));
                    }
                    if rng.random_bool(0.6) {
                        // Twins now and then: the same endpoint listed twice.
                        let n = match eps.first() {
                            Some(&n) if rng.random_bool(0.1) => n,
                            _ => rng.random_range(0..60),
                        };
                        eps.push(n);
                    }
                }
            } else {
                attempts = attempts % 5 + 1;
            }
            let next = Entries::from_snapshot(snapshot(&ups, attempts));
            let delta = sent.delta_to(&next);
            if delta.base == delta.version {
                continue;
            }
            let before = proxy.routes();
            let answer = sub.apply_delta(&proxy, &delta_line(&delta), &mut running);
            let SidecarLine::Ack(ack) = answer else {
                panic!("seed {seed}: {answer:?}");
            };
            assert_eq!(ack.error, None, "seed {seed}");
            assert_eq!(ack.version, next.version());
            sent = next.clone();
            let after = proxy.routes();
            // Exactly what a whole reload of the same snapshot builds.
            let whole = Routes::new(
                Arc::new(next.to_snapshot().resolve().expect("valid")),
                None,
                &Dns::default(),
            );
            assert_eq!(*after.config, *whole.config, "seed {seed}");
            assert_eq!(owners(&after), owners(&whole), "seed {seed}");
            // Every endpoint that stayed kept its state (health, in-flight
            // count, pool), patched in or reloaded.
            let (old, new) = (states(&before), states(&after));
            for (name, eps) in &new {
                for (e, state) in eps {
                    let kept: Vec<usize> = old[name]
                        .iter()
                        .filter(|(o, _)| o == e)
                        .map(|(_, s)| *s)
                        .collect();
                    let twins = eps.iter().filter(|(o, _)| o == e).count();
                    if !kept.is_empty() && twins <= kept.len() {
                        assert!(
                            kept.contains(state),
                            "seed {seed}: {name} {e:?} lost its state"
                        );
                    }
                }
            }
            if only_endpoints(&delta) {
                // Patched, not reloaded: the upstreams it did not touch are
                // the very same.
                for u in &after.config.upstreams {
                    if !delta.endpoints.iter().any(|p| p.upstream == u.name) {
                        assert!(Arc::ptr_eq(
                            before.upstream(&u.name).expect("before"),
                            after.upstream(&u.name).expect("after")
                        ));
                    }
                }
                patched += 1;
            }
        }
        assert!(patched > 20, "seed {seed}: {patched} patched");
        let _ = std::fs::remove_dir_all(sub.snapshot_path.parent().expect("dir"));
    }
}

#[test]
fn an_endpoint_that_does_not_resolve_is_refused_as_a_whole_snapshot_would_be() {
    let sub = subscription("bad-address");
    let first = snapshot(&BTreeMap::from([("a.shop", vec![1, 2])]), 2);
    let proxy = Proxy::new(first.resolve().expect("valid"));
    let mut running = Running::default();
    assert!(sub
        .apply(&proxy, &line(&first), &mut running)
        .error
        .is_none());
    let sent = Entries::from_snapshot(first.clone());
    let mut bad = first.clone();
    bad.upstreams[0].endpoints.push(SnapshotEndpoint {
        address: "not-an-ip".into(),
        port: 80,
        pod: None,
        zone: None,
    });
    let bad = Entries::from_snapshot(bad);
    let delta = sent.delta_to(&bad);
    assert!(only_endpoints(&delta));
    let SidecarLine::Ack(ack) = sub.apply_delta(&proxy, &delta_line(&delta), &mut running) else {
        panic!("an answer");
    };
    let error = ack.error.expect("refused");
    assert!(
        error.contains(
            "upstreams[0].endpoints[2].address: must be an IPv4 or IPv6 address (got \"not-an-ip\")"
        ),
        "{error}"
    );
    assert_eq!(
        proxy.config().upstreams[0].endpoints.len(),
        2,
        "the running one kept"
    );
    // The next delta, from what was sent, fixes it: resolved whole, as the
    // running routes are not what was sent.
    let fixed = Entries::from_snapshot(snapshot(&BTreeMap::from([("a.shop", vec![1, 2, 3])]), 2));
    let SidecarLine::Ack(ack) =
        sub.apply_delta(&proxy, &delta_line(&bad.delta_to(&fixed)), &mut running)
    else {
        panic!("an answer");
    };
    assert_eq!(ack.error, None);
    assert_eq!(
        *proxy.config(),
        fixed.to_snapshot().resolve().expect("valid")
    );
    let _ = std::fs::remove_dir_all(sub.snapshot_path.parent().expect("dir"));
}

#[tokio::test(start_paused = true)]
async fn deltas_are_written_to_disk_at_most_once_a_second_and_whole() {
    let sub = subscription("save");
    let mut eps = vec![1];
    let first = snapshot(&BTreeMap::from([("a.shop", eps.clone())]), 2);
    let proxy = Proxy::new(first.resolve().expect("valid"));
    let mut running = Running::default();
    assert!(sub
        .apply(&proxy, &line(&first), &mut running)
        .error
        .is_none());
    let saved = |sub: &Subscription| sub.load_saved().expect("saved").0.version;
    assert_eq!(
        saved(&sub),
        first.version,
        "a whole snapshot is written as it comes"
    );
    assert_eq!(running.save_due(), None);
    let mut sent = Entries::from_snapshot(first);
    let mut delta_to = |n: u32, running: &mut Running| {
        eps.push(n);
        let next = Entries::from_snapshot(snapshot(&BTreeMap::from([("a.shop", eps.clone())]), 2));
        let delta = sent.delta_to(&next);
        sent = next.clone();
        let answer = sub.apply_delta(&proxy, &delta_line(&delta), running);
        assert!(matches!(answer, SidecarLine::Ack(Ack { error: None, .. })));
        next.version()
    };
    let v2 = delta_to(2, &mut running);
    assert_ne!(saved(&sub), v2, "written less than a second ago: not yet");
    tokio::time::advance(Duration::from_millis(400)).await;
    let v3 = delta_to(3, &mut running);
    let due = running.save_due().expect("due");
    assert_eq!(due, running.saved_at.expect("written") + SAVE_EVERY);
    tokio::time::advance(Duration::from_millis(599)).await;
    sub.save_if_due(&mut running);
    assert_ne!(saved(&sub), v3);
    tokio::time::advance(Duration::from_millis(1)).await;
    sub.save_if_due(&mut running);
    let (on_disk, config) = sub.load_saved().expect("saved");
    assert_eq!(on_disk.version, v3, "the newest, whole");
    assert_eq!(config.upstreams[0].endpoints.len(), 3);
    assert_eq!(running.save_due(), None);
    // A quiet second later, the next delta is written at once.
    tokio::time::advance(SAVE_EVERY).await;
    let v4 = delta_to(4, &mut running);
    assert_eq!(saved(&sub), v4);
    let _ = std::fs::remove_dir_all(sub.snapshot_path.parent().expect("dir"));
}

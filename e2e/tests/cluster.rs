//! End-to-end tests against a real kube-apiserver, etcd and
//! kube-controller-manager (started by `e2e/cluster.sh up`), with the real
//! `reprise-controller` and `reprise-sidecar` binaries and real upstream
//! servers. There is no kubelet: pods are API objects whose status the test
//! sets, and whose "containers" are processes on 127.1.x.y. The API server
//! refuses loopback addresses in EndpointSlices, so pods get 10.244.x.y and
//! the sidecars map that prefix to 127.1.x.y (REPRISE_ENDPOINT_ADDRESS_MAP);
//! nothing is ever sent to 10.244.0.0/16.
//!
//! Ignored by default; `e2e/test.sh` runs them with `--ignored` once the
//! cluster is up and `REPRISE_E2E_KUBECONFIG` is set.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use reprise_e2e::upstream_server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Cluster {
    kubeconfig: String,
    bin: PathBuf,
    ns: String,
    work: PathBuf,
    /// Third octet shared by this test's pods, so parallel runs do not collide.
    octet: u8,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Cluster {
    fn new(name: &str) -> Cluster {
        let kubeconfig = std::env::var("REPRISE_E2E_KUBECONFIG")
            .expect("REPRISE_E2E_KUBECONFIG (run e2e/test.sh)");
        let bin = std::env::var("REPRISE_BIN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug"))
            });
        let octet = u8::try_from(std::process::id() % 200 + 20).unwrap_or(20)
            + if name == "flow" { 0 } else { 1 };
        let ns = format!("e2e-{name}-{}", std::process::id());
        let work = std::env::temp_dir().join(&ns);
        std::fs::create_dir_all(&work).expect("work dir");
        let c = Cluster {
            kubeconfig,
            bin,
            ns,
            work,
            octet,
        };
        c.kubectl(&["create", "namespace", &c.ns])
            .expect("namespace");
        // Pod admission needs the namespace's default ServiceAccount.
        c.until("default ServiceAccount", Duration::from_secs(30), || {
            c.kubectl(&["-n", &c.ns, "get", "sa", "default"]).is_ok()
        });
        c.kubectl(&[
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/retrypolicy.yaml"),
        ])
        .expect("CRD");
        c
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    fn apply(&self, yaml: &str) -> Result<String, String> {
        let path = self.work.join(format!("apply-{}.yaml", rand_suffix()));
        std::fs::write(&path, yaml).expect("write yaml");
        self.kubectl(&["-n", &self.ns, "apply", "-f", path.to_str().expect("path")])
    }

    fn until(&self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out after {limit:?} waiting for {what}");
    }

    fn pod(&self, name: &str, labels: &str, ip: Option<&str>) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, labels: {{ {labels} }} }}\nspec:\n  nodeName: local\n  containers: [{{ name: app, image: none }}]\n"
        ))
        .expect("pod");
        if let Some(ip) = ip {
            self.set_ready(name, ip, true);
        }
    }

    fn set_ready(&self, name: &str, ip: &str, ready: bool) {
        let patch = format!(
            r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{{"type":"Ready","status":"{}"}}]}}}}"#,
            if ready { "True" } else { "False" }
        );
        self.kubectl(&[
            "-n",
            &self.ns,
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ])
        .expect("pod status");
    }

    fn token(&self, pod: &str) -> PathBuf {
        let uid = self
            .kubectl(&[
                "-n",
                &self.ns,
                "get",
                "pod",
                pod,
                "-o",
                "jsonpath={.metadata.uid}",
            ])
            .expect("uid");
        let token = self
            .kubectl(&[
                "-n",
                &self.ns,
                "create",
                "token",
                "default",
                "--audience",
                "reprise",
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                pod,
                "--bound-object-uid",
                &uid,
            ])
            .expect("token");
        let path = self.work.join(format!("{pod}.token"));
        std::fs::write(&path, token.trim()).expect("token file");
        path
    }

    fn controller(&self, push: SocketAddr, metrics: SocketAddr) -> Proc {
        self.controller_with(push, metrics, &[])
    }

    fn controller_with(&self, push: SocketAddr, metrics: SocketAddr, extra: &[&str]) -> Proc {
        let log =
            std::fs::File::create(self.work.join(format!("controller-{}.log", rand_suffix())))
                .expect("log");
        Proc(
            Command::new(self.bin.join("reprise-controller"))
                .env("KUBECONFIG", &self.kubeconfig)
                .args([
                    "run",
                    "--push-addr",
                    &push.to_string(),
                    "--metrics-addr",
                    &metrics.to_string(),
                ])
                .args(extra)
                .args([
                    "--tls-dir",
                    self.work.join("tls").to_str().expect("path"),
                    "--tls-san",
                    "localhost",
                ])
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .expect("start reprise-controller"),
        )
    }

    fn sidecar(&self, pod: &str, push: SocketAddr, listen: SocketAddr, admin: SocketAddr) -> Proc {
        let log = std::fs::File::create(self.work.join(format!("sidecar-{pod}.log"))).expect("log");
        Proc(
            Command::new(self.bin.join("reprise-sidecar"))
                .env("REPRISE_CONTROLLER", format!("https://{push}"))
                .env("REPRISE_CONTROLLER_SERVER_NAME", "localhost")
                .env("REPRISE_POD_NAME", pod)
                .env("REPRISE_POD_NAMESPACE", &self.ns)
                .env("REPRISE_TOKEN_PATH", self.token(pod))
                .env("REPRISE_CA_PATH", self.work.join("tls/ca.crt"))
                .env(
                    "REPRISE_SNAPSHOT_PATH",
                    self.work.join(format!("{pod}.snapshot.json")),
                )
                .env(
                    "REPRISE_ENDPOINT_ADDRESS_MAP",
                    format!("10.244.{0}.0/24=127.1.{0}.0/24", self.octet),
                )
                .args([
                    "--listen",
                    &listen.to_string(),
                    "--admin",
                    &admin.to_string(),
                ])
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .expect("start reprise-sidecar"),
        )
    }

    fn policy_field(&self, name: &str, path: &str) -> String {
        self.kubectl(&[
            "-n",
            &self.ns,
            "get",
            "retrypolicy",
            name,
            "-o",
            &format!("jsonpath={path}"),
        ])
        .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Pods bound to a node without a kubelet never finish terminating by themselves.
        let _ = self.kubectl(&[
            "-n",
            &self.ns,
            "delete",
            "pods",
            "--all",
            "--grace-period=0",
            "--force",
        ]);
        let _ = self.kubectl(&["delete", "namespace", &self.ns, "--wait=false"]);
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn free() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

async fn get(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out).to_string();
    Some((
        text.get(9..12)?.parse().ok()?,
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

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
    let _sidecar = c.sidecar("web-1", push, listen, admin);
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

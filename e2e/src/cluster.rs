//! A namespace on the local control plane (`e2e/cluster.sh`) with pods but no
//! kubelet: pods are API objects whose status this sets, their containers are
//! local processes (the real controller and sidecar binaries) on 127.1.x.y.
//! Used by the end-to-end tests and the Kubernetes demo; it panics on
//! failures, as a test would.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod node;

pub use node::{
    chart_dir, drive, helm_bin, helm_in, node_app_yaml, node_name, node_transparent_app_yaml,
    Release, NODE_POLICY,
};

/// One test's (or the demo's) namespace on the local control plane.
#[derive(Debug)]
pub struct Cluster {
    pub kubeconfig: String,
    pub bin: PathBuf,
    pub ns: String,
    pub work: PathBuf,
    /// Third octet shared by this test's pods, so parallel runs do not collide.
    pub octet: u8,
}

/// A child process, killed when dropped.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Cluster {
    /// A fresh namespace, nothing else.
    pub fn bare(name: &str) -> Cluster {
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
        c
    }

    /// A namespace with the CRD applied from `crds/`.
    pub fn new(name: &str) -> Cluster {
        let c = Cluster::bare(name);
        c.kubectl(&[
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/retrypolicy.yaml"),
        ])
        .expect("CRD");
        c
    }

    /// A copy of the admin kubeconfig that impersonates `user`, so a process
    /// run with it has exactly that user's RBAC.
    pub fn kubeconfig_as(&self, user: &str) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig).expect("kubeconfig");
        let mut out = String::new();
        for line in text.lines() {
            out.push_str(line);
            out.push('\n');
            if line.trim_start().starts_with("client-key-data:") {
                out.push_str(&format!("    as: {user}\n"));
            }
        }
        assert!(out.contains("    as: "), "no client key in the kubeconfig");
        let path = self.work.join(format!("kubeconfig-{}", rand_suffix()));
        std::fs::write(&path, out).expect("write kubeconfig");
        path
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        kubectl_with(&self.kubeconfig, args)
    }

    /// Gateway API's CRDs of `channel` (`standard` or `experimental`), from
    /// the module e2e/tools/gateway-api pins (`GATEWAY_API_CRD_DIR`, exported
    /// by `e2e/build-tools.sh`): the files Gateway API publishes, applied
    /// server-side (they are too large for the last-applied annotation) and
    /// waited for until Established. The chart never installs them. The
    /// standard bundle's ValidatingAdmissionPolicy refuses experimental CRDs
    /// over standard ones: for the experimental channel it is deleted first,
    /// as its message tells a user to; the standard channel applies over
    /// either. Tests that need a channel ask for it, whatever ran before.
    pub fn gateway_api(&self, channel: &str) {
        let root = std::env::var("GATEWAY_API_CRD_DIR").expect(
            "GATEWAY_API_CRD_DIR: the CRDs of the pinned Gateway API module (source the env file of e2e/build-tools.sh)",
        );
        let dir = format!("{root}/{channel}");
        if channel == "experimental" {
            self.kubectl(&[
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                "safe-upgrades.gateway.networking.k8s.io",
                "--ignore-not-found",
            ])
            .expect("delete the standard channel's safe-upgrades policy");
        }
        // The CRD files, not the folder: it also holds a kustomization.
        let mut args = vec!["apply", "--server-side", "--force-conflicts"];
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| Some(e.ok()?.path().to_str()?.to_string()))
            .filter(|f| f.ends_with(".yaml") && !f.ends_with("/kustomization.yaml"))
            // The experimental folder carries the standard channel's
            // safe-upgrades policy too, which refuses its own CRDs over
            // standard ones: left out, as its message asks.
            .filter(|f| channel != "experimental" || !f.contains("_vap_"))
            .collect();
        files.sort();
        for f in &files {
            args.extend(["-f", f.as_str()]);
        }
        // The API server may still enforce the policy deleted just before
        // (its admission plugin learns of the deletion from a watch).
        let mut tries = 0;
        while let Err(e) = self.kubectl(&args) {
            tries += 1;
            if tries >= 30 || !e.contains("ValidatingAdmissionPolicy") {
                panic!("apply {dir}: {e}");
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        let mut crds = vec![
            "crd/httproutes.gateway.networking.k8s.io",
            "crd/grpcroutes.gateway.networking.k8s.io",
            "crd/backendtlspolicies.gateway.networking.k8s.io",
        ];
        if channel == "experimental" {
            crds.push("crd/xbackendtrafficpolicies.gateway.networking.x-k8s.io");
        }
        let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
        args.extend(crds);
        self.kubectl(&args)
            .unwrap_or_else(|e| panic!("Gateway API {channel} CRDs Established: {e}"));
    }

    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        let path = self.work.join(format!("apply-{}.yaml", rand_suffix()));
        std::fs::write(&path, yaml).expect("write yaml");
        self.kubectl(&["-n", &self.ns, "apply", "-f", path.to_str().expect("path")])
    }

    /// Waits until the API server's admission chain reaches the injecting
    /// webhook: a server-side dry-run Pod in this (labelled) namespace comes
    /// back with the sidecar. `helm install --wait` returns once the
    /// controller is Ready, but the API server reaches it a moment later (the
    /// caBundle the controller patches in reaches the API server's webhook
    /// cache, kube-proxy programs the Service); with failurePolicy Ignore a
    /// Pod created in that window is admitted without the sidecar (seen once
    /// in CI, 2.5 s after install).
    pub fn until_injecting(&self, limit: Duration) {
        let path = self.work.join(format!("dry-run-{}.yaml", rand_suffix()));
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Pod\nmetadata: { name: injection-probe }\nspec:\n  containers: [{ name: app, image: app:1 }]\n",
        )
        .expect("write yaml");
        let path = path.to_str().expect("path");
        let mut last = String::new();
        let start = Instant::now();
        while start.elapsed() < limit {
            let out = self.kubectl(&[
                "-n",
                &self.ns,
                "create",
                "--dry-run=server",
                "-f",
                path,
                "-o",
                "jsonpath={.spec.initContainers[*].name}",
            ]);
            match out {
                Ok(names) if names.split_whitespace().any(|n| n == "reprise-sidecar") => return,
                Ok(names) => last = format!("init containers [{names}]"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out after {limit:?} waiting for the webhook to inject a dry-run Pod in {}: {last}", self.ns);
    }

    pub fn until(&self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out after {limit:?} waiting for {what}");
    }

    pub fn pod(&self, name: &str, labels: &str, ip: Option<&str>) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, labels: {{ {labels} }} }}\nspec:\n  nodeName: local\n  containers: [{{ name: app, image: none }}]\n"
        ))
        .expect("pod");
        if let Some(ip) = ip {
            self.set_ready(name, ip, true);
        }
    }

    pub fn set_ready(&self, name: &str, ip: &str, ready: bool) {
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

    pub fn token(&self, pod: &str) -> PathBuf {
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

    pub fn controller(&self, push: SocketAddr, metrics: SocketAddr) -> Proc {
        self.controller_with(push, metrics, &[])
    }

    pub fn controller_with(&self, push: SocketAddr, metrics: SocketAddr, extra: &[&str]) -> Proc {
        let log =
            std::fs::File::create(self.work.join(format!("controller-{}.log", rand_suffix())))
                .expect("log");
        Proc(
            Command::new(self.bin.join("reprise-controller"))
                .env("KUBECONFIG", &self.kubeconfig)
                // When the harness runs with a collector (e2e/test.sh, the
                // demo), the controller's spans go to it under a name of this
                // namespace's own.
                .env(
                    "OTEL_SERVICE_NAME",
                    format!("reprise-controller-{}", self.ns),
                )
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
                .env("OTEL_BSP_SCHEDULE_DELAY", "200")
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

    pub fn sidecar(
        &self,
        pod: &str,
        push: SocketAddr,
        listen: SocketAddr,
        admin: SocketAddr,
    ) -> Proc {
        self.sidecar_with(pod, push, listen, admin, &[])
    }

    /// The sidecar of `pod`, with extra environment (e.g. `OTEL_*`).
    pub fn sidecar_with(
        &self,
        pod: &str,
        push: SocketAddr,
        listen: SocketAddr,
        admin: SocketAddr,
        env: &[(&str, &str)],
    ) -> Proc {
        let log = std::fs::File::create(self.work.join(format!("sidecar-{pod}.log"))).expect("log");
        Proc(
            Command::new(self.bin.join("reprise-sidecar"))
                .envs(env.iter().copied())
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

    pub fn policy_field(&self, name: &str, path: &str) -> String {
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
        // The work dir (applied YAML, kubeconfigs, logs) is kept only when
        // the test failed, to read; a passing run would leave one per test.
        if std::thread::panicking() {
            eprintln!("kept {} (the test failed)", self.work.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.work);
        }
    }
}

/// `kubectl ARGS` against `kubeconfig`: stdout, or stderr as the error.
pub fn kubectl_with(kubeconfig: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

pub fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn free() -> SocketAddr {
    reprise_testkit::sidecar::free_addr()
}

pub async fn get(addr: SocketAddr, host: &str, path: &str) -> Option<(u16, String)> {
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

/// Sum of a Prometheus text exposition's samples of `name` whose labels
/// contain every `needle`.
pub fn metric_sum(text: &str, name: &str, needles: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        // An empty sum is -0.0; print it as 0.
        + 0.0
}

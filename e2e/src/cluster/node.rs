//! The real node (`e2e/cluster.sh up` without `--api-only`): the Helm
//! release of `charts/reprise` that the node tests install, the app they and
//! the Kubernetes demo run in an injected namespace, its RetryPolicy, and
//! `drive`, which makes that app send requests through its sidecar.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{get, kubectl_with};

/// The real node's name when the cluster has one (`REPRISE_E2E_NODE`, set by
/// `e2e/cluster.sh env`), else `None` (an `--api-only` cluster).
pub fn node_name() -> Option<String> {
    std::env::var("REPRISE_E2E_NODE")
        .ok()
        .filter(|n| !n.is_empty())
}

/// The Helm binary (`HELM`, else `helm` on PATH).
pub fn helm_bin() -> String {
    std::env::var("HELM").unwrap_or_else(|_| "helm".into())
}

/// `charts/reprise` in this checkout.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/reprise"))
}

/// `helm ARGS -n NS` against `kubeconfig`: stdout and stderr together,
/// as the error too when helm fails.
pub fn helm_in(kubeconfig: &str, ns: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm_bin())
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .args(["-n", ns])
        .output()
        .map_err(|e| format!("cannot run helm ({}): {e}", helm_bin()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// A Helm release of `charts/reprise` in a namespace of its own; uninstalled
/// and its namespace deleted when dropped.
#[derive(Debug)]
pub struct Release {
    pub kubeconfig: String,
    pub ns: String,
    pub name: String,
}

impl Release {
    pub fn new(kubeconfig: &str, ns: &str, name: &str) -> Release {
        Release {
            kubeconfig: kubeconfig.into(),
            ns: ns.into(),
            name: name.into(),
        }
    }

    /// `helm ARGS -n NS`; stdout and stderr together.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        helm_in(&self.kubeconfig, &self.ns, args)
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        kubectl_with(
            &self.kubeconfig,
            &[&["-n", self.ns.as_str()], args].concat(),
        )
    }

    /// `helm install NAME charts/reprise --create-namespace --wait` with the
    /// node's images (`e2e/images.sh`: tag `dev`) and `sets`.
    pub fn install_on_node(&self, sets: &[&str], timeout: &str) -> Result<String, String> {
        let chart = chart_dir();
        let mut args = vec![
            "install",
            &self.name,
            chart.to_str().unwrap_or("charts/reprise"),
            "--create-namespace",
            "--wait",
            "--timeout",
            timeout,
            "--set",
            "image.controller.tag=dev",
            "--set",
            "image.sidecar.tag=dev",
        ];
        for s in sets {
            args.extend(["--set", s]);
        }
        self.helm(&args)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.helm(&["uninstall", &self.name, "--wait=false"]);
        let _ = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["delete", "namespace", &self.ns, "--wait=false"])
            .output();
    }
}

/// The app the node tests and the demo run in a namespace opted into
/// injection: StatefulSet `api` (three pods of `reprise.local/e2e-app:dev`,
/// `FLAKY_POD` answering 503 to `FLAKY_PERCENT`% of requests, no sidecar),
/// Service `api` and Deployment `web` (one pod, injected: it calls `api`
/// through its sidecar). [`NODE_POLICY`] is the RetryPolicy for `web` → `api`.
pub fn node_app_yaml(flaky_pod: &str, flaky_percent: u32) -> String {
    app_yaml(flaky_pod, flaky_percent, false)
}

/// [`node_app_yaml`] with `web` annotated `reprise.dev/transparent: "true"`
/// (so it has no `HTTP_PROXY` and dials `api` itself, its outbound TCP
/// redirected to the sidecar) and running as UID 1000: the sidecar's UID
/// (65532) is the one whose connections the rules let through.
pub fn node_transparent_app_yaml(flaky_pod: &str, flaky_percent: u32) -> String {
    app_yaml(flaky_pod, flaky_percent, true)
}

fn app_yaml(flaky_pod: &str, flaky_percent: u32, transparent: bool) -> String {
    let security_as = |uid: u32| {
        format!("securityContext: {{ runAsNonRoot: true, runAsUser: {uid}, runAsGroup: {uid}, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{ drop: [ALL] }}, seccompProfile: {{ type: RuntimeDefault }} }}")
    };
    let security = security_as(65532);
    let (web_annotations, web_security) = if transparent {
        (
            ", annotations: { reprise.dev/transparent: \"true\" }",
            security_as(1000),
        )
    } else {
        ("", security.clone())
    };
    let env = "- { name: POD_NAME, valueFrom: { fieldRef: { fieldPath: metadata.name } } }\n            - { name: POD_IP, valueFrom: { fieldRef: { fieldPath: status.podIP } } }";
    let probe = "readinessProbe: { httpGet: { path: /healthz, port: 8080 }, periodSeconds: 1, failureThreshold: 1 }";
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {{ name: api }}
spec:
  serviceName: api
  replicas: 3
  podManagementPolicy: Parallel
  selector: {{ matchLabels: {{ app: api }} }}
  template:
    metadata:
      labels: {{ app: api, reprise.dev/inject: disabled }}
    spec:
      terminationGracePeriodSeconds: 10
      automountServiceAccountToken: false
      containers:
        - name: api
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          ports: [{{ name: http, containerPort: 8080 }}]
          env:
            {env}
            - {{ name: FLAKY_POD, value: "{flaky_pod}" }}
            - {{ name: FLAKY_PERCENT, value: "{flaky_percent}" }}
            - {{ name: DRAIN_MS, value: "4000" }}
          {probe}
          resources: {{ requests: {{ cpu: 10m, memory: 16Mi }}, limits: {{ memory: 64Mi }} }}
          {security}
---
apiVersion: v1
kind: Service
metadata: {{ name: api }}
spec:
  selector: {{ app: api }}
  ports: [{{ name: http, port: 80, targetPort: 8080 }}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: web }}
spec:
  replicas: 1
  selector: {{ matchLabels: {{ app: web }} }}
  template:
    metadata: {{ labels: {{ app: web }}{web_annotations} }}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: app
          image: reprise.local/e2e-app:dev
          imagePullPolicy: Never
          ports: [{{ name: http, containerPort: 8080 }}]
          env:
            {env}
          {probe}
          resources: {{ requests: {{ cpu: 10m, memory: 16Mi }}, limits: {{ memory: 64Mi }} }}
          {web_security}
"#
    )
}

/// RetryPolicy `reads`: GETs from `web` to `api` retried twice on 502/503/504
/// and on failures before response headers (GETs are idempotent, hence the
/// acknowledgement), on another pod, within a 50% budget.
pub const NODE_POLICY: &str = "apiVersion: reprise.dev/v1alpha1
kind: RetryPolicy
metadata: { name: reads }
spec:
  targetRef: { name: api, port: 80 }
  podSelector: { matchLabels: { app: web } }
  methods: [GET]
  failureBoundary: BeforeHeaders
  statusPresets: [Gateway]
  acknowledgeDuplicateRisk: true
  retries: { attempts: 2, backoffBaseMs: 5, backoffCapMs: 50, budgetPercent: 50, totalDeadlineMs: 5000 }
";

/// Asks the app at `app` (`IP:8080`, an e2e-app pod) to send `n` GETs to
/// `url` through its `HTTP_PROXY` (the sidecar), `interval_ms` apart, and
/// returns its JSON summary (`ok`, `failed`, `statuses`, `errors`, `bodies`).
pub async fn drive(
    app: SocketAddr,
    url: &str,
    n: u32,
    interval_ms: u32,
) -> anyhow::Result<serde_json::Value> {
    let path = format!(
        "/drive?url={}&n={n}&interval_ms={interval_ms}&timeout_s=300",
        url.replace('%', "%25")
            .replace(':', "%3A")
            .replace('/', "%2F")
            .replace('?', "%3F")
            .replace('&', "%26")
            .replace('=', "%3D")
    );
    let (status, body) = tokio::time::timeout(Duration::from_secs(330), get(app, "app", &path))
        .await
        .map_err(|_| anyhow::anyhow!("GET {app}{path}: no answer in 330 s"))?
        .ok_or_else(|| anyhow::anyhow!("GET {app}{path}: no response"))?;
    anyhow::ensure!(status == 200, "GET {app}{path}: {status} {body}");
    Ok(serde_json::from_str(&body)?)
}

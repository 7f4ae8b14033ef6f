//! `kubectl reprise diagnose POD`: the pod's recently retried requests and
//! their attempts, from its sidecar's `GET /diagnostics`. The admin listener
//! binds loopback inside the pod, so the request goes through the API
//! server's port-forward (which dials the pod's own loopback), never to the
//! pod IP. `--upstream`, `--outcome` and `--limit` pass through as query
//! parameters of the same names. A workload or `-l` reads each of its
//! running pods in turn (`pods.rs`); one that cannot be read is reported on
//! stderr and the others are still shown.
//!
//! The answer is parsed leniently: every field may be missing or null, and
//! fields this plugin does not know are ignored, so a newer or older
//! sidecar's answer still draws. `-o json` and `-o yaml` print a kubectl
//! `List` of one `SidecarDiagnostics` item per pod: the answer as read,
//! beside the pod's name and namespace.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;
use serde_json::Value;

use super::pods::PodsArgs;
use super::table::Table;
use super::{as_list, list_item, Output};
use crate::inject::SIDECAR_NAME;
use crate::Error;

/// The admin port when the sidecar's `--admin` cannot be read (the chart's
/// `sidecar.adminPort` default).
const DEFAULT_ADMIN_PORT: u16 = 15000;
/// How long the port-forward and the answer may take together.
const TIMEOUT: Duration = Duration::from_secs(20);
/// How a sidecar whose diagnostics are off begins its `404`; an older
/// sidecar without the page answers its generic "not found".
const DIAGNOSTICS_OFF: &str = "diagnostics are off";

// The verb's help is the doc comment of `Verb::Diagnose`.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    #[command(flatten)]
    pub(super) pods: PodsArgs,
    /// Only requests to this upstream (e.g. `api.shop`).
    #[arg(long)]
    upstream: Option<String>,
    /// Only requests with this outcome (`recovered`, `exhausted`, `skipped`, ...).
    #[arg(long)]
    outcome: Option<String>,
    /// At most this many requests per pod, newest first.
    #[arg(long)]
    limit: Option<u32>,
    /// The sidecar's admin port (default: read from its `--admin` argument).
    #[arg(long)]
    admin_port: Option<u16>,
}

impl Args {
    /// `/diagnostics` with the filters as query parameters.
    pub(super) fn query_path(&self) -> String {
        let limit = self.limit.map(|l| l.to_string());
        let params: Vec<String> = [
            ("upstream", self.upstream.as_deref()),
            ("outcome", self.outcome.as_deref()),
            ("limit", limit.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some(format!("{k}={}", encode(v?))))
        .collect();
        if params.is_empty() {
            "/diagnostics".into()
        } else {
            format!("/diagnostics?{}", params.join("&"))
        }
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Reads the diagnostics of each of `pods` and renders them; the pods that
/// could not be read come back beside the output. One pod that cannot be
/// read is the verb's error.
pub(super) async fn run(
    client: Client,
    pods: &[Pod],
    args: &Args,
    output: Option<Output>,
) -> Result<(String, Vec<Error>), Error> {
    let mut read = Vec::with_capacity(pods.len());
    let mut failed = Vec::new();
    for pod in pods {
        let id = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        match fetch(&client, pod, args).await {
            Ok(raw) => read.push((id, raw)),
            Err(e) if pods.len() == 1 => return Err(e),
            Err(e) => failed.push(e),
        }
    }
    Ok((render_all(&read, output)?, failed))
}

/// One pod's `/diagnostics`, as read.
async fn fetch(client: &Client, pod: &Pod, args: &Args) -> Result<Value, Error> {
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let id = format!("{namespace}/{name}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let port = match args.admin_port {
        Some(p) => p,
        None => admin_port(pod).ok_or_else(|| Error::Diagnostics {
            pod: id.clone(),
            reason: format!(
                "no {SIDECAR_NAME} container: the pod was not injected (is its namespace labelled reprise.dev/inject=enabled, and was the pod created after?)"
            ),
        })?,
    };
    let path = args.query_path();
    let (status, body) = tokio::time::timeout(TIMEOUT, get(&pods, &name, port, &path))
        .await
        .map_err(|_| Error::Diagnostics {
            pod: id.clone(),
            reason: format!("no answer from the sidecar's admin port {port} in {TIMEOUT:?}"),
        })??;
    if status != 200 {
        return Err(Error::Diagnostics {
            pod: id,
            reason: refusal(status, &body, &path),
        });
    }
    serde_json::from_slice(&body).map_err(|e| Error::Diagnostics {
        pod: id.clone(),
        reason: format!("/diagnostics is not JSON: {e}"),
    })
}

/// Why a sidecar answered `status` instead of its diagnostics, and what to
/// do: a `404` is diagnostics turned off, or a sidecar older than the page.
pub(super) fn refusal(status: u16, body: &[u8], path: &str) -> String {
    let text = String::from_utf8_lossy(body);
    match status {
        404 if text.starts_with(DIAGNOSTICS_OFF) => format!(
            "its sidecar keeps no diagnostics: set the pod's reprise.dev/diagnostics-retained annotation (or the chart's sidecar.diagnosticsRetained) above 0 and restart it ({})",
            text.trim()
        ),
        404 => "its sidecar has no /diagnostics (a release before the plugin's): upgrade the sidecar image".into(),
        _ => format!("GET {path} answered {status}: {}", text.trim()),
    }
}

/// Every pod's diagnostics, `read` as `(namespace/name, answer)`, drawn as
/// `output` asks: a `List` for the data forms, else each pod's table, under
/// its name when there are several.
pub(super) fn render_all(
    read: &[(String, Value)],
    output: Option<Output>,
) -> Result<String, Error> {
    let items = || {
        read.iter()
            .map(|(id, raw)| {
                let fields = if raw.is_array() {
                    serde_json::json!({ "requests": raw })
                } else {
                    raw.clone()
                };
                list_item("reprise.dev/v1alpha1", "SidecarDiagnostics", id, fields)
            })
            .collect()
    };
    if let Some(printed) = as_list(items, output) {
        return printed;
    }
    let mut out = String::new();
    for (id, raw) in read {
        if read.len() > 1 {
            out += &format!("{}== {id} ==\n", if out.is_empty() { "" } else { "\n" });
        }
        out += &render(id, raw, output)?;
    }
    Ok(out)
}

/// The admin port the sidecar listens on: its `--admin 127.0.0.1:PORT`
/// (an init container when native, else a container); `None` when the pod
/// has no sidecar.
pub(super) fn admin_port(pod: &Pod) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    let sidecar: &Container = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == SIDECAR_NAME)?;
    let args = sidecar.args.as_deref().unwrap_or_default();
    let addr = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--admin=")
            .map(str::to_string)
            .or_else(|| (a == "--admin").then(|| args.get(i + 1).cloned())?)
    });
    Some(
        addr.and_then(|a| a.rsplit(':').next()?.parse().ok())
            .unwrap_or(DEFAULT_ADMIN_PORT),
    )
}

/// `GET path` on `port` of the pod's loopback, through a port-forward.
pub(super) async fn get(
    pods: &Api<Pod>,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<(u16, Bytes), Error> {
    let mut forward =
        pods.portforward(pod, &[port])
            .await
            .map_err(|source| Error::PortForward {
                pod: pod.into(),
                source,
            })?;
    let stream = forward
        .take_stream(port)
        .ok_or_else(|| Error::Diagnostics {
            pod: pod.into(),
            reason: format!("the port-forward gave no stream for port {port}"),
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(Error::Http)?;
    let driver = tokio::spawn(connection);
    let request = http::Request::get(path)
        .header(http::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|e| Error::Usage(format!("bad query {path}: {e}")))?;
    let response = sender.send_request(request).await.map_err(Error::Http)?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(Error::Http)?
        .to_bytes();
    driver.abort();
    forward.abort();
    Ok((status, body))
}

/// What `/diagnostics` answers, as far as this plugin draws it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Diagnostics {
    requests: Vec<Retried>,
}

/// One request the sidecar retried (or considered retrying).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Retried {
    time: Option<String>,
    upstream: Option<String>,
    rule: Option<String>,
    method: Option<String>,
    path: Option<String>,
    status: Option<Value>,
    outcome: Option<String>,
    reason: Option<String>,
    trace_id: Option<String>,
    attempts: Vec<Attempt>,
}

/// One attempt of a request.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Attempt {
    endpoint: Option<String>,
    error: Option<String>,
    duration_ms: Option<f64>,
}

/// The diagnostics of pod `id` (`namespace/name`), `raw` as read, as a
/// table (`-o wide` for the wide one).
pub(super) fn render(id: &str, raw: &Value, output: Option<Output>) -> Result<String, Error> {
    // A bare list of requests is taken as the list itself.
    let parsed = if raw.is_array() {
        serde_json::from_value(raw.clone()).map(|requests| Diagnostics { requests })
    } else {
        serde_json::from_value(raw.clone())
    };
    let d = parsed.map_err(|e| Error::Diagnostics {
        pod: id.into(),
        reason: format!("/diagnostics has an unexpected shape: {e}"),
    })?;
    // What a sidecar answered, which may be a fake one: shown escaped.
    Ok(crate::untrusted::escaped(
        &table(id, &d, output == Some(Output::Wide)),
        true,
    ))
}

fn table(id: &str, d: &Diagnostics, wide: bool) -> String {
    if d.requests.is_empty() {
        return format!("No retried requests recorded by {id}'s sidecar.\n");
    }
    let mut headers = vec![
        "TIME", "UPSTREAM", "RULE", "REQUEST", "STATUS", "OUTCOME", "ATTEMPTS",
    ];
    if wide {
        headers.extend(["REASON", "TRACE-ID"]);
    }
    let mut requests = Table::new(headers);
    let mut attempts = Table::new(vec!["", "ENDPOINT", "ERROR", "DURATION"]);
    let dash = |v: &Option<String>| match v.as_deref() {
        None | Some("") => "-".to_string(),
        Some(s) => s.to_string(),
    };
    // Each request's attempts, as ranges of the attempts table's rows.
    let mut spans = Vec::with_capacity(d.requests.len());
    for r in &d.requests {
        let time = dash(&r.time);
        let request = format!(
            "{} {}",
            r.method.as_deref().unwrap_or("?"),
            r.path.as_deref().unwrap_or("?")
        );
        let status = match &r.status {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => "-".into(),
        };
        let mut cells = vec![
            if wide { time } else { time_of_day(&time) },
            dash(&r.upstream),
            dash(&r.rule),
            request,
            status,
            dash(&r.outcome),
            r.attempts.len().to_string(),
        ];
        if wide {
            cells.extend([dash(&r.reason), dash(&r.trace_id)]);
        }
        requests.row(cells);
        let first = spans.last().map_or(0, |(_, end)| *end);
        for (i, a) in r.attempts.iter().enumerate() {
            attempts.row(vec![
                format!("  #{}", i + 1),
                dash(&a.endpoint),
                a.error.clone().unwrap_or_else(|| "ok".into()),
                a.duration_ms.map_or("-".into(), millis),
            ]);
        }
        spans.push((first, first + r.attempts.len()));
    }
    let request_lines = requests.lines();
    // The attempts table's header is left out: each attempt line names its number.
    let attempt_lines: Vec<String> = attempts.lines().into_iter().skip(1).collect();
    let mut out = String::new();
    out.push_str(&request_lines[0]);
    out.push('\n');
    for (line, (from, to)) in request_lines[1..].iter().zip(spans) {
        out.push_str(line);
        out.push('\n');
        for a in &attempt_lines[from..to] {
            out.push_str(a);
            out.push('\n');
        }
    }
    out
}

/// `10:00:00.123` of `2026-12-06T10:00:00.123Z`; anything else as it is.
fn time_of_day(time: &str) -> String {
    match time.split_once('T') {
        Some((_, t)) => t.trim_end_matches('Z').to_string(),
        None => time.to_string(),
    }
}

fn millis(ms: f64) -> String {
    if ms.fract() == 0.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{ms:.1}ms")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The shape the sidecar answers (see the module's doc).
    fn diagnostics() -> Value {
        json!({"requests": [
            {"time": "2026-12-06T10:00:00.123Z", "upstream": "api.shop", "rule": "shop/reads",
             "method": "GET", "path": "/orders", "status": 200, "outcome": "recovered",
             "reason": "", "trace_id": "0af7651916cd43dd8448eb211c80319c",
             "attempts": [
                {"endpoint": "10.0.0.5:8080 (api-0)", "error": "upstream_status_503", "duration_ms": 3},
                {"endpoint": "10.0.0.6:8080 (api-1)", "error": null, "duration_ms": 2}
             ]},
            {"time": "2026-12-06T10:00:01.500Z", "upstream": "api.shop", "rule": "shop/reads",
             "method": "GET", "path": "/orders/7", "status": null, "outcome": "exhausted",
             "reason": "attempts", "trace_id": "",
             "attempts": [
                {"endpoint": "10.0.0.5:8080 (api-0)", "error": "connect_refused", "duration_ms": 0.4},
                {"endpoint": "10.0.0.7:8080 (api-2)", "error": "connect_refused", "duration_ms": 1.25},
                {"endpoint": "10.0.0.6:8080 (api-1)", "error": "read_timeout", "duration_ms": 3000}
             ]}
        ]})
    }

    fn words(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn each_request_is_followed_by_its_attempts() {
        let out = render("shop/web-1", &diagnostics(), None).expect("table");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            words(lines[0]),
            ["TIME", "UPSTREAM", "RULE", "REQUEST", "STATUS", "OUTCOME", "ATTEMPTS"]
        );
        assert_eq!(
            words(lines[1]),
            [
                "10:00:00.123",
                "api.shop",
                "shop/reads",
                "GET",
                "/orders",
                "200",
                "recovered",
                "2"
            ]
        );
        assert_eq!(
            words(lines[2]),
            [
                "#1",
                "10.0.0.5:8080",
                "(api-0)",
                "upstream_status_503",
                "3ms"
            ]
        );
        assert_eq!(
            words(lines[3]),
            ["#2", "10.0.0.6:8080", "(api-1)", "ok", "2ms"]
        );
        assert_eq!(
            words(lines[4]),
            [
                "10:00:01.500",
                "api.shop",
                "shop/reads",
                "GET",
                "/orders/7",
                "-",
                "exhausted",
                "3"
            ]
        );
        assert_eq!(
            words(lines[5]),
            ["#1", "10.0.0.5:8080", "(api-0)", "connect_refused", "0.4ms"]
        );
        assert_eq!(
            words(lines[7]),
            ["#3", "10.0.0.6:8080", "(api-1)", "read_timeout", "3000ms"]
        );
        assert_eq!(lines.len(), 8);
        // The attempt lines line up with each other.
        let column = |l: &str| l.find("10.0.0.");
        assert_eq!(column(lines[2]), column(lines[7]));
    }

    #[test]
    fn wide_adds_the_reason_the_trace_and_the_whole_timestamp() {
        let out = render("shop/web-1", &diagnostics(), Some(Output::Wide)).expect("table");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&words(lines[0])[7..], ["REASON", "TRACE-ID"]);
        assert_eq!(
            words(lines[1])[0],
            "2026-12-06T10:00:00.123Z",
            "the whole timestamp"
        );
        assert_eq!(
            &words(lines[1])[8..],
            ["-", "0af7651916cd43dd8448eb211c80319c"]
        );
        assert_eq!(&words(lines[4])[8..], ["attempts", "-"]);
    }

    #[test]
    fn what_a_fake_sidecar_answers_is_printed_escaped() {
        let mut raw = diagnostics();
        raw["requests"][0]["upstream"] = json!("api\u{1b}[2J");
        raw["requests"][0]["path"] = json!("/\u{1b}]52;c;aGk=\u{7}\nforged");
        for output in [None, Some(Output::Wide)] {
            let out = render("shop/web-1", &raw, output).expect("table");
            assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
            assert!(out.contains("api\\u{1b}[2J"), "{out}");
        }
    }

    #[test]
    fn json_and_yaml_print_a_list_of_the_answers_as_read() {
        let raw = diagnostics();
        let read = [
            ("shop/web-1".to_string(), raw.clone()),
            ("shop/web-2".to_string(), json!([])),
        ];
        for output in [Output::Json, Output::Yaml] {
            let printed = render_all(&read, Some(output)).expect("printed");
            let list: Value = match output {
                Output::Json => serde_json::from_str(&printed).expect("JSON"),
                _ => serde_yaml::from_str(&printed).expect("YAML"),
            };
            assert_eq!(list["kind"], "List", "{printed}");
            assert_eq!(list["items"][0]["kind"], "SidecarDiagnostics");
            assert_eq!(list["items"][0]["metadata"]["namespace"], "shop");
            assert_eq!(list["items"][0]["metadata"]["name"], "web-1");
            assert_eq!(list["items"][0]["requests"], raw["requests"]);
            // A bare list of requests (an older sidecar) is its requests.
            assert_eq!(list["items"][1]["requests"], json!([]));
        }
    }

    #[test]
    fn several_pods_are_drawn_each_under_its_name() {
        let read = [
            ("shop/web-1".to_string(), diagnostics()),
            ("shop/web-2".to_string(), json!({"requests": []})),
        ];
        let out = render_all(&read, None).expect("tables");
        let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("== ")).collect();
        assert_eq!(headers, ["== shop/web-1 ==", "== shop/web-2 =="], "{out}");
        assert!(
            out.contains("No retried requests recorded by shop/web-2's sidecar."),
            "{out}"
        );
        // One pod: its table alone, as before.
        let one = render_all(&read[..1], None).expect("table");
        assert!(!one.contains("=="), "{one}");
        assert_eq!(
            one,
            render("shop/web-1", &diagnostics(), None).expect("table")
        );
    }

    #[test]
    fn a_404_tells_diagnostics_off_from_an_older_sidecar() {
        let off = refusal(
            404,
            b"diagnostics are off: proxy.diagnostics_retained is 0 (...)\n",
            "/diagnostics",
        );
        assert!(off.contains("reprise.dev/diagnostics-retained"), "{off}");
        assert!(!off.contains("upgrade"), "{off}");
        let old = refusal(
            404,
            b"not found; try /live, /ready, /config, /metrics, PUT /log-level\n",
            "/diagnostics",
        );
        assert!(old.contains("upgrade the sidecar image"), "{old}");
        let bad = refusal(400, b"unknown outcome \"x\"\n", "/diagnostics?outcome=x");
        assert_eq!(
            bad,
            "GET /diagnostics?outcome=x answered 400: unknown outcome \"x\""
        );
    }

    #[test]
    fn missing_unknown_and_null_fields_still_draw() {
        let raw = json!({"version": 2, "requests": [
            {"outcome": "recovered", "extra": {"x": 1}, "attempts": [{"endpoint": "a"}, {}]},
            {"method": "GET", "path": "/", "status": "503", "reason": null}
        ]});
        let out = render("shop/web-1", &raw, None).expect("table");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            words(lines[1]),
            ["-", "-", "-", "?", "?", "-", "recovered", "2"]
        );
        assert_eq!(words(lines[2]), ["#1", "a", "ok", "-"]);
        assert_eq!(words(lines[3]), ["#2", "-", "ok", "-"]);
        assert_eq!(
            words(lines[4]),
            ["-", "-", "-", "GET", "/", "503", "-", "0"]
        );
        // A bare list is the list of requests.
        let out = render("shop/web-1", &raw["requests"], None).expect("table");
        assert_eq!(out.lines().count(), 5);
        let out = render("shop/web-1", &json!({}), None).expect("table");
        assert_eq!(
            out,
            "No retried requests recorded by shop/web-1's sidecar.\n"
        );
        let e = render("shop/web-1", &json!({"requests": 3}), None).expect_err("not a list");
        assert!(e.to_string().contains("unexpected shape"), "{e}");
    }

    fn pod(init: Value, containers: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop"},
            "spec": {"initContainers": init, "containers": containers}
        }))
        .expect("pod")
    }

    #[test]
    fn the_admin_port_is_read_from_the_sidecars_arguments() {
        let sidecar = |args: Value| json!({"name": "reprise-sidecar", "args": args});
        let app = json!({"name": "app"});
        let native = pod(
            json!([sidecar(json!([
                "--listen",
                "127.0.0.1:15001",
                "--admin",
                "127.0.0.1:15100"
            ]))]),
            json!([app]),
        );
        assert_eq!(admin_port(&native), Some(15100));
        let regular = pod(
            json!([]),
            json!([app, sidecar(json!(["--admin=127.0.0.1:15200"]))]),
        );
        assert_eq!(admin_port(&regular), Some(15200));
        let bare = pod(json!([]), json!([sidecar(json!([]))]));
        assert_eq!(admin_port(&bare), Some(DEFAULT_ADMIN_PORT));
        let plain = pod(json!([]), json!([app]));
        assert_eq!(admin_port(&plain), None, "not injected");
    }

    #[test]
    fn filters_are_encoded_query_parameters() {
        let args = Args {
            pods: PodsArgs {
                target: Some("web-1".into()),
                selector: None,
            },
            upstream: Some("api shop&x".into()),
            outcome: None,
            limit: None,
            admin_port: None,
        };
        assert_eq!(args.query_path(), "/diagnostics?upstream=api%20shop%26x");
        let none = Args {
            upstream: None,
            ..args
        };
        assert_eq!(none.query_path(), "/diagnostics");
    }
}

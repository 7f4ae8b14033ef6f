//! `kubectl reprise stat [rp/NAME]`: what each RetryPolicy did to its
//! traffic over the last window. It reads only the policies' `status.traffic`
//! (written by the leader from its sidecars' reports), never the sidecars.
//!
//! `-o json` and `-o yaml` print a kubectl `List`: each policy as a
//! `RetryPolicy` with its name, namespace, target and `status.traffic` as
//! the API server returned it (`null` before the first report), so `jq
//! '.items[] | .status.traffic.recovered'` works as it would on `kubectl get
//! rp -o json`.
//!
//! Without a name it also lists the Gateway API routes Reprise applies in
//! the namespace, with their rules' traffic as Reprise's entry of their
//! `status.parents` tells it (the `reprise.dev/Traffic` condition; Gateway
//! API gives a route no traffic field): below the table, and in `-o json`
//! as route items whose `status.parents` holds Reprise's entries only.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::{RetryPolicy, TrafficStatus};
use serde_json::Value;

use super::table::{age, window_seconds, Table};
use super::{as_list, list_item, Output};
use crate::Error;

// The verb's help is the doc comment of `Verb::Stat`.
#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// One policy: `rp/NAME`, `retrypolicy/NAME` or `NAME` (default: every
    /// policy in the namespace, or in every namespace with -A).
    pub(super) target: Option<String>,
}

/// One policy: who it is, what it targets, what its sidecars reported.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PolicyTraffic {
    pub(super) namespace: String,
    pub(super) name: String,
    /// `service:port`, or the Service alone when the policy names no port.
    pub(super) target: String,
    /// `status.traffic` as returned (`Null`: no report yet).
    pub(super) traffic: Value,
}

impl PolicyTraffic {
    fn from_object(p: &DynamicObject) -> Self {
        let target = &p.data["spec"]["targetRef"];
        let service = target["name"].as_str().unwrap_or("?");
        PolicyTraffic {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
            target: match target["port"].as_i64() {
                Some(port) => format!("{service}:{port}"),
                None => service.to_string(),
            },
            traffic: p.data["status"]["traffic"].clone(),
        }
    }
}

/// Fetches the policies `args` names in `namespace` (every namespace when
/// `None`) and renders them as `output` asks.
pub(super) async fn run(
    client: Client,
    namespace: Option<&str>,
    args: &Args,
    output: Option<Output>,
) -> Result<String, Error> {
    let client2 = client.clone();
    let policies = fetch(client, namespace, args.target.as_deref())
        .await
        .map_err(|e| match e {
            // The path of a resource nobody serves: no CRD.
            Error::Kube(kube::Error::Api(s))
                if s.code == 404 && s.message == "404 page not found" =>
            {
                Error::CrdMissing
            }
            e => e,
        })?;
    let rows: Vec<PolicyTraffic> = policies.iter().map(PolicyTraffic::from_object).collect();
    let routes = if args.target.is_none() {
        routes(client2, namespace).await?
    } else {
        Vec::new()
    };
    render_with_routes(&rows, &routes, namespace, output, Timestamp::now())
}

/// One route's entry for one Service, as Reprise wrote it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RouteTraffic {
    /// `HTTPRoute/namespace/name`.
    pub(super) route: String,
    /// The Service it attaches to.
    pub(super) service: String,
    /// Whether Reprise applies it (`Accepted`), and why not.
    pub(super) accepted: String,
    /// The `reprise.dev/Traffic` condition's message (empty: no traffic yet).
    pub(super) traffic: String,
}

/// The routes of `namespace` (every namespace when `None`) that carry
/// Reprise's entry; none when Gateway API is not installed.
async fn routes(client: Client, namespace: Option<&str>) -> Result<Vec<RouteTraffic>, Error> {
    let mut out = Vec::new();
    for (kind, plural) in [("HTTPRoute", "httproutes"), ("GRPCRoute", "grpcroutes")] {
        let resource = ApiResource {
            group: "gateway.networking.k8s.io".into(),
            version: "v1".into(),
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let listed = match api.list(&ListParams::default()).await {
            Ok(l) => l.items,
            // Not installed, or not readable by this user: no routes to show.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => continue,
            Err(e) => return Err(Error::Kube(e)),
        };
        for r in &listed {
            out.extend(route_rows(kind, r));
        }
    }
    Ok(out)
}

/// Reprise's entries of a route's `status.parents`, one row each.
pub(super) fn route_rows(kind: &str, r: &DynamicObject) -> Vec<RouteTraffic> {
    let condition = |entry: &Value, kind: &str| {
        entry["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind)
            .cloned()
            .unwrap_or(Value::Null)
    };
    r.data["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["controllerName"] == "reprise.dev/controller")
        .map(|p| {
            let accepted = condition(p, "Accepted");
            RouteTraffic {
                route: format!(
                    "{kind}/{}/{}",
                    r.namespace().unwrap_or_default(),
                    r.name_any()
                ),
                service: p["parentRef"]["name"].as_str().unwrap_or("?").to_string(),
                accepted: if accepted["status"] == "True" {
                    "applied".into()
                } else {
                    format!(
                        "not applied: {}",
                        accepted["message"].as_str().unwrap_or("?")
                    )
                },
                traffic: condition(p, "reprise.dev/Traffic")["message"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            }
        })
        .collect()
}

/// [`render`], with the routes below the policies.
pub(super) fn render_with_routes(
    rows: &[PolicyTraffic],
    routes: &[RouteTraffic],
    namespace: Option<&str>,
    output: Option<Output>,
    now: Timestamp,
) -> Result<String, Error> {
    if routes.is_empty() {
        return render(rows, namespace, output, now);
    }
    if let Some(printed) = as_list(|| items(rows, routes), output) {
        return printed;
    }
    let mut out = render(rows, namespace, output, now)?;
    out.push_str("\nRoutes (their traffic as Reprise's entry of status.parents tells it):\n");
    for r in routes {
        let traffic = if r.traffic.is_empty() {
            "no traffic reported yet".to_string()
        } else {
            r.traffic.clone()
        };
        out.push_str(&format!(
            "  {} -> Service {}: {}; {}\n",
            r.route,
            r.service,
            r.accepted,
            crate::untrusted::escaped(&traffic, false)
        ));
    }
    Ok(out)
}

/// The `List` items of `rows` and `routes`: each policy a `RetryPolicy`
/// with its target and traffic, each route its kind with Reprise's entries
/// of its `status.parents`.
fn items(rows: &[PolicyTraffic], routes: &[RouteTraffic]) -> Vec<Value> {
    let mut items: Vec<Value> = rows
        .iter()
        .map(|r| {
            list_item(
                "reprise.dev/v1alpha1",
                "RetryPolicy",
                &format!("{}/{}", r.namespace, r.name),
                serde_json::json!({
                    "spec": { "target": r.target },
                    "status": { "traffic": r.traffic },
                }),
            )
        })
        .collect();
    let mut by_route: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
    for r in routes {
        by_route
            .entry(&r.route)
            .or_default()
            .push(serde_json::json!({
                "service": r.service,
                "accepted": r.accepted,
                "traffic": r.traffic,
            }));
    }
    for (route, parents) in by_route {
        // `Kind/namespace/name`.
        let (kind, id) = route.split_once('/').unwrap_or(("HTTPRoute", route));
        items.push(list_item(
            "gateway.networking.k8s.io/v1",
            kind,
            id,
            serde_json::json!({ "status": { "parents": parents } }),
        ));
    }
    items
}

/// The policy `target` names, or every policy in `namespace` (`None`: in
/// every namespace), as they are stored.
async fn fetch(
    client: Client,
    namespace: Option<&str>,
    target: Option<&str>,
) -> Result<Vec<DynamicObject>, Error> {
    let resource = ApiResource::erase::<RetryPolicy>(&());
    let all = ListParams::default();
    Ok(match (namespace, target) {
        (None, Some(_)) => {
            return Err(Error::Usage(
                "a policy cannot be named across all namespaces: drop -A or the name".into(),
            ))
        }
        (Some(ns), Some(target)) => {
            let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &resource);
            vec![api.get(policy_name(target)?).await.map_err(Error::Kube)?]
        }
        (Some(ns), None) => {
            Api::<DynamicObject>::namespaced_with(client, ns, &resource)
                .list(&all)
                .await
                .map_err(Error::Kube)?
                .items
        }
        (None, None) => {
            Api::<DynamicObject>::all_with(client, &resource)
                .list(&all)
                .await
                .map_err(Error::Kube)?
                .items
        }
    })
}

/// The policy's name in `rp/NAME`, `retrypolicy/NAME`,
/// `retrypolicies.reprise.dev/NAME` or `NAME`.
pub(super) fn policy_name(target: &str) -> Result<&str, Error> {
    match target.split_once('/') {
        None => Ok(target),
        Some((
            "rp"
            | "retrypolicy"
            | "retrypolicies"
            | "retrypolicy.reprise.dev"
            | "retrypolicies.reprise.dev",
            name,
        )) if !name.is_empty() => Ok(name),
        Some(_) => Err(Error::Usage(format!(
            "{target}: stat reads RetryPolicies: name one as rp/NAME or NAME"
        ))),
    }
}

/// `rows` as `output` asks, at `now` (for the ages); `namespace` is the one
/// listed (`None`: every namespace, which adds a NAMESPACE column).
pub(super) fn render(
    rows: &[PolicyTraffic],
    namespace: Option<&str>,
    output: Option<Output>,
    now: Timestamp,
) -> Result<String, Error> {
    if let Some(printed) = as_list(|| items(rows, &[]), output) {
        return printed;
    }
    // A status holds names pods reported: shown escaped.
    Ok(crate::untrusted::escaped(
        &table(rows, namespace, output == Some(Output::Wide), now),
        true,
    ))
}

fn table(rows: &[PolicyTraffic], namespace: Option<&str>, wide: bool, now: Timestamp) -> String {
    if rows.is_empty() {
        return match namespace {
            Some(ns) => format!("No RetryPolicies found in {ns} namespace.\n"),
            None => "No RetryPolicies found.\n".into(),
        };
    }
    let mut headers = vec![
        "NAME",
        "TARGET",
        "RPS",
        "FIRST-TRY",
        "EFFECTIVE",
        "RETRY%",
        "RECOVERED",
        "EXHAUSTED",
        "SKIPPED",
        "BUDGET-REFUSED",
        "AGE",
    ];
    if wide {
        headers.extend([
            "WINDOW",
            "REQUESTS",
            "RETRIES",
            "P50",
            "P99",
            "TOP-FAILURE",
            "SIDECARS",
        ]);
    }
    if namespace.is_none() {
        headers.insert(0, "NAMESPACE");
    }
    let columns = headers.len();
    let mut t = Table::new(headers);
    let mut notes = Vec::new();
    for r in rows {
        let mut cells = Vec::with_capacity(columns);
        if namespace.is_none() {
            cells.push(r.namespace.clone());
        }
        cells.extend([r.name.clone(), r.target.clone()]);
        let id = format!("{}/{}", r.namespace, r.name);
        match parse(&r.traffic) {
            Some(Ok(s)) => cells.extend(traffic_cells(&s, wide, now)),
            Some(Err(e)) => notes.push(format!("{id}: status.traffic unreadable: {e}")),
            None => notes.push(format!(
                "{id}: no reports yet (its sidecars have not reported a window)"
            )),
        }
        cells.resize(columns, "-".into());
        t.row(cells);
    }
    let mut out = t.render();
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// `status.traffic`: `None` while there is none.
fn parse(traffic: &Value) -> Option<Result<TrafficStatus, serde_json::Error>> {
    (!traffic.is_null()).then(|| serde_json::from_value(traffic.clone()))
}

fn traffic_cells(s: &TrafficStatus, wide: bool, now: Timestamp) -> Vec<String> {
    let requests = s.requests.max(0) as f64;
    let rps = window_seconds(&s.window).map_or("?".into(), |w| rate(requests / w));
    let retry_share = if s.requests > 0 {
        format!("{:.1}%", s.retries as f64 * 100.0 / requests)
    } else {
        "-".into()
    };
    let observed = s
        .observed_at
        .parse::<Timestamp>()
        .map_or("?".into(), |at| age(now.as_second() - at.as_second()));
    let mut cells = vec![
        rps,
        s.first_try_success.clone(),
        s.effective_success.clone(),
        retry_share,
        s.recovered.to_string(),
        by_reason(&s.exhausted, s.exhausted_total),
        by_reason(&s.skipped, s.skipped.values().sum()),
        s.budget_refusals.to_string(),
        observed,
    ];
    if wide {
        let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        cells.extend([
            s.window.clone(),
            s.requests.to_string(),
            s.retries.to_string(),
            or_dash(&s.latency_p50),
            or_dash(&s.latency_p99),
            or_dash(&s.top_failure),
            s.sidecars.to_string(),
        ]);
    }
    cells
}

/// Requests per second, to three significant digits or so.
fn rate(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}")
    } else if r >= 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.2}")
    }
}

/// `attempts=2,budget=1`, or the total alone when no reason is given.
fn by_reason(counts: &BTreeMap<String, i64>, total: i64) -> String {
    if counts.is_empty() {
        return total.to_string();
    }
    counts
        .iter()
        .map(|(reason, n)| format!("{reason}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A policy's traffic as the leader writes it.
    fn reported() -> Value {
        json!({
            "window": "5m",
            "observedAt": "2026-12-06T10:00:00Z",
            "requests": 3000,
            "firstTrySuccess": "95.00%",
            "effectiveSuccess": "99.90%",
            "retries": 160,
            "recovered": 147,
            "exhausted": {"attempts": 2, "budget": 1},
            "exhaustedTotal": 3,
            "skipped": {"method": 4},
            "budgetRefusals": 1,
            "topFailure": "upstream_status_503",
            "latencyP50": "3ms",
            "latencyP99": "41ms",
            "sidecars": 2
        })
    }

    fn row(name: &str, traffic: Value) -> PolicyTraffic {
        PolicyTraffic {
            namespace: "shop".into(),
            name: name.into(),
            target: "api:80".into(),
            traffic,
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn routes_show_reprises_entries_below_the_policies_and_in_json() {
        let route: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": { "name": "api-retries", "namespace": "catalog" },
            "status": { "parents": [
                { "controllerName": "istio.io/mesh", "parentRef": { "name": "api" }, "conditions": [] },
                { "controllerName": "reprise.dev/controller", "parentRef": { "kind": "Service", "name": "api" },
                  "conditions": [
                    { "type": "Accepted", "status": "True", "message": "applied" },
                    { "type": "reprise.dev/Traffic", "status": "True", "message": "rule 0: 300 requests over 5m\u{1b}[2J" }
                  ] }
            ] }
        }))
        .expect("route");
        let rows = route_rows("HTTPRoute", &route);
        assert_eq!(rows.len(), 1, "only Reprise's entry");
        let out = render_with_routes(
            &[row("reads", reported())],
            &rows,
            Some("catalog"),
            None,
            at("2026-12-06T10:00:45Z"),
        )
        .expect("table");
        assert!(
            out.contains("HTTPRoute/catalog/api-retries -> Service api: applied; rule 0: 300 requests over 5m\\u{1b}[2J"),
            "{out}"
        );
        let json = render_with_routes(
            &[row("reads", reported())],
            &rows,
            Some("catalog"),
            Some(Output::Json),
            at("2026-12-06T10:00:45Z"),
        )
        .expect("json");
        let v: Value = serde_json::from_str(&json).expect("json");
        assert_eq!(v["kind"], "List", "{json}");
        let route = &v["items"][1];
        assert_eq!(route["apiVersion"], "gateway.networking.k8s.io/v1");
        assert_eq!(route["kind"], "HTTPRoute");
        assert_eq!(route["metadata"]["namespace"], "catalog");
        assert_eq!(route["metadata"]["name"], "api-retries");
        assert_eq!(route["status"]["parents"][0]["service"], "api");
        assert_eq!(route["status"]["parents"][0]["accepted"], "applied");
    }

    #[test]
    fn the_table_shows_rates_shares_reasons_and_the_reports_age() {
        let out = render(
            &[row("reads", reported()), row("writes", Value::Null)],
            Some("shop"),
            None,
            at("2026-12-06T10:00:45Z"),
        )
        .expect("table");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAME",
                "TARGET",
                "RPS",
                "FIRST-TRY",
                "EFFECTIVE",
                "RETRY%",
                "RECOVERED",
                "EXHAUSTED",
                "SKIPPED",
                "BUDGET-REFUSED",
                "AGE"
            ]
        );
        // 3000 requests over 5 minutes; 160 retries of 3000; 45 s old.
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "reads",
                "api:80",
                "10.0",
                "95.00%",
                "99.90%",
                "5.3%",
                "147",
                "attempts=2,budget=1",
                "method=4",
                "1",
                "45s"
            ]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["writes", "api:80", "-", "-", "-", "-", "-", "-", "-", "-", "-"]
        );
        assert_eq!(
            lines[3],
            "shop/writes: no reports yet (its sidecars have not reported a window)"
        );
    }

    /// No control character reaches the terminal, whatever the status holds.
    fn assert_printable(out: &str) {
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "a control character printed: {out:?}"
        );
    }

    #[test]
    fn names_a_pod_reported_are_printed_escaped() {
        // Clear the screen, then write the clipboard (OSC 52).
        let hostile = "x\u{1b}[2J\u{1b}]52;c;cm0gLXJmIH4=\u{7}";
        let mut traffic = reported();
        traffic["topFailure"] = json!(hostile);
        traffic["exhausted"] = json!({ hostile: 2 });
        traffic["skipped"] = json!({ "a\nFORGED ROW": 1 });
        for output in [None, Some(Output::Wide)] {
            let out = render(
                &[row("reads", traffic.clone())],
                None,
                output,
                at("2026-12-06T10:03:20Z"),
            )
            .expect("table");
            assert_printable(&out);
            assert_eq!(out.lines().count(), 2, "one row: {out}");
            if output.is_some() {
                assert!(
                    out.contains("x\\u{1b}[2J\\u{1b}]52;c;cm0gLXJmIH4=\\u{7}"),
                    "{out}"
                );
            }
        }
    }

    #[test]
    fn wide_adds_the_window_counts_latencies_and_top_failure() {
        let out = render(
            &[row("reads", reported())],
            None,
            Some(Output::Wide),
            at("2026-12-06T10:03:20Z"),
        )
        .expect("table");
        let lines: Vec<&str> = out.lines().collect();
        let headers: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(headers[0], "NAMESPACE", "-A adds the namespace");
        assert_eq!(
            &headers[12..],
            [
                "WINDOW",
                "REQUESTS",
                "RETRIES",
                "P50",
                "P99",
                "TOP-FAILURE",
                "SIDECARS"
            ]
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells[0], "shop");
        assert_eq!(cells[11], "3m20s");
        assert_eq!(
            &cells[12..],
            [
                "5m",
                "3000",
                "160",
                "3ms",
                "41ms",
                "upstream_status_503",
                "2"
            ]
        );
    }

    #[test]
    fn json_and_yaml_are_a_kubectl_list_of_the_policies() {
        let rows = [row("reads", reported()), row("writes", Value::Null)];
        let now = at("2026-12-06T10:00:45Z");
        let json: Value = serde_json::from_str(
            &render(&rows, Some("shop"), Some(Output::Json), now).expect("json"),
        )
        .expect("valid JSON");
        assert_eq!(json["apiVersion"], "v1");
        assert_eq!(json["kind"], "List");
        let items = json["items"].as_array().expect("items");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["apiVersion"], "reprise.dev/v1alpha1");
        assert_eq!(items[0]["kind"], "RetryPolicy");
        assert_eq!(items[0]["metadata"]["namespace"], "shop");
        assert_eq!(items[0]["metadata"]["name"], "reads");
        assert_eq!(items[0]["status"]["traffic"], reported());
        assert_eq!(items[1]["metadata"]["name"], "writes");
        assert_eq!(items[1]["status"]["traffic"], Value::Null);
        let yaml: Value = serde_yaml::from_str(
            &render(&rows, Some("shop"), Some(Output::Yaml), now).expect("yaml"),
        )
        .expect("valid YAML");
        assert_eq!(yaml, json);
    }

    #[test]
    fn a_status_it_cannot_read_is_shown_not_fatal() {
        let out = render(
            &[row("odd", json!({"window": "5m"}))],
            Some("shop"),
            None,
            at("2026-12-06T10:00:00Z"),
        )
        .expect("table");
        assert!(
            out.contains("shop/odd: status.traffic unreadable: missing field"),
            "{out}"
        );
        let out = render(&[], Some("shop"), None, at("2026-12-06T10:00:00Z")).expect("table");
        assert_eq!(out, "No RetryPolicies found in shop namespace.\n");
    }

    #[test]
    fn unknown_windows_and_quiet_policies_do_not_divide_by_zero() {
        let mut t = reported();
        t["window"] = json!("a while");
        t["requests"] = json!(0);
        let out = render(
            &[row("quiet", t)],
            Some("shop"),
            None,
            at("2026-12-06T10:00:00Z"),
        )
        .expect("table");
        let cells: Vec<&str> = out
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .collect();
        assert_eq!(cells[2], "?", "RPS without a window");
        assert_eq!(cells[5], "-", "RETRY% without requests");
    }

    #[test]
    fn policies_are_named_as_kubectl_names_them() {
        for (given, name) in [
            ("reads", "reads"),
            ("rp/reads", "reads"),
            ("retrypolicy/reads", "reads"),
            ("retrypolicies.reprise.dev/reads", "reads"),
        ] {
            assert_eq!(policy_name(given).expect(given), name);
        }
        for bad in ["pod/web", "rp/"] {
            assert!(policy_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn objects_give_their_target_with_or_without_a_port() {
        let object = |spec: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "reprise.dev/v1alpha1", "kind": "RetryPolicy",
                "metadata": {"name": "reads", "namespace": "shop"},
                "spec": spec,
                "status": {"traffic": reported()}
            }))
            .expect("object")
        };
        let p =
            PolicyTraffic::from_object(&object(json!({"targetRef": {"name": "api", "port": 80}})));
        assert_eq!(p, row("reads", reported()));
        let p = PolicyTraffic::from_object(&object(json!({"targetRef": {"name": "api"}})));
        assert_eq!(p.target, "api");
    }
}

//! Which rule a request gets: a rule's CEL condition (`match.cel`) over the
//! request's method, path, host and headers. A request the rule applies to
//! carries `x-reprise-attempt` (it may be retried); one it does not, under an
//! upstream whose own retries are off, goes out once as it came. An
//! expression that fails to evaluate is no match, counted by rule.

use reprise_testkit::client;

use crate::cli::{config_file, start};
use crate::support::{api, Action, Config, Rule, Upstream};

/// Request headers of one case.
type Headers = &'static [(&'static str, &'static str)];

#[tokio::test]
async fn a_cel_condition_selects_the_rule_and_an_evaluation_error_is_counted() {
    let up = Upstream::always(Action::Reply(200)).await;
    let config = Config::from(api(&[&up])).rule(
        Rule::new("tenant-a")
            .attempts(1)
            .cel("request.headers['x-tenant'] == 'a' && request.path.startsWith('/v1/') && request.host == 'api'"),
    );
    let sidecar = start(&config_file("cel", config), &[]).await;
    let send = |path: &'static str, headers: Headers| {
        client::send(sidecar.listen, "GET", "api", path, b"", headers)
    };
    let cases: [(&str, Headers, bool); 4] = [
        ("/v1/items", &[("X-Tenant", "a")], true),
        ("/v1/items", &[("x-tenant", "b")], false),
        ("/v2/items", &[("x-tenant", "a")], false),
        // No x-tenant header: the lookup fails, which is no match.
        ("/v1/items", &[], false),
    ];
    for (i, (path, headers, ruled)) in cases.iter().enumerate() {
        assert_eq!(send(path, headers).await.status, 200);
        let got = &up.received()[i];
        assert_eq!(
            got.attempt.is_some(),
            *ruled,
            "{path} {headers:?}: the rule applies = {ruled}"
        );
    }
    let m = sidecar.metrics().await.expect("metrics");
    assert_eq!(
        m.get("reprise_rule_cel_errors_total", &[("rule", "tenant-a")]),
        Some(1.0)
    );
}

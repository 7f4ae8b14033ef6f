//! The sidecar running in this process in front of the test kit's upstreams,
//! and the configuration most tests share.
//!
//! [`api`] is upstream `api` over the given upstreams with [`retries`], a
//! retries block whose budget has a generous floor: the default 10% would
//! (correctly) refuse every retry until ten requests are in the window, and
//! most tests here send a handful of requests to observe something else.
//! Tests that observe the budget itself start from `Retries::new()`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reprise_sidecar::{serve_proxy, Proxy};
pub use reprise_testkit::client::Reply;
pub use reprise_testkit::config::{Config, ProxyConfig, Retries, Rule, UpstreamConfig};
pub use reprise_testkit::upstream::{Action, Upstream};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The retries block most tests start from: no keys but a budget floor of
/// 1000 retries a second.
pub fn retries() -> Retries {
    Retries::new().budget_min_retries_per_second(1000)
}

/// A retries block whose budget lets every retry through (100%, no floor
/// needed).
pub fn full_budget() -> Retries {
    Retries::new().budget_percent(100.0)
}

/// Upstream `api` over `endpoints`, with [`retries`].
pub fn api(endpoints: &[&Upstream]) -> UpstreamConfig {
    UpstreamConfig::new("api")
        .endpoints(endpoints.iter().map(|u| u.addr))
        .retries(retries())
}

/// Two upstreams that both do `action`.
pub async fn pair(action: Action) -> (Upstream, Upstream) {
    (
        Upstream::always(action.clone()).await,
        Upstream::always(action).await,
    )
}

/// `status` with a `Retry-After: value` header and `body`.
pub fn retry_after(status: u16, value: &str, body: &'static str) -> Action {
    Action::ReplyWith(status, vec![("retry-after", value.into())], body.into())
}

/// A sidecar serving in this process.
pub struct Sidecar {
    /// Its proxy listener.
    pub addr: SocketAddr,
    /// Its state.
    pub proxy: Arc<Proxy>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<bool>>,
}

impl Sidecar {
    /// Starts a sidecar on an ephemeral loopback port with `config`.
    pub async fn start(config: impl Into<Config>) -> Sidecar {
        Sidecar::serve(Proxy::new(config.into().resolve())).await
    }

    /// Serves `proxy` on an ephemeral loopback port until dropped.
    pub async fn serve(proxy: Arc<Proxy>) -> Sidecar {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind sidecar");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(serve_proxy(listener, Arc::clone(&proxy), async {
            let _ = stopped.await;
        }));
        Sidecar {
            addr,
            proxy,
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// Sends a request to upstream `host` and reads the whole response.
    pub async fn send(&self, method: &str, host: &str, path: &str, body: &[u8]) -> Reply {
        reprise_testkit::client::send(self.addr, method, host, path, body, &[]).await
    }

    /// `GET path` to upstream `api` with extra request headers.
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        reprise_testkit::client::send(self.addr, "GET", "api", path, b"", headers).await
    }

    /// Counter value of `outcome` for upstream `name`.
    pub fn outcomes(&self, upstream: &str, outcome: &str) -> u64 {
        self.stats(upstream).outcome(outcome)
    }

    /// What upstream `name` has done so far.
    pub fn stats(&self, name: &str) -> reprise_sidecar::UpstreamStats {
        self.proxy.stats(name).expect("a configured upstream")
    }

    /// Starts the drain (as SIGTERM does) and returns once the proxy reports
    /// it (within `within`), with the instant it was seen.
    pub async fn begin_drain(&mut self, within: Duration) -> Instant {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let seen = tokio::time::timeout(within, async {
            while !self.proxy.is_draining() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        assert!(seen.is_ok(), "the drain did not start");
        Instant::now()
    }

    /// True once `serve_proxy` has returned.
    pub fn has_finished(&self) -> bool {
        self.served.as_ref().is_none_or(|s| s.is_finished())
    }

    /// What `serve_proxy` returned (true: every connection finished within
    /// the drain timeout), waiting at most `within`.
    pub async fn finished(mut self, within: Duration) -> bool {
        let served = self.served.take().expect("serve_proxy is running");
        tokio::time::timeout(within, served)
            .await
            .expect("serve_proxy returned in time")
            .expect("serve_proxy did not panic")
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

//! The admin endpoint: `/live`, `/ready`, `/config`, `/metrics` and `/log-level`.
//! It listens on localhost by default; nothing on it changes traffic except the
//! log level.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

mod metrics;

pub use self::metrics::metrics_text;
use crate::proxy::Proxy;

/// Changes the log filter at run time; returns an error message for a bad filter.
pub type LogLevelSetter = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// State the admin handlers read.
#[derive(Clone)]
pub struct Admin {
    /// The proxy being administered.
    pub proxy: Arc<Proxy>,
    /// Set when the log level can be changed.
    pub set_log_level: Option<LogLevelSetter>,
    /// Serve only `/live`, `/ready` and `GET /metrics`: the health listener
    /// the kubelet probes and Prometheus scrapes on the pod IP, which must
    /// expose nothing else (no configuration, no log-level changes).
    pub health_only: bool,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// Handles one admin request.
    pub async fn handle(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        if self.health_only && !matches!(req.uri().path(), "/live" | "/ready" | "/metrics") {
            return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
        }
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/live") => (StatusCode::OK, "text/plain", "live\n".to_string()),
            (&Method::GET, "/ready") if self.proxy.is_draining() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "draining\n".to_string(),
            ),
            (&Method::GET, "/ready") if !self.proxy.is_ready() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "waiting for the first snapshot\n".to_string(),
            ),
            (&Method::GET, "/ready") => (StatusCode::OK, "text/plain", "ready\n".to_string()),
            (&Method::GET, "/config") => {
                let routes = self.proxy.routes();
                match serde_json::to_string_pretty(routes.config.as_ref()) {
                    Ok(json) => (StatusCode::OK, "application/json", json + "\n"),
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        format!("{e}\n"),
                    ),
                }
            }
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                metrics_text(&self.proxy),
            ),
            (&Method::PUT | &Method::POST, "/log-level") => self.set_log_level(req).await,
            (_, "/live" | "/ready" | "/config" | "/metrics" | "/log-level") => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "method not allowed\n".to_string(),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found; try /live, /ready, /config, /metrics, PUT /log-level\n".to_string(),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(v) = http::HeaderValue::from_str(content_type) {
            response.headers_mut().insert(http::header::CONTENT_TYPE, v);
        }
        Ok(response)
    }

    async fn set_log_level(&self, req: Request<Incoming>) -> (StatusCode, &'static str, String) {
        let Some(setter) = &self.set_log_level else {
            return (
                StatusCode::NOT_IMPLEMENTED,
                "text/plain",
                "log level is fixed\n".to_string(),
            );
        };
        let body = match Limited::new(req.into_body(), 1024).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return (
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "body too large\n".to_string(),
                )
            }
        };
        let filter = String::from_utf8_lossy(&body).trim().to_string();
        match setter(&filter) {
            Ok(()) => (
                StatusCode::OK,
                "text/plain",
                format!("log level: {filter}\n"),
            ),
            Err(e) => (
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("invalid log filter \"{filter}\": {e}\n"),
            ),
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp
}

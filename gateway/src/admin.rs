//! The loopback admin port: `GET /metrics` (Prometheus text), `GET /healthz` (the
//! process answers) and `GET /readyz` (activities loaded from Redis and stockd and
//! orderd answering their health checks; 503 with the reason otherwise).

use crate::shared::Shared;
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::Encoder;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Admin {
    shared: Arc<Shared>,
}

impl Admin {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn text(status: u16, ctype: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, ctype)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts")
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        match session.req_header().uri.path() {
            "/metrics" => {
                let mut buf = Vec::new();
                let enc = prometheus::TextEncoder::new();
                match enc.encode(&self.shared.metrics.registry.gather(), &mut buf) {
                    Ok(()) => text(200, enc.format_type(), buf),
                    Err(e) => text(500, "text/plain", e.to_string().into_bytes()),
                }
            }
            "/healthz" => text(200, "text/plain", b"ok\n".to_vec()),
            "/readyz" => {
                let loaded = self.shared.catalog.is_loaded();
                let backends = self.shared.backends_ready.load(Ordering::Acquire);
                match (loaded, backends) {
                    (true, true) => text(200, "text/plain", b"ready\n".to_vec()),
                    (false, _) => text(
                        503,
                        "text/plain",
                        b"activities not loaded from Redis\n".to_vec(),
                    ),
                    (true, false) => text(
                        503,
                        "text/plain",
                        b"stockd or orderd not serving\n".to_vec(),
                    ),
                }
            }
            _ => text(404, "text/plain", b"not found\n".to_vec()),
        }
    }
}

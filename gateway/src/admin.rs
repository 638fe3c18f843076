//! The loopback admin port: `GET /metrics` (Prometheus text), `GET /healthz` (the
//! process answers) and `GET /readyz` (activities loaded from Redis and at least one
//! endpoint of stockd and one of orderd marked healthy by its health loop; 503 with the
//! reason otherwise).

use crate::shared::Shared;
use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use prometheus::Encoder;
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
                let u = &self.shared.upstreams;
                match (loaded, u.stockd.any_healthy(), u.orderd.any_healthy()) {
                    (true, true, true) => text(200, "text/plain", b"ready\n".to_vec()),
                    (false, _, _) => text(
                        503,
                        "text/plain",
                        b"activities not loaded from Redis\n".to_vec(),
                    ),
                    (true, false, _) => {
                        text(503, "text/plain", b"no stockd endpoint serving\n".to_vec())
                    }
                    (true, true, false) => {
                        text(503, "text/plain", b"no orderd endpoint serving\n".to_vec())
                    }
                }
            }
            _ => text(404, "text/plain", b"not found\n".to_vec()),
        }
    }
}

//! The loopback admin port: `GET /metrics` (Prometheus text), `GET /healthz` (the
//! process answers) and `GET /readyz` (activities loaded from Redis and at least one
//! endpoint of stockd and one of orderd marked healthy by its health loop; 503 with the
//! reason otherwise); `GET /room/{a}` (the waiting room's status) and `POST /room/{a}`
//! (its live knobs, stored in Redis for the whole fleet: JSON with any of `method`,
//! `max_active`, `admit_per_sec`, `paused`, `random_block`).

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

fn json(status: u16, v: serde_json::Value) -> Response<Vec<u8>> {
    text(
        status,
        "application/json",
        serde_json::to_vec(&v).unwrap_or_default(),
    )
}

impl Admin {
    /// `GET|POST /room/{a}`.
    async fn room(&self, session: &mut ServerSession, a: u64) -> Response<Vec<u8>> {
        let room = &self.shared.room;
        let err = |status, code: &str, message: String| {
            json(
                status,
                serde_json::json!({"error": {"code": code, "message": message}}),
            )
        };
        if session.req_header().method == http::Method::GET {
            return json(200, room.status_json(a));
        }
        if session.req_header().method != http::Method::POST {
            return err(405, "method_not_allowed", "GET or POST".into());
        }
        let mut body = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) if body.len() + chunk.len() <= 4096 => {
                    body.extend_from_slice(&chunk)
                }
                Ok(Some(_)) => return err(413, "payload_too_large", "at most 4096 bytes".into()),
                Ok(None) => break,
                Err(e) => return err(400, "bad_request", e.to_string()),
            }
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return err(400, "bad_request", "the body is not JSON".into());
        };
        match room.set_knobs(a, &v).await {
            Ok(set) => {
                tracing::info!(activity = a, ?set, "room knobs changed");
                let set: serde_json::Map<String, serde_json::Value> =
                    set.into_iter().map(|(k, v)| (k, v.into())).collect();
                json(200, serde_json::json!({"activity_id": a, "set": set}))
            }
            Err(Ok(why)) => err(400, "bad_request", why),
            Err(Err(e)) => err(503, "backend_unavailable", format!("Redis: {e}")),
        }
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
        if let Some(a) = session.req_header().uri.path().strip_prefix("/room/") {
            let Ok(a) = a.parse::<u64>() else {
                return json(
                    404,
                    serde_json::json!({"error": {"code": "not_found", "message": "no such activity"}}),
                );
            };
            return self.room(session, a).await;
        }
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

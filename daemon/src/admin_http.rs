//! The loopback admin port of a daemon: `GET /metrics` (Prometheus text format from
//! the daemon's own registry) and `GET /healthz`. Everything else is 404.

use bytes_body::Full;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

mod bytes_body {
    pub use http_body_util::Full;
}

/// Serves the admin endpoints until `shutdown` fires.
pub async fn serve(listener: TcpListener, registry: Registry, shutdown: Shutdown) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.clone().wait() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let registry = registry.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let registry = registry.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &registry)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, registry: &Registry) -> Response<Full<hyper::body::Bytes>> {
    let (status, ctype, body) = match req.uri().path() {
        "/metrics" => {
            let mut buf = Vec::new();
            let encoder = TextEncoder::new();
            match encoder.encode(&registry.gather(), &mut buf) {
                Ok(()) => (StatusCode::OK, encoder.format_type().to_string(), buf),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain".into(),
                    e.to_string().into_bytes(),
                ),
            }
        }
        "/healthz" => (StatusCode::OK, "text/plain".into(), b"ok\n".to_vec()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain".into(),
            b"not found\n".to_vec(),
        ),
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, ctype)
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

//! One way for every daemon to serve health and reflection next to its own services.
//!
//! ```ignore
//! use seckill_proto::pb::stock_service_server::SERVICE_NAME;
//! let tls = config.grpc.tls.as_ref().map(|t| t.load("grpc.tls")).transpose()?;
//! let (health, router) = seckill_daemon::serve::router(&[SERVICE_NAME], tls)?;
//! let router = router.add_service(StockServiceServer::with_interceptor(svc, token));
//! health.set_serving::<StockServiceServer<Svc>>().await;
//! seckill_daemon::serve::run(router, listener, shutdown).await?;
//! ```
//!
//! Reflection advertises exactly the services the daemon serves (the names it passes)
//! plus health and the two reflection services: `grpcurl list` and ghz on stockd's
//! port must not offer `OrderService`, which only orderd serves (it would answer
//! UNIMPLEMENTED there). Every `seckill.v1` file stays registered, so the messages of
//! the advertised services resolve.
//!
//! With `[grpc.tls]` ([`crate::tls::ServerTls`]) the whole port speaks TLS (health and
//! reflection too: one port, one policy); without it, plaintext HTTP/2.

use tokio::net::TcpListener;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::server::HealthReporter;
use tonic_reflection::server::Builder;

use crate::shutdown::Shutdown;

/// `grpc.health.v1.Health`, served by every daemon.
pub const HEALTH: &str = tonic_health::pb::health_server::SERVICE_NAME;

/// The reflection services (v1 and v1alpha), served by every daemon.
pub const REFLECTION: [&str; 2] = [
    tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
];

/// Every service name reflection advertises for a daemon serving `own`.
pub fn advertised(own: &[&str]) -> Vec<String> {
    own.iter()
        .copied()
        .chain([HEALTH])
        .chain(REFLECTION)
        .map(str::to_owned)
        .collect()
}

/// A reflection builder with every descriptor set registered and only the names of
/// [`advertised`]`(own)` listed.
fn reflection(own: &[&str]) -> Builder<'static> {
    let builder = Builder::configure()
        .register_encoded_file_descriptor_set(seckill_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Both reflection protocols are served, so both are listed and described by
        // either (each builder adds its own set again; the first copy of a file wins).
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET);
    advertised(own)
        .into_iter()
        .fold(builder, |b, name| b.with_service_name(name))
}

/// A tonic router already serving `grpc.health.v1` and reflection v1 + v1alpha, which
/// list `own` (the fully qualified names of the services the daemon adds to the
/// router, e.g. `seckill.v1.StockService`), health and reflection. Add the daemon's
/// services to it. `tls` (from [`crate::tls::ServerTls::load`]): serve over TLS, with
/// client certificates required when it names a client CA; `None`: plaintext.
pub fn router(
    own: &[&str],
    tls: Option<ServerTlsConfig>,
) -> Result<(HealthReporter, Router), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let v1 = reflection(own)
        .build_v1()
        .expect("the embedded descriptor sets are valid");
    let v1alpha = reflection(own)
        .build_v1alpha()
        .expect("the embedded descriptor sets are valid");
    let mut server = Server::builder().tcp_nodelay(true);
    if let Some(tls) = tls {
        server = server.tls_config(tls)?;
    }
    let router = server
        .add_service(health)
        .add_service(v1)
        .add_service(v1alpha);
    Ok((reporter, router))
}

/// Serves `router` on `listener` until `shutdown` fires, then drains in-flight calls.
pub async fn run(
    router: Router,
    listener: TcpListener,
    shutdown: Shutdown,
) -> Result<(), tonic::transport::Error> {
    // tonic ignores `Server::tcp_nodelay` for a listener of our own: set it on each
    // accepted socket here. Without it a response written in more than one segment
    // (a ReserveBatch answer) waited for the caller's delayed ACK: 40 ms a call.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    router
        .serve_with_incoming_shutdown(incoming, shutdown.wait())
        .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_descriptor_set_names_every_service() {
        use prost::Message;
        let fds =
            prost_types::FileDescriptorSet::decode(seckill_proto::FILE_DESCRIPTOR_SET).unwrap();
        let services: Vec<String> = fds
            .file
            .iter()
            .flat_map(|f| f.service.iter().map(|s| s.name().to_string()))
            .collect();
        for want in ["StockService", "AdminService", "OrderService"] {
            assert!(services.iter().any(|s| s == want), "{want} in {services:?}");
        }
    }

    #[test]
    fn a_daemon_advertises_its_own_services_health_and_reflection_only() {
        let names = super::advertised(&["seckill.v1.OrderService"]);
        assert_eq!(
            names,
            [
                "seckill.v1.OrderService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ]
        );
    }
}

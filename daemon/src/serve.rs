//! One way for every daemon to serve health and reflection next to its own services.
//!
//! ```ignore
//! let (health, router) = seckill_daemon::serve::router();
//! let router = router.add_service(StockServiceServer::with_interceptor(svc, token));
//! health.set_serving::<StockServiceServer<Svc>>().await;
//! seckill_daemon::serve::run(router, listener, shutdown).await?;
//! ```

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic_health::server::HealthReporter;

use crate::shutdown::Shutdown;

/// A tonic router already serving `grpc.health.v1` and reflection v1 + v1alpha of
/// every `seckill.v1` service (and of health itself). Add the daemon's services to it.
pub fn router() -> (HealthReporter, Router) {
    let (reporter, health) = tonic_health::server::health_reporter();
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(seckill_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid");
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(seckill_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("the embedded descriptor sets are valid");
    let router = Server::builder()
        .tcp_nodelay(true)
        .add_service(health)
        .add_service(v1)
        .add_service(v1alpha);
    (reporter, router)
}

/// Serves `router` on `listener` until `shutdown` fires, then drains in-flight calls.
pub async fn run(
    router: Router,
    listener: TcpListener,
    shutdown: Shutdown,
) -> Result<(), tonic::transport::Error> {
    router
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown.wait())
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
}

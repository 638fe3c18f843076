//! The same checks for every daemon: gRPC health, and server reflection (v1 and
//! v1alpha) as ghz and grpcurl use it; channels in plaintext or over TLS.

use std::time::Duration;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// A channel to `addr` (`host:port`), retried until it connects or 10 s pass.
pub async fn channel(addr: &str) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2));
    let mut last = None;
    for _ in 0..500 {
        match endpoint.connect().await {
            Ok(ch) => return ch,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot connect to {addr}: {last:?}");
}

/// One attempt at a TLS channel to `addr` (`host:port`) with `tls` (roots, and a
/// client certificate for mutual TLS): the handshake's refusal is the error.
pub async fn try_tls_channel(
    addr: &str,
    tls: ClientTlsConfig,
) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
}

/// A TLS channel to `addr`, retried until it connects or 10 s pass (a daemon with
/// `[grpc.tls]` starting up).
pub async fn tls_channel(addr: &str, tls: ClientTlsConfig) -> Channel {
    let mut last = None;
    for _ in 0..500 {
        match try_tls_channel(addr, tls.clone()).await {
            Ok(ch) => return ch,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot connect over TLS to {addr}: {last:?}");
}

/// `grpc.health.v1.Health/Check` for `service` ("" = the whole server).
pub async fn health(
    addr: &str,
    service: &str,
) -> tonic_health::pb::health_check_response::ServingStatus {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let mut client = HealthClient::new(channel(addr).await);
    let resp = client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .expect("health check");
    resp.into_inner().status()
}

/// `async fn $name(addr) -> Vec<String>`: the services listed by the reflection protocol
/// of module `$pb` (v1 and v1alpha are the same messages in two generated modules).
macro_rules! list_services {
    ($(#[$doc:meta])* $name:ident, $pb:ident) => {
        $(#[$doc])*
        pub async fn $name(addr: &str) -> Vec<String> {
            use tonic_reflection::pb::$pb::{
                server_reflection_client::ServerReflectionClient,
                server_reflection_request::MessageRequest,
                server_reflection_response::MessageResponse, ServerReflectionRequest,
            };
            let mut client = ServerReflectionClient::new(channel(addr).await);
            let req = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut stream = client
                .server_reflection_info(tokio_stream::once(req))
                .await
                .expect(concat!("reflection ", stringify!($pb)))
                .into_inner();
            let mut names = Vec::new();
            while let Some(msg) = stream.next().await {
                if let Some(MessageResponse::ListServicesResponse(list)) = msg
                    .expect(concat!("reflection ", stringify!($pb), " answer"))
                    .message_response
                {
                    names.extend(list.service.into_iter().map(|s| s.name));
                }
            }
            names
        }
    };
}

list_services!(
    /// Services listed by reflection v1.
    reflection_services_v1,
    v1
);
list_services!(
    /// Services listed by reflection v1alpha (the protocol ghz falls back to).
    reflection_services_v1alpha,
    v1alpha
);

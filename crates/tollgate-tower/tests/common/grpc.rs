//! A real tonic server (grpc.health.v1 from tonic-health, no protoc) behind
//! a layer, and a client for it, over loopback.

use std::net::SocketAddr;

use http_body_util::BodyExt;

use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Serves grpc.health.v1 behind `layer` on a free loopback port.
pub async fn serve<L, B>(layer: L) -> SocketAddr
where
    L: tower::Layer<tonic::service::Routes> + Clone + Send + 'static,
    L::Service: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Future: Send + 'static,
    <L::Service as tower::Service<http::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (_reporter, health) = tonic_health::server::health_reporter();
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

/// A health client connected to `addr`.
pub async fn client(addr: SocketAddr) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// A health check of the whole server.
pub fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// The `retry-after` of `status` (it must have one), in seconds.
pub fn retry_after(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Asserts that `res` is a trailers-only gRPC answer with `grpc_status`:
/// HTTP 200, `application/grpc`, and no body (at its end already, empty).
/// Returns its headers.
pub async fn assert_trailers_only<B>(res: http::Response<B>, grpc_status: &str) -> http::HeaderMap
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    assert_eq!(res.status(), http::StatusCode::OK);
    let (head, body) = res.into_parts();
    assert_eq!(head.headers["content-type"], "application/grpc");
    assert_eq!(
        head.headers["grpc-status"], grpc_status,
        "{:?}",
        head.headers
    );
    assert!(http_body::Body::is_end_stream(&body));
    assert!(body.collect().await.unwrap().to_bytes().is_empty());
    head.headers
}

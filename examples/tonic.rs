//! A gRPC service behind `RateLimitLayer`, and its client, in one process.
//!
//! The service is `grpc.health.v1.Health` from `tonic-health` (its generated
//! code ships in the crate: no `protoc` needed). Each client IP may call it 3
//! times at once, refilled at 2 per second; beyond that the call fails with
//! `RESOURCE_EXHAUSTED` (gRPC status 8, never an HTTP 429, which tonic would
//! turn into `UNAVAILABLE`), carrying `retry-after` metadata.
//!
//! ```text
//! cargo run --example tonic                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example tonic  # on Redis
//! ```

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::tower::key::PeerIp;
use tollgate::tower::RateLimitLayer;
use tollgate::{MemoryBackend, Quota, RateBackend, RedisBackend};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let backend: Arc<dyn RateBackend> = match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => Arc::new(RedisBackend::connect(&url).await?),
        _ => Arc::new(MemoryBackend::new()),
    };
    println!("backend: {}", backend.kind());

    // The server: the layer sits in front of every service of the server.
    let quota = Quota::per_second(2).with_burst(3)?;
    let layer = RateLimitLayer::token_bucket(backend, quota).key(PeerIp::new());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    // The client: five calls in a row, then one after the advertised wait.
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let mut wait = Duration::ZERO;
    for i in 1..=5 {
        match client.check(HealthCheckRequest::default()).await {
            Ok(reply) => println!("call {i}: OK, status {:?}", reply.into_inner().status()),
            Err(status) => {
                let retry_after = status
                    .metadata()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(1);
                wait = Duration::from_secs(retry_after);
                println!(
                    "call {i}: {:?} ({}), retry after {retry_after} s",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    tokio::time::sleep(wait).await;
    match client.check(HealthCheckRequest::default()).await {
        Ok(_) => println!("after waiting: OK"),
        Err(status) => println!("after waiting: {:?}", status.code()),
    }

    server.abort();
    Ok(())
}

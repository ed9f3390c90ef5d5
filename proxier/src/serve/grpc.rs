//! The standard gRPC health service (`grpc.health.v1.Health`, Check and Watch), so that the
//! proxier's DaemonSet can use `livenessProbe.grpc` and `readinessProbe.grpc` (KEP-2727).
//!
//! Services:
//! - `""` (what the kubelet asks when the probe names no service) mirrors `/livez`;
//! - [`HEALTHZ_SERVICE`] (`kipvs.io/healthz`) mirrors `/healthz`;
//! - [`READYZ_SERVICE`] (`kipvs.io/readyz`) mirrors `/readyz` (the DaemonSet's readiness probe:
//!   [`ProxyHealth::ready`]).
//!
//! `SERVING` when the HTTP endpoint would answer 200, `NOT_SERVING` otherwise. A publisher task
//! recomputes them whenever the [`ProxyHealth`] changes and at the moment time alone
//! changes an answer ([`ProxyHealth::next_change_at`]), so Check and Watch agree with the HTTP endpoints at all times.

use crate::serve::health::{Probe, ProxyHealth};
use std::future::Future;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::Instrument;

/// The gRPC service name that mirrors `/healthz` (the empty name mirrors `/livez`).
pub const HEALTHZ_SERVICE: &str = "kipvs.io/healthz";

/// The gRPC service name that mirrors `/readyz`.
pub const READYZ_SERVICE: &str = "kipvs.io/readyz";

/// The three services' statuses now: `""`, [`HEALTHZ_SERVICE`], [`READYZ_SERVICE`].
fn statuses(health: &ProxyHealth) -> [(&'static str, ServingStatus); 3] {
    [
        ("", serving(health.check(Probe::Livez).healthy)),
        (
            HEALTHZ_SERVICE,
            serving(health.check(Probe::Healthz).healthy),
        ),
        (READYZ_SERVICE, serving(health.ready().ready)),
    ]
}

fn serving(healthy: bool) -> ServingStatus {
    if healthy {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Keep `reporter`'s services equal to `health`'s `/livez`, `/healthz` and `/readyz`, forever.
async fn publish(health: ProxyHealth, reporter: HealthReporter) {
    let mut changes = health.subscribe();
    let mut last = None;
    loop {
        let now = statuses(&health);
        if last != Some(now) {
            for (service, status) in now {
                reporter.set_service_status(service, status).await;
            }
            last = Some(now);
        }
        let stale_at = health.next_change_at();
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(stale_at.unwrap_or_else(tokio::time::Instant::now)), if stale_at.is_some() => {}
        }
    }
}

/// Serve `grpc.health.v1.Health` for `health` on `listener` until `shutdown` resolves.
///
/// Errors: the transport's, if serving fails.
pub async fn serve(
    listener: TcpListener,
    health: ProxyHealth,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (reporter, service) = tonic_health::server::health_reporter();
    // Set every status before the first request can arrive.
    for (service, status) in statuses(&health) {
        reporter.set_service_status(service, status).await;
    }
    let publisher = tokio::spawn(publish(health, reporter).in_current_span());
    let result = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await;
    publisher.abort();
    result
}

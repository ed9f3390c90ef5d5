//! Writing the status of a node's NodeProxyConfig: what the reducer ([`crate::report`])
//! publishes, with `healthy` from the proxier's `/livez` verdict ([`Liveness`]) unless the
//! reducer reports another (kube-proxy's health after a handback, `false` while kube-proxy is
//! back on a node kipvs took).

use crate::liveness::Liveness;
use kipvs_crds::nodeproxyconfig::{NodeProxyConfig, NodeProxyConfigStatus, PROXIER_FIELD_MANAGER};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How soon a failed status write is retried.
pub const STATUS_RETRY: Duration = Duration::from_secs(2);

/// Writes the status of the NodeProxyConfig named `node` forever: `report`'s (`None`: nothing
/// to report, e.g. no NodeProxyConfig) with `healthy` set to `health`'s verdict unless the
/// report sets it ([`StatusReport::service_proxy`](crate::StatusReport::service_proxy)), by server-side
/// apply on the status subresource under [`PROXIER_FIELD_MANAGER`], whenever it differs from
/// the last one written. A failed write is logged and retried after [`STATUS_RETRY`]. Returns
/// when `report`'s sender is dropped.
pub async fn report_status(
    client: Client,
    node: String,
    mut report: watch::Receiver<Option<NodeProxyConfigStatus>>,
    health: impl Liveness,
) {
    let api = Api::<NodeProxyConfig>::all(client);
    let params = PatchParams::apply(PROXIER_FIELD_MANAGER).force();
    let mut health_changed = health.subscribe();
    let mut written: Option<NodeProxyConfigStatus> = None;
    loop {
        let status = report.borrow_and_update().clone().map(|mut status| {
            status.healthy = Some(status.healthy.unwrap_or_else(|| health.live()));
            status
        });
        if let Some(status) = status.filter(|s| written.as_ref() != Some(s)) {
            let patch = Patch::Apply(status.apply_patch(&node));
            match api.patch_status(&node, &params, &patch).await {
                Ok(_) => written = Some(status),
                Err(e) => {
                    tracing::warn!("cannot write the NodeProxyConfig status, will retry: {e}");
                    tokio::time::sleep(STATUS_RETRY).await;
                    continue;
                }
            }
        }
        tokio::select! {
            changed = report.changed() => if changed.is_err() { return },
            _ = health_changed.changed() => {}
            _ = sleep_until(health.stale_at()) => {}
        }
    }
}

/// Sleep until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

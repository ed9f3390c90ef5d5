//! A stand-in for every node's proxier, for end-to-end tests of the operator against an API
//! server without kubelets (`tests/operator/e2e.sh`). It watches all NodeProxyConfigs and, for
//! each new `spec.revision`, reports what a proxier would, on the status subresource with
//! server-side apply (the contract in `kipvs_crds::nodeproxyconfig`): Pending, then after
//! `--apply-delay` Applied and healthy — or Failed, when the configuration asks for an IPVS
//! scheduler listed in `--unsupported-schedulers` (as a node without that kernel module would).
//!
//! usage: `cargo run -p kipvs-operator --example fake_proxier -- [--apply-delay 1s]
//!         [--unsupported-schedulers sed,nq]`   (KUBECONFIG selects the cluster)

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{NodePhase, NodeProxyConfig, NodeProxyConfigStatus, PROXIER_FIELD_MANAGER};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut delay = Duration::from_secs(1);
    let mut unsupported: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))?;
        match arg.as_str() {
            "--apply-delay" => delay = kipvs_crds::duration::parse(&value)?,
            "--unsupported-schedulers" => {
                unsupported = value.split(',').map(str::to_owned).collect()
            }
            _ => anyhow::bail!("unknown flag {arg}"),
        }
    }
    let client = Client::try_default().await?;
    let api: Api<NodeProxyConfig> = Api::all(client);
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(npc) = events.next().await {
        let npc = npc?;
        let revision = npc.spec.revision.clone();
        let observed = npc
            .status
            .as_ref()
            .and_then(|s| s.observed_revision.as_deref());
        if observed == Some(revision.as_str()) {
            continue;
        }
        let scheduler = npc.spec.config.ipvs.effective_scheduler().to_owned();
        let fails = unsupported.contains(&scheduler);
        let api = api.clone();
        tokio::spawn(async move {
            let node = npc.name_any();
            let report = |phase, healthy, message: String| NodeProxyConfigStatus {
                observed_revision: Some(revision.clone()),
                phase: Some(phase),
                healthy: Some(healthy),
                last_sync_time: Some(Time(Timestamp::now())),
                message: (!message.is_empty()).then_some(message),
                sync_errors: Some(u64::from(phase == NodePhase::Failed)),
            };
            let params = PatchParams::apply(PROXIER_FIELD_MANAGER).force();
            let pending = report(
                NodePhase::Pending,
                true,
                format!("applying revision {revision}"),
            );
            if let Err(e) = api
                .patch_status(&node, &params, &Patch::Apply(pending.apply_patch(&node)))
                .await
            {
                eprintln!("fake-proxier: {node}: {e}");
                return;
            }
            tokio::time::sleep(delay).await;
            // The operator may have moved on (a rollback) meanwhile: report only the current one.
            match api.get(&node).await {
                Ok(current) if current.spec.revision == revision => {}
                _ => return,
            }
            let done = if fails {
                report(
                    NodePhase::Failed,
                    false,
                    format!("IPVS scheduler {scheduler:?} is not available on this node"),
                )
            } else {
                report(NodePhase::Applied, true, String::new())
            };
            match api
                .patch_status(&node, &params, &Patch::Apply(done.apply_patch(&node)))
                .await
            {
                Ok(_) => println!(
                    "fake-proxier: {node}: revision {revision} {:?}",
                    done.phase.unwrap()
                ),
                Err(e) => eprintln!("fake-proxier: {node}: {e}"),
            }
        });
    }
    Ok(())
}

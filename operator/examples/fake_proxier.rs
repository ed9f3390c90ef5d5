//! A stand-in for every node's proxier, for end-to-end tests of the operator against an API
//! server without kubelets (`tests/operator/e2e.sh`). It watches all NodeProxyConfigs and, for
//! each new `spec.revision`, reports what a proxier would, through the proxier's own status
//! reducer and writer ([`kipvs_proxier_contract`]: the contract in `kipvs_crds::nodeproxyconfig`):
//! Pending, then after `--apply-delay` Applied — or, after that delay, Failed when the
//! configuration asks for an IPVS scheduler listed in `--unsupported-schedulers` (as a node
//! without that kernel module would), the revision before it staying in force. Its `/livez`
//! always answers 200 (`healthy: true`).
//!
//! With `--kube-proxy` it also stands in for kube-proxy's DaemonSet, patched to avoid nodes
//! labelled `kipvs.io/service-proxy=kipvs`: kube-proxy runs on every node not so labelled (and
//! on the nodes `--kube-proxy-stays` names, where its pod never leaves), and each proxier
//! follows `spec.config.serviceProxy` as the contract in `kipvs_crds::nodeproxyconfig` says,
//! reporting `status.serviceProxy` through the same reducer ([`SimulatedProxier::service_proxy`];
//! the node's side is `kipvs_operator::sim::NodeStandIn`, which the operator's takeover tests
//! drive too, run by `common/kube_proxy.rs`, which the fleet harness shares):
//! a `kipvs` revision stands by (`Standby`, Pending) while kube-proxy runs, then takes over
//! (`TakingOver`, Applied after `--apply-delay`, then `Programming`); a `kube-proxy` revision
//! stops writing at once and waits for kube-proxy (`HandingBack` where it programmed, else
//! `Standby`), then reports `HandedBack` (Applied, healthy) once kube-proxy has synced
//! (`--kube-proxy-start-up` after its pod started). kube-proxy runs on every node while the
//! real `kube-system/kube-proxy` DaemonSet exists without the affinity (re-applied as
//! `kubeadm upgrade` does): kipvs then stands by (healthy false where it had taken over). The
//! proxiers of the nodes `--proxier-missing` names never run (a crashlooping pod: no status,
//! ever). It prints one line per step, "no serving proxy" when a node has none (kipvs does
//! not program it and kube-proxy has not synced it) and "served again after N s"; it never
//! lets kipvs and kube-proxy program a node at once (it exits with an error if they would).
//!
//! usage: `cargo run -p kipvs-operator --example fake_proxier -- [--apply-delay 1s]
//!         [--unsupported-schedulers sed,nq] [--kube-proxy] [--kube-proxy-stays node-5,...]
//!         [--kube-proxy-start-up 2s] [--proxier-missing node-0,...]`
//!         (KUBECONFIG selects the cluster)

#[path = "common/kube_proxy.rs"]
mod kube_proxy;

use futures::StreamExt;
use kipvs_crds::NodeProxyConfig;
use kipvs_proxier_contract::{AlwaysLive, SimulatedProxier, SyncResult, report_status};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut delay = Duration::from_secs(1);
    let mut unsupported: Vec<String> = Vec::new();
    let mut kube_proxy = false;
    let mut stays: HashSet<String> = HashSet::new();
    let mut missing: HashSet<String> = HashSet::new();
    let mut start_up = Duration::from_secs(2);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--kube-proxy" {
            kube_proxy = true;
            continue;
        }
        let value = args
            .next()
            .ok_or_else(|| anyhow::anyhow!("{arg} needs a value"))?;
        match arg.as_str() {
            "--apply-delay" => delay = kipvs_crds::duration::parse(&value)?,
            "--unsupported-schedulers" => {
                unsupported = value.split(',').map(str::to_owned).collect()
            }
            "--kube-proxy-stays" => stays = value.split(',').map(str::to_owned).collect(),
            "--proxier-missing" => missing = value.split(',').map(str::to_owned).collect(),
            "--kube-proxy-start-up" => start_up = kipvs_crds::duration::parse(&value)?,
            _ => anyhow::bail!("unknown flag {arg}"),
        }
    }
    let client = Client::try_default().await?;
    if kube_proxy {
        let timing = |node: &str| kube_proxy::Timing {
            apply: delay,
            start_up,
            proxier: !missing.contains(node),
        };
        return with_kube_proxy(client, timing, stays).await;
    }
    let api: Api<NodeProxyConfig> = Api::all(client.clone());
    let mut proxiers: HashMap<String, Arc<SimulatedProxier>> = HashMap::new();
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
        let node = npc.name_any();
        let proxier = proxiers
            .entry(node.clone())
            .or_insert_with(|| start(&client, &node))
            .clone();
        let scheduler = npc.spec.config.ipvs.effective_scheduler().to_owned();
        let rejection = unsupported
            .contains(&scheduler)
            .then(|| format!("IPVS scheduler {scheduler:?} is not available on this node"));
        tokio::spawn(answer(
            api.clone(),
            proxier,
            node,
            revision,
            rejection,
            delay,
        ));
    }
    Ok(())
}

/// The stand-in proxier of `node`, with its status writer.
fn start(client: &Client, node: &str) -> Arc<SimulatedProxier> {
    let (proxier, report) = SimulatedProxier::new();
    tokio::spawn(report_status(
        client.clone(),
        node.to_owned(),
        report,
        AlwaysLive::default(),
    ));
    Arc::new(proxier)
}

/// `node`'s proxier takes `revision`: in force at once (Pending), rejected after `delay` when
/// `rejection` says why, else Applied after `delay` by a clean sync. The operator may have
/// moved on (a rollback) meanwhile: only the revision its NodeProxyConfig still carries is
/// answered.
async fn answer(
    api: Api<NodeProxyConfig>,
    proxier: Arc<SimulatedProxier>,
    node: String,
    revision: String,
    rejection: Option<String>,
    delay: Duration,
) {
    if rejection.is_none() {
        proxier.assigned(&revision, None);
    }
    tokio::time::sleep(delay).await;
    match api.get(&node).await {
        Ok(current) if current.spec.revision == revision => {}
        Ok(_) => return,
        Err(e) => {
            eprintln!("fake-proxier: {node}: {e}");
            return;
        }
    }
    let phase = match rejection {
        Some(message) => {
            proxier.assigned(&revision, Some(message));
            "Failed"
        }
        None if proxier.revision().as_deref() == Some(revision.as_str()) => {
            proxier.synced(&SyncResult::Clean, SystemTime::now());
            "Applied"
        }
        None => return,
    };
    println!("fake-proxier: {node}: revision {revision} {phase}");
}

/// `--kube-proxy`: every node's proxier and kube-proxy follow its NodeProxyConfig and label
/// ([`kube_proxy::follow`]), each step printed.
async fn with_kube_proxy(
    client: Client,
    timing: impl Fn(&str) -> kube_proxy::Timing,
    stays: HashSet<String>,
) -> anyhow::Result<()> {
    let starter = client.clone();
    kube_proxy::follow(client, move |node, inputs| {
        let proxier = start(&starter, node);
        let stays = stays.contains(node);
        let timing = timing(node);
        let node = node.to_owned();
        Some(kube_proxy::node_task(
            node.clone(),
            proxier,
            inputs,
            timing,
            move || stays,
            move |step| println!("fake-proxier: {node}: {step}"),
        ))
    })
    .await
}

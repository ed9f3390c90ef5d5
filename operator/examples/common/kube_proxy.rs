//! kube-proxy's DaemonSet and the proxiers' takeover, simulated against a real kube-apiserver
//! for the harnesses that run the operator without real nodes (`fake_proxier --kube-proxy`, the
//! fleet harness's `--takeover`): every node is a [`NodeStandIn`] (kube-proxy avoids nodes
//! labelled `kipvs.io/service-proxy=kipvs`; kipvs follows `spec.config.serviceProxy`) that
//! reports through the proxier's own status reducer ([`SimulatedProxier`]).

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::{NodeProxyConfig, SERVICE_PROXY_LABEL, ServiceProxy, ServiceProxyPhase};
use kipvs_node_status::{SimulatedProxier, SyncResult};
use kipvs_operator::sim::NodeStandIn;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// What a node's stand-in follows: its NodeProxyConfig's revision and `serviceProxy`, and its
/// service proxy label.
#[derive(Clone, Debug, Default)]
pub(crate) struct Inputs {
    /// `spec.revision` and `spec.config.serviceProxy` (None: no NodeProxyConfig yet).
    assigned: Option<(String, ServiceProxy)>,
    /// The Node's [`SERVICE_PROXY_LABEL`].
    label: Option<String>,
}

/// One step of a node's stand-in, for the harness to print or count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// kube-proxy's pod starts (true) or leaves (false).
    KubeProxy(bool),
    /// kipvs starts programming the node (the revision named).
    TakingOver(String),
    /// kipvs stops programming a node it took over.
    HandingBack(String),
    /// The proxier reports a new `status.serviceProxy` for the revision.
    Phase(ServiceProxyPhase, String),
    /// The proxier reports the revision Applied.
    Applied(String),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::KubeProxy(true) => write!(f, "kube-proxy starts"),
            Step::KubeProxy(false) => write!(f, "kube-proxy leaves"),
            Step::TakingOver(r) => write!(f, "taking over (revision {r})"),
            Step::HandingBack(r) => write!(f, "handing back (revision {r})"),
            Step::Phase(p, r) => write!(f, "{p:?} (revision {r})"),
            Step::Applied(r) => write!(f, "revision {r} Applied"),
        }
    }
}

/// Watches NodeProxyConfigs and Nodes and hands each node's inputs to the task `start` makes
/// for it (None: the node is not simulated) on its first event. Returns when a task fails.
///
/// # Errors
/// A watch error, or the first task that fails (two programmers on a node).
pub(crate) async fn follow<F>(
    client: Client,
    mut start: impl FnMut(&str, watch::Receiver<Inputs>) -> Option<F>,
) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let npcs = watcher(
        Api::<NodeProxyConfig>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .map(|npc| {
        npc.map(|npc| {
            let assigned = (npc.spec.revision.clone(), npc.spec.config.service_proxy);
            (npc.name_any(), Some(assigned), None)
        })
    });
    let nodes = watcher(Api::<Node>::all(client), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .map(|node| {
            node.map(|node| {
                let label = node.labels().get(SERVICE_PROXY_LABEL).cloned();
                (node.name_any(), None, Some(label))
            })
        });
    let mut events = stream::select(npcs.boxed(), nodes.boxed());
    let mut inputs: HashMap<String, Option<watch::Sender<Inputs>>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return Ok(()) };
                let (node, assigned, label) = event?;
                let sender = inputs.entry(node.clone()).or_insert_with(|| {
                    let (sender, receiver) = watch::channel(Inputs::default());
                    let task = start(&node, receiver)?;
                    tasks.spawn(task);
                    Some(sender)
                });
                let Some(sender) = sender else { continue };
                sender.send_modify(|i| {
                    if assigned.is_some() {
                        i.assigned = assigned;
                    }
                    if let Some(label) = label {
                        i.label = label;
                    }
                });
            }
            Some(done) = tasks.join_next() => done??,
        }
    }
}

/// One node's proxier and kube-proxy ([`NodeStandIn`]) following `inputs`, reporting through
/// the proxier's reducer (`proxier`): a revision is put in force when assigned, and a `kipvs`
/// one is Applied `delay` (a clean sync) after kipvs starts programming it; kube-proxy's pod
/// never leaves while `stays()`. Each step goes to `step`.
///
/// # Errors
/// kipvs and kube-proxy would program the node at once.
pub(crate) async fn node_task<P: Deref<Target = SimulatedProxier>>(
    node: String,
    proxier: P,
    mut inputs: watch::Receiver<Inputs>,
    delay: Duration,
    stays: impl Fn() -> bool,
    step: impl Fn(Step),
) -> anyhow::Result<()> {
    let mut stand_in = NodeStandIn::default();
    let mut assigned: Option<String> = None;
    let mut synced: Option<String> = None;
    let mut applied = false;
    loop {
        let now = inputs.borrow_and_update().clone();
        match stand_in.label(now.label.as_deref(), stays()) {
            Ok(Some(started)) => step(Step::KubeProxy(started)),
            Ok(None) => {}
            Err(e) => anyhow::bail!("{node}: {e}"),
        }
        if let Some((revision, proxy)) = now.assigned {
            if assigned.as_ref() != Some(&revision) {
                proxier.assigned(&revision, None);
                assigned = Some(revision.clone());
                synced = None;
                applied = false;
            }
            let standing = stand_in.follow(proxy);
            if standing.took_over {
                step(Step::TakingOver(revision.clone()));
            }
            if standing.handing_back {
                step(Step::HandingBack(revision.clone()));
            }
            let message = standing.message.map(str::to_owned);
            if proxier.service_proxy(standing.phase, message, standing.healthy) {
                step(Step::Phase(standing.phase, revision.clone()));
            }
            if stand_in.kipvs_programs() && synced.as_ref() != Some(&revision) {
                tokio::time::sleep(delay).await;
                proxier.synced(&SyncResult::Clean, SystemTime::now());
                synced = Some(revision.clone());
                let programming = ServiceProxyPhase::Programming;
                if proxier.service_proxy(programming, None, None) {
                    step(Step::Phase(programming, revision.clone()));
                }
            }
            if !applied && proxier.applied(&revision) {
                applied = true;
                step(Step::Applied(revision));
            }
        }
        if inputs.changed().await.is_err() {
            return Ok(());
        }
    }
}

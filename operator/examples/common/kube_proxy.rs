//! kube-proxy's DaemonSet and the proxiers' takeover, simulated against a real kube-apiserver
//! for the harnesses that run the operator without real nodes (`fake_proxier --kube-proxy`, the
//! fleet harness's `--takeover`): every node is a [`NodeStandIn`] (kube-proxy avoids nodes
//! labelled `kipvs.io/service-proxy=kipvs` while the real `kube-system/kube-proxy` DaemonSet, if
//! there is one, has that affinity, and runs everywhere once it is re-applied without it;
//! kube-proxy serves a node only [`Timing::start_up`] after its pod started; kipvs follows
//! `spec.config.serviceProxy`) that reports through the proxier's own status reducer
//! ([`SimulatedProxier`]), unless its proxier is missing (never runs, never reports). Each
//! node's task says when the node has no serving proxy and when it is served again ("never
//! none").

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::{NodeProxyConfig, SERVICE_PROXY_LABEL, ServiceProxy, ServiceProxyPhase};
use kipvs_operator::rollout::KubeProxyDaemonSet;
use kipvs_operator::sim::NodeStandIn;
use kipvs_proxier_contract::{SimulatedProxier, SyncResult};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// What a node's stand-in follows: its NodeProxyConfig's revision and `serviceProxy`, and its
/// service proxy label.
#[derive(Clone, Debug, Default)]
pub(crate) struct Inputs {
    /// `spec.revision` and `spec.config.serviceProxy` (None: no NodeProxyConfig yet).
    assigned: Option<(String, ServiceProxy)>,
    /// The Node's [`SERVICE_PROXY_LABEL`].
    label: Option<String>,
    /// The `kube-system/kube-proxy` DaemonSet exists without the affinity: kube-proxy runs on
    /// every node whatever its label.
    unpatched: bool,
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
    /// Nothing serves the node any more: kipvs does not program it (or its proxier is
    /// missing) and kube-proxy has not synced it.
    Unserved,
    /// The node is served again, after this long without a proxy.
    Served(Duration),
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
            Step::Unserved => write!(f, "no serving proxy"),
            Step::Served(d) => write!(f, "served again after {:.1} s", d.as_secs_f64()),
        }
    }
}

/// What [`follow`] watches, one event at a time.
enum Event {
    /// A NodeProxyConfig: its node, `spec.revision` and `spec.config.serviceProxy`.
    Assigned(String, (String, ServiceProxy)),
    /// A Node and its [`SERVICE_PROXY_LABEL`].
    Label(String, Option<String>),
    /// kube-proxy's DaemonSet: whether it lacks the affinity.
    Unpatched(bool),
}

/// Watches NodeProxyConfigs, Nodes and the `kube-system/kube-proxy` DaemonSet and hands each
/// node's inputs to the task `start` makes for it (None: the node is not simulated) on its
/// first event. Returns when a task fails.
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
            Event::Assigned(npc.name_any(), assigned)
        })
    });
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .map(|node| {
            node.map(|node| {
                let label = node.labels().get(SERVICE_PROXY_LABEL).cloned();
                Event::Label(node.name_any(), label)
            })
        });
    let daemonsets = watcher(
        Api::<DaemonSet>::namespaced(client, "kube-system"),
        watcher::Config::default().fields("metadata.name=kube-proxy"),
    )
    .default_backoff()
    .applied_objects()
    .map(|ds| {
        ds.map(|ds| Event::Unpatched(KubeProxyDaemonSet::of(&ds) == KubeProxyDaemonSet::Unpatched))
    });
    let mut events = stream::select(
        stream::select(npcs.boxed(), nodes.boxed()),
        daemonsets.boxed(),
    );
    let mut inputs: HashMap<String, Option<watch::Sender<Inputs>>> = HashMap::new();
    let mut unpatched = false;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return Ok(()) };
                let node = match event? {
                    Event::Unpatched(now) => {
                        unpatched = now;
                        for sender in inputs.values().flatten() {
                            sender.send_modify(|i| i.unpatched = now);
                        }
                        continue;
                    }
                    Event::Assigned(node, assigned) => (node, Some(assigned), None),
                    Event::Label(node, label) => (node, None, Some(label)),
                };
                let (node, assigned, label) = node;
                let sender = inputs.entry(node.clone()).or_insert_with(|| {
                    let (sender, receiver) = watch::channel(Inputs {
                        unpatched,
                        ..Inputs::default()
                    });
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

/// How a node's stand-in behaves over time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// From kipvs taking a revision over to its first clean sync (Applied).
    pub(crate) apply: Duration,
    /// From kube-proxy's pod starting to its first sync: it serves the node only then.
    pub(crate) start_up: Duration,
    /// The proxier runs (false: its pod crashloops, is Pending or cannot pull its image: it
    /// never follows its NodeProxyConfig and never reports).
    pub(crate) proxier: bool,
}

/// One node's proxier and kube-proxy ([`NodeStandIn`]) following `inputs`, reporting through
/// the proxier's reducer (`proxier`): a revision is put in force when assigned, and a `kipvs`
/// one is Applied `timing.apply` (a clean sync) after kipvs starts programming it; kube-proxy's
/// pod never leaves while `stays()` or while its DaemonSet lacks the affinity, and serves
/// `timing.start_up` after it started. Each step goes to `step`, [`Step::Unserved`] and
/// [`Step::Served`] included.
///
/// # Errors
/// kipvs and kube-proxy would program the node at once.
pub(crate) async fn node_task<P: Deref<Target = SimulatedProxier>>(
    node: String,
    proxier: P,
    mut inputs: watch::Receiver<Inputs>,
    timing: Timing,
    stays: impl Fn() -> bool,
    step: impl Fn(Step),
) -> anyhow::Result<()> {
    let mut stand_in = NodeStandIn::default();
    let mut assigned: Option<String> = None;
    let mut synced: Option<String> = None;
    let mut applied = false;
    // When kube-proxy's pod last started (it syncs `timing.start_up` later).
    let mut kube_proxy_started: Option<Instant> = None;
    // Since when nothing serves the node.
    let mut unserved: Option<Instant> = None;
    let started = |stand_in: &NodeStandIn, kube_proxy_started: &mut Option<Instant>| {
        if stand_in.kube_proxy() {
            *kube_proxy_started = Some(Instant::now());
        }
        step(Step::KubeProxy(stand_in.kube_proxy()));
    };
    loop {
        let now = inputs.borrow_and_update().clone();
        if now.unpatched && stand_in.kube_proxy_returns() {
            started(&stand_in, &mut kube_proxy_started);
        }
        match stand_in.label(now.label.as_deref(), stays() || now.unpatched) {
            Ok(Some(_)) => started(&stand_in, &mut kube_proxy_started),
            Ok(None) => {}
            Err(e) => anyhow::bail!("{node}: {e}"),
        }
        if kube_proxy_started.is_some_and(|at| at.elapsed() >= timing.start_up) {
            stand_in.kube_proxy_synced();
            kube_proxy_started = None;
        }
        let seen = now.assigned.is_some();
        if let Some((revision, proxy)) = now.assigned.filter(|_| timing.proxier) {
            if assigned.as_ref() != Some(&revision) {
                proxier.assigned(&revision, None);
                assigned = Some(revision.clone());
                synced = None;
                applied = false;
            }
            let standing = stand_in.follow(proxy);
            if standing.took_over {
                // A takeover (again, after kube-proxy came back and left) syncs before
                // kipvs reports Programming.
                synced = None;
                step(Step::TakingOver(revision.clone()));
            }
            if standing.handing_back {
                step(Step::HandingBack(revision.clone()));
            }
            let message = standing.message.map(str::to_owned);
            if proxier.service_proxy(standing.phase, message, standing.healthy) {
                step(Step::Phase(standing.phase, revision.clone()));
            }
            note_serving(&stand_in, timing.proxier, &mut unserved, &step);
            if stand_in.kipvs_programs() && synced.as_ref() != Some(&revision) {
                tokio::time::sleep(timing.apply).await;
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
        // The stand-in's state is the harness's guess until the node's NodeProxyConfig is seen.
        if seen {
            note_serving(&stand_in, timing.proxier, &mut unserved, &step);
        }
        // Woken by a change of the inputs, or when kube-proxy's start-up ends.
        let synced_at = kube_proxy_started.map(|at| at + timing.start_up);
        tokio::select! {
            changed = inputs.changed() => if changed.is_err() { return Ok(()) },
            () = sleep_until(synced_at) => {}
        }
    }
}

/// Says when `stand_in` (its proxier `alive` or not) stops being served ([`Step::Unserved`],
/// from then in `unserved`) and when it is served again ([`Step::Served`]).
fn note_serving(
    stand_in: &NodeStandIn,
    alive: bool,
    unserved: &mut Option<Instant>,
    step: &impl Fn(Step),
) {
    match (stand_in.serves(alive), *unserved) {
        (false, None) => {
            *unserved = Some(Instant::now());
            step(Step::Unserved);
        }
        (true, Some(since)) => {
            *unserved = None;
            step(Step::Served(since.elapsed()));
        }
        _ => {}
    }
}

/// Sleeps until `at` (for ever without one).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

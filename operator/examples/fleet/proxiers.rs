//! The simulated proxiers: each decides what to report with the proxier's status reducer
//! ([`SimulatedProxier`]), writes it with the proxier's status writer
//! ([`kipvs_proxier_contract::report_status`]) with `healthy` from the proxier's `/livez` rule
//! ([`SimulatedLiveness`]), answers new
//! revisions after a delay, and syncs every `syncPeriod`; and what the harness sees of the
//! NodeProxyConfigs meanwhile ([`Seen`]).

use crate::args::Args;
use crate::nodes::{name, share, silent, told_to_fail};
use futures::StreamExt;
use kipvs_crds::NodeProxyConfig;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier_contract::{
    Retry, SimulatedLiveness, SimulatedProxier, SyncResult, report_status,
};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The health timeout of a simulated proxier (a real one's is 2 × syncPeriod).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// The health timeout of a proxier whose sync hangs in a `/livez` blip.
const BLIP_TIMEOUT: Duration = Duration::from_millis(500);

/// The simulated proxiers, by node name.
pub(crate) type Proxiers = Arc<HashMap<String, Arc<Proxier>>>;

/// One simulated proxier: what it reports is decided by the proxier's status reducer and
/// written by the proxier's status writer.
pub(crate) struct Proxier {
    status: SimulatedProxier,
    health: SimulatedLiveness,
    /// Its sync hangs (a `/livez` blip): syncs do nothing until it recovers.
    hung: AtomicBool,
}

impl Proxier {
    /// A clean sync ended now (`Engine::sync`): health updated, and the status published if
    /// the reducer says so. Returns whether it was.
    fn synced(&self) -> bool {
        if self.hung.load(Ordering::Relaxed) {
            return false;
        }
        self.health.synced();
        self.status
            .synced(&SyncResult::Clean, std::time::SystemTime::now())
    }

    /// Its sync hangs: a change is queued and not synced, and the health timeout is cut to
    /// [`BLIP_TIMEOUT`] so that `/livez` turns unhealthy soon (a real proxier's is
    /// 2 × syncPeriod); its status writer then reports `healthy: false`.
    pub(crate) fn hang(&self) {
        self.hung.store(true, Ordering::Relaxed);
        self.health.set_timeout(BLIP_TIMEOUT);
        self.health.queued();
    }

    /// The hung sync ends: the health timeout back to [`HEALTH_TIMEOUT`], and a clean sync
    /// (healthy again).
    pub(crate) fn recover(&self) {
        self.health.set_timeout(HEALTH_TIMEOUT);
        self.hung.store(false, Ordering::Relaxed);
        self.synced();
    }
}

/// A proxier's status reducer, as the takeover's node task drives it
/// (`crate::kube_proxy::node_task`).
pub(crate) struct StatusOf(pub(crate) Arc<Proxier>);

impl std::ops::Deref for StatusOf {
    type Target = SimulatedProxier;
    fn deref(&self) -> &SimulatedProxier {
        &self.0.status
    }
}

/// What the harness saw of NodeProxyConfigs.
#[derive(Default)]
pub(crate) struct Seen {
    /// Per (node, revision): NodeProxyConfig spec writes (generation changes) seen.
    pub(crate) writes: HashMap<(String, String), u32>,
    /// Last generation seen per node.
    generation: HashMap<String, i64>,
    /// Last resourceVersion seen per node (a relist after an outage repeats objects).
    resource_version: HashMap<String, String>,
    /// Status-only changes seen (the proxiers' status writes).
    pub(crate) status_writes: usize,
    /// When a revision first reached the canary.
    pub(crate) canary: HashMap<String, Instant>,
    /// When a revision was last written to a node.
    pub(crate) last_write: HashMap<String, Instant>,
    /// Per revision: nodes that reported it Applied.
    pub(crate) applied: HashMap<String, usize>,
}

impl Seen {
    /// Records a NodeProxyConfig event of `node`; returns whether it is a spec write (not a
    /// status write, not an object seen already in a relist).
    fn record(&mut self, node: &str, revision: &str, generation: i64, version: String) -> bool {
        if self.resource_version.get(node) == Some(&version) {
            return false; // seen already (a relist)
        }
        self.resource_version.insert(node.to_owned(), version);
        if self.generation.get(node) == Some(&generation) {
            self.status_writes += 1;
            return false; // a status write
        }
        self.generation.insert(node.to_owned(), generation);
        *self
            .writes
            .entry((node.to_owned(), revision.to_owned()))
            .or_default() += 1;
        self.last_write.insert(revision.to_owned(), Instant::now());
        if node == name(0) {
            self.canary
                .entry(revision.to_owned())
                .or_insert_with(Instant::now);
        }
        true
    }
}

/// Starts `n` proxiers, each with its own status writer (the proxier's own).
pub(crate) fn start(client: &Client, n: usize) -> Proxiers {
    let mut proxiers = HashMap::new();
    for i in 0..n {
        let node = name(i);
        let (status, receiver) = SimulatedProxier::new();
        let health = SimulatedLiveness::new(HEALTH_TIMEOUT);
        health.synced();
        tokio::spawn(report_status(
            client.clone(),
            node.clone(),
            receiver,
            health.clone(),
        ));
        let proxier = Proxier {
            status,
            health,
            hung: AtomicBool::new(false),
        };
        proxiers.insert(node, Arc::new(proxier));
    }
    Arc::new(proxiers)
}

/// The proxiers' side of the contract: watches the NodeProxyConfigs, records what it sees in
/// `seen`, and has each node's proxier answer a new revision after a delay from its name hash
/// (0.1-1 s): the silent ones never answer the second revision, the failing ones reject every
/// revision after the first, the others put it in force and sync.
pub(crate) fn answer_assignments(
    npcs: Api<NodeProxyConfig>,
    proxiers: Proxiers,
    seen: Arc<Mutex<Seen>>,
    args: &Args,
) {
    let args = args.clone();
    // Retried as the proxier's own NodeProxyConfig watch is (`Retry`: back within
    // a few seconds of the apiserver), not with kube-runtime's default backoff, which
    // waits up to 30 s more after an outage.
    let mut events = watcher(npcs, watcher::Config::default()).boxed();
    let mut retry = Retry::new("fleet NodeProxyConfig watch");
    let mut revision_index: HashMap<String, usize> = HashMap::new();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let npc = match event {
                Ok(watcher::Event::Apply(npc) | watcher::Event::InitApply(npc)) => {
                    retry.succeeded();
                    npc
                }
                Ok(_) => {
                    retry.succeeded();
                    continue;
                }
                Err(e) => {
                    retry.failed(&e, "the assignments seen").await;
                    continue;
                }
            };
            let node = npc.name_any();
            let revision = npc.spec.revision.clone();
            let next = revision_index.len();
            let index = *revision_index.entry(revision.clone()).or_insert(next);
            let version = npc.resource_version().unwrap_or_default();
            let generation = npc.metadata.generation.unwrap_or_default();
            if !seen
                .lock()
                .expect("seen")
                .record(&node, &revision, generation, version)
            {
                continue;
            }
            if args.takeover {
                continue; // the takeover's node tasks answer (takeover.rs)
            }
            let Some(proxier) = proxiers.get(&node).cloned() else {
                continue;
            };
            if index == 1 && silent(&args, &node) {
                continue;
            }
            let failed = index >= 1 && told_to_fail(&args, &node);
            let delay = Duration::from_millis(100 + (share(&node) * 900.0) as u64);
            tokio::spawn(answer(proxier, revision, failed, delay, seen.clone()));
        }
    });
}

/// One proxier answers `revision` after `delay`, as the engine takes an assignment
/// (`Engine::apply_assigned`), then syncs 50 ms later; counts it in `seen` if it reports the
/// revision Applied.
async fn answer(
    proxier: Arc<Proxier>,
    revision: String,
    failed: bool,
    delay: Duration,
    seen: Arc<Mutex<Seen>>,
) {
    tokio::time::sleep(delay).await;
    let rejection = failed.then(|| "simulated failure".to_owned());
    proxier.status.assigned(&revision, rejection);
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxier.synced();
    if proxier.status.applied(&revision) {
        *seen
            .lock()
            .expect("seen")
            .applied
            .entry(revision)
            .or_default() += 1;
    }
}

/// Syncs and the status writes they published, counted by [`sync_periodically`].
#[derive(Clone, Default)]
pub(crate) struct Syncs {
    /// Syncs done.
    pub(crate) done: Arc<AtomicUsize>,
    /// Syncs whose status the reducer published.
    pub(crate) published: Arc<AtomicUsize>,
}

/// Each proxier syncs every syncPeriod, spread evenly (what N real proxiers do); the reducer
/// decides whether a sync is published.
pub(crate) fn sync_periodically(proxiers: Proxiers, n: usize) -> Syncs {
    let sync_period = ProxierConfiguration::default().ipvs.sync_period;
    let syncs = Syncs::default();
    let counted = syncs.clone();
    tokio::spawn(async move {
        let names: Vec<String> = (0..n).map(name).collect();
        let gap = sync_period / n.max(1) as u32;
        loop {
            for node in &names {
                tokio::time::sleep(gap).await;
                counted.done.fetch_add(1, Ordering::Relaxed);
                if proxiers[node].synced() {
                    counted.published.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    syncs
}

//! The proxier's main loop: sources write objects into a shared [`Store`]; the [`Engine`]
//! re-plans what changed and syncs the dataplane, at most once per `ipvs.minSyncPeriod` and
//! at least once per `ipvs.syncPeriod` (kube-proxy's `BoundedFrequencyRunner` contract).
//! Following a NodeProxyConfig ([`ConfigFollower`], [`crate::source::node_config`]), it also takes new
//! configurations as messages on a watch channel and puts them in force between syncs.

pub mod syncer;

use crate::dataplane::{DEFAULT_NODE_PORT_RANGE, Dataplane, DataplaneError, Ownership};
use crate::engine::syncer::{SyncReport, Syncer};
use crate::model::{DesiredState, VirtualServerKey};
use crate::plan::{self, DesiredIndex, NoLocalEndpoints, Plan, PlanContext, Touched};
use crate::source::manifests;
use crate::source::node_config::{Assigned, KernelSettings, assigned_from};
use crate::source::store::{ObjectKey, Store};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::nodeproxyconfig::{NodePhase, NodeProxyConfigStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Told what sources write and what the engine syncs: the health servers and the metrics
/// implement it ([`crate::serve::health`], [`crate::serve::metrics`]). Every method defaults to nothing.
pub trait Observer: Send + Sync {
    /// The store changed: a source wrote to it, or the engine took its dirty set. Called under
    /// the store lock, so it must be quick.
    fn store_updated(&self, _store: &Store) {}
    /// The engine finished a sync (successful or not).
    fn sync_finished(&self, _outcome: &SyncOutcome<'_>) {}
    /// The engine put a new configuration in force (a NodeProxyConfig revision applied live,
    /// see [`crate::source::node_config`]); the next sync is the first with it.
    fn config_changed(&self, _config: &ProxierConfiguration) {}
}

impl Observer for Vec<Arc<dyn Observer>> {
    fn store_updated(&self, store: &Store) {
        for o in self {
            o.store_updated(store);
        }
    }

    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        for o in self {
            o.sync_finished(outcome);
        }
    }

    fn config_changed(&self, config: &ProxierConfiguration) {
        for o in self {
            o.config_changed(config);
        }
    }
}

/// What one [`Engine::sync`] did, for [`Observer`]s.
pub struct SyncOutcome<'a> {
    /// The sync's result (`Err`: the dataplane could not be observed; nothing was changed).
    pub result: &'a Result<SyncReport, DataplaneError>,
    /// The desired state synced towards.
    pub desired: &'a DesiredState,
    /// Services with a Local traffic policy and no local endpoint, by policy.
    pub no_local_endpoints: NoLocalEndpoints,
    /// Services served by the KEP-1669 fallback to serving+terminating endpoints.
    pub terminating_fallback_services: usize,
    /// Draining real servers and since when.
    pub drains: &'a BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
    /// EndpointSlice change trigger times this sync programmed (see
    /// [`Store::take_trigger_times`]).
    pub trigger_times: &'a [SystemTime],
}

/// What sources hold to feed the engine: the store, the wake-up signal, the readiness gate
/// and the observers of changes.
#[derive(Clone)]
pub struct SourceHandle {
    /// Objects; write through [`SourceHandle::update`] so that the engine and observers hear.
    pub store: Arc<Mutex<Store>>,
    notify: Arc<Notify>,
    ready: Arc<watch::Sender<bool>>,
    observer: Arc<dyn Observer>,
}

impl Default for SourceHandle {
    /// An empty store that is ready at once, with no observer.
    fn default() -> Self {
        SourceHandle {
            store: Arc::default(),
            notify: Arc::default(),
            ready: Arc::new(watch::Sender::new(true)),
            observer: Arc::new(Vec::new()),
        }
    }
}

impl fmt::Debug for SourceHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceHandle")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl SourceHandle {
    /// An empty store that is not ready until [`mark_ready`](Self::mark_ready): the engine's
    /// [`run`](Engine::run) programs nothing before the source has loaded everything once
    /// (an empty store would delete what a previous run programmed).
    pub fn gated() -> Self {
        let handle = SourceHandle::default();
        handle.ready.send_replace(false);
        handle
    }

    /// The same handle, telling `observer` about every store change and sync.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Run `f` on the store, tell the observer and wake the engine.
    pub fn update(&self, f: impl FnOnce(&mut Store)) {
        {
            let mut store = self.store.lock().expect("store lock");
            f(&mut store);
            self.observer.store_updated(&store);
        }
        self.notify.notify_one();
    }

    /// The source has loaded everything once: the engine may sync.
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Whether [`mark_ready`](Self::mark_ready) was called (or the handle was never gated).
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Wait until the source is ready.
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// Which node this proxier runs on.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// This node's name (endpoints with this `nodeName` are local).
    pub name: String,
    /// Node IPs for NodePort virtual servers; empty means the Node's InternalIP addresses.
    pub node_ips: Vec<IpAddr>,
}

/// Plans from the store incrementally: keeps the plan of every Service in a [`DesiredIndex`]
/// and re-plans only the Services whose objects changed (all of them when the Node changed or
/// on the first call).
pub struct Planner {
    identity: NodeIdentity,
    config: ProxierConfiguration,
    index: DesiredIndex,
    node_ips: Vec<IpAddr>,
    other_addresses: BTreeSet<IpAddr>,
    replan_all: bool,
}

/// What a [`Planner::replan`] changed.
#[derive(Debug)]
pub enum Replanned {
    /// Everything was re-planned (first plan, Node or configuration change).
    All,
    /// Only these virtual servers and addresses may have changed.
    Touched(Touched),
}

impl Planner {
    /// A planner for this node and configuration.
    pub fn new(identity: NodeIdentity, config: ProxierConfiguration) -> Self {
        Planner {
            identity,
            config,
            index: DesiredIndex::default(),
            node_ips: Vec::new(),
            other_addresses: BTreeSet::new(),
            replan_all: false,
        }
    }

    /// The desired state of every Service.
    pub fn desired(&self) -> &DesiredState {
        self.index.desired()
    }

    /// The whole plan (desired state, every problem, counts). O(number of Services).
    pub fn plan(&self) -> Plan {
        self.index.to_plan()
    }

    /// The configuration planned with.
    pub fn config(&self) -> &ProxierConfiguration {
        &self.config
    }

    /// Plan with `config` from now on: the next [`replan`](Self::replan) re-plans every
    /// Service.
    pub fn set_config(&mut self, config: ProxierConfiguration) {
        self.config = config;
        self.replan_all = true;
    }

    /// The node IPs of the last plan (NodePort virtual servers live on them).
    pub fn node_ips(&self) -> &[IpAddr] {
        &self.node_ips
    }

    /// Set the node's addresses on interfaces other than `kube-ipvs0` (externalIPs and
    /// load-balancer IPs among them are not bound); a change re-plans every Service.
    pub fn set_other_interface_addresses(&mut self, addresses: BTreeSet<IpAddr>) {
        if addresses != self.other_addresses {
            self.other_addresses = addresses;
            self.replan_all = true;
        }
    }

    /// Take the store's changes and re-plan the affected Services; problems of re-planned
    /// Services are logged as warnings naming them.
    pub fn replan(&mut self, store: &mut Store) -> Replanned {
        let dirty = store.take_dirty();
        let node = store.node();
        let (keys, all): (Vec<ObjectKey>, bool) =
            if dirty.all || std::mem::take(&mut self.replan_all) {
                self.index = DesiredIndex::default();
                self.node_ips = if self.identity.node_ips.is_empty() {
                    node.map(plan::node_internal_ips).unwrap_or_default()
                } else {
                    self.identity.node_ips.clone()
                };
                (store.services().map(|(k, _)| k.clone()).collect(), true)
            } else {
                (dirty.services.into_iter().collect(), false)
            };
        let (context, problems) =
            PlanContext::new(&self.identity.name, node, &self.node_ips, &self.config);
        let context = context.with_other_interface_addresses(self.other_addresses.iter().copied());
        if all {
            self.index.set_nft_rules(context.nft_rules().clone());
            for problem in &problems {
                tracing::warn!("{problem}");
            }
        }
        let mut touched = Touched::default();
        for key in &keys {
            let planned = store
                .service(key)
                .and_then(|s| plan::plan_service(s, &store.slices_of(key), &context));
            touched.extend(self.index.update(key.clone(), planned));
            for problem in self.index.problems_of(key) {
                tracing::warn!("{problem}");
            }
        }
        if all {
            Replanned::All
        } else {
            Replanned::Touched(touched)
        }
    }
}

/// How soon a sync that failed (or had failed ops) is first retried; the delay doubles while
/// it keeps failing, up to `ipvs.syncPeriod`.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// How often draining real servers are checked for remaining connections.
pub const DRAIN_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// How the engine follows the node's NodeProxyConfig (see [`crate::source::node_config`]).
pub struct ConfigFollower {
    /// What the NodeProxyConfig assigns ([`crate::source::node_config::watch_assigned`]).
    pub assigned: watch::Receiver<Assigned>,
    /// The local configuration (`--config` or the defaults), in force without a
    /// NodeProxyConfig.
    pub local: ProxierConfiguration,
    /// Checks and sets the node-wide kernel settings of a new configuration.
    pub kernel: Box<dyn KernelSettings>,
    /// Where the engine publishes the status to write
    /// ([`crate::source::node_config::report_status`] adds `healthy`); `None` while no revision is
    /// assigned.
    pub report: watch::Sender<Option<NodeProxyConfigStatus>>,
}

/// A [`ConfigFollower`] and what the engine knows of the revision in force.
struct Following {
    follower: ConfigFollower,
    /// The revision in force (`None`: the local configuration).
    revision: Option<String>,
    /// A configuration was put in force and no sync with it succeeded yet.
    awaiting_sync: bool,
}

/// How often a successful sync refreshes `status.lastSyncTime` at most (the NodeProxyConfig
/// contract: it is for people, not a heartbeat).
pub const LAST_SYNC_REFRESH: Duration = Duration::from_secs(60);

/// Plans from the store and syncs a dataplane.
pub struct Engine<D> {
    source: SourceHandle,
    planner: Planner,
    syncer: Syncer<D>,
    last_full_sync: Option<Instant>,
    following: Option<Following>,
}

impl<D: Dataplane> Engine<D> {
    /// An engine over `dataplane`, fed through `source`.
    pub fn new(source: SourceHandle, planner: Planner, dataplane: D) -> Self {
        let max_drain = planner.config.ipvs.drain_timeout;
        Engine {
            source,
            planner,
            syncer: Syncer::new(dataplane, Ownership::default(), max_drain),
            last_full_sync: None,
            following: None,
        }
    }

    /// The same engine, following a NodeProxyConfig: [`run`](Self::run) waits until the
    /// assignment is known and applies each new one live
    /// ([`apply_assigned`](Self::apply_assigned)).
    /// The planner's configuration must be `follower.local`.
    pub fn following(mut self, follower: ConfigFollower) -> Self {
        self.following = Some(Following {
            follower,
            revision: None,
            awaiting_sync: false,
        });
        self
    }

    /// Put `assigned` in force if it differs from the configuration in force (NodeProxyConfig
    /// over the local configuration; see [`crate::source::node_config`]); the revision in force
    /// assigned again after a Failed one is reported `Applied` again after the next sync. The new configuration is
    /// first validated and checked against the kernel ([`KernelSettings::check`]); if that or
    /// [`KernelSettings::apply`] fails, the previous configuration stays in force and the
    /// revision is reported `Failed` with the reason. Otherwise the planner re-plans every
    /// Service with it at the next [`sync`](Self::sync), the drain limit, the health servers
    /// ([`Observer::config_changed`]) and the sync periods follow, and the revision is
    /// reported `Pending` (except before the first sync: a restart does not go back to
    /// Pending) until a sync with it succeeds.
    ///
    /// Without a [`ConfigFollower`] this does nothing.
    pub async fn apply_assigned(&mut self, assigned: Assigned) {
        let Some(following) = &mut self.following else {
            return;
        };
        let follower = &following.follower;
        let (revision, config) = match assigned {
            Assigned::Unknown => return,
            Assigned::Local => (None, follower.local.clone()),
            Assigned::Revision { revision, config } => (Some(revision), *config),
        };
        if revision == following.revision && config == self.planner.config {
            // Back to the revision in force after a Failed one (e.g. the operator rolled
            // back): report it again once the next sync succeeds.
            let reported = follower
                .report
                .borrow()
                .clone()
                .and_then(|s| s.observed_revision);
            following.awaiting_sync |= revision.is_some() && reported != revision;
            return;
        }
        let mut outcome = config.validate().map_err(|e| e.to_string());
        if outcome.is_ok() {
            outcome = follower.kernel.check(&config).await;
        }
        if outcome.is_ok() {
            outcome = follower.kernel.apply(&config).await;
        }
        let name = revision.as_deref().unwrap_or("local");
        if let Err(message) = outcome {
            tracing::error!(
                revision = name,
                "cannot apply the configuration, keeping the previous one: {message}"
            );
            // Without a NodeProxyConfig there is nothing to report on.
            follower.report.send_modify(|status| match revision {
                None => *status = None,
                Some(revision) => {
                    let status = status.get_or_insert_default();
                    status.observed_revision = Some(revision);
                    status.phase = Some(NodePhase::Failed);
                    status.message = Some(message);
                    status.sync_errors = None;
                }
            });
            // The spec asks for this revision now: the one in force is not reported Applied.
            following.awaiting_sync = false;
            return;
        }
        let old = &self.planner.config;
        if (&old.healthz_bind_address, &old.metrics_bind_address)
            != (&config.healthz_bind_address, &config.metrics_bind_address)
        {
            tracing::warn!(
                revision = name,
                "healthzBindAddress and metricsBindAddress changes take effect at the next restart"
            );
        }
        tracing::info!(
            revision = name,
            "configuration in force; re-planning everything"
        );
        self.syncer.max_drain = config.ipvs.drain_timeout;
        self.source.observer.config_changed(&config);
        self.planner.set_config(config);
        following.revision = revision.clone();
        following.awaiting_sync = true;
        let restarting = self.last_full_sync.is_none();
        follower.report.send_modify(|status| match &revision {
            None => *status = None,
            Some(_) if restarting => {}
            Some(_) => {
                *status = Some(NodeProxyConfigStatus {
                    observed_revision: revision.clone(),
                    phase: Some(NodePhase::Pending),
                    ..Default::default()
                })
            }
        });
    }

    /// Update the published status after a sync: `Applied` after the first successful sync
    /// with the revision in force (no errors yet), then failed syncs counted in `syncErrors`
    /// (the last error in `message`) and `lastSyncTime` refreshed at most every
    /// [`LAST_SYNC_REFRESH`]. A `Failed` report about another revision stays as it is.
    fn report_sync(&mut self, result: &Result<SyncReport, DataplaneError>) {
        let Some(following) = &mut self.following else {
            return;
        };
        let Some(revision) = following.revision.clone() else {
            return;
        };
        let error = match result {
            Ok(report) if report.failures.is_empty() => None,
            Ok(report) => Some(format!("{} IPVS operations failed", report.failures.len())),
            Err(e) => Some(e.to_string()),
        };
        let now = SystemTime::now();
        let awaiting = &mut following.awaiting_sync;
        following.follower.report.send_if_modified(|status| {
            if *awaiting {
                if result.is_err() {
                    return false;
                }
                *awaiting = false;
                *status = Some(NodeProxyConfigStatus {
                    observed_revision: Some(revision),
                    phase: Some(NodePhase::Applied),
                    last_sync_time: Some(time(now)),
                    message: error.clone(),
                    sync_errors: Some(u64::from(error.is_some())),
                    healthy: None,
                });
                return true;
            }
            let Some(status) = status.as_mut() else {
                return false;
            };
            if status.observed_revision.as_deref() != Some(&revision) {
                return false;
            }
            if let Some(error) = error {
                *status.sync_errors.get_or_insert(0) += 1;
                status.message = Some(error);
                return true;
            }
            let stale = status
                .last_sync_time
                .as_ref()
                .is_none_or(|t| SystemTime::from(t.0) + LAST_SYNC_REFRESH <= now);
            if result.is_ok() && stale {
                status.last_sync_time = Some(time(now));
            }
            stale
        });
    }

    /// The planner (last plan, configuration).
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The syncer (dataplane, drains).
    pub fn syncer(&self) -> &Syncer<D> {
        &self.syncer
    }

    /// The dataplane.
    pub fn dataplane(&self) -> &D {
        self.syncer.dataplane()
    }

    /// Re-plan what changed and sync the dataplane: in full on the first sync, after a Node or
    /// configuration change and once per `ipvs.syncPeriod`; otherwise only what changed.
    ///
    /// Errors: only when the dataplane cannot be observed; nothing is changed then.
    ///
    /// The source's observer hears of the taken changes and of the outcome.
    pub async fn sync(&mut self) -> Result<SyncReport, DataplaneError> {
        let period_over = self
            .last_full_sync
            .is_none_or(|t| t.elapsed() >= self.planner.config.ipvs.sync_period);
        if period_over {
            match self
                .syncer
                .dataplane_mut()
                .other_interface_addresses()
                .await
            {
                Ok(a) => self.planner.set_other_interface_addresses(a),
                Err(e) => tracing::warn!("cannot list the node's addresses: {e}"),
            }
        }
        let observer = self.source.observer.clone();
        let (replanned, trigger_times) = {
            let mut store = self.source.store.lock().expect("store lock");
            let trigger_times = store.take_trigger_times();
            let replanned = self.planner.replan(&mut store);
            observer.store_updated(&store);
            (replanned, trigger_times)
        };
        let config = &self.planner.config;
        self.syncer.ownership = Ownership {
            node_ips: self.planner.node_ips.iter().copied().collect(),
            node_port_range: Some(DEFAULT_NODE_PORT_RANGE),
            exclude_cidrs: config.ipvs.parsed_exclude_cidrs().unwrap_or_default(),
        };
        let desired = self.planner.index.desired();
        let result = match replanned {
            Replanned::Touched(touched) if !period_over => {
                self.syncer.sync_touched(desired, &touched).await
            }
            _ => {
                let result = self.syncer.sync(desired).await;
                if result.is_ok() {
                    self.last_full_sync = Some(Instant::now());
                }
                result
            }
        };
        let (no_local_endpoints, terminating_fallback_services) = self.planner.index.counts();
        observer.sync_finished(&SyncOutcome {
            result: &result,
            desired,
            no_local_endpoints,
            terminating_fallback_services,
            drains: self.syncer.drains(),
            trigger_times: &trigger_times,
        });
        self.report_sync(&result);
        result
    }

    /// Check draining real servers (see [`Syncer::check_drains`]).
    pub async fn check_drains(&mut self) -> Result<SyncReport, DataplaneError> {
        self.syncer.check_drains(self.planner.index.desired()).await
    }

    /// Sync once the source is ready ([`SourceHandle::wait_ready`]), then whenever a source
    /// reports a change (at most once per `ipvs.minSyncPeriod`) and at least every
    /// `ipvs.syncPeriod`, until `shutdown` resolves. A failed sync is logged and retried after
    /// [`RETRY_INTERVAL`], doubling while it fails; the kernel is left as it is on shutdown (never flushed).
    pub async fn run(&mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let notify = self.source.notify.clone();
        let source = self.source.clone();
        tokio::select! {
            _ = &mut shutdown => return,
            _ = source.wait_ready() => {}
        }
        let mut assigned = self.following.as_ref().map(|f| f.follower.assigned.clone());
        if let Some(rx) = &mut assigned {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = rx.wait_for(|a| *a != Assigned::Unknown) => {}
            }
            let first = rx.borrow_and_update().clone();
            self.apply_assigned(first).await;
        }
        let mut retry = Duration::ZERO;
        loop {
            let started = Instant::now();
            let failed = match self.sync().await {
                Ok(report) => !report.failures.is_empty(),
                Err(e) => {
                    tracing::error!("sync failed, will retry: {e}");
                    true
                }
            };
            let ipvs = &self.planner.config.ipvs;
            let (min_next, mut period) = (started + ipvs.min_sync_period, ipvs.sync_period);
            if failed {
                // Retry soon rather than a whole syncPeriod later, backing off while it fails.
                retry = (retry * 2).clamp(RETRY_INTERVAL, period);
                period = retry;
            } else {
                retry = Duration::ZERO;
            }
            let resync = tokio::time::sleep(period);
            tokio::pin!(resync);
            loop {
                let draining = !self.syncer.drains().is_empty();
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = notify.notified() => break,
                    _ = &mut resync => break,
                    next = next_assigned(&mut assigned) => {
                        self.apply_assigned(next).await;
                        break;
                    }
                    _ = tokio::time::sleep(DRAIN_CHECK_INTERVAL), if draining => {
                        if let Err(e) = self.check_drains().await {
                            tracing::error!("drain check failed, will retry: {e}");
                        }
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(min_next) => {}
            }
        }
    }
}

/// The next assignment on `assigned`; never resolves without a receiver or once its sender
/// is gone.
async fn next_assigned(assigned: &mut Option<watch::Receiver<Assigned>>) -> Assigned {
    if let Some(rx) = assigned
        && rx.changed().await.is_ok()
    {
        return rx.borrow_and_update().clone();
    }
    std::future::pending().await
}

/// A `metav1.Time` at `at`.
fn time(at: SystemTime) -> Time {
    Time(Timestamp::try_from(at).expect("the clock is within jiff's range"))
}

/// The manifests source: a file or directory re-read whenever its contents change.
#[derive(Clone, Debug)]
pub struct ManifestsSource {
    /// File or directory of manifests.
    pub path: PathBuf,
    /// The node whose Node object is taken from the manifests.
    pub node_name: String,
    /// Where to publish what the manifests' NodeProxyConfig for this node assigns (`None`:
    /// NodeProxyConfigs in the manifests are not followed).
    pub node_configs: Option<watch::Sender<Assigned>>,
}

/// How often the manifests are checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

impl ManifestsSource {
    /// Load the files into the store if their contents changed since `seen`; returns the new
    /// fingerprint. Unreadable documents are logged by name and skipped.
    ///
    /// Errors: when the path itself cannot be read (the store is left unchanged).
    pub fn load_into(&self, handle: &SourceHandle, seen: Option<u64>) -> io::Result<u64> {
        let current = fingerprint(&self.path)?;
        if Some(current) != seen {
            let (snapshot, errors) = manifests::load(&self.path)?;
            for e in &errors {
                tracing::warn!("skipped manifest: {e}");
            }
            if let Some(tx) = &self.node_configs {
                let next = assigned_from(&snapshot.node_proxy_configs, &self.node_name);
                tx.send_if_modified(|current| {
                    let changed = *current != next;
                    *current = next;
                    changed
                });
            }
            handle.update(|store| store.replace_all(snapshot, &self.node_name));
        }
        Ok(current)
    }

    /// Poll the files every [`POLL_INTERVAL`] forever, loading changes into the store.
    pub async fn watch(self, handle: SourceHandle) {
        let mut seen = None;
        loop {
            match self.load_into(&handle, seen) {
                Ok(f) => {
                    seen = Some(f);
                    handle.mark_ready();
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), "cannot read manifests: {e}")
                }
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// A fingerprint of the manifests' contents, to notice edits (of any size or timestamp).
fn fingerprint(path: &Path) -> io::Result<u64> {
    let mut hasher = DefaultHasher::new();
    let mut files = vec![path.to_path_buf()];
    if path.is_dir() {
        files = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<_>>()?;
        files.sort();
    }
    for f in files {
        f.hash(&mut hasher);
        std::fs::read(&f)?.hash(&mut hasher);
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::Op;
    use crate::dataplane::fake::FakeDataplane;

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.20
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.1.2]
  conditions: {ready: READY}
ports: [{name: http, port: 8080, protocol: TCP}]
"#;

    #[tokio::test]
    async fn manifest_edits_flow_to_the_dataplane() {
        let dir = std::env::temp_dir().join(format!("kipvs-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("web.yaml");
        std::fs::write(&file, WEB.replace("READY", "true")).unwrap();
        let handle = SourceHandle::default();
        let source = ManifestsSource {
            path: file.clone(),
            node_name: "n1".into(),
            node_configs: None,
        };
        let identity = NodeIdentity {
            name: "n1".into(),
            node_ips: vec![],
        };
        let planner = Planner::new(identity, ProxierConfiguration::default());
        let mut engine = Engine::new(handle.clone(), planner, FakeDataplane::default());
        let seen = source.load_into(&handle, None).unwrap();
        let names: Vec<&str> = engine
            .sync()
            .await
            .unwrap()
            .ops
            .iter()
            .map(Op::name)
            .collect();
        assert_eq!(
            names,
            [
                "WriteRules",
                "AddSetElement", // cluster-ips
                "AddSetElement", // service-ips
                "AddVirtualServer",
                "AddRealServer",
                "BindAddress"
            ]
        );
        // No change: nothing re-planned, nothing applied.
        assert_eq!(source.load_into(&handle, Some(seen)).unwrap(), seen);
        assert!(engine.sync().await.unwrap().ops.is_empty());
        // The endpoint stops being ready: its real server goes away.
        std::fs::write(&file, WEB.replace("READY", "false")).unwrap();
        source.load_into(&handle, Some(seen)).unwrap();
        let report = engine.sync().await.unwrap();
        assert_eq!(report.ops.len(), 1, "{:?}", report.ops);
        let vs = engine
            .dataplane()
            .state
            .virtual_servers
            .values()
            .next()
            .unwrap();
        assert!(vs.real_servers.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

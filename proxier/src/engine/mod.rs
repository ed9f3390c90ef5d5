//! The proxier's main loop: sources write objects into a shared store
//! ([`crate::source::SourceHandle`]); the [`Engine`] re-plans what changed ([`planner`]) and
//! syncs the dataplane ([`syncer`]), at most once per `ipvs.minSyncPeriod` and at least once
//! per `ipvs.syncPeriod` (kube-proxy's `BoundedFrequencyRunner` contract), and tells its
//! [`observer::Observer`]s. Following a NodeProxyConfig ([`ConfigFollower`],
//! [`crate::source::node_config`]), it also takes new configurations as messages on a watch
//! channel, puts them in force between syncs and reports on them
//! ([`kipvs_proxier_contract::report`]).

pub mod drains;
pub mod observer;
pub mod planner;
pub mod preview;
mod switch;
pub mod syncer;
pub mod takeover;

use crate::dataplane::diff::Ownership;
use crate::dataplane::kernel::settings::{KernelSettings, SchedulerError, SettingsError};
use crate::dataplane::{Dataplane, DataplaneError, Op};
use crate::model::Protocol;
use crate::model::{ObservedState, full_scope};
use crate::plan::Touched;
use crate::source::SourceHandle;
use crate::source::node_config::{Assigned, NODE_PROXY_CONFIGS_RESOURCE};
use kipvs_crds::config::{ConfigError, ProxierConfiguration, ServiceProxy};
use kipvs_crds::nodeproxyconfig::NodeProxyConfigStatus;
use kipvs_proxier_contract::{StatusReport, SyncResult};
use observer::{Observer, SyncOutcome};
use planner::{Planner, Replanned};
use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use syncer::{FINISH_SLICE, SyncReport, Syncer};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

/// How soon a sync that could not observe the dataplane is first retried; the delay doubles
/// while it keeps failing, up to `ipvs.syncPeriod`. (Failed ops are retried per entry:
/// [`syncer::RETRY_FIRST`].)
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// How long [`Engine::run`] waits for the node's NodeProxyConfig to be read before it programs
/// with the local configuration: a NodeProxyConfig that cannot be read (RBAC, API server
/// errors, a newer operator's object) never keeps a node from programming.
pub const ASSIGNMENT_WAIT: Duration = Duration::from_secs(5);

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
    /// ([`kipvs_proxier_contract::report_status`] adds `healthy`); `None` while no revision is
    /// assigned.
    pub report: watch::Sender<Option<NodeProxyConfigStatus>>,
}

/// A [`ConfigFollower`] and what the engine reports on the revision in force.
struct Following {
    follower: ConfigFollower,
    report: StatusReport,
    /// The settings of the revision in force this version leaves out.
    ignored: Vec<String>,
}

impl Following {
    /// Publish the report's status if `changed`.
    fn publish(&self, changed: bool) {
        if changed {
            self.follower
                .report
                .send_replace(self.report.status().cloned());
        }
    }
}

/// Plans from the store and syncs a dataplane.
pub struct Engine<D> {
    source: SourceHandle,
    observer: Arc<dyn Observer>,
    planner: Planner,
    syncer: Syncer<D>,
    last_full_sync: Option<Instant>,
    following: Option<Following>,
    takeover: Option<takeover::Takeover>,
    /// The NodePorts kube-proxy's virtual servers on other local addresses drain for
    /// ([`Ownership::kube_proxy_node_ports`]), as of the last full sync.
    kube_proxy_node_ports: BTreeSet<(u16, Protocol)>,
    /// `Some` while the configuration in force was put in force while the proxier wrote
    /// nothing (validated only, see [`apply_assigned`](Self::apply_assigned)) and the kernel
    /// has not admitted it yet: the configuration in force before the first such one (the last
    /// one the kernel admitted, or the local one), back in force should the kernel refuse the
    /// later one at the switch ([`Engine::switch`]).
    unadmitted: Option<InForce>,
    /// Whether a periodic full sync reads the kernel in a task of its own while incremental
    /// syncs go on ([`Engine::run`] sets it; see [`Engine::sync`]).
    reads_beside: bool,
    /// The observation of the periodic full sync under way beside incremental syncs.
    observing: Option<Observing>,
    /// How long after the last failed observation beside the syncs the next one waits
    /// ([`RETRY_INTERVAL`], doubling while they fail, up to `ipvs.syncPeriod`); zero after one
    /// that succeeded.
    read_retry: Duration,
    /// No observation beside the syncs starts before this (the last failed one's end plus
    /// [`Engine::read_retry`]): the incremental syncs a steady stream of changes brings
    /// would otherwise start one each, with no pause, while the kernel cannot be read.
    next_read: Option<Instant>,
    /// When the draining real servers are checked next ([`DRAIN_CHECK_INTERVAL`] after the
    /// last check): a deadline, not a fresh timer per wait, so that changes sooner than it
    /// cannot postpone it.
    next_drain_check: Instant,
}

/// The observation of a full sync, running as a task of its own ([`Syncer::begin_full`]);
/// aborted when dropped.
struct Observing {
    /// When it started (the full sync's start).
    started: Instant,
    read: tokio::task::JoinHandle<Result<ObservedState, DataplaneError>>,
    /// What it read, once [`Observing::wait`] saw it end.
    done: Option<Result<ObservedState, DataplaneError>>,
}

impl Observing {
    /// Starts the observation of a full sync on `syncer`'s dataplane, as a Tokio task.
    fn start<D: Dataplane>(syncer: &mut Syncer<D>) -> Self {
        Observing {
            started: Instant::now(),
            read: tokio::spawn(
                syncer
                    .begin_full()
                    .instrument(tracing::info_span!("full_sync_read")),
            ),
            done: None,
        }
    }

    /// Whether it ended.
    fn is_finished(&self) -> bool {
        self.done.is_some() || self.read.is_finished()
    }

    /// Waits until it ended, keeping what it read; resolves at once after that.
    async fn wait(&mut self) {
        if self.done.is_none() {
            self.done = Some(joined((&mut self.read).await));
        }
    }

    /// What it read (waits for the end).
    async fn finish(mut self) -> Result<ObservedState, DataplaneError> {
        self.wait().await;
        self.done.take().expect("waited")
    }
}

impl Drop for Observing {
    fn drop(&mut self) {
        self.read.abort();
    }
}

/// The outcome of the observation task (a panic or an abort is an error of the observation).
fn joined(
    result: Result<Result<ObservedState, DataplaneError>, tokio::task::JoinError>,
) -> Result<ObservedState, DataplaneError> {
    result.unwrap_or_else(|e| {
        Err(DataplaneError::Io {
            context: "observing the kernel".into(),
            source: std::io::Error::other(e.to_string()),
        })
    })
}

/// Resolves once the observation in `observing` (if any) ended; never without one.
async fn observation_ended(observing: &mut Option<Observing>) {
    match observing {
        Some(observing) => observing.wait().await,
        None => std::future::pending().await,
    }
}

/// What [`Engine::admit_at_switch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Nothing awaited the kernel's admission (the configuration in force was admitted when it
    /// was put in force, or is the local one): the switch makes its kernel settings.
    Nothing,
    /// The kernel admitted the configuration in force (its kernel settings are made).
    Admitted,
    /// The kernel refused it: the configuration in force before it is back in force; the
    /// switch is decided again with it.
    Refused,
    /// The kernel's part failed for a reason a later attempt may not meet
    /// ([`Rejection::is_refusal`]): nothing changed, the switch is tried again.
    Again,
}

/// A configuration in force and the revision it is (`None`: the local configuration), with
/// the settings of it this version leaves out.
struct InForce {
    revision: Option<String>,
    config: ProxierConfiguration,
    ignored: Vec<String>,
}

impl<D: Dataplane> Engine<D> {
    /// An engine over `dataplane`, fed through `source`.
    pub fn new(source: SourceHandle, planner: Planner, dataplane: D) -> Self {
        let max_drain = planner.config().ipvs.drain_timeout;
        Engine {
            source,
            observer: Arc::new(Vec::new()),
            planner,
            syncer: Syncer::new(dataplane, Ownership::default(), max_drain),
            last_full_sync: None,
            following: None,
            takeover: None,
            kube_proxy_node_ports: BTreeSet::new(),
            unadmitted: None,
            reads_beside: false,
            observing: None,
            read_retry: Duration::ZERO,
            next_read: None,
            next_drain_check: Instant::now() + DRAIN_CHECK_INTERVAL,
        }
    }

    /// The same engine, telling `observer` about every sync and configuration change (and the
    /// store changes it takes), starting with the configuration it plans with now
    /// ([`Observer::config_changed`]): the engine alone tells observers the configuration. The
    /// source handle's observer should be the same one.
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        observer.config_changed(self.planner.config());
        self.observer = observer;
        self
    }

    /// The same engine, removing kube-proxy's iptables rules and ipsets from the node after
    /// its first full sync ([`takeover`]).
    pub fn taking_over(mut self, takeover: takeover::Takeover) -> Self {
        self.takeover = Some(takeover);
        self
    }

    /// The same engine, following a NodeProxyConfig: [`run`](Self::run) waits until the
    /// assignment is known and applies each new one live
    /// ([`apply_assigned`](Self::apply_assigned)).
    /// The planner's configuration must be `follower.local`.
    pub fn following(mut self, follower: ConfigFollower) -> Self {
        self.following = Some(Following {
            follower,
            report: StatusReport::default(),
            ignored: Vec::new(),
        });
        self
    }

    /// Put `assigned` in force if it differs from the configuration in force (NodeProxyConfig
    /// over the local configuration; see [`crate::source::node_config`]); the revision in force
    /// assigned again after a Failed one is reported `Applied` again after the next sync.
    /// Settings a newer kipvs wrote that this version does not know are left out, logged,
    /// counted ([`Observer::config_ignored`]) and named in the status; an unusable
    /// NodeProxyConfig ([`Assigned::Unusable`]) is reported `Failed`. The new configuration is
    /// first validated and checked against the kernel ([`KernelSettings::check`]); if that or
    /// [`KernelSettings::apply`] fails, the previous configuration stays in force and the
    /// revision is reported `Failed` with the reason. Otherwise the planner re-plans every
    /// Service with it at the next [`sync`](Self::sync), the drain limit, the health servers
    /// ([`Observer::config_changed`]) and the sync periods follow, and the revision is
    /// reported `Pending` (except before the first sync: a restart does not go back to
    /// Pending) until a sync with it succeeds.
    ///
    /// While the proxier writes nothing (a takeover that has not decided yet, standby, a
    /// refused switch, a handback: [`Engine::switch`]) the configuration is validated only, and
    /// the kernel's part (scheduler probe, settings) waits for the switch to kipvs, before its
    /// first sync, so that standby writes nothing to the kernel; should the kernel refuse it
    /// then, the configuration in force before it is put back in force and the revision is
    /// reported `Failed` with the reason.
    ///
    /// Without a [`ConfigFollower`] this does nothing.
    pub async fn apply_assigned(&mut self, assigned: Assigned) {
        let Some(following) = &mut self.following else {
            return;
        };
        let follower = &following.follower;
        let (revision, config, ignored) = match assigned {
            Assigned::Unknown => return,
            Assigned::Local => (None, follower.local.clone(), Vec::new()),
            Assigned::Revision {
                revision,
                config,
                ignored,
            } => (Some(revision), *config, ignored),
            Assigned::Unusable { revision, message } => {
                tracing::error!(
                    revision,
                    "cannot use the NodeProxyConfig, keeping the configuration in force: {message}"
                );
                let changed = following.report.rejected(Some(revision), message);
                following.publish(changed);
                return;
            }
        };
        if revision.as_deref() == following.report.revision() && config == *self.planner.config() {
            // Back to the revision in force after a Failed one (e.g. the operator rolled
            // back): report it again once the next sync succeeds.
            following.report.reassigned();
            return;
        }
        let programs = self.takeover.as_ref().is_none_or(|t| t.programs());
        let kernel = programs.then_some(&*follower.kernel);
        if let Err(rejection) = admit(kernel, &config).await {
            let name = revision.as_deref().unwrap_or("local");
            tracing::error!(
                revision = name,
                "cannot apply the configuration, keeping the previous one: {rejection}"
            );
            // The spec asks for this revision now: the one in force is not reported Applied.
            let changed = following.report.rejected(revision, rejection.to_string());
            following.publish(changed);
            return;
        }
        if !programs && self.unadmitted.is_none() {
            self.unadmitted = Some(InForce {
                revision: following.report.revision().map(str::to_owned),
                config: self.planner.config().clone(),
                ignored: following.ignored.clone(),
            });
        }
        let changed = self.put_in_force(InForce {
            revision,
            config,
            ignored,
        });
        if let Some(following) = &self.following {
            following.publish(changed);
        }
    }

    /// Puts `in_force` in force (see [`apply_assigned`](Self::apply_assigned)); whether the
    /// status changed.
    fn put_in_force(&mut self, in_force: InForce) -> bool {
        let InForce {
            revision,
            config,
            ignored,
        } = in_force;
        let name = revision.as_deref().unwrap_or("local");
        announce(name, self.planner.config(), &config, &ignored);
        self.syncer.max_drain = config.ipvs.drain_timeout;
        self.observer.config_changed(&config);
        self.observer.config_ignored(&ignored);
        self.planner.set_config(config);
        let restarting = self.last_full_sync.is_none();
        let Some(following) = &mut self.following else {
            return false;
        };
        let changed = following.report.in_force(revision, restarting, &ignored);
        following.ignored = ignored;
        changed
    }

    /// At the switch to kipvs ([`Engine::switch`]): the kernel's part of the admission of a
    /// configuration put in force while the proxier wrote nothing
    /// ([`apply_assigned`](Self::apply_assigned)), with the takeover's kernel settings: its
    /// scheduler is probed and its kernel settings are made. If the kernel refuses it, the
    /// configuration in force before it is put back in force and the refused revision is
    /// reported `Failed` with the reason.
    async fn admit_at_switch(&mut self) -> Admission {
        let (Some(takeover), Some(previous)) = (self.takeover.as_ref(), self.unadmitted.take())
        else {
            return Admission::Nothing;
        };
        let Err(rejection) = admit(Some(&*takeover.settings), self.planner.config()).await else {
            return Admission::Admitted;
        };
        if !rejection.is_refusal() {
            tracing::warn!(
                "cannot admit the configuration at the switch to kipvs, again: {rejection}"
            );
            self.unadmitted = Some(previous);
            return Admission::Again;
        }
        let refused = self
            .following
            .as_ref()
            .and_then(|f| f.report.revision().map(str::to_owned));
        tracing::error!(
            revision = refused.as_deref().unwrap_or("local"),
            "cannot apply the configuration at the switch to kipvs, putting the previous one \
             back in force: {rejection}"
        );
        let mut changed = self.put_in_force(previous);
        if let Some(following) = &mut self.following {
            changed |= following.report.rejected(refused, rejection.to_string());
            following.publish(changed);
        }
        Admission::Refused
    }

    /// Update the published status after a sync (see [`kipvs_proxier_contract::report`]). The last
    /// sync of a handback to kube-proxy does not count: that revision is `Applied` once
    /// kube-proxy has synced ([`takeover`]).
    fn report_sync(&mut self, result: &Result<SyncReport, DataplaneError>) {
        let Some(following) = &mut self.following else {
            return;
        };
        let handing_back = self.planner.config().service_proxy == ServiceProxy::KubeProxy;
        if handing_back && self.takeover.is_some() {
            return;
        }
        let result = match result {
            Ok(report) if report.failures.is_empty() => SyncResult::Clean,
            Ok(report) => {
                SyncResult::Failed(format!("{} IPVS operations failed", report.failures.len()))
            }
            Err(e) => SyncResult::NotObserved(e.to_string()),
        };
        let changed = following.report.synced(&result, SystemTime::now());
        following.publish(changed);
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
    /// Inside [`run`](Self::run), a full sync that is due only because `ipvs.syncPeriod` passed
    /// (not the first one, nor one [`Engine::switch`] asks for) does not stall the changes: its
    /// observation of the kernel starts in a task of its own ([`Syncer::begin_full`]), the
    /// calls meanwhile sync what changed incrementally, and the first call after the
    /// observation ended syncs what it took, then finishes the full sync with it in slices
    /// ([`Engine::finish_in_slices`]: each slice reconciled with the writes made meanwhile,
    /// and what changed synced between slices). A re-plan of every Service meanwhile is
    /// synced against the cache of the kernel's state, all of it in scope. After an observation
    /// beside the syncs that failed, the next one starts no sooner than [`RETRY_INTERVAL`]
    /// later, doubling while they fail, up to `ipvs.syncPeriod` ([`Engine::next_read`]).
    ///
    /// # Errors
    /// Only when the dataplane cannot be observed; nothing is changed then.
    ///
    /// The source's observer hears of the taken changes and of the outcome.
    #[tracing::instrument(name = "engine", skip_all)]
    pub async fn sync(&mut self) -> Result<SyncReport, DataplaneError> {
        self.kube_ipvs0_looked_at().await;
        let period_over = self
            .last_full_sync
            .is_none_or(|t| t.elapsed() >= self.planner.config().ipvs.sync_period);
        let beside =
            self.reads_beside && self.last_full_sync.is_some() && self.syncer.cached().is_some();
        if !beside {
            // A full sync that reads inline: an observation under way is dropped.
            self.observing = None;
        }
        let finished = self.observing.take_if(|o| o.is_finished());
        let sync_period = self.planner.config().ipvs.sync_period;
        let read_due = self.next_read.is_none_or(|at| Instant::now() >= at);
        let starting =
            beside && period_over && read_due && self.observing.is_none() && finished.is_none();
        if period_over && (!beside || starting) {
            self.refresh_other_interface_addresses().await;
        }
        let (replanned, mut trigger_times) = self.replan();
        if starting {
            self.observing = Some(Observing::start(&mut self.syncer));
        }
        let all = matches!(replanned, Replanned::All);
        let full = finished.is_some() || (!beside && (period_over || all));
        // What changed, unless this sync is a full one.
        let touched = match &replanned {
            Replanned::Touched(touched) if !full => Some(touched),
            _ => None,
        };
        if full && let Some(takeover) = self.takeover.as_mut() {
            let kubelet_version = self
                .source
                .with_store(|store| store.kubelet_version().map(str::to_owned));
            takeover.set_kubelet_version(kubelet_version.as_deref());
            takeover.take_outcome().await;
            if takeover.found_kube_proxy() {
                self.kube_proxy_node_ports = takeover::kube_proxy_node_ports(
                    self.planner.desired(),
                    self.planner.node_port_ips(),
                    self.syncer.drains(),
                );
            }
        }
        self.syncer.ownership = self.ownership();
        let desired = self.planner.desired();
        let result = match (touched, finished) {
            (Some(touched), _) => self.syncer.sync_touched(desired, touched).await,
            (None, Some(observing)) => {
                let started = observing.started;
                let observed = observing.finish().await;
                self.next_read = read_ended(&mut self.read_retry, observed.is_err(), sync_period);
                if let Ok(observed) = observed {
                    // What this call took from the store goes to the kernel first (a re-plan
                    // of everything goes with the slices).
                    if matches!(replanned, Replanned::Touched(_)) {
                        self.sync_meanwhile(&replanned, &std::mem::take(&mut trigger_times))
                            .await;
                    }
                    self.syncer.start_finishing(observed, started);
                    self.finish_in_slices().await
                } else {
                    let result = self.syncer.finish_full(desired, observed, started).await;
                    // The read failed (the full sync is retried): what this call took from the
                    // store (a configuration or Node change: everything, against the cache) still
                    // goes to the kernel now, and the failure is reported.
                    let everything;
                    let scope = match &replanned {
                        Replanned::Touched(touched) => Some(touched),
                        Replanned::All => {
                            everything = self.syncer.cached().map(|c| full_scope(desired, c));
                            everything.as_ref()
                        }
                    };
                    if let Some(scope) = scope
                        && let Err(e) = self.syncer.sync_touched(desired, scope).await
                    {
                        tracing::warn!("incremental sync after a failed observation: {e}");
                    }
                    result
                }
            }
            (None, None) if !full => {
                let cache = self.syncer.cached().expect("beside: a cache");
                let everything = full_scope(desired, cache);
                self.syncer.sync_touched(desired, &everything).await
            }
            (None, None) => self.syncer.sync(desired).await,
        };
        if full && result.is_ok() {
            self.last_full_sync = Some(Instant::now());
            // However it read the kernel, no read waits for a backoff any more.
            self.next_read = read_ended(&mut self.read_retry, false, sync_period);
        }
        self.tell_observers(&result, full, touched, &trigger_times);
        self.report_sync(&result);
        if let Ok(report) = &result {
            self.probe_schedulers(report).await;
            // After the observers: removing kube-proxy's rules runs processes (in a task of its
            // own), and the sync's outcome (health, status) does not wait for them.
            if let Some(takeover) = self.takeover.as_mut().filter(|_| full) {
                takeover.after_full_sync(report, &self.observer).await;
            }
        }
        result
    }

    /// Finishes the full sync the syncer started finishing ([`Syncer::start_finishing`]), one
    /// slice of [`FINISH_SLICE`] entries at a time ([`Syncer::finish_slice`]); between slices,
    /// the other tasks run (on a one-CPU node, the sources' watches share the engine's worker)
    /// and what the store took meanwhile is synced at once ([`Engine::sync_meanwhile`]). So a
    /// change waits for at most one slice, never for the whole diff of the table (issue 32).
    async fn finish_in_slices(&mut self) -> Result<SyncReport, DataplaneError> {
        loop {
            if let Some(report) = self
                .syncer
                .finish_slice(self.planner.desired(), FINISH_SLICE)
                .await
            {
                return Ok(report);
            }
            tokio::task::yield_now().await;
            let (replanned, trigger_times) = self.replan();
            self.sync_meanwhile(&replanned, &trigger_times).await;
        }
    }

    /// Syncs what `replanned` says changed (bringing `trigger_times`; every Service after a
    /// re-plan of all of them) against the cache while a full sync is being finished, and
    /// tells the observers; nothing when nothing changed. A failure (the dataplane could not
    /// be read) is logged and reported as an incremental sync's is.
    async fn sync_meanwhile(&mut self, replanned: &Replanned, trigger_times: &[SystemTime]) {
        let desired = self.planner.desired();
        let everything;
        let touched = match replanned {
            Replanned::Touched(touched) if touched.is_empty() => return,
            Replanned::Touched(touched) => touched,
            Replanned::All => {
                let Some(cache) = self.syncer.cached() else {
                    return;
                };
                everything = full_scope(desired, cache);
                &everything
            }
        };
        let result = self.syncer.sync_touched(desired, touched).await;
        if let Err(e) = &result {
            tracing::warn!("incremental sync during a full sync's finish: {e}");
        }
        let touched = matches!(replanned, Replanned::Touched(_)).then_some(touched);
        self.tell_observers(&result, false, touched, trigger_times);
        self.report_sync(&result);
    }

    /// After a change of the node's interfaces: reads their addresses for the planner, and
    /// whether `kube-ipvs0` was made again (the next sync is then a full one that reads the
    /// kernel: the addresses it held are gone). Whether a sync is due now.
    async fn interfaces_looked_at(&mut self) -> bool {
        self.refresh_other_interface_addresses().await;
        let recreated = self.kube_ipvs0_looked_at().await;
        if self.planner.replan_pending() {
            tracing::info!(
                addresses = ?self.planner.other_interface_addresses(),
                "the node's addresses changed: re-planning NodePorts"
            );
        }
        recreated || self.planner.replan_pending()
    }

    /// Whether `kube-ipvs0` was deleted or made again ([`Dataplane::kube_ipvs0_recreated`]):
    /// then the next sync is a full one that reads the kernel (a failure is logged).
    async fn kube_ipvs0_looked_at(&mut self) -> bool {
        match self.syncer.dataplane_mut().kube_ipvs0_recreated().await {
            Ok(recreated) => {
                if recreated {
                    self.last_full_sync = None;
                }
                recreated
            }
            Err(e) => {
                tracing::warn!("cannot look at kube-ipvs0 (or make it again): {e}");
                false
            }
        }
    }

    /// Reads the node's addresses on other interfaces than `kube-ipvs0` for the planner (a
    /// failure is logged, and the last ones kept).
    async fn refresh_other_interface_addresses(&mut self) {
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

    /// Takes the store's changes and re-plans them; the EndpointSlice change trigger times
    /// they bring ([`Store::take_trigger_times`](crate::source::store::Store::take_trigger_times)).
    fn replan(&mut self) -> (Replanned, Vec<SystemTime>) {
        let observer = self.observer.clone();
        let planning = Instant::now();
        let planner = &mut self.planner;
        let (replanned, trigger_times) = self.source.with_store(|store| {
            let trigger_times = store.take_trigger_times();
            let replanned = planner.replan(store);
            observer.store_updated(store);
            (replanned, trigger_times)
        });
        if matches!(replanned, Replanned::All) {
            tracing::debug!(
                duration_us = planning.elapsed().as_micros() as u64,
                "re-planned every Service"
            );
        }
        (replanned, trigger_times)
    }

    /// Which virtual servers the syncer may delete, from the configuration in force (validated
    /// before it is put in force; should it not parse, the last ownership stays) and the node's
    /// addresses.
    fn ownership(&self) -> Ownership {
        self.planner
            .ownership(self.kube_proxy_node_ports.clone())
            .unwrap_or_else(|e| {
                tracing::error!("ownership: {e}; the last one stays");
                self.syncer.ownership.clone()
            })
    }

    /// Tells the observers how the sync of `touched` (`None`: the whole table; `full`: it
    /// observed the kernel) ended.
    fn tell_observers(
        &self,
        result: &Result<SyncReport, DataplaneError>,
        full: bool,
        touched: Option<&Touched>,
        trigger_times: &[SystemTime],
    ) {
        let (no_local_endpoints, terminating_fallback_services) = self.planner.counts();
        self.observer.sync_finished(&SyncOutcome {
            result,
            full,
            desired: self.planner.desired(),
            real_servers: self.planner.real_servers(),
            health_check_changes: touched.map(|touched| &touched.health_check_node_ports),
            no_local_endpoints,
            terminating_fallback_services,
            drains: self.syncer.drains(),
            unavailable_schedulers: self.planner.unavailable_schedulers(),
            trigger_times,
        });
    }

    /// Probe (once each) the IPVS schedulers of virtual server ops that failed, other than
    /// `ipvs.scheduler` (checked when the configuration is put in force): a missing one is
    /// logged, and the planner plans the Services annotated with it with `ipvs.scheduler`.
    async fn probe_schedulers(&mut self, report: &SyncReport) {
        let configured = self.planner.config().ipvs.effective_scheduler().to_owned();
        let failed: BTreeSet<String> = report
            .failures
            .iter()
            .filter_map(|f| match &f.op {
                Op::AddVirtualServer(_, spec) | Op::UpdateVirtualServer(_, spec) => {
                    Some(spec.scheduler.to_string())
                }
                _ => None,
            })
            .filter(|s| *s != configured && !self.planner.scheduler_known(s))
            .collect();
        for scheduler in failed {
            let probe = self
                .syncer
                .dataplane_mut()
                .check_scheduler(&scheduler)
                .await;
            if let Err(e) = &probe {
                tracing::warn!(
                    scheduler,
                    "{e}: Services annotated kipvs.io/scheduler={scheduler} get ipvs.scheduler \
                     {configured:?}"
                );
            }
            self.planner.scheduler_probed(scheduler, probe.is_ok());
        }
    }

    /// Check draining real servers (see [`Syncer::check_drains`]).
    pub async fn check_drains(&mut self) -> Result<SyncReport, DataplaneError> {
        self.syncer.check_drains(self.planner.desired()).await
    }

    /// Sync once the source is ready ([`SourceHandle::wait_ready`]), then whenever a source
    /// reports a change (at most once per `ipvs.minSyncPeriod`) and at least every
    /// `ipvs.syncPeriod`, until `shutdown` resolves; before each sync [`Engine::switch`] says
    /// whether the proxier may write (a takeover from kube-proxy, a handback), and between
    /// syncs the takeover's progress and kube-proxy's return are looked at when due
    /// ([`Engine::look_due`]). A failed sync is logged and retried after
    /// [`RETRY_INTERVAL`], doubling while it fails; the kernel is left as it is on shutdown
    /// (never flushed).
    pub async fn run(&mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        self.reads_beside = true;
        let source = self.source.clone();
        tokio::select! {
            _ = &mut shutdown => return,
            _ = source.wait_ready() => {}
        }
        let mut assigned = self.following.as_ref().map(|f| f.follower.assigned.clone());
        let mut unreadable = false;
        if let Some(rx) = &mut assigned {
            let first = tokio::select! {
                _ = &mut shutdown => return,
                first = first_assignment(rx) => first,
            };
            unreadable = first == Assigned::Unknown;
            if unreadable {
                self.assignment_unreadable();
            }
            self.apply_assigned(if unreadable { Assigned::Local } else { first })
                .await;
        }
        let mut retry = Duration::ZERO;
        loop {
            if let Some(wait) = self.switch().await {
                // Nothing is written: no sync, no drain check; source changes wait for the
                // first sync after the standby (a full one).
                let waited = self
                    .wait_for_sync(wait, &mut shutdown, &mut assigned, &mut unreadable)
                    .await;
                if !waited {
                    return;
                }
                continue;
            }
            let started = Instant::now();
            let failed = match self.sync().await {
                Ok(_) => false,
                Err(e) => {
                    tracing::error!("sync failed, will retry: {e}");
                    true
                }
            };
            let min_next = started + self.planner.config().ipvs.min_sync_period;
            let period = self.next_sync_in(failed, &mut retry);
            let waited = self
                .wait_for_sync(period, &mut shutdown, &mut assigned, &mut unreadable)
                .await;
            if !waited {
                return;
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(min_next) => {}
            }
        }
    }

    /// The node's NodeProxyConfig could not be read in [`ASSIGNMENT_WAIT`]: says so (log and
    /// observers) before programming with the local configuration.
    fn assignment_unreadable(&self) {
        tracing::warn!(
            resource = NODE_PROXY_CONFIGS_RESOURCE,
            "the node's NodeProxyConfig could not be read in {}s (see the watch errors): \
             programming with the local configuration, and applying the NodeProxyConfig \
             once it is read",
            ASSIGNMENT_WAIT.as_secs()
        );
        self.observer
            .resource_unavailable(NODE_PROXY_CONFIGS_RESOURCE, true);
    }

    /// How long after a sync the next one is due at the latest: `ipvs.syncPeriod`; after a
    /// failed sync `retry` (doubled, from [`RETRY_INTERVAL`] up to that period, and reset by a
    /// sync that succeeds); at once when a re-plan is pending; and no later than the syncer's
    /// next retry of failed ops, nor than the next observation after a failed one beside the
    /// syncs ([`Engine::next_read`]).
    fn next_sync_in(&self, failed: bool, retry: &mut Duration) -> Duration {
        let mut period = self.planner.config().ipvs.sync_period;
        if failed {
            // Retry soon rather than a whole syncPeriod later, backing off while it fails.
            *retry = (*retry * 2).clamp(RETRY_INTERVAL, period);
            period = *retry;
        } else {
            *retry = Duration::ZERO;
        }
        if self.planner.replan_pending() {
            // E.g. a scheduler was found missing: re-plan without waiting for a change.
            period = Duration::ZERO;
        }
        // A full sync whose read beside the syncs failed reads again when its backoff ends.
        if let Some(at) = self.next_read {
            period = period.min(at.saturating_duration_since(Instant::now()));
        }
        // Failed ops are retried per entry, when due (see `syncer`).
        if let Some(due) = self.syncer.next_retry() {
            period = period.min(due.saturating_duration_since(Instant::now()));
        }
        period
    }

    /// Waits for what triggers the next sync: a source change, `period` elapsed, or a new
    /// NodeProxyConfig assignment on `assigned` (applied here; `unreadable` is cleared once one
    /// is known), or, while the proxier programs, a change of the node's interfaces
    /// ([`Dataplane::interfaces_changed`]) that re-plans (an address that takes NodePorts came
    /// or went: a keepalived VIP failing over) or finds `kube-ipvs0` made again
    /// ([`Engine::interfaces_looked_at`]). Checks the draining real servers every [`DRAIN_CHECK_INTERVAL`] meanwhile,
    /// and, while the proxier programs on a node it may have taken over from kube-proxy, the
    /// takeover's progress and kube-proxy's return when due ([`Engine::look_due`]; kube-proxy
    /// back triggers the next turn, which writes nothing), and the end of a full sync's
    /// observation running beside the syncs ([`Engine::sync`]). While the proxier writes nothing
    /// ([`Engine::switch`]) only `period` and a new assignment count, and no drain is
    /// checked. False when `shutdown` resolved first.
    async fn wait_for_sync(
        &mut self,
        period: Duration,
        shutdown: &mut Pin<&mut impl Future<Output = ()>>,
        assigned: &mut Option<watch::Receiver<Assigned>>,
        unreadable: &mut bool,
    ) -> bool {
        let source = self.source.clone();
        let resync = tokio::time::sleep(period);
        tokio::pin!(resync);
        let programs = self.takeover.as_ref().is_none_or(|t| t.programs());
        // Out of `self` while waiting, so that the branches below may borrow `self`.
        let mut observing = self.observing.take();
        let woke = loop {
            let draining = programs && !self.syncer.drains().is_empty();
            let interfaces = self.syncer.dataplane_mut().interfaces_changed();
            tokio::select! {
                _ = &mut *shutdown => break false,
                _ = source.changed(), if programs => break true,
                _ = &mut resync => break true,
                // The full sync's observation ended: the next sync finishes it.
                _ = observation_ended(&mut observing), if programs => break true,
                next = next_assigned(assigned) => {
                    if std::mem::take(unreadable) && next != Assigned::Unknown {
                        tracing::info!("the node's NodeProxyConfig is readable now");
                        self.observer.resource_unavailable(NODE_PROXY_CONFIGS_RESOURCE, false);
                    }
                    self.apply_assigned(next).await;
                    break true;
                }
                _ = tokio::time::sleep_until(self.next_drain_check), if draining => {
                    self.next_drain_check = Instant::now() + DRAIN_CHECK_INTERVAL;
                    if let Err(e) = self.check_drains().await {
                        tracing::error!("drain check failed, will retry: {e}");
                    }
                }
                _ = interfaces, if programs => {
                    if self.interfaces_looked_at().await {
                        break true;
                    }
                }
                _ = self.look_due() => {
                    if self.look_between_syncs().await {
                        break true;
                    }
                }
            }
        };
        self.observing = observing;
        woke
    }
}

/// When the next observation beside the syncs may start after one that `failed`
/// ([`Engine::next_read`]): `retry` later (doubled, from [`RETRY_INTERVAL`] up to
/// `sync_period`, the failure logged); after one that succeeded, whenever due (`retry` reset).
fn read_ended(retry: &mut Duration, failed: bool, sync_period: Duration) -> Option<Instant> {
    if !failed {
        *retry = Duration::ZERO;
        return None;
    }
    *retry = (*retry * 2).clamp(RETRY_INTERVAL, sync_period);
    tracing::warn!(
        retry_in_ms = retry.as_millis() as u64,
        "the full sync's read of the kernel failed: the next read waits (counted in \
         kipvs_sync_errors_total{{cause=\"observe\"}})"
    );
    Some(Instant::now() + *retry)
}

/// Why a configuration cannot be put in force on this node (the message of its `Failed`
/// status).
#[derive(Debug, thiserror::Error)]
enum Rejection {
    /// It is not valid.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// Its scheduler is not available.
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// Its kernel settings could not be made.
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

impl Rejection {
    /// Whether the configuration itself is refused (invalid, a scheduler the kernel lacks:
    /// `ENOENT`, timeouts out of the kernel's range), not the attempt: a netlink or sysctl
    /// error, or every probe port taken, may pass, and a configuration put in force while the
    /// proxier wrote nothing is then admitted again at the next look ([`Engine::switch`]).
    fn is_refusal(&self) -> bool {
        match self {
            Rejection::Invalid(_) | Rejection::Settings(SettingsError::TimeoutsOutOfRange(_)) => {
                true
            }
            Rejection::Scheduler(SchedulerError::Refused { error, .. }) => {
                matches!(error, ipvs::Error::NotFound)
            }
            Rejection::Scheduler(SchedulerError::ProbePortsTaken { .. }) => false,
            Rejection::Scheduler(_) => true,
            Rejection::Settings(_) => false,
        }
    }
}

/// What a configuration passes before it is put in force: it is valid and, with `kernel` (the
/// proxier programs), the kernel has its scheduler ([`KernelSettings::check`]: a probe virtual
/// server is added and deleted) and its kernel settings are made ([`KernelSettings::apply`]).
async fn admit(
    kernel: Option<&dyn KernelSettings>,
    config: &ProxierConfiguration,
) -> Result<(), Rejection> {
    config.validate()?;
    if let Some(kernel) = kernel {
        kernel.check(config).await?;
        kernel.apply(config).await?;
    }
    Ok(())
}

/// Logs a configuration put in force as revision `name` over `old`: which of its settings wait
/// for a restart and which (`ignored`) this version leaves out.
fn announce(
    name: &str,
    old: &ProxierConfiguration,
    config: &ProxierConfiguration,
    ignored: &[String],
) {
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
    if !ignored.is_empty() {
        tracing::warn!(
            revision = name,
            "ignoring settings this kipvs version does not know (written by a newer \
             one?): {}",
            ignored.join(", ")
        );
    }
}

/// The first NodeProxyConfig assignment on `rx`, once known or after [`ASSIGNMENT_WAIT`]
/// ([`Assigned::Unknown`] then).
async fn first_assignment(rx: &mut watch::Receiver<Assigned>) -> Assigned {
    // Known or timed out: either way, what the receiver holds now is the answer.
    let _ = tokio::time::timeout(ASSIGNMENT_WAIT, rx.wait_for(|a| *a != Assigned::Unknown)).await;
    rx.borrow_and_update().clone()
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

#[cfg(test)]
mod tests;

//! The controller: the I/O around [`rollout::decide`].
//!
//! Reflectors keep ProxyConfigs, Nodes and NodeProxyConfigs in memory. A kube-runtime
//! [`Controller`] reconciles a ProxyConfig when it changes, and when a Node or NodeProxyConfig
//! changes in a way its decision can see ([`crate::triggers`]: relevance, then the ProxyConfigs
//! the change concerns), or when its NodeProxyConfig writes start or stop failing. A reconcile
//! builds the decision's input from the stores, hands the NodeProxyConfig writes to the
//! [`Writer`] (which sends them by server-side apply, controlling ownerReference to the
//! ProxyConfig, without the reconcile waiting for them), then writes the status (server-side
//! apply on the status subresource, only when it changed) and the Events. One decision per
//! ProxyConfig at a time, and at most one every [`MIN_RECONCILE_INTERVAL`].
//!
//! The stores lag the controller's own writes by a watch round trip, so the controller
//! remembers what it wrote (NodeProxyConfigs: [`crate::writer::WriterState::overlay`]; statuses:
//! `Expectations`) and lays that over the stores until they catch up; otherwise a quick
//! second reconcile would write the same nodes again (restarting their apply timeouts) or
//! decide from a stale status.

use crate::conditions::ConditionSet;
use crate::events::Publisher;
use crate::metrics::Metrics;
use crate::rollout::{
    self, Decision, Input, KUBE_PROXY_READ_INTERVAL, KubeProxyDaemonSet, NodeView, NpcView, Write,
};
use crate::stored::{StoredProxyConfig, UndecodableSpec};
use crate::triggers::{Concerned, node_triggers, npc_triggers, proxy_config_triggers};
use crate::writer::{Expected, WRITE_CONCURRENCY, Writer};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::proxyconfig::parse_selector;
use kipvs_crds::{
    NodeProxyConfig, OPERATOR_FIELD_MANAGER, ProxyConfig, ProxyConfigStatus, SERVICE_PROXY_LABEL,
};
use kube::api::{Patch, PatchParams};
use kube::core::Selector;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Requeue interval when nothing is pending (a periodic full check).
const RESYNC: Duration = Duration::from_secs(300);
/// Requeue after a failed reconcile.
const RETRY: Duration = Duration::from_secs(10);
/// Namespace and name of kube-proxy's DaemonSet (kubeadm's, kubespray's and the addon
/// manager's).
const KUBE_PROXY_DAEMONSET: (&str, &str) = ("kube-system", "kube-proxy");

/// The shortest time between two decisions of one ProxyConfig. Triggers that arrive in
/// between are merged into one decision at its end, so a rollout's stream of proxier reports
/// costs at most a few decisions a second (a 5,000-node decision is tens of milliseconds of
/// CPU) and a spec change waits at most this long.
pub const MIN_RECONCILE_INTERVAL: Duration = Duration::from_millis(500);

/// Why a reconcile failed. NodeProxyConfig writes do not fail a reconcile: the [`Writer`]
/// retries them and the ProxyConfig's status reports them.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ProxyConfig's status could not be written.
    #[error("apply ProxyConfig {name} status: {source}")]
    Status {
        /// The ProxyConfig.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    /// The cause, as `kipvs_operator_reconcile_failures_total{kind}` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Status { .. } => "status",
        }
    }
}

/// The controller's own status writes, until the store shows them.
#[derive(Debug, Default)]
struct Expectations {
    /// Per ProxyConfig: the resourceVersion it had when its status was written, and that status.
    statuses: HashMap<String, (Option<String>, ProxyConfigStatus)>,
}

/// What every reconcile shares.
pub struct Context {
    client: Client,
    proxy_configs: Store<StoredProxyConfig>,
    nodes: Store<Node>,
    npcs: Store<NodeProxyConfig>,
    events: Publisher,
    writer: Arc<Writer>,
    expectations: Mutex<Expectations>,
    metrics: Metrics,
    /// Set once the Node and NodeProxyConfig stores have listed everything ([`Context::stores_ready`]).
    ready: tokio::sync::OnceCell<()>,
    /// kube-proxy's DaemonSet as last read, and when ([`Context::kube_proxy`]).
    kube_proxy: tokio::sync::Mutex<Option<(std::time::Instant, KubeProxyDaemonSet)>>,
}

impl Context {
    /// A context over these stores, handing NodeProxyConfig writes to `writer`; `identity`
    /// names this replica in Events.
    pub fn new(
        client: Client,
        identity: &str,
        proxy_configs: Store<StoredProxyConfig>,
        nodes: Store<Node>,
        npcs: Store<NodeProxyConfig>,
        writer: Arc<Writer>,
    ) -> Self {
        Context {
            events: Publisher::new(client.clone(), identity),
            client,
            proxy_configs,
            nodes,
            npcs,
            writer,
            expectations: Mutex::new(Expectations::default()),
            metrics: Metrics::new(),
            ready: tokio::sync::OnceCell::new(),
            kube_proxy: tokio::sync::Mutex::new(None),
        }
    }

    /// kube-proxy's DaemonSet (`kube-system/kube-proxy`) as [`KubeProxyDaemonSet`], read
    /// again once [`KUBE_PROXY_READ_INTERVAL`] has passed since the last read. Not found, not
    /// allowed (an install without the operator's kube-system Role) or unreachable:
    /// [`KubeProxyDaemonSet::Unknown`] (logged at debug level; the decision then goes by the
    /// proxiers' reports alone).
    pub async fn kube_proxy(&self) -> KubeProxyDaemonSet {
        let mut last = self.kube_proxy.lock().await;
        if let Some((at, seen)) = *last
            && at.elapsed() < KUBE_PROXY_READ_INTERVAL
        {
            return seen;
        }
        let (namespace, name) = KUBE_PROXY_DAEMONSET;
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), namespace);
        let seen = match api.get_opt(name).await {
            Ok(Some(ds)) => KubeProxyDaemonSet::of(&ds),
            Ok(None) => KubeProxyDaemonSet::Unknown,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read kube-proxy's DaemonSet");
                KubeProxyDaemonSet::Unknown
            }
        };
        *last = Some((std::time::Instant::now(), seen));
        seen
    }

    /// Waits until the Node and NodeProxyConfig stores have listed everything (a decision over
    /// a partial list could delete NodeProxyConfigs); false if a reflector stopped.
    ///
    /// One task waits on the stores for all reconciles, the others on this context's cell:
    /// kube-runtime's `Store::wait_until_ready` keeps a single waker (a oneshot receiver), so of
    /// several reconciles waiting at once only the last one would be woken, and a ProxyConfig's
    /// reconcile would stay pending for good (after an apiserver outage a restarted operator
    /// would never reconcile one of two ProxyConfigs again; `hack/fleet.sh --faults` checks it).
    pub async fn stores_ready(&self) -> bool {
        self.ready
            .get_or_try_init(|| async {
                self.nodes.wait_until_ready().await?;
                self.npcs.wait_until_ready().await
            })
            .await
            .is_ok()
    }

    /// The writer this context hands NodeProxyConfig writes to.
    pub fn writer(&self) -> &Arc<Writer> {
        &self.writer
    }

    /// Records into `metrics` (by default, a registry of its own).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }
}

/// Runs the controller until `shutdown` completes (then lets the reconciles in flight finish):
/// starts the reflectors, waits until they have listed everything (a decision over a partial
/// list could delete NodeProxyConfigs), then reconciles. Dropping the future stops everything
/// it started, the NodeProxyConfig writers included (leadership lost: no write after it).
///
/// # Errors
/// A reflector that stopped before it was ready.
pub async fn run(
    client: Client,
    identity: &str,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let watches = Watches::start(&client, &metrics);
    // A ProxyConfig whose NodeProxyConfig writes start or stop failing reports it.
    let (writer, write_failures) = Writer::new(
        client.clone(),
        metrics.clone(),
        Some(watches.proxy_configs.clone()),
    );
    let triggers = stream::select(watches.changes, write_failures).boxed();
    let _workers = writer.start(WRITE_CONCURRENCY);
    let ctx = Arc::new(
        Context::new(
            client,
            identity,
            watches.proxy_configs,
            watches.nodes,
            watches.npcs,
            writer,
        )
        .with_metrics(metrics),
    );
    // The trigger stream also drives the Node and NodeProxyConfig reflectors; readiness is
    // awaited inside the first reconciles (see `reconcile`).
    watches
        .controller
        .reconcile_on(triggers)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_paced, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(proxyconfig = %object.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
    Ok(())
}

/// What the controller watches: the reflectors of ProxyConfigs (driving the controller),
/// Nodes and NodeProxyConfigs, and the ProxyConfigs each Node or NodeProxyConfig change
/// concerns ([`crate::triggers`]).
struct Watches {
    controller: Controller<StoredProxyConfig>,
    proxy_configs: Store<StoredProxyConfig>,
    nodes: Store<Node>,
    npcs: Store<NodeProxyConfig>,
    /// Driving the Node and NodeProxyConfig reflectors as it is polled.
    changes: stream::BoxStream<'static, ObjectRef<StoredProxyConfig>>,
}

impl Watches {
    /// Starts the three reflectors (they run as the controller and `changes` are polled).
    fn start(client: &Client, metrics: &Metrics) -> Self {
        let (proxy_configs, pc_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let (npcs, npc_writer) = reflector::store();
        let pc_api: Api<StoredProxyConfig> = Api::all(client.clone());
        let pc_events =
            reflector::reflector(pc_writer, watcher(pc_api, watcher::Config::default()));
        // No debounce: kube-runtime's debounce restarts with every trigger, so a steady stream of
        // triggers postpones the reconcile indefinitely. Without it, triggers that arrive while a
        // reconcile of the same ProxyConfig runs are merged into one reconcile right after it, so
        // the controller runs at most back to back and never waits for a quiet moment.
        let controller = Controller::for_stream(
            proxy_config_triggers(pc_events, proxy_configs.clone(), metrics.clone()),
            proxy_configs.clone(),
        )
        .with_config(ControllerConfig::default().debounce(Duration::ZERO));
        let concerned = Arc::new(Concerned::new(
            proxy_configs.clone(),
            nodes.clone(),
            npcs.clone(),
        ));
        let node_api: Api<Node> = Api::all(client.clone());
        let node_events = node_triggers(
            reflector::reflector(node_writer, watcher(node_api, watcher::Config::default()))
                .default_backoff(),
            concerned.clone(),
        );
        let npc_api: Api<NodeProxyConfig> = Api::all(client.clone());
        let npc_events = npc_triggers(
            reflector::reflector(npc_writer, watcher(npc_api, watcher::Config::default()))
                .default_backoff(),
            concerned,
        );
        Watches {
            controller,
            proxy_configs,
            nodes,
            npcs,
            changes: stream::select(node_events, npc_events).boxed(),
        }
    }
}

/// [`reconcile_stored`], then holding this ProxyConfig's slot for [`MIN_RECONCILE_INTERVAL`]:
/// triggers meanwhile make one reconcile after.
async fn reconcile_paced(pc: Arc<StoredProxyConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = reconcile_stored(pc, ctx).await;
    tokio::time::sleep(MIN_RECONCILE_INTERVAL).await;
    result
}

/// Reconciles one stored ProxyConfig: [`reconcile`] if its spec decodes; otherwise reports
/// that on the object itself (Degraded `InvalidSpec` with the decoding error, one Event) and
/// writes nothing else. Either way the other ProxyConfigs are not affected.
///
/// Runs in a `reconcile` span that names the ProxyConfig (its decision in a `decide` span, its
/// status write in a `write_status` one, both at debug level).
///
/// # Errors
/// As [`reconcile`]; for an undecodable object, a failed status write.
#[tracing::instrument(name = "reconcile", skip_all, fields(proxyconfig = %stored.name_any()))]
pub async fn reconcile_stored(
    stored: Arc<StoredProxyConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let metrics = ctx.metrics.clone();
    let result = match stored.decode() {
        Ok(pc) => reconcile(Arc::new(pc), ctx).await,
        Err(error) => {
            metrics
                .reconcile
                .failures
                .with_label_values(&["decode"])
                .inc();
            report_undecodable(&stored, &error, &ctx).await
        }
    };
    metrics
        .reconcile
        .duration
        .observe(start.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics.reconcile.total.with_label_values(&[outcome]).inc();
    if let Err(e) = &result {
        metrics
            .reconcile
            .failures
            .with_label_values(&[e.kind()])
            .inc();
    }
    result
}

/// The status of a ProxyConfig whose spec does not decode: its previous status (the rollout's
/// memory is kept) with Degraded `InvalidSpec`, and an Event unless Degraded said so already.
async fn report_undecodable(
    stored: &StoredProxyConfig,
    error: &UndecodableSpec,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = stored.name_any();
    let message = error.to_string();
    let message = message.as_str();
    tracing::warn!(proxyconfig = %name, error = %message, "spec cannot be read");
    let previous = stored.status.clone().unwrap_or_default();
    let mut conditions = ConditionSet::new(
        &previous.conditions,
        Timestamp::now(),
        stored.metadata.generation,
    );
    conditions.invalid_spec(message);
    let status = ProxyConfigStatus {
        observed_generation: stored.metadata.generation,
        conditions: conditions.finish(),
        ..previous.clone()
    };
    let said = previous
        .conditions
        .iter()
        .any(|c| c.reason == "InvalidSpec" && c.message == message);
    // The status first, then the Event (as in `reconcile`).
    if stored.status.as_ref() != Some(&status) {
        write_status(
            ctx,
            &name,
            stored.metadata.resource_version.clone(),
            &status,
        )
        .await?;
    }
    if !said {
        let note = rollout::Note {
            warning: true,
            reason: "InvalidSpec",
            message: message.to_owned(),
        };
        if let Err(e) = ctx.events.publish(stored, &note).await {
            tracing::warn!(proxyconfig = %name, error = %e, "cannot publish Event");
        }
    }
    Ok(Action::requeue(RESYNC))
}

/// Reconciles one ProxyConfig: decide, hand the NodeProxyConfig writes to the [`Writer`]
/// (not waiting for them), write the status if it changed, then publish the Events.
///
/// # Errors
/// A failed status write (then no Event is published).
pub async fn reconcile(pc: Arc<ProxyConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Until the Node and NodeProxyConfig reflectors have listed everything, do nothing.
    if !ctx.stores_ready().await {
        return Ok(Action::requeue(RETRY));
    }
    let now = Timestamp::now();
    let name = pc.name_any();
    let kube_proxy = ctx.kube_proxy().await;
    let (decision, previous, seen) = decide_from_stores(&pc, &ctx, kube_proxy, now);
    let skipped = submit_writes(&pc, &ctx, &decision, &seen);
    ctx.metrics
        .reconcile
        .decision_writes
        .observe(decision.writes.len() as f64);
    ctx.metrics.rollout(&name, &decision.status);

    // The status first, then the Events: the Events of a decision are its transitions from the
    // previous status (a stage started, a node failed), so if the status write fails, the next
    // reconcile decides from the same previous status and publishes them then, once. Published
    // before a lost status write they would be published again.
    if previous.as_ref() != Some(&decision.status) {
        write_status(
            &ctx,
            &name,
            pc.metadata.resource_version.clone(),
            &decision.status,
        )
        .await?;
    }
    for note in &decision.events {
        match ctx.events.publish(&*pc, note).await {
            Ok(()) => ctx.metrics.writes.total.with_label_values(&["event"]).inc(),
            Err(e) => {
                tracing::warn!(proxyconfig = %name, error = %e, reason = note.reason, "cannot publish Event")
            }
        }
        tracing::info!(proxyconfig = %name, reason = note.reason, "{}", note.message);
    }
    Ok(Action::requeue(next_reconcile(&decision, skipped)))
}

/// Hands `decision`'s writes to the writer: its label changes, and those of its NodeProxyConfig
/// writes whose spec is still as decided from (`seen`): one written since (by another
/// ProxyConfig the node moved to, by the writer and confirmed meanwhile, or by hand) is left
/// out. Checked and submitted under the writer's lock, so that no write is sent in between.
/// Returns how many NodeProxyConfig writes were left out.
fn submit_writes(
    pc: &ProxyConfig,
    ctx: &Context,
    decision: &Decision,
    seen: &HashMap<String, Option<Option<i64>>>,
) -> usize {
    let mut writer = ctx.writer.lock();
    let mut writes: Vec<_> = decision
        .writes
        .iter()
        .filter(|w| spec_generation(&ctx.npcs, w.node()) == seen[w.node()])
        .cloned()
        .collect();
    let skipped = decision.writes.len() - writes.len();
    writes.extend(decision.labels.iter().cloned().map(Write::Label));
    let owner = pc
        .controller_owner_ref(&())
        .expect("a stored ProxyConfig has a name and a uid");
    writer.submit(&owner, writes);
    skipped
}

/// When to reconcile again after `decision`: at once if `skipped` writes were left out (the
/// change that made them stale may have triggered only another ProxyConfig, e.g. the one the
/// node moved to, or this reconcile itself: deciding again from the stores as they are now
/// is the only way not to wait for the resync); otherwise when the decision asks (a soak or
/// apply timeout), at most [`RESYNC`].
fn next_reconcile(decision: &Decision, skipped: usize) -> Duration {
    if skipped > 0 {
        return Duration::ZERO;
    }
    decision.requeue_after.unwrap_or(RESYNC).min(RESYNC)
}

/// `metadata.generation` of the node's NodeProxyConfig in `npcs` (None: no object; Some(None):
/// no generation).
fn spec_generation(npcs: &Store<NodeProxyConfig>, node: &str) -> Option<Option<i64>> {
    npcs.get(&ObjectRef::new(node))
        .map(|npc| npc.metadata.generation)
}

/// The decision for `pc` from the stores (and `kube_proxy`, kube-proxy's DaemonSet as last
/// read), with the writer's unconfirmed writes laid over and
/// its failing writes reported; the status it started from ([`status_to_continue`]); and, per
/// node written, the spec generation of the NodeProxyConfig it decided from
/// ([`spec_generation`]).
#[tracing::instrument(name = "decide", level = "debug", skip_all)]
fn decide_from_stores(
    pc: &ProxyConfig,
    ctx: &Context,
    kube_proxy: KubeProxyDaemonSet,
    now: Timestamp,
) -> (
    Decision,
    Option<ProxyConfigStatus>,
    HashMap<String, Option<Option<i64>>>,
) {
    let name = pc.name_any();
    let node_objects = ctx.nodes.state();
    let npc_objects = ctx.npcs.state();
    let proxy_configs = ctx.proxy_configs.state();
    let others = other_selectors(&proxy_configs, &name);
    let live: HashSet<String> = proxy_configs.iter().map(|p| p.name_any()).collect();
    let by_name: HashMap<&str, &NodeProxyConfig> = npc_objects
        .iter()
        .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), &**n))
        .collect();
    let (overlay, failing_writes) = {
        let mut writer = ctx.writer.lock();
        // From the same snapshot the decision reads: a label the live store shows but the
        // snapshot does not would be forgotten here and asked for again by the decision.
        let labels: HashMap<&str, &String> = node_objects
            .iter()
            .filter_map(|n| {
                let value = n.metadata.labels.as_ref()?.get(SERVICE_PROXY_LABEL)?;
                Some((n.metadata.name.as_deref()?, value))
            })
            .collect();
        let label = |node: &str| labels.get(node).map(|v| (*v).clone());
        (writer.overlay(&by_name, &label, now), writer.failing(&name))
    };
    let status = status_to_continue(pc, ctx, &name);
    let views: Vec<NodeView<'_>> = node_objects
        .iter()
        .map(|n| NodeView::from_node(n))
        .collect();
    let npcs = npc_views(&by_name, &live, &overlay);
    let decision = rollout::decide(&Input {
        name: &name,
        generation: pc.metadata.generation,
        spec: &pc.spec,
        status: status.as_ref(),
        annotations: pc.metadata.annotations.as_ref(),
        others: &others,
        nodes: &views,
        npcs: &npcs,
        failing_writes: &failing_writes,
        kube_proxy,
        now,
    });
    let seen = decision
        .writes
        .iter()
        .map(|w| {
            let generation = by_name.get(w.node()).map(|n| n.metadata.generation);
            (w.node().to_owned(), generation)
        })
        .collect();
    (decision, status, seen)
}

/// The node selectors of the ProxyConfigs other than `name`, for conflict detection (no
/// selector selects every node; one that does not parse selects none).
fn other_selectors(proxy_configs: &[Arc<StoredProxyConfig>], name: &str) -> Vec<Selector> {
    proxy_configs
        .iter()
        .filter(|other| other.name_any() != name)
        .filter_map(|other| match &other.node_selector {
            None => Some(Selector::default()),
            Some(s) => parse_selector(s, "").ok(),
        })
        .collect()
}

/// The status the decision continues from: the one this controller wrote last while the
/// store still shows the version it was written over, else the stored one.
fn status_to_continue(pc: &ProxyConfig, ctx: &Context, name: &str) -> Option<ProxyConfigStatus> {
    let mut expectations = ctx.expectations.lock().expect("expectations lock");
    match expectations.statuses.get(name) {
        Some((version, status)) if *version == pc.metadata.resource_version => Some(status.clone()),
        _ => {
            expectations.statuses.remove(name);
            pc.status.clone()
        }
    }
}

/// The NodeProxyConfigs as the decision sees them: the stored ones (a controller that no
/// longer exists in `live` makes an orphan, adopted by whoever selects the node), with the
/// writer's unconfirmed writes (`overlay`) laid over.
fn npc_views<'a>(
    by_name: &HashMap<&'a str, &'a NodeProxyConfig>,
    live: &'a HashSet<String>,
    overlay: &'a [(String, Expected)],
) -> HashMap<&'a str, NpcView<'a>> {
    let mut npcs: HashMap<&str, NpcView<'_>> = by_name
        .iter()
        .map(|(name, npc)| {
            let mut view = NpcView::from_npc(npc);
            view.owner = view.owner.filter(|o| live.contains(*o));
            (*name, view)
        })
        .collect();
    for (node, expected) in overlay {
        match expected {
            Expected::Assigned {
                owner,
                revision,
                assigned_at,
                service_proxy,
            } => {
                let status = by_name.get(node.as_str()).and_then(|n| n.status.as_ref());
                npcs.insert(
                    node,
                    NpcView {
                        owner: Some(owner),
                        revision,
                        assigned_at: *assigned_at,
                        service_proxy: *service_proxy,
                        status,
                        config: None,
                    },
                );
            }
            Expected::Deleted => {
                npcs.remove(node.as_str());
            }
            Expected::Labelled(_) => {}
        }
    }
    npcs
}

/// Server-side apply of the status subresource; remembers it until the store shows it.
#[tracing::instrument(level = "debug", skip_all)]
async fn write_status(
    ctx: &Context,
    name: &str,
    resource_version: Option<String>,
    status: &ProxyConfigStatus,
) -> Result<(), Error> {
    // The response is read leniently too: it is the stored object, which may not decode.
    let api: Api<StoredProxyConfig> = Api::all(ctx.client.clone());
    let body = serde_json::json!({
        "apiVersion": ProxyConfig::api_version(&()),
        "kind": ProxyConfig::kind(&()),
        "metadata": { "name": name },
        "status": status,
    });
    let params = PatchParams::apply(OPERATOR_FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(&body))
        .await
        .map_err(|source| Error::Status {
            name: name.to_owned(),
            source,
        })?;
    ctx.metrics
        .writes
        .total
        .with_label_values(&["status"])
        .inc();
    ctx.expectations
        .lock()
        .expect("expectations lock")
        .statuses
        .insert(name.to_owned(), (resource_version, status.clone()));
    Ok(())
}

/// Logs and retries soon.
pub fn error_policy(pc: Arc<StoredProxyConfig>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(proxyconfig = %pc.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{node, proxy_config};
    use http::{Request, Response};
    use kipvs_crds::{NodeProxyConfigSpec, ProxyConfigSpec};
    use kube::client::Body;
    use kube::runtime::watcher::Event;

    fn store<K>(objects: Vec<K>) -> (Store<K>, reflector::store::Writer<K>)
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for object in objects {
            writer.apply_watcher_event(&Event::InitApply(object));
        }
        writer.apply_watcher_event(&Event::InitDone);
        (store, writer)
    }

    /// A write left out because the node's NodeProxyConfig changed after the decision read it
    /// (here: the node moved to another ProxyConfig, which wrote it) reconciles this
    /// ProxyConfig again at once, so its status does not wait for the resync (5 minutes).
    #[tokio::test]
    async fn a_write_left_out_because_the_node_moved_reconciles_again_at_once() {
        let (service, _server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let pc = proxy_config("fleet", ProxyConfigSpec::default());
        let (pcs, _pcs_writer) = store(vec![StoredProxyConfig::from(pc.clone())]);
        let (nodes, _nodes_writer) = store(vec![node("n1", &[])]);
        let (npcs, mut npcs_writer) = store(Vec::<NodeProxyConfig>::new());
        let (writer, _) = Writer::new(client.clone(), Metrics::new(), None);
        let ctx = Context::new(client, "operator-0", pcs, nodes, npcs, writer);

        let (decision, _, seen) =
            decide_from_stores(&pc, &ctx, KubeProxyDaemonSet::Unknown, Timestamp::now());
        assert_eq!(decision.writes.len(), 1, "n1 is written");
        assert_ne!(next_reconcile(&decision, 0), Duration::ZERO);
        // Meanwhile the node moved: another ProxyConfig wrote its NodeProxyConfig.
        let mut moved = NodeProxyConfig::new(
            "n1",
            NodeProxyConfigSpec {
                revision: "other".into(),
                assigned_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
                config: Default::default(),
            },
        );
        moved.metadata.generation = Some(1);
        npcs_writer.apply_watcher_event(&Event::Apply(moved));

        let skipped = submit_writes(&pc, &ctx, &decision, &seen);
        assert_eq!(skipped, 1, "not written over the other ProxyConfig's");
        assert_eq!(ctx.writer.lock().queued(), 0);
        assert_eq!(next_reconcile(&decision, skipped), Duration::ZERO);
    }
}

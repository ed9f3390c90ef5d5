//! Which changes of Nodes and NodeProxyConfigs trigger a reconcile, and of which ProxyConfigs.
//!
//! Two filters, applied in this order to every watch event:
//!
//! 1. **Relevance** ([`node_relevance`], [`npc_relevance`]): a change must touch what a decision
//!    reads. A proxier refreshing `status.lastSyncTime` or a kubelet heartbeat triggers nothing
//!    (with N nodes such refreshes arrive every 60/N s).
//! 2. **Concern** ([`Concerned`]): a relevant change reconciles only the ProxyConfigs whose
//!    decision can change with it, not every ProxyConfig:
//!    - the ProxyConfig that controls the node's NodeProxyConfig (its controller ownerReference,
//!      read from the event's own object for a NodeProxyConfig, so that a deletion still names
//!      it);
//!    - the ProxyConfigs whose `spec.nodeSelector` matches the Node's labels now (they may
//!      select it, adopt its orphaned NodeProxyConfig or see it as a conflict);
//!    - those that matched the labels the last time this Node was seen (a node leaving a
//!      selection changes that ProxyConfig's counts and conflicts).
//!
//!    A ProxyConfig whose selector cannot be read counts as matching every node (it is
//!    reconciled, and reports its spec as invalid, rather than missed).
//!
//! A deletion is a change: a Node or NodeProxyConfig deleted without finalizers comes in its
//! watch event as it was, without `deletionTimestamp`, so [`mark_deleted`] sets one before the
//! relevance filter sees it. A deleted ProxyConfig reconciles every other ProxyConfig
//! ([`proxy_config_triggers`]): it may have conflicted with them on nodes both select, and its
//! NodeProxyConfigs are orphans that another may adopt.

use crate::metrics::Metrics;
use crate::rollout::{NodeView, NpcView};
use crate::stored::StoredProxyConfig;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::NodeProxyConfig;
use kipvs_crds::proxyconfig::parse_selector;
use kube::core::SelectorExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// A watch event (a stream's item, as reflectors yield them).
pub type WatchEvent<K> = Result<watcher::Event<K>, watcher::Error>;

/// `event` with its object marked as being deleted when the event is its deletion: the API
/// server sends an object deleted without finalizers as it was, without `deletionTimestamp`.
pub fn mark_deleted<K: Resource>(event: watcher::Event<K>) -> watcher::Event<K> {
    match event {
        watcher::Event::Delete(mut object) => {
            let meta = object.meta_mut();
            if meta.deletion_timestamp.is_none() {
                meta.deletion_timestamp = Some(Time(Timestamp::now()));
            }
            watcher::Event::Delete(object)
        }
        event => event,
    }
}

/// The ProxyConfigs to reconcile for the Node watch `events` (applied to the stores already):
/// relevant changes ([`node_relevance`]) and deletions, mapped by [`Concerned::node`].
pub fn node_triggers(
    events: impl Stream<Item = WatchEvent<Node>>,
    concerned: Arc<Concerned>,
) -> impl Stream<Item = ObjectRef<StoredProxyConfig>> {
    events
        .map_ok(mark_deleted)
        .touched_objects()
        .predicate_filter(node_relevance, Default::default())
        .filter_map(|node| std::future::ready(node.ok()))
        .flat_map(move |node| stream::iter(concerned.node(&node)))
}

/// The ProxyConfigs to reconcile for the NodeProxyConfig watch `events` (applied to the
/// stores already): relevant changes ([`npc_relevance`]) and deletions, mapped by
/// [`Concerned::npc`].
pub fn npc_triggers(
    events: impl Stream<Item = WatchEvent<NodeProxyConfig>>,
    concerned: Arc<Concerned>,
) -> impl Stream<Item = ObjectRef<StoredProxyConfig>> {
    events
        .map_ok(mark_deleted)
        .touched_objects()
        .predicate_filter(npc_relevance, Default::default())
        .filter_map(|npc| std::future::ready(npc.ok()))
        .flat_map(move |npc| stream::iter(concerned.npc(&npc)))
}

/// The ProxyConfigs to reconcile for the ProxyConfig watch `events` (applied to `store`
/// already): a created or changed one itself; on a deletion, every other one. Errors pass
/// through (the controller backs off). A deletion, and a completed relist (which drops from
/// the store what was deleted while the watch was down, without a Delete event), also drops
/// the `metrics` series of every ProxyConfig no longer in the store.
pub fn proxy_config_triggers(
    events: impl Stream<Item = WatchEvent<StoredProxyConfig>>,
    store: Store<StoredProxyConfig>,
    metrics: Metrics,
) -> impl Stream<Item = Result<StoredProxyConfig, watcher::Error>> {
    events.flat_map(move |event| {
        let live = |name: &str| store.get(&ObjectRef::new(name)).is_some();
        let triggered = match event {
            Ok(watcher::Event::Apply(pc) | watcher::Event::InitApply(pc)) => vec![Ok(pc)],
            Ok(watcher::Event::Delete(_)) => {
                metrics.retain_rollouts(live);
                store
                    .state()
                    .iter()
                    .map(|pc| Ok(StoredProxyConfig::clone(pc)))
                    .collect()
            }
            Ok(watcher::Event::InitDone) => {
                metrics.retain_rollouts(live);
                Vec::new()
            }
            Ok(watcher::Event::Init) => Vec::new(),
            Err(e) => vec![Err(e)],
        };
        stream::iter(triggered)
    })
}

/// What a Node change must look like to matter: labels, the autoscaler taint, readiness and
/// deletion (not heartbeats or images).
pub fn node_relevance(node: &Node) -> Option<u64> {
    let view = NodeView::from_node(node);
    let mut hasher = DefaultHasher::new();
    view.labels.hash(&mut hasher);
    view.skip.map(|s| s as u8).hash(&mut hasher);
    Some(hasher.finish())
}

/// What a NodeProxyConfig change must look like to matter: its spec (`metadata.generation`),
/// its controller, deletion, and the proxier's verdict (observed revision, phase, health, the
/// service proxy phase: the node's label follows it). Not
/// `status.lastSyncTime`, `message` or `syncErrors`: a proxier refreshing its status must not
/// trigger reconciles (with N nodes such refreshes arrive every 60/N s and, behind a resetting
/// debounce, would starve the controller).
pub fn npc_relevance(npc: &NodeProxyConfig) -> Option<u64> {
    let view = NpcView::from_npc(npc);
    let status = npc.status.as_ref();
    let mut hasher = DefaultHasher::new();
    npc.metadata.generation.hash(&mut hasher);
    npc.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    view.owner.hash(&mut hasher);
    view.revision.hash(&mut hasher);
    status
        .and_then(|s| s.observed_revision.as_deref())
        .hash(&mut hasher);
    status
        .and_then(|s| s.phase)
        .map(|p| p as u8)
        .hash(&mut hasher);
    status.and_then(|s| s.healthy).hash(&mut hasher);
    status
        .and_then(|s| s.service_proxy)
        .map(|p| p as u8)
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Maps a Node or NodeProxyConfig change to the ProxyConfigs it concerns (see the module docs).
pub struct Concerned {
    proxy_configs: Store<StoredProxyConfig>,
    nodes: Store<Node>,
    npcs: Store<NodeProxyConfig>,
    /// Per Node: the ProxyConfigs whose selector matched it when it was last mapped.
    matched: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Concerned {
    /// Over the controller's stores (read when an event is mapped: the reflectors have applied
    /// the event already).
    pub fn new(
        proxy_configs: Store<StoredProxyConfig>,
        nodes: Store<Node>,
        npcs: Store<NodeProxyConfig>,
    ) -> Self {
        Concerned {
            proxy_configs,
            nodes,
            npcs,
            matched: Mutex::default(),
        }
    }

    /// The ProxyConfigs a change of `node` concerns.
    pub fn node(&self, node: &Node) -> Vec<ObjectRef<StoredProxyConfig>> {
        let name = node.name_any();
        let owner = self
            .npcs
            .get(&ObjectRef::new(&name))
            .and_then(|npc| NpcView::from_npc(&npc).owner.map(str::to_owned));
        let labels = (node.metadata.deletion_timestamp.is_none()).then(|| node.labels());
        self.concerned(&name, labels, owner)
    }

    /// The ProxyConfigs a change of `npc` concerns.
    pub fn npc(&self, npc: &NodeProxyConfig) -> Vec<ObjectRef<StoredProxyConfig>> {
        let name = npc.name_any();
        let owner = NpcView::from_npc(npc).owner.map(str::to_owned);
        let node = self.nodes.get(&ObjectRef::new(&name));
        let labels = node.as_ref().map(|n| n.labels());
        self.concerned(&name, labels, owner)
    }

    /// `owner`, the ProxyConfigs matching `labels` (None: the Node is gone) and those that
    /// matched `node` last time.
    fn concerned(
        &self,
        node: &str,
        labels: Option<&BTreeMap<String, String>>,
        owner: Option<String>,
    ) -> Vec<ObjectRef<StoredProxyConfig>> {
        let now: BTreeSet<String> = match labels {
            None => BTreeSet::new(),
            Some(labels) => self
                .proxy_configs
                .state()
                .iter()
                .filter(|pc| match &pc.node_selector {
                    None => true,
                    Some(s) => parse_selector(s, "").map_or(true, |s| s.matches(labels)),
                })
                .map(|pc| pc.name_any())
                .collect(),
        };
        let mut concerned = now.clone();
        {
            let mut matched = self.matched.lock().expect("matched lock");
            let before = if labels.is_some() {
                matched.insert(node.to_owned(), now)
            } else {
                matched.remove(node)
            };
            concerned.extend(before.into_iter().flatten());
        }
        concerned.extend(owner);
        concerned.into_iter().map(|n| ObjectRef::new(&n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;
    use kipvs_crds::{NodePhase, NodeProxyConfigSpec, NodeProxyConfigStatus, ProxyConfig};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn pc(name: &str, selector: serde_json::Value) -> StoredProxyConfig {
        let pc: ProxyConfig = serde_json::from_value(json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
            "metadata": {"name": name},
            "spec": {"nodeSelector": selector, "config": {}},
        }))
        .unwrap();
        pc.into()
    }

    fn npc(name: &str, owner: &str) -> NodeProxyConfig {
        let mut npc = NodeProxyConfig::new(
            name,
            NodeProxyConfigSpec {
                revision: "r1".into(),
                assigned_at: Time(Timestamp::UNIX_EPOCH),
                config: Default::default(),
            },
        );
        npc.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "kipvs.io/v1alpha1".into(),
            kind: "ProxyConfig".into(),
            name: owner.into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        npc
    }

    fn store<K>(objects: Vec<K>) -> (Store<K>, Writer<K>)
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Default + Eq + Hash + Clone,
    {
        let mut writer = Writer::default();
        writer.apply_watcher_event(&Event::Init);
        for object in objects {
            writer.apply_watcher_event(&Event::InitApply(object));
        }
        writer.apply_watcher_event(&Event::InitDone);
        (writer.as_reader(), writer)
    }

    fn names(refs: Vec<ObjectRef<StoredProxyConfig>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn a_change_reconciles_its_owner_and_the_selectors_that_match_not_every_proxyconfig() {
        let (pcs, _) = store(vec![
            pc("blue", json!({"matchLabels": {"pool": "blue"}})),
            pc("green", json!({"matchLabels": {"pool": "green"}})),
            pc("bad", json!({"matchLabels": {"in valid": "x"}})),
        ]);
        let n1 = node("n1", json!({"pool": "blue"}));
        let (nodes, mut node_writer) = store(vec![n1.clone()]);
        let (npcs, mut npc_writer) = store(vec![npc("n1", "blue")]);
        let concerned = Concerned::new(pcs, nodes, npcs);

        // A proxier's report on n1: its owner (and the unreadable selector), not green.
        assert_eq!(names(concerned.npc(&npc("n1", "blue"))), ["bad", "blue"]);
        // n1 moves from blue to green: both (blue must delete its NodeProxyConfig).
        let moved = node("n1", json!({"pool": "green"}));
        node_writer.apply_watcher_event(&Event::Apply(moved.clone()));
        assert_eq!(names(concerned.node(&moved)), ["bad", "blue", "green"]);
        // Once blue's NodeProxyConfig is gone, a later change of n1 concerns green only.
        npc_writer.apply_watcher_event(&Event::Delete(npc("n1", "blue")));
        assert_eq!(names(concerned.node(&moved)), ["bad", "green"]);
        // A deleted NodeProxyConfig still names its owner.
        let mut gone = npc("n1", "blue");
        gone.status = Some(NodeProxyConfigStatus {
            phase: Some(NodePhase::Applied),
            ..Default::default()
        });
        assert_eq!(names(concerned.npc(&gone)), ["bad", "blue", "green"]);
    }

    /// Issue 23: a Node deleted mid-rollout (its watch event carries no deletionTimestamp) or
    /// a deleted ProxyConfig triggered no reconcile; the status stayed stale until the resync.
    #[tokio::test]
    async fn deleting_a_node_or_a_proxyconfig_reconciles_the_proxyconfigs_it_concerned() {
        let (pcs, mut pc_writer) = store(vec![
            pc("blue", json!({"matchLabels": {"pool": "blue"}})),
            pc("all", json!({})),
        ]);
        let n1 = node("n1", json!({"pool": "blue"}));
        let (nodes, mut node_writer) = store(vec![n1.clone()]);
        let (npcs, _) = store(Vec::<NodeProxyConfig>::new());
        let concerned = Arc::new(Concerned::new(pcs.clone(), nodes, npcs));

        // As the reflector yields them: the list, then the deletion (the store applied it).
        node_writer.apply_watcher_event(&Event::Delete(n1.clone()));
        let events = stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(n1.clone())),
            Ok(Event::InitDone),
            Ok(Event::Delete(n1)),
        ]);
        let triggered: Vec<_> = node_triggers(events, concerned).collect().await;
        assert_eq!(names(triggered), ["all", "blue", "all", "blue"]);

        let metrics = Metrics::new();
        metrics.rollout("blue", &Default::default());
        metrics.rollout("all", &Default::default());
        let blue = pc("blue", json!({"matchLabels": {"pool": "blue"}}));
        pc_writer.apply_watcher_event(&Event::Delete(blue.clone()));
        let events = stream::iter([
            Ok(Event::Apply(pc("all", json!({})))),
            Ok(Event::Delete(blue)),
        ]);
        let triggered: Vec<_> = proxy_config_triggers(events, pcs, metrics.clone())
            .map(|pc| pc.unwrap().name_any())
            .collect()
            .await;
        assert_eq!(
            triggered,
            ["all", "all"],
            "itself when changed, the others on a deletion"
        );
        let text = metrics.encode();
        assert!(!text.contains(r#"proxyconfig="blue""#), "{text}");
        assert!(
            text.contains(r#"kipvs_operator_rollout_nodes{proxyconfig="all",state="total"} 0"#)
        );
    }

    #[test]
    fn status_refreshes_do_not_trigger_but_verdicts_and_specs_do() {
        let mut npc = NodeProxyConfig::new(
            "a",
            NodeProxyConfigSpec {
                revision: "r1".into(),
                assigned_at: Time(Timestamp::UNIX_EPOCH),
                config: Default::default(),
            },
        );
        npc.metadata.generation = Some(1);
        npc.status = Some(NodeProxyConfigStatus {
            observed_revision: Some("r1".into()),
            phase: Some(NodePhase::Applied),
            healthy: Some(true),
            last_sync_time: Some(Time(Timestamp::UNIX_EPOCH)),
            message: None,
            sync_errors: Some(0),
            ..Default::default()
        });
        let before = npc_relevance(&npc);
        let mut refreshed = npc.clone();
        let status = refreshed.status.as_mut().unwrap();
        status.last_sync_time = Some(Time(Timestamp::now()));
        status.sync_errors = Some(3);
        status.message = Some("sync error".into());
        assert_eq!(npc_relevance(&refreshed), before, "a heartbeat");
        let mut unhealthy = npc.clone();
        unhealthy.status.as_mut().unwrap().healthy = Some(false);
        assert_ne!(npc_relevance(&unhealthy), before);
        let mut failed = npc.clone();
        failed.status.as_mut().unwrap().phase = Some(NodePhase::Failed);
        assert_ne!(npc_relevance(&failed), before);
        let mut edited = npc.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(npc_relevance(&edited), before, "a spec edit (drift)");
        let mut handing_back = npc.clone();
        handing_back.status.as_mut().unwrap().service_proxy =
            Some(kipvs_crds::ServiceProxyPhase::HandingBack);
        assert_ne!(
            npc_relevance(&handing_back),
            before,
            "the service proxy phase (the node's label follows it)"
        );
    }
}

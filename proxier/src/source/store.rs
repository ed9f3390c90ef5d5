//! The proxier's view of the cluster: Services, EndpointSlices and the own Node, with the
//! set of Services whose objects changed since the last sync.
//!
//! Every source writes here — the manifests source with [`Store::replace_all`] on each file
//! change, the Kubernetes source with per-object upserts and deletes from its watches (and
//! [`Store::replace_services`] / [`Store::replace_slices`] of a whole list, converted as it
//! came: [`Store::convert_service`]) — and the sync loop takes [`Store::take_dirty`] to re-plan
//! only what changed. A write that changes nothing marks nothing dirty, so a relist of an
//! unchanged cluster costs no planning.
//!
//! Services and EndpointSlices are converted as they arrive ([`super::convert`]) into
//! what planning reads of them ([`ServiceInfo`], [`SliceInfo`]: parsed addresses, shared
//! strings, nothing else of the API object); the API objects are not kept. So a write counts
//! as a change only when something planning reads changed (a new `resourceVersion` or
//! annotation alone is no change). The own Node is kept whole (one object; the health
//! checks read its taints and conditions).

use super::convert;
use crate::model::objects::{Interner, NodeInfo, ServiceInfo, SliceInfo};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

/// Annotation on EndpointSlices with the time of the Pod or Service change that last
/// changed them (RFC 3339); the start of kube-proxy's network programming latency.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// `(namespace, name)` of a namespaced object.
pub type ObjectKey = (String, String);

/// The key of an object's metadata (`default` namespace when unset, as kubectl does).
pub fn object_key(meta: &ObjectMeta) -> ObjectKey {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The Service an EndpointSlice belongs to (`kubernetes.io/service-name` label, same
/// namespace), if labelled.
fn slice_service(slice: &SliceInfo) -> Option<ObjectKey> {
    let service = slice.service.as_ref()?;
    Some((slice.namespace.to_string(), service.to_string()))
}

/// What changed since the last [`Store::take_dirty`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    /// Every Service must be re-planned (first sync, the Node or the configuration changed).
    pub all: bool,
    /// Services whose Service object or EndpointSlices changed (including deleted ones);
    /// not collected while `all` is set (at start-up, 50k keys nobody reads).
    pub services: BTreeSet<ObjectKey>,
}

impl Dirty {
    /// Service `key` changed.
    fn insert(&mut self, key: ObjectKey) {
        if !self.all {
            self.services.insert(key);
        }
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.all && self.services.is_empty()
    }
}

/// Numbers of object changes (writes that changed something), by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeCounts {
    /// Service adds, updates and deletes.
    pub services: u64,
    /// EndpointSlice adds, updates and deletes.
    pub endpoint_slices: u64,
}

/// A Service converted for the store ([`Store::convert_service`]): what the store keeps of it,
/// under its namespace/name.
#[derive(Debug)]
pub struct ConvertedService {
    key: ObjectKey,
    info: Box<ServiceInfo>,
}

/// An EndpointSlice converted for the store ([`Store::convert_slice`]), with its
/// `endpoints.kubernetes.io/last-change-trigger-time`.
#[derive(Debug)]
pub struct ConvertedSlice {
    key: ObjectKey,
    info: Box<SliceInfo>,
    trigger_time: Option<SystemTime>,
}

/// Every object of a source at once, in the source's order: what [`Store::replace_all`] takes
/// (the manifests source reads one per poll, in file and document order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// `v1` Services.
    pub services: Vec<Service>,
    /// `discovery.k8s.io/v1` EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// `v1` Nodes.
    pub nodes: Vec<Node>,
    /// `kipvs.io/v1alpha1` NodeProxyConfigs (the manifests mode follows the one named after
    /// the node, as the Kubernetes mode follows the API's).
    pub node_proxy_configs: Vec<DynamicObject>,
}

impl Snapshot {
    /// Append `other`'s objects (the next file's).
    pub fn extend(&mut self, other: Snapshot) {
        self.services.extend(other.services);
        self.endpoint_slices.extend(other.endpoint_slices);
        self.nodes.extend(other.nodes);
        self.node_proxy_configs.extend(other.node_proxy_configs);
    }

    /// The Node named `name`, if the manifests hold one.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|node| node.metadata.name.as_deref() == Some(name))
    }
}

/// Objects by key, plus the dirty set. Starts all-dirty.
#[derive(Debug)]
pub struct Store {
    /// Boxed: a B-tree node holds 11 entries whether used or not, so a small entry wastes
    /// less than a 184-byte one.
    services: BTreeMap<ObjectKey, Box<ServiceInfo>>,
    /// Boxed, as `services`.
    slices: BTreeMap<ObjectKey, Box<SliceInfo>>,
    /// Shares the strings of the converted objects.
    strings: Interner,
    /// The slices of each Service, sorted (almost always one: a `Vec`, not a `BTreeSet` node).
    slices_by_service: BTreeMap<ObjectKey, Vec<ObjectKey>>,
    node: Option<Node>,
    /// What planning reads of [`Store::node`].
    node_info: Option<NodeInfo>,
    dirty: Dirty,
    /// Changes since the store was created.
    changes: ChangeCounts,
    /// Changes since the last [`Store::take_dirty`].
    pending: ChangeCounts,
    /// [`LAST_CHANGE_TRIGGER_TIME`]s of the EndpointSlice changes not yet taken.
    trigger_times: Vec<SystemTime>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            strings: Interner::default(),
            slices_by_service: BTreeMap::new(),
            node: None,
            node_info: None,
            dirty: Dirty {
                all: true,
                services: BTreeSet::new(),
            },
            changes: ChangeCounts::default(),
            pending: ChangeCounts::default(),
            trigger_times: Vec::new(),
        }
    }
}

impl Store {
    /// Convert `service` into what the store keeps of it (its strings shared with the store's),
    /// to put in later ([`Store::replace_services`]); the store's objects are not changed.
    pub fn convert_service(&mut self, service: &Service) -> ConvertedService {
        ConvertedService {
            key: object_key(&service.metadata),
            info: Box::new(convert::service(service, &mut self.strings)),
        }
    }

    /// Add or replace a Service; marks it dirty if it changed.
    pub fn upsert_service(&mut self, service: Service) {
        let converted = self.convert_service(&service);
        self.put_service(converted);
    }

    /// [`upsert_service`](Self::upsert_service) of a converted Service.
    fn put_service(&mut self, ConvertedService { key, info }: ConvertedService) {
        if self.services.get(&key) != Some(&info) {
            self.services.insert(key.clone(), info);
            self.dirty.insert(key);
            self.count_service_change();
        }
    }

    /// Remove a Service; marks it dirty if it existed.
    pub fn delete_service(&mut self, key: &ObjectKey) {
        if self.services.remove(key).is_some() {
            self.dirty.insert(key.clone());
            self.count_service_change();
        }
    }

    /// Convert `slice` into what the store keeps of it, with its trigger time, to put in later
    /// ([`Store::replace_slices`]); the store's objects are not changed.
    pub fn convert_slice(&mut self, slice: &EndpointSlice) -> ConvertedSlice {
        ConvertedSlice {
            key: object_key(&slice.metadata),
            info: Box::new(convert::slice(slice, &mut self.strings)),
            trigger_time: trigger_time(slice),
        }
    }

    /// Add or replace an EndpointSlice; marks its Service (old and new, if the label moved)
    /// dirty if it changed.
    pub fn upsert_slice(&mut self, slice: EndpointSlice) {
        let converted = self.convert_slice(&slice);
        self.put_slice(converted);
    }

    /// [`upsert_slice`](Self::upsert_slice) of a converted EndpointSlice.
    fn put_slice(&mut self, converted: ConvertedSlice) {
        let ConvertedSlice {
            key,
            info,
            trigger_time,
        } = converted;
        if self.slices.get(&key) == Some(&info) {
            return;
        }
        if self.slices.contains_key(&key) {
            self.delete_slice(&key); // counts the change
        } else {
            self.count_slice_change();
        }
        self.trigger_times.extend(trigger_time);
        if let Some(service) = slice_service(&info) {
            let keys = self.slices_by_service.entry(service.clone()).or_default();
            if let Err(at) = keys.binary_search(&key) {
                keys.insert(at, key.clone());
            }
            self.dirty.insert(service);
        }
        self.slices.insert(key, info);
    }

    /// Remove an EndpointSlice; marks its Service dirty if it existed.
    pub fn delete_slice(&mut self, key: &ObjectKey) {
        let Some(old) = self.slices.remove(key) else {
            return;
        };
        self.count_slice_change();
        if let Some(service) = slice_service(&old) {
            if let Some(keys) = self.slices_by_service.get_mut(&service) {
                keys.retain(|k| k != key);
                if keys.is_empty() {
                    self.slices_by_service.remove(&service);
                }
            }
            self.dirty.insert(service);
        }
    }

    /// Set the own Node (or forget it). Marks everything dirty only if what planning reads
    /// ([`NodeInfo`]: its presence, zone label, addresses) changed, so routine status updates
    /// (conditions, heartbeats, taints) cost no re-plan.
    pub fn set_node(&mut self, node: Option<Node>) {
        let info = node.as_ref().map(convert::node);
        if info != self.node_info {
            self.mark_all_dirty();
            self.node_info = info;
        }
        self.node = node;
    }

    /// Mark everything dirty (the configuration changed).
    pub fn mark_all_dirty(&mut self) {
        self.dirty.all = true;
        self.dirty.services.clear();
    }

    /// Make the store hold exactly `snapshot`'s Services and EndpointSlices and the Node named
    /// `node_name`; only objects that differ mark their Services dirty.
    pub fn replace_all(&mut self, snapshot: Snapshot, node_name: &str) {
        let node = snapshot.node(node_name).cloned();
        self.set_node(node);
        let services = snapshot.services.iter();
        let services = services.map(|s| self.convert_service(s)).collect();
        self.replace_services(services);
        let slices = snapshot.endpoint_slices.iter();
        let slices = slices.map(|s| self.convert_slice(s)).collect();
        self.replace_slices(slices);
    }

    /// Make the store hold exactly `services` (a source's whole list of them): Services not
    /// listed are deleted; only those that differ mark their Services dirty.
    pub fn replace_services(&mut self, services: Vec<ConvertedService>) {
        let listed: BTreeSet<&ObjectKey> = services.iter().map(|s| &s.key).collect();
        let gone: Vec<ObjectKey> = (self.services.keys())
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        drop(listed);
        for k in &gone {
            self.delete_service(k);
        }
        for s in services {
            self.put_service(s);
        }
    }

    /// Make the store hold exactly `slices` (a source's whole list of them): EndpointSlices
    /// not listed are deleted; only those that differ mark their Services dirty.
    pub fn replace_slices(&mut self, slices: Vec<ConvertedSlice>) {
        let listed: BTreeSet<&ObjectKey> = slices.iter().map(|s| &s.key).collect();
        let gone: Vec<ObjectKey> = (self.slices.keys())
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        drop(listed);
        for k in &gone {
            self.delete_slice(k);
        }
        for s in slices {
            self.put_slice(s);
        }
    }

    /// Whether something changed since the last [`take_dirty`](Self::take_dirty): a sync is
    /// due.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Changes since the store was created, by kind (monotonic).
    pub fn change_totals(&self) -> ChangeCounts {
        self.changes
    }

    /// Changes since the last [`take_dirty`](Self::take_dirty), by kind.
    pub fn pending_changes(&self) -> ChangeCounts {
        self.pending
    }

    /// Take the [`LAST_CHANGE_TRIGGER_TIME`]s of the EndpointSlice writes since the last call
    /// (one per changed slice carrying a parsable annotation).
    pub fn take_trigger_times(&mut self) -> Vec<SystemTime> {
        std::mem::take(&mut self.trigger_times)
    }

    fn count_service_change(&mut self) {
        self.changes.services += 1;
        self.pending.services += 1;
    }

    fn count_slice_change(&mut self) {
        self.changes.endpoint_slices += 1;
        self.pending.endpoint_slices += 1;
    }

    /// Take (and clear) what changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        self.pending = ChangeCounts::default();
        std::mem::take(&mut self.dirty)
    }

    /// A Service by key.
    pub fn service(&self, key: &ObjectKey) -> Option<&ServiceInfo> {
        self.services.get(key).map(|s| &**s)
    }

    /// All Services, in namespace/name order.
    pub fn services(&self) -> impl Iterator<Item = (&ObjectKey, &ServiceInfo)> {
        self.services.iter().map(|(k, s)| (k, &**s))
    }

    /// The EndpointSlices of a Service, in name order.
    pub fn slices_of(&self, service: &ObjectKey) -> Vec<&SliceInfo> {
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k).map(|s| &**s))
            .collect()
    }

    /// The own Node, if known.
    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// The own Node's kubelet version (`status.nodeInfo.kubeletVersion`, e.g. `v1.28.2`), if
    /// known.
    pub fn kubelet_version(&self) -> Option<&str> {
        let info = self.node.as_ref()?.status.as_ref()?.node_info.as_ref()?;
        Some(info.kubelet_version.as_str())
    }

    /// What planning reads of the own Node, if known.
    pub fn node_info(&self) -> Option<&NodeInfo> {
        self.node_info.as_ref()
    }

    /// Number of Services held.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

/// The slice's [`LAST_CHANGE_TRIGGER_TIME`], if set and RFC 3339.
fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let value = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME)?;
    let at: k8s_openapi::jiff::Timestamp = value.parse().ok()?;
    Some(at.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::objects::SERVICE_NAME_LABEL;
    use k8s_openapi::api::core::v1::NodeAddress;
    use std::collections::BTreeMap;

    fn service(ns: &str, name: &str, ip: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(ns: &str, name: &str, service: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    SERVICE_NAME_LABEL.to_string(),
                    service.to_string(),
                )])),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: None,
            ports: None,
        }
    }

    fn key(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    #[test]
    fn only_changes_mark_services_dirty() {
        let mut store = Store::default();
        store.upsert_service(service("a", "web", "10.96.0.1"));
        store.upsert_slice(slice("a", "web-1", "web"));
        assert!(store.take_dirty().all);
        store.upsert_service(service("a", "web", "10.96.0.1"));
        store.upsert_slice(slice("a", "web-1", "web"));
        assert!(store.take_dirty().is_empty());
        let mut s = slice("a", "web-1", "web");
        s.address_type = "IPv6".into();
        store.upsert_slice(s);
        assert_eq!(store.take_dirty().services, [key("a", "web")].into());
        assert_eq!(store.slices_of(&key("a", "web")).len(), 1);
    }

    #[test]
    fn node_status_updates_do_not_replan() {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, Taint};
        let node = |condition: &str, zone: &str| Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(
                    [("topology.kubernetes.io/zone".to_string(), zone.to_string())].into(),
                ),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: (condition == "tainted").then(|| {
                    vec![Taint {
                        key: "ToBeDeletedByClusterAutoscaler".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: "192.168.0.5".into(),
                }]),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: condition.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        };
        let mut store = Store::default();
        store.set_node(Some(node("True", "a")));
        store.take_dirty();
        store.set_node(Some(node("tainted", "a")));
        assert!(store.take_dirty().is_empty());
        assert!(
            store
                .node()
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .taints
                .is_some()
        );
        store.set_node(Some(node("tainted", "b")));
        assert!(store.take_dirty().all);
        store.set_node(None);
        assert!(store.take_dirty().all);
    }

    #[test]
    fn relabelled_slice_dirties_both_services() {
        let mut store = Store::default();
        store.upsert_slice(slice("a", "s1", "web"));
        store.take_dirty();
        store.upsert_slice(slice("a", "s1", "api"));
        assert_eq!(
            store.take_dirty().services,
            [key("a", "api"), key("a", "web")].into()
        );
        assert!(store.slices_of(&key("a", "web")).is_empty());
    }

    #[test]
    fn changes_are_counted_by_kind_and_trigger_times_kept() {
        let mut store = Store::default();
        store.upsert_service(service("a", "web", "10.96.0.1"));
        store.upsert_service(service("a", "web", "10.96.0.1"));
        let mut s = slice("a", "web-1", "web");
        s.metadata.annotations = Some(BTreeMap::from([(
            LAST_CHANGE_TRIGGER_TIME.to_string(),
            "2026-11-22T10:00:00Z".to_string(),
        )]));
        store.upsert_slice(s.clone());
        s.address_type = "IPv6".into();
        store.upsert_slice(s);
        store.delete_slice(&key("a", "web-1"));
        let counts = ChangeCounts {
            services: 1,
            endpoint_slices: 3,
        };
        assert_eq!(store.change_totals(), counts);
        assert_eq!(store.pending_changes(), counts);
        assert!(store.is_dirty());
        store.take_dirty();
        assert!(!store.is_dirty());
        assert_eq!(store.pending_changes(), ChangeCounts::default());
        assert_eq!(store.change_totals(), counts);
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_341_600);
        assert_eq!(store.take_trigger_times(), [at, at]);
        assert!(store.take_trigger_times().is_empty());
    }

    #[test]
    fn replace_all_deletes_missing_objects() {
        let mut store = Store::default();
        store.replace_all(
            Snapshot {
                services: vec![
                    service("a", "web", "10.96.0.1"),
                    service("b", "db", "10.96.0.2"),
                ],
                endpoint_slices: vec![slice("b", "db-1", "db")],
                ..Default::default()
            },
            "n1",
        );
        store.take_dirty();
        store.replace_all(
            Snapshot {
                services: vec![service("a", "web", "10.96.0.1")],
                endpoint_slices: vec![],
                ..Default::default()
            },
            "n1",
        );
        let dirty = store.take_dirty();
        assert!(!dirty.all);
        assert_eq!(dirty.services, [key("b", "db")].into());
        assert_eq!(store.service_count(), 1);
    }
}

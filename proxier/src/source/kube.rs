//! The Kubernetes API source: kube-runtime watchers on Services, EndpointSlices
//! (`discovery.k8s.io/v1`) and the own Node, writing into the [`Store`] through a
//! [`SourceHandle`].
//!
//! - Each watcher lists, then watches; on `410 Gone` or a broken watch it lists again. A list
//!   replaces that kind in the store at once when complete ([`Store::replace_services`],
//!   [`Store::replace_slices`]), as client-go's informers deliver a relist as one `Replace`: no
//!   sync sees half a list, a list that breaks off changes nothing, objects deleted while the
//!   watch was down go away then, and unchanged objects cost nothing. Until then the list is
//!   held converted to what the store keeps ([`Store::convert_service`]), [`LIST_BATCH`]
//!   objects at a time, never whole as Kubernetes objects (which for 50k Services and their
//!   EndpointSlices is several times the memory; `hack/bench-api.sh` measures it).
//! - Errors never clear the store: while the API server is unreachable the last known
//!   objects stay, so nothing is deleted from the kernel. Each watcher retries with the
//!   backoff of [`Retry`] (a few seconds while the API server is away, client-go's 0.8 s to
//!   30 s when it answers with errors, a relist at once after `410 Gone`).
//! - The handle is marked ready (the engine may program) once every kind has been listed
//!   once.
//! - An API server that does not serve `discovery.k8s.io/v1` EndpointSlices (Kubernetes
//!   < 1.21 answers 404) is reported once as an error and in
//!   `kipvs_api_resource_unavailable{resource="endpointslices.discovery.k8s.io/v1"}`; the
//!   proxier then runs with Services only (virtual servers without real servers) and keeps
//!   retrying, picking the EndpointSlices up when they appear.
//!
//! Services and EndpointSlices are filtered as kube-proxy filters them
//! ([`PROXY_LABEL_SELECTOR`]); the Node by the field selector `metadata.name=<node>`.

use super::store::{ConvertedService, ConvertedSlice, Store, object_key};
use super::{SourceHandle, is_not_found};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kipvs_node_status::Retry;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

/// kube-proxy's label selector for Services and EndpointSlices: not handed to another proxy
/// (`service.kubernetes.io/service-proxy-name`), not headless.
pub const PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// The EndpointSlice resource the proxier needs, as named in logs and metrics.
pub const ENDPOINT_SLICES_RESOURCE: &str = "endpointslices.discovery.k8s.io/v1";

/// How many objects of a list in progress are held as Kubernetes objects before they are
/// converted (kube's watcher lists in pages of 500).
pub const LIST_BATCH: usize = 500;

/// Convert the objects of `batch` into `listed`, under the store's lock (their strings are
/// shared with the store's); the store's objects are not changed, so nobody is told.
fn convert_into<K: Kind>(
    handle: &SourceHandle,
    batch: &mut Vec<K>,
    listed: &mut Vec<K::Converted>,
) {
    handle
        .with_store(|store| listed.extend(batch.drain(..).map(|object| K::convert(store, object))));
}

/// One kind's list in progress: its objects converted so far, and those not converted yet
/// (converted [`LIST_BATCH`] at a time).
struct Listing<K: Kind> {
    listed: Vec<K::Converted>,
    batch: Vec<K>,
}

impl<K: Kind> Default for Listing<K> {
    fn default() -> Self {
        Listing {
            listed: Vec::new(),
            batch: Vec::new(),
        }
    }
}

impl<K: Kind> Listing<K> {
    /// A list starts (again): what an earlier one gathered goes.
    fn clear(&mut self) {
        self.listed.clear();
        self.batch.clear();
    }

    /// A listed object.
    fn add(&mut self, handle: &SourceHandle, object: K) {
        self.batch.push(object);
        if self.batch.len() == LIST_BATCH {
            convert_into::<K>(handle, &mut self.batch, &mut self.listed);
        }
    }

    /// The list is complete: every object of it, converted.
    fn done(&mut self, handle: &SourceHandle) -> Vec<K::Converted> {
        convert_into::<K>(handle, &mut self.batch, &mut self.listed);
        std::mem::take(&mut self.listed)
    }
}

/// A kind the source watches and how it goes into the store.
trait Kind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// Name in logs.
    const NAME: &'static str;
    /// Its watch, in logs.
    const WATCH: &'static str;
    /// Whether the proxier can run without it when the API server does not serve it.
    const OPTIONAL: bool;
    fn apply(store: &mut Store, object: Self);
    fn delete(store: &mut Store, object: &Self);
    /// What a listed object is held as until its list completes: what the store keeps of it.
    type Converted: Send;
    /// Convert a listed object (under the store's lock: its strings are shared with the store's).
    fn convert(store: &mut Store, object: Self) -> Self::Converted;
    /// Make the store hold exactly the objects of a complete list.
    fn replace(store: &mut Store, listed: Vec<Self::Converted>);
}

impl Kind for Service {
    const NAME: &'static str = "Service";
    const WATCH: &'static str = "Service watch";
    const OPTIONAL: bool = false;
    fn apply(store: &mut Store, object: Self) {
        store.upsert_service(object);
    }
    fn delete(store: &mut Store, object: &Self) {
        store.delete_service(&object_key(&object.metadata));
    }
    type Converted = ConvertedService;
    fn convert(store: &mut Store, object: Self) -> ConvertedService {
        store.convert_service(&object)
    }
    fn replace(store: &mut Store, listed: Vec<ConvertedService>) {
        store.replace_services(listed);
    }
}

impl Kind for EndpointSlice {
    const NAME: &'static str = "EndpointSlice";
    const WATCH: &'static str = "EndpointSlice watch";
    const OPTIONAL: bool = true;
    fn apply(store: &mut Store, object: Self) {
        store.upsert_slice(object);
    }
    fn delete(store: &mut Store, object: &Self) {
        store.delete_slice(&object_key(&object.metadata));
    }
    type Converted = ConvertedSlice;
    fn convert(store: &mut Store, object: Self) -> ConvertedSlice {
        store.convert_slice(&object)
    }
    fn replace(store: &mut Store, listed: Vec<ConvertedSlice>) {
        store.replace_slices(listed);
    }
}

impl Kind for Node {
    const NAME: &'static str = "Node";
    const WATCH: &'static str = "Node watch";
    const OPTIONAL: bool = false;
    fn apply(store: &mut Store, object: Self) {
        store.set_node(Some(object));
    }
    fn delete(store: &mut Store, _: &Self) {
        store.set_node(None);
    }
    type Converted = Node;
    fn convert(_: &mut Store, object: Self) -> Node {
        object
    }
    fn replace(store: &mut Store, listed: Vec<Node>) {
        store.set_node(listed.into_iter().next());
    }
}

/// Marks the handle ready once every kind has been listed once.
struct Synced {
    handle: SourceHandle,
    kinds: Mutex<BTreeSet<&'static str>>,
}

impl Synced {
    fn mark(&self, kind: &'static str) {
        let mut kinds = self.kinds.lock().expect("synced lock");
        if kinds.insert(kind) && kinds.len() == 3 {
            tracing::info!("Services, EndpointSlices and the Node listed; programming starts");
            self.handle.mark_ready();
        }
    }
}

/// The Kubernetes API source for one node.
#[derive(Clone)]
pub struct KubeSource {
    /// The API client (in-cluster, a kubeconfig, or a test double).
    pub client: Client,
    /// This node's name (its Node object is watched).
    pub node_name: String,
}

impl KubeSource {
    /// Watch everything into `handle` forever (see module docs).
    pub async fn run(self, handle: SourceHandle) {
        let synced = Arc::new(Synced {
            handle: handle.clone(),
            kinds: Mutex::default(),
        });
        let labels = watcher::Config::default().labels(PROXY_LABEL_SELECTOR);
        let node = watcher::Config::default().fields(&format!("metadata.name={}", self.node_name));
        tokio::join!(
            self.follow::<Service>(labels.clone(), &handle, &synced),
            self.follow::<EndpointSlice>(labels, &handle, &synced),
            self.follow::<Node>(node, &handle, &synced),
        );
    }

    /// Apply one kind's watch events to the store, forever.
    async fn follow<K: Kind>(
        &self,
        config: watcher::Config,
        handle: &SourceHandle,
        synced: &Synced,
    ) {
        let api = Api::<K>::all(self.client.clone());
        let mut events = watcher::watcher(api, config).boxed();
        let mut retry = Retry::new(K::WATCH);
        let mut listing = Listing::<K>::default();
        let mut unavailable = false;
        while let Some(event) = events.next().await {
            if event.is_ok() {
                retry.succeeded();
            } else {
                // A failed list starts again with `Init`: free what it held during the backoff.
                listing = Listing::default();
            }
            match event {
                Ok(Event::Init) => listing.clear(),
                Ok(Event::InitApply(object)) => listing.add(handle, object),
                Ok(Event::InitDone) => {
                    let listed = listing.done(handle);
                    tracing::info!(kind = K::NAME, count = listed.len(), "listed");
                    handle.update(|store| K::replace(store, listed));
                    if std::mem::take(&mut unavailable) {
                        tracing::info!(
                            resource = ENDPOINT_SLICES_RESOURCE,
                            "the API server serves it now"
                        );
                        handle.resource_unavailable(ENDPOINT_SLICES_RESOURCE, false);
                    }
                    synced.mark(K::NAME);
                }
                Ok(Event::Apply(object)) => handle.update(|store| K::apply(store, object)),
                Ok(Event::Delete(object)) => handle.update(|store| K::delete(store, &object)),
                Err(e) if K::OPTIONAL && is_not_found(&e) => {
                    if !std::mem::replace(&mut unavailable, true) {
                        tracing::error!(
                            resource = ENDPOINT_SLICES_RESOURCE,
                            "the API server does not serve {ENDPOINT_SLICES_RESOURCE} (404; \
                             Kubernetes >= 1.21 is needed): running with Services only, \
                             without endpoints, and retrying"
                        );
                        handle.resource_unavailable(ENDPOINT_SLICES_RESOURCE, true);
                    }
                    synced.mark(K::NAME);
                    retry.wait(&e).await;
                }
                Err(e) => retry.failed(&e, "the last known objects").await,
            }
        }
    }
}

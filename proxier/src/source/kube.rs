//! The Kubernetes API source: kube-runtime watchers on Services, EndpointSlices and the own
//! Node, writing into the [`Store`] through a [`SourceHandle`].
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
//! - Whether the watches are in contact with the API server, and since when not, is told to a
//!   [`Contact`] ([`KubeSource::run_in`]): the proxier's readiness and the remembering of the
//!   API server's addresses ([`super::apiserver`]) follow it.
//! - EndpointSlices are read as `discovery.k8s.io/v1` where the API server serves them, else as
//!   `discovery.k8s.io/v1beta1` (Kubernetes 1.20), chosen from API discovery before the watch
//!   starts ([`choose_slice_version`]) and logged. A v1beta1 object becomes a v1 one as it
//!   arrives ([`super::v1beta1`]), so everything past the watch is the same for both.
//! - An API server that serves neither (discovery finds no `endpointslices` in either version),
//!   or stops serving the one read (its watch answers 404), is reported once as an error and in
//!   `kipvs_api_resource_unavailable{resource="endpointslices.discovery.k8s.io/v1"}` (the
//!   resource read, or v1 when there is none); the proxier then runs with Services only
//!   (virtual servers without real servers, and the EndpointSlices last listed, if any) and
//!   asks discovery again with backoff, picking the EndpointSlices up when they appear.
//!
//! Services and EndpointSlices are filtered as kube-proxy filters them
//! ([`PROXY_LABEL_SELECTOR`]); the Node by the field selector `metadata.name=<node>`.

use super::store::{ConvertedService, ConvertedSlice, Store, object_key};
use super::{SourceHandle, is_not_found, v1beta1};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kipvs_proxier_contract::Retry;
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

/// kube-proxy's label selector for Services and EndpointSlices: not handed to another proxy
/// (`service.kubernetes.io/service-proxy-name`), not headless.
pub const PROXY_LABEL_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// An EndpointSlice API version the source can read. Kubernetes API: `discovery.k8s.io/v1beta1`
/// is served in 1.17–1.24, `discovery.k8s.io/v1` from 1.21, so a 1.20 API server has only
/// v1beta1 and a 1.25 one only v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceVersion {
    /// `discovery.k8s.io/v1` (Kubernetes 1.21 and newer): read wherever it is served.
    V1,
    /// `discovery.k8s.io/v1beta1` (Kubernetes 1.17–1.24): read where v1 is not served.
    V1beta1,
}

impl SliceVersion {
    /// Every version, the preferred first.
    pub const ALL: [SliceVersion; 2] = [SliceVersion::V1, SliceVersion::V1beta1];

    /// Its group version, as discovery names it (`discovery.k8s.io/v1`).
    pub fn group_version(self) -> &'static str {
        match self {
            SliceVersion::V1 => "discovery.k8s.io/v1",
            SliceVersion::V1beta1 => "discovery.k8s.io/v1beta1",
        }
    }

    /// Its resource, as named in logs and in `kipvs_api_resource_unavailable`
    /// (`endpointslices.discovery.k8s.io/v1`).
    pub fn resource(self) -> &'static str {
        match self {
            SliceVersion::V1 => "endpointslices.discovery.k8s.io/v1",
            SliceVersion::V1beta1 => "endpointslices.discovery.k8s.io/v1beta1",
        }
    }
}

/// The EndpointSlice version to read, from what discovery answered: `served` holds the
/// resource lists (`GET /apis/<group>/<version>`, an `APIResourceList`) of the group versions
/// the API server serves, in any order and with any other group versions among them. The first
/// of [`SliceVersion::ALL`] whose list names `endpointslices`; `None` when no list does (a
/// server older than 1.17, or one that has the resource switched off).
pub fn choose_slice_version(served: &[APIResourceList]) -> Option<SliceVersion> {
    SliceVersion::ALL.into_iter().find(|version| {
        served.iter().any(|list| {
            list.group_version == version.group_version()
                && list.resources.iter().any(|r| r.name == "endpointslices")
        })
    })
}

/// Which EndpointSlice version to read, from the API server's discovery: `GET
/// /apis/discovery.k8s.io/v1`, then `/apis/discovery.k8s.io/v1beta1` if v1 has no EndpointSlices,
/// and [`choose_slice_version`] of the answers (a 404 is a group version not served).
///
/// # Errors
/// The first failed request but a 404: the API server could not be reached or answered with
/// another error.
async fn discover_slice_version(client: &Client) -> kube::Result<Option<SliceVersion>> {
    let mut served = Vec::new();
    for version in SliceVersion::ALL {
        match client
            .list_api_group_resources(version.group_version())
            .await
        {
            Ok(list) => served.push(list),
            Err(kube::Error::Api(status)) if status.code == 404 => continue,
            Err(e) => return Err(e),
        }
        if let Some(chosen) = choose_slice_version(&served) {
            return Ok(Some(chosen));
        }
    }
    Ok(None)
}

/// The 404 the watch of a resource that is not served fails with: what the retry waits on
/// when discovery finds no EndpointSlices.
fn not_served(resource: &str) -> watcher::Error {
    let message = format!("{resource} is not served");
    let status = Status::failure(&message, "NotFound").with_code(404);
    watcher::Error::InitialListFailed(kube::Error::Api(status.boxed()))
}

/// The EndpointSlice resource reported not served (logged once, 1 in
/// `kipvs_api_resource_unavailable`), until EndpointSlices are listed again.
#[derive(Default)]
struct Unserved(Option<&'static str>);

impl Unserved {
    /// The API server does not serve `resource`: report it, unless it is reported already.
    fn report(&mut self, handle: &SourceHandle, resource: &'static str) {
        match self.0.replace(resource) {
            Some(reported) if reported == resource => return,
            Some(reported) => handle.resource_unavailable(reported, false),
            None => {}
        }
        tracing::error!(
            resource,
            "the API server does not serve {resource} (Kubernetes >= 1.20 serves EndpointSlices \
             as discovery.k8s.io/v1 or v1beta1): running with Services only, without endpoints, \
             and retrying"
        );
        handle.resource_unavailable(resource, true);
    }

    /// EndpointSlices were listed: what was reported is served now.
    fn served(&mut self, handle: &SourceHandle) {
        if let Some(resource) = self.0.take() {
            tracing::info!(resource, "EndpointSlices are served now");
            handle.resource_unavailable(resource, false);
        }
    }
}

/// `event` with its object made a `B` by `f`.
fn map_event<A, B>(event: Event<A>, f: impl FnOnce(A) -> B) -> Event<B> {
    match event {
        Event::Apply(object) => Event::Apply(f(object)),
        Event::Delete(object) => Event::Delete(f(object)),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(f(object)),
        Event::InitDone => Event::InitDone,
    }
}

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

/// Marks the handle ready once every kind has been listed once, and keeps the [`Contact`].
struct Synced {
    handle: SourceHandle,
    kinds: Mutex<BTreeSet<&'static str>>,
    contact: Contact,
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

/// Whether the watches are in contact with the API server: since when the longest-failing of
/// them fails (`None`: every watch's last request succeeded). A watch fails from its first
/// failed request (the API server unreachable, or answering an error) until its next event;
/// a quiet watch that fails nothing counts as in contact. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct Contact {
    failing: Arc<Mutex<BTreeMap<&'static str, Instant>>>,
    lost_since: Arc<watch::Sender<Option<Instant>>>,
}

impl Contact {
    /// A receiver of since when the contact is lost (`None`: in contact).
    pub fn subscribe(&self) -> watch::Receiver<Option<Instant>> {
        self.lost_since.subscribe()
    }

    /// The watch `what` failed a request (its first failure starts its clock).
    pub fn failed(&self, what: &'static str) {
        let mut failing = self.failing.lock().expect("contact lock");
        failing.entry(what).or_insert_with(Instant::now);
        self.publish(&failing);
    }

    /// The watch `what` got an answer.
    pub fn succeeded(&self, what: &'static str) {
        let mut failing = self.failing.lock().expect("contact lock");
        if failing.remove(what).is_some() {
            self.publish(&failing);
        }
    }

    fn publish(&self, failing: &BTreeMap<&'static str, Instant>) {
        let since = failing.values().min().copied();
        self.lost_since.send_if_modified(|now| {
            let changed = *now != since;
            *now = since;
            changed
        });
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
        self.run_in(handle, Contact::default()).await;
    }

    /// [`run`](Self::run), telling `contact` whether the watches are in contact.
    pub async fn run_in(self, handle: SourceHandle, contact: Contact) {
        let synced = Arc::new(Synced {
            handle: handle.clone(),
            kinds: Mutex::default(),
            contact,
        });
        let labels = watcher::Config::default().labels(PROXY_LABEL_SELECTOR);
        let node = watcher::Config::default().fields(&format!("metadata.name={}", self.node_name));
        tokio::join!(
            self.follow::<Service>(labels.clone(), &handle, &synced),
            self.follow_slices(labels, &handle, &synced),
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
        let events = watcher::watcher(Api::<K>::all(self.client.clone()), config);
        let mut retry = Retry::new(K::WATCH);
        self.apply_events(events, &mut retry, None, handle, synced)
            .await;
    }

    /// Apply the EndpointSlices' watch events to the store, forever, in the version discovery
    /// finds ([`discover_slice_version`]; logged when it is chosen). While neither version is
    /// served, or once the one read answers 404, it is reported ([`Unserved`]), the
    /// EndpointSlices count as listed (Services program without them) and discovery is asked
    /// again after the retry's wait. A discovery request that fails otherwise (the API server
    /// away, or answering another error) is retried as a failed list is.
    async fn follow_slices(&self, config: watcher::Config, handle: &SourceHandle, synced: &Synced) {
        let mut retry = Retry::new(EndpointSlice::WATCH);
        let mut unserved = Unserved::default();
        let mut reading = None;
        loop {
            let (resource, error) = match discover_slice_version(&self.client).await {
                Err(e) => {
                    let e = watcher::Error::InitialListFailed(e);
                    synced.contact.failed(EndpointSlice::WATCH);
                    retry.failed(&e, "the last known objects").await;
                    continue;
                }
                Ok(None) => (SliceVersion::V1.resource(), not_served("EndpointSlices")),
                Ok(Some(version)) => {
                    if reading.replace(version) != Some(version) {
                        let group_version = version.group_version();
                        tracing::info!(group_version, "reading EndpointSlices as {group_version}");
                    }
                    let watch = self.follow_version(
                        version,
                        &config,
                        &mut retry,
                        &mut unserved,
                        handle,
                        synced,
                    );
                    let Some(error) = watch.await else {
                        return; // the watch ended (kube-runtime's does not)
                    };
                    (version.resource(), error)
                }
            };
            unserved.report(handle, resource);
            // An answer (the resource is not served): in contact.
            synced.contact.succeeded(EndpointSlice::WATCH);
            synced.mark(EndpointSlice::NAME);
            retry.wait(&error).await;
        }
    }

    /// Apply the watch events of the EndpointSlices in `version` to the store (each a v1
    /// [`EndpointSlice`]) until the API server answers that it does not serve them (the 404,
    /// returned).
    async fn follow_version(
        &self,
        version: SliceVersion,
        config: &watcher::Config,
        retry: &mut Retry,
        unserved: &mut Unserved,
        handle: &SourceHandle,
        synced: &Synced,
    ) -> Option<watcher::Error> {
        let (client, config) = (self.client.clone(), config.clone());
        let unserved = Some(unserved);
        match version {
            SliceVersion::V1 => {
                let events = watcher::watcher(Api::<EndpointSlice>::all(client), config);
                self.apply_events(events, retry, unserved, handle, synced)
                    .await
            }
            SliceVersion::V1beta1 => {
                let api = Api::<v1beta1::EndpointSlice>::all(client);
                let events = watcher::watcher(api, config)
                    .map_ok(|event| map_event(event, EndpointSlice::from));
                self.apply_events(events, retry, unserved, handle, synced)
                    .await
            }
        }
    }

    /// Apply one kind's watch `events` to the store until they end, retrying failures with
    /// `retry`. With `unserved` (a kind the proxier runs without) a 404, the resource not
    /// served, ends it instead and is returned; a complete list clears what `unserved` reported.
    async fn apply_events<K: Kind>(
        &self,
        events: impl Stream<Item = watcher::Result<Event<K>>>,
        retry: &mut Retry,
        mut unserved: Option<&mut Unserved>,
        handle: &SourceHandle,
        synced: &Synced,
    ) -> Option<watcher::Error> {
        let mut events = pin!(events);
        let mut listing = Listing::<K>::default();
        while let Some(event) = events.next().await {
            if event.is_ok() {
                retry.succeeded();
                synced.contact.succeeded(K::WATCH);
            } else {
                synced.contact.failed(K::WATCH);
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
                    if let Some(unserved) = unserved.as_deref_mut() {
                        unserved.served(handle);
                    }
                    synced.mark(K::NAME);
                }
                Ok(Event::Apply(object)) => handle.update(|store| K::apply(store, object)),
                Ok(Event::Delete(object)) => handle.update(|store| K::delete(store, &object)),
                Err(e) if unserved.is_some() && is_not_found(&e) => return Some(e),
                Err(e) => retry.failed(&e, "the last known objects").await,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The resource list discovery answers for `group_version` serving `resources`.
    fn served(group_version: &str, resources: &[&str]) -> APIResourceList {
        let resources: Vec<_> = resources
            .iter()
            .map(|name| {
                json!({"name": name, "singularName": "", "namespaced": true,
                       "kind": "EndpointSlice", "verbs": ["get", "list", "watch"]})
            })
            .collect();
        serde_json::from_value(json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": group_version, "resources": resources
        }))
        .unwrap()
    }

    /// The contact is lost from the first failure of the longest-failing watch until every
    /// failing watch has answered again.
    #[tokio::test(start_paused = true)]
    async fn contact_is_lost_from_the_first_failure_until_every_watch_answers() {
        let contact = Contact::default();
        let lost = contact.subscribe();
        contact.succeeded("Service watch");
        assert_eq!(*lost.borrow(), None);
        let first = Instant::now();
        contact.failed("Service watch");
        tokio::time::advance(std::time::Duration::from_secs(5)).await;
        contact.failed("Node watch");
        contact.failed("Service watch"); // a later failure keeps the first one's time
        assert_eq!(*lost.borrow(), Some(first));
        contact.succeeded("Service watch");
        assert_eq!(
            *lost.borrow(),
            Some(first + std::time::Duration::from_secs(5))
        );
        contact.succeeded("Node watch");
        assert_eq!(*lost.borrow(), None);
    }

    #[test]
    fn slice_version_is_v1_where_served_else_v1beta1() {
        use SliceVersion::{V1, V1beta1};
        let v1 = served("discovery.k8s.io/v1", &["endpointslices"]);
        let v1beta1 = served("discovery.k8s.io/v1beta1", &["endpointslices"]);
        let apps = served("apps/v1", &["deployments", "endpointslices"]);
        for (lists, chosen) in [
            // 1.21–1.24: both, v1 preferred whatever the order.
            (vec![v1.clone(), v1beta1.clone()], Some(V1)),
            (vec![v1beta1.clone(), v1.clone()], Some(V1)),
            // 1.25 and newer.
            (vec![v1.clone()], Some(V1)),
            // 1.20 (and 1.17–1.19).
            (vec![v1beta1.clone()], Some(V1beta1)),
            (vec![apps.clone(), v1beta1.clone()], Some(V1beta1)),
            // A group version served without EndpointSlices (switched off by runtime-config).
            (
                vec![served("discovery.k8s.io/v1", &[]), v1beta1.clone()],
                Some(V1beta1),
            ),
            // Neither: older than 1.17, or another group's endpointslices only.
            (vec![], None),
            (vec![apps.clone()], None),
            (
                vec![served("discovery.k8s.io/v1alpha1", &["endpointslices"])],
                None,
            ),
        ] {
            let names: Vec<&str> = lists.iter().map(|l| l.group_version.as_str()).collect();
            assert_eq!(choose_slice_version(&lists), chosen, "{names:?}");
        }
        assert_eq!(V1.resource(), "endpointslices.discovery.k8s.io/v1");
        assert_eq!(
            V1beta1.resource(),
            "endpointslices.discovery.k8s.io/v1beta1"
        );
        assert_eq!(
            (
                EndpointSlice::api_version(&()),
                v1beta1::EndpointSlice::api_version(&())
            ),
            (V1.group_version().into(), V1beta1.group_version().into())
        );
    }
}

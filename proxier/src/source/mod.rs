//! Where Services, EndpointSlices and the own Node come from: the [`store::Store`] they are
//! written into through a [`SourceHandle`], the manifests files ([`manifests`]) and the
//! Kubernetes API ([`kube`]; [`v1beta1`] the EndpointSlices of API servers without
//! `discovery.k8s.io/v1`; [`apiserver`] how it is reached without a ClusterIP), and the node's
//! NodeProxyConfig ([`node_config`]).

pub mod apiserver;
pub mod convert;
pub mod kube;
pub mod manifests;
pub mod node_config;
pub mod store;
pub mod v1beta1;

use ::kube::runtime::watcher;
use kipvs_proxier_contract::answered_status;
use std::fmt;
use std::sync::{Arc, Mutex};
use store::Store;
use tokio::sync::{Notify, watch};

/// Told what sources write (the engine's observers are also store observers:
/// [`crate::engine::observer::Observer`]). Every method defaults to nothing.
pub trait StoreObserver: Send + Sync {
    /// The store changed: a source wrote to it, or the engine took its dirty set. Called under
    /// the store lock, so it must be quick.
    fn store_updated(&self, _store: &Store) {}
    /// The API server does (`true`) or does not any more (`false`) serve `resource` (e.g.
    /// `endpointslices.discovery.k8s.io/v1` on an API server that serves neither it nor
    /// v1beta1).
    fn resource_unavailable(&self, _resource: &'static str, _unavailable: bool) {}
    /// `files` manifests files do not load as they are (their last good content is used).
    fn invalid_manifests(&self, _files: usize) {}
}

/// What sources hold to feed the engine: the store, the wake-up signal, the readiness gate
/// and the observers of changes.
#[derive(Clone)]
pub struct SourceHandle {
    /// Objects: changed through [`SourceHandle::update`] (the engine and the observers hear),
    /// read and taken from through [`SourceHandle::with_store`].
    store: Arc<Mutex<Store>>,
    notify: Arc<Notify>,
    ready: Arc<watch::Sender<bool>>,
    observer: Arc<dyn StoreObserver>,
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
    /// [`run`](crate::engine::Engine::run) programs nothing before the source has loaded everything once
    /// (an empty store would delete what a previous run programmed).
    pub fn gated() -> Self {
        let handle = SourceHandle::default();
        handle.ready.send_replace(false);
        handle
    }

    /// The same handle, telling `observer` about every store change.
    pub fn with_observer(mut self, observer: Arc<dyn StoreObserver>) -> Self {
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

    /// Run `f` on the store without telling anyone: for what changes no object (reading it,
    /// converting objects with the store's shared strings, the engine taking the changes it
    /// plans). A change of objects goes through [`update`](Self::update) instead.
    pub fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.store.lock().expect("store lock"))
    }

    /// The store, read only, locked until the returned guard drops: the read handle of tests and
    /// reports.
    pub fn read(&self) -> impl std::ops::Deref<Target = Store> + '_ {
        self.store.lock().expect("store lock")
    }

    /// Tell the observer that the API server does (`true`) or does not any more (`false`) serve
    /// `resource`.
    pub fn resource_unavailable(&self, resource: &'static str, unavailable: bool) {
        self.observer.resource_unavailable(resource, unavailable);
    }

    /// Tell the observer how many manifests files do not load as they are.
    pub fn invalid_manifests(&self, files: usize) {
        self.observer.invalid_manifests(files);
    }

    /// Resolves at the next [`update`](Self::update) (or at once if one happened since the
    /// last call): what the engine waits on.
    pub async fn changed(&self) {
        self.notify.notified().await;
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

/// Whether a watcher error is the API server's 404 for the resource (it is not served).
fn is_not_found(error: &watcher::Error) -> bool {
    !matches!(error, watcher::Error::WatchError(_)) && answered_status(error) == Some(404)
}

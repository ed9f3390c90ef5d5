//! Where Services, EndpointSlices and the own Node come from: the [`store::Store`] they are
//! written into through a [`SourceHandle`], the manifests files ([`manifests`]) and the
//! Kubernetes API ([`kube`]), and the node's NodeProxyConfig ([`node_config`]).

pub mod convert;
pub mod kube;
pub mod manifests;
pub mod node_config;
pub mod store;

use ::kube::runtime::utils::{Backoff, ResetTimerBackoff};
use ::kube::runtime::watcher::{self, DefaultBackoff, ExponentialBackoff};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::Store;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Told what sources write (the engine's observers are also store observers:
/// [`crate::engine::observer::Observer`]). Every method defaults to nothing.
pub trait StoreObserver: Send + Sync {
    /// The store changed: a source wrote to it, or the engine took its dirty set. Called under
    /// the store lock, so it must be quick.
    fn store_updated(&self, _store: &Store) {}
    /// The API server does (`true`) or does not any more (`false`) serve `resource` (e.g.
    /// `endpointslices.discovery.k8s.io/v1` on Kubernetes < 1.21).
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

/// How an API watcher ([`kube`], [`node_config`]) waits after a failed list or watch, and how it
/// logs the failures. kube-runtime's `watcher` retries at its next poll; this decides how long
/// to wait before that poll, by what the error says about the API server:
///
/// - **It is not reachable** (connection refused or timed out, TLS failure, a stream cut
///   without an answer): 0.8 s doubling to 3 s, each wait plus a random jitter of up to itself
///   (so 0.8–6 s), so a proxier resumes within a few seconds once the API server is back.
///   An absent server costs nothing to ask: about one connection attempt per watch every 4.5 s.
/// - **It answered with an error** (5xx, 429, 403, ...): kube-runtime's [`DefaultBackoff`],
///   client-go's reflector numbers (0.8 s doubling to 30 s, plus jitter), kind to a
///   struggling server.
/// - **`410 Gone`** (the watch's resource version is too old; what every watch gets from an API
///   server that restarted): the server is back, so both backoffs start over and the watcher
///   lists again after the first step (0.8–1.6 s).
///
/// Both reset after an event (and after 2 min without a failure). kube-runtime's
/// `StreamBackoff` (`default_backoff()`) cannot tell these apart: after an outage it waits
/// the step it grew during the outage (tens of seconds) before the relist the `410` asks for.
///
/// Logs: the first failure of a run at WARN, the following ones at DEBUG, the recovery at
/// INFO with the number of failures and how long they lasted.
pub struct Retry {
    what: &'static str,
    unreachable: ResetTimerBackoff<ExponentialBackoff>,
    answered: DefaultBackoff,
    /// Failures since the last event, and when the first of them happened.
    failing: Option<(u32, Instant)>,
}

/// How long a [`Retry`] waits at least, and what both of its backoffs start from.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(800);
/// The longest step of a [`Retry`] while the API server is not reachable (before jitter).
pub(crate) const RETRY_UNREACHABLE_MAX: Duration = Duration::from_secs(3);

impl Retry {
    /// The retry state of one watch; `what` names it in logs (e.g. `Service watch`).
    pub fn new(what: &'static str) -> Self {
        let unreachable = backon::ExponentialBuilder::default()
            .with_min_delay(RETRY_MIN)
            .with_max_delay(RETRY_UNREACHABLE_MAX)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Retry {
            what,
            unreachable: ResetTimerBackoff::new(unreachable.into(), Duration::from_secs(120)),
            answered: DefaultBackoff::default(),
            failing: None,
        }
    }

    /// The watcher delivered an event: the API server answers again.
    pub fn succeeded(&mut self) {
        if let Some((failures, since)) = self.failing.take() {
            tracing::info!(
                "{} resumed after {failures} failed attempts over {:.1} s",
                self.what,
                since.elapsed().as_secs_f64()
            );
            self.unreachable.reset();
            self.answered.reset();
        }
    }

    /// The watcher failed with `error`: log it (see [`Retry`]) with `keeping` (what stays in
    /// force meanwhile), then wait before the next attempt.
    pub async fn failed(&mut self, error: &watcher::Error, keeping: &str) {
        match &self.failing {
            None => tracing::warn!(
                "{} failed, keeping {keeping} and retrying with backoff (further failures \
                 are logged at debug level until it recovers): {error}",
                self.what
            ),
            Some(_) => tracing::debug!("{} failed again: {error}", self.what),
        }
        self.wait(error).await;
    }

    /// Wait before the next attempt after `error`, without logging it.
    pub async fn wait(&mut self, error: &watcher::Error) {
        self.failing.get_or_insert((0, Instant::now())).0 += 1;
        tokio::time::sleep(self.delay(error)).await;
    }

    /// How long to wait after `error` (see [`Retry`]).
    fn delay(&mut self, error: &watcher::Error) -> Duration {
        let fallback = Duration::from_secs(30);
        match answered_status(error) {
            Some(410) => {
                self.unreachable.reset();
                self.answered.reset();
                self.answered.next().unwrap_or(fallback)
            }
            Some(_) => self.answered.next().unwrap_or(fallback),
            None => self.unreachable.next().unwrap_or(fallback),
        }
    }
}

/// The HTTP status of a watcher error the API server answered; `None` when it was not reached
/// or its answer was cut.
fn answered_status(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(::kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(::kube::Error::Api(status))
        | watcher::Error::WatchFailed(::kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        // A list without a resource version: an answer, if a strange one.
        watcher::Error::NoResourceVersion => Some(500),
        _ => None,
    }
}

/// Whether a watcher error is the API server's 404 for the resource (it is not served).
fn is_not_found(error: &watcher::Error) -> bool {
    !matches!(error, watcher::Error::WatchError(_)) && answered_status(error) == Some(404)
}

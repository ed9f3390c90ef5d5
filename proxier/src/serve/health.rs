//! The proxier's health, as kube-proxy reports it (`pkg/proxy/healthcheck`), on HTTP:
//!
//! - `/livez` on `healthzBindAddress` (default `0.0.0.0:10256`): 200 while the proxier is
//!   healthy, 503 when a change queued by a source was not synced within `2 × ipvs.syncPeriod`
//!   (kube-proxy's `healthTimeout`). A proxier that is starting or fully synced is healthy.
//! - `/healthz` on the same address: `/livez`, and with the `KubeProxyDrainingTerminatingNodes`
//!   gate on (KEP-3836) also that the own Node is eligible: known, without a
//!   `deletionTimestamp` and without the taint `ToBeDeletedByClusterAutoscaler` (an
//!   `unschedulable` Node stays eligible). With the gate off `/healthz` equals `/livez` and its
//!   body has no `nodeEligible`.
//!
//!   Both bodies are kube-proxy's JSON: `{"lastUpdated", "currentTime", "nodeEligible"
//!   (healthz, gate on), "healthy", "status": {"IPv4"|"IPv6": {"lastUpdated", "healthy"}}}`,
//!   times in RFC 3339; on 200 `lastUpdated` is the current time (kube-proxy keeps that for
//!   backward compatibility). kipvs syncs both IP families in one engine, so `status` has
//!   both families, with the same values, once the first sync is done. Answers are counted in
//!   `kubeproxy_proxy_healthz_total{code}` / `kubeproxy_proxy_livez_total{code}`.
//! - `/readyz` on the same address (kipvs's own; the DaemonSet's readiness probe): 200 once the
//!   proxier has programmed, 503 before ([`ProxyHealth::ready`]): `/livez`, and a first
//!   sync done since the proxier began to program (at start, or at the switch from kube-proxy),
//!   or standing by for kube-proxy with its sources listed; and the API watches not failing for
//!   longer than [`SOURCES_LOST_READY`]. A DaemonSet rolling update waits for it, so a release
//!   that cannot program stops on the first node. Liveness keeps to the process: an API server
//!   outage makes the pod NotReady, never restarts it. Body `{"ready", "programmed",
//!   "standby", "sourcesLostSeconds"}`.
//! - health-check node ports ([`ServiceHealthServers`]): one listener per
//!   `spec.healthCheckNodePort` of the plan (LoadBalancer Services with
//!   `externalTrafficPolicy: Local`), answering any path with 200 only when the node has
//!   local **ready** endpoints for the Service and the proxier is live, 503 otherwise (only
//!   terminating endpoints included), with the body
//!   `{"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":bool}` and the
//!   header `X-Load-Balancing-Endpoint-Weight: N`.

use crate::engine::observer::{Observer, SyncOutcome, TakeoverEvent};
use crate::model::HealthCheckNodePort;
use crate::serve::metrics::Metrics;
use crate::source::StoreObserver;
use crate::source::store::Store;
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::Gate;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_proxier_contract::StalenessClock;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::Instrument;
use warp::Filter;
use warp::http::StatusCode;
use warp::reply::{Reply, Response};

/// The taint the Cluster Autoscaler puts on a Node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Header with the number of local ready endpoints, on health-check node port answers.
pub const ENDPOINT_WEIGHT_HEADER: &str = "X-Load-Balancing-Endpoint-Weight";

/// Whether `node` may receive load-balancer traffic (KEP-3836): it is known, has no
/// `deletionTimestamp` and no [`TO_BE_DELETED_TAINT`].
pub fn node_eligible(node: Option<&Node>) -> bool {
    let Some(node) = node else {
        return false;
    };
    let tainted = node
        .spec
        .iter()
        .flat_map(|spec| spec.taints.iter().flatten())
        .any(|taint| taint.key == TO_BE_DELETED_TAINT);
    node.metadata.deletion_timestamp.is_none() && !tainted
}

/// Which endpoint is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `/livez`: the proxier syncs in time.
    Livez,
    /// `/healthz`: `/livez`, and the Node is eligible when the gate is on.
    Healthz,
}

/// How long the API watches may fail before the proxier is not Ready any more: a minute, as
/// long as kube-proxy's `healthTimeout` (`2 × syncPeriod`) with the default `syncPeriod`; long
/// enough for an API server restart or a control-plane upgrade step, short enough that a node
/// cut off from the API shows within the DaemonSet's rollout (and its monitoring).
pub const SOURCES_LOST_READY: Duration = Duration::from_secs(60);

/// The JSON body of `/readyz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyBody {
    /// The answer: 200 when true, 503 otherwise.
    pub ready: bool,
    /// A sync succeeded since the proxier began to program.
    pub programmed: bool,
    /// Standing by for kube-proxy (sources listed, nothing written on purpose).
    pub standby: bool,
    /// For how long the API watches have been failing (absent: in contact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sources_lost_seconds: Option<u64>,
}

#[derive(Debug)]
struct State {
    /// When the last sync ended (wall clock, for bodies).
    last_updated: Option<SystemTime>,
    /// When a queued change makes `/livez` fail.
    clock: StalenessClock,
    node_eligible: bool,
    /// The `KubeProxyDrainingTerminatingNodes` gate.
    node_gate: bool,
    /// In standby while kube-proxy runs ([`crate::engine::takeover`]): changes wait on
    /// purpose, so they do not make the proxier stale.
    standby: bool,
    /// A sync succeeded since the proxier began to program (at start, or leaving standby).
    programmed: bool,
    /// Since when the API watches fail (`None`: in contact, or no API source).
    lost_since: Option<Instant>,
}

/// The proxier's health: the sync timestamps and the Node's eligibility. Cheap to clone
/// (shared state). Fed as an [`Observer`]: a store write that leaves changes to sync queues
/// an update; a sync that could observe the dataplane marks the proxier updated (as
/// kube-proxy's IPVS mode, failed individual ops do not make it stale; they are counted in
/// `kipvs_sync_errors_total`).
#[derive(Clone, Debug)]
pub struct ProxyHealth {
    state: Arc<Mutex<State>>,
    changed: Arc<watch::Sender<()>>,
}

/// One family's part of a health body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FamilyHealth {
    /// End of the last sync (RFC 3339).
    pub last_updated: String,
    /// Whether this family syncs in time.
    pub healthy: bool,
}

/// The JSON body of `/healthz` and `/livez` (kube-proxy's `ProxyHealth`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthBody {
    /// End of the last sync; the current time when healthy (RFC 3339).
    pub last_updated: String,
    /// Now (RFC 3339).
    pub current_time: String,
    /// Whether the Node is eligible (only on `/healthz` with the gate on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    /// The answer: 200 when true, 503 otherwise.
    pub healthy: bool,
    /// Per IP family (`IPv4`, `IPv6`); empty before the first sync.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<&'static str, FamilyHealth>,
}

/// Go's zero `time.Time` as JSON: what kube-proxy reports before its first sync.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// RFC 3339 with as many fractional digits as needed (Go's `RFC3339Nano`).
fn rfc3339(at: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .map_or_else(|_| ZERO_TIME.to_owned(), |t| t.to_string())
}

impl ProxyHealth {
    /// Health that goes stale when a queued change waits longer than `timeout` (kube-proxy:
    /// `2 × syncPeriod`); `node_gate` is the `KubeProxyDrainingTerminatingNodes` gate. The
    /// Node counts as eligible until the first store write tells otherwise.
    pub fn new(timeout: Duration, node_gate: bool) -> Self {
        ProxyHealth {
            state: Arc::new(Mutex::new(State {
                last_updated: None,
                clock: StalenessClock::new(timeout),
                node_eligible: true,
                node_gate,
                standby: false,
                programmed: false,
                lost_since: None,
            })),
            changed: Arc::new(watch::Sender::new(())),
        }
    }

    fn modify(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().expect("health lock"));
        self.changed.send_replace(());
    }

    /// A change is waiting to be synced (kube-proxy's `QueuedUpdate`): starts the staleness
    /// clock unless it already runs.
    pub fn queued_update(&self) {
        self.modify(|s| s.clock.queued());
    }

    /// A sync ended (kube-proxy's `Updated`): nothing is waiting any more.
    pub fn updated(&self) {
        self.modify(|s| {
            s.clock.synced();
            s.last_updated = Some(SystemTime::now());
            s.programmed = true;
        });
    }

    /// Record since when the API watches fail (`None`: in contact).
    pub fn set_sources_lost(&self, since: Option<Instant>) {
        self.modify(|s| s.lost_since = since);
    }

    /// Follow `lost_since` (a [`crate::source::kube::Contact`]'s) into
    /// [`set_sources_lost`](Self::set_sources_lost), in a task of its own (must run inside a
    /// Tokio runtime).
    pub fn follow_sources(&self, mut lost_since: watch::Receiver<Option<Instant>>) {
        let health = self.clone();
        tokio::spawn(
            async move {
                loop {
                    let since = *lost_since.borrow_and_update();
                    health.set_sources_lost(since);
                    if lost_since.changed().await.is_err() {
                        return;
                    }
                }
            }
            .instrument(tracing::info_span!("sources_contact")),
        );
    }

    /// Whether the pod is Ready (`/readyz`, module documentation): live, programmed or
    /// standing by, and its sources not lost for longer than [`SOURCES_LOST_READY`].
    pub fn ready(&self) -> ReadyBody {
        let live = self.live();
        let state = self.state.lock().expect("health lock");
        let lost = state.lost_since.map(|since| since.elapsed());
        let in_contact = lost.is_none_or(|lost| lost < SOURCES_LOST_READY);
        ReadyBody {
            ready: live && (state.programmed || state.standby) && in_contact,
            programmed: state.programmed,
            standby: state.standby,
            sources_lost_seconds: lost.map(|lost| lost.as_secs()),
        }
    }

    /// Record the Node's eligibility (see [`node_eligible`]).
    pub fn set_node(&self, node: Option<&Node>) {
        let eligible = node_eligible(node);
        if self.state.lock().expect("health lock").node_eligible != eligible {
            self.modify(|s| s.node_eligible = eligible);
        }
    }

    /// Change the staleness timeout and the `KubeProxyDrainingTerminatingNodes` gate (as in
    /// [`new`](Self::new)), e.g. when a new configuration is applied live.
    pub fn configure(&self, timeout: Duration, node_gate: bool) {
        self.modify(|s| {
            s.clock.set_timeout(timeout);
            s.node_gate = node_gate;
        });
    }

    /// Whether `/livez` answers 200 now.
    pub fn live(&self) -> bool {
        self.check(Probe::Livez).healthy
    }

    /// The answer of `probe` now.
    pub fn check(&self, probe: Probe) -> HealthBody {
        let state = self.state.lock().expect("health lock");
        let now = SystemTime::now();
        let live = state.standby || state.clock.live();
        let node_eligible =
            (probe == Probe::Healthz && state.node_gate).then_some(state.node_eligible);
        let healthy = live && node_eligible.unwrap_or(true);
        let last = state.last_updated.map(rfc3339);
        let status = last
            .iter()
            .flat_map(|last| {
                ["IPv4", "IPv6"].map(|family| {
                    let health = FamilyHealth {
                        last_updated: last.clone(),
                        healthy: live,
                    };
                    (family, health)
                })
            })
            .collect();
        let last_updated = match (healthy, last) {
            (true, _) => rfc3339(now),
            (false, Some(last)) => last,
            (false, None) => ZERO_TIME.to_owned(),
        };
        HealthBody {
            last_updated,
            current_time: rfc3339(now),
            node_eligible,
            healthy,
            status,
        }
    }

    /// When `/livez` turns unhealthy unless a sync ends first (`None`: not pending, or
    /// already stale).
    pub fn stale_at(&self) -> Option<Instant> {
        let state = self.state.lock().expect("health lock");
        if state.standby {
            return None;
        }
        state.clock.stale_at()
    }

    /// When an answer may change with time alone: `/livez` going stale ([`stale_at`](Self::stale_at))
    /// or the sources lost for [`SOURCES_LOST_READY`] (`None`: neither is pending).
    pub fn next_change_at(&self) -> Option<Instant> {
        let lost = {
            let state = self.state.lock().expect("health lock");
            state
                .lost_since
                .map(|since| since + SOURCES_LOST_READY)
                .filter(|at| *at > Instant::now())
        };
        match (self.stale_at(), lost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A receiver that sees a change whenever the health state changes (time passing does
    /// not count: see [`next_change_at`](Self::next_change_at)).
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The `/healthz` and `/livez` routes, counting answers in `metrics`.
    pub fn routes(
        &self,
        metrics: &Metrics,
    ) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone + use<> {
        let route = |probe: Probe, path: &'static str| {
            let (health, metrics) = (self.clone(), metrics.clone());
            warp::path(path).and(warp::path::end()).map(move || {
                let body = health.check(probe);
                let code = if body.healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let counter = match probe {
                    Probe::Healthz => &metrics.servers.healthz_total,
                    Probe::Livez => &metrics.servers.livez_total,
                };
                counter.with_label_values(&[code.as_str()]).inc();
                json_reply(code, &body)
            })
        };
        let health = self.clone();
        let readyz = warp::path("readyz").and(warp::path::end()).map(move || {
            let body = health.ready();
            let code = if body.ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json_reply(code, &body)
        });
        route(Probe::Healthz, "healthz")
            .or(route(Probe::Livez, "livez"))
            .unify()
            .or(readyz)
            .unify()
    }
}

impl StoreObserver for ProxyHealth {
    fn store_updated(&self, store: &Store) {
        if store.is_dirty() {
            self.queued_update();
        }
        self.set_node(store.node());
    }
}

impl Observer for ProxyHealth {
    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        if outcome.result.is_ok() {
            self.updated();
        }
    }

    /// Standby keeps `/livez` healthy; leaving it gives the queued changes a whole timeout.
    fn takeover(&self, event: &TakeoverEvent) {
        let standby = match event {
            TakeoverEvent::Standby(_) | TakeoverEvent::KubeProxyBack(_) => true,
            TakeoverEvent::Programming => false,
            _ => return,
        };
        self.modify(|s| {
            if s.standby && !standby {
                s.clock.restart();
                // Not Ready again until the first sync of the switch is done.
                s.programmed = false;
            }
            s.standby = standby;
        });
    }

    fn config_changed(&self, config: &ProxierConfiguration) {
        self.configure(
            2 * config.ipvs.sync_period,
            config.gate_enabled(Gate::KubeProxyDrainingTerminatingNodes),
        );
    }
}

impl Default for ProxyHealth {
    /// Health for the default configuration, until the engine tells it the one in force
    /// ([`Observer::config_changed`], first when the engine is built).
    fn default() -> Self {
        let health = ProxyHealth::new(Duration::ZERO, false);
        health.config_changed(&ProxierConfiguration::default());
        health
    }
}

/// A JSON answer with kube-proxy's headers.
fn json_reply(code: StatusCode, body: &impl Serialize) -> Response {
    let json = serde_json::to_string(body).expect("health bodies serialize");
    let reply = warp::reply::with_status(json, code);
    let reply = warp::reply::with_header(reply, "Content-Type", "application/json");
    warp::reply::with_header(reply, "X-Content-Type-Options", "nosniff").into_response()
}

/// Bind `addr` for a server (with `SO_REUSEADDR`, as Go's listeners, so a port freed a moment
/// ago binds again).
///
/// Errors: the bind or listen error, e.g. `EADDRINUSE`.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// How long one of the proxier's servers whose address cannot be bound waits before the next
/// attempt: kube-proxy retries its healthz and metrics servers every 5 s (`wait.Until`).
pub const BIND_RETRY: Duration = Duration::from_secs(5);

/// Binds `addr` for the server named `what` (`"healthz"`, `"metrics"`, `"gRPC health"`),
/// retrying every [`BIND_RETRY`] while it fails, e.g. while another process holds the port (kube-proxy
/// still stopping on 10256, another agent on the gRPC port). Programming does not wait for it:
/// the caller runs this in a task of its own, as kube-proxy serves healthz and metrics beside its
/// proxier. `failed` is called after each failed attempt (a metric); the first failure and every
/// twelfth after it (a minute) are logged as warnings.
pub async fn bind_retrying(addr: SocketAddr, what: &str, failed: impl Fn()) -> TcpListener {
    let mut attempts = 0u64;
    loop {
        match bind(addr) {
            Ok(listener) => {
                if attempts > 0 {
                    tracing::info!(%addr, attempts, "bound the {what} server");
                }
                return listener;
            }
            Err(error) => {
                failed();
                if attempts.is_multiple_of(12) {
                    tracing::warn!(
                        %addr,
                        %error,
                        "cannot bind the {what} server; retrying every {}s (the proxier goes on \
                         without it)",
                        BIND_RETRY.as_secs()
                    );
                }
                attempts += 1;
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    }
}

/// Serve `routes` on `listener` until `shutdown` resolves (then finish open requests).
pub async fn serve<F>(
    listener: TcpListener,
    routes: F,
    shutdown: impl Future<Output = ()> + Send + 'static,
) where
    F: Filter<Extract = (Response,)> + Clone + Send + Sync + 'static,
{
    warp::serve(routes)
        .incoming(listener)
        .graceful(shutdown)
        .run()
        .await;
}

/// The health-check node port servers: one listener per port of the desired state's
/// `health_check_node_ports`, opened and closed as the plan changes ([`Observer`]:
/// after every sync: all ports after a full sync, else the ports the sync's re-plan touched). A
/// port that cannot be bound is logged once and retried when its Service changes and at each
/// full sync (every `ipvs.syncPeriod`).
#[derive(Clone)]
pub struct ServiceHealthServers {
    health: ProxyHealth,
    /// Addresses to try in order for each listener (e.g. `::` then `0.0.0.0`).
    bind_ips: Vec<IpAddr>,
    services: Arc<RwLock<BTreeMap<u16, HealthCheckNodePort>>>,
    listeners: Arc<Mutex<Listeners>>,
}

#[derive(Default)]
struct Listeners {
    open: BTreeMap<u16, oneshot::Sender<()>>,
    failed: BTreeMap<u16, String>,
}

/// The JSON body of a health-check node port answer.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceHealthBody<'a> {
    service: ServiceName<'a>,
    local_endpoints: usize,
    service_proxy_healthy: bool,
}

#[derive(Serialize)]
struct ServiceName<'a> {
    namespace: &'a str,
    name: &'a str,
}

impl ServiceHealthServers {
    /// No listeners yet; each will bind the first of `bind_ips` that works.
    pub fn new(health: ProxyHealth, bind_ips: Vec<IpAddr>) -> Self {
        ServiceHealthServers {
            health,
            bind_ips,
            services: Arc::default(),
            listeners: Arc::default(),
        }
    }

    /// Ports with an open listener.
    pub fn listening(&self) -> Vec<u16> {
        let listeners = self.listeners.lock().expect("listeners lock");
        listeners.open.keys().copied().collect()
    }

    /// Make the listeners match `ports`: close those not wanted, open the missing ones (must
    /// run inside a Tokio runtime), and answer with the new endpoint counts from now on.
    /// O(number of ports): after a full re-plan; [`update`](Self::update) otherwise.
    pub fn sync(&self, ports: &BTreeMap<u16, HealthCheckNodePort>) {
        *self.services.write().expect("services lock") = ports.clone();
        let mut listeners = self.listeners.lock().expect("listeners lock");
        listeners.open.retain(|port, _| ports.contains_key(port));
        listeners.failed.retain(|port, _| ports.contains_key(port));
        for (&port, service) in ports {
            self.ensure_listening(&mut listeners, port, service);
        }
    }

    /// As [`sync`](Self::sync), for the ports in `changed` only (those a re-plan touched; the
    /// others are as the last call left them): O(number of changed ports).
    pub fn update(&self, ports: &BTreeMap<u16, HealthCheckNodePort>, changed: &BTreeSet<u16>) {
        if changed.is_empty() {
            return;
        }
        let mut services = self.services.write().expect("services lock");
        let mut listeners = self.listeners.lock().expect("listeners lock");
        for &port in changed {
            match ports.get(&port) {
                Some(service) => {
                    services.insert(port, service.clone());
                    self.ensure_listening(&mut listeners, port, service);
                }
                None => {
                    services.remove(&port);
                    listeners.open.remove(&port);
                    listeners.failed.remove(&port);
                }
            }
        }
    }

    /// Open the listener of `port` unless it is open (a bind error is logged once per
    /// message and retried at the next call).
    fn ensure_listening(
        &self,
        listeners: &mut Listeners,
        port: u16,
        service: &HealthCheckNodePort,
    ) {
        if listeners.open.contains_key(&port) {
            return;
        }
        match self.listen(port) {
            Ok(close) => {
                tracing::info!(port, service = %format_args!("{}/{}", service.namespace, service.name), "health-check node port open");
                listeners.failed.remove(&port);
                listeners.open.insert(port, close);
            }
            Err(e) => {
                let message = e.to_string();
                if listeners.failed.get(&port) != Some(&message) {
                    tracing::error!(port, service = %format_args!("{}/{}", service.namespace, service.name), "cannot open health-check node port: {message}");
                    listeners.failed.insert(port, message);
                }
            }
        }
    }

    /// Bind `port` and serve it until the returned sender is dropped.
    fn listen(&self, port: u16) -> io::Result<oneshot::Sender<()>> {
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no bind address");
        for ip in &self.bind_ips {
            match bind(SocketAddr::new(*ip, port)) {
                Ok(listener) => {
                    let (close, closed) = oneshot::channel::<()>();
                    let routes = self.routes(port);
                    let server = serve(listener, routes, async {
                        let _ = closed.await;
                    });
                    let span = tracing::info_span!("server", what = "health-check node port", port);
                    tokio::spawn(server.instrument(span));
                    return Ok(close);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Any path on `port`: the Service's local ready endpoints and the proxier's liveness.
    fn routes(
        &self,
        port: u16,
    ) -> impl Filter<Extract = (Response,), Error = std::convert::Infallible> + Clone + use<> {
        let (services, health) = (self.services.clone(), self.health.clone());
        warp::any().map(move || {
            let services = services.read().expect("services lock");
            let (namespace, name, count) = services.get(&port).map_or(("", "", 0), |s| {
                (&*s.namespace, &*s.name, s.local_ready_endpoints)
            });
            let healthy = health.live();
            let code = if count > 0 && healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let body = ServiceHealthBody {
                service: ServiceName { namespace, name },
                local_endpoints: count,
                service_proxy_healthy: healthy,
            };
            let reply = json_reply(code, &body);
            warp::reply::with_header(reply, ENDPOINT_WEIGHT_HEADER, count.to_string())
                .into_response()
        })
    }
}

impl StoreObserver for ServiceHealthServers {}

impl Observer for ServiceHealthServers {
    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        let ports = &outcome.desired.health_check_node_ports;
        match outcome.health_check_changes {
            Some(changed) => self.update(ports, changed),
            None => self.sync(ports),
        }
    }

    /// A proxier that stops programming closes every health-check node port: kube-proxy,
    /// handed the node back or back on it, binds the same ones. The first sync after the
    /// standby is a full one, which opens them again.
    fn takeover(&self, event: &TakeoverEvent) {
        if matches!(
            event,
            TakeoverEvent::Standby(_) | TakeoverEvent::KubeProxyBack(_)
        ) {
            self.sync(&BTreeMap::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ready once programmed, or standing by for kube-proxy; not before the first sync, not
    /// after leaving standby until the switch's sync, not with the sources lost for longer
    /// than the bound, and never while `/livez` fails; `/livez` ignores the sources.
    #[tokio::test(start_paused = true)]
    async fn ready_means_programmed_and_in_contact() {
        let health = ProxyHealth::new(Duration::from_secs(60), false);
        assert!(health.live(), "live while starting");
        assert!(!health.ready().ready, "not Ready before the first sync");
        health.updated();
        assert!(health.ready().ready, "Ready once synced");
        // The API away: Ready for the bound, then not; live all along.
        health.set_sources_lost(Some(Instant::now()));
        tokio::time::advance(SOURCES_LOST_READY - Duration::from_secs(1)).await;
        assert!(health.ready().ready);
        assert!(
            health.next_change_at().is_some(),
            "the publisher wakes at the bound"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let body = health.ready();
        assert!(!body.ready, "the sources lost beyond the bound: {body:?}");
        assert_eq!(
            body.sources_lost_seconds,
            Some(SOURCES_LOST_READY.as_secs() + 1)
        );
        assert!(health.live(), "an API outage restarts nothing");
        health.set_sources_lost(None);
        assert!(health.ready().ready, "back in contact");
        // Standby for kube-proxy: Ready; leaving it: not until the switch's first sync.
        let fresh = ProxyHealth::new(Duration::from_secs(60), false);
        fresh.takeover(&TakeoverEvent::Standby("kube-proxy runs".into()));
        assert!(fresh.ready().ready, "standing by with its sources listed");
        fresh.takeover(&TakeoverEvent::Programming);
        assert!(!fresh.ready().ready, "switching: not Ready before its sync");
        fresh.updated();
        assert!(fresh.ready().ready);
        // Not live: not Ready.
        fresh.queued_update();
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(!fresh.live());
        assert!(!fresh.ready().ready);
    }

    /// Standby (a handback, kube-proxy back) closes the health-check node ports for kube-proxy.
    #[tokio::test]
    async fn standby_closes_the_health_check_node_ports() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let health = ProxyHealth::new(Duration::from_secs(60), false);
        let servers = ServiceHealthServers::new(health, vec!["127.0.0.1".parse().unwrap()]);
        let service = HealthCheckNodePort {
            namespace: "default".into(),
            name: "web".into(),
            local_ready_endpoints: 1,
        };
        servers.sync(&[(port, service)].into());
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_err(),
            "open"
        );
        servers.takeover(&TakeoverEvent::Standby("serviceProxy is kube-proxy".into()));
        let mut rebound = Err(io::Error::other("not tried"));
        for _ in 0..50 {
            rebound = std::net::TcpListener::bind(("127.0.0.1", port));
            if rebound.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(rebound.is_ok(), "released for kube-proxy: {rebound:?}");
    }
}

//! Prometheus metrics on `metricsBindAddress` (default `127.0.0.1:10249`, path `/metrics`), and
//! `/proxyMode` there as kube-proxy's metrics server has it (the body `ipvs`).
//!
//! Names follow kube-proxy (`pkg/proxy/metrics/metrics.go`) where it has the metric, without
//! the `ip_family` label newer releases add (one kipvs engine programs both families in one
//! sync); kipvs' own metrics start with `kipvs_`:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | **sync** | | |
//! | `kubeproxy_sync_proxy_rules_duration_seconds` | histogram (1 ms × 2ⁿ, 15 buckets) | wall time of one sync (observe, diff, apply), incremental and full alike |
//! | `kipvs_full_sync_duration_seconds` | histogram (1 ms × 2ⁿ, 18 buckets) | wall time of one full sync only (at start, every `ipvs.syncPeriod`, at a switch): from the start of its observation of the whole kernel (which runs beside the incremental syncs) to the end of its diff and apply |
//! | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` | gauge | Unix time of the last successful sync |
//! | `kubeproxy_network_programming_duration_seconds` | histogram (0.25 s … 300 s) | from an EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time` to the end of the sync that programmed it |
//! | `kipvs_sync_errors_total{cause}` | counter | `observe` (the dataplane could not be read; nothing changed), the name of a failed op (`AddRealServer`, ...), or `conntrack` (a UDP conntrack listing or delete failed) |
//! | `kubeproxy_conntrack_reconciler_deleted_entries_total` | counter | stale UDP conntrack entries deleted ([`crate::dataplane::kernel::conntrack`]) |
//! | **changes** | | |
//! | `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` | gauge | Unix time of the last change a source queued |
//! | `kubeproxy_sync_proxy_rules_{endpoint,service}_changes_total` | counter | EndpointSlice / Service changes received |
//! | `kubeproxy_sync_proxy_rules_{endpoint,service}_changes_pending` | gauge | such changes not yet synced |
//! | **table** | | |
//! | `kipvs_virtual_servers`, `kipvs_real_servers` | gauge | virtual and real servers in the desired state after the last successful sync |
//! | `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}` | gauge | Services with a Local policy (`internal`/`external`) and no local endpoint |
//! | `kipvs_services_terminating_fallback` | gauge | Services routing to serving+terminating endpoints because none is ready (KEP-1669) |
//! | `kipvs_real_servers_draining` | gauge | real servers at weight 0 waiting for their connections to end |
//! | `kipvs_real_servers_draining_oldest_seconds` | gauge | age of the oldest drain at the last sync (0 when none) |
//! | **servers** | | |
//! | `kubeproxy_proxy_healthz_total{code}`, `kubeproxy_proxy_livez_total{code}` | counter | `/healthz` and `/livez` answers by status code |
//! | `kipvs_server_bind_failures_total{server}` | counter | failed attempts to bind `healthz`, `metrics` or `gRPC health` (retried every 5 s; the proxier goes on without the server) |
//! | **inputs** | | |
//! | `kipvs_api_resource_unavailable{resource}` | gauge | 1 while the API server does not serve a resource kipvs watches (e.g. `endpointslices.discovery.k8s.io/v1` where neither it nor v1beta1 is served, or the EndpointSlice version read once it is not) |
//! | `kipvs_manifests_invalid_files` | gauge | manifests files (`run --manifests`) that cannot be read or do not load as they are; each keeps its last good content |
//! | `kipvs_config_ignored_settings` | gauge | settings of the NodeProxyConfig in force that this version does not know and left out (a newer kipvs wrote them; named in the log and the status message) |
//! | `kipvs_ipvs_scheduler_unavailable{scheduler}` | gauge | 1 for a scheduler a `kipvs.io/scheduler` annotation asks for and the kernel lacks (probed once; those Services get `ipvs.scheduler` and a warning) |
//! | **takeover** ([`crate::engine::takeover`]) | | |
//! | `kipvs_standby` | gauge | 1 while the proxier programs nothing: kube-proxy runs on the node, the node's `serviceProxy` is `kube-proxy`, or the switch is refused |
//! | `kipvs_kube_proxy_back` | gauge | 1 while kube-proxy is back on a node the proxier programmed: the proxier stopped writing (its status says `healthy: false`) |
//! | `kipvs_kube_proxy_removed_total{kind}` | counter | kube-proxy's iptables `rule`s, `chain`s and `ipset`s a takeover removed (a failed removal counts in `kipvs_sync_errors_total{cause="kube-proxy-removal"}`) |

use crate::engine::observer::{Observer, SyncOutcome, TakeoverEvent};
use crate::engine::syncer::SyncReport;
use crate::source::StoreObserver;
use crate::source::store::{ChangeCounts, Store};
use prometheus::{
    Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    register_gauge_with_registry, register_histogram_with_registry,
    register_int_counter_vec_with_registry, register_int_counter_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry,
};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use warp::Filter;

/// Why registering one of this module's metrics cannot fail: its name and help are constants
/// here, valid and unique in the registry.
const VALID: &str = "a valid metric name, unique in the registry";

/// Every metric of the proxier, in one registry, in the groups of the module table. Cheap to
/// clone (handles to shared metrics).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    sync: SyncMetrics,
    changes: ChangeMetrics,
    table: TableMetrics,
    /// The answers and bind failures of the proxier's own servers.
    pub servers: ServerMetrics,
    inputs: InputMetrics,
    takeover: TakeoverMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let registry = Registry::new();
        Metrics {
            sync: SyncMetrics::new(&registry),
            changes: ChangeMetrics::new(&registry),
            table: TableMetrics::new(&registry),
            servers: ServerMetrics::new(&registry),
            inputs: InputMetrics::new(&registry),
            takeover: TakeoverMetrics::new(&registry),
            registry,
        }
    }

    /// Counts one failed attempt to bind the server named `server` (`"healthz"`, ...).
    pub fn bind_failed(&self, server: &str) {
        self.servers
            .bind_failures
            .with_label_values(&[server])
            .inc();
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> String {
        kipvs_exposition::encode(&self.registry)
    }

    /// The metrics server's routes: `/metrics` (`GET`, text format 0.0.4) and `/proxyMode`
    /// (`GET`, [`PROXY_MODE`]).
    pub fn routes(
        &self,
    ) -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone + use<>
    {
        let proxy_mode = warp::path!("proxyMode")
            .and(warp::get())
            .map(|| warp::reply::Reply::into_response(PROXY_MODE));
        kipvs_exposition::route(self.registry.clone())
            .or(proxy_mode)
            .unify()
    }
}

/// The body of `/proxyMode`: kube-proxy's metrics server answers with its mode
/// (`cmd/kube-proxy/app/server.go`, no newline), and upstream's e2e tests read it from the node
/// (`test/e2e/network/service.go` `proxyMode`) to know that IPVS's persistence outlives a
/// session-affinity timeout shorter than its TIME_WAIT; kipvs programs IPVS as kube-proxy's
/// `ipvs` mode does.
pub const PROXY_MODE: &str = "ipvs";

/// One sync's result: its wall time, the last success, how long a change took to reach the
/// kernel, what failed, and the stale conntrack entries it deleted.
#[derive(Clone)]
struct SyncMetrics {
    duration: Histogram,
    full_duration: Histogram,
    last_success: Gauge,
    network_programming: Histogram,
    errors: IntCounterVec,
    conntrack_deleted: IntCounter,
}

impl SyncMetrics {
    fn new(r: &Registry) -> Self {
        SyncMetrics {
            duration: register_histogram_with_registry!(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets"),
                r
            )
            .expect(VALID),
            full_duration: register_histogram_with_registry!(
                "kipvs_full_sync_duration_seconds",
                "Full sync latency in seconds: observe the whole kernel, diff, apply",
                prometheus::exponential_buckets(0.001, 2.0, 18).expect("valid buckets"),
                r
            )
            .expect(VALID),
            last_success: register_gauge_with_registry!(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
                r
            )
            .expect(VALID),
            network_programming: register_histogram_with_registry!(
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
                r
            )
            .expect(VALID),
            errors: register_int_counter_vec_with_registry!(
                "kipvs_sync_errors_total",
                "Sync errors by cause: observe, or the name of the failed op",
                &["cause"],
                r
            )
            .expect(VALID),
            conntrack_deleted: register_int_counter_with_registry!(
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "Cumulative stale UDP conntrack entries deleted",
                r
            )
            .expect(VALID),
        }
    }

    /// Records a sync (`full`: a full one) that observed the dataplane and finished at `now`,
    /// with the EndpointSlice change `trigger_times` it programmed.
    fn succeeded(
        &self,
        report: &SyncReport,
        full: bool,
        trigger_times: &[SystemTime],
        now: SystemTime,
    ) {
        self.duration.observe(report.duration.as_secs_f64());
        if full {
            self.full_duration.observe(report.duration.as_secs_f64());
        }
        self.last_success.set(unix_seconds(now));
        for failure in &report.failures {
            self.errors.with_label_values(&[failure.op.name()]).inc();
        }
        self.conntrack_deleted
            .inc_by(report.conntrack.deleted as u64);
        if report.conntrack.failed > 0 {
            self.errors
                .with_label_values(&["conntrack"])
                .inc_by(report.conntrack.failed as u64);
        }
        for trigger in trigger_times {
            if let Ok(latency) = now.duration_since(*trigger) {
                self.network_programming.observe(latency.as_secs_f64());
            }
        }
    }
}

/// Service and EndpointSlice changes the sources received, and those not yet synced.
#[derive(Clone)]
struct ChangeMetrics {
    last_queued: Gauge,
    endpoint_total: IntCounter,
    endpoint_pending: IntGauge,
    service_total: IntCounter,
    service_pending: IntGauge,
    /// Store change totals already counted.
    counted: Arc<Mutex<ChangeCounts>>,
}

impl ChangeMetrics {
    fn new(r: &Registry) -> Self {
        ChangeMetrics {
            last_queued: register_gauge_with_registry!(
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
                r
            )
            .expect(VALID),
            endpoint_total: register_int_counter_with_registry!(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules EndpointSlice changes",
                r
            )
            .expect(VALID),
            endpoint_pending: register_int_gauge_with_registry!(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules EndpointSlice changes",
                r
            )
            .expect(VALID),
            service_total: register_int_counter_with_registry!(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
                r
            )
            .expect(VALID),
            service_pending: register_int_gauge_with_registry!(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
                r
            )
            .expect(VALID),
            counted: Arc::default(),
        }
    }

    /// Counts the changes `store` received since the last call and sets those pending.
    fn store_updated(&self, store: &Store) {
        let totals = store.change_totals();
        let mut counted = self.counted.lock().expect("metrics lock");
        let new_services = totals.services - counted.services;
        let new_slices = totals.endpoint_slices - counted.endpoint_slices;
        if new_services + new_slices > 0 {
            self.last_queued.set(unix_seconds(SystemTime::now()));
        }
        self.service_total.inc_by(new_services);
        self.endpoint_total.inc_by(new_slices);
        *counted = totals;
        let pending = store.pending_changes();
        self.service_pending.set(saturating_i64(pending.services));
        self.endpoint_pending
            .set(saturating_i64(pending.endpoint_slices));
    }
}

/// The desired table after the last successful sync: its size, the Services without a local
/// endpoint or on the terminating fallback, and the real servers draining.
#[derive(Clone)]
struct TableMetrics {
    virtual_servers: IntGauge,
    real_servers: IntGauge,
    no_local_endpoints: IntGaugeVec,
    terminating_fallback: IntGauge,
    draining: IntGauge,
    draining_oldest: Gauge,
}

impl TableMetrics {
    fn new(r: &Registry) -> Self {
        TableMetrics {
            virtual_servers: register_int_gauge_with_registry!(
                "kipvs_virtual_servers",
                "IPVS virtual servers in the desired state after the last successful sync",
                r
            )
            .expect(VALID),
            real_servers: register_int_gauge_with_registry!(
                "kipvs_real_servers",
                "IPVS real servers in the desired state after the last successful sync",
                r
            )
            .expect(VALID),
            no_local_endpoints: register_int_gauge_vec_with_registry!(
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "Number of Services with a Local traffic policy and no local endpoints",
                &["traffic_policy"],
                r
            )
            .expect(VALID),
            terminating_fallback: register_int_gauge_with_registry!(
                "kipvs_services_terminating_fallback",
                "Services routing to serving+terminating endpoints because none is ready",
                r
            )
            .expect(VALID),
            draining: register_int_gauge_with_registry!(
                "kipvs_real_servers_draining",
                "Real servers at weight 0 waiting for their connections to end",
                r
            )
            .expect(VALID),
            draining_oldest: register_gauge_with_registry!(
                "kipvs_real_servers_draining_oldest_seconds",
                "Age of the oldest draining real server in seconds (0 when none drains)",
                r
            )
            .expect(VALID),
        }
    }

    /// Records the table `outcome` synced towards.
    fn synced(&self, outcome: &SyncOutcome<'_>) {
        self.virtual_servers
            .set(saturating_i64(outcome.desired.virtual_servers.len()));
        self.real_servers.set(saturating_i64(outcome.real_servers));
        self.no_local_endpoints
            .with_label_values(&["internal"])
            .set(saturating_i64(outcome.no_local_endpoints.internal));
        self.no_local_endpoints
            .with_label_values(&["external"])
            .set(saturating_i64(outcome.no_local_endpoints.external));
        self.terminating_fallback
            .set(saturating_i64(outcome.terminating_fallback_services));
        self.draining.set(saturating_i64(outcome.drains.len()));
        let oldest = outcome.drains.values().min().map_or(0.0, |since| {
            tokio::time::Instant::now()
                .duration_since(*since)
                .as_secs_f64()
        });
        self.draining_oldest.set(oldest);
    }
}

/// The proxier's own servers: `/healthz` and `/livez` answers, and failed binds.
#[derive(Clone)]
pub struct ServerMetrics {
    /// `/healthz` answers by code (`kubeproxy_proxy_healthz_total`).
    pub healthz_total: IntCounterVec,
    /// `/livez` answers by code (`kubeproxy_proxy_livez_total`).
    pub livez_total: IntCounterVec,
    bind_failures: IntCounterVec,
}

impl ServerMetrics {
    fn new(r: &Registry) -> Self {
        ServerMetrics {
            healthz_total: register_int_counter_vec_with_registry!(
                "kubeproxy_proxy_healthz_total",
                "Cumulative proxy healthz HTTP status",
                &["code"],
                r
            )
            .expect(VALID),
            livez_total: register_int_counter_vec_with_registry!(
                "kubeproxy_proxy_livez_total",
                "Cumulative proxy livez HTTP status",
                &["code"],
                r
            )
            .expect(VALID),
            bind_failures: register_int_counter_vec_with_registry!(
                "kipvs_server_bind_failures_total",
                "Failed attempts to bind one of the proxier's servers (healthz, metrics, gRPC \
                 health), retried every 5 s",
                &["server"],
                r
            )
            .expect(VALID),
        }
    }
}

/// Inputs the proxier cannot use as given: API resources not served, manifests files that do
/// not load, settings this version does not know, schedulers the kernel lacks.
#[derive(Clone)]
struct InputMetrics {
    api_unavailable: IntGaugeVec,
    invalid_manifests: IntGauge,
    config_ignored: IntGauge,
    scheduler_unavailable: IntGaugeVec,
}

impl InputMetrics {
    fn new(r: &Registry) -> Self {
        InputMetrics {
            api_unavailable: register_int_gauge_vec_with_registry!(
                "kipvs_api_resource_unavailable",
                "1 while the API server does not serve a resource the proxier watches",
                &["resource"],
                r
            )
            .expect(VALID),
            invalid_manifests: register_int_gauge_with_registry!(
                "kipvs_manifests_invalid_files",
                "manifests files that do not load as they are (their last good content is used)",
                r
            )
            .expect(VALID),
            config_ignored: register_int_gauge_with_registry!(
                "kipvs_config_ignored_settings",
                "Settings of the NodeProxyConfig in force this version does not know (ignored)",
                r
            )
            .expect(VALID),
            scheduler_unavailable: register_int_gauge_vec_with_registry!(
                "kipvs_ipvs_scheduler_unavailable",
                "1 for an IPVS scheduler a kipvs.io/scheduler annotation asks for and \
                 this node's kernel lacks (those Services get ipvs.scheduler)",
                &["scheduler"],
                r
            )
            .expect(VALID),
        }
    }
}

/// A takeover from kube-proxy: standby, kube-proxy back, and what of kube-proxy's was removed.
#[derive(Clone)]
struct TakeoverMetrics {
    standby: IntGauge,
    back: IntGauge,
    removed: IntCounterVec,
}

impl TakeoverMetrics {
    fn new(r: &Registry) -> Self {
        TakeoverMetrics {
            standby: register_int_gauge_with_registry!(
                "kipvs_standby",
                "1 while the proxier programs nothing: kube-proxy runs on the node, or the node's \
                 serviceProxy is kube-proxy, or the switch is refused",
                r
            )
            .expect(VALID),
            back: register_int_gauge_with_registry!(
                "kipvs_kube_proxy_back",
                "1 while kube-proxy is back on a node the proxier programmed (the proxier stopped \
                 writing)",
                r
            )
            .expect(VALID),
            removed: register_int_counter_vec_with_registry!(
                "kipvs_kube_proxy_removed_total",
                "kube-proxy's iptables rules, chains and ipsets removed by a takeover",
                &["kind"],
                r
            )
            .expect(VALID),
        }
    }
}

/// kube-proxy's network programming buckets: 0.25 s and 0.5 s, every second to 59 s, every
/// 5 s to 115 s, every 30 s to 300 s.
fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.25, 0.5];
    buckets.extend((1..60).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

/// Seconds since the Unix epoch of `at`.
fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A count as a gauge value (`i64::MAX` beyond it).
fn saturating_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl StoreObserver for Metrics {
    fn store_updated(&self, store: &Store) {
        self.changes.store_updated(store);
    }

    fn invalid_manifests(&self, files: usize) {
        self.inputs.invalid_manifests.set(saturating_i64(files));
    }

    fn resource_unavailable(&self, resource: &'static str, unavailable: bool) {
        self.inputs
            .api_unavailable
            .with_label_values(&[resource])
            .set(unavailable.into());
    }
}

impl Observer for Metrics {
    fn config_ignored(&self, settings: &[String]) {
        self.inputs
            .config_ignored
            .set(saturating_i64(settings.len()));
    }

    fn takeover(&self, event: &TakeoverEvent) {
        match event {
            TakeoverEvent::Standby(_) => self.takeover.standby.set(1),
            TakeoverEvent::KubeProxyBack(_) => {
                self.takeover.standby.set(1);
                self.takeover.back.set(1);
            }
            TakeoverEvent::Programming => {
                self.takeover.standby.set(0);
                self.takeover.back.set(0);
            }
            TakeoverEvent::Removed {
                rules,
                chains,
                sets,
            } => {
                for (kind, n) in [("rule", rules), ("chain", chains), ("ipset", sets)] {
                    let n = u64::try_from(*n).unwrap_or(u64::MAX);
                    self.takeover.removed.with_label_values(&[kind]).inc_by(n);
                }
            }
            TakeoverEvent::RemovalFailed(_) => self
                .sync
                .errors
                .with_label_values(&["kube-proxy-removal"])
                .inc(),
        }
    }

    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        let Ok(report) = outcome.result else {
            self.sync.errors.with_label_values(&["observe"]).inc();
            return;
        };
        let now = SystemTime::now();
        self.sync
            .succeeded(report, outcome.full, outcome.trigger_times, now);
        self.table.synced(outcome);
        for scheduler in outcome.unavailable_schedulers {
            self.inputs
                .scheduler_unavailable
                .with_label_values(&[scheduler.as_str()])
                .set(1);
        }
    }
}

/// The value of the sample of `name` (with its labels, as printed, e.g.
/// `kubeproxy_proxy_healthz_total{code="200"}`) in a text exposition, if present.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::kernel::conntrack::CleanupReport;
    use crate::model::DesiredState;
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    /// Full syncs have a histogram of their own; kube-proxy's counts every sync (issue 32: the
    /// periodic full sync compared with kube-proxy's is read from full syncs only).
    #[test]
    fn full_syncs_have_their_own_histogram() {
        let metrics = Metrics::new();
        let desired = DesiredState::default();
        let (drains, schedulers) = (BTreeMap::new(), BTreeSet::new());
        for (full, seconds) in [(true, 2.0), (false, 0.001), (false, 0.002)] {
            let result = Ok(SyncReport {
                ops: Vec::new(),
                failures: Vec::new(),
                duration: Duration::from_secs_f64(seconds),
                conntrack: CleanupReport::default(),
            });
            metrics.sync_finished(&SyncOutcome {
                result: &result,
                full,
                desired: &desired,
                real_servers: 0,
                health_check_changes: None,
                no_local_endpoints: Default::default(),
                terminating_fallback_services: 0,
                drains: &drains,
                unavailable_schedulers: &schedulers,
                trigger_times: &[],
            });
        }
        let text = metrics.encode();
        let value = |name: &str| sample(&text, name).unwrap_or_else(|| panic!("{name}: {text}"));
        assert_eq!(value("kipvs_full_sync_duration_seconds_count"), 1.0);
        assert_eq!(value("kipvs_full_sync_duration_seconds_sum"), 2.0);
        assert_eq!(
            value("kubeproxy_sync_proxy_rules_duration_seconds_count"),
            3.0
        );
    }
}

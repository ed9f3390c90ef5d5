//! Prometheus metrics on `metricsBindAddress` (default `127.0.0.1:10249`, path `/metrics`).
//!
//! Names follow kube-proxy (`pkg/proxy/metrics/metrics.go`) where it has the metric, without
//! the `ip_family` label newer releases add (one kipvs engine programs both families in one
//! sync); kipvs' own metrics start with `kipvs_`:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `kubeproxy_sync_proxy_rules_duration_seconds` | histogram (1 ms × 2ⁿ, 15 buckets) | wall time of one sync (observe, diff, apply) |
//! | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` | gauge | Unix time of the last successful sync |
//! | `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` | gauge | Unix time of the last change a source queued |
//! | `kubeproxy_network_programming_duration_seconds` | histogram (0.25 s … 300 s) | from an EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time` to the end of the sync that programmed it |
//! | `kubeproxy_sync_proxy_rules_{endpoint,service}_changes_total` | counter | EndpointSlice / Service changes received |
//! | `kubeproxy_sync_proxy_rules_{endpoint,service}_changes_pending` | gauge | such changes not yet synced |
//! | `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}` | gauge | Services with a Local policy (`internal`/`external`) and no local endpoint |
//! | `kubeproxy_proxy_healthz_total{code}`, `kubeproxy_proxy_livez_total{code}` | counter | `/healthz` and `/livez` answers by status code |
//! | `kipvs_virtual_servers`, `kipvs_real_servers` | gauge | virtual and real servers in the desired state after the last successful sync |
//! | `kipvs_real_servers_draining` | gauge | real servers at weight 0 waiting for their connections to end |
//! | `kipvs_real_servers_draining_oldest_seconds` | gauge | age of the oldest drain at the last sync (0 when none) |
//! | `kubeproxy_conntrack_reconciler_deleted_entries_total` | counter | stale UDP conntrack entries deleted ([`crate::dataplane::conntrack`]) |
//! | `kipvs_sync_errors_total{cause}` | counter | `observe` (the dataplane could not be read; nothing changed), the name of a failed op (`AddRealServer`, ...), or `conntrack` (a UDP conntrack listing or delete failed) |
//! | `kipvs_server_bind_failures_total{server}` | counter | failed attempts to bind `healthz`, `metrics` or `gRPC health` (retried every 5 s while programming goes on) |
//! | `kipvs_services_terminating_fallback` | gauge | Services routing to serving+terminating endpoints because none is ready (KEP-1669) |
//! | `kipvs_manifests_invalid_files` | gauge | manifests files (`run --manifests`) that cannot be read or do not load as they are; each keeps its last good content |
//! | `kipvs_ipvs_scheduler_unavailable{scheduler}` | gauge | 1 for a scheduler a `kipvs.io/scheduler` annotation asks for and the kernel lacks (probed once; those Services get `ipvs.scheduler` and a warning) |
//! | `kipvs_config_ignored_settings` | gauge | settings of the NodeProxyConfig in force that this version does not know and left out (a newer kipvs wrote them; named in the log and the status message) |
//! | `kipvs_api_resource_unavailable{resource}` | gauge | 1 while the API server does not serve a resource kipvs watches (e.g. `endpointslices.discovery.k8s.io/v1` on Kubernetes < 1.21) |

use crate::engine::observer::{Observer, SyncOutcome};
use crate::source::StoreObserver;
use crate::source::store::{ChangeCounts, Store};
use kipvs_exposition::register;
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use warp::Filter;

/// Every metric of the proxier, in one registry. Cheap to clone (handles to shared metrics).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    sync_duration: Histogram,
    last_sync: Gauge,
    last_queued: Gauge,
    network_programming: Histogram,
    endpoint_changes_total: IntCounter,
    endpoint_changes_pending: IntGauge,
    service_changes_total: IntCounter,
    service_changes_pending: IntGauge,
    no_local_endpoints: IntGaugeVec,
    /// `/healthz` answers by code (`kubeproxy_proxy_healthz_total`).
    pub healthz_total: IntCounterVec,
    /// `/livez` answers by code (`kubeproxy_proxy_livez_total`).
    pub livez_total: IntCounterVec,
    virtual_servers: IntGauge,
    real_servers: IntGauge,
    draining: IntGauge,
    draining_oldest: Gauge,
    sync_errors: IntCounterVec,
    bind_failures: IntCounterVec,
    conntrack_deleted: IntCounter,
    terminating_fallback: IntGauge,
    api_unavailable: IntGaugeVec,
    scheduler_unavailable: IntGaugeVec,
    invalid_manifests: IntGauge,
    config_ignored: IntGauge,
    /// Store change totals already counted.
    counted: Arc<Mutex<ChangeCounts>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        let r = Registry::new();
        let int_gauge =
            |name: &str, help: &str| register(&r, IntGauge::new(name, help).expect("valid metric"));
        let int_counter = |name: &str, help: &str| {
            register(&r, IntCounter::new(name, help).expect("valid metric"))
        };
        let gauge =
            |name: &str, help: &str| register(&r, Gauge::new(name, help).expect("valid metric"));
        let counter_vec = |name: &str, help: &str, label: &str| {
            register(
                &r,
                IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric"),
            )
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            let opts = HistogramOpts::new(name, help).buckets(buckets);
            register(&r, Histogram::with_opts(opts).expect("valid metric"))
        };
        Metrics {
            sync_duration: histogram(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
                prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets"),
            ),
            last_sync: gauge(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
            ),
            last_queued: gauge(
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
            ),
            network_programming: histogram(
                "kubeproxy_network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                network_programming_buckets(),
            ),
            endpoint_changes_total: int_counter(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "Cumulative proxy rules EndpointSlice changes",
            ),
            endpoint_changes_pending: int_gauge(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Pending proxy rules EndpointSlice changes",
            ),
            service_changes_total: int_counter(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "Cumulative proxy rules Service changes",
            ),
            service_changes_pending: int_gauge(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Pending proxy rules Service changes",
            ),
            no_local_endpoints: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                        "Number of Services with a Local traffic policy and no local endpoints",
                    ),
                    &["traffic_policy"],
                )
                .expect("valid metric"),
            ),
            healthz_total: counter_vec(
                "kubeproxy_proxy_healthz_total",
                "Cumulative proxy healthz HTTP status",
                "code",
            ),
            livez_total: counter_vec(
                "kubeproxy_proxy_livez_total",
                "Cumulative proxy livez HTTP status",
                "code",
            ),
            virtual_servers: int_gauge(
                "kipvs_virtual_servers",
                "IPVS virtual servers in the desired state after the last successful sync",
            ),
            real_servers: int_gauge(
                "kipvs_real_servers",
                "IPVS real servers in the desired state after the last successful sync",
            ),
            draining: int_gauge(
                "kipvs_real_servers_draining",
                "Real servers at weight 0 waiting for their connections to end",
            ),
            draining_oldest: gauge(
                "kipvs_real_servers_draining_oldest_seconds",
                "Age of the oldest draining real server in seconds (0 when none drains)",
            ),
            bind_failures: counter_vec(
                "kipvs_server_bind_failures_total",
                "Failed attempts to bind one of the proxier's servers (healthz, metrics, gRPC \
                 health), retried every 5 s",
                "server",
            ),
            sync_errors: counter_vec(
                "kipvs_sync_errors_total",
                "Sync errors by cause: observe, or the name of the failed op",
                "cause",
            ),
            conntrack_deleted: int_counter(
                "kubeproxy_conntrack_reconciler_deleted_entries_total",
                "Cumulative stale UDP conntrack entries deleted",
            ),
            terminating_fallback: int_gauge(
                "kipvs_services_terminating_fallback",
                "Services routing to serving+terminating endpoints because none is ready",
            ),
            invalid_manifests: int_gauge(
                "kipvs_manifests_invalid_files",
                "manifests files that do not load as they are (their last good content is used)",
            ),
            config_ignored: int_gauge(
                "kipvs_config_ignored_settings",
                "Settings of the NodeProxyConfig in force this version does not know (ignored)",
            ),
            scheduler_unavailable: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kipvs_ipvs_scheduler_unavailable",
                        "1 for an IPVS scheduler a kipvs.io/scheduler annotation asks for and \
                         this node's kernel lacks (those Services get ipvs.scheduler)",
                    ),
                    &["scheduler"],
                )
                .expect("valid metric"),
            ),
            api_unavailable: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "kipvs_api_resource_unavailable",
                        "1 while the API server does not serve a resource the proxier watches",
                    ),
                    &["resource"],
                )
                .expect("valid metric"),
            ),
            counted: Arc::default(),
            registry: r,
        }
    }

    /// Counts one failed attempt to bind the server named `server` (`"healthz"`, ...).
    pub fn bind_failed(&self, server: &str) {
        self.bind_failures.with_label_values(&[server]).inc();
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> String {
        kipvs_exposition::encode(&self.registry)
    }

    /// The `/metrics` route (`GET`, text format 0.0.4).
    pub fn routes(
        &self,
    ) -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone + use<>
    {
        kipvs_exposition::route(self.registry.clone())
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

impl StoreObserver for Metrics {
    fn store_updated(&self, store: &Store) {
        let totals = store.change_totals();
        let mut counted = self.counted.lock().expect("metrics lock");
        let new_services = totals.services - counted.services;
        let new_slices = totals.endpoint_slices - counted.endpoint_slices;
        if new_services + new_slices > 0 {
            self.last_queued.set(unix_seconds(SystemTime::now()));
        }
        self.service_changes_total.inc_by(new_services);
        self.endpoint_changes_total.inc_by(new_slices);
        *counted = totals;
        let pending = store.pending_changes();
        self.service_changes_pending
            .set(i64::try_from(pending.services).unwrap_or(i64::MAX));
        self.endpoint_changes_pending
            .set(i64::try_from(pending.endpoint_slices).unwrap_or(i64::MAX));
    }

    fn invalid_manifests(&self, files: usize) {
        self.invalid_manifests
            .set(i64::try_from(files).unwrap_or(i64::MAX));
    }

    fn resource_unavailable(&self, resource: &'static str, unavailable: bool) {
        self.api_unavailable
            .with_label_values(&[resource])
            .set(unavailable.into());
    }
}

impl Observer for Metrics {
    fn config_ignored(&self, settings: &[String]) {
        self.config_ignored
            .set(i64::try_from(settings.len()).unwrap_or(i64::MAX));
    }

    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        let report = match outcome.result {
            Ok(report) => report,
            Err(_) => {
                self.sync_errors.with_label_values(&["observe"]).inc();
                return;
            }
        };
        let now = SystemTime::now();
        self.sync_duration.observe(report.duration.as_secs_f64());
        self.last_sync.set(unix_seconds(now));
        for failure in &report.failures {
            self.sync_errors
                .with_label_values(&[failure.op.name()])
                .inc();
        }
        self.conntrack_deleted
            .inc_by(report.conntrack.deleted as u64);
        if report.conntrack.failed > 0 {
            self.sync_errors
                .with_label_values(&["conntrack"])
                .inc_by(report.conntrack.failed as u64);
        }
        for trigger in outcome.trigger_times {
            if let Ok(latency) = now.duration_since(*trigger) {
                self.network_programming.observe(latency.as_secs_f64());
            }
        }
        let desired = outcome.desired;
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.virtual_servers
            .set(as_i64(desired.virtual_servers.len()));
        self.real_servers.set(as_i64(outcome.real_servers));
        self.no_local_endpoints
            .with_label_values(&["internal"])
            .set(as_i64(outcome.no_local_endpoints.internal));
        self.no_local_endpoints
            .with_label_values(&["external"])
            .set(as_i64(outcome.no_local_endpoints.external));
        self.terminating_fallback
            .set(as_i64(outcome.terminating_fallback_services));
        self.draining.set(as_i64(outcome.drains.len()));
        for scheduler in outcome.unavailable_schedulers {
            self.scheduler_unavailable
                .with_label_values(&[scheduler.as_str()])
                .set(1);
        }
        let oldest = outcome.drains.values().min().map_or(0.0, |since| {
            tokio::time::Instant::now()
                .duration_since(*since)
                .as_secs_f64()
        });
        self.draining_oldest.set(oldest);
    }
}

/// The value of the sample of `name` (with its labels, as printed, e.g.
/// `kubeproxy_proxy_healthz_total{code="200"}`) in a text exposition, if present.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

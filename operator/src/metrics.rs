//! The operator's Prometheus metrics and its `/metrics`, `/healthz` and `/readyz` endpoints
//! (one HTTP server, `--metrics-bind-address`, default `:8080`).
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `kipvs_operator_reconciles_total{result}` | counter | reconciles of a ProxyConfig, `ok` or `error` |
//! | `kipvs_operator_reconcile_failures_total{kind}` | counter | failed reconciles by cause: `status` (the ProxyConfig status write), `decode` (a spec that cannot be read) |
//! | `kipvs_operator_reconcile_duration_seconds` | histogram | wall time of one reconcile (decide, hand the writes over, status, Events) |
//! | `kipvs_operator_decision_writes` | histogram | NodeProxyConfig writes one decision asks for |
//! | `kipvs_operator_writes_total{kind}` | counter | API writes: `apply` / `delete` (NodeProxyConfig), `status` (ProxyConfig), `event` |
//! | `kipvs_operator_write_errors_total{kind}` | counter | failed NodeProxyConfig write attempts (`apply`, `delete`), each retried with backoff ([`crate::writer`]) |
//! | `kipvs_operator_write_queue` | gauge | NodeProxyConfig writes decided and not yet sent |
//! | `kipvs_operator_rollout_nodes{proxyconfig,state}` | gauge | nodes of a ProxyConfig by state: `total`, `updated`, `healthy`, `failed`, `skipped`, `conflicting` |
//! | `kipvs_operator_rollout_stage{proxyconfig,stage,phase}` | gauge | 1 for the stage being rolled out and its phase; absent when the rollout is complete |
//! | `kipvs_operator_leader` | gauge | 1 while this replica holds the Lease and runs the controller |
//! | `kipvs_operator_leadership_lost_total` | counter | times this replica lost the Lease (it stopped writing and is a candidate again) |
//!
//! The `proxyconfig` series of a deleted ProxyConfig are removed.
//!
//! `/healthz` answers 200 while the process serves; `/readyz` 200 once this replica has reached
//! the API server and found the CRDs (a standby waiting for the Lease is ready: it is what it
//! should be).

use kipvs_crds::ProxyConfigStatus;
use prometheus::{
    Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    register_histogram_with_registry, register_int_counter_vec_with_registry,
    register_int_counter_with_registry, register_int_gauge_vec_with_registry,
    register_int_gauge_with_registry,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use warp::Filter;
use warp::http::StatusCode;
use warp::reply::Reply;

/// Why registering one of this module's metrics cannot fail: its name and help are constants
/// here, valid and unique in the registry.
const VALID: &str = "a valid metric name, unique in the registry";

/// The operator's metrics, by what they watch (cheap to clone: handles to one registry).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Reconciles of ProxyConfigs.
    pub reconcile: ReconcileMetrics,
    /// API writes.
    pub writes: WriteMetrics,
    /// This replica's hold on the Lease.
    pub leadership: LeadershipMetrics,
    rollout: RolloutMetrics,
    ready: Arc<AtomicBool>,
}

/// Reconciles of a ProxyConfig: results, failures, wall time, writes per decision.
#[derive(Clone)]
pub struct ReconcileMetrics {
    /// Reconciles by result (`ok`, `error`).
    pub total: IntCounterVec,
    /// Failed reconciles by cause.
    pub failures: IntCounterVec,
    /// Reconcile wall time.
    pub duration: Histogram,
    /// Writes per decision.
    pub decision_writes: Histogram,
}

impl ReconcileMetrics {
    fn new(r: &Registry) -> Self {
        ReconcileMetrics {
            total: register_int_counter_vec_with_registry!(
                "kipvs_operator_reconciles_total",
                "Reconciles of a ProxyConfig, by result (ok, error)",
                &["result"],
                r
            )
            .expect(VALID),
            failures: register_int_counter_vec_with_registry!(
                "kipvs_operator_reconcile_failures_total",
                "Failed reconciles by cause (status, decode)",
                &["kind"],
                r
            )
            .expect(VALID),
            duration: register_histogram_with_registry!(
                "kipvs_operator_reconcile_duration_seconds",
                "Wall time of one reconcile (decide, hand the writes over, status, Events)",
                prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid buckets"),
                r
            )
            .expect(VALID),
            decision_writes: register_histogram_with_registry!(
                "kipvs_operator_decision_writes",
                "NodeProxyConfig writes one decision asks for",
                prometheus::exponential_buckets(1.0, 2.0, 14).expect("valid buckets"),
                r
            )
            .expect(VALID),
        }
    }
}

/// API writes: those sent, the failed attempts, and the queue of those decided.
#[derive(Clone)]
pub struct WriteMetrics {
    /// API writes by kind.
    pub total: IntCounterVec,
    /// Failed NodeProxyConfig write attempts by kind.
    pub errors: IntCounterVec,
    /// NodeProxyConfig writes decided and not yet sent.
    pub queue: IntGauge,
}

impl WriteMetrics {
    fn new(r: &Registry) -> Self {
        WriteMetrics {
            total: register_int_counter_vec_with_registry!(
                "kipvs_operator_writes_total",
                "API writes by kind (apply, delete, status, event)",
                &["kind"],
                r
            )
            .expect(VALID),
            errors: register_int_counter_vec_with_registry!(
                "kipvs_operator_write_errors_total",
                "Failed NodeProxyConfig write attempts by kind (apply, delete), each retried with backoff",
                &["kind"],
                r
            )
            .expect(VALID),
            queue: register_int_gauge_with_registry!(
                "kipvs_operator_write_queue",
                "NodeProxyConfig writes decided and not yet sent",
                r
            )
            .expect(VALID),
        }
    }
}

/// This replica's hold on the Lease.
#[derive(Clone)]
pub struct LeadershipMetrics {
    /// 1 while this replica leads.
    pub leader: IntGauge,
    /// Times this replica lost the Lease.
    pub lost: IntCounter,
}

impl LeadershipMetrics {
    fn new(r: &Registry) -> Self {
        LeadershipMetrics {
            leader: register_int_gauge_with_registry!(
                "kipvs_operator_leader",
                "1 while this replica holds the Lease and runs the controller",
                r
            )
            .expect(VALID),
            lost: register_int_counter_with_registry!(
                "kipvs_operator_leadership_lost_total",
                "Times this replica lost the Lease (it stopped writing and is a candidate again)",
                r
            )
            .expect(VALID),
        }
    }
}

/// Each ProxyConfig's rollout: its nodes by state and the stage being rolled out.
#[derive(Clone)]
struct RolloutMetrics {
    nodes: IntGaugeVec,
    stage: IntGaugeVec,
}

impl RolloutMetrics {
    fn new(r: &Registry) -> Self {
        RolloutMetrics {
            nodes: register_int_gauge_vec_with_registry!(
                "kipvs_operator_rollout_nodes",
                "Nodes of a ProxyConfig by state (total, updated, healthy, failed, skipped, conflicting)",
                &["proxyconfig", "state"],
                r
            )
            .expect(VALID),
            stage: register_int_gauge_vec_with_registry!(
                "kipvs_operator_rollout_stage",
                "1 for the stage being rolled out, with its phase; absent when complete",
                &["proxyconfig", "stage", "phase"],
                r
            )
            .expect(VALID),
        }
    }
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
            reconcile: ReconcileMetrics::new(&registry),
            writes: WriteMetrics::new(&registry),
            leadership: LeadershipMetrics::new(&registry),
            rollout: RolloutMetrics::new(&registry),
            registry,
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Records a ProxyConfig's rollout progress from the status just decided.
    pub fn rollout(&self, name: &str, status: &ProxyConfigStatus) {
        for (state, value) in [
            ("total", status.total_nodes),
            ("updated", status.updated_nodes),
            ("healthy", status.healthy_nodes),
            ("failed", status.failed_nodes),
            ("skipped", status.skipped_nodes),
            ("conflicting", status.conflicting_node_count),
        ] {
            self.rollout
                .nodes
                .with_label_values(&[name, state])
                .set(i64::from(value));
        }
        self.forget_stage(name);
        if let Some(stage) = &status.stage {
            let phase = status
                .stages
                .iter()
                .find(|s| &s.name == stage)
                .map(|s| format!("{:?}", s.phase))
                .unwrap_or_default();
            self.rollout
                .stage
                .with_label_values(&[name, stage, &phase])
                .set(1);
        }
    }

    /// Drops the stage series of a ProxyConfig (its rollout completed or it was deleted).
    fn forget_stage(&self, name: &str) {
        remove_proxy_configs(&self.rollout.stage, |n| n != name);
    }

    /// Drops the rollout series of every ProxyConfig for which `live` is false (deleted ones).
    pub fn retain_rollouts(&self, live: impl Fn(&str) -> bool) {
        remove_proxy_configs(&self.rollout.nodes, &live);
        remove_proxy_configs(&self.rollout.stage, &live);
    }

    /// Marks this replica ready (see the module docs).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        kipvs_exposition::encode(&self.registry)
    }

    /// `/metrics`, `/healthz` and `/readyz`.
    pub fn routes(
        &self,
    ) -> impl Filter<Extract = (warp::reply::Response,), Error = warp::Rejection> + Clone + use<>
    {
        let exposition = kipvs_exposition::route(self.registry.clone());
        let healthz = warp::path!("healthz")
            .and(warp::get())
            .map(|| "ok".into_response());
        let ready = self.ready.clone();
        let readyz = warp::path!("readyz").and(warp::get()).map(move || {
            if ready.load(Ordering::Relaxed) {
                "ok".into_response()
            } else {
                warp::reply::with_status("not ready", StatusCode::SERVICE_UNAVAILABLE)
                    .into_response()
            }
        });
        exposition.or(healthz).unify().or(readyz).unify()
    }
}

/// Removes the series of `vec` whose `proxyconfig` label `keep` refuses.
fn remove_proxy_configs(vec: &IntGaugeVec, keep: impl Fn(&str) -> bool) {
    for family in prometheus::core::Collector::collect(vec) {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("proxyconfig").is_some_and(|name| !keep(name)) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// Serves [`Metrics::routes`] on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Metrics) {
    warp::serve(metrics.routes()).incoming(listener).run().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kipvs_crds::{StagePhase, StageStatus};

    #[test]
    fn rollout_progress_is_exported_per_proxyconfig() {
        let metrics = Metrics::new();
        let status = ProxyConfigStatus {
            stage: Some("canary".into()),
            stages: vec![StageStatus {
                name: "canary".into(),
                phase: StagePhase::Soaking,
                ..StageStatus::default()
            }],
            total_nodes: 10,
            healthy_nodes: 1,
            ..ProxyConfigStatus::default()
        };
        metrics.rollout("fleet", &status);
        let text = metrics.encode();
        assert!(
            text.contains(r#"kipvs_operator_rollout_nodes{proxyconfig="fleet",state="total"} 10"#),
            "{text}"
        );
        assert!(text.contains(
            r#"kipvs_operator_rollout_stage{phase="Soaking",proxyconfig="fleet",stage="canary"} 1"#
        ));
        // Complete: the stage series goes.
        metrics.rollout("fleet", &ProxyConfigStatus::default());
        assert!(!metrics.encode().contains("kipvs_operator_rollout_stage{"));
    }

    /// GET `path` over a real socket; the status code.
    async fn get(addr: std::net::SocketAddr, path: &str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response[9..12].parse().unwrap()
    }

    #[tokio::test]
    async fn readyz_answers_503_until_ready() {
        let metrics = Metrics::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, metrics.clone()));
        assert_eq!(get(addr, "/healthz").await, 200);
        assert_eq!(get(addr, "/readyz").await, 503);
        metrics.set_ready();
        assert_eq!(get(addr, "/readyz").await, 200);
        assert_eq!(get(addr, "/metrics").await, 200);
    }
}

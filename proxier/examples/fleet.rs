//! The operator's fleet harness (issue 15): N Nodes on a real kube-apiserver and N simulated
//! proxiers, each deciding what to report with the proxier's own status reducer
//! ([`StatusReport`]: Pending, Applied or Failed, and what a sync publishes) and writing it with
//! the proxier's own status writer ([`kipvs_proxier::serve::status::report_status`], with a
//! [`ProxyHealth`] for `healthy`), and each syncing every `syncPeriod` (30 s, spread evenly)
//! through that reducer — so the fleet writes exactly what real proxiers would (a healthy, idle
//! proxier writes nothing), while a real `kipvs-operator` process rolls ProxyConfig revisions
//! out. Prints the target
//! table; with `--check`, fails unless the rollouts complete, the canary's first write comes
//! within `--max-first-write`, and every node gets exactly one NodeProxyConfig write per
//! revision.
//!
//! Nodes are `fleet-00000`.. labelled `kipvs.io/fleet=yes`; `fleet-00000` is the canary
//! (`kipvs.io/canary=true`); every 100th node (index % 100 == 99) is tainted
//! `ToBeDeletedByClusterAutoscaler` and the one before it (98) is NotReady: both are skipped.
//! Each proxier answers a new revision after a delay from its node-name hash (0.1-1 s): Pending,
//! then Applied (or Failed for the `--fail-share` of nodes on every revision after the first;
//! the `--silent-share` never answer the second revision, whose `applyTimeout` is then 15 s,
//! and answer the later ones).
//!
//! With `--flap-share`, that share of nodes (apart from the failing and silent ones) blips
//! `/livez` once the second revision is complete and its `applyTimeout` (then 15 s) has passed
//! for every node: their sync hangs past the health timeout, so the proxier's own
//! [`ProxyHealth`] turns unhealthy and its status writer reports `healthy: false`, until the
//! harness lets them sync again. Health is latched per revision
//! (`operator/src/rollout/stages.rs`): a node unhealthy after its stage completed is reported,
//! not a failure. `--check` fails unless
//! the operator saw the blip (the revision's healthy count drops by the flapping nodes, the
//! Available condition is False) without recording a failure for any of them or touching the
//! revision (still the last good one, not bad), and counts them healthy again afterwards.
//!
//! With `--faults` (needs `--cp-state`), two more revisions roll out under a fault, each once
//! the `fleet` stage has started: the operator is killed (SIGKILL) and restarted 2 s later, as
//! the kubelet restarts a container; then the apiserver is stopped for 30 s and started again
//! (`hack/control-plane.sh stop-apiserver|start-apiserver`). `--check` then also fails unless
//! the operator never exited of its own (it waits out the outage), the restarted operator
//! resumed the rollout where it was (every stage that had started keeps
//! its `startedAt`, every complete one its `healthyAt`), no revision was marked bad (the fault
//! rounds have no failure budget beyond the nodes told to fail: one node counted failed because
//! of the fault would roll the revision back), every
//! answering node ends with the new revision Applied on the apiserver, and every node still got
//! exactly one NodeProxyConfig spec write (no re-write of finished nodes, no burst).
//!
//! The harness runs the operator itself (restarting it whenever it exits, as the kubelet does)
//! and samples CPU time and peak RSS of the
//! operator, kube-apiserver and etcd (`/proc`, the control plane's pid files) per round.
//!
//! usage: `fleet --nodes N --operator BIN --operator-log FILE --operator-metrics ADDR
//!         [--pid-file FILE] [--cp-state DIR] [--check] [--faults] [--max-first-write 5s]
//!         [--quiet 20s] [--fail-share 0.0] [--silent-share 0.0] [--flap-share 0.0]` (KUBECONFIG selects the
//!         cluster; the CRDs must be installed; the operator inherits the environment)

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::config::ProxierConfiguration;
use kipvs_crds::revision::node_hash;
use kipvs_crds::{
    NodePhase, NodeProxyConfig, NodeProxyConfigStatus, ProxyConfig, ProxyConfigStatus, StagePhase,
    StageStatus,
};
use kipvs_proxier::engine::status::{StatusReport, SyncResult};
use kipvs_proxier::serve::health::ProxyHealth;
use kipvs_proxier::serve::status::report_status;
use kipvs_proxier::source::Retry;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

const PC: &str = "scale";

struct Args {
    nodes: usize,
    operator: String,
    operator_log: String,
    operator_metrics: String,
    pid_file: Option<PathBuf>,
    cp_state: Option<PathBuf>,
    check: bool,
    faults: bool,
    max_first_write: Duration,
    quiet: Duration,
    fail_share: f64,
    silent_share: f64,
    flap_share: f64,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        nodes: 500,
        operator: String::new(),
        operator_log: String::new(),
        operator_metrics: "127.0.0.1:18089".to_owned(),
        pid_file: None,
        cp_state: None,
        check: false,
        faults: false,
        max_first_write: Duration::from_secs(5),
        quiet: Duration::from_secs(20),
        fail_share: 0.0,
        silent_share: 0.0,
        flap_share: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--check" => a.check = true,
            "--faults" => a.faults = true,
            _ => {
                let value = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
                a.set(&flag, value)?;
            }
        }
    }
    if a.operator.is_empty() || a.operator_log.is_empty() {
        anyhow::bail!("--operator and --operator-log are required");
    }
    if a.faults && a.cp_state.is_none() {
        anyhow::bail!("--faults needs --cp-state (the control plane's state directory)");
    }
    Ok(a)
}

impl Args {
    fn set(&mut self, flag: &str, value: String) -> anyhow::Result<()> {
        let a = self;
        match flag {
            "--nodes" => a.nodes = value.parse()?,
            "--operator" => a.operator = value,
            "--operator-log" => a.operator_log = value,
            "--operator-metrics" => a.operator_metrics = value,
            "--pid-file" => a.pid_file = Some(value.into()),
            "--cp-state" => a.cp_state = Some(value.into()),
            "--max-first-write" => a.max_first_write = kipvs_crds::duration::parse(&value)?,
            "--quiet" => a.quiet = kipvs_crds::duration::parse(&value)?,
            "--fail-share" => a.fail_share = value.parse()?,
            "--silent-share" => a.silent_share = value.parse()?,
            "--flap-share" => a.flap_share = value.parse()?,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
        Ok(())
    }
}

fn name(i: usize) -> String {
    format!("fleet-{i:05}")
}

/// Skipped by the operator: tainted (99) or NotReady (98).
fn skipped(i: usize) -> bool {
    i % 100 >= 98
}

/// A share in [0, 1) per node, from its name hash.
fn share(node: &str) -> f64 {
    (node_hash(node) >> 11) as f64 / (1u64 << 53) as f64
}

/// One simulated proxier: what it reports is decided by the proxier's status reducer and
/// written by the proxier's status writer.
struct Proxier {
    report: watch::Sender<Option<NodeProxyConfigStatus>>,
    health: ProxyHealth,
    status: Mutex<StatusReport>,
    /// Its sync hangs (a `/livez` blip): syncs do nothing until it recovers.
    hung: AtomicBool,
}

impl Proxier {
    /// Its NodeProxyConfig assigns `revision`: the engine's steps for the status
    /// (`Engine::apply_assigned`): the revision in force assigned again (a rollback) is
    /// reported Applied after the next sync, one that cannot be put in force (`fail`) is
    /// rejected, any other is in force (Pending).
    fn assigned(&self, revision: &str, fail: bool) {
        let mut status = self.status.lock().expect("status");
        let changed = if status.revision() == Some(revision) {
            status.reassigned();
            false
        } else if fail {
            status.rejected(Some(revision.to_owned()), "simulated failure".to_owned())
        } else {
            status.in_force(Some(revision.to_owned()), false, &[])
        };
        self.publish(&status, changed);
    }

    /// A clean sync ended now (`Engine::sync`): health updated, and the status published if
    /// the reducer says so. Returns whether it was.
    fn synced(&self) -> bool {
        if self.hung.load(Ordering::Relaxed) {
            return false;
        }
        self.health.updated();
        let mut status = self.status.lock().expect("status");
        let changed = status.synced(&SyncResult::Clean, std::time::SystemTime::now());
        self.publish(&status, changed);
        changed
    }

    /// Whether its status reports `revision` Applied.
    fn applied(&self, revision: &str) -> bool {
        let status = self.status.lock().expect("status");
        status.status().is_some_and(|s| {
            s.observed_revision.as_deref() == Some(revision) && s.phase == Some(NodePhase::Applied)
        })
    }

    /// Its sync hangs: a change is queued and not synced, and the health timeout is cut to
    /// [`BLIP_TIMEOUT`] so that `/livez` turns unhealthy soon (a real proxier's is
    /// 2 × syncPeriod); its status writer then reports `healthy: false`.
    fn hang(&self) {
        self.hung.store(true, Ordering::Relaxed);
        self.health.configure(BLIP_TIMEOUT, false);
        self.health.queued_update();
    }

    /// The hung sync ends: the health timeout back to [`HEALTH_TIMEOUT`], and a clean sync
    /// (healthy again).
    fn recover(&self) {
        self.health.configure(HEALTH_TIMEOUT, false);
        self.hung.store(false, Ordering::Relaxed);
        self.synced();
    }

    fn publish(&self, status: &StatusReport, changed: bool) {
        if changed {
            self.report.send_replace(status.status().cloned());
        }
    }
}

/// What the harness saw of NodeProxyConfigs.
#[derive(Default)]
struct Seen {
    /// Per (node, revision): NodeProxyConfig spec writes (generation changes) seen.
    writes: HashMap<(String, String), u32>,
    /// Last generation seen per node.
    generation: HashMap<String, i64>,
    /// Last resourceVersion seen per node (a relist after an outage repeats objects).
    resource_version: HashMap<String, String>,
    /// Status-only changes seen (the proxiers' status writes).
    status_writes: usize,
    /// When a revision first reached the canary.
    canary: HashMap<String, Instant>,
    /// When a revision was last written to a node.
    last_write: HashMap<String, Instant>,
    /// Per revision: nodes that reported it Applied.
    applied: HashMap<String, usize>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let client = Client::try_default().await?;
    let operator = Operator::supervise(
        args.operator.clone(),
        vec![
            "--metrics-bind-address".to_owned(),
            args.operator_metrics.clone(),
        ],
        args.operator_log.clone(),
        args.pid_file.clone(),
    );
    let usage = Usage::default();
    {
        let usage = usage.clone();
        let pid = operator.pid.clone();
        let state = args.cp_state.clone();
        tokio::spawn(async move {
            loop {
                usage.sample(&[
                    ("operator", pid.load(Ordering::Relaxed)),
                    (
                        "kube-apiserver",
                        pid_from(state.as_ref().map(|s| s.join("apiserver.pid"))),
                    ),
                    ("etcd", pid_from(state.as_ref().map(|s| s.join("etcd.pid")))),
                ]);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let n = args.nodes;
    let nodes: Api<Node> = Api::all(client.clone());

    // Nodes.
    let t = Instant::now();
    let created: Vec<anyhow::Result<()>> = stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let node = name(i);
                let mut labels = json!({"kipvs.io/fleet": "yes"});
                if i == 0 {
                    labels["kipvs.io/canary"] = "true".into();
                }
                let taints = if i % 100 == 99 {
                    json!([{"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}])
                } else {
                    json!([])
                };
                let object: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node, "labels": labels},
                    "spec": {"taints": taints},
                }))?;
                match nodes.create(&PostParams::default(), &object).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                let ready = if i % 100 == 98 { "False" } else { "True" };
                let status = json!({"status": {"conditions": [
                    {"type": "Ready", "status": ready, "reason": "Fleet", "message": "fleet harness"}
                ]}});
                nodes
                    .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for result in created {
        result?;
    }
    let eligible = (0..n).filter(|i| !skipped(*i)).count();
    eprintln!(
        "fleet: {n} Nodes ({eligible} eligible) in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // Proxiers: one status writer each (the proxier's own).
    let mut proxiers = HashMap::new();
    for i in 0..n {
        let node = name(i);
        let (report, receiver) = watch::channel(None);
        let health = ProxyHealth::new(HEALTH_TIMEOUT, false);
        health.updated();
        tokio::spawn(report_status(
            client.clone(),
            node.clone(),
            receiver,
            health.clone(),
        ));
        proxiers.insert(
            node,
            Arc::new(Proxier {
                report,
                health,
                status: Mutex::default(),
                hung: AtomicBool::new(false),
            }),
        );
    }
    let proxiers = Arc::new(proxiers);

    // The proxiers' side of the contract, and the harness's bookkeeping.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let npcs: Api<NodeProxyConfig> = Api::all(client.clone());
    {
        let seen = seen.clone();
        let proxiers = proxiers.clone();
        let (fail, silent) = (args.fail_share, args.silent_share);
        // Retried as the proxier's own NodeProxyConfig watch is (`source::Retry`: back within
        // a few seconds of the apiserver), not with kube-runtime's default backoff, which
        // waits up to 30 s more after an outage.
        let mut events = watcher(npcs.clone(), watcher::Config::default()).boxed();
        let mut retry = Retry::new("fleet NodeProxyConfig watch");
        let mut revision_index: HashMap<String, usize> = HashMap::new();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let npc = match event {
                    Ok(watcher::Event::Apply(npc) | watcher::Event::InitApply(npc)) => {
                        retry.succeeded();
                        npc
                    }
                    Ok(_) => {
                        retry.succeeded();
                        continue;
                    }
                    Err(e) => {
                        retry.failed(&e, "the assignments seen").await;
                        continue;
                    }
                };
                let node = npc.name_any();
                let revision = npc.spec.revision.clone();
                let generation = npc.metadata.generation.unwrap_or_default();
                let next = revision_index.len();
                let index = *revision_index.entry(revision.clone()).or_insert(next);
                {
                    let mut seen = seen.lock().expect("seen");
                    let version = npc.resource_version().unwrap_or_default();
                    if seen.resource_version.get(&node) == Some(&version) {
                        continue; // seen already (a relist)
                    }
                    seen.resource_version.insert(node.clone(), version);
                    if seen.generation.get(&node) == Some(&generation) {
                        seen.status_writes += 1;
                        continue; // a status write
                    }
                    seen.generation.insert(node.clone(), generation);
                    *seen
                        .writes
                        .entry((node.clone(), revision.clone()))
                        .or_default() += 1;
                    seen.last_write.insert(revision.clone(), Instant::now());
                    if node == name(0) {
                        seen.canary
                            .entry(revision.clone())
                            .or_insert_with(Instant::now);
                    }
                }
                let Some(proxier) = proxiers.get(&node).cloned() else {
                    continue;
                };
                let s = share(&node);
                if index == 1 && s < silent {
                    continue;
                }
                let failed = index >= 1 && s >= silent && s < silent + fail;
                let delay = Duration::from_millis(100 + (s * 900.0) as u64);
                let seen = seen.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    proxier.assigned(&revision, failed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    proxier.synced();
                    if proxier.applied(&revision) {
                        *seen
                            .lock()
                            .expect("seen")
                            .applied
                            .entry(revision)
                            .or_default() += 1;
                    }
                });
            }
        });
    }

    // Periodic syncs: each proxier syncs every syncPeriod, spread evenly (what N real proxiers
    // do); the reducer decides whether a sync is published.
    let sync_period = ProxierConfiguration::default().ipvs.sync_period;
    let syncs = Arc::new(AtomicUsize::new(0));
    let sync_writes = Arc::new(AtomicUsize::new(0));
    {
        let proxiers = proxiers.clone();
        let (syncs, sync_writes) = (syncs.clone(), sync_writes.clone());
        tokio::spawn(async move {
            let names: Vec<String> = (0..n).map(name).collect();
            let gap = sync_period / n.max(1) as u32;
            loop {
                for node in &names {
                    tokio::time::sleep(gap).await;
                    syncs.fetch_add(1, Ordering::Relaxed);
                    if proxiers[node].synced() {
                        sync_writes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }

    let pcs: Api<ProxyConfig> = Api::all(client.clone());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut rounds = vec![("wrr", None), ("lc", None)];
    if args.faults {
        rounds.push(("rr", Some(Fault::KillOperator)));
        rounds.push(("wlc", Some(Fault::StopApiserver)));
    }
    for (round, (scheduler, fault)) in rounds.into_iter().enumerate() {
        let label = format!("revision {}", round + 1);
        // Under a fault the last stage goes in smaller steps, so that the fault lands inside it,
        // and the failure budget is exactly the nodes told to fail: one node
        // counted failed because of the fault marks the revision bad (a rollback).
        let fleet_step = if fault.is_some() { "10%" } else { "25%" };
        let told_to_fail = |i: usize| {
            let s = share(&name(i));
            s >= args.silent_share && s < args.silent_share + args.fail_share
        };
        let silent = |i: usize| share(&name(i)) < args.silent_share;
        // The flap round's nodes must be past their apply timeout for a blip to be a failure
        // at all (before it, an unhealthy node is still in flight).
        // Silent nodes fail by it too (the round would otherwise wait 5 minutes for them).
        let flap_round = round == 1 && args.flap_share > 0.0;
        let short_timeout = round == 1 && (args.flap_share > 0.0 || args.silent_share > 0.0);
        let apply_timeout = if short_timeout {
            FLAP_APPLY_TIMEOUT
        } else {
            "5m"
        };
        let budget = match fault {
            None => n,
            Some(_) => (0..n).filter(|i| !skipped(*i) && told_to_fail(*i)).count(),
        };
        let body = json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
            "metadata": {"name": PC},
            "spec": {
                "nodeSelector": {"matchLabels": {"kipvs.io/fleet": "yes"}},
                "config": {"ipvs": {"scheduler": scheduler}},
                "rollout": {"failureBudget": budget, "applyTimeout": apply_timeout, "stages": [
                    {"name": "canary", "nodeSelector": {"matchLabels": {"kipvs.io/canary": "true"}}, "minNodes": 1},
                    {"name": "early", "size": "10%", "maxUnavailable": "100%"},
                    {"name": "fleet", "maxUnavailable": fleet_step}
                ]}
            }
        });
        let revision = kipvs_crds::revision::config_revision(&serde_json::from_value(
            body["spec"]["config"].clone(),
        )?);
        let label = format!("{label} ({revision})");
        let usage_before = usage.snapshot();
        let status_writes_before = seen.lock().expect("seen").status_writes;
        let start = Instant::now();
        pcs.patch(
            PC,
            &PatchParams::apply("fleet-harness").force(),
            &Patch::Apply(&body),
        )
        .await?;
        let reconciles_before = reconciles(&args.operator_log);
        // Wait for the canary's write, then for every eligible, answering node to apply; a
        // fault lands once the last stage has started.
        let answering =
            |i: usize| !(skipped(i) || round >= 1 && told_to_fail(i) || round == 1 && silent(i));
        let expected_applied = (0..n).filter(|i| answering(*i)).count();
        let deadline = start + Duration::from_secs(600);
        let mut first_write = None;
        let mut pending_fault = fault;
        let mut landed: Option<(Fault, Vec<StageStatus>, String)> = None;
        let mut polls = 0u32;
        let all_applied = loop {
            let (canary, applied) = {
                let seen = seen.lock().expect("seen");
                (
                    seen.canary.get(&revision).copied(),
                    seen.applied.get(&revision).copied().unwrap_or(0),
                )
            };
            if first_write.is_none()
                && let Some(at) = canary
            {
                first_write = Some(at.saturating_duration_since(start));
            }
            if let Some(f) = pending_fault
                && let Ok(pc) = pcs.get(PC).await
                && let Some(status) = pc.status
                && let Some(stages) = last_stage_started(&status, &revision)
            {
                let at = format!(
                    "stage {}, {} of {} nodes updated",
                    status.stage.as_deref().unwrap_or("-"),
                    status.updated_nodes,
                    status.total_nodes
                );
                eprintln!("fleet: {label}: {} at {at}", f.describe());
                match f {
                    Fault::KillOperator => operator.kill(),
                    Fault::StopApiserver => {
                        let state = args.cp_state.as_ref().expect("checked in args()");
                        let outage = Instant::now();
                        control_plane("stop-apiserver", state).await?;
                        tokio::time::sleep(APISERVER_OUTAGE).await;
                        control_plane("start-apiserver", state).await?;
                        eprintln!(
                            "fleet: {label}: apiserver back after {:.1} s",
                            outage.elapsed().as_secs_f64()
                        );
                    }
                }
                landed = Some((f, stages, at));
                pending_fault = None;
            }
            // A revision the operator marked bad never completes: stop waiting (once a second).
            polls += 1;
            if polls.is_multiple_of(10)
                && let Ok(pc) = pcs.get(PC).await
                && pc
                    .status
                    .is_some_and(|s| s.bad_revisions.contains(&revision))
            {
                break None;
            }
            if applied >= expected_applied && pending_fault.is_none() {
                break Some(start.elapsed());
            }
            if applied >= expected_applied || Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Then the operator's verdict (the apiserver may still be coming back).
        let verdict = loop {
            if let Ok(pc) = pcs.get(PC).await {
                let status = pc.status.unwrap_or_default();
                if status.last_good_revision.as_deref() == Some(revision.as_str())
                    || status.bad_revisions.contains(&revision)
                    || Instant::now() > deadline
                {
                    break status;
                }
            } else if Instant::now() > deadline {
                break ProxyConfigStatus::default();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let complete = start.elapsed();
        let reason = verdict
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        let writes: Vec<u32> = {
            let seen = seen.lock().expect("seen");
            (0..n)
                .filter(|i| !skipped(*i))
                .map(|i| {
                    seen.writes
                        .get(&(name(i), revision.clone()))
                        .copied()
                        .unwrap_or(0)
                })
                .collect()
        };
        let exactly_one = writes.iter().filter(|w| **w == 1).count();
        let max_writes = writes.iter().copied().max().unwrap_or(0);
        let reconciles_during = reconciles(&args.operator_log) - reconciles_before;
        let status_writes = seen.lock().expect("seen").status_writes - status_writes_before;
        // What the apiserver holds: every answering node on the revision, Applied.
        let on_apiserver = npcs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|npc| {
                let status = npc.status.as_ref();
                npc.spec.revision == revision
                    && status.and_then(|s| s.observed_revision.as_deref())
                        == Some(revision.as_str())
                    && status.and_then(|s| s.phase) == Some(NodePhase::Applied)
            })
            .count();
        let fmt = |d: Option<Duration>| {
            d.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
        };
        rows.push(format!(
            "| {label} | apply -> canary's NodeProxyConfig written | {} |",
            fmt(first_write)
        ));
        rows.push(format!(
            "| {label} | 3-stage rollout, zero soak: apply -> all {expected_applied} answering \
             nodes Applied | {} |",
            fmt(all_applied)
        ));
        rows.push(format!(
            "| {label} | operator's verdict: Progressing {reason} with {}/{} healthy, \
             {on_apiserver} NodeProxyConfigs Applied on the apiserver | {:.2} s |",
            verdict.healthy_nodes,
            verdict.total_nodes,
            complete.as_secs_f64()
        ));
        rows.push(format!(
            "| {label} | NodeProxyConfig spec writes per eligible node | exactly 1 on \
             {exactly_one}/{eligible}, max {max_writes} |"
        ));
        rows.push(format!(
            "| {label} | reconciles; proxier status writes | \
             {reconciles_during}; {status_writes} |"
        ));
        rows.push(format!(
            "| {label} | CPU seconds: {} | |",
            usage.snapshot().since(&usage_before)
        ));
        if first_write.is_none_or(|d| d > args.max_first_write) {
            failures.push(format!(
                "{label}: first write {} > {:?}",
                fmt(first_write),
                args.max_first_write
            ));
        }
        if all_applied.is_none() {
            failures.push(format!("{label}: rollout did not complete"));
        }
        if exactly_one != eligible {
            failures.push(format!(
                "{label}: {exactly_one} of {eligible} nodes got exactly one write (max {max_writes})"
            ));
        }
        if verdict.last_good_revision.as_deref() != Some(revision.as_str())
            || verdict.bad_revisions.contains(&revision)
        {
            failures.push(format!(
                "{label}: the operator did not finish the revision (lastGoodRevision {:?}, \
                 badRevisions {:?})",
                verdict.last_good_revision, verdict.bad_revisions
            ));
        }
        if on_apiserver < expected_applied {
            failures.push(format!(
                "{label}: {on_apiserver} of {expected_applied} NodeProxyConfigs show the \
                 revision Applied on the apiserver (lost revisions)"
            ));
        }
        match (fault, landed) {
            (None, _) => {}
            (Some(f), None) => failures.push(format!(
                "{label}: {} never landed inside the last stage",
                f.describe()
            )),
            (Some(f), Some((_, before, at))) => {
                let resumed = resumed(&before, &verdict.stages);
                rows.push(format!(
                    "| {label} | {} at {at}: resumed (started stages keep startedAt, complete \
                     ones healthyAt); operator restarts so far (exits of its own) | {}; {} ({}) |",
                    f.describe(),
                    if resumed.is_empty() { "yes" } else { "NO" },
                    operator.restarts(),
                    operator.exits()
                ));
                for r in resumed {
                    failures.push(format!("{label}: after {}: {r}", f.describe()));
                }
                if operator.exits() > 0 {
                    failures.push(format!(
                        "{label}: the operator exited {} time(s) of its own (it waits out an \
                         apiserver outage)",
                        operator.exits()
                    ));
                }
            }
        }
        if flap_round && all_applied.is_some() {
            let flapping: Vec<String> = (0..n)
                .filter(|i| answering(*i))
                .map(name)
                .filter(|node| {
                    let s = share(node);
                    let from = args.silent_share + args.fail_share;
                    s >= from && s < from + args.flap_share
                })
                .collect();
            let blip = flap(&pcs, &proxiers, &flapping, &revision, &seen).await;
            rows.push(format!(
                "| {label} | /livez blip of {} node(s) after the revision completed and their \
                 applyTimeout {FLAP_APPLY_TIMEOUT} passed (latched health): healthy during, \
                 after | {} |",
                flapping.len(),
                blip.describe()
            ));
            failures.extend(blip.problems(&label, &flapping, &revision));
        }
        if all_applied.is_none() {
            break; // later revisions would not complete either (the size, or a rollback)
        }
    }

    // Quiet: nothing changes, the proxiers only sync. First let the last rollout's own trailing
    // reconciles (its final status writes, the operator's 500 ms decision spacing) pass: up to
    // 15 s, until 2 s go by without one; they are not sync-driven.
    for _ in 0..7 {
        let settled = reconciles(&args.operator_log);
        tokio::time::sleep(Duration::from_secs(2)).await;
        if reconciles(&args.operator_log) == settled {
            break;
        }
    }
    let before = reconciles(&args.operator_log);
    let (syncs_before, sync_writes_before) = (
        syncs.load(Ordering::Relaxed),
        sync_writes.load(Ordering::Relaxed),
    );
    let status_writes_before = seen.lock().expect("seen").status_writes;
    tokio::time::sleep(args.quiet).await;
    let quiet = reconciles(&args.operator_log) - before;
    let quiet_syncs = syncs.load(Ordering::Relaxed) - syncs_before;
    let quiet_published = sync_writes.load(Ordering::Relaxed) - sync_writes_before;
    let quiet_seen = seen.lock().expect("seen").status_writes - status_writes_before;
    rows.push(format!(
        "| quiet {:.0} s: {quiet_syncs} proxier syncs, {quiet_published} status writes published, \
         {quiet_seen} seen | reconciles | {quiet} |",
        args.quiet.as_secs_f64()
    ));
    if quiet > 1 {
        failures.push(format!("{quiet} reconciles while the proxiers only synced"));
    }
    if quiet_published > 0 {
        failures.push(format!(
            "{quiet_published} status writes while the proxiers only synced (no heartbeat)"
        ));
    }
    let total = usage.snapshot();
    rows.push(format!(
        "| peak RSS (VmHWM) at {n} nodes: {} | |",
        total.peaks()
    ));

    println!("| figure | measured |");
    println!("|---|---|");
    for row in &rows {
        let row = row.replacen(" | ", ": ", 1);
        println!("{row}");
    }
    println!("operator metrics (kipvs_operator_*, histogram buckets left out):");
    match operator_metrics(&args.operator_metrics).await {
        Ok(text) => {
            for line in text
                .lines()
                .filter(|l| l.starts_with("kipvs_operator_") && !l.contains("_bucket{"))
            {
                println!("  {line}");
            }
        }
        Err(e) => println!("  cannot read {}: {e}", args.operator_metrics),
    }
    operator.stop().await;
    if args.check && !failures.is_empty() {
        for f in &failures {
            eprintln!("fleet: FAIL {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}

/// The health timeout of a simulated proxier (a real one's is 2 × syncPeriod).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);
/// The health timeout of a proxier whose sync hangs in a `/livez` blip.
const BLIP_TIMEOUT: Duration = Duration::from_millis(500);
/// The flap round's applyTimeout: the blip comes once it has passed for every node.
const FLAP_APPLY_TIMEOUT: &str = "15s";
/// How long the harness waits for the operator to see a blip begin, or end.
const BLIP_WAIT: Duration = Duration::from_secs(30);

/// What the operator's status said during and after a `/livez` blip.
#[derive(Default)]
struct Blip {
    /// Healthy nodes before the blip.
    before: u32,
    /// The status with the fewest healthy nodes seen while the nodes were unhealthy.
    during: Option<ProxyConfigStatus>,
    /// The status once they were healthy again (or the last one seen).
    after: Option<ProxyConfigStatus>,
}

impl Blip {
    fn describe(&self) -> String {
        let one = |s: &Option<ProxyConfigStatus>| {
            s.as_ref().map_or("-".to_owned(), |s| {
                let available = s
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Available")
                    .map_or("-".to_owned(), |c| format!("{} {}", c.status, c.reason));
                format!(
                    "{}/{} healthy, Available {available}, {} failure(s) recorded",
                    s.healthy_nodes,
                    s.total_nodes,
                    s.failures.len()
                )
            })
        };
        format!(
            "{} healthy before; {}; {}",
            self.before,
            one(&self.during),
            one(&self.after)
        )
    }

    /// What the operator got wrong about the blip of `flapping` on `revision`.
    fn problems(&self, label: &str, flapping: &[String], revision: &str) -> Vec<String> {
        let mut problems = Vec::new();
        let healthy = self.before;
        let k = flapping.len() as u32;
        match &self.during {
            Some(s) if s.healthy_nodes + k <= healthy => {
                let available = s.conditions.iter().find(|c| c.type_ == "Available");
                if available.is_none_or(|c| c.status != "False") {
                    problems.push(format!(
                        "{label}: blip: {k} node(s) unhealthy and Available is {:?}",
                        available.map(|c| (&c.status, &c.reason))
                    ));
                }
            }
            s => problems.push(format!(
                "{label}: blip: the operator never counted the {k} unhealthy node(s) out of \
                 {healthy} healthy (fewest seen: {:?})",
                s.as_ref().map(|s| s.healthy_nodes)
            )),
        }
        for s in self.during.iter().chain(&self.after) {
            let counted: Vec<&str> = s
                .failures
                .iter()
                .filter(|f| flapping.contains(&f.node))
                .map(|f| f.node.as_str())
                .collect();
            if !counted.is_empty() {
                problems.push(format!(
                    "{label}: blip after the stage completed counted as failure of {counted:?} \
                     (health is latched per revision)"
                ));
            }
            if s.last_good_revision.as_deref() != Some(revision)
                || s.bad_revisions.iter().any(|b| b == revision)
            {
                problems.push(format!(
                    "{label}: blip changed the verdict: lastGoodRevision {:?}, badRevisions {:?}",
                    s.last_good_revision, s.bad_revisions
                ));
            }
        }
        if self
            .after
            .as_ref()
            .is_none_or(|s| s.healthy_nodes < healthy)
        {
            problems.push(format!(
                "{label}: blip: healthy not back to {healthy} after the nodes recovered ({:?})",
                self.after.as_ref().map(|s| s.healthy_nodes)
            ));
        }
        problems
    }
}

/// A `/livez` blip of `flapping` once `revision` is complete: waits until its applyTimeout
/// has passed since its last write (before it, an unhealthy node is in flight, not failed),
/// hangs their syncs until the operator's status shows them unhealthy (or [`BLIP_WAIT`]),
/// then lets them recover and waits until it counts them healthy again.
async fn flap(
    pcs: &Api<ProxyConfig>,
    proxiers: &HashMap<String, Arc<Proxier>>,
    flapping: &[String],
    revision: &str,
    seen: &Mutex<Seen>,
) -> Blip {
    let timeout = kipvs_crds::duration::parse(FLAP_APPLY_TIMEOUT).expect("a duration");
    let last_write = seen.lock().expect("seen").last_write.get(revision).copied();
    if let Some(at) = last_write {
        tokio::time::sleep_until((at + timeout + Duration::from_secs(1)).into()).await;
    }
    let Some(before) = pcs.get(PC).await.ok().and_then(|pc| pc.status) else {
        return Blip::default();
    };
    let mut blip = Blip {
        before: before.healthy_nodes,
        ..Blip::default()
    };
    let k = flapping.len() as u32;
    for node in flapping {
        proxiers[node].hang();
    }
    poll_status(pcs, |s| {
        let lowest = blip.during.as_ref().map_or(u32::MAX, |d| d.healthy_nodes);
        let done = s.healthy_nodes + k <= before.healthy_nodes;
        if s.healthy_nodes < lowest {
            blip.during = Some(s);
        }
        done
    })
    .await;
    for node in flapping {
        proxiers[node].recover();
    }
    poll_status(pcs, |s| {
        let done = s.healthy_nodes >= before.healthy_nodes;
        blip.after = Some(s);
        done
    })
    .await;
    blip
}

/// Hands the ProxyConfig's status to `seen` every 200 ms until it returns true, for at most
/// [`BLIP_WAIT`].
async fn poll_status(pcs: &Api<ProxyConfig>, mut seen: impl FnMut(ProxyConfigStatus) -> bool) {
    let start = Instant::now();
    while start.elapsed() < BLIP_WAIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(status) = pcs.get(PC).await.ok().and_then(|pc| pc.status)
            && seen(status)
        {
            return;
        }
    }
}

/// How long the apiserver is down in the outage fault (issue 15).
const APISERVER_OUTAGE: Duration = Duration::from_secs(30);
/// How long the supervisor waits before restarting an exited operator.
const OPERATOR_RESTART: Duration = Duration::from_secs(2);

/// A fault injected in the middle of a rollout.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGKILL the operator (the supervisor restarts it).
    KillOperator,
    /// Stop the apiserver for [`APISERVER_OUTAGE`], then start it again.
    StopApiserver,
}

impl Fault {
    fn describe(self) -> String {
        match self {
            Fault::KillOperator => format!(
                "operator killed (SIGKILL), restarted {} s later",
                OPERATOR_RESTART.as_secs()
            ),
            Fault::StopApiserver => format!(
                "apiserver stopped for {} s, then started",
                APISERVER_OUTAGE.as_secs()
            ),
        }
    }
}

/// The stage statuses once the rollout of `revision` is inside its last stage (that stage
/// started, earlier ones complete).
fn last_stage_started(status: &ProxyConfigStatus, revision: &str) -> Option<Vec<StageStatus>> {
    let last = status.stages.last()?;
    (status.target_revision.as_deref() == Some(revision)
        && status.stage.as_deref() == Some(last.name.as_str())
        && last.started_at.is_some()
        && last.updated > 0
        && last.phase == StagePhase::Progressing)
        .then(|| status.stages.clone())
}

/// What a restarted operator forgot: stages that had started must keep `startedAt`, complete
/// ones `healthyAt` and stay complete.
fn resumed(before: &[StageStatus], after: &[StageStatus]) -> Vec<String> {
    let mut problems = Vec::new();
    for b in before {
        let Some(a) = after.iter().find(|a| a.name == b.name) else {
            problems.push(format!("stage {} is gone from status", b.name));
            continue;
        };
        if b.started_at.is_some() && a.started_at != b.started_at {
            problems.push(format!(
                "stage {} restarted: startedAt {:?} -> {:?}",
                b.name, b.started_at, a.started_at
            ));
        }
        if b.phase == StagePhase::Complete
            && (a.phase != StagePhase::Complete || a.healthy_at != b.healthy_at)
        {
            problems.push(format!(
                "complete stage {} re-ran: {:?} healthyAt {:?} -> {:?} {:?}",
                b.name, b.phase, b.healthy_at, a.phase, a.healthy_at
            ));
        }
    }
    problems
}

/// `hack/control-plane.sh ACTION STATE` (the harness runs from the repository root).
async fn control_plane(action: &str, state: &std::path::Path) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("hack/control-plane.sh")
        .arg(action)
        .arg(state)
        .status()
        .await?;
    anyhow::ensure!(status.success(), "hack/control-plane.sh {action}: {status}");
    Ok(())
}

/// The operator process, run and restarted like the kubelet runs a container.
struct Operator {
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicUsize>,
    /// Exits that were not a kill of the harness.
    exits: Arc<AtomicUsize>,
    kill: mpsc::UnboundedSender<bool>,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Operator {
    /// Starts `bin` with `args`, output appended to `log`, its pid written to `pid_file`;
    /// restarts it [`OPERATOR_RESTART`] after it exits.
    fn supervise(
        bin: String,
        args: Vec<String>,
        log: String,
        pid_file: Option<PathBuf>,
    ) -> Operator {
        let pid = Arc::new(AtomicU32::new(0));
        let restarts = Arc::new(AtomicUsize::new(0));
        let exits = Arc::new(AtomicUsize::new(0));
        let (kill, mut killed) = mpsc::unbounded_channel::<bool>();
        let task = {
            let (pid, restarts, exits) = (pid.clone(), restarts.clone(), exits.clone());
            tokio::spawn(async move {
                loop {
                    let child = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log)
                        .and_then(|out| {
                            tokio::process::Command::new(&bin)
                                .args(&args)
                                .stdout(out.try_clone()?)
                                .stderr(out)
                                .kill_on_drop(true)
                                .spawn()
                        });
                    let mut child = match child {
                        Ok(child) => child,
                        Err(e) => {
                            eprintln!("fleet: cannot start {bin}: {e}");
                            return;
                        }
                    };
                    let id = child.id().unwrap_or_default();
                    pid.store(id, Ordering::Relaxed);
                    if let Some(file) = &pid_file {
                        let _ = std::fs::write(file, id.to_string());
                    }
                    let (status, last) = tokio::select! {
                        status = child.wait() => {
                            exits.fetch_add(1, Ordering::Relaxed);
                            (status, false)
                        }
                        Some(last) = killed.recv() => {
                            let _ = child.start_kill();
                            (child.wait().await, last)
                        }
                    };
                    if last {
                        return;
                    }
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    eprintln!(
                        "fleet: operator (pid {id}) exited: {status}; restarting in {} s",
                        OPERATOR_RESTART.as_secs()
                    );
                    restarts.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(OPERATOR_RESTART).await;
                }
            })
        };
        Operator {
            pid,
            restarts,
            exits,
            kill,
            done: Mutex::new(Some(task)),
        }
    }

    fn restarts(&self) -> usize {
        self.restarts.load(Ordering::Relaxed)
    }

    fn exits(&self) -> usize {
        self.exits.load(Ordering::Relaxed)
    }

    /// SIGKILL (the supervisor restarts it).
    fn kill(&self) {
        let _ = self.kill.send(false);
    }

    /// Stops it for good.
    async fn stop(&self) {
        let _ = self.kill.send(true);
        let task = self.done.lock().expect("operator task").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// CPU time and peak RSS per process role, sampled from `/proc` every 0.5 s (processes that
/// restart are summed over their pids).
#[derive(Clone, Default)]
struct Usage {
    roles: Arc<Mutex<Vec<RoleUsage>>>,
}

/// One role's samples: its name, CPU milliseconds per pid, peak VmHWM (KiB) over its pids.
type RoleUsage = (&'static str, HashMap<u32, u64>, u64);

/// A copy of [`Usage`] at one moment.
struct UsageSnapshot(Vec<(&'static str, f64, u64)>);

impl Usage {
    fn sample(&self, pids: &[(&'static str, u32)]) {
        let ticks_per_second = 100; // USER_HZ on Linux
        let mut roles = self.roles.lock().expect("usage");
        for (role, pid) in pids {
            if *pid == 0 {
                continue;
            }
            let Some((cpu, hwm)) = proc_usage(*pid) else {
                continue;
            };
            let i = match roles.iter().position(|r| r.0 == *role) {
                Some(i) => i,
                None => {
                    roles.push((role, HashMap::new(), 0));
                    roles.len() - 1
                }
            };
            roles[i].1.insert(*pid, cpu * 1000 / ticks_per_second);
            roles[i].2 = roles[i].2.max(hwm);
        }
    }

    fn snapshot(&self) -> UsageSnapshot {
        let roles = self.roles.lock().expect("usage");
        UsageSnapshot(
            roles
                .iter()
                .map(|(role, cpu, hwm)| (*role, cpu.values().sum::<u64>() as f64 / 1000.0, *hwm))
                .collect(),
        )
    }
}

impl UsageSnapshot {
    /// CPU seconds per role since `before`.
    fn since(&self, before: &UsageSnapshot) -> String {
        self.0
            .iter()
            .map(|(role, cpu, _)| {
                let was = before.0.iter().find(|b| b.0 == *role).map_or(0.0, |b| b.1);
                format!("{role} {:.1}", cpu - was)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Peak RSS per role.
    fn peaks(&self) -> String {
        self.0
            .iter()
            .map(|(role, _, hwm)| format!("{role} {:.1} MiB", *hwm as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A process's CPU time (utime + stime, in ticks) and peak RSS (VmHWM, KiB), from `/proc`.
fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let cpu = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    Some((cpu, hwm))
}

/// A pid from a control plane pid file (0 when it is not there).
fn pid_from(file: Option<PathBuf>) -> u32 {
    file.and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The operator's /metrics text (plain HTTP/1.0 GET).
async fn operator_metrics(address: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text)
}

/// Reconciles the operator logged so far (its debug line "reconciled" per reconcile).
fn reconciles(log: &str) -> usize {
    std::fs::read_to_string(log)
        .map(|text| text.lines().filter(|l| l.contains("reconciled")).count())
        .unwrap_or(0)
}

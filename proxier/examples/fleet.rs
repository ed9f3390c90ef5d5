//! The operator's fleet harness (issue 15): N Nodes on a real kube-apiserver and N simulated
//! proxiers, each reporting through the proxier's own status writer
//! ([`kipvs_proxier::serve::status::report_status`], with a [`ProxyHealth`] for
//! `healthy`) at the proxier's own cadence ([`LAST_SYNC_REFRESH`] for `lastSyncTime`), while a
//! real `kipvs-operator` process rolls ProxyConfig revisions out. Prints the target
//! table; with `--check`, fails unless the rollouts complete, the canary's first write comes
//! within `--max-first-write`, and every node gets exactly one NodeProxyConfig write per
//! revision.
//!
//! Nodes are `fleet-00000`.. labelled `kipvs.io/fleet=yes`; `fleet-00000` is the canary
//! (`kipvs.io/canary=true`); every 100th node (index % 100 == 99) is tainted
//! `ToBeDeletedByClusterAutoscaler` and the one before it (98) is NotReady: both are skipped.
//! Each proxier answers a new revision after a delay from its node-name hash (0.1-1 s): Pending,
//! then Applied (or Failed for the `--fail-share` of nodes on the second revision; `--silent-share`
//! never answer the second revision).
//!
//! usage: `fleet --nodes N --operator-pid PID --operator-log FILE [--check] [--max-first-write 5s]
//!         [--heartbeat 20s] [--fail-share 0.0] [--silent-share 0.0]` (KUBECONFIG selects the
//!         cluster; the CRDs must be installed and the operator running)

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::revision::node_hash;
use kipvs_crds::{NodePhase, NodeProxyConfig, NodeProxyConfigStatus, ProxyConfig};
use kipvs_proxier::engine::status::LAST_SYNC_REFRESH;
use kipvs_proxier::serve::health::ProxyHealth;
use kipvs_proxier::serve::status::report_status;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const PC: &str = "scale";

struct Args {
    nodes: usize,
    operator_pid: u32,
    operator_log: String,
    check: bool,
    max_first_write: Duration,
    heartbeat: Duration,
    fail_share: f64,
    silent_share: f64,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        nodes: 500,
        operator_pid: 0,
        operator_log: String::new(),
        check: false,
        max_first_write: Duration::from_secs(5),
        heartbeat: Duration::from_secs(20),
        fail_share: 0.0,
        silent_share: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--check" {
            a.check = true;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nodes" => a.nodes = value.parse()?,
            "--operator-pid" => a.operator_pid = value.parse()?,
            "--operator-log" => a.operator_log = value,
            "--max-first-write" => a.max_first_write = kipvs_crds::duration::parse(&value)?,
            "--heartbeat" => a.heartbeat = kipvs_crds::duration::parse(&value)?,
            "--fail-share" => a.fail_share = value.parse()?,
            "--silent-share" => a.silent_share = value.parse()?,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    Ok(a)
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

/// One simulated proxier: what it reports goes through the proxier's status writer.
struct Proxier {
    report: watch::Sender<Option<NodeProxyConfigStatus>>,
    health: ProxyHealth,
}

/// What the harness saw of NodeProxyConfigs.
#[derive(Default)]
struct Seen {
    /// Per (node, revision): NodeProxyConfig spec writes (generation changes) seen.
    writes: HashMap<(String, String), u32>,
    /// Last generation seen per node.
    generation: HashMap<String, i64>,
    /// When a revision first reached the canary.
    canary: HashMap<String, Instant>,
    /// Per revision: nodes that reported it Applied.
    applied: HashMap<String, usize>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let client = Client::try_default().await?;
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
        let health = ProxyHealth::new(Duration::from_secs(60), false);
        health.updated();
        tokio::spawn(report_status(
            client.clone(),
            node.clone(),
            receiver,
            health.clone(),
        ));
        proxiers.insert(node, Arc::new(Proxier { report, health }));
    }
    let proxiers = Arc::new(proxiers);

    // The proxiers' side of the contract, and the harness's bookkeeping.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let npcs: Api<NodeProxyConfig> = Api::all(client.clone());
    {
        let seen = seen.clone();
        let proxiers = proxiers.clone();
        let (fail, silent) = (args.fail_share, args.silent_share);
        let mut events = watcher(npcs.clone(), watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut revision_index: HashMap<String, usize> = HashMap::new();
        tokio::spawn(async move {
            while let Some(Ok(npc)) = events.next().await {
                let node = npc.name_any();
                let revision = npc.spec.revision.clone();
                let generation = npc.metadata.generation.unwrap_or_default();
                let next = revision_index.len();
                let index = *revision_index.entry(revision.clone()).or_insert(next);
                {
                    let mut seen = seen.lock().expect("seen");
                    if seen.generation.get(&node) == Some(&generation) {
                        continue; // a status write
                    }
                    seen.generation.insert(node.clone(), generation);
                    *seen
                        .writes
                        .entry((node.clone(), revision.clone()))
                        .or_default() += 1;
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
                if index >= 1 && s < silent {
                    continue;
                }
                let failed = index >= 1 && s >= silent && s < silent + fail;
                let delay = Duration::from_millis(100 + (s * 900.0) as u64);
                let seen = seen.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    proxier.report.send_replace(Some(NodeProxyConfigStatus {
                        observed_revision: Some(revision.clone()),
                        phase: Some(NodePhase::Pending),
                        ..Default::default()
                    }));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    proxier.health.updated();
                    proxier.report.send_replace(Some(NodeProxyConfigStatus {
                        observed_revision: Some(revision.clone()),
                        phase: Some(if failed {
                            NodePhase::Failed
                        } else {
                            NodePhase::Applied
                        }),
                        last_sync_time: Some(Time(Timestamp::now())),
                        message: failed.then(|| "simulated failure".to_owned()),
                        sync_errors: Some(u64::from(failed)),
                        healthy: None,
                    }));
                    if !failed {
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

    // Heartbeats: each proxier refreshes lastSyncTime once per LAST_SYNC_REFRESH, spread
    // evenly (what N real proxiers do).
    {
        let proxiers = proxiers.clone();
        tokio::spawn(async move {
            let names: Vec<String> = (0..n).map(name).collect();
            let gap = LAST_SYNC_REFRESH / n.max(1) as u32;
            loop {
                for node in &names {
                    tokio::time::sleep(gap).await;
                    proxiers[node].report.send_modify(|status| {
                        if let Some(status) = status {
                            status.last_sync_time = Some(Time(Timestamp::now()));
                        }
                    });
                }
            }
        });
    }

    let pcs: Api<ProxyConfig> = Api::all(client.clone());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut revisions = Vec::new();
    for (round, scheduler) in ["wrr", "lc"].iter().enumerate() {
        let body = json!({
            "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
            "metadata": {"name": PC},
            "spec": {
                "nodeSelector": {"matchLabels": {"kipvs.io/fleet": "yes"}},
                "config": {"ipvs": {"scheduler": scheduler}},
                "rollout": {"failureBudget": n, "stages": [
                    {"name": "canary", "nodeSelector": {"matchLabels": {"kipvs.io/canary": "true"}}, "minNodes": 1},
                    {"name": "early", "size": "10%", "maxUnavailable": "100%"},
                    {"name": "fleet", "maxUnavailable": "25%"}
                ]}
            }
        });
        let revision = kipvs_crds::revision::config_revision(&serde_json::from_value(
            body["spec"]["config"].clone(),
        )?);
        let start = Instant::now();
        pcs.patch(
            PC,
            &PatchParams::apply("fleet-harness").force(),
            &Patch::Apply(&body),
        )
        .await?;
        let reconciles_before = reconciles(&args.operator_log);
        // Wait for the canary's write, then for every eligible, answering node to apply.
        let expected_applied = (0..n)
            .filter(|i| !skipped(*i))
            .filter(|i| round == 0 || share(&name(*i)) >= args.silent_share + args.fail_share)
            .count();
        let deadline = start + Duration::from_secs(600);
        let mut first_write = None;
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
            if applied >= expected_applied {
                break Some(start.elapsed());
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Then the operator's verdict.
        let verdict = loop {
            let pc = pcs.get(PC).await?;
            let status = pc.status.unwrap_or_default();
            let reason = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Progressing")
                .map(|c| c.reason.clone())
                .unwrap_or_default();
            if status.last_good_revision.as_deref() == Some(revision.as_str())
                || Instant::now() > deadline
            {
                break (reason, status.healthy_nodes, status.total_nodes);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let complete = start.elapsed();
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
        let fmt = |d: Option<Duration>| {
            d.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
        };
        rows.push(format!(
            "| revision {} ({}) | apply -> canary's NodeProxyConfig written | {} |",
            round + 1,
            revision,
            fmt(first_write)
        ));
        rows.push(format!(
            "| revision {} | 3-stage rollout, zero soak: apply -> all {} answering nodes Applied | {} |",
            round + 1,
            expected_applied,
            fmt(all_applied)
        ));
        rows.push(format!(
            "| revision {} | operator's verdict: Progressing {} with {}/{} healthy | {:.2} s |",
            round + 1,
            verdict.0,
            verdict.1,
            verdict.2,
            complete.as_secs_f64()
        ));
        rows.push(format!(
            "| revision {} | NodeProxyConfig spec writes per eligible node | exactly 1 on {exactly_one}/{eligible}, max {max_writes} |",
            round + 1
        ));
        rows.push(format!(
            "| revision {} | reconciles during the rollout | {reconciles_during} |",
            round + 1
        ));
        if first_write.is_none_or(|d| d > args.max_first_write) {
            failures.push(format!(
                "revision {}: first write {} > {:?}",
                round + 1,
                fmt(first_write),
                args.max_first_write
            ));
        }
        if all_applied.is_none() {
            failures.push(format!("revision {}: rollout did not complete", round + 1));
        }
        if exactly_one != eligible {
            failures.push(format!(
                "revision {}: {} of {eligible} nodes got exactly one write (max {max_writes})",
                round + 1,
                exactly_one
            ));
        }
        revisions.push(revision);
    }

    // Quiet: nothing changes but heartbeats.
    let before = reconciles(&args.operator_log);
    tokio::time::sleep(args.heartbeat).await;
    let quiet = reconciles(&args.operator_log) - before;
    let heartbeat_writes =
        (n as f64 * args.heartbeat.as_secs_f64() / LAST_SYNC_REFRESH.as_secs_f64()).round();
    rows.push(format!(
        "| quiet {:.0} s: {heartbeat_writes} proxier status refreshes | reconciles | {quiet} |",
        args.heartbeat.as_secs_f64()
    ));
    if quiet > 1 {
        failures.push(format!("{quiet} reconciles while only heartbeats arrived"));
    }
    let rss = peak_rss_kib(args.operator_pid);
    rows.push(format!(
        "| operator peak RSS (VmHWM) at {n} nodes | | {:.1} MiB |",
        rss as f64 / 1024.0
    ));

    println!("| figure | measured |");
    println!("|---|---|");
    for row in &rows {
        let row = row.replacen(" | ", ": ", 1);
        println!("{row}");
    }
    if args.check && !failures.is_empty() {
        for f in &failures {
            eprintln!("fleet: FAIL {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}

/// Reconciles the operator logged so far (its debug line "reconciled" per reconcile).
fn reconciles(log: &str) -> usize {
    std::fs::read_to_string(log)
        .map(|text| text.lines().filter(|l| l.contains("reconciled")).count())
        .unwrap_or(0)
}

/// The operator's peak resident set (KiB), from /proc.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

//! The operator's fleet harness: N Nodes on a real kube-apiserver and N simulated proxiers,
//! each deciding what to report with the proxier's own status reducer
//! ([`kipvs_proxier_contract::StatusReport`]: Pending, Applied or Failed, and what a sync publishes)
//! and writing it with the proxier's own status writer ([`kipvs_proxier_contract::report_status`],
//! with the proxier's `/livez` rule, [`kipvs_proxier_contract::StalenessClock`], for `healthy`), and
//! each syncing every `syncPeriod` (30 s, spread evenly) through that reducer, so the fleet
//! writes exactly what real proxiers would (a healthy, idle proxier writes nothing), while a
//! real `kipvs-operator` process rolls ProxyConfig revisions out. Prints a table of figures;
//! with `--check`, fails unless the rollouts complete, the canary's first write comes within
//! `--max-first-write`, and every node gets exactly one NodeProxyConfig write per revision.
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
//! for every node: their sync hangs past the health timeout, so the proxier's own `/livez` rule
//! turns unhealthy and its status writer reports `healthy: false`, until the
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
//! resumed the rollout where it was (every stage that had started keeps its `startedAt`, every
//! complete one its `healthyAt`), no revision was marked bad (the fault rounds have no failure
//! budget beyond the nodes told to fail: one node counted failed because of the fault would
//! roll the revision back), every answering node ends with the new revision Applied on the
//! apiserver, and every node still got exactly one NodeProxyConfig spec write (no re-write of
//! finished nodes, no burst).
//!
//! The harness runs the operator itself (restarting it whenever it exits, as the kubelet does)
//! and samples CPU time and peak RSS of the operator, kube-apiserver and etcd (`/proc`, the
//! control plane's pid files) per round.
//!
//! usage: `fleet --nodes N --operator BIN --operator-log FILE --operator-metrics ADDR
//!         [--pid-file FILE] [--cp-state DIR] [--check] [--faults] [--max-first-write 5s]
//!         [--quiet 20s] [--fail-share 0.0] [--silent-share 0.0] [--flap-share 0.0]
//!         [--takeover] [--stuck-share 0.01]`
//!         (KUBECONFIG selects the cluster; the CRDs must be installed; the operator inherits
//!         the environment)
//!
//! With `--takeover` the rounds are the move from kube-proxy instead (`takeover`): kube-proxy's
//! DaemonSet is simulated too (`../common/kube_proxy.rs`: it avoids nodes labelled
//! `kipvs.io/service-proxy=kipvs`, and each proxier follows `spec.config.serviceProxy` through
//! the proxier's own reducer): `serviceProxy: kube-proxy` (kipvs stands by everywhere), then
//! `kipvs` while kube-proxy never leaves the `--stuck-share` of nodes (they fail by an
//! applyTimeout of 15 s and the fleet rolls back to kube-proxy), then `kipvs` with another
//! scheduler, every kube-proxy leaving (the takeover completes). `--check` fails unless the
//! failing round is marked bad and every node is labelled `kube-proxy` and Applied on the
//! standby revision again, the last round completes with every node labelled `kipvs`, and no
//! node ever has kipvs and kube-proxy programming at once.
//!
//! Layout: `args` (the flags), `nodes` (the Nodes and the part each plays), `proxiers` (the
//! simulated proxiers and what the harness sees), `operator` (the supervised operator process),
//! `rounds` (one revision rolled out, measured and checked), `faults` and `blip` (what a round
//! injects and checks), `takeover` (the move from kube-proxy), `usage` (CPU and memory from
//! `/proc`).

mod args;
mod blip;
mod faults;
mod nodes;
mod operator;
mod proxiers;
mod rounds;
mod takeover;
mod usage;

#[path = "../common/kube_proxy.rs"]
mod kube_proxy;

use crate::operator::{Operator, operator_metrics, reconciles};
use crate::proxiers::Syncs;
use crate::rounds::{Fleet, Table, rounds, run_round};
use crate::usage::{Usage, pid_from};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args::args()?;
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
    sample_usage(&usage, &operator, &args);
    let n = args.nodes;
    let t = std::time::Instant::now();
    nodes::create(&Api::<Node>::all(client.clone()), n).await?;
    let eligible = (0..n).filter(|i| !nodes::skipped(*i)).count();
    eprintln!(
        "fleet: {n} Nodes ({eligible} eligible) in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let proxiers = proxiers::start(&client, n);
    let seen = Arc::default();
    let npcs = Api::all(client.clone());
    proxiers::answer_assignments(npcs.clone(), proxiers.clone(), Arc::clone(&seen), &args);
    let syncs = proxiers::sync_periodically(proxiers.clone(), n);
    let fleet = Fleet {
        pcs: Api::all(client.clone()),
        npcs,
        proxiers,
        seen,
        operator,
        usage,
        eligible,
        args,
    };
    let mut table = Table::default();
    if fleet.args.takeover {
        takeover::run(&fleet, &client, &mut table).await?;
    } else {
        for (round, (scheduler, fault)) in rounds(fleet.args.faults).into_iter().enumerate() {
            let config = serde_json::json!({"ipvs": {"scheduler": scheduler}});
            if !run_round(&fleet, round, &config, fault, &mut table).await? {
                break; // later revisions would not complete either (the size, or a rollback)
            }
        }
    }
    quiet(&fleet, &syncs, &mut table).await;
    table.rows.push(format!(
        "| peak RSS (VmHWM) at {n} nodes: {} | |",
        fleet.usage.snapshot().peaks()
    ));
    print(&table, &fleet.args.operator_metrics).await;
    fleet.operator.stop().await;
    if fleet.args.check && !table.failures.is_empty() {
        for f in &table.failures {
            eprintln!("fleet: FAIL {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}

/// Samples the CPU time and peak RSS of the operator, kube-apiserver and etcd every 0.5 s.
fn sample_usage(usage: &Usage, operator: &Operator, args: &args::Args) {
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

/// Quiet: nothing changes, the proxiers only sync for `--quiet`. First lets the last rollout's
/// own trailing reconciles (its final status writes, the operator's 500 ms decision spacing)
/// pass: up to 15 s, until 2 s go by without one; they are not sync-driven. Fails on more than
/// one reconcile or any published status write (no heartbeat).
async fn quiet(fleet: &Fleet, syncs: &Syncs, table: &mut Table) {
    let log = &fleet.args.operator_log;
    for _ in 0..7 {
        let settled = reconciles(log);
        tokio::time::sleep(Duration::from_secs(2)).await;
        if reconciles(log) == settled {
            break;
        }
    }
    let before = reconciles(log);
    let (syncs_before, published_before) = (
        syncs.done.load(Ordering::Relaxed),
        syncs.published.load(Ordering::Relaxed),
    );
    let status_writes_before = fleet.seen.lock().expect("seen").status_writes;
    tokio::time::sleep(fleet.args.quiet).await;
    let quiet = reconciles(log) - before;
    let quiet_syncs = syncs.done.load(Ordering::Relaxed) - syncs_before;
    let quiet_published = syncs.published.load(Ordering::Relaxed) - published_before;
    let quiet_seen = fleet.seen.lock().expect("seen").status_writes - status_writes_before;
    table.rows.push(format!(
        "| quiet {:.0} s: {quiet_syncs} proxier syncs, {quiet_published} status writes published, \
         {quiet_seen} seen | reconciles | {quiet} |",
        fleet.args.quiet.as_secs_f64()
    ));
    if quiet > 1 {
        table
            .failures
            .push(format!("{quiet} reconciles while the proxiers only synced"));
    }
    if quiet_published > 0 {
        table.failures.push(format!(
            "{quiet_published} status writes while the proxiers only synced (no heartbeat)"
        ));
    }
}

/// Prints the table, then the operator's own metrics (histogram buckets left out).
async fn print(table: &Table, metrics: &str) {
    println!("| figure | measured |");
    println!("|---|---|");
    for row in &table.rows {
        let row = row.replacen(" | ", ": ", 1);
        println!("{row}");
    }
    println!("operator metrics (kipvs_operator_*, histogram buckets left out):");
    match operator_metrics(metrics).await {
        Ok(text) => {
            for line in text
                .lines()
                .filter(|l| l.starts_with("kipvs_operator_") && !l.contains("_bucket{"))
            {
                println!("  {line}");
            }
        }
        Err(e) => println!("  cannot read {metrics}: {e}"),
    }
}

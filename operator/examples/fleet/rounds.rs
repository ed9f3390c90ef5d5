//! The rounds: each rolls one revision of the ProxyConfig out to the fleet (under a fault with
//! `--faults`), measures it and checks what `--check` asserts.

use crate::args::Args;
use crate::blip::{FLAP_APPLY_TIMEOUT, flap};
use crate::faults::{Fault, inject, last_stage_started, resumed};
use crate::nodes::{flapping, name, silent, skipped, told_to_fail};
use crate::operator::{Operator, PC, reconciles};
use crate::proxiers::{Proxiers, Seen};
use crate::usage::Usage;
use kipvs_crds::revision::config_revision;
use kipvs_crds::{NodePhase, NodeProxyConfig, ProxyConfig, ProxyConfigStatus, StageStatus};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the harness holds across rounds.
pub(crate) struct Fleet {
    pub(crate) args: Args,
    pub(crate) pcs: Api<ProxyConfig>,
    pub(crate) npcs: Api<NodeProxyConfig>,
    pub(crate) proxiers: Proxiers,
    pub(crate) seen: Arc<Mutex<Seen>>,
    pub(crate) operator: Operator,
    pub(crate) usage: Usage,
    /// Nodes the operator does not skip.
    pub(crate) eligible: usize,
}

/// The table's rows, and what `--check` fails on.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) rows: Vec<String>,
    pub(crate) failures: Vec<String>,
}

/// The rounds, as (scheduler, fault): two revisions, then with `--faults` two more, the
/// operator killed in one and the apiserver stopped in the other.
pub(crate) fn rounds(faults: bool) -> Vec<(&'static str, Option<Fault>)> {
    let mut rounds = vec![("wrr", None), ("lc", None)];
    if faults {
        rounds.push(("rr", Some(Fault::KillOperator)));
        rounds.push(("wlc", Some(Fault::StopApiserver)));
    }
    rounds
}

/// Whether node `i` answers round `round`: not skipped, not failing (after the first round),
/// not silent (in the second).
fn answering(args: &Args, round: usize, i: usize) -> bool {
    let node = name(i);
    !(skipped(i) || round >= 1 && told_to_fail(args, &node) || round == 1 && silent(args, &node))
}

/// The ProxyConfig of round `round` with `config` (its `spec.config`): the fleet's nodes in
/// three stages (canary, 10%, the rest).
/// Under a fault the last stage goes in smaller steps, so that the fault lands inside it, and
/// the failure budget is exactly the nodes told to fail: one node counted failed because of the
/// fault marks the revision bad (a rollback). In the second round with silent or flapping
/// nodes, the applyTimeout is short: a blip is a failure only past it, and silent nodes fail by
/// it (the round would otherwise wait 5 minutes for them).
pub(crate) fn proxy_config(
    args: &Args,
    round: usize,
    config: &serde_json::Value,
    fault: Option<Fault>,
) -> serde_json::Value {
    let n = args.nodes;
    let fleet_step = if fault.is_some() { "10%" } else { "25%" };
    let short_timeout = round == 1 && (args.flap_share > 0.0 || args.silent_share > 0.0);
    let apply_timeout = if short_timeout {
        FLAP_APPLY_TIMEOUT
    } else {
        "5m"
    };
    let budget = match fault {
        None => n,
        Some(_) => (0..n)
            .filter(|i| !skipped(*i) && told_to_fail(args, &name(*i)))
            .count(),
    };
    json!({
        "apiVersion": "kipvs.io/v1alpha1", "kind": "ProxyConfig",
        "metadata": {"name": PC},
        "spec": {
            "nodeSelector": {"matchLabels": {"kipvs.io/fleet": "yes"}},
            "config": config,
            "rollout": {"failureBudget": budget, "applyTimeout": apply_timeout, "stages": [
                {"name": "canary", "nodeSelector": {"matchLabels": {"kipvs.io/canary": "true"}}, "minNodes": 1},
                {"name": "early", "size": "10%", "maxUnavailable": "100%"},
                {"name": "fleet", "maxUnavailable": fleet_step}
            ]}
        }
    })
}

/// Rolls round `round` out (`config`: its `spec.config`), measures it into `table` and checks
/// it. Returns whether the rollout completed (later rounds would not otherwise).
pub(crate) async fn run_round(
    fleet: &Fleet,
    round: usize,
    config: &serde_json::Value,
    fault: Option<Fault>,
    table: &mut Table,
) -> anyhow::Result<bool> {
    let args = &fleet.args;
    let body = proxy_config(args, round, config, fault);
    let revision = config_revision(&serde_json::from_value(body["spec"]["config"].clone())?);
    let label = format!("revision {} ({revision})", round + 1);
    let usage_before = fleet.usage.snapshot();
    let status_writes_before = fleet.seen.lock().expect("seen").status_writes;
    let start = Instant::now();
    let apply = PatchParams::apply("fleet-harness").force();
    fleet.pcs.patch(PC, &apply, &Patch::Apply(&body)).await?;
    let reconciles_before = reconciles(&args.operator_log);
    let expected_applied = (0..args.nodes)
        .filter(|i| answering(args, round, *i))
        .count();
    let deadline = start + Duration::from_secs(600);
    let rollout = wait_for_rollout(
        fleet,
        &revision,
        &label,
        fault,
        start,
        expected_applied,
        deadline,
    )
    .await?;
    let verdict = wait_for_verdict(&fleet.pcs, &revision, deadline).await;
    let complete = start.elapsed();
    let writes = writes_per_node(fleet, &revision);
    let reconciles = reconciles(&args.operator_log) - reconciles_before;
    let status_writes = fleet.seen.lock().expect("seen").status_writes - status_writes_before;
    let on_apiserver = applied_on_apiserver(&fleet.npcs, &revision).await?;
    let measured = Measured {
        cpu: fleet.usage.snapshot().since(&usage_before),
        label,
        revision,
        expected_applied,
        rollout,
        verdict,
        complete,
        writes,
        reconciles,
        status_writes,
        on_apiserver,
    };
    measured.report(fleet, table);
    measured.check(fleet, table);
    measured.check_fault(fleet, fault, table);
    if round == 1 && args.flap_share > 0.0 && measured.rollout.all_applied.is_some() {
        measured.check_blip(fleet, round, table).await;
    }
    Ok(measured.rollout.all_applied.is_some())
}

/// What [`wait_for_rollout`] saw.
struct Rollout {
    /// From the apply to the canary's NodeProxyConfig written.
    first_write: Option<Duration>,
    /// From the apply to every answering node Applied (`None`: not within the deadline, or the
    /// revision was marked bad).
    all_applied: Option<Duration>,
    /// The fault that landed, with the stage statuses and where the rollout stood then.
    landed: Option<(Fault, Vec<StageStatus>, String)>,
}

/// Waits for the canary's write, then for every answering node to apply `revision`; `fault`
/// lands once the last stage has started. Stops early when the operator marks the revision bad
/// (it never completes then), checked once a second.
async fn wait_for_rollout(
    fleet: &Fleet,
    revision: &str,
    label: &str,
    fault: Option<Fault>,
    start: Instant,
    expected_applied: usize,
    deadline: Instant,
) -> anyhow::Result<Rollout> {
    let mut rollout = Rollout {
        first_write: None,
        all_applied: None,
        landed: None,
    };
    let mut pending_fault = fault;
    let mut polls = 0u32;
    loop {
        let (canary, applied) = {
            let seen = fleet.seen.lock().expect("seen");
            (
                seen.canary.get(revision).copied(),
                seen.applied.get(revision).copied().unwrap_or(0),
            )
        };
        if rollout.first_write.is_none()
            && let Some(at) = canary
        {
            rollout.first_write = Some(at.saturating_duration_since(start));
        }
        if let Some(f) = pending_fault
            && let Ok(pc) = fleet.pcs.get(PC).await
            && let Some(status) = pc.status
            && let Some(stages) = last_stage_started(&status, revision)
        {
            let at = format!(
                "stage {}, {} of {} nodes updated",
                status.stage.as_deref().unwrap_or("-"),
                status.updated_nodes,
                status.total_nodes
            );
            eprintln!("fleet: {label}: {} at {at}", f.describe());
            inject(f, &fleet.operator, fleet.args.cp_state.as_deref(), label).await?;
            rollout.landed = Some((f, stages, at));
            pending_fault = None;
        }
        polls += 1;
        if polls.is_multiple_of(10)
            && let Ok(pc) = fleet.pcs.get(PC).await
            && pc
                .status
                .is_some_and(|s| s.bad_revisions.iter().any(|b| b == revision))
        {
            return Ok(rollout);
        }
        if applied >= expected_applied && pending_fault.is_none() {
            rollout.all_applied = Some(start.elapsed());
            return Ok(rollout);
        }
        if applied >= expected_applied || Instant::now() > deadline {
            return Ok(rollout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The operator's verdict on `revision`: its ProxyConfig status once `revision` is the last good
/// or a bad one, or at `deadline` (the apiserver may still be coming back).
async fn wait_for_verdict(
    pcs: &Api<ProxyConfig>,
    revision: &str,
    deadline: Instant,
) -> ProxyConfigStatus {
    loop {
        if let Ok(pc) = pcs.get(PC).await {
            let status = pc.status.unwrap_or_default();
            if status.last_good_revision.as_deref() == Some(revision)
                || status.bad_revisions.iter().any(|b| b == revision)
                || Instant::now() > deadline
            {
                return status;
            }
        } else if Instant::now() > deadline {
            return ProxyConfigStatus::default();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// NodeProxyConfig spec writes of `revision` seen per eligible node.
fn writes_per_node(fleet: &Fleet, revision: &str) -> Vec<u32> {
    let seen = fleet.seen.lock().expect("seen");
    (0..fleet.args.nodes)
        .filter(|i| !skipped(*i))
        .map(|i| {
            seen.writes
                .get(&(name(i), revision.to_owned()))
                .copied()
                .unwrap_or(0)
        })
        .collect()
}

/// NodeProxyConfigs on the apiserver that carry `revision` and report it Applied.
async fn applied_on_apiserver(
    npcs: &Api<NodeProxyConfig>,
    revision: &str,
) -> anyhow::Result<usize> {
    let list = npcs.list(&ListParams::default()).await?;
    let applied = list.items.iter().filter(|npc| {
        let status = npc.status.as_ref();
        npc.spec.revision == revision
            && status.and_then(|s| s.observed_revision.as_deref()) == Some(revision)
            && status.and_then(|s| s.phase) == Some(NodePhase::Applied)
    });
    Ok(applied.count())
}

/// A round's figures.
struct Measured {
    label: String,
    revision: String,
    /// Nodes expected to apply the revision.
    expected_applied: usize,
    rollout: Rollout,
    /// The operator's verdict.
    verdict: ProxyConfigStatus,
    /// From the apply to the verdict.
    complete: Duration,
    /// Spec writes of the revision per eligible node.
    writes: Vec<u32>,
    /// Reconciles the operator logged during the round.
    reconciles: usize,
    /// Proxier status writes seen during the round.
    status_writes: usize,
    /// NodeProxyConfigs Applied on the apiserver after the verdict.
    on_apiserver: usize,
    /// CPU seconds per process during the round.
    cpu: String,
}

/// A duration in the table (`never`: not measured).
fn seconds(d: Option<Duration>) -> String {
    d.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

impl Measured {
    /// Eligible nodes written exactly once, and the most writes a node got.
    fn writes_summary(&self) -> (usize, u32) {
        let exactly_one = self.writes.iter().filter(|w| **w == 1).count();
        (exactly_one, self.writes.iter().copied().max().unwrap_or(0))
    }

    /// The round's rows.
    fn report(&self, fleet: &Fleet, table: &mut Table) {
        let label = &self.label;
        let (expected, eligible) = (self.expected_applied, fleet.eligible);
        let (exactly_one, max_writes) = self.writes_summary();
        let verdict = &self.verdict;
        let reason = verdict
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        table.rows.extend([
            format!(
                "| {label} | apply -> canary's NodeProxyConfig written | {} |",
                seconds(self.rollout.first_write)
            ),
            format!(
                "| {label} | 3-stage rollout, zero soak: apply -> all {expected} answering \
                 nodes Applied | {} |",
                seconds(self.rollout.all_applied)
            ),
            format!(
                "| {label} | operator's verdict: Progressing {reason} with {}/{} healthy, \
                 {} NodeProxyConfigs Applied on the apiserver | {:.2} s |",
                verdict.healthy_nodes,
                verdict.total_nodes,
                self.on_apiserver,
                self.complete.as_secs_f64()
            ),
            format!(
                "| {label} | NodeProxyConfig spec writes per eligible node | exactly 1 on \
                 {exactly_one}/{eligible}, max {max_writes} |"
            ),
            format!(
                "| {label} | reconciles; proxier status writes | {}; {} |",
                self.reconciles, self.status_writes
            ),
            format!("| {label} | CPU seconds: {} | |", self.cpu),
        ]);
    }

    /// What every round asserts: the canary's first write within `--max-first-write`, the
    /// rollout complete, exactly one spec write per eligible node, the revision the last good
    /// one, and every answering node Applied on the apiserver.
    fn check(&self, fleet: &Fleet, table: &mut Table) {
        let label = &self.label;
        let (expected, eligible) = (self.expected_applied, fleet.eligible);
        let (exactly_one, max_writes) = self.writes_summary();
        let first_write = self.rollout.first_write;
        let max_first_write = fleet.args.max_first_write;
        if first_write.is_none_or(|d| d > max_first_write) {
            table.failures.push(format!(
                "{label}: first write {} > {max_first_write:?}",
                seconds(first_write)
            ));
        }
        if self.rollout.all_applied.is_none() {
            table
                .failures
                .push(format!("{label}: rollout did not complete"));
        }
        if exactly_one != eligible {
            table.failures.push(format!(
                "{label}: {exactly_one} of {eligible} nodes got exactly one write (max {max_writes})"
            ));
        }
        let (verdict, revision) = (&self.verdict, self.revision.as_str());
        if verdict.last_good_revision.as_deref() != Some(revision)
            || verdict.bad_revisions.iter().any(|b| b == revision)
        {
            table.failures.push(format!(
                "{label}: the operator did not finish the revision (lastGoodRevision {:?}, \
                 badRevisions {:?})",
                verdict.last_good_revision, verdict.bad_revisions
            ));
        }
        if self.on_apiserver < expected {
            table.failures.push(format!(
                "{label}: {} of {expected} NodeProxyConfigs show the revision Applied on the \
                 apiserver (lost revisions)",
                self.on_apiserver
            ));
        }
    }

    /// Under a fault: it landed inside the last stage, and the rollout resumed where it was
    /// (started stages keep `startedAt`, complete ones `healthyAt`).
    fn check_fault(&self, fleet: &Fleet, fault: Option<Fault>, table: &mut Table) {
        let label = &self.label;
        match (fault, &self.rollout.landed) {
            (None, _) => {}
            (Some(f), None) => table.failures.push(format!(
                "{label}: {} never landed inside the last stage",
                f.describe()
            )),
            (Some(f), Some((_, before, at))) => {
                let resumed = resumed(before, &self.verdict.stages);
                table.rows.push(format!(
                    "| {label} | {} at {at}: resumed (started stages keep startedAt, complete \
                     ones healthyAt); operator restarts so far (exits of its own) | {}; {} ({}) |",
                    f.describe(),
                    if resumed.is_empty() { "yes" } else { "NO" },
                    fleet.operator.restarts(),
                    fleet.operator.exits()
                ));
                for r in resumed {
                    table
                        .failures
                        .push(format!("{label}: after {}: {r}", f.describe()));
                }
                if fleet.operator.exits() > 0 {
                    table.failures.push(format!(
                        "{label}: the operator exited {} time(s) of its own (it waits out an \
                         apiserver outage)",
                        fleet.operator.exits()
                    ));
                }
            }
        }
    }

    /// The flap round: a `/livez` blip of the flapping answering nodes after the revision
    /// completed, which the operator must report without counting it against the revision.
    async fn check_blip(&self, fleet: &Fleet, round: usize, table: &mut Table) {
        let args = &fleet.args;
        let flapping: Vec<String> = (0..args.nodes)
            .filter(|i| answering(args, round, *i))
            .map(name)
            .filter(|node| flapping(args, node))
            .collect();
        let blip = flap(
            &fleet.pcs,
            &fleet.proxiers,
            &flapping,
            &self.revision,
            &fleet.seen,
        )
        .await;
        table.rows.push(format!(
            "| {} | /livez blip of {} node(s) after the revision completed and their \
             applyTimeout {FLAP_APPLY_TIMEOUT} passed (latched health): healthy during, \
             after | {} |",
            self.label,
            flapping.len(),
            blip.describe()
        ));
        let problems = blip.problems(&self.label, &flapping, &self.revision);
        table.failures.extend(problems);
    }
}

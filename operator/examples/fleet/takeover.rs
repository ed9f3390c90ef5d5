//! `--takeover`: the move from kube-proxy at fleet scale. kube-proxy's DaemonSet and every
//! node's takeover are simulated by `crate::kube_proxy` (shared with `fake_proxier
//! --kube-proxy`), reporting through the proxiers' own status reducers; three rounds:
//!
//! 1. `serviceProxy: kube-proxy` (scheduler wrr): kipvs stands by everywhere, every node is
//!    labelled `kube-proxy` (an ordinary round: `crate::rounds::run_round`);
//! 2. `serviceProxy: kipvs` (wrr) while kube-proxy never leaves the `--stuck-share` of nodes,
//!    failure budget 0 and applyTimeout [`STUCK_APPLY_TIMEOUT`]: the first stuck node to get
//!    the revision fails, the revision is marked bad and every node goes back to round 1's
//!    revision; measured until every eligible node is labelled `kube-proxy` and Applied on it
//!    again;
//! 3. `serviceProxy: kipvs` (scheduler lc), kube-proxy leaving everywhere: the takeover
//!    completes (an ordinary round), every eligible node labelled `kipvs`.
//!
//! Per round: the operator's label writes (`kipvs_operator_writes_total{kind="label"}`), nodes
//! taken over and handed back, kube-proxy pods started or stopped. kube-proxy serves a node
//! [`KUBE_PROXY_START_UP`] after its pod starts; over all rounds, the times a node had no
//! serving proxy ("never none") must be 0, beside "never two" (a node task fails on it).

use crate::kube_proxy::{Step, Timing, follow, node_task};
use crate::nodes::{name, share, skipped, stuck};
use crate::operator::{PC, operator_metrics};
use crate::proxiers::{Seen, StatusOf};
use crate::rounds::{Fleet, Table, proxy_config, run_round};
use k8s_openapi::api::core::v1::Node;
use kipvs_crds::revision::config_revision;
use kipvs_crds::{NodePhase, NodeProxyConfig, SERVICE_PROXY_LABEL};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The applyTimeout of the failing round: the stuck nodes fail by it.
const STUCK_APPLY_TIMEOUT: &str = "15s";
/// kube-proxy's start-up time: from its pod's start to its first sync (it serves the node only
/// then; a node kipvs hands back keeps kipvs's rules until then).
const KUBE_PROXY_START_UP: Duration = Duration::from_secs(2);
/// How long a round may take.
const ROUND_DEADLINE: Duration = Duration::from_secs(600);

/// What the node tasks did, counted.
#[derive(Default)]
struct Counts {
    took_over: AtomicUsize,
    handed_back: AtomicUsize,
    kube_proxy_moves: AtomicUsize,
    /// Times a node was left without a serving proxy ("never none": 0).
    unserved: AtomicUsize,
}

/// The counts and the operator's label writes at one moment.
#[derive(Clone, Copy, Default)]
struct Snapshot {
    took_over: usize,
    handed_back: usize,
    kube_proxy_moves: usize,
    label_writes: usize,
}

impl Snapshot {
    async fn take(counts: &Counts, fleet: &Fleet) -> Self {
        Snapshot {
            took_over: counts.took_over.load(Ordering::Relaxed),
            handed_back: counts.handed_back.load(Ordering::Relaxed),
            kube_proxy_moves: counts.kube_proxy_moves.load(Ordering::Relaxed),
            label_writes: label_writes(&fleet.args.operator_metrics).await,
        }
    }

    /// The round's row: what happened since `self`.
    fn row(&self, after: &Snapshot, label: &str) -> String {
        format!(
            "| {label} | operator label writes; nodes taken over; handed back; kube-proxy pods \
             started or stopped | {}; {}; {}; {} |",
            after.label_writes - self.label_writes,
            after.took_over - self.took_over,
            after.handed_back - self.handed_back,
            after.kube_proxy_moves - self.kube_proxy_moves
        )
    }
}

/// `kipvs_operator_writes_total{kind="label"}` (0 when unreadable).
async fn label_writes(metrics: &str) -> usize {
    let text = operator_metrics(metrics).await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(r#"kipvs_operator_writes_total{kind="label"} "#))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}

/// Counts a node task's step; an Applied revision counts in `seen` as the scheduler rounds'
/// proxiers count it.
fn record(counts: &Counts, seen: &Mutex<Seen>, step: Step) {
    match step {
        Step::TakingOver(_) => counts.took_over.fetch_add(1, Ordering::Relaxed),
        Step::HandingBack(_) => counts.handed_back.fetch_add(1, Ordering::Relaxed),
        Step::KubeProxy(_) => counts.kube_proxy_moves.fetch_add(1, Ordering::Relaxed),
        Step::Applied(revision) => {
            *seen
                .lock()
                .expect("seen")
                .applied
                .entry(revision)
                .or_default() += 1;
            0
        }
        Step::Unserved => counts.unserved.fetch_add(1, Ordering::Relaxed),
        Step::Phase(..) | Step::Served(_) => 0,
    };
}

/// The three rounds (see the module docs), measured into `table`.
///
/// # Errors
/// An API error of the harness's own requests.
pub(crate) async fn run(fleet: &Fleet, client: &Client, table: &mut Table) -> anyhow::Result<()> {
    let stuck_on = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let follower = {
        let (proxiers, seen, args) = (
            fleet.proxiers.clone(),
            fleet.seen.clone(),
            fleet.args.clone(),
        );
        let (stuck_on, counts) = (stuck_on.clone(), counts.clone());
        tokio::spawn(follow(client.clone(), move |node, inputs| {
            let proxier = proxiers.get(node)?.clone();
            let delay = Duration::from_millis(100 + (share(node) * 900.0) as u64);
            let stays = stuck(&args, node);
            let on = stuck_on.clone();
            let (counts, seen) = (counts.clone(), seen.clone());
            let timing = Timing {
                apply: delay,
                start_up: KUBE_PROXY_START_UP,
                proxier: true,
            };
            Some(node_task(
                node.to_owned(),
                StatusOf(proxier),
                inputs,
                timing,
                move || stays && on.load(Ordering::Relaxed),
                move |step| record(&counts, &seen, step),
            ))
        }))
    };
    let eligible: Vec<String> = (0..fleet.args.nodes)
        .filter(|i| !skipped(*i))
        .map(name)
        .collect();

    let standby_config = json!({"serviceProxy": "kube-proxy", "ipvs": {"scheduler": "wrr"}});
    let standby = config_revision(&serde_json::from_value(standby_config.clone())?);
    let before = Snapshot::take(&counts, fleet).await;
    let done = run_round(fleet, 0, &standby_config, None, table).await?;
    let labelled = wait_for_labels(fleet, client, &eligible, "kube-proxy", None).await?;
    let label = format!("revision 1 ({standby}, serviceProxy kube-proxy: standby)");
    table
        .rows
        .push(before.row(&Snapshot::take(&counts, fleet).await, &label));
    check_labelled(table, &label, labelled, &eligible, "kube-proxy");
    if !done {
        return finish(follower, table).await;
    }

    stuck_on.store(true, Ordering::Relaxed);
    failing_round(fleet, client, &standby, &eligible, &counts, table).await?;
    stuck_on.store(false, Ordering::Relaxed);

    let takeover_config = json!({"ipvs": {"scheduler": "lc"}});
    let takeover = config_revision(&serde_json::from_value(takeover_config.clone())?);
    let before = Snapshot::take(&counts, fleet).await;
    run_round(fleet, 2, &takeover_config, None, table).await?;
    let labelled = wait_for_labels(fleet, client, &eligible, "kipvs", None).await?;
    let label = format!("revision 3 ({takeover}, serviceProxy kipvs: takeover)");
    table
        .rows
        .push(before.row(&Snapshot::take(&counts, fleet).await, &label));
    check_labelled(table, &label, labelled, &eligible, "kipvs");
    let unserved = counts.unserved.load(Ordering::Relaxed);
    table.rows.push(format!(
        "| every node, every round | times a node had no serving proxy (kube-proxy start-up {} s) \
         | {unserved} |",
        KUBE_PROXY_START_UP.as_secs()
    ));
    if unserved > 0 {
        table
            .failures
            .push(format!("{unserved} time(s) a node had no serving proxy"));
    }
    finish(follower, table).await
}

/// Fails the run if a node task failed (kipvs and kube-proxy at once on a node).
async fn finish(
    follower: tokio::task::JoinHandle<anyhow::Result<()>>,
    table: &mut Table,
) -> anyhow::Result<()> {
    if follower.is_finished() {
        let outcome = follower.await;
        table
            .failures
            .push(format!("the node tasks stopped: {outcome:?}"));
    } else {
        follower.abort();
        table.rows.push(
            "| every node, every round | kipvs and kube-proxy never programmed a node at once \
             | yes |"
                .to_owned(),
        );
    }
    Ok(())
}

/// A row and, unless every eligible node carries `value`, a failure.
fn check_labelled(
    table: &mut Table,
    label: &str,
    labelled: (usize, Option<Duration>),
    eligible: &[String],
    value: &str,
) {
    let (count, _) = labelled;
    table.rows.push(format!(
        "| {label} | eligible nodes labelled {SERVICE_PROXY_LABEL}={value} | {count}/{} |",
        eligible.len()
    ));
    if count != eligible.len() {
        table.failures.push(format!(
            "{label}: {count} of {} eligible nodes labelled {value}",
            eligible.len()
        ));
    }
}

/// Waits (up to half a round's deadline) until every eligible node is labelled `value`
/// and, with `applied`, its NodeProxyConfig reports that revision Applied; returns how many
/// are, and when all were (from the call).
async fn wait_for_labels(
    fleet: &Fleet,
    client: &Client,
    eligible: &[String],
    value: &str,
    applied: Option<&str>,
) -> anyhow::Result<(usize, Option<Duration>)> {
    let start = Instant::now();
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = start + ROUND_DEADLINE / 2;
    loop {
        let labels: HashMap<String, Option<String>> = nodes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|n| {
                let label = n.labels().get(SERVICE_PROXY_LABEL).cloned();
                (n.name_any(), label)
            })
            .collect();
        let on: HashMap<String, bool> = match applied {
            None => HashMap::new(),
            Some(revision) => applied_on(&fleet.npcs, revision).await?,
        };
        let count = eligible
            .iter()
            .filter(|n| labels.get(*n).and_then(|l| l.as_deref()) == Some(value))
            .filter(|n| applied.is_none() || on.get(*n).copied().unwrap_or(false))
            .count();
        if count == eligible.len() {
            return Ok((count, Some(start.elapsed())));
        }
        if Instant::now() > deadline {
            return Ok((count, None));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Per node: whether its NodeProxyConfig carries `revision` and reports it Applied.
async fn applied_on(
    npcs: &Api<NodeProxyConfig>,
    revision: &str,
) -> anyhow::Result<HashMap<String, bool>> {
    let list = npcs.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|npc| {
            let status = npc.status.as_ref();
            let applied = npc.spec.revision == revision
                && status.and_then(|s| s.observed_revision.as_deref()) == Some(revision)
                && status.and_then(|s| s.phase) == Some(NodePhase::Applied);
            (npc.name_any(), applied)
        })
        .collect())
}

/// Round 2: the takeover while kube-proxy stays on the stuck nodes; measured until the
/// revision is bad and every eligible node is back on `standby`, labelled `kube-proxy`.
async fn failing_round(
    fleet: &Fleet,
    client: &Client,
    standby: &str,
    eligible: &[String],
    counts: &Counts,
    table: &mut Table,
) -> anyhow::Result<()> {
    let args = &fleet.args;
    let config = json!({"ipvs": {"scheduler": "wrr"}});
    let revision = config_revision(&serde_json::from_value(config.clone())?);
    let label = format!("revision 2 ({revision}, serviceProxy kipvs, kube-proxy stays on some)");
    let mut body = proxy_config(args, 1, &config, None);
    body["spec"]["rollout"]["failureBudget"] = 0.into();
    body["spec"]["rollout"]["applyTimeout"] = STUCK_APPLY_TIMEOUT.into();
    let stuck_nodes = eligible.iter().filter(|n| stuck(args, n)).count();
    let before = Snapshot::take(counts, fleet).await;
    let start = Instant::now();
    let apply = PatchParams::apply("fleet-harness").force();
    fleet.pcs.patch(PC, &apply, &Patch::Apply(&body)).await?;
    let status = loop {
        let status = fleet.pcs.get(PC).await?.status.unwrap_or_default();
        if status.bad_revisions.contains(&revision) {
            break Some(status);
        }
        if start.elapsed() > ROUND_DEADLINE {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let bad_at = start.elapsed();
    let Some(status) = status else {
        table.failures.push(format!(
            "{label}: never marked bad ({stuck_nodes} stuck nodes)"
        ));
        return Ok(());
    };
    let (back, back_in) =
        wait_for_labels(fleet, client, eligible, "kube-proxy", Some(standby)).await?;
    let stages: Vec<String> = status
        .stages
        .iter()
        .filter(|s| s.started_at.is_some())
        .map(|s| format!("{} ({} updated)", s.name, s.updated))
        .collect();
    let failed: Vec<&str> = status.failures.iter().map(|f| f.node.as_str()).collect();
    table.rows.extend([
        format!(
            "| {label} | stuck nodes; stages started; failed nodes reported | {stuck_nodes}; {}; {} |",
            stages.join(", "),
            failed.join(" ")
        ),
        format!(
            "| {label} | apply -> revision marked bad (applyTimeout {STUCK_APPLY_TIMEOUT}) | {:.2} s |",
            bad_at.as_secs_f64()
        ),
        format!(
            "| {label} | bad -> every eligible node labelled kube-proxy and Applied on {standby} \
             | {} ({back}/{}) |",
            back_in.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
            eligible.len()
        ),
    ]);
    table
        .rows
        .push(before.row(&Snapshot::take(counts, fleet).await, &label));
    if back_in.is_none() {
        table.failures.push(format!(
            "{label}: {back} of {} eligible nodes back on {standby} with label kube-proxy",
            eligible.len()
        ));
    }
    if failed.iter().any(|n| !stuck(args, n)) {
        table.failures.push(format!(
            "{label}: a node that was not stuck failed: {failed:?}"
        ));
    }
    Ok(())
}

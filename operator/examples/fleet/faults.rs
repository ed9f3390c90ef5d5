//! The faults a round injects once the rollout is inside its last stage, and what a resumed
//! rollout must have kept.

use crate::operator::{OPERATOR_RESTART, Operator};
use kipvs_crds::{ProxyConfigStatus, StagePhase, StageStatus};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the apiserver is down in the outage fault.
pub(crate) const APISERVER_OUTAGE: Duration = Duration::from_secs(30);

/// A fault injected in the middle of a rollout.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fault {
    /// SIGKILL the operator (the supervisor restarts it).
    KillOperator,
    /// Stop the apiserver for [`APISERVER_OUTAGE`], then start it again.
    StopApiserver,
}

impl Fault {
    /// What the fault does, for the table and the log.
    pub(crate) fn describe(self) -> String {
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

/// Injects `fault` now: kills the operator (its supervisor restarts it), or stops the
/// apiserver of the control plane in `cp_state` for [`APISERVER_OUTAGE`] and starts it again.
pub(crate) async fn inject(
    fault: Fault,
    operator: &Operator,
    cp_state: Option<&Path>,
    label: &str,
) -> anyhow::Result<()> {
    match fault {
        Fault::KillOperator => operator.kill(),
        Fault::StopApiserver => {
            let state = cp_state.expect("checked in args()");
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
    Ok(())
}

/// The stage statuses once the rollout of `revision` is inside its last stage (that stage
/// started, earlier ones complete).
pub(crate) fn last_stage_started(
    status: &ProxyConfigStatus,
    revision: &str,
) -> Option<Vec<StageStatus>> {
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
pub(crate) fn resumed(before: &[StageStatus], after: &[StageStatus]) -> Vec<String> {
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
async fn control_plane(action: &str, state: &Path) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("hack/control-plane.sh")
        .arg(action)
        .arg(state)
        .status()
        .await?;
    anyhow::ensure!(status.success(), "hack/control-plane.sh {action}: {status}");
    Ok(())
}

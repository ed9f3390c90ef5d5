//! The `/livez` blip of the flap round: some nodes turn unhealthy after the revision completed,
//! and what the operator must (not) make of it.

use crate::operator::PC;
use crate::proxiers::{Proxier, Seen};
use kipvs_crds::{ProxyConfig, ProxyConfigStatus};
use kube::Api;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The flap round's applyTimeout: the blip comes once it has passed for every node.
pub(crate) const FLAP_APPLY_TIMEOUT: &str = "15s";
/// How long the harness waits for the operator to see a blip begin, or end.
const BLIP_WAIT: Duration = Duration::from_secs(30);

/// What the operator's status said during and after a `/livez` blip.
#[derive(Default)]
pub(crate) struct Blip {
    /// Healthy nodes before the blip.
    before: u32,
    /// The status with the fewest healthy nodes seen while the nodes were unhealthy.
    during: Option<ProxyConfigStatus>,
    /// The status once they were healthy again (or the last one seen).
    after: Option<ProxyConfigStatus>,
}

impl Blip {
    /// Healthy nodes before, during and after, for the table.
    pub(crate) fn describe(&self) -> String {
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
    pub(crate) fn problems(&self, label: &str, flapping: &[String], revision: &str) -> Vec<String> {
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
pub(crate) async fn flap(
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

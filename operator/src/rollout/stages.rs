//! Stages: which stage each member belongs to, how each stage stands against the target
//! revision, and the cursor that completes stages in order (soak, promotion, `minNodes`).

use super::outcome::Note;
use super::selection::{Health, Member, applied, deadline};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::proxyconfig::parse_selector;
use kipvs_crds::{Stage, StagePhase, StageStatus};
use kube::core::{Selector, SelectorExt};
use std::collections::HashMap;
use std::time::Duration;

/// The stage statuses a decision starts from: carried over by name while the same revision
/// rolls out (`continuing`), else fresh (Waiting, or Complete when the revision is already the
/// last good one).
pub(super) fn carried_stage_statuses(
    stages: &[Stage],
    previous: &[StageStatus],
    continuing: bool,
    done: bool,
) -> Vec<StageStatus> {
    let carried: HashMap<&str, &StageStatus> = if continuing {
        previous.iter().map(|s| (s.name.as_str(), s)).collect()
    } else {
        HashMap::new()
    };
    stages
        .iter()
        .map(|stage| match carried.get(stage.name.as_str()) {
            Some(s) => StageStatus {
                name: stage.name.clone(),
                phase: s.phase,
                size_bound: s.size_bound.clone(),
                started_at: s.started_at.clone(),
                healthy_at: s.healthy_at.clone(),
                promoted_at: s.promoted_at.clone(),
                ..StageStatus::default()
            },
            None => StageStatus {
                name: stage.name.clone(),
                phase: if done {
                    StagePhase::Complete
                } else {
                    StagePhase::Waiting
                },
                ..StageStatus::default()
            },
        })
        .collect()
}

/// Stage membership: each member goes to the first stage whose selector matches it and, for a
/// sized stage, whose size bound its hash does not exceed (a bound is fixed, in
/// `stage_status[].sizeBound`, by the first decision of the revision: the hash of the last
/// member the stage took). `members` must be sorted by hash, the order sized stages take them in.
pub(super) fn assign_stages(
    stages: &[Stage],
    stage_status: &mut [StageStatus],
    members: &mut [Member<'_>],
) {
    let selectors: Vec<Selector> = stages
        .iter()
        .map(|s| {
            s.node_selector
                .as_ref()
                .map(|sel| parse_selector(sel, "").expect("validated"))
                .unwrap_or_default()
        })
        .collect();
    let pool = members.len();
    let mut taken = vec![0usize; stages.len()];
    let mut bounds: Vec<Option<u64>> = stage_status
        .iter()
        .map(|s| {
            s.size_bound
                .as_deref()
                .and_then(|b| u64::from_str_radix(b, 16).ok())
        })
        .collect();
    let fresh_bound: Vec<bool> = stages
        .iter()
        .zip(&bounds)
        .map(|(s, b)| s.size.is_some() && b.is_none())
        .collect();
    for m in members.iter_mut() {
        let mut stage = stages.len() - 1;
        for (i, s) in stages.iter().enumerate() {
            if !selectors[i].matches(m.view.labels) {
                continue;
            }
            let fits = match s.size {
                None => true,
                Some(size) if fresh_bound[i] => taken[i] < size.of(pool),
                Some(_) => bounds[i].is_some_and(|b| m.hash <= b),
            };
            if fits {
                stage = i;
                break;
            }
        }
        m.stage = stage;
        taken[stage] += 1;
        if fresh_bound[stage] {
            bounds[stage] = Some(m.hash);
        }
    }
    for (i, status) in stage_status.iter_mut().enumerate() {
        if stages[i].size.is_some() {
            status.size_bound = bounds[i].map(|b| format!("{b:016x}"));
        }
    }
}

/// What [`stage_health`] finds.
pub(super) struct StageHealth<'m, 'a> {
    /// Members failed on the target revision (counted against the failure budget).
    pub(super) failed: Vec<&'m Member<'a>>,
    /// Per stage: members given the target that are neither healthy nor failed yet.
    pub(super) in_flight: Vec<usize>,
    /// Apply deadlines of the members in flight (when to look again).
    pub(super) deadlines: Vec<Timestamp>,
}

/// Counts each stage's members against the target revision into `stage_status` (total,
/// skipped, updated, healthy, failed) and returns the failed ones and those in flight.
///
/// Health is latched per revision: a member that applied the target and whose stage is already
/// Complete (soak included) is done; a later `/livez` blip is not a failure of the revision (the
/// Available condition reports it).
pub(super) fn stage_health<'m, 'a>(
    members: &'m [Member<'a>],
    target: &str,
    stage_status: &mut [StageStatus],
    timeout: Duration,
    now: Timestamp,
) -> StageHealth<'m, 'a> {
    let mut found = StageHealth {
        failed: Vec::new(),
        in_flight: vec![0; stage_status.len()],
        deadlines: Vec::new(),
    };
    for m in members {
        let st = &mut stage_status[m.stage];
        st.total += 1;
        if m.view.skip.is_some() {
            st.skipped += 1;
            continue;
        }
        if m.revision() != Some(target) {
            continue;
        }
        st.updated += 1;
        let latched = st.phase == StagePhase::Complete && m.npc.is_some_and(applied);
        match m.health(timeout, now) {
            Some(Health::Healthy) => st.healthy += 1,
            Some(Health::Failed) if latched => {}
            Some(Health::Failed) => {
                st.failed += 1;
                found.failed.push(m);
            }
            Some(Health::InFlight) | None => {
                found.in_flight[m.stage] += 1;
                if let Some(npc) = m.npc {
                    found.deadlines.push(deadline(npc, timeout));
                }
            }
        }
    }
    found
}

/// Where [`advance_stages`] stopped.
pub(super) struct Cursor {
    /// The first stage not complete (`stages.len()`: every stage is).
    pub(super) at: usize,
    /// The cursor's stage has fewer than `minNodes` nodes to wait for (how many it has).
    pub(super) too_small: Option<u32>,
    /// When the cursor's stage ends its soak (the decision's next look).
    pub(super) soak_end: Option<Timestamp>,
    /// StageStarted, StageEmpty, StagePromoted and StageComplete Events, in order.
    pub(super) notes: Vec<Note>,
}

impl Cursor {
    /// Records a stage Event.
    fn note(&mut self, warning: bool, reason: &'static str, message: String) {
        self.notes.push(Note {
            warning,
            reason,
            message,
        });
    }
}

/// The stage cursor: walks the stages in order, completing each one that is done (every node
/// that is not skipped settled, soak passed, promoted if it pauses) and stopping at the first
/// that is not. Sets each stage's phase and timestamps (`startedAt`, `healthyAt`, `promotedAt`)
/// in `stage_status`. With `paused`, no stage advances.
pub(super) fn advance_stages(
    stages: &[Stage],
    stage_status: &mut [StageStatus],
    target: &str,
    now: Timestamp,
    paused: bool,
    promote: Option<&str>,
) -> Cursor {
    let mut cursor = Cursor {
        at: stages.len(),
        too_small: None,
        soak_end: None,
        notes: Vec::new(),
    };
    for (i, stage) in stages.iter().enumerate() {
        let st = &mut stage_status[i];
        if st.phase == StagePhase::Complete {
            continue;
        }
        cursor.at = i;
        if paused || !advance_stage(stage, st, target, now, promote, &mut cursor) {
            return cursor;
        }
    }
    cursor.at = stages.len();
    cursor
}

/// The stage at the cursor, in the order it goes through: Waiting while it has fewer than
/// `minNodes` nodes to wait for, started, Progressing until every node it waits for is healthy
/// or failed, Soaking for `soakDuration` after that, AwaitingPromotion (with `pause`) until
/// `promote` names it and `target`, then Complete. A stage with no node to wait for completes
/// at once, with a warning. Returns whether it completed.
fn advance_stage(
    stage: &Stage,
    st: &mut StageStatus,
    target: &str,
    now: Timestamp,
    promote: Option<&str>,
    cursor: &mut Cursor,
) -> bool {
    let waiting = st.total - st.skipped;
    if waiting < stage.min_nodes {
        st.phase = StagePhase::Waiting;
        st.healthy_at = None;
        cursor.too_small = Some(waiting);
        return false;
    }
    if st.started_at.is_none() {
        st.started_at = Some(Time(now));
        let message = format!(
            "stage {} started for revision {target}: {} node(s), maxUnavailable {}",
            stage.name, st.total, stage.max_unavailable
        );
        cursor.note(false, "StageStarted", message);
    }
    if st.healthy + st.failed < waiting {
        st.phase = StagePhase::Progressing;
        st.healthy_at = None;
        return false;
    }
    let empty = waiting == 0;
    let healthy_at = st.healthy_at.get_or_insert(Time(now)).0;
    let soak_end = healthy_at
        .checked_add(stage.soak_duration)
        .unwrap_or(Timestamp::MAX);
    if !empty && now < soak_end {
        st.phase = StagePhase::Soaking;
        cursor.soak_end = Some(soak_end);
        return false;
    }
    if !empty && stage.pause && st.promoted_at.is_none() {
        if promote != Some(format!("{}@{target}", stage.name).as_str()) {
            st.phase = StagePhase::AwaitingPromotion;
            return false;
        }
        st.promoted_at = Some(Time(now));
        let message = format!("stage {} of revision {target} promoted", stage.name);
        cursor.note(false, "StagePromoted", message);
    }
    st.phase = StagePhase::Complete;
    if empty {
        let message = format!(
            "stage {} of revision {target} has no node to wait for ({} node(s), {} \
             skipped): it completes without running; set minNodes on the stage to make \
             the rollout wait instead",
            stage.name, st.total, st.skipped
        );
        cursor.note(true, "StageEmpty", message);
    }
    let message = format!(
        "stage {} complete for revision {target}: {} healthy, {} failed, {} skipped",
        stage.name, st.healthy, st.failed, st.skipped
    );
    cursor.note(false, "StageComplete", message);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, soak: u64, min_nodes: u32) -> Stage {
        Stage {
            name: name.to_owned(),
            soak_duration: Duration::from_secs(soak),
            min_nodes,
            ..Stage::rest()
        }
    }

    fn status(name: &str, total: u32, skipped: u32, healthy: u32) -> StageStatus {
        StageStatus {
            name: name.to_owned(),
            total,
            skipped,
            healthy,
            ..StageStatus::default()
        }
    }

    fn reasons(cursor: &Cursor) -> Vec<&'static str> {
        cursor.notes.iter().map(|n| n.reason).collect()
    }

    #[test]
    fn the_cursor_stops_at_a_soaking_stage_until_its_soak_ends() {
        let stages = [stage("canary", 10, 1), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 0, 1), status("rest", 3, 0, 0)];
        let t0 = Timestamp::UNIX_EPOCH;
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!(cursor.at, 0);
        assert_eq!(st[0].phase, StagePhase::Soaking);
        assert_eq!(
            cursor.soak_end,
            Some(t0.checked_add(Duration::from_secs(10)).unwrap())
        );
        assert_eq!(reasons(&cursor), ["StageStarted"]);

        let t1 = t0.checked_add(Duration::from_secs(10)).unwrap();
        let cursor = advance_stages(&stages, &mut st, "r1", t1, false, None);
        assert_eq!(cursor.at, 1, "soaked: the next stage");
        assert_eq!(st[0].phase, StagePhase::Complete);
        assert_eq!(st[1].phase, StagePhase::Progressing);
        assert_eq!(reasons(&cursor), ["StageComplete", "StageStarted"]);
        assert_eq!(st[0].started_at, Some(Time(t0)), "kept from the first look");
    }

    #[test]
    fn an_empty_stage_completes_with_a_warning_unless_min_nodes_makes_it_wait() {
        let t0 = Timestamp::UNIX_EPOCH;
        let stages = [stage("canary", 0, 0), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 1, 0), status("rest", 2, 0, 0)];
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!(cursor.at, 1);
        assert_eq!(
            reasons(&cursor),
            [
                "StageStarted",
                "StageEmpty",
                "StageComplete",
                "StageStarted"
            ]
        );

        let stages = [stage("canary", 0, 1), stage("rest", 0, 0)];
        let mut st = vec![status("canary", 1, 1, 0), status("rest", 2, 0, 0)];
        let cursor = advance_stages(&stages, &mut st, "r1", t0, false, None);
        assert_eq!((cursor.at, cursor.too_small), (0, Some(0)));
        assert_eq!(st[0].phase, StagePhase::Waiting);
        assert!(cursor.notes.is_empty());
    }

    #[test]
    fn paused_advances_nothing() {
        let stages = [stage("canary", 0, 0)];
        let mut st = vec![status("canary", 1, 0, 1)];
        let cursor = advance_stages(&stages, &mut st, "r1", Timestamp::UNIX_EPOCH, true, None);
        assert_eq!(cursor.at, 0);
        assert!(cursor.notes.is_empty());
        assert_eq!(st[0].started_at, None);
    }
}

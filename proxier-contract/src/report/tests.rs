//! Unit tests of `proxier-contract/src/report.rs`.

use super::*;

fn phase(r: &StatusReport) -> (Option<&str>, Option<NodePhase>) {
    let s = r.status().expect("a status");
    (s.observed_revision.as_deref(), s.phase)
}

const T0: SystemTime = SystemTime::UNIX_EPOCH;

fn at(secs: u64) -> SystemTime {
    T0 + Duration::from_secs(1_700_000_000 + secs)
}

#[test]
fn pending_then_applied_after_the_first_successful_sync() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert!(r.in_force(Some("r2".into()), false, &[]));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Pending)));
    // A sync that could not observe the dataplane is not the first sync with r2.
    assert!(!r.synced(&SyncResult::NotObserved("netlink".into()), at(1)));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Pending)));
    assert!(r.synced(&SyncResult::Clean, at(2)));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Applied)));
    assert_eq!(r.status().unwrap().sync_errors, Some(0));
    assert_eq!(r.revision(), Some("r2"));
}

#[test]
fn restart_on_the_same_revision_reports_applied_without_pending() {
    let mut r = StatusReport::default();
    // Restarting: the status stays unknown (None here) until the first sync.
    assert!(!r.in_force(Some("r1".into()), true, &[]));
    assert_eq!(r.status(), None);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
}

#[test]
fn failed_keeps_the_old_revision_in_force_and_a_rollback_is_applied_again() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    r.synced(&SyncResult::Clean, at(0));
    assert!(r.rejected(
        Some("r2".into()),
        "scheduler \"twos\" is not available".into()
    ));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Failed)));
    assert_eq!(r.revision(), Some("r1"), "r1 stays in force");
    // Syncs with r1 do not overwrite the Failed report about r2.
    assert!(!r.synced(&SyncResult::Clean, at(100)));
    assert!(!r.synced(
        &SyncResult::Failed("1 IPVS operations failed".into()),
        at(101)
    ));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Failed)));
    // The operator rolls back to r1: Applied again after the next sync.
    r.reassigned();
    assert!(r.synced(&SyncResult::Clean, at(102)));
    assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
}

/// A hand edit of spec.config to a scheduler the node lacks, under the same spec.revision,
/// then back to the exact original: the node is `Applied` again after the next sync, not
/// `Failed` until a restart.
#[test]
fn a_failed_edit_reverted_under_the_same_revision_is_applied_again() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    // The edit: same revision name, a configuration that cannot be put in force.
    assert!(r.rejected(
        Some("r1".into()),
        "IPVS scheduler \"nope\" is not available".into()
    ));
    assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Failed)));
    assert!(!r.synced(&SyncResult::Clean, at(1)), "still Failed");
    // Reverted: the configuration in force is assigned again.
    r.reassigned();
    assert!(r.synced(&SyncResult::Clean, at(2)));
    assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
    assert_eq!(r.status().unwrap().message, None);
    // Assigned again while Applied: nothing to publish.
    r.reassigned();
    assert!(!r.synced(&SyncResult::Clean, at(3)));
}

#[test]
fn an_idle_healthy_proxier_writes_nothing_after_applied() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    // A day of clean syncs every 30 s: lastSyncTime follows them, nothing is published.
    let published = (1..=2880).filter(|i| r.synced(&SyncResult::Clean, at(30 * i)));
    assert_eq!(published.count(), 0, "no heartbeat");
    let s = r.status().unwrap();
    assert_eq!(s.last_sync_time, Some(time(at(30 * 2880))), "rides along");
    assert_eq!(
        (s.phase, s.sync_errors),
        (Some(NodePhase::Applied), Some(0))
    );
}

#[test]
fn a_new_error_is_published_at_once_then_counters_every_five_minutes_if_changed() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert!(!r.synced(&SyncResult::Clean, at(30)));
    // The first failed sync after a clean status: at once.
    let failed = SyncResult::Failed("1 IPVS operations failed".into());
    assert!(r.synced(&failed, at(31)));
    assert_eq!(r.status().unwrap().sync_errors, Some(1));
    // One Service failing on every retry for 20 minutes: counted each time, published
    // once per COUNTERS_REFRESH.
    let published: Vec<u64> = (32..=1231).filter(|&t| r.synced(&failed, at(t))).collect();
    assert_eq!(published, [331, 631, 931, 1231]);
    let s = r.status().unwrap();
    assert_eq!(s.sync_errors, Some(1201));
    assert_eq!(s.message.as_deref(), Some("1 IPVS operations failed"));
    assert_eq!(s.phase, Some(NodePhase::Applied));
    // Fixed: the counters no longer change, so nothing more is published, however long.
    assert!(!r.synced(&SyncResult::Clean, at(1232)));
    assert!(!r.synced(&SyncResult::Clean, at(1232 + 3600)));
    // A later failure is not new (the status reports errors already): it waits its turn.
    assert!(r.synced(&failed, at(1232 + 3601)), "5 minutes passed");
    assert!(!r.synced(&failed, at(1232 + 3602)));
    // A change of phase is published at once, and its counters start from zero.
    assert!(r.in_force(Some("r2".into()), false, &[]));
    assert!(r.synced(&SyncResult::Clean, at(1232 + 3603)));
    assert_eq!(phase(&r), (Some("r2"), Some(NodePhase::Applied)));
    assert_eq!(r.status().unwrap().sync_errors, Some(0));
    // ... and the first error with r2 is new again.
    assert!(r.synced(&failed, at(1232 + 3604)));
}

#[test]
fn settings_of_a_newer_version_are_named_in_the_applied_message() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &["ipvs.newSetting".into()]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert_eq!(phase(&r), (Some("r1"), Some(NodePhase::Applied)));
    assert_eq!(
        r.status().unwrap().message.as_deref(),
        Some("ignored settings this kipvs version does not know: ipvs.newSetting")
    );
    r.in_force(Some("r2".into()), false, &[]);
    assert!(r.synced(&SyncResult::Clean, at(1)));
    assert_eq!(r.status().unwrap().message, None);
}

fn standing(
    r: &StatusReport,
) -> (
    NodePhase,
    Option<ServiceProxyPhase>,
    Option<&str>,
    Option<bool>,
) {
    let s = r.status().expect("a status");
    (
        s.phase.unwrap(),
        s.service_proxy,
        s.message.as_deref(),
        s.healthy,
    )
}

/// A proxier that restarts in standby reports its revision Pending at once; the takeover
/// publishes each phase at once, Applied after the first successful sync; a kube-proxy
/// that comes back is reported unhealthy with why, and the way back clears it.
#[test]
fn standby_is_reported_pending_and_each_phase_is_published_at_once() {
    use ServiceProxyPhase::*;
    let mut r = StatusReport::default();
    assert!(!r.in_force(Some("r1".into()), true, &[]));
    let why = "kube-proxy runs on this node (process kube-proxy, pid 7)";
    assert!(r.service_proxy(Standby, Some(why.into()), None));
    assert_eq!(
        standing(&r),
        (NodePhase::Pending, Some(Standby), Some(why), None)
    );
    assert!(
        !r.service_proxy(Standby, Some(why.into()), None),
        "nothing new"
    );
    // No sync makes a revision Applied while kipvs writes nothing.
    assert!(!r.synced(&SyncResult::Clean, at(0)));
    assert!(r.service_proxy(TakingOver, None, None));
    assert_eq!(
        standing(&r),
        (NodePhase::Pending, Some(TakingOver), None, None)
    );
    assert!(r.synced(&SyncResult::Clean, at(1)));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(TakingOver), None, None)
    );
    assert!(r.service_proxy(Programming, None, None));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(Programming), None, None)
    );
    // kube-proxy is back: stays Applied, unhealthy, with why.
    let back = "kube-proxy is back (KUBE-SERVICES in nat): kipvs stopped writing";
    assert!(r.service_proxy(Standby, Some(back.into()), Some(false)));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(Standby), Some(back), Some(false))
    );
    assert!(r.service_proxy(Programming, None, None));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(Programming), None, None)
    );
    // A new revision keeps the phase told.
    assert!(r.in_force(Some("r2".into()), false, &[]));
    assert_eq!(
        standing(&r),
        (NodePhase::Pending, Some(Programming), None, None)
    );
}

/// The way back: HandingBack keeps the revision Pending, HandedBack makes it Applied with
/// kube-proxy's health; back to kipvs is a takeover again.
#[test]
fn a_handback_is_applied_once_kube_proxy_synced_with_its_health() {
    use ServiceProxyPhase::*;
    let mut r = StatusReport::default();
    r.service_proxy(Programming, None, None);
    r.in_force(Some("r1".into()), true, &[]);
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert!(r.in_force(Some("r2".into()), false, &[]));
    let waiting = "waiting for kube-proxy's /healthz to report a sync";
    assert!(r.service_proxy(HandingBack, Some(waiting.into()), None));
    assert_eq!(
        standing(&r),
        (NodePhase::Pending, Some(HandingBack), Some(waiting), None)
    );
    assert!(r.service_proxy(HandedBack, None, Some(true)));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(HandedBack), None, Some(true))
    );
    assert!(
        r.service_proxy(HandedBack, None, Some(false)),
        "kube-proxy's health"
    );
    assert_eq!(r.status().unwrap().healthy, Some(false));
    assert!(!r.synced(&SyncResult::Clean, at(1)));
    // Back to kipvs.
    assert!(r.in_force(Some("r3".into()), false, &[]));
    assert!(r.service_proxy(Standby, Some("kube-proxy runs".into()), None));
    assert!(r.service_proxy(TakingOver, None, None));
    assert!(r.synced(&SyncResult::Clean, at(2)));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(TakingOver), None, None)
    );
}

/// A refused switch is Failed with why and stays in force: once it goes ahead it is
/// Pending, then Applied after the first successful sync.
#[test]
fn a_refused_switch_is_failed_until_it_goes_ahead() {
    use ServiceProxyPhase::*;
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    let why = "2 operations would delete or re-weight to 0 something carrying connections";
    assert!(r.refused(why.into()));
    assert_eq!(
        standing(&r),
        (NodePhase::Failed, Some(Standby), Some(why), None)
    );
    assert!(!r.refused(why.into()));
    assert!(
        !r.service_proxy(Standby, Some(why.into()), None),
        "stays Failed"
    );
    assert_eq!(r.revision(), Some("r1"));
    assert!(r.service_proxy(TakingOver, None, None));
    assert_eq!(
        standing(&r),
        (NodePhase::Pending, Some(TakingOver), None, None)
    );
    assert!(r.synced(&SyncResult::Clean, at(0)));
    assert_eq!(
        standing(&r),
        (NodePhase::Applied, Some(TakingOver), None, None)
    );
}

#[test]
fn the_local_configuration_reports_nothing() {
    let mut r = StatusReport::default();
    r.in_force(Some("r1".into()), true, &[]);
    r.synced(&SyncResult::Clean, at(0));
    assert!(r.in_force(None, false, &[]));
    assert_eq!(r.status(), None);
    assert!(!r.synced(&SyncResult::Clean, at(1)));
    assert!(!r.rejected(None, "bad local configuration".into()));
    assert!(!r.service_proxy(ServiceProxyPhase::Standby, Some("x".into()), None));
    assert!(!r.refused("x".into()));
    assert_eq!(r.status(), None);
}

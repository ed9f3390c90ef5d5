//! The Node label [`SERVICE_PROXY_LABEL`]: which service proxy should run on each member,
//! read from the NodeProxyConfig the node has and what its proxier reported (the contract:
//! `kipvs_crds::nodeproxyconfig`, "Moving a node between kube-proxy and kipvs"). The rule that
//! it serves: a node is never left without a proxy, and never with two.

use super::decision::Decider;
use super::input::{KubeProxyDaemonSet, NpcView, SkipReason};
use super::outcome::{Label, Write};
use super::selection::{Health, Member, health};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{
    NodePhase, NodeProxyConfigStatus, SERVICE_PROXY_LABEL, ServiceProxy, ServiceProxyPhase,
};
use std::collections::HashSet;
use std::time::Duration;

/// What the proxier reported about the revision `npc` carries (None: nothing yet, or only
/// about an earlier revision; a proxier that crashloops, is Pending or cannot pull its image
/// never reports).
fn reported<'a>(npc: &NpcView<'a>) -> Option<&'a NodeProxyConfigStatus> {
    npc.status
        .filter(|s| s.observed_revision.as_deref() == Some(npc.revision) && s.phase.is_some())
}

/// Whether the proxier reports, for the `kipvs` revision `npc` carries, that it stands by
/// because kube-proxy runs again on a node it had taken over: `Standby` (not refused) after it
/// programmed that revision (`Applied` stays, the contract's "a kube-proxy that comes back"), or
/// with `healthy: false` (what it reports in place of its `/livez` then). A proxier that
/// restarts while kube-proxy runs reports `Pending` and loses that memory: the Node's label and
/// kube-proxy's DaemonSet ([`wanted_label`]) cover it.
pub(super) fn kube_proxy_returned(npc: &NpcView<'_>) -> bool {
    stands_by_for_kube_proxy(npc)
        && reported(npc)
            .is_some_and(|s| s.phase == Some(NodePhase::Applied) || s.healthy == Some(false))
}

/// Whether the proxier reports, for the `kipvs` revision `npc` carries, that it stands by
/// (not refused): kube-proxy runs on the node.
pub(super) fn stands_by_for_kube_proxy(npc: &NpcView<'_>) -> bool {
    npc.service_proxy == ServiceProxy::Kipvs
        && reported(npc).is_some_and(|s| {
            s.service_proxy == Some(ServiceProxyPhase::Standby)
                && s.phase != Some(NodePhase::Failed)
        })
}

/// The label value `npc` asks for (None: leave the label as it is) on a node labelled `label`.
/// `skipped`: the node is
/// skipped (NotReady, being scaled down): a proxier there is not called silent.
/// `kube_proxy`: kube-proxy's DaemonSet as last seen.
///
/// - a revision whose `serviceProxy` is `kipvs`:
///   - `kipvs` once the proxier has reported for that revision (it is alive, and reads what
///     makes it take over: `Standby` while kube-proxy runs, or already programming), so
///     kube-proxy's pod leaves only when something takes over; until then nothing. On a node
///     labelled `kube-proxy` only a `Standby` report counts: anything else is older than the
///     label (a rollback to a revision that a proxier dead since had programmed);
///   - `kube-proxy` when the node failed the revision ([`Health::Failed`]: rejected, or not
///     Applied and healthy within `applyTimeout`) and nothing programs it: the proxier refused
///     (Failed, standing by), stands by past the deadline while kube-proxy's DaemonSet is not
///     known to run everywhere (kube-proxy did not leave, or the proxier stopped after its
///     report), never reported at all (silent: crashlooping, Pending, ImagePullBackOff), or
///     reported a takeover it never completed (it died or is stuck in it). The bound for a
///     silent proxier is the rollout's own: `applyTimeout` from `spec.assignedAt`;
///   - it stays `kipvs` where kube-proxy came back on a node kipvs took over
///     ([`kube_proxy_returned`]) or stands by while kube-proxy's DaemonSet lacks the affinity
///     ([`KubeProxyDaemonSet::Unpatched`]): kube-proxy serves the node whatever its label,
///     and a `kube-proxy` label would keep it there once the DaemonSet is patched again
///     (Degraded `KubeProxyReturned` says so);
/// - a revision whose `serviceProxy` is `kube-proxy`: `kube-proxy` once the proxier reports,
///   for that revision, a phase in which kipvs does not write
///   ([`ServiceProxyPhase::ready_for`](kipvs_crds::ServiceProxyPhase::ready_for)), so
///   kube-proxy starts only after kipvs has stopped, or once it is silent past `applyTimeout`
///   (it does not program either); a proxier that predates `status.serviceProxy` reports
///   without it and its node keeps its label (kube-proxy never starts next to it).
pub(super) fn wanted_label(
    npc: &NpcView<'_>,
    label: Option<&str>,
    timeout: Duration,
    now: Timestamp,
    skipped: bool,
    kube_proxy: KubeProxyDaemonSet,
) -> Option<ServiceProxy> {
    npc.config?;
    let status = reported(npc);
    let failed = health(npc, timeout, now) == Health::Failed;
    let silent = status.is_none() && failed && !skipped;
    let phase = status.and_then(|s| s.service_proxy);
    let stopped = phase.is_some_and(|p| !p.kipvs_programs());
    let back = silent.then_some(ServiceProxy::KubeProxy);
    let Some(status) = status else {
        return back;
    };
    match npc.service_proxy {
        ServiceProxy::KubeProxy => stopped.then_some(ServiceProxy::KubeProxy),
        // A node labelled kube-proxy runs kube-proxy: a live proxier there stands by, any
        // other report is older than the label (e.g. a rollback to a revision a proxier that
        // died since had programmed).
        ServiceProxy::Kipvs
            if label == Some(ServiceProxy::KubeProxy.as_str())
                && phase != Some(ServiceProxyPhase::Standby) =>
        {
            None
        }
        ServiceProxy::Kipvs if !failed => Some(ServiceProxy::Kipvs),
        ServiceProxy::Kipvs if stopped && status.phase == Some(NodePhase::Failed) => {
            Some(ServiceProxy::KubeProxy)
        }
        ServiceProxy::Kipvs if stopped => {
            let kube_proxy_everywhere = kube_proxy == KubeProxyDaemonSet::Unpatched;
            (!kube_proxy_returned(npc) && !kube_proxy_everywhere).then_some(ServiceProxy::KubeProxy)
        }
        // Took over and never completed it: dead or stuck mid-takeover.
        ServiceProxy::Kipvs if phase.is_some() && status.phase != Some(NodePhase::Applied) => {
            Some(ServiceProxy::KubeProxy)
        }
        ServiceProxy::Kipvs => Some(ServiceProxy::Kipvs),
    }
}

/// Whether the proxier reports programming the revision `npc` carries (Applied, in a phase
/// where kipvs writes, or without `status.serviceProxy` from a proxier that predates it).
fn programs(npc: &NpcView<'_>) -> bool {
    reported(npc).is_some_and(|s| {
        s.phase == Some(NodePhase::Applied) && s.service_proxy.is_none_or(|p| p.kipvs_programs())
    })
}

impl Decider<'_> {
    /// The label changes of `members` ([`wanted_label`] against the Node's label), nodes
    /// being deleted left out. Not held back by `spec.paused`: a label only follows the
    /// NodeProxyConfig a node already has. A member whose NodeProxyConfig this decision deletes
    /// (a rollback with no last good revision) goes back to `kube-proxy` if it is labelled
    /// `kipvs` and its proxier does not report programming: its proxier then runs its local
    /// configuration, and a silent one nothing.
    pub(super) fn label_members(&mut self, members: &[Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        let kube_proxy = self.input.kube_proxy;
        let deleted: HashSet<&str> = self
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Delete { node } => Some(node.as_str()),
                _ => None,
            })
            .collect();
        let mut labels = Vec::new();
        for m in members {
            if m.view.skip == Some(SkipReason::Deleting) {
                continue;
            }
            let Some(npc) = m.npc else {
                continue;
            };
            let label = m.view.labels.get(SERVICE_PROXY_LABEL).map(String::as_str);
            let proxy = if deleted.contains(m.view.name) {
                let kipvs = Some(ServiceProxy::Kipvs.as_str());
                (label == kipvs && !programs(npc)).then_some(ServiceProxy::KubeProxy)
            } else {
                wanted_label(npc, label, timeout, now, m.view.skip.is_some(), kube_proxy)
            };
            if let Some(proxy) = proxy.filter(|p| label != Some(p.as_str())) {
                labels.push(Label {
                    node: m.view.name.to_owned(),
                    proxy,
                });
            }
        }
        self.labels.extend(labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KubeProxyDaemonSet::{Patched, Unknown, Unpatched};
    use ServiceProxyPhase::{Programming, Standby, TakingOver};
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kipvs_crds::ProxierConfiguration;

    const TIMEOUT: Duration = Duration::from_secs(60);
    const KIPVS: Option<&str> = Some("kipvs");
    const KUBE_PROXY: Option<&str> = Some("kube-proxy");

    /// What the proxier reported: the revision, phase, health and `serviceProxy`.
    type Report = (
        &'static str,
        NodePhase,
        Option<bool>,
        Option<ServiceProxyPhase>,
    );

    fn status(report: Report) -> NodeProxyConfigStatus {
        let (revision, phase, healthy, service_proxy) = report;
        NodeProxyConfigStatus {
            observed_revision: Some(revision.to_owned()),
            phase: Some(phase),
            healthy,
            service_proxy,
            ..NodeProxyConfigStatus::default()
        }
    }

    /// The label a node labelled `label` gets, `secs` after revision "r2" (`proxy`) was
    /// assigned, with the proxier's `report` (None: it never reported).
    fn label_at(
        proxy: ServiceProxy,
        report: Option<Report>,
        label: Option<&str>,
        secs: i64,
        kube_proxy: KubeProxyDaemonSet,
    ) -> Option<ServiceProxy> {
        let status = report.map(status);
        let config = ProxierConfiguration::default();
        let npc = NpcView {
            owner: Some("pc"),
            revision: "r2",
            assigned_at: Timestamp::UNIX_EPOCH,
            service_proxy: proxy,
            status: status.as_ref(),
            config: Some(&config),
        };
        let now = Timestamp::from_second(secs).unwrap();
        wanted_label(&npc, label, TIMEOUT, now, false, kube_proxy)
    }

    use ServiceProxy::{Kipvs as ToKipvs, KubeProxy as ToKubeProxy};

    #[test]
    fn kipvs_only_once_the_proxier_reported_for_the_revision() {
        // Silent (crashlooping, Pending, ImagePullBackOff): kube-proxy stays.
        assert_eq!(label_at(ToKipvs, None, None, 10, Unknown), None);
        // A report about an earlier revision is not one about this one.
        let earlier = ("r1", NodePhase::Applied, Some(true), Some(Programming));
        assert_eq!(label_at(ToKipvs, Some(earlier), KIPVS, 10, Unknown), None);
        // Alive and standing by, or already programming (no kube-proxy on the node).
        let standby = ("r2", NodePhase::Pending, None, Some(Standby));
        assert_eq!(
            label_at(ToKipvs, Some(standby), None, 10, Unknown),
            Some(ToKipvs)
        );
        let programs = ("r2", NodePhase::Pending, None, Some(TakingOver));
        assert_eq!(
            label_at(ToKipvs, Some(programs), None, 10, Unknown),
            Some(ToKipvs)
        );
        // A proxier that predates status.serviceProxy (it programs whatever it is given).
        let old = ("r2", NodePhase::Applied, Some(true), None);
        assert_eq!(
            label_at(ToKipvs, Some(old), None, 10, Unknown),
            Some(ToKipvs)
        );
    }

    #[test]
    fn a_silent_proxier_gives_the_node_back_to_kube_proxy_at_its_apply_deadline() {
        assert_eq!(label_at(ToKipvs, None, KIPVS, 59, Unknown), None);
        assert_eq!(
            label_at(ToKipvs, None, KIPVS, 60, Unknown),
            Some(ToKubeProxy)
        );
        // Also on a kube-proxy revision (a rollback) it never reports: it does not program.
        assert_eq!(
            label_at(ToKubeProxy, None, KIPVS, 60, Unknown),
            Some(ToKubeProxy)
        );
        // A takeover reported but never completed: dead or stuck in it.
        let stuck = ("r2", NodePhase::Pending, None, Some(TakingOver));
        assert_eq!(
            label_at(ToKipvs, Some(stuck), KIPVS, 59, Unknown),
            Some(ToKipvs)
        );
        assert_eq!(
            label_at(ToKipvs, Some(stuck), KIPVS, 60, Unknown),
            Some(ToKubeProxy)
        );
    }

    #[test]
    fn a_skipped_node_is_not_called_silent() {
        let config = ProxierConfiguration::default();
        let npc = NpcView {
            owner: Some("pc"),
            revision: "r2",
            assigned_at: Timestamp::UNIX_EPOCH,
            service_proxy: ToKipvs,
            status: None,
            config: Some(&config),
        };
        let now = Timestamp::from_second(600).unwrap();
        assert_eq!(wanted_label(&npc, KIPVS, TIMEOUT, now, true, Unknown), None);
    }

    #[test]
    fn a_refused_or_stuck_standby_goes_back_to_kube_proxy() {
        let refused = ("r2", NodePhase::Failed, None, Some(Standby));
        assert_eq!(
            label_at(ToKipvs, Some(refused), KIPVS, 5, Patched),
            Some(ToKubeProxy)
        );
        // kube-proxy did not leave (or the proxier died standing by) by the deadline.
        let waiting = ("r2", NodePhase::Pending, None, Some(Standby));
        assert_eq!(
            label_at(ToKipvs, Some(waiting), KIPVS, 60, Unknown),
            Some(ToKubeProxy)
        );
        assert_eq!(
            label_at(ToKipvs, Some(waiting), KIPVS, 60, Patched),
            Some(ToKubeProxy)
        );
        // ... unless kube-proxy's DaemonSet runs it everywhere: the label changes nothing now
        // and would keep kube-proxy there once the DaemonSet is patched again.
        assert_eq!(label_at(ToKipvs, Some(waiting), KIPVS, 60, Unpatched), None);
    }

    #[test]
    fn kube_proxy_back_on_a_node_kipvs_took_over_keeps_its_label() {
        // The proxier's report once kube-proxy came back: Standby, Applied stays,
        // healthy false; long after the deadline (a finished rollout).
        let back = ("r2", NodePhase::Applied, Some(false), Some(Standby));
        let restarted = ("r2", NodePhase::Pending, Some(false), Some(Standby));
        for ds in [Unknown, Patched, Unpatched] {
            assert_eq!(
                label_at(ToKipvs, Some(back), KIPVS, 3600, ds),
                None,
                "{ds:?}"
            );
            assert_eq!(label_at(ToKipvs, Some(restarted), KIPVS, 3600, ds), None);
        }
        let config = ProxierConfiguration::default();
        let st = status(back);
        let npc = NpcView {
            owner: Some("pc"),
            revision: "r2",
            assigned_at: Timestamp::UNIX_EPOCH,
            service_proxy: ToKipvs,
            status: Some(&st),
            config: Some(&config),
        };
        assert!(kube_proxy_returned(&npc));
    }

    #[test]
    fn on_a_node_labelled_kube_proxy_only_a_standby_report_moves_kube_proxy_away() {
        // A rollback to a revision the proxier programmed before it died: stale.
        let stale = ("r2", NodePhase::Applied, Some(true), Some(Programming));
        assert_eq!(label_at(ToKipvs, Some(stale), KUBE_PROXY, 5, Unknown), None);
        let standby = ("r2", NodePhase::Pending, None, Some(Standby));
        assert_eq!(
            label_at(ToKipvs, Some(standby), KUBE_PROXY, 5, Unknown),
            Some(ToKipvs)
        );
    }

    #[test]
    fn kube_proxy_once_kipvs_stopped_on_a_kube_proxy_revision() {
        let handing_back = (
            "r2",
            NodePhase::Pending,
            None,
            Some(ServiceProxyPhase::HandingBack),
        );
        assert_eq!(
            label_at(ToKubeProxy, Some(handing_back), KIPVS, 5, Unknown),
            Some(ToKubeProxy)
        );
        let programs = ("r2", NodePhase::Pending, None, Some(Programming));
        assert_eq!(
            label_at(ToKubeProxy, Some(programs), KIPVS, 90, Unknown),
            None
        );
        // A proxier that predates status.serviceProxy reports, so it is not silent: never.
        let old = ("r2", NodePhase::Applied, Some(true), None);
        assert_eq!(label_at(ToKubeProxy, Some(old), KIPVS, 90, Unknown), None);
    }

    fn daemonset(affinity: serde_json::Value) -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                "template": {"spec": {"containers": [{"name": "kube-proxy"}], "affinity": affinity}},
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_kube_proxy_daemonset_patch_is_read_from_its_node_affinity() {
        let not_in = serde_json::json!({
            "key": SERVICE_PROXY_LABEL, "operator": "NotIn", "values": ["kipvs"],
        });
        let term = |exprs: serde_json::Value| serde_json::json!({"matchExpressions": exprs});
        let required = |terms: serde_json::Value| {
            serde_json::json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }})
        };
        let sample = daemonset(required(serde_json::json!([term(serde_json::json!([
            not_in
        ]))])));
        assert_eq!(KubeProxyDaemonSet::of(&sample), Patched);
        // kubeadm upgrade re-applies it without affinity.
        assert_eq!(
            KubeProxyDaemonSet::of(&daemonset(serde_json::json!({}))),
            Unpatched
        );
        // Terms are ORed: one term without the expression lets kube-proxy on.
        let other =
            serde_json::json!({"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]});
        let two = required(serde_json::json!([
            term(serde_json::json!([not_in, other])),
            term(serde_json::json!([other]))
        ]));
        assert_eq!(KubeProxyDaemonSet::of(&daemonset(two)), Unpatched);
    }
}

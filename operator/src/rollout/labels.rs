//! The Node label [`SERVICE_PROXY_LABEL`]: which service proxy should run on each member,
//! read from the NodeProxyConfig the node has (the contract: `kipvs_crds::nodeproxyconfig`,
//! "Moving a node between kube-proxy and kipvs").

use super::decision::Decider;
use super::input::{NpcView, SkipReason};
use super::outcome::Label;
use super::selection::{Health, Member, health};
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{SERVICE_PROXY_LABEL, ServiceProxy};
use std::time::Duration;

/// The label value `npc` asks for (None: leave the label as it is):
///
/// - a revision whose `serviceProxy` is `kipvs`: `kipvs`, once the stores show the
///   NodeProxyConfig (`config` known), so that kube-proxy's pod leaves only after the proxier
///   can read the revision that makes it take over;
/// - a revision whose `serviceProxy` is `kube-proxy`: `kube-proxy` once the proxier reports,
///   for that revision, a phase in which kipvs does not write
///   ([`ServiceProxyPhase::ready_for`](kipvs_crds::ServiceProxyPhase::ready_for)), so
///   kube-proxy starts only after kipvs has stopped; until then nothing (a proxier that
///   predates `status.serviceProxy` never reports one, and kube-proxy stays off its node);
/// - a `kipvs` revision the node failed ([`Health::Failed`]: rejected, or not applied within
///   `applyTimeout`) while the proxier reports, for it, a phase in which kipvs does not write
///   (it stood by because kube-proxy did not leave, or refused the revision and kept a
///   `kube-proxy` one in force): `kube-proxy`, so that the node is served by kube-proxy
///   rather than by no proxy, also when the failure is within the budget and no rollback
///   follows.
pub(super) fn wanted_label(
    npc: &NpcView<'_>,
    timeout: Duration,
    now: Timestamp,
) -> Option<ServiceProxy> {
    npc.config?;
    let kipvs_stopped = npc
        .status
        .filter(|s| s.observed_revision.as_deref() == Some(npc.revision))
        .and_then(|s| s.service_proxy)
        .is_some_and(|phase| !phase.kipvs_programs());
    match npc.service_proxy {
        ServiceProxy::KubeProxy => kipvs_stopped.then_some(ServiceProxy::KubeProxy),
        ServiceProxy::Kipvs if kipvs_stopped && health(npc, timeout, now) == Health::Failed => {
            Some(ServiceProxy::KubeProxy)
        }
        ServiceProxy::Kipvs => Some(ServiceProxy::Kipvs),
    }
}

impl Decider<'_> {
    /// The label changes of `members` ([`wanted_label`] against the Node's label), nodes
    /// being deleted left out. Not held back by `spec.paused`: a label only follows the
    /// NodeProxyConfig a node already has.
    pub(super) fn label_members(&mut self, members: &[Member<'_>]) {
        let timeout = self.input.spec.rollout.apply_timeout;
        let now = self.input.now;
        for m in members {
            if m.view.skip == Some(SkipReason::Deleting) {
                continue;
            }
            let Some(proxy) = m.npc.and_then(|npc| wanted_label(npc, timeout, now)) else {
                continue;
            };
            if m.view.labels.get(SERVICE_PROXY_LABEL).map(String::as_str) != Some(proxy.as_str()) {
                self.labels.push(Label {
                    node: m.view.name.to_owned(),
                    proxy,
                });
            }
        }
    }
}

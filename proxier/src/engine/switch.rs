//! The engine's side of the switch between kube-proxy and kipvs ([`Engine::switch`], before
//! each sync): the facts gathered on the node ([`KubeProxyNode::signals`], its sync), the next
//! step decided by [`decide`] (the state machine, pure), and the step taken on the engine's
//! planner, syncer and status report (the phases the module documentation of
//! [`super::takeover`] describes).
//!
//! [`KubeProxyNode::signals`]: crate::dataplane::host::kube_proxy::KubeProxyNode::signals

use super::observer::TakeoverEvent;
use super::preview::Preview;
use super::takeover::state::{DEBOUNCE, Facts, Step, decide};
use super::takeover::{
    BACK_CHECK, GATE_CHECK, STANDBY_CHECK, STANDBY_WARN, kube_proxy_drain_interrupted,
};
use super::{Admission, Engine};
use crate::dataplane::Dataplane;
use crate::dataplane::host::kube_proxy::{Leftovers, Mode, Signals};
use kipvs_crds::config::ServiceProxy;
use kipvs_crds::nodeproxyconfig::ServiceProxyPhase;
use std::time::Duration;
use tokio::time::Instant;

/// What the status message of a kipvs standing by for a kube-proxy that came back adds once
/// `inet kipvs` is deleted ([`Step::StandBy`] with `clear`): the operator's sign that the node
/// runs on kube-proxy alone, without kipvs's rules.
pub const KIPVS_RULES_DELETED: &str = "; kube-proxy has synced: kipvs deleted inet kipvs";

impl<D: Dataplane> Engine<D> {
    /// Decides, before a sync, whether the proxier may write now (see the module
    /// documentation), and takes the steps of a switch: `None` when it programs (sync now),
    /// else how soon to decide again (nothing is written meanwhile). Without a takeover
    /// (`--kube-proxy-takeover=false`) it always programs.
    pub async fn switch(&mut self) -> Option<Duration> {
        let takeover = self.takeover.as_ref()?;
        if takeover.programs() && self.planner.config().service_proxy == ServiceProxy::Kipvs {
            return self.look_for_kube_proxy().await;
        }
        match self.next_step().await? {
            Step::HandBack => self.hand_back().await,
            Step::RefuseHandBack(why) => {
                self.refuse_hand_back(why);
                None
            }
            Step::AwaitSync => self.await_kube_proxy(None).await,
            Step::HandedBack { healthy, clear } => {
                self.await_kube_proxy(Some((healthy, clear))).await
            }
            Step::StandBy { why, clear } => self.stand_by_kube_proxy(&why, clear).await,
            Step::Hold(state) => {
                let message = format!(
                    "no NodeProxyConfig asks for a takeover of this node and kube-proxy's state \
                     is here ({state}): kipvs writes nothing"
                );
                self.stand(ServiceProxyPhase::Standby, Some(message), None);
                Some(BACK_CHECK)
            }
            Step::Refuse(why) => {
                self.refuse_switch(why);
                Some(GATE_CHECK)
            }
            Step::Debounce {
                absent_for,
                remaining,
            } => {
                let message = format!(
                    "kube-proxy is gone from this node since {}s: kipvs takes over once it has \
                     stayed away {}s",
                    absent_for.as_secs(),
                    DEBOUNCE.as_secs()
                );
                self.stand(ServiceProxyPhase::Standby, Some(message), None);
                Some(remaining.min(STANDBY_CHECK))
            }
            Step::TakeOver => self.take_over().await,
            // Only on a node kipvs programs (look_for_kube_proxy).
            Step::Program | Step::Yield(_) => None,
        }
    }

    /// The facts of the node now ([`Facts`]: kube-proxy's signals, its state read only where it
    /// decides something, its sync only where it is awaited) and the step [`decide`] makes of
    /// them; the absence of kube-proxy is timed here ([`Takeover::absent_since`]).
    ///
    /// [`Takeover::absent_since`]: super::takeover::Takeover
    async fn next_step(&mut self) -> Option<Step> {
        let wanted = self.planner.config().service_proxy;
        let revision = self
            .following
            .as_ref()
            .and_then(|f| f.report.revision())
            .map(str::to_owned);
        let asked = revision.is_some();
        let takeover = self.takeover.as_mut()?;
        let node = takeover.node.clone();
        let programs = takeover.programs();
        let kipvs = wanted == ServiceProxy::Kipvs;
        let mut signals = node.signals(programs && takeover.done).await;
        if kipvs && !programs && signals.present().is_none() {
            signals = node.signals(true).await;
        }
        let present = signals.present().is_some();
        let now = Instant::now();
        let absent_for = match present {
            true => {
                takeover.absent_since = None;
                Duration::ZERO
            }
            false => now.duration_since(*takeover.absent_since.get_or_insert(now)),
        };
        if kipvs && !programs && signals.state.is_some() {
            takeover.found = true;
        }
        remember_mode(&mut takeover.mode_seen, revision, &mut signals);
        let awaited = match kipvs {
            false => !programs,
            true => !programs && present && takeover.back.is_some() && !takeover.cleared,
        };
        let synced = match awaited {
            true => node.synced().await,
            false => None,
        };
        let facts = Facts {
            wanted,
            asked,
            phase: takeover.phase,
            signals: &signals,
            synced,
            absent_for,
            found: takeover.found,
            removal_done: takeover.done,
            back: takeover.back.is_some(),
            cleared: takeover.cleared,
        };
        let step = decide(&facts);
        tracing::debug!(?facts, ?step, "switch");
        Some(step)
    }

    /// The node stands at `phase` now: logged when it changes, told to the observers, and
    /// reported (`message`, `healthy`: [`kipvs_proxier_contract::StatusReport::service_proxy`]).
    fn stand(&mut self, phase: ServiceProxyPhase, message: Option<String>, healthy: Option<bool>) {
        let Some(takeover) = self.takeover.as_mut() else {
            return;
        };
        let why = message.clone().unwrap_or_default();
        if takeover.phase != Some(phase) {
            match phase.kipvs_programs() {
                true => tracing::info!(?phase, "programming: kipvs writes to the kernel"),
                false => tracing::info!(?phase, "standby: {why}"),
            }
            let event = match (&takeover.back, phase.kipvs_programs()) {
                (_, true) => TakeoverEvent::Programming,
                (Some(back), false) => TakeoverEvent::KubeProxyBack(back.clone()),
                (None, false) => TakeoverEvent::Standby(why.clone()),
            };
            self.observer.takeover(&event);
        }
        takeover.phase = Some(phase);
        let now = Instant::now();
        if phase.kipvs_programs() {
            takeover.standby = None;
        } else {
            let (since, warned) = takeover.standby.get_or_insert((now, now));
            if now.duration_since(*warned) >= STANDBY_WARN {
                *warned = now;
                let minutes = now.duration_since(*since).as_secs() / 60;
                tracing::warn!("standby for {minutes} min: {why}");
            }
        }
        if let Some(following) = &mut self.following {
            let changed = following.report.service_proxy(phase, message, healthy);
            following.publish(changed);
        }
    }

    /// `serviceProxy: kube-proxy` on a node the proxier programs: one last full sync (every
    /// wanted real server at its planned weight, what kube-proxy 1.24 keeps), then nothing
    /// more is written and kube-proxy's ports are released (`HandingBack`). A sync that could
    /// not read the kernel is tried again first; failed ops are logged (kube-proxy programs
    /// them).
    async fn hand_back(&mut self) -> Option<Duration> {
        self.last_full_sync = None;
        match self.sync().await {
            Ok(report) if report.failures.is_empty() => {}
            // kube-proxy programs what failed (a failed op cannot keep the node from it).
            Ok(report) => tracing::warn!(
                "handing back to kube-proxy: {} operations of the last sync failed",
                report.failures.len()
            ),
            Err(e) => {
                tracing::warn!("handing back to kube-proxy: the last sync failed ({e}), again");
                return Some(STANDBY_CHECK);
            }
        }
        let takeover = self.takeover.as_mut()?;
        takeover.stop_removal();
        takeover.ports.send_replace(false);
        let message = "serviceProxy is kube-proxy: kipvs stopped writing, the table is as \
                       kube-proxy expects it; waiting for kube-proxy to sync";
        self.stand(ServiceProxyPhase::HandingBack, Some(message.into()), None);
        Some(STANDBY_CHECK)
    }

    /// `serviceProxy: kube-proxy` on a node the proxier does not program: once kube-proxy has
    /// synced (`synced`: its health, and whether `inet kipvs` is still to be deleted), `inet
    /// kipvs` is deleted and the node is `HandedBack` with kube-proxy's health (read again every
    /// [`BACK_CHECK`]); until then `Standby` (the proxier never programmed here) or
    /// `HandingBack`.
    async fn await_kube_proxy(&mut self, synced: Option<(bool, bool)>) -> Option<Duration> {
        let takeover = self.takeover.as_mut()?;
        takeover.ports.send_replace(false);
        let phase = takeover.phase;
        match synced {
            Some((healthy, clear)) => {
                if clear {
                    if let Err(e) = self.syncer.dataplane_mut().remove_rules().await {
                        tracing::warn!("handing back: cannot delete inet kipvs, again: {e}");
                        return Some(STANDBY_CHECK);
                    }
                    self.takeover.as_mut()?.cleared = true;
                    tracing::info!("kube-proxy has synced the node: deleted inet kipvs");
                }
                let message = (!healthy).then(|| "kube-proxy's /healthz is not 200".to_owned());
                self.stand(ServiceProxyPhase::HandedBack, message, Some(healthy));
                return Some(BACK_CHECK);
            }
            None if phase == Some(ServiceProxyPhase::HandedBack) => {
                let message = "kube-proxy does not answer (its metrics and /healthz)";
                self.stand(phase?, Some(message.into()), Some(false));
            }
            None if phase == Some(ServiceProxyPhase::HandingBack) => {
                let message = self.standing_message();
                self.stand(ServiceProxyPhase::HandingBack, message, None);
            }
            None => {
                let message = "serviceProxy is kube-proxy: kipvs writes nothing; waiting for \
                               kube-proxy to sync";
                self.stand(ServiceProxyPhase::Standby, Some(message.into()), None);
            }
        }
        Some(STANDBY_CHECK)
    }

    /// The handback is refused (`why`, [`Step::RefuseHandBack`]): the proxier goes on
    /// programming and the revision asking for kube-proxy is reported `Failed`.
    fn refuse_hand_back(&mut self, why: String) {
        let Some(following) = &mut self.following else {
            return;
        };
        let revision = following.report.revision().map(str::to_owned);
        let changed = following.report.rejected(revision, why.clone());
        if changed {
            tracing::warn!("the handback to kube-proxy is refused: {why}");
        }
        following.publish(changed);
    }

    /// The switch to kipvs is refused (`why`): `Standby`, the revision `Failed` with the
    /// reason until the switch goes ahead.
    fn refuse_switch(&mut self, why: String) {
        // Logged when the reason is new, not at each look.
        let standing = self.takeover.as_ref().and_then(|t| t.phase);
        if standing != Some(ServiceProxyPhase::Standby)
            || self.standing_message().as_deref() != Some(&why)
        {
            tracing::warn!("the switch to kipvs is refused: {why}");
        }
        if let Some(f) = &mut self.following {
            let changed = f.report.refused(why.clone());
            f.publish(changed);
        }
        self.stand(ServiceProxyPhase::Standby, Some(why), None);
    }

    /// The message the status reports for the phase the node stands at.
    fn standing_message(&self) -> Option<String> {
        let following = self.following.as_ref()?;
        following.report.status()?.message.clone()
    }

    /// `serviceProxy: kipvs` on a node the proxier programs: `Programming` once kube-proxy's
    /// leftovers are removed and nothing drains on other local addresses; every
    /// [`BACK_CHECK`], whether kube-proxy is back ([`KubeProxyNode::back`]; before that removal
    /// only whether it runs): then the proxier stops writing at once, releases kube-proxy's
    /// ports and reports `Standby`, `healthy: false`.
    async fn look_for_kube_proxy(&mut self) -> Option<Duration> {
        if !self.takeover.as_ref()?.found && !self.takeover.as_ref()?.drains_checked {
            self.find_interrupted_drain();
        }
        let takeover = self.takeover.as_mut()?;
        takeover.take_outcome().await;
        let (node_port_ips, local) = (
            self.planner.node_port_ips(),
            self.planner.other_interface_addresses(),
        );
        let draining = self
            .syncer
            .drains()
            .keys()
            .any(|(vs, _)| local.contains(&vs.address) && !node_port_ips.contains(&vs.address));
        let done = takeover.done;
        if done && takeover.phase == Some(ServiceProxyPhase::TakingOver) && !draining {
            tracing::info!("takeover done: nothing of kube-proxy's is left");
            self.stand(ServiceProxyPhase::Programming, None, None);
        }
        let takeover = self.takeover.as_mut()?;
        let now = Instant::now();
        if takeover
            .last_check
            .is_some_and(|at| now.duration_since(at) < BACK_CHECK)
        {
            return None;
        }
        takeover.last_check = Some(now);
        let Step::Yield(why) = self.next_step().await? else {
            return None;
        };
        let message = format!(
            "kube-proxy is back on this node ({why}): kipvs stopped writing and waits until it \
             has stopped (two programmers never run at once)"
        );
        tracing::error!("{message}");
        let takeover = self.takeover.as_mut()?;
        takeover.stop_removal();
        takeover.found = true;
        takeover.last_check = None;
        takeover.back = Some(message.clone());
        takeover.ports.send_replace(false);
        self.stand(ServiceProxyPhase::Standby, Some(message), Some(false));
        Some(STANDBY_CHECK)
    }

    /// Between syncs ([`Engine::run`] waits up to `ipvs.syncPeriod` on a quiet node): resolves
    /// when the proxier programs as `serviceProxy: kipvs` says and the switch is due a look
    /// ([`look_between_syncs`](Self::look_between_syncs)): the next look for kube-proxy
    /// ([`BACK_CHECK`] after the last one) or the end of the removal of kube-proxy's leftovers
    /// (its outcome taken); never otherwise. Cancel-safe.
    pub(super) async fn look_due(&mut self) {
        let kipvs = self.planner.config().service_proxy == ServiceProxy::Kipvs;
        let Some(takeover) = self.takeover.as_mut().filter(|t| kipvs && t.programs()) else {
            return std::future::pending().await;
        };
        let next = takeover
            .last_check
            .map_or_else(Instant::now, |at| at + BACK_CHECK);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = takeover.removal_ended() => {}
        }
    }

    /// Between syncs, once [`look_due`](Self::look_due): the look before a sync
    /// ([`look_for_kube_proxy`](Self::look_for_kube_proxy): `Programming` once the takeover is
    /// done, kube-proxy back), without the sync. Whether the proxier stopped writing.
    pub(super) async fn look_between_syncs(&mut self) -> bool {
        self.look_for_kube_proxy().await.is_some()
    }

    /// `serviceProxy: kipvs` on a node the proxier does not program: `Standby` while
    /// kube-proxy runs; then the gate ([`Engine::gate`]); then the kernel
    /// ([`Engine::admit_kernel`]); then the ports and `TakingOver` (the next sync is the full
    /// sync of the switch). Nothing is written to the kernel before the gate has let the
    /// switch go ahead.
    async fn take_over(&mut self) -> Option<Duration> {
        if let Some(again) = self.gate().await {
            return Some(again);
        }
        if let Some(again) = self.admit_kernel().await {
            return Some(again);
        }
        let takeover = self.takeover.as_mut()?;
        if takeover.found || takeover.phase.is_some() {
            tracing::info!("kube-proxy does not run: taking the node over");
        }
        takeover.ports.send_replace(true);
        takeover.back = None;
        takeover.cleared = false;
        takeover.done = false;
        takeover.last_check = None;
        // Where kube-proxy was not seen, nothing of it is expected: Programming at once (a
        // removal still runs, in case it left something).
        let phase = match takeover.found {
            true => ServiceProxyPhase::TakingOver,
            false => ServiceProxyPhase::Programming,
        };
        self.last_full_sync = None;
        self.stand(phase, None, None);
        None
    }

    /// kube-proxy is on the node (`why`: how it was seen): `Standby`, its ports left to it;
    /// unhealthy with the reason if it came back on a node the proxier programmed; `clear`:
    /// it came back and has synced, `inet kipvs` is deleted first (its reject, source-range
    /// and masquerade rules would break kube-proxy's traffic), which the status message says.
    async fn stand_by_kube_proxy(&mut self, why: &str, clear: bool) -> Option<Duration> {
        if clear {
            match self.syncer.dataplane_mut().remove_rules().await {
                Ok(()) => {
                    let takeover = self.takeover.as_mut()?;
                    takeover.cleared = true;
                    let back = takeover.back.get_or_insert_default();
                    back.push_str(KIPVS_RULES_DELETED);
                    tracing::warn!(
                        "kube-proxy came back and has synced: deleted inet kipvs, which would \
                         break its traffic"
                    );
                }
                Err(e) => {
                    tracing::warn!("kube-proxy is back: cannot delete inet kipvs, again: {e}")
                }
            }
        }
        let takeover = self.takeover.as_mut()?;
        takeover.found = true;
        takeover.ports.send_replace(false);
        let (message, healthy) = match &takeover.back {
            Some(back) => (back.clone(), Some(false)),
            None => (
                format!(
                    "kube-proxy runs on this node ({why}): kipvs writes nothing until it has \
                     stopped"
                ),
                None,
            ),
        };
        self.stand(ServiceProxyPhase::Standby, Some(message), healthy);
        Some(STANDBY_CHECK)
    }

    /// The gate of a switch from kube-proxy (seen running by this process; a restart on a node
    /// kipvs programmed adopts its own table as it always does): it waits, in `Standby` with
    /// the reason, while the API is reached only through a ClusterIP kipvs alone would program
    /// ([`crate::source::apiserver::ApiPath`]); a switch that would touch
    /// connections ([`Preview::refusal`]) is refused, `Failed` with the reason and previewed
    /// again every [`GATE_CHECK`], unless `--allow-connection-changes`. `None`: the switch goes
    /// ahead; else how soon to decide again.
    async fn gate(&mut self) -> Option<Duration> {
        let takeover = self.takeover.as_ref()?;
        if let Some(why) = takeover.api.refusal().filter(|_| takeover.found) {
            self.stand(ServiceProxyPhase::Standby, Some(why), None);
            return Some(STANDBY_CHECK);
        }
        if !takeover.found || takeover.allow_connection_changes {
            return None;
        }
        let now = Instant::now();
        if takeover
            .last_check
            .is_some_and(|at| now.duration_since(at) < GATE_CHECK)
        {
            return Some(STANDBY_CHECK);
        }
        match self.preview_switch().await {
            Ok(None) => None,
            Ok(Some(refusal)) => {
                if let Some(takeover) = self.takeover.as_mut() {
                    takeover.last_check = Some(now);
                }
                self.refuse_switch(refusal);
                Some(STANDBY_CHECK)
            }
            Err(e) => {
                tracing::warn!("cannot preview the switch to kipvs, again: {e}");
                Some(STANDBY_CHECK)
            }
        }
    }

    /// The kernel's part of the switch: a configuration put in force while the proxier wrote
    /// nothing is admitted now ([`Engine::admit_at_switch`]: refused, the previous one is back
    /// in force and the switch is decided again at once with it), else the kernel settings of
    /// the configuration in force are made. `None`: done; else how soon to decide again.
    async fn admit_kernel(&mut self) -> Option<Duration> {
        match self.admit_at_switch().await {
            Admission::Admitted => None,
            Admission::Refused => Some(Duration::ZERO),
            Admission::Again => Some(STANDBY_CHECK),
            Admission::Nothing => {
                let takeover = self.takeover.as_mut()?;
                match takeover.settings.apply(self.planner.config()).await {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!("cannot make the kernel settings, again: {e}");
                        Some(STANDBY_CHECK)
                    }
                }
            }
        }
    }

    /// After the first full sync of a proxier that did not see kube-proxy (a restart):
    /// kube-proxy's NodePorts still draining on other local addresses in the kernel's table as
    /// that sync read it ([`kube_proxy_drain_interrupted`]) mean a takeover found kube-proxy
    /// here: the next sync is a full one that goes on with their drain, instead of leaving them
    /// at weight 0 for good. Looked at once, so that the first sync waits for nothing.
    fn find_interrupted_drain(&mut self) {
        let Some(cached) = self.syncer.cached() else {
            return;
        };
        let interrupted = kube_proxy_drain_interrupted(&self.planner, cached);
        let Some(takeover) = self.takeover.as_mut() else {
            return;
        };
        takeover.drains_checked = true;
        if interrupted {
            tracing::info!(
                "kube-proxy's NodePorts on other local addresses are still draining: the drain \
                 goes on"
            );
            takeover.found = true;
            self.last_full_sync = None;
        }
    }

    /// The reason a switch now would be refused ([`Preview::refusal`]), from the preview of
    /// its first full sync ([`Preview::of_switch`]); `None`: it goes ahead.
    async fn preview_switch(&mut self) -> Result<Option<String>, String> {
        self.refresh_other_interface_addresses().await;
        self.replan();
        let observed = self
            .syncer
            .dataplane_mut()
            .observe()
            .await
            .map_err(|e| e.to_string())?;
        let found = self.takeover.as_ref().is_some_and(|t| t.found);
        let preview = Preview::of_switch(
            &self.planner,
            &observed,
            found,
            self.syncer.drains(),
            Leftovers::default(),
        )
        .map_err(|e| e.to_string())?;
        Ok(preview.refusal())
    }
}

/// kube-proxy's mode in `signals` is remembered in `seen` with `revision` (the one in force);
/// where `signals` have none (kube-proxy stopped and its state is gone), the mode seen while
/// the same revision was in force is theirs, its source saying so: a switch refused for
/// kube-proxy's mode stays refused, as its `Failed` status says, until kube-proxy is seen in
/// another mode or another revision asks.
fn remember_mode(
    seen: &mut Option<(Option<String>, Mode, String)>,
    revision: Option<String>,
    signals: &mut Signals,
) {
    match &signals.mode {
        Some((mode, source)) => *seen = Some((revision, mode.clone(), source.clone())),
        None => {
            signals.mode =
                seen.as_ref()
                    .filter(|(at, _, _)| *at == revision)
                    .map(|(_, mode, source)| {
                        let source = format!("{source}, seen earlier; nothing of it is left now");
                        (mode.clone(), source)
                    });
        }
    }
}

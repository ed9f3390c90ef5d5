//! The engine's side of the switch between kube-proxy and kipvs ([`Engine::switch`], before
//! each sync): the steps and phases the module documentation of [`super::takeover`] describes,
//! taken on the engine's planner, syncer and status report.

use super::observer::TakeoverEvent;
use super::preview::Preview;
use super::takeover::{
    BACK_CHECK, GATE_CHECK, STANDBY_CHECK, STANDBY_WARN, kube_proxy_drain_interrupted,
};
use super::{Admission, Engine};
use crate::dataplane::Dataplane;
use crate::dataplane::kube_proxy::Leftovers;
use kipvs_crds::config::ServiceProxy;
use kipvs_crds::nodeproxyconfig::ServiceProxyPhase;
use std::time::Duration;
use tokio::time::Instant;

impl<D: Dataplane> Engine<D> {
    /// Decides, before a sync, whether the proxier may write now (see the module
    /// documentation), and takes the steps of a switch: `None` when it programs (sync now),
    /// else how soon to decide again (nothing is written meanwhile). Without a takeover
    /// (`--kube-proxy-takeover=false`) it always programs.
    pub async fn switch(&mut self) -> Option<Duration> {
        let takeover = self.takeover.as_mut()?;
        let programs = takeover.programs();
        match (self.planner.config().service_proxy, programs) {
            (ServiceProxy::KubeProxy, true) => self.hand_back().await,
            (ServiceProxy::KubeProxy, false) => self.await_kube_proxy().await,
            (ServiceProxy::Kipvs, true) => self.look_for_kube_proxy().await,
            (ServiceProxy::Kipvs, false) => self.take_over().await,
        }
    }

    /// The node stands at `phase` now: logged when it changes, told to the observers, and
    /// reported (`message`, `healthy`: [`kipvs_node_status::StatusReport::service_proxy`]).
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
    /// synced, `inet kipvs` is deleted and the node is `HandedBack` with kube-proxy's health
    /// (read again every [`BACK_CHECK`]); until then `Standby` (the proxier never programmed
    /// here) or `HandingBack`.
    async fn await_kube_proxy(&mut self) -> Option<Duration> {
        let takeover = self.takeover.as_mut()?;
        takeover.ports.send_replace(false);
        let phase = takeover.phase;
        let node = takeover.node.clone();
        match node.synced().await {
            Some(healthy) => {
                if phase != Some(ServiceProxyPhase::HandedBack) {
                    if let Err(e) = self.syncer.dataplane_mut().remove_rules().await {
                        tracing::warn!("handing back: cannot delete inet kipvs, again: {e}");
                        return Some(STANDBY_CHECK);
                    }
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
        let (node_ips, local) = (
            self.planner.node_ips(),
            self.planner.other_interface_addresses(),
        );
        let draining = self
            .syncer
            .drains()
            .keys()
            .any(|(vs, _)| local.contains(&vs.address) && !node_ips.contains(&vs.address));
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
        // Until its leftovers are removed, its chain and set say nothing: its process does.
        let node = takeover.node.clone();
        let why = match done {
            true => node.back().await?,
            false => node.running().await?,
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
        let node = self.takeover.as_ref()?.node.clone();
        if let Some(why) = node.running().await {
            self.stand_by_kube_proxy(&why);
            return Some(STANDBY_CHECK);
        }
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

    /// kube-proxy runs on the node (`why`: how it was seen): `Standby`, its ports left to it;
    /// unhealthy with the reason if it came back on a node the proxier programmed.
    fn stand_by_kube_proxy(&mut self, why: &str) {
        let Some(takeover) = self.takeover.as_mut() else {
            return;
        };
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
                if let Some(f) = &mut self.following {
                    let changed = f.report.refused(refusal.clone());
                    f.publish(changed);
                }
                tracing::warn!("the switch to kipvs is refused: {refusal}");
                self.stand(ServiceProxyPhase::Standby, Some(refusal), None);
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

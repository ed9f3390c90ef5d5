//! Moving a node between kube-proxy's IPVS mode and kipvs (see README, "Moving from
//! kube-proxy", and the contract in [`kipvs_crds::nodeproxyconfig`]). Before each sync the
//! engine decides whether it may write ([`Engine::switch`]); where it stands is reported in
//! `status.serviceProxy`, `kipvs_standby` and the log.
//!
//! To kipvs (`serviceProxy: kipvs`):
//! 1. **Standby** while kube-proxy runs on the node ([`KubeProxyNode::running`]): sources list
//!    and watch, nothing is written to the kernel (no virtual server, no address, no sysctl,
//!    no IPVS timeout, no scheduler probe, no nftables: a revision assigned meanwhile is only
//!    validated) and kube-proxy's ports (healthz, metrics) are left to it; `/livez` stays
//!    healthy; a WARN every [`STANDBY_WARN`] says for how long and why.
//! 2. **The gate**: the switch's first full sync is previewed ([`Preview::of_switch`], as
//!    `kipvs-proxier takeover` does); if it would delete, unbind or re-weight to 0 something
//!    carrying connections, the proxier stays in standby, its revision `Failed` with the
//!    preview's reason, unless `--allow-connection-changes`.
//! 3. **TakingOver** (`Programming` at once where kube-proxy was not seen: a restart, a node
//!    that never ran it): a revision put in force while the proxier wrote nothing is admitted
//!    by the kernel (its scheduler probed; refused, it is `Failed` and the configuration in
//!    force before it is back), the kernel settings are made, the ports bound, and the first
//!    full sync
//!    adopts kube-proxy's table as a restart adopts kipvs's own: what is wanted is kept or
//!    edited in place (`dataplane::diff`), kube-proxy's NodePort virtual servers on addresses
//!    kipvs serves no NodePort on (loopback; what a narrower `nodePortAddresses` leaves out)
//!    drain ([`Ownership::drains`]). Once a full sync has put
//!    `inet kipvs` in place, kube-proxy's iptables jumps, chains and ipsets are removed
//!    ([`Takeover::after_full_sync`], [`crate::plan::kube_proxy`] says which) in a task of
//!    its own.
//! 4. **Programming** once that removal is done and nothing drains on other local addresses.
//!    After a restart, a drain of kube-proxy's NodePorts the last process began is found in the
//!    first full sync's reading of the kernel and goes on ([`kube_proxy_drain_interrupted`]).
//!    kube-proxy is looked for every [`BACK_CHECK`] ([`KubeProxyNode::back`]); if it is back,
//!    the proxier stops writing at once, releases the ports and reports `healthy: false`
//!    (`kipvs_kube_proxy_back`) until kube-proxy has stopped again, then takes over again.
//!
//! To kube-proxy (`serviceProxy: kube-proxy`):
//! 1. **HandingBack**: one last full sync leaves every wanted real server at the weight it is
//!    planned with (1 for a ready endpoint: kube-proxy 1.24 programs weight 1 and leaves an
//!    existing real server as it finds it, `pkg/proxy/ipvs/proxier.go:2093-2098`; real servers
//!    it does not want it deletes gracefully, weight 0 then gone once idle,
//!    `graceful_termination.go:135-170`); then nothing more is written and the ports are
//!    released for kube-proxy. Where kipvs never programmed it stays in **Standby**.
//! 2. **HandedBack** once kube-proxy's metrics say it synced ([`KubeProxyNode::synced`]):
//!    `inet kipvs` is deleted and the revision is `Applied` with kube-proxy's health.
//!
//! [`Ownership::drains`]: crate::dataplane::diff::Ownership::drains
//! [`Engine::switch`]: super::Engine::switch
//! [`Preview::of_switch`]: super::preview::Preview::of_switch

pub mod state;

use super::observer::{Observer, TakeoverEvent};
use super::syncer::SyncReport;
use crate::dataplane::Op;
use crate::dataplane::host::kube_proxy::{KubeProxyNode, Mode};
use crate::dataplane::kernel::settings::KernelSettings;
use crate::engine::planner::Planner;
use crate::model::{DesiredState, ObservedState, Protocol, VirtualServerKey};
use crate::plan::kube_proxy::kubelet_creates_shared_chains;
use crate::source::apiserver::ApiPath;
use kipvs_crds::nodeproxyconfig::ServiceProxyPhase;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

/// How often a proxier that writes nothing looks again whether it may (kube-proxy stopped,
/// kube-proxy synced, the configuration changed).
pub const STANDBY_CHECK: Duration = Duration::from_secs(2);

/// How often a standby is warned about in the log (how long it lasts, and why).
pub const STANDBY_WARN: Duration = Duration::from_secs(180);

/// How often a refused switch is previewed again (its connections may have ended).
pub const GATE_CHECK: Duration = Duration::from_secs(10);

/// How often a proxier that programs looks whether kube-proxy is back
/// ([`KubeProxyNode::back`]), between syncs too ([`Engine::look_due`]): the longest two
/// programmers can run at once.
///
/// [`Engine::look_due`]: super::Engine::look_due
pub const BACK_CHECK: Duration = Duration::from_secs(10);

/// The NodePorts (port, protocol) whose virtual servers on local addresses kipvs serves no
/// NodePort on are kube-proxy's and drain ([`Ownership::kube_proxy_node_ports`]): those of the
/// desired virtual servers on `node_port_ips` (kube-proxy programmed each NodePort on every
/// local address), and those of the virtual servers that already drain on other addresses (so
/// that a drain begun goes on after its Service is deleted). Cost: O(desired virtual servers).
///
/// [`Ownership::kube_proxy_node_ports`]: crate::dataplane::diff::Ownership::kube_proxy_node_ports
pub fn kube_proxy_node_ports(
    desired: &DesiredState,
    node_port_ips: &BTreeSet<IpAddr>,
    drains: &BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
) -> BTreeSet<(u16, Protocol)> {
    let wanted = desired
        .virtual_servers
        .keys()
        .filter(|key| node_port_ips.contains(&key.address));
    let draining = drains
        .keys()
        .map(|(key, _)| key)
        .filter(|key| !node_port_ips.contains(&key.address));
    wanted
        .chain(draining)
        .map(|key| (key.port, key.protocol))
        .collect()
}

/// Whether `observed` holds a drain of kube-proxy's NodePorts that a takeover began and a
/// restart interrupted: a virtual server kube-proxy's NodePorts would drain on (a local address
/// kipvs serves no NodePort on, a NodePort kipvs programs, in the NodePort range,
/// outside `ipvs.excludeCIDRs`: [`Ownership::drains`]) whose real servers are all at weight 0,
/// as the drain left them (kube-proxy programs weight 1). Cost: O(virtual servers).
///
/// [`Ownership::drains`]: crate::dataplane::diff::Ownership::drains
pub fn kube_proxy_drain_interrupted(planner: &Planner, observed: &ObservedState) -> bool {
    let node_ports =
        kube_proxy_node_ports(planner.desired(), planner.node_port_ips(), &BTreeMap::new());
    let Ok(ownership) = planner.ownership(node_ports) else {
        return false;
    };
    observed.virtual_servers.iter().any(|(key, vs)| {
        ownership.drains(key)
            && !vs.real_servers.is_empty()
            && vs.real_servers.values().all(|rs| rs.weight == 0)
    })
}

/// How long one reading and removal of kube-proxy's leftovers may take in all (each tool has
/// its own timeout too); past it the attempt counts as failed and is tried again after the
/// next full sync.
pub const REMOVAL_DEADLINE: Duration = Duration::from_secs(120);

/// The proxier's side of moving the node between kube-proxy and kipvs (see the module
/// documentation): where it stands, and the removal of kube-proxy's iptables rules and ipsets
/// after the first full sync that has `inet kipvs` in place, tried again after each full sync
/// until it succeeds, in a task of its own so that syncs (endpoint changes) go on while the
/// tools run.
pub struct Takeover {
    pub(super) node: Arc<dyn KubeProxyNode>,
    /// kube-proxy's state was found on the node: it ran, or a removal found its leftovers.
    pub(super) found: bool,
    pub(super) done: bool,
    /// The removal in progress: whether it succeeded, whether it found kube-proxy's leftovers.
    pub(super) removal: Option<JoinHandle<(bool, bool)>>,
    /// The node's kubelet version, when its Node is known.
    pub(super) kubelet_version: Option<String>,
    /// Where the node stands (`None`: not decided yet).
    pub(super) phase: Option<ServiceProxyPhase>,
    /// Since when the proxier writes nothing, and when that was last warned about.
    pub(super) standby: Option<(Instant, Instant)>,
    /// Why kube-proxy is back on a node the proxier programmed (until it has stopped again).
    pub(super) back: Option<String>,
    /// When kube-proxy was last looked for while the proxier programs, or a refused switch
    /// previewed.
    pub(super) last_check: Option<Instant>,
    /// Whether a switch that touches connections goes ahead.
    pub(super) allow_connection_changes: bool,
    /// Whether the kernel's table was looked at for a drain a restart interrupted.
    pub(super) drains_checked: bool,
    /// `true` while the proxier may hold kube-proxy's ports (healthz, metrics): while it
    /// programs.
    pub(super) ports: watch::Sender<bool>,
    /// The node-wide kernel settings, made at each switch to kipvs.
    pub(super) settings: Box<dyn KernelSettings>,
    /// Since when every signal has said kube-proxy is not present (`None`: it is, or it was
    /// not looked at yet): the debounce of a switch ([`state::DEBOUNCE`]).
    pub(super) absent_since: Option<Instant>,
    /// Whether `inet kipvs` was deleted since the proxier last programmed (kube-proxy came
    /// back and synced, or took the node back).
    pub(super) cleared: bool,
    /// Whether the API is reached without a ClusterIP only kipvs would program: a switch from
    /// kube-proxy waits while it says why not.
    pub(super) api: ApiPath,
    /// kube-proxy's mode as this process last saw it on the node (its `/proxyMode` or the form
    /// of its state, and where) while the revision in force (the first of the three; `None`:
    /// the local configuration) was: a switch that kube-proxy's mode refused stays refused
    /// once nothing of kube-proxy is left to read it from (its chains flushed by
    /// `kube-proxy --cleanup`, an administrator or a reboot of iptables), until kube-proxy is
    /// seen in another mode or another revision asks ([`state::Facts::signals`]).
    pub(super) mode_seen: Option<(Option<String>, Mode, String)>,
}

impl Takeover {
    /// The proxier's side of the move on the node `node` describes; `settings`: made at each
    /// switch to kipvs; `allow_connection_changes`: a switch that touches connections goes
    /// ahead.
    pub fn new(
        node: Arc<dyn KubeProxyNode>,
        settings: Box<dyn KernelSettings>,
        allow_connection_changes: bool,
    ) -> Self {
        Takeover {
            node,
            found: false,
            done: false,
            removal: None,
            kubelet_version: None,
            phase: None,
            standby: None,
            back: None,
            last_check: None,
            allow_connection_changes,
            drains_checked: false,
            ports: watch::Sender::new(false),
            settings,
            absent_since: None,
            cleared: false,
            api: ApiPath::default(),
            mode_seen: None,
        }
    }

    /// The same, with a switch from kube-proxy waiting while `api` gives a reason
    /// ([`ApiPath::refusal`]: the API is reached only through the `kubernetes` ClusterIP and no
    /// other address of it is remembered on the node).
    pub fn needing_api(self, api: ApiPath) -> Self {
        Takeover { api, ..self }
    }

    /// kube-proxy on the node, as the takeover sees it.
    pub fn node(&self) -> &dyn KubeProxyNode {
        &*self.node
    }

    /// A receiver of whether the proxier may hold kube-proxy's ports (healthz, metrics) now:
    /// `true` while it programs. Its servers bind them only then.
    pub fn ports(&self) -> watch::Receiver<bool> {
        self.ports.subscribe()
    }

    /// Where the node stands (`None`: not decided yet).
    pub fn phase(&self) -> Option<ServiceProxyPhase> {
        self.phase
    }

    /// Whether the proxier programs now (`false` until the switch has decided that it may).
    pub fn programs(&self) -> bool {
        self.phase.is_some_and(ServiceProxyPhase::kipvs_programs)
    }

    /// Stops the removal in progress, if any (kube-proxy is back, or takes the node back: its
    /// new rules must not be removed).
    pub(super) fn stop_removal(&mut self) {
        if let Some(removal) = self.removal.take() {
            removal.abort();
        }
        self.done = false;
    }

    /// Sets the node's kubelet version (`status.nodeInfo.kubeletVersion`; `None`: unknown),
    /// which says who owns the shared nat chains ([`kubelet_creates_shared_chains`]).
    pub fn set_kubelet_version(&mut self, kubelet_version: Option<&str>) {
        self.kubelet_version = kubelet_version.map(str::to_owned);
    }

    fn kubelet_chains(&self) -> bool {
        kubelet_creates_shared_chains(self.kubelet_version.as_deref())
    }

    /// Whether kube-proxy's state was found on the node (it ran, or a removal found its
    /// iptables rules or ipsets): only then do its NodePort virtual servers on other local
    /// addresses drain ([`kube_proxy_node_ports`]). Nothing is read for it before the first
    /// full sync, which so never waits for the tools: on a node where kube-proxy had stopped
    /// before the proxier started, the drains begin with the first full sync after the
    /// removal.
    pub fn found_kube_proxy(&self) -> bool {
        self.found
    }

    /// Takes the outcome of a removal that has ended.
    pub async fn take_outcome(&mut self) {
        if let Some(removal) = self.removal.take_if(|r| r.is_finished()) {
            let (done, found) = removal.await.unwrap_or((false, false));
            self.done = done;
            self.found |= found;
        }
    }

    /// Resolves when the removal in progress ends, its outcome taken; never without one.
    /// Cancel-safe: dropped before that, the removal goes on.
    pub(super) async fn removal_ended(&mut self) {
        let Some(removal) = self.removal.as_mut() else {
            return std::future::pending().await;
        };
        let (done, found) = removal.await.unwrap_or((false, false));
        self.removal = None;
        self.done = done;
        self.found |= found;
    }

    /// Whether kube-proxy's leftovers were removed (or none was found, every ruleset read).
    pub fn done(&self) -> bool {
        self.done
    }

    /// After a full sync: unless a removal is still running or the sync's rules could not be
    /// written (kipvs's table is not in place), start one ([`remove_leftovers`]), telling
    /// `observer`; the outcome of the last one is taken here too.
    pub async fn after_full_sync(&mut self, report: &SyncReport, observer: &Arc<dyn Observer>) {
        self.take_outcome().await;
        if self.done || self.removal.is_some() {
            return;
        }
        if report
            .failures
            .iter()
            .any(|f| matches!(f.op, Op::WriteRules(_)))
        {
            tracing::warn!("kube-proxy's rules stay until kipvs's nftables rules are in place");
            return;
        }
        let (node, observer) = (self.node.clone(), observer.clone());
        let kubelet_chains = self.kubelet_chains();
        self.removal = Some(tokio::spawn(
            async move {
                let removal = remove_leftovers(&*node, kubelet_chains, &*observer);
                match tokio::time::timeout(REMOVAL_DEADLINE, removal).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        let e = format!(
                            "not done within {}s (retried after the next full sync)",
                            REMOVAL_DEADLINE.as_secs()
                        );
                        tracing::warn!("removing kube-proxy's leftovers: {e}");
                        observer.takeover(&TakeoverEvent::RemovalFailed(e));
                        (false, false)
                    }
                }
            }
            .instrument(tracing::info_span!("kube_proxy_removal")),
        ));
    }

    /// Waits for the removal in progress, and takes its outcome.
    #[cfg(test)]
    async fn removed(&mut self) {
        if let Some(removal) = self.removal.take() {
            let (done, found) = removal.await.unwrap();
            self.done = done;
            self.found |= found;
        }
    }
}

/// Reads what kube-proxy left on `node` (`kubelet_chains`: whether kubelet creates the shared
/// nat chains, [`kubelet_creates_shared_chains`]) and removes it, telling `observer`. Returns whether
/// nothing of kube-proxy's is left: a ruleset or ipset list that could not be read (other than
/// a backend that is not installed) leaves it not done, logged and told as a failure; and
/// whether kube-proxy's leftovers were found.
async fn remove_leftovers(
    node: &dyn KubeProxyNode,
    kubelet_chains: bool,
    observer: &dyn Observer,
) -> (bool, bool) {
    let leftovers = node.leftovers(kubelet_chains).await;
    let unreadable = leftovers.unreadable.join("; ");
    if !unreadable.is_empty() {
        tracing::warn!(
            "kube-proxy's leftovers: cannot read {unreadable} (retried after the next full sync)"
        );
        observer.takeover(&TakeoverEvent::RemovalFailed(format!(
            "cannot read {unreadable}"
        )));
    }
    for ruleset in &leftovers.rulesets {
        for (chain, why) in &ruleset.removal.kept_for_policy {
            tracing::warn!(
                "kube-proxy's {}-{} filter {chain} stays, with the jumps to it and the sets it \
                 matches: the {why} would drop what it accepts",
                ruleset.family,
                ruleset.backend
            );
        }
    }
    if leftovers.is_empty() {
        return (unreadable.is_empty(), false);
    }
    for line in leftovers.to_string().lines() {
        tracing::info!(target: super::syncer::OPS_LOG, "takeover {line}");
    }
    let (rules, chains, sets) = leftovers.counts();
    match node.remove(&leftovers).await {
        Ok(()) => {
            tracing::info!(
                rules,
                chains,
                sets,
                "removed kube-proxy's iptables rules, chains and ipsets"
            );
            observer.takeover(&TakeoverEvent::Removed {
                rules,
                chains,
                sets,
            });
            (unreadable.is_empty(), true)
        }
        Err(e) => {
            tracing::warn!(
                "removing kube-proxy's leftovers failed (retried after the next full sync): {e}"
            );
            observer.takeover(&TakeoverEvent::RemovalFailed(e));
            (false, true)
        }
    }
}

#[cfg(test)]
mod tests;

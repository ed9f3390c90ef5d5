//! An in-memory [`Dataplane`] with the kernel's error behaviour, for unit tests.

use super::kernel::settings::{FakeKernel, KernelSettings, SchedulerError, SettingsError};
use super::{Dataplane, DataplaneError, NFT_STAGE, Op, OpFailure, isolate};
use crate::dataplane::kernel::conntrack::{Listing, UdpEntry};
use crate::model::{ObservedState, ObservedVirtualServer, SetElement, VirtualServerKey};
use futures::future::BoxFuture;
use ipnet::IpNet;
use kipvs_crds::config::ProxierConfiguration;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;
use tokio::time::Instant;

/// An IPVS table and a `kube-ipvs0` address list held in memory.
///
/// Ops change the state through [`ObservedState::apply_all`], with the kernel's errors.
#[derive(Clone, Debug, Default)]
pub struct FakeDataplane {
    /// The current table; tests may edit it (e.g. set connection counts).
    pub state: ObservedState,
    /// Every op applied successfully, in order.
    pub applied: Vec<Op>,
    /// Addresses the fake node has on interfaces other than `kube-ipvs0`; a test that runs the
    /// engine's loop keeps a clone of the sender to change them (which wakes
    /// [`Dataplane::interfaces_changed`]).
    pub other_addresses: watch::Sender<BTreeSet<IpAddr>>,
    /// What [`Dataplane::other_interface_addresses`] last read (its version marked seen).
    pub(crate) seen_addresses: Option<watch::Receiver<BTreeSet<IpAddr>>>,
    /// `kube-ipvs0` was deleted (a test clears `state.bound_addresses` with it): the next
    /// [`Dataplane::kube_ipvs0_recreated`] makes it again and answers true.
    pub kube_ipvs0_deleted: bool,
    /// IPVS schedulers this fake kernel lacks (as a kernel without the `ip_vs_<name>` module):
    /// adding or editing a virtual server with one fails with `ENOENT`, and
    /// [`FakeDataplane::kernel_settings`]'s scheduler check rejects it.
    pub missing_schedulers: BTreeSet<String>,
    /// The fake node's UDP conntrack entries; [`Dataplane::delete_conntrack`] removes from it.
    pub conntrack: BTreeSet<UdpEntry>,
    /// Every scheduler [`Dataplane::check_scheduler`] was asked about, in order.
    pub scheduler_checks: Vec<String>,
    /// How many times the whole state was observed ([`Dataplane::observe`]).
    pub full_observes: usize,
    /// How many times the node's other addresses were read
    /// ([`Dataplane::other_interface_addresses`]).
    pub address_reads: usize,
    /// Ops whose next application succeeds but is reported failed with `ENOBUFS`, as when the
    /// kernel drops a batch's answers ([`super::kernel::batch`]): the caller cannot know the outcome.
    pub lost_answers: Vec<Op>,
    /// nftables ops this fake kernel refuses (`File exists`) while they are listed, changing
    /// nothing, as when a set element of kipvs clashes with one it did not write.
    pub refusing: Vec<Op>,
    /// How long a full observation ([`Dataplane::observer`]) takes, as `nft -j list table` and
    /// the IPVS dump of a large table do (1.7 s of `nft` at 10k Services): the observation
    /// returns the state as it was when it started, this much (Tokio) time later.
    pub observe_delay: Duration,
    /// How many of the next full observations fail (after their
    /// [`observe_delay`](Self::observe_delay)), as when `nft` cannot list the table: each
    /// one that fails counts this down.
    pub observe_failures: usize,
    /// Where the fake tells what happens to it and when, for tests that run the engine's loop
    /// and so cannot look at the fake meanwhile.
    pub events: Option<UnboundedSender<(Instant, FakeEvent)>>,
}

/// What happened to a [`FakeDataplane`] (see [`FakeDataplane::events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeEvent {
    /// A full observation started.
    ObserveStarted,
    /// A full observation ended (after [`FakeDataplane::observe_delay`]).
    ObserveEnded,
    /// An op was applied successfully.
    Applied(Op),
}

impl FakeDataplane {
    /// Tells [`FakeDataplane::events`] of `event`, if anyone listens.
    fn tell(&self, event: FakeEvent) {
        if let Some(events) = &self.events {
            let _ = events.send((Instant::now(), event));
        }
    }

    /// The receiver [`Dataplane::other_interface_addresses`] reads through (made at the first
    /// use: a receiver made with the sender would not follow a sender a test put in place).
    fn address_receiver(&mut self) -> &mut watch::Receiver<BTreeSet<IpAddr>> {
        let sender = &self.other_addresses;
        self.seen_addresses.get_or_insert_with(|| {
            let mut receiver = sender.subscribe();
            receiver.mark_changed();
            receiver
        })
    }

    /// A fake holding `state`.
    pub fn new(state: ObservedState) -> Self {
        FakeDataplane {
            state,
            ..Default::default()
        }
    }

    /// The [`KernelSettings`] of this fake node: [`FakeKernel`]'s, except that the schedulers in
    /// [`FakeDataplane::missing_schedulers`] are not available.
    pub fn kernel_settings(&self) -> FakeModules {
        FakeModules {
            missing_schedulers: self.missing_schedulers.clone(),
        }
    }
}

impl FakeDataplane {
    /// The ops of an nftables stage the kernel would refuse: those of
    /// [`FakeDataplane::refusing`], and adding a `firewall-allow` interval that overlaps another
    /// of the same virtual server or equals a present one (present and not deleted in the
    /// stage, or added before it in the stage), which the kernel's concatenated interval set
    /// refuses with `EEXIST` (kipvs adds them with `create`, `NLM_F_EXCL`).
    fn refused(&self, stage: &[Op]) -> Vec<OpFailure> {
        let deleted: BTreeSet<&SetElement> = stage
            .iter()
            .filter_map(|op| match op {
                Op::DeleteSetElement(e) => Some(e),
                _ => None,
            })
            .collect();
        let mut added: Vec<(VirtualServerKey, IpNet)> = Vec::new();
        let mut clashes = |key: VirtualServerKey, net: IpNet| {
            let lowest = IpNet::V4(Default::default());
            let highest = IpNet::V6(ipnet::Ipv6Net::new(Ipv6Addr::from(u128::MAX), 128).unwrap());
            let present = self
                .state
                .set_elements
                .range(
                    SetElement::FirewallAllow(key, lowest)
                        ..=SetElement::FirewallAllow(key, highest),
                )
                .filter(|e| !deleted.contains(e))
                .filter_map(|e| match e {
                    SetElement::FirewallAllow(_, other) => Some(*other),
                    _ => None,
                });
            let earlier = added.iter().filter(|(k, _)| *k == key).map(|(_, n)| *n);
            let overlaps = |other: IpNet| other.contains(&net) || net.contains(&other);
            let clash = present.chain(earlier).any(overlaps);
            if !clash {
                added.push((key, net));
            }
            clash
        };
        stage
            .iter()
            .filter(|op| {
                self.refusing.contains(op)
                    || matches!(op, Op::AddSetElement(SetElement::FirewallAllow(key, net))
                        if clashes(*key, *net))
            })
            .map(|op| OpFailure {
                op: op.clone(),
                error: DataplaneError::NftTransaction("Could not process rule: File exists".into()),
            })
            .collect()
    }

    /// [`Dataplane::apply`]: stage by stage, as the kernel dataplane: an nftables stage's
    /// refused ops (overlapping `firewall-allow` intervals, which the kernel refuses) fail
    /// alone, as the kernel's [`isolate::Isolation`] leaves them, and what depends on a failed
    /// op is kept back by the same [`isolate::Withholding`].
    fn apply_stages(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        let mut failures = Vec::new();
        let mut withholding = isolate::Withholding::default();
        for stage in ops.chunk_by(|a, b| a.stage() == b.stage()) {
            let (stage, held) = withholding.split(stage);
            failures.extend(held);
            let refused = if stage.first().is_some_and(|op| op.stage() == NFT_STAGE) {
                self.refused(&stage)
            } else {
                Vec::new()
            };
            let stage_failures = if refused.is_empty() {
                self.apply_stage(&stage)
            } else {
                let rest: Vec<Op> = stage
                    .iter()
                    .filter(|op| !refused.iter().any(|f| &f.op == *op))
                    .cloned()
                    .collect();
                let failures = self.apply_stage(&rest);
                let mut refused = refused;
                if isolate::refused_creations(&refused) {
                    let present = &self.state.set_elements;
                    let applied = isolate::applied_anyway(&mut refused, present);
                    self.applied.extend(applied);
                }
                refused.into_iter().chain(failures).collect()
            };
            withholding.failed(ops, &stage_failures);
            failures.extend(stage_failures);
        }
        failures
    }

    fn apply_stage(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        // In op order: the failures of ops whose scheduler this kernel lacks (they change
        // nothing), and the results of the others.
        let failures = RefCell::new(Vec::new());
        let missing_scheduler = |op: &Op| {
            let (Op::AddVirtualServer(_, spec) | Op::UpdateVirtualServer(_, spec)) = op else {
                return false;
            };
            if !self.missing_schedulers.contains(&*spec.scheduler) {
                return false;
            }
            failures.borrow_mut().push(OpFailure {
                op: op.clone(),
                error: DataplaneError::Io {
                    context: format!("IPVS scheduler {}", spec.scheduler),
                    source: std::io::Error::from_raw_os_error(2),
                },
            });
            true
        };
        let (applied, lost_answers) = (&mut self.applied, &mut self.lost_answers);
        let available = ops.iter().filter(|op| !missing_scheduler(op));
        self.state.apply_all(available, |op, result| match result {
            Ok(()) if lost_answers.contains(op) => {
                lost_answers.retain(|lost| lost != op);
                applied.push(op.clone());
                failures.borrow_mut().push(OpFailure {
                    op: op.clone(),
                    error: DataplaneError::Io {
                        context: "netlink answers".into(),
                        source: std::io::Error::from_raw_os_error(libc::ENOBUFS),
                    },
                });
            }
            Ok(()) => applied.push(op.clone()),
            Err(e) => failures.borrow_mut().push(OpFailure {
                op: op.clone(),
                error: e.into(),
            }),
        });
        failures.into_inner()
    }
}

/// [`KernelSettings`] of a [`FakeDataplane`] that lacks some IPVS schedulers (see
/// [`FakeDataplane::kernel_settings`]).
#[derive(Clone, Debug, Default)]
pub struct FakeModules {
    /// The schedulers the fake kernel lacks.
    pub missing_schedulers: BTreeSet<String>,
}

impl KernelSettings for FakeModules {
    fn check<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SchedulerError>> {
        let scheduler = config.ipvs.effective_scheduler();
        if self.missing_schedulers.contains(scheduler) {
            let scheduler = scheduler.to_owned();
            return Box::pin(async move { Err(SchedulerError::Missing { scheduler }) });
        }
        FakeKernel.check(config)
    }

    fn apply<'a>(
        &'a self,
        config: &'a ProxierConfiguration,
    ) -> BoxFuture<'a, Result<(), SettingsError>> {
        FakeKernel.apply(config)
    }
}

impl Dataplane for FakeDataplane {
    fn observer(
        &mut self,
    ) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send + 'static {
        self.full_observes += 1;
        self.tell(FakeEvent::ObserveStarted);
        let fails = self.observe_failures > 0;
        self.observe_failures = self.observe_failures.saturating_sub(1);
        let (state, delay, events) = (self.state.clone(), self.observe_delay, self.events.clone());
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Some(events) = events {
                let _ = events.send((Instant::now(), FakeEvent::ObserveEnded));
            }
            if fails {
                return Err(DataplaneError::Io {
                    context: "fake: reading the table".into(),
                    source: std::io::Error::other("the observation fails"),
                });
            }
            Ok(state)
        }
    }

    async fn observe_virtual_servers(
        &mut self,
        keys: &[VirtualServerKey],
    ) -> Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, DataplaneError> {
        Ok(keys
            .iter()
            .filter_map(|k| Some((*k, self.state.virtual_servers.get(k)?.clone())))
            .collect())
    }

    async fn observe_addresses(&mut self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        Ok(self.state.bound_addresses.clone())
    }

    async fn observe_set_elements(&mut self) -> Result<BTreeSet<SetElement>, DataplaneError> {
        Ok(self.state.set_elements.clone())
    }

    async fn check_scheduler(&mut self, scheduler: &str) -> Result<(), SchedulerError> {
        self.scheduler_checks.push(scheduler.to_owned());
        let mut config = ProxierConfiguration::default();
        config.ipvs.scheduler = scheduler.to_owned();
        self.kernel_settings().check(&config).await
    }

    async fn other_interface_addresses(&mut self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        self.address_reads += 1;
        let seen = self.address_receiver();
        let addresses = seen.borrow_and_update().clone();
        Ok(addresses)
    }

    fn interfaces_changed(&mut self) -> impl Future<Output = ()> + Send + 'static {
        let mut changes = self.address_receiver().clone();
        async move {
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    async fn kube_ipvs0_recreated(&mut self) -> Result<bool, DataplaneError> {
        Ok(std::mem::take(&mut self.kube_ipvs0_deleted))
    }

    /// [`FakeDataplane::apply_stages`], telling [`FakeDataplane::events`] of each op applied.
    async fn apply(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        let applied = self.applied.len();
        let failures = self.apply_stages(ops);
        for op in &self.applied[applied..] {
            self.tell(FakeEvent::Applied(op.clone()));
        }
        failures
    }

    async fn remove_rules(&mut self) -> Result<(), DataplaneError> {
        self.state.set_elements.clear();
        self.state.nft_rule_comments.clear();
        Ok(())
    }

    async fn udp_conntrack(
        &mut self,
        listing: Listing<'_>,
    ) -> Result<Vec<UdpEntry>, DataplaneError> {
        Ok(self
            .conntrack
            .iter()
            .filter(|e| listing.contains(e))
            .copied()
            .collect())
    }

    async fn delete_conntrack(&mut self, entries: &[UdpEntry]) -> Vec<(UdpEntry, DataplaneError)> {
        for e in entries {
            self.conntrack.remove(e);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures come in op order, whatever the op that fails: a lost answer to a set-element
    /// addition (done by a run of them) and a virtual server refused for its scheduler.
    #[test]
    fn failures_come_in_op_order() {
        let element = SetElement::HealthCheckNodePort(30000);
        let key = VirtualServerKey {
            address: [10, 96, 0, 1].into(),
            port: 80,
            protocol: crate::model::Protocol::Tcp,
        };
        let spec = crate::model::VirtualServerSpec {
            scheduler: "sed".into(),
            persistence_timeout: None,
            sched_flags: 0,
        };
        let ops = [Op::AddSetElement(element), Op::AddVirtualServer(key, spec)];
        let mut fake = FakeDataplane {
            missing_schedulers: ["sed".to_string()].into(),
            lost_answers: vec![ops[0].clone()],
            ..Default::default()
        };
        let failures = futures::executor::block_on(fake.apply(&ops));
        let failed: Vec<&str> = failures.iter().map(|f| f.op.name()).collect();
        assert_eq!(failed, ["AddSetElement", "AddVirtualServer"]);
    }

    #[test]
    fn missing_scheduler_fails_the_check_only_for_that_scheduler() {
        let fake = FakeDataplane {
            missing_schedulers: ["sed".to_string()].into(),
            ..Default::default()
        };
        let kernel = fake.kernel_settings();
        let mut config = ProxierConfiguration::default();
        config.ipvs.scheduler = "sed".into();
        let err = futures::executor::block_on(kernel.check(&config)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IPVS scheduler \"sed\" is not available: the kernel lacks ip_vs_sed"
        );
        config.ipvs.scheduler = "wrr".into();
        futures::executor::block_on(kernel.check(&config)).unwrap();
        config.ipvs.scheduler = "nope".into();
        assert!(futures::executor::block_on(kernel.check(&config)).is_err());
    }
}

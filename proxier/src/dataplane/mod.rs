//! Converging the kernel onto the desired state.
//!
//! [`diff::diff`] is pure: it compares a [`DesiredState`] with an [`ObservedState`] and returns the
//! [`Op`]s that make the second equal to the first, in the safe order kpng used (DESIGN-BRIEF,
//! "Proxier: one direction of flow"), with the endpoint changes of existing virtual servers
//! ahead of nftables ([`diff::diff_scoped`] has the reasons):
//!
//! 1. unbind addresses from `kube-ipvs0`,
//! 2. delete (or drain) real servers,
//! 3. delete virtual servers,
//! 4. add the hairpin elements of new endpoints (an element-only nftables transaction of its
//!    own, unless the rules are rewritten in this sync),
//! 5. update virtual servers that exist, and add / update the real servers of existing virtual
//!    servers whose own set elements do not change in this sync (an endpoint change: the new
//!    endpoint takes traffic without waiting for the main nftables transaction),
//! 6. nftables: rewrite the rules if they changed, delete and add set elements (one atomic
//!    transaction: deletions come after the virtual servers, real servers and addresses they
//!    concern are gone, additions before the virtual servers they concern take traffic),
//! 7. add virtual servers,
//! 8. add / update the other real servers (of new virtual servers, or of virtual servers whose
//!    masquerade or firewall elements change),
//! 9. bind addresses to `kube-ipvs0`.
//!
//! A [`Dataplane`] applies them: [`kernel::KernelDataplane`] on a real node, [`fake::FakeDataplane`]
//! in unit tests. Ops inside one stage are independent of each other, so a dataplane may run
//! them concurrently (the kernel one pipelines them over one netlink socket).

pub mod diff;
pub mod fake;
pub mod host;
pub mod isolate;
pub mod kernel;
pub mod nftables;

use crate::dataplane::kernel::conntrack::{Listing, UdpEntry};
use crate::model::{
    DesiredState, ObservedRealServer, ObservedState, ObservedVirtualServer, VirtualServerKey,
    VirtualServerSpec,
};
use crate::model::{NftRules, SetElement};
use serde::Serialize;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};

/// One change to the kernel. Variant order is the order [`diff::diff`] emits them in, but for
/// new hairpin elements and the IPVS updates of existing virtual servers, which go before the
/// other nftables ops ([`diff::diff_scoped`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Op {
    /// Remove an address from `kube-ipvs0`.
    UnbindAddress(IpAddr),
    /// Delete a real server (it has no connections left, or is UDP/SCTP).
    DeleteRealServer {
        /// Its virtual server.
        vs: VirtualServerKey,
        /// Its address.
        rs: SocketAddr,
    },
    /// Delete a virtual server with all its real servers.
    DeleteVirtualServer(VirtualServerKey),
    /// Write kipvs's nftables rules (flush and refill its chains, atomically).
    WriteRules(NftRules),
    /// Delete an element from one of kipvs's nftables sets.
    DeleteSetElement(SetElement),
    /// Add an element to one of kipvs's nftables sets.
    AddSetElement(SetElement),
    /// Create a virtual server.
    AddVirtualServer(VirtualServerKey, VirtualServerSpec),
    /// Change a virtual server's scheduler, persistence or flags (`IPVS_CMD_SET_SERVICE`).
    UpdateVirtualServer(VirtualServerKey, VirtualServerSpec),
    /// Create a real server (masquerade forwarding) with a weight.
    AddRealServer {
        /// Its virtual server.
        vs: VirtualServerKey,
        /// Its address.
        rs: SocketAddr,
        /// Its weight.
        weight: u32,
    },
    /// Change a real server's weight; weight 0 with a real server that left the desired set
    /// means it is draining (no new connections, existing ones continue).
    UpdateRealServer {
        /// Its virtual server.
        vs: VirtualServerKey,
        /// Its address.
        rs: SocketAddr,
        /// Its new weight.
        weight: u32,
    },
    /// Add an address (/32 or /128) to `kube-ipvs0`.
    BindAddress(IpAddr),
}

/// The stage of the nftables ops ([`Op::stage`]): applied as one transaction.
pub const NFT_STAGE: u8 = 3;

impl Op {
    /// The stage (0..=6) this op belongs to: its kind. Consecutive ops of one stage in a
    /// [`diff::diff`] do not depend on each other, except the nftables ones (stage 3), which go to
    /// the kernel together as one transaction in the order [`diff`] emits them. A diff can hold
    /// a stage twice (new hairpin elements before the real servers of existing virtual servers,
    /// the other nftables ops after them; those real servers before the new virtual servers',
    /// which come after the nftables stage).
    pub fn stage(&self) -> u8 {
        match self {
            Op::UnbindAddress(_) => 0,
            Op::DeleteRealServer { .. } => 1,
            Op::DeleteVirtualServer(_) => 2,
            Op::WriteRules(_) | Op::DeleteSetElement(_) | Op::AddSetElement(_) => 3,
            Op::AddVirtualServer(..) | Op::UpdateVirtualServer(..) => 4,
            Op::AddRealServer { .. } | Op::UpdateRealServer { .. } => 5,
            Op::BindAddress(_) => 6,
        }
    }

    /// The virtual server the op concerns, if any (a set element's own virtual server).
    pub fn virtual_server(&self) -> Option<VirtualServerKey> {
        match self {
            Op::UnbindAddress(_) | Op::BindAddress(_) | Op::WriteRules(_) => None,
            Op::DeleteSetElement(e) | Op::AddSetElement(e) => e.virtual_server(),
            Op::DeleteVirtualServer(vs)
            | Op::AddVirtualServer(vs, _)
            | Op::UpdateVirtualServer(vs, _)
            | Op::DeleteRealServer { vs, .. }
            | Op::AddRealServer { vs, .. }
            | Op::UpdateRealServer { vs, .. } => Some(*vs),
        }
    }

    /// The variant's name, as logged (`op=AddVirtualServer`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::UnbindAddress(_) => "UnbindAddress",
            Op::DeleteRealServer { .. } => "DeleteRealServer",
            Op::DeleteVirtualServer(_) => "DeleteVirtualServer",
            Op::WriteRules(_) => "WriteRules",
            Op::DeleteSetElement(_) => "DeleteSetElement",
            Op::AddSetElement(_) => "AddSetElement",
            Op::AddVirtualServer(..) => "AddVirtualServer",
            Op::UpdateVirtualServer(..) => "UpdateVirtualServer",
            Op::AddRealServer { .. } => "AddRealServer",
            Op::UpdateRealServer { .. } => "UpdateRealServer",
            Op::BindAddress(_) => "BindAddress",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op={}", self.name())?;
        match self {
            Op::UnbindAddress(a) | Op::BindAddress(a) => write!(f, " address={a}"),
            Op::DeleteVirtualServer(vs) => write!(f, " vs=\"{vs}\""),
            Op::WriteRules(rules) => {
                write!(f, " rules={}", nftables::rules::rule_comments(rules).len())
            }
            Op::DeleteSetElement(e) | Op::AddSetElement(e) => write!(f, " element=\"{e}\""),
            Op::AddVirtualServer(vs, s) | Op::UpdateVirtualServer(vs, s) => {
                write!(f, " vs=\"{vs}\" scheduler={}", s.scheduler)?;
                if let Some(t) = s.persistence_timeout {
                    write!(f, " persistence={t}s")?;
                }
                Ok(())
            }
            Op::DeleteRealServer { vs, rs } => write!(f, " vs=\"{vs}\" rs={rs}"),
            Op::AddRealServer { vs, rs, weight } | Op::UpdateRealServer { vs, rs, weight } => {
                write!(f, " vs=\"{vs}\" rs={rs} weight={weight}")
            }
        }
    }
}

/// The nftables ops among `ops` as one [`crate::dataplane::nftables::codec::Transaction`] (the others are ignored).
pub fn nft_transaction(ops: &[Op]) -> nftables::codec::Transaction<'_> {
    let mut tx = nftables::codec::Transaction::default();
    for op in ops {
        match op {
            Op::WriteRules(rules) => tx.rules = Some(rules),
            Op::DeleteSetElement(e) => tx.delete.push(e),
            Op::AddSetElement(e) => tx.add.push(e),
            _ => {}
        }
    }
    tx
}

impl From<&DesiredState> for ObservedState {
    /// The state a kernel holds right after `desired` was programmed into an empty table:
    /// same virtual servers, weights and bound addresses, no connections.
    fn from(desired: &DesiredState) -> Self {
        ObservedState {
            virtual_servers: desired
                .virtual_servers
                .iter()
                .map(|(key, vs)| {
                    let real_servers = vs
                        .real_servers
                        .iter()
                        .map(|(rs, &weight)| {
                            let observed = ObservedRealServer {
                                weight,
                                active_connections: 0,
                                inactive_connections: 0,
                            };
                            (rs, observed)
                        })
                        .collect();
                    let observed = ObservedVirtualServer {
                        spec: vs.spec.clone(),
                        real_servers,
                    };
                    (*key, observed)
                })
                .collect(),
            bound_addresses: desired.bind_addresses.clone(),
            set_elements: desired.set_elements.clone(),
            nft_rule_comments: nftables::rules::rule_comments(&desired.nft_rules).to_vec(),
        }
    }
}

impl ObservedState {
    /// The state after `op`, as the kernel would change it. Errors mirror the kernel's
    /// (`ip_vs_ctl.c`): adding an existing virtual or real server is `EEXIST`
    /// ([`ipvs::Error::Exists`]); touching a missing virtual server is `ESRCH`
    /// ([`ipvs::Error::NoSuchService`]); a missing real server is `ENOENT`
    /// ([`ipvs::Error::NotFound`]). Binding a bound address succeeds (kube-proxy treats
    /// `EEXIST` as bound), unbinding a missing one too (`ENXIO` is ignored upstream).
    ///
    /// Used by the fake dataplane and by the kernel syncer's cache of the kernel's state.
    pub fn apply(&mut self, op: &Op) -> Result<(), ipvs::Error> {
        let vss = &mut self.virtual_servers;
        match op {
            Op::UnbindAddress(a) => {
                self.bound_addresses.remove(a);
            }
            Op::BindAddress(a) => {
                self.bound_addresses.insert(*a);
            }
            Op::WriteRules(rules) => {
                self.nft_rule_comments = nftables::rules::rule_comments(rules).to_vec()
            }
            // `nft add element` of a present element succeeds (the `create` of a present
            // `firewall-allow` interval is refused, and then counted as applied:
            // `isolate::applied_anyway`); deleting a missing one is ENOENT (and fails the whole
            // transaction).
            Op::AddSetElement(e) => {
                self.set_elements.insert(*e);
            }
            Op::DeleteSetElement(e) => {
                if !self.set_elements.remove(e) {
                    return Err(ipvs::Error::NotFound);
                }
            }
            Op::DeleteVirtualServer(key) => {
                vss.remove(key).ok_or(ipvs::Error::NoSuchService)?;
            }
            Op::AddVirtualServer(key, spec) => {
                let Entry::Vacant(entry) = vss.entry(*key) else {
                    return Err(ipvs::Error::Exists);
                };
                entry.insert(ObservedVirtualServer {
                    spec: spec.clone(),
                    real_servers: Default::default(),
                });
            }
            Op::UpdateVirtualServer(key, spec) => {
                vss.get_mut(key).ok_or(ipvs::Error::NoSuchService)?.spec = spec.clone();
            }
            Op::DeleteRealServer { vs, .. }
            | Op::AddRealServer { vs, .. }
            | Op::UpdateRealServer { vs, .. } => {
                let vs = vss.get_mut(vs).ok_or(ipvs::Error::NoSuchService)?;
                return apply_to_real_servers(vs, op);
            }
        }
        Ok(())
    }

    /// [`apply`](Self::apply) each of `ops` in order, calling `done` with each op and its
    /// result as it goes: the same state and results as one `apply` per op. Consecutive
    /// real-server ops of one virtual server, as [`diff`] emits them, look it up once (a full
    /// sync of 50k Services folds 1.1M `AddRealServer`s into a map of 112k virtual servers).
    pub fn apply_all<'a>(
        &mut self,
        ops: impl IntoIterator<Item = &'a Op>,
        mut done: impl FnMut(&'a Op, Result<(), ipvs::Error>),
    ) {
        let mut ops = ops.into_iter().peekable();
        while let Some(op) = ops.next() {
            if let Op::AddSetElement(_) = op {
                // Adding a present element succeeds: a run of additions is a union, built in
                // one pass when it is large against the set (a full sync adds 268k elements
                // for 50k Services).
                // Each op is done before the next is pulled (`ops` may be a filter with effects
                // of its own, as the fake dataplane's).
                let mut run = Vec::new();
                let mut next = Some(op);
                while let Some(op @ Op::AddSetElement(element)) = next {
                    run.push(*element);
                    done(op, Ok(()));
                    next = ops.next_if(|op| matches!(op, Op::AddSetElement(_)));
                }
                if run.len() * BULK_RATIO >= self.set_elements.len() {
                    self.set_elements.append(&mut run.into_iter().collect());
                } else {
                    self.set_elements.extend(run);
                }
                continue;
            }
            let Some(key) = real_server_op(op) else {
                done(op, self.apply(op));
                continue;
            };
            let mut vs = self.virtual_servers.get_mut(key);
            let mut next = Some(op);
            while let Some(op) = next {
                let result = match vs.as_deref_mut() {
                    Some(vs) => apply_to_real_servers(vs, op),
                    None => Err(ipvs::Error::NoSuchService),
                };
                done(op, result);
                next = ops.next_if(|op| real_server_op(op) == Some(key));
            }
        }
    }
}

/// Sorted keys at least `1 / BULK_RATIO` as many as the sorted collection they meet are
/// merged with it in one walk (O(keys + collection)) rather than searched one by one
/// (O(keys · log collection), which costs about log₂ 268k ≈ 18 comparisons per key when a
/// full diff or sync meets the 268k set elements of 50k Services).
const BULK_RATIO: usize = 16;

/// Looks up keys given in strictly ascending order (no key twice) in `map`, `keys` of them in
/// all: one B-tree search each when they are few against the map, or by walking the map
/// alongside them when they are at least `1 / BULK_RATIO` of its size. The walk starts at the
/// first key asked, so keys of one part of the map (a slice of a full sync's finish) walk only
/// that part: O(keys + the entries between the first and the last). A key asked out of order
/// or twice is a bug: a walk would not find it.
pub(crate) fn ascending_get<'a, K: Ord, V>(
    map: &'a BTreeMap<K, V>,
    keys: usize,
) -> impl FnMut(&K) -> Option<&'a V> {
    let bulk = keys.saturating_mul(BULK_RATIO) >= map.len();
    let mut walk = None;
    move |key| {
        if !bulk {
            return map.get(key);
        }
        let walk = walk.get_or_insert_with(|| map.range(key..).peekable());
        while walk.next_if(|(k, _)| *k < key).is_some() {}
        walk.next_if(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// [`ascending_get`] for a set: whether each of the keys, asked in ascending order, is in `set`.
fn ascending_contains<T: Ord>(set: &BTreeSet<T>, keys: usize) -> impl FnMut(&T) -> bool {
    let bulk = keys.saturating_mul(BULK_RATIO) >= set.len();
    let mut walk = None;
    move |key| {
        if !bulk {
            return set.contains(key);
        }
        let walk = walk.get_or_insert_with(|| set.range(key..).peekable());
        while walk.next_if(|k| *k < key).is_some() {}
        walk.next_if(|k| *k == key).is_some()
    }
}

/// The virtual server of a real-server op (`None` for other ops).
fn real_server_op(op: &Op) -> Option<&VirtualServerKey> {
    match op {
        Op::AddRealServer { vs, .. }
        | Op::UpdateRealServer { vs, .. }
        | Op::DeleteRealServer { vs, .. } => Some(vs),
        _ => None,
    }
}

/// Apply the real-server op `op` (one [`real_server_op`] names a virtual server for) to its
/// virtual server `vs`, with the kernel's errors ([`ObservedState::apply`]).
fn apply_to_real_servers(vs: &mut ObservedVirtualServer, op: &Op) -> Result<(), ipvs::Error> {
    match op {
        Op::DeleteRealServer { rs, .. } => {
            vs.real_servers.remove(rs).ok_or(ipvs::Error::NotFound)?;
        }
        Op::AddRealServer { rs, weight, .. } => {
            let Entry::Vacant(entry) = vs.real_servers.entry(*rs) else {
                return Err(ipvs::Error::Exists);
            };
            entry.insert(ObservedRealServer {
                weight: *weight,
                active_connections: 0,
                inactive_connections: 0,
            });
        }
        Op::UpdateRealServer { rs, weight, .. } => {
            vs.real_servers
                .get_mut(rs)
                .ok_or(ipvs::Error::NotFound)?
                .weight = *weight;
        }
        _ => unreachable!("{op} is not a real-server op: callers check with real_server_op"),
    }
    Ok(())
}

/// An operation the dataplane could not apply, and why.
#[derive(Debug)]
pub struct OpFailure {
    /// The failed operation.
    pub op: Op,
    /// The error the kernel (or fake) returned.
    pub error: DataplaneError,
}

/// Errors of a dataplane.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// An IPVS generic-netlink request failed.
    #[error("ipvs: {0}")]
    Ipvs(#[from] ipvs::Error),
    /// An rtnetlink request (the `kube-ipvs0` link or its addresses) failed.
    #[error("rtnetlink: {0}")]
    Rtnetlink(#[from] rtnetlink::Error),
    /// A sysctl or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (e.g. the sysctl path).
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The dummy interface vanished or could not be created.
    #[error("interface {0} not found")]
    NoInterface(String),
    /// An nftables transaction or listing failed.
    #[error("nftables: {0}")]
    Nft(#[from] nftables::runner::NftError),
    /// The nftables transaction this op was part of failed (the reason, once per op).
    #[error("nftables transaction: {0}")]
    NftTransaction(String),
    /// A conntrack request failed.
    #[error("{0}")]
    Conntrack(#[from] kernel::conntrack::ConntrackError),
    /// Not applied: kept back with the failed op it depends on ([`isolate::Withholding`]) and
    /// retried with it.
    #[error("withheld: {reason} ({key})")]
    Withheld {
        /// The virtual server concerned.
        key: VirtualServerKey,
        /// Why.
        reason: &'static str,
    },
}

/// Something that holds an IPVS table and the addresses of `kube-ipvs0`.
///
/// Implementations: [`kernel::KernelDataplane`] (ipvs-rs, rtnetlink, `/proc/sys`) and
/// [`fake::FakeDataplane`] (in memory, kernel-like errors).
pub trait Dataplane {
    /// Read the current state: every inet virtual server with its real servers and their
    /// connection counts, the addresses on `kube-ipvs0`, kipvs's set elements and rules
    /// ([`Dataplane::observer`], awaited).
    fn observe(&mut self) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send {
        self.observer()
    }

    /// The read of [`Dataplane::observe`] as a task of its own: the future holds its own
    /// sockets (and `nft` process) and borrows nothing, so it runs beside this dataplane's
    /// writes (a full sync reads the kernel while incremental syncs go on,
    /// `engine::syncer::Syncer::begin_full`). What it returns is each part of the state as it
    /// was at some moment between the future's start and its end; an entry written meanwhile
    /// may read either way, and the caller reconciles those with what it wrote.
    fn observer(
        &mut self,
    ) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send + 'static;

    /// Read only the virtual servers `keys` (those that exist) with their real servers and
    /// connection counts: the cheap refresh of draining real servers.
    fn observe_virtual_servers(
        &mut self,
        keys: &[VirtualServerKey],
    ) -> impl Future<
        Output = Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, DataplaneError>,
    > + Send;

    /// The addresses bound on `kube-ipvs0` (what [`Dataplane::observe`] reports as
    /// `bound_addresses`): the re-read of addresses a failed bind or unbind left in doubt.
    fn observe_addresses(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<IpAddr>, DataplaneError>> + Send;

    /// The elements of kipvs's nftables sets (what [`Dataplane::observe`] reports as
    /// `set_elements`): the re-read of elements a failed transaction left in doubt.
    fn observe_set_elements(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<SetElement>, DataplaneError>> + Send;

    /// The node's addresses on every interface but `kube-ipvs0` (the local one of a
    /// point-to-point link): NodePorts are served on them (`plan::node_addresses`), and
    /// externalIPs and load-balancer IPs among them are not bound on `kube-ipvs0` (kube-proxy's
    /// rule; kubernetes#88212). As the dataplane knows them now (the kernel's: followed through
    /// rtnetlink notifications, [`kernel::interfaces`], so that this reads no address), marked
    /// seen for [`Dataplane::interfaces_changed`].
    ///
    /// # Errors
    /// The addresses cannot be read.
    fn other_interface_addresses(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<IpAddr>, DataplaneError>> + Send;

    /// Resolves once the node's interfaces changed since the last
    /// [`Dataplane::other_interface_addresses`] (at once if they did already): an address came
    /// or went, or `kube-ipvs0` was deleted or made again. The future borrows nothing, so that
    /// the engine waits on it beside its other work.
    fn interfaces_changed(&mut self) -> impl Future<Output = ()> + Send + 'static;

    /// Whether `kube-ipvs0` was deleted or made again (a new index) since the last call: it is
    /// made again if missing, later ops use it, and every address it held is gone, so what the
    /// caller knows of the bound addresses is stale (a full sync binds them again).
    ///
    /// # Errors
    /// `kube-ipvs0` cannot be found or made.
    fn kube_ipvs0_recreated(&mut self)
    -> impl Future<Output = Result<bool, DataplaneError>> + Send;

    /// Whether the IPVS scheduler `scheduler` is available (its kernel module is there).
    ///
    /// # Errors
    /// Why it cannot be used.
    fn check_scheduler(
        &mut self,
        scheduler: &str,
    ) -> impl Future<Output = Result<(), kernel::settings::SchedulerError>> + Send;

    /// Apply `ops` in order, each run of consecutive ops of one stage ([`Op::stage`]) together,
    /// continuing past failures, and return the failures. Ops of one run may run concurrently.
    fn apply(&mut self, ops: &[Op]) -> impl Future<Output = Vec<OpFailure>> + Send;

    /// Deletes kipvs's nftables table `inet kipvs` (a handback to kube-proxy, whose iptables
    /// rules then filter and masquerade alone); a table that does not exist is not an error.
    fn remove_rules(&mut self) -> impl Future<Output = Result<(), DataplaneError>> + Send;

    /// The UDP conntrack entries of the network namespace in `listing`, both IP families (see
    /// [`crate::dataplane::kernel::conntrack`]).
    fn udp_conntrack(
        &mut self,
        listing: Listing<'_>,
    ) -> impl Future<Output = Result<Vec<UdpEntry>, DataplaneError>> + Send;

    /// Delete these conntrack entries, each by its original tuple (never a flush); an entry
    /// already gone is not a failure. Returns the entries that could not be deleted.
    fn delete_conntrack(
        &mut self,
        entries: &[UdpEntry],
    ) -> impl Future<Output = Vec<(UdpEntry, DataplaneError)>> + Send;
}

#[cfg(test)]
mod tests;

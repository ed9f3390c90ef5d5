//! The pure diff: the [`Op`]s that turn an observed kernel state into the desired one, in the
//! safe order the module docs of [`crate::dataplane`] give, and which virtual servers kipvs owns
//! and so may delete ([`Ownership`]).

use super::{Op, ascending_contains, ascending_get, nftables};
use crate::model::{
    DesiredState, ObservedRealServer, ObservedState, ObservedVirtualServer, Protocol, Scope,
    SetElement, VirtualServer, VirtualServerKey, full_scope,
};
use ipnet::IpNet;
use kipvs_crds::config::{ConfigError, ProxierConfiguration};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;

/// Which virtual servers kipvs may delete: it never touches what it does not own.
///
/// A virtual server is owned when its address is bound on `kube-ipvs0`, or is about to be
/// (ClusterIPs, externalIPs, VIP-mode load-balancer IPs: only kipvs binds there; counting the
/// addresses about to be bound keeps ownership stable across the sync that binds them), when it
/// is a NodePort virtual server (one of the node's addresses, `node_ips`: every local address
/// unless `--node-ip` is given, and a port in the node-port range), or when kipvs's
/// own nftables table names it (a `cluster-ips`, `external` or `external-local` element: kipvs
/// adds one for every virtual server it creates, before creating it, and deletes it after the
/// virtual server, so the record outlives a restart; it is what covers an externalIP or
/// load-balancer IP that sits on another interface and is therefore not bound on
/// `kube-ipvs0`), and it is not inside `ipvs.excludeCIDRs` (kube-proxy's `cleanLegacyService`
/// rule). Owned virtual servers that are not desired are deleted; others are left alone even
/// if they collide with nothing.
///
/// A NodePort virtual server on a local address that kipvs serves no NodePort on
/// (`local_addresses` outside `node_port_ips`: loopback, IPv6 link-local, or what a
/// `nodePortAddresses` narrower than kube-proxy's leaves out) may be kube-proxy's, whose
/// default is every local address. kipvs owns it, and drains it rather than deleting it
/// outright ([`Ownership::drains`]):
/// its TCP real servers with connections go to weight 0 and stay until those end (or
/// `ipvs.drainTimeout`), the virtual server goes with its last real server. It does so only
/// when its port and protocol are in `kube_proxy_node_ports`, which the engine fills only
/// during a takeover on a node where kube-proxy's state was found (kube-proxy ran, or its
/// iptables rules or ipsets are there), with the NodePorts kipvs programs (and those already
/// draining); on a node that never ran kube-proxy, or with `--kube-proxy-takeover=false`, the
/// set is empty. A virtual server on a local address outside the node-port range
/// (keepalived's, `ipvsadm`'s, another load balancer's) is never touched; so is one inside it
/// on an address outside `node_ips` (with `--node-ip`).
#[derive(Clone, Debug, Default)]
pub struct Ownership {
    /// The node's addresses NodePort virtual servers may be programmed on, before
    /// `nodePortAddresses` selects among them (`plan::node_addresses`): one of them with a
    /// port in the NodePort range is kipvs's, so that a NodePort is deleted from an address
    /// `nodePortAddresses` no longer selects.
    pub node_ips: BTreeSet<IpAddr>,
    /// The addresses NodePort virtual servers are programmed on (`nodePortAddresses` applied
    /// to `node_ips`).
    pub node_port_ips: BTreeSet<IpAddr>,
    /// The NodePort range (kube-apiserver `--service-node-port-range`), from the configuration's
    /// `nodePortRange` only.
    pub node_port_range: Option<RangeInclusive<u16>>,
    /// `ipvs.excludeCIDRs`: virtual servers inside these are never deleted.
    pub exclude_cidrs: Vec<IpNet>,
    /// The node's addresses on every interface but `kube-ipvs0`: virtual servers on those kipvs
    /// does not serve NodePorts on (loopback, or outside a narrower `nodePortAddresses`), with a
    /// port and protocol in `kube_proxy_node_ports`, are kube-proxy's, owned and drained.
    pub local_addresses: BTreeSet<IpAddr>,
    /// The NodePorts (port, protocol) kube-proxy's virtual servers on `local_addresses` are
    /// drained for; empty (nothing drains) unless a takeover found kube-proxy's state.
    pub kube_proxy_node_ports: BTreeSet<(u16, Protocol)>,
}

impl Ownership {
    /// The ownership on a node with `node_ips`, `node_port_ips` and `local_addresses` under
    /// `config` (its `nodePortRange` and `ipvs.excludeCIDRs`), draining kube-proxy's
    /// `kube_proxy_node_ports`.
    ///
    /// # Errors
    /// `nodePortRange` or `ipvs.excludeCIDRs` do not parse.
    pub fn new(
        config: &ProxierConfiguration,
        node_ips: BTreeSet<IpAddr>,
        node_port_ips: BTreeSet<IpAddr>,
        local_addresses: BTreeSet<IpAddr>,
        kube_proxy_node_ports: BTreeSet<(u16, Protocol)>,
    ) -> Result<Self, ConfigError> {
        Ok(Ownership {
            node_ips,
            node_port_ips,
            node_port_range: Some(config.parsed_node_port_range()?),
            exclude_cidrs: config.ipvs.parsed_exclude_cidrs()?,
            local_addresses,
            kube_proxy_node_ports,
        })
    }

    /// Whether kipvs owns the observed virtual server `key`.
    pub fn owns(
        &self,
        key: &VirtualServerKey,
        desired: &DesiredState,
        observed: &ObservedState,
    ) -> bool {
        if self.exclude_cidrs.iter().any(|c| c.contains(&key.address)) {
            return false;
        }
        let node_port = self.node_ips.contains(&key.address)
            && self
                .node_port_range
                .as_ref()
                .is_some_and(|r| r.contains(&key.port));
        node_port
            || self.drains(key)
            || observed.bound_addresses.contains(&key.address)
            || desired.bind_addresses.contains(&key.address)
            || [
                SetElement::ClusterIp,
                SetElement::External,
                SetElement::ExternalLocal,
            ]
            .into_iter()
            .any(|element| observed.set_elements.contains(&element(*key)))
    }

    /// Whether `key` is kube-proxy's NodePort virtual server on a local address kipvs serves
    /// no NodePort on (its port and protocol in `kube_proxy_node_ports`; see the type's docs),
    /// outside `ipvs.excludeCIDRs`: when not desired it is drained, not deleted outright.
    pub fn drains(&self, key: &VirtualServerKey) -> bool {
        self.kube_proxy_node_ports
            .contains(&(key.port, key.protocol))
            && !self.node_port_ips.contains(&key.address)
            && self.local_addresses.contains(&key.address)
            && self
                .node_port_range
                .as_ref()
                .is_some_and(|r| r.contains(&key.port))
            && !self.exclude_cidrs.iter().any(|c| c.contains(&key.address))
    }
}

/// The operations that turn `observed` into `desired`, in the safe order (see module docs).
///
/// - Virtual servers: desired but absent → add; present with a different spec → update;
///   present, owned ([`Ownership::owns`]) and not desired → delete (with their real servers).
/// - Real servers of a kept virtual server: absent → add with the desired weight; present with
///   another weight → update (so a restart never leaves a wanted backend at weight 0,
///   kubernetes#92019); present and not desired → drained: a TCP real server with active or
///   inactive connections goes to weight 0 and stays until they end, anything else is deleted
///   (UDP and SCTP at once, as kube-proxy's `graceful_termination.go`).
/// - Addresses on `kube-ipvs0`: every bound address that is not desired is unbound (kipvs owns
///   that interface); every desired address not bound is bound.
///
/// Applying the result to `observed` yields `desired` up to draining real servers, and the
/// diff of a converged state is empty. Cost: O(size of both states); see [`diff_scoped`].
pub fn diff(desired: &DesiredState, observed: &ObservedState, ownership: &Ownership) -> Vec<Op> {
    let scope = full_scope(desired, observed);
    diff_scoped(desired, observed, ownership, &scope, &BTreeSet::new())
}

/// [`diff`] restricted to `scope` (what an incremental sync touched), in O(size of those
/// entries · log n); a scope of at least `1 / BULK_RATIO` of a state's entries walks that
/// state alongside it instead, O(n) (a full diff). Real servers listed in `expired_drains` are
/// deleted even though they still have connections (their maximum drain time passed). The
/// nftables rules are compared (by their comments) whatever the scope; kipvs owns its whole
/// table, so every observed set element in scope that is not desired is deleted.
pub fn diff_scoped(
    desired: &DesiredState,
    observed: &ObservedState,
    ownership: &Ownership,
    scope: &Scope,
    expired_drains: &BTreeSet<(VirtualServerKey, SocketAddr)>,
) -> Vec<Op> {
    let rules_change =
        nftables::rules::rule_comments(&desired.nft_rules) != observed.nft_rule_comments.as_slice();
    // New hairpin elements go ahead of the real servers, in a transaction of their own, unless
    // the rules are (re)written: then the whole table is one transaction before the new
    // virtual servers anyway.
    let mut ops = Ordered::new(!rules_change);
    if rules_change {
        ops.push(Op::WriteRules(desired.nft_rules.clone()), false);
    }
    let elements_change = diff_set_elements(desired, observed, scope, &mut ops);
    diff_addresses(desired, observed, scope, &mut ops);
    let n = scope.virtual_servers.len();
    let (mut wanted, mut present) = (
        ascending_get(&desired.virtual_servers, n),
        ascending_get(&observed.virtual_servers, n),
    );
    for key in &scope.virtual_servers {
        let ovs = present(key);
        let Some(dvs) = wanted(key) else {
            match ovs {
                Some(ovs) if ownership.drains(key) => {
                    drain_virtual_server(*key, ovs, expired_drains, &mut ops)
                }
                Some(_) if ownership.owns(key, desired, observed) => {
                    ops.push(Op::DeleteVirtualServer(*key), false)
                }
                _ => {}
            }
            continue;
        };
        let waits = ovs.is_none() || elements_change.binary_search(key).is_ok();
        match ovs {
            None => ops.push(Op::AddVirtualServer(*key, dvs.spec.clone()), waits),
            Some(o) if o.spec != dvs.spec => {
                ops.push(Op::UpdateVirtualServer(*key, dvs.spec.clone()), waits)
            }
            Some(_) => {}
        }
        diff_real_servers(*key, dvs, ovs, waits, expired_drains, &mut ops);
    }
    ops.into_vec()
}

/// Ops in the order of [`diff`]: each goes straight to its place ([`position`]); the ops of
/// one place keep the order they are pushed in, and the places are joined at the end (no sort
/// of the whole list: at 50k Services it would dominate a full diff).
struct Ordered {
    places: [Vec<Op>; PLACES],
    /// New hairpin elements go in a transaction of their own ahead of the real servers.
    early_hairpin: bool,
}

impl Ordered {
    fn new(early_hairpin: bool) -> Self {
        Ordered {
            places: Default::default(),
            early_hairpin,
        }
    }

    /// Places `op`; `waits`: a real-server op waits for the main nftables transaction.
    fn push(&mut self, op: Op, waits: bool) {
        self.places[position(&op, waits, self.early_hairpin)].push(op);
    }

    fn into_vec(self) -> Vec<Op> {
        let mut ops = Vec::with_capacity(self.places.iter().map(Vec::len).sum());
        for place in self.places {
            ops.extend(place);
        }
        ops
    }
}

/// The set-element ops of `scope`; returns the virtual servers whose own elements (masquerade,
/// firewall) change, sorted: their real-server ops wait for the main nftables transaction,
/// which is why this runs first.
fn diff_set_elements(
    desired: &DesiredState,
    observed: &ObservedState,
    scope: &Scope,
    ops: &mut Ordered,
) -> Vec<VirtualServerKey> {
    let mut elements_change: Vec<VirtualServerKey> = Vec::new();
    let n = scope.set_elements.len();
    let mut wanted = ascending_contains(&desired.set_elements, n);
    let mut present = ascending_contains(&observed.set_elements, n);
    for element in &scope.set_elements {
        let op = match (wanted(element), present(element)) {
            (true, false) => Op::AddSetElement(*element),
            (false, true) => Op::DeleteSetElement(*element),
            _ => continue,
        };
        elements_change.extend(element.virtual_server());
        ops.push(op, false);
    }
    elements_change.sort_unstable();
    elements_change.dedup();
    elements_change
}

/// The bind and unbind ops of the `kube-ipvs0` addresses in `scope`.
fn diff_addresses(
    desired: &DesiredState,
    observed: &ObservedState,
    scope: &Scope,
    ops: &mut Ordered,
) {
    for address in &scope.addresses {
        let wanted = desired.bind_addresses.contains(address);
        match (wanted, observed.bound_addresses.contains(address)) {
            (true, false) => ops.push(Op::BindAddress(*address), false),
            (false, true) => ops.push(Op::UnbindAddress(*address), false),
            _ => {}
        }
    }
}

/// The real-server ops of the kept virtual server `vs` (`waits`: they wait for the main
/// nftables transaction). Desired real servers absent or at another weight are added or
/// updated; observed ones not desired drain: a TCP real server with connections goes to
/// weight 0 until they end or its drain expires (`expired_drains`), anything else is deleted.
fn diff_real_servers(
    vs: VirtualServerKey,
    dvs: &VirtualServer,
    ovs: Option<&ObservedVirtualServer>,
    waits: bool,
    expired_drains: &BTreeSet<(VirtualServerKey, SocketAddr)>,
    ops: &mut Ordered,
) {
    for (rs, &weight) in &dvs.real_servers {
        match ovs.and_then(|o| o.real_servers.get(&rs)) {
            None => ops.push(Op::AddRealServer { vs, rs, weight }, waits),
            Some(o) if o.weight != weight => {
                ops.push(Op::UpdateRealServer { vs, rs, weight }, waits)
            }
            Some(_) => {}
        }
    }
    for (&rs, ors) in ovs.iter().flat_map(|o| &o.real_servers) {
        if !dvs.real_servers.contains_key(&rs) {
            drain(vs, rs, ors, waits, expired_drains, ops);
        }
    }
}

/// The ops of the virtual server `vs` that is not desired and drains as a whole
/// ([`Ownership::drains`]): each real server drains ([`drain`]); the virtual server is deleted
/// once none is left draining.
fn drain_virtual_server(
    vs: VirtualServerKey,
    ovs: &ObservedVirtualServer,
    expired_drains: &BTreeSet<(VirtualServerKey, SocketAddr)>,
    ops: &mut Ordered,
) {
    let mut left = 0;
    for (&rs, ors) in &ovs.real_servers {
        left += usize::from(drain(vs, rs, ors, false, expired_drains, ops));
    }
    if left == 0 {
        ops.push(Op::DeleteVirtualServer(vs), false);
    }
}

/// The ops for the real server `rs` of `vs` that is no longer wanted (`waits`: they wait for
/// the main nftables transaction): a TCP one with active or inactive connections whose drain
/// has not expired (`expired_drains`) goes to weight 0 (if not there yet) and stays; anything
/// else is deleted. Returns whether it stays (drains).
fn drain(
    vs: VirtualServerKey,
    rs: SocketAddr,
    ors: &ObservedRealServer,
    waits: bool,
    expired_drains: &BTreeSet<(VirtualServerKey, SocketAddr)>,
    ops: &mut Ordered,
) -> bool {
    let connections = ors.active_connections + ors.inactive_connections;
    let drains =
        vs.protocol == Protocol::Tcp && connections > 0 && !expired_drains.contains(&(vs, rs));
    if !drains {
        ops.push(Op::DeleteRealServer { vs, rs }, waits);
    } else if ors.weight != 0 {
        ops.push(Op::UpdateRealServer { vs, rs, weight: 0 }, waits);
    }
    drains
}

/// How many places [`position`] has.
const PLACES: usize = 12;

/// Where `op` goes in the order of [`diff`] (see the module docs), `0..PLACES`, given whether
/// the real-server ops of its virtual server wait for the main nftables transaction
/// (`after_nft`) and whether new hairpin elements go in a transaction of their own ahead of the
/// real servers.
///
/// Real-server ops of an existing virtual server go before the main transaction so that a new
/// endpoint takes traffic at once: that transaction can hold what only `nft` applies (rules,
/// `firewall-allow` intervals), a process that takes seconds on a loaded or emulated CPU
/// (figures in docs/performance.md), and an endpoint change
/// waiting behind it leaves a Service with fewer real servers than it should have, or none when
/// the old one went in the same sync. What such an op may not outrun, it waits for:
/// - its endpoint's `hairpin` element (a connection from that endpoint to its own Service that
///   IPVS balances onto itself is masqueraded only with it): new hairpin elements go first, in
///   a transaction of their own that holds elements only, so one nfnetlink batch
///   ([`crate::dataplane::nftables::elements`]: about a millisecond, no process);
/// - the elements of its own virtual server (`cluster-ips`, `external`, `external-local`,
///   `firewall`, `firewall-allow`): while they change, e.g. `externalTrafficPolicy` Local →
///   Cluster adding remote endpoints that need the masquerade, its real servers wait for the
///   main transaction;
/// - a new virtual server waits for its elements (a NodePort takes traffic once added, and a
///   load-balancer IP with source ranges must not take any before its firewall element);
///   addresses are bound last, after both.
///
/// Removals keep the safe order: the real server goes (stage 1) before its hairpin element
/// (the main transaction). kube-proxy's IPVS mode is less strict: it adds real servers in its
/// loop over Services and the `ipset` entries (hairpin among them) after the loop.
pub(super) fn position(op: &Op, after_nft: bool, early_hairpin: bool) -> usize {
    match op {
        Op::UnbindAddress(_) => 0,
        Op::DeleteRealServer { .. } => 1,
        Op::DeleteVirtualServer(_) => 2,
        Op::AddSetElement(SetElement::Hairpin(_)) if early_hairpin => 3,
        Op::UpdateVirtualServer(..) => 4,
        Op::AddRealServer { .. } | Op::UpdateRealServer { .. } if !after_nft => 5,
        Op::WriteRules(_) => 6,
        Op::DeleteSetElement(_) => 7,
        Op::AddSetElement(_) => 8,
        Op::AddVirtualServer(..) => 9,
        Op::AddRealServer { .. } | Op::UpdateRealServer { .. } => 10,
        Op::BindAddress(_) => PLACES - 1, // the last place: PLACES counts them
    }
}

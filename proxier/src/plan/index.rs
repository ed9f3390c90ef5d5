//! The desired state as the union of per-Service plans, maintained incrementally.
//!
//! [`DesiredIndex::update`] replaces one Service's plan and reports exactly which virtual
//! servers, bind addresses and health-check node ports may have changed, in time proportional
//! to that Service's size (plus `log n` map operations), never to the number of Services.
//! This is what makes a sync's cost follow the change, not the cluster's size.
//!
//! Conflicts are resolved by [`Rank`]: when several Services claim one virtual server or
//! health-check node port, a claim through `spec.externalIPs` yields to one through a ClusterIP
//! or load-balancer ingress (an externalIP cannot take another Service's address, the
//! CVE-2020-8554 class), then the older Service keeps it (`creationTimestamp`), then the first in
//! namespace/name order.
//! The decision is taken once per virtual server and covers everything derived from it: the
//! set elements naming that virtual server (masquerade, firewall, allowed source ranges) are
//! the winner's only, so a losing Service's traffic policy or source ranges never reach the
//! kernel. Elements not tied to a virtual server (service IPs, hairpin endpoints,
//! health-check ports) are reference-counted across Services.
//!
//! Memory: a virtual server is held once. The winner's entry is moved into the desired state
//! and moved back into its Service's plan when another Service takes the virtual server over;
//! only losing claims keep their own, and not even those when the entry equals one the same
//! Service wins (a NodePort virtual server losing its port to another Service usually has the
//! real servers of its ClusterIP one). Service plans are kept as exact-size vectors, and a
//! claim names its Service through one shared key.

use super::outcome::{NoLocalEndpoints, Plan, Problem};
use super::service::ServicePlan;
use crate::model::{
    DesiredState, HealthCheckNodePort, NftRules, Scope, SetElement, VirtualServer, VirtualServerKey,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// A Service's identity: `(namespace, name)`.
pub type ServiceKey = (String, String);

/// What one [`DesiredIndex::update`] may have changed in the desired state: virtual servers
/// whose desired entry may differ, bind addresses and nftables set elements that may have
/// appeared or disappeared. It is the scope of the incremental diff.
pub type Touched = Scope;

/// The set elements named by a virtual server alone, kept as bits of [`Own::derived`] (bit
/// `i` for `DERIVED[i]`) instead of a 38-byte element each.
const DERIVED: [fn(VirtualServerKey) -> SetElement; 5] = [
    SetElement::ClusterIp,
    SetElement::External,
    SetElement::ExternalLocal,
    SetElement::ExternalNoLocal,
    SetElement::Firewall,
];

/// The bits of [`DERIVED`] whose element for `vs` is in `elements`.
fn derived_bits(elements: &BTreeSet<SetElement>, vs: VirtualServerKey) -> u8 {
    (0..DERIVED.len())
        .filter(|&i| elements.contains(&DERIVED[i](vs)))
        .fold(0, |bits, i| bits | 1 << i)
}

/// One of a Service's virtual servers, as its stored plan keeps it.
#[derive(Clone, Debug)]
struct Own {
    vs: VirtualServerKey,
    /// Where its entry is.
    slot: Slot,
    /// Its elements of [`DERIVED`] (not in [`Stored::set_elements`]).
    derived: u8,
    /// Only `spec.externalIPs` asks for it ([`ServicePlan::external_ip_virtual_servers`]).
    external_ip: bool,
}

/// How strongly a Service claims a virtual server or health-check node port: the lowest wins,
/// and among equal ranks the first Service in namespace/name order. A claim through
/// `spec.externalIPs` comes after any other; then the older Service (`creationTimestamp`, unset
/// counting as the newest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    external_ip: bool,
    created: i64,
}

/// Where a Service's plan keeps the entry of one of its virtual servers.
#[derive(Clone, Debug)]
enum Slot {
    /// The Service wins the virtual server: the desired state holds the entry.
    Won,
    /// The Service lost it, with an entry equal to that of its virtual server at this position
    /// in [`Stored::virtual_servers`], which it won when it was planned (that one's slot is
    /// [`Slot::Won`] or [`Slot::Lost`], never `SameAs`).
    SameAs(u32),
    /// The Service lost it: its own entry.
    Lost(Box<VirtualServer>),
}

/// A Service plan as the index keeps it: exact-size sorted vectors instead of the maps of a
/// [`ServicePlan`] (a small `BTreeMap` allocates a whole node), and no copy of the virtual
/// servers this Service wins (those live in the desired state).
#[derive(Clone, Debug)]
struct Stored {
    /// `creationTimestamp` in seconds (`i64::MAX` when unset).
    created: i64,
    /// Its virtual servers, sorted.
    virtual_servers: Vec<Own>,
    bind_addresses: Box<[IpAddr]>,
    /// Whether its set elements hold `ServiceIp` of each bind address (then they are not in
    /// `set_elements`).
    service_ips: bool,
    health_check_node_port: Option<Box<(u16, HealthCheckNodePort)>>,
    /// Its set elements but those of [`Own::derived`] and [`Stored::service_ips`].
    set_elements: Box<[SetElement]>,
    no_local_endpoints_internal: bool,
    no_local_endpoints_external: bool,
    terminating_fallback: bool,
    problems: Box<[Problem]>,
}

impl Stored {
    /// Stored form of `new` (every slot [`Slot::Won`] for now): exact-size vectors, and the
    /// set elements that its virtual servers or bind addresses name as bits.
    fn new(new: &ServicePlan) -> Self {
        let elements = &new.set_elements;
        let service_ip = |ip: &IpAddr| SetElement::ServiceIp(*ip);
        let service_ips = new
            .bind_addresses
            .iter()
            .all(|ip| elements.contains(&service_ip(ip)));
        let implied = |e: &SetElement| match e {
            SetElement::ServiceIp(ip) => service_ips && new.bind_addresses.contains(ip),
            _ => e.virtual_server().is_some_and(|vs| {
                new.virtual_servers.contains_key(&vs) && DERIVED.iter().any(|f| f(vs) == *e)
            }),
        };
        Stored {
            created: new.created.unwrap_or(i64::MAX),
            virtual_servers: new
                .virtual_servers
                .keys()
                .map(|&vs| Own {
                    vs,
                    slot: Slot::Won,
                    derived: derived_bits(elements, vs),
                    external_ip: new.external_ip_virtual_servers.contains(&vs),
                })
                .collect(),
            bind_addresses: new.bind_addresses.iter().copied().collect(),
            service_ips,
            health_check_node_port: new.health_check_node_port.clone().map(Box::new),
            set_elements: elements.iter().filter(|e| !implied(e)).copied().collect(),
            no_local_endpoints_internal: new.no_local_endpoints_internal,
            no_local_endpoints_external: new.no_local_endpoints_external,
            terminating_fallback: new.terminating_fallback,
            problems: new.problems.clone().into_boxed_slice(),
        }
    }

    /// How it claims its virtual server at `at`.
    fn rank(&self, at: usize) -> Rank {
        Rank {
            external_ip: self.virtual_servers[at].external_ip,
            created: self.created,
        }
    }

    /// How it claims its health-check node port.
    fn health_check_rank(&self) -> Rank {
        Rank {
            external_ip: false,
            created: self.created,
        }
    }

    /// The position of its virtual server `vs`.
    fn position(&self, vs: &VirtualServerKey) -> usize {
        self.virtual_servers
            .binary_search_by_key(vs, |own| own.vs)
            .expect("claimed")
    }

    /// The set elements derived from its virtual server at `at`.
    fn vs_elements(&self, at: usize) -> impl Iterator<Item = SetElement> + '_ {
        let Own { vs, derived, .. } = self.virtual_servers[at];
        let bits = (0..DERIVED.len()).filter(move |i| derived & 1 << i != 0);
        bits.map(move |i| DERIVED[i](vs)).chain(
            self.set_elements
                .iter()
                .filter(move |e| e.virtual_server() == Some(vs))
                .copied(),
        )
    }

    /// Record its virtual server at `at` as lost, with `entry`: kept as a reference to an equal
    /// entry it wins at an earlier position, if any (`desired` holds the entries it wins).
    fn lose(
        &mut self,
        at: usize,
        entry: VirtualServer,
        desired: &BTreeMap<VirtualServerKey, VirtualServer>,
    ) {
        let same = self.virtual_servers[..at]
            .iter()
            .position(|own| matches!(own.slot, Slot::Won) && desired[&own.vs] == entry);
        self.virtual_servers[at].slot = match same {
            Some(other) => Slot::SameAs(other as u32),
            None => Slot::Lost(Box::new(entry)),
        };
    }

    /// Take the entry of its lost virtual server `vs` (now won: the slot becomes
    /// [`Slot::Won`]); `desired` holds the entries of the virtual servers it wins.
    fn take_entry(&mut self, vs: &VirtualServerKey, desired: &DesiredState) -> VirtualServer {
        let at = self.position(vs);
        match std::mem::replace(&mut self.virtual_servers[at].slot, Slot::Won) {
            Slot::Lost(entry) => *entry,
            Slot::SameAs(other) => {
                let Own { vs, slot, .. } = &self.virtual_servers[other as usize];
                match slot {
                    Slot::Won => desired.virtual_servers[vs].clone(),
                    Slot::Lost(entry) => (**entry).clone(),
                    Slot::SameAs(_) => unreachable!("a SameAs slot names a won one"),
                }
            }
            Slot::Won => unreachable!("a losing claim keeps its entry"),
        }
    }

    /// Whether `vs` is one of its virtual servers.
    fn has(&self, vs: &VirtualServerKey) -> bool {
        self.virtual_servers
            .binary_search_by_key(vs, |own| own.vs)
            .is_ok()
    }

    /// Its set elements not derived from one of its virtual servers (reference-counted across
    /// Services).
    fn shared_elements(&self) -> impl Iterator<Item = SetElement> + '_ {
        let service_ips = self.bind_addresses.iter().filter(|_| self.service_ips);
        self.set_elements
            .iter()
            .filter(|e| e.virtual_server().is_none_or(|vs| !self.has(&vs)))
            .copied()
            .chain(service_ips.map(|ip| SetElement::ServiceIp(*ip)))
    }
}

/// Rebuild `map` with full nodes: `append` of two non-empty maps bulk-loads their merged
/// entries into new nodes filled to capacity (the standard library's own `append`), freeing
/// the old ones as it goes. Inserts in no particular order leave B-tree nodes between half
/// and two thirds full.
fn compact_map<K: Ord + Clone, V>(map: &mut BTreeMap<K, V>) {
    if let Some(second) = map.keys().nth(1).cloned() {
        let mut rest = map.split_off(&second);
        map.append(&mut rest);
    }
}

/// The distinct values of `values` with the number of times each occurs, sorted.
fn counted<T: Ord + Copy>(mut values: Vec<T>) -> Vec<(T, usize)> {
    values.sort_unstable();
    let mut runs: Vec<(T, usize)> = Vec::new();
    for value in values {
        match runs.last_mut() {
            Some((last, count)) if *last == value => *count += 1,
            _ => runs.push((value, 1)),
        }
    }
    runs
}

/// The Services claiming one virtual server or health-check node port, in [`Rank`] then key
/// order (the first wins). Almost always one: a sorted `Vec` costs one small allocation where
/// a `BTreeSet` allocates a whole node, and each names its Service by the key its plan is
/// stored under (shared, not copied).
#[derive(Clone, Debug, Default)]
struct Claims(Vec<(Rank, Arc<ServiceKey>)>);

impl Claims {
    fn first(&self) -> Option<&ServiceKey> {
        self.0.first().map(|(_, key)| &**key)
    }

    fn insert(&mut self, rank: Rank, key: &Arc<ServiceKey>) {
        let claim = (rank, key.clone());
        if let Err(at) = self.0.binary_search(&claim) {
            self.0.insert(at, claim);
        }
    }

    fn remove(&mut self, key: &ServiceKey) {
        self.0.retain(|(_, k)| **k != *key);
    }
}

/// Per-Service plans and their union (see module docs).
#[derive(Clone, Debug, Default)]
pub struct DesiredIndex {
    plans: BTreeMap<Arc<ServiceKey>, Stored>,
    vs_claims: BTreeMap<VirtualServerKey, Claims>,
    address_claims: BTreeMap<IpAddr, usize>,
    element_claims: BTreeMap<SetElement, usize>,
    health_check_claims: BTreeMap<u16, Claims>,
    desired: DesiredState,
    no_local_endpoints: NoLocalEndpoints,
    terminating_fallback_services: usize,
    /// Real servers of `desired`'s virtual servers, kept with every change to them.
    real_servers: usize,
}

impl DesiredIndex {
    /// The union of all plans.
    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }

    /// Set the parameters of the nftables rules (part of the desired state, not of any
    /// Service).
    pub fn set_nft_rules(&mut self, rules: NftRules) {
        self.desired.nft_rules = rules;
    }

    /// Number of Services with a plan.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether no Service has a plan.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// Replace (`Some`) or remove (`None`) the plan of Service `key`.
    pub fn update(&mut self, key: ServiceKey, plan: Option<ServicePlan>) -> Touched {
        let mut touched = Touched::default();
        // What this update can change: the virtual servers and health-check node ports of the
        // old and the new plan. Their real servers are counted before and after, so the total
        // is kept in time proportional to the Service.
        let old = self.plans.get(&key);
        touched.virtual_servers = old
            .into_iter()
            .flat_map(|p| p.virtual_servers.iter().map(|own| own.vs))
            .chain(plan.iter().flat_map(|p| p.virtual_servers.keys().copied()))
            .collect();
        touched.health_check_node_ports = old
            .and_then(|p| p.health_check_node_port.as_deref())
            .into_iter()
            .chain(
                plan.as_ref()
                    .and_then(|p| p.health_check_node_port.as_ref()),
            )
            .map(|(port, _)| *port)
            .collect();
        let before = self.real_servers_of(&touched.virtual_servers);
        // The shared key of the plan it replaces, else a new one.
        let key = match self.plans.remove_entry(&key) {
            Some((shared, old)) => {
                self.retract(&key, &old, &mut touched);
                shared
            }
            None => Arc::new(key),
        };
        if let Some(new) = plan {
            let stored = self.assert_plan(&key, new, &mut touched);
            self.plans.insert(key, stored);
        }
        self.real_servers =
            self.real_servers - before + self.real_servers_of(&touched.virtual_servers);
        touched
    }

    /// Real servers of the desired virtual servers `keys`.
    fn real_servers_of(&self, keys: &BTreeSet<VirtualServerKey>) -> usize {
        keys.iter()
            .filter_map(|k| self.desired.virtual_servers.get(k))
            .map(|vs| vs.real_servers.len())
            .sum()
    }

    /// Withdraws every claim of the Service `key`, whose plan was `old`.
    fn retract(&mut self, key: &ServiceKey, old: &Stored, touched: &mut Touched) {
        for (at, Own { vs, .. }) in old.virtual_servers.iter().enumerate() {
            touched.virtual_servers.insert(*vs);
            self.retract_virtual_server(key, old, at, vs, touched);
        }
        for address in &old.bind_addresses {
            let count = self.address_claims.get_mut(address).expect("claimed");
            *count -= 1;
            if *count == 0 {
                self.address_claims.remove(address);
                self.desired.bind_addresses.remove(address);
                touched.addresses.insert(*address);
            }
        }
        for element in old.shared_elements() {
            let count = self.element_claims.get_mut(&element).expect("claimed");
            *count -= 1;
            if *count == 0 {
                self.element_claims.remove(&element);
                self.desired.set_elements.remove(&element);
                touched.set_elements.insert(element);
            }
        }
        if let Some((port, _)) = old.health_check_node_port.as_deref() {
            self.retract_health_check(key, *port);
        }
        self.count(old, false);
    }

    /// Withdraws `key`'s claim on `vs`, the `at`th virtual server of its plan `old`: the next
    /// claimant's entry and elements take its place if it held it, or the virtual server goes.
    fn retract_virtual_server(
        &mut self,
        key: &ServiceKey,
        old: &Stored,
        at: usize,
        vs: &VirtualServerKey,
        touched: &mut Touched,
    ) {
        let claims = self.vs_claims.get_mut(vs).expect("claimed");
        let was_winner = claims.first() == Some(key);
        claims.remove(key);
        let winner = claims.first().cloned();
        if winner.is_none() {
            self.vs_claims.remove(vs);
            self.desired.virtual_servers.remove(vs);
        }
        if !was_winner {
            return;
        }
        for element in old.vs_elements(at) {
            self.desired.set_elements.remove(&element);
            touched.set_elements.insert(element);
        }
        if let Some(winner) = winner {
            let plan = self.plans.get_mut(&winner).expect("planned");
            let entry = plan.take_entry(vs, &self.desired);
            self.desired.virtual_servers.insert(*vs, entry);
            for element in plan.vs_elements(plan.position(vs)) {
                self.desired.set_elements.insert(element);
                touched.set_elements.insert(element);
            }
        }
    }

    /// Withdraws `key`'s claim on the health-check node port `port`: the next claimant's
    /// health check takes its place, or the port goes.
    fn retract_health_check(&mut self, key: &ServiceKey, port: u16) {
        let claims = self.health_check_claims.get_mut(&port).expect("claimed");
        claims.remove(key);
        match claims.first() {
            None => {
                self.health_check_claims.remove(&port);
                self.desired.health_check_node_ports.remove(&port);
            }
            Some(winner) => {
                let entry = self.plans[winner].health_check_node_port.as_deref();
                let (_, health_check) = entry.cloned().expect("claimed");
                self.desired
                    .health_check_node_ports
                    .insert(port, health_check);
            }
        }
    }

    /// Puts in every claim of the Service `key`'s plan `new`; returns the plan as stored.
    fn assert_plan(
        &mut self,
        key: &Arc<ServiceKey>,
        new: ServicePlan,
        touched: &mut Touched,
    ) -> Stored {
        let mut stored = Stored::new(&new);
        for (at, (vs, entry)) in new.virtual_servers.into_iter().enumerate() {
            touched.virtual_servers.insert(vs);
            self.assert_virtual_server(key, &mut stored, at, vs, entry, touched);
        }
        for address in &stored.bind_addresses {
            let count = self.address_claims.entry(*address).or_default();
            *count += 1;
            if *count == 1 {
                self.desired.bind_addresses.insert(*address);
                touched.addresses.insert(*address);
            }
        }
        for element in stored.shared_elements() {
            let count = self.element_claims.entry(element).or_default();
            *count += 1;
            if *count == 1 {
                self.desired.set_elements.insert(element);
                touched.set_elements.insert(element);
            }
        }
        if let Some((port, health_check)) = stored.health_check_node_port.as_deref() {
            let claims = self.health_check_claims.entry(*port).or_default();
            claims.insert(stored.health_check_rank(), key);
            if claims.first() == Some(&**key) {
                self.desired
                    .health_check_node_ports
                    .insert(*port, health_check.clone());
            }
        }
        self.count(&stored, true);
        stored
    }

    /// Puts in `key`'s claim on `vs` with `entry`, the `at`th virtual server of its plan
    /// `stored`: it takes the entry and elements over from the previous winner if it outranks
    /// it, else its entry waits in `stored`.
    fn assert_virtual_server(
        &mut self,
        key: &Arc<ServiceKey>,
        stored: &mut Stored,
        at: usize,
        vs: VirtualServerKey,
        entry: VirtualServer,
        touched: &mut Touched,
    ) {
        let claims = self.vs_claims.entry(vs).or_default();
        let previous = claims.first().cloned();
        claims.insert(stored.rank(at), key);
        if claims.first() != Some(&**key) {
            stored.lose(at, entry, &self.desired.virtual_servers);
            return;
        }
        let replaced = self.desired.virtual_servers.insert(vs, entry);
        if let Some(previous) = previous {
            // The previous winner's entry goes back into its plan.
            let plan = self.plans.get_mut(&previous).expect("planned");
            let other = plan.position(&vs);
            let entry = replaced.expect("the winner's entry");
            plan.virtual_servers[other].slot = Slot::Lost(Box::new(entry));
            for element in plan.vs_elements(other) {
                self.desired.set_elements.remove(&element);
                touched.set_elements.insert(element);
            }
        }
        for element in stored.vs_elements(at) {
            self.desired.set_elements.insert(element);
            touched.set_elements.insert(element);
        }
    }

    fn count(&mut self, plan: &Stored, add: bool) {
        let step = |n: &mut usize, flag: bool| {
            if flag {
                if add { *n += 1 } else { *n -= 1 }
            }
        };
        step(
            &mut self.no_local_endpoints.internal,
            plan.no_local_endpoints_internal,
        );
        step(
            &mut self.no_local_endpoints.external,
            plan.no_local_endpoints_external,
        );
        step(
            &mut self.terminating_fallback_services,
            plan.terminating_fallback,
        );
    }

    /// Moves the entry of the virtual server `vs` from the Service `from`, which holds it, to
    /// the first of its claims, which outranks `from`, with the set elements derived from it.
    fn hand_over(&mut self, vs: &VirtualServerKey, from: &ServiceKey) {
        let entry = self.desired.virtual_servers.remove(vs).expect("won");
        self.real_servers -= entry.real_servers.len();
        let plan = self.plans.get_mut(from).expect("planned");
        let at = plan.position(vs);
        for element in plan.vs_elements(at) {
            self.desired.set_elements.remove(&element);
        }
        plan.virtual_servers[at].slot = Slot::Lost(Box::new(entry));
        let winner = self.vs_claims[vs].first().expect("claimed").clone();
        let plan = self.plans.get_mut(&winner).expect("planned");
        let entry = plan.take_entry(vs, &self.desired);
        self.real_servers += entry.real_servers.len();
        self.desired.virtual_servers.insert(*vs, entry);
        let elements: Vec<SetElement> = plan.vs_elements(plan.position(vs)).collect();
        self.desired.set_elements.extend(elements);
    }

    /// The problems of Service `key`: its own, then the virtual servers and health-check node
    /// ports it lost to another Service.
    pub fn problems_of(&self, key: &ServiceKey) -> Vec<Problem> {
        let Some(plan) = self.plans.get(key) else {
            return Vec::new();
        };
        let mut problems = plan.problems.to_vec();
        let conflict = |message: String| Problem {
            kind: "Service",
            namespace: key.0.clone(),
            name: key.1.clone(),
            message,
        };
        for Own { vs, slot, .. } in &plan.virtual_servers {
            // A won virtual server is a `Slot::Won` one.
            if !matches!(slot, Slot::Won) {
                let by = &self.desired.virtual_servers[vs].service;
                problems.push(conflict(format!(
                    "virtual server {vs} is already used by {by}; ignored here"
                )));
            }
        }
        if let Some((port, _)) = plan.health_check_node_port.as_deref() {
            let winner = self.health_check_claims[port].first().expect("claimed");
            if winner != key {
                problems.push(conflict(format!(
                    "healthCheckNodePort {port} is already used by {}/{}; ignored here",
                    winner.0, winner.1
                )));
            }
        }
        problems
    }

    /// Every Service's problems ([`problems_of`](Self::problems_of)), in namespace/name order.
    pub fn problems(&self) -> impl Iterator<Item = Problem> + '_ {
        self.plans.keys().flat_map(|key| self.problems_of(key))
    }

    /// The whole [`Plan`]: the desired state, every Service's problems in namespace/name
    /// order, and the counts. O(number of Services): for `plan` and reports, not the sync path.
    pub fn to_plan(&self) -> Plan {
        Plan {
            desired: self.desired.clone(),
            problems: self.problems().collect(),
            no_local_endpoints: self.no_local_endpoints,
            terminating_fallback_services: self.terminating_fallback_services,
        }
    }

    /// The counts behind the no-local-endpoints and terminating-fallback metrics.
    pub fn counts(&self) -> (NoLocalEndpoints, usize) {
        (self.no_local_endpoints, self.terminating_fallback_services)
    }

    /// The number of real servers in the desired state (kept by every update, not counted).
    pub fn real_servers(&self) -> usize {
        self.real_servers
    }
}

/// Builds a [`DesiredIndex`] from the plan of every Service at once, as a full re-plan does:
/// the same index as [`DesiredIndex::update`] of each plan in key order (a property test
/// checks it), but the claim maps and sets are built once from sorted entries, with full
/// B-tree nodes, instead of one insert per entry, and no [`Touched`] is collected (a full
/// plan syncs everything). Only the virtual server entries go into their map as they come:
/// the first claim of each wins, since plans come in key order.
#[derive(Debug, Default)]
pub struct IndexBuilder {
    /// The index so far: its desired virtual servers and counts.
    index: DesiredIndex,
    plans: Vec<(Arc<ServiceKey>, Stored)>,
    /// Every claim of a virtual server, with its rank and the claiming Service (its position
    /// in `plans`).
    claims: Vec<(VirtualServerKey, Rank, u32)>,
    /// The set elements of the virtual servers won.
    vs_elements: Vec<SetElement>,
    /// Every claim of a bind address.
    addresses: Vec<IpAddr>,
    /// Every claim of a shared set element ([`Stored::shared_elements`]).
    elements: Vec<SetElement>,
    /// Every claim of a health-check node port, with its rank and the claiming Service.
    health_checks: Vec<(u16, Rank, u32)>,
}

impl IndexBuilder {
    /// Add the plan of Service `key` (`None`: the Service has none, as for
    /// [`DesiredIndex::update`]).
    ///
    /// # Panics
    /// When `key` does not follow the previous key in order (the store's order).
    pub fn push(&mut self, key: ServiceKey, plan: Option<ServicePlan>) {
        let Some(plan) = plan else {
            return;
        };
        if let Some((last, _)) = self.plans.last() {
            assert!(**last < key, "plans pushed out of key order: {key:?}");
        }
        let service = u32::try_from(self.plans.len()).expect("fewer than 2^32 Services");
        let mut stored = Stored::new(&plan);
        let desired = &mut self.index.desired.virtual_servers;
        for (at, (vs, entry)) in plan.virtual_servers.into_iter().enumerate() {
            self.claims.push((vs, stored.rank(at), service));
            if desired.contains_key(&vs) {
                // Lost to an earlier Service (until [`IndexBuilder::finish`] ranks the claims).
                stored.lose(at, entry, desired);
                continue;
            }
            self.index.real_servers += entry.real_servers.len();
            desired.insert(vs, entry);
            self.vs_elements.extend(stored.vs_elements(at));
        }
        self.addresses.extend(stored.bind_addresses.iter().copied());
        self.elements.extend(stored.shared_elements());
        if let Some((port, _)) = stored.health_check_node_port.as_deref() {
            self.health_checks
                .push((*port, stored.health_check_rank(), service));
        }
        self.index.count(&stored, true);
        self.plans.push((Arc::new(key), stored));
    }

    /// The index of every plan pushed.
    pub fn finish(self) -> DesiredIndex {
        let IndexBuilder {
            mut index,
            plans,
            claims,
            mut vs_elements,
            addresses,
            elements,
            health_checks,
        } = self;
        let (vs_claims, hand_overs) = rank_virtual_server_claims(claims, &plans);
        index.vs_claims = vs_claims.into_iter().collect();
        // Inserted as the plans came (in no order of their own): refilled.
        compact_map(&mut index.desired.virtual_servers);
        let elements = counted(elements);
        vs_elements.extend(elements.iter().map(|(element, _)| *element));
        vs_elements.sort_unstable();
        vs_elements.dedup();
        index.desired.set_elements = vs_elements.into_iter().collect();
        index.element_claims = elements.into_iter().collect();
        let addresses = counted(addresses);
        index.desired.bind_addresses = addresses.iter().map(|(address, _)| *address).collect();
        index.address_claims = addresses.into_iter().collect();
        index.rank_health_check_claims(health_checks, &plans);
        index.plans = plans.into_iter().collect();
        for (vs, from) in hand_overs {
            index.hand_over(&vs, &from);
        }
        index
    }
}

/// A virtual server whose entry goes from the Service that took it to the winner of its claims.
type HandOver = (VirtualServerKey, Arc<ServiceKey>);

/// The claims of each virtual server (`vs`, rank, the claiming Service's position in `plans`)
/// in rank, then key order: the winner first. Also the virtual servers whose winner is not
/// the first claimant in key order (who took the entry in [`IndexBuilder::push`]), with that
/// claimant: their entry is handed over once every plan is in.
fn rank_virtual_server_claims(
    mut claims: Vec<(VirtualServerKey, Rank, u32)>,
    plans: &[(Arc<ServiceKey>, Stored)],
) -> (Vec<(VirtualServerKey, Claims)>, Vec<HandOver>) {
    claims.sort_unstable();
    let mut vs_claims: Vec<(VirtualServerKey, Claims)> = Vec::new();
    let mut first_pushed: Vec<u32> = Vec::new();
    for (vs, rank, service) in claims {
        let key = plans[service as usize].0.clone();
        match vs_claims.last_mut() {
            Some((last, claims)) if *last == vs => {
                claims.0.push((rank, key));
                let first = first_pushed.last_mut().expect("one per virtual server");
                *first = (*first).min(service);
            }
            _ => {
                vs_claims.push((vs, Claims(vec![(rank, key)])));
                first_pushed.push(service);
            }
        }
    }
    let hand_overs = vs_claims
        .iter()
        .zip(first_pushed)
        .filter(|((_, claims), first)| claims.first() != Some(&*plans[*first as usize].0))
        .map(|((vs, _), first)| (*vs, plans[first as usize].0.clone()))
        .collect();
    (vs_claims, hand_overs)
}

impl DesiredIndex {
    /// Ranks the claims of each health-check node port (port, rank, the claiming Service's
    /// position in `plans`); the winner's health check is desired.
    fn rank_health_check_claims(
        &mut self,
        mut health_checks: Vec<(u16, Rank, u32)>,
        plans: &[(Arc<ServiceKey>, Stored)],
    ) {
        health_checks.sort_unstable();
        for (port, rank, service) in health_checks {
            let (key, plan) = &plans[service as usize];
            let claims = self.health_check_claims.entry(port).or_default();
            claims.0.push((rank, key.clone()));
            if claims.0.len() == 1 {
                let (_, health_check) = plan.health_check_node_port.as_deref().expect("claimed");
                self.desired
                    .health_check_node_ports
                    .insert(port, health_check.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests;

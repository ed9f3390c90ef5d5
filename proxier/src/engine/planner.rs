//! Incremental planning: the plan of every Service kept in a [`DesiredIndex`], re-planned
//! only where the store changed.

use crate::dataplane::diff::Ownership;
use crate::model::{DesiredState, Protocol};
use crate::plan::{self, DesiredIndex, IndexBuilder, NoLocalEndpoints, Plan, PlanContext, Touched};
use crate::source::store::Store;
use kipvs_crds::config::{ConfigError, ProxierConfiguration};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Which node this proxier runs on.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    /// This node's name (endpoints with this `nodeName` are local).
    pub name: String,
    /// Node IPs for NodePort virtual servers (`--node-ip`); empty means the Node's InternalIP
    /// addresses and every address on the node's interfaces ([`plan::node_addresses`]).
    pub node_ips: Vec<IpAddr>,
}

/// Plans from the store incrementally: keeps the plan of every Service in a [`DesiredIndex`]
/// and re-plans only the Services whose objects changed (all of them when the Node changed or
/// on the first call).
pub struct Planner {
    identity: NodeIdentity,
    config: ProxierConfiguration,
    index: DesiredIndex,
    /// The node's addresses of the last full plan ([`plan::node_addresses`]).
    node_ips: Vec<IpAddr>,
    /// Those `nodePortAddresses` selects: NodePorts are served on them.
    node_port_ips: BTreeSet<IpAddr>,
    other_addresses: BTreeSet<IpAddr>,
    /// IPVS schedulers of `kipvs.io/scheduler` annotations probed on this kernel.
    probed_schedulers: BTreeSet<String>,
    /// Those the kernel lacks.
    unavailable_schedulers: BTreeSet<String>,
    replan_all: bool,
}

/// What a [`Planner::replan`] changed.
#[derive(Debug)]
pub enum Replanned {
    /// Everything was re-planned (first plan, Node or configuration change).
    All,
    /// Only these virtual servers and addresses may have changed.
    Touched(Touched),
}

impl Planner {
    /// A planner for this node and configuration.
    pub fn new(identity: NodeIdentity, config: ProxierConfiguration) -> Self {
        Planner {
            identity,
            config,
            index: DesiredIndex::default(),
            node_ips: Vec::new(),
            node_port_ips: BTreeSet::new(),
            other_addresses: BTreeSet::new(),
            probed_schedulers: BTreeSet::new(),
            unavailable_schedulers: BTreeSet::new(),
            replan_all: false,
        }
    }

    /// The desired state of every Service.
    pub fn desired(&self) -> &DesiredState {
        self.index.desired()
    }

    /// The whole plan (desired state, every problem, counts). O(number of Services).
    pub fn plan(&self) -> Plan {
        self.index.to_plan()
    }

    /// Services with a Local traffic policy and no local endpoint, and Services served by the
    /// KEP-1669 fallback to serving+terminating endpoints ([`DesiredIndex::counts`]).
    pub fn counts(&self) -> (NoLocalEndpoints, usize) {
        self.index.counts()
    }

    /// The number of real servers in [`desired`](Self::desired) (kept, not counted).
    pub fn real_servers(&self) -> usize {
        self.index.real_servers()
    }

    /// The configuration planned with.
    pub fn config(&self) -> &ProxierConfiguration {
        &self.config
    }

    /// Plan with `config` from now on: the next [`replan`](Self::replan) re-plans every
    /// Service.
    pub fn set_config(&mut self, config: ProxierConfiguration) {
        self.config = config;
        self.replan_all = true;
    }

    /// The node's addresses of the last full plan, before `nodePortAddresses` selects among them
    /// ([`plan::node_addresses`]): a virtual server on one of them with a port in the NodePort
    /// range is kipvs's ([`Ownership`]).
    pub fn node_ips(&self) -> &[IpAddr] {
        &self.node_ips
    }

    /// The addresses NodePort virtual servers are served on ([`PlanContext::node_port_ips`]).
    pub fn node_port_ips(&self) -> &BTreeSet<IpAddr> {
        &self.node_port_ips
    }

    /// Which virtual servers the syncer may delete or drain under the configuration planned
    /// with, on this node's addresses, draining kube-proxy's `kube_proxy_node_ports`
    /// ([`Ownership`]).
    ///
    /// # Errors
    /// The configuration's `nodePortRange` or `ipvs.excludeCIDRs` do not parse.
    pub fn ownership(
        &self,
        kube_proxy_node_ports: BTreeSet<(u16, Protocol)>,
    ) -> Result<Ownership, ConfigError> {
        Ownership::new(
            &self.config,
            self.node_ips.iter().copied().collect(),
            self.node_port_ips.clone(),
            self.other_addresses.clone(),
            kube_proxy_node_ports,
        )
    }

    /// The node's addresses on interfaces other than `kube-ipvs0`, as last set.
    pub fn other_interface_addresses(&self) -> &BTreeSet<IpAddr> {
        &self.other_addresses
    }

    /// Set the node's addresses on interfaces other than `kube-ipvs0` (NodePorts are served on
    /// them unless `--node-ip` is given, externalIPs and load-balancer IPs among them are not
    /// bound); a change re-plans every Service, unless only addresses that plan nothing came
    /// or went ([`plan::address_plans`]: the IPv6 link-local addresses of pods' veths).
    pub fn set_other_interface_addresses(&mut self, addresses: BTreeSet<IpAddr>) {
        let plans = addresses
            .symmetric_difference(&self.other_addresses)
            .any(|ip| plan::address_plans(ip, &self.config));
        self.replan_all |= plans;
        self.other_addresses = addresses;
    }

    /// Whether the IPVS scheduler `scheduler` was probed already (see
    /// [`scheduler_probed`](Self::scheduler_probed)).
    pub fn scheduler_known(&self, scheduler: &str) -> bool {
        self.probed_schedulers.contains(scheduler)
    }

    /// Record a probe of `scheduler` (once per scheduler and process): when the kernel lacks it,
    /// the Services annotated with it are planned with `ipvs.scheduler` (and a [`Problem`]
    /// each) from the next [`replan`](Self::replan), which re-plans every Service.
    ///
    /// [`Problem`]: crate::plan::Problem
    pub fn scheduler_probed(&mut self, scheduler: String, available: bool) {
        if !available {
            self.unavailable_schedulers.insert(scheduler.clone());
            self.replan_all = true;
        }
        self.probed_schedulers.insert(scheduler);
    }

    /// The IPVS schedulers probed and found missing.
    pub fn unavailable_schedulers(&self) -> &BTreeSet<String> {
        &self.unavailable_schedulers
    }

    /// Whether the next [`replan`](Self::replan) re-plans every Service (configuration,
    /// addresses or schedulers changed).
    pub fn replan_pending(&self) -> bool {
        self.replan_all
    }

    /// Take the store's changes and re-plan the affected Services; problems of re-planned
    /// Services are logged naming them ([`log_changed_problems`]; after a full re-plan, every
    /// problem as a warning).
    pub fn replan(&mut self, store: &mut Store) -> Replanned {
        let dirty = store.take_dirty();
        let node = store.node_info();
        // Both are taken: `dirty.all || take(replan_all)` left a pending `replan_all` (set by
        // the configuration put in force before the first sync) for the next call, so the
        // first change after start-up re-planned and synced everything again.
        let replan_all = std::mem::take(&mut self.replan_all);
        if dirty.all || replan_all {
            self.node_ips =
                plan::node_addresses(&self.identity.node_ips, node, &self.other_addresses);
        }
        let (context, problems) =
            PlanContext::new(&self.identity.name, node, &self.node_ips, &self.config);
        self.node_port_ips = context.node_port_ips().iter().copied().collect();
        let context = context
            .with_other_interface_addresses(self.other_addresses.iter().copied())
            .with_unavailable_schedulers(&self.unavailable_schedulers);
        if !(dirty.all || replan_all) {
            let mut touched = Touched::default();
            for key in &dirty.services {
                let before = self.index.problems_of(key);
                let planned = store
                    .service(key)
                    .and_then(|s| plan::plan_service(s, &store.slices_of(key), &context));
                touched.extend(self.index.update(key.clone(), planned));
                log_changed_problems(&before, &self.index.problems_of(key));
            }
            return Replanned::Touched(touched);
        }
        // Every Service, in the store's (key) order, into a new index built at once (a full
        // re-plan syncs everything: no scope to collect).
        for problem in &problems {
            tracing::warn!("{problem}");
        }
        // The old index goes first: never two at once.
        self.index = DesiredIndex::default();
        let mut index = IndexBuilder::default();
        for (key, service) in store.services() {
            let planned = plan::plan_service(service, &store.slices_of(key), &context);
            index.push(key.clone(), planned);
        }
        self.index = index.finish();
        self.index.set_nft_rules(context.nft_rules().clone());
        for problem in self.index.problems() {
            tracing::warn!("{problem}");
        }
        Replanned::All
    }
}

/// Logs the problems `after` of a re-planned Service: as warnings those of a field that had
/// none `before` the re-plan, at debug level the others, so that a field changing from one
/// invalid value to another (an annotation rewritten in a loop) is warned about once. A
/// problem's field is its message's first word ([`plan::Problem::message`] names it first).
fn log_changed_problems(before: &[plan::Problem], after: &[plan::Problem]) {
    let field = |p: &plan::Problem| p.message.split(' ').next().unwrap_or_default().to_owned();
    let known: BTreeSet<String> = before.iter().map(field).collect();
    for problem in after {
        if known.contains(&field(problem)) {
            tracing::debug!("{problem}");
        } else {
            tracing::warn!("{problem}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    /// A planner that planned everything once with the node's addresses `with`.
    fn planned(config: &str, with: &[&str]) -> Planner {
        let identity = NodeIdentity {
            name: "node-a".into(),
            node_ips: Vec::new(),
        };
        let config = ProxierConfiguration::from_yaml_str(config).unwrap();
        let mut planner = Planner::new(identity, config);
        planner.set_other_interface_addresses(addresses(with));
        planner.replan(&mut Store::default());
        assert!(!planner.replan_pending());
        planner
    }

    /// A pod's veth brings an IPv6 link-local address and takes it away with the pod: that
    /// re-plans nothing (it takes no NodePort, kube-proxy's rule), so that pod churn does not
    /// re-plan every Service; any other address does, and so does a link-local one that an
    /// explicit `nodePortAddresses` CIDR selects.
    #[test]
    fn the_link_local_addresses_of_pods_veths_re_plan_nothing() {
        let node = ["10.20.30.51", "fe80::1"];
        let mut planner = planned("{}", &node);
        let veth_up = ["10.20.30.51", "fe80::1", "fe80::a8c1:abff:fe12:3456"];
        planner.set_other_interface_addresses(addresses(&veth_up));
        assert!(!planner.replan_pending(), "a veth's fe80:: address came");
        assert_eq!(planner.other_interface_addresses(), &addresses(&veth_up));
        planner.set_other_interface_addresses(addresses(&node));
        assert!(!planner.replan_pending(), "a veth's fe80:: address went");
        // A keepalived VIP does.
        planner.set_other_interface_addresses(addresses(&["10.20.30.51", "10.20.30.100"]));
        assert!(planner.replan_pending(), "a VIP came");

        let mut planner = planned("nodePortAddresses: [\"fe80::/10\"]", &node);
        planner.set_other_interface_addresses(addresses(&veth_up));
        assert!(
            planner.replan_pending(),
            "a selected link-local address came"
        );
    }
}

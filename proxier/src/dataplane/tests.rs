use super::diff::{Ownership, diff, position};
use super::fake::FakeDataplane;
use super::*;
use crate::model::{
    DesiredState, ObservedRealServer, ObservedState, Protocol, VirtualServer, VirtualServerSpec,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn key(addr: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
    VirtualServerKey {
        address: addr.parse().unwrap(),
        port,
        protocol,
    }
}

fn rr() -> VirtualServerSpec {
    VirtualServerSpec {
        scheduler: "rr".into(),
        persistence_timeout: None,
        sched_flags: 0,
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn desired(vss: &[(VirtualServerKey, &[(&str, u32)])], bind: &[&str]) -> DesiredState {
    DesiredState {
        virtual_servers: vss
            .iter()
            .map(|(k, rss)| {
                let real_servers = rss.iter().map(|(a, w)| (sa(a), *w)).collect();
                let vs = VirtualServer {
                    spec: rr(),
                    real_servers,
                    service: "default/web:http".into(),
                };
                (*k, vs)
            })
            .collect(),
        bind_addresses: bind.iter().map(|a| a.parse().unwrap()).collect(),
        ..Default::default()
    }
}

fn run(fake: &mut FakeDataplane, ops: &[Op]) {
    let failures = futures::executor::block_on(fake.apply(ops));
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn converged_state_has_empty_diff() {
    let d = desired(
        &[(
            key("10.96.0.10", 80, Protocol::Tcp),
            &[("10.244.1.2:8080", 1)],
        )],
        &["10.96.0.10"],
    );
    assert!(diff(&d, &ObservedState::from(&d), &Ownership::default()).is_empty());
}

#[test]
fn ops_come_in_safe_order() {
    let old = desired(
        &[(
            key("10.96.0.10", 80, Protocol::Tcp),
            &[("10.244.1.2:8080", 1)],
        )],
        &["10.96.0.10"],
    );
    let new = desired(
        &[(
            key("10.96.0.20", 80, Protocol::Tcp),
            &[("10.244.1.3:8080", 1)],
        )],
        &["10.96.0.20"],
    );
    let ops = diff(&new, &ObservedState::from(&old), &Ownership::default());
    let names: Vec<_> = ops.iter().map(Op::name).collect();
    assert_eq!(
        names,
        [
            "UnbindAddress",
            "DeleteVirtualServer",
            "AddVirtualServer",
            "AddRealServer",
            "BindAddress"
        ]
    );
}

#[test]
fn restart_resets_weight_of_wanted_backend() {
    // kubernetes#92019 / #108319: a wanted real server left at weight 0 gets its weight back.
    let k = key("10.96.0.10", 80, Protocol::Tcp);
    let d = desired(&[(k, &[("10.244.1.2:8080", 1)])], &["10.96.0.10"]);
    let mut o = ObservedState::from(&d);
    o.virtual_servers
        .get_mut(&k)
        .unwrap()
        .real_servers
        .get_mut(&sa("10.244.1.2:8080"))
        .unwrap()
        .weight = 0;
    assert_eq!(
        diff(&d, &o, &Ownership::default()),
        [Op::UpdateRealServer {
            vs: k,
            rs: sa("10.244.1.2:8080"),
            weight: 1
        }]
    );
}

#[test]
fn tcp_real_server_with_connections_drains_at_weight_zero() {
    let k = key("10.96.0.10", 80, Protocol::Tcp);
    let before = desired(
        &[(k, &[("10.244.1.2:8080", 1), ("10.244.1.3:8080", 1)])],
        &["10.96.0.10"],
    );
    let after = desired(&[(k, &[("10.244.1.3:8080", 1)])], &["10.96.0.10"]);
    let mut o = ObservedState::from(&before);
    let leaving = sa("10.244.1.2:8080");
    let rs: &mut ObservedRealServer = o
        .virtual_servers
        .get_mut(&k)
        .unwrap()
        .real_servers
        .get_mut(&leaving)
        .unwrap();
    rs.active_connections = 1;
    let drain = Op::UpdateRealServer {
        vs: k,
        rs: leaving,
        weight: 0,
    };
    assert_eq!(
        diff(&after, &o, &Ownership::default()),
        std::slice::from_ref(&drain)
    );
    // While it still has connections, nothing more happens.
    let mut fake = FakeDataplane::new(o);
    run(&mut fake, &[drain]);
    assert!(diff(&after, &fake.state, &Ownership::default()).is_empty());
    // Once they end it is deleted.
    let rs = fake
        .state
        .virtual_servers
        .get_mut(&k)
        .unwrap()
        .real_servers
        .get_mut(&leaving)
        .unwrap();
    rs.active_connections = 0;
    assert_eq!(
        diff(&after, &fake.state, &Ownership::default()),
        [Op::DeleteRealServer { vs: k, rs: leaving }]
    );
}

#[test]
fn udp_real_server_is_deleted_at_once() {
    let k = key("10.96.0.10", 53, Protocol::Udp);
    let before = desired(&[(k, &[("10.244.1.2:53", 1)])], &["10.96.0.10"]);
    let after = desired(&[(k, &[])], &["10.96.0.10"]);
    let mut o = ObservedState::from(&before);
    let rs = sa("10.244.1.2:53");
    o.virtual_servers
        .get_mut(&k)
        .unwrap()
        .real_servers
        .get_mut(&rs)
        .unwrap()
        .inactive_connections = 3;
    assert_eq!(
        diff(&after, &o, &Ownership::default()),
        [Op::DeleteRealServer { vs: k, rs }]
    );
}

#[test]
fn foreign_virtual_servers_are_left_alone() {
    let ours = key("10.96.0.10", 80, Protocol::Tcp);
    let nodeport = key("192.168.1.5", 30080, Protocol::Tcp);
    let foreign = key("192.168.1.5", 8080, Protocol::Tcp);
    let excluded = key("10.96.5.5", 80, Protocol::Tcp);
    let mut o = ObservedState::from(&desired(
        &[
            (ours, &[]),
            (nodeport, &[]),
            (foreign, &[]),
            (excluded, &[]),
        ],
        &["10.96.0.10", "10.96.5.5"],
    ));
    o.bound_addresses.insert("10.96.5.5".parse().unwrap());
    let ownership = Ownership {
        node_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_range: Some(30000..=32767),
        exclude_cidrs: vec!["10.96.5.0/24".parse().unwrap()],
        ..Ownership::default()
    };
    let ops = diff(&DesiredState::default(), &o, &ownership);
    assert!(ops.contains(&Op::DeleteVirtualServer(ours)));
    assert!(ops.contains(&Op::DeleteVirtualServer(nodeport)));
    assert!(!ops.contains(&Op::DeleteVirtualServer(foreign)));
    assert!(!ops.contains(&Op::DeleteVirtualServer(excluded)));
}

/// An externalIP that sits on another interface is not bound on `kube-ipvs0`: the virtual
/// server kipvs made for it is still kipvs's, by the `external` element kipvs's table keeps for
/// it, and goes with its Service (after a restart too: the record is in the kernel). A virtual
/// server on the same address without such an element is someone else's.
#[test]
fn virtual_servers_on_addresses_of_other_interfaces_are_owned_by_their_element() {
    let external = key("192.168.1.5", 8443, Protocol::Tcp);
    let external_local = key("192.168.1.5", 9443, Protocol::Udp);
    let foreign = key("192.168.1.5", 8080, Protocol::Tcp);
    let mut o = ObservedState::from(&desired(
        &[(external, &[]), (external_local, &[]), (foreign, &[])],
        &[],
    ));
    o.set_elements.extend([
        SetElement::External(external),
        SetElement::ExternalLocal(external_local),
    ]);
    let ownership = Ownership::default();
    let ops = diff(&DesiredState::default(), &o, &ownership);
    assert!(ops.contains(&Op::DeleteVirtualServer(external)), "{ops:?}");
    assert!(
        ops.contains(&Op::DeleteVirtualServer(external_local)),
        "{ops:?}"
    );
    assert!(!ops.contains(&Op::DeleteVirtualServer(foreign)), "{ops:?}");
    // The virtual server goes before its element: a failure in between leaves the record.
    let position = |wanted: &Op| ops.iter().position(|op| op == wanted).unwrap();
    assert!(
        position(&Op::DeleteVirtualServer(external))
            < position(&Op::DeleteSetElement(SetElement::External(external)))
    );
}

#[test]
fn scheduler_change_updates_in_place() {
    let k = key("10.96.0.10", 80, Protocol::Tcp);
    let d = desired(&[(k, &[("10.244.1.2:8080", 1)])], &["10.96.0.10"]);
    let mut o = ObservedState::from(&d);
    o.virtual_servers.get_mut(&k).unwrap().spec.scheduler = "wlc".into();
    assert_eq!(
        diff(&d, &o, &Ownership::default()),
        [Op::UpdateVirtualServer(k, rr())]
    );
}

fn arb_key() -> impl Strategy<Value = VirtualServerKey> {
    (
        prop::sample::select(vec!["10.96.0.1", "10.96.0.2", "fd00::1", "192.168.1.5"]),
        prop::sample::select(vec![53u16, 80, 30080]),
        prop::sample::select(vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]),
    )
        .prop_map(|(a, p, proto)| key(a, p, proto))
}

fn arb_spec() -> impl Strategy<Value = VirtualServerSpec> {
    (
        prop::sample::select(vec!["rr", "wrr", "sh"]),
        prop::option::of(prop::sample::select(vec![60u32, 10800])),
    )
        .prop_map(|(s, p)| VirtualServerSpec {
            scheduler: s.into(),
            persistence_timeout: p,
            sched_flags: 0,
        })
}

fn arb_real_servers() -> impl Strategy<Value = BTreeMap<SocketAddr, (u32, u32)>> {
    prop::collection::btree_map(
        prop::sample::select(vec![
            sa("10.244.1.2:80"),
            sa("10.244.1.3:80"),
            sa("10.244.2.2:8080"),
            sa("[fd00:244::2]:80"),
        ]),
        (0u32..3, prop::sample::select(vec![0u32, 0, 2])),
        0..4,
    )
}

fn arb_addrs() -> impl Strategy<Value = BTreeSet<IpAddr>> {
    prop::collection::btree_set(
        prop::sample::select(vec!["10.96.0.1", "10.96.0.2", "fd00::1", "10.96.9.9"])
            .prop_map(|a| a.parse::<IpAddr>().unwrap()),
        0..4,
    )
}

fn arb_elements() -> impl Strategy<Value = BTreeSet<SetElement>> {
    prop::collection::btree_set(
        prop_oneof![
            arb_key().prop_map(SetElement::ClusterIp),
            arb_key().prop_map(SetElement::External),
            arb_addrs().prop_map(|a| SetElement::ServiceIp(
                a.into_iter().next().unwrap_or([10, 96, 0, 1].into())
            )),
            (30000u16..30003).prop_map(SetElement::HealthCheckNodePort),
        ],
        0..5,
    )
}

fn arb_rules() -> impl Strategy<Value = NftRules> {
    any::<bool>().prop_map(|all| NftRules::new(vec![], all))
}

fn arb_desired() -> impl Strategy<Value = DesiredState> {
    (
        prop::collection::btree_map(arb_key(), (arb_spec(), arb_real_servers()), 0..6),
        arb_addrs(),
        arb_elements(),
        arb_rules(),
    )
        .prop_map(|(vss, bind, mut set_elements, nft_rules)| {
            // As every plan has them: an element derived from a virtual server comes with it.
            set_elements.retain(|e| e.virtual_server().is_none_or(|k| vss.contains_key(&k)));
            DesiredState {
                virtual_servers: vss
                    .into_iter()
                    .map(|(k, (spec, rss))| {
                        let real_servers = rss.into_iter().map(|(a, (w, _))| (a, w)).collect();
                        let vs = VirtualServer {
                            spec,
                            real_servers,
                            service: "ns/svc:port".into(),
                        };
                        (k, vs)
                    })
                    .collect(),
                bind_addresses: bind,
                health_check_node_ports: BTreeMap::new(),
                set_elements,
                nft_rules,
            }
        })
}

fn arb_observed() -> impl Strategy<Value = ObservedState> {
    (
        prop::collection::btree_map(arb_key(), (arb_spec(), arb_real_servers()), 0..6),
        arb_addrs(),
        arb_elements(),
        prop::option::of(arb_rules()),
    )
        .prop_map(|(vss, bound, set_elements, rules)| ObservedState {
            virtual_servers: vss
                .into_iter()
                .map(|(k, (spec, rss))| {
                    let real_servers = rss
                        .into_iter()
                        .map(|(a, (weight, conns))| {
                            let rs = ObservedRealServer {
                                weight,
                                active_connections: conns,
                                inactive_connections: 0,
                            };
                            (a, rs)
                        })
                        .collect();
                    (k, ObservedVirtualServer { spec, real_servers })
                })
                .collect(),
            bound_addresses: bound,
            set_elements,
            nft_rule_comments: rules
                .map(|r| nftables::rules::rule_comments(&r).to_vec())
                .unwrap_or_default(),
        })
}

/// Any op on the keys, addresses and elements the other strategies draw from, with runs of
/// set-element additions (as a diff emits them).
fn arb_op() -> impl Strategy<Value = Vec<Op>> {
    let element = prop_oneof![
        arb_key().prop_map(SetElement::ClusterIp),
        (30000u16..30200).prop_map(SetElement::HealthCheckNodePort),
    ];
    let real_server = prop::sample::select(vec![
        sa("10.244.1.2:80"),
        sa("10.244.1.3:80"),
        sa("[fd00:244::2]:80"),
    ]);
    let address = prop::sample::select(vec!["10.96.0.1", "fd00::1"])
        .prop_map(|a| a.parse::<IpAddr>().unwrap());
    prop_oneof![
        address.clone().prop_map(|a| vec![Op::BindAddress(a)]),
        address.prop_map(|a| vec![Op::UnbindAddress(a)]),
        prop::collection::vec(element.clone().prop_map(Op::AddSetElement), 1..6),
        element.prop_map(|e| vec![Op::DeleteSetElement(e)]),
        arb_rules().prop_map(|r| vec![Op::WriteRules(r)]),
        (arb_key(), arb_spec()).prop_map(|(k, s)| vec![Op::AddVirtualServer(k, s)]),
        (arb_key(), arb_spec()).prop_map(|(k, s)| vec![Op::UpdateVirtualServer(k, s)]),
        arb_key().prop_map(|k| vec![Op::DeleteVirtualServer(k)]),
        (
            arb_key(),
            prop::collection::vec((real_server, 0u32..3, 0u8..3), 1..5)
        )
            .prop_map(|(vs, rss)| {
                rss.into_iter()
                    .map(|(rs, weight, kind)| match kind {
                        0 => Op::AddRealServer { vs, rs, weight },
                        1 => Op::UpdateRealServer { vs, rs, weight },
                        _ => Op::DeleteRealServer { vs, rs },
                    })
                    .collect()
            }),
    ]
}

/// A real server kept only because it drains: not desired, TCP, with connections.
fn draining(k: &VirtualServerKey, rs: &ObservedRealServer) -> bool {
    k.protocol == Protocol::Tcp && rs.active_connections + rs.inactive_connections > 0
}

proptest! {
    /// apply(diff(d, o)) to o gives d — except owned-elsewhere virtual servers (left alone) and
    /// TCP real servers still holding connections (kept at weight 0 to drain) — and the
    /// diff of the result against d is then empty.
    #[test]
    fn applying_the_diff_converges(d in arb_desired(), o in arb_observed()) {
        let ownership = Ownership {
            node_ips: ["192.168.1.5".parse().unwrap()].into(),
            node_port_ips: ["192.168.1.5".parse().unwrap()].into(),
            node_port_range: Some(30000..=32767),
            exclude_cidrs: vec![],
            ..Ownership::default()
        };
        let ops = diff(&d, &o, &ownership);
        let mut fake = FakeDataplane::new(o.clone());
        run(&mut fake, &ops);
        let got = &fake.state;
        prop_assert_eq!(&got.bound_addresses, &d.bind_addresses);
        prop_assert_eq!(&got.set_elements, &d.set_elements);
        prop_assert_eq!(got.nft_rule_comments.as_slice(), nftables::rules::rule_comments(&d.nft_rules));
        for (k, dvs) in &d.virtual_servers {
            let gvs = &got.virtual_servers[k];
            prop_assert_eq!(&gvs.spec, &dvs.spec);
            for (rs, grs) in &gvs.real_servers {
                match dvs.real_servers.get(rs) {
                    Some(w) => prop_assert_eq!(grs.weight, *w),
                    None => prop_assert!(draining(k, grs) && grs.weight == 0),
                }
            }
            prop_assert!(dvs.real_servers.keys().all(|rs| gvs.real_servers.contains_key(&rs)));
        }
        for k in got.virtual_servers.keys() {
            if !d.virtual_servers.contains_key(k) {
                prop_assert!(!ownership.owns(k, &d, &o), "owned leftover {}", k);
            }
        }
        prop_assert!(diff(&d, got, &ownership).is_empty());
        // The ops come in the order `position` gives, with the virtual servers whose real
        // servers wait for the nftables transaction read back from the ops themselves.
        let after_nft: BTreeSet<VirtualServerKey> = ops
            .iter()
            .filter_map(|op| match op {
                Op::AddVirtualServer(key, _) => Some(*key),
                Op::AddSetElement(e) | Op::DeleteSetElement(e) => e.virtual_server(),
                _ => None,
            })
            .collect();
        let early_hairpin = !ops.iter().any(|op| matches!(op, Op::WriteRules(_)));
        let place = |op: &Op| {
            let waits = real_server_op(op).is_some_and(|vs| after_nft.contains(vs));
            position(op, waits, early_hairpin)
        };
        prop_assert!(ops.is_sorted_by_key(place), "{:?}", ops);
    }

    /// `apply_all` leaves the state and gives the results of one `apply` per op, in order,
    /// whether a run of set-element additions is merged in bulk (against a small set) or
    /// inserted one by one (against a set 16 times its size).
    #[test]
    fn applying_all_at_once_is_applying_each(
        o in arb_observed(),
        ports in prop::collection::btree_set(30000u16..30200, 0..120),
        ops in prop::collection::vec(arb_op(), 0..20).prop_map(|runs| runs.concat()),
    ) {
        let mut o = o;
        o.set_elements.extend(ports.into_iter().map(SetElement::HealthCheckNodePort));
        let mut each = o.clone();
        let expected: Vec<_> = ops.iter().map(|op| format!("{op}: {:?}", each.apply(op))).collect();
        let mut all = o;
        let mut got = Vec::new();
        all.apply_all(&ops, |op, result| got.push(format!("{op}: {result:?}")));
        prop_assert_eq!(got, expected);
        prop_assert_eq!(all, each);
    }

    /// Keys asked in ascending order are found as by a B-tree search, whether the map is walked
    /// alongside them (many keys) or searched (few).
    #[test]
    fn ascending_lookups_find_what_a_search_finds(
        map in prop::collection::btree_map(0u16..400, any::<u8>(), 0..200),
        keys in prop::collection::btree_set(0u16..400, 0..60),
    ) {
        let set: BTreeSet<u16> = map.keys().copied().collect();
        let (mut get, mut contains) = (ascending_get(&map, keys.len()), ascending_contains(&set, keys.len()));
        for key in &keys {
            prop_assert_eq!(get(key), map.get(key));
            prop_assert_eq!(contains(key), set.contains(key));
        }
    }

    /// The diff of any state against itself is empty.
    #[test]
    fn diff_of_a_state_with_itself_is_empty(d in arb_desired()) {
        prop_assert!(diff(&d, &ObservedState::from(&d), &Ownership::default()).is_empty());
    }
}

/// `nodePortRange` decides which virtual servers on node IPs are NodePorts kipvs owns: with a
/// cluster started with `--service-node-port-range=20000-22767`, a stale NodePort at 20080 is
/// deleted and a virtual server at 30080 (not a NodePort there) is left alone.
#[test]
fn node_port_ownership_follows_the_configured_range() {
    let stale = key("192.168.1.5", 20080, Protocol::Udp);
    let other = key("192.168.1.5", 30080, Protocol::Tcp);
    let o = ObservedState::from(&desired(&[(stale, &[]), (other, &[])], &[]));
    let config =
        kipvs_crds::config::ProxierConfiguration::from_yaml_str("nodePortRange: 20000-22767")
            .unwrap();
    let ownership = Ownership {
        node_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_range: Some(config.parsed_node_port_range().unwrap()),
        exclude_cidrs: vec![],
        ..Ownership::default()
    };
    assert_eq!(
        diff(&DesiredState::default(), &o, &ownership),
        [Op::DeleteVirtualServer(stale)]
    );
}

/// The real servers of an existing virtual server go ahead of the nftables transaction, except
/// when that virtual server's own elements change in it: then they wait for it (a masquerade
/// element must be in place before the remote endpoint that needs it takes traffic).
#[test]
fn real_servers_wait_for_their_own_virtual_servers_elements_only() {
    let (changed, same) = (
        key("10.96.0.1", 80, Protocol::Tcp),
        key("10.96.0.2", 80, Protocol::Tcp),
    );
    let before = desired(
        &[
            (changed, &[("10.244.1.2:80", 1)]),
            (same, &[("10.244.1.2:80", 1)]),
        ],
        &[],
    );
    let mut after = desired(
        &[
            (changed, &[("10.244.1.2:80", 1), ("10.244.2.2:80", 1)]),
            (same, &[("10.244.1.2:80", 1), ("10.244.2.2:80", 1)]),
        ],
        &[],
    );
    after.set_elements.insert(SetElement::External(changed));
    let ops = diff(&after, &ObservedState::from(&before), &Ownership::default());
    let at = |wanted: &Op| ops.iter().position(|op| op == wanted).unwrap();
    let rs = sa("10.244.2.2:80");
    let element = at(&Op::AddSetElement(SetElement::External(changed)));
    let add = |vs| Op::AddRealServer { vs, rs, weight: 1 };
    assert!(at(&add(same)) < element, "{ops:?}");
    assert!(at(&add(changed)) > element, "{ops:?}");
}

//! Unit tests of `proxier/src/plan/index.rs`.

use super::*;
use crate::model::{HealthCheckNodePort, Protocol, VirtualServer, VirtualServerSpec};
use crate::plan::merge;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn plan_for(
    ns: &str,
    name: &str,
    vss: &[(u16, u32)],
    addrs: &[u8],
    hc: Option<u16>,
) -> ServicePlan {
    let service = format!("{ns}/{name}:p");
    ServicePlan {
        namespace: ns.into(),
        name: name.into(),
        virtual_servers: vss
            .iter()
            .map(|&(port, weight)| {
                let key = VirtualServerKey {
                    address: "10.96.0.1".parse().unwrap(),
                    port,
                    protocol: Protocol::Tcp,
                };
                let vs = VirtualServer {
                    spec: VirtualServerSpec {
                        scheduler: "rr".into(),
                        persistence_timeout: None,
                        sched_flags: 0,
                    },
                    real_servers: [("10.244.0.1:80".parse().unwrap(), weight)].into(),
                    service: service.as_str().into(),
                };
                (key, vs)
            })
            .collect(),
        bind_addresses: addrs
            .iter()
            .map(|&a| IpAddr::from([10, 96, 0, a]))
            .collect(),
        health_check_node_port: hc.map(|port| {
            let hc = HealthCheckNodePort {
                namespace: ns.into(),
                name: name.into(),
                local_ready_endpoints: 1,
            };
            (port, hc)
        }),
        no_local_endpoints_internal: vss.len().is_multiple_of(2),
        no_local_endpoints_external: !addrs.len().is_multiple_of(2),
        terminating_fallback: hc.is_some(),
        set_elements: addrs
            .iter()
            .map(|&a| SetElement::ServiceIp(IpAddr::from([10, 96, 0, a])))
            .chain(vss.iter().flat_map(|&(port, _)| {
                // Elements derived from the virtual server, different per Service.
                let key = VirtualServerKey {
                    address: "10.96.0.1".parse().unwrap(),
                    port,
                    protocol: Protocol::Tcp,
                };
                let range = format!("192.0.{}.0/24", name.len() + ns.len())
                    .parse()
                    .unwrap();
                let external = if name < "c" {
                    SetElement::External(key)
                } else {
                    SetElement::ExternalLocal(key)
                };
                [external, SetElement::FirewallAllow(key, range)]
            }))
            .collect(),
        problems: vec![],
        ..ServicePlan::default()
    }
}

/// A Service whose externalIP is another Service's ClusterIP or load-balancer IP does not
/// take that virtual server (and its elements: source ranges, traffic policy), whatever the
/// names and the order of updates; among equal claims the older Service keeps it.
#[test]
fn an_external_ip_never_takes_a_cluster_ip_or_load_balancer_virtual_server() {
    let owner = {
        let mut plan = plan_for("z", "lb", &[(80, 1)], &[], None);
        plan.created = Some(2_000);
        plan
    };
    let thief = {
        let mut plan = plan_for("a", "thief", &[(80, 0)], &[], None);
        plan.created = Some(1_000);
        plan.external_ip_virtual_servers = plan.virtual_servers.keys().copied().collect();
        plan
    };
    let z = ("z".to_owned(), "lb".to_owned());
    let a = ("a".to_owned(), "thief".to_owned());
    let owned = |index: &DesiredIndex| {
        let vs = index.desired().virtual_servers.values().next().unwrap();
        (vs.service.to_string(), index.desired().set_elements.clone())
    };
    let expected = (
        "z/lb:p".to_owned(),
        owner.set_elements.iter().copied().collect::<BTreeSet<_>>(),
    );
    for order in [[&a, &z], [&z, &a]] {
        let mut index = DesiredIndex::default();
        for key in order {
            let plan = if key == &a { &thief } else { &owner };
            index.update(key.clone(), Some(plan.clone()));
        }
        assert_eq!(owned(&index), expected, "{order:?}");
        let problems: Vec<String> = index
            .problems_of(&a)
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("already used by z/lb:p"),
            "{problems:?}"
        );
    }
    let mut builder = IndexBuilder::default();
    builder.push(a.clone(), Some(thief.clone()));
    builder.push(z.clone(), Some(owner.clone()));
    assert_eq!(owned(&builder.finish()), expected);

    // Two equal claims (neither an externalIP): the older Service, not the first name.
    let mut older = owner.clone();
    older.created = Some(500);
    let mut newer = thief.clone();
    newer.external_ip_virtual_servers.clear();
    let mut index = DesiredIndex::default();
    index.update(a.clone(), Some(newer.clone()));
    index.update(z.clone(), Some(older.clone()));
    assert_eq!(owned(&index).0, "z/lb:p");
}

/// Two Services on one virtual server with different traffic policies and source ranges:
/// the set elements derived from it are the winner's only, whatever the order of updates,
/// and the other's take over when the winner goes.
#[test]
fn conflict_is_decided_once_for_a_virtual_server_and_its_elements() {
    let k = VirtualServerKey {
        address: "203.0.113.77".parse().unwrap(),
        port: 443,
        protocol: Protocol::Tcp,
    };
    let plan = |ns: &str, local: bool, range: &str| {
        let mut plan = plan_for(ns, ns, &[], &[], None);
        let vs = plan_for(ns, ns, &[(443, 1)], &[], None).virtual_servers;
        plan.virtual_servers = [(k, vs.into_values().next().unwrap())].into();
        plan.set_elements = [
            if local {
                SetElement::ExternalLocal(k)
            } else {
                SetElement::External(k)
            },
            SetElement::Firewall(k),
            SetElement::FirewallAllow(k, range.parse().unwrap()),
            SetElement::ServiceIp(k.address),
        ]
        .into();
        plan
    };
    let alpha = plan("a", true, "198.51.100.0/24");
    let beta = plan("b", false, "192.0.2.0/24");
    let a = ("a".to_owned(), "alpha".to_owned());
    let b = ("b".to_owned(), "beta".to_owned());
    for order in [[&a, &b], [&b, &a]] {
        let mut index = DesiredIndex::default();
        for key in order {
            let plan = if key == &a { &alpha } else { &beta };
            index.update(key.clone(), Some(plan.clone()));
        }
        assert_eq!(
            index.desired().set_elements,
            alpha.set_elements,
            "{order:?}"
        );
        // The winner goes: the other's elements replace its own, reported as touched.
        let touched = index.update(a.clone(), None);
        assert_eq!(index.desired().set_elements, beta.set_elements);
        let changed: BTreeSet<SetElement> = alpha
            .set_elements
            .symmetric_difference(&beta.set_elements)
            .copied()
            .collect();
        assert!(changed.is_subset(&touched.set_elements));
        index.update(a.clone(), Some(alpha.clone()));
        assert_eq!(index.desired().set_elements, alpha.set_elements);
        index.update(b.clone(), None);
        assert_eq!(index.desired().set_elements, alpha.set_elements);
    }
}

/// `index` with every lost entry written out ([`Slot::SameAs`] as the [`Slot::Lost`] it
/// stands for): the builder shares fewer lost entries than updates do when a claim that
/// outranks the first in key order takes a virtual server over.
fn shared_as_lost(index: &DesiredIndex) -> DesiredIndex {
    let mut index = index.clone();
    for plan in index.plans.values_mut() {
        for at in 0..plan.virtual_servers.len() {
            if let Slot::SameAs(other) = plan.virtual_servers[at].slot {
                let Own { vs, slot, .. } = &plan.virtual_servers[other as usize];
                let entry = match slot {
                    Slot::Won => index.desired.virtual_servers[vs].clone(),
                    Slot::Lost(entry) => (**entry).clone(),
                    Slot::SameAs(_) => unreachable!("a SameAs slot names a won one"),
                };
                plan.virtual_servers[at].slot = Slot::Lost(Box::new(entry));
            }
        }
    }
    index
}

fn arb_update() -> impl Strategy<Value = (usize, Option<ServicePlan>)> {
    let names = ["a", "b", "c", "d"];
    (
        0usize..4,
        prop::option::weighted(
            0.8,
            (
                prop::collection::vec((prop::sample::select(vec![80u16, 81, 82]), 0u32..2), 0..3),
                prop::collection::vec(1u8..4, 0..3),
                prop::option::of(prop::sample::select(vec![30000u16, 30001])),
                prop::option::of(0i64..3),
                prop::collection::btree_set(prop::sample::select(vec![80u16, 81, 82]), 0..2),
            ),
        ),
    )
        .prop_map(move |(i, content)| {
            let plan = content.map(|(vss, addrs, hc, created, external_ip)| {
                let mut plan = plan_for("ns", names[i], &vss, &addrs, hc);
                plan.created = created;
                plan.external_ip_virtual_servers = plan
                    .virtual_servers
                    .keys()
                    .filter(|k| external_ip.contains(&k.port))
                    .copied()
                    .collect();
                plan
            });
            (i, plan)
        })
}

proptest! {
    /// The builder's index is the one `update` builds from the same plans in key order:
    /// the same desired state, claims, stored plans (with their won, lost and shared
    /// entries), counts and problems.
    #[test]
    fn the_builder_equals_updates_in_key_order(updates in prop::collection::vec(arb_update(), 1..12)) {
        let names = ["a", "b", "c", "d"];
        let mut plans: BTreeMap<usize, Option<ServicePlan>> = BTreeMap::new();
        for (i, plan) in updates {
            plans.insert(i, plan);
        }
        let key = |i: usize| ("ns".to_owned(), names[i].to_owned());
        let mut updated = DesiredIndex::default();
        let mut builder = IndexBuilder::default();
        for (i, plan) in &plans {
            updated.update(key(*i), plan.clone());
            builder.push(key(*i), plan.clone());
        }
        let built = builder.finish();
        prop_assert_eq!(format!("{:?}", shared_as_lost(&built)), format!("{:?}", shared_as_lost(&updated)));
        prop_assert_eq!(built.to_plan(), updated.to_plan());
    }

    /// After any sequence of updates the index equals `merge` of the final plans, every
    /// change to the desired state was reported as touched, and the real server count
    /// kept by the index is the one counted.
    #[test]
    fn incremental_updates_match_a_full_merge(updates in prop::collection::vec(arb_update(), 1..20)) {
        let names = ["a", "b", "c", "d"];
        let mut index = DesiredIndex::default();
        let mut current: BTreeMap<usize, ServicePlan> = BTreeMap::new();
        for (i, plan) in updates {
            let before = index.desired().clone();
            let touched = index.update(("ns".into(), names[i].into()), plan.clone());
            match plan {
                Some(p) => current.insert(i, p),
                None => current.remove(&i),
            };
            let after = index.desired();
            let changed_vs = before.virtual_servers.keys().chain(after.virtual_servers.keys())
                .filter(|k| before.virtual_servers.get(*k) != after.virtual_servers.get(*k));
            for k in changed_vs {
                prop_assert!(touched.virtual_servers.contains(k), "{} not touched", k);
            }
            for a in before.bind_addresses.symmetric_difference(&after.bind_addresses) {
                prop_assert!(touched.addresses.contains(a));
            }
            for e in before.set_elements.symmetric_difference(&after.set_elements) {
                prop_assert!(touched.set_elements.contains(e));
            }
            let hc = (&before.health_check_node_ports, &after.health_check_node_ports);
            for port in hc.0.keys().chain(hc.1.keys()).filter(|p| hc.0.get(*p) != hc.1.get(*p)) {
                prop_assert!(touched.health_check_node_ports.contains(port));
            }
            let counted: usize = after.virtual_servers.values().map(|vs| vs.real_servers.len()).sum();
            prop_assert_eq!(index.real_servers(), counted);
            prop_assert_eq!(index.to_plan(), merge(current.values()));
        }
    }
}

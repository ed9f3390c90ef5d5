//! Unit tests of `proxier/src/engine/syncer.rs`.

use super::*;
use crate::dataplane::fake::FakeDataplane;
use crate::model::{Protocol, SetElement, VirtualServer, VirtualServerSpec};

const DRAIN: Duration = Duration::from_secs(900);

fn key(port: u16) -> VirtualServerKey {
    VirtualServerKey {
        address: "10.96.0.10".parse().unwrap(),
        port,
        protocol: Protocol::Tcp,
    }
}

fn state(backends: &[&str]) -> DesiredState {
    let vs = VirtualServer {
        spec: VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: 0,
        },
        real_servers: backends.iter().map(|b| (b.parse().unwrap(), 1)).collect(),
        service: "default/web:http".into(),
    };
    DesiredState {
        virtual_servers: [(key(80), vs)].into(),
        bind_addresses: ["10.96.0.10".parse().unwrap()].into(),
        ..Default::default()
    }
}

fn set_connections(syncer: &mut Syncer<FakeDataplane>, rs: &str, active: u32) {
    let vs = syncer
        .dataplane
        .state
        .virtual_servers
        .get_mut(&key(80))
        .unwrap();
    vs.real_servers
        .get_mut(&rs.parse().unwrap())
        .unwrap()
        .active_connections = active;
}

#[tokio::test]
async fn second_sync_is_a_no_op_and_restart_adopts() {
    let desired = state(&["10.244.1.2:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    let first = syncer.sync(&desired).await.unwrap();
    // The nftables rules, the virtual server, its real server, the address.
    assert_eq!(first.ops.len(), 4);
    assert!(matches!(first.ops[0], Op::WriteRules(_)));
    assert!(first.failures.is_empty());
    assert!(syncer.sync(&desired).await.unwrap().ops.is_empty());
    // A new process over the same kernel state changes nothing.
    let kernel = syncer.dataplane().state.clone();
    assert_eq!(kernel, ObservedState::from(&desired));
    let mut restarted = Syncer::new(FakeDataplane::new(kernel), Ownership::default(), DRAIN);
    assert!(restarted.sync(&desired).await.unwrap().ops.is_empty());
}

#[tokio::test]
async fn incremental_sync_touches_only_what_changed() {
    let before = state(&["10.244.1.2:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&before).await.unwrap();
    let after = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&after, &touched).await.unwrap();
    assert_eq!(
        report.ops,
        [Op::AddRealServer {
            vs: key(80),
            rs: "10.244.1.3:8080".parse().unwrap(),
            weight: 1
        }]
    );
    assert_eq!(syncer.dataplane.state, ObservedState::from(&after));
    // The cache followed: a full sync finds nothing to do.
    assert!(syncer.sync(&after).await.unwrap().ops.is_empty());
}

#[tokio::test(start_paused = true)]
async fn draining_real_server_is_deleted_when_idle_or_after_max_drain() {
    let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let one = state(&["10.244.1.3:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.max_drain = Duration::from_secs(60);
    syncer.sync(&both).await.unwrap();
    set_connections(&mut syncer, "10.244.1.2:8080", 1);
    // Leaves the desired set with a live connection: weight 0, kept.
    let report = syncer.sync(&one).await.unwrap();
    assert_eq!(report.ops.len(), 1);
    assert_eq!(syncer.drains().len(), 1);
    assert!(syncer.check_drains(&one).await.unwrap().ops.is_empty());
    // The connection ends: the next check deletes it.
    set_connections(&mut syncer, "10.244.1.2:8080", 0);
    let report = syncer.check_drains(&one).await.unwrap();
    assert!(matches!(report.ops[..], [Op::DeleteRealServer { .. }]));
    assert!(syncer.drains().is_empty());
    assert_eq!(syncer.dataplane.state, ObservedState::from(&one));

    // Again, but the connection never ends: deleted once max_drain passed.
    syncer.sync(&both).await.unwrap();
    set_connections(&mut syncer, "10.244.1.2:8080", 5);
    syncer.sync(&one).await.unwrap();
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(syncer.check_drains(&one).await.unwrap().ops.is_empty());
    tokio::time::advance(Duration::from_secs(2)).await;
    let report = syncer.check_drains(&one).await.unwrap();
    assert!(matches!(report.ops[..], [Op::DeleteRealServer { .. }]));
}

/// A node kube-proxy programmed: its virtual servers and real servers that kipvs wants are
/// adopted in place (a re-weight at most, never a delete and re-add), and its NodePort
/// virtual server on a local address that is not a node IP (docker0's here) drains: its
/// real server with a connection goes to weight 0, the one without goes, and the virtual
/// server goes with the last real server once the connection ended.
#[tokio::test]
async fn kube_proxys_table_is_adopted_in_place_and_its_other_node_ports_drain() {
    let desired = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let mut kernel = ObservedState::from(&desired);
    // kube-proxy left 10.244.1.3 at weight 0 (its graceful delete) and has a NodePort on
    // docker0's address with two real servers.
    let cluster = kernel.virtual_servers.get_mut(&key(80)).unwrap();
    let gracefully_deleted: SocketAddr = "10.244.1.3:8080".parse().unwrap();
    cluster
        .real_servers
        .get_mut(&gracefully_deleted)
        .unwrap()
        .weight = 0;
    let docker0 = VirtualServerKey {
        address: "172.17.0.1".parse().unwrap(),
        port: 30080,
        protocol: Protocol::Tcp,
    };
    let mut node_port = kernel.virtual_servers[&key(80)].clone();
    for (_, rs) in node_port.real_servers.iter_mut() {
        rs.weight = 1;
    }
    let busy: SocketAddr = "10.244.1.2:8080".parse().unwrap();
    node_port
        .real_servers
        .get_mut(&busy)
        .unwrap()
        .active_connections = 1;
    kernel.virtual_servers.insert(docker0, node_port);
    let ownership = Ownership {
        node_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_ips: ["192.168.1.5".parse().unwrap()].into(),
        node_port_range: Some(30000..=32767),
        local_addresses: [
            "172.17.0.1".parse().unwrap(),
            "192.168.1.5".parse().unwrap(),
        ]
        .into(),
        kube_proxy_node_ports: [(30080, Protocol::Tcp)].into(),
        ..Ownership::default()
    };
    let mut syncer = Syncer::new(FakeDataplane::new(kernel), ownership, DRAIN);
    let report = syncer.sync(&desired).await.unwrap();
    let ipvs: Vec<&Op> = report
        .ops
        .iter()
        .filter(|op| op.stage() != crate::dataplane::NFT_STAGE)
        .collect();
    let (vs, weight) = (key(80), 1);
    assert_eq!(
        ipvs,
        [
            &Op::DeleteRealServer {
                vs: docker0,
                rs: gracefully_deleted
            },
            &Op::UpdateRealServer {
                vs,
                rs: gracefully_deleted,
                weight
            },
            &Op::UpdateRealServer {
                vs: docker0,
                rs: busy,
                weight: 0
            },
        ]
    );
    assert_eq!(syncer.drains().len(), 1);
    // The connection ends: the real server goes, and its virtual server with it.
    syncer
        .dataplane
        .state
        .virtual_servers
        .get_mut(&docker0)
        .unwrap()
        .real_servers
        .get_mut(&busy)
        .unwrap()
        .active_connections = 0;
    let report = syncer.check_drains(&desired).await.unwrap();
    assert_eq!(
        report.ops,
        [
            Op::DeleteRealServer {
                vs: docker0,
                rs: busy
            },
            Op::DeleteVirtualServer(docker0)
        ]
    );
    assert!(syncer.drains().is_empty());
    assert_eq!(syncer.dataplane.state, ObservedState::from(&desired));
}

#[tokio::test]
async fn stale_udp_conntrack_entries_are_deleted_and_nothing_else() {
    use crate::dataplane::kernel::conntrack::UdpEntry;
    let udp = |port| VirtualServerKey {
        protocol: Protocol::Udp,
        port,
        ..key(port)
    };
    // UDP 53 has these backends; UDP 54 (untouched below) always has A.
    let with = |backends: &[&str]| {
        let mut d = state(&[]);
        let vs = |b: &[&str]| state(b).virtual_servers[&key(80)].clone();
        d.virtual_servers = [(udp(53), vs(backends)), (udp(54), vs(&["10.244.1.5:53"]))].into();
        d
    };
    let entry = |client: &str, reply: &str| UdpEntry {
        client: client.parse().unwrap(),
        destination: "10.96.0.10:53".parse().unwrap(),
        reply_source: reply.parse().unwrap(),
    };
    let on_a = entry("10.244.3.3:40000", "10.244.1.5:53");
    let on_b = entry("10.244.3.3:40001", "10.244.2.6:53");
    let foreign = UdpEntry {
        destination: "10.0.0.10:53".parse().unwrap(),
        ..on_a
    };
    // To UDP 54 but from B, which it never had (made before the Service existed).
    let untouched = UdpEntry {
        destination: "10.96.0.10:54".parse().unwrap(),
        ..on_b
    };
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.dataplane.conntrack = [on_a, on_b, foreign].into();
    // A (re)start clears nothing that still points at a wanted real server.
    let both = with(&["10.244.1.5:53", "10.244.2.6:53"]);
    assert_eq!(syncer.sync(&both).await.unwrap().conntrack.deleted, 0);
    assert_eq!(syncer.dataplane.conntrack.len(), 3);
    syncer.dataplane.conntrack.insert(untouched);
    // A's pod is replaced: its entry goes in the same sync, B's flow stays, and the sync
    // looks at UDP 53's entries only (UDP 54's stale one waits for the next full sync).
    let only_b = with(&["10.244.2.6:53"]);
    let touched = Scope {
        virtual_servers: [udp(53)].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&only_b, &touched).await.unwrap();
    assert_eq!(
        report.conntrack,
        CleanupReport {
            deleted: 1,
            failed: 0
        }
    );
    assert_eq!(
        syncer.dataplane.conntrack,
        [on_b, foreign, untouched].into()
    );
    // The Service goes away: every entry to its virtual server goes, nothing else.
    let mut gone = only_b.clone();
    gone.virtual_servers.remove(&udp(53));
    let report = syncer.sync_touched(&gone, &touched).await.unwrap();
    assert_eq!(report.conntrack.deleted, 1);
    assert_eq!(syncer.dataplane.conntrack, [foreign, untouched].into());
    // A sync that changes no UDP real server lists nothing; a full sync lists everything.
    let report = syncer.sync_touched(&gone, &touched).await.unwrap();
    assert_eq!(report.conntrack, CleanupReport::default());
    assert_eq!(syncer.sync(&gone).await.unwrap().conntrack.deleted, 1);
    assert_eq!(syncer.dataplane.conntrack, [foreign].into());
}

/// A connection opened after the cache was taken still makes the incremental sync drain
/// the real server, not delete it.
#[tokio::test]
async fn incremental_removal_drains_a_real_server_whose_connections_came_after_the_cache() {
    let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let one = state(&["10.244.1.3:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&both).await.unwrap();
    set_connections(&mut syncer, "10.244.1.2:8080", 1);
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&one, &touched).await.unwrap();
    assert_eq!(
        report.ops,
        [Op::UpdateRealServer {
            vs: key(80),
            rs: "10.244.1.2:8080".parse().unwrap(),
            weight: 0
        }]
    );
    assert_eq!(syncer.drains().len(), 1);
}

#[tokio::test]
async fn drained_real_server_wanted_again_returns_without_delete() {
    let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let one = state(&["10.244.1.3:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&both).await.unwrap();
    set_connections(&mut syncer, "10.244.1.2:8080", 1);
    syncer.sync(&one).await.unwrap();
    let report = syncer.sync(&both).await.unwrap();
    assert_eq!(
        report.ops,
        [Op::UpdateRealServer {
            vs: key(80),
            rs: "10.244.1.2:8080".parse().unwrap(),
            weight: 1
        }]
    );
    assert!(syncer.drains().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failed_op_leaves_only_its_entry_in_doubt_and_is_retried_with_backoff() {
    let mut desired = state(&["10.244.1.2:8080"]);
    let mut bad = desired.virtual_servers[&key(80)].clone();
    bad.spec.scheduler = "twos".into();
    desired.virtual_servers.insert(key(81), bad);
    let fake = FakeDataplane {
        missing_schedulers: ["twos".to_string()].into(),
        ..Default::default()
    };
    let mut syncer = Syncer::new(fake, Ownership::default(), DRAIN);
    let report = syncer.sync(&desired).await.unwrap();
    assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
    let in_doubt: Vec<Entry> = syncer.in_doubt().copied().collect();
    assert_eq!(in_doubt, [Entry::VirtualServer(key(81))]);
    let first_retry = syncer.next_retry().unwrap();
    assert_eq!(first_retry, Instant::now() + RETRY_FIRST);

    // Another virtual server changes: incremental, without observing the kernel again, and
    // the entry in doubt is left out until due (even when the change names it).
    let vs = desired.virtual_servers.get_mut(&key(80)).unwrap();
    let added = ("10.244.1.3:8080".parse().unwrap(), 1);
    vs.real_servers = vs
        .real_servers
        .iter()
        .map(|(a, &w)| (a, w))
        .chain([added])
        .collect();
    let touched = Scope {
        virtual_servers: [key(80), key(81)].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&desired, &touched).await.unwrap();
    assert!(matches!(report.ops[..], [Op::AddRealServer { vs, .. }] if vs == key(80)));
    assert!(report.failures.is_empty());
    assert_eq!(syncer.dataplane().full_observes, 1);

    // Due: retried alone (and fails again: the delay doubles).
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer
        .sync_touched(&desired, &Scope::default())
        .await
        .unwrap();
    assert!(matches!(report.ops[0], Op::AddVirtualServer(k, _) if k == key(81)));
    assert_eq!(report.failures.len(), 2);
    assert_eq!(syncer.next_retry(), Some(Instant::now() + 2 * RETRY_FIRST));
    // Not due: nothing to do.
    let report = syncer
        .sync_touched(&desired, &Scope::default())
        .await
        .unwrap();
    assert!(report.ops.is_empty());

    // The module is loaded: the next retry succeeds and nothing is in doubt any more.
    syncer.dataplane_mut().missing_schedulers.clear();
    tokio::time::advance(2 * RETRY_FIRST).await;
    let report = syncer
        .sync_touched(&desired, &Scope::default())
        .await
        .unwrap();
    assert!(report.failures.is_empty());
    assert_eq!(syncer.in_doubt().count(), 0);
    assert_eq!(syncer.next_retry(), None);
    assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
    assert_eq!(syncer.dataplane().full_observes, 1);
}

/// A virtual server whose deletion fails keeps its own set elements (kipvs's record of
/// owning it, and its firewall) until a retry has deleted it: an externalIP on another
/// interface is owned by its element alone, and would otherwise be orphaned.
#[tokio::test(start_paused = true)]
async fn a_failed_deletion_keeps_the_virtual_servers_elements_until_it_is_gone() {
    let external = VirtualServerKey {
        address: "192.168.0.99".parse().unwrap(),
        port: 443,
        protocol: Protocol::Tcp,
    };
    let mut desired = state(&["10.244.1.2:8080"]);
    let vs = desired.virtual_servers[&key(80)].clone();
    desired.virtual_servers.insert(external, vs);
    let elements = [
        SetElement::External(external),
        SetElement::Firewall(external),
    ];
    desired.set_elements.extend(elements);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    assert!(syncer.sync(&desired).await.unwrap().failures.is_empty());

    // The Service goes; the kernel's answer to the deletion is lost.
    let mut gone = desired.clone();
    gone.virtual_servers.remove(&external);
    gone.set_elements
        .retain(|e| e.virtual_server() != Some(external));
    let delete = Op::DeleteVirtualServer(external);
    syncer.dataplane_mut().lost_answers.push(delete.clone());
    let touched = Scope {
        virtual_servers: [external].into(),
        set_elements: elements.into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&gone, &touched).await.unwrap();
    let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
    assert_eq!(failed[0], &delete);
    assert_eq!(failed.len(), 3, "{failed:?}");
    let kernel = &syncer.dataplane().state.set_elements;
    assert!(
        elements.iter().all(|e| kernel.contains(e)),
        "the record stays"
    );

    // The retry finds it gone and deletes the elements.
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer.sync_touched(&gone, &Scope::default()).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(syncer.dataplane().state, ObservedState::from(&gone));
}

/// One Service's set element the kernel refuses (a `firewall-allow` interval inside another)
/// fails that Service alone: the other Service's elements and virtual servers land in the
/// same sync, and the refused Service's load-balancer virtual server is not added (fail
/// closed) until its elements are in; it is retried, and lands once the conflict is gone.
#[tokio::test(start_paused = true)]
async fn a_refused_set_element_fails_its_own_service_only_and_closed() {
    let mut desired = state(&["10.244.1.2:8080"]);
    let lb = VirtualServerKey {
        address: "10.0.5.100".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let mut onprem = desired.virtual_servers[&key(80)].clone();
    onprem.service = "ns1/onprem:http".into();
    desired.virtual_servers.insert(lb, onprem.clone());
    let inner = SetElement::FirewallAllow(lb, "10.0.5.100/32".parse().unwrap());
    desired.set_elements.extend([
        SetElement::ClusterIp(key(80)),
        SetElement::External(lb),
        SetElement::Firewall(lb),
        SetElement::FirewallAllow(lb, "10.0.0.0/8".parse().unwrap()),
        inner,
    ]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    let report = syncer.sync(&desired).await.unwrap();
    let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
    let rs = "10.244.1.2:8080".parse().unwrap();
    assert_eq!(
        failed,
        [
            &Op::AddSetElement(inner),
            &Op::AddVirtualServer(lb, onprem.spec.clone()),
            &Op::AddRealServer {
                vs: lb,
                rs,
                weight: 1
            },
        ]
    );
    let kernel = &syncer.dataplane().state;
    assert!(
        kernel.virtual_servers.contains_key(&key(80)),
        "the other Service landed"
    );
    assert!(
        !kernel.virtual_servers.contains_key(&lb),
        "no open load-balancer IP"
    );
    let mut landed = desired.set_elements.clone();
    landed.remove(&inner);
    assert_eq!(kernel.set_elements, landed);

    // The conflict is gone: the retry adds the virtual server.
    desired.set_elements.remove(&inner);
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer
        .sync_touched(&desired, &Scope::default())
        .await
        .unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
    assert_eq!(syncer.in_doubt().count(), 0);
}

/// An existing virtual server whose Service gains `loadBalancerSourceRanges` while the
/// kernel refuses its new `firewall` element would stay open to every source: it is
/// deleted in the same sync (fail closed) while the other Service's changes land, put in
/// doubt, kept out while the element keeps failing, and added again once it is in.
#[tokio::test(start_paused = true)]
async fn an_existing_virtual_server_whose_new_firewall_element_fails_is_deleted_until_it_is_in() {
    let lb = VirtualServerKey {
        address: "203.0.113.40".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let mut open = state(&["10.244.1.2:8080"]);
    let mut vs = open.virtual_servers[&key(80)].clone();
    vs.service = "ns1/lb:http".into();
    open.virtual_servers.insert(lb, vs.clone());
    open.bind_addresses.insert(lb.address);
    open.set_elements.insert(SetElement::External(lb));
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    assert!(syncer.sync(&open).await.unwrap().failures.is_empty());

    // The Service gains a source range and another Service a real server; the kernel
    // refuses the firewall element.
    let firewall = SetElement::Firewall(lb);
    let mut ranged = open.clone();
    ranged.set_elements.extend([
        firewall,
        SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap()),
    ]);
    let other = "10.244.1.3:8080".parse().unwrap();
    let grown = state(&["10.244.1.2:8080", "10.244.1.3:8080"]).virtual_servers[&key(80)].clone();
    ranged.virtual_servers.insert(key(80), grown);
    syncer.dataplane_mut().refusing = vec![Op::AddSetElement(firewall)];
    let touched = Scope {
        virtual_servers: [key(80), lb].into(),
        set_elements: ranged.set_elements.clone(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&ranged, &touched).await.unwrap();
    let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
    assert_eq!(failed, [&Op::AddSetElement(firewall)]);
    assert_eq!(report.ops.last(), Some(&Op::DeleteVirtualServer(lb)));
    let kernel = &syncer.dataplane().state;
    assert!(!kernel.virtual_servers.contains_key(&lb), "closed");
    assert!(
        kernel.virtual_servers[&key(80)]
            .real_servers
            .contains_key(&other),
        "the other Service's change landed"
    );
    assert!(syncer.in_doubt().any(|e| *e == Entry::VirtualServer(lb)));

    // Still refused at the retry: the virtual server is new now, and kept out.
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer
        .sync_touched(&ranged, &Scope::default())
        .await
        .unwrap();
    let failed: Vec<&str> = report.failures.iter().map(|f| f.op.name()).collect();
    assert_eq!(
        failed,
        ["AddSetElement", "AddVirtualServer", "AddRealServer"]
    );
    assert!(!syncer.dataplane().state.virtual_servers.contains_key(&lb));

    // The kernel takes the element: the virtual server is back, behind it.
    syncer.dataplane_mut().refusing.clear();
    tokio::time::advance(RETRY_FIRST * 2).await;
    let report = syncer
        .sync_touched(&ranged, &Scope::default())
        .await
        .unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(syncer.dataplane().state, ObservedState::from(&ranged));
    assert_eq!(syncer.in_doubt().count(), 0);
}

/// `firewall-allow` intervals are created (`NLM_F_EXCL`): the kernel refuses one that is
/// exactly present. When the cache is out of step with the kernel (the element is there,
/// the cache says not), that refusal counts as applied: no failure, nothing held back.
#[tokio::test]
async fn a_firewall_allow_element_already_in_the_kernel_is_applied_not_refused() {
    let lb = VirtualServerKey {
        address: "203.0.113.40".parse().unwrap(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let mut desired = state(&["10.244.1.2:8080"]);
    let mut vs = desired.virtual_servers[&key(80)].clone();
    vs.service = "ns1/lb:http".into();
    desired.virtual_servers.insert(lb, vs);
    let allow = SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap());
    desired
        .set_elements
        .extend([SetElement::Firewall(lb), allow]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&state(&["10.244.1.2:8080"])).await.unwrap();
    // Written behind the cache's back (as by an `nft` killed after the kernel committed).
    syncer.dataplane_mut().state.set_elements.insert(allow);
    let touched = Scope {
        virtual_servers: [lb].into(),
        set_elements: desired.set_elements.clone(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&desired, &touched).await.unwrap();
    assert!(report.ops.contains(&Op::AddSetElement(allow)));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
    assert_eq!(syncer.in_doubt().count(), 0);
    // And the overlap check is still there: a nested range is refused.
    let nested = SetElement::FirewallAllow(lb, "192.168.100.0/25".parse().unwrap());
    let failures = syncer
        .dataplane_mut()
        .apply(&[Op::AddSetElement(nested)])
        .await;
    assert_eq!(failures.len(), 1);
}

/// A new endpoint of an existing virtual server takes traffic before the main nftables
/// transaction (an `nft` run takes seconds in the end to end's VM), right after its own
/// hairpin element (an element-only transaction of its own); the old endpoint's real server
/// goes before its element. Real servers of a virtual server whose own masquerade element
/// changes wait for it.
#[tokio::test]
async fn endpoint_changes_reach_ipvs_before_the_nftables_transaction() {
    let with = |backends: &[&str], elements: &[SetElement]| DesiredState {
        set_elements: elements.iter().copied().collect(),
        ..state(backends)
    };
    let hairpin = |ip: &str| SetElement::Hairpin(ip.parse().unwrap());
    let (a, b) = ("10.244.1.2:8080", "10.244.1.3:8080");
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer
        .sync(&with(&[a], &[hairpin("10.244.1.2")]))
        .await
        .unwrap();
    // A first sync writes the rules: the hairpin element is part of that one transaction,
    // ahead of the new virtual server.
    let names: Vec<&str> = syncer.dataplane.applied.iter().map(Op::name).collect();
    assert_eq!(
        names,
        [
            "WriteRules",
            "AddSetElement",
            "AddVirtualServer",
            "AddRealServer",
            "BindAddress"
        ]
    );
    syncer.dataplane.applied.clear();
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        set_elements: [hairpin("10.244.1.2"), hairpin("10.244.1.3")].into(),
        ..Default::default()
    };
    let replaced = with(&[b], &[hairpin("10.244.1.3")]);
    syncer.sync_touched(&replaced, &touched).await.unwrap();
    let (a, b) = (a.parse().unwrap(), b.parse().unwrap());
    assert_eq!(
        syncer.dataplane.applied,
        [
            Op::DeleteRealServer { vs: key(80), rs: a },
            Op::AddSetElement(hairpin("10.244.1.3")),
            Op::AddRealServer {
                vs: key(80),
                rs: b,
                weight: 1
            },
            Op::DeleteSetElement(hairpin("10.244.1.2")),
        ]
    );
    // externalTrafficPolicy Local -> Cluster: the masquerade element first, then the
    // (remote) endpoint that needs it.
    syncer.dataplane.applied.clear();
    let external = SetElement::External(key(80));
    let mut cluster = with(&[b.to_string().as_str(), "10.244.2.9:8080"], &[external]);
    cluster.set_elements.insert(hairpin("10.244.1.3"));
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        set_elements: [external].into(),
        ..Default::default()
    };
    syncer.sync_touched(&cluster, &touched).await.unwrap();
    assert_eq!(
        syncer.dataplane.applied,
        [
            Op::AddSetElement(external),
            Op::AddRealServer {
                vs: key(80),
                rs: "10.244.2.9:8080".parse().unwrap(),
                weight: 1
            },
        ]
    );
    assert_eq!(syncer.dataplane.state, ObservedState::from(&cluster));
}

#[tokio::test(start_paused = true)]
async fn an_address_op_whose_answer_was_lost_is_re_read_before_its_retry() {
    let desired = state(&["10.244.1.2:8080"]);
    let address: IpAddr = "10.96.0.10".parse().unwrap();
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&desired).await.unwrap();
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        addresses: [address].into(),
        ..Default::default()
    };
    // The Service goes: the unbind is applied, but its answer is lost (`ENOBUFS`).
    syncer.dataplane_mut().lost_answers = vec![Op::UnbindAddress(address)];
    let gone = DesiredState::default();
    let report = syncer.sync_touched(&gone, &touched).await.unwrap();
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert!(!syncer.dataplane().state.bound_addresses.contains(&address));
    // It comes back before the retry is due: the address is left out until then.
    syncer.sync_touched(&desired, &touched).await.unwrap();
    assert!(!syncer.dataplane().state.bound_addresses.contains(&address));
    // Due: the address is re-read (unbound, whatever the failed op left in the cache) and
    // bound again.
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer
        .sync_touched(&desired, &Scope::default())
        .await
        .unwrap();
    assert_eq!(report.ops, [Op::BindAddress(address)]);
    assert!(syncer.dataplane().state.bound_addresses.contains(&address));
    assert_eq!(syncer.in_doubt().count(), 0);
    assert_eq!(syncer.dataplane().full_observes, 1);
}

#[tokio::test(start_paused = true)]
async fn a_set_element_deletion_whose_answer_was_lost_is_re_read_before_its_retry() {
    let element = SetElement::ServiceIp("10.96.0.10".parse().unwrap());
    let mut desired = state(&["10.244.1.2:8080"]);
    desired.set_elements.insert(element);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&desired).await.unwrap();
    // The element goes: deleted, but the answer is lost.
    syncer.dataplane_mut().lost_answers = vec![Op::DeleteSetElement(element)];
    let mut gone = desired.clone();
    gone.set_elements.remove(&element);
    let touched = Scope {
        set_elements: [element].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&gone, &touched).await.unwrap();
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    // Due: re-read (gone), so nothing is deleted again (a deletion of a missing element
    // fails) and the entry leaves doubt.
    tokio::time::advance(RETRY_FIRST).await;
    let report = syncer.sync_touched(&gone, &Scope::default()).await.unwrap();
    assert!(report.ops.is_empty(), "{:?}", report.ops);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(syncer.in_doubt().count(), 0);
}

#[tokio::test]
async fn drains_are_tracked_by_incremental_syncs_where_they_look() {
    let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
    let one = state(&["10.244.1.3:8080"]);
    let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
    syncer.sync(&both).await.unwrap();
    set_connections(&mut syncer, "10.244.1.2:8080", 1);
    // The periodic full sync reads the connection into the cache.
    assert!(syncer.sync(&both).await.unwrap().ops.is_empty());
    let touched = Scope {
        virtual_servers: [key(80)].into(),
        ..Default::default()
    };
    let report = syncer.sync_touched(&one, &touched).await.unwrap();
    assert!(matches!(
        report.ops[..],
        [Op::UpdateRealServer { weight: 0, .. }]
    ));
    assert_eq!(syncer.drains().len(), 1);
    // A sync that does not look at that virtual server keeps its drain.
    syncer.sync_touched(&one, &Scope::default()).await.unwrap();
    assert_eq!(syncer.drains().len(), 1);
    // Wanted again: the drain ends.
    syncer.sync_touched(&both, &touched).await.unwrap();
    assert!(syncer.drains().is_empty());
}

//! Unit tests of `proxier/src/plan/endpoints.rs`.

use super::*;
use crate::model::objects::Interner;
use crate::source::convert;
use k8s_openapi::api::discovery::v1::{
    Endpoint as ApiEndpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// [`collect`] of API slices, converted as the store does.
fn collect_api(
    slices: &[&EndpointSlice],
    node_name: &str,
    zone: Option<&str>,
    problems: &mut Vec<Problem>,
) -> EndpointsByPort {
    let mut strings = Interner::default();
    let slices: Vec<SliceInfo> = slices
        .iter()
        .map(|slice| convert::slice(slice, &mut strings))
        .collect();
    let slices: Vec<&SliceInfo> = slices.iter().collect();
    collect(&slices, node_name, zone, problems)
}

fn ep(last: u8, ready: bool, serving: bool, terminating: bool, local: bool) -> Endpoint {
    Endpoint {
        address: SocketAddr::from(([10, 0, 1, last], 80)),
        ready,
        serving,
        terminating,
        local,
        zone_hint: Hint::Absent,
        node_hint: Hint::Absent,
    }
}

fn weights(selection: &Selection) -> Vec<(u8, u32)> {
    selection
        .real_servers
        .iter()
        .map(|(addr, &w)| match addr.ip() {
            IpAddr::V4(v4) => (v4.octets()[3], w),
            IpAddr::V6(_) => unreachable!(),
        })
        .collect()
}

/// The categorization matrix: every combination of the three conditions, alone and next to
/// a ready endpoint, with the gate on and off.
#[test]
fn condition_matrix() {
    // (ready, serving, terminating) → weight alone (gate on), weight next to a ready one
    // (gate on), weight with the gate off. None: not a real server.
    type Weight = Option<u32>;
    type Row = ((bool, bool, bool), Weight, Weight, Weight);
    let matrix: [Row; 8] = [
        ((true, true, false), Some(1), Some(1), Some(1)),
        // ready+terminating cannot come from the API server, but nil `ready` defaults to
        // true: kube-proxy treats such an endpoint as ready, so does kipvs.
        ((true, true, true), Some(1), Some(1), Some(1)),
        ((true, false, false), Some(1), Some(1), Some(1)),
        ((true, false, true), Some(1), Some(1), Some(1)),
        ((false, true, true), Some(1), Some(0), None),
        ((false, true, false), None, None, None),
        ((false, false, true), None, None, None),
        ((false, false, false), None, None, None),
    ];
    for ((ready, serving, terminating), alone, with_ready, gate_off) in matrix {
        let case = format!("ready={ready} serving={serving} terminating={terminating}");
        let subject = ep(2, ready, serving, terminating, false);
        let other_ready = ep(1, true, true, false, false);

        let only = select([subject].iter(), true, Topology::All);
        assert_eq!(
            only.real_servers.get(&subject.address).copied(),
            alone,
            "{case} alone"
        );
        assert_eq!(only.fallback, alone.is_some() && !ready, "{case} fallback");

        let both = select([other_ready, subject].iter(), true, Topology::All);
        assert_eq!(
            both.real_servers.get(&subject.address).copied(),
            with_ready,
            "{case}"
        );
        assert_eq!(
            both.real_servers.get(&other_ready.address),
            Some(&1),
            "{case}"
        );
        assert!(!both.fallback, "{case}");

        for neighbours in [vec![subject], vec![other_ready, subject]] {
            let off = select(neighbours.iter(), false, Topology::All);
            assert_eq!(
                off.real_servers.get(&subject.address).copied(),
                gate_off,
                "{case}"
            );
            assert!(!off.fallback, "{case} gate off");
        }
    }
}

#[test]
fn empty_scope_selects_nothing() {
    let selection = select([].iter(), true, Topology::All);
    assert!(selection.is_empty());
    assert!(!selection.fallback);
    let not_serving = [ep(1, false, false, true, true)];
    assert_eq!(
        select(not_serving.iter(), true, Topology::All),
        Selection::default()
    );
}

#[test]
fn fallback_selects_all_serving_terminating() {
    let endpoints = [
        ep(1, false, true, true, true),
        ep(2, false, true, true, false),
        ep(3, false, false, true, true),
        ep(4, false, false, false, false),
    ];
    let selection = select(endpoints.iter(), true, Topology::All);
    assert_eq!(weights(&selection), vec![(1, 1), (2, 1)]);
    assert!(selection.fallback);
}

/// An endpoint with zone and node hints, for a node named `test-node` in `zone`.
fn hinted(
    last: u8,
    (ready, terminating): (bool, bool),
    zone: Option<&str>,
    for_zones: &[&str],
    for_nodes: &[&str],
) -> Endpoint {
    Endpoint {
        zone_hint: Hint::of(for_zones.iter().copied(), zone),
        node_hint: Hint::of(for_nodes.iter().copied(), Some("test-node")),
        ..ep(last, ready, ready || terminating, terminating, false)
    }
}

/// The topology cases of kube-proxy's `TestCategorizeEndpoints`
/// (`pkg/proxy/topology_test.go`), cluster-wide set only (local sets ignore topology: see
/// the `topology-traffic-policy-local` vector), plus the node-hint cases of
/// `topologyModeFromHints` (KEP-3015 `PreferSameNode`) and kipvs's weight-0 terminating
/// endpoints.
#[test]
fn topology_matrix() {
    const READY: (bool, bool) = (true, false);
    const NOT_READY: (bool, bool) = (false, false);
    const TERMINATING: (bool, bool) = (false, true);
    type Row<'a> = (u8, (bool, bool), &'a [&'a str], &'a [&'a str]);
    // (upstream case, node zone, endpoints, expected topology, expected (last octet, weight))
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Vec<Row<'a>>,
        Topology,
        Vec<(u8, u32)>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "hints used: all ready endpoints hinted, some for the node's zone",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &[]),
                (4, READY, &["zone-b"], &[]),
                (5, READY, &["zone-c"], &[]),
                (6, READY, &["zone-a"], &[]),
            ],
            Topology::SameZone,
            vec![(3, 1), (6, 1)],
        ),
        (
            "empty node labels",
            None,
            vec![(3, READY, &["zone-a"], &[])],
            Topology::All,
            vec![(3, 1)],
        ),
        (
            "node in different zone, no endpoint filtering",
            Some("zone-b"),
            vec![(3, READY, &["zone-a"], &[])],
            Topology::All,
            vec![(3, 1)],
        ),
        (
            "unready endpoint",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &[]),
                (4, READY, &["zone-b"], &[]),
                (5, READY, &["zone-c"], &[]),
                (6, NOT_READY, &["zone-a"], &[]),
            ],
            Topology::SameZone,
            vec![(3, 1)],
        ),
        (
            "only unready endpoints in same zone (should not filter)",
            Some("zone-a"),
            vec![
                (3, NOT_READY, &["zone-a"], &[]),
                (4, READY, &["zone-b"], &[]),
                (5, READY, &["zone-c"], &[]),
                (6, NOT_READY, &["zone-a"], &[]),
            ],
            Topology::All,
            vec![(4, 1), (5, 1)],
        ),
        (
            "missing hints, no filtering applied",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &[]),
                (4, READY, &["zone-b"], &[]),
                (5, READY, &[], &[]),
                (6, READY, &["zone-a"], &[]),
            ],
            Topology::All,
            vec![(3, 1), (4, 1), (5, 1), (6, 1)],
        ),
        (
            "multiple hints per endpoint, filtering includes any endpoint with zone included",
            Some("zone-c"),
            vec![
                (3, READY, &["zone-a", "zone-b", "zone-c"], &[]),
                (4, READY, &["zone-b", "zone-c"], &[]),
                (5, READY, &["zone-b", "zone-d"], &[]),
                (6, READY, &["zone-c"], &[]),
            ],
            Topology::SameZone,
            vec![(3, 1), (4, 1), (6, 1)],
        ),
        (
            "PreferSameNode: all ready endpoints have node hints, one for this node",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &["test-node"]),
                (4, READY, &["zone-a"], &["node-2"]),
                (5, READY, &["zone-b"], &["node-3"]),
            ],
            Topology::SameNode,
            vec![(3, 1)],
        ),
        (
            "PreferSameNode: no node hint for this node, zone hints used",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &["node-2"]),
                (4, READY, &["zone-b"], &["node-3"]),
            ],
            Topology::SameZone,
            vec![(3, 1)],
        ),
        (
            "PreferSameNode: an endpoint without node hints, zone hints used",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &["test-node"]),
                (4, READY, &["zone-a"], &[]),
                (5, READY, &["zone-b"], &["node-3"]),
            ],
            Topology::SameZone,
            vec![(3, 1), (4, 1)],
        ),
        (
            "PreferSameNode: node hints without zone hints",
            None,
            vec![
                (3, READY, &[], &["test-node"]),
                (4, READY, &[], &["node-2"]),
            ],
            Topology::SameNode,
            vec![(3, 1)],
        ),
        (
            "fallback to serving+terminating endpoints ignores topology",
            Some("zone-a"),
            vec![
                (3, TERMINATING, &[], &[]),
                (4, TERMINATING, &["zone-b"], &[]),
            ],
            Topology::All,
            vec![(3, 1), (4, 1)],
        ),
        (
            "kipvs: serving+terminating endpoints stay at weight 0 whatever their hints",
            Some("zone-a"),
            vec![
                (3, READY, &["zone-a"], &[]),
                (4, READY, &["zone-b"], &[]),
                (5, TERMINATING, &[], &[]),
            ],
            Topology::SameZone,
            vec![(3, 1), (5, 0)],
        ),
    ];
    for (name, zone, rows, topology, expected) in cases {
        let endpoints: Vec<Endpoint> = rows
            .into_iter()
            .map(|(last, state, zones, nodes)| hinted(last, state, zone, zones, nodes))
            .collect();
        assert_eq!(Topology::from_hints(endpoints.iter()), topology, "{name}");
        let selection = select(endpoints.iter(), true, topology);
        assert_eq!(weights(&selection), expected, "{name}");
    }
}

#[test]
fn hints_relative_to_this_node() {
    assert_eq!(Hint::of([], Some("zone-a")), Hint::Absent);
    assert_eq!(Hint::of(["zone-b"], Some("zone-a")), Hint::Elsewhere);
    assert_eq!(Hint::of(["zone-b", "zone-a"], Some("zone-a")), Hint::Here);
    // A node without a zone matches no zone hint (upstream: "" is never a hinted zone).
    assert_eq!(Hint::of(["zone-a"], None), Hint::Elsewhere);
}

fn slice(name: &str, endpoints: Vec<ApiEndpoint>, ports: Vec<EndpointPort>) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        ports: Some(ports),
    }
}

fn api_endpoint(address: &str, conditions: EndpointConditions, node: &str) -> ApiEndpoint {
    ApiEndpoint {
        addresses: vec![address.into()],
        conditions: Some(conditions),
        node_name: Some(node.into()),
        ..Default::default()
    }
}

fn port(name: Option<&str>, number: i32, protocol: Option<&str>) -> EndpointPort {
    EndpointPort {
        name: name.map(Into::into),
        port: Some(number),
        protocol: protocol.map(Into::into),
        ..Default::default()
    }
}

#[test]
fn collect_reads_conditions_ports_and_locality() {
    let unset = EndpointConditions::default();
    let terminating = EndpointConditions {
        ready: Some(false),
        serving: Some(true),
        terminating: Some(true),
    };
    let not_ready_serving_unset = EndpointConditions {
        ready: Some(false),
        ..Default::default()
    };
    let a = slice(
        "a",
        vec![
            api_endpoint("10.0.1.1", unset.clone(), "test-node"),
            api_endpoint("10.0.1.2", terminating.clone(), "other"),
            api_endpoint("10.0.1.3", not_ready_serving_unset, "other"),
            api_endpoint("not-an-ip", unset.clone(), "other"),
        ],
        vec![port(Some("http"), 8080, None), port(None, 53, Some("UDP"))],
    );
    // The same address in a second slice, ready there: the ready entry wins.
    let b = slice(
        "b",
        vec![api_endpoint("10.0.1.2", unset, "other")],
        vec![
            port(Some("http"), 8080, Some("TCP")),
            port(Some("x"), 70000, None),
        ],
    );
    let mut problems = Vec::new();
    let by_port = collect_api(&[&a, &b], "test-node", None, &mut problems);
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "EndpointSlice ns/a: endpoints[3].addresses[0] \"not-an-ip\" is not a valid IP address",
            "EndpointSlice ns/b: ports[1].port 70000 is out of range",
        ]
    );
    let http = &by_port[&("http".into(), Protocol::Tcp)];
    assert_eq!(
        http,
        &[
            Endpoint {
                address: "10.0.1.1:8080".parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                local: true,
                zone_hint: Hint::Absent,
                node_hint: Hint::Absent,
            },
            Endpoint {
                address: "10.0.1.2:8080".parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                local: false,
                zone_hint: Hint::Absent,
                node_hint: Hint::Absent,
            },
            Endpoint {
                address: "10.0.1.3:8080".parse().unwrap(),
                ready: false,
                serving: false,
                terminating: false,
                local: false,
                zone_hint: Hint::Absent,
                node_hint: Hint::Absent,
            },
        ]
    );
    let dns = &by_port[&("".into(), Protocol::Udp)];
    assert_eq!(dns.len(), 3);
    assert!(dns[1].terminating && dns[1].serving && !dns[1].ready);
    assert_eq!(by_port.len(), 2);
}

#[test]
fn collect_checks_the_address_type_and_reads_hints() {
    let yaml = |text: &str| -> EndpointSlice { serde_saphyr::from_str(text).unwrap() };
    let v4 = yaml(
        "metadata: {name: v4, namespace: ns}\naddressType: IPv4\n\
             endpoints:\n\
             - addresses: [10.0.1.1]\n  hints: {forZones: [{name: zone-a}], forNodes: [{name: test-node}]}\n\
             - addresses: [10.0.1.2]\n  hints: {forZones: [{name: zone-b}], forNodes: [{name: other}]}\n\
             - addresses: [10.0.1.3]\n  hints: {forZones: []}\n\
             - addresses: [\"fd00::4\"]\n\
             ports: [{port: 80}]",
    );
    let v6 = yaml(
        "metadata: {name: v6, namespace: ns}\naddressType: IPv6\n\
             endpoints: [{addresses: [\"fd00::1\"]}, {addresses: [10.0.1.9]}]\nports: [{port: 80}]",
    );
    let odd = yaml(
        "metadata: {name: odd, namespace: ns}\naddressType: IPX\n\
             endpoints: [{addresses: [10.0.1.8]}]\nports: [{port: 80}]",
    );
    let fqdn = yaml(
        "metadata: {name: fqdn, namespace: ns}\naddressType: FQDN\n\
             endpoints: [{addresses: [db.example]}]\nports: [{port: 80}]",
    );
    let mut problems = Vec::new();
    let by_port = collect_api(
        &[&v4, &v6, &odd, &fqdn],
        "test-node",
        Some("zone-a"),
        &mut problems,
    );
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "EndpointSlice ns/v4: endpoints[3].addresses[0] \"fd00::4\" does not match \
                 addressType IPv4; ignored",
            "EndpointSlice ns/v6: endpoints[1].addresses[0] \"10.0.1.9\" does not match \
                 addressType IPv6; ignored",
            "EndpointSlice ns/odd: addressType \"IPX\" is unknown (expected IPv4, IPv6 or \
                 FQDN); slice ignored",
        ]
    );
    let endpoints = &by_port[&("".into(), Protocol::Tcp)];
    let hints: Vec<(String, Hint, Hint)> = endpoints
        .iter()
        .map(|e| (e.address.ip().to_string(), e.zone_hint, e.node_hint))
        .collect();
    assert_eq!(
        hints,
        [
            ("10.0.1.1".into(), Hint::Here, Hint::Here),
            ("10.0.1.2".into(), Hint::Elsewhere, Hint::Elsewhere),
            ("10.0.1.3".into(), Hint::Absent, Hint::Absent),
            ("fd00::1".into(), Hint::Absent, Hint::Absent),
        ]
    );
}

//! Text renderings of a [`DesiredState`]: `ipvsadm -Sn` rules, the nftables set elements in
//! `nft` syntax, and JSON.
//!
//! [`ipvsadm`] prints exactly what `ipvsadm -Sn` (ipvsadm 1.31, `print_service_entry` with
//! `FMT_RULE | FMT_NUMERIC`) prints once the table is programmed, so the two can be compared
//! line for line:
//!
//! ```text
//! -A -t 10.96.0.10:53 -s rr -p 10800
//! -a -t 10.96.0.10:53 -r 10.244.1.2:53 -m -w 1
//! -A -u [fd00::a]:53 -s mh -b mh-port
//! -A --sctp-service 10.96.0.20:9999 -s rr
//! ```
//!
//! That is: `-A`, the protocol switch (`-t`, `-u`, `--sctp-service`), `address:port` (IPv6 in
//! brackets), `-s scheduler`, then `-p timeout` for persistent services (no `-M`: kipvs
//! programs full netmasks), then `-b flags` when a scheduler flag is set (`sh-fallback`,
//! `sh-port` for `sh`; `mh-fallback`, `mh-port` for `mh`; `flag-1..3` otherwise). Each
//! virtual server is followed by its real servers, `-a ... -r address:port -m -w weight`
//! (kipvs always masquerades).
//!
//! Order is ipvsadm's (`ipvs_cmp_services`, `ipvs_cmp_dests` in libipvs): virtual servers by
//! address family (IPv4 first), protocol (TCP, UDP, SCTP), address, port; real servers by
//! address, port. libipvs compares addresses by subtracting 32-bit words into an `int`, so
//! two addresses more than 2³¹ apart compare "backwards" (`192.168.0.1` sorts before
//! `10.96.0.1`). The order here reproduces that whenever it is well defined, i.e. whenever
//! the compared words all lie within half the 32-bit circle; otherwise (when ipvsadm's own
//! order depends on its sort algorithm and the kernel's listing order) it is numeric.

use crate::model::{DesiredState, Protocol, SchedFlags, SetElement, VirtualServer};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// `IP_VS_SVC_F_SCHED1`: `sh-fallback` / `mh-fallback` / `flag-1`.
const SCHED1: SchedFlags = 0x08;
/// `IP_VS_SVC_F_SCHED2`: `sh-port` / `mh-port` / `flag-2`.
const SCHED2: SchedFlags = 0x10;
/// `IP_VS_SVC_F_SCHED3`: `flag-3`.
const SCHED3: SchedFlags = 0x20;

/// The `ipvsadm -Sn` lines for `desired`'s virtual and real servers (bind addresses and
/// health-check ports have no ipvsadm form), each ending in a newline.
pub fn ipvsadm(desired: &DesiredState) -> String {
    let mut out = String::new();
    let services = ipvsadm_sorted(desired.virtual_servers.keys(), |key| {
        (protocol_number(key.protocol), key.address, key.port)
    });
    for key in services {
        let virtual_server = &desired.virtual_servers[key];
        let service = format!("{} {}", ipvsadm_switch(key.protocol), key.socket_addr());
        write_service_line(&mut out, &service, virtual_server);
        let real_servers = ipvsadm_sorted(virtual_server.real_servers.iter(), |(address, _)| {
            (0, address.ip(), address.port())
        });
        for (address, weight) in real_servers {
            let _ = writeln!(out, "-a {service} -r {address} -m -w {weight}");
        }
    }
    out
}

fn write_service_line(out: &mut String, service: &str, virtual_server: &VirtualServer) {
    let spec = &virtual_server.spec;
    let _ = write!(out, "-A {service} -s {}", spec.scheduler);
    if let Some(timeout) = spec.persistence_timeout {
        let _ = write!(out, " -p {timeout}");
    }
    if spec.sched_flags & (SCHED1 | SCHED2 | SCHED3) != 0 {
        // ipvsadm's print_sched_flags: names depend on the scheduler; unnamed bits print nothing.
        let names: &[(SchedFlags, &str)] = match &*spec.scheduler {
            "sh" => &[(SCHED1, "sh-fallback"), (SCHED2, "sh-port")],
            "mh" => &[(SCHED1, "mh-fallback"), (SCHED2, "mh-port")],
            _ => &[(SCHED1, "flag-1"), (SCHED2, "flag-2"), (SCHED3, "flag-3")],
        };
        let set: Vec<&str> = names
            .iter()
            .filter(|(bit, _)| spec.sched_flags & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        let _ = write!(out, " -b {}", set.join(","));
    }
    out.push('\n');
}

/// Kernel protocol numbers, which order ipvsadm's listing.
fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// Sorts `items` the way libipvs's comparators do, given each item's `(group, address,
/// port)`: by address family, then `group` (the protocol; 0 for real servers), then address
/// with libipvs's wrapping 32-bit word comparison, then port.
fn ipvsadm_sorted<T: Copy>(
    items: impl IntoIterator<Item = T>,
    key: impl Fn(T) -> (u8, IpAddr, u16),
) -> Vec<T> {
    struct Entry<T> {
        item: T,
        group: (bool, u8),
        words: Vec<u32>,
        port: u16,
    }
    let entries: Vec<Entry<T>> = items
        .into_iter()
        .map(|item| {
            let (group, address, port) = key(item);
            Entry {
                item,
                group: (address.is_ipv6(), group),
                words: address_words(address),
                port,
            }
        })
        .collect();
    let words: Vec<&[u32]> = entries.iter().map(|e| e.words.as_slice()).collect();
    let mut rotated = vec![Vec::new(); entries.len()];
    let mut groups: BTreeMap<(bool, u8), Vec<usize>> = BTreeMap::new();
    for (index, entry) in entries.iter().enumerate() {
        groups.entry(entry.group).or_default().push(index);
    }
    for indices in groups.values() {
        rotate_words(&words, indices, 0, &mut rotated);
    }
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| (entries[i].group, &rotated[i], entries[i].port);
        key(a).cmp(&key(b))
    });
    order.into_iter().map(|index| entries[index].item).collect()
}

/// An address as libipvs compares it: one host-order word for IPv4, four for IPv6.
fn address_words(address: IpAddr) -> Vec<u32> {
    match address {
        IpAddr::V4(v4) => vec![u32::from(v4)],
        IpAddr::V6(v6) => v6
            .octets()
            .chunks_exact(4)
            .map(|word| u32::from_be_bytes([word[0], word[1], word[2], word[3]]))
            .collect(),
    }
}

/// Appends to `rotated[i]` (for each `i` in `indices`) its word `level`, rotated so that
/// numeric order equals libipvs's wrapping order among these entries, then recurses into the
/// entries sharing each word value (libipvs only looks at the next word when this one ties).
fn rotate_words(words: &[&[u32]], indices: &[usize], level: usize, rotated: &mut [Vec<u32>]) {
    let Some(&first) = indices.first() else {
        return;
    };
    if level >= words[first].len() {
        return;
    }
    let mut by_value: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for &index in indices {
        by_value.entry(words[index][level]).or_default().push(index);
    }
    let start = circular_start(&by_value.keys().copied().collect::<Vec<_>>());
    for (value, same) in &by_value {
        for &index in same {
            rotated[index].push(value.wrapping_sub(start));
        }
        rotate_words(words, same, level + 1, rotated);
    }
}

/// libipvs compares words `a`, `b` by the sign of `(a - b)` as a 32-bit `int`: numeric order
/// rotated to start after the largest gap between the (sorted, distinct) `values`, provided
/// they all fit in less than half the circle. Otherwise that comparison is not an order at
/// all, and 0 (plain numeric order) is returned.
fn circular_start(values: &[u32]) -> u32 {
    if values.len() < 2 {
        return 0;
    }
    let (gap, start) = values
        .iter()
        .zip(values.iter().cycle().skip(1))
        .map(|(&value, &next)| (u64::from(next.wrapping_sub(value)), next))
        .max()
        .unwrap_or_default();
    if (1u64 << 32) - gap < 1u64 << 31 {
        start
    } else {
        0
    }
}

/// The `ipvsadm` switch selecting this protocol: `-t`, `-u` or `--sctp-service`.
fn ipvsadm_switch(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp => "--sctp-service",
    }
}

/// The set elements by set name, then element.
fn sorted_elements(desired: &DesiredState) -> impl Iterator<Item = &SetElement> {
    let mut elements: Vec<&SetElement> = desired.set_elements.iter().collect();
    elements.sort_by_key(|e| (e.set_name(), **e));
    elements.into_iter()
}

/// The elements of kipvs's nftables sets in `nft` syntax, one `add element` command per
/// element (`add element inet kipvs external { 203.0.113.77 . tcp . 443 }`), sorted by set
/// name then element: a file `nft -f` accepts once the table exists, and what
/// `nft list table inet kipvs` shows in its sets' `elements`.
pub fn nft(desired: &DesiredState) -> String {
    let mut text = String::new();
    for element in sorted_elements(desired) {
        writeln!(text, "add element inet kipvs {element}").expect("writing to a String");
    }
    text
}

/// `desired` as pretty-printed JSON: virtual servers (in virtual-server key order, real
/// servers by address), addresses to bind, health-check node ports, and the nftables set
/// elements in [`nft`]'s order (`{"set": ..., "element": ...}`, the element in `nft` syntax):
///
/// ```json
/// {
///   "virtualServers": [
///     {
///       "address": "10.96.0.10", "port": 53, "protocol": "UDP",
///       "scheduler": "rr", "persistenceTimeout": null, "schedFlags": 0,
///       "service": "kube-system/kube-dns:dns",
///       "realServers": [{"address": "10.244.1.2:53", "weight": 1}]
///     }
///   ],
///   "bindAddresses": ["10.96.0.10"],
///   "healthCheckNodePorts": [
///     {"port": 30000, "namespace": "default", "name": "web", "localReadyEndpoints": 1}
///   ],
///   "setElements": [{"set": "cluster-ips", "element": "10.96.0.10 . udp . 53"}]
/// }
/// ```
pub fn json(desired: &DesiredState) -> String {
    let view = JsonState {
        virtual_servers: desired
            .virtual_servers
            .iter()
            .map(|(key, vs)| JsonVirtualServer {
                address: key.address,
                port: key.port,
                protocol: key.protocol,
                scheduler: &vs.spec.scheduler,
                persistence_timeout: vs.spec.persistence_timeout,
                sched_flags: vs.spec.sched_flags,
                service: &vs.service,
                real_servers: vs
                    .real_servers
                    .iter()
                    .map(|(address, &weight)| JsonRealServer { address, weight })
                    .collect(),
            })
            .collect(),
        bind_addresses: &desired.bind_addresses,
        health_check_node_ports: desired
            .health_check_node_ports
            .iter()
            .map(|(&port, hc)| JsonHealthCheck {
                port,
                namespace: &hc.namespace,
                name: &hc.name,
                local_ready_endpoints: hc.local_ready_endpoints,
            })
            .collect(),
        set_elements: sorted_elements(desired)
            .map(|e| JsonSetElement {
                set: e.set_name(),
                element: e.element_text(),
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&view).expect("plain data serializes");
    text.push('\n');
    text
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonState<'a> {
    virtual_servers: Vec<JsonVirtualServer<'a>>,
    bind_addresses: &'a BTreeSet<IpAddr>,
    health_check_node_ports: Vec<JsonHealthCheck<'a>>,
    set_elements: Vec<JsonSetElement>,
}

#[derive(Serialize)]
struct JsonSetElement {
    set: &'static str,
    element: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonVirtualServer<'a> {
    address: IpAddr,
    port: u16,
    protocol: Protocol,
    scheduler: &'a str,
    persistence_timeout: Option<u32>,
    sched_flags: SchedFlags,
    service: &'a str,
    real_servers: Vec<JsonRealServer>,
}

#[derive(Serialize)]
struct JsonRealServer {
    address: SocketAddr,
    weight: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonHealthCheck<'a> {
    port: u16,
    namespace: &'a str,
    name: &'a str,
    local_ready_endpoints: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HealthCheckNodePort, VirtualServerKey, VirtualServerSpec};

    fn vs(
        scheduler: &str,
        persistence: Option<u32>,
        flags: u32,
        rs: &[(&str, u32)],
    ) -> VirtualServer {
        VirtualServer {
            spec: VirtualServerSpec {
                scheduler: scheduler.into(),
                persistence_timeout: persistence,
                sched_flags: flags,
            },
            real_servers: rs.iter().map(|(a, w)| (a.parse().unwrap(), *w)).collect(),
            service: "ns/svc:p".into(),
        }
    }

    fn key(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
        VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol,
        }
    }

    #[test]
    fn ipvsadm_lines_and_order() {
        let mut desired = DesiredState::default();
        let entries = [
            (
                key("10.96.0.10", 80, Protocol::Tcp),
                vs(
                    "rr",
                    None,
                    0,
                    &[("10.244.1.2:8080", 0), ("10.244.1.10:8080", 1)],
                ),
            ),
            (
                key("10.96.0.10", 53, Protocol::Udp),
                vs("rr", Some(10800), 0, &[("10.244.1.3:53", 1)]),
            ),
            (
                key("10.96.0.20", 9999, Protocol::Sctp),
                vs("rr", None, 0, &[]),
            ),
            (
                key("fd00::a", 53, Protocol::Udp),
                vs("mh", None, 0x10, &[("[fd00:1::3]:53", 1)]),
            ),
            (
                key("192.168.0.10", 30080, Protocol::Tcp),
                vs("sh", Some(60), 0x18, &[]),
            ),
            (
                key("10.96.0.10", 443, Protocol::Tcp),
                vs("wlc", None, 0x28, &[]),
            ),
        ];
        desired.virtual_servers.extend(entries);
        assert_eq!(
            ipvsadm(&desired),
            "\
-A -t 192.168.0.10:30080 -s sh -p 60 -b sh-fallback,sh-port
-A -t 10.96.0.10:80 -s rr
-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 0
-a -t 10.96.0.10:80 -r 10.244.1.10:8080 -m -w 1
-A -t 10.96.0.10:443 -s wlc -b flag-1,flag-3
-A -u 10.96.0.10:53 -s rr -p 10800
-a -u 10.96.0.10:53 -r 10.244.1.3:53 -m -w 1
-A --sctp-service 10.96.0.20:9999 -s rr
-A -u [fd00::a]:53 -s mh -b mh-port
-a -u [fd00::a]:53 -r [fd00:1::3]:53 -m -w 1
"
        );
        assert_eq!(ipvsadm(&DesiredState::default()), "");
    }

    /// libipvs subtracts host-order words into an `int`: within half the 32-bit circle that is
    /// an order, starting after the largest gap.
    #[test]
    fn libipvs_wrapping_order() {
        let sorted = |list: &[&str]| -> Vec<String> {
            let addresses: Vec<IpAddr> = list.iter().map(|a| a.parse().unwrap()).collect();
            ipvsadm_sorted(addresses.iter(), |a| (0, *a, 0))
                .into_iter()
                .map(ToString::to_string)
                .collect()
        };
        // Within 2^31 of each other: numeric.
        assert_eq!(
            sorted(&["10.0.0.2", "10.0.0.1", "100.64.0.1"]),
            ["10.0.0.1", "10.0.0.2", "100.64.0.1"]
        );
        // 10.x and 192.168.x are more than 2^31 apart: 0x0a.. - 0xc0.. is positive as an int.
        assert_eq!(
            sorted(&["10.96.0.1", "192.168.0.10"]),
            ["192.168.0.10", "10.96.0.1"]
        );
        assert_eq!(
            sorted(&["10.96.0.1", "203.0.113.1", "192.168.0.10", "10.96.0.2"]),
            ["192.168.0.10", "203.0.113.1", "10.96.0.1", "10.96.0.2"]
        );
        // Spread over more than half the circle: ipvsadm's order is undefined; numeric here.
        assert_eq!(
            sorted(&["192.168.0.1", "10.0.0.1", "100.64.0.1"]),
            ["10.0.0.1", "100.64.0.1", "192.168.0.1"]
        );
        // IPv6, word by word: fd00:: sorts before 2001:db8:: (0xfd00.. - 0x2001.. < 0).
        assert_eq!(
            sorted(&["2001:db8::1", "fd00::2", "fd00::1"]),
            ["fd00::1", "fd00::2", "2001:db8::1"]
        );
        // IPv4 before IPv6.
        assert_eq!(sorted(&["fd00::1", "10.0.0.1"]), ["10.0.0.1", "fd00::1"]);
    }

    #[test]
    fn circular_start_cases() {
        assert_eq!(circular_start(&[]), 0);
        assert_eq!(circular_start(&[7]), 0);
        assert_eq!(circular_start(&[1, 2]), 1);
        assert_eq!(circular_start(&[1, 0xc000_0000]), 0xc000_0000);
        // Exactly half the circle apart: a - b is i32::MIN both ways, not an order.
        assert_eq!(circular_start(&[0, 0x8000_0000]), 0);
    }

    #[test]
    fn json_shape() {
        let mut desired = DesiredState::default();
        desired.virtual_servers.insert(
            key("10.96.0.10", 53, Protocol::Udp),
            vs("rr", Some(10800), 0, &[("10.244.1.2:53", 1)]),
        );
        desired.bind_addresses.insert("10.96.0.10".parse().unwrap());
        desired.health_check_node_ports.insert(
            30000,
            HealthCheckNodePort {
                namespace: "default".into(),
                name: "web".into(),
                local_ready_endpoints: 2,
            },
        );
        desired
            .set_elements
            .insert(SetElement::ClusterIp(key("10.96.0.10", 53, Protocol::Udp)));
        desired
            .set_elements
            .insert(SetElement::HealthCheckNodePort(30000));
        let value: serde_json::Value = serde_json::from_str(&json(&desired)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "virtualServers": [{
                    "address": "10.96.0.10",
                    "port": 53,
                    "protocol": "UDP",
                    "scheduler": "rr",
                    "persistenceTimeout": 10800,
                    "schedFlags": 0,
                    "service": "ns/svc:p",
                    "realServers": [{"address": "10.244.1.2:53", "weight": 1}],
                }],
                "bindAddresses": ["10.96.0.10"],
                "healthCheckNodePorts": [{
                    "port": 30000,
                    "namespace": "default",
                    "name": "web",
                    "localReadyEndpoints": 2,
                }],
                "setElements": [
                    {"set": "cluster-ips", "element": "10.96.0.10 . udp . 53"},
                    {"set": "health-check-ports", "element": "30000"},
                ],
            })
        );
        assert!(json(&DesiredState::default()).ends_with("}\n"));
        assert_eq!(
            nft(&desired),
            "add element inet kipvs cluster-ips { 10.96.0.10 . udp . 53 }\n\
             add element inet kipvs health-check-ports { 30000 }\n"
        );
    }
}

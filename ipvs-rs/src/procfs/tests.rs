//! Unit tests of `ipvs-rs/src/procfs.rs`.

use super::*;

/// Captured from Linux 6.1 (the test VM's Debian kernel) by tests/vm/15-ipvs-listing.sh: both
/// families, SCTP, a firewall-mark service, weights 0, persistence, and on 198.51.100.77:8080
/// (its own real server) one active and one inactive connection.
const CAPTURED: &str = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  [2001:0db8:0000:0000:0000:0000:0000:0077]:1F90 wrr 
  -> [2001:0db8:0000:0000:0000:0000:0000:0009]:1F90      Masq    0      0          0         
  -> [2001:0db8:0000:0000:0000:0000:0000:0005]:1F90      Masq    2      0          0         
TCP  C633644D:1F90 rr  
  -> C0000209:1F90      Masq    0      0          0         
  -> C633644D:1F90      Masq    1      1          1         
SCTP  C000024D:0F1C rr  
UDP  [2001:0db8:0000:0000:0000:0000:0000:0077]:0035 rr persistent 150000 80000000
  -> [2001:0db8:0000:0000:0000:0000:0000:0007]:0035      Masq    0      0          0         
  -> [2001:0db8:0000:0000:0000:0000:0000:0006]:0035      Masq    5      0          0         
FWM  00000077 wrr 
  -> C0000208:0000      Route   3      0          0         
";

/// Every form `ip_vs_info_seq_show` prints, trailing spaces included: IPv4 and IPv6
/// services and destinations, a service without destinations, the `ops` and `persistent`
/// flags, a firewall-mark service, each forwarding name, weight 0 and connections.
const LISTING: &str = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0035 rr  
  -> 0AF40206:0035      Masq    1      0          0         
  -> 0AF40105:0035      Masq    1      0          0         
TCP  0A600014:0050 rr  
  -> 0AF40304:1F90      Masq    1      0          3         
  -> 0AF40203:1F90      Masq    1      1          0         
  -> 0AF40102:1F90      Masq    0      1          12        
UDP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0035 sh persistent 10800000 FFFFFFFF
  -> [fd00:0000:0000:0000:0000:0000:0001:0005]:0035      Masq    1      0          4         
SCTP  C0A86401:7918 wrr ops  
FWM  00000007 wrr ops persistent 360000 FFFFFFFF
  -> 0AF40103:0000      Route   3      0          0         
  -> [2001:0db8:0000:0000:0000:0000:0000:0001]:0050      Tunnel  1      0          0         
TCP  [2001:0db8:0000:0000:0000:0000:0000:00ff]:FFFF none 
  -> [2001:0db8:0000:0000:0000:0000:0000:0002]:0001      Local   65535  -1         0         
";

fn v4(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn dest(
    address: &str,
    port: u16,
    forward: ForwardMethod,
    weight: u32,
    active: u32,
    inactive: u32,
) -> ListedDestination {
    ListedDestination {
        address: address.parse().unwrap(),
        port,
        forward,
        weight,
        active_connections: active,
        inactive_connections: inactive,
    }
}

#[test]
fn parses_the_listing_of_linux_6_1() {
    use ForwardMethod::*;
    let services = parse(CAPTURED).unwrap();
    let inet = |address: &str, port, protocol| ListedId::Inet {
        address: v4(address),
        port,
        protocol,
    };
    let want = [
        (
            inet("2001:db8::77", 8080, Protocol::Tcp),
            "wrr",
            vec![
                dest("2001:db8::9", 8080, Masquerade, 0, 0, 0),
                dest("2001:db8::5", 8080, Masquerade, 2, 0, 0),
            ],
        ),
        (
            inet("198.51.100.77", 8080, Protocol::Tcp),
            "rr",
            vec![
                dest("192.0.2.9", 8080, Masquerade, 0, 0, 0),
                dest("198.51.100.77", 8080, Masquerade, 1, 1, 1),
            ],
        ),
        (inet("192.0.2.77", 3868, Protocol::Sctp), "rr", vec![]),
        (
            inet("2001:db8::77", 53, Protocol::Udp),
            "rr",
            vec![
                dest("2001:db8::7", 53, Masquerade, 0, 0, 0),
                dest("2001:db8::6", 53, Masquerade, 5, 0, 0),
            ],
        ),
        (
            ListedId::Fwmark { mark: 0x77 },
            "wrr",
            vec![dest("192.0.2.8", 0, DirectRoute, 3, 0, 0)],
        ),
    ];
    let want: Vec<ListedService> = want
        .into_iter()
        .map(|(id, scheduler, destinations)| ListedService {
            id,
            scheduler: scheduler.into(),
            destinations,
        })
        .collect();
    assert_eq!(services, want);
}

#[test]
fn parses_every_form_the_kernel_prints() {
    let services = parse(LISTING).unwrap();
    let ids: Vec<ListedId> = services.iter().map(|s| s.id).collect();
    assert_eq!(
        ids,
        [
            ListedId::Inet {
                address: v4("10.96.0.10"),
                port: 53,
                protocol: Protocol::Tcp
            },
            ListedId::Inet {
                address: v4("10.96.0.20"),
                port: 80,
                protocol: Protocol::Tcp
            },
            ListedId::Inet {
                address: v4("fd00::a"),
                port: 53,
                protocol: Protocol::Udp
            },
            ListedId::Inet {
                address: v4("192.168.100.1"),
                port: 31000,
                protocol: Protocol::Sctp
            },
            ListedId::Fwmark { mark: 7 },
            ListedId::Inet {
                address: v4("2001:db8::ff"),
                port: 65535,
                protocol: Protocol::Tcp
            },
        ]
    );
    let schedulers: Vec<&str> = services.iter().map(|s| s.scheduler.as_str()).collect();
    assert_eq!(schedulers, ["rr", "rr", "sh", "wrr", "wrr", "none"]);
    use ForwardMethod::*;
    assert_eq!(
        services[1].destinations,
        [
            dest("10.244.3.4", 8080, Masquerade, 1, 0, 3),
            dest("10.244.2.3", 8080, Masquerade, 1, 1, 0),
            dest("10.244.1.2", 8080, Masquerade, 0, 1, 12),
        ]
    );
    assert_eq!(
        services[2].destinations,
        [dest("fd00::1:5", 53, Masquerade, 1, 0, 4)]
    );
    assert!(services[3].destinations.is_empty());
    assert_eq!(
        services[4].destinations,
        [
            dest("10.244.1.3", 0, DirectRoute, 3, 0, 0),
            dest("2001:db8::1", 80, Tunnel, 1, 0, 0),
        ]
    );
    // A negative counter (a kernel bug) reads as netlink's u32 of the same value.
    assert_eq!(
        services[5].destinations,
        [dest("2001:db8::2", 1, Local, 65535, u32::MAX, 0)]
    );
}

#[test]
fn service_ids_are_netlinks_for_address_based_services_only() {
    let services = parse(LISTING).unwrap();
    assert_eq!(
        services[2].id.service_id(),
        Some(ServiceId::Inet {
            address: v4("fd00::a"),
            port: 53,
            protocol: Protocol::Udp
        })
    );
    assert_eq!(services[4].id.service_id(), None);
}

#[test]
fn an_empty_table_is_the_header_alone() {
    let header = LISTING.lines().take(3).collect::<Vec<_>>().join("\n") + "\n";
    assert_eq!(parse(&header).unwrap(), []);
}

#[test]
fn protocol_names_follow_ip_vs_proto_name() {
    assert_eq!(protocol_named("IP"), Some(Protocol::Other(0)));
    assert_eq!(protocol_named("ICMPv6"), Some(Protocol::Other(58)));
    assert_eq!(protocol_named("IP_50"), Some(Protocol::Other(50)));
    assert_eq!(protocol_named("IP_6"), Some(Protocol::Tcp));
    assert_eq!(protocol_named("IP_x"), None);
    assert_eq!(protocol_named("tcp"), None);
}

#[test]
fn malformed_lines_are_errors_naming_the_line() {
    let header = LISTING.lines().take(3).collect::<Vec<_>>().join("\n");
    for (body, reason) in [
        (
            "  -> 0AF40206:0035      Masq    1      0          0",
            "a destination before any service",
        ),
        (
            "TCP  0A60000A:0035",
            "a service line has at least three fields",
        ),
        ("TCP  0a60000a:0035 rr", "an IPv4 address is %08X"),
        ("TCP  0A60000A:35 rr", "a port is %04X"),
        ("TCP  0A60000A:10035 rr", "a port is %04X"),
        ("TCP  [fd00::a]35 rr", "an IPv6 address is [%pI6]:%04X"),
        ("TCP  [fd00::g]:0035 rr", "not an IPv6 address"),
        ("TCPX 0A60000A:0035 rr", "unknown protocol name"),
        ("FWM  7 rr", "the firewall mark is not %08X"),
        (
            "TCP  0A60000A:0035 rr\n  -> 0AF40206:0035      Nat     1      0          0",
            "unknown forwarding name",
        ),
        (
            "TCP  0A60000A:0035 rr\n  -> 0AF40206:0035      Masq    1      0",
            "a destination line has five fields",
        ),
        (
            "TCP  0A60000A:0035 rr\n  -> 0AF40206:0035      Masq    -1     0          0",
            "the weight is not a number",
        ),
        (
            "TCP  0A60000A:0035 rr\n  -> 0AF40206:0035      Masq    1      many       0",
            "ActiveConn is not a number",
        ),
    ] {
        let text = format!("{header}\n{body}\n");
        match parse(&text) {
            Err(ListingError::Parse {
                line, reason: r, ..
            }) => {
                assert_eq!(r, reason, "{body}");
                assert_eq!(line, 3 + body.lines().count(), "{body}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn a_header_other_than_the_kernels_is_an_error() {
    let changed = LISTING.replace("Weight ActiveConn", "Weight PersistConn ActiveConn");
    assert!(matches!(
        parse(&changed),
        Err(ListingError::Parse {
            line: 3,
            reason: "not the destination header",
            ..
        })
    ));
    assert!(matches!(
        parse("Prot LocalAddress:Port Scheduler Flags\n"),
        Err(ListingError::Parse {
            line: 1,
            reason: "not the IPVS version line",
            ..
        })
    ));
    assert!(matches!(
        parse(""),
        Err(ListingError::Parse {
            reason: "empty listing",
            ..
        })
    ));
}

#[test]
fn reads_again_from_the_start_each_time() {
    let dir = std::env::temp_dir().join(format!("ipvs-listing-{}", std::process::id()));
    std::fs::write(&dir, LISTING).unwrap();
    let mut listing = ProcListing::open_path(&dir).unwrap();
    let first = listing.read().unwrap();
    assert_eq!(listing.read().unwrap(), first);
    assert_eq!(first.len(), 6);
    std::fs::remove_file(&dir).unwrap();
    assert!(matches!(
        ProcListing::open_path(&dir),
        Err(ListingError::Io { .. })
    ));
}

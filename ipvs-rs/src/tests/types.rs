//! The object model's conversions and defaults.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{
    AddressFamily, Destination, ForwardMethod, Protocol, Service, ServiceFlags, ServiceId, Version,
};

#[test]
fn service_new_picks_the_full_netmask_of_the_family() {
    let v4 = ServiceId::Inet {
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let v6 = ServiceId::Inet {
        address: IpAddr::V6(Ipv6Addr::LOCALHOST),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let fwmark_v6 = ServiceId::Fwmark {
        family: AddressFamily::Inet6,
        mark: 1,
    };
    assert_eq!(Service::new(v4, "rr").netmask, 0xffff_ffff);
    assert_eq!(Service::new(v6, "rr").netmask, 128);
    assert_eq!(Service::new(fwmark_v6, "rr").netmask, 128);
    let service = Service::new(v4, "rr");
    assert_eq!(
        (
            service.flags,
            service.timeout,
            service.pe_name,
            service.stats
        ),
        (ServiceFlags(0), 0, None, None)
    );
}

#[test]
fn destination_new_is_a_plain_masquerading_server() {
    let dest = Destination::new(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5)), 8443, 3);
    assert_eq!(dest.forward, ForwardMethod::Masquerade);
    assert_eq!(
        (dest.weight, dest.upper_threshold, dest.lower_threshold),
        (3, 0, 0)
    );
    assert_eq!(dest.stats, None);
}

#[test]
fn service_flags() {
    let flags = ServiceFlags::PERSISTENT | ServiceFlags::HASHED | ServiceFlags::SCHED3;
    assert_eq!(flags, ServiceFlags(0x23));
    assert!(flags.contains(ServiceFlags::PERSISTENT | ServiceFlags::SCHED3));
    assert!(!flags.contains(ServiceFlags::ONEPACKET));
    assert_eq!(
        flags.without_hashed(),
        ServiceFlags::PERSISTENT | ServiceFlags::SCHED3
    );
    assert_eq!(
        [
            ServiceFlags::ONEPACKET,
            ServiceFlags::SCHED1,
            ServiceFlags::SCHED2
        ],
        [ServiceFlags(0x4), ServiceFlags(0x8), ServiceFlags(0x10)]
    );
}

#[test]
fn protocol_numbers() {
    for (raw, protocol) in [
        (6, Protocol::Tcp),
        (17, Protocol::Udp),
        (132, Protocol::Sctp),
        (50, Protocol::Other(50)),
    ] {
        assert_eq!(Protocol::from(raw), protocol);
        assert_eq!(u16::from(protocol), raw);
    }
}

#[test]
fn address_family_numbers() {
    assert_eq!(AddressFamily::Inet.raw(), 2);
    assert_eq!(AddressFamily::Inet6.raw(), 10);
    assert_eq!(AddressFamily::from_raw(10), Some(AddressFamily::Inet6));
    assert_eq!(AddressFamily::from_raw(7), None);
}

#[test]
fn forward_methods_are_masked_like_the_kernel() {
    for method in [
        ForwardMethod::Masquerade,
        ForwardMethod::Local,
        ForwardMethod::Tunnel,
        ForwardMethod::DirectRoute,
        ForwardMethod::Bypass,
    ] {
        assert_eq!(ForwardMethod::from_raw(method.raw()), Some(method));
    }
    assert_eq!(ForwardMethod::DirectRoute.raw(), 3);
    // Bits above IP_VS_CONN_F_FWD_MASK are ignored; 5..=7 are unused.
    assert_eq!(
        ForwardMethod::from_raw(0x100 | 2),
        Some(ForwardMethod::Tunnel)
    );
    assert_eq!(ForwardMethod::from_raw(5), None);
}

#[test]
fn version_splits_the_version_code() {
    let version = Version::from(0x0001_0201);
    assert_eq!(
        version,
        Version {
            major: 1,
            minor: 2,
            patch: 1
        }
    );
    assert_eq!(version.to_string(), "1.2.1");
}

#[test]
fn service_ids_display_like_ipvsadm() {
    let tcp = ServiceId::Inet {
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let udp6 = ServiceId::Inet {
        address: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        port: 53,
        protocol: Protocol::Udp,
    };
    let fwm = ServiceId::Fwmark {
        family: AddressFamily::Inet,
        mark: 7,
    };
    assert_eq!(tcp.to_string(), "TCP 10.0.0.1:80");
    assert_eq!(udp6.to_string(), "UDP [2001:db8::1]:53");
    assert_eq!(fwm.to_string(), "FWM 7 IPv4");
    assert_eq!(udp6.family(), AddressFamily::Inet6);
    assert_eq!(Protocol::Other(50).to_string(), "proto 50");
}

//! Parsing never breaks on what a newer (or older) kernel may send:
//! unknown attributes and commands survive a round trip, `NLA_F_NESTED` is
//! accepted, malformed input is a `DecodeError`, and nothing panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NetlinkMessage, ParseableParametrized,
};
use netlink_packet_generic::{GenlHeader, GenlMessage};

use super::config::GET_INFO_REPLY;
use super::dest::{DEST_DUMP_ENTRY, NEW_DEST_TCP_V4};
use super::service::{NEW_SERVICE_PERSISTENT, SERVICE_DUMP_ENTRY};
use super::{check_reply, payload};
use crate::codec::{DestAttr, IpvsAttr, ServiceAttr, Stats64Attr};
use crate::{IpvsCmd, IpvsMessage, ServiceId};

/// A service entry from a hypothetical newer kernel: an unknown attribute
/// (type 13) inside the service nest and an unknown top-level one (type 7).
#[rustfmt::skip]
static FUTURE_SERVICE_ENTRY: [u8; 64] = [
    0x40, 0x00, 0x00, 0x00, 0x24, 0x00, 0x02, 0x00, // length 64, IPVS, NLM_F_MULTI
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0x01, 0x01, 0x00, 0x00, // NEW_SERVICE
    0x24, 0x00, 0x01, 0x00, // SERVICE, length 36
    0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF_INET
    0x08, 0x00, 0x05, 0x00, 0x09, 0x00, 0x00, 0x00, // FWMARK 9
    0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // SCHED_NAME "rr"
    0x08, 0x00, 0x0d, 0x00, 0xef, 0xbe, 0xad, 0xde, // unknown service attribute 13
    0x08, 0x00, 0x07, 0x00, 0x2a, 0x00, 0x00, 0x00, // unknown top-level attribute 7
];

#[test]
fn unknown_attributes_round_trip_through_other() {
    let message = IpvsMessage {
        cmd: IpvsCmd::NewService,
        attrs: vec![
            IpvsAttr::Service(vec![
                ServiceAttr::Af(2),
                ServiceAttr::Fwmark(9),
                ServiceAttr::SchedName("rr".into()),
                ServiceAttr::Other(DefaultNla::new(13, vec![0xef, 0xbe, 0xad, 0xde])),
            ]),
            IpvsAttr::Other(DefaultNla::new(7, vec![0x2a, 0, 0, 0])),
        ],
    };
    check_reply(message, 0x02, &FUTURE_SERVICE_ENTRY);
    let service = payload(&FUTURE_SERVICE_ENTRY).to_service().unwrap();
    assert!(matches!(service.id, ServiceId::Fwmark { mark: 9, .. }));
}

/// A `GET_DAEMON` dump entry: the daemon nest is not modelled, and arrives
/// here with `NLA_F_NESTED` set; it must come back bit for bit.
#[rustfmt::skip]
static DAEMON_ENTRY: [u8; 32] = [
    0x20, 0x00, 0x00, 0x00, 0x24, 0x00, 0x02, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
    0x09, 0x01, 0x00, 0x00, // cmd IPVS_CMD_NEW_DAEMON
    0x0c, 0x00, 0x03, 0x80, // IPVS_CMD_ATTR_DAEMON | NLA_F_NESTED, length 12
    0x08, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, // DAEMON_ATTR_STATE: master
];

#[test]
fn unknown_nested_attribute_keeps_its_flag() {
    let message = IpvsMessage {
        cmd: IpvsCmd::NewDaemon,
        attrs: vec![IpvsAttr::Other(DefaultNla::new(
            3 | NLA_F_NESTED,
            vec![0x08, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00],
        ))],
    };
    check_reply(message, 0x02, &DAEMON_ENTRY);
}

#[test]
fn unknown_command_round_trips() {
    #[rustfmt::skip]
    let bytes = [
        0x14, 0x00, 0x00, 0x00, 0x24, 0x00, 0x02, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x40, 0x1f, 0x00, 0x00,
        0x2a, 0x01, 0x00, 0x00, // command 42
    ];
    let message = IpvsMessage {
        cmd: IpvsCmd::Other(42),
        attrs: vec![],
    };
    check_reply(message, 0x02, &bytes);
}

#[test]
fn stats_padding_and_unknown_dest_attributes_are_kept() {
    // IPVS_STATS_ATTR_PAD (11), which nla_put_u64_64bit adds on some
    // architectures, and a future destination attribute 16.
    let message = IpvsMessage {
        cmd: IpvsCmd::NewDest,
        attrs: vec![IpvsAttr::Dest(vec![
            DestAttr::Addr(IpAddr::V4(Ipv4Addr::new(10, 244, 1, 7))),
            DestAttr::Port(8080),
            DestAttr::Other(DefaultNla::new(16, vec![1, 2])),
            DestAttr::Stats64(vec![
                Stats64Attr::Other(DefaultNla::new(11, vec![])),
                Stats64Attr::Conns(1),
            ]),
        ])],
    };
    let mut bytes = vec![0; message.buffer_len()];
    message.emit(&mut bytes);
    let header = GenlHeader { cmd: 5, version: 1 };
    assert_eq!(
        IpvsMessage::parse_with_param(&bytes[..], header).unwrap(),
        message
    );
    assert_eq!(
        message.to_destination().unwrap().stats.unwrap().connections,
        1
    );
}

/// Sets `NLA_F_NESTED` on the type of the attribute header at `offset`.
fn set_nested(bytes: &mut [u8], offset: usize) {
    bytes[offset + 3] |= 0x80;
}

#[test]
fn nested_flag_is_accepted() {
    let mut flagged = NEW_DEST_TCP_V4;
    set_nested(&mut flagged, 20); // IPVS_CMD_ATTR_SERVICE
    set_nested(&mut flagged, 68); // IPVS_CMD_ATTR_DEST
    assert_eq!(payload(&flagged), payload(&NEW_DEST_TCP_V4));

    let mut flagged = SERVICE_DUMP_ENTRY;
    set_nested(&mut flagged, 20); // IPVS_CMD_ATTR_SERVICE
    set_nested(&mut flagged, 104); // IPVS_SVC_ATTR_STATS
    set_nested(&mut flagged, 196); // IPVS_SVC_ATTR_STATS64
    assert_eq!(payload(&flagged), payload(&SERVICE_DUMP_ENTRY));
}

fn parse_attrs(cmd: u8, attrs: &[u8]) -> Result<IpvsMessage, netlink_packet_core::DecodeError> {
    IpvsMessage::parse_with_param(attrs, GenlHeader { cmd, version: 1 })
}

#[test]
fn malformed_input_is_a_decode_error() {
    #[rustfmt::skip]
    let cases: [(&str, &[u8]); 10] = [
        ("truncated attribute header", &[0x06, 0x00, 0x01]),
        ("attribute longer than the buffer", &[0x0c, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00]),
        ("attribute length below the header size", &[0x02, 0x00, 0x04, 0x00]),
        ("u32 timeout of 2 bytes", &[0x06, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00]),
        ("1-byte AF", &[0x0c, 0x00, 0x01, 0x00, 0x05, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00]),
        ("4-byte FLAGS", &[0x0c, 0x00, 0x01, 0x00, 0x08, 0x00, 0x07, 0x00, 0x01, 0x00, 0x00, 0x00]),
        ("5-byte ADDR", &[
            0x10, 0x00, 0x01, 0x00,
            0x09, 0x00, 0x03, 0x00, 0x0a, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00,
        ]),
        ("4-byte ADDR for AF_INET6", &[
            0x14, 0x00, 0x01, 0x00,
            0x06, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x00,
            0x08, 0x00, 0x03, 0x00, 0x20, 0x01, 0x0d, 0xb8,
        ]),
        ("scheduler name that is not UTF-8", &[
            0x0c, 0x00, 0x01, 0x00, 0x06, 0x00, 0x06, 0x00, 0xff, 0xfe, 0x00, 0x00,
        ]),
        ("u64 byte counter in STATS given as u32", &[
            0x10, 0x00, 0x02, 0x00,
            0x0c, 0x00, 0x0a, 0x00, 0x08, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00,
        ]),
    ];
    for (what, attrs) in cases {
        assert!(parse_attrs(1, attrs).is_err(), "{what} should not parse");
    }
    // An info attribute is only a u32.
    assert!(parse_attrs(14, &[0x06, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00]).is_err());
    // A generic-netlink header cut short.
    let short = [
        0x12, 0x00, 0x00, 0x00, 0x24, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x01,
    ];
    assert!(NetlinkMessage::<GenlMessage<IpvsMessage>>::deserialize(&short).is_err());
}

#[test]
fn unknown_scheduler_names_parse() {
    #[rustfmt::skip]
    let attrs = [
        0x18, 0x00, 0x01, 0x00, // SERVICE, length 24
        0x14, 0x00, 0x06, 0x00, // SCHED_NAME, length 20, NUL-padded like a C buffer
        b'm', b'y', b'-', b's', b'c', b'h', b'e', b'd', 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    let message = parse_attrs(1, &attrs).unwrap();
    assert_eq!(
        message.attrs,
        vec![IpvsAttr::Service(vec![ServiceAttr::SchedName(
            "my-sched".into()
        )])]
    );
}

#[test]
fn address_decoding_by_family_and_length() {
    // moby/ipvs sends IPv4 service addresses as 4 bytes.
    #[rustfmt::skip]
    let four_bytes = [
        0x14, 0x00, 0x01, 0x00,
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF_INET
        0x08, 0x00, 0x03, 0x00, 0x0a, 0x00, 0x00, 0x01, // ADDR 10.0.0.1
    ];
    assert_eq!(
        parse_attrs(1, &four_bytes).unwrap().attrs,
        vec![IpvsAttr::Service(vec![
            ServiceAttr::Af(2),
            ServiceAttr::Addr(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
        ])]
    );

    // ADDR before AF: the family is looked up first.
    #[rustfmt::skip]
    let addr_first = [
        0x20, 0x00, 0x01, 0x00,
        0x14, 0x00, 0x03, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0x06, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x00,
    ];
    let IpvsAttr::Service(attrs) = &parse_attrs(1, &addr_first).unwrap().attrs[0] else {
        panic!("a service nest");
    };
    assert_eq!(
        attrs[0],
        ServiceAttr::Addr(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0)))
    );

    // Destinations from kernels before 3.18 carry no ADDR_FAMILY: a zero
    // tail means IPv4.
    #[rustfmt::skip]
    let old_kernel_dests: [(&[u8], IpAddr); 2] = [
        (&[
            0x18, 0x00, 0x02, 0x00,
            0x14, 0x00, 0x01, 0x00, 0x0a, 0xf4, 0x01, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ], IpAddr::V4(Ipv4Addr::new(10, 244, 1, 7))),
        (&[
            0x18, 0x00, 0x02, 0x00,
            0x14, 0x00, 0x01, 0x00, 0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x07,
        ], IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7))),
    ];
    for (attrs, address) in old_kernel_dests {
        assert_eq!(
            parse_attrs(5, attrs).unwrap().attrs,
            vec![IpvsAttr::Dest(vec![DestAttr::Addr(address)])]
        );
    }
}

/// A small deterministic xorshift generator for the corruption test.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 as usize
    }
}

/// Parses `bytes` as a whole message and, when that works, emits it again.
/// Only panics matter here.
fn parse_and_reemit(bytes: &[u8]) {
    if let Ok(mut message) = NetlinkMessage::<GenlMessage<IpvsMessage>>::deserialize(bytes) {
        message.finalize();
        let mut out = vec![0; message.buffer_len()];
        message.serialize(&mut out);
    }
}

#[test]
fn never_panics_on_truncated_or_corrupted_input() {
    let vectors: [&[u8]; 5] = [
        &SERVICE_DUMP_ENTRY,
        &DEST_DUMP_ENTRY,
        &NEW_SERVICE_PERSISTENT,
        &GET_INFO_REPLY,
        &FUTURE_SERVICE_ENTRY,
    ];
    for vector in vectors {
        let cmd = vector[16];
        for end in 20..vector.len() {
            let _ = parse_attrs(cmd, &vector[20..end]);
        }
    }
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut bytes = vectors[rng.next() % vectors.len()].to_vec();
        for _ in 0..1 + rng.next() % 4 {
            // Anywhere, headers and length fields included.
            let at = rng.next() % bytes.len();
            bytes[at] = rng.next() as u8;
        }
        parse_and_reemit(&bytes);
    }
}

//! Golden byte-vector tests, in the style of netlink-packet-route's: each
//! vector is written by hand from the wire layout (`include/uapi/linux/ip_vs.h`
//! for the attributes, `struct nlmsghdr`/`struct genlmsghdr`/`struct nlattr`
//! for the framing), then `emit(message) == bytes` and
//! `parse(bytes) == message` are both checked. Host byte order is little
//! endian here (the module is compiled only for little-endian targets).
//!
//! Framing reminders:
//! * `nlmsghdr`: u32 length, u16 type (the family id), u16 flags
//!   (`NLM_F_REQUEST` 0x1, `NLM_F_MULTI` 0x2, `NLM_F_ACK` 0x4,
//!   `NLM_F_DUMP` 0x300), u32 sequence, u32 port id;
//! * `genlmsghdr`: u8 cmd, u8 version (1 for IPVS), u16 reserved;
//! * `nlattr`: u16 length (header + value, without padding), u16 type, value
//!   padded with zeroes to a multiple of 4.

mod config;
mod ctrl;
mod dest;
mod errors;
mod robustness;
mod service;
mod transport;
mod types;

use netlink_packet_core::NetlinkMessage;
use netlink_packet_generic::GenlMessage;

use crate::IpvsMessage;
use crate::handle::{Request, request_message};

/// The IPVS family id of the vectors (the kernel assigns it dynamically when
/// `ip_vs` registers; any value works).
const FAMILY: u16 = 0x24;
/// Sequence number of every vector.
const SEQ: u32 = 1;
/// Port id the kernel addresses its replies to (the requesting socket's).
const PORT_ID: u32 = 0x1f40;

/// Checks that `payload`, sent by [`crate::Handle`] as `kind` with sequence
/// number [`SEQ`], is exactly `bytes`, and that `bytes` parse back into it.
fn check_request(payload: IpvsMessage, kind: Request, bytes: &[u8]) {
    let mut message = request_message(payload, FAMILY, kind);
    message.header.sequence_number = SEQ;
    assert_wire(&message, bytes);
}

/// Checks a kernel → user message: `payload` with netlink `flags`,
/// sequence [`SEQ`] and port id [`PORT_ID`] is exactly `bytes` both ways.
fn check_reply(payload: IpvsMessage, flags: u16, bytes: &[u8]) {
    let mut genl = GenlMessage::from_payload(payload);
    genl.set_resolved_family_id(FAMILY);
    let mut message = NetlinkMessage::from(genl);
    message.header.flags = flags;
    message.header.sequence_number = SEQ;
    message.header.port_number = PORT_ID;
    message.finalize();
    assert_wire(&message, bytes);
}

/// Parses a whole IPVS netlink message.
fn parse(bytes: &[u8]) -> NetlinkMessage<GenlMessage<IpvsMessage>> {
    NetlinkMessage::deserialize(bytes).expect("golden vector parses")
}

fn assert_wire(message: &NetlinkMessage<GenlMessage<IpvsMessage>>, bytes: &[u8]) {
    // Pre-fill with garbage so that bytes the emitter forgets to write
    // (padding, string terminators, address tails) show up.
    let mut emitted = vec![0xaa; message.buffer_len()];
    message.serialize(&mut emitted);
    assert_eq!(
        emitted, bytes,
        "emitted bytes differ from the golden vector"
    );
    assert_eq!(&parse(bytes), message, "parsed message differs");
}

/// The IPVS payload of a whole message.
fn payload(bytes: &[u8]) -> IpvsMessage {
    match parse(bytes).payload {
        netlink_packet_core::NetlinkPayload::InnerMessage(genl) => genl.payload,
        other => panic!("not an IPVS message: {other:?}"),
    }
}

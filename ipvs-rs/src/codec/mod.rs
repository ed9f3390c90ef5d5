//! The IPVS generic-netlink codec: messages and typed attributes.
//!
//! [`IpvsMessage`] is the generic-netlink payload of the `IPVS` family (name
//! [`IPVS_GENL_NAME`](crate::constants::IPVS_GENL_NAME), version 1). Wrap it
//! in [`netlink_packet_generic::GenlMessage`] and
//! [`netlink_packet_core::NetlinkMessage`] to put it on a socket; the family
//! id must be resolved first (`CTRL_CMD_GETFAMILY`), which
//! [`crate::Handle::connect`] does.
//!
//! Wire conventions (kernel uapi `include/uapi/linux/ip_vs.h`, handlers in
//! `net/netfilter/ipvs/ip_vs_ctl.c`):
//!
//! * attributes are `struct nlattr` (u16 length, u16 type, value padded to 4
//!   bytes); every integer is host byte order except the ports
//!   (`IPVS_SVC_ATTR_PORT`, `IPVS_DEST_ATTR_PORT`, `IPVS_DEST_ATTR_TUN_PORT`),
//!   which are big-endian;
//! * nested attributes are emitted without `NLA_F_NESTED`, exactly as the
//!   kernel fills them (`nla_nest_start_noflag`); the kernel parses IPVS
//!   requests leniently and accepts both, and so does this codec;
//! * addresses are emitted as the 16-byte `union nf_inet_addr` (see
//!   [`ServiceAttr::Addr`]);
//! * unknown attributes parse into the `Other(DefaultNla)` variant of each
//!   enum and emit back unchanged; malformed known attributes (wrong length,
//!   truncated headers, invalid UTF-8 in names) give a
//!   [`DecodeError`], never a panic.

mod dest;
mod info;
mod message;
mod service;
mod stats;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, NlasIterator, parse_u16};

pub use dest::DestAttr;
pub use info::InfoAttr;
pub use message::{IpvsAttr, IpvsCmd, IpvsMessage};
pub use service::{IpvsFlags, ServiceAttr};
pub use stats::{Stats64Attr, StatsAttr};

use crate::types::AddressFamily;

/// Size of `union nf_inet_addr`, the emitted length of address attributes.
const ADDR_LEN: usize = 16;

/// Copies `bytes` to the start of `buffer`. `Nla::emit` always hands
/// `emit_value` a buffer of exactly `value_len()` bytes.
fn put(buffer: &mut [u8], bytes: &[u8]) {
    buffer[..bytes.len()].copy_from_slice(bytes);
}

/// Writes `addr` as a 16-byte `union nf_inet_addr`.
fn emit_addr(buffer: &mut [u8], addr: &IpAddr) {
    buffer[..ADDR_LEN].fill(0);
    match addr {
        IpAddr::V4(v4) => put(buffer, &v4.octets()),
        IpAddr::V6(v6) => put(buffer, &v6.octets()),
    }
}

/// Reads a `union nf_inet_addr` of 4 or 16 bytes. `family` decides how 16
/// bytes are read; without it, 16 bytes with a zero tail are IPv4 (the
/// heuristic `ipvsadm` and moby/ipvs use for kernels that do not report a
/// destination family).
fn parse_addr(value: &[u8], family: Option<AddressFamily>) -> Result<IpAddr, DecodeError> {
    let v4 = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
    match (value.len(), family) {
        (4, None | Some(AddressFamily::Inet)) => Ok(v4(value)),
        (ADDR_LEN, Some(AddressFamily::Inet)) => Ok(v4(value)),
        (ADDR_LEN, None) if value[4..].iter().all(|b| *b == 0) => Ok(v4(value)),
        (ADDR_LEN, None | Some(AddressFamily::Inet6)) => {
            let mut octets = [0u8; ADDR_LEN];
            octets.copy_from_slice(value);
            Ok(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        (len, family) => Err(DecodeError::from(format!(
            "address of {len} bytes for family {family:?} (expected 4 or 16)"
        ))),
    }
}

/// Length of a string attribute value including its terminating NUL.
fn nul_string_len(s: &str) -> usize {
    s.len() + 1
}

/// Writes `s` followed by a NUL.
fn emit_nul_string(buffer: &mut [u8], s: &str) {
    put(buffer, s.as_bytes());
    buffer[s.len()] = 0;
}

/// Reads a string attribute up to its first NUL (or its end).
fn parse_nul_string(value: &[u8]) -> Result<String, DecodeError> {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    Ok(String::from_utf8(value[..end].to_vec())?)
}

/// The value of the first u16 attribute of type `kind` in a nest body.
fn find_u16(nest: &[u8], kind: u16) -> Result<Option<u16>, DecodeError> {
    for nla in NlasIterator::new(nest) {
        let nla = nla?;
        if nla.kind() == kind {
            return parse_u16(nla.value()).map(Some);
        }
    }
    Ok(None)
}

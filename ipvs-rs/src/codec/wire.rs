//! The byte-level encodings the attribute codecs share: `union nf_inet_addr` addresses,
//! NUL-terminated strings, and a u16 looked up in a nest body.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, NlasIterator, parse_u16};

use crate::types::AddressFamily;

/// Size of `union nf_inet_addr`, the emitted length of address attributes.
pub(super) const ADDR_LEN: usize = 16;

/// Copies `bytes` to the start of `buffer`. `Nla::emit` always hands
/// `emit_value` a buffer of exactly `value_len()` bytes.
pub(super) fn put(buffer: &mut [u8], bytes: &[u8]) {
    buffer[..bytes.len()].copy_from_slice(bytes);
}

/// Writes `addr` as a 16-byte `union nf_inet_addr`.
pub(super) fn emit_addr(buffer: &mut [u8], addr: &IpAddr) {
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
pub(super) fn parse_addr(
    value: &[u8],
    family: Option<AddressFamily>,
) -> Result<IpAddr, DecodeError> {
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
pub(super) fn nul_string_len(s: &str) -> usize {
    s.len() + 1
}

/// Writes `s` followed by a NUL.
pub(super) fn emit_nul_string(buffer: &mut [u8], s: &str) {
    put(buffer, s.as_bytes());
    buffer[s.len()] = 0;
}

/// Reads a string attribute up to its first NUL (or its end).
pub(super) fn parse_nul_string(value: &[u8]) -> Result<String, DecodeError> {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    Ok(String::from_utf8(value[..end].to_vec())?)
}

/// The value of the first u16 attribute of type `kind` in a nest body.
pub(super) fn find_u16(nest: &[u8], kind: u16) -> Result<Option<u16>, DecodeError> {
    for nla in NlasIterator::new(nest) {
        let nla = nla?;
        if nla.kind() == kind {
            return parse_u16(nla.value()).map(Some);
        }
    }
    Ok(None)
}

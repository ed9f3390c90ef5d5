//! The service nest, `IPVS_CMD_ATTR_SERVICE` (`IPVS_SVC_ATTR_*` attributes;
//! kernel side: `ip_vs_genl_parse_service` and `ip_vs_genl_fill_service` in
//! `ip_vs_ctl.c`, policy `ip_vs_svc_policy`).

use std::net::IpAddr;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized, parse_u16, parse_u16_be, parse_u32,
};

use super::stats::{Stats64Attr, StatsAttr, parse_stats_nest, parse_stats64_nest};
use super::wire::{
    ADDR_LEN, emit_addr, emit_nul_string, find_u16, nul_string_len, parse_addr, parse_nul_string,
    put,
};
use crate::constants::*;
use crate::types::{AddressFamily, Protocol, ServiceFlags};

/// `struct ip_vs_flags` (`ip_vs.h`), the value of `IPVS_SVC_ATTR_FLAGS`: two
/// host-order u32. On `NEW_SERVICE`/`SET_SERVICE` the kernel computes
/// `new = (old & !mask) | (flags & mask)`; the kernel reports `mask = !0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpvsFlags {
    /// Flag values.
    pub flags: ServiceFlags,
    /// Which bits of `flags` to apply.
    pub mask: u32,
}

/// One attribute of the service nest.
///
/// Everything is host byte order except [`ServiceAttr::Port`] (big-endian on
/// the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceAttr {
    /// `IPVS_SVC_ATTR_AF`: address family, u16 (2 or 10; kept raw so any
    /// value parses).
    Af(u16),
    /// `IPVS_SVC_ATTR_PROTOCOL`: IP protocol, u16.
    Protocol(Protocol),
    /// `IPVS_SVC_ATTR_ADDR`: virtual address, a `union nf_inet_addr`.
    ///
    /// Emitted as 16 bytes with an IPv4 address in the first 4 and zeroes
    /// after, the layout the kernel itself fills and `ipvsadm` sends (the
    /// kernel also accepts 4 bytes: it `nla_memcpy`s at most 16 into a zeroed
    /// union). Parsed from 4 bytes, or from 16 using the nest's
    /// [`ServiceAttr::Af`]; without `AF`, 16 bytes whose last 12 are zero
    /// read as IPv4.
    Addr(IpAddr),
    /// `IPVS_SVC_ATTR_PORT`: port, u16 big-endian on the wire, host order here.
    Port(u16),
    /// `IPVS_SVC_ATTR_FWMARK`: firewall mark, u32.
    Fwmark(u32),
    /// `IPVS_SVC_ATTR_SCHED_NAME`: scheduler name, NUL-terminated on the
    /// wire; parsed up to the first NUL, so unknown names are kept as is.
    SchedName(String),
    /// `IPVS_SVC_ATTR_FLAGS`: `struct ip_vs_flags`, 8 bytes.
    Flags(IpvsFlags),
    /// `IPVS_SVC_ATTR_TIMEOUT`: persistence timeout in seconds, u32.
    Timeout(u32),
    /// `IPVS_SVC_ATTR_NETMASK`: persistence netmask, u32 (see
    /// [`crate::Service::netmask`]).
    Netmask(u32),
    /// `IPVS_SVC_ATTR_STATS`: 32-bit statistics nest.
    Stats(Vec<StatsAttr>),
    /// `IPVS_SVC_ATTR_PE_NAME`: persistence-engine name, NUL-terminated.
    PeName(String),
    /// `IPVS_SVC_ATTR_STATS64`: 64-bit statistics nest.
    Stats64(Vec<Stats64Attr>),
    /// Any attribute this crate does not know, kept byte for byte.
    Other(DefaultNla),
}

impl Nla for ServiceAttr {
    fn value_len(&self) -> usize {
        match self {
            ServiceAttr::Af(_) | ServiceAttr::Protocol(_) | ServiceAttr::Port(_) => 2,
            ServiceAttr::Addr(_) => ADDR_LEN,
            ServiceAttr::Fwmark(_) | ServiceAttr::Timeout(_) | ServiceAttr::Netmask(_) => 4,
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => nul_string_len(s),
            ServiceAttr::Flags(_) => 8,
            ServiceAttr::Stats(attrs) => attrs.as_slice().buffer_len(),
            ServiceAttr::Stats64(attrs) => attrs.as_slice().buffer_len(),
            ServiceAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            ServiceAttr::Af(_) => IPVS_SVC_ATTR_AF,
            ServiceAttr::Protocol(_) => IPVS_SVC_ATTR_PROTOCOL,
            ServiceAttr::Addr(_) => IPVS_SVC_ATTR_ADDR,
            ServiceAttr::Port(_) => IPVS_SVC_ATTR_PORT,
            ServiceAttr::Fwmark(_) => IPVS_SVC_ATTR_FWMARK,
            ServiceAttr::SchedName(_) => IPVS_SVC_ATTR_SCHED_NAME,
            ServiceAttr::Flags(_) => IPVS_SVC_ATTR_FLAGS,
            ServiceAttr::Timeout(_) => IPVS_SVC_ATTR_TIMEOUT,
            ServiceAttr::Netmask(_) => IPVS_SVC_ATTR_NETMASK,
            ServiceAttr::Stats(_) => IPVS_SVC_ATTR_STATS,
            ServiceAttr::PeName(_) => IPVS_SVC_ATTR_PE_NAME,
            ServiceAttr::Stats64(_) => IPVS_SVC_ATTR_STATS64,
            ServiceAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            ServiceAttr::Af(v) => put(buffer, &v.to_ne_bytes()),
            ServiceAttr::Protocol(p) => put(buffer, &u16::from(*p).to_ne_bytes()),
            ServiceAttr::Addr(addr) => emit_addr(buffer, addr),
            ServiceAttr::Port(v) => put(buffer, &v.to_be_bytes()),
            ServiceAttr::Fwmark(v) | ServiceAttr::Timeout(v) | ServiceAttr::Netmask(v) => {
                put(buffer, &v.to_ne_bytes())
            }
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => emit_nul_string(buffer, s),
            ServiceAttr::Flags(f) => {
                put(buffer, &f.flags.0.to_ne_bytes());
                put(&mut buffer[4..], &f.mask.to_ne_bytes());
            }
            ServiceAttr::Stats(attrs) => attrs.as_slice().emit(buffer),
            ServiceAttr::Stats64(attrs) => attrs.as_slice().emit(buffer),
            ServiceAttr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> ParseableParametrized<NlaBuffer<&T>, Option<AddressFamily>>
    for ServiceAttr
{
    /// Parses one attribute; `family` is the nest's `AF`, used to read a
    /// 16-byte [`ServiceAttr::Addr`].
    fn parse_with_param(
        buf: &NlaBuffer<&T>,
        family: Option<AddressFamily>,
    ) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            IPVS_SVC_ATTR_AF => {
                ServiceAttr::Af(parse_u16(value).context("invalid IPVS_SVC_ATTR_AF")?)
            }
            IPVS_SVC_ATTR_PROTOCOL => ServiceAttr::Protocol(
                parse_u16(value)
                    .context("invalid IPVS_SVC_ATTR_PROTOCOL")?
                    .into(),
            ),
            IPVS_SVC_ATTR_ADDR => {
                ServiceAttr::Addr(parse_addr(value, family).context("invalid IPVS_SVC_ATTR_ADDR")?)
            }
            IPVS_SVC_ATTR_PORT => {
                ServiceAttr::Port(parse_u16_be(value).context("invalid IPVS_SVC_ATTR_PORT")?)
            }
            IPVS_SVC_ATTR_FWMARK => {
                ServiceAttr::Fwmark(parse_u32(value).context("invalid IPVS_SVC_ATTR_FWMARK")?)
            }
            IPVS_SVC_ATTR_SCHED_NAME => ServiceAttr::SchedName(
                parse_nul_string(value).context("invalid IPVS_SVC_ATTR_SCHED_NAME")?,
            ),
            IPVS_SVC_ATTR_FLAGS => {
                if value.len() != 8 {
                    return Err(DecodeError::from(format!(
                        "invalid IPVS_SVC_ATTR_FLAGS: expected 8 bytes, got {}",
                        value.len()
                    )));
                }
                ServiceAttr::Flags(IpvsFlags {
                    flags: ServiceFlags(parse_u32(&value[..4])?),
                    mask: parse_u32(&value[4..])?,
                })
            }
            IPVS_SVC_ATTR_TIMEOUT => {
                ServiceAttr::Timeout(parse_u32(value).context("invalid IPVS_SVC_ATTR_TIMEOUT")?)
            }
            IPVS_SVC_ATTR_NETMASK => {
                ServiceAttr::Netmask(parse_u32(value).context("invalid IPVS_SVC_ATTR_NETMASK")?)
            }
            IPVS_SVC_ATTR_STATS => {
                ServiceAttr::Stats(parse_stats_nest(value).context("invalid IPVS_SVC_ATTR_STATS")?)
            }
            IPVS_SVC_ATTR_PE_NAME => ServiceAttr::PeName(
                parse_nul_string(value).context("invalid IPVS_SVC_ATTR_PE_NAME")?,
            ),
            IPVS_SVC_ATTR_STATS64 => ServiceAttr::Stats64(
                parse_stats64_nest(value).context("invalid IPVS_SVC_ATTR_STATS64")?,
            ),
            _ => ServiceAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// Parses the body of a service nest, reading `AF` first so that the address
/// can be decoded whatever the attribute order.
pub(crate) fn parse_service_nest(buf: &[u8]) -> Result<Vec<ServiceAttr>, DecodeError> {
    let family = find_u16(buf, IPVS_SVC_ATTR_AF)?.and_then(AddressFamily::from_raw);
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|nla| ServiceAttr::parse_with_param(&nla, family)))
        .collect()
}

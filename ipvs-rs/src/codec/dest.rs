//! The destination nest, `IPVS_CMD_ATTR_DEST` (`IPVS_DEST_ATTR_*`
//! attributes; kernel side: `ip_vs_genl_parse_dest` and
//! `ip_vs_genl_fill_dest` in `ip_vs_ctl.c`, policy `ip_vs_dest_policy`).

use std::net::IpAddr;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized, parse_u8, parse_u16, parse_u16_be, parse_u32,
};

use super::stats::{Stats64Attr, StatsAttr, parse_stats_nest, parse_stats64_nest};
use super::wire::{ADDR_LEN, emit_addr, find_u16, parse_addr, put};
use crate::constants::*;
use crate::types::AddressFamily;

/// One attribute of the destination nest.
///
/// Everything is host byte order except [`DestAttr::Port`] and
/// [`DestAttr::TunPort`] (big-endian on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DestAttr {
    /// `IPVS_DEST_ATTR_ADDR`: real server address, a `union nf_inet_addr`.
    ///
    /// Emitted as 16 bytes (IPv4 in the first 4), like the kernel's fill and
    /// `ipvsadm`. Parsed from 4 bytes, or from 16 using the nest's
    /// [`DestAttr::AddrFamily`]; kernels before 3.18 do not send that, and
    /// then 16 bytes whose last 12 are zero read as IPv4.
    Addr(IpAddr),
    /// `IPVS_DEST_ATTR_PORT`: u16 big-endian on the wire, host order here.
    Port(u16),
    /// `IPVS_DEST_ATTR_FWD_METHOD`: raw `IP_VS_CONN_F_*` forwarding method,
    /// u32 (see [`crate::ForwardMethod::from_raw`]).
    FwdMethod(u32),
    /// `IPVS_DEST_ATTR_WEIGHT`: u32.
    Weight(u32),
    /// `IPVS_DEST_ATTR_U_THRESH`: upper connection threshold, u32.
    UThresh(u32),
    /// `IPVS_DEST_ATTR_L_THRESH`: lower connection threshold, u32.
    LThresh(u32),
    /// `IPVS_DEST_ATTR_ACTIVE_CONNS`: u32, reported by the kernel only.
    ActiveConns(u32),
    /// `IPVS_DEST_ATTR_INACT_CONNS`: u32, reported by the kernel only.
    InactConns(u32),
    /// `IPVS_DEST_ATTR_PERSIST_CONNS`: u32, reported by the kernel only.
    PersistConns(u32),
    /// `IPVS_DEST_ATTR_STATS`: 32-bit statistics nest.
    Stats(Vec<StatsAttr>),
    /// `IPVS_DEST_ATTR_ADDR_FAMILY`: u16 family of [`DestAttr::Addr`];
    /// when absent the kernel uses the service's family.
    AddrFamily(u16),
    /// `IPVS_DEST_ATTR_STATS64`: 64-bit statistics nest.
    Stats64(Vec<Stats64Attr>),
    /// `IPVS_DEST_ATTR_TUN_TYPE`: u8 tunnel type (0 IPIP, 1 GUE, 2 GRE).
    TunType(u8),
    /// `IPVS_DEST_ATTR_TUN_PORT`: u16 big-endian on the wire (GUE port).
    TunPort(u16),
    /// `IPVS_DEST_ATTR_TUN_FLAGS`: u16 `IP_VS_TUNNEL_ENCAP_FLAG_*`.
    TunFlags(u16),
    /// Any attribute this crate does not know, kept byte for byte.
    Other(DefaultNla),
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            DestAttr::Addr(_) => ADDR_LEN,
            DestAttr::Port(_)
            | DestAttr::AddrFamily(_)
            | DestAttr::TunPort(_)
            | DestAttr::TunFlags(_) => 2,
            DestAttr::FwdMethod(_)
            | DestAttr::Weight(_)
            | DestAttr::UThresh(_)
            | DestAttr::LThresh(_)
            | DestAttr::ActiveConns(_)
            | DestAttr::InactConns(_)
            | DestAttr::PersistConns(_) => 4,
            DestAttr::TunType(_) => 1,
            DestAttr::Stats(attrs) => attrs.as_slice().buffer_len(),
            DestAttr::Stats64(attrs) => attrs.as_slice().buffer_len(),
            DestAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DestAttr::Addr(_) => IPVS_DEST_ATTR_ADDR,
            DestAttr::Port(_) => IPVS_DEST_ATTR_PORT,
            DestAttr::FwdMethod(_) => IPVS_DEST_ATTR_FWD_METHOD,
            DestAttr::Weight(_) => IPVS_DEST_ATTR_WEIGHT,
            DestAttr::UThresh(_) => IPVS_DEST_ATTR_U_THRESH,
            DestAttr::LThresh(_) => IPVS_DEST_ATTR_L_THRESH,
            DestAttr::ActiveConns(_) => IPVS_DEST_ATTR_ACTIVE_CONNS,
            DestAttr::InactConns(_) => IPVS_DEST_ATTR_INACT_CONNS,
            DestAttr::PersistConns(_) => IPVS_DEST_ATTR_PERSIST_CONNS,
            DestAttr::Stats(_) => IPVS_DEST_ATTR_STATS,
            DestAttr::AddrFamily(_) => IPVS_DEST_ATTR_ADDR_FAMILY,
            DestAttr::Stats64(_) => IPVS_DEST_ATTR_STATS64,
            DestAttr::TunType(_) => IPVS_DEST_ATTR_TUN_TYPE,
            DestAttr::TunPort(_) => IPVS_DEST_ATTR_TUN_PORT,
            DestAttr::TunFlags(_) => IPVS_DEST_ATTR_TUN_FLAGS,
            DestAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            DestAttr::Addr(addr) => emit_addr(buffer, addr),
            DestAttr::Port(v) | DestAttr::TunPort(v) => put(buffer, &v.to_be_bytes()),
            DestAttr::AddrFamily(v) | DestAttr::TunFlags(v) => put(buffer, &v.to_ne_bytes()),
            DestAttr::FwdMethod(v)
            | DestAttr::Weight(v)
            | DestAttr::UThresh(v)
            | DestAttr::LThresh(v)
            | DestAttr::ActiveConns(v)
            | DestAttr::InactConns(v)
            | DestAttr::PersistConns(v) => put(buffer, &v.to_ne_bytes()),
            DestAttr::TunType(v) => put(buffer, &[*v]),
            DestAttr::Stats(attrs) => attrs.as_slice().emit(buffer),
            DestAttr::Stats64(attrs) => attrs.as_slice().emit(buffer),
            DestAttr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> ParseableParametrized<NlaBuffer<&T>, Option<AddressFamily>>
    for DestAttr
{
    /// Parses one attribute; `family` is the nest's `ADDR_FAMILY`, used to
    /// read a 16-byte [`DestAttr::Addr`].
    fn parse_with_param(
        buf: &NlaBuffer<&T>,
        family: Option<AddressFamily>,
    ) -> Result<Self, DecodeError> {
        let value = buf.value();
        let u32_of = |name: &str| parse_u32(value).context(format!("invalid {name}"));
        Ok(match buf.kind() {
            IPVS_DEST_ATTR_ADDR => {
                DestAttr::Addr(parse_addr(value, family).context("invalid IPVS_DEST_ATTR_ADDR")?)
            }
            IPVS_DEST_ATTR_PORT => {
                DestAttr::Port(parse_u16_be(value).context("invalid IPVS_DEST_ATTR_PORT")?)
            }
            IPVS_DEST_ATTR_FWD_METHOD => DestAttr::FwdMethod(u32_of("IPVS_DEST_ATTR_FWD_METHOD")?),
            IPVS_DEST_ATTR_WEIGHT => DestAttr::Weight(u32_of("IPVS_DEST_ATTR_WEIGHT")?),
            IPVS_DEST_ATTR_U_THRESH => DestAttr::UThresh(u32_of("IPVS_DEST_ATTR_U_THRESH")?),
            IPVS_DEST_ATTR_L_THRESH => DestAttr::LThresh(u32_of("IPVS_DEST_ATTR_L_THRESH")?),
            IPVS_DEST_ATTR_ACTIVE_CONNS => {
                DestAttr::ActiveConns(u32_of("IPVS_DEST_ATTR_ACTIVE_CONNS")?)
            }
            IPVS_DEST_ATTR_INACT_CONNS => {
                DestAttr::InactConns(u32_of("IPVS_DEST_ATTR_INACT_CONNS")?)
            }
            IPVS_DEST_ATTR_PERSIST_CONNS => {
                DestAttr::PersistConns(u32_of("IPVS_DEST_ATTR_PERSIST_CONNS")?)
            }
            IPVS_DEST_ATTR_STATS => {
                DestAttr::Stats(parse_stats_nest(value).context("invalid IPVS_DEST_ATTR_STATS")?)
            }
            IPVS_DEST_ATTR_ADDR_FAMILY => DestAttr::AddrFamily(
                parse_u16(value).context("invalid IPVS_DEST_ATTR_ADDR_FAMILY")?,
            ),
            IPVS_DEST_ATTR_STATS64 => DestAttr::Stats64(
                parse_stats64_nest(value).context("invalid IPVS_DEST_ATTR_STATS64")?,
            ),
            IPVS_DEST_ATTR_TUN_TYPE => {
                DestAttr::TunType(parse_u8(value).context("invalid IPVS_DEST_ATTR_TUN_TYPE")?)
            }
            IPVS_DEST_ATTR_TUN_PORT => {
                DestAttr::TunPort(parse_u16_be(value).context("invalid IPVS_DEST_ATTR_TUN_PORT")?)
            }
            IPVS_DEST_ATTR_TUN_FLAGS => {
                DestAttr::TunFlags(parse_u16(value).context("invalid IPVS_DEST_ATTR_TUN_FLAGS")?)
            }
            _ => DestAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// Parses the body of a destination nest, reading `ADDR_FAMILY` first so
/// that the address can be decoded whatever the attribute order.
pub(crate) fn parse_dest_nest(buf: &[u8]) -> Result<Vec<DestAttr>, DecodeError> {
    let family = find_u16(buf, IPVS_DEST_ATTR_ADDR_FAMILY)?.and_then(AddressFamily::from_raw);
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|nla| DestAttr::parse_with_param(&nla, family)))
        .collect()
}

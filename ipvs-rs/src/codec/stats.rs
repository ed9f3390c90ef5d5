//! Statistics nests: `IPVS_SVC_ATTR_STATS`/`IPVS_DEST_ATTR_STATS` (32-bit
//! counters) and `..._STATS64` (64-bit counters), both holding
//! `IPVS_STATS_ATTR_*` attributes (`ip_vs_genl_fill_stats` and
//! `ip_vs_genl_fill_stats64` in `ip_vs_ctl.c`).

use netlink_packet_core::{
    DecodeError, DefaultNla, ErrorContext, Nla, NlaBuffer, NlasIterator, Parseable, parse_u32,
    parse_u64,
};

use super::wire::put;

use crate::constants::*;
use crate::types::Stats;

/// One attribute of a 32-bit `..._STATS` nest (`struct ip_vs_stats_user`
/// layout: counters and rates are u32, byte counts u64; all host order).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatsAttr {
    /// `IPVS_STATS_ATTR_CONNS`, u32.
    Conns(u32),
    /// `IPVS_STATS_ATTR_INPKTS`, u32.
    InPkts(u32),
    /// `IPVS_STATS_ATTR_OUTPKTS`, u32.
    OutPkts(u32),
    /// `IPVS_STATS_ATTR_INBYTES`, u64.
    InBytes(u64),
    /// `IPVS_STATS_ATTR_OUTBYTES`, u64.
    OutBytes(u64),
    /// `IPVS_STATS_ATTR_CPS`, u32.
    Cps(u32),
    /// `IPVS_STATS_ATTR_INPPS`, u32.
    InPps(u32),
    /// `IPVS_STATS_ATTR_OUTPPS`, u32.
    OutPps(u32),
    /// `IPVS_STATS_ATTR_INBPS`, u32.
    InBps(u32),
    /// `IPVS_STATS_ATTR_OUTBPS`, u32.
    OutBps(u32),
    /// Any other attribute, including `IPVS_STATS_ATTR_PAD` alignment padding.
    Other(DefaultNla),
}

impl Nla for StatsAttr {
    fn value_len(&self) -> usize {
        match self {
            StatsAttr::InBytes(_) | StatsAttr::OutBytes(_) => 8,
            StatsAttr::Other(nla) => nla.value_len(),
            _ => 4,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            StatsAttr::Conns(_) => IPVS_STATS_ATTR_CONNS,
            StatsAttr::InPkts(_) => IPVS_STATS_ATTR_INPKTS,
            StatsAttr::OutPkts(_) => IPVS_STATS_ATTR_OUTPKTS,
            StatsAttr::InBytes(_) => IPVS_STATS_ATTR_INBYTES,
            StatsAttr::OutBytes(_) => IPVS_STATS_ATTR_OUTBYTES,
            StatsAttr::Cps(_) => IPVS_STATS_ATTR_CPS,
            StatsAttr::InPps(_) => IPVS_STATS_ATTR_INPPS,
            StatsAttr::OutPps(_) => IPVS_STATS_ATTR_OUTPPS,
            StatsAttr::InBps(_) => IPVS_STATS_ATTR_INBPS,
            StatsAttr::OutBps(_) => IPVS_STATS_ATTR_OUTBPS,
            StatsAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            StatsAttr::Conns(v)
            | StatsAttr::InPkts(v)
            | StatsAttr::OutPkts(v)
            | StatsAttr::Cps(v)
            | StatsAttr::InPps(v)
            | StatsAttr::OutPps(v)
            | StatsAttr::InBps(v)
            | StatsAttr::OutBps(v) => put(buffer, &v.to_ne_bytes()),
            StatsAttr::InBytes(v) | StatsAttr::OutBytes(v) => put(buffer, &v.to_ne_bytes()),
            StatsAttr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for StatsAttr {
    fn parse(buf: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        let u32_of = |name: &str| parse_u32(value).context(format!("invalid {name}"));
        Ok(match buf.kind() {
            IPVS_STATS_ATTR_CONNS => StatsAttr::Conns(u32_of("IPVS_STATS_ATTR_CONNS")?),
            IPVS_STATS_ATTR_INPKTS => StatsAttr::InPkts(u32_of("IPVS_STATS_ATTR_INPKTS")?),
            IPVS_STATS_ATTR_OUTPKTS => StatsAttr::OutPkts(u32_of("IPVS_STATS_ATTR_OUTPKTS")?),
            IPVS_STATS_ATTR_INBYTES => {
                StatsAttr::InBytes(parse_u64(value).context("invalid IPVS_STATS_ATTR_INBYTES")?)
            }
            IPVS_STATS_ATTR_OUTBYTES => {
                StatsAttr::OutBytes(parse_u64(value).context("invalid IPVS_STATS_ATTR_OUTBYTES")?)
            }
            IPVS_STATS_ATTR_CPS => StatsAttr::Cps(u32_of("IPVS_STATS_ATTR_CPS")?),
            IPVS_STATS_ATTR_INPPS => StatsAttr::InPps(u32_of("IPVS_STATS_ATTR_INPPS")?),
            IPVS_STATS_ATTR_OUTPPS => StatsAttr::OutPps(u32_of("IPVS_STATS_ATTR_OUTPPS")?),
            IPVS_STATS_ATTR_INBPS => StatsAttr::InBps(u32_of("IPVS_STATS_ATTR_INBPS")?),
            IPVS_STATS_ATTR_OUTBPS => StatsAttr::OutBps(u32_of("IPVS_STATS_ATTR_OUTBPS")?),
            _ => StatsAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// One attribute of a 64-bit `..._STATS64` nest: every counter is a
/// host-order u64 (`struct ip_vs_kstats`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stats64Attr {
    /// `IPVS_STATS_ATTR_CONNS`, u64.
    Conns(u64),
    /// `IPVS_STATS_ATTR_INPKTS`, u64.
    InPkts(u64),
    /// `IPVS_STATS_ATTR_OUTPKTS`, u64.
    OutPkts(u64),
    /// `IPVS_STATS_ATTR_INBYTES`, u64.
    InBytes(u64),
    /// `IPVS_STATS_ATTR_OUTBYTES`, u64.
    OutBytes(u64),
    /// `IPVS_STATS_ATTR_CPS`, u64.
    Cps(u64),
    /// `IPVS_STATS_ATTR_INPPS`, u64.
    InPps(u64),
    /// `IPVS_STATS_ATTR_OUTPPS`, u64.
    OutPps(u64),
    /// `IPVS_STATS_ATTR_INBPS`, u64.
    InBps(u64),
    /// `IPVS_STATS_ATTR_OUTBPS`, u64.
    OutBps(u64),
    /// Any other attribute, including `IPVS_STATS_ATTR_PAD` alignment padding
    /// that `nla_put_u64_64bit` adds on architectures without efficient
    /// unaligned access.
    Other(DefaultNla),
}

impl Nla for Stats64Attr {
    fn value_len(&self) -> usize {
        match self {
            Stats64Attr::Other(nla) => nla.value_len(),
            _ => 8,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Stats64Attr::Conns(_) => IPVS_STATS_ATTR_CONNS,
            Stats64Attr::InPkts(_) => IPVS_STATS_ATTR_INPKTS,
            Stats64Attr::OutPkts(_) => IPVS_STATS_ATTR_OUTPKTS,
            Stats64Attr::InBytes(_) => IPVS_STATS_ATTR_INBYTES,
            Stats64Attr::OutBytes(_) => IPVS_STATS_ATTR_OUTBYTES,
            Stats64Attr::Cps(_) => IPVS_STATS_ATTR_CPS,
            Stats64Attr::InPps(_) => IPVS_STATS_ATTR_INPPS,
            Stats64Attr::OutPps(_) => IPVS_STATS_ATTR_OUTPPS,
            Stats64Attr::InBps(_) => IPVS_STATS_ATTR_INBPS,
            Stats64Attr::OutBps(_) => IPVS_STATS_ATTR_OUTBPS,
            Stats64Attr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Stats64Attr::Conns(v)
            | Stats64Attr::InPkts(v)
            | Stats64Attr::OutPkts(v)
            | Stats64Attr::InBytes(v)
            | Stats64Attr::OutBytes(v)
            | Stats64Attr::Cps(v)
            | Stats64Attr::InPps(v)
            | Stats64Attr::OutPps(v)
            | Stats64Attr::InBps(v)
            | Stats64Attr::OutBps(v) => put(buffer, &v.to_ne_bytes()),
            Stats64Attr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for Stats64Attr {
    fn parse(buf: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        let u64_of = |name: &str| parse_u64(value).context(format!("invalid STATS64 {name}"));
        Ok(match buf.kind() {
            IPVS_STATS_ATTR_CONNS => Stats64Attr::Conns(u64_of("IPVS_STATS_ATTR_CONNS")?),
            IPVS_STATS_ATTR_INPKTS => Stats64Attr::InPkts(u64_of("IPVS_STATS_ATTR_INPKTS")?),
            IPVS_STATS_ATTR_OUTPKTS => Stats64Attr::OutPkts(u64_of("IPVS_STATS_ATTR_OUTPKTS")?),
            IPVS_STATS_ATTR_INBYTES => Stats64Attr::InBytes(u64_of("IPVS_STATS_ATTR_INBYTES")?),
            IPVS_STATS_ATTR_OUTBYTES => Stats64Attr::OutBytes(u64_of("IPVS_STATS_ATTR_OUTBYTES")?),
            IPVS_STATS_ATTR_CPS => Stats64Attr::Cps(u64_of("IPVS_STATS_ATTR_CPS")?),
            IPVS_STATS_ATTR_INPPS => Stats64Attr::InPps(u64_of("IPVS_STATS_ATTR_INPPS")?),
            IPVS_STATS_ATTR_OUTPPS => Stats64Attr::OutPps(u64_of("IPVS_STATS_ATTR_OUTPPS")?),
            IPVS_STATS_ATTR_INBPS => Stats64Attr::InBps(u64_of("IPVS_STATS_ATTR_INBPS")?),
            IPVS_STATS_ATTR_OUTBPS => Stats64Attr::OutBps(u64_of("IPVS_STATS_ATTR_OUTBPS")?),
            _ => Stats64Attr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// Parses the body of a `..._STATS` nest.
pub(crate) fn parse_stats_nest(buf: &[u8]) -> Result<Vec<StatsAttr>, DecodeError> {
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|nla| StatsAttr::parse(&nla)))
        .collect()
}

/// Parses the body of a `..._STATS64` nest.
pub(crate) fn parse_stats64_nest(buf: &[u8]) -> Result<Vec<Stats64Attr>, DecodeError> {
    NlasIterator::new(buf)
        .map(|nla| nla.and_then(|nla| Stats64Attr::parse(&nla)))
        .collect()
}

impl Stats {
    /// Builds [`Stats`] from a `STATS64` nest if there is one (exact
    /// counters), else from a 32-bit `STATS` nest; `None` without either.
    pub(crate) fn from_nests(
        stats: Option<&[StatsAttr]>,
        stats64: Option<&[Stats64Attr]>,
    ) -> Option<Stats> {
        if let Some(attrs) = stats64 {
            let mut s = Stats::default();
            for attr in attrs {
                match attr {
                    Stats64Attr::Conns(v) => s.connections = *v,
                    Stats64Attr::InPkts(v) => s.in_packets = *v,
                    Stats64Attr::OutPkts(v) => s.out_packets = *v,
                    Stats64Attr::InBytes(v) => s.in_bytes = *v,
                    Stats64Attr::OutBytes(v) => s.out_bytes = *v,
                    Stats64Attr::Cps(v) => s.cps = *v,
                    Stats64Attr::InPps(v) => s.in_pps = *v,
                    Stats64Attr::OutPps(v) => s.out_pps = *v,
                    Stats64Attr::InBps(v) => s.in_bps = *v,
                    Stats64Attr::OutBps(v) => s.out_bps = *v,
                    Stats64Attr::Other(_) => {}
                }
            }
            return Some(s);
        }
        let attrs = stats?;
        let mut s = Stats::default();
        for attr in attrs {
            match attr {
                StatsAttr::Conns(v) => s.connections = u64::from(*v),
                StatsAttr::InPkts(v) => s.in_packets = u64::from(*v),
                StatsAttr::OutPkts(v) => s.out_packets = u64::from(*v),
                StatsAttr::InBytes(v) => s.in_bytes = *v,
                StatsAttr::OutBytes(v) => s.out_bytes = *v,
                StatsAttr::Cps(v) => s.cps = u64::from(*v),
                StatsAttr::InPps(v) => s.in_pps = u64::from(*v),
                StatsAttr::OutPps(v) => s.out_pps = u64::from(*v),
                StatsAttr::InBps(v) => s.in_bps = u64::from(*v),
                StatsAttr::OutBps(v) => s.out_bps = u64::from(*v),
                StatsAttr::Other(_) => {}
            }
        }
        Some(s)
    }
}

//! Attributes of the `IPVS_CMD_GET_INFO` reply (`IPVS_INFO_ATTR_*`; filled
//! at the top level of the message by `ip_vs_genl_get_cmd` in `ip_vs_ctl.c`).

use netlink_packet_core::{
    DecodeError, DefaultNla, ErrorContext, Nla, NlaBuffer, Parseable, parse_u32,
};

use super::wire::put;
use crate::constants::*;

/// One attribute of the `GET_INFO` reply (command `IPVS_CMD_SET_INFO`). Its
/// type numbers overlap `IPVS_CMD_ATTR_SERVICE`/`DEST`, so
/// [`super::IpvsMessage`] reads them as info attributes only in messages
/// whose command is `SET_INFO` or `GET_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InfoAttr {
    /// `IPVS_INFO_ATTR_VERSION`: u32 `0x00MMmmpp` (see [`crate::Version`]).
    Version(u32),
    /// `IPVS_INFO_ATTR_CONN_TAB_SIZE`: u32 connection hash table size.
    ConnTabSize(u32),
    /// Any attribute this crate does not know, kept byte for byte.
    Other(DefaultNla),
}

impl Nla for InfoAttr {
    fn value_len(&self) -> usize {
        match self {
            InfoAttr::Version(_) | InfoAttr::ConnTabSize(_) => 4,
            InfoAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            InfoAttr::Version(_) => IPVS_INFO_ATTR_VERSION,
            InfoAttr::ConnTabSize(_) => IPVS_INFO_ATTR_CONN_TAB_SIZE,
            InfoAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            InfoAttr::Version(v) | InfoAttr::ConnTabSize(v) => put(buffer, &v.to_ne_bytes()),
            InfoAttr::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for InfoAttr {
    fn parse(buf: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            IPVS_INFO_ATTR_VERSION => {
                InfoAttr::Version(parse_u32(value).context("invalid IPVS_INFO_ATTR_VERSION")?)
            }
            IPVS_INFO_ATTR_CONN_TAB_SIZE => InfoAttr::ConnTabSize(
                parse_u32(value).context("invalid IPVS_INFO_ATTR_CONN_TAB_SIZE")?,
            ),
            _ => InfoAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

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
//!   [`DecodeError`](netlink_packet_core::DecodeError), never a panic.

mod dest;
mod info;
mod message;
mod service;
mod stats;
mod wire;

pub use dest::DestAttr;
pub use info::InfoAttr;
pub use message::{IpvsAttr, IpvsCmd, IpvsMessage};
pub use service::{IpvsFlags, ServiceAttr};
pub use stats::{Stats64Attr, StatsAttr};

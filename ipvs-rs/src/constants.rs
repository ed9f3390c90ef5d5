//! Numeric constants of the IPVS generic-netlink interface.
//!
//! Every value is copied from the kernel uapi header `include/uapi/linux/ip_vs.h`
//! (the enum or `#define` it comes from is named on each item). The family does
//! not change these numbers: new attributes are only ever appended.

/// Name of the generic-netlink family registered by the `ip_vs` module
/// (`IPVS_GENL_NAME`).
pub const IPVS_GENL_NAME: &str = "IPVS";
/// Version carried in the generic-netlink header of every IPVS message
/// (`IPVS_GENL_VERSION`).
pub const IPVS_GENL_VERSION: u8 = 1;

/// `IPVS_CMD_NEW_SERVICE`: add a virtual service; also the command of every
/// service entry the kernel sends back (dump and `GET_SERVICE` replies).
pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
/// `IPVS_CMD_SET_SERVICE`: modify an existing virtual service.
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
/// `IPVS_CMD_DEL_SERVICE`: delete a virtual service and its destinations.
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
/// `IPVS_CMD_GET_SERVICE`: get one service (do) or all services (dump).
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
/// `IPVS_CMD_NEW_DEST`: add a destination (real server); also the command of
/// every destination entry in a `GET_DEST` dump.
pub const IPVS_CMD_NEW_DEST: u8 = 5;
/// `IPVS_CMD_SET_DEST`: modify a destination.
pub const IPVS_CMD_SET_DEST: u8 = 6;
/// `IPVS_CMD_DEL_DEST`: delete a destination.
pub const IPVS_CMD_DEL_DEST: u8 = 7;
/// `IPVS_CMD_GET_DEST`: dump the destinations of one service (dump only).
pub const IPVS_CMD_GET_DEST: u8 = 8;
/// `IPVS_CMD_NEW_DAEMON`: start a connection-sync daemon.
pub const IPVS_CMD_NEW_DAEMON: u8 = 9;
/// `IPVS_CMD_DEL_DAEMON`: stop a connection-sync daemon.
pub const IPVS_CMD_DEL_DAEMON: u8 = 10;
/// `IPVS_CMD_GET_DAEMON`: dump the connection-sync daemons.
pub const IPVS_CMD_GET_DAEMON: u8 = 11;
/// `IPVS_CMD_SET_CONFIG`: set the protocol timeouts; also the command of the
/// `GET_CONFIG` reply.
pub const IPVS_CMD_SET_CONFIG: u8 = 12;
/// `IPVS_CMD_GET_CONFIG`: get the protocol timeouts.
pub const IPVS_CMD_GET_CONFIG: u8 = 13;
/// `IPVS_CMD_SET_INFO`: only used as the command of the `GET_INFO` reply.
pub const IPVS_CMD_SET_INFO: u8 = 14;
/// `IPVS_CMD_GET_INFO`: get the IPVS version and connection table size.
pub const IPVS_CMD_GET_INFO: u8 = 15;
/// `IPVS_CMD_ZERO`: zero the counters of one service or of all services.
pub const IPVS_CMD_ZERO: u8 = 16;
/// `IPVS_CMD_FLUSH`: delete every service of the network namespace.
pub const IPVS_CMD_FLUSH: u8 = 17;

/// `IPVS_CMD_ATTR_SERVICE`: nested service attributes (`IPVS_SVC_ATTR_*`).
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
/// `IPVS_CMD_ATTR_DEST`: nested destination attributes (`IPVS_DEST_ATTR_*`).
pub const IPVS_CMD_ATTR_DEST: u16 = 2;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP`: u32, seconds.
pub const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
/// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`: u32, seconds.
pub const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
/// `IPVS_CMD_ATTR_TIMEOUT_UDP`: u32, seconds.
pub const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

/// `IPVS_SVC_ATTR_AF`: u16 address family (`AF_INET` 2, `AF_INET6` 10).
pub const IPVS_SVC_ATTR_AF: u16 = 1;
/// `IPVS_SVC_ATTR_PROTOCOL`: u16 IP protocol number.
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
/// `IPVS_SVC_ATTR_ADDR`: binary `union nf_inet_addr`, at most 16 bytes.
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
/// `IPVS_SVC_ATTR_PORT`: u16 in network byte order.
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
/// `IPVS_SVC_ATTR_FWMARK`: u32 firewall mark.
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
/// `IPVS_SVC_ATTR_SCHED_NAME`: NUL-terminated scheduler name.
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
/// `IPVS_SVC_ATTR_FLAGS`: `struct ip_vs_flags { u32 flags; u32 mask; }`.
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
/// `IPVS_SVC_ATTR_TIMEOUT`: u32 persistence timeout, seconds.
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
/// `IPVS_SVC_ATTR_NETMASK`: u32 persistence netmask (IPv4 mask or IPv6 prefix length).
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;
/// `IPVS_SVC_ATTR_STATS`: nested 32-bit statistics (`IPVS_STATS_ATTR_*`).
pub const IPVS_SVC_ATTR_STATS: u16 = 10;
/// `IPVS_SVC_ATTR_PE_NAME`: NUL-terminated persistence-engine name.
pub const IPVS_SVC_ATTR_PE_NAME: u16 = 11;
/// `IPVS_SVC_ATTR_STATS64`: nested 64-bit statistics (`IPVS_STATS_ATTR_*`).
pub const IPVS_SVC_ATTR_STATS64: u16 = 12;

/// `IPVS_DEST_ATTR_ADDR`: binary `union nf_inet_addr`, at most 16 bytes.
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
/// `IPVS_DEST_ATTR_PORT`: u16 in network byte order.
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
/// `IPVS_DEST_ATTR_FWD_METHOD`: u32 forwarding method (`IP_VS_CONN_F_*`, mask 0x7).
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
/// `IPVS_DEST_ATTR_WEIGHT`: u32 weight (the kernel stores an `int`).
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
/// `IPVS_DEST_ATTR_U_THRESH`: u32 upper connection threshold.
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
/// `IPVS_DEST_ATTR_L_THRESH`: u32 lower connection threshold.
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
/// `IPVS_DEST_ATTR_ACTIVE_CONNS`: u32 active connections (read only).
pub const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
/// `IPVS_DEST_ATTR_INACT_CONNS`: u32 inactive connections (read only).
pub const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
/// `IPVS_DEST_ATTR_PERSIST_CONNS`: u32 persistent connections (read only).
pub const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
/// `IPVS_DEST_ATTR_STATS`: nested 32-bit statistics.
pub const IPVS_DEST_ATTR_STATS: u16 = 10;
/// `IPVS_DEST_ATTR_ADDR_FAMILY`: u16 address family of the destination (Linux ≥ 3.18).
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
/// `IPVS_DEST_ATTR_STATS64`: nested 64-bit statistics.
pub const IPVS_DEST_ATTR_STATS64: u16 = 12;
/// `IPVS_DEST_ATTR_TUN_TYPE`: u8 tunnel type (0 IPIP, 1 GUE, 2 GRE).
pub const IPVS_DEST_ATTR_TUN_TYPE: u16 = 13;
/// `IPVS_DEST_ATTR_TUN_PORT`: u16 tunnel port in network byte order.
pub const IPVS_DEST_ATTR_TUN_PORT: u16 = 14;
/// `IPVS_DEST_ATTR_TUN_FLAGS`: u16 tunnel flags.
pub const IPVS_DEST_ATTR_TUN_FLAGS: u16 = 15;

/// `IPVS_STATS_ATTR_CONNS`: connections scheduled.
pub const IPVS_STATS_ATTR_CONNS: u16 = 1;
/// `IPVS_STATS_ATTR_INPKTS`: incoming packets.
pub const IPVS_STATS_ATTR_INPKTS: u16 = 2;
/// `IPVS_STATS_ATTR_OUTPKTS`: outgoing packets.
pub const IPVS_STATS_ATTR_OUTPKTS: u16 = 3;
/// `IPVS_STATS_ATTR_INBYTES`: incoming bytes (u64 in both STATS and STATS64).
pub const IPVS_STATS_ATTR_INBYTES: u16 = 4;
/// `IPVS_STATS_ATTR_OUTBYTES`: outgoing bytes (u64 in both STATS and STATS64).
pub const IPVS_STATS_ATTR_OUTBYTES: u16 = 5;
/// `IPVS_STATS_ATTR_CPS`: current connection rate, per second.
pub const IPVS_STATS_ATTR_CPS: u16 = 6;
/// `IPVS_STATS_ATTR_INPPS`: current incoming packet rate, per second.
pub const IPVS_STATS_ATTR_INPPS: u16 = 7;
/// `IPVS_STATS_ATTR_OUTPPS`: current outgoing packet rate, per second.
pub const IPVS_STATS_ATTR_OUTPPS: u16 = 8;
/// `IPVS_STATS_ATTR_INBPS`: current incoming byte rate, per second.
pub const IPVS_STATS_ATTR_INBPS: u16 = 9;
/// `IPVS_STATS_ATTR_OUTBPS`: current outgoing byte rate, per second.
pub const IPVS_STATS_ATTR_OUTBPS: u16 = 10;

/// `IPVS_INFO_ATTR_VERSION`: u32 IPVS version `0x00MMmmpp`.
pub const IPVS_INFO_ATTR_VERSION: u16 = 1;
/// `IPVS_INFO_ATTR_CONN_TAB_SIZE`: u32 size of the connection hash table.
pub const IPVS_INFO_ATTR_CONN_TAB_SIZE: u16 = 2;

/// `IP_VS_SVC_F_PERSISTENT`: persistent service.
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x0001;
/// `IP_VS_SVC_F_HASHED`: the service is in the kernel's hash table (set by the kernel).
pub const IP_VS_SVC_F_HASHED: u32 = 0x0002;
/// `IP_VS_SVC_F_ONEPACKET`: one-packet scheduling.
pub const IP_VS_SVC_F_ONEPACKET: u32 = 0x0004;
/// `IP_VS_SVC_F_SCHED1`: scheduler flag 1 (`sh`/`mh` fallback).
pub const IP_VS_SVC_F_SCHED1: u32 = 0x0008;
/// `IP_VS_SVC_F_SCHED2`: scheduler flag 2 (`sh`/`mh` hash the port too).
pub const IP_VS_SVC_F_SCHED2: u32 = 0x0010;
/// `IP_VS_SVC_F_SCHED3`: scheduler flag 3.
pub const IP_VS_SVC_F_SCHED3: u32 = 0x0020;

/// `IP_VS_CONN_F_FWD_MASK`: bits of `IPVS_DEST_ATTR_FWD_METHOD` the kernel keeps.
pub const IP_VS_CONN_F_FWD_MASK: u32 = 0x0007;
/// `IP_VS_CONN_F_MASQ`: masquerading (NAT).
pub const IP_VS_CONN_F_MASQ: u32 = 0x0000;
/// `IP_VS_CONN_F_LOCALNODE`: local node.
pub const IP_VS_CONN_F_LOCALNODE: u32 = 0x0001;
/// `IP_VS_CONN_F_TUNNEL`: IP tunnelling.
pub const IP_VS_CONN_F_TUNNEL: u32 = 0x0002;
/// `IP_VS_CONN_F_DROUTE`: direct routing.
pub const IP_VS_CONN_F_DROUTE: u32 = 0x0003;
/// `IP_VS_CONN_F_BYPASS`: cache bypass.
pub const IP_VS_CONN_F_BYPASS: u32 = 0x0004;

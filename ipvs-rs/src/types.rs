//! The IPVS object model: services, destinations, statistics, timeouts.
//!
//! These are plain data types. [`crate::Handle`] sends and receives them; the
//! codec layer ([`crate::codec`]) turns them into netlink attributes.

use std::fmt;
use std::net::IpAddr;
use std::ops::BitOr;

use crate::constants::*;

/// Transport protocol of a virtual service.
///
/// Wire form: `IPVS_SVC_ATTR_PROTOCOL`, a host-order u16 holding the
/// `IPPROTO_*` number (`include/uapi/linux/in.h`). The kernel accepts the
/// protocols it has an IPVS protocol handler for (TCP, UDP, SCTP, AH, ESP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// `IPPROTO_TCP` (6).
    Tcp,
    /// `IPPROTO_UDP` (17).
    Udp,
    /// `IPPROTO_SCTP` (132).
    Sctp,
    /// Any other protocol number. `Other(6)` is not canonical: use
    /// [`Protocol::from`] to build values from raw numbers.
    Other(u16),
}

impl From<u16> for Protocol {
    fn from(raw: u16) -> Self {
        match raw {
            6 => Protocol::Tcp,
            17 => Protocol::Udp,
            132 => Protocol::Sctp,
            other => Protocol::Other(other),
        }
    }
}

impl From<Protocol> for u16 {
    fn from(protocol: Protocol) -> u16 {
        match protocol {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Other(raw) => raw,
        }
    }
}

impl fmt::Display for Protocol {
    /// `TCP`, `UDP`, `SCTP` or `proto N`, as `ipvsadm` prints them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protocol::Tcp => f.write_str("TCP"),
            Protocol::Udp => f.write_str("UDP"),
            Protocol::Sctp => f.write_str("SCTP"),
            Protocol::Other(raw) => write!(f, "proto {raw}"),
        }
    }
}

/// Address family of a service or destination.
///
/// Wire form: `IPVS_SVC_ATTR_AF` / `IPVS_DEST_ATTR_ADDR_FAMILY`, a host-order
/// u16 (`AF_INET` 2, `AF_INET6` 10 from `include/linux/socket.h`). Any other
/// value makes the kernel answer `EAFNOSUPPORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressFamily {
    /// IPv4, `AF_INET` (2).
    Inet,
    /// IPv6, `AF_INET6` (10).
    Inet6,
}

impl AddressFamily {
    /// The raw `AF_*` number sent on the wire.
    pub const fn raw(self) -> u16 {
        match self {
            AddressFamily::Inet => libc::AF_INET as u16,
            AddressFamily::Inet6 => libc::AF_INET6 as u16,
        }
    }

    /// Parses a raw `AF_*` number; `None` for anything but 2 and 10.
    pub const fn from_raw(raw: u16) -> Option<Self> {
        match raw as i32 {
            libc::AF_INET => Some(AddressFamily::Inet),
            libc::AF_INET6 => Some(AddressFamily::Inet6),
            _ => None,
        }
    }

    /// The family of an IP address.
    pub const fn of(address: &IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        }
    }

    /// The persistence netmask meaning "one client address": `0xffffffff`
    /// (a /32 mask) for IPv4 and the prefix length `128` for IPv6, the values
    /// `ipvsadm` and kube-proxy send. The kernel rejects an IPv6 netmask
    /// outside 1..=128 with `EINVAL` (`ip_vs_add_service`, `ip_vs_edit_service`).
    pub const fn full_netmask(self) -> u32 {
        match self {
            AddressFamily::Inet => 0xffff_ffff,
            AddressFamily::Inet6 => 128,
        }
    }
}

/// Identity of a virtual service: what `IPVS_CMD_ATTR_SERVICE` must carry for
/// the kernel to find it (`ip_vs_genl_parse_service` needs `AF` plus either
/// `FWMARK`, or `PROTOCOL`, `ADDR` and `PORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceId {
    /// A service matched by destination address, port and protocol.
    Inet {
        /// Virtual IP address; its version gives the family.
        address: IpAddr,
        /// Virtual port, host order (sent big-endian). Port 0 is the kernel's
        /// catch-all "any port" service.
        port: u16,
        /// Transport protocol.
        protocol: Protocol,
    },
    /// A service matched by the packet's firewall mark (`fwmark`).
    Fwmark {
        /// Family of the packets the mark applies to.
        family: AddressFamily,
        /// The firewall mark. Must be non-zero: the kernel treats mark 0 as
        /// "no mark" and then looks for an address-based TCP service instead.
        mark: u32,
    },
}

impl ServiceId {
    /// The service's address family.
    pub const fn family(&self) -> AddressFamily {
        match self {
            ServiceId::Inet { address, .. } => AddressFamily::of(address),
            ServiceId::Fwmark { family, .. } => *family,
        }
    }
}

impl fmt::Display for ServiceId {
    /// `TCP 10.0.0.1:80`, `UDP [2001:db8::1]:53` or `FWM 7 IPv4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceId::Inet {
                address: IpAddr::V4(address),
                port,
                protocol,
            } => write!(f, "{protocol} {address}:{port}"),
            ServiceId::Inet {
                address: IpAddr::V6(address),
                port,
                protocol,
            } => write!(f, "{protocol} [{address}]:{port}"),
            ServiceId::Fwmark { family, mark } => {
                let family = match family {
                    AddressFamily::Inet => "IPv4",
                    AddressFamily::Inet6 => "IPv6",
                };
                write!(f, "FWM {mark} {family}")
            }
        }
    }
}

/// Virtual-service flags (`IP_VS_SVC_F_*` in `ip_vs.h`), a bit set.
///
/// On the wire the flags travel in `IPVS_SVC_ATTR_FLAGS` as
/// `struct ip_vs_flags { u32 flags; u32 mask; }` (see
/// [`crate::codec::IpvsFlags`]). Services read from the kernel always carry
/// [`ServiceFlags::HASHED`]; compare with [`ServiceFlags::without_hashed`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ServiceFlags(pub u32);

impl ServiceFlags {
    /// `IP_VS_SVC_F_PERSISTENT` (0x1): persistent service; the kernel sets it
    /// together with the persistence timeout.
    pub const PERSISTENT: ServiceFlags = ServiceFlags(IP_VS_SVC_F_PERSISTENT);
    /// `IP_VS_SVC_F_HASHED` (0x2): the service is in the kernel's hash table.
    /// Kernel-owned: reported in every dump, stripped by this crate on writes.
    pub const HASHED: ServiceFlags = ServiceFlags(IP_VS_SVC_F_HASHED);
    /// `IP_VS_SVC_F_ONEPACKET` (0x4): schedule every UDP packet on its own.
    pub const ONEPACKET: ServiceFlags = ServiceFlags(IP_VS_SVC_F_ONEPACKET);
    /// `IP_VS_SVC_F_SCHED1` (0x8): scheduler flag 1 (`sh`/`mh`: fall back to
    /// another server when the chosen one is unavailable).
    pub const SCHED1: ServiceFlags = ServiceFlags(IP_VS_SVC_F_SCHED1);
    /// `IP_VS_SVC_F_SCHED2` (0x10): scheduler flag 2 (`sh`/`mh`: hash the source port too).
    pub const SCHED2: ServiceFlags = ServiceFlags(IP_VS_SVC_F_SCHED2);
    /// `IP_VS_SVC_F_SCHED3` (0x20): scheduler flag 3.
    pub const SCHED3: ServiceFlags = ServiceFlags(IP_VS_SVC_F_SCHED3);

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: ServiceFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the kernel-owned [`ServiceFlags::HASHED`] bit cleared: the
    /// form to compare desired and observed services with.
    pub const fn without_hashed(self) -> ServiceFlags {
        ServiceFlags(self.0 & !IP_VS_SVC_F_HASHED)
    }
}

impl BitOr for ServiceFlags {
    type Output = ServiceFlags;

    fn bitor(self, rhs: ServiceFlags) -> ServiceFlags {
        ServiceFlags(self.0 | rhs.0)
    }
}

/// Traffic counters and rate estimates of a service or destination.
///
/// Read from `IPVS_SVC_ATTR_STATS64` / `IPVS_DEST_ATTR_STATS64` (all u64,
/// on current kernels) when present, otherwise from the older `..._STATS` nest whose
/// counters other than the byte counts are 32 bits wide and wrap. Rates are
/// the kernel estimator's values (`ip_vs_est.c`), updated every 2 seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Connections scheduled (`IPVS_STATS_ATTR_CONNS`).
    pub connections: u64,
    /// Incoming packets (`IPVS_STATS_ATTR_INPKTS`).
    pub in_packets: u64,
    /// Outgoing packets (`IPVS_STATS_ATTR_OUTPKTS`).
    pub out_packets: u64,
    /// Incoming bytes (`IPVS_STATS_ATTR_INBYTES`).
    pub in_bytes: u64,
    /// Outgoing bytes (`IPVS_STATS_ATTR_OUTBYTES`).
    pub out_bytes: u64,
    /// Connections per second (`IPVS_STATS_ATTR_CPS`).
    pub cps: u64,
    /// Incoming packets per second (`IPVS_STATS_ATTR_INPPS`).
    pub in_pps: u64,
    /// Outgoing packets per second (`IPVS_STATS_ATTR_OUTPPS`).
    pub out_pps: u64,
    /// Incoming bytes per second (`IPVS_STATS_ATTR_INBPS`).
    pub in_bps: u64,
    /// Outgoing bytes per second (`IPVS_STATS_ATTR_OUTBPS`).
    pub out_bps: u64,
}

/// A virtual service, as `IPVS_CMD_NEW_SERVICE`/`SET_SERVICE` take it and as
/// the kernel reports it (`ip_vs_genl_fill_service` in `ip_vs_ctl.c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Which service this is.
    pub id: ServiceId,
    /// Scheduler name, e.g. `rr`, `wrr`, `lc`, `sh`, `mh`; at most 15 bytes
    /// (`IP_VS_SCHEDNAME_MAXLEN` − 1). The kernel loads `ip_vs_<name>` on
    /// demand and answers `ENOENT` if there is no such scheduler. `none`
    /// means "no scheduler" on kernels that allow that, and is what they report
    /// for a service without one.
    pub scheduler: String,
    /// Service flags. Writes send them with mask `0xffffffff` (every flag is
    /// replaced) after clearing the kernel-owned `HASHED` bit.
    pub flags: ServiceFlags,
    /// Persistence timeout in seconds (`IPVS_SVC_ATTR_TIMEOUT`); meaningful
    /// with [`ServiceFlags::PERSISTENT`], 0 otherwise.
    pub timeout: u32,
    /// Persistence netmask (`IPVS_SVC_ATTR_NETMASK`). IPv4: the mask's 4 bytes
    /// in network order read as a host-order u32 (`0xffffffff` for /32);
    /// IPv6: the prefix length 1..=128. See [`AddressFamily::full_netmask`].
    pub netmask: u32,
    /// Persistence engine (`IPVS_SVC_ATTR_PE_NAME`, e.g. `sip`), if any.
    pub pe_name: Option<String>,
    /// Counters; `Some` only for services read from the kernel, ignored on writes.
    pub stats: Option<Stats>,
}

impl Service {
    /// A non-persistent service with `scheduler`, no flags, timeout 0 and the
    /// family's full netmask (`0xffffffff` for IPv4, 128 for IPv6).
    pub fn new(id: ServiceId, scheduler: impl Into<String>) -> Service {
        Service {
            netmask: id.family().full_netmask(),
            id,
            scheduler: scheduler.into(),
            flags: ServiceFlags::default(),
            timeout: 0,
            pe_name: None,
            stats: None,
        }
    }
}

/// How packets reach a destination (`IPVS_DEST_ATTR_FWD_METHOD`, the
/// `IP_VS_CONN_F_*` forwarding values of `ip_vs.h`, mask
/// `IP_VS_CONN_F_FWD_MASK` = 0x7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ForwardMethod {
    /// `IP_VS_CONN_F_MASQ` (0): NAT, the only method that rewrites the port.
    #[default]
    Masquerade,
    /// `IP_VS_CONN_F_LOCALNODE` (1): deliver locally.
    Local,
    /// `IP_VS_CONN_F_TUNNEL` (2): IP-in-IP (or GUE/GRE) tunnelling; the only
    /// method allowed for a destination whose family differs from the service's.
    Tunnel,
    /// `IP_VS_CONN_F_DROUTE` (3): direct routing.
    DirectRoute,
    /// `IP_VS_CONN_F_BYPASS` (4): cache bypass.
    Bypass,
}

impl ForwardMethod {
    /// The raw `IP_VS_CONN_F_*` value sent on the wire.
    pub const fn raw(self) -> u32 {
        match self {
            ForwardMethod::Masquerade => IP_VS_CONN_F_MASQ,
            ForwardMethod::Local => IP_VS_CONN_F_LOCALNODE,
            ForwardMethod::Tunnel => IP_VS_CONN_F_TUNNEL,
            ForwardMethod::DirectRoute => IP_VS_CONN_F_DROUTE,
            ForwardMethod::Bypass => IP_VS_CONN_F_BYPASS,
        }
    }

    /// Parses a raw value after masking it with `IP_VS_CONN_F_FWD_MASK`, as
    /// the kernel does; `None` for the unused values 5..=7.
    pub const fn from_raw(raw: u32) -> Option<ForwardMethod> {
        match raw & IP_VS_CONN_F_FWD_MASK {
            IP_VS_CONN_F_MASQ => Some(ForwardMethod::Masquerade),
            IP_VS_CONN_F_LOCALNODE => Some(ForwardMethod::Local),
            IP_VS_CONN_F_TUNNEL => Some(ForwardMethod::Tunnel),
            IP_VS_CONN_F_DROUTE => Some(ForwardMethod::DirectRoute),
            IP_VS_CONN_F_BYPASS => Some(ForwardMethod::Bypass),
            _ => None,
        }
    }
}

/// A destination (real server) of a virtual service, as
/// `IPVS_CMD_NEW_DEST`/`SET_DEST` take it and as the kernel reports it
/// (`ip_vs_genl_fill_dest` in `ip_vs_ctl.c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Real server address. Its family may differ from the service's only
    /// with [`ForwardMethod::Tunnel`] (otherwise `EINVAL`).
    pub address: IpAddr,
    /// Real server port, host order (sent big-endian). Only masquerading
    /// rewrites ports; the other methods keep the service port.
    pub port: u16,
    /// Forwarding method.
    pub forward: ForwardMethod,
    /// Scheduling weight. 0 quiesces the server (no new connections). The
    /// kernel stores an `int`: values above `i32::MAX` fail with `ERANGE`.
    pub weight: u32,
    /// Upper connection threshold; 0 means unlimited. The kernel answers
    /// `ERANGE` when `lower_threshold > upper_threshold`, also when the upper
    /// one is 0.
    pub upper_threshold: u32,
    /// Lower connection threshold; 0 means unset.
    pub lower_threshold: u32,
    /// Active connections (read only, `IPVS_DEST_ATTR_ACTIVE_CONNS`).
    pub active_connections: u32,
    /// Inactive connections (read only, `IPVS_DEST_ATTR_INACT_CONNS`).
    pub inactive_connections: u32,
    /// Persistence templates pointing at this server (read only,
    /// `IPVS_DEST_ATTR_PERSIST_CONNS`).
    pub persistent_connections: u32,
    /// Counters; `Some` only for destinations read from the kernel.
    pub stats: Option<Stats>,
}

impl Destination {
    /// A masquerading destination with `weight`, no thresholds and zeroed
    /// read-only counters.
    pub fn new(address: IpAddr, port: u16, weight: u32) -> Destination {
        Destination {
            address,
            port,
            forward: ForwardMethod::Masquerade,
            weight,
            upper_threshold: 0,
            lower_threshold: 0,
            active_connections: 0,
            inactive_connections: 0,
            persistent_connections: 0,
            stats: None,
        }
    }
}

/// Connection timeouts of the IPVS protocol handlers, in seconds
/// (`struct ip_vs_timeout_user`, `IPVS_CMD_ATTR_TIMEOUT_*`).
///
/// In [`crate::Handle::set_timeouts`] a 0 leaves that timeout unchanged
/// (`ip_vs_set_timeout` only applies non-zero values); values above
/// `INT_MAX / HZ` fail with `EINVAL`. [`crate::Handle::timeouts`] reports 0 for a
/// protocol the kernel was built without (`CONFIG_IP_VS_PROTO_TCP`/`UDP`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Timeouts {
    /// Established TCP connections (`IPVS_CMD_ATTR_TIMEOUT_TCP`), default 900.
    pub tcp: u32,
    /// TCP connections after a FIN (`IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`), default 120.
    pub tcp_fin: u32,
    /// UDP "connections" (`IPVS_CMD_ATTR_TIMEOUT_UDP`), default 300.
    pub udp: u32,
}

/// IPVS version (`IP_VS_VERSION_CODE`, e.g. 1.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// Major version, bits 16..24 of the code.
    pub major: u8,
    /// Minor version, bits 8..16 of the code.
    pub minor: u8,
    /// Patch level, bits 0..8 of the code.
    pub patch: u8,
}

impl From<u32> for Version {
    /// Splits `IPVS_INFO_ATTR_VERSION` (`0x00MMmmpp`) like the kernel's
    /// `NVERSION` macro.
    fn from(code: u32) -> Version {
        let [_, major, minor, patch] = code.to_be_bytes();
        Version {
            major,
            minor,
            patch,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// General IPVS information (`IPVS_CMD_GET_INFO` reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Info {
    /// IPVS version (`IPVS_INFO_ATTR_VERSION`).
    pub version: Version,
    /// Number of buckets of the connection hash table
    /// (`IPVS_INFO_ATTR_CONN_TAB_SIZE`, the `ip_vs` module's `conn_tab_bits`).
    pub connection_table_size: u32,
}

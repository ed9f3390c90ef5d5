//! The kernel's text listing of the IPVS table, `/proc/net/ip_vs`: every virtual service with
//! all its destinations in one read, where the generic-netlink API needs one
//! `IPVS_CMD_GET_DEST` dump per service.
//!
//! The format is `ip_vs_info_seq_show` in `net/netfilter/ipvs/ip_vs_ctl.c` (Linux 6.x; the
//! protocol names are `ip_vs_proto_name` in `ip_vs_core.c`, the forwarding names
//! `ip_vs_fwd_name` in `ip_vs_ctl.c`):
//!
//! ```text
//! IP Virtual Server version 1.2.1 (size=4096)
//! Prot LocalAddress:Port Scheduler Flags
//!   -> RemoteAddress:Port Forward Weight ActiveConn InActConn
//! TCP  0A60000A:0050 rr
//!   -> 0AF40102:1F90      Masq    1      0          2
//! UDP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0035 rr persistent 10800000 FFFFFFFF
//!   -> [fd00:0000:0000:0000:0000:0000:0001:0005]:0035      Masq    0      0          0
//! FWM  00000007 wrr ops
//!   -> 0AF40103:0000      Route   3      1          0
//! ```
//!
//! A service line is `Prot Address:Port Scheduler Flags` (IPv4 as `%08X:%04X` in host order,
//! IPv6 as `[%pI6]:%04X`) or `FWM Mark Scheduler Flags` (`%08X`, no family); its destination
//! lines follow, each `  -> Address:Port Forward Weight ActiveConn InActConn`. The flags
//! (`ops`, `persistent <timeout in jiffies> <netmask>`) are not parsed: the netlink service dump
//! has them exactly. The listing does not tell `Bypass` forwarding from `Masq`, nor carry the
//! thresholds, the persistent connection count or the counters; a firewall-mark service's
//! family is not in it either.
//!
//! The file belongs to the network namespace of the `/proc/<pid>/net` it is opened through, for
//! as long as it is open ([`ProcListing::open`]). Each service is printed in one step under RCU,
//! its destinations with it; between the reads of a long listing the table may change, so a
//! service changed meanwhile can be missing or appear twice.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use crate::types::{ForwardMethod, Protocol, ServiceId};

/// The listing of the calling thread's network namespace.
pub const PROC_NET_IP_VS: &str = "/proc/thread-self/net/ip_vs";

/// The header `ip_vs_info_seq_show` prints after the version line.
const SERVICE_HEADER: &str = "Prot LocalAddress:Port Scheduler Flags";
/// The second header line: the columns of a destination line.
const DESTINATION_HEADER: &str = "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn";
/// What every destination line starts with.
const DESTINATION_PREFIX: &str = "  -> ";

/// Why the listing could not be read.
#[derive(thiserror::Error, Debug)]
pub enum ListingError {
    /// Opening or reading the file failed (`ENOENT`: no IPVS in the kernel, or `/proc` without
    /// `thread-self`).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A line is not in the format of `ip_vs_info_seq_show`.
    #[error("line {line} of the IPVS listing: {reason}: {text:?}")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// How a listed service matches packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListedId {
    /// By destination address, port and protocol: [`ServiceId::Inet`].
    Inet {
        /// Virtual IP address.
        address: IpAddr,
        /// Virtual port.
        port: u16,
        /// Transport protocol.
        protocol: Protocol,
    },
    /// By firewall mark; the listing does not print the family.
    Fwmark {
        /// The mark.
        mark: u32,
    },
}

impl ListedId {
    /// The netlink identity of an address-based service; `None` for a firewall-mark one (its
    /// family is not listed).
    pub fn service_id(&self) -> Option<ServiceId> {
        match *self {
            ListedId::Inet {
                address,
                port,
                protocol,
            } => Some(ServiceId::Inet {
                address,
                port,
                protocol,
            }),
            ListedId::Fwmark { .. } => None,
        }
    }
}

/// One virtual service of the listing with its destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedService {
    /// Which service.
    pub id: ListedId,
    /// Scheduler name (`none` for a service without one).
    pub scheduler: String,
    /// Its destinations, in the kernel's order.
    pub destinations: Vec<ListedDestination>,
}

/// One destination line: what the listing shares with [`crate::Destination`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedDestination {
    /// Real server address.
    pub address: IpAddr,
    /// Real server port.
    pub port: u16,
    /// Forwarding method (`Masq` also for [`ForwardMethod::Bypass`]).
    pub forward: ForwardMethod,
    /// Scheduling weight.
    pub weight: u32,
    /// Active connections (`ActiveConn`).
    pub active_connections: u32,
    /// Inactive connections (`InActConn`).
    pub inactive_connections: u32,
}

/// `/proc/net/ip_vs` of one network namespace, held open and read again on each
/// [`ProcListing::read`].
#[derive(Debug)]
pub struct ProcListing {
    file: File,
    path: String,
    /// The last listing's text, kept for its capacity.
    text: String,
}

impl ProcListing {
    /// Opens [`PROC_NET_IP_VS`]: the listing of the calling thread's network namespace (the one a
    /// netlink socket opened by this thread talks to), whichever thread reads it later.
    ///
    /// # Errors
    /// [`ListingError::Io`], `ENOENT` when the kernel has no IPVS (the file appears with the
    /// `ip_vs` module) or no `/proc/thread-self`.
    pub fn open() -> Result<ProcListing, ListingError> {
        ProcListing::open_path(PROC_NET_IP_VS)
    }

    /// Opens a listing at `path` (for example `/proc/<pid>/net/ip_vs` of another process's
    /// namespace).
    ///
    /// # Errors
    /// [`ListingError::Io`].
    pub fn open_path(path: impl AsRef<Path>) -> Result<ProcListing, ListingError> {
        let path = path.as_ref().display().to_string();
        let file = File::open(&path).map_err(|source| ListingError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(ProcListing {
            file,
            path,
            text: String::new(),
        })
    }

    /// Reads the whole listing again (the kernel prints it anew from offset 0) and parses it.
    /// A blocking read: the kernel formats the table during the call.
    ///
    /// # Errors
    /// [`ListingError::Io`] when the read fails, [`ListingError::Parse`] when the text is not
    /// in the format of `ip_vs_info_seq_show`.
    pub fn read(&mut self) -> Result<Vec<ListedService>, ListingError> {
        self.text.clear();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut self.text))
            .map_err(|source| ListingError::Io {
                path: self.path.clone(),
                source,
            })?;
        parse(&self.text)
    }
}

/// Parses the text of `/proc/net/ip_vs` (the format of `ip_vs_info_seq_show`, see the module's
/// documentation).
///
/// # Errors
/// [`ListingError::Parse`] for the first line that is not in that format: a header other than
/// the kernel's, an unknown protocol or forwarding name, a malformed address, port or number,
/// or a destination line before any service.
pub fn parse(text: &str) -> Result<Vec<ListedService>, ListingError> {
    let mut lines = text.lines().enumerate();
    let mut services: Vec<ListedService> = Vec::new();
    let error = |index: usize, text: &str, reason| ListingError::Parse {
        line: index + 1,
        text: text.to_owned(),
        reason,
    };
    match lines.next() {
        Some((_, l)) if l.starts_with("IP Virtual Server version ") => {}
        Some((i, l)) => return Err(error(i, l, "not the IPVS version line")),
        None => return Err(error(0, "", "empty listing")),
    }
    for (want, reason) in [
        (SERVICE_HEADER, "not the service header"),
        (DESTINATION_HEADER, "not the destination header"),
    ] {
        match lines.next() {
            Some((_, l)) if l == want => {}
            Some((i, l)) => return Err(error(i, l, reason)),
            None => return Err(error(0, "", "the listing ends within its header")),
        }
    }
    for (i, line) in lines {
        if let Some(rest) = line.strip_prefix(DESTINATION_PREFIX) {
            let destination = destination(rest).map_err(|reason| error(i, line, reason))?;
            services
                .last_mut()
                .ok_or_else(|| error(i, line, "a destination before any service"))?
                .destinations
                .push(destination);
        } else {
            services.push(service(line).map_err(|reason| error(i, line, reason))?);
        }
    }
    Ok(services)
}

/// A service line: `Prot Address:Port Scheduler [Flags]` or `FWM Mark Scheduler [Flags]`.
fn service(line: &str) -> Result<ListedService, &'static str> {
    let mut fields = line.split_whitespace();
    let (Some(protocol), Some(address), Some(scheduler)) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err("a service line has at least three fields");
    };
    let id = if protocol == "FWM" {
        ListedId::Fwmark {
            mark: hex(address, 8).ok_or("the firewall mark is not %08X")?,
        }
    } else {
        let (address, port) = socket(address)?;
        ListedId::Inet {
            address,
            port,
            protocol: protocol_named(protocol).ok_or("unknown protocol name")?,
        }
    };
    Ok(ListedService {
        id,
        scheduler: scheduler.to_owned(),
        destinations: Vec::new(),
    })
}

/// A destination line after its `  -> `: `Address:Port Forward Weight ActiveConn InActConn`.
fn destination(rest: &str) -> Result<ListedDestination, &'static str> {
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let [address, forward, weight, active, inactive] = fields[..] else {
        return Err("a destination line has five fields");
    };
    let (address, port) = socket(address)?;
    let forward = match forward {
        "Masq" => ForwardMethod::Masquerade,
        "Local" => ForwardMethod::Local,
        "Tunnel" => ForwardMethod::Tunnel,
        "Route" => ForwardMethod::DirectRoute,
        _ => return Err("unknown forwarding name"),
    };
    Ok(ListedDestination {
        address,
        port,
        forward,
        weight: weight.parse().map_err(|_| "the weight is not a number")?,
        active_connections: counter(active).ok_or("ActiveConn is not a number")?,
        inactive_connections: counter(inactive).ok_or("InActConn is not a number")?,
    })
}

/// A connection counter, printed `%d` from the kernel's `atomic_t`: read back as the `u32` the
/// netlink attribute carries for the same value (`nla_put_u32` of the same `atomic_read`).
fn counter(field: &str) -> Option<u32> {
    field.parse::<i32>().ok().map(i32::cast_unsigned)
}

/// `%08X:%04X` (IPv4, host order) or `[%pI6]:%04X` (IPv6, eight groups of four digits).
fn socket(field: &str) -> Result<(IpAddr, u16), &'static str> {
    let (address, port) = if let Some(v6) = field.strip_prefix('[') {
        let (address, port) = v6
            .split_once("]:")
            .ok_or("an IPv6 address is [%pI6]:%04X")?;
        let address: Ipv6Addr = address.parse().map_err(|_| "not an IPv6 address")?;
        (IpAddr::V6(address), port)
    } else {
        let (address, port) = field
            .split_once(':')
            .ok_or("an IPv4 address is %08X:%04X")?;
        let address = hex(address, 8).ok_or("an IPv4 address is %08X")?;
        (IpAddr::V4(Ipv4Addr::from(address)), port)
    };
    let port = hex(port, 4).ok_or("a port is %04X")?;
    Ok((address, u16::try_from(port).map_err(|_| "a port is %04X")?))
}

/// Exactly `digits` upper-case hexadecimal digits (`%0NX`).
fn hex(field: &str, digits: usize) -> Option<u32> {
    let valid = field.len() == digits
        && field
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b));
    valid.then(|| u32::from_str_radix(field, 16).ok()).flatten()
}

/// The protocol named as `ip_vs_proto_name` names it (`IP_<n>` for a number without a name).
fn protocol_named(name: &str) -> Option<Protocol> {
    let number = match name {
        "TCP" => return Some(Protocol::Tcp),
        "UDP" => return Some(Protocol::Udp),
        "SCTP" => return Some(Protocol::Sctp),
        "IP" => 0,
        "ICMP" => 1,
        "IPIP" => 4,
        "GRE" => 47,
        "ICMPv6" => 58,
        other => other.strip_prefix("IP_")?.parse().ok()?,
    };
    Some(Protocol::from(number))
}

#[cfg(test)]
mod tests;

//! The identity of a virtual server ([`VirtualServerKey`]) and its transport [`Protocol`]: the
//! keys every other part of the model (the states, the set elements, the objects planning
//! reads) is built on, so this file imports nothing else of the model.

use serde::Serialize;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Transport protocol of a virtual server (`Service.spec.ports[].protocol`).
///
/// Kernel values: `IPPROTO_TCP` 6, `IPPROTO_UDP` 17, `IPPROTO_SCTP` 132.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// TCP (the Kubernetes default when `protocol` is omitted).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

impl std::str::FromStr for Protocol {
    type Err = UnknownProtocol;

    /// Parses `TCP`, `UDP` or `SCTP`, as the API spells them (case-sensitive).
    ///
    /// # Errors
    /// [`UnknownProtocol`] for any other text.
    fn from_str(text: &str) -> Result<Protocol, UnknownProtocol> {
        match text {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(UnknownProtocol(other.into())),
        }
    }
}

/// A port `protocol` that is not `TCP`, `UDP` or `SCTP` (the text as written).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {0:?} (expected TCP, UDP or SCTP)")]
pub struct UnknownProtocol(pub Box<str>);

/// Identity of a virtual server: address, port and protocol (IPVS's `(af, protocol, addr, port)`).
///
/// Ordered by address, then port, then protocol (`plan --format ipvsadm` uses ipvsadm's own
/// order instead; see [`crate::format::ipvsadm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct VirtualServerKey {
    /// Virtual address (ClusterIP, node IP, externalIP or load-balancer ingress IP).
    pub address: IpAddr,
    /// Virtual port (service port, or nodePort for NodePort virtual servers).
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
}

impl VirtualServerKey {
    /// The socket address of the virtual server.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }
}

impl fmt::Display for VirtualServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.protocol, self.socket_addr())
    }
}

//! UDP conntrack cleanup (kube-proxy parity: `pkg/proxy/conntrack/cleanup.go`, a reconciler since
//! 1.32, kubernetes#126130/#127318).
//!
//! A UDP client that keeps its source port (DNS resolvers, statsd, QUIC) keeps matching one
//! conntrack entry, refreshed by each datagram. While that entry lives, its packets are tied to the
//! real server it was first sent to: with `net/ipv4/vs/expire_nodest_conn=1` IPVS drops the packets
//! of a connection whose real server was deleted as long as the packet belongs to an old (confirmed)
//! conntrack entry, so a one-way flow can be black-holed for as long as it keeps sending
//! (kubernetes#139628). After every sync that deleted a UDP real server or virtual server, and at
//! every full sync, the proxier therefore lists the UDP entries (`IPCTNL_MSG_CT_GET` dump) and
//! deletes, one by one and by their original tuple (`IPCTNL_MSG_CT_DELETE`), exactly the
//! [`stale`] ones:
//!
//! - entries whose original destination is a UDP virtual server kipvs wants and whose reply source
//!   (the real server IPVS chose) is not one of its real servers (any weight: serving+terminating
//!   endpoints at weight 0 keep their flows);
//! - entries whose original destination is a UDP virtual server deleted by kipvs (the Service or
//!   its IP went away) since the last cleanup.
//!
//! Nothing else is touched: no flush, and a (re)start does not clear UDP entries (kubernetes#122740:
//! clearing every UDP entry at start breaks QUIC and other long-lived flows); it only removes those
//! pointing at real servers that are no longer wanted.

use crate::model::{DesiredState, Protocol, VirtualServerKey};
use futures::StreamExt;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol as CtProtocol, Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_proto::ConnectionHandle;
use netlink_proto::sys::SocketAddr as NetlinkAddr;
use netlink_proto::sys::protocols::NETLINK_NETFILTER;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// A UDP conntrack entry: what [`stale`] needs to judge it and what deleting it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UdpEntry {
    /// Original direction, source: the client.
    pub client: SocketAddr,
    /// Original direction, destination: the virtual server the client sent to.
    pub destination: SocketAddr,
    /// Reply direction, source: the real server IPVS forwarded to (the destination itself when
    /// nothing translated the flow).
    pub reply_source: SocketAddr,
}

impl std::fmt::Display for UdpEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "udp {} -> {} (reply from {})",
            self.client, self.destination, self.reply_source
        )
    }
}

impl UdpEntry {
    fn virtual_server(&self) -> VirtualServerKey {
        VirtualServerKey {
            address: self.destination.ip(),
            port: self.destination.port(),
            protocol: Protocol::Udp,
        }
    }

    /// Reads a UDP entry from the attributes of a dump reply; `None` for another protocol or an
    /// entry without both tuples.
    pub fn from_attributes(attributes: &[ConntrackAttribute]) -> Option<UdpEntry> {
        let mut original = None;
        let mut reply = None;
        for attribute in attributes {
            match attribute {
                ConntrackAttribute::CtaTupleOrig(t) => original = Some(endpoints(t)?),
                ConntrackAttribute::CtaTupleReply(t) => reply = Some(endpoints(t)?),
                _ => {}
            }
        }
        let (client, destination) = original?;
        let (reply_source, _) = reply?;
        Some(UdpEntry {
            client,
            destination,
            reply_source,
        })
    }

    /// The `IPCTNL_MSG_CT_DELETE` request for this entry, by its full original tuple (the kernel
    /// deletes exactly that entry; a request without a tuple would flush the table, so none is
    /// ever built here).
    pub fn delete_request(&self) -> NetlinkMessage<NetfilterMessage> {
        let tuple = vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(self.client.ip()),
                IPTuple::DestinationAddress(self.destination.ip()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(CtProtocol::Udp),
                ProtoTuple::SourcePort(self.client.port()),
                ProtoTuple::DestinationPort(self.destination.port()),
            ]),
        ];
        request(
            family(self.client.ip()),
            NLM_F_REQUEST | NLM_F_ACK,
            ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple)]),
        )
    }
}

/// The source and destination of a UDP tuple; `None` for another protocol.
fn endpoints(tuple: &[Tuple]) -> Option<(SocketAddr, SocketAddr)> {
    let (mut src, mut dst, mut sport, mut dport, mut udp) = (None, None, None, None, false);
    for part in tuple {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for p in protos {
                    match p {
                        ProtoTuple::Protocol(p) => udp = *p == CtProtocol::Udp,
                        ProtoTuple::SourcePort(p) => sport = Some(*p),
                        ProtoTuple::DestinationPort(p) => dport = Some(*p),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    udp.then_some(())?;
    Some((SocketAddr::new(src?, sport?), SocketAddr::new(dst?, dport?)))
}

fn family(ip: IpAddr) -> NetfilterProtoFamily {
    if ip.is_ipv4() {
        NetfilterProtoFamily::IPv4
    } else {
        NetfilterProtoFamily::IPv6
    }
}

fn request(
    family: NetfilterProtoFamily,
    flags: u16,
    message: ConntrackMessage,
) -> NetlinkMessage<NetfilterMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            message,
        )),
    );
    packet.finalize();
    packet
}

/// The `IPCTNL_MSG_CT_GET` dump request of every entry of both IP families (`AF_UNSPEC`).
pub fn dump_request() -> NetlinkMessage<NetfilterMessage> {
    request(
        NetfilterProtoFamily::Unspec,
        NLM_F_REQUEST | NLM_F_DUMP,
        ConntrackMessage::Get(vec![]),
    )
}

/// The UDP entry in one message of a dump; `None` for anything else.
pub fn dumped_entry(message: &NetlinkMessage<NetfilterMessage>) -> Option<UdpEntry> {
    match &message.payload {
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
            ..
        }) => UdpEntry::from_attributes(attributes),
        _ => None,
    }
}

/// The entries among `entries` that are stale for `desired` (see the [module](self) docs):
/// to a wanted UDP virtual server but not from one of its real servers, or to a UDP virtual
/// server in `removed`. Entries to anything else are none of kipvs's business.
pub fn stale<'a>(
    entries: impl IntoIterator<Item = &'a UdpEntry>,
    desired: &DesiredState,
    removed: &BTreeSet<VirtualServerKey>,
) -> Vec<UdpEntry> {
    entries
        .into_iter()
        .filter(|e| match desired.virtual_servers.get(&e.virtual_server()) {
            Some(vs) => !vs.real_servers.contains_key(&e.reply_source),
            None => removed.contains(&e.virtual_server()),
        })
        .copied()
        .collect()
}

/// Errors of the ctnetlink socket.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The socket could not be opened or the request not sent.
    #[error("ctnetlink: {0}")]
    Socket(String),
    /// The kernel refused the request (`EPERM` without `CAP_NET_ADMIN`, `EOPNOTSUPP` without
    /// the `nf_conntrack_netlink` module).
    #[error("ctnetlink: {0}")]
    Kernel(std::io::Error),
}

/// A `NETLINK_NETFILTER` socket for conntrack requests, its connection task spawned on Tokio.
#[derive(Clone, Debug)]
pub struct Conntrack {
    handle: ConnectionHandle<NetfilterMessage>,
}

impl Conntrack {
    /// Opens the socket; must be called within a Tokio runtime.
    ///
    /// Errors: [`ConntrackError::Socket`] when the socket cannot be opened.
    pub fn connect() -> Result<Conntrack, ConntrackError> {
        let (connection, handle, _) =
            netlink_proto::new_connection::<NetfilterMessage>(NETLINK_NETFILTER)
                .map_err(|e| ConntrackError::Socket(e.to_string()))?;
        tokio::spawn(connection);
        Ok(Conntrack { handle })
    }

    /// Sends `message` and collects the replies; an error reply becomes the error.
    async fn request(
        &self,
        message: NetlinkMessage<NetfilterMessage>,
    ) -> Result<Vec<NetlinkMessage<NetfilterMessage>>, ConntrackError> {
        let mut replies = self
            .handle
            .clone()
            .request(message, NetlinkAddr::new(0, 0))
            .map_err(|e| ConntrackError::Socket(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(reply) = replies.next().await {
            if let NetlinkPayload::Error(e) = &reply.payload
                && let Some(code) = e.code
            {
                return Err(ConntrackError::Kernel(std::io::Error::from_raw_os_error(
                    -code.get(),
                )));
            }
            out.push(reply);
        }
        Ok(out)
    }

    /// Every UDP entry of the network namespace, both IP families (one dump).
    pub async fn udp_entries(&self) -> Result<Vec<UdpEntry>, ConntrackError> {
        let replies = self.request(dump_request()).await?;
        Ok(replies.iter().filter_map(dumped_entry).collect())
    }

    async fn delete_one(&self, entry: UdpEntry) -> Result<(), (UdpEntry, ConntrackError)> {
        match self.request(entry.delete_request()).await {
            Err(ConntrackError::Kernel(k)) if k.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(drop),
        }
        .map_err(|error| (entry, error))
    }

    /// Deletes `entries` (pipelined); an entry already gone (`ENOENT`) counts as deleted.
    /// Returns those that could not be deleted, with the reason.
    pub async fn delete(&self, entries: &[UdpEntry]) -> Vec<(UdpEntry, ConntrackError)> {
        let requests: Vec<_> = entries.iter().map(|e| self.delete_one(*e)).collect();
        let results: Vec<Result<(), (UdpEntry, ConntrackError)>> = futures::stream::iter(requests)
            .buffer_unordered(PIPELINE_DEPTH)
            .collect()
            .await;
        results.into_iter().filter_map(Result::err).collect()
    }
}

/// How many delete requests are in flight at once.
const PIPELINE_DEPTH: usize = 64;

/// What one cleanup did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Stale entries deleted (or already gone when the delete arrived).
    pub deleted: usize,
    /// Stale entries whose delete failed, plus 1 when the table could not be listed.
    pub failed: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{VirtualServer, VirtualServerSpec};
    use netlink_packet_core::NetlinkDeserializable;

    fn entry(client: &str, destination: &str, reply_source: &str) -> UdpEntry {
        UdpEntry {
            client: client.parse().unwrap(),
            destination: destination.parse().unwrap(),
            reply_source: reply_source.parse().unwrap(),
        }
    }

    fn udp(address: &str, port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol: Protocol::Udp,
        }
    }

    fn desired(vs: &[(VirtualServerKey, &[(&str, u32)])]) -> DesiredState {
        DesiredState {
            virtual_servers: vs
                .iter()
                .map(|(key, real_servers)| {
                    let vs = VirtualServer {
                        spec: VirtualServerSpec {
                            scheduler: "rr".into(),
                            persistence_timeout: None,
                            sched_flags: 0,
                        },
                        real_servers: real_servers
                            .iter()
                            .map(|(rs, w)| (rs.parse().unwrap(), *w))
                            .collect(),
                        service: "kube-system/kube-dns:dns".into(),
                    };
                    (*key, vs)
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_entries_to_unwanted_real_servers_or_removed_virtual_servers_are_stale() {
        let want = desired(&[
            (
                udp("10.96.0.10", 53),
                &[("10.244.1.5:53", 1), ("10.244.2.9:53", 0)],
            ),
            (udp("192.168.100.1", 30053), &[("10.244.1.5:53", 1)]),
        ]);
        let removed = [udp("10.96.0.99", 53)].into();
        let kept = [
            // to a wanted real server, and to a serving+terminating one at weight 0
            entry("10.244.3.3:40000", "10.96.0.10:53", "10.244.1.5:53"),
            entry("10.244.3.3:40001", "10.96.0.10:53", "10.244.2.9:53"),
            // NodePort, masqueraded: the reply source is still the real server
            entry(
                "192.168.100.2:41002",
                "192.168.100.1:30053",
                "10.244.1.5:53",
            ),
            // not a virtual server of kipvs (the node's own DNS traffic), nor a removed one
            entry("10.0.0.5:5353", "1.1.1.1:53", "1.1.1.1:53"),
            entry("10.244.3.3:40002", "10.96.0.10:5353", "10.244.6.6:5353"),
        ];
        let stale_ones = [
            // the real server left (the CoreDNS pod was replaced)
            entry("10.244.3.3:40003", "10.96.0.10:53", "10.244.2.6:53"),
            // same endpoint IP, but its port changed
            entry("10.244.3.3:40004", "10.96.0.10:53", "10.244.1.5:5353"),
            entry(
                "192.168.100.2:41003",
                "192.168.100.1:30053",
                "10.244.2.6:53",
            ),
            // the Service IP went away
            entry("10.244.3.3:40005", "10.96.0.99:53", "10.244.1.5:53"),
        ];
        let all: Vec<UdpEntry> = kept.iter().chain(&stale_ones).copied().collect();
        assert_eq!(stale(&all, &want, &removed), stale_ones);
        // A start (nothing removed yet) keeps every entry that still points at a real server.
        assert_eq!(stale(&kept, &want, &BTreeSet::new()), []);
    }

    #[test]
    fn delete_request_names_the_whole_original_tuple_and_round_trips() {
        let e = entry("192.168.100.2:41001", "10.96.0.50:9000", "10.244.1.20:9000");
        let message = e.delete_request();
        assert_eq!(message.header.flags, NLM_F_REQUEST | NLM_F_ACK);
        // subsystem IPCTNL (1) << 8 | IPCTNL_MSG_CT_DELETE (2)
        assert_eq!(message.header.message_type, (1 << 8) | 2);
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        let parsed =
            NetfilterMessage::deserialize(&message.header, &bytes[16..]).expect("parses back");
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attributes)) = parsed.inner
        else {
            panic!("not a conntrack delete: {parsed:?}");
        };
        let [ConntrackAttribute::CtaTupleOrig(tuple)] = &attributes[..] else {
            panic!("not exactly one original tuple: {attributes:?}");
        };
        assert_eq!(endpoints(tuple), Some((e.client, e.destination)));
    }

    #[test]
    fn dumped_udp_entry_is_read_and_other_protocols_are_ignored() {
        let tuple = |src: &str, dst: &str, proto| {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(src.ip()),
                    IPTuple::DestinationAddress(dst.ip()),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(proto),
                    ProtoTuple::SourcePort(src.port()),
                    ProtoTuple::DestinationPort(dst.port()),
                ]),
            ]
        };
        let attributes = |proto| {
            vec![
                ConntrackAttribute::CtaTupleOrig(tuple("10.244.3.3:40000", "10.96.0.10:53", proto)),
                ConntrackAttribute::CtaTupleReply(tuple(
                    "10.244.1.5:53",
                    "10.244.3.3:40000",
                    proto,
                )),
                ConntrackAttribute::CtaTimeout(30),
            ]
        };
        assert_eq!(
            UdpEntry::from_attributes(&attributes(CtProtocol::Udp)),
            Some(entry("10.244.3.3:40000", "10.96.0.10:53", "10.244.1.5:53"))
        );
        assert_eq!(
            UdpEntry::from_attributes(&attributes(CtProtocol::Tcp)),
            None
        );
        let reply = request(
            NetfilterProtoFamily::IPv4,
            0,
            ConntrackMessage::New(attributes(CtProtocol::Udp)),
        );
        assert!(dumped_entry(&reply).is_some());
        assert_eq!(dump_request().header.flags, NLM_F_REQUEST | NLM_F_DUMP);
    }
}

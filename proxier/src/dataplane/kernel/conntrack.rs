//! UDP conntrack cleanup (kube-proxy parity: `pkg/proxy/conntrack/cleanup.go`, a reconciler since
//! 1.32, kubernetes#126130/#127318).
//!
//! A UDP client that keeps its source port (DNS resolvers, statsd, QUIC) keeps matching one
//! conntrack entry, refreshed by each datagram. While that entry lives, its packets are tied to the
//! real server it was first sent to: with `net/ipv4/vs/expire_nodest_conn=1` IPVS drops the packets
//! of a connection whose real server was deleted as long as the packet belongs to an old (confirmed)
//! conntrack entry, so a one-way flow can be black-holed for as long as it keeps sending
//! (kubernetes#139628). After every sync that changed the real servers of a UDP virtual server or
//! deleted one, and at every full sync, the proxier therefore lists UDP entries
//! (`IPCTNL_MSG_CT_GET` dump) and deletes, one by one and by their original tuple
//! (`IPCTNL_MSG_CT_DELETE`), exactly the [`stale`] ones:
//!
//! - entries whose original destination is a UDP virtual server kipvs wants and whose reply source
//!   (the real server IPVS chose) is not one of its real servers (any weight: serving+terminating
//!   endpoints at weight 0 keep their flows);
//! - entries whose original destination is a UDP virtual server deleted by kipvs (the Service or
//!   its IP went away) since the last cleanup.
//!
//! The listing's cost follows the change, not the size of the table: the kernel filters the dump
//! (`CTA_FILTER`, Linux >= 5.8) to the UDP entries of one IP family ([`Listing::All`], a full
//! sync) or to those whose original destination is one changed virtual server
//! ([`Listing::To`], one dump each), so the node's TCP connections are never copied out. An older
//! kernel ignores the filter and dumps the whole family; the same filter is applied here to
//! what comes back, so the result is the same, only slower.
//!
//! Nothing else is touched: no flush, and a (re)start does not clear UDP entries (kubernetes#122740:
//! clearing every UDP entry at start breaks QUIC and other long-lived flows); it only removes those
//! pointing at real servers that are no longer wanted.

use crate::model::{DesiredState, Protocol, VirtualServerKey};
use futures::StreamExt;
use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, Nla,
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
use tracing::Instrument;

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

/// Which UDP conntrack entries a cleanup lists.
#[derive(Clone, Copy, Debug)]
pub enum Listing<'a> {
    /// Every UDP entry, both IP families (a full sync).
    All,
    /// The UDP entries whose original destination is one of these virtual servers (the ones a
    /// sync changed).
    To(&'a BTreeSet<VirtualServerKey>),
}

impl Listing<'_> {
    /// Whether `entry` belongs to this listing.
    pub fn contains(&self, entry: &UdpEntry) -> bool {
        match self {
            Listing::All => true,
            Listing::To(virtual_servers) => virtual_servers.contains(&entry.virtual_server()),
        }
    }

    /// The filtered dump requests this listing takes: one per virtual server, or one per IP
    /// family for [`Listing::All`] and for more than `TARGETED_DUMPS_MAX` (16) virtual servers
    /// (each dump walks the whole table in the kernel, so many of them would cost more than
    /// one that copies out every UDP entry).
    pub fn dump_requests(&self) -> Vec<NetlinkMessage<NetfilterMessage>> {
        match self {
            Listing::To(virtual_servers) if virtual_servers.len() <= TARGETED_DUMPS_MAX => {
                virtual_servers
                    .iter()
                    .map(|vs| dump_request(family(vs.address), Some((vs.address, vs.port))))
                    .collect()
            }
            _ => [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6]
                .into_iter()
                .map(|family| dump_request(family, None))
                .collect(),
        }
    }
}

/// Up to how many changed virtual servers a cleanup dumps each one's entries rather than every
/// UDP entry.
const TARGETED_DUMPS_MAX: usize = 16;

/// `CTA_FILTER` (`enum ctattr_type`, Linux >= 5.8) and its `CTA_FILTER_ORIG_FLAGS`: the fields of
/// the request's original tuple a dumped entry must match (`CTA_FILTER_F_*` in
/// `uapi/linux/netfilter/nfnetlink_conntrack.h`).
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_F_CTA_IP_DST: u32 = 1 << 1;
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_F_CTA_PROTO_DST_PORT: u32 = 1 << 5;
const CTA_TUPLE_ORIG: u16 = 1;
const IPCTNL_MSG_CT_GET: u8 = 1;

/// The `IPCTNL_MSG_CT_GET` dump request of the UDP entries of `family` (which must be IPv4 or
/// IPv6: the kernel refuses a filter without one), only those whose original destination is
/// `destination` when given.
pub fn dump_request(
    family: NetfilterProtoFamily,
    destination: Option<(IpAddr, u16)>,
) -> NetlinkMessage<NetfilterMessage> {
    let mut tuple = vec![Tuple::Proto(vec![ProtoTuple::Protocol(CtProtocol::Udp)])];
    let mut flags = CTA_FILTER_F_CTA_PROTO_NUM;
    if let Some((address, port)) = destination {
        tuple = vec![
            Tuple::Ip(vec![IPTuple::DestinationAddress(address)]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(CtProtocol::Udp),
                ProtoTuple::DestinationPort(port),
            ]),
        ];
        flags |= CTA_FILTER_F_CTA_IP_DST | CTA_FILTER_F_CTA_PROTO_DST_PORT;
    }
    // netlink-packet-netfilter has no CTA_FILTER and drops the NLA_F_NESTED flag the kernel
    // requires on it from an `Other` attribute, so the request is built from raw attributes.
    let orig_flags = [DefaultNla::new(
        CTA_FILTER_ORIG_FLAGS,
        flags.to_ne_bytes().to_vec(),
    )];
    request(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET,
            attributes: vec![
                nested(CTA_TUPLE_ORIG, &tuple),
                nested(CTA_FILTER, &orig_flags),
            ],
        },
    )
}

/// A nested attribute of kind `kind` holding `attributes`.
fn nested<T: Nla>(kind: u16, attributes: &[T]) -> DefaultNla {
    let mut value = vec![0; attributes.buffer_len()];
    attributes.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
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
/// server in `changed` (changed by kipvs since the last cleanup) that is no longer wanted, i.e.
/// that kipvs deleted. Entries to anything else are none of kipvs's business.
pub fn stale<'a>(
    entries: impl IntoIterator<Item = &'a UdpEntry>,
    desired: &DesiredState,
    changed: &BTreeSet<VirtualServerKey>,
) -> Vec<UdpEntry> {
    entries
        .into_iter()
        .filter(|e| match desired.virtual_servers.get(&e.virtual_server()) {
            Some(vs) => !vs.real_servers.contains_key(&e.reply_source),
            None => changed.contains(&e.virtual_server()),
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
    /// The kernel refused the request (`EPERM` without `CAP_NET_ADMIN`).
    #[error("ctnetlink: {0}")]
    Kernel(std::io::Error),
    /// The kernel has no ctnetlink: the `NETLINK_NETFILTER` socket cannot be opened (no
    /// `nfnetlink`), or the kernel answers `EOPNOTSUPP`/`EPROTONOSUPPORT`, or `EINVAL` before any
    /// request succeeded (what `nfnetlink` answers for a subsystem it lacks: no
    /// `nf_conntrack_netlink` module). Only the UDP conntrack cleanup needs it: it is skipped,
    /// and everything else is programmed.
    #[error(
        "ctnetlink unavailable ({0}): UDP conntrack cleanup skipped (load nf_conntrack_netlink)"
    )]
    Unavailable(String),
}

impl ConntrackError {
    /// Whether the kernel has no ctnetlink ([`ConntrackError::Unavailable`]): nothing to retry.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, ConntrackError::Unavailable(_))
    }
}

/// A `NETLINK_NETFILTER` socket for conntrack requests, its connection task spawned on Tokio;
/// or, on a kernel without ctnetlink, none: every request then fails with
/// [`ConntrackError::Unavailable`], logged once as a warning.
#[derive(Clone, Debug)]
pub struct Conntrack {
    /// The socket, or why there is none.
    handle: Result<ConnectionHandle<NetfilterMessage>, String>,
    /// Set when the unavailability has been logged.
    warned: std::sync::Arc<std::sync::Once>,
    /// Whether a request has succeeded (then `EINVAL` is an error of that request).
    worked: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What opening a `NETLINK_NETFILTER` socket gives.
type Opened = (
    netlink_proto::Connection<NetfilterMessage>,
    ConnectionHandle<NetfilterMessage>,
    futures::channel::mpsc::UnboundedReceiver<(NetlinkMessage<NetfilterMessage>, NetlinkAddr)>,
);

impl Conntrack {
    /// Opens the socket; must be called within a Tokio runtime. Never fails: a kernel without
    /// ctnetlink gives a `Conntrack` whose requests fail with [`ConntrackError::Unavailable`]
    /// (the proxier must not stop programming for the UDP cleanup alone).
    pub fn connect() -> Conntrack {
        Conntrack::with_socket(netlink_proto::new_connection::<NetfilterMessage>(
            NETLINK_NETFILTER,
        ))
    }

    /// A `Conntrack` over the outcome of opening its socket.
    fn with_socket(opened: std::io::Result<Opened>) -> Conntrack {
        let handle = opened
            .map(|(connection, handle, _)| {
                tokio::spawn(connection.instrument(tracing::info_span!("ctnetlink")));
                handle
            })
            .map_err(|e| e.to_string());
        Conntrack {
            handle,
            warned: std::sync::Arc::new(std::sync::Once::new()),
            worked: std::sync::Arc::default(),
        }
    }

    /// `error`, logged as a warning the first time ctnetlink turns out to be unavailable.
    fn noted(&self, error: ConntrackError) -> ConntrackError {
        if error.is_unavailable() {
            self.warned.call_once(|| tracing::warn!("{error}"));
        }
        error
    }

    /// Sends `message` and collects the replies; an error reply becomes the error.
    async fn request(
        &self,
        message: NetlinkMessage<NetfilterMessage>,
    ) -> Result<Vec<NetlinkMessage<NetfilterMessage>>, ConntrackError> {
        let handle = self
            .handle
            .as_ref()
            .map_err(|reason| self.noted(ConntrackError::Unavailable(reason.clone())))?;
        let mut replies = handle
            .clone()
            .request(message, NetlinkAddr::new(0, 0))
            .map_err(|e| ConntrackError::Socket(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(reply) = replies.next().await {
            if let NetlinkPayload::Error(e) = &reply.payload
                && let Some(code) = e.code
            {
                let error = std::io::Error::from_raw_os_error(-code.get());
                let worked = self.worked.load(std::sync::atomic::Ordering::Relaxed);
                return Err(match error.raw_os_error() {
                    Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT) => {
                        self.noted(ConntrackError::Unavailable(error.to_string()))
                    }
                    Some(libc::EINVAL) if !worked => {
                        self.noted(ConntrackError::Unavailable(error.to_string()))
                    }
                    _ => ConntrackError::Kernel(error),
                });
            }
            out.push(reply);
        }
        self.worked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// The UDP entries of the network namespace in `listing` (one kernel-filtered dump per
    /// [`Listing::dump_requests`], one after the other: a socket runs one dump at a time).
    /// Warns once per process when the kernel sent entries outside the filter (it ignores
    /// `CTA_FILTER` before Linux 5.8): the result is the same, the cost is the whole table's.
    pub async fn udp_entries(&self, listing: Listing<'_>) -> Result<Vec<UdpEntry>, ConntrackError> {
        static FILTER_IGNORED: std::sync::Once = std::sync::Once::new();
        let mut entries = Vec::new();
        for request in listing.dump_requests() {
            let replies = self.request(request).await?;
            let before = entries.len();
            entries.extend(
                replies
                    .iter()
                    .filter_map(dumped_entry)
                    .filter(|e| listing.contains(e)),
            );
            let dumped = replies
                .iter()
                .filter(|r| matches!(r.payload, NetlinkPayload::InnerMessage(_)))
                .count();
            let outside = dumped - (entries.len() - before);
            if outside > 0 {
                FILTER_IGNORED.call_once(|| {
                    tracing::warn!(
                        outside,
                        "the kernel ignored the conntrack dump filter (CTA_FILTER, Linux >= 5.8): \
                         each UDP conntrack cleanup reads the whole table"
                    )
                });
            }
        }
        Ok(entries)
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
    use netlink_packet_core::{NetlinkDeserializable, Parseable};

    /// Issue 23: on a kernel without ctnetlink the proxier exited at start
    /// (`connecting to the kernel …: ctnetlink: Protocol not supported`). The socket that
    /// cannot be opened gives a `Conntrack` whose requests are `Unavailable`: the cleanup is
    /// skipped, the rest is programmed.
    #[tokio::test]
    async fn without_ctnetlink_requests_are_unavailable_not_fatal() {
        let conntrack = Conntrack::with_socket(Err(std::io::Error::from_raw_os_error(
            libc::EPROTONOSUPPORT,
        )));
        let error = conntrack.udp_entries(Listing::All).await.unwrap_err();
        assert!(error.is_unavailable(), "{error}");
        assert!(
            error.to_string().contains("Protocol not supported"),
            "{error}"
        );
        let one = entry("10.0.0.1:5353", "10.96.0.10:53", "10.244.1.5:53");
        let failed = conntrack.delete(&[one]).await;
        assert_eq!(failed.len(), 1);
        assert!(failed[0].1.is_unavailable());
    }

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
        // The cluster IP 10.96.0.10:53 lost real servers; 10.96.0.99:53 was deleted.
        let changed = [udp("10.96.0.10", 53), udp("10.96.0.99", 53)].into();
        // (client, original destination, reply source, stale)
        #[rustfmt::skip]
        let cases = [
            // to a wanted real server, and to a serving+terminating one at weight 0
            ("10.244.3.3:40000", "10.96.0.10:53", "10.244.1.5:53", false),
            ("10.244.3.3:40001", "10.96.0.10:53", "10.244.2.9:53", false),
            // NodePort, masqueraded: the reply source is still the real server
            ("192.168.100.2:41002", "192.168.100.1:30053", "10.244.1.5:53", false),
            // not a virtual server of kipvs (the node's own DNS traffic), nor a removed one
            ("10.0.0.5:5353", "1.1.1.1:53", "1.1.1.1:53", false),
            ("10.244.3.3:40002", "10.96.0.10:5353", "10.244.6.6:5353", false),
            // the real server left (the CoreDNS pod was replaced)
            ("10.244.3.3:40003", "10.96.0.10:53", "10.244.2.6:53", true),
            // same endpoint IP, but its port changed
            ("10.244.3.3:40004", "10.96.0.10:53", "10.244.1.5:5353", true),
            ("192.168.100.2:41003", "192.168.100.1:30053", "10.244.2.6:53", true),
            // the Service IP went away
            ("10.244.3.3:40005", "10.96.0.99:53", "10.244.1.5:53", true),
        ];
        let all: Vec<UdpEntry> = cases.iter().map(|(c, d, r, _)| entry(c, d, r)).collect();
        let stale_ones: Vec<UdpEntry> = cases
            .iter()
            .filter(|case| case.3)
            .map(|(c, d, r, _)| entry(c, d, r))
            .collect();
        assert_eq!(stale(&all, &want, &changed), stale_ones);
        // A start (nothing changed yet) keeps the deleted Service's entry: kipvs cannot know it
        // was ever its virtual server.
        assert_eq!(stale(&all, &want, &BTreeSet::new()), stale_ones[..3]);
    }

    /// The request's attributes as the kernel reads them: `(kind with flags, value)` of each
    /// top-level attribute.
    fn raw_attributes(message: &NetlinkMessage<NetfilterMessage>) -> Vec<(u16, Vec<u8>)> {
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        // netlink header (16 bytes) + nfgenmsg (4 bytes)
        netlink_packet_core::NlasIterator::new(&bytes[20..])
            .map(|nla| {
                let nla = nla.unwrap();
                let flags = if nla.nested_flag() { NLA_F_NESTED } else { 0 };
                (nla.kind() | flags, nla.value().to_vec())
            })
            .collect()
    }

    #[test]
    fn dump_requests_ask_the_kernel_for_udp_entries_to_the_changed_virtual_servers_only() {
        let changed: BTreeSet<_> = [udp("10.96.0.10", 53), udp("fd00::10", 53)].into();
        let requests = Listing::To(&changed).dump_requests();
        assert_eq!(requests.len(), 2);
        for (request, vs) in requests.iter().zip(&changed) {
            assert_eq!(request.header.flags, NLM_F_REQUEST | NLM_F_DUMP);
            // subsystem IPCTNL (1) << 8 | IPCTNL_MSG_CT_GET (1)
            assert_eq!(request.header.message_type, (1 << 8) | 1);
            let NetlinkPayload::InnerMessage(m) = &request.payload else {
                panic!("not a netfilter message: {request:?}");
            };
            // A filter needs a family: the kernel refuses AF_UNSPEC with EOPNOTSUPP.
            assert_eq!(m.header.family, family(vs.address));
            let attributes = raw_attributes(request);
            let [(orig_kind, orig), (filter_kind, filter)] = &attributes[..] else {
                panic!("not a tuple and a filter: {attributes:?}");
            };
            assert_eq!(*orig_kind, CTA_TUPLE_ORIG | NLA_F_NESTED);
            let tuple: Vec<Tuple> = netlink_packet_core::NlasIterator::new(&orig[..])
                .map(|nla| Tuple::parse(&nla.unwrap()).unwrap())
                .collect();
            assert_eq!(
                tuple,
                [
                    Tuple::Ip(vec![IPTuple::DestinationAddress(vs.address)]),
                    Tuple::Proto(vec![
                        ProtoTuple::Protocol(CtProtocol::Udp),
                        ProtoTuple::DestinationPort(vs.port),
                    ]),
                ]
            );
            // nla_parse_nested() rejects a CTA_FILTER without NLA_F_NESTED (EINVAL); its
            // CTA_FILTER_ORIG_FLAGS is an NLA_U32 in host order.
            assert_eq!(*filter_kind, CTA_FILTER | NLA_F_NESTED);
            let want = (1u32 << 1) | (1 << 3) | (1 << 5);
            let mut flags = vec![8, 0, 1, 0];
            flags.extend(want.to_ne_bytes());
            assert_eq!(filter, &flags);
        }
    }

    #[test]
    fn a_full_listing_and_a_large_change_dump_the_udp_entries_of_each_family() {
        let many: BTreeSet<_> = (0..=TARGETED_DUMPS_MAX as u16)
            .map(|port| udp("10.96.0.10", port))
            .collect();
        for listing in [Listing::All, Listing::To(&many)] {
            let requests = listing.dump_requests();
            let families: Vec<_> = requests
                .iter()
                .map(|r| match &r.payload {
                    NetlinkPayload::InnerMessage(m) => m.header.family,
                    _ => panic!("not a netfilter message: {r:?}"),
                })
                .collect();
            assert_eq!(
                families,
                [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6]
            );
            for request in &requests {
                let attributes = raw_attributes(request);
                let mut flags = vec![8, 0, 1, 0];
                flags.extend((1u32 << 3).to_ne_bytes());
                assert_eq!(attributes[1], (CTA_FILTER | NLA_F_NESTED, flags));
            }
        }
        // What an older kernel, ignoring the filter, sends back is filtered here the same way.
        let to = entry("10.244.3.3:40000", "10.96.0.10:3", "10.244.1.5:53");
        let other = entry("10.244.3.3:40000", "10.96.0.11:3", "10.244.1.5:53");
        assert!(Listing::To(&many).contains(&to));
        assert!(!Listing::To(&many).contains(&other));
        assert!(Listing::All.contains(&other));
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
    }
}

//! The node's interfaces as rtnetlink notifications tell them ([`Interfaces`]): the addresses on
//! every interface but `kube-ipvs0` (NodePorts are served on them) and `kube-ipvs0`'s index.
//!
//! A task of its own subscribes to `RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR` and
//! `RTNLGRP_IPV6_IFADDR`, then reads every link and every address once (the notifications sent
//! meanwhile queue behind that read and are applied after it), and from then on applies each
//! notification as it comes: the cost follows the changes, not the number of addresses
//! (`kube-ipvs0` holds one per ClusterIP). When the kernel drops notifications because the
//! socket's buffer is full (`ENOBUFS`, which `netlink-proto` hands on as an overrun), or the
//! socket fails, it starts again with a new socket and a new read of everything (after a
//! failure, once a second at first, doubling up to [`RESUBSCRIBE_MAX`]).

use crate::dataplane::DataplaneError;
use futures::StreamExt;
use futures::TryStreamExt;
use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::LinkAttribute;
use netlink_proto::sys::AsyncSocket;
use rtnetlink::MulticastGroup;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

/// The dummy interface holding every ClusterIP, externalIP and VIP-mode load-balancer IP, as
/// in kube-proxy (`netlink_linux.go`). It is created if missing and, like upstream, left DOWN
/// (kubernetes#107662): local routes exist for its addresses regardless, so IPVS sees the
/// packets in `LOCAL_IN` while the node never answers ARP through it.
pub const INTERFACE: &str = "kube-ipvs0";

/// The receive buffer asked for the notification socket (the kernel caps it at
/// `net.core.rmem_max`): room for the notifications of a burst of binds on `kube-ipvs0` (each
/// ClusterIP's address is one) while the task is busy; past it, an overrun and a new read.
const RECEIVE_BUFFER: usize = 8 << 20;

/// The longest wait before a new subscription after failed ones.
pub const RESUBSCRIBE_MAX: Duration = Duration::from_secs(30);

/// What the notifications say of the node's interfaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The index of `kube-ipvs0`; `None` while there is no link of that name.
    pub kube_ipvs0: Option<u32>,
    /// The addresses on every other interface (the local one of a point-to-point link).
    pub others: BTreeSet<IpAddr>,
}

/// What the follower publishes: `None` until its first read of everything, then the last
/// [`Snapshot`], or why the first read failed (retried).
type Published = Option<Result<Snapshot, String>>;

/// The node's interfaces, followed by a task through rtnetlink notifications (see the module's
/// documentation); the task ends when this is dropped.
pub struct Interfaces {
    /// Marked seen at each [`Interfaces::current`]: [`Interfaces::changed`] waits for what
    /// comes after.
    published: watch::Receiver<Published>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Interfaces {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Interfaces {
    /// Starts following the node's interfaces (on the Tokio runtime).
    pub fn follow() -> Self {
        let (tx, published) = watch::channel(None);
        let task = tokio::spawn(follow(tx).instrument(tracing::info_span!("interfaces")));
        Interfaces { published, task }
    }

    /// The interfaces as the last notification left them (waits for the first read of
    /// everything), marking them seen for [`Interfaces::changed`].
    ///
    /// # Errors
    /// The first read failed (and has not succeeded since).
    pub async fn current(&mut self) -> Result<Snapshot, DataplaneError> {
        let published = self
            .published
            .wait_for(Option::is_some)
            .await
            .map_err(|_| following_error("the task ended".into()))?;
        match published.clone().expect("waited for") {
            Ok(snapshot) => Ok(snapshot),
            Err(error) => Err(following_error(error)),
        }
    }

    /// Resolves once the interfaces changed since the last [`Interfaces::current`] (at once if
    /// they did already); borrows nothing.
    pub fn changed(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut published = self.published.clone();
        async move {
            if published.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

fn following_error(error: String) -> DataplaneError {
    DataplaneError::Io {
        context: "following the node's addresses".into(),
        source: std::io::Error::other(error),
    }
}

/// Subscribes and reads again for as long as `tx` has receivers: at once after an overrun,
/// after a growing wait after a failure.
async fn follow(tx: watch::Sender<Published>) {
    let mut wait = Duration::from_secs(1);
    loop {
        let mut read = false;
        let error = match subscribe(&tx, &mut read).await {
            Ok(()) => {
                tracing::info!(
                    "address notifications were dropped (socket buffer full): reading every \
                     address again"
                );
                continue;
            }
            Err(error) => error,
        };
        if read {
            wait = Duration::from_secs(1);
        }
        tracing::warn!(
            %error,
            retry_in_ms = wait.as_millis() as u64,
            "cannot follow the node's addresses; the last ones known stay"
        );
        tx.send_if_modified(|published| match published {
            Some(Ok(_)) => false,
            _ => {
                *published = Some(Err(error.to_string()));
                true
            }
        });
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RESUBSCRIBE_MAX);
    }
}

/// One subscription: reads everything (`read` is set once it did), publishes, then applies
/// each notification. Returns after an overrun; errors when the socket fails.
async fn subscribe(tx: &watch::Sender<Published>, read: &mut bool) -> Result<(), DataplaneError> {
    let groups = [
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ];
    let (mut conn, rtnl, mut notifications) = rtnetlink::new_multicast_connection(&groups)
        .map_err(|source| DataplaneError::Io {
            context: "rtnetlink notification socket".into(),
            source,
        })?;
    if let Err(error) = conn.socket_mut().socket_mut().set_rx_buf_sz(RECEIVE_BUFFER) {
        tracing::debug!(%error, "cannot enlarge the notification socket's buffer");
    }
    let conn = tokio::spawn(conn);
    let _conn = AbortOnDrop(conn);
    let mut table = Table::default();
    let mut links = rtnl.link().get().execute();
    while let Some(link) = links.try_next().await? {
        table.apply(&RouteNetlinkMessage::NewLink(link));
    }
    let mut addresses = rtnl.address().get().execute();
    while let Some(address) = addresses.try_next().await? {
        table.apply(&RouteNetlinkMessage::NewAddress(address));
    }
    *read = true;
    publish(tx, &table);
    while let Some((message, _)) = notifications.next().await {
        match message.payload {
            NetlinkPayload::InnerMessage(message) => {
                if !table.apply(&message) {
                    tracing::info!("kube-ipvs0 was renamed: reading every address again");
                    return Ok(());
                }
                publish(tx, &table);
            }
            NetlinkPayload::Overrun(_) => return Ok(()),
            _ => {}
        }
    }
    Err(following_error("the notification socket closed".into()))
}

/// Publishes `table` if it differs from what was published.
fn publish(tx: &watch::Sender<Published>, table: &Table) {
    let snapshot = table.snapshot();
    tx.send_if_modified(|published| {
        if matches!(published, Some(Ok(s)) if *s == snapshot) {
            return false;
        }
        *published = Some(Ok(snapshot));
        true
    });
}

/// The node's own address in one RTM_NEWADDR message: IFA_LOCAL, else IFA_ADDRESS.
/// IFA_ADDRESS is the peer's on a point-to-point link (equal to IFA_LOCAL elsewhere;
/// IPv6 has only it) — `linux/if_addr.h`.
pub fn own_address(msg: &AddressMessage) -> Option<IpAddr> {
    let local = msg.attributes.iter().find_map(|attr| match attr {
        AddressAttribute::Local(a) => Some(*a),
        _ => None,
    });
    local.or_else(|| {
        msg.attributes.iter().find_map(|attr| match attr {
            AddressAttribute::Address(a) => Some(*a),
            _ => None,
        })
    })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every address of the node but `kube-ipvs0`'s, by interface, and `kube-ipvs0`'s index, as
/// link and address messages (dumped or notified) build them.
#[derive(Debug, Default)]
struct Table {
    kube_ipvs0: Option<u32>,
    /// (address, interface index).
    addresses: BTreeSet<(IpAddr, u32)>,
}

impl Table {
    /// Applies one message; false when the table cannot follow it (`kube-ipvs0` renamed: its
    /// addresses, never kept, now count) and everything must be read again.
    fn apply(&mut self, message: &RouteNetlinkMessage) -> bool {
        match message {
            RouteNetlinkMessage::NewLink(link) => {
                let index = link.header.index;
                let named = link
                    .attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::IfName(n) if n == INTERFACE));
                if named {
                    self.kube_ipvs0 = Some(index);
                    self.addresses.retain(|(_, i)| *i != index);
                } else if self.kube_ipvs0 == Some(index) {
                    self.kube_ipvs0 = None;
                    return false;
                }
            }
            RouteNetlinkMessage::DelLink(link) => {
                let index = link.header.index;
                if self.kube_ipvs0 == Some(index) {
                    self.kube_ipvs0 = None;
                }
                self.addresses.retain(|(_, i)| *i != index);
            }
            RouteNetlinkMessage::NewAddress(address) | RouteNetlinkMessage::DelAddress(address) => {
                let index = address.header.index;
                if self.kube_ipvs0 == Some(index) {
                    return true;
                }
                if let Some(ip) = own_address(address) {
                    if matches!(message, RouteNetlinkMessage::NewAddress(_)) {
                        self.addresses.insert((ip, index));
                    } else {
                        self.addresses.remove(&(ip, index));
                    }
                }
            }
            _ => {}
        }
        true
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            kube_ipvs0: self.kube_ipvs0,
            others: self.addresses.iter().map(|(ip, _)| *ip).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::LinkMessage;

    fn link(index: u32, name: &str) -> LinkMessage {
        let mut link = LinkMessage::default();
        link.header.index = index;
        link.attributes.push(LinkAttribute::IfName(name.into()));
        link
    }

    fn address(index: u32, ip: &str) -> AddressMessage {
        let mut address = AddressMessage::default();
        address.header.index = index;
        address
            .attributes
            .push(AddressAttribute::Address(ip.parse().unwrap()));
        address
    }

    fn others(table: &Table) -> Vec<String> {
        table
            .snapshot()
            .others
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// `kube-ipvs0`'s addresses are never kept; an address on two interfaces stays until it
    /// left both; a deleted link takes its addresses.
    #[test]
    fn the_table_keeps_every_address_but_kube_ipvs0s() {
        use RouteNetlinkMessage::*;
        let mut table = Table::default();
        for message in [
            NewLink(link(1, "lo")),
            NewLink(link(2, "eth0")),
            NewLink(link(7, INTERFACE)),
            NewAddress(address(1, "127.0.0.1")),
            NewAddress(address(2, "10.20.30.51")),
            NewAddress(address(7, "10.96.0.1")),
            NewAddress(address(7, "10.96.0.10")),
        ] {
            assert!(table.apply(&message));
        }
        assert_eq!(table.snapshot().kube_ipvs0, Some(7));
        assert_eq!(others(&table), ["10.20.30.51", "127.0.0.1"]);
        // A keepalived VIP on eth0 and on a second link, then gone from eth0.
        table.apply(&NewLink(link(3, "eth1")));
        table.apply(&NewAddress(address(2, "10.20.30.100")));
        table.apply(&NewAddress(address(3, "10.20.30.100")));
        table.apply(&DelAddress(address(2, "10.20.30.100")));
        assert_eq!(others(&table), ["10.20.30.51", "10.20.30.100", "127.0.0.1"]);
        table.apply(&DelLink(link(3, "eth1")));
        assert_eq!(others(&table), ["10.20.30.51", "127.0.0.1"]);
        // Unbinding on kube-ipvs0 changes nothing.
        table.apply(&DelAddress(address(7, "10.96.0.10")));
        assert_eq!(others(&table), ["10.20.30.51", "127.0.0.1"]);
    }

    /// Review finding 4: `kube-ipvs0` deleted and made again (by an administrator, or by
    /// kube-proxy) has a new index; the table follows it, and the new link's addresses are not
    /// counted as the node's.
    #[test]
    fn a_recreated_kube_ipvs0_is_followed_by_its_new_index() {
        use RouteNetlinkMessage::*;
        let mut table = Table::default();
        table.apply(&NewLink(link(2, "eth0")));
        table.apply(&NewLink(link(7, INTERFACE)));
        table.apply(&NewAddress(address(2, "10.20.30.51")));
        table.apply(&DelLink(link(7, INTERFACE)));
        assert_eq!(table.snapshot().kube_ipvs0, None);
        table.apply(&NewLink(link(9, INTERFACE)));
        table.apply(&NewAddress(address(9, "10.96.0.1")));
        assert_eq!(table.snapshot().kube_ipvs0, Some(9));
        assert_eq!(others(&table), ["10.20.30.51"]);
        // Renamed away: its addresses were never kept, so everything is read again.
        assert!(!table.apply(&NewLink(link(9, "renamed"))));
        assert_eq!(table.snapshot().kube_ipvs0, None);
    }
}

//! The real [`Dataplane`]: kernel IPVS through `ipvs-rs`, the dummy interface `kube-ipvs0` and
//! its addresses through rtnetlink, and the sysctls kube-proxy's IPVS mode sets.

pub mod batch;
pub mod conntrack;
pub mod interfaces;
pub mod preflight;
pub mod settings;
pub mod sysctl;

use super::diff::{Ownership, diff};
use super::{Dataplane, DataplaneError, NFT_STAGE, Op, OpFailure, isolate, nft_transaction};
use crate::dataplane::nftables::codec as nft;
use crate::dataplane::nftables::elements::{self as nft_elements, SetElements};
use crate::dataplane::nftables::runner::Nft;
use crate::model::{
    DesiredState, ObservedRealServer, ObservedState, ObservedVirtualServer, Protocol, SetElement,
    VirtualServerKey, VirtualServerSpec,
};
use batch::Batcher;
use conntrack::{Conntrack, Listing, UdpEntry};
use futures::{StreamExt, TryStreamExt};
pub use interfaces::INTERFACE;
use interfaces::{Interfaces, own_address};
use ipvs::IpvsMessage;
use ipvs::procfs::{ListedService, ProcListing};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NetlinkMessage};
use netlink_packet_generic::GenlMessage;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::AddressMessage;
use netlink_packet_route::link::LinkAttribute;
use netlink_proto::sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};
use rtnetlink::{AddressMessageBuilder, LinkDummy};
use settings::SchedulerError;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tracing::Instrument;

/// How many netlink reads (the destinations of each virtual server) are in flight at once.
const PIPELINE_DEPTH: usize = 256;

/// The real servers of each virtual server, as one read of the IPVS listing has them.
type Listed = BTreeMap<VirtualServerKey, BTreeMap<SocketAddr, ObservedRealServer>>;

/// errno values the dataplane treats as success.
const EEXIST: i32 = libc::EEXIST;
const EADDRNOTAVAIL: i32 = libc::EADDRNOTAVAIL;

/// The errno of an address op on a link that is gone (`kube-ipvs0` deleted since its index
/// was resolved).
const ENODEV: i32 = libc::ENODEV;

/// The kernel dataplane of one network namespace.
pub struct KernelDataplane {
    ipvs: ipvs::Handle,
    /// The full observations ([`Dataplane::observer`]), on sockets of their own.
    reader: Reader,
    rtnl: rtnetlink::Handle,
    /// Binds and unbinds addresses in batches (a stage of them is one `sendmsg` per
    /// [`batch::BATCH`] ops).
    addresses: Batcher,
    /// Applies the IPVS ops in batches the same way (`ipvs` reads the table).
    ipvs_batches: Batcher,
    /// `kube-ipvs0`'s index, shared with the [`Reader`]; resolved again (the link made again
    /// if missing) when [`Interfaces`] says it changed or a bind meets `ENODEV`
    /// ([`Dataplane::kube_ipvs0_recreated`]).
    link_index: Arc<AtomicU32>,
    /// The node's interfaces as rtnetlink notifications tell them; started at the first use.
    interfaces: Option<Interfaces>,
    /// Whether `kube-ipvs0` was found made again since the engine last asked
    /// ([`Dataplane::kube_ipvs0_recreated`]).
    link_recreated: bool,
    nft: Nft,
    /// Element-only nftables transactions go through this socket ([`nft_elements`]); opened
    /// at the first, `None` until then and after a socket failure (reopened at the next).
    set_elements: Option<SetElements>,
    /// `None` when the UDP conntrack cleanup is switched off (`KIPVS_CONNTRACK_CLEANUP=false`).
    conntrack: Option<Conntrack>,
}

impl KernelDataplane {
    /// Connect to IPVS (generic netlink) and rtnetlink, and create `kube-ipvs0` if missing.
    ///
    /// Errors: [`ipvs::Error::FamilyNotFound`] when the `ip_vs` module is not loaded, rtnetlink
    /// errors when the dummy link cannot be created (no `dummy` module, no `CAP_NET_ADMIN`).
    pub async fn connect() -> Result<Self, DataplaneError> {
        let ipvs = ipvs::Handle::connect().await?;
        // Its own socket: a full observation's dumps never hold the turn of the writers'
        // re-reads ([`Dataplane::observe_virtual_servers`]).
        let observing = ipvs::Handle::connect().await?;
        let listing = ProcListing::open()
            .inspect_err(|error| {
                tracing::warn!(
                    %error,
                    "no IPVS listing: reading real servers with one netlink request per virtual server"
                );
            })
            .ok();
        let (conn, rtnl, _) = rtnetlink::new_connection().map_err(|source| DataplaneError::Io {
            context: "rtnetlink socket".into(),
            source,
        })?;
        tokio::spawn(conn.instrument(tracing::info_span!("rtnetlink")));
        let link_index = Arc::new(AtomicU32::new(ensure_dummy(&rtnl).await?));
        let batcher = |protocol, context: &str| {
            Batcher::open(protocol).map_err(|source| DataplaneError::Io {
                context: format!("{context} netlink socket"),
                source,
            })
        };
        let addresses = batcher(NETLINK_ROUTE, "rtnetlink")?;
        let ipvs_batches = batcher(NETLINK_GENERIC, "IPVS")?;
        let reader = Reader {
            ipvs: observing,
            listing: Arc::new(std::sync::Mutex::new(listing)),
            rtnl: rtnl.clone(),
            link_index: link_index.clone(),
            nft: Nft::default(),
        };
        Ok(KernelDataplane {
            ipvs,
            reader,
            rtnl,
            addresses,
            ipvs_batches,
            link_index,
            interfaces: None,
            link_recreated: false,
            nft: Nft::default(),
            set_elements: None,
            conntrack: conntrack_cleanup_enabled().then(Conntrack::connect),
        })
    }

    /// Remove everything kipvs (or kube-proxy's IPVS mode) programmed on this node: every virtual
    /// server it owns (see [`Ownership`]; those inside `exclude_cidrs` stay), every address on
    /// `kube-ipvs0`, the `kube-ipvs0` link itself and the nftables table `inet kipvs`. Never flushes: virtual servers of
    /// other owners survive. Returns the ops applied and those that failed; when a virtual server
    /// could not be deleted, the link and the table stay (the table's record of owning it, and
    /// its firewall), so that the next cleanup finds it.
    ///
    /// Errors: when the kernel cannot be observed or the link cannot be deleted.
    pub async fn cleanup(
        mut self,
        exclude_cidrs: Vec<ipnet::IpNet>,
        node_port_range: std::ops::RangeInclusive<u16>,
    ) -> Result<(Vec<Op>, Vec<OpFailure>), DataplaneError> {
        let observed = self.observe().await?;
        let ownership = Ownership {
            node_ips: self.other_interface_addresses().await?,
            node_port_ips: BTreeSet::new(),
            node_port_range: Some(node_port_range),
            exclude_cidrs,
            // Every local address counts as a node IP here: deleted, not drained.
            local_addresses: BTreeSet::new(),
            kube_proxy_node_ports: BTreeSet::new(),
        };
        let ops = diff(&DesiredState::default(), &observed, &ownership);
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|op| op.stage() != NFT_STAGE)
            .collect();
        let failures = self.apply(&ops).await;
        // A virtual server that could not be deleted keeps the table's record of it (and its
        // firewall) and the link: the next cleanup finds it.
        if failures
            .iter()
            .any(|f| matches!(f.op, Op::DeleteVirtualServer(_)))
        {
            return Ok((ops, failures));
        }
        let index = self.link_index.load(Ordering::Relaxed);
        self.rtnl.link().del(index).execute().await?;
        self.nft.delete_table().await?;
        Ok((ops, failures))
    }

    /// The IPVS handle (shared with helpers such as the timeouts setup).
    pub fn ipvs(&self) -> &ipvs::Handle {
        &self.ipvs
    }

    /// Apply a stage of address ops (all binds or all unbinds) in batches ([`Batcher`]): a
    /// bound address that exists (`EEXIST`) or an unbound one that does not (`EADDRNOTAVAIL`)
    /// is a success.
    async fn apply_addresses(&mut self, stage: &[Op]) -> Vec<Result<(), DataplaneError>> {
        let mut flags = 0;
        let index = self.link_index.load(Ordering::Relaxed);
        let requests: Vec<NetlinkMessage<RouteNetlinkMessage>> = stage
            .iter()
            .filter_map(|op| {
                let (Op::BindAddress(a) | Op::UnbindAddress(a)) = op else {
                    return None;
                };
                let message = address_message(index, *a);
                Some(NetlinkMessage::from(if let Op::BindAddress(_) = op {
                    flags = NLM_F_CREATE | NLM_F_EXCL;
                    RouteNetlinkMessage::NewAddress(message)
                } else {
                    RouteNetlinkMessage::DelAddress(message)
                }))
            })
            .collect();
        debug_assert_eq!(requests.len(), stage.len(), "a stage of address ops");
        match self.addresses.send_all(requests, flags).await {
            Ok(results) => {
                if results.contains(&Err(ENODEV)) {
                    // kube-ipvs0 is gone: made again for the retry of these ops; the engine's
                    // next look at it ([`Dataplane::kube_ipvs0_recreated`]) binds every address
                    // again.
                    if let Err(error) = self.resolve_link().await {
                        tracing::warn!(%error, "cannot make {INTERFACE} again");
                    }
                }
                stage
                    .iter()
                    .zip(results)
                    .map(|(op, result)| match (op, result) {
                        (_, Ok(()))
                        | (Op::BindAddress(_), Err(EEXIST))
                        | (Op::UnbindAddress(_), Err(EADDRNOTAVAIL)) => Ok(()),
                        (op, Err(errno)) => Err(DataplaneError::Io {
                            context: format!("rtnetlink {}", op.name()),
                            source: std::io::Error::from_raw_os_error(errno),
                        }),
                    })
                    .collect()
            }
            Err(e) => stage
                .iter()
                .map(|_| Err(socket_error("rtnetlink", &e)))
                .collect(),
        }
    }

    /// The node's interfaces, followed from the first call on.
    fn interfaces(&mut self) -> &mut Interfaces {
        self.interfaces.get_or_insert_with(Interfaces::follow)
    }

    /// Finds `kube-ipvs0` (made again if missing) and keeps its index, noting whether it
    /// changed ([`KernelDataplane::link_recreated`]).
    async fn resolve_link(&mut self) -> Result<(), DataplaneError> {
        let index = ensure_dummy(&self.rtnl).await?;
        let before = self.link_index.swap(index, Ordering::Relaxed);
        if before != index {
            self.link_recreated = true;
            tracing::warn!(
                before,
                index,
                "{INTERFACE} was deleted or made again: it is back, and a full sync binds its \
                 addresses again"
            );
        }
        Ok(())
    }

    /// Apply a stage of IPVS ops in batches ([`Batcher`]), each op one generic-netlink request
    /// as [`ipvs::Handle`] would send it.
    async fn apply_ipvs(&mut self, stage: &[Op]) -> Vec<Result<(), DataplaneError>> {
        let family = self.ipvs.family_id();
        let requests: Vec<NetlinkMessage<GenlMessage<IpvsMessage>>> = stage
            .iter()
            .filter_map(|op| {
                let payload = match op {
                    Op::DeleteVirtualServer(key) => IpvsMessage::del_service(&service_id(key)),
                    Op::AddVirtualServer(key, spec) => {
                        IpvsMessage::new_service(&service(key, spec))
                    }
                    Op::UpdateVirtualServer(key, spec) => {
                        IpvsMessage::set_service(&service(key, spec))
                    }
                    Op::DeleteRealServer { vs, rs } => {
                        IpvsMessage::del_dest(&service_id(vs), rs.ip(), rs.port())
                    }
                    Op::AddRealServer { vs, rs, weight } => IpvsMessage::new_dest(
                        &service_id(vs),
                        &ipvs::Destination::new(rs.ip(), rs.port(), *weight),
                    ),
                    Op::UpdateRealServer { vs, rs, weight } => IpvsMessage::set_dest(
                        &service_id(vs),
                        &ipvs::Destination::new(rs.ip(), rs.port(), *weight),
                    ),
                    Op::UnbindAddress(_)
                    | Op::BindAddress(_)
                    | Op::WriteRules(_)
                    | Op::DeleteSetElement(_)
                    | Op::AddSetElement(_) => return None,
                };
                let mut genl = GenlMessage::from_payload(payload);
                genl.set_resolved_family_id(family);
                Some(NetlinkMessage::from(genl))
            })
            .collect();
        debug_assert_eq!(requests.len(), stage.len(), "a stage of IPVS ops");
        match self.ipvs_batches.send_all(requests, 0).await {
            Ok(results) => results
                .into_iter()
                .map(|r| r.map_err(|errno| ipvs::Error::from_errno(errno).into()))
                .collect(),
            Err(e) => stage
                .iter()
                .map(|_| Err(socket_error("IPVS", &e)))
                .collect(),
        }
    }

    /// Applies nftables ops as one transaction (all or nothing): element-only ones as one
    /// nfnetlink batch ([`nft_elements`]), the others (rules, `firewall-allow` intervals) and
    /// any batch that failed through `nft -f` (which says why in words, and re-declares a
    /// missing table and its sets).
    /// Returns how: `"netlink"` or `"nft"`.
    async fn apply_nft(&mut self, ops: &[Op]) -> Result<&'static str, DataplaneError> {
        let tx = nft_transaction(ops);
        if let Some(batch) = nft_elements::batch(&tx) {
            let socket = match self.set_elements.take() {
                Some(socket) => Ok(socket),
                None => SetElements::open(),
            };
            let result = match socket {
                Ok(mut socket) => {
                    let result = socket.apply(batch).await;
                    if !matches!(result, Err(nft_elements::ElementsError::Socket(_))) {
                        self.set_elements = Some(socket);
                    }
                    result
                }
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(()) => return Ok("netlink"),
                Err(error) => {
                    tracing::warn!(%error, "set element batch failed; applying it with nft")
                }
            }
        }
        self.nft.apply(&nft::transaction(&tx)).await?;
        Ok("nft")
    }
}

impl Dataplane for KernelDataplane {
    fn observer(
        &mut self,
    ) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send + 'static {
        self.reader.clone().observe()
    }

    async fn observe_virtual_servers(
        &mut self,
        keys: &[VirtualServerKey],
    ) -> Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, DataplaneError> {
        let ids: Vec<_> = keys.iter().map(service_id).collect();
        let services: Vec<_> = ids.iter().map(|id| self.ipvs.service(id)).collect();
        let services: Vec<_> = futures::stream::iter(services)
            .buffered(PIPELINE_DEPTH)
            .collect()
            .await;
        let dests: Vec<_> = ids.iter().map(|id| self.ipvs.destinations(id)).collect();
        let dests: Vec<_> = futures::stream::iter(dests)
            .buffered(PIPELINE_DEPTH)
            .collect()
            .await;
        let mut out = BTreeMap::new();
        for ((key, service), dests) in keys.iter().zip(services).zip(dests) {
            let spec = match service {
                Ok(s) => match observed_service(&s) {
                    Some((_, spec)) => spec,
                    None => continue,
                },
                Err(ipvs::Error::NoSuchService) => continue,
                Err(e) => return Err(e.into()),
            };
            let real_servers = real_servers(dests?);
            out.insert(*key, ObservedVirtualServer { spec, real_servers });
        }
        Ok(out)
    }

    async fn observe_addresses(&mut self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        self.reader.bound_addresses().await
    }

    async fn observe_set_elements(&mut self) -> Result<BTreeSet<SetElement>, DataplaneError> {
        Ok(self.nft.observe().await?.elements)
    }

    async fn check_scheduler(&mut self, scheduler: &str) -> Result<(), SchedulerError> {
        settings::probe_scheduler(&self.ipvs, scheduler).await
    }

    async fn other_interface_addresses(&mut self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        Ok(self.interfaces().current().await?.others)
    }

    fn interfaces_changed(&mut self) -> impl Future<Output = ()> + Send + 'static {
        self.interfaces().changed()
    }

    async fn kube_ipvs0_recreated(&mut self) -> Result<bool, DataplaneError> {
        let followed = self.interfaces().current().await?.kube_ipvs0;
        if followed != Some(self.link_index.load(Ordering::Relaxed)) {
            self.resolve_link().await?;
        }
        Ok(std::mem::take(&mut self.link_recreated))
    }

    async fn apply(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        let mut failures = Vec::new();
        let mut withholding = isolate::Withholding::default();
        for stage in ops.chunk_by(|a, b| a.stage() == b.stage()) {
            let started = std::time::Instant::now();
            let (stage, held) = withholding.split(stage);
            failures.extend(held);
            if stage.is_empty() {
                continue;
            }
            if stage[0].stage() == NFT_STAGE {
                // One transaction, split when refused so that only the refused ops fail.
                let mut via = "nft";
                let mut isolation = isolate::Isolation::new(&stage);
                while let Some(part) = isolation.next_part() {
                    let result = self.apply_nft(part).await;
                    isolation.done(result.map(|how| via = how));
                }
                let mut refused = isolation.failures();
                if isolate::refused_creations(&refused) {
                    match self.nft.observe().await {
                        Ok(table) => {
                            isolate::applied_anyway(&mut refused, &table.elements);
                        }
                        Err(error) => tracing::warn!(
                            %error,
                            "cannot read the table back after a refused firewall-allow element"
                        ),
                    }
                }
                withholding.failed(ops, &refused);
                tracing::debug!(
                    stage = NFT_STAGE,
                    via,
                    ops = stage.len(),
                    refused = refused.len(),
                    duration_us = started.elapsed().as_micros() as u64,
                    "applied nftables transaction"
                );
                failures.extend(refused);
                continue;
            }
            let results = if matches!(stage[0], Op::BindAddress(_) | Op::UnbindAddress(_)) {
                self.apply_addresses(&stage).await
            } else {
                self.apply_ipvs(&stage).await
            };
            tracing::debug!(
                stage = stage[0].stage(),
                first = stage[0].name(),
                ops = stage.len(),
                duration_us = started.elapsed().as_micros() as u64,
                "applied stage"
            );
            let first = failures.len();
            for (op, result) in stage.iter().zip(results) {
                if let Err(error) = result {
                    failures.push(OpFailure {
                        op: op.clone(),
                        error,
                    });
                }
            }
            withholding.failed(ops, &failures[first..]);
        }
        failures
    }

    async fn remove_rules(&mut self) -> Result<(), DataplaneError> {
        Ok(self.nft.delete_table().await?)
    }

    async fn udp_conntrack(
        &mut self,
        listing: Listing<'_>,
    ) -> Result<Vec<UdpEntry>, DataplaneError> {
        match &self.conntrack {
            Some(conntrack) => Ok(conntrack.udp_entries(listing).await?),
            None => Ok(Vec::new()),
        }
    }

    async fn delete_conntrack(&mut self, entries: &[UdpEntry]) -> Vec<(UdpEntry, DataplaneError)> {
        let Some(conntrack) = &self.conntrack else {
            return Vec::new();
        };
        let failures = conntrack.delete(entries).await;
        failures
            .into_iter()
            .map(|(e, error)| (e, error.into()))
            .collect()
    }
}

/// What a full observation reads with ([`Dataplane::observer`]): the dataplane's rtnetlink
/// handle, and an IPVS socket and `nft` runs of its own, so that it runs as a task beside the
/// dataplane's writes.
#[derive(Clone)]
struct Reader {
    ipvs: ipvs::Handle,
    /// `/proc/net/ip_vs` of the namespace: every virtual server's real servers in one read.
    /// `None` when it cannot be opened or read (then one netlink dump per virtual server).
    listing: Arc<std::sync::Mutex<Option<ProcListing>>>,
    rtnl: rtnetlink::Handle,
    /// `kube-ipvs0`'s index, as [`KernelDataplane`] resolves it.
    link_index: Arc<AtomicU32>,
    nft: Nft,
}

impl Reader {
    /// The virtual servers' specs come from one netlink service dump, their real servers from
    /// one read of the IPVS listing that follows it ([`ipvs::procfs`]); a virtual server of the
    /// dump the listing lacks (created in between, or skipped by a listing the table changed
    /// under) is read over netlink, one the listing has and the dump lacks (created in between)
    /// is left out, as a dump alone would. So each virtual server's real servers are read at one
    /// moment, and what changed between the two reads at worst makes an op fail (`EEXIST`,
    /// `ENOENT`) and the sync retry; it never makes the diff delete what exists and is wanted.
    async fn observe(self) -> Result<ObservedState, DataplaneError> {
        let started = std::time::Instant::now();
        let services = self.ipvs.services().await?;
        let listed = self.read_listing().await;
        // On the blocking pool, as the listing's read: matching 10k virtual servers with their
        // real servers takes the CPU for a while in the emulated test VM, and the engine's
        // incremental syncs need the runtime's worker meanwhile (one on a one-CPU node).
        let (mut virtual_servers, unlisted) = tokio::task::spawn_blocking(move || {
            take_listed(
                services.iter().filter_map(observed_service).collect(),
                listed,
            )
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let from_listing = virtual_servers.len();
        // Collected first: a closure inside the stream would not be `Send` for every lifetime.
        let ids: Vec<_> = unlisted.iter().map(|(key, _)| service_id(key)).collect();
        let requests: Vec<_> = ids.iter().map(|id| self.ipvs.destinations(id)).collect();
        let dests: Vec<_> = futures::stream::iter(requests)
            .buffered(PIPELINE_DEPTH)
            .collect()
            .await;
        for ((key, spec), dests) in unlisted.into_iter().zip(dests) {
            let real_servers = match dests {
                Ok(d) => real_servers(d),
                // Deleted between the two dumps: it is gone.
                Err(ipvs::Error::NoSuchService) => continue,
                Err(e) => return Err(e.into()),
            };
            virtual_servers.insert(key, ObservedVirtualServer { spec, real_servers });
        }
        // A table that cannot be read is an error, not an empty table: an empty one would
        // make the diff re-add what exists and never delete a stale element. The sync fails
        // (nothing is changed) and is retried with backoff; a missing table reads as empty.
        let ipvs_us = started.elapsed().as_micros() as u64;
        let table = self.nft.observe().await?;
        let nft_us = started.elapsed().as_micros() as u64 - ipvs_us;
        let bound_addresses = self.bound_addresses().await?;
        tracing::debug!(
            virtual_servers = virtual_servers.len(),
            from_listing,
            destination_requests = ids.len(),
            set_elements = table.elements.len(),
            bound_addresses = bound_addresses.len(),
            ipvs_us,
            nft_us,
            duration_us = started.elapsed().as_micros() as u64,
            "observed the kernel"
        );
        Ok(ObservedState {
            virtual_servers,
            bound_addresses,
            set_elements: table.elements,
            nft_rule_comments: table.rule_comments,
        })
    }

    async fn bound_addresses(&self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        let index = self.link_index.load(Ordering::Relaxed);
        let mut stream = self
            .rtnl
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut out = BTreeSet::new();
        while let Some(msg) = stream.try_next().await? {
            if msg.header.index != index {
                continue;
            }
            out.extend(own_address(&msg));
        }
        Ok(out)
    }

    /// One read of the IPVS listing, and its real servers by virtual server, on the blocking
    /// pool (the kernel formats the table during the read; 20k real servers are parsed and
    /// sorted); `None` without a listing. A listing that cannot be read or parsed is dropped
    /// with a warning: this and every later observation read the real servers over netlink.
    async fn read_listing(&self) -> Option<Listed> {
        let shared = self.listing.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut listing = shared.lock().unwrap_or_else(|e| e.into_inner());
            let services = listing.as_mut()?.read();
            if services.is_err() {
                *listing = None;
            }
            Some(services.map(listed))
        })
        .await;
        let error = match read {
            Ok(None) => return None,
            Ok(Some(Ok(listed))) => return Some(listed),
            Ok(Some(Err(error))) => error.to_string(),
            Err(error) => {
                *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = None;
                error.to_string()
            }
        };
        tracing::warn!(
            %error,
            "cannot read the IPVS listing: reading real servers with one netlink request per virtual server from now on"
        );
        None
    }
}

/// Whether the UDP conntrack cleanup runs: on unless `KIPVS_CONNTRACK_CLEANUP` is `false` or
/// `0` (an escape hatch, and how the VM test shows what happens without it).
fn conntrack_cleanup_enabled() -> bool {
    !matches!(
        std::env::var("KIPVS_CONNTRACK_CLEANUP").as_deref(),
        Ok("false" | "0")
    )
}

/// Real servers by address from a destination dump.
fn real_servers(dests: Vec<ipvs::Destination>) -> BTreeMap<SocketAddr, ObservedRealServer> {
    dests
        .into_iter()
        .map(|d| {
            let counts = (d.weight, d.active_connections, d.inactive_connections);
            real_server(SocketAddr::new(d.address, d.port), counts)
        })
        .collect()
}

/// One real server as observed: its address, and its weight, active and inactive connections
/// (from a destination dump or the listing alike).
fn real_server(
    address: SocketAddr,
    (weight, active_connections, inactive_connections): (u32, u32, u32),
) -> (SocketAddr, ObservedRealServer) {
    let rs = ObservedRealServer {
        weight,
        active_connections,
        inactive_connections,
    };
    (address, rs)
}

/// The listed address-based virtual servers kipvs can own, with their real servers (a
/// virtual server listed twice, the table having changed between the reads, keeps its last).
fn listed(services: Vec<ListedService>) -> Listed {
    services
        .into_iter()
        .filter_map(|service| {
            let key = virtual_server_key(service.id.service_id()?)?;
            let real_servers = service
                .destinations
                .into_iter()
                .map(|d| {
                    let counts = (d.weight, d.active_connections, d.inactive_connections);
                    real_server(SocketAddr::new(d.address, d.port), counts)
                })
                .collect();
            Some((key, real_servers))
        })
        .collect()
}

/// The dumped virtual servers (`dumped`, their specs) the listing has, with its real servers,
/// and those it lacks, to be read over netlink (all of them without a listing). Listed virtual
/// servers the dump lacks are left out.
fn take_listed(
    dumped: Vec<(VirtualServerKey, VirtualServerSpec)>,
    listed: Option<Listed>,
) -> (
    BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    Vec<(VirtualServerKey, VirtualServerSpec)>,
) {
    let Some(mut listed) = listed else {
        return (BTreeMap::new(), dumped);
    };
    let mut observed = BTreeMap::new();
    let mut unlisted = Vec::new();
    for (key, spec) in dumped {
        match listed.remove(&key) {
            Some(real_servers) => {
                observed.insert(key, ObservedVirtualServer { spec, real_servers });
            }
            None => unlisted.push((key, spec)),
        }
    }
    (observed, unlisted)
}

/// The error of every op of a batch whose socket failed (`what`: which socket).
fn socket_error(what: &str, e: &std::io::Error) -> DataplaneError {
    DataplaneError::Io {
        context: format!("{what} netlink socket"),
        source: std::io::Error::new(e.kind(), e.to_string()),
    }
}

/// Find `kube-ipvs0` or create it as a dummy link; returns its interface index.
async fn ensure_dummy(rtnl: &rtnetlink::Handle) -> Result<u32, DataplaneError> {
    if let Some(i) = find_link(rtnl).await? {
        return Ok(i);
    }
    match rtnl
        .link()
        .add(LinkDummy::new(INTERFACE).build())
        .execute()
        .await
    {
        Err(e) if netlink_errno(&e) != Some(EEXIST) => return Err(e.into()),
        _ => {}
    }
    find_link(rtnl)
        .await?
        .ok_or_else(|| DataplaneError::NoInterface(INTERFACE.into()))
}

/// `kube-ipvs0`'s index, if it exists. The dump is read to its end: a dump dropped half-way
/// makes `netlink-proto` warn once per link it can no longer hand on.
async fn find_link(rtnl: &rtnetlink::Handle) -> Result<Option<u32>, DataplaneError> {
    let mut links = rtnl.link().get().execute();
    let mut found = None;
    while let Some(link) = links.try_next().await? {
        let named = link
            .attributes
            .iter()
            .any(|a| matches!(a, LinkAttribute::IfName(n) if n == INTERFACE));
        if named {
            found = Some(link.header.index);
        }
    }
    Ok(found)
}

fn address_message(index: u32, a: IpAddr) -> AddressMessage {
    match a {
        IpAddr::V4(v4) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(v4, 32)
            .build(),
        IpAddr::V6(v6) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(v6, 128)
            .build(),
    }
}

fn netlink_errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

fn ipvs_protocol(p: Protocol) -> ipvs::Protocol {
    match p {
        Protocol::Tcp => ipvs::Protocol::Tcp,
        Protocol::Udp => ipvs::Protocol::Udp,
        Protocol::Sctp => ipvs::Protocol::Sctp,
    }
}

/// The IPVS identity of a virtual server.
pub fn service_id(key: &VirtualServerKey) -> ipvs::ServiceId {
    ipvs::ServiceId::Inet {
        address: key.address,
        port: key.port,
        protocol: ipvs_protocol(key.protocol),
    }
}

/// The full IPVS service entry for a virtual server: persistence sets `IP_VS_SVC_F_PERSISTENT`
/// and the timeout; the netmask is the host mask of the family (kube-proxy `ipvs_linux.go`).
pub fn service(key: &VirtualServerKey, spec: &VirtualServerSpec) -> ipvs::Service {
    let mut s = ipvs::Service::new(service_id(key), &*spec.scheduler);
    let mut flags = spec.sched_flags;
    if let Some(t) = spec.persistence_timeout {
        flags |= ipvs::ServiceFlags::PERSISTENT.0;
        s.timeout = t;
    }
    s.flags = ipvs::ServiceFlags(flags);
    s
}

/// The inverse of [`service`] for a dumped entry; `None` for fwmark services and unknown
/// protocols (never kipvs's). The kernel-owned `HASHED` bit is dropped.
pub fn observed_service(s: &ipvs::Service) -> Option<(VirtualServerKey, VirtualServerSpec)> {
    let key = virtual_server_key(s.id)?;
    let persistent = s.flags.0 & ipvs::ServiceFlags::PERSISTENT.0 != 0;
    let sched_flags =
        s.flags.0 & !(ipvs::ServiceFlags::PERSISTENT.0 | ipvs::ServiceFlags::HASHED.0);
    let spec = VirtualServerSpec {
        scheduler: s.scheduler.as_str().into(),
        persistence_timeout: persistent.then_some(s.timeout),
        sched_flags,
    };
    Some((key, spec))
}

/// The inverse of [`service_id`]; `None` for fwmark services and unknown protocols (never
/// kipvs's).
fn virtual_server_key(id: ipvs::ServiceId) -> Option<VirtualServerKey> {
    let ipvs::ServiceId::Inet {
        address,
        port,
        protocol,
    } = id
    else {
        return None;
    };
    let protocol = match protocol {
        ipvs::Protocol::Tcp => Protocol::Tcp,
        ipvs::Protocol::Udp => Protocol::Udp,
        ipvs::Protocol::Sctp => Protocol::Sctp,
        ipvs::Protocol::Other(_) => return None,
    };
    Some(VirtualServerKey {
        address,
        port,
        protocol,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_round_trips_through_ipvs_entry() {
        let key = VirtualServerKey {
            address: "fd00::10".parse().unwrap(),
            port: 53,
            protocol: Protocol::Udp,
        };
        let spec = VirtualServerSpec {
            scheduler: "mh".into(),
            persistence_timeout: Some(10800),
            sched_flags: ipvs::ServiceFlags::SCHED2.0,
        };
        let mut entry = service(&key, &spec);
        assert_eq!(entry.netmask, 128);
        assert_eq!(
            entry.flags.0,
            ipvs::ServiceFlags::PERSISTENT.0 | ipvs::ServiceFlags::SCHED2.0
        );
        // The kernel reports HASHED on every dumped service.
        entry.flags.0 |= ipvs::ServiceFlags::HASHED.0;
        assert_eq!(observed_service(&entry), Some((key, spec)));
    }

    #[test]
    fn non_persistent_service_reports_no_timeout() {
        let key = VirtualServerKey {
            address: "10.96.0.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let spec = VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: 0,
        };
        let entry = service(&key, &spec);
        assert_eq!(entry.netmask, 0xffff_ffff);
        assert_eq!(observed_service(&entry), Some((key, spec)));
    }

    fn key(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
        VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol,
        }
    }

    fn rr() -> VirtualServerSpec {
        VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: 0,
        }
    }

    /// The listing of the example cluster's DNS Service on TCP and UDP, one IPv6 Service and a
    /// firewall-mark service, as `ip_vs_info_seq_show` prints them.
    const LISTING: &str = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A60000A:0035 rr  
  -> 0AF40206:0035      Masq    1      0          0         
  -> 0AF40105:0035      Masq    0      2          7         
UDP  0A60000A:0035 rr  
  -> 0AF40105:0035      Masq    1      0          3         
TCP  [fd00:0000:0000:0000:0000:0000:0000:0014]:0050 rr 
FWM  00000007 wrr 
  -> 0AF40103:0000      Route   3      0          0         
";

    #[test]
    fn the_listing_gives_real_servers_by_virtual_server() {
        let listed = listed(ipvs::procfs::parse(LISTING).unwrap());
        let rs = |weight, active_connections, inactive_connections| ObservedRealServer {
            weight,
            active_connections,
            inactive_connections,
        };
        let want: Listed = [
            (
                key("10.96.0.10", 53, Protocol::Tcp),
                [
                    ("10.244.2.6:53".parse().unwrap(), rs(1, 0, 0)),
                    ("10.244.1.5:53".parse().unwrap(), rs(0, 2, 7)),
                ]
                .into(),
            ),
            (
                key("10.96.0.10", 53, Protocol::Udp),
                [("10.244.1.5:53".parse().unwrap(), rs(1, 0, 3))].into(),
            ),
            (key("fd00::14", 80, Protocol::Tcp), BTreeMap::new()),
        ]
        .into();
        // The firewall-mark service is not kipvs's: left out.
        assert_eq!(listed, want);
    }

    /// A service printed twice (a service added before the kernel's cursor between two read
    /// chunks moves the next chunk's start back by one) keeps its later print.
    #[test]
    fn a_virtual_server_listed_twice_keeps_its_later_print() {
        let twice = LISTING.replace(
            "UDP  0A60000A:0035 rr  \n",
            "TCP  0A60000A:0035 rr  \n  -> 0AF40206:0035      Masq    0      5          1         \n\
             UDP  0A60000A:0035 rr  \n",
        );
        let listed = listed(ipvs::procfs::parse(&twice).unwrap());
        let dns = &listed[&key("10.96.0.10", 53, Protocol::Tcp)];
        let later = ObservedRealServer {
            weight: 0,
            active_connections: 5,
            inactive_connections: 1,
        };
        assert_eq!(dns.len(), 1, "the later print only: {dns:?}");
        assert_eq!(dns[&"10.244.2.6:53".parse().unwrap()], later);
        assert_eq!(listed.len(), 3);
    }

    #[test]
    fn dumped_virtual_servers_the_listing_lacks_are_read_over_netlink() {
        let listed = listed(ipvs::procfs::parse(LISTING).unwrap());
        let dns = key("10.96.0.10", 53, Protocol::Tcp);
        let created_after_the_listing = key("10.96.0.30", 443, Protocol::Tcp);
        let dumped = vec![(dns, rr()), (created_after_the_listing, rr())];
        let (observed, unlisted) = take_listed(dumped.clone(), Some(listed.clone()));
        // Listed and dumped: the dump's spec, the listing's real servers.
        assert_eq!(observed.len(), 1);
        assert_eq!(observed[&dns].spec, rr());
        assert_eq!(observed[&dns].real_servers, listed[&dns]);
        // Dumped only: read over netlink. Listed only (UDP DNS, the IPv6 one, created after
        // the dump): left out, as a dump alone would.
        assert_eq!(unlisted, [(created_after_the_listing, rr())]);
        // No listing: everything over netlink.
        let (observed, unlisted) = take_listed(dumped.clone(), None);
        assert!(observed.is_empty());
        assert_eq!(unlisted, dumped);
    }
}

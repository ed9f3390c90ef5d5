//! Synchronisation: observe the dataplane, [`diff`](crate::dataplane::diff::diff) against the desired state, apply.
//!
//! Three kinds of sync, so that cost follows change:
//! - [`Syncer::sync`] (start, periodic resync): observe the whole kernel table, diff it all
//!   (the periodic one in slices, [`Syncer::finish_slice`], with incremental syncs between).
//! - [`Syncer::sync_touched`] (a Service or its endpoints changed): diff only the virtual
//!   servers and addresses the change touched, against a cache of the kernel's state that is
//!   kept up to date with every applied op. One endpoint change costs a handful of netlink
//!   messages whatever the size of the table.
//! - [`Syncer::check_drains`] (while real servers drain): re-read only the virtual servers
//!   holding draining real servers, and delete those whose connections ended or whose
//!   maximum drain time passed.
//!
//! Failures stay local: a failed op leaves only the cache entry it concerns in doubt (a
//! virtual server, an address, a set element, the rules), never the whole cache. Entries in
//! doubt are retried with their own backoff ([`RETRY_FIRST`] doubling to [`RETRY_MAX`]):
//! until due, incremental syncs leave them out; when due, the entry is re-read from the kernel
//! first: a failed netlink request may have been applied (its answer lost: `ENOBUFS`, a socket
//! error, a timeout; see [`crate::dataplane::kernel::batch`]), and so may an element batch whose
//! answers were lost (it is then replayed through `nft -f`, whose deletion of an element
//! already gone fails the whole transaction). Every other change stays incremental; the
//! periodic full sync re-observes everything and retries every entry.
//!
//! Order: the ops of a sync go to the dataplane in [`diff_scoped`]'s order. An endpoint change
//! of an existing virtual server reaches IPVS before the main nftables transaction (an `nft`
//! process, which can take seconds on a loaded node, when it holds rules or intervals), so a new endpoint takes traffic at once and an old one leaves before its set
//! elements do. What must be in nftables before traffic uses a real server still goes first:
//! a new endpoint's hairpin element (an element-only transaction of its own ahead of the real
//! servers: one nfnetlink batch, about a millisecond), and its virtual server's masquerade and
//! firewall elements when they change (the real servers then wait for the main transaction).
//! The reasons: `dataplane::position`.
//!
//! Logging: every sync ends with one `sync complete` line at info level (kind, op count,
//! failures, durations). Each op is one `op=…` line at debug level under the target
//! [`OPS_LOG`] (`RUST_LOG=info,kipvs_proxier::ops=debug` shows them), logged before the ops go
//! to the kernel; a failed op is then a warning (`failed op=…`).
//! A cold start of 10k Services is 60k ops: at info level that is 60k log lines per node
//! restart, written before the ops reach the kernel; kube-proxy logs no line per rule or real
//! server at its default verbosity either.

use super::drains::Drains;
use crate::dataplane::diff::{Ownership, diff_scoped};
use crate::dataplane::kernel::conntrack::{self, CleanupReport, Listing};
use crate::dataplane::{Dataplane, DataplaneError, Op, OpFailure, isolate};
use crate::model::{DesiredState, ObservedState, Protocol, Scope, SetElement, VirtualServerKey};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::ops::Bound;
use std::time::Duration;
use tokio::time::Instant;

/// What a sync looked at (logged with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// It observed the whole kernel and diffed everything ([`Syncer::sync`],
    /// [`Syncer::finish_full`]; the last slice of [`Syncer::finish_slice`]).
    Full,
    /// It diffed what a change touched against the cache ([`Syncer::sync_touched`]); every
    /// Service after a re-plan of all of them.
    Incremental,
    /// It re-read the virtual servers of draining real servers ([`Syncer::check_drains`]).
    DrainCheck,
    /// A slice of a full sync's finish but the last ([`Syncer::finish_slice`]).
    FullSlice,
}

impl SyncKind {
    /// As logged (`kind=full`).
    pub fn name(self) -> &'static str {
        match self {
            SyncKind::Full => "full",
            SyncKind::Incremental => "incremental",
            SyncKind::DrainCheck => "drain check",
            SyncKind::FullSlice => "full slice",
        }
    }
}

/// The outcome of one sync.
#[derive(Debug)]
pub struct SyncReport {
    /// The operations that were attempted, in order.
    pub ops: Vec<Op>,
    /// Those that failed.
    pub failures: Vec<OpFailure>,
    /// Wall time of observe + diff + apply + conntrack cleanup (of a full sync whose
    /// observation ran beside incremental syncs, from the start of that observation).
    pub duration: Duration,
    /// What the UDP conntrack cleanup did ([`crate::dataplane::kernel::conntrack`]); zero when it did not run.
    pub conntrack: CleanupReport,
}

/// The tracing target of the per-op lines (`op=AddRealServer vs="TCP 10.96.0.10:80" rs=…`),
/// logged at debug level before the ops are applied.
pub const OPS_LOG: &str = "kipvs_proxier::ops";

/// How soon a cache entry a failed op left in doubt is retried first.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest delay between retries of one entry (the delay doubles from [`RETRY_FIRST`]).
pub const RETRY_MAX: Duration = Duration::from_secs(64);

/// How many entries of one kind a slice of a periodic full sync's finish takes at most
/// ([`Syncer::finish_slice`]): what a change waits for at most while a full sync finishes.
pub const FINISH_SLICE: usize = 1024;

/// The Service a full sync programs first: the API server's. A node whose first sync is slow
/// (a cold start programs the whole table) cannot reach the API server through its ClusterIP
/// until that Service is programmed (kubernetes#133773), so its ops go before all others.
pub const API_SERVER_SERVICE: &str = "default/kubernetes";

/// Move the ops that program [`API_SERVER_SERVICE`] (its virtual servers, their real servers,
/// bound addresses and set elements, and the nftables rules those elements need) before all
/// others, each group keeping its stage order: the dataplane applies them as stages of their
/// own, then the rest. Entries of the two groups are disjoint, so the safe order holds within
/// each. Cost: O(virtual servers + set elements + ops), once per full sync (one pass, not a
/// sort of the ops).
pub fn first_the_api_server(desired: &DesiredState, ops: &mut Vec<Op>) {
    let prefix = format!("{API_SERVER_SERVICE}:");
    let keys: BTreeSet<VirtualServerKey> = desired
        .virtual_servers
        .iter()
        .filter(|(_, vs)| vs.service.starts_with(&prefix))
        .map(|(key, _)| *key)
        .collect();
    if keys.is_empty() {
        return;
    }
    let mut first: BTreeSet<Entry> = keys.iter().map(|k| Entry::VirtualServer(*k)).collect();
    first.extend(keys.iter().map(|k| Entry::Address(k.address)));
    let endpoints: BTreeSet<IpAddr> = keys
        .iter()
        .flat_map(|k| desired.virtual_servers[k].real_servers.keys())
        .map(|rs| rs.ip())
        .collect();
    first.extend(
        desired
            .set_elements
            .iter()
            .filter(|e| match e {
                SetElement::ServiceIp(ip) => keys.iter().any(|k| k.address == *ip),
                SetElement::Hairpin(ip) => endpoints.contains(ip),
                _ => e.virtual_server().is_some_and(|k| keys.contains(&k)),
            })
            .map(|e| Entry::SetElement(*e)),
    );
    if !ops.iter().any(|op| first.contains(&Entry::of(op))) {
        return;
    }
    first.insert(Entry::Rules);
    // Each group keeps its order: the first group's ops are taken out in order and put in front.
    let firsts: Vec<Op> = ops
        .extract_if(.., |op| first.contains(&Entry::of(op)))
        .collect();
    ops.splice(0..0, firsts);
}

/// A cache entry an op concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entry {
    /// A virtual server with its real servers.
    VirtualServer(VirtualServerKey),
    /// An address on `kube-ipvs0`.
    Address(IpAddr),
    /// An nftables set element.
    SetElement(SetElement),
    /// The nftables rules.
    Rules,
}

impl Entry {
    /// The entry `op` changes.
    pub fn of(op: &Op) -> Entry {
        match op {
            Op::UnbindAddress(a) | Op::BindAddress(a) => Entry::Address(*a),
            Op::DeleteRealServer { vs, .. }
            | Op::AddRealServer { vs, .. }
            | Op::UpdateRealServer { vs, .. }
            | Op::DeleteVirtualServer(vs)
            | Op::AddVirtualServer(vs, _)
            | Op::UpdateVirtualServer(vs, _) => Entry::VirtualServer(*vs),
            Op::WriteRules(_) => Entry::Rules,
            Op::DeleteSetElement(e) | Op::AddSetElement(e) => Entry::SetElement(*e),
        }
    }

    /// Whether `scope` names this entry (the rules are in every scope).
    fn in_scope(&self, scope: &Scope) -> bool {
        match self {
            Entry::VirtualServer(k) => scope.virtual_servers.contains(k),
            Entry::Address(a) => scope.addresses.contains(a),
            Entry::SetElement(e) => scope.set_elements.contains(e),
            Entry::Rules => true,
        }
    }

    /// Add this entry to `scope`, or take it out.
    fn set_in(&self, scope: &mut Scope, wanted: bool) {
        fn set<T: Ord>(set: &mut BTreeSet<T>, item: T, wanted: bool) {
            if wanted {
                set.insert(item);
            } else {
                set.remove(&item);
            }
        }
        match *self {
            Entry::VirtualServer(k) => set(&mut scope.virtual_servers, k, wanted),
            Entry::Address(a) => set(&mut scope.addresses, a, wanted),
            Entry::SetElement(e) => set(&mut scope.set_elements, e, wanted),
            Entry::Rules => {}
        }
    }
}

/// Make `cache` hold each of `items` exactly when `kernel` does (the re-read of entries in doubt).
fn copy_membership<T: Ord + Copy>(cache: &mut BTreeSet<T>, kernel: &BTreeSet<T>, items: &[T]) {
    for item in items {
        set_membership(cache, *item, kernel.contains(item));
    }
}

/// When an entry in doubt is retried next, and the delay before the retry after that.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    due: Instant,
    delay: Duration,
}

/// A full sync being finished in slices ([`Syncer::start_finishing`]).
struct Finishing {
    /// What the observation read and no slice took yet.
    observed: ObservedState,
    /// When the full sync started.
    start: Instant,
    /// Where the next slice starts.
    next: Next,
    /// The ops of the slices so far.
    ops: Vec<Op>,
    /// Those of them that failed.
    failures: Vec<OpFailure>,
}

/// Where the next slice of a full sync's finish starts, in the order the slices go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// The nftables rules (with the first set elements).
    Rules,
    /// The set elements from this one.
    SetElements(Bound<SetElement>),
    /// The virtual servers from this one.
    VirtualServers(Bound<VirtualServerKey>),
    /// The addresses on `kube-ipvs0` from this one.
    Addresses(Bound<IpAddr>),
    /// Nothing left.
    Done,
}

/// Drives a [`Dataplane`] towards desired states.
///
/// Nothing it keeps is needed after a restart: a new process observes the kernel and adopts
/// what matches, and a real server still at weight 0 but desired gets its weight back.
pub struct Syncer<D> {
    dataplane: D,
    /// Which virtual servers this proxier may delete.
    pub ownership: Ownership,
    /// Longest drain of a removed TCP real server (`ipvs.drainTimeout`).
    pub max_drain: Duration,
    /// The kernel's state after the last sync, with every applied op folded in; `None` until
    /// the first full sync.
    cache: Option<ObservedState>,
    /// Cache entries failed ops left in doubt, and when each is retried.
    in_doubt: BTreeMap<Entry, Backoff>,
    /// Draining real servers and when they started draining (in this process).
    drains: Drains,
    /// UDP virtual servers whose real servers changed, or that were deleted, since the last
    /// successful conntrack cleanup: the entries the next cleanup lists (the entries of a
    /// deleted one are stale whatever their real server).
    udp_changed: BTreeSet<VirtualServerKey>,
    /// While a full sync observes or finishes ([`Syncer::begin_full`] to its last slice): the
    /// cache entries written (or re-read) since it started, where the cache knows better than
    /// the observation.
    written: Option<BTreeSet<Entry>>,
    /// The full sync being finished in slices, if any.
    finishing: Option<Finishing>,
}

impl<D: Dataplane> Syncer<D> {
    /// A syncer over `dataplane`; removed TCP real servers drain for at most `max_drain`.
    pub fn new(dataplane: D, ownership: Ownership, max_drain: Duration) -> Self {
        Syncer {
            dataplane,
            ownership,
            max_drain,
            cache: None,
            in_doubt: BTreeMap::new(),
            drains: Drains::default(),
            udp_changed: BTreeSet::new(),
            written: None,
            finishing: None,
        }
    }

    /// The dataplane (tests inspect the fake through this).
    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// The dataplane, for observations outside a sync.
    pub fn dataplane_mut(&mut self) -> &mut D {
        &mut self.dataplane
    }

    /// Draining real servers and when each started draining.
    pub fn drains(&self) -> &BTreeMap<(VirtualServerKey, SocketAddr), Instant> {
        self.drains.since()
    }

    /// The kernel's state as the syncs left it (`None` before the first full sync).
    pub fn cached(&self) -> Option<&ObservedState> {
        self.cache.as_ref()
    }

    /// The cache entries failed ops left in doubt.
    pub fn in_doubt(&self) -> impl Iterator<Item = &Entry> {
        self.in_doubt.keys()
    }

    /// When the first entry in doubt is due for a retry (`None`: nothing in doubt).
    pub fn next_retry(&self) -> Option<Instant> {
        self.in_doubt.values().map(|b| b.due).min()
    }

    /// Full sync: observe everything, diff everything, apply ([`begin_full`](Self::begin_full)
    /// and [`finish_full`](Self::finish_full) with nothing in between).
    ///
    /// Errors: only when the dataplane cannot be observed (nothing is changed then); failed
    /// ops are reported in [`SyncReport::failures`] and retried by the next sync.
    pub async fn sync(&mut self, desired: &DesiredState) -> Result<SyncReport, DataplaneError> {
        let start = Instant::now();
        let observed = self.begin_full().await;
        self.finish_full(desired, observed, start).await
    }

    /// Starts the observation of a full sync: the read of the whole kernel, as a future that
    /// borrows nothing ([`Dataplane::observer`]), to run beside incremental syncs
    /// ([`sync_touched`](Self::sync_touched), [`check_drains`](Self::check_drains)); from now
    /// on, until the full sync's last slice ([`finish_slice`](Self::finish_slice)), the syncer
    /// notes every cache entry they write or re-read.
    pub fn begin_full(
        &mut self,
    ) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send + 'static {
        self.written = Some(BTreeSet::new());
        self.dataplane.observer()
    }

    /// Finishes the full sync [`begin_full`](Self::begin_full) started at `start` with what it
    /// `observed`, in one go: [`start_finishing`](Self::start_finishing), then one
    /// [`finish_slice`](Self::finish_slice) of everything (the first sync, and the full syncs a
    /// switch forces: the API server's Service goes first, [`first_the_api_server`]).
    ///
    /// Errors: only when the dataplane could not be observed (nothing is changed then).
    #[tracing::instrument(name = "sync", skip_all, fields(kind = "full"))]
    pub async fn finish_full(
        &mut self,
        desired: &DesiredState,
        observed: Result<ObservedState, DataplaneError>,
        start: Instant,
    ) -> Result<SyncReport, DataplaneError> {
        let observed = match observed {
            Ok(observed) => observed,
            Err(e) => {
                self.written = None;
                return Err(e);
            }
        };
        self.start_finishing(observed, start);
        Ok(self
            .finish_slice(desired, usize::MAX)
            .await
            .expect("one slice of everything finishes"))
    }

    /// Takes what the full sync [`begin_full`](Self::begin_full) started at `start`
    /// `observed`, to finish it in slices ([`finish_slice`](Self::finish_slice)); until the
    /// last one, the syncer goes on noting the entries incremental syncs write.
    pub fn start_finishing(&mut self, observed: ObservedState, start: Instant) {
        self.written.get_or_insert_default();
        self.finishing = Some(Finishing {
            observed,
            start,
            next: Next::Rules,
            ops: Vec::new(),
            failures: Vec::new(),
        });
    }

    /// Whether a full sync is being finished in slices ([`start_finishing`](Self::start_finishing)).
    pub fn finishing(&self) -> bool {
        self.finishing.is_some()
    }

    /// One slice of the full sync being finished: entries of one kind, at most `limit` of each
    /// of the desired state, the observation and the cache (the rules and nftables set
    /// elements first, then virtual servers, then addresses on `kube-ipvs0`: the stage order
    /// of [`diff_scoped`] across slices), or, with `limit` `usize::MAX`, everything at once
    /// (the API server's Service first, [`first_the_api_server`]). Each entry of the slice that no sync wrote or re-read
    /// since the observation started takes the observation's state in the cache (what others
    /// changed in the kernel, connection counts); the others keep the cache's, which follows
    /// those writes (the observation may have read them before). Then the slice is diffed
    /// against `desired` as it is now and applied. So a full sync never undoes nor repeats a
    /// write made while it ran; an entry left in doubt by one of them keeps its own retry.
    /// Cost on the caller: O(`limit` · log n) per slice; incremental syncs may run between
    /// slices.
    ///
    /// Returns the full sync's report after the last slice (every slice's ops and failures, the
    /// UDP conntrack cleanup of every entry, the duration from `start`), `None` before; `None`
    /// when no full sync is being finished.
    pub async fn finish_slice(
        &mut self,
        desired: &DesiredState,
        limit: usize,
    ) -> Option<SyncReport> {
        let mut finishing = self.finishing.take()?;
        let cache = self.cache.get_or_insert_default();
        let written = self.written.get_or_insert_default();
        let observed = &mut finishing.observed;
        let mut scope = Scope::default();
        let mut next = finishing.next;
        loop {
            next = match next {
                Next::Rules => {
                    if !written.contains(&Entry::Rules) {
                        cache.nft_rule_comments = std::mem::take(&mut observed.nft_rule_comments);
                    }
                    Next::SetElements(Bound::Unbounded)
                }
                Next::SetElements(from) => {
                    let (keys, after) = reconcile_slice(
                        limit,
                        from,
                        &desired.set_elements,
                        &mut observed.set_elements,
                        &mut cache.set_elements,
                        |e| written.contains(&Entry::SetElement(e)),
                    );
                    scope.set_elements = keys;
                    after.map_or(Next::VirtualServers(Bound::Unbounded), Next::SetElements)
                }
                Next::VirtualServers(from) => {
                    let range = (from, Bound::Unbounded);
                    let (keys, after) = chunk(
                        limit,
                        [
                            Box::new(desired.virtual_servers.range(range).map(|(k, _)| *k)),
                            Box::new(observed.virtual_servers.range(range).map(|(k, _)| *k)),
                            Box::new(cache.virtual_servers.range(range).map(|(k, _)| *k)),
                        ],
                    );
                    for key in keys
                        .iter()
                        .filter(|k| !written.contains(&Entry::VirtualServer(**k)))
                    {
                        match observed.virtual_servers.remove(key) {
                            Some(vs) => cache.virtual_servers.insert(*key, vs),
                            None => cache.virtual_servers.remove(key),
                        };
                    }
                    scope.virtual_servers = keys;
                    after.map_or(Next::Addresses(Bound::Unbounded), Next::VirtualServers)
                }
                Next::Addresses(from) => {
                    let (keys, after) = reconcile_slice(
                        limit,
                        from,
                        &desired.bind_addresses,
                        &mut observed.bound_addresses,
                        &mut cache.bound_addresses,
                        |a| written.contains(&Entry::Address(a)),
                    );
                    scope.addresses = keys;
                    after.map_or(Next::Done, Next::Addresses)
                }
                Next::Done => Next::Done,
            };
            // A slice holds one kind of entry (the rules go with the first); a slice without a
            // limit goes on to the end.
            let slice_ends =
                limit != usize::MAX && !matches!(next, Next::SetElements(Bound::Unbounded));
            if next == Next::Done || slice_ends {
                break;
            }
        }
        finishing.next = next;
        let done = next == Next::Done;
        for entry in self.in_doubt.keys().filter(|e| written.contains(e)) {
            entry.set_in(&mut scope, false);
        }
        if done {
            self.written = None;
        }
        let start = finishing.start;
        let expired = self.expired(start);
        let cache = self.cache.as_ref().expect("made above");
        let mut ops = diff_scoped(desired, cache, &self.ownership, &scope, &expired);
        // O(n): only when everything goes at once (slices go in key order).
        if limit == usize::MAX && !ops.is_empty() {
            first_the_api_server(desired, &mut ops);
        }
        let kind = if done {
            SyncKind::Full
        } else {
            SyncKind::FullSlice
        };
        let report = self.apply(desired, ops, &scope, start, kind).await;
        finishing.ops.extend(report.ops);
        finishing.failures.extend(report.failures);
        if !done {
            self.finishing = Some(finishing);
            return None;
        }
        Some(SyncReport {
            ops: finishing.ops,
            failures: finishing.failures,
            duration: start.elapsed(),
            conntrack: report.conntrack,
        })
    }

    /// Incremental sync of what `touched` names, against the cached kernel state; a full
    /// [`sync`](Self::sync) when there is no cache yet.
    #[tracing::instrument(
        name = "sync",
        skip_all,
        fields(kind = "incremental", virtual_servers = touched.virtual_servers.len())
    )]
    pub async fn sync_touched(
        &mut self,
        desired: &DesiredState,
        touched: &Scope,
    ) -> Result<SyncReport, DataplaneError> {
        if self.cache.is_none() {
            return self.sync(desired).await;
        }
        let start = Instant::now();
        let mut scope = touched.clone();
        // A touched virtual server that loses a real server is re-read first: whether that real
        // server drains or goes depends on its connections, which the cache only knows as of its
        // last observation.
        let cache = self.cache.as_ref().expect("checked");
        let mut refresh: Vec<VirtualServerKey> = touched
            .virtual_servers
            .iter()
            .filter(|key| {
                let wanted = desired.virtual_servers.get(key).map(|vs| &vs.real_servers);
                cache.virtual_servers.get(key).is_some_and(|vs| {
                    vs.real_servers
                        .keys()
                        .any(|rs| !wanted.is_some_and(|w| w.contains_key(rs)))
                })
            })
            .copied()
            .collect();
        let (mut addresses, mut elements) = (Vec::new(), Vec::new());
        for (entry, backoff) in &self.in_doubt {
            let due = backoff.due <= start;
            entry.set_in(&mut scope, due);
            match (due, entry) {
                (true, Entry::VirtualServer(key)) => refresh.push(*key),
                (true, Entry::Address(address)) => addresses.push(*address),
                (true, Entry::SetElement(element)) => elements.push(*element),
                _ => {}
            }
        }
        refresh.sort_unstable();
        refresh.dedup();
        if !refresh.is_empty() {
            self.refresh(&refresh).await?;
        }
        if !addresses.is_empty() {
            self.refresh_addresses(&addresses).await?;
        }
        if !elements.is_empty() {
            self.refresh_set_elements(&elements).await?;
        }
        let expired = self.expired(start);
        let cache = self.cache.as_ref().expect("checked");
        let ops = diff_scoped(desired, cache, &self.ownership, &scope, &expired);
        Ok(self
            .apply(desired, ops, &scope, start, SyncKind::Incremental)
            .await)
    }

    /// Re-read the virtual servers `keys` from the kernel into the cache.
    async fn refresh(&mut self, keys: &[VirtualServerKey]) -> Result<(), DataplaneError> {
        let fresh = self.dataplane.observe_virtual_servers(keys).await?;
        self.note_written(keys.iter().map(|k| Entry::VirtualServer(*k)));
        let cache = self.cache.as_mut().expect("refresh needs a cache");
        for key in keys {
            match fresh.get(key) {
                Some(vs) => cache.virtual_servers.insert(*key, vs.clone()),
                None => cache.virtual_servers.remove(key),
            };
        }
        Ok(())
    }

    /// Re-read whether each of `addresses` is bound on `kube-ipvs0` into the cache.
    async fn refresh_addresses(&mut self, addresses: &[IpAddr]) -> Result<(), DataplaneError> {
        let bound = self.dataplane.observe_addresses().await?;
        self.note_written(addresses.iter().map(|a| Entry::Address(*a)));
        let cache = self.cache.as_mut().expect("refresh needs a cache");
        copy_membership(&mut cache.bound_addresses, &bound, addresses);
        Ok(())
    }

    /// Re-read whether each of `elements` is in its nftables set into the cache (one read of
    /// the table: only when a retry is due).
    async fn refresh_set_elements(
        &mut self,
        elements: &[SetElement],
    ) -> Result<(), DataplaneError> {
        let present = self.dataplane.observe_set_elements().await?;
        self.note_written(elements.iter().map(|e| Entry::SetElement(*e)));
        let cache = self.cache.as_mut().expect("refresh needs a cache");
        copy_membership(&mut cache.set_elements, &present, elements);
        Ok(())
    }

    /// Re-read the virtual servers holding draining real servers and delete those whose
    /// connections ended or whose drain exceeded [`max_drain`](Self::max_drain). A no-op
    /// when nothing drains.
    pub async fn check_drains(
        &mut self,
        desired: &DesiredState,
    ) -> Result<SyncReport, DataplaneError> {
        let start = Instant::now();
        let keys = self.drains.virtual_servers();
        if keys.is_empty() || self.cache.is_none() {
            return Ok(SyncReport {
                ops: vec![],
                failures: vec![],
                duration: start.elapsed(),
                conntrack: CleanupReport::default(),
            });
        }
        let list: Vec<VirtualServerKey> = keys.iter().copied().collect();
        self.refresh(&list).await?;
        let expired = self.expired(start);
        let cache = self.cache.as_ref().expect("checked");
        let scope = Scope {
            virtual_servers: keys,
            ..Scope::default()
        };
        let ops = diff_scoped(desired, cache, &self.ownership, &scope, &expired);
        Ok(self
            .apply(desired, ops, &scope, start, SyncKind::DrainCheck)
            .await)
    }

    /// Draining real servers past their maximum drain time at `now`.
    fn expired(&self, now: Instant) -> BTreeSet<(VirtualServerKey, SocketAddr)> {
        self.drains.expired(now, self.max_drain)
    }

    /// Apply `ops` (the diff of `scope`), fold the successful ones into the cache, put the
    /// entries of failed ones in doubt (and take those of `scope` that did not fail out of
    /// doubt), track drains, log.
    async fn apply(
        &mut self,
        desired: &DesiredState,
        ops: Vec<Op>,
        scope: &Scope,
        start: Instant,
        kind: SyncKind,
    ) -> SyncReport {
        for op in &ops {
            tracing::debug!(target: OPS_LOG, "{op}");
        }
        let applying = Instant::now();
        let mut ops = ops;
        let mut failures = if ops.is_empty() {
            Vec::new()
        } else {
            self.dataplane.apply(&ops).await
        };
        let closed = self.close_exposed(desired, &mut ops, &mut failures).await;
        let apply_us = applying.elapsed().as_micros() as u64;
        log_failures(desired, &failures);
        let mut failed: BTreeSet<Entry> = failures.iter().map(|f| Entry::of(&f.op)).collect();
        failed.extend(closed.into_iter().map(Entry::VirtualServer));
        self.fold_into_cache(&ops, &mut failed);
        self.put_in_doubt(failed, scope, start);
        if let Some(cache) = &self.cache {
            // Drains change only where this sync looked: the virtual servers of `scope` (all of
            // them in a full sync).
            self.drains.track(
                desired,
                cache,
                &self.ownership,
                &scope.virtual_servers,
                start,
            );
        }
        let cleaning = Instant::now();
        let conntrack = self
            .clean_conntrack(desired, &ops, &failures, kind == SyncKind::Full)
            .await;
        let conntrack_us = cleaning.elapsed().as_micros() as u64;
        let duration = start.elapsed();
        // A slice of a full sync's finish that changed nothing is not logged: the last one is.
        if kind != SyncKind::FullSlice || !ops.is_empty() {
            tracing::info!(
                kind = kind.name(),
                ops = ops.len(),
                failed = failures.len(),
                draining = self.drains.len(),
                in_doubt = self.in_doubt.len(),
                duration_us = duration.as_micros() as u64,
                apply_us,
                conntrack_us,
                "sync complete"
            );
        }
        SyncReport {
            ops,
            failures,
            duration,
            conntrack,
        }
    }

    /// Notes `entries` as written while a full sync observes or finishes (see
    /// [`finish_slice`](Self::finish_slice)); nothing when none runs.
    fn note_written(&mut self, entries: impl IntoIterator<Item = Entry>) {
        if let Some(written) = &mut self.written {
            written.extend(entries);
        }
    }

    /// Folds the applied `ops` into the cache, except those on an entry in doubt (`failed`):
    /// it is re-read (or re-diffed) when retried. An op the cache cannot fold puts its entry in
    /// doubt too.
    fn fold_into_cache(&mut self, ops: &[Op], failed: &mut BTreeSet<Entry>) {
        self.note_written(ops.iter().map(Entry::of));
        let Some(cache) = &mut self.cache else {
            return;
        };
        let mut out_of_step = Vec::new();
        let folded = ops.iter().filter(|op| !failed.contains(&Entry::of(op)));
        cache.apply_all(folded, |op, result| {
            if let Err(e) = result {
                tracing::debug!("cache out of step ({e}) after {op}; will re-read it");
                out_of_step.push(Entry::of(op));
            }
        });
        failed.extend(out_of_step);
    }

    /// Puts the `failed` entries in doubt, each retried after a backoff from `start` (doubling
    /// from [`RETRY_FIRST`] to [`RETRY_MAX`] while it fails), and takes those of `scope` that
    /// did not fail out of doubt.
    fn put_in_doubt(&mut self, failed: BTreeSet<Entry>, scope: &Scope, start: Instant) {
        self.in_doubt
            .retain(|entry, _| failed.contains(entry) || !entry.in_scope(scope));
        for entry in failed {
            let delay = self
                .in_doubt
                .get(&entry)
                .map_or(RETRY_FIRST, |b| (b.delay * 2).min(RETRY_MAX));
            let due = start + delay;
            self.in_doubt.insert(entry, Backoff { due, delay });
        }
    }

    /// Fail closed: deletes each existing virtual server whose new `firewall` element failed
    /// ([`isolate::exposed`]: the kernel would leave it open to every source), appending the
    /// deletions to `ops` and their failures to `failures`. Returns the virtual servers closed
    /// (deleted or not): the caller puts them in doubt, so that they are retried with their
    /// element and added again once it is in (the address stays bound: other ports may use it).
    async fn close_exposed(
        &mut self,
        desired: &DesiredState,
        ops: &mut Vec<Op>,
        failures: &mut Vec<OpFailure>,
    ) -> BTreeSet<VirtualServerKey> {
        let Some(cache) = &self.cache else {
            return BTreeSet::new();
        };
        let mut exposed = isolate::exposed(ops, failures);
        exposed.retain(|key| cache.virtual_servers.contains_key(key));
        if exposed.is_empty() {
            return exposed;
        }
        let closing: Vec<Op> = exposed
            .iter()
            .map(|key| Op::DeleteVirtualServer(*key))
            .collect();
        for key in &exposed {
            let service = desired
                .virtual_servers
                .get(key)
                .map_or("-", |vs| &*vs.service);
            tracing::warn!(
                service,
                vs = %key,
                "deleting the virtual server until its firewall element is in the kernel (fail closed)"
            );
        }
        for op in &closing {
            tracing::debug!(target: OPS_LOG, "{op}");
        }
        failures.extend(self.dataplane.apply(&closing).await);
        ops.extend(closing);
        exposed
    }

    /// Delete the stale UDP conntrack entries ([`conntrack::stale`]): after a full sync, among
    /// every UDP entry; after a sync that added or deleted a UDP real server or deleted a UDP
    /// virtual server (a Service back from zero endpoints gets no entry made while it had
    /// none), or one whose cleanup failed, among the entries to those virtual servers only; a
    /// no-op otherwise. Failures are logged and counted, never fail the sync; on a kernel
    /// without ctnetlink every cleanup is skipped and counted as failed (logged once).
    async fn clean_conntrack(
        &mut self,
        desired: &DesiredState,
        ops: &[Op],
        failures: &[OpFailure],
        full: bool,
    ) -> CleanupReport {
        for op in ops
            .iter()
            .filter(|op| !failures.iter().any(|f| &f.op == *op))
        {
            match op {
                Op::DeleteVirtualServer(vs)
                | Op::DeleteRealServer { vs, .. }
                | Op::AddRealServer { vs, .. }
                    if vs.protocol == Protocol::Udp =>
                {
                    self.udp_changed.insert(*vs);
                }
                _ => {}
            }
        }
        let listing = match full {
            true => Listing::All,
            false if self.udp_changed.is_empty() => return CleanupReport::default(),
            false => Listing::To(&self.udp_changed),
        };
        let entries = match self.dataplane.udp_conntrack(listing).await {
            Ok(entries) => entries,
            // No ctnetlink in this kernel (logged once where found): skipped, nothing to retry.
            Err(DataplaneError::Conntrack(error)) if error.is_unavailable() => {
                self.udp_changed.clear();
                return CleanupReport {
                    deleted: 0,
                    failed: 1,
                };
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list UDP conntrack entries; retried next sync");
                return CleanupReport {
                    deleted: 0,
                    failed: 1,
                };
            }
        };
        let stale = conntrack::stale(&entries, desired, &self.udp_changed);
        let failed = self.dataplane.delete_conntrack(&stale).await;
        for (entry, error) in &failed {
            tracing::warn!(%error, "cannot delete stale UDP conntrack entry {entry}");
        }
        for entry in stale
            .iter()
            .filter(|e| !failed.iter().any(|(f, _)| f == *e))
        {
            tracing::info!("deleted stale UDP conntrack entry {entry}");
        }
        if failed.is_empty() {
            self.udp_changed.clear();
        }
        CleanupReport {
            deleted: stale.len() - failed.len(),
            failed: failed.len(),
        }
    }
}

/// Puts `item` in `set` when `present`, takes it out otherwise.
fn set_membership<T: Ord>(set: &mut BTreeSet<T>, item: T, present: bool) {
    if present {
        set.insert(item);
    } else {
        set.remove(&item);
    }
}

/// One slice of a set-like kind of entry (nftables set elements, addresses on `kube-ipvs0`)
/// from `from`: its keys ([`chunk`] of `desired`, `observed` and `cache`) and the next slice's
/// start; each key not `written` since the observation started takes the observation's
/// membership in `cache` (taken out of `observed`).
fn reconcile_slice<T: Ord + Copy>(
    limit: usize,
    from: Bound<T>,
    desired: &BTreeSet<T>,
    observed: &mut BTreeSet<T>,
    cache: &mut BTreeSet<T>,
    written: impl Fn(T) -> bool,
) -> (BTreeSet<T>, Option<Bound<T>>) {
    let range = (from, Bound::Unbounded);
    let (keys, after) = chunk(
        limit,
        [
            Box::new(desired.range(range).copied()),
            Box::new(observed.range(range).copied()),
            Box::new(cache.range(range).copied()),
        ],
    );
    for &key in keys.iter().filter(|k| !written(**k)) {
        let present = observed.remove(&key);
        set_membership(cache, key, present);
    }
    (keys, after)
}

/// The keys of one slice of a full sync's finish: those of the three ascending `keys` (the
/// desired state's, the observation's and the cache's, from the slice's start) below the
/// first key any of them has past its `limit` first keys (so at most `limit` of each), and the
/// start of the next slice (`None`: these were the last). O(`limit`).
fn chunk<'a, T: Ord + Copy + 'a>(
    limit: usize,
    keys: [Box<dyn Iterator<Item = T> + 'a>; 3],
) -> (BTreeSet<T>, Option<Bound<T>>) {
    let firsts: Vec<Vec<T>> = keys
        .into_iter()
        .map(|k| k.take(limit.saturating_add(1)).collect())
        .collect();
    let end = firsts.iter().filter_map(|f| f.get(limit).copied()).min();
    let keys = firsts
        .into_iter()
        .flatten()
        .filter(|k| end.is_none_or(|end| *k < end))
        .collect();
    (keys, end.map(Bound::Included))
}

/// Logs each failed op with the Service of its virtual server (`-` for none).
fn log_failures(desired: &DesiredState, failures: &[OpFailure]) {
    for f in failures {
        let service =
            f.op.virtual_server()
                .and_then(|k| desired.virtual_servers.get(&k));
        let service = service.map_or("-", |vs| &*vs.service);
        tracing::warn!(error = %f.error, service, "failed {}", f.op);
    }
}

#[cfg(test)]
mod tests;

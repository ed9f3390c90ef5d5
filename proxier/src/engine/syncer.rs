//! Synchronisation: observe the dataplane, [`diff`](crate::dataplane::diff::diff) against the desired state, apply.
//!
//! Three kinds of sync, so that cost follows change:
//! - [`Syncer::sync`] (start, periodic resync): observe the whole kernel table, diff it all.
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
use crate::model::{
    DesiredState, ObservedState, Protocol, Scope, SetElement, VirtualServerKey, full_scope,
};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::time::Instant;

/// What a sync looked at (logged with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// It observed the whole kernel and diffed everything ([`Syncer::sync`],
    /// [`Syncer::finish_full`]).
    Full,
    /// It diffed what a change touched against the cache ([`Syncer::sync_touched`]); every
    /// Service after a re-plan of all of them.
    Incremental,
    /// It re-read the virtual servers of draining real servers ([`Syncer::check_drains`]).
    DrainCheck,
}

impl SyncKind {
    /// As logged (`kind=full`).
    pub fn name(self) -> &'static str {
        match self {
            SyncKind::Full => "full",
            SyncKind::Incremental => "incremental",
            SyncKind::DrainCheck => "drain check",
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
        if kernel.contains(item) {
            cache.insert(*item);
        } else {
            cache.remove(item);
        }
    }
}

/// When an entry in doubt is retried next, and the delay before the retry after that.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    due: Instant,
    delay: Duration,
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
    /// While a full observation runs ([`Syncer::begin_full`]): the cache entries written (or
    /// re-read) since it started, where the cache knows better than the observation.
    written: Option<BTreeSet<Entry>>,
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
    /// on, until [`finish_full`](Self::finish_full), the syncer notes every cache entry they
    /// write or re-read.
    pub fn begin_full(
        &mut self,
    ) -> impl Future<Output = Result<ObservedState, DataplaneError>> + Send + 'static {
        self.written = Some(BTreeSet::new());
        self.dataplane.observer()
    }

    /// Finishes the full sync [`begin_full`](Self::begin_full) started at `start` with what it
    /// `observed`: the observation, reconciled with the writes made while it ran, becomes the
    /// cache, everything is diffed against it and applied.
    ///
    /// Reconciled: an entry written or re-read while the observation ran (a virtual server with
    /// its real servers, an address, a set element, the rules) keeps the cache's state, which
    /// follows those writes; the observation may have read that entry before them. Every other
    /// entry takes the observation's state (what others changed in the kernel, connection
    /// counts). So a full sync never undoes nor repeats a write made while it observed; an
    /// entry left in doubt by one of them is not in its scope and keeps its own retry.
    ///
    /// Errors: only when the dataplane could not be observed (nothing is changed then).
    #[tracing::instrument(name = "sync", skip_all, fields(kind = "full"))]
    pub async fn finish_full(
        &mut self,
        desired: &DesiredState,
        observed: Result<ObservedState, DataplaneError>,
        start: Instant,
    ) -> Result<SyncReport, DataplaneError> {
        let written = self.written.take().unwrap_or_default();
        let mut observed = observed?;
        if let Some(cache) = &self.cache {
            reconcile(&mut observed, cache, &written);
        }
        let mut scope = full_scope(desired, &observed);
        for entry in written.iter().filter(|e| self.in_doubt.contains_key(e)) {
            entry.set_in(&mut scope, false);
        }
        let expired = self.expired(start);
        let mut ops = diff_scoped(desired, &observed, &self.ownership, &scope, &expired);
        first_the_api_server(desired, &mut ops);
        self.cache = Some(observed);
        self.apply(desired, ops, &scope, start, SyncKind::Full)
            .await
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
        self.apply(desired, ops, &scope, start, SyncKind::Incremental)
            .await
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
        self.apply(desired, ops, &scope, start, SyncKind::DrainCheck)
            .await
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
    ) -> Result<SyncReport, DataplaneError> {
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
        Ok(SyncReport {
            ops,
            failures,
            duration,
            conntrack,
        })
    }

    /// Notes `entries` as written while a full observation runs (see
    /// [`finish_full`](Self::finish_full)); nothing when none runs.
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

/// Gives `observed` the `cache`'s state of each `written` entry (see [`Syncer::finish_full`]).
/// O(written · log n).
fn reconcile(observed: &mut ObservedState, cache: &ObservedState, written: &BTreeSet<Entry>) {
    for entry in written {
        match entry {
            Entry::VirtualServer(key) => match cache.virtual_servers.get(key) {
                Some(vs) => {
                    observed.virtual_servers.insert(*key, vs.clone());
                }
                None => {
                    observed.virtual_servers.remove(key);
                }
            },
            Entry::Address(address) => copy_membership(
                &mut observed.bound_addresses,
                &cache.bound_addresses,
                &[*address],
            ),
            Entry::SetElement(element) => {
                copy_membership(&mut observed.set_elements, &cache.set_elements, &[*element])
            }
            Entry::Rules => observed
                .nft_rule_comments
                .clone_from(&cache.nft_rule_comments),
        }
    }
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
mod tests {
    use super::*;
    use crate::dataplane::fake::FakeDataplane;
    use crate::model::{Protocol, SetElement, VirtualServer, VirtualServerSpec};

    const DRAIN: Duration = Duration::from_secs(900);

    fn key(port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address: "10.96.0.10".parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn state(backends: &[&str]) -> DesiredState {
        let vs = VirtualServer {
            spec: VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: 0,
            },
            real_servers: backends.iter().map(|b| (b.parse().unwrap(), 1)).collect(),
            service: "default/web:http".into(),
        };
        DesiredState {
            virtual_servers: [(key(80), vs)].into(),
            bind_addresses: ["10.96.0.10".parse().unwrap()].into(),
            ..Default::default()
        }
    }

    fn set_connections(syncer: &mut Syncer<FakeDataplane>, rs: &str, active: u32) {
        let vs = syncer
            .dataplane
            .state
            .virtual_servers
            .get_mut(&key(80))
            .unwrap();
        vs.real_servers
            .get_mut(&rs.parse().unwrap())
            .unwrap()
            .active_connections = active;
    }

    #[tokio::test]
    async fn second_sync_is_a_no_op_and_restart_adopts() {
        let desired = state(&["10.244.1.2:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        let first = syncer.sync(&desired).await.unwrap();
        // The nftables rules, the virtual server, its real server, the address.
        assert_eq!(first.ops.len(), 4);
        assert!(matches!(first.ops[0], Op::WriteRules(_)));
        assert!(first.failures.is_empty());
        assert!(syncer.sync(&desired).await.unwrap().ops.is_empty());
        // A new process over the same kernel state changes nothing.
        let kernel = syncer.dataplane().state.clone();
        assert_eq!(kernel, ObservedState::from(&desired));
        let mut restarted = Syncer::new(FakeDataplane::new(kernel), Ownership::default(), DRAIN);
        assert!(restarted.sync(&desired).await.unwrap().ops.is_empty());
    }

    #[tokio::test]
    async fn incremental_sync_touches_only_what_changed() {
        let before = state(&["10.244.1.2:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&before).await.unwrap();
        let after = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&after, &touched).await.unwrap();
        assert_eq!(
            report.ops,
            [Op::AddRealServer {
                vs: key(80),
                rs: "10.244.1.3:8080".parse().unwrap(),
                weight: 1
            }]
        );
        assert_eq!(syncer.dataplane.state, ObservedState::from(&after));
        // The cache followed: a full sync finds nothing to do.
        assert!(syncer.sync(&after).await.unwrap().ops.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn draining_real_server_is_deleted_when_idle_or_after_max_drain() {
        let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let one = state(&["10.244.1.3:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.max_drain = Duration::from_secs(60);
        syncer.sync(&both).await.unwrap();
        set_connections(&mut syncer, "10.244.1.2:8080", 1);
        // Leaves the desired set with a live connection: weight 0, kept.
        let report = syncer.sync(&one).await.unwrap();
        assert_eq!(report.ops.len(), 1);
        assert_eq!(syncer.drains().len(), 1);
        assert!(syncer.check_drains(&one).await.unwrap().ops.is_empty());
        // The connection ends: the next check deletes it.
        set_connections(&mut syncer, "10.244.1.2:8080", 0);
        let report = syncer.check_drains(&one).await.unwrap();
        assert!(matches!(report.ops[..], [Op::DeleteRealServer { .. }]));
        assert!(syncer.drains().is_empty());
        assert_eq!(syncer.dataplane.state, ObservedState::from(&one));

        // Again, but the connection never ends: deleted once max_drain passed.
        syncer.sync(&both).await.unwrap();
        set_connections(&mut syncer, "10.244.1.2:8080", 5);
        syncer.sync(&one).await.unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(syncer.check_drains(&one).await.unwrap().ops.is_empty());
        tokio::time::advance(Duration::from_secs(2)).await;
        let report = syncer.check_drains(&one).await.unwrap();
        assert!(matches!(report.ops[..], [Op::DeleteRealServer { .. }]));
    }

    /// A node kube-proxy programmed: its virtual servers and real servers that kipvs wants are
    /// adopted in place (a re-weight at most, never a delete and re-add), and its NodePort
    /// virtual server on a local address that is not a node IP (docker0's here) drains: its
    /// real server with a connection goes to weight 0, the one without goes, and the virtual
    /// server goes with the last real server once the connection ended.
    #[tokio::test]
    async fn kube_proxys_table_is_adopted_in_place_and_its_other_node_ports_drain() {
        let desired = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let mut kernel = ObservedState::from(&desired);
        // kube-proxy left 10.244.1.3 at weight 0 (its graceful delete) and has a NodePort on
        // docker0's address with two real servers.
        let cluster = kernel.virtual_servers.get_mut(&key(80)).unwrap();
        let gracefully_deleted: SocketAddr = "10.244.1.3:8080".parse().unwrap();
        cluster
            .real_servers
            .get_mut(&gracefully_deleted)
            .unwrap()
            .weight = 0;
        let docker0 = VirtualServerKey {
            address: "172.17.0.1".parse().unwrap(),
            port: 30080,
            protocol: Protocol::Tcp,
        };
        let mut node_port = kernel.virtual_servers[&key(80)].clone();
        for (_, rs) in node_port.real_servers.iter_mut() {
            rs.weight = 1;
        }
        let busy: SocketAddr = "10.244.1.2:8080".parse().unwrap();
        node_port
            .real_servers
            .get_mut(&busy)
            .unwrap()
            .active_connections = 1;
        kernel.virtual_servers.insert(docker0, node_port);
        let ownership = Ownership {
            node_ips: ["192.168.1.5".parse().unwrap()].into(),
            node_port_ips: ["192.168.1.5".parse().unwrap()].into(),
            node_port_range: Some(30000..=32767),
            local_addresses: [
                "172.17.0.1".parse().unwrap(),
                "192.168.1.5".parse().unwrap(),
            ]
            .into(),
            kube_proxy_node_ports: [(30080, Protocol::Tcp)].into(),
            ..Ownership::default()
        };
        let mut syncer = Syncer::new(FakeDataplane::new(kernel), ownership, DRAIN);
        let report = syncer.sync(&desired).await.unwrap();
        let ipvs: Vec<&Op> = report
            .ops
            .iter()
            .filter(|op| op.stage() != crate::dataplane::NFT_STAGE)
            .collect();
        let (vs, weight) = (key(80), 1);
        assert_eq!(
            ipvs,
            [
                &Op::DeleteRealServer {
                    vs: docker0,
                    rs: gracefully_deleted
                },
                &Op::UpdateRealServer {
                    vs,
                    rs: gracefully_deleted,
                    weight
                },
                &Op::UpdateRealServer {
                    vs: docker0,
                    rs: busy,
                    weight: 0
                },
            ]
        );
        assert_eq!(syncer.drains().len(), 1);
        // The connection ends: the real server goes, and its virtual server with it.
        syncer
            .dataplane
            .state
            .virtual_servers
            .get_mut(&docker0)
            .unwrap()
            .real_servers
            .get_mut(&busy)
            .unwrap()
            .active_connections = 0;
        let report = syncer.check_drains(&desired).await.unwrap();
        assert_eq!(
            report.ops,
            [
                Op::DeleteRealServer {
                    vs: docker0,
                    rs: busy
                },
                Op::DeleteVirtualServer(docker0)
            ]
        );
        assert!(syncer.drains().is_empty());
        assert_eq!(syncer.dataplane.state, ObservedState::from(&desired));
    }

    #[tokio::test]
    async fn stale_udp_conntrack_entries_are_deleted_and_nothing_else() {
        use crate::dataplane::kernel::conntrack::UdpEntry;
        let udp = |port| VirtualServerKey {
            protocol: Protocol::Udp,
            port,
            ..key(port)
        };
        // UDP 53 has these backends; UDP 54 (untouched below) always has A.
        let with = |backends: &[&str]| {
            let mut d = state(&[]);
            let vs = |b: &[&str]| state(b).virtual_servers[&key(80)].clone();
            d.virtual_servers = [(udp(53), vs(backends)), (udp(54), vs(&["10.244.1.5:53"]))].into();
            d
        };
        let entry = |client: &str, reply: &str| UdpEntry {
            client: client.parse().unwrap(),
            destination: "10.96.0.10:53".parse().unwrap(),
            reply_source: reply.parse().unwrap(),
        };
        let on_a = entry("10.244.3.3:40000", "10.244.1.5:53");
        let on_b = entry("10.244.3.3:40001", "10.244.2.6:53");
        let foreign = UdpEntry {
            destination: "10.0.0.10:53".parse().unwrap(),
            ..on_a
        };
        // To UDP 54 but from B, which it never had (made before the Service existed).
        let untouched = UdpEntry {
            destination: "10.96.0.10:54".parse().unwrap(),
            ..on_b
        };
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.dataplane.conntrack = [on_a, on_b, foreign].into();
        // A (re)start clears nothing that still points at a wanted real server.
        let both = with(&["10.244.1.5:53", "10.244.2.6:53"]);
        assert_eq!(syncer.sync(&both).await.unwrap().conntrack.deleted, 0);
        assert_eq!(syncer.dataplane.conntrack.len(), 3);
        syncer.dataplane.conntrack.insert(untouched);
        // A's pod is replaced: its entry goes in the same sync, B's flow stays, and the sync
        // looks at UDP 53's entries only (UDP 54's stale one waits for the next full sync).
        let only_b = with(&["10.244.2.6:53"]);
        let touched = Scope {
            virtual_servers: [udp(53)].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&only_b, &touched).await.unwrap();
        assert_eq!(
            report.conntrack,
            CleanupReport {
                deleted: 1,
                failed: 0
            }
        );
        assert_eq!(
            syncer.dataplane.conntrack,
            [on_b, foreign, untouched].into()
        );
        // The Service goes away: every entry to its virtual server goes, nothing else.
        let mut gone = only_b.clone();
        gone.virtual_servers.remove(&udp(53));
        let report = syncer.sync_touched(&gone, &touched).await.unwrap();
        assert_eq!(report.conntrack.deleted, 1);
        assert_eq!(syncer.dataplane.conntrack, [foreign, untouched].into());
        // A sync that changes no UDP real server lists nothing; a full sync lists everything.
        let report = syncer.sync_touched(&gone, &touched).await.unwrap();
        assert_eq!(report.conntrack, CleanupReport::default());
        assert_eq!(syncer.sync(&gone).await.unwrap().conntrack.deleted, 1);
        assert_eq!(syncer.dataplane.conntrack, [foreign].into());
    }

    /// A connection opened after the cache was taken still makes the incremental sync drain
    /// the real server, not delete it.
    #[tokio::test]
    async fn incremental_removal_drains_a_real_server_whose_connections_came_after_the_cache() {
        let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let one = state(&["10.244.1.3:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&both).await.unwrap();
        set_connections(&mut syncer, "10.244.1.2:8080", 1);
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&one, &touched).await.unwrap();
        assert_eq!(
            report.ops,
            [Op::UpdateRealServer {
                vs: key(80),
                rs: "10.244.1.2:8080".parse().unwrap(),
                weight: 0
            }]
        );
        assert_eq!(syncer.drains().len(), 1);
    }

    #[tokio::test]
    async fn drained_real_server_wanted_again_returns_without_delete() {
        let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let one = state(&["10.244.1.3:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&both).await.unwrap();
        set_connections(&mut syncer, "10.244.1.2:8080", 1);
        syncer.sync(&one).await.unwrap();
        let report = syncer.sync(&both).await.unwrap();
        assert_eq!(
            report.ops,
            [Op::UpdateRealServer {
                vs: key(80),
                rs: "10.244.1.2:8080".parse().unwrap(),
                weight: 1
            }]
        );
        assert!(syncer.drains().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_op_leaves_only_its_entry_in_doubt_and_is_retried_with_backoff() {
        let mut desired = state(&["10.244.1.2:8080"]);
        let mut bad = desired.virtual_servers[&key(80)].clone();
        bad.spec.scheduler = "twos".into();
        desired.virtual_servers.insert(key(81), bad);
        let fake = FakeDataplane {
            missing_schedulers: ["twos".to_string()].into(),
            ..Default::default()
        };
        let mut syncer = Syncer::new(fake, Ownership::default(), DRAIN);
        let report = syncer.sync(&desired).await.unwrap();
        assert_eq!(report.failures.len(), 2, "{:?}", report.failures);
        let in_doubt: Vec<Entry> = syncer.in_doubt().copied().collect();
        assert_eq!(in_doubt, [Entry::VirtualServer(key(81))]);
        let first_retry = syncer.next_retry().unwrap();
        assert_eq!(first_retry, Instant::now() + RETRY_FIRST);

        // Another virtual server changes: incremental, without observing the kernel again, and
        // the entry in doubt is left out until due (even when the change names it).
        let vs = desired.virtual_servers.get_mut(&key(80)).unwrap();
        let added = ("10.244.1.3:8080".parse().unwrap(), 1);
        vs.real_servers = vs
            .real_servers
            .iter()
            .map(|(a, &w)| (a, w))
            .chain([added])
            .collect();
        let touched = Scope {
            virtual_servers: [key(80), key(81)].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&desired, &touched).await.unwrap();
        assert!(matches!(report.ops[..], [Op::AddRealServer { vs, .. }] if vs == key(80)));
        assert!(report.failures.is_empty());
        assert_eq!(syncer.dataplane().full_observes, 1);

        // Due: retried alone (and fails again: the delay doubles).
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer
            .sync_touched(&desired, &Scope::default())
            .await
            .unwrap();
        assert!(matches!(report.ops[0], Op::AddVirtualServer(k, _) if k == key(81)));
        assert_eq!(report.failures.len(), 2);
        assert_eq!(syncer.next_retry(), Some(Instant::now() + 2 * RETRY_FIRST));
        // Not due: nothing to do.
        let report = syncer
            .sync_touched(&desired, &Scope::default())
            .await
            .unwrap();
        assert!(report.ops.is_empty());

        // The module is loaded: the next retry succeeds and nothing is in doubt any more.
        syncer.dataplane_mut().missing_schedulers.clear();
        tokio::time::advance(2 * RETRY_FIRST).await;
        let report = syncer
            .sync_touched(&desired, &Scope::default())
            .await
            .unwrap();
        assert!(report.failures.is_empty());
        assert_eq!(syncer.in_doubt().count(), 0);
        assert_eq!(syncer.next_retry(), None);
        assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
        assert_eq!(syncer.dataplane().full_observes, 1);
    }

    /// A virtual server whose deletion fails keeps its own set elements (kipvs's record of
    /// owning it, and its firewall) until a retry has deleted it: an externalIP on another
    /// interface is owned by its element alone, and would otherwise be orphaned.
    #[tokio::test(start_paused = true)]
    async fn a_failed_deletion_keeps_the_virtual_servers_elements_until_it_is_gone() {
        let external = VirtualServerKey {
            address: "192.168.0.99".parse().unwrap(),
            port: 443,
            protocol: Protocol::Tcp,
        };
        let mut desired = state(&["10.244.1.2:8080"]);
        let vs = desired.virtual_servers[&key(80)].clone();
        desired.virtual_servers.insert(external, vs);
        let elements = [
            SetElement::External(external),
            SetElement::Firewall(external),
        ];
        desired.set_elements.extend(elements);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        assert!(syncer.sync(&desired).await.unwrap().failures.is_empty());

        // The Service goes; the kernel's answer to the deletion is lost.
        let mut gone = desired.clone();
        gone.virtual_servers.remove(&external);
        gone.set_elements
            .retain(|e| e.virtual_server() != Some(external));
        let delete = Op::DeleteVirtualServer(external);
        syncer.dataplane_mut().lost_answers.push(delete.clone());
        let touched = Scope {
            virtual_servers: [external].into(),
            set_elements: elements.into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&gone, &touched).await.unwrap();
        let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
        assert_eq!(failed[0], &delete);
        assert_eq!(failed.len(), 3, "{failed:?}");
        let kernel = &syncer.dataplane().state.set_elements;
        assert!(
            elements.iter().all(|e| kernel.contains(e)),
            "the record stays"
        );

        // The retry finds it gone and deletes the elements.
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer.sync_touched(&gone, &Scope::default()).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(syncer.dataplane().state, ObservedState::from(&gone));
    }

    /// One Service's set element the kernel refuses (a `firewall-allow` interval inside another)
    /// fails that Service alone: the other Service's elements and virtual servers land in the
    /// same sync, and the refused Service's load-balancer virtual server is not added (fail
    /// closed) until its elements are in; it is retried, and lands once the conflict is gone.
    #[tokio::test(start_paused = true)]
    async fn a_refused_set_element_fails_its_own_service_only_and_closed() {
        let mut desired = state(&["10.244.1.2:8080"]);
        let lb = VirtualServerKey {
            address: "10.0.5.100".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let mut onprem = desired.virtual_servers[&key(80)].clone();
        onprem.service = "ns1/onprem:http".into();
        desired.virtual_servers.insert(lb, onprem.clone());
        let inner = SetElement::FirewallAllow(lb, "10.0.5.100/32".parse().unwrap());
        desired.set_elements.extend([
            SetElement::ClusterIp(key(80)),
            SetElement::External(lb),
            SetElement::Firewall(lb),
            SetElement::FirewallAllow(lb, "10.0.0.0/8".parse().unwrap()),
            inner,
        ]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        let report = syncer.sync(&desired).await.unwrap();
        let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
        let rs = "10.244.1.2:8080".parse().unwrap();
        assert_eq!(
            failed,
            [
                &Op::AddSetElement(inner),
                &Op::AddVirtualServer(lb, onprem.spec.clone()),
                &Op::AddRealServer {
                    vs: lb,
                    rs,
                    weight: 1
                },
            ]
        );
        let kernel = &syncer.dataplane().state;
        assert!(
            kernel.virtual_servers.contains_key(&key(80)),
            "the other Service landed"
        );
        assert!(
            !kernel.virtual_servers.contains_key(&lb),
            "no open load-balancer IP"
        );
        let mut landed = desired.set_elements.clone();
        landed.remove(&inner);
        assert_eq!(kernel.set_elements, landed);

        // The conflict is gone: the retry adds the virtual server.
        desired.set_elements.remove(&inner);
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer
            .sync_touched(&desired, &Scope::default())
            .await
            .unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
        assert_eq!(syncer.in_doubt().count(), 0);
    }

    /// An existing virtual server whose Service gains `loadBalancerSourceRanges` while the
    /// kernel refuses its new `firewall` element would stay open to every source: it is
    /// deleted in the same sync (fail closed) while the other Service's changes land, put in
    /// doubt, kept out while the element keeps failing, and added again once it is in.
    #[tokio::test(start_paused = true)]
    async fn an_existing_virtual_server_whose_new_firewall_element_fails_is_deleted_until_it_is_in()
    {
        let lb = VirtualServerKey {
            address: "203.0.113.40".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let mut open = state(&["10.244.1.2:8080"]);
        let mut vs = open.virtual_servers[&key(80)].clone();
        vs.service = "ns1/lb:http".into();
        open.virtual_servers.insert(lb, vs.clone());
        open.bind_addresses.insert(lb.address);
        open.set_elements.insert(SetElement::External(lb));
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        assert!(syncer.sync(&open).await.unwrap().failures.is_empty());

        // The Service gains a source range and another Service a real server; the kernel
        // refuses the firewall element.
        let firewall = SetElement::Firewall(lb);
        let mut ranged = open.clone();
        ranged.set_elements.extend([
            firewall,
            SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap()),
        ]);
        let other = "10.244.1.3:8080".parse().unwrap();
        let grown =
            state(&["10.244.1.2:8080", "10.244.1.3:8080"]).virtual_servers[&key(80)].clone();
        ranged.virtual_servers.insert(key(80), grown);
        syncer.dataplane_mut().refusing = vec![Op::AddSetElement(firewall)];
        let touched = Scope {
            virtual_servers: [key(80), lb].into(),
            set_elements: ranged.set_elements.clone(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&ranged, &touched).await.unwrap();
        let failed: Vec<&Op> = report.failures.iter().map(|f| &f.op).collect();
        assert_eq!(failed, [&Op::AddSetElement(firewall)]);
        assert_eq!(report.ops.last(), Some(&Op::DeleteVirtualServer(lb)));
        let kernel = &syncer.dataplane().state;
        assert!(!kernel.virtual_servers.contains_key(&lb), "closed");
        assert!(
            kernel.virtual_servers[&key(80)]
                .real_servers
                .contains_key(&other),
            "the other Service's change landed"
        );
        assert!(syncer.in_doubt().any(|e| *e == Entry::VirtualServer(lb)));

        // Still refused at the retry: the virtual server is new now, and kept out.
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer
            .sync_touched(&ranged, &Scope::default())
            .await
            .unwrap();
        let failed: Vec<&str> = report.failures.iter().map(|f| f.op.name()).collect();
        assert_eq!(
            failed,
            ["AddSetElement", "AddVirtualServer", "AddRealServer"]
        );
        assert!(!syncer.dataplane().state.virtual_servers.contains_key(&lb));

        // The kernel takes the element: the virtual server is back, behind it.
        syncer.dataplane_mut().refusing.clear();
        tokio::time::advance(RETRY_FIRST * 2).await;
        let report = syncer
            .sync_touched(&ranged, &Scope::default())
            .await
            .unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(syncer.dataplane().state, ObservedState::from(&ranged));
        assert_eq!(syncer.in_doubt().count(), 0);
    }

    /// `firewall-allow` intervals are created (`NLM_F_EXCL`): the kernel refuses one that is
    /// exactly present. When the cache is out of step with the kernel (the element is there,
    /// the cache says not), that refusal counts as applied: no failure, nothing held back.
    #[tokio::test]
    async fn a_firewall_allow_element_already_in_the_kernel_is_applied_not_refused() {
        let lb = VirtualServerKey {
            address: "203.0.113.40".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let mut desired = state(&["10.244.1.2:8080"]);
        let mut vs = desired.virtual_servers[&key(80)].clone();
        vs.service = "ns1/lb:http".into();
        desired.virtual_servers.insert(lb, vs);
        let allow = SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap());
        desired
            .set_elements
            .extend([SetElement::Firewall(lb), allow]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&state(&["10.244.1.2:8080"])).await.unwrap();
        // Written behind the cache's back (as by an `nft` killed after the kernel committed).
        syncer.dataplane_mut().state.set_elements.insert(allow);
        let touched = Scope {
            virtual_servers: [lb].into(),
            set_elements: desired.set_elements.clone(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&desired, &touched).await.unwrap();
        assert!(report.ops.contains(&Op::AddSetElement(allow)));
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(syncer.dataplane().state, ObservedState::from(&desired));
        assert_eq!(syncer.in_doubt().count(), 0);
        // And the overlap check is still there: a nested range is refused.
        let nested = SetElement::FirewallAllow(lb, "192.168.100.0/25".parse().unwrap());
        let failures = syncer
            .dataplane_mut()
            .apply(&[Op::AddSetElement(nested)])
            .await;
        assert_eq!(failures.len(), 1);
    }

    /// A new endpoint of an existing virtual server takes traffic before the main nftables
    /// transaction (an `nft` run takes seconds in the end to end's VM), right after its own
    /// hairpin element (an element-only transaction of its own); the old endpoint's real server
    /// goes before its element. Real servers of a virtual server whose own masquerade element
    /// changes wait for it.
    #[tokio::test]
    async fn endpoint_changes_reach_ipvs_before_the_nftables_transaction() {
        let with = |backends: &[&str], elements: &[SetElement]| DesiredState {
            set_elements: elements.iter().copied().collect(),
            ..state(backends)
        };
        let hairpin = |ip: &str| SetElement::Hairpin(ip.parse().unwrap());
        let (a, b) = ("10.244.1.2:8080", "10.244.1.3:8080");
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer
            .sync(&with(&[a], &[hairpin("10.244.1.2")]))
            .await
            .unwrap();
        // A first sync writes the rules: the hairpin element is part of that one transaction,
        // ahead of the new virtual server.
        let names: Vec<&str> = syncer.dataplane.applied.iter().map(Op::name).collect();
        assert_eq!(
            names,
            [
                "WriteRules",
                "AddSetElement",
                "AddVirtualServer",
                "AddRealServer",
                "BindAddress"
            ]
        );
        syncer.dataplane.applied.clear();
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            set_elements: [hairpin("10.244.1.2"), hairpin("10.244.1.3")].into(),
            ..Default::default()
        };
        let replaced = with(&[b], &[hairpin("10.244.1.3")]);
        syncer.sync_touched(&replaced, &touched).await.unwrap();
        let (a, b) = (a.parse().unwrap(), b.parse().unwrap());
        assert_eq!(
            syncer.dataplane.applied,
            [
                Op::DeleteRealServer { vs: key(80), rs: a },
                Op::AddSetElement(hairpin("10.244.1.3")),
                Op::AddRealServer {
                    vs: key(80),
                    rs: b,
                    weight: 1
                },
                Op::DeleteSetElement(hairpin("10.244.1.2")),
            ]
        );
        // externalTrafficPolicy Local -> Cluster: the masquerade element first, then the
        // (remote) endpoint that needs it.
        syncer.dataplane.applied.clear();
        let external = SetElement::External(key(80));
        let mut cluster = with(&[b.to_string().as_str(), "10.244.2.9:8080"], &[external]);
        cluster.set_elements.insert(hairpin("10.244.1.3"));
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            set_elements: [external].into(),
            ..Default::default()
        };
        syncer.sync_touched(&cluster, &touched).await.unwrap();
        assert_eq!(
            syncer.dataplane.applied,
            [
                Op::AddSetElement(external),
                Op::AddRealServer {
                    vs: key(80),
                    rs: "10.244.2.9:8080".parse().unwrap(),
                    weight: 1
                },
            ]
        );
        assert_eq!(syncer.dataplane.state, ObservedState::from(&cluster));
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_op_whose_answer_was_lost_is_re_read_before_its_retry() {
        let desired = state(&["10.244.1.2:8080"]);
        let address: IpAddr = "10.96.0.10".parse().unwrap();
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&desired).await.unwrap();
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            addresses: [address].into(),
            ..Default::default()
        };
        // The Service goes: the unbind is applied, but its answer is lost (`ENOBUFS`).
        syncer.dataplane_mut().lost_answers = vec![Op::UnbindAddress(address)];
        let gone = DesiredState::default();
        let report = syncer.sync_touched(&gone, &touched).await.unwrap();
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(!syncer.dataplane().state.bound_addresses.contains(&address));
        // It comes back before the retry is due: the address is left out until then.
        syncer.sync_touched(&desired, &touched).await.unwrap();
        assert!(!syncer.dataplane().state.bound_addresses.contains(&address));
        // Due: the address is re-read (unbound, whatever the failed op left in the cache) and
        // bound again.
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer
            .sync_touched(&desired, &Scope::default())
            .await
            .unwrap();
        assert_eq!(report.ops, [Op::BindAddress(address)]);
        assert!(syncer.dataplane().state.bound_addresses.contains(&address));
        assert_eq!(syncer.in_doubt().count(), 0);
        assert_eq!(syncer.dataplane().full_observes, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_set_element_deletion_whose_answer_was_lost_is_re_read_before_its_retry() {
        let element = SetElement::ServiceIp("10.96.0.10".parse().unwrap());
        let mut desired = state(&["10.244.1.2:8080"]);
        desired.set_elements.insert(element);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&desired).await.unwrap();
        // The element goes: deleted, but the answer is lost.
        syncer.dataplane_mut().lost_answers = vec![Op::DeleteSetElement(element)];
        let mut gone = desired.clone();
        gone.set_elements.remove(&element);
        let touched = Scope {
            set_elements: [element].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&gone, &touched).await.unwrap();
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        // Due: re-read (gone), so nothing is deleted again (a deletion of a missing element
        // fails) and the entry leaves doubt.
        tokio::time::advance(RETRY_FIRST).await;
        let report = syncer.sync_touched(&gone, &Scope::default()).await.unwrap();
        assert!(report.ops.is_empty(), "{:?}", report.ops);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(syncer.in_doubt().count(), 0);
    }

    #[tokio::test]
    async fn drains_are_tracked_by_incremental_syncs_where_they_look() {
        let both = state(&["10.244.1.2:8080", "10.244.1.3:8080"]);
        let one = state(&["10.244.1.3:8080"]);
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.sync(&both).await.unwrap();
        set_connections(&mut syncer, "10.244.1.2:8080", 1);
        // The periodic full sync reads the connection into the cache.
        assert!(syncer.sync(&both).await.unwrap().ops.is_empty());
        let touched = Scope {
            virtual_servers: [key(80)].into(),
            ..Default::default()
        };
        let report = syncer.sync_touched(&one, &touched).await.unwrap();
        assert!(matches!(
            report.ops[..],
            [Op::UpdateRealServer { weight: 0, .. }]
        ));
        assert_eq!(syncer.drains().len(), 1);
        // A sync that does not look at that virtual server keeps its drain.
        syncer.sync_touched(&one, &Scope::default()).await.unwrap();
        assert_eq!(syncer.drains().len(), 1);
        // Wanted again: the drain ends.
        syncer.sync_touched(&both, &touched).await.unwrap();
        assert!(syncer.drains().is_empty());
    }
}

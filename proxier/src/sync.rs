//! Synchronisation: observe the dataplane, [`diff`] against the desired state, apply.
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

use crate::conntrack::{self, CleanupReport};
use crate::dataplane::{
    Dataplane, DataplaneError, Op, OpFailure, Ownership, Scope, diff_scoped, draining, full_scope,
};
use crate::model::{DesiredState, ObservedState, Protocol, VirtualServerKey};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// The outcome of one sync.
#[derive(Debug)]
pub struct SyncReport {
    /// The operations that were attempted, in order.
    pub ops: Vec<Op>,
    /// Those that failed.
    pub failures: Vec<OpFailure>,
    /// Wall time of observe + diff + apply + conntrack cleanup.
    pub duration: Duration,
    /// What the UDP conntrack cleanup did ([`crate::conntrack`]); zero when it did not run.
    pub conntrack: CleanupReport,
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
    /// the first full sync and after a failed op (the next sync then re-observes).
    cache: Option<ObservedState>,
    /// Draining real servers and when they started draining (in this process).
    drains: BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
    /// UDP virtual servers deleted since the last successful conntrack cleanup: their entries
    /// are stale whatever their real server.
    removed_udp: BTreeSet<VirtualServerKey>,
}

impl<D: Dataplane> Syncer<D> {
    /// A syncer over `dataplane`; removed TCP real servers drain for at most `max_drain`.
    pub fn new(dataplane: D, ownership: Ownership, max_drain: Duration) -> Self {
        Syncer {
            dataplane,
            ownership,
            max_drain,
            cache: None,
            drains: BTreeMap::new(),
            removed_udp: BTreeSet::new(),
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
        &self.drains
    }

    /// Full sync: observe everything, diff everything, apply.
    ///
    /// Errors: only when the dataplane cannot be observed (nothing is changed then); failed
    /// ops are reported in [`SyncReport::failures`] and retried by the next sync.
    pub async fn sync(&mut self, desired: &DesiredState) -> Result<SyncReport, DataplaneError> {
        let start = Instant::now();
        let observed = self.dataplane.observe().await?;
        let scope = full_scope(desired, &observed);
        let expired = self.expired(start);
        let ops = diff_scoped(desired, &observed, &self.ownership, &scope, &expired);
        self.cache = Some(observed);
        self.apply(desired, ops, start, "full").await
    }

    /// Incremental sync of what `touched` names, against the cached kernel state; a full
    /// [`sync`](Self::sync) when there is no cache yet.
    pub async fn sync_touched(
        &mut self,
        desired: &DesiredState,
        touched: &Scope,
    ) -> Result<SyncReport, DataplaneError> {
        let Some(cache) = &self.cache else {
            return self.sync(desired).await;
        };
        let start = Instant::now();
        let expired = self.expired(start);
        let ops = diff_scoped(desired, cache, &self.ownership, touched, &expired);
        self.apply(desired, ops, start, "incremental").await
    }

    /// Re-read the virtual servers holding draining real servers and delete those whose
    /// connections ended or whose drain exceeded [`max_drain`](Self::max_drain). A no-op
    /// when nothing drains.
    pub async fn check_drains(
        &mut self,
        desired: &DesiredState,
    ) -> Result<SyncReport, DataplaneError> {
        let start = Instant::now();
        let keys: BTreeSet<VirtualServerKey> = self.drains.keys().map(|(k, _)| *k).collect();
        if keys.is_empty() || self.cache.is_none() {
            return Ok(SyncReport {
                ops: vec![],
                failures: vec![],
                duration: start.elapsed(),
                conntrack: CleanupReport::default(),
            });
        }
        let list: Vec<VirtualServerKey> = keys.iter().copied().collect();
        let fresh = self.dataplane.observe_virtual_servers(&list).await?;
        let cache = self.cache.as_mut().expect("checked");
        for key in &list {
            match fresh.get(key) {
                Some(vs) => cache.virtual_servers.insert(*key, vs.clone()),
                None => cache.virtual_servers.remove(key),
            };
        }
        let expired = self.expired(start);
        let cache = self.cache.as_ref().expect("checked");
        let scope = Scope {
            virtual_servers: keys,
            ..Scope::default()
        };
        let ops = diff_scoped(desired, cache, &self.ownership, &scope, &expired);
        self.apply(desired, ops, start, "drain check").await
    }

    /// Draining real servers past their maximum drain time at `now`.
    fn expired(&self, now: Instant) -> BTreeSet<(VirtualServerKey, SocketAddr)> {
        self.drains
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= self.max_drain)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Apply `ops`, fold the successful ones into the cache, track drains, log.
    async fn apply(
        &mut self,
        desired: &DesiredState,
        ops: Vec<Op>,
        start: Instant,
        kind: &str,
    ) -> Result<SyncReport, DataplaneError> {
        for op in &ops {
            tracing::info!("{op}");
        }
        let failures = if ops.is_empty() {
            Vec::new()
        } else {
            self.dataplane.apply(&ops).await
        };
        for f in &failures {
            tracing::warn!(error = %f.error, "failed {}", f.op);
        }
        if failures.is_empty() {
            if let Some(cache) = &mut self.cache {
                for op in &ops {
                    if let Err(e) = cache.apply(op) {
                        tracing::debug!("cache out of step ({e}) after {op}; will re-observe");
                        self.cache = None;
                        break;
                    }
                }
            }
        } else {
            self.cache = None;
        }
        if let Some(cache) = &self.cache {
            let now: BTreeSet<_> = draining(desired, cache).collect();
            self.drains.retain(|k, _| now.contains(k));
            for k in now {
                self.drains.entry(k).or_insert(start);
            }
        }
        let conntrack = self
            .clean_conntrack(desired, &ops, &failures, kind == "full")
            .await;
        let duration = start.elapsed();
        tracing::info!(
            kind,
            ops = ops.len(),
            failed = failures.len(),
            draining = self.drains.len(),
            duration_us = duration.as_micros() as u64,
            "sync complete ops={} failed={}",
            ops.len(),
            failures.len()
        );
        Ok(SyncReport {
            ops,
            failures,
            duration,
            conntrack,
        })
    }

    /// Delete the stale UDP conntrack entries ([`conntrack::stale`]) after a full sync, after
    /// a sync that added or deleted a UDP real server or deleted a UDP virtual server (a
    /// Service back from zero endpoints gets no entry made while it had none), and after one
    /// whose cleanup failed; a no-op otherwise. Failures are logged and counted, never fail the sync.
    async fn clean_conntrack(
        &mut self,
        desired: &DesiredState,
        ops: &[Op],
        failures: &[OpFailure],
        full: bool,
    ) -> CleanupReport {
        let mut udp_changed = false;
        for op in ops
            .iter()
            .filter(|op| !failures.iter().any(|f| &f.op == *op))
        {
            match op {
                Op::DeleteVirtualServer(vs) if vs.protocol == Protocol::Udp => {
                    self.removed_udp.insert(*vs);
                    udp_changed = true;
                }
                Op::DeleteRealServer { vs, .. } | Op::AddRealServer { vs, .. }
                    if vs.protocol == Protocol::Udp =>
                {
                    udp_changed = true;
                }
                _ => {}
            }
        }
        if !full && !udp_changed && self.removed_udp.is_empty() {
            return CleanupReport::default();
        }
        let entries = match self.dataplane.udp_conntrack().await {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(%error, "cannot list UDP conntrack entries; retried next sync");
                return CleanupReport {
                    deleted: 0,
                    failed: 1,
                };
            }
        };
        let stale = conntrack::stale(&entries, desired, &self.removed_udp);
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
            self.removed_udp.clear();
        }
        CleanupReport {
            deleted: stale.len() - failed.len(),
            failed: failed.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fake::FakeDataplane;
    use crate::model::{Protocol, VirtualServer, VirtualServerSpec};

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

    #[tokio::test]
    async fn stale_udp_conntrack_entries_are_deleted_and_nothing_else() {
        use crate::conntrack::UdpEntry;
        let udp = VirtualServerKey {
            protocol: Protocol::Udp,
            port: 53,
            ..key(53)
        };
        let with = |backends: &[&str]| {
            let mut d = state(&[]);
            d.virtual_servers = [(udp, state(backends).virtual_servers[&key(80)].clone())].into();
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
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default(), DRAIN);
        syncer.dataplane.conntrack = [on_a, on_b, foreign].into();
        // A (re)start clears nothing that still points at a wanted real server.
        let both = with(&["10.244.1.5:53", "10.244.2.6:53"]);
        assert_eq!(syncer.sync(&both).await.unwrap().conntrack.deleted, 0);
        assert_eq!(syncer.dataplane.conntrack.len(), 3);
        // A's pod is replaced: its entry goes in the same sync, B's flow stays.
        let only_b = with(&["10.244.2.6:53"]);
        let touched = Scope {
            virtual_servers: [udp].into(),
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
        assert_eq!(syncer.dataplane.conntrack, [on_b, foreign].into());
        // The Service goes away: every entry to its virtual server goes, nothing else.
        let report = syncer.sync_touched(&state(&[]), &touched).await.unwrap();
        assert_eq!(report.conntrack.deleted, 1);
        assert_eq!(syncer.dataplane.conntrack, [foreign].into());
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
}

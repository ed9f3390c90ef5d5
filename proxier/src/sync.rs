//! Synchronisation: observe the dataplane, [`diff`] against the desired state, apply.
//!
//! Three kinds of sync, so that cost follows change:
//! - [`Syncer::sync`] (start, periodic resync): observe the whole kernel table, diff it all.
//! - [`Syncer::sync_touched`] (a Service or its endpoints changed): diff only the virtual
//!   servers and addresses the change touched, against a cache of the kernel's state that is
//!   kept up to date with every applied op. One endpoint change costs a handful of netlink
//!   messages whatever the size of the table. A touched virtual server that loses a real
//!   server is re-read first: whether that real server drains or goes depends on its
//!   connections, which the cache only knows as of its last observation.
//! - [`Syncer::check_drains`] (while real servers drain): re-read only the virtual servers
//!   holding draining real servers, and delete those whose connections ended or whose
//!   maximum drain time passed.

use crate::dataplane::{
    Dataplane, DataplaneError, Op, OpFailure, Ownership, Scope, diff_scoped, draining, full_scope,
};
use crate::model::{DesiredState, ObservedState, VirtualServerKey};

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
    /// Wall time of observe + diff + apply.
    pub duration: Duration,
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
        let losing: Vec<VirtualServerKey> = touched
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
        self.refresh(&losing).await?;
        let cache = self.cache.as_ref().expect("checked");
        let expired = self.expired(start);
        let ops = diff_scoped(desired, cache, &self.ownership, touched, &expired);
        self.apply(desired, ops, start, "incremental").await
    }

    /// Re-read `keys` from the dataplane into the cache (which must exist).
    async fn refresh(&mut self, keys: &[VirtualServerKey]) -> Result<(), DataplaneError> {
        if keys.is_empty() {
            return Ok(());
        }
        let fresh = self.dataplane.observe_virtual_servers(keys).await?;
        let cache = self.cache.as_mut().expect("refresh needs the cache");
        for key in keys {
            match fresh.get(key) {
                Some(vs) => cache.virtual_servers.insert(*key, vs.clone()),
                None => cache.virtual_servers.remove(key),
            };
        }
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
        let keys: BTreeSet<VirtualServerKey> = self.drains.keys().map(|(k, _)| *k).collect();
        if keys.is_empty() || self.cache.is_none() {
            return Ok(SyncReport {
                ops: vec![],
                failures: vec![],
                duration: start.elapsed(),
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
        })
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

    /// Found by the end to end (hack/test-e2e.sh): a connection opened after the cache was
    /// taken must still make the incremental sync drain the real server, not delete it.
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
}

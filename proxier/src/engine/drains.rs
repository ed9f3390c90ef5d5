//! Graceful termination, as a unit of its own (kube-proxy's `graceful_termination.go`): which
//! real servers drain, since when, and which have drained past `ipvs.drainTimeout`.
//!
//! The diff decides per removed real server ([`diff_scoped`](crate::dataplane::diff::diff_scoped): a TCP one with connections goes
//! to weight 0, anything else is deleted); [`Drains`] remembers when each started draining, so
//! that [`Syncer::check_drains`](super::syncer::Syncer::check_drains) re-reads only their virtual
//! servers and deletes them once idle or expired.

use crate::dataplane::ascending_get;
use crate::dataplane::diff::Ownership;
use crate::model::{DesiredState, ObservedState, VirtualServerKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use tokio::time::{Duration, Instant};

/// A draining real server: its virtual server and address.
pub type Drain = (VirtualServerKey, SocketAddr);

/// The draining real servers and when each started draining (in this process).
#[derive(Debug, Default)]
pub struct Drains(BTreeMap<Drain, Instant>);

impl Drains {
    /// Every draining real server and when it started draining.
    pub fn since(&self) -> &BTreeMap<Drain, Instant> {
        &self.0
    }

    /// How many real servers drain.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none drains.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The virtual servers holding draining real servers.
    pub fn virtual_servers(&self) -> BTreeSet<VirtualServerKey> {
        self.0.keys().map(|(key, _)| *key).collect()
    }

    /// The real servers that have drained for `max` or longer at `now`: deleted even with
    /// connections left.
    pub fn expired(&self, now: Instant, max: Duration) -> BTreeSet<Drain> {
        self.0
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= max)
            .map(|(drain, _)| *drain)
            .collect()
    }

    /// Updates the drains of the virtual servers `keys` (those a sync looked at; all of them in a
    /// full sync) from the kernel's state `observed` after the sync: new ones start at `now`,
    /// those that ended are forgotten, the others keep their start. `ownership` says which
    /// virtual servers that are not desired drain as a whole ([`Ownership::drains`]).
    pub fn track(
        &mut self,
        desired: &DesiredState,
        observed: &ObservedState,
        ownership: &Ownership,
        keys: &BTreeSet<VirtualServerKey>,
        now: Instant,
    ) {
        let draining: BTreeSet<Drain> = draining(desired, observed, ownership, keys).collect();
        self.0
            .retain(|drain, _| !keys.contains(&drain.0) || draining.contains(drain));
        for drain in draining {
            self.0.entry(drain).or_insert(now);
        }
    }
}

/// Real servers of the virtual servers `keys` that are draining in `observed`: present at
/// weight 0 in a desired virtual server that no longer wants them, or in a virtual server that
/// is not desired and drains as a whole ([`Ownership::drains`]). Cost: O(`keys` · log n +
/// their real servers), so a sync looks only at the virtual servers it touched; O(n) for a full
/// sync (the states are walked alongside `keys`, as [`diff_scoped`](crate::dataplane::diff::diff_scoped) does).
fn draining<'a>(
    desired: &'a DesiredState,
    observed: &'a ObservedState,
    ownership: &'a Ownership,
    keys: &'a BTreeSet<VirtualServerKey>,
) -> impl Iterator<Item = (VirtualServerKey, SocketAddr)> + 'a {
    let mut wanted = ascending_get(&desired.virtual_servers, keys.len());
    let mut present = ascending_get(&observed.virtual_servers, keys.len());
    keys.iter().flat_map(move |key| {
        let dvs = wanted(key);
        let ovs = present(key).into_iter();
        ovs.flat_map(move |ovs| {
            ovs.real_servers
                .iter()
                .filter(move |(rs, o)| {
                    o.weight == 0
                        && dvs.map_or_else(
                            || ownership.drains(key),
                            |d| !d.real_servers.contains_key(rs),
                        )
                })
                .map(move |(rs, _)| (*key, *rs))
        })
    })
}

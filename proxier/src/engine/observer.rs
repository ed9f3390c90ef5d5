//! What the engine tells the rest of the proxier: [`Observer`]s hear of every sync and
//! configuration change (and, as [`StoreObserver`]s, of every store write).

use super::syncer::SyncReport;
use crate::dataplane::DataplaneError;
use crate::model::{DesiredState, VirtualServerKey};
use crate::plan::NoLocalEndpoints;
use crate::source::StoreObserver;
use crate::source::store::Store;
use kipvs_crds::config::ProxierConfiguration;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::time::Instant;

/// Told what the engine syncs, and (as a [`StoreObserver`]) what sources write: the health
/// servers and the metrics implement it ([`crate::serve`]). Every method defaults to nothing.
pub trait Observer: StoreObserver {
    /// The engine finished a sync (successful or not).
    fn sync_finished(&self, _outcome: &SyncOutcome<'_>) {}
    /// The configuration in force: the one the engine starts with, told when the observer is
    /// attached ([`super::Engine::observed_by`]), then each new one it puts in force (a
    /// NodeProxyConfig revision applied live, see [`crate::source::node_config`]); the next
    /// sync is the first with it.
    fn config_changed(&self, _config: &ProxierConfiguration) {}
    /// The configuration put in force left out these settings (paths such as
    /// `ipvs.newSetting`): a newer kipvs wrote them and this version does not know them.
    fn config_ignored(&self, _settings: &[String]) {}
    /// A step of a takeover from kube-proxy ([`super::takeover`]).
    fn takeover(&self, _event: &TakeoverEvent) {}
}

/// A step of a takeover from kube-proxy ([`super::takeover`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeoverEvent {
    /// kipvs writes nothing (why: kube-proxy runs, the node's `serviceProxy` is `kube-proxy`,
    /// the switch is refused).
    Standby(String),
    /// kube-proxy came back on a node kipvs programmed (why the proxier thinks so): kipvs
    /// stopped writing, and stands by until kube-proxy has stopped again.
    KubeProxyBack(String),
    /// kube-proxy does not run (any more) and the node's `serviceProxy` is `kipvs`: the
    /// proxier programs.
    Programming,
    /// kube-proxy's iptables rules, chains and ipsets were removed (how many of each).
    Removed {
        /// Rules deleted from chains that stay (jumps, kube-proxy's rules in kubelet's chains).
        rules: usize,
        /// Chains flushed and deleted.
        chains: usize,
        /// ipsets destroyed.
        sets: usize,
    },
    /// Removing them failed (why); retried after the next full sync.
    RemovalFailed(String),
}

impl StoreObserver for Vec<Arc<dyn Observer>> {
    fn store_updated(&self, store: &Store) {
        for o in self {
            o.store_updated(store);
        }
    }

    fn resource_unavailable(&self, resource: &'static str, unavailable: bool) {
        for o in self {
            o.resource_unavailable(resource, unavailable);
        }
    }

    fn invalid_manifests(&self, files: usize) {
        for o in self {
            o.invalid_manifests(files);
        }
    }
}

impl Observer for Vec<Arc<dyn Observer>> {
    fn sync_finished(&self, outcome: &SyncOutcome<'_>) {
        for o in self {
            o.sync_finished(outcome);
        }
    }

    fn config_changed(&self, config: &ProxierConfiguration) {
        for o in self {
            o.config_changed(config);
        }
    }

    fn config_ignored(&self, settings: &[String]) {
        for o in self {
            o.config_ignored(settings);
        }
    }

    fn takeover(&self, event: &TakeoverEvent) {
        for o in self {
            o.takeover(event);
        }
    }
}

/// What one [`Engine::sync`](super::Engine::sync) did, for [`Observer`]s.
pub struct SyncOutcome<'a> {
    /// The sync's result (`Err`: the dataplane could not be observed; nothing was changed).
    pub result: &'a Result<SyncReport, DataplaneError>,
    /// Whether it was a full sync: it observed the whole kernel and diffed every Service
    /// (at start, every `ipvs.syncPeriod`, at a switch), its duration from the start of that
    /// observation ([`super::syncer::SyncKind::Full`]).
    pub full: bool,
    /// The desired state synced towards.
    pub desired: &'a DesiredState,
    /// Real servers in `desired` (kept by the planner's index, not counted per sync).
    pub real_servers: usize,
    /// The health-check node ports whose entry in `desired` may have changed since the last
    /// sync (`None`: a full sync, after which every port is looked at again).
    pub health_check_changes: Option<&'a BTreeSet<u16>>,
    /// Services with a Local traffic policy and no local endpoint, by policy.
    pub no_local_endpoints: NoLocalEndpoints,
    /// Services served by the KEP-1669 fallback to serving+terminating endpoints.
    pub terminating_fallback_services: usize,
    /// Draining real servers and since when.
    pub drains: &'a BTreeMap<(VirtualServerKey, SocketAddr), Instant>,
    /// IPVS schedulers of `kipvs.io/scheduler` annotations this node's kernel lacks (probed;
    /// the Services annotated with them run with `ipvs.scheduler`).
    pub unavailable_schedulers: &'a BTreeSet<String>,
    /// EndpointSlice change trigger times this sync programmed (see
    /// [`Store::take_trigger_times`]).
    pub trigger_times: &'a [SystemTime],
}

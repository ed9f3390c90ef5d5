//! One synchronisation: observe the dataplane, [`diff`] against the desired state, apply.

use crate::dataplane::{Dataplane, DataplaneError, Op, OpFailure, Ownership, diff};
use crate::model::DesiredState;
use std::time::{Duration, Instant};

/// The outcome of one [`Syncer::sync`].
#[derive(Debug)]
pub struct SyncReport {
    /// The operations that were attempted, in order.
    pub ops: Vec<Op>,
    /// Those that failed.
    pub failures: Vec<OpFailure>,
    /// Wall time of observe + diff + apply.
    pub duration: Duration,
}

/// Drives a [`Dataplane`] towards desired states. Holds no state of its own between syncs:
/// every sync observes the kernel, so a restart adopts whatever is already programmed.
pub struct Syncer<D> {
    dataplane: D,
    /// Which virtual servers this proxier may delete.
    pub ownership: Ownership,
}

impl<D: Dataplane> Syncer<D> {
    /// A syncer over `dataplane`.
    pub fn new(dataplane: D, ownership: Ownership) -> Self {
        Syncer {
            dataplane,
            ownership,
        }
    }

    /// The dataplane (tests inspect the fake through this).
    pub fn dataplane(&self) -> &D {
        &self.dataplane
    }

    /// Observe, diff and apply. Every op is logged at info level as `op=Name ...`, failures at
    /// warn level; a final `sync complete ops=N failed=M` line summarises.
    ///
    /// Errors: only when the dataplane cannot be observed (nothing is changed then); failed
    /// ops are reported in [`SyncReport::failures`] and retried by the next sync.
    pub async fn sync(&mut self, desired: &DesiredState) -> Result<SyncReport, DataplaneError> {
        let start = Instant::now();
        let observed = self.dataplane.observe().await?;
        let ops = diff(desired, &observed, &self.ownership);
        for op in &ops {
            tracing::info!("{op}");
        }
        let failures = self.dataplane.apply(&ops).await;
        for f in &failures {
            tracing::warn!(error = %f.error, "failed {}", f.op);
        }
        let duration = start.elapsed();
        tracing::info!(
            ops = ops.len(),
            failed = failures.len(),
            virtual_servers = desired.virtual_servers.len(),
            duration_ms = duration.as_millis() as u64,
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
    use crate::model::{
        ObservedState, Protocol, VirtualServer, VirtualServerKey, VirtualServerSpec,
    };

    fn state() -> DesiredState {
        let key = VirtualServerKey {
            address: "10.96.0.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let vs = VirtualServer {
            spec: VirtualServerSpec {
                scheduler: "rr".into(),
                persistence_timeout: None,
                sched_flags: 0,
            },
            real_servers: [("10.244.1.2:8080".parse().unwrap(), 1)].into(),
            service: "default/web:http".into(),
        };
        DesiredState {
            virtual_servers: [(key, vs)].into(),
            bind_addresses: ["10.96.0.10".parse().unwrap()].into(),
            health_check_node_ports: Default::default(),
        }
    }

    #[tokio::test]
    async fn second_sync_is_a_no_op_and_restart_adopts() {
        let desired = state();
        let mut syncer = Syncer::new(FakeDataplane::default(), Ownership::default());
        let first = syncer.sync(&desired).await.unwrap();
        assert_eq!(first.ops.len(), 3);
        assert!(first.failures.is_empty());
        assert!(syncer.sync(&desired).await.unwrap().ops.is_empty());
        // A new process over the same kernel state changes nothing.
        let kernel = syncer.dataplane().state.clone();
        assert_eq!(kernel, ObservedState::from(&desired));
        let mut restarted = Syncer::new(FakeDataplane::new(kernel), Ownership::default());
        assert!(restarted.sync(&desired).await.unwrap().ops.is_empty());
    }
}

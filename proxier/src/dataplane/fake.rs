//! An in-memory [`Dataplane`] with the kernel's error behaviour, for unit tests.

use super::{Dataplane, DataplaneError, Op, OpFailure};
use crate::model::{ObservedState, ObservedVirtualServer, VirtualServerKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// An IPVS table and a `kube-ipvs0` address list held in memory.
///
/// Ops change the state through [`ObservedState::apply`], with the kernel's errors.
#[derive(Clone, Debug, Default)]
pub struct FakeDataplane {
    /// The current table; tests may edit it (e.g. set connection counts).
    pub state: ObservedState,
    /// Every op applied successfully, in order.
    pub applied: Vec<Op>,
    /// Addresses the fake node has on interfaces other than `kube-ipvs0`.
    pub other_addresses: BTreeSet<IpAddr>,
}

impl FakeDataplane {
    /// A fake holding `state`.
    pub fn new(state: ObservedState) -> Self {
        FakeDataplane {
            state,
            ..Default::default()
        }
    }
}

impl Dataplane for FakeDataplane {
    async fn observe(&mut self) -> Result<ObservedState, DataplaneError> {
        Ok(self.state.clone())
    }

    async fn observe_virtual_servers(
        &mut self,
        keys: &[VirtualServerKey],
    ) -> Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, DataplaneError> {
        Ok(keys
            .iter()
            .filter_map(|k| Some((*k, self.state.virtual_servers.get(k)?.clone())))
            .collect())
    }

    async fn other_interface_addresses(&mut self) -> Result<BTreeSet<IpAddr>, DataplaneError> {
        Ok(self.other_addresses.clone())
    }

    async fn apply(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        let mut failures = Vec::new();
        for op in ops {
            match self.state.apply(op) {
                Ok(()) => self.applied.push(op.clone()),
                Err(e) => failures.push(OpFailure {
                    op: op.clone(),
                    error: e.into(),
                }),
            }
        }
        failures
    }
}

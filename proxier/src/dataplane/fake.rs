//! An in-memory [`Dataplane`] with the kernel's error behaviour, for unit tests.

use super::{Dataplane, DataplaneError, Op, OpFailure};
use crate::model::{ObservedRealServer, ObservedState, ObservedVirtualServer};

/// An IPVS table and a `kube-ipvs0` address list held in memory.
///
/// Errors mirror the kernel's (`ip_vs_ctl.c`): adding an existing virtual or real server is
/// `EEXIST` ([`ipvs::Error::Exists`]); touching a missing virtual server is `ESRCH`
/// ([`ipvs::Error::NoSuchService`]); a missing real server is `ENOENT`
/// ([`ipvs::Error::NotFound`]). Binding a bound address succeeds (kube-proxy treats `EEXIST`
/// as bound), unbinding a missing one too (`ENXIO` is ignored upstream).
#[derive(Clone, Debug, Default)]
pub struct FakeDataplane {
    /// The current table; tests may edit it (e.g. set connection counts).
    pub state: ObservedState,
    /// Every op applied successfully, in order.
    pub applied: Vec<Op>,
}

impl FakeDataplane {
    /// A fake holding `state`.
    pub fn new(state: ObservedState) -> Self {
        FakeDataplane {
            state,
            applied: Vec::new(),
        }
    }

    fn apply_one(&mut self, op: &Op) -> Result<(), ipvs::Error> {
        let vss = &mut self.state.virtual_servers;
        match op {
            Op::UnbindAddress(a) => {
                self.state.bound_addresses.remove(a);
            }
            Op::BindAddress(a) => {
                self.state.bound_addresses.insert(*a);
            }
            Op::DeleteVirtualServer(key) => {
                vss.remove(key).ok_or(ipvs::Error::NoSuchService)?;
            }
            Op::AddVirtualServer(key, spec) => {
                if vss.contains_key(key) {
                    return Err(ipvs::Error::Exists);
                }
                vss.insert(
                    *key,
                    ObservedVirtualServer {
                        spec: spec.clone(),
                        real_servers: Default::default(),
                    },
                );
            }
            Op::UpdateVirtualServer(key, spec) => {
                vss.get_mut(key).ok_or(ipvs::Error::NoSuchService)?.spec = spec.clone();
            }
            Op::DeleteRealServer { vs, rs } => {
                let vs = vss.get_mut(vs).ok_or(ipvs::Error::NoSuchService)?;
                vs.real_servers.remove(rs).ok_or(ipvs::Error::NotFound)?;
            }
            Op::AddRealServer { vs, rs, weight } => {
                let vs = vss.get_mut(vs).ok_or(ipvs::Error::NoSuchService)?;
                if vs.real_servers.contains_key(rs) {
                    return Err(ipvs::Error::Exists);
                }
                let observed = ObservedRealServer {
                    weight: *weight,
                    active_connections: 0,
                    inactive_connections: 0,
                };
                vs.real_servers.insert(*rs, observed);
            }
            Op::UpdateRealServer { vs, rs, weight } => {
                let vs = vss.get_mut(vs).ok_or(ipvs::Error::NoSuchService)?;
                vs.real_servers
                    .get_mut(rs)
                    .ok_or(ipvs::Error::NotFound)?
                    .weight = *weight;
            }
        }
        Ok(())
    }
}

impl Dataplane for FakeDataplane {
    async fn observe(&mut self) -> Result<ObservedState, DataplaneError> {
        Ok(self.state.clone())
    }

    async fn apply(&mut self, ops: &[Op]) -> Vec<OpFailure> {
        let mut failures = Vec::new();
        for op in ops {
            match self.apply_one(op) {
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

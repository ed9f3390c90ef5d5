//! Failures stay with their Service: an nftables op the kernel refuses is found and fails alone
//! (fail small), and a virtual server whose own set elements are not in the kernel is not added
//! (fail closed).
//!
//! An nftables transaction is all or nothing, and one holds the elements of many Services: a
//! single element the kernel refuses (an interval that overlaps another, `EEXIST`) would keep
//! every other Service's elements out of the kernel at every sync. [`Isolation`] splits a refused
//! transaction in halves until the refused ops are alone, within [`ISOLATION_BUDGET`]
//! transactions. [`Withholding`] then keeps back the ops that would let traffic reach a new
//! virtual server whose firewall elements failed (a load-balancer IP without them is open
//! to every source): they fail with [`DataplaneError::Withheld`] and are retried with the element.
//! [`Withholding`] also keeps the set elements of a virtual server whose deletion failed.
//! An existing virtual server whose new `firewall` element failed is found by [`exposed`]: the
//! syncer deletes it until the element is in.
//!
//! `firewall-allow` intervals are added with `create` (`NLM_F_EXCL`), so that every kernel
//! refuses an overlap ([`super::nftables`]); [`applied_anyway`] keeps an element that is exactly in the
//! kernel already from counting as refused.

use super::{DataplaneError, Op, OpFailure};
use crate::model::{SetElement, VirtualServerKey};
use std::borrow::Cow;
use std::collections::BTreeSet;

/// How many transactions an [`Isolation`] may spend on one stage: enough to find two refused ops among
/// a full sync's 270k elements (about `2 · log2(n)` each); past it the remaining parts fail whole
/// (the next syncs retry only what failed, in smaller transactions).
pub const ISOLATION_BUDGET: usize = 64;

/// Applying one nftables stage one transaction at a time: the whole stage first, and when the
/// kernel refuses it, each half of it, recursively, so that only the ops the kernel refuses
/// fail. The caller applies each part [`Isolation::next_part`] gives as one transaction and reports
/// the result with [`Isolation::done`]; [`Isolation::failures`] are the refused ops, each with the
/// error of the transaction that held it alone (or of the part it was in when
/// [`ISOLATION_BUDGET`] ran out). An op never goes twice into a transaction that succeeded, and
/// the parts come in the stage's order.
#[derive(Debug)]
pub struct Isolation<'a> {
    pending: Vec<&'a [Op]>,
    trying: Option<&'a [Op]>,
    spent: usize,
    failures: Vec<OpFailure>,
}

impl<'a> Isolation<'a> {
    /// Isolation of the stage `ops`.
    pub fn new(ops: &'a [Op]) -> Self {
        Isolation {
            pending: vec![ops],
            trying: None,
            spent: 0,
            failures: Vec::new(),
        }
    }

    /// The next part to apply as one transaction; `None` when done.
    pub fn next_part(&mut self) -> Option<&'a [Op]> {
        self.trying = self.pending.pop();
        self.trying
    }

    /// The result of applying the part [`Isolation::next_part`] gave last.
    pub fn done(&mut self, result: Result<(), DataplaneError>) {
        let (Some(part), Err(error)) = (self.trying.take(), result) else {
            self.spent += 1;
            return;
        };
        self.spent += 1;
        // Rules that do not apply leave no set to add to: the stage fails whole, as one.
        let rules = part.iter().any(|op| matches!(op, Op::WriteRules(_)));
        if part.len() == 1 || rules || self.spent + self.pending.len() >= ISOLATION_BUDGET {
            let message = error.to_string();
            self.failures.extend(part.iter().map(|op| OpFailure {
                op: op.clone(),
                error: DataplaneError::NftTransaction(message.clone()),
            }));
        } else {
            let (first, second) = part.split_at(part.len() / 2);
            self.pending.push(second);
            self.pending.push(first);
        }
    }

    /// The ops the kernel refused, in the stage's order.
    pub fn failures(self) -> Vec<OpFailure> {
        self.failures
    }
}

/// Whether `refused` holds an addition of a `firewall-allow` interval: a `create`, which the
/// kernel also refuses when the element is exactly present. The dataplane then reads the set
/// elements back for [`applied_anyway`] (one read, only after such a refusal).
pub fn refused_creations(refused: &[OpFailure]) -> bool {
    refused
        .iter()
        .any(|f| matches!(f.op, Op::AddSetElement(SetElement::FirewallAllow(..))))
}

/// Takes out of `refused` the additions whose element `present` (the set elements read back
/// after the refusal) holds exactly, and returns them: the kernel has what they add, so they
/// count as applied. kipvs adds only the elements its reading of the table lacks (read at every
/// full sync, and again for an element a failed transaction left in doubt), so this happens
/// only when that reading is out of step with the kernel: an `nft` killed at its timeout after
/// the kernel committed, or an element written by someone else.
pub fn applied_anyway(refused: &mut Vec<OpFailure>, present: &BTreeSet<SetElement>) -> Vec<Op> {
    let (applied, still): (Vec<OpFailure>, Vec<OpFailure>) = std::mem::take(refused)
        .into_iter()
        .partition(|f| matches!(&f.op, Op::AddSetElement(e) if present.contains(e)));
    *refused = still;
    applied.into_iter().map(|f| f.op).collect()
}

/// The virtual servers that `ops` (a diff) does not add and whose `firewall` element addition
/// is among `failures`: existing virtual servers that the kernel leaves open to every source
/// while their Service asks for `loadBalancerSourceRanges`. The syncer deletes those it holds
/// (fail closed) and retries them with the element: once it is in, they are added again.
///
/// A failed `firewall-allow` addition alone exposes nothing: the virtual server's `firewall`
/// element is in the kernel (an isolated refusal leaves the other elements of the stage in), so
/// sources outside the ranges that did land are dropped, those of the refused range included.
pub fn exposed(ops: &[Op], failures: &[OpFailure]) -> BTreeSet<VirtualServerKey> {
    let mut keys: BTreeSet<VirtualServerKey> = failures
        .iter()
        .filter_map(|f| match f.op {
            Op::AddSetElement(SetElement::Firewall(key)) => Some(key),
            _ => None,
        })
        .collect();
    if !keys.is_empty() {
        for op in ops {
            if let Op::AddVirtualServer(key, _) = op {
                keys.remove(key);
            }
        }
    }
    keys
}

/// What one application of a diff keeps back, stage after stage, so that a failed op never
/// leaves a virtual server open or orphaned:
///
/// - a **new** virtual server whose `firewall` or `firewall-allow` element failed is not added,
///   nor its real servers, nor its address bound (fail closed; an existing one keeps what it
///   has: its `firewall` element, if any, is still in the kernel);
/// - a virtual server whose deletion failed keeps its own set elements: they are kipvs's record
///   of owning it ([`Ownership`](super::diff::Ownership)) and its firewall.
///
/// The ops kept back fail with [`DataplaneError::Withheld`] and are retried with the op that
/// caused it. Other failures (a `cluster-ips` or `external` element: masquerade only) hold
/// nothing back.
#[derive(Debug, Default)]
pub struct Withholding {
    /// New virtual servers whose firewall elements failed.
    unguarded: BTreeSet<VirtualServerKey>,
    /// Virtual servers whose deletion failed.
    undeleted: BTreeSet<VirtualServerKey>,
}

impl Withholding {
    /// Records the `failures` of a stage of `ops` (the whole diff being applied).
    pub fn failed(&mut self, ops: &[Op], failures: &[OpFailure]) {
        let mut firewall = BTreeSet::new();
        for failure in failures {
            match &failure.op {
                Op::DeleteVirtualServer(key) => {
                    self.undeleted.insert(*key);
                }
                Op::AddSetElement(
                    SetElement::Firewall(key) | SetElement::FirewallAllow(key, _),
                ) => {
                    firewall.insert(*key);
                }
                _ => {}
            }
        }
        if firewall.is_empty() {
            return;
        }
        for op in ops {
            if let Op::AddVirtualServer(key, _) = op
                && firewall.contains(key)
            {
                self.unguarded.insert(*key);
            }
        }
    }

    /// Why `op` is kept back, if it is.
    fn holds(&self, op: &Op) -> Option<(VirtualServerKey, &'static str)> {
        match op {
            Op::AddVirtualServer(key, _) | Op::AddRealServer { vs: key, .. }
                if self.unguarded.contains(key) =>
            {
                Some((*key, "its firewall element is not in the kernel"))
            }
            Op::BindAddress(address) => self
                .unguarded
                .iter()
                .find(|key| key.address == *address)
                .map(|key| (*key, "its firewall element is not in the kernel")),
            Op::DeleteSetElement(element) => element
                .virtual_server()
                .filter(|key| self.undeleted.contains(key))
                .map(|key| (key, "its deletion failed")),
            _ => None,
        }
    }

    /// Splits `stage` into the ops to apply and those kept back. Borrows `stage` when nothing
    /// is kept back.
    pub fn split<'a>(&self, stage: &'a [Op]) -> (Cow<'a, [Op]>, Vec<OpFailure>) {
        if self.unguarded.is_empty() && self.undeleted.is_empty()
            || !stage.iter().any(|op| self.holds(op).is_some())
        {
            return (Cow::Borrowed(stage), Vec::new());
        }
        let mut apply = Vec::with_capacity(stage.len());
        let mut held = Vec::new();
        for op in stage {
            match self.holds(op) {
                Some((key, reason)) => held.push(OpFailure {
                    op: op.clone(),
                    error: DataplaneError::Withheld { key, reason },
                }),
                None => apply.push(op.clone()),
            }
        }
        (Cow::Owned(apply), held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Protocol, SetElement};

    fn key(port: u16) -> VirtualServerKey {
        VirtualServerKey {
            address: "10.0.5.100".parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn allow(port: u16, net: &str) -> Op {
        Op::AddSetElement(SetElement::FirewallAllow(key(port), net.parse().unwrap()))
    }

    /// An [`Isolation`] against a fake kernel that refuses a transaction holding any op of
    /// `refused`: what was applied, what failed, and how many transactions it took.
    fn run(ops: &[Op], refused: &[Op]) -> (Vec<Op>, Vec<Op>, usize) {
        let mut applied = Vec::new();
        let mut transactions = 0;
        let mut isolation = Isolation::new(ops);
        while let Some(part) = isolation.next_part() {
            transactions += 1;
            if part.iter().any(|op| refused.contains(op)) {
                isolation.done(Err(DataplaneError::NftTransaction("File exists".into())));
            } else {
                applied.extend_from_slice(part);
                isolation.done(Ok(()));
            }
        }
        let failed = isolation.failures().into_iter().map(|f| f.op).collect();
        (applied, failed, transactions)
    }

    #[test]
    fn a_refused_op_fails_alone_and_every_other_lands_once_in_order() {
        let ops: Vec<Op> = (0..1000).map(|p| allow(p, "10.0.0.0/8")).collect();
        let refused = [ops[137].clone(), ops[901].clone()];
        let (applied, failed, transactions) = run(&ops, &refused);
        assert_eq!(failed, refused);
        let expected: Vec<Op> = ops
            .iter()
            .filter(|op| !refused.contains(op))
            .cloned()
            .collect();
        assert_eq!(applied, expected);
        assert!(transactions <= 4 * 10 + 1, "{transactions} transactions");
    }

    #[test]
    fn a_stage_that_applies_is_one_transaction() {
        let ops: Vec<Op> = (0..10).map(|p| allow(p, "10.0.0.0/8")).collect();
        let (applied, failed, transactions) = run(&ops, &[]);
        assert_eq!((applied, failed, transactions), (ops, vec![], 1));
    }

    #[test]
    fn a_stage_the_kernel_refuses_whole_costs_at_most_the_budget() {
        let ops: Vec<Op> = (0..5000).map(|p| allow(p, "10.0.0.0/8")).collect();
        let (applied, failed, transactions) = run(&ops, &ops);
        assert!(applied.is_empty());
        assert_eq!(failed, ops);
        assert!(
            transactions <= ISOLATION_BUDGET + 13,
            "{transactions} transactions"
        );
    }

    fn spec() -> crate::model::VirtualServerSpec {
        crate::model::VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: 0,
        }
    }

    fn failure(op: Op) -> OpFailure {
        OpFailure {
            op,
            error: DataplaneError::NftTransaction("File exists".into()),
        }
    }

    #[test]
    fn a_new_virtual_server_whose_firewall_failed_is_kept_out_with_its_real_servers_and_address() {
        let rs = "10.244.0.7:8080".parse().unwrap();
        let ops = [
            allow(80, "10.0.0.0/8"),
            Op::AddVirtualServer(key(80), spec()),
            Op::AddVirtualServer(key(443), spec()),
            Op::AddRealServer {
                vs: key(80),
                rs,
                weight: 1,
            },
            Op::UpdateRealServer {
                vs: key(81),
                rs,
                weight: 0,
            },
            Op::BindAddress(key(80).address),
        ];
        let mut withholding = Withholding::default();
        withholding.failed(&ops, &[failure(ops[0].clone())]);
        let (apply, held) = withholding.split(&ops[1..]);
        assert_eq!(*apply, [ops[2].clone(), ops[4].clone()]);
        let held: Vec<&Op> = held.iter().map(|f| &f.op).collect();
        assert_eq!(held, [&ops[1], &ops[3], &ops[5]]);
    }

    #[test]
    fn an_existing_virtual_server_or_a_masquerade_element_holds_nothing_back() {
        let rs = "10.244.0.7:8080".parse().unwrap();
        let external = Op::AddSetElement(SetElement::External(key(443)));
        let ops = [
            allow(80, "10.0.0.0/8"),
            external.clone(),
            Op::AddVirtualServer(key(443), spec()),
            Op::AddRealServer {
                vs: key(80),
                rs,
                weight: 1,
            },
        ];
        let mut withholding = Withholding::default();
        withholding.failed(&ops, &[failure(ops[0].clone()), failure(external)]);
        let (apply, held) = withholding.split(&ops[2..]);
        assert!(matches!(apply, Cow::Borrowed(_)) && held.is_empty());
    }

    /// Only additions whose element is exactly in the kernel count as applied: a nested or
    /// overlapping one (another element of the same key) stays refused, as do other ops.
    #[test]
    fn a_refused_addition_of_a_present_element_counts_as_applied() {
        let ops = [
            allow(80, "10.0.0.0/8"),
            allow(80, "10.1.0.0/16"),
            Op::AddSetElement(SetElement::Firewall(key(80))),
            Op::DeleteSetElement(SetElement::FirewallAllow(
                key(81),
                "10.0.0.0/8".parse().unwrap(),
            )),
        ];
        let mut refused: Vec<OpFailure> = ops.iter().cloned().map(failure).collect();
        assert!(refused_creations(&refused));
        let present: BTreeSet<SetElement> = [
            SetElement::FirewallAllow(key(80), "10.0.0.0/8".parse().unwrap()),
            SetElement::FirewallAllow(key(81), "10.0.0.0/8".parse().unwrap()),
        ]
        .into();
        let applied = applied_anyway(&mut refused, &present);
        assert_eq!(applied, [ops[0].clone()]);
        let still: Vec<&Op> = refused.iter().map(|f| &f.op).collect();
        assert_eq!(still, [&ops[1], &ops[2], &ops[3]]);
        assert!(!refused_creations(&refused[1..]));
    }

    /// An existing virtual server whose `firewall` element failed is exposed; a new one (added
    /// by the same diff: [`Withholding`] keeps it out) is not, nor one whose
    /// `firewall-allow` element alone failed (its `firewall` element filters).
    #[test]
    fn an_existing_virtual_server_whose_firewall_element_failed_is_exposed() {
        let firewall = |port| Op::AddSetElement(SetElement::Firewall(key(port)));
        let ops = [
            firewall(80),
            firewall(443),
            allow(8080, "10.0.0.0/8"),
            Op::AddVirtualServer(key(443), spec()),
        ];
        let failures: Vec<OpFailure> = ops[..3].iter().cloned().map(failure).collect();
        assert_eq!(exposed(&ops, &failures), [key(80)].into());
        assert!(exposed(&ops, &failures[1..]).is_empty());
    }

    #[test]
    fn a_virtual_server_whose_deletion_failed_keeps_its_elements() {
        let ops = [
            Op::DeleteVirtualServer(key(80)),
            Op::DeleteSetElement(SetElement::External(key(80))),
            Op::DeleteSetElement(SetElement::Firewall(key(80))),
            Op::DeleteSetElement(SetElement::External(key(443))),
        ];
        let mut withholding = Withholding::default();
        withholding.failed(&ops, &[failure(ops[0].clone())]);
        let (apply, held) = withholding.split(&ops[1..]);
        assert_eq!(*apply, [ops[3].clone()]);
        assert_eq!(held.len(), 2);
        assert!(
            held[0]
                .error
                .to_string()
                .contains("its deletion failed (TCP 10.0.5.100:80)"),
            "{}",
            held[0].error
        );
    }
}

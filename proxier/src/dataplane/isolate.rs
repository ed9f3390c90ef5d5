//! Failures stay with their Service: an nftables op the kernel refuses is found and fails alone
//! (fail small), and a virtual server whose own set elements are not in the kernel is not added
//! (fail closed).
//!
//! An nftables transaction is all or nothing, and one holds the elements of many Services: a
//! single element the kernel refuses (an interval that overlaps another, `EEXIST`) would keep
//! every other Service's elements out of the kernel at every sync. [`Isolation`] splits a refused
//! transaction in halves until the refused ops are alone, within [`ISOLATION_BUDGET`]
//! transactions. [`withhold`] then keeps back the ops that would let traffic reach a virtual
//! server whose own elements failed (a load-balancer IP without its `firewall` element is open
//! to every source; one without `external` is not masqueraded): they fail with
//! [`DataplaneError::Withheld`] and are retried with the element.

use super::{DataplaneError, Op, OpFailure};
use crate::model::VirtualServerKey;
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
        if part.len() == 1 || self.spent + self.pending.len() >= ISOLATION_BUDGET {
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

/// The virtual servers one of whose own set elements (`cluster-ips`, `external`,
/// `external-local`, `firewall`, `firewall-allow`) failed to be added.
pub fn elements_failed(failures: &[OpFailure]) -> BTreeSet<VirtualServerKey> {
    failures
        .iter()
        .filter_map(|f| match &f.op {
            Op::AddSetElement(element) => element.virtual_server(),
            _ => None,
        })
        .collect()
}

/// Splits `stage` into the ops to apply and those withheld because they would let traffic reach
/// a virtual server of `withheld`: adding it, and adding real servers to it. Updates, drains and
/// deletions go on. Borrows `stage` when nothing is withheld.
pub fn withhold<'a>(
    stage: &'a [Op],
    withheld: &BTreeSet<VirtualServerKey>,
) -> (Cow<'a, [Op]>, Vec<OpFailure>) {
    let held = |op: &Op| match op {
        Op::AddVirtualServer(key, _) | Op::AddRealServer { vs: key, .. } => withheld.contains(key),
        _ => false,
    };
    if withheld.is_empty() || !stage.iter().any(held) {
        return (Cow::Borrowed(stage), Vec::new());
    }
    let (held, apply): (Vec<Op>, Vec<Op>) = stage.iter().cloned().partition(held);
    let failures = held
        .into_iter()
        .map(|op| {
            let key = op
                .virtual_server()
                .expect("withheld ops name a virtual server");
            OpFailure {
                op,
                error: DataplaneError::Withheld(key),
            }
        })
        .collect();
    (Cow::Owned(apply), failures)
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

    #[test]
    fn a_virtual_server_whose_element_failed_and_its_real_servers_are_withheld() {
        let spec = crate::model::VirtualServerSpec {
            scheduler: "rr".into(),
            persistence_timeout: None,
            sched_flags: 0,
        };
        let rs = "10.244.0.7:8080".parse().unwrap();
        let failures = [OpFailure {
            op: allow(80, "10.0.0.0/8"),
            error: DataplaneError::NftTransaction("File exists".into()),
        }];
        let withheld = elements_failed(&failures);
        assert_eq!(withheld, BTreeSet::from([key(80)]));
        let stage = [
            Op::AddVirtualServer(key(80), spec.clone()),
            Op::AddVirtualServer(key(443), spec),
        ];
        let (apply, held) = withhold(&stage, &withheld);
        assert_eq!(*apply, stage[1..]);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].op, stage[0]);
        assert!(
            held[0].error.to_string().contains("TCP 10.0.5.100:80"),
            "{}",
            held[0].error
        );
        let stage = [
            Op::AddRealServer {
                vs: key(80),
                rs,
                weight: 1,
            },
            Op::UpdateRealServer {
                vs: key(80),
                rs,
                weight: 0,
            },
        ];
        let (apply, held) = withhold(&stage, &withheld);
        assert_eq!(*apply, stage[1..]);
        assert_eq!(held[0].op, stage[0]);
        let (apply, held) = withhold(&stage, &BTreeSet::new());
        assert!(matches!(apply, Cow::Borrowed(_)) && held.is_empty());
    }
}

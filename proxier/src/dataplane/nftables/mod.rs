//! The nftables half of the dataplane: masquerade, hairpin and service-IP filtering, which IPVS
//! alone cannot do (kube-proxy's IPVS mode does them with iptables and ipsets:
//! `pkg/proxy/ipvs/proxier.go` `writeIptablesRules`). `docs/nftables.md` has the hooks diagram.
//!
//! kipvs owns one table, `inet kipvs`, with a constant set of rules (about 25, whatever the number of
//! Services) that look up **named sets**; Services only ever add and delete set elements. The
//! elements are [`SetElement`]s, planned per Service (`plan_service`) and diffed like virtual
//! servers, so one endpoint change costs a handful of elements. Every change of one sync goes to
//! the kernel as one atomic transaction that touches only this table: `nft -j -f -`
//! ([`transaction`]), or, when it changes elements only, one nfnetlink batch without a process
//! ([`elements`]).
//!
//! | set (`-v6` for IPv6) | element | used by |
//! |---|---|---|
//! | `cluster-ips` | ClusterIP `ip . proto . port` | masquerade from outside `clusterCIDR` (or all with `masqueradeAll`), or from a service IP (the node itself) |
//! | `external` | NodePort / externalIP / load-balancer `ip . proto . port`, `externalTrafficPolicy: Cluster` | masquerade always |
//! | `external-local` | the same with `externalTrafficPolicy: Local` | never masqueraded: the backend sees the client |
//! | `external-no-local` | an `external-local` one whose Service has endpoints, none on this node | new connections from outside the cluster rejected (kube-proxy IPVS's answer); pods (local-traffic detection) and the node itself served |
//! | `service-ips` | each address bound on `kube-ipvs0` | new connections to other ports are rejected (kubernetes#72236) |
//! | `hairpin` | `endpoint . endpoint` for local endpoints | a pod reaching itself through its Service is masqueraded |
//! | `firewall` | load-balancer `ip . proto . port` with `loadBalancerSourceRanges` | traffic not from an allowed source is dropped |
//! | `firewall-allow` | `ip . proto . port . source CIDR` (interval) | the allowed sources; the load-balancer IP itself when a node IP is in a range (kubernetes#119656) |
//! | `health-check-ports` | healthCheckNodePort | accepted |
//!
//! Masquerade decisions are taken on the virtual address, before IPVS rewrites it, as kube-proxy's
//! `KUBE-MARK-MASQ` / `KUBE-POSTROUTING` do: `nat-prerouting` and `nat-output` (priority `dstnat`,
//! -100, ahead of IPVS's `LOCAL_IN` hook at 98 and `LOCAL_OUT` hook at -98) jump to
//! `mark-masquerade`, which sets packet mark bit 14 ([`MASQUERADE_MARK`], `0x4000`, kube-proxy's
//! default `masqueradeBit`) on the connections to masquerade; `nat-postrouting` (priority `srcnat`,
//! 100) masquerades marked packets `fully-random` and clears the bit. Hairpin traffic is matched
//! there on `saddr . daddr` against `hairpin` and masqueraded without a mark. `pin-prerouting` and
//! `pin-output` (-110) keep ClusterIP connections' destinations ahead of iptables' nat table
//! (`PIN_PRIORITY`). The filters run in `input` at priority `filter` (0) and in `output` at
//! priority -150, both before IPVS's own hooks, so they still see the virtual address.

pub mod elements;

use super::host::program::{Program, ProgramError};
use crate::model::{LocalTraffic, NftRules, Protocol, SetElement, VirtualServerKey};
use ipnet::IpNet;
use nftables::expr::{BinaryOperation, CT, Expression, Meta, MetaKey, NamedExpression};
use nftables::expr::{Fib, FibFlag, FibResult};
use nftables::expr::{Payload, PayloadField, Prefix, SetItem};
use nftables::schema::{
    Chain, Element, NfCmd, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, SetType,
    SetTypeValue, Table,
};
use nftables::stmt::{JumpTarget, Mangle, Match, NAT, NATFamily, NATFlag, Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

/// The table kipvs owns (family `inet`, both IP families).
pub const TABLE: &str = "kipvs";

/// `element` as libnftables JSON (`"10.96.0.1"`, `{"concat": ["10.96.0.1", "tcp", 80]}`).
pub fn element_expr(element: &SetElement) -> Expression<'static> {
    match *element {
        SetElement::ClusterIp(k)
        | SetElement::External(k)
        | SetElement::ExternalLocal(k)
        | SetElement::ExternalNoLocal(k)
        | SetElement::Firewall(k) => concat(key_parts(&k).to_vec()),
        SetElement::FirewallAllow(k, net) => {
            let mut parts = key_parts(&k).to_vec();
            parts.push(prefix(net));
            concat(parts)
        }
        SetElement::ServiceIp(ip) => address(ip),
        SetElement::Hairpin(ip) => concat(vec![address(ip), address(ip)]),
        SetElement::HealthCheckNodePort(port) => Expression::Number(port.into()),
    }
}

/// Reads an element of set `set` back from `nft -j list` output; `None` for a set kipvs
/// does not have or an element it would not have written.
pub fn parse_element(set: &str, expr: &Expression<'_>) -> Option<SetElement> {
    let family_ok = |e: SetElement| (e.set_name() == set).then_some(e);
    let parts: &[Expression<'_>] = match expr {
        Expression::Named(NamedExpression::Concat(parts)) => parts,
        Expression::Named(NamedExpression::Elem(elem)) => {
            return parse_element(set, &elem.val);
        }
        single => std::slice::from_ref(single),
    };
    let base = set.strip_suffix("-v6").unwrap_or(set);
    let element = match (base, parts) {
        ("cluster-ips", [a, p, n]) => SetElement::ClusterIp(parse_key(a, p, n)?),
        ("external", [a, p, n]) => SetElement::External(parse_key(a, p, n)?),
        ("external-local", [a, p, n]) => SetElement::ExternalLocal(parse_key(a, p, n)?),
        ("external-no-local", [a, p, n]) => SetElement::ExternalNoLocal(parse_key(a, p, n)?),
        ("firewall", [a, p, n]) => SetElement::Firewall(parse_key(a, p, n)?),
        ("firewall-allow", [a, p, n, s]) => {
            SetElement::FirewallAllow(parse_key(a, p, n)?, parse_net(s)?)
        }
        ("service-ips", [a]) => SetElement::ServiceIp(parse_address(a)?),
        ("hairpin", [a, b]) => {
            let ip = parse_address(a)?;
            (parse_address(b)? == ip).then_some(SetElement::Hairpin(ip))?
        }
        ("health-check-ports", [Expression::Number(port)]) => {
            SetElement::HealthCheckNodePort(u16::try_from(*port).ok()?)
        }
        _ => return None,
    };
    family_ok(element)
}

/// The chains kipvs creates: name and, for base chains, type, hook and priority. The marks are
/// set at `dstnat` (-100) in `prerouting` and `output`, before IPVS sees the packet (its
/// `LOCAL_IN` hook is at 98, its `LOCAL_OUT` hook at -98), on the virtual address; the
/// masquerade happens at `srcnat` (100). The filters run at `filter` (0) in `input`, before
/// IPVS's `LOCAL_IN` hook, and at -150 in `output`, before its `LOCAL_OUT` hook. The `pin-`
/// chains run first of all NAT chains ([`PIN_PRIORITY`]): they mark too, then bind ClusterIP
/// connections to their own destination.
const CHAINS: [(&str, Option<BaseChain>); 8] = [
    (
        "pin-prerouting",
        Some((NfChainType::NAT, NfHook::Prerouting, PIN_PRIORITY)),
    ),
    (
        "pin-output",
        Some((NfChainType::NAT, NfHook::Output, PIN_PRIORITY)),
    ),
    (
        "nat-prerouting",
        Some((NfChainType::NAT, NfHook::Prerouting, -100)),
    ),
    ("nat-output", Some((NfChainType::NAT, NfHook::Output, -100))),
    ("mark-masquerade", None),
    (
        "nat-postrouting",
        Some((NfChainType::NAT, NfHook::Postrouting, 100)),
    ),
    (
        "filter-input",
        Some((NfChainType::Filter, NfHook::Input, 0)),
    ),
    (
        "filter-output",
        Some((NfChainType::Filter, NfHook::Output, -150)),
    ),
];

/// A base chain's type, hook and priority.
type BaseChain = (NfChainType, NfHook, i32);

/// The priority of `pin-prerouting` and `pin-output`: before every NAT chain at `dstnat`
/// (-100), iptables' `nat` table included, where the CNI `portmap` plugin DNATs hostPorts to
/// local addresses (`CNI-HOSTPORT-DNAT`, `--dst-type LOCAL`), which cluster IPs on `kube-ipvs0`
/// are. The kernel runs a new connection's NAT chains in priority order only until one binds
/// its destination (`nf_nat_inet_fn`), so the null DNAT of a ClusterIP connection here keeps
/// a hostPort on the same port from capturing it, as kube-proxy's `nat` `ACCEPT` for its IPVS
/// sets at the top of `PREROUTING` and `OUTPUT` does (kubernetes#62718).
const PIN_PRIORITY: i32 = -110;

/// The packet mark bit that asks `nat-postrouting` to masquerade: bit 14, kube-proxy's default
/// `masqueradeBit`, so that CNI plugins configured around kube-proxy's mark keep working.
pub const MASQUERADE_MARK: u32 = 1 << 14;

/// One IP family's names: `ip`/`ip6` and the set-name suffix.
#[derive(Clone, Copy)]
struct Family {
    proto: &'static str,
    suffix: &'static str,
    addr: SetType,
    v6: bool,
}

const FAMILIES: [Family; 2] = [
    Family {
        proto: "ip",
        suffix: "",
        addr: SetType::Ipv4Addr,
        v6: false,
    },
    Family {
        proto: "ip6",
        suffix: "-v6",
        addr: SetType::Ipv6Addr,
        v6: true,
    },
];

/// The encoding of the rules' parameters (a [`NftRules`] is plain data in [`crate::model`]).
impl NftRules {
    /// The rules, in chain order, as `(chain, comment, statements)`: [`NftRules::bodies`] with
    /// each comment made the rule's identity ([`identify`]).
    fn rules(&self) -> Vec<RuleBody> {
        identify(self.bodies())
    }

    /// The rules, in chain order, as `(chain, purpose, statements)`; the purpose names what the
    /// rule is for and its parameters. Within a chain, the family-independent rules come first,
    /// then IPv4's, then IPv6's.
    fn bodies(&self) -> Vec<RuleBody> {
        let each_family = |rules: fn(&Self, Family) -> Vec<RuleBody>| {
            FAMILIES.into_iter().flat_map(move |f| rules(self, f))
        };
        let mut rules = Vec::new();
        for (chain, _) in CHAINS {
            match chain {
                "pin-prerouting" | "pin-output" => {
                    // The mark first: the NAT chains after a binding (nat-prerouting's mark
                    // included) do not run for a pinned connection.
                    rules.push((
                        chain,
                        "mark service traffic to masquerade".to_owned(),
                        jump("mark-masquerade"),
                    ));
                    rules.extend(FAMILIES.into_iter().map(|f| pin(chain, f)));
                }
                "nat-prerouting" | "nat-output" => rules.push((
                    chain,
                    "mark service traffic to masquerade".to_owned(),
                    jump("mark-masquerade"),
                )),
                "mark-masquerade" => rules.extend(each_family(Self::mark_masquerade)),
                "nat-postrouting" => {
                    rules.push(masquerade_marked());
                    rules.extend(each_family(Self::nat_postrouting));
                }
                "filter-input" => rules.extend(each_family(Self::filter_input)),
                "filter-output" => rules.extend(each_family(Self::filter_output)),
                other => unreachable!("chain {other} has no rules"),
            }
        }
        rules
    }

    /// `mark-masquerade`: marks the connections to masquerade (kube-proxy's
    /// `KUBE-MARK-MASQ` uses): externalTrafficPolicy Cluster, and ClusterIP connections from
    /// outside the cluster (every one with `masqueradeAll`).
    fn mark_masquerade(&self, f: Family) -> Vec<RuleBody> {
        let v = f.name();
        let chain = "mark-masquerade";
        let mut rules = vec![(
            chain,
            format!("{v}: externalTrafficPolicy Cluster"),
            vec![matches(f.destination(), f.set("external")), set_mark()],
        )];
        if self.masquerade_all() {
            rules.push((
                chain,
                format!("{v}: every ClusterIP connection (masqueradeAll)"),
                vec![matches(f.destination(), f.set("cluster-ips")), set_mark()],
            ));
            return rules;
        }
        rules.push((
            chain,
            format!("{v}: ClusterIP connections the node opens from a service IP"),
            vec![
                matches(f.destination(), f.set("cluster-ips")),
                matches(payload(f.proto, "saddr"), f.set("service-ips")),
                set_mark(),
            ],
        ));
        if let Some(not_local) = self.not_from_local_pods(f) {
            // The CIDRs and interface are in the body (and so in the comment's hash), not in
            // the comment: `nft` refuses a comment over 128 bytes.
            let from = match self.local_traffic() {
                LocalTraffic::ClusterCidrs(_) => "from outside the cluster CIDRs",
                LocalTraffic::NodeCidrs(_) => "from outside the node's pod CIDRs",
                LocalTraffic::BridgeInterface(_) => "not from the pod bridge",
                LocalTraffic::InterfaceNamePrefix(_) => "not from pod interfaces",
            };
            rules.push((
                chain,
                format!("{v}: ClusterIP connections {from}"),
                vec![
                    matches(f.destination(), f.set("cluster-ips")),
                    not_local,
                    set_mark(),
                ],
            ));
        }
        rules
    }

    /// A match of family `f`'s packets that do not come from this node's pods by the
    /// local-traffic detector (kube-proxy's `JumpIfNotLocal`: `! -s CIDR`, `! -i bridge`,
    /// `! -i prefix+`), `None` when it detects nothing for `f`. Packets the node sends have no
    /// input interface, so the interface modes count them as not local, as kube-proxy does.
    fn not_from_local_pods(&self, f: Family) -> Option<Statement<'static>> {
        let iifname_not = |name: String| {
            Some(Statement::Match(Match {
                left: meta(MetaKey::Iifname),
                right: Expression::String(name.into()),
                op: Operator::NEQ,
            }))
        };
        match self.local_traffic() {
            LocalTraffic::ClusterCidrs(cidrs) | LocalTraffic::NodeCidrs(cidrs) => {
                let own: Vec<SetItem<'static>> = cidrs
                    .iter()
                    .filter(|net| net.addr().is_ipv6() == f.v6)
                    .map(|&net| SetItem::Element(prefix(net)))
                    .collect();
                (!own.is_empty()).then(|| {
                    Statement::Match(Match {
                        left: payload(f.proto, "saddr"),
                        right: Expression::Named(NamedExpression::Set(own)),
                        op: Operator::NEQ,
                    })
                })
            }
            LocalTraffic::BridgeInterface(name) => iifname_not(name.clone()),
            // nft's wildcard: a trailing `*` matches any suffix.
            LocalTraffic::InterfaceNamePrefix(prefix) => iifname_not(format!("{prefix}*")),
        }
    }

    /// `nat-postrouting`, per family: masquerades hairpin traffic (an endpoint reaching itself
    /// through its Service, which IPVS would otherwise send back with the endpoint as source).
    fn nat_postrouting(&self, f: Family) -> Vec<RuleBody> {
        vec![(
            "nat-postrouting",
            format!(
                "{}: masquerade hairpin traffic (an endpoint reaching itself)",
                f.name()
            ),
            vec![
                matches(
                    concat(vec![payload(f.proto, "saddr"), payload(f.proto, "daddr")]),
                    f.set("hairpin"),
                ),
                masquerade(),
            ],
        )]
    }

    /// `filter-input`: the load-balancer firewall, the rejection of outside clients of
    /// `externalTrafficPolicy: Local` without local endpoints, then the health-check node
    /// ports, then the rejection of new connections to service IPs on ports that are not
    /// theirs (kube-proxy's `KUBE-IPVS-FILTER`).
    fn filter_input(&self, f: Family) -> Vec<RuleBody> {
        let v = f.name();
        let mut reject = vec![
            Statement::Match(Match {
                left: ct_state(),
                right: Expression::String("new".into()),
                op: Operator::IN,
            }),
            matches(payload(f.proto, "daddr"), f.set("service-ips")),
        ];
        for name in ["cluster-ips", "external", "external-local"] {
            reject.push(Statement::Match(Match {
                left: f.destination(),
                right: f.set(name),
                op: Operator::NEQ,
            }));
        }
        reject.push(Statement::Reject(None));
        vec![
            (
                "filter-input",
                format!("{v}: drop sources outside loadBalancerSourceRanges"),
                f.firewall(),
            ),
            (
                "filter-input",
                format!(
                    "{v}: reject outside clients of externalTrafficPolicy Local without local \
                     endpoints"
                ),
                self.reject_outside_without_local_endpoints(f),
            ),
            // After the source-range drop, before the reject: health-check ports are accepted
            // on every local address, load-balancer IPs included: GCE-style load balancers
            // probe LB-IP:healthCheckNodePort (kube-proxy's KUBE-IPVS-FILTER returns for
            // KUBE-HEALTH-CHECK-NODE-PORT whatever the destination, kubernetes#117723). The
            // source-range drop matches a load-balancer IP with its service port only, so a
            // health-check port never opens a firewalled service port.
            (
                "filter-input",
                format!("{v}: accept healthCheckNodePorts, load-balancer IPs included"),
                vec![
                    matches(
                        meta(MetaKey::Nfproto),
                        Expression::String(if f.v6 { "ipv6" } else { "ipv4" }.into()),
                    ),
                    matches(payload("tcp", "dport"), set_ref("health-check-ports")),
                    Statement::Accept(None),
                ],
            ),
            (
                "filter-input",
                format!("{v}: reject new connections to service IPs on other ports"),
                reject,
            ),
        ]
    }

    /// The statements rejecting a new connection to an `external-no-local` virtual server
    /// (`externalTrafficPolicy: Local`, no local endpoint) from outside the cluster: not from
    /// the node itself (`fib saddr type local`, kube-proxy's `--src-type LOCAL`) nor, when the
    /// local-traffic detector detects anything, from this node's pods (kube-proxy's iptables
    /// "pods trying to reach external load-balancer VIP" short-circuit).
    ///
    /// `reject` answers ICMP port unreachable (ICMPv6 for IPv6), what kube-proxy's IPVS mode
    /// answers there: its virtual server has no real server, and IPVS's `ip_vs_leave` sends
    /// `ICMP_PORT_UNREACH` whatever the protocol. Without this rule outside clients reached
    /// remote endpoints unmasqueraded and hung on the asymmetric return path.
    fn reject_outside_without_local_endpoints(&self, f: Family) -> Vec<Statement<'static>> {
        let mut statements = vec![
            Statement::Match(Match {
                left: ct_state(),
                right: Expression::String("new".into()),
                op: Operator::IN,
            }),
            matches(f.destination(), f.set("external-no-local")),
            Statement::Match(Match {
                left: Expression::Named(NamedExpression::Fib(Fib {
                    result: FibResult::Type,
                    flags: HashSet::from([FibFlag::Saddr]),
                })),
                right: Expression::String("local".into()),
                op: Operator::NEQ,
            }),
        ];
        statements.extend(self.not_from_local_pods(f));
        statements.push(Statement::Reject(None));
        statements
    }

    /// `filter-output`: the load-balancer firewall for the node's own connections.
    fn filter_output(&self, f: Family) -> Vec<RuleBody> {
        vec![(
            "filter-output",
            format!(
                "{}: drop node traffic outside loadBalancerSourceRanges",
                f.name()
            ),
            f.firewall(),
        )]
    }
}

/// `chain`'s rule that gives family `f`'s new ClusterIP connections their own destination (a
/// null DNAT: `dnat ip to ip daddr`), so that no later NAT chain rewrites it ([`PIN_PRIORITY`]).
/// The connection's NAT state is the null binding it gets anyway; IPVS sees the cluster IP.
fn pin(chain: &'static str, f: Family) -> RuleBody {
    let (family, address) = if f.v6 {
        (NATFamily::IP6, payload("ip6", "daddr"))
    } else {
        (NATFamily::IP, payload("ip", "daddr"))
    };
    (
        chain,
        format!(
            "{}: ClusterIP connections keep their destination (no hostPort DNAT)",
            f.name()
        ),
        vec![
            matches(f.destination(), f.set("cluster-ips")),
            Statement::DNAT(Some(NAT {
                addr: Some(address),
                family: Some(family),
                port: None,
                flags: None,
            })),
        ],
    )
}

/// One rule: `(chain, purpose or comment, statements)`.
type RuleBody = (&'static str, String, Vec<Statement<'static>>);

impl Family {
    /// `IPv4` or `IPv6`, as the rules' comments name the family.
    fn name(self) -> &'static str {
        if self.v6 { "IPv6" } else { "IPv4" }
    }

    /// This family's set `name` (`external`, `external-v6`, ...).
    fn set(self, name: &str) -> Expression<'static> {
        set_ref(&format!("{name}{}", self.suffix))
    }

    /// `daddr . l4proto . dport`, the key of the sets of virtual servers.
    fn destination(self) -> Expression<'static> {
        concat(vec![
            payload(self.proto, "daddr"),
            meta(MetaKey::L4proto),
            payload("th", "dport"),
        ])
    }

    /// Drops traffic to a firewalled load-balancer IP and port from a source outside its
    /// `firewall-allow` ranges.
    fn firewall(self) -> Vec<Statement<'static>> {
        vec![
            matches(self.destination(), self.set("firewall")),
            Statement::Match(Match {
                left: concat(vec![
                    payload(self.proto, "daddr"),
                    meta(MetaKey::L4proto),
                    payload("th", "dport"),
                    payload(self.proto, "saddr"),
                ]),
                right: self.set("firewall-allow"),
                op: Operator::NEQ,
            }),
            Statement::Drop(None),
        ]
    }
}

/// `masquerade fully-random`.
fn masquerade() -> Statement<'static> {
    Statement::Masquerade(Some(NAT {
        addr: None,
        family: None,
        port: None,
        flags: Some(HashSet::from([NATFlag::FullyRandom])),
    }))
}

/// `meta mark set meta mark | 0x4000`.
fn set_mark() -> Statement<'static> {
    Statement::Mangle(Mangle {
        key: meta(MetaKey::Mark),
        value: Expression::BinaryOperation(Box::new(BinaryOperation::OR(vec![
            meta(MetaKey::Mark),
            Expression::Number(MASQUERADE_MARK),
        ]))),
    })
}

/// `nat-postrouting`'s first rule: masquerades marked traffic and clears the mark (kube-proxy's
/// `KUBE-POSTROUTING`).
fn masquerade_marked() -> RuleBody {
    let marked = Expression::BinaryOperation(Box::new(BinaryOperation::AND(
        meta(MetaKey::Mark),
        Expression::Number(MASQUERADE_MARK),
    )));
    (
        "nat-postrouting",
        format!("masquerade marked traffic (mark {MASQUERADE_MARK:#x})"),
        vec![
            Statement::Match(Match {
                left: marked,
                right: Expression::Number(MASQUERADE_MARK),
                op: Operator::EQ,
            }),
            Statement::Mangle(Mangle {
                key: meta(MetaKey::Mark),
                value: Expression::BinaryOperation(Box::new(BinaryOperation::XOR(
                    meta(MetaKey::Mark),
                    Expression::Number(MASQUERADE_MARK),
                ))),
            }),
            masquerade(),
        ],
    )
}

/// `jump target`.
fn jump(target: &'static str) -> Vec<Statement<'static>> {
    vec![Statement::Jump(JumpTarget {
        target: target.into(),
    })]
}

/// Gives each rule its identity as its comment: its purpose and a hash of its chain and body
/// (`"accept healthCheckNodePorts #1a2b3c4d"`, FNV-1a of the chain name and the statements'
/// libnftables JSON, 32 bits). The kernel's rules are compared with the wanted ones by comment
/// ([`rule_comments`]), so a kipvs version that changes a rule's body, even with the same
/// purpose, rewrites the rules (`WriteRules`) instead of keeping the old body.
fn identify(bodies: Vec<RuleBody>) -> Vec<RuleBody> {
    bodies
        .into_iter()
        .map(|(chain, purpose, statements)| {
            let body = serde_json::to_vec(&statements).expect("statements serialize");
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for byte in chain.bytes().chain([0]).chain(body) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            let comment = format!("{purpose} #{:08x}", (hash ^ (hash >> 32)) as u32);
            (chain, comment, statements)
        })
        .collect()
}

/// The longest comment `nft` accepts (`NFTNL_UDATA_COMMENT_MAXLEN`), in bytes.
pub const MAX_COMMENT: usize = 128;

/// The comments of `params`' rules, in chain order: what [`parse_table`] reads back and what a
/// sync compares with it. Computed once per [`NftRules`] value.
pub fn rule_comments(params: &NftRules) -> &[String] {
    params.comments_with(|p| p.rules().into_iter().map(|(_, c, _)| c).collect())
}

/// What one nftables transaction does: (re)write the rules, delete and add elements.
#[derive(Clone, Debug, Default)]
pub struct Transaction<'a> {
    /// The rules to write (every chain flushed and refilled), if they changed.
    pub rules: Option<&'a NftRules>,
    /// Elements to delete.
    pub delete: Vec<&'a SetElement>,
    /// Elements to add.
    pub add: Vec<&'a SetElement>,
}

/// The libnftables JSON batch of `tx`. It always (re)declares the table, its sets and chains
/// (`add` is idempotent), so it applies to a kernel without the table; rules are rewritten
/// only when `tx.rules` is set (flush + add of each chain, atomically). Elements are grouped by
/// set, one command per set and verb.
pub fn transaction(tx: &Transaction<'_>) -> Nftables<'static> {
    let mut objects = declarations();
    if let Some(rules) = tx.rules {
        objects.extend(rewritten_rules(rules));
    }
    objects.extend(element_commands(&tx.delete, |_, object| {
        NfCmd::Delete(object)
    }));
    objects.extend(element_commands(&tx.add, add_elements));
    Nftables {
        objects: objects.into(),
    }
}

/// The table, its sets and its chains (`add`: idempotent, so a transaction applies to a kernel
/// without the table).
fn declarations() -> Vec<NfObject<'static>> {
    let mut objects = vec![add(NfListObject::Table(Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }))];
    for (name, set_type, interval) in sets() {
        objects.push(add(NfListObject::Set(Box::new(Set {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: name.into(),
            handle: None,
            set_type,
            policy: None,
            flags: interval.then(|| HashSet::from([SetFlag::Interval])),
            elem: None,
            timeout: None,
            gc_interval: None,
            size: None,
            comment: None,
        }))));
    }
    for (name, base) in CHAINS {
        objects.push(add(NfListObject::Chain(Chain {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: name.into(),
            newname: None,
            handle: None,
            _type: base.map(|b| b.0),
            hook: base.map(|b| b.1),
            prio: base.map(|b| b.2),
            dev: None,
            policy: base.map(|_| NfChainPolicy::Accept),
        })));
    }
    objects
}

/// Every chain flushed, then `rules`' rules added, each with its comment.
fn rewritten_rules(rules: &NftRules) -> Vec<NfObject<'static>> {
    let flushes = CHAINS.iter().map(|(name, _)| {
        NfObject::CmdObject(NfCmd::Flush(nftables::schema::FlushObject::Chain(Chain {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: (*name).into(),
            ..Chain::default()
        })))
    });
    let adds = rules.rules().into_iter().map(|(chain, comment, expr)| {
        add(NfListObject::Rule(Rule {
            family: NfFamily::INet,
            table: TABLE.into(),
            chain: chain.into(),
            expr: expr.into(),
            handle: None,
            index: None,
            comment: Some(comment.into()),
        }))
    });
    flushes.chain(adds).collect()
}

/// `elements` grouped by set, one command per set: `verb` (given the set's name) of its
/// elements.
fn element_commands(
    elements: &[&SetElement],
    verb: fn(&str, NfListObject<'static>) -> NfCmd<'static>,
) -> Vec<NfObject<'static>> {
    let mut by_set: std::collections::BTreeMap<&'static str, Vec<Expression<'static>>> =
        Default::default();
    for e in elements {
        by_set
            .entry(e.set_name())
            .or_default()
            .push(element_expr(e));
    }
    by_set
        .into_iter()
        .map(|(name, elem)| {
            NfObject::CmdObject(verb(
                name,
                NfListObject::Element(Element {
                    family: NfFamily::INet,
                    table: TABLE.into(),
                    name: name.into(),
                    elem: elem.into(),
                }),
            ))
        })
        .collect()
}

/// The command that adds `elements` to the set `set`: `create` (`NLM_F_EXCL`) for the
/// `firewall-allow` intervals, `add` for the others.
///
/// A `firewall-allow` interval that overlaps another of its set must be refused, so that
/// [`super::isolate`] finds it and its virtual server fails closed. Kernels differ when the
/// request lacks `NLM_F_EXCL`: 6.18 refuses a nested interval with `EEXIST`, while Debian 12's
/// 6.1 answers success and leaves the element out (tests/vm/39-firewall-refused.sh). With it,
/// both refuse.
/// `create` also refuses an element that is exactly present; kipvs adds only what its reading of
/// the table lacks, and the dataplane counts such a refusal as applied
/// ([`super::isolate::applied_anyway`]).
fn add_elements(set: &str, elements: NfListObject<'static>) -> NfCmd<'static> {
    if set.starts_with("firewall-allow") {
        NfCmd::Create(elements)
    } else {
        NfCmd::Add(elements)
    }
}

/// The command that deletes the whole table (`kipvs-proxier cleanup`).
pub fn delete_table() -> Nftables<'static> {
    Nftables {
        objects: vec![NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(
            Table {
                family: NfFamily::INet,
                name: TABLE.into(),
                handle: None,
            },
        )))]
        .into(),
    }
}

/// What the kernel's table holds: its set elements and its rules' comments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedTable {
    /// Every element kipvs recognises in its sets.
    pub elements: BTreeSet<SetElement>,
    /// The comments of the rules, in chain order ([`rule_comments`]).
    pub rule_comments: Vec<String>,
}

/// Parses `nft -j list table inet kipvs` output: set elements through the `nftables` crate's
/// expression types, rules by chain and comment only (the crate cannot read back every
/// statement `nft` prints, and kipvs identifies its rules by comment).
///
/// Object by object as the text is read, never the whole listing as a `serde_json::Value`
/// tree: at 10k Services that tree of a 2.1 MiB listing took 40 MiB (issue 32, peak memory);
/// what is held at once is one element's expression ([`ListedSet`]).
///
/// Errors: output that is not libnftables JSON.
pub fn parse_table(json: &str) -> Result<ObservedTable, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Listing {
        nftables: Objects,
    }
    let listing: Listing = serde_json::from_str(json)?;
    Ok(listing.nftables.0)
}

/// A set of an `nft -j` listing with the elements kipvs recognises in it ([`parse_element`]),
/// each parsed as it is read: `nft` prints a set's `name` before its `elem` (elements listed
/// before the name would be held as expressions until it comes).
struct ListedSet {
    table: String,
    elements: Vec<SetElement>,
}

impl<'de> serde::Deserialize<'de> for ListedSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
        /// The elements of set `0`, parsed one expression at a time.
        struct Elements<'a>(&'a str);
        impl<'de> DeserializeSeed<'de> for Elements<'_> {
            type Value = Vec<SetElement>;
            fn deserialize<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
        }
        impl<'de> Visitor<'de> for Elements<'_> {
            type Value = Vec<SetElement>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("set elements")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut elements = Vec::new();
                while let Some(expr) = seq.next_element::<Expression<'static>>()? {
                    elements.extend(parse_element(self.0, &expr));
                }
                Ok(elements)
            }
        }
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = ListedSet;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an nft -j set")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListedSet, A::Error> {
                let (mut name, mut table) = (None::<String>, None::<String>);
                let (mut elements, mut early) = (Vec::new(), Vec::<Expression<'static>>::new());
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match (&*key, &name) {
                        ("name", _) => name = Some(map.next_value()?),
                        ("table", _) => table = Some(map.next_value()?),
                        ("elem", Some(name)) => elements = map.next_value_seed(Elements(name))?,
                        ("elem", None) => early = map.next_value()?,
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                let name = name.ok_or_else(|| A::Error::missing_field("name"))?;
                let table = table.ok_or_else(|| A::Error::missing_field("table"))?;
                elements.extend(early.iter().filter_map(|expr| parse_element(&name, expr)));
                Ok(ListedSet { table, elements })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// The objects of an `nft -j` listing, folded into an [`ObservedTable`] one at a time
/// ([`parse_table`]).
struct Objects(ObservedTable);

impl<'de> serde::Deserialize<'de> for Objects {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A set, a rule, or another object (table, chain, metainfo: skipped unread).
        #[derive(serde::Deserialize)]
        struct Object {
            set: Option<ListedSet>,
            rule: Option<ListedRule>,
        }
        #[derive(serde::Deserialize)]
        struct ListedRule {
            table: String,
            chain: String,
            #[serde(default)]
            comment: Option<String>,
        }
        struct Fold;
        impl<'de> serde::de::Visitor<'de> for Fold {
            type Value = Objects;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the objects of an nft -j listing")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut objects: A,
            ) -> Result<Objects, A::Error> {
                let mut observed = ObservedTable::default();
                let mut rules: Vec<(usize, String)> = Vec::new();
                while let Some(object) = objects.next_element::<Object>()? {
                    if let Some(set) = object.set.filter(|set| set.table == TABLE) {
                        observed.elements.extend(set.elements);
                    }
                    if let Some(rule) = object.rule.filter(|rule| rule.table == TABLE) {
                        let chain = CHAINS
                            .iter()
                            .position(|c| c.0 == rule.chain)
                            .unwrap_or(usize::MAX);
                        rules.push((chain, rule.comment.unwrap_or_default()));
                    }
                }
                // `nft` lists rules chain by chain in creation order; keep that order within a
                // chain.
                rules.sort_by_key(|(chain, _)| *chain);
                observed.rule_comments = rules.into_iter().map(|(_, c)| c).collect();
                Ok(Objects(observed))
            }
        }
        deserializer.deserialize_seq(Fold)
    }
}

/// The sets: name, type, whether it holds intervals.
fn sets() -> Vec<(String, SetTypeValue<'static>, bool)> {
    let key = |addr: SetType| vec![addr, SetType::InetProto, SetType::InetService];
    let mut out = Vec::new();
    for f in FAMILIES {
        let keyed = [
            "cluster-ips",
            "external",
            "external-local",
            "external-no-local",
            "firewall",
        ];
        for name in keyed {
            out.push((
                format!("{name}{}", f.suffix),
                concat_type(key(f.addr)),
                false,
            ));
        }
        let mut allow = key(f.addr);
        allow.push(f.addr);
        out.push((
            format!("firewall-allow{}", f.suffix),
            concat_type(allow),
            true,
        ));
        out.push((
            format!("service-ips{}", f.suffix),
            SetTypeValue::Single(f.addr),
            false,
        ));
        out.push((
            format!("hairpin{}", f.suffix),
            concat_type(vec![f.addr, f.addr]),
            false,
        ));
    }
    out.push((
        "health-check-ports".to_owned(),
        SetTypeValue::Single(SetType::InetService),
        false,
    ));
    out
}

fn concat_type(types: Vec<SetType>) -> SetTypeValue<'static> {
    SetTypeValue::Concatenated(types.into())
}

fn add(object: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(object))
}

fn concat(parts: Vec<Expression<'static>>) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(parts))
}

fn address(ip: IpAddr) -> Expression<'static> {
    Expression::String(ip.to_string().into())
}

fn prefix(net: IpNet) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(address(net.addr())),
        len: net.prefix_len().into(),
    }))
}

fn key_parts(key: &VirtualServerKey) -> [Expression<'static>; 3] {
    [
        address(key.address),
        Expression::String(key.protocol.keyword().into()),
        Expression::Number(key.port.into()),
    ]
}

fn set_ref(name: &str) -> Expression<'static> {
    Expression::String(Cow::Owned(format!("@{name}")))
}

fn ct_state() -> Expression<'static> {
    Expression::Named(NamedExpression::CT(CT {
        key: "state".into(),
        family: None,
        dir: None,
    }))
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

fn matches(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn parse_address(expr: &Expression<'_>) -> Option<IpAddr> {
    match expr {
        Expression::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn parse_key(
    address: &Expression<'_>,
    protocol: &Expression<'_>,
    port: &Expression<'_>,
) -> Option<VirtualServerKey> {
    let protocol = match protocol {
        Expression::String(s) if s == "tcp" => Protocol::Tcp,
        Expression::String(s) if s == "udp" => Protocol::Udp,
        Expression::String(s) if s == "sctp" => Protocol::Sctp,
        Expression::Number(6) => Protocol::Tcp,
        Expression::Number(17) => Protocol::Udp,
        Expression::Number(132) => Protocol::Sctp,
        _ => return None,
    };
    let Expression::Number(port) = port else {
        return None;
    };
    Some(VirtualServerKey {
        address: parse_address(address)?,
        port: u16::try_from(*port).ok()?,
        protocol,
    })
}

fn parse_net(expr: &Expression<'_>) -> Option<IpNet> {
    match expr {
        Expression::Named(NamedExpression::Prefix(p)) => {
            IpNet::new(parse_address(&p.addr)?, u8::try_from(p.len).ok()?).ok()
        }
        single => parse_address(single).map(IpNet::from),
    }
}

/// Errors of `nft`: running it ([`ProgramError`]) or reading what it printed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be run, refused the transaction or the listing (nothing was changed),
    /// or was killed after [`NFT_TIMEOUT`] (a transaction may or may not have been committed:
    /// the next sync reads the table again).
    #[error(transparent)]
    Program(#[from] ProgramError),
    /// `nft -j list` printed something that is not libnftables JSON.
    #[error("cannot parse nft output: {0}")]
    Parse(#[from] serde_json::Error),
}

/// How long one `nft` process may run before it is killed, so that a hung one cannot stall
/// the sync loop; far above the slowest transaction seen in the emulated test VM.
pub const NFT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs the `nft` executable (`NFT` in the environment, else `nft` from `PATH`).
///
/// The `nftables` crate's helpers do the same but let `nft`'s stderr go to the proxier's own
/// stderr; here it becomes part of the error, so a refused transaction is logged and counted
/// with its reason.
#[derive(Clone, Debug)]
pub struct Nft {
    program: Program,
}

impl Default for Nft {
    fn default() -> Self {
        Nft {
            program: Program {
                name: std::env::var("NFT").unwrap_or_else(|_| "nft".to_owned()),
                timeout: NFT_TIMEOUT,
            },
        }
    }
}

impl Nft {
    /// Runs `nft` with `args` (and `stdin`), killed after [`NFT_TIMEOUT`]; its stdout.
    async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<String, NftError> {
        Ok(self.program.run(args, stdin).await?)
    }

    /// Applies a batch as one atomic transaction (`nft -j -f -`): all of it or nothing.
    pub async fn apply(&self, batch: &Nftables<'_>) -> Result<(), NftError> {
        let payload = serde_json::to_vec(batch)?;
        self.run(&["-j", "-f", "-"], Some(&payload)).await.map(drop)
    }

    /// Sends a batch in check mode (`nft -c -j -f -`): the kernel validates every object and
    /// expression of it and aborts the transaction, so nothing is written
    /// ([`crate::dataplane::kernel::preflight`]).
    ///
    /// # Errors
    /// [`NftError`] with `nft`'s answer when the kernel refuses part of it.
    pub async fn check(&self, batch: &Nftables<'_>) -> Result<(), NftError> {
        let payload = serde_json::to_vec(batch)?;
        self.run(&["-c", "-j", "-f", "-"], Some(&payload))
            .await
            .map(drop)
    }

    /// An `nft` run as `program` (a scripted one in tests).
    #[cfg(test)]
    pub fn with_program(program: Program) -> Self {
        Nft { program }
    }

    /// Reads kipvs's table; an empty [`ObservedTable`] when it does not exist.
    ///
    /// The listing is parsed on Tokio's blocking pool ([`tokio::task::spawn_blocking`]): at
    /// 10k Services its 2.1 MiB take the CPU for a while (hundreds of ms in the emulated test
    /// VM), and on a node with one CPU the runtime has one worker, which the engine's
    /// incremental syncs need meanwhile (issue 32: the writes that waited near a full sync).
    pub async fn observe(&self) -> Result<ObservedTable, NftError> {
        match self
            .run(&["-j", "list", "table", "inet", TABLE], None)
            .await
        {
            Ok(json) => tokio::task::spawn_blocking(move || parse_table(&json))
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
                .map_err(NftError::from),
            Err(NftError::Program(ProgramError::Failed { stderr, .. }))
                if stderr.contains("No such file or directory") =>
            {
                Ok(ObservedTable::default())
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes kipvs's table (`cleanup`); not an error when it does not exist.
    pub async fn delete_table(&self) -> Result<(), NftError> {
        match self.apply(&delete_table()).await {
            Err(NftError::Program(ProgramError::Failed { stderr, .. }))
                if stderr.contains("No such file or directory") =>
            {
                Ok(())
            }
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A missing table reads as empty; any other failure to read it is an error (the sync
    /// fails and is retried), never an empty table that would hide stale elements.
    #[tokio::test]
    async fn table_read_failure_is_an_error_and_a_missing_table_is_empty() {
        let dir = std::env::temp_dir().join(format!("kipvs-nft-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = |name: &str, body: &str| {
            let path = dir.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            Nft {
                program: Program {
                    name: path.to_string_lossy().into_owned(),
                    timeout: NFT_TIMEOUT,
                },
            }
        };
        let missing = script(
            "missing",
            "echo 'Error: No such file or directory; did you mean table kipvs?' >&2; exit 1",
        );
        assert_eq!(missing.observe().await.unwrap(), ObservedTable::default());
        let refused = script(
            "refused",
            "echo 'Error: Operation not permitted' >&2; exit 1",
        );
        assert!(matches!(
            refused.observe().await,
            Err(NftError::Program(ProgramError::Failed { .. }))
        ));
        let garbage = script("garbage", "echo 'not json'");
        assert!(matches!(garbage.observe().await, Err(NftError::Parse(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Issue 32: the listing of a large table is parsed off the runtime's worker, so that the
    /// engine's other tasks run meanwhile (on a one-CPU node the runtime has one worker; here
    /// the test's runtime has one thread).
    #[tokio::test]
    async fn a_large_listing_is_parsed_beside_the_runtimes_other_tasks() {
        let dir = std::env::temp_dir().join(format!("kipvs-nft-large-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let elements: Vec<String> = (0..20_000u32)
            .map(|i| {
                let [_, a, b, c] = i.to_be_bytes();
                format!(r#"{{"concat": ["10.{a}.{b}.{c}", "tcp", 80]}}"#)
            })
            .collect();
        let listing = format!(
            r#"{{"nftables": [{{"metainfo": {{"json_schema_version": 1}}}}, {{"set": {{"family": "inet", "name": "cluster-ips", "table": "kipvs", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 3, "elem": [{}]}}}}]}}"#,
            elements.join(", ")
        );
        let listing_path = dir.join("listing.json");
        std::fs::write(&listing_path, listing).unwrap();
        let program = dir.join("nft");
        let body = format!(
            "#!/bin/sh
exec cat {}
",
            listing_path.display()
        );
        std::fs::write(&program, body).unwrap();
        std::fs::set_permissions(
            &program,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let nft = Nft {
            program: Program {
                name: program.to_string_lossy().into_owned(),
                timeout: NFT_TIMEOUT,
            },
        };
        // A task that should run every millisecond: the longest it waited is how long the
        // runtime's thread was held.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut longest = Duration::ZERO;
                let mut last = std::time::Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    longest = longest.max(last.elapsed());
                    last = std::time::Instant::now();
                }
                longest
            }
        });
        let started = std::time::Instant::now();
        let table = nft.observe().await.unwrap();
        let took = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let longest = ticker.await.unwrap();
        assert_eq!(table.elements.len(), 20_000);
        assert!(
            longest < took / 4,
            "the runtime was held {longest:?} of the {took:?} the listing took"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Issue 23: a hung `nft` stalled the sync loop; it is killed after the timeout, and the
    /// call is an error.
    #[tokio::test]
    async fn a_hung_nft_is_killed_after_its_timeout() {
        let dir = std::env::temp_dir().join(format!("kipvs-nft-hung-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("hung.pid");
        let program = dir.join("hung");
        let body = format!(
            "#!/bin/sh\necho $$ > {}; exec sleep 600\n",
            pid_file.display()
        );
        std::fs::write(&program, body).unwrap();
        std::fs::set_permissions(
            &program,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let hung = Nft {
            program: Program {
                name: program.to_string_lossy().into_owned(),
                timeout: Duration::from_millis(300),
            },
        };
        let started = std::time::Instant::now();
        let error = hung.apply(&delete_table()).await.unwrap_err();
        assert!(
            matches!(error, NftError::Program(ProgramError::Timeout { .. })),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
        for _ in 0..50 {
            // Killed and reaped (tokio reaps an orphaned child in the background).
            if !proc.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!proc.exists(), "the hung nft still runs");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `firewall-allow` intervals are added with `create` (`NLM_F_EXCL`: every kernel refuses
    /// an overlap), the other elements with `add`; deletions are `delete`.
    #[test]
    fn firewall_allow_intervals_are_created_and_other_elements_added() {
        let lb = VirtualServerKey {
            address: "203.0.113.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let allow = SetElement::FirewallAllow(lb, "192.168.100.0/24".parse().unwrap());
        let allow6 = SetElement::FirewallAllow(
            VirtualServerKey {
                address: "fd00:203::10".parse().unwrap(),
                ..lb
            },
            "fd00:1::/64".parse().unwrap(),
        );
        let firewall = SetElement::Firewall(lb);
        let tx = Transaction {
            rules: None,
            delete: vec![&allow],
            add: vec![&firewall, &allow, &allow6],
        };
        let verbs: Vec<(String, String)> = transaction(&tx)
            .objects
            .iter()
            .filter_map(|object| {
                let json = serde_json::to_value(object).unwrap();
                let (verb, body) = json.as_object()?.iter().next()?;
                let set = body.get("element")?.get("name")?.as_str()?;
                Some((verb.clone(), set.to_owned()))
            })
            .collect();
        let verbs: Vec<(&str, &str)> = verbs.iter().map(|(v, s)| (&**v, &**s)).collect();
        assert_eq!(
            verbs,
            [
                ("delete", "firewall-allow"),
                ("add", "firewall"),
                ("create", "firewall-allow"),
                ("create", "firewall-allow-v6"),
            ]
        );
    }

    /// The rule order is part of the contract with the kernel (a restart compares comments):
    /// marks, masquerade, then per family: the source-range drop, the rejection of outside
    /// clients of `externalTrafficPolicy: Local` without local endpoints, the health-check
    /// accept (every address), the reject.
    #[test]
    fn rules_are_constant_and_in_chain_order() {
        let rules = NftRules::new(vec!["10.244.0.0/16".parse().unwrap()], false);
        let purposes: Vec<&str> = rule_comments(&rules)
            .iter()
            .map(|c| c.rsplit_once(" #").expect("identity hash").0)
            .collect();
        assert_eq!(
            purposes,
            [
                "mark service traffic to masquerade",
                "IPv4: ClusterIP connections keep their destination (no hostPort DNAT)",
                "IPv6: ClusterIP connections keep their destination (no hostPort DNAT)",
                "mark service traffic to masquerade",
                "IPv4: ClusterIP connections keep their destination (no hostPort DNAT)",
                "IPv6: ClusterIP connections keep their destination (no hostPort DNAT)",
                "mark service traffic to masquerade",
                "mark service traffic to masquerade",
                "IPv4: externalTrafficPolicy Cluster",
                "IPv4: ClusterIP connections the node opens from a service IP",
                "IPv4: ClusterIP connections from outside the cluster CIDRs",
                "IPv6: externalTrafficPolicy Cluster",
                "IPv6: ClusterIP connections the node opens from a service IP",
                "masquerade marked traffic (mark 0x4000)",
                "IPv4: masquerade hairpin traffic (an endpoint reaching itself)",
                "IPv6: masquerade hairpin traffic (an endpoint reaching itself)",
                "IPv4: drop sources outside loadBalancerSourceRanges",
                "IPv4: reject outside clients of externalTrafficPolicy Local without local endpoints",
                "IPv4: accept healthCheckNodePorts, load-balancer IPs included",
                "IPv4: reject new connections to service IPs on other ports",
                "IPv6: drop sources outside loadBalancerSourceRanges",
                "IPv6: reject outside clients of externalTrafficPolicy Local without local endpoints",
                "IPv6: accept healthCheckNodePorts, load-balancer IPs included",
                "IPv6: reject new connections to service IPs on other ports",
                "IPv4: drop node traffic outside loadBalancerSourceRanges",
                "IPv6: drop node traffic outside loadBalancerSourceRanges",
            ]
        );
        assert_eq!(rule_comments(&NftRules::new(vec![], true)).len(), 25);
    }

    /// Issue 34: each `detectLocalMode` gives kube-proxy's "not local" match in the ClusterIP
    /// masquerade rule (`JumpIfNotLocal`): `! -s CIDR` per family, `! -i bridge`,
    /// `! -i prefix+`. Before, only `clusterCIDR` was matched, whatever the mode.
    #[test]
    fn local_traffic_detectors_give_kube_proxys_not_local_match() {
        let not_local = |local: LocalTraffic, family: &str| -> Option<serde_json::Value> {
            let rules = NftRules::detecting(local, false);
            let (_, _, statements) = rules.bodies().into_iter().find(|(chain, purpose, _)| {
                *chain == "mark-masquerade"
                    && purpose.starts_with(family)
                    && (purpose.contains("outside the") || purpose.contains("not from"))
            })?;
            assert_eq!(statements.len(), 3, "cluster-ips, not local, mark");
            Some(serde_json::to_value(&statements[1]).unwrap())
        };
        let iifname = |name: &str| serde_json::json!({"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": name}});
        let saddr = |proto: &str, cidr: &str| {
            let (addr, len) = cidr.split_once('/').unwrap();
            serde_json::json!({"match": {
                "op": "!=",
                "left": {"payload": {"protocol": proto, "field": "saddr"}},
                "right": {"set": [{"prefix": {"addr": addr, "len": len.parse::<u32>().unwrap()}}]},
            }})
        };
        let node = LocalTraffic::NodeCidrs(vec![
            "10.244.3.0/24".parse().unwrap(),
            "fd00:10:244:3::/64".parse().unwrap(),
        ]);
        assert_eq!(
            not_local(node.clone(), "IPv4"),
            Some(saddr("ip", "10.244.3.0/24"))
        );
        assert_eq!(
            not_local(node, "IPv6"),
            Some(saddr("ip6", "fd00:10:244:3::/64"))
        );
        // A family without a CIDR detects nothing (kube-proxy's no-op detector).
        let v4_only = LocalTraffic::ClusterCidrs(vec!["10.244.0.0/16".parse().unwrap()]);
        assert_eq!(
            not_local(v4_only.clone(), "IPv4"),
            Some(saddr("ip", "10.244.0.0/16"))
        );
        assert_eq!(not_local(v4_only, "IPv6"), None);
        for family in ["IPv4", "IPv6"] {
            assert_eq!(
                not_local(LocalTraffic::BridgeInterface("cbr0".into()), family),
                Some(iifname("cbr0"))
            );
            assert_eq!(
                not_local(LocalTraffic::InterfaceNamePrefix("veth".into()), family),
                Some(iifname("veth*"))
            );
        }
        // The same detector tells pods from outside clients for externalTrafficPolicy Local
        // without local endpoints.
        let rules = NftRules::detecting(LocalTraffic::InterfaceNamePrefix("veth".into()), false);
        let reject = rules
            .bodies()
            .into_iter()
            .find(|(_, purpose, _)| purpose.starts_with("IPv4: reject outside clients"))
            .map(|(_, _, statements)| serde_json::to_value(statements).unwrap())
            .unwrap();
        assert!(
            reject.as_array().unwrap().contains(&iifname("veth*")),
            "{reject}"
        );
    }

    /// However many cluster CIDRs a cluster has, every rule comment fits what `nft` accepts
    /// (a comment holding the CIDR list made the rules unwritable past ~250 bytes).
    #[test]
    fn comments_fit_nft_whatever_the_cluster_cidrs() {
        let cidrs: Vec<IpNet> = (0..40)
            .flat_map(|i| {
                [
                    format!("10.{i}.0.0/16").parse().unwrap(),
                    format!("fd00:{i:x}:ffff:ffff::/64").parse().unwrap(),
                ]
            })
            .collect();
        let rules = NftRules::new(cidrs, false);
        for comment in rule_comments(&rules) {
            assert!(
                comment.len() <= MAX_COMMENT,
                "{} bytes: {comment}",
                comment.len()
            );
        }
    }

    /// An upgrade that changes a rule's body but not its purpose still rewrites the rules: the
    /// comment carries a hash of the body, so the kernel's old rule no longer matches.
    #[test]
    fn changed_rule_body_yields_write_rules() {
        use crate::dataplane::Op;
        use crate::dataplane::diff::{Ownership, diff};
        use crate::model::{DesiredState, ObservedState};
        let desired = DesiredState {
            nft_rules: NftRules::new(vec!["10.244.0.0/16".parse().unwrap()], false),
            ..Default::default()
        };
        let converged = ObservedState::from(&desired);
        assert!(diff(&desired, &converged, &Ownership::default()).is_empty());
        // What an older kipvs wrote: the same rules but the masquerade without `fully-random`.
        let mut older = desired.nft_rules.bodies();
        let masquerade = older
            .iter_mut()
            .find(|(chain, ..)| *chain == "nat-postrouting")
            .expect("masquerade rule");
        *masquerade.2.last_mut().unwrap() = Statement::Masquerade(None);
        let older: Vec<String> = identify(older).into_iter().map(|(_, c, _)| c).collect();
        let changed: Vec<usize> = (0..older.len())
            .filter(|&i| older[i] != rule_comments(&desired.nft_rules)[i])
            .collect();
        assert_eq!(changed.len(), 1, "only the changed rule's identity differs");
        let kernel = ObservedState {
            nft_rule_comments: older,
            ..converged
        };
        assert_eq!(
            diff(&desired, &kernel, &Ownership::default()),
            [Op::WriteRules(desired.nft_rules.clone())]
        );
    }
}

//! What kipvs's table holds: its name ([`TABLE`]), its chains and sets, and the constant rules
//! of an [`NftRules`], each identified by its comment ([`rule_comments`]), as values of the
//! `nftables` crate; with the expression builders the codec shares.

use crate::model::{LocalTraffic, NftRules, Protocol, SetElement, VirtualServerKey};
use ipnet::IpNet;
use nftables::expr::{BinaryOperation, CT, Expression, Meta, MetaKey, NamedExpression};
use nftables::expr::{Fib, FibFlag, FibResult};
use nftables::expr::{Payload, PayloadField, Prefix, SetItem};
use nftables::schema::{SetType, SetTypeValue};
use nftables::stmt::{JumpTarget, Mangle, Match, NAT, NATFamily, NATFlag, Operator, Statement};
use nftables::types::{NfChainType, NfHook};
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;

/// The table kipvs owns (family `inet`, both IP families).
pub const TABLE: &str = "kipvs";

/// The chains kipvs creates: name and, for base chains, type, hook and priority. The marks are
/// set at `dstnat` (-100) in `prerouting` and `output`, before IPVS sees the packet (its
/// `LOCAL_IN` hook is at 98, its `LOCAL_OUT` hook at -98), on the virtual address; the
/// masquerade happens at `srcnat` (100). The filters run at `filter` (0) in `input`, before
/// IPVS's `LOCAL_IN` hook, and at -150 in `output`, before its `LOCAL_OUT` hook. The `pin-`
/// chains run first of all NAT chains ([`PIN_PRIORITY`]): they mark too, then bind ClusterIP
/// connections to their own destination.
pub(super) const CHAINS: [(&str, Option<BaseChain>); 8] = [
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
    pub(super) fn rules(&self) -> Vec<RuleBody> {
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

/// The comments of `params`' rules, in chain order: what [`super::codec::parse_table`] reads back and what a
/// sync compares with it. Computed once per [`NftRules`] value.
pub fn rule_comments(params: &NftRules) -> &[String] {
    params.comments_with(|p| p.rules().into_iter().map(|(_, c, _)| c).collect())
}

/// The nft names of the model's values: a set element's set, a protocol's keyword.
impl SetElement {
    /// The name of the set this element belongs to.
    pub fn set_name(&self) -> &'static str {
        let (v4, v6) = match self {
            SetElement::ClusterIp(_) => ("cluster-ips", "cluster-ips-v6"),
            SetElement::External(_) => ("external", "external-v6"),
            SetElement::ExternalLocal(_) => ("external-local", "external-local-v6"),
            SetElement::ExternalNoLocal(_) => ("external-no-local", "external-no-local-v6"),
            SetElement::ServiceIp(_) => ("service-ips", "service-ips-v6"),
            SetElement::Hairpin(_) => ("hairpin", "hairpin-v6"),
            SetElement::Firewall(_) => ("firewall", "firewall-v6"),
            SetElement::FirewallAllow(..) => ("firewall-allow", "firewall-allow-v6"),
            SetElement::HealthCheckNodePort(_) => return "health-check-ports",
        };
        if self.is_ipv6() { v6 } else { v4 }
    }
}

impl Protocol {
    /// The protocol's lower-case name, as `nft` writes it: `tcp`, `udp` or `sctp`.
    pub fn keyword(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// The sets: name, type, whether it holds intervals.
pub(super) fn sets() -> Vec<(String, SetTypeValue<'static>, bool)> {
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

pub(super) fn concat(parts: Vec<Expression<'static>>) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(parts))
}

pub(super) fn address(ip: IpAddr) -> Expression<'static> {
    Expression::String(ip.to_string().into())
}

pub(super) fn prefix(net: IpNet) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(address(net.addr())),
        len: net.prefix_len().into(),
    }))
}

pub(super) fn key_parts(key: &VirtualServerKey) -> [Expression<'static>; 3] {
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

#[cfg(test)]
mod tests {
    use super::*;

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

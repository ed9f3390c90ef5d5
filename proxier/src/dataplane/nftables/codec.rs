//! libnftables JSON both ways: a [`Transaction`] as one `nft -j -f -` batch ([`transaction`]),
//! the table's deletion ([`delete_table`]), and an `nft -j list` listing read back
//! ([`parse_table`], [`parse_element`]).

use super::rules::{CHAINS, TABLE, address, concat, key_parts, prefix, sets};
use crate::model::{NftRules, Protocol, SetElement, VirtualServerKey};
use ipnet::IpNet;
use nftables::expr::{Expression, NamedExpression};
use nftables::schema::{
    Chain, Element, NfCmd, NfListObject, NfObject, Nftables, Rule, Set, SetFlag, Table,
};
use nftables::types::{NfChainPolicy, NfFamily};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::net::IpAddr;

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

impl SetElement {
    /// The element alone in `nft` syntax (`203.0.113.77 . tcp . 443`).
    pub fn element_text(&self) -> String {
        let key =
            |k: &VirtualServerKey| format!("{} . {} . {}", k.address, k.protocol.keyword(), k.port);
        match self {
            SetElement::ClusterIp(k)
            | SetElement::External(k)
            | SetElement::ExternalLocal(k)
            | SetElement::ExternalNoLocal(k)
            | SetElement::Firewall(k) => key(k),
            SetElement::FirewallAllow(k, net) => format!("{} . {net}", key(k)),
            SetElement::ServiceIp(ip) => ip.to_string(),
            SetElement::Hairpin(ip) => format!("{ip} . {ip}"),
            SetElement::HealthCheckNodePort(port) => port.to_string(),
        }
    }
}

impl fmt::Display for SetElement {
    /// `set { element }` (`external { 203.0.113.77 . tcp . 443 }`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{ {} }}", self.set_name(), self.element_text())
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
    /// The comments of the rules, in chain order ([`super::rules::rule_comments`]).
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
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

fn add(object: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(object))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

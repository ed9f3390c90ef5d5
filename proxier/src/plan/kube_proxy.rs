//! What of kube-proxy's IPVS mode a takeover removes from a node: its iptables jumps, chains and
//! rules, and its ipsets. Pure: the input is what `iptables-save` (each family, each backend)
//! and `ipset list -n` print, the output the `iptables-restore --noflush` input and the set
//! names to destroy; `dataplane::host::kube_proxy` runs the tools.
//!
//! The names are the union of kube-proxy's IPVS mode from 1.20 to the current release
//! (`pkg/proxy/ipvs/proxier.go`: `iptablesJumpChain`, `iptablesChains`,
//! `iptablesEnsureChains`; `pkg/proxy/ipvs/ipset.go`; kubernetes#108460, #110628, #119791 for
//! the later filter chains and `KUBE-IPVS-IPS`). IPv6 sets are named `KUBE-6-…`, cut to 31
//! characters (`ipset.go`, `NewIPSet`).
//!
//! kubelet before 1.28 owns chains of the same names (`pkg/kubelet/kubelet_network_linux.go`:
//! nat `KUBE-MARK-MASQ`, `KUBE-POSTROUTING`, `KUBE-MARK-DROP`; it also has filter
//! `KUBE-FIREWALL` and its canary `KUBE-KUBELET-CANARY`, which it keeps creating from 1.28 on).
//! kubelet 1.28 no longer creates the three nat chains (`IPTablesOwnershipCleanup`, GA in 1.28),
//! so its canary no longer says who owns them: [`kubelet_creates_shared_chains`] decides from
//! the Node's `status.nodeInfo.kubeletVersion`, and an unknown version counts as before 1.28
//! (conservative: kube-proxy's copies stay, where deleting kubelet's would break its
//! masquerading). When kubelet creates them and a ruleset holds its canary, those chains and
//! the jumps to them stay, and only the rules kube-proxy added in them (those that match one of
//! its ipsets or jump to one of its removed chains) go. Otherwise (kubelet 1.28+, or no
//! canary) the shared names are kube-proxy's and go.
//! filter `KUBE-FIREWALL` and the canary are never kube-proxy's and always stay.
//!
//! A filter table whose `FORWARD` policy is not `ACCEPT` (Docker sets it to `DROP`) relies on
//! kube-proxy's `KUBE-FORWARD` accepts (mark `0x4000`, which kipvs's rules set too, and
//! established connections; upstream `proxier.go`: NodePort traffic "is forwarded even if the
//! default FORWARD policy is not accept"), and one whose `INPUT` policy is not `ACCEPT` on its
//! filter `KUBE-NODE-PORT` accept of the health-check NodePorts (set
//! `KUBE-HEALTH-CHECK-NODE-PORT`): an accept in kipvs's nftables table cannot override a drop
//! in `ip filter`, so those chains, the jumps to them and the sets their rules match stay
//! ([`IptablesRemoval::kept_for_policy`]). IPVS, the
//! `kube-ipvs0` link and its addresses are not touched here (the proxier adopts them).

use std::collections::BTreeSet;
use std::fmt;

/// kubelet's canary chain: its presence in a ruleset says kubelet manages the shared chains.
pub const KUBELET_CANARY: &str = "KUBE-KUBELET-CANARY";

/// kube-proxy's chains in the nat table, 1.20 to current (IPVS mode).
const NAT_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-FIREWALL",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
    "KUBE-MARK-DROP",
];

/// kube-proxy's chains in the filter table, 1.20 to current (IPVS mode).
const FILTER_CHAINS: &[&str] = &[
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// Chains of kube-proxy's names that kubelet owns while its canary is there, by table.
const KUBELET_CHAINS: &[(&str, &str)] = &[
    ("nat", "KUBE-MARK-MASQ"),
    ("nat", "KUBE-POSTROUTING"),
    ("nat", "KUBE-MARK-DROP"),
];

/// Whether kubelet of `kubelet_version` (`status.nodeInfo.kubeletVersion`: `v1.27.3`,
/// `v1.28.2-eks-1`) creates nat `KUBE-MARK-MASQ`, `KUBE-POSTROUTING` and `KUBE-MARK-DROP`: a
/// version before 1.28, and an unknown or unreadable one (see the module docs).
pub fn kubelet_creates_shared_chains(kubelet_version: Option<&str>) -> bool {
    let minor = kubelet_version.and_then(|v| {
        let mut parts = v.trim_start_matches('v').split('.');
        let major: u32 = parts.next()?.parse().ok()?;
        let minor = parts.next()?;
        let digits = minor
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(minor.len());
        Some((major, minor[..digits].parse::<u32>().ok()?))
    });
    minor.is_none_or(|version| version < (1, 28))
}

/// kube-proxy's ipsets (IPv4 names), 1.24 to current (IPVS mode).
const IPSETS: &[&str] = &[
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// The IPv6 name kube-proxy gives the set `name` (`KUBE-` → `KUBE-6-`, cut to 31 characters).
pub fn ipv6_set_name(name: &str) -> String {
    let mut v6 = name.replacen("KUBE-", "KUBE-6-", 1);
    v6.truncate(31);
    v6
}

/// Whether `name` is one of kube-proxy's ipsets (either family).
pub fn is_kube_proxy_set(name: &str) -> bool {
    IPSETS
        .iter()
        .any(|set| *set == name || ipv6_set_name(set) == name)
}

/// One rule as `iptables-save` prints it: `-A CHAIN SPEC`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its chain.
    pub chain: String,
    /// The rest of the line after `-A CHAIN `, as `iptables-restore` reads it back.
    pub spec: String,
}

/// One table of an `iptables-save` output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// `nat`, `filter`, `mangle`, ...
    pub name: String,
    /// Every chain declared (`:NAME POLICY [p:b]`), built-in ones included.
    pub chains: Vec<String>,
    /// The policies of the built-in chains (`ACCEPT`, `DROP`), by chain.
    pub policies: Vec<(String, String)>,
    /// Every rule, in order.
    pub rules: Vec<Rule>,
}

/// Parse an `iptables-save` / `ip6tables-save` output (either backend).
///
/// # Errors
/// A rule or chain line outside a table, or a rule line without a chain.
pub fn parse_save(text: &str) -> Result<Vec<Table>, String> {
    let mut tables: Vec<Table> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            tables.push(Table {
                name: name.to_owned(),
                ..Table::default()
            });
            continue;
        }
        let table = tables
            .last_mut()
            .ok_or_else(|| format!("line {}: {line:?} outside a table", n + 1))?;
        if let Some(chain) = line.strip_prefix(':') {
            let mut fields = chain.split_whitespace();
            let name = fields.next().unwrap_or_default();
            if let Some(policy) = fields.next().filter(|p| *p != "-") {
                table.policies.push((name.to_owned(), policy.to_owned()));
            }
            table.chains.push(name.to_owned());
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, spec) = rule
                .split_once(' ')
                .ok_or_else(|| format!("line {}: a rule without a match: {line:?}", n + 1))?;
            table.rules.push(Rule {
                chain: chain.to_owned(),
                spec: spec.to_owned(),
            });
        } else {
            return Err(format!(
                "line {}: not iptables-save output: {line:?}",
                n + 1
            ));
        }
    }
    Ok(tables)
}

/// Words of a rule spec, with `"..."` kept as one word (as `iptables-restore` splits it).
fn words(spec: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = spec.trim_start();
    while !rest.is_empty() {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            quoted.find('"').map_or(rest.len(), |i| i + 2)
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        out.push(rest[..end].trim_matches('"'));
        rest = rest[end..].trim_start();
    }
    out
}

/// The chain a rule jumps or goes to (`-j`/`--jump`/`-g`/`--goto`), if any.
fn target(spec: &str) -> Option<&str> {
    let words = words(spec);
    words
        .windows(2)
        .find(|w| matches!(w[0], "-j" | "--jump" | "-g" | "--goto"))
        .map(|w| w[1])
}

/// The ipsets a rule matches (`--match-set NAME`).
fn matched_sets(spec: &str) -> impl Iterator<Item = &str> {
    let words = words(spec);
    let sets: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--match-set")
        .map(|w| w[1])
        .collect();
    sets.into_iter()
}

/// What a takeover removes from one ruleset (one family, one backend), table by table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IptablesRemoval {
    /// Rules deleted from chains that stay: jumps to kube-proxy's chains, kube-proxy's rules
    /// in kubelet's chains. (table, rule)
    pub rules: Vec<(String, Rule)>,
    /// kube-proxy's chains, flushed then deleted. (table, chain)
    pub chains: Vec<(String, String)>,
    /// Chains of kube-proxy's names that stay because kubelet owns them. (table, chain)
    pub kept: Vec<(String, String)>,
    /// kube-proxy's filter chains that stay, with the jumps to them, because a built-in
    /// chain's policy is not `ACCEPT` (see the module docs). (chain, why: `FORWARD policy
    /// DROP`)
    pub kept_for_policy: Vec<(String, String)>,
    /// The ipsets the rules of `kept_for_policy` match: they stay too.
    pub kept_sets: BTreeSet<String>,
}

impl IptablesRemoval {
    /// Whether nothing is to be removed.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.chains.is_empty()
    }

    /// The `iptables-restore --noflush` input that removes it: per table, the rule deletions,
    /// then every chain flushed, then every chain deleted (a chain referenced by another
    /// removed one is deleted only once both are flushed), then `COMMIT`. Empty when nothing is
    /// to be removed.
    pub fn restore_input(&self) -> String {
        let mut tables: Vec<&str> = self
            .rules
            .iter()
            .map(|(t, _)| t.as_str())
            .chain(self.chains.iter().map(|(t, _)| t.as_str()))
            .collect();
        tables.sort_unstable();
        tables.dedup();
        let mut out = String::new();
        for table in tables {
            out.push_str(&format!("*{table}\n"));
            for (_, rule) in self.rules.iter().filter(|(t, _)| t == table) {
                out.push_str(&format!("-D {} {}\n", rule.chain, rule.spec));
            }
            let chains = self.chains.iter().filter(|(t, _)| t == table);
            for (_, chain) in chains.clone() {
                out.push_str(&format!("-F {chain}\n"));
            }
            for (_, chain) in chains {
                out.push_str(&format!("-X {chain}\n"));
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

impl fmt::Display for IptablesRemoval {
    /// One line per removal: `-D table CHAIN SPEC`, `-X table CHAIN`, `kept table CHAIN ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (table, rule) in &self.rules {
            writeln!(f, "-D {table} {} {}", rule.chain, rule.spec)?;
        }
        for (table, chain) in &self.chains {
            writeln!(f, "-X {table} {chain}")?;
        }
        for (table, chain) in &self.kept {
            writeln!(f, "kept {table} {chain} (kubelet's)")?;
        }
        for (chain, why) in &self.kept_for_policy {
            writeln!(
                f,
                "kept filter {chain} ({why}: it accepts what the policy drops)"
            )?;
        }
        Ok(())
    }
}

/// kube-proxy's filter chains that accept what a built-in chain's policy other than `ACCEPT`
/// drops: (built-in chain, kube-proxy's chain).
const POLICY_ACCEPTS: &[(&str, &str)] = &[("FORWARD", "KUBE-FORWARD"), ("INPUT", "KUBE-NODE-PORT")];

/// What of `tables` (one `iptables-save` output) is kube-proxy's and goes (see the module
/// docs for kubelet's chains and the chains a policy keeps); `kubelet_chains`: whether kubelet
/// creates the shared nat chains ([`kubelet_creates_shared_chains`]).
pub fn iptables_removal(tables: &[Table], kubelet_chains: bool) -> IptablesRemoval {
    let kubelet = kubelet_chains
        && tables
            .iter()
            .any(|t| t.chains.iter().any(|c| c == KUBELET_CANARY));
    let mut removal = IptablesRemoval::default();
    for table in tables {
        let names: &[&str] = match table.name.as_str() {
            "nat" => NAT_CHAINS,
            "filter" => FILTER_CHAINS,
            _ => &[],
        };
        let mut removed: BTreeSet<&str> = BTreeSet::new();
        let mut kept_for_policy: BTreeSet<&str> = BTreeSet::new();
        for chain in &table.chains {
            if !names.contains(&chain.as_str()) {
                continue;
            }
            let pair = (table.name.clone(), chain.clone());
            let dropping = (table.name == "filter")
                .then(|| {
                    let (builtin, _) = POLICY_ACCEPTS.iter().find(|(_, c)| c == chain)?;
                    let (_, policy) = table.policies.iter().find(|(c, _)| c == builtin)?;
                    (policy != "ACCEPT").then(|| format!("{builtin} policy {policy}"))
                })
                .flatten();
            if let Some(why) = dropping {
                kept_for_policy.insert(chain);
                removal.kept_for_policy.push((chain.clone(), why));
            } else if kubelet && KUBELET_CHAINS.contains(&(table.name.as_str(), chain.as_str())) {
                removal.kept.push(pair);
            } else {
                removed.insert(chain);
                removal.chains.push(pair);
            }
        }
        for rule in &table.rules {
            if kept_for_policy.contains(rule.chain.as_str()) {
                let sets = matched_sets(&rule.spec).map(str::to_owned);
                removal.kept_sets.extend(sets);
                continue;
            }
            if removed.contains(rule.chain.as_str()) {
                continue; // flushed with its chain
            }
            let jumps = target(&rule.spec).is_some_and(|t| removed.contains(t));
            let matches = matched_sets(&rule.spec).any(is_kube_proxy_set);
            if jumps || matches {
                removal.rules.push((table.name.clone(), rule.clone()));
            }
        }
    }
    removal
}

/// kube-proxy's sets among `names` (one per line, as `ipset list -n` prints them), in order,
/// but those in `kept` (rules that stay match them: [`IptablesRemoval::kept_sets`]).
pub fn ipsets_to_destroy(names: &str, kept: &BTreeSet<String>) -> Vec<String> {
    names
        .lines()
        .map(str::trim)
        .filter(|name| is_kube_proxy_set(name) && !kept.contains(*name))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests;

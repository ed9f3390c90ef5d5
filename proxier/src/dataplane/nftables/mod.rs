//! The nftables half of the dataplane: masquerade, hairpin and service-IP filtering, which IPVS
//! alone cannot do (kube-proxy's IPVS mode does them with iptables and ipsets:
//! `pkg/proxy/ipvs/proxier.go` `writeIptablesRules`). `docs/nftables.md` has the hooks diagram.
//!
//! kipvs owns one table, `inet kipvs`, with a constant set of rules (about 25, whatever the number of
//! Services) that look up **named sets**; Services only ever add and delete set elements. The
//! elements are [`SetElement`](crate::model::SetElement)s, planned per Service (`plan_service`) and diffed like virtual
//! servers, so one endpoint change costs a handful of elements. Every change of one sync goes to
//! the kernel as one atomic transaction that touches only this table: `nft -j -f -`
//! ([`codec::transaction`]), or, when it changes elements only, one nfnetlink batch without a process
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
//! `mark-masquerade`, which sets packet mark bit 14 ([`rules::MASQUERADE_MARK`], `0x4000`, kube-proxy's
//! default `masqueradeBit`) on the connections to masquerade; `nat-postrouting` (priority `srcnat`,
//! 100) masquerades marked packets `fully-random` and clears the bit. Hairpin traffic is matched
//! there on `saddr . daddr` against `hairpin` and masqueraded without a mark. `pin-prerouting` and
//! `pin-output` (-110) keep ClusterIP connections' destinations ahead of iptables' nat table
//! (`PIN_PRIORITY`). The filters run in `input` at priority `filter` (0) and in `output` at
//! priority -150, both before IPVS's own hooks, so they still see the virtual address.

pub mod codec;
pub mod elements;
pub mod rules;
pub mod runner;

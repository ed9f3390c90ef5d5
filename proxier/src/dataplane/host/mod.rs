//! The node's own tools and what else runs on it: a tool run as a child process
//! ([`program`]: `nft`, `iptables-save`, `iptables-restore`, `ipset`) and kube-proxy, found,
//! watched and cleaned up after for a takeover or a handback ([`kube_proxy`]).

pub mod kube_proxy;
pub mod program;

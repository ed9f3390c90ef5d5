//! The switch between kube-proxy and kipvs as a state machine: [`decide`] maps what is observed
//! on the node ([`Facts`]: where the node stands, what the configuration asks, what says
//! kube-proxy is there) to the next [`Step`]; `Engine::switch` (`engine/switch.rs`) gathers the
//! facts and takes the step (the I/O). The rules, in order:
//!
//! To kipvs (`serviceProxy: kipvs`), on a node kipvs does not program:
//! 1. kube-proxy is present (its pod runs or is pending here, its `/healthz` answers at its
//!    ConfigMap's address, its process is seen) and came back on a node kipvs programmed, or no
//!    NodeProxyConfig asks for kipvs: **stand by**; if it came back and has synced, `inet kipvs`
//!    is deleted first (its reject, source-range and masquerade rules would otherwise break
//!    kube-proxy's traffic: new ports, reused ClusterIPs, changed ranges).
//! 2. No NodeProxyConfig asks for kipvs (the default configuration, or a local file) while
//!    kube-proxy's state (its chains, sets or nftables table) is on the node: **hold** (a
//!    node never moves without the operator, or a hand-made NodeProxyConfig, asking).
//! 3. kube-proxy's mode (its `/proxyMode` while it runs, else the form of its state) is not
//!    IPVS: **refuse** (reported `Failed`, while it still runs too, so that the operator stops
//!    before kube-proxy leaves): only an IPVS-mode table is adopted; iptables mode would leave
//!    its REJECTs and `KUBE-SVC-*`/`KUBE-SEP-*` chains, nftables mode its `table ip kube-proxy`
//!    DNATing before IPVS.
//! 4. kube-proxy is present: **stand by**.
//! 5. kube-proxy was seen here (it ran, or its state is here) and every signal has said it is
//!    gone for less than [`DEBOUNCE`]: **wait** (a restart, an image roll: the DaemonSet
//!    recreates its pod well within it, and the pod is `Pending` from then on).
//! 6. Otherwise **take over** (the gate, the kernel, then the first full sync).
//!
//! On a node kipvs programs: kube-proxy runs again (its pod runs, its `/healthz`, its process;
//! once its leftovers are removed, its state too): **yield** at once (stop writing, release its
//! ports); else **program**.
//!
//! To kube-proxy (`serviceProxy: kube-proxy`): on a node kipvs programs, **hand back** (one
//! last sync, then nothing), unless kube-proxy's ConfigMap names a mode other than IPVS:
//! **refuse the handback** (an iptables- or nftables-mode kube-proxy does not adopt kipvs's IPVS
//! table: it would run beside it, both answering every ClusterIP, and its
//! nftables mode flushes IPVS and deletes `kube-ipvs0`, dropping every connection kipvs
//! carries). On a node kipvs does not program: **await** kube-proxy's first sync, then
//! **handed back** (`inet kipvs` deleted once).

use crate::dataplane::host::kube_proxy::{Mode, Signals};
use kipvs_crds::config::ServiceProxy;
use kipvs_crds::nodeproxyconfig::ServiceProxyPhase;
use std::time::Duration;

/// How long every signal must have said kube-proxy is gone from a node it was seen on before
/// kipvs takes the node over. A kube-proxy restart keeps its pod (`Running` while its
/// container restarts); an image roll or a re-applied DaemonSet deletes and recreates the pod,
/// which the DaemonSet controller does within a second or two, and the new pod is `Pending`
/// (present) from then on; without the API (no pod signal) a container restart of kube-proxy
/// is back on its `/healthz` within its first restart delay (10 s). Each switch waits this long
/// once.
pub const DEBOUNCE: Duration = Duration::from_secs(10);

/// What is observed on the node for one decision.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The `serviceProxy` of the configuration in force.
    pub wanted: ServiceProxy,
    /// Whether a NodeProxyConfig's revision is in force (the operator, or a hand-made one,
    /// asks), rather than the local configuration or the defaults.
    pub asked: bool,
    /// Where the node stands (`None`: not decided yet).
    pub phase: Option<ServiceProxyPhase>,
    /// What says kube-proxy is on the node ([`Signals::state`] read only when nothing says it
    /// runs, and on a node kipvs programs only once its leftovers are removed).
    pub signals: &'a Signals,
    /// kube-proxy's health once it has synced (`None`: not synced, or not read).
    pub synced: Option<bool>,
    /// How long every signal has said kube-proxy is not present (zero: it is now).
    pub absent_for: Duration,
    /// kube-proxy was seen on the node by this process (it ran, its state or leftovers).
    pub found: bool,
    /// kube-proxy's leftovers are removed (a takeover's removal is done).
    pub removal_done: bool,
    /// kube-proxy came back on this node while kipvs programmed it, and is still here.
    pub back: bool,
    /// `inet kipvs` was deleted since kipvs last programmed.
    pub cleared: bool,
}

/// The next step of the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// kipvs programs: sync.
    Program,
    /// kube-proxy runs again on a node kipvs programs (why): stop writing at once.
    Yield(String),
    /// Write nothing while kube-proxy is present (why); `clear`: delete `inet kipvs` first.
    StandBy {
        /// Why kube-proxy is taken to be present.
        why: String,
        /// Delete `inet kipvs`: kube-proxy came back and has synced.
        clear: bool,
    },
    /// No NodeProxyConfig asks for a takeover and kube-proxy's state is here (where).
    Hold(String),
    /// The switch to kipvs is refused (why): reported `Failed`, standby.
    Refuse(String),
    /// kube-proxy has been gone for less than [`DEBOUNCE`]: look again within `remaining`.
    Debounce {
        /// How long the absence has lasted.
        absent_for: Duration,
        /// How long it must last still.
        remaining: Duration,
    },
    /// Switch to kipvs now: the gate, the kernel, the ports, the first full sync.
    TakeOver,
    /// One last sync, then nothing more is written (`HandingBack`).
    HandBack,
    /// The handback is refused (why): kipvs goes on programming, reported `Failed`.
    RefuseHandBack(String),
    /// Wait for kube-proxy's first sync (`HandingBack`, or `Standby` where kipvs never
    /// programmed).
    AwaitSync,
    /// kube-proxy has synced (its health): `HandedBack`; `clear`: delete `inet kipvs` first.
    HandedBack {
        /// kube-proxy's `/healthz` answers 200.
        healthy: bool,
        /// Delete `inet kipvs` (not done yet).
        clear: bool,
    },
}

/// The next step from `facts` (see the module documentation for the rules).
pub fn decide(facts: &Facts<'_>) -> Step {
    let signals = facts.signals;
    let programs = facts.phase.is_some_and(ServiceProxyPhase::kipvs_programs);
    match (facts.wanted, programs) {
        (ServiceProxy::KubeProxy, true) => match &signals.configured_mode {
            Some(mode) if *mode != Mode::Ipvs => Step::RefuseHandBack(format!(
                "kube-proxy's ConfigMap says mode {mode}: it would not adopt kipvs's IPVS table \
                 (handing back to it would break the node's Services); set its mode to ipvs \
                 first, or move the node to kube-proxy by draining it"
            )),
            _ => Step::HandBack,
        },
        (ServiceProxy::KubeProxy, false) => match facts.synced {
            Some(healthy) => Step::HandedBack {
                healthy,
                clear: !facts.cleared,
            },
            None => Step::AwaitSync,
        },
        (ServiceProxy::Kipvs, true) => {
            // Until its leftovers are removed, its state says nothing.
            let state = signals.state.clone().filter(|_| facts.removal_done);
            match signals.runs().or(state) {
                Some(why) => Step::Yield(why),
                None => Step::Program,
            }
        }
        (ServiceProxy::Kipvs, false) => {
            let present = signals.present();
            if let Some(why) = present.clone().filter(|_| facts.back || !facts.asked) {
                let clear = facts.back && facts.synced.is_some() && !facts.cleared;
                return Step::StandBy { why, clear };
            }
            if let Some(state) = signals.state.as_ref().filter(|_| !facts.asked) {
                return Step::Hold(state.clone());
            }
            if let Some((mode, source)) = signals.mode.as_ref().filter(|(m, _)| *m != Mode::Ipvs) {
                return Step::Refuse(format!(
                    "kube-proxy runs in {mode} mode here ({source}): kipvs takes over only from \
                     IPVS mode; move the node to kube-proxy's IPVS mode first"
                ));
            }
            if let Some(why) = present {
                return Step::StandBy { why, clear: false };
            }
            let seen = facts.found || signals.state.is_some();
            if seen && facts.absent_for < DEBOUNCE {
                return Step::Debounce {
                    absent_for: facts.absent_for,
                    remaining: DEBOUNCE - facts.absent_for,
                };
            }
            Step::TakeOver
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::host::kube_proxy::PodSignal;
    use ServiceProxyPhase::*;

    /// The facts of a node kipvs does not program, asked to take over by a NodeProxyConfig,
    /// with `signals`, kube-proxy gone for `absent_for`.
    fn standby(signals: &Signals, absent_for: Duration) -> Facts<'_> {
        Facts {
            wanted: ServiceProxy::Kipvs,
            asked: true,
            phase: Some(Standby),
            signals,
            synced: None,
            absent_for,
            found: true,
            removal_done: false,
            back: false,
            cleared: false,
        }
    }

    fn running_pod() -> Signals {
        Signals {
            pod: PodSignal::Running("kube-proxy-x".into()),
            ..Signals::default()
        }
    }

    fn ipvs_state() -> Signals {
        Signals {
            pod: PodSignal::Absent,
            state: Some("its KUBE-SERVICES chain".into()),
            mode: Some((Mode::Ipvs, "its state".into())),
            ..Signals::default()
        }
    }

    /// Any one signal keeps kipvs in standby: the pod (running or pending), the healthz at its
    /// ConfigMap's address, the process.
    #[test]
    fn any_signal_of_kube_proxy_keeps_standby() {
        let pending = Signals {
            pod: PodSignal::Pending("kube-proxy-y".into()),
            ..Signals::default()
        };
        let healthz = Signals {
            pod: PodSignal::Absent,
            healthz: Some("its /healthz answers on 192.168.100.1:10256".into()),
            ..Signals::default()
        };
        let process = Signals {
            process: Some("process kube-proxy".into()),
            ..Signals::default()
        };
        for signals in [running_pod(), pending, healthz, process] {
            let step = decide(&standby(&signals, Duration::from_secs(60)));
            assert!(
                matches!(&step, Step::StandBy { clear: false, .. }),
                "{signals:?}: {step:?}"
            );
        }
    }

    /// A restart: every signal says gone for less than DEBOUNCE, no takeover; after it, the
    /// takeover.
    #[test]
    fn a_restart_within_the_debounce_is_no_takeover() {
        let gone = ipvs_state();
        let step = decide(&standby(&gone, Duration::from_secs(3)));
        assert_eq!(
            step,
            Step::Debounce {
                absent_for: Duration::from_secs(3),
                remaining: DEBOUNCE - Duration::from_secs(3)
            }
        );
        assert_eq!(decide(&standby(&gone, DEBOUNCE)), Step::TakeOver);
    }

    /// No NodeProxyConfig asks (serviceProxy kipvs by default): kube-proxy's state holds the
    /// node, however long kube-proxy is gone; a node with nothing of kube-proxy's (a fresh node,
    /// a restart of kipvs on a node it took over) is programmed at once.
    #[test]
    fn no_takeover_without_a_node_proxy_config_while_kube_proxys_state_is_here() {
        let gone = ipvs_state();
        let unasked = Facts {
            asked: false,
            ..standby(&gone, Duration::from_secs(3600))
        };
        assert!(matches!(decide(&unasked), Step::Hold(_)));
        let nothing = Signals {
            pod: PodSignal::Absent,
            ..Signals::default()
        };
        let fresh = Facts {
            asked: false,
            found: false,
            phase: None,
            ..standby(&nothing, Duration::ZERO)
        };
        assert_eq!(decide(&fresh), Step::TakeOver);
    }

    /// iptables and nftables modes are refused (by /proxyMode or the state's form), while
    /// kube-proxy still runs too; IPVS mode is taken over.
    #[test]
    fn only_ipvs_mode_is_taken_over() {
        let running = Signals {
            mode: Some((Mode::Iptables, "its /proxyMode".into())),
            ..running_pod()
        };
        let step = decide(&standby(&running, Duration::ZERO));
        assert!(
            matches!(&step, Step::Refuse(why) if why.contains("iptables mode")),
            "{step:?}"
        );
        for mode in [Mode::Iptables, Mode::Nftables] {
            let signals = Signals {
                mode: Some((mode.clone(), "its state".into())),
                ..ipvs_state()
            };
            let step = decide(&standby(&signals, DEBOUNCE));
            assert!(
                matches!(&step, Step::Refuse(why) if why.contains(&format!("{mode} mode"))),
                "{step:?}"
            );
        }
    }

    /// kube-proxy back on a node kipvs programs: yield at once (its running pod; its state only
    /// once its leftovers are removed); then standby, `inet kipvs` deleted once it synced.
    #[test]
    fn kube_proxy_back_makes_kipvs_yield_then_clear_its_rules() {
        let programming = |signals, removal_done| Facts {
            phase: Some(Programming),
            removal_done,
            ..standby(signals, Duration::ZERO)
        };
        let pod = running_pod();
        assert!(matches!(decide(&programming(&pod, false)), Step::Yield(_)));
        let state = ipvs_state();
        assert_eq!(decide(&programming(&state, false)), Step::Program);
        assert!(matches!(decide(&programming(&state, true)), Step::Yield(_)));
        let back = |synced, cleared| Facts {
            back: true,
            synced,
            cleared,
            ..standby(&pod, Duration::ZERO)
        };
        let stand = |clear| Step::StandBy {
            why: "its pod kube-system/kube-proxy-x runs here".into(),
            clear,
        };
        assert_eq!(decide(&back(None, false)), stand(false), "not synced yet");
        assert_eq!(decide(&back(Some(true), false)), stand(true));
        assert_eq!(decide(&back(Some(true), true)), stand(false), "once");
    }

    /// A handback: refused to a kube-proxy whose ConfigMap names another mode; then awaiting
    /// kube-proxy's sync, `inet kipvs` deleted once.
    #[test]
    fn a_handback_only_to_ipvs_mode() {
        let to = |mode: Option<Mode>| Signals {
            configured_mode: mode,
            ..Signals::default()
        };
        let handing = |signals| Facts {
            wanted: ServiceProxy::KubeProxy,
            phase: Some(Programming),
            ..standby(signals, Duration::ZERO)
        };
        let (unknown, ipvs) = (to(None), to(Some(Mode::Ipvs)));
        assert_eq!(decide(&handing(&unknown)), Step::HandBack);
        assert_eq!(decide(&handing(&ipvs)), Step::HandBack);
        let nft = to(Some(Mode::Nftables));
        assert!(matches!(decide(&handing(&nft)), Step::RefuseHandBack(_)));
        let none = Signals::default();
        let waiting = |synced, cleared| Facts {
            phase: Some(HandingBack),
            synced,
            cleared,
            ..handing(&none)
        };
        assert_eq!(decide(&waiting(None, false)), Step::AwaitSync);
        let back = |clear| Step::HandedBack {
            healthy: true,
            clear,
        };
        assert_eq!(decide(&waiting(Some(true), false)), back(true));
        assert_eq!(decide(&waiting(Some(true), true)), back(false));
    }
}

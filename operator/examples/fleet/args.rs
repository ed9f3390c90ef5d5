//! The harness's command line.

use std::path::PathBuf;
use std::time::Duration;

/// The harness's flags (see the usage in main.rs).
#[derive(Clone)]
pub(crate) struct Args {
    pub(crate) nodes: usize,
    pub(crate) operator: String,
    pub(crate) operator_log: String,
    pub(crate) operator_metrics: String,
    pub(crate) pid_file: Option<PathBuf>,
    pub(crate) cp_state: Option<PathBuf>,
    pub(crate) check: bool,
    pub(crate) faults: bool,
    pub(crate) max_first_write: Duration,
    pub(crate) quiet: Duration,
    pub(crate) fail_share: f64,
    pub(crate) silent_share: f64,
    pub(crate) flap_share: f64,
    /// `--takeover`: the move from kube-proxy instead of the scheduler rounds.
    pub(crate) takeover: bool,
    /// `--stuck-share`: nodes whose kube-proxy never leaves in the takeover's failing round.
    pub(crate) stuck_share: f64,
}

/// Reads the flags from the command line.
pub(crate) fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        nodes: 500,
        operator: String::new(),
        operator_log: String::new(),
        operator_metrics: "127.0.0.1:18089".to_owned(),
        pid_file: None,
        cp_state: None,
        check: false,
        faults: false,
        max_first_write: Duration::from_secs(5),
        quiet: Duration::from_secs(20),
        fail_share: 0.0,
        silent_share: 0.0,
        flap_share: 0.0,
        takeover: false,
        stuck_share: 0.01,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--check" => a.check = true,
            "--faults" => a.faults = true,
            "--takeover" => a.takeover = true,
            _ => {
                let value = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
                a.set(&flag, value)?;
            }
        }
    }
    if a.operator.is_empty() || a.operator_log.is_empty() {
        anyhow::bail!("--operator and --operator-log are required");
    }
    if a.takeover && a.faults {
        anyhow::bail!("--takeover rolls its own rounds: not with --faults");
    }
    if a.faults && a.cp_state.is_none() {
        anyhow::bail!("--faults needs --cp-state (the control plane's state directory)");
    }
    Ok(a)
}

impl Args {
    fn set(&mut self, flag: &str, value: String) -> anyhow::Result<()> {
        let a = self;
        match flag {
            "--nodes" => a.nodes = value.parse()?,
            "--operator" => a.operator = value,
            "--operator-log" => a.operator_log = value,
            "--operator-metrics" => a.operator_metrics = value,
            "--pid-file" => a.pid_file = Some(value.into()),
            "--cp-state" => a.cp_state = Some(value.into()),
            "--max-first-write" => a.max_first_write = kipvs_crds::duration::parse(&value)?,
            "--quiet" => a.quiet = kipvs_crds::duration::parse(&value)?,
            "--fail-share" => a.fail_share = value.parse()?,
            "--silent-share" => a.silent_share = value.parse()?,
            "--flap-share" => a.flap_share = value.parse()?,
            "--stuck-share" => a.stuck_share = value.parse()?,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
        Ok(())
    }
}

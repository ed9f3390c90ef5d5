//! CPU time and peak RSS of the operator, kube-apiserver and etcd, sampled from `/proc`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// CPU time and peak RSS per process role, sampled from `/proc` every 0.5 s (processes that
/// restart are summed over their pids).
#[derive(Clone, Default)]
pub(crate) struct Usage {
    roles: Arc<Mutex<Vec<RoleUsage>>>,
}

/// One role's samples: its name, CPU milliseconds per pid, peak VmHWM (KiB) over its pids.
type RoleUsage = (&'static str, HashMap<u32, u64>, u64);

/// A copy of [`Usage`] at one moment.
pub(crate) struct UsageSnapshot(Vec<(&'static str, f64, u64)>);

impl Usage {
    pub(crate) fn sample(&self, pids: &[(&'static str, u32)]) {
        let ticks_per_second = 100; // USER_HZ on Linux
        let mut roles = self.roles.lock().expect("usage");
        for (role, pid) in pids {
            if *pid == 0 {
                continue;
            }
            let Some((cpu, hwm)) = proc_usage(*pid) else {
                continue;
            };
            let i = match roles.iter().position(|r| r.0 == *role) {
                Some(i) => i,
                None => {
                    roles.push((role, HashMap::new(), 0));
                    roles.len() - 1
                }
            };
            roles[i].1.insert(*pid, cpu * 1000 / ticks_per_second);
            roles[i].2 = roles[i].2.max(hwm);
        }
    }

    pub(crate) fn snapshot(&self) -> UsageSnapshot {
        let roles = self.roles.lock().expect("usage");
        UsageSnapshot(
            roles
                .iter()
                .map(|(role, cpu, hwm)| (*role, cpu.values().sum::<u64>() as f64 / 1000.0, *hwm))
                .collect(),
        )
    }
}

impl UsageSnapshot {
    /// CPU seconds per role since `before`.
    pub(crate) fn since(&self, before: &UsageSnapshot) -> String {
        self.0
            .iter()
            .map(|(role, cpu, _)| {
                let was = before.0.iter().find(|b| b.0 == *role).map_or(0.0, |b| b.1);
                format!("{role} {:.1}", cpu - was)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Peak RSS per role.
    pub(crate) fn peaks(&self) -> String {
        self.0
            .iter()
            .map(|(role, _, hwm)| format!("{role} {:.1} MiB", *hwm as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A process's CPU time (utime + stime, in ticks) and peak RSS (VmHWM, KiB), from `/proc`.
fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let cpu = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    Some((cpu, hwm))
}

/// A pid from a control plane pid file (0 when it is not there).
pub(crate) fn pid_from(file: Option<PathBuf>) -> u32 {
    file.and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

//! The start-up check of the kernel: before the proxier programs anything, it asks the
//! kernel for every facility a sync will use, and refuses to start with one error that names
//! each missing one, instead of failing deep inside every sync.
//!
//! The check asks for features, not for a version: distribution kernels carry backports (a
//! RHEL 4.18 may have what mainline 5.6 has), so a version number alone would refuse kernels
//! that work. The version is logged with the result. The mainline floor, and why, is in
//! `docs/kernel.md`:
//!
//! | facility | asked how | mainline |
//! |---|---|---|
//! | IPVS over generic netlink (`ip_vs`) | resolving the `IPVS` family | 2.6.x; `mh` 4.18 |
//! | nftables `inet` NAT chains (`nft_chain_nat`) | `nft --check` of kipvs's own table | 5.2 |
//! | concatenated interval sets (`firewall-allow`, the pipapo backend) | the same | 5.6 |
//! | `masquerade fully-random`, `reject`, `ct original` (`nft_masq`, `nft_reject_inet`, `nft_ct`) | the same | 5.2 and older |
//!
//! `nft --check` sends the whole transaction to the kernel, which validates every set,
//! chain and expression (loading modules as it would for real) and then aborts it
//! (`NFNL_ABORT_VALIDATE`): nothing is written.

use crate::dataplane::nftables::codec::{self as nft, Transaction};
use crate::dataplane::nftables::runner::Nft;
use crate::model::NftRules;

/// One facility the kernel lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// The facility, as the table in the module doc names it.
    pub facility: &'static str,
    /// What the kernel (or the tool) answered.
    pub answer: String,
}

/// The kernel lacks what kipvs needs: every missing facility, with the kernel's release.
#[derive(Debug, thiserror::Error)]
#[error(
    "this kernel ({kernel}) lacks what kipvs needs (see docs/kernel.md): {}",
    missing.iter().map(|m| format!("{}: {}", m.facility, m.answer)).collect::<Vec<_>>().join("; ")
)]
pub struct PreflightError {
    /// `/proc/sys/kernel/osrelease`, trimmed (empty when unreadable).
    pub kernel: String,
    /// What is missing, in the order of the module doc's table; never empty.
    pub missing: Vec<Missing>,
}

/// The facility the nftables check stands for.
pub const NFTABLES: &str = "nftables inet NAT with concatenated interval sets \
     (nf_tables, nft_chain_nat, nft_masq, nft_reject_inet, nft_ct; mainline 5.6)";

/// The facility the IPVS check stands for.
pub const IPVS: &str = "IPVS over generic netlink (ip_vs)";

/// Checks the kernel: IPVS's generic-netlink family, and kipvs's nftables table with its rules
/// (`checked_rules`) through `nft --check`.
///
/// `kernel` is `/proc/sys/kernel/osrelease` for the error.
///
/// # Errors
/// [`PreflightError`] naming every facility that is missing (a missing `nft` executable is
/// one of them).
pub async fn check(nft: &Nft, kernel: &str) -> Result<(), PreflightError> {
    let mut missing = Vec::new();
    if let Err(e) = ipvs::Handle::connect().await {
        let answer = match e {
            ipvs::Error::FamilyNotFound => {
                "the kernel has no IPVS generic-netlink family: the ip_vs module is not loaded \
                 and cannot be loaded"
                    .to_owned()
            }
            other => other.to_string(),
        };
        missing.push(Missing {
            facility: IPVS,
            answer,
        });
    }
    let rules = checked_rules();
    let table = nft::transaction(&Transaction {
        rules: Some(&rules),
        ..Transaction::default()
    });
    if let Err(e) = nft.check(&table).await {
        missing.push(Missing {
            facility: NFTABLES,
            answer: e.to_string(),
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PreflightError {
            kernel: kernel.trim().to_owned(),
            missing,
        })
    }
}

/// The rules the check asks for: one cluster CIDR per family, so that every rule kind
/// (masquerading by CIDR included) is validated; the sets and chains do not depend on the
/// configuration.
fn checked_rules() -> NftRules {
    NftRules::new(
        vec![
            "192.0.2.0/24".parse().expect("IPv4 CIDR"),
            "2001:db8::/64".parse().expect("IPv6 CIDR"),
        ],
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::host::program::Program;
    use crate::dataplane::nftables::runner::NFT_TIMEOUT;

    /// An `nft` that prints `stderr` and fails, or succeeds when `stderr` is empty; the
    /// arguments it got are written to `args`.
    fn scripted_nft(dir: &std::path::Path, stderr: &str) -> Nft {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("nft");
        let body = if stderr.is_empty() {
            format!("echo \"$@\" > {}/args; cat > /dev/null", dir.display())
        } else {
            format!(
                "echo \"$@\" > {}/args; cat > /dev/null; echo '{stderr}' >&2; exit 1",
                dir.display()
            )
        };
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        Nft::with_program(Program {
            name: path.to_string_lossy().into_owned(),
            timeout: NFT_TIMEOUT,
        })
    }

    /// A kernel that refuses the table (here: `masquerade` without `nft_masq`) gives one error
    /// naming the nftables facility and the kernel's answer, whatever IPVS says.
    #[tokio::test]
    async fn a_refused_table_is_one_error_naming_the_facility() {
        let dir = std::env::temp_dir().join(format!("kipvs-preflight-{}", std::process::id()));
        let nft = scripted_nft(
            &dir,
            "Error: Could not process rule: No such file or directory",
        );
        let error = check(&nft, "5.4.0-1\n").await.unwrap_err();
        let nftables: Vec<_> = error
            .missing
            .iter()
            .filter(|m| m.facility == NFTABLES)
            .collect();
        assert_eq!(nftables.len(), 1, "{error}");
        assert!(
            nftables[0].answer.contains("Could not process rule"),
            "{error}"
        );
        let text = error.to_string();
        assert!(text.starts_with("this kernel (5.4.0-1) lacks"), "{text}");
        assert!(text.contains("docs/kernel.md"), "{text}");
        let args = std::fs::read_to_string(dir.join("args")).unwrap();
        assert!(args.starts_with("-c -j -f -"), "check mode, got {args}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A missing `nft` executable is a missing facility too, not a panic or a later failure.
    #[tokio::test]
    async fn a_missing_nft_is_named() {
        let nft = Nft::with_program(Program {
            name: "/nonexistent/nft".into(),
            timeout: NFT_TIMEOUT,
        });
        let error = check(&nft, "6.1.0").await.unwrap_err();
        assert!(
            error
                .missing
                .iter()
                .any(|m| m.facility == NFTABLES && m.answer.contains("/nonexistent/nft")),
            "{error}"
        );
    }
}

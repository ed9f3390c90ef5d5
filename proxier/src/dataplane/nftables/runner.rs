//! The `nft` executable ([`Nft`]): applies, checks and lists batches, killed after a timeout,
//! with what it printed on stderr in the error ([`NftError`]).

use super::codec::{ObservedTable, delete_table, parse_table};
use super::rules::TABLE;
use crate::dataplane::host::program::{Program, ProgramError};
use nftables::schema::Nftables;

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
            Ok(json) => tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let table = parse_table(&json);
                tracing::debug!(
                    bytes = json.len(),
                    duration_us = started.elapsed().as_micros() as u64,
                    "parsed the nftables listing"
                );
                table
            })
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

    /// Issue 32: the listing is parsed off the runtime's thread, so that the engine's other
    /// tasks run meanwhile (on a one-CPU node the runtime has one worker; here the runtime has
    /// one thread). Where it is parsed is where its log line is emitted: the runtime's thread
    /// and the blocking pool's each log into a buffer of their own, and the line must be in
    /// the pool's alone (no clock involved: a loaded machine changes nothing).
    #[test]
    fn the_listing_is_parsed_off_the_runtimes_thread() {
        let dir = std::env::temp_dir().join(format!("kipvs-nft-large-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let elements: Vec<String> = (0..1_000u32)
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
        let (runtime_logs, pool_logs) = (Logs::default(), Logs::default());
        let pool = pool_logs.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_start(move || {
                // For the life of the pool's thread.
                std::mem::forget(tracing::dispatcher::set_default(&pool.dispatch()));
            })
            .build()
            .unwrap();
        let table = {
            let _runtime_thread = tracing::dispatcher::set_default(&runtime_logs.dispatch());
            runtime.block_on(nft.observe()).unwrap()
        };
        drop(runtime);
        assert_eq!(table.elements.len(), 1_000);
        let parsed = "parsed the nftables listing";
        let (on_runtime, on_pool) = (runtime_logs.text(), pool_logs.text());
        assert!(
            !on_runtime.contains(parsed),
            "parsed on the runtime's thread"
        );
        assert!(
            on_pool.contains(parsed),
            "not parsed on the pool: {on_pool:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Log lines, every level, written to a buffer.
    #[derive(Clone, Default)]
    struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Logs {
        /// A subscriber writing into this buffer.
        fn dispatch(&self) -> tracing::Dispatch {
            let logs = self.clone();
            tracing::Dispatch::new(
                tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::TRACE)
                    .with_ansi(false)
                    .with_writer(move || logs.clone())
                    .finish(),
            )
        }

        /// What was written.
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
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
}

//! Running a node tool (`nft`, `iptables-save`, `iptables-restore`, `ipset`) as a child process:
//! its stdout, or an error with what it printed on stderr, killed after a timeout.

/// Errors of running a program.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// It could not be started or its output read (not installed).
    #[error("cannot run {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It exited with a failure.
    #[error("{program} {args} failed: {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// Its arguments.
        args: String,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// It did not finish within its timeout and was killed.
    #[error("{program} {args} did not finish within {} s: killed", timeout.as_secs())]
    Timeout {
        /// The program.
        program: String,
        /// Its arguments.
        args: String,
        /// How long it was given.
        timeout: std::time::Duration,
    },
}

/// A program run as a child process, killed after `timeout` so that a hung one cannot stall
/// the sync loop.
#[derive(Clone, Debug)]
pub struct Program {
    /// Its name (found on `PATH`) or path.
    pub name: String,
    /// How long one run may take.
    pub timeout: std::time::Duration,
}

impl Program {
    /// Runs it with `args` (and `stdin`), killed after `self.timeout`; its stdout.
    ///
    /// # Errors
    /// [`ProgramError`]: not started, failed (with its stderr) or killed.
    pub async fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<String, ProgramError> {
        tokio::time::timeout(self.timeout, self.run_to_end(args, stdin))
            .await
            .unwrap_or_else(|_| {
                Err(ProgramError::Timeout {
                    program: self.name.clone(),
                    args: args.join(" "),
                    timeout: self.timeout,
                })
            })
    }

    /// [`Program::run`] without the timeout (the child is killed when this future is dropped).
    async fn run_to_end(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, ProgramError> {
        use tokio::io::AsyncWriteExt;
        let exec = |source| ProgramError::Exec {
            program: self.name.clone(),
            source,
        };
        let mut child = tokio::process::Command::new(&self.name)
            .args(args)
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(exec)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input).await.map_err(exec)?;
        }
        let output = child.wait_with_output().await.map_err(exec)?;
        if !output.status.success() {
            return Err(ProgramError::Failed {
                program: self.name.clone(),
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        // Moved, not copied (a listing at 10k Services is 2 MiB); copied only to replace
        // bytes that are not UTF-8.
        Ok(String::from_utf8(output.stdout)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

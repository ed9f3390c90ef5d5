//! How the proxier's watches of the API server, its NodeProxyConfig watch among them, wait
//! after a failure ([`Retry`]): shared with the operator's stand-ins for proxiers, so that they
//! come back after an API server outage when a proxier would.

use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher::{self, DefaultBackoff, ExponentialBackoff};
use std::time::Duration;
use tokio::time::Instant;

/// How the proxier's API watchers (its NodeProxyConfig watch and its Service, EndpointSlice and
/// Node watches) wait after a failed list or watch, and how they log the failures. kube-runtime's `watcher` retries at its next poll; this decides how long
/// to wait before that poll, by what the error says about the API server:
///
/// - **It is not reachable** (connection refused or timed out, TLS failure, a stream cut
///   without an answer): 0.8 s doubling to 3 s, each wait plus a random jitter of up to itself
///   (so 0.8–6 s), so a proxier resumes within a few seconds once the API server is back.
///   An absent server costs nothing to ask: about one connection attempt per watch every 4.5 s.
/// - **It answered with an error** (5xx, 429, 403, ...): kube-runtime's [`DefaultBackoff`],
///   client-go's reflector numbers (0.8 s doubling to 30 s, plus jitter), kind to a
///   struggling server.
/// - **`410 Gone`** (the watch's resource version is too old; what every watch gets from an API
///   server that restarted): the server is back, so both backoffs start over and the watcher
///   lists again after the first step (0.8–1.6 s).
///
/// Both reset after an event (and after 2 min without a failure). kube-runtime's
/// `StreamBackoff` (`default_backoff()`) cannot tell these apart: after an outage it waits
/// the step it grew during the outage (tens of seconds) before the relist the `410` asks for.
///
/// Logs: the first failure of a run at WARN, the following ones at DEBUG, the recovery at
/// INFO with the number of failures and how long they lasted.
pub struct Retry {
    what: &'static str,
    unreachable: ResetTimerBackoff<ExponentialBackoff>,
    answered: DefaultBackoff,
    /// Failures since the last event, and when the first of them happened.
    failing: Option<(u32, Instant)>,
}

/// How long a [`Retry`] waits at least, and what both of its backoffs start from.
pub const RETRY_MIN: Duration = Duration::from_millis(800);
/// The longest step of a [`Retry`] while the API server is not reachable (before jitter).
pub const RETRY_UNREACHABLE_MAX: Duration = Duration::from_secs(3);

impl Retry {
    /// The retry state of one watch; `what` names it in logs (e.g. `Service watch`).
    pub fn new(what: &'static str) -> Self {
        let unreachable = backon::ExponentialBuilder::default()
            .with_min_delay(RETRY_MIN)
            .with_max_delay(RETRY_UNREACHABLE_MAX)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Retry {
            what,
            unreachable: ResetTimerBackoff::new(unreachable.into(), Duration::from_secs(120)),
            answered: DefaultBackoff::default(),
            failing: None,
        }
    }

    /// The watcher delivered an event: the API server answers again.
    pub fn succeeded(&mut self) {
        if let Some((failures, since)) = self.failing.take() {
            tracing::info!(
                "{} resumed after {failures} failed attempts over {:.1} s",
                self.what,
                since.elapsed().as_secs_f64()
            );
            self.unreachable.reset();
            self.answered.reset();
        }
    }

    /// The watcher failed with `error`: log it (see [`Retry`]) with `keeping` (what stays in
    /// force meanwhile), then wait before the next attempt.
    pub async fn failed(&mut self, error: &watcher::Error, keeping: &str) {
        match &self.failing {
            None => tracing::warn!(
                "{} failed, keeping {keeping} and retrying with backoff (further failures \
                 are logged at debug level until it recovers): {error}",
                self.what
            ),
            Some(_) => tracing::debug!("{} failed again: {error}", self.what),
        }
        self.wait(error).await;
    }

    /// Wait before the next attempt after `error`, without logging it.
    pub async fn wait(&mut self, error: &watcher::Error) {
        self.failing.get_or_insert((0, Instant::now())).0 += 1;
        tokio::time::sleep(self.delay(error)).await;
    }

    /// How long to wait after `error` (see [`Retry`]).
    fn delay(&mut self, error: &watcher::Error) -> Duration {
        let fallback = Duration::from_secs(30);
        match answered_status(error) {
            Some(410) => {
                self.unreachable.reset();
                self.answered.reset();
                self.answered.next().unwrap_or(fallback)
            }
            Some(_) => self.answered.next().unwrap_or(fallback),
            None => self.unreachable.next().unwrap_or(fallback),
        }
    }
}

/// The HTTP status of a watcher error the API server answered; `None` when it was not reached
/// or its answer was cut.
pub fn answered_status(error: &watcher::Error) -> Option<u16> {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        watcher::Error::WatchError(status) => Some(status.code),
        // A list without a resource version: an answer, if a strange one.
        watcher::Error::NoResourceVersion => Some(500),
        _ => None,
    }
}

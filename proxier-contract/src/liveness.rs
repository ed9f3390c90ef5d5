//! The proxier's `/livez` verdict, which its NodeProxyConfig status reports as `healthy`:
//! [`Liveness`], what the status writer reads; [`StalenessClock`], the rule behind the verdict
//! (kube-proxy's `ProxyHealth`, `pkg/proxy/healthcheck`), which the proxier's health server and
//! the stand-ins for proxiers share (their own verdicts are in `simulated`, feature `harness`).

use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The proxier's `/livez` verdict, which the status reports as `healthy` (kube-proxy's
/// `ProxyHealth`: unhealthy once a queued change waits longer than its timeout).
pub trait Liveness: Send + Sync + 'static {
    /// Whether `/livez` answers 200 now.
    fn live(&self) -> bool;

    /// When the verdict turns unhealthy unless something happens first (`None`: nothing is
    /// pending, or it is already unhealthy).
    fn stale_at(&self) -> Option<Instant>;

    /// A receiver that sees a change whenever what the verdict depends on changes (time passing
    /// does not count: see [`stale_at`](Self::stale_at)).
    fn subscribe(&self) -> watch::Receiver<()>;
}

/// When a proxier is live: unless a change queued by a source has waited longer than
/// `timeout` without a sync ending (kube-proxy's `healthTimeout`, `2 × syncPeriod`). A proxier
/// that is starting or fully synced is live.
#[derive(Clone, Copy, Debug)]
pub struct StalenessClock {
    /// When the oldest change not yet synced was queued.
    oldest_queued: Option<Instant>,
    /// How long a queued change may wait.
    timeout: Duration,
}

impl StalenessClock {
    /// A clock with nothing queued that goes stale after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        StalenessClock {
            oldest_queued: None,
            timeout,
        }
    }

    /// A change is waiting to be synced (kube-proxy's `QueuedUpdate`): starts the clock unless
    /// it already runs.
    pub fn queued(&mut self) {
        self.oldest_queued.get_or_insert_with(Instant::now);
    }

    /// A sync ended (kube-proxy's `Updated`): nothing is waiting any more.
    pub fn synced(&mut self) {
        self.oldest_queued = None;
    }

    /// Restarts the clock of the changes waiting, if any: they get a whole timeout from now.
    pub fn restart(&mut self) {
        if self.oldest_queued.is_some() {
            self.oldest_queued = Some(Instant::now());
        }
    }

    /// Changes how long a queued change may wait.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether the proxier is live now.
    pub fn live(&self) -> bool {
        self.oldest_queued
            .is_none_or(|queued| queued.elapsed() < self.timeout)
    }

    /// When it goes stale unless a sync ends first (`None`: nothing is waiting, or it is stale
    /// already).
    pub fn stale_at(&self) -> Option<Instant> {
        let at = self.oldest_queued? + self.timeout;
        (at > Instant::now()).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_queued_change_makes_it_stale_after_the_timeout_until_a_sync_ends() {
        let mut clock = StalenessClock::new(Duration::from_secs(60));
        assert!(clock.live() && clock.stale_at().is_none(), "starting: live");
        clock.queued();
        let at = clock.stale_at().expect("pending");
        tokio::time::advance(Duration::from_secs(30)).await;
        clock.queued();
        assert_eq!(clock.stale_at(), Some(at), "the oldest change counts");
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(!clock.live() && clock.stale_at().is_none(), "stale");
        clock.restart();
        assert!(clock.live(), "a whole timeout from now");
        clock.synced();
        assert!(clock.live() && clock.stale_at().is_none(), "synced");
        clock.queued();
        clock.set_timeout(Duration::from_millis(500));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!clock.live());
    }
}

//! Leader election through a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! only one writes. kube-runtime 5 has no elector, so this is client-go's algorithm, small:
//!
//! - a candidate takes the Lease when it is free (no holder) or expired: its record has not
//!   changed for `leaseDurationSeconds`, measured on the candidate's own clock from when it
//!   observed the record (so clock skew between replicas does not matter);
//! - the holder renews every `retry_period`; every write is an update with the observed
//!   `resourceVersion`, so two candidates cannot both win a race (the loser gets 409 Conflict);
//! - a holder whose renewals did not succeed within `renew_deadline` (shorter than the lease
//!   duration; the deadline bounds the whole series of attempts, as in client-go) has lost:
//!   [`Elector::hold`] returns and the operator stops writing before anyone else may take over;
//! - on shutdown the holder releases the Lease (empty holder) so a successor need not wait.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use std::time::Duration;
use tokio::time::Instant;

/// Lease timings and identity.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a holder's record stays valid without renewal (client-go default 15 s).
    pub lease_duration: Duration,
    /// How long a holder keeps leading without a successful renewal (client-go default 10 s).
    pub renew_deadline: Duration,
    /// Time between attempts (client-go default 2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's default timings.
    pub fn new(name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaseConfig {
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The last record seen and when (on this candidate's clock).
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    /// A candidate for the Lease `config.name` in `api`'s namespace.
    pub fn new(api: Api<Lease>, config: LeaseConfig) -> Self {
        Elector {
            api,
            config,
            observed: None,
        }
    }

    /// One attempt to take or renew the Lease. `Ok(true)`: this candidate holds it now.
    ///
    /// # Errors
    /// API errors other than the expected 404 (no Lease yet) and 409 (lost a race).
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != spec) {
            self.observed = Some((spec.clone(), Instant::now()));
        }
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let mine = holder == self.config.identity;
        let duration = spec
            .lease_duration_seconds
            .map_or(self.config.lease_duration, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        let observed_at = self
            .observed
            .as_ref()
            .map_or_else(Instant::now, |(_, at)| *at);
        if !mine && !holder.is_empty() && observed_at + duration > Instant::now() {
            return Ok(false);
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if mine {
                spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        conflict_is_false(
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await,
        )
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the Lease")
                }
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the Lease every `retry_period` and returns when leadership is lost (stop writing
    /// at once): another candidate holds the Lease, or a renewal series did not succeed within
    /// `renew_deadline`.
    ///
    /// As client-go's `renew`, the deadline bounds the whole series of attempts that starts
    /// `retry_period` after the last successful renewal, the attempt in flight included: this
    /// holder stops at most `retry_period + renew_deadline` after its last renewal, before a
    /// candidate may take the Lease over (`lease_duration` after it observed that renewal).
    pub async fn hold(&mut self) {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline = Instant::now() + self.config.renew_deadline;
            match tokio::time::timeout_at(deadline, self.renew()).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(_) => {
                    tracing::warn!("leader election: no renewal within the renew deadline");
                    return;
                }
            }
        }
    }

    /// Attempts a renewal every `retry_period` until one gets an answer: `true` when this
    /// candidate holds the Lease, `false` when another does.
    async fn renew(&mut self) -> bool {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(held) => return held,
                Err(e) => tracing::warn!(error = %e, "leader election: renewal failed"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Gives the Lease up (empty holder) if this candidate holds it, so a successor takes over
    /// without waiting for it to expire.
    ///
    /// # Errors
    /// API errors; a 409 (someone else wrote meanwhile) is not one.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        conflict_is_false(
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await,
        )
        .map(drop)
    }
}

/// A successful write is `true`; 409 (AlreadyExists on create, Conflict on update: another
/// candidate wrote first) is `false`.
fn conflict_is_false<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

//! The writer: the writes a decision asks for (NodeProxyConfigs, and the Nodes' service proxy
//! label), sent apart from the decision.
//!
//! A reconcile decides and hands its writes over ([`WriterState::submit`]); it does not wait
//! for them, so the next decision (a spec change's canary, a stage completing) is never
//! queued behind the previous decision's applies (a stage of a 5,000-node fleet is ~1,000).
//!
//! - **Work queue keyed by node and object, latest wins.** A node's NodeProxyConfig and its
//!   label [`SERVICE_PROXY_LABEL`] ([`Write::Label`]) are two objects, each with its own
//!   place in the queue, retries and doubt; what follows holds for each. Each ProxyConfig's queued (not yet sent)
//!   writes are replaced by those of its latest decision: a write the latest decision still
//!   asks for keeps its place and its retry state, one it no longer asks for is dropped (a
//!   new revision's decision cancels the old revision's unsent writes), a new one joins the
//!   back of the queue. Writes go out in the order they were first asked for.
//! - **Bounded concurrency**: `concurrency` writes in flight, never two for one node.
//! - **Retries with backoff**, per write: 200 ms doubling up to 30 s, for as long as the latest
//!   decision asks for the write. A retry sends the same object (the same `spec.assignedAt`),
//!   so a write that reached the API server although its answer was lost changes nothing
//!   the second time. Every failure counts in `kipvs_operator_write_errors_total`; the
//!   failing nodes and their last error are reported on the ProxyConfig (Degraded
//!   `WriteFailed`, through [`WriterState::failing`]). Every failed write triggers its
//!   ProxyConfig's reconcile: a decision taken while the write was in flight did not ask for it
//!   (the overlay showed it) and, submitted after the failure, cancels the retry; the triggered
//!   decision comes after it and asks for the write again.
//! - **A node in doubt gets no other write.** A write that failed without a clear rejection (a
//!   timeout, a 5xx, a lost connection: it may still be committed, e.g. after a 504 the
//!   apiserver's handler goes on) holds its node "in doubt" for [`IN_DOUBT`] (the apiserver's
//!   request timeout, 60 s, plus a margin), until the stores show that write, or until a
//!   retry of it succeeds. Meanwhile only that same write (owner and revision) may be sent to
//!   the node, so an older revision cannot land after a newer one.
//! - **A deleted ProxyConfig's writes are dropped** before they are sent (kube-runtime does
//!   not reconcile a deleted object, so no later decision would cancel them): deleting a
//!   ProxyConfig mid-rollout changes no node (operator/README.md). Writes belong to one
//!   incarnation of a ProxyConfig (name and uid): one recreated under the same name replaces
//!   the old one's queued writes with its own at its first decision, and a write the old one
//!   has in flight does not count as the new one's.
//! - **No duplicate writes.** A write in flight, or sent and not yet shown by the watch, is
//!   laid over the stores ([`WriterState::overlay`]), so the next decision does not ask for
//!   it again; [`WriterState::submit`] also ignores what is in flight or sent. The decision
//!   itself runs without the lock (workers keep sending); its writes are submitted only for
//!   NodeProxyConfigs whose spec generation is still the one it decided from, checked under
//!   the lock ([`Writer::lock`]), so a write sent and confirmed meanwhile is not asked for
//!   twice. A write's `spec.assignedAt` (the start of its apply timeout) is when it is first sent,
//!   not when it was decided; queued writes are not in the overlay (the decision asks for
//!   them again and they keep their place).

use crate::metrics::Metrics;
use crate::rollout::{Object, Write};
use crate::stored::StoredProxyConfig;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kipvs_crds::{NodeProxyConfig, OPERATOR_FIELD_MANAGER, SERVICE_PROXY_LABEL, ServiceProxy};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// NodeProxyConfig writes in flight at once.
pub const WRITE_CONCURRENCY: usize = 32;
/// The first retry's delay; each further retry doubles it up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest delay between two attempts of one write.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a sent write overrides the store (a safety net: the watch normally shows it
/// within a second).
const EXPECTATION_TTL: Duration = Duration::from_secs(120);
/// How long a node whose write failed ambiguously is held in doubt (see the module docs): the
/// apiserver's default `--request-timeout` (60 s), after which its handler no longer commits
/// the request, plus a margin.
pub const IN_DOUBT: Duration = Duration::from_secs(75);

/// Why a write failed.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The error, as reported on the ProxyConfig.
    pub message: String,
    /// The write may have been committed all the same (no clear rejection): its node is held
    /// in doubt.
    pub ambiguous: bool,
}

impl Failure {
    /// From the API client's error: a 4xx answer (but 408) is a clear rejection; anything
    /// else (5xx, 408, a timeout, a lost connection, an unreadable answer) may have been
    /// committed.
    fn of(error: &kube::Error) -> Self {
        let rejected =
            matches!(error, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 408);
        Failure {
            message: error.to_string(),
            ambiguous: !rejected,
        }
    }
}

/// What one write changes: a node (by name) and which of its objects.
type Key = (String, Object);

/// The key of `write`.
fn key(write: &Write) -> Key {
    (write.node().to_owned(), write.object())
}

/// How a failing write is named on the ProxyConfig ([`WriterState::failing`]): the node for
/// its NodeProxyConfig, the node and the label for its label.
fn failing_name((node, object): &Key) -> String {
    match object {
        Object::NodeProxyConfig => node.clone(),
        Object::Label => format!("{node} (label {SERVICE_PROXY_LABEL})"),
    }
}

/// A write the stores have not shown yet (in flight, or sent and not yet watched).
#[derive(Clone, Debug)]
pub enum Expected {
    /// The node's NodeProxyConfig carries `revision`, controlled by `owner`.
    Assigned {
        /// The ProxyConfig that wrote it.
        owner: String,
        /// `spec.revision`.
        revision: String,
        /// `spec.assignedAt`.
        assigned_at: Timestamp,
        /// `spec.config.serviceProxy`.
        service_proxy: ServiceProxy,
    },
    /// The node's NodeProxyConfig is gone.
    Deleted,
    /// The Node's [`SERVICE_PROXY_LABEL`] has this value.
    Labelled(ServiceProxy),
}

/// What the stores show of a node, to tell whether a sent write is shown.
struct Shown<'s, 'n> {
    /// The node's NodeProxyConfig, if any.
    npc: Option<&'s &'n NodeProxyConfig>,
    /// The node's [`SERVICE_PROXY_LABEL`] value, if any.
    label: Option<String>,
}

/// A write waiting to be sent (or retried).
#[derive(Debug)]
struct Queued {
    /// The controlling ProxyConfig (its name keys the replacement by a later decision).
    owner: OwnerReference,
    write: Write,
    /// Position in the queue (the order writes were first asked for; a retry goes to the back).
    seq: u64,
    /// Failed attempts so far.
    attempts: u32,
    /// Not sent before this (a retry's backoff).
    not_before: Instant,
    /// `spec.assignedAt`, fixed by the first attempt.
    assigned_at: Option<Timestamp>,
}

/// A write sent (or being sent), until the stores show it.
#[derive(Debug)]
struct Sent {
    expected: Expected,
    /// The uid of the ProxyConfig that asked for it.
    owner_uid: String,
    /// When it was sent (None while in flight: it does not expire then).
    at: Option<Timestamp>,
}

impl Expected {
    /// Whether `shown` (what the stores show of the node) shows this write.
    fn shown_by(&self, shown: &Shown<'_, '_>) -> bool {
        match self {
            Expected::Assigned { revision, .. } => {
                shown.npc.map(|n| &n.spec.revision) == Some(revision)
            }
            Expected::Deleted => shown.npc.is_none(),
            Expected::Labelled(proxy) => shown.label.as_deref() == Some(proxy.as_str()),
        }
    }

    /// Whether `write` of the ProxyConfig named `owner` is this write (the same revision from
    /// the same owner, or a delete); `assignedAt` aside.
    fn is(&self, owner: &str, write: &Write) -> bool {
        match (self, write) {
            (
                Expected::Assigned {
                    owner: o,
                    revision: r,
                    ..
                },
                Write::Assign { revision, .. },
            ) => o == owner && **r == **revision,
            (Expected::Deleted, Write::Delete { .. }) => true,
            (Expected::Labelled(proxy), Write::Label(label)) => *proxy == label.proxy,
            _ => false,
        }
    }
}

/// The writer's bookkeeping, behind [`Writer::lock`].
#[derive(Debug, Default)]
pub struct WriterState {
    /// Per node and object, the write to send (latest wins).
    queued: HashMap<Key, Queued>,
    /// Queue order: seq → node and object.
    order: BTreeMap<u64, Key>,
    next_seq: u64,
    /// Nodes and objects with a write in flight.
    in_flight: HashSet<Key>,
    /// Writes in flight or sent, by node and object, until the stores show them.
    sent: HashMap<Key, Sent>,
    /// Per ProxyConfig: writes whose latest attempt failed ([`failing_name`]), with the error.
    failing: HashMap<String, BTreeMap<String, String>>,
    /// Nodes and objects in doubt: the write that may still be committed, and until when.
    in_doubt: HashMap<Key, (Expected, Instant)>,
}

/// The writer: a queue of NodeProxyConfig writes and `concurrency` workers sending them.
pub struct Writer {
    client: Client,
    metrics: Metrics,
    state: Mutex<WriterState>,
    /// Wakes the workers when the queue changes or a node's write finishes.
    wake: Notify,
    /// Reconciles the ProxyConfig whose failing writes changed (to report them).
    triggers: mpsc::UnboundedSender<ObjectRef<StoredProxyConfig>>,
    /// The ProxyConfigs that exist (a write of one not in it is dropped); None: not checked.
    owners: Option<reflector::Store<StoredProxyConfig>>,
}

fn backoff(attempts: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
}

fn kind(write: &Write) -> &'static str {
    match write {
        Write::Assign { .. } => "apply",
        Write::Delete { .. } => "delete",
        Write::Label(_) => "label",
    }
}

impl WriterState {
    /// The NodeProxyConfig writes the stores do not show yet, laid over them by the next
    /// decision: those in flight and those sent less than `EXPECTATION_TTL` (120 s) ago that
    /// `stored` (NodeProxyConfig by name) does not show yet. Forgets the writes the stores show
    /// (`label`: a Node's [`SERVICE_PROXY_LABEL`] value, by node name, for label writes: the
    /// decision sees a label it asked for as not yet set, and [`Self::submit`] does not queue it
    /// again while it is sent).
    pub fn overlay(
        &mut self,
        stored: &HashMap<&str, &NodeProxyConfig>,
        label: &dyn Fn(&str) -> Option<String>,
        now: Timestamp,
    ) -> Vec<(String, Expected)> {
        let expiry = now.checked_sub(EXPECTATION_TTL).unwrap_or(Timestamp::MIN);
        let shown = |(node, object): &Key| Shown {
            npc: stored.get(node.as_str()),
            label: (*object == Object::Label).then(|| label(node)).flatten(),
        };
        self.sent.retain(|key, sent| {
            !sent.expected.shown_by(&shown(key)) && sent.at.is_none_or(|at| at > expiry)
        });
        // A write in doubt that the stores show was committed: later writes come after it.
        self.in_doubt
            .retain(|key, (expected, _)| !expected.shown_by(&shown(key)));
        self.sent
            .iter()
            .filter(|((_, object), _)| *object == Object::NodeProxyConfig)
            .map(|((node, _), sent)| (node.clone(), sent.expected.clone()))
            .collect()
    }

    /// Writes of ProxyConfig `owner` whose latest attempt failed, with the error: by node for
    /// NodeProxyConfigs, by node and label for labels (see [`failing_name`]).
    pub fn failing(&self, owner: &str) -> BTreeMap<String, String> {
        self.failing.get(owner).cloned().unwrap_or_default()
    }

    /// Writes queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Replaces `owner`'s queued writes with `writes` (the latest decision of the
    /// ProxyConfig it references): see the module docs. Queued writes of an earlier ProxyConfig
    /// of the same name (another uid) are replaced too. Returns whether anything was queued.
    pub fn submit(&mut self, owner: &OwnerReference, writes: Vec<Write>) -> bool {
        let wanted: HashMap<Key, &Write> = writes.iter().map(|w| (key(w), w)).collect();
        let mut cancelled = Vec::new();
        self.queued.retain(|key, queued| {
            let keep = queued.owner.name != owner.name
                || (queued.owner.uid == owner.uid && wanted.get(key) == Some(&&queued.write));
            if !keep {
                cancelled.push((queued.seq, key.clone()));
            }
            keep
        });
        if let Some(failing) = self.failing.get_mut(&owner.name) {
            for (_, key) in &cancelled {
                failing.remove(&failing_name(key));
            }
        }
        for (seq, _) in cancelled {
            self.order.remove(&seq);
        }
        let mut added = false;
        for write in writes {
            let key = key(&write);
            if self.queued.contains_key(&key) || self.is_sent(owner, &write) {
                continue;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.order.insert(seq, key.clone());
            self.queued.insert(
                key,
                Queued {
                    owner: owner.clone(),
                    write,
                    seq,
                    attempts: 0,
                    not_before: Instant::now(),
                    assigned_at: None,
                },
            );
            added = true;
        }
        added
    }

    /// Whether `write` of `owner` is in flight or sent and not yet shown by the stores.
    fn is_sent(&self, owner: &OwnerReference, write: &Write) -> bool {
        self.sent.get(&key(write)).is_some_and(|sent| {
            sent.expected.is(&owner.name, write)
                && (matches!(write, Write::Delete { .. }) || sent.owner_uid == owner.uid)
        })
    }

    /// Until when `queued` must wait for its node's write in doubt (None: it need not: no
    /// write in doubt, or `queued` is that write again).
    fn held_until(&self, queued: &Queued) -> Option<Instant> {
        let (expected, until) = self.in_doubt.get(&key(&queued.write))?;
        (!expected.is(&queued.owner.name, &queued.write)).then_some(*until)
    }

    /// Takes the first queued write that is due, whose node has none in flight and is not
    /// held in doubt for another write, marks it in flight (laid over the stores from now on)
    /// and fixes its `assignedAt`; otherwise when the earliest queued write is due.
    fn take(&mut self, now: Instant) -> Result<Queued, Option<Instant>> {
        let mut earliest: Option<Instant> = None;
        let mut found = None;
        self.in_doubt.retain(|_, (_, until)| *until > now);
        for (seq, key) in &self.order {
            if self.in_flight.contains(key) {
                continue;
            }
            let queued = &self.queued[key];
            let due = if queued.not_before > now {
                Some(queued.not_before)
            } else {
                self.held_until(queued)
            };
            match due {
                None => {
                    found = Some((*seq, key.clone()));
                    break;
                }
                Some(due) => earliest = Some(earliest.map_or(due, |e| e.min(due))),
            }
        }
        let Some((seq, key)) = found else {
            return Err(earliest);
        };
        self.order.remove(&seq);
        let mut queued = self.queued.remove(&key).expect("ordered writes are queued");
        let assigned_at = *queued.assigned_at.get_or_insert_with(Timestamp::now);
        let expected = match &queued.write {
            Write::Assign {
                revision, config, ..
            } => Expected::Assigned {
                owner: queued.owner.name.clone(),
                revision: revision.to_string(),
                assigned_at,
                service_proxy: config.service_proxy,
            },
            Write::Delete { .. } => Expected::Deleted,
            Write::Label(label) => Expected::Labelled(label.proxy),
        };
        self.in_flight.insert(key.clone());
        self.sent.insert(
            key,
            Sent {
                expected,
                owner_uid: queued.owner.uid.clone(),
                at: None,
            },
        );
        Ok(queued)
    }

    /// Forgets a write [`Self::take`] gave out without sending it (its ProxyConfig is gone).
    fn drop_taken(&mut self, queued: Queued) {
        let key = key(&queued.write);
        self.in_flight.remove(&key);
        self.sent.remove(&key);
        self.failing.remove(&queued.owner.name);
    }

    /// Records the outcome of a write [`Self::take`] gave out, at `now`; returns whether the
    /// owner is to be reconciled: its failing writes changed (its status should say so), or
    /// the write failed (a decision taken while it was in flight may cancel its retry; see the
    /// module docs).
    fn finish(&mut self, mut queued: Queued, result: Result<(), Failure>, now: Instant) -> bool {
        let key = key(&queued.write);
        self.in_flight.remove(&key);
        let failing = self.failing.entry(queued.owner.name.clone()).or_default();
        match result {
            Ok(()) => {
                if let Some(sent) = self.sent.get_mut(&key) {
                    sent.at = Some(Timestamp::now());
                }
                self.in_doubt.remove(&key);
                failing.remove(&failing_name(&key)).is_some()
            }
            Err(failure) => {
                let sent = self.sent.remove(&key);
                failing.insert(failing_name(&key), failure.message);
                if failure.ambiguous
                    && let Some(sent) = sent
                {
                    self.in_doubt
                        .insert(key.clone(), (sent.expected, now + IN_DOUBT));
                }
                // Latest wins: a write queued for the node meanwhile replaces this one.
                if !self.queued.contains_key(&key) {
                    queued.attempts += 1;
                    queued.not_before = now + backoff(queued.attempts);
                    queued.seq = self.next_seq;
                    self.next_seq += 1;
                    self.order.insert(queued.seq, key.clone());
                    self.queued.insert(key, queued);
                }
                true
            }
        }
    }
}

impl Writer {
    /// A writer over `client`, with no worker yet ([`Writer::start`]), and the stream of
    /// ProxyConfigs to reconcile because their failing writes changed. With `owners`, a write
    /// of a ProxyConfig not in it (by name and uid) is dropped when its turn comes.
    pub fn new(
        client: Client,
        metrics: Metrics,
        owners: Option<reflector::Store<StoredProxyConfig>>,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<ObjectRef<StoredProxyConfig>>,
    ) {
        let (triggers, receiver) = mpsc::unbounded();
        let writer = Writer {
            client,
            metrics,
            state: Mutex::new(WriterState::default()),
            wake: Notify::new(),
            triggers,
            owners,
        };
        (Arc::new(writer), receiver)
    }

    /// Whether the ProxyConfig `owner` references still exists (true when not checked).
    fn owner_exists(&self, owner: &OwnerReference) -> bool {
        self.owners.as_ref().is_none_or(|store| {
            store
                .get(&ObjectRef::new(&owner.name))
                .is_some_and(|pc| pc.metadata.uid.as_deref() == Some(owner.uid.as_str()))
        })
    }

    /// The bookkeeping (the overlay, failing writes, submitting): see the module docs. Wakes
    /// the workers when dropped.
    pub fn lock(&self) -> WriterGuard<'_> {
        WriterGuard {
            state: self.state.lock().expect("writer lock"),
            writer: self,
        }
    }

    /// Starts `concurrency` workers sending the queued writes; they stop when the returned set
    /// is dropped (a write in flight is abandoned).
    #[must_use = "dropping the set stops the workers"]
    pub fn start(self: &Arc<Self>, concurrency: usize) -> JoinSet<()> {
        let mut workers = JoinSet::new();
        for _ in 0..concurrency {
            workers.spawn(self.clone().work());
        }
        workers
    }

    /// One worker: sends the writes due, one at a time, forever.
    async fn work(self: Arc<Self>) {
        loop {
            let queued = self.next_due().await;
            if !self.owner_exists(&queued.owner) {
                tracing::info!(proxyconfig = %queued.owner.name, node = queued.write.node(), "ProxyConfig deleted: write dropped");
                self.state.lock().expect("writer lock").drop_taken(queued);
                continue;
            }
            let result = self.send_counted(&queued).await;
            self.finished(queued, result);
        }
    }

    /// The next write due, once there is one.
    async fn next_due(&self) -> Queued {
        loop {
            let wake = self.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let taken = self.state.lock().expect("writer lock").take(Instant::now());
            match taken {
                Ok(queued) => return queued,
                Err(Some(due)) => {
                    let _ = tokio::time::timeout_at(due, wake).await;
                }
                Err(None) => wake.await,
            }
        }
    }

    /// Sends `queued`, counting it in the metrics (a failure also logged).
    async fn send_counted(&self, queued: &Queued) -> Result<(), Failure> {
        let assigned_at = queued.assigned_at.expect("take fixes assignedAt");
        let result = send(&self.client, &queued.owner, &queued.write, assigned_at).await;
        let write_kind = kind(&queued.write);
        match result {
            Ok(()) => {
                self.metrics
                    .writes
                    .total
                    .with_label_values(&[write_kind])
                    .inc();
                Ok(())
            }
            Err(e) => {
                self.metrics
                    .writes
                    .errors
                    .with_label_values(&[write_kind])
                    .inc();
                tracing::warn!(proxyconfig = %queued.owner.name, node = queued.write.node(), error = %e, "write failed; retrying");
                Err(Failure::of(&e))
            }
        }
    }

    /// `queued` was sent with `result`: the state takes it in, its ProxyConfig is reconciled
    /// when that changes what it reports, and the workers wake (the node may have another write
    /// waiting for this one).
    fn finished(&self, queued: Queued, result: Result<(), Failure>) {
        let owner = queued.owner.name.clone();
        let changed = {
            let mut state = self.state.lock().expect("writer lock");
            let changed = state.finish(queued, result, Instant::now());
            self.metrics.writes.queue.set(state.queued() as i64);
            changed
        };
        if changed {
            let _ = self.triggers.unbounded_send(ObjectRef::new(&owner));
        }
        self.wake.notify_waiters();
    }
}

/// [`Writer::lock`]'s guard: the state, and waking the workers when released.
pub struct WriterGuard<'w> {
    state: MutexGuard<'w, WriterState>,
    writer: &'w Writer,
}

impl std::ops::Deref for WriterGuard<'_> {
    type Target = WriterState;
    fn deref(&self) -> &WriterState {
        &self.state
    }
}

impl std::ops::DerefMut for WriterGuard<'_> {
    fn deref_mut(&mut self) -> &mut WriterState {
        &mut self.state
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.writer
            .metrics
            .writes
            .queue
            .set(self.state.queued() as i64);
        self.writer.wake.notify_waiters();
    }
}

/// One write: server-side apply of [`Write::node_proxy_config`] (forced, field manager
/// `kipvs-operator`), a delete (already gone is fine), or server-side apply of a Node's
/// service proxy label ([`crate::rollout::Label::node_patch`]: the same field manager, which
/// then manages that one label of the Node and nothing else).
async fn send(
    client: &Client,
    owner: &OwnerReference,
    write: &Write,
    assigned_at: Timestamp,
) -> Result<(), kube::Error> {
    let api: Api<NodeProxyConfig> = Api::all(client.clone());
    match write {
        Write::Assign { node, .. } => {
            let npc = write
                .node_proxy_config(owner, assigned_at)
                .expect("an Assign is a NodeProxyConfig");
            let params = PatchParams::apply(OPERATOR_FIELD_MANAGER).force();
            api.patch(node, &params, &Patch::Apply(&npc))
                .await
                .map(drop)
        }
        Write::Delete { node } => match api.delete(node, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e),
        },
        Write::Label(label) => {
            let nodes: Api<Node> = Api::all(client.clone());
            let params = PatchParams::apply(OPERATOR_FIELD_MANAGER).force();
            nodes
                .patch(&label.node, &params, &Patch::Apply(&label.node_patch()))
                .await
                .map(drop)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kipvs_crds::{NodeProxyConfigSpec, ProxierConfiguration};

    fn owner(name: &str) -> OwnerReference {
        OwnerReference {
            api_version: "kipvs.io/v1alpha1".into(),
            kind: "ProxyConfig".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    fn assign(node: &str, revision: &str) -> Write {
        Write::Assign {
            node: node.into(),
            node_uid: None,
            revision: revision.into(),
            config: Arc::new(ProxierConfiguration::default()),
        }
    }

    /// No Node carries a service proxy label.
    fn no_label(_: &str) -> Option<String> {
        None
    }

    fn stored(node: &str, revision: &str) -> NodeProxyConfig {
        NodeProxyConfig::new(
            node,
            NodeProxyConfigSpec {
                revision: revision.into(),
                assigned_at: Time(Timestamp::now()),
                config: ProxierConfiguration::default(),
            },
        )
    }

    /// The queue, in order: (node, revision or "delete").
    fn queue(state: &WriterState) -> Vec<(String, String)> {
        state
            .order
            .values()
            .map(|key| {
                let revision = match &state.queued[key].write {
                    Write::Assign { revision, .. } => revision.to_string(),
                    Write::Delete { .. } => "delete".into(),
                    Write::Label(label) => format!("label {}", label.proxy.as_str()),
                };
                (key.0.clone(), revision)
            })
            .collect()
    }

    /// A clear rejection (a 4xx).
    fn rejected(message: &str) -> Failure {
        Failure {
            message: message.into(),
            ambiguous: false,
        }
    }

    /// A failure that may have been committed (a 504, a lost connection).
    fn unknown(message: &str) -> Failure {
        Failure {
            message: message.into(),
            ambiguous: true,
        }
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn the_latest_decision_replaces_its_unsent_writes_and_keeps_their_order() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(
            &fleet,
            vec![assign("a", "r1"), assign("b", "r1"), assign("c", "r1")],
        );
        // A new revision: its canary (c) keeps its place only if asked for with the same
        // write; r1's unsent writes for a and b are dropped, not sent after it.
        state.submit(&fleet, vec![assign("c", "r2"), assign("d", "r2")]);
        assert_eq!(queue(&state), pairs(&[("c", "r2"), ("d", "r2")]));
        // Asked for again (the next decision): same place, nothing added.
        assert!(!state.submit(&fleet, vec![assign("c", "r2"), assign("d", "r2")]));
        assert_eq!(queue(&state), pairs(&[("c", "r2"), ("d", "r2")]));
        // Another ProxyConfig's writes are not its business.
        state.submit(&owner("pool"), vec![assign("p", "x")]);
        state.submit(&fleet, vec![Write::Delete { node: "d".into() }]);
        assert_eq!(queue(&state), pairs(&[("p", "x"), ("d", "delete")]));
        // An empty decision (paused, invalid spec) leaves nothing of its own queued.
        state.submit(&fleet, vec![]);
        assert_eq!(queue(&state), pairs(&[("p", "x")]));
    }

    #[test]
    fn a_write_in_flight_or_sent_is_never_queued_again_until_the_stores_show_it() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
        let a = state.take(Instant::now()).expect("a is due");
        assert_eq!(a.write.node(), "a");
        // In flight: laid over the stores, and not queued again by the next decision.
        let empty = HashMap::new();
        let overlay = state.overlay(&empty, &no_label, Timestamp::now());
        assert!(
            matches!(&overlay[..], [(node, Expected::Assigned { revision, .. })] if node == "a" && revision == "r1")
        );
        assert!(!state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]));
        assert_eq!(queue(&state), pairs(&[("b", "r1")]));
        assert!(!state.finish(a, Ok(()), Instant::now()));
        // Sent, not yet watched: still laid over, still not queued again.
        assert_eq!(state.overlay(&empty, &no_label, Timestamp::now()).len(), 1);
        assert!(!state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]));
        // The store shows it: forgotten; a decision still asking for it (it would not) would
        // queue it, and one asking for another revision does.
        let npc = stored("a", "r1");
        let shown = HashMap::from([("a", &npc)]);
        assert!(
            state
                .overlay(&shown, &no_label, Timestamp::now())
                .is_empty()
        );
        assert!(state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]));
        assert_eq!(queue(&state), pairs(&[("b", "r1"), ("a", "r2")]));
    }

    #[test]
    fn a_failed_write_is_retried_with_backoff_and_the_same_assigned_at_and_reported() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1")]);
        let start = Instant::now();
        let first = state.take(start).expect("due");
        let assigned_at = first.assigned_at.expect("fixed by the first attempt");
        assert!(
            state.finish(first, Err(rejected("apiserver down")), start),
            "newly failing"
        );
        // Not laid over any more (it may not have happened); reported; queued again, later.
        assert!(
            state
                .overlay(&HashMap::new(), &no_label, Timestamp::now())
                .is_empty()
        );
        assert_eq!(
            state.failing("fleet"),
            BTreeMap::from([("a".to_owned(), "apiserver down".to_owned())])
        );
        let due = state
            .take(start)
            .expect_err("backing off")
            .expect("a due time");
        assert!(due >= start + FIRST_BACKOFF, "{due:?}");
        let second = state.take(due).expect("due after the backoff");
        assert_eq!(second.assigned_at, Some(assigned_at), "the same object");
        assert_eq!(second.attempts, 1);
        assert!(
            state.finish(second, Err(rejected("still down")), due),
            "every failure triggers a decision"
        );
        let due2 = state
            .take(due)
            .expect_err("backing off")
            .expect("a due time");
        assert!(due2 >= due + 2 * FIRST_BACKOFF, "the backoff doubles");
        let third = state.take(due2).expect("due");
        assert!(state.finish(third, Ok(()), due2), "no longer failing");
        assert!(state.failing("fleet").is_empty());
        assert_eq!(backoff(20), MAX_BACKOFF);
    }

    #[test]
    fn a_failed_write_no_longer_asked_for_is_dropped_and_not_reported() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1")]);
        let a = state.take(Instant::now()).expect("due");
        state.finish(a, Err(rejected("conflict")), Instant::now());
        state.submit(&fleet, vec![assign("a", "r2")]);
        assert_eq!(queue(&state), pairs(&[("a", "r2")]));
        assert!(state.failing("fleet").is_empty());
        assert_eq!(
            state.queued[&("a".to_owned(), Object::NodeProxyConfig)].attempts,
            0,
            "a new write starts afresh"
        );
    }

    #[test]
    fn a_dropped_write_is_forgotten() {
        let mut state = WriterState::default();
        state.submit(&owner("gone"), vec![assign("a", "r1")]);
        let a = state.take(Instant::now()).expect("due");
        state.drop_taken(a);
        assert!(
            state
                .overlay(&HashMap::new(), &no_label, Timestamp::now())
                .is_empty()
        );
        assert_eq!(state.queued(), 0);
        assert_eq!(state.take(Instant::now()).err(), Some(None));
    }

    #[test]
    fn one_node_has_one_write_in_flight() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
        let a = state.take(Instant::now()).expect("due");
        // A new revision for a while r1 is in flight: queued behind it, b goes first.
        state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]);
        let b = state.take(Instant::now()).expect("b is due");
        assert_eq!(b.write.node(), "b");
        assert_eq!(
            state.take(Instant::now()).err(),
            Some(None),
            "a waits for a"
        );
        state.finish(a, Ok(()), Instant::now());
        let a2 = state.take(Instant::now()).expect("now a's next write");
        assert!(matches!(&a2.write, Write::Assign { revision, .. } if &**revision == "r2"));
    }

    /// A decision taken while a's retry is in flight does not ask for a (the overlay shows
    /// it) and, submitted after the retry failed, cancels it; the failed retry triggers the
    /// owner's reconcile, which asks for a again instead of waiting for the next resync.
    #[test]
    fn a_retry_cancelled_by_a_decision_taken_while_it_was_in_flight_is_asked_for_again() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1")]);
        let start = Instant::now();
        let first = state.take(start).expect("due");
        assert!(state.finish(first, Err(rejected("apiserver busy")), start));
        let due = state.take(start).expect_err("backing off").expect("due");
        let retry = state.take(due).expect("the retry");
        // The decision: a is in flight, laid over the stores, so it is not asked for.
        let overlay = state.overlay(&HashMap::new(), &no_label, Timestamp::now());
        assert_eq!(overlay.len(), 1);
        // The retry fails again: the owner is to be reconciled, although the node was failing
        // already.
        assert!(
            state.finish(retry, Err(rejected("apiserver busy")), due),
            "a failed retry triggers the owner's reconcile"
        );
        // The decision from before is submitted now and cancels the retry ...
        state.submit(&fleet, vec![]);
        assert_eq!(queue(&state), pairs(&[]));
        // ... and the triggered one, deciding from the stores without a, asks for it again.
        assert!(
            state
                .overlay(&HashMap::new(), &no_label, Timestamp::now())
                .is_empty()
        );
        assert!(state.submit(&fleet, vec![assign("a", "r1")]));
        assert_eq!(queue(&state), pairs(&[("a", "r1")]));
    }

    /// After an ambiguous failure (a 504 on a write that may be committed later, or is still
    /// being committed) a newer revision's write waits, so that the older one cannot land
    /// after it.
    #[test]
    fn a_node_in_doubt_gets_no_other_write_until_the_doubt_is_resolved() {
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1"), assign("b", "r1")]);
        let start = Instant::now();
        let a1 = state.take(start).expect("a");
        state.finish(a1, Err(unknown("504 Gateway Timeout")), start);
        // A new revision for a: not sent while r1 may still land.
        state.submit(&fleet, vec![assign("a", "r2"), assign("b", "r1")]);
        let now = Instant::now();
        let b = state.take(now).expect("b is not in doubt");
        assert_eq!(b.write.node(), "b");
        assert_eq!(
            state.take(now).err(),
            Some(Some(start + IN_DOUBT)),
            "a waits until the doubt expires"
        );
        // The stores show r1 on a: it landed, r2 comes after it.
        let npc = stored("a", "r1");
        state.overlay(&HashMap::from([("a", &npc)]), &no_label, Timestamp::now());
        let a2 = state.take(now).expect("resolved");
        assert!(matches!(&a2.write, Write::Assign { revision, .. } if &**revision == "r2"));

        // Never shown: the doubt expires (the apiserver no longer commits the request).
        let mut state = WriterState::default();
        state.submit(&fleet, vec![assign("c", "r1")]);
        let start = Instant::now();
        let c1 = state.take(start).expect("c");
        state.finish(c1, Err(unknown("connection reset")), start);
        state.submit(&fleet, vec![Write::Delete { node: "c".into() }]);
        assert!(
            state
                .take(start + IN_DOUBT - Duration::from_secs(1))
                .is_err()
        );
        let c2 = state.take(start + IN_DOUBT).expect("the doubt expired");
        assert_eq!(kind(&c2.write), "delete");

        // The same write again (its retry) is not held back, and its success resolves it; a
        // clear rejection (a 4xx) holds nothing.
        let mut state = WriterState::default();
        state.submit(&fleet, vec![assign("d", "r1")]);
        let start = Instant::now();
        let d1 = state.take(start).expect("d");
        state.finish(d1, Err(unknown("503")), start);
        let later = start + Duration::from_secs(1);
        let d2 = state.take(later).expect("its retry");
        state.finish(d2, Ok(()), later);
        state.submit(&fleet, vec![assign("d", "r2")]);
        assert!(state.take(later).is_ok(), "resolved");
        state.submit(&fleet, vec![assign("e", "r1")]);
        let e1 = state.take(later).expect("e");
        state.finish(e1, Err(rejected("422 Invalid")), later);
        state.submit(&fleet, vec![assign("e", "r2")]);
        assert!(state.take(later).is_ok(), "nothing in doubt");
    }

    /// A ProxyConfig deleted and recreated under the same name does not inherit the old one's
    /// queued writes (they would be dropped as the deleted owner's when their turn came, and
    /// nothing would ask for them again).
    #[test]
    fn a_proxyconfig_recreated_under_the_same_name_queues_its_own_writes() {
        let mut state = WriterState::default();
        let old = owner("fleet");
        state.submit(&old, vec![assign("a", "r1"), assign("b", "r1")]);
        let in_flight = state.take(Instant::now()).expect("a");
        assert_eq!(in_flight.write.node(), "a");
        let mut new = owner("fleet");
        new.uid = "uid-fleet-2".into();
        // The same writes by the new incarnation: queued as its own, not kept as the old one's;
        // a, in flight for the old one, is not the new one's.
        assert!(state.submit(&new, vec![assign("a", "r1"), assign("b", "r1")]));
        let owners: Vec<&str> = state
            .queued
            .values()
            .map(|q| q.owner.uid.as_str())
            .collect();
        assert_eq!(owners, ["uid-fleet-2", "uid-fleet-2"]);
        assert_eq!(queue(&state), pairs(&[("a", "r1"), ("b", "r1")]));
    }

    /// A node's NodeProxyConfig and its label are two writes with their own places, retries
    /// and reports: a label that keeps failing is named apart and holds back neither its node's
    /// NodeProxyConfig nor the other nodes' labels; a label sent and not yet shown is not
    /// queued again.
    #[test]
    fn a_label_is_its_own_write_and_its_failure_blocks_nothing_else() {
        use crate::rollout::Label;
        let label = |node: &str| {
            Write::Label(Label {
                node: node.into(),
                proxy: ServiceProxy::Kipvs,
            })
        };
        let mut state = WriterState::default();
        let fleet = owner("fleet");
        state.submit(&fleet, vec![assign("a", "r1"), label("a"), label("b")]);
        assert_eq!(
            queue(&state),
            pairs(&[("a", "r1"), ("a", "label kipvs"), ("b", "label kipvs")])
        );
        let now = Instant::now();
        let npc = state.take(now).expect("a's NodeProxyConfig");
        let a_label = state
            .take(now)
            .expect("a's label, though a has a write in flight");
        assert_eq!(a_label.write, label("a"));
        let b_label = state.take(now).expect("b's label");
        assert!(state.finish(a_label, Err(rejected("403 Forbidden")), now));
        assert!(!state.finish(npc, Ok(()), now));
        assert!(!state.finish(b_label, Ok(()), now));
        assert_eq!(
            state.failing("fleet"),
            BTreeMap::from([(
                format!("a (label {SERVICE_PROXY_LABEL})"),
                "403 Forbidden".to_owned()
            )])
        );
        // The NodeProxyConfig overlay carries no label; b's label, sent and not yet shown, is
        // not queued again; once shown it is forgotten.
        let overlay = state.overlay(&HashMap::new(), &no_label, Timestamp::now());
        assert!(
            overlay
                .iter()
                .all(|(_, e)| matches!(e, Expected::Assigned { .. })),
            "{overlay:?}"
        );
        assert!(!state.submit(&fleet, vec![assign("a", "r1"), label("a"), label("b")]));
        let kipvs = |node: &str| (node == "b").then(|| "kipvs".to_owned());
        state.overlay(&HashMap::new(), &kipvs, Timestamp::now());
        assert!(!state.is_sent(&fleet, &label("b")));
    }
}

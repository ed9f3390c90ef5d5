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
mod tests;

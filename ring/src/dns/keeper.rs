//! The leader's DNS duty: publish the desired records (with a [`Publisher`], for providers that
//! push to a server) and check what every authoritative server answers, until each change is
//! visible everywhere; the result is [`DnsStatus`], which `ringctl dns list` and `ringctl
//! status` show.
//!
//! Every member runs a keeper; only the leader's acts. A new leader starts from nothing: it
//! sends every record once (that is its reconcile) and checks them all. While leading it
//! sends only what changed, and every `reconcile_interval_ms` checks every record on every
//! server, resending what drifted (a server restarted without its journal, an operator's hand
//! edit).
//!
//! Ordering (DESIGN.md rule 3) comes from [`super::records::desired_records`]: a record
//! changes only once the new assignment is committed and the new host has reported healthy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::sync::watch;

use super::query::{Observed, observe};
use super::records::{DesiredRecord, desired_values};
use super::update::{Change, RecordValue};
use crate::core::limits::MAX_DNS_UPDATE_CHANGES;
use crate::metrics::{DNS_PROPAGATION_BUCKETS_S, Histogram};
use crate::raft::{NodeId, RaftNode, StateMachineStore};
use crate::time::unix_ms;

/// How often the keeper looks again when nothing wakes it.
const TICK: Duration = Duration::from_millis(200);
/// How often it asks again while a change is not visible everywhere yet.
const PENDING_TICK: Duration = Duration::from_millis(50);
/// First wait after a failed publish; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Longest wait between publish attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Most queries in flight at once.
const MAX_QUERIES_IN_FLIGHT: usize = 32;

/// Why a publish failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    /// What happened, naming the server (and key).
    pub message: String,
    /// Whether trying again unchanged may succeed (a timeout, a server down); if not, it is
    /// still retried, at the slowest pace, since an operator may fix the server or the key.
    pub retryable: bool,
}

/// Sends record changes to a DNS server.
pub trait Publisher: Send {
    /// Applies `changes` (at most [`MAX_DNS_UPDATE_CHANGES`]) in one atomic transaction.
    fn publish(
        &mut self,
        changes: Vec<Change>,
    ) -> futures::future::BoxFuture<'_, Result<(), PublishError>>;
    /// The server changes are sent to.
    fn server(&self) -> SocketAddr;
}

/// What the leader knows of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordStatus {
    /// The record the ring wants.
    pub desired: DesiredRecord,
    /// When (unix ms) this leader first saw the desired value: about when it was committed.
    pub since_unix_ms: u64,
    /// What each server answered last.
    pub answers: Answers,
    /// How long after `since_unix_ms` every server answered the desired value.
    pub visible_after_ms: Option<u64>,
    /// Whether its propagation is still to be observed in `garden_ring_dns_propagation_seconds`:
    /// the value changed while this member led, and has not been seen everywhere yet. The
    /// values a new leader inherits are not timed (their `since_unix_ms` is when it took over,
    /// not when they were committed), nor a new name that should have no record (nothing
    /// changes), nor a record seen again after it drifted.
    pub timed: bool,
}

impl RecordStatus {
    /// Whether every server answers the desired value.
    pub fn visible(&self, servers: &[SocketAddr]) -> bool {
        servers.iter().all(|s| {
            self.answers
                .get(s)
                .is_some_and(|o| o.matches(&self.desired.value))
        })
    }
}

/// What each server answered last, in server order: a short list (at most 16 servers are
/// checked), kept per record, so a map's node for a single answer is not paid thousands of
/// times over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers(Vec<(SocketAddr, Observed)>);

impl Answers {
    /// What `server` answered last.
    pub fn get(&self, server: &SocketAddr) -> Option<&Observed> {
        self.0
            .binary_search_by(|(s, _)| s.cmp(server))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Records what `server` answered.
    pub fn insert(&mut self, server: SocketAddr, seen: Observed) {
        match self.0.binary_search_by(|(s, _)| s.cmp(&server)) {
            Ok(i) => self.0[i].1 = seen,
            Err(i) => {
                // One more, not room for four: the leader keeps one list per record.
                self.0.reserve_exact(1);
                self.0.insert(i, (server, seen));
            }
        }
    }

    /// Every server's answer, in server order.
    pub fn iter(&self) -> impl Iterator<Item = (&SocketAddr, &Observed)> {
        self.0.iter().map(|(s, o)| (s, o))
    }
}

/// The last change that became visible everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Propagation {
    /// The record's name.
    pub name: String,
    /// Its value then.
    pub value: RecordValue,
    /// From the leader seeing it committed to every server answering it, ms.
    pub propagation_ms: u64,
}

/// The keeper's view, for status.
#[derive(Debug, Clone, Default)]
pub struct DnsView {
    /// Whether this member leads (only the leader's view is current).
    pub leading: bool,
    /// The provider, as configured.
    pub provider: String,
    /// The servers checked.
    pub servers: Vec<SocketAddr>,
    /// Per record name.
    pub records: BTreeMap<String, RecordStatus>,
    /// Problems now (publishing or checking), in words.
    pub problems: Vec<String>,
    /// The last change seen everywhere.
    pub last_change: Option<Propagation>,
}

/// The shared [`DnsView`].
#[derive(Debug, Clone, Default)]
pub struct DnsStatus(Arc<Mutex<DnsView>>);

impl DnsStatus {
    /// A copy of the current view.
    pub fn view(&self) -> DnsView {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut DnsView)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The keeper of one member.
pub struct Keeper {
    me: NodeId,
    raft: RaftNode,
    state: StateMachineStore,
    ttl_s: u32,
    servers: Vec<SocketAddr>,
    publisher: Option<Box<dyn Publisher>>,
    reconcile_every: Duration,
    timeout: Duration,
    status: DnsStatus,
    /// What the publisher's server holds, as far as this leader knows.
    published: BTreeMap<String, RecordValue>,
    next_publish: Instant,
    backoff: Duration,
    last_error: Option<String>,
    next_reconcile: Instant,
    /// Some record is not visible on every server yet.
    pending: bool,
    /// Propagation times of the changes this member saw through while leading.
    propagation: Arc<Histogram>,
}

/// The settings a keeper needs.
pub struct KeeperSettings {
    /// Record TTL, seconds.
    pub ttl_s: u32,
    /// Provider name, for status.
    pub provider: String,
    /// Servers to check.
    pub servers: Vec<SocketAddr>,
    /// Full check (and repair) interval.
    pub reconcile_every: Duration,
    /// Per exchange.
    pub timeout: Duration,
}

impl Keeper {
    /// A keeper for member `me`; `publisher` is `None` for providers nobody pushes to.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        state: StateMachineStore,
        settings: KeeperSettings,
        publisher: Option<Box<dyn Publisher>>,
    ) -> Self {
        let status = DnsStatus::default();
        status.update(|v| {
            v.provider = settings.provider.clone();
            v.servers = settings.servers.clone();
        });
        Self {
            me,
            raft,
            state,
            ttl_s: settings.ttl_s,
            servers: settings.servers,
            publisher,
            reconcile_every: settings.reconcile_every,
            timeout: settings.timeout,
            status,
            published: BTreeMap::new(),
            next_publish: Instant::now(),
            backoff: MIN_BACKOFF,
            last_error: None,
            next_reconcile: Instant::now(),
            pending: false,
            propagation: Arc::new(Histogram::new(&DNS_PROPAGATION_BUCKETS_S)),
        }
    }

    /// The histogram of propagation times (for `/metrics`): from the leader seeing a record's
    /// new value to every server answering it, for the changes committed while it leads.
    pub fn propagation(&self) -> Arc<Histogram> {
        self.propagation.clone()
    }

    /// The status this keeper keeps.
    pub fn status(&self) -> DnsStatus {
        self.status.clone()
    }

    fn leading(&self) -> bool {
        let m = self.raft.metrics().borrow_watched().clone();
        m.state == ServerState::Leader && m.current_leader == Some(self.me)
    }

    /// Forgets everything (this member stopped leading).
    fn step_down(&mut self) {
        self.published.clear();
        self.pending = false;
        self.next_publish = Instant::now();
        self.backoff = MIN_BACKOFF;
        self.last_error = None;
        self.next_reconcile = Instant::now();
        self.status.update(|v| {
            v.leading = false;
            v.records.clear();
            v.problems.clear();
            v.last_change = None;
        });
    }

    /// One round on the leader. The records' values are what it needs (`ringctl dns list` gets
    /// the words from the state itself), so it skips writing why each one is wanted: with
    /// thousands of control planes that was most of a round, and a round runs whenever the
    /// applied index moves.
    async fn round(&mut self) {
        let desired = self
            .state
            .read(|a| {
                a.state
                    .settings
                    .dns_zone
                    .is_some()
                    .then(|| desired_values(&a.state, self.ttl_s))
            })
            .unwrap_or_default();
        let now = unix_ms();
        self.status.update(|v| {
            // On the first round of a leadership every record is inherited: not timed.
            let inherited = !v.leading;
            v.leading = true;
            let wanted: BTreeMap<&str, &DesiredRecord> =
                desired.iter().map(|r| (r.name.as_str(), r)).collect();
            v.records
                .retain(|name, _| wanted.contains_key(name.as_str()));
            for record in &desired {
                match v.records.get_mut(&record.name) {
                    Some(s) if s.desired.value == record.value => {
                        if s.desired != *record {
                            s.desired = record.clone();
                        }
                    }
                    previous => {
                        // A name new to this leader that should have no record changes
                        // nothing in DNS (a control plane not running yet): not timed.
                        let changes_dns = previous.is_some() || record.value != RecordValue::Delete;
                        v.records.insert(
                            record.name.clone(),
                            RecordStatus {
                                desired: record.clone(),
                                since_unix_ms: now,
                                answers: Answers::default(),
                                visible_after_ms: None,
                                timed: !inherited && changes_dns,
                            },
                        );
                    }
                }
            }
        });
        self.publish(&desired).await;
        let full = Instant::now() >= self.next_reconcile;
        if full {
            self.next_reconcile = Instant::now() + self.reconcile_every;
        }
        self.check(full).await;
    }

    /// Sends what the publisher's server lacks, if a publish is due.
    async fn publish(&mut self, desired: &[DesiredRecord]) {
        let Some(publisher) = self.publisher.as_mut() else {
            return;
        };
        if Instant::now() < self.next_publish {
            return;
        }
        let mut changes: Vec<Change> = desired
            .iter()
            .filter(|r| self.published.get(&r.name) != Some(&r.value))
            .map(|r| Change::new(r.name.clone(), r.ttl_s, r.value.clone()))
            .collect();
        // Names this leader published that the ring no longer has (a removed control plane).
        let wanted: std::collections::BTreeSet<&str> =
            desired.iter().map(|r| r.name.as_str()).collect();
        let gone: Vec<String> = self
            .published
            .keys()
            .filter(|name| !wanted.contains(name.as_str()))
            .cloned()
            .collect();
        changes.extend(
            gone.into_iter()
                .map(|name| Change::new(name, self.ttl_s, RecordValue::Delete)),
        );
        for batch in changes.chunks(MAX_DNS_UPDATE_CHANGES) {
            match publisher.publish(batch.to_vec()).await {
                Ok(()) => {
                    for change in batch {
                        match change.value {
                            RecordValue::Delete if !wanted.contains(change.name.as_str()) => {
                                self.published.remove(&change.name);
                            }
                            _ => {
                                self.published
                                    .insert(change.name.clone(), change.value.clone());
                            }
                        }
                    }
                    if self.last_error.take().is_some() {
                        tracing::info!(server = %publisher.server(), "DNS updates are accepted again");
                    }
                    self.backoff = MIN_BACKOFF;
                    tracing::debug!(
                        server = %publisher.server(),
                        changes = batch.len(),
                        "DNS update applied"
                    );
                }
                Err(e) => {
                    if self.last_error.as_deref() != Some(e.message.as_str()) {
                        tracing::warn!(
                            server = %publisher.server(),
                            retryable = e.retryable,
                            "DNS update failed: {}; retrying with backoff",
                            e.message
                        );
                    }
                    self.backoff = if e.retryable {
                        (self.backoff * 2).min(MAX_BACKOFF)
                    } else {
                        MAX_BACKOFF
                    };
                    self.next_publish = Instant::now() + self.backoff;
                    self.last_error = Some(e.message);
                    break;
                }
            }
        }
        let problem = self.last_error.clone();
        self.status.update(|v| {
            v.problems.retain(|p| !p.starts_with("publishing: "));
            if let Some(p) = problem {
                v.problems.push(format!("publishing: {p}"));
            }
        });
    }

    /// Asks every server about the records not yet visible everywhere (all of them when `full`).
    async fn check(&mut self, full: bool) {
        let mut questions = Vec::new();
        let servers = &self.servers;
        self.status.update(|v| {
            for (name, record) in &v.records {
                for server in servers {
                    let known_good = record
                        .answers
                        .get(server)
                        .is_some_and(|o| o.matches(&record.desired.value));
                    if full || !known_good {
                        questions.push((name.clone(), *server, record.desired.value.clone()));
                    }
                }
            }
        });
        if questions.is_empty() {
            self.pending = false;
            return;
        }
        let timeout = self.timeout;
        use futures::StreamExt;
        let answers: Vec<(String, SocketAddr, Observed)> = futures::stream::iter(questions)
            .map(|(name, server, desired)| async move {
                let seen = observe(server, &name, &desired, timeout).await;
                (name, server, seen)
            })
            .buffer_unordered(MAX_QUERIES_IN_FLIGHT)
            .collect()
            .await;
        let now = unix_ms();
        let primary = self.publisher.as_ref().map(|p| p.server());
        let mut drifted = Vec::new();
        let servers = self.servers.clone();
        let mut pending = false;
        let propagation = &self.propagation;
        self.status.update(|v| {
            let mut failures = BTreeMap::new();
            for (name, server, seen) in answers {
                let Some(record) = v.records.get_mut(&name) else {
                    continue;
                };
                if let Observed::Failed(why) = &seen {
                    failures.insert(server, why.clone());
                }
                let good = seen.matches(&record.desired.value);
                // The primary answers right after it accepts an update, so a wrong answer
                // there for a record we sent means it lost it (not an outage: that fails).
                if !good && !matches!(seen, Observed::Failed(_)) && Some(server) == primary {
                    drifted.push((name.clone(), record.desired.value.clone()));
                }
                record.answers.insert(server, seen);
                if record.visible_after_ms.is_none() && record.visible(&servers) {
                    let after = now.saturating_sub(record.since_unix_ms);
                    record.visible_after_ms = Some(after);
                    if std::mem::take(&mut record.timed) {
                        propagation.observe_ms(after);
                    }
                    v.last_change = Some(Propagation {
                        name: name.clone(),
                        value: record.desired.value.clone(),
                        propagation_ms: after,
                    });
                } else if !good && record.visible_after_ms.is_some() {
                    record.visible_after_ms = None;
                }
            }
            pending = v.records.values().any(|r| r.visible_after_ms.is_none());
            v.problems.retain(|p| !p.starts_with("checking: "));
            for (server, why) in failures {
                v.problems
                    .push(format!("checking: server {server} does not answer: {why}"));
            }
        });
        self.pending = pending;
        for (name, value) in drifted {
            if self.published.get(&name) == Some(&value) {
                self.published.remove(&name);
                tracing::warn!(record = %name, "the DNS server lost a record it had accepted; sending it again");
            }
        }
    }
}

/// Runs `keeper` until `stopped`.
pub async fn run(mut keeper: Keeper, mut stopped: watch::Receiver<bool>) {
    let mut applied = keeper.state.watch_applied();
    let mut was_leading = false;
    loop {
        let leading = keeper.leading();
        if leading {
            if !was_leading {
                tracing::info!("leading: publishing and checking every DNS record");
            }
            keeper.round().await;
        } else if was_leading {
            keeper.step_down();
        }
        was_leading = leading;
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(if keeper.pending { PENDING_TICK } else { TICK }) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

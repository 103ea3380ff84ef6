//! The member's HTTP endpoint (`[metrics] listen`): `/metrics` in Prometheus' text format,
//! `/healthz` (the process runs) and `/readyz` (part of a quorum with a current lease).
//!
//! Gauges are read at scrape time from Raft's metrics, the applied state and the member's own
//! lease. Counters are kept by [`Counters`], which the state machine feeds with every applied
//! command: every member counts the moves it applied and times the migrations that ended
//! (from the move's commit to the new host serving), so any member can be scraped. Counters
//! start at zero with the process (a restart replays what the log still holds). Two more are
//! fed from elsewhere: the DNS keeper observes `garden_ring_dns_propagation_seconds` while this
//! member leads ([`crate::dns::keeper::Keeper::propagation`]), and the etcd driver records
//! when it stored each hosted control plane's newest snapshot ([`SnapshotTimes`]:
//! `garden_ring_snapshot_age_seconds`, one sample per control plane hosted here) and what its
//! instances report about their backups ([`BackupStatuses`]: `garden_ring_backup_revision`,
//! `_deltas_since_full`, `_delta_age_seconds`, `_delta_period_seconds`, read on the host, not
//! from the replicated state, so they are as fresh as the scrape). Every family is declared
//! (`# HELP`, `# TYPE`) even while it has no sample.
//!
//! The server is deliberately small: HTTP/1.0-style, one request per connection, a request
//! head of at most [`MAX_REQUEST_BYTES`], answered within [`REQUEST_TIMEOUT_MS`].

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::agent::OwnLease;
use crate::agent::backup_status::BackupStatuses;
use crate::agent::etcd::SnapshotTimes;
use crate::core::{Command, Proposal};
use crate::core::{MoveKind, Phase, RingState};
use crate::raft::disk::DiskHealth;
use crate::raft::state_machine::ApplyObserver;
use crate::raft::{RaftNode, StateMachineStore};
use crate::time::{monotonic_ms, unix_ms};

/// Largest request head read, bytes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Longest a client may take to send its request, ms.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Upper bounds of the migration-duration histogram, seconds.
pub const DURATION_BUCKETS_S: [f64; 10] = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Upper bounds of the DNS propagation histogram, seconds.
pub const DNS_PROPAGATION_BUCKETS_S: [f64; 11] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0];

const MOVE_KINDS: [MoveKind; 5] = [
    MoveKind::Placement,
    MoveKind::Failover,
    MoveKind::Switchover,
    MoveKind::Drain,
    MoveKind::Forced,
];

fn kind_label(kind: MoveKind) -> &'static str {
    match kind {
        MoveKind::Placement => "placement",
        MoveKind::Failover => "failover",
        MoveKind::Switchover => "switchover",
        MoveKind::Drain => "drain",
        MoveKind::Forced => "forced",
    }
}

/// A Prometheus histogram with fixed upper bounds (seconds), fed in milliseconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_ms: AtomicU64,
}

impl Histogram {
    /// An empty histogram with these upper bounds, in seconds, ascending.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ms: AtomicU64::new(0),
        }
    }

    /// Records one observation of `ms` milliseconds.
    pub fn observe_ms(&self, ms: u64) {
        let s = ms as f64 / 1000.0;
        for (bucket, bound) in self.buckets.iter().zip(self.bounds) {
            if s <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// How many observations there were.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the family `name` (HELP, TYPE, buckets, sum and count) to `out`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {}\n{name}_count {count}",
            self.sum_ms.load(Ordering::Relaxed) as f64 / 1000.0
        );
    }
}

/// Counters fed by the state machine.
#[derive(Debug)]
pub struct Counters {
    moves: [AtomicU64; 5],
    migration: Histogram,
    migration_bytes: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            moves: Default::default(),
            migration: Histogram::new(&DURATION_BUCKETS_S),
            migration_bytes: AtomicU64::new(0),
        }
    }
}

impl ApplyObserver for Counters {
    /// Records `proposal`, just applied successfully, with `state` as it is afterwards.
    fn applied(&self, state: &RingState, proposal: &Proposal) {
        match &proposal.command {
            Command::MoveControlPlane { kind, .. } => {
                if let Some(i) = MOVE_KINDS.iter().position(|k| k == kind) {
                    self.moves[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            Command::ReportServing { name, epoch, .. } => {
                let Some(m) = state
                    .control_planes
                    .get(name)
                    .and_then(|cp| cp.migration.as_ref())
                    .filter(|m| m.epoch == *epoch && m.from.is_some())
                else {
                    return;
                };
                self.migration
                    .observe_ms(m.updated_unix_ms.saturating_sub(m.started_unix_ms));
                self.migration_bytes
                    .fetch_add(m.bytes_copied, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// Why a member is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// No leader is known.
    #[error("no leader known")]
    NoLeader,
    /// This member's lease is not current for its applied state.
    #[error("no current lease (cut off from the quorum, or not renewed yet)")]
    NoLease,
    /// The Raft log's disk lacks room: this member acknowledges nothing.
    #[error("the Raft log's disk is full (see the log and `ringctl status`)")]
    DiskFull,
    /// This member lost entries it had acknowledged: it vouches for nothing until replaced.
    #[error(
        "this member diverged (it lost entries it had acknowledged): replace it, see \
         deploy/README.md, \"A member that diverged\""
    )]
    Diverged,
}

/// Whether the member is ready: a leader is known, and this member's lease is current for
/// state at least as fresh as the leader's when it granted the lease. `/readyz`, the
/// `garden_ring_ready` gauge and the gRPC health status of the Admin service all use this.
pub fn ready(raft: &RaftNode, own: &OwnLease, disk: &DiskHealth) -> Result<(), NotReady> {
    if disk.problem().is_some() {
        return Err(NotReady::DiskFull);
    }
    if own.divergence().is_set() {
        return Err(NotReady::Diverged);
    }
    let m = raft.metrics().borrow_watched().clone();
    if m.current_leader.is_none() {
        return Err(NotReady::NoLeader);
    }
    let applied = m.last_applied.map(|l| l.index).unwrap_or(0);
    if !own.vouches(monotonic_ms(), applied) {
        return Err(NotReady::NoLease);
    }
    Ok(())
}

/// What the endpoint reads.
#[derive(Clone)]
pub struct Sources {
    /// This member's Raft node.
    pub raft: RaftNode,
    /// The applied state.
    pub state: StateMachineStore,
    /// This member's lease.
    pub own: Arc<OwnLease>,
    /// The counters.
    pub counters: Arc<Counters>,
    /// Lease renewals this member answered while it led ([`crate::leases::LeaseDesk`]).
    pub renewals: Arc<AtomicU64>,
    /// The DNS keeper's propagation times (observed while this member leads).
    pub dns_propagation: Arc<Histogram>,
    /// When the etcd driver last took a snapshot of each control plane hosted here.
    pub snapshots: Arc<SnapshotTimes>,
    /// What the etcd driver's instances report about the backups of each control plane
    /// hosted here.
    pub backups: Arc<BackupStatuses>,
    /// Whether the Raft log's disk has room.
    pub disk: DiskHealth,
    /// The certificates in use (`None` without TLS).
    pub tls: Option<Arc<crate::tls::TlsStore>>,
    /// When this member last heard from its leader, and the gaps between.
    pub contact: crate::raft::contact::LeaderContact,
    /// The followers this member found diverged while it led.
    pub diverged: crate::raft::divergence::Diverged,
    /// What the members report about their binaries.
    pub upgrade: Arc<crate::upgrade::Reports>,
    /// `upgrade.mixed_alert_after_ms`.
    pub mixed_alert_after_ms: u64,
}

impl Sources {
    /// Ready: see [`ready`].
    pub fn ready(&self) -> Result<(), NotReady> {
        ready(&self.raft, &self.own, &self.disk)
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let m = self.raft.metrics().borrow_watched().clone();
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        gauge(
            "garden_ring_raft_term",
            "Current Raft term.",
            m.current_term as f64,
        );
        gauge(
            "garden_ring_raft_leader",
            "Raft id of the leader this member knows (0: none).",
            m.current_leader.unwrap_or(0) as f64,
        );
        gauge(
            "garden_ring_raft_is_leader",
            "1 when this member leads.",
            f64::from(u8::from(m.current_leader == Some(m.id))),
        );
        gauge(
            "garden_ring_raft_applied_index",
            "Index of the last applied log entry.",
            m.last_applied.map(|l| l.index).unwrap_or(0) as f64,
        );
        gauge(
            "garden_ring_raft_committed_index",
            "Index of the last log entry this member knows committed.",
            m.local_committed.map(|l| l.index).unwrap_or(0) as f64,
        );
        gauge(
            "garden_ring_raft_last_log_index",
            "Index of the last log entry.",
            m.last_log_index.unwrap_or(0) as f64,
        );
        gauge(
            "garden_ring_lease_remaining_seconds",
            "Time left on this member's lease.",
            self.own.remaining_ms(monotonic_ms()) as f64 / 1000.0,
        );
        gauge(
            "garden_ring_ready",
            "1 when /readyz answers 200.",
            f64::from(u8::from(self.ready().is_ok())),
        );
        gauge(
            "garden_ring_raft_disk_full",
            "1 while the Raft log's disk has less free space than the member keeps (it acknowledges nothing meanwhile).",
            f64::from(u8::from(self.disk.problem().is_some())),
        );
        let now_ms = unix_ms();
        self.state.read(|a| {
            let state = &a.state;
            let _ = writeln!(
                out,
                "# HELP garden_ring_member_health 1 for the member's health as the ring last judged it.\n# TYPE garden_ring_member_health gauge"
            );
            for member in state.members.values() {
                for health in ["unknown", "healthy", "suspect", "lost"] {
                    let _ = writeln!(
                        out,
                        "garden_ring_member_health{{member=\"{}\",zone=\"{}\",health=\"{health}\"}} {}",
                        member.name,
                        member.zone,
                        u8::from(member.health.to_string() == health)
                    );
                }
            }
            let diverged = self.diverged.all();
            let own = self.own.divergence().get().is_some();
            let _ = writeln!(
                out,
                "# HELP garden_ring_member_diverged 1 for a member found with less in its log than it had acknowledged: the ring's record, this member's finding while it led, or (for itself) what its leader told it (replace it: deploy/README.md).\n# TYPE garden_ring_member_diverged gauge"
            );
            for member in state.members.values() {
                let is = member.diverged.is_some()
                    || diverged.contains_key(&member.id)
                    || (own && member.id == m.id);
                let _ = writeln!(
                    out,
                    "garden_ring_member_diverged{{member=\"{}\",zone=\"{}\"}} {}",
                    member.name,
                    member.zone,
                    u8::from(is)
                );
            }
            host_gauge(
                &mut out,
                state,
                "control_plane_running",
                "1 when the control plane runs at its host.",
                |cp| cp.phase == Phase::Running,
            );
            host_gauge(
                &mut out,
                state,
                "control_plane_problem",
                "1 while the control plane's host reports something wrong with it (its etcd keeps exiting or cannot start, its data disk is full); `ringctl cp get` says what.",
                |cp| cp.problem.is_some(),
            );
            let _ = writeln!(
                out,
                "# HELP garden_ring_control_plane_etcd_health 1 for how the etcd cluster of a zone-tolerant control plane stands: whole, degraded (a majority up) or no-quorum (an operator recovers it).\n# TYPE garden_ring_control_plane_etcd_health gauge"
            );
            for cp in state.control_planes.values() {
                let Some(health) = state.etcd_health(cp) else {
                    continue;
                };
                for word in ["whole", "degraded", "no-quorum"] {
                    let _ = writeln!(
                        out,
                        "garden_ring_control_plane_etcd_health{{control_plane=\"{}\",health=\"{word}\"}} {}",
                        cp.name,
                        u8::from(health.word() == word)
                    );
                }
            }
            let _ = writeln!(
                out,
                "# HELP garden_ring_control_plane_epoch The control plane's fencing epoch.\n# TYPE garden_ring_control_plane_epoch gauge"
            );
            for cp in state.control_planes.values() {
                let _ = writeln!(
                    out,
                    "garden_ring_control_plane_epoch{{control_plane=\"{}\"}} {}",
                    cp.name, cp.epoch
                );
            }
            let _ = writeln!(
                out,
                "# HELP garden_ring_migration_data_loss_window_seconds Data-loss window of the control plane's last migration (age of the snapshot restored).\n# TYPE garden_ring_migration_data_loss_window_seconds gauge"
            );
            for cp in state.control_planes.values() {
                if let Some(w) = cp.migration.as_ref().and_then(|m| m.data_loss_window_ms) {
                    let _ = writeln!(
                        out,
                        "garden_ring_migration_data_loss_window_seconds{{control_plane=\"{}\"}} {}",
                        cp.name,
                        w as f64 / 1000.0
                    );
                }
            }
            let _ = writeln!(
                out,
                "# HELP garden_ring_migration_age_seconds Time since the control plane's last migration began.\n# TYPE garden_ring_migration_age_seconds gauge"
            );
            for cp in state.control_planes.values() {
                if let Some(m) = &cp.migration {
                    let _ = writeln!(
                        out,
                        "garden_ring_migration_age_seconds{{control_plane=\"{}\",step=\"{}\"}} {}",
                        cp.name,
                        m.step,
                        now_ms.saturating_sub(m.started_unix_ms) as f64 / 1000.0
                    );
                }
            }
        });
        let c = &self.counters;
        let _ = writeln!(
            out,
            "# HELP garden_ring_moves_total Control-plane moves applied by this member since it started, by kind.\n# TYPE garden_ring_moves_total counter"
        );
        for (kind, count) in MOVE_KINDS.iter().zip(&c.moves) {
            let _ = writeln!(
                out,
                "garden_ring_moves_total{{kind=\"{}\"}} {}",
                kind_label(*kind),
                count.load(Ordering::Relaxed)
            );
        }
        c.migration.render(
            &mut out,
            "garden_ring_migration_duration_seconds",
            "From a move's commit to the new host serving (moves of a control plane that had a host).",
        );
        let _ = writeln!(
            out,
            "# HELP garden_ring_lease_renewals_answered_total Lease renewals this member answered with a grant while it led (the leader's load from the agents: at rest each member renews every lease_ms / 4).\n# TYPE garden_ring_lease_renewals_answered_total counter\ngarden_ring_lease_renewals_answered_total {}",
            self.renewals.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP garden_ring_migration_bytes_total Bytes copied by the migrations that ended.\n# TYPE garden_ring_migration_bytes_total counter\ngarden_ring_migration_bytes_total {}",
            c.migration_bytes.load(Ordering::Relaxed)
        );
        self.dns_propagation.render(
            &mut out,
            "garden_ring_dns_propagation_seconds",
            "From the leader seeing a DNS record's new value committed to every checked server answering it (observed on the leader).",
        );
        let _ = writeln!(
            out,
            "# HELP garden_ring_snapshot_age_seconds Time since the newest successful etcd snapshot of a control plane hosted here.\n# TYPE garden_ring_snapshot_age_seconds gauge"
        );
        for (name, age_ms) in self.snapshots.ages_ms(now_ms) {
            let _ = writeln!(
                out,
                "garden_ring_snapshot_age_seconds{{control_plane=\"{name}\"}} {}",
                age_ms as f64 / 1000.0
            );
        }
        render_backups(&mut out, &self.backups.all(), now_ms);
        if let Some(tls) = &self.tls {
            render_certificates(&mut out, &tls.status(), now_ms);
        }
        render_gaps(&mut out, &self.contact.gaps());
        let active = self.state.read(|a| a.state.settings.ring_version.active);
        render_upgrade(
            &mut out,
            active,
            &self.upgrade.view(),
            self.mixed_alert_after_ms,
        );
        let gc = self.backups.gc_totals();
        let _ = writeln!(
            out,
            "# HELP garden_ring_backup_gc_deleted_total Snapshots this member's garbage collections deleted, by kind.\n# TYPE garden_ring_backup_gc_deleted_total counter\ngarden_ring_backup_gc_deleted_total{{kind=\"full\"}} {}\ngarden_ring_backup_gc_deleted_total{{kind=\"delta\"}} {}",
            gc.deleted_full, gc.deleted_delta
        );
        let _ = writeln!(
            out,
            "# HELP garden_ring_backup_gc_failures_total Deletions of this member's garbage collections that failed (the next period tries again).\n# TYPE garden_ring_backup_gc_failures_total counter\ngarden_ring_backup_gc_failures_total {}",
            gc.failures
        );
        out
    }
}

/// The `garden_ring_backup_*` families (declared also without samples), one sample per control
/// plane in `reports`, ages at `now_ms` (Unix).
/// A gauge `garden_ring_<name>{control_plane,host}` of every control plane: 1 where `on`.
/// This build, the ring's version, and whether a rolling upgrade was left half done.
fn render_upgrade(out: &mut String, active: u32, view: &crate::upgrade::View, alert_after_ms: u64) {
    let this = crate::version::this_member();
    let mixed_ms = u64::try_from(view.mixed_for.as_millis()).unwrap_or(u64::MAX);
    let _ = writeln!(
        out,
        "# HELP garden_ring_build_info This member's binary: release, commit and the ring versions it runs at.\n# TYPE garden_ring_build_info gauge\n\
         garden_ring_build_info{{release=\"{}\",commit=\"{}\",ring_min=\"{}\",ring_max=\"{}\"}} 1\n\
         # HELP garden_ring_ring_version The ring's active version (what members may exchange).\n# TYPE garden_ring_ring_version gauge\n\
         garden_ring_ring_version {active}\n\
         # HELP garden_ring_ring_mixed 1 while the members run binaries of different releases (as the leader heard).\n# TYPE garden_ring_ring_mixed gauge\n\
         garden_ring_ring_mixed {}\n\
         # HELP garden_ring_ring_mixed_seconds How long the members have run binaries of different releases (0: not mixed).\n# TYPE garden_ring_ring_mixed_seconds gauge\n\
         garden_ring_ring_mixed_seconds {}\n\
         # HELP garden_ring_ring_mixed_too_long 1 when the ring has been mixed for longer than upgrade.mixed_alert_after_ms: a rolling upgrade left half done.\n# TYPE garden_ring_ring_mixed_too_long gauge\n\
         garden_ring_ring_mixed_too_long {}",
        this.binary,
        this.commit,
        this.ring.min,
        this.ring.max,
        u8::from(view.mixed),
        mixed_ms as f64 / 1000.0,
        u8::from(view.mixed && mixed_ms > alert_after_ms),
    );
}

fn host_gauge(
    out: &mut String,
    state: &RingState,
    name: &str,
    help: &str,
    on: impl Fn(&crate::core::ControlPlane) -> bool,
) {
    let _ = writeln!(
        out,
        "# HELP garden_ring_{name} {help}\n# TYPE garden_ring_{name} gauge"
    );
    for cp in state.control_planes.values() {
        let _ = writeln!(
            out,
            "garden_ring_{name}{{control_plane=\"{}\",host=\"{}\"}} {}",
            cp.name,
            cp.host.as_deref().unwrap_or(""),
            u8::from(on(cp))
        );
    }
}

/// The gaps between the arrivals of a leader's messages at this member, as a histogram, and
/// the longest.
fn render_gaps(out: &mut String, gaps: &crate::raft::contact::Gaps) {
    use crate::raft::contact::GAP_BOUNDS_MS;
    let name = "garden_ring_leader_contact_gap_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time between the arrivals of two messages of the same leader (term) at this member (heartbeats are due every heartbeat_ms; counted on arrival, so this member's own fsync before it answers is not part of it); an election is not a gap.\n# TYPE {name} histogram"
    );
    let mut cumulative = 0;
    for (bound, count) in GAP_BOUNDS_MS.iter().zip(gaps.counts) {
        cumulative += count;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{}\"}} {cumulative}",
            *bound as f64 / 1000.0
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
        gaps.count(),
        gaps.sum_ms as f64 / 1000.0,
        gaps.count()
    );
    let _ = writeln!(
        out,
        "# HELP garden_ring_leader_contact_gap_max_seconds The longest such gap since this member started.\n# TYPE garden_ring_leader_contact_gap_max_seconds gauge\ngarden_ring_leader_contact_gap_max_seconds {}",
        gaps.max_ms as f64 / 1000.0
    );
}

/// Seconds left of the member's own certificate and of each CA certificate it trusts
/// (negative once expired), for the alert that fires weeks before an expiry.
fn render_certificates(out: &mut String, tls: &crate::tls::store::TlsStatus, now_ms: u64) {
    let now_s = i64::try_from(now_ms / 1000).unwrap_or(i64::MAX);
    let _ = writeln!(
        out,
        "# HELP garden_ring_certificate_expiry_seconds Seconds until the certificate stops being valid: this member's own (certificate=\"own\", name: its identity) and each CA certificate it trusts (certificate=\"ca\", name: its subject). Negative once expired.\n# TYPE garden_ring_certificate_expiry_seconds gauge"
    );
    let mut line = |kind: &str, name: &str, not_after_s: i64| {
        let _ = writeln!(
            out,
            "garden_ring_certificate_expiry_seconds{{certificate=\"{kind}\",name=\"{}\"}} {}",
            name.replace('\\', "\\\\").replace('"', "\\\""),
            not_after_s.saturating_sub(now_s)
        );
    };
    line("own", &tls.identity, tls.not_after_unix_s);
    for ca in &tls.cas {
        line("ca", &ca.name, ca.not_after_unix_s);
    }
}

fn render_backups(
    out: &mut String,
    reports: &std::collections::BTreeMap<String, crate::core::backup_report::BackupReport>,
    now_ms: u64,
) {
    type Value = fn(&crate::core::backup_report::BackupReport, u64) -> Option<f64>;
    let families: [(&str, &str, Value); 6] = [
        (
            "garden_ring_backup_revision",
            "The etcd revision the stored backups of a control plane hosted here reach (last revision of its newest snapshot).",
            |r, _| Some(r.revision as f64),
        ),
        (
            "garden_ring_backup_deltas_since_full",
            "Delta snapshots of a control plane hosted here written since its newest full snapshot.",
            |r, _| Some(r.deltas_since_full as f64),
        ),
        (
            "garden_ring_backup_delta_age_seconds",
            "Time since the backups of a control plane hosted here were last known complete (a delta snapshot written, or a delta period without events).",
            |r, now| Some(now.saturating_sub(r.up_to_date_unix_ms) as f64 / 1000.0),
        ),
        (
            "garden_ring_backup_delta_period_seconds",
            "The host's delta snapshot period for a control plane hosted here (0: delta snapshots off).",
            |r, _| Some(r.delta_period_ms as f64 / 1000.0),
        ),
        (
            "garden_ring_backup_full_snapshots_kept",
            "Full snapshots of a control plane hosted here that its last garbage collection kept (the newest included).",
            |r, _| {
                r.gc.as_ref()
                    .filter(|gc| gc.last_unix_ms > 0)
                    .map(|gc| gc.kept_full as f64)
            },
        ),
        (
            "garden_ring_etcd_defrag_duration_seconds",
            "How long the last defragmentation of a control plane's etcd hosted here took (etcd answered nothing meanwhile).",
            |r, _| r.defrag.map(|d| d.took_ms as f64 / 1000.0),
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (control_plane, report) in reports {
            if let Some(value) = value(report, now_ms) {
                let _ = writeln!(out, "{name}{{control_plane=\"{control_plane}\"}} {value}");
            }
        }
    }
}

/// Serves the endpoint on `listener` until `stopped` turns true.
pub fn serve(
    listener: TcpListener,
    sources: Sources,
    mut stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stopped.wait_for(|s| *s) => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let sources = sources.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_millis(REQUEST_TIMEOUT_MS),
                    answer(stream, &sources),
                )
                .await;
            });
        }
    })
}

async fn answer(mut stream: tokio::net::TcpStream, sources: &Sources) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST_BYTES {
            return respond(&mut stream, 431, "request head too large\n").await;
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut stream, 405, "only GET\n").await;
    }
    match path.split('?').next().unwrap_or("") {
        "/metrics" => respond(&mut stream, 200, &sources.render()).await,
        "/healthz" => respond(&mut stream, 200, "ok\n").await,
        "/readyz" => match sources.ready() {
            Ok(()) => respond(&mut stream, 200, "ready\n").await,
            Err(why) => respond(&mut stream, 503, &format!("not ready: {why}\n")).await,
        },
        _ => {
            respond(
                &mut stream,
                404,
                "not found: try /metrics, /healthz or /readyz\n",
            )
            .await
        }
    }
}

async fn respond(
    stream: &mut tokio::net::TcpStream,
    status: u16,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let content_type = if body.starts_with("# HELP") {
        "text/plain; version=0.0.4"
    } else {
        "text/plain"
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::backup_report::BackupReport;

    #[test]
    fn backup_families_are_declared_without_samples_and_read_the_reports() {
        let mut empty = String::new();
        render_backups(&mut empty, &Default::default(), 0);
        for family in [
            "garden_ring_backup_revision",
            "garden_ring_backup_deltas_since_full",
            "garden_ring_backup_delta_age_seconds",
            "garden_ring_backup_delta_period_seconds",
            "garden_ring_backup_full_snapshots_kept",
            "garden_ring_etcd_defrag_duration_seconds",
        ] {
            assert!(
                empty.contains(&format!("# TYPE {family} gauge\n")),
                "{empty}"
            );
        }
        assert!(!empty.contains("control_plane="), "{empty}");

        let reports = [(
            "x".to_string(),
            BackupReport {
                full: Some("x/v2/Full-00000000-00000100-1700000000.gz".into()),
                deltas_since_full: 3,
                revision: 142,
                newest_delta_unix_ms: Some(1_700_000_060_000),
                up_to_date_unix_ms: 1_700_000_061_000,
                delta_period_ms: 20_000,
                gc: Some(crate::core::backup_report::GcReport {
                    last_unix_ms: 1_700_000_062_000,
                    kept_full: 7,
                    ..Default::default()
                }),
                defrag: Some(crate::core::backup_report::DefragReport {
                    took_ms: 1_250,
                    ..Default::default()
                }),
            },
        )]
        .into();
        let mut out = String::new();
        render_backups(&mut out, &reports, 1_700_000_063_500);
        for sample in [
            "garden_ring_backup_revision{control_plane=\"x\"} 142",
            "garden_ring_backup_deltas_since_full{control_plane=\"x\"} 3",
            "garden_ring_backup_delta_age_seconds{control_plane=\"x\"} 2.5",
            "garden_ring_backup_delta_period_seconds{control_plane=\"x\"} 20",
            "garden_ring_backup_full_snapshots_kept{control_plane=\"x\"} 7",
            "garden_ring_etcd_defrag_duration_seconds{control_plane=\"x\"} 1.25",
        ] {
            assert!(out.contains(&format!("{sample}\n")), "{out}");
        }
    }
}

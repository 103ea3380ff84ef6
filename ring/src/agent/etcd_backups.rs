//! The backups one serving etcd writes, as etcd-backup-restore's snapshotter does: a full
//! snapshot at start and every `full_snapshot_interval_ms`, and between them delta snapshots
//! (`Incr-`) of the events a watch delivers, cut every `delta_snapshot_period_ms` and as soon
//! as they take `delta_snapshot_memory_limit_bytes`.
//!
//! - The watch starts at the revision after the newest full snapshot's (the one in its name),
//!   so nothing falls between the two; events at or below a new full snapshot's revision are
//!   dropped from what waits for the next delta (the full snapshot holds them).
//! - An etcd just restored from a clean chain (a full snapshot and every delta after it, in
//!   this member's own location) **continues that chain** ([`Backups::resume`]): the watch
//!   starts at the revision after the restored one, before the gate opens, so the first writes
//!   the new host acknowledges are in a delta one period later, not after a full snapshot of
//!   the whole database (minutes for a big one, and until then in no backup at all).
//! - A full snapshot of the serving etcd runs beside the delta cuts ([`Backups::full_job`]), so
//!   the backups stay one delta period behind while a big database uploads (minutes at
//!   several GiB). The first delta after it may overlap its revision (it holds events from
//!   before and after): a restore skips what the full snapshot holds already, as
//!   etcd-backup-restore's restorer does for the first delta after a full snapshot.
//! - A watch that ends (etcd restarted, the connection broke) or falls behind a compaction
//!   leaves the events since the last delta unknown: the caller takes a full snapshot at once
//!   ([`Backups::on_message`] says so) and the watch starts again after it.
//! - Every upload, full or delta, is checked twice for ownership (the lease, then the
//!   location's marker: DESIGN.md rule 4), before it starts and before it is completed.
//! - Stopping ([`Backups::final_cut`], after the gate closed, so no client writes any more):
//!   read etcd's revision, wait until the watch delivered everything up to it, and write what
//!   is left as a final delta (`.final`); with nothing left, the deltas are complete already
//!   and nothing is written; without a working watch, a final full snapshot.
//!
//! Limits: events waiting for a delta are bounded by the memory limit (a delta is cut as soon
//! as they reach it; when deltas cannot be stored and they reach twice the limit, they are
//! dropped with the watch and a full snapshot follows); the final wait by the caller's
//! `wait_ms`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::etcd_runtime::EtcdRuntime;
use super::lease::lease_ran_out;
use super::workload::Target;
use crate::backup::delta::DeltaEvent;
use crate::backup::etcd::{EtcdClient, EtcdError, WatchMessage, WatchStream};
use crate::backup::location::BackupLocation;
use crate::backup::marker::{self, Marker, Ownership};
use crate::backup::snapshot::{
    StagedSnapshot, TakenSnapshot, stage_delta_snapshot, stage_full_snapshot,
};
use crate::core::backup_report::{BackupReport, DefragReport, GcReport};
use crate::time::unix_ms;

/// What an attempt to store a snapshot came to.
#[derive(Debug)]
pub(super) enum Stored {
    /// Stored.
    Taken(TakenSnapshot),
    /// Nothing to store: the backups are complete up to now.
    Nothing,
    /// This member no longer owns the location (or its lease ran out): it must stop serving.
    Lost(String),
}

/// A chain of snapshots in the own location that a restored etcd holds exactly: a full
/// snapshot and every delta after it, to `revision` ([`Backups::resume`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resume {
    /// The full snapshot's key in the own location.
    pub full: String,
    /// The revision in its name.
    pub full_revision: u64,
    /// Deltas after it.
    pub deltas: u64,
    /// The revision the chain reaches (the restored etcd's).
    pub revision: u64,
}

/// Why a restored etcd does not continue the stored chain ([`Backups::resume`]): the host then
/// starts a chain of its own with a full snapshot.
#[derive(Debug, thiserror::Error)]
pub(super) enum ResumeError {
    /// Delta snapshots are off.
    #[error("delta snapshots are off")]
    DeltasOff,
    /// etcd holds less than the chain: its deltas would not follow it.
    #[error("etcd is at revision {at}, the stored chain at {chain}")]
    EtcdBehind {
        /// etcd's revision.
        at: u64,
        /// The chain's.
        chain: u64,
    },
    /// etcd's revision could not be read, or the watch not started.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// The backup state of one serving instance. See the [module docs](self).
pub(super) struct Backups {
    up: Uploader,
    watch: Option<WatchStream>,
    /// Events not in any stored snapshot yet, in revision order.
    pending: Vec<DeltaEvent>,
    pending_bytes: u64,
    /// The revision the stored snapshots reach (0 before the first one).
    covered: u64,
    /// The watch has delivered every event up to this revision.
    delivered: u64,
    /// The newest full snapshot stored at this epoch.
    pub full: Option<String>,
    /// Deltas stored since it.
    pub deltas_since_full: u64,
    /// Events and bytes (as encoded) in them.
    events_since_full: u64,
    bytes_since_full: u64,
    /// Deltas, events and bytes since the full snapshot when the running full snapshot job
    /// started ([`Backups::full_job`]): the deltas cut meanwhile follow it.
    at_full_job: (u64, u64, u64),
    /// What garbage collection last did.
    pub gc: Option<GcReport>,
    /// The last defragmentation.
    pub defrag: Option<DefragReport>,
    /// When the newest of them was stored, Unix ms.
    pub newest_delta_unix_ms: Option<u64>,
    /// When the stored snapshots last held everything etcd had, Unix ms.
    pub up_to_date_unix_ms: u64,
}

impl Backups {
    pub(super) fn new(
        runtime: Arc<EtcdRuntime>,
        target: Target,
        client: EtcdClient,
        own: BackupLocation,
    ) -> Self {
        Self {
            up: Uploader {
                runtime,
                target,
                client,
                own,
            },
            watch: None,
            pending: Vec::new(),
            pending_bytes: 0,
            covered: 0,
            delivered: 0,
            full: None,
            deltas_since_full: 0,
            events_since_full: 0,
            bytes_since_full: 0,
            at_full_job: (0, 0, 0),
            gc: None,
            defrag: None,
            newest_delta_unix_ms: None,
            up_to_date_unix_ms: 0,
        }
    }

    /// Continues the chain of stored snapshots `resume` describes (see the
    /// [module docs](self)): the watch starts at the revision after it, and the next delta
    /// follows on. Call it before any client can write. On an error nothing changed, and the
    /// caller takes a full snapshot at once, as without a chain.
    pub(super) async fn resume(&mut self, resume: &Resume) -> Result<(), ResumeError> {
        debug_assert!(self.full.is_none() && self.watch.is_none() && self.covered == 0);
        debug_assert!(resume.full_revision <= resume.revision);
        if !self.deltas_enabled() {
            return Err(ResumeError::DeltasOff);
        }
        let at = self.up.client.revision().await?;
        if at < resume.revision {
            return Err(ResumeError::EtcdBehind {
                at,
                chain: resume.revision,
            });
        }
        self.watch = Some(self.up.client.watch_all(resume.revision + 1).await?);
        self.covered = resume.revision;
        self.delivered = resume.revision;
        self.full = Some(resume.full.clone());
        self.deltas_since_full = resume.deltas;
        // Revisions, not events (a revision may hold several): the restore does not count
        // events, and compaction only needs the order of magnitude. Bytes are not known.
        self.events_since_full = resume.revision - resume.full_revision;
        self.up_to_date_unix_ms = unix_ms();
        Ok(())
    }

    /// The location this instance writes to.
    pub(super) fn location(&self) -> &BackupLocation {
        &self.up.own
    }

    /// Counts what a garbage collection did (for `/metrics`).
    pub(super) fn count_gc(&self, deleted_full: u64, deleted_delta: u64, failures: u64) {
        self.up
            .runtime
            .backups
            .count_gc(deleted_full, deleted_delta, failures);
    }

    /// Why the deltas since the last full snapshot call for a new one (etcd-druid's
    /// compaction: a restore replays them all), if they do: more events than
    /// `compaction_events`, or more bytes than `compaction_bytes` (0: no limit).
    pub(super) fn compaction_due(&self) -> Option<String> {
        let settings = &self.up.runtime.settings;
        if settings.compaction_events > 0 && self.events_since_full >= settings.compaction_events {
            return Some(format!(
                "{} events in {} deltas since the full snapshot (compaction_events {})",
                self.events_since_full, self.deltas_since_full, settings.compaction_events
            ));
        }
        if settings.compaction_bytes > 0 && self.bytes_since_full >= settings.compaction_bytes {
            return Some(format!(
                "{} bytes in {} deltas since the full snapshot (compaction_bytes {})",
                self.bytes_since_full, self.deltas_since_full, settings.compaction_bytes
            ));
        }
        None
    }

    fn deltas_enabled(&self) -> bool {
        self.up.runtime.settings.delta_snapshot_period_ms > 0
    }

    /// Whether deltas are being collected (a watch runs).
    pub(super) fn watching(&self) -> bool {
        self.watch.is_some()
    }

    /// The revision the stored snapshots reach.
    pub(super) fn covered_revision(&self) -> u64 {
        self.covered
    }

    /// What the stored backups reach, for the ring (`ringctl cp get`) and `/metrics`.
    pub(super) fn report(&self, delta_period_ms: u64) -> BackupReport {
        BackupReport {
            full: self.full.clone(),
            deltas_since_full: self.deltas_since_full,
            revision: self.covered,
            newest_delta_unix_ms: self.newest_delta_unix_ms,
            up_to_date_unix_ms: self.up_to_date_unix_ms,
            delta_period_ms,
            gc: self.gc.clone(),
            defrag: self.defrag,
        }
    }

    /// Takes a full snapshot (final when `final_`) and, after it, (re)starts the watch; no
    /// delta is cut meanwhile. The final snapshot uses it; the serving loop runs
    /// [`Backups::full_job`] beside the delta cuts.
    pub(super) async fn full(
        &mut self,
        deadline: &watch::Receiver<u64>,
        final_: bool,
    ) -> Result<Stored, StoreError> {
        self.at_full_job = self.since_full();
        let started_unix_ms = unix_ms();
        let stored = self
            .up
            .store_checked(deadline, Stage::Full { final_ })
            .await?;
        self.full_done(&stored, started_unix_ms, final_).await;
        Ok(stored)
    }

    /// A full snapshot to run beside the delta cuts (a big etcd's takes minutes, and the
    /// deltas keep the backups up to date meanwhile); hand its result, and the time it
    /// started, to [`Backups::full_done`]. Deltas cut while it runs may overlap its revision:
    /// the first delta after a full snapshot may start at or below it (replay skips what the
    /// store holds already, as etcd-backup-restore's does for the first delta after a full).
    pub(super) fn full_job(
        &mut self,
        deadline: &watch::Receiver<u64>,
    ) -> impl std::future::Future<Output = Result<Stored, StoreError>> + Send + 'static {
        self.at_full_job = self.since_full();
        let up = self.up.clone();
        let deadline = deadline.clone();
        async move {
            up.store_checked(&deadline, Stage::Full { final_: false })
                .await
        }
    }

    fn since_full(&self) -> (u64, u64, u64) {
        (
            self.deltas_since_full,
            self.events_since_full,
            self.bytes_since_full,
        )
    }

    /// Takes in a stored full snapshot (a job started at `started_unix_ms`): it is the base
    /// of the chain from now on, and the watch starts after it if none runs.
    pub(super) async fn full_done(&mut self, stored: &Stored, started_unix_ms: u64, final_: bool) {
        let Stored::Taken(taken) = stored else {
            return;
        };
        // Deltas cut while it ran follow it (they reach past its revision, or the next one
        // starts after them).
        let (deltas, events, bytes) = self.at_full_job;
        self.deltas_since_full = self.deltas_since_full.saturating_sub(deltas);
        self.events_since_full = self.events_since_full.saturating_sub(events);
        self.bytes_since_full = self.bytes_since_full.saturating_sub(bytes);
        if self.deltas_since_full == 0 {
            self.newest_delta_unix_ms = None;
        }
        self.covered = self.covered.max(taken.revision);
        self.delivered = self.delivered.max(taken.revision);
        self.pending
            .retain(|e| e.revision() as u64 > taken.revision);
        self.pending_bytes = self
            .pending
            .iter()
            .map(DeltaEvent::encoded_size_bytes)
            .sum();
        self.full = Some(taken.location.to_string());
        self.up_to_date_unix_ms = self.up_to_date_unix_ms.max(started_unix_ms);
        if self.deltas_enabled() && self.watch.is_none() && !final_ {
            match self.up.client.watch_all(taken.revision + 1).await {
                Ok(w) => {
                    self.watch = Some(w);
                    // What was stored after the full snapshot comes again from etcd's
                    // history and is skipped (at or below `covered`).
                    self.delivered = self.covered;
                }
                Err(e) => tracing::warn!(
                    "cannot watch etcd from revision {}: {e}; the next full snapshot tries again",
                    taken.revision + 1
                ),
            }
        }
    }

    /// The watch's next message; never resolves while no watch runs.
    pub(super) async fn next_message(&mut self) -> Result<WatchMessage, EtcdError> {
        match self.watch.as_mut() {
            Some(w) => w.next().await,
            None => std::future::pending().await,
        }
    }

    /// Takes in a watch message. `Some(why)` when the watch is gone: the events since the last
    /// snapshot may be incomplete, so the caller must take a full snapshot.
    pub(super) fn on_message(
        &mut self,
        message: Result<WatchMessage, EtcdError>,
    ) -> Option<String> {
        let why = match message {
            Ok(WatchMessage::Events { events, revision }) => {
                let received_ns = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos() as i128)
                    .unwrap_or(0);
                if events.is_empty() {
                    // A progress notification: everything up to `revision` was delivered.
                    self.delivered = self.delivered.max(revision);
                    return None;
                }
                for event in events {
                    let revision = event.kv.mod_revision;
                    if revision as u64 <= self.covered {
                        continue;
                    }
                    debug_assert!(
                        self.pending.last().is_none_or(|p| p.revision() <= revision),
                        "watch events come in revision order"
                    );
                    let e = DeltaEvent {
                        event,
                        time_unix_ns: received_ns,
                    };
                    self.pending_bytes += e.encoded_size_bytes();
                    self.delivered = self.delivered.max(revision as u64);
                    self.pending.push(e);
                }
                if self.pending_bytes
                    > 2 * self.up.runtime.settings.delta_snapshot_memory_limit_bytes
                {
                    // Deltas cannot be stored (the store fails) and events keep coming: memory
                    // is bounded by dropping them; the full snapshot that must follow holds
                    // them, and the watch after it starts over.
                    format!(
                        "{} bytes of events wait for a delta snapshot, twice the memory limit (is the object store failing?): dropped",
                        self.pending_bytes
                    )
                } else {
                    return None;
                }
            }
            Ok(WatchMessage::Compacted { compact_revision }) => format!(
                "the watch fell behind a compaction (history from revision {compact_revision} on only)"
            ),
            Ok(WatchMessage::Canceled { reason }) => format!("etcd canceled the watch: {reason}"),
            Err(e) => format!("the watch broke: {e}"),
        };
        // The events since the last snapshot may be incomplete: the full snapshot that must
        // follow holds them, and the watch after it delivers everything after that again.
        self.watch = None;
        self.pending.clear();
        self.pending_bytes = 0;
        self.delivered = self.covered;
        Some(why)
    }

    /// Whether the waiting events reached the memory limit (cut a delta now).
    pub(super) fn over_memory_limit(&self) -> bool {
        self.pending_bytes >= self.up.runtime.settings.delta_snapshot_memory_limit_bytes
    }

    /// Writes the waiting events as a delta snapshot (final when `final_`).
    pub(super) async fn cut(
        &mut self,
        deadline: &watch::Receiver<u64>,
        final_: bool,
    ) -> Result<Stored, StoreError> {
        if self.pending.is_empty() {
            if self.watch.is_some() {
                self.up_to_date_unix_ms = unix_ms();
            }
            return Ok(Stored::Nothing);
        }
        let stage = Stage::Delta {
            final_,
            start_revision: self.covered + 1,
            events: &self.pending,
        };
        let stored = self.up.store_checked(deadline, stage).await?;
        if let Stored::Taken(taken) = &stored {
            debug_assert_eq!(
                self.pending.last().map(|e| e.revision() as u64),
                Some(taken.revision)
            );
            self.covered = taken.revision;
            self.events_since_full += self.pending.len() as u64;
            self.bytes_since_full += self.pending_bytes;
            self.pending.clear();
            self.pending_bytes = 0;
            self.deltas_since_full += 1;
            let now = unix_ms();
            self.newest_delta_unix_ms = Some(now);
            self.up_to_date_unix_ms = now;
        }
        Ok(stored)
    }

    /// The last backup before etcd stops (the gate is closed): see the [module docs](self).
    pub(super) async fn final_cut(
        &mut self,
        deadline: &watch::Receiver<u64>,
        wait_ms: u64,
    ) -> Result<Stored, StoreError> {
        if !self.deltas_enabled() || self.watch.is_none() {
            return self.full(deadline, true).await;
        }
        let target = match self.up.client.revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    "cannot read etcd's revision for the final delta ({e}); a final full snapshot instead"
                );
                return self.full(deadline, true).await;
            }
        };
        if self.delivered < target
            && let Some(w) = &self.watch
            && let Err(e) = w.request_progress().await
        {
            tracing::debug!("progress request: {e}");
        }
        let until = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        while self.delivered < target {
            let next = tokio::time::timeout_at(until, self.next_message()).await;
            let lost = match next {
                Ok(message) => self.on_message(message),
                Err(_) => Some(format!(
                    "the watch delivered up to revision {} of {target} within {wait_ms} ms",
                    self.delivered
                )),
            };
            if let Some(why) = lost {
                tracing::warn!("{why}; a final full snapshot instead of a final delta");
                self.watch = None;
                return self.full(deadline, true).await;
            }
        }
        self.cut(deadline, true).await
    }

    /// Why this member may no longer write into its location, if so: see
    /// [`Uploader::lost_ownership`].
    pub(super) async fn lost_ownership(
        &self,
        deadline: &watch::Receiver<u64>,
    ) -> Result<Option<String>, StoreError> {
        self.up.lost_ownership(deadline).await
    }
}

/// What uploads into this member's location, owned, so that a full snapshot can run beside
/// the delta cuts ([`Backups::full_job`]).
#[derive(Clone)]
struct Uploader {
    runtime: Arc<EtcdRuntime>,
    target: Target,
    client: EtcdClient,
    own: BackupLocation,
}

impl Uploader {
    /// Stores a snapshot in `own` if this member still owns it; [`Stored::Lost`] when it lost
    /// ownership (DESIGN.md rule 4).
    ///
    /// Ownership (the lease, then the marker) is checked twice: before etcd is asked for
    /// anything, and after the upload, just before it is completed (a member frozen mid-upload
    /// wakes up past its deadline, its location maybe taken over already). What is left is the
    /// completion itself: a member frozen inside it completes the upload when it wakes up. A
    /// snapshot completed after its check is not deleted: it cannot be told apart from one
    /// completed just before a new host took over, which that host may be copying.
    async fn store_checked(
        &self,
        deadline: &watch::Receiver<u64>,
        stage: Stage<'_>,
    ) -> Result<Stored, StoreError> {
        let store = self.own.store();
        if let Some(lost) = self.lost_ownership(deadline).await? {
            return Ok(Stored::Lost(lost));
        }
        let at_ms = unix_ms();
        let compress = self.runtime.settings.compress;
        let staged: StagedSnapshot = match stage {
            Stage::Full { final_ } => {
                stage_full_snapshot(
                    &self.client,
                    &store,
                    self.own.prefix(),
                    at_ms / 1000,
                    final_,
                    compress,
                )
                .await?
            }
            Stage::Delta {
                final_,
                start_revision,
                events,
            } => {
                stage_delta_snapshot(
                    &store,
                    self.own.prefix(),
                    start_revision,
                    events,
                    at_ms / 1000,
                    final_,
                    compress,
                )
                .await?
            }
        };
        if let Some(lost) = self.lost_ownership(deadline).await? {
            if let Err(e) = staged.abort().await {
                tracing::warn!("{e}");
            }
            return Ok(Stored::Lost(lost));
        }
        let taken = staged.complete().await?;
        self.runtime
            .snapshots
            .taken(&self.target.name, self.target.epoch, at_ms);
        Ok(Stored::Taken(taken))
    }

    /// Why this member may no longer write into its location, if so: its lease ran out, or the
    /// location's marker names a later owner.
    pub(super) async fn lost_ownership(
        &self,
        deadline: &watch::Receiver<u64>,
    ) -> Result<Option<String>, StoreError> {
        let target = &self.target;
        if lease_ran_out(deadline) {
            return Ok(Some(format!(
                "the lease ran out (epoch {}): not uploading",
                target.epoch
            )));
        }
        let marker = marker::read(&self.own.store(), self.own.prefix()).await?;
        Ok(
            match Marker::ownership(marker.as_ref(), &self.runtime.member, target.epoch) {
                Ownership::Lost { to, epoch } => Some(format!(
                    "the backups at {} belong to {to} at epoch {epoch} (this is epoch {}): not uploading",
                    self.own, target.epoch
                )),
                Ownership::Owner => None,
            },
        )
    }
}

/// Why a snapshot was not stored; the events stay for the next attempt (a delta at the next
/// period, a full snapshot at its retry). Ownership lost is not an error: it is
/// [`Stored::Lost`].
#[derive(Debug, thiserror::Error)]
pub(super) enum StoreError {
    /// Taking or uploading the snapshot failed (etcd, the object store).
    #[error(transparent)]
    Snapshot(#[from] crate::backup::snapshot::SnapshotError),
    /// The location's marker could not be read (the object store).
    #[error(transparent)]
    Marker(#[from] crate::backup::marker::MarkerError),
    /// The task that ran a full snapshot ended without an answer (it panicked).
    #[error("the full snapshot's task ended without an answer: {0}")]
    Task(String),
}

/// What [`Uploader::store_checked`] uploads.
#[derive(Debug, Clone, Copy)]
enum Stage<'a> {
    /// A full snapshot of etcd.
    Full { final_: bool },
    /// Events, the first delta revision `start_revision`.
    Delta {
        final_: bool,
        start_revision: u64,
        events: &'a [DeltaEvent],
    },
}

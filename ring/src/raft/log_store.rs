//! The Raft log, vote and committed index: the newest appends in the write-ahead file
//! ([`super::wal`]), everything else in redb.
//!
//! Durability contract (openraft relies on it, and so do clients): `append` reports entries as
//! flushed (its callback) only after they are fsynced: in a WAL record (`fdatasync`), or in a
//! redb transaction with `Durability::Immediate`; `save_vote`, `truncate_after` and `purge`
//! return only after their change is fsynced in redb. The committed index is not fsynced on
//! its own: it is an optimisation for restart (how far to re-apply) and is written with the next
//! fsynced record or transaction.
//!
//! How it is done, as openraft asks (`RaftLogStorage::append`: return once the entries are
//! readable, report them flushed later). openraft runs every storage call inline in its core,
//! so a call that waits for the disk holds up the whole member. Here no call of the core waits
//! for an append's fsync:
//!
//! - `append` puts the entries into the in-memory **tail** (the newest entries, readable at
//!   once, so replication to the followers starts while this member writes) and queues them
//!   for the **flusher thread**;
//! - the flusher takes everything queued (appends, and the rare truncations, purges and votes,
//!   in order) and writes it at once, together with the latest committed index: appends only
//!   as **one WAL record**; anything else, or appends that would take the WAL past
//!   [`FOLD_AFTER_ENTRIES`] or past its size, as **one redb transaction** that also *folds*
//!   the WAL's entries into redb (and so empties the WAL). Then it reports each append flushed
//!   and wakes each waiting call: appends that queued up during one fsync share the next one
//!   (group commit);
//! - reads take entries from the tail, and from redb below it; the tail keeps every entry not
//!   yet in redb (durable in the WAL or not durable yet), and the newest [`TAIL_KEEP`] others.
//!
//! Opening the store folds what the WAL holds into redb first, so at start redb holds the whole
//! log.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::codec::{decode, encode};
use super::disk::DiskHealth;
use super::storage::{KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, META, blocking, io as io_err};
use super::types::{Entry, LogId, TypeConfig, Vote};
use super::wal::{self, Wal};

/// Most log entries returned by one read, so a lagging follower is caught up in bounded steps.
const MAX_ENTRIES_PER_READ: usize = 4_096;
/// Durable entries kept in memory for replication reads (a follower that is only a little
/// behind is served without touching the disk).
pub const TAIL_KEEP: usize = 1_024;
/// Most entries held in the WAL (and so in the tail) before they are folded into redb. A fold
/// is one redb transaction on the flusher's path, so it delays the appends queued behind it:
/// `ring-chaos bench --only commit`, 2-core VM, p99 against etcd's at 16 / 64 clients was
/// 1.59x / 1.04x with 4,096 here and 0.57x / 0.56x with 512 (1 client: 0.64x and 0.78x).
pub const FOLD_AFTER_ENTRIES: usize = 512;

/// The Raft log store. Cheap to clone: clones share the database, the tail and the flusher.
#[derive(Clone)]
pub struct LogStore {
    // Declared first: dropping the last clone stops the flusher (which finishes its work and
    // writes the committed log id one last time) while this clone still keeps the database open.
    flusher: Arc<Flusher>,
    db: Arc<Database>,
    shared: Arc<Shared>,
}

/// What the store's clones and the flusher share.
#[derive(Default)]
struct Shared {
    tail: Mutex<Tail>,
    /// The committed log id openraft saved last, not necessarily written yet; `None` when
    /// nothing was saved since the store was opened (redb holds the latest then).
    committed: Mutex<Option<Option<LogId>>>,
    /// Whether the flusher waits for room on the disk (see [`super::disk`]).
    disk: DiskHealth,
    /// Tests: the flusher's next batch fails as a disk error would.
    #[cfg(test)]
    fail_next_batch: std::sync::atomic::AtomicBool,
    /// Tests: the flusher panics while writing its next batch.
    #[cfg(test)]
    panic_next_batch: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn tail(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn committed(&self) -> Option<Option<LogId>> {
        *self.committed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The newest part of the log, in memory.
#[derive(Default)]
struct Tail {
    /// Contiguous entries from index `from` on, each with the number of the queued operation
    /// that writes it. Every entry at or after `from` that exists is here; everything before
    /// `from` is in redb (or purged).
    entries: VecDeque<(u64, Entry)>,
    from: u64,
    /// Number of the last operation queued, of the last one the flusher made durable, and of
    /// the last one it wrote into redb (`folded <= durable <= queued`).
    queued: u64,
    durable: u64,
    folded: u64,
    /// Bumped by every truncation: a read that went to redb meanwhile starts again.
    truncations: u64,
}

impl Tail {
    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(_, e)| e.index())
    }

    /// Drops entries that are in redb from the front while more than [`TAIL_KEEP`] are held
    /// (reads below `from` go to redb).
    fn trim(&mut self) {
        debug_assert!(self.folded <= self.durable && self.durable <= self.queued);
        while self.entries.len() > TAIL_KEEP
            && self
                .entries
                .front()
                .is_some_and(|(op, _)| *op <= self.folded)
        {
            if let Some((_, e)) = self.entries.pop_front() {
                self.from = e.index() + 1;
            }
        }
    }
}

/// Work for the flusher, in the order the core asked for it.
enum Op {
    Append {
        entries: Vec<Entry>,
        callback: IOFlushed<TypeConfig>,
    },
    Truncate {
        from: u64,
        done: oneshot::Sender<io::Result<()>>,
    },
    Purge {
        log_id: LogId,
        done: oneshot::Sender<io::Result<()>>,
    },
    Vote {
        vote: Vote,
        done: oneshot::Sender<io::Result<()>>,
    },
    /// Nothing to write: answered once everything queued before it is durable.
    Barrier {
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// The flusher thread and its queue.
struct Flusher {
    queue: Option<mpsc::Sender<(u64, Op)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    /// Closes the queue and waits for the thread to finish what it was given, so the database
    /// is no longer in use once the last clone of the store is gone.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("storage: the log flusher stopped")
}

/// A copy of `e` (`io::Error` is not `Clone`).
fn copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl LogStore {
    /// A log store over the data directory `dir`, opened as `db` (see [`super::storage::open`]).
    /// Folds the WAL's entries into redb (see [`super::wal`]), then starts the flusher thread,
    /// which ends when the last clone of the store is dropped.
    pub fn new(db: Arc<Database>, dir: &Path) -> io::Result<Self> {
        let wal = Wal::open(dir, &db)?;
        let next = {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            let last = log.last().map_err(io_err)?.map(|(k, _)| k.value());
            let meta = txn.open_table(META).map_err(io_err)?;
            let purged: Option<LogId> = match meta.get(KEY_LAST_PURGED).map_err(io_err)? {
                Some(v) => Some(decode("last purged log id", v.value())?),
                None => None,
            };
            last.or(purged.map(|p| p.index()))
                .map_or(0, |i| i.saturating_add(1))
        };
        let shared = Arc::new(Shared {
            tail: Mutex::new(Tail {
                from: next,
                ..Tail::default()
            }),
            ..Shared::default()
        });
        let (queue, receiver) = mpsc::channel();
        let (weak, flusher_shared) = (Arc::downgrade(&db), shared.clone());
        let thread = std::thread::Builder::new()
            .name("ring-log-flush".into())
            .spawn({
                let dir = dir.to_path_buf();
                move || run_flusher(&weak, &receiver, &flusher_shared, wal, &dir)
            })?;
        Ok(Self {
            flusher: Arc::new(Flusher {
                queue: Some(queue),
                thread: Some(thread),
            }),
            db,
            shared,
        })
    }

    /// Whether the disk has room for the log (see [`super::disk`]); shared with the flusher.
    pub fn disk_health(&self) -> DiskHealth {
        self.shared.disk.clone()
    }

    /// Queues `op` (with `tail` held, so operations are numbered in queue order); its number.
    fn queue(&self, tail: &mut Tail, op: Op) -> Result<u64, Op> {
        let Some(queue) = &self.flusher.queue else {
            return Err(op);
        };
        let number = tail.queued + 1;
        match queue.send((number, op)) {
            Ok(()) => {
                tail.queued = number;
                Ok(number)
            }
            Err(mpsc::SendError((_, op))) => Err(op),
        }
    }

    /// Queues the operation `make` builds around a completion, and waits until it is durable.
    async fn queue_and_wait(
        &self,
        change_tail: impl FnOnce(&mut Tail),
        make: impl FnOnce(oneshot::Sender<io::Result<()>>) -> Op,
    ) -> io::Result<()> {
        let (done, finished) = oneshot::channel();
        {
            let mut tail = self.shared.tail();
            change_tail(&mut tail);
            self.queue(&mut tail, make(done)).map_err(|_| stopped())?;
        }
        finished.await.map_err(|_| stopped())?
    }

    async fn read_meta<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        key: &'static str,
    ) -> io::Result<Option<T>> {
        blocking(&self.db, move |db| {
            let txn = db.begin_read().map_err(io_err)?;
            let meta = txn.open_table(META).map_err(io_err)?;
            match meta.get(key).map_err(io_err)? {
                Some(v) => Ok(Some(decode(key_name(key), v.value())?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// Reads entries `[start, end)` (to the end of the log when `end` is `None`), at most
    /// `limit` of them: from the tail, and from redb below it. A gap inside the range is
    /// corruption and an error.
    async fn read_range(
        &self,
        start: u64,
        end: Option<u64>,
        limit: usize,
    ) -> io::Result<Vec<Entry>> {
        let end = end.unwrap_or(u64::MAX);
        if end <= start || limit == 0 {
            return Ok(Vec::new());
        }
        loop {
            let (from, truncations, from_tail) = {
                let tail = self.shared.tail();
                let from_tail: Vec<Entry> = tail
                    .entries
                    .iter()
                    .map(|(_, e)| e)
                    .filter(|e| e.index() >= start && e.index() < end)
                    .take(limit)
                    .cloned()
                    .collect();
                (tail.from, tail.truncations, from_tail)
            };
            if start >= from {
                return Ok(from_tail);
            }
            let mut entries = self.read_durable(start, end.min(from), limit).await?;
            if self.shared.tail().truncations != truncations {
                // The log was cut meanwhile: what redb gave may be gone already.
                continue;
            }
            let room = limit - entries.len();
            if entries.last().map(|e| e.index() + 1) == Some(from) || entries.is_empty() {
                entries.extend(from_tail.into_iter().take(room));
            }
            check_contiguous(&entries)?;
            return Ok(entries);
        }
    }

    /// Reads entries `[start, end)` from redb, at most `limit`.
    async fn read_durable(&self, start: u64, end: u64, limit: usize) -> io::Result<Vec<Entry>> {
        blocking(&self.db, move |db| {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            let mut entries: Vec<Entry> = Vec::new();
            for item in log.range(start..end).map_err(io_err)?.take(limit) {
                let (k, v) = item.map_err(io_err)?;
                let entry: Entry = decode("log entry", v.value())?;
                if entry.index() != k.value() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "raft log entry stored at {} claims index {}",
                            k.value(),
                            entry.index()
                        ),
                    ));
                }
                entries.push(entry);
            }
            check_contiguous(&entries)?;
            Ok(entries)
        })
        .await
    }
}

/// Fails when `entries` are not consecutive.
fn check_contiguous(entries: &[Entry]) -> io::Result<()> {
    for pair in entries.windows(2) {
        if pair[1].index() != pair[0].index() + 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "raft log has a hole: entry {} follows {}",
                    pair[1].index(),
                    pair[0].index()
                ),
            ));
        }
    }
    Ok(())
}

fn key_name(key: &'static str) -> &'static str {
    match key {
        KEY_VOTE => "vote",
        KEY_COMMITTED => "committed log id",
        KEY_LAST_PURGED => "last purged log id",
        _ => "metadata",
    }
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(i) => *i,
        Bound::Excluded(i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => Some(i.saturating_add(1)),
        Bound::Excluded(i) => Some(*i),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let (start, end) = bounds(&range);
        self.read_range(start, end, usize::MAX).await
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        self.read_range(start, Some(end), MAX_ENTRIES_PER_READ)
            .await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        self.read_meta(KEY_VOTE).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        // Everything queued durable first: redb then holds the whole log.
        self.queue_and_wait(|_| {}, |done| Op::Barrier { done })
            .await?;
        let last_purged: Option<LogId> = self.read_meta(KEY_LAST_PURGED).await?;
        let last_entry = blocking(&self.db, |db| {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            match log.last().map_err(io_err)? {
                Some((_, v)) => Ok(Some(decode::<Entry>("log entry", v.value())?.log_id())),
                None => Ok(None),
            }
        })
        .await?;
        Ok(LogState {
            last_log_id: last_entry.or(last_purged),
            last_purged_log_id: last_purged,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let vote = *vote;
        self.queue_and_wait(|_| {}, |done| Op::Vote { vote, done })
            .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Written by the flusher's next transaction.
        *self
            .shared
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        match self.shared.committed() {
            Some(committed) => Ok(committed),
            None => Ok(self
                .read_meta::<Option<LogId>>(KEY_COMMITTED)
                .await?
                .flatten()),
        }
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let Some(first) = entries.first().map(RaftEntry::index) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        for (i, entry) in entries.iter().enumerate() {
            assert_eq!(
                entry.index(),
                first + i as u64,
                "log entries must be appended contiguously"
            );
        }
        let mut tail = self.shared.tail();
        match tail.last_index() {
            Some(last) if first > last + 1 => {
                let e = io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "appending entry {first} after entry {last} would leave a hole in the log"
                    ),
                );
                callback.io_completed(Err(copy(&e)));
                return Err(e);
            }
            Some(_) => {}
            // Nothing in memory: the log may start anywhere (a new log, after a snapshot).
            None => tail.from = tail.from.max(first),
        }
        // Entries at these indexes are replaced (as redb's insert replaces them).
        while tail.last_index().is_some_and(|i| i >= first) {
            tail.entries.pop_back();
        }
        tail.from = tail.from.min(first);
        let count = entries.len();
        let number = tail.queued + 1;
        tail.entries
            .extend(entries.iter().map(|e| (number, e.clone())));
        // Readable now; reported to openraft once the flusher made it durable.
        match self.queue(&mut tail, Op::Append { entries, callback }) {
            Ok(_) => Ok(()),
            Err(op) => {
                let keep = tail.entries.len() - count;
                tail.entries.truncate(keep);
                if let Op::Append { callback, .. } = op {
                    callback.io_completed(Err(stopped()));
                }
                Err(stopped())
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map(|id| id.index() + 1).unwrap_or(0);
        self.queue_and_wait(
            |tail| {
                while tail.last_index().is_some_and(|i| i >= from) {
                    tail.entries.pop_back();
                }
                tail.from = tail.from.min(from);
                tail.truncations += 1;
            },
            |done| Op::Truncate { from, done },
        )
        .await
    }

    /// Queued, not waited for. openraft's core waits for `purge` and handles nothing
    /// meanwhile, and a purge waits for the flusher's batch before it: in the Admin flood
    /// (`ring-chaos bench --only flood`) a snapshot and its purge came about once a second and
    /// `fdatasync` stalled for 40-90 ms now and then, all three members at once on one shared
    /// disk, so a waited-for purge could hold the core that long. A purge need not be
    /// durable when it returns: one lost in a crash leaves entries below the snapshot on disk,
    /// which `get_log_state` reports as not purged (no hole either way). The flusher writes it
    /// before anything queued later, and a failed write fails every operation after it, so an
    /// error still stops Raft at the next append or vote.
    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let upto = log_id.index();
        // Nobody waits for the answer.
        let (done, _) = oneshot::channel();
        let mut tail = self.shared.tail();
        while tail.entries.front().is_some_and(|(_, e)| e.index() <= upto) {
            tail.entries.pop_front();
        }
        tail.from = tail.from.max(upto + 1);
        self.queue(&mut tail, Op::Purge { log_id, done })
            .map_err(|_| stopped())?;
        Ok(())
    }
}

/// The flusher thread: takes everything queued, writes it at once (with the latest committed
/// log id; see [`write_batch`]), then reports it, in order. When the queue closes (the last
/// clone of the store was dropped) it writes a committed log id saved since its last write,
/// and ends. It holds the database only while it writes. After a write fails it writes
/// nothing more: every later operation fails with that first error.
fn run_flusher(
    db: &Weak<Database>,
    queue: &mpsc::Receiver<(u64, Op)>,
    shared: &Shared,
    wal: Wal,
    dir: &std::path::Path,
) {
    let mut written = Written {
        wal,
        unfolded: Vec::new(),
        committed: None,
    };
    let mut failed: Option<io::Error> = None;
    while let Ok(first) = queue.recv() {
        // Nothing is written (so nothing acknowledged) while the disk lacks room; what queues
        // meanwhile is written at once afterwards.
        if failed.is_none() {
            super::disk::wait_for_room(dir, &shared.disk);
        }
        // The committed log id first, the rest of the queue after: every entry it covers was
        // queued before openraft saved it, so it is in this batch or an earlier one.
        let committed = shared.committed();
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        let last = batch.last().map_or(0, |(n, _)| *n);
        // After one failed batch nothing more is written: the log on disk would have a hole
        // where the failed appends were, with later entries (and a committed index) after it.
        // Every later operation gets the first error; openraft stops this member's Raft on it.
        let result = match &failed {
            Some(e) => Err(copy(e)),
            #[cfg(test)]
            None if shared
                .fail_next_batch
                .swap(false, std::sync::atomic::Ordering::SeqCst) =>
            {
                Err(io::Error::other("injected write failure"))
            }
            // A panic while writing (in redb or the codec) becomes this batch's error, so every
            // waiting call and openraft hear of it instead of waiting for ever.
            None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                #[cfg(test)]
                if shared
                    .panic_next_batch
                    .swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    panic!("injected panic while writing");
                }
                write_batch(db, &mut written, &batch, committed)
            }))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                Err(io::Error::other(format!(
                    "storage: writing the Raft log panicked: {what}"
                )))
            }),
        };
        match &result {
            Ok(folded) => {
                let mut tail = shared.tail();
                tail.durable = last;
                if *folded {
                    tail.folded = last;
                }
                tail.trim();
            }
            Err(e) if failed.is_none() => {
                tracing::error!("the Raft log could not be written, and no more will be: {e}");
                failed = Some(copy(e));
            }
            Err(_) => {}
        }
        for (_, op) in batch {
            let outcome = match &result {
                Ok(_) => Ok(()),
                Err(e) => Err(copy(e)),
            };
            match op {
                Op::Append { callback, .. } => callback.io_completed(outcome),
                Op::Truncate { done, .. }
                | Op::Purge { done, .. }
                | Op::Vote { done, .. }
                | Op::Barrier { done } => {
                    let _ = done.send(outcome);
                }
            }
        }
    }
    let last = shared.committed();
    if failed.is_none()
        && last.is_some()
        && last != written.committed
        && let Err(e) = write_batch(db, &mut written, &[], last)
    {
        tracing::warn!("the committed log id was not saved at shutdown: {e}");
    }
}

/// What the flusher has written, kept between batches.
struct Written {
    wal: Wal,
    /// The entries in the WAL and not yet in redb (index, encoding), in the order written.
    unfolded: Vec<(u64, Vec<u8>)>,
    /// The committed log id written last (`None`: none since the store was opened).
    committed: Option<Option<LogId>>,
}

/// Writes `batch`, in order, and `committed` (the committed log id openraft saved, if any),
/// fsynced: appends alone as one WAL record; anything else (or appends that do not fit the WAL)
/// as one redb transaction that first folds the WAL's entries into redb. Returns whether it
/// folded (redb then holds every entry of `batch` and before).
fn write_batch(
    db: &Weak<Database>,
    written: &mut Written,
    batch: &[(u64, Op)],
    committed: Option<Option<LogId>>,
) -> io::Result<bool> {
    let mut appended = Vec::new();
    let mut appends_only = true;
    for (_, op) in batch {
        match op {
            Op::Append { entries, .. } => {
                for entry in entries {
                    appended.push((entry.index(), encode("log entry", entry)?));
                }
            }
            _ => appends_only = false,
        }
    }
    if appends_only && written.unfolded.len() + appended.len() <= FOLD_AFTER_ENTRIES {
        let committed_bytes = match committed {
            Some(value) if committed != written.committed => {
                Some(encode("committed log id", &value)?)
            }
            _ => None,
        };
        if appended.is_empty() && committed_bytes.is_none() {
            return Ok(false);
        }
        let payload = wal::encode_payload(committed_bytes.as_deref(), &appended);
        if written.wal.append(&payload)? {
            written.unfolded.extend(appended);
            written.committed = committed;
            return Ok(false);
        }
    }
    let db = db
        .upgrade()
        .ok_or_else(|| io::Error::other("storage: the database is closed"))?;
    let mut txn = db.begin_write().map_err(io_err)?;
    txn.set_durability(Durability::Immediate).map_err(io_err)?;
    {
        let mut log = txn.open_table(LOG).map_err(io_err)?;
        let mut meta = txn.open_table(META).map_err(io_err)?;
        // The WAL's entries first: they were appended before this batch.
        for (index, bytes) in &written.unfolded {
            log.insert(index, bytes.as_slice()).map_err(io_err)?;
        }
        let mut appended = appended.iter();
        for (_, op) in batch {
            match op {
                Op::Append { entries, .. } => {
                    for _ in entries {
                        let (index, bytes) = appended
                            .next()
                            .expect("every appended entry was encoded above");
                        log.insert(index, bytes.as_slice()).map_err(io_err)?;
                    }
                }
                Op::Truncate { from, .. } => {
                    log.retain_in(*from.., |_, _| false).map_err(io_err)?;
                }
                Op::Purge { log_id, .. } => {
                    let bytes = encode("last purged log id", log_id)?;
                    meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                        .map_err(io_err)?;
                    log.retain_in(..=log_id.index(), |_, _| false)
                        .map_err(io_err)?;
                }
                Op::Vote { vote, .. } => {
                    let bytes = encode("vote", vote)?;
                    meta.insert(KEY_VOTE, bytes.as_slice()).map_err(io_err)?;
                }
                Op::Barrier { .. } => {}
            }
        }
        if let Some(value) = committed {
            let bytes = encode("committed log id", &value)?;
            meta.insert(KEY_COMMITTED, bytes.as_slice())
                .map_err(io_err)?;
        }
    }
    // The WAL's records no longer count once this commits (see `wal`).
    let (id, generation) = written.wal.next();
    wal::set_recorded(&txn, id, generation)?;
    txn.commit().map_err(io_err)?;
    written.wal.folded();
    written.unfolded.clear();
    written.committed = committed;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::storage;
    use crate::raft::types::log_id;
    use openraft::EntryPayload;
    use openraft::type_config::TypeConfigExt;

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Blank,
        }
    }

    fn entries(term: u64, range: std::ops::Range<u64>) -> Vec<Entry> {
        range.map(|i| entry(term, i)).collect()
    }

    /// Appends and returns a receiver that sees the append flushed.
    async fn append(
        store: &mut LogStore,
        new: Vec<Entry>,
    ) -> oneshot::Receiver<Result<(), io::Error>> {
        let (tx, rx) = TypeConfig::oneshot();
        store.append(new, IOFlushed::signal(tx)).await.unwrap();
        rx
    }

    async fn indexes(store: &mut LogStore, range: std::ops::Range<u64>) -> Vec<(u64, u64)> {
        store
            .try_get_log_entries(range)
            .await
            .unwrap()
            .iter()
            .map(|e| (e.log_id.leader_id.term, e.index()))
            .collect()
    }

    fn expect(term: u64, range: std::ops::Range<u64>) -> Vec<(u64, u64)> {
        range.map(|i| (term, i)).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_are_readable_at_once_durable_when_reported_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db, dir.path()).unwrap();
            let flushed = append(&mut store, entries(1, 1..4)).await;
            assert_eq!(indexes(&mut store, 0..10).await, expect(1, 1..4));
            flushed.await.unwrap().unwrap();
            // Many appends at once share fsyncs and all get reported, in order.
            let mut waiting = Vec::new();
            for i in 4..40 {
                waiting.push(append(&mut store, vec![entry(1, i)]).await);
            }
            for rx in waiting {
                rx.await.unwrap().unwrap();
            }
            store.save_committed(Some(log_id(1, 1, 39))).await.unwrap();
            assert_eq!(
                store.read_committed().await.unwrap(),
                Some(log_id(1, 1, 39))
            );
        }
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        assert_eq!(indexes(&mut store, 0..100).await, expect(1, 1..40));
        // Written when the last clone of the store was dropped.
        assert_eq!(
            store.read_committed().await.unwrap(),
            Some(log_id(1, 1, 39))
        );
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 39)));
        // Appends continue where the log ends.
        append(&mut store, vec![entry(2, 40)])
            .await
            .await
            .unwrap()
            .unwrap();
        let (tx, _rx) = TypeConfig::oneshot();
        let hole = store
            .append(vec![entry(2, 42)], IOFlushed::signal(tx))
            .await;
        assert!(hole.is_err(), "a hole is refused");
    }

    fn redb_indexes(db: &Database) -> Vec<u64> {
        let txn = db.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        log.iter().unwrap().map(|i| i.unwrap().0.value()).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_are_durable_in_the_wal_and_folded_into_redb_in_bounded_steps() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db.clone(), dir.path()).unwrap();
            for i in 1..=10 {
                append(&mut store, vec![entry(1, i)])
                    .await
                    .await
                    .unwrap()
                    .unwrap();
            }
            store.save_committed(Some(log_id(1, 1, 9))).await.unwrap();
            append(&mut store, vec![entry(1, 11)])
                .await
                .await
                .unwrap()
                .unwrap();
            // Reported durable, and in the WAL only: redb has not been written.
            assert!(redb_indexes(&db).is_empty());
            assert_eq!(indexes(&mut store, 0..20).await, expect(1, 1..12));
            // Dropped without a fold, as a crash would leave it (the WAL is already synced).
        }
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db.clone(), dir.path()).unwrap();
            // Opening folded the WAL into redb: entries and the committed log id.
            assert_eq!(redb_indexes(&db), (1..12).collect::<Vec<_>>());
            assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 9)));
            // More than the WAL may hold between folds, one entry per append: redb is written
            // every FOLD_AFTER_ENTRIES at most, and the tail stays bounded.
            let total = 2 * FOLD_AFTER_ENTRIES as u64 + 100;
            let mut waiting = Vec::new();
            for i in 12..12 + total {
                waiting.push(append(&mut store, vec![entry(1, i)]).await);
                if waiting.len() == 64 {
                    for rx in waiting.drain(..) {
                        rx.await.unwrap().unwrap();
                    }
                }
            }
            for rx in waiting {
                rx.await.unwrap().unwrap();
            }
            let in_redb = redb_indexes(&db).len() as u64;
            assert!(
                in_redb >= 11 + total - FOLD_AFTER_ENTRIES as u64,
                "folded: {in_redb} of {}",
                11 + total
            );
            assert!(store.shared.tail().entries.len() <= FOLD_AFTER_ENTRIES + TAIL_KEEP + 64);
            assert_eq!(
                indexes(&mut store, 0..12 + total).await,
                expect(1, 1..12 + total)
            );
        }
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(
            state.last_log_id,
            Some(log_id(1, 1, 11 + 2 * FOLD_AFTER_ENTRIES as u64 + 100))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_failed_write_nothing_more_is_written_or_reported_durable() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db, dir.path()).unwrap();
            append(&mut store, entries(1, 1..3))
                .await
                .await
                .unwrap()
                .unwrap();
            store
                .shared
                .fail_next_batch
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let failed = append(&mut store, vec![entry(1, 3)]).await.await.unwrap();
            assert!(failed.is_err(), "the failed batch is reported failed");
            // The next append would land after a hole: it fails with the first error.
            let later = append(&mut store, vec![entry(1, 4)]).await.await.unwrap();
            let later = later.expect_err("nothing is written after a failure");
            assert!(later.to_string().contains("injected"), "{later}");
            assert!(store.save_vote(&Vote::new(2, 1)).await.is_err());
            store.save_committed(Some(log_id(1, 1, 4))).await.unwrap();
        }
        // On disk: only what was written before the failure, and no committed index past it.
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        assert_eq!(indexes(&mut store, 0..10).await, expect(1, 1..3));
        assert_eq!(store.read_committed().await.unwrap(), None);
        assert_eq!(store.read_vote().await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_while_writing_is_reported_as_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        store
            .shared
            .panic_next_batch
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let flushed = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            append(&mut store, vec![entry(1, 1)]).await,
        )
        .await
        .expect("reported, not dropped")
        .unwrap();
        let err = flushed.expect_err("a panic is a failure");
        assert!(err.to_string().contains("panicked: injected"), "{err}");
        // Latched like any failure; the flusher thread is still there to say so.
        let vote = store.save_vote(&Vote::new(2, 1)).await.unwrap_err();
        assert!(vote.to_string().contains("panicked"), "{vote}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_span_redb_and_the_tail_and_truncation_and_purge_apply_to_both() {
        let dir = tempfile::tempdir().unwrap();
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db.clone(), dir.path()).unwrap();
        let total = TAIL_KEEP as u64 + 500;
        let mut last = None;
        for chunk in (1..=total).collect::<Vec<_>>().chunks(100) {
            last = Some(append(&mut store, entries(1, chunk[0]..chunk[chunk.len() - 1] + 1)).await);
        }
        last.unwrap().await.unwrap().unwrap();
        // A barrier folds the WAL into redb: entries in redb leave the tail (but TAIL_KEEP).
        store.get_log_state().await.unwrap();
        append(&mut store, vec![entry(1, total + 1)])
            .await
            .await
            .unwrap()
            .unwrap();
        let from = store.shared.tail().from;
        assert!(from > 1, "old entries that are in redb left the tail");
        assert_eq!(
            indexes(&mut store, 1..total + 2).await,
            expect(1, 1..total + 2)
        );
        assert_eq!(
            indexes(&mut store, from - 3..from + 3).await,
            expect(1, from - 3..from + 3)
        );
        let limited = store.limited_get_log_entries(1, total + 2).await.unwrap();
        assert_eq!(limited.len(), (total + 1) as usize);

        // A new leader's entries replace the end of the log: queued, not yet flushed, then cut.
        let end = total + 2;
        let _unflushed = append(&mut store, entries(1, end..end + 5)).await;
        store
            .truncate_after(Some(log_id(1, 1, end + 1)))
            .await
            .unwrap();
        append(&mut store, entries(2, end + 2..end + 4))
            .await
            .await
            .unwrap()
            .unwrap();
        let mut want = expect(1, end - 2..end + 2);
        want.extend(expect(2, end + 2..end + 4));
        assert_eq!(indexes(&mut store, end - 2..end + 10).await, want);

        // Purged entries are gone from both.
        store.purge(log_id(1, 1, 10)).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 10)));
        assert_eq!(state.last_log_id, Some(log_id(2, 1, end + 3)));
        assert_eq!(indexes(&mut store, 0..13).await, expect(1, 11..13));

        // The same after a reopen.
        drop(store);
        drop(db);
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        assert_eq!(indexes(&mut store, end - 2..end + 10).await, want);
        assert_eq!(indexes(&mut store, 0..13).await, expect(1, 11..13));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_not_waited_for_still_lands_before_what_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db, dir.path()).unwrap();
            append(&mut store, entries(1, 1..21))
                .await
                .await
                .unwrap()
                .unwrap();
            // Returns once queued; the entries leave the readable log at once.
            store.purge(log_id(1, 1, 10)).await.unwrap();
            assert_eq!(indexes(&mut store, 0..30).await, expect(1, 11..21));
            // An append queued after it is durable only after the purge was written.
            append(&mut store, vec![entry(1, 21)])
                .await
                .await
                .unwrap()
                .unwrap();
        }
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 10)));
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 21)));
        assert_eq!(indexes(&mut store, 0..30).await, expect(1, 11..22));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_vote_is_durable_when_saved() {
        let dir = tempfile::tempdir().unwrap();
        let vote = Vote::new(3, 2);
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db, dir.path()).unwrap();
            store.save_vote(&vote).await.unwrap();
            assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        }
        let db = storage::open(dir.path(), 1).unwrap();
        let mut store = LogStore::new(db, dir.path()).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
    }
}

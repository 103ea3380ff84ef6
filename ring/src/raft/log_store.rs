//! The Raft log, vote and committed index, stored in redb.
//!
//! Durability contract (openraft relies on it, and so do clients): `append` reports an entry as
//! flushed only after the redb transaction that wrote it has committed with
//! `Durability::Immediate`, i.e. after fsync; `save_vote` returns only after the vote is fsynced.
//! The committed index is written without its own fsync: it is an optimisation for restart (how
//! far to re-apply) and is made durable by the next durable commit.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use super::codec::{decode, encode};
use super::storage::{KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, META, blocking, io as io_err};
use super::types::{Entry, LogId, TypeConfig, Vote};

/// Most log entries returned by one read, so a lagging follower is caught up in bounded steps.
const MAX_ENTRIES_PER_READ: usize = 4_096;

/// The Raft log store. Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    /// A log store over an opened data directory (see [`super::storage::open`]).
    pub fn new(db: Arc<Database>) -> Self {
        Self { db }
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

    async fn write<F>(&self, durability: Durability, f: F) -> io::Result<()>
    where
        F: FnOnce(&redb::WriteTransaction) -> io::Result<()> + Send + 'static,
    {
        blocking(&self.db, move |db| {
            let mut txn = db.begin_write().map_err(io_err)?;
            txn.set_durability(durability).map_err(io_err)?;
            f(&txn)?;
            txn.commit().map_err(io_err)
        })
        .await
    }
}

fn key_name(key: &'static str) -> &'static str {
    match key {
        KEY_VOTE => "vote",
        KEY_COMMITTED => "committed log id",
        KEY_LAST_PURGED => "last purged log id",
        _ => "metadata",
    }
}

impl LogStore {
    /// Reads entries `[start, end)` (to the end of the log when `end` is `None`), at most
    /// `limit` of them. A gap inside the range is corruption and an error.
    async fn read_range(
        &self,
        start: u64,
        end: Option<u64>,
        limit: usize,
    ) -> io::Result<Vec<Entry>> {
        blocking(&self.db, move |db| {
            let txn = db.begin_read().map_err(io_err)?;
            let log = txn.open_table(LOG).map_err(io_err)?;
            let iter = match end {
                Some(end) if end <= start => return Ok(Vec::new()),
                Some(end) => log.range(start..end),
                None => log.range(start..),
            }
            .map_err(io_err)?;
            let mut entries: Vec<Entry> = Vec::new();
            for item in iter.take(limit) {
                let (k, v) = item.map_err(io_err)?;
                if let Some(prev) = entries.last()
                    && k.value() != prev.index() + 1
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "raft log has a hole: entry {} follows {}",
                            k.value(),
                            prev.index()
                        ),
                    ));
                }
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
            Ok(entries)
        })
        .await
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
        let bytes = encode("vote", vote)?;
        self.write(Durability::Immediate, move |txn| {
            let mut meta = txn.open_table(META).map_err(io_err)?;
            meta.insert(KEY_VOTE, bytes.as_slice()).map_err(io_err)?;
            Ok(())
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let bytes = encode("committed log id", &committed)?;
        self.write(Durability::None, move |txn| {
            let mut meta = txn.open_table(META).map_err(io_err)?;
            meta.insert(KEY_COMMITTED, bytes.as_slice())
                .map_err(io_err)?;
            Ok(())
        })
        .await
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self
            .read_meta::<Option<LogId>>(KEY_COMMITTED)
            .await?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            encoded.push((entry.index(), encode("log entry", &entry)?));
        }
        let result = self
            .write(Durability::Immediate, move |txn| {
                let mut log = txn.open_table(LOG).map_err(io_err)?;
                let mut previous: Option<u64> = None;
                for (index, bytes) in &encoded {
                    if let Some(p) = previous {
                        assert_eq!(*index, p + 1, "log entries must be appended contiguously");
                    }
                    previous = Some(*index);
                    log.insert(*index, bytes.as_slice()).map_err(io_err)?;
                }
                Ok(())
            })
            .await;
        // Report the outcome to openraft only once it is durable (or failed).
        match result {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map(|id| id.index() + 1).unwrap_or(0);
        self.write(Durability::Immediate, move |txn| {
            let mut log = txn.open_table(LOG).map_err(io_err)?;
            log.retain_in(from.., |_, _| false).map_err(io_err)?;
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let bytes = encode("last purged log id", &log_id)?;
        let upto = log_id.index();
        self.write(Durability::Immediate, move |txn| {
            let mut meta = txn.open_table(META).map_err(io_err)?;
            meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                .map_err(io_err)?;
            let mut log = txn.open_table(LOG).map_err(io_err)?;
            log.retain_in(..=upto, |_, _| false).map_err(io_err)?;
            Ok(())
        })
        .await
    }
}

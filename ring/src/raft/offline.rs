//! A data directory read and rewritten while no `ringd` runs on it: what `ringd recover` and
//! `ringctl snapshot restore` need (see [`crate::recovery`]).
//!
//! Reading gives everything the directory holds ([`Stored`]). The file is opened read-only
//! (redb's shared lock: a `ringd` that runs refuses to start, and one that runs makes this
//! fail), so the file stays byte for byte as it was until the operator confirms. Only a file
//! that was not closed cleanly (its `ringd` crashed) is opened for writing instead, which
//! repairs it in place exactly as `ringd`'s own next start would; its content does not change.
//! The newest log entries may still be in the write-ahead file ([`super::wal`]): reading takes
//! them from there, as `ringd`'s start would, without writing either file.
//!
//! Writing never touches the existing file: a new one is built next to it with the new starting
//! point ([`StartingPoint`]): a snapshot of the ring's state with its Raft membership, that
//! snapshot's log id as the committed and last purged log id, an empty log and a fresh vote,
//! committed with `Durability::Immediate` (fsync); it records no WAL, so the old `raft.wal`
//! is not its own and the next start replaces it. Then the old file is hard-linked to its
//! backup name (and the old `raft.wal`, when the old file records one, to the backup name of
//! the WAL: the two go back together) and the new one renamed over `ring.redb` and the
//! directory fsynced, so a crash leaves either the old data or the new under `ring.redb`,
//! never a mix and never nothing.
//!
//! This is exactly the shape of a member that snapshotted and purged its whole log, so the
//! normal start-up path takes it as is: [`StateMachineStore::open`](super::StateMachineStore)
//! loads the snapshot, the log store reports the purged log id as the last one, and openraft
//! finds a one-voter membership and elects this member.

use std::path::{Path, PathBuf};

use openraft::entry::RaftEntry;
use redb::{Database, Durability, ReadOnlyDatabase, ReadableDatabase, ReadableTable};

use super::NodeId;
use super::codec::{decode, encode};
use super::state_machine::{Applied, apply_entry, decode_applied, encode_body};
use super::storage::{
    DB_FILE, KEY_CODEC, KEY_COMMITTED, KEY_LAST_PURGED, KEY_NODE_ID, KEY_SNAPSHOT_DATA,
    KEY_SNAPSHOT_META, KEY_VOTE, LOG, META, OpenError,
};
use super::types::{Entry, LogId, SnapshotMeta, Vote};
use super::wal;

/// Everything a data directory holds.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The member id recorded in it.
    pub member_id: NodeId,
    /// The last vote.
    pub vote: Option<Vote>,
    /// The last committed log id this member knew of (written without its own fsync, so it
    /// may lag behind).
    pub committed: Option<LogId>,
    /// The log was purged up to here (inclusive).
    pub last_purged: Option<LogId>,
    /// The latest snapshot: its metadata and the state it holds.
    pub snapshot: Option<(SnapshotMeta, Applied)>,
    /// The log entries after the purge point, in order.
    pub entries: Vec<Entry>,
}

impl Stored {
    /// The last log id in the directory: the last entry, else the purge point or snapshot.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.entries
            .last()
            .map(|e| e.log_id())
            .or(self.last_purged)
            .max(self.snapshot.as_ref().and_then(|(m, _)| m.last_log_id))
    }

    /// The highest term this directory has seen: in its vote, its log, its snapshot or its
    /// committed log id.
    pub fn highest_term(&self) -> u64 {
        let log_terms = self
            .entries
            .iter()
            .map(|e| e.log_id.leader_id.term)
            .chain(self.committed.map(|l| l.leader_id.term))
            .chain(self.last_purged.map(|l| l.leader_id.term))
            .chain(
                self.snapshot
                    .as_ref()
                    .and_then(|(m, _)| m.last_log_id.map(|l| l.leader_id.term)),
            );
        self.vote
            .map(|v| v.leader_id.term)
            .into_iter()
            .chain(log_terms)
            .max()
            .unwrap_or(0)
    }

    /// The state as of the last entry in the log: the snapshot, then every entry after it,
    /// committed or not (like etcd's `--force-new-cluster`, what a member has locally is kept).
    /// Returns the state and how many commands in those entries were refused (committed but
    /// without effect, as on every member).
    pub fn state_at_last_entry(&self) -> (Applied, usize) {
        let mut applied = self
            .snapshot
            .as_ref()
            .map(|(_, a)| a.clone())
            .unwrap_or_default();
        let mut refused = 0;
        for entry in &self.entries {
            if applied
                .last_applied
                .is_some_and(|last| entry.log_id.index <= last.index)
            {
                continue;
            }
            if apply_entry(&mut applied, entry).is_err() {
                refused += 1;
            }
        }
        (applied, refused)
    }
}

/// What a data directory is rewritten to: a one-member ring at the snapshot `applied`.
#[derive(Debug, Clone)]
pub struct StartingPoint {
    /// The state, with `last_applied` (the new snapshot's log id) and `last_membership` set.
    pub applied: Applied,
    /// The vote to store: a term above every term seen, not committed (the member elects
    /// itself at start).
    pub vote: Vote,
}

/// The database of a data directory, open for offline use: read-only (or, for a file that
/// needs repair, read-write) and locked against a `ringd` starting on it.
enum Handle {
    ReadOnly(ReadOnlyDatabase),
    ReadWrite(Database),
}

impl Handle {
    fn begin_read(&self) -> Result<redb::ReadTransaction, redb::TransactionError> {
        match self {
            Handle::ReadOnly(db) => db.begin_read(),
            Handle::ReadWrite(db) => db.begin_read(),
        }
    }
}

/// A data directory opened for offline use (see the module docs). A `ringd` cannot start on
/// it while this is open.
pub struct OfflineDb {
    db: Handle,
    dir: PathBuf,
    /// The data directory itself, locked exclusively (flock) while this is open, so that two
    /// recoveries never work on it at once (redb's read-only lock is shared). Declared last:
    /// released after the database.
    _dir_lock: std::fs::File,
}

fn db_err(path: &Path, e: impl std::fmt::Display) -> OpenError {
    OpenError::Database {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl OfflineDb {
    /// Opens the ring in `dir`, which must belong to member `id`. Fails when there is no ring
    /// there, or when another process (a running `ringd`) holds it.
    pub fn open_existing(dir: &Path, id: NodeId) -> Result<Self, OpenError> {
        let path = dir.join(DB_FILE);
        if !path.is_file() {
            return Err(OpenError::NoRing(dir.to_path_buf()));
        }
        let in_use = |e: redb::DatabaseError| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => OpenError::InUse(dir.into()),
            e => db_err(&path, e),
        };
        let dir_lock = std::fs::File::open(dir).map_err(|e| db_err(dir, e))?;
        match dir_lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(db_err(
                    dir,
                    "another `ringd recover` works on this data directory; wait for it to end",
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(db_err(dir, e)),
        }
        let db = match ReadOnlyDatabase::open(&path) {
            Ok(db) => Handle::ReadOnly(db),
            // Not closed cleanly: repair it in place, as ringd's next start would.
            Err(redb::DatabaseError::RepairAborted) => {
                Handle::ReadWrite(Database::open(&path).map_err(in_use)?)
            }
            Err(e) => return Err(in_use(e)),
        };
        let this = Self {
            db,
            dir: dir.to_path_buf(),
            _dir_lock: dir_lock,
        };
        let found = this
            .read_meta_u64(KEY_NODE_ID)?
            .ok_or(OpenError::NoRing(dir.into()))?;
        if found != id {
            return Err(OpenError::WrongMember {
                path: dir.into(),
                found,
                expected: id,
            });
        }
        let codec = this.read_meta_raw(KEY_CODEC)?.and_then(|v| {
            <[u8; 4]>::try_from(v.as_slice())
                .ok()
                .map(u32::from_be_bytes)
        });
        if !codec.is_some_and(super::codec::reads) {
            return Err(OpenError::Codec {
                path,
                found: codec.unwrap_or(0),
            });
        }
        Ok(this)
    }

    /// Whether the file had to be repaired when it was opened (its `ringd` did not stop
    /// cleanly).
    pub fn was_repaired(&self) -> bool {
        matches!(self.db, Handle::ReadWrite(_))
    }

    /// The database file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(DB_FILE)
    }

    fn read_meta_raw(&self, key: &str) -> Result<Option<Vec<u8>>, OpenError> {
        let path = self.path();
        let txn = self.db.begin_read().map_err(|e| db_err(&path, e))?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db_err(&path, e)),
        };
        Ok(meta
            .get(key)
            .map_err(|e| db_err(&path, e))?
            .map(|v| v.value().to_vec()))
    }

    fn read_meta_u64(&self, key: &str) -> Result<Option<u64>, OpenError> {
        match self.read_meta_raw(key)? {
            None => Ok(None),
            Some(v) => <[u8; 8]>::try_from(v.as_slice())
                .map(|b| Some(u64::from_be_bytes(b)))
                .map_err(|_| db_err(&self.path(), format!("{key} is corrupt"))),
        }
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        what: &'static str,
    ) -> Result<Option<T>, OpenError> {
        match self.read_meta_raw(key)? {
            None => Ok(None),
            Some(v) => decode(what, &v)
                .map(Some)
                .map_err(|e| db_err(&self.path(), e)),
        }
    }

    /// Reads everything (see [`Stored`]); a hole in the log, a misplaced entry or a snapshot
    /// that does not match its metadata is an error.
    pub fn read(&self) -> Result<Stored, OpenError> {
        let path = self.path();
        let member_id = self
            .read_meta_u64(KEY_NODE_ID)?
            .ok_or_else(|| OpenError::NoRing(self.dir.clone()))?;
        let vote: Option<Vote> = self.read_meta(KEY_VOTE, "vote")?;
        let committed: Option<LogId> = self
            .read_meta::<Option<LogId>>(KEY_COMMITTED, "committed log id")?
            .flatten();
        let last_purged: Option<LogId> = self.read_meta(KEY_LAST_PURGED, "last purged log id")?;
        let meta: Option<SnapshotMeta> = self.read_meta(KEY_SNAPSHOT_META, "snapshot meta")?;
        let data = self.read_meta_raw(KEY_SNAPSHOT_DATA)?;
        let snapshot = match (meta, data) {
            (Some(meta), Some(data)) => {
                let applied = decode_applied(&data).map_err(|e| db_err(&path, e))?;
                if applied.last_applied != meta.last_log_id {
                    return Err(db_err(
                        &path,
                        "the stored snapshot does not match its metadata",
                    ));
                }
                Some((meta, applied))
            }
            (None, None) => None,
            _ => {
                return Err(db_err(
                    &path,
                    "snapshot metadata and data are not both present",
                ));
            }
        };
        let txn = self.db.begin_read().map_err(|e| db_err(&path, e))?;
        let mut by_index: std::collections::BTreeMap<u64, Entry> = Default::default();
        match txn.open_table(LOG) {
            Ok(log) => {
                for item in log.iter().map_err(|e| db_err(&path, e))? {
                    let (k, v) = item.map_err(|e| db_err(&path, e))?;
                    let entry: Entry =
                        decode("log entry", v.value()).map_err(|e| db_err(&path, e))?;
                    by_index.insert(k.value(), entry);
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(db_err(&path, e)),
        }
        // The WAL's entries and committed log id, newer than redb's, as a fold would write them.
        let mut committed = committed;
        let wal_path = self.dir.join(wal::WAL_FILE);
        let recorded = wal::recorded(&txn).map_err(|e| db_err(&path, e))?;
        for record in wal::read(&self.dir, recorded).map_err(|e| db_err(&wal_path, e))? {
            for (index, bytes) in record.entries {
                let entry: Entry = decode("log entry", &bytes).map_err(|e| db_err(&wal_path, e))?;
                by_index.insert(index, entry);
            }
            if let Some(bytes) = record.committed {
                committed = decode::<Option<LogId>>("committed log id", &bytes)
                    .map_err(|e| db_err(&wal_path, e))?;
            }
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(by_index.len());
        for (index, entry) in by_index {
            if entry.index() != index {
                return Err(db_err(
                    &path,
                    format!("log entry stored at {index} claims index {}", entry.index()),
                ));
            }
            if let Some(prev) = entries.last()
                && entry.index() != prev.index() + 1
            {
                return Err(db_err(
                    &path,
                    format!(
                        "the log has a hole: entry {} follows {}",
                        entry.index(),
                        prev.index()
                    ),
                ));
            }
            entries.push(entry);
        }
        // The log must go on where the snapshot or the purge point ends: a state built over a
        // gap would silently miss the entries in it.
        let floor = last_purged.map(|l| l.index()).max(
            snapshot
                .as_ref()
                .and_then(|(m, _)| m.last_log_id.map(|l| l.index())),
        );
        if let (Some(floor), Some(first)) = (floor, entries.first())
            && first.index() > floor + 1
        {
            return Err(db_err(
                &path,
                format!(
                    "the log starts at entry {}, but the snapshot and the purged log end at entry {floor}: entries {} to {} are missing",
                    first.index(),
                    floor + 1,
                    first.index() - 1
                ),
            ));
        }
        Ok(Stored {
            member_id,
            vote,
            committed,
            last_purged,
            snapshot,
            entries,
        })
    }

    /// Replaces the directory's database with a new file holding `start` (see the module
    /// docs); the old file stays, unchanged, as `backup` (a hard link), and so does the old
    /// `raft.wal` as `backup_wal` when the old file records one. Returns whether it did.
    pub fn replace_with(
        self,
        start: &StartingPoint,
        backup: &Path,
        backup_wal: &Path,
    ) -> Result<bool, OpenError> {
        let path = self.path();
        let io = |what: &str, p: &Path, e: std::io::Error| db_err(p, format!("{what}: {e}"));
        for b in [backup, backup_wal] {
            if b.exists() {
                return Err(db_err(b, "exists already"));
            }
        }
        let id = self.read_meta_u64(KEY_NODE_ID)?.unwrap_or_default();
        let has_wal = {
            let txn = self.db.begin_read().map_err(|e| db_err(&path, e))?;
            wal::recorded(&txn).map_err(|e| db_err(&path, e))?.is_some()
        };
        let fresh = self
            .dir
            .join(format!(".{DB_FILE}.recovering-{}", std::process::id()));
        let _ = std::fs::remove_file(&fresh);
        let result = (|| {
            create_file(&fresh, id, start)?;
            std::fs::hard_link(&path, backup).map_err(|e| io("keep the old data", backup, e))?;
            if has_wal {
                let wal = self.dir.join(wal::WAL_FILE);
                std::fs::hard_link(&wal, backup_wal)
                    .map_err(|e| io("keep the old write-ahead file", backup_wal, e))?;
            }
            // The backup name is durable before the rename takes the old file's name away.
            crate::durable::sync_parent_dir(&path)
                .map_err(|e| io("sync the directory", &path, e))?;
            std::fs::rename(&fresh, &path)
                .map_err(|e| io("put the new data in place", &path, e))?;
            crate::durable::sync_parent_dir(&path).map_err(|e| io("sync the directory", &path, e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&fresh);
        }
        drop(self);
        result.map(|()| has_wal)
    }
}

/// Creates the database file `path` (which must not exist) for member `id`, holding `start`:
/// one transaction committed with fsync, then the file fsynced once more after closing.
pub fn create_file(path: &Path, id: NodeId, start: &StartingPoint) -> Result<(), OpenError> {
    let err = |e: &dyn std::fmt::Display| db_err(path, e);
    let Some(log_id) = start.applied.last_applied else {
        return Err(err(&"a starting point needs a log id"));
    };
    if path.exists() {
        return Err(err(&"exists already"));
    }
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: start.applied.last_membership.clone(),
    };
    let meta = encode("snapshot meta", &meta).map_err(|e| err(&e))?;
    let data = encode_body(start.applied.clone()).map_err(|e| err(&e))?;
    let vote = encode("vote", &start.vote).map_err(|e| err(&e))?;
    let committed = encode("committed log id", &Some(log_id)).map_err(|e| err(&e))?;
    let purged = encode("last purged log id", &log_id).map_err(|e| err(&e))?;
    let db = Database::create(path).map_err(|e| err(&e))?;
    let mut txn = db.begin_write().map_err(|e| err(&e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| err(&e))?;
    {
        txn.open_table(LOG).map_err(|e| err(&e))?;
        let mut t = txn.open_table(META).map_err(|e| err(&e))?;
        let id = id.to_be_bytes();
        let codec = start
            .applied
            .state
            .settings
            .ring_version
            .active
            .to_be_bytes();
        for (key, value) in [
            (KEY_NODE_ID, id.as_slice()),
            (KEY_CODEC, codec.as_slice()),
            (KEY_VOTE, vote.as_slice()),
            (KEY_COMMITTED, committed.as_slice()),
            (KEY_LAST_PURGED, purged.as_slice()),
            (KEY_SNAPSHOT_META, meta.as_slice()),
            (KEY_SNAPSHOT_DATA, data.as_slice()),
        ] {
            t.insert(key, value).map_err(|e| err(&e))?;
        }
    }
    txn.commit().map_err(|e| err(&e))?;
    drop(db);
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use openraft::EntryPayload;

    use super::*;
    use crate::core::{Command, MemberSpec, Proposal};
    use crate::raft::types::log_id;

    fn entry(term: u64, index: u64, command: Command) -> Entry {
        Entry {
            log_id: log_id(term, 1, index),
            payload: EntryPayload::Normal(Proposal {
                command,
                at_ms: index,
                actor: "t".into(),
                reason: String::new(),
            }),
        }
    }

    #[test]
    fn the_state_is_taken_at_the_last_entry_committed_or_not() {
        let spec = |id: NodeId, name: &str| MemberSpec {
            id,
            name: name.into(),
            zone: format!("zone-{name}"),
            address: format!("127.0.0.1:{}", 1000 + id),
            admin_address: format!("127.0.0.1:{}", 2000 + id),
        };
        let stored = Stored {
            member_id: 1,
            vote: Some(Vote::new(5, 2)),
            committed: Some(log_id(4, 1, 1)),
            last_purged: None,
            snapshot: None,
            entries: vec![
                entry(
                    4,
                    1,
                    Command::Bootstrap {
                        members: vec![spec(1, "a"), spec(2, "b")],
                        dns_zone: None,
                    },
                ),
                // Appended, never known here to be committed: kept.
                entry(4, 2, Command::SetPaused { paused: true }),
                // Refused when applied, as on every member.
                entry(4, 3, Command::RemoveMember { id: 9 }),
            ],
        };
        let (applied, refused) = stored.state_at_last_entry();
        assert_eq!(applied.applied_index(), 3);
        assert!(
            applied.state.settings.paused,
            "the uncommitted entry is applied"
        );
        assert_eq!(refused, 1);
        assert_eq!(stored.last_log_id(), Some(log_id(4, 1, 3)));
        assert_eq!(stored.highest_term(), 5, "the vote's term counts too");
    }

    #[test]
    fn a_log_that_does_not_go_on_from_the_purge_point_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = crate::raft::storage::open(dir.path(), 1).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                let purged = encode("last purged log id", &log_id(1, 1, 2)).unwrap();
                meta.insert(KEY_LAST_PURGED, purged.as_slice()).unwrap();
                let mut log = txn.open_table(LOG).unwrap();
                for i in [5, 6] {
                    let e = encode(
                        "log entry",
                        &entry(1, i, Command::SetPaused { paused: true }),
                    )
                    .unwrap();
                    log.insert(i, e.as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let db = OfflineDb::open_existing(dir.path(), 1).unwrap();
        let err = db.read().unwrap_err().to_string();
        assert!(err.contains("entries 3 to 4 are missing"), "{err}");
    }
}

#[cfg(test)]
mod wal_tests {
    use openraft::EntryPayload;
    use openraft::storage::{IOFlushed, RaftLogStorage};
    use openraft::type_config::TypeConfigExt;

    use super::*;
    use crate::raft::types::{TypeConfig, log_id};
    use crate::raft::{LogStore, storage};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_still_in_the_wal_are_read_and_neither_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = storage::open(dir.path(), 1).unwrap();
            let mut store = LogStore::new(db, dir.path()).unwrap();
            for i in 1..=3 {
                let (tx, rx) = TypeConfig::oneshot();
                let e = Entry {
                    log_id: log_id(1, 1, i),
                    payload: EntryPayload::Blank,
                };
                store.append(vec![e], IOFlushed::signal(tx)).await.unwrap();
                rx.await.unwrap().unwrap();
            }
            store.save_committed(Some(log_id(1, 1, 2))).await.unwrap();
        }
        let files = |d: &Path| [DB_FILE, wal::WAL_FILE].map(|f| std::fs::read(d.join(f)).unwrap());
        let before = files(dir.path());
        let stored = OfflineDb::open_existing(dir.path(), 1)
            .unwrap()
            .read()
            .unwrap();
        let indexes: Vec<u64> = stored.entries.iter().map(RaftEntry::index).collect();
        assert_eq!(indexes, vec![1, 2, 3]);
        assert_eq!(stored.committed, Some(log_id(1, 1, 2)));
        assert!(files(dir.path()) == before, "reading wrote nothing");
    }
}

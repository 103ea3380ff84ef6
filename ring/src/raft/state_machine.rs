//! The state machine: applies committed entries to [`RingState`] and keeps snapshots.
//!
//! The state lives in memory; what makes it durable is the log plus the latest snapshot, both in
//! redb. On start the last snapshot is loaded and openraft re-applies the committed log after it.
//! Snapshots are written with fsync before they are reported built or installed.

use std::io;
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use redb::{Database, Durability, ReadableDatabase};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::codec::{decode, encode};
use super::storage::{KEY_SNAPSHOT_DATA, KEY_SNAPSHOT_META, META, blocking, io as io_err};
use super::types::{
    ApplyResult, Entry, LogId, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::core::{Proposal, RingState};

/// Told about every command the state machine applied successfully, with the state as it is
/// afterwards (the metrics' counters implement it, so `raft` does not depend on `metrics`).
/// Called under the state's write lock: keep it to a few atomic updates.
pub trait ApplyObserver: Send + Sync {
    /// `proposal` was just applied; `state` is the state after it.
    fn applied(&self, state: &RingState, proposal: &Proposal);
}

/// Format version of [`SnapshotBody`].
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Snapshot data is the JSON of a [`SnapshotBody`], gzip-compressed (fastest level): the state
/// of 10,000 control planes is 6 MB of JSON and about a tenth of that compressed, which is
/// what a snapshot costs in memory while it is built (a 6 MB buffer plus an 8 MiB redb region
/// had the leader above 100 MiB for a moment), on disk and on its way to a follower. Data
/// written before (plain JSON, starting with `{`) is still read.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Most bytes a compressed snapshot may expand to (a corrupt or hostile one stops here).
pub const MAX_SNAPSHOT_JSON_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// The applied state: what reads see.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    /// Last log id applied.
    pub last_applied: Option<LogId>,
    /// Last membership applied.
    pub last_membership: StoredMembership,
    /// The ring's state.
    pub state: RingState,
}

impl Applied {
    /// Index of the last applied entry (0 before anything was applied).
    pub fn applied_index(&self) -> u64 {
        self.last_applied.as_ref().map(|id| id.index).unwrap_or(0)
    }
}

/// What a snapshot holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotBody {
    /// [`SNAPSHOT_FORMAT`] at the time of writing.
    pub format: u32,
    /// The applied state at the snapshot point.
    pub applied: Applied,
}

struct StoredSnapshot {
    meta: SnapshotMeta,
    data: SnapshotData,
}

/// The Raft state machine. Cheap to clone: clones share the state (the admin service reads it
/// through [`StateMachineStore::read`]).
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<Database>,
    applied: Arc<RwLock<Applied>>,
    /// The size of the last snapshot's JSON before compression (a hint for the next one's
    /// buffer; 0 until one was built). Its data stays in redb only: only a member that sends
    /// it to a peer reads it again.
    json_len: Arc<Mutex<usize>>,
    applied_index: watch::Sender<u64>,
    observer: Option<Arc<dyn ApplyObserver>>,
}

impl StateMachineStore {
    /// Opens the state machine over a data directory, restoring the latest snapshot if any.
    pub async fn open(db: Arc<Database>) -> io::Result<Self> {
        let stored = blocking(&db, read_stored).await?;
        let applied = match &stored {
            Some(s) => decode_body(&s.meta, &s.data)?,
            None => Applied::default(),
        };
        let (applied_index, _) = watch::channel(applied.applied_index());
        Ok(Self {
            db,
            applied: Arc::new(RwLock::new(applied)),
            json_len: Arc::new(Mutex::new(0)),
            applied_index,
            observer: None,
        })
    }

    /// Tells `observer` about every command applied from now on. Set it before Raft starts,
    /// so that it also sees the log re-applied at start-up.
    pub fn with_observer(mut self, observer: Arc<dyn ApplyObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Runs `f` on the applied state. Keep `f` short: it holds a read lock.
    pub fn read<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        let guard = self.applied.read().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    /// A receiver that sees the applied index advance.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    /// Writes `snapshot` to redb (fsynced) and makes it the current one; gives its data back.
    /// The data moves to the writing thread and back, so it is not copied for the write.
    async fn persist(&self, snapshot: StoredSnapshot) -> io::Result<SnapshotData> {
        let meta_bytes = encode("snapshot meta", &snapshot.meta)?;
        let StoredSnapshot { meta: _, data } = snapshot;
        let data = blocking(&self.db, move |db| {
            let mut txn = db.begin_write().map_err(io_err)?;
            txn.set_durability(Durability::Immediate).map_err(io_err)?;
            {
                let mut t = txn.open_table(META).map_err(io_err)?;
                t.insert(KEY_SNAPSHOT_META, meta_bytes.as_slice())
                    .map_err(io_err)?;
                t.insert(KEY_SNAPSHOT_DATA, data.as_slice())
                    .map_err(io_err)?;
            }
            txn.commit().map_err(io_err)?;
            Ok(data)
        })
        .await?;
        Ok(data)
    }

    /// The current snapshot, read back from redb: metadata and data from one read
    /// transaction, so a snapshot built meanwhile cannot pair one's metadata with the other's
    /// data.
    async fn load_current(&self) -> io::Result<Option<StoredSnapshot>> {
        blocking(&self.db, read_stored).await
    }

    /// The snapshot of the applied state now: its metadata and its data. The JSON is encoded
    /// straight from the state under the read lock (applying waits for it; the state is never
    /// copied, which for a ring of thousands of control planes was tens of MiB at once), then
    /// compressed after the lock is released: compressing under the lock held applies, and a
    /// runtime worker waiting for them, long enough for heartbeats to time out and leadership
    /// to move (measured with 10,000 control planes). Both on a blocking thread.
    /// Returns the metadata, the data and the JSON's length.
    async fn encode_current(
        &self,
        capacity: usize,
    ) -> io::Result<(SnapshotMeta, SnapshotData, usize)> {
        let applied = self.applied.clone();
        tokio::task::spawn_blocking(move || {
            let (meta, json) = {
                let guard = applied.read().unwrap_or_else(|e| e.into_inner());
                let meta = SnapshotMeta {
                    last_log_id: guard.last_applied,
                    last_membership: guard.last_membership.clone(),
                };
                let mut json = Vec::with_capacity(capacity);
                serde_json::to_writer(
                    &mut json,
                    &SnapshotBodyRef {
                        format: SNAPSHOT_FORMAT,
                        applied: &guard,
                    },
                )
                .map_err(|e| io::Error::other(format!("cannot encode the snapshot: {e}")))?;
                (meta, json)
            };
            Ok((meta, compress(&json)?, json.len()))
        })
        .await
        .map_err(|e| io::Error::other(format!("snapshot task failed: {e}")))?
    }
}

/// The snapshot redb holds: metadata and data from one read transaction.
fn read_stored(db: &Database) -> io::Result<Option<StoredSnapshot>> {
    let txn = db.begin_read().map_err(io_err)?;
    let meta = txn.open_table(META).map_err(io_err)?;
    let m = meta.get(KEY_SNAPSHOT_META).map_err(io_err)?;
    let d = meta.get(KEY_SNAPSHOT_DATA).map_err(io_err)?;
    match (m, d) {
        (Some(m), Some(d)) => Ok(Some(StoredSnapshot {
            meta: decode("snapshot meta", m.value())?,
            data: d.value().to_vec(),
        })),
        (None, None) => Ok(None),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "snapshot metadata and data are not both present",
        )),
    }
}

/// [`SnapshotBody`] borrowing the state: encodes exactly like it.
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    format: u32,
    applied: &'a Applied,
}

/// The snapshot data of `applied`: what redb stores, a peer installs and
/// `ringctl snapshot save` writes.
pub fn encode_body(applied: Applied) -> io::Result<SnapshotData> {
    let mut data = Vec::new();
    write_body(
        &mut data,
        &SnapshotBodyRef {
            format: SNAPSHOT_FORMAT,
            applied: &applied,
        },
    )?;
    Ok(data)
}

/// Writes `body` to `out` as snapshot data: JSON through gzip, streamed.
fn write_body(out: &mut Vec<u8>, body: &SnapshotBodyRef<'_>) -> io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
    serde_json::to_writer(&mut gz, body)
        .map_err(|e| io::Error::other(format!("cannot encode the snapshot: {e}")))?;
    gz.finish()?;
    Ok(())
}

/// Snapshot data from the JSON of a snapshot body.
fn compress(json: &[u8]) -> io::Result<SnapshotData> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(json.len() / 8),
        flate2::Compression::fast(),
    );
    gz.write_all(json)?;
    gz.finish()
}

/// Decodes snapshot data (compressed, or plain JSON as written before), checking its format
/// version (not its metadata).
pub fn decode_applied(data: &[u8]) -> io::Result<Applied> {
    let body: SnapshotBody = if data.starts_with(&GZIP_MAGIC) {
        use std::io::Read as _;
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(data)
            .take(MAX_SNAPSHOT_JSON_BYTES + 1)
            .read_to_end(&mut json)
            .map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("snapshot data does not decompress: {e}"),
                )
            })?;
        if json.len() as u64 > MAX_SNAPSHOT_JSON_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("snapshot data expands past {MAX_SNAPSHOT_JSON_BYTES} bytes"),
            ));
        }
        decode("snapshot", &json)?
    } else {
        decode("snapshot", data)?
    };
    if body.format != SNAPSHOT_FORMAT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "snapshot format {} is not supported (this ringd reads {SNAPSHOT_FORMAT})",
                body.format
            ),
        ));
    }
    Ok(body.applied)
}

/// Applies one log entry to `applied`: the single code path of the live state machine and of
/// `ringd recover`, which rebuilds a member's state offline. Refused commands are committed but
/// change nothing; their error is the result.
pub fn apply_entry(applied: &mut Applied, entry: &Entry) -> ApplyResult {
    let index = entry.log_id.index;
    if let Some(last) = &applied.last_applied {
        assert!(
            index > last.index,
            "entry {index} applied after {}: the log went backwards",
            last.index
        );
    }
    applied.last_applied = Some(entry.log_id);
    match &entry.payload {
        EntryPayload::Blank => Ok(()),
        EntryPayload::Normal(proposal) => applied.state.apply(index, proposal),
        EntryPayload::Membership(membership) => {
            applied.last_membership = StoredMembership::new(Some(entry.log_id), membership.clone());
            let voters = membership.voter_ids().collect();
            let learners = membership.learner_ids().collect();
            applied.state.apply_membership(&voters, &learners);
            Ok(())
        }
    }
}

fn decode_body(meta: &SnapshotMeta, data: &[u8]) -> io::Result<Applied> {
    let applied = decode_applied(data)?;
    if applied.last_applied != meta.last_log_id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "snapshot body is at {:?} but its metadata says {:?}",
                applied.last_applied, meta.last_log_id
            ),
        ));
    }
    Ok(applied)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(
        &mut self,
    ) -> io::Result<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>> {
        // Room for a snapshot a little larger than the last one: one allocation, no doubling.
        let capacity = {
            let len = *self.json_len.lock().unwrap_or_else(|e| e.into_inner());
            len + len / 8
        };
        let (meta, data, json_len) = self.encode_current(capacity).await?;
        *self.json_len.lock().unwrap_or_else(|e| e.into_inner()) = json_len;
        let data = self
            .persist(StoredSnapshot {
                meta: meta.clone(),
                data,
            })
            .await?;
        tracing::info!(last_log_id = ?meta.last_log_id, bytes = data.len(), "built snapshot");
        Ok(openraft::alias::SnapshotOf::<TypeConfig, SnapshotData> {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        Ok(self.read(|a| (a.last_applied, a.last_membership.clone())))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id.index;
            let result = {
                let mut applied = self.applied.write().unwrap_or_else(|e| e.into_inner());
                let result = apply_entry(&mut applied, &entry);
                if let EntryPayload::Normal(proposal) = &entry.payload {
                    match &result {
                        Ok(()) => {
                            if let Some(observer) = &self.observer {
                                observer.applied(&applied.state, proposal);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(index, %proposal, error = %e, "command refused")
                        }
                    }
                }
                result
            };
            self.applied_index.send_replace(index);
            if let Some(responder) = responder {
                responder.send(result);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let applied = decode_body(meta, &snapshot)?;
        applied.state.check_invariants();
        drop(
            self.persist(StoredSnapshot {
                meta: meta.clone(),
                data: snapshot,
            })
            .await?,
        );
        let index = applied.applied_index();
        *self.applied.write().unwrap_or_else(|e| e.into_inner()) = applied;
        self.applied_index.send_replace(index);
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>>> {
        let current = self.load_current().await?;
        Ok(current.map(
            |s| openraft::alias::SnapshotOf::<TypeConfig, SnapshotData> {
                meta: s.meta,
                snapshot: s.data,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied() -> Applied {
        let mut applied = Applied::default();
        applied.state.settings.paused = true;
        applied
    }

    #[test]
    fn snapshot_data_is_compressed_and_reads_back() {
        let data = encode_body(applied()).unwrap();
        assert!(data.starts_with(&GZIP_MAGIC), "{:?}", &data[..4]);
        let back = decode_applied(&data).unwrap();
        assert!(back.state.settings.paused);
    }

    #[test]
    fn plain_json_snapshot_data_written_before_still_reads() {
        let plain = encode(
            "snapshot",
            &SnapshotBody {
                format: SNAPSHOT_FORMAT,
                applied: applied(),
            },
        )
        .unwrap();
        assert_eq!(plain[0], b'{');
        assert!(decode_applied(&plain).unwrap().state.settings.paused);
    }

    #[test]
    fn truncated_or_corrupt_compressed_data_is_a_clear_error() {
        let data = encode_body(applied()).unwrap();
        let err = decode_applied(&data[..data.len() / 2]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("does not decompress"), "{err}");
        let mut flipped = data.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0xff;
        let err = decode_applied(&flipped).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}

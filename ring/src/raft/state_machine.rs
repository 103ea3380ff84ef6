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
use super::types::{LogId, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::core::RingState;

/// Format version of [`SnapshotBody`].
const SNAPSHOT_FORMAT: u32 = 1;

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

#[derive(Clone)]
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
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    applied_index: watch::Sender<u64>,
    counters: Arc<crate::metrics::Counters>,
}

impl StateMachineStore {
    /// Opens the state machine over a data directory, restoring the latest snapshot if any.
    pub async fn open(db: Arc<Database>) -> io::Result<Self> {
        let stored = blocking(&db, |db| {
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
        })
        .await?;
        let applied = match &stored {
            Some(s) => decode_body(&s.meta, &s.data)?,
            None => Applied::default(),
        };
        let (applied_index, _) = watch::channel(applied.applied_index());
        Ok(Self {
            db,
            applied: Arc::new(RwLock::new(applied)),
            snapshot: Arc::new(Mutex::new(stored)),
            applied_index,
            counters: Arc::default(),
        })
    }

    /// Runs `f` on the applied state. Keep `f` short: it holds a read lock.
    pub fn read<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        let guard = self.applied.read().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    /// The counters fed with every applied command (for `/metrics`).
    pub fn counters(&self) -> Arc<crate::metrics::Counters> {
        self.counters.clone()
    }

    /// A receiver that sees the applied index advance.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    async fn persist(&self, snapshot: StoredSnapshot) -> io::Result<()> {
        let meta = encode("snapshot meta", &snapshot.meta)?;
        let data = snapshot.data.clone();
        blocking(&self.db, move |db| {
            let mut txn = db.begin_write().map_err(io_err)?;
            txn.set_durability(Durability::Immediate).map_err(io_err)?;
            {
                let mut t = txn.open_table(META).map_err(io_err)?;
                t.insert(KEY_SNAPSHOT_META, meta.as_slice())
                    .map_err(io_err)?;
                t.insert(KEY_SNAPSHOT_DATA, data.as_slice())
                    .map_err(io_err)?;
            }
            txn.commit().map_err(io_err)
        })
        .await?;
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
        Ok(())
    }
}

fn decode_body(meta: &SnapshotMeta, data: &[u8]) -> io::Result<Applied> {
    let body: SnapshotBody = decode("snapshot", data)?;
    if body.format != SNAPSHOT_FORMAT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "snapshot format {} is not supported (this ringd reads {SNAPSHOT_FORMAT})",
                body.format
            ),
        ));
    }
    if body.applied.last_applied != meta.last_log_id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "snapshot body is at {:?} but its metadata says {:?}",
                body.applied.last_applied, meta.last_log_id
            ),
        ));
    }
    Ok(body.applied)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(
        &mut self,
    ) -> io::Result<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>> {
        let applied = self.read(Clone::clone);
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.last_membership.clone(),
        };
        let data = encode(
            "snapshot",
            &SnapshotBody {
                format: SNAPSHOT_FORMAT,
                applied,
            },
        )?;
        self.persist(StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
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
                    EntryPayload::Normal(proposal) => {
                        let result = applied.state.apply(index, proposal);
                        match &result {
                            Ok(()) => self.counters.applied(&applied.state, proposal),
                            Err(e) => {
                                tracing::debug!(index, %proposal, error = %e, "command refused")
                            }
                        }
                        result
                    }
                    EntryPayload::Membership(membership) => {
                        applied.last_membership =
                            StoredMembership::new(Some(entry.log_id), membership.clone());
                        let voters = membership.voter_ids().collect();
                        let learners = membership.learner_ids().collect();
                        applied.state.apply_membership(&voters, &learners);
                        Ok(())
                    }
                }
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
        self.persist(StoredSnapshot {
            meta: meta.clone(),
            data: snapshot,
        })
        .await?;
        let index = applied.applied_index();
        *self.applied.write().unwrap_or_else(|e| e.into_inner()) = applied;
        self.applied_index.send_replace(index);
        tracing::info!(last_log_id = ?meta.last_log_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<openraft::alias::SnapshotOf<TypeConfig, SnapshotData>>> {
        let current = self
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(current.map(
            |s| openraft::alias::SnapshotOf::<TypeConfig, SnapshotData> {
                meta: s.meta,
                snapshot: s.data,
            },
        ))
    }
}

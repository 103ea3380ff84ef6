//! The data directory: one redb file, `ring.redb`, holding the Raft log, the vote, the committed
//! index and the latest state-machine snapshot, plus the identity of the member it belongs to.
//!
//! redb commits with `Durability::Immediate` fsync before they return; the log store relies on
//! that to acknowledge nothing that is not on disk. redb also locks the file, so two `ringd`
//! processes can never share a data directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::NodeId;
use super::codec::CODEC_VERSION;

/// Log entries by index.
pub(crate) const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
/// Small records by name (see the `KEY_*` constants).
pub(crate) const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

pub(crate) const KEY_NODE_ID: &str = "node_id";
pub(crate) const KEY_CODEC: &str = "codec";
pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_LAST_PURGED: &str = "last_purged";
pub(crate) const KEY_SNAPSHOT_META: &str = "snapshot_meta";
pub(crate) const KEY_SNAPSHOT_DATA: &str = "snapshot_data";
/// The write-ahead file holding the newest log entries: its id and generation (see
/// [`super::wal`]).
pub(crate) const KEY_WAL: &str = "wal";

/// redb's page cache (reads and the write buffer). redb's default is 1 GiB, which it fills
/// with every log page it ever wrote or read; ringd keeps its state in memory and reads the
/// log back only to replicate and re-apply it, so a few MiB serve as well and keep ringd's
/// memory flat as the log grows.
pub const REDB_CACHE_BYTES: usize = 8 * 1024 * 1024;

/// Name of the database file inside the data directory.
pub const DB_FILE: &str = "ring.redb";

/// Why a data directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The directory does not exist and cannot be created, or is not writable.
    #[error("data directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// There is no ring in the directory (offline tools need one).
    #[error("no ring in data directory {0}: it has no {DB_FILE}")]
    NoRing(PathBuf),
    /// Another process has the database open.
    #[error("data directory {0} is in use by another process (is another ringd running with it?)")]
    InUse(PathBuf),
    /// The database file could not be opened or is corrupt.
    #[error("cannot open {path}: {message}")]
    Database {
        /// The file.
        path: PathBuf,
        /// What redb said.
        message: String,
    },
    /// The data directory belongs to another member.
    #[error(
        "data directory {path} belongs to member id {found}, but this member is configured as id {expected}; \
         use the right data directory, or an empty one for a new member"
    )]
    WrongMember {
        /// The directory.
        path: PathBuf,
        /// Id recorded in the directory.
        found: NodeId,
        /// Id from the configuration.
        expected: NodeId,
    },
    /// The data was written with an encoding this binary does not read.
    #[error(
        "{path} uses storage encoding {found} (ring version {found}); this ringd (release {}) reads encodings {}",
        env!("CARGO_PKG_VERSION"),
        super::codec::readable()
    )]
    Codec {
        /// The file.
        path: PathBuf,
        /// Encoding found.
        found: u32,
    },
}

/// Opens (or creates) the data directory of member `id`.
pub fn open(dir: &Path, id: NodeId) -> Result<Arc<Database>, OpenError> {
    let dir_err = |source| OpenError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(dir_err)?;
    let probe = dir.join(".ringd-write-test");
    std::fs::write(&probe, b"ok").map_err(dir_err)?;
    std::fs::remove_file(&probe).map_err(dir_err)?;

    let path = dir.join(DB_FILE);
    let db_err = |e: &dyn std::fmt::Display| OpenError::Database {
        path: path.clone(),
        message: e.to_string(),
    };
    let db = match redb::Builder::new()
        .set_cache_size(REDB_CACHE_BYTES)
        .create(&path)
    {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(OpenError::InUse(dir.into())),
        Err(e) => return Err(db_err(&e)),
    };

    let txn = db.begin_write().map_err(|e| db_err(&e))?;
    {
        txn.open_table(LOG).map_err(|e| db_err(&e))?;
        let mut meta = txn.open_table(META).map_err(|e| db_err(&e))?;
        let recorded = meta
            .get(KEY_NODE_ID)
            .map_err(|e| db_err(&e))?
            .map(|v| decode_u64(v.value()));
        match recorded {
            Some(Some(found)) if found != id => {
                return Err(OpenError::WrongMember {
                    path: dir.into(),
                    found,
                    expected: id,
                });
            }
            Some(Some(_)) => {}
            Some(None) => return Err(db_err(&"the recorded member id is corrupt")),
            None => {
                meta.insert(KEY_NODE_ID, id.to_be_bytes().as_slice())
                    .map_err(|e| db_err(&e))?;
                meta.insert(KEY_CODEC, CODEC_VERSION.to_be_bytes().as_slice())
                    .map_err(|e| db_err(&e))?;
            }
        }
        let codec = meta
            .get(KEY_CODEC)
            .map_err(|e| db_err(&e))?
            .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
            .map(u32::from_be_bytes);
        if !codec.is_some_and(super::codec::reads) {
            return Err(OpenError::Codec {
                path: path.clone(),
                found: codec.unwrap_or(0),
            });
        }
    }
    txn.commit().map_err(|e| db_err(&e))?;
    Ok(Arc::new(db))
}

/// Records in the data directory that it holds data of ring version `codec` (see
/// [`super::codec`]): an older binary then refuses to open it. Never lowers it.
pub fn record_codec(db: &Database, codec: u32) -> Result<(), OpenError> {
    let db_err = |e: &dyn std::fmt::Display| OpenError::Database {
        path: PathBuf::from(DB_FILE),
        message: e.to_string(),
    };
    let txn = db.begin_write().map_err(|e| db_err(&e))?;
    {
        let mut meta = txn.open_table(META).map_err(|e| db_err(&e))?;
        let recorded = meta
            .get(KEY_CODEC)
            .map_err(|e| db_err(&e))?
            .and_then(|v| <[u8; 4]>::try_from(v.value()).ok())
            .map(u32::from_be_bytes);
        if recorded.is_some_and(|r| r >= codec) {
            return Ok(());
        }
        meta.insert(KEY_CODEC, codec.to_be_bytes().as_slice())
            .map_err(|e| db_err(&e))?;
    }
    txn.commit().map_err(|e| db_err(&e))?;
    Ok(())
}

/// Reads the member id recorded in a data directory, if it has one (without opening it for
/// writing; fails if another process holds it).
pub fn recorded_member_id(dir: &Path) -> Result<Option<NodeId>, OpenError> {
    let path = dir.join(DB_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let db_err = |e: &dyn std::fmt::Display| OpenError::Database {
        path: path.clone(),
        message: e.to_string(),
    };
    let db = match Database::open(&path) {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(OpenError::InUse(dir.into())),
        Err(e) => return Err(db_err(&e)),
    };
    let txn = db.begin_read().map_err(|e| db_err(&e))?;
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(db_err(&e)),
    };
    let id = meta
        .get(KEY_NODE_ID)
        .map_err(|e| db_err(&e))?
        .and_then(|v| decode_u64(v.value()));
    Ok(id)
}

fn decode_u64(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

/// Runs blocking database work off the async runtime.
pub(crate) async fn blocking<T, F>(db: &Arc<Database>, f: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Database) -> std::io::Result<T> + Send + 'static,
{
    let db = db.clone();
    tokio::task::spawn_blocking(move || f(&db))
        .await
        .map_err(|e| std::io::Error::other(format!("storage task failed: {e}")))?
}

/// Converts any redb error into an I/O error for openraft.
pub(crate) fn io<E: std::fmt::Display>(e: E) -> std::io::Error {
    std::io::Error::other(format!("storage: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), 7).unwrap());
        assert_eq!(recorded_member_id(dir.path()).unwrap(), Some(7));
        let err = open(dir.path(), 8).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::WrongMember {
                    found: 7,
                    expected: 8,
                    ..
                }
            ),
            "{err}"
        );
        let held = open(dir.path(), 7).unwrap();
        let err = open(dir.path(), 7).unwrap_err();
        assert!(matches!(err, OpenError::InUse(_)), "{err}");
        drop(held);
    }

    #[test]
    fn corrupt_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DB_FILE), b"definitely not a redb file").unwrap();
        let err = open(dir.path(), 1).unwrap_err();
        assert!(matches!(err, OpenError::Database { .. }), "{err}");
        assert!(err.to_string().contains(DB_FILE), "{err}");
    }
}

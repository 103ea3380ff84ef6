//! Migration markers: small objects in the source and destination backup locations that say
//! who owns a control plane's backups, at which epoch (GEP-7's "header files"; DESIGN.md rule
//! 4).
//!
//! A migration writes the same [`Marker`] into both locations before it copies anything, and
//! marks it done in both when the copy is complete. Every writer of snapshots reads the marker
//! of its location first ([`Marker::ownership`]) and stops when it lost ownership: a host fenced
//! away, or one that comes back after its zone was lost, finds the marker naming a later epoch
//! and uploads nothing more. The Raft state decides who may serve; the marker carries that
//! decision into the bucket, where a member cut off from the ring can still read it.
//!
//! The marker lives at `<prefix>/garden-ring/migration.json`, outside the `v2/` directory
//! etcd-backup-restore lists, so `etcdbrctl` never sees it.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

/// The marker's object name under the prefix.
pub const MARKER_NAME: &str = "garden-ring/migration.json";
/// Largest marker read, in bytes (a marker is a few hundred).
pub const MAX_MARKER_BYTES: usize = 64 * 1024;
/// The marker format this code writes and reads.
pub const MARKER_FORMAT: u32 = 1;

/// Where a migration stands, as recorded in the markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkerState {
    /// Written before the copy: the source may no longer write.
    Migrating,
    /// The copy is complete.
    Done,
}

/// One migration of a control plane's backups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    /// [`MARKER_FORMAT`].
    pub format: u32,
    /// The control plane.
    pub control_plane: String,
    /// The epoch of the move: the destination's epoch.
    pub epoch: u64,
    /// The member the control plane moved from (none when it had no host).
    pub from: Option<String>,
    /// The member it moved to.
    pub to: String,
    /// The source location (URL, no secrets).
    pub source: String,
    /// The destination location (URL, no secrets).
    pub destination: String,
    /// Where the migration stands.
    pub state: MarkerState,
    /// When it started, Unix ms.
    pub started_unix_ms: u64,
    /// When the copy completed, Unix ms.
    #[serde(default)]
    pub done_unix_ms: Option<u64>,
}

/// What a would-be writer of snapshots may do, given the marker of its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// It owns the backups: it may write.
    Owner,
    /// A migration took them away: it must not write any more.
    Lost {
        /// The member that owns them now.
        to: String,
        /// At this epoch.
        epoch: u64,
    },
}

impl Marker {
    /// Whether `member`, serving the control plane at `epoch`, may write snapshots to a
    /// location whose marker is `marker`.
    ///
    /// - no marker: nobody migrated these backups; the host writes.
    /// - a marker of a later epoch: lost, whoever asks.
    /// - a marker of this epoch: the destination owns them; anyone else lost them.
    /// - a marker of an earlier epoch: stale (a later move came back here); the host owns.
    pub fn ownership(marker: Option<&Marker>, member: &str, epoch: u64) -> Ownership {
        let Some(m) = marker else {
            return Ownership::Owner;
        };
        let lost = Ownership::Lost {
            to: m.to.clone(),
            epoch: m.epoch,
        };
        match m.epoch.cmp(&epoch) {
            std::cmp::Ordering::Greater => lost,
            std::cmp::Ordering::Equal if m.to == member => Ownership::Owner,
            std::cmp::Ordering::Equal => lost,
            std::cmp::Ordering::Less => Ownership::Owner,
        }
    }
}

/// Why a marker could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    /// The store failed (may be temporary).
    #[error("migration marker {path}: {source}")]
    Store {
        /// The marker's path.
        path: String,
        /// What the store said.
        source: object_store::Error,
    },
    /// The marker is larger than [`MAX_MARKER_BYTES`].
    #[error("migration marker {path} is {bytes} bytes; at most {MAX_MARKER_BYTES} are read")]
    TooLarge {
        /// The marker's path.
        path: String,
        /// Its size.
        bytes: usize,
    },
    /// The marker does not decode: nobody can tell who owns the backups, so nobody writes.
    #[error(
        "migration marker {path} is corrupt ({why}); no snapshot is written until it is repaired"
    )]
    Corrupt {
        /// The marker's path.
        path: String,
        /// The decoder's complaint.
        why: String,
    },
}

impl MarkerError {
    /// Whether trying again may help (the store's answer, classified like every other store
    /// error: [`super::location::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store { source, .. } => super::location::is_retryable(source),
            Self::TooLarge { .. } | Self::Corrupt { .. } => false,
        }
    }
}

/// The marker's path under `prefix`.
pub fn marker_path(prefix: &Path) -> Path {
    let mut path = prefix.clone();
    for part in MARKER_NAME.split('/') {
        path = path.join(part);
    }
    path
}

/// Reads the marker under `prefix`; `None` when there is none.
pub async fn read(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Option<Marker>, MarkerError> {
    let path = marker_path(prefix);
    let got = match store.get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(source) => {
            return Err(MarkerError::Store {
                path: path.to_string(),
                source,
            });
        }
    };
    let size = usize::try_from(got.meta.size).unwrap_or(usize::MAX);
    if size > MAX_MARKER_BYTES {
        return Err(MarkerError::TooLarge {
            path: path.to_string(),
            bytes: size,
        });
    }
    let bytes = got.bytes().await.map_err(|source| MarkerError::Store {
        path: path.to_string(),
        source,
    })?;
    decode(&path, &bytes).map(Some)
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Marker, MarkerError> {
    let corrupt = |why: String| MarkerError::Corrupt {
        path: path.to_string(),
        why,
    };
    let marker: Marker = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if marker.format != MARKER_FORMAT {
        return Err(corrupt(format!(
            "format {} is not {MARKER_FORMAT}",
            marker.format
        )));
    }
    Ok(marker)
}

/// Writes `marker` under `prefix` (one atomic put; it replaces an older one).
pub async fn write(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
    marker: &Marker,
) -> Result<(), MarkerError> {
    let path = marker_path(prefix);
    let bytes = serde_json::to_vec_pretty(marker).expect("a marker serializes");
    store
        .put(&path, PutPayload::from(bytes))
        .await
        .map(|_| ())
        .map_err(|source| MarkerError::Store {
            path: path.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;

    use super::*;

    fn marker(epoch: u64, from: &str, to: &str) -> Marker {
        Marker {
            format: MARKER_FORMAT,
            control_plane: "x".into(),
            epoch,
            from: Some(from.into()),
            to: to.into(),
            source: "s3://a/x".into(),
            destination: "s3://b/x".into(),
            state: MarkerState::Migrating,
            started_unix_ms: 1,
            done_unix_ms: None,
        }
    }

    #[test]
    fn ownership_follows_the_epoch() {
        use Ownership::*;
        let m = marker(5, "a", "b");
        assert_eq!(Marker::ownership(None, "a", 1), Owner);
        assert_eq!(Marker::ownership(Some(&m), "b", 5), Owner);
        let lost = Lost {
            to: "b".into(),
            epoch: 5,
        };
        assert_eq!(Marker::ownership(Some(&m), "a", 4), lost, "the source");
        assert_eq!(
            Marker::ownership(Some(&m), "a", 5),
            lost,
            "not the destination"
        );
        assert_eq!(Marker::ownership(Some(&m), "c", 3), lost, "an older host");
        assert_eq!(
            Marker::ownership(Some(&m), "a", 6),
            Owner,
            "a later move back"
        );
    }

    #[tokio::test]
    async fn markers_round_trip_and_absence_is_none() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("bucket-prefix/x");
        assert!(read(&store, &prefix).await.unwrap().is_none());
        let m = marker(2, "a", "b");
        write(&store, &prefix, &m).await.unwrap();
        assert_eq!(read(&store, &prefix).await.unwrap(), Some(m));
        assert_eq!(
            marker_path(&prefix).to_string(),
            "bucket-prefix/x/garden-ring/migration.json"
        );
    }

    #[tokio::test]
    async fn corrupt_or_huge_markers_stop_writers() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let prefix = Path::from("p");
        store
            .put(
                &marker_path(&prefix),
                PutPayload::from_static(b"{\"format\":1"),
            )
            .await
            .unwrap();
        let err = read(&store, &prefix).await.unwrap_err();
        assert!(matches!(err, MarkerError::Corrupt { .. }), "{err}");
        assert!(!err.is_retryable());
        assert!(
            err.to_string().contains("p/garden-ring/migration.json"),
            "{err}"
        );
        let mut future = serde_json::to_value(marker(1, "a", "b")).unwrap();
        future["format"] = 9.into();
        store
            .put(
                &marker_path(&prefix),
                PutPayload::from(serde_json::to_vec(&future).unwrap()),
            )
            .await
            .unwrap();
        let err = read(&store, &prefix).await.unwrap_err();
        assert!(err.to_string().contains("format 9"), "{err}");
        store
            .put(
                &marker_path(&prefix),
                PutPayload::from(vec![b' '; MAX_MARKER_BYTES + 1]),
            )
            .await
            .unwrap();
        let err = read(&store, &prefix).await.unwrap_err();
        assert!(matches!(err, MarkerError::TooLarge { .. }), "{err}");
    }
}

//! Taking a full etcd snapshot into an object store, named as etcd-backup-restore names it.
//!
//! [`take_full_snapshot`] opens etcd's `Maintenance.Snapshot` stream and pipes it into a
//! multipart upload ([`WriteMultipart`]) at
//! `<prefix>/v2/Full-00000000-<lastRevision %08d>-<unix s>[.gz][.final]`
//! ([`crate::core::backup_name`]). On the way it checks the stream's sha256 trailer
//! ([`SnapshotHasher`]) and, when asked, gzips the bytes (the trailer stays inside, as
//! `etcdbrctl` stores it). The upload is completed only when the trailer verified; on any error
//! it is aborted, so the store never holds a bad or partial snapshot under a snapshot name.
//! (Dropping the future mid-way drops the upload unfinished: S3 keeps the parts invisible until
//! a lifecycle rule removes them, the local file system deletes its staging file.)
//!
//! **The revision in the name.** etcd 3.4 sends no header with the snapshot stream, so, like
//! etcd-backup-restore (which asks `Get("", WithLastRev())` first), the revision is read just
//! before the snapshot is opened: the snapshot holds at least everything up to it (it may hold
//! a few later writes; a delta snapshot starting at the next revision replays them
//! idempotently). When the server fills the first message's header (etcd 3.6: "the first
//! header in the snapshot stream indicates the point in time of the snapshot"), that exact
//! revision is used instead; [`TakenSnapshot::revision_source`] says which.
//!
//! Limits: at most [`MAX_SNAPSHOT_BYTES`] of snapshot; memory is bounded by
//! [`PART_SIZE_BYTES`] × ([`MAX_PARTS_IN_FLIGHT`] + 1) plus one 32 KiB chunk from etcd.
//!
//! Ownership (DESIGN.md rule 4: stop uploading once migrated away) is checked by the caller,
//! before it starts and again between [`stage_full_snapshot`] and [`StagedSnapshot::complete`].

use std::io::Write;
use std::sync::Arc;

use sha2::Digest as _;

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

use super::checksum::{ChecksumError, MAX_SNAPSHOT_BYTES, SnapshotHasher};
use super::etcd::{EtcdClient, EtcdError};
use crate::core::backup_name::{
    BackupNameError, BackupPrefix, Compression, SnapshotKind, SnapshotName, SnapshotPath,
};

/// Size of one multipart part, in bytes (S3 wants at least 5 MiB for all but the last).
pub const PART_SIZE_BYTES: usize = 8 * 1024 * 1024;
/// Most parts uploading at once.
pub const MAX_PARTS_IN_FLIGHT: usize = 4;

/// Where the snapshot's revision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevisionSource {
    /// The first message's header (exact).
    StreamHeader,
    /// `Status` just before the snapshot was opened (a lower bound).
    StatusBefore,
    /// The last event of a delta snapshot (exact).
    Events,
}

/// A snapshot now stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenSnapshot {
    /// Its key, parsed.
    pub path: SnapshotPath,
    /// Its key in the store.
    pub location: StorePath,
    /// The last revision it holds (the one in its name).
    pub revision: u64,
    /// Where that revision came from.
    pub revision_source: RevisionSource,
    /// The sha256 of etcd's database (the trailer), hex.
    pub sha256: String,
    /// etcd's snapshot size (database and trailer), in bytes.
    pub snapshot_size_bytes: u64,
    /// The stored object's size (smaller when gzipped), in bytes.
    pub stored_size_bytes: u64,
}

/// Why a snapshot was not stored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Talking to etcd failed.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// etcd's stream did not verify (nothing was stored).
    #[error("snapshot for {location} did not verify, upload aborted: {source}")]
    Checksum {
        /// The key it would have had.
        location: String,
        /// Why.
        source: ChecksumError,
    },
    /// The object store failed (the upload was aborted).
    #[error("object store failed to {what} {location}: {source}")]
    Store {
        /// The key.
        location: String,
        /// What was being done.
        what: &'static str,
        /// The store's error.
        source: object_store::Error,
    },
    /// The name cannot be built (a bad prefix, a revision out of range).
    #[error("cannot name the snapshot: {0}")]
    Name(#[from] BackupNameError),
    /// Compressing failed.
    #[error("cannot gzip the snapshot: {0}")]
    Compress(String),
}

impl SnapshotError {
    /// Whether taking the snapshot again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            SnapshotError::Etcd(e) => e.is_retryable(),
            // A new snapshot is a new stream: a transfer error does not repeat.
            SnapshotError::Checksum { source, .. } => {
                !matches!(source, ChecksumError::TooLarge { .. })
            }
            SnapshotError::Store { source, .. } => super::location::is_retryable(source),
            SnapshotError::Name(_) | SnapshotError::Compress(_) => false,
        }
    }
}

/// The key of a snapshot named `name` under `prefix`.
pub fn snapshot_location(
    prefix: &StorePath,
    name: SnapshotName,
) -> Result<(SnapshotPath, StorePath), BackupNameError> {
    let path = SnapshotPath::new(BackupPrefix::new(prefix.as_ref())?, name)?;
    // The name and a checked prefix hold nothing Path would encode.
    let location = StorePath::from_iter(
        prefix
            .parts()
            .chain([crate::core::backup_name::LAYOUT_V2.into()])
            .chain([name.to_string().into()]),
    );
    Ok((path, location))
}

/// Takes a full snapshot of the etcd behind `client` and stores it under `prefix`, named with
/// `now_unix_s`, marked `.final` when `final_`, gzipped (`.gz`) when `compress`. See the
/// [module docs](self).
pub async fn take_full_snapshot(
    client: &EtcdClient,
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    now_unix_s: u64,
    final_: bool,
    compress: bool,
) -> Result<TakenSnapshot, SnapshotError> {
    stage_full_snapshot(client, store, prefix, now_unix_s, final_, compress)
        .await?
        .complete()
        .await
}

/// A snapshot streamed from etcd, verified and uploaded but for its last part, and not yet
/// visible under its name. [`StagedSnapshot::complete`] makes it visible;
/// [`StagedSnapshot::abort`] leaves nothing under its name.
///
/// The split is there for the caller's last check before anything becomes visible: a member
/// frozen mid-upload (SIGSTOP, a paused VM) may wake up after its lease ran out and another
/// member took the location over (DESIGN.md rule 4).
pub struct StagedSnapshot {
    writer: WriteMultipart,
    taken: TakenSnapshot,
}

impl std::fmt::Debug for StagedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedSnapshot")
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

impl StagedSnapshot {
    /// What the snapshot will be once completed.
    pub fn snapshot(&self) -> &TakenSnapshot {
        &self.taken
    }

    /// Uploads the last part and completes the upload: the snapshot is visible from here on.
    pub async fn complete(self) -> Result<TakenSnapshot, SnapshotError> {
        // `finish` aborts the upload itself when completing fails.
        let failed = store_error(&self.taken.location, "complete the upload of");
        self.writer.finish().await.map_err(failed)?;
        Ok(self.taken)
    }

    /// Aborts the upload: nothing becomes visible under the snapshot's name.
    pub async fn abort(self) -> Result<(), SnapshotError> {
        let failed = store_error(&self.taken.location, "abort the upload of");
        self.writer.abort().await.map_err(failed)
    }
}

/// Turns the store's error while doing `what` to `location` into a [`SnapshotError`].
fn store_error(
    location: &StorePath,
    what: &'static str,
) -> impl FnOnce(object_store::Error) -> SnapshotError + use<> {
    let location = location.to_string();
    move |source| SnapshotError::Store {
        location,
        what,
        source,
    }
}

/// [`take_full_snapshot`] but for the completion: see [`StagedSnapshot`].
pub async fn stage_full_snapshot(
    client: &EtcdClient,
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    now_unix_s: u64,
    final_: bool,
    compress: bool,
) -> Result<StagedSnapshot, SnapshotError> {
    // Fail on a bad prefix before asking etcd for anything.
    BackupPrefix::new(prefix.as_ref())?;
    let status_revision = client.revision().await?;
    let mut stream = client.snapshot_stream().await?;
    let first = stream
        .next_chunk()
        .await?
        .ok_or_else(|| EtcdError::Protocol {
            endpoint: client.endpoint().to_string(),
            what: "Snapshot",
            why: "the stream ended before any data".into(),
        })?;
    let (revision, revision_source) = match first.header_revision {
        Some(r) => (r, RevisionSource::StreamHeader),
        None => (status_revision, RevisionSource::StatusBefore),
    };
    let name = SnapshotName::new(SnapshotKind::Full, 0, revision, now_unix_s)?
        .with_compression(compress.then_some(Compression::Gzip))
        .with_final(final_);
    let (path, location) = snapshot_location(prefix, name)?;

    let upload = store
        .put_multipart(&location)
        .await
        .map_err(store_error(&location, "start uploading"))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
    let mut encoder = compress.then(|| {
        flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::new(super::checksum::GZIP_LEVEL),
        )
    });
    let mut hasher = SnapshotHasher::with_max_bytes(MAX_SNAPSHOT_BYTES);
    let mut stored_size_bytes = 0u64;

    let result: Result<(), SnapshotError> = async {
        let mut next = Some(first);
        while let Some(chunk) = next {
            hasher
                .update(&chunk.blob)
                .map_err(|source| SnapshotError::Checksum {
                    location: location.to_string(),
                    source,
                })?;
            writer
                .wait_for_capacity(MAX_PARTS_IN_FLIGHT)
                .await
                .map_err(store_error(&location, "upload a part of"))?;
            match encoder.as_mut() {
                Some(encoder) => {
                    encoder
                        .write_all(&chunk.blob)
                        .map_err(|e| SnapshotError::Compress(e.to_string()))?;
                    let out = std::mem::take(encoder.get_mut());
                    stored_size_bytes += out.len() as u64;
                    writer.put(out.into());
                }
                None => {
                    stored_size_bytes += chunk.blob.len() as u64;
                    writer.put(chunk.blob);
                }
            }
            next = stream.next_chunk().await?;
        }
        Ok(())
    }
    .await;
    let verified = result.and_then(|()| {
        hasher
            .clone()
            .finish()
            .map_err(|source| SnapshotError::Checksum {
                location: location.to_string(),
                source,
            })
    });
    let verified = match verified.and_then(|v| {
        if let Some(encoder) = encoder.take() {
            let rest = encoder
                .finish()
                .map_err(|e| SnapshotError::Compress(e.to_string()))?;
            stored_size_bytes += rest.len() as u64;
            writer.put(rest.into());
        }
        Ok(v)
    }) {
        Ok(v) => v,
        Err(e) => {
            // Best effort: the error that stopped us matters more than a failed clean-up.
            if let Err(abort) = writer.abort().await {
                tracing::warn!(%location, error = %abort, "aborting a failed snapshot upload failed");
            }
            return Err(e);
        }
    };
    Ok(StagedSnapshot {
        writer,
        taken: TakenSnapshot {
            path,
            location,
            revision,
            revision_source,
            sha256: verified.sha256,
            snapshot_size_bytes: verified.size_bytes,
            stored_size_bytes,
        },
    })
}

/// Encodes `events` as a delta snapshot (etcd-backup-restore's format, [`super::delta`]) named
/// `Incr-<start_revision>-<last event's revision>-<now_unix_s>[.gz][.final]` and uploads it but
/// for its completion ([`StagedSnapshot`]: the caller checks ownership before completing).
/// `start_revision` is the revision after the previous snapshot's last one; the events must be
/// in revision order, at or after it.
pub async fn stage_delta_snapshot(
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    start_revision: u64,
    events: &[super::delta::DeltaEvent],
    now_unix_s: u64,
    final_: bool,
    compress: bool,
) -> Result<StagedSnapshot, SnapshotError> {
    BackupPrefix::new(prefix.as_ref())?;
    let last = events
        .last()
        .map(|e| e.revision())
        .and_then(|r| u64::try_from(r).ok())
        .ok_or_else(|| {
            SnapshotError::Compress("a delta snapshot needs at least one event".into())
        })?;
    assert!(
        events
            .first()
            .is_some_and(|e| e.revision() as u64 >= start_revision),
        "delta events start at or after the delta's start revision"
    );
    let name = SnapshotName::new(SnapshotKind::Incr, start_revision, last, now_unix_s)?
        .with_compression(compress.then_some(Compression::Gzip))
        .with_final(final_);
    let (path, location) = snapshot_location(prefix, name)?;
    // Serializing, hashing and compressing a delta of tens of MiB takes a CPU for a while
    // (seconds in a debug build): on a blocking thread, so that the runtime goes on renewing
    // leases and forwarding deadlines meanwhile (a 24 MiB burst fenced a loopback host).
    let events = events.to_vec();
    let compression = name.compression();
    let (sha256, snapshot_size_bytes, bytes) = tokio::task::spawn_blocking(move || {
        let json = super::delta::to_json(&events);
        let sha256 = super::checksum::hex(&sha2::Sha256::digest(&json));
        let snapshot_size_bytes = json.len() as u64 + super::checksum::SHA256_LEN as u64;
        super::delta::encode_json(json, compression)
            .map(|bytes| (sha256, snapshot_size_bytes, bytes))
    })
    .await
    .map_err(|e| SnapshotError::Compress(format!("encoding task: {e}")))?
    .map_err(|e| SnapshotError::Compress(e.to_string()))?;
    let stored_size_bytes = bytes.len() as u64;
    let upload = store
        .put_multipart(&location)
        .await
        .map_err(store_error(&location, "start uploading"))?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
    writer.put(bytes.into());
    Ok(StagedSnapshot {
        writer,
        taken: TakenSnapshot {
            path,
            location,
            revision: last,
            revision_source: RevisionSource::Events,
            sha256,
            snapshot_size_bytes,
            stored_size_bytes,
        },
    })
}

/// [`take_full_snapshot`] marked `.final`: the last snapshot before etcd stops (fencing, a
/// planned handover).
pub async fn take_final_snapshot(
    client: &EtcdClient,
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    now_unix_s: u64,
    compress: bool,
) -> Result<TakenSnapshot, SnapshotError> {
    take_full_snapshot(client, store, prefix, now_unix_s, true, compress).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_follow_the_v2_layout() {
        let name = SnapshotName::new(SnapshotKind::Full, 0, 1234, 1_700_000_000)
            .unwrap()
            .with_compression(Some(Compression::Gzip))
            .with_final(true);
        let (path, location) =
            snapshot_location(&StorePath::from("shoot--a/etcd-main"), name).unwrap();
        assert_eq!(
            location.as_ref(),
            "shoot--a/etcd-main/v2/Full-00000000-00001234-1700000000.gz.final"
        );
        assert_eq!(path.to_string(), location.as_ref());
        assert_eq!(SnapshotPath::parse(location.as_ref()).unwrap(), path);

        let (_, bare) = snapshot_location(&StorePath::default(), name).unwrap();
        assert_eq!(
            bare.as_ref(),
            "v2/Full-00000000-00001234-1700000000.gz.final"
        );
    }

    #[test]
    fn store_errors_are_sorted() {
        let generic = object_store::Error::Generic {
            store: "S3",
            source: "503".into(),
        };
        assert!(crate::backup::location::is_retryable(&generic));
        let denied = object_store::Error::PermissionDenied {
            path: "p".into(),
            source: "403".into(),
        };
        assert!(!crate::backup::location::is_retryable(&denied));
    }
}

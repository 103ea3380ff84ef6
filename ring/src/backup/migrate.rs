//! Moving a control plane's backups from its old host's location to its new host's: the
//! GEP-7 procedure, run by the new host.
//!
//! 1. Read the destination's marker: if a later epoch already owns it, stop ([`MigrateError::Superseded`]).
//! 2. Write a `migrating` [`Marker`] into the source and the destination. From here on the old
//!    host, reading its marker before every snapshot, writes nothing more.
//! 3. Copy every snapshot, final ones first ([`copy_snapshots`]).
//! 4. Mark the migration `done` in both markers.
//!
//! Every step can be repeated: markers are rewritten with the same content and the copy skips
//! what is already there, so a new host (or the same one after a restart) resumes a migration
//! by running it again. Nothing is ever deleted from the source (DESIGN.md rule 4).
//!
//! When both are the same location there is nothing to copy: the markers are written all the
//! same, so the old host stops writing there.

use std::collections::BTreeSet;

use super::copy::{CopyError, CopyOptions, CopyReport, copy_snapshots};
use super::location::BackupLocation;
use super::marker::{self, MARKER_FORMAT, Marker, MarkerError, MarkerState};

/// What the migration is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationPlan {
    /// The control plane.
    pub control_plane: String,
    /// The epoch of the move.
    pub epoch: u64,
    /// The member it moves from, if any.
    pub from: Option<String>,
    /// The member it moves to (the one running this).
    pub to: String,
    /// When the move was committed, Unix ms (the same in every marker, so rewriting a marker
    /// on resume changes nothing).
    pub started_unix_ms: u64,
}

/// Why a migration stopped.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A later move owns the destination already: this one must not write there.
    #[error(
        "the backups at {location} belong to epoch {epoch} ({to}); this migration is at epoch {ours}"
    )]
    Superseded {
        /// The destination.
        location: String,
        /// The marker's epoch.
        epoch: u64,
        /// The marker's destination member.
        to: String,
        /// This migration's epoch.
        ours: u64,
    },
    /// A marker could not be read or written.
    #[error("{which}: {source}")]
    Marker {
        /// "source" or "destination".
        which: &'static str,
        /// What failed.
        source: MarkerError,
    },
    /// The copy failed.
    #[error(transparent)]
    Copy(#[from] CopyError),
}

impl MigrateError {
    /// Whether running the migration again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Superseded { .. } => false,
            Self::Marker { source, .. } => source.is_retryable(),
            Self::Copy(e) => e.is_retryable(),
        }
    }
}

/// The migration's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The copy (empty when source and destination are the same location).
    pub copy: CopyReport,
    /// The marker as written at the end (state `done`).
    pub marker: Marker,
    /// Whether source and destination are one location (nothing was copied).
    pub same_location: bool,
}

impl Migrated {
    /// The names of the destination's snapshots that hold the source's history (copied now, or
    /// there already); `None` when source and destination are one location.
    ///
    /// A restore after a move picks among these only ([`RestoreOptions::only`]). Anything else
    /// at the destination is not part of the source's history: left from an earlier epoch, or
    /// completed by a former owner after it lost the location (a member frozen inside an
    /// upload) with a revision the ring moved on from. Restoring it would bring old data back.
    ///
    /// [`RestoreOptions::only`]: super::restore::RestoreOptions::only
    pub fn from_source(&self) -> Option<BTreeSet<String>> {
        (!self.same_location).then(|| {
            self.copy
                .copied
                .iter()
                .map(|c| &c.destination)
                .chain(self.copy.skipped.iter().map(|s| &s.destination))
                .map(|d| d.name().to_string())
                .collect()
        })
    }
}

/// Runs the migration `plan` from `source` to `destination` at `now_unix_ms` (see the
/// [module docs](self)).
pub async fn migrate(
    source: &BackupLocation,
    destination: &BackupLocation,
    plan: &MigrationPlan,
    options: &CopyOptions,
    now_unix_ms: impl Fn() -> u64,
) -> Result<Migrated, MigrateError> {
    let marker_error = |which| move |source| MigrateError::Marker { which, source };
    if let Some(existing) = marker::read(&destination.store(), destination.prefix())
        .await
        .map_err(marker_error("destination"))?
        && existing.epoch > plan.epoch
    {
        return Err(MigrateError::Superseded {
            location: destination.to_string(),
            epoch: existing.epoch,
            to: existing.to,
            ours: plan.epoch,
        });
    }
    let same =
        source.store_id() == destination.store_id() && source.prefix() == destination.prefix();
    let mut marker = Marker {
        format: MARKER_FORMAT,
        control_plane: plan.control_plane.clone(),
        epoch: plan.epoch,
        from: plan.from.clone(),
        to: plan.to.clone(),
        source: source.to_string(),
        destination: destination.to_string(),
        state: MarkerState::Migrating,
        started_unix_ms: plan.started_unix_ms,
        done_unix_ms: None,
    };
    write_both(source, destination, same, &marker).await?;
    let copy = if same {
        CopyReport::default()
    } else {
        copy_snapshots(source, destination, options).await?
    };
    marker.state = MarkerState::Done;
    marker.done_unix_ms = Some(now_unix_ms());
    write_both(source, destination, same, &marker).await?;
    Ok(Migrated {
        copy,
        marker,
        same_location: same,
    })
}

/// Writes `marker` into the source first (that is what stops the old host), then the
/// destination.
async fn write_both(
    source: &BackupLocation,
    destination: &BackupLocation,
    same: bool,
    marker: &Marker,
) -> Result<(), MigrateError> {
    if !same {
        marker::write(&source.store(), source.prefix(), marker)
            .await
            .map_err(|source| MigrateError::Marker {
                which: "source",
                source,
            })?;
    }
    marker::write(&destination.store(), destination.prefix(), marker)
        .await
        .map_err(|source| MigrateError::Marker {
            which: "destination",
            source,
        })
}

#[cfg(test)]
mod tests {
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;
    use crate::backup::marker::Ownership;
    use crate::config::BackupSettings;

    fn location(dir: &std::path::Path, name: &str) -> BackupLocation {
        let url = format!("file://{}/{name}/shoot--x/etcd-main", dir.display());
        BackupLocation::parse(&url, &BackupSettings::default()).unwrap()
    }

    fn plan(epoch: u64) -> MigrationPlan {
        MigrationPlan {
            control_plane: "x".into(),
            epoch,
            from: Some("a".into()),
            to: "b".into(),
            started_unix_ms: 1_000,
        }
    }

    /// [`migrate`] at `epoch` with default copy options, at `now_unix_ms`.
    async fn run(
        src: &BackupLocation,
        dst: &BackupLocation,
        epoch: u64,
        now_unix_ms: u64,
    ) -> Result<Migrated, MigrateError> {
        let options = CopyOptions::new(&BackupSettings::default());
        migrate(src, dst, &plan(epoch), &options, || now_unix_ms).await
    }

    async fn put(location: &BackupLocation, name: &str, bytes: &[u8]) {
        let path = location.v2_dir().join(name);
        location
            .store()
            .put(&path, PutPayload::from(bytes.to_vec()))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn copies_and_marks_both_locations_and_the_old_host_loses_them() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (
            location(dir.path(), "zone-a"),
            location(dir.path(), "zone-b"),
        );
        put(&src, "Full-00000000-00000100-1700000000", b"full").await;
        put(&src, "Full-00000000-00000200-1700000100.final", b"final").await;
        let done = run(&src, &dst, 2, 5_000).await.unwrap();
        assert_eq!(done.copy.copied.len(), 2);
        assert_eq!(done.marker.done_unix_ms, Some(5_000));
        for location in [&src, &dst] {
            let m = marker::read(&location.store(), location.prefix())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(m, done.marker);
            assert_eq!(
                Marker::ownership(Some(&m), "a", 1),
                Ownership::Lost {
                    to: "b".into(),
                    epoch: 2
                }
            );
            assert_eq!(Marker::ownership(Some(&m), "b", 2), Ownership::Owner);
        }
        // Running it again (a resumed migration) copies nothing more.
        let again = run(&src, &dst, 2, 6_000).await.unwrap();
        assert!(again.copy.copied.is_empty());
        assert_eq!(again.copy.skipped.len(), 2);
    }

    #[tokio::test]
    async fn a_later_epoch_at_the_destination_stops_it_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (
            location(dir.path(), "zone-a"),
            location(dir.path(), "zone-b"),
        );
        put(&src, "Full-00000000-00000100-1700000000", b"full").await;
        let newer = Marker {
            epoch: 7,
            to: "c".into(),
            ..run(&src, &dst, 6, 1).await.unwrap().marker
        };
        marker::write(&dst.store(), dst.prefix(), &newer)
            .await
            .unwrap();
        let before = marker::read(&src.store(), src.prefix()).await.unwrap();
        let err = run(&src, &dst, 5, 2).await.unwrap_err();
        assert!(
            matches!(err, MigrateError::Superseded { epoch: 7, .. }),
            "{err}"
        );
        assert!(!err.is_retryable());
        assert_eq!(
            marker::read(&src.store(), src.prefix()).await.unwrap(),
            before
        );
    }

    #[tokio::test]
    async fn the_same_location_gets_markers_but_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let shared = location(dir.path(), "shared");
        put(&shared, "Full-00000000-00000100-1700000000", b"full").await;
        let done = run(&shared, &shared, 3, 9).await.unwrap();
        assert!(done.copy.copied.is_empty());
        assert_eq!(
            done.from_source(),
            None,
            "the whole location is the source's"
        );
        let m = marker::read(&shared.store(), shared.prefix())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.state, MarkerState::Done);
        assert!(matches!(
            Marker::ownership(Some(&m), "a", 2),
            Ownership::Lost { .. }
        ));
    }

    #[tokio::test]
    async fn the_source_s_history_is_what_was_copied_or_there_already_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (
            location(dir.path(), "zone-a"),
            location(dir.path(), "zone-b"),
        );
        put(&src, "Full-00000000-00000100-1700000000", b"full").await;
        put(&src, "Full-00000000-00000200-1700000100.final", b"final").await;
        // Already at the destination (an earlier, interrupted copy): skipped, still the source's.
        put(&dst, "Full-00000000-00000100-1700000000", b"full").await;
        // A former owner's snapshot the source never had: a higher revision, not its history.
        put(&dst, "Full-00000000-00000300-1700000050", b"late").await;
        let done = run(&src, &dst, 4, 7).await.unwrap();
        assert_eq!(
            done.from_source(),
            Some(
                [
                    "Full-00000000-00000100-1700000000".to_string(),
                    "Full-00000000-00000200-1700000100".to_string(),
                ]
                .into()
            )
        );
    }
}

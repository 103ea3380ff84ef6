//! Listing the snapshots of a backup location: every object under `<prefix>/v2/`, parsed with
//! [`SnapshotPath`] (etcd-backup-restore's layout v2).
//!
//! Objects whose keys do not parse (chunks of unfinished uploads, layout-v1 leftovers, stray
//! files) are not snapshots: they are skipped and returned separately in
//! [`Listing::unparsed`], with the reason, so callers can log them. A listing holds at most
//! [`MAX_LISTED_OBJECTS`] objects; a bigger one is refused rather than grown without bound.

use futures::TryStreamExt;
use object_store::path::Path;

use super::location::{BackupLocation, is_retryable};
use crate::core::backup_name::{BackupNameError, SnapshotKind, SnapshotPath};

/// Most objects one listing of `<prefix>/v2/` may return (an etcd-backup-restore location
/// holds one full snapshot per period plus its incrementals, after garbage collection).
pub const MAX_LISTED_OBJECTS: usize = 100_000;

/// A snapshot found in a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its key, parsed.
    pub path: SnapshotPath,
    /// Its key as the store names it.
    pub location: Path,
    /// Its size in bytes.
    pub size_bytes: u64,
}

/// An object under `v2/` that is not a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unparsed {
    /// Its key.
    pub location: Path,
    /// Why its key is not a snapshot key.
    pub why: BackupNameError,
}

/// What [`list_snapshots`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The snapshots, sorted by last revision, then creation time, then final after not
    /// final, then key.
    pub snapshots: Vec<Listed>,
    /// Objects that are not snapshots, sorted by key.
    pub unparsed: Vec<Unparsed>,
}

/// Why a location cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store answered with an error.
    #[error("cannot list {url}/v2/: {source}")]
    List {
        /// The location.
        url: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
    /// More objects than [`MAX_LISTED_OBJECTS`].
    #[error(
        "{url}/v2/ holds more than {max} objects; refusing to list further (is it really one etcd's backups?)"
    )]
    TooMany {
        /// The location.
        url: String,
        /// The limit.
        max: usize,
    },
}

impl StoreError {
    /// Whether listing again later may succeed (the store was unavailable).
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::List { source, .. } => is_retryable(source),
            StoreError::TooMany { .. } => false,
        }
    }
}

/// Lists the snapshots under `<prefix>/v2/` of `location` (see the [module docs](self)).
pub async fn list_snapshots(location: &BackupLocation) -> Result<Listing, StoreError> {
    let store = location.store();
    let dir = location.v2_dir();
    let mut objects = store.list(Some(&dir));
    let mut listing = Listing::default();
    let mut count = 0usize;
    while let Some(meta) = objects
        .try_next()
        .await
        .map_err(|source| StoreError::List {
            url: location.to_string(),
            source,
        })?
    {
        count += 1;
        if count > MAX_LISTED_OBJECTS {
            return Err(StoreError::TooMany {
                url: location.to_string(),
                max: MAX_LISTED_OBJECTS,
            });
        }
        match parse_key(location, &meta.location) {
            Ok(path) => listing.snapshots.push(Listed {
                path,
                location: meta.location,
                size_bytes: meta.size,
            }),
            Err(why) => listing.unparsed.push(Unparsed {
                location: meta.location,
                why,
            }),
        }
    }
    sort_snapshots(&mut listing.snapshots);
    listing
        .unparsed
        .sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    Ok(listing)
}

/// A listed key as a snapshot key of this location (the prefix must be the location's own).
fn parse_key(location: &BackupLocation, key: &Path) -> Result<SnapshotPath, BackupNameError> {
    let path = SnapshotPath::parse(key.as_ref())?;
    if path.prefix() != location.backup_prefix() {
        return Err(BackupNameError::Layout {
            key: key.to_string(),
        });
    }
    Ok(path)
}

/// Sorts snapshots by last revision, creation time, final after not final, then key.
pub fn sort_snapshots(snapshots: &mut [Listed]) {
    snapshots.sort_by(|a, b| {
        order_key(a)
            .cmp(&order_key(b))
            .then_with(|| a.location.as_ref().cmp(b.location.as_ref()))
    });
}

fn order_key(listed: &Listed) -> (u64, u64, bool) {
    let name = listed.path.name();
    (name.last_revision(), name.created_unix_s(), name.is_final())
}

/// The newest full snapshot: the highest last revision, then the latest, then a final one.
pub fn newest_full(snapshots: &[Listed]) -> Option<&Listed> {
    snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Full)
        .max_by_key(|s| order_key(s))
}

/// The incremental snapshots that continue `full`: those starting after its last revision,
/// in the order of [`sort_snapshots`].
pub fn incrementals_after<'a>(snapshots: &'a [Listed], full: &Listed) -> Vec<&'a Listed> {
    let mut after: Vec<&Listed> = snapshots
        .iter()
        .filter(|s| {
            s.path.name().kind() == SnapshotKind::Incr
                && s.path.name().start_revision() > full.path.name().last_revision()
        })
        .collect();
    after.sort_by(|a, b| {
        order_key(a)
            .cmp(&order_key(b))
            .then_with(|| a.location.as_ref().cmp(b.location.as_ref()))
    });
    after
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(key: &str) -> Listed {
        Listed {
            path: SnapshotPath::parse(key).unwrap(),
            location: Path::parse(key).unwrap(),
            size_bytes: 1,
        }
    }

    #[test]
    fn newest_full_and_its_incrementals() {
        let mut all = vec![
            listed("p/v2/Incr-00001101-00001200-1700000180.gz"),
            listed("p/v2/Full-00000000-00001100-1700000120.gz.final"),
            listed("p/v2/Incr-00001001-00001050-1700000060.gz"),
            listed("p/v2/Full-00000000-00001000-1700000000.gz"),
            listed("p/v2/Incr-00001201-00001300-1700000240.gz"),
        ];
        sort_snapshots(&mut all);
        let order: Vec<u64> = all.iter().map(|s| s.path.name().last_revision()).collect();
        assert_eq!(order, [1000, 1050, 1100, 1200, 1300]);
        let full = newest_full(&all).unwrap();
        assert_eq!(full.path.name().last_revision(), 1100);
        assert!(full.path.name().is_final());
        let incr: Vec<u64> = incrementals_after(&all, full)
            .iter()
            .map(|s| s.path.name().start_revision())
            .collect();
        assert_eq!(incr, [1101, 1201]);
        assert_eq!(newest_full(&all[1..2]), None);
    }

    #[test]
    fn a_final_sorts_after_its_twin() {
        let mut all = vec![
            listed("v2/Full-00000000-00001100-1700000120.gz.final"),
            listed("v2/Full-00000000-00001100-1700000120.gz"),
        ];
        sort_snapshots(&mut all);
        assert!(!all[0].path.name().is_final());
        assert!(newest_full(&all).unwrap().path.name().is_final());
    }
}

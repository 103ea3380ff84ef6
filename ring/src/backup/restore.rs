//! Restoring the newest good full snapshot into a fresh etcd data directory, and replaying
//! the delta snapshots after it.
//!
//! [`restore_newest`] lists `<prefix>/v2/`, takes the full snapshots (final or not) newest
//! first (by last revision, then creation time, a final one before a plain one of the same
//! revision and time), only those named in [`RestoreOptions::only`] when that is set (after a
//! move: the source's history, see [`super::migrate::Migrated::from_source`]), and for each: downloads it to a temporary file next to the data
//! directory, decompressing and checking its sha256 trailer on the way
//! ([`Verifier`]). One that does not verify (or vanished since the listing) is reported in
//! [`Restored::skipped_bad`] (each one deserves an event) and the next older one is tried. The
//! first that verifies is restored with the configured [`RestoreTool`]:
//!
//! ```text
//! ETCDCTL_API=3 etcdctl snapshot restore FILE --data-dir DIR --name NAME \
//!     --initial-cluster NAME=PEER_URL --initial-advertise-peer-urls PEER_URL   # etcd 3.4
//! etcdutl snapshot restore FILE ...same flags...                            # etcd 3.5+
//! ```
//!
//! The data directory must not exist, or be empty; anything else is refused
//! ([`RestoreError::DataDirNotEmpty`]): a restore never overwrites data. When the tool fails,
//! what it wrote is removed, so the restore can be tried again.
//!
//! A store error other than "not found" stops the restore (retryable) instead of falling back:
//! an older snapshot would lose data a network blip does not justify losing.
//!
//! **Deltas.** With [`RestoreOptions::replay_with`] set (an `etcd` binary), the delta (`Incr`)
//! snapshots after the restored full one are replayed onto it, etcd-backup-restore's rule:
//! every delta after the full snapshot in revision order
//! ([`crate::core::backup_chain::delta_chain`]), stopping before a gap in the revisions and at
//! the first delta that does not verify ([`super::replay`]); [`Restored::replay_stopped`] says
//! where and why. (A full snapshot that does not verify falls back to an older one, whose
//! deltas then run on as far as they join up.) The data-loss window is the age of the newest
//! snapshot applied, full or delta ([`Restored::data_loss_window_s`]), zero when it is a final
//! one. Without `replay_with`, only the full snapshot is restored and
//! [`Restored::unapplied_incr`] counts the deltas left out.
//!
//! Limits: at most [`MAX_LISTED_OBJECTS`] objects listed, [`MAX_SNAPSHOT_BYTES`] per snapshot
//! (decompressed), the tool runs at most [`RestoreOptions::tool_timeout_ms`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use super::checksum::{MAX_SNAPSHOT_BYTES, Verified, Verifier};
use super::replay::{DeltaObject, ReplayEtcd, replay_deltas};
pub use super::restore_error::{RestoreError, SkippedSnapshot};
use crate::core::backup_chain::delta_chain;
use crate::core::backup_name::{LAYOUT_V2, SnapshotKind, SnapshotName, SnapshotPath};

/// Most objects read from one listing of `<prefix>/v2/`.
pub const MAX_LISTED_OBJECTS: usize = 100_000;
/// Longest member name or peer URL accepted, in bytes.
pub const MAX_ARG_LEN: usize = 256;
/// Most bytes of the tool's output kept for an error message.
const MAX_TOOL_OUTPUT: usize = 2_000;

/// The program that turns a snapshot file into a data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreTool {
    /// `etcdctl snapshot restore` (etcd 3.4; deprecated in 3.5, gone in 3.6).
    Etcdctl(PathBuf),
    /// `etcdutl snapshot restore` (etcd 3.5 and later).
    Etcdutl(PathBuf),
}

impl RestoreTool {
    /// The tool in `bin_dir`: `etcdutl` when it is there (3.5+), otherwise `etcdctl`.
    pub fn detect(bin_dir: &Path) -> Result<Self, RestoreError> {
        let etcdutl = bin_dir.join("etcdutl");
        if etcdutl.is_file() {
            return Ok(Self::Etcdutl(etcdutl));
        }
        let etcdctl = bin_dir.join("etcdctl");
        if etcdctl.is_file() {
            return Ok(Self::Etcdctl(etcdctl));
        }
        Err(RestoreError::ToolMissing {
            path: bin_dir.display().to_string(),
        })
    }

    /// The tool that goes with etcd `version` (`(major, minor)`), in `bin_dir`.
    pub fn for_version(version: (u32, u32), bin_dir: &Path) -> Self {
        if version < (3, 5) {
            Self::Etcdctl(bin_dir.join("etcdctl"))
        } else {
            Self::Etcdutl(bin_dir.join("etcdutl"))
        }
    }

    /// The tool's path.
    pub fn path(&self) -> &Path {
        match self {
            Self::Etcdctl(p) | Self::Etcdutl(p) => p,
        }
    }
}

/// `(major, minor, patch)` from `etcd --version` output (`etcd Version: 3.4.23`).
pub fn parse_etcd_version(output: &str) -> Option<(u32, u32, u32)> {
    let line = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("etcd Version:"))?;
    let mut parts = line.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor, patch.parse().ok()?))
}

/// Where and as whom to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The new data directory: must not exist, or be empty.
    pub data_dir: PathBuf,
    /// The etcd member's name (`--name`).
    pub member_name: String,
    /// Its peer URL (`--initial-advertise-peer-urls`, and in `--initial-cluster`).
    pub peer_url: String,
    /// The program to run.
    pub tool: RestoreTool,
    /// Now, in Unix seconds (to compute the snapshot's age).
    pub now_unix_s: u64,
    /// Longest the tool may run, in ms.
    pub tool_timeout_ms: u64,
    /// When set, only full snapshots with these names are candidates; the others are passed
    /// over with a warning (a migration's restore: [`Migrated::from_source`]).
    ///
    /// [`Migrated::from_source`]: super::migrate::Migrated::from_source
    pub only: Option<BTreeSet<String>>,
    /// The `etcd` binary that replays the delta snapshots after the full one (the version the
    /// restored directory will be served with); none: the full snapshot only.
    pub replay_with: Option<PathBuf>,
}

/// A restore that succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The full snapshot used.
    pub snapshot: SnapshotPath,
    /// The delta snapshots replayed after it, in order.
    pub deltas: Vec<SnapshotPath>,
    /// Where the replay of deltas stopped early, and why: a gap in the revisions, a delta that
    /// does not verify. Nothing after it was applied.
    pub replay_stopped: Option<SkippedSnapshot>,
    /// The revision the restored store reaches: the newest applied snapshot's last revision
    /// (the full snapshot's name when no delta was replayed).
    pub revision: u64,
    /// When the newest applied snapshot (full or delta) was taken, Unix seconds.
    pub created_unix_s: u64,
    /// Its age at restore time, in seconds.
    pub age_s: u64,
    /// Whether the newest applied snapshot is a final one (then nothing acknowledged before
    /// its host stopped is lost).
    pub is_final: bool,
    /// The sha256 of etcd's database, hex.
    pub sha256: String,
    /// etcd's snapshot size (decompressed), bytes.
    pub snapshot_size_bytes: u64,
    /// The stored object's size, bytes.
    pub stored_size_bytes: u64,
    /// Newer snapshots that did not verify, newest first.
    pub skipped_bad: Vec<SkippedSnapshot>,
    /// Delta snapshots newer than the newest applied one, not replayed (see the module docs).
    pub unapplied_incr: usize,
    /// Snapshots passed over because they are not in [`RestoreOptions::only`] (not the
    /// source's history) and reach past the full snapshot restored. A host that continues the
    /// restored chain with deltas of its own must not do so next to them: a later restore could
    /// join its deltas to theirs.
    pub foreign_newer: usize,
    /// How long the replay took (the temporary etcd's start included), ms; 0 without deltas.
    pub replay_ms: u64,
}

impl Restored {
    /// The newest snapshot applied: the last delta replayed, else the full snapshot.
    pub fn newest_applied(&self) -> &SnapshotPath {
        self.deltas.last().unwrap_or(&self.snapshot)
    }
}

impl Restored {
    /// How much may be lost, in seconds: zero for a final snapshot, its age otherwise.
    pub fn data_loss_window_s(&self) -> u64 {
        if self.is_final { 0 } else { self.age_s }
    }
}

/// One listed full snapshot.
struct Candidate {
    path: SnapshotPath,
    location: StorePath,
}

/// Restores the newest full snapshot under `prefix` that verifies. See the
/// [module docs](self).
pub async fn restore_newest(
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    options: &RestoreOptions,
) -> Result<Restored, RestoreError> {
    check_options(options)?;
    prepare_data_dir(&options.data_dir)?;

    let (mut candidates, mut deltas) = list_snapshots(store, prefix).await?;
    // The last revisions of what `only` leaves out, full and delta.
    let mut foreign_revisions = Vec::new();
    if let Some(only) = &options.only {
        let not_only = |name: &SnapshotName| !only.contains(&name.to_string());
        foreign_revisions.extend(
            candidates
                .iter()
                .map(|c| *c.path.name())
                .chain(deltas.iter().map(|d| *d.path.name()))
                .filter(|n| not_only(n))
                .map(|n| n.last_revision()),
        );
        deltas.retain(|d| only.contains(&d.path.name().to_string()));
        let foreign: Vec<String> = candidates
            .iter()
            .map(|c| c.path.name().to_string())
            .filter(|name| !only.contains(name))
            .collect();
        if let Some(newest) = foreign.first() {
            tracing::warn!(
                "passing over {} snapshot(s) that are not the source's history (newest {newest})",
                foreign.len()
            );
        }
        candidates.retain(|c| only.contains(&c.path.name().to_string()));
    }
    if candidates.is_empty() {
        return Err(RestoreError::NoSnapshot {
            prefix: prefix.to_string(),
        });
    }
    let temp = temp_file_for(&options.data_dir);
    let mut skipped = Vec::new();
    for candidate in candidates {
        let name = candidate.location.to_string();
        let downloaded = download_verified(store, &candidate, &temp).await;
        let (verified, stored_size_bytes) = match downloaded {
            Ok(v) => v,
            Err(Download::Bad(why)) => {
                tracing::warn!(snapshot = %name, %why, "snapshot skipped: it does not verify");
                remove_file_quietly(&temp).await;
                skipped.push(SkippedSnapshot { name, why });
                continue;
            }
            Err(Download::Fatal(e)) => {
                remove_file_quietly(&temp).await;
                return Err(e);
            }
        };
        let restored = run_tool(&temp, options).await;
        remove_file_quietly(&temp).await;
        restored?;
        let full_name = *candidate.path.name();
        let names: Vec<SnapshotName> = deltas.iter().map(|d| *d.path.name()).collect();
        let chain = delta_chain(full_name.last_revision(), &names);
        let mut replay_stopped = chain.gap.as_ref().map(|gap| SkippedSnapshot {
            name: deltas[gap.next].location.to_string(),
            why: format!(
                "revisions {}..={} are in no snapshot: this delta and every later one are not replayed",
                gap.from, gap.to
            ),
        });
        let (mut applied, mut revision, mut replay_ms) = (Vec::new(), full_name.last_revision(), 0);
        if let Some(etcd) = &options.replay_with
            && !chain.replay.is_empty()
        {
            let objects: Vec<DeltaObject> =
                chain.replay.iter().map(|&i| deltas[i].clone()).collect();
            let began = std::time::Instant::now();
            let replayed = replay_deltas(
                store,
                &objects,
                &ReplayEtcd {
                    binary: etcd.clone(),
                    data_dir: options.data_dir.clone(),
                    member_name: options.member_name.clone(),
                    peer_url: options.peer_url.clone(),
                    timeout_ms: options.tool_timeout_ms,
                    // etcdutl comes with etcd 3.5+, which has --unsafe-no-fsync.
                    no_fsync: matches!(options.tool, RestoreTool::Etcdutl(_)),
                },
            )
            .await;
            let replayed = match replayed {
                Ok(r) => r,
                Err(e) => {
                    remove_failed_restore(&options.data_dir);
                    return Err(e);
                }
            };
            replay_ms = began.elapsed().as_millis() as u64;
            revision = replayed.revision.max(revision);
            if replayed.stopped.is_some() {
                replay_stopped = replayed.stopped;
            }
            applied = replayed.applied;
            tracing::info!(
                "replayed {} of {} delta snapshot(s) after {} to revision {revision} ({} transactions, {replay_ms} ms)",
                applied.len(),
                objects.len(),
                candidate.path,
                replayed.transactions
            );
        }
        if let Some(stopped) = &replay_stopped {
            tracing::warn!(delta = %stopped.name, why = %stopped.why, "delta replay stopped early");
        }
        let newest = applied.last().map(|p| *p.name()).unwrap_or(full_name);
        return Ok(Restored {
            revision: if applied.is_empty() {
                full_name.last_revision()
            } else {
                revision
            },
            created_unix_s: newest.created_unix_s(),
            age_s: options.now_unix_s.saturating_sub(newest.created_unix_s()),
            is_final: newest.is_final(),
            sha256: verified.sha256,
            snapshot_size_bytes: verified.size_bytes,
            stored_size_bytes,
            skipped_bad: skipped,
            unapplied_incr: deltas
                .iter()
                .filter(|d| d.path.name().last_revision() > newest.last_revision())
                .count(),
            replay_ms,
            foreign_newer: foreign_revisions
                .iter()
                .filter(|&&r| r > full_name.last_revision())
                .count(),
            deltas: applied,
            replay_stopped,
            snapshot: candidate.path,
        });
    }
    Err(RestoreError::NoUsableSnapshot {
        prefix: prefix.to_string(),
        skipped,
    })
}

fn check_options(options: &RestoreOptions) -> Result<(), RestoreError> {
    let name = &options.member_name;
    if name.is_empty()
        || name.len() > MAX_ARG_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(RestoreError::Options(format!(
            "member name {:?} must be 1 to {MAX_ARG_LEN} letters, digits, '-', '_' or '.'",
            crate::core::error::shorten(name)
        )));
    }
    let url = &options.peer_url;
    let valid_url = url.len() <= MAX_ARG_LEN
        && (url.starts_with("http://") || url.starts_with("https://"))
        && !url.contains([',', '=', ' ']);
    if !valid_url {
        return Err(RestoreError::Options(format!(
            "peer URL {:?} must be one http:// or https:// URL of at most {MAX_ARG_LEN} bytes",
            crate::core::error::shorten(url)
        )));
    }
    if options.data_dir.file_name().is_none() {
        return Err(RestoreError::Options(format!(
            "data directory {} has no name",
            options.data_dir.display()
        )));
    }
    if !options.tool.path().is_file() {
        return Err(RestoreError::ToolMissing {
            path: options.tool.path().display().to_string(),
        });
    }
    Ok(())
}

/// Refuses a non-empty data directory; removes an empty one (the tools want to create it) and
/// creates its parent.
fn prepare_data_dir(dir: &Path) -> Result<(), RestoreError> {
    let io = |what, e: std::io::Error| RestoreError::Io {
        what,
        path: dir.display().to_string(),
        why: e.to_string(),
    };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {
            let mut entries = std::fs::read_dir(dir).map_err(|e| io("read", e))?;
            if entries.next().is_some() {
                return Err(RestoreError::DataDirNotEmpty {
                    dir: dir.display().to_string(),
                });
            }
            std::fs::remove_dir(dir).map_err(|e| io("remove the empty directory", e))?;
        }
        Ok(_) => {
            return Err(RestoreError::DataDirNotEmpty {
                dir: dir.display().to_string(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect", e)),
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io("create the parent of", e))?;
    }
    Ok(())
}

/// `<parent>/.<name>.restore.db`: next to the data directory, on the same file system.
fn temp_file_for(data_dir: &Path) -> PathBuf {
    let name = data_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    data_dir.with_file_name(format!(".{name}.restore.db"))
}

/// Full snapshots, newest first, and the delta snapshots.
async fn list_snapshots(
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
) -> Result<(Vec<Candidate>, Vec<DeltaObject>), RestoreError> {
    let dir = prefix.clone().join(LAYOUT_V2);
    let mut listing = store.list(Some(&dir));
    let mut full = Vec::new();
    let mut incr = Vec::new();
    let mut seen = 0usize;
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|source| RestoreError::Store {
            what: "list",
            location: dir.to_string(),
            source,
        })?;
        seen += 1;
        if seen > MAX_LISTED_OBJECTS {
            tracing::warn!(prefix = %dir, "more than {MAX_LISTED_OBJECTS} objects; the rest is ignored");
            break;
        }
        // Anything else under v2/ (chunks of unfinished uploads, strangers) is not a snapshot.
        let Ok(path) = SnapshotPath::parse(meta.location.as_ref()) else {
            continue;
        };
        match path.name().kind() {
            SnapshotKind::Full => full.push(Candidate {
                path,
                location: meta.location,
            }),
            SnapshotKind::Incr => incr.push(DeltaObject {
                path,
                location: meta.location,
            }),
        }
    }
    full.sort_by_key(|c| {
        let n = c.path.name();
        std::cmp::Reverse((n.last_revision(), n.created_unix_s(), n.is_final()))
    });
    Ok((full, incr))
}

enum Download {
    /// This snapshot is bad (or gone): try the previous one.
    Bad(String),
    /// Stop.
    Fatal(RestoreError),
}

/// Streams the snapshot to `temp`, decompressed and verified. Returns the verdict and the
/// stored size.
async fn download_verified(
    store: &Arc<dyn ObjectStore>,
    candidate: &Candidate,
    temp: &Path,
) -> Result<(Verified, u64), Download> {
    let location = &candidate.location;
    let store_error = |what, source: object_store::Error| match source {
        object_store::Error::NotFound { .. } => {
            Download::Bad("it vanished after it was listed".into())
        }
        source => Download::Fatal(RestoreError::Store {
            what,
            location: location.to_string(),
            source,
        }),
    };
    let io_error = |what, e: std::io::Error| {
        Download::Fatal(RestoreError::Io {
            what,
            path: temp.display().to_string(),
            why: e.to_string(),
        })
    };
    let mut verifier = Verifier::new(candidate.path.name().compression())
        .map_err(|e| Download::Bad(e.to_string()))?;
    let result = store
        .get(location)
        .await
        .map_err(|e| store_error("read", e))?;
    let mut file = tokio::fs::File::create(temp)
        .await
        .map_err(|e| io_error("create", e))?;
    let mut stream = result.into_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| store_error("read", e))?;
        let out = verifier
            .feed(&chunk)
            .map_err(|e| Download::Bad(e.to_string()))?;
        file.write_all(out)
            .await
            .map_err(|e| io_error("write", e))?;
    }
    let stored_size_bytes = verifier.stored_bytes();
    let (rest, verified) = verifier
        .finish()
        .map_err(|e| Download::Bad(e.to_string()))?;
    file.write_all(&rest)
        .await
        .map_err(|e| io_error("write", e))?;
    file.sync_all().await.map_err(|e| io_error("sync", e))?;
    debug_assert!(verified.size_bytes <= MAX_SNAPSHOT_BYTES);
    Ok((verified, stored_size_bytes))
}

async fn run_tool(snapshot_file: &Path, options: &RestoreOptions) -> Result<(), RestoreError> {
    let tool = options.tool.path();
    let tool_name = tool.display().to_string();
    let mut command = tokio::process::Command::new(tool);
    command
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot_file)
        .arg("--data-dir")
        .arg(&options.data_dir)
        .arg("--name")
        .arg(&options.member_name)
        .arg("--initial-cluster")
        .arg(format!("{}={}", options.member_name, options.peer_url))
        .arg("--initial-advertise-peer-urls")
        .arg(&options.peer_url)
        .env("ETCDCTL_API", "3")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(
        Duration::from_millis(options.tool_timeout_ms),
        command.output(),
    )
    .await;
    let failed = match output {
        Err(_) => Some(RestoreError::ToolTimeout {
            tool: tool_name,
            timeout_ms: options.tool_timeout_ms,
        }),
        Ok(Err(e)) => Some(RestoreError::Io {
            what: "run",
            path: tool_name,
            why: e.to_string(),
        }),
        Ok(Ok(out)) if !out.status.success() => {
            let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            let text = text.trim();
            let cut = text.floor_char_boundary(MAX_TOOL_OUTPUT.min(text.len()));
            Some(RestoreError::Tool {
                tool: tool_name,
                status: out.status.to_string(),
                output: text[..cut].to_string(),
            })
        }
        Ok(Ok(_)) => None,
    };
    match failed {
        None => Ok(()),
        Some(e) => {
            remove_failed_restore(&options.data_dir);
            Err(e)
        }
    }
}

/// Leaves no half-restored directory behind (it did not exist before the restore).
fn remove_failed_restore(data_dir: &Path) {
    if let Err(rm) = std::fs::remove_dir_all(data_dir)
        && rm.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %data_dir.display(), error = %rm, "cannot remove a failed restore");
    }
}

async fn remove_file_quietly(path: &Path) {
    if let Err(e) = tokio::fs::remove_file(path).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove a temporary file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_versions_parse() {
        let out = "etcd Version: 3.4.23\nGit SHA: Not provided\nGo Version: go1.19.8\n";
        assert_eq!(parse_etcd_version(out), Some((3, 4, 23)));
        assert_eq!(
            parse_etcd_version("etcd Version: 3.6.0-rc.1\n"),
            Some((3, 6, 0))
        );
        assert_eq!(parse_etcd_version("etcd 3.5"), None);
        let dir = Path::new("/opt/etcd");
        assert_eq!(
            RestoreTool::for_version((3, 4), dir),
            RestoreTool::Etcdctl(dir.join("etcdctl"))
        );
        assert_eq!(
            RestoreTool::for_version((3, 5), dir),
            RestoreTool::Etcdutl(dir.join("etcdutl"))
        );
    }

    #[test]
    fn data_dirs_are_fresh_or_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("a/b/data");
        prepare_data_dir(&missing).unwrap();
        assert!(missing.parent().unwrap().is_dir());
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        prepare_data_dir(&empty).unwrap();
        assert!(
            !empty.exists(),
            "an empty directory is removed for the tool"
        );
        let full = tmp.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), b"x").unwrap();
        assert!(matches!(
            prepare_data_dir(&full),
            Err(RestoreError::DataDirNotEmpty { .. })
        ));
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            prepare_data_dir(&file),
            Err(RestoreError::DataDirNotEmpty { .. })
        ));
        assert_eq!(
            temp_file_for(Path::new("/var/lib/etcd/data")),
            PathBuf::from("/var/lib/etcd/.data.restore.db")
        );
    }

    #[test]
    fn options_are_checked() {
        let ok = RestoreOptions {
            data_dir: PathBuf::from("/tmp/x"),
            member_name: "etcd-main".into(),
            peer_url: "http://127.0.0.1:2380".into(),
            tool: RestoreTool::Etcdctl(PathBuf::from("/bin/sh")),
            now_unix_s: 0,
            tool_timeout_ms: 1_000,
            only: None,
            replay_with: None,
        };
        check_options(&ok).unwrap();
        for (name, url) in [
            ("a=b", "http://127.0.0.1:2380"),
            ("", "http://127.0.0.1:2380"),
            ("a", "127.0.0.1:2380"),
            ("a", "http://a:1,b=http://b:2"),
        ] {
            let o = RestoreOptions {
                member_name: name.into(),
                peer_url: url.into(),
                ..ok.clone()
            };
            assert!(matches!(check_options(&o), Err(RestoreError::Options(_))));
        }
        let missing = RestoreOptions {
            tool: RestoreTool::Etcdutl(PathBuf::from("/nonexistent/etcdutl")),
            ..ok
        };
        assert!(matches!(
            check_options(&missing),
            Err(RestoreError::ToolMissing { .. })
        ));
    }
}

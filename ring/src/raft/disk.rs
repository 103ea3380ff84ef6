//! The Raft log's disk: room kept free, and what a member says while it lacks it.
//!
//! A member writes its log only while the file system of its data directory has at least
//! [`MIN_FREE_BYTES`] free. Below that, the log store's flusher **waits** before writing: the
//! member acknowledges nothing more (its appends are not durable, so neither its vote nor its
//! count toward a commit), says why ([`DiskHealth::problem`]: the log, `Status.problem`,
//! `/readyz`, the `garden_ring_raft_disk_full` metric), and carries on by itself once space is
//! back. Keeping a reserve instead of writing until `ENOSPC` matters: a write that fails half
//! way leaves the log with a hole, and redb refuses further use of a database after an I/O
//! error, so the only safe answer to a failed write is to stop (see [`crate::node`]'s
//! fail-stop); the reserve makes running out of space a wait, not a failure.
//!
//! Failed fsyncs are never retried (the kernel may have dropped the pages it could not write,
//! and a second fsync can then succeed without them: PostgreSQL's lesson): the flusher fails
//! the batch, openraft stops this member's Raft, and `ringd` exits (fail-stop); a restart
//! recovers from what is on disk.

use std::path::Path;
use std::sync::{Arc, Mutex};

/// Free bytes the data directory's file system must keep for the log to be written: a fold of
/// a full WAL (2 MiB) into redb, redb's growth, and a state snapshot, many times over.
pub const MIN_FREE_BYTES: u64 = 32 * 1024 * 1024;

/// How often a waiting flusher looks at the free space again, ms.
pub const RECHECK_MS: u64 = 250;

/// Whether the log's disk has room, shared by the flusher (which sets it) and whoever reports
/// it. Cheap to clone.
#[derive(Clone, Default)]
pub struct DiskHealth(Arc<Mutex<Option<String>>>);

impl DiskHealth {
    /// Why the member writes nothing now; `None` while it writes.
    pub fn problem(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = problem;
    }
}

/// Free bytes (for unprivileged writers) of the file system holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(s.blocks_available().saturating_mul(s.fragment_size()))
}

/// Waits (blocking: the flusher's thread) until `dir`'s file system has [`MIN_FREE_BYTES`]
/// free, reporting the wait in `health` and the log. An error reading the free space is not a
/// reason to stop writing: the write itself will tell.
pub fn wait_for_room(dir: &Path, health: &DiskHealth) {
    let mut waited_ms = 0u64;
    loop {
        let free = match free_bytes(dir) {
            Ok(free) => free,
            Err(e) => {
                tracing::debug!("cannot read the free space of {}: {e}", dir.display());
                return;
            }
        };
        if free >= MIN_FREE_BYTES {
            if waited_ms > 0 {
                tracing::info!(
                    waited_ms,
                    "the Raft log's disk has room again ({} MiB free in {}): writing and acknowledging again",
                    free / (1024 * 1024),
                    dir.display()
                );
                health.set(None);
            }
            return;
        }
        if waited_ms == 0 {
            let problem = format!(
                "the Raft log's disk is full: {} MiB free in {}, under the {} MiB this member keeps; it acknowledges nothing until space is freed (nothing acknowledged is lost)",
                free / (1024 * 1024),
                dir.display(),
                MIN_FREE_BYTES / (1024 * 1024)
            );
            tracing::error!("{problem}");
            health.set(Some(problem));
        }
        std::thread::sleep(std::time::Duration::from_millis(RECHECK_MS));
        waited_ms += RECHECK_MS;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_room_does_not_wait_and_reports_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let health = DiskHealth::default();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        if free_bytes(dir.path()).unwrap() >= MIN_FREE_BYTES {
            wait_for_room(dir.path(), &health);
            assert_eq!(health.problem(), None);
        }
    }
}

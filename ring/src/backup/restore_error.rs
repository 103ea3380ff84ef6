//! Why a restore failed ([`RestoreError`], retryable or fatal by variant), and the snapshots
//! it passed over ([`SkippedSnapshot`]). Shared by the restore of a full snapshot and the
//! replay of the deltas after it.

use crate::core::backup_name::LAYOUT_V2;

use super::location::is_retryable;

/// A snapshot passed over because it is bad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSnapshot {
    /// Its key.
    pub name: String,
    /// Why (checksum mismatch, truncated, vanished...).
    pub why: String,
}

/// Why nothing was restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The options are unusable (fatal).
    #[error("restore options refused: {0}")]
    Options(String),
    /// The data directory holds something (fatal: a restore never overwrites).
    #[error("data directory {dir} exists and is not empty; restore only into a fresh one")]
    DataDirNotEmpty {
        /// The directory.
        dir: String,
    },
    /// No full snapshot under the prefix.
    #[error("no full snapshot under {prefix}/{LAYOUT_V2}/")]
    NoSnapshot {
        /// The prefix.
        prefix: String,
    },
    /// Full snapshots exist, but none verified (fatal; each is listed).
    #[error(
        "no full snapshot under {prefix}/{LAYOUT_V2}/ verifies: {}",
        describe(skipped)
    )]
    NoUsableSnapshot {
        /// The prefix.
        prefix: String,
        /// Every one tried, and why it failed.
        skipped: Vec<SkippedSnapshot>,
    },
    /// The object store failed.
    #[error("object store failed to {what} {location}: {source}")]
    Store {
        /// What was being done.
        what: &'static str,
        /// The key or prefix.
        location: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// A local file operation failed.
    #[error("cannot {what} {path}: {why}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The OS's complaint.
        why: String,
    },
    /// Neither `etcdutl` nor `etcdctl` is there.
    #[error("no etcdutl or etcdctl at {path}")]
    ToolMissing {
        /// Where they were looked for.
        path: String,
    },
    /// The restore tool failed.
    #[error("{tool} snapshot restore failed ({status}): {output}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its exit status.
        status: String,
        /// Its stderr and stdout, shortened.
        output: String,
    },
    /// Replaying the delta snapshots failed (the temporary etcd did not start, answered
    /// wrongly, or ran out of time); the data directory was removed.
    #[error("replaying delta snapshots with {etcd} failed: {why}")]
    Replay {
        /// The etcd binary.
        etcd: String,
        /// What went wrong.
        why: String,
    },
    /// The restore tool ran too long (killed).
    #[error("{tool} snapshot restore did not finish within {timeout_ms} ms")]
    ToolTimeout {
        /// The tool.
        tool: String,
        /// The limit.
        timeout_ms: u64,
    },
}

impl RestoreError {
    /// Whether the restore may succeed when tried again unchanged.
    pub fn is_retryable(&self) -> bool {
        match self {
            RestoreError::Store { source, .. } => is_retryable(source),
            RestoreError::ToolTimeout { .. } | RestoreError::Replay { .. } => true,
            _ => false,
        }
    }
}

fn describe(skipped: &[SkippedSnapshot]) -> String {
    skipped
        .iter()
        .map(|s| format!("{} ({})", s.name, s.why))
        .collect::<Vec<_>>()
        .join("; ")
}

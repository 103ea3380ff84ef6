//! What a starting `ringd` finds of its previous run's etcds: the guards that answer on their
//! sockets ([`super::guarded`]) are adopted, and any other guard still running over this
//! member's etcd data (one of a release without sockets, an etcd member of a zone-tolerant
//! control plane, or one whose socket is gone because its directory was replaced) is *unknown*: the agent then waits, as it always did, until whatever lease
//! such a guard holds has run out before it renews, so that its first renewal says truly what
//! runs here.

use std::path::{Path, PathBuf};

use super::guarded::{GuardStatus, Guarded, SOCKET};

/// A guard a previous run left, found at start.
pub(crate) struct Found {
    /// The control plane.
    pub(crate) name: String,
    /// The epoch its etcd runs at.
    pub(crate) epoch: u64,
    /// The guard.
    pub(crate) guard: Guarded,
    /// What it said of itself.
    pub(crate) status: GuardStatus,
}

/// Every guard that answers on a socket under `data_root` (`<control plane>/epoch-<N>/`).
pub(crate) async fn find(data_root: &Path) -> Vec<Found> {
    let mut found = Vec::new();
    for (name, epoch, dir) in epoch_dirs(data_root) {
        if !dir.join(SOCKET).exists() {
            continue;
        }
        match Guarded::adopt(&dir, &name, epoch).await {
            Some((guard, status)) => found.push(Found {
                name,
                epoch,
                guard,
                status,
            }),
            None => {
                // Its guard is gone (it would have removed the file): nothing runs there.
                tracing::debug!(dir = %dir.display(), "a guard socket nobody answers on");
                let _ = std::fs::remove_file(dir.join(SOCKET));
            }
        }
    }
    found
}

/// `(control plane, epoch, directory)` of every epoch directory under `data_root`.
fn epoch_dirs(data_root: &Path) -> Vec<(String, u64, PathBuf)> {
    let mut out = Vec::new();
    let Ok(planes) = std::fs::read_dir(data_root) else {
        return out;
    };
    for plane in planes.flatten() {
        let Some(name) = plane.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(epochs) = std::fs::read_dir(plane.path()) else {
            continue;
        };
        for entry in epochs.flatten() {
            let epoch = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("epoch-"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(epoch) = epoch
                && entry.path().is_dir()
            {
                out.push((name.clone(), epoch, entry.path()));
            }
        }
    }
    out
}

/// The process ids of `ring-guard` processes that run something over `data_root` and are not
/// among `adopted` (their own pids): guards this run cannot reach (without a control socket,
/// or whose socket is gone: a directory replaced under it) and knows nothing of.
pub(crate) fn unknown_guards(data_root: &Path, adopted: &[i32]) -> Vec<i32> {
    let root = data_root.to_string_lossy().to_string();
    crate::process::command_lines()
        .into_iter()
        .filter(|(pid, args)| is_guard_over(args, &root) && !adopted.contains(pid))
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether `args` are those of a `ring-guard` whose command names something under `root`.
fn is_guard_over(args: &[String], root: &str) -> bool {
    crate::process::program(args) == Some("ring-guard") && args.iter().any(|a| a.contains(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_over_this_root_are_found() {
        let line = |args: &[&str]| crate::process::split(args.join("\0").as_bytes());
        let root = "/var/lib/ring/etcd";
        let old = line(&[
            "/usr/bin/ring-guard",
            "--fence-ms",
            "500",
            "--",
            "etcd",
            "--data-dir",
            "/var/lib/ring/etcd/cp/epoch-3/etcd",
        ]);
        assert!(is_guard_over(&old, root));
        let adoptable = line(&[
            "ring-guard",
            "--control",
            "guard.sock",
            "--",
            "etcd",
            "--data-dir",
            "/var/lib/ring/etcd/cp/epoch-3/etcd",
        ]);
        assert!(
            is_guard_over(&adoptable, root),
            "adopted or not is the caller's"
        );
        let elsewhere = line(&["ring-guard", "--", "etcd", "--data-dir", "/other/cp"]);
        assert!(!is_guard_over(&elsewhere, root));
        let not_a_guard = line(&["etcd", "--data-dir", "/var/lib/ring/etcd/cp"]);
        assert!(!is_guard_over(&not_a_guard, root));
        assert!(!is_guard_over(&[], root));
    }

    #[test]
    fn epoch_directories_are_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cp-a/epoch-3/etcd")).unwrap();
        std::fs::create_dir_all(dir.path().join("cp-a/epoch-4.restoring")).unwrap();
        std::fs::create_dir_all(dir.path().join("cp-b/epoch-1")).unwrap();
        std::fs::write(dir.path().join("cp-b/epoch-2"), "a file").unwrap();
        let mut found: Vec<(String, u64)> = epoch_dirs(dir.path())
            .into_iter()
            .map(|(n, e, _)| (n, e))
            .collect();
        found.sort();
        assert_eq!(found, [("cp-a".into(), 3), ("cp-b".into(), 1)]);
    }
}

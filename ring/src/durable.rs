//! Making file-system changes survive a crash: a new or renamed file is durable only once the
//! directory holding it is synced too (its entry lives there). The lowest layer of the crate:
//! `raft` (the WAL, offline edits), `recovery` and the drivers use it; it uses nothing.

use std::path::Path;

/// fsyncs directory `dir` itself (its entries: files created, renamed or removed in it).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// fsyncs the directory holding `path` (the current directory for a bare file name).
pub fn sync_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => sync_dir(p),
        _ => sync_dir(Path::new(".")),
    }
}

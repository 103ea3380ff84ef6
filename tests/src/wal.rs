//! The Raft log's WAL as `garden_ring::raft::wal` writes it, for tests that damage it.

use std::path::Path;

/// Where the last record of `raft.wal` (at `path`) starts and how long it is, walking the
/// records as `garden_ring::raft::wal` writes them (a 4096-byte header, then `len: u32,
/// crc: u32, generation: u64, payload`, 8-byte aligned), over the first generation found.
pub fn last_wal_record(path: &Path) -> Option<(usize, usize)> {
    let bytes = std::fs::read(path).ok()?;
    let mut offset = 4096usize;
    let mut last = None;
    let mut generation = None;
    while offset + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().ok()?) as usize;
        let found = u64::from_le_bytes(bytes[offset + 8..offset + 16].try_into().ok()?);
        if len == 0 || generation.is_some_and(|g| g != found) {
            break;
        }
        generation = Some(found);
        let size = (16 + len).next_multiple_of(8);
        last = Some((offset, 16 + len));
        offset += size;
    }
    last
}

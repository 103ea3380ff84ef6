//! The Raft log's WAL as `garden_ring::raft::wal` writes it, for tests that damage it.

use std::path::Path;

/// Where the last record of `raft.wal` (at `path`) starts and how long it is, walking the
/// records as `garden_ring::raft::wal` writes them (a 4096-byte header, then `len: u32,
/// crc: u32, generation: u64, payload`, 8-byte aligned), over the first generation found.
pub fn last_wal_record(path: &Path) -> Option<(usize, usize)> {
    wal_records(path).last().copied()
}

/// Where each record of `raft.wal` (at `path`) starts and how long it is, in order (see
/// [`last_wal_record`]).
pub fn wal_records(path: &Path) -> Vec<(usize, usize)> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let mut offset = 4096usize;
    let mut records = Vec::new();
    let mut generation = None;
    while offset + 16 <= bytes.len() {
        let word = |at: usize, n: usize| bytes[at..at + n].to_vec();
        let len = u32::from_le_bytes(word(offset, 4).try_into().unwrap()) as usize;
        let found = u64::from_le_bytes(word(offset + 8, 8).try_into().unwrap());
        if len == 0 || generation.is_some_and(|g| g != found) {
            break;
        }
        generation = Some(found);
        records.push((offset, 16 + len));
        offset += (16 + len).next_multiple_of(8);
    }
    records
}

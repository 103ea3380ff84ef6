//! The Raft log's write-ahead file, `raft.wal`: appends are made durable by one sequential
//! write and one `fdatasync`, instead of one redb transaction each.
//!
//! Why (measured on the 2-core VM, ext4, three writers at once as in a 3-member ring on one
//! disk): a redb commit of one 200-byte entry took p50 533-604 µs, since it writes a dozen
//! pages across the file; a 200-byte append plus `fdatasync` took 287-296 µs. At one client
//! every write waits for that on a majority, so it is most of the commit latency.
//!
//! # The file
//! `raft.wal` is [`WAL_BYTES`] long, written with zeros when it is created, so that later writes
//! land on allocated blocks and `fdatasync` flushes data only, never file metadata. It starts
//! with a header ([`HEADER_BYTES`]: magic, format version, the file's random id, crc32), then
//! records, each 8-byte aligned:
//!
//! ```text
//! len: u32 | crc32(generation, len, payload): u32 | generation: u64 | payload: len bytes | 0-7 zero bytes
//! ```
//!
//! A payload is the committed log id (if openraft saved one since the last record) and the
//! appended entries, each as its index and its encoded bytes (what redb stores for it).
//!
//! # Which records belong to the log
//! redb's `meta` table holds `wal` = (file id, generation). Only the records of *that file* and
//! *that generation*, read from the first record on and up to the first one that is not, belong
//! to the log. Folding them into redb (see [`fold`]) raises the generation in the same
//! transaction, so the records left in the file never count again, and the next record starts
//! over at the beginning; nothing in the file is ever erased.
//!
//! - A record cut short by a crash (its crc does not match) ends the log: its write was never
//!   acknowledged, since acknowledging waits for its `fdatasync`.
//! - A valid record of the current generation *after* such a bad one means a record that was
//!   acknowledged has been damaged: that is an error, never skipped.
//! - A database that records a WAL whose file is missing, or is another database's file, is
//!   refused: the newest acknowledged entries could be in it.
//! - A database that records none (a new one, or one written by `ringd recover` or a snapshot
//!   restore) holds its whole log and gets a new file, with a new id: an older `raft.wal` in
//!   the directory is not its.
//!
//! # When records are folded into redb
//! The log store folds ([`crate::raft::log_store`]) when a record would not fit, after
//! [`crate::raft::log_store::FOLD_AFTER_ENTRIES`] entries, and for every change that is not an
//! append (truncation, purge, vote), which it writes in the same redb transaction. Opening the
//! store folds what the file holds; offline tools ([`crate::raft::offline`]) read it without
//! writing it. So the WAL
//! only ever holds appends made since the last fold, and replaying it needs no truncation or
//! purge records.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use redb::{Database, ReadTransaction, ReadableDatabase, WriteTransaction};

use super::codec::decode;
use super::storage::{KEY_COMMITTED, KEY_WAL, LOG, META, io as io_err};
use super::types::Entry;

/// Name of the WAL file inside the data directory.
pub const WAL_FILE: &str = "raft.wal";
/// Size of the WAL file; a fold makes room again. The most it holds between folds
/// ([`crate::raft::log_store::FOLD_AFTER_ENTRIES`], 512 entries of a few hundred bytes) takes
/// about a tenth of it; appends that do not fit go to redb directly.
pub const WAL_BYTES: u64 = 2 * 1024 * 1024;
/// Bytes before the first record.
pub const HEADER_BYTES: u64 = 4096;

const MAGIC: &[u8; 8] = b"GRINGWAL";
const FORMAT: u32 = 1;
/// len, crc and generation.
const RECORD_HEAD_BYTES: usize = 16;

/// One record's content: what [`encode_payload`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The committed log id's encoding (as redb's `meta` stores it), if one was saved.
    pub committed: Option<Vec<u8>>,
    /// Appended entries: index and encoding (as redb's `log` table stores it).
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// The WAL open for appending, owned by the log store's flusher thread.
pub struct Wal {
    file: File,
    path: PathBuf,
    id: u64,
    generation: u64,
    /// Where the next record goes.
    offset: u64,
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("storage: {}: {what}", path.display()),
    )
}

/// The `wal` value in redb's `meta`: file id and generation.
fn meta_value(id: u64, generation: u64) -> [u8; 16] {
    let mut v = [0; 16];
    v[..8].copy_from_slice(&id.to_be_bytes());
    v[8..].copy_from_slice(&generation.to_be_bytes());
    v
}

/// The WAL a database records (file id, generation); `None` when it records none.
pub fn recorded(txn: &ReadTransaction) -> io::Result<Option<(u64, u64)>> {
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(io_err(e)),
    };
    let Some(v) = meta.get(KEY_WAL).map_err(io_err)? else {
        return Ok(None);
    };
    let bytes = <[u8; 16]>::try_from(v.value()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "storage: `wal` in meta is corrupt",
        )
    })?;
    let id = u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
    let generation = u64::from_be_bytes(bytes[8..].try_into().unwrap_or_default());
    Ok(Some((id, generation)))
}

fn header(id: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES as usize);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&FORMAT.to_le_bytes());
    h.extend_from_slice(&id.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.resize(HEADER_BYTES as usize, 0);
    h
}

/// The file id in a header, or why it is not one.
fn parse_header(bytes: &[u8]) -> Result<u64, &'static str> {
    if bytes.len() < HEADER_BYTES as usize || &bytes[..8] != MAGIC {
        return Err("not a garden-ring WAL file");
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    let id = u64::from_le_bytes(bytes[12..20].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(bytes[20..24].try_into().unwrap_or_default());
    if crc != crc32fast::hash(&bytes[..20]) {
        return Err("its header is damaged");
    }
    if format != FORMAT {
        return Err("it has a WAL format this ringd does not read");
    }
    Ok(id)
}

fn record_crc(generation: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&generation.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The payload of a record holding `committed` (an encoded committed log id) and `entries`.
pub fn encode_payload(committed: Option<&[u8]>, entries: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let size = 5
        + committed.map_or(0, |c| 4 + c.len())
        + entries.iter().map(|(_, b)| 12 + b.len()).sum::<usize>();
    let mut p = Vec::with_capacity(size);
    match committed {
        Some(c) => {
            p.push(1);
            p.extend_from_slice(&(c.len() as u32).to_le_bytes());
            p.extend_from_slice(c);
        }
        None => p.push(0),
    }
    p.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (index, bytes) in entries {
        p.extend_from_slice(&index.to_le_bytes());
        p.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        p.extend_from_slice(bytes);
    }
    debug_assert_eq!(p.len(), size);
    p
}

fn decode_payload(p: &[u8]) -> Option<Record> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = p.split_at_checked(n)?;
        *p = rest;
        Some(head)
    }
    fn u32_of(p: &mut &[u8]) -> Option<u32> {
        take(p, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }
    let mut p = p;
    let committed = match take(&mut p, 1)?[0] {
        0 => None,
        1 => {
            let n = u32_of(&mut p)? as usize;
            Some(take(&mut p, n)?.to_vec())
        }
        _ => return None,
    };
    let count = u32_of(&mut p)? as usize;
    let mut entries = Vec::with_capacity(count.min(p.len() / 12));
    for _ in 0..count {
        let index = u64::from_le_bytes(take(&mut p, 8)?.try_into().unwrap_or_default());
        let n = u32_of(&mut p)? as usize;
        entries.push((index, take(&mut p, n)?.to_vec()));
    }
    p.is_empty().then_some(Record { committed, entries })
}

/// The record at `offset` of `generation`, and where the next one starts; `None` when there is
/// none (zeros, a record of another generation, or one cut short).
fn record_at(file: &[u8], offset: usize, generation: u64) -> Option<(Record, usize)> {
    let head = file.get(offset..offset.checked_add(RECORD_HEAD_BYTES)?)?;
    let len = u32::from_le_bytes(head[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    let found = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    if len == 0 || found != generation {
        return None;
    }
    let start = offset + RECORD_HEAD_BYTES;
    let payload = file.get(start..start.checked_add(len)?)?;
    if record_crc(generation, payload) != crc {
        return None;
    }
    let record = decode_payload(payload)?;
    Some((record, (start + len).next_multiple_of(8)))
}

/// The records of the WAL that `recorded` (from [`recorded`]) names, in the data directory
/// `dir`: empty when the database records no WAL. See the module docs for what is an error.
pub fn read(dir: &Path, recorded: Option<(u64, u64)>) -> io::Result<Vec<Record>> {
    let Some((id, generation)) = recorded else {
        return Ok(Vec::new());
    };
    let path = dir.join(WAL_FILE);
    let file = match std::fs::read(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(invalid(
                &path,
                "is missing, but the database says the newest log entries are in it; put it back \
                 (or, if it is lost, remove this member and add a new one with a new id)",
            ));
        }
        Err(e) => return Err(invalid(&path, e)),
    };
    match parse_header(&file) {
        Ok(found) if found == id => {}
        Ok(_) => {
            return Err(invalid(
                &path,
                "belongs to another database than the ring.redb beside it; put this data \
                 directory's own raft.wal back",
            ));
        }
        Err(why) => return Err(invalid(&path, why)),
    }
    let mut records = Vec::new();
    let mut offset = HEADER_BYTES as usize;
    while let Some((record, next)) = record_at(&file, offset, generation) {
        records.push(record);
        offset = next;
    }
    // What ends the records: zeros or an older generation (the end of what was written), or a
    // record of this generation cut short or damaged, which a crash interrupted before its
    // fdatasync returned (so it was never acknowledged): dropped, and said.
    let torn = match file.get(offset..offset + RECORD_HEAD_BYTES) {
        Some(head) => {
            let len = u32::from_le_bytes(head[0..4].try_into().unwrap_or_default());
            let found = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            len != 0 && found == generation
        }
        None => file
            .get(offset..)
            .is_some_and(|rest| rest.iter().any(|b| *b != 0)),
    };
    if torn {
        tracing::warn!(
            "{}: the record at byte {offset} is torn (cut short or damaged: a write a crash \
             interrupted, never acknowledged); dropped, the log ends before it ({} records kept)",
            path.display(),
            records.len()
        );
    }
    // What ended the records must be the end of what was written: no acknowledged record of
    // this generation may follow.
    let mut probe = offset + 8;
    while probe + RECORD_HEAD_BYTES <= file.len() {
        if record_at(&file, probe, generation).is_some() {
            return Err(invalid(
                &path,
                format!(
                    "the record at byte {offset} is damaged, and log entries written after it \
                     follow; this member's log cannot be trusted (remove this member and add a \
                     new one with a new id)"
                ),
            ));
        }
        probe += 8;
    }
    Ok(records)
}

/// Writes `records` into the log and meta tables of `txn` (entries by index; the newest
/// committed log id) after checking that every entry decodes and sits at its index.
fn fold(txn: &WriteTransaction, records: &[Record]) -> io::Result<()> {
    let mut log = txn.open_table(LOG).map_err(io_err)?;
    let mut committed = None;
    for record in records {
        for (index, bytes) in &record.entries {
            let entry: Entry = decode("log entry", bytes)?;
            let claimed = openraft::entry::RaftEntry::index(&entry);
            if claimed != *index {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("storage: a WAL entry at {index} claims index {claimed}"),
                ));
            }
            log.insert(index, bytes.as_slice()).map_err(io_err)?;
        }
        if let Some(c) = &record.committed {
            committed = Some(c.as_slice());
        }
    }
    if let Some(c) = committed {
        txn.open_table(META)
            .map_err(io_err)?
            .insert(KEY_COMMITTED, c)
            .map_err(io_err)?;
    }
    Ok(())
}

/// Sets the database's WAL to (`id`, `generation`) in `txn`.
pub fn set_recorded(txn: &WriteTransaction, id: u64, generation: u64) -> io::Result<()> {
    txn.open_table(META)
        .map_err(io_err)?
        .insert(KEY_WAL, meta_value(id, generation).as_slice())
        .map_err(io_err)?;
    Ok(())
}

/// Folds what the database's WAL holds into it, in one fsynced transaction that raises the
/// generation; returns the WAL's (id, new generation). Writes nothing, and returns `None`, when
/// the database records no WAL.
fn fold_existing(dir: &Path, db: &Database) -> io::Result<Option<(u64, u64)>> {
    let recorded = recorded(&db.begin_read().map_err(io_err)?)?;
    let Some((id, generation)) = recorded else {
        return Ok(None);
    };
    let records = read(dir, recorded)?;
    let next = generation
        .checked_add(1)
        .ok_or_else(|| io::Error::other("storage: WAL generation overflow"))?;
    let mut txn = db.begin_write().map_err(io_err)?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(io_err)?;
    fold(&txn, &records)?;
    set_recorded(&txn, id, next)?;
    txn.commit().map_err(io_err)?;
    Ok(Some((id, next)))
}

/// A random id for a new WAL file.
fn new_id() -> io::Result<u64> {
    use std::io::Read;
    let mut b = [0u8; 8];
    File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b).max(1))
}

impl Wal {
    /// Opens the WAL of the data directory `dir` (whose database is `db`) for appending: folds
    /// what it holds into `db` first, or, when `db` records none, creates a new file (see the
    /// module docs).
    pub fn open(dir: &Path, db: &Database) -> io::Result<Self> {
        let path = dir.join(WAL_FILE);
        let (id, generation) = match fold_existing(dir, db)? {
            Some(found) => found,
            None => {
                let id = new_id()?;
                create(dir, id)?;
                let mut txn = db.begin_write().map_err(io_err)?;
                txn.set_durability(redb::Durability::Immediate)
                    .map_err(io_err)?;
                set_recorded(&txn, id, 1)?;
                txn.commit().map_err(io_err)?;
                (id, 1)
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| invalid(&path, e))?;
        let len = file.metadata().map_err(|e| invalid(&path, e))?.len();
        if (HEADER_BYTES..WAL_BYTES).contains(&len) {
            // Cut short (a crash while the file was written, a copy that stopped): the records
            // before the cut were read and folded above; the file gets its zeros back, so that
            // later writes land on allocated blocks again.
            tracing::warn!(
                "{}: {len} bytes long, not {WAL_BYTES}: cut short; the records before the cut \
                 were kept, the file is filled up with zeros again",
                path.display()
            );
            let zeros = vec![0u8; 64 * 1024];
            let mut at = len;
            while at < WAL_BYTES {
                let n = (WAL_BYTES - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)
                    .map_err(|e| invalid(&path, e))?;
                at += n as u64;
            }
            file.sync_all().map_err(|e| invalid(&path, e))?;
        } else if len != WAL_BYTES {
            return Err(invalid(
                &path,
                format!("is {len} bytes long, not {WAL_BYTES}"),
            ));
        }
        Ok(Self {
            file,
            path,
            id,
            generation,
            offset: HEADER_BYTES,
        })
    }

    /// Appends a record with `payload` (from [`encode_payload`]) and `fdatasync`s it. `Ok(false)`
    /// when it does not fit: fold, then try again.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<bool> {
        let len =
            u32::try_from(payload.len()).map_err(|_| io::Error::other("WAL record too large"))?;
        let size = (RECORD_HEAD_BYTES + payload.len()).next_multiple_of(8);
        if self.offset + size as u64 > WAL_BYTES {
            return Ok(false);
        }
        let mut buf = Vec::with_capacity(size);
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&record_crc(self.generation, payload).to_le_bytes());
        buf.extend_from_slice(&self.generation.to_le_bytes());
        buf.extend_from_slice(payload);
        buf.resize(size, 0);
        self.file
            .write_all_at(&buf, self.offset)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| invalid(&self.path, format!("cannot write: {e}")))?;
        self.offset += size as u64;
        Ok(true)
    }

    /// The file id, and the generation a fold must record in redb.
    pub fn next(&self) -> (u64, u64) {
        (self.id, self.generation + 1)
    }

    /// After a fold's transaction committed (with [`Self::next`]): the file's records no longer
    /// count, and the next one starts at the beginning.
    pub fn folded(&mut self) {
        self.generation += 1;
        self.offset = HEADER_BYTES;
    }
}

/// Creates `dir/raft.wal` for file id `id`: written in full (header, then zeros) under a
/// temporary name, fsynced, renamed into place, and the directory fsynced.
fn create(dir: &Path, id: u64) -> io::Result<()> {
    let path = dir.join(WAL_FILE);
    let tmp = dir.join(format!(".{WAL_FILE}.new-{}", std::process::id()));
    let result = (|| {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all_at(&header(id), 0)?;
        let zeros = vec![0u8; 1024 * 1024];
        let mut at = HEADER_BYTES;
        while at < WAL_BYTES {
            let n = zeros.len().min((WAL_BYTES - at) as usize);
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        crate::durable::sync_parent_dir(&path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| invalid(&path, format!("cannot create: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::codec::encode;
    use crate::raft::storage;
    use crate::raft::types::log_id;
    use openraft::EntryPayload;
    use redb::ReadableTable;

    fn entry_bytes(index: u64) -> (u64, Vec<u8>) {
        let e = Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Blank,
        };
        (index, encode("log entry", &e).unwrap())
    }

    fn log_indexes(db: &Database) -> Vec<u64> {
        let txn = db.begin_read().unwrap();
        let log = txn.open_table(LOG).unwrap();
        log.iter().unwrap().map(|i| i.unwrap().0.value()).collect()
    }

    /// A data directory with a WAL holding entries `1..=n`, in one record each, not folded.
    fn with_records(n: u64) -> (tempfile::TempDir, (u64, u64)) {
        let dir = tempfile::tempdir().unwrap();
        let db = storage::open(dir.path(), 1).unwrap();
        let mut wal = Wal::open(dir.path(), &db).unwrap();
        for i in 1..=n {
            assert!(
                wal.append(&encode_payload(None, &[entry_bytes(i)]))
                    .unwrap()
            );
        }
        let recorded = recorded(&db.begin_read().unwrap()).unwrap().unwrap();
        assert_eq!(recorded, (wal.id, wal.generation));
        (dir, recorded)
    }

    #[test]
    fn payloads_round_trip() {
        let entries = vec![entry_bytes(7), entry_bytes(8)];
        for committed in [None, Some(&b"{\"x\":1}"[..])] {
            let p = encode_payload(committed, &entries);
            let r = decode_payload(&p).unwrap();
            assert_eq!(r.committed.as_deref(), committed);
            assert_eq!(r.entries, entries);
            assert!(
                decode_payload(&p[..p.len() - 1]).is_none(),
                "short is refused"
            );
        }
    }

    #[test]
    fn records_are_read_back_then_folded_and_never_count_again() {
        let (dir, recorded) = with_records(5);
        let records = read(dir.path(), Some(recorded)).unwrap();
        assert_eq!(records.len(), 5);
        // Folded at the next open: in redb, and the file's records are of an older generation.
        let db = storage::open(dir.path(), 1).unwrap();
        assert!(log_indexes(&db).is_empty(), "not in redb before the fold");
        let mut wal = Wal::open(dir.path(), &db).unwrap();
        assert_eq!(log_indexes(&db), vec![1, 2, 3, 4, 5]);
        assert_eq!(wal.generation, recorded.1 + 1);
        let now = super::recorded(&db.begin_read().unwrap()).unwrap();
        assert!(read(dir.path(), now).unwrap().is_empty());
        // A new record overwrites the first old one; the old ones after it do not count.
        assert!(
            wal.append(&encode_payload(None, &[entry_bytes(6)]))
                .unwrap()
        );
        let records = read(dir.path(), now).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].entries[0].0, 6);
    }

    #[test]
    fn a_record_cut_short_ends_the_log_but_a_damaged_one_before_good_ones_is_an_error() {
        let (dir, recorded) = with_records(3);
        let path = dir.path().join(WAL_FILE);
        let original = std::fs::read(&path).unwrap();
        let record_len = {
            let (_, next) = record_at(&original, HEADER_BYTES as usize, recorded.1).unwrap();
            next - HEADER_BYTES as usize
        };
        // The last record cut short (as a crash in its write leaves it): two records remain.
        let mut torn = original.clone();
        let last = HEADER_BYTES as usize + 2 * record_len;
        for b in &mut torn[last + record_len / 2..last + record_len] {
            *b = 0;
        }
        std::fs::write(&path, &torn).unwrap();
        assert_eq!(read(dir.path(), Some(recorded)).unwrap().len(), 2);
        // The middle record damaged: the third is still there, so this is refused.
        let mut damaged = original.clone();
        damaged[HEADER_BYTES as usize + record_len + RECORD_HEAD_BYTES + 2] ^= 0xff;
        std::fs::write(&path, &damaged).unwrap();
        let e = read(dir.path(), Some(recorded)).unwrap_err().to_string();
        assert!(
            e.contains("is damaged, and log entries written after it follow"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_or_foreign_wal_is_refused_when_the_database_records_one() {
        let (dir, recorded) = with_records(1);
        let path = dir.path().join(WAL_FILE);
        let original = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let e = read(dir.path(), Some(recorded)).unwrap_err().to_string();
        assert!(e.contains("is missing"), "{e}");
        let db = storage::open(dir.path(), 1).unwrap();
        assert!(
            Wal::open(dir.path(), &db).is_err(),
            "ringd does not start without it"
        );
        drop(db);
        // Another database's file.
        let mut foreign = original.clone();
        foreign[..HEADER_BYTES as usize].copy_from_slice(&header(recorded.0 ^ 1));
        std::fs::write(&path, &foreign).unwrap();
        let e = read(dir.path(), Some(recorded)).unwrap_err().to_string();
        assert!(e.contains("belongs to another database"), "{e}");
        // Not a WAL at all.
        std::fs::write(&path, b"hello").unwrap();
        let e = read(dir.path(), Some(recorded)).unwrap_err().to_string();
        assert!(e.contains("not a garden-ring WAL"), "{e}");
        // A database that records none ignores whatever file is there, and gets a new one.
        assert!(read(dir.path(), None).unwrap().is_empty());
    }

    #[test]
    fn a_new_database_does_not_take_an_old_wal_left_in_its_directory() {
        let (dir, _) = with_records(3);
        std::fs::remove_file(dir.path().join(storage::DB_FILE)).unwrap();
        let db = storage::open(dir.path(), 1).unwrap();
        let wal = Wal::open(dir.path(), &db).unwrap();
        assert!(log_indexes(&db).is_empty());
        assert_eq!(wal.generation, 1);
        let now = recorded(&db.begin_read().unwrap()).unwrap();
        assert!(read(dir.path(), now).unwrap().is_empty());
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let db = storage::open(dir.path(), 1).unwrap();
        let mut wal = Wal::open(dir.path(), &db).unwrap();
        let big = vec![0u8; WAL_BYTES as usize];
        assert!(!wal.append(&big).unwrap());
        assert_eq!(wal.offset, HEADER_BYTES, "nothing written");
    }
}

//! The snapshot file of `ringctl snapshot save` and `ringctl snapshot restore`.
//!
//! Layout:
//!
//! ```text
//! garden-ring snapshot\n        magic line
//! {"format":1,...}\n            header: one line of JSON (FileHeader), at most 4 KiB
//! <body>                        the ring's applied state, as a member stores its snapshots
//! ```
//!
//! The header names the format version, the log id the state reflects, who answered and when,
//! and the body's length and SHA-256. Reading checks all of it before anything is used: the
//! magic line, the format version, the exact body length (a truncated or extended file is
//! refused), the checksum, and that the body decodes to a state at the log id the header names.
//! Writing goes to `FILE.tmp`, is fsynced, renamed over `FILE` and the directory fsynced, so a
//! crash leaves no half-written `FILE`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::raft::codec::CODEC_VERSION;
use crate::raft::service::MAX_SNAPSHOT_BYTES;
use crate::raft::state_machine::{Applied, SNAPSHOT_FORMAT, decode_applied};
use crate::tls::material::sha256_hex;

/// The first line of every snapshot file.
pub const MAGIC: &[u8] = b"garden-ring snapshot\n";
/// Version of the file layout and header; bumped when either changes.
pub const FILE_FORMAT: u32 = 1;
/// Longest header line.
const MAX_HEADER_BYTES: usize = 4 * 1024;

/// What a snapshot file says about the state it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHeader {
    /// [`FILE_FORMAT`] when written.
    pub format: u32,
    /// The storage encoding of the body ([`CODEC_VERSION`]).
    pub codec: u32,
    /// The version of the state inside the body ([`SNAPSHOT_FORMAT`]).
    pub snapshot_format: u32,
    /// Index of the last log entry the state reflects.
    pub last_log_index: u64,
    /// Term of that entry.
    pub last_log_term: u64,
    /// The member that answered, e.g. `a (id 1), the leader`.
    pub taken_from: String,
    /// When the state was read, Unix milliseconds.
    pub taken_unix_ms: u64,
    /// Length of the body in bytes.
    pub body_bytes: u64,
    /// SHA-256 of the body, lower-case hex.
    pub body_sha256: String,
}

impl FileHeader {
    /// The same header for a body of codec `codec` (the ring's active version when it was
    /// taken).
    pub fn with_codec(mut self, codec: u32) -> Self {
        self.codec = codec;
        self
    }

    /// The header for `body`, a state at (`last_log_index`, `last_log_term`).
    pub fn for_body(
        body: &[u8],
        last_log_index: u64,
        last_log_term: u64,
        taken_from: String,
        taken_unix_ms: u64,
    ) -> Self {
        Self {
            format: FILE_FORMAT,
            codec: CODEC_VERSION,
            snapshot_format: SNAPSHOT_FORMAT,
            last_log_index,
            last_log_term,
            taken_from,
            taken_unix_ms,
            body_bytes: body.len() as u64,
            body_sha256: sha256_hex(body),
        }
    }
}

/// Why a snapshot file cannot be read or written. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read snapshot file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file cannot be written.
    #[error("cannot write snapshot file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The target exists; nothing is overwritten.
    #[error("{0} exists already; choose another file name or remove it first")]
    Exists(PathBuf),
    /// The file does not start with the magic line.
    #[error(
        "{0} is not a garden-ring snapshot file (it does not start with \"garden-ring snapshot\")"
    )]
    NotSnapshot(PathBuf),
    /// The header line is missing, too long or not valid.
    #[error("{path}: the header is not valid: {why}")]
    Header {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The file was written in a format this binary does not read.
    #[error(
        "{path} is a format {found} snapshot file; this version reads format {FILE_FORMAT} (codecs {}, state {SNAPSHOT_FORMAT})",
        crate::raft::codec::readable()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// What the header says, e.g. `2` or `1 (codec 3)`.
        found: String,
    },
    /// The body is shorter than the header says.
    #[error(
        "{path} is truncated: its header announces {expected} bytes of state, the file holds {found}"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes announced.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The body is longer than the header says.
    #[error(
        "{path} has {found} bytes of state where its header announces {expected}: the file was changed after it was written"
    )]
    TooLong {
        /// The file.
        path: PathBuf,
        /// Bytes announced.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// The body does not match its checksum.
    #[error("{path} is corrupt: the state's SHA-256 is {found}, its header says {expected}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The checksum in the header.
        expected: String,
        /// The checksum of the body.
        found: String,
    },
    /// The body passed its checksum but does not decode, or is not at the header's log id.
    #[error("{path}: the state cannot be used: {why}")]
    Body {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The file is larger than any snapshot can be.
    #[error(
        "{path} is {size} bytes; a snapshot file is at most {MAX_SNAPSHOT_BYTES} bytes of state"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
}

/// The whole file for `header` and `body`.
pub fn encode(header: &FileHeader, body: &[u8]) -> Vec<u8> {
    let line = serde_json::to_vec(header).expect("a header always serializes");
    let mut out = Vec::with_capacity(MAGIC.len() + line.len() + 1 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&line);
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

/// Parses and checks a whole file (`path` only names it in errors); see the module docs.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<(FileHeader, Applied), FileError> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| FileError::NotSnapshot(path.into()))?;
    let header_err = |why: String| FileError::Header {
        path: path.into(),
        why,
    };
    let end = rest
        .iter()
        .take(MAX_HEADER_BYTES + 1)
        .position(|b| *b == b'\n')
        .ok_or_else(|| {
            header_err(if rest.len() <= MAX_HEADER_BYTES {
                "the file ends inside the header (truncated?)".into()
            } else {
                format!("no end of line within {MAX_HEADER_BYTES} bytes")
            })
        })?;
    let header: FileHeader =
        serde_json::from_slice(&rest[..end]).map_err(|e| header_err(e.to_string()))?;
    if header.format != FILE_FORMAT
        || !crate::raft::codec::reads(header.codec)
        || header.snapshot_format != SNAPSHOT_FORMAT
    {
        return Err(FileError::Version {
            path: path.into(),
            found: format!(
                "{} (codec {}, state {})",
                header.format, header.codec, header.snapshot_format
            ),
        });
    }
    let body = &rest[end + 1..];
    let found = body.len() as u64;
    if found < header.body_bytes {
        return Err(FileError::Truncated {
            path: path.into(),
            expected: header.body_bytes,
            found,
        });
    }
    if found > header.body_bytes {
        return Err(FileError::TooLong {
            path: path.into(),
            expected: header.body_bytes,
            found,
        });
    }
    let sum = sha256_hex(body);
    if sum != header.body_sha256 {
        return Err(FileError::Checksum {
            path: path.into(),
            expected: header.body_sha256.clone(),
            found: sum,
        });
    }
    let body_err = |why: String| FileError::Body {
        path: path.into(),
        why,
    };
    let applied = decode_applied(body).map_err(|e| body_err(e.to_string()))?;
    let at = applied
        .last_applied
        .map(|l| (l.index, l.leader_id.term))
        .unwrap_or((0, 0));
    if at != (header.last_log_index, header.last_log_term) {
        return Err(body_err(format!(
            "the state is at log index {} (term {}), the header says {} (term {})",
            at.0, at.1, header.last_log_index, header.last_log_term
        )));
    }
    Ok((header, applied))
}

/// Reads and checks a snapshot file.
pub fn read(path: &Path) -> Result<(FileHeader, Applied), FileError> {
    let read_err = |source| FileError::Read {
        path: path.into(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_err)?.len();
    let limit = MAX_SNAPSHOT_BYTES + (MAGIC.len() + MAX_HEADER_BYTES + 1) as u64;
    if size > limit {
        return Err(FileError::TooLarge {
            path: path.into(),
            size,
        });
    }
    let bytes = std::fs::read(path).map_err(read_err)?;
    decode(path, &bytes)
}

/// Writes `header` and `body` to `path`, which must not exist: to a temporary file of this
/// process beside it first, fsynced, then linked to `path` (which fails, changing nothing, when
/// `path` appeared meanwhile: an existing file is never overwritten), the temporary name
/// removed and the directory fsynced.
pub fn write(path: &Path, header: &FileHeader, body: &[u8]) -> Result<(), FileError> {
    if path.exists() {
        return Err(FileError::Exists(path.into()));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| FileError::Write { path: p, source }
    };
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(write_err(&tmp))?;
        file.write_all(&encode(header, body))
            .map_err(write_err(&tmp))?;
        file.sync_all().map_err(write_err(&tmp))?;
        drop(file);
        std::fs::hard_link(&tmp, path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                FileError::Exists(path.into())
            } else {
                write_err(path)(e)
            }
        })?;
        Ok(())
    })();
    let _ = std::fs::remove_file(&tmp);
    result?;
    crate::durable::sync_parent_dir(path).map_err(write_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (FileHeader, Vec<u8>) {
        let applied = Applied {
            last_applied: Some(crate::raft::types::log_id(3, 1, 42)),
            ..Applied::default()
        };
        let body = crate::raft::state_machine::encode_body(applied).unwrap();
        let header = FileHeader::for_body(&body, 42, 3, "a (id 1), the leader".into(), 5);
        (header, body)
    }

    #[test]
    fn round_trip_and_every_kind_of_damage_is_named() {
        let (header, body) = sample();
        let bytes = encode(&header, &body);
        let path = Path::new("s.snap");
        let (h, applied) = decode(path, &bytes).unwrap();
        assert_eq!(h, header);
        assert_eq!(applied.applied_index(), 42);

        let text = |r: Result<(FileHeader, Applied), FileError>| r.unwrap_err().to_string();
        // Truncated anywhere: in the body, in the header, in the magic line.
        assert!(text(decode(path, &bytes[..bytes.len() - 1])).contains("truncated"));
        let header_end = MAGIC.len() + 10;
        assert!(text(decode(path, &bytes[..header_end])).contains("ends inside the header"));
        assert!(text(decode(path, &bytes[..5])).contains("not a garden-ring snapshot"));
        // Extended.
        let mut longer = bytes.clone();
        longer.push(b'x');
        assert!(text(decode(path, &longer)).contains("was changed after"));
        // One bit flipped in the body, in the header's numbers, in the magic.
        let mut flipped = bytes.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x01;
        assert!(text(decode(path, &flipped)).contains("corrupt"));
        let text_of = |b: &[u8]| text(decode(path, b));
        let at = bytes
            .windows(6)
            .position(|w| w == b":42,\"l")
            .expect("the index in the header");
        let mut index_flipped = bytes.clone();
        index_flipped[at + 2] ^= 0x01; // 42 -> 43
        assert!(text_of(&index_flipped).contains("the header says 43"));
        let mut magic_flipped = bytes.clone();
        magic_flipped[0] ^= 0x20;
        assert!(text_of(&magic_flipped).contains("not a garden-ring snapshot"));
        // Another version.
        let newer = FileHeader {
            format: FILE_FORMAT + 1,
            ..header.clone()
        };
        assert!(text(decode(path, &encode(&newer, &body))).contains("format 2"));
        // Every message names the file.
        assert!(text_of(&flipped).contains("s.snap"));
    }

    #[test]
    fn writing_never_overwrites_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ring.snap");
        let (header, body) = sample();
        write(&path, &header, &body).unwrap();
        assert!(read(&path).is_ok());
        let err = write(&path, &header, &body).unwrap_err();
        assert!(matches!(err, FileError::Exists(_)), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ring.snap")]);
    }
}

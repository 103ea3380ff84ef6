//! Verifying etcd backup snapshots by the sha256 they carry at their end. Pure: no I/O.
//!
//! Both kinds of snapshot etcd-backup-restore writes end with the sha256 of everything before
//! it, 32 raw bytes:
//!
//! - **Full**: etcd's own snapshot, what the `Maintenance.Snapshot` stream carries and what
//!   `etcdctl snapshot save` writes: the backend database (a bbolt file), then its sha256.
//!   `etcdctl snapshot restore` checks the same trailer (it assumes one is there when the size
//!   is a multiple of 512 plus 32).
//! - **Incr** (a "delta snapshot"): a JSON array of watch events
//!   (`[{"etcdEvent":{...},"time":"..."},...]`), then the sha256 of that JSON
//!   (`TakeDeltaSnapshot` in etcd-backup-restore's `pkg/snapshot/snapshotter`; its restorer
//!   refuses one whose size is at most 32 bytes as "missing hash").
//!
//! When the object is compressed (`.gz`, etcd-backup-restore's default; `.zlib`), the whole
//! thing, trailer included, is compressed, so the check runs on the decompressed bytes.
//!
//! [`SnapshotHasher`] checks plain bytes fed in chunks of any size; [`Verifier`] adds
//! decompression and hands the decompressed bytes on (restore writes them to the file it gives
//! `etcdctl`). Neither ever holds more than one chunk (plus its decompressed form).
//!
//! Limits: at most [`MAX_SNAPSHOT_BYTES`] decompressed bytes are accepted (etcd's own backend
//! quota tops out at 8 GiB); more is refused as [`ChecksumError::TooLarge`], which also stops
//! a decompression bomb.

use std::io::Write;

use sha2::{Digest, Sha256};

use crate::core::backup_name::Compression;

/// gzip level (flate2's default, 6: etcd databases compress well already at this level).
pub const GZIP_LEVEL: u32 = 6;

/// Length of the sha256 trailer, in bytes.
pub const SHA256_LEN: usize = 32;

/// Largest (decompressed) snapshot accepted, trailer included: 10 GiB. etcd refuses to raise
/// its backend quota above 8 GiB; the rest is headroom for a database somewhat over its quota.
pub const MAX_SNAPSHOT_BYTES: u64 = 10 * 1024 * 1024 * 1024;

/// Why a snapshot did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    /// Not even one byte before the 32-byte trailer: empty, or cut off.
    #[error(
        "snapshot is truncated: {size_bytes} bytes, but at least {} are needed (content, then its sha256)",
        SHA256_LEN + 1
    )]
    Truncated {
        /// How many (decompressed) bytes there were.
        size_bytes: u64,
    },
    /// The trailer is not the sha256 of what precedes it (a flipped byte, a cut-off file).
    #[error(
        "snapshot checksum mismatch after {size_bytes} bytes: its trailer says sha256 {expected}, its content hashes to {computed}"
    )]
    Mismatch {
        /// The trailer, hex.
        expected: String,
        /// The sha256 of the content, hex.
        computed: String,
        /// How many (decompressed) bytes there were, trailer included.
        size_bytes: u64,
    },
    /// More than [`MAX_SNAPSHOT_BYTES`].
    #[error("snapshot is larger than {max_bytes} bytes (decompressed); refused")]
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// The compressed stream is broken or incomplete.
    #[error("snapshot does not decompress ({compression}): {why}")]
    Decompress {
        /// `gzip` or `zlib`.
        compression: &'static str,
        /// The decoder's complaint.
        why: String,
    },
    /// A compression this build cannot read.
    #[error("snapshot compression {suffix:?} is not supported (only gzip and zlib are)")]
    UnsupportedCompression {
        /// The name suffix, e.g. `.Z`.
        suffix: &'static str,
    },
}

/// A snapshot that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The sha256 of the content (the trailer), hex.
    pub sha256: String,
    /// The (decompressed) size in bytes, trailer included.
    pub size_bytes: u64,
}

/// Streaming check of one uncompressed snapshot: feed it every byte in order
/// ([`update`](Self::update)), then ask for the verdict ([`finish`](Self::finish)).
///
/// It hashes all but the newest 32 bytes it has seen; at the end those 32 are the trailer.
#[derive(Clone)]
pub struct SnapshotHasher {
    hasher: Sha256,
    /// The newest bytes seen, at most [`SHA256_LEN`]: possibly the trailer.
    tail: Vec<u8>,
    size_bytes: u64,
    max_bytes: u64,
}

impl Default for SnapshotHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for SnapshotHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotHasher")
            .field("size_bytes", &self.size_bytes)
            .finish_non_exhaustive()
    }
}

impl SnapshotHasher {
    /// A hasher that has seen nothing.
    pub fn new() -> Self {
        Self::with_max_bytes(MAX_SNAPSHOT_BYTES)
    }

    /// A hasher that refuses more than `max_bytes` (at most [`MAX_SNAPSHOT_BYTES`]).
    pub fn with_max_bytes(max_bytes: u64) -> Self {
        Self {
            hasher: Sha256::new(),
            tail: Vec::with_capacity(2 * SHA256_LEN),
            size_bytes: 0,
            max_bytes: max_bytes.min(MAX_SNAPSHOT_BYTES),
        }
    }

    /// Bytes seen so far.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Feeds the next bytes. Refuses (and from then on stays refused) beyond its limit
    /// ([`MAX_SNAPSHOT_BYTES`] unless made [`with_max_bytes`](Self::with_max_bytes)).
    pub fn update(&mut self, chunk: &[u8]) -> Result<(), ChecksumError> {
        let size = self.size_bytes.saturating_add(chunk.len() as u64);
        if size > self.max_bytes {
            return Err(ChecksumError::TooLarge {
                max_bytes: self.max_bytes,
            });
        }
        self.size_bytes = size;
        if chunk.len() >= SHA256_LEN {
            // Everything held back so far is content now; so is all of the chunk but its end.
            self.hasher.update(&self.tail);
            let (content, tail) = chunk.split_at(chunk.len() - SHA256_LEN);
            self.hasher.update(content);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(chunk);
            if self.tail.len() > SHA256_LEN {
                let spill = self.tail.len() - SHA256_LEN;
                self.hasher.update(&self.tail[..spill]);
                self.tail.drain(..spill);
            }
        }
        Ok(())
    }

    /// The verdict on everything fed.
    pub fn finish(self) -> Result<Verified, ChecksumError> {
        if self.size_bytes <= SHA256_LEN as u64 {
            return Err(ChecksumError::Truncated {
                size_bytes: self.size_bytes,
            });
        }
        let computed = self.hasher.finalize();
        if computed.as_slice() != self.tail.as_slice() {
            return Err(ChecksumError::Mismatch {
                expected: hex(&self.tail),
                computed: hex(&computed),
                size_bytes: self.size_bytes,
            });
        }
        Ok(Verified {
            sha256: hex(&computed),
            size_bytes: self.size_bytes,
        })
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The decompressor's output buffer; cleared before every chunk.
type Out = Vec<u8>;

enum Decoder {
    Plain,
    Gzip(flate2::write::MultiGzDecoder<Out>),
    Zlib(flate2::write::ZlibDecoder<Out>),
}

/// Streaming check of one stored snapshot object, compressed or not: feed it the object's bytes
/// in order ([`feed`](Self::feed), which hands back the decompressed bytes of that chunk), then
/// ask for the verdict ([`finish`](Self::finish)).
pub struct Verifier {
    decoder: Decoder,
    hasher: SnapshotHasher,
    /// Stored (compressed) bytes fed.
    stored_bytes: u64,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("stored_bytes", &self.stored_bytes)
            .field("hasher", &self.hasher)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// A verifier for an object compressed with `compression` (from its name), or plain.
    pub fn new(compression: Option<Compression>) -> Result<Self, ChecksumError> {
        let decoder = match compression {
            None => Decoder::Plain,
            Some(Compression::Gzip) => {
                Decoder::Gzip(flate2::write::MultiGzDecoder::new(Vec::new()))
            }
            Some(Compression::Zlib) => Decoder::Zlib(flate2::write::ZlibDecoder::new(Vec::new())),
            Some(c @ Compression::Lzw) => {
                return Err(ChecksumError::UnsupportedCompression { suffix: c.suffix() });
            }
        };
        Ok(Self {
            decoder,
            hasher: SnapshotHasher::new(),
            stored_bytes: 0,
        })
    }

    /// Stored (possibly compressed) bytes fed so far.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
    }

    /// Feeds the next stored bytes; returns the decompressed bytes they yield (the chunk itself
    /// when the object is not compressed).
    pub fn feed<'a>(&'a mut self, chunk: &'a [u8]) -> Result<&'a [u8], ChecksumError> {
        self.stored_bytes = self.stored_bytes.saturating_add(chunk.len() as u64);
        let out: &'a [u8] = match &mut self.decoder {
            Decoder::Plain => chunk,
            Decoder::Gzip(d) => {
                d.get_mut().clear();
                d.write_all(chunk).map_err(|e| decompress("gzip", &e))?;
                d.get_mut().as_slice()
            }
            Decoder::Zlib(d) => {
                d.get_mut().clear();
                d.write_all(chunk).map_err(|e| decompress("zlib", &e))?;
                d.get_mut().as_slice()
            }
        };
        self.hasher.update(out)?;
        Ok(out)
    }

    /// Ends the stream: returns the last decompressed bytes (empty when not compressed) and
    /// the verdict. A compressed stream that stops early is [`ChecksumError::Decompress`].
    pub fn finish(self) -> Result<(Vec<u8>, Verified), ChecksumError> {
        let Self {
            decoder,
            mut hasher,
            ..
        } = self;
        let rest = match decoder {
            Decoder::Plain => Vec::new(),
            Decoder::Gzip(mut d) => {
                d.get_mut().clear();
                d.finish().map_err(|e| decompress("gzip", &e))?
            }
            Decoder::Zlib(mut d) => {
                d.get_mut().clear();
                d.finish().map_err(|e| decompress("zlib", &e))?
            }
        };
        hasher.update(&rest)?;
        Ok((rest, hasher.finish()?))
    }
}

fn decompress(compression: &'static str, e: &std::io::Error) -> ChecksumError {
    ChecksumError::Decompress {
        compression,
        why: e.to_string(),
    }
}

/// Verifies a whole snapshot held in memory (tests, small delta snapshots).
pub fn verify_bytes(
    compression: Option<Compression>,
    bytes: &[u8],
) -> Result<Verified, ChecksumError> {
    let mut verifier = Verifier::new(compression)?;
    verifier.feed(bytes)?;
    Ok(verifier.finish()?.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `content` followed by its sha256, as etcd and etcd-backup-restore write snapshots.
    fn with_trailer(content: &[u8]) -> Vec<u8> {
        let mut out = content.to_vec();
        out.extend_from_slice(&Sha256::digest(content));
        out
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn zlib(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// Some content that is not all one byte, `len` long.
    fn content(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Feeds `bytes` in chunks of `chunk` bytes.
    fn verify_chunked(
        compression: Option<Compression>,
        bytes: &[u8],
        chunk: usize,
    ) -> Result<(Vec<u8>, Verified), ChecksumError> {
        let mut verifier = Verifier::new(compression)?;
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk) {
            out.extend_from_slice(verifier.feed(piece)?);
        }
        let (rest, verified) = verifier.finish()?;
        out.extend_from_slice(&rest);
        Ok((out, verified))
    }

    #[test]
    fn good_snapshots_verify_whatever_the_chunking() {
        for len in [1, 31, 32, 33, 1000, 70_000] {
            let snap = with_trailer(&content(len));
            let expected = hex(&Sha256::digest(content(len)));
            for chunk in [1, 7, 31, 32, 33, 4096, snap.len()] {
                let (out, v) = verify_chunked(None, &snap, chunk).unwrap();
                assert_eq!(out, snap, "plain output is the input");
                assert_eq!(v.sha256, expected, "len {len} chunk {chunk}");
                assert_eq!(v.size_bytes, snap.len() as u64);
            }
        }
    }

    #[test]
    fn the_hasher_alone_agrees() {
        let snap = with_trailer(b"hello etcd");
        let mut h = SnapshotHasher::new();
        for b in &snap {
            h.update(std::slice::from_ref(b)).unwrap();
        }
        assert_eq!(h.size_bytes(), snap.len() as u64);
        assert_eq!(
            h.finish().unwrap().sha256,
            hex(&Sha256::digest(b"hello etcd"))
        );
    }

    #[test]
    fn empty_and_short_snapshots_are_truncated() {
        for len in [0, 1, 31, 32] {
            let err = verify_bytes(None, &vec![0u8; len]).unwrap_err();
            assert_eq!(
                err,
                ChecksumError::Truncated {
                    size_bytes: len as u64
                }
            );
        }
        // The sha256 of nothing, alone: no content, so no snapshot.
        let err = verify_bytes(None, &with_trailer(b"")).unwrap_err();
        assert!(matches!(err, ChecksumError::Truncated { size_bytes: 32 }));
    }

    #[test]
    fn a_flipped_byte_anywhere_is_a_mismatch() {
        let snap = with_trailer(&content(5000));
        for at in [0, 1, 2500, 4999, 5000, 5031] {
            let mut bad = snap.clone();
            bad[at] ^= 0x01;
            let err = verify_chunked(None, &bad, 1000).unwrap_err();
            let ChecksumError::Mismatch {
                expected,
                computed,
                size_bytes,
            } = err
            else {
                panic!("byte {at}: {err}");
            };
            assert_ne!(expected, computed);
            assert_eq!(size_bytes, snap.len() as u64);
            assert_eq!(expected.len(), 64);
        }
    }

    #[test]
    fn a_cut_off_snapshot_is_a_mismatch() {
        let snap = with_trailer(&content(5000));
        for keep in [33, 100, 5000, 5031] {
            let err = verify_bytes(None, &snap[..keep]).unwrap_err();
            assert!(
                matches!(err, ChecksumError::Mismatch { .. }),
                "{keep}: {err}"
            );
        }
    }

    #[test]
    fn gzip_and_zlib_verify_after_decompression() {
        let snap = with_trailer(&content(100_000));
        for (compression, stored) in [
            (Compression::Gzip, gzip(&snap)),
            (Compression::Zlib, zlib(&snap)),
        ] {
            for chunk in [1, 100, 8192, stored.len()] {
                let (out, v) = verify_chunked(Some(compression), &stored, chunk).unwrap();
                assert_eq!(out, snap, "{compression:?} decompresses to the snapshot");
                assert_eq!(v.size_bytes, snap.len() as u64);
            }
        }
    }

    #[test]
    fn gzip_of_a_bad_snapshot_is_a_mismatch() {
        let mut snap = with_trailer(&content(10_000));
        snap[42] ^= 0x80;
        let err = verify_bytes(Some(Compression::Gzip), &gzip(&snap)).unwrap_err();
        assert!(matches!(err, ChecksumError::Mismatch { .. }), "{err}");
    }

    #[test]
    fn corrupt_or_cut_off_gzip_is_refused() {
        let stored = gzip(&with_trailer(&content(100_000)));
        // Cut off: the decoder wants more, or the content does not hash right.
        for keep in [0, 5, stored.len() / 2, stored.len() - 4, stored.len() - 1] {
            let err = verify_bytes(Some(Compression::Gzip), &stored[..keep]).unwrap_err();
            assert!(
                matches!(
                    err,
                    ChecksumError::Decompress { .. }
                        | ChecksumError::Mismatch { .. }
                        | ChecksumError::Truncated { .. }
                ),
                "keep {keep}: {err}"
            );
        }
        // A flipped byte in the compressed data (past the 10-byte header).
        for at in [20, stored.len() / 2, stored.len() - 6] {
            let mut bad = stored.clone();
            bad[at] ^= 0x10;
            assert!(
                verify_bytes(Some(Compression::Gzip), &bad).is_err(),
                "flip at {at} accepted"
            );
        }
        // Not gzip at all.
        let err = verify_bytes(Some(Compression::Gzip), &with_trailer(b"plain")).unwrap_err();
        assert!(matches!(err, ChecksumError::Decompress { .. }), "{err}");
    }

    #[test]
    fn lzw_is_reported_unsupported() {
        let err = Verifier::new(Some(Compression::Lzw)).unwrap_err();
        assert_eq!(err, ChecksumError::UnsupportedCompression { suffix: ".Z" });
    }

    #[test]
    fn delta_snapshots_verify_the_same_way() {
        // The shape TakeDeltaSnapshot writes: a JSON array of timed events, then its sha256.
        let events = br#"[{"etcdEvent":{"kv":{"key":"Zm9v","create_revision":2,"mod_revision":2,"version":1,"value":"YmFy"}},"time":"2024-01-01T00:00:00Z"}]"#;
        let delta = with_trailer(events);
        assert!(verify_bytes(None, &delta).is_ok());
        assert!(verify_bytes(Some(Compression::Gzip), &gzip(&delta)).is_ok());
        let mut bad = delta.clone();
        bad[10] = b'X';
        assert!(matches!(
            verify_bytes(None, &bad),
            Err(ChecksumError::Mismatch { .. })
        ));
    }

    #[test]
    fn too_large_is_refused_and_stays_refused() {
        let mut h = SnapshotHasher::with_max_bytes(100);
        h.update(&[0; 60]).unwrap();
        assert_eq!(
            h.update(&[0; 41]),
            Err(ChecksumError::TooLarge { max_bytes: 100 })
        );
        assert!(h.update(&[0; 41]).is_err());
        h.update(&[0; 40]).unwrap();
        assert_eq!(h.size_bytes(), 100);
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}

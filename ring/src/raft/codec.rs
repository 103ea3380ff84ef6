//! Encoding of everything Raft persists or sends: log entries, votes, snapshots, peer messages.
//!
//! JSON (serde_json) for now: openraft's serde derives are tested with it, and a log that an
//! operator can read with `redb`-tools or a hex dump is worth a few microseconds per entry. The
//! version number travels with every peer message and is stored in the data directory, so a
//! binary codec can replace it later without ambiguity.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The codec of ring version 1 (release 0.1.0), what a new data directory starts with.
///
/// A member sends its ring's active version (see [`crate::core::ring_version`]) as the codec
/// number of every peer message and stores it in its data directory; release 0.1.0 accepts
/// codec 1 only, so once the ring's version is raised it can neither talk to the ring nor
/// open a data directory the newer binary wrote, and says so naming both numbers.
pub const CODEC_VERSION: u32 = crate::core::ring_version::INITIAL_RING_VERSION;

/// Whether this build reads peer messages and data of codec `codec`: those of every ring
/// version it runs at.
pub fn reads(codec: u32) -> bool {
    crate::core::ring_version::Supported::THIS_BUILD.runs(codec)
}

/// The codecs this build reads, in words: `1-2`.
pub fn readable() -> String {
    let s = crate::core::ring_version::Supported::THIS_BUILD;
    format!("{}-{}", s.min, s.max)
}

/// A value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("cannot {verb} {what}: {source}")]
pub struct CodecError {
    verb: &'static str,
    what: &'static str,
    #[source]
    source: serde_json::Error,
}

/// Encodes `value`; `what` names it in errors.
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    serde_json::to_vec(value).map_err(|source| CodecError {
        verb: "encode",
        what,
        source,
    })
}

/// Decodes `bytes`; `what` names it in errors.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    serde_json::from_slice(bytes).map_err(|source| CodecError {
        verb: "decode",
        what,
        source,
    })
}

impl From<CodecError> for std::io::Error {
    fn from(e: CodecError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

//! Names of etcd backup snapshots, exactly as etcd-backup-restore (`etcdbrctl`, the backup
//! sidecar of Gardener's etcd-druid) writes them in an object store, layout version 2:
//!
//! ```text
//! <prefix>/v2/<Kind>-<startRevision>-<lastRevision>-<createdOn>[<compression>][.final]
//!
//! shoot--dev--ring-a/etcd-main/v2/Full-00000000-00012345-1700000000.gz
//! shoot--dev--ring-a/etcd-main/v2/Incr-00012346-00012399-1700000060.gz
//! shoot--dev--ring-a/etcd-main/v2/Full-00000000-00012399-1700000120.gz.final
//! ```
//!
//! - `Kind` is `Full` (a whole etcd snapshot, start revision 0 in practice) or `Incr` (the
//!   events from `startRevision` to `lastRevision`).
//! - The revisions are written with Go's `%08d`: at least eight digits, zero-padded; the time
//!   is Unix seconds with `%d`.
//! - The compression suffix is `.gz` (gzip, the default), `.Z` (lzw) or `.zlib`, or absent.
//! - `.final` marks the last full snapshot taken when etcd stopped.
//!
//! (See `GenerateSnapshotName` in `pkg/types/snapstore.go` and `ParseSnapshot` in
//! `pkg/snapstore/snapshot.go` of gardener/etcd-backup-restore.)
//!
//! [`SnapshotPath::parse`] is stricter than etcd-backup-restore's own parser, on purpose: names
//! come from an object store anybody with write access to the bucket can fill. It accepts only
//! the canonical form [`SnapshotPath`]'s `Display` writes, so parsing and formatting round-trip
//! exactly; an unknown compression suffix, a `Chunk` or layout-v1 object, a prefix with `..`,
//! a revision or time that does not fit etcd's signed 64-bit numbers, and a last revision below
//! the start revision are all refused with a [`BackupNameError`].

use std::fmt;

use super::error::shorten;
use super::limits::{MAX_SNAPSHOT_KEY_LEN, MAX_SNAPSHOT_NAME_LEN, MAX_SNAPSHOT_NUMBER};
use super::names::check_backup_prefix;

/// The directory etcd-backup-restore puts under the configured prefix for layout version 2.
pub const LAYOUT_V2: &str = "v2";
/// The suffix of a final full snapshot.
pub const FINAL_SUFFIX: &str = ".final";
/// Digits Go's `%08d` pads revisions to.
const REVISION_WIDTH: usize = 8;

/// Why a snapshot name or path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackupNameError {
    /// The whole key or the file name is too long.
    #[error("{what} is {len} bytes long; at most {max} are accepted")]
    TooLong {
        /// "snapshot key" or "snapshot name".
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The prefix before `/v2/` is not acceptable (path traversal, odd characters).
    #[error("snapshot prefix {prefix:?} {why}")]
    Prefix {
        /// The prefix (shortened).
        prefix: String,
        /// What is wrong with it.
        why: String,
    },
    /// The key is not `<prefix>/v2/<name>`.
    #[error(
        "snapshot key {key:?} is not <prefix>/v2/<name> (only layout v2 is supported; chunks of unfinished uploads are not snapshots)"
    )]
    Layout {
        /// The key (shortened).
        key: String,
    },
    /// The name is not `<Kind>-<start>-<last>-<time>`.
    #[error("snapshot name {name:?} is not <Full|Incr>-<startRevision>-<lastRevision>-<unix time>")]
    Shape {
        /// The name (shortened).
        name: String,
    },
    /// The kind is neither `Full` nor `Incr`.
    #[error("snapshot kind {kind:?} is unknown (expected Full or Incr)")]
    Kind {
        /// The kind (shortened).
        kind: String,
    },
    /// A revision or the time is not a canonical number in range.
    #[error("{field} {value:?} {why}")]
    Number {
        /// "start revision", "last revision" or "creation time".
        field: &'static str,
        /// The text (shortened).
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The last revision is below the start revision.
    #[error("last revision {last} is below start revision {start}")]
    RevisionOrder {
        /// Start revision.
        start: u64,
        /// Last revision.
        last: u64,
    },
    /// Something follows the time that is not a known compression or `.final` suffix.
    #[error(
        "snapshot suffix {suffix:?} is unknown (expected .gz, .Z or .zlib, then optionally .final)"
    )]
    Suffix {
        /// The suffix (shortened).
        suffix: String,
    },
}

/// Full or incremental.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotKind {
    /// A whole etcd snapshot (`Full`).
    Full,
    /// The events between two revisions (`Incr`, a "delta snapshot").
    Incr,
}

impl SnapshotKind {
    /// How the kind is written in names.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Full => "Full",
            SnapshotKind::Incr => "Incr",
        }
    }
}

/// How the snapshot's bytes are compressed, from the name's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// gzip, suffix `.gz` (etcd-backup-restore's default policy).
    Gzip,
    /// LZW, suffix `.Z`.
    Lzw,
    /// zlib, suffix `.zlib`.
    Zlib,
}

impl Compression {
    /// Every compression, for matching suffixes.
    pub const ALL: [Compression; 3] = [Compression::Gzip, Compression::Lzw, Compression::Zlib];

    /// The suffix in names, dot included.
    pub fn suffix(self) -> &'static str {
        match self {
            Compression::Gzip => ".gz",
            Compression::Lzw => ".Z",
            Compression::Zlib => ".zlib",
        }
    }
}

/// A snapshot's file name, the last segment of its key: `Full-00000000-00012345-1700000000.gz`.
///
/// Built only by [`SnapshotName::new`] or [`SnapshotName::parse`], so it always formats to a
/// name that parses back to itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SnapshotName {
    kind: SnapshotKind,
    start_revision: u64,
    last_revision: u64,
    created_unix_s: u64,
    compression: Option<Compression>,
    is_final: bool,
}

impl SnapshotName {
    /// An uncompressed, not final snapshot name. Revisions and time must be at most
    /// [`MAX_SNAPSHOT_NUMBER`], and `last_revision` at least `start_revision`.
    pub fn new(
        kind: SnapshotKind,
        start_revision: u64,
        last_revision: u64,
        created_unix_s: u64,
    ) -> Result<Self, BackupNameError> {
        for (field, value) in [
            ("start revision", start_revision),
            ("last revision", last_revision),
            ("creation time", created_unix_s),
        ] {
            if value > MAX_SNAPSHOT_NUMBER {
                return Err(too_big(field, &value.to_string()));
            }
        }
        if last_revision < start_revision {
            return Err(BackupNameError::RevisionOrder {
                start: start_revision,
                last: last_revision,
            });
        }
        Ok(Self {
            kind,
            start_revision,
            last_revision,
            created_unix_s,
            compression: None,
            is_final: false,
        })
    }

    /// The same name with this compression suffix (or none).
    pub fn with_compression(self, compression: Option<Compression>) -> Self {
        Self {
            compression,
            ..self
        }
    }

    /// The same name, marked final or not.
    pub fn with_final(self, is_final: bool) -> Self {
        Self { is_final, ..self }
    }

    /// Full or incremental.
    pub fn kind(&self) -> SnapshotKind {
        self.kind
    }

    /// First etcd revision the snapshot covers.
    pub fn start_revision(&self) -> u64 {
        self.start_revision
    }

    /// Last etcd revision the snapshot covers.
    pub fn last_revision(&self) -> u64 {
        self.last_revision
    }

    /// When etcd-backup-restore took it, in Unix seconds.
    pub fn created_unix_s(&self) -> u64 {
        self.created_unix_s
    }

    /// The compression named by the suffix, if any.
    pub fn compression(&self) -> Option<Compression> {
        self.compression
    }

    /// Whether this is the final full snapshot taken when etcd stopped.
    pub fn is_final(&self) -> bool {
        self.is_final
    }

    /// Parses a file name in its canonical form (see the [module docs](self)).
    pub fn parse(name: &str) -> Result<Self, BackupNameError> {
        if name.len() > MAX_SNAPSHOT_NAME_LEN {
            return Err(BackupNameError::TooLong {
                what: "snapshot name",
                len: name.len(),
                max: MAX_SNAPSHOT_NAME_LEN,
            });
        }
        let shape = || BackupNameError::Shape {
            name: shorten(name),
        };
        let mut parts = name.splitn(4, '-');
        let (Some(kind), Some(start), Some(last), Some(rest)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(shape());
        };
        let kind = match kind {
            "Full" => SnapshotKind::Full,
            "Incr" => SnapshotKind::Incr,
            other => {
                return Err(BackupNameError::Kind {
                    kind: shorten(other),
                });
            }
        };
        let start = parse_revision("start revision", start)?;
        let last = parse_revision("last revision", last)?;
        // The time runs up to the first '.', where the suffixes begin.
        let (time, suffix) = rest.split_at(rest.find('.').unwrap_or(rest.len()));
        if time.contains('-') {
            return Err(shape());
        }
        let created = parse_time(time)?;
        let (compression, is_final) = parse_suffix(suffix)?;
        Ok(Self::new(kind, start, last, created)?
            .with_compression(compression)
            .with_final(is_final))
    }
}

impl fmt::Display for SnapshotName {
    /// Writes the name as etcd-backup-restore's `GenerateSnapshotName` does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{:0width$}-{:0width$}-{}{}{}",
            self.kind.as_str(),
            self.start_revision,
            self.last_revision,
            self.created_unix_s,
            self.compression.map_or("", Compression::suffix),
            if self.is_final { FINAL_SUFFIX } else { "" },
            width = REVISION_WIDTH,
        )
    }
}

/// The store prefix a backup location names (`shoot--dev--ring-a/etcd-main`), checked by
/// [`check_backup_prefix`]: no `..`, no absolute path, printable ASCII. May be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BackupPrefix(String);

impl BackupPrefix {
    /// Checks and wraps a prefix.
    pub fn new(prefix: &str) -> Result<Self, BackupNameError> {
        check_backup_prefix(prefix).map_err(|why| BackupNameError::Prefix {
            prefix: shorten(prefix),
            why: why.into(),
        })?;
        Ok(Self(prefix.to_string()))
    }

    /// The prefix, without a trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A snapshot's whole object key: `<prefix>/v2/<name>`, or `v2/<name>` with an empty prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotPath {
    prefix: BackupPrefix,
    name: SnapshotName,
}

impl SnapshotPath {
    /// The key of snapshot `name` under `prefix`, refused when it would be longer than
    /// [`MAX_SNAPSHOT_KEY_LEN`].
    pub fn new(prefix: BackupPrefix, name: SnapshotName) -> Result<Self, BackupNameError> {
        let path = Self { prefix, name };
        let len = path.to_string().len();
        if len > MAX_SNAPSHOT_KEY_LEN {
            return Err(BackupNameError::TooLong {
                what: "snapshot key",
                len,
                max: MAX_SNAPSHOT_KEY_LEN,
            });
        }
        Ok(path)
    }

    /// The store prefix.
    pub fn prefix(&self) -> &BackupPrefix {
        &self.prefix
    }

    /// The file name.
    pub fn name(&self) -> &SnapshotName {
        &self.name
    }

    /// Parses an object key in its canonical form (see the [module docs](self)).
    pub fn parse(key: &str) -> Result<Self, BackupNameError> {
        if key.len() > MAX_SNAPSHOT_KEY_LEN {
            return Err(BackupNameError::TooLong {
                what: "snapshot key",
                len: key.len(),
                max: MAX_SNAPSHOT_KEY_LEN,
            });
        }
        let layout = || BackupNameError::Layout { key: shorten(key) };
        let (dir, name) = key.rsplit_once('/').ok_or_else(layout)?;
        let prefix = match dir.rsplit_once('/') {
            // "/v2/...": an absolute key with an empty prefix, which would format without the
            // leading '/'.
            Some(("", LAYOUT_V2)) => {
                return Err(BackupNameError::Prefix {
                    prefix: "/".into(),
                    why: "must not start with '/' (keys are relative to the bucket)".into(),
                });
            }
            Some((prefix, LAYOUT_V2)) => prefix,
            None if dir == LAYOUT_V2 => "",
            _ => return Err(layout()),
        };
        Self::new(BackupPrefix::new(prefix)?, SnapshotName::parse(name)?)
    }
}

impl fmt::Display for SnapshotPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.prefix.0.is_empty() {
            write!(f, "{}/", self.prefix.0)?;
        }
        write!(f, "{LAYOUT_V2}/{}", self.name)
    }
}

fn too_big(field: &'static str, value: &str) -> BackupNameError {
    BackupNameError::Number {
        field,
        value: shorten(value),
        why: format!("is above {MAX_SNAPSHOT_NUMBER} (etcd's largest signed 64-bit number)"),
    }
}

/// Decimal digits only, parsed without overflow and at most [`MAX_SNAPSHOT_NUMBER`].
fn parse_number(field: &'static str, text: &str) -> Result<u64, BackupNameError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BackupNameError::Number {
            field,
            value: shorten(text),
            why: "must be decimal digits".into(),
        });
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| *n <= MAX_SNAPSHOT_NUMBER)
        .ok_or_else(|| too_big(field, text))
}

/// A revision as `%08d` writes it: eight digits, or more without a leading zero.
fn parse_revision(field: &'static str, text: &str) -> Result<u64, BackupNameError> {
    let value = parse_number(field, text)?;
    if text.len() < REVISION_WIDTH || (text.len() > REVISION_WIDTH && text.starts_with('0')) {
        return Err(BackupNameError::Number {
            field,
            value: shorten(text),
            why: format!(
                "must be written with {REVISION_WIDTH} digits, zero-padded (more only without leading zeros)"
            ),
        });
    }
    Ok(value)
}

/// A time as `%d` writes it: no leading zero (except `0` itself).
fn parse_time(text: &str) -> Result<u64, BackupNameError> {
    let field = "creation time";
    let value = parse_number(field, text)?;
    if text.len() > 1 && text.starts_with('0') {
        return Err(BackupNameError::Number {
            field,
            value: shorten(text),
            why: "must not have leading zeros".into(),
        });
    }
    Ok(value)
}

/// `[.gz|.Z|.zlib][.final]`, in that order, each at most once.
fn parse_suffix(suffix: &str) -> Result<(Option<Compression>, bool), BackupNameError> {
    let (rest, is_final) = match suffix.strip_suffix(FINAL_SUFFIX) {
        Some(rest) => (rest, true),
        None => (suffix, false),
    };
    if rest.is_empty() {
        return Ok((None, is_final));
    }
    Compression::ALL
        .into_iter()
        .find(|c| c.suffix() == rest)
        .map(|c| (Some(c), is_final))
        .ok_or_else(|| BackupNameError::Suffix {
            suffix: shorten(suffix),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names as etcdbrctl writes them (from etcd-backup-restore's own tests and a live bucket).
    const REAL: &[&str] = &[
        "v2/Full-00000000-00030009-1518427675",
        "v2/Full-00000000-00030009-1518427675.gz",
        "v2/Full-00000000-00030009-1518427675.final",
        "v2/Full-00000000-00030009-1518427675.gz.final",
        "/abc/v2/Full-00000000-00002088-2387428",
        "shoot--dev--ring-a--5f3c9e/etcd-main/v2/Full-00000000-00012345-1700000000.gz",
        "shoot--dev--ring-a--5f3c9e/etcd-main/v2/Incr-00012346-00012399-1700000060.gz",
        "shoot--dev--ring-a--5f3c9e/etcd-events/v2/Incr-00012346-00012346-1700000060.Z",
        "etcd-main/v2/Full-00000000-123456789-1700000120.zlib.final",
    ];

    #[test]
    fn parses_the_names_etcdbrctl_writes() {
        let path = SnapshotPath::parse(
            "shoot--dev--ring-a--5f3c9e/etcd-main/v2/Incr-00012346-00012399-1700000060.gz",
        )
        .unwrap();
        assert_eq!(
            path.prefix().as_str(),
            "shoot--dev--ring-a--5f3c9e/etcd-main"
        );
        let name = path.name();
        assert_eq!(name.kind(), SnapshotKind::Incr);
        assert_eq!(name.start_revision(), 12_346);
        assert_eq!(name.last_revision(), 12_399);
        assert_eq!(name.created_unix_s(), 1_700_000_060);
        assert_eq!(name.compression(), Some(Compression::Gzip));
        assert!(!name.is_final());

        let last = SnapshotPath::parse(REAL[8]).unwrap();
        assert_eq!(last.name().kind(), SnapshotKind::Full);
        assert_eq!(last.name().last_revision(), 123_456_789);
        assert_eq!(last.name().compression(), Some(Compression::Zlib));
        assert!(last.name().is_final());

        let bare = SnapshotPath::parse("v2/Full-00000000-00030009-1518427675.final").unwrap();
        assert_eq!(bare.prefix().as_str(), "");
        assert_eq!(bare.name().compression(), None);
        assert!(bare.name().is_final());
    }

    #[test]
    fn real_names_round_trip_exactly() {
        // "/abc/v2/..." is a local-disk layout: an absolute prefix, refused here.
        for key in REAL.iter().filter(|k| !k.starts_with('/')) {
            let path = SnapshotPath::parse(key).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(path.to_string(), *key);
            assert_eq!(SnapshotPath::parse(&path.to_string()), Ok(path));
        }
    }

    #[test]
    fn built_names_format_like_generate_snapshot_name() {
        let name = SnapshotName::new(SnapshotKind::Full, 0, 2088, 2_387_428).unwrap();
        assert_eq!(name.to_string(), "Full-00000000-00002088-2387428");
        let name = name
            .with_compression(Some(Compression::Lzw))
            .with_final(true);
        assert_eq!(name.to_string(), "Full-00000000-00002088-2387428.Z.final");
        let big = SnapshotName::new(
            SnapshotKind::Incr,
            MAX_SNAPSHOT_NUMBER,
            MAX_SNAPSHOT_NUMBER,
            MAX_SNAPSHOT_NUMBER,
        )
        .unwrap();
        let path = SnapshotPath::new(BackupPrefix::new("p").unwrap(), big).unwrap();
        assert_eq!(
            path.to_string(),
            "p/v2/Incr-9223372036854775807-9223372036854775807-9223372036854775807"
        );
        assert_eq!(SnapshotPath::parse(&path.to_string()), Ok(path));
    }

    #[test]
    fn constructors_refuse_what_parse_would_refuse() {
        assert_eq!(
            SnapshotName::new(SnapshotKind::Incr, 10, 9, 0),
            Err(BackupNameError::RevisionOrder { start: 10, last: 9 })
        );
        for (start, last, time) in [(MAX_SNAPSHOT_NUMBER + 1, u64::MAX, 0), (0, 0, u64::MAX)] {
            let err = SnapshotName::new(SnapshotKind::Full, start, last, time).unwrap_err();
            assert!(matches!(err, BackupNameError::Number { .. }), "{err}");
        }
        for bad in ["..", "a/../b", "/abs", "a/", "a b"] {
            let err = BackupPrefix::new(bad).unwrap_err();
            assert!(
                matches!(err, BackupNameError::Prefix { .. }),
                "{bad}: {err}"
            );
        }
        let name = SnapshotName::new(SnapshotKind::Full, 0, 1, 1).unwrap();
        let long = BackupPrefix::new(&"x".repeat(MAX_SNAPSHOT_KEY_LEN - 10)).unwrap();
        let err = SnapshotPath::new(long, name).unwrap_err();
        assert!(matches!(err, BackupNameError::TooLong { .. }), "{err}");
    }

    fn variant(err: &BackupNameError) -> &'static str {
        match err {
            BackupNameError::TooLong { .. } => "TooLong",
            BackupNameError::Prefix { .. } => "Prefix",
            BackupNameError::Layout { .. } => "Layout",
            BackupNameError::Shape { .. } => "Shape",
            BackupNameError::Kind { .. } => "Kind",
            BackupNameError::Number { .. } => "Number",
            BackupNameError::RevisionOrder { .. } => "RevisionOrder",
            BackupNameError::Suffix { .. } => "Suffix",
        }
    }

    #[test]
    fn refuses_garbage_and_traversal() {
        let cases: &[(&str, &str)] = &[
            // Traversal and absolute prefixes.
            ("../v2/Full-00000000-00000001-1", "Prefix"),
            ("a/../../etc/v2/Full-00000000-00000001-1", "Prefix"),
            ("/etc/v2/Full-00000000-00000001-1", "Prefix"),
            // Found by the backup_name fuzz target: accepted, and formatted without the '/'.
            ("/v2/Full-00000000-00012345-1700000000.gz", "Prefix"),
            ("a//v2/Full-00000000-00000001-1", "Prefix"),
            ("a\\..\\b/v2/Full-00000000-00000001-1", "Prefix"),
            // Not layout v2: no v2, v1 with its Backup-<time> directory, chunks, bare names.
            ("Full-00000000-00000001-1", "Layout"),
            ("/abc/Full-00000000-00002088-2387428", "Layout"),
            (
                "p/v1/Backup-2387428/Full-00000000-00002088-2387428",
                "Layout",
            ),
            ("p/v2/Full-00000000-00002088-2387428/0000000001", "Layout"),
            ("p/xv2/Full-00000000-00000001-1", "Layout"),
            // Name shape.
            ("v2/", "Shape"),
            ("v2/Full-00000000-00002088-2387428-43", "Shape"),
            ("v2/Full-00000000-00002088", "Shape"),
            ("v2/meta-00000000-00002088-2387428", "Kind"),
            ("v2/Backup--00000000-00002088-2387428", "Kind"),
            ("v2/Chunk-00000000-00002088-2387428", "Kind"),
            ("v2/full-00000000-00002088-2387428", "Kind"),
            // Numbers.
            ("v2/Full-00h000000-00002088-2387428", "Number"),
            ("v2/Full-00000000-00sdf002088-2387428", "Number"),
            ("v2/Full-00000000-00002088-23874sdf43", "Number"),
            ("v2/Full-0-00002088-2387428", "Number"),
            ("v2/Full-000000000-00002088-2387428", "Number"),
            ("v2/Full-+0000000-00002088-2387428", "Number"),
            ("v2/Full-00000000-00002088-02387428", "Number"),
            ("v2/Full-00000000-00002088-", "Number"),
            ("v2/Full-00000000-9223372036854775808-1", "Number"),
            ("v2/Full-00000000-99999999999999999999999-1", "Number"),
            ("v2/Full-00000000-00000001-9223372036854775808", "Number"),
            ("v2/Full-00000000-0000000\u{661}-1", "Number"),
            // Revisions out of order.
            ("v2/Full-00012345-00002088-2387428", "RevisionOrder"),
            // Suffixes: unknown, doubled, in the wrong order, case.
            ("v2/Full-00000000-00002088-2387428.bz2", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.gz.gz", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.final.gz", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.final.final", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.GZ", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.", "Suffix"),
            ("v2/Full-00000000-00002088-2387428.gz/", "Layout"),
        ];
        for (key, expected) in cases {
            match SnapshotPath::parse(key) {
                Ok(path) => panic!("{key:?} accepted as {path:?}"),
                Err(err) => assert_eq!(variant(&err), *expected, "{key:?}: {err}"),
            }
        }
    }

    #[test]
    fn refuses_long_input_before_looking_at_it() {
        let key = format!(
            "{}/v2/Full-00000000-00000001-1",
            "a".repeat(MAX_SNAPSHOT_KEY_LEN)
        );
        let err = SnapshotPath::parse(&key).unwrap_err();
        assert!(matches!(err, BackupNameError::TooLong { .. }), "{err}");
        let name = format!("Full-00000000-{}-1", "1".repeat(MAX_SNAPSHOT_NAME_LEN));
        let err = SnapshotName::parse(&name).unwrap_err();
        assert!(matches!(err, BackupNameError::TooLong { .. }), "{err}");
        // Error messages quote at most 80 bytes of the input.
        let err = SnapshotPath::parse(&format!("{}/x", "a".repeat(900))).unwrap_err();
        assert!(err.to_string().len() < 300, "{err}");
    }
}

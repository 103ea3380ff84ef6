//! Limits on everything the ring stores or accepts. A request beyond a limit is refused with a
//! clear error instead of growing memory, the log or a snapshot without bound.

/// Most members a ring may register (voters and learners together).
pub const MAX_MEMBERS: usize = 64;
/// Most control planes a ring may hold.
pub const MAX_CONTROL_PLANES: usize = 100_000;
/// Events kept in the history; older ones are dropped first.
pub const HISTORY_LIMIT: usize = 1_000;
/// Longest DNS name (RFC 1035, without the trailing dot).
pub const MAX_DNS_NAME_LEN: usize = 253;
/// Longest DNS label.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest `host:port` address.
pub const MAX_ADDRESS_LEN: usize = 261;
/// Longest backup location URL.
pub const MAX_URL_LEN: usize = 1_024;
/// Longest free text (a reason, an actor).
pub const MAX_TEXT_LEN: usize = 512;
/// Largest encoded proposal accepted into the log, in bytes.
pub const MAX_PROPOSAL_BYTES: usize = 64 * 1024;
/// Longest object key of an etcd backup snapshot (`<prefix>/v2/<name>`), in bytes. S3, GCS and
/// Azure all cap object names at 1 024 bytes.
pub const MAX_SNAPSHOT_KEY_LEN: usize = 1_024;
/// Longest snapshot file name (`Full-<rev>-<rev>-<unix s>.zlib.final` needs at most 75).
pub const MAX_SNAPSHOT_NAME_LEN: usize = 128;
/// Highest etcd revision and snapshot timestamp: etcd and etcd-backup-restore store both as
/// signed 64-bit numbers.
pub const MAX_SNAPSHOT_NUMBER: u64 = i64::MAX as u64;
/// Shortest DNS TTL a record may have, in seconds (0 would disable caching altogether).
pub const MIN_TTL_S: u32 = 1;
/// Longest DNS TTL a record may have, in seconds (one day): a wrong record must not be cached
/// for longer than an operator is willing to wait.
pub const MAX_TTL_S: u32 = 86_400;
/// Most record changes in one DNS UPDATE message.
pub const MAX_DNS_UPDATE_CHANGES: usize = 256;
/// Largest encoded DNS UPDATE message, in bytes: 65 535 is the most a DNS message can be (the
/// TCP length prefix is 16 bits); 1 KiB of that is kept free for the TSIG record a signer
/// appends.
pub const MAX_DNS_UPDATE_BYTES: usize = 65_535 - 1_024;

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

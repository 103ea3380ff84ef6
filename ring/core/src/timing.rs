//! Raft and failure-detection timings: the numbers every interval of the ring derives from.
//!
//! Part of `ringd.toml` (`[timing]`), and of the deterministic core because the controller's
//! judgement of a member's health ([`crate::health::judge`]) and the simulation are functions
//! of them. DESIGN.md rule 2: `member_lost_ms > lease_ms + fence_ms + clock_margin_ms`; `ringd`
//! refuses a configuration that breaks it.

use serde::{Deserialize, Serialize};

/// Raft and failure-detection timings, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_timeout_max_ms: u64,
    /// A member the leader has not heard from for this long is `suspect`.
    pub member_suspect_ms: u64,
    /// A member the leader has not heard from for this long is `lost`, and its control planes
    /// move. Must exceed `lease_ms + fence_ms + clock_margin_ms` (DESIGN.md rule 2).
    pub member_lost_ms: u64,
    /// How long a member may serve its control planes after the leader last confirmed them,
    /// counted from before it asked (DESIGN.md rule 1).
    pub lease_ms: u64,
    /// How long a member has, at most, to stop a control plane once its lease ran out.
    pub fence_ms: u64,
    /// Allowance for clocks running at different rates between members.
    pub clock_margin_ms: u64,
}

impl Default for Timing {
    /// Timings for members in separate zones (see DESIGN.md).
    fn default() -> Self {
        Self {
            heartbeat_ms: 250,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 2_000,
            member_suspect_ms: 4_000,
            member_lost_ms: 8_000,
            lease_ms: 4_000,
            fence_ms: 2_000,
            clock_margin_ms: 1_000,
        }
    }
}

impl Timing {
    /// Timings for a ring on one machine (tests, the demo).
    pub fn loopback() -> Self {
        Self {
            heartbeat_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            member_suspect_ms: 1_000,
            member_lost_ms: 2_000,
            lease_ms: 1_000,
            fence_ms: 500,
            clock_margin_ms: 200,
        }
    }
}

//! Clock helpers for the I/O layer. The core never calls these: time reaches it inside
//! commands.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Milliseconds on the system's monotonic clock (`CLOCK_MONOTONIC`). Unlike `Instant`, the
/// value means the same in every process of the machine, so `ringd` can hand a lease deadline
/// to its guard processes as a number.
pub fn monotonic_ms() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000
        + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
}

/// `2026-12-01 02:53:35 UTC` for Unix milliseconds.
pub fn utc(unix_ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .map(|t| {
            format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            )
        })
        .unwrap_or_else(|_| format!("{unix_ms} ms (Unix)"))
}

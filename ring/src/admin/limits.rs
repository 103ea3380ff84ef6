//! Per-identity limits of the Admin API ([`crate::config::AdminSettings`]): requests in flight,
//! and writes per second (a token bucket), per client identity, on this member. A request over
//! a limit is refused at once with `RESOURCE_EXHAUSTED` and a message saying which limit and
//! what to do; it never waits (a flooding client must not hold the member's tasks).
//!
//! Requests a follower forwarded are not counted again on the leader: the follower counted
//! them. The table of identities is bounded ([`MAX_IDENTITIES`]): without TLS the identity is
//! whatever a client claims.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tonic::{Request, Status};

use super::auth::{Access, Forwarded};
use crate::config::AdminSettings;

/// Most identities tracked at once; idle ones are dropped first.
pub const MAX_IDENTITIES: usize = 4_096;

#[derive(Debug)]
struct Entry {
    in_flight: u32,
    /// Write tokens left (refilled at the configured rate, up to one second's worth).
    tokens: f64,
    refilled: Instant,
}

/// The limits and what each identity uses of them.
#[derive(Debug)]
pub struct IdentityLimits {
    settings: AdminSettings,
    table: Mutex<HashMap<String, Entry>>,
}

/// One admitted request; dropping it frees its place.
#[must_use = "the request counts as in flight while this lives"]
#[derive(Debug)]
pub struct InFlight {
    limits: Option<(Arc<IdentityLimits>, String)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((limits, actor)) = self.limits.take() {
            let mut table = limits.table.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = table.get_mut(&actor) {
                e.in_flight = e.in_flight.saturating_sub(1);
            }
        }
    }
}

impl IdentityLimits {
    /// Limits as `settings` says.
    pub fn new(settings: AdminSettings) -> Arc<Self> {
        Arc::new(Self {
            settings,
            table: Mutex::new(HashMap::new()),
        })
    }

    /// Admits a request of `actor` doing `access`, or refuses it with `RESOURCE_EXHAUSTED`.
    pub fn admit_actor(
        self: &Arc<Self>,
        actor: &str,
        access: Access,
        now: Instant,
    ) -> Result<InFlight, Status> {
        let rate = f64::from(self.settings.max_writes_per_second_per_identity);
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if !table.contains_key(actor) && table.len() >= MAX_IDENTITIES {
            table.retain(|_, e| e.in_flight > 0);
            if table.len() >= MAX_IDENTITIES {
                return Err(Status::resource_exhausted(format!(
                    "this member works for {MAX_IDENTITIES} client identities at once; retry later"
                )));
            }
        }
        let entry = table.entry(actor.to_string()).or_insert(Entry {
            in_flight: 0,
            tokens: rate,
            refilled: now,
        });
        if entry.in_flight >= self.settings.max_in_flight_per_identity {
            return Err(Status::resource_exhausted(format!(
                "{actor} has {} Admin requests in flight on this member, its limit \
                 ([admin] max_in_flight_per_identity); wait for answers before sending more",
                entry.in_flight
            )));
        }
        if access == Access::Write && rate > 0.0 {
            let elapsed = now.saturating_duration_since(entry.refilled).as_secs_f64();
            entry.tokens = (entry.tokens + elapsed * rate).min(rate);
            entry.refilled = now;
            if entry.tokens < 1.0 {
                return Err(Status::resource_exhausted(format!(
                    "{actor} sends more than {} writes per second to this member, its limit \
                     ([admin] max_writes_per_second_per_identity); retry with backoff",
                    self.settings.max_writes_per_second_per_identity
                )));
            }
            entry.tokens -= 1.0;
        }
        entry.in_flight += 1;
        Ok(InFlight {
            limits: Some((self.clone(), actor.to_string())),
        })
    }

    /// [`IdentityLimits::admit_actor`] for the caller of `request` (forwarded requests pass:
    /// their follower counted them).
    pub fn admit<T>(
        self: &Arc<Self>,
        request: &Request<T>,
        actor: &str,
        access: Access,
    ) -> Result<InFlight, Status> {
        if request.extensions().get::<Forwarded>().is_some() {
            return Ok(InFlight { limits: None });
        }
        let result = self.admit_actor(actor, access, Instant::now());
        if let Err(status) = &result {
            tracing::debug!(actor, "admin request refused: {}", status.message());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(in_flight: u32, writes: u32) -> Arc<IdentityLimits> {
        IdentityLimits::new(AdminSettings {
            max_in_flight_per_identity: in_flight,
            max_writes_per_second_per_identity: writes,
        })
    }

    #[test]
    fn requests_in_flight_are_limited_per_identity_and_freed_when_answered() {
        let l = limits(2, 0);
        let now = Instant::now();
        let a = l.admit_actor("admin:a", Access::Read, now).unwrap();
        let _b = l.admit_actor("admin:a", Access::Write, now).unwrap();
        let err = l.admit_actor("admin:a", Access::Read, now).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message()
                .contains("admin:a has 2 Admin requests in flight")
        );
        // Another identity is not held back.
        let _c = l.admit_actor("admin:c", Access::Read, now).unwrap();
        drop(a);
        let _again = l.admit_actor("admin:a", Access::Read, now).unwrap();
    }

    #[test]
    fn writes_per_second_are_a_bucket_that_refills() {
        let l = limits(1_000, 5);
        let now = Instant::now();
        for _ in 0..5 {
            drop(l.admit_actor("admin:a", Access::Write, now).unwrap());
        }
        let err = l.admit_actor("admin:a", Access::Write, now).unwrap_err();
        assert!(
            err.message().contains("more than 5 writes per second"),
            "{err}"
        );
        // Reads are not writes.
        drop(l.admit_actor("admin:a", Access::Read, now).unwrap());
        // 200 ms later: one more token.
        let later = now + Duration::from_millis(200);
        drop(l.admit_actor("admin:a", Access::Write, later).unwrap());
        assert!(l.admit_actor("admin:a", Access::Write, later).is_err());
    }

    #[test]
    fn the_table_of_identities_is_bounded() {
        let l = limits(10, 0);
        let now = Instant::now();
        let held: Vec<_> = (0..MAX_IDENTITIES)
            .map(|i| l.admit_actor(&format!("x{i}"), Access::Read, now).unwrap())
            .collect();
        assert!(l.admit_actor("one-more", Access::Read, now).is_err());
        drop(held);
        assert!(l.admit_actor("one-more", Access::Read, now).is_ok());
    }
}

//! DNS: pointing each control plane's name at the member that serves it, and nowhere while it
//! moves (DESIGN.md rule 3).
//!
//! Pure parts (no sockets, no clocks; the simulation and unit tests drive them):
//! - [`records`]: the records the ring wants, a function of the applied state (it lives in the
//!   core, `garden_ring_core::dns_records`).
//! - [`zone`]: the zone a member serves with the `builtin` provider, and its answer to a query.
//! - [`update`]: RFC 2136 UPDATE messages: one atomic replace per changed name, in batches.
//!
//! I/O parts:
//! - [`server`]: the `builtin` provider. Every member serves the zone over UDP and TCP
//!   (hickory-server), SERVFAIL unless its own lease vouches for its state.
//! - [`rfc2136`]: the `rfc2136` provider. Updates sent over TCP, signed with a
//!   [`tsig_key::TsigKey`] (hmac-sha256); typed errors say whether a retry can help.
//! - [`query`]: asks one authoritative server what it answers (non-recursive, no cache).
//! - [`keeper`]: the leader's duty. Publishes changes (batched, retried with backoff), checks
//!   every server until each change is visible, repairs drift every reconcile interval; its
//!   [`keeper::DnsStatus`] is what `ringctl dns list` and `ringctl status` show.
//!
//! A DNS UPDATE message (RFC 2136, section 2) reuses the four sections of a query:
//!
//! | section | in an UPDATE | what we put there |
//! | --- | --- | --- |
//! | question | zone | the zone apex, type SOA, class IN |
//! | answer | prerequisites | nothing (the change is unconditional) |
//! | authority | updates | per name: delete its A, AAAA and CNAME sets, then add the new record |
//! | additional | additional data | the TSIG record |
//!
//! The primary applies all updates of one message or none of them, so a batch never leaves a
//! name half changed.

pub mod keeper;
pub mod query;
pub mod rfc2136;
pub mod server;
pub mod tsig_key;
pub mod update;
pub mod zone;

pub use crate::core::dns_records as records;

/// The publisher for `settings`' provider: `None` for providers nobody pushes to.
pub fn publisher(
    settings: &crate::config::DnsSettings,
) -> Result<Option<Box<dyn keeper::Publisher>>, rfc2136::SetupError> {
    match settings.provider {
        crate::config::DnsProvider::Builtin | crate::config::DnsProvider::Off => Ok(None),
        crate::config::DnsProvider::Rfc2136 => {
            let (Some(zone), Some(rfc2136)) = (&settings.zone, &settings.rfc2136) else {
                return Err(rfc2136::SetupError::Incomplete);
            };
            let publisher = rfc2136::Rfc2136Publisher::new(
                zone,
                rfc2136.server,
                &rfc2136.key_file,
                std::time::Duration::from_millis(settings.timeout_ms),
            )?;
            Ok(Some(Box::new(publisher)))
        }
    }
}

//! DNS: keeping the records that point clients at control planes up to date.
//!
//! - [`records`]: the records the ring wants, a pure function of the applied state
//!   (DESIGN.md rule 3: a control plane's name points at its host only while it serves).
//! - [`update`]: a pure builder of RFC 2136 DNS UPDATE messages: given a zone and a batch of
//!   record changes it checks every name, TTL and value, then returns the message (or its wire
//!   bytes) that replaces the records in one atomic transaction on the zone's primary server.
//! - [`rfc2136`]: sends an update over TCP, signed with a [`tsig_key::TsigKey`]; checks the reply.
//!
//! Nothing here opens a socket, reads a clock or draws a random number: the message id is an
//! argument, so the same input always gives the same bytes.
//!
//! Not built yet: sending the message (UDP with TCP fallback) and reading the answer, TSIG
//! signing (RFC 8945), and a builtin DNS server. The builder returns the unsigned
//! [`Message`](hickory_proto::op::Message) on its own ([`update::UpdateBuilder::message`]) so a
//! signer can add the TSIG record before [`update::encode`], which leaves room for it (see
//! [`MAX_DNS_UPDATE_BYTES`](crate::core::limits::MAX_DNS_UPDATE_BYTES)).
//!
//! A DNS UPDATE message (RFC 2136, section 2) reuses the four sections of a query:
//!
//! | section | in an UPDATE | what we put there |
//! | --- | --- | --- |
//! | question | zone | the zone apex, type SOA, class IN |
//! | answer | prerequisites | nothing (the change is unconditional) |
//! | authority | updates | per name: delete its A, AAAA and CNAME sets, then add the new record |
//! | additional | additional data | nothing (a TSIG record, once signing exists) |
//!
//! The primary applies all updates of one message or none of them, so a batch never leaves a
//! name half changed.

pub mod keeper;
pub mod query;
pub mod records;
pub mod rfc2136;
pub mod server;
pub mod tsig_key;
pub mod update;
pub mod zone;

/// The publisher for `settings`' provider: `None` for providers nobody pushes to.
pub fn publisher(
    settings: &crate::config::DnsSettings,
) -> Result<Option<Box<dyn keeper::Publisher>>, String> {
    match settings.provider {
        crate::config::DnsProvider::Builtin | crate::config::DnsProvider::Off => Ok(None),
        crate::config::DnsProvider::Rfc2136 => Err("the rfc2136 provider is not built yet".into()),
    }
}

//! The operator's Admin API (`gardenring.v1.Admin`): the server every member runs and the
//! client `ringctl` (and the tests) use.
//!
//! - [`service`]: the server. Reads are answered from the contacted member's applied state;
//!   writes are forwarded to the leader, proposed through Raft and answered once applied.
//! - [`client`]: a client that takes several endpoints and tries the next when one is down.
//! - [`convert`]: core types to protobuf messages, and command errors to gRPC status codes.

pub mod auth;
pub mod client;
pub mod convert;
pub mod service;

pub use client::{AdminClient, ClientError};
pub use service::AdminService;

/// Largest Admin API message accepted, in bytes (both directions, server and client).
pub const MAX_ADMIN_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Request header naming who is asking, recorded in history as the actor when the ring runs
/// without TLS (with TLS, the actor is the client certificate's identity).
pub const ACTOR_HEADER: &str = "x-ring-actor";
/// Response header on errors where the request was certainly not applied, so the client may
/// send it again (no leader yet, leadership moved before the proposal was accepted, ...).
pub const RETRY_SAFE_HEADER: &str = "x-ring-retry-safe";

/// Response header on a command the ring refused: the kind of refusal
/// ([`CommandError::kind`](crate::core::CommandError::kind), e.g. `stale_move`,
/// `hosts_control_planes`), stable across releases, for clients that act on it.
pub const REFUSAL_HEADER: &str = "x-ring-refusal";

/// Response header on a `SnapshotSave` refused by a member that is not the leader: the leader's
/// Admin address, where the client asks next.
pub const LEADER_ADMIN_HEADER: &str = "x-ring-leader-admin";

/// An `UNAVAILABLE` status that tells the client the request was not applied and can be retried.
pub fn retry_safe(message: impl Into<String>) -> tonic::Status {
    let mut status = tonic::Status::unavailable(message);
    status.metadata_mut().insert(
        RETRY_SAFE_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// True for failures where the request never reached a working server (used by the client to
/// move to the next endpoint, and by a member forwarding to a leader that just died).
pub(crate) fn is_connection_failure(status: &tonic::Status) -> bool {
    let message = status.message().to_ascii_lowercase();
    status.code() == tonic::Code::Unavailable
        && [
            "transport error",
            "connection",
            "tcp connect",
            "tls handshake",
        ]
        .iter()
        .any(|m| message.contains(m))
}

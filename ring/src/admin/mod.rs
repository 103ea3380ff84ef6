//! The operator's Admin API (`gardenring.v1.Admin`): the server every member runs and the
//! client `ringctl` (and the tests) use.
//!
//! - [`service`]: the server. Reads are answered from the contacted member's applied state
//!   once it has applied up to the leader's read index (or say they are stale); writes are forwarded to the leader, proposed through Raft and answered once applied.
//! - [`client`]: a client that takes several endpoints and tries the next when one is down.
//! - [`convert`]: core types to protobuf messages, and command errors to gRPC status codes.
//! - [`freshness`]: reads are linearizable (a read index from the leader) unless asked stale,
//!   and say how fresh they are.

pub mod auth;
pub mod client;
pub mod convert;
pub mod freshness;
pub mod limits;
pub mod service;
pub mod upgrade;

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
/// The refusal kind of a follower asked to pass on the revocation of its own certificate
/// (`ringctl certs revoke` then asks the next member).
pub const OWN_CERTIFICATE_REFUSAL: &str = "own_certificate";

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
///
/// Decided by type, never by the message: tonic builds an `UNAVAILABLE` status on the client
/// side from the transport's error (connection refused, TLS handshake, connection reset) and
/// keeps that error as the status's source, while a status a server sent (for example "no
/// leader yet, retry") is decoded from the response and has none.
pub(crate) fn is_connection_failure(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && std::error::Error::source(status).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_a_connection_failure_and_a_server_s_answer_is_not() {
        // A port nothing listens on: bind one, learn its number, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_lazy();
        let mut client = crate::pb::admin_client::AdminClient::new(channel);
        let status = client
            .status(crate::pb::StatusRequest::default())
            .await
            .unwrap_err();
        assert!(is_connection_failure(&status), "{status:?}");
        // The same code and words, as a server would send them.
        let sent = tonic::Status::unavailable(status.message().to_string());
        assert!(!is_connection_failure(&sent), "{sent:?}");
        assert!(!is_connection_failure(&retry_safe(
            "transport error: no leader yet"
        )));
    }
}

//! Who may call what on the Admin API.
//!
//! The interceptor ([`admit_operators`]) lets only `admin` and `viewer` certificates in (member
//! certificates talk to members on the peer port, never here); each method then asks
//! [`caller`] for the access it needs. Reads need `viewer` or `admin`, every write needs
//! `admin`. The caller's identity becomes the actor recorded in history; without TLS the actor
//! is whatever the client claims in the `x-ring-actor` header.

use tonic::{Request, Status};

use super::ACTOR_HEADER;
use crate::raft::NodeId;
use crate::tls::Role;
use crate::tls::server::{ConnInfo, PeerAuth};

/// What a method does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads state.
    Read,
    /// Changes the ring.
    Write,
    /// Copies the whole state out (`SnapshotSave`): admin only, like a write, because the copy
    /// can restore a ring.
    Backup,
}

/// The client behind a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Recorded in history: `role:name` from the certificate, or the claimed actor without TLS.
    pub actor: String,
    /// The certificate's role; `None` when the ring runs without TLS.
    pub role: Option<Role>,
}

/// Request extension on a request a member forwarded to this one, the leader: who forwarded it,
/// and for whom.
#[derive(Debug, Clone)]
pub struct Forwarded {
    /// The forwarding member.
    pub by: NodeId,
    /// The client the forwarding member authenticated.
    pub caller: Caller,
}

fn permit(caller: &Caller, access: Access) -> Result<(), Status> {
    match (caller.role, access) {
        (None, _) | (Some(Role::Admin), _) | (Some(Role::Viewer), Access::Read) => Ok(()),
        (Some(Role::Viewer), Access::Write) => Err(Status::permission_denied(format!(
            "{} is a viewer: it may read, not change the ring (use an admin certificate)",
            caller.actor
        ))),
        (Some(Role::Viewer), Access::Backup) => Err(Status::permission_denied(format!(
            "{} is a viewer: saving a snapshot of the ring needs an admin certificate",
            caller.actor
        ))),
        (Some(Role::Member), _) => Err(Status::permission_denied(format!(
            "{} is a member certificate; the Admin API admits admin and viewer certificates only",
            caller.actor
        ))),
    }
}

/// The caller of `request`, if it may have `access`. Refusals are logged.
pub fn caller<T>(request: &Request<T>, access: Access) -> Result<Caller, Status> {
    let result = identify(request).and_then(|c| permit(&c, access).map(|()| c));
    if let Err(status) = &result {
        let remote = ConnInfo::of(request).and_then(|i| i.remote);
        tracing::warn!(?remote, ?access, code = ?status.code(), "admin request refused: {}", status.message());
    }
    result
}

fn identify<T>(request: &Request<T>) -> Result<Caller, Status> {
    if let Some(forwarded) = request.extensions().get::<Forwarded>() {
        return Ok(forwarded.caller.clone());
    }
    let Some(info) = ConnInfo::of(request) else {
        return Err(Status::unauthenticated("no connection information"));
    };
    match info.auth.as_ref() {
        PeerAuth::Insecure => Ok(Caller {
            actor: request
                .metadata()
                .get(ACTOR_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| "anonymous".into()),
            role: None,
        }),
        PeerAuth::Verified { identity, .. } => Ok(Caller {
            actor: identity.to_string(),
            role: Some(identity.role),
        }),
        PeerAuth::NoCertificate => Err(Status::unauthenticated(
            "a client certificate issued by this ring's CA is required",
        )),
        PeerAuth::Refused(why) => Err(Status::unauthenticated(format!(
            "client certificate refused: {why}"
        ))),
    }
}

/// The Admin server's interceptor: admin and viewer certificates only (any client without TLS).
pub fn admit_operators(request: Request<()>) -> Result<Request<()>, Status> {
    crate::tls::server::admit(&request, &[Role::Admin, Role::Viewer], "admin")?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(role: Option<Role>) -> Caller {
        Caller {
            actor: "x".into(),
            role,
        }
    }

    #[test]
    fn roles_map_to_access() {
        use Access::*;
        for (role, read, write) in [
            (None, true, true),
            (Some(Role::Admin), true, true),
            (Some(Role::Viewer), true, false),
            (Some(Role::Member), false, false),
        ] {
            assert_eq!(permit(&caller(role), Read).is_ok(), read, "{role:?}");
            assert_eq!(permit(&caller(role), Write).is_ok(), write, "{role:?}");
            assert_eq!(permit(&caller(role), Backup).is_ok(), write, "{role:?}");
        }
        assert_eq!(
            permit(&caller(Some(Role::Viewer)), Write)
                .unwrap_err()
                .code(),
            tonic::Code::PermissionDenied
        );
    }
}

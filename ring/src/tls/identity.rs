//! Who a certificate speaks for.
//!
//! Every certificate of a ring carries exactly one identity, as a URI subject alternative name
//! in the SPIFFE style: `spiffe://garden-ring/<role>/<name>`. The role decides what its holder
//! may do:
//!
//! | role | who | may use |
//! | --- | --- | --- |
//! | `member` | a `ringd`; `<name>` is its member name | the peer (Raft) service only |
//! | `admin` | an operator or automation | every Admin API call |
//! | `viewer` | dashboards, auditors | Admin API reads only |
//!
//! A member certificate also names its member, so a peer cannot claim another member's node id:
//! the peer service compares the name in the certificate with the name the ring has registered
//! for the node id a message claims to come from.

use std::fmt;

use crate::core::names::check_label;

/// Scheme and trust domain of every identity URI.
pub const IDENTITY_URI_PREFIX: &str = "spiffe://garden-ring/";

/// What a certificate's holder may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A ring member (`ringd`).
    Member,
    /// An operator: every Admin API call.
    Admin,
    /// Admin API reads only.
    Viewer,
}

impl Role {
    /// The role as written in identity URIs and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Viewer => "viewer",
        }
    }

    /// Parses `member`, `admin` or `viewer`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity a certificate carries: a role and a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// What the holder may do.
    pub role: Role,
    /// Member name, or the operator's name (a DNS-1123 label).
    pub name: String,
}

impl Identity {
    /// A checked identity.
    pub fn new(role: Role, name: &str) -> Result<Self, IdentityError> {
        check_label(name).map_err(|why| IdentityError::BadName {
            name: name.to_string(),
            why: why.into(),
        })?;
        Ok(Self {
            role,
            name: name.to_string(),
        })
    }

    /// The URI subject alternative name of this identity.
    pub fn uri(&self) -> String {
        format!("{IDENTITY_URI_PREFIX}{}/{}", self.role, self.name)
    }

    /// Parses an identity URI.
    pub fn from_uri(uri: &str) -> Result<Self, IdentityError> {
        let rest = uri
            .strip_prefix(IDENTITY_URI_PREFIX)
            .ok_or_else(|| IdentityError::NotOurs(uri.to_string()))?;
        let (role, name) = rest
            .split_once('/')
            .ok_or_else(|| IdentityError::Malformed(uri.to_string()))?;
        let role = Role::parse(role).ok_or_else(|| IdentityError::Malformed(uri.to_string()))?;
        Self::new(role, name)
    }

    /// The identity in a DER certificate: its only `spiffe://garden-ring/` URI SAN.
    pub fn from_cert_der(der: &[u8]) -> Result<Self, IdentityError> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| IdentityError::Unparsable(e.to_string()))?;
        let mut found = None;
        for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
            if let GeneralName::URI(uri) = name
                && uri.starts_with(IDENTITY_URI_PREFIX)
            {
                if found.is_some() {
                    return Err(IdentityError::Ambiguous);
                }
                found = Some(Self::from_uri(uri)?);
            }
        }
        found.ok_or(IdentityError::Missing)
    }
}

impl fmt::Display for Identity {
    /// `role:name`, as recorded in history.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.role, self.name)
    }
}

/// Why a certificate carries no usable identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The certificate cannot be parsed.
    #[error("the certificate cannot be parsed: {0}")]
    Unparsable(String),
    /// No identity URI.
    #[error(
        "the certificate has no {IDENTITY_URI_PREFIX}<role>/<name> URI SAN (was it made by `ringctl certs`?)"
    )]
    Missing,
    /// More than one identity URI.
    #[error("the certificate has more than one {IDENTITY_URI_PREFIX} URI SAN")]
    Ambiguous,
    /// A URI of another trust domain.
    #[error("{0:?} is not a garden-ring identity")]
    NotOurs(String),
    /// A garden-ring URI that does not follow `<role>/<name>`.
    #[error("{0:?} is not of the form {IDENTITY_URI_PREFIX}<member|admin|viewer>/<name>")]
    Malformed(String),
    /// The name is not a DNS-1123 label.
    #[error("identity name {name:?} {why}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_round_trip() {
        let id = Identity::new(Role::Member, "zone-a").unwrap();
        assert_eq!(id.uri(), "spiffe://garden-ring/member/zone-a");
        assert_eq!(Identity::from_uri(&id.uri()).unwrap(), id);
        assert_eq!(id.to_string(), "member:zone-a");
    }

    #[test]
    fn bad_uris_are_refused() {
        for uri in [
            "spiffe://other/member/a",
            "spiffe://garden-ring/root/a",
            "spiffe://garden-ring/member",
            "spiffe://garden-ring/member/a/b",
            "spiffe://garden-ring/member/../a",
            "spiffe://garden-ring/admin/",
            "spiffe://garden-ring/admin/UPPER",
        ] {
            assert!(Identity::from_uri(uri).is_err(), "{uri} was accepted");
        }
    }
}

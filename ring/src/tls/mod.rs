//! Transport security: mutual TLS on every gRPC port, identities in certificates, hot reload.
//!
//! - [`identity`]: the role and name a certificate speaks for (`spiffe://garden-ring/<role>/<name>`).
//! - [`material`]: loading and checking a CA bundle, certificate and key.
//! - [`store`]: the material in use, reloaded when its files change.
//! - [`server`]: accepting connections and judging client certificates.
//! - [`revocation`]: refusing revoked certificates and cutting their connections.
//! - [`client`]: channels to members, checking that the server is the expected member.
//! - [`certs`]: making a CA and certificates (`ringctl certs`).
//!
//! Rules: TLS 1.3 only; every client must present a certificate of the ring's CA; members talk
//! to members only on the peer port, operators only on the Admin port (see
//! [`identity::Role`]). Without TLS (`insecure = true`) nobody is authenticated and the actor
//! recorded in history is whatever the client claims.

pub mod certs;
pub mod client;
pub mod identity;
pub mod material;
pub mod revocation;
pub mod server;
pub mod store;

use std::sync::Arc;

pub use identity::{Identity, Role};
pub use material::{TlsError, TlsFiles};
pub use store::TlsStore;

/// Whether connections use TLS.
#[derive(Clone, Debug)]
pub enum Security {
    /// Plain TCP: no encryption, no authentication (`insecure = true`).
    Insecure,
    /// Mutual TLS with the material of this store.
    Tls(Arc<TlsStore>),
    /// Client side only: TLS trusting these CA certificates, presenting no certificate. The
    /// ring refuses such clients; `ringctl` uses it when only a CA file is configured, so the
    /// operator reads the ring's explanation instead of a local one.
    TlsWithoutCertificate(Arc<rustls::RootCertStore>),
}

impl Security {
    /// The store, when TLS is on.
    pub fn store(&self) -> Option<&Arc<TlsStore>> {
        match self {
            Security::Tls(s) => Some(s),
            Security::Insecure | Security::TlsWithoutCertificate(_) => None,
        }
    }
}

/// Installs the process-wide rustls crypto provider (ring). garden-ring passes its provider
/// explicitly everywhere, but a dependency that builds a rustls config with the default (the
/// object-store client will) panics when two providers are compiled in and none is installed.
/// Call once at the start of each binary; later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A rustls error in words an operator can act on.
pub fn describe(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "the certificate is not issued by this ring's CA".into(),
            C::Expired | C::ExpiredContext { .. } => "the certificate has expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the certificate is not valid yet (check the clocks)".into()
            }
            C::BadSignature => "the certificate's signature is invalid".into(),
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                "the certificate is not for this use (client or server authentication)".into()
            }
            other => format!("invalid certificate: {other:?}"),
        },
        rustls::Error::General(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Handshake signature checks shared by both sides' verifiers: TLS 1.3 only.
pub(crate) mod handshake {
    use rustls::DigitallySignedStruct;
    use rustls::SignatureScheme;
    use rustls::client::danger::HandshakeSignatureValid;
    use rustls::crypto::CryptoProvider;
    use rustls_pki_types::CertificateDer;

    /// TLS 1.2 is never configured; a 1.2 signature is refused.
    pub fn tls12() -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    /// Checks that the peer holds the key of `cert`.
    pub fn tls13(
        provider: &CryptoProvider,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider.signature_verification_algorithms,
        )
    }

    /// The signature schemes `provider` verifies.
    pub fn schemes(provider: &CryptoProvider) -> Vec<SignatureScheme> {
        provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

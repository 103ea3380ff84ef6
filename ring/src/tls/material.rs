//! The certificate material of one process: CA bundle, own certificate chain and private key,
//! loaded and checked together.
//!
//! Loading checks everything an operator can get wrong before the material is used: files
//! readable and PEM, the key matching the certificate, the certificate carrying a garden-ring
//! identity and being issued by the configured CA. Errors name the file and the problem, never
//! the key's content.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::identity::{Identity, IdentityError, Role};
use crate::secret::Secret;

/// Most certificates accepted in a CA bundle or a chain file.
pub const MAX_CERTS_PER_FILE: usize = 16;

/// The three files of a TLS setup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM bundle of the CA certificates trusted for peers and clients.
    pub ca_file: PathBuf,
    /// PEM certificate (chain) of this process, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1). A secret: mode 0600.
    pub key_file: PathBuf,
    /// Certificate revocation lists a company PKI publishes (PEM `X509 CRL` blocks, or one
    /// DER CRL), each signed by a CA of `ca_file`: the certificates they list are refused like
    /// those the ring revokes. Reloaded with the other files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crl_file: Option<PathBuf>,
}

impl TlsFiles {
    /// The same files, relative paths resolved against `base` (the directory of the config
    /// file that named them).
    pub fn relative_to(&self, base: &Path) -> Self {
        let join = |p: &PathBuf| {
            if p.is_absolute() {
                p.clone()
            } else {
                base.join(p)
            }
        };
        Self {
            ca_file: join(&self.ca_file),
            cert_file: join(&self.cert_file),
            key_file: join(&self.key_file),
            crl_file: self.crl_file.as_ref().map(join),
        }
    }
}

/// Why TLS material cannot be used. Never contains key material.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {what} {path}: {why}")]
    Read {
        /// "CA file", "certificate file", "key file".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A file holds no usable PEM block of the expected kind, or too many.
    #[error("{what} {path}: {why}")]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The private key does not belong to the certificate.
    #[error("key file {key} does not match certificate file {cert}")]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The certificate carries no usable identity.
    #[error("certificate file {path}: {source}")]
    Identity {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        #[source]
        source: IdentityError,
    },
    /// The certificate is not valid under the configured CA (wrong CA, expired, wrong usage).
    #[error("certificate file {cert} is not valid under CA file {ca}: {why}")]
    Untrusted {
        /// The certificate file.
        cert: PathBuf,
        /// The CA file.
        ca: PathBuf,
        /// Why.
        why: String,
    },
    /// The certificate names another identity than the one this process must have.
    #[error("certificate file {path} is for {found}, but this process is {expected}")]
    WrongIdentity {
        /// The certificate file.
        path: PathBuf,
        /// What the certificate says.
        found: Identity,
        /// What it must say.
        expected: Identity,
    },
}

/// A certificate's name and the end of its validity (for expiry checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validity {
    /// Its identity (`member:a`) or, for a CA, its subject's distinguished name.
    pub name: String,
    /// SHA-256 of its DER, hex.
    pub sha256: String,
    /// Its serial number (lower-case hex).
    pub serial: String,
    /// End of its validity, seconds since the Unix epoch.
    pub not_after_unix_s: i64,
}

impl Validity {
    /// The validity of the certificate `der` (its name: its identity, else its subject).
    pub fn of(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let name = Identity::from_cert_der(der)
            .map(|i| i.to_string())
            .unwrap_or_else(|_| cert.subject().to_string());
        Some(Self {
            name,
            sha256: sha256_hex(der),
            serial: crate::core::revocation::serial_of_bytes(cert.raw_serial()),
            not_after_unix_s: cert.validity().not_after.timestamp(),
        })
    }
}

/// Loaded, checked certificate material.
pub struct Material {
    /// Who this process is.
    pub identity: Identity,
    /// Certificate chain and signing key.
    pub certified_key: Arc<CertifiedKey>,
    /// The trusted CA certificates.
    pub roots: Arc<RootCertStore>,
    /// Checks client certificates against `roots`.
    pub client_verifier: Arc<dyn ClientCertVerifier>,
    /// SHA-256 of the leaf certificate (DER), hex.
    pub cert_sha256: String,
    /// SHA-256 of the first CA certificate (DER), hex.
    pub ca_sha256: String,
    /// End of the leaf certificate's validity, seconds since the Unix epoch.
    pub not_after_unix_s: i64,
    /// The CA certificates trusted, with the end of their validity.
    pub cas: Vec<Validity>,
    /// The certificates the CRL file lists (empty without one).
    pub crl: Vec<CrlEntry>,
}

/// A PEM parser's error in words (its own names byte strings as lists of numbers).
fn pem_error(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { end_marker } => format!(
            "the file ends before the line -----END {}----- (cut short?)",
            String::from_utf8_lossy(end_marker)
        ),
        E::IllegalSectionStart { line } => format!(
            "a malformed -----BEGIN line: {:?}",
            String::from_utf8_lossy(line)
        ),
        other => other.to_string(),
    }
}

/// Most CRLs in a CRL file.
pub const MAX_CRLS_PER_FILE: usize = 16;
/// Most revoked certificates all CRLs of a file list together.
pub const MAX_CRL_ENTRIES: usize = 100_000;

/// A certificate a CRL lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlEntry {
    /// The CRL's (and so the certificate's) issuer.
    pub issuer: String,
    /// Its serial ([`crate::core::revocation::serial`]'s form).
    pub serial: String,
    /// When the CRL says it was revoked, Unix seconds.
    pub revoked_unix_s: i64,
    /// The CRL's reason code, when it gives one.
    pub reason: Option<String>,
}

/// The certificates the CRLs in `path` list, after checking that a CA certificate of
/// `ca_certs` signed each CRL. Any problem refuses the whole file.
pub fn load_crls(
    path: &Path,
    ca_certs: &[CertificateDer<'static>],
) -> Result<Vec<CrlEntry>, TlsError> {
    use rustls_pki_types::CertificateRevocationListDer;
    let bad = |why: String| TlsError::Pem {
        what: "CRL file",
        path: path.to_path_buf(),
        why,
    };
    let bytes = read("CRL file", path)?;
    // DER starts with a SEQUENCE tag (0x30); anything else is read as PEM.
    let ders: Vec<Vec<u8>> = if bytes.first() != Some(&0x30) {
        let mut ders = Vec::new();
        for item in CertificateRevocationListDer::pem_slice_iter(&bytes) {
            let crl = item.map_err(|e| bad(format!("bad PEM: {}", pem_error(&e))))?;
            if ders.len() == MAX_CRLS_PER_FILE {
                return Err(bad(format!("more than {MAX_CRLS_PER_FILE} CRLs")));
            }
            ders.push(crl.as_ref().to_vec());
        }
        if ders.is_empty() {
            return Err(bad("no PEM X509 CRL block found".into()));
        }
        ders
    } else {
        vec![bytes]
    };
    let cas: Vec<_> = ca_certs
        .iter()
        .filter_map(|c| {
            x509_parser::parse_x509_certificate(c.as_ref())
                .ok()
                .map(|(_, c)| c)
        })
        .collect();
    let mut entries = Vec::new();
    for (i, der) in ders.iter().enumerate() {
        let which = if ders.len() == 1 {
            "the CRL".to_string()
        } else {
            format!("CRL {}", i + 1)
        };
        let (_, crl) = x509_parser::parse_x509_crl(der)
            .map_err(|e| bad(format!("{which} is not a certificate revocation list: {e}")))?;
        let issuer = crl.issuer();
        let Some(ca) = cas.iter().find(|c| c.subject().as_raw() == issuer.as_raw()) else {
            return Err(bad(format!(
                "{which} is issued by {issuer}, which is no CA of the CA file"
            )));
        };
        crl.verify_signature(ca.public_key()).map_err(|e| {
            bad(format!(
                "{which} claims to be issued by {issuer}, but that CA's key did not sign it ({e})"
            ))
        })?;
        for revoked in crl.iter_revoked_certificates() {
            if entries.len() == MAX_CRL_ENTRIES {
                return Err(bad(format!(
                    "more than {MAX_CRL_ENTRIES} revoked certificates"
                )));
            }
            entries.push(CrlEntry {
                issuer: issuer.to_string(),
                serial: crate::core::revocation::serial_of_bytes(revoked.raw_serial()),
                revoked_unix_s: revoked.revocation_date.timestamp(),
                reason: revoked.reason_code().map(|(_, code)| code.to_string()),
            });
        }
    }
    Ok(entries)
}

/// The crypto provider used everywhere (ring; TLS 1.3 only is configured by the callers).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    if meta.len() > crate::secret::MAX_SECRET_BYTES {
        return Err(TlsError::Read {
            what,
            path: path.to_path_buf(),
            why: format!("larger than {} bytes", crate::secret::MAX_SECRET_BYTES),
        });
    }
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// Parses the PEM certificates in `bytes`; `what`/`path` only name them in errors.
pub fn parse_certs(
    what: &'static str,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |why: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        why,
    };
    let mut certs = Vec::new();
    for item in CertificateDer::pem_slice_iter(bytes) {
        let cert = item.map_err(|e| pem(format!("bad PEM: {}", pem_error(&e))))?;
        if certs.len() == MAX_CERTS_PER_FILE {
            return Err(pem(format!("more than {MAX_CERTS_PER_FILE} certificates")));
        }
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(pem("no PEM CERTIFICATE block found".into()));
    }
    Ok(certs)
}

fn not_after(der: &[u8]) -> i64 {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c.validity().not_after.timestamp())
        .unwrap_or(0)
}

/// Loads a CA bundle.
pub fn load_roots(ca_file: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let ca_certs = parse_certs("CA file", ca_file, &read("CA file", ca_file)?)?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in ca_certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| TlsError::Pem {
            what: "CA file",
            path: ca_file.to_path_buf(),
            why: format!("certificate {} is not a usable CA certificate: {e}", i + 1),
        })?;
    }
    Ok(Arc::new(roots))
}

impl Material {
    /// Loads and checks `files`. With `expected`, the certificate must carry that identity.
    pub fn load(files: &TlsFiles, expected: Option<&Identity>) -> Result<Self, TlsError> {
        let provider = provider();
        let ca_certs = parse_certs("CA file", &files.ca_file, &read("CA file", &files.ca_file)?)?;
        let roots = load_roots(&files.ca_file)?;
        let chain = parse_certs(
            "certificate file",
            &files.cert_file,
            &read("certificate file", &files.cert_file)?,
        )?;
        let key_secret = Secret::from_file(&files.key_file).map_err(|e| TlsError::Read {
            what: "key file",
            path: files.key_file.clone(),
            why: e.to_string(),
        })?;
        // The PEM parser's errors describe structure only (never the bytes), but keep ours
        // generic to be sure nothing of the key reaches a message.
        let key =
            PrivateKeyDer::from_pem_slice(key_secret.expose()).map_err(|_| TlsError::Pem {
                what: "key file",
                path: files.key_file.clone(),
                why: "no PEM private key (PKCS#8, PKCS#1 or SEC1) found".into(),
            })?;
        let signing_key = provider
            .key_provider
            .load_private_key(key)
            .map_err(|_| TlsError::Pem {
                what: "key file",
                path: files.key_file.clone(),
                why: "the private key is of an unsupported type (use ECDSA P-256/P-384, Ed25519 or RSA)".into(),
            })?;
        let certified_key = CertifiedKey::new(chain.clone(), signing_key);
        certified_key
            .keys_match()
            .map_err(|_| TlsError::KeyMismatch {
                cert: files.cert_file.clone(),
                key: files.key_file.clone(),
            })?;
        let identity =
            Identity::from_cert_der(chain[0].as_ref()).map_err(|source| TlsError::Identity {
                path: files.cert_file.clone(),
                source,
            })?;
        if let Some(expected) = expected
            && *expected != identity
        {
            return Err(TlsError::WrongIdentity {
                path: files.cert_file.clone(),
                found: identity,
                expected: expected.clone(),
            });
        }
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| TlsError::Pem {
                    what: "CA file",
                    path: files.ca_file.clone(),
                    why: e.to_string(),
                })?;
        let untrusted = |why: String| TlsError::Untrusted {
            cert: files.cert_file.clone(),
            ca: files.ca_file.clone(),
            why,
        };
        let now = UnixTime::now();
        // Every certificate authenticates as a client; members also serve.
        client_verifier
            .verify_client_cert(&chain[0], &chain[1..], now)
            .map_err(|e| untrusted(super::describe(&e)))?;
        if identity.role == Role::Member {
            let parsed = rustls::server::ParsedCertificate::try_from(&chain[0])
                .map_err(|e| untrusted(super::describe(&e)))?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &parsed,
                &roots,
                &chain[1..],
                now,
                provider.signature_verification_algorithms.all,
            )
            .map_err(|e| untrusted(super::describe(&e)))?;
        }
        Ok(Self {
            identity,
            cert_sha256: sha256_hex(chain[0].as_ref()),
            ca_sha256: sha256_hex(ca_certs[0].as_ref()),
            not_after_unix_s: not_after(chain[0].as_ref()),
            cas: ca_certs
                .iter()
                .filter_map(|c| Validity::of(c.as_ref()))
                .collect(),
            crl: match &files.crl_file {
                Some(path) => load_crls(path, &ca_certs)?,
                None => Vec::new(),
            },
            certified_key: Arc::new(certified_key),
            roots,
            client_verifier,
        })
    }
}

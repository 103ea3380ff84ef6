//! Making certificates for a ring (`ringctl certs`): one CA, then a certificate per member and
//! per operator, each carrying its [`Identity`].
//!
//! Files, all in one directory:
//!
//! | file | what |
//! | --- | --- |
//! | `ca.pem`, `ca-key.pem` | the ring's CA; keep `ca-key.pem` offline once the ring is set up |
//! | `<role>-<name>.pem`, `<role>-<name>-key.pem` | a certificate and its key |
//!
//! Files are written to a temporary name and renamed, so a reloading `ringd` never reads half a
//! file; keys are created with mode 0600.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use sha2::Digest;

use super::identity::{Identity, Role};

/// Default validity of a CA, in days.
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Default validity of a member or operator certificate, in days.
pub const DEFAULT_CERT_DAYS: u32 = 365;
/// Longest validity accepted, in days.
pub const MAX_DAYS: u32 = 36_500;
/// Most extra host names or addresses in one certificate.
pub const MAX_SANS: usize = 32;

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// A file exists and `--force` was not given.
    #[error("{0} exists; refusing to overwrite it (pass --force to replace it)")]
    Exists(PathBuf),
    /// The CA is missing.
    #[error("no CA in {dir}: run `ringctl certs init --dir {dir}` first")]
    NoCa {
        /// The directory.
        dir: PathBuf,
    },
    /// A file cannot be read or written.
    #[error("{path}: {why}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// Certificate generation failed.
    #[error("cannot make the certificate: {0}")]
    Generate(String),
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertsError + '_ {
    move |e| CertsError::Io {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

fn generate(e: rcgen::Error) -> CertsError {
    CertsError::Generate(e.to_string())
}

/// The certificate and key file names of `identity` in `dir`.
pub fn paths(dir: &Path, identity: &Identity) -> (PathBuf, PathBuf) {
    let stem = format!("{}-{}", identity.role, identity.name);
    (
        dir.join(format!("{stem}.pem")),
        dir.join(format!("{stem}-key.pem")),
    )
}

/// The CA certificate file in `dir`.
pub fn ca_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), CertsError> {
    let tmp = path.with_extension("pem.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(text.as_bytes()).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

fn validity(params: &mut CertificateParams, days: u32) -> Result<(), CertsError> {
    if days == 0 || days > MAX_DAYS {
        return Err(CertsError::Invalid(format!(
            "validity must be 1 to {MAX_DAYS} days, not {days}"
        )));
    }
    let now = time::OffsetDateTime::now_utc();
    // An hour of slack for clocks that are a little behind.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
    Ok(())
}

fn serial(key: &KeyPair) -> SerialNumber {
    let mut hasher = sha2::Sha256::new();
    hasher.update(key.public_key_raw());
    hasher.update(crate::time::unix_ms().to_le_bytes());
    hasher.update(std::process::id().to_le_bytes());
    let mut bytes = hasher.finalize()[..16].to_vec();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

/// Creates `dir/ca.pem` and `dir/ca-key.pem`. Refuses to replace an existing CA unless
/// `force` (which makes every certificate of the old CA useless).
pub fn init_ca(dir: &Path, days: u32, force: bool) -> Result<PathBuf, CertsError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let cert_path = ca_path(dir);
    let key_path = dir.join("ca-key.pem");
    for p in [&cert_path, &key_path] {
        if p.exists() && !force {
            return Err(CertsError::Exists(p.clone()));
        }
    }
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    validity(&mut params, days)?;
    params.serial_number = Some(serial(&key));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut dn = DistinguishedName::new();
    // A distinct name per CA, so a certificate of another ring's CA is reported as "unknown
    // issuer" rather than as a bad signature.
    let tag: String = serial(&key).to_bytes()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dn.push(DnType::CommonName, format!("garden-ring CA {tag}"));
    params.distinguished_name = dn;
    let cert = params.self_signed(&key).map_err(generate)?;
    write_atomically(&key_path, &key.serialize_pem(), 0o600)?;
    write_atomically(&cert_path, &cert.pem(), 0o644)?;
    Ok(cert_path)
}

/// Issues a certificate for `identity`, signed by the CA in `dir`, valid for the extra host
/// names and IP addresses in `sans` (members only need them for tools that check host names;
/// garden-ring itself checks the identity). Returns the certificate and key paths.
pub fn issue(
    dir: &Path,
    identity: &Identity,
    sans: &[String],
    days: u32,
    force: bool,
) -> Result<(PathBuf, PathBuf), CertsError> {
    if sans.len() > MAX_SANS {
        return Err(CertsError::Invalid(format!(
            "at most {MAX_SANS} extra names per certificate"
        )));
    }
    let (cert_path, key_path) = paths(dir, identity);
    if !force {
        for p in [&cert_path, &key_path] {
            if p.exists() {
                return Err(CertsError::Exists(p.clone()));
            }
        }
    }
    let issuer = ca_issuer(dir)?;

    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    validity(&mut params, days)?;
    params.serial_number = Some(serial(&key));
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, identity.name.clone());
    dn.push(
        DnType::OrganizationName,
        format!("garden-ring {}", identity.role),
    );
    params.distinguished_name = dn;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let uri = identity.uri();
    params.subject_alt_names.push(SanType::URI(
        uri.as_str()
            .try_into()
            .map_err(|e: rcgen::Error| CertsError::Generate(e.to_string()))?,
    ));
    if identity.role == Role::Member {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    for san in sans {
        let entry = match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                crate::core::names::check_dns_name(san)
                    .map_err(|why| CertsError::Invalid(format!("host name {san:?} {why}")))?;
                SanType::DnsName(san.as_str().try_into().map_err(generate)?)
            }
        };
        params.subject_alt_names.push(entry);
    }
    let cert = params.signed_by(&key, &issuer).map_err(generate)?;
    write_atomically(&key_path, &key.serialize_pem(), 0o600)?;
    write_atomically(&cert_path, &cert.pem(), 0o644)?;
    Ok((cert_path, key_path))
}

/// The CA in `dir`, ready to sign.
fn ca_issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>, CertsError> {
    let ca_cert = ca_path(dir);
    let ca_key = dir.join("ca-key.pem");
    if !ca_cert.exists() || !ca_key.exists() {
        return Err(CertsError::NoCa {
            dir: dir.to_path_buf(),
        });
    }
    let ca_key_pem = std::fs::read_to_string(&ca_key).map_err(io(&ca_key))?;
    let ca_cert_pem = std::fs::read_to_string(&ca_cert).map_err(io(&ca_cert))?;
    let ca_signing = KeyPair::from_pem(&ca_key_pem).map_err(|_| {
        CertsError::Invalid(format!("{} is not a usable private key", ca_key.display()))
    })?;
    Issuer::from_ca_cert_pem(&ca_cert_pem, ca_signing).map_err(generate)
}

/// Writes to `out` a CRL signed by the CA in `dir` that lists the certificates with the
/// given serial numbers (hex), valid for `days`: for `[tls] crl_file`, and for etcd's
/// `--client-crl-file`.
pub fn write_crl(
    dir: &Path,
    serials: &[String],
    days: u32,
    out: &Path,
) -> Result<PathBuf, CertsError> {
    if days == 0 || days > MAX_DAYS {
        return Err(CertsError::Invalid(format!(
            "validity must be 1 to {MAX_DAYS} days, not {days}"
        )));
    }
    let issuer = ca_issuer(dir)?;
    let now = time::OffsetDateTime::now_utc();
    let mut revoked = Vec::new();
    for serial in serials {
        let hex = crate::core::revocation::serial(serial)
            .map_err(|e| CertsError::Invalid(e.to_string()))?;
        let padded = if hex.len() % 2 == 1 {
            format!("0{hex}")
        } else {
            hex
        };
        let bytes: Vec<u8> = (0..padded.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&padded[i..i + 2], 16).expect("checked hex"))
            .collect();
        revoked.push(rcgen::RevokedCertParams {
            serial_number: SerialNumber::from_slice(&bytes),
            revocation_time: now,
            reason_code: Some(rcgen::RevocationReason::KeyCompromise),
            invalidity_date: None,
        });
    }
    let params = rcgen::CertificateRevocationListParams {
        this_update: now - time::Duration::hours(1),
        next_update: now + time::Duration::days(i64::from(days)),
        crl_number: SerialNumber::from(u64::try_from(now.unix_timestamp()).unwrap_or(1)),
        issuing_distribution_point: None,
        revoked_certs: revoked,
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    };
    let crl = params.signed_by(&issuer).map_err(generate)?;
    write_atomically(out, &crl.pem().map_err(generate)?, 0o644)?;
    Ok(out.to_path_buf())
}

/// Most files `check_dir` reads.
pub const MAX_CHECKED_FILES: usize = 1_024;

/// What `check_dir` found in one file: its certificates' validity, or why it could not be read.
#[derive(Debug)]
pub struct Checked {
    /// The file.
    pub path: PathBuf,
    /// Its certificates (leaf first), or why not.
    pub certs: Result<Vec<super::material::Validity>, String>,
}

/// The certificates in the `*.pem` and `*.crt` files of `dir` (`ringctl certs check`), by file
/// name; files without a certificate (keys) are left out.
pub fn check_dir(dir: &Path) -> Result<Vec<Checked>, CertsError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "pem" || x == "crt"))
        .collect();
    files.sort();
    if files.len() > MAX_CHECKED_FILES {
        return Err(CertsError::Invalid(format!(
            "{} holds {} certificate files; at most {MAX_CHECKED_FILES} are checked",
            dir.display(),
            files.len()
        )));
    }
    let mut out = Vec::new();
    for path in files {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                out.push(Checked {
                    path,
                    certs: Err(e.to_string()),
                });
                continue;
            }
        };
        // Keys hold no certificate: not ours to check. Key bytes are never parsed further.
        if !bytes
            .windows(b"-----BEGIN CERTIFICATE-----".len())
            .any(|w| w == b"-----BEGIN CERTIFICATE-----")
        {
            continue;
        }
        let certs = super::material::parse_certs("certificate file", &path, &bytes)
            .map_err(|e| e.to_string())
            .and_then(|ders| {
                ders.iter()
                    .map(|d| {
                        super::material::Validity::of(d.as_ref())
                            .ok_or_else(|| "a certificate cannot be parsed as X.509".to_string())
                    })
                    .collect()
            });
        out.push(Checked { path, certs });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::material::{Material, TlsFiles};

    fn files(dir: &Path, identity: &Identity) -> TlsFiles {
        let (cert_file, key_file) = paths(dir, identity);
        TlsFiles {
            ca_file: ca_path(dir),
            cert_file,
            key_file,
            crl_file: None,
        }
    }

    #[test]
    fn issued_certificates_load_with_their_identity() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), 30, false).unwrap();
        let member = Identity::new(Role::Member, "a").unwrap();
        let admin = Identity::new(Role::Admin, "alice").unwrap();
        issue(
            dir.path(),
            &member,
            &["127.0.0.1".into(), "a.example".into()],
            30,
            false,
        )
        .unwrap();
        issue(dir.path(), &admin, &[], 30, false).unwrap();
        let m = Material::load(&files(dir.path(), &member), Some(&member)).unwrap();
        assert_eq!(m.identity, member);
        assert_eq!(m.cert_sha256.len(), 64);
        let a = Material::load(&files(dir.path(), &admin), None).unwrap();
        assert_eq!(a.identity, admin);
        // A member certificate is not an admin's.
        let err = Material::load(&files(dir.path(), &member), Some(&admin))
            .err()
            .unwrap();
        assert!(err.to_string().contains("is for member:a"), "{err}");
    }

    #[test]
    fn refuses_to_overwrite_and_checks_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let member = Identity::new(Role::Member, "a").unwrap();
        assert!(matches!(
            issue(dir.path(), &member, &[], 30, false),
            Err(CertsError::NoCa { .. })
        ));
        init_ca(dir.path(), 30, false).unwrap();
        assert!(matches!(
            init_ca(dir.path(), 30, false),
            Err(CertsError::Exists(_))
        ));
        issue(dir.path(), &member, &[], 30, false).unwrap();
        assert!(matches!(
            issue(dir.path(), &member, &[], 30, false),
            Err(CertsError::Exists(_))
        ));
        issue(dir.path(), &member, &[], 30, true).unwrap();
        assert!(issue(dir.path(), &member, &["bad name!".into()], 30, true).is_err());
        assert!(issue(dir.path(), &member, &[], 0, true).is_err());
    }

    #[test]
    fn a_certificate_of_another_ca_is_untrusted_and_keys_are_not_echoed() {
        let ours = tempfile::tempdir().unwrap();
        let theirs = tempfile::tempdir().unwrap();
        let member = Identity::new(Role::Member, "a").unwrap();
        for d in [ours.path(), theirs.path()] {
            init_ca(d, 30, false).unwrap();
            issue(d, &member, &[], 30, false).unwrap();
        }
        let mut mixed = files(theirs.path(), &member);
        mixed.ca_file = ca_path(ours.path());
        let err = Material::load(&mixed, None).err().unwrap().to_string();
        assert!(err.contains("is not valid under CA file"), "{err}");

        // A key file that is not a key: the error names the file, not its content.
        let mut broken = files(ours.path(), &member);
        std::fs::write(&broken.key_file, "SECRET-MARKER-0xdeadbeef not a key").unwrap();
        let err = Material::load(&broken, None).err().unwrap().to_string();
        assert!(err.contains("key file"), "{err}");
        assert!(!err.contains("SECRET-MARKER"), "{err}");
        // A key of another certificate.
        broken.key_file = paths(theirs.path(), &member).1;
        let err = Material::load(&broken, None).err().unwrap().to_string();
        assert!(err.contains("does not match"), "{err}");
    }
}

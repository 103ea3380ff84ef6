//! `ringctl`'s client configuration file, like a kubeconfig: where the ring is and which
//! certificate to present.
//!
//! ```toml
//! endpoints = ["10.0.1.10:7400", "10.0.2.10:7400", "10.0.3.10:7400"]
//! ca_file = "ca.pem"            # relative paths are relative to this file
//! cert_file = "admin-alice.pem"
//! key_file = "admin-alice-key.pem"
//! # insecure = true            # instead of the three files: a ring without TLS
//! ```
//!
//! `ringctl` reads it from `--config FILE` or the `RINGCTL_CONFIG` environment variable;
//! `--endpoint`, `--ca-file`, `--cert-file`, `--key-file` and `--insecure` override it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::core::names::check_address;
use crate::tls::material::load_roots;
use crate::tls::{Security, TlsError, TlsFiles, TlsStore};

/// Most endpoints a client config may list.
pub const MAX_ENDPOINTS: usize = 64;

/// The client configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// Admin endpoints (`host:port`) of the members.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// CA bundle to trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (an `admin` or `viewer` one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Talk to a ring that runs without TLS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

impl ClientConfig {
    /// Reads `path`; relative file paths in it are resolved against its directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config: Self = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        for file in [
            &mut config.ca_file,
            &mut config.cert_file,
            &mut config.key_file,
        ]
        .into_iter()
        .flatten()
        {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks endpoints and the TLS choice.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, why: String| ConfigError::Invalid {
            field: field.into(),
            why,
        };
        if self.endpoints.len() > MAX_ENDPOINTS {
            return Err(invalid(
                "endpoints",
                format!("at most {MAX_ENDPOINTS} endpoints"),
            ));
        }
        for e in &self.endpoints {
            check_address(e).map_err(|why| invalid("endpoints", format!("{e:?} {why}")))?;
        }
        let files = [&self.ca_file, &self.cert_file, &self.key_file];
        let given = files.iter().filter(|f| f.is_some()).count();
        if self.insecure && given > 0 {
            return Err(invalid(
                "insecure",
                "must not be true together with ca_file, cert_file or key_file".into(),
            ));
        }
        if !self.insecure && self.ca_file.is_none() {
            return Err(invalid(
                "ca_file",
                "is needed, with cert_file and key_file (or insecure = true for a ring without TLS)"
                    .into(),
            ));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(invalid(
                "cert_file",
                "cert_file and key_file go together".into(),
            ));
        }
        Ok(())
    }

    /// The TLS files, when TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            ca_file: self.ca_file.clone()?,
            cert_file: self.cert_file.clone()?,
            key_file: self.key_file.clone()?,
            crl_file: None,
        })
    }

    /// Loads the certificates (when TLS is on). With a CA file but no certificate, the client
    /// connects over TLS without one, and the ring explains what is missing.
    pub fn security(&self) -> Result<Security, TlsError> {
        if let Some(files) = self.tls_files() {
            return Ok(Security::Tls(TlsStore::load(files, None)?));
        }
        match &self.ca_file {
            Some(ca) => Ok(Security::TlsWithoutCertificate(load_roots(ca)?)),
            None => Ok(Security::Insecure),
        }
    }

    /// Renders the file.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a client config always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_and_validation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ringctl.toml");
        std::fs::write(
            &path,
            "endpoints = [\"127.0.0.1:7400\"]\nca_file = \"ca.pem\"\ncert_file = \"/abs/c.pem\"\nkey_file = \"k.pem\"\n",
        )
        .unwrap();
        let c = ClientConfig::load(&path).unwrap();
        assert_eq!(c.ca_file.unwrap(), dir.path().join("ca.pem"));
        assert_eq!(c.cert_file.unwrap(), PathBuf::from("/abs/c.pem"));

        for (text, field) in [
            ("endpoints = [\"nope\"]\ninsecure = true", "endpoints"),
            ("endpoints = []", "ca_file"),
            ("ca_file = \"ca.pem\"\ncert_file = \"c.pem\"", "cert_file"),
            ("insecure = true\nca_file = \"x\"", "insecure"),
        ] {
            std::fs::write(&path, text).unwrap();
            match ClientConfig::load(&path) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        std::fs::write(&path, "endpoint = []").unwrap();
        assert!(matches!(
            ClientConfig::load(&path),
            Err(ConfigError::Parse { .. })
        ));
    }
}

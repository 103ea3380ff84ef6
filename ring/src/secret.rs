//! Secrets: private keys today; TSIG keys and object-store credentials as they arrive.
//!
//! A [`Secret`] is read from a file or an environment variable, never from the command line or
//! the replicated state (both end up in logs, `ps` and history). It has no `Display`, and its
//! `Debug` prints only where it came from, so a secret cannot reach a log line, a status
//! response or an error message by accident; errors about a secret name its source, never its
//! content.

use std::fmt;
use std::path::{Path, PathBuf};

/// Largest secret read, in bytes (a private key or a credentials file is a few KiB).
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// A file (mode 0600 recommended).
    File(PathBuf),
    /// An environment variable.
    Env(String),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::File(p) => write!(f, "file {}", p.display()),
            SecretSource::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

impl SecretSource {
    /// Parses `file:/path`, `env:NAME`, or a plain path (a file).
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        if let Some(var) = text.strip_prefix("env:") {
            if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(SecretError::BadReference(format!(
                    "environment variable name {var:?} must be letters, digits and '_'"
                )));
            }
            return Ok(SecretSource::Env(var.to_string()));
        }
        let path = text.strip_prefix("file:").unwrap_or(text);
        if path.is_empty() {
            return Err(SecretError::BadReference("empty file path".into()));
        }
        Ok(SecretSource::File(PathBuf::from(path)))
    }

    /// Reads the secret.
    pub fn load(&self) -> Result<Secret, SecretError> {
        match self {
            SecretSource::File(path) => Secret::from_file(path),
            SecretSource::Env(var) => match std::env::var_os(var) {
                Some(v) => Ok(Secret {
                    bytes: v.into_encoded_bytes(),
                    source: self.clone(),
                }),
                None => Err(SecretError::Missing(self.clone())),
            },
        }
    }
}

/// Secret bytes; see the module docs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    bytes: Vec<u8>,
    source: SecretSource,
}

impl Secret {
    /// Reads a secret file (at most [`MAX_SECRET_BYTES`]).
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let source = SecretSource::File(path.to_path_buf());
        let io = |e: std::io::Error| SecretError::Read {
            source_name: source.to_string(),
            why: e.to_string(),
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge(source));
        }
        let bytes = std::fs::read(path).map_err(io)?;
        Ok(Self { bytes, source })
    }

    /// The secret's bytes. Hand them to the code that needs them; never format them.
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    /// Where it came from.
    pub fn source(&self) -> &SecretSource {
        &self.source
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret(<redacted, {} bytes from {}>)",
            self.bytes.len(),
            self.source
        )
    }
}

/// A secret that cannot be read. Never carries the secret's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// A `file:`/`env:` reference that is malformed.
    #[error("bad secret reference: {0}")]
    BadReference(String),
    /// The environment variable is not set.
    #[error("secret {0} is not set")]
    Missing(SecretSource),
    /// The file cannot be read.
    #[error("cannot read secret {source_name}: {why}")]
    Read {
        /// The source, in words.
        source_name: String,
        /// Why.
        why: String,
    },
    /// The file is larger than [`MAX_SECRET_BYTES`].
    #[error("secret {0} is larger than {MAX_SECRET_BYTES} bytes")]
    TooLarge(SecretSource),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "hunter2-very-secret").unwrap();
        let secret = Secret::from_file(&path).unwrap();
        assert_eq!(secret.expose(), b"hunter2-very-secret");
        let shown = format!("{secret:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("19 bytes"), "{shown}");
    }

    #[test]
    fn references_parse() {
        assert_eq!(
            SecretSource::parse("env:TSIG_KEY").unwrap(),
            SecretSource::Env("TSIG_KEY".into())
        );
        assert_eq!(
            SecretSource::parse("file:/etc/k").unwrap(),
            SecretSource::File("/etc/k".into())
        );
        assert_eq!(
            SecretSource::parse("/etc/k").unwrap(),
            SecretSource::File("/etc/k".into())
        );
        assert!(SecretSource::parse("env:").is_err());
        assert!(SecretSource::parse("env:A-B").is_err());
        assert!(SecretSource::parse("file:").is_err());
    }

    #[test]
    fn missing_env_names_the_variable_only() {
        let err = SecretSource::Env("GARDEN_RING_TEST_UNSET_VAR".into())
            .load()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "secret environment variable GARDEN_RING_TEST_UNSET_VAR is not set"
        );
    }
}

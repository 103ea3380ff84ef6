//! Backup locations: a URL (`s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`,
//! `file:///abs/path`) opened as an object store plus the prefix under which
//! etcd-backup-restore's `v2/` directory lives.
//!
//! - The URL syntax is checked by [`check_backup_url`] first (no credentials, query, `%` or
//!   `..` in it), so a location's [`Display`](fmt::Display) is safe to log as it is.
//! - `s3://` uses [`BackupSettings`]: endpoint, region, path or virtual-hosted style, plain
//!   http, and credentials from a small TOML file or the standard AWS environment variables.
//!   `gs://` and `az://` take everything from the standard Google and Azure environment
//!   variables. `file://` is a directory (created if missing) written with fsync.
//! - [`BackupLocation::store_id`] tells whether two locations share one store, i.e. whether
//!   the store can copy between them server-side (same bucket on the same endpoint).
//! - Secrets never reach an error, `Debug` or `Display`: errors name the URL (with anything
//!   that looks like credentials cut out) and the credentials file, never its content.
//!
//! Requests use object_store's clients with these limits: connecting may take
//! [`CONNECT_TIMEOUT_MS`], a response may stall between two reads for at most
//! [`READ_TIMEOUT_MS`], and one request may last [`REQUEST_TIMEOUT_MS`] in all (a whole
//! snapshot download is one request). object_store retries a failed request itself at most
//! [`STORE_MAX_RETRIES`] times within [`STORE_RETRY_TIMEOUT_MS`]; longer outages are the
//! caller's to retry (see `copy.rs`).

use std::fmt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use crate::config::BackupSettings;
use crate::core::backup_name::BackupPrefix;
use crate::core::names::Invalid;
use crate::core::names::check_backup_url;
use crate::secret::{MAX_SECRET_BYTES, Secret, SecretError};

/// How long connecting to an object store may take, in ms.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Longest pause between two reads of a response before the request fails, in ms.
pub const READ_TIMEOUT_MS: u64 = 30_000;
/// Longest one request may last, in ms (one hour: a whole snapshot is streamed in one GET).
pub const REQUEST_TIMEOUT_MS: u64 = 3_600_000;
/// Retries object_store makes of one failed request before reporting the error.
pub const STORE_MAX_RETRIES: usize = 3;
/// Time after the first try of a request within which object_store retries it, in ms.
pub const STORE_RETRY_TIMEOUT_MS: u64 = 30_000;
/// Longest value in a credentials file, in bytes (session tokens run to a few KiB).
pub const MAX_CREDENTIAL_LEN: usize = 8 * 1024;

/// Why a backup location cannot be opened. Never carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    /// The URL is malformed or unsupported.
    #[error("backup location {url} is not valid: {why}")]
    Url {
        /// The URL, with anything that could be credentials cut out (see [`redact_url`]).
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The S3 credentials file cannot be used.
    #[error("S3 credentials file {}: {why}", file.display())]
    Credentials {
        /// The file.
        file: PathBuf,
        /// What is wrong with it (never its content).
        why: String,
    },
    /// The directory of a `file://` location cannot be created or opened.
    #[error("backup location {url}: cannot use directory {}: {why}", dir.display())]
    Directory {
        /// The URL.
        url: String,
        /// The directory.
        dir: PathBuf,
        /// Why.
        why: String,
    },
    /// object_store refused the settings (missing bucket, bad environment variable, ...).
    #[error("backup location {url}: cannot set up the object store: {why}")]
    Store {
        /// The URL.
        url: String,
        /// object_store's message.
        why: String,
    },
}

/// Where a location's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Amazon S3 or an S3-compatible server.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
    /// A local directory.
    File,
}

impl Scheme {
    /// The URL scheme.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
            Scheme::File => "file",
        }
    }
}

/// An opened backup location; see the [module docs](self).
#[derive(Clone)]
pub struct BackupLocation {
    url: String,
    scheme: Scheme,
    prefix: Path,
    backup_prefix: BackupPrefix,
    store: Arc<dyn ObjectStore>,
    store_id: String,
}

impl BackupLocation {
    /// Checks `url` and opens its store with `settings` (see the [module docs](self)). A
    /// `file://` directory is created if missing. Nothing is sent to the store yet.
    pub fn parse(url: &str, settings: &BackupSettings) -> Result<Self, LocationError> {
        let bad = |why: String| LocationError::Url {
            url: redact_url(url),
            why,
        };
        check_backup_url(url).map_err(|why| bad(why.into()))?;
        // One trailing '/' is allowed; the canonical form has none ("file:///" keeps its root).
        let canonical = match url.strip_suffix('/') {
            Some(trimmed) if !trimmed.ends_with("://") && !trimmed.ends_with(":/") => trimmed,
            _ => url,
        };
        let (scheme, rest) = canonical
            .split_once("://")
            .ok_or_else(|| bad("has no scheme".into()))?;
        let store_error = |e: object_store::Error| LocationError::Store {
            url: canonical.to_string(),
            why: e.to_string(),
        };
        let (scheme, prefix, store, store_id): (_, &str, Arc<dyn ObjectStore>, _) = match scheme {
            "file" => {
                let dir = PathBuf::from(rest);
                let dir_error = |why: String| LocationError::Directory {
                    url: canonical.to_string(),
                    dir: dir.clone(),
                    why,
                };
                std::fs::create_dir_all(&dir).map_err(|e| dir_error(e.to_string()))?;
                let store = LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| dir_error(e.to_string()))?
                    .with_fsync(true);
                let id = format!("file://{}", dir.display());
                (Scheme::File, "", Arc::new(store), id)
            }
            "s3" | "gs" | "az" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                let (scheme, store, id): (_, Arc<dyn ObjectStore>, _) = match scheme {
                    "s3" => {
                        let store = s3_builder(settings)?
                            .with_bucket_name(bucket)
                            .build()
                            .map_err(store_error)?;
                        let at = settings
                            .s3_endpoint
                            .clone()
                            .unwrap_or_else(|| format!("aws:{}", settings.s3_region));
                        (Scheme::S3, Arc::new(store), format!("s3://{bucket}@{at}"))
                    }
                    "gs" => {
                        let store = GoogleCloudStorageBuilder::from_env()
                            .with_bucket_name(bucket)
                            .with_client_options(client_options())
                            .with_retry(retry_config())
                            .build()
                            .map_err(store_error)?;
                        (Scheme::Gcs, Arc::new(store), format!("gs://{bucket}"))
                    }
                    _ => {
                        let builder = MicrosoftAzureBuilder::from_env()
                            .with_container_name(bucket)
                            .with_client_options(client_options())
                            .with_retry(retry_config());
                        let account = builder
                            .get_config_value(&AzureConfigKey::AccountName)
                            .unwrap_or_default();
                        let store = builder.build().map_err(store_error)?;
                        let id = format!("az://{account}/{bucket}");
                        (Scheme::Azure, Arc::new(store), id)
                    }
                };
                (scheme, prefix, store, id)
            }
            other => return Err(bad(format!("scheme {other:?} is not supported"))),
        };
        let object_prefix = Path::parse(prefix).map_err(|e| bad(e.to_string()))?;
        let backup_prefix = BackupPrefix::new(prefix).map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            url: canonical.to_string(),
            scheme,
            prefix: object_prefix,
            backup_prefix,
            store,
            store_id,
        })
    }

    /// The store holding this location's objects.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// The prefix inside the store (empty for `file://`, whose directory is the store's root).
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The same prefix, as snapshot keys are built and parsed with it.
    pub fn backup_prefix(&self) -> &BackupPrefix {
        &self.backup_prefix
    }

    /// Where etcd-backup-restore's layout-v2 snapshots live: `<prefix>/v2`.
    pub fn v2_dir(&self) -> Path {
        self.prefix
            .clone()
            .join(crate::core::backup_name::LAYOUT_V2)
    }

    /// Which store this is: scheme, bucket and endpoint (`s3://bucket@http://127.0.0.1:9000`,
    /// `gs://bucket`, `az://account/container`, `file:///dir`). Two locations with the same id
    /// are in one bucket of one service, so the store can copy between them server-side.
    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The URL, without a trailing `/` (it never holds a secret: see [`check_backup_url`]).
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl fmt::Display for BackupLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl fmt::Debug for BackupLocation {
    /// The URL and store id only: object_store's builders and clients hold the credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackupLocation")
            .field("url", &self.url)
            .field("store_id", &self.store_id)
            .finish_non_exhaustive()
    }
}

/// The client limits of the [module docs](self).
fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .with_read_timeout(Duration::from_millis(READ_TIMEOUT_MS))
        .with_timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
}

/// object_store's own retries of one request: few and short, so an outage surfaces to the
/// caller's retry loop (which restarts a whole object) instead of hanging inside one request.
fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: STORE_MAX_RETRIES,
        retry_timeout: Duration::from_millis(STORE_RETRY_TIMEOUT_MS),
    }
}

fn s3_builder(settings: &BackupSettings) -> Result<AmazonS3Builder, LocationError> {
    let mut builder = match &settings.credentials_file {
        // Only the file's credentials: a session token from the environment must not be
        // mixed with keys from the file.
        Some(file) => {
            let credentials = S3Credentials::load(file)?;
            let builder = AmazonS3Builder::new()
                .with_access_key_id(credentials.access_key_id)
                .with_secret_access_key(credentials.secret_access_key);
            match credentials.session_token {
                Some(token) => builder.with_token(token),
                None => builder,
            }
        }
        None => AmazonS3Builder::from_env(),
    };
    builder = builder
        .with_client_options(client_options())
        .with_retry(retry_config())
        .with_region(&settings.s3_region)
        .with_allow_http(settings.s3_allow_http)
        .with_virtual_hosted_style_request(settings.s3_virtual_hosted_style);
    if let Some(endpoint) = &settings.s3_endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(builder)
}

/// S3 credentials read from a credentials file; `Debug` shows the key id's length only.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "S3Credentials(<redacted>, session token: {})",
            self.session_token.is_some()
        )
    }
}

impl S3Credentials {
    /// Reads a credentials file: TOML with `access_key_id` and `secret_access_key` (strings),
    /// optionally `session_token`, nothing else; at most [`MAX_SECRET_BYTES`].
    pub fn load(file: &FsPath) -> Result<Self, LocationError> {
        let fail = |why: String| LocationError::Credentials {
            file: file.to_path_buf(),
            why,
        };
        let secret = Secret::from_file(file).map_err(|e| match e {
            SecretError::TooLarge(_) => fail(format!(
                "is larger than {MAX_SECRET_BYTES} bytes; it should hold three short keys"
            )),
            SecretError::Read { why, .. } => fail(format!("cannot be read: {why}")),
            other => fail(other.to_string()),
        })?;
        Self::parse(secret.expose()).map_err(|why| fail(why.into()))
    }

    /// Parses the file's content; errors never quote it (only line numbers and key names).
    fn parse(bytes: &[u8]) -> Result<Self, Invalid> {
        let text = std::str::from_utf8(bytes).map_err(|_| Invalid::from("is not UTF-8 text"))?;
        // toml's own messages quote the offending line, which may hold a secret: report only
        // where the problem is.
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            Invalid(match line {
                Some(line) => format!(
                    "is not valid TOML (line {line}); expected access_key_id = \"...\" and secret_access_key = \"...\""
                ),
                None => "is not valid TOML; expected access_key_id = \"...\" and secret_access_key = \"...\"".into(),
            })
        })?;
        const KNOWN: [&str; 3] = ["access_key_id", "secret_access_key", "session_token"];
        if let Some(unknown) = table.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(Invalid(format!(
                "has an unknown key {:?} (expected access_key_id, secret_access_key and optionally session_token)",
                crate::core::error::shorten(unknown)
            )));
        }
        let value = |key: &str| -> Result<Option<String>, Invalid> {
            let Some(value) = table.get(key) else {
                return Ok(None);
            };
            let text = value
                .as_str()
                .ok_or_else(|| Invalid(format!("{key} must be a string")))?;
            if text.is_empty() || text.len() > MAX_CREDENTIAL_LEN {
                return Err(Invalid(format!(
                    "{key} must be 1 to {MAX_CREDENTIAL_LEN} bytes long"
                )));
            }
            if !text.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Invalid(format!(
                    "{key} must be printable ASCII without whitespace"
                )));
            }
            Ok(Some(text.to_string()))
        };
        let required = |key: &str| value(key)?.ok_or_else(|| Invalid(format!("has no {key}")));
        Ok(Self {
            access_key_id: required("access_key_id")?,
            secret_access_key: required("secret_access_key")?,
            session_token: value("session_token")?,
        })
    }
}

/// `url` fit for an error message: cut to 200 bytes, with any user-info (`key:secret@`),
/// query and fragment replaced by `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(at) = out.find(['?', '#']) {
        out.truncate(at);
        out.push_str("<redacted>");
    }
    if let Some(at) = out.rfind('@') {
        let start = out.find("://").map_or(0, |i| i + 3).min(at);
        out.replace_range(start..at, "<redacted>");
    }
    if out.len() > 200 {
        let mut end = 200;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str("...");
    }
    format!("{out:?}")
}

/// Whether an object-store error may go away when the request is tried again later: server
/// errors (5xx), throttling (429), timeouts, dropped connections, interrupted streams. A
/// missing object or bucket, a refused permission or credential, any other 4xx answer, an
/// invalid path or an unsupported operation will not.
pub fn is_retryable(error: &object_store::Error) -> bool {
    match error {
        object_store::Error::Generic { .. } => match http_status(error) {
            Some(status) => status == 408 || status == 429 || status >= 500,
            None => true,
        },
        object_store::Error::JoinError { .. } => true,
        _ => false,
    }
}

/// The HTTP status of a failed request inside an object_store error, if any. object_store
/// 0.14 maps only some statuses to variants (404 to `NotFound`, 403 to `PermissionDenied`) and
/// wraps the rest, or a 404 from a listing, in `Generic` with its status kept in a private
/// type; the message it formats ("Server returned non-2xx status code: 404 Not Found") is
/// the only public trace of it.
fn http_status(error: &(dyn std::error::Error + 'static)) -> Option<u16> {
    const MARK: &str = "non-2xx status code: ";
    let mut current = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if let Some(at) = text.find(MARK) {
            let digits = text.get(at + MARK.len()..at + MARK.len() + 3)?;
            return digits.parse().ok();
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BackupSettings {
        BackupSettings {
            s3_endpoint: Some("http://127.0.0.1:9".into()),
            s3_allow_http: true,
            ..BackupSettings::default()
        }
    }

    #[test]
    fn s3_urls_open_with_prefix_and_store_id() {
        let loc =
            BackupLocation::parse("s3://bucket-a/shoot--dev/etcd-main/", &settings()).unwrap();
        assert_eq!(loc.to_string(), "s3://bucket-a/shoot--dev/etcd-main");
        assert_eq!(loc.prefix().as_ref(), "shoot--dev/etcd-main");
        assert_eq!(loc.v2_dir().as_ref(), "shoot--dev/etcd-main/v2");
        assert_eq!(loc.backup_prefix().as_str(), "shoot--dev/etcd-main");
        assert_eq!(loc.store_id(), "s3://bucket-a@http://127.0.0.1:9");
        assert_eq!(loc.scheme(), Scheme::S3);

        let other_prefix = BackupLocation::parse("s3://bucket-a/other", &settings()).unwrap();
        assert_eq!(other_prefix.store_id(), loc.store_id());
        let other_bucket = BackupLocation::parse("s3://bucket-b/x", &settings()).unwrap();
        assert_ne!(other_bucket.store_id(), loc.store_id());
        let bare = BackupLocation::parse("s3://bucket-a", &settings()).unwrap();
        assert_eq!(bare.prefix().as_ref(), "");
        assert_eq!(bare.v2_dir().as_ref(), "v2");
    }

    #[test]
    fn file_urls_create_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b");
        let url = format!("file://{}/", path.display());
        let loc = BackupLocation::parse(&url, &BackupSettings::default()).unwrap();
        assert!(path.is_dir());
        assert_eq!(loc.to_string(), format!("file://{}", path.display()));
        assert_eq!(loc.prefix().as_ref(), "");
        assert_eq!(loc.store_id(), format!("file://{}", path.display()));
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_secrets() {
        for bad in [
            "",
            "http://bucket/x",
            "s3://b/x",
            "s3://bucket/../x",
            "file://relative",
            "s3://AKIDEXAMPLE:hunter2@bucket/x",
            "s3://bucket/x?secret=hunter2",
            "s3://bucket/x#hunter2",
        ] {
            let err = BackupLocation::parse(bad, &settings()).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, LocationError::Url { .. }), "{bad}: {text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn credentials_parse_and_never_show() {
        let good = S3Credentials::parse(
            b"access_key_id = \"AKIDEXAMPLE\"\nsecret_access_key = \"hunter2-secret\"\n",
        )
        .unwrap();
        assert_eq!(good.session_token, None);
        let shown = format!("{good:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("AKID"),
            "{shown}"
        );

        let cases: &[(&[u8], &str)] = &[
            (b"access_key_id = hunter2\n", "line 1"),
            (b"secret_access_key = \"hunter2\"\n", "has no access_key_id"),
            (b"access_key_id = \"a\"\n", "has no secret_access_key"),
            (
                b"access_key_id = \"a\"\nsecret_access_key = 5\n",
                "secret_access_key must be a string",
            ),
            (
                b"access_key_id = \"a\"\nsecret_access_key = \"hunter2 x\"\n",
                "printable ASCII",
            ),
            (
                b"access_key_id = \"a\"\nsecret_access_key = \"\"\n",
                "1 to 8192 bytes",
            ),
            (
                b"access_key_id = \"a\"\nsecret_acess_key = \"hunter2\"\n",
                "unknown key",
            ),
            (b"\xff\xfe", "not UTF-8"),
        ];
        for (text, expected) in cases {
            let err = S3Credentials::parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} (expected {expected})");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn retryable_errors() {
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        };
        assert!(is_retryable(&generic("connection refused")));
        assert!(is_retryable(&generic(
            "Error performing PUT - Server returned non-2xx status code: 503 Service Unavailable"
        )));
        assert!(is_retryable(&generic(
            "non-2xx status code: 429 Too Many Requests"
        )));
        assert!(!is_retryable(&generic(
            "Error performing list request: Server returned non-2xx status code: 404 Not Found"
        )));
        assert!(!is_retryable(&generic(
            "non-2xx status code: 400 Bad Request"
        )));
        assert!(!is_retryable(&object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        }));
        assert!(!is_retryable(&object_store::Error::PermissionDenied {
            path: "x".into(),
            source: "no".into(),
        }));
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("s3://key:secret@bucket/x?a=b"),
            "\"s3://<redacted>@bucket/x<redacted>\""
        );
        assert_eq!(redact_url("s3://bucket/x"), "\"s3://bucket/x\"");
        assert!(redact_url(&"x".repeat(500)).len() < 220);
    }
}

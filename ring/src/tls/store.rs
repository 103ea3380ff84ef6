//! The current certificate material, reloaded when its files change.
//!
//! [`TlsStore::run_reloader`] polls the three files (a content digest, so a same-size rewrite or
//! a Kubernetes secret's symlink swap is seen) and swaps in the new material only after it
//! loaded and checked completely; a half-written or broken set is reported once and the
//! current material stays in use. New connections use the new material at once; subscribers
//! of [`TlsStore::watch`] (the peer pool) drop their connections so that outgoing connections
//! present the new certificate too.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sha2::Digest;
use tokio::sync::watch;

use super::identity::Identity;
use super::material::{Material, TlsError, TlsFiles};
use super::revocation::Revocations;

/// What [`TlsStore::status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsStatus {
    /// The identity in use.
    pub identity: String,
    /// SHA-256 of the certificate in use.
    pub cert_sha256: String,
    /// SHA-256 of the first CA certificate in use.
    pub ca_sha256: String,
    /// End of the certificate's validity, Unix seconds.
    pub not_after_unix_s: i64,
    /// When the material in use was loaded, Unix milliseconds.
    pub loaded_at_unix_ms: u64,
    /// Why the files on disk could not be loaded at the last attempt (the previous material
    /// stays in use), or empty.
    pub reload_error: String,
    /// The trusted CA certificates, with the end of their validity.
    pub cas: Vec<super::material::Validity>,
}

struct Current {
    material: Arc<Material>,
    digest: [u8; 32],
    loaded_at_unix_ms: u64,
}

/// Certificate material of one process, with hot reload.
pub struct TlsStore {
    files: TlsFiles,
    expected: Option<Identity>,
    current: RwLock<Current>,
    reload_error: Mutex<Option<String>>,
    generation: watch::Sender<u64>,
    revocations: Arc<Revocations>,
}

fn digest(files: &TlsFiles) -> [u8; 32] {
    let mut hasher = sha2::Sha256::new();
    for path in [&files.ca_file, &files.cert_file, &files.key_file]
        .into_iter()
        .chain(files.crl_file.as_ref())
    {
        // A missing file hashes as empty: the load that follows reports it.
        let bytes = std::fs::read(path).unwrap_or_default();
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    hasher.finalize().into()
}

impl TlsStore {
    /// Loads `files`; with `expected`, the certificate must carry that identity now and after
    /// every reload.
    pub fn load(files: TlsFiles, expected: Option<Identity>) -> Result<Arc<Self>, TlsError> {
        let digest = digest(&files);
        let material = Material::load(&files, expected.as_ref())?;
        let revocations = Arc::new(Revocations::default());
        revocations.set_crl(files.crl_file.as_deref(), &material.crl);
        Ok(Arc::new(Self {
            files,
            expected,
            current: RwLock::new(Current {
                material: Arc::new(material),
                digest,
                loaded_at_unix_ms: crate::time::unix_ms(),
            }),
            reload_error: Mutex::new(None),
            generation: watch::channel(0).0,
            revocations,
        }))
    }

    /// The material in use.
    pub fn current(&self) -> Arc<Material> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .material
            .clone()
    }

    /// Changes every time new material is swapped in.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The certificates refused although the CA signed them.
    pub fn revocations(&self) -> &Arc<Revocations> {
        &self.revocations
    }

    /// The files this store reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// What is in use, and the last reload problem.
    pub fn status(&self) -> TlsStatus {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        let m = &current.material;
        TlsStatus {
            identity: m.identity.to_string(),
            cert_sha256: m.cert_sha256.clone(),
            ca_sha256: m.ca_sha256.clone(),
            not_after_unix_s: m.not_after_unix_s,
            cas: m.cas.clone(),
            loaded_at_unix_ms: current.loaded_at_unix_ms,
            reload_error: self
                .reload_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default(),
        }
    }

    /// Reloads when the files changed. `Ok(true)` when new material is in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let digest = digest(&self.files);
        if digest
            == self
                .current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .digest
        {
            return Ok(false);
        }
        let material = Material::load(&self.files, self.expected.as_ref())?;
        // Complete and checked: its CRL replaces the previous one as a whole.
        self.revocations
            .set_crl(self.files.crl_file.as_deref(), &material.crl);
        {
            let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
            *current = Current {
                material: Arc::new(material),
                digest,
                loaded_at_unix_ms: crate::time::unix_ms(),
            };
        }
        self.generation.send_modify(|g| *g += 1);
        Ok(true)
    }

    /// Polls the files every `interval` until `stop` turns true, reloading on change and
    /// logging each new certificate and each new problem once.
    pub async fn run_reloader(
        self: Arc<Self>,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let store = self.clone();
            let outcome = tokio::task::spawn_blocking(move || store.reload_if_changed()).await;
            let mut error = self.reload_error.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(Ok(true)) => {
                    let m = self.current();
                    tracing::info!(
                        identity = %m.identity,
                        certificate_sha256 = %m.cert_sha256,
                        not_after_unix_s = m.not_after_unix_s,
                        "loaded new TLS certificates; new connections use them"
                    );
                    *error = None;
                }
                // The files on disk are those in use (also when a broken set was put back as it
                // was): nothing to report any more.
                Ok(Ok(false)) => {
                    if error.take().is_some() {
                        tracing::info!("TLS files are back to those in use");
                    }
                }
                Ok(Err(e)) => {
                    let text = e.to_string();
                    if error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(
                            "TLS files changed but cannot be used, keeping the current certificates: {text}"
                        );
                        *error = Some(text);
                    }
                }
                Err(e) => tracing::error!("TLS reload task failed: {e}"),
            }
        }
    }
}

impl std::fmt::Debug for TlsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStore")
            .field("files", self.files())
            .finish_non_exhaustive()
    }
}

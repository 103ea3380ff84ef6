//! What every etcd instance of one member shares ([`EtcdRuntime`]: binaries, data root,
//! settings, the guard, timings, and where instances report), and when each took its newest
//! snapshot ([`SnapshotTimes`], for `/metrics`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::backup_status::BackupStatuses;
use crate::config::{BackupSettings, EtcdDriverSettings};
use crate::core::Timing;
use crate::tls::material::TlsFiles;

/// What every instance of one member shares: where the binaries and data are, how backups
/// are reached, the guard, and the timings.
#[derive(Debug, Clone)]
pub struct EtcdRuntime {
    /// This member's name.
    pub member: String,
    /// The directory with `etcd` and `etcdctl`/`etcdutl`.
    pub bin_dir: PathBuf,
    /// Where the data directories go.
    pub data_root: PathBuf,
    /// `[driver.etcd]`.
    pub settings: EtcdDriverSettings,
    /// `[backup]`.
    pub backup: BackupSettings,
    /// The `ring-guard` binary.
    pub guard_binary: PathBuf,
    /// The ring's timings (`fence_ms`: how long a workload may take to stop after its
    /// deadline; the lease, and the intervals derived from it).
    pub timing: Timing,
    /// When each instance last took a snapshot (for `/metrics`).
    pub snapshots: Arc<SnapshotTimes>,
    /// Each instance's newest backup report (for the lease renewals and `/metrics`).
    pub backups: Arc<BackupStatuses>,
    /// The certificate, key and CA the etcd members of zone-tolerant control planes use with
    /// their peers: this member's own (`[tls]`); `None` in an insecure ring (plain `http`).
    pub peer_tls: Option<TlsFiles>,
}

/// When the newest successful snapshot of each control plane this member hosts was taken:
/// `garden_ring_snapshot_age_seconds`. An instance records each snapshot it stores (periodic
/// and final) and forgets its control plane when it ends, so only control planes hosted here
/// appear, one entry each, and only after their first snapshot.
#[derive(Debug, Default)]
pub struct SnapshotTimes(Mutex<BTreeMap<String, (u64, u64)>>);

impl SnapshotTimes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, u64)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a snapshot of `name` at `epoch` taken at `unix_ms`.
    pub fn taken(&self, name: &str, epoch: u64, unix_ms: u64) {
        self.lock().insert(name.to_string(), (epoch, unix_ms));
    }

    /// Forgets `name`, unless an instance of another epoch recorded it since.
    pub fn forget(&self, name: &str, epoch: u64) {
        let mut times = self.lock();
        if times.get(name).is_some_and(|(e, _)| *e == epoch) {
            times.remove(name);
        }
    }

    /// Per control plane, the time since its newest snapshot at `now_unix_ms`, in ms.
    pub fn ages_ms(&self, now_unix_ms: u64) -> Vec<(String, u64)> {
        self.lock()
            .iter()
            .map(|(name, (_, at))| (name.clone(), now_unix_ms.saturating_sub(*at)))
            .collect()
    }
}

impl EtcdRuntime {
    /// `https` when etcd peers speak TLS, `http` otherwise.
    pub(super) fn peer_scheme(&self) -> &'static str {
        if self.peer_tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    pub(super) fn epoch_dir(&self, name: &str, epoch: u64) -> PathBuf {
        self.data_root.join(name).join(format!("epoch-{epoch}"))
    }
}

/// A free TCP port on loopback (the OS picks it; etcd binds it a moment later).
pub(super) fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
}

/// Removes `dir` and all it holds, if it is there.
pub(super) fn remove_dir_if_there(dir: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

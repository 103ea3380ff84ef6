//! Replaying delta snapshots onto a restored data directory, as etcd-backup-restore does.
//!
//! [`replay_deltas`] starts a temporary etcd on the data directory a full snapshot was just
//! restored into (loopback ports of its own, the restore's member name and peer URL), and
//! applies each delta of the chain in order ([`crate::core::backup_chain`]):
//!
//! 1. download it and check it ([`super::delta::decode`]: sha256, JSON, revisions against its
//!    name);
//! 2. skip events at or below the store's revision (the full snapshot, or an overlapping
//!    delta, holds them already);
//! 3. apply the events of each revision as one transaction: the store must be at exactly the
//!    revision before it, and the transaction must get exactly its revision;
//! 4. after the delta, the store's revision must be the delta's last revision.
//!
//! A delta that is corrupt, truncated, vanished, or does not join up stops the replay **at the
//! last good one**: nothing after it is applied ([`Replayed::stopped`] says where and why), and
//! the restore is still good up to there. A store error (the bucket unreachable) or an etcd
//! that misbehaves fails the whole replay instead (the caller removes the data directory and
//! tries again): silently stopping early would lose data a network blip does not justify.
//!
//! Limits: the temporary etcd must answer within the caller's timeout; at most
//! [`MAX_TXN_OPS`] writes per revision; a delta at most [`super::delta::MAX_DELTA_BYTES`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::delta::{decode, revision_groups};
use super::etcd::{EtcdClient, EtcdClientOptions, EtcdError, MAX_TXN_OPS};
use super::restore_error::{RestoreError, SkippedSnapshot};
use crate::core::backup_name::SnapshotPath;

/// The largest request the temporary etcd accepts, in bytes: one replayed revision (etcd's
/// default is 1.5 MiB; a source etcd may have been run with a higher `--max-request-bytes`).
pub const MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;

/// One delta to replay.
#[derive(Debug, Clone)]
pub struct DeltaObject {
    /// Its key, parsed.
    pub path: SnapshotPath,
    /// Its key in the store.
    pub location: StorePath,
}

/// The temporary etcd to replay with.
#[derive(Debug, Clone)]
pub struct ReplayEtcd {
    /// The `etcd` binary (the version the data directory will be served with).
    pub binary: PathBuf,
    /// The restored data directory.
    pub data_dir: PathBuf,
    /// The member name the restore used.
    pub member_name: String,
    /// The peer URL the restore used.
    pub peer_url: String,
    /// Longest the whole replay may take, etcd's start included, in ms.
    pub timeout_ms: u64,
    /// Run it with `--unsafe-no-fsync` (etcd 3.5+) and sync the data directory once at the
    /// end instead: a transaction per revision need not wait for the disk each time, and a
    /// crash in between loses only a directory the restore would make again anyway.
    pub no_fsync: bool,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The deltas applied, in order (a delta whose events were all there already counts).
    pub applied: Vec<SnapshotPath>,
    /// The store's revision at the end.
    pub revision: u64,
    /// Transactions run.
    pub transactions: u64,
    /// Where the replay stopped early, and why (nothing after it was applied).
    pub stopped: Option<SkippedSnapshot>,
    /// How long the temporary etcd took to answer, in ms.
    pub startup_ms: u64,
}

/// Applies `deltas` (in this order) to the data directory of `etcd`. See the
/// [module docs](self).
pub async fn replay_deltas(
    store: &Arc<dyn ObjectStore>,
    deltas: &[DeltaObject],
    etcd: &ReplayEtcd,
) -> Result<Replayed, RestoreError> {
    let began = Instant::now();
    let deadline = began + Duration::from_millis(etcd.timeout_ms);
    let mut server = TempEtcd::start(etcd, deadline).await?;
    let startup_ms = began.elapsed().as_millis() as u64;
    let result = apply_all(store, deltas, &server.client, &etcd.binary, deadline).await;
    let stopped = server.stop().await;
    let mut replayed = result?;
    stopped?;
    if etcd.no_fsync {
        sync_tree(&etcd.data_dir).map_err(|e| RestoreError::Io {
            what: "sync",
            path: etcd.data_dir.display().to_string(),
            why: e.to_string(),
        })?;
    }
    replayed.startup_ms = startup_ms;
    Ok(replayed)
}

async fn apply_all(
    store: &Arc<dyn ObjectStore>,
    deltas: &[DeltaObject],
    client: &EtcdClient,
    binary: &Path,
    deadline: Instant,
) -> Result<Replayed, RestoreError> {
    let etcd_error = |e: EtcdError| RestoreError::Replay {
        etcd: binary.display().to_string(),
        why: e.to_string(),
    };
    let mut revision = client.revision().await.map_err(etcd_error)?;
    let mut replayed = Replayed {
        applied: Vec::new(),
        revision,
        transactions: 0,
        stopped: None,
        startup_ms: 0,
    };
    for delta in deltas {
        if Instant::now() > deadline {
            return Err(RestoreError::Replay {
                etcd: binary.display().to_string(),
                why: format!("the replay ran out of time before {}", delta.location),
            });
        }
        let name = *delta.path.name();
        let stop = |why: String| SkippedSnapshot {
            name: delta.location.to_string(),
            why,
        };
        let bytes = match store.get(&delta.location).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => {
                replayed.stopped = Some(stop("it vanished after it was listed".into()));
                break;
            }
            Err(source) => {
                return Err(RestoreError::Store {
                    what: "read",
                    location: delta.location.to_string(),
                    source,
                });
            }
        };
        let events = match decode(&name, &bytes) {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(delta = %delta.location, error = %e, "replay stops: the delta snapshot is not usable");
                replayed.stopped = Some(stop(e.to_string()));
                break;
            }
        };
        if name.start_revision() > revision + 1 {
            replayed.stopped = Some(stop(format!(
                "it starts at revision {}, the store is at {revision}: revisions {}..={} are in no snapshot",
                name.start_revision(),
                revision + 1,
                name.start_revision() - 1
            )));
            break;
        }
        let groups = revision_groups(&events, revision);
        if let Some((first, _)) = groups.first()
            && *first != revision + 1
        {
            replayed.stopped = Some(stop(format!(
                "its first new event has revision {first}, the store is at {revision}: revisions {}..={} are in no snapshot",
                revision + 1,
                first - 1
            )));
            break;
        }
        let mut broken = None;
        for (group_revision, ops) in groups {
            if group_revision != revision + 1 {
                broken = Some(format!(
                    "revision {} is missing inside it (next event at {group_revision})",
                    revision + 1
                ));
                break;
            }
            if ops.len() > MAX_TXN_OPS {
                broken = Some(format!(
                    "revision {group_revision} holds {} writes, more than {MAX_TXN_OPS}",
                    ops.len()
                ));
                break;
            }
            let got = client.txn(&ops).await.map_err(etcd_error)?;
            replayed.transactions += 1;
            if got != group_revision {
                return Err(RestoreError::Replay {
                    etcd: binary.display().to_string(),
                    why: format!(
                        "replaying revision {group_revision} of {} gave revision {got}",
                        delta.location
                    ),
                });
            }
            revision = got;
        }
        if let Some(why) = broken {
            // Revisions applied from this delta stay: they are a prefix of the history.
            replayed.revision = revision;
            replayed.stopped = Some(stop(why));
            break;
        }
        let now = client.revision().await.map_err(etcd_error)?;
        if now != name.last_revision().max(revision) {
            return Err(RestoreError::Replay {
                etcd: binary.display().to_string(),
                why: format!(
                    "after {} the store is at revision {now}, expected {}",
                    delta.location,
                    name.last_revision()
                ),
            });
        }
        revision = now;
        replayed.revision = revision;
        replayed.applied.push(delta.path.clone());
    }
    replayed.revision = revision;
    Ok(replayed)
}

/// The temporary etcd: a child process, killed if dropped.
struct TempEtcd {
    child: tokio::process::Child,
    client: EtcdClient,
    binary: String,
}

impl TempEtcd {
    async fn start(spec: &ReplayEtcd, deadline: Instant) -> Result<Self, RestoreError> {
        let binary = spec.binary.display().to_string();
        let failed = |why: String| RestoreError::Replay {
            etcd: binary.clone(),
            why,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| failed(format!("cannot find a free port: {e}")))?;
        let client_url = format!("http://127.0.0.1:{port}");
        let mut child = tokio::process::Command::new(&spec.binary)
            .arg("--name")
            .arg(&spec.member_name)
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&spec.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&spec.peer_url)
            .arg("--initial-cluster")
            .arg(format!("{}={}", spec.member_name, spec.peer_url))
            // One member: elect it at once.
            .args(["--heartbeat-interval=10", "--election-timeout=100"])
            .arg(format!("--max-txn-ops={MAX_TXN_OPS}"))
            .arg(format!("--max-request-bytes={MAX_REQUEST_BYTES}"))
            .args(["--logger", "zap", "--log-level", "error"])
            .args(spec.no_fsync.then_some("--unsafe-no-fsync"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed(format!("cannot start it: {e}")))?;
        let tail = StderrTail::drain(child.stderr.take());
        let options = EtcdClientOptions {
            connect_timeout_ms: 500,
            request_timeout_ms: 10_000,
            ..EtcdClientOptions::default()
        };
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = tail.text().await;
                let text = text.trim();
                let cut = text.floor_char_boundary(text.len().min(2_000));
                return Err(failed(format!(
                    "it exited at start ({status}): {}",
                    &text[..cut]
                )));
            }
            if let Ok(client) = EtcdClient::connect(&client_url, options).await
                && client.status().await.is_ok_and(|s| s.leader != 0)
            {
                return Ok(Self {
                    child,
                    client,
                    binary,
                });
            }
            if Instant::now() > deadline {
                return Err(failed(format!("it did not answer on {client_url} in time")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM and wait (etcd syncs its backend as it stops); SIGKILL after 10 s.
    async fn stop(&mut self) -> Result<(), RestoreError> {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(RestoreError::Replay {
                etcd: self.binary.clone(),
                why: format!("cannot wait for it to stop: {e}"),
            }),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(RestoreError::Replay {
                    etcd: self.binary.clone(),
                    why: "it did not stop within 10 s of SIGTERM (killed)".into(),
                })
            }
        }
    }
}

/// The newest bytes a child wrote to stderr, read continuously so that it never blocks on a
/// full pipe.
struct StderrTail(Arc<tokio::sync::Mutex<Vec<u8>>>);

impl StderrTail {
    /// Bytes kept.
    const KEEP: usize = 4_096;

    fn drain(stderr: Option<tokio::process::ChildStderr>) -> Self {
        let kept = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        if let Some(mut stderr) = stderr {
            let into = kept.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut kept = into.lock().await;
                    kept.extend_from_slice(&buf[..n]);
                    let excess = kept.len().saturating_sub(Self::KEEP);
                    kept.drain(..excess);
                }
            });
        }
        Self(kept)
    }

    async fn text(&self) -> String {
        // The child exited: give the reader a moment to take the last bytes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        String::from_utf8_lossy(&self.0.lock().await).into_owned()
    }
}

/// fsyncs every file and directory below `dir`, and `dir` itself.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

//! The etcd driver's replicas: this member's etcd member of a zone-tolerant control plane.
//!
//! A replica runs for as long as the lease covers it ([`RenewReply::replicas`]), whoever
//! hosts the control plane: etcd keeps its members consistent by itself, and nothing a client
//! reaches runs here (the host's gate does, see [`super::etcd`]). Like every workload it runs
//! under `ring-guard`, so a member cut off from the ring stops it at its lease deadline, and
//! starts it again on the same data once a grant covers it again.
//!
//! - data: `<data_root>/<control plane>/member-<joined>/etcd`, kept across restarts; named
//!   after the cluster generation the member joined at, so a member removed from the cluster
//!   and added again starts from nothing, never from data the cluster forgot;
//! - peers: `--listen-peer-urls` on the member's etcd peer address (resolved to an IP),
//!   advertised as given; `https` with this member's own certificate, key and the ring's CA
//!   when the ring speaks TLS (`--peer-client-cert-auth`: only members of the ring's PKI are
//!   etcd peers), `http` otherwise;
//! - clients: a loopback port of its own; the host's gate relays to it.
//!
//! When etcd exits while granted it is started again (200 ms doubling to 5 s).
//!
//! [`RenewReply::replicas`]: crate::raft::types::RenewReply::replicas

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::etcd_runtime::{EtcdRuntime, free_port, remove_dir_if_there};
use super::lease::lease_runs_out;
use super::workload::{Guard, GuardLimits, ReplicaTarget};
use crate::backup::etcd::{EtcdClient, EtcdClientOptions};
use crate::backup::location::BackupLocation;
use crate::backup::restore::{RestoreOptions, RestoreTool, restore_newest};
use crate::core::etcd_cluster::ReplicaKey;
use crate::time::{monotonic_ms, unix_ms};

/// First wait before etcd is started again after it exited, in ms.
const FIRST_RESTART_BACKOFF_MS: u64 = 200;
/// Longest wait before etcd is started again, in ms.
const MAX_RESTART_BACKOFF_MS: u64 = 5_000;

/// What the host's front end reads of the replica it relays to.
#[derive(Debug, Clone)]
pub struct ReplicaHandle {
    /// `http://127.0.0.1:<port>` while etcd runs and answers (a status, not necessarily a
    /// quorum); `None` otherwise.
    pub client_url: watch::Receiver<Option<String>>,
}

/// One etcd member of a zone-tolerant control plane, run by this member.
pub struct EtcdReplica {
    target: ReplicaTarget,
    deadline: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    client_url: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl EtcdReplica {
    /// Starts running `target` until `deadline_ms` (monotonic) unless extended.
    pub fn start(runtime: Arc<EtcdRuntime>, target: ReplicaTarget, deadline_ms: u64) -> Self {
        let (deadline, deadline_rx) = watch::channel(deadline_ms);
        let (stop, stop_rx) = watch::channel(false);
        let (client_tx, client_url) = watch::channel(None);
        let span = tracing::info_span!(
            "replica",
            control_plane = %target.name,
            joined = target.key.joined
        );
        let task = tokio::spawn(
            run(runtime, target.clone(), deadline_rx, stop_rx, client_tx).instrument(span),
        );
        Self {
            target,
            deadline,
            stop,
            client_url,
            task,
        }
    }

    /// Which run it is.
    pub fn key(&self) -> ReplicaKey {
        self.target.key
    }

    /// What the host's front end needs.
    pub fn handle(&self) -> ReplicaHandle {
        ReplicaHandle {
            client_url: self.client_url.clone(),
        }
    }

    /// Moves the lease deadline later.
    pub fn extend(&self, deadline_ms: u64) {
        self.deadline.send_if_modified(|d| {
            let later = deadline_ms > *d;
            if later {
                *d = deadline_ms;
            }
            later
        });
    }

    /// Stops it (etcd's stop follows in its task).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Whether its task ended (stopped, or the lease ran out).
    pub fn ended(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for EtcdReplica {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Why one run of etcd ended.
enum Ended {
    /// Told to stop, or the lease ran out: the replica ends.
    ForGood,
    /// etcd exited (or could not start): started again after a backoff.
    Exited(String),
}

async fn run(
    runtime: Arc<EtcdRuntime>,
    target: ReplicaTarget,
    mut deadline: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
    client_url: watch::Sender<Option<String>>,
) {
    let mut backoff_ms = FIRST_RESTART_BACKOFF_MS;
    loop {
        let started = monotonic_ms();
        let ended = run_once(&runtime, &target, &mut deadline, &mut stop, &client_url).await;
        client_url.send_replace(None);
        match ended {
            Ended::ForGood => {
                tracing::info!("etcd member stopped");
                return;
            }
            Ended::Exited(why) => {
                if monotonic_ms().saturating_sub(started) > MAX_RESTART_BACKOFF_MS {
                    backoff_ms = FIRST_RESTART_BACKOFF_MS;
                }
                tracing::warn!("etcd member ended ({why}); starting it again in {backoff_ms} ms");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                    _ = stopped(&mut stop) => return,
                    _ = lease_runs_out(&mut deadline, 0) => return,
                }
                backoff_ms = (backoff_ms * 2).min(MAX_RESTART_BACKOFF_MS);
            }
        }
    }
}

/// Starts etcd once and runs it until it exits, the lease runs out or the replica is stopped.
async fn run_once(
    runtime: &EtcdRuntime,
    target: &ReplicaTarget,
    deadline: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
    client_url: &watch::Sender<Option<String>>,
) -> Ended {
    let argv = match etcd_argv(runtime, target).await {
        Ok(argv) => argv,
        Err(why) => return Ended::Exited(why),
    };
    let (argv, client) = argv;
    let env = [
        ("GARDEN_RING_CONTROL_PLANE", target.name.clone()),
        ("GARDEN_RING_MEMBER", runtime.member.clone()),
    ];
    let deadline_ms = *deadline.borrow();
    let mut guard = match Guard::spawn(
        &runtime.guard_binary,
        GuardLimits::fence(runtime.timing.fence_ms),
        &argv,
        &env,
        deadline_ms,
        &target.name,
        target.key.joined,
    )
    .await
    {
        Ok(guard) => guard,
        Err(e) => return Ended::Exited(e.to_string()),
    };
    tracing::info!(
        "etcd member {} started (peers {}, clients {client})",
        target.member,
        target.cluster.initial_cluster(runtime.peer_scheme())
    );
    let options = EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: runtime.timing.workload_request_timeout_ms(),
        ..EtcdClientOptions::default()
    };
    let mut deadline_for_guard = deadline.clone();
    // Until etcd answers once: then the front end may connect. A future of its own, so that
    // a slow answer never holds up the guard's deadline (the loop below forwards it).
    let probe = async {
        loop {
            if let Ok(c) = EtcdClient::connect(&client, options).await
                && c.status().await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::pin!(probe);
    let mut answered = false;
    let ended = loop {
        tokio::select! {
            _ = stopped(stop) => break Ended::ForGood,
            _ = lease_runs_out(deadline, 0) => break Ended::ForGood,
            status = guard.wait() => {
                client_url.send_replace(None);
                return Ended::Exited(status);
            }
            changed = deadline_for_guard.changed() => {
                if changed.is_ok() {
                    let d = *deadline_for_guard.borrow_and_update();
                    guard.set_deadline(d).await;
                }
            }
            () = &mut probe, if !answered => {
                answered = true;
                client_url.send_replace(Some(client.clone()));
            }
        }
    };
    client_url.send_replace(None);
    guard.stop(runtime.timing.fence_ms).await;
    ended
}

/// etcd's command line for `target`, and its client URL.
async fn etcd_argv(
    runtime: &EtcdRuntime,
    target: &ReplicaTarget,
) -> Result<(Vec<String>, String), String> {
    let dir = replica_dir(runtime, target);
    let data = dir.join("etcd");
    let fresh = !data.is_dir();
    if fresh {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    if fresh && let Some(url) = &target.restore_from {
        restore_from_backup(runtime, target, url, &dir).await?;
    }
    let client_port =
        free_port().map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))?;
    let client = format!("http://127.0.0.1:{client_port}");
    let listen = tokio::net::lookup_host(&target.peer)
        .await
        .map_err(|e| format!("cannot resolve etcd peer address {}: {e}", target.peer))?
        .next()
        .ok_or_else(|| format!("etcd peer address {} resolves to nothing", target.peer))?;
    let scheme = runtime.peer_scheme();
    let mut argv: Vec<String> = vec![
        runtime.bin_dir.join("etcd").display().to_string(),
        "--name".into(),
        target.member.clone(),
        "--data-dir".into(),
        data.display().to_string(),
        "--listen-client-urls".into(),
        client.clone(),
        "--advertise-client-urls".into(),
        client.clone(),
        "--listen-peer-urls".into(),
        format!("{scheme}://{listen}"),
        "--initial-advertise-peer-urls".into(),
        format!("{scheme}://{}", target.peer),
        "--initial-cluster".into(),
        target.cluster.initial_cluster(scheme),
        "--initial-cluster-state".into(),
        // Generation 1 formed the cluster; a member added later joins it (after `MemberAdd`).
        if target.key.joined > 1 {
            "existing"
        } else {
            "new"
        }
        .into(),
        "--initial-cluster-token".into(),
        target.cluster.token.clone(),
        "--logger".into(),
        "zap".into(),
        "--log-level".into(),
        "error".into(),
    ];
    argv.extend(runtime.settings.etcd_health_flags());
    if target.force_new_cluster {
        // An operator's recovery: this member's data, this member alone.
        tracing::warn!(
            "starting with --force-new-cluster: the cluster restarts from this member's data alone"
        );
        argv.push("--force-new-cluster".into());
    }
    if let Some(tls) = &runtime.peer_tls {
        argv.extend([
            "--peer-cert-file".into(),
            tls.cert_file.display().to_string(),
            "--peer-key-file".into(),
            tls.key_file.display().to_string(),
            "--peer-trusted-ca-file".into(),
            tls.ca_file.display().to_string(),
            "--peer-client-cert-auth".into(),
        ]);
    }
    if fresh {
        tracing::info!(dir = %data.display(), "a new etcd member: joins its cluster empty");
    }
    Ok((argv, client))
}

/// An operator's recovery from backup: `dir/etcd`, new, is restored from the newest full
/// snapshot at `url` and the deltas after it, as a cluster of this member alone. Restored
/// into `dir/restoring` and renamed into place, so a failed restore leaves nothing etcd would
/// start on (the next attempt begins again). The member is restored with a loopback peer URL
/// (the replay of the deltas runs it alone on loopback, without peer TLS); the host sets its
/// real one with `MemberUpdate` before the recovery is done (`etcd_membership`).
async fn restore_from_backup(
    runtime: &EtcdRuntime,
    target: &ReplicaTarget,
    url: &str,
    dir: &std::path::Path,
) -> Result<(), String> {
    let location = BackupLocation::parse(url, &runtime.backup)
        .map_err(|e| format!("backup location {url}: {e}"))?;
    let restoring = dir.join("restoring");
    remove_dir_if_there(&restoring)
        .map_err(|e| format!("cannot remove {}: {e}", restoring.display()))?;
    std::fs::create_dir_all(&restoring)
        .map_err(|e| format!("cannot create {}: {e}", restoring.display()))?;
    let tool = RestoreTool::detect(&runtime.bin_dir).map_err(|e| e.to_string())?;
    let peer_port =
        free_port().map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))?;
    let options = RestoreOptions {
        data_dir: restoring.join("etcd"),
        member_name: target.member.clone(),
        peer_url: format!("http://127.0.0.1:{peer_port}"),
        tool,
        now_unix_s: unix_ms() / 1000,
        tool_timeout_ms: runtime.settings.restore_timeout_ms,
        only: None,
        replay_with: Some(runtime.bin_dir.join("etcd")),
    };
    tracing::warn!("restoring this etcd member's data from the newest backups in {url}");
    let restored = restore_newest(&location.store(), location.prefix(), &options)
        .await
        .map_err(|e| format!("restore from {url}: {e}"))?;
    tracing::warn!(
        "restored {} and {} delta(s) to revision {} from {url} (newest {}, created at {} s): \
         writes after it are lost",
        restored.snapshot,
        restored.deltas.len(),
        restored.revision,
        restored.newest_applied(),
        restored.created_unix_s
    );
    std::fs::rename(restoring.join("etcd"), dir.join("etcd"))
        .map_err(|e| format!("cannot move the restored data into {}: {e}", dir.display()))?;
    let _ = std::fs::remove_dir(&restoring);
    Ok(())
}

/// `<data_root>/<control plane>/member-<joined>`.
fn replica_dir(runtime: &EtcdRuntime, target: &ReplicaTarget) -> PathBuf {
    runtime
        .data_root
        .join(&target.name)
        .join(format!("member-{}", target.key.joined))
}

/// Resolves once `stop` is set.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

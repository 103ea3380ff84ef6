//! An own etcd under a `ring-guard` this member talks to over a Unix socket (`--control`),
//! with the control plane's public endpoint kept by the guard too (`--gate`): both outlive
//! `ringd`, and the next `ringd` of the member **adopts** them ([`Guarded::adopt`]), so a
//! daemon restart (an upgrade) costs the workload no restart, no restore and no move while the
//! lease holds. The guard still ends it at the lease's deadline whatever `ringd` does
//! (DESIGN.md rule 1).
//!
//! The socket is `guard.sock` in the control plane's private epoch directory (mode 0700: only
//! this member's user reaches it). The guard is started in that directory and binds the
//! relative name; `ringd` connects through `/proc/self/fd/<dir>/guard.sock`, so the path's
//! length never meets the 108-byte limit of a socket address.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, watch};
use tracing::Instrument as _;

use super::workload::{DriverError, GuardLimits};

/// The socket's name in the epoch directory.
pub const SOCKET: &str = "guard.sock";

/// How long a new guard may take to listen on its socket, ms.
const LISTEN_WITHIN_MS: u64 = 5_000;

/// How long an answer from a guard may take (its `status`, `gate open`, `gate closed`), ms.
const ANSWER_WITHIN_MS: u64 = 2_000;

/// The public endpoint as the guard last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateState {
    /// Not open (not yet, or closed by this member).
    Closed,
    /// Open: clients reach etcd.
    Open,
    /// Closed by the guard itself at the lease's deadline.
    RanOut,
    /// Could not open.
    Error(String),
}

/// What a guard says of itself (`status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardStatus {
    /// The guard's own process id.
    pub guard_pid: i32,
    /// Its workload's process id (the group's leader).
    pub pid: i32,
    /// The deadline it holds (monotonic ms).
    pub deadline_ms: u64,
    /// Whether it holds the workload frozen (its lease lapsed).
    pub frozen: bool,
    /// Whether its gate is open.
    pub gate_open: bool,
    /// Where the gate relays to: the workload's own address.
    pub target: Option<SocketAddr>,
}

impl GuardStatus {
    /// Parses a `status ...` line.
    fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("status ")?;
        let mut status = GuardStatus {
            guard_pid: 0,
            pid: 0,
            deadline_ms: 0,
            frozen: false,
            gate_open: false,
            target: None,
        };
        for field in rest.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "guard" => status.guard_pid = value.parse().ok()?,
                "pid" => status.pid = value.parse().ok()?,
                "deadline" => status.deadline_ms = value.parse().ok()?,
                "frozen" => status.frozen = value == "1",
                "gate" => status.gate_open = value == "open",
                "target" => status.target = value.parse().ok(),
                _ => {}
            }
        }
        (status.pid > 0).then_some(status)
    }
}

#[derive(Debug, Clone)]
struct Reports {
    gate: GateState,
    /// How many reports about the gate came: an answer to a request is one that came after it.
    gate_reports: u64,
    status: Option<GuardStatus>,
    /// How the guard ended (its last report, or that its connection closed).
    ended: Option<String>,
}

/// A guard this member controls over its socket.
pub(crate) struct Guarded {
    writer: Arc<Mutex<OwnedWriteHalf>>,
    reports: watch::Receiver<Reports>,
    /// The guard process, when this run started it.
    child: Option<Child>,
    /// The guard's process id, to kill it if it does not stop in time.
    guard_pid: Option<i32>,
}

/// Connects to the guard socket in `dir`.
async fn connect(dir: &Path) -> std::io::Result<UnixStream> {
    use std::os::fd::AsRawFd;
    let handle = std::fs::File::open(dir)?;
    let path = PathBuf::from(format!("/proc/self/fd/{}/{SOCKET}", handle.as_raw_fd()));
    let stream = UnixStream::connect(&path).await;
    drop(handle);
    stream
}

impl Guarded {
    /// Starts `argv` under a guard in `dir` (the epoch directory), keeping the public endpoint
    /// `gate` (listen, etcd's own address), to be stopped at `deadline_ms` (monotonic).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn spawn(
        guard_binary: &Path,
        limits: GuardLimits,
        dir: &Path,
        gate: (SocketAddr, SocketAddr),
        argv: &[String],
        env: &[(&str, String)],
        deadline_ms: u64,
        name: &str,
        epoch: u64,
    ) -> Result<Self, DriverError> {
        let spawn_error = |why: String| DriverError::Spawn {
            command: guard_binary.display().to_string(),
            why,
        };
        let mut cmd = Command::new(guard_binary);
        cmd.arg("--fence-ms").arg(limits.fence_ms.to_string());
        if limits.hold_ms > 0 {
            cmd.arg("--hold-ms").arg(limits.hold_ms.to_string());
        }
        cmd.arg("--control")
            .arg(SOCKET)
            .arg("--gate")
            .arg(format!("{}={}", gate.0, gate.1))
            .arg("--")
            .args(argv)
            .current_dir(dir)
            // Its own process group: a signal to ringd's group (a terminal's Ctrl-C) is not
            // one to the workloads it leaves behind on purpose.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().map_err(|e| spawn_error(e.to_string()))?;
        let guard_pid = child.id().and_then(|p| i32::try_from(p).ok());
        let started = crate::time::monotonic_ms();
        let stream = loop {
            match connect(dir).await {
                Ok(stream) => break stream,
                Err(e) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(spawn_error(format!("the guard exited at once: {status}")));
                    }
                    if crate::time::monotonic_ms() - started > LISTEN_WITHIN_MS {
                        let _ = child.kill().await;
                        return Err(spawn_error(format!(
                            "the guard does not listen on {}/{SOCKET}: {e}",
                            dir.display()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        let mut guarded = Self::over(stream, name, epoch);
        guarded.child = Some(child);
        guarded.guard_pid = guard_pid;
        guarded.set_deadline(deadline_ms).await;
        Ok(guarded)
    }

    /// Adopts the guard a previous run of this member left in `dir`, if one answers there:
    /// itself and what it says of itself.
    pub(crate) async fn adopt(dir: &Path, name: &str, epoch: u64) -> Option<(Self, GuardStatus)> {
        let stream = connect(dir).await.ok()?;
        let mut guarded = Self::over(stream, name, epoch);
        guarded.send("status").await;
        let mut reports = guarded.reports.clone();
        let answered = tokio::time::timeout(
            Duration::from_millis(ANSWER_WITHIN_MS),
            reports.wait_for(|r| r.status.is_some() || r.ended.is_some()),
        )
        .await;
        let status = match answered {
            Ok(Ok(r)) => r.status.clone()?,
            _ => return None,
        };
        guarded.guard_pid = Some(status.guard_pid).filter(|p| *p > 0);
        Some((guarded, status))
    }

    fn over(stream: UnixStream, name: &str, epoch: u64) -> Self {
        let (read, write) = stream.into_split();
        let (tx, reports) = watch::channel(Reports {
            gate: GateState::Closed,
            gate_reports: 0,
            status: None,
            ended: None,
        });
        tokio::spawn(
            async move {
                let mut lines = BufReader::new(read).lines();
                let mut last = None;
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(status) = GuardStatus::parse(&line) {
                        tx.send_modify(|r| {
                            if status.gate_open {
                                r.gate = GateState::Open;
                            }
                            r.status = Some(status);
                        });
                        continue;
                    }
                    tracing::info!("guard: {line}");
                    let gate = match line.as_str() {
                        "gate open" => Some(GateState::Open),
                        "gate closed" => Some(GateState::Closed),
                        "gate ran-out" => Some(GateState::RanOut),
                        _ => line
                            .strip_prefix("gate error ")
                            .map(|e| GateState::Error(e.to_string())),
                    };
                    if let Some(gate) = gate {
                        tx.send_modify(|r| {
                            r.gate = gate;
                            r.gate_reports += 1;
                        });
                    } else if ["fenced ", "stopped ", "exited "]
                        .iter()
                        .any(|p| line.starts_with(p))
                    {
                        last = Some(line);
                    }
                }
                let ended = last.unwrap_or_else(|| "the guard's connection closed".to_string());
                tx.send_modify(|r| r.ended = Some(ended));
            }
            .instrument(crate::logging::control_plane_span(name, epoch)),
        );
        Self {
            writer: Arc::new(Mutex::new(write)),
            reports,
            child: None,
            guard_pid: None,
        }
    }

    async fn send(&self, line: &str) {
        let mut writer = self.writer.lock().await;
        let _ = writer.write_all(format!("{line}\n").as_bytes()).await;
    }

    /// Moves the deadline.
    pub(crate) async fn set_deadline(&self, deadline_ms: u64) {
        self.send(&format!("deadline {deadline_ms}")).await;
    }

    /// A handle that moves the deadline from elsewhere (the instance's owner, while the
    /// instance's own task may be busy).
    pub(crate) fn link(&self) -> GuardLink {
        GuardLink(self.writer.clone())
    }

    /// Opens the public endpoint; an error says why it could not. The gate may close itself
    /// at once (the lease's deadline passed): then the returned gate's [`GuardGate::ran_out`]
    /// says so.
    pub(crate) async fn open_gate(&self) -> Result<GuardGate, String> {
        let mut reports = self.reports.clone();
        let since = reports.borrow_and_update().gate_reports;
        self.send("open").await;
        let answered = tokio::time::timeout(
            Duration::from_millis(ANSWER_WITHIN_MS),
            reports.wait_for(|r| r.gate_reports > since || r.ended.is_some()),
        )
        .await;
        let state = match answered {
            Ok(Ok(r)) => (r.gate.clone(), r.ended.clone()),
            _ => return Err("the guard did not answer".into()),
        };
        match state {
            (GateState::Open | GateState::RanOut, None) => Ok(GuardGate {
                writer: self.writer.clone(),
                reports: self.reports.clone(),
                since,
            }),
            (GateState::Error(e), _) => Err(e),
            (_, Some(ended)) => Err(format!("the guard ended: {ended}")),
            (GateState::Closed, None) => Err("the gate closed at once".into()),
        }
    }

    /// Stops the workload now and waits (at most `fence_ms` + 500 ms) for the guard, then
    /// kills it.
    pub(crate) async fn stop(&mut self, fence_ms: u64) -> bool {
        self.send("stop").await;
        let wait = Duration::from_millis(fence_ms + 500);
        let mut reports = self.reports.clone();
        let ended = tokio::time::timeout(wait, reports.wait_for(|r| r.ended.is_some()))
            .await
            .is_ok();
        if !ended {
            if let Some(pid) = self.guard_pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return false;
        }
        if let Some(child) = self.child.as_mut() {
            let _ = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
        }
        true
    }

    /// Waits until the guard ends (the workload ended or was fenced): how.
    pub(crate) async fn wait(&mut self) -> String {
        let mut reports = self.reports.clone();
        let ended = match reports.wait_for(|r| r.ended.is_some()).await {
            Ok(r) => r.ended.clone().unwrap_or_default(),
            Err(_) => "the guard's connection closed".to_string(),
        };
        if let Some(child) = self.child.as_mut() {
            let _ = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
        }
        ended
    }

    /// How the guard ended, if it did.
    pub(crate) fn exited(&self) -> Option<String> {
        self.reports.borrow().ended.clone()
    }
}

/// Moves a guard's deadline (see [`Guarded::link`]).
#[derive(Clone)]
pub(crate) struct GuardLink(Arc<Mutex<OwnedWriteHalf>>);

impl GuardLink {
    /// Moves the deadline (the guard keeps the latest of those it was given).
    pub(crate) async fn set_deadline(&self, deadline_ms: u64) {
        let mut writer = self.0.lock().await;
        let _ = writer
            .write_all(format!("deadline {deadline_ms}\n").as_bytes())
            .await;
    }
}

/// The public endpoint a guard keeps open.
pub struct GuardGate {
    writer: Arc<Mutex<OwnedWriteHalf>>,
    reports: watch::Receiver<Reports>,
    /// The gate reports before it was opened (only later ones are about it).
    since: u64,
}

impl GuardGate {
    /// Turns true when the guard closed the gate itself at the lease's deadline.
    pub fn ran_out(&self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        let mut reports = self.reports.clone();
        let since = self.since;
        tokio::spawn(async move {
            let ran_out = reports
                .wait_for(|r| r.gate_reports > since && matches!(r.gate, GateState::RanOut))
                .await
                .is_ok();
            if ran_out {
                let _ = tx.send(true);
            } else {
                // The guard is gone: as for a gate the driver closed, nothing to report.
                drop(tx);
            }
        });
        rx
    }

    /// Closes the gate: returns once the guard says it is closed (no client reaches etcd any
    /// more), or the guard is gone.
    pub async fn close(self) {
        let mut reports = self.reports.clone();
        let since = reports.borrow_and_update().gate_reports;
        {
            let mut writer = self.writer.lock().await;
            let _ = writer.write_all(b"close\n").await;
        }
        // The guard answers every `close` with `gate closed`, open or not.
        let _ = tokio::time::timeout(
            Duration::from_millis(ANSWER_WITHIN_MS),
            reports.wait_for(|r| {
                (r.gate_reports > since && matches!(r.gate, GateState::Closed)) || r.ended.is_some()
            }),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_line_is_read_whole_or_not_at_all() {
        let s = GuardStatus::parse(
            "status guard=10 pid=11 deadline=5000 frozen=1 gate=open target=127.0.0.1:2379",
        )
        .expect("a status");
        assert_eq!(s.guard_pid, 10);
        assert_eq!(s.pid, 11);
        assert_eq!(s.deadline_ms, 5000);
        assert!(s.frozen && s.gate_open);
        assert_eq!(s.target, Some("127.0.0.1:2379".parse().unwrap()));
        assert_eq!(GuardStatus::parse("started 11"), None);
        assert_eq!(GuardStatus::parse("status pid=x"), None);
        assert_eq!(GuardStatus::parse("status deadline=4"), None, "no pid");
    }
}

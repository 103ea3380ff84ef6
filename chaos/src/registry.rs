//! Admin API clients whose history is checked for linearizability (issue 23, point 5).
//!
//! A few clients, each talking to one member, label control planes (`ControlPlaneLabel`, a
//! write through Raft: the leader, or forwarded to it) and read them back
//! (`ControlPlaneGet`, linearizable by default on any member), recording each operation's
//! invocation and completion on the run's clock. Each control plane's `lin` label is one
//! register; [`crate::linearizability`] checks every register's history. Writes the client
//! cannot know the outcome of (a timeout, a broken connection) are checked as "took effect at
//! some time after their invocation, or never"; writes certainly not applied (refused as
//! retry-safe, or never sent) and reads the member answered stale (it says so) are counted,
//! not checked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use garden_ring::admin::{AdminClient, ClientError, REFUSAL_HEADER, RETRY_SAFE_HEADER};
use garden_ring::pb;
use tokio::sync::watch;

use crate::linearizability::{self, Kind, Op, Outcome};
use crate::model::RegistryCheck;

/// The label whose value is the register.
const LABEL: &str = "lin";
/// Clients, each on its own member (round robin).
pub const CLIENTS: usize = 4;
/// Pause between a client's operations, ms (plus up to as much again, at random).
const PAUSE_MS: u64 = 20;
/// Least time between two writes of one client, ms: every write is a history event, and the
/// ring keeps the newest 1,000, which hold the run's own events (detection, moves) that the
/// harness reads back. Four clients write at most 8 times a second.
const WRITE_INTERVAL_MS: u64 = 500;

/// One client's record.
#[derive(Default)]
struct Record {
    ops: Vec<(String, Op)>,
    not_applied: u64,
    stale_reads: u64,
    failed_reads: u64,
}

/// The running clients.
pub struct RegistryClients {
    tasks: Vec<tokio::task::JoinHandle<Record>>,
}

impl RegistryClients {
    /// Starts [`CLIENTS`] clients over `members` (one Admin client per member) on the
    /// `control_planes`, until `stop` turns true; times from `start`.
    pub fn start(
        members: &[Arc<AdminClient>],
        control_planes: &[String],
        start: Instant,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let tasks = (0..CLIENTS)
            .map(|i| {
                let client = members[i % members.len()].clone();
                let cps = control_planes.to_vec();
                let stop = stop.clone();
                tokio::spawn(run(i, client, cps, start, stop))
            })
            .collect();
        Self { tasks }
    }

    /// Waits for the clients to stop and checks their history.
    pub async fn check(self) -> (RegistryCheck, Vec<String>) {
        let mut histories: BTreeMap<String, Vec<Op>> = BTreeMap::new();
        let mut summary = RegistryCheck::default();
        for task in self.tasks {
            let Ok(record) = task.await else { continue };
            summary.not_applied += record.not_applied;
            summary.stale_reads += record.stale_reads;
            summary.failed_reads += record.failed_reads;
            for (register, op) in record.ops {
                match op.kind {
                    Kind::Write(_) if op.complete_ms.is_none() => summary.unknown_writes += 1,
                    _ => {}
                }
                match op.kind {
                    Kind::Write(_) => summary.writes += 1,
                    Kind::Read(_) => summary.reads += 1,
                }
                histories.entry(register).or_default().push(op);
            }
        }
        summary.ops_checked = summary.writes + summary.reads;
        summary.registers = histories.len() as u64;
        let mut failures = Vec::new();
        let checked = tokio::task::spawn_blocking(move || linearizability::check(&histories))
            .await
            .unwrap_or_default();
        for (register, outcome) in checked {
            match outcome {
                Outcome::Linearizable { states } => summary.states += states as u64,
                Outcome::Not(why) => failures.push(why.to_string()),
                Outcome::TooLarge => failures.push(format!(
                    "the history of {register} is too large to check ({} states)",
                    linearizability::MAX_STATES
                )),
            }
        }
        (summary, failures)
    }
}

async fn run(
    me: usize,
    client: Arc<AdminClient>,
    control_planes: Vec<String>,
    start: Instant,
    stop: watch::Receiver<bool>,
) -> Record {
    let mut record = Record::default();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (me as u64 + 1);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let now_ms = || start.elapsed().as_millis() as u64;
    let mut written = 0u64;
    let mut last_write_ms: Option<u64> = None;
    while !*stop.borrow() && !control_planes.is_empty() {
        let cp = control_planes[(next() % control_planes.len() as u64) as usize].clone();
        let invoke_ms = now_ms();
        let may_write = last_write_ms.is_none_or(|at| invoke_ms >= at + WRITE_INTERVAL_MS);
        if may_write && next() % 2 == 0 {
            last_write_ms = Some(invoke_ms);
            written += 1;
            let value = format!("c{me}-{written}");
            let request = pb::ControlPlaneLabelRequest {
                name: cp.clone(),
                labels: [(LABEL.to_string(), value.clone())].into(),
                reason: "ring-chaos: linearizability check".into(),
            };
            let result = client
                .call_once(request, &mut |mut c, r| async move {
                    c.control_plane_label(r).await
                })
                .await;
            let complete_ms = match result {
                Ok(_) => Some(now_ms()),
                Err(e) if not_applied(&e) => {
                    record.not_applied += 1;
                    continue;
                }
                Err(_) => None,
            };
            record.ops.push((
                cp,
                Op {
                    client: me,
                    invoke_ms,
                    complete_ms,
                    kind: Kind::Write(value),
                },
            ));
        } else {
            let request = pb::ControlPlaneGetRequest {
                name: cp.clone(),
                stale: false,
            };
            let result = client
                .call_once(request, &mut |mut c, r| async move {
                    c.control_plane_get(r).await
                })
                .await;
            let complete_ms = now_ms();
            match result {
                Ok(got) if got.freshness.as_ref().is_some_and(|f| f.linearizable) => {
                    let value = got.labels.get(LABEL).cloned().unwrap_or_default();
                    record.ops.push((
                        cp,
                        Op {
                            client: me,
                            invoke_ms,
                            complete_ms: Some(complete_ms),
                            kind: Kind::Read(value),
                        },
                    ));
                }
                Ok(_) => record.stale_reads += 1,
                Err(_) => record.failed_reads += 1,
            }
        }
        let pause = PAUSE_MS + next() % (PAUSE_MS + 1);
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
    record
}

/// Whether a failed write certainly did not apply: never sent (no member reached), or refused
/// with the ring's word that it was not applied (retry-safe) or refused outright.
fn not_applied(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => {
            s.metadata().contains_key(RETRY_SAFE_HEADER)
                || s.metadata().contains_key(REFUSAL_HEADER)
                || matches!(
                    s.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::NotFound
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unauthenticated
                )
        }
        ClientError::NoEndpoints
        | ClientError::BadEndpoint { .. }
        | ClientError::Unreachable { .. } => true,
    }
}

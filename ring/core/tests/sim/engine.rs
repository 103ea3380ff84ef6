//! A deterministic simulation of a ring: the real core (the replicated state, the leader's
//! controller, health judgement, the agents' reconcile) under a simulated clock and network,
//! with seeded faults. It checks the safety rules at every step.
//!
//! What is modelled, and how:
//! - **Raft** as a single committed [`RingState`]: the current leader applies its proposals at
//!   once while it reaches a majority; a member becomes leader after an election timeout once
//!   the old one is down, frozen or cut off from a majority, and counts member silence from its
//!   own election (DESIGN.md rule 2). A leader confirms its leadership (ReadIndex) by reaching
//!   a majority when it answers a renewal.
//! - **Members**: a `ringd` (agent and, on the leader, duties) that can crash (restart later,
//!   with a fresh agent), freeze (SIGSTOP: it does nothing, messages wait) or be partitioned
//!   (fully or one way); each has its own monotonic clock, running up to
//!   [`SimConfig::drift`] fast or slow.
//! - **Workloads** and their **guards**: a workload serves until stopped by its agent, or until
//!   its guard reaches the lease deadline (+ `fence_ms`/2 for SIGKILL), independently of
//!   `ringd` (crashed or frozen: the guard goes on). [`SimConfig::break_fencing`] switches the
//!   guard off, for the test that proves the checker can fail.
//! - **Network**: renewals and their answers, with seeded delay; faults add loss (10-50%),
//!   duplication (a second copy, up to 3 s later) and reordering (delays up to 400 ms).
//! - **Disks**: a member's Raft disk can stall: it then persists nothing, so it neither
//!   counts toward a commit nor votes; a leader whose disk stalls commits nothing, but still
//!   heartbeats (no election) and answers renewals (a ReadIndex needs no disk), as openraft
//!   does.
//! - **Backups**: each renewal reports the backups of what the member runs (a new full
//!   snapshot every minute, deltas in between), and the leader commits the reports worth it
//!   (`ReportBackup`), racing the moves like a real host's reports do.
//!
//! Invariants checked at every step: at most one member serves a control plane; a committed
//! (control plane, epoch) keeps its host for good and epochs never go back. At the end, after
//! every fault healed, every control plane must be running within a bound.
//! A run is a pure function of its seed, so a failing seed replays exactly.

use std::collections::{BTreeMap, BTreeSet};

use garden_ring_core::Timing;
use garden_ring_core::agent::{Action, Grant, Memory, reconcile};
use garden_ring_core::backup_report::BackupReport;
use garden_ring_core::command::{ControlPlaneSpec, MemberSpec, Proposal};
use garden_ring_core::controller::{Observations, Policy, decide};
use garden_ring_core::{Command, Health, Phase, RingState};

/// Parameters of a run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed.
    pub seed: u64,
    /// Members (3 or 5).
    pub members: usize,
    /// Control planes.
    pub control_planes: usize,
    /// Simulated time with faults, ms.
    pub fault_ms: u64,
    /// Time after the last fault healed in which every control plane must run again, ms.
    pub settle_ms: u64,
    /// Step, ms.
    pub step_ms: u64,
    /// Largest clock-rate error of a member (0.005 = 0.5 %).
    pub drift: f64,
    /// Percent of messages a lossy link drops.
    pub loss_percent: u64,
    /// Test-only: guards never stop workloads at the lease deadline.
    pub break_fencing: bool,
    /// Test-only: an agent takes any renewal answer as the answer to its request in flight
    /// (a duplicated or overtaken answer to an earlier request included).
    pub break_reply_matching: bool,
}

impl SimConfig {
    /// The standard run for `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            // Every fourth seed runs five members.
            members: if seed.is_multiple_of(4) { 5 } else { 3 },
            control_planes: 4,
            fault_ms: 20_000,
            settle_ms: 15_000,
            step_ms: 5,
            // Every third seed lets clocks run as far apart as the margin allows: two members'
            // rates differ by up to clock_margin_ms over member_lost_ms (10% at loopback).
            drift: if seed.is_multiple_of(3) {
                let t = Timing::loopback();
                t.clock_margin_ms as f64 / t.member_lost_ms as f64 / 2.0
            } else {
                0.005
            },
            loss_percent: 10 + seed % 5 * 10,
            break_fencing: false,
            break_reply_matching: false,
        }
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// Simulated time, ms.
    pub at_ms: u64,
    /// What broke.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} at {} ms: {} (replay: GARDEN_RING_SIM_SEED={} cargo nextest run -p garden-ring-core --test sim)",
            self.seed, self.at_ms, self.what, self.seed
        )
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Faults injected.
    pub faults: usize,
    /// Control plane moves committed.
    pub moves: usize,
    /// Fences released (a former host stopped, or its lease ran out).
    pub releases: usize,
    /// Backup reports committed (hosts report a new full snapshot every minute and deltas in
    /// between with every renewal; the leader commits the ones worth it).
    pub backups: usize,
    /// Steps checked.
    pub steps: u64,
    /// Messages dropped, duplicated, and delayed past 40 ms (reordered).
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Steps in which a member's disk stalled.
    pub stalled_steps: u64,
}

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Crash,
    Freeze,
    Isolate,
    CutOutgoing,
    CutIncoming,
    Lossy,
    /// The operator switches a control plane over (planned move at `start`).
    Switchover,
    /// Messages to and from the member arrive twice.
    Duplicate,
    /// Messages to and from the member are delayed up to 400 ms (overtaking each other).
    Reorder,
    /// The member's Raft disk stalls: it persists nothing.
    DiskStall,
}

struct Workload {
    epoch: u64,
    /// Local monotonic deadline (the guard's).
    deadline: u64,
}

struct MemberSim {
    name: String,
    rate: f64,
    offset: u64,
    up: bool,
    frozen: bool,
    started_local: u64,
    memory: Memory,
    /// Instances this ringd knows it runs.
    workloads: BTreeMap<String, Workload>,
    /// Instances a crashed predecessor left behind (their guards still run).
    orphans: Vec<(String, Workload)>,
    next_renew_local: u64,
    in_flight: Option<(u64, u64)>, // (request id, sent at local)
}

impl MemberSim {
    fn local(&self, t: u64) -> u64 {
        self.offset + (t as f64 * self.rate) as u64
    }
}

#[derive(Clone)]
enum Msg {
    Renew {
        id: u64,
        from: usize,
        to: usize,
        running: BTreeMap<String, u64>,
    },
    Reply {
        id: u64,
        to: usize,
        granted: BTreeMap<String, u64>,
    },
}

/// Runs one seed. `Err` names the first violated invariant.
pub fn run(config: &SimConfig) -> Result<Report, Violation> {
    let mut world = World::new(config);
    world.run()
}

struct World<'a> {
    c: &'a SimConfig,
    rng: Rng,
    timing: Timing,
    policy: Policy,
    t: u64,
    state: RingState,
    index: u64,
    members: Vec<MemberSim>,
    leader: Option<usize>,
    leader_since: u64,
    leaderless_since: u64,
    /// Leader-local time of the last contact with each member.
    contact: BTreeMap<usize, u64>,
    obs: Observations,
    next_duties: u64,
    /// Directed links that are down: (from, to).
    cut: BTreeSet<(usize, usize)>,
    lossy: BTreeSet<usize>,
    duplicating: BTreeSet<usize>,
    reordering: BTreeSet<usize>,
    stalled: BTreeSet<usize>,
    /// Proposals of the leader not committed yet (its disk stalled).
    pending: Vec<Command>,
    queue: Vec<(u64, Msg)>,
    next_msg_id: u64,
    /// (control plane, epoch) -> host, as first committed.
    committed: BTreeMap<(String, u64), Option<String>>,
    report: Report,
    /// Faults: (start, end, member, kind).
    faults: Vec<(u64, u64, usize, Fault)>,
}

impl<'a> World<'a> {
    fn new(c: &'a SimConfig) -> Self {
        let mut rng = Rng(c.seed ^ 0x5EED);
        let timing = Timing::loopback();
        let policy = Policy {
            lease_ms: timing.lease_ms,
            fence_ms: timing.fence_ms,
            margin_ms: timing.clock_margin_ms,
            min_move_interval_ms: 1_000,
            capacity: 0,
            etcd_replace_after_ms: 60_000,
        };
        let members = (0..c.members)
            .map(|i| {
                let drift = (rng.below(2_001) as f64 / 1_000.0 - 1.0) * c.drift;
                MemberSim {
                    name: ((b'a' + i as u8) as char).to_string(),
                    rate: 1.0 + drift,
                    offset: rng.below(1_000_000),
                    up: true,
                    frozen: false,
                    started_local: 0,
                    memory: Memory::default(),
                    workloads: BTreeMap::new(),
                    orphans: Vec::new(),
                    next_renew_local: 0,
                    in_flight: None,
                }
            })
            .collect();
        // Faults: a few, possibly overlapping, all healed by fault_ms.
        let mut faults = Vec::new();
        let count = 2 + rng.below(5) as usize;
        for _ in 0..count {
            let start = 2_000 + rng.below(c.fault_ms.saturating_sub(6_000).max(1));
            let length = 200 + rng.below(5_000);
            let member = rng.below(c.members as u64) as usize;
            let kind = match rng.below(10) {
                0 => Fault::Crash,
                1 => Fault::Freeze,
                2 => Fault::Isolate,
                3 => Fault::CutOutgoing,
                4 => Fault::CutIncoming,
                5 => Fault::Switchover,
                6 => Fault::Duplicate,
                7 => Fault::Reorder,
                8 => Fault::DiskStall,
                _ => Fault::Lossy,
            };
            faults.push((start, (start + length).min(c.fault_ms), member, kind));
        }
        let mut w = World {
            c,
            rng,
            timing,
            policy,
            t: 0,
            state: RingState::default(),
            index: 0,
            members,
            leader: Some(0),
            leader_since: 0,
            leaderless_since: 0,
            contact: BTreeMap::new(),
            obs: Observations::default(),
            next_duties: 0,
            cut: BTreeSet::new(),
            lossy: BTreeSet::new(),
            duplicating: BTreeSet::new(),
            reordering: BTreeSet::new(),
            stalled: BTreeSet::new(),
            pending: Vec::new(),
            queue: Vec::new(),
            next_msg_id: 1,
            committed: BTreeMap::new(),
            report: Report {
                faults: count,
                ..Report::default()
            },
            faults,
        };
        w.bootstrap();
        w
    }

    /// Proposes `command` on the leader: applied at once while it can commit, else queued
    /// behind its stalled disk (and lost if it stops leading first), as a Raft log would.
    fn commit(&mut self, command: Command) {
        if !self.leader_commits() {
            self.pending.push(command);
            return;
        }
        self.flush_pending();
        self.apply_now(command);
    }

    /// Commits what the leader queued while its disk stalled, in order.
    fn flush_pending(&mut self) {
        for command in std::mem::take(&mut self.pending) {
            self.apply_now(command);
        }
    }

    fn apply_now(&mut self, command: Command) {
        self.index += 1;
        let moved = matches!(command, Command::MoveControlPlane { .. });
        let released = matches!(command, Command::ReleaseFence { .. });
        let backup = matches!(command, Command::ReportBackup { .. });
        let proposal = Proposal {
            command,
            at_ms: 1_700_000_000_000 + self.t,
            actor: "sim".into(),
            reason: String::new(),
        };
        if self.state.apply(self.index, &proposal).is_ok() {
            self.report.moves += usize::from(moved);
            self.report.releases += usize::from(released);
            self.report.backups += usize::from(backup);
        }
    }

    fn bootstrap(&mut self) {
        let members: Vec<MemberSpec> = (0..self.c.members)
            .map(|i| MemberSpec {
                id: i as u64 + 1,
                name: self.members[i].name.clone(),
                zone: format!("zone-{}", self.members[i].name),
                address: format!("10.0.0.{}:7401", i + 1),
                admin_address: format!("10.0.0.{}:7400", i + 1),
            })
            .collect();
        self.commit(Command::Bootstrap {
            members,
            dns_zone: None,
        });
        let voters = (1..=self.c.members as u64).collect();
        self.state.apply_membership(&voters, &BTreeSet::new());
        for i in 0..self.c.control_planes {
            let home = (i % 2 == 0).then(|| self.members[i % self.c.members].name.clone());
            self.commit(Command::AddControlPlane(ControlPlaneSpec {
                name: format!("cp{i}"),
                home,
                dns_name: format!("cp{i}.ring.example"),
                endpoints: self
                    .members
                    .iter()
                    .map(|m| (m.name.clone(), format!("{}.example:443", m.name)))
                    .collect(),
                backup: format!("s3://backups/cp{i}"),
                backups: BTreeMap::new(),
                host: None,
                prefer: Vec::new(),
                tolerance: Default::default(),
                etcd_peers: Default::default(),
            }));
        }
    }

    fn active(&self, m: usize) -> bool {
        self.members[m].up && !self.members[m].frozen
    }

    fn link(&self, from: usize, to: usize) -> bool {
        from == to || !self.cut.contains(&(from, to))
    }

    /// Whether `m` reaches a majority both ways (heartbeats, a ReadIndex: no disk needed).
    fn has_quorum(&self, m: usize) -> bool {
        let reachable = (0..self.c.members)
            .filter(|&o| o == m || (self.active(o) && self.link(m, o) && self.link(o, m)))
            .count();
        self.active(m) && reachable > self.c.members / 2
    }

    /// Whether `m` and a majority it reaches can persist: what a commit or a vote needs.
    fn can_persist(&self, m: usize) -> bool {
        let reachable = (0..self.c.members)
            .filter(|&o| !self.stalled.contains(&o))
            .filter(|&o| o == m || (self.active(o) && self.link(m, o) && self.link(o, m)))
            .count();
        self.active(m) && !self.stalled.contains(&m) && reachable > self.c.members / 2
    }

    /// Whether the leader can commit now.
    fn leader_commits(&self) -> bool {
        self.leader.is_some_and(|l| self.can_persist(l))
    }

    fn apply_faults(&mut self) {
        // Operator switchovers happen once, at their start, through the leader.
        let switchovers: Vec<usize> = self
            .faults
            .iter()
            .filter(|f| f.3 == Fault::Switchover && self.t >= f.0 && self.t < f.0 + self.c.step_ms)
            .map(|f| f.2)
            .collect();
        for pick in switchovers {
            if self.leader_commits() {
                let name = format!("cp{}", pick % self.c.control_planes);
                if let Ok(plan) = garden_ring_core::controller::plan_moves(
                    &self.state,
                    std::slice::from_ref(&name),
                    None,
                    garden_ring_core::MoveKind::Switchover,
                    &self.policy,
                    1_700_000_000_000 + self.t,
                ) {
                    for command in plan {
                        self.commit(command);
                    }
                }
            }
        }
        self.cut.clear();
        self.lossy.clear();
        self.duplicating.clear();
        self.reordering.clear();
        self.stalled.clear();
        let mut frozen = BTreeSet::new();
        let mut down = BTreeSet::new();
        for &(start, end, m, kind) in &self.faults {
            if self.t < start || self.t >= end {
                continue;
            }
            for o in 0..self.c.members {
                if o == m {
                    continue;
                }
                match kind {
                    Fault::Isolate => {
                        self.cut.insert((m, o));
                        self.cut.insert((o, m));
                    }
                    Fault::CutOutgoing => {
                        self.cut.insert((m, o));
                    }
                    Fault::CutIncoming => {
                        self.cut.insert((o, m));
                    }
                    _ => {}
                }
            }
            match kind {
                Fault::Crash => {
                    down.insert(m);
                }
                Fault::Freeze => {
                    frozen.insert(m);
                }
                Fault::Lossy => {
                    self.lossy.insert(m);
                }
                Fault::Duplicate => {
                    self.duplicating.insert(m);
                }
                Fault::Reorder => {
                    self.reordering.insert(m);
                }
                Fault::DiskStall => {
                    self.stalled.insert(m);
                }
                _ => {}
            }
        }
        for m in 0..self.c.members {
            let should_be_up = !down.contains(&m);
            if self.members[m].up && !should_be_up {
                // kill -9: the guards live on as orphans.
                let member = &mut self.members[m];
                let left: Vec<(String, Workload)> =
                    std::mem::take(&mut member.workloads).into_iter().collect();
                member.orphans.extend(left);
                member.up = false;
                member.in_flight = None;
            } else if !self.members[m].up && should_be_up {
                let now_local = self.members[m].local(self.t);
                let member = &mut self.members[m];
                member.up = true;
                member.memory = Memory::default();
                member.started_local = now_local;
                member.next_renew_local = now_local;
            }
            self.members[m].frozen = frozen.contains(&m);
        }
    }

    fn elect(&mut self) {
        let effective = self.leader.is_some_and(|l| self.has_quorum(l));
        if effective {
            self.leaderless_since = self.t;
            return;
        }
        if self.t < self.leaderless_since + self.timing.election_timeout_max_ms {
            return;
        }
        // A vote is persisted before it is granted: a stalled disk neither votes nor wins.
        let candidates: Vec<usize> = (0..self.c.members)
            .filter(|&m| self.can_persist(m))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let pick = candidates[self.rng.below(candidates.len() as u64) as usize];
        // What the old leader had not committed is gone with its term.
        self.pending.clear();
        self.leader = Some(pick);
        self.leader_since = self.t;
        self.leaderless_since = self.t;
        self.contact.clear();
        self.obs = Observations::default();
        self.next_duties = self.t;
    }

    fn send(&mut self, msg: Msg, from: usize, to: usize) {
        if !self.link(from, to) {
            return;
        }
        let involved = |set: &BTreeSet<usize>| set.contains(&from) || set.contains(&to);
        if involved(&self.lossy) && self.rng.chance(self.c.loss_percent) {
            self.report.dropped += 1;
            return;
        }
        let max_delay = if involved(&self.reordering) { 400 } else { 40 };
        let delay = 1 + self.rng.below(max_delay);
        if delay > 40 {
            self.report.reordered += 1;
        }
        if involved(&self.duplicating) && self.rng.chance(50) {
            // A copy can come much later (a retransmission through a slow path).
            let again = delay + 1 + self.rng.below(3_000);
            self.queue.push((self.t + again, msg.clone()));
            self.report.duplicated += 1;
        }
        self.queue.push((self.t + delay, msg));
    }

    fn agents(&mut self) {
        for m in 0..self.c.members {
            if !self.active(m) {
                continue;
            }
            let now = self.members[m].local(self.t);
            // A request unanswered for lease/2 is given up (its answer will be ignored).
            if let Some((_, sent)) = self.members[m].in_flight
                && now >= sent + self.timing.lease_ms / 2
            {
                self.members[m].in_flight = None;
            }
            // After a restart, wait out any lease a previous run may hold (its orphans).
            let ready =
                now >= self.members[m].started_local + self.timing.lease_ms + self.timing.fence_ms;
            if self.members[m].in_flight.is_some()
                || now < self.members[m].next_renew_local
                || !ready
            {
                continue;
            }
            let Some(leader) = self.leader else { continue };
            let id = self.next_msg_id;
            self.next_msg_id += 1;
            let running = self.members[m]
                .workloads
                .iter()
                .map(|(n, w)| (n.clone(), w.epoch))
                .collect();
            self.members[m].in_flight = Some((id, now));
            self.members[m].next_renew_local = now + self.timing.lease_ms / 4;
            self.send(
                Msg::Renew {
                    id,
                    from: m,
                    to: leader,
                    running,
                },
                m,
                leader,
            );
        }
    }

    fn deliver(&mut self) {
        let mut due = Vec::new();
        let mut keep = Vec::new();
        for (at, msg) in std::mem::take(&mut self.queue) {
            let to = match &msg {
                Msg::Renew { to, .. } | Msg::Reply { to, .. } => *to,
            };
            // A frozen or crashed receiver: the message waits (frozen) or is lost (crashed).
            if at <= self.t && self.active(to) {
                due.push(msg);
            } else if at <= self.t && !self.members[to].up {
                // lost
            } else {
                keep.push((at, msg));
            }
        }
        self.queue = keep;
        for msg in due {
            match msg {
                Msg::Renew {
                    id,
                    from,
                    to,
                    running,
                } => self.answer(id, from, to, running),
                Msg::Reply { id, to, granted } => self.granted(id, to, granted),
            }
        }
    }

    fn answer(&mut self, id: u64, from: usize, leader: usize, running: BTreeMap<String, u64>) {
        // Only the current leader, confirming its leadership with a majority, answers.
        if self.leader != Some(leader) || !self.has_quorum(leader) {
            return;
        }
        let now = self.members[leader].local(self.t);
        self.contact.insert(from, now);
        let name = self.members[from].name.clone();
        let granted = self.state.grants(&name);
        let backups = self.backup_report();
        for cp in self.state.control_planes.values() {
            let key = (cp.name.clone(), cp.epoch, name.clone());
            if cp.fencing.contains(&name) && !running.contains_key(&cp.name) {
                self.obs.released.insert(key.clone());
            } else if cp.phase == Phase::Starting
                && cp.host.as_deref() == Some(name.as_str())
                && running.get(&cp.name) == Some(&cp.epoch)
            // every workload is healthy here
            {
                self.obs.serving.insert(key.clone());
            }
            // What the host's etcd driver would say about its backups.
            if cp.host.as_deref() == Some(name.as_str()) && running.get(&cp.name) == Some(&cp.epoch)
            {
                self.obs.backups.insert(key, backups.clone());
            }
        }
        self.send(
            Msg::Reply {
                id,
                to: from,
                granted,
            },
            leader,
            from,
        );
    }

    /// A host's backup report at the current time: a full snapshot every minute, a delta every
    /// second after it.
    fn backup_report(&self) -> BackupReport {
        let unix_ms = 1_700_000_000_000 + self.t;
        let full_at = self.t / 60_000 * 60_000;
        let deltas = (self.t - full_at) / 1_000;
        BackupReport {
            full: Some(format!(
                "sim/v2/Full-00000000-{:08}-{}.gz",
                full_at / 100,
                (1_700_000_000_000 + full_at) / 1_000
            )),
            deltas_since_full: deltas,
            revision: self.t / 100,
            newest_delta_unix_ms: (deltas > 0).then_some(unix_ms),
            up_to_date_unix_ms: unix_ms,
            delta_period_ms: 1_000,
            ..BackupReport::default()
        }
    }

    fn granted(&mut self, id: u64, m: usize, granted: BTreeMap<String, u64>) {
        let Some((expected, sent)) = self.members[m].in_flight else {
            return;
        };
        if expected != id && !self.c.break_reply_matching {
            return;
        }
        self.members[m].in_flight = None;
        let grant = Grant {
            sent_at_ms: sent,
            lease_ms: self.timing.lease_ms,
            control_planes: granted,
            replicas: BTreeMap::new(),
        };
        let now = self.members[m].local(self.t);
        if grant.deadline_ms() <= now {
            return;
        }
        let running: BTreeMap<String, u64> = self.members[m]
            .workloads
            .iter()
            .map(|(n, w)| (n.clone(), w.epoch))
            .collect();
        let member = &mut self.members[m];
        for action in reconcile(&mut member.memory, &grant, &running) {
            match action {
                Action::Stop { name, .. } => {
                    member.workloads.remove(&name);
                }
                Action::Start {
                    name,
                    epoch,
                    deadline_ms,
                } => {
                    member.workloads.insert(
                        name,
                        Workload {
                            epoch,
                            deadline: deadline_ms,
                        },
                    );
                }
                Action::Extend {
                    name, deadline_ms, ..
                } => {
                    if let Some(w) = member.workloads.get_mut(&name) {
                        w.deadline = w.deadline.max(deadline_ms);
                    }
                }
            }
        }
    }

    fn guards(&mut self) {
        if self.c.break_fencing {
            return;
        }
        let fence = self.timing.fence_ms / 2;
        for m in 0..self.c.members {
            let now = self.members[m].local(self.t);
            let member = &mut self.members[m];
            member.workloads.retain(|_, w| now < w.deadline + fence);
            member.orphans.retain(|(_, w)| now < w.deadline + fence);
        }
    }

    fn duties(&mut self) {
        let Some(leader) = self.leader else { return };
        if !self.has_quorum(leader) {
            return;
        }
        let now = self.members[leader].local(self.t);
        if now < self.next_duties {
            return;
        }
        self.next_duties = now + self.timing.heartbeat_ms * 2;
        let since_election = now.saturating_sub(self.members[leader].local(self.leader_since));
        // Heartbeat acknowledgements: both links up and the member answering.
        for m in 0..self.c.members {
            if m == leader || (self.active(m) && self.link(leader, m) && self.link(m, leader)) {
                self.contact.insert(m, now);
            }
        }
        let judgements: Vec<(u64, Health)> = self
            .state
            .members
            .values()
            .filter_map(|member| {
                let m = (member.id - 1) as usize;
                let last = self.contact.get(&m).map(|c| now.saturating_sub(*c));
                let health = garden_ring_core::health::judge(last, since_election, &self.timing)?;
                (health != member.health).then_some((member.id, health))
            })
            .collect();
        for (id, health) in judgements {
            self.commit(Command::SetHealth { id, health });
        }
        self.obs.now_ms = now;
        self.obs.unix_ms = 1_700_000_000_000 + self.t;
        self.obs.observe(&self.state);
        for d in decide(&self.state, &self.obs, &self.policy) {
            self.commit(d.command);
        }
    }

    fn check(&mut self) -> Result<(), Violation> {
        let fail = |what: String| Violation {
            seed: self.c.seed,
            at_ms: self.t,
            what,
        };
        let mut serving: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
        for m in &self.members {
            for (name, w) in m
                .workloads
                .iter()
                .chain(m.orphans.iter().map(|(n, w)| (n, w)))
            {
                serving.entry(name).or_default().push((&m.name, w.epoch));
            }
        }
        for (cp, by) in &serving {
            let members: BTreeSet<&str> = by.iter().map(|(m, _)| *m).collect();
            if members.len() > 1 {
                return Err(fail(format!("{cp} served by {by:?} at once")));
            }
        }
        for cp in self.state.control_planes.values() {
            let key = (cp.name.clone(), cp.epoch);
            match self.committed.get(&key) {
                Some(host) if *host != cp.host => {
                    return Err(fail(format!(
                        "{} at epoch {} moved from {host:?} to {:?} without a new epoch",
                        cp.name, cp.epoch, cp.host
                    )));
                }
                Some(_) => {}
                None => {
                    if let Some(((_, last), _)) = self
                        .committed
                        .range((cp.name.clone(), 0)..=(cp.name.clone(), u64::MAX))
                        .next_back()
                        && *last > cp.epoch
                    {
                        return Err(fail(format!("{} went back to epoch {}", cp.name, cp.epoch)));
                    }
                    self.committed.insert(key, cp.host.clone());
                }
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<Report, Violation> {
        let end = self.c.fault_ms + self.c.settle_ms;
        while self.t <= end {
            self.apply_faults();
            self.elect();
            if self.leader_commits() {
                self.flush_pending();
            }
            self.report.stalled_steps += u64::from(!self.stalled.is_empty());
            self.deliver();
            self.duties();
            self.agents();
            self.guards();
            self.check()?;
            self.report.steps += 1;
            self.t += self.c.step_ms;
        }
        // Liveness: every fault healed at fault_ms; by now everything runs.
        for cp in self.state.control_planes.values() {
            if cp.phase != Phase::Running {
                return Err(Violation {
                    seed: self.c.seed,
                    at_ms: self.t,
                    what: format!(
                        "{} is {} (host {:?}, fencing {:?}, {}) {} ms after every fault healed",
                        cp.name,
                        cp.phase,
                        cp.host,
                        cp.fencing,
                        cp.unplaced_reason,
                        self.c.settle_ms
                    ),
                });
            }
        }
        Ok(self.report.clone())
    }
}

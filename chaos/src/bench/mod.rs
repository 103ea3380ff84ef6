//! `ring-chaos bench`: the ring measured against a baseline in the same run, on this machine,
//! reported as ratios (issue 9). Runs on loopback, without namespaces: no root needed.
//!
//! Parts (`--only`):
//! - `commit` ([`commit`]): writes/s and p50/p99 latency at 1, 16 and 64 clients, a 3-member
//!   ring against a 3-member etcd cluster, both with fsync;
//! - `failover` ([`failover`]): SIGKILL of a control plane's host, kill -> lost, new leader,
//!   move committed, serving, DNS answering, against the configured lease;
//! - `copy` ([`copy`]): the migration's snapshot copy against a raw copy of the same data;
//! - `backup` ([`backup`]): the backup data path at a real size (`--backup-mib`, 1 GiB): the
//!   deltas' cost on the hosted etcd, full snapshot upload and migration copy against raw
//!   `object_store`, restore of a full snapshot + 100 deltas against `etcdbrctl restore`, and
//!   a switchover and a failover of a control plane that big, in their parts;
//! - `flood` ([`flood`]): 256 Admin clients writing and reading as fast as they can for 60 s:
//!   no leader change, no member judged suspect, the followers' worst gap between heartbeats
//!   against `heartbeat_ms`, every member's lease kept renewed;
//! - `scale` ([`crate::scale`]): 10,000 control planes, the member hosting 1,000 of them
//!   killed: time until they all run elsewhere and DNS answers their new hosts, and every
//!   `ringd`'s RSS at rest and during the storm, against the goals (10 s, 100 MiB).
//!
//! Output: a table (one row per measurement: ring, baseline, ratio, goal, met) and
//! `--out`/`bench.json` (the rows plus every part's full report).

mod backup;
mod commit;
mod copy;
mod failover;
mod flood;
pub mod floor;
pub(crate) mod local;
mod stats;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

/// Most concurrent clients `--clients` takes (each is a connection and a task).
pub const MAX_CLIENTS: usize = 1024;

/// The parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// Commit path against etcd.
    Commit,
    /// Failover time against the lease.
    Failover,
    /// Migration copy against a raw copy.
    Copy,
    /// Failover at scale: 1,000 of 10,000 control planes moved at once, and memory.
    Scale,
    /// The backup data path at a real size: deltas' cost, upload, copy, restore, moves.
    Backup,
    /// Admin clients flooding the ring: its own traffic must go on.
    Flood,
}

impl Part {
    const ALL: [Part; 6] = [
        Part::Commit,
        Part::Failover,
        Part::Copy,
        Part::Scale,
        Part::Backup,
        Part::Flood,
    ];

    fn name(self) -> &'static str {
        match self {
            Part::Commit => "commit",
            Part::Failover => "failover",
            Part::Copy => "copy",
            Part::Scale => "scale",
            Part::Backup => "backup",
            Part::Flood => "flood",
        }
    }
}

/// `ring-chaos bench`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Run only this part; repeat for several (default: all).
    #[arg(long, value_enum)]
    only: Vec<Part>,
    /// Where bench.json goes (and the logs of a part that failed).
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Measured seconds per system and concurrency in `commit` [default: 10; --quick: 3].
    #[arg(long)]
    seconds: Option<f64>,
    /// Concurrent clients in `commit`; repeat for several [default: 1, 16 and 64].
    #[arg(long, value_name = "N")]
    clients: Vec<usize>,
    /// Kill-the-host trials in `failover`, half of them (rounded up) killing the leader
    /// [default: 5; --quick: 2].
    #[arg(long)]
    trials: Option<u32>,
    /// A short run: 3 s per point, 1 s warm-up, 2 trials, 32 MiB copied, a 64 MiB etcd in `backup`.
    #[arg(long)]
    quick: bool,
    /// MiB copied per row in `copy` [default: 128; --quick: 32].
    #[arg(long)]
    copy_mib: Option<usize>,
    /// Directory with ringd (default: next to ring-chaos, else target/dist, else target/release).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Control planes registered in `scale` [default: 10000; --quick: 2000].
    #[arg(long)]
    scale_control_planes: Option<usize>,
    /// Of those, hosted on the member `scale` kills [default: 1000; --quick: 200].
    #[arg(long)]
    scale_on_victim: Option<usize>,
    /// `scale` kills the leader instead of a follower.
    #[arg(long)]
    scale_kill_leader: bool,
    /// MiB the etcd of `backup` holds [default: 1024; --quick: 64].
    #[arg(long)]
    backup_mib: Option<usize>,
    /// The timings of `failover`'s rings: `loopback` (lease 1 s, member lost after 2 s),
    /// `tight` (lease 2 s, fence 1 s, member lost after 4 s) or `production` (the defaults:
    /// lease 4 s, fence 2 s, member lost after 8 s).
    #[arg(long, default_value = "loopback", value_parser = crate::world::TIMING_PROFILES)]
    timings: String,
    /// Concurrent clients in `flood` [default: 256].
    #[arg(long, default_value_t = 256)]
    flood_clients: usize,
    /// Seconds of `flood` [default: 60; --quick: 10].
    #[arg(long)]
    flood_seconds: Option<f64>,
    /// Record the leader ringd with `perf record --call-graph dwarf` during each commit
    /// concurrency, into OUT/perf-ring-leader-<clients>.data (MBs each; `perf report -i`).
    #[arg(long)]
    perf: bool,
    /// Fail the run when the ring's throughput at CLIENTS is under RATIO times etcd's, e.g.
    /// `--floor 1=0.9 --floor 64=1.0` (CI's guard against a commit-path regression; the table
    /// is printed first). Repeat for several; every CLIENTS must be measured (`--clients`).
    #[arg(long, value_name = "CLIENTS=RATIO")]
    floor: Vec<floor::Floor>,
}

/// The options with defaults applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    /// Parts to run, in order.
    pub parts: Vec<Part>,
    /// Measured seconds per point (commit).
    pub seconds: f64,
    /// Warm-up seconds per point (commit).
    pub warmup: f64,
    /// Concurrent clients (commit).
    pub concurrency: Vec<usize>,
    /// Failover trials.
    pub trials: u32,
    /// MiB per copy.
    pub copy_mib: usize,
    /// Whether this is a `--quick` run.
    pub quick: bool,
    /// Control planes registered (scale).
    pub scale_control_planes: usize,
    /// Of those, on the member killed (scale).
    pub scale_on_victim: usize,
    /// Whether scale kills the leader instead of a follower.
    pub scale_kill_leader: bool,
    /// MiB the etcd of `backup` holds.
    pub backup_mib: usize,
    /// `loopback` or `production`: the timings of `failover` and `flood`.
    pub timings: String,
    /// Clients in `flood`.
    pub flood_clients: usize,
    /// Seconds of `flood`.
    pub flood_seconds: f64,
    /// Floors under the commit part's throughput ratios.
    pub floors: Vec<floor::Floor>,
}

impl Settings {
    /// Resolves `args` (pure).
    pub fn from_args(args: &BenchArgs) -> anyhow::Result<Self> {
        let mut parts = if args.only.is_empty() {
            Part::ALL.to_vec()
        } else {
            args.only.clone()
        };
        parts.sort_unstable();
        parts.dedup();
        let seconds = args.seconds.unwrap_or(if args.quick { 3.0 } else { 10.0 });
        if !(0.5..=600.0).contains(&seconds) {
            bail!("--seconds must be 0.5 to 600");
        }
        let mut concurrency = if args.clients.is_empty() {
            vec![1, 16, 64]
        } else {
            args.clients.clone()
        };
        concurrency.sort_unstable();
        concurrency.dedup();
        if let Some(n) = concurrency.iter().find(|n| !(1..=MAX_CLIENTS).contains(*n)) {
            bail!("--clients must be 1 to {MAX_CLIENTS} (got {n})");
        }
        let trials = args.trials.unwrap_or(if args.quick { 2 } else { 5 });
        if !(1..=100).contains(&trials) {
            bail!("--trials must be 1 to 100");
        }
        let copy_mib = args.copy_mib.unwrap_or(if args.quick { 32 } else { 128 });
        if !(16..=1024).contains(&copy_mib) {
            bail!("--copy-mib must be 16 to 1024");
        }
        let scale_control_planes =
            args.scale_control_planes
                .unwrap_or(if args.quick { 2_000 } else { 10_000 });
        if !(3..=100_000).contains(&scale_control_planes) {
            bail!("--scale-control-planes must be 3 to 100000");
        }
        let scale_on_victim = args
            .scale_on_victim
            .unwrap_or(if args.quick { 200 } else { 1_000 });
        if scale_on_victim == 0 || scale_on_victim > scale_control_planes / 2 {
            bail!(
                "--scale-on-victim must be 1 to half of --scale-control-planes ({})",
                scale_control_planes / 2
            );
        }
        if !(1..=MAX_CLIENTS).contains(&args.flood_clients) {
            bail!("--flood-clients must be 1 to {MAX_CLIENTS}");
        }
        let flood_seconds = args
            .flood_seconds
            .unwrap_or(if args.quick { 10.0 } else { 60.0 });
        if !(1.0..=3_600.0).contains(&flood_seconds) {
            bail!("--flood-seconds must be 1 to 3600");
        }
        let backup_mib = args
            .backup_mib
            .unwrap_or(if args.quick { 64 } else { 1024 });
        if !(16..=8192).contains(&backup_mib) {
            bail!("--backup-mib must be 16 to 8192");
        }
        if let Some(f) = args
            .floor
            .iter()
            .find(|f| !concurrency.contains(&f.clients))
        {
            bail!(
                "--floor {}={} is for {} clients, which this run does not measure (--clients)",
                f.clients,
                f.min_ratio,
                f.clients
            );
        }
        if !args.floor.is_empty() && !parts.contains(&Part::Commit) {
            bail!("--floor applies to the commit part; add --only commit");
        }
        Ok(Self {
            floors: args.floor.clone(),
            backup_mib,
            parts,
            seconds,
            warmup: if args.quick { 1.0 } else { 2.0 },
            concurrency,
            trials,
            copy_mib,
            quick: args.quick,
            scale_control_planes,
            scale_on_victim,
            scale_kill_leader: args.scale_kill_leader,
            timings: args.timings.clone(),
            flood_clients: args.flood_clients,
            flood_seconds,
        })
    }
}

/// What a row's ratio (ring / baseline) should be.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Goal {
    /// At least this (more is better: throughput).
    AtLeast {
        /// The least ratio.
        ratio: f64,
    },
    /// At most this (less is better: latency).
    AtMost {
        /// The largest ratio.
        ratio: f64,
    },
    /// No target: reported for context.
    Info,
}

impl Goal {
    /// Whether `ratio` meets the goal; `None` without a goal or a ratio.
    pub fn met(self, ratio: Option<f64>) -> Option<bool> {
        let r = ratio?;
        match self {
            Goal::AtLeast { ratio } => Some(r >= ratio),
            Goal::AtMost { ratio } => Some(r <= ratio),
            Goal::Info => None,
        }
    }

    /// The goal in the table.
    pub fn text(self) -> String {
        match self {
            Goal::AtLeast { ratio } => format!(">= {ratio:.2}x"),
            Goal::AtMost { ratio } => format!("<= {ratio:.2}x"),
            Goal::Info => "-".into(),
        }
    }
}

/// ring / baseline, when both are known and the baseline is positive.
pub fn ratio(ring: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    match (ring, baseline) {
        (Some(r), Some(b)) if b > 0.0 && r.is_finite() && b.is_finite() => Some(r / b),
        _ => None,
    }
}

/// One measurement: the ring's value next to the baseline's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The part.
    pub part: Part,
    /// What is measured.
    pub measurement: String,
    /// Its unit.
    pub unit: String,
    /// The ring's value.
    pub ring: Option<f64>,
    /// What it is compared with (`etcd`, `raw object_store`, `member_lost_ms`, ...).
    pub baseline_name: String,
    /// The baseline's value.
    pub baseline: Option<f64>,
    /// ring / baseline.
    pub ratio: Option<f64>,
    /// What the ratio should be.
    pub goal: Goal,
    /// Whether it is (`None`: no goal, or nothing measured).
    pub met: Option<bool>,
}

impl Row {
    /// A row; the ratio and whether the goal is met are computed.
    pub fn new(
        part: Part,
        measurement: impl Into<String>,
        unit: &str,
        ring: Option<f64>,
        baseline_name: &str,
        baseline: Option<f64>,
        goal: Goal,
    ) -> Self {
        let ratio = ratio(ring, baseline);
        Self {
            part,
            measurement: measurement.into(),
            unit: unit.into(),
            ring,
            baseline_name: baseline_name.into(),
            baseline,
            ratio,
            goal,
            met: goal.met(ratio),
        }
    }
}

/// How a part ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It ran.
    Ok,
    /// It could not run or broke off (see the error).
    Failed,
}

/// One part's outcome in bench.json.
#[derive(Debug, Clone, Serialize)]
pub struct PartOutcome {
    /// The part.
    pub part: Part,
    /// How it ended.
    pub status: Status,
    /// How long it took, s.
    pub seconds: f64,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its full report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
}

/// The machine the numbers come from.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub cpus: usize,
    /// `uname -sr`.
    pub kernel: String,
    /// /proc/loadavg before the run (other jobs share the machine).
    pub load_before: String,
    /// /proc/loadavg after the run.
    pub load_after: String,
}

/// bench.json.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Version of this format.
    pub format: u32,
    /// When the run started, Unix ms.
    pub started_unix_ms: u64,
    /// Where.
    pub machine: Machine,
    /// With what.
    pub settings: Settings,
    /// Every measurement.
    pub rows: Vec<Row>,
    /// Every part, with its full report.
    pub parts: Vec<PartOutcome>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The rows of the flood report: the worst heartbeat gap against `heartbeat_ms`, the least
/// lease left against the lease, and for context throughput, leader changes and health events.
fn flood_rows(r: &flood::FloodReport) -> Vec<Row> {
    let c = r.clients;
    let mut rows = vec![
        Row::new(
            Part::Flood,
            format!("worst gap between heartbeats, {c} clients"),
            "ms",
            r.worst_gap_ms().map(|ms| ms as f64),
            "heartbeat_ms",
            Some(r.heartbeat_ms as f64),
            Goal::Info,
        ),
        Row::new(
            Part::Flood,
            format!("worst gap between heartbeats vs election timeout, {c} clients"),
            "ms",
            r.worst_gap_ms().map(|ms| ms as f64),
            "election_timeout_min_ms",
            Some(r.election_timeout_min_ms as f64),
            Goal::AtMost { ratio: 1.0 },
        ),
        Row::new(
            Part::Flood,
            format!("gaps over heartbeat_ms, {c} clients"),
            "gaps",
            Some(r.members.iter().map(|m| m.gaps_over_heartbeat).sum::<u64>() as f64),
            "gaps in all",
            Some(r.members.iter().map(|m| m.gaps).sum::<u64>() as f64),
            Goal::Info,
        ),
        Row::new(
            Part::Flood,
            format!("least own lease left, {c} clients"),
            "ms",
            r.members
                .iter()
                .filter_map(|m| m.min_lease_remaining_s)
                .reduce(f64::min)
                .map(|s| s * 1000.0),
            "lease_ms",
            Some(r.lease_ms as f64),
            Goal::AtLeast { ratio: 0.5 },
        ),
        Row::new(
            Part::Flood,
            format!("lease renewals answered by the leader, {c} clients"),
            "renewals",
            r.renewals_answered.map(|n| n as f64),
            "every lease_ms / 4",
            Some(r.renewals_expected()),
            Goal::AtLeast { ratio: 0.9 },
        ),
        Row::new(
            Part::Flood,
            format!("leader changes + health events, {c} clients"),
            "events",
            Some((r.term_changes() + r.health_events.len() as u64) as f64),
            "-",
            None,
            Goal::Info,
        ),
    ];
    for (what, value) in [("writes", r.writes_per_s), ("reads", r.reads_per_s)] {
        rows.push(Row::new(
            Part::Flood,
            format!("{what} acknowledged, {c} clients"),
            &format!("{what}/s"),
            Some(value),
            "-",
            None,
            Goal::Info,
        ));
    }
    rows
}

/// The rows of the commit report.
fn commit_rows(r: &commit::CommitReport) -> Vec<Row> {
    let mut rows = Vec::new();
    for ring in &r.ring {
        let etcd = r.etcd.iter().find(|e| e.clients == ring.clients);
        let c = ring.clients;
        let clients = if c == 1 { "client" } else { "clients" };
        rows.push(Row::new(
            Part::Commit,
            format!("throughput, {c} {clients}"),
            "writes/s",
            Some(ring.summary.per_second),
            "etcd",
            etcd.map(|e| e.summary.per_second),
            Goal::AtLeast { ratio: 1.0 },
        ));
        rows.push(Row::new(
            Part::Commit,
            format!("p50 latency, {c} {clients}"),
            "ms",
            Some(ms(ring.summary.p50_us)),
            "etcd",
            etcd.map(|e| ms(e.summary.p50_us)),
            Goal::Info,
        ));
        rows.push(Row::new(
            Part::Commit,
            format!("p99 latency, {c} {clients}"),
            "ms",
            Some(ms(ring.summary.p99_us)),
            "etcd",
            etcd.map(|e| ms(e.summary.p99_us)),
            Goal::AtMost { ratio: 1.0 },
        ));
        rows.push(Row::new(
            Part::Commit,
            format!("server CPU per write, {c} {clients}"),
            "µs",
            ring.server_cpu_us_per_write,
            "etcd",
            etcd.and_then(|e| e.server_cpu_us_per_write),
            Goal::Info,
        ));
    }
    rows
}

/// The rows of the failover report: each step against its floor.
fn failover_rows(r: &failover::FailoverReport) -> Vec<Row> {
    let floor = Some(r.floor_ms as f64);
    let election = Some(r.timing.election_timeout_min_ms as f64);
    let mut rows = Vec::new();
    for (name, s, base_name, base) in [
        ("kill -> judged lost", &r.detect, "member_lost_ms", floor),
        (
            "kill -> new leader",
            &r.elect,
            "election_timeout_min_ms",
            election,
        ),
        ("kill -> move committed", &r.r#move, "member_lost_ms", floor),
        (
            "kill -> serving at new host",
            &r.serving,
            "member_lost_ms",
            floor,
        ),
        (
            "kill -> DNS answers new host",
            &r.dns,
            "member_lost_ms",
            floor,
        ),
    ] {
        for (p, v) in [("p50", s.p50_ms), ("p99", s.p99_ms)] {
            rows.push(Row::new(
                Part::Failover,
                format!("{name} {p} (n={})", s.n),
                "ms",
                v.map(|v| v as f64),
                base_name,
                base,
                Goal::Info,
            ));
        }
    }
    rows
}

/// Issue 9's goals for the storm: every moved control plane running and its name visible
/// within this, and every `ringd` under [`SCALE_RSS_GOAL_MIB`].
pub const SCALE_STORM_GOAL_MS: f64 = 10_000.0;
/// Issue 9's goal for a `ringd`'s resident memory, at rest and during the storm.
pub const SCALE_RSS_GOAL_MIB: f64 = 100.0;

/// The rows of the scale report: the storm's steps and each member's memory, against the
/// issue's goals (the "baseline" column is the goal; a ratio <= 1.0 meets it).
fn scale_rows(r: &crate::scale::ScaleReport) -> Vec<Row> {
    let n = r.on_victim;
    let goal = Some(SCALE_STORM_GOAL_MS);
    let mut rows = vec![Row::new(
        Part::Scale,
        format!("registering {} control planes", r.control_planes),
        "ms",
        Some(r.registration_ms as f64),
        "-",
        None,
        Goal::Info,
    )];
    for (name, v, g) in [
        ("kill -> victim judged lost", r.lost_ms, Goal::Info),
        (
            &format!("kill -> all {n} moved") as &str,
            r.moved_ms,
            Goal::Info,
        ),
        (
            &format!("kill -> all {n} running"),
            r.running_ms,
            Goal::AtMost { ratio: 1.0 },
        ),
        (
            &format!("kill -> all {n} names answered by DNS"),
            r.dns_ms,
            Goal::AtMost { ratio: 1.0 },
        ),
    ] {
        rows.push(Row::new(
            Part::Scale,
            name,
            "ms",
            v.map(|v| v as f64),
            "goal",
            goal,
            g,
        ));
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    for (member, rss) in &r.rss {
        let role = if *member == r.victim {
            " (victim)"
        } else if *member == r.leader_before {
            " (leader)"
        } else {
            ""
        };
        let rss_row = |what: &str, kib: u64, goal: Goal| {
            Row::new(
                Part::Scale,
                format!("RSS {member}{role} {what}"),
                "MiB",
                Some(mib(kib)),
                "goal",
                Some(SCALE_RSS_GOAL_MIB),
                goal,
            )
        };
        let under_goal = Goal::AtMost { ratio: 1.0 };
        rows.push(rss_row("at rest", rss.rest_kib, under_goal));
        rows.push(rss_row(
            "peak while registering",
            rss.peak_after_registration_kib,
            Goal::Info,
        ));
        if *member != r.victim {
            rows.push(rss_row(
                "peak during the storm",
                rss.storm_max_kib.max(rss.peak_kib),
                under_goal,
            ));
        }
    }
    rows
}

/// The rows of the copy report.
fn copy_rows(r: &copy::CopyReport) -> Vec<Row> {
    let speed = |name: &str| {
        r.rows
            .iter()
            .find(|row| row.name == name)
            .map(|row| row.mib_per_s)
    };
    let mut rows = vec![Row::new(
        Part::Copy,
        format!("migration copy, {} MiB", r.total_mib),
        "MiB/s",
        speed("ring (streamed)"),
        "raw object_store",
        speed("raw object_store"),
        Goal::AtLeast { ratio: 0.9 },
    )];
    if let Some(cli) = speed("aws s3 cp --recursive (server-side)") {
        rows.push(Row::new(
            Part::Copy,
            format!("server-side copy, {} MiB", r.total_mib),
            "MiB/s",
            speed("ring (server-side)"),
            "aws s3 cp",
            Some(cli),
            Goal::Info,
        ));
    }
    rows
}

/// The rows of the backup report.
fn backup_rows(r: &backup::BackupReport) -> Vec<Row> {
    let size = format!("{} MiB", r.size_mib);
    // A variant of the deltas' load against the same load without snapshots, for context.
    let without_snapshots = |what: &str, writes_per_s: &[f64]| {
        Row::new(
            Part::Backup,
            what.to_string(),
            "writes/s",
            Some(copy::median(writes_per_s)),
            "no snapshots",
            Some(copy::median(&r.plain_writes_per_s)),
            Goal::Info,
        )
    };
    let mut rows = vec![
        Row::new(
            Part::Backup,
            format!(
                "writes/s, {} clients, a delta every {} s ({size} etcd)",
                r.clients,
                backup::DELTA_PERIOD.as_secs()
            ),
            "writes/s",
            Some(copy::median(&r.with_deltas_writes_per_s)),
            "no snapshots",
            Some(copy::median(&r.plain_writes_per_s)),
            Goal::AtLeast { ratio: 0.95 },
        ),
        without_snapshots(
            "  same, the deltas into a local file:// location (moto's CPU share apart)",
            &r.with_file_deltas_writes_per_s,
        ),
        without_snapshots(
            "  same, a watch of every key alone (etcd's share)",
            &r.with_watch_writes_per_s,
        ),
        Row::new(
            Part::Backup,
            "  same, the deltas into a local file:// location".to_string(),
            "writes/s",
            Some(copy::median(&r.with_file_deltas_writes_per_s)),
            "etcdbrctl's deltas, local",
            (!r.with_etcdbrctl_writes_per_s.is_empty())
                .then(|| copy::median(&r.with_etcdbrctl_writes_per_s)),
            Goal::Info,
        ),
        Row::new(
            Part::Backup,
            format!("defragmentation ({size} etcd, no write answered meanwhile)"),
            "s",
            Some(r.defrag_s),
            "-",
            None,
            Goal::Info,
        ),
        Row::new(
            Part::Backup,
            format!("full snapshot upload ({size} etcd)"),
            "MiB/s",
            Some(r.full_upload.mib_per_s),
            "raw object_store",
            Some(r.raw_upload.mib_per_s),
            Goal::AtLeast { ratio: 0.9 },
        ),
        Row::new(
            Part::Backup,
            format!("full snapshot upload ({size} etcd)"),
            "MiB/s",
            Some(r.full_upload.mib_per_s),
            "etcd's stream alone",
            Some(r.stream_alone.mib_per_s),
            Goal::Info,
        ),
        Row::new(
            Part::Backup,
            format!("migration copy, full + {} deltas", r.deltas),
            "MiB/s",
            Some(r.copy.mib_per_s),
            "raw object_store",
            Some(r.raw_copy.mib_per_s),
            Goal::AtLeast { ratio: 0.9 },
        ),
        Row::new(
            Part::Backup,
            format!("restore, full + {} deltas", r.deltas),
            "s",
            Some(r.restore_s),
            "etcdbrctl restore",
            r.etcdbrctl_restore_s,
            Goal::AtMost { ratio: 1.0 },
        ),
    ];
    if let Some(s) = r.restore_35_s {
        rows.push(Row::new(
            Part::Backup,
            format!("restore, full + {} deltas, etcd 3.5", r.deltas),
            "s",
            Some(s),
            "etcdbrctl restore",
            r.etcdbrctl_restore_s,
            Goal::AtMost { ratio: 1.0 },
        ));
    }
    for m in &r.moves {
        rows.push(Row::new(
            Part::Backup,
            format!("{} -> serving ({size})", m.what),
            "ms",
            Some(m.total_ms as f64),
            "-",
            None,
            Goal::Info,
        ));
        for (part, v) in [
            ("before the copy", m.before_copy_ms),
            ("copy", m.copy_ms),
            ("restore", m.restore_ms),
            ("start", m.start_ms),
        ] {
            rows.push(Row::new(
                Part::Backup,
                format!("  {}: {part}", m.what),
                "ms",
                v.map(|v| v as f64),
                "-",
                None,
                Goal::Info,
            ));
        }
        if let Some(gone) = m.old_etcd_gone_ms {
            rows.push(Row::new(
                Part::Backup,
                format!("  {}: kill -> the old etcd fenced", m.what),
                "ms",
                Some(gone as f64),
                "lease_ms + fence_ms",
                m.fence_bound_ms.map(|b| b as f64),
                Goal::AtMost { ratio: 1.0 },
            ));
        }
        rows.push(Row::new(
            Part::Backup,
            format!("  {}: MiB copied", m.what),
            "MiB",
            Some(m.bytes_copied as f64 / (1024.0 * 1024.0)),
            "-",
            None,
            Goal::Info,
        ));
        rows.push(Row::new(
            Part::Backup,
            format!(
                "  {}: acknowledged writes lost (of {})",
                m.what, m.acked_writes
            ),
            "writes",
            Some(m.lost_writes as f64),
            "-",
            None,
            Goal::Info,
        ));
    }
    rows
}

/// A number with as many decimals as it deserves.
fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// The table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "part",
        "measurement",
        "unit",
        "ring",
        "baseline",
        "value",
        "ratio",
        "goal",
        "met",
    ];
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.part.name().to_string(),
                r.measurement.clone(),
                r.unit.clone(),
                num(r.ring),
                r.baseline_name.clone(),
                num(r.baseline),
                r.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}x")),
                r.goal.text(),
                match r.met {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Text left, numbers right.
    let right = [false, false, false, true, false, true, true, false, false];
    let line = |row: &[String]| {
        row.iter()
            .enumerate()
            .map(|(i, c)| {
                if right[i] {
                    format!("{c:>w$}", w = width[i])
                } else {
                    format!("{c:<w$}", w = width[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&header.map(String::from));
    out.push('\n');
    out.push_str(
        &width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    for row in &cells {
        out.push('\n');
        out.push_str(&line(row));
    }
    out
}

/// Where `ringd` is: `--bin-dir`, next to this binary, or `target/dist`, else `target/release`
/// (here or under `CARGO_TARGET_DIR`).
fn find_bin_dir(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(d) = explicit {
        candidates.push(d);
    } else {
        if let Some(d) = std::env::current_exe()?.parent() {
            candidates.push(d.to_path_buf());
        }
        let mut targets = Vec::new();
        if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
            targets.push(PathBuf::from(t));
        }
        targets.push(PathBuf::from("target"));
        for profile in ["dist", "release"] {
            candidates.extend(targets.iter().map(|t| t.join(profile)));
        }
    }
    let found = candidates
        .iter()
        .find(|d| d.join("ringd").is_file())
        .with_context(|| {
            format!(
                "no ringd in {}: build it with `cargo build --profile dist -p garden-ring --bins` (or pass --bin-dir)",
                candidates
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let found = found.canonicalize()?;
    if found.file_name().is_some_and(|n| n == "debug") {
        eprintln!(
            "warning: {} holds a debug build of ringd: its numbers mean little; build with --profile dist",
            found.display()
        );
    }
    Ok(found)
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn kernel() -> String {
    std::process::Command::new("uname")
        .arg("-sr")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Copies the `*.log` files under `from` into `to` (a failed part's evidence, before its
/// scratch directory goes).
fn keep_logs(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            keep_logs(&path, &target);
        } else if path.extension().is_some_and(|e| e == "log")
            && std::fs::create_dir_all(to).is_ok()
        {
            let _ = std::fs::copy(&path, &target);
        }
    }
}

/// What a part runs with.
struct PartContext<'a> {
    settings: &'a Settings,
    bin_dir: Option<&'a Path>,
    dir: &'a Path,
    certs: &'a Path,
    perf: Option<PathBuf>,
}

impl PartContext<'_> {
    fn bin_dir(&self) -> anyhow::Result<PathBuf> {
        self.bin_dir
            .map(Path::to_path_buf)
            .context("ringd was not looked for")
    }
}

/// Runs one part: its full report, its rows, and what it found wrong (a part that ran but
/// whose subject failed its checks: the run fails, the report is kept).
async fn run_part(
    part: Part,
    cx: &PartContext<'_>,
) -> anyhow::Result<(serde_json::Value, Vec<Row>, Vec<String>)> {
    match part {
        Part::Commit => {
            let etcd = crate::world::find_tool("etcd")
                .context("etcd not found (Debian: apt-get install etcd-server)")?;
            let report = commit::run(&commit::CommitOptions {
                seconds: cx.settings.seconds,
                warmup: cx.settings.warmup,
                concurrency: cx.settings.concurrency.clone(),
                bin_dir: cx.bin_dir()?,
                etcd,
                dir: cx.dir.to_path_buf(),
                certs: local::certificates(cx.certs)?,
                perf: cx.perf.clone(),
            })
            .await?;
            let broken = floor::broken(&report, &cx.settings.floors);
            for problem in &broken {
                eprintln!("commit: {problem}");
            }
            Ok((serde_json::to_value(&report)?, commit_rows(&report), broken))
        }
        Part::Failover => {
            let report = failover::run(&failover::FailoverOptions {
                trials: cx.settings.trials,
                bin_dir: cx.bin_dir()?,
                dir: cx.dir.to_path_buf(),
                certs: local::certificates(cx.certs)?,
                timing: crate::world::timing_profile(&cx.settings.timings),
            })
            .await?;
            if let Some(failure) = report
                .trials
                .iter()
                .map(|t| t.failure.as_ref())
                .collect::<Option<Vec<_>>>()
            {
                bail!("every trial failed; the first: {}", failure[0]);
            }
            Ok((
                serde_json::to_value(&report)?,
                failover_rows(&report),
                Vec::new(),
            ))
        }
        Part::Copy => {
            let report = copy::run(&copy::CopyBenchOptions {
                total_mib: cx.settings.copy_mib,
                dir: cx.dir.to_path_buf(),
            })
            .await?;
            Ok((
                serde_json::to_value(&report)?,
                copy_rows(&report),
                Vec::new(),
            ))
        }
        Part::Backup => {
            let etcd = crate::world::find_tool("etcd")
                .context("etcd not found (Debian: apt-get install etcd-server)")?;
            let report = backup::run(
                &backup::BackupBenchOptions {
                    size_mib: cx.settings.backup_mib,
                    seconds: cx.settings.seconds,
                    clients: 16,
                    deltas: 100,
                    etcd,
                    etcdbrctl: garden_ring_tests::etcdbrctl::find_etcdbrctl(),
                    dir: cx.dir.to_path_buf(),
                },
                &cx.bin_dir()?,
                &local::certificates(cx.certs)?,
            )
            .await?;
            Ok((
                serde_json::to_value(&report)?,
                backup_rows(&report),
                Vec::new(),
            ))
        }
        Part::Flood => {
            let report = flood::run(&flood::FloodOptions {
                clients: cx.settings.flood_clients,
                seconds: cx.settings.flood_seconds,
                timing: crate::world::timing_profile(&cx.settings.timings),
                bin_dir: cx.bin_dir()?,
                dir: cx.dir.to_path_buf(),
                certs: local::certificates(cx.certs)?,
            })
            .await?;
            for problem in &report.failures {
                eprintln!("flood: {problem}");
            }
            Ok((
                serde_json::to_value(&report)?,
                flood_rows(&report),
                report.failures.clone(),
            ))
        }
        Part::Scale => {
            let report = crate::scale::run(&crate::scale::ScaleOptions {
                control_planes: cx.settings.scale_control_planes,
                on_victim: cx.settings.scale_on_victim,
                out: cx.dir.to_path_buf(),
                bin_dir: cx.bin_dir()?,
                kill_leader: cx.settings.scale_kill_leader,
                ..crate::scale::ScaleOptions::default()
            })
            .await?;
            println!("\n{}", report.table());
            for problem in &report.problems {
                eprintln!("scale: {problem}");
            }
            Ok((
                serde_json::to_value(&report)?,
                scale_rows(&report),
                Vec::new(),
            ))
        }
    }
}

/// Runs `ring-chaos bench`; true when every part ran.
pub fn main(args: BenchArgs) -> anyhow::Result<bool> {
    let settings = Settings::from_args(&args)?;
    std::fs::create_dir_all(&args.out)?;
    let out = args.out.canonicalize()?;
    let needs_ring = settings.parts.iter().any(|p| {
        matches!(
            p,
            Part::Commit | Part::Failover | Part::Scale | Part::Backup | Part::Flood
        )
    });
    let bin_dir = if needs_ring {
        Some(find_bin_dir(args.bin_dir.clone())?)
    } else {
        None
    };
    garden_ring::tls::install_crypto_provider();
    // The load generator's threads are fixed (one per CPU), so that TOKIO_WORKER_THREADS set
    // for the ringd it starts does not change the clients too.
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus)
        .enable_all()
        .build()?;
    let scratch = tempfile::Builder::new()
        .prefix("ring-chaos-bench-")
        .tempdir()?;
    let started_unix_ms = garden_ring::time::unix_ms();
    let load_before = read_trimmed("/proc/loadavg");
    println!(
        "ring-chaos bench: {} on {} CPUs (load {load_before}){}",
        settings
            .parts
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", "),
        std::thread::available_parallelism().map_or(1, usize::from),
        bin_dir
            .as_ref()
            .map(|d| format!(", ringd from {}", d.display()))
            .unwrap_or_default()
    );
    let mut outcomes = Vec::new();
    let mut rows = Vec::new();
    let certs = scratch.path().join("pki");
    for &part in &settings.parts {
        println!("\n== {}", part.name());
        let began = Instant::now();
        let dir = scratch.path().join(part.name());
        std::fs::create_dir_all(&dir)?;
        let context = PartContext {
            settings: &settings,
            bin_dir: bin_dir.as_deref(),
            dir: &dir,
            certs: &certs,
            perf: args.perf.then(|| out.clone()),
        };
        let result = runtime.block_on(run_part(part, &context));
        let seconds = began.elapsed().as_secs_f64();
        let outcome = match result {
            Ok((report, part_rows, problems)) => {
                rows.extend(part_rows);
                PartOutcome {
                    part,
                    status: if problems.is_empty() {
                        Status::Ok
                    } else {
                        Status::Failed
                    },
                    seconds,
                    error: (!problems.is_empty()).then(|| problems.join("; ")),
                    report: Some(report),
                }
            }
            Err(e) => {
                let logs = out.join("logs").join(part.name());
                let _ = std::fs::remove_dir_all(&logs);
                keep_logs(&dir, &logs);
                eprintln!(
                    "{} FAILED: {e:#} (logs kept in {})",
                    part.name(),
                    logs.display()
                );
                PartOutcome {
                    part,
                    status: Status::Failed,
                    seconds,
                    error: Some(format!("{e:#}")),
                    report: None,
                }
            }
        };
        println!("== {} took {:.0} s", part.name(), seconds);
        let _ = std::fs::remove_dir_all(&dir);
        outcomes.push(outcome);
    }
    drop(runtime);
    let report = BenchReport {
        format: 1,
        started_unix_ms,
        machine: Machine {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            kernel: kernel(),
            load_before,
            load_after: read_trimmed("/proc/loadavg"),
        },
        settings,
        rows,
        parts: outcomes,
    };
    println!("\n{}\n", table(&report.rows));
    for p in &report.parts {
        println!(
            "{:<9} {:>5.0} s  {}",
            p.part.name(),
            p.seconds,
            match p.status {
                Status::Ok => "ok".to_string(),
                Status::Failed => format!("FAILED: {}", p.error.clone().unwrap_or_default()),
            }
        );
    }
    let path = out.join("bench.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("wrote {}", path.display());
    Ok(report.parts.iter().all(|p| p.status != Status::Failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn settings(argv: &[&str]) -> anyhow::Result<Settings> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))?;
        Settings::from_args(&cli.args)
    }

    #[test]
    fn defaults_quick_and_only() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.parts, Part::ALL.to_vec());
        assert_eq!(
            (s.seconds, s.warmup, s.trials, s.copy_mib),
            (10.0, 2.0, 5, 128)
        );
        assert_eq!(s.concurrency, vec![1, 16, 64]);
        assert_eq!(s.backup_mib, 1024);
        assert_eq!(settings(&["--quick"]).unwrap().backup_mib, 64);
        assert!(settings(&["--backup-mib", "8"]).is_err());
        let q = settings(&[
            "--quick", "--only", "copy", "--only", "commit", "--only", "copy",
        ])
        .unwrap();
        assert_eq!(q.parts, vec![Part::Commit, Part::Copy]);
        assert_eq!(
            (q.seconds, q.warmup, q.trials, q.copy_mib),
            (3.0, 1.0, 2, 32)
        );
        let o = settings(&["--quick", "--seconds", "7", "--trials", "9"]).unwrap();
        assert_eq!((o.seconds, o.trials), (7.0, 9));
        assert!(settings(&["--trials", "0"]).is_err());
        assert!(settings(&["--seconds", "0.1"]).is_err());
        assert!(settings(&["--copy-mib", "4"]).is_err());
        assert!(settings(&["--only", "nope"]).is_err());
        let c = settings(&["--clients", "16", "--clients", "1", "--clients", "16"]).unwrap();
        assert_eq!(c.concurrency, vec![1, 16]);
        assert!(settings(&["--clients", "0"]).is_err());
        assert!(settings(&["--clients", "1025"]).is_err());
    }

    #[test]
    fn ratios_and_goals() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
        let at_least = Goal::AtLeast { ratio: 1.0 };
        let at_most = Goal::AtMost { ratio: 1.0 };
        assert_eq!(at_least.met(Some(1.0)), Some(true));
        assert_eq!(at_least.met(Some(0.99)), Some(false));
        assert_eq!(at_most.met(Some(1.0)), Some(true));
        assert_eq!(at_most.met(Some(1.01)), Some(false));
        assert_eq!(at_most.met(None), None);
        assert_eq!(Goal::Info.met(Some(5.0)), None);
        assert_eq!(at_least.text(), ">= 1.00x");
        assert_eq!(at_most.text(), "<= 1.00x");

        let row = Row::new(
            Part::Commit,
            "throughput, 16 clients",
            "writes/s",
            Some(900.0),
            "etcd",
            Some(1000.0),
            at_least,
        );
        assert_eq!(row.ratio, Some(0.9));
        assert_eq!(row.met, Some(false));
        let p99 = Row::new(
            Part::Commit,
            "p99",
            "ms",
            Some(4.0),
            "etcd",
            Some(5.0),
            at_most,
        );
        assert_eq!(p99.met, Some(true));
    }

    fn point(clients: usize, per_second: f64, p50_us: u64, p99_us: u64) -> commit::Point {
        commit::Point {
            clients,
            summary: stats::LatencySummary {
                count: 10,
                per_second,
                p50_us,
                p99_us,
                max_us: p99_us,
                mean_us: p50_us,
            },
            errors: 0,
            first_error: None,
            server_cpu_s: 1.0,
            server_cpu_us_per_write: Some(100.0),
            client_cpu_s: 1.0,
        }
    }

    #[test]
    fn commit_rows_pair_the_systems_by_concurrency() {
        let report = commit::CommitReport {
            payload_bytes: 150,
            ring_write: "",
            etcd_write: "",
            etcd_version: "etcd Version: 3.4.23".into(),
            ring_timing: garden_ring::config::Timing::default(),
            seconds: 10.0,
            warmup_seconds: 2.0,
            etcd: vec![
                point(1, 100.0, 10_000, 20_000),
                point(16, 1_000.0, 16_000, 30_000),
            ],
            ring: vec![
                point(1, 120.0, 8_000, 20_000),
                point(16, 800.0, 20_000, 40_000),
            ],
            perf_data: None,
            etcd_idle_cpus: 0.01,
            ring_idle_cpus: 0.02,
        };
        let rows = commit_rows(&report);
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[0].measurement, "throughput, 1 client");
        assert_eq!(rows[0].ratio, Some(1.2));
        assert_eq!(rows[0].met, Some(true));
        assert_eq!(rows[2].measurement, "p99 latency, 1 client");
        assert_eq!(rows[2].ring, Some(20.0));
        assert_eq!(rows[2].met, Some(true));
        assert_eq!(rows[3].measurement, "server CPU per write, 1 client");
        assert_eq!(rows[3].met, None);
        assert_eq!(rows[4].ratio, Some(0.8));
        assert_eq!(rows[4].met, Some(false));
        assert_eq!(rows[5].met, None);
        assert_eq!(rows[6].met, Some(false));
    }

    #[test]
    fn the_table_has_a_line_per_row_and_aligned_columns() {
        let rows = vec![
            Row::new(
                Part::Commit,
                "throughput, 64 clients",
                "writes/s",
                Some(1234.5),
                "etcd",
                Some(1000.0),
                Goal::AtLeast { ratio: 1.0 },
            ),
            Row::new(
                Part::Failover,
                "kill -> judged lost p50 (n=5)",
                "ms",
                Some(2050.0),
                "member_lost_ms",
                Some(2000.0),
                Goal::Info,
            ),
        ];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("part"));
        assert!(
            lines[2].contains("1234") && lines[2].contains("1.23x") && lines[2].contains("yes")
        );
        assert!(lines[3].contains("1.02x") && lines[3].ends_with('-'));
        // The ratio column lines up.
        let at = |l: &str| l.find('x').unwrap();
        assert_eq!(at(lines[2]), at(lines[3]));
    }

    #[test]
    fn bench_json_has_its_shape() {
        let report = BenchReport {
            format: 1,
            started_unix_ms: 1,
            machine: Machine {
                cpus: 2,
                kernel: "Linux".into(),
                load_before: "0.1".into(),
                load_after: "0.2".into(),
            },
            settings: settings(&["--quick"]).unwrap(),
            rows: vec![Row::new(
                Part::Copy,
                "migration copy, 32 MiB",
                "MiB/s",
                Some(90.0),
                "raw object_store",
                Some(100.0),
                Goal::AtLeast { ratio: 0.9 },
            )],
            parts: vec![
                PartOutcome {
                    part: Part::Copy,
                    status: Status::Ok,
                    seconds: 3.0,
                    error: None,
                    report: Some(serde_json::json!({"ratio_ring_to_raw": 0.9})),
                },
                PartOutcome {
                    part: Part::Scale,
                    status: Status::Failed,
                    seconds: 0.0,
                    error: Some("ringd not found".into()),
                    report: None,
                },
            ],
        };
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["format"], 1);
        assert_eq!(v["machine"]["cpus"], 2);
        assert_eq!(v["settings"]["parts"][0], "commit");
        let row = &v["rows"][0];
        assert_eq!(row["part"], "copy");
        assert_eq!(row["unit"], "MiB/s");
        assert_eq!(row["ring"], 90.0);
        assert_eq!(row["baseline"], 100.0);
        assert_eq!(row["baseline_name"], "raw object_store");
        assert!((row["ratio"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(row["goal"]["kind"], "at_least");
        assert_eq!(row["goal"]["ratio"], 0.9);
        assert_eq!(row["met"], true);
        assert_eq!(v["parts"][0]["status"], "ok");
        assert_eq!(v["parts"][0]["report"]["ratio_ring_to_raw"], 0.9);
        assert_eq!(v["parts"][1]["status"], "failed");
        assert!(v["parts"][1].get("report").is_none());
        assert_eq!(v["parts"][1]["error"], "ringd not found");
    }
}

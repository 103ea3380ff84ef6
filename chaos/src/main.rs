//! `ring-chaos`: builds a ring of real `ringd` processes in network namespaces, one per zone,
//! breaks it the way zones break, and measures what clients see: time to detect and elect,
//! RTO (zone loss to a client's write acknowledged at the new host, through DNS), RPO
//! (acknowledged writes missing afterwards, and the data-loss window) and split brain (writes
//! acknowledged by an old host after the new one took over). See `chaos/README.md`.
//!
//! `ring-chaos bench` runs the benchmarks (commit path against etcd, failover time against the
//! lease, migration copy against a raw copy) on loopback, without namespaces or root.

mod bench;
mod client;
mod linearizability;
mod model;
mod netns;
mod registry;
mod report;
mod restarts;
mod scale;
mod scenario;
mod stale_disk;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use scenario::{RunOptions, SCENARIOS, Scenario};

/// Zone loss, partitions and outages of a garden-ring in network namespaces, measured; and
/// benchmarks on loopback (`bench`, no root).
///
/// `run` and `cleanup` need root (it creates network namespaces, named grchaos-*, and removes them at the end,
/// also after a failure or Ctrl-C; `ring-chaos cleanup` removes what a killed run left).
/// Needs `ip` (iproute2), BIND (`named`, `tsig-keygen`), `moto_server`, etcd, and ringd and
/// ring-guard built next to ring-chaos (`cargo build --bins`). Only addresses inside the
/// namespaces it creates (10.77.0.0/16) are used.
#[derive(Debug, Parser)]
#[command(name = "ring-chaos", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The scenario (see `ring-chaos list`); repeat for several.
    #[arg(long = "scenario", required_unless_present = "all")]
    scenarios: Vec<String>,
    /// Every scenario.
    #[arg(long, conflicts_with = "scenarios")]
    all: bool,
    /// Runs of each scenario.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Where the reports (and each run's logs) go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
    /// Directory with ringd and ring-guard (default: next to ring-chaos).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// rolling-upgrade: the previous release's ringd and ring-guard, which the members start
    /// on before they are upgraded to --bin-dir's one by one. Default: what
    /// scripts/previous-release.sh built (~/.cache/garden-ring/release-0.1.0-e0220b2/bin).
    #[arg(long)]
    from_bin_dir: Option<PathBuf>,
    /// A run whose RTO is above this fails, ms.
    #[arg(long, default_value_t = 15_000)]
    rto_budget_ms: u64,
    /// Control planes registered (spread over the zones).
    #[arg(long, default_value_t = 3)]
    control_planes: usize,
    /// The control planes' tolerance: `none` (one etcd each, restored from its backups after
    /// a zone loss) or `zone` (one etcd member per zone; every scenario then must lose no
    /// acknowledged write). Runs are reported as `<scenario> (tolerance zone)`.
    #[arg(long, default_value = "none", value_parser = ["none", "zone"])]
    tolerance: String,
    /// Zones, one member each: 3 to 5 (with --tolerance zone the spare zones take the lost
    /// zone's etcd members after 3 s: the run then also waits for every etcd cluster to be
    /// whole again and reports the time).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(3..=5))]
    zones: u16,
    /// The ring's timings: `loopback` (lease 1 s, member lost after 2 s: fast runs, what CI
    /// uses), `tight` (lease 2 s, fence 1 s, member lost after 4 s) or `production` (the
    /// defaults an operator gets: lease 4 s, fence 2 s, member lost after 8 s). Runs are
    /// reported as `<scenario> (production)` or `(tight)` with the latter two.
    #[arg(long, default_value = "loopback", value_parser = world::TIMING_PROFILES)]
    timings: String,
    /// lossy-link: the loss rates the victim zone's links go through in turn, percent of the
    /// packets dropped each way (comma-separated). Default: what the timings hold, as
    /// measured (chaos/results/lossy-link.md): 10,30 at `loopback` and `tight` (50% there
    /// refuses writes for longer than the lease), 10,30,50 at `production`.
    #[arg(long, value_delimiter = ',',
          value_parser = clap::value_parser!(u8).range(1..=100))]
    loss_percent: Vec<u8>,
    /// lossy-link: how long each loss rate lasts, s.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    loss_secs: u64,
    /// lossy-link: the longest a client may wait for an acknowledgement in any phase, ms
    /// (default: one lease). At loopback timings a lease is shorter than the restart of an
    /// etcd its host fenced during a cut, so CI allows more there (chaos/README.md).
    #[arg(long)]
    max_wait_ms: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run scenarios and write runs.json, report.md and a timeline SVG per run.
    Run(RunArgs),
    /// List the scenarios.
    List,
    /// Remove namespaces an earlier, killed run left behind.
    Cleanup,
    /// Benchmarks on loopback (no root): the commit path against etcd, failover time against
    /// the lease, the migration copy against a raw copy; prints a table, writes bench.json.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::List => {
            for s in SCENARIOS {
                println!("{:<20} {}", s.name, s.description);
            }
            ExitCode::SUCCESS
        }
        Cmd::Cleanup => {
            if let Err(e) = need_root() {
                eprintln!("ring-chaos: {e}");
                return ExitCode::from(2);
            }
            let removed = netns::cleanup();
            println!("removed {} namespaces {}", removed.len(), removed.join(" "));
            ExitCode::SUCCESS
        }
        Cmd::Bench(args) => match bench::main(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("ring-chaos bench: {e:#}");
                ExitCode::from(2)
            }
        },
        Cmd::Run(args) => match run(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("ring-chaos: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn need_root() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "needs root: it creates network namespaces (run it with sudo, or as root in a VM or container with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        );
    }
    Ok(())
}

fn run(args: RunArgs) -> anyhow::Result<bool> {
    let RunArgs {
        scenarios: names,
        all,
        runs,
        out,
        bin_dir,
        from_bin_dir,
        rto_budget_ms,
        control_planes,
        tolerance,
        zones,
        timings,
        loss_percent,
        loss_secs,
        max_wait_ms,
    } = args;
    let timing = world::timing_profile(&timings);
    let from_bin_dir = from_bin_dir.or_else(scenario::previous_release_dir);
    let chosen: Vec<Scenario> = if all {
        SCENARIOS.to_vec()
    } else {
        names
            .iter()
            .map(|n| {
                SCENARIOS
                    .iter()
                    .find(|s| s.name == n)
                    .copied()
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "unknown scenario {n:?}; known: {}",
                            SCENARIOS
                                .iter()
                                .map(|s| s.name)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
            })
            .collect::<Result<_, _>>()?
    };
    if runs == 0 || runs > 1_000 {
        anyhow::bail!("--runs must be 1 to 1000");
    }
    if !(3..=9).contains(&control_planes) {
        anyhow::bail!(
            "--control-planes must be 3 to 9 (one endpoint port each, spread over 3 zones)"
        );
    }
    need_root()?;
    let ring_dir = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default(),
    };
    let etcd_dir = garden_ring::demo::find_etcd().ok_or_else(|| {
        anyhow::anyhow!("no etcd with etcdctl or etcdutl on PATH (Debian: apt-get install etcd-server etcd-client)")
    })?;
    let binaries = world::Binaries {
        ring_dir,
        etcd_dir,
        faketime: None,
        start_from: None,
    };
    world::check_tools(&binaries)?;
    let leftovers = netns::cleanup();
    if !leftovers.is_empty() {
        eprintln!(
            "removed namespaces an earlier run left: {}",
            leftovers.join(" ")
        );
    }
    garden_ring::tls::install_crypto_provider();
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize()?;

    let mut results = Vec::new();
    'scenarios: for scenario in &chosen {
        if scenario.fault == scenario::Fault::RollingUpgrade && from_bin_dir.is_none() {
            let why = "rolling-upgrade needs the previous release's binaries: build them with \
                       scripts/previous-release.sh, or name them with --from-bin-dir";
            if all {
                eprintln!("skipped: {why}");
                continue;
            }
            anyhow::bail!("{why}");
        }
        for number in 1..=runs {
            let options = RunOptions {
                binaries: world::Binaries {
                    start_from: (scenario.fault == scenario::Fault::RollingUpgrade)
                        .then(|| from_bin_dir.clone())
                        .flatten(),
                    ..binaries.clone()
                },
                dir: out.join("runs").join(format!("{}-{number}", scenario.name)),
                zones: ["zone-a", "zone-b", "zone-c", "zone-d", "zone-e"][..usize::from(zones)]
                    .iter()
                    .map(|z| z.to_string())
                    .collect(),
                control_planes,
                rto_budget_ms,
                zone_tolerant: tolerance == "zone",
                timing: timing.clone(),
                loss_percents: if loss_percent.is_empty() {
                    world::lossy_link_loss_percents(&timings).to_vec()
                } else {
                    loss_percent.clone()
                },
                loss_ms: loss_secs * 1_000,
                max_wait_ms: max_wait_ms.unwrap_or(timing.lease_ms),
            };
            let _ = std::fs::remove_dir_all(&options.dir);
            let scenario = *scenario;
            // A thread per run: it enters the run's client namespace, and so does every thread
            // of the runtime it starts; the main thread stays where it was.
            let outcome = std::thread::spawn(move || -> anyhow::Result<Option<model::Run>> {
                let topology = netns::Topology::create(&options.zones)?;
                netns::enter(&netns::namespace("client"))?;
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                let result = runtime.block_on(async {
                    tokio::select! {
                        run = scenario::run_once(&scenario, number, &options, &topology) => run.map(Some),
                        _ = tokio::signal::ctrl_c() => Ok(None),
                    }
                });
                drop(runtime);
                drop(topology);
                result
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the run panicked"))??;
            let Some(run) = outcome else {
                eprintln!("interrupted; the namespaces were removed");
                break 'scenarios;
            };
            println!(
                "{} #{number}: {} (rto {} ms, detect {} ms, lost {}, split brain {}, window {} ms{}{}{})",
                run.scenario,
                if run.passed() { "passed" } else { "FAILED" },
                show(run.measures.rto_ms),
                show(run.measures.detect_ms),
                run.measures.lost_writes,
                run.measures.split_brain_writes,
                show(run.measures.data_loss_window_ms),
                run.measures
                    .etcd_repair_ms
                    .map(|ms| format!(", etcd clusters whole again after {ms} ms"))
                    .unwrap_or_default(),
                run.measures
                    .etcd_restarts
                    .map(|n| format!(
                        ", {n} etcds restarted, longest write wait {} ms",
                        run.clients.iter().map(|c| c.longest_gap_ms).max().unwrap_or(0)
                    ))
                    .unwrap_or_default(),
                run.measures
                    .registry
                    .as_ref()
                    .map(|r| format!(
                        ", {} Admin operations checked for linearizability ({} stale reads not checked)",
                        r.ops_checked, r.stale_reads
                    ))
                    .unwrap_or_default(),
            );
            for f in &run.failures {
                println!("    {f}");
            }
            results.push(run);
        }
    }
    let reports = report::write_reports(&out, &results)?;
    println!(
        "\n{}",
        report::markdown_summary(&report::summarize(&results))
    );
    println!(
        "wrote {}, {} and {} timelines",
        reports.json.display(),
        reports.markdown.display(),
        reports.svgs.len()
    );
    Ok(!results.is_empty() && results.iter().all(model::Run::passed))
}

fn show(value: Option<u64>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

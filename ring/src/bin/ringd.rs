//! `ringd`: one member of a garden-ring.
//!
//! Reads a TOML config (`--config FILE`), opens its data directory, joins or forms the Raft
//! ring, and serves the peer and Admin gRPC APIs until SIGTERM or SIGINT.
//!
//! `ringd recover --config FILE` is the disaster recovery of the ring itself (a majority of
//! members lost for good): offline, it rewrites this member's data directory into a one-member
//! ring (see `garden_ring::recovery`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use garden_ring::config::{Config, LogFormat};
use garden_ring::node::Member;

/// One member of a garden-ring: a Raft peer that records which member hosts which control
/// plane, and serves the Admin API that `ringctl` talks to.
///
/// Every setting lives in the TOML file given with --config (see deploy/examples/ringd.toml for
/// the documented fields). The flags below override the file. On first start a member with
/// `initial_members` forms the ring with the other founders; a member without them waits to be
/// added with `ringctl member add`.
///
/// When a majority of the members is lost for good, `ringd recover` restarts the ring from this
/// member's data alone (see `ringd recover --help`).
#[derive(Debug, Parser)]
#[command(
    name = "ringd",
    version = garden_ring::version::LONG,
    about,
    long_about,
    subcommand_negates_reqs = true,
    after_help = "Exit status: 0 after SIGTERM/SIGINT, 1 on a start-up error, 3 when this member was removed from the ring."
)]
struct Args {
    #[command(subcommand)]
    command: Option<Sub>,
    /// The TOML configuration file.
    #[arg(
        long,
        short = 'c',
        env = "RINGD_CONFIG",
        value_name = "FILE",
        required = true
    )]
    config: Option<PathBuf>,
    /// Check the configuration (and print it with defaults filled in), then exit.
    #[arg(long)]
    check_config: bool,
    /// Override `id`.
    #[arg(long)]
    id: Option<u64>,
    /// Override `name`.
    #[arg(long)]
    name: Option<String>,
    /// Override `zone`.
    #[arg(long)]
    zone: Option<String>,
    /// Override `data_dir`.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Override `listen_peer` (the Raft peer service).
    #[arg(long, value_name = "ADDR")]
    listen_peer: Option<SocketAddr>,
    /// Override `listen_admin` (the Admin service).
    #[arg(long, value_name = "ADDR")]
    listen_admin: Option<SocketAddr>,
    /// Override `log.level` (a tracing filter such as `info` or `debug,openraft=info`).
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Override `log.format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Disaster recovery: restart the ring from this member's data alone, when a majority of
    /// the members is lost for good (like etcd's --force-new-cluster).
    ///
    /// Offline: ringd must not be running on this data directory. The ring's state is rebuilt
    /// as of the LAST entry in this member's log: entries it has but did not know to be
    /// committed are kept and become committed; entries only the lost members had are lost.
    /// Every other member is removed for good (ids retired); control planes hosted on them
    /// are placed again once their leases have certainly run out (lease + fence + clock margin
    /// after the recovered ring elects its leader); this member's control planes keep their
    /// host and epoch; the history is kept, plus a `ring.recover` event.
    ///
    /// It shows what will happen and asks you to type this member's name (or pass --yes).
    /// The current data stays as it is under <data_dir>/ring.redb.before-recover-<unix ms>
    /// (a hard link, made once the new data is written).
    /// Then start the member as usual (`ringd --config FILE`): it elects itself. Add fresh
    /// members with `ringctl member add` under NEW ids, and never start the lost members again
    /// with their old data.
    #[command(
        after_help = "Exit status: 0 when recovered, 1 when it did not recover (one line on stderr says why): ring.redb is then the data as it was."
    )]
    Recover(RecoverArgs),
}

#[derive(Debug, clap::Args)]
struct RecoverArgs {
    /// The member's TOML configuration file (the same one `ringd --config` uses).
    #[arg(long, short = 'c', env = "RINGD_CONFIG", value_name = "FILE")]
    config: PathBuf,
    /// Override `data_dir`.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Do not ask for confirmation (for scripts).
    #[arg(long)]
    yes: bool,
    /// Why (recorded in history with the recovery).
    #[arg(long, default_value = "")]
    reason: String,
}

/// Exit status when the member finds it was removed from the ring (do not restart it as is).
const EXIT_REMOVED: u8 = 3;

fn load(args: &Args, path: &std::path::Path) -> Result<Config, garden_ring::config::ConfigError> {
    let mut config = Config::load(path)?;
    if let Some(v) = args.id {
        config.id = v;
    }
    if let Some(v) = &args.name {
        config.name = v.clone();
    }
    if let Some(v) = &args.zone {
        config.zone = v.clone();
    }
    if let Some(v) = &args.data_dir {
        config.data_dir = v.clone();
    }
    if let Some(v) = args.listen_peer {
        config.listen_peer = v;
    }
    if let Some(v) = args.listen_admin {
        config.listen_admin = v;
    }
    if let Some(v) = &args.log_level {
        config.log.level = v.clone();
    }
    if let Some(v) = args.log_format {
        config.log.format = v;
    }
    config.validate()?;
    Ok(config)
}

/// `ringd recover`: see [`Sub::Recover`] and `garden_ring::recovery`.
fn recover(args: RecoverArgs) -> ExitCode {
    use garden_ring::recovery::{self, RecoverError, Request};
    let run = || -> Result<String, String> {
        let mut config = Config::load(&args.config).map_err(|e| e.to_string())?;
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        config.validate().map_err(|e| e.to_string())?;
        let request = Request {
            actor: recovery::local_actor("ringd-recover"),
            reason: args.reason.clone(),
            at_ms: garden_ring::time::unix_ms(),
        };
        let (db, plan) = recovery::plan_recover(&config, &request).map_err(|e| match e {
            RecoverError::Storage(garden_ring::raft::storage::OpenError::InUse(dir)) => format!(
                "data directory {} is in use by another process: stop this member's ringd first (ringd recover works offline); nothing was changed",
                dir.display()
            ),
            e => format!("{e}; nothing was changed"),
        })?;
        if args.yes {
            println!("{}", plan.describe(&config.timing));
        } else {
            plan.confirm(
                &config.timing,
                &mut std::io::stdin().lock(),
                &mut std::io::stdout(),
            )
            .map_err(|e| e.to_string())?;
            println!();
        }
        let (backup, backup_wal) = recovery::apply_recover(db, &plan, request.at_ms)
            .map_err(|e| format!("recovery failed: {e}"))?;
        let kept = match backup_wal {
            Some(wal) => format!("{} with {}", backup.display(), wal.display()),
            None => backup.display().to_string(),
        };
        let at = plan
            .start
            .applied
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0);
        Ok(format!(
            "recovered: {} (id {}) is now a one-member ring at log index {at}; the previous data is kept as {kept}.\n\
             Next: start it with `ringd --config {}`, then add fresh members with `ringctl member add` (new ids).",
            plan.survivor.name,
            plan.survivor.id,
            args.config.display()
        ))
    };
    match run() {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringd recover: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // First, while this is the only thread (see the module's measurements).
    let malloc_settings = garden_ring::allocator::tune();
    let mut args = garden_ring::cli::parse_or_exit::<Args>("ringd");
    garden_ring::tls::install_crypto_provider();
    if let Some(Sub::Recover(recover_args)) = args.command.take() {
        return recover(recover_args);
    }
    let path = args
        .config
        .clone()
        .expect("clap requires --config without a subcommand");
    let config = match load(&args, &path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringd: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.check_config {
        // The certificates too: a key that does not match, or a certificate of another
        // member, is better found now than at start.
        if let Some(tls) = &config.tls {
            let me = garden_ring::tls::Identity::new(garden_ring::tls::Role::Member, &config.name);
            if let Err(e) = me.map_err(|e| e.to_string()).and_then(|me| {
                garden_ring::tls::material::Material::load(&tls.files, Some(&me))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }) {
                eprintln!("ringd: error: TLS: {e}");
                return ExitCode::FAILURE;
            }
        }
        // The TSIG key of the rfc2136 provider too.
        if let Err(e) = garden_ring::dns::publisher(&config.dns) {
            eprintln!("ringd: error: dns.rfc2136: {e}");
            return ExitCode::FAILURE;
        }
        println!("{}", config.to_toml());
        for warning in config.timing.warnings() {
            eprintln!("ringd: warning: {warning}");
        }
        eprintln!("ringd: config {} is valid", path.display());
        return ExitCode::SUCCESS;
    }
    garden_ring::logging::init(&config.log, &config.name);
    let timing_warnings = config.timing.warnings();
    // Long enough for one leadership transfer: the longest election timeout, twice.
    let step_down_ms = config.timing.election_timeout_max_ms.saturating_mul(2);
    if !malloc_settings.is_empty() {
        tracing::debug!("malloc: {}", malloc_settings.join(", "));
    }
    if garden_ring::allocator::start_trimming() {
        tracing::debug!(
            "malloc: free heap pages go back every {:?}",
            garden_ring::allocator::TRIM_EVERY
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ringd: error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let member = match Member::start(config).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("ringd: error: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Once started: a refused start says one thing only.
        for warning in timing_warnings {
            tracing::warn!("{warning}");
        }
        let code = tokio::select! {
            signal = wait_for_signal() => {
                tracing::info!("received {signal}, shutting down");
                ExitCode::SUCCESS
            }
            message = member.removed() => {
                tracing::error!("stopping: a peer reports this member was removed: {message}");
                eprintln!("ringd: error: this member was removed from the ring: {message}");
                ExitCode::from(EXIT_REMOVED)
            }
        };
        // A member leaving on a signal hands its leadership over first (its last renewal then
        // announces the restart to the new leader); one removed leads nothing.
        if code == ExitCode::SUCCESS {
            garden_ring::upgrade::step_down(&member.raft, step_down_ms).await;
        }
        member.shutdown().await;
        tracing::info!("stopped");
        code
    })
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

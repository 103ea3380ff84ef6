//! `ringd`: one member of a garden-ring.
//!
//! Reads a TOML config (`--config FILE`), opens its data directory, joins or forms the Raft
//! ring, and serves the peer and Admin gRPC APIs until SIGTERM or SIGINT.

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
#[derive(Debug, Parser)]
#[command(
    name = "ringd",
    version,
    about,
    long_about,
    after_help = "Exit status: 0 after SIGTERM/SIGINT, 1 on a start-up error, 3 when this member was removed from the ring."
)]
struct Args {
    /// The TOML configuration file.
    #[arg(long, short = 'c', env = "RINGD_CONFIG", value_name = "FILE")]
    config: PathBuf,
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

/// Exit status when the member finds it was removed from the ring (do not restart it as is).
const EXIT_REMOVED: u8 = 3;

fn load(args: &Args) -> Result<Config, garden_ring::config::ConfigError> {
    let mut config = Config::load(&args.config)?;
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

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::new(&config.log.level);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().with_current_span(false).init(),
    }
}

fn main() -> ExitCode {
    let args = garden_ring::cli::parse_or_exit::<Args>("ringd");
    garden_ring::tls::install_crypto_provider();
    let config = match load(&args) {
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
        eprintln!("ringd: config {} is valid", args.config.display());
        return ExitCode::SUCCESS;
    }
    init_logging(&config);
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
        let span = tracing::info_span!("ringd", member = %config.name, id = config.id);
        let _enter = span.enter();
        let member = match Member::start(config).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("ringd: error: {e}");
                return ExitCode::FAILURE;
            }
        };
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

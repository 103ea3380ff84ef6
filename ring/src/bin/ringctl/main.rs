//! `ringctl`: the operator's command line for a garden-ring.

mod output;
mod snapshot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use garden_ring::admin::{AdminClient, ClientError};
use garden_ring::client_config::ClientConfig;
use garden_ring::demo::{Demo, DemoOptions};
use garden_ring::pb;
use garden_ring::tls::{Identity, Role, Security};
use serde::Serialize;

/// Operate a garden-ring: inspect it, add and remove members and control planes, read its
/// history, move its leadership, back up and restore its own state, or start a local demo
/// ring.
///
/// Commands talk to the Admin API of any member over mutual TLS; writes are forwarded to the
/// leader. Where the ring is and which certificate to present come from a client config file
/// (--config or RINGCTL_CONFIG, like a kubeconfig; `ringctl demo` writes one), and flags
/// override it. Make certificates with `ringctl certs init`. Every read command takes
/// --output json for scripts. On error ringctl prints one line to stderr and exits non-zero.
///
/// Disaster recovery: `ringctl snapshot save FILE` backs up the ring's state; when the whole
/// ring is lost, `ringctl snapshot restore FILE --ringd-config RINGD.toml` makes a new data
/// directory for a one-member ring from it. When a majority is lost but one member's data
/// survives, use `ringd recover` on that member instead.
#[derive(Debug, Parser)]
#[command(name = "ringctl", version = garden_ring::version::LONG, about, long_about)]
struct Cli {
    /// Client config file: endpoints, ca_file, cert_file, key_file (or insecure = true).
    #[arg(long, short = 'c', global = true, env = "RINGCTL_CONFIG")]
    config: Option<PathBuf>,
    /// Admin endpoints (host:port), comma-separated or repeated; tried in order until one
    /// answers. Default: the config file's, else 127.0.0.1:7400.
    #[arg(
        long,
        short = 'e',
        global = true,
        value_delimiter = ',',
        env = "RINGCTL_ENDPOINTS"
    )]
    endpoint: Vec<String>,
    /// CA bundle that issued the members' certificates.
    #[arg(long, global = true)]
    ca_file: Option<PathBuf>,
    /// Client certificate (admin or viewer).
    #[arg(long, global = true, requires_all = ["ca_file", "key_file"])]
    cert_file: Option<PathBuf>,
    /// Private key of --cert-file.
    #[arg(long, global = true, requires_all = ["ca_file", "cert_file"])]
    key_file: Option<PathBuf>,
    /// Talk to a ring that runs without TLS (insecure = true in its ringd.toml).
    #[arg(long, global = true, conflicts_with_all = ["ca_file", "cert_file", "key_file"])]
    insecure: bool,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Seconds a request may take.
    #[arg(long, global = true, default_value_t = 60)]
    timeout: u64,
    /// Reads (status, member list, cp list, cp get, history): answer from the member asked,
    /// without confirming with the leader. Faster, and works on a member cut off from the
    /// quorum, but may miss recent writes; the answer says how stale it may be. By default
    /// reads are linearizable (they see every write acknowledged before them), and a member
    /// that cannot reach the leader in time answers stale and says so.
    #[arg(long, global = true)]
    stale: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for programs.
    Json,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Leader, term, members and control planes, as seen by the member that answers.
    Status,
    /// Ring members.
    #[command(subcommand)]
    Member(MemberCmd),
    /// Control planes.
    #[command(subcommand, name = "control-plane", alias = "cp")]
    ControlPlane(CpCmd),
    /// Who did what, when and why (newest last).
    History {
        /// Show only the newest N events (0 = all kept).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Raft leadership.
    #[command(subcommand)]
    Leader(LeaderCmd),
    /// DNS records.
    #[command(subcommand)]
    Dns(DnsCmd),
    /// Planned move of a control plane to another member: its host stops it first (or its
    /// lease runs out), then the new host starts it at the next epoch. The host must be healthy.
    Switchover(MoveArgs),
    /// Forced move of a control plane, also off an unhealthy or unreachable host. Still safe:
    /// the new host waits until the old one released it or its lease ran out.
    Failover(MoveArgs),
    /// Maintenance mode: detect and report, never move control planes automatically
    /// (operator commands keep working).
    Pause {
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Resume the ring's automatic actions.
    Resume {
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Run a local ring of child ringd processes on loopback (no external services needed).
    /// It makes a CA and certificates in DIR/certs and writes DIR/ringctl.toml; with
    /// --insecure the ring runs without TLS.
    Demo(DemoArgs),
    /// Make a CA and certificates for a ring (offline; no ring needed).
    #[command(subcommand)]
    Certs(CertsCmd),
    /// Back up and restore the ring's own state: members, control planes with their hosts and
    /// epochs, settings and history.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// Rolling upgrades: the ring's version, each member's binary, hold and finalize.
    ///
    /// Members of adjacent releases run together. The ring runs at the newest *ring version*
    /// every member supports only once it is raised, which the leader does by itself as soon
    /// as every member runs a binary that supports it (unless held). Until then any member
    /// can go back to the previous release's binary; after it, older binaries cannot rejoin.
    /// See deploy/README.md, "Upgrade, one member at a time".
    #[command(subcommand)]
    Upgrade(UpgradeCmd),
}

#[derive(Debug, Subcommand)]
enum UpgradeCmd {
    /// The ring's version, whether it is mixed, what it can be raised to, and each member's
    /// binary.
    Status,
    /// Hold the ring at its version: the leader raises it only on `ringctl upgrade finalize`,
    /// so a rollback stays possible. Needs ring version 2 or newer; for an upgrade from
    /// release 0.1.0 set `[upgrade] finalize = "manual"` on the upgraded members instead.
    Hold {
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Release a hold: the leader raises the version by itself again.
    Release {
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Raise the ring's version by one now (held or not). Refused while some member runs a
    /// binary without it. After it, binaries of older releases cannot rejoin: no rollback.
    Finalize {
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum CertsCmd {
    /// Create a new CA in DIR (ca.pem, ca-key.pem) and certificates for the given members and
    /// operators. Keep ca-key.pem offline once the ring is set up.
    Init {
        /// Directory for the files (created).
        #[arg(long)]
        dir: PathBuf,
        /// Member names to issue certificates for (comma-separated or repeated).
        #[arg(long = "member", value_delimiter = ',')]
        members: Vec<String>,
        /// Operator names to issue admin certificates for.
        #[arg(long = "admin", value_delimiter = ',')]
        admins: Vec<String>,
        /// Names to issue viewer (read-only) certificates for.
        #[arg(long = "viewer", value_delimiter = ',')]
        viewers: Vec<String>,
        /// Extra host names or IP addresses for the member certificates. garden-ring itself
        /// checks identities, not host names; the etcd members of zone-tolerant control planes
        /// do check them: name the host of every member's --etcd-peer-on address here.
        #[arg(long = "san", value_delimiter = ',')]
        sans: Vec<String>,
        /// Validity of the CA, in days.
        #[arg(long, default_value_t = garden_ring::tls::certs::DEFAULT_CA_DAYS)]
        ca_days: u32,
        /// Validity of the other certificates, in days.
        #[arg(long, default_value_t = garden_ring::tls::certs::DEFAULT_CERT_DAYS)]
        days: u32,
        /// Replace an existing CA (every certificate of the old one stops working).
        #[arg(long)]
        force: bool,
    },
    /// Issue one certificate with the CA in DIR: for a new member, a new operator, or to rotate
    /// an expiring one (with --force; ringd loads a replaced certificate without a restart).
    Issue {
        /// Directory holding ca.pem and ca-key.pem.
        #[arg(long)]
        dir: PathBuf,
        /// member, admin or viewer.
        #[arg(long)]
        role: String,
        /// Member or operator name (DNS-1123 label).
        #[arg(long)]
        name: String,
        /// Extra host names or IP addresses (for a member: the host of its --etcd-peer-on
        /// addresses, which the etcd members of zone-tolerant control planes check).
        #[arg(long = "san", value_delimiter = ',')]
        sans: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = garden_ring::tls::certs::DEFAULT_CERT_DAYS)]
        days: u32,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Revoke a certificate (admin only): committed into the ring's state, so every member
    /// refuses it on both ports within about a second (UNAUTHENTICATED, saying when and by
    /// whom) and closes the connections that presented it. A revoked member certificate takes
    /// no part in Raft any more: issue the member a new one (`certs issue --force`). Survives
    /// restarts, `ringd recover` and snapshot restores.
    Revoke {
        #[command(flatten)]
        which: WhichCert,
        /// Why (required; whoever presents the certificate reads it).
        #[arg(long)]
        reason: String,
    },
    /// Take a revocation back (admin only): the certificate is accepted again while valid.
    Unrevoke {
        #[command(flatten)]
        which: WhichCert,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// List the certificates the ring revokes.
    ListRevoked,
    /// Write a certificate revocation list signed by the CA in DIR (for `[tls] crl_file`, or
    /// etcd's --client-crl-file). The ring's own revocations (`certs revoke`) need no file.
    Crl {
        /// Directory holding ca.pem and ca-key.pem.
        #[arg(long)]
        dir: PathBuf,
        /// Serial numbers (hex) to list (comma-separated or repeated; none: an empty CRL).
        #[arg(long = "serial", value_delimiter = ',')]
        serials: Vec<String>,
        /// Validity (next update) in days.
        #[arg(long, default_value_t = 30)]
        days: u32,
        /// The file to write (PEM).
        #[arg(long)]
        out: PathBuf,
    },
    /// List the certificates in DIR (`*.pem`, `*.crt`; keys are skipped) with the end of their
    /// validity, soonest first. Exits with status 1 when one has expired or expires within
    /// --warn-days (for cron jobs and CI checks).
    Check {
        /// Directory holding the certificates.
        dir: PathBuf,
        /// Warn (and exit 1) for certificates with fewer days left.
        #[arg(long, default_value_t = output::EXPIRY_WARNING_DAYS)]
        warn_days: u64,
    },
}

/// The certificate a revocation is about.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct WhichCert {
    /// The certificate file (PEM): its issuer, serial and identity are read from it.
    #[arg(long = "cert")]
    cert: Option<PathBuf>,
    /// Its serial number in hex (as `openssl x509 -noout -serial` prints it); the issuer is
    /// the ring's CA.
    #[arg(long)]
    serial: Option<String>,
}

impl WhichCert {
    /// (issuer or empty for the ring's CA, serial, subject).
    fn key(&self) -> Result<(String, String, String), Failure> {
        match (&self.cert, &self.serial) {
            (Some(path), _) => garden_ring::tls::revocation::cert_file_key(path)
                .map_err(|e| Failure(e.to_string())),
            (None, Some(serial)) => Ok((String::new(), serial.clone(), String::new())),
            (None, None) => Err(Failure("give --cert FILE or --serial HEX".into())),
        }
    }
}

#[derive(Debug, Subcommand)]
enum MemberCmd {
    /// List members.
    List,
    /// Register a member and add it as a Raft learner; waits for it to catch up. Start its ringd
    /// (without initial_members) first, then promote it with `member promote`.
    Add {
        /// Raft node id: new, never used in this ring before.
        #[arg(long)]
        id: u64,
        /// Member name (DNS-1123 label).
        #[arg(long)]
        name: String,
        /// Failure zone (DNS-1123 label).
        #[arg(long)]
        zone: String,
        /// Peer (Raft) address, host:port.
        #[arg(long)]
        address: String,
        /// Admin API address, host:port.
        #[arg(long)]
        admin_address: String,
        /// Seconds to wait for the learner to catch up.
        #[arg(long, default_value_t = 30)]
        catch_up_timeout: u64,
        /// Also promote it to voter once it caught up.
        #[arg(long)]
        promote: bool,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Make a learner a voter.
    Promote {
        /// Member id or name.
        member: String,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Cordon a member: it gets no new control planes (it keeps the ones it has).
    Cordon {
        /// Member id or name.
        member: String,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Uncordon a member.
    Uncordon {
        /// Member id or name.
        member: String,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Set a member's labels (replacing its old ones; none removes them). Control planes can
    /// prefer labelled members: `cp add --prefer tier=gold`.
    Label {
        /// Member id or name.
        member: String,
        /// KEY=VALUE pairs.
        labels: Vec<String>,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Cordon a member and move every control plane off it (planned, one after the other).
    Drain {
        /// Member id or name.
        member: String,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Remove a member from the ring; its id is retired for good.
    Remove {
        /// Member id or name.
        member: String,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum CpCmd {
    /// List control planes.
    List,
    /// Show one control plane.
    Get {
        /// Control plane name.
        name: String,
    },
    /// Register a control plane; without --host the leader places it.
    Add {
        /// Control plane name (DNS-1123 label).
        name: String,
        /// DNS name clients use.
        #[arg(long)]
        dns_name: String,
        /// Endpoint on a member, MEMBER=HOST:PORT; repeat for each member that can host it.
        #[arg(long = "endpoint-on", value_name = "MEMBER=HOST:PORT", required = true)]
        endpoints: Vec<String>,
        /// Backup location: s3://bucket/prefix, gs://, az://, file:///path.
        #[arg(long)]
        backup: String,
        /// Backup location when hosted on a member, MEMBER=URL (each zone's own bucket); repeat
        /// per member. Members not named use --backup. A move copies the backups from the old
        /// host's location to the new host's.
        #[arg(long = "backup-on", value_name = "MEMBER=URL")]
        backups: Vec<String>,
        /// Member it belongs to; it is never hosted there.
        #[arg(long)]
        home: Option<String>,
        /// Member to host it (default: the leader chooses).
        #[arg(long)]
        host: Option<String>,
        /// Preferred hosts, most preferred first (comma-separated or repeated): member names, or
        /// KEY=VALUE for members with that label. Placement takes the first eligible match
        /// before spreading by load.
        #[arg(long, value_delimiter = ',')]
        prefer: Vec<String>,
        /// What failure its etcd survives without losing an acknowledged write. `none`: one
        /// etcd on the host; a lost host's control plane is restored elsewhere from its backups
        /// (loses about one delta period). `zone`: one etcd member on each of three members in
        /// distinct zones (needs --etcd-peer-on on at least three); a lost zone loses nothing
        /// and the host moves to a surviving member without a restore, at the cost of three
        /// etcds and a cross-zone round trip on every write.
        #[arg(long, default_value = "none", value_parser = ["none", "zone"])]
        tolerance: String,
        /// With --tolerance zone: where the etcd member on a member listens for its peers,
        /// MEMBER=HOST:PORT (reachable from the other zones); repeat per member. Each member
        /// named needs an --endpoint-on too (any of them may become the host).
        #[arg(long = "etcd-peer-on", value_name = "MEMBER=HOST:PORT")]
        etcd_peers: Vec<String>,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Set a control plane's labels (replacing its old ones; none removes them): notes for
    /// operators (owner, tier); nothing in the ring acts on them.
    Label {
        /// Control plane name.
        name: String,
        /// KEY=VALUE pairs.
        labels: Vec<String>,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Deregister a control plane.
    Remove {
        /// Control plane name.
        name: String,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Recover a zone-tolerant control plane whose etcd cluster lost its quorum (`cp get`
    /// shows `etcd: no-quorum`). The ring never does this by itself. With --from-member the
    /// cluster restarts from one surviving member's data alone (etcd --force-new-cluster), so
    /// writes the cluster acknowledged that this member had not received are lost (usually
    /// the last few, or none). With --from-backup (when that member's data is lost or
    /// suspect) it starts on a new data directory restored from the newest full and delta
    /// snapshots, so writes after the newest delta are lost (about one delta period). Either
    /// way it then grows back to three members on spares. Only on the control plane's host (a
    /// lost host's control plane moves to a surviving etcd member by itself). Try --dry-run
    /// first.
    Recover {
        /// Control plane name.
        name: String,
        /// The surviving member (the host) whose etcd data the cluster restarts from; with
        /// --from-backup, the member it is restored on (default: the host).
        #[arg(long = "from-member", value_name = "MEMBER", default_value = "")]
        from_member: String,
        /// Restore from the newest backups instead of the member's data.
        #[arg(long = "from-backup")]
        from_backup: bool,
        /// Only check, and say what would happen and what would be lost.
        #[arg(long)]
        dry_run: bool,
        /// Why (recorded in history).
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, clap::Args)]
struct MoveArgs {
    /// The control plane.
    control_plane: String,
    /// The new host (default: placement chooses).
    #[arg(long)]
    to: Option<String>,
    /// Print the plan and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Why (recorded in history).
    #[arg(long, default_value = "")]
    reason: String,
}

#[derive(Debug, Subcommand)]
enum DnsCmd {
    /// The records the ring wants: each control plane's name -> its serving host, each healthy
    /// member's admin endpoint; names with no record say why.
    List,
}

#[derive(Debug, Subcommand)]
enum LeaderCmd {
    /// Hand leadership to another voter.
    Transfer {
        /// Member id or name (default: the most up-to-date other voter).
        #[arg(long)]
        to: Option<String>,
        /// Why.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Number of members, one per zone (zone-a, zone-b, ...).
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Directory for the members' configs, data, logs and pid files (default: a fresh temp dir).
    /// A directory that holds a stopped demo is resumed.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// First port: member i uses base+10i (admin) and base+10i+1 (peer).
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    /// Return once the ring is up and leave the members running.
    #[arg(long)]
    detach: bool,
    /// Stop the detached demo in --dir and exit.
    #[arg(long, requires = "dir")]
    stop: bool,
    /// Do not register the sample control planes.
    #[arg(long)]
    no_samples: bool,
    /// The ringd binary (default: the one next to ringctl, else ringd on PATH).
    #[arg(long)]
    ringd: Option<PathBuf>,
    /// How the members run the sample control planes: `etcd` runs a real etcd per control
    /// plane (snapshots, migration and restore on failover); `none` runs nothing; `auto` is
    /// `etcd` when an etcd (with etcdctl or etcdutl) is on PATH.
    #[arg(long, value_enum, default_value_t = DemoDriver::Auto)]
    driver: DemoDriver,
    #[command(subcommand)]
    action: Option<DemoAction>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DemoDriver {
    Auto,
    Etcd,
    None,
}

#[derive(Debug, clap::Subcommand)]
enum DemoAction {
    /// Fail a zone of a running demo the way a zone dies: SIGKILL to its ringd and to the
    /// etcds and guards it started. The ring notices within member_lost_ms (2 s in the demo),
    /// moves the zone's control planes, restores their data from the newest snapshot and
    /// switches DNS; watch it with `ringctl status` or the live view. To bring the zone back,
    /// stop the demo (`--stop`) and start it again with the same `--dir`: the member rejoins,
    /// and nothing moves back on its own.
    FailZone {
        /// The zone (`zone-a`) or member name (`a`).
        zone: String,
        /// The demo's directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Endpoints and transport security from flags, environment and the client config file.
fn connection(cli: &Cli) -> Result<(Vec<String>, Security), Failure> {
    let file = match &cli.config {
        Some(path) => Some(ClientConfig::load(path).map_err(|e| Failure(e.to_string()))?),
        None => None,
    };
    let endpoints = if !cli.endpoint.is_empty() {
        cli.endpoint.clone()
    } else {
        match &file {
            Some(f) if !f.endpoints.is_empty() => f.endpoints.clone(),
            _ => vec!["127.0.0.1:7400".into()],
        }
    };
    let flags = cli.ca_file.as_ref().map(|ca| ClientConfig {
        ca_file: Some(ca.clone()),
        cert_file: cli.cert_file.clone(),
        key_file: cli.key_file.clone(),
        ..ClientConfig::default()
    });
    let chosen = if cli.insecure {
        ClientConfig {
            insecure: true,
            ..ClientConfig::default()
        }
    } else if let Some(flags) = flags {
        flags
    } else if let Some(file) = file {
        file
    } else {
        return Err(Failure(
            "no client certificate: pass --config FILE (or set RINGCTL_CONFIG) naming ca_file, cert_file and key_file, \
             or --ca-file/--cert-file/--key-file (make them with `ringctl certs init`); \
             use --insecure only for a ring that runs without TLS"
                .into(),
        ));
    };
    let security = chosen.security().map_err(|e| Failure(e.to_string()))?;
    Ok((endpoints, security))
}

impl CertsCmd {
    /// Whether it works on local files only (no ring to ask).
    fn is_local(&self) -> bool {
        matches!(
            self,
            CertsCmd::Init { .. }
                | CertsCmd::Issue { .. }
                | CertsCmd::Check { .. }
                | CertsCmd::Crl { .. }
        )
    }
}

fn certs(cmd: CertsCmd, out: Output) -> Result<(), Failure> {
    use garden_ring::tls::certs;
    let fail = |e: certs::CertsError| Failure(e.to_string());
    let identity = |role: Role, name: &str| {
        Identity::new(role, name).map_err(|e| Failure(format!("{role} name: {e}")))
    };
    let mut written = Vec::new();
    match cmd {
        CertsCmd::Check { dir, warn_days } => return certs_check(&dir, warn_days, out),
        CertsCmd::Crl {
            dir,
            serials,
            days,
            out: file,
        } => {
            written.push(certs::write_crl(&dir, &serials, days, &file).map_err(fail)?);
        }
        CertsCmd::Init {
            dir,
            members,
            admins,
            viewers,
            sans,
            ca_days,
            days,
            force,
        } => {
            // Check every name before writing anything.
            let mut wanted = Vec::new();
            for (role, names) in [
                (Role::Member, &members),
                (Role::Admin, &admins),
                (Role::Viewer, &viewers),
            ] {
                for name in names {
                    wanted.push(identity(role, name)?);
                }
            }
            written.push(certs::init_ca(&dir, ca_days, force).map_err(fail)?);
            for id in wanted {
                let extra = if id.role == Role::Member {
                    sans.as_slice()
                } else {
                    &[]
                };
                let (cert, key) = certs::issue(&dir, &id, extra, days, force).map_err(fail)?;
                written.push(cert);
                written.push(key);
            }
        }
        CertsCmd::Issue {
            dir,
            role,
            name,
            sans,
            days,
            force,
        } => {
            let role = Role::parse(&role).ok_or_else(|| {
                Failure(format!("--role {role:?} must be member, admin or viewer"))
            })?;
            let (cert, key) =
                certs::issue(&dir, &identity(role, &name)?, &sans, days, force).map_err(fail)?;
            written.push(cert);
            written.push(key);
        }
        CertsCmd::Revoke { .. } | CertsCmd::Unrevoke { .. } | CertsCmd::ListRevoked => {
            unreachable!("asks the ring")
        }
    }
    print(out, &written, |files| {
        files
            .iter()
            .map(|f| format!("wrote {}", f.display()))
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(())
}

/// `ringctl certs check`.
fn certs_check(dir: &Path, warn_days: u64, out: Output) -> Result<(), Failure> {
    let checked = garden_ring::tls::certs::check_dir(dir).map_err(|e| Failure(e.to_string()))?;
    let now_s = garden_ring::time::unix_ms() / 1000;
    let rows = output::checked_certificates(&checked, now_s, warn_days);
    print(out, &rows, |rows| output::certificate_table(rows));
    let due: Vec<String> = rows
        .iter()
        .filter(|r| r.status != "ok")
        .map(|r| format!("{} ({})", r.file, r.name))
        .collect();
    if due.is_empty() {
        Ok(())
    } else {
        Err(Failure(format!(
            "{} certificate(s) expired, expire within {warn_days} days or cannot be read: {}",
            due.len(),
            due.join(", ")
        )))
    }
}

fn actor() -> String {
    garden_ring::recovery::local_actor("ringctl")
}

/// A failure to report: one line, non-zero exit.
struct Failure(String);

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure(e.to_string())
    }
}

/// An `upgrade hold|release|finalize` refusal; a member of release 0.1.0 (the leader, or the
/// one answering) knows no such method.
fn upgrade_refused(e: ClientError) -> Failure {
    if e.code() == Some(tonic::Code::Unimplemented) {
        Failure(format!(
            "{e}\nthe leader or the answering member runs release 0.1.0, which knows no upgrade \
             commands: upgrade it first (`ringctl upgrade status` shows each member's release)"
        ))
    } else {
        e.into()
    }
}

/// `KEY=VALUE` arguments as a map (the ring checks the keys and values).
fn label_map(labels: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    let mut map = BTreeMap::new();
    for l in labels {
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| Failure(format!("label {l:?} must be KEY=VALUE, like tier=gold")))?;
        map.insert(k.to_string(), v.to_string());
    }
    Ok(map)
}

fn print<T: Serialize>(output: Output, value: &T, table: impl FnOnce(&T) -> String) {
    let text = match output {
        Output::Json => serde_json::to_string_pretty(value).expect("serializable"),
        Output::Table => table(value),
    };
    say(&text);
}

/// Says on stderr that a read is not linearizable, and how stale it may be (stdout stays the
/// answer, for scripts).
fn note_stale(freshness: Option<&pb::ReadFreshness>) {
    if let Some(line) = garden_ring::admin::freshness::stale_line(freshness) {
        eprintln!("{line}");
    }
}

/// Prints a line to stdout; a closed pipe (`ringctl status | head`) ends the program quietly.
fn say(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ringctl: error: writing output: {e}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    let cli = garden_ring::cli::parse_or_exit::<Cli>("ringctl");
    garden_ring::tls::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message)) => {
            eprintln!("ringctl: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `MEMBER=VALUE` arguments of `flag` as a map; each member once.
fn member_map(
    flag: &str,
    shape: &str,
    args: &[String],
    example: &str,
) -> Result<BTreeMap<String, String>, Failure> {
    let mut map = BTreeMap::new();
    for arg in args {
        let (member, value) = arg
            .split_once('=')
            .ok_or_else(|| Failure(format!("{flag} {arg:?} must be {shape}, like {example}")))?;
        if map.insert(member.to_string(), value.to_string()).is_some() {
            return Err(Failure(format!("{flag} names member {member:?} twice")));
        }
    }
    Ok(map)
}

macro_rules! rpc {
    ($client:expr, $method:ident, $req:expr) => {
        $client
            .call($req, |mut c, r| async move { c.$method(r).await })
            .await
    };
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Cmd::Demo(args) => return demo(args, cli.output, cli.insecure).await,
        Cmd::Certs(cmd) if cmd.is_local() => return certs(cmd, cli.output),
        Cmd::Snapshot(snapshot::SnapshotCmd::Restore(args)) => {
            return snapshot::restore(args, cli.output);
        }
        _ => {}
    }
    let (endpoints, security) = connection(&cli)?;
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let each_endpoint = endpoints.clone();
    let client =
        AdminClient::new(endpoints, security.clone(), actor())?.with_request_timeout(timeout);
    let out = cli.output;
    match cli.command {
        Cmd::Snapshot(snapshot::SnapshotCmd::Save { file }) => {
            let leader = |address: String| {
                AdminClient::new(vec![address], security.clone(), actor())
                    .map(|c| c.with_request_timeout(timeout))
            };
            snapshot::save(&client, leader, &file, out).await?;
        }
        Cmd::Status => {
            let s = rpc!(client, status, pb::StatusRequest { stale: cli.stale })?;
            // The DNS summary comes from the leader; a ring without one still has a status.
            let dns = rpc!(client, dns_list, pb::DnsListRequest {}).ok();
            match out {
                Output::Json => {
                    note_stale(s.freshness.as_ref());
                    print(out, &s, output::status)
                }
                Output::Table => println!(
                    "{}{}",
                    output::status(&s),
                    dns.map(|d| format!("\n\n{}", output::dns_summary(&d)))
                        .unwrap_or_default()
                ),
            }
        }
        Cmd::Member(MemberCmd::List) => {
            let status = rpc!(client, status, pb::StatusRequest { stale: cli.stale })?;
            note_stale(status.freshness.as_ref());
            let leader = status.leader_id;
            print(out, &status.members, |m| output::members(m, Some(leader)));
        }
        Cmd::Member(MemberCmd::Add {
            id,
            name,
            zone,
            address,
            admin_address,
            catch_up_timeout,
            promote,
            reason,
        }) => {
            let req = pb::MemberAddRequest {
                id,
                name: name.clone(),
                zone,
                address,
                admin_address,
                reason: reason.clone(),
                catch_up_timeout_ms: catch_up_timeout.saturating_mul(1000),
            };
            let resp = rpc!(client, member_add, req)?;
            if promote {
                if !resp.caught_up {
                    return Err(Failure(format!(
                        "member {name} ({id}) was added as a learner but has not caught up within {catch_up_timeout} s, so it was not promoted; \
                         check that its ringd runs, then run `ringctl member promote {name}`"
                    )));
                }
                let promoted = rpc!(
                    client,
                    member_promote,
                    pb::MemberRefRequest {
                        member: id.to_string(),
                        reason
                    }
                )?;
                print(out, &promoted, |r| {
                    format!(
                        "member {name} ({id}) added and promoted to voter (index {})",
                        r.index
                    )
                });
            } else {
                print(out, &resp, |r| {
                    if r.caught_up {
                        format!(
                            "member {name} ({id}) added as a learner and caught up (index {}); make it a voter with `ringctl member promote {name}`",
                            r.index
                        )
                    } else {
                        format!(
                            "member {name} ({id}) added as a learner but has not caught up within {catch_up_timeout} s; is its ringd running? \
                             It keeps catching up in the background; promote it once `ringctl member list` shows it healthy"
                        )
                    }
                });
            }
        }
        Cmd::Member(MemberCmd::Promote { member, reason }) => {
            let r = rpc!(
                client,
                member_promote,
                pb::MemberRefRequest {
                    member: member.clone(),
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!("member {member} is a voter (index {})", r.index)
            });
        }
        Cmd::Member(MemberCmd::Remove { member, reason }) => {
            let r = rpc!(
                client,
                member_remove,
                pb::MemberRefRequest {
                    member: member.clone(),
                    reason
                }
            )?;
            print(out, &r, |r| {
                let id = r.member.as_ref().map(|m| m.id).unwrap_or(0);
                format!(
                    "member {member} removed from the ring (index {}); id {id} is retired and will never be reused",
                    r.index
                )
            });
        }
        Cmd::ControlPlane(CpCmd::List) => {
            let r = rpc!(
                client,
                control_plane_list,
                pb::ControlPlaneListRequest { stale: cli.stale }
            )?;
            note_stale(r.freshness.as_ref());
            print(out, &r.control_planes, |c| output::control_planes(c));
        }
        Cmd::ControlPlane(CpCmd::Get { name }) => {
            let r = rpc!(
                client,
                control_plane_get,
                pb::ControlPlaneGetRequest {
                    name,
                    stale: cli.stale
                }
            )?;
            note_stale(r.freshness.as_ref());
            print(out, &r, output::control_plane);
        }
        Cmd::ControlPlane(CpCmd::Add {
            name,
            dns_name,
            endpoints,
            backup,
            backups,
            home,
            host,
            prefer,
            tolerance,
            etcd_peers,
            reason,
        }) => {
            let etcd_peers = member_map(
                "--etcd-peer-on",
                "MEMBER=HOST:PORT",
                &etcd_peers,
                "b=10.0.1.5:2380",
            )?;
            let map = member_map(
                "--endpoint-on",
                "MEMBER=HOST:PORT",
                &endpoints,
                "b=10.0.1.5:443",
            )?;
            let backups = member_map(
                "--backup-on",
                "MEMBER=URL",
                &backups,
                "b=s3://zone-b-backups/shoot-x",
            )?;
            let req = pb::ControlPlaneAddRequest {
                name,
                home: home.unwrap_or_default(),
                dns_name,
                endpoints: map,
                backup,
                backups,
                host: host.unwrap_or_default(),
                reason,
                prefer,
                tolerance,
                etcd_peers,
            };
            let r = rpc!(client, control_plane_add, req)?;
            print(out, &r, |r| match &r.control_plane {
                Some(cp) if !cp.host.is_empty() => format!(
                    "control plane {} added, hosted on {} at epoch {} (index {})",
                    cp.name, cp.host, cp.epoch, r.index
                ),
                Some(cp) => format!(
                    "control plane {} added but pending: no member is eligible to host it (index {})",
                    cp.name, r.index
                ),
                None => format!("control plane added (index {})", r.index),
            });
        }
        Cmd::ControlPlane(CpCmd::Label {
            name,
            labels,
            reason,
        }) => {
            let map = label_map(&labels)?;
            let r = rpc!(
                client,
                control_plane_label,
                pb::ControlPlaneLabelRequest {
                    name: name.clone(),
                    labels: map,
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!("control plane {name} labelled (index {})", r.index)
            });
        }
        Cmd::ControlPlane(CpCmd::Remove { name, reason }) => {
            let r = rpc!(
                client,
                control_plane_remove,
                pb::ControlPlaneRemoveRequest {
                    name: name.clone(),
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!("control plane {name} removed (index {})", r.index)
            });
        }
        Cmd::ControlPlane(CpCmd::Recover {
            name,
            from_member,
            from_backup,
            dry_run,
            reason,
        }) => {
            if from_member.is_empty() && !from_backup {
                return Err(Failure(
                    "cp recover needs --from-member MEMBER (restart from that member's etcd data) \
                     or --from-backup (restore from the newest backups); try --dry-run first"
                        .into(),
                ));
            }
            let r = rpc!(
                client,
                control_plane_recover,
                pb::ControlPlaneRecoverRequest {
                    name,
                    from_member,
                    dry_run,
                    reason,
                    from_backup
                }
            )?;
            print(out, &r, |r| {
                if r.index == 0 {
                    r.plan.clone()
                } else {
                    format!("{} (index {})", r.plan, r.index)
                }
            });
        }
        Cmd::Dns(DnsCmd::List) => {
            let r = rpc!(client, dns_list, pb::DnsListRequest {})?;
            print(out, &r, output::dns);
        }
        Cmd::History { limit } => {
            let r = rpc!(
                client,
                history,
                pb::HistoryRequest {
                    limit,
                    stale: cli.stale
                }
            )?;
            note_stale(r.freshness.as_ref());
            print(out, &r.events, |e| output::history(e));
        }
        Cmd::Leader(LeaderCmd::Transfer { to, reason }) => {
            let r = rpc!(
                client,
                leader_transfer,
                pb::LeaderTransferRequest {
                    to: to.unwrap_or_default(),
                    reason
                }
            )?;
            print(out, &r, |r| format!("member {} is the leader", r.leader_id));
        }
        Cmd::Member(
            ref command @ (MemberCmd::Cordon {
                ref member,
                ref reason,
            }
            | MemberCmd::Uncordon {
                ref member,
                ref reason,
            }),
        ) => {
            let cordoned = matches!(command, MemberCmd::Cordon { .. });
            let (member, reason) = (member.clone(), reason.clone());
            let r = rpc!(
                client,
                member_cordon,
                pb::MemberCordonRequest {
                    member: member.clone(),
                    cordoned,
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!(
                    "member {member} {} (index {})",
                    if cordoned {
                        "cordoned: it gets no new control planes"
                    } else {
                        "uncordoned"
                    },
                    r.index
                )
            });
        }
        Cmd::Member(MemberCmd::Label {
            ref member,
            ref labels,
            ref reason,
        }) => {
            let map = label_map(labels)?;
            let r = rpc!(
                client,
                member_label,
                pb::MemberLabelRequest {
                    member: member.clone(),
                    labels: map,
                    reason: reason.clone()
                }
            )?;
            print(out, &r, |r| {
                format!("member {member} labelled (index {})", r.index)
            });
        }
        Cmd::Member(MemberCmd::Drain {
            member,
            dry_run,
            reason,
        }) => {
            #[allow(deprecated)]
            let req = pb::MoveRequest {
                move_kind: pb::MoveKind::Drain.into(),
                // For servers that only read the deprecated string (one release).
                kind: "drain".into(),
                member,
                dry_run,
                reason,
                ..Default::default()
            };
            let r = rpc!(client, r#move, req)?;
            print(out, &r, output::moves);
        }
        Cmd::Switchover(args) => moves(&client, out, pb::MoveKind::Switchover, args).await?,
        Cmd::Failover(args) => moves(&client, out, pb::MoveKind::Failover, args).await?,
        Cmd::Upgrade(UpgradeCmd::Status) => {
            let s = rpc!(client, status, pb::StatusRequest { stale: cli.stale })?;
            note_stale(s.freshness.as_ref());
            print(out, &s, |s| {
                format!(
                    "{}\n\n{}",
                    output::ring_version(s.ring_version.as_ref()),
                    output::members(&s.members, Some(s.leader_id))
                )
            });
        }
        Cmd::Upgrade(cmd @ (UpgradeCmd::Hold { .. } | UpgradeCmd::Release { .. })) => {
            let (held, reason) = match cmd {
                UpgradeCmd::Hold { reason } => (true, reason),
                UpgradeCmd::Release { reason } => (false, reason),
                _ => unreachable!("matched above"),
            };
            let r = rpc!(
                client,
                upgrade_hold,
                pb::UpgradeHoldRequest { held, reason }
            )
            .map_err(upgrade_refused)?;
            print(out, &r, output::upgrade);
        }
        Cmd::Upgrade(UpgradeCmd::Finalize { reason }) => {
            let r = rpc!(
                client,
                upgrade_finalize,
                pb::UpgradeFinalizeRequest { reason }
            )
            .map_err(upgrade_refused)?;
            print(out, &r, output::upgrade);
        }
        Cmd::Pause { reason } => {
            let r = rpc!(
                client,
                set_paused,
                pb::SetPausedRequest {
                    paused: true,
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!("automatic actions paused (index {})", r.index)
            });
        }
        Cmd::Resume { reason } => {
            let r = rpc!(
                client,
                set_paused,
                pb::SetPausedRequest {
                    paused: false,
                    reason
                }
            )?;
            print(out, &r, |r| {
                format!("automatic actions resumed (index {})", r.index)
            });
        }
        Cmd::Certs(CertsCmd::Revoke { which, reason }) => {
            let (issuer, serial, subject) = which.key()?;
            let req = pb::CertRevokeRequest {
                serial,
                issuer,
                subject,
                reason,
            };
            let mut r = rpc!(client, cert_revoke, req.clone());
            // A follower does not pass on the revocation of its own certificate (the answer
            // would be lost with its connection): ask the others, one by one.
            let own = |r: &Result<pb::CertRevokeResponse, ClientError>| {
                matches!(r, Err(ClientError::Status(s))
                    if s.metadata().get(garden_ring::admin::REFUSAL_HEADER).and_then(|v| v.to_str().ok())
                        == Some(garden_ring::admin::OWN_CERTIFICATE_REFUSAL))
            };
            for endpoint in &each_endpoint {
                if !own(&r) {
                    break;
                }
                let one = AdminClient::new(vec![endpoint.clone()], security.clone(), actor())?
                    .with_request_timeout(timeout);
                r = rpc!(one, cert_revoke, req.clone());
            }
            let r = r?;
            print(out, &r, |r| {
                format!(
                    "{} (index {}); every member refuses it from now on",
                    r.revoked
                        .as_ref()
                        .map(output::revoked_line)
                        .unwrap_or_default(),
                    r.index
                )
            });
        }
        Cmd::Certs(CertsCmd::Unrevoke { which, reason }) => {
            let (issuer, serial, _) = which.key()?;
            let r = rpc!(
                client,
                cert_unrevoke,
                pb::CertUnrevokeRequest {
                    serial: serial.clone(),
                    issuer,
                    reason,
                }
            )?;
            print(out, &r, |r| {
                format!("certificate {serial} is accepted again (index {})", r.index)
            });
        }
        Cmd::Certs(CertsCmd::ListRevoked) => {
            let r = rpc!(
                client,
                cert_list_revoked,
                pb::CertListRevokedRequest { stale: cli.stale }
            )?;
            note_stale(r.freshness.as_ref());
            print(out, &r.revoked, |list| output::revoked(list));
        }
        Cmd::Demo(_) | Cmd::Certs(_) | Cmd::Snapshot(snapshot::SnapshotCmd::Restore(_)) => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

async fn moves(
    client: &AdminClient,
    out: Output,
    kind: pb::MoveKind,
    args: MoveArgs,
) -> Result<(), Failure> {
    let legacy = match kind {
        pb::MoveKind::Switchover => "switchover",
        _ => "failover",
    };
    #[allow(deprecated)]
    let req = pb::MoveRequest {
        move_kind: kind.into(),
        // For servers that only read the deprecated string (one release).
        kind: legacy.into(),
        control_plane: args.control_plane,
        to: args.to.unwrap_or_default(),
        dry_run: args.dry_run,
        reason: args.reason,
        ..Default::default()
    };
    let r = rpc!(client, r#move, req)?;
    print(out, &r, output::moves);
    Ok(())
}

fn ringd_binary(explicit: Option<PathBuf>) -> PathBuf {
    if let Some(p) = explicit {
        return p;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("ringd")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("ringd"))
}

const INTERRUPTED: &str =
    "interrupted while the ring was starting; the members started so far were stopped";

async fn demo(args: DemoArgs, out: Output, insecure: bool) -> Result<(), Failure> {
    if let Some(DemoAction::FailZone { zone, dir }) = &args.action {
        let killed = garden_ring::demo::fail_zone(dir, zone).map_err(|e| Failure(e.to_string()))?;
        match out {
            Output::Json => say(&serde_json::to_string_pretty(&serde_json::json!({
                "zone": zone,
                "killed": killed
                    .iter()
                    .map(|(what, pid)| serde_json::json!({"process": what, "pid": pid}))
                    .collect::<Vec<_>>(),
            }))
            .expect("serializable")),
            Output::Table => {
                for (what, pid) in &killed {
                    println!("killed {what} (pid {pid})");
                }
                println!(
                    "\nwatch: RINGCTL_CONFIG={} ringctl status",
                    dir.join("ringctl.toml").display()
                );
            }
        }
        return Ok(());
    }
    if args.stop {
        let dir = args.dir.expect("clap requires --dir with --stop");
        let stopped = garden_ring::demo::stop_detached(&dir, Duration::from_secs(10));
        if stopped.is_empty() {
            return Err(Failure(format!(
                "no running demo members in {}",
                dir.display()
            )));
        }
        say(&format!("stopped members {}", stopped.join(", ")));
        return Ok(());
    }
    let opts = DemoOptions {
        members: args.members,
        dir: args.dir,
        base_port: args.base_port,
        ringd: ringd_binary(args.ringd),
        timeout: Duration::from_secs(30),
        samples: !args.no_samples,
        insecure,
        etcd_bin_dir: match args.driver {
            DemoDriver::None => None,
            DemoDriver::Auto => garden_ring::demo::find_etcd(),
            DemoDriver::Etcd => Some(garden_ring::demo::find_etcd().ok_or_else(|| {
                Failure(
                    "--driver etcd: no etcd with etcdctl or etcdutl on PATH (on Debian: apt-get install etcd-server etcd-client)"
                        .into(),
                )
            })?),
        },
    };
    // Handlers first: a Ctrl-C while the ring starts must stop the members already started
    // (they run in their own process group), not leave them behind.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| Failure(format!("installing the SIGINT handler: {e}")))?;
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| Failure(format!("installing the SIGTERM handler: {e}")))?;
    let demo = tokio::select! {
        started = Demo::start(opts) => started.map_err(|e| Failure(e.to_string()))?,
        _ = sigint.recv() => return Err(Failure(INTERRUPTED.into())),
        _ = sigterm.recv() => return Err(Failure(INTERRUPTED.into())),
    };
    let client = demo.client();
    if args.detach {
        let demo = demo.detach();
        match out {
            Output::Json => say(&serde_json::to_string_pretty(&demo).expect("serializable")),
            Output::Table => {
                println!(
                    "ring is up in {} (leader {})",
                    demo.dir.display(),
                    demo.leader_id
                );
                for m in &demo.members {
                    println!(
                        "  {} ({}, id {}): admin {} dns {} pid {}",
                        m.name, m.zone, m.id, m.admin_endpoint, m.dns_endpoint, m.pid
                    );
                }
                if let Some(m) = demo.members.first() {
                    let (ip, port) = m.dns_endpoint.rsplit_once(':').unwrap_or_default();
                    println!(
                        "\ndns:  dig @{ip} -p {port} cp-{}.{} A",
                        m.name,
                        garden_ring::demo::DEMO_ZONE
                    );
                }
                println!(
                    "\ntry:  RINGCTL_CONFIG={} ringctl status",
                    demo.client_config.display()
                );
                println!(
                    "fail a zone: ringctl demo fail-zone zone-a --dir {}",
                    demo.dir.display()
                );
                println!("stop: ringctl demo --stop --dir {}", demo.dir.display());
            }
        }
        return Ok(());
    }
    let mut demo = demo;
    println!("ring is up in {}; Ctrl-C stops it", demo.dir.display());
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                let mut text = match rpc!(client, status, pb::StatusRequest::default()) {
                    Ok(s) => output::status(&s),
                    Err(e) => format!("status: {e}"),
                };
                if let Ok(dns) = rpc!(client, dns_list, pb::DnsListRequest {}) {
                    text.push_str("\n\n");
                    text.push_str(&output::dns(&dns));
                }
                if tty {
                    print!("\x1b[2J\x1b[H");
                }
                println!(
                    "garden-ring demo in {dir} (Ctrl-C stops it; fail a zone from another shell: ringctl demo fail-zone zone-a --dir {dir})\n\n{text}\n",
                    dir = demo.dir.display()
                );
            }
        }
    }
    println!("stopping the members ...");
    demo.stop(Duration::from_secs(10));
    println!("stopped; data kept in {}", demo.dir.display());
    Ok(())
}

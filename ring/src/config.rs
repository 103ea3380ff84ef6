//! `ringd`'s configuration: one TOML file, every field documented in
//! `deploy/examples/ringd.toml`, unknown fields refused (a typo must not silently fall back to
//! a default). Command-line flags may override a few fields; validation runs after overrides.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::core::names::{Invalid, check_address, check_label};
use crate::core::{MemberSpec, NodeId};
use crate::tls::TlsFiles;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema.
    #[error("config file {path} is not valid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A field has a value that cannot work.
    #[error("config {field}: {why}")]
    Invalid {
        /// The field.
        field: String,
        /// Why.
        why: String,
    },
}

fn invalid(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        why: why.into(),
    }
}

/// One member of the ring as named in `initial_members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitialMember {
    /// Raft node id.
    pub id: NodeId,
    /// Member name.
    pub name: String,
    /// Failure zone.
    pub zone: String,
    /// Peer (Raft) address other members use.
    pub address: String,
    /// Admin API address.
    pub admin_address: String,
}

impl From<&InitialMember> for MemberSpec {
    fn from(m: &InitialMember) -> Self {
        MemberSpec {
            id: m.id,
            name: m.name.clone(),
            zone: m.zone.clone(),
            address: m.address.clone(),
            admin_address: m.admin_address.clone(),
        }
    }
}

pub use crate::core::timing::Timing;

/// Snapshot and log-compaction settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotSettings {
    /// Build a state-machine snapshot after this many new log entries.
    pub every_entries: u64,
    /// Log entries kept behind a snapshot, so slightly lagging followers need no snapshot.
    pub keep_entries: u64,
}

impl Default for SnapshotSettings {
    fn default() -> Self {
        Self {
            every_entries: 5_000,
            keep_entries: 1_000,
        }
    }
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// A tracing filter, e.g. `info` or `info,garden_ring=debug`.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            // openraft logs every failed heartbeat to an unreachable peer; ringd itself reports
            // reachability, leadership and health changes once each.
            level: DEFAULT_LOG_LEVEL.into(),
            format: LogFormat::Text,
        }
    }
}

/// Longest accepted timing, in milliseconds (one hour): more is a typo, and bounding every
/// timing keeps the arithmetic on them far from overflow.
pub const MAX_TIMING_MS: u64 = 3_600_000;

/// The default log filter.
pub const DEFAULT_LOG_LEVEL: &str = "info,openraft=error";

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Placement policy of the leader. Use the same values on every member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementSettings {
    /// Least time between two automatic moves of one control plane (anti-flapping). Operator
    /// moves (`ringctl failover`, `switchover`, `drain`) are not held back.
    pub min_move_interval_ms: u64,
    /// Most control planes one member may host (0: no limit).
    pub capacity: usize,
    /// How long a member must stay lost before the etcd members it ran for zone-tolerant
    /// control planes are replaced on spare members (a 4- or 5-member ring with a member in a
    /// zone the cluster does not use). Default 5 minutes: a zone back sooner rejoins with its
    /// data, and a replacement copies the whole database to the new member.
    pub etcd_replace_after_ms: u64,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            min_move_interval_ms: 60_000,
            capacity: 0,
            etcd_replace_after_ms: crate::core::controller::DEFAULT_ETCD_REPLACE_AFTER_MS,
        }
    }
}

/// How a member runs the control planes it hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverKind {
    /// Runs nothing: assignments and leases are kept, and every control plane is reported
    /// serving as soon as its lease allows.
    #[default]
    None,
    /// Runs `run` for each hosted control plane under a guard process that stops it when the
    /// lease runs out, plus optional hook commands (like Patroni callbacks).
    Exec,
    /// Runs each hosted control plane's etcd itself (`[driver.etcd]`): restores it from the
    /// backups when it moves here, snapshots it into its backup location while it serves, and
    /// takes a final snapshot when it stops.
    Etcd,
}

/// Limits on each client identity of the Admin API (`[admin]`), so that one client (a runaway
/// script, a stuck controller) cannot take the member from the rest. Counted per member;
/// writes a follower forwards count on the follower.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSettings {
    /// Most Admin requests of one identity (`admin:alice`) a member works on at once; more are
    /// refused at once with `RESOURCE_EXHAUSTED`.
    pub max_in_flight_per_identity: u32,
    /// Most Admin writes per second of one identity on a member (a burst of as many is let
    /// through); 0: no limit.
    pub max_writes_per_second_per_identity: u32,
}

/// Default of [`AdminSettings::max_in_flight_per_identity`]: more than any operator tool needs;
/// 256 clients flooding a ring at once stayed under it on every member (`ring-chaos bench --only
/// flood`).
pub const DEFAULT_MAX_IN_FLIGHT_PER_IDENTITY: u32 = 256;
/// Most [`AdminSettings::max_in_flight_per_identity`] accepted.
pub const MAX_IN_FLIGHT_PER_IDENTITY: u32 = 65_536;

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            max_in_flight_per_identity: DEFAULT_MAX_IN_FLIGHT_PER_IDENTITY,
            max_writes_per_second_per_identity: 0,
        }
    }
}

impl AdminSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_IN_FLIGHT_PER_IDENTITY).contains(&self.max_in_flight_per_identity) {
            return Err(invalid(
                "admin.max_in_flight_per_identity",
                format!("must be 1 to {MAX_IN_FLIGHT_PER_IDENTITY}"),
            ));
        }
        if self.max_writes_per_second_per_identity > 1_000_000 {
            return Err(invalid(
                "admin.max_writes_per_second_per_identity",
                "must be at most 1000000 (0: no limit)",
            ));
        }
        Ok(())
    }
}

/// The member's HTTP endpoint (`[metrics]`): `/metrics`, `/healthz`, `/readyz`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSettings {
    /// Where to serve it (plain HTTP; bind it to an address only Prometheus and the kubelet
    /// reach). Unset: not served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

/// The `etcd` driver (`[driver.etcd]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdDriverSettings {
    /// The directory holding `etcd` and `etcdctl` (3.4) or `etcdutl` (3.5+). Unset: the
    /// directory of the first `etcd` on `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<PathBuf>,
    /// Where each hosted control plane's etcd keeps its data: one directory per control plane
    /// and epoch below it. Unset: `<data_dir>/etcd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_root: Option<PathBuf>,
    /// How often a serving etcd takes a full snapshot into its backup location
    /// (etcd-backup-restore's `--schedule`; Gardener takes one a day). `snapshot_interval_ms`,
    /// the name before delta snapshots existed, is read as this.
    #[serde(alias = "snapshot_interval_ms")]
    pub full_snapshot_interval_ms: u64,
    /// How often the events since the last snapshot are written as a delta snapshot (`Incr-`,
    /// etcd-backup-restore's `--delta-snapshot-period`): what a zone loss can lose is about
    /// one period. 0 turns delta snapshots off (full snapshots only).
    pub delta_snapshot_period_ms: u64,
    /// A delta snapshot is also written as soon as the events waiting for it take this many
    /// bytes (etcd-backup-restore's `--delta-snapshot-memory-limit`).
    pub delta_snapshot_memory_limit_bytes: u64,
    /// Gzip the snapshots (`.gz`), as etcd-backup-restore can.
    pub compress: bool,
    /// Which old snapshots the host deletes from its backup location
    /// (etcd-backup-restore's `--garbage-collection-policy`): `exponential` or `limit-based`.
    pub garbage_collection_policy: GcPolicy,
    /// `limit-based`: how many full snapshots to keep, the newest included
    /// (etcd-backup-restore's `--max-backups`).
    pub max_backups: u64,
    /// How often the host garbage-collects its backups (etcd-backup-restore's
    /// `--garbage-collection-period`, 1 min); 0 turns garbage collection off.
    pub garbage_collection_period_ms: u64,
    /// A new full snapshot is taken (and the deltas' chain starts again) as soon as the deltas
    /// since the last one hold this many events (etcd-druid's compaction trigger,
    /// `--etcd-events-threshold`): a restore replays at most about this many. 0: no limit.
    pub compaction_events: u64,
    /// ... or take this many bytes. 0: no limit.
    pub compaction_bytes: u64,
    /// etcd's `--auto-compaction-mode` (`periodic` or `revision`): etcd drops the history of
    /// old revisions by itself. The delta snapshots' watch runs at the head of the history; a
    /// compaction past it ends the watch and a full snapshot follows, so nothing is lost.
    pub auto_compaction_mode: AutoCompactionMode,
    /// etcd's `--auto-compaction-retention`: `periodic`: a duration (`30m`, `1h`, or hours as
    /// a number); `revision`: how many revisions to keep.
    pub auto_compaction_retention: String,
    /// etcd's `--quota-backend-bytes`: past it, etcd refuses writes (alarm NOSPACE) until it
    /// is compacted and defragmented. etcd's own default is 2 GiB; Gardener's 8 GiB.
    pub quota_backend_bytes: u64,
    /// How often the host defragments its etcd (and takes a full snapshot after it); Gardener
    /// defragments daily. 0: never.
    pub defragmentation_interval_ms: u64,
    /// Longest an etcd may take to answer after it was started.
    pub start_timeout_ms: u64,
    /// Longest `etcdctl`/`etcdutl snapshot restore` may run.
    pub restore_timeout_ms: u64,
}

impl Default for EtcdDriverSettings {
    fn default() -> Self {
        Self {
            bin_dir: None,
            data_root: None,
            full_snapshot_interval_ms: 3_600_000,
            delta_snapshot_period_ms: 20_000,
            delta_snapshot_memory_limit_bytes: 10 * 1024 * 1024,
            compress: false,
            garbage_collection_policy: GcPolicy::Exponential,
            max_backups: 7,
            garbage_collection_period_ms: 60_000,
            compaction_events: 1_000_000,
            compaction_bytes: 256 * 1024 * 1024,
            auto_compaction_mode: AutoCompactionMode::Periodic,
            auto_compaction_retention: "30m".into(),
            quota_backend_bytes: 8 * 1024 * 1024 * 1024,
            defragmentation_interval_ms: 24 * 3_600_000,
            start_timeout_ms: 30_000,
            restore_timeout_ms: 600_000,
        }
    }
}

/// `driver.etcd.garbage_collection_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GcPolicy {
    /// Every full snapshot of the current hour, then the newest per hour of today, per day for
    /// 7 days, per week up to 5 weeks (etcd-backup-restore's windows).
    #[serde(rename = "exponential", alias = "Exponential")]
    Exponential,
    /// The newest `max_backups` full snapshots.
    #[serde(rename = "limit-based", alias = "LimitBased")]
    LimitBased,
}

/// `driver.etcd.auto_compaction_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoCompactionMode {
    /// Keep the history of the last `auto_compaction_retention` (a duration).
    Periodic,
    /// Keep the last `auto_compaction_retention` revisions.
    Revision,
}

impl AutoCompactionMode {
    /// etcd's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Periodic => "periodic",
            Self::Revision => "revision",
        }
    }
}

impl EtcdDriverSettings {
    /// The garbage collection policy as the core plans it.
    pub fn retention(&self) -> crate::core::backup_retention::Retention {
        use crate::core::backup_retention::Retention;
        match self.garbage_collection_policy {
            GcPolicy::Exponential => Retention::Exponential,
            GcPolicy::LimitBased => Retention::LimitBased {
                max_backups: self.max_backups.min(MAX_BACKUPS) as usize,
            },
        }
    }

    /// etcd's flags for its history compaction and its quota, which every etcd the driver
    /// starts (own or member of a cluster) gets (defragmentation is the host's, on a
    /// schedule: no flag).
    pub fn etcd_health_flags(&self) -> Vec<String> {
        vec![
            "--auto-compaction-mode".into(),
            self.auto_compaction_mode.as_str().into(),
            "--auto-compaction-retention".into(),
            self.auto_compaction_retention.clone(),
            "--quota-backend-bytes".into(),
            self.quota_backend_bytes.to_string(),
        ]
    }
}

/// Checks `driver.etcd.auto_compaction_retention` as etcd reads it for `mode`: `revision`: a
/// positive number of revisions; `periodic`: a positive number of hours, or a duration of
/// whole numbers with units `h`, `m`, `s` (`30m`, `1h30m`).
fn check_retention(mode: AutoCompactionMode, value: &str) -> Result<(), String> {
    let positive = |digits: &str| digits.parse::<u64>().is_ok_and(|n| n > 0);
    let ok = match mode {
        AutoCompactionMode::Revision => positive(value),
        AutoCompactionMode::Periodic => {
            positive(value) || {
                let mut rest = value;
                let mut any = false;
                let mut well_formed = !rest.is_empty() && rest.len() <= 16;
                while well_formed && !rest.is_empty() {
                    let digits =
                        rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                    let unit = rest[digits..].chars().next();
                    well_formed = digits > 0 && matches!(unit, Some('h' | 'm' | 's'));
                    if well_formed {
                        any |= rest[..digits].parse::<u64>().is_ok_and(|n| n > 0);
                        rest = &rest[digits + 1..];
                    }
                }
                well_formed && any
            }
        }
    };
    if ok {
        Ok(())
    } else {
        Err(match mode {
            AutoCompactionMode::Revision => format!(
                "{value:?}: with auto_compaction_mode = \"revision\", a positive number of revisions"
            ),
            AutoCompactionMode::Periodic => format!(
                "{value:?}: with auto_compaction_mode = \"periodic\", a positive duration such as \"30m\", \"1h30m\" or hours as a number (\"1\")"
            ),
        })
    }
}

/// Most accepted `driver.etcd.max_backups`.
pub const MAX_BACKUPS: u64 = 10_000;
/// Shortest accepted `driver.etcd.garbage_collection_period_ms` (unless 0), as
/// etcd-backup-restore (which does not collect at 1 s or less).
pub const MIN_GC_PERIOD_MS: u64 = 1_001;
/// Accepted `driver.etcd.quota_backend_bytes`: 16 MiB to 64 GiB.
pub const QUOTA_BACKEND_BYTES: std::ops::RangeInclusive<u64> =
    16 * 1024 * 1024..=64 * 1024 * 1024 * 1024;
/// Shortest accepted `driver.etcd.defragmentation_interval_ms` (unless 0): a second (tests).
pub const MIN_DEFRAG_INTERVAL_MS: u64 = 1_000;

/// Shortest accepted `driver.etcd.full_snapshot_interval_ms` and (unless 0)
/// `delta_snapshot_period_ms`.
pub const MIN_ETCD_SNAPSHOT_INTERVAL_MS: u64 = 100;
/// Longest accepted `driver.etcd.full_snapshot_interval_ms`: a week.
pub const MAX_FULL_SNAPSHOT_INTERVAL_MS: u64 = 7 * 24 * 3_600_000;
/// Accepted `driver.etcd.delta_snapshot_memory_limit_bytes`: 64 KiB to 1 GiB.
pub const DELTA_MEMORY_LIMIT_BYTES: std::ops::RangeInclusive<u64> = 64 * 1024..=1024 * 1024 * 1024;

/// The driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriverSettings {
    /// `none`, `exec` or `etcd`.
    pub kind: DriverKind,
    /// `exec`: the long-running command that serves one control plane (argv). It runs under
    /// `ring-guard`, gets SIGTERM when it must stop and SIGKILL `fence_ms` later.
    pub run: Vec<String>,
    /// `exec`: a command run before `run` starts (argv; optional).
    pub on_start: Vec<String>,
    /// `exec`: a command run after the workload stopped or was fenced (argv; optional).
    pub on_stop: Vec<String>,
    /// `exec`: a health check run for each workload before every lease renewal (argv;
    /// optional). Exit 0 means healthy; a control plane counts as serving (phase `running`)
    /// only once it is. Without it, a running workload is healthy.
    pub health: Vec<String>,
    /// Longest a hook may run; it is killed after that.
    pub hook_timeout_ms: u64,
    /// The guard binary (default: `ring-guard` next to `ringd`).
    pub guard: Option<PathBuf>,
    /// The `etcd` driver's settings.
    pub etcd: EtcdDriverSettings,
}

impl Default for DriverSettings {
    fn default() -> Self {
        Self {
            kind: DriverKind::None,
            run: Vec::new(),
            on_start: Vec::new(),
            on_stop: Vec::new(),
            health: Vec::new(),
            hook_timeout_ms: 10_000,
            guard: None,
            etcd: EtcdDriverSettings::default(),
        }
    }
}

/// Who publishes the ring's records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DnsProvider {
    /// Every member serves the zone itself (UDP and TCP on `dns.listen`), from its applied
    /// state; operators delegate the zone to the members with NS records.
    #[default]
    Builtin,
    /// The leader sends TSIG-signed RFC 2136 updates to an external primary (BIND, Knot,
    /// PowerDNS), set in `[dns.rfc2136]`.
    Rfc2136,
    /// Records are computed (`ringctl dns list`) but published nowhere.
    Off,
}

impl DnsProvider {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Builtin => "builtin",
            Self::Rfc2136 => "rfc2136",
            Self::Off => "off",
        }
    }
}

/// The external primary the `rfc2136` provider updates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2136Settings {
    /// The primary's address (`IP:port`), where updates are sent (over TCP).
    pub server: SocketAddr,
    /// The TSIG key (hmac-sha256) as `tsig-keygen` writes it. Relative paths are relative to
    /// the config file's directory.
    pub key_file: PathBuf,
}

/// DNS settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsSettings {
    /// The DNS zone the ring's names live in, e.g. `ring.example.com`: every control plane's
    /// DNS name must lie inside it. Read by the founders when the ring forms and recorded in
    /// the ring; a member's later value is not used. Unset: names are not constrained and
    /// nothing is published.
    pub zone: Option<String>,
    /// TTL of the records the ring publishes, seconds. Low, so clients follow a failover
    /// quickly (DESIGN.md: 5 s on one machine, 30 s across zones). Also the SOA minimum, so
    /// "no such name" is not cached longer than a record.
    pub ttl_s: u32,
    /// Who publishes the records: `builtin` (default), `rfc2136` or `off`.
    pub provider: DnsProvider,
    /// `builtin`: where this member serves the zone, UDP and TCP (e.g. `0.0.0.0:53`). Unset:
    /// this member serves no DNS.
    pub listen: Option<SocketAddr>,
    /// The authoritative servers whose answers the leader checks after each change (status,
    /// `ringctl dns list`). Default: this member's `listen` (builtin) or the rfc2136 server.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify_servers: Vec<SocketAddr>,
    /// The external primary, for `provider = "rfc2136"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rfc2136: Option<Rfc2136Settings>,
    /// How often the leader checks every record on every server and repairs what drifted
    /// (e.g. a server restarted without its journal), in ms. Changes are sent at once.
    pub reconcile_interval_ms: u64,
    /// How long one DNS exchange (update or query) may take, in ms.
    pub timeout_ms: u64,
}

impl Default for DnsSettings {
    fn default() -> Self {
        Self {
            zone: None,
            ttl_s: 30,
            provider: DnsProvider::Builtin,
            listen: None,
            verify_servers: Vec::new(),
            rfc2136: None,
            reconcile_interval_ms: 60_000,
            timeout_ms: 2_000,
        }
    }
}

impl DnsSettings {
    /// The servers to check answers on.
    pub fn servers_to_verify(&self) -> Vec<SocketAddr> {
        if !self.verify_servers.is_empty() {
            return self.verify_servers.clone();
        }
        match self.provider {
            DnsProvider::Builtin => self.listen.into_iter().collect(),
            DnsProvider::Rfc2136 => self.rfc2136.iter().map(|r| r.server).collect(),
            DnsProvider::Off => Vec::new(),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(zone) = &self.zone {
            crate::core::names::check_dns_name(zone)
                .map_err(|why| invalid("dns.zone", format!("{zone:?} {why}")))?;
        }
        crate::core::names::check_ttl(self.ttl_s).map_err(|why| invalid("dns.ttl_s", why))?;
        if !(MIN_DNS_INTERVAL_MS..=MAX_TIMING_MS).contains(&self.reconcile_interval_ms) {
            return Err(invalid(
                "dns.reconcile_interval_ms",
                format!("must be between {MIN_DNS_INTERVAL_MS} and {MAX_TIMING_MS}"),
            ));
        }
        if !(MIN_DNS_INTERVAL_MS..=MAX_DNS_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(invalid(
                "dns.timeout_ms",
                format!("must be between {MIN_DNS_INTERVAL_MS} and {MAX_DNS_TIMEOUT_MS}"),
            ));
        }
        if self.verify_servers.len() > MAX_DNS_SERVERS {
            return Err(invalid(
                "dns.verify_servers",
                format!("at most {MAX_DNS_SERVERS} servers"),
            ));
        }
        match (self.provider, &self.rfc2136) {
            (DnsProvider::Rfc2136, None) => Err(invalid(
                "dns.rfc2136",
                "is required with provider = \"rfc2136\": set server and key_file",
            )),
            (DnsProvider::Rfc2136, Some(_)) if self.zone.is_none() => Err(invalid(
                "dns.zone",
                "is required with provider = \"rfc2136\" (the zone the updates change)",
            )),
            (DnsProvider::Builtin | DnsProvider::Off, Some(_)) => Err(invalid(
                "dns.rfc2136",
                format!(
                    "is set but provider is \"{}\"; set provider = \"rfc2136\" or remove it",
                    self.provider.as_str()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Shortest accepted `dns.reconcile_interval_ms` and `dns.timeout_ms`.
pub const MIN_DNS_INTERVAL_MS: u64 = 100;
/// Longest accepted `dns.timeout_ms`.
pub const MAX_DNS_TIMEOUT_MS: u64 = 60_000;
/// Most `dns.verify_servers`.
pub const MAX_DNS_SERVERS: usize = 16;

/// Object-store access for etcd backups (`[backup]`): how `s3://` locations are reached, and
/// how many objects a copy between locations moves at once. `gs://` and `az://` locations
/// take their settings and credentials from the standard Google and Azure environment
/// variables; `file://` needs none.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupSettings {
    /// The S3 API endpoint, e.g. `http://127.0.0.1:9000` for a local S3 server. Unset: AWS
    /// itself (or `AWS_ENDPOINT` from the environment when no credentials file is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s3_endpoint: Option<String>,
    /// The S3 region (default `us-east-1`).
    pub s3_region: String,
    /// Allow plain `http://` endpoints (no TLS). Only for a loopback or lab S3 server.
    pub s3_allow_http: bool,
    /// Address buckets as `https://<bucket>.<endpoint>` (virtual-hosted style) instead of
    /// `https://<endpoint>/<bucket>` (path style, the default, which local S3 servers expect).
    pub s3_virtual_hosted_style: bool,
    /// A small TOML file with the S3 credentials (`access_key_id`, `secret_access_key`,
    /// optional `session_token`), at most 64 KiB, mode 0600 recommended. Relative paths are
    /// relative to the config file's directory. Unset: the standard AWS environment variables
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web identity, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<PathBuf>,
    /// How many objects a copy between two locations moves at once (1 to
    /// [`MAX_COPY_PARALLELISM`]). Each streamed object holds up to three 8 MiB parts in memory.
    pub copy_parallelism: usize,
}

impl Default for BackupSettings {
    fn default() -> Self {
        Self {
            s3_endpoint: None,
            s3_region: "us-east-1".into(),
            s3_allow_http: false,
            s3_virtual_hosted_style: false,
            credentials_file: None,
            copy_parallelism: 4,
        }
    }
}

impl std::fmt::Debug for BackupSettings {
    /// Written out by hand so nothing added here later can print a secret by accident; the
    /// credentials file is named, never read.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupSettings")
            .field("s3_endpoint", &self.s3_endpoint)
            .field("s3_region", &self.s3_region)
            .field("s3_allow_http", &self.s3_allow_http)
            .field("s3_virtual_hosted_style", &self.s3_virtual_hosted_style)
            .field("credentials_file", &self.credentials_file)
            .field("copy_parallelism", &self.copy_parallelism)
            .finish()
    }
}

/// Most objects a backup copy moves at once (`backup.copy_parallelism`).
pub const MAX_COPY_PARALLELISM: usize = 64;
/// Longest `backup.s3_region`.
pub const MAX_S3_REGION_LEN: usize = 64;

impl BackupSettings {
    /// Checks the values (the credentials file is read when a location is opened, not here).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.s3_endpoint {
            check_s3_endpoint(endpoint).map_err(|why| invalid("backup.s3_endpoint", why))?;
            if endpoint.starts_with("http://") && !self.s3_allow_http {
                return Err(invalid(
                    "backup.s3_endpoint",
                    format!(
                        "{endpoint:?} is plain http; set s3_allow_http = true to allow it (no TLS: only for a loopback or lab server)"
                    ),
                ));
            }
        }
        let region = &self.s3_region;
        if region.is_empty()
            || region.len() > MAX_S3_REGION_LEN
            || !region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "backup.s3_region",
                format!(
                    "{:?} must be 1 to {MAX_S3_REGION_LEN} lower-case letters, digits and '-', like us-east-1",
                    crate::core::error::shorten(region)
                ),
            ));
        }
        if self
            .credentials_file
            .as_ref()
            .is_some_and(|file| file.as_os_str().is_empty())
        {
            return Err(invalid("backup.credentials_file", "must not be empty"));
        }
        if !(1..=MAX_COPY_PARALLELISM).contains(&self.copy_parallelism) {
            return Err(invalid(
                "backup.copy_parallelism",
                format!("must be between 1 and {MAX_COPY_PARALLELISM}"),
            ));
        }
        Ok(())
    }
}

/// `http(s)://host[:port][/path]`, printable ASCII, without credentials, query or fragment.
fn check_s3_endpoint(endpoint: &str) -> Result<(), Invalid> {
    if endpoint.len() > crate::core::limits::MAX_URL_LEN {
        return Err(Invalid(format!(
            "must be at most {} characters",
            crate::core::limits::MAX_URL_LEN
        )));
    }
    if !endpoint.bytes().all(|b| b.is_ascii_graphic()) || endpoint.contains('\\') {
        return Err("must be printable ASCII without whitespace or backslashes".into());
    }
    if endpoint.contains(['@', '?', '#']) {
        // Echo nothing: the part before '@' may be a secret.
        return Err(
            "must not contain '@', '?' or '#' (credentials belong in credentials_file or the environment)"
                .into(),
        );
    }
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .ok_or_else(|| Invalid(format!("{endpoint:?} must start with http:// or https://")))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(Invalid(format!("{endpoint:?} names no host")));
    }
    Ok(())
}

/// Mutual TLS for both ports (see `ringctl certs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The CA bundle, this member's certificate and its key. Relative paths are relative to
    /// the config file's directory.
    #[serde(flatten)]
    pub files: TlsFiles,
    /// How often the three files are checked for changes, which are then loaded without a
    /// restart.
    #[serde(default = "default_reload_interval_ms")]
    pub reload_interval_ms: u64,
}

fn default_reload_interval_ms() -> u64 {
    1_000
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Shortest accepted `tls.reload_interval_ms`.
pub const MIN_RELOAD_INTERVAL_MS: u64 = 100;

/// The whole configuration of one `ringd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Raft node id of this member; never reused in the ring.
    pub id: NodeId,
    /// Member name (DNS-1123 label).
    pub name: String,
    /// Failure zone (DNS-1123 label).
    pub zone: String,
    /// Directory for the Raft log, vote and snapshots.
    pub data_dir: PathBuf,
    /// Address the peer (Raft) service binds.
    pub listen_peer: SocketAddr,
    /// Address the Admin service binds.
    pub listen_admin: SocketAddr,
    /// Peer address other members use; defaults to `listen_peer`.
    #[serde(default)]
    pub advertise_peer: Option<String>,
    /// Admin address clients and members use; defaults to `listen_admin`.
    #[serde(default)]
    pub advertise_admin: Option<String>,
    /// The members that form the ring on first start (like etcd's `--initial-cluster`). Ignored
    /// once the data directory holds a ring. Empty for a member that joins with
    /// `ringctl member add`.
    #[serde(default)]
    pub initial_members: Vec<InitialMember>,
    /// Timings.
    #[serde(default)]
    pub timing: Timing,
    /// Snapshots.
    #[serde(default)]
    pub snapshot: SnapshotSettings,
    /// Logging.
    #[serde(default)]
    pub log: LogSettings,
    /// DNS.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dns: DnsSettings,
    /// Placement policy.
    #[serde(default)]
    pub placement: PlacementSettings,
    /// How control planes are run.
    #[serde(default)]
    pub driver: DriverSettings,
    /// The HTTP endpoint for metrics and probes.
    #[serde(default, skip_serializing_if = "is_default")]
    pub metrics: MetricsSettings,
    /// Limits per Admin API client.
    #[serde(default, skip_serializing_if = "is_default")]
    pub admin: AdminSettings,
    /// Object-store access for etcd backups.
    #[serde(default, skip_serializing_if = "is_default")]
    pub backup: BackupSettings,
    /// Rolling upgrades: when the ring's version is raised, when a mixed ring is reported.
    #[serde(default, skip_serializing_if = "is_default")]
    pub upgrade: UpgradeSettings,
    /// Mutual TLS on both ports. Required unless `insecure = true`.
    #[serde(default)]
    pub tls: Option<TlsSettings>,
    /// Run without TLS: no encryption and no authentication on either port. Only for a ring on
    /// one machine or a lab network; `ringd` warns at start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

/// When the leader raises the ring's version (see [`crate::core::ring_version`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Finalize {
    /// As soon as every member runs a binary that supports the next version (unless
    /// `ringctl upgrade hold` holds it).
    #[default]
    Auto,
    /// Only on `ringctl upgrade finalize`: until then any member can go back to the previous
    /// release's binary. The hold for an upgrade from release 0.1.0, which knows no
    /// `ringctl upgrade hold`; use the same value on every member.
    Manual,
}

/// Rolling-upgrade settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeSettings {
    /// `auto` (default) or `manual`.
    pub finalize: Finalize,
    /// A ring whose members run binaries of different releases for longer than this is
    /// reported (`garden_ring_ring_mixed_too_long`, alert `GardenRingMixedVersions`): a
    /// rolling upgrade left half done.
    pub mixed_alert_after_ms: u64,
}

/// Default of `upgrade.mixed_alert_after_ms`: one hour.
pub const DEFAULT_MIXED_ALERT_AFTER_MS: u64 = 3_600_000;

impl Default for UpgradeSettings {
    fn default() -> Self {
        Self {
            finalize: Finalize::Auto,
            mixed_alert_after_ms: DEFAULT_MIXED_ALERT_AFTER_MS,
        }
    }
}

/// Longest `upgrade.mixed_alert_after_ms` accepted: a week.
pub const MAX_MIXED_ALERT_AFTER_MS: u64 = 7 * 24 * 3_600_000;

/// Longest `log.level` accepted, bytes.
pub const MAX_LOG_FILTER_BYTES: usize = 1024;

/// Refuses what `tracing`'s filter would take unbounded time and memory to compile: a field
/// filter with a value (`target[span{field=value}]=level`) turns the value into a regular
/// expression compiled to a DFA, whose size can grow exponentially with the pattern (the config
/// fuzz target found one that took minutes and gigabytes). Targets, levels, spans and a
/// field's presence (`[{field}]`) stay.
fn check_log_filter(level: &str) -> Result<(), ConfigError> {
    if level.len() > MAX_LOG_FILTER_BYTES {
        return Err(invalid(
            "log.level",
            format!(
                "is {} bytes long, more than {MAX_LOG_FILTER_BYTES}",
                level.len()
            ),
        ));
    }
    let mut depth = 0usize;
    for c in level.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            '=' if depth > 0 => {
                return Err(invalid(
                    "log.level",
                    format!(
                        "{level:?}: field filters with a value ({{field=value}}) are not \
                         accepted: the value is compiled into a regular expression of unbounded \
                         size; filter on targets and levels, or on a field's presence \
                         ({{field}})"
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

impl Config {
    /// Reads and parses `path` (without validating; see [`Config::validate`]).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(path, &text)?;
        if let (Some(tls), Some(dir)) = (&mut config.tls, path.parent()) {
            tls.files = tls.files.relative_to(dir);
        }
        if let (Some(rfc2136), Some(dir)) = (&mut config.dns.rfc2136, path.parent()) {
            rfc2136.key_file = dir.join(&rfc2136.key_file);
        }
        if let (Some(file), Some(dir)) = (&mut config.backup.credentials_file, path.parent()) {
            *file = dir.join(&*file);
        }
        Ok(config)
    }

    /// Parses TOML text; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " "),
        })
    }

    /// Renders the configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config always serializes")
    }

    /// Peer address to advertise.
    pub fn peer_address(&self) -> String {
        self.advertise_peer
            .clone()
            .unwrap_or_else(|| self.listen_peer.to_string())
    }

    /// Admin address to advertise.
    pub fn admin_address(&self) -> String {
        self.advertise_admin
            .clone()
            .unwrap_or_else(|| self.listen_admin.to_string())
    }

    /// This member as a [`MemberSpec`].
    pub fn member_spec(&self) -> MemberSpec {
        MemberSpec {
            id: self.id,
            name: self.name.clone(),
            zone: self.zone.clone(),
            address: self.peer_address(),
            admin_address: self.admin_address(),
        }
    }

    /// Checks that the configuration can work; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.upgrade.mixed_alert_after_ms > MAX_MIXED_ALERT_AFTER_MS {
            return Err(invalid(
                "upgrade.mixed_alert_after_ms",
                format!("must be at most {MAX_MIXED_ALERT_AFTER_MS} (a week)"),
            ));
        }
        if self.id == 0 {
            return Err(invalid("id", "must be at least 1"));
        }
        check_label(&self.name).map_err(|why| invalid("name", format!("{:?} {why}", self.name)))?;
        check_label(&self.zone).map_err(|why| invalid("zone", format!("{:?} {why}", self.zone)))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        if self.listen_peer == self.listen_admin {
            return Err(invalid("listen_admin", "must differ from listen_peer"));
        }
        for (field, listen, advertise) in [
            ("advertise_peer", self.listen_peer, &self.advertise_peer),
            ("advertise_admin", self.listen_admin, &self.advertise_admin),
        ] {
            match advertise {
                Some(a) => {
                    check_address(a).map_err(|why| invalid(field, format!("{a:?} {why}")))?
                }
                None if listen.ip().is_unspecified() => {
                    return Err(invalid(
                        field,
                        format!(
                            "must be set when listening on {listen} (other members cannot dial an unspecified address)"
                        ),
                    ));
                }
                None => {}
            }
        }
        // What this member will advertise must be what the ring accepts from a member (a port
        // of 0, an IPv6 scope, or one address for both services would be refused at
        // registration, after start).
        self.member_spec().validate().map_err(|e| {
            let field = match &e {
                crate::core::CommandError::Invalid { field, .. } if field.contains("admin") => {
                    "advertise_admin"
                }
                _ => "advertise_peer",
            };
            invalid(field, e.to_string())
        })?;
        self.validate_timing()?;
        self.validate_initial_members()?;
        if self.driver.kind == DriverKind::Exec && self.driver.run.is_empty() {
            return Err(invalid(
                "driver.run",
                "must name the command that serves a control plane when kind = \"exec\"",
            ));
        }
        if self.driver.hook_timeout_ms == 0 {
            return Err(invalid("driver.hook_timeout_ms", "must be at least 1"));
        }
        self.validate_etcd_driver()?;
        self.dns.validate()?;
        self.backup.validate()?;
        self.admin.validate()?;
        match (&self.tls, self.insecure) {
            (None, false) => {
                return Err(invalid(
                    "tls",
                    "is required: set [tls] ca_file, cert_file and key_file (make them with `ringctl certs init`), \
                     or set insecure = true to run without TLS (no encryption, no authentication)",
                ));
            }
            (Some(_), true) => {
                return Err(invalid(
                    "insecure",
                    "must not be true when [tls] is set; remove one of them",
                ));
            }
            (Some(tls), false) if tls.reload_interval_ms < MIN_RELOAD_INTERVAL_MS => {
                return Err(invalid(
                    "tls.reload_interval_ms",
                    format!("must be at least {MIN_RELOAD_INTERVAL_MS}"),
                ));
            }
            _ => {}
        }
        if self.snapshot.every_entries == 0 {
            return Err(invalid("snapshot.every_entries", "must be at least 1"));
        }
        check_log_filter(&self.log.level)?;
        self.log
            .level
            .parse::<tracing_subscriber::EnvFilter>()
            .map_err(|e| invalid("log.level", format!("{:?}: {e}", self.log.level)))?;
        Ok(())
    }

    fn validate_etcd_driver(&self) -> Result<(), ConfigError> {
        let etcd = &self.driver.etcd;
        let full = etcd.full_snapshot_interval_ms;
        if !(MIN_ETCD_SNAPSHOT_INTERVAL_MS..=MAX_FULL_SNAPSHOT_INTERVAL_MS).contains(&full) {
            return Err(invalid(
                "driver.etcd.full_snapshot_interval_ms",
                format!(
                    "{full} must be between {MIN_ETCD_SNAPSHOT_INTERVAL_MS} and {MAX_FULL_SNAPSHOT_INTERVAL_MS} (a week)"
                ),
            ));
        }
        let delta = etcd.delta_snapshot_period_ms;
        if delta != 0 && !(MIN_ETCD_SNAPSHOT_INTERVAL_MS..=MAX_TIMING_MS).contains(&delta) {
            return Err(invalid(
                "driver.etcd.delta_snapshot_period_ms",
                format!(
                    "{delta} must be 0 (no delta snapshots) or between {MIN_ETCD_SNAPSHOT_INTERVAL_MS} and {MAX_TIMING_MS} (one hour)"
                ),
            ));
        }
        let limit = etcd.delta_snapshot_memory_limit_bytes;
        if !DELTA_MEMORY_LIMIT_BYTES.contains(&limit) {
            return Err(invalid(
                "driver.etcd.delta_snapshot_memory_limit_bytes",
                format!(
                    "{limit} must be between {} (64 KiB) and {} (1 GiB)",
                    DELTA_MEMORY_LIMIT_BYTES.start(),
                    DELTA_MEMORY_LIMIT_BYTES.end()
                ),
            ));
        }
        if !(1..=MAX_BACKUPS).contains(&etcd.max_backups) {
            return Err(invalid(
                "driver.etcd.max_backups",
                format!(
                    "{} must be between 1 and {MAX_BACKUPS} (the newest full snapshot is always kept)",
                    etcd.max_backups
                ),
            ));
        }
        let gc = etcd.garbage_collection_period_ms;
        if gc != 0 && !(MIN_GC_PERIOD_MS..=MAX_FULL_SNAPSHOT_INTERVAL_MS).contains(&gc) {
            return Err(invalid(
                "driver.etcd.garbage_collection_period_ms",
                format!(
                    "{gc} must be 0 (no garbage collection) or between {MIN_GC_PERIOD_MS} and {MAX_FULL_SNAPSHOT_INTERVAL_MS} (a week)"
                ),
            ));
        }
        let quota = etcd.quota_backend_bytes;
        if !QUOTA_BACKEND_BYTES.contains(&quota) {
            return Err(invalid(
                "driver.etcd.quota_backend_bytes",
                format!(
                    "{quota} must be between {} (16 MiB) and {} (64 GiB)",
                    QUOTA_BACKEND_BYTES.start(),
                    QUOTA_BACKEND_BYTES.end()
                ),
            ));
        }
        let defrag = etcd.defragmentation_interval_ms;
        if defrag != 0
            && !(MIN_DEFRAG_INTERVAL_MS..=MAX_FULL_SNAPSHOT_INTERVAL_MS).contains(&defrag)
        {
            return Err(invalid(
                "driver.etcd.defragmentation_interval_ms",
                format!(
                    "{defrag} must be 0 (never) or between {MIN_DEFRAG_INTERVAL_MS} and {MAX_FULL_SNAPSHOT_INTERVAL_MS} (a week)"
                ),
            ));
        }
        check_retention(etcd.auto_compaction_mode, &etcd.auto_compaction_retention)
            .map_err(|why| invalid("driver.etcd.auto_compaction_retention", why))?;
        for (field, value, min) in [
            ("driver.etcd.start_timeout_ms", etcd.start_timeout_ms, 1),
            ("driver.etcd.restore_timeout_ms", etcd.restore_timeout_ms, 1),
        ] {
            if value < min || value > MAX_TIMING_MS {
                return Err(invalid(
                    field,
                    format!("{value} must be between {min} and {MAX_TIMING_MS} (one hour)"),
                ));
            }
        }
        if self.driver.kind != DriverKind::Etcd {
            return Ok(());
        }
        let bin_dir = self.etcd_bin_dir()?;
        if !bin_dir.join("etcd").is_file() {
            return Err(invalid(
                "driver.etcd.bin_dir",
                format!(
                    "{} has no etcd (on Debian: apt-get install etcd-server etcd-client)",
                    bin_dir.display()
                ),
            ));
        }
        if !bin_dir.join("etcdutl").is_file() && !bin_dir.join("etcdctl").is_file() {
            return Err(invalid(
                "driver.etcd.bin_dir",
                format!(
                    "{} has neither etcdutl (etcd 3.5+) nor etcdctl (3.4) to restore snapshots with (on Debian: apt-get install etcd-client)",
                    bin_dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// The directory of the etcd binaries the `etcd` driver runs: `driver.etcd.bin_dir`, or
    /// that of the first `etcd` on `PATH`.
    pub fn etcd_bin_dir(&self) -> Result<PathBuf, ConfigError> {
        if let Some(dir) = &self.driver.etcd.bin_dir {
            return Ok(dir.clone());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .find(|dir| dir.join("etcd").is_file())
            .ok_or_else(|| {
                invalid(
                    "driver.etcd.bin_dir",
                    "is unset and no etcd is on PATH (on Debian: apt-get install etcd-server etcd-client)",
                )
            })
    }

    /// Where the `etcd` driver keeps its data directories.
    pub fn etcd_data_root(&self) -> PathBuf {
        self.driver
            .etcd
            .data_root
            .clone()
            .unwrap_or_else(|| self.data_dir.join("etcd"))
    }

    fn validate_timing(&self) -> Result<(), ConfigError> {
        let t = &self.timing;
        for (field, value) in [
            ("timing.heartbeat_ms", t.heartbeat_ms),
            ("timing.election_timeout_min_ms", t.election_timeout_min_ms),
            ("timing.election_timeout_max_ms", t.election_timeout_max_ms),
            ("timing.member_suspect_ms", t.member_suspect_ms),
            ("timing.member_lost_ms", t.member_lost_ms),
            ("timing.lease_ms", t.lease_ms),
            ("timing.fence_ms", t.fence_ms),
            ("timing.clock_margin_ms", t.clock_margin_ms),
        ] {
            if value > MAX_TIMING_MS {
                return Err(invalid(
                    field,
                    format!("{value} is more than {MAX_TIMING_MS} (one hour)"),
                ));
            }
        }
        if t.heartbeat_ms == 0 {
            return Err(invalid("timing.heartbeat_ms", "must be at least 1"));
        }
        if t.election_timeout_min_ms < 3 * t.heartbeat_ms {
            return Err(invalid(
                "timing.election_timeout_min_ms",
                format!(
                    "{} must be at least 3 x heartbeat_ms ({}), or followers start elections between heartbeats",
                    t.election_timeout_min_ms, t.heartbeat_ms
                ),
            ));
        }
        if t.election_timeout_max_ms <= t.election_timeout_min_ms {
            return Err(invalid(
                "timing.election_timeout_max_ms",
                "must be greater than election_timeout_min_ms (the randomized range avoids split votes)",
            ));
        }
        if t.member_suspect_ms < t.election_timeout_max_ms {
            return Err(invalid(
                "timing.member_suspect_ms",
                "must be at least election_timeout_max_ms",
            ));
        }
        if t.member_lost_ms <= t.member_suspect_ms {
            return Err(invalid(
                "timing.member_lost_ms",
                "must be greater than member_suspect_ms",
            ));
        }
        if t.lease_ms < 4 * t.heartbeat_ms {
            return Err(invalid(
                "timing.lease_ms",
                format!(
                    "{} must be at least 4 x heartbeat_ms ({}): a member renews its lease several times per lease",
                    t.lease_ms, t.heartbeat_ms
                ),
            ));
        }
        if t.fence_ms == 0 {
            return Err(invalid("timing.fence_ms", "must be at least 1"));
        }
        let bound = t.lease_ms + t.fence_ms + t.clock_margin_ms;
        if t.member_lost_ms <= bound {
            return Err(invalid(
                "timing.member_lost_ms",
                format!(
                    "{} must be greater than lease_ms + fence_ms + clock_margin_ms = {bound}: otherwise a control plane could move while its old host still serves it",
                    t.member_lost_ms
                ),
            ));
        }
        Ok(())
    }

    fn validate_initial_members(&self) -> Result<(), ConfigError> {
        if self.initial_members.is_empty() {
            return Ok(());
        }
        let mut ids = BTreeSet::new();
        let mut names = BTreeSet::new();
        for (i, m) in self.initial_members.iter().enumerate() {
            let field = format!("initial_members[{i}]");
            MemberSpec::from(m)
                .validate()
                .map_err(|e| invalid(&field, e.to_string()))?;
            if !ids.insert(m.id) {
                return Err(invalid(&field, format!("member id {} appears twice", m.id)));
            }
            if !names.insert(m.name.as_str()) {
                return Err(invalid(
                    &field,
                    format!("member name {:?} appears twice", m.name),
                ));
            }
        }
        let me = self
            .initial_members
            .iter()
            .find(|m| m.id == self.id)
            .ok_or_else(|| {
                invalid(
                    "initial_members",
                    format!(
                        "does not list this member (id {}); list every founding member, this one included, or leave it empty to join an existing ring",
                        self.id
                    ),
                )
            })?;
        let mine = self.member_spec();
        if me.name != mine.name
            || me.zone != mine.zone
            || me.address != mine.address
            || me.admin_address != mine.admin_address
        {
            return Err(invalid(
                "initial_members",
                format!(
                    "the entry for id {} ({} {} {} {}) does not match this member's name, zone and advertised addresses ({} {} {} {})",
                    me.id,
                    me.name,
                    me.zone,
                    me.address,
                    me.admin_address,
                    mine.name,
                    mine.zone,
                    mine.address,
                    mine.admin_address
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
id = 1
name = "a"
zone = "zone-a"
data_dir = "/tmp/ring-a"
listen_peer = "127.0.0.1:7401"
listen_admin = "127.0.0.1:7400"

[[initial_members]]
id = 1
name = "a"
zone = "zone-a"
address = "127.0.0.1:7401"
admin_address = "127.0.0.1:7400"

[[initial_members]]
id = 2
name = "b"
zone = "zone-b"
address = "127.0.0.1:7411"
admin_address = "127.0.0.1:7410"

[tls]
ca_file = "/etc/ring/ca.pem"
cert_file = "/etc/ring/member-a.pem"
key_file = "/etc/ring/member-a-key.pem"

[timing]
heartbeat_ms = 50
election_timeout_min_ms = 150
election_timeout_max_ms = 300
member_suspect_ms = 1000
member_lost_ms = 2000
lease_ms = 1000
fence_ms = 500
clock_margin_ms = 200
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let c = Config::parse(Path::new("test.toml"), text)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn good_config_parses_and_round_trips() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.initial_members.len(), 2);
        assert_eq!(c.snapshot, SnapshotSettings::default());
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn upgrade_settings_parse_and_bad_ones_are_named() {
        let c = parse(&format!("{GOOD}\n[upgrade]\nfinalize = \"manual\"\n")).unwrap();
        assert_eq!(c.upgrade.finalize, Finalize::Manual);
        assert!(c.to_toml().contains("finalize = \"manual\""));
        // A default section is not written: a config for release 0.1.0 stays readable by it.
        assert!(!parse(GOOD).unwrap().to_toml().contains("[upgrade]"));
        let e = parse(&format!("{GOOD}\n[upgrade]\nfinalize = \"later\"\n")).unwrap_err();
        assert!(e.to_string().contains("finalize"), "{e}");
        let e = parse(&format!(
            "{GOOD}\n[upgrade]\nmixed_alert_after_ms = 999999999999\n"
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("upgrade.mixed_alert_after_ms"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            (GOOD.replace("id = 1\nname", "id = 0\nname"), "id"),
            (
                GOOD.replace(
                    "name = \"a\"\nzone = \"zone-a\"\ndata",
                    "name = \"A\"\nzone = \"zone-a\"\ndata",
                ),
                "name",
            ),
            (
                GOOD.replace(
                    "listen_admin = \"127.0.0.1:7400\"",
                    "listen_admin = \"127.0.0.1:7401\"",
                ),
                "listen_admin",
            ),
            (
                GOOD.replace(
                    "listen_peer = \"127.0.0.1:7401\"",
                    "listen_peer = \"0.0.0.0:7401\"",
                ),
                "advertise_peer",
            ),
            (
                GOOD.replace(
                    "election_timeout_min_ms = 150",
                    "election_timeout_min_ms = 100",
                ),
                "timing.election_timeout_min_ms",
            ),
            (GOOD.replace("id = 2", "id = 1"), "initial_members[1]"),
            (
                GOOD.replace("name = \"b\"", "name = \"a\""),
                "initial_members[1]",
            ),
            (
                GOOD.replace("address = \"127.0.0.1:7411\"", "address = \"nope\""),
                "initial_members[1]",
            ),
            (
                GOOD.replace("zone = \"zone-a\"\naddress", "zone = \"zone-x\"\naddress"),
                "initial_members",
            ),
            (
                GOOD.replace("[tls]", "[notls]")
                    .replace("ca_file", "#")
                    .replace("cert_file", "#")
                    .replace("key_file", "#")
                    .replace("[notls]", ""),
                "tls",
            ),
            (format!("insecure = true\n{GOOD}"), "insecure"),
            (format!("{GOOD}\n[dns]\nzone = \"bad zone\"\n"), "dns.zone"),
            (format!("{GOOD}\n[dns]\nttl_s = 0\n"), "dns.ttl_s"),
            (format!("{GOOD}\n[dns]\nttl_s = 9999999\n"), "dns.ttl_s"),
            (
                format!("{GOOD}\n[dns]\nzone = \"r.test\"\nprovider = \"rfc2136\"\n"),
                "dns.rfc2136",
            ),
            (
                format!(
                    "{GOOD}\n[dns]\nprovider = \"rfc2136\"\n[dns.rfc2136]\nserver = \"127.0.0.1:53\"\nkey_file = \"k\"\n"
                ),
                "dns.zone",
            ),
            (
                format!(
                    "{GOOD}\n[dns]\n[dns.rfc2136]\nserver = \"127.0.0.1:53\"\nkey_file = \"k\"\n"
                ),
                "dns.rfc2136",
            ),
            (format!("{GOOD}\n[dns]\ntimeout_ms = 0\n"), "dns.timeout_ms"),
            (
                format!("{GOOD}\n[dns]\nreconcile_interval_ms = 1\n"),
                "dns.reconcile_interval_ms",
            ),
            (
                GOOD.replace("heartbeat_ms = 50", "heartbeat_ms = 9223372036854775807"),
                "timing.heartbeat_ms",
            ),
            (
                GOOD.replace("lease_ms = 1000", "lease_ms = 1400"),
                "timing.member_lost_ms",
            ),
            (GOOD.replace("lease_ms = 1000", "lease_ms = 100"), "timing.lease_ms"),
            (
                GOOD.replace(
                    "listen_peer = \"127.0.0.1:7401\"",
                    "listen_peer = \"127.0.0.1:0\"",
                ),
                "advertise_peer",
            ),
            (
                GOOD.replace(
                    "listen_admin = \"127.0.0.1:7400\"",
                    "listen_admin = \"127.0.0.1:7400\"\nadvertise_peer = \"10.0.0.1:7400\"\nadvertise_admin = \"10.0.0.1:7400\"",
                ),
                "advertise_admin",
            ),
            (
                format!("{GOOD}\n[backup]\ns3_endpoint = \"ftp://127.0.0.1:9000\"\n"),
                "backup.s3_endpoint",
            ),
            (
                format!("{GOOD}\n[backup]\ns3_endpoint = \"http://127.0.0.1:9000\"\n"),
                "backup.s3_endpoint",
            ),
            (
                format!(
                    "{GOOD}\n[backup]\ns3_endpoint = \"https://key:secret@s3.example.com\"\n"
                ),
                "backup.s3_endpoint",
            ),
            (
                format!("{GOOD}\n[backup]\ns3_endpoint = \"https://\"\n"),
                "backup.s3_endpoint",
            ),
            (
                format!("{GOOD}\n[backup]\ns3_endpoint = \"https://s3 .example.com\"\n"),
                "backup.s3_endpoint",
            ),
            (format!("{GOOD}\n[backup]\ns3_region = \"\"\n"), "backup.s3_region"),
            (
                format!("{GOOD}\n[backup]\ns3_region = \"US East\"\n"),
                "backup.s3_region",
            ),
            (
                format!("{GOOD}\n[backup]\ncredentials_file = \"\"\n"),
                "backup.credentials_file",
            ),
            (
                format!("{GOOD}\n[backup]\ncopy_parallelism = 0\n"),
                "backup.copy_parallelism",
            ),
            (
                format!("{GOOD}\n[backup]\ncopy_parallelism = 65\n"),
                "backup.copy_parallelism",
            ),
        ];
        for (text, field) in cases {
            match parse(&text) {
                Err(ConfigError::Invalid { field: got, why }) => assert_eq!(got, field, "{why}"),
                other => panic!("expected invalid {field}, got {other:?}"),
            }
        }
    }

    #[test]
    fn backup_settings_parse_resolve_and_never_echo_secrets() {
        let c = parse(&format!(
            "{GOOD}\n[backup]\ns3_endpoint = \"http://127.0.0.1:9000\"\ns3_allow_http = true\ncredentials_file = \"s3.toml\"\ncopy_parallelism = 64\n"
        ))
        .unwrap();
        assert_eq!(c.backup.s3_region, "us-east-1");
        assert!(!c.backup.s3_virtual_hosted_style);
        assert_eq!(c.backup.copy_parallelism, 64);
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        // A default [backup] is not written out.
        assert!(!parse(GOOD).unwrap().to_toml().contains("[backup]"));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ringd.toml");
        std::fs::write(
            &path,
            format!("{GOOD}\n[backup]\ncredentials_file = \"s3.toml\"\n"),
        )
        .unwrap();
        let loaded = Config::load(&path).unwrap();
        assert_eq!(
            loaded.backup.credentials_file,
            Some(dir.path().join("s3.toml"))
        );

        let err = parse(&format!(
            "{GOOD}\n[backup]\ns3_endpoint = \"https://AKIDEXAMPLE:hunter2@s3.example.com\"\n"
        ))
        .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(matches!(
            parse(&format!("{GOOD}\n[backup]\ns3_endpont = \"x\"\n")),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn syntax_errors_and_unknown_fields_are_refused() {
        for text in [
            "id = ",
            &GOOD.replace("zone = \"zone-a\"\ndata_dir", "zoen = \"zone-a\"\ndata_dir"),
            &GOOD.replace("[timing]", "[timing]\nheartbeat = 5"),
            "id = \"one\"",
            "\u{0}\u{1}garbage",
        ] {
            match parse(text) {
                Err(ConfigError::Parse { message, .. }) => assert!(!message.is_empty()),
                other => panic!("expected a parse error for {text:?}, got {other:?}"),
            }
        }
        let err = Config::load(Path::new("/nonexistent/ringd.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}

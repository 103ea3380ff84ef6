//! The real etcd-backup-restore (`etcdbrctl` v0.43.0, Gardener's backup sidecar) as a test peer:
//! it writes backups that garden-ring must read and reads backups that garden-ring must write.
//! See `../shared/tools/etcd-backup-restore/README.md` beside the binary for how it was built.
//!
//! - Found by [`find_etcdbrctl`]: `$ETCDBRCTL`, else `../shared/tools/etcd-backup-restore/
//!   etcdbrctl` from the workspace root. [`require_etcdbrctl`] fails the test under `CI=true`
//!   when it is missing and skips it elsewhere, printing why.
//! - [`Store`]: where it keeps a backup, `--storage-provider=Local` or `S3` (on `moto_server`),
//!   with the flags and environment each needs, the same place as a garden-ring backup URL
//!   ([`Store::url`], [`Store::settings`]) and a listing of its `v2/` objects.
//! - [`Snapshotter`]: `etcdbrctl snapshot` against an etcd (a full snapshot at once, then a delta
//!   every `--delta-snapshot-period`), or `etcdbrctl server` in a network namespace of its own
//!   for a `.final` full snapshot ([`Snapshotter::take_final_full`]); waits for what it saved
//!   (condition and deadline, never a fixed sleep); stops with SIGTERM.
//! - [`restore`] (`etcdbrctl restore` into a fresh data directory) and [`copy`] (`etcdbrctl
//!   copy` between two Local containers), each returning its log, also on failure.
//! - [`decode_delta`]: the events of a delta (`Incr-`) object, checksum verified.
//!
//! Quirks found running it (each is handled here):
//!
//! - **Local layout**: objects land in `$HOME/<container>/<prefix>/v2/<name>`; the container is
//!   joined under `$HOME` even when absolute, so every Local command runs with `HOME=<dir>`, and
//!   the two Local containers of one `copy` share that `HOME`. The Local store writes an object
//!   in place (create, copy, fsync; no temporary name), so an object being written is already
//!   listed: [`Snapshotter`] counts an object only once its log says `Successfully saved ...`.
//! - **S3 configuration** (v0.43.0 uses aws-sdk-go-v2): the credentials must come from a file,
//!   `AWS_APPLICATION_CREDENTIALS_JSON=<file>` (`{"accessKeyID","secretAccessKey","region"}`) or
//!   `AWS_APPLICATION_CREDENTIALS=<dir>` (one file per field). With only `AWS_ACCESS_KEY_ID` & co.
//!   in the environment the store opens, but the first full snapshot fails: "error checking the
//!   modification time of the access credentials  no environment variable set for the AWS
//!   credential file". The endpoint is `--store-endpoint-override=http://127.0.0.1:PORT`; an
//!   `endpoint` in the credentials still works but logs "Passing endpoint override through the
//!   credential file is now deprecated". An IP endpoint is addressed path-style without
//!   `s3ForcePathStyle` (set anyway). Files in the credentials directory are read verbatim: a
//!   trailing newline breaks them (`strconv.ParseBool: parsing "true\n"`).
//! - **`AWS_CA_BUNDLE`** in the environment (set on this machine) makes every S3 command with a
//!   credentials file die at start: "new AWS config failed: unable to add custom RootCAs
//!   HTTPClient, has no WithTransportOptions, *http.Client". Every `AWS_*` variable of the test's
//!   environment is removed before running it.
//! - **`etcdbrctl server`** needs `ETCD_CONF` (an etcd config YAML whose
//!   `initial-advertise-peer-urls` and `advertise-client-urls` are *maps* from member name to
//!   URLs, etcd-druid's format: a plain string logs "cannot unmarshal string into Go struct field
//!   .advertise-client-urls of type map[string][]string"), `POD_NAME` (the member name) and
//!   `POD_NAMESPACE`. It listens on `*:<--server-port>`, so it runs in a [`Netns`] whose
//!   loopback forwards to the etcd (and moto) outside; the `.final` full snapshot is one
//!   `GET /snapshot/full?final=true` sent inside the namespace, answered once it is saved.
//! - The full snapshot's name carries the revision of a `Get` made *before* the snapshot (a
//!   comment in its snapshotter says so): writes racing the full snapshot can be in its data
//!   but after its name's revision. The workloads here wait for the full snapshot to be saved
//!   before writing.
//! - **`server` takes two full snapshots at start** with this yearly schedule: a "substitute"
//!   one in its etcd probe loop, then its snapshotter starts with another because the previous
//!   scheduled one was "missed" and the next is more than 24 h away. Both have the same revision
//!   when nothing is written in between; in the same second they have the same name (the Local
//!   store overwrites the first), else two objects (seen on S3: `Full-00000000-00000018-
//!   1796237457.gz` and `...-1796237458.gz`). [`Snapshotter::wait_settled`] waits for both.
//!   (On 31 December the next scheduled one is within 24 h: no second one; a run across New
//!   Year's midnight would see a scheduled full snapshot.)
//! - **Same second, same revision**: its listing sorts snapshots by last revision, then by
//!   the creation second in the name, and groups each full snapshot with the deltas after it.
//!   A `.final` full snapshot taken in the same second as the last delta (both at the same last
//!   revision: nothing was written in between) can sort *before* that delta; `copy
//!   --max-backups-to-copy=1` then copies the delta too (seen: `Incr-00000028-00000034-
//!   1796237355.gz` copied with `Full-00000000-00000034-1796237355.gz.final`), and `restore`
//!   lists the delta after the full one and skips it ("First delta snapshot ... found to be
//!   completely overlap with full snapshot"). [`Snapshotter::take_final_full`] waits for the
//!   next second first, so the final full snapshot is the newest object, as in production.
//! - `restore` replays the first delta from the first event above the full snapshot's
//!   database revision (events at or below it are dropped, for the race above), applies the
//!   events of one revision as one transaction, checks the revision after each delta ("expected
//!   N but applied M" on a gap), and puts keys without their leases.
//! - `restore` starts an embedded etcd 3.5 on `127.0.0.1:<random>` to replay the deltas and
//!   leaves a data directory marked cluster version 3.5; Debian's etcd 3.4 refuses it
//!   ("cluster cannot be downgraded"). A restore of a full snapshot with no delta after it
//!   (a `.final` one) needs no embedded etcd: that directory is not marked and 3.4 runs it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use garden_ring::backup::checksum::Verifier;
use garden_ring::backup::location::BackupLocation;
use garden_ring::backup::object_store::ObjectStoreExt;
use garden_ring::config::BackupSettings;
use garden_ring::core::backup_name::{SnapshotKind, SnapshotName};
use tokio_stream::StreamExt;

use crate::etcd::EtcdSpec;
use crate::netns::Netns;
use crate::s3::Moto;

/// The version the harness was written against (`etcdbrctl --version` logs it).
pub const VERSION: &str = "v0.43.0";
/// Where CI keeps it, relative to the workspace root.
pub const DEFAULT_PATH: &str = "../shared/tools/etcd-backup-restore/etcdbrctl";
/// The schedule of full snapshots given to it: once a year, so only the one it takes at start
/// (and the final one) are full.
pub const YEARLY: &str = "0 0 1 1 *";
/// How long a snapshot may take to be saved after it is due.
pub const SAVE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `restore` and `copy` may run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long it may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The port `etcdbrctl server` listens on inside its own namespace (its default; nothing else
/// listens there).
pub const SERVER_PORT: u16 = 8080;

/// The `etcdbrctl` binary: `$ETCDBRCTL`, else [`DEFAULT_PATH`] from the workspace root;
/// `None` when that is not a file.
pub fn find_etcdbrctl() -> Option<PathBuf> {
    let path = match std::env::var_os("ETCDBRCTL") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the tests crate is in the workspace")
            .join(DEFAULT_PATH),
    };
    path.is_file().then_some(path)
}

/// [`find_etcdbrctl`] for a test that needs it: under `CI=true` a missing binary panics;
/// elsewhere it prints why the test is skipped and returns `None`.
pub fn require_etcdbrctl() -> Option<PathBuf> {
    let found = find_etcdbrctl();
    if found.is_none() {
        crate::missing_tool(
            &format!("etcdbrctl {VERSION}"),
            &format!("set ETCDBRCTL or put it at {DEFAULT_PATH} from the workspace root"),
        );
    }
    found
}

/// A storage provider of etcdbrctl's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `--storage-provider=Local`: a directory under `$HOME`.
    Local,
    /// `--storage-provider=S3`: a bucket on `moto_server`.
    S3,
}

impl Provider {
    /// The value of `--storage-provider`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Local => "Local",
            Provider::S3 => "S3",
        }
    }
}

/// Where etcdbrctl keeps one backup: a provider, a container (directory or bucket) and a
/// prefix; its objects are `<prefix>/v2/<name>` in the container.
#[derive(Clone, Debug)]
pub struct Store {
    /// The provider.
    pub provider: Provider,
    /// `--store-container`: a directory under [`Store::home`] (Local) or a bucket (S3).
    pub container: String,
    /// `--store-prefix`.
    pub prefix: String,
    /// The `HOME` etcdbrctl runs with (Local containers are joined under it).
    pub home: PathBuf,
    /// For S3: how to reach the bucket.
    pub s3: Option<S3Access>,
}

/// How etcdbrctl and garden-ring reach an S3 bucket on moto.
#[derive(Clone, Debug)]
pub struct S3Access {
    /// `http://127.0.0.1:PORT` (`--store-endpoint-override`).
    pub endpoint: String,
    /// The file `AWS_APPLICATION_CREDENTIALS_JSON` names.
    pub credentials_json: PathBuf,
    /// garden-ring's `[backup]` settings for the same endpoint.
    pub settings: BackupSettings,
}

/// One object of a store's `v2/` directory, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The file name (`Full-00000000-00000012-1796236186.gz`).
    pub name: String,
    /// The name, parsed.
    pub parsed: SnapshotName,
    /// Stored size in bytes.
    pub size: u64,
}

/// A store's objects, in the order they were taken: by last revision, a delta before the full
/// snapshot at the same revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing(pub Vec<Object>);

impl Listing {
    /// The full snapshots.
    pub fn fulls(&self) -> Vec<&Object> {
        self.of_kind(SnapshotKind::Full)
    }

    /// The delta snapshots.
    pub fn deltas(&self) -> Vec<&Object> {
        self.of_kind(SnapshotKind::Incr)
    }

    /// The final full snapshot, if any.
    pub fn final_full(&self) -> Option<&Object> {
        self.0
            .iter()
            .find(|o| o.parsed.kind() == SnapshotKind::Full && o.parsed.is_final())
    }

    /// The names.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|o| o.name.as_str()).collect()
    }

    fn of_kind(&self, kind: SnapshotKind) -> Vec<&Object> {
        self.0.iter().filter(|o| o.parsed.kind() == kind).collect()
    }
}

impl Store {
    /// A Local container `<home>/<container>`, prefix `prefix`.
    pub fn local(home: &Path, container: &str, prefix: &str) -> Store {
        std::fs::create_dir_all(home).expect("create the store's home");
        Store {
            provider: Provider::Local,
            container: container.to_string(),
            prefix: prefix.to_string(),
            home: home.to_path_buf(),
            s3: None,
        }
    }

    /// Bucket `bucket` (which must exist) on `moto`, prefix `prefix`; writes the credentials
    /// file to `dir` (moto accepts any) and runs etcdbrctl with `HOME=dir`.
    pub fn s3(moto: &Moto, dir: &Path, bucket: &str, prefix: &str) -> Store {
        std::fs::create_dir_all(dir).expect("create the store's directory");
        let credentials_json = dir.join("etcdbrctl-s3-credentials.json");
        let json = serde_json::json!({
            "accessKeyID": "testing",
            "secretAccessKey": "testing-secret",
            "region": "us-east-1",
            "s3ForcePathStyle": true,
        });
        std::fs::write(&credentials_json, json.to_string()).expect("write the credentials");
        Store {
            provider: Provider::S3,
            container: bucket.to_string(),
            prefix: prefix.to_string(),
            home: dir.to_path_buf(),
            s3: Some(S3Access {
                endpoint: moto.endpoint(),
                credentials_json,
                settings: moto.settings(&moto.endpoint()),
            }),
        }
    }

    /// The `--storage-provider`, `--store-container`, `--store-prefix` (and for S3
    /// `--store-endpoint-override`) flags, each after `flag_prefix` (`""`, or `source-` for the
    /// source of a copy).
    pub fn args(&self, flag_prefix: &str) -> Vec<String> {
        let mut args = vec![
            format!("--{flag_prefix}storage-provider={}", self.provider.as_str()),
            format!("--{flag_prefix}store-container={}", self.container),
            format!("--{flag_prefix}store-prefix={}", self.prefix),
        ];
        if let Some(s3) = &self.s3 {
            args.push(format!(
                "--{flag_prefix}store-endpoint-override={}",
                s3.endpoint
            ));
        }
        args
    }

    /// Sets the environment this store needs on `command`: `HOME`, and for S3
    /// `<env_prefix>AWS_APPLICATION_CREDENTIALS_JSON` (`env_prefix` is `SOURCE_` for the source
    /// of a copy). Call [`clean_command`] first.
    pub fn apply_env(&self, command: &mut Command, env_prefix: &str) {
        command.env("HOME", &self.home);
        if let Some(s3) = &self.s3 {
            command.env(
                format!("{env_prefix}AWS_APPLICATION_CREDENTIALS_JSON"),
                &s3.credentials_json,
            );
        }
    }

    /// The directory of the objects of a Local store, `<home>/<container>/<prefix>/v2`.
    pub fn local_v2_dir(&self) -> PathBuf {
        assert_eq!(
            self.provider,
            Provider::Local,
            "only a Local store is a directory"
        );
        self.local_dir().join("v2")
    }

    fn local_dir(&self) -> PathBuf {
        self.home.join(&self.container).join(&self.prefix)
    }

    /// The same place as a garden-ring backup URL: `file://<home>/<container>/<prefix>` (whose
    /// `v2/` is etcdbrctl's) or `s3://<bucket>/<prefix>`.
    pub fn url(&self) -> String {
        match self.provider {
            Provider::Local => format!("file://{}", self.local_dir().display()),
            Provider::S3 => format!("s3://{}/{}", self.container, self.prefix),
        }
    }

    /// garden-ring's `[backup]` settings that reach [`Store::url`].
    pub fn settings(&self) -> BackupSettings {
        self.s3
            .as_ref()
            .map_or_else(BackupSettings::default, |s3| s3.settings.clone())
    }

    /// [`Store::url`] opened with garden-ring's object store.
    pub fn open(&self) -> BackupLocation {
        BackupLocation::parse(&self.url(), &self.settings())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.url()))
    }

    /// Every object in `<prefix>/v2/` whose name parses as a snapshot name (anything else
    /// panics: etcdbrctl writes nothing else there).
    pub async fn objects(&self) -> Listing {
        let location = self.open();
        let store = location.store();
        let dir = location.v2_dir();
        let mut objects = Vec::new();
        let mut listing = store.list(Some(&dir));
        while let Some(meta) = listing.next().await {
            let meta = meta.unwrap_or_else(|e| panic!("list {}: {e}", self.url()));
            let name = meta
                .location
                .filename()
                .expect("an object has a name")
                .to_string();
            let parsed = SnapshotName::parse(&name)
                .unwrap_or_else(|e| panic!("{name} in {} is not a snapshot: {e}", self.url()));
            objects.push(Object {
                name,
                parsed,
                size: meta.size,
            });
        }
        objects.sort_by_key(|o| {
            (
                o.parsed.last_revision(),
                o.parsed.kind() == SnapshotKind::Full,
                o.parsed.created_unix_s(),
            )
        });
        Listing(objects)
    }

    /// The bytes of object `name` of `<prefix>/v2/`.
    pub async fn read(&self, name: &str) -> Vec<u8> {
        let location = self.open();
        let path = location.v2_dir().join(name);
        location
            .store()
            .get(&path)
            .await
            .unwrap_or_else(|e| panic!("get {path}: {e}"))
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("read {path}: {e}"))
            .to_vec()
    }
}

/// A command for `etcdbrctl` with every `AWS_*` variable (also `SOURCE_AWS_*`,
/// `SECONDARY_AWS_*`) of the test's environment removed (see the module docs on
/// `AWS_CA_BUNDLE`), run in `dir`.
pub fn clean_command(program: &mut Command, dir: &Path) {
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if ["AWS_", "SOURCE_AWS_", "SECONDARY_AWS_"]
            .iter()
            .any(|p| name_text.starts_with(p))
        {
            program.env_remove(&name);
        }
    }
    program.current_dir(dir);
}

/// A command line of etcdbrctl that ran to its end.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote (stdout and stderr, interleaved).
    pub log: String,
    /// How long it ran.
    pub took: Duration,
}

/// Runs `command` with its output into `log_path`, killing it after `timeout`.
fn run_logged(mut command: Command, log_path: &Path, timeout: Duration) -> Ran {
    let log = std::fs::File::create(log_path).expect("create the log");
    let began = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for etcdbrctl") {
            break status;
        }
        if began.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not end within {timeout:?}; log:\n{}",
                std::fs::read_to_string(log_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        status,
        log: std::fs::read_to_string(log_path).unwrap_or_default(),
        took: began.elapsed(),
    }
}

/// How [`Snapshotter`] runs etcdbrctl.
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// `--delta-snapshot-period` (at least 1 s: below, delta snapshots are off).
    pub delta_snapshot_period: Duration,
    /// `--compress-snapshots` (gzip; etcdbrctl's default is `true`).
    pub compress: bool,
    /// `--garbage-collection-policy` (`Exponential`, `LimitBased`), `--max-backups` and
    /// `--garbage-collection-period` (over 1 s); None: no garbage collection.
    pub garbage_collection: Option<(&'static str, u64, Duration)>,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        Self {
            delta_snapshot_period: Duration::from_secs(1),
            compress: true,
            garbage_collection: None,
        }
    }
}

/// A running `etcdbrctl snapshot` or `etcdbrctl server`; see the [module docs](self). It is
/// killed when dropped, also when a test fails.
pub struct Snapshotter {
    child: Option<Child>,
    log_path: PathBuf,
    store: Store,
    /// For `server`: its namespace (dropped after the process).
    netns: Option<Netns>,
    /// When it was started.
    pub started: Instant,
}

impl Snapshotter {
    /// `etcdbrctl snapshot` of the etcd at `etcd` into `store`, no garbage collection, full
    /// snapshots [`YEARLY`] (so one at start), deltas every `options.delta_snapshot_period`.
    /// Logs to `<dir>/etcdbrctl-snapshot.log`.
    pub fn start(
        etcdbrctl: &Path,
        dir: &Path,
        store: &Store,
        etcd: &EtcdSpec,
        options: &SnapshotOptions,
    ) -> Snapshotter {
        Self::start_for(etcdbrctl, dir, store, &etcd.client_url(), options)
    }

    /// [`Snapshotter::start`] for the etcd at the client URL `endpoint`.
    pub fn start_for(
        etcdbrctl: &Path,
        dir: &Path,
        store: &Store,
        endpoint: &str,
        options: &SnapshotOptions,
    ) -> Snapshotter {
        let mut command = Command::new(etcdbrctl);
        clean_command(&mut command, dir);
        command
            .arg("snapshot")
            .args(store.args(""))
            .arg(format!("--endpoints={endpoint}"))
            .args(schedule_args(dir, options));
        store.apply_env(&mut command, "");
        Self::spawn(command, dir.join("etcdbrctl-snapshot.log"), store, None)
    }

    /// `etcdbrctl server` for the etcd member `etcd` with the same snapshot flags as
    /// [`Snapshotter::start`], inside a [`Netns`] of its own that forwards the etcd's client
    /// port (and moto's, for S3) to the outside. Needs root. Logs to
    /// `<dir>/etcdbrctl-server.log`; its etcd config is `<dir>/etcdbrctl-etcd.conf.yaml`.
    pub fn start_server(
        etcdbrctl: &Path,
        dir: &Path,
        store: &Store,
        etcd: &EtcdSpec,
        options: &SnapshotOptions,
    ) -> Snapshotter {
        let mut netns = Netns::create();
        netns.forward(etcd.client_port, ([127, 0, 0, 1], etcd.client_port).into());
        if let Some(s3) = &store.s3 {
            let moto: std::net::SocketAddr = s3
                .endpoint
                .strip_prefix("http://")
                .and_then(|a| a.parse().ok())
                .expect("moto's endpoint is http://<ip>:<port>");
            netns.forward(moto.port(), moto);
        }
        // Never used (only `/initialization/start` would validate or restore it), but the flag
        // and the YAML name one: not the running member's.
        let unused_data_dir = dir.join("etcdbrctl-server-unused.etcd");
        let name = &etcd.name;
        let conf = dir.join("etcdbrctl-etcd.conf.yaml");
        std::fs::write(
            &conf,
            format!(
                "name: {name}\n\
                 data-dir: {data}\n\
                 initial-cluster: {name}={peer}\n\
                 initial-advertise-peer-urls:\n  {name}:\n  - {peer}\n\
                 advertise-client-urls:\n  {name}:\n  - {client}\n",
                data = unused_data_dir.display(),
                peer = etcd.peer_url(),
                client = etcd.client_url(),
            ),
        )
        .expect("write the etcd config");
        let mut command = netns.command(etcdbrctl);
        clean_command(&mut command, dir);
        command
            .arg("server")
            .args(store.args(""))
            .arg(format!("--endpoints={}", etcd.client_url()))
            .arg(format!("--server-port={SERVER_PORT}"))
            .arg(format!("--data-dir={}", unused_data_dir.display()))
            .arg(format!("--name={name}"))
            .arg(format!("--initial-cluster={name}={}", etcd.peer_url()))
            .arg(format!("--initial-advertise-peer-urls={}", etcd.peer_url()))
            // Leader election (of the single member) waits one period; it must exceed 1 s.
            .arg("--reelection-period=1100ms")
            .args(schedule_args(dir, options))
            .env("ETCD_CONF", &conf)
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", "garden-ring-tests");
        store.apply_env(&mut command, "");
        Self::spawn(
            command,
            dir.join("etcdbrctl-server.log"),
            store,
            Some(netns),
        )
    }

    fn spawn(
        mut command: Command,
        log_path: PathBuf,
        store: &Store,
        netns: Option<Netns>,
    ) -> Snapshotter {
        let log = std::fs::File::create(&log_path).expect("create the etcdbrctl log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Snapshotter {
            child: Some(child),
            log_path,
            store: store.clone(),
            netns,
            started: Instant::now(),
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The names its log says it saved (`Successfully saved full|delta snapshot at: <name>`).
    pub fn saved(&self) -> BTreeSet<String> {
        self.log()
            .lines()
            .filter_map(|line| {
                let rest = line.split_once("Successfully saved ")?.1;
                let name = rest.split_once(" snapshot at: ")?.1;
                Some(name.split(['"', ' ']).next()?.to_string())
            })
            .collect()
    }

    /// The objects in the store that it finished saving.
    pub async fn listing(&self) -> Listing {
        let saved = self.saved();
        let mut listing = self.store.objects().await;
        listing.0.retain(|o| saved.contains(&o.name));
        listing
    }

    /// Waits until `done` holds for [`Snapshotter::listing`], within `timeout`, and returns
    /// that listing; panics with the log when it exits or the deadline passes.
    pub async fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Listing) -> bool,
    ) -> Listing {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcdbrctl exited ({status}) before {what}; log:\n{}",
                    self.log()
                );
            }
            let listing = self.listing().await;
            if done(&listing) {
                return listing;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting until {what}; saved {:?}; log:\n{}",
                listing.names(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until it settled after its start: the full snapshot(s) it takes at start saved and
    /// its full-snapshot timer set, so that what is written to etcd from now on goes into
    /// deltas. The sign is its log: `Resetting full snapshot to run after` following `Starting
    /// the Snapshot EventHandler.` (`snapshot`) or `Starting snapshotter...` (`server`, which
    /// may take a second full snapshot after that; see the module docs). Returns the listing.
    pub async fn wait_settled(&mut self) -> Listing {
        let anchor = match self.netns {
            Some(_) => "Starting snapshotter...",
            None => "Starting the Snapshot EventHandler.",
        };
        let log_path = self.log_path.clone();
        let settled = move || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.rfind(anchor)
                .is_some_and(|at| log[at..].contains("Resetting full snapshot to run after"))
        };
        self.wait_until(
            "it saved its first full snapshot and set its full-snapshot timer",
            SAVE_TIMEOUT,
            |l| !l.fulls().is_empty() && settled(),
        )
        .await
    }

    /// Waits until it saved a full snapshot and at least `deltas` delta snapshots.
    pub async fn wait_for(&mut self, deltas: usize) -> Listing {
        self.wait_until(
            &format!("a full snapshot and {deltas} delta snapshots are saved"),
            SAVE_TIMEOUT,
            |l| !l.fulls().is_empty() && l.deltas().len() >= deltas,
        )
        .await
    }

    /// Waits until its snapshots reach `revision` (a full one or a delta whose last revision
    /// is at least that).
    pub async fn wait_through(&mut self, revision: u64) -> Listing {
        self.wait_until(
            &format!("the snapshots reach revision {revision}"),
            SAVE_TIMEOUT,
            |l| l.0.iter().any(|o| o.parsed.last_revision() >= revision),
        )
        .await
    }

    /// `etcdbrctl server` only: `GET /snapshot/full?final=true` inside its namespace (the
    /// README's `curl`), which answers once the final full snapshot is saved; returns it as
    /// listed in the store.
    ///
    /// It first waits until the clock is past the second of the newest snapshot saved, so the
    /// final one sorts after it (see the module docs: a delta of the same second and revision
    /// would count as part of the final backup).
    pub async fn take_final_full(&mut self) -> Object {
        assert!(
            self.netns.is_some(),
            "a final full snapshot needs `etcdbrctl server` (Snapshotter::start_server)"
        );
        let newest = self
            .listing()
            .await
            .0
            .iter()
            .map(|o| o.parsed.created_unix_s())
            .max();
        let deadline = Instant::now() + Duration::from_secs(5);
        while newest.is_some_and(|s| unix_now_s() <= s) {
            assert!(Instant::now() < deadline, "the clock does not advance");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let netns = self.netns.as_ref().expect("checked");
        let path = "/snapshot/full?final=true";
        let (status, body) = netns
            .http(SERVER_PORT, "GET", path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}; log:\n{}", self.log()));
        assert_eq!(status, 200, "GET {path}: {body}; log:\n{}", self.log());
        let answer: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path} answered {body:?}: {e}"));
        let name = answer["snapName"]
            .as_str()
            .unwrap_or_else(|| panic!("GET {path} answered no snapName: {body}"))
            .to_string();
        assert_eq!(answer["isFinal"], true, "{body}");
        let listing = self
            .wait_until(&format!("{name} is saved"), SAVE_TIMEOUT, |l| {
                l.names().contains(&name.as_str())
            })
            .await;
        listing
            .0
            .into_iter()
            .find(|o| o.name == name)
            .expect("just listed")
    }

    /// Stops it with SIGTERM (SIGKILL after a grace period) and returns its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        garden_ring::demo::terminate_all(std::slice::from_mut(&mut child), STOP_TIMEOUT);
        let status = child.wait().ok();
        self.netns = None;
        status
    }
}

impl Drop for Snapshotter {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.netns = None;
    }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}

fn schedule_args(dir: &Path, options: &SnapshotOptions) -> Vec<String> {
    let temp = dir.join("etcdbrctl-tmp");
    std::fs::create_dir_all(&temp).expect("create etcdbrctl's temporary directory");
    let mut args = vec![
        format!(
            "--delta-snapshot-period={}ms",
            options.delta_snapshot_period.as_millis()
        ),
        format!("--compress-snapshots={}", options.compress),
        format!("--schedule={YEARLY}"),
        format!("--snapstore-temp-directory={}", temp.display()),
    ];
    match options.garbage_collection {
        None => args.push("--garbage-collection-period=0".into()),
        Some((policy, max_backups, period)) => args.extend([
            format!("--garbage-collection-policy={policy}"),
            format!("--max-backups={max_backups}"),
            format!("--garbage-collection-period={}ms", period.as_millis()),
        ]),
    }
    args
}

/// A data directory `etcdbrctl restore` made.
#[derive(Debug)]
pub struct Restored {
    /// The data directory.
    pub data_dir: PathBuf,
    /// The member it was restored for (name and peer URL); its client port is free for an
    /// etcd started on it.
    pub spec: EtcdSpec,
    /// The run.
    pub ran: Ran,
}

/// `etcdbrctl restore` of `store` (its newest full snapshot and the deltas after it) into a
/// fresh `<dir>/<name>.etcd` for member `name`; `Err` with the run (its log) when it fails.
/// Logs to `<dir>/etcdbrctl-restore-<name>.log`. Blocks the thread while it runs.
pub fn restore(etcdbrctl: &Path, dir: &Path, store: &Store, name: &str) -> Result<Restored, Ran> {
    let spec = EtcdSpec::reserve(name);
    let data_dir = dir.join(format!("{name}.etcd"));
    assert!(!data_dir.exists(), "{} exists already", data_dir.display());
    let temp = dir.join("etcdbrctl-tmp");
    std::fs::create_dir_all(&temp).expect("create etcdbrctl's temporary directory");
    let mut command = Command::new(etcdbrctl);
    clean_command(&mut command, dir);
    command
        .arg("restore")
        .args(store.args(""))
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--name={name}"))
        .arg(format!("--initial-cluster={name}={}", spec.peer_url()))
        .arg(format!("--initial-advertise-peer-urls={}", spec.peer_url()))
        .arg(format!(
            "--restoration-temp-snapshots-dir={}",
            dir.join(format!("{name}.restoration.tmp")).display()
        ))
        .arg(format!("--snapstore-temp-directory={}", temp.display()));
    store.apply_env(&mut command, "");
    let ran = run_logged(
        command,
        &dir.join(format!("etcdbrctl-restore-{name}.log")),
        RUN_TIMEOUT,
    );
    if ran.status.success() {
        Ok(Restored {
            data_dir,
            spec,
            ran,
        })
    } else {
        Err(ran)
    }
}

/// Options of [`copy`].
#[derive(Clone, Debug, Default)]
pub struct CopyOptions {
    /// `--wait-for-final-snapshot` (with `--wait-for-final-snapshot-timeout` = [`RUN_TIMEOUT`]).
    pub wait_for_final_snapshot: bool,
    /// `--max-backups-to-copy`.
    pub max_backups_to_copy: Option<u32>,
}

/// `etcdbrctl copy` from `from` to `to` (two Local stores with one `HOME`: the Local provider
/// joins both containers under it). `Err` with the run when it fails. Logs to
/// `<dir>/etcdbrctl-copy.log` (overwritten by the next copy). Blocks the thread while it runs.
pub fn copy(
    etcdbrctl: &Path,
    dir: &Path,
    from: &Store,
    to: &Store,
    options: &CopyOptions,
) -> Result<Ran, Ran> {
    assert!(
        from.provider == Provider::Local && to.provider == Provider::Local,
        "copy is wired for two Local stores"
    );
    assert_eq!(
        from.home, to.home,
        "two Local stores of one copy share one HOME (etcdbrctl joins both containers under it)"
    );
    let temp = dir.join("etcdbrctl-tmp");
    std::fs::create_dir_all(&temp).expect("create etcdbrctl's temporary directory");
    let mut command = Command::new(etcdbrctl);
    clean_command(&mut command, dir);
    command
        .arg("copy")
        .args(from.args("source-"))
        .args(to.args(""))
        .arg(format!("--snapstore-temp-directory={}", temp.display()))
        .arg(format!(
            "--source-snapstore-temp-directory={}",
            temp.display()
        ));
    if options.wait_for_final_snapshot {
        command.arg("--wait-for-final-snapshot").arg(format!(
            "--wait-for-final-snapshot-timeout={}s",
            RUN_TIMEOUT.as_secs()
        ));
    }
    if let Some(n) = options.max_backups_to_copy {
        command.arg(format!("--max-backups-to-copy={n}"));
    }
    from.apply_env(&mut command, "SOURCE_");
    to.apply_env(&mut command, "");
    let ran = run_logged(command, &dir.join("etcdbrctl-copy.log"), RUN_TIMEOUT);
    if ran.status.success() {
        Ok(ran)
    } else {
        Err(ran)
    }
}

/// One event of a delta snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeltaEvent {
    /// A delete (`"type":1`); otherwise a put.
    pub delete: bool,
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a delete, and for a put of an empty value: the field is omitted).
    pub value: Vec<u8>,
    /// `create_revision` (0 for a delete).
    pub create_revision: u64,
    /// `mod_revision`: the revision of this event.
    pub mod_revision: u64,
    /// `version` (1 for a key's first put since it was created; 0 for a delete).
    pub version: u64,
    /// `time`, as written.
    pub time: String,
}

impl DeltaEvent {
    /// The key as text (lossy).
    pub fn key_str(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// The events of delta snapshot `name` with stored bytes `bytes`: decompressed as its name
/// says, the sha256 trailer verified, the JSON array parsed. Panics on anything malformed.
pub fn decode_delta(name: &SnapshotName, bytes: &[u8]) -> Vec<DeltaEvent> {
    assert_eq!(name.kind(), SnapshotKind::Incr, "{name:?} is not a delta");
    let mut verifier = Verifier::new(name.compression()).expect("a supported compression");
    let mut content = verifier.feed(bytes).expect("decompress").to_vec();
    let (rest, _) = verifier.finish().expect("the sha256 trailer verifies");
    content.extend_from_slice(&rest);
    let json = &content[..content.len() - 32];
    let events: Vec<serde_json::Value> =
        serde_json::from_slice(json).expect("a delta is a JSON array");
    events
        .into_iter()
        .map(|e| {
            let event = &e["etcdEvent"];
            let kv = &event["kv"];
            let number = |field: &str| kv[field].as_u64().unwrap_or(0);
            let bytes = |field: &str| {
                kv[field]
                    .as_str()
                    .map(|b| base64_decode(b).unwrap_or_else(|| panic!("bad base64 {b:?}")))
                    .unwrap_or_default()
            };
            DeltaEvent {
                delete: event["type"].as_u64() == Some(1),
                key: bytes("key"),
                value: bytes("value"),
                create_revision: number("create_revision"),
                mod_revision: number("mod_revision"),
                version: number("version"),
                time: e["time"].as_str().unwrap_or_default().to_string(),
            }
        })
        .collect()
}

/// Standard base64 with padding (what Go's `encoding/json` writes for `[]byte`).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let text = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::base64_decode;

    #[test]
    fn base64_decodes_what_go_writes() {
        assert_eq!(base64_decode("Yg==").unwrap(), b"b");
        assert_eq!(base64_decode("YiBj").unwrap(), b"b c");
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("aGVsbG8h").unwrap(), b"hello!");
        assert!(base64_decode("a$==").is_none());
    }
}

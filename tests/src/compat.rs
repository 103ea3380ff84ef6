//! A workload against a real etcd that records what it wrote, and backups the real
//! etcd-backup-restore (`etcdbrctl`) writes while it runs: the pieces the compatibility tests
//! (`tests/backup_compat.rs`) and the end-to-end test of a `ringd` host on such a bucket
//! (`tests/etcd_driver.rs`) share.
//!
//! - [`Workload`]: puts, overwrites, deletes and multi-key transactions against a real etcd
//!   (puts through garden-ring's `EtcdClient`; deletes and transactions through the `etcdctl` of
//!   the same etcd), recording every write and the expected final key -> value model;
//! - [`etcdbrctl_bucket`]: a backup etcdbrctl wrote while the workload ran: one full snapshot
//!   (before the deltas' writes), at least two deltas holding overwrites and deletes,
//!   optionally a `.final` full snapshot (`etcdbrctl server`);
//! - [`read_all`]: every key of a data directory, read from an etcd started on it.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::etcd::{Etcd, EtcdSpec};
use crate::etcdbrctl::{Listing, Provider, SnapshotOptions, Snapshotter, Store};
use crate::s3::Moto;

/// Every key the workload writes starts with this.
pub const KEY_PREFIX: &str = "/registry/compat/";
/// The store prefix of the backups (a Gardener-style shoot technical id).
pub const STORE_PREFIX: &str = "shoot--dev--compat/etcd-main";

/// One write as etcd applied it: a put (`Some(value)`) or a delete (`None`) of `key` at
/// `revision` (several writes share the revision of their transaction).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Write {
    /// The revision of the write.
    pub revision: u64,
    /// The key.
    pub key: String,
    /// The value put, or `None` for a delete.
    pub value: Option<String>,
}

/// One operation of a transaction.
enum Op<'a> {
    Put(&'a str, &'a str),
    Delete(&'a str),
}

/// Writes to a real etcd and keeps the expected state; see the module docs.
pub struct Workload<'a> {
    etcd: &'a Etcd,
    /// The expected final key -> value.
    pub model: BTreeMap<String, String>,
    /// Every write, in order.
    pub writes: Vec<Write>,
}

/// `KEY_PREFIX` + `name`.
fn key(name: &str) -> String {
    format!("{KEY_PREFIX}{name}")
}

impl<'a> Workload<'a> {
    /// A workload on `etcd` (which holds nothing under [`KEY_PREFIX`] yet).
    pub fn new(etcd: &'a Etcd) -> Self {
        Self {
            etcd,
            model: BTreeMap::new(),
            writes: Vec::new(),
        }
    }

    /// The revision of the last write.
    pub fn revision(&self) -> u64 {
        self.writes.last().map_or(0, |w| w.revision)
    }

    /// Puts `KEY_PREFIX + name` = `value` through garden-ring's client.
    pub async fn put(&mut self, name: &str, value: &str) -> u64 {
        let key = key(name);
        let revision = self.etcd.put(&key, value).await;
        self.record(revision, key, Some(value));
        revision
    }

    /// Deletes `KEY_PREFIX + name` (which must exist) with `etcdctl del`.
    pub fn delete(&mut self, name: &str) -> u64 {
        let key = key(name);
        assert!(
            self.model.contains_key(&key),
            "deleting {key}, which is not there"
        );
        let answer = self.etcdctl_json(&["del", &key], None);
        assert_eq!(answer["deleted"], 1, "etcdctl del {key}: {answer}");
        let revision = revision_of(&answer);
        self.record(revision, key, None);
        revision
    }

    /// Applies `ops` in one transaction (no compares) with `etcdctl txn`; the values must be
    /// single words (etcdctl's transaction syntax).
    fn txn(&mut self, ops: &[Op<'_>]) -> u64 {
        let mut script = String::from("\n"); // no compares
        for op in ops {
            match op {
                Op::Put(name, value) => {
                    assert!(
                        !value.is_empty() && !value.contains([' ', '"', '\n']),
                        "a transaction value is one word: {value:?}"
                    );
                    script += &format!("put {} {value}\n", key(name));
                }
                Op::Delete(name) => {
                    assert!(
                        self.model.contains_key(&key(name)),
                        "deleting absent {name}"
                    );
                    script += &format!("del {}\n", key(name));
                }
            }
        }
        script += "\n\n"; // end of the success ops; no failure ops
        let answer = self.etcdctl_json(&["txn"], Some(&script));
        assert_eq!(answer["succeeded"], true, "etcdctl txn: {answer}");
        let revision = revision_of(&answer);
        for op in ops {
            match op {
                Op::Put(name, value) => self.record(revision, key(name), Some(value)),
                Op::Delete(name) => self.record(revision, key(name), None),
            }
        }
        revision
    }

    fn record(&mut self, revision: u64, key: String, value: Option<&str>) {
        assert!(revision >= self.revision(), "revisions go forward");
        match value {
            Some(v) => self.model.insert(key.clone(), v.to_string()),
            None => self.model.remove(&key),
        };
        self.writes.push(Write {
            revision,
            key,
            value: value.map(str::to_string),
        });
    }

    fn etcdctl_json(&self, args: &[&str], stdin: Option<&str>) -> serde_json::Value {
        let mut child = self
            .etcd
            .etcdctl()
            .args(args)
            .args(["-w", "json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run etcdctl");
        let mut input = child.stdin.take().expect("etcdctl's stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write to etcdctl");
        drop(input);
        let out = child.wait_with_output().expect("etcdctl runs");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("etcdctl -w json prints JSON")
    }

    /// Before the backup starts (into the full snapshot): 12 puts, an overwrite, a delete, a
    /// transaction (two puts and a delete), an empty value and a value with non-ASCII text,
    /// quotes and a newline.
    pub async fn seed(&mut self) {
        for i in 0..12 {
            self.put(&format!("k{i:02}"), &format!("seed-{i}")).await;
        }
        self.put("k00", "seed-0-overwritten").await;
        self.delete("k11");
        self.txn(&[
            Op::Put("k12", "seed-txn-12"),
            Op::Put("k13", "seed-txn-13"),
            Op::Delete("k10"),
        ]);
        self.put("empty", "").await;
        self.put("text", "grüße, 世界: \"quoted\"\nsecond line")
            .await;
    }

    /// The first round of delta writes: new keys, overwrites of seeded keys (one twice), a
    /// delete of a seeded key, a transaction mixing all three, a new key with an empty value.
    pub async fn round_1(&mut self) {
        for name in ["r1-a", "r1-b", "r1-c"] {
            self.put(name, &format!("{name}-value")).await;
        }
        self.put("k01", "r1-overwrite").await;
        self.put("k02", "r1-first").await;
        self.put("k02", "r1-second").await;
        self.delete("k03");
        self.txn(&[
            Op::Put("r1-txn", "r1-txn-value"),
            Op::Put("k04", "r1-txn-overwrite"),
            Op::Delete("k05"),
        ]);
        self.put("r1-empty", "").await;
    }

    /// The second round: overwrite and delete keys the first round created, re-create a key it
    /// deleted, a transaction, a key put and deleted within the round, a delete of a key a
    /// seeded transaction created.
    pub async fn round_2(&mut self) {
        self.put("r1-a", "r2-overwrite").await;
        self.delete("r1-b");
        self.put("k03", "r2-recreated").await;
        self.txn(&[
            Op::Delete("r1-txn"),
            Op::Put("r2-txn", "r2-txn-value"),
            Op::Put("k06", "r2-txn-overwrite"),
        ]);
        self.put("r2-gone", "short-lived").await;
        self.delete("r2-gone");
        self.delete("k13");
    }
}

fn revision_of(answer: &serde_json::Value) -> u64 {
    answer["header"]["revision"]
        .as_u64()
        .unwrap_or_else(|| panic!("no header.revision in {answer}"))
}

/// A backup etcdbrctl wrote; see [`etcdbrctl_bucket`]. Owns its directory and moto.
pub struct Bucket {
    /// Where it is.
    pub store: Store,
    /// Its objects when etcdbrctl stopped.
    pub listing: Listing,
    /// The expected content of a restore of its newest snapshots.
    pub model: BTreeMap<String, String>,
    /// Every write of the workload (also those in the full snapshot).
    pub writes: Vec<Write>,
    /// The revision of the full snapshot taken at start.
    pub full_revision: u64,
    /// The revision of the last write.
    pub last_revision: u64,
    /// The test's directory (everything lives under it).
    pub dir: tempfile::TempDir,
    /// The S3 server of an S3 bucket (its data lives only in memory).
    pub moto: Option<Moto>,
}

/// A backup etcdbrctl wrote: Debian's etcd 3.4 started, [`Workload::seed`] written, etcdbrctl
/// started (`snapshot`, or `server` in its own namespace when `with_final`) with deltas every
/// second and compression `compress`; once its full snapshot(s) at start are saved
/// ([`Snapshotter::wait_settled`]) [`Workload::round_1`], wait for a delta holding it,
/// [`Workload::round_2`], wait again; with `with_final` a `.final` full snapshot; then SIGTERM
/// (it must exit 0 and leave nothing it did not log as saved). The listing is printed.
pub async fn etcdbrctl_bucket(
    etcdbrctl: &Path,
    provider: Provider,
    compress: bool,
    with_final: bool,
) -> Bucket {
    let began = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("backup-compat-")
        .tempdir()
        .unwrap();
    let path = dir.path();
    let (store, moto) = match provider {
        Provider::Local => (
            Store::local(&path.join("home"), "backups", STORE_PREFIX),
            None,
        ),
        Provider::S3 => {
            let moto = Moto::start(&path.join("moto"));
            moto.create_bucket("backups");
            let store = Store::s3(&moto, &path.join("home"), "backups", STORE_PREFIX);
            (store, Some(moto))
        }
    };
    let source = Etcd::start(path, "source").await;
    let mut workload = Workload::new(&source);
    workload.seed().await;
    let options = SnapshotOptions {
        delta_snapshot_period: Duration::from_secs(1),
        compress,
        garbage_collection: None,
    };
    let mut snapshotter = if with_final {
        Snapshotter::start_server(etcdbrctl, path, &store, &source.spec, &options)
    } else {
        Snapshotter::start(etcdbrctl, path, &store, &source.spec, &options)
    };
    let full = snapshotter.wait_settled().await;
    let full_after = snapshotter.started.elapsed();
    let full_revision = workload.revision();
    for object in full.fulls() {
        assert_eq!(
            object.parsed.last_revision(),
            full_revision,
            "the full snapshot(s) at start hold the seed: {:?}",
            full.names()
        );
    }
    workload.round_1().await;
    snapshotter.wait_through(workload.revision()).await;
    workload.round_2().await;
    let through = snapshotter.wait_through(workload.revision()).await;
    let final_full = match with_final {
        true => Some(snapshotter.take_final_full().await),
        false => None,
    };
    let status = snapshotter.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "etcdbrctl exits 0 on SIGTERM: {status:?}; log:\n{}",
        snapshotter.log()
    );
    let listing = store.objects().await;
    assert_eq!(
        listing.0.len(),
        through.0.len() + usize::from(final_full.is_some()),
        "nothing unfinished or unlogged is left in the store: {:?} vs {:?}",
        listing.names(),
        through.names()
    );
    println!(
        "etcdbrctl {} into {} {}{}: full snapshot {full_after:?} after start, all in {:?} \
         (exit {status:?}); objects:",
        if with_final { "server" } else { "snapshot" },
        provider.as_str(),
        if compress { "gzip" } else { "plain" },
        if with_final {
            " with a final full snapshot"
        } else {
            ""
        },
        began.elapsed()
    );
    for object in &listing.0 {
        println!("  {} ({} bytes)", object.name, object.size);
    }
    Bucket {
        store,
        listing,
        model: workload.model.clone(),
        last_revision: workload.revision(),
        writes: workload.writes.clone(),
        full_revision,
        dir,
        moto,
    }
}

/// Every key of `data_dir` -> its value, read from an etcd from `bin_dir` started on it (on
/// fresh loopback ports; the restored member's name and peer URL do not matter to a single
/// member). The etcd is stopped before returning; its log is beside the data directory.
pub async fn read_all(bin_dir: &Path, data_dir: &Path) -> BTreeMap<String, String> {
    let dir = data_dir.parent().expect("a data directory has a parent");
    let name = format!("read-{}", data_dir.file_name().unwrap().to_string_lossy());
    let etcd = Etcd::start_from_bin(bin_dir, dir, EtcdSpec::reserve(&name), data_dir).await;
    let kvs = crate::etcd::key_values(etcd.client(), b"").await;
    println!(
        "  etcd from {} started on {} in {:?}: revision {}, {} keys",
        bin_dir.display(),
        data_dir.display(),
        etcd.startup,
        etcd.client().revision().await.unwrap(),
        kvs.len()
    );
    kvs
}

//! Disk faults under the Raft log (issue 23, point 2), with real `ringd` processes and real file
//! systems the tests make:
//! - the log's disk full (a size-limited tmpfs under one member's data directory, filled up):
//!   the member stops acknowledging, says why (log, `Status.problem`, `/readyz`, metric), the
//!   ring loses nothing, and the member carries on once space is back;
//! - an fsync error (injected at the libc boundary by an `LD_PRELOAD` shim compiled here:
//!   `fsync`/`fdatasync` fail with `EIO` while a trigger file exists): the member exits
//!   (fail-stop, status 4), and a restart recovers from what is on disk;
//! - a torn last WAL record (the file cut in the middle of its last record after a kill -9):
//!   the member starts, drops only that record, and the ring loses nothing it acknowledged;
//! - the etcd driver's data disk full (a tmpfs under one member's etcd data, filled up while
//!   a control plane's etcd takes writes): etcd fails, and the control plane is reported
//!   (`cp get`, history, metric), not silently lost; once space is back it serves again with
//!   every write it acknowledged.
//!
//! Mounting needs root (CI runs as root); without it these tests skip, and fail under CI=true.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use garden_ring::pb;
use garden_ring::raft::disk::MIN_FREE_BYTES;
use garden_ring_tests::{
    Ring, RingOptions, add_control_plane, control_plane, eventually, http_get, status,
};

const FORM: Duration = Duration::from_secs(20);

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// A tmpfs of `mib` MiB mounted at `at`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, mib: u64) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(ok.success(), "mount -t tmpfs at {}", at.display());
        Self(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `filler` until its file system is full (ENOSPC).
fn fill(filler: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(filler).unwrap();
    let chunk = vec![0u8; 1024 * 1024];
    let full = loop {
        if let Err(e) = file.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(full.raw_os_error(), Some(28), "ENOSPC: {full}");
}

/// The ring's history, as any member answers it.
async fn history(ring: &Ring) -> pb::HistoryResponse {
    ring.client()
        .call(pb::HistoryRequest::default(), |mut c, r| async move {
            c.history(r).await
        })
        .await
        .unwrap()
}

/// Control planes every member lists.
async fn names_on(ring: &Ring, i: usize) -> Option<Vec<String>> {
    let s = status(&ring.procs[i]).await.ok()?;
    s.freshness.as_ref().filter(|f| f.linearizable)?;
    Some(s.control_planes.into_iter().map(|c| c.name).collect())
}

/// Waits (at most `timeout`, panicking with `what`) until member `i` lists every control plane
/// of `written` in a linearizable read.
async fn lists_all(ring: &Ring, i: usize, written: &[String], timeout: Duration, what: &str) {
    eventually(timeout, what, || async {
        let names = names_on(ring, i).await?;
        written.iter().all(|w| names.contains(w)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_disk_stops_acknowledging_says_why_and_carries_on_once_space_is_back() {
    if !is_root() {
        garden_ring_tests::missing_tool("root (to mount a tmpfs)", "run the suite as root");
        return;
    }
    let mut ring = Ring::prepare(RingOptions::default());
    let metrics: SocketAddr = ring.free_addresses(1)[0];
    // Member c's data directory on a 64 MiB tmpfs.
    let mount = ring.dir.path().join("c-disk");
    let _tmpfs = Tmpfs::mount(&mount, 64);
    ring.procs[2].config.data_dir = mount.join("data");
    ring.procs[2].config.metrics.listen = Some(metrics);
    for p in &mut ring.procs {
        p.spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    add_control_plane(&ring.client(), control_plane("before-full", None))
        .await
        .unwrap();

    // Fill the tmpfs to the brim: writes fail with ENOSPC.
    let filler = mount.join("filler");
    fill(&filler);
    let free = garden_ring::raft::disk::free_bytes(&mount).unwrap();
    assert!(free < MIN_FREE_BYTES, "{free} bytes free");
    let filled_at = Instant::now();
    // The next write reaches c's flusher, which waits instead of writing.
    let mut written = vec!["before-full".to_string()];
    for n in 0..5 {
        let name = format!("while-full-{n}");
        add_control_plane(&ring.client(), control_plane(&name, None))
            .await
            .expect("the other two acknowledge without c");
        written.push(name);
    }
    let problem = eventually(
        Duration::from_secs(10),
        "c says its disk is full",
        || async {
            let s = status(&ring.procs[2]).await.ok()?;
            s.problem.contains("disk is full").then_some(s.problem)
        },
    )
    .await;
    println!(
        "c reports, {} ms after the fill: {problem}",
        filled_at.elapsed().as_millis()
    );
    let (code, body) = http_get(metrics, "/readyz").expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("disk is full"), "{body}");
    let (_, text) = http_get(metrics, "/metrics").unwrap();
    assert!(text.contains("garden_ring_raft_disk_full 1"), "{text}");
    assert!(
        ring.procs[2].log().contains("the Raft log's disk is full"),
        "{}",
        ring.procs[2].log()
    );

    // Space back: c writes what waited, catches up, and is ready again.
    std::fs::remove_file(&filler).unwrap();
    let freed_at = Instant::now();
    lists_all(
        &ring,
        2,
        &written,
        Duration::from_secs(20),
        "c lists every control plane",
    )
    .await;
    eventually(Duration::from_secs(10), "c is ready again", || async {
        let (code, _) = http_get(metrics, "/readyz")?;
        (code == 200).then_some(())
    })
    .await;
    let s = status(&ring.procs[2]).await.unwrap();
    assert!(!s.problem.contains("disk"), "{}", s.problem);
    let (_, text) = http_get(metrics, "/metrics").unwrap();
    assert!(text.contains("garden_ring_raft_disk_full 0"), "{text}");
    assert!(ring.procs[2].log().contains("has room again"));
    println!(
        "space back: c caught up and ready {} ms later",
        freed_at.elapsed().as_millis()
    );
    drop(ring);
}

/// A shared object that makes `fsync` and `fdatasync` fail with EIO while `$GARDEN_RING_FAIL_FSYNC`
/// names a file that exists; built with the system C compiler.
fn fsync_failer(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("failsync.c");
    std::fs::write(
        &source,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>
static int failing(void) {
    const char *f = getenv("GARDEN_RING_FAIL_FSYNC");
    return f && access(f, F_OK) == 0;
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (failing()) { errno = EIO; return -1; }
    return real(fd);
}
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (failing()) { errno = EIO; return -1; }
    return real(fd);
}
"#,
    )
    .unwrap();
    let lib = dir.join("libfailsync.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-ldl")
        .status()
        .ok()?;
    built.success().then_some(lib)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_stops_the_member_and_a_restart_recovers_from_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = fsync_failer(tmp.path()) else {
        garden_ring_tests::missing_tool("cc (a C compiler)", "apt-get install build-essential");
        return;
    };
    // Every member runs with the shim, each with its own trigger; a follower's is pulled.
    let trigger_of = |name: &str| tmp.path().join(format!("fail-fsync-{name}"));
    let mut ring = Ring::prepare(RingOptions::default());
    for p in &mut ring.procs {
        p.env = vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            (
                "GARDEN_RING_FAIL_FSYNC".into(),
                trigger_of(&p.config.name).display().to_string(),
            ),
        ];
        p.spawn();
    }
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let trigger = trigger_of(&ring.procs[victim].config.name);
    // Writes go to the leader itself: the victim, forwarding one, would die holding it.
    let on_leader = ring.procs[ring.index_of(leader)].client();
    let mut written = Vec::new();
    for n in 0..3 {
        let name = format!("before-{n}");
        add_control_plane(&ring.client(), control_plane(&name, None))
            .await
            .unwrap();
        written.push(name);
    }
    lists_all(
        &ring,
        victim,
        &written,
        Duration::from_secs(10),
        "the victim has everything",
    )
    .await;

    // Every fsync of the victim fails from now on; the next write makes its log flush.
    std::fs::write(&trigger, b"").unwrap();
    let failed_at = Instant::now();
    let name = "after-fsync-error".to_string();
    add_control_plane(&on_leader, control_plane(&name, None))
        .await
        .expect("the other two acknowledge");
    written.push(name);
    let exit = ring.procs[victim]
        .wait_exit(Duration::from_secs(10))
        .expect("the victim exits on the failed fsync");
    let log = ring.procs[victim].log();
    assert_eq!(exit.code(), Some(4), "fail-stop status: {exit:?}\n{log}");
    assert!(log.contains("fail-stop"), "{log}");
    println!(
        "the member stopped {} ms after its fsyncs began to fail ({exit})",
        failed_at.elapsed().as_millis()
    );

    // The disk works again: a restart recovers from what is on it and catches up.
    std::fs::remove_file(&trigger).unwrap();
    ring.procs[victim].spawn();
    let name = "after-restart".to_string();
    add_control_plane(&on_leader, control_plane(&name, None))
        .await
        .unwrap();
    written.push(name);
    lists_all(
        &ring,
        victim,
        &written,
        Duration::from_secs(20),
        "the victim, restarted, lists every control plane",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_wal_record_is_dropped_and_the_ring_loses_nothing() {
    let mut ring = Ring::start(RingOptions::default());
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let mut written = Vec::new();
    for n in 0..5 {
        let name = format!("torn-{n}");
        add_control_plane(&ring.client(), control_plane(&name, None))
            .await
            .unwrap();
        written.push(name);
    }
    lists_all(
        &ring,
        victim,
        &written,
        Duration::from_secs(10),
        "the victim has everything",
    )
    .await;
    ring.procs[victim].kill9();
    let wal = ring.procs[victim].config.data_dir.join("raft.wal");
    let (start, len) =
        garden_ring_tests::wal::last_wal_record(&wal).expect("the WAL holds records");
    // A crash in the middle of writing one more record: its head and half its payload reached
    // the file, then the file ends. Its fdatasync never returned, so nobody was told it was
    // durable (tearing a record that was acknowledged would be a disk losing acknowledged
    // data, which no Raft survives on one member's word: see the note on this test).
    let mut bytes = std::fs::read(&wal).unwrap();
    let next = (start + len).next_multiple_of(8);
    let record = bytes[start..start + len].to_vec();
    bytes.truncate(next);
    bytes.extend_from_slice(&record[..len / 2]);
    std::fs::write(&wal, &bytes).unwrap();

    ring.procs[victim].spawn();
    let name = "after-torn".to_string();
    add_control_plane(&ring.client(), control_plane(&name, None))
        .await
        .unwrap();
    written.push(name);
    for i in 0..3 {
        lists_all(
            &ring,
            i,
            &written,
            Duration::from_secs(20),
            &format!("member {i} lists every control plane"),
        )
        .await;
    }
    // The record was never acknowledged: losing it is no divergence (issue 42).
    for i in 0..3 {
        let s = status(&ring.procs[i]).await.unwrap();
        assert!(
            s.members.iter().all(|m| m.diverged.is_empty()),
            "member {i} calls someone diverged: {:?}",
            s.members
        );
    }
    let log = ring.procs[victim].log();
    assert!(
        log.contains("torn"),
        "the dropped record is not reported:\n{log}"
    );
    let history = history(&ring).await;
    assert!(!history.events.is_empty());
    println!(
        "WAL cut {} bytes into a record written after the last acknowledged one (at {next}): the member started and caught up",
        len / 2
    );
}

/// Control plane `name` as member `i` reads it.
async fn cp_on(ring: &Ring, i: usize, name: &str) -> Option<pb::ControlPlane> {
    let s = status(&ring.procs[i]).await.ok()?;
    s.control_planes.into_iter().find(|c| c.name == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_etcd_data_disk_is_reported_not_silently_lost() {
    use garden_ring::backup::etcd::EtcdClient;
    use garden_ring_tests::etcd::{driver_with_deltas, etcd_control_plane, fast, file_backups};

    if !is_root() {
        garden_ring_tests::missing_tool("root (to mount a tmpfs)", "run the suite as root");
        return;
    }
    let mut ring = Ring::prepare(RingOptions {
        driver: driver_with_deltas(3_600_000, 1_000),
        ..RingOptions::default()
    });
    let metrics: SocketAddr = ring.free_addresses(1)[0];
    // Member a's etcd data on a 512 MiB tmpfs: etcd preallocates a 64 MiB WAL file and the
    // next one beside it, and once the filler is gone the host must see more than the 128 MiB
    // below which it reports the disk nearly full.
    let mount = ring.dir.path().join("a-etcd-disk");
    let _tmpfs = Tmpfs::mount(&mount, 512);
    ring.procs[0].config.driver.etcd.data_root = Some(mount.join("etcd"));
    ring.procs[0].config.metrics.listen = Some(metrics);
    for p in &mut ring.procs {
        p.spawn();
    }
    garden_ring_tests::wait_all_healthy(&ring).await;
    let name = "full-etcd";
    let backups = file_backups(ring.dir.path(), name);
    add_control_plane(
        &ring.client(),
        etcd_control_plane(name, "a", &backups["a"], backups.clone()),
    )
    .await
    .unwrap();
    let cp = eventually(FORM, "the control plane runs on a", || async {
        cp_on(&ring, 1, name)
            .await
            .filter(|c| c.phase == "running" && c.host == "a")
    })
    .await;
    let endpoint = format!("http://{}", cp.endpoints["a"]);
    let etcd = EtcdClient::connect(&endpoint, fast()).await.unwrap();
    let mut acked = Vec::new();
    for n in 0..20 {
        let key = format!("/registry/before/{n:03}");
        etcd.put(key.as_bytes(), b"v").await.unwrap();
        acked.push(key);
    }

    // Fill the tmpfs, then write values of 256 KiB until etcd fails to take one.
    let filler = mount.join("filler");
    fill(&filler);
    let filled_at = Instant::now();
    let value = vec![b'x'; 256 * 1024];
    let mut refused = None;
    for n in 0..1_000 {
        let key = format!("/registry/while-full/{n:04}");
        match etcd.put(key.as_bytes(), &value).await {
            Ok(_) => acked.push(key),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("etcd takes no 256 MB of writes on a full disk");
    println!(
        "etcd refused a write {} ms after the fill, after {} acknowledged ones: {refused}",
        filled_at.elapsed().as_millis(),
        acked.len()
    );

    // Reported: `cp get` (every member), history, the metric; not moved, not dropped.
    let problem = eventually(
        Duration::from_secs(30),
        "the control plane's problem is in the state",
        || async {
            let cp = cp_on(&ring, 2, name).await?;
            cp.problem.map(|p| (cp.host, cp.epoch, p.text))
        },
    )
    .await;
    println!(
        "reported {} ms after the fill: {problem:?}",
        filled_at.elapsed().as_millis()
    );
    assert_eq!((problem.0.as_str(), problem.1), ("a", cp.epoch));
    assert!(problem.2.contains("etcd"), "{}", problem.2);
    let (_, text) = http_get(metrics, "/metrics").unwrap();
    assert!(
        text.contains(&format!(
            "garden_ring_control_plane_problem{{control_plane=\"{name}\",host=\"a\"}} 1"
        )),
        "{text}"
    );
    let history = history(&ring).await;
    assert!(
        history
            .events
            .iter()
            .any(|e| e.action == "control-plane.problem" && e.subject == name),
        "{:?}",
        history.events
    );
    // While the disk stays full, the problem stays, whether the restart after the pause fails
    // again or etcd serves on the full disk for a while (it fails at its next WAL file).
    let mut seen = std::collections::BTreeSet::new();
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        let cp = cp_on(&ring, 2, name).await.expect("c answers");
        let problem = cp
            .problem
            .expect("the problem stays while the disk is full");
        assert!(problem.text.contains("MiB free"), "{}", problem.text);
        seen.insert(
            problem
                .text
                .split(';')
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "still full {} ms after the fill, reported all along: {seen:?}",
        filled_at.elapsed().as_millis()
    );

    // Space back: it serves again at the same epoch with every acknowledged write, and the
    // problem clears.
    std::fs::remove_file(&filler).unwrap();
    let freed_at = Instant::now();
    let cp_after = eventually(
        Duration::from_secs(60),
        "the control plane runs on a without a problem",
        || async {
            let cp = cp_on(&ring, 2, name).await?;
            (cp.phase == "running" && cp.problem.is_none()).then_some(cp)
        },
    )
    .await;
    assert_eq!((cp_after.host.as_str(), cp_after.epoch), ("a", cp.epoch));
    let keys: std::collections::BTreeSet<String> =
        eventually(Duration::from_secs(30), "a's etcd answers", || async {
            let etcd = EtcdClient::connect(&endpoint, fast()).await.ok()?;
            let kvs = etcd.get_prefix_keys(b"/registry/").await.ok()?;
            Some(
                kvs.into_iter()
                    .map(|kv| String::from_utf8(kv.key).unwrap())
                    .collect(),
            )
        })
        .await;
    let missing: Vec<_> = acked.iter().filter(|k| !keys.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
    let (_, text) = http_get(metrics, "/metrics").unwrap();
    assert!(
        text.contains(&format!(
            "garden_ring_control_plane_problem{{control_plane=\"{name}\",host=\"a\"}} 0"
        )),
        "{text}"
    );
    println!(
        "space back: serving again without a problem {} ms later, all {} acknowledged writes there",
        freed_at.elapsed().as_millis(),
        acked.len()
    );
}

//! `ringctl demo`: the main job on one machine.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use garden_ring::core::backup_name::SnapshotName;
use garden_ring_tests::{binary, eventually, ringctl};
use serde_json::Value;

/// A base port with the ports of a three-member demo free (base+10i: admin, +1: peer, +3: DNS,
/// +5..+7: the sample control planes' endpoints). Bases are multiples of 30 apart, so demos of
/// concurrent tests never overlap.
fn free_base() -> u16 {
    for attempt in 0..200u32 {
        let slot = (std::process::id() + attempt * 37) % 1_000;
        let base = 20_000 + 30 * slot as u16;
        let free = (0..3u16).all(|i| {
            let admin = base + 10 * i;
            TcpListener::bind(("127.0.0.1", admin)).is_ok()
                && TcpListener::bind(("127.0.0.1", admin + 1)).is_ok()
                && TcpListener::bind(("127.0.0.1", admin + 3)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", admin + 3)).is_ok()
                && (5..8).all(|p| TcpListener::bind(("127.0.0.1", admin + p)).is_ok())
        });
        if free {
            return base;
        }
    }
    panic!("no free port range for the demo");
}

fn alive(pid: i64) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[tokio::test]
async fn detached_demo_reports_its_members_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let out = Command::new(binary("ringctl"))
        .args([
            "demo",
            "--detach",
            "--output",
            "json",
            "--base-port",
            &base.to_string(),
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let demo: Value = serde_json::from_slice(&out.stdout).expect("demo --output json prints JSON");
    let members = demo["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let mut endpoints = Vec::new();
    for (m, (name, zone)) in members
        .iter()
        .zip([("a", "zone-a"), ("b", "zone-b"), ("c", "zone-c")])
    {
        assert_eq!(m["name"], name);
        assert_eq!(m["zone"], zone);
        let pid = m["pid"].as_i64().unwrap();
        assert!(alive(pid), "member {name} runs");
        let pid_file = dir.path().join(name).join("ringd.pid");
        assert_eq!(
            std::fs::read_to_string(&pid_file).unwrap().trim(),
            pid.to_string()
        );
        assert!(dir.path().join(name).join("ringd.toml").is_file());
        assert!(std::path::Path::new(m["data_dir"].as_str().unwrap()).is_dir());
        endpoints.push(m["admin_endpoint"].as_str().unwrap().to_string());
    }
    assert_eq!(endpoints[0], format!("127.0.0.1:{base}"));

    // The demo wrote a client config naming its endpoints and the admin certificate:
    // `RINGCTL_CONFIG=DIR/ringctl.toml ringctl status` just works, over mutual TLS.
    let client_config = std::path::PathBuf::from(demo["client_config"].as_str().unwrap());
    assert_eq!(
        client_config,
        dir.path().canonicalize().unwrap().join("ringctl.toml")
    );
    assert_eq!(demo["tls"], true);
    let s = ringctl_json(&client_config, &["status"]);
    assert!(
        s["tls"]["identity"]
            .as_str()
            .unwrap()
            .starts_with("member:"),
        "status names the member's certificate: {s}"
    );
    // The same endpoints without a certificate are refused.
    let plain = ringctl(&client_config, &endpoints, &["status", "--insecure"]);
    assert!(!plain.status.success());
    assert!(s["leader_id"].as_u64().unwrap() >= 1);
    assert!(s["term"].as_u64().unwrap() >= 1);
    for m in s["members"].as_array().unwrap() {
        for field in ["id", "name", "zone", "address", "role", "health"] {
            assert!(!m[field].is_null(), "member field {field} missing in {m}");
        }
        assert_eq!(m["role"], "voter");
    }
    let cps = s["control_planes"].as_array().unwrap();
    assert_eq!(cps.len(), 3, "the demo registers its sample control planes");
    for cp in cps {
        for field in ["name", "host", "epoch", "phase"] {
            assert!(
                !cp[field].is_null(),
                "control plane field {field} missing in {cp}"
            );
        }
        assert_ne!(cp["host"], cp["home"], "never hosted at home");
    }

    // Every member serves the demo's zone (builtin DNS): the sample control planes' names
    // answer their hosts' endpoints.
    for m in members {
        let server: std::net::SocketAddr = m["dns_endpoint"].as_str().unwrap().parse().unwrap();
        garden_ring_tests::eventually(
            std::time::Duration::from_secs(20),
            &format!("{server} answers cp-a"),
            || async {
                let d =
                    garden_ring_tests::dig::dig(server, "cp-a.demo.garden-ring.local", "A", false);
                (d.answers == ["127.0.0.1"] && d.authoritative).then_some(())
            },
        )
        .await;
    }

    // A second demo in the same directory is refused while the first runs.
    let again = Command::new(binary("ringctl"))
        .args([
            "demo",
            "--detach",
            "--base-port",
            &base.to_string(),
            "--dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    let stop = Command::new(binary("ringctl"))
        .args(["demo", "--stop", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    for m in members {
        assert!(
            !alive(m["pid"].as_i64().unwrap()),
            "member {} stopped",
            m["name"]
        );
    }
}

#[tokio::test]
async fn attached_demo_stops_its_members_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let mut demo = Command::new(binary("ringctl"))
        .args([
            "demo",
            "--no-samples",
            "--base-port",
            &base.to_string(),
            "--dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the demo to say the ring is up (it prints live status afterwards).
    let stdout = demo.stdout.take().unwrap();
    let up = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let seen = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains("ring is up"));
        // Keep draining so the demo never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        seen
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(30), up)
            .await
            .unwrap()
            .unwrap(),
        "demo never reported the ring up"
    );
    let endpoint = vec![format!("127.0.0.1:{base}")];
    eventually(Duration::from_secs(10), "the demo ring answers", || async {
        let out = ringctl(
            &dir.path().join("ringctl.toml"),
            &endpoint,
            &["status", "--output", "json"],
        );
        let s: Value = serde_json::from_slice(&out.stdout).ok()?;
        (s["leader_id"].as_u64()? > 0).then_some(())
    })
    .await;
    let pids: Vec<i64> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            std::fs::read_to_string(dir.path().join(n).join("ringd.pid"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(demo.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = demo.wait().unwrap();
    assert!(
        status.success(),
        "ringctl demo exits cleanly on Ctrl-C: {status}"
    );
    for pid in pids {
        assert!(!alive(pid), "member {pid} stopped with the demo");
    }
}

fn ringctl_json(client_config: &std::path::Path, args: &[&str]) -> Value {
    let out = Command::new(binary("ringctl"))
        .args(args)
        .args(["--output", "json"])
        .env("RINGCTL_CONFIG", client_config)
        .env_remove("RINGCTL_ENDPOINTS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ringctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The demo with real etcd: a key written to a sample control plane survives
/// `ringctl demo fail-zone` of its host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_fail_zone_moves_an_etcd_control_plane_with_its_data() {
    use garden_ring::backup::etcd::EtcdClient;
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let out = Command::new(binary("ringctl"))
        .args(["demo", "--detach", "--driver", "etcd", "--output", "json"])
        .args(["--base-port", &base.to_string(), "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let demo: Value = serde_json::from_slice(&out.stdout).unwrap();
    let client_config = std::path::PathBuf::from(demo["client_config"].as_str().unwrap());
    let cp_a = || {
        let s = ringctl_json(&client_config, &["status"]);
        s["control_planes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "cp-a")
            .cloned()
            .unwrap()
    };
    let cp = eventually(Duration::from_secs(30), "cp-a runs", || async {
        let cp = cp_a();
        (cp["phase"] == "running").then_some(cp)
    })
    .await;
    let host = cp["host"].as_str().unwrap().to_string();
    let got = ringctl_json(&client_config, &["cp", "get", "cp-a"]);
    let endpoint = |member: &str| format!("http://{}", got["endpoints"][member].as_str().unwrap());
    let etcd = EtcdClient::connect(&endpoint(&host), garden_ring_tests::etcd::fast())
        .await
        .unwrap();
    let revision = etcd.put(b"/registry/demo", b"kept").await.unwrap();
    // The next delta snapshot (every second in the demo) holds it: a complete one, not the
    // staging file (`<name>#<n>`) of an upload still under way, which a zone loss would cut.
    let zone_dir = dir
        .path()
        .join("backups")
        .join(format!("zone-{host}"))
        .join("cp-a")
        .join("v2");
    eventually(
        Duration::from_secs(15),
        "a snapshot holds the key",
        || async {
            std::fs::read_dir(&zone_dir).ok()?.flatten().find_map(|e| {
                let name = SnapshotName::parse(&e.file_name().to_string_lossy()).ok()?;
                (name.last_revision() >= revision).then_some(())
            })
        },
    )
    .await;

    let failed = Command::new(binary("ringctl"))
        .args(["demo", "fail-zone", &format!("zone-{host}"), "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        failed.status.success(),
        "{}",
        String::from_utf8_lossy(&failed.stderr)
    );
    let said = String::from_utf8_lossy(&failed.stdout);
    assert!(
        said.contains("killed ringd") && said.contains("etcd"),
        "{said}"
    );

    let moved = eventually(Duration::from_secs(30), "cp-a runs elsewhere", || async {
        let cp = cp_a();
        (cp["phase"] == "running" && cp["host"] != host.as_str()).then_some(cp)
    })
    .await;
    let new_host = moved["host"].as_str().unwrap();
    let etcd = EtcdClient::connect(&endpoint(new_host), garden_ring_tests::etcd::fast())
        .await
        .unwrap();
    let kv = etcd
        .get(b"/registry/demo")
        .await
        .unwrap()
        .expect("the key survived");
    assert_eq!(kv.value, b"kept");
    // A zone that does not exist is a clear error.
    let bad = Command::new(binary("ringctl"))
        .args(["demo", "fail-zone", "zone-x", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no demo member for zone"));
    let _ = Command::new(binary("ringctl"))
        .args(["demo", "--stop", "--dir"])
        .arg(dir.path())
        .output();
}

//! Bad input to `ringctl` and `ringd`: each gets one clear error line and a non-zero exit, and
//! nothing is half-applied.

use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::Duration;

use garden_ring_tests::{Ring, RingOptions, binary, member_config, status};

fn stderr_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !text.contains("panicked"),
        "a panic is never an answer to bad input: {text}"
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one error line expected, got: {text}"
    );
    lines[0].to_string()
}

fn refused(out: Output, expect: &str) {
    assert!(
        !out.status.success(),
        "expected failure containing {expect:?}, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let line = stderr_line(&out);
    assert!(
        line.contains(expect),
        "error line {line:?} should mention {expect:?}"
    );
}

#[tokio::test]
async fn ringctl_refuses_bad_input_and_changes_nothing() {
    let ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], Duration::from_secs(20))
        .await;
    let ok = ring.ringctl(&[
        "cp",
        "add",
        "good",
        "--dns-name",
        "good.ring.test",
        "--endpoint-on",
        "b=10.0.0.2:443",
        "--backup",
        "s3://bkt/good",
        "--home",
        "a",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let snapshot = |s: garden_ring::pb::StatusResponse| {
        let members: Vec<_> = s
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    m.name.clone(),
                    m.zone.clone(),
                    m.address.clone(),
                    m.role.clone(),
                )
            })
            .collect();
        (members, s.control_planes, s.paused)
    };
    // Read-your-write on the member we compare with, before refusing anything.
    garden_ring_tests::eventually(
        Duration::from_secs(10),
        "a applied the good write, and its host serves it",
        || async {
            let s = status(&ring.procs[0]).await.ok()?;
            s.control_planes
                .iter()
                .any(|c| c.name == "good" && c.phase == "running")
                .then_some(())
        },
    )
    .await;
    let before = snapshot(status(&ring.procs[0]).await.unwrap());
    // Operator-visible history (the leader's own records may come meanwhile).
    let operator_history = || {
        let out = ring.ringctl(&["history", "--limit", "0", "--output", "json"]);
        let events: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        events
            .into_iter()
            .filter(|e| {
                // The leader's own records, which come when they come: health reports, a host
                // serving, the ring raising its version once every member reported.
                !["member.health", "control-plane.serving", "ring.version"]
                    .contains(&e["action"].as_str().unwrap_or_default())
            })
            .collect::<Vec<_>>()
    };
    let history_before = operator_history();

    let add = |id: &str, name: &str, zone: &str, addr: &str, admin: &str| {
        ring.ringctl(&[
            "member",
            "add",
            "--id",
            id,
            "--name",
            name,
            "--zone",
            zone,
            "--address",
            addr,
            "--admin-address",
            admin,
            "--catch-up-timeout",
            "1",
        ])
    };
    refused(
        add(
            "9",
            "Bad_Name",
            "zone-x",
            "127.0.0.1:9001",
            "127.0.0.1:9002",
        ),
        "invalid member name",
    );
    refused(
        add("9", "x-", "zone-x", "127.0.0.1:9001", "127.0.0.1:9002"),
        "invalid member name",
    );
    refused(
        add(
            "9",
            &"x".repeat(64),
            "zone-x",
            "127.0.0.1:9001",
            "127.0.0.1:9002",
        ),
        "invalid member name",
    );
    refused(
        add("9", "x", "Zone X", "127.0.0.1:9001", "127.0.0.1:9002"),
        "invalid zone",
    );
    refused(
        add("9", "x", "zone-x", "127.0.0.1", "127.0.0.1:9002"),
        "invalid member address",
    );
    refused(
        add("9", "x", "zone-x", "300.1.1.1:80", "127.0.0.1:9002"),
        "invalid member address",
    );
    refused(
        add("9", "x", "zone-x", "127.0.0.1:9001", "[::1:9002"),
        "invalid member admin address",
    );
    refused(
        add("9", "x", "zone-x", "127.0.0.1:9001", "127.0.0.1:9001"),
        "must differ",
    );
    refused(
        add("0", "x", "zone-x", "127.0.0.1:9001", "127.0.0.1:9002"),
        "invalid member id",
    );
    refused(
        add("1", "x", "zone-x", "127.0.0.1:9001", "127.0.0.1:9002"),
        "member id 1 is already in use",
    );
    refused(
        add("9", "a", "zone-x", "127.0.0.1:9001", "127.0.0.1:9002"),
        "already used by member 1",
    );
    refused(
        add(
            "notanumber",
            "x",
            "zone-x",
            "127.0.0.1:9001",
            "127.0.0.1:9002",
        ),
        "invalid value",
    );
    refused(ring.ringctl(&["member", "remove", "zz"]), "unknown member");
    refused(ring.ringctl(&["member", "promote", "99"]), "unknown member");
    refused(
        ring.ringctl(&["member", "remove", "b"]),
        "hosts control planes good",
    );

    let cp = |args: &[&str]| {
        let mut all = vec!["control-plane", "add"];
        all.extend_from_slice(args);
        ring.ringctl(&all)
    };
    refused(
        cp(&[
            "outside",
            "--dns-name",
            "api.evilring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "is not inside zone ring.test (the ring's DNS zone",
    );
    refused(
        cp(&[
            "Bad",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "invalid control plane name",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x..test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "invalid DNS name",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "zz=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "unknown member \"zz\"",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a:1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "must be MEMBER=HOST:PORT",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a=1.2.3.4",
            "--backup",
            "s3://bkt/x",
        ]),
        "invalid endpoint",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/../../etc",
        ]),
        "invalid backup location",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "ftp://bkt/x",
        ]),
        "not supported",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "x.ring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
            "--host",
            "a",
            "--home",
            "a",
        ]),
        "never hosted at home",
    );
    refused(
        cp(&[
            "x",
            "--dns-name",
            "good.ring.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "already used by control plane \"good\"",
    );
    refused(
        cp(&[
            "good",
            "--dns-name",
            "g2.test",
            "--endpoint-on",
            "a=1.2.3.4:1",
            "--backup",
            "s3://bkt/x",
        ]),
        "already exists",
    );
    refused(
        ring.ringctl(&["cp", "get", "nope"]),
        "unknown control plane",
    );
    refused(
        ring.ringctl(&["cp", "remove", "nope"]),
        "unknown control plane",
    );
    let long_reason = "r".repeat(600);
    refused(
        ring.ringctl(&["pause", "--reason", &long_reason]),
        "invalid reason",
    );
    refused(
        ring.ringctl(&["leader", "transfer", "--to", "zz"]),
        "unknown member",
    );
    refused(
        ring.ringctl(&["member", "add", "--id", "9"]),
        "required arguments were not provided",
    );
    refused(ring.ringctl(&["frobnicate"]), "unrecognized subcommand");

    let after = snapshot(status(&ring.procs[0]).await.unwrap());
    assert_eq!(before, after, "refused commands changed the state");
    let history_after = operator_history();
    assert_eq!(
        history_before, history_after,
        "refused commands left history entries"
    );

    // An unreachable ring is one clear line too.
    let out = garden_ring_tests::ringctl(
        &ring.client_config,
        &["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        &["status"],
    );
    refused(out, "no member answered: 127.0.0.1:1");
    let out = garden_ring_tests::ringctl(&ring.client_config, &["not a host".into()], &["status"]);
    refused(out, "invalid endpoint");
}

fn ringd(args: &[&str]) -> Output {
    Command::new(binary("ringd"))
        .args(args)
        .output()
        .expect("run ringd")
}

fn write_config(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// A valid config of member 1 with no founders, on free ports.
fn lone_member_config(dir: &std::path::Path) -> garden_ring::config::Config {
    member_config(
        dir,
        1,
        free_port(),
        free_port(),
        Vec::new(),
        &RingOptions::default(),
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn ringd_refuses_bad_configs_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = lone_member_config(dir.path());
    let good_text = good.to_toml();
    let good_path = write_config(dir.path(), "good.toml", &good_text);

    let out = ringd(&["--check-config", "--config", &good_path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Valid, with what the timings cost said (a loopback lease is fragile across zones).
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warned: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("ringd: warning: "))
        .collect();
    assert_eq!(warned, good.timing.warnings(), "{stderr}");
    assert!(
        warned
            .iter()
            .any(|w| w.starts_with("timing.lease_ms = 1000")),
        "{stderr}"
    );

    refused(
        ringd(&["--config", "/nonexistent/ringd.toml"]),
        "cannot read config file /nonexistent/ringd.toml",
    );
    let p = write_config(dir.path(), "garbage.toml", "\u{1}\u{2} this is [not toml");
    refused(ringd(&["--config", &p]), "is not valid");
    let p = write_config(
        dir.path(),
        "truncated.toml",
        // Cut in the middle of a key, as a half-written file would be.
        &good_text[..good_text.find("data_dir").unwrap() + 5],
    );
    refused(ringd(&["--config", &p]), "is not valid");
    let p = write_config(
        dir.path(),
        "typo.toml",
        &good_text.replace("zone =", "zoen ="),
    );
    refused(ringd(&["--config", &p]), "unknown field `zoen`");
    let p = write_config(
        dir.path(),
        "badname.toml",
        &good_text.replace("name = \"a\"", "name = \"A!\""),
    );
    refused(ringd(&["--config", &p]), "config name");
    let p = write_config(
        dir.path(),
        "badaddr.toml",
        &good_text.replace(
            "listen_peer = \"127.0.0.1:",
            "listen_peer = \"127.0.0.1:99999",
        ),
    );
    refused(ringd(&["--config", &p]), "is not valid");
    refused(
        ringd(&["--config", &good_path, "--id", "0"]),
        "config id: must be at least 1",
    );

    // The admin address is in use.
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = good.clone();
    cfg.listen_admin = busy.local_addr().unwrap();
    let p = write_config(dir.path(), "busy.toml", &cfg.to_toml());
    refused(ringd(&["--config", &p]), "already in use");
    drop(busy);

    // The data directory cannot be created (its parent is a file).
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let mut cfg = good.clone();
    cfg.data_dir = file.join("data");
    let p = write_config(dir.path(), "baddir.toml", &cfg.to_toml());
    refused(ringd(&["--config", &p]), "data directory");

    // A corrupt database file.
    let mut cfg = good.clone();
    cfg.data_dir = dir.path().join("corrupt");
    std::fs::create_dir_all(&cfg.data_dir).unwrap();
    std::fs::write(cfg.data_dir.join("ring.redb"), vec![0xAB; 4096]).unwrap();
    let p = write_config(dir.path(), "corrupt.toml", &cfg.to_toml());
    refused(ringd(&["--config", &p]), "ring.redb");
}

#[test]
fn ringd_refuses_bad_etcd_driver_settings_with_one_clear_line() {
    use garden_ring::config::DriverKind;
    let dir = tempfile::tempdir().unwrap();
    let good = lone_member_config(dir.path());
    let etcd_dir = garden_ring_tests::etcd::tool("etcd")
        .parent()
        .unwrap()
        .to_path_buf();
    let mut cfg = good.clone();
    cfg.driver.kind = DriverKind::Etcd;
    cfg.driver.etcd.bin_dir = Some(etcd_dir);
    let p = write_config(dir.path(), "etcd-good.toml", &cfg.to_toml());
    let out = ringd(&["--check-config", "--config", &p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A directory without etcd in it.
    let empty = dir.path().join("no-etcd");
    std::fs::create_dir_all(&empty).unwrap();
    let mut bad = cfg.clone();
    bad.driver.etcd.bin_dir = Some(empty.clone());
    let p = write_config(dir.path(), "etcd-missing.toml", &bad.to_toml());
    refused(
        ringd(&["--check-config", "--config", &p]),
        "config driver.etcd.bin_dir: ",
    );
    // etcd without a tool to restore snapshots with.
    std::fs::write(empty.join("etcd"), b"#!/bin/sh\n").unwrap();
    let p = write_config(dir.path(), "etcd-no-restore.toml", &bad.to_toml());
    refused(
        ringd(&["--check-config", "--config", &p]),
        "neither etcdutl (etcd 3.5+) nor etcdctl",
    );
    for (field, value) in [
        ("full_snapshot_interval_ms", "0"),
        ("full_snapshot_interval_ms", "99999999999"),
        ("delta_snapshot_period_ms", "50"),
        ("delta_snapshot_memory_limit_bytes", "10"),
        ("start_timeout_ms", "0"),
        ("restore_timeout_ms", "0"),
        ("max_backups", "0"),
        ("garbage_collection_period_ms", "1000"),
        ("quota_backend_bytes", "1024"),
        ("defragmentation_interval_ms", "999"),
    ] {
        let etcd = &cfg.driver.etcd;
        let current = match field {
            "full_snapshot_interval_ms" => etcd.full_snapshot_interval_ms,
            "delta_snapshot_period_ms" => etcd.delta_snapshot_period_ms,
            "delta_snapshot_memory_limit_bytes" => etcd.delta_snapshot_memory_limit_bytes,
            "start_timeout_ms" => etcd.start_timeout_ms,
            "restore_timeout_ms" => etcd.restore_timeout_ms,
            "max_backups" => etcd.max_backups,
            "garbage_collection_period_ms" => etcd.garbage_collection_period_ms,
            "quota_backend_bytes" => etcd.quota_backend_bytes,
            _ => etcd.defragmentation_interval_ms,
        };
        let text = cfg.to_toml().replace(
            &format!("\n{field} = {current}\n"),
            &format!("\n{field} = {value}\n"),
        );
        assert_ne!(text, cfg.to_toml(), "{field} not in the config");
        let p = write_config(dir.path(), &format!("etcd-{field}-{value}.toml"), &text);
        refused(
            ringd(&["--check-config", "--config", &p]),
            &format!("config driver.etcd.{field}: {value} must be "),
        );
    }
    for (from, to, says) in [
        (
            "auto_compaction_retention = \"30m\"",
            "auto_compaction_retention = \"30x\"",
            "config driver.etcd.auto_compaction_retention: \"30x\": with auto_compaction_mode = \"periodic\", a positive duration",
        ),
        (
            "auto_compaction_mode = \"periodic\"",
            "auto_compaction_mode = \"revision\"",
            "config driver.etcd.auto_compaction_retention: \"30m\": with auto_compaction_mode = \"revision\", a positive number of revisions",
        ),
        (
            "garbage_collection_policy = \"exponential\"",
            "garbage_collection_policy = \"newest\"",
            "unknown variant `newest`, expected one of `Exponential`, `exponential`, `LimitBased`, `limit-based`",
        ),
    ] {
        let text = cfg.to_toml().replace(from, to);
        assert_ne!(text, cfg.to_toml(), "{from} not in the config");
        let p = write_config(dir.path(), "etcd-retention.toml", &text);
        refused(ringd(&["--check-config", "--config", &p]), says);
    }
    let text = cfg.to_toml().replace("compress = false", "compres = false");
    let p = write_config(dir.path(), "etcd-typo.toml", &text);
    refused(
        ringd(&["--check-config", "--config", &p]),
        "unknown field `compres`",
    );
}

#[test]
fn ringd_refuses_bad_dns_settings_and_key_files_with_one_clear_line() {
    use garden_ring::config::{DnsProvider, Rfc2136Settings};
    let dir = tempfile::tempdir().unwrap();
    let good = lone_member_config(dir.path());
    let with_key = |name: &str, key_text: Option<&str>| {
        let key_file = dir.path().join(format!("{name}.key"));
        if let Some(text) = key_text {
            std::fs::write(&key_file, text).unwrap();
        }
        let mut cfg = good.clone();
        cfg.dns.provider = DnsProvider::Rfc2136;
        cfg.dns.rfc2136 = Some(Rfc2136Settings {
            server: "127.0.0.1:53".parse().unwrap(),
            key_file,
        });
        write_config(dir.path(), &format!("{name}.toml"), &cfg.to_toml())
    };
    const SECRET: &str = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==";
    let good_key =
        format!("key \"ring-key\" {{\n\talgorithm hmac-sha256;\n\tsecret \"{SECRET}\";\n}};\n");
    let p = with_key("good-key", Some(&good_key));
    let out = ringd(&["--check-config", "--config", &p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for (name, text, expect) in [
        ("missing", None, "does not exist"),
        (
            "garbage",
            Some("this is not a key file".to_string()),
            "not a TSIG key file",
        ),
        (
            "md5",
            Some(good_key.replace("hmac-sha256", "hmac-md5")),
            "hmac-md5",
        ),
        (
            "badbase64",
            Some(good_key.replace(SECRET, "***not base64***")),
            "not valid base64",
        ),
        (
            "truncated",
            Some(good_key[..good_key.len() / 2].to_string()),
            "ring",
        ),
    ] {
        let p = with_key(name, text.as_deref());
        let out = ringd(&["--check-config", "--config", &p]);
        let line = stderr_line(&out);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(line.contains("dns.rfc2136"), "{name}: {line}");
        assert!(
            line.contains(&format!("{name}.key")),
            "{name}: names the file: {line}"
        );
        assert!(line.contains(expect), "{name}: {line}");
        assert!(
            !line.contains(SECRET),
            "{name}: never shows the secret: {line}"
        );
        // And ringd refuses to start with it, with the same line.
        let out = ringd(&["--config", &p]);
        assert!(!out.status.success(), "{name}: started");
        assert!(stderr_line(&out).contains(&format!("{name}.key")), "{name}");
    }

    let mut bad = Vec::new();
    let mut cfg = good.clone();
    cfg.dns.ttl_s = 0;
    bad.push(("ttl0", cfg.to_toml(), "dns.ttl_s"));
    let mut cfg = good.clone();
    cfg.dns.ttl_s = 4_000_000_000;
    bad.push(("ttlhuge", cfg.to_toml(), "dns.ttl_s"));
    let mut cfg = good.clone();
    cfg.dns.zone = Some("-bad-.test".into());
    bad.push(("zone", cfg.to_toml(), "dns.zone"));
    let text = good.to_toml();
    assert!(text.contains("provider = \"builtin\""), "{text}");
    bad.push((
        "provider",
        text.replace("provider = \"builtin\"", "provider = \"route53\""),
        "unknown variant `route53`",
    ));
    bad.push((
        "nokey",
        text.replace("provider = \"builtin\"", "provider = \"rfc2136\""),
        "dns.rfc2136",
    ));
    bad.push((
        "listen",
        text.replace(
            "provider = \"builtin\"",
            "provider = \"builtin\"\nlisten = \"nowhere:53\"",
        ),
        "is not valid",
    ));
    for (name, text, expect) in bad {
        let p = write_config(dir.path(), &format!("{name}.toml"), &text);
        refused(ringd(&["--check-config", "--config", &p]), expect);
    }

    // The DNS port is in use.
    let busy = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cfg = good.clone();
    cfg.dns.listen = Some(busy.local_addr().unwrap());
    let p = write_config(dir.path(), "dnsbusy.toml", &cfg.to_toml());
    refused(ringd(&["--config", &p]), "cannot serve DNS on");
}

#[test]
fn ringd_refuses_a_data_dir_of_another_member_or_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let options = RingOptions::default();
    let one = member_config(
        dir.path(),
        1,
        free_port(),
        free_port(),
        Vec::new(),
        &options,
    );
    let p1 = write_config(dir.path(), "one.toml", &one.to_toml());
    let mut first = Command::new(binary("ringd"))
        .args(["--config", &p1])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it holds its data directory (the database file exists and is locked).
    let db = one.data_dir.join("ring.redb");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !db.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "ringd did not create {}",
            db.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut twin = one.clone();
    twin.listen_admin = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    twin.listen_peer = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let p = write_config(dir.path(), "twin.toml", &twin.to_toml());
    refused(ringd(&["--config", &p]), "in use by another process");
    first.kill().unwrap();
    first.wait().unwrap();

    let mut other = twin.clone();
    other.id = 2;
    other.name = "b".into();
    if let Some(tls) = &mut other.tls {
        tls.files = garden_ring_tests::ensure_cert(
            &garden_ring_tests::certs_dir(dir.path()),
            &garden_ring::tls::Identity::new(garden_ring::tls::Role::Member, "b").unwrap(),
        );
    }
    let p = write_config(dir.path(), "other.toml", &other.to_toml());
    refused(ringd(&["--config", &p]), "belongs to member id 1");
}

#[test]
fn shipped_example_configs_are_valid() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
    let mut checked = 0;
    // The examples name their certificates relative to themselves: check each copy next to a
    // freshly made set (a, b, c founders; d joins).
    let dir = tempfile::tempdir().unwrap();
    let certs = garden_ring_tests::certs_dir(dir.path());
    for name in ["a", "b", "c", "d"] {
        garden_ring_tests::ensure_cert(
            &certs,
            &garden_ring::tls::Identity::new(garden_ring::tls::Role::Member, name).unwrap(),
        );
    }
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let copy = dir.path().join(path.file_name().unwrap());
            std::fs::copy(&path, &copy).unwrap();
            let out = ringd(&["--check-config", "--config", copy.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "expected the example configs in {}",
        examples.display()
    );
}

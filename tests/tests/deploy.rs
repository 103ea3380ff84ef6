//! What `deploy/` ships is checked against the real binaries: every example config and every
//! Kubernetes overlay's ringd.toml passes `ringd --check-config` with certificates made by
//! `ringctl certs init`, the overlays' configs agree with the StatefulSet's ports and volume,
//! and the Grafana dashboard uses only metrics `/metrics` declares, in PromQL that
//! `promtool` accepts. (scripts/test.sh renders and schema-checks the manifests themselves.)

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use garden_ring::config::Config;
use garden_ring_tests::{Ports, Ring, RingOptions, binary, eventually, http_get};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn must_succeed(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `*.toml` below `dir`, sorted.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(toml_files(&path));
        } else if path.extension().is_some_and(|e| e == "toml") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// A CA and member certificates for a to e (and an operator), made as the docs say.
fn make_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("made-certs");
    let out = run(
        &binary("ringctl"),
        &[
            "certs",
            "init",
            "--dir",
            certs.to_str().unwrap(),
            "--member",
            "a,b,c,d,e",
            "--admin",
            "alice",
        ],
    );
    must_succeed("ringctl certs init", &out);
    certs
}

/// Runs `ringd --check-config` on a copy of `config` placed in a directory of its own as
/// `ringd.toml`, with the member's certificate files copied to the names `files` gives (relative
/// to the config, as the config names them). Returns the parsed config.
fn check_config(
    config: &Path,
    certs: &Path,
    files: impl Fn(&str) -> [(String, String); 3],
) -> Config {
    let text = std::fs::read_to_string(config).unwrap();
    let parsed =
        Config::parse(config, &text).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in files(&parsed.name) {
        let to = dir.path().join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(certs.join(&from), &to)
            .unwrap_or_else(|e| panic!("copy {from} to {}: {e}", to.display()));
    }
    let copy = dir.path().join("ringd.toml");
    std::fs::write(&copy, &text).unwrap();
    let out = run(
        &binary("ringd"),
        &["--check-config", "--config", copy.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "ringd --check-config refuses {}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parsed
}

#[test]
fn every_example_config_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(dir.path());
    let examples = toml_files(&deploy_dir().join("examples"));
    let mut by_layout: std::collections::BTreeMap<String, Vec<Config>> = Default::default();
    for path in &examples {
        // The examples name ca.pem, member-<name>.pem and member-<name>-key.pem in certs/.
        let config = check_config(path, &certs, |name| {
            [
                ("ca.pem".into(), "certs/ca.pem".into()),
                (
                    format!("member-{name}.pem"),
                    format!("certs/member-{name}.pem"),
                ),
                (
                    format!("member-{name}-key.pem"),
                    format!("certs/member-{name}-key.pem"),
                ),
            ]
        });
        let layout = path.parent().unwrap().display().to_string();
        by_layout.entry(layout).or_default().push(config);
    }
    // The members of one layout form one ring: the same founders, timings and DNS zone,
    // each listed in the founders as it advertises itself.
    for (layout, configs) in &by_layout {
        let founders: Vec<&Config> = configs
            .iter()
            .filter(|c| !c.initial_members.is_empty())
            .collect();
        if founders.len() < 3 {
            continue;
        }
        for c in &founders {
            assert_eq!(c.initial_members, founders[0].initial_members, "{layout}");
            assert_eq!(c.timing, founders[0].timing, "{layout}");
            assert_eq!(c.dns.zone, founders[0].dns.zone, "{layout}");
        }
        assert_eq!(
            founders.len(),
            founders[0].initial_members.len(),
            "{layout}: one file per founder"
        );
    }
    let names: Vec<String> = examples
        .iter()
        .map(|p| {
            p.strip_prefix(deploy_dir().join("examples"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    println!("{} example configs pass: {}", names.len(), names.join(" "));
    for expected in [
        "ringd.toml",
        "ringd-join.toml",
        "three-zones/a.toml",
        "five-zones/e.toml",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} not found");
    }
    assert_eq!(names.len(), 2 + 3 + 5);
}

#[test]
fn kubernetes_overlay_configs_pass_check_config_and_match_the_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(dir.path());
    let kubernetes = deploy_dir().join("kubernetes");
    let statefulset = std::fs::read_to_string(kubernetes.join("base/statefulset.yaml")).unwrap();
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(kubernetes.join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    overlays.sort();
    let mut founders = BTreeSet::new();
    for overlay in &overlays {
        // The ConfigMap is generated from this very file, so it is what gets checked.
        let kustomization = std::fs::read_to_string(overlay.join("kustomization.yaml")).unwrap();
        assert!(
            kustomization.contains("configMapGenerator:")
                && kustomization.contains("name: garden-ring-config")
                && kustomization.contains("- ringd.toml"),
            "{}: the ConfigMap garden-ring-config should be generated from ringd.toml",
            overlay.display()
        );
        // The Secret garden-ring-tls is mounted at tls/ next to the config, under the keys
        // README.md's `kubectl create secret` gives it.
        let config = check_config(&overlay.join("ringd.toml"), &certs, |name| {
            [
                ("ca.pem".into(), "tls/ca.crt".into()),
                (format!("member-{name}.pem"), "tls/tls.crt".into()),
                (format!("member-{name}-key.pem"), "tls/tls.key".into()),
            ]
        });
        let name = overlay.file_name().unwrap().to_str().unwrap();
        assert_eq!(format!("zone-{}", config.name), name, "overlay of member");
        assert_eq!(config.zone, name);
        // What the StatefulSet mounts and probes is what the config uses.
        assert!(
            statefulset.contains(&format!("mountPath: {}\n", config.data_dir.display())),
            "{name}: data_dir {} is not the StatefulSet's volume",
            config.data_dir.display()
        );
        let metrics = config
            .metrics
            .listen
            .expect("[metrics] listen for the probes");
        let dns = config.dns.listen.expect("[dns] listen");
        for (what, port) in [
            ("peer", config.listen_peer.port()),
            ("admin", config.listen_admin.port()),
            ("metrics", metrics.port()),
            ("dns-udp", dns.port()),
            ("dns-tcp", dns.port()),
        ] {
            assert!(
                statefulset.contains(&format!(
                    "- name: {what}\n              containerPort: {port}\n"
                )),
                "{name}: the StatefulSet's port {what} is not {port}"
            );
        }
        assert!(statefulset.contains(&format!("prometheus.io/port: \"{}\"", metrics.port())));
        if !config.initial_members.is_empty() {
            founders.insert(format!("{:?}", config.initial_members));
        }
    }
    assert!(overlays.len() >= 3, "{} overlays", overlays.len());
    assert_eq!(
        founders.len(),
        1,
        "all founders list the same initial_members"
    );
    println!("{} overlay configs pass", overlays.len());
}

/// The metric families `/metrics` of a one-member ring declares (`# TYPE` lines).
async fn declared_families() -> BTreeSet<String> {
    let mut ring = Ring::prepare(RingOptions {
        members: 1,
        ..RingOptions::default()
    });
    let ports = Ports::reserve(1);
    let address = SocketAddr::from(([127, 0, 0, 1], ports.numbers()[0]));
    ports.release();
    ring.procs[0].config.metrics.listen = Some(address);
    ring.procs[0].spawn();
    let body = eventually(Duration::from_secs(20), "/metrics answers", || async {
        http_get(address, "/metrics").and_then(|(status, body)| (status == 200).then_some(body))
    })
    .await;
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every PromQL expression in the dashboard: panel targets and template variable queries.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains("garden_ring_") => {
                        out.push(s.clone())
                    }
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_uses_only_declared_metrics_in_valid_promql() {
    let path = deploy_dir().join("grafana/garden-ring.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);

    // Every panel queries something.
    let panels = dashboard["panels"].as_array().unwrap();
    let mut shown = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let mut exprs = Vec::new();
        dashboard_queries(&panel["targets"], &mut exprs);
        assert!(
            !exprs.is_empty(),
            "panel {:?} has no query",
            panel["title"].as_str()
        );
        shown += 1;
    }

    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    let declared = declared_families().await;
    let mut used = BTreeSet::new();
    for query in &queries {
        for name in query
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("garden_ring_"))
        {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            used.insert(family.to_string());
        }
    }
    for family in &used {
        assert!(
            declared.contains(family),
            "the dashboard uses {family}, which /metrics does not declare"
        );
    }
    // And every family /metrics declares has a query on the dashboard: a new metric comes
    // with its panel (or a target on an existing one).
    let not_shown: Vec<&String> = declared.difference(&used).collect();
    assert!(
        not_shown.is_empty(),
        "/metrics declares {not_shown:?}, which no dashboard query shows"
    );

    // The PromQL parses: each expression, with Grafana's variables filled in, as a recording
    // rule for `promtool check rules`.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard-rules.yml");
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut checked = 0;
    for query in queries.iter().filter(|q| !q.starts_with("label_values(")) {
        let expr = query
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$__range", "1h")
            .replace("$job", ".*");
        assert!(!expr.contains('$'), "unknown variable in {query}");
        text.push_str(&format!(
            "      - record: dashboard:query_{checked}\n        expr: {}\n",
            serde_json::Value::String(expr)
        ));
        checked += 1;
    }
    std::fs::write(&rules, &text).unwrap();
    let promtool = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("promtool"))
                .find(|p| p.is_file())
        })
        .expect(
            "promtool not found (Debian: apt-get install prometheus; scripts/test.sh installs it)",
        );
    let out = run(&promtool, &["check", "rules", rules.to_str().unwrap()]);
    must_succeed(
        &format!("promtool check rules on the dashboard's queries, as rules:\n{text}\n"),
        &out,
    );
    println!(
        "{shown} panels, {checked} queries valid PromQL, {} metric families used ({} declared); declared but not shown: {not_shown:?}",
        used.len(),
        declared.len()
    );
}

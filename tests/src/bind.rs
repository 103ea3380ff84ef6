//! A real BIND 9 `named` on loopback, as the primary server of one zone, for tests of the
//! RFC 2136 client.
//!
//! [`Bind::start`] writes `named.conf`, the zone file and (with a key name) a TSIG key made by
//! the real `tsig-keygen` into the test's directory, starts `named -g` on a free loopback port
//! and returns once it answers an SOA query for the zone. The zone accepts updates signed with
//! that key and nothing else; the journal lives in the same directory. `named` is killed when
//! the [`Bind`] is dropped, also when a test fails; its log is in `named.log`.
//!
//! The tools come from Debian's `bind9`, `bind9-utils` and `bind9-dnsutils` packages, which
//! `scripts/test.sh` installs. A missing tool fails the test with that advice; it is never a
//! silent skip.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Ports;
use crate::child::{self, LoggedChild};

/// How long `named` may take to load the zone and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `named` may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The path of a BIND tool (`named`, `tsig-keygen`, `dig`), looked up in `PATH`, then in
/// `/usr/sbin` and `/usr/bin` (where Debian puts them, not always in a user's `PATH`).
/// Panics with advice when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found in PATH, /usr/sbin or /usr/bin: the DNS tests need a real BIND 9; \
                 run scripts/test.sh (it installs the Debian packages bind9 bind9-utils bind9-dnsutils) \
                 or install them yourself"
            )
        })
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub fn wait_until<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes an hmac-sha256 key named `name` with the real `tsig-keygen` and writes it to
/// `dir/<name>.key`; returns that path. Two calls give two different secrets.
pub fn tsig_keygen(dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the key directory");
    let output = Command::new(tool("tsig-keygen"))
        .args(["-a", "hmac-sha256", name])
        .output()
        .expect("run tsig-keygen");
    assert!(
        output.status.success(),
        "tsig-keygen -a hmac-sha256 {name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, &output.stdout).expect("write the key file");
    path
}

/// A loopback port free for both TCP and UDP right now (named listens on both).
fn free_port() -> u16 {
    for _ in 0..50 {
        let ports = Ports::reserve(1);
        let port = ports.numbers()[0];
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            ports.release();
            return port;
        }
    }
    panic!("no loopback port free for both TCP and UDP after 50 tries");
}

/// A running `named`, primary for one zone; see the module docs.
pub struct Bind {
    dir: PathBuf,
    zone: String,
    port: u16,
    key_file: Option<PathBuf>,
    /// `named`, while it runs; killed when the [`Bind`] is dropped.
    child: Option<LoggedChild>,
}

impl Bind {
    /// Starts `named` in `dir` as primary for `zone`. With `key`, a key of that name is made
    /// with `tsig-keygen` (see [`Bind::key_file`]) and only updates signed with it are allowed;
    /// without, updates are refused.
    pub fn start(dir: &Path, zone: &str, key: Option<&str>) -> Bind {
        // Fail early, with advice, when a tool is missing.
        for name in ["named", "named-checkconf", "tsig-keygen", "dig"] {
            tool(name);
        }
        std::fs::create_dir_all(dir).expect("create the BIND directory");
        let dir = dir.canonicalize().expect("absolute BIND directory");
        let key_file = key.map(|name| tsig_keygen(&dir.join("server-keys"), name));
        let port = free_port();

        let include = key_file
            .as_ref()
            .map(|path| format!("include \"{}\";\n", path.display()))
            .unwrap_or_default();
        let allow_update = match key {
            Some(name) => format!("key \"{name}\";"),
            None => "none;".into(),
        };
        let conf = format!(
            r#"{include}
options {{
    directory "{dir}";
    listen-on port {port} {{ 127.0.0.1; }};
    listen-on-v6 {{ none; }};
    pid-file none;
    session-keyfile none;
    recursion no;
    dnssec-validation no;
    notify no;
}};
controls {{ }};
zone "{zone}" {{
    type primary;
    file "db.{zone}";
    allow-update {{ {allow_update} }};
}};
"#,
            dir = dir.display(),
        );
        std::fs::write(dir.join("named.conf"), conf).expect("write named.conf");
        std::fs::write(dir.join(format!("db.{zone}")), zone_file(zone))
            .expect("write the zone file");
        let check = Command::new(tool("named-checkconf"))
            .arg(dir.join("named.conf"))
            .output()
            .expect("run named-checkconf");
        assert!(
            check.status.success(),
            "named-checkconf refuses the generated named.conf: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );

        let mut bind = Bind {
            dir,
            zone: zone.to_string(),
            port,
            key_file,
            child: None,
        };
        bind.launch();
        bind
    }

    /// Runs `named -g` and waits until it answers for the zone.
    fn launch(&mut self) {
        assert!(self.child.is_none(), "named is already running");
        let child = LoggedChild::spawn(
            "named",
            Command::new(tool("named"))
                .arg("-g")
                .arg("-c")
                .arg(self.dir.join("named.conf")),
            self.log_path(),
        )
        .expect("start named");
        self.child = Some(child);
        let zone = self.zone.clone();
        wait_until(
            START_TIMEOUT,
            &format!(
                "named answers an SOA query for {zone} on port {}",
                self.port
            ),
            || {
                if let Some(status) = self.child.as_mut().and_then(LoggedChild::exited) {
                    panic!(
                        "named exited with {status} before answering; its log:\n{}",
                        self.log()
                    );
                }
                let answer = self.try_dig(&zone, "SOA")?;
                answer
                    .iter()
                    .any(|line| line.contains(&format!("hostmaster.{zone}.")))
                    .then_some(())
            },
        );
    }

    /// The server's address (TCP and UDP).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The zone.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The key file the server trusts (as `tsig-keygen` wrote it), when started with a key.
    pub fn key_file(&self) -> Option<&Path> {
        self.key_file.as_deref()
    }

    /// The directory with `named.conf`, the zone, its journal and `named.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("named.log")
    }

    /// What `named` logged so far.
    pub fn log(&self) -> String {
        child::read_log(&self.log_path())
    }

    /// Whether `named` is running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(LoggedChild::is_running)
    }

    /// Stops `named` (SIGTERM, then SIGKILL after a deadline) and waits until it has exited.
    /// Its port stays free for [`restart`](Self::restart) unless another process takes it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.terminate_within(STOP_TIMEOUT);
        }
    }

    /// Stops `named` if it runs and starts it again on the same port, with the same zone and
    /// journal (so updates applied before survive), then waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Stops `named`, throws its journal away and starts it again from the zone file as
    /// [`start`](Self::start) wrote it: a server that lost every update (a restore, a rebuilt
    /// machine).
    pub fn restart_without_journal(&mut self) {
        self.stop();
        let journal = self.dir.join(format!("db.{}.jnl", self.zone));
        match std::fs::remove_file(&journal) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot remove {}: {e}", journal.display()),
        }
        std::fs::write(
            self.dir.join(format!("db.{}", self.zone)),
            zone_file(&self.zone),
        )
        .expect("write the zone file");
        self.launch();
    }

    /// `dig +short @127.0.0.1 -p PORT name type`, one answer per line; panics if dig gets no
    /// answer at all (server down, timeout).
    pub fn dig(&self, name: &str, record_type: &str) -> Vec<String> {
        self.try_dig(name, record_type).unwrap_or_else(|| {
            panic!(
                "dig {name} {record_type} @127.0.0.1 -p {} got no answer; named's log:\n{}",
                self.port,
                self.log()
            )
        })
    }

    /// Like [`dig`](Self::dig), `None` when dig gets no answer.
    fn try_dig(&self, name: &str, record_type: &str) -> Option<Vec<String>> {
        let d = crate::dig::dig(self.addr(), name, record_type, false);
        (d.status != "TIMEOUT").then_some(d.answers)
    }
}

/// The zone file a test server starts with: SOA serial 1 (refresh, retry and expire do not
/// matter on a primary), negative TTL 5 s, one NS.
fn zone_file(zone: &str) -> String {
    format!(
        "$TTL 60\n\
         @ IN SOA ns.{zone}. hostmaster.{zone}. ( 1 60 60 3600 5 )\n\
         @ IN NS ns.{zone}.\n\
         ns IN A 127.0.0.1\n"
    )
}

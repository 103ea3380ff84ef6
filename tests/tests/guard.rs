//! `ring-guard` on its own: the deadline stops the workload, or with `--hold-ms` freezes it
//! (SIGSTOP) until a newer deadline thaws it or the hold runs out; bad flags are refused.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use garden_ring::time::monotonic_ms;

/// A guard running `sleep 60`, its stdin, and its report lines as they come.
struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    pid: u32,
}

impl Running {
    fn start(flags: &[&str]) -> Running {
        let mut child = Command::new(garden_ring_tests::binary("ring-guard"))
            .args(flags)
            .args(["--", "sleep", "60"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start ring-guard");
        let mut stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        writeln!(stdin, "deadline {}", monotonic_ms() + 300).unwrap();
        let mut running = Running {
            child,
            stdin,
            lines,
            pid: 0,
        };
        let started = running.next_line();
        running.pid = started
            .strip_prefix("started ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a start: {started}"));
        running
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a report line within 10 s")
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    /// The workload's state letter in /proc (`T`: stopped, `S`: sleeping), `None` once gone.
    fn state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    /// Waits up to 2 s for the workload's state to be `want` (a signal takes effect when the
    /// process next runs).
    fn wait_state(&self, want: char) {
        let until = monotonic_ms() + 2_000;
        while self.state() != Some(want) {
            assert!(
                monotonic_ms() < until,
                "state {:?}, want {want}",
                self.state()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn the_deadline_stops_the_workload_without_a_hold() {
    let mut g = Running::start(&["--fence-ms", "200"]);
    let line = g.next_line();
    assert!(line.starts_with("fenced "), "{line}");
    assert!(g.child.wait().unwrap().success());
    assert!(matches!(g.state(), None | Some('Z')), "{:?}", g.state());
}

#[test]
fn with_a_hold_the_deadline_freezes_and_a_newer_one_thaws() {
    let mut g = Running::start(&["--fence-ms", "200", "--hold-ms", "5000"]);
    let line = g.next_line();
    assert!(line.starts_with("frozen "), "{line}");
    g.wait_state('T');
    g.say(&format!("deadline {}", monotonic_ms() + 10_000));
    let line = g.next_line();
    assert!(line.starts_with("thawed "), "{line}");
    // The same process runs on.
    g.wait_state('S');
    // Frozen again, then stopped: a frozen workload takes its SIGTERM once thawed.
    g.say(&format!("deadline {}", monotonic_ms() + 10_000));
    g.say("stop");
    let line = g.next_line();
    assert!(line.starts_with("stopped "), "{line}");
    assert!(g.child.wait().unwrap().success());
}

#[test]
fn a_frozen_workload_goes_when_ringd_goes() {
    let g = Running::start(&["--fence-ms", "200", "--hold-ms", "60000"]);
    let line = g.next_line();
    assert!(line.starts_with("frozen "), "{line}");
    let Running {
        mut child,
        stdin,
        lines,
        ..
    } = g;
    // ringd died: its end of the pipe closes.
    drop(stdin);
    let fenced = lines
        .recv_timeout(Duration::from_secs(5))
        .expect("a report");
    assert!(fenced.starts_with("fenced "), "{fenced}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_hold_that_runs_out_fences() {
    let mut g = Running::start(&["--fence-ms", "200", "--hold-ms", "300"]);
    let frozen = g.next_line();
    let fenced = g.next_line();
    let at = |line: &str, what: &str| -> u64 {
        line.strip_prefix(what)
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("not {what}: {line}"))
    };
    let held_ms = at(&fenced, "fenced ") - at(&frozen, "frozen ");
    assert!((300..2_000).contains(&held_ms), "held {held_ms} ms");
    assert!(g.child.wait().unwrap().success());
    assert!(matches!(g.state(), None | Some('Z')), "{:?}", g.state());
}

#[test]
fn a_workload_that_ends_by_itself_passes_on_its_exit_code() {
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 128 + 9)] {
        let mut child = Command::new(garden_ring_tests::binary("ring-guard"))
            .args(["--fence-ms", "200", "--", "sh", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start ring-guard");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "deadline {}", monotonic_ms() + 10_000).unwrap();
        let out = child.wait_with_output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(code), "{script}: {report}");
        assert!(report.contains("exited "), "{script}: {report}");
    }
}

#[test]
fn bad_flags_are_refused_with_usage() {
    for flags in [
        vec!["--fence-ms", "0"],
        vec!["--fence-ms", "200", "--hold-ms", "soon"],
        vec!["--fence-ms", "200", "--hold"],
        vec!["--hold-ms", "100"],
    ] {
        let out = Command::new(garden_ring_tests::binary("ring-guard"))
            .args(&flags)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("usage: ring-guard"), "{flags:?}: {err}");
    }
}

/// One controller connection to a guard's `--control` socket.
struct Controller {
    writer: std::os::unix::net::UnixStream,
    lines: mpsc::Receiver<String>,
}

impl Controller {
    fn connect(path: &std::path::Path) -> Controller {
        let until = monotonic_ms() + 5_000;
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(
                        monotonic_ms() < until,
                        "no guard on {}: {e}",
                        path.display()
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        let reader = stream.try_clone().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Controller {
            writer: stream,
            lines,
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.writer, "{line}").unwrap();
    }

    /// A line starting with `a` and one starting with `b`, in any order (others are
    /// skipped), within 5 s.
    fn expect_both(&self, a: &str, b: &str) {
        let until = monotonic_ms() + 5_000;
        let (mut seen_a, mut seen_b) = (false, false);
        while !(seen_a && seen_b) {
            let left = until.saturating_sub(monotonic_ms()).max(1);
            let line = self
                .lines
                .recv_timeout(Duration::from_millis(left))
                .unwrap_or_else(|_| panic!("no lines {a:?} and {b:?} within 5 s"));
            seen_a |= line.starts_with(a);
            seen_b |= line.starts_with(b);
        }
    }

    /// The next line starting with `prefix` (others are skipped), within 5 s.
    fn expect(&self, prefix: &str) -> String {
        let until = monotonic_ms() + 5_000;
        loop {
            let left = until.saturating_sub(monotonic_ms()).max(1);
            let line = self
                .lines
                .recv_timeout(Duration::from_millis(left))
                .unwrap_or_else(|_| panic!("no line starting {prefix:?} within 5 s"));
            if line.starts_with(prefix) {
                return line;
            }
        }
    }
}

/// Sends `text` over `stream` and reads it back from the echo server behind the gate.
fn echoes(stream: &mut std::net::TcpStream, text: &[u8]) -> bool {
    use std::io::Read;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    if stream.write_all(text).is_err() {
        return false;
    }
    let mut got = vec![0u8; text.len()];
    stream.read_exact(&mut got).is_ok() && got == text
}

#[test]
fn a_controlled_guard_outlives_its_controller_and_is_adopted_by_the_next() {
    // The workload's own address: an echo server standing in for etcd.
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in echo.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut reader = conn.try_clone().unwrap();
                let mut writer = conn;
                let _ = std::io::copy(&mut reader, &mut writer);
            });
        }
    });
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("guard.sock");
    let mut child = Command::new(garden_ring_tests::binary("ring-guard"))
        .current_dir(dir.path())
        .args([
            "--fence-ms",
            "200",
            "--hold-ms",
            "5000",
            "--control",
            "guard.sock",
        ])
        .args(["--gate", &format!("{listen}={target}")])
        .args(["--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ring-guard");

    // The first controller starts it and opens the gate.
    let mut first = Controller::connect(&socket);
    first.say(&format!("deadline {}", monotonic_ms() + 3_000));
    let started = first.expect("started ");
    let pid: u32 = started["started ".len()..].parse().unwrap();
    first.say("open");
    first.expect("gate open");
    let mut client = std::net::TcpStream::connect(listen).expect("the gate accepts");
    assert!(echoes(&mut client, b"before"));

    // Its controller goes (ringd exits): the workload and the client's connection stay.
    drop(first);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        echoes(&mut client, b"between"),
        "the connection outlives the controller"
    );
    let mut another = std::net::TcpStream::connect(listen).expect("the gate still accepts");
    assert!(echoes(&mut another, b"new"));

    // The next one adopts it: same workload, same deadline.
    let mut next = Controller::connect(&socket);
    next.say("status");
    let status = next.expect("status ");
    assert!(status.contains(&format!(" pid={pid} ")), "{status}");
    assert!(
        status.contains("frozen=0") && status.contains("gate=open"),
        "{status}"
    );
    assert!(status.contains(&format!("target={target}")), "{status}");
    assert!(
        status.contains(&format!("guard={}", child.id())),
        "{status}"
    );

    // A lapse: the gate closes itself, the workload is frozen; a newer deadline thaws it and
    // the gate opens again, on the same workload.
    next.say(&format!("deadline {}", monotonic_ms() + 3_000));
    // The workload frozen and the gate closed, in whichever order their reports come.
    next.expect_both("frozen ", "gate ran-out");
    assert!(
        !echoes(&mut client, b"after the deadline"),
        "nothing relayed after it"
    );
    next.say(&format!("deadline {}", monotonic_ms() + 10_000));
    next.expect("thawed ");
    next.say("open");
    next.expect("gate open");
    let mut again = std::net::TcpStream::connect(listen).expect("open again");
    assert!(echoes(&mut again, b"again"));
    next.say("status");
    let status = next.expect("status ");
    assert!(status.contains(&format!(" pid={pid} ")), "{status}");

    // Closed: every connection cut, none accepted.
    next.say("close");
    next.expect("gate closed");
    assert!(!echoes(&mut again, b"closed"));
    assert!(
        std::net::TcpStream::connect(listen).is_err(),
        "the gate is closed"
    );

    // A second guard on the same socket refuses to start.
    let out = Command::new(garden_ring_tests::binary("ring-guard"))
        .current_dir(dir.path())
        .args(["--fence-ms", "200", "--control", "guard.sock", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another guard listens"),
        "{out:?}"
    );

    next.say("stop");
    next.expect("stopped ");
    assert!(child.wait().unwrap().success());
    assert!(!socket.exists(), "the socket file goes with the guard");
}

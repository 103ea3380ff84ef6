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

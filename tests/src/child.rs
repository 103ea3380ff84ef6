//! A child process with its output in a log file, that never outlives its owner.
//!
//! Every process the tests and `ring-chaos` start (a `ringd`, BIND's `named`, `moto_server`,
//! an etcd, `perf`) is a [`LoggedChild`]:
//!
//! - **Its output goes to a file.** [`LoggedChild::spawn`] sets stdin to `/dev/null` and
//!   appends stdout and stderr to the log (created if missing), so a process started again
//!   keeps what it logged before; [`LoggedChild::log`] reads all of it,
//!   [`LoggedChild::log_since_spawn`] only this run's part, [`LoggedChild::log_tail`] the last
//!   lines (where a failure shows).
//! - **Nothing is left running when it is dropped**, also when the owner's thread panics (a
//!   failed assertion unwinds and drops it): `Drop` sends SIGKILL and reaps the process. A test
//!   that fails half-way leaves no process holding ports or files, and no zombie.
//! - **Every wait is bounded.** [`LoggedChild::wait_exit`] polls (every 20 ms) until the
//!   process exits or the deadline passes; [`LoggedChild::terminate_within`] is SIGTERM, that
//!   bounded wait, then SIGKILL if it is still there. Nothing here blocks on a process that
//!   does not want to exit.
//! - **A pid is never signalled after it was reaped**: once the exit is observed,
//!   [`LoggedChild::pid`] is `None` and [`LoggedChild::signal`] fails with `ESRCH` instead of
//!   hitting whatever process the kernel gave the number to since.
//!
//! One value is one process: to start a program again, spawn a new one (owners keep an
//! `Option<LoggedChild>` for a process that can be stopped and started). It kills the process
//! it started, not that process's own children: a program that starts others (`ringd` runs
//! control planes under `ring-guard`) stops them itself, or dies with a namespace that does.
//!
//! ```no_run
//! use std::process::Command;
//! use std::time::Duration;
//! use garden_ring_tests::child::LoggedChild;
//!
//! let mut sleeper = LoggedChild::spawn("sleep", Command::new("sleep").arg("30"), "/tmp/s.log")?;
//! assert!(sleeper.is_running());
//! // Asks it to stop, and kills it if it has not after 5 s.
//! let status = sleeper.terminate_within(Duration::from_secs(5));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How often the bounded waits look whether the process exited.
const POLL: Duration = Duration::from_millis(20);

/// A running (or exited) child process whose stdout and stderr go to a log file; SIGKILLed
/// and reaped when dropped. See the [module docs](self).
#[derive(Debug)]
pub struct LoggedChild {
    name: String,
    log_path: PathBuf,
    /// The log's length when the process started (its earlier runs' part ends there).
    log_start: u64,
    child: Child,
    /// Set once the process was reaped: its pid may belong to another process from then on.
    reaped: bool,
    /// Its exit status, once reaped (`None` if reaping failed).
    status: Option<ExitStatus>,
}

impl LoggedChild {
    /// Starts `command` with stdin from `/dev/null` and stdout and stderr appended to
    /// `log_path` (created if missing). `name` says what it is in messages; an error names it
    /// and the program.
    pub fn spawn(
        name: impl Into<String>,
        command: &mut Command,
        log_path: impl Into<PathBuf>,
    ) -> std::io::Result<Self> {
        let name = name.into();
        let log_path = log_path.into();
        let context = |e: std::io::Error, what: &str| {
            std::io::Error::new(e.kind(), format!("{what} of {name}: {e}"))
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| context(e, &format!("opening the log {}", log_path.display())))?;
        let log_start = log.metadata().map_or(0, |m| m.len());
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                let program = command.get_program().to_string_lossy().into_owned();
                context(e, &format!("starting {program}"))
            })?;
        Ok(Self {
            name,
            log_path,
            log_start,
            child,
            reaped: false,
            status: None,
        })
    }

    /// What it is, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Its pid; `None` once its exit was observed (and it was reaped), since the number may
    /// belong to another process from then on.
    pub fn pid(&self) -> Option<u32> {
        (!self.reaped).then(|| self.child.id())
    }

    /// Its exit status if it has exited (it is reaped then), `None` while it runs. Does not
    /// block.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if !self.reaped
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.reaped = true;
            self.status = Some(status);
        }
        self.status
    }

    /// Whether it still runs (a stopped process, SIGSTOP, runs).
    pub fn is_running(&mut self) -> bool {
        self.exited().is_none() && !self.reaped
    }

    /// An error naming the exit status and the log when it has exited; `Ok` while it runs.
    pub fn check_running(&mut self) -> std::io::Result<()> {
        match self.exited() {
            None if !self.reaped => Ok(()),
            status => Err(std::io::Error::other(format!(
                "{} exited with {}; see {}",
                self.name,
                status.map_or("an unknown status".into(), |s| s.to_string()),
                self.log_path.display()
            ))),
        }
    }

    /// Sends `signal` (e.g. SIGSTOP, SIGCONT, SIGTERM). Fails with `ESRCH` once it was reaped.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        let pid = self.pid().ok_or(nix::errno::Errno::ESRCH)?;
        let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
        kill(Pid::from_raw(pid), signal)
    }

    /// SIGKILL, and waits until it is gone (reaped); returns its exit status. Harmless when it
    /// already exited.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        if !self.reaped {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
            self.reaped = true;
        }
        self.status
    }

    /// Waits at most `timeout` for it to exit on its own; its exit status, or `None` when it
    /// still runs at the deadline (it is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if self.reaped {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    }

    /// SIGTERM, then waits at most `timeout` for it to exit; its exit status, or `None` when
    /// it did not exit in time and was SIGKILLed (so it is gone either way).
    pub fn terminate_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        let _ = self.signal(Signal::SIGTERM);
        let status = self.wait_exit(timeout);
        if status.is_none() {
            self.kill9();
        }
        status
    }

    /// Its whole log so far (earlier runs into the same file included).
    pub fn log(&self) -> String {
        read_log(&self.log_path)
    }

    /// What it logged since it was spawned (not what earlier runs appended to the same file).
    pub fn log_since_spawn(&self) -> String {
        let mut text = Vec::new();
        let read = std::fs::File::open(&self.log_path).and_then(|mut f| {
            f.seek(SeekFrom::Start(self.log_start))?;
            f.read_to_end(&mut text)
        });
        match read {
            Ok(_) => String::from_utf8_lossy(&text).into_owned(),
            Err(_) => String::new(),
        }
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }
}

impl Drop for LoggedChild {
    /// SIGKILL and reap: nothing is left running, also when the owner panics.
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The text of the log at `path` (lossy UTF-8); empty when it cannot be read.
pub fn read_log(path: &Path) -> String {
    std::fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// The last `lines` lines of the log at `path` (for a failure message, also when its process
/// is gone).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let log = read_log(path);
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a process with `pid` exists (a zombie counts).
    fn exists(pid: u32) -> bool {
        kill(Pid::from_raw(pid as i32), None).is_ok()
    }

    /// `sleep 30`, logging into `dir`: a process that does not exit during a test.
    fn sleeper(dir: &Path) -> LoggedChild {
        LoggedChild::spawn(
            "sleep",
            Command::new("sleep").arg("30"),
            dir.join("sleep.log"),
        )
        .expect("spawn sleep")
    }

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn output_goes_to_the_log_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let mut first =
            LoggedChild::spawn("echo", &mut sh("echo out; echo err >&2"), &log).unwrap();
        let status = first.wait_exit(Duration::from_secs(10)).expect("it exits");
        assert!(status.success());
        assert_eq!(first.log(), "out\nerr\n");
        assert_eq!(first.pid(), None, "no pid once reaped");

        let mut second = LoggedChild::spawn("echo", &mut sh("echo again; exit 3"), &log).unwrap();
        let status = second.wait_exit(Duration::from_secs(10)).expect("it exits");
        assert_eq!(status.code(), Some(3));
        assert_eq!(second.log(), "out\nerr\nagain\n", "appended, not truncated");
        assert_eq!(second.log_since_spawn(), "again\n");
        assert_eq!(second.log_tail(2), "err\nagain");
        let error = second.check_running().unwrap_err().to_string();
        assert!(error.contains("echo exited with exit status: 3"), "{error}");
    }

    #[test]
    fn stdin_is_null() {
        let dir = tempfile::tempdir().unwrap();
        let mut cat = LoggedChild::spawn("cat", &mut Command::new("cat"), dir.path().join("l"))
            .expect("spawn cat");
        // cat reads end of file at once instead of waiting on the test's stdin.
        assert!(cat.wait_exit(Duration::from_secs(10)).is_some());
    }

    #[test]
    fn a_missing_program_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = LoggedChild::spawn(
            "nothing",
            &mut Command::new("/nonexistent/program"),
            dir.path().join("l"),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("/nonexistent/program"), "{error}");
        assert!(error.contains("nothing"), "{error}");
    }

    #[test]
    fn stop_and_continue() {
        let dir = tempfile::tempdir().unwrap();
        // Prints a line every 20 ms: while stopped, the log does not grow.
        let mut ticker = LoggedChild::spawn(
            "ticker",
            &mut sh("while true; do echo tick; sleep 0.02; done"),
            dir.path().join("ticker.log"),
        )
        .unwrap();
        let lines = |c: &LoggedChild| c.log().lines().count();
        crate::bind::wait_until(Duration::from_secs(10), "it ticks", || {
            (lines(&ticker) > 0).then_some(())
        });
        ticker.signal(Signal::SIGSTOP).unwrap();
        std::thread::sleep(Duration::from_millis(100)); // A tick under way may still land.
        let stopped = lines(&ticker);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(lines(&ticker), stopped, "no output while stopped");
        assert!(ticker.is_running(), "a stopped process runs");
        ticker.signal(Signal::SIGCONT).unwrap();
        crate::bind::wait_until(Duration::from_secs(10), "it ticks again", || {
            (lines(&ticker) > stopped).then_some(())
        });
    }

    #[test]
    fn sigterm_ends_it_and_a_reaped_pid_is_not_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let mut sleeper = sleeper(dir.path());
        sleeper.signal(Signal::SIGTERM).unwrap();
        let status = sleeper
            .wait_exit(Duration::from_secs(10))
            .expect("it exits");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
        assert!(!sleeper.is_running());
        assert_eq!(
            sleeper.signal(Signal::SIGTERM),
            Err(nix::errno::Errno::ESRCH)
        );
    }

    #[test]
    fn wait_exit_returns_at_its_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let mut sleeper = sleeper(dir.path());
        let began = Instant::now();
        assert_eq!(sleeper.wait_exit(Duration::from_millis(300)), None);
        let took = began.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(sleeper.is_running(), "left running");
    }

    #[test]
    fn terminate_within_kills_what_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stubborn.log");
        // Short sleeps, so that the one running when the shell is killed ends soon after.
        let mut stubborn = LoggedChild::spawn(
            "stubborn",
            &mut sh("trap '' TERM; echo ready; while true; do sleep 0.1; done"),
            &log,
        )
        .unwrap();
        // The trap is set once it printed.
        crate::bind::wait_until(Duration::from_secs(10), "the trap is set", || {
            stubborn.log().contains("ready").then_some(())
        });
        let pid = stubborn.pid().unwrap();
        let began = Instant::now();
        assert_eq!(stubborn.terminate_within(Duration::from_millis(300)), None);
        assert!(began.elapsed() < Duration::from_secs(5));
        assert!(!stubborn.is_running());
        assert!(!exists(pid), "killed and reaped");
    }

    #[test]
    fn terminate_within_returns_the_status_of_what_exits() {
        let dir = tempfile::tempdir().unwrap();
        let mut sleeper = sleeper(dir.path());
        let status = sleeper.terminate_within(Duration::from_secs(10));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(Signal::SIGTERM as i32)
        );
    }

    #[test]
    fn drop_kills() {
        let dir = tempfile::tempdir().unwrap();
        let sleeper = sleeper(dir.path());
        let pid = sleeper.pid().unwrap();
        assert!(exists(pid));
        drop(sleeper);
        assert!(!exists(pid), "killed and reaped, not a zombie");
    }

    #[test]
    fn drop_kills_on_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = std::thread::spawn(move || {
            let sleeper = sleeper(dir.path());
            tx.send(sleeper.pid().unwrap()).unwrap();
            panic!("a failing test");
        });
        assert!(owner.join().is_err(), "the owner panicked");
        let pid = rx.recv().unwrap();
        assert!(!exists(pid), "killed while unwinding");
    }
}

//! `ring-guard`: runs one control plane's workload and stops it at its lease deadline, even when
//! `ringd` is frozen, hung or dead (DESIGN.md rule 1; Patroni's watchdog plays this part).
//!
//! `ringd` starts one guard per hosted control plane and feeds it lines:
//! - `deadline <ms>`: the lease runs out at this `CLOCK_MONOTONIC` time (milliseconds). The
//!   first line must come within 5 s; a deadline already past means "do not start".
//! - `stop`: stop the workload now.
//!
//! The guard starts the command after `--` in its own process group. When the deadline passes
//! without a newer one, or on `stop`, it sends SIGTERM to the group and SIGKILL `--fence-ms`/2
//! later, so the workload is gone within `fence_ms`. It reports `started <pid>`, then one of
//! `fenced <ms>`, `stopped <ms>` or `exited <code> <ms>`, and exits: 0 when it ended the
//! workload, the workload's own exit code when that ended by itself (128 + the signal when one
//! killed it, as a shell reports it), so `ringd` can say why an etcd went away.
//!
//! With `--hold-ms N` (N > 0) the deadline *freezes* the workload instead (SIGSTOP to the
//! group: a frozen process answers nothing, at once) and holds it frozen for up to N ms,
//! reporting `frozen <ms>`. A newer deadline within the hold thaws it (SIGCONT, `thawed <ms>`)
//! and it runs on where it was, without a restart; `stop`, or the end of the hold, ends it as
//! above. `ringd` uses this for an etcd that only its own endpoint serves: a lease that lapses
//! for a moment then costs no etcd restart.
//!
//! **Where the lines come from.** Without `--control` they come on stdin and the reports go to
//! stdout; stdin closing (ringd died) keeps the last deadline and ends the hold (nobody could
//! thaw the workload any more). With `--control PATH` they come over a Unix socket the guard
//! listens on at `PATH` (relative to its working directory: ringd starts it in the control
//! plane's private epoch directory), and the reports go to the controller connected last. A
//! controller that goes away changes nothing: the deadline stands, and the next `ringd` of the
//! member connects again and **adopts** the workload (`status` answers `status pid=<pid>
//! deadline=<ms> frozen=<0|1> gate=<open|closed|none> [target=<addr>]`, `guard` being its own
//! pid and `pid` the workload's), so a daemon restart costs the workload
//! nothing while the lease holds.
//!
//! **The gate.** With `--gate LISTEN=TARGET` the guard also keeps the control plane's public
//! endpoint: a TCP relay from `LISTEN` to the workload's own `TARGET` (`garden_ring::agent::gate`),
//! bound to the same deadline (it relays nothing after it). `open` opens it (`gate open`),
//! `close` closes it and cuts every connection (`gate closed`); at the deadline it closes itself
//! (`gate ran-out`). Kept here, not in `ringd`, so that clients' connections outlive `ringd`.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use garden_ring::time::monotonic_ms;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

enum Input {
    Deadline(u64),
    Stop,
    /// stdin closed (without `--control` only).
    Closed,
    Open,
    Close,
    Status,
}

/// The controller connected last (with `--control`); the reports go there.
static CONTROLLER: Mutex<Option<UnixStream>> = Mutex::new(None);
/// Whether the lines come over the control socket (then nothing is written to stdout).
static CONTROLLED: AtomicBool = AtomicBool::new(false);
/// The gate's state for `status`: 0 none, 1 closed, 2 open.
static GATE: AtomicU8 = AtomicU8::new(0);

fn say(line: &str) {
    if CONTROLLED.load(Ordering::SeqCst) {
        let mut controller = CONTROLLER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = controller.as_mut()
            && writeln!(stream, "{line}").is_err()
        {
            *controller = None;
        }
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn parse(line: &str) -> Option<Input> {
    Some(
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["deadline", ms] => Input::Deadline(ms.parse().ok()?),
            ["stop"] => Input::Stop,
            ["open"] => Input::Open,
            ["close"] => Input::Close,
            ["status"] => Input::Status,
            _ => return None,
        },
    )
}

fn read_stdin(tx: mpsc::Sender<Input>) {
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if let Some(input) = parse(&line)
            && tx.send(input).is_err()
        {
            return;
        }
    }
    let _ = tx.send(Input::Closed);
}

/// Accepts controllers on `listener`; the reports go to the one that spoke last (a
/// connection that only looks, as a second guard checking whether this one lives, takes
/// nothing away from the controller).
fn accept(listener: UnixListener, tx: mpsc::Sender<Input>) {
    static SPEAKER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for (id, stream) in (1u64..).zip(listener.incoming()) {
        let Ok(stream) = stream else { continue };
        let Ok(writer) = stream.try_clone() else {
            continue;
        };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let Some(input) = parse(&line) else { continue };
                if SPEAKER.swap(id, Ordering::SeqCst) != id
                    && let Ok(w) = writer.try_clone()
                {
                    *CONTROLLER.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
                }
                if tx.send(input).is_err() {
                    return;
                }
            }
        });
    }
}

/// What the gate's thread is told.
enum GateCommand {
    Deadline(u64),
    Open,
    Close,
}

/// Runs the gate from `listen` to `target` in a thread of its own (a small tokio runtime),
/// closed until told to open.
fn gate_thread(
    listen: SocketAddr,
    target: SocketAddr,
    first_deadline_ms: u64,
) -> std::io::Result<tokio::sync::mpsc::UnboundedSender<GateCommand>> {
    use garden_ring::agent::gate::Gate;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    GATE.store(1, Ordering::SeqCst);
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let (deadline, deadline_rx) = tokio::sync::watch::channel(first_deadline_ms);
            let mut gate: Option<(Gate, tokio::sync::watch::Receiver<bool>)> = None;
            loop {
                let ran_out = async {
                    match gate.as_mut() {
                        Some((_, ran_out)) => {
                            let _ = ran_out.wait_for(|r| *r).await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    command = rx.recv() => match command {
                        None => break,
                        Some(GateCommand::Deadline(ms)) => {
                            deadline.send_if_modified(|d| {
                                let later = ms > *d;
                                *d = (*d).max(ms);
                                later
                            });
                        }
                        Some(GateCommand::Open) => {
                            if gate.is_none() {
                                match Gate::open(listen, target, deadline_rx.clone()).await {
                                    Ok(g) => {
                                        let ran_out = g.ran_out();
                                        gate = Some((g, ran_out));
                                    }
                                    Err(e) => {
                                        say(&format!("gate error {e}"));
                                        continue;
                                    }
                                }
                            }
                            GATE.store(2, Ordering::SeqCst);
                            say("gate open");
                        }
                        Some(GateCommand::Close) => {
                            if let Some((g, _)) = gate.take() {
                                g.close().await;
                            }
                            GATE.store(1, Ordering::SeqCst);
                            say("gate closed");
                        }
                    },
                    () = ran_out => {
                        gate = None;
                        GATE.store(1, Ordering::SeqCst);
                        say("gate ran-out");
                    }
                }
            }
            if let Some((g, _)) = gate.take() {
                g.close().await;
            }
        });
    });
    Ok(tx)
}

fn stop(child: &mut Child, fence_ms: u64) {
    let group = Pid::from_raw(child.id() as i32);
    let _ = killpg(group, Signal::SIGTERM);
    // A frozen workload takes its SIGTERM once thawed.
    let _ = killpg(group, Signal::SIGCONT);
    let give_up = monotonic_ms() + fence_ms / 2;
    while monotonic_ms() < give_up {
        if let Ok(Some(_)) = child.try_wait() {
            // The leader is gone; make sure the rest of its group is too.
            let _ = killpg(group, Signal::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
}

/// The guard's flags.
struct Flags {
    fence_ms: u64,
    hold_ms: u64,
    control: Option<PathBuf>,
    gate: Option<(SocketAddr, SocketAddr)>,
    command: Vec<String>,
}

const USAGE: &str = "usage: ring-guard --fence-ms N [--hold-ms N] [--control PATH] \
                     [--gate LISTEN=TARGET] -- COMMAND [ARGS...]";

fn flags(args: &[String]) -> Result<Flags, String> {
    let dashes = args
        .iter()
        .position(|a| a == "--")
        .ok_or_else(|| USAGE.to_string())?;
    let command = args[dashes + 1..].to_vec();
    let mut fence_ms = None;
    let mut hold_ms = 0;
    let mut control = None;
    let mut gate = None;
    let mut flags = args[..dashes].iter();
    while let Some(flag) = flags.next() {
        let value = flags.next();
        match (flag.as_str(), value) {
            ("--fence-ms", Some(v)) => match v.parse::<u64>() {
                Ok(n) if n > 0 => fence_ms = Some(n),
                _ => return Err(format!("--fence-ms must be a positive number\n{USAGE}")),
            },
            ("--hold-ms", Some(v)) => {
                hold_ms = v
                    .parse()
                    .map_err(|_| format!("--hold-ms must be a number of ms\n{USAGE}"))?;
            }
            ("--control", Some(v)) if !v.is_empty() => control = Some(PathBuf::from(v)),
            ("--gate", Some(v)) => {
                let parsed = v.split_once('=').and_then(|(listen, target)| {
                    Some((listen.parse().ok()?, target.parse().ok()?))
                });
                gate = Some(parsed.ok_or_else(|| {
                    format!("--gate must be LISTEN=TARGET, two socket addresses\n{USAGE}")
                })?);
            }
            ("--fence-ms" | "--hold-ms" | "--control" | "--gate", _) => {
                return Err(format!("{flag} needs a value\n{USAGE}"));
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    match (fence_ms, command.is_empty()) {
        (Some(fence_ms), false) => Ok(Flags {
            fence_ms,
            hold_ms,
            control,
            gate,
            command,
        }),
        _ => Err(USAGE.to_string()),
    }
}

/// Listens for controllers on `path`: a socket file left by a guard that is gone is replaced;
/// one that still answers belongs to a live guard, and this one does not start.
fn listen(path: &PathBuf) -> Result<UnixListener, String> {
    if UnixStream::connect(path).is_ok() {
        return Err(format!(
            "another guard listens on {} already; not starting",
            path.display()
        ));
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Flags {
        fence_ms,
        mut hold_ms,
        control,
        gate,
        command,
    } = match flags(&args) {
        Ok(f) => f,
        Err(why) => {
            eprintln!("ring-guard: {why}");
            return ExitCode::from(2);
        }
    };

    let (tx, rx) = mpsc::channel();
    match &control {
        Some(path) => {
            let listener = match listen(path) {
                Ok(l) => l,
                Err(why) => {
                    eprintln!("ring-guard: {why}");
                    return ExitCode::from(2);
                }
            };
            CONTROLLED.store(true, Ordering::SeqCst);
            std::thread::spawn(move || accept(listener, tx));
        }
        None => {
            std::thread::spawn(move || read_stdin(tx));
        }
    }
    // The socket file goes with the guard, whichever way it ends.
    struct Unlink(Option<PathBuf>);
    impl Drop for Unlink {
        fn drop(&mut self) {
            if let Some(path) = &self.0 {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    let _unlink = Unlink(control.clone());

    let mut deadline = match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Input::Deadline(ms)) => ms,
        _ => {
            eprintln!("ring-guard: no deadline received; not starting");
            return ExitCode::from(2);
        }
    };
    if monotonic_ms() >= deadline {
        say(&format!("fenced {}", monotonic_ms()));
        return ExitCode::SUCCESS;
    }
    let gate_target = gate.map(|(_, target)| target);
    let gate = match gate {
        Some((listen, target)) => match gate_thread(listen, target, deadline) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("ring-guard: cannot run the gate: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let tell_gate = |command: GateCommand| {
        if let Some(g) = &gate {
            let _ = g.send(command);
        }
    };
    let mut child = match Command::new(&command[0])
        .args(&command[1..])
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ring-guard: cannot start {}: {e}", command[0]);
            return ExitCode::from(1);
        }
    };
    say(&format!("started {}", child.id()));
    let group = Pid::from_raw(child.id() as i32);
    let mut open = true;
    // While frozen: when the hold ends.
    let mut frozen_until: Option<u64> = None;
    // Ends the workload: the gate first (nothing more reaches it), then the group.
    let end = |child: &mut Child, report: &str| {
        if let Some(g) = &gate {
            let _ = g.send(GateCommand::Close);
        }
        stop(child, fence_ms);
        say(&format!("{report} {}", monotonic_ms()));
        ExitCode::SUCCESS
    };
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            say(&format!(
                "exited {} {}",
                status.code().unwrap_or(-1),
                monotonic_ms()
            ));
            return workload_exit_code(status);
        }
        let now = monotonic_ms();
        match frozen_until {
            None if now >= deadline && hold_ms > 0 => {
                let _ = killpg(group, Signal::SIGSTOP);
                // The hold counts from the moment reported (not from before the signal).
                let frozen_at = monotonic_ms();
                say(&format!("frozen {frozen_at}"));
                frozen_until = Some(frozen_at + hold_ms);
                continue;
            }
            None if now >= deadline => return end(&mut child, "fenced"),
            Some(until) if now >= until => return end(&mut child, "fenced"),
            _ => {}
        }
        let until = frozen_until.unwrap_or(deadline);
        let wait = Duration::from_millis(until.saturating_sub(now).min(20));
        if !open {
            std::thread::sleep(wait);
            continue;
        }
        match rx.recv_timeout(wait) {
            Ok(Input::Deadline(ms)) => {
                deadline = deadline.max(ms);
                tell_gate(GateCommand::Deadline(deadline));
                if frozen_until.is_some() && monotonic_ms() < deadline {
                    let _ = killpg(group, Signal::SIGCONT);
                    say(&format!("thawed {}", monotonic_ms()));
                    frozen_until = None;
                }
            }
            Ok(Input::Stop) => return end(&mut child, "stopped"),
            Ok(Input::Open) => tell_gate(GateCommand::Open),
            Ok(Input::Close) => match &gate {
                Some(_) => tell_gate(GateCommand::Close),
                None => say("gate closed"),
            },
            Ok(Input::Status) => say(&format!(
                "status guard={} pid={} deadline={deadline} frozen={} gate={}{}",
                std::process::id(),
                child.id(),
                u8::from(frozen_until.is_some()),
                match GATE.load(Ordering::SeqCst) {
                    2 => "open",
                    1 => "closed",
                    _ => "none",
                },
                gate_target
                    .map(|t| format!(" target={t}"))
                    .unwrap_or_default()
            )),
            Ok(Input::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                open = false;
                // Nobody can thaw it any more (ringd died): no hold; a frozen one goes now,
                // so that a restarted ringd finds it gone after `lease_ms + fence_ms`.
                hold_ms = 0;
                if frozen_until.is_some() {
                    frozen_until = Some(monotonic_ms());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The guard's exit code for a workload that ended by itself with `status`: its exit code, or
/// 128 + the signal that killed it; 1 when neither fits in a byte (never 0 for a failure).
fn workload_exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1);
    ExitCode::from(code)
}

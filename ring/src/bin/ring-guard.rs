//! `ring-guard`: runs one control plane's workload and stops it at its lease deadline, even when
//! `ringd` is frozen, hung or dead (DESIGN.md rule 1; Patroni's watchdog plays this part).
//!
//! `ringd` starts one guard per hosted control plane and feeds it on stdin:
//! - `deadline <ms>`: the lease runs out at this `CLOCK_MONOTONIC` time (milliseconds). The
//!   first line must come within 5 s; a deadline already past means "do not start".
//! - `stop`: stop the workload now.
//!
//! The guard starts the command after `--` in its own process group. When the deadline passes
//! without a newer one, or on `stop`, it sends SIGTERM to the group and SIGKILL `--fence-ms`/2
//! later, so the workload is gone within `fence_ms`. If stdin closes (ringd died) it keeps the
//! last deadline. It reports on stdout: `started <pid>`, then one of `fenced <ms>`,
//! `stopped <ms>` or `exited <code> <ms>`, and exits: 0 when it ended the workload, the
//! workload's own exit code when that ended by itself (128 + the signal when one killed it,
//! as a shell reports it), so `ringd` can say why an etcd went away.
//!
//! With `--hold-ms N` (N > 0) the deadline *freezes* the workload instead (SIGSTOP to the
//! group: a frozen process answers nothing, at once) and holds it frozen for up to N ms,
//! reporting `frozen <ms>`. A newer deadline within the hold thaws it (SIGCONT, `thawed <ms>`)
//! and it runs on where it was, without a restart; `stop`, or the end of the hold, ends it as
//! above, and so does stdin closing (nobody could thaw it any more). `ringd` uses this for an
//! etcd that only its own endpoint serves: a lease that lapses for a moment then costs no etcd
//! restart.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode};
use std::sync::mpsc;
use std::time::Duration;

use garden_ring::time::monotonic_ms;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

enum Input {
    Deadline(u64),
    Stop,
    Closed,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ring-guard --fence-ms N [--hold-ms N] -- COMMAND [ARGS...]";
    let Some(dashes) = args.iter().position(|a| a == "--") else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let command = args[dashes + 1..].to_vec();
    let mut fence_ms = None;
    let mut hold_ms = 0;
    let mut flags = args[..dashes].iter();
    while let Some(flag) = flags.next() {
        let value = flags.next().map(|v| v.parse::<u64>());
        match (flag.as_str(), value) {
            ("--fence-ms", Some(Ok(n))) if n > 0 => fence_ms = Some(n),
            ("--hold-ms", Some(Ok(n))) => hold_ms = n,
            ("--fence-ms", _) => {
                eprintln!("ring-guard: --fence-ms must be a positive number\n{usage}");
                return ExitCode::from(2);
            }
            ("--hold-ms", _) => {
                eprintln!("ring-guard: --hold-ms must be a number of ms\n{usage}");
                return ExitCode::from(2);
            }
            _ => {
                eprintln!("ring-guard: unknown flag {flag}\n{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(fence_ms), false) = (fence_ms, command.is_empty()) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            let input = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["deadline", ms] => match ms.parse() {
                    Ok(ms) => Input::Deadline(ms),
                    Err(_) => continue,
                },
                ["stop"] => Input::Stop,
                _ => continue,
            };
            if tx.send(input).is_err() {
                return;
            }
        }
        let _ = tx.send(Input::Closed);
    });

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
            None if now >= deadline => {
                stop(&mut child, fence_ms);
                say(&format!("fenced {}", monotonic_ms()));
                return ExitCode::SUCCESS;
            }
            Some(until) if now >= until => {
                stop(&mut child, fence_ms);
                say(&format!("fenced {}", monotonic_ms()));
                return ExitCode::SUCCESS;
            }
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
                if frozen_until.is_some() && monotonic_ms() < deadline {
                    let _ = killpg(group, Signal::SIGCONT);
                    say(&format!("thawed {}", monotonic_ms()));
                    frozen_until = None;
                }
            }
            Ok(Input::Stop) => {
                stop(&mut child, fence_ms);
                say(&format!("stopped {}", monotonic_ms()));
                return ExitCode::SUCCESS;
            }
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

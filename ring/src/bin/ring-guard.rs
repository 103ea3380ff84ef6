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
//! `stopped <ms>` or `exited <code> <ms>`, and exits.

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
    let usage = "usage: ring-guard --fence-ms N -- COMMAND [ARGS...]";
    let (fence_ms, command) = match args.as_slice() {
        [flag, n, dashes, command @ ..]
            if flag == "--fence-ms" && dashes == "--" && !command.is_empty() =>
        {
            match n.parse::<u64>() {
                Ok(n) if n > 0 => (n, command.to_vec()),
                _ => {
                    eprintln!("ring-guard: --fence-ms must be a positive number\n{usage}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
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
    let mut open = true;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            say(&format!(
                "exited {} {}",
                status.code().unwrap_or(-1),
                monotonic_ms()
            ));
            return ExitCode::SUCCESS;
        }
        let now = monotonic_ms();
        if now >= deadline {
            stop(&mut child, fence_ms);
            say(&format!("fenced {}", monotonic_ms()));
            return ExitCode::SUCCESS;
        }
        let wait = Duration::from_millis((deadline - now).min(20));
        if !open {
            std::thread::sleep(wait);
            continue;
        }
        match rx.recv_timeout(wait) {
            Ok(Input::Deadline(ms)) => deadline = deadline.max(ms),
            Ok(Input::Stop) => {
                stop(&mut child, fence_ms);
                say(&format!("stopped {}", monotonic_ms()));
                return ExitCode::SUCCESS;
            }
            Ok(Input::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

//! glibc malloc settings for `ringd`, set once at start, before any thread exists.
//!
//! Measured with `ring-chaos bench --only scale` (10,000 control planes, 1,000 moved at once),
//! glibc's defaults cost a `ringd` 20 to 30 MiB of resident memory that its heap no longer
//! used (heaptrack: the leader's heap peaked at about 50 MiB while its RSS stood at 105-120 MiB):
//!
//! - **arenas**: glibc gives threads their own arenas, up to 8 per core, and each keeps what was
//!   freed in it. `ringd`'s threads (tokio's workers and blocking pool, the log flusher) spread
//!   one workload over many arenas. [`ARENA_MAX`] is 2: one showed lock contention (applies
//!   slowed by a fifth), two did not.
//! - **the mmap threshold**: glibc raises it to the largest block freed (up to 32 MiB), after
//!   which multi-MiB buffers (a snapshot being encoded, a status listing every control plane)
//!   come from the heap and leave holes there. Fixed at [`MMAP_THRESHOLD_BYTES`], such buffers
//!   are mapped and given back to the kernel when freed.
//! - **trimming**: glibc's moving threshold also moved the trim threshold (twice the mmap
//!   threshold, up to 64 MiB of free memory kept at the top of the heap). Fixed at
//!   [`TRIM_THRESHOLD_BYTES`]: more goes back to the kernel, without a system call per free.
//!
//! - **free pages inside the heap**: the trim threshold only returns memory at the *top* of a
//!   heap. After a burst (a failover storm, a registration wave) the heaps are full of free
//!   chunks below live ones, whole pages of them, still resident: 7-9 MiB per `ringd` at rest
//!   after registering 10,000 control planes (measured by calling `malloc_trim(0)` from gdb).
//!   [`start_trimming`] calls [`trim`] every [`TRIM_EVERY`] on a thread of its own, which gives
//!   those pages back (`madvise(MADV_DONTNEED)`; the chunks stay in malloc's free lists).
//!
//! An operator's own settings win: a setting whose environment variable is present
//! (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, or any
//! `GLIBC_TUNABLES`) is left alone, and with `MALLOC_TRIM_THRESHOLD_` or `GLIBC_TUNABLES` set
//! nothing is trimmed periodically either. Other C libraries (musl) are left alone.

use std::time::{Duration, Instant};

/// Most malloc arenas.
pub const ARENA_MAX: i32 = 2;
/// Blocks of at least this many bytes are mapped on their own.
pub const MMAP_THRESHOLD_BYTES: i32 = 256 * 1024;
/// Free memory at the top of the heap beyond this goes back to the kernel.
pub const TRIM_THRESHOLD_BYTES: i32 = 1024 * 1024;

/// Applies the settings above; returns what it set (for the start-up log), e.g.
/// `["arena_max=2", ...]`. Call it first thing in `main`, while the process has one thread.
pub fn tune() -> Vec<String> {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return Vec::new();
    }
    let mut set = Vec::new();
    for (env, name, param, value) in SETTINGS {
        if std::env::var_os(env).is_none() && mallopt(param, value) {
            set.push(format!("{name}={value}"));
        }
    }
    set
}

/// How often [`start_trimming`]'s thread gives free heap pages back. A trim holds malloc's lock
/// while it walks the free lists: at 10,000 control planes (wall time, two busy cores) the
/// slowest were 2.5-5 ms on followers and 12 ms on the leader while registering; each new
/// slowest is logged at debug level.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Starts a thread that calls [`trim`] every [`TRIM_EVERY`] for the rest of the process's life,
/// unless the operator tunes trimming (`MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`) or the C
/// library is not glibc. Returns whether it started.
pub fn start_trimming() -> bool {
    if !cfg!(all(target_os = "linux", target_env = "gnu"))
        || std::env::var_os("GLIBC_TUNABLES").is_some()
        || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
    {
        return false;
    }
    std::thread::Builder::new()
        .name("malloc-trim".into())
        .spawn(|| {
            let mut slowest = Duration::ZERO;
            loop {
                std::thread::sleep(TRIM_EVERY);
                let started = Instant::now();
                trim();
                let took = started.elapsed();
                if took > slowest {
                    slowest = took;
                    tracing::debug!("malloc_trim took {took:?} (the slowest yet)");
                }
            }
        })
        .is_ok()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
const SETTINGS: [(&str, &str, i32, i32); 3] = [
    (
        "MALLOC_ARENA_MAX",
        "arena_max",
        libc::M_ARENA_MAX,
        ARENA_MAX,
    ),
    (
        "MALLOC_MMAP_THRESHOLD_",
        "mmap_threshold",
        libc::M_MMAP_THRESHOLD,
        MMAP_THRESHOLD_BYTES,
    ),
    (
        "MALLOC_TRIM_THRESHOLD_",
        "trim_threshold",
        libc::M_TRIM_THRESHOLD,
        TRIM_THRESHOLD_BYTES,
    ),
];

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
const SETTINGS: [(&str, &str, i32, i32); 0] = [];

/// glibc's `mallopt`; true when it accepted the setting.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn mallopt(param: i32, value: i32) -> bool {
    // SAFETY: mallopt takes two integers and touches only malloc's own settings, under
    // malloc's lock; the parameters are glibc's documented constants with positive values.
    unsafe { libc::mallopt(param, value) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn mallopt(_param: i32, _value: i32) -> bool {
    false
}

/// Gives every whole free page inside malloc's heaps back to the kernel (glibc's
/// `malloc_trim(0)`); returns whether any memory was released. Does nothing elsewhere.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() -> bool {
    // SAFETY: malloc_trim takes a size and works on malloc's own free lists under malloc's
    // locks; it is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Gives free heap pages back to the kernel: only with glibc, so nothing here.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_every_setting() {
        for (_, name, param, value) in SETTINGS {
            assert!(mallopt(param, value), "mallopt refused {name}={value}");
        }
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn trim_gives_freed_pages_back() {
        // Many small blocks (below the mmap threshold, so from the heap), every other one
        // freed: the holes are free pages below live blocks, which only a trim returns.
        let blocks: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 64 * 1024]).collect();
        let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(2).collect();
        assert!(
            trim(),
            "malloc_trim released nothing after 128 MiB were freed"
        );
        assert_eq!(kept.len(), 2048);
        assert!(kept.iter().all(|b| b.iter().all(|x| *x == 1)));
    }
}

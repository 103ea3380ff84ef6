//! Pure numbers for the benchmarks: latency summaries and percentiles of durations.

use serde::Serialize;

use crate::report::percentile;

/// Throughput and latency of a set of acknowledged operations.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Operations acknowledged in the window.
    pub count: u64,
    /// Of them, per second of the window.
    pub per_second: f64,
    /// Median latency, µs (nearest rank).
    pub p50_us: u64,
    /// 99th percentile latency, µs (nearest rank).
    pub p99_us: u64,
    /// Largest latency, µs.
    pub max_us: u64,
    /// Mean latency, µs.
    pub mean_us: u64,
}

impl LatencySummary {
    /// The summary of `latencies_us` (any order) acknowledged within `seconds`.
    pub fn from_micros(mut latencies_us: Vec<u64>, seconds: f64) -> Self {
        latencies_us.sort_unstable();
        let count = latencies_us.len() as u64;
        let sum: u128 = latencies_us.iter().map(|v| u128::from(*v)).sum();
        Self {
            count,
            per_second: if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            },
            p50_us: percentile(&latencies_us, 50.0).unwrap_or(0),
            p99_us: percentile(&latencies_us, 99.0).unwrap_or(0),
            max_us: latencies_us.last().copied().unwrap_or(0),
            mean_us: if count == 0 {
                0
            } else {
                (sum / u128::from(count)) as u64
            },
        }
    }
}

/// Percentiles of a few durations (one per trial), ms.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DurationStats {
    /// How many trials measured it.
    pub n: usize,
    /// Median (nearest rank), ms.
    pub p50_ms: Option<u64>,
    /// 99th percentile (nearest rank: the largest with fewer than 100 trials), ms.
    pub p99_ms: Option<u64>,
    /// Smallest, ms.
    pub min_ms: Option<u64>,
    /// Largest, ms.
    pub max_ms: Option<u64>,
}

impl DurationStats {
    /// The statistics of the values present.
    pub fn of(values: impl IntoIterator<Item = Option<u64>>) -> Self {
        let mut v: Vec<u64> = values.into_iter().flatten().collect();
        v.sort_unstable();
        Self {
            n: v.len(),
            p50_ms: percentile(&v, 50.0),
            p99_ms: percentile(&v, 99.0),
            min_ms: v.first().copied(),
            max_ms: v.last().copied(),
        }
    }
}

/// User + system CPU ticks of a process from its `/proc/<pid>/stat` line.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds used so far by the processes `pids` (those still running), all threads.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let per_second = *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|s| stat_cpu_ticks(&s))
        .sum::<u64>() as f64
        / per_second
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_from_a_stat_line() {
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(stat_cpu_ticks(line), Some(1234 + 567));
        assert_eq!(stat_cpu_ticks("garbage"), None);
        assert_eq!(stat_cpu_ticks("1 (x) S 1 2"), None);
        // This process has used some CPU, and its stat parses.
        assert!(cpu_seconds(&[std::process::id()]) >= 0.0);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(stat_cpu_ticks(&own).is_some());
    }

    #[test]
    fn latency_summary_of_known_values() {
        // 1..=100 ms in µs, shuffled: p50 is the 50th, p99 the 99th.
        let mut v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        v.reverse();
        let s = LatencySummary::from_micros(v, 2.0);
        assert_eq!(s.count, 100);
        assert_eq!(s.per_second, 50.0);
        assert_eq!(s.p50_us, 50_000);
        assert_eq!(s.p99_us, 99_000);
        assert_eq!(s.max_us, 100_000);
        assert_eq!(s.mean_us, 50_500);
    }

    #[test]
    fn latency_summary_of_nothing_is_zero() {
        let s = LatencySummary::from_micros(Vec::new(), 5.0);
        assert_eq!(s, LatencySummary::default());
        assert_eq!(LatencySummary::from_micros(vec![7], 0.0).per_second, 0.0);
    }

    #[test]
    fn duration_stats_skip_missing_trials() {
        let s = DurationStats::of([Some(300), None, Some(100), Some(200)]);
        assert_eq!(s.n, 3);
        assert_eq!(s.p50_ms, Some(200));
        assert_eq!(s.p99_ms, Some(300));
        assert_eq!(s.min_ms, Some(100));
        assert_eq!(s.max_ms, Some(300));
        assert_eq!(DurationStats::of([None]), DurationStats::default());
    }
}

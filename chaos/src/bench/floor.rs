//! Floors under the commit part's throughput ratios (`--floor CLIENTS=RATIO`): the guard CI
//! runs against the next commit-path regression (issue 40).
//!
//! The goals of the table (ring >= 1.0x etcd) are what the ring aims for on a quiet machine;
//! a 2-CPU CI runner with a shared disk moves the ratio by 10-20% from run to run, so a floor
//! is generous on purpose: it catches a change that costs a third of every write, not noise.
//! A run under a floor fails (exit status 1) after printing the table as usual.

use std::str::FromStr;

use serde::Serialize;

use super::commit::CommitReport;

/// The least ring/etcd throughput ratio at one number of clients.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Floor {
    /// Concurrent clients the floor is for.
    pub clients: usize,
    /// The least ring/etcd writes/s ratio.
    pub min_ratio: f64,
}

/// Most a floor may ask for (a typo like `1=90` must not pass as "90x etcd").
pub const MAX_FLOOR_RATIO: f64 = 10.0;

impl FromStr for Floor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (clients, ratio) = s.split_once('=').ok_or_else(|| {
            format!("`{s}`: a floor is CLIENTS=RATIO, e.g. `1=0.9` (1 client at least 0.9x etcd)")
        })?;
        let clients: usize = clients
            .trim()
            .parse()
            .map_err(|_| format!("`{s}`: `{clients}` is not a number of clients"))?;
        let min_ratio: f64 = ratio
            .trim()
            .trim_end_matches('x')
            .parse()
            .map_err(|_| format!("`{s}`: `{ratio}` is not a ratio (like 0.9)"))?;
        if clients == 0 {
            return Err(format!("`{s}`: clients must be at least 1"));
        }
        if !(min_ratio > 0.0 && min_ratio <= MAX_FLOOR_RATIO) {
            return Err(format!(
                "`{s}`: the ratio must be above 0 and at most {MAX_FLOOR_RATIO}"
            ));
        }
        Ok(Self { clients, min_ratio })
    }
}

/// What `report` breaks of `floors`, one sentence each (empty: all held). A floor whose point
/// was not measured, or whose etcd point has no throughput, is broken too: a guard that cannot
/// measure must not pass.
pub fn broken(report: &CommitReport, floors: &[Floor]) -> Vec<String> {
    let mut out = Vec::new();
    for floor in floors {
        let c = floor.clients;
        let clients = if c == 1 { "client" } else { "clients" };
        let ring = report.ring.iter().find(|p| p.clients == c);
        let etcd = report.etcd.iter().find(|p| p.clients == c);
        let ratio = super::ratio(
            ring.map(|p| p.summary.per_second),
            etcd.map(|p| p.summary.per_second),
        );
        match ratio {
            None => out.push(format!(
                "floor {c}={:.2}: no ring/etcd throughput ratio was measured at {c} {clients}",
                floor.min_ratio
            )),
            Some(r) if r < floor.min_ratio => out.push(format!(
                "throughput at {c} {clients} is {r:.2}x etcd, under its floor of {:.2}x: \
                 a commit-path regression? (compare builds in one run: chaos/README.md, \"Commit path\")",
                floor.min_ratio
            )),
            Some(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::commit::Point;
    use crate::bench::stats::LatencySummary;

    fn point(clients: usize, per_second: f64) -> Point {
        Point {
            clients,
            summary: LatencySummary {
                per_second,
                ..LatencySummary::default()
            },
            errors: 0,
            server_cpu_s: 0.0,
            server_cpu_us_per_write: None,
            client_cpu_s: 0.0,
            first_error: None,
        }
    }

    fn report(points: &[(usize, f64, f64)]) -> CommitReport {
        CommitReport {
            etcd: points.iter().map(|&(c, _, e)| point(c, e)).collect(),
            ring: points.iter().map(|&(c, r, _)| point(c, r)).collect(),
            ..CommitReport::default()
        }
    }

    #[test]
    fn floors_parse_and_refuse_nonsense() {
        assert_eq!(
            "1=0.9".parse::<Floor>(),
            Ok(Floor {
                clients: 1,
                min_ratio: 0.9
            })
        );
        assert_eq!("64=1.0x".parse::<Floor>().map(|f| f.min_ratio), Ok(1.0));
        for bad in [
            "1", "=0.9", "x=0.9", "0=0.9", "1=", "1=0", "1=-1", "1=90", "1=nan",
        ] {
            let e = bad.parse::<Floor>().expect_err(bad);
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn a_ratio_under_its_floor_or_unmeasured_breaks_it() {
        let floors = [
            Floor {
                clients: 1,
                min_ratio: 0.9,
            },
            Floor {
                clients: 64,
                min_ratio: 1.0,
            },
        ];
        assert!(
            broken(
                &report(&[(1, 950.0, 1000.0), (64, 5000.0, 5000.0)]),
                &floors
            )
            .is_empty()
        );
        let b = broken(
            &report(&[(1, 760.0, 1000.0), (64, 5000.0, 5000.0)]),
            &floors,
        );
        assert_eq!(b.len(), 1, "{b:?}");
        assert!(
            b[0].contains("0.76x etcd, under its floor of 0.90x"),
            "{b:?}"
        );
        // 64 not measured, and an etcd point with no writes: both broken.
        let b = broken(&report(&[(1, 950.0, 0.0)]), &floors);
        assert_eq!(b.len(), 2, "{b:?}");
        assert!(
            b.iter()
                .all(|s| s.contains("no ring/etcd throughput ratio")),
            "{b:?}"
        );
    }
}

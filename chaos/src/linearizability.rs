//! A linearizability checker for registers, written for the Admin API's control-plane registry
//! (the Knossos / Porcupine approach: Wing & Gong's search with Lowe's memoization).
//!
//! A history is a set of operations, each with the time the client invoked it and the time it
//! completed (or none: the outcome is unknown, it may take effect at any time after its
//! invocation, or never). It is linearizable when the operations can be put in one order that
//! (1) keeps every operation that completed before another was invoked before it, and (2) makes
//! every read return the value of the latest write before it (or the initial value).
//!
//! Linearizability is compositional (Herlihy & Wing): a history of many registers is
//! linearizable when each register's is, so each is checked on its own, which keeps the search
//! small. The search: repeatedly pick an operation that may come next (invoked before every
//! remaining completed operation completed), apply it to the register, go on; backtrack when a
//! read does not match; remember (set of operations done, value) pairs already explored.

use std::collections::{BTreeMap, HashSet};

/// What an operation did to a register.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Wrote the value.
    Write(String),
    /// Read the value (the empty string: the register held nothing).
    Read(String),
}

/// One operation of a client on one register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Which client did it (for messages).
    pub client: usize,
    /// When it was invoked, ms on the run's clock.
    pub invoke_ms: u64,
    /// When it completed, ms; `None` when the outcome is unknown (a write that timed out).
    pub complete_ms: Option<u64>,
    /// What it did.
    pub kind: Kind,
}

/// Why a register's history is not linearizable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLinearizable {
    /// The register.
    pub register: String,
    /// The operations that could be ordered, at most: the ones after them cannot be.
    pub longest_prefix: usize,
    /// Operations of the register.
    pub ops: usize,
    /// A completed operation no order could place (the first one left over in the longest
    /// prefix found).
    pub stuck_at: Option<Op>,
}

impl std::fmt::Display for NotLinearizable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the history of {} is not linearizable: at most {} of its {} operations can be ordered",
            self.register, self.longest_prefix, self.ops
        )?;
        if let Some(op) = &self.stuck_at {
            write!(
                f,
                "; none can place {:?} by client {} (invoked at {} ms, completed at {:?} ms)",
                op.kind, op.client, op.invoke_ms, op.complete_ms
            )?;
        }
        Ok(())
    }
}

/// Largest number of (operations done, value) states one register's search may visit before it
/// gives up (a bound on time and memory; a chaos run's histories need far fewer).
pub const MAX_STATES: usize = 5_000_000;

/// The outcome of checking one register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Linearizable; the number of states the search visited.
    Linearizable { states: usize },
    /// Not linearizable.
    Not(NotLinearizable),
    /// The search visited [`MAX_STATES`] states without an answer.
    TooLarge,
}

/// Checks each register's history; registers start empty (`""`).
pub fn check(histories: &BTreeMap<String, Vec<Op>>) -> BTreeMap<String, Outcome> {
    histories
        .iter()
        .map(|(register, ops)| (register.clone(), check_register(register, ops)))
        .collect()
}

/// Checks one register's history.
pub fn check_register(register: &str, ops: &[Op]) -> Outcome {
    let n = ops.len();
    let words = n.div_ceil(64).max(1);
    // Values as small numbers, so a state is (bitset, value id).
    let mut values: BTreeMap<&str, u32> = BTreeMap::new();
    values.insert("", 0);
    for op in ops {
        let v = match &op.kind {
            Kind::Write(v) | Kind::Read(v) => v.as_str(),
        };
        let next = values.len() as u32;
        values.entry(v).or_insert(next);
    }
    let value_of = |op: &Op| match &op.kind {
        Kind::Write(v) | Kind::Read(v) => values[v.as_str()],
    };
    let ids: Vec<u32> = ops.iter().map(value_of).collect();
    let completed: Vec<usize> = (0..n).filter(|&i| ops[i].complete_ms.is_some()).collect();

    let mut seen: HashSet<(Vec<u64>, u32)> = HashSet::new();
    let mut done = vec![0u64; words];
    let is_done = |done: &[u64], i: usize| done[i / 64] & (1 << (i % 64)) != 0;
    // Depth-first, with an explicit stack of (chosen op, previous value) to undo.
    let mut stack: Vec<(usize, u32)> = Vec::new();
    let mut value = 0u32;
    let mut best = 0usize;
    // Candidates are tried in index order; `next[depth]` is where to continue at that depth.
    let mut next_from: Vec<usize> = vec![0];
    loop {
        // Every completed operation placed: linearizable (unknown writes may never apply).
        if completed.iter().all(|&i| is_done(&done, i)) {
            return Outcome::Linearizable { states: seen.len() };
        }
        best = best.max(stack.len());
        // The earliest completion among the remaining completed operations: an operation
        // invoked after it cannot come next.
        let horizon = completed
            .iter()
            .filter(|&&i| !is_done(&done, i))
            .filter_map(|&i| ops[i].complete_ms)
            .min()
            .unwrap_or(u64::MAX);
        let depth = stack.len();
        let mut advanced = false;
        let mut i = next_from[depth];
        while i < n {
            if !is_done(&done, i) && ops[i].invoke_ms <= horizon {
                let ok = match ops[i].kind {
                    Kind::Write(_) => true,
                    Kind::Read(_) => ids[i] == value,
                };
                if ok {
                    let new_value = match ops[i].kind {
                        Kind::Write(_) => ids[i],
                        Kind::Read(_) => value,
                    };
                    done[i / 64] |= 1 << (i % 64);
                    if seen.insert((done.clone(), new_value)) {
                        if seen.len() >= MAX_STATES {
                            return Outcome::TooLarge;
                        }
                        next_from[depth] = i + 1;
                        stack.push((i, value));
                        value = new_value;
                        next_from.push(0);
                        advanced = true;
                        break;
                    }
                    done[i / 64] &= !(1 << (i % 64));
                }
            }
            i += 1;
        }
        if advanced {
            continue;
        }
        // Nothing fits at this depth: undo the last choice and try the next one there.
        next_from.pop();
        match stack.pop() {
            Some((op, previous)) => {
                done[op / 64] &= !(1 << (op % 64));
                value = previous;
            }
            None => {
                let stuck_at = completed
                    .iter()
                    .map(|&i| &ops[i])
                    .filter(|op| matches!(op.kind, Kind::Read(_)))
                    .min_by_key(|op| op.invoke_ms)
                    .cloned();
                return Outcome::Not(NotLinearizable {
                    register: register.to_string(),
                    longest_prefix: best,
                    ops: n,
                    stuck_at: find_stuck(ops).or(stuck_at),
                });
            }
        }
    }
}

/// A read whose value no write could have given it: never written, or written only after the
/// read completed, or overwritten before the read was invoked by a write that completed
/// before; the plainest explanation of a failure, when there is one.
fn find_stuck(ops: &[Op]) -> Option<Op> {
    ops.iter()
        .filter(|r| r.complete_ms.is_some())
        .find(|r| {
            let Kind::Read(v) = &r.kind else { return false };
            let read_done = r.complete_ms.unwrap_or(u64::MAX);
            let writes_of_v: Vec<&Op> = ops
                .iter()
                .filter(|w| matches!(&w.kind, Kind::Write(x) if x == v))
                .collect();
            if v.is_empty() && writes_of_v.is_empty() {
                // The initial value: stale once a write completed before the read began.
                return ops.iter().any(|w| {
                    matches!(w.kind, Kind::Write(_))
                        && w.complete_ms.is_some_and(|c| c < r.invoke_ms)
                });
            }
            !writes_of_v.iter().any(|w| w.invoke_ms <= read_done)
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(client: usize, invoke_ms: u64, complete_ms: Option<u64>, v: &str) -> Op {
        Op {
            client,
            invoke_ms,
            complete_ms,
            kind: Kind::Write(v.into()),
        }
    }

    fn r(client: usize, invoke_ms: u64, complete_ms: u64, v: &str) -> Op {
        Op {
            client,
            invoke_ms,
            complete_ms: Some(complete_ms),
            kind: Kind::Read(v.into()),
        }
    }

    fn linearizable(ops: &[Op]) -> bool {
        matches!(check_register("x", ops), Outcome::Linearizable { .. })
    }

    #[test]
    fn sequential_histories() {
        assert!(linearizable(&[]));
        assert!(linearizable(&[r(0, 0, 1, "")]));
        assert!(linearizable(&[w(0, 0, Some(1), "a"), r(1, 2, 3, "a")]));
        // A read after a completed write must not see the old value.
        assert!(!linearizable(&[w(0, 0, Some(1), "a"), r(1, 2, 3, "")]));
        // Nor a value never written.
        assert!(!linearizable(&[r(1, 2, 3, "b")]));
    }

    #[test]
    fn concurrent_operations_may_go_either_way() {
        // A read overlapping a write sees the old or the new value.
        assert!(linearizable(&[w(0, 0, Some(10), "a"), r(1, 2, 3, "")]));
        assert!(linearizable(&[w(0, 0, Some(10), "a"), r(1, 2, 3, "a")]));
        // But once one read saw the new value, a later read cannot see the old one.
        assert!(!linearizable(&[
            w(0, 0, Some(10), "a"),
            r(1, 2, 3, "a"),
            r(2, 4, 5, "")
        ]));
        // Two overlapping writes: reads after both agree on one order, and keep it.
        assert!(linearizable(&[
            w(0, 0, Some(10), "a"),
            w(1, 1, Some(9), "b"),
            r(2, 11, 12, "a"),
            r(2, 13, 14, "a")
        ]));
        assert!(!linearizable(&[
            w(0, 0, Some(10), "a"),
            w(1, 1, Some(9), "b"),
            r(2, 11, 12, "a"),
            r(2, 13, 14, "b")
        ]));
    }

    #[test]
    fn a_write_of_unknown_outcome_may_apply_late_or_never() {
        // Timed out, then seen much later: it applied late.
        assert!(linearizable(&[
            w(0, 0, None, "a"),
            r(1, 50, 51, ""),
            r(1, 100, 101, "a")
        ]));
        // Never seen: it never applied.
        assert!(linearizable(&[w(0, 0, None, "a"), r(1, 100, 101, "")]));
        // But it cannot apply before it was invoked.
        assert!(!linearizable(&[r(1, 0, 1, "a"), w(0, 5, None, "a")]));
    }

    #[test]
    fn a_failure_names_the_read_no_order_can_place() {
        let ops = [w(0, 0, Some(1), "a"), r(1, 2, 3, "")];
        let Outcome::Not(why) = check_register("cp-1", &ops) else {
            panic!("a stale read passed");
        };
        assert_eq!(why.stuck_at, Some(ops[1].clone()));
        assert!(why.to_string().contains("cp-1"), "{why}");
    }

    #[test]
    fn many_clients_many_operations_stay_fast() {
        // Four clients, 2,000 operations, each client's writes and reads in turn, overlapping
        // the others': linearizable by construction (each op takes effect at its midpoint).
        let mut ops = Vec::new();
        let mut value_at: Vec<(u64, String)> = vec![(0, String::new())];
        let mut rng = 7u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut planned = Vec::new();
        for client in 0..4 {
            let mut t = client as u64;
            for k in 0..500 {
                let len = 2 + next() % 20;
                let write = next() % 2 == 0;
                planned.push((t, t + len, client, write, format!("{client}-{k}")));
                t += len + 1 + next() % 5;
            }
        }
        // Effects at midpoints, in time order.
        planned.sort_by_key(|p| (p.0 + p.1, p.2));
        for (invoke, complete, client, write, v) in planned {
            let mid = invoke + complete;
            if write {
                value_at.push((mid, v.clone()));
                ops.push(w(client, invoke, Some(complete), &v));
            } else {
                let current = value_at.last().map(|x| x.1.clone()).unwrap_or_default();
                ops.push(r(client, invoke, complete, &current));
            }
        }
        let started = std::time::Instant::now();
        let outcome = check_register("x", &ops);
        assert!(
            matches!(outcome, Outcome::Linearizable { .. }),
            "{outcome:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}

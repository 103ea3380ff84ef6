//! The agent's decisions: what a member starts, keeps and stops, as a pure function of the
//! lease it was last granted and what it runs.
//!
//! A lease is granted by the leader for an exact set of (control plane, epoch) pairs and lasts
//! `lease_ms` from the moment the member *sent* its request (its own monotonic clock). The
//! agent renews one request at a time and drops the answer to a request it gave up on, so the
//! only grant it can act on after sending a request is that request's answer (the leader relies
//! on this when a member reports a control plane released).
//!
//! Rules: a control plane runs only at an epoch in the current grant; anything running that the
//! grant does not cover (another epoch, or not at all) is stopped at once; an epoch older than
//! one seen before is never acted on. Without a fresh grant nothing is started or extended, and
//! each workload's guard stops it at the deadline it was given (DESIGN.md rule 1).

use std::collections::BTreeMap;

use super::etcd_cluster::ReplicaKey;

/// A lease the leader granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// When the request was sent, on the member's monotonic clock (ms).
    pub sent_at_ms: u64,
    /// The lease length.
    pub lease_ms: u64,
    /// Control plane -> epoch this member may serve.
    pub control_planes: BTreeMap<String, u64>,
    /// Zone-tolerant control plane -> which run of this member's etcd member of it: the etcd
    /// members it runs ([`RingState::replica_grants`](crate::RingState::replica_grants)).
    pub replicas: BTreeMap<String, ReplicaKey>,
}

impl Grant {
    /// When the lease runs out, on the member's monotonic clock.
    pub fn deadline_ms(&self) -> u64 {
        self.sent_at_ms + self.lease_ms
    }
}

/// What to do with one workload.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Stop the instance at `epoch` now (it is not granted any more).
    Stop {
        /// The control plane.
        name: String,
        /// The epoch of the running instance.
        epoch: u64,
    },
    /// Start the control plane at `epoch`, to be stopped by its guard at `deadline_ms`.
    Start {
        /// The control plane.
        name: String,
        /// The granted epoch.
        epoch: u64,
        /// The lease deadline (monotonic ms).
        deadline_ms: u64,
    },
    /// Move the guard's deadline of the running instance to `deadline_ms`.
    Extend {
        /// The control plane.
        name: String,
        /// The granted epoch.
        epoch: u64,
        /// The new deadline (monotonic ms).
        deadline_ms: u64,
    },
}

/// What the agent remembers between rounds: the highest epoch seen per control plane.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    seen: BTreeMap<String, u64>,
}

impl Memory {
    /// The highest epoch seen for `name`.
    pub fn seen(&self, name: &str) -> Option<u64> {
        self.seen.get(name).copied()
    }
}

/// The actions for a fresh `grant`, given what runs now (control plane -> epoch). Stops come
/// first, so a member never runs two epochs of one control plane at once.
pub fn reconcile(
    memory: &mut Memory,
    grant: &Grant,
    running: &BTreeMap<String, u64>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for (name, epoch) in running {
        if grant.control_planes.get(name) != Some(epoch) {
            actions.push(Action::Stop {
                name: name.clone(),
                epoch: *epoch,
            });
        }
    }
    for (name, epoch) in &grant.control_planes {
        let seen = memory.seen.entry(name.clone()).or_insert(*epoch);
        if *epoch < *seen {
            // Never act on an epoch older than one already seen (a stale leader's answer).
            continue;
        }
        *seen = *epoch;
        let deadline_ms = grant.deadline_ms();
        actions.push(if running.get(name) == Some(epoch) {
            Action::Extend {
                name: name.clone(),
                epoch: *epoch,
                deadline_ms,
            }
        } else {
            Action::Start {
                name: name.clone(),
                epoch: *epoch,
                deadline_ms,
            }
        });
    }
    actions
}

/// What to do with one etcd member of a zone-tolerant control plane (a replica).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReplicaAction {
    /// Stop it: the member no longer belongs to the cluster (or joined it again since).
    Stop {
        /// The control plane.
        name: String,
        /// The running replica's key.
        key: ReplicaKey,
    },
    /// Start it, to be stopped by its guard at `deadline_ms`.
    Start {
        /// The control plane.
        name: String,
        /// Which run.
        key: ReplicaKey,
        /// The lease deadline (monotonic ms).
        deadline_ms: u64,
    },
    /// Move the guard's deadline of the running replica.
    Extend {
        /// The control plane.
        name: String,
        /// Which run.
        key: ReplicaKey,
        /// The new deadline (monotonic ms).
        deadline_ms: u64,
    },
}

/// The actions on the etcd members this member runs (`running`: control plane -> key) for a
/// fresh `grant`: stop those not granted (or granted with another key: the member was removed
/// from the cluster and added again, and must start from nothing; or it must start again on
/// its data, a recovery), start or extend the granted ones. Stops come first. Replicas need no epoch memory: etcd keeps its own
/// members consistent, and nothing a client reaches runs on a replica (the host's gate is
/// governed by [`reconcile`]).
pub fn reconcile_replicas(
    grant: &Grant,
    running: &BTreeMap<String, ReplicaKey>,
) -> Vec<ReplicaAction> {
    let mut actions = Vec::new();
    for (name, key) in running {
        if grant.replicas.get(name) != Some(key) {
            actions.push(ReplicaAction::Stop {
                name: name.clone(),
                key: *key,
            });
        }
    }
    let deadline_ms = grant.deadline_ms();
    for (name, key) in &grant.replicas {
        let (name, key) = (name.clone(), *key);
        actions.push(if running.get(&name) == Some(&key) {
            ReplicaAction::Extend {
                name,
                key,
                deadline_ms,
            }
        } else {
            ReplicaAction::Start {
                name,
                key,
                deadline_ms,
            }
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(joined: u64) -> ReplicaKey {
        ReplicaKey {
            joined,
            incarnation: 0,
        }
    }

    #[test]
    fn replicas_start_extend_and_stop_by_the_grant_and_a_new_generation_restarts() {
        let grant = Grant {
            sent_at_ms: 0,
            lease_ms: 1_000,
            control_planes: BTreeMap::new(),
            replicas: [("x".to_string(), key(1)), ("y".to_string(), key(3))].into(),
        };
        let running = [
            ("x".to_string(), key(1)),
            ("y".to_string(), key(2)),
            ("z".to_string(), key(1)),
        ]
        .into();
        assert_eq!(
            reconcile_replicas(&grant, &running),
            vec![
                ReplicaAction::Stop {
                    name: "y".into(),
                    key: key(2)
                },
                ReplicaAction::Stop {
                    name: "z".into(),
                    key: key(1)
                },
                ReplicaAction::Extend {
                    name: "x".into(),
                    key: key(1),
                    deadline_ms: 1_000
                },
                ReplicaAction::Start {
                    name: "y".into(),
                    key: key(3),
                    deadline_ms: 1_000
                },
            ]
        );
    }

    fn grant(sent_at_ms: u64, cps: &[(&str, u64)]) -> Grant {
        Grant {
            sent_at_ms,
            lease_ms: 1_000,
            control_planes: cps.iter().map(|(n, e)| (n.to_string(), *e)).collect(),
            replicas: BTreeMap::new(),
        }
    }

    fn running(cps: &[(&str, u64)]) -> BTreeMap<String, u64> {
        cps.iter().map(|(n, e)| (n.to_string(), *e)).collect()
    }

    #[test]
    fn starts_extends_and_stops_by_the_grant() {
        let mut m = Memory::default();
        let a = reconcile(
            &mut m,
            &grant(100, &[("x", 1), ("y", 2)]),
            &running(&[("x", 1), ("z", 4)]),
        );
        assert_eq!(
            a,
            vec![
                Action::Stop {
                    name: "z".into(),
                    epoch: 4
                },
                Action::Extend {
                    name: "x".into(),
                    epoch: 1,
                    deadline_ms: 1_100
                },
                Action::Start {
                    name: "y".into(),
                    epoch: 2,
                    deadline_ms: 1_100
                },
            ]
        );
    }

    #[test]
    fn another_epoch_is_stopped_before_the_new_one_starts() {
        let mut m = Memory::default();
        let a = reconcile(&mut m, &grant(0, &[("x", 3)]), &running(&[("x", 1)]));
        assert_eq!(
            a,
            vec![
                Action::Stop {
                    name: "x".into(),
                    epoch: 1
                },
                Action::Start {
                    name: "x".into(),
                    epoch: 3,
                    deadline_ms: 1_000
                },
            ]
        );
    }

    #[test]
    fn an_older_epoch_is_never_acted_on() {
        let mut m = Memory::default();
        reconcile(&mut m, &grant(0, &[("x", 5)]), &running(&[]));
        assert_eq!(m.seen("x"), Some(5));
        let a = reconcile(&mut m, &grant(10, &[("x", 4)]), &running(&[]));
        assert!(a.is_empty(), "{a:?}");
    }
}

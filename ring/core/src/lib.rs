//! # garden-ring-core
//!
//! The deterministic core of garden-ring: the replicated state of a ring, the commands that
//! change it, and every decision taken from it.
//!
//! Nothing in here does I/O, reads a clock or draws random numbers. Time arrives inside each
//! [`Proposal`](command::Proposal) (stamped by whoever proposed it), so applying the same log to
//! the same state gives the same result on every member, every time. That property is what lets
//! Raft replicate it and what lets tests drive it directly.
//!
//! This crate's dependencies are data-only (serde, thiserror): the compiler, not discipline,
//! keeps tokio, tonic, object_store, hickory, redb and openraft out of it. The I/O around it
//! (the `garden-ring` crate: Raft glue, storage, gRPC, DNS, object stores, drivers) depends on
//! it, never the reverse; `garden_ring::core` is this crate.
//!
//! The modules (the state depends on commands, errors, history and placement; placement reads
//! the state):
//! - [`limits`]: the bounds on everything (sizes, counts, lengths).
//! - [`names`]: syntax checks for names, addresses, URLs, prefixes, TTLs and free text.
//! - [`backup_name`]: etcd-backup-restore's snapshot object names, parsed and formatted.
//! - [`backup_report`]: [`BackupReport`](backup_report::BackupReport), what a host reports
//!   about a control plane's backups (full and delta snapshots), and when it is worth a commit.
//! - [`error`]: [`CommandError`](error::CommandError), why a command was refused.
//! - [`command`]: what can be proposed.
//! - [`member`], [`control_plane`]: what the ring records about each member and control plane.
//! - [`state`]: [`RingState`](state::RingState), plus `apply`.
//! - [`placement`]: the pure choice of a host for a control plane, and of the members of a
//!   zone-tolerant control plane's etcd cluster.
//! - [`etcd_cluster`]: zone-tolerant control planes, whose etcd has a member in each of three
//!   zones ([`Tolerance`](etcd_cluster::Tolerance), [`EtcdCluster`](etcd_cluster::EtcdCluster)).
//! - [`history`]: the bounded record of who did what, when and why.
//! - [`timing`]: [`Timing`](timing::Timing), the Raft and failure-detection timings.
//! - [`health`]: a member's health judged from its silence.
//! - [`renewal`]: which of a member's lease renewals the leader may learn from (rounds, copies).
//! - [`controller`]: the leader's decisions (moves, placements, fences) from the state and what
//!   it observed; [`agent`]: a member's decisions about the workloads its leases cover.
//! - [`operator`]: the operator's moves (drain, switchover, failover), planned.
//! - [`migration`]: the steps of a move and the reports of the host driving it.
//! - [`backup_chain`]: which full and delta snapshots a restore applies.
//! - [`dns_records`]: the DNS records the ring wants, a function of the state.
//! - [`revocation`]: certificates the ring refuses although its CA signed them.
//! - [`ring_version`]: the ring's active version, what each version admits, and when it may
//!   be raised (rolling upgrades).
//! - [`vec_map`]: [`VecMap`](vec_map::VecMap), the small sorted map a control plane keeps its
//!   endpoints in.

pub mod agent;
pub mod backup_chain;
pub mod backup_name;
pub mod backup_report;
pub mod backup_retention;
pub mod command;
pub mod control_plane;
pub mod controller;
pub mod dns_records;
pub mod error;
pub mod etcd_cluster;
pub mod health;
pub mod history;
pub mod limits;
pub mod member;
pub mod migration;
pub mod names;
pub mod operator;
pub mod placement;
pub mod renewal;
pub mod revocation;
pub mod ring_version;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
pub mod timing;
pub mod vec_map;

pub use command::{Command, ControlPlaneSpec, MemberSpec, Proposal};
pub use control_plane::{ControlPlane, MoveKind, Phase};
pub use error::CommandError;
pub use history::{Event, History};
pub use member::{Divergence, Health, Member, Role};
pub use state::{RingSettings, RingState};
pub use timing::Timing;

/// Raft node id of a member. Never reused within a ring.
pub type NodeId = u64;

//! The deterministic core: the replicated state of a ring and the commands that change it.
//!
//! Nothing in here does I/O, reads a clock or draws random numbers. Time arrives inside each
//! [`Proposal`](command::Proposal) (stamped by whoever proposed it), so applying the same log to
//! the same state gives the same result on every member, every time. That property is what lets
//! Raft replicate it and what lets tests drive it directly.
//!
//! The modules (the state depends on commands, errors, history and placement; placement reads
//! the state; nothing here depends on anything outside `core`):
//! - [`limits`]: the bounds on everything (sizes, counts, lengths).
//! - [`names`]: syntax checks for names, addresses, URLs, prefixes, TTLs and free text.
//! - [`backup_name`]: etcd-backup-restore's snapshot object names, parsed and formatted.
//! - [`backup_report`]: [`BackupReport`](backup_report::BackupReport), what a host reports
//!   about a control plane's backups (full and delta snapshots), and when it is worth a commit.
//! - [`error`]: [`CommandError`](error::CommandError), why a command was refused.
//! - [`command`]: what can be proposed.
//! - [`state`]: [`RingState`](state::RingState) and its parts, plus `apply`.
//! - [`placement`]: the pure choice of a host for a control plane.
//! - [`history`]: the bounded record of who did what, when and why.
//! - [`vec_map`]: [`VecMap`](vec_map::VecMap), the small sorted map a control plane keeps its
//!   endpoints in.

pub mod agent;
pub mod backup_chain;
pub mod backup_name;
pub mod backup_report;
pub mod command;
pub mod controller;
pub mod error;
pub mod history;
pub mod limits;
pub mod migration;
pub mod names;
pub mod placement;
pub mod state;
pub mod vec_map;

pub use command::{Command, ControlPlaneSpec, MemberSpec, Proposal};
pub use error::CommandError;
pub use history::{Event, History};
pub use state::{ControlPlane, Health, Member, MoveKind, Phase, RingSettings, RingState, Role};

/// Raft node id of a member. Never reused within a ring.
pub type NodeId = u64;

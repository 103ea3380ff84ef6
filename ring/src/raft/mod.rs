//! openraft glue: everything Raft needs from us, and nothing else.
//!
//! - [`types`]: the openraft type configuration ([`TypeConfig`]) and the node record kept in the
//!   Raft membership ([`MemberNode`]).
//! - [`codec`]: how log entries, snapshots and peer messages are encoded.
//! - [`log_store`]: the Raft log, vote and committed index (redb and the [`wal`]); every
//!   acknowledged write is fsynced first.
//! - [`state_machine`]: applies committed entries to [`RingState`](crate::core::RingState);
//!   builds, stores and installs snapshots.
//! - [`network`]: the client side of the peer protocol (one cached gRPC channel per peer).
//! - [`service`]: the server side of the peer protocol.
//! - [`contact`]: when a leader last reached this member, and of which term (a new leader
//!   counts a silent member's time from it).
//! - [`disk`]: the room the log keeps free on its disk; a member lacking it waits, saying why.
//! - [`storage`]: opening the data directory (one redb file) and its identity checks.
//! - [`wal`]: the log's write-ahead file, where appends are made durable between folds into
//!   redb.
//! - [`offline`]: reading and rewriting a data directory while no `ringd` runs on it (disaster
//!   recovery and snapshot restore).

pub mod codec;
pub mod contact;
pub mod disk;
pub mod divergence;
pub mod log_store;
pub mod network;
pub mod offline;
pub mod service;
pub mod state_machine;
pub mod storage;
pub mod types;
pub mod wal;

pub use log_store::LogStore;
pub use state_machine::StateMachineStore;
pub use types::{MemberNode, NodeId, RaftNode, TypeConfig};

#[cfg(test)]
mod suite_test;

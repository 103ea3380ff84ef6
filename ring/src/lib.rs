//! # garden-ring
//!
//! A self-healing coordinator for a ring of Gardener garden clusters spread across zones.
//!
//! Three (or five) peer daemons, `ringd`, one per zone, form a Raft group. The replicated state
//! records the members, which member hosts which control plane (with an epoch that fences stale
//! hosts), and the history of every change. `ringctl` drives it through the Admin gRPC API.
//!
//! The crate is layered; dependencies point down only:
//!
//! | module | what | I/O? |
//! | --- | --- | --- |
//! | [`core`] | the crate `garden-ring-core` (`ring/core`): replicated state, commands, validation, placement, the controller's and agents' decisions, timings, the DNS records wanted | none: deterministic, data-only dependencies |
//! | [`raft`] | openraft glue: type config, redb storage, peer network and service | disk, network |
//! | [`tls`] | mutual TLS: identities, certificates, hot reload | files, network |
//! | [`secret`] | secrets from files or the environment, never printed | files |
//! | [`version`] | this build's release, commit and the ring versions it runs at | none |
//! | [`durable`] | fsync of directories, so new and renamed files survive a crash | files |
//! | [`admin`] | the Admin gRPC service and its client | network |
//! | [`config`] | `ringd`'s TOML configuration | reads one file |
//! | [`dns`] | the builtin DNS server, RFC 2136 UPDATE messages and their sender, the keeper | network |
//! | [`logging`] | `ringd`'s log lines, text or JSON, with member, control plane and epoch | stderr |
//! | [`membership`] | serialized, idempotent Raft configuration changes | raft |
//! | [`duties`] | what the leader does on its own: registry, membership, health, the controller's decisions | raft |
//! | [`upgrade`] | rolling upgrades: which binary each member runs, whether the ring is mixed | none |
//! | [`leases`] | the leader's side of leases: renewals, observations | raft |
//! | [`agent`] | every member's agent: lease renewal, workloads through a driver and `ring-guard` | processes |
//! | [`introspection`] | gRPC health checking and server reflection next to the ring's services | network |
//! | [`node`] | assembles one member: storage, Raft, servers, background loops | all of the above |
//! | [`recovery`] | disaster recovery of the ring itself: `ringd recover`, snapshot files and restore | files |
//! | [`demo`] | `ringctl demo`: a local ring of child `ringd` processes | processes |
//! //! //!
//! See `ARCHITECTURE.md` at the repository root for the map.
#![deny(missing_docs)]

pub mod admin;
pub mod agent;
pub mod allocator;
pub mod backup;
pub mod cli;
pub mod client_config;
pub mod config;
pub use garden_ring_core as core;
pub mod demo;
pub mod dns;
pub mod durable;
pub mod duties;
pub mod introspection;
pub mod leases;
pub mod logging;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod process;
pub mod raft;
pub mod recovery;
pub mod secret;
pub mod time;
pub mod tls;
pub mod upgrade;
pub mod version;

/// Generated gRPC code for package `gardenring.v1` (see `proto/`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("gardenring.v1");
}

/// Generated gRPC client for the subset of etcd's v3 API the backups use (package
/// `etcdserverpb`, see `proto/etcd/v3/etcd_subset.proto`); wrapped by [`backup::etcd`].
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod etcdpb {
    tonic::include_proto!("etcdserverpb");
}

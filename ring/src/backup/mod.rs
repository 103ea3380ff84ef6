//! Backups of the hosted control planes' etcd, and moving them between object-store buckets
//! when a control plane moves (GEP-7 / GEP-17; DESIGN.md rule 4).
//!
//! Being built (issue "etcd backups and migration"); each part names what it does in its own
//! module docs.
//!
//! - [`checksum`]: the sha256 trailer every etcd snapshot (full or delta) ends with, verified
//!   while streaming, also through gzip or zlib (pure).
//! - [`etcd`]: a small client for etcd's v3 API: status, put, get and the snapshot stream
//!   (plain http to a local etcd; no TLS yet).
//! - [`snapshot`]: takes a full (or final) snapshot from etcd and streams it into an object
//!   store under etcd-backup-restore's v2 name, verified on the way, never leaving a partial
//!   object.
//! - [`restore`]: picks the newest full snapshot that verifies (falling back past corrupt
//!   ones, reporting each) and restores it into a fresh etcd data directory with `etcdctl` or
//!   `etcdutl`.
//! - [`marker`]: the migration markers in the source and destination locations, and who may
//!   write snapshots given them.

pub mod checksum;
pub mod etcd;
pub mod marker;
pub mod restore;
pub mod snapshot;

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
//! - [`migrate`]: the GEP-7 procedure the new host runs: markers in both locations, copy,
//!   markers done; repeatable, so a migration resumes by running it again.
//! - [`location`]: backup locations (`s3://`, `gs://`, `az://`, `file://`) opened as object
//!   stores with the `[backup]` settings; which locations share a store; credentials files.
//! - [`layout`]: listing a location's etcd-backup-restore v2 snapshots, the newest full one
//!   and the incrementals after it.
//! - [`copy`]: copying every snapshot between two locations like `etcdbrctl copy` (final
//!   first, `.final` stripped, skip what is there, bounded parallelism, retries, progress).

pub mod checksum;
pub mod copy;
pub mod delta;
pub mod etcd;
pub mod layout;
pub mod location;
pub mod marker;
pub mod migrate;
pub mod replay;
pub mod restore;
pub mod restore_error;
pub mod snapshot;

/// The object_store crate the backup API is written against, so users of [`location`] can
/// name its types (`ObjectStore`, `ObjectStoreExt`, `path::Path`, `PutPayload`).
pub use object_store;

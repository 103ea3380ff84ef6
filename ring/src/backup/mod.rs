//! Backups of the hosted control planes' etcd, and moving them between object-store buckets
//! when a control plane moves (GEP-7 / GEP-17; DESIGN.md rule 4).
//!
//! Being built (issue "etcd backups and migration"); each part names what it does in its own
//! module docs.
//!
//! - `location.rs`: backup locations (`s3://`, `gs://`, `az://`, `file://`) opened as object
//!   stores with the `[backup]` settings; which locations share a store; credentials files.
//! - `layout.rs`: listing a location's etcd-backup-restore v2 snapshots, the newest full one
//!   and the incrementals after it.
//! - `copy.rs`: copying every snapshot between two locations like `etcdbrctl copy` (final
//!   first, `.final` stripped, skip what is there, bounded parallelism, retries, progress).

pub mod copy;
pub mod layout;
pub mod location;

/// The object_store crate the backup API is written against, so users of [`location`] can
/// name its types (`ObjectStore`, `ObjectStoreExt`, `path::Path`, `PutPayload`).
pub use object_store;

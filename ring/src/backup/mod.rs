//! Backups of the hosted control planes' etcd, and moving them between object-store buckets
//! when a control plane moves (GEP-7 / GEP-17; DESIGN.md rule 4).
//!
//! Being built (issue "etcd backups and migration"); each part names what it does in its own
//! module docs.
//!
//! - [`marker`]: the migration markers in the source and destination locations, and who may
//!   write snapshots given them.

pub mod marker;

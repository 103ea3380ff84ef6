//! Garbage collection of a serving instance's backup location: list it, ask the core which
//! snapshots go ([`crate::core::backup_retention::plan`]), check ownership, delete them.
//!
//! Only the host serving the control plane at its epoch collects, only in its own location,
//! and only when all of these hold, checked in this order:
//!
//! 1. the ring's applied state shows it serving there with no migration in progress
//!    ([`crate::core::backup_retention::hold`]; the caller passes the answer in);
//! 2. it stored a full snapshot at this epoch, and the listing's newest full snapshot is that
//!    one: what the plan keeps whole is then this host's own newest stream (a listing that
//!    lags, or a full snapshot nobody at this epoch wrote, holds GC for the round);
//! 3. its lease has not run out and the location's marker names no later owner (as before
//!    every upload: DESIGN.md rule 4); the lease is checked again before every deletion.
//!
//! What is deleted is never what a restore reads: the newest full snapshot and the deltas
//! after it stay whatever the policy (the core asserts it; this module refuses a plan that
//! would, too). A host frozen between its checks and a deletion can at worst delete an older
//! stream, which no restore reads either.

use object_store::ObjectStoreExt as _;
use tokio::sync::watch;

use super::etcd_backups::{Backups, StoreError};
use super::lease::lease_ran_out;
use crate::backup::layout::{self, Listed};
use crate::core::backup_name::{SnapshotKind, SnapshotName};
use crate::core::backup_report::GcReport;
use crate::core::backup_retention::{self, Retention};
use crate::time::unix_ms;

/// Most snapshots one collection deletes; the rest wait for the next period (a location
/// that never had GC may hold thousands).
pub const MAX_DELETIONS_PER_RUN: usize = 1_000;

/// What a collection came to.
#[derive(Debug)]
pub(super) enum Collected {
    /// It ran: the report to publish.
    Ran(GcReport),
    /// It did not run this period, and why (published in the report too).
    Held(String),
    /// This member no longer owns the location: it must stop serving.
    Lost(String),
}

/// Why a collection failed; the next period tries again.
#[derive(Debug, thiserror::Error)]
pub(super) enum GcError {
    /// The location could not be listed.
    #[error(transparent)]
    List(#[from] layout::StoreError),
    /// Ownership could not be checked (the marker could not be read).
    #[error(transparent)]
    Ownership(#[from] StoreError),
    /// A deletion failed (after `deleted` others succeeded).
    #[error("cannot delete {key} (after {deleted} deleted): {source}")]
    Delete {
        /// The snapshot's key.
        key: String,
        /// Deletions that succeeded before.
        deleted: u64,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },
}

/// The policy as `ringctl cp get` shows it.
pub(super) fn policy_name(retention: Retention) -> String {
    match retention {
        Retention::Exponential => "exponential".into(),
        Retention::LimitBased { max_backups } => format!("limit-based ({max_backups})"),
    }
}

/// Collects the garbage of `backups`' location under `retention`, unless `hold` says the
/// ring's state does not allow it now: see the [module docs](self). Counts what it deleted
/// (and failures) in the runtime's totals.
pub(super) async fn collect(
    backups: &Backups,
    deadline: &watch::Receiver<u64>,
    retention: Retention,
    hold: Option<backup_retention::Hold>,
) -> Result<Collected, GcError> {
    if let Some(hold) = hold {
        return Ok(Collected::Held(hold.to_string()));
    }
    let Some(own_full) = backups.full.as_deref() else {
        return Ok(Collected::Held(
            "no full snapshot stored at this epoch yet".into(),
        ));
    };
    let own = backups.location();
    let listing = layout::list_snapshots(own).await?;
    let snapshots = &listing.snapshots;
    match layout::newest_full(snapshots) {
        Some(newest) if newest.location.as_ref() == own_full => {}
        newest => {
            return Ok(Collected::Held(format!(
                "the location's newest full snapshot is {}, not this host's newest ({own_full})",
                newest.map_or("none".into(), |n| n.location.to_string())
            )));
        }
    }
    let names: Vec<SnapshotName> = snapshots.iter().map(|s| *s.path.name()).collect();
    let now_ms = unix_ms();
    let plan = backup_retention::plan(&names, retention, now_ms / 1000);
    check_plan(snapshots, &plan.delete, own_full);
    if let Some(lost) = backups.lost_ownership(deadline).await? {
        return Ok(Collected::Lost(lost));
    }
    let store = own.store();
    let (mut full, mut delta) = (0u64, 0u64);
    for &i in plan.delete.iter().take(MAX_DELETIONS_PER_RUN) {
        if lease_ran_out(deadline) {
            return Ok(Collected::Lost(
                "the lease ran out during garbage collection: not deleting further".into(),
            ));
        }
        let listed = &snapshots[i];
        match store.delete(&listed.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                backups.count_gc(full, delta, 0);
                return Err(GcError::Delete {
                    key: listed.location.to_string(),
                    deleted: full + delta,
                    source,
                });
            }
        }
        tracing::debug!("GC deleted {}", listed.location);
        match listed.path.name().kind() {
            SnapshotKind::Full => full += 1,
            SnapshotKind::Incr => delta += 1,
        }
    }
    backups.count_gc(full, delta, 0);
    let oldest_full = plan
        .kept_full
        .first()
        .map(|&i| snapshots[i].location.to_string());
    if full + delta > 0 {
        tracing::info!(
            "GC ({}) deleted {full} full and {delta} delta snapshots; {} full kept, the oldest {}",
            policy_name(retention),
            plan.kept_full.len(),
            oldest_full.as_deref().unwrap_or("-")
        );
    }
    Ok(Collected::Ran(GcReport {
        policy: policy_name(retention),
        last_unix_ms: now_ms,
        kept_full: plan.kept_full.len() as u64,
        oldest_full,
        deleted: full + delta,
        held: String::new(),
    }))
}

/// Panics if `delete` names this host's newest full snapshot or a delta after it: the core's
/// plan never does, and a bug there must not reach the store.
fn check_plan(snapshots: &[Listed], delete: &[usize], own_full: &str) {
    let newest = layout::newest_full(snapshots).expect("checked: the newest full is own_full");
    let newest_revision = newest.path.name().last_revision();
    for &i in delete {
        let s = &snapshots[i];
        assert!(
            s.location.as_ref() != own_full,
            "GC plan deletes the newest full snapshot {own_full}"
        );
        assert!(
            s.path.name().kind() == SnapshotKind::Full
                || s.path.name().last_revision() <= newest_revision,
            "GC plan deletes {}, a delta after the newest full snapshot",
            s.location
        );
    }
}

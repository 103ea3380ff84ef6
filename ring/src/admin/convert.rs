//! Conversions between the core's types and the Admin API's messages.

use tonic::Status;

use crate::core::etcd_cluster::EtcdHealth;
use crate::core::{CommandError, ControlPlane, Event, Member, RingState};
use crate::pb;

/// A member as the API shows it.
pub fn member(m: &Member) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name.clone(),
        zone: m.zone.clone(),
        address: m.address.clone(),
        admin_address: m.admin_address.clone(),
        role: m.role.to_string(),
        health: m.health.to_string(),
        cordoned: m.cordoned,
        labels: m.labels.clone(),
        // Set by the service, which knows the certificates members presented.
        certificate_revoked: String::new(),
        // The ring's record (ring version 2); the service adds what this member found or
        // was told.
        diverged: m
            .diverged
            .as_ref()
            .map(|d| d.reason.clone())
            .unwrap_or_default(),
        binary: None,
    }
}

/// A control plane as the API shows it; `state` (the ring it belongs to) tells how its etcd
/// cluster stands.
pub fn control_plane(cp: &ControlPlane, state: &RingState) -> pb::ControlPlane {
    pb::ControlPlane {
        name: cp.name.clone(),
        home: cp.home.clone().unwrap_or_default(),
        dns_name: cp.dns_name.clone(),
        endpoints: cp
            .endpoints
            .iter()
            .map(|(member, endpoint)| (member.clone(), endpoint.clone()))
            .collect(),
        backup: cp.backup.clone(),
        host: cp.host.clone().unwrap_or_default(),
        epoch: cp.epoch,
        phase: cp.phase.to_string(),
        fencing: cp.fencing.iter().cloned().collect(),
        unplaced_reason: cp.unplaced_reason.clone(),
        prefer: cp.prefer.clone(),
        backups: cp.backups.clone().into_iter().collect(),
        migration: cp.migration.as_ref().map(migration),
        labels: cp.labels.clone(),
        backup_status: cp.backup_status.as_ref().map(backup_status),
        tolerance: cp.tolerance.to_string(),
        etcd_peers: cp
            .etcd_peers
            .iter()
            .map(|(m, p)| (m.clone(), p.clone()))
            .collect(),
        etcd: cp.etcd.as_ref().map(|cluster| {
            let health = state
                .etcd_health(cp)
                .expect("a control plane with an etcd cluster has its health");
            pb::EtcdCluster {
                token: cluster.token.clone(),
                generation: cluster.generation,
                members: cluster
                    .members
                    .iter()
                    .map(|m| pb::EtcdClusterMember {
                        member: m.member.clone(),
                        peer: m.peer.clone(),
                        joined: m.joined,
                        learner: m.learner,
                        etcd_id: m.etcd_id,
                    })
                    .collect(),
                health: health.word().to_string(),
                down: match health {
                    EtcdHealth::Whole { .. } => Vec::new(),
                    EtcdHealth::Degraded { down, .. } | EtcdHealth::NoQuorum { down, .. } => down,
                },
                change: cluster
                    .change
                    .as_ref()
                    .map(|c| format!("{} -> {}: {}", c.removed, c.added, c.step))
                    .unwrap_or_default(),
            }
        }),
        // Set by ControlPlaneGet, which reads one.
        freshness: None,
        problem: cp.problem.as_ref().map(|p| pb::HostProblem {
            text: p.text.clone(),
            since_unix_ms: p.since_ms,
        }),
    }
}

/// A revoked certificate as the API shows it.
pub fn revoked_certificate(r: &crate::core::revocation::Revocation) -> pb::RevokedCertificate {
    pb::RevokedCertificate {
        issuer: r.issuer.clone(),
        serial: r.serial.clone(),
        subject: r.subject.clone(),
        reason: r.reason.clone(),
        revoked_unix_ms: r.at_ms,
        actor: r.actor.clone(),
    }
}

/// A backup report as the API shows it.
pub fn backup_status(r: &crate::core::backup_report::BackupReport) -> pb::BackupStatus {
    pb::BackupStatus {
        full: r.full.clone().unwrap_or_default(),
        deltas_since_full: r.deltas_since_full,
        revision: r.revision,
        newest_delta_unix_ms: r.newest_delta_unix_ms,
        up_to_date_unix_ms: r.up_to_date_unix_ms,
        delta_period_ms: r.delta_period_ms,
        gc: r.gc.as_ref().map(|gc| pb::GarbageCollection {
            policy: gc.policy.clone(),
            last_unix_ms: gc.last_unix_ms,
            kept_full: gc.kept_full,
            oldest_full: gc.oldest_full.clone().unwrap_or_default(),
            deleted: gc.deleted,
            held: gc.held.clone(),
        }),
        defrag: r.defrag.map(|d| pb::Defragmentation {
            last_unix_ms: d.last_unix_ms,
            took_ms: d.took_ms,
            db_before_bytes: d.db_before_bytes,
            db_after_bytes: d.db_after_bytes,
            longer_than_lease: d.longer_than_lease,
        }),
    }
}

/// A migration as the API shows it.
pub fn migration(m: &crate::core::migration::Migration) -> pb::Migration {
    pb::Migration {
        epoch: m.epoch,
        from: m.from.clone().unwrap_or_default(),
        to: m.to.clone(),
        source: m.source.clone(),
        destination: m.destination.clone(),
        step: m.step.to_string(),
        started_unix_ms: m.started_unix_ms,
        updated_unix_ms: m.updated_unix_ms,
        bytes_copied: m.bytes_copied,
        restored: m.restored.clone().unwrap_or_default(),
        data_loss_window_ms: m.data_loss_window_ms,
        note: m.note.clone(),
    }
}

/// A history event as the API shows it.
pub fn event(e: &Event) -> pb::Event {
    pb::Event {
        index: e.index,
        at_ms: e.at_ms,
        actor: e.actor.clone(),
        action: e.action.clone(),
        subject: e.subject.clone(),
        reason: e.reason.clone(),
        detail: e.detail.clone(),
    }
}

/// The gRPC status for a refused command: the code from the kind of refusal, the refusal's
/// kind in the [`REFUSAL_HEADER`](super::REFUSAL_HEADER) metadata (clients branch on it, never
/// on the message).
pub fn command_error(e: &CommandError) -> Status {
    let message = e.to_string();
    let mut status = match e {
        CommandError::Invalid { .. } => Status::invalid_argument(message),
        CommandError::DuplicateMemberId(_)
        | CommandError::RetiredMemberId(_)
        | CommandError::DuplicateMemberName { .. }
        | CommandError::DuplicateControlPlane(_)
        | CommandError::DuplicateDnsName { .. }
        | CommandError::AlreadyRevoked { .. } => Status::already_exists(message),
        CommandError::UnknownMember(_)
        | CommandError::UnknownControlPlane(_)
        | CommandError::NotRevoked { .. } => Status::not_found(message),
        CommandError::Limit(_) => Status::resource_exhausted(message),
        e => {
            debug_assert!(e.is_precondition());
            Status::failed_precondition(message)
        }
    };
    status.metadata_mut().insert(
        super::REFUSAL_HEADER,
        tonic::metadata::MetadataValue::from_static(e.kind()),
    );
    status
}

/// An empty string as `None`.
pub fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

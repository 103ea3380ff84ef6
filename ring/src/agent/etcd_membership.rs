//! How the host of a zone-tolerant control plane carries out one step of its etcd cluster's
//! change ([`PendingChange`]) with etcd's membership API. Every step first looks at the
//! member list, so doing it twice (a retry, a new host, a new leader) changes nothing:
//!
//! - `removing`: the lost member (by the etcd id the ring recorded, by name, or by peer URL
//!   when it never started) is removed if etcd still lists it;
//! - `adding`: the spare's peer URL is added as a learner unless etcd lists it already; its
//!   etcd member is started only after this step was committed;
//! - `catching-up`: the learner is promoted; etcd refuses until it caught up with the leader,
//!   and the step is tried again at the next tick;
//! - `forcing` (an operator's recovery): done once etcd lists the host's member alone, with its
//!   peer URL (a member restored from backup gets it with `MemberUpdate`).
//!
//! [`ids`] reads etcd's ids of the cluster's members, for the ring to record.

use std::collections::BTreeMap;

use super::workload::{ClusterDuty, PendingChange};
use crate::backup::etcd::{EtcdClient, EtcdError, EtcdMember};
use crate::core::etcd_cluster::EtcdChangeStep;

/// Does `change` through `client`, given etcd's member list as just read (`scheme`: the peer
/// URLs' `http` or `https`): `Ok(true)` once etcd's membership is as the step wants it,
/// `Ok(false)` when it must be tried again later (a learner not caught up yet).
pub(super) async fn carry_out(
    client: &EtcdClient,
    members: &[EtcdMember],
    change: &PendingChange,
    scheme: &str,
) -> Result<bool, EtcdError> {
    let removed_url = format!("{scheme}://{}", change.removed_peer);
    let added_url = format!("{scheme}://{}", change.added_peer);
    let find_url = |url: &str| -> Option<&EtcdMember> {
        members
            .iter()
            .find(|m| m.peer_urls.iter().any(|u| u == url))
    };
    match change.step {
        EtcdChangeStep::Removing => {
            let gone = members
                .iter()
                .find(|m| change.removed_etcd_id != 0 && m.id == change.removed_etcd_id)
                .or_else(|| members.iter().find(|m| m.name == change.removed))
                .or_else(|| find_url(&removed_url));
            if let Some(member) = gone {
                tracing::info!(
                    "removing etcd member {} ({:x}) of lost {} from the cluster",
                    member.name,
                    member.id,
                    change.removed
                );
                client.member_remove(member.id).await?;
            }
            Ok(true)
        }
        EtcdChangeStep::Adding => {
            if find_url(&added_url).is_none() {
                let id = client.member_add_learner(&added_url).await?;
                tracing::info!(
                    "added {} ({added_url}) to the etcd cluster as learner {id:x}",
                    change.added
                );
            }
            Ok(true)
        }
        EtcdChangeStep::Forcing => {
            // Done once etcd lists this member alone (it answered a linearizable read already:
            // the front end got this far), advertising its peer address: one restored from
            // backup was restored with a loopback one (the restore's replay runs it alone on
            // loopback), which is put right here first.
            let alone = members.len() == 1
                && (members[0].name == change.added || members[0].peer_urls.contains(&added_url));
            if !alone {
                return Ok(false);
            }
            if !members[0].peer_urls.contains(&added_url) {
                tracing::info!(
                    "etcd member {} ({:x}) advertises {:?}; setting its peer URL to {added_url}",
                    change.added,
                    members[0].id,
                    members[0].peer_urls
                );
                client
                    .member_update(members[0].id, std::slice::from_ref(&added_url))
                    .await?;
                // Checked again at the next attempt.
                return Ok(false);
            }
            tracing::info!("the etcd cluster runs again as {} alone", change.added);
            Ok(true)
        }
        EtcdChangeStep::CatchingUp => match find_url(&added_url) {
            None => {
                // Someone removed it behind the ring's back: never promote a stranger.
                tracing::warn!(
                    "the etcd cluster no longer lists {added_url} ({}); waiting",
                    change.added
                );
                Ok(false)
            }
            Some(member) if !member.learner => Ok(true),
            Some(member) => match client.member_promote(member.id).await {
                Ok(()) => {
                    tracing::info!(
                        "promoted etcd member {} ({:x}): it votes now",
                        change.added,
                        member.id
                    );
                    Ok(true)
                }
                Err(e) => {
                    tracing::debug!("learner {} not promoted yet: {e}", change.added);
                    Ok(false)
                }
            },
        },
    }
}

/// etcd's ids of the members of `duty`'s cluster in `members` (etcd's member list), by ring
/// member (found by peer URL: a learner that never started has no name yet).
pub(super) fn ids(
    members: &[EtcdMember],
    duty: &ClusterDuty,
    scheme: &str,
) -> BTreeMap<String, u64> {
    duty.peers
        .iter()
        .filter_map(|(ring_member, peer)| {
            let url = format!("{scheme}://{peer}");
            let listed = members.iter().find(|m| m.peer_urls.contains(&url))?;
            Some((ring_member.clone(), listed.id))
        })
        .collect()
}

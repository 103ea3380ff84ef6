//! Rolling upgrades: which binary each member runs, whether the ring is mixed, and when its
//! version may be raised (the rules are the core's, [`crate::core::ring_version`]).
//!
//! Members report their binary with every lease renewal; the leader records the reports of
//! its term ([`Reports::record`]) and sends what it knows back in every renewal's answer, so
//! every member can show it ([`Reports::learn`]). A member that reports nothing runs release
//! 0.1.0. Nothing here is replicated: at ring version 1 nothing new may enter the log, so the
//! reports travel in fields release 0.1.0 ignores.
//!
//! [`keep_ring_version`] keeps what a member sends and stores in step with the active version.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::core::NodeId;
use crate::core::ring_version::{self, MemberVersion, Supported};

/// What the ring knows of its members' binaries, on one member.
#[derive(Default)]
pub struct Reports {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Member -> its binary (`None`: it names none, release 0.1.0) and when it was heard
    /// (learnt, on a follower). Absent: not heard from.
    versions: BTreeMap<NodeId, (Option<MemberVersion>, Instant)>,
    /// Since when the members seen last were mixed (this member's clock).
    mixed_since: Option<Instant>,
}

/// The ring's members and their binaries, as one member sees them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// Member -> its binary (`None`: release 0.1.0); members not heard from are absent.
    pub versions: BTreeMap<NodeId, Option<MemberVersion>>,
    /// Whether the members run binaries of different newest ring versions.
    pub mixed: bool,
    /// For how long they have (0 when not mixed).
    pub mixed_for: Duration,
}

impl Reports {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The leader heard from member `id` running `version` (`None`: release 0.1.0).
    pub fn record(&self, id: NodeId, version: Option<MemberVersion>) {
        let mut inner = self.lock();
        inner.versions.insert(id, (version, Instant::now()));
        inner.update_mixed();
    }

    /// A follower learnt the leader's view (from a renewal's answer); replaces its own.
    pub fn learn(&self, versions: BTreeMap<NodeId, Option<MemberVersion>>) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.versions = versions.into_iter().map(|(id, v)| (id, (v, now))).collect();
        inner.update_mixed();
    }

    /// Forgets the reports (this member stopped leading: the next leader collects afresh).
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.versions.clear();
        inner.mixed_since = None;
    }

    /// Keeps only the members in `members` (removed ones stop counting).
    pub fn retain(&self, members: &BTreeSet<NodeId>) {
        let mut inner = self.lock();
        inner.versions.retain(|id, _| members.contains(id));
        inner.update_mixed();
    }

    /// The reports heard within `max_age`: what a decision to raise the version may count on
    /// (a member restarted on an older binary is not trusted on its previous process's word,
    /// and a member that went silent counts as not heard from).
    pub fn fresh(&self, max_age: Duration) -> BTreeMap<NodeId, Option<MemberVersion>> {
        self.lock()
            .versions
            .iter()
            .filter(|(_, (_, at))| at.elapsed() <= max_age)
            .map(|(id, (v, _))| (*id, v.clone()))
            .collect()
    }

    /// What is known now.
    pub fn view(&self) -> View {
        let inner = self.lock();
        View {
            versions: inner
                .versions
                .iter()
                .map(|(id, (v, _))| (*id, v.clone()))
                .collect(),
            mixed: inner.mixed_since.is_some(),
            mixed_for: inner.mixed_since.map_or(Duration::ZERO, |t| t.elapsed()),
        }
    }
}

impl Inner {
    fn update_mixed(&mut self) {
        let supported: Vec<Supported> = self.versions.values().map(|(v, _)| supported(v)).collect();
        match (ring_version::is_mixed(&supported), self.mixed_since) {
            (true, None) => self.mixed_since = Some(Instant::now()),
            (false, Some(_)) => self.mixed_since = None,
            _ => {}
        }
    }
}

/// How many leases old a report may be to count towards raising the version: a member renews
/// several times a lease, so two leases of silence mean it is down, restarting, or cut off.
pub const FRESH_LEASES: u64 = 2;

/// What a member's report says it supports (nothing reported: release 0.1.0's version).
pub fn supported(version: &Option<MemberVersion>) -> Supported {
    version.as_ref().map_or(Supported::UNREPORTED, |v| v.ring)
}

/// The version the active one may be raised to now, given the members of the configuration
/// (`members`) and what was heard from them: `Err` names the members that hold it back (not
/// heard from in this term, or running a binary without the next version).
pub fn next_version(
    active: u32,
    members: &BTreeMap<NodeId, String>,
    versions: &BTreeMap<NodeId, Option<MemberVersion>>,
) -> Result<u32, String> {
    let next = active.saturating_add(1);
    let mut behind = Vec::new();
    for (id, name) in members {
        match versions.get(id) {
            None => behind.push(format!("{name} (not heard from yet)")),
            Some(v) if !supported(v).runs(next) => behind.push(format!(
                "{name} (runs {})",
                v.as_ref().map_or("0.1.0".to_string(), describe)
            )),
            Some(_) => {}
        }
    }
    if !behind.is_empty() {
        return Err(format!(
            "ring version {next} needs every member on a binary that supports it; not yet: {}",
            behind.join(", ")
        ));
    }
    let supported: Vec<Supported> = members
        .keys()
        .filter_map(|id| versions.get(id))
        .map(supported)
        .collect();
    ring_version::next_version(active, &supported)
        .ok_or_else(|| format!("no member supports a ring version above {active}"))
}

/// A member's binary in words: `0.2.0 (abc123, ring versions 1-2)`.
pub fn describe(v: &MemberVersion) -> String {
    format!(
        "{} ({}, ring versions {}-{})",
        v.binary, v.commit, v.ring.min, v.ring.max
    )
}

/// Keeps the codec the peer messages carry equal to the applied state's ring version, and
/// records a raised version in the data directory, so that a binary of an older release
/// refuses to open it (see [`crate::raft::codec`]).
pub async fn keep_ring_version(
    state: crate::raft::StateMachineStore,
    pool: std::sync::Arc<crate::raft::network::PeerPool>,
    db: std::sync::Arc<redb::Database>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut applied = state.watch_applied();
    let mut recorded = 0;
    loop {
        let active = state.read(|a| a.state.settings.ring_version.active);
        pool.set_codec(active);
        if active != recorded {
            let db = db.clone();
            match tokio::task::spawn_blocking(move || {
                crate::raft::storage::record_codec(&db, active)
            })
            .await
            {
                Ok(Ok(())) => {
                    if recorded != 0 {
                        tracing::info!("the ring runs at version {active} now");
                    }
                    recorded = active;
                }
                Ok(Err(e)) => tracing::warn!("cannot record ring version {active}: {e}"),
                Err(e) => tracing::warn!("cannot record ring version {active}: {e}"),
            }
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

/// Before this member's ringd exits (SIGTERM, an upgrade): if it leads, hands the leadership
/// to the voter most up to date with it and waits (at most `wait_ms`) until another member
/// leads, so that writes wait for one transfer rather than an election timeout, and the
/// leaving member's last renewal (its announced restart) goes to the new leader. Nothing
/// happens when it does not lead, or leads alone.
pub async fn step_down(raft: &crate::raft::RaftNode, wait_ms: u64) {
    use openraft::type_config::async_runtime::watch::WatchReceiver;
    let m = raft.metrics().borrow_watched().clone();
    if m.state != openraft::ServerState::Leader {
        return;
    }
    let me = m.id;
    let to = m
        .membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != me)
        .max_by_key(|id| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(id).cloned().flatten())
                .map(|l| l.index)
        });
    let Some(to) = to else {
        return;
    };
    tracing::info!(to, "leaving: handing the leadership over first");
    if let Err(e) = raft.trigger().transfer_leader(to).await {
        tracing::warn!("cannot hand the leadership over: {e}");
        return;
    }
    let moved = raft
        .wait(Some(Duration::from_millis(wait_ms)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != me),
            "another member leads",
        )
        .await;
    match moved {
        Ok(m) => tracing::info!(leader = ?m.current_leader, "the leadership moved"),
        Err(e) => tracing::warn!("the leadership did not move in {wait_ms} ms: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new() -> Option<MemberVersion> {
        Some(crate::version::this_member())
    }

    fn names() -> BTreeMap<NodeId, String> {
        [(1, "a".to_string()), (2, "b".into()), (3, "c".into())].into()
    }

    #[test]
    fn raised_once_every_member_was_heard_from_on_a_new_binary() {
        let reports = Reports::default();
        reports.record(1, new());
        reports.record(2, None);
        let view = reports.view();
        assert!(view.mixed);
        let why = next_version(1, &names(), &view.versions).unwrap_err();
        assert!(why.contains("b (runs 0.1.0)"), "{why}");
        assert!(why.contains("c (not heard from yet)"), "{why}");
        reports.record(2, new());
        reports.record(3, new());
        let view = reports.view();
        assert!(!view.mixed);
        assert_eq!(view.mixed_for, Duration::ZERO);
        assert_eq!(next_version(1, &names(), &view.versions), Ok(2));
        assert!(next_version(2, &names(), &view.versions).is_err());
    }

    #[test]
    fn a_follower_shows_the_leaders_view_and_a_new_leader_starts_afresh() {
        let reports = Reports::default();
        reports.learn([(1, new()), (2, None)].into());
        assert!(reports.view().mixed);
        reports.reset();
        assert!(reports.view().versions.is_empty());
        assert!(!reports.view().mixed);
    }
}

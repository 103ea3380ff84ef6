//! A member's health as the leader judges it: a pure function of how long the member has been
//! silent and of the [`Timing`] (DESIGN.md rule 2). The leader's duties feed it real elapsed
//! times; the simulation feeds it simulated ones.

use crate::member::Health;
use crate::timing::Timing;

/// A member's health from the time since it last acknowledged the leader (`None`: never, in
/// this leader's term) and the time since the leader was elected. Only an acknowledgement makes
/// a member healthy; silence, counted from the election when there was no acknowledgement at all
/// (DESIGN.md rule 2), makes it suspect and then lost. `None` means "too early to say".
pub fn judge(last_ack_ms: Option<u64>, since_election_ms: u64, timing: &Timing) -> Option<Health> {
    let by_silence = |ms: u64| {
        if ms >= timing.member_lost_ms {
            Health::Lost
        } else if ms >= timing.member_suspect_ms {
            Health::Suspect
        } else {
            Health::Healthy
        }
    };
    match last_ack_ms {
        Some(ms) => Some(by_silence(ms)),
        None if since_election_ms >= timing.member_suspect_ms => {
            Some(by_silence(since_election_ms))
        }
        None => None,
    }
}

/// The health of a member that lost entries it had acknowledged (it diverged): never healthy,
/// however well it answers; **lost** once no lease granted to it can still be running, that is
/// when it has not been granted one for `member_lost_ms` (the leader grants a diverged member
/// nothing), counted from the election when this leader never granted it one, exactly as for
/// a silent member (DESIGN.md rule 2: a lost member's leases have run out, so what it hosted
/// may start elsewhere); **suspect** until then.
pub fn judge_diverged(
    last_grant_ms: Option<u64>,
    since_election_ms: u64,
    timing: &Timing,
) -> Health {
    match judge(last_grant_ms, since_election_ms, timing) {
        Some(Health::Lost) => Health::Lost,
        _ => Health::Suspect,
    }
}

/// How long, at least, no leader of a term below `term` can have granted a lease: the
/// shortest of `reports`' silences (member -> (its vote's term when it reported, ms since it last
/// accepted a message of a leader of a term below that)), if the members reporting at `term` or
/// later are a majority of `voters`; `None` otherwise.
///
/// Why this is safe (the argument in full is in ring's `raft::contact`): a lease is granted only
/// after a quorum accepted a message the granting leader sent after the renewal arrived, that
/// quorum meets any majority of `voters`, and a member at term `term` accepts nothing more from
/// an earlier term. A new leader may count a silent member's time to `member_lost_ms` from this
/// instead of from its own election (it must hold a single, not a joint, configuration: then
/// every quorum an earlier leader used meets a majority of `voters`).
pub fn earlier_leaders_silent_ms(
    term: u64,
    voters: &std::collections::BTreeSet<u64>,
    reports: &std::collections::BTreeMap<u64, (u64, u64)>,
) -> Option<u64> {
    let final_reports: Vec<u64> = reports
        .iter()
        .filter(|(id, (at_term, _))| voters.contains(id) && *at_term >= term)
        .map(|(_, (_, silent_ms))| *silent_ms)
        .collect();
    if final_reports.len() * 2 > voters.len() {
        final_reports.into_iter().min()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_leaders_count_only_with_a_majority_at_the_term() {
        use std::collections::{BTreeMap, BTreeSet};
        let voters: BTreeSet<u64> = [1, 2, 3].into();
        let one: BTreeMap<u64, (u64, u64)> = [(2, (5, 3_000))].into();
        assert_eq!(earlier_leaders_silent_ms(5, &voters, &one), None, "1 of 3");
        let two: BTreeMap<u64, (u64, u64)> = [(2, (5, 3_000)), (3, (6, 2_500))].into();
        assert_eq!(
            earlier_leaders_silent_ms(5, &voters, &two),
            Some(2_500),
            "the latest contact of the two counts"
        );
        // A member still at an earlier term may accept the earlier leader after it reported.
        let stale: BTreeMap<u64, (u64, u64)> = [(2, (5, 3_000)), (3, (4, 100))].into();
        assert_eq!(earlier_leaders_silent_ms(5, &voters, &stale), None);
        // Reports of members that are not voters do not make a majority.
        let learner: BTreeMap<u64, (u64, u64)> = [(2, (5, 3_000)), (9, (5, 3_000))].into();
        assert_eq!(earlier_leaders_silent_ms(5, &voters, &learner), None);
        let five: BTreeSet<u64> = [1, 2, 3, 4, 5].into();
        assert_eq!(earlier_leaders_silent_ms(5, &five, &two), None, "2 of 5");
    }

    #[test]
    fn health_thresholds() {
        let t = Timing::loopback();
        let (suspect, lost) = (t.member_suspect_ms, t.member_lost_ms);
        assert_eq!(judge(Some(0), 0, &t), Some(Health::Healthy));
        assert_eq!(
            judge(Some(suspect - 1), lost * 9, &t),
            Some(Health::Healthy)
        );
        assert_eq!(judge(Some(suspect), 0, &t), Some(Health::Suspect));
        assert_eq!(judge(Some(lost - 1), 0, &t), Some(Health::Suspect));
        assert_eq!(judge(Some(lost), 0, &t), Some(Health::Lost));
    }

    #[test]
    fn silence_since_election_never_makes_a_member_healthy() {
        let t = Timing::loopback();
        assert_eq!(judge(None, 0, &t), None, "too early to judge");
        assert_eq!(judge(None, t.member_suspect_ms - 1, &t), None);
        assert_eq!(judge(None, t.member_suspect_ms, &t), Some(Health::Suspect));
        assert_eq!(judge(None, t.member_lost_ms, &t), Some(Health::Lost));
    }

    #[test]
    fn a_diverged_member_is_never_healthy_and_lost_once_its_grants_ran_out() {
        let t = Timing::default();
        let lost = t.member_lost_ms;
        // Granted a moment ago: suspect, not lost (that lease may still run).
        assert_eq!(judge_diverged(Some(0), lost * 10, &t), Health::Suspect);
        assert_eq!(
            judge_diverged(Some(lost - 1), lost * 10, &t),
            Health::Suspect
        );
        assert_eq!(judge_diverged(Some(lost), 0, &t), Health::Lost);
        // Never granted by this leader: counted from its election.
        assert_eq!(judge_diverged(None, 0, &t), Health::Suspect);
        assert_eq!(judge_diverged(None, lost - 1, &t), Health::Suspect);
        assert_eq!(judge_diverged(None, lost, &t), Health::Lost);
    }
}

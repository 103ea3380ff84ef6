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

#[cfg(test)]
mod tests {
    use super::*;

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
}

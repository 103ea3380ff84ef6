//! Which of a member's lease renewals the leader may learn from.
//!
//! A renewal carries reports (what the member runs, what it released, which of its workloads
//! are healthy) that the leader acts on: a control plane the member no longer lists as running
//! counts as released, and may then start elsewhere. That is sound only if a report the
//! leader records is never older than one it recorded before: the member renews one round at
//! a time, and each round says what is true after everything the rounds before it did.
//!
//! But a round's request may reach the leader more than once, and late: the agent sends a copy
//! on another connection when the first is slow (a lost packet stalls a TCP connection for at
//! least its 200 ms retransmission timeout), and a request it gave up on may still be in
//! flight. So every request names its round, [`RenewRound`]: the agent's run (a new one per
//! process) and the round's number in it. The leader keeps the latest it recorded per member
//! and sorts each arriving request with [`sort`]: a later round is recorded, another copy of
//! the same round is answered (it renews the lease) but recorded only once, an earlier round is
//! refused. A new run supersedes the old one whatever its numbers: a restarted member renews
//! only after the longest lease and `fence_ms` ([`crate::timing::Timing::start_fence_wait_ms`]), and
//! reports nothing of what its previous run ran.

use serde::{Deserialize, Serialize};

/// One round of a member's renewals: every copy of it carries the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRound {
    /// The agent's run: chosen at random when the process starts.
    pub run: u64,
    /// The round's number in the run, from 1, one more each round.
    pub seq: u64,
}

/// What the leader does with an arriving renewal, given the round it last recorded for the
/// member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A round later than any recorded (or the first, or of a new run): answer and record.
    Record,
    /// Another copy of the round recorded last: answer, record nothing again.
    Copy,
    /// A round earlier than one recorded: a late copy the member gave up on; refuse it.
    Stale,
}

/// Sorts a renewal of round `incoming` against the round `recorded` last for its member
/// (`None`: nothing recorded since this leader's term began, or a member too old to say).
pub fn sort(recorded: Option<RenewRound>, incoming: Option<RenewRound>) -> Arrival {
    match (recorded, incoming) {
        // A member that predates rounds renews one request at a time, as before.
        (_, None) | (None, Some(_)) => Arrival::Record,
        (Some(r), Some(i)) if r.run != i.run => Arrival::Record,
        (Some(r), Some(i)) if i.seq > r.seq => Arrival::Record,
        (Some(r), Some(i)) if i.seq == r.seq => Arrival::Copy,
        (Some(_), Some(_)) => Arrival::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(run: u64, seq: u64) -> Option<RenewRound> {
        Some(RenewRound { run, seq })
    }

    #[test]
    fn later_rounds_are_recorded_copies_once_and_earlier_ones_refused() {
        assert_eq!(sort(None, round(7, 1)), Arrival::Record);
        assert_eq!(sort(round(7, 1), round(7, 2)), Arrival::Record);
        assert_eq!(sort(round(7, 2), round(7, 2)), Arrival::Copy);
        assert_eq!(sort(round(7, 2), round(7, 1)), Arrival::Stale);
    }

    #[test]
    fn a_new_run_supersedes_the_old_whatever_its_numbers() {
        assert_eq!(sort(round(7, 900), round(8, 1)), Arrival::Record);
    }

    #[test]
    fn members_that_predate_rounds_are_always_recorded() {
        assert_eq!(sort(round(7, 3), None), Arrival::Record);
        assert_eq!(sort(None, None), Arrival::Record);
    }
}

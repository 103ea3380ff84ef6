//! When a leader last reached this member, and of which term.
//!
//! Two uses:
//! - a member that has heard from no leader for a while asks its peers around (the duties);
//! - a **new leader counts a silent member's time to `member_lost_ms` from the last moment an
//!   earlier leader could have granted it a lease**, not from its own election. Every lease is
//!   granted after a ReadIndex round (`crate::leases`): a quorum accepted a message the granting
//!   leader sent after the renewal arrived, so the lease started before some member of that
//!   quorum accepted it. Once a member's vote is at term `T`, it accepts nothing more from a
//!   leader of a term below `T`; and any quorum of the members meets the quorum of every grant.
//!   So when a quorum of members at term `T` or later each say "I last accepted a message from a
//!   leader of a term below `T` at instant `L`", every lease an earlier leader granted started
//!   before the latest of those `L`, and rule 2 of DESIGN.md (`member_lost_ms > lease_ms +
//!   fence_ms + clock_margin_ms`) holds when counting from it. Each member sends its `L` with
//!   its renewals ([`EarlierLeaderContact`](super::types::EarlierLeaderContact)); the leader's
//!   desk keeps them (`crate::leases`), the pure rule is
//!   [`earlier_leaders_silent_ms`](crate::core::health::earlier_leaders_silent_ms).
//!
//! A leader killed with its zone then costs `member_lost_ms` from the kill, not the election on
//! top (3 to 4 s at production timings).
//!
//! Only messages Raft *accepted* are recorded per term (a message refused for a higher vote
//! proves nothing a leader could use), and a message still being handled counts as accepted now,
//! so that a report never claims a contact older than one Raft is accepting at that moment.
//! The gaps between a leader's messages ([`Gaps`], a metric) are counted on arrival instead,
//! by term: they measure the leader's heartbeats, not this member's disk.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Upper bounds (ms) of the buckets of the gaps between the arrivals of a leader's messages.
pub const GAP_BOUNDS_MS: [u64; 12] = [5, 10, 25, 50, 75, 100, 150, 250, 500, 1_000, 2_000, 5_000];

/// The gaps between the arrivals of two messages of one leader (term) in a row: how long this
/// member went without hearing from its leader (heartbeats are due every `heartbeat_ms`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Gaps at most [`GAP_BOUNDS_MS`]`[i]` (not cumulative; the last counts the longer ones).
    pub counts: [u64; GAP_BOUNDS_MS.len() + 1],
    /// Their sum, ms.
    pub sum_ms: u64,
    /// The longest, ms.
    pub max_ms: u64,
}

impl Gaps {
    fn observe(&mut self, ms: u64) {
        let bucket = GAP_BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(GAP_BOUNDS_MS.len());
        self.counts[bucket] += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.max_ms = self.max_ms.max(ms);
    }

    /// How many gaps were observed.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// How many terms' last accepted contact are kept: enough for the current term and the ones a
/// new leader asks about (terms only grow; the oldest is dropped first).
const MAX_TERMS_KEPT: usize = 8;

struct Inner {
    started: Instant,
    /// The last answer Raft gave a leader's message, accepted or not.
    last: Option<Instant>,
    /// Term -> when a message of that term's leader was last accepted.
    accepted: BTreeMap<u64, Instant>,
    /// The oldest term dropped from `accepted` (it is bounded), if any.
    oldest_dropped: Option<u64>,
    /// Term -> messages of that term's leader handed to Raft and not answered yet.
    in_flight: BTreeMap<u64, usize>,
    /// The term and arrival of the last message of the newest term seen, and the gaps between
    /// the arrivals of one term's messages (one leader per term): how long the leader was not
    /// heard. Counted on arrival, not on answer: Raft answers only once this member's log is
    /// fsynced, and a leader gives up on a heartbeat unanswered for its interval, so a slow
    /// disk here would otherwise hide heartbeats that arrived on time.
    last_arrival: Option<(u64, Instant)>,
    gaps: Gaps,
}

/// When a leader last reached this member. Cheap to clone: clones share the record.
#[derive(Clone)]
pub struct LeaderContact(Arc<Mutex<Inner>>);

impl Default for LeaderContact {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Inner {
            started: Instant::now(),
            last: None,
            accepted: BTreeMap::new(),
            oldest_dropped: None,
            in_flight: BTreeMap::new(),
            last_arrival: None,
            gaps: Gaps::default(),
        })))
    }
}

/// A leader's message handed to Raft and not answered yet; see [`LeaderContact::begin`].
#[must_use = "a message in flight counts as accepted now until it is answered or dropped"]
pub struct InFlight {
    contact: LeaderContact,
    term: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut inner = self.contact.lock();
        if let Some(n) = inner.in_flight.get_mut(&self.term) {
            *n -= 1;
            if *n == 0 {
                inner.in_flight.remove(&self.term);
            }
        }
    }
}

impl LeaderContact {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A message from the leader of `term` is handed to Raft: until [`Self::answered`] (or the
    /// guard is dropped), it counts as accepted at every moment it is asked about.
    /// Also counts the gap since the previous message of the same term arrived.
    pub fn begin(&self, term: u64) -> InFlight {
        let now = Instant::now();
        let mut inner = self.lock();
        *inner.in_flight.entry(term).or_default() += 1;
        match inner.last_arrival {
            Some((last, at)) if last == term => {
                let gap_ms = u64::try_from(now.saturating_duration_since(at).as_millis())
                    .unwrap_or(u64::MAX);
                inner.gaps.observe(gap_ms);
                inner.last_arrival = Some((term, now));
            }
            // A stale leader's message: not a gap of the current one.
            Some((last, _)) if last > term => {}
            // A new term (an election is not a gap), or the first message.
            _ => inner.last_arrival = Some((term, now)),
        }
        InFlight {
            contact: self.clone(),
            term,
        }
    }

    /// Raft answered the message of `flight`; `accepted` unless it refused it for a higher vote.
    pub fn answered(&self, flight: InFlight, accepted: bool) {
        let now = Instant::now();
        {
            let mut inner = self.lock();
            inner.last = Some(now);
            if accepted {
                inner.accepted.insert(flight.term, now);
                while inner.accepted.len() > MAX_TERMS_KEPT {
                    if let Some((term, _)) = inner.accepted.pop_first() {
                        inner.oldest_dropped =
                            Some(inner.oldest_dropped.map_or(term, |t| t.min(term)));
                    }
                }
            }
        }
        // Recorded before the guard goes: no moment at which the message counts for neither.
        drop(flight);
    }

    /// The gaps between the arrivals of one leader's (term's) messages, since start (a new
    /// term's first message starts afresh: an election is not a gap; a stale leader's message
    /// is not counted).
    pub fn gaps(&self) -> Gaps {
        self.lock().gaps.clone()
    }

    /// Time since a leader last reached this member; `None` if none did since start.
    pub fn since(&self) -> Option<Duration> {
        self.lock().last.map(|at| at.elapsed())
    }

    /// The latest moment this member accepted, or may be accepting, a message of a leader of a
    /// term below `term`: now while such a message is in flight; the start of this process if
    /// it accepted none since (what it accepted before a restart, it accepted before that).
    pub fn earlier_than(&self, term: u64) -> Instant {
        let now = Instant::now();
        let inner = self.lock();
        if inner.in_flight.range(..term).next().is_some() {
            return now;
        }
        match inner.accepted.range(..term).next_back() {
            Some((_, at)) => *at,
            // Older terms were dropped from the record: their last contact is unknown here.
            None if inner.oldest_dropped.is_some_and(|t| t < term) => now,
            None => inner.started,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_accepted_messages_of_earlier_terms_count() {
        let contact = LeaderContact::default();
        let started = contact.earlier_than(5);
        assert!(contact.since().is_none());

        let flight = contact.begin(3);
        contact.answered(flight, true);
        let at_3 = contact.earlier_than(4);
        assert!(at_3 >= started);
        // A refused message of term 4 is contact, but no leader of term 4 could use it.
        let flight = contact.begin(4);
        contact.answered(flight, false);
        assert!(contact.since().is_some());
        assert_eq!(contact.earlier_than(5), at_3);
        // Term 3 itself is not earlier than 3.
        assert_eq!(contact.earlier_than(3), started);
    }

    #[test]
    fn gaps_are_counted_within_a_term_only() {
        let contact = LeaderContact::default();
        for term in [1, 1, 1, 2, 2] {
            let flight = contact.begin(term);
            contact.answered(flight, true);
        }
        // A stale leader's message (refused) is no gap.
        let flight = contact.begin(1);
        contact.answered(flight, false);
        let gaps = contact.gaps();
        assert_eq!(gaps.count(), 3, "{gaps:?}");
        assert_eq!(
            gaps.counts[0], 3,
            "instant answers fall in the first bucket"
        );
        // Counted from arrivals: a slow answer (a follower's fsync) is not a gap in the
        // leader's messages, and a message whose answer never came (the leader gave up on
        // it) arrived all the same.
        let contact = LeaderContact::default();
        contact.answered(contact.begin(1), true);
        let slow = contact.begin(1);
        std::thread::sleep(Duration::from_millis(30));
        contact.answered(slow, true);
        let gaps = contact.gaps();
        assert_eq!((gaps.count(), gaps.counts[0]), (1, 1), "{gaps:?}");
        drop(contact.begin(1));
        let gaps = contact.gaps();
        assert_eq!(gaps.count(), 2, "{gaps:?}");
        assert!(gaps.max_ms >= 30, "{gaps:?}");
        let mut g = Gaps::default();
        g.observe(60);
        g.observe(6_000);
        assert_eq!(
            (g.counts[4], g.counts[GAP_BOUNDS_MS.len()], g.max_ms),
            (1, 1, 6_000)
        );
    }

    #[test]
    fn a_message_in_flight_counts_as_accepted_now() {
        let contact = LeaderContact::default();
        let flight = contact.begin(2);
        let before = Instant::now();
        assert!(contact.earlier_than(3) >= before);
        assert_eq!(contact.earlier_than(2), contact.earlier_than(1));
        drop(flight);
        assert!(
            contact.earlier_than(3) < before,
            "dropped unanswered: nothing was accepted"
        );
    }

    #[test]
    fn a_forgotten_term_is_never_reported_as_no_contact() {
        let contact = LeaderContact::default();
        for term in 1..=(MAX_TERMS_KEPT as u64 + 2) {
            let flight = contact.begin(term);
            contact.answered(flight, true);
        }
        // Terms 1 and 2 were dropped: asking about "below 3" cannot answer "since start".
        let before = Instant::now();
        assert!(contact.earlier_than(3) >= before);
        assert!(contact.earlier_than(2) >= before);
        let started = contact.lock().started;
        assert_eq!(
            contact.earlier_than(1),
            started,
            "nothing below term 1 ever came"
        );
    }
}

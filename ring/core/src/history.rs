//! The ring's history: a bounded, ordered record of every change and who made it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::limits::HISTORY_LIMIT;

/// One thing that happened to the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Raft log index of the command that caused it; orders events ring-wide.
    pub index: u64,
    /// Unix time in milliseconds, as stamped by the proposer.
    pub at_ms: u64,
    /// Who asked.
    pub actor: String,
    /// What happened, e.g. `member.add`.
    pub action: String,
    /// The member or control plane it was about.
    pub subject: String,
    /// Why, in the actor's words.
    pub reason: String,
    /// Human-readable details.
    pub detail: String,
}

/// The newest [`HISTORY_LIMIT`] events, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    events: VecDeque<Event>,
}

impl History {
    /// Appends an event, dropping the oldest when the history is full.
    pub fn push(&mut self, event: Event) {
        if let Some(last) = self.events.back() {
            assert!(
                event.index >= last.index,
                "history must be appended in log order ({} after {})",
                event.index,
                last.index
            );
        }
        if self.events.len() == HISTORY_LIMIT {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    /// All kept events, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Event> + ExactSizeIterator {
        self.events.iter()
    }

    /// The newest `limit` events (all when `limit` is 0), oldest first.
    pub fn newest(&self, limit: usize) -> Vec<Event> {
        let skip = if limit == 0 {
            0
        } else {
            self.events.len().saturating_sub(limit)
        };
        self.events.iter().skip(skip).cloned().collect()
    }

    /// Number of kept events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(index: u64) -> Event {
        Event {
            index,
            at_ms: index,
            actor: "t".into(),
            action: "a".into(),
            subject: "s".into(),
            reason: String::new(),
            detail: String::new(),
        }
    }

    #[test]
    fn bounded_and_ordered() {
        let mut h = History::default();
        for i in 0..(HISTORY_LIMIT as u64 + 10) {
            h.push(event(i));
        }
        assert_eq!(h.len(), HISTORY_LIMIT);
        assert_eq!(h.iter().next().unwrap().index, 10);
        let newest = h.newest(3);
        assert_eq!(
            newest.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![
                HISTORY_LIMIT as u64 + 7,
                HISTORY_LIMIT as u64 + 8,
                HISTORY_LIMIT as u64 + 9
            ]
        );
        assert_eq!(h.newest(0).len(), HISTORY_LIMIT);
    }
}

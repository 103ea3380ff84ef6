//! Which delta snapshots a restore replays after a full snapshot: etcd-backup-restore's rule
//! (the newest full snapshot, then every delta after it in revision order), with the gaps
//! made explicit. Pure.
//!
//! A delta `Incr-<start>-<last>` follows the revision reached so far (`reached`) when
//! `start <= reached + 1`: it may overlap what is already there (a full snapshot can hold a few
//! writes past the revision in its name; replay skips events at or below the store's revision),
//! but it must not leave a revision out. Deltas that end at or below `reached` add nothing and
//! are passed over. The first delta that starts past `reached + 1` is a **gap**: the revisions
//! between are in no snapshot, so nothing after it is replayed (a later delta applied over a
//! hole would give a store that never existed); [`DeltaChain::gap`] says which revisions are
//! missing and which delta would have come next.

use super::backup_name::SnapshotName;

/// What to replay after the full snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaChain {
    /// Indexes into the deltas given to [`delta_chain`], in replay order.
    pub replay: Vec<usize>,
    /// The revision the chain reaches by its names (the full snapshot's when it is empty).
    pub reaches: u64,
    /// The first gap, if the deltas after the full snapshot do not join up.
    pub gap: Option<Gap>,
}

/// Revisions that are in no snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The first missing revision.
    pub from: u64,
    /// The last missing revision.
    pub to: u64,
    /// The delta that would have come next (index into the deltas given).
    pub next: usize,
}

/// The deltas to replay after a full snapshot that reaches `full_revision` (its name's last
/// revision): see the [module docs](self). `deltas` may come in any order and may hold deltas
/// from before the full snapshot; the same delta listed twice (a `.final` and a plain copy) is
/// replayed once.
pub fn delta_chain(full_revision: u64, deltas: &[SnapshotName]) -> DeltaChain {
    let mut order: Vec<usize> = (0..deltas.len()).collect();
    // By start, then the longest first (it covers the others), then newest, final first.
    order.sort_by_key(|&i| {
        let d = &deltas[i];
        (
            d.start_revision(),
            std::cmp::Reverse(d.last_revision()),
            std::cmp::Reverse(d.created_unix_s()),
            !d.is_final(),
        )
    });
    let mut reached = full_revision;
    let mut replay = Vec::new();
    let mut gap = None;
    for i in order {
        let d = &deltas[i];
        if d.last_revision() <= reached {
            continue;
        }
        if d.start_revision() > reached + 1 {
            gap = Some(Gap {
                from: reached + 1,
                to: d.start_revision() - 1,
                next: i,
            });
            break;
        }
        replay.push(i);
        reached = d.last_revision();
    }
    debug_assert!(replay.windows(2).all(|w| {
        deltas[w[0]].last_revision() < deltas[w[1]].last_revision()
            && deltas[w[1]].start_revision() <= deltas[w[0]].last_revision() + 1
    }));
    DeltaChain {
        replay,
        reaches: reached,
        gap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup_name::SnapshotKind;

    fn incr(start: u64, last: u64, t: u64) -> SnapshotName {
        SnapshotName::new(SnapshotKind::Incr, start, last, t).unwrap()
    }

    #[test]
    fn deltas_after_the_full_snapshot_in_revision_order() {
        let deltas = [
            incr(11, 20, 3),
            incr(1, 5, 1),
            incr(21, 21, 4),
            incr(6, 10, 2),
        ];
        let chain = delta_chain(10, &deltas);
        assert_eq!(chain.replay, vec![0, 2]);
        assert_eq!(chain.reaches, 21);
        assert_eq!(chain.gap, None);
        // Nothing after the full snapshot.
        let none = delta_chain(21, &deltas);
        assert!(none.replay.is_empty());
        assert_eq!(none.reaches, 21);
    }

    #[test]
    fn overlap_is_replayed_a_gap_stops_the_chain() {
        // The full snapshot's name says 10; a delta from 9 overlaps (replay skips what is there).
        let chain = delta_chain(10, &[incr(9, 15, 1), incr(16, 30, 2)]);
        assert_eq!(chain.replay, vec![0, 1]);
        // 16..=19 missing: 20.. is not replayed, nor anything after it.
        let gapped = delta_chain(10, &[incr(11, 15, 1), incr(20, 30, 2), incr(31, 40, 3)]);
        assert_eq!(gapped.replay, vec![0]);
        assert_eq!(gapped.reaches, 15);
        assert_eq!(
            gapped.gap,
            Some(Gap {
                from: 16,
                to: 19,
                next: 1
            })
        );
        // A gap right after the full snapshot.
        let first = delta_chain(10, &[incr(12, 15, 1)]);
        assert!(first.replay.is_empty());
        assert_eq!(first.gap.map(|g| (g.from, g.to)), Some((11, 11)));
    }

    #[test]
    fn the_same_delta_twice_is_replayed_once() {
        let plain = incr(11, 20, 3);
        let fin = plain.with_final(true);
        let chain = delta_chain(10, &[plain, fin, incr(21, 25, 4)]);
        assert_eq!(chain.replay.len(), 2);
        assert_eq!(chain.replay[0], 1, "the final one first");
        assert_eq!(chain.reaches, 25);
    }
}

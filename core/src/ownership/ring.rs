//! The ring: which Active silo a part of the 32-bit hash space, and so a
//! shard ([`shard_owner`](super::shard_owner)), is assigned to.
//!
//! Every Active silo takes `points_per_silo` points on the ring, each at
//! `xxh32("{silo}/{i}", seed 0)` for `i` in `0..points_per_silo` (`silo` printed as
//! `ip:port@generation`), so every silo computes the same ring from the same
//! membership view. A silo owns the ranges `(previous point, its point]` (Orleans'
//! consistent ring provider with virtual buckets). Two silos drawing the same point
//! is resolved in favour of the lower [`SiloAddress`].
//!
//! Pure: no I/O, no clock.

use std::collections::BTreeMap;

use crate::{hash_in_range, MembershipSnapshot, SiloAddress, SiloStatus};

/// A ring range `(begin, end]` of 32-bit hashes, wrapping when `begin >= end`
/// (`(x, x)` is the whole ring), as [`hash_in_range`] defines it and
/// `ReminderTable::read_rows_in_range` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct RingRange {
    /// Exclusive start.
    pub begin: u32,
    /// Inclusive end.
    pub end: u32,
}

impl RingRange {
    /// Whether `hash` lies in the range.
    pub fn contains(&self, hash: u32) -> bool {
        hash_in_range(hash, self.begin, self.end)
    }

    /// How many hashes it holds (`2^32` for the whole ring).
    pub fn size(&self) -> u64 {
        if self.begin == self.end {
            1 << 32
        } else {
            u64::from(self.end.wrapping_sub(self.begin))
        }
    }

    /// Cuts the first `width` hashes (at least 1) off the range: the piece
    /// `(begin, begin + width]` and what is left, or the whole range and `None` if it
    /// holds at most `width` hashes. How a load reads a large range in pages.
    pub fn cut(&self, width: u32) -> (RingRange, Option<RingRange>) {
        let width = width.max(1);
        if self.size() <= u64::from(width) {
            return (*self, None);
        }
        let mid = self.begin.wrapping_add(width);
        (
            RingRange {
                begin: self.begin,
                end: mid,
            },
            Some(RingRange {
                begin: mid,
                end: self.end,
            }),
        )
    }
}

/// The positions of a silo's points `0..n` (the `i`-th at `xxh32("{silo}/{i}")`).
pub fn points_of(silo: &SiloAddress, n: u32) -> impl Iterator<Item = u32> {
    use std::fmt::Write as _;
    let mut key = format!("{silo}/");
    let prefix = key.len();
    (0..n).map(move |i| {
        key.truncate(prefix);
        let _ = write!(key, "{i}");
        xxhash_rust::xxh32::xxh32(key.as_bytes(), 0)
    })
}

/// A consistent-hash ring over a set of silos.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    /// Point -> owner, in ring order.
    points: BTreeMap<u32, SiloAddress>,
    /// The silos on the ring, in address order, without repeats.
    silos: Vec<SiloAddress>,
}

impl Ring {
    /// The ring of `silos`, each at `points_per_silo` points.
    pub fn new(silos: impl IntoIterator<Item = SiloAddress>, points_per_silo: u32) -> Ring {
        let mut silos: Vec<SiloAddress> = silos.into_iter().collect();
        silos.sort_unstable();
        silos.dedup();
        let mut points = BTreeMap::new();
        for silo in &silos {
            for point in points_of(silo, points_per_silo) {
                points.entry(point).or_insert(*silo); // in address order: the lower wins
            }
        }
        Ring { points, silos }
    }

    /// The ring of the Active silos of a membership view, less those whose row
    /// says their clock is beyond the cluster's bound
    /// ([`MembershipEntry::clock_beyond_bound`](crate::MembershipEntry::clock_beyond_bound)):
    /// the ring every reminder service of the cluster computes from the same
    /// table version. A silo whose clock is off cannot hold a lease safely, so its
    /// shards go to the others while it stays a member. When every Active silo
    /// says so, the ring is all of them (none of them takes a shard until its
    /// clock is back, and nothing moves meanwhile).
    pub fn of_active(snapshot: &MembershipSnapshot, points_per_silo: u32) -> Ring {
        Ring::default().follow(snapshot, points_per_silo)
    }

    /// [`Ring::of_active`], reusing `self` when it already is that ring: rebuilding
    /// costs `points_per_silo` hashes per silo, and views change far more often
    /// than the Active set.
    pub fn follow(self, snapshot: &MembershipSnapshot, points_per_silo: u32) -> Ring {
        let mut active: Vec<SiloAddress> = snapshot
            .rows()
            .filter(|e| e.status == SiloStatus::Active && !e.clock_beyond_bound)
            .map(|e| e.silo)
            .collect();
        if active.is_empty() {
            active = snapshot
                .rows()
                .filter(|e| e.status == SiloStatus::Active)
                .map(|e| e.silo)
                .collect();
        }
        if active == self.silos {
            return self;
        }
        Ring::new(active, points_per_silo)
    }

    /// Whether no silo is on the ring.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The silos on the ring, in address order, without repeats.
    pub fn silos(&self) -> &[SiloAddress] {
        &self.silos
    }

    /// The owner of `hash`: the silo of the first point at or after it, wrapping.
    /// `None` on an empty ring.
    pub fn owner_of(&self, hash: u32) -> Option<SiloAddress> {
        self.points
            .range(hash..)
            .next()
            .or_else(|| self.points.iter().next())
            .map(|(_, s)| *s)
    }

    /// Whether `silo` owns `hash`.
    pub fn owns(&self, silo: &SiloAddress, hash: u32) -> bool {
        self.owner_of(hash) == Some(*silo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn silo(n: u8, generation: u64) -> SiloAddress {
        SiloAddress::new(([10, 0, 0, n], 11111).into(), generation)
    }

    #[test]
    fn points_are_pinned() {
        // The placement is part of the on-the-wire contract between silos of
        // different releases: it must never change.
        let s = silo(1, 7);
        assert_eq!(s.to_string(), "10.0.0.1:11111@7");
        let points: Vec<u32> = points_of(&s, 12).collect();
        assert_eq!(points[0], xxhash_rust::xxh32::xxh32(b"10.0.0.1:11111@7/0", 0));
        assert_eq!(points[11], xxhash_rust::xxh32::xxh32(b"10.0.0.1:11111@7/11", 0));
    }

    #[test]
    fn empty_and_single_silo() {
        let empty = Ring::new([], 30);
        assert!(empty.is_empty());
        assert_eq!(empty.owner_of(5), None);
        let one = Ring::new([silo(1, 1)], 30);
        let whole = RingRange { begin: 7, end: 7 };
        assert_eq!(whole.size(), 1 << 32);
        let (quarter, rest) = whole.cut(1 << 30);
        assert_eq!((quarter.begin, quarter.size()), (7, 1 << 30));
        assert_eq!(rest.map(|r| (r.end, r.size())), Some((7, 3 << 30)));
        assert_eq!(quarter.cut(1 << 30), (quarter, None));
        for h in [0, 1, u32::MAX, 12345] {
            assert_eq!(one.owner_of(h), Some(silo(1, 1)));
        }
    }

    #[test]
    fn a_silo_whose_clock_is_beyond_the_bound_is_left_out() {
        let (a, b) = (silo(1, 1), silo(2, 1));
        let view = |flags: [bool; 2]| {
            let mut v = MembershipSnapshot::default();
            for (s, beyond) in [a, b].into_iter().zip(flags) {
                let mut e = crate::MembershipEntry::new(s, SiloStatus::Active, crate::Timestamp::EPOCH);
                e.clock_beyond_bound = beyond;
                v.insert(e, crate::Etag::new("1"));
            }
            v
        };
        assert_eq!(Ring::of_active(&view([false, false]), 8).silos(), [a, b]);
        assert_eq!(Ring::of_active(&view([false, true]), 8).silos(), [a]);
        // Every one beyond: the ring stays as it was rather than empty.
        assert_eq!(Ring::of_active(&view([true, true]), 8).silos(), [a, b]);
    }

    fn silos_strategy() -> impl Strategy<Value = Vec<SiloAddress>> {
        prop::collection::btree_set((1u8..60, 1u64..4), 1..12)
            .prop_map(|s| s.into_iter().map(|(n, g)| silo(n, g)).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Cutting pieces of any widths off a range until nothing is left covers
        /// it exactly, in order, each piece within its width.
        #[test]
        fn cut_pieces_cover_the_range(begin in any::<u32>(), end in any::<u32>(), widths in prop::collection::vec(1u32..u32::MAX, 1..40), probes in prop::collection::vec(any::<u32>(), 64)) {
            let range = RingRange { begin, end };
            let mut pieces = Vec::new();
            let mut rest = Some(range);
            let mut i = 0;
            while let Some(r) = rest {
                // Past the given widths, halve the ring at a time.
                let w = widths.get(i).copied().unwrap_or(1 << 31);
                let (piece, left) = r.cut(w);
                prop_assert!(piece.size() <= u64::from(w) || left.is_none());
                pieces.push(piece);
                rest = left;
                i += 1;
            }
            prop_assert_eq!(pieces.iter().map(RingRange::size).sum::<u64>(), range.size());
            prop_assert_eq!(pieces[0].begin, begin);
            prop_assert!(pieces.windows(2).all(|w| w[0].end == w[1].begin));
            for h in probes.into_iter().chain([begin, end, begin.wrapping_add(1)]) {
                let hits = pieces.iter().filter(|p| p.contains(h)).count();
                prop_assert_eq!(hits, usize::from(range.contains(h)), "hash {}", h);
            }
        }

        /// Adding a silo moves only hashes to the new silo (nothing moves between
        /// old silos), and a hash it gets has one of its points at or after it
        /// before any other silo's; removing it gives back exactly the same ring.
        #[test]
        fn adding_a_silo_moves_only_its_ranges(silos in silos_strategy(), points in 1u32..40, probes in prop::collection::vec(any::<u32>(), 256)) {
            let new = silo(200, 1);
            let before = Ring::new(silos.clone(), points);
            let after = Ring::new(silos.iter().copied().chain([new]), points);
            for h in probes {
                let (was, is) = (before.owner_of(h), after.owner_of(h));
                if was != is {
                    prop_assert_eq!(is, Some(new), "hash {} moved between old silos", h);
                }
                prop_assert!(silos.iter().all(|s| after.owns(s, h) == (is == Some(*s))));
            }
            let removed = Ring::new(silos.clone(), points);
            prop_assert_eq!(removed, before);
        }
    }
}

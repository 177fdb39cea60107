//! Probe target selection.
//!
//! Each Active silo probes `num_probed_silos` others chosen by that many independent
//! consistent-hash rings over silo identities: ring `i` hashes every identity with
//! seed `i`, and contributes the first successor of the prober on that ring that is
//! not chosen yet. Ring 0 alone makes every silo the target of exactly one prober
//! (its predecessor), so every silo is always monitored; the further rings add
//! monitors that are spread like the edges of a random expander graph, so that no
//! small group of silos monitors only itself. (Orleans 7+ uses the same
//! multi-ring scheme.) Beyond those, every silo that already has fresh votes or a stale
//! IAmAlive is probed by everyone, so suspicions are confirmed or cleared quickly.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::{ClusterMembershipOptions, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp};

use super::votes::fresh_votes;
use super::{is_i_am_alive_stale, is_stuck_joining};

/// Position of `silo` on ring `ring`: xxHash32 of its text form, seeded by the ring
/// number.
pub fn ring_position(silo: &SiloAddress, ring: u32) -> u32 {
    /// The text form on the stack: `[v6 address]:port@generation` fits in 72 bytes.
    struct Text {
        bytes: [u8; 80],
        len: usize,
    }
    impl std::fmt::Write for Text {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.len + s.len();
            self.bytes
                .get_mut(self.len..end)
                .ok_or(std::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }
    let mut text = Text {
        bytes: [0; 80],
        len: 0,
    };
    if write!(text, "{silo}").is_ok() {
        xxhash_rust::xxh32::xxh32(&text.bytes[..text.len], ring)
    } else {
        xxhash_rust::xxh32::xxh32(silo.to_string().as_bytes(), ring)
    }
}

/// Whether a silo in `status` is monitored: Joining and Active silos (a Joining silo
/// may hang in its join and must be evictable).
pub fn is_monitored(status: SiloStatus) -> bool {
    matches!(status, SiloStatus::Joining | SiloStatus::Active)
}

/// The silos `me` should probe, in a stable order (ring picks first, then suspects).
/// Never contains `me`; contains no silo twice. A one-off [`TargetSelector`]; a silo
/// keeps one selector so that the ring picks are recomputed only when the
/// monitored set changes.
pub fn select_probe_targets(
    me: &SiloAddress,
    snapshot: &MembershipSnapshot,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> Vec<SiloAddress> {
    TargetSelector::default().select(me, snapshot, now, options)
}

/// [`select_probe_targets`] with memory: each silo's ring positions are hashed once,
/// and the ring picks are kept until the monitored set (or `me`, or the number of
/// targets) changes. A silo selects its targets every probe period; in a
/// 10,000-silo cluster the rings alone are 100,000 hashes, so recomputing them
/// every time is what would cost, not the selection. Memory: one small vector of
/// positions per monitored silo.
#[derive(Clone, Debug, Default)]
pub struct TargetSelector {
    /// The key the picks were computed for: me, wanted, the monitored silos (sorted).
    me: Option<SiloAddress>,
    wanted: usize,
    candidates: Vec<SiloAddress>,
    /// Ring positions of `candidates[i]` (index = ring), extended on demand.
    positions: Vec<Vec<u32>>,
    /// Ring positions of `me`.
    my_positions: Vec<u32>,
    picks: Vec<SiloAddress>,
}

/// Position on `ring` from a silo's cached positions, hashing what is missing.
fn cached(positions: &mut Vec<u32>, silo: &SiloAddress, ring: u32) -> u32 {
    while positions.len() <= ring as usize {
        positions.push(ring_position(silo, positions.len() as u32));
    }
    positions[ring as usize]
}

impl TargetSelector {
    /// Takes the new (sorted) candidates, keeping the positions of those already
    /// known (one merge of two sorted lists) and dropping the departed ones.
    fn adopt(&mut self, me: &SiloAddress, candidates: Vec<SiloAddress>) {
        if self.me != Some(*me) {
            self.my_positions.clear();
        }
        let mut old = std::mem::take(&mut self.candidates)
            .into_iter()
            .zip(std::mem::take(&mut self.positions))
            .peekable();
        let mut positions = Vec::with_capacity(candidates.len());
        for s in &candidates {
            while old.next_if(|(o, _)| o < s).is_some() {}
            positions.push(old.next_if(|(o, _)| o == s).map(|(_, p)| p).unwrap_or_default());
        }
        self.candidates = candidates;
        self.positions = positions;
    }

    /// Ring `r` contributes the first successor of `me` on it that is not picked yet
    /// (wrapping around), until `wanted` silos are picked.
    fn ring_picks(&mut self, me: &SiloAddress, wanted: usize) -> Vec<SiloAddress> {
        let mut chosen: Vec<usize> = Vec::with_capacity(wanted);
        let mut ring = 0u32;
        while chosen.len() < wanted {
            let mine = (cached(&mut self.my_positions, me, ring), *me);
            // The best (position, index) after mine, and the best overall (the wrap).
            let mut after: Option<(u32, usize)> = None;
            let mut first: Option<(u32, usize)> = None;
            for (i, s) in self.candidates.iter().enumerate() {
                if chosen.contains(&i) {
                    continue;
                }
                let p = cached(&mut self.positions[i], s, ring);
                // Ties on a position are broken by the silo's order, which is `i`'s.
                if (p, *s) > mine && after.is_none_or(|a| (p, i) < a) {
                    after = Some((p, i));
                }
                if first.is_none_or(|f| (p, i) < f) {
                    first = Some((p, i));
                }
            }
            match after.or(first) {
                Some((_, i)) => chosen.push(i),
                None => break,
            }
            ring += 1;
        }
        chosen.into_iter().map(|i| self.candidates[i]).collect()
    }

    /// The silos `me` should probe now: see [`select_probe_targets`].
    pub fn select(
        &mut self,
        me: &SiloAddress,
        snapshot: &MembershipSnapshot,
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> Vec<SiloAddress> {
        // `rows()` iterates in silo order, so `candidates` is sorted.
        let candidates: Vec<SiloAddress> = snapshot
            .rows()
            .filter(|e| e.silo != *me && is_monitored(e.status))
            .map(|e| e.silo)
            .collect();
        let wanted = (options.num_probed_silos as usize).min(candidates.len());
        if self.me != Some(*me) || self.wanted != wanted || self.candidates != candidates {
            self.adopt(me, candidates);
            self.picks = self.ring_picks(me, wanted);
            self.me = Some(*me);
            self.wanted = wanted;
        }
        let mut chosen = self.picks.clone();
        let mut taken: BTreeSet<SiloAddress> = chosen.iter().copied().collect();
        for e in snapshot.rows() {
            if e.silo == *me || !is_monitored(e.status) || taken.contains(&e.silo) {
                continue;
            }
            let suspected = !fresh_votes(e, now, options).is_empty();
            if suspected || is_i_am_alive_stale(e, now, options) || is_stuck_joining(e, now, options) {
                taken.insert(e.silo);
                chosen.push(e.silo);
            }
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Etag, MembershipEntry, SuspectVote};
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn silo(n: u32) -> SiloAddress {
        format!("10.0.{}.{}:11111@1", n / 200, n % 200 + 1)
            .parse()
            .unwrap()
    }

    fn snapshot(n: u32, now: Timestamp) -> MembershipSnapshot {
        let mut s = MembershipSnapshot::default();
        for i in 0..n {
            let e = MembershipEntry::new(silo(i), SiloStatus::Active, now);
            s.entries.insert(e.silo, (e, Etag::new("e")));
        }
        s
    }

    fn opts(k: u32) -> ClusterMembershipOptions {
        ClusterMembershipOptions {
            num_probed_silos: k,
            ..Default::default()
        }
    }

    /// The first implementation: every ring sorted, then the first successor not
    /// taken. The selector must pick exactly what it picked.
    fn sorted_ring_picks(me: &SiloAddress, snapshot: &MembershipSnapshot, k: usize) -> Vec<SiloAddress> {
        let candidates: Vec<SiloAddress> = snapshot
            .rows()
            .filter(|e| e.silo != *me && is_monitored(e.status))
            .map(|e| e.silo)
            .collect();
        let wanted = k.min(candidates.len());
        let (mut chosen, mut ring) = (Vec::new(), 0u32);
        while chosen.len() < wanted {
            let my_pos = ring_position(me, ring);
            let mut ordered: Vec<(u32, SiloAddress)> =
                candidates.iter().map(|s| (ring_position(s, ring), *s)).collect();
            ordered.sort_unstable();
            let start = ordered.partition_point(|(p, s)| (*p, *s) <= (my_pos, *me));
            if let Some(s) = (0..ordered.len())
                .map(|i| ordered[(start + i) % ordered.len()].1)
                .find(|s| !chosen.contains(s))
            {
                chosen.push(s);
            }
            ring += 1;
        }
        chosen
    }

    #[test]
    fn selector_picks_what_sorted_rings_pick_and_follows_changes() {
        let now = Timestamp::from_millis(1_000_000);
        let mut selector = TargetSelector::default();
        let mut snap = snapshot(60, now);
        for k in [1usize, 3, 10] {
            for i in 0..60 {
                let me = silo(i);
                let got = selector.select(&me, &snap, now, &opts(k as u32));
                assert_eq!(got, sorted_ring_picks(&me, &snap, k), "me={me} k={k}");
            }
        }
        // The cache follows the monitored set: a silo leaves, another joins.
        let me = silo(0);
        let before = selector.select(&me, &snap, now, &opts(10));
        snap.entries.get_mut(&before[0]).unwrap().0.status = SiloStatus::Dead;
        let e = MembershipEntry::new(silo(500), SiloStatus::Joining, now);
        snap.entries.insert(e.silo, (e, Etag::new("e")));
        let after = selector.select(&me, &snap, now, &opts(10));
        assert!(!after.contains(&before[0]));
        assert_eq!(after, sorted_ring_picks(&me, &snap, 10));
        assert_eq!(
            selector.positions.len(),
            selector.candidates.len(),
            "departed silos dropped"
        );
        assert!(!selector.candidates.contains(&before[0]));
    }

    #[test]
    fn ring_position_hashes_the_text_form() {
        for s in [
            "10.0.0.1:11111@1",
            "[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535@18446744073709551615",
        ] {
            let silo: SiloAddress = s.parse().unwrap();
            assert_eq!(
                ring_position(&silo, 3),
                xxhash_rust::xxh32::xxh32(silo.to_string().as_bytes(), 3)
            );
        }
    }

    #[test]
    fn picks_k_distinct_targets_never_self() {
        let now = Timestamp::from_millis(1_000_000);
        for n in [1u32, 2, 3, 5, 11, 40] {
            let snap = snapshot(n, now);
            for k in [1u32, 3, 10] {
                for i in 0..n {
                    let me = silo(i);
                    let t = select_probe_targets(&me, &snap, now, &opts(k));
                    assert!(!t.contains(&me));
                    let set: BTreeSet<_> = t.iter().collect();
                    assert_eq!(set.len(), t.len(), "duplicates");
                    assert_eq!(t.len(), (k as usize).min(n as usize - 1));
                }
            }
        }
    }

    #[test]
    fn every_silo_is_monitored_and_load_is_balanced() {
        let now = Timestamp::from_millis(1_000_000);
        for (n, k) in [(7u32, 1u32), (30, 3), (100, 10)] {
            let snap = snapshot(n, now);
            let mut monitors: BTreeMap<SiloAddress, usize> = BTreeMap::new();
            for i in 0..n {
                for t in select_probe_targets(&silo(i), &snap, now, &opts(k)) {
                    *monitors.entry(t).or_default() += 1;
                }
            }
            assert_eq!(monitors.len(), n as usize, "n={n} k={k}: some silo has no prober");
            let max = monitors.values().max().copied().unwrap_or(0);
            assert!(max <= 4 * k as usize, "n={n} k={k}: a silo has {max} probers");
        }
    }

    #[test]
    fn suspects_stale_and_stuck_joiners_are_added() {
        let now = Timestamp::from_millis(10_000_000);
        let mut snap = snapshot(30, now);
        let o = opts(1);
        let me = silo(0);
        let base = select_probe_targets(&me, &snap, now, &o);
        assert_eq!(base.len(), 1);
        let others: Vec<SiloAddress> = (1..30).map(silo).filter(|s| !base.contains(s)).take(3).collect();
        // fresh vote
        snap.entries
            .get_mut(&others[0])
            .unwrap()
            .0
            .suspect_votes
            .push(SuspectVote {
                silo: silo(5),
                time: now,
            });
        // stale IAmAlive
        snap.entries.get_mut(&others[1]).unwrap().0.i_am_alive_time =
            now.saturating_sub(Duration::from_secs(3600));
        snap.entries.get_mut(&others[1]).unwrap().0.start_time = Timestamp::EPOCH;
        // stuck joining
        {
            let e = &mut snap.entries.get_mut(&others[2]).unwrap().0;
            e.status = SiloStatus::Joining;
            e.start_time = now.saturating_sub(Duration::from_secs(3600));
        }
        let t = select_probe_targets(&me, &snap, now, &o);
        for s in &others {
            assert!(t.contains(s), "{s} must be probed");
        }
        // dead silos are never probed
        snap.entries.get_mut(&others[0]).unwrap().0.status = SiloStatus::Dead;
        assert!(!select_probe_targets(&me, &snap, now, &o).contains(&others[0]));
    }
}

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

use std::fmt::Write as _;

use imbl::ordmap::DiffItem;

use crate::{
    ClusterMembershipOptions, MembershipEntry, MembershipRows, MembershipSnapshot, SiloAddress, SiloStatus,
    Timestamp,
};

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
    /// How many times the ring picks were computed from scratch.
    recomputes: u64,
    /// The rows `candidates` was computed from: the next view is compared with
    /// them by [`imbl::OrdMap::diff`], which skips the subtrees both share, so a
    /// view that changed k rows costs O(k log N) instead of a scan of the table.
    seen: Option<MembershipRows>,
    /// Monitored silos with fresh votes, a stale IAmAlive or a stuck join, sorted.
    flagged: Vec<SiloAddress>,
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

    /// [`adopt`](Self::adopt) for the same `me` and `wanted`, answering whether the
    /// picks may have changed. They cannot unless a pick departed or a newcomer
    /// lands between `me` and ring `r`'s pick on some ring `r`: by induction over the
    /// rings, each ring then sees the same chosen set and the same first successor.
    /// A newcomer does that with probability about `wanted / N` per ring, so in a
    /// join storm almost every change costs one merge instead of `wanted` scans of
    /// the whole cluster.
    fn adopt_changes(&mut self, me: &SiloAddress, candidates: Vec<SiloAddress>) -> bool {
        let mut added = Vec::new();
        let mut departed_pick = false;
        {
            let (old, new) = (&self.candidates, &candidates);
            let (mut i, mut j) = (0, 0);
            while i < old.len() || j < new.len() {
                match (old.get(i), new.get(j)) {
                    (Some(o), Some(n)) if o == n => {
                        i += 1;
                        j += 1;
                    }
                    (Some(o), n) if n.is_none_or(|n| o < n) => {
                        departed_pick |= self.picks.contains(o);
                        i += 1;
                    }
                    (_, Some(n)) => {
                        added.push(*n);
                        j += 1;
                    }
                    _ => break,
                }
            }
        }
        self.adopt(me, candidates);
        if departed_pick {
            return true;
        }
        for s in added {
            let Ok(at) = self.candidates.binary_search(&s) else {
                return true;
            };
            for (ring, pick) in self.picks.clone().iter().enumerate() {
                let ring = ring as u32;
                let Ok(p) = self.candidates.binary_search(pick) else {
                    return true;
                };
                let mine = (cached(&mut self.my_positions, me, ring), *me);
                let pick = (cached(&mut self.positions[p], pick, ring), *pick);
                let new = (cached(&mut self.positions[at], &s, ring), s);
                let before_pick = if mine < pick {
                    mine < new && new < pick
                } else {
                    new > mine || new < pick
                };
                if before_pick {
                    return true;
                }
            }
        }
        false
    }

    /// Ring `r` contributes the first successor of `me` on it that is not picked yet
    /// (wrapping around), until `wanted` silos are picked.
    fn ring_picks(&mut self, me: &SiloAddress, wanted: usize) -> Vec<SiloAddress> {
        self.recomputes += 1;
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

    /// The silos whose rows differ between the previous view and `rows`, or `None`
    /// when every row must be looked at (no previous view, or another `me`).
    fn changed_keys(&self, me: &SiloAddress, rows: &MembershipRows) -> Option<Vec<SiloAddress>> {
        let seen = self.seen.as_ref().filter(|_| self.me == Some(*me))?;
        if seen.ptr_eq(rows) {
            return Some(Vec::new());
        }
        let keys = seen.diff(rows).map(|change| match change {
            DiffItem::Add(s, _) | DiffItem::Remove(s, _) => *s,
            DiffItem::Update { new, .. } => *new.0,
        });
        Some(keys.collect())
    }

    /// The silos `me` should probe now: see [`select_probe_targets`]. Looks at every
    /// row for suspects, stale IAmAlive and stuck joiners (they change with time,
    /// not only with the table): call it every probe period.
    pub fn select(
        &mut self,
        me: &SiloAddress,
        snapshot: &MembershipSnapshot,
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> Vec<SiloAddress> {
        self.select_with(me, snapshot, now, options, true)
    }

    /// [`select`](Self::select) after a table change: only the rows that changed
    /// since the previous call are looked at again (a new vote is probed at once;
    /// a row that goes stale with time waits for the next [`select`](Self::select)).
    /// Costs O(k log N) for k changed rows of N, plus a merge when the monitored
    /// set changed, where a full `select` costs O(N).
    pub fn select_changed(
        &mut self,
        me: &SiloAddress,
        snapshot: &MembershipSnapshot,
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> Vec<SiloAddress> {
        self.select_with(me, snapshot, now, options, false)
    }

    fn select_with(
        &mut self,
        me: &SiloAddress,
        snapshot: &MembershipSnapshot,
        now: Timestamp,
        options: &ClusterMembershipOptions,
        scan_all: bool,
    ) -> Vec<SiloAddress> {
        let counts = |e: &MembershipEntry| e.silo != *me && is_monitored(e.status);
        let flagged = |e: &MembershipEntry| {
            counts(e)
                && (!fresh_votes(e, now, options).is_empty()
                    || is_i_am_alive_stale(e, now, options)
                    || is_stuck_joining(e, now, options))
        };
        let keys = self.changed_keys(me, &snapshot.entries);
        self.seen = Some(snapshot.entries.clone());
        // The monitored set, if it changed.
        let changed = match &keys {
            // `rows()` iterates in silo order, so the list is sorted.
            None => Some(snapshot.rows().filter(|e| counts(e)).map(|e| e.silo).collect()),
            Some(keys) => {
                let mut list: Option<Vec<SiloAddress>> = None;
                for k in keys {
                    let is = snapshot.entry(k).is_some_and(counts);
                    let found = self.candidates.binary_search(k);
                    if found.is_ok() == is {
                        continue;
                    }
                    let list = list.get_or_insert_with(|| self.candidates.clone());
                    match (list.binary_search(k), is) {
                        (Err(at), true) => list.insert(at, *k),
                        (Ok(at), false) => {
                            list.remove(at);
                        }
                        _ => {}
                    }
                }
                list
            }
        };
        let count = changed.as_ref().map_or(self.candidates.len(), Vec::len);
        let wanted = (options.num_probed_silos as usize).min(count);
        if self.me != Some(*me) || self.wanted != wanted {
            let candidates = changed.unwrap_or_else(|| self.candidates.clone());
            self.adopt(me, candidates);
            self.picks = self.ring_picks(me, wanted);
            self.me = Some(*me);
            self.wanted = wanted;
        } else if let Some(candidates) = changed {
            let stale_pick = self.adopt_changes(me, candidates);
            if stale_pick {
                self.picks = self.ring_picks(me, wanted);
            }
        }
        // Suspects, stale and stuck silos, sorted.
        match keys {
            Some(keys) if !scan_all => {
                for k in &keys {
                    let is = snapshot.entry(k).is_some_and(flagged);
                    match (self.flagged.binary_search(k), is) {
                        (Err(at), true) => self.flagged.insert(at, *k),
                        (Ok(at), false) => {
                            self.flagged.remove(at);
                        }
                        _ => {}
                    }
                }
            }
            _ => self.flagged = snapshot.rows().filter(|e| flagged(e)).map(|e| e.silo).collect(),
        }
        let mut chosen = self.picks.clone();
        chosen.extend(self.flagged.iter().filter(|s| !self.picks.contains(s)));
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Etag, MembershipEntry, SuspectVote};
    use std::collections::{BTreeMap, BTreeSet};
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
            s.insert(e, Etag::new("e"));
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
        snap.entry_mut(&before[0]).unwrap().status = SiloStatus::Dead;
        let e = MembershipEntry::new(silo(500), SiloStatus::Joining, now);
        snap.insert(e, Etag::new("e"));
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

    /// Random joins and departures (picks among them), one selector per silo kept
    /// across all of them: every answer equals a computation from scratch, and the
    /// picks are recomputed for a small share of the changes only.
    #[test]
    fn incremental_picks_equal_a_fresh_selection_through_random_changes() {
        use rand::{Rng, SeedableRng};
        let now = Timestamp::from_millis(1_000_000);
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let o = opts(10);
        let watchers: Vec<SiloAddress> = (0..5).map(silo).collect();
        let mut selectors = vec![TargetSelector::default(); watchers.len()];
        let mut snap = snapshot(5, now);
        let mut next = 5;
        let mut changes = 0u64;
        for step in 0..400 {
            if step < 250 || rng.random_bool(0.5) {
                let e = MembershipEntry::new(silo(next), SiloStatus::Active, now);
                snap.insert(e, Etag::new("e"));
                next += 1;
            } else {
                // Take down a pick of a watcher half the time, any silo otherwise.
                let victim = if rng.random_bool(0.5) {
                    selectors[0].picks[rng.random_range(0..selectors[0].picks.len())]
                } else {
                    silo(rng.random_range(5..next))
                };
                snap.entry_mut(&victim).unwrap().status = SiloStatus::Dead;
            }
            changes += 1;
            for (me, sel) in watchers.iter().zip(selectors.iter_mut()) {
                let got = if step % 2 == 0 {
                    sel.select(me, &snap, now, &o)
                } else {
                    sel.select_changed(me, &snap, now, &o)
                };
                assert_eq!(got, sorted_ring_picks(me, &snap, 10), "step {step}, me={me}");
            }
        }
        for sel in &selectors {
            assert!(
                sel.recomputes < changes / 3,
                "{} full recomputes for {changes} changes",
                sel.recomputes
            );
        }
    }

    /// After a table change only the changed rows are looked at again: a new vote
    /// is probed at once, a row that went stale by time alone waits for the next
    /// full selection (each probe period).
    #[test]
    fn changed_rows_are_rechecked_and_time_waits_for_the_full_scan() {
        let now = Timestamp::from_millis(10_000_000);
        let o = opts(2);
        let me = silo(0);
        let mut snap = snapshot(30, now);
        let mut sel = TargetSelector::default();
        let base = sel.select(&me, &snap, now, &o);
        let others: Vec<SiloAddress> = (1..30).map(silo).filter(|s| !base.contains(s)).take(2).collect();
        snap.entry_mut(&others[0])
            .unwrap()
            .suspect_votes
            .push(SuspectVote {
                silo: silo(7),
                time: now,
            });
        let got = sel.select_changed(&me, &snap, now, &o);
        assert_eq!(
            got,
            [base.clone(), vec![others[0]]].concat(),
            "the new vote is probed at once"
        );
        // Nothing changed in the table, but time passed: others[1]'s IAmAlive is stale.
        let later =
            now.saturating_add(o.i_am_alive_publish_period * (o.num_missed_table_i_am_alive_limit + 1));
        for s in (0..30).map(silo).filter(|s| *s != others[1]) {
            snap.entry_mut(&s).unwrap().i_am_alive_time = later;
        }
        let unchanged = snap.clone();
        let partial = sel.select_changed(&me, &unchanged, later, &o);
        assert!(
            !partial.contains(&others[1]),
            "an unchanged row is not looked at again"
        );
        let full = sel.select(&me, &unchanged, later, &o);
        assert!(
            full.contains(&others[1]),
            "the full scan sees the stale row: {full:?}"
        );
        assert_eq!(full, select_probe_targets(&me, &unchanged, later, &o));
        // The vote is removed: the next change drops the silo from the extras.
        snap.entry_mut(&others[0]).unwrap().suspect_votes.clear();
        let after = sel.select_changed(&me, &snap, later, &o);
        assert!(!after.contains(&others[0]), "{after:?}");
        assert!(after.contains(&others[1]));
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
        snap.entry_mut(&others[0])
            .unwrap()
            .suspect_votes
            .push(SuspectVote {
                silo: silo(5),
                time: now,
            });
        // stale IAmAlive
        snap.entry_mut(&others[1]).unwrap().i_am_alive_time = now.saturating_sub(Duration::from_secs(3600));
        snap.entry_mut(&others[1]).unwrap().start_time = Timestamp::EPOCH;
        // stuck joining
        {
            let e = &mut snap.entry_mut(&others[2]).unwrap();
            e.status = SiloStatus::Joining;
            e.start_time = now.saturating_sub(Duration::from_secs(3600));
        }
        let t = select_probe_targets(&me, &snap, now, &o);
        for s in &others {
            assert!(t.contains(s), "{s} must be probed");
        }
        // dead silos are never probed
        snap.entry_mut(&others[0]).unwrap().status = SiloStatus::Dead;
        assert!(!select_probe_targets(&me, &snap, now, &o).contains(&others[0]));
    }
}

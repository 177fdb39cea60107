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

use crate::{
    ClusterMembershipOptions, MembershipEntry, MembershipRows, MembershipSnapshot, SiloAddress, SiloStatus,
    Timestamp,
};

use super::votes::fresh_votes;
use super::{is_i_am_alive_stale, is_stuck_joining};

/// Position of `silo` on ring `ring`: xxHash32 of its text form, seeded by the ring
/// number.
pub fn ring_position(silo: &SiloAddress, ring: u32) -> u32 {
    with_text(silo, |text| xxhash_rust::xxh32::xxh32(text, ring))
}

/// Pushes the positions of `silo` on `rings` to `out` ([`ring_position`] of each),
/// formatting its text form once for all of them.
fn push_ring_positions(silo: &SiloAddress, rings: std::ops::Range<u32>, out: &mut Vec<u32>) {
    with_text(silo, |text| {
        out.extend(rings.map(|ring| xxhash_rust::xxh32::xxh32(text, ring)));
    });
}

/// Calls `f` with the text form of `silo`, formatted on the stack.
fn with_text<R>(silo: &SiloAddress, f: impl FnOnce(&[u8]) -> R) -> R {
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
        f(&text.bytes[..text.len])
    } else {
        f(silo.to_string().as_bytes())
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
    /// Ring positions of the candidates, `stride` per candidate: those of
    /// `candidates[i]` on rings `0..stride` are `positions[i * stride..][..stride]`.
    /// One flat vector, so that a silo in an N-silo cluster keeps 4 x stride bytes
    /// per candidate (a join-storm simulation keeps N of them).
    positions: Vec<u32>,
    /// Rings whose positions are kept (`wanted`: ring `r` makes the `r`-th pick).
    stride: usize,
    /// Ring positions of `me` on rings `0..stride`.
    my_positions: Vec<u32>,
    picks: Vec<SiloAddress>,
    /// How many times the ring picks were computed from scratch.
    recomputes: u64,
    /// How many times the flags were computed from every row.
    scans: u64,
    /// The rows `candidates` was computed from: the next view is compared with
    /// them by [`MembershipRows::changes`], which skips the subtrees both share, so a
    /// view that changed k rows costs O(k log N) instead of a scan of the table.
    seen: Option<MembershipRows>,
    /// Monitored silos with fresh votes, a stale IAmAlive or a stuck join, sorted.
    flagged: Vec<SiloAddress>,
    /// Silos (not `me`) stuck in Joining or Created ([`is_stuck_joining`]), sorted.
    stuck: Vec<SiloAddress>,
    /// When the flags were last computed from every row, and with which limits.
    scanned: Option<(Timestamp, FlagLimits)>,
    /// The earliest instant, at or after the last full scan, at which a row's
    /// flags may flip with time alone ([`flip_instants`]); until then a full
    /// selection looks at no row the table did not change.
    next_flip: Option<Timestamp>,
}

/// The options the time-driven flags depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FlagLimits {
    stale_after: std::time::Duration,
    join_limit: std::time::Duration,
    vote_expiration: std::time::Duration,
}

impl FlagLimits {
    fn of(options: &ClusterMembershipOptions) -> Self {
        FlagLimits {
            stale_after: options
                .i_am_alive_publish_period
                .saturating_mul(options.num_missed_table_i_am_alive_limit),
            join_limit: options.max_join_attempt_time,
            vote_expiration: options.death_vote_expiration,
        }
    }
}

/// The instants at which a row's flags can change with time alone: its IAmAlive
/// goes stale after `last_alive + stale_after` ([`is_i_am_alive_stale`]), a join
/// gets stuck after `start_time + join_limit` ([`is_stuck_joining`]), and its
/// votes stop being fresh at `newest vote + vote_expiration` ([`fresh_votes`]).
/// Between two of them every flag of the row is constant.
fn flip_instants(e: &MembershipEntry, limits: &FlagLimits) -> impl Iterator<Item = Timestamp> {
    let joining = matches!(e.status, SiloStatus::Joining | SiloStatus::Created);
    let newest_vote = e.suspect_votes.iter().map(|v| v.time).max();
    [
        Some(e.last_alive().saturating_add(limits.stale_after)),
        joining.then(|| e.start_time.saturating_add(limits.join_limit)),
        newest_vote.map(|t| t.saturating_add(limits.vote_expiration)),
    ]
    .into_iter()
    .flatten()
}

/// The earliest of `e`'s flip instants at or after `now`.
fn next_flip(e: &MembershipEntry, limits: &FlagLimits, now: Timestamp) -> Option<Timestamp> {
    flip_instants(e, limits).filter(|t| *t >= now).min()
}

/// Adds or removes `silo` in the sorted `list`.
fn set_member(list: &mut Vec<SiloAddress>, silo: &SiloAddress, member: bool) {
    match (list.binary_search(silo), member) {
        (Err(at), true) => list.insert(at, *silo),
        (Ok(at), false) => {
            list.remove(at);
        }
        _ => {}
    }
}

impl TargetSelector {
    /// Takes the new (sorted) candidates for `me` with positions on `stride`
    /// rings, keeping the positions of those already known (one merge of two
    /// sorted lists) and hashing the newcomers.
    fn adopt(&mut self, me: &SiloAddress, candidates: Vec<SiloAddress>, stride: usize) {
        if self.me != Some(*me) || self.stride != stride {
            self.my_positions.clear();
            push_ring_positions(me, 0..stride as u32, &mut self.my_positions);
        }
        let keep = self.stride == stride;
        let old_positions = std::mem::take(&mut self.positions);
        let mut old = std::mem::take(&mut self.candidates)
            .into_iter()
            .zip(old_positions.chunks_exact(self.stride.max(1)))
            .peekable();
        let mut positions = Vec::with_capacity(candidates.len() * stride);
        for s in &candidates {
            while old.next_if(|(o, _)| o < s).is_some() {}
            match old.next_if(|(o, _)| o == s) {
                Some((_, known)) if keep => positions.extend_from_slice(known),
                _ => push_ring_positions(s, 0..stride as u32, &mut positions),
            }
        }
        self.candidates = candidates;
        self.positions = positions;
        self.stride = stride;
    }

    /// Position of `candidates[i]` on `ring` (< `stride`).
    fn position(&self, i: usize, ring: usize) -> u32 {
        self.positions[i * self.stride + ring]
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
        self.adopt(me, candidates, self.stride);
        if departed_pick {
            return true;
        }
        for s in added {
            let Ok(at) = self.candidates.binary_search(&s) else {
                return true;
            };
            for (ring, pick) in self.picks.iter().enumerate() {
                let Ok(p) = self.candidates.binary_search(pick) else {
                    return true;
                };
                if ring >= self.stride {
                    return true;
                }
                let mine = (self.my_positions[ring], *me);
                let pick = (self.position(p, ring), *pick);
                let new = (self.position(at, ring), s);
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
    /// (wrapping around), until `wanted` silos are picked (`wanted` <= `stride`
    /// and <= the candidates, so ring `r < wanted` always picks one).
    fn ring_picks(&mut self, me: &SiloAddress, wanted: usize) -> Vec<SiloAddress> {
        self.recomputes += 1;
        let mut chosen: Vec<usize> = Vec::with_capacity(wanted);
        for ring in 0..wanted.min(self.stride) {
            let mine = (self.my_positions[ring], *me);
            // The best (position, index) after mine, and the best overall (the wrap).
            let mut after: Option<(u32, usize)> = None;
            let mut first: Option<(u32, usize)> = None;
            for (i, s) in self.candidates.iter().enumerate() {
                if chosen.contains(&i) {
                    continue;
                }
                let p = self.position(i, ring);
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
        }
        chosen.into_iter().map(|i| self.candidates[i]).collect()
    }

    /// The silos whose rows differ between the previous view and `rows`, or `None`
    /// when every row must be looked at (no previous view, or another `me`).
    fn changed_keys(&self, me: &SiloAddress, rows: &MembershipRows) -> Option<Vec<SiloAddress>> {
        let seen = self.seen.as_ref().filter(|_| self.me == Some(*me))?;
        if seen.shares_all(rows) {
            return Some(Vec::new());
        }
        Some(seen.changes(rows).map(|change| change.silo()).collect())
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

    /// The silos (other than `me`) stuck in Joining or Created at the last
    /// selection ([`is_stuck_joining`]), sorted: kept with the flags, so that a
    /// silo need not scan its view for them every probe period.
    pub fn stuck(&self) -> &[SiloAddress] {
        &self.stuck
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
                // The keys come sorted (a diff walks both maps in order): the
                // silos that join and leave the monitored set, then one merge.
                let (mut joined, mut left) = (Vec::new(), Vec::new());
                for k in keys {
                    let is = snapshot.entry(k).is_some_and(counts);
                    match (self.candidates.binary_search(k).is_ok(), is) {
                        (false, true) => joined.push(*k),
                        (true, false) => left.push(*k),
                        _ => {}
                    }
                }
                (!joined.is_empty() || !left.is_empty())
                    .then(|| merge_changes(&self.candidates, &joined, &left))
            }
        };
        let count = changed.as_ref().map_or(self.candidates.len(), Vec::len);
        let wanted = (options.num_probed_silos as usize).min(count);
        if self.me != Some(*me) || self.wanted != wanted {
            let candidates = changed.unwrap_or_else(|| self.candidates.clone());
            self.adopt(me, candidates, wanted);
            self.picks = self.ring_picks(me, wanted);
            self.me = Some(*me);
            self.wanted = wanted;
        } else if let Some(candidates) = changed {
            let stale_pick = self.adopt_changes(me, candidates);
            if stale_pick {
                self.picks = self.ring_picks(me, wanted);
            }
        }
        // Suspects, stale and stuck silos, sorted. A full selection rescans the
        // rows only when some row's flags may have flipped with time since the
        // last scan (or the clock went back, or the limits changed): time-driven
        // flips are rare (minutes apart per row), so in a large cluster a probe
        // period costs O(changed rows), not a scan of the table.
        let limits = FlagLimits::of(options);
        let stuck = |e: &MembershipEntry| e.silo != *me && is_stuck_joining(e, now, options);
        let rescan = match (&keys, self.scanned) {
            (None, _) | (_, None) => true,
            (Some(_), Some((at, seen_limits))) => {
                now < at || seen_limits != limits || (scan_all && self.next_flip.is_some_and(|t| now >= t))
            }
        };
        if rescan {
            self.flagged.clear();
            self.stuck.clear();
            self.next_flip = None;
            for e in snapshot.rows() {
                if flagged(e) {
                    self.flagged.push(e.silo);
                }
                if stuck(e) {
                    self.stuck.push(e.silo);
                }
                if e.silo != *me {
                    self.next_flip = self.next_flip.into_iter().chain(next_flip(e, &limits, now)).min();
                }
            }
            self.scanned = Some((now, limits));
            self.scans += 1;
        } else if let Some(keys) = &keys {
            for k in keys {
                let row = snapshot.entry(k);
                set_member(&mut self.flagged, k, row.is_some_and(flagged));
                set_member(&mut self.stuck, k, row.is_some_and(stuck));
                if let Some(t) = row
                    .filter(|e| e.silo != *me)
                    .and_then(|e| next_flip(e, &limits, now))
                {
                    self.next_flip = Some(self.next_flip.map_or(t, |n| n.min(t)));
                }
            }
        }
        let mut chosen = self.picks.clone();
        chosen.extend(self.flagged.iter().filter(|s| !self.picks.contains(s)));
        chosen
    }
}

/// `candidates` (sorted) without `left` and with `joined` (both sorted, `joined`
/// disjoint from `candidates`, `left` a subset of it), in one pass.
fn merge_changes(
    candidates: &[SiloAddress],
    joined: &[SiloAddress],
    left: &[SiloAddress],
) -> Vec<SiloAddress> {
    let mut out = Vec::with_capacity(candidates.len() + joined.len());
    let mut joined = joined.iter().copied().peekable();
    let mut left = left.iter().peekable();
    for c in candidates {
        while let Some(j) = joined.next_if(|j| j < c) {
            out.push(j);
        }
        if left.next_if(|l| *l == c).is_none() {
            out.push(*c);
        }
    }
    out.extend(joined);
    out
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
            selector.candidates.len() * selector.stride,
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

    /// Time passes in steps of a probe period while rows change, go stale, get
    /// votes and hang in their join: every full selection equals a selection from
    /// scratch and the stuck list equals a scan, although the rows are scanned
    /// only when some row's flags may have flipped.
    #[test]
    fn full_selections_scan_only_when_a_flag_may_flip() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let o = opts(3);
        let start = Timestamp::from_millis(10_000_000);
        let me = silo(0);
        let mut snap = snapshot(40, start);
        let mut sel = TargetSelector::default();
        let mut now = start;
        let ticks = 2_000u32;
        for tick in 0..ticks {
            now = now.saturating_add(o.probe_period());
            if rng.random_bool(0.05) {
                let s = silo(rng.random_range(1..40));
                let e = snap.entry_mut(&s).unwrap();
                match rng.random_range(0..4) {
                    0 => e.i_am_alive_time = now,
                    1 => e.suspect_votes.push(SuspectVote {
                        silo: silo(3),
                        time: now,
                    }),
                    2 => {
                        e.status = SiloStatus::Joining;
                        e.start_time = now;
                    }
                    _ => e.status = SiloStatus::Active,
                }
            }
            let got = sel.select(&me, &snap, now, &o);
            assert_eq!(got, select_probe_targets(&me, &snap, now, &o), "tick {tick}");
            let stuck: Vec<SiloAddress> = snap
                .rows()
                .filter(|e| e.silo != me && is_stuck_joining(e, now, &o))
                .map(|e| e.silo)
                .collect();
            assert_eq!(sel.stuck(), stuck, "tick {tick}");
        }
        assert!(
            sel.scans < u64::from(ticks) / 4,
            "{} scans in {ticks} probe periods",
            sel.scans
        );
        // A clock that goes back rescans.
        let scans = sel.scans;
        sel.select(&me, &snap, start, &o);
        assert_eq!(sel.scans, scans + 1);
    }

    #[test]
    fn merge_changes_equals_a_set_difference_and_union() {
        let all: Vec<SiloAddress> = (0..30).map(silo).collect();
        let mut sorted = all.clone();
        sorted.sort();
        let candidates: Vec<SiloAddress> = sorted.iter().copied().step_by(2).collect();
        let joined: Vec<SiloAddress> = sorted.iter().copied().skip(1).step_by(6).collect();
        let left: Vec<SiloAddress> = candidates.iter().copied().step_by(4).collect();
        let expected: BTreeSet<SiloAddress> = candidates
            .iter()
            .chain(&joined)
            .filter(|s| !left.contains(s))
            .copied()
            .collect();
        let merged = merge_changes(&candidates, &joined, &left);
        assert_eq!(merged, expected.into_iter().collect::<Vec<_>>());
        assert_eq!(merge_changes(&[], &joined, &[]), joined);
        assert!(merge_changes(&candidates, &[], &candidates).is_empty());
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

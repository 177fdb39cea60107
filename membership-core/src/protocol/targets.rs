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

use crate::{ClusterMembershipOptions, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp};

use super::votes::fresh_votes;
use super::{is_i_am_alive_stale, is_stuck_joining};

/// Position of `silo` on ring `ring`: xxHash32 of its text form, seeded by the ring
/// number.
pub fn ring_position(silo: &SiloAddress, ring: u32) -> u32 {
    xxhash_rust::xxh32::xxh32(silo.to_string().as_bytes(), ring)
}

/// Whether a silo in `status` is monitored: Joining and Active silos (a Joining silo
/// may hang in its join and must be evictable).
pub fn is_monitored(status: SiloStatus) -> bool {
    matches!(status, SiloStatus::Joining | SiloStatus::Active)
}

/// The silos `me` should probe, in a stable order (ring picks first, then suspects).
/// Never contains `me`; contains no silo twice.
pub fn select_probe_targets(
    me: &SiloAddress,
    snapshot: &MembershipSnapshot,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> Vec<SiloAddress> {
    let candidates: Vec<SiloAddress> = snapshot
        .rows()
        .filter(|e| e.silo != *me && is_monitored(e.status))
        .map(|e| e.silo)
        .collect();
    let mut chosen: Vec<SiloAddress> = Vec::new();
    let mut taken: BTreeSet<SiloAddress> = BTreeSet::new();
    if !candidates.is_empty() {
        let wanted = (options.num_probed_silos as usize).min(candidates.len());
        let mut ring = 0u32;
        while chosen.len() < wanted {
            let my_pos = ring_position(me, ring);
            let mut ordered: Vec<(u32, SiloAddress)> =
                candidates.iter().map(|s| (ring_position(s, ring), *s)).collect();
            ordered.sort_unstable();
            // First candidate clockwise after me that is not taken yet.
            let start = ordered.partition_point(|(p, s)| (*p, *s) <= (my_pos, *me));
            let pick = (0..ordered.len())
                .map(|k| ordered[(start + k) % ordered.len()].1)
                .find(|s| !taken.contains(s));
            if let Some(s) = pick {
                taken.insert(s);
                chosen.push(s);
            }
            ring += 1;
        }
    }
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

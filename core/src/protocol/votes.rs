//! Suspicion votes and the declare-dead decision.
//!
//! Rules (*Cluster Management in Orleans*, extended with its clock-skew note):
//! - a vote is **fresh** if it is younger than `death_vote_expiration`, measured
//!   against the later of `now` and the newest vote in the row, so that a voter whose
//!   clock runs ahead cannot expire everybody else's votes;
//! - the votes needed are `min(num_votes_for_death_declaration, (active + 1) / 2)`,
//!   `active` counting Active silos whose IAmAlive is not stale (at least 1).
//!   Staleness is measured against the **newest IAmAlive in the table** (capped at
//!   `now`), not against `now` alone: during a table outage nobody can heartbeat, and
//!   measuring against `now` would make every silo stale at once and let a single
//!   vote declare death right after the outage (Orleans measures against `now`);
//! - each voter counts once (its newest vote), even if a stored row holds more;
//! - a voter adds its own vote (replacing an older one of its own) and, after a
//!   failed indirect probe, the intermediary's; stale votes are dropped; if the fresh
//!   votes reach the requirement the row is written Dead, otherwise with the votes;
//! - a suspect already Dead is left alone; the vote list is bounded by
//!   `num_votes_for_death_declaration` (newest kept).

use crate::{
    ClusterMembershipOptions, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, SuspectVote,
    Timestamp,
};

use super::is_i_am_alive_stale;

/// The votes of `entry` that are still fresh at `now`.
pub fn fresh_votes(
    entry: &MembershipEntry,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> Vec<SuspectVote> {
    let newest = entry.suspect_votes.iter().map(|v| v.time).max().unwrap_or(now);
    let reference = now.max(newest);
    let cutoff = reference.saturating_sub(options.death_vote_expiration);
    entry
        .suspect_votes
        .iter()
        .filter(|v| v.time > cutoff)
        .cloned()
        .collect()
}

/// Active silos whose IAmAlive is not stale, measured against the newest IAmAlive of
/// an Active silo in the snapshot (capped at `now`).
pub fn active_non_stale(
    snapshot: &MembershipSnapshot,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> usize {
    active_non_stale_silos(snapshot, now, options).len()
}

/// The silos [`active_non_stale`] counts, in address order.
pub fn active_non_stale_silos(
    snapshot: &MembershipSnapshot,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> Vec<SiloAddress> {
    let newest = snapshot
        .active()
        .map(|e| e.last_alive())
        .max()
        .unwrap_or(now)
        .min(now);
    snapshot
        .active()
        .filter(|e| !is_i_am_alive_stale(e, newest, options))
        .map(|e| e.silo)
        .collect()
}

/// Votes needed to declare a silo Dead: `min(num_votes_for_death_declaration,
/// (active + 1) / 2)`, at least 1.
pub fn required_votes(active: usize, options: &ClusterMembershipOptions) -> usize {
    let half = active.saturating_add(1) / 2;
    (options.num_votes_for_death_declaration as usize)
        .min(half)
        .max(1)
}

/// What a voter must write into the suspect's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VoteDecision {
    /// The suspect is already Dead (or gone): write nothing.
    AlreadyDead,
    /// Write this row: the suspect with the voter's (and intermediary's) vote added.
    Vote(MembershipEntry),
    /// Write this row: the suspect declared Dead, with the votes that did it.
    DeclareDead(MembershipEntry),
}

/// Decides the voter's write against `suspect` (the row as just read).
///
/// `intermediary` is the silo that also failed to reach the suspect in an indirect
/// probe; its vote is added too. `active` is [`active_non_stale`] of the snapshot the
/// row was read with.
pub fn decide_vote(
    suspect: &MembershipEntry,
    voter: &SiloAddress,
    intermediary: Option<&SiloAddress>,
    now: Timestamp,
    active: usize,
    options: &ClusterMembershipOptions,
) -> VoteDecision {
    if suspect.status == SiloStatus::Dead {
        return VoteDecision::AlreadyDead;
    }
    let mut row = suspect.clone();
    let mut votes = fresh_votes(suspect, now, options);
    for v in [Some(voter), intermediary].into_iter().flatten() {
        votes.retain(|old| old.silo != *v);
        votes.push(SuspectVote { silo: *v, time: now });
    }
    // One vote per voter (the newest), whatever the stored row held.
    votes.sort_by(|a, b| a.silo.cmp(&b.silo).then(b.time.cmp(&a.time)));
    votes.dedup_by_key(|v| v.silo);
    votes.sort_by_key(|v| v.time);
    let keep = (options.num_votes_for_death_declaration as usize).max(1);
    if votes.len() > keep {
        votes.drain(..votes.len() - keep);
    }
    let dead = votes.len() >= required_votes(active, options);
    row.suspect_votes = votes;
    if dead {
        row.status = SiloStatus::Dead;
        VoteDecision::DeclareDead(row)
    } else {
        VoteDecision::Vote(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn silo(n: u32) -> SiloAddress {
        format!("10.0.0.{n}:1@1").parse().unwrap()
    }

    fn suspect(now: Timestamp) -> MembershipEntry {
        MembershipEntry::new(silo(9), SiloStatus::Active, now)
    }

    #[test]
    fn required_votes_follow_cluster_size() {
        let o = ClusterMembershipOptions::default();
        assert_eq!(required_votes(1, &o), 1);
        assert_eq!(required_votes(2, &o), 1);
        assert_eq!(required_votes(3, &o), 2);
        assert_eq!(required_votes(50, &o), 2);
        assert_eq!(required_votes(0, &o), 1);
    }

    /// Regression: measured against `now`, every silo was stale right after a
    /// table outage, and the table-outage scenario saw one vote declare a live
    /// silo Dead.
    #[test]
    fn a_table_outage_does_not_shrink_the_quorum() {
        use crate::Etag;
        let o = ClusterMembershipOptions::default();
        let t0 = Timestamp::from_millis(1_000_000_000);
        let mut snap = MembershipSnapshot::default();
        for i in 1..=5 {
            let e = MembershipEntry::new(silo(i), SiloStatus::Active, t0);
            snap.insert(e, Etag::new("e"));
        }
        // 10 minutes without heartbeats (the table was down): nobody is stale relative
        // to the others, so 2 votes are still needed.
        let later = t0.saturating_add(Duration::from_secs(600));
        assert_eq!(active_non_stale(&snap, later, &o), 5);
        // One silo that really stopped heartbeating while others continued is stale.
        for i in 1..=4 {
            snap.entry_mut(&silo(i)).unwrap().i_am_alive_time = later;
        }
        assert_eq!(active_non_stale(&snap, later, &o), 4);
    }

    #[test]
    fn one_vote_in_a_two_silo_cluster_two_in_three() {
        let o = ClusterMembershipOptions::default();
        let now = Timestamp::from_millis(1_000_000);
        assert!(matches!(
            decide_vote(&suspect(now), &silo(1), None, now, 2, &o),
            VoteDecision::DeclareDead(_)
        ));
        match decide_vote(&suspect(now), &silo(1), None, now, 3, &o) {
            VoteDecision::Vote(row) => {
                assert_eq!(row.suspect_votes.len(), 1);
                assert_eq!(row.status, SiloStatus::Active);
                match decide_vote(&row, &silo(2), None, now, 3, &o) {
                    VoteDecision::DeclareDead(d) => assert_eq!(d.suspect_votes.len(), 2),
                    other => panic!("{other:?}"),
                }
                // The same voter again does not count twice.
                assert!(matches!(
                    decide_vote(&row, &silo(1), None, now, 3, &o),
                    VoteDecision::Vote(_)
                ));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn intermediary_vote_counts() {
        let o = ClusterMembershipOptions::default();
        let now = Timestamp::from_millis(1_000_000);
        assert!(matches!(
            decide_vote(&suspect(now), &silo(1), Some(&silo(2)), now, 5, &o),
            VoteDecision::DeclareDead(_)
        ));
    }

    #[test]
    fn stale_votes_expire_and_skew_is_tolerated() {
        let o = ClusterMembershipOptions::default();
        let now = Timestamp::from_millis(10_000_000);
        let mut s = suspect(now);
        s.suspect_votes.push(SuspectVote {
            silo: silo(2),
            time: now.saturating_sub(Duration::from_secs(121)),
        });
        match decide_vote(&s, &silo(1), None, now, 5, &o) {
            VoteDecision::Vote(row) => assert_eq!(row.suspect_votes.len(), 1, "expired vote must be dropped"),
            other => panic!("{other:?}"),
        }
        // A voter whose clock is 10 min behind must not see a fresh vote as stale
        // merely because of its own clock... and a vote from the future counts as the
        // reference: another vote 100 s older than it is still fresh.
        let mut s = suspect(now);
        let future = now.saturating_add(Duration::from_secs(600));
        s.suspect_votes.push(SuspectVote {
            silo: silo(2),
            time: future,
        });
        s.suspect_votes.push(SuspectVote {
            silo: silo(3),
            time: future.saturating_sub(Duration::from_secs(100)),
        });
        assert_eq!(fresh_votes(&s, now, &o).len(), 2);
        // relative to the newest vote, one 130 s older is stale even if our clock is behind
        s.suspect_votes[1].time = future.saturating_sub(Duration::from_secs(130));
        assert_eq!(fresh_votes(&s, now, &o).len(), 1);
    }

    #[test]
    fn dead_is_left_alone_and_list_is_bounded() {
        let o = ClusterMembershipOptions {
            num_votes_for_death_declaration: 3,
            num_probed_silos: 10,
            ..Default::default()
        };
        let now = Timestamp::from_millis(1_000_000);
        let mut s = suspect(now);
        s.status = SiloStatus::Dead;
        assert_eq!(
            decide_vote(&s, &silo(1), None, now, 5, &o),
            VoteDecision::AlreadyDead
        );
        let mut s = suspect(now);
        for i in 1..=2 {
            s.suspect_votes.push(SuspectVote {
                silo: silo(i),
                time: now,
            });
        }
        // 2 votes + own = 3 -> dead with 3 votes, never more than 3 kept
        match decide_vote(&s, &silo(7), Some(&silo(8)), now, 20, &o) {
            VoteDecision::DeclareDead(row) => assert_eq!(row.suspect_votes.len(), 3),
            other => panic!("{other:?}"),
        }
    }
}

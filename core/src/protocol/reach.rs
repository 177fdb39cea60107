//! Whether this silo may vote on probe evidence: only while it reaches a majority of
//! the active silos, itself included.
//!
//! Why: in a 2|3 network partition where every silo still reaches the store, each
//! side's probes fail against the other side. With the Orleans rule alone (votes
//! needed = `min(num_votes_for_death_declaration, (active + 1) / 2)`, 2 of 5) the two
//! minority silos have exactly the votes a death needs, so they declared the
//! majority Dead as fast as the majority declared them: a 10-s split took 4 of 5
//! silos down (Orleans issue 8242 is the same weakness).
//!
//! The rule (from Lifeguard's "suspect yourself first": a silo whose probes fail
//! against most of the cluster is more likely the one cut off; and from Rapid, which
//! only acts on a cut that a majority agrees on):
//! - A silo that is about to vote against a suspect **because its probes went
//!   unanswered** ([`SuspectReason::MissedProbes`](super::SuspectReason)) first checks
//!   that it reaches a strict majority of the **active silos whose IAmAlive is not
//!   stale** (itself included). A silo counts as reached when the latest ping this
//!   silo sent it was answered, within the last [`fresh_window`].
//! - When its recent answers do not show a majority, it pings every active silo it has
//!   no fresh answer from (one **reach round**, at most one at a time, each ping
//!   bounded by the probe timeout) and decides as soon as a majority is reached or ruled out.
//! - Without a majority it does not vote: it treats its own connectivity as the
//!   suspect (the machine raises its local health score, which lengthens its probe
//!   timeouts, as Lifeguard and Orleans' local-health monitor do). The suspicions wait
//!   for the next probe window.
//!
//! **The table as witness.** Staleness is what lets a minority act after all: a
//! silo that crashed stops writing its IAmAlive, and after
//! `i_am_alive_publish_period x num_missed_table_i_am_alive_limit` (90 s by default,
//! 6 s with `ClusterMembershipOptions::fast`) it leaves the active set that both this
//! majority and the vote quorum count. So when 3 of 5 silos crash at once, the 2
//! survivors reach a majority of the non-stale silos once the 3 are stale, and
//! declare them Dead one probe window later. In a partition every silo still
//! heartbeats: nobody goes stale, and a side without a majority never declares
//! anyone. The trade-off: a shorter IAmAlive period detects a mass crash sooner and
//! costs one more table write per silo and period.
//!
//! Evidence that is not "no answer" needs no majority: another generation answering
//! on the suspect's endpoint (`WrongSilo`) and a join stuck past
//! `max_join_attempt_time` (the table says so) are voted on as before.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{ClusterMembershipOptions, SiloAddress, Timestamp};

/// How long an answered ping counts as "reached": a suspicion window,
/// `num_missed_probes_limit x probe_timeout` (15 s by default). Regular probes of a
/// target come every `probe_timeout / 2`, so a reachable target is always fresh.
pub fn fresh_window(options: &ClusterMembershipOptions) -> Duration {
    options
        .probe_timeout
        .saturating_mul(options.num_missed_probes_limit.max(1))
}

/// Whether `reached` silos out of `active` are a strict majority.
pub fn is_majority(reached: usize, active: usize) -> bool {
    reached.saturating_mul(2) > active
}

/// A suspicion waiting for a reach round: the suspect and the intermediary whose
/// indirect probe failed too.
pub type PendingVote = (SiloAddress, Option<SiloAddress>);

/// What this silo knows about whom it reaches, and the reach round in progress.
#[derive(Clone, Debug, Default)]
pub struct Reach {
    /// Per silo: when its latest ping result came, and whether it was answered.
    latest: BTreeMap<SiloAddress, (Timestamp, bool)>,
    round: Option<Round>,
}

#[derive(Clone, Debug)]
struct Round {
    /// Pings of the round still out: sequence number -> silo.
    outstanding: BTreeMap<u64, SiloAddress>,
    pending: Vec<PendingVote>,
}

/// The verdict of a finished reach round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundVerdict {
    /// Whether this silo reaches a majority of the active silos.
    pub majority: bool,
    /// Silos reached (this one included) and active silos counted.
    pub reached: usize,
    /// Active silos counted.
    pub active: usize,
    /// The suspicions that waited for the round.
    pub pending: Vec<PendingVote>,
}

impl Reach {
    /// Records the result of any ping to `silo` at `now` (regular probe, reach round
    /// or join validation): answered by the silo itself, or not.
    pub fn record(&mut self, silo: SiloAddress, now: Timestamp, answered: bool) {
        self.latest.insert(silo, (now, answered));
    }

    /// Whether the latest ping to `silo` was answered within [`fresh_window`].
    pub fn reached(&self, silo: &SiloAddress, now: Timestamp, options: &ClusterMembershipOptions) -> bool {
        self.latest.get(silo).is_some_and(|(at, answered)| {
            *answered && now.saturating_duration_since(*at) <= fresh_window(options)
        })
    }

    /// How many of `active` this silo reaches now (`me` always reaches itself).
    pub fn count(
        &self,
        me: &SiloAddress,
        active: &[SiloAddress],
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> usize {
        active
            .iter()
            .filter(|s| *s == me || self.reached(s, now, options))
            .count()
    }

    /// Whether this silo's fresh answers already show a majority of `active`.
    pub fn sees_majority(
        &self,
        me: &SiloAddress,
        active: &[SiloAddress],
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> bool {
        is_majority(self.count(me, active, now, options), active.len())
    }

    /// Whether a reach round is in progress.
    pub fn round_running(&self) -> bool {
        self.round.is_some()
    }

    /// Adds a suspicion to the running round (no-op when none runs).
    pub fn wait_for_round(&mut self, vote: PendingVote) {
        if let Some(r) = self.round.as_mut() {
            if !r.pending.iter().any(|(s, _)| *s == vote.0) {
                r.pending.push(vote);
            }
        }
    }

    /// The silos of `active` a new round must ping (no fresh answer, not `me`).
    pub fn unknown(
        &self,
        me: &SiloAddress,
        active: &[SiloAddress],
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> Vec<SiloAddress> {
        active
            .iter()
            .filter(|s| *s != me && !self.reached(s, now, options))
            .copied()
            .collect()
    }

    /// Starts a round: `pings` are the (sequence number, silo) pairs the caller sends;
    /// `vote` waits for the verdict. With no ping to send the round is not started
    /// (the caller decides at once).
    pub fn start_round(&mut self, pings: &[(u64, SiloAddress)], vote: PendingVote) {
        if pings.is_empty() || self.round.is_some() {
            return;
        }
        self.round = Some(Round {
            outstanding: pings.iter().copied().collect(),
            pending: vec![vote],
        });
    }

    /// Takes a ping result if it belongs to the running round; `true` when it did
    /// (the caller records it with [`record`](Self::record) either way).
    pub fn on_round_result(&mut self, seq: u64, silo: &SiloAddress) -> bool {
        match self.round.as_mut() {
            Some(r) if r.outstanding.get(&seq) == Some(silo) => {
                r.outstanding.remove(&seq);
                true
            }
            _ => false,
        }
    }

    /// The verdict as soon as the round decides it (the round ends): a majority
    /// reached, or too few pings still out to make one; `None` while undecided or
    /// when no round runs. Pings still out when it ends are ignored (their results
    /// are still [`record`](Self::record)ed). So in a large healthy cluster a round
    /// ends after the first half of the answers, one round trip, however slow the
    /// pings to crashed silos are.
    pub fn finish_round(
        &mut self,
        me: &SiloAddress,
        active: &[SiloAddress],
        now: Timestamp,
        options: &ClusterMembershipOptions,
    ) -> Option<RoundVerdict> {
        let out = self.round.as_ref()?.outstanding.len();
        let reached = self.count(me, active, now, options);
        let decided = is_majority(reached, active.len()) || !is_majority(reached + out, active.len());
        if !decided {
            return None;
        }
        let round = self.round.take()?;
        Some(RoundVerdict {
            majority: is_majority(reached, active.len()),
            reached,
            active: active.len(),
            pending: round.pending,
        })
    }

    /// Forgets silos that left the view (keeps memory bounded by the view).
    pub fn retain(&mut self, mut keep: impl FnMut(&SiloAddress) -> bool) {
        self.latest.retain(|s, _| keep(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silo(n: u8) -> SiloAddress {
        format!("10.0.0.{n}:1@1").parse().unwrap()
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn majority_is_strict() {
        assert!(is_majority(3, 5));
        assert!(!is_majority(2, 5));
        assert!(!is_majority(2, 4));
        assert!(is_majority(1, 1));
        assert!(!is_majority(1, 2));
        assert!(!is_majority(0, 0));
    }

    #[test]
    fn only_a_fresh_answered_latest_ping_counts() {
        let o = ClusterMembershipOptions::fast(); // window 1.5 s
        let mut r = Reach::default();
        let active: Vec<_> = (1..=5).map(silo).collect();
        r.record(silo(2), t(1_000), true);
        r.record(silo(3), t(1_000), true);
        r.record(silo(4), t(1_000), true);
        r.record(silo(4), t(1_200), false); // latest failed
        assert_eq!(r.count(&silo(1), &active, t(1_500), &o), 3);
        assert!(r.sees_majority(&silo(1), &active, t(1_500), &o));
        assert_eq!(
            r.count(&silo(1), &active, t(2_600), &o),
            1,
            "answers older than the window"
        );
        assert_eq!(r.unknown(&silo(1), &active, t(1_500), &o), vec![silo(4), silo(5)]);
    }

    #[test]
    fn a_minority_round_says_no_and_hands_back_the_suspicions() {
        let o = ClusterMembershipOptions::fast();
        let (me, active): (SiloAddress, Vec<_>) = (silo(1), (1..=5).map(silo).collect());
        let mut r = Reach::default();
        r.record(silo(2), t(0), true);
        assert!(!r.sees_majority(&me, &active, t(100), &o));
        let pings: Vec<(u64, SiloAddress)> = r
            .unknown(&me, &active, t(100), &o)
            .into_iter()
            .enumerate()
            .map(|(i, s)| (i as u64, s))
            .collect();
        assert_eq!(pings.len(), 3);
        r.start_round(&pings, (silo(3), None));
        r.wait_for_round((silo(4), Some(silo(2))));
        r.wait_for_round((silo(3), None)); // already waiting
        assert!(!r.on_round_result(99, &silo(3)), "not of this round");
        // Me and silo 2 reached: only the third failure rules a majority out.
        for (seq, s) in &pings {
            assert!(r.finish_round(&me, &active, t(200), &o).is_none());
            assert!(r.on_round_result(*seq, s));
            r.record(*s, t(200), false);
        }
        let v = r.finish_round(&me, &active, t(200), &o).unwrap();
        assert_eq!((v.majority, v.reached, v.active), (false, 2, 5));
        assert_eq!(v.pending, vec![(silo(3), None), (silo(4), Some(silo(2)))]);
        assert!(!r.round_running());
    }

    #[test]
    fn a_majority_round_says_yes() {
        let o = ClusterMembershipOptions::fast();
        let (me, active): (SiloAddress, Vec<_>) = (silo(1), (1..=5).map(silo).collect());
        let mut r = Reach::default();
        r.start_round(&[(7, silo(2)), (8, silo(3)), (9, silo(4))], (silo(5), None));
        assert!(r.on_round_result(7, &silo(2)));
        r.record(silo(2), t(10), true);
        assert!(r.finish_round(&me, &active, t(10), &o).is_none(), "2 of 5, 2 out");
        assert!(r.on_round_result(8, &silo(3)));
        r.record(silo(3), t(10), true);
        let v = r.finish_round(&me, &active, t(10), &o).unwrap();
        assert!(v.majority, "3 of 5 without waiting for the last ping");
        assert_eq!(v.reached, 3);
        assert!(!r.on_round_result(9, &silo(4)), "the round is over");
    }
}

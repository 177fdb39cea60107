//! Property tests of the model and the sans-io protocol core.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use proptest::prelude::*;
use rollcall_core::protocol::targets::select_probe_targets;
use rollcall_core::protocol::votes::{decide_vote, fresh_votes, required_votes, VoteDecision};
use rollcall_core::{
    hash_in_range, ClusterMembershipOptions, Etag, MembershipEntry, MembershipSnapshot, SiloAddress,
    SiloStatus, SuspectVote, Timestamp,
};

fn silo(n: u32) -> SiloAddress {
    SiloAddress::new(SocketAddr::from((Ipv4Addr::from(0x0a00_0000 + n), 11111)), 1)
}

const NOW: u64 = 1_795_000_000_000;

proptest! {
    #[test]
    fn silo_address_text_round_trips(ip in any::<u32>(), port in any::<u16>(), generation in any::<u64>()) {
        let a = SiloAddress::new(SocketAddr::from((Ipv4Addr::from(ip), port)), generation);
        prop_assert_eq!(a.to_string().parse::<SiloAddress>().unwrap(), a);
    }

    #[test]
    fn garbage_never_panics_the_parsers(s in ".{0,40}") {
        let _ = s.parse::<SiloAddress>();
        let _ = s.parse::<Timestamp>();
        let _ = s.parse::<SiloStatus>();
    }

    #[test]
    fn timestamps_round_trip(ms in 0u64..253_402_300_799_000) {
        let t = Timestamp::from_millis(ms);
        prop_assert_eq!(t.to_string().parse::<Timestamp>().unwrap(), t);
    }

    #[test]
    fn hash_range_matches_its_definition(h in any::<u32>(), b in any::<u32>(), e in any::<u32>()) {
        let expected = if b < e { b < h && h <= e } else { h > b || h <= e };
        prop_assert_eq!(hash_in_range(h, b, e), expected);
        // A range and its complement partition the ring (unless it is the whole ring).
        if b != e {
            prop_assert_ne!(hash_in_range(h, b, e), hash_in_range(h, e, b));
        }
    }

    #[test]
    fn probe_targets_are_distinct_bounded_and_never_self(n in 1u32..60, k in 1u32..12, me in 0u32..60) {
        let me = silo(me % n);
        let now = Timestamp::from_millis(NOW);
        let mut snap = MembershipSnapshot::default();
        for i in 0..n {
            let e = MembershipEntry::new(silo(i), SiloStatus::Active, now);
            snap.insert(e, Etag::new("e"));
        }
        let o = ClusterMembershipOptions { num_probed_silos: k, num_votes_for_death_declaration: 1, ..Default::default() };
        let t = select_probe_targets(&me, &snap, now, &o);
        prop_assert!(!t.contains(&me));
        prop_assert_eq!(t.iter().collect::<BTreeSet<_>>().len(), t.len());
        prop_assert_eq!(t.len(), (k as usize).min(n as usize - 1));
    }

    #[test]
    fn vote_decisions_respect_the_quorum(
        ages in proptest::collection::vec((0u32..20, 0u64..300_000), 0..8),
        voter in 20u32..25,
        active in 0usize..12,
        votes_needed in 1u32..5,
    ) {
        let o = ClusterMembershipOptions { num_votes_for_death_declaration: votes_needed, ..Default::default() };
        let now = Timestamp::from_millis(NOW);
        let mut suspect = MembershipEntry::new(silo(99), SiloStatus::Active, now);
        for (who, age_ms) in &ages {
            suspect.suspect_votes.push(SuspectVote { silo: silo(*who), time: now.saturating_sub(Duration::from_millis(*age_ms)) });
        }
        let me = silo(voter);
        let required = required_votes(active, &o);
        match decide_vote(&suspect, &me, None, now, active, &o) {
            VoteDecision::AlreadyDead => prop_assert!(false, "suspect was Active"),
            VoteDecision::Vote(row) => {
                prop_assert!(row.suspect_votes.len() < required);
                prop_assert_eq!(row.status, SiloStatus::Active);
                check_votes(&row, &me, now, &o)?;
            }
            VoteDecision::DeclareDead(row) => {
                prop_assert!(row.suspect_votes.len() >= required);
                prop_assert_eq!(row.status, SiloStatus::Dead);
                check_votes(&row, &me, now, &o)?;
            }
        }
        suspect.status = SiloStatus::Dead;
        prop_assert_eq!(decide_vote(&suspect, &me, None, now, active, &o), VoteDecision::AlreadyDead);
    }
}

fn check_votes(
    row: &MembershipEntry,
    me: &SiloAddress,
    now: Timestamp,
    o: &ClusterMembershipOptions,
) -> Result<(), TestCaseError> {
    let voters: BTreeSet<_> = row.suspect_votes.iter().map(|v| v.silo).collect();
    prop_assert_eq!(voters.len(), row.suspect_votes.len(), "one vote per voter");
    prop_assert!(
        row.suspect_votes.iter().any(|v| v.silo == *me && v.time == now),
        "own vote present"
    );
    prop_assert!(
        row.suspect_votes.len() <= o.num_votes_for_death_declaration as usize,
        "bounded"
    );
    prop_assert_eq!(
        fresh_votes(row, now, o).len(),
        row.suspect_votes.len(),
        "only fresh votes kept"
    );
    Ok(())
}

//! Defunct-row cleanup (Orleans `DefunctSiloExpiration`, `MaxDefunctSiloEntries`).

use crate::{ClusterMembershipOptions, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp};

/// The cutoff for [`MembershipTable::cleanup_defunct`](crate::MembershipTable::cleanup_defunct)
/// if `me` should run the cleanup now, else `None`.
///
/// Only the first Active silo by address runs it, so one cluster issues one cleanup
/// per period. Dead rows older than `defunct_silo_expiration` go; and when more than
/// `max_defunct_silo_entries` Dead rows exist, the cutoff moves up so only the newest
/// that many are kept.
pub fn defunct_cutoff(
    me: &SiloAddress,
    snapshot: &MembershipSnapshot,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> Option<Timestamp> {
    if snapshot.active().map(|e| e.silo).next() != Some(*me) {
        return None;
    }
    let mut cutoff = now.saturating_sub(options.defunct_silo_expiration);
    let mut dead: Vec<Timestamp> = snapshot
        .rows()
        .filter(|e| e.status == SiloStatus::Dead)
        .map(|e| e.last_alive())
        .collect();
    dead.sort_unstable_by(|a, b| b.cmp(a)); // newest first
    let keep = options.max_defunct_silo_entries as usize;
    if dead.len() > keep {
        if let Some(oldest_kept) = dead.get(keep.saturating_sub(1)) {
            cutoff = cutoff.max(*oldest_kept);
        }
    }
    Some(cutoff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Etag, MembershipEntry};
    use std::time::Duration;

    #[test]
    fn only_the_first_active_silo_cleans_and_the_newest_are_kept() {
        let now = Timestamp::from_millis(10_000_000);
        let o = ClusterMembershipOptions {
            max_defunct_silo_entries: 2,
            defunct_silo_expiration: Duration::from_secs(3600),
            ..Default::default()
        };
        let mut snap = MembershipSnapshot::default();
        let silo = |n: u8| -> SiloAddress { format!("10.0.0.{n}:1@1").parse().unwrap() };
        for n in 1..=2 {
            let e = MembershipEntry::new(silo(n), SiloStatus::Active, now);
            snap.entries.insert(e.silo, (e, Etag::new("e")));
        }
        for (n, age) in [(5u8, 10u64), (6, 20), (7, 30)] {
            let e = MembershipEntry::new(
                silo(n),
                SiloStatus::Dead,
                now.saturating_sub(Duration::from_secs(age)),
            );
            snap.entries.insert(e.silo, (e, Etag::new("e")));
        }
        assert_eq!(defunct_cutoff(&silo(2), &snap, now, &o), None);
        // 3 Dead rows, 2 kept: the cutoff is the second newest (20 s old): strictly
        // older rows (the 30 s one) go.
        assert_eq!(
            defunct_cutoff(&silo(1), &snap, now, &o),
            Some(now.saturating_sub(Duration::from_secs(20)))
        );
    }
}

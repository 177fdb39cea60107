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
    Some(cutoff.min(now.saturating_sub(lost_row_grace(options))))
}

/// How recently a row must have shown a sign of life for the defunct cleanup to leave
/// it alone: half of `defunct_silo_expiration`, but at most
/// `max(10 × table_refresh_timeout, 1 h)`.
///
/// A silo reads its own row at least every `table_refresh_timeout`. If the row is
/// missing while the silo saw it alive less than this long ago, the cleanup cannot
/// have deleted it, so the table lost it (restarted empty, restored from an old
/// backup, cluster deleted) and the silo writes it again instead of stopping.
pub fn lost_row_grace(options: &ClusterMembershipOptions) -> std::time::Duration {
    let cap = (options.table_refresh_timeout * 10).max(std::time::Duration::from_secs(3600));
    (options.defunct_silo_expiration / 2).min(cap)
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
            defunct_silo_expiration: Duration::from_secs(24 * 3600),
            ..Default::default()
        };
        let mut snap = MembershipSnapshot::default();
        let silo = |n: u8| -> SiloAddress { format!("10.0.0.{n}:1@1").parse().unwrap() };
        for n in 1..=2 {
            let e = MembershipEntry::new(silo(n), SiloStatus::Active, now);
            snap.insert(e, Etag::new("e"));
        }
        let hours = |h: u64| Duration::from_secs(h * 3600);
        for (n, age) in [
            (5u8, hours(2)),
            (6, hours(3)),
            (7, hours(4)),
            (8, Duration::from_secs(60)),
        ] {
            let e = MembershipEntry::new(silo(n), SiloStatus::Dead, now.saturating_sub(age));
            snap.insert(e, Etag::new("e"));
        }
        assert_eq!(defunct_cutoff(&silo(2), &snap, now, &o), None);
        // 4 Dead rows, 2 kept: the cutoff moves up to the second newest (2 h old):
        // strictly older rows (3 h, 4 h) go.
        assert_eq!(
            defunct_cutoff(&silo(1), &snap, now, &o),
            Some(now.saturating_sub(hours(2)))
        );
        // With 1 kept, the cutoff would be the 1-minute-old row, but rows alive within
        // the lost-row grace (1 h here) are never removed.
        assert_eq!(lost_row_grace(&o), hours(1));
        let one = ClusterMembershipOptions {
            max_defunct_silo_entries: 1,
            ..o.clone()
        };
        assert_eq!(
            defunct_cutoff(&silo(1), &snap, now, &one),
            Some(now.saturating_sub(hours(1)))
        );
    }
}

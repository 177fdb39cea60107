//! Reminder service scenarios: silos on a simulated network in virtual time on the
//! memory table (1-8), and real silos on real TCP against every implemented
//! provider (9).

use std::collections::BTreeMap;
use std::time::Duration;

use rollcall_membership_core::{ReminderOptions, Timestamp};
use rollcall_reminders::schedule::occurrence_after;
use rollcall_tests::reminders::{actor, ReminderCluster};
use rollcall_tests::sim::run_virtual;

const MINUTE: Duration = Duration::from_secs(60);

/// The occurrences of a reminder starting at `start` every `period` in `[from, to]`.
fn occurrences(start: Timestamp, period: Duration, from: Timestamp, to: Timestamp) -> Vec<Timestamp> {
    let mut out = Vec::new();
    let mut t = if from <= start {
        start
    } else {
        occurrence_after(start, Some(period), from.saturating_sub(Duration::from_millis(1))).unwrap()
    };
    while t <= to {
        out.push(t);
        t = t.saturating_add(period);
    }
    out
}

#[test]
fn r01_three_silos_300_reminders_tick_exactly_once_per_period_for_30_minutes() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(3).await;
        let mut starts = BTreeMap::new();
        for i in 0..300 {
            // Registered through every silo; first ticks spread over a minute.
            let svc = &c.services[i % 3];
            let due = Duration::from_millis((i as u64 * 197) % 60_000);
            let h = svc
                .register_or_update(&actor(i), "tick", due, MINUTE)
                .await
                .expect("register");
            starts.insert((h.actor.to_string(), h.name.clone()), h.start_at);
        }
        let begin = c.now();
        tokio::time::sleep(30 * MINUTE).await;
        let end = c.now().saturating_sub(Duration::from_secs(1));
        let got = c.scheduled_by_reminder();
        assert!(
            c.duplicates().is_empty(),
            "duplicates: {:?}",
            &c.duplicates()[..5.min(c.duplicates().len())]
        );
        for (key, start) in &starts {
            let expected = occurrences(*start, MINUTE, begin, end);
            let seen: Vec<Timestamp> = got.get(key).cloned().unwrap_or_default();
            let seen: Vec<Timestamp> = seen.into_iter().filter(|t| *t <= end).collect();
            assert_eq!(seen, expected, "reminder {key:?}");
        }
        // In steady state each reminder ticks on the silo that owns it.
        for d in c
            .ticks()
            .into_iter()
            .filter(|d| d.tick.now > begin.saturating_add(MINUTE))
        {
            assert_eq!(Some(d.silo), c.services[0].owner_of(&d.tick.actor));
        }
        let stats: Vec<_> = c.services.iter().map(|s| s.stats()).collect();
        assert_eq!(stats.iter().map(|s| s.owned).sum::<u64>(), 300, "{stats:?}");
        assert!(
            stats.iter().all(|s| s.owned > 0),
            "every silo owns some: {stats:?}"
        );
        assert_eq!(stats.iter().map(|s| s.delivery_failures).sum::<u64>(), 0);
    });
}

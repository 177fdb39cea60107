//! Reminder service scenarios: silos on a simulated network in virtual time on the
//! memory table (1-8), and real silos on real TCP against every implemented
//! provider (9).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rollcall_core::{ReminderOptions, Timestamp};
use rollcall_reminders::schedule::Timing;
use rollcall_tests::reminders::{actor, ReminderCluster};
use rollcall_tests::sim::run_virtual;

const MINUTE: Duration = Duration::from_secs(60);

/// The occurrences of a reminder starting at `start` every `period` in `[from, to]`.
fn occurrences(start: Timestamp, period: Duration, from: Timestamp, to: Timestamp) -> Vec<Timestamp> {
    let mut out = Vec::new();
    let mut t = if from <= start {
        start
    } else {
        let row = rollcall_core::ReminderEntry::new("svc", "a/1", "r", start, Some(period));
        let timing = Timing::of(&row).expect("a periodic schedule");
        timing
            .after(from.saturating_sub(Duration::from_millis(1)))
            .unwrap()
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

/// Detection bound of the default options (as in the cluster scenarios): missed
/// probes, two table writes and a gossip round.
/// How long after a kill a survivor may hold a shard it took over without a
/// checkpoint of its own (detection, the lease period, the clock bound, a
/// poll and 2 s for the write): a kill within it repeats from the earlier
/// victim's checkpoint (`checkpoint_windows`).
fn failover_chain() -> Duration {
    let o = ReminderOptions::default();
    detection_bound()
        + o.lease_period
        + rollcall_core::ClusterMembershipOptions::default().max_clock_offset
        + o.lease_poll
        + Duration::from_secs(2)
}

fn detection_bound() -> Duration {
    let o = rollcall_core::ClusterMembershipOptions::default();
    o.probe_timeout * o.num_missed_probes_limit + Duration::from_secs(3)
}

/// Actors `cart/<i>` whose reminders `owner` owns in `svc`'s view, `n` of them.
fn actors_owned_by(
    svc: &rollcall_reminders::Reminders,
    owner: rollcall_core::SiloAddress,
    n: usize,
) -> Vec<rollcall_reminders::ActorId> {
    (0..)
        .map(actor)
        .filter(|a| svc.owner_of(a) == Some(owner))
        .take(n)
        .collect()
}

#[test]
fn r02_reminders_of_a_killed_owner_resume_on_survivors_repeating_only_since_the_checkpoint() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(3).await;
        let victim = c.sim.silos[0].clone();
        let owned = actors_owned_by(&c.services[1], victim.address(), 100);
        for (i, a) in owned.iter().enumerate() {
            let due = Duration::from_millis((i as u64 * 577) % 60_000);
            c.services[1]
                .register_or_update(a, "tick", due, MINUTE)
                .await
                .expect("register");
        }
        tokio::time::sleep(3 * MINUTE).await;
        assert!(
            c.ticks().iter().all(|d| d.silo == victim.address()),
            "the owner delivers"
        );
        let killed_at = c.now();
        let (_, detected) = c.sim.kill_and_await_dead(0, 2 * detection_bound()).await;
        assert!(detected <= detection_bound(), "detected in {detected:?}");
        tokio::time::sleep(3 * MINUTE).await;
        let first_on_survivor: BTreeMap<String, Timestamp> = c
            .ticks()
            .iter()
            .filter(|d| d.silo != victim.address())
            .fold(BTreeMap::new(), |mut m, d| {
                m.entry(d.tick.actor.to_string()).or_insert(d.tick.now);
                m
            });
        assert_eq!(
            first_on_survivor.len(),
            100,
            "every reminder resumed on a survivor"
        );
        // Resumed within detection + the lease period and a poll (the
        // successor's wait after it saw the victim Dead) + the next occurrence
        // (1 period) + the load.
        let o = ReminderOptions::default();
        let bound = detection_bound() + o.lease_period + o.lease_poll + MINUTE + Duration::from_secs(1);
        for (a, t) in &first_on_survivor {
            let took = t.saturating_duration_since(killed_at);
            assert!(took <= bound, "{a} resumed after {took:?} > {bound:?}");
        }
        // Repeated: only what the victim delivered after its last checkpoint
        // (the survivors owe from there, issue 70's item 2).
        let repeated: Vec<_> = c
            .duplicates()
            .into_iter()
            .filter(|(_, t)| !rollcall_tests::reminders::checkpoint_repeat(killed_at, *t))
            .collect();
        assert!(
            repeated.is_empty(),
            "repeated outside the checkpoint window: {repeated:?}"
        );
        // Nothing from the victim after it was killed.
        assert!(c
            .ticks()
            .iter()
            .all(|d| d.silo != victim.address() || d.tick.now <= killed_at));
    });
}

#[test]
fn r03_a_joining_silo_takes_its_ranges_and_the_old_owners_stop() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(2).await;
        for i in 0..200 {
            let due = Duration::from_millis((i as u64 * 311) % 60_000);
            c.services[i % 2]
                .register_or_update(&actor(i), "tick", due, MINUTE)
                .await
                .expect("register");
        }
        tokio::time::sleep(2 * MINUTE).await;
        let joined = c.start(3, 1).await.expect("third silo joins");
        let joined_at = c.now();
        tokio::time::sleep(5 * MINUTE).await;
        let newcomer = c.sim.silos[2].address();
        let moved: BTreeSet<String> = (0..200)
            .map(actor)
            .filter(|a| joined.owner_of(a) == Some(newcomer))
            .map(|a| a.to_string())
            .collect();
        assert!(!moved.is_empty() && moved.len() < 200, "{} moved", moved.len());
        let settled = joined_at.saturating_add(MINUTE);
        for d in c.ticks().iter().filter(|d| d.tick.now > settled) {
            let expected = joined.owner_of(&d.tick.actor).expect("owner");
            assert_eq!(
                d.silo, expected,
                "{} ticked on a silo that no longer owns it",
                d.tick.actor
            );
        }
        let on_newcomer: BTreeSet<String> = c
            .ticks()
            .iter()
            .filter(|d| d.silo == newcomer)
            .map(|d| d.tick.actor.to_string())
            .collect();
        assert_eq!(on_newcomer, moved);
        assert!(c.duplicates().is_empty(), "duplicates: {:?}", c.duplicates());
        // Every reminder kept ticking every minute across the move: no occurrence
        // missed after the join settled.
        let end = c.now().saturating_sub(Duration::from_secs(1));
        for (key, times) in c.scheduled_by_reminder() {
            let after: Vec<_> = times.into_iter().filter(|t| *t > settled && *t <= end).collect();
            assert!(
                after.len() >= 3,
                "{key:?} ticked {} times after the join",
                after.len()
            );
            assert!(
                after
                    .windows(2)
                    .all(|w| w[1].saturating_duration_since(w[0]) == MINUTE),
                "{key:?}: {after:?}"
            );
        }
    });
}

#[test]
fn r04_a_lost_registration_notice_is_covered_by_the_next_refresh() {
    run_virtual(|| async {
        let options = ReminderOptions::default();
        let refresh = options.refresh_reminder_list_period;
        let mut c = ReminderCluster::new(options);
        c.start_many(2).await;
        // Written straight to the table: no notice at all, as if it were lost.
        let table = rollcall_core::SystemStore::reminder_table(&c.sim.store, "svc").expect("table");
        let written_at = c.now();
        let entry = rollcall_core::ReminderEntry::new(
            "svc",
            actor(1).to_string(),
            "silent",
            written_at.saturating_add(Duration::from_secs(10)),
            Some(MINUTE),
        );
        table.upsert_row(&entry).await.expect("upsert");
        let ticked = rollcall_tests::sim::wait_for(refresh + 2 * MINUTE, || !c.ticks().is_empty()).await;
        let took = ticked.expect("the reminder ticks after the next refresh");
        assert!(
            took <= refresh + MINUTE + Duration::from_secs(1),
            "first tick after {took:?}"
        );
        assert!(c.services.iter().map(|s| s.stats().notices).sum::<u64>() == 0);
    });
}

/// Registers `cart/0..100` with 1-min periods through the three silos in turn,
/// first ticks spread over a minute (`step` ms apart, modulo); even ones
/// `FireOnce`, odd ones `Skip`.
async fn register_half_fire_once(c: &ReminderCluster, step: u64) {
    for i in 0..100 {
        let policy = if i % 2 == 0 {
            rollcall_core::MissedTickPolicy::FireOnce
        } else {
            rollcall_core::MissedTickPolicy::Skip
        };
        let spec = rollcall_reminders::ReminderSpec::every(
            Duration::from_millis((i as u64 * step) % 60_000),
            MINUTE,
        )
        .with_policy(policy);
        c.services[i % 3]
            .register(&actor(i), "tick", spec)
            .await
            .expect("register");
    }
}

#[test]
fn r05_fire_once_catches_up_once_after_a_full_cluster_outage_and_skip_does_not() {
    run_virtual(|| async {
        let options = ReminderOptions {
            startup_jitter: Duration::from_secs(10),
            ..ReminderOptions::default()
        };
        let mut c = ReminderCluster::new(options.clone());
        c.start_many(3).await;
        register_half_fire_once(&c, 599).await;
        tokio::time::sleep(5 * MINUTE).await;
        // Full outage: every silo leaves; nobody delivers for 10 minutes.
        for s in c.sim.silos.clone() {
            s.stop().await.expect("stop");
        }
        let down_at = c.now();
        let before = c.ticks().len();
        tokio::time::sleep(10 * MINUTE).await;
        assert_eq!(c.ticks().len(), before, "no ticks while the cluster is down");
        let up_at = c.now();
        for n in 1..=3 {
            c.start(n, 2).await.expect("restart");
        }
        tokio::time::sleep(3 * MINUTE).await;
        for i in 0..100 {
            let a = actor(i).to_string();
            let after: Vec<_> = c
                .ticks()
                .into_iter()
                .filter(|d| d.tick.actor.to_string() == a && d.tick.now >= up_at)
                .collect();
            // A catch-up tick is a late one (virtual time delivers the others
            // exactly on time). It stands for the last occurrence before the
            // takeover time, which may fall after the restart: the takeover
            // waits a lease period, and the catch-up can be one shard's
            // exception, passed on and delivered less than a second late.
            let catch_up: Vec<_> = after.iter().filter(|d| d.tick.now > d.tick.scheduled).collect();
            if i % 2 == 0 {
                assert_eq!(
                    catch_up.len(),
                    1,
                    "{a}: FireOnce delivers exactly one catch-up: {after:?}"
                );
                let t = &catch_up[0].tick;
                assert!(
                    t.scheduled > down_at,
                    "{a}: the catch-up stands for the last missed occurrence"
                );
                assert!(
                    t.now.saturating_duration_since(up_at)
                        <= options.startup_jitter + Duration::from_secs(60),
                    "{a}: catch-up within the start-up jitter"
                );
            } else {
                assert!(
                    catch_up.is_empty(),
                    "{a}: Skip delivers no catch-up: {catch_up:?}"
                );
            }
            assert!(after.len() >= 2, "{a}: ticks continue on schedule");
        }
        assert!(c.duplicates().is_empty(), "duplicates: {:?}", c.duplicates());
    });
}

#[test]
fn r06_one_shot_reminders_fire_once_and_their_rows_are_removed() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(3).await;
        for i in 0..50 {
            c.services[i % 3]
                .register_once(&actor(i), "once", Duration::from_secs(30 + i as u64))
                .await
                .expect("register");
        }
        let table = rollcall_core::SystemStore::reminder_table(&c.sim.store, "svc").expect("table");
        assert_eq!(table.read_rows_in_range(0, 0).await.unwrap().len(), 50);
        let done = rollcall_tests::sim::wait_for(3 * MINUTE, || c.ticks().len() >= 50).await;
        assert!(done.is_some(), "all 50 fired: {}", c.ticks().len());
        let gone = rollcall_tests::sim::wait_for(MINUTE, || {
            poll_once(table.read_rows_in_range(0, 0)).is_some_and(|r| r.is_ok_and(|rows| rows.is_empty()))
        })
        .await;
        assert!(gone.is_some(), "one-shot rows are removed after delivery");
        tokio::time::sleep(10 * MINUTE).await;
        assert_eq!(c.ticks().len(), 50, "each fired exactly once");
        for d in c.ticks() {
            assert_eq!(d.tick.period, None);
            assert_eq!(d.tick.scheduled, d.tick.first_tick);
        }
    });
}

/// Polls a future once (memory-table calls complete at once).
fn poll_once<F: std::future::Future>(f: F) -> Option<F::Output> {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[test]
fn r07_handles_get_and_updates() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(2).await;
        let svc = c.services[0].clone();
        let a = actor(7);
        assert!(svc.get(&a, "nope").await.expect("get").is_none());
        let first = svc
            .register_or_update(&a, "r", Duration::from_secs(10), MINUTE)
            .await
            .expect("register");
        assert_eq!(svc.get(&a, "r").await.unwrap().unwrap(), first);
        tokio::time::sleep(3 * MINUTE).await;
        let before_update = c.ticks().len();
        assert!(before_update >= 3, "{before_update}");
        // Update: new start and period.
        let updated_at = c.now();
        let second = svc
            .register_or_update(&a, "r", Duration::from_secs(30), 2 * MINUTE)
            .await
            .expect("update");
        assert_ne!(first.etag, second.etag);
        assert_eq!(svc.list(&a).await.unwrap(), vec![second.clone()]);
        // The old handle is stale and cannot remove the new registration.
        let stale = svc.unregister(&first).await;
        assert!(
            matches!(stale, Err(rollcall_reminders::ReminderError::StaleHandle { .. })),
            "{stale:?}"
        );
        assert!(svc.get(&a, "r").await.unwrap().is_some());
        tokio::time::sleep(7 * MINUTE).await;
        let after: Vec<_> = c
            .ticks()
            .into_iter()
            .filter(|d| d.tick.now > updated_at)
            .collect();
        assert!(after.len() >= 3, "{after:?}");
        for d in &after {
            assert_eq!(d.tick.first_tick, second.start_at, "only the new schedule ticks");
            assert_eq!(d.tick.period, Some(2 * MINUTE));
            assert_eq!(
                d.tick
                    .scheduled
                    .saturating_duration_since(second.start_at)
                    .as_secs()
                    % 120,
                0
            );
        }
        assert_eq!(
            after[0].tick.scheduled, second.start_at,
            "the new start is honoured"
        );
        // Unregister with the current handle; again is Ok; no more ticks.
        svc.unregister(&second).await.expect("unregister");
        svc.unregister(&second).await.expect("already gone is Ok");
        let n = c.ticks().len();
        tokio::time::sleep(5 * MINUTE).await;
        assert_eq!(c.ticks().len(), n, "no tick after unregister");
        // Bad input: typed errors.
        assert!(matches!(
            svc.register_or_update(&a, "fast", Duration::ZERO, Duration::from_secs(1))
                .await,
            Err(rollcall_reminders::ReminderError::PeriodTooShort { .. })
        ));
        assert!(matches!(
            svc.register_or_update(&a, "", Duration::ZERO, MINUTE).await,
            Err(rollcall_reminders::ReminderError::InvalidName(_))
        ));
    });
}

#[test]
fn r08_table_outage_loses_no_tick_duplicates_none_and_bounds_work() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(3).await;
        register_half_fire_once(&c, 613).await;
        tokio::time::sleep(3 * MINUTE).await;
        let before: Vec<_> = c.services.iter().map(|s| s.stats()).collect();
        let out_at = c.now();
        c.sim.store.set_unavailable(true);
        tokio::time::sleep(10 * MINUTE).await;
        let during: Vec<_> = c.services.iter().map(|s| s.stats()).collect();
        c.sim.store.set_unavailable(false);
        let back_at = c.now();
        tokio::time::sleep(3 * MINUTE).await;
        let end = c.now().saturating_sub(Duration::from_secs(1));
        assert!(c.duplicates().is_empty(), "duplicates: {:?}", c.duplicates());
        // Every occurrence during and after the outage was delivered.
        for (key, times) in c.scheduled_by_reminder() {
            let window: Vec<_> = times
                .iter()
                .copied()
                .filter(|t| *t > out_at && *t <= end)
                .collect();
            let expected = (end.as_millis() - out_at.as_millis()) / 60_000;
            assert!(
                window.len() as u64 >= expected,
                "{key:?}: {} of {expected} ticks during/after the outage",
                window.len()
            );
        }
        // Bounded work: failed writes are retried on a backoff, not in a loop.
        for (b, d) in before.iter().zip(&during) {
            let write_failures = d.write_failures - b.write_failures;
            let load_failures = d.load_failures - b.load_failures;
            assert!(
                write_failures <= 16 * 20,
                "{write_failures} failed writes in 10 minutes"
            );
            assert!(
                load_failures <= 10 * 60 / 5 + 5,
                "{load_failures} failed loads in 10 minutes"
            );
        }
        // After the outage the FireOnce reminders' last_fired times are recorded.
        let table = rollcall_core::SystemStore::reminder_table(&c.sim.store, "svc").expect("table");
        let rows = table.read_rows_in_range(0, 0).await.unwrap();
        for r in rows
            .iter()
            .filter(|r| r.missed_tick_policy == rollcall_core::MissedTickPolicy::FireOnce)
        {
            let last = r.last_fired.expect("recorded");
            assert!(
                last > back_at,
                "{}: last_fired {last} recorded after the outage",
                r.actor_id
            );
        }
    });
}

/// Scenario 1 in real time on real TCP against `store`: 3 silos, 30 reminders with
/// 1-s periods for 6 s; every occurrence is delivered exactly once, on its owner.
async fn real_time_exactly_once(store: rollcall_tests::Store) {
    use rollcall_core::{ClusterMembershipOptions, OnDeclaredDead, Silo};
    let cluster = rollcall_tests::unique_id("rt");
    let service = rollcall_tests::unique_id("rt-svc");
    let membership = ClusterMembershipOptions {
        probe_timeout: Duration::from_millis(400),
        table_refresh_timeout: Duration::from_secs(5),
        i_am_alive_publish_period: Duration::from_secs(2),
        ..Default::default()
    };
    let options = ReminderOptions {
        minimum_period: Duration::from_secs(1),
        refresh_reminder_list_period: Duration::from_secs(5),
        loading_window: Duration::from_secs(60),
        startup_jitter: Duration::ZERO,
        ..ReminderOptions::default()
    };
    let log = rollcall_tests::reminders::Log::default();
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for _ in 0..3 {
        let silo = Silo::builder(store.clone(), cluster.clone())
            .listen("127.0.0.1:0".parse().unwrap())
            .options(membership.clone())
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await
            .expect("silo joins");
        let recorder =
            actix::Actor::start(rollcall_tests::reminders::Recorder::new(silo.address(), &log)).recipient();
        let svc = rollcall_reminders::Reminders::builder(&silo, store.clone())
            .service_id(service.clone())
            .target(move |_: &rollcall_reminders::ActorId| Some(recorder.clone()))
            .options(options.clone())
            .start()
            .await
            .expect("reminders start");
        silos.push(silo);
        services.push(svc);
    }
    // Every silo sees all three before registering (owners agree).
    let agreed = rollcall_tests::sim::wait_for(Duration::from_secs(10), || {
        silos.iter().all(|s| s.snapshot().active().count() == 3)
    })
    .await;
    assert!(agreed.is_some(), "silos agree on membership");
    let mut starts = BTreeMap::new();
    for i in 0..30 {
        let due = Duration::from_millis(500 + (i as u64 * 37) % 1000);
        let h = services[i % 3]
            .register_or_update(&actor(i), "tick", due, Duration::from_secs(1))
            .await
            .expect("register");
        starts.insert(h.actor.to_string(), h.start_at);
    }
    let begin = Timestamp::now();
    // Wait until every reminder ticked past `cutoff`, then compare what came before.
    let cutoff = begin.saturating_add(Duration::from_millis(4500));
    let past_cutoff = |ticks: &[rollcall_tests::reminders::Delivered]| {
        starts.keys().all(|a| {
            ticks
                .iter()
                .any(|d| d.tick.actor.to_string() == *a && d.tick.scheduled > cutoff)
        })
    };
    let done =
        rollcall_tests::sim::wait_for(Duration::from_secs(15), || past_cutoff(&log.lock().unwrap())).await;
    assert!(done.is_some(), "every reminder ticks past {cutoff}");
    let ticks = log.lock().unwrap().clone();
    for (a, start) in &starts {
        let mut seen: Vec<Timestamp> = ticks
            .iter()
            .filter(|d| d.tick.actor.to_string() == *a)
            .map(|d| d.tick.scheduled)
            .collect();
        let total = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), total, "{a}: a scheduled time delivered twice");
        // Every tick is on the schedule. A first tick may fall due while later
        // registrations still run (slow stores, containers): it is delivered, and
        // the exact count is compared from `begin`, when every row exists.
        let period = Duration::from_secs(1);
        let off: Vec<_> = seen
            .iter()
            .filter(|t| {
                **t < *start || t.saturating_duration_since(*start).as_millis() % period.as_millis() != 0
            })
            .collect();
        assert!(
            off.is_empty(),
            "{a}: ticks off its schedule from {start}: {off:?}"
        );
        let expected = occurrences(*start, period, begin, cutoff);
        let delivered: Vec<_> = seen.into_iter().filter(|t| *t >= begin && *t <= cutoff).collect();
        assert_eq!(delivered, expected, "{a}");
    }
    for d in &ticks {
        assert_eq!(
            Some(d.silo),
            services[0].owner_of(&d.tick.actor),
            "ticked on its owner"
        );
    }
    for s in &silos {
        s.kill();
    }
}

/// A burst of registrations five times the notice queue on one silo: every
/// reminder is scheduled and ticks exactly once per period, and the notices the
/// queue could not hold cost a few coalesced loads, not one load per notice (each
/// load reads every row the silo owns).
#[test]
fn r10_a_registration_burst_beyond_the_notice_queue_costs_a_few_loads() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(1).await;
        let n = 5 * rollcall_reminders::NOTICE_QUEUE;
        let service = c.services[0].clone();
        let loads_before = service.stats().loads;
        let started = c.now();
        let burst: Vec<_> = (0..n)
            .map(|i| {
                let service = service.clone();
                actix::spawn(async move {
                    let due = Duration::from_millis((i as u64 * 7919) % 60_000);
                    service
                        .register_or_update(&actor(i), "tick", due, MINUTE)
                        .await
                        .expect("register");
                })
            })
            .collect();
        for task in burst {
            task.await.expect("registration task");
        }
        let all = rollcall_tests::sim::wait_for(MINUTE, || service.stats().scheduled as usize == n).await;
        assert!(all.is_some(), "scheduled: {} of {n}", service.stats().scheduled);
        let loads = service.stats().loads - loads_before;
        assert!(
            loads <= (n / rollcall_reminders::NOTICE_BATCH) as u64,
            "{loads} loads for a burst of {n} registrations"
        );
        tokio::time::sleep(3 * MINUTE).await;
        let per = c.scheduled_by_reminder();
        assert_eq!(per.len(), n, "every reminder ticked");
        assert!(c.duplicates().is_empty(), "duplicates: {:?}", c.duplicates());
        let end = c.now();
        for (i, times) in (0..n).map(|i| (i, &per[&(actor(i).to_string(), "tick".to_owned())])) {
            let due = Duration::from_millis((i as u64 * 7919) % 60_000);
            // Registered within the burst: the first occurrence is at `due` after
            // the registration, which is at or after `started`.
            let expected = occurrences(started.saturating_add(due), MINUTE, started, end).len();
            assert!(
                times.len() + 1 >= expected && times.len() <= expected,
                "cart/{i}: {} ticks, expected about {expected}",
                times.len()
            );
        }
    });
}

#[actix::test]
async fn r09_real_time_on_real_tcp_memory() {
    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    real_time_exactly_once(store).await;
}

#[cfg(feature = "redis")]
#[actix::test]
async fn r09_real_time_on_real_tcp_redis() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    let store = rollcall::connect(&b.endpoint).await.expect("connect");
    real_time_exactly_once(store).await;
}

#[cfg(feature = "etcd")]
#[actix::test]
async fn r09_real_time_on_real_tcp_etcd() {
    let Some(b) = rollcall_tests::fixtures::etcd().await else {
        return;
    };
    let store = rollcall::connect(&format!("etcd://{}", b.endpoint))
        .await
        .expect("connect");
    real_time_exactly_once(store).await;
}

/// R11: the `metrics` series of a running cluster, read from a recorder: each
/// silo's view gauges say 3 Active and the table version; the table operations
/// counted include the joins' inserts; the reminder ticks counted equal the ticks
/// delivered, with one lateness sample each; the owned gauges add up to every
/// reminder.
#[test]
fn r11_metrics_series_count_what_the_cluster_did() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let delivered = metrics::with_local_recorder(&recorder, || {
        run_virtual(|| async {
            let mut c = ReminderCluster::new(ReminderOptions::default());
            c.start_many(3).await;
            for i in 0..30 {
                c.services[i % 3]
                    .register_or_update(&actor(i), "tick", Duration::from_secs(i as u64), MINUTE)
                    .await
                    .expect("register");
            }
            tokio::time::sleep(5 * MINUTE).await;
            c.ticks().len()
        })
    });
    assert!(delivered >= 120, "{delivered} ticks");
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut lateness_samples = 0;
    let mut active_gauges = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        let labels: BTreeMap<String, String> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        match value {
            DebugValue::Counter(n) => *sums.entry(name.clone()).or_default() += n as f64,
            DebugValue::Gauge(g) => {
                if name == "rollcall_silos" && labels.get("status").map(String::as_str) == Some("Active") {
                    active_gauges.push(g.into_inner());
                }
                *sums.entry(name.clone()).or_default() += g.into_inner();
            }
            DebugValue::Histogram(h) => {
                if name == "rollcall_reminder_tick_lateness_seconds" {
                    lateness_samples += h.len();
                }
                *sums.entry(name.clone()).or_default() += h.len() as f64;
            }
        }
        assert!(labels.contains_key("silo"), "{name} has no silo label");
    }
    assert_eq!(active_gauges, vec![3.0; 3], "each silo sees 3 Active");
    assert_eq!(
        sums.get("rollcall_reminder_ticks_total"),
        Some(&(delivered as f64))
    );
    assert_eq!(lateness_samples, delivered);
    assert_eq!(sums.get("rollcall_reminders_owned"), Some(&30.0));
    assert!(
        sums.get("rollcall_table_operations_total") >= Some(&6.0),
        "{sums:?}"
    );
    assert!(sums.get("rollcall_probes_total") > Some(&0.0), "{sums:?}");
    assert!(
        sums.get("rollcall_membership_table_version") >= Some(&6.0),
        "{sums:?}"
    );
}

/// Churn in virtual time: 4 silos, 200 reminders with 1-s periods; every 15 s the
/// oldest silo leaves (gracefully, or killed) and a new one joins, 8 times.
/// Returns the report over the whole run and the kill times.
async fn sim_churn(graceful: bool) -> (rollcall_tests::reminders::ChurnReport, Vec<Timestamp>) {
    use rollcall_tests::reminders::{churn_report, Occurrence};
    const SECOND: Duration = Duration::from_secs(1);
    let options = ReminderOptions {
        minimum_period: SECOND,
        ..ReminderOptions::default()
    };
    let mut c = ReminderCluster::new(options);
    c.start_many(4).await;
    let mut starts = BTreeMap::new();
    for i in 0..200 {
        let due = Duration::from_millis(2_000 + (i as u64 * 37) % 1_000);
        let h = c.services[i % 4]
            .register_or_update(&actor(i), "tick", due, SECOND)
            .await
            .expect("register");
        starts.insert((h.actor.to_string(), h.name.clone()), h.start_at);
    }
    let from = c.now().saturating_add(3 * SECOND);
    let mut kills = Vec::new();
    for next in 5..13 {
        tokio::time::sleep(15 * SECOND).await;
        let i = c
            .sim
            .silos
            .iter()
            .position(|s| !s.is_stopped())
            .expect("a running silo");
        kills.push(c.now());
        if graceful {
            c.sim.silos[i].shutdown().await.expect("graceful shutdown");
        } else {
            c.sim.silos[i].kill();
        }
        c.start(next, 1).await.expect("new silo joins");
    }
    tokio::time::sleep(15 * SECOND).await;
    let to = c.now().saturating_sub(3 * SECOND);
    let ticks: Vec<Occurrence> = c.ticks().iter().map(Occurrence::from).collect();
    (churn_report(&starts, SECOND, from, to, &ticks), kills)
}

#[test]
fn r12_graceful_leaves_and_joins_neither_repeat_nor_lose_a_tick() {
    run_virtual(|| async {
        let (report, _) = sim_churn(true).await;
        eprintln!("graceful churn: {report}");
        assert!(report.occurrences > 20_000, "{report}");
        report.assert_none_repeated_or_lost();
    });
}

#[test]
/// Crash churn with checkpoints (the default): nothing lost, and repeats
/// only of what a victim delivered after its last checkpoint (issue 70, item
/// 2; before checkpoints nothing repeated and each failover window's ticks
/// were skipped).
fn r13_crashes_lose_no_tick_and_repeat_only_since_the_last_checkpoint() {
    run_virtual(|| async {
        let (report, kills) = sim_churn(false).await;
        eprintln!("crash churn: {report}");
        report.assert_repeats_only_since_checkpoints(&kills, failover_chain());
        assert!(
            report.missed.is_empty(),
            "{report}: {:?}",
            &report.missed[..report.missed.len().min(10)]
        );
    });
}

/// Random churn schedules in virtual time, one per seed: 3 silos to start
/// with, 60 reminders with 1-s periods, then 6 events at random gaps of 0.2-6
/// s, so that some handoffs overlap: graceful leaves and joins (even seeds), or
/// leaves, crashes and joins (odd seeds). No schedule may lose an occurrence
/// or deliver one twice, but a crash may repeat what its victim delivered
/// after its last checkpoint (`checkpoint_repeat`).
///
/// Seeds 0..64, a quarter per test (each quarter takes about 50 s of one
/// core, so the four share the cores of a run); `ROLLCALL_CHURN_SEEDS=N`
/// runs seeds 0..N instead, `=A..B` seeds A..B, all in the first quarter's
/// test.
fn r14_random_churn_schedules(quarter: u64) {
    let seeds = match std::env::var("ROLLCALL_CHURN_SEEDS") {
        Ok(s) if quarter > 0 && !s.is_empty() => return,
        Ok(s) if !s.is_empty() => match s.split_once("..") {
            Some((a, b)) => a.parse().unwrap_or(0)..b.parse().unwrap_or(64),
            None => 0..s.parse().unwrap_or(64),
        },
        _ => quarter * 16..(quarter + 1) * 16,
    };
    churn_schedules(seeds);
}

#[test]
fn r14_random_churn_schedules_lose_no_tick_seeds_0_to_15() {
    r14_random_churn_schedules(0);
}

#[test]
fn r14_random_churn_schedules_lose_no_tick_seeds_16_to_31() {
    r14_random_churn_schedules(1);
}

#[test]
fn r14_random_churn_schedules_lose_no_tick_seeds_32_to_47() {
    r14_random_churn_schedules(2);
}

#[test]
fn r14_random_churn_schedules_lose_no_tick_seeds_48_to_63() {
    r14_random_churn_schedules(3);
}

/// The schedules of [`r14_random_churn_schedules`] for `seeds`.
fn churn_schedules(seeds: std::ops::Range<u64>) {
    use rand::{Rng, SeedableRng};
    use rollcall_tests::reminders::{churn_report, Occurrence};
    const SECOND: Duration = Duration::from_secs(1);
    let mut failures = Vec::new();
    for seed in seeds {
        let failure = run_virtual(|| async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let options = ReminderOptions {
                minimum_period: SECOND,
                ..ReminderOptions::default()
            };
            let mut c = ReminderCluster::new(options);
            c.sim = rollcall_tests::sim::SimCluster::with_seed(
                rollcall_core::ClusterMembershipOptions::default(),
                seed,
            );
            c.start_many(3).await;
            let mut starts = BTreeMap::new();
            for i in 0..60 {
                let due = Duration::from_millis(2_000 + (i as u64 * 17) % 1_000);
                let h = c.services[i % 3]
                    .register_or_update(&actor(i), "tick", due, SECOND)
                    .await
                    .expect("register");
                starts.insert((h.actor.to_string(), h.name.clone()), h.start_at);
            }
            let from = c.now().saturating_add(3 * SECOND);
            tokio::time::sleep(4 * SECOND).await;
            let mut kills = Vec::new();
            let mut events = Vec::new();
            let mut next = 4;
            for _ in 0..6 {
                let gap = Duration::from_millis(rng.random_range(200..6_000));
                tokio::time::sleep(gap).await;
                let running: Vec<usize> = (0..c.sim.silos.len())
                    .filter(|i| !c.sim.silos[*i].is_stopped())
                    .collect();
                // Even seeds: graceful leaves and joins only.
                let kinds = if seed % 2 == 0 { [0, 2, 2] } else { [0, 1, 2] };
                let kind = if running.len() <= 2 {
                    2
                } else {
                    kinds[rng.random_range(0..3)]
                };
                // A crash must leave a strict majority of the silos not yet declared
                // Dead running (kills within the last detection bound still count
                // as Active): without one the survivors wait for the victims'
                // IAmAlive to go stale (the partition rule), a failover window this
                // test does not assume; the membership machine tests cover it.
                let recent = kills
                    .iter()
                    .filter(|k: &&Timestamp| c.now().saturating_duration_since(**k) < detection_bound())
                    .count();
                let kind = if kind == 1 && (running.len() - 1) * 2 <= running.len() + recent {
                    2
                } else {
                    kind
                };
                match kind {
                    0 => {
                        let i = running[rng.random_range(0..running.len())];
                        events.push(format!("leave {i}"));
                        c.sim.silos[i].shutdown().await.expect("graceful shutdown");
                    }
                    1 => {
                        let i = running[rng.random_range(0..running.len())];
                        events.push(format!("crash {i} at {}", c.now().as_millis() % 1_000_000));
                        kills.push(c.now());
                        c.sim.silos[i].kill();
                    }
                    _ => {
                        events.push(format!("join {next}"));
                        c.start(next, 1).await.expect("joins");
                        next += 1;
                    }
                }
            }
            // Past the last kill's failover (its successor catches up from
            // the victim's checkpoint at its takeover time), then 15 s.
            let quiet = kills.last().map_or(Duration::ZERO, |k: &Timestamp| {
                k.saturating_add(failover_chain())
                    .saturating_duration_since(c.now())
            });
            tokio::time::sleep(quiet + 15 * SECOND).await;
            let to = c.now().saturating_sub(3 * SECOND);
            let ticks: Vec<Occurrence> = c.ticks().iter().map(Occurrence::from).collect();
            let report = churn_report(&starts, SECOND, from, to, &ticks);
            let mut failed = Vec::new();
            // A crash repeats only what its victim delivered after its last
            // checkpoint, and loses nothing (issue 70, item 2).
            let repeated = report.repeats_outside(&kills, failover_chain());
            if let (Some((key, _)), true) = (
                report.missed.first().or(repeated.first().copied()),
                std::env::var_os("ROLLCALL_CHURN_DEBUG").is_some(),
            ) {
                for d in c
                    .ticks()
                    .iter()
                    .filter(|d| (d.tick.actor.to_string(), d.tick.name.clone()) == *key)
                {
                    eprintln!(
                        "{key:?} scheduled {} sent {} on {}",
                        d.tick.scheduled, d.tick.now, d.silo
                    );
                }
            }
            if !repeated.is_empty() {
                failed.push(format!(
                    "{:?} repeated outside every kill's checkpoint window",
                    &repeated[..repeated.len().min(3)]
                ));
            }
            if !report.missed.is_empty() {
                failed.push(format!("{:?} lost", &report.missed[..report.missed.len().min(3)]));
            }
            eprintln!("seed {seed} {events:?}: {report}");
            (!failed.is_empty()).then(|| format!("seed {seed} {events:?}: {report}: {}", failed.join("; ")))
        });
        failures.extend(failure);
    }
    assert!(
        failures.is_empty(),
        "{} schedules failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The first silo to start a reminder service records its shard count; a silo
/// that starts the service with another count is refused with a typed error
/// naming both, and one with the same count starts. A second service of one
/// id on one silo is refused (both would deliver and answer `fence()`), also
/// once the first handle is dropped: the service runs until its silo stops.
#[actix::test]
async fn a_service_started_with_another_shard_count_is_refused() {
    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    another_shard_count_is_refused(store).await;
}

/// As above on Redis, whose reminder table places rows by the recorded count:
/// a count other than the default is recorded before the table first reads it
/// (it recorded the default first, and every other count was refused).
#[cfg(feature = "redis")]
#[actix::test]
async fn a_service_started_with_another_shard_count_is_refused_on_redis() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    let store = rollcall::connect(&b.endpoint).await.expect("connect");
    another_shard_count_is_refused(store).await;
}

async fn another_shard_count_is_refused(store: rollcall_tests::Store) {
    use rollcall_core::{Error, Silo};
    use rollcall_reminders::{ReminderError, Reminders};
    let cluster = rollcall_tests::unique_id("shards");
    let silo = Silo::builder(store.clone(), cluster.clone())
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .expect("silo joins");
    let other = Silo::builder(store.clone(), cluster)
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .expect("a second silo joins");
    let service = rollcall_tests::unique_id("orders");
    let first = Reminders::builder(&silo, store.clone())
        .service_id(&service)
        .shards(64)
        .start()
        .await
        .expect("the first start records 64 shards");
    match Reminders::builder(&other, store.clone())
        .service_id(&service)
        .shards(128)
        .start()
        .await
    {
        Err(ReminderError::Table(e @ Error::InvalidConfig { .. })) => {
            let m = e.to_string();
            assert!(m.contains("64") && m.contains("128"), "names both counts: {m}");
        }
        Err(other) => panic!("another shard count must be InvalidConfig: {other}"),
        Ok(_) => panic!("another shard count must be refused"),
    }
    let again = Reminders::builder(&other, store.clone())
        .service_id(&service)
        .shards(64)
        .start()
        .await
        .expect("the same count starts");
    match Reminders::builder(&silo, store.clone())
        .service_id(&service)
        .shards(64)
        .start()
        .await
    {
        Err(ReminderError::AlreadyRunning { service: s, silo: a }) => {
            assert_eq!((s, a), (service.clone(), silo.address().to_string()));
        }
        Err(other) => panic!("a second service of one id on one silo must be AlreadyRunning: {other}"),
        Ok(_) => panic!("a second service of one id on one silo must be refused"),
    }
    // The service runs until its silo stops, handle or not: dropping the
    // first handle frees nothing, and a start is still refused.
    drop(first);
    assert!(
        matches!(
            Reminders::builder(&silo, store.clone())
                .service_id(&service)
                .shards(64)
                .start()
                .await,
            Err(ReminderError::AlreadyRunning { .. })
        ),
        "refused while the first service's agent runs"
    );
    drop(again);
    silo.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A UTC instant from an RFC 3339 text.
fn utc(text: &str) -> Timestamp {
    Timestamp::from_system_time(humantime::parse_rfc3339(text).expect("an RFC 3339 time"))
}

/// The ticks of `name` in `log`, in delivery order.
fn ticks_of(log: &rollcall_tests::reminders::Log, name: &str) -> Vec<rollcall_reminders::ReminderTick> {
    log.lock()
        .expect("log")
        .iter()
        .filter(|d| d.tick.name == name)
        .map(|d| d.tick.clone())
        .collect()
}

/// R15: calendar reminders across both daylight-saving changes of
/// Europe/Stockholm in 2026, on a virtual clock: `30 2 * * *` fires once at the
/// first valid time after the spring-forward gap (03:00 CEST, 01:00 UTC) and
/// once, at the first pass, on the fall-back night; a half-hourly pattern ticks
/// through both passes of the repeated hour; a repeat count and an end time
/// stop each schedule and remove its row; every tick carries the payload and an
/// occurrence id of its own.
#[test]
fn r15_cron_reminders_in_a_zone_cross_daylight_saving_changes_once() {
    use rollcall_reminders::ReminderSpec;
    for (start, expected) in [
        // Spring forward on 2026-03-29: 02:30 does not exist.
        (
            "2026-03-27T12:00:00Z",
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
            ],
        ),
        // Fall back on 2026-10-25: 02:30 happens twice.
        (
            "2026-10-24T12:00:00Z",
            [
                "2026-10-25T00:30:00Z",
                "2026-10-26T01:30:00Z",
                "2026-10-27T01:30:00Z",
            ],
        ),
    ] {
        run_virtual(|| async move {
            // Days of virtual time: the silo confirms its own row and reconciles
            // its shards less often than by default (nothing here tests them).
            let mut c = ReminderCluster::new(ReminderOptions {
                lease_period: Duration::from_secs(60),
                lease_poll: Duration::from_secs(60),
                refresh_reminder_list_period: Duration::from_secs(3600),
                loading_window: Duration::from_secs(3600),
                ..ReminderOptions::default()
            });
            c.sim.clock = std::sync::Arc::new(rollcall_core::TokioClock::starting_at(utc(start)));
            c.start_many(1).await;
            let svc = c.services[0].clone();
            let nightly = ReminderSpec::cron("30 2 * * *")
                .in_zone("Europe/Stockholm")
                .repeat(3)
                .with_payload(b"nightly".to_vec());
            let h = svc
                .register(&actor(1), "nightly", nightly)
                .await
                .expect("register");
            assert_eq!(
                h.start_at,
                utc(expected[0]),
                "the first tick is the first occurrence"
            );
            assert_eq!(h.end_at, Some(utc(expected[2])), "three ticks end at the third");
            // Every half hour of the wall clock, for the night of the change.
            let night_end = utc(expected[1]).saturating_add(Duration::from_secs(3 * 3600));
            let half_hourly = ReminderSpec::cron("0,30 * * * *")
                .in_zone("Europe/Stockholm")
                .until(night_end);
            svc.register(&actor(2), "half-hourly", half_hourly)
                .await
                .expect("register");
            // Polled once a virtual minute (days of virtual time).
            let ran = |log: &rollcall_tests::reminders::Log| {
                ticks_of(log, "nightly").len() >= 3
                    && ticks_of(log, "half-hourly")
                        .last()
                        .is_some_and(|t| t.scheduled >= night_end)
            };
            let deadline = c.now().saturating_add(Duration::from_secs(5 * 86_400));
            while !ran(&c.log) {
                assert!(c.now() < deadline, "both schedules ran to their end");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            let nightly = ticks_of(&c.log, "nightly");
            let times: Vec<Timestamp> = nightly.iter().map(|t| t.scheduled).collect();
            assert_eq!(times, expected.map(utc), "once per night, the change included");
            let ids: BTreeSet<String> = nightly
                .iter()
                .map(rollcall_reminders::ReminderTick::occurrence_id)
                .collect();
            assert_eq!(ids.len(), 3, "an occurrence id per occurrence");
            assert!(nightly
                .iter()
                .all(|t| t.payload.as_deref() == Some(b"nightly".as_slice())));
            // Half-hourly: every 30 minutes of real time, no gap, no repeat.
            let half: Vec<Timestamp> = ticks_of(&c.log, "half-hourly")
                .iter()
                .map(|t| t.scheduled)
                .collect();
            let first = half[0];
            let expected_half: Vec<Timestamp> = (0..)
                .map(|k| first.saturating_add(Duration::from_secs(1800 * k)))
                .take_while(|t| *t <= night_end)
                .collect();
            assert_eq!(half, expected_half);
            // Both rows are removed after their last tick.
            let mut waited = Duration::ZERO;
            while svc.get(&actor(1), "nightly").await.expect("get").is_some()
                || svc.get(&actor(2), "half-hourly").await.expect("get").is_some()
            {
                assert!(waited < Duration::from_secs(60), "ended schedules leave no row");
                tokio::time::sleep(Duration::from_secs(1)).await;
                waited += Duration::from_secs(1);
            }
        });
    }
}

/// Calendar reminders end to end on `store`, in real time: a cron schedule by
/// the second that carries a payload and stops after 3 ticks, a one-shot with a
/// payload, and a schedule in a zone 5 h 30 min off UTC that ends at a time:
/// each ticks on its calendar with its payload and distinct occurrence ids, and
/// each row is removed after its last tick.
async fn calendar_reminders_end_to_end(store: rollcall_tests::Store) {
    use rollcall_core::Silo;
    use rollcall_reminders::ReminderSpec;
    let cluster = rollcall_tests::unique_id("cal");
    let silo = Silo::builder(store.clone(), cluster)
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .expect("silo joins");
    let log = rollcall_tests::reminders::Log::default();
    let recorder =
        actix::Actor::start(rollcall_tests::reminders::Recorder::new(silo.address(), &log)).recipient();
    let svc = rollcall_reminders::Reminders::builder(&silo, store.clone())
        .service_id(rollcall_tests::unique_id("cal-svc"))
        .target(move |_: &rollcall_reminders::ActorId| Some(recorder.clone()))
        .options(ReminderOptions {
            minimum_period: Duration::from_secs(1),
            startup_jitter: Duration::ZERO,
            ..ReminderOptions::default()
        })
        .start()
        .await
        .expect("reminders start");
    let thrice = ReminderSpec::cron("* * * * * *")
        .repeat(3)
        .with_payload(vec![0, 159, 146, 150]);
    let h1 = svc.register(&actor(1), "thrice", thrice).await.expect("register");
    let once = ReminderSpec::once(Duration::from_millis(300)).with_payload(b"once".to_vec());
    svc.register(&actor(2), "once", once).await.expect("register");
    let until = Timestamp::now().saturating_add(Duration::from_millis(2500));
    let zoned = ReminderSpec::cron("*/1 * * * * *")
        .in_zone("Asia/Kolkata")
        .until(until);
    let h3 = svc.register(&actor(3), "zoned", zoned).await.expect("register");
    let gone = |name: &'static str, a: usize| {
        let svc = svc.clone();
        async move { svc.get(&actor(a), name).await.expect("get").is_none() }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !(gone("thrice", 1).await && gone("once", 2).await && gone("zoned", 3).await) {
        assert!(
            std::time::Instant::now() < deadline,
            "rows removed after their last tick"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let thrice = ticks_of(&log, "thrice");
    let times: Vec<Timestamp> = thrice.iter().map(|t| t.scheduled).collect();
    let first = h1.start_at;
    assert_eq!(first.as_millis() % 1000, 0, "a cron occurrence is a whole second");
    assert_eq!(
        times,
        [0, 1, 2].map(|k| first.saturating_add(Duration::from_secs(k))),
        "three ticks, one per second"
    );
    assert!(thrice
        .iter()
        .all(|t| t.payload.as_deref() == Some([0, 159, 146, 150].as_slice())));
    let ids: BTreeSet<String> = thrice
        .iter()
        .map(rollcall_reminders::ReminderTick::occurrence_id)
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.iter().all(|id| id.contains(h1.etag.as_str())),
        "ids name the registration"
    );
    let once = ticks_of(&log, "once");
    assert_eq!(once.len(), 1);
    assert_eq!(once[0].payload.as_deref(), Some(b"once".as_slice()));
    let zoned: Vec<Timestamp> = ticks_of(&log, "zoned").iter().map(|t| t.scheduled).collect();
    assert!(!zoned.is_empty() && zoned.iter().all(|t| *t <= until && *t >= h3.start_at));
    let mut distinct = zoned.clone();
    distinct.dedup();
    assert_eq!(distinct, zoned, "no occurrence twice");
    silo.kill();
}

#[actix::test]
async fn r16_calendar_reminders_end_to_end_memory() {
    calendar_reminders_end_to_end(std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new())).await;
}

#[cfg(feature = "redis")]
#[actix::test]
async fn r16_calendar_reminders_end_to_end_redis() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    calendar_reminders_end_to_end(rollcall::connect(&b.endpoint).await.expect("connect")).await;
}

#[cfg(feature = "etcd")]
#[actix::test]
async fn r16_calendar_reminders_end_to_end_etcd() {
    let Some(b) = rollcall_tests::fixtures::etcd().await else {
        return;
    };
    let store = rollcall::connect(&format!("etcd://{}", b.endpoint))
        .await
        .expect("connect");
    calendar_reminders_end_to_end(store).await;
}

#[cfg(feature = "dynamodb")]
#[actix::test]
async fn r16_calendar_reminders_end_to_end_dynamodb() {
    let Some(b) = rollcall_tests::fixtures::dynamodb().await else {
        return;
    };
    let store = rollcall::connect(&rollcall_tests::fixtures::dynamodb_url(&b.endpoint))
        .await
        .expect("connect");
    calendar_reminders_end_to_end(store).await;
}

/// R17: a reminder's retry policy, in virtual time: a tick whose actor cannot be
/// resolved is attempted once and `max_retries` times more, at the policy's
/// delays, then dropped (counted) and the reminder goes on with its next
/// occurrence; `RetryPolicy::DROP` attempts once; a one-shot whose only tick is
/// dropped leaves no row; a policy that parks writes each spent occurrence, with
/// its payload, as a one-shot row of the parked service. A reminder without a
/// policy keeps retrying until its next occurrence is due, as before.
#[test]
fn r17_retry_policies_bound_attempts_then_drop_and_go_on() {
    use rollcall_reminders::{ReminderSpec, RetryPolicy};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    run_virtual(|| async {
        let mut sim = rollcall_tests::sim::SimCluster::new(Default::default());
        let silo = sim.start(1, 1).await.expect("silo joins");
        // Every resolve fails; each is an attempt, recorded with its time.
        let attempts: std::sync::Arc<Mutex<Vec<(String, Timestamp)>>> = Default::default();
        let calls = std::sync::Arc::new(AtomicUsize::new(0));
        let (log, clock, n) = (attempts.clone(), sim.clock.clone(), calls.clone());
        let svc = rollcall_reminders::Reminders::builder(&silo, std::sync::Arc::new(sim.store.clone()))
            .service_id("retry")
            .clock(sim.clock.clone())
            .target(move |a: &rollcall_reminders::ActorId| {
                use rollcall_core::Clock as _;
                n.fetch_add(1, Ordering::SeqCst);
                log.lock().unwrap().push((a.to_string(), clock.now()));
                None
            })
            .start()
            .await
            .expect("reminders start");
        let policy = RetryPolicy {
            max_retries: 2,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            park: false,
        };
        let start = sim.now();
        svc.register(
            &actor(1),
            "bounded",
            ReminderSpec::every(Duration::from_secs(5), MINUTE).with_retry(policy),
        )
        .await
        .expect("register");
        svc.register(
            &actor(2),
            "drop",
            ReminderSpec::every(Duration::from_secs(5), MINUTE).with_retry(RetryPolicy::DROP),
        )
        .await
        .expect("register");
        svc.register(
            &actor(3),
            "once",
            ReminderSpec::once(Duration::from_secs(5)).with_retry(RetryPolicy::DROP),
        )
        .await
        .expect("register");
        svc.register(
            &actor(4),
            "default",
            ReminderSpec::every(Duration::from_secs(5), MINUTE),
        )
        .await
        .expect("register");
        let parking = RetryPolicy {
            max_retries: 1,
            ..policy
        }
        .then_park();
        svc.register(
            &actor(5),
            "parked",
            ReminderSpec::every(Duration::from_secs(5), MINUTE)
                .with_retry(parking)
                .with_payload(b"dead letter".to_vec()),
        )
        .await
        .expect("register");
        let of = |a: usize| -> Vec<Timestamp> {
            let id = actor(a).to_string();
            attempts
                .lock()
                .unwrap()
                .iter()
                .filter(|(x, _)| *x == id)
                .map(|(_, t)| *t)
                .collect()
        };
        // Two occurrences of the periodic ones, at 5 s and 65 s: wait until
        // their attempts are in and the second occurrence's retries are spent
        // (the last at about 65 + 1 + 2 s), at most until 120 s, before the
        // third occurrence at 125 s.
        let end = start.saturating_add(Duration::from_secs(120));
        let second_spent = start.saturating_add(Duration::from_secs(70));
        loop {
            let seen = (of(1).len(), of(2).len(), of(3).len(), of(5).len());
            if (seen == (6, 2, 1, 4) && sim.now() >= second_spent) || sim.now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let bounded = of(1);
        assert_eq!(
            bounded.len(),
            6,
            "3 attempts for each of 2 occurrences: {bounded:?}"
        );
        for occurrence in bounded.chunks(3) {
            let gaps: Vec<u64> = occurrence
                .windows(2)
                .map(|w| w[1].as_millis() - w[0].as_millis())
                .collect();
            // Retry 1 after 0.8..1 s, retry 2 after 1.6..2 s.
            assert!(
                (800..=1000).contains(&gaps[0]) && (1600..=2000).contains(&gaps[1]),
                "{gaps:?}"
            );
        }
        assert_eq!(of(2).len(), 2, "DROP: one attempt per occurrence");
        assert_eq!(of(3).len(), 1, "DROP on a one-shot: one attempt");
        assert!(of(4).len() > 6, "no policy: retried until the next occurrence");
        let stats = svc.stats();
        assert_eq!(
            stats.ticks_dropped,
            2 + 2 + 1,
            "every dropped occurrence is counted"
        );
        // Parked: two attempts per occurrence, then a one-shot row per
        // occurrence in the parked table, with the payload; nobody delivers it.
        assert_eq!(of(5).len(), 4, "1 retry for each of 2 occurrences");
        assert_eq!(stats.ticks_parked, 2, "every parked occurrence is counted");
        // Each outcome is in the reminder's run history (written in the
        // background: wait for it), with its attempts; a one-shot keeps none.
        use rollcall_reminders::RunOutcome;
        let history = |a: usize, name: &'static str| {
            let svc = svc.clone();
            async move { svc.history(&actor(a), name).await.expect("history") }
        };
        let mut waited = Duration::ZERO;
        while history(1, "bounded").await.len() < 2 || history(5, "parked").await.len() < 2 {
            assert!(waited < MINUTE, "histories: {:?}", history(1, "bounded").await);
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        }
        let failed = history(1, "bounded").await;
        assert!(
            failed
                .iter()
                .all(|r| r.outcome == RunOutcome::Failed && r.attempts == 3 && !r.triggered),
            "{failed:?}"
        );
        assert!(failed[0].scheduled > failed[1].scheduled, "newest first");
        assert_eq!(failed[0].silo, silo.address().to_string());
        let parked_runs = history(5, "parked").await;
        assert!(
            parked_runs
                .iter()
                .all(|r| r.outcome == RunOutcome::Parked && r.attempts == 2),
            "{parked_runs:?}"
        );
        assert!(history(3, "once").await.is_empty(), "a one-shot keeps no history");
        let given_up = history(4, "default").await;
        assert!(
            given_up
                .iter()
                .any(|r| r.outcome == RunOutcome::GivenUp && r.attempts > 3),
            "{given_up:?}"
        );
        use rollcall_core::SystemStore as _;
        let parked = sim
            .store
            .reminder_table(&rollcall_core::parked_service_id("retry"))
            .expect("parked table");
        let mut waited = Duration::ZERO;
        let rows = loop {
            let rows = parked.read_rows_for(&actor(5).to_string()).await.expect("read");
            if rows.len() == 2 {
                break rows;
            }
            assert!(waited < MINUTE, "parked rows: {rows:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        };
        let row = svc.get(&actor(5), "parked").await.expect("get").expect("row");
        for (p, occurrence) in rows
            .iter()
            .zip([row.start_at, row.start_at.saturating_add(MINUTE)])
        {
            assert_eq!(p.name, format!("parked@{}", occurrence.as_millis()));
            assert_eq!(
                (p.start_at, p.period),
                (occurrence, None),
                "a one-shot at the occurrence"
            );
            assert_eq!(p.payload.as_deref(), Some(&b"dead letter"[..]));
            assert!(p.paused.is_some(), "a parked occurrence shows as paused");
        }
        // A reminder service of the parked id delivers each parked row once
        // it is resumed, then removes it.
        let log: rollcall_tests::reminders::Log = Default::default();
        let recorder =
            actix::Actor::start(rollcall_tests::reminders::Recorder::new(silo.address(), &log)).recipient();
        let replay = rollcall_reminders::Reminders::builder(&silo, std::sync::Arc::new(sim.store.clone()))
            .service_id(rollcall_core::parked_service_id("retry"))
            .clock(sim.clock.clone())
            .target(move |_: &rollcall_reminders::ActorId| Some(recorder.clone()))
            .start()
            .await
            .expect("the parked service starts");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            log.lock().unwrap().is_empty(),
            "paused: nothing delivered before the resume"
        );
        for p in &rows {
            let resumed = replay.resume(&actor(5), &p.name).await.expect("resume");
            assert_eq!(resumed.paused, None);
        }
        let mut waited = Duration::ZERO;
        while !parked
            .read_rows_for(&actor(5).to_string())
            .await
            .expect("read")
            .is_empty()
        {
            assert!(waited < MINUTE, "replayed: {}", log.lock().unwrap().len());
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        }
        let mut names: Vec<String> = log.lock().unwrap().iter().map(|d| d.tick.name.clone()).collect();
        names.sort();
        assert_eq!(names, rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
        drop(replay);
        let mut waited = Duration::ZERO;
        while svc.get(&actor(3), "once").await.expect("get").is_some() {
            assert!(waited < MINUTE, "a dropped one-shot leaves no row");
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        }
        let row = svc.get(&actor(1), "bounded").await.expect("get").expect("row");
        assert_eq!(row.retry, Some(policy), "the policy is in the row");
    });
}

/// Issue 58 item 3 on a running cluster: `list_kind` pages one kind, and
/// `delete_kind` removes it and tells the holders, so the kind's ticks stop
/// at once (no wait for the 5-minute refresh) while another kind's go on.
#[test]
fn r18_list_and_delete_by_kind_stop_that_kind_at_once() {
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(3).await;
        let svc = c.services[0].clone();
        let user = |i: usize| rollcall_reminders::ActorId::new("user", i.to_string()).expect("actor id");
        for i in 0..40 {
            svc.register_or_update(&actor(i), "r", Duration::from_secs(5), MINUTE)
                .await
                .expect("register");
        }
        for i in 0..20 {
            svc.register_or_update(&user(i), "r", Duration::from_secs(5), MINUTE)
                .await
                .expect("register");
        }
        tokio::time::sleep(3 * MINUTE).await;
        let (mut listed, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = c.services[1]
                .list_kind("cart", after.as_ref(), 7)
                .await
                .expect("page");
            assert!(page.reminders.len() <= 7);
            pages += 1;
            listed.extend(page.reminders);
            match page.next {
                Some(t) => after = Some(t),
                None => break,
            }
        }
        assert_eq!(listed.len(), 40, "every cart reminder once");
        assert!(pages >= 6, "pages of at most 7: {pages}");
        assert!(listed.iter().all(|h| h.actor.kind() == "cart"));
        assert!(matches!(
            svc.list_kind("cart/", None, 7).await,
            Err(rollcall_reminders::ReminderError::InvalidActor(..))
        ));

        let carts_before = c.ticks().iter().filter(|d| d.tick.actor.kind() == "cart").count();
        assert!(carts_before >= 80, "the carts ticked: {carts_before}");
        let deleted_at = c.now();
        let removed = c.services[2].delete_kind("cart").await.expect("delete");
        assert_eq!((removed.removed, removed.changed), (40, 0));
        tokio::time::sleep(3 * MINUTE).await;
        let late: Vec<_> = c
            .ticks()
            .into_iter()
            .filter(|d| {
                d.tick.actor.kind() == "cart"
                    && d.tick.now > deleted_at.saturating_add(Duration::from_secs(1))
            })
            .collect();
        assert!(
            late.is_empty(),
            "{} cart ticks after the delete, the first: {:?}",
            late.len(),
            late.first()
        );
        let users_after = c
            .ticks()
            .iter()
            .filter(|d| d.tick.actor.kind() == "user" && d.tick.now > deleted_at)
            .count();
        assert!(users_after >= 40, "the other kind goes on: {users_after}");
        assert!(svc
            .list_kind("cart", None, 100)
            .await
            .expect("page")
            .reminders
            .is_empty());
        assert_eq!(
            svc.delete_kind("cart").await.expect("again").removed,
            0,
            "safe to run again"
        );
    });
}

/// Issue 58 item 1 on a cluster in virtual time: pause, resume and trigger
/// through a graceful leave, a join and a crash. A paused reminder delivers
/// nothing on any silo (its etag, so its handles, stay); each trigger sent
/// around the graceful leave is delivered exactly once, each sent just before
/// the crash at least once, with the reminder's name and payload and its own
/// occurrence id; resumed reminders tick again from the resume, Skip policy
/// (no catch-up for the paused time); no periodic occurrence twice.
#[test]
fn r19_pause_resume_and_trigger_hold_through_a_leave_a_join_and_a_crash() {
    use std::collections::BTreeMap;
    run_virtual(|| async {
        let mut c = ReminderCluster::new(ReminderOptions::default());
        c.start_many(4).await;
        let mut handles = Vec::new();
        for i in 0..40 {
            let spec = rollcall_reminders::ReminderSpec::every(Duration::from_secs(5), MINUTE)
                .with_payload(format!("p{i}").into_bytes());
            handles.push(
                c.services[0]
                    .register(&actor(i), "r", spec)
                    .await
                    .expect("register"),
            );
        }
        tokio::time::sleep(3 * MINUTE).await;
        let paused_at = c.now();
        for i in (0..40).step_by(2) {
            let h = c.services[1].pause(&actor(i), "r").await.expect("pause");
            assert_eq!(
                (h.paused, &h.etag),
                (Some(paused_at), &handles[i].etag),
                "same registration"
            );
            assert_eq!(
                c.services[1].pause(&actor(i), "r").await.expect("again").paused,
                Some(paused_at)
            );
        }
        assert!(matches!(
            c.services[1].pause(&actor(99), "r").await,
            Err(rollcall_reminders::ReminderError::NotFound { .. })
        ));
        // Triggers of paused and ticking reminders around a graceful leave.
        let mut graceful_triggers = Vec::new();
        for i in 0..10 {
            graceful_triggers.push(c.services[2].trigger(&actor(i), "r").await.expect("trigger"));
        }
        let leaving = c.sim.silos[0].clone();
        let svc = c.services[3].clone();
        let during = actix::spawn(async move {
            let mut t = Vec::new();
            for i in 10..20 {
                t.push(svc.trigger(&actor(i), "r").await.expect("trigger"));
            }
            t
        });
        leaving.shutdown().await.expect("graceful leave");
        graceful_triggers.extend(during.await.expect("triggers"));
        tokio::time::sleep(2 * MINUTE).await;
        c.start(5, 1).await.expect("joins");
        tokio::time::sleep(2 * MINUTE).await;
        let mut crash_triggers = Vec::new();
        for i in 20..30 {
            crash_triggers.push(c.services[3].trigger(&actor(i), "r").await.expect("trigger"));
        }
        c.sim.kill_and_await_dead(1, 2 * detection_bound()).await;
        tokio::time::sleep(3 * MINUTE).await;
        let resumed_at = c.now();
        for i in (0..40).step_by(2) {
            let h = c.services[2].resume(&actor(i), "r").await.expect("resume");
            assert_eq!((h.paused, &h.etag), (None, &handles[i].etag));
        }
        tokio::time::sleep(3 * MINUTE).await;

        let trigger_etags: BTreeMap<String, &rollcall_reminders::ReminderHandle> = graceful_triggers
            .iter()
            .chain(&crash_triggers)
            .map(|h| (h.etag.as_str().to_owned(), h))
            .collect();
        let ticks = c.ticks();
        let mut deliveries: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &ticks {
            if let Some(h) = trigger_etags.get(d.tick.etag.as_str()) {
                *deliveries.entry(h.etag.as_str()).or_default() += 1;
                assert_eq!(d.tick.name, "r", "a trigger's tick carries the reminder's name");
                assert_eq!(h.trigger_of.as_deref(), Some("r"));
                let i: usize = d.tick.actor.key().parse().expect("key");
                assert_eq!(d.tick.payload.as_deref(), Some(format!("p{i}").as_bytes()));
                continue;
            }
            let i: usize = d.tick.actor.key().parse().expect("key");
            if i.is_multiple_of(2) {
                let paused =
                    d.tick.now > paused_at.saturating_add(Duration::from_secs(1)) && d.tick.now < resumed_at;
                assert!(!paused, "a paused reminder ticked: {d:?}");
                assert!(
                    d.tick.scheduled <= paused_at || d.tick.scheduled > resumed_at,
                    "Skip: no occurrence of the paused time is caught up: {d:?}"
                );
            }
        }
        for h in &graceful_triggers {
            assert_eq!(
                deliveries.get(h.etag.as_str()),
                Some(&1),
                "exactly once: {}",
                h.name
            );
        }
        for h in &crash_triggers {
            assert!(
                deliveries.get(h.etag.as_str()).is_some_and(|n| *n >= 1),
                "at least once: {}",
                h.name
            );
        }
        for i in (0..40).step_by(2) {
            assert!(
                ticks
                    .iter()
                    .any(|d| d.tick.actor == actor(i) && d.tick.now > resumed_at),
                "cart/{i} ticks again after the resume"
            );
        }
        let periodic_twice: Vec<_> = c
            .duplicates()
            .into_iter()
            .filter(|(_, t)| {
                !ticks
                    .iter()
                    .any(|d| d.tick.scheduled == *t && trigger_etags.contains_key(d.tick.etag.as_str()))
            })
            .collect();
        assert!(periodic_twice.is_empty(), "{periodic_twice:?}");
        // Every trigger row is gone once delivered.
        for i in 0..30 {
            let left: Vec<_> = c.services[2]
                .list(&actor(i))
                .await
                .expect("list")
                .into_iter()
                .filter(|h| h.trigger_of.is_some())
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
    });
}

/// Issue 58 item 2 on a cluster in virtual time: a reminder's run history
/// keeps the newest `run_history` records, newest first, written by whichever
/// silo delivered: it survives the crash of the holder (records of both the
/// victim and its successor), and shows a trigger as a triggered record.
#[test]
fn r20_run_history_survives_the_holder_and_keeps_the_newest() {
    run_virtual(|| async {
        let options = ReminderOptions {
            run_history: 5,
            ..ReminderOptions::default()
        };
        let mut c = ReminderCluster::new(options);
        c.start_many(3).await;
        let a = actor(0);
        c.services[1]
            .register_or_update(&a, "r", Duration::from_secs(5), MINUTE)
            .await
            .expect("register");
        tokio::time::sleep(3 * MINUTE).await;
        let holder = c.ticks().last().expect("a tick").silo;
        c.services[1].trigger(&a, "r").await.expect("trigger");
        let mut waited = Duration::ZERO;
        while !c.services[2]
            .history(&a, "r")
            .await
            .expect("history")
            .iter()
            .any(|r| r.triggered)
        {
            assert!(waited < MINUTE, "the trigger's record");
            tokio::time::sleep(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        }
        let victim = c
            .sim
            .silos
            .iter()
            .position(|s| s.address() == holder)
            .expect("holder");
        c.sim.kill_and_await_dead(victim, 2 * detection_bound()).await;
        // Three ticks after the failover, and the one due during it, which
        // the survivor owes from the victim's checkpoint (before
        // checkpoints `Skip` dropped it and this waited four): with the
        // trigger's record, the newest five.
        tokio::time::sleep(3 * MINUTE).await;
        let survivor = c
            .services
            .iter()
            .enumerate()
            .find(|(i, _)| *i != victim)
            .expect("a survivor")
            .1;
        let runs = survivor.history(&a, "r").await.expect("history");
        assert_eq!(runs.len(), 5, "the newest 5: {runs:?}");
        assert!(
            runs.windows(2).all(|w| w[0].at >= w[1].at),
            "newest first: {runs:?}"
        );
        assert!(runs
            .iter()
            .all(|r| r.outcome == rollcall_reminders::RunOutcome::Ok));
        let silos: BTreeSet<&str> = runs.iter().map(|r| r.silo.as_str()).collect();
        assert!(
            silos.len() >= 2 && silos.contains(holder.to_string().as_str()),
            "{runs:?}"
        );
        assert_eq!(runs.iter().filter(|r| r.triggered).count(), 1, "{runs:?}");
        // Unregister takes the history with the row.
        let h = survivor.get(&a, "r").await.expect("get").expect("row");
        survivor.unregister(&h).await.expect("unregister");
        assert!(survivor.history(&a, "r").await.expect("history").is_empty());
    });
}

/// Silos on the memory `store` (fast profile, each advertising the proxy port
/// of `proxies`, 0 for none), each with a reminder service of id `cluster`.
async fn placed_silos(
    store: &rollcall_tests::Store,
    cluster: &str,
    proxies: &[u16],
) -> (Vec<rollcall_core::SiloHandle>, Vec<rollcall_reminders::Reminders>) {
    use rollcall_core::{ClusterMembershipOptions, OnDeclaredDead, Silo};
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for proxy in proxies {
        let silo = Silo::builder(store.clone(), cluster)
            .listen("127.0.0.1:0".parse().unwrap())
            .options(ClusterMembershipOptions::fast())
            .proxy_port(*proxy)
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await
            .expect("silo joins");
        let svc = rollcall_reminders::Reminders::builder(&silo, store.clone())
            .service_id(cluster)
            .start()
            .await
            .expect("reminders start");
        silos.push(silo);
        services.push(svc);
    }
    (silos, services)
}

/// Waits (at most 30 s) until every silo sees all Active and every actor is
/// held by the silo its shard is assigned to (not a moment of the joiners'
/// takeover, when one silo still holds them all).
async fn wait_placement_settled(
    silos: &[rollcall_core::SiloHandle],
    services: &[rollcall_reminders::Reminders],
    actors: &[rollcall_reminders::ActorId],
) {
    let settled = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        silos.iter().all(|s| s.snapshot().active().count() == silos.len()) && actors.iter().all(|a| {
            let holders: Vec<usize> = (0..services.len())
                .filter(|i| services[*i].fence(a).is_some())
                .collect();
            matches!(holders[..], [i] if services.iter().all(|s| s.owner_of(a) == Some(silos[i].address())))
        })
    })
    .await;
    assert!(
        settled.is_some(),
        "every actor's shard held by the silo it is assigned to"
    );
}

/// Waits for placement to settle over 50 actors, then one of them whose
/// shard the first silo holds.
async fn settled_actor_on_the_first(
    silos: &[rollcall_core::SiloHandle],
    services: &[rollcall_reminders::Reminders],
) -> rollcall_reminders::ActorId {
    let actors: Vec<_> = (0..50).map(actor).collect();
    wait_placement_settled(silos, services, &actors).await;
    actors
        .into_iter()
        .find(|a| services[0].fence(a).is_some())
        .expect("an actor on the first silo")
}

/// `Reminders::fence` and `Reminders::owner` name the holder of an actor's
/// shard lease (issue 59): with two silos on real TCP (each advertising a
/// proxy port), every actor's shard is held by exactly one of them, whose
/// `fence` has the lease row's epoch; `owner` from either silo names that
/// silo, that epoch and its endpoint. After the holder of a shard leaves, the
/// other holds it at a later epoch and names itself.
#[actix::test]
async fn owner_and_fence_name_the_lease_holder() {
    use rollcall_core::lease::ShardLeases;
    use rollcall_core::{actor_shard, DEFAULT_SHARDS};
    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("owner");
    let (silos, services) = placed_silos(&store, &cluster, &[18_081, 18_082]).await;
    let actors: Vec<_> = (0..50).map(actor).collect();
    wait_placement_settled(&silos, &services, &actors).await;
    let leases = ShardLeases::open(store.lease_table(&cluster).unwrap(), DEFAULT_SHARDS)
        .await
        .unwrap();
    let mut by_silo = [0, 0];
    for a in &actors {
        let (i, fence) = services
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((i, s.fence(a)?)))
            .expect("a holder");
        by_silo[i] += 1;
        assert_eq!(fence.shard, actor_shard(&a.to_string(), DEFAULT_SHARDS));
        let lease = leases.read(fence.shard).await.unwrap();
        assert_eq!(lease.owner, Some(silos[i].address()), "{a}");
        assert_eq!(lease.epoch, fence.epoch, "{a}");
        let expected = rollcall_reminders::Owner {
            silo: silos[i].address(),
            epoch: fence.epoch,
            endpoint: Some(std::net::SocketAddr::new(
                silos[i].address().endpoint().ip(),
                [18_081, 18_082][i],
            )),
        };
        for s in &services {
            assert_eq!(s.owner(a).await.unwrap(), Some(expected.clone()), "{a}");
        }
    }
    assert!(
        by_silo.iter().all(|n| *n > 0),
        "both silos hold some: {by_silo:?}"
    );
    let before: Vec<_> = actors.iter().map(|a| services[0].fence(a)).collect();
    silos[0].shutdown().await.expect("leave");
    let moved = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        actors.iter().all(|a| services[1].fence(a).is_some())
    })
    .await;
    assert!(moved.is_some(), "the survivor holds every shard");
    for (a, old) in actors.iter().zip(before) {
        let f = services[1].fence(a).unwrap();
        if let Some(old) = old {
            assert!(f.epoch > old.epoch, "{a}: a later epoch");
        }
        let owner = services[1].owner(a).await.unwrap().expect("an owner");
        assert_eq!((owner.silo, owner.epoch), (silos[1].address(), f.epoch));
    }
}

/// A graceful handoff waits for `ActorHost`'s deactivations (issue 59 item
/// 2): each activation on the leaving silo handles `Deactivate` (here it
/// takes 300 ms, a flush) and only then is its shard released, so the
/// successor activates every actor after its old activation ended.
#[actix::test]
async fn a_graceful_handoff_activates_an_actor_only_after_its_deactivation() {
    use std::sync::{Arc, Mutex};

    use actix::{Actor, ActorContext, ActorFutureExt, Context, Handler, Message, WrapFuture};
    use rollcall_reminders::{ActorHost, Deactivate};

    /// (silo, actor, activated ms, deactivated ms).
    type Log = Arc<Mutex<Vec<(usize, String, &'static str, u64)>>>;

    struct Probe {
        silo: usize,
        actor: String,
        log: Log,
    }
    impl Actor for Probe {
        type Context = Context<Self>;
        fn started(&mut self, _: &mut Context<Self>) {
            let t = Timestamp::now().as_millis();
            self.log
                .lock()
                .unwrap()
                .push((self.silo, self.actor.clone(), "on", t));
        }
    }
    #[derive(Message)]
    #[rtype(result = "()")]
    struct Ping;
    impl Handler<Ping> for Probe {
        type Result = ();
        fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
    }
    impl Handler<Deactivate> for Probe {
        type Result = actix::ResponseActFuture<Self, ()>;
        fn handle(&mut self, _: Deactivate, _: &mut Context<Self>) -> Self::Result {
            // A flush that takes 300 ms, then the stop; answered after both.
            Box::pin(
                tokio::time::sleep(Duration::from_millis(300))
                    .into_actor(self)
                    .map(|_, this, ctx| {
                        let t = Timestamp::now().as_millis();
                        this.log
                            .lock()
                            .unwrap()
                            .push((this.silo, this.actor.clone(), "off", t));
                        ctx.stop();
                    }),
            )
        }
    }

    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("host");
    let log: Log = Arc::default();
    let (silos, services) = placed_silos(&store, &cluster, &[0, 0]).await;
    let hosts: Vec<_> = services
        .iter()
        .enumerate()
        .map(|(i, svc)| {
            let l = log.clone();
            ActorHost::new(svc, move |actor, _| Probe {
                silo: i,
                actor: actor.to_string(),
                log: l.clone(),
            })
        })
        .collect();
    let actors: Vec<_> = (0..50).map(actor).collect();
    wait_placement_settled(&silos, &services, &actors).await;
    // Activate every actor where it lives (the second silo may still be
    // taking its shards over from the first: ask the holder of the moment
    // again until one serves it).
    let mut on_first = Vec::new();
    for a in &actors {
        let started = std::time::Instant::now();
        loop {
            let i = usize::from(services[1].fence(a).is_some());
            match hosts[i].send(a, Ping).await {
                Ok(()) => {
                    if i == 0 {
                        on_first.push(a.to_string());
                    }
                    break;
                }
                Err(e) => assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{a} never hosted: {e}"
                ),
            }
            tokio::task::yield_now().await;
        }
    }
    assert!(!on_first.is_empty());
    // The first silo leaves; its actors move to the second.
    silos[0].shutdown().await.expect("leave");
    for a in &actors {
        let moved =
            rollcall_tests::sim::wait_for(Duration::from_secs(30), || services[1].fence(a).is_some()).await;
        assert!(moved.is_some(), "{a} moved");
        hosts[1].send(a, Ping).await.expect("hosted on the survivor");
    }
    let log = log.lock().unwrap().clone();
    for a in &on_first {
        let at = |silo: usize, what: &str| {
            log.iter()
                .find(|(s, x, w, _)| *s == silo && x == a && *w == what)
                .map(|e| e.3)
        };
        let (off, on) = (at(0, "off"), at(1, "on"));
        let (Some(off), Some(on)) = (off, on) else {
            panic!("{a}: deactivated on the first silo at {off:?}, activated on the second at {on:?}");
        };
        assert!(
            off <= on,
            "{a}: activated on the successor at {on}, before its old activation ended at {off}"
        );
    }
}

/// Issue 72, item 6: a release waits for an actor host only while the host
/// has activations of the shard to end. A host created after its silo's
/// shards were held, with no activation, and a leave before the host saw
/// any change of the held shards (its watch reports changes, and the one it
/// would act on, the release, is its first): the leave does not wait out
/// the 5-s drain for a report that never comes.
#[actix::test]
async fn a_host_with_no_activations_holds_no_release_back() {
    use actix::{Actor, Context, Handler};
    use rollcall_reminders::{ActorHost, Deactivate};

    struct Idle;
    impl Actor for Idle {
        type Context = Context<Self>;
    }
    impl Handler<Deactivate> for Idle {
        type Result = ();
        fn handle(&mut self, _: Deactivate, _: &mut Context<Self>) {}
    }

    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("idle-host");
    let (silos, services) = placed_silos(&store, &cluster, &[0]).await;
    let held = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        let h = services[0].held_shards();
        let h = h.borrow();
        h.shards.len() == services[0].shards() as usize && h.confirmed_until.is_some()
    })
    .await;
    assert!(held.is_some(), "the one silo holds every shard");
    let host = ActorHost::new(&services[0], |_, _| Idle);
    let began = std::time::Instant::now();
    let left = tokio::time::timeout(Duration::from_secs(30), silos[0].shutdown()).await;
    let took = began.elapsed();
    assert!(matches!(left, Ok(Ok(_))), "the silo leaves: {left:?}");
    assert_eq!(host.active(), 0);
    assert!(
        took < rollcall_reminders::handoff::MAX_DRAIN,
        "the leave took {took:?}: its releases waited out the drain for a host with nothing to end"
    );
}

/// Issue 72, item 2 (written first; it failed: the parked `Count` answered
/// 3 after the successor had answered 13): an activation's answer is
/// withheld once its shard's fence lapsed. Three silos; a `Count` handler
/// of the first is parked at an `.await` (as one across a SIGSTOP would
/// be); that silo's clock then runs 3 s ahead, the shard goes to another
/// silo, whose activation accepts 10 `Add`s; then the parked handler answers from
/// its memory. The client, which was already given 13, must not receive a
/// lower count: the host reports `HostError::Lapsed` instead.
#[actix::test]
async fn a_parked_answer_of_a_lapsed_activation_is_withheld() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use actix::{Actor, ActorFutureExt, Context, Handler, Message, WrapFuture};
    use rollcall_core::{ClusterMembershipOptions, OnDeclaredDead, Silo};
    use rollcall_reminders::{ActorHost, Deactivate, HostError};

    /// The counts as stored (one map for both silos, standing in for the
    /// state table) and the parked handler's release.
    #[derive(Clone, Default)]
    struct World {
        stored: Arc<Mutex<HashMap<String, u64>>>,
        park: Arc<Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>,
        parked: Arc<AtomicBool>,
    }
    struct Counter {
        actor: String,
        count: u64,
        world: World,
    }
    impl Actor for Counter {
        type Context = Context<Self>;
    }
    #[derive(Message)]
    #[rtype(result = "u64")]
    struct Add;
    impl Handler<Add> for Counter {
        type Result = u64;
        fn handle(&mut self, _: Add, _: &mut Context<Self>) -> u64 {
            self.count += 1;
            self.world
                .stored
                .lock()
                .unwrap()
                .insert(self.actor.clone(), self.count);
            self.count
        }
    }
    #[derive(Message)]
    #[rtype(result = "u64")]
    struct Count;
    impl Handler<Count> for Counter {
        type Result = actix::ResponseActFuture<Self, u64>;
        fn handle(&mut self, _: Count, _: &mut Context<Self>) -> Self::Result {
            let park = self.world.park.lock().unwrap().take();
            self.world.parked.store(true, Ordering::SeqCst);
            Box::pin(
                async move {
                    if let Some(p) = park {
                        let _ = p.await;
                    }
                }
                .into_actor(self)
                .map(|(), this, _| this.count),
            )
        }
    }
    // An activation that keeps running after its deactivation (a flush
    // that outlives the drain): its parked handler still answers.
    impl Handler<Deactivate> for Counter {
        type Result = ();
        fn handle(&mut self, _: Deactivate, _: &mut Context<Self>) {}
    }

    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("lapsed");
    let faults = rollcall_tests::silo_process::Faults::default();
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for faulted in [true, false, false] {
        let mut builder = Silo::builder(store.clone(), cluster.as_str())
            .listen("127.0.0.1:0".parse().unwrap())
            .options(ClusterMembershipOptions::fast())
            .on_declared_dead(OnDeclaredDead::StopSilo);
        if faulted {
            builder = builder.clock(Arc::new(faults.clock.clone()));
        }
        let silo = builder.start().await.expect("silo joins");
        let mut reminders =
            rollcall_reminders::Reminders::builder(&silo, store.clone()).service_id(cluster.as_str());
        if faulted {
            reminders = reminders.clock(Arc::new(faults.clock.clone()));
        }
        services.push(reminders.start().await.expect("reminders start"));
        silos.push(silo);
    }
    let world = World::default();
    let hosts: Vec<_> = services
        .iter()
        .map(|svc| {
            let w = world.clone();
            ActorHost::new(svc, move |actor, _| Counter {
                actor: actor.to_string(),
                count: w
                    .stored
                    .lock()
                    .unwrap()
                    .get(&actor.to_string())
                    .copied()
                    .unwrap_or(0),
                world: w.clone(),
            })
        })
        .collect();
    let a = settled_actor_on_the_first(&silos, &services).await;
    for want in 1..=3 {
        assert_eq!(hosts[0].send(&a, Add).await.expect("hosted"), want);
    }
    let (release, park) = tokio::sync::oneshot::channel();
    *world.park.lock().unwrap() = Some(park);
    let parked_host = hosts[0].clone();
    let parked_actor = a.clone();
    let parked = actix::spawn(async move { parked_host.send(&parked_actor, Count).await });
    assert!(
        rollcall_tests::sim::wait_for(Duration::from_secs(10), || world.parked.load(Ordering::SeqCst))
            .await
            .is_some(),
        "the Count handler runs"
    );
    faults.clock.set_ahead(Duration::from_secs(3));
    assert!(
        rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
            services[1..].iter().any(|s| s.fence(&a).is_some())
        })
        .await
        .is_some(),
        "another silo takes the actor's shard"
    );
    let successor = 1 + usize::from(services[2].fence(&a).is_some());
    let mut given = 0;
    let adds_from = std::time::Instant::now();
    for _ in 0..10 {
        given = loop {
            // The successor activates it once the first's release landed.
            match hosts[successor].send(&a, Add).await {
                Ok(n) => break n,
                Err(e) => {
                    assert!(matches!(e, HostError::NotHere(_)), "{e}");
                    assert!(
                        adds_from.elapsed() < Duration::from_secs(30),
                        "the successor serves no Add within 30 s"
                    );
                    tokio::task::yield_now().await;
                }
            }
        };
    }
    assert_eq!(given, 13, "the successor counts on from the stored 3");
    release.send(()).expect("the parked handler waits");
    let answer = parked.await.expect("the parked send");
    assert!(
        matches!(answer, Err(HostError::Lapsed(_))),
        "a client given {given} then received {answer:?}"
    );
}

/// Issue 72, item 3 (written first; it failed: the flush was refused as
/// `Fenced` and the 5 acknowledged increments were lost): the release of a
/// leaving silo waits for its activations' deactivations up to
/// `deactivate_drain` (7.5 s by default), not the deliveries' 5-s drain. A
/// write-behind counter acknowledges from memory and writes on `Deactivate`,
/// a flush that takes 7 s; its silo leaves gracefully (as on SIGTERM); the
/// successor reads every acknowledged increment.
#[actix::test]
async fn a_write_behind_flush_within_the_deactivate_drain_loses_nothing() {
    use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
    use rollcall::state::{PersistentState, StateKey, StateStorage};
    use rollcall_reminders::{ActorHost, Deactivate};

    struct Counter {
        state: PersistentState<u64>,
        pending: u64,
    }
    impl Actor for Counter {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            let state = self.state.clone();
            ctx.wait(
                async move { state.load().await }
                    .into_actor(self)
                    .map(|r, _, _| r.expect("load")),
            );
        }
    }
    #[derive(Message)]
    #[rtype(result = "u64")]
    struct Add;
    impl Handler<Add> for Counter {
        type Result = u64;
        fn handle(&mut self, _: Add, _: &mut Context<Self>) -> u64 {
            self.pending += 1;
            self.state.read(|c| *c) + self.pending
        }
    }
    #[derive(Message)]
    #[rtype(result = "u64")]
    struct Get;
    impl Handler<Get> for Counter {
        type Result = u64;
        fn handle(&mut self, _: Get, _: &mut Context<Self>) -> u64 {
            self.state.read(|c| *c) + self.pending
        }
    }
    impl Handler<Deactivate> for Counter {
        type Result = actix::ResponseActFuture<Self, ()>;
        fn handle(&mut self, _: Deactivate, _: &mut Context<Self>) -> Self::Result {
            let (state, pending) = (self.state.clone(), std::mem::take(&mut self.pending));
            Box::pin(
                async move {
                    // A slow flush: 7 s, then the write.
                    tokio::time::sleep(Duration::from_secs(7)).await;
                    state.update(|c| *c += pending).await
                }
                .into_actor(self)
                .map(|r, _, ctx| {
                    if let Err(e) = r {
                        eprintln!("the flush failed: {e}");
                    }
                    ctx.stop();
                }),
            )
        }
    }

    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("write-behind");
    let (silos, services) = placed_silos(&store, &cluster, &[0, 0]).await;
    let states = StateStorage::new(store.state_table(&cluster).expect("state table"));
    let hosts: Vec<_> = services
        .iter()
        .map(|svc| {
            let states = states.clone();
            ActorHost::new(svc, move |actor, fence| Counter {
                state: PersistentState::new(
                    states.fenced(fence),
                    StateKey::new(actor.to_string(), "count").expect("key"),
                ),
                pending: 0,
            })
        })
        .collect();
    let a = settled_actor_on_the_first(&silos, &services).await;
    for want in 1..=5 {
        assert_eq!(hosts[0].send(&a, Add).await.expect("hosted"), want);
    }
    silos[0].shutdown().await.expect("a graceful leave");
    let moved =
        rollcall_tests::sim::wait_for(Duration::from_secs(30), || services[1].fence(&a).is_some()).await;
    assert!(moved.is_some(), "the survivor holds the actor's shard");
    let reads_from = std::time::Instant::now();
    let read = loop {
        match hosts[1].send(&a, Get).await {
            Ok(n) => break n,
            Err(e) => {
                assert!(
                    reads_from.elapsed() < Duration::from_secs(30),
                    "the survivor serves no Get within 30 s: {e}"
                );
                tokio::task::yield_now().await;
            }
        }
    };
    assert_eq!(read, 5, "the successor reads every acknowledged increment");
}

/// Starts `n` silos on one memory store with the fast membership profile,
/// each with a reminder service; the first one's wall clock and probe
/// transport are `faults`' (its clock can step, its probes can be cut), and
/// it runs on the caller's thread (`own_thread(false)`).
async fn silos_with_a_faulted_first(
    cluster: &str,
    n: usize,
    faults: &rollcall_tests::silo_process::Faults,
) -> (Vec<rollcall_core::SiloHandle>, Vec<rollcall_reminders::Reminders>) {
    use rollcall_core::{ClusterMembershipOptions, OnDeclaredDead, Silo};
    use std::sync::Arc;
    let store: rollcall_tests::Store = Arc::new(rollcall_provider_memory::MemoryStore::new());
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for i in 0..n {
        let mut builder = Silo::builder(store.clone(), cluster)
            .listen("127.0.0.1:0".parse().unwrap())
            .options(ClusterMembershipOptions::fast())
            .on_declared_dead(OnDeclaredDead::StopSilo);
        if i == 0 {
            // On the caller's thread, its reminder service too: freezing
            // the test's thread freezes its agent.
            builder = builder
                .clock(Arc::new(faults.clock.clone()))
                .transport(Arc::new(faults.transport.clone()))
                .own_thread(false);
        }
        let silo = builder.start().await.expect("silo joins");
        let mut reminders = rollcall_reminders::Reminders::builder(&silo, store.clone()).service_id(cluster);
        if i == 0 {
            reminders = reminders.clock(Arc::new(faults.clock.clone()));
        }
        services.push(reminders.start().await.expect("reminders start"));
        silos.push(silo);
    }
    (silos, services)
}

/// Waits (at most 10 s) for `service`'s next confirmation of its own row:
/// a published [`Held`](rollcall_reminders::Held) whose `confirmed_until`
/// moved on.
async fn next_confirmation(service: &rollcall_reminders::Reminders) {
    let mut held = service.held_shards();
    let before = held.borrow_and_update().confirmed_until;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            held.changed().await.expect("the service runs");
            if held.borrow_and_update().confirmed_until > before {
                return;
            }
        }
    })
    .await
    .expect("a confirmation within 10 s");
}

/// Issue 72, item 4: a confirmation is a deadline on the monotonic clock,
/// not on the wall clock. Right after a silo confirmed its row, its wall
/// clock steps back 3 s and its thread freezes (a stop-the-world pause, a
/// starved arbiter: the `std::thread::sleep` is the fault) for the lease
/// period and a bit: when it runs again, before its agent handles any
/// event, `fence()` is `None`, although the stepped-back wall clock says the
/// confirmation has most of 3 s left. A successor may hold the shard by then.
#[actix::test]
async fn a_clock_stepped_back_does_not_stretch_a_confirmation() {
    let faults = rollcall_tests::silo_process::Faults::default();
    let cluster = rollcall_tests::unique_id("stepped-back");
    let (silos, services) = silos_with_a_faulted_first(&cluster, 1, &faults).await;
    let a = settled_actor_on_the_first(&silos, &services).await;
    next_confirmation(&services[0]).await;
    assert!(services[0].fence(&a).is_some(), "held and confirmed");
    faults.clock.set_behind(Duration::from_secs(3));
    let lease_period = ReminderOptions::default().lease_period;
    // The fault: nothing on this thread runs, the reminder agent included.
    std::thread::sleep(lease_period + Duration::from_millis(300));
    assert_eq!(
        services[0].fence(&a),
        None,
        "the lease period passed since the confirmation, whatever the wall clock says"
    );
}

/// Issue 72, item 4, as the issue states it: three silos; right after the
/// first confirmed its row, its wall clock steps back 3 s and its probes are
/// cut, so its peers declare it Dead and one of them takes its shards over.
/// `fence()` of an actor of the first silo, polled on every silo every 10 ms
/// until 3 s after a successor holds it, is never `Some` on two silos.
#[actix::test]
async fn a_clock_stepped_back_never_fences_an_actor_on_two_silos() {
    let faults = rollcall_tests::silo_process::Faults::default();
    let cluster = rollcall_tests::unique_id("stepped-back-3");
    let (silos, services) = silos_with_a_faulted_first(&cluster, 3, &faults).await;
    let a = settled_actor_on_the_first(&silos, &services).await;
    next_confirmation(&services[0]).await;
    faults.clock.set_behind(Duration::from_secs(3));
    faults.transport.cut_for(Duration::from_secs(60));
    let start = std::time::Instant::now();
    let mut taken_over: Option<std::time::Instant> = None;
    let mut polls = 0u32;
    while taken_over.is_none_or(|t| t.elapsed() < Duration::from_secs(3)) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no other silo held the actor within 30 s"
        );
        let holders: Vec<usize> = (0..3).filter(|i| services[*i].fence(&a).is_some()).collect();
        assert!(holders.len() <= 1, "fenced on silos {holders:?} at once");
        if holders.iter().any(|i| *i != 0) && taken_over.is_none() {
            taken_over = Some(std::time::Instant::now());
        }
        polls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(polls > 100, "polled {polls} times");
}

/// Issue 73, item 1: a reminder service runs on a thread of its own. The
/// arbiter the application started it from stays busy for 4 s (twice the
/// lease period: a CPU-heavy actor; the `std::thread::sleep` is that
/// actor); `fence()`, polled every 10 ms from another thread meanwhile, never
/// lapses, since the service confirms its silo's row on its own thread.
/// Before, its confirmations waited for the busy arbiter and every fence
/// lapsed after the lease period.
#[actix::test]
async fn a_busy_application_arbiter_lapses_no_fence() {
    let store: rollcall_tests::Store = std::sync::Arc::new(rollcall_provider_memory::MemoryStore::new());
    busy_application_arbiter_lapses_no_fence(store).await;
}

/// [`a_busy_application_arbiter_lapses_no_fence`] on etcd, connected from the
/// application's arbiter: the client's connection must not live there.
#[cfg(feature = "etcd")]
#[actix::test]
async fn a_busy_application_arbiter_lapses_no_fence_on_etcd() {
    let Some(b) = rollcall_tests::fixtures::etcd().await else {
        return;
    };
    let store = rollcall::connect(&format!("etcd://{}", b.endpoint))
        .await
        .expect("connect");
    busy_application_arbiter_lapses_no_fence(store).await;
}

/// The same on Redis.
#[cfg(feature = "redis")]
#[actix::test]
async fn a_busy_application_arbiter_lapses_no_fence_on_redis() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    let store = rollcall::connect(&b.endpoint).await.expect("connect");
    busy_application_arbiter_lapses_no_fence(store).await;
}

async fn busy_application_arbiter_lapses_no_fence(store: rollcall_tests::Store) {
    let cluster = rollcall_tests::unique_id("busy-app");
    let (silos, services) = placed_silos(&store, &cluster, &[0]).await;
    let a = settled_actor_on_the_first(&silos, &services).await;
    next_confirmation(&services[0]).await;
    let busy = Duration::from_secs(4);
    let poller = {
        let service = services[0].clone();
        let a = a.clone();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let (mut polls, mut lapsed) = (0u32, 0u32);
            while started.elapsed() < busy {
                polls += 1;
                if service.fence(&a).is_none() {
                    lapsed += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (polls, lapsed)
        })
    };
    std::thread::sleep(busy);
    let (polls, lapsed) = poller.join().expect("the poller");
    assert!(polls > 100, "polled {polls} times");
    assert_eq!(
        lapsed, 0,
        "fence() lapsed at {lapsed} of {polls} polls while the application's arbiter was busy"
    );
}

//! The reminder service's rules as state machines only, in virtual time
//! ([`rollcall_reminders::sim`]): random registrations, unregistrations, joins,
//! graceful leaves, crashes, table outages and failing handlers, on the real
//! in-memory table. Checked: no occurrence is delivered twice; under graceful
//! churn none is lost; after a crash or during an outage only the occurrences
//! inside its window are lost; the machine's bounds hold.
//!
//! Every schedule here runs with checkpoints off (`lease_checkpoint_interval`
//! zero, [`base`]): these properties state the crash semantics of that
//! setting, where a crash repeats no periodic occurrence and may skip what
//! fell due before the takeover time. `takeover.rs` states those of the
//! default, with checkpoints.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rollcall_core::Timestamp;
use rollcall_provider_memory::MemoryStore;
use rollcall_reminders::machine::{NOTICE_ATTEMPTS, NOTICE_RETRY};
use rollcall_reminders::sim::{Config, World};
use rollcall_reminders::{MAX_DELIVERIES, MAX_NOTICE_READS, MAX_WRITES};

mod common;

/// The sweeps' schedules: `cases` from this file's fixed seed
/// ([`common::sweep_config`]).
fn config(cases: u32) -> ProptestConfig {
    common::sweep_config(cases, 20_261_125)
}

/// The world's default configuration with checkpoints off (see the module
/// docs).
fn base() -> Config {
    let mut cfg = Config::default();
    cfg.options.lease_checkpoint_interval = Duration::ZERO;
    cfg
}

/// One step of a schedule, after a gap.
#[derive(Clone, Debug)]
enum Op {
    Join,
    /// The k-th Active silo (mod their number) leaves, if another one stays.
    Leave(usize),
    /// The k-th Active silo crashes, if another one stays.
    Crash(usize),
    /// Reminder `name` of actor `actor`: first tick `delay` ms after 2 s, every
    /// `period` s.
    Register {
        actor: u8,
        name: u8,
        delay: u64,
        period: u64,
    },
    Unregister {
        actor: u8,
        name: u8,
    },
    /// The table is out for this many ms.
    Outage(u64),
    /// The k-th Active silo is declared Dead while it runs (cut off from the
    /// store and the other silos), if another one stays.
    FalseDeath(usize),
    /// Two Active silos (k-th and l-th) cannot reach each other for this many
    /// ms; both still reach the store.
    Partition(usize, usize, u64),
    /// Reminder `name` of `actor` of kind `kind` (see [`row_of_kind`]), first
    /// tick `delay` ms after 2 s.
    RegisterKind {
        actor: u8,
        name: u8,
        kind: u8,
        delay: u64,
    },
    /// The k-th Active silo leaves (if another one stays) and, `after` ms
    /// later, a reminder of kind `kind` is registered whose first tick is due
    /// `delay` ms from then: a registration racing a release.
    Handoff {
        k: usize,
        after: u64,
        actor: u8,
        kind: u8,
        delay: u64,
    },
}

/// The kinds a schedule registers: every second (`Skip`), every 2 s with
/// `FireOnce`, a one-shot, a calendar every second in Asia/Kolkata, every
/// second repeated 5 times, every second until 7 s after its start, every
/// second with a 1 KiB payload, and (the fault property's) every 2 s with a
/// retry policy that parks what it gives up.
const KINDS: u8 = 8;

/// Reminder `name` of `actor`, of kind `kind` (mod [`KINDS`]), first tick at
/// `start`.
fn row_of_kind(actor: &str, name: &str, kind: u8, start: Timestamp) -> rollcall_core::ReminderEntry {
    use rollcall_core::{MissedTickPolicy, ReminderEntry};
    let service = rollcall_reminders::sim::SERVICE;
    let second = Some(Duration::from_secs(1));
    let mut row = ReminderEntry::new(service, actor, name, start, second);
    match kind % KINDS {
        0 => {}
        1 => {
            row.period = Some(Duration::from_secs(2));
            row.missed_tick_policy = MissedTickPolicy::FireOnce;
        }
        2 => row.period = None,
        3 => {
            // On a whole second: the calendar's first occurrence is `start_at`.
            row.start_at = Timestamp::from_millis(start.as_millis().div_ceil(1000) * 1000);
            row.period = None;
            row.cron = Some("* * * * * *".to_owned());
            row.zone = Some("Asia/Kolkata".to_owned());
        }
        4 => row.end_at = Some(start.saturating_add(Duration::from_secs(4))),
        5 => row.end_at = Some(start.saturating_add(Duration::from_secs(7))),
        6 => row.payload = Some(vec![7; 1024]),
        _ => {
            row.period = Some(Duration::from_secs(2));
            row.retry = Some(rollcall_core::RetryPolicy {
                max_retries: 1,
                first_delay: Duration::from_millis(100),
                max_delay: Duration::from_millis(200),
                park: true,
            });
        }
    }
    row
}

/// `Op::Register` in one line: actor, name, delay (ms), period (s).
fn reg(actor: u8, name: u8, delay: u64, period: u64) -> Op {
    Op::Register {
        actor,
        name,
        delay,
        period,
    }
}

/// `Op::Unregister` in one line.
fn unreg(actor: u8, name: u8) -> Op {
    Op::Unregister { actor, name }
}

fn actor(a: u8) -> String {
    format!("sim/a{a}")
}

fn op(faults: bool) -> impl Strategy<Value = Op> {
    let register = (0u8..12, 0u8..2, 0u64..3000, 1u64..=2).prop_map(|(a, n, d, p)| reg(a, n, d, p));
    let unregister = (0u8..12, 0u8..2).prop_map(|(a, n)| unreg(a, n));
    if faults {
        let kind = (12u8..18, 0..KINDS, 0u64..3000).prop_map(|(actor, kind, delay)| Op::RegisterKind {
            actor,
            name: 0,
            kind,
            delay,
        });
        prop_oneof![
            3 => register,
            2 => kind,
            1 => unregister,
            2 => Just(Op::Join),
            2 => any::<usize>().prop_map(Op::Leave),
            2 => any::<usize>().prop_map(Op::Crash),
            1 => (500u64..8000).prop_map(Op::Outage),
        ]
        .boxed()
    } else {
        prop_oneof![
            3 => register,
            1 => unregister,
            2 => Just(Op::Join),
            2 => any::<usize>().prop_map(Op::Leave),
        ]
        .boxed()
    }
}

/// Steps of the third property: besides registrations, removals, joins and
/// leaves, crashes, false deaths and partitions between silos.
fn split_op() -> impl Strategy<Value = Op> {
    let register = (0u8..12, 0u8..2, 0u64..3000, 1u64..=2).prop_map(|(a, n, d, p)| reg(a, n, d, p));
    prop_oneof![
        3 => register,
        1 => (0u8..12, 0u8..2).prop_map(|(a, n)| unreg(a, n)),
        2 => Just(Op::Join),
        2 => any::<usize>().prop_map(Op::Leave),
        1 => any::<usize>().prop_map(Op::Crash),
        2 => any::<usize>().prop_map(Op::FalseDeath),
        2 => (any::<usize>(), any::<usize>(), 500u64..10_000).prop_map(|(k, l, ms)| Op::Partition(k, l, ms)),
    ]
}

/// Three silos, ten reminders, then `ops` each after its gap (ms), then 30 s of
/// quiet. Returns the world and the end of the schedule (virtual ms).
fn run(seed: u64, cfg: Config, ops: &[(u64, Op)]) -> (World, u64) {
    run_with(seed, cfg, ops, 3)
}

/// [`run`] with `silos` silos to start with.
fn run_with(seed: u64, cfg: Config, ops: &[(u64, Op)], silos: usize) -> (World, u64) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut w = World::new(cfg, seed, Arc::new(MemoryStore::new()));
    for _ in 0..silos {
        w.join();
        w.run_for(500);
    }
    for a in 0..10 {
        let start = World::time_at(w.now() + 2000 + u64::from(a) * 100);
        w.register(&actor(a), "r0", start, Duration::from_secs(1));
    }
    for (gap, op) in ops {
        w.run_for(*gap);
        let active = w.active();
        match op {
            Op::Join => {
                w.join();
            }
            Op::Leave(k) if active.len() > 1 => w.leave(active[k % active.len()]),
            Op::Crash(k) if active.len() > 1 => w.crash(active[k % active.len()]),
            Op::FalseDeath(k) if active.len() > 1 => w.false_death(active[k % active.len()]),
            Op::Partition(k, l, ms) if active.len() > 1 => {
                let (a, b) = (active[k % active.len()], active[l % active.len()]);
                if a != b {
                    w.partition(a, b, *ms);
                }
            }
            Op::Leave(_) | Op::Crash(_) | Op::FalseDeath(_) | Op::Partition(..) => {}
            Op::Register {
                actor: a,
                name,
                delay,
                period,
            } => {
                let start = World::time_at(w.now() + 2000 + delay);
                w.register(
                    &actor(*a),
                    &format!("r{name}"),
                    start,
                    Duration::from_secs(*period),
                );
            }
            Op::Unregister { actor: a, name } => {
                w.unregister(&actor(*a), &format!("r{name}"));
            }
            Op::Outage(ms) => w.outage(*ms),
            Op::RegisterKind {
                actor: a,
                name,
                kind,
                delay,
            } => {
                let start = World::time_at(w.now() + 2000 + delay);
                w.register_row(row_of_kind(&actor(*a), &format!("r{name}"), *kind, start));
            }
            Op::Handoff {
                k,
                after,
                actor: a,
                kind,
                delay,
            } => {
                if active.len() > 1 {
                    w.leave(active[k % active.len()]);
                }
                w.run_for(*after);
                let start = World::time_at(w.now() + delay);
                w.register_row(row_of_kind(&actor(*a), "h", *kind, start));
            }
        }
    }
    let end = w.now();
    w.run_for(30_000);
    (w, end)
}

fn check_bounds(w: &World) {
    assert_eq!(w.oversized, 0, "messages over the transport's size limit");
    let (d, wr, n) = w.max_in_flight;
    assert!(
        d <= MAX_DELIVERIES && wr <= MAX_WRITES && n <= MAX_NOTICE_READS,
        "{:?}",
        w.max_in_flight
    );
}

/// Runs `ops` from `seed` as [`run`] does, without faults, and asserts that every
/// occurrence was delivered exactly once.
fn assert_once_each(seed: u64, ops: &[(u64, Op)]) {
    let (w, end) = run(seed, base(), ops);
    let dup = w.duplicates();
    let missed = w.missed(end + 30_000 - TAIL, SLACK);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
    assert!(missed.is_empty(), "missed: {missed:?}");
}

/// The configuration of the fault property: 2% of the handlers fail.
fn with_faults() -> Config {
    Config {
        delivery_failure: 0.02,
        ..base()
    }
}

/// `cfg` with a lease period of `secs` s (the property tests draw it from 1 to
/// 5 s: the default is 2 s).
fn with_lease_period(mut cfg: Config, secs: u64) -> Config {
    cfg.options.lease_period = Duration::from_secs(secs);
    cfg
}

/// Runs `ops` from `seed` as [`run`] does, with [`with_faults`], and asserts that
/// no occurrence was delivered twice. Returns the world and the end of the
/// schedule.
fn assert_no_duplicate_with_faults(seed: u64, ops: &[(u64, Op)]) -> (World, u64) {
    let (w, end) = run(seed, with_faults(), ops);
    let dup = w.duplicates();
    assert!(dup.is_empty(), "duplicates: {dup:?}");
    (w, end)
}

/// Whether occurrence `t` of `r` is explained by a failed handler: a failed
/// occurrence is retried before the next one is due or given up; a retry still
/// running when the next one falls due skips that one (a handler that overran,
/// as Orleans).
fn lost_to_a_failed_handler(w: &World, r: &(String, String), t: Timestamp) -> bool {
    // The occurrence before `t` (by period or calendar).
    let before = w.reminders[r]
        .timing
        .at_or_before(Timestamp::from_millis(t.as_millis().saturating_sub(1)));
    w.failed.contains(&(r.clone(), t)) || before.is_some_and(|b| w.failed.contains(&(r.clone(), b)))
}

/// Asserts that every occurrence of the world of a schedule that ended at `end`
/// was delivered, but those a failed handler explains.
fn assert_lost_only_to_failed_handlers(w: &World, end: u64) {
    let lost: Vec<_> = w
        .missed(end + 30_000 - TAIL, SLACK)
        .into_iter()
        .filter(|(r, t)| !lost_to_a_failed_handler(w, r, *t))
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
}

/// When the failover of a crash declared at `declared` ends: `failover` after
/// it, and again `failover` after each join, leave or other death that falls
/// inside (the ring may give the shard to a silo that saw the holder Dead only
/// then, which waits the lease period from then).
fn failover_end(w: &World, declared: u64, failover: u64) -> u64 {
    let mut end = declared.saturating_add(failover);
    let changes: Vec<u64> = w
        .joins
        .iter()
        .map(|(_, t)| *t)
        .chain(w.leaves.iter().map(|(_, t, _)| *t))
        .chain(w.crashes.iter().filter_map(|c| c.declared))
        .collect();
    loop {
        let later = changes
            .iter()
            .filter(|t| **t >= declared && **t <= end)
            .map(|t| t + failover)
            .max()
            .unwrap_or(end);
        if later <= end {
            return end;
        }
        end = later;
    }
}

/// Asserts that every occurrence lost in `w` (a schedule that ended at `end`)
/// lies inside a window that explains it: a crash or false death of a silo that
/// owned it (from a period and a view's spread before, until detection, the lease
/// period, a poll and a load after), a table outage, a registration made during
/// a partition or through a silo that died or left before its notice got through
/// (until the next refresh), or a failed handler.
fn assert_explained(w: &World, cfg: &Config, end: u64, what: &str) -> Result<(), TestCaseError> {
    let failover = cfg.view_spread
        + cfg.options.lease_period.as_millis() as u64
        + cfg.options.lease_poll.as_millis() as u64
        + 2 * cfg.options.table_operation_timeout.as_millis() as u64;
    let reload = rollcall_reminders::machine::MAX_LOAD_BACKOFF.as_millis() as u64
        + 2 * cfg.options.table_operation_timeout.as_millis() as u64;
    let unexplained: Vec<_> = w
        .missed(end + 30_000 - TAIL, SLACK)
        .into_iter()
        .filter(|(r, t)| {
            let ms = t.as_millis() - rollcall_core::sim::T0_MS;
            let period = w.reminders[r].period.as_millis() as u64;
            // An occurrence handed over to the crashed silo is delivered once
            // its view shows the handoff (up to a view's spread later): a crash
            // within that much more than a period after it takes it down.
            // Not past a takeover of its shard after the crash: the Dead
            // holder stopped before the takeover time, and the successor owes
            // every occurrence from then on (a later fault has its own window).
            let shard = rollcall_core::actor_shard(&r.0, cfg.shards);
            let crash = w.crashes.iter().any(|c| {
                // After it was declared Dead, by another silo that was not
                // itself down by then.
                let taken_over = w.takeovers.iter().any(|(taker, k, at)| {
                    *taker != c.silo
                        && *k == shard
                        && c.declared
                            .is_some_and(|d| at.as_millis() > World::time_at(d).as_millis())
                        && at <= t
                        && !w
                            .crashes
                            .iter()
                            .any(|d| d.silo == *taker && d.at <= ms + period + cfg.view_spread)
                });
                c.owned.contains(r)
                    && ms + period + cfg.view_spread >= c.at
                    && ms <= failover_end(w, c.declared.unwrap_or(u64::MAX), failover)
                    && !taken_over
            });
            // An outage also takes down what a handoff that started up to a
            // view's spread before it still had to load.
            let outage = w
                .outages
                .iter()
                .any(|(from, to)| ms + cfg.view_spread >= *from && ms <= to + reload);
            // A registration during a partition, or up to the notice's six
            // sends 500 ms apart before it (a first send lost, the retries
            // inside the partition), whose notice could not reach the shard's
            // holder is found by the holder's next refresh. (Found by the
            // sweep, `PROPTEST_RNG_SEED=54`.)
            let life = &w.reminders[r];
            let refresh = cfg.options.refresh_reminder_list_period.as_millis() as u64 + reload;
            let retries = u64::from(NOTICE_ATTEMPTS) * NOTICE_RETRY.as_millis() as u64;
            let partition = w.partitioned.iter().any(|(from, to)| {
                life.registered + retries >= *from
                    && life.registered <= *to
                    && ms <= life.registered + refresh
            });
            // A registration whose registering silo died or left before its notice
            // got through (messages lost) is found by the holder's next refresh.
            let soon = |silo: usize, at: u64| {
                silo == life.via && at >= life.registered && at <= life.registered + 3_000
            };
            let notifier_died = (w.crashes.iter().any(|c| soon(c.silo, c.at))
                || w.leaves.iter().any(|l| l.2.is_some_and(|left| soon(l.0, left))))
                && ms <= life.registered + refresh;
            let failed = lost_to_a_failed_handler(w, r, *t);
            !(crash || outage || partition || notifier_died || failed)
        })
        .collect();
    prop_assert!(
        unexplained.is_empty(),
        "lost outside any window: {:?}; crashes {:?}; outages {:?}\n{what}",
        &unexplained[..unexplained.len().min(8)],
        w.crashes
            .iter()
            .map(|c| (c.silo, c.at, c.declared))
            .collect::<Vec<_>>(),
        w.outages
    );
    Ok(())
}

#[test]
fn a_fixed_graceful_schedule_delivers_every_occurrence_once() {
    let ops = vec![
        (3000, Op::Join),
        (4000, Op::Leave(0)),
        (1500, Op::Join),
        (2000, Op::Leave(2)),
        (5000, reg(11, 1, 0, 1)),
        (300, Op::Leave(1)),
        (6000, unreg(3, 0)),
    ];
    let (w, end) = run(1, base(), &ops);
    let dup = w.duplicates();
    let missed = w.missed(end + 25_000, SLACK);
    assert!(dup.is_empty(), "{} ticks, duplicates: {dup:?}", w.ticks.len());
    assert!(missed.is_empty(), "{} ticks, missed: {missed:?}", w.ticks.len());
    assert!(w.ticks.len() > 300, "{} ticks", w.ticks.len());
    check_bounds(&w);
}

/// The last scheduled occurrence the checks expect (ms before the end of the quiet
/// time): a tick handed over at the end is delivered well within it.
const TAIL: u64 = 5_000;

/// How long before its removal a reminder's occurrences may go undelivered (one
/// on its way when the owner reads the removal), ms.
const SLACK: u64 = 2_000;

proptest! {
    #![proptest_config(config(160))]

    /// Joins, graceful leaves, registrations and removals 0.2-6 s apart (so
    /// handoffs overlap and views disagree): no occurrence delivered twice, none
    /// lost, none later than a handoff can make it.
    #[test]
    fn graceful_churn_neither_repeats_nor_loses_an_occurrence(
        seed in any::<u64>(),
        lease_s in 1u64..6,
        ops in prop::collection::vec((200u64..6000, op(false)), 4..14),
    ) {
        let (w, end) = run(seed, with_lease_period(base(), lease_s), &ops);
        let dup = w.duplicates();
        prop_assert!(dup.is_empty(), "duplicates: {:?}\nseed {seed} ops {ops:?}", &dup[..dup.len().min(8)]);
        let missed = w.missed(end + 30_000 - TAIL, SLACK);
        prop_assert!(missed.is_empty(), "missed: {:?}\nseed {seed} ops {ops:?}", &missed[..missed.len().min(8)]);
        check_bounds(&w);
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// The same with crashes, table outages and 2% failing handlers, on clocks
    /// up to 250 ms off the world's (any two within the 500-ms bound): no occurrence
    /// delivered twice; an occurrence is lost only inside a window that explains
    /// it: a crash of its owner (from a period and a view's spread before the
    /// crash until the failover: declared Dead, every silo's view, the lease
    /// fence, a load), a table outage (from a view's spread before it, for a
    /// shard still loading, until a load after it), or a failed handler (given
    /// up when the retry would come after the next occurrence).
    #[test]
    fn faults_repeat_nothing_and_lose_only_inside_their_windows(
        seed in any::<u64>(),
        lease_s in 1u64..6,
        ops in prop::collection::vec((200u64..6000, op(true)), 4..14),
    ) {
        let cfg = Config {
            max_clock_offset: 500,
            ..with_lease_period(with_faults(), lease_s)
        };
        let (w, end) = run(seed, cfg.clone(), &ops);
        let dup = unexplained_repeats(&w, &cfg);
        prop_assert!(dup.is_empty(), "duplicates: {:?}\nseed {seed} ops {ops:?}", &dup[..dup.len().min(8)]);
        assert_explained(&w, &cfg, end, &format!("seed {seed} ops {ops:?}"))?;
        check_bounds(&w);
    }
}

/// The repeats that the stated crash semantics do not allow. Allowed: a
/// one-shot's or a `FireOnce` reminder's occurrence delivered again after the
/// silo that delivered it first crashed (or was declared Dead) before its
/// removal or `last_fired` write could land: within two table timeouts of
/// that delivery, or, when a table outage came between them, within the
/// write retry's longest backoff (and two timeouts) after the outage.
/// Periodic and calendar occurrences never repeat.
fn unexplained_repeats(w: &World, cfg: &Config) -> Vec<((String, String), Timestamp)> {
    let write_window = 2 * cfg.options.table_operation_timeout.as_millis() as u64;
    let after_outage = write_window + rollcall_reminders::machine::MAX_BACKOFF.as_millis() as u64;
    w.duplicates()
        .into_iter()
        .filter(|(r, t)| {
            let Some(first) = w.ticks.iter().find(|k| &k.reminder == r && k.scheduled == *t) else {
                return true;
            };
            // The registration the first delivery was planned from: a later
            // one may have replaced it with another kind.
            let Some(timing) = w.registration(r, &first.etag).map(|l| &l.timing) else {
                return true;
            };
            let at_least_once = timing.is_one_shot()
                || timing.missed_tick_policy == rollcall_core::MissedTickPolicy::FireOnce;
            let died_after = w.crashes.iter().any(|c| {
                c.silo == first.silo
                    && c.at >= first.at
                    && (c.at <= first.at + write_window
                        || w.outages.iter().any(|(from, to)| {
                            *to + write_window >= first.at && *from <= c.at && c.at <= to + after_outage
                        }))
            });
            // The stated case of a removal a holder inherits: the first
            // deliverer left gracefully while a table outage kept its removal
            // queued (a leave does not wait for it), and a later holder
            // crashed before its own removal of the row landed.
            let inherited = w.leaves.iter().any(|(s, _, left)| {
                *s == first.silo
                    && left.is_some_and(|l| {
                        w.outages
                            .iter()
                            .any(|(from, to)| *to + write_window >= first.at && *from <= l)
                    })
            }) && w.crashes.iter().any(|c| c.at >= first.at);
            !(at_least_once && (died_after || inherited))
        })
        .collect()
}

/// Steps of the every-kind property: registrations of every kind, removals,
/// joins, leaves, and registrations racing a leave.
fn kind_op() -> impl Strategy<Value = Op> {
    let register =
        (0u8..12, 0u8..2, 0..KINDS, 0u64..3000).prop_map(|(actor, name, kind, delay)| Op::RegisterKind {
            actor,
            name,
            kind,
            delay,
        });
    // First ticks from at once to 2 s after the registration: one due at
    // once, on a clock behind the releasing silo's, falls at or before the
    // release's watermark (sweep seed 38 found it lost before releases named
    // every row from `listed_from` on).
    let handoff = (any::<usize>(), 0u64..300, 12u8..24, 0..KINDS, 0u64..2000).prop_map(
        |(k, after, actor, kind, delay)| Op::Handoff {
            k,
            after,
            actor,
            kind,
            delay,
        },
    );
    prop_oneof![
        3 => register,
        1 => (0u8..12, 0u8..2).prop_map(|(a, n)| unreg(a, n)),
        2 => Just(Op::Join),
        2 => any::<usize>().prop_map(Op::Leave),
        2 => handoff,
    ]
}

/// The configuration of the every-kind property: clocks up to 250 ms off the
/// world's (any two within the 500-ms bound), handlers of up to 100 ms.
fn with_clocks() -> Config {
    Config {
        max_clock_offset: 500,
        handler: 100,
        ..base()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Every kind of reminder (periodic, `FireOnce`, one-shot, a calendar in a
    /// zone, a repeat count, an end, a payload) on 5 to 20 silos whose clocks
    /// are up to 250 ms apart from the world's, through joins, leaves and
    /// registrations racing a leave, ticks counted when their handler has run:
    /// no occurrence delivered twice, none lost.
    #[test]
    fn every_kind_on_offset_clocks_through_graceful_churn_neither_repeats_nor_loses(
        seed in any::<u64>(),
        silos in 5usize..=20,
        ops in prop::collection::vec((0u64..4000, kind_op()), 4..16),
    ) {
        let cfg = with_clocks();
        let (w, end) = run_with(seed, cfg.clone(), &ops, silos);
        let dup = w.duplicates();
        prop_assert!(dup.is_empty(), "duplicates: {:?}\nseed {seed} silos {silos} ops {ops:?}", &dup[..dup.len().min(8)]);
        // A tick due shortly before its reminder's removal, whose shard was
        // changing hands (a view up to `view_spread` late, then a load), may
        // still be on its way when the removal is read (sweep seed 164: three
        // leaves, then a removal 2,001 ms after the tick).
        let missed = w.missed(end + 30_000 - TAIL, SLACK + cfg.view_spread);
        prop_assert!(missed.is_empty(), "missed: {:?}\nseed {seed} silos {silos} ops {ops:?}", &missed[..missed.len().min(8)]);
        let foreign = w.foreign_ticks(SLACK + cfg.view_spread);
        prop_assert!(foreign.is_empty(), "foreign: {:?}\nseed {seed} silos {silos} ops {ops:?}", &foreign[..foreign.len().min(8)]);
        check_bounds(&w);
    }
}

/// A regression schedule kept from a random seed of the graceful-churn property: a join, a leave, then two joins 668 ms apart. Every occurrence is
/// delivered exactly once.
#[test]
fn three_joins_around_a_leave_deliver_every_occurrence_once() {
    let ops = vec![
        (343, Op::Join),
        (2179, Op::Leave(1_086_577_628_956_843_491)),
        (1153, Op::Join),
        (668, Op::Join),
    ];
    assert_once_each(15_110_814_259_630_567_966, &ops);
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): a leave, a registration, a crash 764 ms later, then a join.
/// No occurrence is delivered twice.
#[test]
fn a_leave_a_registration_a_crash_and_a_join_repeat_nothing() {
    let ops = vec![
        (2183, Op::Leave(15_507_254_076_904_455_043)),
        (4453, reg(0, 1, 0, 1)),
        (764, Op::Crash(13_856_863_650_566_444_623)),
        (3784, Op::Join),
    ];
    assert_no_duplicate_with_faults(6_574_212_339_858_785_347, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: five leaves and two joins, the last joiner leaving
/// 200 ms after it joined. Every occurrence is delivered exactly once.
#[test]
fn five_leaves_and_two_short_joins_deliver_every_occurrence_once() {
    let ops = vec![
        (2954, Op::Leave(5_594_129_122_179_634_562)),
        (3124, reg(0, 1, 1403, 2)),
        (1346, Op::Leave(0)),
        (939, Op::Leave(0)),
        (879, Op::Join),
        (2558, Op::Leave(0)),
        (200, Op::Join),
        (200, Op::Leave(2_777_457_959_843_441_113)),
    ];
    assert_once_each(12_167_970_949_498_898_634, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: five leaves and two joins interleaved with two
/// registrations. Every occurrence is delivered exactly once.
#[test]
fn leaves_and_joins_with_two_registrations_deliver_every_occurrence_once() {
    let ops = vec![
        (4418, Op::Leave(5_594_129_122_179_634_562)),
        (3776, reg(0, 1, 1403, 2)),
        (3647, Op::Leave(7_981_317_974_460_458_204)),
        (880, Op::Leave(0)),
        (879, Op::Join),
        (5800, Op::Leave(1_545_796_543_862_021_786)),
        (200, Op::Join),
        (667, reg(0, 0, 0, 1)),
        (367, Op::Leave(0)),
    ];
    assert_once_each(12_167_970_949_514_807_013, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: four joins (two 278 ms apart) and a leave around two
/// registrations. Every occurrence is delivered exactly once, although the
/// silos' views show the joiners at different times.
#[test]
fn four_joins_and_a_leave_deliver_every_occurrence_once() {
    let ops = vec![
        (2861, Op::Join),
        (2401, Op::Leave(8_482_739_342_656_126_928)),
        (2962, reg(9, 0, 897, 1)),
        (1738, Op::Join),
        (3613, reg(2, 0, 0, 1)),
        (1225, Op::Join),
        (278, Op::Join),
    ];
    assert_once_each(6_732_471_167_206_314_058, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: four leaves and two joins, with a leaver already gone
/// from some views. Every occurrence is delivered exactly once.
#[test]
fn a_leaver_absent_from_a_view_delivers_nothing_twice() {
    let ops = vec![
        (1669, Op::Leave(5_252_363_320_572_642_997)),
        (5129, Op::Join),
        (4081, Op::Leave(824_352_221_837_442_919)),
        (1153, reg(5, 0, 787, 2)),
        (2142, Op::Leave(2_076_131_072_523_692_399)),
        (3612, Op::Join),
        (1032, Op::Leave(2_140_289_795_495_383_164)),
    ];
    assert_once_each(12_211_787_657_370_347_167, &ops);
}

/// Found by a random seed (237): an occurrence due as its owner crashed was
/// delivered twice.
#[test]
fn an_occurrence_due_at_a_crash_is_not_delivered_twice() {
    let ops = vec![
        (2100, Op::Crash(16_935_587_393_976_658_070)),
        (1399, Op::Outage(2358)),
        (1857, reg(0, 0, 0, 1)),
        (1944, Op::Join),
        (200, Op::Leave(503_572_354_960_967_360)),
    ];
    assert_no_duplicate_with_faults(208_409_030_055_144_059, &ops);
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): two leaves 318 ms apart, a registration and a join. No
/// occurrence is delivered twice, and every one missed is a failed handler's.
#[test]
fn two_quick_leaves_and_a_join_lose_nothing() {
    let ops = vec![
        (210, Op::Leave(14_050_947_624_754_628_059)),
        (318, Op::Leave(185_400_934_801_079_318)),
        (200, reg(0, 0, 0, 1)),
        (206, Op::Join),
    ];
    let (w, end) = assert_no_duplicate_with_faults(1_891_328_977_685_059_997, &ops);
    assert_lost_only_to_failed_handlers(&w, end);
}

/// A notice its owner never takes is sent 6 times, 500 ms apart; one the owner
/// takes is not sent again.
#[test]
fn a_notice_is_sent_again_until_taken_six_times_at_most() {
    use rollcall_reminders::machine::NoticeRetry;
    let mut never = NoticeRetry::new("svc", "cart/1", "tick");
    let mut sends = 1;
    while let Some(wait) = never.after_send(false) {
        assert_eq!(wait, NOTICE_RETRY);
        sends += 1;
        assert!(sends <= 100, "never stops");
    }
    assert_eq!(sends, NOTICE_ATTEMPTS);
    assert_eq!(NOTICE_ATTEMPTS, 6);
    assert_eq!(NOTICE_RETRY, Duration::from_millis(500));

    let mut taken = NoticeRetry::new("svc", "cart/1", "tick");
    assert_eq!(taken.after_send(false), Some(NOTICE_RETRY));
    assert_eq!(taken.after_send(true), None);
    assert_eq!(taken.notice().actor, "cart/1");
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): registrations and removals around a leave, an
/// outage, a crash and a last leave. No occurrence is delivered twice.
#[test]
fn an_outage_a_crash_and_leaves_around_registrations_repeat_nothing() {
    let ops = vec![
        (1995, unreg(0, 1)),
        (758, Op::Leave(14_893_591_550_742_894_512)),
        (1726, unreg(8, 0)),
        (949, Op::Join),
        (229, Op::Outage(5012)),
        (961, reg(0, 0, 0, 1)),
        (4245, unreg(8, 0)),
        (5094, reg(1, 0, 0, 2)),
        (3743, Op::Crash(898_006_118_707)),
        (349, reg(2, 1, 1367, 2)),
        (4275, reg(8, 0, 733, 2)),
        (1937, Op::Leave(5_407_087_247_571_000_569)),
    ];
    assert_no_duplicate_with_faults(13_028_759_906_655_512_632, &ops);
}

/// Found by a random seed (`PROPTEST_RNG_SEED=385`): a reminder registered
/// while its shard fails over from a crashed holder. Its first tick is
/// delivered only if it falls after the successor's takeover time: before it,
/// a silo declared Dead while it ran could have delivered it (the row is in
/// the store for it to read), so the takeover plans nothing earlier, and a
/// loss there is the crash window's.
#[test]
fn a_reminder_registered_while_its_shard_fails_over_loses_at_most_the_crash_window() {
    let ops = vec![
        (1956, Op::Crash(12_853_232_967_127_460_865)),
        (409, Op::Crash(1_507_290_585_291_314_339)),
        (569, Op::Leave(0)),
        (5854, reg(8, 0, 1607, 1)),
        (4344, Op::Join),
        (2368, Op::Crash(341_932_303_354_587_726)),
        (2069, unreg(8, 1)),
        (3161, Op::Crash(18_014_488_880_167_578_397)),
        (4599, reg(4, 1, 53, 2)),
    ];
    let (w, end) = assert_no_duplicate_with_faults(11_885_945_492_863_337_252, &ops);
    assert_explained(&w, &with_faults(), end, "seed 385").unwrap();
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): three leaves around a 1.2-s outage, right after a
/// join (see [`three_leaves_around_an_outage`]). No occurrence is delivered
/// twice.
#[test]
fn three_leaves_around_an_outage_repeat_nothing() {
    let (seed, ops) = three_leaves_around_an_outage();
    assert_no_duplicate_with_faults(seed, &ops);
}

/// A schedule of three leaves around an outage: its seed and its steps.
fn three_leaves_around_an_outage() -> (u64, Vec<(u64, Op)>) {
    (
        2_541_171_392_648_112_584,
        vec![
            (4393, reg(11, 0, 2307, 1)),
            (4908, Op::Join),
            (999, Op::Leave(2_531_430_471_439_135_786)),
            (1192, Op::Leave(10_835_800_673_216_762_001)),
            (200, Op::Outage(1152)),
            (200, Op::Leave(13_314_968_966_173_395_836)),
        ],
    )
}

/// The same seed and schedule give the same world: every tick, when and by which
/// silo (a seed found by a sweep must replay; the machine iterates no hash map
/// whose order varies between runs). Two runs in one process, over schedules
/// with leaves, crashes, joins and an outage.
#[test]
fn a_schedule_replays_the_same_ticks() {
    let schedules: Vec<(u64, Vec<(u64, Op)>)> = vec![
        (
            4_295_128_999_117_256_411,
            vec![
                (3594, Op::Leave(3_824_191_959_266_605_691)),
                (1419, Op::Crash(152_254_537_599_123_307)),
                (491, reg(0, 0, 0, 1)),
                (2897, Op::Join),
                (200, Op::Leave(1_221_349_001_460_004_963)),
            ],
        ),
        three_leaves_around_an_outage(),
        (
            7,
            vec![
                (500, Op::Join),
                (300, Op::Join),
                (900, Op::Leave(1)),
                (400, Op::Crash(2)),
                (600, Op::Join),
                (300, Op::Outage(2000)),
                (800, Op::Leave(3)),
                (200, Op::Join),
            ],
        ),
    ];
    for (seed, ops) in &schedules {
        let (a, _) = run(*seed, with_faults(), ops);
        let (b, _) = run(*seed, with_faults(), ops);
        assert!(!a.ticks.is_empty());
        assert_eq!(a.ticks, b.ticks, "seed {seed}");
    }
}

/// Two regression schedules kept from random seeds of the fault property (2%
/// of handlers fail): a leave, a crash, an outage and a short-lived joiner; a
/// leave and a crash among removals. No occurrence is delivered twice.
#[test]
fn leaves_crashes_and_an_outage_repeat_nothing() {
    let ops = vec![
        (1543, Op::Leave(1_980_083_043_705_264_866)),
        (1879, reg(2, 1, 1850, 1)),
        (2978, Op::Crash(184_070_072_653_009_782)),
        (3432, Op::Outage(2769)),
        (1171, Op::Join),
        (467, Op::Leave(4_901_183_807_122_061_291)),
    ];
    assert_no_duplicate_with_faults(5_873_567_798_007_910_858, &ops);
    let ops = vec![
        (3706, unreg(6, 0)),
        (3097, Op::Leave(5_201_955_609_799_601_228)),
        (1773, Op::Crash(0)),
        (540, unreg(5, 0)),
        (1472, unreg(0, 1)),
        (1833, unreg(0, 0)),
        (1903, Op::Join),
        (626, Op::Leave(8_885_677_633_239_221_939)),
    ];
    assert_no_duplicate_with_faults(17_448_473_828_235_553_749, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: three leaves 602, 200 and 200 ms apart, then a
/// registration. Every occurrence is delivered exactly once.
#[test]
fn three_quick_leaves_deliver_every_occurrence_once() {
    let ops = vec![
        (476, Op::Leave(4_176_904_940_786_254_589)),
        (602, Op::Leave(3_282_998_322_567_486_643)),
        (200, Op::Leave(0)),
        (200, reg(0, 0, 0, 1)),
    ];
    assert_once_each(10_195_061_564_203_189_536, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: seven joins and four leaves among registrations and
/// removals, one removal read by a refresh just before its notice. Every
/// occurrence is delivered exactly once, and a removed reminder is not
/// scheduled again.
#[test]
fn many_joins_and_leaves_among_registrations_deliver_every_occurrence_once() {
    let ops = vec![
        (1438, Op::Join),
        (4353, Op::Leave(4_772_707_906_474_243_108)),
        (3541, Op::Leave(11_563_196_878_891_397_546)),
        (217, reg(3, 1, 0, 1)),
        (465, Op::Join),
        (235, Op::Join),
    ];
    assert_once_each(4_699_716_576_329_897_336, &ops);
    let ops = vec![
        (1832, Op::Leave(7_353_257_286_093_661_284)),
        (569, reg(2, 0, 2488, 2)),
        (681, Op::Join),
        (5252, Op::Join),
        (504, reg(0, 1, 2690, 2)),
        (2364, reg(0, 0, 687, 1)),
        (1167, Op::Join),
        (4519, Op::Join),
        (387, unreg(1, 1)),
        (2222, Op::Leave(6_452_476_633_314_007_418)),
        (351, unreg(0, 0)),
    ];
    assert_once_each(2_082_370_776_797_218_766, &ops);
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): six joins and two leaves among removals. No
/// occurrence is delivered twice.
#[test]
fn six_joins_and_two_leaves_repeat_nothing() {
    let ops = vec![
        (1276, Op::Join),
        (4232, Op::Leave(9_966_689_131_773_802_929)),
        (3071, unreg(2, 0)),
        (4795, reg(8, 0, 1173, 1)),
        (2640, Op::Join),
        (4495, Op::Join),
        (228, Op::Join),
        (5481, unreg(0, 1)),
        (2785, Op::Leave(17_393_660_460_120_131_498)),
        (784, Op::Join),
        (349, Op::Join),
    ];
    assert_no_duplicate_with_faults(4_800_668_579_079_213_882, &ops);
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): two leaves, and a handler that fails on the first
/// tick of a catch-up. The owed ticks after it are still delivered: every
/// occurrence missed is a failed handler's, and none is delivered twice.
#[test]
fn a_failed_tick_in_a_catch_up_does_not_skip_the_owed_ones_after_it() {
    let ops = vec![
        (3776, Op::Leave(8_647_168_414_802_639_692)),
        (883, Op::Leave(563_731_754_167_406_334)),
        (200, reg(3, 1, 0, 1)),
        (1062, reg(0, 0, 0, 1)),
    ];
    let (w, end) = assert_no_duplicate_with_faults(17_726_044_455_331_051_263, &ops);
    assert_lost_only_to_failed_handlers(&w, end);
}

/// A regression schedule kept from a random seed of the graceful-churn property: five joins, three of them 200 to 500 ms apart.
/// Every occurrence is delivered exactly once.
#[test]
fn five_joins_200_to_500_ms_apart_deliver_every_occurrence_once() {
    let ops = vec![
        (2429, Op::Join),
        (1378, Op::Join),
        (404, reg(3, 0, 146, 1)),
        (5086, reg(10, 0, 250, 1)),
        (1921, Op::Join),
        (215, Op::Join),
        (482, Op::Join),
    ];
    assert_once_each(13_204_742_025_454_080_846, &ops);
}

/// A regression schedule kept from a random seed of the graceful-churn property: three joins and two leaves around a registration.
/// Every occurrence is delivered exactly once.
#[test]
fn three_joins_and_two_leaves_deliver_every_occurrence_once() {
    let ops = vec![
        (1289, reg(8, 0, 0, 2)),
        (3405, Op::Join),
        (4422, Op::Leave(2_268_921_598_413_351_388)),
        (1584, Op::Leave(1_802_421_898_747_388_774)),
        (403, Op::Join),
        (297, Op::Join),
    ];
    assert_once_each(12_293_132_276_248_700_641, &ops);
}

/// Found by a random seed (`PROPTEST_RNG_SEED=794`): a handler failed twice on
/// one occurrence; the second retry was planned after the next occurrence had
/// passed and succeeded after the one after that, so one failure cost three
/// occurrences. A retry must come before the occurrence right after the failed
/// one; otherwise the failed one is given up at once.
#[test]
fn a_failed_occurrence_costs_at_most_the_next_one() {
    let ops = vec![
        (2033, reg(1, 1, 667, 2)),
        (3366, reg(0, 1, 2, 1)),
        (4367, reg(2, 0, 304, 1)),
        (2866, unreg(2, 1)),
        (5408, unreg(2, 0)),
    ];
    let (w, end) = assert_no_duplicate_with_faults(5_813_684_837_905_708_792, &ops);
    assert!(!w.failed.is_empty(), "the schedule lets a handler fail");
    assert_lost_only_to_failed_handlers(&w, end);
}

/// Two regression schedules kept from random seeds of the graceful-churn
/// property: eight joins and three leaves, the last leaver going 200 to 246 ms
/// after the last join. Every occurrence is delivered exactly once.
#[test]
fn eight_joins_and_three_leaves_deliver_every_occurrence_once() {
    let ops = vec![
        (5489, unreg(2, 0)),
        (2953, Op::Join),
        (5577, Op::Join),
        (867, Op::Leave(1_170_052_857_166_505_960)),
        (907, Op::Leave(13_467_892_891_419_186_673)),
        (5058, Op::Join),
        (383, Op::Join),
        (4267, Op::Join),
        (521, Op::Join),
        (246, Op::Leave(18_315_139_448_342_969_273)),
    ];
    assert_once_each(7_375_634_071_040_886_671, &ops);
    let ops = vec![
        (4176, unreg(2, 0)),
        (3589, Op::Join),
        (5587, Op::Join),
        (867, Op::Leave(1_170_052_857_166_505_960)),
        (907, Op::Leave(13_467_892_891_419_186_673)),
        (5214, Op::Join),
        (370, Op::Join),
        (4336, Op::Join),
        (627, Op::Join),
        (200, Op::Leave(18_315_139_448_342_969_273)),
    ];
    assert_once_each(7_379_701_938_916_857_996, &ops);
}

/// A regression schedule kept from a random seed of the fault property (2% of handlers fail): a join, a leave, a crash and a leave, seconds apart.
/// No occurrence is delivered twice.
#[test]
fn a_join_a_leave_a_crash_and_a_leave_repeat_nothing() {
    let ops = vec![
        (2326, Op::Join),
        (1956, Op::Leave(2_024_465_920_100_966_728)),
        (4238, Op::Crash(6_751_273_445_204_059_254)),
        (5680, Op::Leave(3_225_926_335_662_371_347)),
    ];
    assert_no_duplicate_with_faults(17_274_542_498_788_633_923, &ops);
}

/// Found by a random seed (`PROPTEST_RNG_SEED=923`), a gap in the world's
/// bookkeeping, not in the machine: a reminder registered 20 ms after a crashed
/// owner was declared Dead, through a silo whose view still showed it Active,
/// waits for the failover like one registered before (its notice went to the
/// crashed silo, and the silo that sent it left). Its first tick, lost in the
/// failover window, counts as the crash's.
#[test]
fn a_reminder_registered_through_a_view_that_shows_the_crashed_owner_is_its() {
    let ops = vec![
        (3504, reg(0, 1, 562, 2)),
        (996, Op::Crash(2_106_162_678_088_179_864)),
        (3493, Op::Leave(8_187_812_741_429_047_135)),
        (200, reg(8, 1, 0, 1)),
        (255, Op::Join),
        (452, Op::Leave(2_481_041_817_551_677_538)),
    ];
    let (w, _) = assert_no_duplicate_with_faults(3_996_221_161_796_208_965, &ops);
    let r = (actor(8), "r1".to_owned());
    assert!(
        w.crashes.iter().any(|c| c.owned.contains(&r)),
        "{r:?} was registered into the crashed silo's range"
    );
}

/// A regression schedule kept from a random seed of the graceful-churn property: three leaves 200 to 300 ms apart around a
/// registration. Every occurrence is delivered exactly once, the first ticks
/// included.
#[test]
fn three_leaves_around_a_registration_deliver_every_occurrence_once() {
    let ops = vec![
        (228, Op::Leave(1_517_526_857_360_749_751)),
        (283, Op::Leave(5_399_343_353_076_823_922)),
        (200, reg(0, 0, 0, 1)),
        (200, Op::Leave(0)),
    ];
    assert_once_each(241_195_703_926_664_731, &ops);
}

/// Two regression schedules kept from random seeds of the fault property (2%
/// of handlers fail): a registration whose first tick is due 30 ms after it,
/// between two leaves (or a leave, a join and a leave) 200 to 456 ms apart.
/// No occurrence is delivered twice, and every one missed is a failed
/// handler's.
#[test]
fn a_registration_between_quick_leaves_keeps_its_first_tick() {
    let ops = vec![
        (217, Op::Leave(7_466_837_871_500_849_434)),
        (202, unreg(0, 1)),
        (456, Op::Leave(1_024_986_019_997_415_764)),
        (406, reg(0, 1, 0, 1)),
    ];
    let (w, end) = assert_no_duplicate_with_faults(8_038_981_694_034_883_705, &ops);
    assert_lost_only_to_failed_handlers(&w, end);
    // The second schedule, from the same seed.
    let ops = vec![
        (217, Op::Leave(7_466_837_871_500_849_434)),
        (202, Op::Join),
        (213, Op::Leave(5_149_779_919_530_780_886)),
        (200, reg(0, 1, 0, 1)),
    ];
    let (w, end) = assert_no_duplicate_with_faults(8_038_981_694_034_883_705, &ops);
    assert_lost_only_to_failed_handlers(&w, end);
}

proptest! {
    #![proptest_config(config(32))]

    /// 10 to 20 silos whose clocks are up to 250 ms off the world's, false
    /// deaths (a silo declared Dead while it runs on, cut off from the store
    /// and the other silos), partitions between silos that both still reach
    /// the store, 5% of the messages between live silos lost, crashes, and
    /// concurrent acquires: no occurrence delivered twice; losses only inside
    /// the windows of crashes and false deaths.
    #[test]
    fn false_deaths_partitions_and_lost_messages_repeat_nothing(
        seed in any::<u64>(),
        silos in 10usize..20,
        lease_s in 1u64..6,
        ops in prop::collection::vec((200u64..6000, split_op()), 4..16),
    ) {
        let cfg = with_lease_period(Config {
            message_loss: 0.05,
            max_clock_offset: 500,
            ..base()
        }, lease_s);
        let (w, end) = run_with(seed, cfg.clone(), &ops, silos);
        let dup = w.duplicates();
        prop_assert!(dup.is_empty(), "duplicates: {:?}\nseed {seed} silos {silos} ops {ops:?}", &dup[..dup.len().min(8)]);
        assert_explained(&w, &cfg, end, &format!("seed {seed} silos {silos} ops {ops:?}"))?;
        check_bounds(&w);
    }
}

/// The false-death property carries weight: with fencing off, a silo declared
/// Dead while it runs keeps delivering what its successor delivers too; with
/// fencing on (the default), the same schedules repeat nothing.
#[test]
fn without_fencing_a_false_death_delivers_twice() {
    let ops = vec![
        (3000, Op::FalseDeath(0)),
        (4000, Op::Join),
        (3000, Op::FalseDeath(1)),
    ];
    let mut repeated = 0;
    for seed in 0..16 {
        let mut cfg = base();
        cfg.options.lease_fencing = false;
        let (w, _) = run_with(seed, cfg, &ops, 4);
        repeated += w.duplicates().len();
        let (w, _) = run_with(seed, base(), &ops, 4);
        assert!(w.duplicates().is_empty(), "seed {seed}: {:?}", w.duplicates());
    }
    assert!(repeated > 0, "no schedule repeated a tick without fencing");
}

/// Issue 57's clock hole: the silo that releases a shard sets its watermark
/// by its own clock; a one-shot registered right after the release's final
/// read, due at once by a clock up to `max_clock_offset` behind, falls at or
/// before that watermark though nobody saw it. It is delivered, once, however
/// the registration falls against the release.
#[test]
fn a_one_shot_registered_as_a_clock_ahead_releases_its_shard_is_delivered() {
    // Every seed's schedule: (one-shots missed, delivered twice).
    let run_all = |told: Option<u64>| {
        let cfg = Config {
            max_clock_offset: 2_000,
            clock_bound_told: told,
            ..base()
        };
        let a = actor(12);
        let shard = rollcall_core::actor_shard(&a, cfg.shards);
        let (mut missed, mut twice) = (0, 0);
        for seed in 0..8 {
            let mut w = World::new(cfg.clone(), seed, Arc::new(MemoryStore::new()));
            for _ in 0..3 {
                w.join();
                w.run_for(500);
            }
            w.run_for(3_000);
            let holder = w.holder_of(shard).expect("the shard is held");
            // Within the bound: the holder 1 s ahead of the median, another
            // silo 1 s behind it.
            for (n, i) in w.active().into_iter().filter(|i| *i != holder).enumerate() {
                w.set_clock_offset(i, -1_000 * n as i64);
            }
            w.set_clock_offset(holder, 1_000);
            // Busy: an occurrence starts every 100 ms, so the watermark is the
            // releasing clock's now.
            w.register(
                &a,
                "busy",
                World::time_at(w.now() + 1_000),
                Duration::from_millis(100),
            );
            w.run_for(3_000);
            w.leave(holder);
            for n in 0..30 {
                w.run_for(10);
                let start = World::time_at(w.now());
                assert!(w.register_row(row_of_kind(&a, &format!("h{n}"), 2, start)));
            }
            w.run_for(15_000);
            missed += w.missed(w.now() - 5_000, SLACK).len();
            twice += w.duplicates().len();
        }
        (missed, twice)
    };
    assert_eq!(run_all(None), (0, 0), "(missed, twice) with the bound");
    let (missed, _) = run_all(Some(0));
    assert!(
        missed > 0,
        "no one-shot was lost with the bound left out of the release"
    );
}

/// The clock bound carries weight: silos whose clocks are up to 4 s apart
/// repeat ticks after false deaths when their fence does not know it, and
/// none when it does.
#[test]
fn a_fence_that_ignores_the_clock_bound_delivers_twice() {
    let ops = vec![
        (3000, Op::FalseDeath(0)),
        (4000, Op::Join),
        (3000, Op::FalseDeath(1)),
        (3000, Op::FalseDeath(2)),
    ];
    // Detected within 0.5-1.5 s (as the fast membership profile does), so
    // a zombie's clock ahead by more than that outruns a fence of `L` alone.
    let skewed = |told| Config {
        max_clock_offset: 4_000,
        clock_bound_told: told,
        detection: (500, 1_500),
        ..base()
    };
    let mut repeated = 0;
    // (Seeds 26, 32 and 39 repeat without the bound since the shard machine
    // reads its held leases again, whose reads draw from the world's random
    // latencies: before, some seed below 24 did.)
    for seed in 0..40 {
        let (w, _) = run_with(seed, skewed(Some(0)), &ops, 6);
        repeated += w.duplicates().len();
        let (w, _) = run_with(seed, skewed(None), &ops, 6);
        assert!(w.duplicates().is_empty(), "seed {seed}: {:?}", w.duplicates());
    }
    assert!(
        repeated > 0,
        "no schedule repeated a tick with the bound left out of the fence"
    );
}

/// Found by the false-death property (5% of messages lost, 19 silos): a
/// reminder lost its ticks for seven seconds without any fault but lost
/// messages.
#[test]
fn lost_messages_among_many_silos_lose_no_tick() {
    let ops = vec![
        (200, reg(1, 0, 0, 1)),
        (200, reg(1, 0, 0, 1)),
        (200, reg(0, 1, 0, 1)),
        (200, reg(0, 1, 0, 1)),
    ];
    let cfg = Config {
        message_loss: 0.05,
        ..base()
    };
    let (w, end) = run_with(14_629_161_582_410_388_316, cfg, &ops, 19);
    assert!(w.duplicates().is_empty());
    let missed = w.missed(end + 30_000 - TAIL, SLACK);
    assert!(missed.is_empty(), "missed: {missed:?}");
}

/// Found by the false-death property: a registration made while its silo was
/// cut off from the shard's holder (a partition) reaches the holder only by
/// the holder's next refresh; the ticks until then are the partition's window,
/// and nothing is delivered twice.
#[test]
fn a_registration_during_a_partition_waits_at_most_for_the_refresh() {
    let ops = vec![
        (5414, reg(0, 1, 1120, 1)),
        (916, Op::Join),
        (4038, Op::FalseDeath(7_800_098_889_478_854_088)),
        (4140, Op::Leave(10_382_778_263_085_881_382)),
        (1429, reg(1, 1, 1094, 1)),
        (5093, Op::Join),
        (3370, Op::Join),
        (
            2750,
            Op::Partition(2_414_456_159_098_650_907, 13_681_921_896_236_770_704, 6051),
        ),
        (3550, reg(4, 0, 0, 1)),
    ];
    let cfg = Config {
        message_loss: 0.05,
        ..base()
    };
    let (w, end) = run_with(8_360_038_638_722_526_403, cfg.clone(), &ops, 14);
    assert!(w.duplicates().is_empty());
    assert_explained(&w, &cfg, end, "").unwrap();
}

/// Found by a seed sweep (`PROPTEST_RNG_SEED=3`): a reminder of a crashed
/// silo lost an occurrence just after the failover window.
#[test]
fn a_crashed_holders_shard_fails_over_within_the_window() {
    let ops = vec![
        (1517, Op::Join),
        (4595, reg(7, 0, 0, 1)),
        (3508, reg(3, 0, 1624, 1)),
        (1786, Op::Leave(4_540_858_352_141_777_227)),
        (5794, Op::Crash(1_268_352_903_648_700_313)),
        (4060, reg(0, 0, 0, 1)),
        (3643, Op::Join),
        (2562, Op::Leave(666_254_500_672_447_947)),
        (900, Op::Join),
    ];
    let (w, end) = assert_no_duplicate_with_faults(18_044_188_100_107_887_867, &ops);
    assert_explained(&w, &with_faults(), end, "").unwrap();
}

/// Found by a seed sweep (`PROPTEST_RNG_SEED=2`): two crashes and an outage;
/// the second death moved the first victim's shard during its failover.
#[test]
fn a_second_death_during_a_failover_extends_its_window_only() {
    let ops = vec![
        (3975, reg(7, 0, 0, 2)),
        (1925, Op::Crash(76_518_549_911_071_583)),
        (800, unreg(0, 0)),
        (3251, Op::Outage(2378)),
        (4349, Op::Crash(1_092_167_518_497_435_181)),
        (362, Op::Join),
        (4758, Op::Join),
        (2949, Op::Join),
    ];
    let (w, end) = assert_no_duplicate_with_faults(14_238_501_115_363_951_043, &ops);
    assert_explained(&w, &with_faults(), end, "").unwrap();
}

/// Found by a seed sweep (`PROPTEST_RNG_SEED=6`, the false-death property): a
/// registration's first notice was lost and its registering silo was cut off
/// 200 ms later, so the holder learned of it only at its next refresh.
#[test]
fn a_registration_just_before_a_false_death_is_delivered_after_the_failover() {
    let ops = vec![
        (746, reg(5, 1, 1819, 1)),
        (3880, Op::Partition(0, 0, 500)),
        (5898, reg(4, 0, 1279, 2)),
        (4358, Op::Leave(11_914_604_527_919_461_927)),
        (2920, Op::FalseDeath(14_834_374_131_555_459_858)),
        (2398, reg(10, 0, 978, 2)),
        (2370, Op::Leave(18_233_928_718_355_992_011)),
        (1520, unreg(1, 0)),
        (4941, Op::Crash(12_705_006_722_870_990_279)),
        (4121, reg(2, 0, 0, 1)),
        (200, Op::FalseDeath(14_201_468_921_258_553_807)),
    ];
    let cfg = Config {
        message_loss: 0.05,
        ..base()
    };
    let (w, end) = run_with(2_014_247_751_782_107_680, cfg.clone(), &ops, 11);
    assert!(w.duplicates().is_empty());
    assert_explained(&w, &cfg, end, "").unwrap();
}

/// Found by a seed sweep (`PROPTEST_RNG_SEED=8`, the false-death property):
/// a registration through a silo that left 200 ms later, its first notice
/// lost: the holder learns of it at its next refresh.
#[test]
fn a_registration_through_a_leaver_whose_notice_was_lost_waits_for_the_refresh() {
    let ops = vec![
        (200, Op::Leave(14_508_165_496_354_887_651)),
        (200, reg(0, 0, 0, 1)),
        (200, reg(0, 0, 0, 1)),
        (200, reg(0, 0, 0, 1)),
    ];
    let cfg = Config {
        message_loss: 0.05,
        ..base()
    };
    let (w, end) = run_with(2_910_746_976_038_140_624, cfg.clone(), &ops, 14);
    assert!(w.duplicates().is_empty());
    assert_explained(&w, &cfg, end, "").unwrap();
}

/// Found by the sweep (`PROPTEST_RNG_SEED=24`, with a 5-s lease period): a
/// registration through a silo whose view still showed a silo that had left
/// sent its notices there (not taken), and the registering silo itself left
/// before its retries ran out: the holder learned of the change only at its
/// refresh, 30 s later. Notices now go to the holder the shard's lease names,
/// and a graceful leave waits for them.
#[test]
fn a_registration_through_a_silo_with_a_stale_view_reaches_the_leases_holder() {
    let ops = vec![
        (617, Op::Leave(3_298_762_710_996_817_730)),
        (200, reg(0, 0, 0, 1)),
        (200, reg(0, 0, 0, 1)),
        (200, Op::Leave(14_513_189_434_233_071_090)),
    ];
    let (w, end) = run(18_308_326_791_995_828_990, with_lease_period(base(), 5), &ops);
    assert!(w.duplicates().is_empty());
    let missed = w.missed(end + 30_000 - TAIL, SLACK);
    assert!(missed.is_empty(), "missed: {missed:?}");
}

/// Found by the sweep (`PROPTEST_RNG_SEED=608`): two crashes and an outage
/// leave one silo; a reminder registered twice around the second crash's
/// declaration lost five seconds of ticks long after the failover: two notice
/// reads of its row answered out of order, and the older answer put the
/// replaced schedule back (one read per row at a time now: `NoticeReads`).
#[test]
fn a_reregistration_around_a_failover_loses_nothing_after_it() {
    let ops = vec![
        (3300, Op::Crash(12_960_369_635_207_441_735)),
        (571, Op::Outage(624)),
        (2584, reg(10, 0, 702, 1)),
        (2701, Op::Crash(6_354_447_308_306_910_642)),
        (2520, reg(1, 1, 0, 1)),
        (2003, Op::Leave(0)),
        (521, reg(1, 1, 0, 1)),
    ];
    let cfg = with_lease_period(with_faults(), 2);
    let (w, end) = assert_no_duplicate_with_faults(10_474_776_644_687_175_547, &ops);
    assert_explained(&w, &cfg, end, "").unwrap();
}

/// A mass due time under a small delivery cap: 300 reminders due at one
/// instant on three silos that each run at most 4 handlers at once. Every
/// one is delivered once, no silo ever runs more than 4, and the backlog
/// shows as lateness instead of tasks.
#[test]
fn a_mass_due_time_is_delivered_once_each_under_the_delivery_cap() {
    let mut cfg = base();
    cfg.options.max_deliveries = 4;
    let mut w = World::new(cfg, 7, Arc::new(MemoryStore::new()));
    for _ in 0..3 {
        w.join();
        w.run_for(500);
    }
    let due = World::time_at(w.now() + 5_000);
    for a in 0..300u32 {
        w.register(&format!("sim/m{a}"), "r0", due, Duration::from_secs(3_600));
    }
    w.run_for(20_000);
    assert!(w.duplicates().is_empty(), "{:?}", w.duplicates());
    let at_due: Vec<_> = w.ticks.iter().filter(|t| t.scheduled == due).collect();
    assert_eq!(at_due.len(), 300);
    assert_eq!(w.max_in_flight.0, 4, "the cap binds and holds");
    let due_ms = due.as_millis() - rollcall_core::sim::T0_MS;
    let latest = at_due.iter().map(|t| t.at - due_ms).max().unwrap();
    assert!(latest > 100, "the backlog waited: {latest} ms");
}

/// Found by the every-kind property: a reminder registered as its shard's
/// holder leaves, with its first tick due at once.
#[test]
fn a_registration_racing_a_release_keeps_its_first_tick() {
    let ops = vec![
        (0, Op::Leave(10_729_439_368_030_043_084)),
        (0, Op::Join),
        (0, Op::Leave(188_569_812_741_789_815)),
        (0, Op::Leave(960_263_620_043_225_406)),
        (0, Op::Join),
        (
            0,
            Op::Handoff {
                k: 3_797_131_379_234_860_885,
                after: 0,
                actor: 18,
                kind: 0,
                delay: 0,
            },
        ),
    ];
    let (w, end) = run_with(5_923_932_359_647_257_516, with_clocks(), &ops, 7);
    let missed = w.missed(end + 30_000 - TAIL, SLACK);
    assert!(missed.is_empty(), "missed: {missed:?}");
    assert!(w.duplicates().is_empty());
}

proptest! {
    #![proptest_config(config(16))]

    /// Backlogs over a release's old cap (1,024) and over a minute: 1,100 to
    /// 1,500 one-shots of one shard due at one instant on 5 to 20 silos with
    /// clocks up to 250 ms apart, one delivery at a time per silo with
    /// handlers of up to 200 ms (about 2 minutes of backlog); the holder
    /// leaves 5 to 90 s into it, and others join and leave meanwhile: every
    /// one-shot delivered once, counted when its handler has run.
    #[test]
    fn a_backlog_released_at_any_point_delivers_every_one_shot_once(
        seed in any::<u64>(),
        silos in 5usize..=20,
        count in 1_100usize..1_500,
        leave_after in 5_000u64..90_000,
        churn in prop::collection::vec((0u64..20_000, prop_oneof![Just(Op::Join), any::<usize>().prop_map(Op::Leave)]), 0..4),
    ) {
        backlog_released(seed, silos, count, leave_after, &churn)?;
    }
}

/// The backlog property's schedule (see there).
fn backlog_released(
    seed: u64,
    silos: usize,
    count: usize,
    leave_after: u64,
    churn: &[(u64, Op)],
) -> Result<(), TestCaseError> {
    let mut cfg = with_clocks();
    cfg.handler = 200;
    cfg.shards = 8;
    cfg.options.max_deliveries = 1;
    let mut w = World::new(cfg, seed, Arc::new(MemoryStore::new()));
    for _ in 0..silos {
        w.join();
        w.run_for(300);
    }
    w.run_for(3_000);
    let due = World::time_at(w.now() + 2_000);
    let mut actors = Vec::new();
    let mut i = 0u32;
    while actors.len() < count {
        let a = format!("sim/b{i}");
        if rollcall_core::actor_shard(&a, 8) == 0 {
            actors.push(a);
        }
        i += 1;
    }
    for a in &actors {
        let mut once = rollcall_core::ReminderEntry::new(rollcall_reminders::sim::SERVICE, a, "b", due, None);
        once.payload = Some(vec![1; 16]);
        prop_assert!(w.register_row(once));
    }
    w.run_for(2_000 + leave_after);
    let holder = w.holder_of(0);
    prop_assert!(holder.is_some(), "shard 0 is held");
    if let Some(h) = holder.filter(|_| w.active().len() > 1) {
        w.leave(h);
    }
    for (gap, op) in churn {
        w.run_for(*gap);
        let active = w.active();
        match op {
            Op::Join => {
                w.join();
            }
            Op::Leave(k) if active.len() > 1 => w.leave(active[k % active.len()]),
            _ => {}
        }
    }
    w.run_for(400_000);
    let dup = w.duplicates();
    prop_assert!(dup.is_empty(), "duplicates: {:?}", &dup[..dup.len().min(8)]);
    let burst: Vec<_> = w.ticks.iter().filter(|t| t.scheduled == due).collect();
    prop_assert_eq!(burst.len(), count, "every one-shot once");
    let due_ms = due.as_millis() - rollcall_core::sim::T0_MS;
    let backlog = burst
        .iter()
        .map(|t| t.at.saturating_sub(due_ms))
        .max()
        .unwrap_or(0);
    prop_assert!(backlog > 60_000, "a backlog over a minute: {} ms", backlog);
    check_bounds(&w);
    Ok(())
}

/// Found by the backlog property: the holder of a shard with a backlog of
/// 1,319 one-shots leaves 81.5 s into it, two silos join meanwhile.
#[test]
fn a_backlog_released_late_with_joins_delivers_every_one_shot_once() {
    let churn = [(19_117, Op::Join), (7_543, Op::Join)];
    backlog_released(3_736_273_193_400_452_046, 19, 1_319, 81_508, &churn).unwrap();
}

/// Found by sweep seed 46 of the fault property: a one-shot delivered just
/// before a table outage, whose holder then left before its removal could
/// land, was delivered again by the successor's next refresh.
#[test]
fn a_one_shot_whose_removal_a_leaver_never_wrote_is_not_delivered_again() {
    let ops = vec![
        (608, reg(0, 0, 0, 1)),
        (200, reg(0, 0, 0, 1)),
        (
            200,
            Op::RegisterKind {
                actor: 17,
                name: 0,
                kind: 2,
                delay: 0,
            },
        ),
        (200, Op::Join),
        (456, Op::Outage(4331)),
        (1344, Op::Leave(9_311_136_669_415_777_397)),
    ];
    let cfg = with_lease_period(with_faults(), 2);
    let (w, _) = run(7_161_460_376_358_197_205, cfg.clone(), &ops);
    let dup = unexplained_repeats(&w, &cfg);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
}

/// Found by sweep seed 88 of the fault property: a one-shot delivered during a
/// table outage, whose removal was still queued (retrying with backoff) when
/// its silo crashed 2 s after the outage, is delivered again: the crash rule.
#[test]
fn a_one_shot_whose_removal_waited_out_an_outage_may_repeat_after_a_crash() {
    let ops = vec![
        (
            200,
            Op::RegisterKind {
                actor: 17,
                name: 0,
                kind: 2,
                delay: 867,
            },
        ),
        (847, Op::Outage(4054)),
        (651, reg(0, 0, 0, 1)),
        (1672, Op::Join),
        (3703, Op::Crash(18_154_902_624_608_455_261)),
    ];
    let cfg = with_lease_period(with_faults(), 3);
    // World seed 19 replays it since the shard machine reads its held
    // leases again (their reads draw from the world's random latencies).
    let (w, _) = run(19, cfg.clone(), &ops);
    assert_eq!(w.duplicates().len(), 1, "the one-shot repeats");
    let dup = unexplained_repeats(&w, &cfg);
    assert!(dup.is_empty(), "explained by the crash rule: {dup:?}");
}

/// Found by sweep seed 258 of the fault property: a one-shot delivered during
/// a table outage, whose removal was still retrying when its silo crashed 3.6 s
/// later, is delivered again by the successor (the crash rule), and the same
/// (actor, name) is then registered again as a calendar. The repeat must be
/// judged by the registration it was planned from, the one-shot, not by the
/// calendar that replaced it (the property's explanation once read the latest
/// registration and called this repeat unexplained).
#[test]
fn a_one_shot_repeated_after_a_crash_is_judged_by_its_own_registration() {
    let ops = vec![
        (
            5076,
            Op::RegisterKind {
                actor: 15,
                name: 0,
                kind: 2,
                delay: 0,
            },
        ),
        (362, Op::Outage(4122)),
        (1662, Op::Leave(1_747_218_686_787_412_712)),
        (3562, Op::Crash(156_684_468_930_210_416)),
        (2760, unreg(0, 1)),
        (5435, reg(0, 0, 1318, 1)),
        (
            3315,
            Op::RegisterKind {
                actor: 15,
                name: 0,
                kind: 3,
                delay: 0,
            },
        ),
    ];
    let cfg = with_lease_period(with_faults(), 5);
    // World seed 3: the sweep's seed replayed this before the shard
    // machine read its held leases again (rule 10), whose reads draw from
    // the world's random latencies; 3 replays it now (the one-shot of
    // sim/a15 repeats, then is registered again as a calendar).
    let (w, _) = run(3, cfg.clone(), &ops);
    assert_eq!(w.duplicates().len(), 1, "the one-shot repeats");
    let dup = unexplained_repeats(&w, &cfg);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
}

/// Found by sweep seed 390 of the every-kind property once handoff
/// registrations could be due at once: a refresh load of a held shard read a
/// row 50 ms after its first tick and before the row's notice was read, and
/// planned it as a load plans (a `Skip` reminder's past first tick dropped).
/// A row a refresh finds that this silo has no slot for was registered while
/// this silo held the shard: its first tick is due late, as a notice's.
#[test]
fn a_refresh_that_reads_a_new_row_before_its_notice_delivers_its_first_tick() {
    let ops = vec![
        (3658, Op::Unregister { actor: 0, name: 0 }),
        (
            425,
            Op::RegisterKind {
                actor: 1,
                name: 0,
                kind: 5,
                delay: 0,
            },
        ),
        (
            682,
            Op::RegisterKind {
                actor: 5,
                name: 0,
                kind: 0,
                delay: 299,
            },
        ),
        (1537, Op::Unregister { actor: 0, name: 0 }),
        (
            2097,
            Op::RegisterKind {
                actor: 3,
                name: 0,
                kind: 0,
                delay: 2413,
            },
        ),
        (
            1987,
            Op::Handoff {
                k: 274769565886441325,
                after: 75,
                actor: 14,
                kind: 3,
                delay: 540,
            },
        ),
        (
            3036,
            Op::RegisterKind {
                actor: 0,
                name: 0,
                kind: 5,
                delay: 2381,
            },
        ),
        (
            3191,
            Op::Handoff {
                k: 11048658330873572863,
                after: 118,
                actor: 12,
                kind: 0,
                delay: 258,
            },
        ),
        (
            1685,
            Op::RegisterKind {
                actor: 2,
                name: 1,
                kind: 0,
                delay: 2321,
            },
        ),
        (
            1923,
            Op::RegisterKind {
                actor: 7,
                name: 0,
                kind: 0,
                delay: 743,
            },
        ),
        (
            2466,
            Op::Handoff {
                k: 9046079159961008686,
                after: 76,
                actor: 22,
                kind: 4,
                delay: 0,
            },
        ),
    ];
    let cfg = with_clocks();
    let (w, end) = run_with(10_313_921_371_394_055_603, cfg.clone(), &ops, 16);
    assert!(w.duplicates().is_empty(), "{:?}", w.duplicates());
    let missed = w.missed(end + 30_000 - TAIL, SLACK + cfg.view_spread);
    assert!(missed.is_empty(), "missed: {missed:?}");
}

/// Found by sweep seed 1018 of the every-kind property: a calendar reminder
/// registered again with its first tick on the old registration's next one
/// (the whole second after `now`), its notice read answered in the same
/// millisecond the old tick fell due. Both are delivered: two registrations,
/// two occurrences (`occurrence_id` differs by etag), neither out of its own
/// schedule. The property once counted them as one occurrence twice.
#[test]
fn a_registration_replaced_on_its_next_tick_delivers_each_occurrence_once() {
    let ops = vec![
        (
            2295,
            Op::RegisterKind {
                actor: 0,
                name: 0,
                kind: 0,
                delay: 0,
            },
        ),
        (
            1353,
            Op::Handoff {
                k: 1_154_144_223_036_976_569,
                after: 293,
                actor: 12,
                kind: 0,
                delay: 0,
            },
        ),
        (
            3316,
            Op::RegisterKind {
                actor: 0,
                name: 0,
                kind: 0,
                delay: 0,
            },
        ),
        (
            454,
            Op::Handoff {
                k: 25_926_931_672_762_302,
                after: 184,
                actor: 20,
                kind: 3,
                delay: 0,
            },
        ),
        (2603, Op::Leave(173_938_247_687_633_275)),
        (
            2663,
            Op::Handoff {
                k: 7_325_229_902_526_398_671,
                after: 55,
                actor: 20,
                kind: 3,
                delay: 0,
            },
        ),
    ];
    let cfg = with_clocks();
    let (w, end) = run_with(384_172_996_700_801_820, cfg.clone(), &ops, 9);
    assert!(w.duplicates().is_empty(), "{:?}", w.duplicates());
    let foreign = w.foreign_ticks(SLACK + cfg.view_spread);
    assert!(foreign.is_empty(), "foreign: {foreign:?}");
    let missed = w.missed(end + 30_000 - TAIL, SLACK + cfg.view_spread);
    assert!(missed.is_empty(), "missed: {missed:?}");
}

/// Found by sweep seed 1087 of the every-kind property: a refresh round
/// started three loads; a one-shot delivered meanwhile was removed while
/// they ran; a load that started after the removal ended first and forgot
/// it, and an earlier load, whose read came before the removal, planned the
/// one-shot again: delivered twice. A removal is forgotten only once no
/// running load started before it.
#[test]
fn a_removal_is_remembered_until_every_load_older_than_it_ends() {
    let ops = vec![
        (
            902,
            Op::Handoff {
                k: 10_928_088_203_288_329_100,
                after: 118,
                actor: 12,
                kind: 2,
                delay: 0,
            },
        ),
        (
            3261,
            Op::RegisterKind {
                actor: 0,
                name: 1,
                kind: 4,
                delay: 0,
            },
        ),
        (1799, unreg(1, 0)),
        (
            2564,
            Op::Handoff {
                k: 2_389_351_061_398_340_152,
                after: 123,
                actor: 17,
                kind: 6,
                delay: 172,
            },
        ),
        (3946, Op::Leave(6_525_713_021_565_012_025)),
        (
            2861,
            Op::RegisterKind {
                actor: 2,
                name: 0,
                kind: 5,
                delay: 2420,
            },
        ),
        (175, Op::Leave(5_885_247_941_142_270_091)),
        (2013, Op::Join),
        (2853, Op::Leave(4_852_198_025_905_406_066)),
        (
            3853,
            Op::RegisterKind {
                actor: 3,
                name: 1,
                kind: 2,
                delay: 444,
            },
        ),
    ];
    let cfg = with_clocks();
    let (w, end) = run_with(1_384_347_637_196_056_337, cfg.clone(), &ops, 6);
    assert!(w.duplicates().is_empty(), "{:?}", w.duplicates());
    let missed = w.missed(end + 30_000 - TAIL, SLACK + cfg.view_spread);
    assert!(missed.is_empty(), "missed: {missed:?}");
    let foreign = w.foreign_ticks(SLACK + cfg.view_spread);
    assert!(foreign.is_empty(), "foreign: {foreign:?}");
}

/// Found by sweep seed 1921 of the fault property with clocks: a one-shot
/// delivered during a table outage by a silo that then left (its removal
/// still queued, the release naming it done); the next holder crashed as it
/// acquired, and the takeover, which cannot tell the row was delivered,
/// delivered it again. The crash rule states this case; the check allows it.
#[test]
fn a_removal_inherited_from_a_leaver_may_repeat_after_a_crash() {
    let ops = vec![
        (3721, Op::Outage(5436)),
        (3572, reg(0, 0, 0, 1)),
        (
            3577,
            Op::RegisterKind {
                actor: 13,
                name: 0,
                kind: 2,
                delay: 0,
            },
        ),
        (1027, Op::Outage(3588)),
        (1595, Op::Leave(5_249_619_455_794_179_234)),
        (2655, Op::Crash(2_840_025_578_602_250_694)),
    ];
    let cfg = Config {
        max_clock_offset: 500,
        ..with_lease_period(with_faults(), 2)
    };
    let (w, _) = run(4_439_710_034_309_740_007, cfg.clone(), &ops);
    let dup = unexplained_repeats(&w, &cfg);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
}

/// Found by sweep seed 1981 of the fault property with clocks: a late
/// notice's row read, asked before a one-shot's delivery and answered
/// between the delivery and its removal, planned the one-shot again:
/// delivered twice with no crash. An answer naming a registration this silo
/// delivered to its end (removal pending or landed since) is dropped.
#[test]
fn a_notice_read_answered_after_the_delivery_does_not_repeat_it() {
    let ops = vec![
        (2659, Op::Outage(6166)),
        (2792, reg(0, 0, 0, 1)),
        (3524, Op::Outage(848)),
        (3853, Op::Crash(1_681_648_044_335_474_760)),
        (5029, Op::Outage(3184)),
        (1681, reg(0, 0, 0, 1)),
        (4336, Op::Crash(12_238_776_228_795_226_633)),
        (3855, reg(2, 0, 0, 1)),
        (
            212,
            Op::RegisterKind {
                actor: 16,
                name: 0,
                kind: 2,
                delay: 651,
            },
        ),
    ];
    let cfg = Config {
        max_clock_offset: 500,
        ..with_lease_period(with_faults(), 2)
    };
    let (w, _) = run(2_691_892_677_824_917_624, cfg.clone(), &ops);
    let dup = unexplained_repeats(&w, &cfg);
    assert!(dup.is_empty(), "duplicates: {dup:?}");
}

proptest! {
    #![proptest_config(config(48))]

    /// The fault property with at most 4 ticks of one actor kind delivered at
    /// once (`max_deliveries_per_kind`; every actor of the world is of one
    /// kind): the per-kind bookkeeping loses no delivery slot (a kind that
    /// kept a slot it no longer uses would stop, and its occurrences would be
    /// missed) and repeats nothing.
    #[test]
    fn a_per_kind_cap_repeats_nothing_and_loses_only_inside_the_windows(
        seed in any::<u64>(),
        lease_s in 1u64..6,
        ops in prop::collection::vec((200u64..6000, op(true)), 4..14),
    ) {
        let mut cfg = Config {
            max_clock_offset: 500,
            ..with_lease_period(with_faults(), lease_s)
        };
        cfg.options.max_deliveries_per_kind = Some(4);
        let (w, end) = run(seed, cfg.clone(), &ops);
        let dup = unexplained_repeats(&w, &cfg);
        prop_assert!(dup.is_empty(), "duplicates: {:?}\nseed {seed} ops {ops:?}", &dup[..dup.len().min(8)]);
        assert_explained(&w, &cfg, end, &format!("seed {seed} ops {ops:?}"))?;
        check_bounds(&w);
    }
}

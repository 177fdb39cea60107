//! Graceful handoffs under load, across silo processes (`backlog-silo`) on one
//! real store: a shard whose holder leaves (its graceful shutdown, as on
//! SIGTERM) while it has a backlog of
//! owed ticks must hand every owed tick to its successor, however many and
//! however large their keys, and promptly. A tick counts when its handler has
//! run (the processes log it then), so a tick whose delivery started but whose
//! handler never ran is a lost tick here.

#![cfg(any(feature = "redis", feature = "etcd"))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rollcall_core::lease::{LeaseStatus, ShardLeases};
use rollcall_tests::unique_id;

mod backlog;
use backlog::*;

/// 200 every-second reminders, first due 2 s on, spread over a second
/// (over every shard with `BACKLOG_ANY_SHARD`).
fn every_second() -> Burst {
    Burst {
        count: 200,
        id_bytes: 0,
        due: Duration::from_secs(2),
        spread: Duration::from_secs(1),
        handler_ms: 0,
        max_deliveries: None,
        stop_after: 0,
        period: Some(Duration::from_secs(1)),
        written_before: false,
        store_latency: None,
    }
}

/// The lease of `shard` as the test reads it: a failed read (the test's own
/// connection reset, seen once on etcd) is read again, up to 20 times.
async fn read_lease(leases: &ShardLeases, shard: u32) -> rollcall_core::lease::ShardLease {
    let mut tries = 0;
    loop {
        match leases.read(shard).await {
            Ok(l) => return l,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("a lease read failed, again: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("lease reads keep failing: {e}"),
        }
    }
}

/// Who holds each shard: its owner's address while the lease is Owned.
async fn holders(leases: &ShardLeases) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for k in 0..SHARDS {
        let lease = read_lease(leases, k).await;
        out.push(
            (lease.status == LeaseStatus::Owned)
                .then(|| lease.owner.map(|o| o.to_string()))
                .flatten(),
        );
    }
    out
}

/// The every-second occurrences of each reminder of `all` (from its first
/// tick on) due from `from` to `horizon` (ms) that nobody delivered:
/// `(actor, scheduled ms)`.
fn missed_seconds(
    all: &BTreeMap<(String, String, u64), Vec<String>>,
    from: u64,
    horizon: u64,
) -> Vec<(String, u64)> {
    let mut per_actor: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (actor, _, s) in all.keys() {
        per_actor.entry(actor.as_str()).or_default().push(*s);
    }
    let mut missed = Vec::new();
    for (actor, times) in per_actor {
        let Some(&first) = times.first() else { continue };
        let mut t = first;
        while t <= horizon {
            if t >= from && times.binary_search(&t).is_err() {
                missed.push((actor.to_owned(), t));
            }
            t += 1_000;
        }
    }
    missed
}

/// How long after a handler's last logged line its service may learn that
/// it ended (the handler replies, the reply reaches the reminder agent):
/// 214 ms seen on a loaded machine.
const REPLY_LAG: u64 = 500;

/// Splits `missed` (from [`missed_seconds`]) into the occurrences `Skip`
/// dropped as its policy says, and the rest (lost). A skip is the policy's
/// when the reminder's run history (read from the store) records the
/// occurrence as skipped (a handler overran it) and the occurrence before
/// it was logged no more than [`REPLY_LAG`] before it was due: its handler
/// (a fenced state write, up to 2 s under load) ran into it. Returns the
/// number of such skips and the rest.
async fn overrun_skips(
    conn: &std::sync::Arc<dyn rollcall_core::SystemStore>,
    cluster: &str,
    all: &BTreeMap<(String, String, u64), Vec<String>>,
    logs: &[&Path],
    missed: Vec<(String, u64)>,
) -> (usize, Vec<(String, u64)>) {
    if missed.is_empty() {
        return (0, missed);
    }
    // When each occurrence was logged: `actor name scheduled logged silo`.
    let mut logged: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for log in logs {
        for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if let (5, Ok(s), Ok(at)) = (f.len(), f[2].parse::<u64>(), f[3].parse::<u64>()) {
                logged.insert((f[0].to_owned(), s), at);
            }
        }
    }
    let table = conn.reminder_table(cluster).expect("reminder table");
    let mut skipped = 0;
    let mut lost = Vec::new();
    for (actor, t) in missed {
        let name = all
            .keys()
            .find(|(a, _, _)| *a == actor)
            .map(|(_, n, _)| n.clone())
            .expect("a missed reminder ticked once");
        let runs = table.read_runs(&actor, &name).await.unwrap_or_default();
        let recorded = runs
            .iter()
            .any(|r| r.scheduled.as_millis() == t && r.outcome == rollcall_core::RunOutcome::Skipped);
        let overran = logged
            .get(&(actor.clone(), t.saturating_sub(1_000)))
            .is_some_and(|at| *at + REPLY_LAG >= t);
        if recorded && overran {
            skipped += 1;
        } else {
            lost.push((actor, t));
        }
    }
    (skipped, lost)
}

/// A shard with a backlog of `burst` one-shots is released by its holder's
/// graceful leave in the middle of the burst: the lease leaves the holder
/// within 10 s of its shutdown beginning, and the successor delivers every owed
/// one-shot, each exactly once over both processes.
async fn a_release_during_a_backlog_hands_over_every_owed_tick(store: &str, burst: Burst) {
    let cluster = unique_id("backlog");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    // The holder of shard 0 stops itself (its graceful shutdown, as on
    // SIGTERM) once it has logged `stop_after` ticks: a test that watched
    // the logs and sent the signal was starved under load until 19,143 of
    // 20,000 were delivered.
    let stop_file = dir.join("stopped");
    let mut env = vec![
        ("BACKLOG_HANDLER_MS", burst.handler_ms.to_string()),
        ("BACKLOG_STOP_AFTER", burst.stop_after.to_string()),
        ("BACKLOG_STOP_FILE", stop_file.display().to_string()),
    ];
    if let Some(n) = burst.max_deliveries {
        env.push(("BACKLOG_MAX_DELIVERIES", n.to_string()));
    }
    if let Some(p) = burst.period {
        env.push(("BACKLOG_PERIOD_MS", p.as_millis().to_string()));
    }
    if burst.written_before {
        write_burst(store, &cluster, &burst).await;
    }
    let registered = (!burst.written_before).then_some(&burst);
    let proxy = match burst.store_latency {
        Some(_) => Some(delayed(store).await),
        None => None,
    };
    let silos_store = proxy.as_ref().map_or(store, |(_, url)| url.as_str());
    let mut a = start(&cluster, silos_store, &dir, "a", &env, None).await;
    let mut b = start(&cluster, silos_store, &dir, "b", &env, registered).await;
    if let (Some((p, _)), Some(latency)) = (&proxy, burst.store_latency) {
        p.set_delay(latency);
    }
    // `<unix ms> <silo address>`, written when the stop began.
    let stop_line = || {
        let line = std::fs::read_to_string(&stop_file).ok()?;
        let (ms, silo) = line.trim().split_once(' ')?;
        Some((ms.parse::<u64>().ok()?, silo.to_owned()))
    };
    until(
        burst.due + Duration::from_secs(120),
        "the holder stops itself",
        || stop_line().is_some(),
    )
    .await;
    let (stopped_ms, stopped_silo) = stop_line().expect("the stop file");
    let logs = [a.log.clone(), b.log.clone()];
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let (holder, successor) = if a.address == stopped_silo {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    // The bound below runs from when the holder's shutdown began (it prints
    // `stopping <ms>`): a process whose one thread its deliveries saturate
    // sees its stop late (15 s on a slow machine, as it sees a SIGTERM),
    // which is reported, not bounded, here.
    let stopping = || {
        let out = holder
            .stdout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.iter()
            .find_map(|l| l.strip_prefix("stopping ").and_then(|ms| ms.parse::<u64>().ok()))
    };
    until(Duration::from_secs(120), "the holder's shutdown begins", || {
        stopping().is_some()
    })
    .await;
    let began_ms = stopping().expect("the stopping line");
    // Where in the burst the release came is printed below; that it came
    // before the burst's end is asserted there (the successor delivered owed
    // ticks). On a slow machine the etcd run's holder began its shutdown
    // 15-18 s late, 19,313 of 20,000 ticks in: see `stopping` above.
    let delivered_before = lines(&holder.log);
    let seen_after = Duration::from_millis(began_ms.saturating_sub(stopped_ms));
    let since_stop = || {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Duration::from_millis(now.saturating_sub(began_ms))
    };

    // The lease leaves the holder promptly.
    let conn = rollcall::connect(store).await.expect("connect");
    let leases = ShardLeases::open(conn.lease_table(&cluster).expect("lease table"), SHARDS)
        .await
        .expect("leases");
    let holder_address = holder.address.clone();
    loop {
        let moved = match leases.read(0).await {
            Ok(lease) => {
                lease.status == LeaseStatus::Released
                    || lease.owner.map(|o| o.to_string()) != Some(holder_address.clone())
            }
            Err(e) => panic!("reading the lease of shard 0: {e}"),
        };
        if moved {
            break;
        }
        assert!(
            since_stop() < Duration::from_secs(10),
            "the lease of shard 0 still names {holder_address} 10 s after its shutdown began"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let released_in = since_stop();
    // The release lands in the middle of the burst, not after it (issue
    // 73): where the stop comes early (at most half the burst in), the
    // holder had delivered under three quarters when its lease moved.
    let delivered_at_release = lines(&holder.log);
    if burst.stop_after <= burst.count / 2 {
        assert!(
            delivered_at_release < burst.count * 3 / 4,
            "the release landed after three quarters of the burst ({delivered_at_release} of {})",
            burst.count
        );
    }
    // Then the successor holds it (at once when the release landed: within
    // a poll, or a hint).
    let successor_address = successor.address.clone();
    loop {
        let lease = leases.read(0).await.expect("reading the lease of shard 0");
        if lease.status == LeaseStatus::Owned
            && lease.owner.map(|o| o.to_string()) == Some(successor_address.clone())
        {
            break;
        }
        assert!(
            since_stop() < Duration::from_secs(30),
            "the successor does not hold shard 0 30 s after the holder's shutdown began: {:?} {:?}",
            lease.status,
            lease.owner
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let owned_in = since_stop();
    exits(holder, Duration::from_secs(30)).await;

    // The successor delivers the rest; then it leaves too, so the logs are final.
    // What must be delivered once each: every one-shot, or every periodic
    // reminder's first occurrence (the earliest scheduled time: all share it).
    let owed = |all: &BTreeMap<(String, String, u64), Vec<String>>| -> usize {
        match burst.period {
            None => all.len(),
            Some(period) => {
                // The first occurrences share their time to within the few ms
                // registering takes (each is `due` after its own registration).
                let Some(first) = all.keys().map(|(_, _, s)| *s).min() else {
                    return 0;
                };
                let window = first + period.as_millis() as u64 / 2;
                all.keys().filter(|(_, _, s)| *s < window).count()
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let seen = owed(&ticks(&paths));
        if seen >= burst.count {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{seen} of {} owed ticks delivered 180 s after the stop",
            burst.count
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sigterm(successor);
    exits(successor, Duration::from_secs(30)).await;
    let all = ticks(&paths);
    let twice: Vec<_> = all.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{} ticks delivered more than once, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(owed(&all), burst.count, "every owed tick, once");
    let by_successor = all.values().filter(|by| by[0] == successor_address).count();
    println!(
        "{} {} of {}-byte ids: the shutdown began {seen_after:?} after the stop, the lease moved \
         {released_in:?} after that, the successor held it {owned_in:?} after that; \
         {delivered_before} ticks delivered before it, {by_successor} by the successor",
        burst.count,
        if burst.period.is_some() {
            "periodic reminders"
        } else {
            "one-shots"
        },
        burst.id_bytes
    );
    assert!(by_successor > 0, "the successor delivered the owed ones");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (c): 2,000 one-shots of 900-byte actor ids with 100-ms handlers, 16 at
/// once: a backlog of 12 s, whose release owes far more than one lease row
/// holds (256 KiB).
fn long_ids() -> Burst {
    Burst {
        count: 2_000,
        id_bytes: 900,
        due: Duration::from_secs(2),
        spread: Duration::from_millis(500),
        handler_ms: 100,
        max_deliveries: Some(16),
        stop_after: 100,
        period: None,
        written_before: false,
        store_latency: None,
    }
}

/// (a): one-shots of one shard due together, the stop a tenth into the
/// burst: 100,000 due within 5 s with `ROLLCALL_HANDOFF_FULL=1` (as in the
/// issue; registering them takes a while), 20,000 due at one instant
/// otherwise (CI), so that most of them are due and waiting when the release
/// is written. Handlers of 20 ms, 64 at once: the burst lasts about 6 s. (The
/// holder stops itself at its 2,000th tick: a SIGTERM sent by the test,
/// watching the logs, came after 18,849 on a busy CI machine with instant
/// handlers, and after 19,143 with these.) The one-shots are in the table
/// before the silos start: registering 20,000 through a silo's service, each
/// registration a notice to the shard's holder, fitted in a whole run of 30 s
/// on an idle machine but took over 195 s beside a loaded CI run, which this
/// test is not about.
fn mass_due() -> Burst {
    let full = std::env::var("ROLLCALL_HANDOFF_FULL").is_ok_and(|v| v == "1");
    let count = if full { 100_000 } else { 20_000 };
    Burst {
        count,
        id_bytes: 24,
        due: Duration::from_secs(if full { 240 } else { 15 }),
        spread: Duration::from_secs(if full { 5 } else { 0 }),
        handler_ms: 20,
        max_deliveries: Some(64),
        stop_after: count / 10,
        period: None,
        written_before: true,
        store_latency: None,
    }
}

/// Issue 70's (b): [`mass_due`]'s 20,000 one-shots, the silos' store 100
/// ms away each way (200 ms a round trip) from before the burst: the
/// release owes some 18,000 (pages of the lease row, sent in bounded calls),
/// and it lands, and its successor holds the shard, within 30 s of the
/// holder's shutdown.
fn mass_due_far_store() -> Burst {
    Burst {
        store_latency: Some(Duration::from_millis(100)),
        ..mass_due()
    }
}

/// (b): 1,600 every-minute reminders with 100-ms handlers, 2 at once (20 a
/// second at most: their first occurrence takes 80 s), the stop 70 s or
/// more into the backlog (at the 1,400th tick): the owed occurrences are
/// over a minute old at the handoff, and still each delivered once (they
/// fell to the missed-tick policy, `Skip`, past 60 s). (5,000 at 40 a second
/// took the test 150 s, 55 of them the successor's.)
fn minute_backlog() -> Burst {
    Burst {
        count: 1_600,
        id_bytes: 24,
        due: Duration::from_secs(5),
        spread: Duration::ZERO,
        handler_ms: 100,
        max_deliveries: Some(2),
        stop_after: 70 * 20,
        period: Some(Duration::from_secs(60)),
        written_before: false,
        store_latency: None,
    }
}

/// (d): five silos deliver 200 every-second reminders spread over every
/// shard; one of them that holds shards has its clock jump 2.5 s ahead (a VM
/// resumed, a broken NTP step) and is cut from its peers, not from the store,
/// for 12 s, so the others declare it Dead and take its shards over while it
/// runs. None due meanwhile is lost, none is delivered twice but what the
/// victim delivered after its last checkpoint (its successors owe from
/// there, issue 70's item 2; the window is read from its lease rows), and
/// the silo reports its offset beyond the bound.
/// With `victim_latency` (issue 70's (a)), each silo reaches the store
/// through a proxy of its own, and the faulted silo's adds that much each
/// way from the fault on: its lease and row writes crawl while it runs.
async fn a_clock_ahead_and_cut_from_its_peers_loses_nothing(store: &str, victim_latency: Option<Duration>) {
    const JUMP_MS: u64 = 2_500;
    const CUT: Duration = Duration::from_secs(12);
    let cluster = unique_id("clock");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    let env = vec![
        ("BACKLOG_PERIOD_MS", "1000".to_owned()),
        ("BACKLOG_ANY_SHARD", "1".to_owned()),
        ("BACKLOG_FAULT_CLOCK_MS", JUMP_MS.to_string()),
        ("BACKLOG_FAULT_CUT_MS", CUT.as_millis().to_string()),
    ];
    let reminders = every_second();
    let mut procs = Vec::new();
    let mut proxies = Vec::new();
    for name in ["a", "b", "c", "d", "e"] {
        let via = match victim_latency {
            Some(_) => Some(delayed(store).await),
            None => None,
        };
        let url = via.as_ref().map_or(store, |(_, url)| url.as_str());
        let burst = (name == "e").then_some(&reminders);
        procs.push(start(&cluster, url, &dir, name, &env, burst).await);
        proxies.push(via);
    }
    let logs: Vec<PathBuf> = procs.iter().map(|p| p.log.clone()).collect();
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    // The five settled: the ticks of 5 s (a silo may hold no shard: 8 shards
    // on a ring of 5). The fault goes to the silo that delivers the most.
    until(Duration::from_secs(60), "the silos deliver ticks", || {
        logs.iter().map(|l| lines(l)).sum::<usize>() >= 5 * reminders.count
    })
    .await;
    let victim = (0..procs.len()).max_by_key(|i| lines(&logs[*i])).expect("five");
    let last = procs.len() - 1;
    procs.swap(victim, last);
    proxies.swap(victim, last);
    let victim = last;
    let conn = rollcall::connect(store).await.expect("connect");
    let leases = ShardLeases::open(conn.lease_table(&cluster).expect("lease table"), SHARDS)
        .await
        .expect("leases");
    let victim_address = procs[victim].address.clone();
    let victim_shards: Vec<u32> = holders(&leases)
        .await
        .iter()
        .zip(0..)
        .filter(|(h, _)| h.as_deref() == Some(victim_address.as_str()))
        .map(|(_, k)| k)
        .collect();
    // The victim's checkpoints just before the fault: a successor owes from
    // there (less the clock bound), so what the victim delivered since may
    // come twice (issue 70, item 2). A later checkpoint only narrows that.
    let mut checkpoints: BTreeMap<u32, u64> = BTreeMap::new();
    for &k in &victim_shards {
        if let Some(c) = read_lease(&leases, k).await.owed_from {
            checkpoints.insert(k, c.as_millis());
        }
    }
    let faulted_at = rollcall::Timestamp::now();
    if let (Some((proxy, _)), Some(latency)) = (&proxies[victim], victim_latency) {
        proxy.set_delay(latency);
    }
    signal(&procs[victim], "-USR1");
    // The others declare it Dead during the cut; it reads itself Dead (the
    // store stays reachable) and stops with the declared-dead exit code.
    // Far from its store (a round trip over the table's operation timeout)
    // it cannot read that it is Dead: it runs on, fenced (its own row's
    // confirmations lapse, so it delivers nothing), and is killed below.
    if victim_latency.is_none() {
        let status = tokio::time::timeout(CUT + Duration::from_secs(30), procs[victim].child.wait())
            .await
            .expect("the faulted silo stops once it reads itself Dead")
            .expect("wait");
        // (`backlog-silo` exits 1 when its system stops with the declared-dead code.)
        assert!(!status.success(), "it stopped because it was declared Dead");
    }
    let stopped_at = rollcall::Timestamp::now();
    // The survivors tick on past the cut: every reminder has ticked after the
    // horizon the checks below end at (so none still owes one before it).
    let horizon = faulted_at.as_millis() + CUT.as_millis() as u64 + 5_000;
    until(
        Duration::from_secs(60),
        "every reminder ticks past the cut",
        || {
            let past: std::collections::BTreeSet<String> = ticks(&paths)
                .into_keys()
                .filter(|(_, _, s)| *s > horizon)
                .map(|(actor, _, _)| actor)
                .collect();
            past.len() == reminders.count
        },
    )
    .await;
    // A shard taken over from the faulted silo (its releases may not land)
    // is delivered from the takeover time `T`, which the successor's acquire
    // wrote as the row's watermark plus 1 ms, and owed from the victim's
    // checkpoint. Read before the survivors leave (their releases move the
    // watermarks on). (The victim, cut from its peers, releases nothing.)
    let mut taken_at: BTreeMap<u32, u64> = BTreeMap::new();
    for &k in &victim_shards {
        let lease = read_lease(&leases, k).await;
        if lease.owner.map(|o| o.to_string()) != Some(victim_address.clone()) {
            if let Some(w) = lease.watermark {
                taken_at.insert(k, w.as_millis() + 1);
            }
        }
    }
    stop_all(&mut procs[..victim]).await;
    if victim_latency.is_some() {
        let _ = procs[victim].child.kill().await;
    }
    let all = ticks(&paths);
    // A repeat is allowed only between the victim's checkpoint (less the
    // 500-ms clock bound) and its shard's takeover time.
    let (repeats, twice): (Vec<_>, Vec<_>) =
        all.iter()
            .filter(|(_, by)| by.len() > 1)
            .partition(|((actor, _, scheduled), _)| {
                let k = rollcall_core::actor_shard(actor, SHARDS);
                match (checkpoints.get(&k), taken_at.get(&k)) {
                    (Some(c), Some(t)) => *scheduled + 500 >= *c && scheduled < t,
                    _ => false,
                }
            });
    // Every second of every reminder from 2 s before the fault to the
    // horizon: none lost, before a takeover time or after it.
    let lost: Vec<(String, i64)> = missed_seconds(&all, faulted_at.as_millis() - 2_000, horizon)
        .into_iter()
        .map(|(actor, t)| (actor, t as i64 - faulted_at.as_millis() as i64))
        .collect();
    let ms_after = |m: &BTreeMap<u32, u64>| {
        m.iter()
            .map(|(k, f)| (*k, *f as i64 - faulted_at.as_millis() as i64))
            .collect::<Vec<_>>()
    };
    println!(
        "the faulted silo held shards {victim_shards:?}; checkpoints (ms after the fault) {:?}; \
         taken over at {:?}; {} occurrences repeated since those checkpoints",
        ms_after(&checkpoints),
        ms_after(&taken_at),
        repeats.len()
    );
    let (lost, lost_examples) = (lost.len(), lost.iter().take(8).collect::<Vec<_>>());
    // A tick handled before its time by more than the bound (500 ms) was
    // delivered on the stepped clock: the step must stop deliveries at once
    // (CI saw the faulted silo deliver 2 s early before its probes measured
    // the step, and its successor deliver the same tick on time).
    let early: Vec<String> = paths
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            f.len() == 5
                && matches!((f[2].parse::<u64>(), f[3].parse::<u64>()), (Ok(s), Ok(at)) if at + 500 < s)
        })
        .collect();
    let printed = procs[victim]
        .stdout
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    println!(
        "clock +{JUMP_MS} ms, cut {CUT:?}: {} ticks, {} twice, {} early, {lost} lost; the faulted \
         silo stopped {} ms after the fault and printed {printed:?}",
        all.len(),
        twice.len(),
        early.len(),
        stopped_at.as_millis() - faulted_at.as_millis(),
    );
    assert!(
        twice.is_empty(),
        "{} ticks delivered more than once outside the checkpoint windows, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert!(
        early.is_empty(),
        "{} ticks handled over 500 ms before their time, e.g. {:?}",
        early.len(),
        early.first()
    );
    let ticked: std::collections::BTreeSet<&String> = all.keys().map(|(actor, _, _)| actor).collect();
    assert_eq!(ticked.len(), reminders.count, "every reminder ticked");
    assert_eq!(
        lost, 0,
        "no occurrence due around the fault is lost (actor, ms after the fault): {lost_examples:?}"
    );
    let beyond = printed.iter().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() == 3 && f[0] == "clock" && f[2] == "beyond")
            .then(|| f[1].parse::<i64>().ok())
            .flatten()
    });
    let offset = beyond.expect("the faulted silo reports its clock beyond the bound");
    assert!(
        (2_000..=3_000).contains(&offset),
        "it reports its offset (+{JUMP_MS} ms): {offset} ms"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 70's (c): five silos deliver 200 every-second reminders spread over
/// every shard; the one that holds the most has its clock run 3 s ahead
/// while it still answers probes. It says so in its membership row, the
/// shard ring leaves it out, and every shard is Owned by another silo within
/// the lease period plus `lease_poll` (3 s) plus the time to measure the
/// step and spread the row (2 s here); nothing is delivered twice or lost.
/// No shard goes back to it while its clock is off. Its clock right again
/// (after 8 s, not the 90: the rule is the same, CI time is not;
/// `ROLLCALL_CLOCK_FAULT_S=90` runs 90), it takes a share back. Every tick
/// first writes its actor's state under its fence (`BACKLOG_STATE`, as the
/// carts example's writes are fenced) and is logged only when that write
/// landed, so "nothing lost" also says that every actor accepted a write
/// every second throughout. One exception, `Skip`'s own rule: a handler
/// whose write ran into the next second (up to 2 s on a loaded machine)
/// skips that occurrence; it counts as skipped, not lost, only when the run
/// history records it so and its predecessor was logged no more than
/// [`REPLY_LAG`] before it was due ([`overrun_skips`]). CI's run with the
/// control thread of issue 73 counted 8 lost: each came right after a
/// delivery logged 214 ms or less before it was due, or after it.
async fn a_clock_ahead_that_still_answers_probes_leaves_the_ring(store: &str) {
    const JUMP_MS: u64 = 3_000;
    let cluster = unique_id("ring");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    let env = vec![
        ("BACKLOG_PERIOD_MS", "1000".to_owned()),
        ("BACKLOG_ANY_SHARD", "1".to_owned()),
        ("BACKLOG_FAULT_CLOCK_MS", JUMP_MS.to_string()),
        ("BACKLOG_STATE", "1".to_owned()),
        // History to cover CI's run (one record a second; the list grows
        // only as long as the run lasts, about 40 s): an occurrence that is
        // not logged must be in it, as skipped by its policy.
        ("BACKLOG_RUN_HISTORY", "100".to_owned()),
    ];
    // 8 s in CI; `ROLLCALL_CLOCK_FAULT_S=90` runs the 90 s by hand.
    let fault_for = Duration::from_secs(
        std::env::var("ROLLCALL_CLOCK_FAULT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    );
    let reminders = every_second();
    let mut procs = Vec::new();
    for name in ["a", "b", "c", "d"] {
        procs.push(start(&cluster, store, &dir, name, &env, None).await);
    }
    procs.push(start(&cluster, store, &dir, "e", &env, Some(&reminders)).await);
    let logs: Vec<PathBuf> = procs.iter().map(|p| p.log.clone()).collect();
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    until(Duration::from_secs(60), "the silos deliver ticks", || {
        logs.iter().map(|l| lines(l)).sum::<usize>() >= 5 * reminders.count
    })
    .await;
    let conn = rollcall::connect(store).await.expect("connect");
    let leases = ShardLeases::open(conn.lease_table(&cluster).expect("lease table"), SHARDS)
        .await
        .expect("leases");
    let now_holding = holders(&leases).await;
    let victim = (0..procs.len())
        .max_by_key(|i| {
            now_holding
                .iter()
                .filter(|h| h.as_deref() == Some(procs[*i].address.as_str()))
                .count()
        })
        .expect("five");
    let victim_address = procs[victim].address.clone();
    let held_before = now_holding
        .iter()
        .filter(|h| h.as_deref() == Some(victim_address.as_str()))
        .count();
    assert!(held_before > 0, "the faulted silo holds shards: {now_holding:?}");
    let faulted_at = Instant::now();
    let faulted_ms = rollcall::Timestamp::now().as_millis();
    signal(&procs[victim], "-USR1");
    let bound = Duration::from_secs(2 + 1 + 2);
    let moved_in = loop {
        let h = holders(&leases).await;
        if h.iter().all(|o| o.as_ref().is_some_and(|o| *o != victim_address)) {
            break faulted_at.elapsed();
        }
        assert!(
            faulted_at.elapsed() < Duration::from_secs(30),
            "30 s after the clock fault the shards are held by {h:?} (the faulted silo is {victim_address})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The fault goes on: no shard comes back to the silo while its clock
    // is off.
    let held_off = Instant::now();
    while held_off.elapsed() < fault_for {
        let h = holders(&leases).await;
        assert!(
            h.iter().all(|o| o.as_deref() != Some(victim_address.as_str())),
            "a shard went back to the silo while its clock was off: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    signal(&procs[victim], "-USR2");
    let back = Instant::now();
    loop {
        let h = holders(&leases).await;
        if h.iter().any(|o| o.as_deref() == Some(victim_address.as_str())) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "30 s after its clock is right the silo holds no shard: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back_in = back.elapsed();
    let horizon = rollcall::Timestamp::now().as_millis();
    until(
        Duration::from_secs(30),
        "every reminder ticks past the fault's end",
        || {
            let past: std::collections::BTreeSet<String> = ticks(&paths)
                .into_keys()
                .filter(|(_, _, s)| *s > horizon + 2_000)
                .map(|(actor, _, _)| actor)
                .collect();
            past.len() == reminders.count
        },
    )
    .await;
    stop_all(&mut procs).await;
    let all = ticks(&paths);
    let twice = all.values().filter(|by| by.len() > 1).count();
    let missed = missed_seconds(&all, faulted_ms - 2_000, horizon);
    let (skipped, missed) = overrun_skips(&conn, &cluster, &all, &paths, missed).await;
    let lost = missed.len();
    if lost > 0 {
        // What the silos said of them: a tick whose fenced state write the
        // store refused is not logged (`fenced ACTOR EPOCH` on its stdout).
        for p in &procs {
            let out = p.stdout.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let fenced: Vec<&String> = out.iter().filter(|l| l.starts_with("fenced ")).collect();
            println!(
                "{}: {} refused as fenced, e.g. {:?}",
                p.address,
                fenced.len(),
                &fenced[..fenced.len().min(10)]
            );
        }
        println!(
            "lost (actor, scheduled ms after the fault): {:?}",
            missed
                .iter()
                .take(20)
                .map(|(a, t)| (a, i128::from(*t) - i128::from(faulted_ms)))
                .collect::<Vec<_>>()
        );
    }
    println!(
        "clock +{JUMP_MS} ms: the {held_before} shards it held, and every other, held elsewhere \
         {moved_in:?} after the fault (bound \
         {bound:?}), the silo held a shard again {back_in:?} after its clock was right; {} ticks, \
         {twice} twice, {skipped} skipped as overrun by their handler, {lost} lost",
        all.len()
    );
    assert!(
        moved_in <= bound,
        "the shards moved in {moved_in:?}, over {bound:?}"
    );
    assert_eq!(twice, 0, "ticks delivered twice");
    assert_eq!(lost, 0, "ticks lost");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 70's (d): Redis's asynchronous replication loses a handoff. Two
/// silos deliver 200 every-second reminders over every shard, each tick
/// first writing its actor's state under the tick's fence
/// (`BACKLOG_STATE`). The replica's replication is paused; a third silo
/// joins and takes shards over (releases and acquires acknowledged by the
/// primary only, with the joiner's membership row and its fenced writes);
/// then the primary is killed and the sentinels promote the replica, which
/// names the old holders at the old epochs (checked before the kill: the
/// moved shards' lease rows differ between primary and replica). Within
/// 30 s of the kill every
/// actor's fenced state write lands again and its reminder ticks (a tick is
/// logged only when its write landed), and no silo is lost on the way.
#[cfg(feature = "redis")]
async fn a_handoff_lost_in_a_failover_heals() {
    use rollcall_tests::replicated::Sentinels;
    let mut redis = match Sentinels::start_with_replication_proxy().await {
        Ok(s) => s,
        Err(e) if rollcall_tests::fixtures::backends_required() => {
            panic!("no Redis Sentinel set-up: {e}")
        }
        Err(e) => return eprintln!("SKIPPING: no Redis Sentinel set-up: {e}"),
    };
    let store = redis.url("");
    let cluster = unique_id("lost-handoff");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    let env = vec![
        ("BACKLOG_PERIOD_MS", "1000".to_owned()),
        ("BACKLOG_ANY_SHARD", "1".to_owned()),
        ("BACKLOG_STATE", "1".to_owned()),
    ];
    let reminders = every_second();
    let mut procs = vec![
        start(&cluster, &store, &dir, "a", &env, None).await,
        start(&cluster, &store, &dir, "b", &env, Some(&reminders)).await,
    ];
    let logs = |procs: &[Proc]| procs.iter().map(|p| p.log.clone()).collect::<Vec<PathBuf>>();
    let two = logs(&procs);
    until(Duration::from_secs(60), "the two silos deliver ticks", || {
        two.iter().map(|l| lines(l)).sum::<usize>() >= 2 * reminders.count
    })
    .await;
    let conn = rollcall::connect(&store).await.expect("connect");
    let leases = ShardLeases::open(conn.lease_table(&cluster).expect("lease table"), SHARDS)
        .await
        .expect("leases");
    redis
        .replicated(Duration::from_secs(10))
        .await
        .expect("the replica caught up before the pause");
    redis.pause_replication();
    procs.push(start(&cluster, &store, &dir, "c", &env, None).await);
    let joiner = procs[2].address.clone();
    // The handoff, as the primary acknowledged it: the joiner holds shards
    // and a tick of its own landed its write.
    let handed = Instant::now();
    let moved: Vec<(u32, u64)> = loop {
        let mut mine = Vec::new();
        for k in 0..SHARDS {
            let l = read_lease(&leases, k).await;
            if l.status == LeaseStatus::Owned && l.owner.is_some_and(|o| o.to_string() == joiner) {
                mine.push((k, l.epoch));
            }
        }
        if !mine.is_empty() && lines(&procs[2].log) > 0 {
            break mine;
        }
        assert!(
            handed.elapsed() < Duration::from_secs(30),
            "the joiner took no shard over within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let primary = redis.primary().await.expect("the primary");
    // The replica, about to be promoted, lacks the handoff: each moved
    // shard's lease row there is not the primary's (another etag).
    let lacking = {
        let replica = rollcall::connect(&format!("redis://127.0.0.1:{}", redis.ports[1 - primary]))
            .await
            .expect("connect to the replica");
        let (on_replica, on_primary) = (
            replica.lease_table(&cluster).expect("lease table"),
            conn.lease_table(&cluster).expect("lease table"),
        );
        let mut lacking = 0;
        for (k, _) in &moved {
            let there = on_replica.read_lease(*k).await.expect("a read of the replica");
            let here = on_primary.read_lease(*k).await.expect("a read of the primary");
            if there.map(|(_, e)| e) != here.map(|(_, e)| e) {
                lacking += 1;
            }
        }
        lacking
    };
    assert!(
        lacking > 0,
        "the replica has the handoff already ({moved:?}): the replication was not paused, and \
         this test would test nothing"
    );
    let killed = Instant::now();
    let killed_ms = rollcall::Timestamp::now().as_millis();
    redis.kill(primary).await;
    let failover = redis.failed_over(primary).await.expect("the replica promoted");
    let promoted_ms = rollcall::Timestamp::now().as_millis();
    // What the promoted replica says of the moved shards, read at once
    // (the silos may have healed them already).
    let after: Vec<(u32, Option<String>, u64)> = {
        let mut out = Vec::new();
        for (k, _) in &moved {
            let l = read_lease(&leases, *k).await;
            out.push((*k, l.owner.map(|o| o.to_string()), l.epoch));
        }
        out
    };
    let all_logs = logs(&procs);
    let paths: Vec<&Path> = all_logs.iter().map(PathBuf::as_path).collect();
    let healed = loop {
        let fresh: std::collections::BTreeSet<String> = all_logs
            .iter()
            .filter_map(|l| std::fs::read_to_string(l).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|line| {
                        let f: Vec<&str> = line.split(' ').collect();
                        let done: u64 = f.get(3)?.parse().ok()?;
                        (f.len() == 5 && done > promoted_ms).then(|| f[0].to_owned())
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        if fresh.len() == reminders.count {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "30 s after the primary's kill {} of {} actors wrote their state and ticked \
             since the promotion; the moved shards {moved:?} read {after:?} at the promotion",
            fresh.len(),
            reminders.count
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let fenced: usize = procs
        .iter()
        .map(|p| {
            p.stdout
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .filter(|l| l.starts_with("fenced "))
                .count()
        })
        .sum();
    for p in &mut procs {
        assert!(
            p.child.try_wait().expect("try_wait").is_none(),
            "silo {} exited during the failover",
            p.address
        );
    }
    stop_all(&mut procs).await;
    let all = ticks(&paths);
    let twice = all.values().filter(|by| by.len() > 1).count();
    let lost = missed_seconds(&all, killed_ms, promoted_ms).len();
    println!(
        "a handoff lost in a failover: the joiner held {moved:?}, the promoted replica said {after:?}; \
         {lacking} of them not on the replica at the kill; failover {failover:?}, every actor wrote and ticked {healed:?} after the kill; {fenced} \
         writes refused as fenced; {} ticks, {twice} twice, {lost} missed around the failover",
        all.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_of_2000_long_ids_during_a_backlog_on_redis_loses_and_repeats_nothing() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_release_during_a_backlog_hands_over_every_owed_tick(&backend.endpoint, long_ids()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_in_the_middle_of_a_mass_due_time_on_redis_loses_and_repeats_nothing() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_release_during_a_backlog_hands_over_every_owed_tick(&backend.endpoint, mass_due()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_of_a_mass_due_time_over_a_far_redis_lands_and_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_release_during_a_backlog_hands_over_every_owed_tick(&backend.endpoint, mass_due_far_store()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_70_s_into_a_backlog_of_minute_reminders_on_redis_owes_them_all() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_release_during_a_backlog_hands_over_every_owed_tick(&backend.endpoint, minute_backlog()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handoff_lost_in_a_redis_failover_heals() {
        super::a_handoff_lost_in_a_failover_heals().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_that_answers_probes_on_redis_leaves_the_ring() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_clock_ahead_that_still_answers_probes_leaves_the_ring(&backend.endpoint).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_and_cut_from_its_peers_on_redis_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_clock_ahead_and_cut_from_its_peers_loses_nothing(&backend.endpoint, None).await;
    }

    /// Issue 70's (a): issue 57's fault, and the faulted silo's store
    /// traffic 2.5 s away each way (5 s a round trip) from the fault on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_cut_and_far_from_its_store_on_redis_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_clock_ahead_and_cut_from_its_peers_loses_nothing(
            &backend.endpoint,
            Some(Duration::from_millis(2_500)),
        )
        .await;
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_of_2000_long_ids_during_a_backlog_on_etcd_loses_and_repeats_nothing() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_release_during_a_backlog_hands_over_every_owed_tick(&url, long_ids()).await;
    }

    /// Failed on a loaded 2-core machine (2 of 3 CI-like runs, and was
    /// ignored): the holder's one thread, saturated by the burst, missed its
    /// probes, its peer declared it Dead and the survivor delivered 2,346 of
    /// 20,000 within 180 s. The membership agent now runs on a thread of the
    /// silo's own (issue 73), so deliveries cannot starve its probe answers;
    /// the release must land before three quarters of the burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_in_the_middle_of_a_mass_due_time_on_etcd_loses_and_repeats_nothing() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_release_during_a_backlog_hands_over_every_owed_tick(&url, mass_due()).await;
    }

    /// Failed until the release sent fewer bytes: over a 200-ms round trip
    /// etcd's HTTP/2 flow control paces a request at about one 64-KiB window
    /// a round trip, the release's read of the shard's 19,920 rows took 4.4 s
    /// (20 range requests of 1,000 keys) and its first 1-MiB page call 3.9
    /// s, so it did not land within the holder's 10-s `shutdown_timeout`.
    /// Now the pages are gzipped (a fifth of the bytes: 8 pages in 1.0 s)
    /// and a scan sizes its range requests by bytes (1.5 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_of_a_mass_due_time_over_a_far_etcd_lands_and_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_release_during_a_backlog_hands_over_every_owed_tick(&url, mass_due_far_store()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_70_s_into_a_backlog_of_minute_reminders_on_etcd_owes_them_all() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_release_during_a_backlog_hands_over_every_owed_tick(&url, minute_backlog()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_that_answers_probes_on_etcd_leaves_the_ring() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_clock_ahead_that_still_answers_probes_leaves_the_ring(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_and_cut_from_its_peers_on_etcd_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_clock_ahead_and_cut_from_its_peers_loses_nothing(&url, None).await;
    }

    /// Issue 70's (a) on etcd (see the Redis one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_clock_ahead_cut_and_far_from_its_store_on_etcd_loses_nothing() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_clock_ahead_and_cut_from_its_peers_loses_nothing(&url, Some(Duration::from_millis(2_500))).await;
    }
}

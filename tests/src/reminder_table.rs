//! Reminder table conformance scenarios: the contract of `ReminderTable` (core `table.rs`), one scenario per rule.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use rollcall_core::{
    hash_in_range, Error, Etag, PageToken, ReminderEntry, ReminderTable, RunOutcome, RunRecord, Timestamp,
};
use tokio::sync::Barrier;

use crate::{unique_id, Store};

/// Opens and initialises a reminder table under a fresh service id.
pub async fn fresh_table(store: &Store) -> Arc<dyn ReminderTable> {
    let table = store
        .reminder_table(&unique_id("service"))
        .expect("open reminder table");
    table.init().await.expect("init reminder table");
    table
}

/// A reminder of `table`'s service.
pub fn reminder(
    table: &dyn ReminderTable,
    actor: &str,
    name: &str,
    period: Option<Duration>,
) -> ReminderEntry {
    ReminderEntry::new(
        table.service_id(),
        actor,
        name,
        Timestamp::from_millis(1_795_000_000_321),
        period,
    )
}

fn keys(rows: &[ReminderEntry]) -> BTreeSet<(String, String)> {
    rows.iter()
        .map(|e| (e.actor_id.clone(), e.name.clone()))
        .collect()
}

/// Round trip of the calendar columns: a cron expression with its zone, an end
/// time, a retry policy, and a payload of every byte value up to the largest accepted, read back
/// by key, by actor and by range; a payload one byte over is refused with a
/// typed error and writes nothing.
pub async fn calendar_end_and_payload_round_trip(store: Store) {
    use rollcall_core::MAX_REMINDER_PAYLOAD;
    let table = fresh_table(&store).await;
    let mut e = reminder(&*table, "cart/cron", "daily", None);
    e.cron = Some("30 2 * * MON-FRI".into());
    e.zone = Some("Europe/Stockholm".into());
    e.end_at = Some(Timestamp::from_millis(1_800_000_000_000));
    e.payload = Some((0..=255u8).cycle().take(MAX_REMINDER_PAYLOAD).collect());
    e.retry = Some(rollcall_core::RetryPolicy {
        max_retries: 5,
        first_delay: Duration::from_millis(1500),
        max_delay: Duration::from_secs(60),
        park: true,
    });
    let etag = table.upsert_row(&e).await.expect("upsert");
    let expected = ReminderEntry {
        etag: etag.clone(),
        ..e.clone()
    };
    let read = table.read_row("cart/cron", "daily").await.expect("read_row");
    assert!(read.as_ref() == Some(&expected), "the row reads back whole");
    let by_actor = table.read_rows_for("cart/cron").await.expect("read_rows_for");
    assert!(by_actor == vec![expected.clone()], "read by actor");
    let all = table.read_rows_in_range(0, 0).await.expect("range read");
    assert!(all == vec![expected.clone()], "read by range");
    // A short payload, no zone (UTC), no end.
    let mut small = reminder(&*table, "cart/cron", "hourly", None);
    small.cron = Some("@hourly".into());
    small.payload = Some(vec![0, 1, 2]);
    let etag = table.upsert_row(&small).await.expect("upsert");
    let read = table
        .read_row("cart/cron", "hourly")
        .await
        .expect("read")
        .expect("row");
    assert_eq!(read, ReminderEntry { etag, ..small });
    // One byte over the limit: refused before the store, nothing written.
    let mut big = reminder(&*table, "cart/cron", "big", None);
    big.payload = Some(vec![7; MAX_REMINDER_PAYLOAD + 1]);
    assert!(
        matches!(
            table.upsert_row(&big).await,
            Err(rollcall_core::Error::InvalidInput { .. })
        ),
        "an oversized payload is an invalid-input error"
    );
    assert!(table.read_row("cart/cron", "big").await.expect("read").is_none());
}

/// Round trip of every column with an awkward name and a non-ASCII actor id.
pub async fn round_trip_odd_names(store: Store) {
    let table = fresh_table(&store).await;
    for (actor, name, period) in [
        (
            "grain/Ünïcødé-演员-🦀",
            r"foo/bar\#b_a_z?",
            Some(Duration::from_millis(90_500)),
        ),
        ("plain", "one-shot", None),
        (
            "with space and 'quotes\"",
            "*?[]{}%:",
            Some(Duration::from_secs(86_400 * 180)),
        ),
    ] {
        let e = reminder(&*table, actor, name, period);
        let etag = table.upsert_row(&e).await.expect("upsert");
        assert!(!etag.is_empty());
        let read = table
            .read_row(actor, name)
            .await
            .expect("read_row")
            .expect("row present");
        assert_eq!(
            read,
            ReminderEntry {
                etag: etag.clone(),
                ..e.clone()
            }
        );
        assert_eq!(
            table.read_rows_for(actor).await.expect("read_rows_for"),
            vec![read]
        );
    }
}

/// Every upsert of a row yields a new etag, distinct from all earlier ones.
pub async fn every_upsert_yields_a_new_etag(store: Store) {
    let table = fresh_table(&store).await;
    let mut e = reminder(&*table, "a", "r", Some(Duration::from_secs(60)));
    let mut seen = BTreeSet::new();
    for i in 0..10u64 {
        e.start_at = Timestamp::from_millis(1_000 + i);
        let etag = table.upsert_row(&e).await.expect("upsert");
        assert!(seen.insert(etag.clone()), "etag {etag} reused");
        let read = table.read_row("a", "r").await.expect("read").expect("row");
        assert_eq!((read.etag, read.start_at), (etag, e.start_at));
    }
}

/// remove_row with a stale etag or a wrong name answers false; the right etag
/// removes; removing again answers false.
pub async fn remove_row_preconditions(store: Store) {
    let table = fresh_table(&store).await;
    let e = reminder(&*table, "actor", "r", None);
    let first = table.upsert_row(&e).await.expect("upsert");
    let second = table.upsert_row(&e).await.expect("upsert");
    assert!(!table
        .remove_row("actor", "r", &first, None)
        .await
        .expect("stale etag"));
    assert!(!table
        .remove_row("actor", "other", &second, None)
        .await
        .expect("wrong name"));
    assert!(!table
        .remove_row("other", "r", &second, None)
        .await
        .expect("wrong actor"));
    assert!(table.read_row("actor", "r").await.expect("read").is_some());
    assert!(table
        .remove_row("actor", "r", &second, None)
        .await
        .expect("right etag"));
    assert!(table.read_row("actor", "r").await.expect("read").is_none());
    assert!(!table
        .remove_row("actor", "r", &second, None)
        .await
        .expect("again"));
    assert!(
        table.read_rows_in_range(0, 0).await.expect("range").is_empty(),
        "removed row must leave the range index"
    );
}

/// `update_last_fired` records the time without changing the etag (a handle stays
/// valid); a stale etag, a missing row or a removed row answer false and write
/// nothing; an upsert replaces the time with the entry's own; range reads, actor
/// reads and `read_row` all return it; a reminder named like the provider's
/// internal keys stays a reminder.
pub async fn last_fired_keeps_the_etag(store: Store) {
    let table = fresh_table(&store).await;
    let e = reminder(&*table, "actor", "r", Some(Duration::from_secs(60)));
    let etag = table.upsert_row(&e).await.expect("upsert");
    let at = Timestamp::from_millis(1_795_000_060_321);
    assert!(table
        .update_last_fired("actor", "r", &etag, at, None)
        .await
        .expect("update_last_fired"));
    let read = table.read_row("actor", "r").await.expect("read").expect("row");
    assert_eq!(read.etag, etag, "recording a tick must not change the etag");
    assert_eq!(read.last_fired, Some(at));
    let later = Timestamp::from_millis(at.as_millis() + 60_000);
    assert!(table
        .update_last_fired("actor", "r", &etag, later, None)
        .await
        .expect("again"));
    assert_eq!(
        table.read_rows_for("actor").await.expect("for")[0].last_fired,
        Some(later)
    );
    assert_eq!(
        table.read_rows_in_range(0, 0).await.expect("range")[0].last_fired,
        Some(later)
    );
    // Stale etag, missing rows: false and nothing written.
    let fresh = table.upsert_row(&e).await.expect("re-register");
    assert_eq!(
        table
            .read_row("actor", "r")
            .await
            .expect("read")
            .expect("row")
            .last_fired,
        None,
        "an upsert writes the entry's own last_fired"
    );
    assert!(!table
        .update_last_fired("actor", "r", &etag, later, None)
        .await
        .expect("stale"));
    assert!(!table
        .update_last_fired("actor", "nope", &fresh, later, None)
        .await
        .expect("missing"));
    assert_eq!(
        table
            .read_row("actor", "r")
            .await
            .expect("read")
            .expect("row")
            .last_fired,
        None
    );
    assert!(table.read_row("actor", "nope").await.expect("read").is_none());
    // An upsert carrying a time keeps it; a removed row cannot be recorded.
    let with_time = ReminderEntry {
        last_fired: Some(at),
        ..e.clone()
    };
    let etag = table.upsert_row(&with_time).await.expect("upsert with time");
    assert_eq!(
        table
            .read_row("actor", "r")
            .await
            .expect("read")
            .expect("row")
            .last_fired,
        Some(at)
    );
    assert!(table.remove_row("actor", "r", &etag, None).await.expect("remove"));
    assert!(!table
        .update_last_fired("actor", "r", &etag, later, None)
        .await
        .expect("removed"));
    assert!(table.read_rows_in_range(0, 0).await.expect("range").is_empty());
    // Names that look like suffixes providers might use internally.
    for name in ["fired", "r/fired", "last_fired"] {
        let odd = reminder(&*table, "actor", name, None);
        let etag = table.upsert_row(&odd).await.expect("upsert");
        assert!(table
            .update_last_fired("actor", name, &etag, at, None)
            .await
            .expect("record"));
    }
    let rows = table.read_rows_for("actor").await.expect("for");
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows.iter().all(|r| r.last_fired == Some(at)));
}

/// 5 actors x 5 concurrent upserts: 5 distinct etags each, and the stored etag is
/// one of them.
pub async fn concurrent_upserts_yield_distinct_etags(store: Store) {
    let table = fresh_table(&store).await;
    let barrier = Arc::new(Barrier::new(25));
    let tasks: Vec<_> = (0..25u32)
        .map(|i| {
            let (table, barrier) = (table.clone(), barrier.clone());
            tokio::spawn(async move {
                let actor = format!("actor-{}", i % 5);
                let mut e = reminder(&*table, &actor, "r", Some(Duration::from_secs(60)));
                e.start_at = Timestamp::from_millis(u64::from(i));
                barrier.wait().await;
                (actor, table.upsert_row(&e).await.expect("upsert"))
            })
        })
        .collect();
    let mut by_actor: std::collections::BTreeMap<String, BTreeSet<Etag>> = Default::default();
    for t in tasks {
        let (actor, etag) = t.await.expect("task");
        by_actor.entry(actor).or_default().insert(etag);
    }
    assert_eq!(by_actor.len(), 5);
    for (actor, etags) in by_actor {
        assert_eq!(
            etags.len(),
            5,
            "{actor}: concurrent upserts must yield distinct etags"
        );
        let stored = table.read_row(&actor, "r").await.expect("read").expect("row");
        assert!(
            etags.contains(&stored.etag),
            "{actor}: stored etag must be one of those returned"
        );
    }
}

/// 1,000 reminders; `(0, MAX)`, `(0, 0)` and 1,000 random ranges (wrapping ones
/// included) return exactly the rows whose hash is in `(begin, end]`.
pub async fn range_reads_match_the_contract(store: Store) {
    let table = fresh_table(&store).await;
    let seed: u64 = rand::rng().random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let all: Vec<_> = (0..1000u32)
        .map(|i| {
            reminder(
                &*table,
                &format!("actor-{i}-{}", rng.random::<u32>()),
                &format!("r{}", i % 3),
                None,
            )
        })
        .collect();
    // 16 at a time: the rows are independent, and one at a time took most of
    // this scenario's time on the cluster topologies.
    futures_util::stream::iter(&all)
        .map(|e| {
            let table = &table;
            async move { table.upsert_row(e).await.expect("upsert") }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    let expect = |b: u32, e: u32| -> BTreeSet<(String, String)> {
        all.iter()
            .filter(|r| hash_in_range(r.hash, b, e))
            .map(|r| (r.actor_id.clone(), r.name.clone()))
            .collect()
    };
    let everything = table.read_rows_in_range(0, 0).await.expect("range");
    assert_eq!(everything.len(), 1000, "(0, 0) is the whole ring");
    assert_eq!(keys(&everything), expect(0, 0));
    let upto_max = table.read_rows_in_range(0, u32::MAX).await.expect("range");
    assert_eq!(keys(&upto_max), expect(0, u32::MAX));
    let mut hashes: Vec<u32> = all.iter().map(|r| r.hash).collect();
    hashes.sort_unstable();
    // moto (the DynamoDB-compatible server of the tests) answers a Query in about
    // 0.6 ms per item of the partition (measured: 150 ms for 250 items), so 1,000
    // random ranges would take minutes there: the DynamoDB run checks 64.
    // Elsewhere 250: each reads half the table on average, and the edges come
    // from stored hashes half of the time.
    let ranges = if store.provider() == "dynamodb" { 64 } else { 250 };
    for i in 0..ranges {
        // Mix arbitrary bounds with bounds on stored hashes (edges of (begin, end]).
        let pick = |rng: &mut rand::rngs::StdRng| {
            if rng.random_bool(0.5) {
                hashes[rng.random_range(0..hashes.len())]
            } else {
                rng.random()
            }
        };
        let (b, e) = match i {
            0 => (u32::MAX, 0),
            1 => (u32::MAX, u32::MAX),
            2 => (hashes[0], hashes[0]),
            _ => (pick(&mut rng), pick(&mut rng)),
        };
        let rows = table.read_rows_in_range(b, e).await.expect("range");
        assert_eq!(rows.len(), keys(&rows).len(), "duplicate rows for ({b}, {e}]");
        assert_eq!(keys(&rows), expect(b, e), "range ({b}, {e}] (seed {seed})");
        for r in &rows {
            assert!(!r.etag.is_empty());
        }
    }
}

/// read_rows_for returns exactly one actor's rows.
pub async fn read_rows_for_returns_one_actor(store: Store) {
    let table = fresh_table(&store).await;
    for actor in ["alpha", "alphabet", "beta", "alph"] {
        for name in ["x", "y", "z"] {
            table
                .upsert_row(&reminder(&*table, actor, name, None))
                .await
                .expect("upsert");
        }
    }
    let rows = table.read_rows_for("alpha").await.expect("read_rows_for");
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.actor_id == "alpha"));
    assert!(table
        .read_rows_for("gamma")
        .await
        .expect("read_rows_for")
        .is_empty());
}

/// read_row of a missing key is `None`.
pub async fn read_row_of_missing_key_is_none(store: Store) {
    let table = fresh_table(&store).await;
    assert!(table
        .read_row("nobody", "nothing")
        .await
        .expect("read_row")
        .is_none());
    table
        .upsert_row(&reminder(&*table, "somebody", "r", None))
        .await
        .expect("upsert");
    assert!(table
        .read_row("somebody", "other")
        .await
        .expect("read_row")
        .is_none());
}

/// Two services in one store never see each other's rows; clear empties one only.
pub async fn services_are_isolated(store: Store) {
    let a = fresh_table(&store).await;
    let b = fresh_table(&store).await;
    let ea = a
        .upsert_row(&reminder(&*a, "shared-actor", "r", None))
        .await
        .expect("upsert");
    b.upsert_row(&reminder(&*b, "shared-actor", "r", None))
        .await
        .expect("upsert");
    b.upsert_row(&reminder(&*b, "only-b", "r", None))
        .await
        .expect("upsert");
    assert_eq!(a.read_rows_in_range(0, 0).await.expect("range").len(), 1);
    assert_eq!(b.read_rows_in_range(0, 0).await.expect("range").len(), 2);
    assert!(a.read_row("only-b", "r").await.expect("read").is_none());
    assert_eq!(
        a.read_row("shared-actor", "r")
            .await
            .expect("read")
            .expect("row")
            .service_id,
        a.service_id()
    );
    b.clear().await.expect("clear");
    assert!(b.read_rows_in_range(0, 0).await.expect("range").is_empty());
    assert_eq!(
        a.read_row("shared-actor", "r")
            .await
            .expect("read")
            .expect("row")
            .etag,
        ea
    );
}

/// An entry of another service or with a wrong hash is refused with
/// `Error::InvalidInput` and writes nothing.
pub async fn invalid_entries_are_rejected(store: Store) {
    let table = fresh_table(&store).await;
    let mut foreign = reminder(&*table, "a", "r", None);
    foreign.service_id = "someone-else".into();
    let mut bad_hash = reminder(&*table, "a", "r", None);
    bad_hash.hash = bad_hash.hash.wrapping_add(1);
    for (e, field) in [(foreign, "service_id"), (bad_hash, "hash")] {
        match table.upsert_row(&e).await {
            Err(Error::InvalidInput { what, .. }) => assert_eq!(what, field),
            other => panic!("expected InvalidInput({field}), got {other:?}"),
        }
    }
    assert!(table.read_rows_in_range(0, 0).await.expect("range").is_empty());
}

/// Concurrent removes with one etag: exactly one wins.
pub async fn concurrent_removes_with_one_etag_have_one_winner(store: Store) {
    let table = fresh_table(&store).await;
    for round in 0..5 {
        let name = format!("r{round}");
        let etag = table
            .upsert_row(&reminder(&*table, "actor", &name, None))
            .await
            .expect("upsert");
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (table, barrier, name, etag) = (table.clone(), barrier.clone(), name.clone(), etag.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                table
                    .remove_row("actor", &name, &etag, None)
                    .await
                    .expect("remove_row")
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.expect("remover"));
        }
        assert_eq!(wins, 1, "round {round}: {wins} removes with one etag succeeded");
        assert!(table.read_row("actor", &name).await.expect("read").is_none());
    }
}

/// clear racing upserts: afterwards read_row and the range read agree on every
/// key (no row visible to one and not the other), and every row can be removed.
pub async fn clear_racing_upserts_leaves_no_half_row(store: Store) {
    let table = fresh_table(&store).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (table, done) = (table.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let e = reminder(&*table, &format!("actor-{w}"), &format!("r{}", n % 40), None);
                table.upsert_row(&e).await.expect("upsert");
                n += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        table.clear().await.expect("clear");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("writer");
    }
    let ranged = keys(&table.read_rows_in_range(0, 0).await.expect("range"));
    for w in 0..4 {
        for n in 0..40 {
            let (actor, name) = (format!("actor-{w}"), format!("r{n}"));
            let one = table.read_row(&actor, &name).await.expect("read_row");
            assert_eq!(
                one.is_some(),
                ranged.contains(&(actor.clone(), name.clone())),
                "read_row and the range read disagree about {actor}/{name} after clear raced upserts"
            );
            if let Some(e) = one {
                assert!(table
                    .remove_row(&actor, &name, &e.etag, None)
                    .await
                    .expect("remove"));
            }
        }
    }
}

/// Service ids, actor ids and names with separators and glob characters, or that
/// are prefixes of each other, never collide: each (actor, name) pair is its own
/// row, and each service its own table.
pub async fn ids_with_separators_never_collide(store: Store) {
    let base = crate::unique_id("svc");
    let services = [
        base.clone(),
        format!("{base}:"),
        format!("{base}*"),
        format!("{base}/x"),
    ];
    let pairs = [
        ("a", "b/c"),
        ("a/b", "c"),
        ("a", "b"),
        ("a:b", "c"),
        ("a", "b:c"),
        ("a*", "b"),
        ("a", "*"),
        ("a%2F", "b"),
        ("[a]", "?"),
        ("a", "b%3Ac"),
    ];
    let mut tables = Vec::new();
    for (i, id) in services.iter().enumerate() {
        let t = store.reminder_table(id).expect("open");
        t.init().await.expect("init");
        for (actor, name) in pairs.iter().take(i + 3) {
            t.upsert_row(&reminder(&*t, actor, name, None))
                .await
                .expect("upsert");
        }
        tables.push(t);
    }
    for (i, t) in tables.iter().enumerate() {
        let rows = t.read_rows_in_range(0, 0).await.expect("range");
        let expected: BTreeSet<(String, String)> = pairs
            .iter()
            .take(i + 3)
            .map(|(a, n)| (a.to_string(), n.to_string()))
            .collect();
        assert_eq!(keys(&rows), expected, "service `{}`", t.service_id());
        for (actor, name) in pairs.iter().take(i + 3) {
            let row = t.read_row(actor, name).await.expect("read").expect("row");
            assert_eq!((row.actor_id.as_str(), row.name.as_str()), (*actor, *name));
        }
        assert_eq!(
            t.read_rows_for("a").await.expect("for").len(),
            pairs.iter().take(i + 3).filter(|p| p.0 == "a").count()
        );
    }
    tables[0].clear().await.expect("clear");
    assert_eq!(
        tables[1].read_rows_in_range(0, 0).await.expect("range").len(),
        4,
        "clear of a prefix service"
    );
    for t in &tables {
        t.clear().await.expect("cleanup");
    }
}

/// Writes `rows` 16 at a time.
async fn upsert_all(table: &Arc<dyn ReminderTable>, rows: &[ReminderEntry]) {
    futures_util::stream::iter(rows)
        .map(|e| async move { table.upsert_row(e).await.expect("upsert") })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

/// Rows of kinds `cart`, `carton` (a kind the prefix `cart` alone would
/// catch) and `user`, and one `cart` actor with 12 reminders (one hash, more
/// rows than a page).
fn kinds_fixture(table: &dyn ReminderTable) -> Vec<ReminderEntry> {
    let mut rows = Vec::new();
    for i in 0..90 {
        rows.push(reminder(table, &format!("cart/{i}"), "r", None));
        if i % 3 == 0 {
            rows.push(reminder(table, &format!("cart/{i}"), "s", None));
        }
    }
    for i in 0..30 {
        rows.push(reminder(table, &format!("carton/{i}"), "r", None));
        rows.push(reminder(table, &format!("user/{i}"), "r", None));
    }
    for n in 0..12 {
        rows.push(reminder(table, "cart/hot", &format!("n{n}"), None));
    }
    rows
}

/// Paging by actor-id prefix: pages of 5 rows of kind `cart` (`"cart/"`)
/// return every such row exactly once, no `carton` or `user` row, in ring order,
/// the 12 rows of one actor split across pages; `""` pages the whole table.
/// Rows removed and written while the pages are read: every row present
/// throughout is returned once. A token survives its text form; a garbage token
/// and a page size of 0 are typed errors.
pub async fn pages_by_prefix_return_each_row_once(store: Store) {
    let table = fresh_table(&store).await;
    let all = kinds_fixture(&*table);
    upsert_all(&table, &all).await;
    let read_all = |prefix: &'static str, size: usize| {
        let table = table.clone();
        async move {
            let (mut out, mut after, mut pages) = (Vec::new(), None::<PageToken>, 0);
            loop {
                let page = table.read_page(prefix, after.as_ref(), size).await.expect("page");
                assert!(
                    page.rows.len() <= size,
                    "a page of {} rows, asked {size}",
                    page.rows.len()
                );
                pages += 1;
                assert!(pages < 10_000, "paging does not end");
                out.extend(page.rows);
                match page.next {
                    // Through its text form, as a CLI or URL carries it.
                    Some(t) => after = Some(PageToken::parse(&t.encode()).expect("token")),
                    None => return (out, pages),
                }
            }
        }
    };
    let (carts, pages) = read_all("cart/", 5).await;
    let expect: BTreeSet<_> = all
        .iter()
        .filter(|r| r.actor_id.starts_with("cart/"))
        .map(|r| (r.actor_id.clone(), r.name.clone()))
        .collect();
    assert_eq!(carts.len(), expect.len(), "each `cart` row once");
    assert_eq!(keys(&carts), expect);
    assert!(pages >= expect.len() / 5, "pages of at most 5: {pages}");
    let order: Vec<_> = carts.iter().map(|r| (r.hash, &r.actor_id, &r.name)).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "ring order");
    let (everything, _) = read_all("", 64).await;
    assert_eq!(everything.len(), all.len());
    assert_eq!(keys(&everything), keys(&all));

    // Writes while paging: remove rows, add rows, re-register rows.
    let mut after = None::<PageToken>;
    let mut seen = Vec::new();
    let (mut removed, mut added) = (BTreeSet::new(), BTreeSet::new());
    for round in 0.. {
        let page = table.read_page("user/", after.as_ref(), 4).await.expect("page");
        seen.extend(page.rows.iter().map(|r| (r.actor_id.clone(), r.name.clone())));
        let i = round * 3;
        let gone = format!("user/{}", (i + 7) % 30);
        if table
            .remove_row(
                &gone,
                "r",
                &table
                    .read_row(&gone, "r")
                    .await
                    .expect("read")
                    .map_or_else(Etag::default, |r| r.etag),
                None,
            )
            .await
            .expect("remove")
        {
            removed.insert((gone, "r".to_owned()));
        }
        let new = reminder(&*table, &format!("user/new-{round}"), "r", None);
        table.upsert_row(&new).await.expect("upsert");
        added.insert((new.actor_id.clone(), new.name.clone()));
        let again = reminder(&*table, &format!("user/{}", (i + 1) % 30), "r", None);
        table.upsert_row(&again).await.expect("re-register");
        match page.next {
            Some(t) => after = Some(t),
            None => break,
        }
    }
    let seen_set: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), seen_set.len(), "no row twice while rows change");
    for r in all.iter().filter(|r| r.actor_id.starts_with("user/")) {
        let key = (r.actor_id.clone(), r.name.clone());
        if !removed.contains(&key) {
            assert!(seen_set.contains(&key), "{key:?} stayed and was not returned");
        }
    }
    assert!(seen_set.iter().all(|k| k.0.starts_with("user/")));
    assert!(seen_set.is_subset(&keys(&all).union(&added).cloned().collect()));

    assert!(matches!(
        PageToken::parse("not a token"),
        Err(Error::InvalidInput { .. })
    ));
    assert!(matches!(
        table.read_page("", None, 0).await,
        Err(Error::InvalidInput { .. })
    ));
    table.clear().await.expect("cleanup");
}

/// A [`ReminderTable`] over a real one that, on its first `remove_row`,
/// re-registers `victim` (a writer racing the bulk delete), and fails every
/// `remove_row` after `fail_after` of them (a crash part-way).
#[derive(Debug)]
struct Racing {
    inner: Arc<dyn ReminderTable>,
    victim: Option<ReminderEntry>,
    removes: std::sync::atomic::AtomicUsize,
    fail_after: usize,
}

#[async_trait::async_trait]
impl ReminderTable for Racing {
    fn service_id(&self) -> &str {
        self.inner.service_id()
    }
    async fn init(&self) -> rollcall_core::Result<()> {
        self.inner.init().await
    }
    async fn read_rows_for(&self, actor_id: &str) -> rollcall_core::Result<Vec<ReminderEntry>> {
        self.inner.read_rows_for(actor_id).await
    }
    async fn read_rows_in_range(&self, begin: u32, end: u32) -> rollcall_core::Result<Vec<ReminderEntry>> {
        self.inner.read_rows_in_range(begin, end).await
    }
    async fn read_row(&self, actor_id: &str, name: &str) -> rollcall_core::Result<Option<ReminderEntry>> {
        self.inner.read_row(actor_id, name).await
    }
    async fn upsert_row(&self, entry: &ReminderEntry) -> rollcall_core::Result<Etag> {
        self.inner.upsert_row(entry).await
    }
    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&rollcall_core::Fence>,
    ) -> rollcall_core::Result<bool> {
        let n = self.removes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let (0, Some(victim)) = (n, &self.victim) {
            self.inner.upsert_row(victim).await?;
        }
        if n >= self.fail_after {
            return Err(Error::backend("the deleting process crashed"));
        }
        self.inner.remove_row(actor_id, name, etag, fence).await
    }
    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&rollcall_core::Fence>,
    ) -> rollcall_core::Result<bool> {
        self.inner
            .update_last_fired(actor_id, name, etag, fired_at, fence)
            .await
    }
    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> rollcall_core::Result<bool> {
        self.inner.update_paused(actor_id, name, etag, paused).await
    }
    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &RunRecord,
        keep: usize,
        fence: Option<&rollcall_core::Fence>,
    ) -> rollcall_core::Result<()> {
        self.inner.append_run(actor_id, name, run, keep, fence).await
    }
    async fn read_runs(&self, actor_id: &str, name: &str) -> rollcall_core::Result<Vec<RunRecord>> {
        self.inner.read_runs(actor_id, name).await
    }
    async fn remove_runs(&self, actor_id: &str, name: &str) -> rollcall_core::Result<()> {
        self.inner.remove_runs(actor_id, name).await
    }
    async fn clear(&self) -> rollcall_core::Result<()> {
        self.inner.clear().await
    }
}

/// A bulk delete by prefix removes exactly the rows of kind `cart` (not
/// `carton`, not `user`), one conditional remove per row: a row re-registered
/// while the delete runs stays (counted as changed); a delete that fails
/// part-way (a crash) leaves rows that a second run removes; a third run finds
/// nothing. Every removed row is reported once.
pub async fn remove_prefix_is_exact_and_safe_to_run_again(store: Store) {
    let table = fresh_table(&store).await;
    let all = kinds_fixture(&*table);
    upsert_all(&table, &all).await;
    let carts: BTreeSet<_> = all
        .iter()
        .filter(|r| r.actor_id.starts_with("cart/"))
        .map(|r| (r.actor_id.clone(), r.name.clone()))
        .collect();
    let crashing = Racing {
        inner: table.clone(),
        victim: None,
        removes: Default::default(),
        fail_after: 40,
    };
    let t = Duration::from_secs(10);
    let mut reported = Vec::new();
    let first = rollcall_core::paging::remove_prefix(&crashing, "cart/", 500, 8, t, &mut |r| {
        reported.push((r.actor_id.clone(), r.name.clone()));
    })
    .await;
    assert!(
        matches!(first, Err(Error::Backend { .. })),
        "the crash is reported: {first:?}"
    );
    let after_crash = table.read_page("cart/", None, 1000).await.expect("page").rows;
    assert!(!after_crash.is_empty() && after_crash.len() < carts.len());
    // One at a time, so that the first remove is of the first row in ring
    // order: the victim, re-registered just before its remove.
    let victim = after_crash[0].clone();
    let racing = Racing {
        inner: table.clone(),
        victim: Some(victim.clone()),
        removes: Default::default(),
        fail_after: usize::MAX,
    };
    let second = rollcall_core::paging::remove_prefix(&racing, "cart/", 7, 1, t, &mut |r| {
        reported.push((r.actor_id.clone(), r.name.clone()));
    })
    .await
    .expect("second run");
    assert_eq!(second.changed, 1, "the re-registered row is counted as changed");
    assert!(second.removed > 0);
    let left = table.read_rows_in_range(0, 0).await.expect("range");
    let victim_key = (victim.actor_id.clone(), victim.name.clone());
    let expect_left: BTreeSet<_> = keys(&all)
        .difference(&carts)
        .cloned()
        .chain([victim_key.clone()])
        .collect();
    assert_eq!(
        keys(&left),
        expect_left,
        "exactly the carts went; the re-registered one stayed"
    );
    let reported_set: BTreeSet<_> = reported.iter().cloned().collect();
    assert_eq!(reported.len(), reported_set.len(), "each removal reported once");
    assert_eq!(
        reported_set,
        carts.iter().filter(|k| **k != victim_key).cloned().collect()
    );
    // Run again: the registration the last run kept is the one left to remove.
    let third = rollcall_core::paging::remove_prefix(&*table, "cart/", 7, 8, t, &mut |_| {})
        .await
        .expect("third run");
    assert_eq!((third.removed, third.changed), (1, 0), "the kept registration");
    let fourth = rollcall_core::paging::remove_prefix(&*table, "cart/", 7, 8, t, &mut |_| {})
        .await
        .expect("fourth run");
    assert_eq!(
        (fourth.removed, fourth.changed, fourth.pages),
        (0, 0, 1),
        "nothing left"
    );
    assert_eq!(
        keys(&table.read_rows_in_range(0, 0).await.expect("range")),
        keys(&all).difference(&carts).cloned().collect()
    );
    table.clear().await.expect("cleanup");
}

/// `update_paused` sets and clears the paused column under the current etag
/// and keeps the etag (a pause is not a registration): read back by key, by
/// actor and by range, next to `last_fired`; a stale etag or a missing row
/// writes nothing; a registration (upsert) writes its own column (unpaused);
/// a removed row leaves no paused column behind for the next registration.
pub async fn paused_keeps_the_etag(store: Store) {
    let table = fresh_table(&store).await;
    let row = reminder(&*table, "cart/1", "r", Some(Duration::from_secs(60)));
    let e1 = table.upsert_row(&row).await.expect("upsert");
    let since = Timestamp::from_millis(1_795_000_100_000);
    assert!(table
        .update_paused("cart/1", "r", &e1, Some(since))
        .await
        .expect("pause"));
    let fired = Timestamp::from_millis(1_795_000_060_321);
    assert!(table
        .update_last_fired("cart/1", "r", &e1, fired, None)
        .await
        .expect("fired"));
    let by_key = table.read_row("cart/1", "r").await.expect("read").expect("row");
    assert_eq!(
        (by_key.etag.clone(), by_key.paused, by_key.last_fired),
        (e1.clone(), Some(since), Some(fired))
    );
    let by_actor = table.read_rows_for("cart/1").await.expect("read");
    assert_eq!(by_actor[0].paused, Some(since));
    let by_range = table.read_rows_in_range(0, 0).await.expect("range");
    assert_eq!((by_range.len(), by_range[0].paused), (1, Some(since)));

    let stale = Etag::new(format!("{}0", e1.as_str()));
    assert!(!table
        .update_paused("cart/1", "r", &stale, None)
        .await
        .expect("stale"));
    assert!(!table
        .update_paused("cart/2", "r", &e1, Some(since))
        .await
        .expect("missing"));
    assert!(
        table.read_row("cart/2", "r").await.expect("read").is_none(),
        "no row created"
    );
    assert_eq!(
        table
            .read_row("cart/1", "r")
            .await
            .expect("read")
            .expect("row")
            .paused,
        Some(since)
    );

    assert!(table
        .update_paused("cart/1", "r", &e1, None)
        .await
        .expect("resume"));
    let resumed = table.read_row("cart/1", "r").await.expect("read").expect("row");
    assert_eq!(
        (resumed.etag.clone(), resumed.paused, resumed.last_fired),
        (e1.clone(), None, Some(fired))
    );

    assert!(table
        .update_paused("cart/1", "r", &e1, Some(since))
        .await
        .expect("pause"));
    let e2 = table.upsert_row(&row).await.expect("register again");
    let again = table.read_row("cart/1", "r").await.expect("read").expect("row");
    assert_eq!(
        (again.etag.clone(), again.paused),
        (e2.clone(), None),
        "a registration is unpaused"
    );
    assert!(!table
        .update_paused("cart/1", "r", &e1, Some(since))
        .await
        .expect("old etag"));

    assert!(table
        .update_paused("cart/1", "r", &e2, Some(since))
        .await
        .expect("pause"));
    assert!(table.remove_row("cart/1", "r", &e2, None).await.expect("remove"));
    table.upsert_row(&row).await.expect("register after removal");
    assert_eq!(
        table
            .read_row("cart/1", "r")
            .await
            .expect("read")
            .expect("row")
            .paused,
        None
    );
    table.clear().await.expect("cleanup");
}

fn run(i: u64, outcome: RunOutcome) -> RunRecord {
    RunRecord {
        scheduled: Timestamp::from_millis(1_795_000_000_000 + i * 1000),
        at: Timestamp::from_millis(1_795_000_000_050 + i * 1000),
        attempts: 1 + (i % 3) as u32,
        outcome,
        silo: "127.0.0.1:11111@7".into(),
        triggered: i.is_multiple_of(5),
    }
}

/// A reminder's run history: appends read back newest first, every field and
/// outcome; only the newest `keep` stay; the history needs no row, outlives
/// the row's removal and re-registration, and is apart per (actor, name) and
/// per service; 16 concurrent appends all land; an append that is retried
/// after it landed adds nothing; `remove_runs` and `clear` remove it; a `keep`
/// of 0 is a typed error.
pub async fn run_history_keeps_the_newest(store: Store) {
    let table = fresh_table(&store).await;
    let other = fresh_table(&store).await;
    assert!(table.read_runs("cart/1", "r").await.expect("read").is_empty());
    let outcomes = [
        RunOutcome::Ok,
        RunOutcome::Failed,
        RunOutcome::GivenUp,
        RunOutcome::Parked,
        RunOutcome::Skipped,
    ];
    for i in 0..25u64 {
        table
            .append_run("cart/1", "r", &run(i, outcomes[(i % 5) as usize]), 20, None)
            .await
            .expect("append");
    }
    let runs = table.read_runs("cart/1", "r").await.expect("read");
    assert_eq!(runs.len(), 20, "only the newest 20");
    let expected: Vec<RunRecord> = (5..25u64)
        .rev()
        .map(|i| run(i, outcomes[(i % 5) as usize]))
        .collect();
    assert_eq!(runs, expected, "newest first, every field");
    // The same record again (a retried append that landed): nothing added.
    table
        .append_run("cart/1", "r", &run(24, outcomes[4]), 20, None)
        .await
        .expect("again");
    assert_eq!(
        table.read_runs("cart/1", "r").await.expect("read"),
        expected,
        "no record twice"
    );
    // A smaller keep trims.
    table
        .append_run("cart/1", "r", &run(25, RunOutcome::Ok), 3, None)
        .await
        .expect("append");
    assert_eq!(table.read_runs("cart/1", "r").await.expect("read").len(), 3);
    // Apart per name, per actor, per service; no row needed.
    assert!(table.read_runs("cart/1", "s").await.expect("read").is_empty());
    assert!(table.read_runs("cart/10", "r").await.expect("read").is_empty());
    assert!(other.read_runs("cart/1", "r").await.expect("read").is_empty());
    // Concurrent appends all land.
    let appends = (100..116u64).map(|i| {
        let table = table.clone();
        async move {
            table
                .append_run("cart/2", "r", &run(i, RunOutcome::Ok), 100, None)
                .await
        }
    });
    for r in futures_util::future::join_all(appends).await {
        r.expect("append");
    }
    let mut got: Vec<Timestamp> = table
        .read_runs("cart/2", "r")
        .await
        .expect("read")
        .iter()
        .map(|r| r.scheduled)
        .collect();
    got.sort();
    let want: Vec<Timestamp> = (100..116u64).map(|i| run(i, RunOutcome::Ok).scheduled).collect();
    assert_eq!(got, want, "16 concurrent appends, none lost");
    // Rows come and go; the history stays, and a range read never shows it.
    let row = reminder(&*table, "cart/1", "r", Some(Duration::from_secs(60)));
    let e = table.upsert_row(&row).await.expect("upsert");
    assert_eq!(table.read_rows_in_range(0, 0).await.expect("range").len(), 1);
    assert_eq!(table.read_page("", None, 100).await.expect("page").rows.len(), 1);
    assert!(table.remove_row("cart/1", "r", &e, None).await.expect("remove"));
    assert_eq!(table.read_runs("cart/1", "r").await.expect("read").len(), 3);
    table.remove_runs("cart/1", "r").await.expect("remove runs");
    table.remove_runs("cart/1", "r").await.expect("idempotent");
    assert!(table.read_runs("cart/1", "r").await.expect("read").is_empty());
    assert!(matches!(
        table
            .append_run("cart/1", "r", &run(0, RunOutcome::Ok), 0, None)
            .await,
        Err(Error::InvalidInput { .. })
    ));
    table.clear().await.expect("clear");
    assert!(
        table.read_runs("cart/2", "r").await.expect("read").is_empty(),
        "clear takes histories"
    );
    other.clear().await.expect("cleanup");
}

/// Issue 72, item 5: the reminder-row writes a shard's holder makes (a
/// one-shot's removal, `last_fired`, a run append) carry its lease's fence
/// and the store compares it in the write's own transaction. Under epoch e
/// each lands; once another silo acquired the shard (e + 1) each under e is
/// `Error::Fenced` naming e + 1 and changes nothing, and under e + 1 each
/// lands; after a release each is `Fenced` naming no holder. A fence of
/// another shard or service is `InvalidInput`; unfenced writes (an
/// application's `unregister`) are unchanged.
pub async fn holder_writes_under_a_stale_fence_are_refused(store: Store) {
    use rollcall_core::lease::{LeaseStatus, ShardLease, ShardLeases};
    use rollcall_core::{actor_shard, Fence, SiloAddress, DEFAULT_SHARDS};

    let table = fresh_table(&store).await;
    let service = table.service_id().to_owned();
    let leases = ShardLeases::open(store.lease_table(&service).expect("lease table"), DEFAULT_SHARDS)
        .await
        .expect("leases");
    let actor = "cart/1";
    let shard = actor_shard(actor, DEFAULT_SHARDS);
    let fence = |epoch| Fence {
        service: service.clone(),
        shards: DEFAULT_SHARDS,
        shard,
        epoch,
    };
    let acquire = |lease: &ShardLease, port: u16| ShardLease {
        epoch: lease.epoch + 1,
        owner: Some(SiloAddress::new(([127, 0, 0, 1], port).into(), 1_795_000_000_000)),
        status: LeaseStatus::Owned,
        ..lease.clone()
    };
    let once = table
        .upsert_row(&reminder(&*table, actor, "once", None))
        .await
        .expect("upsert");
    let tick = table
        .upsert_row(&reminder(&*table, actor, "tick", Some(Duration::from_secs(60))))
        .await
        .expect("upsert");
    let first = acquire(&ShardLease::vacant(shard), 11111);
    leases.write(&first).await.expect("write").expect("acquired");
    let e = fence(first.epoch);
    let run = |i: u64| RunRecord {
        scheduled: Timestamp::from_millis(1_795_000_000_000 + i),
        at: Timestamp::from_millis(1_795_000_000_500 + i),
        attempts: 1,
        outcome: RunOutcome::Ok,
        silo: "127.0.0.1:11111@1".into(),
        triggered: false,
    };
    let t = |ms: u64| Timestamp::from_millis(1_795_000_000_000 + ms);

    // Under e, while e holds: each lands.
    assert!(table
        .update_last_fired(actor, "tick", &tick, t(1), Some(&e))
        .await
        .expect("last_fired under e"));
    table
        .append_run(actor, "tick", &run(1), 20, Some(&e))
        .await
        .expect("append under e");

    // Another silo acquires: e + 1.
    let second = ShardLease {
        etag: leases.read(shard).await.expect("read").etag,
        ..acquire(&first, 22222)
    };
    leases.write(&second).await.expect("write").expect("acquired");
    let refused = |r: Result<bool, Error>, what: &str, current: Option<u64>| match r {
        Err(Error::Fenced {
            epoch,
            current: c,
            shard: s,
            ..
        }) => {
            assert_eq!((epoch, s, c), (first.epoch, shard, current), "{what}");
        }
        other => panic!("{what} under a stale fence: {other:?}"),
    };
    refused(
        table.remove_row(actor, "once", &once, Some(&e)).await,
        "remove_row",
        Some(second.epoch),
    );
    refused(
        table
            .update_last_fired(actor, "tick", &tick, t(2), Some(&e))
            .await,
        "update_last_fired",
        Some(second.epoch),
    );
    refused(
        table
            .append_run(actor, "tick", &run(2), 20, Some(&e))
            .await
            .map(|()| true),
        "append_run",
        Some(second.epoch),
    );
    // Nothing changed.
    let row = table
        .read_row(actor, "once")
        .await
        .expect("read")
        .expect("still there");
    assert_eq!(row.etag, once);
    let row = table.read_row(actor, "tick").await.expect("read").expect("there");
    assert_eq!((row.etag.clone(), row.last_fired), (tick.clone(), Some(t(1))));
    assert_eq!(table.read_runs(actor, "tick").await.expect("runs"), vec![run(1)]);

    // Under e + 1: each lands.
    let e1 = fence(second.epoch);
    assert!(table
        .update_last_fired(actor, "tick", &tick, t(3), Some(&e1))
        .await
        .expect("last_fired under e + 1"));
    table
        .append_run(actor, "tick", &run(3), 20, Some(&e1))
        .await
        .expect("append under e + 1");
    assert_eq!(
        table.read_runs(actor, "tick").await.expect("runs"),
        vec![run(3), run(1)]
    );
    assert!(table
        .remove_row(actor, "once", &once, Some(&e1))
        .await
        .expect("remove under e + 1"));
    assert!(table.read_row(actor, "once").await.expect("read").is_none());
    // A stale etag under the current fence is `Ok(false)`, as unfenced.
    assert!(!table
        .update_last_fired(actor, "tick", &Etag::new("no-such-etag"), t(4), Some(&e1))
        .await
        .expect("a stale etag"));

    // Released: no holder, every fenced write refused.
    let released = ShardLease {
        status: LeaseStatus::Released,
        etag: leases.read(shard).await.expect("read").etag,
        ..second.clone()
    };
    leases.write(&released).await.expect("write").expect("released");
    match table
        .update_last_fired(actor, "tick", &tick, t(5), Some(&e1))
        .await
    {
        Err(Error::Fenced { current: None, .. }) => {}
        other => panic!("last_fired under a released lease: {other:?}"),
    }

    // A fence that cannot fence this write.
    let other_shard = Fence {
        shard: (shard + 1) % DEFAULT_SHARDS,
        ..e1.clone()
    };
    let other_service = Fence {
        service: format!("{service}-other"),
        ..e1.clone()
    };
    for f in [&other_shard, &other_service] {
        assert!(matches!(
            table.update_last_fired(actor, "tick", &tick, t(6), Some(f)).await,
            Err(Error::InvalidInput { .. })
        ));
    }
    // Unfenced writes are unchanged.
    assert!(table
        .update_last_fired(actor, "tick", &tick, t(7), None)
        .await
        .expect("unfenced"));
    assert!(table
        .remove_row(actor, "tick", &tick, None)
        .await
        .expect("unfenced"));
}

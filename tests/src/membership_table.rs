//! Membership table conformance scenarios (PROTOCOL.md, "Table contract").

use std::sync::Arc;
use std::time::Duration;

use rollcall_core::{
    Error, Etag, HistoryQuery, MembershipEntry, MembershipEvent, MembershipRow, MembershipTable,
    ProtocolMode, SiloAddress, SiloStatus, SuspectVote, TableVersion, Timestamp, WriteKind, WriteMode,
    WriteOrigin,
};
use tokio::sync::Barrier;

use crate::{unique_id, Store};

/// Opens and initialises a table under a fresh cluster id.
pub async fn fresh_table(store: &Store, mode: ProtocolMode) -> Arc<dyn MembershipTable> {
    let table = store
        .membership_table(&unique_id("cluster"), mode)
        .expect("open membership table");
    table.init(true).await.expect("init membership table");
    table
}

/// `10.0.<n/250>.<n%250+1>:11111@<gen>`: distinct silos for tests.
pub fn silo(n: u32, generation: u64) -> SiloAddress {
    format!("10.0.{}.{}:11111@{}", n / 250, n % 250 + 1, generation)
        .parse()
        .expect("valid silo address")
}

/// A row with every column set to a non-default value derived from `n`.
pub fn full_entry(n: u32) -> MembershipEntry {
    let base = 1_795_000_000_000 + u64::from(n) * 1000;
    MembershipEntry {
        silo: silo(n, 1_700_000_000_000 + u64::from(n)),
        status: SiloStatus::Active,
        suspect_votes: vec![
            SuspectVote {
                silo: silo(n + 1000, 7),
                time: Timestamp::from_millis(base + 123),
            },
            SuspectVote {
                silo: silo(n + 2000, 3),
                time: Timestamp::from_millis(base + 45),
            },
        ],
        proxy_port: 30000 + (n % 1000) as u16,
        host_name: format!("host-{n}.example"),
        silo_name: format!("silo-{n} ünïcode"),
        role_name: "role/\"quoted\"".into(),
        update_zone: n % 7 + 1,
        fault_zone: n % 5 + 2,
        start_time: Timestamp::from_millis(base + 1),
        i_am_alive_time: Timestamp::from_millis(base + 999),
        clock_beyond_bound: n % 2 == 1,
    }
}

/// Inserts `entry` at the version just read, asserting that the insert commits.
pub async fn insert(table: &dyn MembershipTable, entry: &MembershipEntry) {
    let snap = table.read_all().await.expect("read_all");
    assert!(
        table
            .insert_row(entry, &snap.version.next())
            .await
            .expect("insert_row"),
        "insert of {} at a fresh version must succeed",
        entry.silo
    );
}

async fn row_and_etag(table: &dyn MembershipTable, s: &SiloAddress) -> (MembershipEntry, Etag, TableVersion) {
    let snap = table.read_row(s).await.expect("read_row");
    let (e, etag) = snap
        .row(s)
        .cloned()
        .map(MembershipRow::into_parts)
        .unwrap_or_else(|| panic!("row {s} missing"));
    (e, etag, snap.version)
}

/// Scenario 1: A new cluster reads as 0 rows, version 0 and a non-empty version etag.
pub async fn empty_cluster(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.len(), 0);
    assert_eq!(snap.version.version, 0);
    assert!(!snap.version.etag.is_empty(), "version etag must not be empty");
    let one = table.read_row(&silo(1, 1)).await.expect("read_row");
    assert!(one.is_empty());
    assert_eq!(one.version, snap.version);
}

/// Scenario 2: Insert answers true, then 1 row, version 1 and a changed version etag.
pub async fn insert_row_bumps_version(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let before = table.read_all().await.expect("read_all");
    let e = full_entry(1);
    assert!(table
        .insert_row(&e, &before.version.next())
        .await
        .expect("insert"));
    let after = table.read_all().await.expect("read_all");
    assert_eq!(after.len(), 1);
    assert_eq!(after.version.version, 1);
    assert_ne!(
        after.version.etag, before.version.etag,
        "version etag must change"
    );
    assert_eq!(after.entry(&e.silo), Some(&e));
}

/// Scenario 3: A duplicate insert (stale or fresh version) and a new row at a stale version
/// answer false and change nothing.
pub async fn duplicate_and_stale_inserts_have_no_effect(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let v0 = table.read_all().await.expect("read_all").version;
    let e = full_entry(1);
    assert!(table.insert_row(&e, &v0.next()).await.expect("insert"));
    let snap = table.read_all().await.expect("read_all");

    let mut dup = e.clone();
    dup.host_name = "changed".into();
    assert!(!table
        .insert_row(&dup, &v0.next())
        .await
        .expect("dup, stale version"));
    assert!(!table
        .insert_row(&dup, &snap.version.next())
        .await
        .expect("dup, fresh version"));
    let other = full_entry(2);
    assert!(!table
        .insert_row(&other, &v0.next())
        .await
        .expect("new row, stale version"));

    assert_eq!(
        table.read_all().await.expect("read_all"),
        snap,
        "a failed insert must have no side effect"
    );
}

/// Scenario 4: read_row returns every column exactly as written (times to the ms, vote
/// order) and a non-empty etag.
pub async fn read_row_returns_every_column(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let mut e = full_entry(3);
    e.status = SiloStatus::ShuttingDown;
    insert(&*table, &e).await;
    let (read, etag, version) = row_and_etag(&*table, &e.silo).await;
    assert_eq!(read, e);
    assert_eq!(read.suspect_votes[0].time.as_millis() % 1000, 123, "ms precision");
    assert!(!etag.is_empty());
    assert_eq!(version.version, 1);
    // Minimal row: default columns survive too.
    let bare = MembershipEntry::new(silo(4, 9), SiloStatus::Joining, Timestamp::from_millis(1));
    insert(&*table, &bare).await;
    assert_eq!(row_and_etag(&*table, &bare.silo).await.0, bare);
}

/// Scenario 5: update_row: right etags commit; a stale row etag, a stale version etag, a
/// version number that skips, or a missing row answer false and change nothing.
pub async fn update_row_preconditions(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let e = full_entry(5);
    insert(&*table, &e).await;
    let (_, etag1, v1) = row_and_etag(&*table, &e.silo).await;

    let mut changed = e.clone();
    changed.status = SiloStatus::Dead;
    assert!(table
        .update_row(&changed, &etag1, &v1.next())
        .await
        .expect("update"));
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.entry(&e.silo), Some(&changed));
    assert_eq!(snap.version.version, 2);
    let etag2 = snap.get(&e.silo).expect("row").1.clone();
    assert_ne!(etag2, etag1, "row etag must change on update");

    let mut again = changed.clone();
    again.host_name = "nope".into();
    assert!(!table
        .update_row(&again, &etag1, &snap.version.next())
        .await
        .expect("stale row etag"));
    assert!(!table
        .update_row(&again, &etag2, &v1.next())
        .await
        .expect("stale version etag"));
    let skip = TableVersion {
        version: snap.version.version + 2,
        etag: snap.version.etag.clone(),
    };
    assert!(!table
        .update_row(&again, &etag2, &skip)
        .await
        .expect("skipping version"));
    let missing = full_entry(6);
    assert!(!table
        .update_row(&missing, &etag2, &snap.version.next())
        .await
        .expect("missing row"));

    assert_eq!(
        table.read_all().await.expect("read_all"),
        snap,
        "failed updates must have no side effect"
    );
}

/// Scenario 6: A run of 50 mixed successful writes advances the version by exactly 1 each.
pub async fn every_write_advances_version_by_one(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    for i in 0..50u32 {
        let snap = table.read_all().await.expect("read_all");
        assert_eq!(snap.version.version, u64::from(i));
        let n = i % 5;
        let ok = match snap.get(&full_entry(n).silo) {
            None => table.insert_row(&full_entry(n), &snap.version.next()).await,
            Some((e, etag)) => {
                let mut e = e.clone();
                e.update_zone = i;
                table.update_row(&e, etag, &snap.version.next()).await
            }
        };
        assert!(ok.expect("write"), "write {i} must succeed");
    }
    assert_eq!(table.read_all().await.expect("read_all").version.version, 50);
}

/// Scenario 7: 20 concurrent inserts of one row at one version: exactly one succeeds.
pub async fn concurrent_inserts_have_one_winner(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let v = table.read_all().await.expect("read_all").version;
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20u32)
        .map(|i| {
            let (table, barrier, v) = (table.clone(), barrier.clone(), v.clone());
            tokio::spawn(async move {
                let mut e = full_entry(7);
                e.host_name = format!("writer-{i}");
                barrier.wait().await;
                table.insert_row(&e, &v.next()).await.expect("insert")
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.expect("task"));
    }
    assert_eq!(wins, 1, "exactly one concurrent insert must win");
    let snap = table.read_all().await.expect("read_all");
    assert_eq!((snap.len(), snap.version.version), (1, 1));
}

/// Scenario 8: 20 workers loop read-modify-write on one row until each succeeds: the version
/// ends 20 higher and all 20 changes are present.
pub async fn concurrent_read_modify_write_loses_nothing(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let mut target = full_entry(8);
    target.suspect_votes.clear();
    insert(&*table, &target).await;
    let tasks: Vec<_> = (0..20u32)
        .map(|i| {
            let table = table.clone();
            let s = target.silo;
            tokio::spawn(async move {
                let mut attempts = 0u32;
                loop {
                    attempts += 1;
                    assert!(attempts < 10_000, "worker {i} never succeeded");
                    let (mut e, etag, v) = row_and_etag(&*table, &s).await;
                    e.suspect_votes.push(SuspectVote {
                        silo: silo(100 + i, 1),
                        time: Timestamp::from_millis(u64::from(i)),
                    });
                    if table.update_row(&e, &etag, &v.next()).await.expect("update") {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.version.version, 21);
    let mut voters: Vec<_> = snap
        .entry(&target.silo)
        .expect("row")
        .suspect_votes
        .iter()
        .map(|v| v.silo)
        .collect();
    voters.sort();
    voters.dedup();
    assert_eq!(voters.len(), 20, "every worker's change must be present");
}

/// Scenario 9: Workers updating different rows from the same read version: exactly one
/// winner per round.
pub async fn different_rows_same_version_one_winner(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    const WORKERS: u32 = 8;
    for n in 0..WORKERS {
        insert(&*table, &full_entry(20 + n)).await;
    }
    for round in 0..5u32 {
        let snap = Arc::new(table.read_all().await.expect("read_all"));
        let barrier = Arc::new(Barrier::new(WORKERS as usize));
        let tasks: Vec<_> = (0..WORKERS)
            .map(|n| {
                let (table, snap, barrier) = (table.clone(), snap.clone(), barrier.clone());
                tokio::spawn(async move {
                    let s = full_entry(20 + n).silo;
                    let (e, etag) = snap.row(&s).cloned().map(MembershipRow::into_parts).expect("row");
                    let mut e = e;
                    e.update_zone = round;
                    barrier.wait().await;
                    table
                        .update_row(&e, &etag, &snap.version.next())
                        .await
                        .expect("update")
                })
            })
            .collect();
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.expect("task"));
        }
        assert_eq!(
            wins, 1,
            "round {round}: exactly one writer of a shared version must win"
        );
        let after = table.read_all().await.expect("read_all");
        assert_eq!(after.version.version, snap.version.version + 1);
    }
}

/// Scenario 10: Readers racing writers never see a row written at version `v` with a table
/// version below `v` (each writer records the version it writes at in the row).
pub async fn snapshots_are_atomic(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    const WRITERS: u32 = 4;
    const WRITES_EACH: u32 = 25;
    for n in 0..WRITERS {
        let snap = table.read_all().await.expect("read_all");
        let mut e = full_entry(40 + n);
        e.update_zone = u32::try_from(snap.version.version + 1).expect("small");
        assert!(table.insert_row(&e, &snap.version.next()).await.expect("insert"));
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|n| {
            let table = table.clone();
            tokio::spawn(async move {
                let s = full_entry(40 + n).silo;
                let mut ok = 0;
                while ok < WRITES_EACH {
                    let snap = table.read_all().await.expect("read_all");
                    let (mut e, etag) = snap.row(&s).cloned().map(MembershipRow::into_parts).expect("row");
                    let next = snap.version.next();
                    e.update_zone = u32::try_from(next.version).expect("small");
                    if table.update_row(&e, &etag, &next).await.expect("update") {
                        ok += 1;
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (table, done) = (table.clone(), done.clone());
            tokio::spawn(async move {
                let mut reads = 0u32;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                    let snap = table.read_all().await.expect("read_all");
                    for e in snap.rows() {
                        assert!(
                            u64::from(e.update_zone) <= snap.version.version,
                            "torn read: row {} written at version {} seen with table version {}",
                            e.silo,
                            e.update_zone,
                            snap.version.version
                        );
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in readers {
        assert!(r.await.expect("reader") > 0);
    }
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.version.version, u64::from(WRITERS * (WRITES_EACH + 1)));
}

/// Scenario 11: update_i_am_alive stores the exact time, leaves the version alone, and etags
/// read before it still commit. A missing row stays missing.
pub async fn i_am_alive_is_a_blind_write(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let e = full_entry(11);
    insert(&*table, &e).await;
    let (_, etag, v) = row_and_etag(&*table, &e.silo).await;
    let t = Timestamp::from_millis(1_796_000_000_777);
    table
        .update_i_am_alive(&e.silo, t)
        .await
        .expect("update_i_am_alive");
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.entry(&e.silo).expect("row").i_am_alive_time, t);
    assert_eq!(snap.version, v, "IAmAlive must not touch the version row");
    let mut next = snap.entry(&e.silo).expect("row").clone();
    next.status = SiloStatus::ShuttingDown;
    assert!(
        table.update_row(&next, &etag, &v.next()).await.expect("update"),
        "an etag read before update_i_am_alive must still commit"
    );
    let ghost = silo(999, 1);
    table
        .update_i_am_alive(&ghost, t)
        .await
        .expect("update_i_am_alive of a missing row");
    assert!(
        table.read_row(&ghost).await.expect("read_row").is_empty(),
        "must not create a row"
    );
}

/// Scenario 12: cleanup_defunct deletes Dead rows strictly older than the cutoff, and nothing
/// else (not live rows, not the version).
pub async fn cleanup_defunct_removes_only_old_dead_rows(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let cutoff = Timestamp::from_millis(1_795_000_500_000);
    let mk = |n: u32, status: SiloStatus, alive: Timestamp| {
        let mut e = full_entry(n);
        e.status = status;
        e.start_time = Timestamp::from_millis(1_000);
        e.i_am_alive_time = alive;
        e
    };
    let old_dead = mk(
        1,
        SiloStatus::Dead,
        cutoff.saturating_sub(Duration::from_millis(1)),
    );
    let at_cutoff = mk(2, SiloStatus::Dead, cutoff);
    let new_dead = mk(3, SiloStatus::Dead, cutoff.saturating_add(Duration::from_secs(1)));
    let old_active = mk(4, SiloStatus::Active, Timestamp::from_millis(5_000));
    let old_stopping = mk(5, SiloStatus::Stopping, Timestamp::from_millis(5_000));
    for e in [&old_dead, &at_cutoff, &new_dead, &old_active, &old_stopping] {
        insert(&*table, e).await;
    }
    let version = table.read_all().await.expect("read_all").version;
    let removed = table.cleanup_defunct(cutoff).await.expect("cleanup_defunct");
    assert_eq!(removed, 1);
    let snap = table.read_all().await.expect("read_all");
    assert!(snap.get(&old_dead.silo).is_none());
    for e in [&at_cutoff, &new_dead, &old_active, &old_stopping] {
        assert!(snap.get(&e.silo).is_some(), "{} must survive", e.silo);
    }
    assert_eq!(snap.version, version);
}

/// Scenario 13: delete_cluster removes that cluster's rows and version, and nothing of
/// another cluster in the same store; clusters never see each other's rows.
pub async fn delete_cluster_and_isolation(store: Store) {
    let a = fresh_table(&store, ProtocolMode::Extended).await;
    let b = fresh_table(&store, ProtocolMode::Extended).await;
    insert(&*a, &full_entry(1)).await;
    insert(&*a, &full_entry(2)).await;
    insert(&*b, &full_entry(1)).await; // same silo, other cluster
    let a_snap = a.read_all().await.expect("read_all");
    let b_snap = b.read_all().await.expect("read_all");
    assert_eq!((a_snap.len(), a_snap.version.version), (2, 2));
    assert_eq!((b_snap.len(), b_snap.version.version), (1, 1));

    store
        .delete_cluster(b.cluster_id())
        .await
        .expect("delete_cluster");
    assert_eq!(
        a.read_all().await.expect("read_all"),
        a_snap,
        "deleting b must not touch a"
    );
    b.init(true).await.expect("re-init");
    let b_after = b.read_all().await.expect("read_all");
    assert_eq!((b_after.len(), b_after.version.version), (0, 0));
    a.delete_all().await.expect("delete own cluster");
    a.init(true).await.expect("re-init");
    assert!(a.read_all().await.expect("read_all").is_empty());
}

/// Scenario 14: Basic mode (version row disabled): writes are conditioned on the row etag
/// alone, so writers of different rows at one read version all win.
pub async fn basic_mode_checks_row_etag_only(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Basic).await;
    let v0 = table.read_all().await.expect("read_all").version;
    assert!(table
        .insert_row(&full_entry(1), &v0.next())
        .await
        .expect("insert"));
    assert!(table
        .insert_row(&full_entry(2), &v0.next())
        .await
        .expect("insert with an old version"));
    assert!(
        !table
            .insert_row(&full_entry(2), &v0.next())
            .await
            .expect("duplicate"),
        "duplicate insert must fail"
    );
    let snap = table.read_all().await.expect("read_all");
    for n in [1, 2] {
        let (e, etag) = snap
            .row(&full_entry(n).silo)
            .cloned()
            .map(MembershipRow::into_parts)
            .expect("row");
        let mut e = e;
        e.update_zone = 99;
        assert!(
            table.update_row(&e, &etag, &v0.next()).await.expect("update"),
            "row-etag-only update of row {n} with a stale version must commit"
        );
        assert!(!table
            .update_row(&e, &etag, &v0.next())
            .await
            .expect("stale row etag"));
    }
}

/// Scenario 15: delete_cluster racing writers never leaves a row that read_row sees
/// and read_all does not (such a silo could never insert itself again): after the
/// race, both reads agree on every row, and every row read_all shows can be updated.
pub async fn delete_cluster_racing_writers_leaves_no_half_row(store: Store) {
    const WRITERS: u32 = 6;
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (table, done) = (table.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let e = full_entry(w * 1000 + n % 50);
                let snap = table.read_all().await.expect("read_all");
                match snap.get(&e.silo) {
                    None => {
                        let _ = table.insert_row(&e, &snap.version.next()).await.expect("insert");
                    }
                    Some((row, etag)) => {
                        let row = MembershipEntry {
                            update_zone: n,
                            ..row.clone()
                        };
                        let _ = table
                            .update_row(&row, etag, &snap.version.next())
                            .await
                            .expect("update");
                    }
                }
                n += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        table.delete_all().await.expect("delete_cluster");
        table.init(true).await.expect("init");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("writer");
    }
    let all = table.read_all().await.expect("read_all");
    for w in 0..WRITERS {
        for n in 0..50 {
            let s = full_entry(w * 1000 + n).silo;
            let one = table.read_row(&s).await.expect("read_row");
            assert_eq!(
                one.get(&s).is_some(),
                all.get(&s).is_some(),
                "read_row and read_all disagree about {s} after delete_cluster raced writers"
            );
        }
    }
    // The history holds only the cluster's life since the last delete: versions
    // 1..=current (or the newest of them), no event of a deleted life.
    let events = history(&*table).await;
    let versions: Vec<u64> = events.iter().map(|e| e.version).collect();
    let first = versions.first().copied().unwrap_or(1);
    assert_eq!(
        versions,
        (first..=all.version.version).collect::<Vec<_>>(),
        "history after delete_cluster raced writers"
    );
    // Every row is writable again (none is stuck half-deleted).
    let v = all.version.clone();
    let first = all.entries.iter().next().cloned();
    if let Some(r) = first {
        assert!(table
            .update_row(&r.entry, &r.etag, &v.next())
            .await
            .expect("update"));
    }
}

/// Scenario 16: cluster ids that contain separators or glob characters, or are
/// prefixes of each other, are distinct clusters: each reads only its own rows and
/// deleting one leaves the others whole.
pub async fn ids_with_separators_and_prefixes_stay_apart(store: Store) {
    let base = crate::unique_id("ids");
    let suffixes = [
        "", ":", ":b", "*", "?", "[a-z]", "}", "{x}", "/b", "%3A", " ", "\\", "ü",
    ];
    let mut tables = Vec::new();
    for (i, suffix) in suffixes.iter().enumerate() {
        let id = format!("{base}{suffix}");
        let t = store
            .membership_table(&id, ProtocolMode::Extended)
            .unwrap_or_else(|e| panic!("open `{id}`: {e}"));
        t.init(true).await.expect("init");
        for k in 0..=i as u32 {
            insert(&*t, &full_entry(k)).await;
        }
        tables.push(t);
    }
    for (i, t) in tables.iter().enumerate() {
        let snap = t.read_all().await.expect("read_all");
        assert_eq!(
            (snap.len(), snap.version.version),
            (i + 1, i as u64 + 1),
            "cluster `{}` sees only its own rows",
            t.cluster_id()
        );
    }
    tables[0].delete_all().await.expect("delete");
    tables[0].init(true).await.expect("init");
    assert!(tables[0].read_all().await.expect("read_all").is_empty());
    for (i, t) in tables.iter().enumerate().skip(1) {
        assert_eq!(
            t.read_all().await.expect("read_all").len(),
            i + 1,
            "deleting `{}` touched `{}`",
            tables[0].cluster_id(),
            t.cluster_id()
        );
        t.delete_all().await.expect("cleanup");
    }
}

/// Scenario 17: heartbeats racing row updates: every update still commits, and the
/// heartbeat changes neither the etag, the version nor any other column.
pub async fn i_am_alive_races_updates_and_touches_nothing_else(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let e = full_entry(17);
    insert(&*table, &e).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let last_beat = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let beats = {
        let (table, done, s, last_beat) = (table.clone(), done.clone(), e.silo, last_beat.clone());
        tokio::spawn(async move {
            let mut t = 1_800_000_000_000u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                t += 1;
                table
                    .update_i_am_alive(&s, Timestamp::from_millis(t))
                    .await
                    .expect("heartbeat");
                last_beat.store(t, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    while last_beat.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for i in 0..30u32 {
        let (row, etag, v) = row_and_etag(&*table, &e.silo).await;
        let row = MembershipEntry { fault_zone: i, ..row };
        assert!(
            table.update_row(&row, &etag, &v.next()).await.expect("update"),
            "update {i} conflicted with a heartbeat"
        );
        tokio::task::yield_now().await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    beats.await.expect("heartbeats");
    let last = last_beat.load(std::sync::atomic::Ordering::SeqCst);
    let (row, etag, v) = row_and_etag(&*table, &e.silo).await;
    assert_eq!(v.version, 31, "heartbeats never bump the version");
    // update_row writes every column, IAmAlive included (as Orleans' UpdateRow): a
    // beat that lands between a writer's read and its write may be overwritten with
    // the value the writer read. So IAmAlive is the original or one of the beats.
    let alive = row.i_am_alive_time.as_millis();
    assert!(
        alive == e.i_am_alive_time.as_millis() || (1_800_000_000_001..=last).contains(&alive),
        "IAmAlive {alive} was never written"
    );
    let expected = MembershipEntry {
        fault_zone: 29,
        i_am_alive_time: row.i_am_alive_time,
        ..e.clone()
    };
    assert_eq!(row, expected, "the heartbeats changed no other column");
    table
        .update_i_am_alive(&e.silo, Timestamp::from_millis(last + 1))
        .await
        .expect("heartbeat");
    let (_, etag_after, v_after) = row_and_etag(&*table, &e.silo).await;
    assert_eq!((etag_after, v_after), (etag, v), "a heartbeat changes no etag");
}

/// Scenario 18: read_row is atomic: the row and the version come from one instant.
/// A writer stores in each update the version it writes; every read_row must
/// return a row whose stored version equals the version row read with it.
pub async fn read_row_is_atomic(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let mut e = full_entry(18);
    e.update_zone = 1;
    insert(&*table, &e).await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (table, done, s) = (table.clone(), done.clone(), e.silo);
        tokio::spawn(async move {
            let mut writes = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) && writes < 200 {
                let snap = table.read_row(&s).await.expect("read_row");
                let (row, etag) = snap.row(&s).cloned().map(MembershipRow::into_parts).expect("row");
                let next = snap.version.next();
                let row = MembershipEntry {
                    update_zone: next.version as u32,
                    ..row
                };
                assert!(table.update_row(&row, &etag, &next).await.expect("update"));
                writes += 1;
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads == 0 {
        let snap = table.read_row(&e.silo).await.expect("read_row");
        let row = snap.entry(&e.silo).expect("row");
        assert_eq!(
            u64::from(row.update_zone),
            snap.version.version,
            "read_row returned a row and a version from different instants"
        );
        reads += 1;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.expect("writer");
}

/// Scenario 19: init on a populated cluster changes nothing: rows, etags and the
/// version survive, and etags read before it still commit.
pub async fn init_on_a_populated_cluster_changes_nothing(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    insert(&*table, &full_entry(1)).await;
    insert(&*table, &full_entry(2)).await;
    let before = table.read_all().await.expect("read_all");
    table.init(true).await.expect("init again");
    table.init(false).await.expect("init again");
    let again = store
        .membership_table(table.cluster_id(), ProtocolMode::Extended)
        .expect("reopen");
    again.init(true).await.expect("init through another handle");
    assert_eq!(table.read_all().await.expect("read_all"), before);
    let (row, etag) = before
        .row(&full_entry(1).silo)
        .cloned()
        .map(MembershipRow::into_parts)
        .expect("row");
    assert!(table
        .update_row(&row, &etag, &before.version.next())
        .await
        .expect("update"));
}

/// Scenario 20: every malformed version precondition is refused, for inserts and
/// updates alike: the same version, a skipped one, u64::MAX, a wrong, empty or
/// older etag. Each answers false and changes nothing.
pub async fn malformed_version_preconditions_are_refused(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let e1 = full_entry(1);
    let v0 = table.read_all().await.expect("read_all").version;
    insert(&*table, &e1).await;
    let snap = table.read_all().await.expect("read_all");
    let v = snap.version.clone();
    let bad = [
        (
            "same version",
            TableVersion {
                version: v.version,
                etag: v.etag.clone(),
            },
        ),
        (
            "skipped version",
            TableVersion {
                version: v.version + 2,
                etag: v.etag.clone(),
            },
        ),
        (
            "u64::MAX",
            TableVersion {
                version: u64::MAX,
                etag: v.etag.clone(),
            },
        ),
        (
            "wrong etag",
            TableVersion {
                version: v.version + 1,
                etag: Etag::new("not-the-etag"),
            },
        ),
        (
            "empty etag",
            TableVersion {
                version: v.version + 1,
                etag: Etag::default(),
            },
        ),
        (
            "older etag",
            TableVersion {
                version: v.version + 1,
                etag: v0.etag.clone(),
            },
        ),
        ("older version", v0.next()),
    ];
    let (row, etag) = snap
        .row(&e1.silo)
        .cloned()
        .map(MembershipRow::into_parts)
        .expect("row");
    let changed = MembershipEntry {
        update_zone: 77,
        ..row
    };
    for (what, next) in &bad {
        assert!(
            !table.insert_row(&full_entry(2), next).await.expect("insert"),
            "insert with {what} must be refused"
        );
        assert!(
            !table.update_row(&changed, &etag, next).await.expect("update"),
            "update with {what} must be refused"
        );
        assert_eq!(
            table.read_all().await.expect("read_all"),
            snap,
            "{what} changed the table"
        );
    }
    assert!(table
        .update_row(&changed, &etag, &v.next())
        .await
        .expect("update"));
}

/// Scenario 21: read_delta(since) returns the version row and the rows written after
/// `since` (a provider without a native delta may answer a complete read instead);
/// above the table's version it answers a complete read.
pub async fn read_delta_returns_the_rows_written_after_a_version(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    // The version row as a reader saw it after each write: versions[v] is version v.
    let mut versions = vec![table.read_all().await.expect("read_all").version];
    for n in 1..=3 {
        insert(&*table, &full_entry(n)).await;
        versions.push(table.read_all().await.expect("read_all").version);
    }
    let (row, etag, v) = row_and_etag(&*table, &full_entry(1).silo).await;
    let row = MembershipEntry {
        update_zone: 99,
        ..row
    };
    assert!(table.update_row(&row, &etag, &v.next()).await.expect("update"));
    let all = table.read_all().await.expect("read_all");
    assert_eq!(all.version.version, 4);
    versions.push(all.version.clone());
    let check = |since: u64, expected: &[u32], d: rollcall_core::MembershipDelta| {
        assert_eq!(
            d.version, all.version,
            "read_delta({since}) reports the version row"
        );
        if d.complete {
            assert_eq!(
                d.changed, all.entries,
                "a complete read_delta({since}) holds every row"
            );
        } else {
            let silos: Vec<SiloAddress> = d.changed.silos().copied().collect();
            let mut want: Vec<SiloAddress> = expected.iter().map(|n| full_entry(*n).silo).collect();
            want.sort();
            assert_eq!(silos, want, "read_delta({since})");
            for r in d.changed.iter() {
                let s = r.entry.silo;
                assert_eq!(
                    Some(r),
                    all.entries.get(&s),
                    "read_delta({since}) row {s} as read_all has it"
                );
            }
        }
    };
    check(
        0,
        &[1, 2, 3],
        table.read_delta(&versions[0]).await.expect("delta"),
    );
    check(2, &[1, 3], table.read_delta(&versions[2]).await.expect("delta"));
    check(4, &[], table.read_delta(&versions[4]).await.expect("delta"));
    let beyond = TableVersion {
        version: 10,
        etag: Etag::new("from-another-table"),
    };
    let above = table.read_delta(&beyond).await.expect("delta");
    assert!(above.complete, "since above the table's version: a complete read");
    check(10, &[1, 2, 3], above);
}

/// Scenario 22: a reader that keeps its view by delta reads alone, while writers
/// race it, never misses a write: after the writers stop, one more delta makes its
/// view equal to read_all.
pub async fn read_delta_never_misses_a_committed_write(store: Store) {
    const WRITERS: u32 = 4;
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    for w in 0..WRITERS {
        insert(&*table, &full_entry(w)).await;
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (table, done) = (table.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let s = full_entry(w).silo;
            let mut n = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) && n < 60 {
                let snap = table.read_row(&s).await.expect("read_row");
                let (row, etag) = snap.row(&s).cloned().map(MembershipRow::into_parts).expect("row");
                let next = snap.version.next();
                let row = MembershipEntry {
                    update_zone: next.version as u32,
                    ..row
                };
                if table.update_row(&row, &etag, &next).await.expect("update") {
                    n += 1;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut view = table.read_all().await.expect("read_all");
    let mut deltas = 0;
    while tasks.iter().any(|t| !t.is_finished()) || deltas == 0 {
        let d = table.read_delta(&view.version).await.expect("read_delta");
        assert!(d.version.version >= view.version.version, "a delta went back");
        view = d.merged_onto(&view);
        for row in view.rows() {
            assert!(
                u64::from(row.update_zone) <= view.version.version,
                "a row written at {} in a view at version {}",
                row.update_zone,
                view.version.version
            );
        }
        deltas += 1;
        tokio::task::yield_now().await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("writer");
    }
    let d = table.read_delta(&view.version).await.expect("read_delta");
    view = d.merged_onto(&view);
    let all = table.read_all().await.expect("read_all");
    assert_eq!(view.version, all.version);
    assert_eq!(view.entries, all.entries, "the delta-kept view missed a write");
}

/// What the history must hold after `entry` was written at `version` by `origin`.
fn event(
    entry: &MembershipEntry,
    kind: WriteKind,
    version: &TableVersion,
    origin: &WriteOrigin,
) -> MembershipEvent {
    MembershipEvent::of(entry, kind, version, origin)
}

/// Reads the whole history of `table`.
pub async fn history(table: &dyn MembershipTable) -> Vec<MembershipEvent> {
    table
        .read_history(&HistoryQuery::default())
        .await
        .expect("read_history")
}

/// Scenario 23 (membership history): a join, a status change, a vote and a
/// declaration each append exactly their event (version, time, subject, kind,
/// status, votes, writer); writes that lose a precondition append nothing; the
/// query filters by version, silo and count; `delete_cluster` removes the history;
/// basic mode keeps none and says so.
pub async fn history_records_each_committed_write_and_nothing_else(store: Store) {
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    assert!(history(&*table).await.is_empty(), "a new cluster has no history");
    let (voter, declarer) = (silo(901, 1), silo(902, 1));
    let mut expected = Vec::new();

    // A join: the silo inserts its own row.
    let mut row = full_entry(30);
    row.status = SiloStatus::Joining;
    row.suspect_votes.clear();
    let v0 = table.read_all().await.expect("read_all").version;
    let by_self = WriteOrigin::silo(row.silo, Timestamp::from_millis(1_795_000_000_001));
    assert!(table
        .write_row(&row, WriteMode::Insert, &v0.next(), &by_self)
        .await
        .expect("insert"));
    expected.push(event(&row, WriteKind::Insert, &v0.next(), &by_self));

    // Writes that lose their precondition leave no event.
    assert!(!table
        .write_row(&row, WriteMode::Insert, &v0.next().next(), &by_self)
        .await
        .expect("duplicate insert"));
    let (_, etag, v1) = row_and_etag(&*table, &row.silo).await;
    assert!(!table
        .write_row(&row, WriteMode::Update(&Etag::new("stale")), &v1.next(), &by_self)
        .await
        .expect("stale etag"));
    assert!(!table
        .write_row(&row, WriteMode::Update(&etag), &v0.next(), &by_self)
        .await
        .expect("stale version"));
    assert_eq!(history(&*table).await, expected, "conflicts must append nothing");

    // Active, then a vote by another silo, then a declaration by a third.
    row.status = SiloStatus::Active;
    assert!(table
        .write_row(&row, WriteMode::Update(&etag), &v1.next(), &by_self)
        .await
        .expect("active"));
    expected.push(event(&row, WriteKind::Update, &v1.next(), &by_self));
    let (_, etag, v2) = row_and_etag(&*table, &row.silo).await;
    let vote_time = Timestamp::from_millis(1_795_000_010_000);
    row.suspect_votes.push(SuspectVote {
        silo: voter,
        time: vote_time,
    });
    let by_voter = WriteOrigin::silo(voter, vote_time);
    assert!(table
        .write_row(&row, WriteMode::Update(&etag), &v2.next(), &by_voter)
        .await
        .expect("vote"));
    expected.push(event(&row, WriteKind::Update, &v2.next(), &by_voter));
    let (_, etag, v3) = row_and_etag(&*table, &row.silo).await;
    let dead_time = Timestamp::from_millis(1_795_000_011_000);
    row.suspect_votes.push(SuspectVote {
        silo: declarer,
        time: dead_time,
    });
    row.status = SiloStatus::Dead;
    let by_declarer = WriteOrigin::silo(declarer, dead_time);
    assert!(table
        .write_row(&row, WriteMode::Update(&etag), &v3.next(), &by_declarer)
        .await
        .expect("declare dead"));
    expected.push(event(&row, WriteKind::Update, &v3.next(), &by_declarer));

    // Another silo's join, by an anonymous writer (no writer recorded).
    let other = full_entry(31);
    let v4 = table.read_all().await.expect("read_all").version;
    assert!(table.insert_row(&other, &v4.next()).await.expect("insert"));
    let all = history(&*table).await;
    assert_eq!(all.len(), 5);
    assert_eq!(all[..4], expected[..], "each event as written");
    assert_eq!(
        (all[4].version, all[4].silo, all[4].writer, all[4].kind),
        (5, other.silo, None, WriteKind::Insert)
    );
    let versions: Vec<u64> = all.iter().map(|e| e.version).collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);

    // Queries.
    let about = |silo, from_version, limit| HistoryQuery {
        from_version,
        silo,
        limit,
    };
    let of_row = table
        .read_history(&about(Some(row.silo), 0, usize::MAX))
        .await
        .expect("by silo");
    assert_eq!(
        of_row, expected,
        "the silo filter keeps exactly that silo's events"
    );
    let from_3 = table
        .read_history(&about(None, 3, usize::MAX))
        .await
        .expect("from 3");
    assert_eq!(from_3, all[2..], "from_version is inclusive");
    let two = table.read_history(&about(None, 2, 2)).await.expect("limit");
    assert_eq!(two, all[1..3], "the limit keeps the oldest matching events");
    let one_of_row = table
        .read_history(&about(Some(row.silo), 2, 1))
        .await
        .expect("silo and limit");
    assert_eq!(one_of_row, expected[1..2]);
    assert!(table
        .read_history(&about(None, 6, usize::MAX))
        .await
        .expect("past the end")
        .is_empty());

    // delete_cluster takes the history with it.
    table.delete_all().await.expect("delete_cluster");
    table.init(true).await.expect("re-init");
    assert!(
        history(&*table).await.is_empty(),
        "delete_cluster removes the history"
    );

    // Basic mode: writes work, no history, and reading it says why.
    let basic = fresh_table(&store, ProtocolMode::Basic).await;
    insert(&*basic, &full_entry(32)).await;
    match basic.read_history(&HistoryQuery::default()).await {
        Err(Error::Unsupported(why)) => assert!(why.contains("extended"), "{why}"),
        other => panic!("basic mode history: {other:?}"),
    }
}

/// Scenario 24 (membership history): 8 writers race read-modify-writes of their own
/// rows under the shared version row. The history then holds exactly the committed
/// writes: versions 1..=N with no gap, each event naming the writer and the row it
/// committed, and no event of a write that answered `false`.
pub async fn history_of_concurrent_writes_is_exactly_the_commits(store: Store) {
    const WRITERS: u32 = 8;
    const COMMITS_EACH: u32 = 6;
    let table = fresh_table(&store, ProtocolMode::Extended).await;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let table = table.clone();
            tokio::spawn(async move {
                let me = full_entry(40 + w);
                let mut committed = Vec::new();
                let mut attempts = 0u32;
                while committed.len() < COMMITS_EACH as usize {
                    attempts += 1;
                    assert!(attempts < 20_000, "writer {w} starved");
                    let snap = table.read_row(&me.silo).await.expect("read_row");
                    let next = snap.version.next();
                    let origin = WriteOrigin::silo(me.silo, Timestamp::from_millis(u64::from(attempts)));
                    let mut row = me.clone();
                    row.update_zone = attempts;
                    let ok = match snap.get(&me.silo) {
                        None => table.write_row(&row, WriteMode::Insert, &next, &origin).await,
                        Some((_, etag)) => {
                            table
                                .write_row(&row, WriteMode::Update(etag), &next, &origin)
                                .await
                        }
                    }
                    .expect("write");
                    if ok {
                        committed.push((next.version, row.silo, attempts));
                    }
                    tokio::task::yield_now().await;
                }
                committed
            })
        })
        .collect();
    let mut commits = Vec::new();
    for t in tasks {
        commits.extend(t.await.expect("writer"));
    }
    commits.sort();
    let total = u64::from(WRITERS * COMMITS_EACH);
    let events = history(&*table).await;
    let seen: Vec<(u64, SiloAddress, u32)> = events
        .iter()
        .map(|e| {
            assert_eq!(e.writer, Some(e.silo), "event {} names its writer", e.version);
            (e.version, e.silo, e.time.as_millis() as u32)
        })
        .collect();
    assert_eq!(seen, commits, "the history is exactly the committed writes");
    assert_eq!(
        events.iter().map(|e| e.version).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>(),
        "versions without gaps"
    );
    assert_eq!(table.read_all().await.expect("read_all").version.version, total);
}

/// Not a listed scenario (it needs a store opened with a history capacity of 3): after
/// 7 writes the history holds exactly versions 5..=7, and each later write keeps the
/// newest 3.
pub async fn history_keeps_the_newest_events(store_with_capacity_3: Store) {
    let table = fresh_table(&store_with_capacity_3, ProtocolMode::Extended).await;
    for i in 0..7u32 {
        insert(&*table, &full_entry(60 + i)).await;
    }
    let versions = |events: Vec<MembershipEvent>| events.iter().map(|e| e.version).collect::<Vec<_>>();
    assert_eq!(versions(history(&*table).await), [5, 6, 7]);
    insert(&*table, &full_entry(70)).await;
    assert_eq!(versions(history(&*table).await), [6, 7, 8]);
    let one = table
        .read_history(&HistoryQuery {
            from_version: 0,
            silo: Some(full_entry(66).silo),
            limit: 5,
        })
        .await
        .expect("by silo");
    assert_eq!(versions(one), [7]);
}

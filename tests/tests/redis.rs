//! The Redis provider: the whole conformance suite on a real redis-server and on a
//! real 3-master Redis Cluster, plus Redis-specific behaviour.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rollcall_core::{
    Error, Etag, MembershipEntry, MembershipRow, ProtocolMode, SiloStatus, TableVersion, Timestamp,
};
use rollcall_tests::fixtures::{self, Backend};
use rollcall_tests::membership_table::{full_entry, insert, silo};
use rollcall_tests::{unique_id, Store};

async fn store_on(b: &Backend) -> Store {
    rollcall::connect(&b.endpoint)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", b.endpoint))
}

async fn redis() -> Option<(Store, Backend)> {
    let b = fixtures::redis().await?;
    Some((store_on(&b).await, b))
}

async fn redis_cluster() -> Option<(Store, Backend)> {
    let b = fixtures::redis_cluster().await?;
    Some((store_on(&b).await, b))
}

/// The whole suite on one redis-server.
mod standalone {
    rollcall_tests::provider_conformance_tests!(crate::redis);
}

/// The whole suite on a 3-master Redis Cluster.
mod cluster {
    rollcall_tests::provider_conformance_tests!(crate::redis_cluster);
}

/// A new extended-mode table of a fresh cluster on `store`, initialised, holding
/// `full_entry(i)` for each `i` of `rows`; with its cluster id.
async fn table_with(
    store: &Store,
    what: &str,
    rows: &[u32],
) -> (String, Arc<dyn rollcall_core::MembershipTable>) {
    let cluster = unique_id(what);
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    for &i in rows {
        insert(&*table, &full_entry(i)).await;
    }
    (cluster, table)
}

async fn raw(b: &Backend) -> redis::aio::MultiplexedConnection {
    redis::Client::open(b.endpoint.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_never_conflict_with_row_writes() {
    let Some((store, _b)) = redis().await else { return };
    let table = store
        .membership_table(&unique_id("hb"), ProtocolMode::Extended)
        .unwrap();
    table.init(true).await.unwrap();
    for n in 0..10 {
        insert(&*table, &full_entry(n)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut beats = Vec::new();
    for n in 0..10 {
        let (table, stop) = (table.clone(), stop.clone());
        beats.push(tokio::spawn(async move {
            let mut count = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let t = Timestamp::from_millis(1_800_000_000_000 + count);
                table.update_i_am_alive(&full_entry(n).silo, t).await.unwrap();
                count += 1;
            }
            count
        }));
    }
    // One writer, so every conflict would come from a heartbeat.
    for i in 0..50u32 {
        let snap = table.read_all().await.unwrap();
        let (e, etag) = snap
            .row(&full_entry(i % 10).silo)
            .cloned()
            .map(MembershipRow::into_parts)
            .unwrap();
        let e = MembershipEntry { update_zone: i, ..e };
        assert!(
            table.update_row(&e, &etag, &snap.version.next()).await.unwrap(),
            "write {i} conflicted with a heartbeat"
        );
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for b in beats {
        total += b.await.unwrap();
    }
    assert!(
        total >= 50,
        "heartbeats must really have run concurrently ({total})"
    );
    assert_eq!(table.read_all().await.unwrap().version.version, 60);
}

#[tokio::test]
async fn garbage_row_is_reported_as_corrupt_and_every_other_row_still_reads() {
    let Some((store, b)) = redis().await else { return };
    let (bad_id, good_id) = (unique_id("bad"), unique_id("good"));
    let bad = store.membership_table(&bad_id, ProtocolMode::Extended).unwrap();
    let good = store.membership_table(&good_id, ProtocolMode::Extended).unwrap();
    for t in [&bad, &good] {
        t.init(true).await.unwrap();
        insert(&**t, &full_entry(1)).await;
    }
    insert(&*bad, &full_entry(2)).await;
    let key = format!("rollcall:{{m:{bad_id}}}:silo:{}", full_entry(1).silo);
    let mut con = raw(&b).await;
    redis::cmd("SET")
        .arg(&key)
        .arg("{not json")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    // Issue 8, defect 2: the bad row is listed, the good one still reads.
    let all = bad.read_all().await.expect("read_all with a corrupt row");
    assert_eq!(all.corrupt.len(), 1, "{all:?}");
    assert_eq!(all.corrupt[0].key, key);
    assert!(all.corrupt[0].reason.contains("line 1"), "{:?}", all.corrupt[0]);
    assert_eq!(all.len(), 1);
    assert_eq!(all.entry(&full_entry(2).silo), Some(&full_entry(2)));
    assert_eq!(all.version.version, 2);
    let snap = bad
        .read_row(&full_entry(1).silo)
        .await
        .expect("read_row of a corrupt row");
    assert!(snap.is_empty() && snap.corrupt.len() == 1, "{snap:?}");
    // read_row reads only its own row: a healthy neighbour stays readable.
    let other = bad
        .read_row(&full_entry(2).silo)
        .await
        .expect("read_row of a healthy row");
    assert_eq!(other.entry(&full_entry(2).silo), Some(&full_entry(2)));
    assert_eq!(other.version.version, 2);
    // A conditional write on a corrupt row is an error too, never a silent overwrite.
    let v = good.read_all().await.unwrap(); // the other cluster is fine
    assert_eq!(v.len(), 1);
    let r = bad
        .update_row(&full_entry(1), &"x".into(), &v.version.next())
        .await;
    assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
    let raw_value: String = redis::cmd("GET").arg(&key).query_async(&mut con).await.unwrap();
    assert_eq!(raw_value, "{not json", "nothing was overwritten");
}

#[tokio::test]
async fn killed_server_is_a_backend_error_and_the_provider_recovers() {
    let port = fixtures::free_port().unwrap();
    let mut server = match fixtures::start_own_on(fixtures::Kind::Redis, Some(port)).await {
        Ok(s) => s,
        Err(e) if fixtures::backends_required() => panic!("redis-server needed: {e}"),
        Err(e) => return eprintln!("SKIPPING: {e}"),
    };
    let store = rollcall::connect(&format!("{}?timeout_ms=1000", server.endpoint))
        .await
        .unwrap();
    let table = store.membership_table("kill", ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    let snap = table.read_all().await.unwrap();
    assert!(table
        .insert_row(&full_entry(1), &snap.version.next())
        .await
        .unwrap());
    let reminders = store.reminder_table("kill").unwrap();

    server.stop().await;
    let e = silo(2, 1);
    let insert = table
        .insert_row(
            &MembershipEntry::new(e, SiloStatus::Joining, Timestamp::from_millis(1)),
            &snap.version.next().next(),
        )
        .await;
    assert!(
        matches!(insert, Err(Error::Backend { .. })),
        "a dead server must be an error, not Ok(false): {insert:?}"
    );
    assert!(matches!(table.read_all().await, Err(Error::Backend { .. })));
    assert!(matches!(
        table
            .update_i_am_alive(&full_entry(1).silo, Timestamp::from_millis(5))
            .await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(
        reminders.read_rows_in_range(0, 0).await,
        Err(Error::Backend { .. })
    ));

    // Same port, empty server: the provider reconnects by itself.
    let _server = fixtures::start_own_on(fixtures::Kind::Redis, Some(port))
        .await
        .expect("restart redis-server");
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(s) = table.read_all().await {
            assert!(table.insert_row(&full_entry(3), &s.version.next()).await.unwrap());
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "the provider must recover when the server is back");
    assert_eq!(reminders.read_rows_in_range(0, 0).await.unwrap().len(), 0);
}

#[tokio::test]
async fn values_are_json_readable_with_redis_cli() {
    let Some((store, b)) = redis().await else { return };
    let id = unique_id("json");
    let table = store.membership_table(&id, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    let mut con = raw(&b).await;
    let row: String = redis::cmd("GET")
        .arg(format!("rollcall:{{m:{id}}}:silo:{}", full_entry(1).silo))
        .query_async(&mut con)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&row).unwrap();
    assert_eq!(v["status"], "Active");
    assert_eq!(v["host_name"], "host-1.example");
    assert!(v["etag"].as_str().is_some_and(|e| !e.is_empty()));
    let version: String = redis::cmd("GET")
        .arg(format!("rollcall:{{m:{id}}}:version"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&version).unwrap()["version"],
        1
    );
}

/// A redis-server serving TLS only, with a throwaway self-signed certificate.
async fn tls_server() -> Option<(fixtures::OwnServer, std::path::PathBuf, u16)> {
    let dir = std::env::temp_dir().join(unique_id("redis-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = tokio::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .await;
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        if fixtures::backends_required() {
            panic!("openssl is needed for the TLS test: {made:?}");
        }
        eprintln!("SKIPPING TLS test: no openssl");
        return None;
    }
    let port = fixtures::free_port().unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let args: Vec<String> = [
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &path(&dir),
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &path(&cert),
        "--tls-key-file",
        &path(&key),
        "--tls-ca-cert-file",
        &path(&cert),
        "--tls-auth-clients",
        "no",
    ]
    .map(str::to_owned)
    .to_vec();
    let child = fixtures::OwnServer::spawn(
        fixtures::Server::Redis,
        &args,
        &[dir.as_path()],
        &dir.join("redis.log"),
    )
    .await;
    let child = match child {
        Ok(c) => c,
        Err(e) if fixtures::backends_required() => panic!("redis-server needed: {e}"),
        Err(e) => {
            eprintln!("SKIPPING TLS test: {e}");
            return None;
        }
    };
    fixtures::wait_for_port(([127, 0, 0, 1], port).into(), Duration::from_secs(20))
        .await
        .expect("TLS port");
    Some((child, dir, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_rediss_urls_work_and_unverified_servers_are_refused() {
    let Some((_server, dir, port)) = tls_server().await else {
        return;
    };
    // Certificate verification is on by default: a self-signed server is refused
    // with a backend error (no panic, no silent plaintext).
    let verified = rollcall::connect(&format!("rediss://127.0.0.1:{port}?timeout_ms=2000")).await;
    assert!(matches!(verified, Err(Error::Backend { .. })), "{verified:?}");
    let store = rollcall::connect(&format!("rediss://127.0.0.1:{port}/#insecure"))
        .await
        .expect("TLS connect");
    rollcall_tests::membership_table::insert_row_bumps_version(store.clone()).await;
    rollcall_tests::membership_table::concurrent_inserts_have_one_winner(store.clone()).await;
    rollcall_tests::membership_table::snapshots_are_atomic(store.clone()).await;
    rollcall_tests::reminder_table::remove_row_preconditions(store.clone()).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Delta reads are native on Redis (a sorted set of silos scored by the version
/// their row was written at), and fall back to a complete read when that index
/// does not cover every row (rows written before it existed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_reads_are_native_and_fall_back_without_the_change_index() {
    let Some((store, b)) = redis().await else { return };
    let id = unique_id("delta");
    let table = store.membership_table(&id, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    for n in 1..=3 {
        insert(&*table, &full_entry(n)).await;
    }
    // Redis selects rows by version number; the etag is not consulted.
    let at_2 = TableVersion {
        version: 2,
        etag: Etag::new("unused"),
    };
    let d = table.read_delta(&at_2).await.unwrap();
    assert!(!d.complete, "native delta");
    assert_eq!(
        d.changed.silos().copied().collect::<Vec<_>>(),
        vec![full_entry(3).silo]
    );
    let mut con = raw(&b).await;
    redis::cmd("DEL")
        .arg(format!("rollcall:{{m:{id}}}:changes"))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    let d = table.read_delta(&at_2).await.unwrap();
    assert!(d.complete, "without the change index: a complete read");
    assert_eq!(d.changed.len(), 3);
}

/// Issue 9: the Redis write path is `WATCH` + both `GET`s in one pipeline, then
/// `MULTI ... EXEC`: no `UNWATCH` unless a precondition fails client-side, and no
/// `PING` per pool checkout. Counted by the server itself (`INFO commandstats`) on a
/// server of this test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_row_sends_no_unwatch_and_no_ping() {
    let mut server = match fixtures::start_own(fixtures::Kind::Redis).await {
        Ok(s) => s,
        Err(e) if fixtures::backends_required() => panic!("redis-server needed: {e}"),
        Err(e) => return eprintln!("SKIPPED: {e}"),
    };
    let store = store_on(&server).await;
    let table = store
        .membership_table(&unique_id("rtt"), ProtocolMode::Extended)
        .unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    let mut con = raw(&server).await;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    const WRITES: u64 = 50;
    for i in 0..WRITES {
        let snap = table.read_all().await.unwrap();
        let (row, etag) = snap
            .row(&full_entry(1).silo)
            .cloned()
            .map(MembershipRow::into_parts)
            .unwrap();
        let row = MembershipEntry {
            update_zone: i as u32,
            ..row
        };
        assert!(table.update_row(&row, &etag, &snap.version.next()).await.unwrap());
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    let calls = |cmd: &str| -> u64 {
        info.lines()
            .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(calls("watch"), WRITES, "{info}");
    assert_eq!(calls("exec"), WRITES, "{info}");
    assert_eq!(calls("unwatch"), 0, "no UNWATCH on the happy path:\n{info}");
    assert_eq!(calls("ping"), 0, "no PING per pool checkout:\n{info}");
    server.stop().await;
}

/// A Redis Cluster node by `host:port`.
async fn node_con(addr: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A slot half migrated: the keys already on the importing node, the slot map
/// still naming the old owner. The old owner answers `ASK`; every table operation
/// must follow it once with `ASKING` (treating it as `MOVED` would refresh the
/// slot map, which still names the old owner, and fail). Then the migration
/// completes and `MOVED` takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ask_redirections_are_followed_with_asking_during_a_slot_migration() {
    let Some((store, b)) = redis_cluster().await else {
        return;
    };
    let (cluster, t) = table_with(&store, "ask", &[1, 2]).await;
    let (one, two) = (full_entry(1), full_entry(2));
    t.update_i_am_alive(&one.silo, Timestamp::now()).await.unwrap();
    let addrs: Vec<String> = b
        .endpoint
        .trim_start_matches("redis+cluster://")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut cons = Vec::new();
    for a in &addrs {
        cons.push(node_con(a).await);
    }
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(format!("rollcall:{{m:{cluster}}}:version"))
        .query_async(&mut cons[0])
        .await
        .unwrap();
    let mut ids = Vec::new();
    let mut source = None;
    for (i, con) in cons.iter_mut().enumerate() {
        ids.push(
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async::<String>(con)
                .await
                .unwrap(),
        );
        let n: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query_async(con)
            .await
            .unwrap();
        if n > 0 {
            source = Some(i);
        }
    }
    let source = source.expect("a node holds the table's keys");
    let target = (source + 1) % addrs.len();
    let setslot = |state: &'static str, id: String| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(id);
        c
    };
    setslot("IMPORTING", ids[source].clone())
        .query_async::<()>(&mut cons[target])
        .await
        .unwrap();
    setslot("MIGRATING", ids[target].clone())
        .query_async::<()>(&mut cons[source])
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query_async(&mut cons[source])
        .await
        .unwrap();
    assert!(keys.len() >= 4, "version, index, changes, rows, alive: {keys:?}");
    let (host, port) = addrs[target].rsplit_once(':').unwrap();
    redis::cmd("MIGRATE")
        .arg(host)
        .arg(port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys)
        .query_async::<()>(&mut cons[source])
        .await
        .unwrap();

    // Mid-migration: every operation the keys allow goes through ASK.
    let during = async {
        let all = t.read_all().await?;
        let (row, etag) = all
            .row(&one.silo)
            .cloned()
            .map(MembershipRow::into_parts)
            .expect("row one");
        let mut moved = row.clone();
        moved.status = SiloStatus::ShuttingDown;
        let written = t.update_row(&moved, &etag, &all.version.next()).await?;
        t.update_i_am_alive(&two.silo, Timestamp::now()).await?;
        let back = t.read_row(&one.silo).await?;
        let delta = t.read_delta(&all.version).await?;
        Ok::<_, Error>((all.len(), written, back.entry(&one.silo).map(|e| e.status), delta))
    }
    .await;

    // Complete the migration on every master, whatever happened above.
    for i in [target, source]
        .into_iter()
        .chain((0..addrs.len()).filter(|i| *i != source && *i != target))
    {
        setslot("NODE", ids[target].clone())
            .query_async::<()>(&mut cons[i])
            .await
            .unwrap();
    }
    let (rows, written, status, delta) = during.expect("table operations during the migration");
    assert_eq!(rows, 2);
    assert!(written, "the conditional write committed on the importing node");
    assert_eq!(status, Some(SiloStatus::ShuttingDown));
    assert!(delta.changed.contains(&one.silo), "{delta:?}");
    // After it: the slot map is refreshed on MOVED and writes go on.
    let all = t.read_all().await.unwrap();
    assert_eq!(
        all.entry(&one.silo).map(|e| e.status),
        Some(SiloStatus::ShuttingDown)
    );
    insert(&*t, &full_entry(3)).await;
    assert_eq!(t.read_all().await.unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_newest_events_on_a_server_and_a_cluster() {
    for backend in [fixtures::redis().await, fixtures::redis_cluster().await] {
        let Some(b) = backend else { continue };
        let store = rollcall::connect(&format!("{}?history=3", b.endpoint))
            .await
            .expect("connect");
        rollcall_tests::membership_table::history_keeps_the_newest_events(store).await;
    }
}

/// A history member that is not an event's JSON fails the history read with
/// `Error::Corrupt` naming the key and version, and stops nothing else: the table
/// reads and writes on, and the next write's event lands after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_history_event_is_named_and_blocks_nothing_else() {
    let Some(b) = fixtures::redis().await else { return };
    let store = store_on(&b).await;
    let (cluster, table) = table_with(&store, "cluster", &[1]).await;
    let key = format!("rollcall:{{m:{cluster}}}:history");
    let mut con = raw(&b).await;
    let _: () = redis::cmd("ZADD")
        .arg(&key)
        .arg(1)
        .arg("{not an event")
        .query_async(&mut con)
        .await
        .unwrap();
    match table.read_history(&rollcall_core::HistoryQuery::default()).await {
        Err(Error::Corrupt { key: k, .. }) => assert_eq!(k, format!("{key} @ 1")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    insert(&*table, &full_entry(2)).await;
    assert_eq!(table.read_all().await.unwrap().version.version, 2);
}

/// A garbage statistics bucket is `Error::Corrupt` naming the hash and member, for a
/// scan and for an append that would fold into it; the append writes nothing (not
/// even the other points of its batch), and other buckets still scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_statistics_bucket_is_named_and_overwrites_nothing() {
    use rollcall_core::{AggLevel, StatFilter, StatPoint, StatisticsOptions};
    let Some(b) = fixtures::redis().await else { return };
    let store = store_on(&b).await;
    let cluster = unique_id("stats");
    let stats = store
        .statistics_store(&cluster, &StatisticsOptions::default())
        .unwrap();
    let point = |name: &str, t: u64| StatPoint {
        time: Timestamp::from_millis(1_795_000_020_000 + t),
        silo: "s".into(),
        name: name.into(),
        value: 1.0,
        is_delta: false,
    };
    stats.append(&[point("a", 0), point("b", 0)]).await.unwrap();
    let values = format!("rollcall:{{s:{cluster}}}:1:values");
    let mut con = raw(&b).await;
    let members: Vec<String> = redis::cmd("HKEYS")
        .arg(&values)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(members.len(), 2, "one 1-minute bucket per name");
    // The bucket of "a" (interned first: id 1).
    let bad = members
        .iter()
        .find(|m| m.ends_with("0000000100000002"))
        .unwrap()
        .clone();
    let _: () = redis::cmd("HSET")
        .arg(&values)
        .arg(&bad)
        .arg("not a bucket")
        .query_async(&mut con)
        .await
        .unwrap();
    let expect_corrupt = |r: Result<_, Error>| match r {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, format!("{values} {bad}")),
        other => panic!("expected Corrupt, got {other:?}"),
    };
    expect_corrupt(stats.scan(&StatFilter::all(AggLevel::Minute1)).await.map(|_| ()));
    expect_corrupt(stats.append(&[point("b", 1), point("a", 1)]).await.map(|_| ()));
    let raw_points = stats.scan(&StatFilter::all(AggLevel::Raw)).await.unwrap();
    assert_eq!(raw_points.len(), 2, "the refused batch stored nothing");
    let garbage: String = redis::cmd("HGET")
        .arg(&values)
        .arg(&bad)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(garbage, "not a bucket", "nothing overwritten");
    assert_eq!(
        stats
            .scan(&StatFilter::all(AggLevel::Minute10))
            .await
            .unwrap()
            .len(),
        2
    );
}

/// Rows a handle decoded before are reused only while their stored bytes are the
/// same: a heartbeat shows at once, a row overwritten behind the handle's back (with
/// garbage, then with its old bytes) reads as stored each time, and a removed row
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_reuse_decoded_rows_only_while_their_bytes_are_unchanged() {
    let Some(b) = fixtures::redis().await else { return };
    let store = store_on(&b).await;
    let (cluster, table) = table_with(&store, "cluster", &[1, 2]).await;
    let first = table.read_all().await.unwrap();
    assert_eq!(
        table.read_all().await.unwrap(),
        first,
        "an unchanged table reads the same"
    );
    let silo = full_entry(1).silo;
    let beat = Timestamp::from_millis(1_900_000_000_000);
    table.update_i_am_alive(&silo, beat).await.unwrap();
    let second = table.read_all().await.unwrap();
    assert_eq!(second.entry(&silo).unwrap().i_am_alive_time, beat);
    let key = format!("rollcall:{{m:{cluster}}}:silo:{silo}");
    let mut con = raw(&b).await;
    let original: Vec<u8> = redis::cmd("GET").arg(&key).query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("{garbage")
        .query_async(&mut con)
        .await
        .unwrap();
    let third = table.read_all().await.unwrap();
    assert!(
        third.entry(&silo).is_none() && third.corrupt.len() == 1,
        "{third:?}"
    );
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&original)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        table.read_all().await.unwrap(),
        second,
        "the old bytes read as before"
    );
    let _: () = redis::cmd("SREM")
        .arg(format!("rollcall:{{m:{cluster}}}:silos"))
        .arg(silo.to_string())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(table.read_all().await.unwrap().entry(&silo).is_none());
}

/// The handles of one cluster's table that one store opens share the rows decoded
/// before: the second handle's read returns the very rows the first one decoded
/// (a process of many silos parses each row once per change, not once per silo),
/// and each handle still reads what is stored (a heartbeat written through one
/// shows in the other's next read; a row rewritten shows in both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_of_one_cluster_share_their_decoded_rows() {
    let Some(b) = fixtures::redis().await else { return };
    let store = store_on(&b).await;
    let (cluster, first) = table_with(&store, "cluster", &[1, 2]).await;
    let second = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    let silo = full_entry(1).silo;
    let a = first.read_all().await.unwrap();
    let b_read = second.read_all().await.unwrap();
    assert_eq!(a, b_read);
    assert!(
        Arc::ptr_eq(a.entries.get(&silo).unwrap(), b_read.entries.get(&silo).unwrap()),
        "the second handle decoded the row again"
    );
    let beat = Timestamp::from_millis(1_900_000_000_000);
    second.update_i_am_alive(&silo, beat).await.unwrap();
    assert_eq!(
        first
            .read_all()
            .await
            .unwrap()
            .entry(&silo)
            .unwrap()
            .i_am_alive_time,
        beat
    );
    let snap = first.read_all().await.unwrap();
    let (row, etag) = snap.get(&silo).unwrap();
    let mut changed = row.clone();
    changed.status = SiloStatus::Dead;
    assert!(first
        .update_row(&changed, etag, &snap.version.next())
        .await
        .unwrap());
    assert_eq!(
        second.read_all().await.unwrap().status_of(&silo),
        Some(SiloStatus::Dead)
    );
    let other = store
        .membership_table(&unique_id("another"), ProtocolMode::Extended)
        .unwrap();
    assert!(other.read_all().await.unwrap().entries.is_empty());
}

/// A writer process killed between its chunks and its header leaves the state
/// whole, and the sweep removes the orphaned chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_killed_writer_process_leaves_a_whole_state() {
    let Some(b) = fixtures::redis().await else {
        return;
    };
    let store = rollcall::connect(&b.endpoint).await.expect("connect");
    rollcall_tests::state_table::killed_writer_process_leaves_a_whole_state(
        store,
        &b.endpoint,
        env!("CARGO_BIN_EXE_state-writer"),
    )
    .await;
}

/// What only containers make easy: the Redis server is frozen (`docker pause`:
/// its sockets stay open, nothing answers) for three table operation timeouts
/// while three silos probe each other over TCP. Every handle call answers within
/// its bound during the pause, and once it ends no silo is declared Dead.
#[cfg(feature = "docker")]
#[actix_rt::test]
async fn a_paused_redis_container_declares_no_silo_dead_and_every_call_answers_in_its_bound() {
    use rollcall::transport::tcp::TcpTransport;
    use rollcall::{ClusterMembershipOptions, Silo};
    use std::time::Instant;

    let Some(b) = fixtures::container(fixtures::Kind::Redis).await else {
        return;
    };
    let store = store_on(&b).await;
    let options = ClusterMembershipOptions {
        table_operation_timeout: Duration::from_secs(1),
        ..ClusterMembershipOptions::fast()
    };
    let cluster = unique_id("pause");
    let transport = Arc::new(TcpTransport::new());
    let mut silos = Vec::new();
    for _ in 0..3 {
        let silo = Silo::builder(store.clone(), cluster.clone())
            .listen("127.0.0.1:0".parse().unwrap())
            .transport(transport.clone())
            .options(options.clone())
            .start()
            .await
            .expect("silo starts");
        silos.push(silo);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !silos.iter().all(|s| s.snapshot().active().count() == 3) {
        assert!(
            Instant::now() < deadline,
            "the three silos never saw each other Active"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.set_paused(true).await.expect("docker pause");
    let paused_at = Instant::now();
    let pause = options.table_operation_timeout * 3;
    let refresh_bound = options.table_operation_timeout * 2;
    while paused_at.elapsed() < pause {
        for s in &silos {
            let t = Instant::now();
            let snap = s
                .latest_snapshot()
                .await
                .expect("latest_snapshot answers from memory");
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "latest_snapshot waited {:?}",
                t.elapsed()
            );
            assert_eq!(snap.active().count(), 3);
            let t = Instant::now();
            let r = s.refresh().await;
            assert!(
                t.elapsed() <= refresh_bound + Duration::from_millis(200),
                "refresh took {:?} (bound {refresh_bound:?})",
                t.elapsed()
            );
            assert!(r.is_err(), "the store is frozen: {r:?}");
            assert_eq!(s.status(), rollcall::SiloStatus::Active);
        }
    }
    b.set_paused(false).await.expect("docker unpause");
    // After the pause: the table answers again, and every silo reads all three
    // Active (no vote was written, nobody was declared Dead).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = true;
        for s in &silos {
            match s.refresh().await {
                Ok(snap) => {
                    assert!(
                        snap.rows().all(|e| e.status == rollcall::SiloStatus::Active),
                        "a silo left Active: {snap:?}"
                    );
                    all &= snap.active().count() == 3;
                }
                Err(_) => all = false,
            }
        }
        if all {
            break;
        }
        assert!(Instant::now() < deadline, "the table never answered again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &silos {
        let _ = s.shutdown().await;
    }
}

/// 100,000 states of one service spread over the 3 masters of a Redis Cluster:
/// no master holds more than 40% of them (the first layout tagged every key of
/// a service with one hash tag: one slot, one master, 100%). Counted by the
/// header keys of this service on each master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_of_one_service_spread_over_every_master_of_a_cluster() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    const STATES: usize = 100_000;
    const WRITERS: usize = 50;
    let Some((store, b)) = redis_cluster().await else {
        return;
    };
    let service = unique_id("spread");
    let storage = StateStorage::new(store.state_table(&service).unwrap());
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let storage = storage.clone();
        writers.spawn(async move {
            for i in (w..STATES).step_by(WRITERS) {
                let key = StateKey::new(format!("cart/{i}"), "cart").unwrap();
                storage
                    .write(&key, Expected::Absent, Codec::Raw, b"{}", None)
                    .await
                    .unwrap_or_else(|e| panic!("write {key}: {e}"));
            }
        });
    }
    while let Some(r) = writers.join_next().await {
        r.expect("a writer panicked");
    }
    let per_master = count_per_master(&b.endpoint, &format!("*{{r:{service}:*}}:h:*")).await;
    assert_eq!(per_master.iter().sum::<usize>(), STATES, "{per_master:?}");
    let most = *per_master.iter().max().unwrap();
    eprintln!("states per master: {per_master:?}");
    assert!(
        most * 100 <= STATES * 40,
        "one master holds {most} of {STATES} states: {per_master:?}"
    );
}

/// A Redis connection cut after the server answered a state commit: the write
/// learns it landed (it deleted its own chunks before, and the next write
/// conflicted with itself).
#[tokio::test]
async fn state_a_commit_cut_after_it_was_sent_lands_once() {
    let Some((direct, b)) = redis().await else { return };
    let upstream: std::net::SocketAddr = b
        .endpoint
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("redis://host:port");
    let proxy = rollcall_tests::cut::CutProxy::start(upstream, rollcall_tests::cut::Wire::Resp).await;
    let via = rollcall::connect(&format!("redis://{}", proxy.addr()))
        .await
        .expect("connect through the proxy");
    rollcall_tests::state_table::state_a_commit_cut_after_it_was_sent_lands_once(via, direct, &proxy).await;
}

/// A page of index members that are not state keys (written by something
/// else) does not end a listing: it goes on past them (an empty page ended it
/// before, and the states after the garbage were never listed).
#[tokio::test]
async fn a_listing_pages_past_index_members_that_are_not_keys() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    let Some((store, b)) = redis().await else { return };
    let service = unique_id("garbage");
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/zzz", "s").unwrap();
    s.write(&k, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap();
    let mut con = raw(&b).await;
    let index = format!("rollcall:{{g:{service}}}:index");
    for i in 0..10 {
        // Of the kind's range, before the state, and not `<actor>/<name>`.
        let _: () = redis::cmd("ZADD")
            .arg(&index)
            .arg(0)
            .arg(format!("cart%2Fa{i}"))
            .query_async(&mut con)
            .await
            .unwrap();
    }
    assert_eq!(s.list("cart", None, 5).await.unwrap(), [k]);
}

/// A header written before headers carried their `g` field (what the state
/// publishes) is replaced like any other: the commit falls back to its head,
/// and the chunks it published are deleted.
#[tokio::test]
async fn a_header_without_its_published_field_is_replaced_and_its_chunks_deleted() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    let Some((store, b)) = redis().await else { return };
    let service = unique_id("oldhead");
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/1", "s").unwrap();
    let big = vec![7u8; 5 * 1024 * 1024];
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, &big, None)
        .await
        .unwrap();
    assert_eq!(s.table().generations(&k).await.unwrap().len(), 1);
    let mut con = raw(&b).await;
    let headers: Vec<String> = redis::cmd("KEYS")
        .arg(format!("rollcall:{{r:{service}:*}}:h:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(headers.len(), 1, "{headers:?}");
    let removed: i64 = redis::cmd("HDEL")
        .arg(&headers[0])
        .arg("g")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(removed, 1, "the header has its published field");
    s.write(&k, Expected::Etag(e1), Codec::Raw, b"x", None)
        .await
        .unwrap();
    assert_eq!(s.read(&k).await.unwrap().data, b"x");
    assert!(s.table().generations(&k).await.unwrap().is_empty());
}

/// Reminders written by the first layout (every key of a service under
/// `{r:<service>}`) are moved into their shards on first use: each readable
/// with its etag, by actor and by range, and nothing is left in the old keys;
/// a row already in its shard (written later) is not overwritten.
#[tokio::test]
async fn reminders_of_the_first_layout_move_into_their_shards() {
    use rollcall_core::{actor_shard, ReminderEntry, Timestamp, DEFAULT_SHARDS};
    let Some((store, b)) = redis().await else { return };
    let service = unique_id("legacy");
    let mut con = raw(&b).await;
    let base = format!("rollcall:{{r:{service}}}");
    let mut rows = Vec::new();
    for i in 0..25 {
        let mut e = ReminderEntry::new(
            &service,
            format!("cart/{i}"),
            "tick",
            Timestamp::from_millis(1_795_000_000_000),
            None,
        );
        e.etag = rollcall_core::Etag::new(format!("legacy-{i}"));
        let member = format!("cart%2F{i}/tick");
        let _: () = redis::pipe()
            .set(format!("{base}:rem:{member}"), serde_json::to_string(&e).unwrap())
            .ignore()
            .zadd(format!("{base}:ring"), &member, f64::from(e.hash))
            .ignore()
            .query_async(&mut con)
            .await
            .unwrap();
        rows.push(e);
    }
    // Row 0 was written again in its shard after the old layout's copy.
    let newer = {
        let k = actor_shard("cart/0", DEFAULT_SHARDS);
        let mut e = rows[0].clone();
        e.etag = rollcall_core::Etag::new("newer");
        let _: () = redis::pipe()
            .set(
                format!("rollcall:{{r:{service}:{k}}}:rem:cart%2F0/tick"),
                serde_json::to_string(&e).unwrap(),
            )
            .ignore()
            .zadd(
                format!("rollcall:{{r:{service}:{k}}}:ring"),
                "cart%2F0/tick",
                f64::from(e.hash),
            )
            .ignore()
            .query_async(&mut con)
            .await
            .unwrap();
        e
    };
    let table = store.reminder_table(&service).unwrap();
    table.init().await.unwrap();
    let mut all = table.read_rows_in_range(0, 0).await.unwrap();
    all.sort_by(|a, b| a.actor_id.cmp(&b.actor_id));
    let mut want = rows.clone();
    want[0] = newer.clone();
    want.sort_by(|a, b| a.actor_id.cmp(&b.actor_id));
    assert_eq!(all, want);
    assert_eq!(table.read_row("cart/0", "tick").await.unwrap(), Some(newer));
    assert_eq!(table.read_rows_for("cart/7").await.unwrap(), [rows[7].clone()]);
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{base}:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        left,
        [format!("{base}:shards")],
        "only the shard count stays under the service tag"
    );
}

/// 100,000 reminders of one service (`ROLLCALL_SPREAD_REMINDERS` to change
/// it) spread over the 3 masters of a Redis Cluster: no master holds more than
/// 40% of them (the first layout put every reminder of a service in one slot).
/// Counted by the row keys on each master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reminders_of_one_service_spread_over_every_master_of_a_cluster() {
    use rollcall_core::{ReminderEntry, Timestamp};
    let reminders: usize = std::env::var("ROLLCALL_SPREAD_REMINDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    const WRITERS: usize = 50;
    let Some((store, b)) = redis_cluster().await else {
        return;
    };
    let service = unique_id("rspread");
    let table = store.reminder_table(&service).unwrap();
    table.init().await.unwrap();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (table, service) = (table.clone(), service.clone());
        writers.spawn(async move {
            for i in (w..reminders).step_by(WRITERS) {
                let e = ReminderEntry::new(
                    &service,
                    format!("cart/{i}"),
                    "t",
                    Timestamp::from_millis(1),
                    None,
                );
                table
                    .upsert_row(&e)
                    .await
                    .unwrap_or_else(|e| panic!("upsert {i}: {e}"));
            }
        });
    }
    while let Some(r) = writers.join_next().await {
        r.expect("a writer panicked");
    }
    let per_master = count_per_master(&b.endpoint, &format!("*{{r:{service}:*}}:rem:*")).await;
    eprintln!("reminders per master: {per_master:?}");
    assert_eq!(per_master.iter().sum::<usize>(), reminders, "{per_master:?}");
    let most = *per_master.iter().max().unwrap();
    assert!(
        most * 10 <= reminders * 4,
        "one master holds {most} of {reminders} reminders: {per_master:?}"
    );
    assert_eq!(table.read_rows_in_range(0, 0).await.unwrap().len(), reminders);
}

/// The keys matching `pattern` on each master of the cluster at `endpoint`.
async fn count_per_master(endpoint: &str, pattern: &str) -> Vec<usize> {
    let addrs = endpoint.trim_start_matches("redis+cluster://").to_owned();
    let mut per_master = Vec::new();
    for addr in addrs.split(',') {
        let mut con = redis::Client::open(format!("redis://{addr}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut con).await.unwrap();
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            continue;
        }
        let mut cursor = 0u64;
        let mut n = 0usize;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut con)
                .await
                .unwrap();
            n += keys.len();
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        per_master.push(n);
    }
    assert_eq!(per_master.len(), 3, "three masters: {per_master:?}");
    per_master
}

/// On a Redis Cluster a state table places its keys by the service's recorded
/// shard count (here 64, not the default 1,024), so a fenced write of any
/// actor runs in its lease's slot: it lands under the held epoch and is
/// refused after a takeover (issue 59).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_state_writes_follow_a_non_default_shard_count_on_a_cluster() {
    use rollcall_core::lease::{LeaseStatus, ShardLease, ShardLeases};
    use rollcall_core::{actor_shard, Codec, Error, Expected, Fence, SiloAddress, StateKey, StateStorage};
    let Some((store, _b)) = redis_cluster().await else {
        return;
    };
    let service = unique_id("fenced64");
    let leases = ShardLeases::open(store.lease_table(&service).unwrap(), 64)
        .await
        .unwrap();
    let states = StateStorage::new(store.state_table(&service).unwrap());
    for i in 0..20 {
        let key = StateKey::new(format!("cart/{i}"), "state").unwrap();
        let shard = actor_shard(key.actor_id(), 64);
        let mut fences = Vec::new();
        for owner in 1..=2u16 {
            let lease = leases.read(shard).await.unwrap();
            let next = ShardLease {
                epoch: lease.epoch + 1,
                owner: Some(SiloAddress::new(([127, 0, 0, 1], owner).into(), 1)),
                status: LeaseStatus::Owned,
                ..lease
            };
            leases.write(&next).await.unwrap().expect("acquired");
            let fence = Fence {
                service: service.clone(),
                shards: 64,
                shard,
                epoch: next.epoch,
            };
            states
                .fenced(fence.clone())
                .write(&key, Expected::Any, Codec::Raw, b"held", None)
                .await
                .unwrap_or_else(|e| panic!("{key} under its held epoch: {e}"));
            fences.push(fence);
        }
        let e = states
            .fenced(fences[0].clone())
            .write(&key, Expected::Any, Codec::Raw, b"stale", None)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Fenced { .. }), "{key}: {e}");
    }
}

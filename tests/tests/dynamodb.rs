//! The DynamoDB provider: the whole conformance suite on a DynamoDB-compatible
//! server (moto, or DynamoDB Local through testcontainers when Docker answers),
//! and DynamoDB-specific behaviour: the typed item layout, cancelled transactions,
//! items with missing or mistyped attributes, reminders spread over partitions,
//! and a server that goes away and comes back.
#![cfg(feature = "dynamodb")]

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use rollcall_core::{
    hash_in_range, Error, Etag, MembershipEntry, MembershipRow, ProtocolMode, ReminderEntry, TableVersion,
    Timestamp,
};
use rollcall_tests::fixtures::{self, Backend};
use rollcall_tests::membership_table::{full_entry, insert};
use rollcall_tests::{unique_id, Store};

async fn store_at(url: &str) -> Store {
    rollcall::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn dynamodb() -> Option<(Store, Backend)> {
    let b = fixtures::dynamodb().await?;
    Some((store_at(&fixtures::dynamodb_url(&b.endpoint)).await, b))
}

/// The whole suite on DynamoDB (moto).
mod conformance {
    rollcall_tests::provider_conformance_tests!(crate::dynamodb);
}

/// A raw SDK client on the same server, in this process's region.
async fn raw(endpoint: &str) -> aws_sdk_dynamodb::Client {
    fixtures::dynamodb_client(endpoint, fixtures::dynamodb_region()).await
}

type Item = HashMap<String, AttributeValue>;

async fn get_item(client: &aws_sdk_dynamodb::Client, table: &str, key: Item) -> Option<Item> {
    client
        .get_item()
        .table_name(table)
        .consistent_read(true)
        .set_key(Some(key))
        .send()
        .await
        .expect("GetItem")
        .item
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

fn row_key(cluster: &str, sk: &str) -> Item {
    HashMap::from([("ClusterId".into(), s(cluster)), ("SiloIdentity".into(), s(sk))])
}

/// Rows are typed attributes named like Orleans' silo-instance columns, readable
/// in the AWS console; the version row sorts first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_typed_attributes_named_like_orleans_columns() {
    let Some((store, b)) = dynamodb().await else {
        return;
    };
    let cluster = unique_id("layout");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    let e = full_entry(3);
    insert(&*table, &e).await;
    let client = raw(&b.endpoint).await;
    let item = get_item(&client, "rollcall-test", row_key(&cluster, &e.silo.to_string()))
        .await
        .expect("row item");
    assert_eq!(item["Status"], s("Active"));
    assert_eq!(item["Address"], s(&e.silo.endpoint().ip().to_string()));
    assert_eq!(
        item["Port"],
        AttributeValue::N(e.silo.endpoint().port().to_string())
    );
    assert_eq!(
        item["Generation"],
        AttributeValue::N(e.silo.generation().to_string())
    );
    assert_eq!(item["HostName"], s(&e.host_name));
    assert_eq!(item["TableVersion"], AttributeValue::N("1".into()));
    assert_eq!(item["IAmAliveTime"], s(&e.i_am_alive_time.to_string()));
    let AttributeValue::L(voters) = &item["SuspectingSilos"] else {
        panic!("SuspectingSilos is a list: {item:?}")
    };
    assert_eq!(voters.len(), e.suspect_votes.len());
    let version = get_item(&client, "rollcall-test", row_key(&cluster, "#VERSION"))
        .await
        .expect("version item");
    assert_eq!(version["Version"], AttributeValue::N("1".into()));
}

/// A transaction cancelled on one condition writes nothing: neither the row nor
/// the version row changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_transaction_writes_nothing() {
    let Some((store, b)) = dynamodb().await else {
        return;
    };
    let cluster = unique_id("cancel");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    let e = full_entry(1);
    insert(&*table, &e).await;
    let snap = table.read_all().await.unwrap();
    let (row, etag) = snap.row(&e.silo).cloned().map(MembershipRow::into_parts).unwrap();
    let client = raw(&b.endpoint).await;
    let before_row = get_item(&client, "rollcall-test", row_key(&cluster, &e.silo.to_string())).await;
    let before_version = get_item(&client, "rollcall-test", row_key(&cluster, "#VERSION")).await;
    // The row's condition holds, the version's does not.
    let stale_version = TableVersion {
        version: snap.version.version + 1,
        etag: Etag::new("0123456789abcdef"),
    };
    let changed = MembershipEntry {
        update_zone: 42,
        ..row.clone()
    };
    assert!(!table.update_row(&changed, &etag, &stale_version).await.unwrap());
    // The version's condition holds, the row's does not.
    assert!(!table
        .update_row(&changed, &Etag::new("0123456789abcdef"), &snap.version.next())
        .await
        .unwrap());
    // An insert of an existing row at the right version.
    assert!(!table.insert_row(&changed, &snap.version.next()).await.unwrap());
    assert_eq!(
        get_item(&client, "rollcall-test", row_key(&cluster, &e.silo.to_string())).await,
        before_row
    );
    assert_eq!(
        get_item(&client, "rollcall-test", row_key(&cluster, "#VERSION")).await,
        before_version
    );
    assert_eq!(table.read_all().await.unwrap(), snap);
}

/// An item with a missing or mistyped attribute is listed as corrupt (by key and
/// reason), the other rows stay readable, and a write that needs it answers
/// `Error::Corrupt` and overwrites nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_items_are_corrupt_rows_not_failures() {
    let Some((store, b)) = dynamodb().await else {
        return;
    };
    let cluster = unique_id("corrupt");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    let (good, bad, mistyped) = (full_entry(1), full_entry(2), full_entry(3));
    for e in [&good, &bad, &mistyped] {
        insert(&*table, e).await;
    }
    let client = raw(&b.endpoint).await;
    // One row loses its Status, another gets a string Port.
    client
        .update_item()
        .table_name("rollcall-test")
        .set_key(Some(row_key(&cluster, &bad.silo.to_string())))
        .update_expression("REMOVE #s")
        .expression_attribute_names("#s", "Status")
        .send()
        .await
        .unwrap();
    client
        .update_item()
        .table_name("rollcall-test")
        .set_key(Some(row_key(&cluster, &mistyped.silo.to_string())))
        .update_expression("SET Port = :p")
        .expression_attribute_values(":p", s("eleven"))
        .send()
        .await
        .unwrap();
    let snap = table
        .read_all()
        .await
        .expect("a corrupt row never fails read_all");
    assert_eq!(snap.len(), 1);
    assert!(snap.get(&good.silo).is_some());
    let reasons: Vec<(String, String)> = snap
        .corrupt
        .iter()
        .map(|c| (c.key.clone(), c.reason.clone()))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|(k, r)| k.ends_with(&bad.silo.to_string()) && r.contains("Status is missing")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|(k, r)| k.ends_with(&mistyped.silo.to_string()) && r.contains("Port is not a number")),
        "{reasons:?}"
    );
    let before = get_item(&client, "rollcall-test", row_key(&cluster, &bad.silo.to_string())).await;
    match table
        .update_row(&bad, &Etag::new("0123456789abcdef"), &snap.version.next())
        .await
    {
        Err(Error::Corrupt { key, .. }) => assert!(key.ends_with(&bad.silo.to_string()), "{key}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(
        get_item(&client, "rollcall-test", row_key(&cluster, &bad.silo.to_string())).await,
        before
    );
    // A garbage version row fails the read: without it no view is ordered.
    client
        .update_item()
        .table_name("rollcall-test")
        .set_key(Some(row_key(&cluster, "#VERSION")))
        .update_expression("SET Version = :v")
        .expression_attribute_values(":v", s("many"))
        .send()
        .await
        .unwrap();
    assert!(matches!(table.read_all().await, Err(Error::Corrupt { .. })));
    // A reminder item with a mistyped attribute is Corrupt in reads.
    let reminders = store.reminder_table(&unique_id("corrupt-rem")).unwrap();
    reminders.init().await.unwrap();
    let e = ReminderEntry::new(reminders.service_id(), "actor", "r", Timestamp::now(), None);
    reminders.upsert_row(&e).await.unwrap();
    let items = client
        .scan()
        .table_name("rollcall-test-reminders")
        .send()
        .await
        .unwrap();
    let key = items
        .items()
        .iter()
        .find(|i| i.get("ServiceId") == Some(&s(reminders.service_id())))
        .map(|i| {
            HashMap::from([
                ("ShardKey".into(), i["ShardKey"].clone()),
                ("SortKey".into(), i["SortKey"].clone()),
            ])
        })
        .expect("reminder item");
    client
        .update_item()
        .table_name("rollcall-test-reminders")
        .set_key(Some(key))
        .update_expression("SET ActorHash = :h")
        .expression_attribute_values(":h", s("x"))
        .send()
        .await
        .unwrap();
    assert!(matches!(
        reminders.read_row("actor", "r").await,
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        reminders.read_rows_in_range(0, 0).await,
        Err(Error::Corrupt { .. })
    ));
}

/// Reminders spread over the service's partitions, and every range, wrapping or
/// not, returns exactly the reminders whose hash is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reminders_spread_over_partitions_and_ranges_are_exact() {
    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    // The default partitioning (16 per service), not the suite's 4.
    let store = store_at(&format!(
        "dynamodb://rollcall-test?endpoint={}&region={}&create_if_missing=true",
        b.endpoint,
        fixtures::dynamodb_region()
    ))
    .await;
    let table = store.reminder_table(&unique_id("shards")).unwrap();
    table.init().await.unwrap();
    let mut all = Vec::new();
    for i in 0..200 {
        let e = ReminderEntry::new(
            table.service_id(),
            format!("actor-{i}"),
            "tick",
            Timestamp::now(),
            None,
        );
        table.upsert_row(&e).await.unwrap();
        all.push((e.actor_id.clone(), e.hash));
    }
    let client = raw(&b.endpoint).await;
    let mut partitions = BTreeSet::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name("rollcall-test-reminders")
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        for item in page.items() {
            if item.get("ServiceId") == Some(&s(table.service_id())) {
                partitions.insert(format!("{:?}", item["ShardKey"]));
            }
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            break;
        }
    }
    assert!(
        partitions.len() >= 12,
        "200 reminders over 16 partitions landed in {}",
        partitions.len()
    );
    for (begin, end) in [
        (0, 0),
        (0, u32::MAX),
        (u32::MAX, 0),
        (u32::MAX / 3, u32::MAX / 3 * 2),
        (u32::MAX / 3 * 2, u32::MAX / 3),
        (0xf000_0000, 0x1000_0000),
        (0x1234_5678, 0x1234_5678),
    ] {
        let got: BTreeSet<String> = table
            .read_rows_in_range(begin, end)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.actor_id)
            .collect();
        let want: BTreeSet<String> = all
            .iter()
            .filter(|(_, h)| hash_in_range(*h, begin, end))
            .map(|(a, _)| a.clone())
            .collect();
        assert_eq!(got, want, "range ({begin:#x}, {end:#x}]");
    }
}

/// A moto server of this test's own, on a fixed port, that can be stopped and
/// started again.
struct OwnMoto {
    server: Option<fixtures::OwnServer>,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnMoto {
    async fn start(port: u16) -> Result<OwnMoto, String> {
        let dir = std::env::temp_dir().join(unique_id("moto-own"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let args = ["-H", "127.0.0.1", "-p", &port.to_string()].map(str::to_owned);
        let server =
            fixtures::OwnServer::spawn(fixtures::Server::Moto, &args, &[], &dir.join("moto.log")).await?;
        fixtures::wait_for_port(([127, 0, 0, 1], port).into(), Duration::from_secs(30)).await?;
        Ok(OwnMoto {
            server: Some(server),
            port,
            dir,
        })
    }

    async fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.kill().await;
        }
    }
}

impl Drop for OwnMoto {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// With the server gone, calls answer `Error::Backend` within the URL's timeout
/// (no hang); once it is back, the same store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_is_a_backend_error_within_the_timeout_and_recovers() {
    // The shared fixture decides whether DynamoDB tests run at all.
    let Some(_shared) = fixtures::dynamodb().await else {
        return;
    };
    let port = fixtures::free_port().unwrap();
    let mut moto = match OwnMoto::start(port).await {
        Ok(m) => m,
        Err(e) => panic!("a moto_server of the test's own: {e}"),
    };
    let url = format!(
        "dynamodb://rollcall-outage?endpoint=http://127.0.0.1:{}&region=us-east-1&create_if_missing=true&timeout_ms=1500&max_attempts=2",
        moto.port
    );
    let store = store_at(&url).await;
    let table = store.membership_table("outage", ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    moto.stop().await;
    let started = Instant::now();
    match table.read_all().await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("rollcall-outage"), "names the table: {e}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500 + 1000),
        "answered after {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    assert!(matches!(
        table
            .update_i_am_alive(&full_entry(1).silo, Timestamp::now())
            .await,
        Err(Error::Backend { .. })
    ));
    assert!(started.elapsed() < Duration::from_millis(2500));
    // Back (moto keeps its data in memory: the table starts empty again).
    let _moto = OwnMoto::start(port).await.expect("moto restarts");
    // A server just restarted may answer its first calls late (moto loads its
    // DynamoDB models on the first request: over the URL's 1.5 s on a loaded
    // CI machine); the store recovers once it answers, each failure before that
    // a backend error.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match table.init(true).await {
            Ok(()) => break,
            Err(e @ Error::Backend { .. }) if Instant::now() < deadline => {
                eprintln!("init after the restart, again: {e}");
            }
            Err(e) => panic!("init after the restart: {e:?}"),
        }
    }
    insert(&*table, &full_entry(2)).await;
    assert_eq!(table.read_all().await.unwrap().len(), 1);
}

/// A URL without credentials in it, a table that does not exist without
/// `create_if_missing`: clear errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_without_create_is_a_clear_error() {
    let Some((_store, b)) = dynamodb().await else {
        return;
    };
    let store = store_at(&format!(
        "dynamodb://{}?endpoint={}&region=us-east-1",
        unique_id("absent"),
        b.endpoint
    ))
    .await;
    let table = store.membership_table("c", ProtocolMode::Extended).unwrap();
    match table.init(true).await {
        Err(Error::Backend { message, .. }) => {
            assert!(message.contains("does not exist"), "{message}");
            assert!(message.contains("create_if_missing=true"), "{message}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(matches!(
        rollcall::connect("dynamodb://key:secret@table").await,
        Err(Error::InvalidConfig { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_newest_events() {
    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    let store = store_at(&format!("{}&history=3", fixtures::dynamodb_url(&b.endpoint))).await;
    rollcall_tests::membership_table::history_keeps_the_newest_events(store).await;
}

/// History items share the cluster's partition below the rows' sort keys, so row
/// reads never see them; an item whose Event attribute is missing fails the history
/// read with `Error::Corrupt` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_items_stay_out_of_row_reads_and_a_corrupt_one_is_named() {
    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    let store = store_at(&fixtures::dynamodb_url(&b.endpoint)).await;
    let cluster = unique_id("cluster");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    insert(&*table, &full_entry(2)).await;
    let snap = table.read_all().await.unwrap();
    assert_eq!((snap.len(), snap.corrupt.len()), (2, 0), "{snap:?}");
    let delta = table
        .read_delta(&TableVersion {
            version: 1,
            etag: snap.version.etag.clone(),
        })
        .await
        .unwrap();
    assert_eq!((delta.changed.len(), delta.corrupt.len()), (1, 0));
    let client = raw(&b.endpoint).await;
    let sk = format!("~history#{:020}", 2);
    client
        .update_item()
        .table_name("rollcall-test")
        .key("ClusterId", AttributeValue::S(cluster.clone()))
        .key("SiloIdentity", AttributeValue::S(sk.clone()))
        .update_expression("REMOVE #e")
        .expression_attribute_names("#e", "Event")
        .send()
        .await
        .unwrap();
    match table.read_history(&rollcall_core::HistoryQuery::default()).await {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, format!("rollcall-test/{cluster}/{sk}")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Statistics items are typed attributes in hour- and silo-sharded partitions; a
/// bucket with a mistyped attribute is `Error::Corrupt` naming table, partition and
/// sort key, for a scan and for an append that would fold into it, and that append
/// writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_items_are_typed_and_a_corrupt_bucket_is_named() {
    use rollcall_core::{actor_hash, AggLevel, StatFilter, StatPoint, StatisticsOptions};
    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    let store = store_at(&fixtures::dynamodb_url(&b.endpoint)).await;
    let cluster = unique_id("stats");
    let stats = store
        .statistics_store(&cluster, &StatisticsOptions::default())
        .unwrap();
    let t0 = 1_795_000_020_000u64; // 5:40 past hour 1_794_999_600_000
    let point = |t: u64, v: f64| StatPoint {
        time: Timestamp::from_millis(t0 + t),
        silo: "10.0.0.1:11111@1".into(),
        name: "cpu".into(),
        value: v,
        is_delta: false,
    };
    assert_eq!(stats.append(&[point(0, 0.1), point(1, 1e300)]).await.unwrap(), 2);
    let shard = actor_hash("10.0.0.1:11111@1") % 4;
    let pk = format!("01#{:016x}#{shard:02x}#{cluster}", 1_794_999_600_000u64);
    let sk = format!("{:016x}{:08x}{:08x}", 1_795_000_020_000u64, 1, 2);
    let table = "rollcall-test-statistics";
    let key = HashMap::from([("ShardKey".to_string(), s(&pk)), ("SortKey".to_string(), s(&sk))]);
    let client = raw(&b.endpoint).await;
    let item = get_item(&client, table, key.clone())
        .await
        .expect("the 1-minute bucket at its documented key");
    assert_eq!(item.get("Count"), Some(&AttributeValue::N("2".into())));
    assert_eq!(
        item.get("Max"),
        Some(&s("1e300")),
        "exact, beyond DynamoDB numbers"
    );
    assert_eq!(item.get("IsDelta"), Some(&AttributeValue::Bool(false)));
    client
        .update_item()
        .table_name(table)
        .set_key(Some(key))
        .update_expression("SET #c = :c")
        .expression_attribute_names("#c", "Count")
        .expression_attribute_values(":c", s("two"))
        .send()
        .await
        .unwrap();
    let expect_corrupt = |r: Result<(), Error>| match r {
        Err(Error::Corrupt { key, .. }) => assert_eq!(key, format!("{table} {pk} {sk}")),
        other => panic!("expected Corrupt, got {other:?}"),
    };
    expect_corrupt(stats.scan(&StatFilter::all(AggLevel::Minute1)).await.map(|_| ()));
    expect_corrupt(stats.append(&[point(2, 3.0)]).await.map(|_| ()));
    assert_eq!(
        stats.scan(&StatFilter::all(AggLevel::Raw)).await.unwrap().len(),
        2,
        "the refused append stored nothing"
    );
    assert_eq!(
        stats.scan(&StatFilter::all(AggLevel::Minute60)).await.unwrap()[0]
            .aggregate
            .count,
        2
    );
}

/// A state name too long for DynamoDB's sort key is a typed invalid-input error
/// before any request (it was a transient backend error from the server); the
/// longest allowed name is stored, chunks included.
#[tokio::test]
async fn a_state_name_too_long_for_the_sort_key_is_invalid_input() {
    use rollcall::dynamodb::DYNAMODB_KEY_LIMITS;
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    let Some((store, _b)) = dynamodb().await else {
        return;
    };
    let s = StateStorage::new(store.state_table(&unique_id("names")).unwrap());
    let staged = vec![7u8; s.table().limits().txn_bytes + 1];
    let longest = StateKey::new("cart/1", "n".repeat(DYNAMODB_KEY_LIMITS.name)).unwrap();
    s.write(&longest, Expected::Absent, Codec::Raw, &staged, None)
        .await
        .expect("the longest name, staged chunks and all");
    assert!(s.read(&longest).await.unwrap().data == staged);
    let over = StateKey::new("cart/1", "n".repeat(DYNAMODB_KEY_LIMITS.name + 1)).unwrap();
    let err = s
        .write(&over, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert!(!err.is_transient());
}

/// The grain-state table is created with its listing index (listing pages
/// through it instead of scanning the table, chunks and all, on every page) and
/// with TTL on, so DynamoDB removes expired headers and chunks by itself.
#[tokio::test]
async fn the_state_table_has_its_kind_index_and_ttl() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    let Some((store, b)) = dynamodb().await else {
        return;
    };
    let service = unique_id("schema");
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/1", "s").unwrap();
    s.write(&k, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap();
    assert_eq!(s.list("cart", None, 10).await.unwrap(), [k]);
    let client = raw(&b.endpoint).await;
    let tables = client.list_tables().send().await.unwrap();
    let state_table = tables
        .table_names()
        .iter()
        .find(|t| t.ends_with("-state"))
        .expect("a state table")
        .clone();
    let described = client
        .describe_table()
        .table_name(&state_table)
        .send()
        .await
        .unwrap();
    let indexes: Vec<&str> = described
        .table()
        .unwrap()
        .global_secondary_indexes()
        .iter()
        .filter_map(|i| i.index_name())
        .collect();
    assert_eq!(indexes, ["KindIndex"]);
    let ttl = client
        .describe_time_to_live()
        .table_name(&state_table)
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some("Ttl"));
    assert_eq!(
        ttl.time_to_live_status(),
        Some(&aws_sdk_dynamodb::types::TimeToLiveStatus::Enabled)
    );
}

/// Issue 72, item 6 (written first; it failed: the later writer's state
/// read back without its chunks): a fenced write of one small header reads
/// the header it replaces beside its transaction, and the write machine
/// deletes the chunks of the generation that read names. Here that read is
/// held back 3 s (a proxy in front of the server, for one writer's
/// `GetItem`s only) while a second writer replaces the first's header with a
/// large, chunked state. The late read then names the second writer's
/// generation; trusting it deleted that writer's chunks. Now a read is
/// trusted only when it names the etag the write replaced, and the later
/// state reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_header_read_never_deletes_a_later_writers_chunks() {
    use rollcall_core::lease::{LeaseStatus, ShardLease, ShardLeases};
    use rollcall_core::{
        actor_shard, Codec, Expected, Fence, SiloAddress, StateKey, StateStorage, DEFAULT_SHARDS,
    };
    use rollcall_tests::http_delay::TargetDelayProxy;

    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    let upstream: std::net::SocketAddr = b
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("the server's address");
    let proxy = TargetDelayProxy::start(upstream, "GetItem").await;
    let direct = store_at(&fixtures::dynamodb_url(&b.endpoint)).await;
    let slow = store_at(&fixtures::dynamodb_url(&format!("http://{}", proxy.addr()))).await;
    let service = unique_id("late-read");
    let actor = "cart/1";
    let shard = actor_shard(actor, DEFAULT_SHARDS);
    let leases = ShardLeases::open(direct.lease_table(&service).expect("lease table"), DEFAULT_SHARDS)
        .await
        .expect("leases");
    let lease = ShardLease {
        epoch: 1,
        owner: Some(SiloAddress::new(([127, 0, 0, 1], 11111).into(), 1)),
        status: LeaseStatus::Owned,
        ..ShardLease::vacant(shard)
    };
    leases.write(&lease).await.expect("write").expect("acquired");
    let fence = Fence {
        service: service.clone(),
        shards: DEFAULT_SHARDS,
        shard,
        epoch: 1,
    };
    let key = StateKey::new(actor, "cart").expect("key");
    let first = StateStorage::new(slow.state_table(&service).expect("state table")).fenced(fence.clone());
    let second = StateStorage::new(direct.state_table(&service).expect("state table")).fenced(fence);
    let v0 = second
        .write(&key, Expected::Absent, Codec::Json, b"\"v0\"", None)
        .await
        .expect("v0");

    // The first writer's small write; its header reads answer 3 s late.
    proxy.set_delay(Duration::from_secs(3));
    let late = tokio::spawn({
        let (first, key) = (first.clone(), key.clone());
        async move {
            first
                .write(&key, Expected::Etag(v0), Codec::Json, b"\"v1\"", None)
                .await
        }
    });
    // Once it landed, the second writer replaces it with a chunked state.
    let v1 = loop {
        let read = second.read(&key).await.expect("read");
        if read.data == b"\"v1\"" {
            break read.etag.expect("an etag");
        }
        assert!(
            !late.is_finished(),
            "the late write ended first: {:?}",
            late.await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let big: Vec<u8> = (0..900 * 1024u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut json = b"\"".to_vec();
    json.extend_from_slice(&big);
    json.push(b'"');
    second
        .write(&key, Expected::Etag(v1), Codec::Json, &json, None)
        .await
        .expect("the chunked write");
    assert!(
        !late.is_finished(),
        "the late read answered before the chunked write landed"
    );
    late.await
        .expect("the late write's task")
        .expect("the late write");
    assert!(proxy.held() > 0, "the header read was held back");
    let read = second.read(&key).await.expect("the chunked state reads back");
    assert_eq!(read.data.len(), json.len(), "the later state, whole");
    assert!(read.data == json);
}

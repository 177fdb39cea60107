//! Metrics table conformance scenarios (the silo and client metrics tables).

use rollcall_core::{Error, MetricsRole, MetricsRow, MetricsTable, ProtocolMode, SiloStatus, Timestamp};
use std::sync::Arc;

use crate::membership_table::{fresh_table, full_entry, insert};
use crate::{unique_id, Store};

/// Opens and initialises the metrics table of a fresh cluster id.
pub async fn fresh_metrics(store: &Store) -> Arc<dyn MetricsTable> {
    let table = store
        .metrics_table(&unique_id("metrics"))
        .expect("open metrics table");
    table.init().await.expect("init metrics table");
    table
}

/// A row with every column set to a non-default value derived from `n`.
pub fn full_row(role: MetricsRole, n: u32) -> MetricsRow {
    let n64 = u64::from(n);
    MetricsRow {
        address: format!("10.0.0.{}:11111", n % 250 + 1),
        name: format!("silo-{n} ünïcode"),
        host_name: format!("host-{n}.example"),
        cpu_percent: 12.5 + n as f32,
        memory_bytes: 64 << 20 | n64,
        probe_rtt_p50_ms: 0.25 + f64::from(n),
        probe_rtt_p99_ms: 3.5 + f64::from(n),
        suspicions_sent: 1 + n64,
        votes_written: 2 + n64,
        table_reads: 300 + n64,
        table_writes: 40 + n64,
        table_conflicts: 5 + n64,
        reminders_owned: 6 + n64,
        ticks_delivered: 7_000 + n64,
        ticks_late: 8 + n64,
        mailbox_backlog: Some(9 + n64),
        load_shedding: n % 2 == 1,
        gateways: if role == MetricsRole::Client {
            vec![format!("10.0.1.{n}:30000@17"), "[::1]:30001@18".into()]
        } else {
            Vec::new()
        },
        store_connection: Some(rollcall_core::StoreConnection {
            endpoints: format!("10.0.2.{}:2379", n % 250 + 1),
            channels: 2,
            resent: 10 + n64,
            goaways: 11 + n64,
            own_goaways: 12 + n64,
            connection_lost: 13 + n64,
            left_running: 14 + n64,
            still_running: 15 + n64,
            cancelled: 16 + n64,
        }),
        ..MetricsRow::new(
            role,
            format!("10.0.0.{}:11111@{}/odd id", n % 250 + 1, 1_700_000_000_000 + n64),
            Timestamp::from_millis(1_795_000_000_000 + n64),
        )
    }
}

/// Scenario M1: an upsert reads back with every column; a second upsert of the same
/// (role, id) replaces it in place; a silo and a client with the same id are two
/// rows; rows come silos first, each role ordered by id; `remove` says whether
/// there was a row; an invalid id is refused and stores nothing.
pub async fn metrics_upsert_replaces_in_place(store: Store) {
    let table = fresh_metrics(&store).await;
    assert!(table.read_all().await.expect("read_all").rows.is_empty());
    let silo = full_row(MetricsRole::Silo, 1);
    table.upsert(&silo).await.expect("upsert");
    assert_eq!(table.read_all().await.expect("read_all").rows, vec![silo.clone()]);

    let mut newer = silo.clone();
    newer.time = Timestamp::from_millis(silo.time.as_millis() + 30_000);
    newer.table_reads += 100;
    newer.mailbox_backlog = None;
    newer.load_shedding = !silo.load_shedding;
    table.upsert(&newer).await.expect("upsert again");
    let mut client = full_row(MetricsRole::Client, 2);
    client.id = silo.id.clone();
    table.upsert(&client).await.expect("client upsert");
    let other = full_row(MetricsRole::Silo, 0);
    table.upsert(&other).await.expect("upsert other");
    let report = table.read_all().await.expect("read_all");
    assert!(report.corrupt.is_empty(), "{:?}", report.corrupt);
    assert_eq!(
        report.rows,
        vec![other.clone(), newer.clone(), client.clone()],
        "one row per (role, id), replaced in place, silos first and by id"
    );

    assert!(table.remove(MetricsRole::Silo, &silo.id).await.expect("remove"));
    assert!(!table
        .remove(MetricsRole::Silo, &silo.id)
        .await
        .expect("remove again"));
    assert_eq!(
        table.read_all().await.expect("read_all").rows,
        vec![other, client],
        "remove takes only that role's row"
    );

    let mut bad = full_row(MetricsRole::Silo, 3);
    bad.id = String::new();
    match table.upsert(&bad).await {
        Err(Error::InvalidInput { what, .. }) => assert_eq!(what, "metrics.id"),
        other => panic!("empty id: {other:?}"),
    }
    bad.id = "line\nbreak".into();
    assert!(matches!(
        table.upsert(&bad).await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(table.read_all().await.expect("read_all").rows.len(), 2);
    table.clear().await.expect("clear");
    assert!(table.read_all().await.expect("read_all").rows.is_empty());
}

/// Scenario M2: metrics of different clusters never mix, and metrics and membership
/// leave each other alone: upserts and `clear` change no membership row, version or
/// history, and `MembershipTable::delete_all` leaves the metrics.
pub async fn metrics_stay_apart_from_membership_and_other_clusters(store: Store) {
    let membership = fresh_table(&store, ProtocolMode::Extended).await;
    let mut entry = full_entry(1);
    entry.status = SiloStatus::Active;
    insert(&*membership, &entry).await;
    let before = membership.read_all().await.expect("read_all");
    let history_before = crate::membership_table::history(&*membership).await;

    let metrics = store
        .metrics_table(membership.cluster_id())
        .expect("metrics table");
    metrics.init().await.expect("init");
    let other = fresh_metrics(&store).await;
    let row = full_row(MetricsRole::Silo, 4);
    metrics.upsert(&row).await.expect("upsert");
    other
        .upsert(&full_row(MetricsRole::Client, 5))
        .await
        .expect("upsert other cluster");
    assert_eq!(
        metrics.read_all().await.expect("read_all").rows,
        vec![row.clone()]
    );
    assert_eq!(other.read_all().await.expect("read_all").rows.len(), 1);
    assert_eq!(
        membership.read_all().await.expect("read_all"),
        before,
        "metrics do not touch membership rows or the version"
    );
    assert_eq!(
        crate::membership_table::history(&*membership).await,
        history_before
    );

    membership.delete_all().await.expect("delete_cluster");
    assert_eq!(
        metrics.read_all().await.expect("read_all").rows,
        vec![row],
        "delete_cluster deletes membership only"
    );
    metrics.clear().await.expect("clear");
    assert!(metrics.read_all().await.expect("read_all").rows.is_empty());
    assert_eq!(
        other.read_all().await.expect("read_all").rows.len(),
        1,
        "clear is per cluster"
    );
}

/// Scenario M3: 8 processes publish 10 times each, all at once: the table ends with
/// exactly one row per process, each its last publication.
pub async fn metrics_concurrent_publishers_keep_one_row_each(store: Store) {
    let table = fresh_metrics(&store).await;
    let tasks: Vec<_> = (0..8u32)
        .map(|p| {
            let table = table.clone();
            tokio::spawn(async move {
                for round in 1..=10u64 {
                    let mut row = full_row(MetricsRole::Silo, p);
                    row.time = Timestamp::from_millis(round);
                    row.table_writes = round;
                    table.upsert(&row).await.expect("upsert");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("publisher");
    }
    let report = table.read_all().await.expect("read_all");
    assert_eq!(report.rows.len(), 8);
    assert!(
        report
            .rows
            .iter()
            .all(|r| r.table_writes == 10 && r.time.as_millis() == 10),
        "each row is its process's last publication"
    );
}

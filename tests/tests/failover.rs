//! Replicated Redis failing over under rollcall: a Redis Cluster of 3 masters
//! with a replica each, and a primary with a replica behind three sentinels
//! (`rollcall_tests::replicated`). A primary is killed and its replica promoted;
//! every actor state must be readable and writable again within
//! [`FOLLOW_BOUND`] of the promotion, and `wait_replicas` writes that were
//! acknowledged must survive it. The multi-process runs (silos, reminders and a
//! counter workload through two failovers) are in `churn.rs`.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use rollcall::state::{Codec, Expected, StateKey, StateStorage};
use rollcall_tests::replicated::{ReplicatedCluster, Sentinels};
use rollcall_tests::{fixtures, unique_id, Store};

/// How long after a promotion a caller that keeps calling may still fail: the
/// provider reads the topology again on the first failure after it, at most once
/// per 250 ms (`REFRESH_GAP`), and the call after that reaches the new primary.
/// 5 s leaves room for a slow CI machine: a call bounded by its timeout, a
/// refresh that asks a dead seed first.
const FOLLOW_BOUND: Duration = Duration::from_secs(5);

/// States written before the kill: enough that some live on every master.
const STATES: usize = 24;

async fn connect(url: &str) -> Store {
    rollcall::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

fn keys() -> Vec<StateKey> {
    let actor = unique_id("failover");
    (0..STATES)
        .map(|i| StateKey::new(format!("counter/{actor}-{i}"), "count").expect("key"))
        .collect()
}

/// Writes `round` into every state (each under the etag it reads).
async fn write_all(storage: &StateStorage, keys: &[StateKey], round: u8) -> Result<(), String> {
    for key in keys {
        let etag = storage
            .read(key)
            .await
            .map_err(|e| format!("read {key}: {e}"))?
            .etag;
        storage
            .write(
                key,
                Expected::from_etag(etag.as_ref()),
                Codec::Raw,
                &[round],
                None,
            )
            .await
            .map_err(|e| format!("write {key}: {e}"))?;
    }
    Ok(())
}

/// Keeps every state busy (read, write) while `kill` runs (it kills a primary
/// and returns once the replica is promoted), then measures how long after the
/// promotion every state reads and writes again; panics past [`FOLLOW_BOUND`].
async fn states_follow_a_failover(store: Store, kill: impl std::future::Future<Output = Duration>) {
    let storage = StateStorage::new(store.state_table(&unique_id("svc")).expect("state table"));
    let keys = keys();
    write_all(&storage, &keys, 1).await.expect("first writes");
    let busy = {
        let (storage, keys) = (storage.clone(), keys.clone());
        tokio::spawn(async move {
            // Calls during the outage: what left the dead node in the slot map.
            let mut failures = 0u32;
            for round in 2u8..=255 {
                if write_all(&storage, &keys, round).await.is_err() {
                    failures += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failures
        })
    };
    let failover = kill.await;
    let promoted = Instant::now();
    busy.abort();
    let mut round = 2u8;
    loop {
        round = round.wrapping_add(1).max(2);
        let Err(last) = write_all(&storage, &keys, round).await else {
            break;
        };
        assert!(
            promoted.elapsed() < FOLLOW_BOUND,
            "states still failing {FOLLOW_BOUND:?} after the promotion: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let followed = promoted.elapsed();
    for key in &keys {
        let read = storage.read(key).await.expect("read after the failover");
        assert_eq!(read.data, vec![round], "{key}");
    }
    println!(
        "failover took {failover:?}; every state read and written again {followed:?} after the promotion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_states_are_readable_and_writable_after_a_master_fails_over() {
    let mut cluster = match ReplicatedCluster::start().await {
        Ok(c) => c,
        Err(e) if fixtures::backends_required() => panic!("no replicated Redis Cluster: {e}"),
        Err(e) => return eprintln!("SKIPPING: no replicated Redis Cluster: {e}"),
    };
    let store = connect(&cluster.url("")).await;
    let kill = async {
        // Node 0 is the first master (slots 0..=5460).
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.kill(0).await;
        cluster.failed_over(0, 0).await.expect("the replica promoted")
    };
    states_follow_a_failover(store, kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_states_are_readable_and_writable_after_the_primary_fails_over() {
    let mut sentinels = match Sentinels::start().await {
        Ok(s) => s,
        Err(e) if fixtures::backends_required() => panic!("no Redis Sentinel set-up: {e}"),
        Err(e) => return eprintln!("SKIPPING: no Redis Sentinel set-up: {e}"),
    };
    let store = connect(&sentinels.url("")).await;
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let primary = sentinels.primary().await.expect("primary");
        sentinels.kill(primary).await;
        sentinels
            .failed_over(primary)
            .await
            .expect("the replica promoted")
    };
    states_follow_a_failover(store, kill).await;
}

/// What the protocol does with a write a failover lost. Asynchronous
/// replication loses the writes a primary acknowledged and had not yet sent to
/// the replica it is replaced by: the new primary holds the keys as they were
/// a moment before. These tests make that happen on one real Redis, exactly:
/// the keys of a cluster (or service) are copied (`DUMP`), the writes to lose
/// are made, then the copy is put back (`RESTORE ... REPLACE`, the keys made
/// since deleted) and every client connection cut (`CLIENT KILL TYPE normal`),
/// as a failover does.
mod lost_writes {
    use std::sync::Arc;
    use std::time::Duration;

    use rollcall_core::lease::LeaseWrite;
    use rollcall_core::{
        ClusterMembershipOptions, Expected, MembershipTable, OnDeclaredDead, Silo, SiloAddress, SiloHandle,
        SiloStatus, SystemStore,
    };
    use rollcall_tests::fixtures::{self, Backend};
    use rollcall_tests::sim::{all_see_dead, wait_for};
    use rollcall_tests::unique_id;

    type Snapshot = Vec<(Vec<u8>, Vec<u8>)>;

    async fn raw(b: &Backend) -> redis::aio::MultiplexedConnection {
        redis::Client::open(b.endpoint.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Every key matching `pattern`, dumped.
    async fn copy(b: &Backend, pattern: &str) -> Snapshot {
        let mut con = raw(b).await;
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut con)
            .await
            .unwrap();
        let mut out = Vec::new();
        for k in keys {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query_async(&mut con).await.unwrap();
            out.push((k, dump));
        }
        out
    }

    /// The keys matching `pattern` as `copy` found them, and every client
    /// connection cut: what a failover to a replica that lacked the writes since
    /// leaves.
    async fn fail_over_to(b: &Backend, pattern: &str, copy: &Snapshot) {
        let mut con = raw(b).await;
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut con)
            .await
            .unwrap();
        let mut p = redis::pipe();
        p.atomic();
        for k in keys {
            p.del(k).ignore();
        }
        for (k, dump) in copy {
            p.cmd("RESTORE").arg(k).arg(0).arg(dump).arg("REPLACE").ignore();
        }
        let () = p.query_async(&mut con).await.unwrap();
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut con)
            .await
            .unwrap();
    }

    fn options() -> ClusterMembershipOptions {
        ClusterMembershipOptions {
            probe_timeout: Duration::from_millis(400),
            table_refresh_timeout: Duration::from_secs(5),
            i_am_alive_publish_period: Duration::from_secs(2),
            local_health_monitoring_period: Duration::from_secs(1),
            ..Default::default()
        }
    }

    async fn silo(store: &Arc<dyn SystemStore>, cluster: &str) -> SiloHandle {
        Silo::builder(store.clone(), cluster)
            .listen("127.0.0.1:0".parse().unwrap())
            .options(options())
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await
            .expect("a silo joins")
    }

    /// Detection with these options (3 missed probes of 400 ms, two table writes,
    /// a gossip round), plus the reconnection after the cut: 10 s.
    const DETECTION: Duration = Duration::from_secs(10);

    /// A Dead declaration lost: the row of a crashed silo comes back Active.
    /// Its peers probe it again, miss it again and declare it Dead again,
    /// within a detection; nobody else is declared Dead.
    #[actix::test]
    async fn a_lost_dead_declaration_is_declared_again() {
        let Some(b) = fixtures::redis().await else { return };
        let store = rollcall::connect(&b.endpoint).await.expect("connect");
        let cluster = unique_id("lost-dead");
        let pattern = format!("rollcall:{{m:{cluster}}}:*");
        let mut silos = Vec::new();
        for _ in 0..3 {
            silos.push(silo(&store, &cluster).await);
        }
        let all_active = wait_for(Duration::from_secs(30), || {
            silos.iter().all(|s| s.snapshot().active().count() == 3)
        })
        .await;
        assert!(all_active.is_some(), "3 silos Active in every view");
        let before = copy(&b, &pattern).await;
        let victim = silos.pop().unwrap();
        victim.kill();
        assert!(
            wait_for(DETECTION, || all_see_dead(&silos, &victim.address()))
                .await
                .is_some(),
            "the crashed silo declared Dead"
        );
        let failed_over_at = rollcall::Timestamp::now();
        fail_over_to(&b, &pattern, &before).await;
        let table = store
            .membership_table(&cluster, rollcall_core::ProtocolMode::Extended)
            .unwrap();
        let again = until_row(&table, &victim.address(), DETECTION, |s| {
            s == Some(SiloStatus::Dead)
        })
        .await;
        assert!(again.is_some(), "declared Dead again within {DETECTION:?}");
        // Declared *again*: the restored table (history included) ends before
        // the first declaration, so its Dead event now is one written after the
        // failover. (Reading the row Active right after the failover raced the
        // survivors: a row whose IAmAlive is stale is declared on the first
        // read, and CI saw it Dead again before the test's read.)
        let history = table
            .read_history(&rollcall_core::HistoryQuery {
                silo: Some(victim.address()),
                ..Default::default()
            })
            .await
            .expect("history");
        assert!(
            history
                .iter()
                .any(|e| e.status == SiloStatus::Dead && e.time >= failed_over_at),
            "the Dead row after the failover is a new declaration: {history:?}"
        );
        assert!(
            history
                .iter()
                .all(|e| e.status != SiloStatus::Dead || e.time >= failed_over_at),
            "the failover lost the first declaration: {history:?}"
        );
        assert!(
            silos.iter().all(|s| s.status() == SiloStatus::Active),
            "the survivors stay Active"
        );
        println!(
            "a lost Dead declaration was declared again {:?} after the failover",
            again.unwrap()
        );
    }

    /// Reads the table until `silo`'s row satisfies `check`, for at most
    /// `within`; how long it took.
    async fn until_row(
        table: &Arc<dyn MembershipTable>,
        silo: &SiloAddress,
        within: Duration,
        check: impl Fn(Option<SiloStatus>) -> bool,
    ) -> Option<Duration> {
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Ok(snap) = table.read_all().await {
                if check(snap.entry(silo).map(|e| e.status)) {
                    return Some(started.elapsed());
                }
            }
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// A join lost, with its version bumps: the table goes back to a version the
    /// silos have passed and the joiner's row is gone. Every silo takes the
    /// older view (a table that went backwards is logged as an error), the
    /// joiner writes its row again, and nobody is declared Dead.
    #[actix::test]
    async fn a_lost_join_and_version_bumps_are_written_again() {
        let Some(b) = fixtures::redis().await else { return };
        let store = rollcall::connect(&b.endpoint).await.expect("connect");
        let cluster = unique_id("lost-join");
        let pattern = format!("rollcall:{{m:{cluster}}}:*");
        let mut silos = vec![silo(&store, &cluster).await, silo(&store, &cluster).await];
        assert!(wait_for(Duration::from_secs(30), || silos.iter().all(|s| s
            .snapshot()
            .active()
            .count()
            == 2))
        .await
        .is_some());
        let before = copy(&b, &pattern).await;
        let table = store
            .membership_table(&cluster, rollcall_core::ProtocolMode::Extended)
            .unwrap();
        let old_version = table.read_all().await.unwrap().version.version;
        silos.push(silo(&store, &cluster).await);
        let joiner = silos[2].address();
        assert!(wait_for(Duration::from_secs(30), || silos.iter().all(|s| s
            .snapshot()
            .active()
            .count()
            == 3))
        .await
        .is_some());
        let failed_over_at = rollcall::Timestamp::now();
        fail_over_to(&b, &pattern, &before).await;
        let back = until_row(&table, &joiner, DETECTION, |s| s == Some(SiloStatus::Active)).await;
        assert!(
            back.is_some(),
            "the joiner's row Active again within {DETECTION:?}"
        );
        // Lost and written again: the restored table (history included) is
        // from before the join, so every event of the joiner now was written
        // after the failover, from the restored version on. (Reading the
        // table right after the failover and expecting no joiner row raced
        // the joiner, which writes its row again as soon as it reads the
        // table.)
        let history = table
            .read_history(&rollcall_core::HistoryQuery {
                silo: Some(joiner),
                ..Default::default()
            })
            .await
            .expect("history");
        assert!(!history.is_empty(), "the joiner's row was written again");
        assert!(
            history
                .iter()
                .all(|e| e.time >= failed_over_at && e.version > old_version),
            "the failover lost the join and its version bumps: {history:?}"
        );
        let snap = table.read_all().await.unwrap();
        assert!(
            snap.rows().all(|e| e.status != SiloStatus::Dead),
            "nobody declared Dead: {snap:?}"
        );
        assert!(silos.iter().all(|s| s.status() == SiloStatus::Active));
        println!(
            "a lost join was written again {:?} after the failover",
            back.unwrap()
        );
    }

    /// A lease acquire lost: the new holder's row goes back to the previous
    /// holder's release. The store still tells: the new holder's next
    /// compare-and-set on the lease (its release) is a conflict, so it stops
    /// delivering there at once (rule 5 of the shard leases) and the next holder
    /// starts from the previous release's watermark: what the new holder
    /// delivered meanwhile may be delivered again. `wait_replicas` is what keeps
    /// an acknowledged acquire.
    #[tokio::test]
    async fn a_lost_lease_acquire_makes_the_holders_next_write_a_conflict() {
        let Some(b) = fixtures::redis().await else { return };
        let store = rollcall::connect(&b.endpoint).await.expect("connect");
        let service = unique_id("lost-lease");
        let leases = store.lease_table(&service).unwrap();
        let released = match leases
            .write_lease(0, &Expected::Absent, b"released by A, W=100")
            .await
            .unwrap()
        {
            LeaseWrite::Written(etag) => etag,
            other => panic!("{other:?}"),
        };
        let before = copy(&b, &format!("rollcall:*{service}*")).await;
        assert!(!before.is_empty(), "the lease row's key is found");
        let acquired = match leases
            .write_lease(0, &Expected::from_etag(Some(&released)), b"owned by B, epoch 2")
            .await
            .unwrap()
        {
            LeaseWrite::Written(etag) => etag,
            other => panic!("{other:?}"),
        };
        fail_over_to(&b, &format!("rollcall:*{service}*"), &before).await;
        // The first call after the cut may meet a dead connection (nothing sent:
        // the cut came first); asked again until the store answers.
        let mut release = None;
        for _ in 0..50 {
            match leases
                .write_lease(0, &Expected::from_etag(Some(&acquired)), b"released by B, W=200")
                .await
            {
                Ok(w) => {
                    release = Some(w);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let release = release.expect("the store answers after the failover");
        assert_eq!(release, LeaseWrite::Conflict(Some(released.clone())));
        let (row, etag) = leases.read_lease(0).await.unwrap().expect("a row");
        assert_eq!((row.as_slice(), etag), (&b"released by A, W=100"[..], released));
    }
}

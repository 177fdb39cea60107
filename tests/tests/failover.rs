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

//! Issue 73's liveness test across `backlog-silo` processes on one real
//! store: a holder saturated by a mass due time still answers its probes
//! and begins its leave at once.

#![cfg(any(feature = "redis", feature = "etcd"))]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rollcall_core::lease::{LeaseStatus, ShardLeases};
use rollcall_tests::unique_id;

mod backlog;
use backlog::*;

/// Issue 73's liveness test: one holder and one peer on the fast membership
/// profile, 20,000 one-shots of shard 0 due at one instant (written before
/// the silos start), delivered 64 at once to handlers that wait 20 ms
/// (`cpu: false`) or spin 2 ms of CPU on the arbiter the application's
/// actors run on (`cpu: true`, a user's CPU-heavy actor). A quarter in, the
/// holder gets SIGTERM. Asserted: no silo is suspected (no vote in any row,
/// none counted by either silo), the peer's probe round trip p99 stays
/// under 250 ms (the peer prints its counters every 250 ms from a thread
/// of its own), the holder's leave begins (its leave hooks run: the
/// process prints `leaving <ms>`) within 1 s of the SIGTERM, and every
/// one-shot is delivered once. Reported, not bounded: when the store first
/// shows the leave (its row leaves Active, or its lease of shard 0 moves:
/// a release that owes 15,000 one-shots writes them first).
async fn a_mass_due_time_leaves_its_holder_answering(store: &str, cpu: bool) {
    const COUNT: usize = 20_000;
    let cluster = unique_id("liveness");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    let burst = Burst {
        count: COUNT,
        id_bytes: 24,
        due: Duration::from_secs(15),
        spread: Duration::ZERO,
        handler_ms: if cpu { 0 } else { 20 },
        max_deliveries: Some(64),
        stop_after: 0,
        period: None,
        written_before: true,
        store_latency: None,
    };
    write_burst(store, &cluster, &burst).await;
    let env = vec![
        ("BACKLOG_HANDLER_MS", burst.handler_ms.to_string()),
        ("BACKLOG_SPIN_MS", if cpu { "2" } else { "0" }.to_owned()),
        ("BACKLOG_MAX_DELIVERIES", "64".to_owned()),
        ("BACKLOG_PROBE_REPORT", "1".to_owned()),
    ];
    let mut a = start(&cluster, store, &dir, "a", &env, None).await;
    let mut b = start(&cluster, store, &dir, "b", &env, None).await;
    until(
        burst.due + Duration::from_secs(120),
        "a quarter of the burst is delivered",
        || lines(&a.log) + lines(&b.log) >= COUNT / 4,
    )
    .await;
    let (holder, peer) = if lines(&a.log) >= lines(&b.log) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let conn = rollcall::connect(store).await.expect("connect");
    let leases = ShardLeases::open(conn.lease_table(&cluster).expect("lease table"), SHARDS)
        .await
        .expect("leases");
    let members = conn
        .membership_table(
            &cluster,
            rollcall::ClusterMembershipOptions::fast().protocol_mode(),
        )
        .expect("membership table");
    let holder_address = holder.address.clone();
    let signalled = Instant::now();
    let signalled_ms = rollcall::Timestamp::now().as_millis();
    sigterm(holder);
    let stored_in = loop {
        let row_left = members.read_all().await.is_ok_and(|s| {
            s.rows()
                .any(|e| e.silo.to_string() == holder_address && e.status != rollcall::SiloStatus::Active)
        });
        let lease_moved = leases.read(0).await.is_ok_and(|l| {
            l.status == LeaseStatus::Released
                || l.owner.map(|o| o.to_string()) != Some(holder_address.clone())
        });
        if row_left || lease_moved {
            break signalled.elapsed();
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(60),
            "60 s after SIGTERM the store shows no leave of the holder"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let delivered_at_leave = lines(&holder.log);
    let logs = [holder.log.clone(), peer.log.clone()];
    let paths: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    until(Duration::from_secs(180), "every one-shot is delivered", || {
        ticks(&paths).len() >= COUNT
    })
    .await;
    exits(holder, Duration::from_secs(30)).await;
    // Every vote ever written is in the rows still (the peer's row is
    // Active; the holder's was written by its own leave).
    let votes: usize = members
        .read_all()
        .await
        .expect("read the membership table")
        .rows()
        .map(|e| e.suspect_votes.len())
        .sum();
    sigterm(peer);
    exits(peer, Duration::from_secs(30)).await;
    let leaving_ms = holder
        .stdout
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find_map(|l| l.strip_prefix("leaving ").and_then(|ms| ms.parse::<u64>().ok()))
        .expect("the holder's leave began");
    let leave_in = Duration::from_millis(leaving_ms.saturating_sub(signalled_ms));
    // `probes P99_MS FAILED SUSPICIONS VOTES`, every 250 ms.
    let reports: Vec<[f64; 4]> = [&*holder, &*peer]
        .iter()
        .flat_map(|p| {
            p.stdout
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .filter_map(|l| {
                    let f: Vec<f64> = l
                        .strip_prefix("probes ")?
                        .split(' ')
                        .filter_map(|v| v.parse().ok())
                        .collect();
                    <[f64; 4]>::try_from(f).ok()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let peer_p99 = peer
        .stdout
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter_map(|l| l.strip_prefix("probes ")?.split(' ').next()?.parse::<f64>().ok())
        .fold(0.0f64, f64::max);
    let suspicions = reports.iter().map(|r| r[2]).fold(0.0f64, f64::max);
    let counted_votes = reports.iter().map(|r| r[3]).fold(0.0f64, f64::max);
    let all = ticks(&paths);
    let twice = all.values().filter(|by| by.len() > 1).count();
    println!(
        "{COUNT} one-shots, {} handlers: SIGTERM to the leave's start {leave_in:?}, to the \
         store's first sign of it {stored_in:?}, {delivered_at_leave} delivered by \
         then; peer's probe round trip p99 at most {peer_p99} ms; suspicions {suspicions}, \
         votes {counted_votes} counted, {votes} in the rows; {} delivered, {twice} twice",
        if cpu { "2-ms CPU" } else { "20-ms async" },
        all.len()
    );
    assert_eq!(twice, 0, "one-shots delivered twice");
    assert_eq!(all.len(), COUNT, "every one-shot delivered");
    assert_eq!(votes, 0, "votes in the membership rows");
    assert_eq!(
        (suspicions, counted_votes),
        (0.0, 0.0),
        "suspicions and votes counted"
    );
    assert!(
        peer_p99 < 250.0,
        "the peer's probe round trip p99 reached {peer_p99} ms"
    );
    assert!(
        leave_in < Duration::from_secs(1),
        "SIGTERM to the leave's start took {leave_in:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mass_due_time_with_async_handlers_leaves_its_redis_holder_answering() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_mass_due_time_leaves_its_holder_answering(&backend.endpoint, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mass_due_time_with_cpu_handlers_leaves_its_redis_holder_answering() {
        let Some(backend) = rollcall_tests::fixtures::redis().await else {
            return;
        };
        a_mass_due_time_leaves_its_holder_answering(&backend.endpoint, true).await;
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mass_due_time_with_async_handlers_leaves_its_etcd_holder_answering() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_mass_due_time_leaves_its_holder_answering(&url, false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mass_due_time_with_cpu_handlers_leaves_its_etcd_holder_answering() {
        let Some(backend) = rollcall_tests::fixtures::etcd().await else {
            return;
        };
        let url = format!("etcd://{}", backend.endpoint);
        a_mass_due_time_leaves_its_holder_answering(&url, true).await;
    }
}

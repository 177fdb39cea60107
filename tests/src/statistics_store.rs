//! Statistics store conformance scenarios: rollups against a brute-force model,
//! filter scans, retention, idempotent appends, concurrent appends, interning seen
//! through a fresh handle. A store that answers `Unsupported` must say why (etcd:
//! not made for append-heavy data); the scenarios then check only that.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollcall_core::statistics::{bucket_expired, bucket_start, Aggregate};
use rollcall_core::{
    AggLevel, Error, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore, Timestamp,
};

use crate::{unique_id, Store};

/// A fixed time base for the scenarios (2026-11-18, ms since the epoch).
pub const BASE: u64 = 1_795_000_000_000;

/// The statistics store of a fresh cluster id, or `None` when the provider refuses
/// statistics (after checking that it says why).
pub fn fresh_statistics(store: &Store, options: &StatisticsOptions) -> Option<Arc<dyn StatisticsStore>> {
    match store.statistics_store(&unique_id("stats"), options) {
        Ok(s) => Some(s),
        Err(Error::Unsupported(why)) => {
            assert_eq!(store.provider(), "etcd", "only etcd refuses statistics: {why}");
            assert!(why.contains("append-heavy"), "the refusal says why: {why}");
            None
        }
        Err(e) => panic!("statistics_store: {e}"),
    }
}

/// What a store must answer for `filter` after `points` were appended in this order:
/// duplicates of an identity ignored, raw points as appended, buckets folded in
/// append order.
pub fn model(points: &[StatPoint], filter: &StatFilter) -> Vec<StatRecord> {
    let mut seen = BTreeSet::new();
    let mut cells: BTreeMap<(u64, String, String), (Aggregate, bool)> = BTreeMap::new();
    for p in points {
        if !seen.insert((p.time, p.name.clone(), p.silo.clone())) {
            continue;
        }
        let t = bucket_start(filter.level, p.time).as_millis();
        let key = (t, p.name.clone(), p.silo.clone());
        match cells.get_mut(&key) {
            Some((a, d)) if filter.level != AggLevel::Raw => {
                a.add(p.value);
                *d = p.is_delta;
            }
            _ => {
                cells.insert(key, (Aggregate::of(p.value), p.is_delta));
            }
        }
    }
    cells
        .into_iter()
        .filter(|((t, name, silo), _)| filter.matches(Timestamp::from_millis(*t), name, silo))
        .map(|((t, name, silo), (aggregate, is_delta))| StatRecord {
            level: filter.level,
            time: Timestamp::from_millis(t),
            silo,
            name,
            aggregate,
            is_delta,
        })
        .collect()
}

const SILOS: [&str; 3] = ["10.0.0.1:11111@1", "10.0.0.2:11111@1", "client/α β"];
const NAMES: [&str; 3] = ["membership.table_writes", "cpu %", "reminders:ticks_late"];

/// A random point within three hours of [`BASE`]; coarse times collide often
/// (duplicate identities, full buckets).
pub fn random_point(rng: &mut StdRng) -> StatPoint {
    let dt = rng.random_range(0..3 * 3_600_000u64);
    StatPoint {
        time: Timestamp::from_millis(BASE + if rng.random() { dt / 600_000 * 600_000 } else { dt }),
        silo: SILOS[rng.random_range(0..3)].into(),
        name: NAMES[rng.random_range(0..3)].into(),
        value: rng.random_range(-1e6..1e6),
        is_delta: rng.random(),
    }
}

/// A random filter: any level, a time range around the points, maybe some names
/// and silos (one of which may be unknown to the store).
pub fn random_filter(rng: &mut StdRng) -> StatFilter {
    let (a, b) = (
        rng.random_range(0..4 * 3_600_000u64),
        rng.random_range(0..4 * 3_600_000u64),
    );
    let mut pick = |all: &[&str], unknown: &str| -> Option<BTreeSet<String>> {
        rng.random_bool(0.6).then(|| {
            let mut set: BTreeSet<String> = all
                .iter()
                .filter(|_| rng.random())
                .map(|s| s.to_string())
                .collect();
            if rng.random_bool(0.2) {
                set.insert(unknown.into());
            }
            set
        })
    };
    let names = pick(&NAMES, "never.appended");
    let silos = pick(&SILOS, "10.9.9.9:1@1");
    StatFilter {
        level: AggLevel::ALL[rng.random_range(0..4)],
        from: Timestamp::from_millis(BASE + a.min(b)),
        to: Timestamp::from_millis(BASE + a.max(b)),
        names,
        silos,
    }
}

/// Scenario S1: after random batches of random points (with duplicates), every level
/// equals the brute-force aggregation of the raw points, unfiltered and through 12
/// random filters; `append` counts each new identity once.
pub async fn statistics_rollups_equal_a_brute_force_model(store: Store) {
    for seed in [1u64, 2, 3] {
        let Some(stats) = fresh_statistics(&store, &StatisticsOptions::default()) else {
            return;
        };
        check_rollups(stats.as_ref(), seed).await;
    }
}

/// The body of S1 on an empty store, for stores that are not a `SystemStore`'s.
pub async fn check_rollups(stats: &dyn StatisticsStore, seed: u64) {
    {
        // One block, so that the body reads as it did inside S1's loop.
        let mut rng = StdRng::seed_from_u64(seed);
        let points: Vec<StatPoint> = (0..150).map(|_| random_point(&mut rng)).collect();
        let mut new = 0;
        let mut rest = &points[..];
        while !rest.is_empty() {
            let n = rng.random_range(1..=rest.len().min(40));
            new += stats.append(&rest[..n]).await.expect("append");
            rest = &rest[n..];
        }
        let distinct: BTreeSet<_> = points.iter().map(|p| (p.time, &p.name, &p.silo)).collect();
        assert_eq!(new, distinct.len(), "seed {seed}: new points counted once");
        for level in AggLevel::ALL {
            let all = StatFilter::all(level);
            assert_eq!(
                stats.scan(&all).await.expect("scan"),
                model(&points, &all),
                "seed {seed} {level:?}"
            );
        }
        for _ in 0..12 {
            let filter = random_filter(&mut rng);
            assert_eq!(
                stats.scan(&filter).await.expect("scan"),
                model(&points, &filter),
                "seed {seed} {filter:?}"
            );
        }
    }
}

/// Scenario S2: `expire(now)` removes exactly the raw points older than
/// `now - retention` and the buckets that ended by then, says how many, and a
/// second call finds nothing.
pub async fn statistics_retention_removes_exactly_what_is_older(store: Store) {
    let options = StatisticsOptions {
        retention_hours: 1,
        ..StatisticsOptions::default()
    };
    let Some(stats) = fresh_statistics(&store, &options) else {
        return;
    };
    check_retention(stats.as_ref()).await;
}

/// The body of S2 on an empty store opened with a retention of 1 hour.
pub async fn check_retention(stats: &dyn StatisticsStore) {
    let points: Vec<StatPoint> = (0..240u64)
        .map(|i| StatPoint {
            time: Timestamp::from_millis(BASE + i * 45_000), // 3 hours, every 45 s
            silo: format!("s{}", i % 3),
            name: "n".into(),
            value: i as f64,
            is_delta: false,
        })
        .collect();
    let now = Timestamp::from_millis(BASE + 2 * 3_600_000 + 17_000);
    let cutoff = now.saturating_sub(Duration::from_secs(3600));
    stats.append(&points).await.expect("append");
    let mut expected_removed = 0;
    let mut expected = BTreeMap::new();
    for level in AggLevel::ALL {
        let before = stats.scan(&StatFilter::all(level)).await.expect("scan");
        let keep: Vec<StatRecord> = before
            .iter()
            .filter(|r| match level {
                AggLevel::Raw => r.time >= cutoff,
                _ => !bucket_expired(level, r.time, cutoff),
            })
            .cloned()
            .collect();
        expected_removed += before.len() - keep.len();
        expected.insert(level, keep);
    }
    assert!(
        expected_removed > 100,
        "the scenario expires something at every level"
    );
    assert_eq!(stats.expire(now).await.expect("expire"), expected_removed);
    for level in AggLevel::ALL {
        assert_eq!(
            stats.scan(&StatFilter::all(level)).await.expect("scan"),
            expected[&level],
            "{level:?}"
        );
    }
    assert_eq!(
        stats.expire(now).await.expect("again"),
        0,
        "nothing left to expire"
    );
}

/// Scenario S3: an invalid point fails its whole batch with a typed error naming
/// the field and stores nothing; appending the same point again stores nothing and
/// counts nothing twice; clusters are isolated; an empty append is a no-op.
pub async fn statistics_invalid_points_store_nothing_and_retries_add_nothing(store: Store) {
    let Some(stats) = fresh_statistics(&store, &StatisticsOptions::default()) else {
        return;
    };
    check_invalid_points_and_retries(stats.as_ref()).await;
    let other = fresh_statistics(&store, &StatisticsOptions::default()).expect("a second cluster");
    assert!(
        other
            .scan(&StatFilter::all(AggLevel::Raw))
            .await
            .expect("scan")
            .is_empty(),
        "clusters are isolated"
    );
    let invalid = StatisticsOptions {
        retention_hours: 0,
        ..StatisticsOptions::default()
    };
    assert!(
        matches!(
            store.statistics_store(other.cluster_id(), &invalid),
            Err(Error::InvalidConfig { .. })
        ),
        "invalid options are refused"
    );
}

/// The body of S3 (but for cluster isolation) on an empty store.
pub async fn check_invalid_points_and_retries(stats: &dyn StatisticsStore) {
    let good = StatPoint {
        time: Timestamp::from_millis(BASE),
        silo: "s".into(),
        name: "n".into(),
        value: 1.5,
        is_delta: false,
    };
    for (field, bad) in [
        (
            "statistics.value",
            StatPoint {
                value: f64::INFINITY,
                ..good.clone()
            },
        ),
        (
            "statistics.name",
            StatPoint {
                name: String::new(),
                ..good.clone()
            },
        ),
        (
            "statistics.silo",
            StatPoint {
                silo: "a\nb".into(),
                ..good.clone()
            },
        ),
    ] {
        match stats.append(&[good.clone(), bad]).await {
            Err(Error::InvalidInput { what, .. }) => assert_eq!(what, field),
            other => panic!("an invalid {field} was accepted: {other:?}"),
        }
    }
    for level in AggLevel::ALL {
        assert!(
            stats
                .scan(&StatFilter::all(level))
                .await
                .expect("scan")
                .is_empty(),
            "{level:?}"
        );
    }
    assert_eq!(stats.append(&[]).await.expect("empty append"), 0);
    assert_eq!(
        stats.append(std::slice::from_ref(&good)).await.expect("append"),
        1
    );
    assert_eq!(
        stats.append(std::slice::from_ref(&good)).await.expect("retry"),
        0,
        "a retry adds nothing"
    );
    let m60 = stats
        .scan(&StatFilter::all(AggLevel::Minute60))
        .await
        .expect("scan");
    assert_eq!(m60.len(), 1);
    assert_eq!(
        m60[0].aggregate,
        Aggregate::of(1.5),
        "the retry did not count twice"
    );
    let empty_range = StatFilter {
        from: Timestamp::from_millis(BASE + 1),
        to: Timestamp::from_millis(BASE + 1),
        ..StatFilter::all(AggLevel::Raw)
    };
    assert!(stats.scan(&empty_range).await.expect("scan").is_empty());
}

/// Scenario S4: 3 writers append 8 points each at once, all into the same buckets
/// (one name and silo, distinct times within one minute): every bucket holds all
/// 24, with the exact sum, min and max. (A silo's own series takes appends from that
/// silo only; this is the worst case of a stores' read-fold-write.)
pub async fn statistics_concurrent_appends_fold_every_point(store: Store) {
    let cluster = unique_id("stats");
    let options = StatisticsOptions::default();
    let stats = match store.statistics_store(&cluster, &options) {
        Ok(s) => s,
        Err(Error::Unsupported(_)) if store.provider() == "etcd" => return,
        Err(e) => panic!("statistics_store: {e}"),
    };
    let mut tasks = Vec::new();
    for w in 0..3u64 {
        // Each writer through its own handle, as separate silos would.
        let mine = store.statistics_store(&cluster, &options).expect("handle");
        tasks.push(tokio::spawn(async move {
            for i in 0..8u64 {
                let p = StatPoint {
                    time: Timestamp::from_millis(BASE + w * 8 + i),
                    silo: "shared-silo".into(),
                    name: "shared-name".into(),
                    value: (w * 8 + i) as f64,
                    is_delta: true,
                };
                assert_eq!(mine.append(&[p]).await.expect("append"), 1);
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let expected = Aggregate {
        count: 24,
        sum: (0..24).sum::<u64>() as f64,
        min: 0.0,
        max: 23.0,
    };
    for level in AggLevel::BUCKETS {
        let got = stats.scan(&StatFilter::all(level)).await.expect("scan");
        assert_eq!(got.len(), 1, "{level:?}");
        assert_eq!(got[0].aggregate, expected, "{level:?}");
    }
    assert_eq!(
        stats
            .scan(&StatFilter::all(AggLevel::Raw))
            .await
            .expect("scan")
            .len(),
        24
    );
}

/// Scenario S5: 40 names written through one handle read back by name through a
/// fresh handle with a cache of 16 strings (every miss goes to the store), and a
/// name filter through the fresh handle finds exactly its points.
pub async fn statistics_names_read_back_through_a_fresh_handle(store: Store) {
    let cluster = unique_id("stats");
    let small = StatisticsOptions {
        metadata_string_cache_capacity: 16,
        ..StatisticsOptions::default()
    };
    let first = match store.statistics_store(&cluster, &small) {
        Ok(s) => s,
        Err(Error::Unsupported(_)) if store.provider() == "etcd" => return,
        Err(e) => panic!("statistics_store: {e}"),
    };
    let points: Vec<StatPoint> = (0..40u64)
        .map(|i| StatPoint {
            time: Timestamp::from_millis(BASE + i * 1000),
            silo: format!("silo-{}", i % 2),
            name: format!("name-{i:02} ü"),
            value: i as f64,
            is_delta: i % 3 == 0,
        })
        .collect();
    assert_eq!(first.append(&points).await.expect("append"), 40);
    let fresh = store.statistics_store(&cluster, &small).expect("fresh handle");
    let raw = fresh.scan(&StatFilter::all(AggLevel::Raw)).await.expect("scan");
    assert_eq!(raw, model(&points, &StatFilter::all(AggLevel::Raw)));
    let filter = StatFilter {
        names: Some(["name-07 ü".to_string(), "name-31 ü".to_string()].into()),
        silos: Some(["silo-1".to_string()].into()),
        ..StatFilter::all(AggLevel::Minute1)
    };
    let got = fresh.scan(&filter).await.expect("scan");
    assert_eq!(got, model(&points, &filter));
    assert_eq!(got.len(), 2);
}

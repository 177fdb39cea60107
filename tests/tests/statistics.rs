//! The statistics store: rollups, retention, interning and filter scans, on the
//! memory store and on the embedded (redb) store, against a brute-force model.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rollcall_membership_core::statistics::{bucket_expired, bucket_start, Aggregate};
use rollcall_membership_core::{
    AggLevel, Error, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore, SystemStore,
    Timestamp,
};
use rollcall_provider_memory::{MemoryStatistics, MemoryStore};
use rollcall_statistics_embedded::EmbeddedStatistics;

const BASE: u64 = 1_795_000_000_000;

/// Both implementations, fresh: (name, store, the temp dir that holds the file).
fn stores(options: &StatisticsOptions) -> Vec<(&'static str, Arc<dyn StatisticsStore>, tempfile::TempDir)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let embedded =
        EmbeddedStatistics::open(dir.path().join("stats.redb"), "c", options.clone()).expect("open");
    vec![
        (
            "memory",
            Arc::new(MemoryStatistics::new("c", options.clone())) as Arc<dyn StatisticsStore>,
            tempfile::tempdir().expect("temp dir"),
        ),
        ("embedded", Arc::new(embedded), dir),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// What a store must answer for `filter` after `points` were appended in this order:
/// duplicates of an identity ignored, raw points as appended, buckets folded in
/// append order.
fn model(points: &[StatPoint], filter: &StatFilter) -> Vec<StatRecord> {
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

fn point_strategy() -> impl Strategy<Value = StatPoint> {
    (
        0u64..3 * 3_600_000,
        0usize..3,
        0usize..3,
        -1e6f64..1e6,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(dt, name, silo, value, is_delta, coarse)| StatPoint {
            // Coarse times collide often (duplicate identities, full buckets).
            time: Timestamp::from_millis(BASE + if coarse { dt / 600_000 * 600_000 } else { dt }),
            silo: ["10.0.0.1:11111@1", "10.0.0.2:11111@1", "client/α"][silo].into(),
            name: ["membership.table_writes", "cpu", "reminders.ticks_late"][name].into(),
            value,
            is_delta,
        })
}

fn filter_strategy() -> impl Strategy<Value = StatFilter> {
    (
        prop::sample::select(AggLevel::ALL.to_vec()),
        0u64..4 * 3_600_000,
        0u64..4 * 3_600_000,
        prop::option::of(prop::sample::subsequence(
            vec!["membership.table_writes", "cpu"],
            0..=2,
        )),
        prop::option::of(prop::sample::subsequence(
            vec!["10.0.0.1:11111@1", "client/α"],
            0..=2,
        )),
    )
        .prop_map(|(level, a, b, names, silos)| StatFilter {
            level,
            from: Timestamp::from_millis(BASE + a.min(b)),
            to: Timestamp::from_millis(BASE + a.max(b)),
            names: names.map(|n| n.into_iter().map(String::from).collect()),
            silos: silos.map(|s| s.into_iter().map(String::from).collect()),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every level of every store equals the brute-force aggregation of the raw
    /// points (appended in random batches, with duplicates), unfiltered and through
    /// a random filter (names, silos, time range).
    #[test]
    fn rollups_and_filter_scans_equal_a_brute_force_model(
        points in prop::collection::vec(point_strategy(), 0..80),
        batch in 1usize..20,
        filter in filter_strategy(),
    ) {
        runtime().block_on(async {
            for (what, store, _dir) in stores(&StatisticsOptions::default()) {
                let mut new = 0;
                for chunk in points.chunks(batch) {
                    new += store.append(chunk).await.expect("append");
                }
                let distinct: BTreeSet<_> = points.iter().map(|p| (p.time, &p.name, &p.silo)).collect();
                assert_eq!(new, distinct.len(), "{what}: new points counted once");
                for level in AggLevel::ALL {
                    let all = StatFilter::all(level);
                    assert_eq!(store.scan(&all).await.expect("scan"), model(&points, &all), "{what} {level:?}");
                }
                assert_eq!(store.scan(&filter).await.expect("scan"), model(&points, &filter), "{what} {filter:?}");
            }
        });
    }
}

/// `expire(now)` removes exactly the raw points older than `now - retention` and
/// the buckets that ended by then, and says how many.
#[test]
fn retention_removes_exactly_what_is_older() {
    runtime().block_on(async {
        let options = StatisticsOptions {
            retention_hours: 1,
            ..StatisticsOptions::default()
        };
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
        for (what, store, _dir) in stores(&options) {
            store.append(&points).await.expect("append");
            let mut before = BTreeMap::new();
            for level in AggLevel::ALL {
                before.insert(level, store.scan(&StatFilter::all(level)).await.expect("scan"));
            }
            let removed = store.expire(now).await.expect("expire");
            let mut expected_removed = 0;
            for level in AggLevel::ALL {
                let keep = |r: &StatRecord| match level {
                    AggLevel::Raw => r.time >= cutoff,
                    _ => !bucket_expired(level, r.time, cutoff),
                };
                let expected: Vec<StatRecord> = before[&level].iter().filter(|r| keep(r)).cloned().collect();
                expected_removed += before[&level].len() - expected.len();
                assert_eq!(
                    store.scan(&StatFilter::all(level)).await.expect("scan"),
                    expected,
                    "{what} {level:?}"
                );
            }
            assert!(expected_removed > 0 && before[&AggLevel::Raw].len() > expected_removed / 2);
            assert_eq!(removed, expected_removed, "{what}");
            assert_eq!(
                store.expire(now).await.expect("again"),
                0,
                "{what}: nothing left to expire"
            );
        }
    });
}

/// The embedded store keeps its interned strings across a restart: a reopened file
/// scans with the same names, interns nothing twice, and with a cache of 16 strings
/// and 40 names answers from the file what the cache lost.
#[test]
fn interning_survives_a_restart_of_the_embedded_store() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("stats.redb");
        let options = StatisticsOptions {
            metadata_string_cache_capacity: 16,
            ..StatisticsOptions::default()
        };
        let point = |i: u64, name: String| StatPoint {
            time: Timestamp::from_millis(BASE + i),
            silo: format!("silo-{}", i % 2),
            name,
            value: i as f64,
            is_delta: true,
        };
        let first: Vec<StatPoint> = (0..40).map(|i| point(i, format!("name-{i}"))).collect();
        {
            let store = EmbeddedStatistics::open(&path, "cluster-a", options.clone()).expect("open");
            assert_eq!(store.append(&first).await.expect("append"), 40);
            // The cluster, 40 names and 2 silos.
            assert_eq!(store.interned_strings().expect("count"), 43);
        }
        let store = EmbeddedStatistics::open(&path, "cluster-a", options.clone()).expect("reopen");
        let raw = store.scan(&StatFilter::all(AggLevel::Raw)).await.expect("scan");
        assert_eq!(raw.len(), 40);
        assert!(raw
            .iter()
            .zip(&first)
            .all(|(r, p)| r.name == p.name && r.silo == p.silo && r.is_delta));
        let again: Vec<StatPoint> = (40..80).map(|i| point(i, format!("name-{}", i - 40))).collect();
        store.append(&again).await.expect("append again");
        assert_eq!(
            store.interned_strings().expect("count"),
            43,
            "known strings keep their ids"
        );
        store
            .append(&[point(99, "new-name".into())])
            .await
            .expect("append new");
        assert_eq!(store.interned_strings().expect("count"), 44);
        assert_eq!(
            store
                .scan(&StatFilter::all(AggLevel::Raw))
                .await
                .expect("scan")
                .len(),
            81
        );
        // Another cluster in the same file sees none of it.
        drop(store);
        let other = EmbeddedStatistics::open(&path, "cluster-b", options).expect("open b");
        assert!(other
            .scan(&StatFilter::all(AggLevel::Minute60))
            .await
            .expect("scan")
            .is_empty());
    });
}

/// An invalid point fails the whole batch with a typed error and stores nothing;
/// appending the same points again stores nothing new; etcd-free stores hand out
/// statistics through `SystemStore::statistics_store`.
#[test]
fn invalid_points_are_refused_and_appends_are_idempotent() {
    runtime().block_on(async {
        let good = StatPoint {
            time: Timestamp::from_millis(BASE),
            silo: "s".into(),
            name: "n".into(),
            value: 1.0,
            is_delta: false,
        };
        for (what, store, _dir) in stores(&StatisticsOptions::default()) {
            for (field, bad) in [
                (
                    "statistics.value",
                    StatPoint {
                        value: f64::NAN,
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
                match store.append(&[good.clone(), bad]).await {
                    Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field, "{what}"),
                    other => panic!("{what}: {other:?}"),
                }
            }
            assert!(
                store
                    .scan(&StatFilter::all(AggLevel::Raw))
                    .await
                    .expect("scan")
                    .is_empty(),
                "{what}"
            );
            assert_eq!(
                store.append(std::slice::from_ref(&good)).await.expect("append"),
                1
            );
            assert_eq!(
                store.append(std::slice::from_ref(&good)).await.expect("append"),
                0,
                "{what}: a retry adds nothing"
            );
            let m1 = store
                .scan(&StatFilter::all(AggLevel::Minute1))
                .await
                .expect("scan");
            assert_eq!(m1.len(), 1);
            assert_eq!(m1[0].aggregate.count, 1, "{what}: the retry did not count twice");
        }
        let memory = MemoryStore::new();
        let a = memory
            .statistics_store("c", &StatisticsOptions::default())
            .expect("statistics");
        a.append(std::slice::from_ref(&good)).await.expect("append");
        let b = memory
            .statistics_store("c", &StatisticsOptions::default())
            .expect("statistics");
        assert_eq!(
            b.scan(&StatFilter::all(AggLevel::Raw)).await.expect("scan").len(),
            1,
            "one store per cluster"
        );
        assert!(matches!(
            memory.statistics_store(
                "c",
                &StatisticsOptions {
                    retention_hours: 0,
                    ..Default::default()
                }
            ),
            Err(Error::InvalidConfig { .. })
        ));
    });
}

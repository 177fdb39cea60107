//! The statistics store: rollups, retention, interning and filter scans, on the
//! memory store and on the embedded (redb) store, against a brute-force model.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use rollcall_core::{AggLevel, StatFilter, StatPoint, StatisticsOptions, StatisticsStore, Timestamp};
use rollcall_provider_memory::MemoryStatistics;
use rollcall_statistics_embedded::EmbeddedStatistics;
use rollcall_tests::statistics_store::{
    check_invalid_points_and_retries, check_retention, check_rollups, model, BASE,
};

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

/// S1, S2 and S3 of the conformance suite on the embedded store (which is not a
/// `SystemStore`'s, so the suite's macro does not reach it).
#[test]
fn the_embedded_store_passes_the_conformance_checks() {
    runtime().block_on(async {
        for seed in [1, 2, 3] {
            let (_dir, store) = embedded(&StatisticsOptions::default());
            check_rollups(&store, seed).await;
        }
        let (_dir, store) = embedded(&StatisticsOptions {
            retention_hours: 1,
            ..StatisticsOptions::default()
        });
        check_retention(&store).await;
        let (_dir, store) = embedded(&StatisticsOptions::default());
        check_invalid_points_and_retries(&store).await;
        let (_dir, store) = embedded(&StatisticsOptions::default());
        rollcall_tests::key_limits::check_statistics_labels(&store, rollcall_core::KeyLimits::CORE.label)
            .await;
    });
}

fn embedded(options: &StatisticsOptions) -> (tempfile::TempDir, EmbeddedStatistics) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStatistics::open(dir.path().join("stats.redb"), "c", options.clone()).expect("open");
    (dir, store)
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

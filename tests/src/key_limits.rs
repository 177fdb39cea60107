//! Key limit scenarios: on every table, a key at the provider's limit
//! ([`SystemStore::key_limits`](rollcall_core::SystemStore::key_limits)) round-trips,
//! and one byte past it is [`Error::InvalidInput`] before anything is sent, with
//! nothing written. Strings are built of two-byte characters where they can be, so
//! a provider that counted characters instead of bytes would fail.

use std::collections::BTreeSet;

use rollcall_core::lease::{MAX_LEASE_BYTES, MAX_SHARDS};
use rollcall_core::statistics::StatFilter;
use rollcall_core::{
    AggLevel, ClearMode, Codec, Error, Expected, KeyLimits, MetricsRole, StatPoint, StateKey,
    StatisticsOptions, StatisticsStore, Timestamp,
};

use crate::{
    membership_table, metrics_table, reminder_table, state_table, statistics_store, unique_id, Store,
};

/// `prefix` followed by `é` (two bytes) and, for an odd remainder, one `x`: a
/// string of exactly `len` bytes.
pub fn text(prefix: &str, len: usize) -> String {
    assert!(len >= prefix.len(), "{len} bytes cannot hold `{prefix}`");
    let rest = len - prefix.len();
    let mut s = String::with_capacity(len);
    s.push_str(prefix);
    s.extend(std::iter::repeat_n('é', rest / 2));
    if rest % 2 == 1 {
        s.push('x');
    }
    assert_eq!(s.len(), len);
    s
}

/// The keys (actor id, name) at each limit of `l`: the longest actor id, the
/// longest name, and the longest pair (an actor id and a name as long as they
/// may be together).
pub fn keys_at_the_limits(l: &KeyLimits) -> Vec<(String, String)> {
    let actor = l.actor_id.min(l.actor_id_and_name - 1);
    let name = l.name.min(l.actor_id_and_name - 3);
    let pair_actor = l.actor_id.min(l.actor_id_and_name - 1);
    let pair_name = (l.actor_id_and_name - pair_actor).min(l.name);
    vec![
        (text("cart/", actor), "n".into()),
        ("a/1".into(), text("", name)),
        (text("kind/", pair_actor), text("", pair_name)),
    ]
}

/// The keys one byte past each limit of `l` that no other limit refuses first,
/// with the field the error must name.
pub fn keys_past_the_limits(l: &KeyLimits) -> Vec<(String, String, &'static str)> {
    let mut out = vec![
        (text("cart/", l.actor_id + 1), "n".into(), "actor_id"),
        ("a/1".into(), text("", l.name + 1), "name"),
    ];
    // The pair's own bound is reachable only when it is below the two others.
    if l.actor_id_and_name < l.actor_id + l.name {
        let actor = l.actor_id.min(l.actor_id_and_name - 1);
        out.push((
            text("kind/", actor),
            text("", l.actor_id_and_name + 1 - actor),
            "actor_id+name",
        ));
    }
    out
}

fn invalid_input<T: std::fmt::Debug>(r: rollcall_core::Result<T>, what: &str, doing: &str) {
    match r {
        Err(e @ Error::InvalidInput { .. }) => {
            assert!(!e.is_transient(), "{doing}: {e}");
            let Error::InvalidInput { what: w, .. } = &e else {
                unreachable!()
            };
            assert_eq!(w, what, "{doing}: {e}");
        }
        other => panic!("{doing}: expected InvalidInput naming `{what}`, got {other:?}"),
    }
}

/// Scenario K1: a membership row whose host, silo and role names have the longest
/// label (256 bytes everywhere) round-trips; a name one byte longer, or with a
/// control character, is refused and neither the row nor the version changes.
pub async fn keys_membership_names_at_and_past_the_limit(store: Store) {
    let label = store.key_limits().label;
    assert_eq!(
        label,
        KeyLimits::CORE.label,
        "labels are the same on every provider"
    );
    let table = membership_table::fresh_table(&store, rollcall_core::ProtocolMode::Extended).await;
    let mut longest = membership_table::full_entry(1);
    longest.host_name = text("h", label);
    longest.silo_name = text("s", label);
    longest.role_name = text("r", label);
    membership_table::insert(&*table, &longest).await;
    let snap = table.read_all().await.expect("read_all");
    assert_eq!(snap.entry(&longest.silo), Some(&longest));

    for (n, what) in [(2, "host_name"), (3, "silo_name"), (4, "role_name")] {
        for bad in [text("x", label + 1), "a\u{7}b".to_owned()] {
            let mut e = membership_table::full_entry(n);
            match what {
                "host_name" => e.host_name = bad,
                "silo_name" => e.silo_name = bad,
                _ => e.role_name = bad,
            }
            invalid_input(
                table.insert_row(&e, &snap.version.next()).await,
                what,
                "insert_row",
            );
        }
    }
    let after = table.read_all().await.expect("read_all");
    assert_eq!(after.len(), 1, "nothing written");
    assert_eq!(after.version, snap.version, "the version row is untouched");
}

/// Scenario K2: reminders at each key limit of the provider round-trip through
/// every call (upsert, read_row, read_rows_for, update_last_fired, remove_row);
/// one byte past a limit, every call is refused and nothing is written.
pub async fn keys_reminders_at_and_past_the_limit(store: Store) {
    let limits = store.key_limits();
    let table = reminder_table::fresh_table(&store).await;
    let mut written = BTreeSet::new();
    for (actor, name) in keys_at_the_limits(&limits) {
        let entry = reminder_table::reminder(&*table, &actor, &name, None);
        let etag = table.upsert_row(&entry).await.expect("upsert at the limit");
        let back = table
            .read_row(&actor, &name)
            .await
            .expect("read_row")
            .expect("the row at the limit");
        assert_eq!(
            (back.actor_id.as_str(), back.name.as_str()),
            (actor.as_str(), name.as_str())
        );
        assert_eq!(back.etag, etag);
        let rows = table.read_rows_for(&actor).await.expect("read_rows_for");
        assert!(rows.iter().any(|r| r.name == name), "read_rows_for finds it");
        assert!(table
            .update_last_fired(
                &actor,
                &name,
                &etag,
                Timestamp::from_millis(1_795_000_001_000),
                None
            )
            .await
            .expect("update_last_fired"));
        written.insert((actor, name, etag));
    }
    let all = table.read_rows_in_range(0, 0).await.expect("the whole ring");
    assert_eq!(all.len(), written.len());

    for (actor, name, what) in keys_past_the_limits(&limits) {
        let entry = reminder_table::reminder(&*table, &actor, &name, None);
        invalid_input(table.upsert_row(&entry).await, what, "upsert_row");
        invalid_input(table.read_row(&actor, &name).await, what, "read_row");
        let etag = rollcall_core::Etag::from("e");
        invalid_input(
            table.remove_row(&actor, &name, &etag, None).await,
            what,
            "remove_row",
        );
        invalid_input(
            table
                .update_last_fired(&actor, &name, &etag, Timestamp::from_millis(1), None)
                .await,
            what,
            "update_last_fired",
        );
        if what == "actor_id" {
            invalid_input(table.read_rows_for(&actor).await, what, "read_rows_for");
        }
    }
    let all = table.read_rows_in_range(0, 0).await.expect("the whole ring");
    assert_eq!(all.len(), written.len(), "nothing written past the limits");
    for (actor, name, etag) in written {
        assert!(table
            .remove_row(&actor, &name, &etag, None)
            .await
            .expect("remove_row"));
    }
    assert!(table.read_rows_in_range(0, 0).await.expect("ring").is_empty());
}

/// Scenario K3: a metrics row whose id is the longest label round-trips and is
/// removed; one byte longer is refused and nothing is written.
pub async fn keys_metrics_ids_at_and_past_the_limit(store: Store) {
    let label = store.key_limits().label;
    let table = metrics_table::fresh_metrics(&store).await;
    let mut row = metrics_table::full_row(MetricsRole::Silo, 1);
    row.id = text("id", label);
    table.upsert(&row).await.expect("upsert at the limit");
    assert_eq!(table.read_all().await.expect("read_all").rows, vec![row.clone()]);
    let mut over = metrics_table::full_row(MetricsRole::Silo, 2);
    over.id = text("id", label + 1);
    invalid_input(table.upsert(&over).await, "metrics.id", "upsert");
    assert_eq!(
        table.read_all().await.expect("read_all").rows.len(),
        1,
        "nothing written"
    );
    assert!(table.remove(MetricsRole::Silo, &row.id).await.expect("remove"));
}

/// Scenario K4: a statistic whose silo and name are the longest labels is stored
/// and scanned back; one byte longer in either refuses the whole batch. (etcd has
/// no statistics store: it says so, and the scenario stops there.)
pub async fn keys_statistics_names_at_and_past_the_limit(store: Store) {
    let label = store.key_limits().label;
    let Some(stats) = statistics_store::fresh_statistics(&store, &StatisticsOptions::default()) else {
        return;
    };
    check_statistics_labels(stats.as_ref(), label).await;
}

/// The body of K4 on an empty statistics store whose labels hold `label` bytes
/// (also run on the embedded store).
pub async fn check_statistics_labels(stats: &dyn StatisticsStore, label: usize) {
    let good = StatPoint {
        time: Timestamp::from_millis(statistics_store::BASE),
        silo: text("s", label),
        name: text("n", label),
        value: 2.5,
        is_delta: false,
    };
    assert_eq!(
        stats.append(std::slice::from_ref(&good)).await.expect("append"),
        1
    );
    for (what, bad) in [
        (
            "statistics.silo",
            StatPoint {
                silo: text("s", label + 1),
                time: Timestamp::from_millis(statistics_store::BASE + 1),
                ..good.clone()
            },
        ),
        (
            "statistics.name",
            StatPoint {
                name: text("n", label + 1),
                time: Timestamp::from_millis(statistics_store::BASE + 2),
                ..good.clone()
            },
        ),
    ] {
        invalid_input(stats.append(&[bad]).await, what, "append");
    }
    let raw = stats.scan(&StatFilter::all(AggLevel::Raw)).await.expect("scan");
    assert_eq!(raw.len(), 1, "only the point at the limit: {raw:?}");
    assert_eq!(
        (raw[0].silo.as_str(), raw[0].name.as_str()),
        (good.silo.as_str(), good.name.as_str())
    );
}

/// Scenario K5: states at each key limit of the provider, large enough to be
/// chunked, are written, read, listed by kind and cleared; one byte past a limit
/// the key is refused (by [`StateKey::new`] for the core limits, by the table for
/// a provider's tighter ones) and nothing is written.
pub async fn state_keys_at_and_past_the_limit(store: Store) {
    let limits = store.key_limits();
    let s = state_table::fresh_storage(&store);
    let data: Vec<u8> = (0..s.table().limits().chunk_bytes + 10)
        .map(|i| i as u8)
        .collect();
    let mut kinds = BTreeSet::new();
    for (actor, name) in keys_at_the_limits(&limits) {
        let key = StateKey::new(&actor, &name).expect("a key at the limit is a valid StateKey");
        let etag = s
            .write(&key, Expected::Absent, Codec::Raw, &data, None)
            .await
            .expect("write at the limit");
        let back = s.read(&key).await.expect("read");
        assert!(back.data == data, "{} bytes back", back.data.len());
        assert_eq!(back.etag, Some(etag));
        let listed = s.list(key.kind(), None, 100).await.expect("list");
        assert!(listed.contains(&key), "listed under its kind");
        kinds.insert(key.kind().to_owned());
    }
    for (actor, name, what) in keys_past_the_limits(&limits) {
        match StateKey::new(&actor, &name) {
            // Past a core limit: the key itself is refused.
            Err(e) => invalid_input(Err::<(), _>(e), what, "StateKey::new"),
            Ok(key) => {
                invalid_input(
                    s.write(&key, Expected::Absent, Codec::Raw, b"x", None).await,
                    what,
                    "write",
                );
                invalid_input(s.read(&key).await, what, "read");
                invalid_input(
                    s.clear(&key, Expected::Any, ClearMode::Delete).await,
                    what,
                    "clear",
                );
                kinds.insert(key.kind().to_owned());
            }
        }
    }
    invalid_input(
        s.list(&text("k", limits.actor_id + 1), None, 10).await,
        "kind",
        "list",
    );
    let mut total = 0;
    for kind in &kinds {
        total += s.list(kind, None, 100).await.expect("list").len();
    }
    assert_eq!(
        total,
        keys_at_the_limits(&limits).len(),
        "nothing written past the limits"
    );
}

/// Scenario K6: a lease row of [`MAX_LEASE_BYTES`] on the last shard round-trips;
/// a row one byte larger, or a shard at [`MAX_SHARDS`], is refused and nothing is
/// written.
pub async fn lease_rows_at_and_past_the_limit(store: Store) {
    let table = store.lease_table(&unique_id("leases")).expect("open lease table");
    let row = vec![b'r'; MAX_LEASE_BYTES];
    let last = MAX_SHARDS - 1;
    let written = table
        .write_lease(last, &Expected::Absent, &row)
        .await
        .expect("write_lease at the limit");
    let rollcall_core::lease::LeaseWrite::Written(etag) = written else {
        panic!("a first write of an absent row is written: {written:?}");
    };
    let (back, back_etag) = table.read_lease(last).await.expect("read").expect("the row");
    assert!(back == row, "{} bytes back", back.len());
    assert_eq!(back_etag, etag);
    invalid_input(
        table
            .write_lease(0, &Expected::Absent, &vec![b'r'; MAX_LEASE_BYTES + 1])
            .await,
        "lease",
        "write_lease",
    );
    invalid_input(
        table.write_lease(MAX_SHARDS, &Expected::Absent, b"{}").await,
        "shard",
        "write_lease",
    );
    assert!(
        table.read_lease(0).await.expect("read").is_none(),
        "nothing written"
    );
    table.clear().await.expect("clear");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_keys_sit_exactly_at_and_past_each_limit() {
        for l in [
            KeyLimits::CORE,
            KeyLimits {
                actor_id: 1008,
                name: 984,
                actor_id_and_name: 1009,
                label: 256,
            },
        ] {
            for (a, n) in keys_at_the_limits(&l) {
                l.check_key(&a, &n).expect("at the limit");
            }
            let at = keys_at_the_limits(&l);
            assert!(at
                .iter()
                .any(|(a, _)| a.len() == l.actor_id.min(l.actor_id_and_name - 1)));
            assert!(at
                .iter()
                .any(|(_, n)| n.len() == l.name.min(l.actor_id_and_name - 3)));
            assert!(at
                .iter()
                .any(|(a, n)| a.len() + n.len() == l.actor_id_and_name.min(l.actor_id + l.name)));
            for (a, n, what) in keys_past_the_limits(&l) {
                match l.check_key(&a, &n) {
                    Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
                    other => panic!("{what}: {other:?}"),
                }
            }
        }
    }
}

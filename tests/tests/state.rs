//! The typed actor-state API (`rollcall::state::PersistentState`) on the memory
//! store: stored records stay readable as the type evolves, calls of one state
//! run one at a time and queued writes merge, conflicts and damage are typed
//! errors.

use std::collections::BTreeSet;

use rollcall::state::{Codec, Expected, PersistentState, StateKey, StateStorage};
use rollcall::Error;
use rollcall_core::SystemStore;
use rollcall_provider_memory::MemoryStore;
use rollcall_tests::state_table::{Fault, Faulty};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
struct Cart {
    items: Vec<String>,
    /// A field the first version did not have.
    #[serde(default)]
    ticks_seen: u64,
}

fn storage() -> (MemoryStore, StateStorage) {
    let store = MemoryStore::new();
    let s = StateStorage::new(store.state_table("shop").expect("state table"));
    (store, s)
}

#[tokio::test]
async fn a_record_of_the_first_version_reads_after_the_type_gained_a_field() {
    let (_, s) = storage();
    let key = StateKey::new("cart/1", "cart").unwrap();
    // Bytes as the first version of the type wrote them (a stored fixture).
    let v1 = include_bytes!("../fixtures/cart-state-v1.json");
    s.write(&key, Expected::Absent, Codec::Json, v1, None)
        .await
        .unwrap();
    let cart: PersistentState<Cart> = PersistentState::new(s, key);
    cart.load().await.unwrap();
    assert!(cart.record_exists());
    assert_eq!(
        cart.get(),
        Cart {
            items: vec!["apple".into(), "pear".into()],
            ticks_seen: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_queued_behind_one_merge_into_it() {
    let (_, s) = storage();
    let key = StateKey::new("cart/2", "cart").unwrap();
    let cart: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    cart.load().await.unwrap();
    for i in 0..10 {
        cart.modify(|c| c.items.push(format!("item {i}")));
    }
    let writes: Vec<_> = (0..10)
        .map(|_| {
            let c = cart.clone();
            tokio::spawn(async move { c.write().await })
        })
        .collect();
    let mut etags = BTreeSet::new();
    for w in writes {
        etags.insert(w.await.unwrap().expect("every queued write answers Ok"));
    }
    assert_eq!(
        etags.len(),
        1,
        "the first write stored every change; the rest merged into it"
    );
    let fresh: PersistentState<Cart> = PersistentState::new(s, key);
    fresh.load().await.unwrap();
    assert_eq!(fresh.read(|c| c.items.len()), 10);
    assert_eq!(fresh.etag(), etags.into_iter().next());
}

#[tokio::test]
async fn a_conflict_is_a_typed_error_and_a_clear_leaves_a_tombstone() {
    let (_, s) = storage();
    let key = StateKey::new("cart/3", "cart").unwrap();
    let a: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    let b: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    a.load().await.unwrap();
    b.load().await.unwrap();
    a.modify(|c| c.items.push("a".into()));
    a.write().await.unwrap();
    b.modify(|c| c.items.push("b".into()));
    let err = b.write().await.unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    assert_eq!(
        b.read(|c| c.items.clone()),
        ["a"],
        "after a conflict the value is the stored one, not the refused change"
    );
    b.clear().await.unwrap();
    assert!(!b.record_exists());
    assert!(b.etag().is_some(), "the tombstone's etag");
    a.modify(|c| c.items.push("stale".into()));
    assert!(matches!(a.write().await, Err(Error::InconsistentState { .. })));
    let c: PersistentState<Cart> = PersistentState::new(s, key);
    c.load().await.unwrap();
    assert!(!c.record_exists());
    assert_eq!(c.get(), Cart::default());
}

#[tokio::test]
async fn a_damaged_record_is_corrupt_and_leaves_the_value_alone() {
    let (store, s) = storage();
    let key = StateKey::new("cart/4", "cart").unwrap();
    let cart: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    cart.modify(|c| c.items.push("kept".into()));
    cart.write().await.unwrap();
    store.corrupt_state_header("shop", &key, b"{\"format\":1,\"codec\":\"json\"");
    let err = cart.load().await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(cart.read(|c| c.items.clone()), ["kept"]);
    // Bytes that are not the type: Corrupt too, not a panic.
    let other = StateKey::new("cart/5", "cart").unwrap();
    s.write(&other, Expected::Absent, Codec::Json, b"[1,2,3]", None)
        .await
        .unwrap();
    let wrong: PersistentState<Cart> = PersistentState::new(s, other);
    assert!(matches!(wrong.load().await, Err(Error::Corrupt { .. })));
}

fn faulty(store: &MemoryStore, fault: Fault) -> StateStorage {
    StateStorage::new(Faulty::new(store.state_table("shop").unwrap(), fault))
}

/// A write that timed out after its commit landed is learned from the header
/// before the next call: the same write asked for again answers Ok at once
/// instead of conflicting with itself (before, the conflict led the documented
/// re-read/re-apply to apply the change twice).
#[tokio::test]
async fn a_timed_out_write_that_landed_does_not_conflict_with_itself() {
    let (store, s) = storage();
    let key = StateKey::new("cart/6", "cart").unwrap();
    let hangs = faulty(&store, Fault::AppliedThenHangs);
    let cart: PersistentState<Cart> =
        PersistentState::new(hangs, key.clone()).with_timeout(std::time::Duration::from_millis(300));
    cart.modify(|c| c.ticks_seen += 1);
    let err = cart.write().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    let stored = s.read(&key).await.unwrap();
    assert!(stored.record_exists, "the commit landed");
    // The handler retries its write: the header says it landed.
    let etag = cart.write().await.expect("no conflict with itself");
    assert_eq!(Some(etag), stored.etag);
    assert_eq!(cart.etag(), stored.etag);
    let fresh: PersistentState<Cart> = PersistentState::new(s, key);
    fresh.load().await.unwrap();
    assert_eq!(fresh.read(|c| c.ticks_seen), 1, "applied once");
}

/// A write whose outcome could not be read is `OutcomeUnknown`, and the next
/// call learns it landed.
#[tokio::test]
async fn an_unknown_outcome_is_learned_by_the_next_call() {
    let (store, s) = storage();
    let key = StateKey::new("cart/7", "cart").unwrap();
    let blind = faulty(&store, Fault::AppliedThenUnreadable);
    let cart: PersistentState<Cart> = PersistentState::new(blind, key.clone());
    cart.modify(|c| c.items.push("once".into()));
    let err = cart.write().await.unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    // Same value, a state over the healthy table: the pending write resolves.
    let healthy: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    healthy.load().await.unwrap();
    assert_eq!(healthy.read(|c| c.items.clone()), ["once"]);
    healthy.update(|c| c.items.push("twice".into())).await.unwrap();
    let r = s.read(&key).await.unwrap();
    assert_eq!(
        serde_json::from_slice::<Cart>(&r.data).unwrap().items,
        ["once", "twice"]
    );
}

/// Changes made while a load runs are discarded with the old value, and the
/// write asked for after them says so instead of answering Ok having stored
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_during_a_load_are_not_reported_as_stored() {
    let (store, s) = storage();
    let key = StateKey::new("cart/8", "cart").unwrap();
    s.write(
        &key,
        Expected::Absent,
        Codec::Json,
        br#"{"items":["stored"]}"#,
        None,
    )
    .await
    .unwrap();
    let (table, gate) = Faulty::gate_reads(store.state_table("shop").unwrap());
    let cart: PersistentState<Cart> = PersistentState::new(StateStorage::new(table), key.clone());
    let entered = gate.entered.notified();
    let load = tokio::spawn({
        let cart = cart.clone();
        async move { cart.load().await }
    });
    entered.await; // the load is reading
    cart.modify(|c| c.items.push("during the load".into()));
    let write = tokio::spawn({
        let cart = cart.clone();
        async move { cart.write().await }
    });
    gate.release.close();
    load.await.unwrap().unwrap();
    let err = write.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    assert_eq!(cart.read(|c| c.items.clone()), ["stored"]);
    // A change made after the load is written as usual.
    cart.update(|c| c.items.push("after".into())).await.unwrap();
    assert_eq!(
        serde_json::from_slice::<Cart>(&s.read(&key).await.unwrap().data)
            .unwrap()
            .items,
        ["stored", "after"]
    );
}

/// `update` re-reads and re-applies on a conflict; two activations that
/// interleave both count.
#[tokio::test]
async fn update_rereads_and_reapplies_on_a_conflict() {
    let (_, s) = storage();
    let key = StateKey::new("cart/9", "cart").unwrap();
    let a: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    let b: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    a.load().await.unwrap();
    b.load().await.unwrap();
    let mut runs = 0;
    assert_eq!(
        a.update(|c| {
            c.ticks_seen += 1;
            c.ticks_seen
        })
        .await
        .unwrap(),
        1
    );
    let n = b
        .update(|c| {
            runs += 1;
            c.ticks_seen += 1;
            c.ticks_seen
        })
        .await
        .unwrap();
    assert_eq!(
        (n, runs),
        (2, 2),
        "b conflicted once, read again and applied again"
    );
    assert_eq!(
        a.update(|c| {
            c.ticks_seen += 1;
            c.ticks_seen
        })
        .await
        .unwrap(),
        3
    );
    let fresh: PersistentState<Cart> = PersistentState::new(s, key);
    fresh.load().await.unwrap();
    assert_eq!(fresh.read(|c| c.ticks_seen), 3);
}

/// A corrupt record is not a dead end: `overwrite` and `delete` go past it.
#[tokio::test]
async fn a_corrupt_record_can_be_overwritten_or_deleted() {
    let (store, s) = storage();
    for (i, delete) in [(10, false), (11, true)] {
        let key = StateKey::new(format!("cart/{i}"), "cart").unwrap();
        let cart: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
        cart.update(|c| c.items.push("x".into())).await.unwrap();
        store.corrupt_state_header("shop", &key, b"{\"format\":1");
        let fresh: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
        assert!(matches!(fresh.load().await, Err(Error::Corrupt { .. })));
        fresh.modify(|c| c.items = vec!["repaired".into()]);
        assert!(
            matches!(fresh.write().await, Err(Error::InconsistentState { .. })),
            "a plain write still compares"
        );
        if delete {
            fresh.delete().await.expect("delete past a corrupt header");
            assert!(!s.read(&key).await.unwrap().record_exists);
            assert!(s.read(&key).await.unwrap().etag.is_none(), "no header left");
            fresh
                .update(|c| c.items = vec!["new".into()])
                .await
                .expect("a first write again");
        } else {
            fresh.modify(|c| c.items = vec!["repaired".into()]);
            fresh.overwrite().await.expect("overwrite past a corrupt header");
            fresh.load().await.expect("reads again");
            assert_eq!(fresh.read(|c| c.items.clone()), ["repaired"]);
        }
    }
}

/// With an expiry, a write with no change stores again, so the expiry is
/// refreshed (`with_expiry`'s promise).
#[tokio::test]
async fn a_write_refreshes_the_expiry() {
    let (_, s) = storage();
    let key = StateKey::new("cart/12", "cart").unwrap();
    let cart: PersistentState<Cart> =
        PersistentState::new(s.clone(), key).with_expiry(std::time::Duration::from_secs(3600));
    cart.update(|c| c.ticks_seen = 1).await.unwrap();
    let e1 = cart.etag().unwrap();
    let e2 = cart.write().await.unwrap();
    assert_ne!(e1, e2, "stored again: a new expiry");
}

/// Using a state inside its own closure panics with a message instead of
/// deadlocking the thread (the guards of the first version deadlocked the
/// actix arbiter when held across another call).
#[test]
fn reentrant_use_panics_instead_of_deadlocking() {
    let (_, s) = storage();
    let cart: PersistentState<Cart> = PersistentState::new(s, StateKey::new("cart/13", "cart").unwrap());
    let inner = cart.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cart.read(|_| inner.modify(|c| c.ticks_seen += 1))
    }));
    let msg = r.unwrap_err();
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("deadlock"), "{msg}");
    // The state is usable afterwards, from this thread.
    cart.modify(|c| c.ticks_seen = 5);
    assert_eq!(cart.read(|c| c.ticks_seen), 5);
}

/// The state sweep removes an orphaned generation once it has seen it for the
/// grace on its own clock, an expired state at once, a tombstone after its
/// retention, and only states of the kinds and ring ranges it owns. (Nothing
/// ran the sweep before.)
#[tokio::test]
async fn the_sweeper_removes_orphans_expired_states_and_old_tombstones() {
    use rollcall::state::{ClearMode, StateLimits, StateSweeper, SweepOptions, SweepReport};
    use rollcall_core::{ManualClock, Timestamp};
    use std::time::Duration;
    let store = MemoryStore::new();
    let limits = StateLimits {
        chunk_bytes: 10,
        txn_bytes: 100,
        txn_rows: 4,
        max_state_bytes: 10_000,
    };
    let table = store.state_table_with_limits("sweep", limits).unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let s = StateStorage::with_clock(table.clone(), std::sync::Arc::new(clock.clone()));
    let killed = StateStorage::with_clock(
        Faulty::new(table, Fault::KilledBeforeCommit),
        std::sync::Arc::new(clock.clone()),
    );
    let (orphaned, expired, cleared, other) = (
        StateKey::new("cart/orphan", "s").unwrap(),
        StateKey::new("cart/expired", "s").unwrap(),
        StateKey::new("cart/cleared", "s").unwrap(),
        StateKey::new("dog/1", "s").unwrap(),
    );
    let e = s
        .write(&orphaned, Expected::Absent, Codec::Raw, &[1; 500], None)
        .await
        .unwrap();
    killed
        .write(&orphaned, Expected::Etag(e), Codec::Raw, &[2; 500], None)
        .await
        .unwrap_err();
    assert_eq!(s.table().generations(&orphaned).await.unwrap().len(), 2);
    s.write(
        &expired,
        Expected::Absent,
        Codec::Raw,
        &[3; 500],
        Some(Timestamp::from_millis(1)),
    )
    .await
    .unwrap();
    let e = s
        .write(&cleared, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap();
    s.clear(&cleared, Expected::Etag(e), ClearMode::Tombstone)
        .await
        .unwrap();
    s.write(
        &other,
        Expected::Absent,
        Codec::Raw,
        &[4; 500],
        Some(Timestamp::from_millis(1)),
    )
    .await
    .unwrap();
    let mut options = SweepOptions::new(["cart"]);
    options.grace = Duration::from_secs(600);
    options.tombstone_retention = Duration::from_secs(3600);
    let mut sweeper = StateSweeper::all(s.clone(), options);
    let first = sweeper.pass().await;
    assert_eq!(
        first,
        SweepReport {
            states: 3,
            ..SweepReport::default()
        },
        "orphans (the expired state's chunks too) and the tombstone are only seen"
    );
    clock.advance(Duration::from_secs(599));
    assert_eq!(sweeper.pass().await.orphans, 0, "not seen for the grace yet");
    clock.advance(Duration::from_secs(1));
    let second = sweeper.pass().await;
    assert_eq!(
        (second.orphans, second.expired),
        (2, 0),
        "the killed write's generation and the expired state's chunks"
    );
    assert_eq!(sweeper.pass().await.expired, 1, "then the expired state's header");
    assert_eq!(s.table().generations(&orphaned).await.unwrap().len(), 1);
    assert!(
        s.read(&orphaned).await.unwrap().data == [1; 500],
        "the published state is kept"
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(sweeper.pass().await.tombstones, 1);
    let listed = s.list("cart", None, 10).await.unwrap();
    assert_eq!(
        listed,
        [orphaned],
        "the expired and cleared states are no longer listed"
    );
    assert_eq!(
        s.list("dog", None, 10).await.unwrap(),
        [other],
        "another kind is not swept"
    );
}

/// Schema evolution: a record says which version of the type wrote it; a newer
/// build migrates an older record on load and stores it as its own version; an
/// older build cannot load (so cannot overwrite by accident) a record a newer
/// one wrote, and replaces it only explicitly.
#[tokio::test]
async fn a_record_names_its_version_and_an_older_build_does_not_overwrite_a_newer_one() {
    #[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
    struct CartV2 {
        lines: Vec<(String, u32)>,
    }
    let (_, s) = storage();
    let key = StateKey::new("cart/20", "cart").unwrap();
    let no_migration = |v: u32, _: Codec, _: &[u8]| -> rollcall::Result<Cart> {
        Err(Error::Unsupported(format!("no migration from {v}")))
    };
    let v1: PersistentState<Cart> =
        PersistentState::new(s.clone(), key.clone()).with_version(1, no_migration);
    v1.update(|c| c.items = vec!["apple".into(), "apple".into(), "pear".into()])
        .await
        .unwrap();
    assert_eq!(s.read(&key).await.unwrap().version, 1);
    let v2: PersistentState<CartV2> =
        PersistentState::new(s.clone(), key.clone()).with_version(2, |from, codec, bytes| {
            assert_eq!((from, codec), (1, Codec::Json));
            let old: Cart = serde_json::from_slice(bytes).map_err(|e| Error::corrupt("cart", e))?;
            let mut lines: Vec<(String, u32)> = Vec::new();
            for item in old.items {
                match lines.iter_mut().find(|(i, _)| *i == item) {
                    Some((_, n)) => *n += 1,
                    None => lines.push((item, 1)),
                }
            }
            Ok(CartV2 { lines })
        });
    v2.load().await.expect("migrated on load");
    assert_eq!(
        v2.read(|c| c.lines.clone()),
        [("apple".to_owned(), 2), ("pear".to_owned(), 1)]
    );
    v2.update(|c| c.lines.push(("plum".into(), 1))).await.unwrap();
    assert_eq!(
        s.read(&key).await.unwrap().version,
        2,
        "stored as the new version"
    );
    // The old build meets the new record.
    let err = v1.load().await.unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported(m) if m.contains("version 2")),
        "{err}"
    );
    let stale: PersistentState<Cart> =
        PersistentState::new(s.clone(), key.clone()).with_version(1, no_migration);
    assert!(
        stale.update(|c| c.items.push("x".into())).await.is_err(),
        "no silent overwrite"
    );
    assert_eq!(s.read(&key).await.unwrap().version, 2, "the new record is intact");
    stale.modify(|c| c.items = vec!["replaced".into()]);
    stale.overwrite().await.expect("an explicit overwrite");
    assert_eq!(s.read(&key).await.unwrap().version, 1);
}

/// A silo's sweeper sweeps the states of its ring ranges: alone and Active it
/// owns every actor; once it has left it owns none.
#[actix_rt::test]
async fn a_silos_sweeper_sweeps_its_ring_ranges_only_while_active() {
    use rollcall::state::{StateSweeper, SweepOptions};
    use rollcall_core::{Silo, SystemStore, Timestamp};
    let store = MemoryStore::new();
    let system: std::sync::Arc<dyn SystemStore> = std::sync::Arc::new(store.clone());
    let silo = Silo::builder(system, "sweep")
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .expect("the silo joins");
    let s = StateStorage::new(store.state_table("sweep").unwrap());
    for i in 0..20 {
        let k = StateKey::new(format!("cart/{i}"), "s").unwrap();
        s.write(
            &k,
            Expected::Absent,
            Codec::Raw,
            b"x",
            Some(Timestamp::from_millis(1)),
        )
        .await
        .unwrap();
    }
    let mut sweeper = StateSweeper::for_silo(s.clone(), SweepOptions::new(["cart"]), silo.clone(), 30);
    silo.shutdown().await.expect("the silo leaves");
    assert_eq!(sweeper.pass().await.states, 0, "a silo that left owns no state");
    assert_eq!(s.list("cart", None, 100).await.unwrap().len(), 20);
    // A new silo, alone in the cluster: it owns every actor.
    let system: std::sync::Arc<dyn SystemStore> = std::sync::Arc::new(store.clone());
    let silo = Silo::builder(system, "sweep")
        .listen("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .expect("a new silo joins");
    let mut sweeper = StateSweeper::for_silo(s.clone(), SweepOptions::new(["cart"]), silo.clone(), 30);
    let report = sweeper.pass().await;
    assert_eq!((report.states, report.expired), (20, 20), "{report:?}");
    assert!(s.list("cart", None, 100).await.unwrap().is_empty());
    silo.shutdown().await.expect("the silo leaves");
}

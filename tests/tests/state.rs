//! The typed actor-state API (`rollcall::state::PersistentState`) on the memory
//! store: stored records stay readable as the type evolves, calls of one state
//! run one at a time and queued writes merge, conflicts and damage are typed
//! errors.

use std::collections::BTreeSet;

use rollcall::state::{Codec, Expected, PersistentState, StateKey, StateStorage};
use rollcall::Error;
use rollcall_membership_core::SystemStore;
use rollcall_provider_memory::MemoryStore;
use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
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
        *cart.state(),
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
        cart.state_mut().items.push(format!("item {i}"));
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
    assert_eq!(fresh.state().items.len(), 10);
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
    a.state_mut().items.push("a".into());
    a.write().await.unwrap();
    b.state_mut().items.push("b".into());
    let err = b.write().await.unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    b.load().await.unwrap();
    assert_eq!(b.state().items, ["a"]);
    b.clear().await.unwrap();
    assert!(!b.record_exists());
    assert!(b.etag().is_some(), "the tombstone's etag");
    a.state_mut().items.push("stale".into());
    assert!(matches!(a.write().await, Err(Error::InconsistentState { .. })));
    let c: PersistentState<Cart> = PersistentState::new(s, key);
    c.load().await.unwrap();
    assert!(!c.record_exists());
    assert_eq!(*c.state(), Cart::default());
}

#[tokio::test]
async fn a_damaged_record_is_corrupt_and_leaves_the_value_alone() {
    let (store, s) = storage();
    let key = StateKey::new("cart/4", "cart").unwrap();
    let cart: PersistentState<Cart> = PersistentState::new(s.clone(), key.clone());
    cart.state_mut().items.push("kept".into());
    cart.write().await.unwrap();
    store.corrupt_state_header("shop", &key, b"{\"format\":1,\"codec\":\"json\"");
    let err = cart.load().await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(cart.state().items, ["kept"]);
    // Bytes that are not the type: Corrupt too, not a panic.
    let other = StateKey::new("cart/5", "cart").unwrap();
    s.write(&other, Expected::Absent, Codec::Json, b"[1,2,3]", None)
        .await
        .unwrap();
    let wrong: PersistentState<Cart> = PersistentState::new(s, other);
    assert!(matches!(wrong.load().await, Err(Error::Corrupt { .. })));
}

//! The whole conformance suite against the in-memory provider.

use std::sync::Arc;

use rollcall_provider_memory::MemoryStore;
use rollcall_tests::Store;

fn memory_store() -> Store {
    Arc::new(MemoryStore::new())
}

rollcall_tests::conformance_tests!(Some((memory_store(), ())));

/// The `memory://` URL through the facade runs the suite too (one shared store).
mod via_connect {
    rollcall_tests::conformance_tests!(Some((
        rollcall::connect("memory://conformance").await.expect("connect"),
        ()
    )));
}

#[tokio::test]
async fn unavailable_store_errors_instead_of_answering_false() {
    use rollcall_core::{Error, MembershipEntry, ProtocolMode, SiloStatus, SystemStore, Timestamp};
    let store = MemoryStore::new();
    let table = store.membership_table("c", ProtocolMode::Extended).unwrap();
    let v = table.read_all().await.unwrap().version;
    store.set_unavailable(true);
    let e = MembershipEntry::new(
        "127.0.0.1:1@1".parse().unwrap(),
        SiloStatus::Joining,
        Timestamp::from_millis(1),
    );
    assert!(matches!(
        table.insert_row(&e, &v.next()).await,
        Err(Error::Backend { .. })
    ));
    assert!(matches!(table.read_all().await, Err(Error::Backend { .. })));
    store.set_unavailable(false);
    assert!(
        table.insert_row(&e, &v.next()).await.unwrap(),
        "the failed write must have had no effect"
    );
}

#[tokio::test]
async fn history_keeps_the_newest_events() {
    rollcall_tests::membership_table::history_keeps_the_newest_events(Arc::new(
        MemoryStore::with_history_capacity(3),
    ))
    .await;
}

/// The grain-state scenarios against the in-memory provider.
mod state {
    rollcall_tests::state_conformance_tests!(Some((super::memory_store(), ())));
}

/// The shard lease scenarios against the in-memory provider.
mod lease {
    rollcall_tests::lease_conformance_tests!(Some((super::memory_store(), ())));
}

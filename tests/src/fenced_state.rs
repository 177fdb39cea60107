//! Fenced state conformance scenarios: a state write or clear under a
//! [`Fence`] lands only while the fence's shard lease is held at its epoch,
//! checked by the store in the write's own transaction (core `state/`,
//! `lease.rs`). Run by [`state_conformance_tests!`](crate::state_conformance_tests)
//! on every provider.
//!
//! Every scenario uses a service of [`DEFAULT_SHARDS`] shards: on Redis
//! Cluster a fenced commit needs its lease in the states' slot, which holds
//! for that shard count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rollcall_core::lease::{LeaseStatus, ShardLease, ShardLeases};
use rollcall_core::{
    actor_shard, ClearMode, Codec, Error, Expected, Fence, SiloAddress, StateKey, StateStorage,
    DEFAULT_SHARDS,
};

use crate::{unique_id, Store};

/// A fresh service: its leases and its state storage (one service id).
async fn fresh(store: &Store) -> (ShardLeases, StateStorage) {
    let service = unique_id("fenced");
    let leases = ShardLeases::open(store.lease_table(&service).expect("lease table"), DEFAULT_SHARDS)
        .await
        .expect("open leases");
    let states = StateStorage::new(store.state_table(&service).expect("state table"));
    (leases, states)
}

fn silo(port: u16) -> SiloAddress {
    SiloAddress::new(([127, 0, 0, 1], port).into(), 1_795_000_000_000)
}

/// Acquires `shard` for `owner` (the next epoch) and returns its fence.
async fn acquire(leases: &ShardLeases, states: &StateStorage, shard: u32, owner: SiloAddress) -> Fence {
    let lease = leases.read(shard).await.expect("read lease");
    let next = ShardLease {
        epoch: lease.epoch + 1,
        owner: Some(owner),
        status: LeaseStatus::Owned,
        ..lease
    };
    leases.write(&next).await.expect("write lease").expect("acquired");
    Fence {
        service: states.table().service_id().to_owned(),
        shards: leases.shards(),
        shard,
        epoch: next.epoch,
    }
}

fn key(actor: &str) -> StateKey {
    StateKey::new(actor, "state").expect("key")
}

fn is_fenced(e: &Error, epoch: u64, now: Option<u64>) -> bool {
    matches!(e, Error::Fenced { epoch: e, current, .. } if *e == epoch && *current == now)
}

/// A write under epoch e lands while the lease is at e (the holder's own
/// watermark updates do not move the fence); once another silo acquired e+1,
/// every fenced write, write of several states, clear and staged (chunked)
/// write under e fails with `Fenced { epoch: e, current: e+1 }` and changes
/// nothing (data, etag, generations); the new holder's fence and unfenced
/// writes work as before.
pub async fn fenced_writes_land_at_their_epoch_and_are_refused_after_a_takeover(store: Store) {
    let (leases, states) = fresh(&store).await;
    let k = key("cart/fenced-1");
    let shard = actor_shard(k.actor_id(), DEFAULT_SHARDS);
    let old = acquire(&leases, &states, shard, silo(1)).await;
    let a = states.fenced(old.clone());
    a.write(&k, Expected::Absent, Codec::Raw, b"a1", None)
        .await
        .expect("a fenced write at the lease's epoch");
    // The holder moves its watermark: the same epoch, a new etag.
    let mut lease = leases.read(shard).await.expect("read");
    lease.watermark = Some(rollcall_core::Timestamp::from_millis(1_795_000_000_000));
    leases.write(&lease).await.expect("write").expect("watermark");
    let etag = a
        .write(&k, Expected::Any, Codec::Raw, b"a2", None)
        .await
        .expect("still fenced in after a watermark update");
    let k2 = StateKey::new(k.actor_id(), "other").expect("key");
    a.write_many(&[(k2.clone(), Expected::Absent, Codec::Raw, b"o1".as_slice())])
        .await
        .expect("a fenced write of several states");

    let new = acquire(&leases, &states, shard, silo(2)).await;
    assert_eq!(new.epoch, old.epoch + 1);
    let gens = states.table().generations(&k).await.expect("generations");
    let e = a
        .write(&k, Expected::Etag(etag.clone()), Codec::Raw, b"stale", None)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "{e}");
    let e = a
        .write(&k, Expected::Any, Codec::Raw, b"stale", None)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "{e}");
    let big = vec![7u8; states.table().limits().txn_bytes + 1];
    let big = &big[..big.len().min(states.table().limits().max_state_bytes as usize)];
    let e = a
        .write(&k, Expected::Any, Codec::Raw, big, None)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "a staged write: {e}");
    let e = a
        .write_many(&[(k2.clone(), Expected::Any, Codec::Raw, b"stale".as_slice())])
        .await
        .unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "{e}");
    let e = a
        .clear(&k, Expected::Any, ClearMode::Tombstone)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "{e}");
    let e = a.clear(&k, Expected::Any, ClearMode::Delete).await.unwrap_err();
    assert!(is_fenced(&e, old.epoch, Some(new.epoch)), "{e}");

    let read = states.read(&k).await.expect("read");
    assert_eq!(read.data, b"a2", "no refused write changed the state");
    assert_eq!(read.etag.as_ref(), Some(&etag), "nor its etag");
    assert_eq!(states.read(&k2).await.expect("read").data, b"o1");
    assert_eq!(
        states.table().generations(&k).await.expect("generations"),
        gens,
        "a refused staged write leaves no chunks"
    );

    let b = states.fenced(new);
    b.write(&k, Expected::Etag(etag), Codec::Raw, b"b1", None)
        .await
        .expect("the new holder writes");
    states
        .write(&k2, Expected::Any, Codec::Raw, b"unfenced", None)
        .await
        .expect("an unfenced write is not checked");
    assert_eq!(states.read(&k).await.expect("read").data, b"b1");
    assert_eq!(states.read(&k2).await.expect("read").data, b"unfenced");
}

/// A fence whose lease was released, or whose shard was never leased, fails
/// with `Fenced { current: None }` and writes nothing.
pub async fn fenced_writes_after_a_release_or_without_a_lease_are_refused(store: Store) {
    let (leases, states) = fresh(&store).await;
    let k = key("cart/fenced-2");
    let shard = actor_shard(k.actor_id(), DEFAULT_SHARDS);
    let never = Fence {
        service: states.table().service_id().to_owned(),
        shards: DEFAULT_SHARDS,
        shard,
        epoch: 1,
    };
    let e = states
        .fenced(never)
        .write(&k, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, 1, None), "no lease row: {e}");

    let fence = acquire(&leases, &states, shard, silo(1)).await;
    let s = states.fenced(fence.clone());
    s.write(&k, Expected::Absent, Codec::Raw, b"held", None)
        .await
        .expect("held");
    let mut lease = leases.read(shard).await.expect("read");
    lease.status = LeaseStatus::Released;
    leases.write(&lease).await.expect("write").expect("released");
    let e = s
        .write(&k, Expected::Any, Codec::Raw, b"after", None)
        .await
        .unwrap_err();
    assert!(is_fenced(&e, fence.epoch, None), "released: {e}");
    assert_eq!(states.read(&k).await.expect("read").data, b"held");
}

/// A fence that does not cover the key (another shard, another service) is
/// `InvalidInput` before anything is sent.
pub async fn a_fence_that_does_not_cover_the_key_is_invalid_input(store: Store) {
    let (leases, states) = fresh(&store).await;
    let k = key("cart/fenced-3");
    let shard = actor_shard(k.actor_id(), DEFAULT_SHARDS);
    let fence = acquire(&leases, &states, shard, silo(1)).await;
    let other_shard = Fence {
        shard: (shard + 1) % DEFAULT_SHARDS,
        ..fence.clone()
    };
    let e = states
        .fenced(other_shard)
        .write(&k, Expected::Any, Codec::Raw, b"x", None)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    let other_service = Fence {
        service: unique_id("other"),
        ..fence
    };
    let e = states
        .fenced(other_service)
        .clear(&k, Expected::Any, ClearMode::Tombstone)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
    assert!(!states.read(&k).await.expect("read").record_exists);
}

/// A stale holder writing as fast as it can while another silo takes the
/// shard over: once the takeover's lease write returned, none of its writes
/// lands (the state the new holder read stays), and each one it made after
/// is `Fenced`.
pub async fn fenced_writes_racing_a_takeover_never_land_after_it(store: Store) {
    let (leases, states) = fresh(&store).await;
    let k = key("cart/fenced-4");
    let shard = actor_shard(k.actor_id(), DEFAULT_SHARDS);
    let old = acquire(&leases, &states, shard, silo(1)).await;
    let a = states.fenced(old.clone());
    a.write(&k, Expected::Absent, Codec::Raw, b"0", None)
        .await
        .expect("first");
    let taken = Arc::new(AtomicBool::new(false));
    let writer = {
        let (a, k, taken) = (a.clone(), k.clone(), taken.clone());
        tokio::spawn(async move {
            let mut after_takeover = 0;
            for i in 1..=10_000u32 {
                let seen_taken = taken.load(Ordering::SeqCst);
                match a
                    .write(&k, Expected::Any, Codec::Raw, i.to_string().as_bytes(), None)
                    .await
                {
                    Ok(_) => assert!(!seen_taken, "write {i} landed after the takeover returned"),
                    Err(Error::Fenced { .. }) => {
                        if seen_taken {
                            after_takeover += 1;
                            if after_takeover == 20 {
                                return after_takeover;
                            }
                        }
                    }
                    Err(e) => panic!("write {i}: {e}"),
                }
            }
            after_takeover
        })
    };
    // Let the writer land a few.
    let mut landed = b"0".to_vec();
    for _ in 0..1_000 {
        landed = states.read(&k).await.expect("read").data;
        if landed != b"0" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_ne!(landed, b"0", "the writer wrote");
    acquire(&leases, &states, shard, silo(2)).await;
    taken.store(true, Ordering::SeqCst);
    let seen = states.read(&k).await.expect("read");
    let refused = writer.await.expect("the writer");
    assert_eq!(refused, 20, "the writer's later writes were refused");
    let now = states.read(&k).await.expect("read");
    assert_eq!(
        (now.data, now.etag),
        (seen.data, seen.etag),
        "no write of the old holder landed after the takeover"
    );
}

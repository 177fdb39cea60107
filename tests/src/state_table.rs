//! Grain-state table conformance scenarios: the contract of `StateTable` and
//! `StateStorage` (core `state/`), one scenario per rule, run by
//! [`state_conformance_tests!`](crate::state_conformance_tests) on every provider
//! that has a state table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rollcall_core::state::{layout, Commit, HeaderWrite, Layout, StateHeader, StateLimits, StateTable};
use rollcall_core::{ClearMode, Codec, Error, Etag, Expected, StateKey, StateStorage, Timestamp};

use crate::{unique_id, Store};

/// A [`StateStorage`] over a fresh service's state table of `store`.
pub fn fresh_storage(store: &Store) -> StateStorage {
    StateStorage::new(
        store
            .state_table(&unique_id("state"))
            .expect("the provider has a state table"),
    )
}

fn key(actor: &str, name: &str) -> StateKey {
    StateKey::new(actor, name).expect("valid key")
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `n` bytes, or the provider's largest state if that is less (etcd stores
/// 1 MiB: still more than one transaction, so its writes are staged too).
fn fit(limits: StateLimits, n: usize) -> usize {
    n.min(limits.max_state_bytes as usize)
}

async fn generations(s: &StateStorage, k: &StateKey) -> usize {
    s.table().generations(k).await.expect("generations").len()
}

/// Sizes 0, 1, chunk-1, chunk, chunk+1, inline and staged: every one reads back
/// as written, with the codec, and leaves exactly one generation.
pub async fn state_sizes_round_trip(store: Store) {
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let StateLimits {
        chunk_bytes,
        txn_bytes,
        ..
    } = limits;
    let k = key("cart/sizes", "state");
    let mut etag = None;
    for (i, n) in [
        0,
        1,
        chunk_bytes - 1,
        chunk_bytes,
        chunk_bytes + 1,
        3 * chunk_bytes + 7,
        txn_bytes + 1,
    ]
    .into_iter()
    .map(|n| fit(limits, n))
    .enumerate()
    {
        let data = bytes(n, i as u8);
        let e = s
            .write(&k, Expected::from_etag(etag.as_ref()), Codec::Raw, &data, None)
            .await
            .unwrap_or_else(|e| panic!("write of {n} bytes: {e}"));
        let r = s.read(&k).await.expect("read");
        assert!(r.record_exists, "{n} bytes");
        assert_eq!(r.data.len(), n);
        assert!(r.data == data, "{n} bytes read back differently");
        assert_eq!(r.codec, Codec::Raw);
        assert_eq!(r.etag.as_ref(), Some(&e));
        assert_eq!(
            generations(&s, &k).await,
            usize::from(layout(n, limits) != Layout::Row),
            "{n} bytes: one generation of chunk rows, none when the bytes fit the header row"
        );
        etag = Some(e);
    }
}

/// The provider's largest state (64 MiB; 1 MiB on etcd) is stored and read
/// back; one byte more is `Error::TooLarge` and writes nothing.
pub async fn state_largest_state_and_one_byte_over(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/large", "state");
    let max = s.table().limits().max_state_bytes;
    let data = bytes(max as usize, 7);
    let e = s
        .write(&k, Expected::Absent, Codec::Raw, &data, None)
        .await
        .expect("the largest state");
    let r = s.read(&k).await.expect("read");
    assert!(r.data == data, "the largest state read back differently");
    let mut over = data;
    over.push(1);
    let err = s
        .write(&k, Expected::Etag(e.clone()), Codec::Raw, &over, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { max: m, .. } if m == max), "{err}");
    assert_eq!(s.read(&k).await.expect("read").etag, Some(e), "nothing written");
}

/// A state that grows and shrinks leaves no stale chunk: one generation after
/// each write, and the bytes of the last write only.
pub async fn state_grows_and_shrinks_leaving_no_stale_chunk(store: Store) {
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let k = key("cart/grow", "state");
    let mut etag = None;
    for (i, n) in [10, limits.txn_bytes * 2, 5, limits.chunk_bytes * 3, 0, 17]
        .into_iter()
        .map(|n| fit(limits, n))
        .enumerate()
    {
        let data = bytes(n, i as u8);
        etag = Some(
            s.write(&k, Expected::from_etag(etag.as_ref()), Codec::Raw, &data, None)
                .await
                .expect("write"),
        );
        assert_eq!(s.read(&k).await.expect("read").data, data);
        assert!(
            generations(&s, &k).await <= 1,
            "a stale generation after writing {n} bytes"
        );
    }
}

/// Multibyte UTF-8 split across chunk boundaries reads back as the same text.
pub async fn state_multibyte_utf8_across_chunk_boundaries(store: Store) {
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let mut text = String::new();
    // Past at least one chunk boundary, within the provider's largest state.
    let want = fit(limits, 3 * limits.chunk_bytes + 11) - 16;
    while text.len() < want {
        text.push_str("é€😀ß");
    }
    let k = key("cart/utf8", "state");
    s.write(&k, Expected::Absent, Codec::Json, text.as_bytes(), None)
        .await
        .expect("write");
    let back = String::from_utf8(s.read(&k).await.expect("read").data).expect("valid UTF-8");
    assert_eq!(back, text);
}

/// A first write needs no record; a stale etag is `InconsistentState` naming
/// both etags and writes nothing; `Any` always writes.
pub async fn state_preconditions(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/pre", "state");
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, b"one", None)
        .await
        .expect("first");
    let err = s
        .write(&k, Expected::Absent, Codec::Raw, b"two", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InconsistentState { expected: None, current: Some(c), .. } if *c == e1),
        "{err}"
    );
    let e2 = s
        .write(&k, Expected::Etag(e1.clone()), Codec::Raw, b"two", None)
        .await
        .expect("update");
    assert_ne!(e1, e2);
    let err = s
        .write(&k, Expected::Etag(e1.clone()), Codec::Raw, b"stale", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InconsistentState { expected: Some(x), current: Some(c), .. } if *x == e1 && *c == e2),
        "{err}"
    );
    assert_eq!(s.read(&k).await.expect("read").data, b"two");
    let e3 = s
        .write(&k, Expected::Any, Codec::Raw, b"three", None)
        .await
        .expect("any");
    assert_ne!(e3, e2);
    let other = key("cart/pre-2", "state");
    s.write(&other, Expected::Any, Codec::Raw, b"x", None)
        .await
        .expect("any on a new key");
    assert_eq!(s.read(&k).await.expect("read").data, b"three");
}

/// 16 writers x 200 rounds of read-modify-write on one state: exactly one winner
/// per etag, and the counter in the state equals the number of wins.
pub async fn state_concurrent_writers_one_winner_per_etag(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/race", "counter");
    s.write(&k, Expected::Absent, Codec::Raw, &0u64.to_be_bytes(), None)
        .await
        .expect("init");
    let winners: Arc<Mutex<BTreeMap<Etag, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (s, k, winners) = (s.clone(), k.clone(), winners.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..200 {
                let r = s.read(&k).await.expect("read");
                let n = u64::from_be_bytes(r.data.as_slice().try_into().expect("8 bytes"));
                let etag = r.etag.expect("etag");
                match s
                    .write(
                        &k,
                        Expected::Etag(etag.clone()),
                        Codec::Raw,
                        &(n + 1).to_be_bytes(),
                        None,
                    )
                    .await
                {
                    Ok(_) => *winners.lock().unwrap().entry(etag).or_default() += 1,
                    Err(Error::InconsistentState { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let winners = std::mem::take(&mut *winners.lock().unwrap());
    assert!(winners.values().all(|n| *n == 1), "an etag with two winners");
    let r = s.read(&k).await.expect("read");
    let n = u64::from_be_bytes(r.data.as_slice().try_into().expect("8 bytes"));
    assert_eq!(n as usize, winners.len(), "a lost update");
    assert!(n > 0);
}

/// A clear leaves a tombstone with a new etag: a writer holding the old etag
/// cannot recreate the state, a first write neither; the tombstone's etag
/// writes. A deleting clear leaves nothing: a first write works again.
pub async fn state_clear_against_a_concurrent_writer(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/clear", "state");
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, b"one", None)
        .await
        .expect("write");
    let tomb = s
        .clear(&k, Expected::Etag(e1.clone()), ClearMode::Tombstone)
        .await
        .expect("clear")
        .expect("a tombstone etag");
    assert_ne!(tomb, e1);
    let r = s.read(&k).await.expect("read");
    assert!(!r.record_exists);
    assert!(r.data.is_empty());
    assert_eq!(r.etag.as_ref(), Some(&tomb));
    let err = s
        .write(&k, Expected::Etag(e1.clone()), Codec::Raw, b"stale", None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    let err = s
        .write(&k, Expected::Absent, Codec::Raw, b"first?", None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    let err = s
        .clear(&k, Expected::Etag(e1), ClearMode::Delete)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    let e2 = s
        .write(&k, Expected::Etag(tomb), Codec::Raw, b"two", None)
        .await
        .expect("write");
    assert!(s.read(&k).await.expect("read").record_exists);
    assert_eq!(
        s.clear(&k, Expected::Etag(e2), ClearMode::Delete)
            .await
            .expect("delete"),
        None
    );
    let r = s.read(&k).await.expect("read");
    assert!(!r.record_exists && r.etag.is_none());
    assert_eq!(
        generations(&s, &k).await,
        0,
        "the cleared state's chunks are deleted"
    );
    s.write(&k, Expected::Absent, Codec::Raw, b"again", None)
        .await
        .expect("first write again");
}

/// How a [`Faulty`] table fails its commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every commit fails without being applied, and the writer cleans nothing
    /// up either: a write killed between its chunks and its header.
    KilledBeforeCommit,
    /// Every commit is applied, then answers an error (a timeout, a connection
    /// lost after the request was sent).
    AppliedThenLost,
    /// As `AppliedThenLost`, and every header read after the first commit fails
    /// too: nobody can tell whether it landed.
    AppliedThenUnreadable,
    /// Every commit answers an error without being applied (refused before it
    /// reached the store).
    LostBeforeSent,
    /// Every commit is applied, then never answers (a caller's timeout ends it).
    AppliedThenHangs,
    /// No fault: only the read gate ([`Faulty::gate_reads`]).
    None,
}

/// Writers that all write with `Expected::Any` (last writer wins, explicitly)
/// never fail, however contended: 8 writers x 25 writes of one state all
/// succeed, and the state reads whole. (On Redis a commit gave up with
/// `InconsistentState` after three aborted `EXEC`s.)
pub async fn state_last_writer_wins_never_fails_under_contention(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/any", "state");
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8u8 {
        let (s, k) = (s.clone(), k.clone());
        writers.spawn(async move {
            for i in 0..25u8 {
                s.write(&k, Expected::Any, Codec::Raw, &[w, i], None)
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}, write {i}: {e}"));
            }
        });
    }
    while let Some(r) = writers.join_next().await {
        r.expect("a writer panicked");
    }
    let r = s.read(&k).await.expect("read");
    assert_eq!(r.data.len(), 2);
    assert_eq!(r.data[1], 24, "some writer's last write is the state");
}

/// A state table that injects a [`Fault`] into the table it wraps.
#[derive(Debug)]
pub struct Faulty {
    inner: Arc<dyn StateTable>,
    fault: Fault,
    committed: std::sync::atomic::AtomicBool,
    gate: Option<ReadGate>,
}

/// Holds every header read until released: `entered` is notified when one
/// waits, `release` lets them through.
#[derive(Debug, Clone)]
pub struct ReadGate {
    /// Notified when a header read waits at the gate.
    pub entered: Arc<tokio::sync::Notify>,
    /// Closed to let every read through.
    pub release: Arc<tokio::sync::Semaphore>,
}

impl Faulty {
    /// `inner` with `fault`.
    pub fn new(inner: Arc<dyn StateTable>, fault: Fault) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner,
            fault,
            committed: std::sync::atomic::AtomicBool::new(false),
            gate: None,
        })
    }

    /// `inner` whose header reads wait at a gate (to run something while a
    /// read is in flight).
    pub fn gate_reads(inner: Arc<dyn StateTable>) -> (Arc<Faulty>, ReadGate) {
        let gate = ReadGate {
            entered: Arc::new(tokio::sync::Notify::new()),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let table = Arc::new(Faulty {
            inner,
            fault: Fault::None,
            committed: std::sync::atomic::AtomicBool::new(false),
            gate: Some(gate.clone()),
        });
        (table, gate)
    }
}

#[async_trait]
impl StateTable for Faulty {
    fn service_id(&self) -> &str {
        self.inner.service_id()
    }
    fn limits(&self) -> StateLimits {
        self.inner.limits()
    }
    async fn read_header(&self, key: &StateKey) -> rollcall_core::Result<Option<(Vec<u8>, Etag)>> {
        if self.fault == Fault::AppliedThenUnreadable
            && self.committed.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::backend(
                "injected: the store is unreachable after the commit",
            ));
        }
        if let Some(g) = &self.gate {
            g.entered.notify_one();
            // Closed: every read passes.
            let _ = g.release.acquire().await;
        }
        self.inner.read_header(key).await
    }
    async fn read_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        count: u32,
    ) -> rollcall_core::Result<Vec<Option<Vec<u8>>>> {
        self.inner.read_chunks(key, generation, count).await
    }
    async fn put_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        first: u32,
        chunks: &[&[u8]],
        expires_at: Option<Timestamp>,
    ) -> rollcall_core::Result<()> {
        self.inner
            .put_chunks(key, generation, first, chunks, expires_at)
            .await
    }
    async fn commit(
        &self,
        writes: &[HeaderWrite<'_>],
        fence: Option<&rollcall_core::Fence>,
    ) -> rollcall_core::Result<Commit> {
        match self.fault {
            Fault::KilledBeforeCommit => Err(Error::backend("killed between the chunks and the header")),
            Fault::LostBeforeSent => Err(Error::backend("injected: the commit was never sent")),
            Fault::None => self.inner.commit(writes, fence).await,
            Fault::AppliedThenHangs => {
                self.inner.commit(writes, fence).await?;
                std::future::pending().await
            }
            Fault::AppliedThenLost | Fault::AppliedThenUnreadable => {
                let applied = self.inner.commit(writes, fence).await?;
                assert!(
                    matches!(applied, Commit::Done { .. }),
                    "the injected commit conflicted"
                );
                self.committed.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(Error::backend(
                    "injected: the connection was lost after the commit was sent",
                ))
            }
        }
    }
    async fn generations(&self, key: &StateKey) -> rollcall_core::Result<Vec<String>> {
        self.inner.generations(key).await
    }
    async fn delete_generation(&self, key: &StateKey, generation: &str) -> rollcall_core::Result<()> {
        if self.fault == Fault::KilledBeforeCommit {
            return Err(Error::backend("killed"));
        }
        self.inner.delete_generation(key, generation).await
    }
    async fn list(
        &self,
        kind: &str,
        after: Option<&StateKey>,
        limit: usize,
    ) -> rollcall_core::Result<Vec<StateKey>> {
        self.inner.list(kind, after, limit).await
    }
}

/// A commit that errors after it was applied (a lost reply) is a success: the
/// write answers the etag it stored, the state reads whole, and only the
/// replaced generation is deleted. Before, the writer deleted the chunks it had
/// just published and the state read `Corrupt` for ever. Inline and staged
/// sizes, and a tombstone.
pub async fn state_a_commit_that_landed_but_errored_is_a_success(store: Store) {
    let table = store.state_table(&unique_id("state")).expect("state table");
    let s = StateStorage::new(table.clone());
    let lost = StateStorage::new(Faulty::new(table, Fault::AppliedThenLost));
    let limits = s.table().limits();
    for (i, n) in [5, fit(limits, limits.txn_bytes + 11)].into_iter().enumerate() {
        let k = key("cart/landed", &format!("s{i}"));
        let e1 = s
            .write(&k, Expected::Absent, Codec::Raw, &bytes(n, 1), None)
            .await
            .expect("write");
        let data = bytes(n, 2);
        let e2 = lost
            .write(&k, Expected::Etag(e1), Codec::Raw, &data, None)
            .await
            .unwrap_or_else(|e| panic!("{n} bytes: a landed commit is a success: {e}"));
        let r = s.read(&k).await.expect("the state reads whole");
        assert_eq!(r.etag.as_ref(), Some(&e2), "{n} bytes");
        assert!(r.data == data, "{n} bytes read back differently");
        // The generation it replaced is unknown to a write that learned its
        // outcome by a read: the sweep removes it, never the published one.
        s.sweep(&k, Duration::ZERO).await.expect("sweep");
        assert_eq!(
            generations(&s, &k).await,
            usize::from(layout(n, limits) != Layout::Row),
            "{n} bytes: only the published generation"
        );
        assert!(s.read(&k).await.expect("read").data == data);
        let tomb = lost
            .clear(&k, Expected::Etag(e2), ClearMode::Tombstone)
            .await
            .expect("a landed clear is a success");
        let r = s.read(&k).await.expect("read");
        assert!(!r.record_exists);
        assert_eq!(r.etag, tomb);
    }
    let (a, b) = (key("cart/landed-many", "a"), key("cart/landed-many", "b"));
    let etags = lost
        .write_many(&[
            (a.clone(), Expected::Absent, Codec::Raw, b"a1".as_slice()),
            (b.clone(), Expected::Absent, Codec::Raw, b"b1".as_slice()),
        ])
        .await
        .expect("a landed write_many is a success");
    assert_eq!(s.read(&a).await.expect("read").etag.as_ref(), Some(&etags[0]));
    assert_eq!(s.read(&b).await.expect("read").etag.as_ref(), Some(&etags[1]));
}

/// A commit that errors without being applied is the backend's error, the old
/// state stays, and the staged chunks are deleted.
pub async fn state_a_commit_that_errored_before_it_landed_is_an_error(store: Store) {
    let table = store.state_table(&unique_id("state")).expect("state table");
    let s = StateStorage::new(table.clone());
    let lost = StateStorage::new(Faulty::new(table, Fault::LostBeforeSent));
    let limits = s.table().limits();
    let k = key("cart/not-landed", "state");
    let old = bytes(fit(limits, limits.txn_bytes + 11), 1);
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, &old, None)
        .await
        .expect("write");
    let err = lost
        .write(
            &k,
            Expected::Etag(e1.clone()),
            Codec::Raw,
            &bytes(old.len(), 2),
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let r = s.read(&k).await.expect("read");
    assert_eq!(r.etag, Some(e1));
    assert!(r.data == old);
    assert_eq!(generations(&s, &k).await, 1, "the staged generation is deleted");
}

/// A commit that errors after it was applied, when the header cannot be read
/// either, is `Error::OutcomeUnknown`; nothing is deleted, the state reads
/// whole (the new one), and `outcome` tells later that it landed.
pub async fn state_an_unknown_outcome_deletes_nothing_and_is_learned_later(store: Store) {
    let table = store.state_table(&unique_id("state")).expect("state table");
    let s = StateStorage::new(table.clone());
    let blind = StateStorage::new(Faulty::new(table, Fault::AppliedThenUnreadable));
    let limits = s.table().limits();
    let k = key("cart/unknown", "state");
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, &bytes(7, 1), None)
        .await
        .expect("write");
    let data = bytes(fit(limits, limits.txn_bytes + 11), 2);
    let generation = blind.new_generation();
    let err = blind
        .write_with(
            &k,
            Expected::Etag(e1),
            Codec::Raw,
            &data,
            rollcall_core::state::WriteOptions {
                generation: Some(&generation),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    assert!(err.is_transient());
    let r = s.read(&k).await.expect("the state reads whole");
    assert!(r.data == data, "the landed write is published");
    let learned = s.outcome(&k, &generation).await.expect("outcome");
    assert_eq!(learned, r.etag, "outcome names the etag of the landed write");
    assert_eq!(
        s.outcome(&k, "0000000000000-00000000").await.expect("outcome"),
        None
    );
}

/// A staged write killed between its chunks and its header leaves the old state
/// readable; the sweep removes the orphaned chunks and only those.
pub async fn state_killed_write_leaves_the_old_state_and_the_sweep_removes_orphans(store: Store) {
    let table = store.state_table(&unique_id("state")).expect("state table");
    let s = StateStorage::new(table.clone());
    let killed = StateStorage::new(Faulty::new(table, Fault::KilledBeforeCommit));
    let limits = s.table().limits();
    let k = key("cart/killed", "state");
    let old = bytes(fit(limits, limits.txn_bytes + 3), 1);
    let e = s
        .write(&k, Expected::Absent, Codec::Raw, &old, None)
        .await
        .expect("write");
    let err = killed
        .write(
            &k,
            Expected::Etag(e.clone()),
            Codec::Raw,
            &bytes(fit(limits, limits.txn_bytes * 2), 2),
            None,
        )
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    let r = s.read(&k).await.expect("read");
    assert_eq!(r.etag, Some(e), "the old state is still published");
    assert!(r.data == old, "the old state reads back");
    assert_eq!(generations(&s, &k).await, 2, "the killed write's chunks are left");
    assert_eq!(
        s.sweep(&k, Duration::from_secs(600)).await.expect("sweep"),
        0,
        "young: kept"
    );
    assert_eq!(s.sweep(&k, Duration::ZERO).await.expect("sweep"), 1);
    assert_eq!(generations(&s, &k).await, 1);
    assert!(s.read(&k).await.expect("read").data == old);
}

/// A header that does not decode and a chunk that does not check out are
/// `Error::Corrupt`, never bytes.
pub async fn state_corrupt_header_or_chunk_is_an_error(store: Store) {
    let s = fresh_storage(&store);
    let chunk = s.table().limits().chunk_bytes;
    let k = key("cart/corrupt", "state");
    s.write(&k, Expected::Absent, Codec::Raw, &bytes(chunk + 5, 3), None)
        .await
        .expect("write");
    let (header, _) = s.table().read_header(&k).await.expect("read").expect("a header");
    let generation = StateHeader::decode(&k, &header).expect("decodes").generation;
    s.table()
        .put_chunks(&k, &generation, 1, &[b"flipped"], None)
        .await
        .expect("overwrite a chunk");
    let err = s.read(&k).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let bad = key("cart/corrupt", "header");
    let w = HeaderWrite {
        key: &bad,
        expected: Expected::Absent,
        header: Some(b"{not a header"),
        generation: "g",
        chunks: Vec::new(),
        expires_at: None,
    };
    assert!(matches!(
        s.table().commit(&[w], None).await.expect("commit"),
        Commit::Done { .. }
    ));
    let err = s.read(&bad).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
}

/// A state written with an expiry reads as absent once it passed, and a first
/// write succeeds over it.
pub async fn state_expiry(store: Store) {
    let s = fresh_storage(&store);
    let k = key("cart/ttl", "state");
    let at = Timestamp::from_millis(Timestamp::now().as_millis() + 1_500);
    s.write(&k, Expected::Absent, Codec::Raw, b"short-lived", Some(at))
        .await
        .expect("write");
    assert!(s.read(&k).await.expect("read").record_exists);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = s.read(&k).await.expect("read");
        if !r.record_exists {
            assert!(r.etag.is_none(), "an expired state has no etag to write with");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.write(&k, Expected::Absent, Codec::Raw, b"new", None)
        .await
        .expect("first write over it");
}

/// A write with an expiry that fails (a stale etag, after its chunks were
/// staged) leaves the live state, and its lack of expiry, alone: once the
/// failed write's expiry has passed the live state still reads whole. (The
/// first Redis layout set the expiry on the chunk hash every generation shared,
/// and the live state's chunks expired with it.)
pub async fn state_a_failed_write_with_an_expiry_leaves_the_live_state(store: Store) {
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let k = key("cart/ttl-conflict", "state");
    let live = bytes(fit(limits, limits.txn_bytes + 11), 1);
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, &live, None)
        .await
        .expect("write");
    let at = Timestamp::from_millis(Timestamp::now().as_millis() + 1_000);
    let err = s
        .write(&k, Expected::Absent, Codec::Raw, &bytes(live.len(), 2), Some(at))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    // Wait until the failed write's expiry has passed (and a little more, for
    // the backend's clock).
    while Timestamp::now().as_millis() < at.as_millis() + 1_500 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = s.read(&k).await.expect("the live state reads whole");
    assert!(r.record_exists);
    assert_eq!(r.etag, Some(e1));
    assert!(r.data == live);
}

/// A write over an expired state leaves no chunk of it behind: the commit
/// names the generation the expired header published and the writer deletes it
/// (the first version read the header first, found none, and leaked them).
pub async fn state_a_write_over_an_expired_state_deletes_its_chunks(store: Store) {
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let k = key("cart/ttl-overwrite", "state");
    let n = fit(limits, limits.txn_bytes + 11);
    let at = Timestamp::from_millis(Timestamp::now().as_millis() + 1_000);
    s.write(&k, Expected::Absent, Codec::Raw, &bytes(n, 1), Some(at))
        .await
        .expect("write");
    while s.read(&k).await.expect("read").record_exists {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let data = bytes(n, 2);
    s.write(&k, Expected::Absent, Codec::Raw, &data, None)
        .await
        .expect("a first write over the expired state");
    assert_eq!(
        generations(&s, &k).await,
        1,
        "only the new state's chunks are left"
    );
    assert!(s.read(&k).await.expect("read").data == data);
}

/// The sweep's rules on a real table: an expired state (its chunks, then its
/// header) and a tombstone are deleted and no longer listed (the Redis index
/// kept them for ever before), a live state is kept whole.
pub async fn state_the_sweep_drops_expired_states_and_tombstones(store: Store) {
    use rollcall_core::state::sweep::SweepMachine;
    let s = fresh_storage(&store);
    let limits = s.table().limits();
    let (expired, cleared, live) = (
        key("cart/sweep-expired", "s"),
        key("cart/sweep-cleared", "s"),
        key("cart/sweep-live", "s"),
    );
    let at = Timestamp::from_millis(Timestamp::now().as_millis() + 1_000);
    s.write(
        &expired,
        Expected::Absent,
        Codec::Raw,
        &bytes(fit(limits, limits.txn_bytes + 11), 1),
        Some(at),
    )
    .await
    .expect("write");
    let e = s
        .write(&cleared, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .expect("write");
    s.clear(&cleared, Expected::Etag(e), ClearMode::Tombstone)
        .await
        .expect("clear");
    let data = bytes(fit(limits, limits.txn_bytes + 11), 2);
    s.write(&live, Expected::Absent, Codec::Raw, &data, None)
        .await
        .expect("write");
    while s.read(&expired).await.expect("read").record_exists {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // No grace: what a pass sees, the next deletes.
    let mut m = SweepMachine::new(Duration::ZERO, Duration::ZERO, 100);
    let mut passes = 0;
    loop {
        let listed = s.list("cart", None, 10).await.expect("list");
        if listed == [live.clone()] {
            break;
        }
        passes += 1;
        assert!(passes <= 5, "still listed after 5 passes: {listed:?}");
        for k in &listed {
            s.sweep_with(k, &mut m).await.expect("sweep");
        }
    }
    assert_eq!(
        generations(&s, &expired).await,
        0,
        "the expired state's chunks are gone"
    );
    assert!(
        s.read(&live).await.expect("read").data == data,
        "the live state is whole"
    );
}

/// Enumeration by actor kind in pages (in the provider's key order) returns
/// every state of the kind once, and none of another kind.
pub async fn state_enumeration_pages(store: Store) {
    let s = fresh_storage(&store);
    let mut want = BTreeSet::new();
    for a in 0..5 {
        for n in 0..5 {
            let k = key(&format!("cart/{a}"), &format!("s{n}"));
            s.write(&k, Expected::Absent, Codec::Raw, b"x", None)
                .await
                .expect("write");
            want.insert(k);
        }
        s.write(
            &key(&format!("carts/{a}"), "s"),
            Expected::Absent,
            Codec::Raw,
            b"y",
            None,
        )
        .await
        .expect("write");
        s.write(
            &key(&format!("car/{a}"), "s"),
            Expected::Absent,
            Codec::Raw,
            b"y",
            None,
        )
        .await
        .expect("write");
    }
    let mut got = Vec::new();
    let mut after: Option<StateKey> = None;
    loop {
        let page = s.list("cart", after.as_ref(), 7).await.expect("list");
        assert!(page.len() <= 7);
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        got.extend(page);
    }
    let unique: BTreeSet<StateKey> = got.iter().cloned().collect();
    assert_eq!(unique.len(), got.len(), "a key listed twice");
    assert_eq!(unique, want);
}

/// Several states of one actor in one transaction: all or none.
pub async fn state_atomic_write_of_several_states(store: Store) {
    let s = fresh_storage(&store);
    let (a, b) = (key("cart/many", "a"), key("cart/many", "b"));
    let etags = s
        .write_many(&[
            (a.clone(), Expected::Absent, Codec::Raw, b"a1".as_slice()),
            (b.clone(), Expected::Absent, Codec::Raw, b"b1".as_slice()),
        ])
        .await
        .expect("both");
    assert_eq!(etags.len(), 2);
    let err = s
        .write_many(&[
            (
                a.clone(),
                Expected::Etag(etags[0].clone()),
                Codec::Raw,
                b"a2".as_slice(),
            ),
            (b.clone(), Expected::Absent, Codec::Raw, b"b2".as_slice()),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InconsistentState { key, .. } if key.ends_with("#b")),
        "{err}"
    );
    assert_eq!(s.read(&a).await.expect("read").data, b"a1", "nothing written");
    assert_eq!(s.read(&b).await.expect("read").data, b"b1");
    let big = bytes(s.table().limits().txn_bytes, 9);
    let err = s
        .write_many(&[
            (a.clone(), Expected::Any, Codec::Raw, big.as_slice()),
            (b.clone(), Expected::Any, Codec::Raw, b"b3".as_slice()),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    assert_eq!(s.read(&b).await.expect("read").data, b"b1");
    let err = s
        .write_many(&[
            (a.clone(), Expected::Any, Codec::Raw, b"x".as_slice()),
            (a.clone(), Expected::Any, Codec::Raw, b"y".as_slice()),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput { .. }),
        "the same state twice: {err}"
    );
    assert_eq!(s.read(&a).await.expect("read").data, b"a1", "nothing written");
    let other = key("dog/1", "a");
    let err = s
        .write_many(&[
            (a, Expected::Any, Codec::Raw, b"x".as_slice()),
            (other, Expected::Any, Codec::Raw, b"y".as_slice()),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
}

/// Tables of different services never see each other's states.
pub async fn state_services_are_isolated(store: Store) {
    let (s1, s2) = (fresh_storage(&store), fresh_storage(&store));
    let k = key("cart/iso", "state");
    s1.write(&k, Expected::Absent, Codec::Raw, b"one", None)
        .await
        .expect("write");
    assert!(!s2.read(&k).await.expect("read").record_exists);
    assert!(s2.list("cart", None, 10).await.expect("list").is_empty());
    s2.write(&k, Expected::Absent, Codec::Raw, b"two", None)
        .await
        .expect("write");
    assert_eq!(s1.read(&k).await.expect("read").data, b"one");
}

/// The payload of round `round` of a writer (first byte = the round).
pub fn state_payload(n: usize, round: u8) -> Vec<u8> {
    let mut v = bytes(n, round);
    if let Some(b) = v.first_mut() {
        *b = round;
    }
    v
}

/// A writer **process** (`state-writer`, at `bin`) rewriting a staged-size state
/// on `url` is killed (SIGKILL) as soon as a second generation appears, i.e.
/// between its chunks and its header: the state still reads whole (the old one,
/// or one the writer published), and the sweep leaves only the published
/// generation.
pub async fn killed_writer_process_leaves_a_whole_state(store: Store, url: &str, bin: &str) {
    let service = unique_id("state-kill");
    let s = StateStorage::new(store.state_table(&service).expect("state table"));
    let limits = s.table().limits();
    let n = fit(limits, limits.txn_bytes * 2 + 5);
    let k = key("cart/killed-process", "state");
    s.write(&k, Expected::Absent, Codec::Raw, &state_payload(n, 0), None)
        .await
        .expect("first write");
    // A kill that lands after the writer cleaned up tests nothing: try again.
    let mut left = 0;
    for _ in 0..5 {
        let mut child = tokio::process::Command::new(bin)
            .args([url, &service, k.actor_id(), k.name(), &n.to_string()])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start state-writer");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while generations(&s, &k).await < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never staged a generation"
            );
            if let Ok(Some(status)) = child.try_wait() {
                panic!("state-writer exited: {status}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        child.start_kill().expect("kill the writer");
        child.wait().await.expect("reap the writer");
        left = generations(&s, &k).await;
        if left >= 2 {
            break;
        }
    }
    assert!(left >= 2, "every kill landed after the writer had cleaned up");
    let r = s.read(&k).await.expect("the state reads whole after the kill");
    assert!(r.record_exists);
    let round = r.data[0];
    assert!(r.data == state_payload(n, round), "a mix of two writes");
    s.sweep(&k, Duration::ZERO).await.expect("sweep");
    assert_eq!(
        generations(&s, &k).await,
        1,
        "only the published generation is left"
    );
    assert!(s.read(&k).await.expect("read").data == state_payload(n, round));
}

/// A real fault: the connection carrying a state's commit is cut after the
/// server answered it ([`crate::cut::CutProxy`]), so the commit was applied and
/// the writer saw an error. The write learns that it landed: it answers the etag
/// the store holds, the state reads whole, and a `PersistentState` that retries
/// the same write does not conflict with itself. `via` reaches the store through
/// `proxy`, `direct` does not.
pub async fn state_a_commit_cut_after_it_was_sent_lands_once(
    via: Store,
    direct: Store,
    proxy: &crate::cut::CutProxy,
) {
    let service = unique_id("state-cut");
    let s = StateStorage::new(via.state_table(&service).expect("state table"));
    let d = StateStorage::new(direct.state_table(&service).expect("state table"));
    let k = key("cart/cut", "state");
    // A first write through the proxy warms every connection and script cache.
    let e1 = s
        .write(&k, Expected::Absent, Codec::Raw, b"one", None)
        .await
        .expect("first write");
    proxy.arm();
    let e2 = s
        .write(&k, Expected::Etag(e1.clone()), Codec::Raw, b"two", None)
        .await
        .expect("the cut commit landed, and the write learned it");
    assert_eq!(proxy.cuts(), 1, "the commit's connection was cut");
    assert_ne!(e2, e1);
    let r = d.read(&k).await.expect("the state reads whole");
    assert_eq!(
        (r.data.as_slice(), r.etag.as_ref()),
        (b"two".as_slice(), Some(&e2))
    );
}

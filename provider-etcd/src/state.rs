//! The grain-state table on etcd.
//!
//! | key | holds |
//! |---|---|
//! | `<prefix>/<service>/state/h/<actor>/<name>` | the envelope as JSON; its etag is the key's `mod_revision` |
//! | `<prefix>/<service>/state/c/<actor>/<name>/<generation>/<index as 8 digits>` | one chunk |
//!
//! A commit is one Txn: a compare per header (`mod_revision` equal to the
//! expected etag, or `version` 0 for "no header"), then the chunk and header
//! puts; a failed compare fails the whole Txn. A request holds at most 1.5 MiB
//! and a Txn 128 operations by default, hence 512 KiB chunks and at most 1 MiB
//! and 64 rows per transaction. An expiry puts the keys of one write, its header
//! and every chunk, under one lease (etcd removes them) and the header carries
//! the time, checked on every read. The lease of the state a commit replaces is
//! revoked (its chunks go with it), and so is the lease of a write that did not
//! publish: leases live as long as the state they expire, not as long as the
//! TTL of every write ever made.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use rollcall_core::state::{replaced_generation, Commit, HeaderWrite, StateHeader, StateLimits, StateTable};
use rollcall_core::{Error, Etag, Expected, Fence, Result, StateKey, Timestamp};

use crate::conn::Conn;
use crate::keys::{escape, prefix_end, unescape};

/// The largest state stored on etcd: 1 MiB (64 MiB on Redis and DynamoDB).
///
/// etcd also holds the membership table, and it is not a blob store: its
/// backend has a 2 GiB quota by default (`--quota-backend-bytes`), and every
/// write keeps its old value in the revision history until a compaction. A few
/// large states rewritten often fill the quota, after which etcd refuses every
/// write (an `mvcc: database space exceeded` alarm), membership's included. A
/// larger write is `Error::TooLarge` before anything is written: keep large
/// states on Redis or DynamoDB.
pub const ETCD_MAX_STATE_BYTES: u64 = 1024 * 1024;

/// etcd's limits for states.
pub const ETCD_STATE_LIMITS: StateLimits = StateLimits {
    chunk_bytes: 512 * 1024,
    txn_bytes: 1024 * 1024,
    txn_rows: 64,
    max_state_bytes: ETCD_MAX_STATE_BYTES,
};

/// The most leases of writes in progress an [`EtcdStateTable`] remembers.
const MAX_PENDING_LEASES: usize = 1024;

/// How often a commit whose Txn failed on a header that its precondition admits
/// after all (expired but not yet removed by its lease) compares again.
const TXN_ATTEMPTS: usize = 3;

/// The grain-state table of one service on etcd.
#[derive(Debug, Clone)]
pub struct EtcdStateTable {
    conn: Arc<Conn>,
    /// The lease of each write in progress with an expiry, by (header key,
    /// generation): its staging batches and its commit share it. At most
    /// [`MAX_PENDING_LEASES`] (an entry dropped beyond that only costs a
    /// lease that expires by itself).
    leases: Arc<std::sync::Mutex<BTreeMap<(String, String), i64>>>,
    base: String,
    /// The base of the service's lease keys (a fenced commit compares one).
    lease_base: String,
    service_id: String,
}

impl EtcdStateTable {
    pub(crate) fn new(conn: Arc<Conn>, prefix: &str, service_id: &str) -> Self {
        EtcdStateTable {
            conn,
            leases: Arc::default(),
            base: format!("{prefix}/{}/state", escape(service_id)),
            lease_base: crate::lease::lease_base(prefix, service_id),
            service_id: service_id.to_owned(),
        }
    }

    fn header_key(&self, key: &StateKey) -> String {
        format!(
            "{}/h/{}/{}",
            self.base,
            escape(key.actor_id()),
            escape(key.name())
        )
    }

    fn chunks_prefix(&self, key: &StateKey) -> String {
        format!(
            "{}/c/{}/{}/",
            self.base,
            escape(key.actor_id()),
            escape(key.name())
        )
    }

    fn chunk_key(&self, key: &StateKey, generation: &str, i: u32) -> String {
        format!("{}{}/{i:08}", self.chunks_prefix(key), escape(generation))
    }

    fn pending_leases(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), i64>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease of the write of `generation` of `key` (granted at its first
    /// call, shared by the rest), and whether this call granted it.
    async fn lease_for(
        &self,
        key: &StateKey,
        generation: &str,
        expires_at: Option<Timestamp>,
    ) -> Result<(Option<i64>, bool)> {
        let Some(at) = expires_at else {
            return Ok((None, false));
        };
        let slot = (self.header_key(key), generation.to_owned());
        if let Some(id) = self.pending_leases().get(&slot) {
            return Ok((Some(*id), false));
        }
        let ms = at.as_millis().saturating_sub(Timestamp::now().as_millis());
        let secs = (ms.div_ceil(1000) as i64).max(1);
        let id = self.conn.grant("state lease", secs).await?;
        let mut leases = self.pending_leases();
        if leases.len() >= MAX_PENDING_LEASES {
            leases.pop_first();
        }
        leases.insert(slot, id);
        Ok((Some(id), true))
    }

    /// Forgets the lease of a write of `generation` of `key`; revokes it with
    /// `revoke` (its keys go with it).
    async fn release_lease(&self, key: &StateKey, generation: &str, revoke: bool) {
        let id = self
            .pending_leases()
            .remove(&(self.header_key(key), generation.to_owned()));
        if let (Some(id), true) = (id, revoke) {
            if let Err(e) = self.conn.revoke("revoke a state lease", id).await {
                tracing::debug!(error = %e, "revoking a lease failed; it expires by itself");
            }
        }
    }

    /// The live header of `key`: (etag, revision), `None` if absent or expired;
    /// and the revision of an expired one still stored.
    async fn header_state(&self, key: &StateKey) -> Result<(Option<Etag>, Option<i64>)> {
        let resp = self.conn.get("state header", self.header_key(key), None).await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok((None, None));
        };
        let rev = kv.mod_revision();
        if expired(key, kv.value()) {
            return Ok((None, Some(rev)));
        }
        Ok((Some(Etag::new(rev.to_string())), Some(rev)))
    }
}

fn expired(key: &StateKey, value: &[u8]) -> bool {
    StateHeader::decode(key, value).is_ok_and(|h| h.expired(Timestamp::now()))
}

#[async_trait]
impl StateTable for EtcdStateTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    fn limits(&self) -> StateLimits {
        ETCD_STATE_LIMITS
    }

    async fn read_header(&self, key: &StateKey) -> Result<Option<(Vec<u8>, Etag)>> {
        let resp = self.conn.get("state header", self.header_key(key), None).await?;
        Ok(resp
            .kvs()
            .first()
            .filter(|kv| !expired(key, kv.value()))
            .map(|kv| (kv.value().to_vec(), Etag::new(kv.mod_revision().to_string()))))
    }

    async fn read_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        count: u32,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let mut out = vec![None; count as usize];
        if count == 0 {
            return Ok(out);
        }
        // One range read (a page at a time) of the generation's chunks.
        let start = self.chunk_key(key, generation, 0);
        let end = prefix_end(&format!("{}{}/", self.chunks_prefix(key), escape(generation)));
        let mut from = start.into_bytes();
        let mut at = 0;
        loop {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(8)
                .with_revision(at);
            let mut resp = self.conn.get("state chunks", from.clone(), Some(opts)).await?;
            if at == 0 {
                at = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            for kv in &kvs {
                let k = String::from_utf8_lossy(kv.key());
                if let Some(i) = k.rsplit('/').next().and_then(|i| i.parse::<usize>().ok()) {
                    if i < out.len() {
                        out[i] = Some(kv.value().to_vec());
                    }
                }
            }
            match kvs.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(out),
            }
        }
    }

    async fn put_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        first: u32,
        chunks: &[&[u8]],
        expires_at: Option<Timestamp>,
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let (lease, _) = self.lease_for(key, generation, expires_at).await?;
        let lease = lease.map(|id| PutOptions::new().with_lease(id));
        let ops: Vec<TxnOp> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                TxnOp::put(
                    self.chunk_key(key, generation, first + i as u32),
                    c.to_vec(),
                    lease.clone(),
                )
            })
            .collect();
        self.conn
            .txn("stage state chunks", Txn::new().and_then(ops))
            .await
            .map(|_| ())
    }

    async fn commit(&self, writes: &[HeaderWrite<'_>], fence: Option<&Fence>) -> Result<Commit> {
        if writes.is_empty() {
            return Ok(Commit::Done {
                etags: Vec::new(),
                replaced: Vec::new(),
            });
        }
        let mut leases = Vec::with_capacity(writes.len());
        let mut granted_here = Vec::with_capacity(writes.len());
        for w in writes {
            let (lease, new) = self.lease_for(w.key, w.generation, w.expires_at).await?;
            leases.push(lease);
            granted_here.push(new);
        }
        let outcome = self.commit_with(writes, &leases, fence).await;
        match &outcome {
            Ok(Commit::Done { .. }) => {
                for w in writes {
                    // The state keeps its lease; nothing to remember.
                    self.release_lease(w.key, w.generation, false).await;
                }
            }
            Ok(Commit::Conflict { .. } | Commit::Fenced { .. }) => {
                // A lease granted for this commit alone holds nothing: revoke it.
                // One shared with staged chunks goes with them (delete_generation).
                for (w, new) in writes.iter().zip(granted_here) {
                    if new {
                        self.release_lease(w.key, w.generation, true).await;
                    }
                }
            }
            // It may have landed: keep it.
            Err(_) => {}
        }
        outcome
    }

    async fn generations(&self, key: &StateKey) -> Result<Vec<String>> {
        let prefix = self.chunks_prefix(key);
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let resp = self
            .conn
            .get("state generations", prefix.clone(), Some(opts))
            .await?;
        let mut gens: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let k = String::from_utf8_lossy(kv.key());
                let rest = k.strip_prefix(&prefix)?;
                unescape(rest.split('/').next()?)
            })
            .collect();
        gens.sort();
        gens.dedup();
        Ok(gens)
    }

    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()> {
        self.release_lease(key, generation, true).await;
        let prefix = format!("{}{}/", self.chunks_prefix(key), escape(generation));
        let txn = Txn::new().and_then(vec![TxnOp::delete(
            prefix,
            Some(DeleteOptions::new().with_prefix()),
        )]);
        self.conn.txn("delete state chunks", txn).await.map(|_| ())
    }

    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        rollcall_core::KeyLimits::CORE.check_kind(kind)?;
        let prefix = format!("{}/h/{}%2F", self.base, escape(kind));
        let start = match after {
            Some(k) => {
                let mut s = self.header_key(k).into_bytes();
                s.push(0);
                if s.as_slice() < prefix.as_bytes() {
                    prefix.clone().into_bytes()
                } else {
                    s
                }
            }
            None => prefix.clone().into_bytes(),
        };
        let limit = limit.max(1);
        let head = format!("{}/h/", self.base);
        let mut start = start;
        loop {
            let opts = GetOptions::new()
                .with_range(prefix_end(&prefix))
                .with_keys_only()
                .with_limit(limit as i64);
            let resp = self.conn.get("list states", start.clone(), Some(opts)).await?;
            let keys: Vec<StateKey> = resp
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let k = String::from_utf8_lossy(kv.key());
                    let (a, n) = k.strip_prefix(&head)?.split_once('/')?;
                    StateKey::new(unescape(a)?, unescape(n)?).ok()
                })
                .collect();
            // A full page of keys that are not states (written by something
            // else) does not end the listing: page on past them.
            match resp.kvs().last() {
                Some(last) if keys.is_empty() && resp.kvs().len() == limit => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(keys),
            }
        }
    }
}

/// What a state commit does with one write after its Txn failed and read the
/// write's header back.
#[derive(Debug, PartialEq, Eq)]
enum Recheck {
    /// The header's current state refutes the write's precondition: a conflict,
    /// with the live header's etag (`None`: absent or expired).
    Conflict(Option<Etag>),
    /// The precondition admits the header after all: compare again, on the
    /// `mod_revision` of an expired header still stored (`Some`), or as the
    /// precondition says (`None`: an absent header is compared on version 0).
    Again(Option<i64>),
}

/// The rule behind [`Recheck`] for one write expecting `expected`, whose header
/// the failed Txn read as `header` (its `mod_revision` and whether it has
/// expired; `None`: no header). An expired header counts as absent, but the
/// next compare must name its revision while it is stored; once its lease has
/// removed it, the next compare is on an absent key again. (Comparing on the
/// removed header's revision failed every attempt: a first write over a state
/// whose lease ran out between two attempts failed with a backend error. Found
/// by `state_a_write_over_an_expired_state_deletes_its_chunks` on a 3-member
/// cluster under load.)
fn recheck(expected: &Expected, header: Option<(i64, bool)>) -> Recheck {
    let live = header
        .filter(|(_, expired)| !expired)
        .map(|(rev, _)| Etag::new(rev.to_string()));
    if !expected.admits(live.as_ref()) {
        return Recheck::Conflict(live);
    }
    Recheck::Again(header.filter(|(_, expired)| *expired).map(|(rev, _)| rev))
}

impl EtcdStateTable {
    /// One commit with its writes' leases ([`StateTable::commit`]).
    async fn commit_with(
        &self,
        writes: &[HeaderWrite<'_>],
        lease_ids: &[Option<i64>],
        fence: Option<&Fence>,
    ) -> Result<Commit> {
        // A fenced commit compares the lease's fence token first; when that
        // fails, the else branch reads it (its last read) to name it.
        let fence_key = fence.map(|f| crate::lease::fence_key(&self.lease_base, f.shard));
        let leases: Vec<Option<PutOptions>> = lease_ids
            .iter()
            .map(|l| l.map(|id| PutOptions::new().with_lease(id)))
            .collect();
        // The revision of a header found expired but not yet removed by its
        // lease: it counts as absent, so the next attempt compares on it.
        let mut expired_at: Vec<Option<i64>> = vec![None; writes.len()];
        for _ in 0..TXN_ATTEMPTS {
            let mut compares = Vec::with_capacity(writes.len() + 1);
            if let (Some(f), Some(k)) = (fence, &fence_key) {
                // A missing key fails a value compare.
                compares.push(Compare::value(k.clone(), CompareOp::Equal, f.token()));
            }
            for (index, w) in writes.iter().enumerate() {
                let hk = self.header_key(w.key);
                match (&w.expected, expired_at[index]) {
                    (Expected::Any, _) => {}
                    (Expected::Absent, None) => compares.push(Compare::version(hk, CompareOp::Equal, 0)),
                    (Expected::Absent, Some(rev)) => {
                        compares.push(Compare::mod_revision(hk, CompareOp::Equal, rev))
                    }
                    (Expected::Etag(e), _) => match e.as_str().parse::<i64>() {
                        Ok(rev) => compares.push(Compare::mod_revision(hk, CompareOp::Equal, rev)),
                        // Not an etag of this table: it cannot match.
                        Err(_) => {
                            let (current, _) = self.header_state(w.key).await?;
                            return Ok(Commit::Conflict { index, current });
                        }
                    },
                }
            }
            let mut ops = Vec::new();
            for (w, lease) in writes.iter().zip(&leases) {
                for (i, c) in w.chunks.iter().enumerate() {
                    ops.push(TxnOp::put(
                        self.chunk_key(w.key, w.generation, i as u32),
                        c.to_vec(),
                        lease.clone(),
                    ));
                }
                let hk = self.header_key(w.key);
                ops.push(match &w.header {
                    Some(body) => TxnOp::put(
                        hk,
                        body.to_vec(),
                        Some(lease.clone().unwrap_or_default().with_prev_key()),
                    ),
                    None => TxnOp::delete(hk, Some(DeleteOptions::new().with_prev_key())),
                });
            }
            // When a compare fails: every header, to name the write that failed.
            let mut reads: Vec<TxnOp> = writes
                .iter()
                .map(|w| TxnOp::get(self.header_key(w.key), None))
                .collect();
            if let Some(k) = &fence_key {
                reads.push(TxnOp::get(k.clone(), None));
            }
            let resp = self
                .conn
                .txn(
                    "state commit",
                    Txn::new().when(compares).and_then(ops).or_else(reads),
                )
                .await?;
            if resp.succeeded() {
                let rev = resp.header().map(|h| h.revision()).unwrap_or_default();
                // The header ops are the last of each write's ops: their previous
                // values, in order.
                let replaced = resp
                    .op_responses()
                    .into_iter()
                    .filter_map(|r| match r {
                        TxnOpResponse::Put(p) => {
                            Some(p.prev_key().and_then(|kv| replaced_generation(kv.value())))
                        }
                        TxnOpResponse::Delete(d) => Some(
                            d.prev_kvs()
                                .first()
                                .and_then(|kv| replaced_generation(kv.value())),
                        ),
                        _ => None,
                    })
                    .collect::<Vec<_>>();
                // The leases of the states replaced: nothing is left under
                // them but their chunks (the headers now have ours). Revoke them.
                let ours: Vec<i64> = lease_ids.iter().flatten().copied().collect();
                let old_leases: Vec<i64> = resp
                    .op_responses()
                    .iter()
                    .filter_map(|r| match r {
                        TxnOpResponse::Put(p) => p.prev_key().map(|kv| kv.lease()),
                        TxnOpResponse::Delete(d) => d.prev_kvs().first().map(|kv| kv.lease()),
                        _ => None,
                    })
                    .filter(|l| *l != 0 && !ours.contains(l))
                    .collect();
                for id in old_leases {
                    if let Err(e) = self.conn.revoke("revoke a replaced state's lease", id).await {
                        tracing::debug!(error = %e, "revoking a lease failed; it expires by itself");
                    }
                }
                // Chunk puts answer too (with no previous value): keep the
                // headers' answers, the last one of each write.
                let mut per_write = Vec::with_capacity(writes.len());
                let mut at = 0;
                for w in writes {
                    at += w.chunks.len();
                    per_write.push(replaced.get(at).cloned().flatten());
                    at += 1;
                }
                return Ok(Commit::Done {
                    etags: writes
                        .iter()
                        .map(|w| w.header.as_ref().map(|_| Etag::new(rev.to_string())))
                        .collect(),
                    replaced: per_write,
                });
            }
            if let Some(f) = fence {
                let token = match resp.op_responses().last() {
                    Some(TxnOpResponse::Get(g)) => g
                        .kvs()
                        .first()
                        .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<u64>().ok()),
                    _ => None,
                };
                if token != Some(f.epoch) {
                    return Ok(Commit::Fenced { current: token });
                }
            }
            let mut retry = false;
            for (index, (w, r)) in writes.iter().zip(resp.op_responses()).enumerate() {
                let TxnOpResponse::Get(g) = r else { continue };
                let header = g
                    .kvs()
                    .first()
                    .map(|kv| (kv.mod_revision(), expired(w.key, kv.value())));
                match recheck(&w.expected, header) {
                    Recheck::Conflict(current) => return Ok(Commit::Conflict { index, current }),
                    Recheck::Again(at) => {
                        expired_at[index] = at;
                        retry = true;
                    }
                }
            }
            if !retry {
                break;
            }
        }
        Err(Error::backend(
            "etcd state commit: the headers kept changing under the compares; try again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_header_is_compared_on_its_revision_until_its_lease_removes_it() {
        // Found expired and still stored: compare on its revision.
        assert_eq!(
            recheck(&Expected::Absent, Some((41, true))),
            Recheck::Again(Some(41))
        );
        // Removed by its lease before the next attempt: compare on an absent key.
        assert_eq!(recheck(&Expected::Absent, None), Recheck::Again(None));
        // A live header refutes a first write.
        assert_eq!(
            recheck(&Expected::Absent, Some((42, false))),
            Recheck::Conflict(Some(Etag::new("42")))
        );
    }

    #[test]
    fn an_etag_precondition_holds_only_against_its_live_header() {
        let e = Expected::Etag(Etag::new("7"));
        assert_eq!(recheck(&e, Some((7, false))), Recheck::Again(None));
        assert_eq!(
            recheck(&e, Some((8, false))),
            Recheck::Conflict(Some(Etag::new("8")))
        );
        assert_eq!(recheck(&e, Some((7, true))), Recheck::Conflict(None));
        assert_eq!(recheck(&e, None), Recheck::Conflict(None));
        assert_eq!(recheck(&Expected::Any, None), Recheck::Again(None));
    }
}

//! The grain-state table in memory: header and chunk rows of each service in
//! ordered maps, one lock per store, so a commit is atomic.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rollcall_core::state::{replaced_generation, Commit, HeaderWrite, StateLimits, StateTable};
use rollcall_core::{Etag, Fence, Result, StateKey, Timestamp};

use crate::{lock, MemoryStore};

/// One header row.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    bytes: Vec<u8>,
    etag: Etag,
    expires_at: Option<Timestamp>,
}

/// The state rows of one service.
#[derive(Debug, Default)]
pub(crate) struct States {
    headers: BTreeMap<(String, String), Header>,
    /// (actor, name, generation, index) -> bytes.
    chunks: BTreeMap<(String, String, String, u32), Vec<u8>>,
}

/// The limits of the memory table: 256 KiB chunks, 1 MiB and 64 rows per commit
/// (small, so that the tests exercise staged writes here too).
pub const MEMORY_STATE_LIMITS: StateLimits = StateLimits {
    chunk_bytes: 256 * 1024,
    txn_bytes: 1024 * 1024,
    txn_rows: 64,
    max_state_bytes: rollcall_core::state::MAX_STATE_BYTES,
};

/// The grain-state table of one service in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryStateTable {
    pub(crate) store: MemoryStore,
    pub(crate) service_id: String,
    pub(crate) limits: StateLimits,
}

fn pair(key: &StateKey) -> (String, String) {
    (key.actor_id().to_owned(), key.name().to_owned())
}

impl MemoryStateTable {
    fn with<R>(&self, f: impl FnOnce(&mut States) -> R) -> Result<R> {
        self.store.check_available()?;
        let mut all = lock(&self.store.inner.states);
        Ok(f(all.entry(self.service_id.clone()).or_default()))
    }

    fn now() -> Timestamp {
        Timestamp::now()
    }
}

fn live(h: Option<&Header>, now: Timestamp) -> Option<&Header> {
    h.filter(|h| h.expires_at.is_none_or(|t| t > now))
}

#[async_trait]
impl StateTable for MemoryStateTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    fn limits(&self) -> StateLimits {
        self.limits
    }

    async fn read_header(&self, key: &StateKey) -> Result<Option<(Vec<u8>, Etag)>> {
        let now = Self::now();
        self.with(|s| live(s.headers.get(&pair(key)), now).map(|h| (h.bytes.clone(), h.etag.clone())))
    }

    async fn read_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        count: u32,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let (a, n) = pair(key);
        self.with(|s| {
            (0..count)
                .map(|i| {
                    s.chunks
                        .get(&(a.clone(), n.clone(), generation.to_owned(), i))
                        .cloned()
                })
                .collect()
        })
    }

    async fn put_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        first: u32,
        chunks: &[&[u8]],
        _expires_at: Option<Timestamp>,
    ) -> Result<()> {
        let (a, n) = pair(key);
        self.with(|s| {
            for (i, c) in chunks.iter().enumerate() {
                s.chunks.insert(
                    (a.clone(), n.clone(), generation.to_owned(), first + i as u32),
                    c.to_vec(),
                );
            }
        })
    }

    async fn commit(&self, writes: &[HeaderWrite<'_>], fence: Option<&Fence>) -> Result<Commit> {
        let now = Self::now();
        let store = self.store.clone();
        // A fenced commit holds the leases' lock across the commit (always
        // taken before the states' one), so the fence token cannot change
        // between its compare and the writes; an unfenced one never takes it.
        let _leases = match fence {
            Some(f) => {
                let leases = lock(&self.store.inner.leases);
                let current = leases.get(&f.service).and_then(|l| l.fence(f.shard));
                if current != Some(f.epoch) {
                    return Ok(Commit::Fenced { current });
                }
                Some(leases)
            }
            None => None,
        };
        self.with(|s| {
            for (index, w) in writes.iter().enumerate() {
                let current = live(s.headers.get(&pair(w.key)), now).map(|h| h.etag.clone());
                if !w.expected.admits(current.as_ref()) {
                    return Commit::Conflict { index, current };
                }
            }
            let mut etags = Vec::with_capacity(writes.len());
            let mut replaced = Vec::with_capacity(writes.len());
            for w in writes {
                let (a, n) = pair(w.key);
                // Expired or not: its chunks are no longer read.
                replaced.push(
                    s.headers
                        .get(&(a.clone(), n.clone()))
                        .and_then(|h| replaced_generation(&h.bytes)),
                );
                for (i, c) in w.chunks.iter().enumerate() {
                    s.chunks.insert(
                        (a.clone(), n.clone(), w.generation.to_owned(), i as u32),
                        c.to_vec(),
                    );
                }
                match &w.header {
                    Some(bytes) => {
                        let etag = store.new_etag();
                        s.headers.insert(
                            (a, n),
                            Header {
                                bytes: bytes.to_vec(),
                                etag: etag.clone(),
                                expires_at: w.expires_at,
                            },
                        );
                        etags.push(Some(etag));
                    }
                    None => {
                        s.headers.remove(&(a, n));
                        etags.push(None);
                    }
                }
            }
            Commit::Done { etags, replaced }
        })
    }

    async fn generations(&self, key: &StateKey) -> Result<Vec<String>> {
        let (a, n) = pair(key);
        self.with(|s| {
            let mut gens: Vec<String> = s
                .chunks
                .range((a.clone(), n.clone(), String::new(), 0)..)
                .take_while(|((ca, cn, _, _), _)| *ca == a && *cn == n)
                .map(|((_, _, g, _), _)| g.clone())
                .collect();
            gens.dedup();
            gens
        })
    }

    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()> {
        let (a, n) = pair(key);
        self.with(|s| {
            s.chunks
                .retain(|(ca, cn, g, _), _| !(*ca == a && *cn == n && g == generation));
        })
    }

    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        rollcall_core::KeyLimits::CORE.check_kind(kind)?;
        let prefix = format!("{kind}/");
        self.with(|s| {
            s.headers
                .keys()
                .filter(|(a, _)| a.starts_with(&prefix))
                .filter(|(a, n)| after.is_none_or(|k| (a.as_str(), n.as_str()) > (k.actor_id(), k.name())))
                .take(limit)
                .filter_map(|(a, n)| StateKey::new(a.clone(), n.clone()).ok())
                .collect()
        })
    }
}

impl MemoryStore {
    /// The grain-state table of `service_id` with other limits than
    /// [`MEMORY_STATE_LIMITS`] (for tests of chunking).
    ///
    /// # Errors
    /// [`rollcall_core::Error::InvalidConfig`] for an invalid id.
    pub fn state_table_with_limits(
        &self,
        service_id: &str,
        limits: StateLimits,
    ) -> Result<Arc<dyn StateTable>> {
        rollcall_core::validate_id("service_id", service_id)?;
        Ok(Arc::new(MemoryStateTable {
            store: self.clone(),
            service_id: service_id.to_owned(),
            limits,
        }))
    }

    /// Overwrites the stored header of `key` with `bytes` (etag unchanged): for
    /// tests of corrupt records.
    pub fn corrupt_state_header(&self, service_id: &str, key: &StateKey, bytes: &[u8]) {
        let mut all = lock(&self.inner.states);
        if let Some(h) = all
            .entry(service_id.to_owned())
            .or_default()
            .headers
            .get_mut(&pair(key))
        {
            h.bytes = bytes.to_vec();
        }
    }
}

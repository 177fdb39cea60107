//! The grain-state table on Redis. Every key of one service shares the hash tag
//! `{g:<service>}` (one Redis Cluster slot), so a commit is one
//! `WATCH ... MULTI ... EXEC` over the headers it compares:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:{g:<service>}:h:<actor>/<name>` | hash | `etag`, `body` (the envelope as JSON) |
//! | `<prefix>:{g:<service>}:c:<actor>/<name>` | hash | `<generation>:<index>` -> chunk bytes |
//! | `<prefix>:{g:<service>}:index` | sorted set | `<actor>/<name>` (score 0, listed by `ZRANGEBYLEX`) |
//!
//! Actor ids and names are escaped as in every other key. An expiry sets
//! `PEXPIREAT` on the header and the chunk hash (Redis removes them); a write
//! without one `PERSIST`s them.

use std::sync::Arc;

use async_trait::async_trait;
use rollcall_membership_core::state::{Commit, HeaderWrite, StateLimits, StateTable};
use rollcall_membership_core::{Error, Etag, Result, StateKey, Timestamp};

use crate::conn::{backend, Node, Router};
use crate::keys::{escape, unescape};
use crate::new_etag;

/// Redis' limits for states: 4 MiB chunks, 16 MiB and 64 rows per transaction
/// (a value may hold 512 MB; these keep one command's reply time small).
pub const REDIS_STATE_LIMITS: StateLimits = StateLimits {
    chunk_bytes: 4 * 1024 * 1024,
    txn_bytes: 16 * 1024 * 1024,
    txn_rows: 64,
    max_state_bytes: rollcall_membership_core::state::MAX_STATE_BYTES,
};

/// How often a commit whose `EXEC` was aborted (a watched header changed
/// between the compare and the write) compares again before it reports the
/// conflict.
const EXEC_ATTEMPTS: usize = 3;

/// The grain-state table of one service on Redis.
#[derive(Debug, Clone)]
pub struct RedisStateTable {
    router: Arc<Router>,
    tag: String,
    base: String,
    service_id: String,
}

fn member(key: &StateKey) -> String {
    format!("{}/{}", escape(key.actor_id()), escape(key.name()))
}

fn key_of_member(m: &str) -> Option<StateKey> {
    let (a, n) = m.split_once('/')?;
    StateKey::new(unescape(a)?, unescape(n)?).ok()
}

impl RedisStateTable {
    pub(crate) fn new(router: Arc<Router>, prefix: &str, service_id: &str) -> Self {
        let tag = format!("g:{}", escape(service_id));
        RedisStateTable {
            router,
            base: format!("{prefix}:{{{tag}}}"),
            tag,
            service_id: service_id.to_owned(),
        }
    }

    fn header_key(&self, key: &StateKey) -> String {
        format!("{}:h:{}", self.base, member(key))
    }

    fn chunks_key(&self, key: &StateKey) -> String {
        format!("{}:c:{}", self.base, member(key))
    }

    fn index_key(&self) -> String {
        format!("{}:index", self.base)
    }

    /// Runs one command pipeline on the shared connection of the service's node.
    async fn query<T: redis::FromRedisValue + Send>(
        &self,
        what: &'static str,
        pipe: redis::Pipeline,
    ) -> Result<T> {
        let pipe = &pipe;
        self.router
            .run(&self.tag, |node: Arc<Node>| async move {
                node.timed(what, async {
                    let mut con = node.shared().await?;
                    pipe.query_async(&mut con).await.map_err(|e| backend(what, e))
                })
                .await
            })
            .await
    }

    /// One compare-and-write attempt on a dedicated connection: `None` when
    /// `EXEC` was aborted.
    async fn try_commit(&self, writes: &[HeaderWrite<'_>]) -> Result<Option<Commit>> {
        let header_keys: Vec<String> = writes.iter().map(|w| self.header_key(w.key)).collect();
        let header_keys = &header_keys;
        self.router
            .run(&self.tag, |node: Arc<Node>| async move {
                node.timed("state commit", async {
                    let mut con = node.dedicated().await?;
                    let r = async {
                        let mut pipe = redis::pipe();
                        pipe.cmd("WATCH").arg(header_keys).ignore();
                        for k in header_keys {
                            pipe.cmd("HGET").arg(k).arg("etag");
                        }
                        let current: Vec<Option<String>> = pipe
                            .query_async(&mut con)
                            .await
                            .map_err(|e| backend("WATCH and HGET", e))?;
                        for (index, (w, cur)) in writes.iter().zip(&current).enumerate() {
                            let cur = cur.as_deref().map(Etag::from);
                            if !w.expected.admits(cur.as_ref()) {
                                redis::cmd("UNWATCH")
                                    .query_async::<()>(&mut con)
                                    .await
                                    .map_err(|e| backend("UNWATCH", e))?;
                                return Ok(Some(Commit::Conflict { index, current: cur }));
                            }
                        }
                        let mut tx = redis::pipe();
                        tx.atomic();
                        let mut etags = Vec::with_capacity(writes.len());
                        for (w, hk) in writes.iter().zip(header_keys) {
                            let ck = self.chunks_key(w.key);
                            if !w.chunks.is_empty() {
                                let mut h = tx.cmd("HSET");
                                h = h.arg(&ck);
                                for (i, c) in w.chunks.iter().enumerate() {
                                    h = h.arg(format!("{}:{i}", w.generation)).arg(*c);
                                }
                                h.ignore();
                            }
                            match &w.header {
                                Some(body) => {
                                    let etag = new_etag();
                                    tx.cmd("DEL").arg(hk).ignore();
                                    tx.cmd("HSET")
                                        .arg(hk)
                                        .arg("etag")
                                        .arg(&etag)
                                        .arg("body")
                                        .arg(body.as_slice())
                                        .ignore();
                                    tx.cmd("ZADD")
                                        .arg(self.index_key())
                                        .arg(0)
                                        .arg(member(w.key))
                                        .ignore();
                                    match w.expires_at {
                                        Some(at) => {
                                            for k in [hk, &ck] {
                                                tx.cmd("PEXPIREAT").arg(k).arg(at.as_millis()).ignore();
                                            }
                                        }
                                        None => {
                                            for k in [hk, &ck] {
                                                tx.cmd("PERSIST").arg(k).ignore();
                                            }
                                        }
                                    }
                                    etags.push(Some(Etag::new(etag)));
                                }
                                None => {
                                    tx.cmd("DEL").arg(hk).ignore();
                                    tx.cmd("ZREM").arg(self.index_key()).arg(member(w.key)).ignore();
                                    etags.push(None);
                                }
                            }
                        }
                        // An aborted EXEC answers nil.
                        let done: Option<()> =
                            tx.query_async(&mut con).await.map_err(|e| backend("EXEC", e))?;
                        Ok(done.map(|()| Commit::Done(etags)))
                    }
                    .await;
                    if r.is_err() {
                        crate::conn::discard(con);
                    }
                    r
                })
                .await
            })
            .await
    }
}

#[async_trait]
impl StateTable for RedisStateTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    fn limits(&self) -> StateLimits {
        REDIS_STATE_LIMITS
    }

    async fn read_header(&self, key: &StateKey) -> Result<Option<(Vec<u8>, Etag)>> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.header_key(key))
            .arg("etag")
            .arg("body");
        let ((etag, body),): ((Option<String>, Option<Vec<u8>>),) =
            self.query("read state header", pipe).await?;
        match (etag, body) {
            (Some(e), Some(b)) => Ok(Some((b, Etag::new(e)))),
            (None, None) => Ok(None),
            _ => Err(Error::corrupt(
                self.header_key(key),
                "a header without etag or body",
            )),
        }
    }

    async fn read_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        count: u32,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("HMGET").arg(self.chunks_key(key));
        for i in 0..count {
            cmd.arg(format!("{generation}:{i}"));
        }
        let (chunks,): (Vec<Option<Vec<u8>>>,) = self.query("read state chunks", pipe).await?;
        Ok(chunks)
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
        let ck = self.chunks_key(key);
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("HSET").arg(&ck);
        for (i, c) in chunks.iter().enumerate() {
            cmd.arg(format!("{generation}:{}", first + i as u32)).arg(*c);
        }
        cmd.ignore();
        if let Some(at) = expires_at {
            pipe.cmd("PEXPIREAT").arg(&ck).arg(at.as_millis()).ignore();
        }
        self.query("stage state chunks", pipe).await
    }

    async fn commit(&self, writes: &[HeaderWrite<'_>]) -> Result<Commit> {
        if writes.is_empty() {
            return Ok(Commit::Done(Vec::new()));
        }
        for _ in 0..EXEC_ATTEMPTS {
            if let Some(c) = self.try_commit(writes).await? {
                return Ok(c);
            }
        }
        // Still contended: report what the first header holds now.
        let current = self.read_header(writes[0].key).await?.map(|(_, e)| e);
        Ok(Commit::Conflict { index: 0, current })
    }

    async fn generations(&self, key: &StateKey) -> Result<Vec<String>> {
        let mut pipe = redis::pipe();
        pipe.cmd("HKEYS").arg(self.chunks_key(key));
        let (fields,): (Vec<String>,) = self.query("list state chunks", pipe).await?;
        let mut gens: Vec<String> = fields
            .iter()
            .filter_map(|f| f.rsplit_once(':').map(|(g, _)| g.to_owned()))
            .collect();
        gens.sort();
        gens.dedup();
        Ok(gens)
    }

    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("HKEYS").arg(self.chunks_key(key));
        let (fields,): (Vec<String>,) = self.query("list state chunks", pipe).await?;
        let gone: Vec<&String> = fields
            .iter()
            .filter(|f| f.rsplit_once(':').is_some_and(|(g, _)| g == generation))
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.cmd("HDEL").arg(self.chunks_key(key)).arg(gone).ignore();
        self.query("delete state chunks", pipe).await
    }

    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        let prefix = format!("{}%2F", escape(kind));
        let min = match after {
            Some(k) if member(k) >= prefix => format!("({}", member(k)),
            _ => format!("[{prefix}"),
        };
        // Every member of the kind sorts before `<kind>%2G`.
        let max = format!("({}%2G", escape(kind));
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGEBYLEX")
            .arg(self.index_key())
            .arg(min)
            .arg(max)
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        let (members,): (Vec<String>,) = self.query("list states", pipe).await?;
        Ok(members.iter().filter_map(|m| key_of_member(m)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_through_escaping() {
        for (a, n) in [("cart/1", "s"), ("c%rt/{x}:y/z", "n/ä:%")] {
            let k = StateKey::new(a, n).unwrap();
            assert_eq!(key_of_member(&member(&k)), Some(k));
        }
    }
}

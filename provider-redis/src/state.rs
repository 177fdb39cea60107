//! The grain-state table on Redis. Keys are tagged by the actor's shard
//! (`{r:<service>:<shard>}`, [`actor_shard`] over the service's shard count:
//! its reminder service's, read once per table, recorded as
//! [`DEFAULT_SHARDS`] if none is): one actor's states share a Redis Cluster
//! slot (so a write of several of them is one script), and a service's states
//! spread over every master of a cluster. The tag is the one of the same
//! shard's reminder rows and lease, so a commit fenced by that lease
//! ([`Fence`]) compares the lease's `fence` field in the same script.
//!
//! (An unreleased layout tagged them `{s:<service>:<shard>}` over 1,024
//! shards; no released version stored actor state, so nothing is moved.)
//!
//! The keys (headers, chunk hashes, generation sets, the index) are in the
//! [key layout](crate::keys).
//!
//! A commit is one Lua script (one round trip) over the headers it compares and
//! the chunks it writes inline: every compare first, then every write, or
//! nothing. An expiry sets `PEXPIREAT` on the header and on the key of the
//! written generation only, so a failed write with an expiry cannot touch the
//! live generation's chunks (the first layout kept every generation in one hash
//! and did). The index is written before a commit that may create a state
//! (`Expected::Absent` or `Any`): it may list a state that a failed write never
//! created (the contract allows that), never miss one.
//!
//! Actor ids and names are escaped as in every other key.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use rollcall_core::state::{replaced_generation, row_head_len, Commit, HeaderWrite, StateLimits, StateTable};
use rollcall_core::{actor_shard, Error, Etag, Expected, Fence, Result, StateKey, Timestamp, DEFAULT_SHARDS};

use crate::conn::Router;
use crate::keys::{escape, unescape, ReminderKeys};
use crate::new_etag;

/// Redis' limits for states: 4 MiB chunks, 16 MiB and 64 rows per transaction
/// (a value may hold 512 MB; these keep one command's reply time small).
pub const REDIS_STATE_LIMITS: StateLimits = StateLimits {
    chunk_bytes: 4 * 1024 * 1024,
    txn_bytes: 16 * 1024 * 1024,
    txn_rows: 64,
    max_state_bytes: rollcall_core::state::MAX_STATE_BYTES,
};

/// The commit. KEYS: per write, its header, its generation's chunk hash and its
/// generations set. ARGV[1]: the number of writes; then per write: the
/// precondition (`absent`, `etag`, `any`), the expected etag, the new etag, `1`
/// to delete the header, the row's head, the row's data, the expiry (ms, or
/// empty), the generation, the `g` field (see [`published_field`]), the number
/// of inline chunks, the chunks. Answers `{-1, replaced...}` when every write is
/// done (per write, what the header it replaced says it published: its `g`
/// field or, for a header written before that field, its head; or nil), `{i}`
/// or `{i, current etag}` when the compare of write `i` (from 0) failed and
/// nothing was written.
static COMMIT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(COMMIT_BODY));

const COMMIT_BODY: &str = r"
local n = tonumber(ARGV[1])
local olds = {}
local a = 2
for i = 1, n do
  local cur = redis.call('HMGET', KEYS[3 * i - 2], 'etag', 'g')
  local mode = ARGV[a]
  local ok = (mode == 'any') or (mode == 'absent' and not cur[1]) or (mode == 'etag' and cur[1] == ARGV[a + 1])
  if not ok then
    if cur[1] then return {i - 1, cur[1]} end
    return {i - 1}
  end
  olds[i] = cur[2]
  if cur[1] and not cur[2] then olds[i] = redis.call('HGET', KEYS[3 * i - 2], 'body') end
  a = a + 10 + tonumber(ARGV[a + 9])
end
local done = {-1}
a = 2
for i = 1, n do
  local hk, ck, gs = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local chunks, exp = tonumber(ARGV[a + 9]), ARGV[a + 6]
  done[i + 1] = olds[i] or false
  if chunks > 0 then
    for j = 0, chunks - 1 do
      redis.call('HSET', ck, tostring(j), ARGV[a + 10 + j])
    end
    redis.call('SADD', gs, ARGV[a + 7])
    if exp ~= '' then redis.call('PEXPIREAT', ck, exp) end
  end
  if ARGV[a + 3] == '1' then
    redis.call('DEL', hk)
  else
    redis.call('HSET', hk, 'etag', ARGV[a + 2], 'body', ARGV[a + 4], 'data', ARGV[a + 5], 'g', ARGV[a + 8])
    if exp ~= '' then
      redis.call('PEXPIREAT', hk, exp)
    elseif olds[i] then
      redis.call('PERSIST', hk)
    end
  end
  a = a + 10 + chunks
end
return done
";

/// What a fenced commit runs first: KEYS[#KEYS] is the lease hash of the
/// fence's shard, ARGV[#ARGV] the fence's epoch; answers `{-2, token or
/// false}` when the lease's `fence` field differs (nothing written).
const FENCE_CHECK: &str = r"
local fence = redis.call('HGET', KEYS[#KEYS], 'fence')
if fence ~= ARGV[#ARGV] then return {-2, fence or false} end
";

/// [`COMMIT`] behind [`FENCE_CHECK`].
static COMMIT_FENCED: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{FENCE_CHECK}{COMMIT_BODY}")));

/// [`COMMIT_ONE`] behind [`FENCE_CHECK`].
static COMMIT_ONE_FENCED: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&format!("{FENCE_CHECK}{COMMIT_ONE_BODY}")));

/// The commit of one header row and nothing else (a small state's write: the
/// common case, kept to the fewest Lua steps). KEYS[1]: the header. ARGV: the
/// precondition, the expected etag, the new etag, the head, the data, the `g`
/// field, the expiry (ms, or empty). Answers as [`COMMIT`] for one write.
static COMMIT_ONE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(COMMIT_ONE_BODY));

const COMMIT_ONE_BODY: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'etag', 'g')
local m = ARGV[1]
if not ((m == 'any') or (m == 'absent' and not cur[1]) or (m == 'etag' and cur[1] == ARGV[2])) then
  return {0, cur[1]}
end
local old = cur[2]
if cur[1] and not old then old = redis.call('HGET', KEYS[1], 'body') end
redis.call('HSET', KEYS[1], 'etag', ARGV[3], 'body', ARGV[4], 'data', ARGV[5], 'g', ARGV[6])
if ARGV[7] ~= '' then
  redis.call('PEXPIREAT', KEYS[1], ARGV[7])
elseif cur[1] then
  redis.call('PERSIST', KEYS[1])
end
return {-1, old or false}
";

/// The header's `g` field: `g` and the generation whose chunk rows the row
/// publishes, or `g` alone for a state without chunk rows. A commit reads this
/// field of the header it replaces rather than the whole head; a header written
/// before the field existed has none and the commit returns its head instead
/// (which never starts with `g`: see [`replaced_of`]).
fn published_field(head: &[u8]) -> Vec<u8> {
    let mut f = b"g".to_vec();
    if let Some(g) = replaced_generation(head) {
        f.extend_from_slice(g.as_bytes());
    }
    f
}

/// What a commit's reply says a replaced header published.
fn replaced_of(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => match b.strip_prefix(b"g") {
            Some([]) => None,
            Some(g) => std::str::from_utf8(g).ok().map(str::to_owned),
            None => replaced_generation(b),
        },
        _ => None,
    }
}

/// The grain-state table of one service on Redis.
#[derive(Debug, Clone)]
pub struct RedisStateTable {
    router: Arc<Router>,
    prefix: String,
    service: String,
    service_id: String,
    /// The keys of the service's shard leases (a fenced commit compares one).
    lease_keys: ReminderKeys,
    /// The service's shard count, once read ([`Self::shards`]).
    shards: Arc<tokio::sync::OnceCell<u32>>,
}

fn member(key: &StateKey) -> String {
    format!("{}/{}", escape(key.actor_id()), escape(key.name()))
}

/// The keys of a state under `base` (its actor's `<prefix>:{<tag>}`), for
/// member `m` (`<actor>/<name>`, escaped): its header, the chunk hash of a
/// generation, the set of its generations.
fn header_key_at(base: &str, m: &str) -> String {
    format!("{base}:h:{m}")
}

fn chunks_key_at(base: &str, m: &str, generation: &str) -> String {
    format!("{base}:c:{m}:{generation}")
}

fn generations_key_at(base: &str, m: &str) -> String {
    format!("{base}:gs:{m}")
}

fn key_of_member(m: &str) -> Option<StateKey> {
    let (a, n) = m.split_once('/')?;
    StateKey::new(unescape(a)?, unescape(n)?).ok()
}

/// Whether a commit's reply says it wrote (`[-1, ...]`).
fn committed(reply: &[redis::Value]) -> bool {
    matches!(reply.first(), Some(redis::Value::Int(-1)))
}

impl RedisStateTable {
    /// A failed commit as the write machine must see it: with `wait_replicas`, a
    /// commit that may be applied but is not known to be on the replicas (a
    /// `WAIT` that fell short, a timeout, a lost connection) is
    /// [`Error::OutcomeUnknown`], which no read of the header decides (a read
    /// finds it on the primary whether or not a failover keeps it).
    fn undecidable(&self, key: &StateKey, e: Error) -> Error {
        if self.router.waits() && crate::conn::maybe_unreplicated(&e) {
            return Error::OutcomeUnknown {
                key: key.to_string(),
                reason: e.to_string(),
            };
        }
        e
    }

    pub(crate) fn new(router: Arc<Router>, prefix: &str, service_id: &str) -> Self {
        RedisStateTable {
            router,
            prefix: prefix.to_owned(),
            service: escape(service_id),
            service_id: service_id.to_owned(),
            lease_keys: ReminderKeys::new(prefix, service_id),
            shards: Arc::default(),
        }
    }

    /// The hash tag of `key`'s actor: its shard's among the service's
    /// `shards`, the tag of that shard's reminder rows and lease
    /// (`r:<service>:<shard>`), so a commit fenced by the lease is one script
    /// in one slot.
    fn tag(&self, key: &StateKey, shards: u32) -> String {
        self.lease_keys.shard_tag(actor_shard(key.actor_id(), shards))
    }

    fn base(&self, key: &StateKey, shards: u32) -> String {
        format!("{}:{{{}}}", self.prefix, self.tag(key, shards))
    }

    fn header_key(&self, key: &StateKey, shards: u32) -> String {
        header_key_at(&self.base(key, shards), &member(key))
    }

    fn chunks_key(&self, key: &StateKey, generation: &str, shards: u32) -> String {
        chunks_key_at(&self.base(key, shards), &member(key), generation)
    }

    fn generations_key(&self, key: &StateKey, shards: u32) -> String {
        generations_key_at(&self.base(key, shards), &member(key))
    }

    /// The service's shard count: the one its reminder service and leases
    /// use, read (or recorded as [`DEFAULT_SHARDS`]) once per table.
    async fn shards(&self) -> Result<u32> {
        self.shards
            .get_or_try_init(|| {
                crate::lease::record_shard_count(&self.router, &self.lease_keys, DEFAULT_SHARDS)
            })
            .await
            .copied()
    }

    fn index_tag(&self) -> String {
        format!("g:{}", self.service)
    }

    fn index_key(&self) -> String {
        format!("{}:{{{}}}:index", self.prefix, self.index_tag())
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
        let s = self.shards().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.header_key(key, s))
            .arg("etag")
            .arg("body")
            .arg("data");
        let ((etag, body, data),): ((Option<String>, Option<Vec<u8>>, Option<Vec<u8>>),) = self
            .router
            .pipeline(&self.tag(key, s), "read state header", &pipe)
            .await?;
        match (etag, body) {
            (Some(e), Some(mut b)) => {
                if let Some(d) = data.filter(|d| !d.is_empty()) {
                    b.extend_from_slice(&d);
                }
                Ok(Some((b, Etag::new(e))))
            }
            (None, None) => Ok(None),
            _ => Err(Error::corrupt(
                self.header_key(key, s),
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
        let s = self.shards().await?;
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("HMGET").arg(self.chunks_key(key, generation, s));
        for i in 0..count {
            cmd.arg(i);
        }
        let (chunks,): (Vec<Option<Vec<u8>>>,) = self
            .router
            .pipeline(&self.tag(key, s), "read state chunks", &pipe)
            .await?;
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
        let s = self.shards().await?;
        let ck = self.chunks_key(key, generation, s);
        let mut pipe = redis::pipe();
        let cmd = pipe.cmd("HSET").arg(&ck);
        for (i, c) in chunks.iter().enumerate() {
            cmd.arg(first + i as u32).arg(*c);
        }
        cmd.ignore();
        pipe.cmd("SADD")
            .arg(self.generations_key(key, s))
            .arg(generation)
            .ignore();
        // This generation's key only: the published one is never touched.
        if let Some(at) = expires_at {
            pipe.cmd("PEXPIREAT").arg(&ck).arg(at.as_millis()).ignore();
        }
        self.router
            .pipeline(&self.tag(key, s), "stage state chunks", &pipe)
            .await
    }

    async fn commit(&self, writes: &[HeaderWrite<'_>], fence: Option<&Fence>) -> Result<Commit> {
        let Some(first) = writes.first() else {
            return Ok(Commit::Done {
                etags: Vec::new(),
                replaced: Vec::new(),
            });
        };
        // One actor, one tag (the tag is the actor's shard).
        if writes.iter().any(|w| w.key.actor_id() != first.key.actor_id()) {
            return Err(Error::invalid_input(
                "states",
                "a commit writes the states of one actor",
            ));
        }
        if writes
            .iter()
            .any(|w| w.header.is_some() && !matches!(w.expected, Expected::Etag(_)))
        {
            // It may create a state: list it first (never miss one).
            let mut pipe = redis::pipe();
            pipe.cmd("ZADD").arg(self.index_key()).arg("NX");
            for w in writes {
                pipe.arg(0).arg(member(w.key));
            }
            pipe.ignore();
            self.router
                .pipeline::<()>(&self.index_tag(), "index states", &pipe)
                .await?;
        }
        let s = self.shards().await?;
        if let Some(f) = fence {
            // The lease is in the headers' slot when the fence counts the
            // service's shards as the table does.
            if f.shards != s {
                return Err(Error::invalid_input(
                    "fence",
                    format!(
                        "the fence counts {} shards; service `{}` has {s}",
                        f.shards, self.service_id
                    ),
                ));
            }
        }
        // Appended to a fenced script's keys and arguments (FENCE_CHECK).
        let fence_key = fence.map(|f| self.lease_keys.lease(f.shard));
        let fence_token = fence.map(Fence::token);
        let base = self.base(first.key, s);
        let tag = self.tag(first.key, s);
        let mut etags = Vec::with_capacity(writes.len());
        let reply: Vec<redis::Value> = match writes {
            [w] if w.chunks.is_empty() && w.header.is_some() => {
                // One header row: the short script.
                let etag = new_etag();
                let row = w.header.unwrap_or_default();
                let (head, data) = row.split_at(row_head_len(row));
                let (mode, expected) = crate::lease::precondition(&w.expected);
                let expiry = w
                    .expires_at
                    .map(|t| t.as_millis().to_string())
                    .unwrap_or_default();
                let g = published_field(head);
                let mut args: Vec<&[u8]> = vec![
                    mode.as_bytes(),
                    expected.as_bytes(),
                    etag.as_bytes(),
                    head,
                    data,
                    &g,
                    expiry.as_bytes(),
                ];
                let mut keys = vec![header_key_at(&base, &member(w.key))];
                keys.extend(fence_key.clone());
                args.extend(fence_token.as_ref().map(String::as_bytes));
                etags.push(Some(Etag::new(etag.clone())));
                self.router
                    .invoke_write(
                        &tag,
                        "state commit",
                        if fence.is_some() {
                            &COMMIT_ONE_FENCED
                        } else {
                            &COMMIT_ONE
                        },
                        &keys,
                        &args,
                        |r: &Vec<redis::Value>| committed(r),
                    )
                    .await
                    .map_err(|e| self.undecidable(first.key, e))?
            }
            _ => {
                let mut keys = Vec::with_capacity(writes.len() * 3);
                let mut args: Vec<Vec<u8>> = vec![writes.len().to_string().into_bytes()];
                for w in writes {
                    let m = member(w.key);
                    keys.push(header_key_at(&base, &m));
                    keys.push(chunks_key_at(&base, &m, w.generation));
                    keys.push(generations_key_at(&base, &m));
                    let (mode, expected) = crate::lease::precondition(&w.expected);
                    let etag = w.header.as_ref().map(|_| new_etag());
                    args.push(mode.into());
                    args.push(expected.into());
                    args.push(etag.clone().unwrap_or_default().into_bytes());
                    args.push(if w.header.is_some() {
                        b"0".to_vec()
                    } else {
                        b"1".to_vec()
                    });
                    let row = w.header.unwrap_or_default();
                    let (head, data) = row.split_at(row_head_len(row));
                    args.push(head.to_vec());
                    args.push(data.to_vec());
                    args.push(
                        w.expires_at
                            .map(|t| t.as_millis().to_string())
                            .unwrap_or_default()
                            .into_bytes(),
                    );
                    args.push(w.generation.as_bytes().to_vec());
                    args.push(published_field(head));
                    args.push(w.chunks.len().to_string().into_bytes());
                    args.extend(w.chunks.iter().map(|c| c.to_vec()));
                    etags.push(etag.map(Etag::new));
                }
                keys.extend(fence_key.clone());
                args.extend(fence_token.clone().map(String::into_bytes));
                self.router
                    .invoke_write(
                        &tag,
                        "state commit",
                        if fence.is_some() { &COMMIT_FENCED } else { &COMMIT },
                        &keys,
                        &args,
                        |r: &Vec<redis::Value>| committed(r),
                    )
                    .await
                    .map_err(|e| self.undecidable(first.key, e))?
            }
        };
        let deleted: Vec<&StateKey> = writes
            .iter()
            .filter(|w| w.header.is_none())
            .map(|w| w.key)
            .collect();
        match reply.as_slice() {
            [redis::Value::Int(-1), old @ ..] => {
                let replaced = old.iter().map(replaced_of).collect();
                if !deleted.is_empty() {
                    // No header left: no longer listed (best effort; a listing may
                    // include a state that is gone).
                    let mut pipe = redis::pipe();
                    pipe.cmd("ZREM").arg(self.index_key());
                    for k in deleted {
                        pipe.arg(member(k));
                    }
                    pipe.ignore();
                    if let Err(e) = self
                        .router
                        .pipeline::<()>(&self.index_tag(), "unindex states", &pipe)
                        .await
                    {
                        tracing::debug!(error = %e, "removing deleted states from the index failed");
                    }
                }
                Ok(Commit::Done { etags, replaced })
            }
            [redis::Value::Int(-2), token] => Ok(Commit::Fenced {
                current: match token {
                    redis::Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()),
                    _ => None,
                },
            }),
            [redis::Value::Int(i), rest @ ..] if *i >= 0 && (*i as usize) < writes.len() => {
                let current = match rest.first() {
                    None | Some(redis::Value::Nil) => None,
                    Some(v) => Some(Etag::new(redis::from_redis_value::<String>(v.clone()).map_err(
                        |e| Error::backend(format!("state commit: unexpected etag in the reply: {e}")),
                    )?)),
                };
                Ok(Commit::Conflict {
                    index: *i as usize,
                    current,
                })
            }
            other => Err(Error::backend(format!(
                "state commit: unexpected reply {other:?}"
            ))),
        }
    }

    async fn generations(&self, key: &StateKey) -> Result<Vec<String>> {
        let s = self.shards().await?;
        let tag = self.tag(key, s);
        let mut pipe = redis::pipe();
        pipe.cmd("SMEMBERS").arg(self.generations_key(key, s));
        let (mut gens,): (Vec<String>,) = self
            .router
            .pipeline(&tag, "list state generations", &pipe)
            .await?;
        gens.sort();
        if gens.is_empty() {
            return Ok(gens);
        }
        // A generation whose chunk hash expired is gone: drop it from the set.
        let mut pipe = redis::pipe();
        for g in &gens {
            pipe.cmd("EXISTS").arg(self.chunks_key(key, g, s));
        }
        let exists: Vec<bool> = self
            .router
            .pipeline(&tag, "check state generations", &pipe)
            .await?;
        let (live, gone): (Vec<_>, Vec<_>) = gens.into_iter().zip(exists).partition(|(_, e)| *e);
        if !gone.is_empty() {
            let mut pipe = redis::pipe();
            pipe.cmd("SREM").arg(self.generations_key(key, s));
            for (g, _) in &gone {
                pipe.arg(g);
            }
            pipe.ignore();
            self.router
                .pipeline::<()>(&tag, "forget expired state generations", &pipe)
                .await?;
        }
        Ok(live.into_iter().map(|(g, _)| g).collect())
    }

    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()> {
        let s = self.shards().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(self.chunks_key(key, generation, s)).ignore();
        pipe.cmd("SREM")
            .arg(self.generations_key(key, s))
            .arg(generation)
            .ignore();
        self.router
            .pipeline(&self.tag(key, s), "delete state chunks", &pipe)
            .await
    }

    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        rollcall_core::KeyLimits::CORE.check_kind(kind)?;
        let prefix = format!("{}%2F", escape(kind));
        let mut min = match after {
            Some(k) if member(k) >= prefix => format!("({}", member(k)),
            _ => format!("[{prefix}"),
        };
        // Every member of the kind sorts before `<kind>%2G`.
        let max = format!("({}%2G", escape(kind));
        let limit = limit.max(1);
        loop {
            let mut pipe = redis::pipe();
            pipe.cmd("ZRANGEBYLEX")
                .arg(self.index_key())
                .arg(&min)
                .arg(&max)
                .arg("LIMIT")
                .arg(0)
                .arg(limit);
            let (members,): (Vec<String>,) = self
                .router
                .pipeline(&self.index_tag(), "list states", &pipe)
                .await?;
            let keys: Vec<StateKey> = members.iter().filter_map(|m| key_of_member(m)).collect();
            // A full page of members that are not keys (written by something
            // else) does not end the listing: page on past them.
            match members.last() {
                Some(last) if keys.is_empty() && members.len() == limit => min = format!("({last}"),
                _ => return Ok(keys),
            }
        }
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

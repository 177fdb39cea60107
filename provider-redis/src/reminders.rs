//! The reminder table on Redis: one key per reminder plus, per shard, a sorted
//! set of members scored by the 32-bit actor hash (exact in a double) for
//! ring-range reads.
//!
//! The keys (the shard count S, per shard a ring and one key per reminder) are
//! in the [key layout](crate::keys); S is [`DEFAULT_SHARDS`] unless the shard
//! leases recorded another.
//!
//! Shard `k` = [`actor_shard`]`(actor id, S)`, the function that places actor
//! state too: a service's reminders spread over every master of a Redis Cluster
//! (the first layout tagged every key of a service alike: one slot, one master),
//! and a shard's rows and its lease share a slot. A ring range is read shard by
//! shard, pipelined per node. The first use of a service moves the rows of the
//! first layout (`{r:<service>}:ring` and `:rem:`) into their shards, each with
//! `SET NX` (a row already in its shard is newer) and then deleted.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use rollcall_core::KeyLimits;
use rollcall_core::{
    actor_hash, hash_shard, Error, Etag, Fence, ReminderEntry, ReminderTable, Result, RunRecord, Timestamp,
    DEFAULT_SHARDS,
};
use tokio::sync::OnceCell;

use crate::conn::{backend, Node, Router};
use crate::keys::{escape, ReminderKeys};
use crate::new_etag;

/// Deletes every reminder row and the ring of one service, atomically (a script runs
/// without interleaving). KEYS[1] = ring, ARGV[1] = row key prefix.
static CLEAR: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, m in ipairs(members) do redis.call('DEL', ARGV[1] .. m) end
redis.call('DEL', KEYS[1])
local runs = redis.call('SMEMBERS', KEYS[2])
for _, m in ipairs(runs) do redis.call('DEL', ARGV[2] .. m) end
redis.call('DEL', KEYS[2])
return #members
",
    )
});

/// Appends ARGV[1] to the run history KEYS[1] unless it is already its newest
/// record (a retried append that landed), keeps the newest ARGV[2], and
/// indexes ARGV[3] in KEYS[2].
static APPEND_RUN: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if KEYS[3] and redis.call('HGET', KEYS[3], 'fence') ~= ARGV[4] then return -2 end
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then return 0 end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[2]) - 1)
redis.call('SADD', KEYS[2], ARGV[3])
return 1
",
    )
});

/// The reminder table of one service on Redis.
#[derive(Debug, Clone)]
pub struct RedisReminderTable {
    router: Arc<Router>,
    keys: ReminderKeys,
    service_id: String,
    /// The service's shard count, once read (and the first layout's rows moved).
    shards: Arc<OnceCell<u32>>,
}

fn decode(raw: &str, key: &str) -> Result<ReminderEntry> {
    let e: ReminderEntry = serde_json::from_str(raw).map_err(|e| Error::corrupt(key, e))?;
    if e.etag.is_empty() {
        return Err(Error::corrupt(key, "empty etag"));
    }
    if e.hash != actor_hash(&e.actor_id) {
        return Err(Error::corrupt(key, "hash does not match actor id"));
    }
    Ok(e)
}

impl RedisReminderTable {
    pub(crate) fn new(router: Arc<Router>, prefix: &str, service_id: &str) -> Self {
        RedisReminderTable {
            router,
            keys: ReminderKeys::new(prefix, service_id),
            service_id: service_id.to_owned(),
            shards: Arc::new(OnceCell::new()),
        }
    }

    /// The shard count (recorded as [`DEFAULT_SHARDS`] if the service has
    /// none), after moving the rows of the first layout on first use.
    async fn shards(&self) -> Result<u32> {
        self.shards
            .get_or_try_init(|| async {
                let n = crate::lease::record_shard_count(&self.router, &self.keys, DEFAULT_SHARDS).await?;
                self.move_legacy_rows(n).await?;
                Ok(n)
            })
            .await
            .copied()
    }

    /// Moves the rows of the first layout (every reminder under the service's
    /// tag) into their shards: each row `SET NX` in its shard (a row already
    /// there was written later), then deleted from the first layout.
    async fn move_legacy_rows(&self, shards: u32) -> Result<()> {
        let tag = self.keys.service_tag();
        loop {
            let cmd = redis::cmd("ZRANGE")
                .arg(self.keys.legacy_ring())
                .arg(0)
                .arg(499)
                .arg("WITHSCORES")
                .clone();
            let page: Vec<(String, f64)> = self.router.query(&tag, "read legacy ring", &cmd).await?;
            if page.is_empty() {
                return Ok(());
            }
            let keys: Vec<String> = page.iter().map(|(m, _)| self.keys.legacy_row(m)).collect();
            let cmd = redis::cmd("MGET").arg(&keys).clone();
            let rows: Vec<Option<String>> = self.router.query(&tag, "read legacy rows", &cmd).await?;
            for (((member, score), key), raw) in page.iter().zip(&keys).zip(rows) {
                if let Some(raw) = raw {
                    match decode(&raw, key) {
                        Ok(e) => {
                            let k = hash_shard(e.hash, shards);
                            let mut p = redis::pipe();
                            p.atomic()
                                .cmd("SET")
                                .arg(self.keys.row(k, member))
                                .arg(&raw)
                                .arg("NX")
                                .ignore()
                                .zadd(self.keys.ring(k), member, *score)
                                .ignore();
                            let () = self
                                .router
                                .pipeline(&self.keys.shard_tag(k), "move legacy row", &p)
                                .await?;
                        }
                        Err(e) => {
                            // Kept where it is (not lost), no longer in the ring.
                            tracing::warn!(key = %key, error = %e, "a reminder row of the first layout does not decode; left in place");
                            let cmd = redis::cmd("ZREM")
                                .arg(self.keys.legacy_ring())
                                .arg(member)
                                .clone();
                            let _: i64 = self.router.query(&tag, "drop legacy member", &cmd).await?;
                            continue;
                        }
                    }
                }
                let mut p = redis::pipe();
                p.atomic()
                    .del(key)
                    .ignore()
                    .zrem(self.keys.legacy_ring(), member)
                    .ignore();
                let () = self.router.pipeline(&tag, "delete legacy row", &p).await?;
            }
        }
    }

    /// Reads the rows of `members` (shard, member); rows removed meanwhile are
    /// skipped. One `MGET` per shard and 1,000 members, pipelined per node.
    async fn rows_of(&self, members: Vec<(u32, String)>) -> Result<Vec<ReminderEntry>> {
        let mut by_shard: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for (k, m) in members {
            by_shard.entry(k).or_default().push(self.keys.row(k, &m));
        }
        let mut gets = Vec::new();
        for (k, keys) in by_shard {
            for chunk in keys.chunks(1000) {
                gets.push((k, chunk.to_vec()));
            }
        }
        let cmds: Vec<(String, redis::Cmd)> = gets
            .iter()
            .map(|(k, keys)| (self.keys.shard_tag(*k), redis::cmd("MGET").arg(keys).clone()))
            .collect();
        let values: Vec<Vec<Option<String>>> = self.router.query_each("read rows", &cmds).await?;
        let mut out = Vec::new();
        for ((_, keys), values) in gets.iter().zip(values) {
            for (key, v) in keys.iter().zip(values) {
                if let Some(raw) = v {
                    out.push(decode(&raw, key)?);
                }
            }
        }
        Ok(out)
    }

    /// `WATCH` + `GET` of the row of `member` (in shard `k`) in one round trip;
    /// if it holds `etag`, runs the transaction `write(row, row_key)` builds
    /// (which must keep exactly one reply) with `MULTI ... EXEC`. `Ok(false)` for
    /// a missing row, another etag, or a row changed between the `GET` and the
    /// `EXEC`.
    /// Under `fence`, the checks before anything is sent: the fence is this
    /// service's, its shard count the table's and its shard the row's.
    fn check_fence(&self, fence: Option<&Fence>, actor_id: &str, shards: u32) -> Result<()> {
        let Some(f) = fence else { return Ok(()) };
        f.check_reminder(&self.service_id, actor_id)?;
        if f.shards != shards {
            return Err(Error::invalid_input(
                "fence",
                format!(
                    "the fence counts {} shards; service `{}` has {shards}",
                    f.shards, self.service_id
                ),
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn when_etag_matches<F>(
        &self,
        what: &'static str,
        k: u32,
        (actor_id, name): (&str, &str),
        member: &str,
        etag: &Etag,
        fence: Option<&Fence>,
        write: F,
    ) -> Result<bool>
    where
        F: Fn(ReminderEntry, &str) -> Result<redis::Pipeline>,
    {
        let row_key = self.keys.row(k, member);
        // Under a fence the shard's lease hash (same slot) is watched and its
        // fence field compared too; its writes (the holder's own checkpoints)
        // abort the EXEC, which is then tried again.
        let lease_key = fence.map(|_| self.keys.lease(k));
        let (row_key, lease_key, write) = (&row_key, &lease_key, &write);
        self.router
            .run(&self.keys.shard_tag(k), |node: Arc<Node>| async move {
                node.timed(what, async {
                    let mut con = node.dedicated().await?;
                    let r = async {
                        for _ in 0..16 {
                            // Pooled connections never carry a WATCH (conn::WatchConnections).
                            let mut read = redis::pipe();
                            read.cmd("WATCH")
                                .arg(row_key)
                                .arg(lease_key.as_slice())
                                .ignore()
                                .get(row_key);
                            if let Some(lease) = lease_key {
                                read.hget(lease, "fence");
                            } else {
                                // Keeps the reply's shape.
                                read.cmd("ECHO").arg("");
                            }
                            let (raw, token): (Option<String>, Option<String>) = read
                                .query_async(&mut con)
                                .await
                                .map_err(|e| backend("WATCH and GET", e))?;
                            if let Some(f) = fence {
                                if token.as_deref() != Some(f.token().as_str()) {
                                    redis::cmd("UNWATCH")
                                        .query_async::<()>(&mut con)
                                        .await
                                        .map_err(|e| backend("UNWATCH", e))?;
                                    let current = token.and_then(|t| t.parse().ok());
                                    return Err(f.refused_reminder(actor_id, name, current));
                                }
                            }
                            let row = match raw {
                                Some(r) => Some(decode(&r, row_key)?).filter(|row| row.etag == *etag),
                                None => None,
                            };
                            let Some(row) = row else {
                                redis::cmd("UNWATCH")
                                    .query_async::<()>(&mut con)
                                    .await
                                    .map_err(|e| backend("UNWATCH", e))?;
                                return Ok(false);
                            };
                            // An aborted EXEC answers nil.
                            let done: Option<(redis::Value,)> = write(row, row_key)?
                                .query_async(&mut con)
                                .await
                                .map_err(|e| backend("EXEC", e))?;
                            if done.is_some() {
                                // Acknowledged only once the replicas asked for have it.
                                node.wait_for_replicas(&mut con).await?;
                                return Ok(true);
                            }
                            if fence.is_none() {
                                // Only the row was watched: it changed.
                                return Ok(false);
                            }
                        }
                        Err(Error::backend(format!(
                            "{row_key}: 16 fenced writes aborted in a row"
                        )))
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

    /// The members (shard, member) with a hash in `lo..=hi`, shard by shard.
    async fn members_between(&self, lo: u32, hi: u32) -> Result<Vec<(u32, String)>> {
        let shards = self.shards().await?;
        let ks: Vec<u32> = (hash_shard(lo, shards)..=hash_shard(hi, shards)).collect();
        let cmds: Vec<(String, redis::Cmd)> = ks
            .iter()
            .map(|&k| {
                let cmd = redis::cmd("ZRANGEBYSCORE")
                    .arg(self.keys.ring(k))
                    .arg(lo)
                    .arg(hi)
                    .clone();
                (self.keys.shard_tag(k), cmd)
            })
            .collect();
        let found: Vec<Vec<String>> = self.router.query_each("ring range", &cmds).await?;
        Ok(ks
            .into_iter()
            .zip(found)
            .flat_map(|(k, ms)| ms.into_iter().map(move |m| (k, m)))
            .collect())
    }
}

#[async_trait]
impl ReminderTable for RedisReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        self.shards().await.map(|_| ())
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        KeyLimits::CORE.check_actor_id(actor_id)?;
        let h = actor_hash(actor_id);
        let prefix = format!("{}/", escape(actor_id));
        let members: Vec<(u32, String)> = self
            .members_between(h, h)
            .await?
            .into_iter()
            .filter(|(_, m)| m.starts_with(&prefix))
            .collect();
        self.rows_of(members).await
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        // (begin, end], or (begin, MAX] and [0, end] when it wraps.
        let mut members = Vec::new();
        if begin < end {
            members = self.members_between(begin + 1, end).await?;
        } else {
            if begin < u32::MAX {
                members = self.members_between(begin + 1, u32::MAX).await?;
            }
            members.extend(self.members_between(0, end).await?);
        }
        self.rows_of(members).await
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let k = hash_shard(actor_hash(actor_id), self.shards().await?);
        let key = self.keys.row(k, &ReminderKeys::member(actor_id, name));
        let cmd = redis::cmd("GET").arg(&key).clone();
        let raw: Option<String> = self
            .router
            .query(&self.keys.shard_tag(k), "read_row", &cmd)
            .await?;
        raw.map(|r| decode(&r, &key)).transpose()
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id, &KeyLimits::CORE)?;
        let k = hash_shard(entry.hash, self.shards().await?);
        let etag = Etag::new(new_etag());
        let stored = ReminderEntry {
            etag: etag.clone(),
            ..entry.clone()
        };
        let json =
            serde_json::to_string(&stored).map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
        let member = ReminderKeys::member(&entry.actor_id, &entry.name);
        let mut p = redis::pipe();
        p.atomic()
            .set(self.keys.row(k, &member), json)
            .ignore()
            .zadd(self.keys.ring(k), &member, f64::from(entry.hash))
            .ignore();
        let () = self
            .router
            .pipeline_write(&self.keys.shard_tag(k), "upsert_row", &p)
            .await?;
        Ok(etag)
    }

    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let shards = self.shards().await?;
        self.check_fence(fence, actor_id, shards)?;
        let k = hash_shard(actor_hash(actor_id), shards);
        let member = ReminderKeys::member(actor_id, name);
        let ring = self.keys.ring(k);
        self.when_etag_matches(
            "remove_row",
            k,
            (actor_id, name),
            &member,
            etag,
            fence,
            |_, row_key| {
                let mut p = redis::pipe();
                p.atomic().del(row_key).ignore().zrem(&ring, &member);
                Ok(p)
            },
        )
        .await
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let shards = self.shards().await?;
        self.check_fence(fence, actor_id, shards)?;
        let k = hash_shard(actor_hash(actor_id), shards);
        let member = ReminderKeys::member(actor_id, name);
        self.when_etag_matches(
            "update_last_fired",
            k,
            (actor_id, name),
            &member,
            etag,
            fence,
            |mut row, row_key| {
                // Same JSON with the same etag: handles holding it stay valid.
                row.last_fired = Some(fired_at);
                let json = serde_json::to_string(&row)
                    .map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
                let mut p = redis::pipe();
                // EXISTS is the one reply kept: a committed EXEC is a non-empty array.
                p.atomic().set(row_key, json).ignore().exists(row_key);
                Ok(p)
            },
        )
        .await
    }

    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let k = hash_shard(actor_hash(actor_id), self.shards().await?);
        let member = ReminderKeys::member(actor_id, name);
        self.when_etag_matches(
            "update_paused",
            k,
            (actor_id, name),
            &member,
            etag,
            None,
            |mut row, row_key| {
                // Same JSON with the same etag, as update_last_fired.
                row.paused = paused;
                let json = serde_json::to_string(&row)
                    .map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
                let mut p = redis::pipe();
                p.atomic().set(row_key, json).ignore().exists(row_key);
                Ok(p)
            },
        )
        .await
    }

    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &RunRecord,
        keep: usize,
        fence: Option<&Fence>,
    ) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        rollcall_core::check_run_keep(keep)?;
        let shards = self.shards().await?;
        self.check_fence(fence, actor_id, shards)?;
        let k = hash_shard(actor_hash(actor_id), shards);
        let member = ReminderKeys::member(actor_id, name);
        let json = serde_json::to_string(run).map_err(|e| Error::backend(format!("encode run: {e}")))?;
        // One slot (the shard's tag): the fence's compare, the push, the trim
        // and the index in one script (and a `WAIT` for the replicas when the
        // store asks for one).
        let mut keys = vec![self.keys.runs(k, &member), self.keys.runs_index(k)];
        let mut args = vec![json, keep.to_string(), member];
        if let Some(f) = fence {
            keys.push(self.keys.lease(k));
            args.push(f.token());
        }
        let n: i64 = self
            .router
            .invoke_write(
                &self.keys.shard_tag(k),
                "append_run",
                &APPEND_RUN,
                &keys,
                &args,
                |n: &i64| *n == 1,
            )
            .await?;
        if let (-2, Some(f)) = (n, fence) {
            let current = crate::lease::read_fence(&self.router, &self.keys, k)
                .await
                .ok()
                .flatten();
            return Err(f.refused_reminder(actor_id, name, current));
        }
        Ok(())
    }

    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<RunRecord>> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let k = hash_shard(actor_hash(actor_id), self.shards().await?);
        let key = self.keys.runs(k, &ReminderKeys::member(actor_id, name));
        let cmd = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone();
        let raw: Vec<String> = self
            .router
            .query(&self.keys.shard_tag(k), "read_runs", &cmd)
            .await?;
        raw.iter()
            .map(|r| serde_json::from_str(r).map_err(|e| Error::corrupt(&key, e)))
            .collect()
    }

    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let k = hash_shard(actor_hash(actor_id), self.shards().await?);
        let member = ReminderKeys::member(actor_id, name);
        let mut p = redis::pipe();
        p.atomic()
            .del(self.keys.runs(k, &member))
            .ignore()
            .srem(self.keys.runs_index(k), &member)
            .ignore();
        self.router
            .pipeline_write(&self.keys.shard_tag(k), "remove_runs", &p)
            .await
    }

    async fn clear(&self) -> Result<()> {
        // One script per shard, so a racing upsert lands wholly before or wholly
        // after the clear of its shard.
        let shards = self.shards().await?;
        for k in 0..shards {
            let keys = [self.keys.ring(k), self.keys.runs_index(k)];
            let args = [self.keys.row_prefix(k), self.keys.runs_prefix(k)];
            let _: i64 = self
                .router
                .invoke(&self.keys.shard_tag(k), "clear", &CLEAR, &keys, &args)
                .await?;
        }
        Ok(())
    }
}

//! The reminder table on Redis: one key per reminder plus a sorted set of members
//! scored by the 32-bit actor hash (exact in a double) for ring-range reads.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use rollcall_membership_core::{actor_hash, Error, Etag, ReminderEntry, ReminderTable, Result, Timestamp};

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
return #members
",
    )
});

/// The reminder table of one service on Redis.
#[derive(Debug, Clone)]
pub struct RedisReminderTable {
    router: Arc<Router>,
    keys: ReminderKeys,
    service_id: String,
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
        }
    }

    /// Runs `op` with the shared connection of this service's node.
    async fn shared<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T>
    where
        F: Fn(crate::conn::Shared, ReminderKeys) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let op = &op;
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| {
                let keys = self.keys.clone();
                async move {
                    node.timed(what, async { op(node.shared().await?, keys).await })
                        .await
                }
            })
            .await
    }

    /// Reads the rows of ring `members`; rows removed meanwhile are skipped.
    async fn rows_of(&self, members: Vec<String>) -> Result<Vec<ReminderEntry>> {
        let mut out = Vec::with_capacity(members.len());
        for chunk in members.chunks(1000) {
            let keys: Vec<String> = chunk.iter().map(|m| self.keys.row(m)).collect();
            let values: Vec<Option<String>> = self
                .shared("read rows", |mut con, _| {
                    let keys = keys.clone();
                    async move {
                        redis::cmd("MGET")
                            .arg(keys)
                            .query_async(&mut con)
                            .await
                            .map_err(|e| backend("MGET", e))
                    }
                })
                .await?;
            for (key, v) in keys.iter().zip(values) {
                if let Some(raw) = v {
                    out.push(decode(&raw, key)?);
                }
            }
        }
        Ok(out)
    }

    /// `WATCH` + `GET` of the row of `member` in one round trip; if it holds `etag`,
    /// runs the transaction `write(row, row_key)` builds (which must keep exactly one
    /// reply) with `MULTI ... EXEC`. `Ok(false)` for a missing row, another etag, or a
    /// row changed between the `GET` and the `EXEC`.
    async fn when_etag_matches<F>(
        &self,
        what: &'static str,
        member: &str,
        etag: &Etag,
        write: F,
    ) -> Result<bool>
    where
        F: Fn(ReminderEntry, &str) -> Result<redis::Pipeline>,
    {
        let row_key = self.keys.row(member);
        let (row_key, write) = (&row_key, &write);
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| async move {
                node.timed(what, async {
                    let mut con = node.dedicated().await?;
                    let r = async {
                        // Pooled connections never carry a WATCH (conn::WatchConnections).
                        let (raw,): (Option<String>,) = redis::pipe()
                            .cmd("WATCH")
                            .arg(row_key)
                            .ignore()
                            .get(row_key)
                            .query_async(&mut con)
                            .await
                            .map_err(|e| backend("WATCH and GET", e))?;
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
                        Ok(done.is_some())
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

    async fn members_between(&self, min: String, max: String) -> Result<Vec<String>> {
        self.shared("ring range", |mut con, keys| {
            let (min, max) = (min.clone(), max.clone());
            async move {
                redis::cmd("ZRANGEBYSCORE")
                    .arg(keys.ring())
                    .arg(min)
                    .arg(max)
                    .query_async(&mut con)
                    .await
                    .map_err(|e| backend("ZRANGEBYSCORE", e))
            }
        })
        .await
    }
}

#[async_trait]
impl ReminderTable for RedisReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        self.shared("init", |mut con, _| async move {
            redis::cmd("PING")
                .query_async::<String>(&mut con)
                .await
                .map(|_| ())
                .map_err(|e| backend("PING", e))
        })
        .await
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        let h = actor_hash(actor_id);
        let prefix = format!("{}/", escape(actor_id));
        let members: Vec<String> = self
            .members_between(h.to_string(), h.to_string())
            .await?
            .into_iter()
            .filter(|m| m.starts_with(&prefix))
            .collect();
        self.rows_of(members).await
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        let members = if begin < end {
            self.members_between(format!("({begin}"), end.to_string()).await?
        } else {
            let mut high = self.members_between(format!("({begin}"), "+inf".into()).await?;
            high.extend(self.members_between("-inf".into(), end.to_string()).await?);
            high
        };
        self.rows_of(members).await
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        let key = self.keys.row(&ReminderKeys::member(actor_id, name));
        let raw: Option<String> = self
            .shared("read_row", |mut con, _| {
                let key = key.clone();
                async move {
                    redis::cmd("GET")
                        .arg(key)
                        .query_async(&mut con)
                        .await
                        .map_err(|e| backend("GET", e))
                }
            })
            .await?;
        raw.map(|r| decode(&r, &key)).transpose()
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id)?;
        let etag = Etag::new(new_etag());
        let stored = ReminderEntry {
            etag: etag.clone(),
            ..entry.clone()
        };
        let json =
            serde_json::to_string(&stored).map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
        let member = ReminderKeys::member(&entry.actor_id, &entry.name);
        let hash = entry.hash;
        self.shared("upsert_row", |mut con, keys| {
            let (json, member) = (json.clone(), member.clone());
            async move {
                redis::pipe()
                    .atomic()
                    .set(keys.row(&member), json)
                    .ignore()
                    .zadd(keys.ring(), &member, f64::from(hash))
                    .ignore()
                    .query_async::<()>(&mut con)
                    .await
                    .map_err(|e| backend("upsert_row", e))
            }
        })
        .await?;
        Ok(etag)
    }

    async fn remove_row(&self, actor_id: &str, name: &str, etag: &Etag) -> Result<bool> {
        let member = ReminderKeys::member(actor_id, name);
        let ring = self.keys.ring();
        self.when_etag_matches("remove_row", &member, etag, |_, row_key| {
            let mut p = redis::pipe();
            p.atomic().del(row_key).ignore().zrem(&ring, &member);
            Ok(p)
        })
        .await
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
    ) -> Result<bool> {
        let member = ReminderKeys::member(actor_id, name);
        self.when_etag_matches("update_last_fired", &member, etag, |mut row, row_key| {
            // Same JSON with the same etag: handles holding it stay valid.
            row.last_fired = Some(fired_at);
            let json =
                serde_json::to_string(&row).map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
            let mut p = redis::pipe();
            // EXISTS is the one reply kept: a committed EXEC is a non-empty array.
            p.atomic().set(row_key, json).ignore().exists(row_key);
            Ok(p)
        })
        .await
    }

    async fn clear(&self) -> Result<()> {
        // One script, so a racing upsert lands wholly before or wholly after the clear.
        self.shared("clear", |mut con, keys| async move {
            CLEAR
                .key(keys.ring())
                .arg(keys.row_prefix())
                .invoke_async::<i64>(&mut con)
                .await
                .map(|_| ())
                .map_err(|e| backend("clear", e))
        })
        .await
    }
}

//! Reminder shard leases on Redis (keys: the [key layout](crate::keys)): the
//! shard count, `SET NX`, which the reminder table reads too, and one hash per
//! shard's lease.
//!
//! Each shard has a hash tag of its own, shared with its reminder rows (see
//! the reminder table), so a service's leases spread over every master of a
//! Redis Cluster and a shard's lease and rows can change in one transaction. A write is one Lua compare-and-set on the `etag` field.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{Error, Etag, Expected, Result};

use crate::conn::Router;
use crate::keys::ReminderKeys;
use crate::new_etag;

/// KEYS[1]: the lease hash. ARGV: the precondition (`absent`, `etag`, `any`),
/// the expected etag, the new etag, the row, its fence token (the epoch while
/// held, empty while released: [`fence_token`](rollcall_core::lease::fence_token),
/// which a fenced state commit compares). Answers `{1}` when written,
/// `{0, current etag or nil}` when the precondition failed.
static WRITE_LEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local cur = redis.call('HGET', KEYS[1], 'etag')
local m = ARGV[1]
if not ((m == 'any') or (m == 'absent' and not cur) or (m == 'etag' and cur == ARGV[2])) then
  return {0, cur}
end
redis.call('HSET', KEYS[1], 'etag', ARGV[3], 'row', ARGV[4], 'fence', ARGV[5])
return {1}
",
    )
});

/// KEYS[1]: the shard count. ARGV[1]: the count to record if none is.
static SHARD_COUNT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
",
    )
});

/// Records `shards` as the shard count of the service of `keys` unless one is
/// recorded; the recorded count.
/// A precondition as the compare-and-set scripts take it (state commits,
/// shard leases): the mode and the expected etag.
pub(crate) fn precondition(e: &Expected) -> (&'static str, &str) {
    match e {
        Expected::Absent => ("absent", ""),
        Expected::Etag(e) => ("etag", e.as_str()),
        Expected::Any => ("any", ""),
    }
}

/// The fence token of shard `k`'s lease: its epoch while held (`None`:
/// released or never acquired, or not a number).
pub(crate) async fn read_fence(router: &Router, keys: &ReminderKeys, k: u32) -> Result<Option<u64>> {
    let cmd = redis::cmd("HGET").arg(keys.lease(k)).arg("fence").clone();
    let token: Option<String> = router.query(&keys.shard_tag(k), "read fence", &cmd).await?;
    Ok(token.and_then(|t| t.parse().ok()))
}

pub(crate) async fn record_shard_count(router: &Router, keys: &ReminderKeys, shards: u32) -> Result<u32> {
    let key = keys.count();
    let recorded: String = router
        .invoke(
            &keys.service_tag(),
            "record shard count",
            &SHARD_COUNT,
            std::slice::from_ref(&key),
            &[shards],
        )
        .await?;
    parse_count(&key, &recorded)
}

/// The shard lease rows of one reminder service on Redis.
#[derive(Debug, Clone)]
pub struct RedisLeaseTable {
    router: Arc<Router>,
    keys: ReminderKeys,
    service_id: String,
}

impl RedisLeaseTable {
    pub(crate) fn new(router: Arc<Router>, prefix: &str, service_id: &str) -> Self {
        RedisLeaseTable {
            router,
            keys: ReminderKeys::new(prefix, service_id),
            service_id: service_id.to_owned(),
        }
    }

    async fn recorded_count(&self) -> Result<Option<u32>> {
        let cmd = redis::cmd("GET").arg(self.keys.count()).clone();
        let v: Option<String> = self
            .router
            .query(&self.keys.service_tag(), "read shard count", &cmd)
            .await?;
        v.map(|s| parse_count(&self.keys.count(), &s)).transpose()
    }
}

fn parse_count(key: &str, s: &str) -> Result<u32> {
    s.parse()
        .map_err(|_| Error::corrupt(key, format!("shard count `{s}` is not a number")))
}

#[async_trait]
impl LeaseTable for RedisLeaseTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn shard_count(&self, shards: u32) -> Result<u32> {
        record_shard_count(&self.router, &self.keys, shards).await
    }

    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>> {
        let cmd = redis::cmd("HMGET")
            .arg(self.keys.lease(shard))
            .arg("etag")
            .arg("row")
            .clone();
        let (etag, row): (Option<String>, Option<Vec<u8>>) = self
            .router
            .query(&self.keys.shard_tag(shard), "read shard lease", &cmd)
            .await?;
        match (etag, row) {
            (Some(e), Some(r)) => Ok(Some((r, Etag::new(e)))),
            (None, None) => Ok(None),
            _ => Err(Error::corrupt(
                self.keys.lease(shard),
                "a lease without etag or row",
            )),
        }
    }

    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite> {
        rollcall_core::lease::check_row(shard, row)?;
        let (mode, want) = precondition(expected);
        let etag = new_etag();
        let token = rollcall_core::lease::fence_token(row)
            .map(|e| e.to_string())
            .unwrap_or_default();
        let args: [&[u8]; 5] = [
            mode.as_bytes(),
            want.as_bytes(),
            etag.as_bytes(),
            row,
            token.as_bytes(),
        ];
        let reply: Vec<redis::Value> = self
            .router
            .invoke_write(
                &self.keys.shard_tag(shard),
                "write shard lease",
                &WRITE_LEASE,
                &[self.keys.lease(shard)],
                &args,
                |r: &Vec<redis::Value>| matches!(r.as_slice(), [redis::Value::Int(1)]),
            )
            .await?;
        match reply.as_slice() {
            [redis::Value::Int(1)] => Ok(LeaseWrite::Written(Etag::new(etag))),
            [redis::Value::Int(0)] | [redis::Value::Int(0), redis::Value::Nil] => {
                Ok(LeaseWrite::Conflict(None))
            }
            [redis::Value::Int(0), v] => {
                let e: String = redis::from_redis_value(v.clone())
                    .map_err(|e| Error::backend(format!("write shard lease: unexpected etag: {e}")))?;
                Ok(LeaseWrite::Conflict(Some(Etag::new(e))))
            }
            other => Err(Error::backend(format!(
                "write shard lease: unexpected reply {other:?}"
            ))),
        }
    }

    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()> {
        for page in pages {
            rollcall_core::lease::check_row(shard, page)?;
        }
        if pages.is_empty() {
            return Ok(());
        }
        let mut hset = redis::cmd("HSET");
        hset.arg(self.keys.lease_pages(shard));
        for (i, page) in pages.iter().enumerate() {
            hset.arg(format!("{set}/{}", first + i as u32))
                .arg(page.as_slice());
        }
        let mut pipe = redis::pipe();
        pipe.add_command(hset).ignore();
        let () = self
            .router
            .pipeline_write(&self.keys.shard_tag(shard), "write lease pages", &pipe)
            .await?;
        Ok(())
    }

    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.keys.lease_pages(shard));
        for i in 0..count {
            cmd.arg(format!("{set}/{i}"));
        }
        self.router
            .query(&self.keys.shard_tag(shard), "read lease pages", &cmd)
            .await
    }

    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()> {
        let key = self.keys.lease_pages(shard);
        let tag = self.keys.shard_tag(shard);
        let Some(keep) = keep else {
            let cmd = redis::cmd("DEL").arg(&key).clone();
            return self.router.query(&tag, "delete lease pages", &cmd).await;
        };
        let fields: Vec<String> = self
            .router
            .query(&tag, "list lease pages", redis::cmd("HKEYS").arg(&key))
            .await?;
        let prefix = format!("{keep}/");
        let stale: Vec<&String> = fields.iter().filter(|f| !f.starts_with(&prefix)).collect();
        if stale.is_empty() {
            return Ok(());
        }
        let cmd = redis::cmd("HDEL").arg(&key).arg(stale).clone();
        let _: i64 = self.router.query(&tag, "delete lease pages", &cmd).await?;
        Ok(())
    }

    async fn clear(&self) -> Result<()> {
        if let Some(n) = self.recorded_count().await? {
            for shard in 0..n {
                let cmd = redis::cmd("DEL")
                    .arg(self.keys.lease(shard))
                    .arg(self.keys.lease_pages(shard))
                    .clone();
                let () = self
                    .router
                    .query(&self.keys.shard_tag(shard), "clear shard lease", &cmd)
                    .await?;
            }
        }
        let cmd = redis::cmd("DEL").arg(self.keys.count()).clone();
        self.router
            .query(&self.keys.service_tag(), "clear shard count", &cmd)
            .await
    }
}

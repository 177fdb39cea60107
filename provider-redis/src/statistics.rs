//! The statistics store on Redis.
//!
//! Every key of one cluster's statistics shares the hash tag `{s:<cluster>}` (a slot
//! of its own, apart from the membership table's):
//!
//! The keys (interned ids and strings, per level an index and values) are in the
//! [key layout](crate::keys).
//!
//! `<level>` is the level's code (0 raw, 1, 10, 60). Members are fixed-width hex, so
//! the index orders them by time and a time range is one `ZRANGEBYLEX` (exact for
//! any 64-bit time, where scores would round above 2^53 ms). An append is one Lua
//! script: it interns the strings, adds each new raw point with `HSETNX` (a known
//! identity changes nothing) and folds it into its three buckets, so a point and its
//! buckets are stored together or not at all. Floats cross the script boundary as
//! shortest round-trip decimals and come back as `%.17g`, so sums are exactly those
//! of a Rust fold.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use redis::Value;
use rollcall_core::statistics::{
    bucket_start, expired_below, parse_record_key, validate_batch, Aggregate, StringCache, StringKind,
};
use rollcall_core::{
    AggLevel, Error, Result, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore, Timestamp,
};

use crate::conn::Router;
use crate::keys::escape;

/// Members a scan or an expire reads per round trip.
const PAGE: usize = 1000;

/// KEYS: ids, strings, then index and values of raw, 1, 10 and 60 minutes.
/// ARGV: per point, 8 values: name, silo, value, is_delta (0/1), then the raw time
/// and the three bucket starts as 16 hex digits. Returns the number of new points.
/// A malformed stored bucket fails the script before it writes anything.
static APPEND: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local function parse(v)
  local c, s, lo, hi = string.match(v, '^(%d+) (%S+) (%S+) (%S+) [01]$')
  if not c then return nil end
  c, s, lo, hi = tonumber(c), tonumber(s), tonumber(lo), tonumber(hi)
  if not (c and s and lo and hi) then return nil end
  return c, s, lo, hi
end
local ids = {}
local function intern(kind)
  local id = ids[kind] or redis.call('HGET', KEYS[1], kind)
  if not id then
    id = redis.call('HINCRBY', KEYS[1], '#next', 1)
    redis.call('HSET', KEYS[1], kind, id)
    redis.call('HSET', KEYS[2], id, kind)
  end
  ids[kind] = id
  return string.format('%08x', tonumber(id))
end
for i = 1, #ARGV, 8 do
  for l = 1, 3 do
    local key = KEYS[4 + 2 * l]
    local n = redis.call('HGET', KEYS[1], 'n:' .. ARGV[i])
    local s = redis.call('HGET', KEYS[1], 's:' .. ARGV[i + 1])
    if n and s then
      local m = ARGV[i + 4 + l] .. string.format('%08x%08x', tonumber(n), tonumber(s))
      local old = redis.call('HGET', key, m)
      if old and not parse(old) then
        return redis.error_reply('CORRUPT ' .. key .. ' ' .. m)
      end
    end
  end
end
local new = 0
for i = 1, #ARGV, 8 do
  local pair = intern('n:' .. ARGV[i]) .. intern('s:' .. ARGV[i + 1])
  local v, d = tonumber(ARGV[i + 2]), ARGV[i + 3]
  local raw = ARGV[i + 4] .. pair
  if redis.call('HSETNX', KEYS[4], raw, string.format('1 %.17g %.17g %.17g %s', v, v, v, d)) == 1 then
    new = new + 1
    redis.call('ZADD', KEYS[3], 0, raw)
    for l = 1, 3 do
      local m = ARGV[i + 4 + l] .. pair
      local old = redis.call('HGET', KEYS[4 + 2 * l], m)
      local c, s, lo, hi = 1, v, v, v
      if old then
        c, s, lo, hi = parse(old)
        c, s, lo, hi = c + 1, s + v, math.min(lo, v), math.max(hi, v)
      else
        redis.call('ZADD', KEYS[3 + 2 * l], 0, m)
      end
      redis.call('HSET', KEYS[4 + 2 * l], m,
        string.format('%d %.17g %.17g %.17g %s', c, s, lo, hi, d))
    end
  end
end
return new
",
    )
});

/// KEYS: index, values. ARGV: min, max (`ZRANGEBYLEX` bounds), count. Returns
/// `[member, value, member, value, ...]` of the first `count` members in range, read
/// at one instant (a member whose value is gone is skipped).
static SCAN: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local ms = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
if #ms == 0 then return {} end
local vs = redis.call('HMGET', KEYS[2], unpack(ms))
local out = {}
for i, m in ipairs(ms) do
  if vs[i] then
    out[#out + 1] = m
    out[#out + 1] = vs[i]
  end
end
return out
",
    )
});

/// KEYS: index and values of each level. ARGV: per level, the exclusive upper
/// `ZRANGEBYLEX` bound of what expires; then the most members to remove. Returns how
/// many went (less than the limit: nothing more is expired).
static EXPIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local limit = tonumber(ARGV[#ARGV])
local removed = 0
for l = 1, #KEYS / 2 do
  while removed < limit do
    local ms = redis.call('ZRANGEBYLEX', KEYS[2 * l - 1], '-', ARGV[l], 'LIMIT', 0, math.min(1000, limit - removed))
    if #ms == 0 then break end
    redis.call('HDEL', KEYS[2 * l], unpack(ms))
    redis.call('ZREM', KEYS[2 * l - 1], unpack(ms))
    removed = removed + #ms
  end
end
return removed
",
    )
});

fn hex_time(t: u64) -> String {
    format!("{t:016x}")
}

/// The statistics of one cluster on Redis (see the module docs for the layout).
#[derive(Debug)]
pub struct RedisStatistics {
    router: Arc<Router>,
    tag: String,
    base: String,
    cluster_id: String,
    options: StatisticsOptions,
    cache: StringCache,
}

impl RedisStatistics {
    pub(crate) fn new(
        router: Arc<Router>,
        prefix: &str,
        cluster_id: &str,
        options: StatisticsOptions,
    ) -> Self {
        let tag = format!("s:{}", escape(cluster_id));
        RedisStatistics {
            router,
            base: format!("{prefix}:{{{tag}}}"),
            tag,
            cluster_id: cluster_id.to_owned(),
            cache: StringCache::new(options.metadata_string_cache_capacity),
            options,
        }
    }

    fn ids_key(&self) -> String {
        format!("{}:ids", self.base)
    }

    fn strings_key(&self) -> String {
        format!("{}:strings", self.base)
    }

    fn index_key(&self, level: AggLevel) -> String {
        format!("{}:{}:index", self.base, level.code())
    }

    fn values_key(&self, level: AggLevel) -> String {
        format!("{}:{}:values", self.base, level.code())
    }

    async fn invoke<T: redis::FromRedisValue + Send>(
        &self,
        what: &'static str,
        script: &'static redis::Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T> {
        self.router.invoke(&self.tag, what, script, keys, args).await
    }

    async fn query<T: redis::FromRedisValue + Send>(&self, what: &'static str, cmd: redis::Cmd) -> Result<T> {
        self.router.query(&self.tag, what, &cmd).await
    }

    /// The ids of `wanted` strings of `kind` that exist (the cache, else one `HMGET`).
    async fn ids_of(
        &self,
        kind: StringKind,
        wanted: &std::collections::BTreeSet<String>,
    ) -> Result<Vec<u32>> {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for s in wanted {
            match self.cache.id(kind, s) {
                Some(id) => found.push(id),
                None => missing.push(s),
            }
        }
        if !missing.is_empty() {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(self.ids_key());
            for s in &missing {
                cmd.arg(format!("{}:{s}", kind.tag()));
            }
            let ids: Vec<Option<String>> = self.query("statistics ids", cmd).await?;
            for (s, id) in missing.into_iter().zip(ids) {
                if let Some(id) = id {
                    let id = id
                        .parse::<u32>()
                        .map_err(|e| Error::corrupt(format!("{} {}:{s}", self.ids_key(), kind.tag()), e))?;
                    self.cache.insert(kind, s, id);
                    found.push(id);
                }
            }
        }
        Ok(found)
    }

    /// The strings of `ids` (the cache, else one `HMGET` for the misses).
    async fn strings_of(
        &self,
        ids: impl Iterator<Item = (StringKind, u32)>,
    ) -> Result<HashMap<(StringKind, u32), String>> {
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        for (kind, id) in ids {
            if out.contains_key(&(kind, id)) {
                continue;
            }
            match self.cache.string(kind, id) {
                Some(s) => {
                    out.insert((kind, id), s);
                }
                None => {
                    if !missing.contains(&(kind, id)) {
                        missing.push((kind, id));
                    }
                }
            }
        }
        for chunk in missing.chunks(PAGE) {
            let mut cmd = redis::cmd("HMGET");
            cmd.arg(self.strings_key());
            for (_, id) in chunk {
                cmd.arg(id);
            }
            let found: Vec<Option<String>> = self.query("statistics strings", cmd).await?;
            for (&(kind, id), s) in chunk.iter().zip(found) {
                let key = || format!("{} {id}", self.strings_key());
                let s = s.ok_or_else(|| Error::corrupt(key(), "no such interned string"))?;
                let s = s
                    .strip_prefix(kind.tag())
                    .and_then(|r| r.strip_prefix(':'))
                    .ok_or_else(|| Error::corrupt(key(), format!("a {kind:?} id names {s:?}")))?
                    .to_owned();
                self.cache.insert(kind, &s, id);
                out.insert((kind, id), s);
            }
        }
        Ok(out)
    }
}

/// The append script's `CORRUPT <values key> <member>` reply as [`Error::Corrupt`];
/// any other error as it is.
fn corrupt_bucket(e: Error) -> Error {
    let detail = match &e {
        Error::Backend { source: Some(s), .. } => s
            .downcast_ref::<redis::RedisError>()
            .filter(|re| re.code() == Some("CORRUPT"))
            .and_then(|re| re.detail())
            .map(str::to_owned),
        _ => None,
    };
    match detail {
        Some(key) => Error::corrupt(key, "not `<count> <sum> <min> <max> <0|1>`"),
        None => e,
    }
}

/// An aggregate and its delta flag from `<count> <sum> <min> <max> <0/1>`.
fn parse_value(v: &str) -> Option<(Aggregate, bool)> {
    let mut parts = v.split(' ');
    let count = parts.next()?.parse().ok()?;
    let mut f = || parts.next()?.parse::<f64>().ok();
    let (sum, min, max) = (f()?, f()?, f()?);
    let delta = match parts.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    parts
        .next()
        .is_none()
        .then_some((Aggregate { count, sum, min, max }, delta))
}

fn bytes_reply(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

#[async_trait]
impl StatisticsStore for RedisStatistics {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn append(&self, points: &[StatPoint]) -> Result<usize> {
        if !validate_batch(points)? {
            return Ok(0);
        }
        let mut keys = vec![self.ids_key(), self.strings_key()];
        for level in AggLevel::ALL {
            keys.push(self.index_key(level));
            keys.push(self.values_key(level));
        }
        let mut new = 0;
        // Batches of at most 512 points: one script run each, so a huge append does
        // not stall the server; each point is still atomic with its buckets.
        for chunk in points.chunks(512) {
            let mut args = Vec::with_capacity(chunk.len() * 8);
            for p in chunk {
                args.push(p.name.clone());
                args.push(p.silo.clone());
                args.push(p.value.to_string());
                args.push(if p.is_delta { "1" } else { "0" }.to_owned());
                for level in AggLevel::ALL {
                    args.push(hex_time(bucket_start(level, p.time).as_millis()));
                }
            }
            let added: i64 = self
                .invoke("statistics append", &APPEND, &keys, &args)
                .await
                .map_err(corrupt_bucket)?;
            new += usize::try_from(added).unwrap_or(0);
        }
        Ok(new)
    }

    async fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>> {
        if filter.from >= filter.to {
            return Ok(Vec::new());
        }
        let names = match &filter.names {
            Some(n) => Some(self.ids_of(StringKind::Name, n).await?),
            None => None,
        };
        let silos = match &filter.silos {
            Some(s) => Some(self.ids_of(StringKind::Silo, s).await?),
            None => None,
        };
        if names.as_ref().is_some_and(Vec::is_empty) || silos.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let keys = [self.index_key(filter.level), self.values_key(filter.level)];
        let (index, values) = (&keys[0], &keys[1]);
        let mut min = format!("[{}", hex_time(filter.from.as_millis()));
        let max = format!("({}", hex_time(filter.to.as_millis()));
        let mut cells = Vec::new();
        loop {
            let reply: Vec<Value> = self
                .invoke(
                    "statistics scan",
                    &SCAN,
                    &keys,
                    &[min.clone(), max.clone(), PAGE.to_string()],
                )
                .await?;
            let got = reply.len() / 2;
            let mut last = None;
            let mut it = reply.into_iter();
            while let (Some(m), Some(v)) = (it.next(), it.next()) {
                let m = bytes_reply(m)
                    .ok_or_else(|| Error::corrupt(index.clone(), "a member that is not text"))?;
                let (time, name, silo) = parse_record_key(&m).ok_or_else(|| {
                    Error::corrupt(format!("{index} {m}"), "not <time><name id><silo id> in hex")
                })?;
                let v = bytes_reply(v).ok_or_else(|| Error::corrupt(format!("{values} {m}"), "not text"))?;
                let (aggregate, is_delta) = parse_value(&v).ok_or_else(|| {
                    Error::corrupt(format!("{values} {m}"), "not `<count> <sum> <min> <max> <0|1>`")
                })?;
                if names.as_ref().is_none_or(|n| n.contains(&name))
                    && silos.as_ref().is_none_or(|s| s.contains(&silo))
                {
                    cells.push((time, name, silo, aggregate, is_delta));
                }
                last = Some(m);
            }
            match last {
                Some(m) if got == PAGE => min = format!("({m}"),
                _ => break,
            }
        }
        let strings = self
            .strings_of(
                cells
                    .iter()
                    .flat_map(|c| [(StringKind::Name, c.1), (StringKind::Silo, c.2)]),
            )
            .await?;
        let mut out: Vec<StatRecord> = cells
            .into_iter()
            .map(|(time, name, silo, aggregate, is_delta)| StatRecord {
                level: filter.level,
                time: Timestamp::from_millis(time),
                name: strings[&(StringKind::Name, name)].clone(),
                silo: strings[&(StringKind::Silo, silo)].clone(),
                aggregate,
                is_delta,
            })
            .collect();
        out.sort_by(|a, b| (a.time, &a.name, &a.silo).cmp(&(b.time, &b.name, &b.silo)));
        Ok(out)
    }

    async fn expire(&self, now: Timestamp) -> Result<usize> {
        let cutoff = now.saturating_sub(self.options.retention());
        let mut keys = Vec::new();
        let mut args = Vec::new();
        for level in AggLevel::ALL {
            keys.push(self.index_key(level));
            keys.push(self.values_key(level));
            args.push(format!("({}", hex_time(expired_below(level, cutoff).as_millis())));
        }
        args.push((10 * PAGE).to_string());
        let mut removed = 0;
        loop {
            let n: i64 = self.invoke("statistics expire", &EXPIRE, &keys, &args).await?;
            let n = usize::try_from(n).unwrap_or(0);
            removed += n;
            if n < 10 * PAGE {
                return Ok(removed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_values_parse_strictly() {
        assert_eq!(
            parse_record_key("0000019e1f5c2b400000000100000002"),
            Some((0x19e1f5c2b40, 1, 2))
        );
        assert_eq!(parse_record_key("0000019e1f5c2b40000000010000000"), None);
        assert_eq!(parse_record_key("0000019e1f5c2b40000000010000000g"), None);
        let (a, d) = parse_value("3 0.30000000000000004 -1 1e+300 1").expect("value");
        assert_eq!(
            (a.count, a.sum, a.min, a.max, d),
            (3, 0.30000000000000004, -1.0, 1e300, true)
        );
        for bad in ["", "1 2 3 4", "1 2 3 4 2", "x 2 3 4 0", "1 2 3 4 0 5"] {
            assert_eq!(parse_value(bad), None, "{bad:?}");
        }
    }
}

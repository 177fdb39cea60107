//! The statistics store (Orleans' silo- and client-statistics tables, stored the way
//! Storm's metric store keeps its metrics): silos append their counters every
//! `statistics_period` as [`StatPoint`]s; each point is also folded into 1-, 10- and
//! 60-minute buckets ([`AggLevel`]) as it is stored; names and silo ids are interned
//! to integer ids; points and buckets older than `retention_hours` are removed by
//! [`StatisticsStore::expire`]; a [`StatFilter`] scan returns records in time order.
//!
//! The rollup rules here ([`bucket_start`], [`Aggregate`]) are shared by every
//! implementation, so that all of them answer a scan alike.

use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Error, Result, Timestamp};

/// Storm's default number of metadata strings (names, silo ids) kept in memory.
pub const DEFAULT_METADATA_STRING_CACHE_CAPACITY: usize = 4000;

/// Storm's default retention: 240 hours (10 days).
pub const DEFAULT_RETENTION_HOURS: u32 = 240;

/// Orleans' default interval between two appends of a silo's statistics.
pub const DEFAULT_STATISTICS_PERIOD: Duration = Duration::from_secs(30);

/// How the statistics store is run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatisticsOptions {
    /// How often silos append their counters.
    #[serde(with = "humantime_serde")]
    pub statistics_period: Duration,
    /// Interned strings (names, silo ids) kept in memory by stores that persist
    /// them; a miss costs one point read. At least 16.
    pub metadata_string_cache_capacity: usize,
    /// Points and buckets older than this many hours are removed by
    /// [`StatisticsStore::expire`]. At least 1.
    pub retention_hours: u32,
}

impl Default for StatisticsOptions {
    fn default() -> Self {
        StatisticsOptions {
            statistics_period: DEFAULT_STATISTICS_PERIOD,
            metadata_string_cache_capacity: DEFAULT_METADATA_STRING_CACHE_CAPACITY,
            retention_hours: DEFAULT_RETENTION_HOURS,
        }
    }
}

impl StatisticsOptions {
    /// Checks the bounds above.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.statistics_period < Duration::from_millis(100) {
            return Err(Error::invalid_config(
                "statistics_period",
                "must be at least 100 ms",
            ));
        }
        if self.metadata_string_cache_capacity < 16 {
            return Err(Error::invalid_config(
                "metadata_string_cache_capacity",
                "must be at least 16",
            ));
        }
        if self.retention_hours == 0 {
            return Err(Error::invalid_config("retention_hours", "must be at least 1"));
        }
        Ok(())
    }

    /// The retention as a duration.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.retention_hours) * 3600)
    }
}

/// The resolution of a scan: raw points, or 1-, 10- or 60-minute buckets (Storm's
/// `AggLevel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggLevel {
    /// Every point as appended.
    Raw,
    /// 1-minute buckets.
    Minute1,
    /// 10-minute buckets.
    Minute10,
    /// 60-minute buckets.
    Minute60,
}

impl AggLevel {
    /// Every level, raw first.
    pub const ALL: [AggLevel; 4] = [
        AggLevel::Raw,
        AggLevel::Minute1,
        AggLevel::Minute10,
        AggLevel::Minute60,
    ];

    /// The bucketed levels a point is folded into.
    pub const BUCKETS: [AggLevel; 3] = [AggLevel::Minute1, AggLevel::Minute10, AggLevel::Minute60];

    /// The bucket width in ms (0 for raw).
    pub fn width_ms(self) -> u64 {
        match self {
            AggLevel::Raw => 0,
            AggLevel::Minute1 => 60_000,
            AggLevel::Minute10 => 600_000,
            AggLevel::Minute60 => 3_600_000,
        }
    }

    /// A stable one-byte code (storage keys).
    pub fn code(self) -> u8 {
        match self {
            AggLevel::Raw => 0,
            AggLevel::Minute1 => 1,
            AggLevel::Minute10 => 10,
            AggLevel::Minute60 => 60,
        }
    }

    /// The level of [`code`](Self::code).
    pub fn from_code(code: u8) -> Option<AggLevel> {
        AggLevel::ALL.into_iter().find(|l| l.code() == code)
    }
}

/// The start of the bucket of `level` that holds `time` (`time` itself for raw).
pub fn bucket_start(level: AggLevel, time: Timestamp) -> Timestamp {
    match level.width_ms() {
        0 => time,
        w => Timestamp::from_millis(time.as_millis() / w * w),
    }
}

/// One appended value: a counter of a silo (or client) at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatPoint {
    /// When it was measured (ms since the Unix epoch).
    pub time: Timestamp,
    /// The silo (or client) id. Non-empty, at most 256 bytes.
    pub silo: String,
    /// The statistic's name (e.g. `membership.table_writes`). Non-empty, at most 256
    /// bytes.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Whether `value` is the change since the previous point (true) or the
    /// counter's value (false), as in Orleans' statistics tables.
    pub is_delta: bool,
}

impl StatPoint {
    /// Checks the names (labels: non-empty, at most 256 bytes,
    /// [`KeyLimits::label`](crate::KeyLimits::label), no control characters) and
    /// that the value is finite.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the field.
    pub fn validate(&self) -> Result<()> {
        crate::KeyLimits::CORE.check_label("statistics.silo", &self.silo)?;
        crate::KeyLimits::CORE.check_label("statistics.name", &self.name)?;
        if !self.value.is_finite() {
            return Err(Error::invalid_input("statistics.value", "must be finite"));
        }
        Ok(())
    }
}

/// Count, sum, min and max of the values folded into a bucket (Storm's metric value
/// fields), plus the last value folded in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// Points folded in.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Aggregate {
    /// The aggregate of one value.
    pub fn of(value: f64) -> Self {
        Aggregate {
            count: 1,
            sum: value,
            min: value,
            max: value,
        }
    }

    /// Folds `value` in.
    pub fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    /// The mean (`sum / count`).
    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

/// One answer of a scan: a raw point (count 1) or a bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatRecord {
    /// The resolution.
    pub level: AggLevel,
    /// The point's time, or the bucket's start.
    pub time: Timestamp,
    /// The silo (or client) id.
    pub silo: String,
    /// The statistic's name.
    pub name: String,
    /// The values folded in (one for a raw point).
    pub aggregate: Aggregate,
    /// For a raw point, whether it is a delta; for a bucket, whether the last point
    /// folded in was.
    pub is_delta: bool,
}

/// What a scan returns: records of one level within `[from, to)`, of the given names
/// and silos (all when `None`), ordered by time, then name, then silo.
#[derive(Clone, Debug, PartialEq)]
pub struct StatFilter {
    /// The resolution.
    pub level: AggLevel,
    /// First time (inclusive; a bucket is in range when its start is).
    pub from: Timestamp,
    /// End time (exclusive).
    pub to: Timestamp,
    /// Only these names.
    pub names: Option<BTreeSet<String>>,
    /// Only these silos.
    pub silos: Option<BTreeSet<String>>,
}

impl StatFilter {
    /// Every record of `level` (all times, names and silos).
    pub fn all(level: AggLevel) -> Self {
        StatFilter {
            level,
            from: Timestamp::from_millis(0),
            to: Timestamp::from_millis(u64::MAX),
            names: None,
            silos: None,
        }
    }

    /// Whether a record of (`time`, `name`, `silo`) at this filter's level matches.
    pub fn matches(&self, time: Timestamp, name: &str, silo: &str) -> bool {
        time >= self.from
            && time < self.to
            && self.names.as_ref().is_none_or(|n| n.contains(name))
            && self.silos.as_ref().is_none_or(|s| s.contains(silo))
    }
}

/// The statistics of **one cluster**.
///
/// # Contract
/// - A point is identified by (name, silo, time); appending a point whose identity
///   is already stored changes nothing (an append can be retried safely).
/// - Every new point is stored raw and folded into its 1-, 10- and 60-minute bucket
///   ([`bucket_start`], [`Aggregate::add`]) in the same atomic step: a scan never
///   sees a point without its buckets or the reverse.
/// - [`scan`](StatisticsStore::scan) returns exactly the records that
///   [`StatFilter::matches`], in (time, name, silo) order.
/// - [`expire`](StatisticsStore::expire)`(now)` removes the raw points older than
///   `now - retention` and the buckets that ended before it, and nothing else.
#[async_trait]
pub trait StatisticsStore: Send + Sync + std::fmt::Debug {
    /// The cluster.
    fn cluster_id(&self) -> &str;

    /// Stores `points` (see the contract); returns how many were new.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an invalid point (nothing of the batch is
    /// stored); [`Error::Backend`] if the backend fails.
    async fn append(&self, points: &[StatPoint]) -> Result<usize>;

    /// The records that match `filter`, in (time, name, silo) order.
    ///
    /// # Errors
    /// [`Error::Backend`]; [`Error::Corrupt`] naming a stored record that does not
    /// decode.
    async fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>>;

    /// Removes what is older than the retention at `now`; returns how many raw
    /// points and buckets went.
    ///
    /// # Errors
    /// [`Error::Backend`].
    async fn expire(&self, now: Timestamp) -> Result<usize>;
}

/// Whether a bucket of `level` starting at `start` ended before `cutoff`.
pub fn bucket_expired(level: AggLevel, start: Timestamp, cutoff: Timestamp) -> bool {
    start.as_millis().saturating_add(level.width_ms().max(1)) <= cutoff.as_millis()
}

/// The first start that `expire` keeps at `level` for a retention `cutoff`: a raw
/// point or bucket starting before it is expired ([`bucket_expired`]), one starting
/// at or after it is kept. Stores that keep records ordered by start remove one
/// range below it.
pub fn expired_below(level: AggLevel, cutoff: Timestamp) -> Timestamp {
    Timestamp::from_millis(cutoff.as_millis().saturating_sub(level.width_ms().max(1) - 1))
}

/// The text key of a stored record as the Redis and DynamoDB stores lay it out:
/// the start time (ms) as 16 hex digits, then the interned name and silo ids as 8
/// each, all lowercase and fixed-width, so keys sort by time, then name id, then
/// silo id.
pub fn record_key(time_ms: u64, name_id: u32, silo_id: u32) -> String {
    format!("{time_ms:016x}{name_id:08x}{silo_id:08x}")
}

/// The (start time ms, name id, silo id) of a [`record_key`]; `None` for anything
/// else.
pub fn parse_record_key(key: &str) -> Option<(u64, u32, u32)> {
    if key.len() != 32 || !key.is_ascii() {
        return None;
    }
    Some((
        u64::from_str_radix(&key[..16], 16).ok()?,
        u32::from_str_radix(&key[16..24], 16).ok()?,
        u32::from_str_radix(&key[24..], 16).ok()?,
    ))
}

/// Validates every point of an append batch ([`StatPoint::validate`]) before any
/// is stored; `Ok(false)` for an empty batch (nothing to do).
///
/// # Errors
/// The first invalid point's [`Error::InvalidInput`].
pub fn validate_batch(points: &[StatPoint]) -> Result<bool> {
    for p in points {
        p.validate()?;
    }
    Ok(!points.is_empty())
}

/// What an interned string names: the two kinds of strings a point carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StringKind {
    /// A statistic's name.
    Name,
    /// A silo (or client) id.
    Silo,
}

impl StringKind {
    /// A one-character tag for storage keys (`n` or `s`).
    pub fn tag(self) -> char {
        match self {
            StringKind::Name => 'n',
            StringKind::Silo => 's',
        }
    }
}

/// The bounded in-memory cache of interned strings of a statistics store that
/// persists them (Storm's metadata string cache): at most `capacity` entries each
/// way, least recently used first out. A miss costs the store one read. Safe to
/// share between tasks.
#[derive(Debug)]
pub struct StringCache {
    inner: Mutex<StringCacheInner>,
}

#[derive(Debug)]
struct StringCacheInner {
    ids: lru::LruCache<(StringKind, String), u32>,
    strings: lru::LruCache<(StringKind, u32), String>,
}

impl StringCache {
    /// A cache of at most `capacity` strings each way (at least 1).
    pub fn new(capacity: usize) -> Self {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        StringCache {
            inner: Mutex::new(StringCacheInner {
                ids: lru::LruCache::new(cap),
                strings: lru::LruCache::new(cap),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StringCacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of `s`, if cached.
    pub fn id(&self, kind: StringKind, s: &str) -> Option<u32> {
        self.lock().ids.get(&(kind, s.to_owned())).copied()
    }

    /// The string of `id`, if cached.
    pub fn string(&self, kind: StringKind, id: u32) -> Option<String> {
        self.lock().strings.get(&(kind, id)).cloned()
    }

    /// Remembers that `s` has `id`, both ways.
    pub fn insert(&self, kind: StringKind, s: &str, id: u32) {
        let mut c = self.lock();
        c.ids.put((kind, s.to_owned()), id);
        c.strings.put((kind, id), s.to_owned());
    }

    /// Forgets everything (after a transaction that allocated ids failed).
    pub fn clear(&self) {
        let mut c = self.lock();
        c.ids.clear();
        c.strings.clear();
    }
}

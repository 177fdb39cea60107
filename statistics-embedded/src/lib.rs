//! # rollcall-statistics-embedded
//!
//! A persistent statistics store for a single host, in one file, laid out as Storm's
//! RocksDB metric store lays out its keys, on [redb](https://docs.rs/redb) (a pure-Rust
//! ordered key-value store: no C++ toolchain, and it builds in seconds; see
//! `docs/ARCHITECTURE.md` for the build-time and write-rate comparison).
//!
//! Tables:
//!
//! | table | key | value |
//! |---|---|---|
//! | `metrics` | type `0` (1) · level (1) · cluster id (4) · time ms (8, big-endian) · name id (4) · silo id (4) | version `1` (1) · flags (1, bit 0 = is_delta) · count (8) · sum (8) · min (8) · max (8) |
//! | `strings` | kind (1: 1 cluster, 2 name, 3 silo) · id (4) | version `1` (1) · last used ms (8) · the string |
//! | `string_ids` | kind (1) · the string | id (4) |
//! | `meta` | `"next_string_id"` | next id |
//!
//! Keys sort by level, cluster, then time, so a scan of one level and time range is
//! one range read and retention is one range delete per level. Interned strings are
//! cached in memory, at most `metadata_string_cache_capacity` each way (LRU); a miss
//! is one point read.

#![warn(missing_docs)]

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};
use rollcall_core::statistics::{
    bucket_start, AggLevel, Aggregate, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore,
    StringCache, StringKind,
};
use rollcall_core::{Error, Result, Timestamp};

const METRICS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("metrics");
const STRINGS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("strings");
const STRING_IDS: TableDefinition<&[u8], u32> = TableDefinition::new("string_ids");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const METRIC_KEY: u8 = 0;
const FORMAT_VERSION: u8 = 1;
const KIND_CLUSTER: u8 = 1;
const KIND_NAME: u8 = 2;
const KIND_SILO: u8 = 3;
const KEY_LEN: usize = 22;
const VALUE_LEN: usize = 34;

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::backend(format!("embedded statistics {what}: {e}"))
}

fn metric_key(level: AggLevel, cluster: u32, time: u64, name: u32, silo: u32) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[0] = METRIC_KEY;
    k[1] = level.code();
    k[2..6].copy_from_slice(&cluster.to_be_bytes());
    k[6..14].copy_from_slice(&time.to_be_bytes());
    k[14..18].copy_from_slice(&name.to_be_bytes());
    k[18..22].copy_from_slice(&silo.to_be_bytes());
    k
}

/// (time, name id, silo id) of a metric key.
fn parse_key(k: &[u8]) -> Option<(u64, u32, u32)> {
    if k.len() != KEY_LEN || k[0] != METRIC_KEY {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(k[i..i + 4].try_into().expect("4 bytes"));
    Some((
        u64::from_be_bytes(k[6..14].try_into().expect("8 bytes")),
        u32_at(14),
        u32_at(18),
    ))
}

fn encode_value(a: &Aggregate, is_delta: bool) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[0] = FORMAT_VERSION;
    v[1] = u8::from(is_delta);
    v[2..10].copy_from_slice(&a.count.to_be_bytes());
    v[10..18].copy_from_slice(&a.sum.to_be_bytes());
    v[18..26].copy_from_slice(&a.min.to_be_bytes());
    v[26..34].copy_from_slice(&a.max.to_be_bytes());
    v
}

fn decode_value(v: &[u8]) -> std::result::Result<(Aggregate, bool), String> {
    if v.len() != VALUE_LEN || v[0] != FORMAT_VERSION {
        return Err(format!("a {}-byte value of format {:?}", v.len(), v.first()));
    }
    let f = |i: usize| f64::from_be_bytes(v[i..i + 8].try_into().expect("8 bytes"));
    Ok((
        Aggregate {
            count: u64::from_be_bytes(v[2..10].try_into().expect("8 bytes")),
            sum: f(10),
            min: f(18),
            max: f(26),
        },
        v[1] & 1 == 1,
    ))
}

fn string_id_key(kind: u8, s: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + s.len());
    k.push(kind);
    k.extend_from_slice(s.as_bytes());
    k
}

fn string_key(kind: u8, id: u32) -> [u8; 5] {
    let mut k = [kind, 0, 0, 0, 0];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The kind of cached string a key kind is (the cluster's own id is interned once,
/// when the store opens, and not cached).
fn cached_kind(kind: u8) -> Option<StringKind> {
    match kind {
        KIND_NAME => Some(StringKind::Name),
        KIND_SILO => Some(StringKind::Silo),
        _ => None,
    }
}

struct Inner {
    db: Database,
    cluster_id: String,
    cluster: u32,
    options: StatisticsOptions,
    cache: StringCache,
}

/// The statistics of one cluster in a redb file (see the crate docs for the layout).
/// Cheap to clone; several clusters may share one file (open it once per cluster
/// with [`EmbeddedStatistics::open_in`]).
#[derive(Clone)]
pub struct EmbeddedStatistics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedStatistics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStatistics")
            .field("cluster_id", &self.inner.cluster_id)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The id of `s` of `kind`, allocated in `tx` when new. The caller clears the
    /// caches if `tx` is not committed.
    fn intern(&self, tx: &WriteTransaction, kind: u8, s: &str, now: u64) -> Result<u32> {
        if let Some(id) = cached_kind(kind).and_then(|k| self.cache.id(k, s)) {
            return Ok(id);
        }
        let key = string_id_key(kind, s);
        let mut ids = tx
            .open_table(STRING_IDS)
            .map_err(|e| backend("open string_ids", e))?;
        let found = ids
            .get(key.as_slice())
            .map_err(|e| backend("read string id", e))?
            .map(|g| g.value());
        let id = match found {
            Some(id) => id,
            None => {
                let mut meta = tx.open_table(META).map_err(|e| backend("open meta", e))?;
                let next = meta
                    .get("next_string_id")
                    .map_err(|e| backend("read next id", e))?
                    .map_or(0, |g| g.value());
                let id = u32::try_from(next).map_err(|_| backend("intern", "string ids exhausted"))?;
                meta.insert("next_string_id", next + 1)
                    .map_err(|e| backend("write next id", e))?;
                ids.insert(key.as_slice(), id)
                    .map_err(|e| backend("write string id", e))?;
                let mut value = Vec::with_capacity(9 + s.len());
                value.push(FORMAT_VERSION);
                value.extend_from_slice(&now.to_be_bytes());
                value.extend_from_slice(s.as_bytes());
                let mut strings = tx.open_table(STRINGS).map_err(|e| backend("open strings", e))?;
                strings
                    .insert(string_key(kind, id).as_slice(), value.as_slice())
                    .map_err(|e| backend("write string", e))?;
                id
            }
        };
        if let Some(k) = cached_kind(kind) {
            self.cache.insert(k, s, id);
        }
        Ok(id)
    }

    /// The string of `id`: the cache, else one point read.
    fn string(
        &self,
        strings: &impl ReadableTable<&'static [u8], &'static [u8]>,
        kind: u8,
        id: u32,
    ) -> Result<String> {
        if let Some(s) = cached_kind(kind).and_then(|k| self.cache.string(k, id)) {
            return Ok(s);
        }
        let key = string_key(kind, id);
        let raw = strings
            .get(key.as_slice())
            .map_err(|e| backend("read string", e))?
            .ok_or_else(|| Error::corrupt(format!("strings/{kind}/{id}"), "no such interned string"))?;
        let v = raw.value();
        if v.len() < 9 || v[0] != FORMAT_VERSION {
            return Err(Error::corrupt(
                format!("strings/{kind}/{id}"),
                "malformed string record",
            ));
        }
        let s = String::from_utf8(v[9..].to_vec())
            .map_err(|e| Error::corrupt(format!("strings/{kind}/{id}"), e))?;
        if let Some(k) = cached_kind(kind) {
            self.cache.insert(k, &s, id);
        }
        Ok(s)
    }

    fn append(&self, points: &[StatPoint]) -> Result<usize> {
        let tx = self.db.begin_write().map_err(|e| backend("begin write", e))?;
        let result = self.append_in(&tx, points);
        let committed = match result {
            Ok(n) => tx.commit().map(|_| n).map_err(|e| backend("commit", e)),
            Err(e) => Err(e),
        };
        if committed.is_err() {
            // Ids allocated in the aborted transaction must not stay cached.
            self.cache.clear();
        }
        committed
    }

    fn append_in(&self, tx: &WriteTransaction, points: &[StatPoint]) -> Result<usize> {
        let now = Timestamp::now().as_millis();
        let mut metrics = tx.open_table(METRICS).map_err(|e| backend("open metrics", e))?;
        let mut new = 0;
        for p in points {
            let name = self.intern(tx, KIND_NAME, &p.name, now)?;
            let silo = self.intern(tx, KIND_SILO, &p.silo, now)?;
            let t = p.time.as_millis();
            let raw = metric_key(AggLevel::Raw, self.cluster, t, name, silo);
            if metrics
                .get(raw.as_slice())
                .map_err(|e| backend("read point", e))?
                .is_some()
            {
                continue;
            }
            metrics
                .insert(
                    raw.as_slice(),
                    encode_value(&Aggregate::of(p.value), p.is_delta).as_slice(),
                )
                .map_err(|e| backend("write point", e))?;
            for level in AggLevel::BUCKETS {
                let key = metric_key(
                    level,
                    self.cluster,
                    bucket_start(level, p.time).as_millis(),
                    name,
                    silo,
                );
                let old = metrics
                    .get(key.as_slice())
                    .map_err(|e| backend("read bucket", e))?
                    .map(|g| decode_value(g.value()));
                let aggregate = match old {
                    Some(Ok((mut a, _))) => {
                        a.add(p.value);
                        a
                    }
                    Some(Err(reason)) => return Err(Error::corrupt(format!("metrics/{key:02x?}"), reason)),
                    None => Aggregate::of(p.value),
                };
                metrics
                    .insert(key.as_slice(), encode_value(&aggregate, p.is_delta).as_slice())
                    .map_err(|e| backend("write bucket", e))?;
            }
            new += 1;
        }
        Ok(new)
    }

    fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>> {
        let tx = self.db.begin_read().map_err(|e| backend("begin read", e))?;
        let metrics = match tx.open_table(METRICS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(backend("open metrics", e)),
        };
        let strings = tx.open_table(STRINGS).map_err(|e| backend("open strings", e))?;
        let lo = metric_key(filter.level, self.cluster, filter.from.as_millis(), 0, 0);
        let hi = metric_key(filter.level, self.cluster, filter.to.as_millis(), 0, 0);
        let mut out = Vec::new();
        for entry in metrics
            .range(lo.as_slice()..hi.as_slice())
            .map_err(|e| backend("scan", e))?
        {
            let (k, v) = entry.map_err(|e| backend("scan", e))?;
            let key = k.value();
            let name_of = || format!("metrics/{key:02x?}");
            let (time, name, silo) =
                parse_key(key).ok_or_else(|| Error::corrupt(name_of(), "malformed key"))?;
            let (aggregate, is_delta) = decode_value(v.value()).map_err(|r| Error::corrupt(name_of(), r))?;
            let name = self.string(&strings, KIND_NAME, name)?;
            let silo = self.string(&strings, KIND_SILO, silo)?;
            let time = Timestamp::from_millis(time);
            if filter.matches(time, &name, &silo) {
                out.push(StatRecord {
                    level: filter.level,
                    time,
                    silo,
                    name,
                    aggregate,
                    is_delta,
                });
            }
        }
        out.sort_by(|a, b| (a.time, &a.name, &a.silo).cmp(&(b.time, &b.name, &b.silo)));
        Ok(out)
    }

    fn expire(&self, now: Timestamp) -> Result<usize> {
        let cutoff = now.saturating_sub(self.options.retention());
        let tx = self.db.begin_write().map_err(|e| backend("begin write", e))?;
        let mut removed = 0;
        {
            let mut metrics = tx.open_table(METRICS).map_err(|e| backend("open metrics", e))?;
            for level in AggLevel::ALL {
                // Raw points before the cutoff; buckets that ended by it (the range
                // end is where `bucket_expired` turns false).
                let end = match level {
                    AggLevel::Raw => cutoff.as_millis(),
                    _ => cutoff
                        .as_millis()
                        .saturating_sub(level.width_ms())
                        .saturating_add(1),
                };
                let lo = metric_key(level, self.cluster, 0, 0, 0);
                let hi = metric_key(level, self.cluster, end, 0, 0);
                let mut doomed = Vec::new();
                for entry in metrics
                    .range(lo.as_slice()..hi.as_slice())
                    .map_err(|e| backend("expire", e))?
                {
                    let (k, _) = entry.map_err(|e| backend("expire", e))?;
                    doomed.push(k.value().to_vec());
                }
                for key in &doomed {
                    metrics.remove(key.as_slice()).map_err(|e| backend("expire", e))?;
                }
                removed += doomed.len();
            }
        }
        tx.commit().map_err(|e| backend("commit", e))?;
        Ok(removed)
    }
}

impl EmbeddedStatistics {
    /// Opens (creating if missing) the file at `path` for the statistics of
    /// `cluster_id`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for invalid options or cluster id; [`Error::Backend`]
    /// if the file cannot be opened (another process holds it, a corrupt file, no
    /// permission).
    pub fn open(path: impl AsRef<Path>, cluster_id: &str, options: StatisticsOptions) -> Result<Self> {
        let db = Database::create(path.as_ref())
            .map_err(|e| backend(&format!("open {}", path.as_ref().display()), e))?;
        Self::open_in(db, cluster_id, options)
    }

    /// The statistics of `cluster_id` in an open redb database.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_in(db: Database, cluster_id: &str, options: StatisticsOptions) -> Result<Self> {
        options.validate()?;
        rollcall_core::validate_id("cluster_id", cluster_id)?;
        let mut inner = Inner {
            db,
            cluster_id: cluster_id.to_owned(),
            cluster: 0,
            cache: StringCache::new(options.metadata_string_cache_capacity),
            options,
        };
        let tx = inner.db.begin_write().map_err(|e| backend("begin write", e))?;
        let cluster = inner.intern(&tx, KIND_CLUSTER, cluster_id, Timestamp::now().as_millis())?;
        // Every table exists from now on, so reads never meet a missing one.
        tx.open_table(METRICS).map_err(|e| backend("open metrics", e))?;
        tx.open_table(STRINGS).map_err(|e| backend("open strings", e))?;
        tx.commit().map_err(|e| backend("commit", e))?;
        inner.cluster = cluster;
        Ok(EmbeddedStatistics {
            inner: Arc::new(inner),
        })
    }

    /// How many strings (cluster ids, names, silo ids) the file has interned.
    pub fn interned_strings(&self) -> Result<u64> {
        let tx = self.inner.db.begin_read().map_err(|e| backend("begin read", e))?;
        let meta = tx.open_table(META).map_err(|e| backend("open meta", e))?;
        Ok(meta
            .get("next_string_id")
            .map_err(|e| backend("read next id", e))?
            .map_or(0, |g| g.value()))
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| backend("task", e))?
    }
}

#[async_trait]
impl StatisticsStore for EmbeddedStatistics {
    fn cluster_id(&self) -> &str {
        &self.inner.cluster_id
    }

    async fn append(&self, points: &[StatPoint]) -> Result<usize> {
        for p in points {
            p.validate()?;
        }
        let points = points.to_vec();
        self.blocking(move |inner| inner.append(&points)).await
    }

    async fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>> {
        let filter = filter.clone();
        self.blocking(move |inner| inner.scan(&filter)).await
    }

    async fn expire(&self, now: Timestamp) -> Result<usize> {
        self.blocking(move |inner| inner.expire(now)).await
    }
}

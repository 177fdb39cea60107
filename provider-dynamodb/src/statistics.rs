//! The statistics store on DynamoDB: a table of its own (`statistics_table`, keys
//! `ShardKey` and `SortKey`), time-bucketed as Orleans' statistics tables are (their
//! partition key is the deployment id plus the hour), and also spread over
//! `statistics_shards` partitions per hour by a hash of the silo, so that a large
//! cluster's appends in one hour do not all land on one partition.
//!
//! | item | `ShardKey` | `SortKey` | attributes |
//! |---|---|---|---|
//! | raw point or bucket | `<level: 2 digits>#<hour start ms: 16 hex>#<shard: 2 hex>#<cluster>` | `<start ms: 16 hex><name id: 8 hex><silo id: 8 hex>` | `Count` (N), `Sum`, `Min`, `Max` (S: exact decimal f64), `IsDelta` (BOOL) |
//! | interned string | `s#<cluster>` | `n:<name>` or `s:<silo>` | `Id` (N) |
//! | its reverse | `s#<cluster>` | `#<id: 8 hex>` | `Str` (S: `n:<name>` or `s:<silo>`) |
//! | id counter | `s#<cluster>` | `#next` | `Next` (N) |
//! | hours index | `m#<cluster>` | `hours` | `Hours` (NS: hour starts in ms holding data) |
//!
//! A point and its three buckets share an hour and a shard. An append reads the
//! items it touches (BatchGetItem, strongly consistent), folds the new points in,
//! and writes raw points and buckets in one TransactWriteItems conditioned on each
//! raw point being new and each bucket's `Count` being what was read; a conflict
//! (another silo folded into the same bucket) reads again and retries, for at most
//! the store's timeout. Sums, minima and maxima are strings so that every finite f64
//! round-trips exactly (DynamoDB numbers stop at 10^125).
//!
//! A scan reads the hours index, then queries each (hour, shard) partition of the
//! level in range with a sort-key range (only the silos' shards when the filter
//! names silos). Expiry deletes whole hours once they are past the retention and
//! trims the hour that holds the cutoff with a sort-key range. A point appended
//! after its hour was expired is not seen by scans (it was older than the
//! retention).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Put, ReturnValue, TransactWriteItem};
use futures_util::future::try_join_all;
use rollcall_core::statistics::{
    bucket_start, expired_below, parse_record_key, record_key, validate_batch, Aggregate, StringCache,
    StringKind,
};
use rollcall_core::{
    actor_hash, AggLevel, Error, Result, StatFilter, StatPoint, StatRecord, StatisticsOptions,
    StatisticsStore, Timestamp,
};
use tokio::sync::OnceCell;

use crate::conn::{n, s, Attrs, Conn, Item};
use crate::schema::{self, SHARD_KEY, SORT_KEY};

const HOUR_MS: u64 = 3_600_000;
/// Items one TransactWriteItems may hold.
const TRANSACT_ITEMS: usize = 40;
/// Partition queries of a scan or an expiry in flight at once.
const PARALLEL_QUERIES: usize = 8;

/// The statistics of one cluster on DynamoDB (see the module docs for the layout).
#[derive(Debug)]
pub struct DynamoDbStatistics {
    conn: Arc<Conn>,
    cluster_id: String,
    options: StatisticsOptions,
    cache: StringCache,
    /// Hours this handle knows to be in the hours index (cleared when it grows
    /// past a day of retention's worth).
    known_hours: Mutex<HashSet<u64>>,
    ready: OnceCell<()>,
}

/// The key of one data item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct DataKey {
    pk: String,
    sk: String,
}

/// A stored raw point or bucket.
#[derive(Clone, Copy, Debug)]
struct Cell {
    aggregate: Aggregate,
    is_delta: bool,
}

fn hex_time(t: u64) -> String {
    format!("{t:016x}")
}

impl DynamoDbStatistics {
    pub(crate) fn new(conn: Arc<Conn>, cluster_id: &str, options: StatisticsOptions) -> Self {
        DynamoDbStatistics {
            conn,
            cluster_id: cluster_id.to_owned(),
            cache: StringCache::new(options.metadata_string_cache_capacity),
            options,
            known_hours: Mutex::new(HashSet::new()),
            ready: OnceCell::new(),
        }
    }

    fn table_name(&self) -> &str {
        &self.conn.config.statistics_table
    }

    /// Checks (once per handle) that the table exists, creating it when the URL
    /// says `create_if_missing=true`.
    async fn ready(&self) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                schema::ensure_table(
                    &self.conn,
                    self.table_name(),
                    schema::Kind::Statistics,
                    self.conn.config.create_if_missing,
                )
                .await
            })
            .await
            .map(|_| ())
    }

    fn key(pk: impl Into<String>, sk: impl Into<String>) -> Item {
        Item::from([(SHARD_KEY.into(), s(pk)), (SORT_KEY.into(), s(sk))])
    }

    fn shard(&self, silo: &str) -> u32 {
        actor_hash(silo) % self.conn.config.statistics_shards
    }

    fn partition(&self, level: AggLevel, hour: u64, shard: u32) -> String {
        format!(
            "{:02}#{}#{shard:02x}#{}",
            level.code(),
            hex_time(hour),
            self.cluster_id
        )
    }

    fn strings_pk(&self) -> String {
        format!("s#{}", self.cluster_id)
    }

    fn hours_key(&self) -> Item {
        Self::key(format!("m#{}", self.cluster_id), "hours")
    }

    fn corrupt(&self, key: &DataKey, why: impl std::fmt::Display) -> Error {
        Error::corrupt(format!("{} {} {}", self.table_name(), key.pk, key.sk), why)
    }

    fn decode_cell(&self, key: &DataKey, item: &Item) -> Result<Cell> {
        let a = Attrs(item);
        let f = |name: &str| -> std::result::Result<f64, String> {
            let v: f64 = a.parsed(name)?;
            if v.is_finite() {
                Ok(v)
            } else {
                Err(format!("attribute {name} is not finite"))
            }
        };
        let decoded = (|| -> std::result::Result<Cell, String> {
            let is_delta = match item.get("IsDelta") {
                Some(AttributeValue::Bool(b)) => *b,
                Some(_) => return Err("attribute IsDelta is not a boolean".into()),
                None => return Err("attribute IsDelta is missing".into()),
            };
            Ok(Cell {
                aggregate: Aggregate {
                    count: a.n("Count")?,
                    sum: f("Sum")?,
                    min: f("Min")?,
                    max: f("Max")?,
                },
                is_delta,
            })
        })();
        decoded.map_err(|why| self.corrupt(key, why))
    }

    fn encode_cell(key: &DataKey, cell: &Cell) -> Item {
        let mut item = Self::key(key.pk.clone(), key.sk.clone());
        item.insert("Count".into(), n(cell.aggregate.count));
        // `{:?}` of an f64 is its shortest exact decimal (with an exponent when large
        // or small), which `parse` reads back bit for bit.
        item.insert("Sum".into(), s(format!("{:?}", cell.aggregate.sum)));
        item.insert("Min".into(), s(format!("{:?}", cell.aggregate.min)));
        item.insert("Max".into(), s(format!("{:?}", cell.aggregate.max)));
        item.insert("IsDelta".into(), AttributeValue::Bool(cell.is_delta));
        item
    }

    fn data_key(item: &Item) -> Option<DataKey> {
        let a = Attrs(item);
        Some(DataKey {
            pk: a.s(SHARD_KEY).ok()?.to_owned(),
            sk: a.s(SORT_KEY).ok()?.to_owned(),
        })
    }

    /// The ids of `strings` (of one kind each), interning the new ones: the cache,
    /// else one BatchGetItem, else a counter increment and a conditional
    /// TransactWriteItems of the string and its reverse (a concurrent interning of the
    /// same string wins: its id is read back).
    async fn intern(
        &self,
        strings: &BTreeSet<(StringKind, String)>,
    ) -> Result<HashMap<(StringKind, String), u32>> {
        let mut ids = HashMap::new();
        let mut missing = Vec::new();
        for (kind, st) in strings {
            match self.cache.id(*kind, st) {
                Some(id) => {
                    ids.insert((*kind, st.clone()), id);
                }
                None => missing.push((*kind, st.clone())),
            }
        }
        if missing.is_empty() {
            return Ok(ids);
        }
        let pk = self.strings_pk();
        let field = |kind: StringKind, st: &str| format!("{}:{st}", kind.tag());
        let keys = missing
            .iter()
            .map(|(k, st)| Self::key(pk.clone(), field(*k, st)))
            .collect();
        let mut found: HashMap<String, u32> = HashMap::new();
        for item in self.conn.batch_get(self.table_name(), keys).await? {
            let a = Attrs(&item);
            let sk = a
                .s(SORT_KEY)
                .map_err(|e| Error::corrupt(format!("{} {pk}", self.table_name()), e))?;
            let id = a
                .n("Id")
                .map_err(|e| Error::corrupt(format!("{} {pk} {sk}", self.table_name()), e))?;
            found.insert(sk.to_owned(), id);
        }
        for (kind, st) in missing {
            let f = field(kind, &st);
            let id = match found.get(&f) {
                Some(id) => *id,
                None => self.allocate(&pk, &f).await?,
            };
            self.cache.insert(kind, &st, id);
            ids.insert((kind, st), id);
        }
        Ok(ids)
    }

    /// A new id for `field` (`n:<name>`/`s:<silo>`), or the id a racing writer gave it.
    async fn allocate(&self, pk: &str, field: &str) -> Result<u32> {
        let table = self.table_name();
        let out = self
            .conn
            .client
            .update_item()
            .table_name(table)
            .set_key(Some(Self::key(pk, "#next")))
            .update_expression("ADD #n :one")
            .expression_attribute_names("#n", "Next")
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await
            .map_err(|e| self.conn.error("UpdateItem (string id counter)", table, e))?;
        let next: u64 = out
            .attributes
            .as_ref()
            .map(|a| Attrs(a).n("Next"))
            .unwrap_or_else(|| Err("no Next returned".into()))
            .map_err(|e| Error::corrupt(format!("{table} {pk} #next"), e))?;
        let id = u32::try_from(next).map_err(|_| Error::backend(format!("{table}: string ids exhausted")))?;
        let mut forward = Self::key(pk, field);
        forward.insert("Id".into(), n(id));
        let mut reverse = Self::key(pk, format!("#{id:08x}"));
        reverse.insert("Str".into(), s(field));
        let put = |item: Item| {
            Put::builder()
                .table_name(table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", SHARD_KEY)
                .build()
                .map(|p| TransactWriteItem::builder().put(p).build())
                .map_err(|e| Error::backend(format!("dynamodb intern: {e}")))
        };
        let ops = vec![put(forward)?, put(reverse)?];
        if self
            .conn
            .transact("TransactWriteItems (intern)", table, ops)
            .await?
        {
            return Ok(id);
        }
        // A concurrent interning of the same string won: use its id.
        let winner = self.conn.batch_get(table, vec![Self::key(pk, field)]).await?;
        let item = winner
            .first()
            .ok_or_else(|| Error::backend(format!("{table}: interning {field:?} lost a race to nothing")))?;
        Attrs(item)
            .n("Id")
            .map_err(|e| Error::corrupt(format!("{table} {pk} {field}"), e))
    }

    /// The strings of `ids` (the cache, else BatchGetItem of the reverse items).
    async fn strings_of(
        &self,
        ids: &BTreeSet<(StringKind, u32)>,
    ) -> Result<HashMap<(StringKind, u32), String>> {
        let pk = self.strings_pk();
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        for &(kind, id) in ids {
            match self.cache.string(kind, id) {
                Some(st) => {
                    out.insert((kind, id), st);
                }
                None => missing.push((kind, id)),
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let keys = missing
            .iter()
            .map(|(_, id)| Self::key(pk.clone(), format!("#{id:08x}")))
            .collect();
        let mut by_id: HashMap<u32, String> = HashMap::new();
        for item in self.conn.batch_get(self.table_name(), keys).await? {
            let a = Attrs(&item);
            let sk = a
                .s(SORT_KEY)
                .map_err(|e| Error::corrupt(format!("{} {pk}", self.table_name()), e))?;
            let id = sk
                .strip_prefix('#')
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::corrupt(format!("{} {pk} {sk}", self.table_name()), "not #<id in hex>")
                })?;
            let st = a
                .s("Str")
                .map_err(|e| Error::corrupt(format!("{} {pk} {sk}", self.table_name()), e))?;
            by_id.insert(id, st.to_owned());
        }
        for (kind, id) in missing {
            let key = || format!("{} {pk} #{id:08x}", self.table_name());
            let st = by_id
                .get(&id)
                .ok_or_else(|| Error::corrupt(key(), "no such interned string"))?;
            let st = st
                .strip_prefix(kind.tag())
                .and_then(|r| r.strip_prefix(':'))
                .ok_or_else(|| Error::corrupt(key(), format!("a {kind:?} id names {st:?}")))?;
            self.cache.insert(kind, st, id);
            out.insert((kind, id), st.to_owned());
        }
        Ok(out)
    }

    /// Hour starts (ms) in the hours index.
    async fn hours(&self) -> Result<BTreeSet<u64>> {
        let table = self.table_name();
        let out = self
            .conn
            .client
            .get_item()
            .table_name(table)
            .set_key(Some(self.hours_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.conn.error("GetItem (hours)", table, e))?;
        match out.item.as_ref().and_then(|i| i.get("Hours")) {
            None => Ok(BTreeSet::new()),
            Some(AttributeValue::Ns(hours)) => hours
                .iter()
                .map(|h| h.parse::<u64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::corrupt(format!("{table} m#{} hours", self.cluster_id), e)),
            Some(_) => Err(Error::corrupt(
                format!("{table} m#{} hours", self.cluster_id),
                "attribute Hours is not a number set",
            )),
        }
    }

    /// Adds `hours` to the hours index (`ADD` to a number set: idempotent), or
    /// removes them (`DELETE`).
    async fn change_hours(&self, hours: &BTreeSet<u64>, add: bool) -> Result<()> {
        if hours.is_empty() {
            return Ok(());
        }
        let table = self.table_name();
        self.conn
            .client
            .update_item()
            .table_name(table)
            .set_key(Some(self.hours_key()))
            .update_expression(if add { "ADD #h :h" } else { "DELETE #h :h" })
            .expression_attribute_names("#h", "Hours")
            .expression_attribute_values(
                ":h",
                AttributeValue::Ns(hours.iter().map(u64::to_string).collect()),
            )
            .send()
            .await
            .map_err(|e| self.conn.error("UpdateItem (hours)", table, e))?;
        Ok(())
    }

    /// Folds `points` (validated, ids known) in: one transaction per group of at
    /// most 100 items, retried on conflicts within the timeout. Returns how many
    /// were new.
    async fn fold(&self, points: &[(DataKey, [DataKey; 3], f64, bool)]) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + self.conn.config.timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let mut keys: BTreeSet<&DataKey> = BTreeSet::new();
            for (raw, buckets, _, _) in points {
                keys.insert(raw);
                keys.extend(buckets.iter());
            }
            let request = keys
                .iter()
                .map(|k| Self::key(k.pk.clone(), k.sk.clone()))
                .collect();
            let mut stored: HashMap<DataKey, Cell> = HashMap::new();
            for item in self.conn.batch_get(self.table_name(), request).await? {
                let key = Self::data_key(&item)
                    .ok_or_else(|| Error::corrupt(self.table_name(), "an item without keys"))?;
                let cell = self.decode_cell(&key, &item)?;
                stored.insert(key, cell);
            }
            let mut changed: BTreeMap<&DataKey, Cell> = BTreeMap::new();
            let mut new_raw = Vec::new();
            for (raw, buckets, value, is_delta) in points {
                if stored.contains_key(raw) || changed.contains_key(raw) {
                    continue;
                }
                new_raw.push(raw);
                changed.insert(
                    raw,
                    Cell {
                        aggregate: Aggregate::of(*value),
                        is_delta: *is_delta,
                    },
                );
                for b in buckets {
                    let cell = changed.get(b).or_else(|| stored.get(b)).copied();
                    let next = match cell {
                        Some(mut c) => {
                            c.aggregate.add(*value);
                            c.is_delta = *is_delta;
                            c
                        }
                        None => Cell {
                            aggregate: Aggregate::of(*value),
                            is_delta: *is_delta,
                        },
                    };
                    changed.insert(b, next);
                }
            }
            if changed.is_empty() {
                return Ok(0);
            }
            let table = self.table_name();
            let mut ops = Vec::with_capacity(changed.len());
            for (key, cell) in &changed {
                let mut put = Put::builder()
                    .table_name(table)
                    .set_item(Some(Self::encode_cell(key, cell)));
                put = match stored.get(*key) {
                    None => put
                        .condition_expression("attribute_not_exists(#k)")
                        .expression_attribute_names("#k", SHARD_KEY),
                    Some(old) => put
                        .condition_expression("#c = :c")
                        .expression_attribute_names("#c", "Count")
                        .expression_attribute_values(":c", n(old.aggregate.count)),
                };
                let put = put
                    .build()
                    .map_err(|e| Error::backend(format!("dynamodb statistics put: {e}")))?;
                ops.push(TransactWriteItem::builder().put(put).build());
            }
            if self
                .conn
                .transact("TransactWriteItems (statistics)", table, ops)
                .await?
            {
                return Ok(new_raw.len());
            }
            // Another writer folded into one of these buckets: read again.
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(Error::backend(format!(
                    "dynamodb statistics append on table `{table}`: still conflicting with \
                     other writers after {:?}",
                    self.conn.config.timeout
                )));
            }
            let jitter = rand::random::<u64>() % (pause.as_millis() as u64 + 1);
            tokio::time::sleep(pause + Duration::from_millis(jitter)).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// Every item of partition `pk` with a sort key in `[lo, hi]` (strongly
    /// consistent, all pages).
    async fn query_range(&self, pk: String, lo: String, hi: String) -> Result<Vec<Item>> {
        let q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#k = :k AND #s BETWEEN :lo AND :hi")
            .expression_attribute_names("#k", SHARD_KEY)
            .expression_attribute_names("#s", SORT_KEY)
            .expression_attribute_values(":k", s(pk))
            .expression_attribute_values(":lo", s(lo))
            .expression_attribute_values(":hi", s(hi));
        self.conn.query_all(self.table_name(), q).await
    }

    /// Runs the queries `(pk, lo, hi)` at most [`PARALLEL_QUERIES`] at a time.
    async fn query_many(&self, queries: Vec<(String, String, String)>) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        for group in queries.chunks(PARALLEL_QUERIES) {
            let done = try_join_all(
                group
                    .iter()
                    .cloned()
                    .map(|(pk, lo, hi)| self.query_range(pk, lo, hi)),
            )
            .await?;
            items.extend(done.into_iter().flatten());
        }
        Ok(items)
    }
}

const NAME: StringKind = StringKind::Name;
const SILO: StringKind = StringKind::Silo;

/// The lowest and highest sort keys of records starting in `[from, to)`.
fn sort_range(from: u64, to: u64) -> (String, String) {
    (hex_time(from), format!("{}ffffffffffffffff", hex_time(to - 1)))
}

#[async_trait]
impl StatisticsStore for DynamoDbStatistics {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn append(&self, points: &[StatPoint]) -> Result<usize> {
        if !validate_batch(points)? {
            return Ok(0);
        }
        self.ready().await?;
        let strings: BTreeSet<(StringKind, String)> = points
            .iter()
            .flat_map(|p| [(NAME, p.name.clone()), (SILO, p.silo.clone())])
            .collect();
        let ids = self.intern(&strings).await?;
        let hours: BTreeSet<u64> = points
            .iter()
            .map(|p| p.time.as_millis() / HOUR_MS * HOUR_MS)
            .filter(|h| {
                !self
                    .known_hours
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(h)
            })
            .collect();
        self.change_hours(&hours, true).await?;
        {
            let mut known = self.known_hours.lock().unwrap_or_else(|e| e.into_inner());
            if known.len() > 1024 {
                known.clear();
            }
            known.extend(hours);
        }
        let mut keyed = Vec::with_capacity(points.len());
        for p in points {
            let (name, silo) = (ids[&(NAME, p.name.clone())], ids[&(SILO, p.silo.clone())]);
            let t = p.time.as_millis();
            let hour = t / HOUR_MS * HOUR_MS;
            let shard = self.shard(&p.silo);
            let key = |level: AggLevel| DataKey {
                pk: self.partition(level, hour, shard),
                sk: record_key(bucket_start(level, p.time).as_millis(), name, silo),
            };
            let buckets = [
                key(AggLevel::Minute1),
                key(AggLevel::Minute10),
                key(AggLevel::Minute60),
            ];
            keyed.push((key(AggLevel::Raw), buckets, p.value, p.is_delta));
        }
        // Groups whose items fit one transaction (each point adds at most 4).
        let mut new = 0;
        let mut start = 0;
        while start < keyed.len() {
            let mut items: HashSet<&DataKey> = HashSet::new();
            let mut end = start;
            while end < keyed.len() && items.len() + 4 <= TRANSACT_ITEMS {
                items.insert(&keyed[end].0);
                items.extend(keyed[end].1.iter());
                end += 1;
            }
            new += self.fold(&keyed[start..end]).await?;
            start = end;
        }
        Ok(new)
    }

    async fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>> {
        if filter.from >= filter.to {
            return Ok(Vec::new());
        }
        self.ready().await?;
        let (from, to) = (filter.from.as_millis(), filter.to.as_millis());
        let shards: BTreeSet<u32> = match &filter.silos {
            Some(silos) => silos.iter().map(|s| self.shard(s)).collect(),
            None => (0..self.conn.config.statistics_shards).collect(),
        };
        let (lo, hi) = sort_range(from, to);
        let queries: Vec<(String, String, String)> = self
            .hours()
            .await?
            .into_iter()
            .filter(|h| h.saturating_add(HOUR_MS) > from && *h < to)
            .flat_map(|h| shards.iter().map(move |sh| (h, *sh)))
            .map(|(h, sh)| (self.partition(filter.level, h, sh), lo.clone(), hi.clone()))
            .collect();
        let mut cells = Vec::new();
        let mut wanted = BTreeSet::new();
        for item in self.query_many(queries).await? {
            let key = Self::data_key(&item)
                .ok_or_else(|| Error::corrupt(self.table_name(), "an item without keys"))?;
            let (time, name, silo) = parse_record_key(&key.sk)
                .ok_or_else(|| self.corrupt(&key, "not <time><name id><silo id> in hex"))?;
            let cell = self.decode_cell(&key, &item)?;
            wanted.insert((NAME, name));
            wanted.insert((SILO, silo));
            cells.push((time, name, silo, cell));
        }
        let strings = self.strings_of(&wanted).await?;
        let mut out: Vec<StatRecord> = cells
            .into_iter()
            .map(|(time, name, silo, cell)| StatRecord {
                level: filter.level,
                time: Timestamp::from_millis(time),
                name: strings[&(NAME, name)].clone(),
                silo: strings[&(SILO, silo)].clone(),
                aggregate: cell.aggregate,
                is_delta: cell.is_delta,
            })
            .filter(|r| filter.matches(r.time, &r.name, &r.silo))
            .collect();
        out.sort_by(|a, b| (a.time, &a.name, &a.silo).cmp(&(b.time, &b.name, &b.silo)));
        Ok(out)
    }

    async fn expire(&self, now: Timestamp) -> Result<usize> {
        self.ready().await?;
        let cutoff = now.saturating_sub(self.options.retention()).as_millis();
        let shards = self.conn.config.statistics_shards;
        let mut gone_hours = BTreeSet::new();
        let mut queries = Vec::new();
        for h in self.hours().await? {
            if h.saturating_add(HOUR_MS) <= cutoff {
                // Every record of this hour ended by the cutoff.
                gone_hours.insert(h);
                for level in AggLevel::ALL {
                    for sh in 0..shards {
                        queries.push((self.partition(level, h, sh), hex_time(0), "g".into()));
                    }
                }
            } else if h < cutoff {
                for level in AggLevel::ALL {
                    let below = expired_below(level, Timestamp::from_millis(cutoff)).as_millis();
                    if below > h {
                        for sh in 0..shards {
                            queries.push((self.partition(level, h, sh), hex_time(0), sort_range(0, below).1));
                        }
                    }
                }
            }
        }
        let items = self.query_many(queries).await?;
        let keys: Vec<Item> = items
            .iter()
            .filter_map(Self::data_key)
            .map(|k| Self::key(k.pk, k.sk))
            .collect();
        let removed = keys.len();
        self.conn.batch_delete(self.table_name(), keys).await?;
        self.change_hours(&gone_hours, false).await?;
        self.known_hours
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|h| !gone_hours.contains(h));
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_cover_exactly_the_range() {
        let (lo, hi) = sort_range(0x10, 0x20);
        let sk = |t: u64| record_key(t, u32::MAX, u32::MAX);
        assert!(lo <= sk(0x10) && sk(0x1f) <= hi && sk(0x20) > hi);
        assert!(format!("{}0000000000000000", hex_time(0x0f)) < lo);
        assert_eq!(parse_record_key(&sk(0x1f)), Some((0x1f, u32::MAX, u32::MAX)));
        assert_eq!(parse_record_key("zz"), None);
    }
}

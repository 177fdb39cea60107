//! T1: each table operation of each provider next to the backend's raw single-key
//! write and raw conditional write, through the same client library, at the same
//! concurrency, interleaved round by round.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use hdrhistogram::Histogram;
use rollcall_core::{
    history, MembershipEntry, MembershipRow, MembershipTable, ProtocolMode, ReminderEntry, ReminderTable,
    SystemStore, Timestamp,
};
use rollcall_tests::fixtures;
use rollcall_tests::membership_table::{full_entry, silo};
use serde::Serialize;
use tokio::sync::Mutex;

/// Options of `t1` (and `all`).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers to measure: memory, redis, redis-cluster, redis-replicated (a
    /// primary and a replica behind Sentinel; its conditional writes also with
    /// `wait_replicas=1`), etcd, dynamodb (on the local DynamoDB-compatible server
    /// of the tests: not AWS).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,redis,etcd,redis-replicated"
    )]
    providers: Vec<String>,
    /// Concurrent clients (each its own cluster, so no version-row contention).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    clients: Vec<usize>,
    /// Seconds each op runs per round.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Interleaved rounds (every op once per round).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The Markdown report.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// The JSON report.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

/// One operation a client repeats.
#[async_trait]
trait Op: Send + Sync {
    /// Runs the op once for client `i`; returns the duration of its measured part
    /// (some ops first read, unmeasured, what their write needs: an etag).
    async fn once(&self, i: usize) -> anyhow::Result<Duration>;
}

async fn timed<T, E: Into<anyhow::Error>>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<(T, Duration)> {
    let started = Instant::now();
    let v = f.await.map_err(Into::into)?;
    Ok((v, started.elapsed()))
}

/// A value the size of a membership row.
fn payload() -> String {
    serde_json::to_string(&full_entry(1)).expect("row json")
}

/// A raw `SET` of key `<prefix>:raw:<client>`.
struct RedisSet(redis::aio::MultiplexedConnection, String, String);

#[async_trait]
impl Op for RedisSet {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let mut con = self.0.clone();
        let key = format!("{}:raw:{i}", self.2);
        Ok(timed(
            redis::cmd("SET")
                .arg(key)
                .arg(&self.1)
                .query_async::<()>(&mut con),
        )
        .await?
        .1)
    }
}

/// A hash tag whose slot the Redis Cluster node behind `con` serves (`CLUSTER
/// SLOTS` names the node's ranges as seen by itself; `CLUSTER KEYSLOT` places a
/// candidate tag).
pub(crate) async fn local_hash_tag(con: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<String> {
    let myid: String = redis::cmd("CLUSTER").arg("MYID").query_async(con).await?;
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(con).await?;
    let mut mine = Vec::new();
    for range in slots {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi)), Some(redis::Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let id = match master.get(2) {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => continue,
        };
        if id == myid {
            mine.push((*lo, *hi));
        }
    }
    for n in 0..10_000 {
        let tag = format!("bench{n}");
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&tag)
            .query_async(con)
            .await?;
        if mine.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)) {
            return Ok(tag);
        }
    }
    anyhow::bail!("no hash tag of this node's slots among 10,000 candidates")
}

/// The floor of a conditional write on Redis: WATCH + GET pipelined, then MULTI /
/// SET / EXEC, on a connection of the client's own.
struct RedisCas(Vec<Mutex<redis::aio::MultiplexedConnection>>, String, String);

#[async_trait]
impl Op for RedisCas {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let mut con = self.0[i].lock().await;
        let key = format!("{}:cas:{i}", self.2);
        let started = Instant::now();
        let (_v,): (Option<String>,) = redis::pipe()
            .cmd("WATCH")
            .arg(&key)
            .ignore()
            .get(&key)
            .query_async(&mut *con)
            .await?;
        let _: Option<(i64,)> = redis::pipe()
            .atomic()
            .set(&key, &self.1)
            .ignore()
            .incr(format!("{key}:n"), 1)
            .query_async(&mut *con)
            .await?;
        Ok(started.elapsed())
    }
}

/// The floor of a write of the Redis membership row's shape: what `update_row`
/// sends (`WATCH` row and version + `MGET` both, then `MULTI`, `MSET` row and
/// version, `HSET` IAmAlive, `ZADD` delta index, `ZADD` history event, the
/// `ZREMRANGEBYSCORE` trim once the version passes the default capacity, `EXEC`),
/// row-sized values, without the provider around it: no conditional row write with
/// this data layout can be cheaper.
struct RedisRowMulti(
    Vec<Mutex<(redis::aio::MultiplexedConnection, u64)>>,
    String,
    String,
);

#[async_trait]
impl Op for RedisRowMulti {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let mut guard = self.0[i].lock().await;
        let (con, version) = &mut *guard;
        let base = format!("{}:{{shape:{i}}}", self.2);
        let [row, ver, alive, changes, history] =
            ["row", "version", "alive", "changes", "history"].map(|k| format!("{base}:{k}"));
        let started = Instant::now();
        let ((_row, _ver),): ((Option<String>, Option<String>),) = redis::pipe()
            .cmd("WATCH")
            .arg(&[&row, &ver])
            .ignore()
            .cmd("MGET")
            .arg(&[&row, &ver])
            .query_async(&mut *con)
            .await?;
        *version += 1;
        let id = format!("10.0.0.{i}:11111@1");
        let mut tx = redis::pipe();
        tx.atomic()
            .cmd("MSET")
            .arg(&row)
            .arg(&self.1)
            .arg(&ver)
            .arg(format!("{{\"version\":{version}}}"))
            .ignore()
            .hset(&alive, &id, Timestamp::now().to_string())
            .ignore()
            .zadd(&changes, &id, *version)
            .zadd(&history, format!("{version}:{}", self.1), *version)
            .ignore();
        let floor = history::history_floor(*version, history::DEFAULT_HISTORY_CAPACITY);
        if floor > 1 {
            tx.cmd("ZREMRANGEBYSCORE")
                .arg(&history)
                .arg("-inf")
                .arg(format!("({floor}"))
                .ignore();
        }
        let committed: Option<(i64,)> = tx.query_async(&mut *con).await?;
        anyhow::ensure!(committed.is_some(), "row-shaped MULTI conflicted");
        Ok(started.elapsed())
    }
}

struct EtcdPut(etcd_client::KvClient, String);

#[async_trait]
impl Op for EtcdPut {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let mut kv = self.0.clone();
        Ok(timed(kv.put(format!("bench/raw/{i}"), self.1.clone(), None))
            .await?
            .1)
    }
}

/// The floor of a conditional write on etcd: one Txn comparing the key's
/// mod_revision, then a put.
struct EtcdTxn(etcd_client::KvClient, Vec<Mutex<i64>>, String, String);

#[async_trait]
impl Op for EtcdTxn {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let mut kv = self.0.clone();
        let mut rev = self.1[i].lock().await;
        let key = format!("bench/{}/cas/{i}", self.3);
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)])
            .and_then(vec![TxnOp::put(key, self.2.clone(), None)]);
        let (resp, d) = timed(kv.txn(txn)).await?;
        anyhow::ensure!(resp.succeeded(), "raw etcd Txn conflicted");
        *rev = resp.header().map_or(0, |h| h.revision());
        Ok(d)
    }
}

/// The floor of a write of the etcd membership row's shape: the Txn
/// `update_row` sends (compare the row's `mod_revision`, the version key's
/// `mod_revision` and value; put the row, its IAmAlive key and the version; else
/// read the row and the version), without the provider around it. No conditional write the contract allows on
/// etcd can be cheaper, so it bounds the ratio `update_row` can reach.
struct EtcdRowTxn(etcd_client::KvClient, Vec<Mutex<(i64, i64, u64)>>, String, String);

impl EtcdRowTxn {
    fn keys(&self, i: usize) -> [String; 3] {
        let base = format!("bench/{}/shape/{i}", self.3);
        [
            format!("{base}/row"),
            format!("{base}/version"),
            format!("{base}/alive"),
        ]
    }

    async fn new(
        kv: etcd_client::KvClient,
        clients: usize,
        value: String,
        run: String,
    ) -> anyhow::Result<Self> {
        let mut op = EtcdRowTxn(kv, Vec::new(), value, run);
        for i in 0..clients {
            let [_, version, _] = op.keys(i);
            let resp = op.0.put(version, "{\"version\":0}", None).await?;
            let rev = resp.header().map_or(0, |h| h.revision());
            op.1.push(Mutex::new((0, rev, 0)));
        }
        Ok(op)
    }
}

#[async_trait]
impl Op for EtcdRowTxn {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let mut kv = self.0.clone();
        let mut state = self.1[i].lock().await;
        let (row_rev, version_rev, version) = *state;
        let [row, version_key, alive] = self.keys(i);
        let txn = Txn::new()
            .when(vec![
                Compare::mod_revision(version_key.clone(), CompareOp::Equal, version_rev),
                Compare::value(
                    version_key.clone(),
                    CompareOp::Equal,
                    format!("{{\"version\":{version}}}"),
                ),
                Compare::mod_revision(row.clone(), CompareOp::Equal, row_rev),
            ])
            .and_then(vec![
                TxnOp::put(row.clone(), self.2.clone(), None),
                TxnOp::put(alive, Timestamp::now().to_string(), None),
                TxnOp::put(
                    version_key.clone(),
                    format!("{{\"version\":{}}}", version + 1),
                    None,
                ),
            ])
            .or_else(vec![TxnOp::get(row.clone(), None), TxnOp::get(version_key, None)]);
        let (resp, d) = timed(kv.txn(txn)).await?;
        anyhow::ensure!(resp.succeeded(), "row-shaped etcd Txn conflicted");
        let rev = resp.header().map_or(0, |h| h.revision());
        *state = (rev, rev, version + 1);
        Ok(d)
    }
}

/// The raw single-item write on DynamoDB: a `PutItem` of a row-sized item.
struct DynamoPut(aws_sdk_dynamodb::Client, String, String);

#[async_trait]
impl Op for DynamoPut {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        use aws_sdk_dynamodb::types::AttributeValue as V;
        let put = self
            .0
            .put_item()
            .table_name("rollcall-bench-raw")
            .item("ClusterId", V::S(format!("{}-raw", self.2)))
            .item("SiloIdentity", V::S(i.to_string()))
            .item("Value", V::S(self.1.clone()));
        Ok(timed(put.send()).await?.1)
    }
}

/// The raw conditional write on DynamoDB: a `PutItem` conditioned on the item's
/// `ETag` attribute.
struct DynamoCas(aws_sdk_dynamodb::Client, Vec<Mutex<u64>>, String, String);

#[async_trait]
impl Op for DynamoCas {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        use aws_sdk_dynamodb::types::AttributeValue as V;
        let mut n = self.1[i].lock().await;
        let put = self
            .0
            .put_item()
            .table_name("rollcall-bench-raw")
            .item("ClusterId", V::S(format!("{}-cas", self.3)))
            .item("SiloIdentity", V::S(i.to_string()))
            .item("Value", V::S(self.2.clone()))
            .item("ETag", V::N((*n + 1).to_string()))
            .condition_expression("attribute_not_exists(ETag) OR ETag = :e")
            .expression_attribute_values(":e", V::N(n.to_string()));
        let d = timed(put.send()).await?.1;
        *n += 1;
        Ok(d)
    }
}

/// A raw SDK client for the bench's references (in the region of the store under
/// test), and its table (created if missing).
pub(crate) async fn dynamo_client(endpoint: &str) -> anyhow::Result<aws_sdk_dynamodb::Client> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let client = fixtures::dynamodb_client(endpoint, fixtures::dynamodb_region()).await;
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
    };
    let def = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
    };
    let created = client
        .create_table()
        .table_name("rollcall-bench-raw")
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def("ClusterId")?)
        .attribute_definitions(def("SiloIdentity")?)
        .key_schema(key("ClusterId", KeyType::Hash)?)
        .key_schema(key("SiloIdentity", KeyType::Range)?)
        .send()
        .await;
    if let Err(e) = created {
        let in_use = e
            .as_service_error()
            .is_some_and(|s| s.is_resource_in_use_exception());
        anyhow::ensure!(in_use, "create the bench's raw table: {e:?}");
    }
    Ok(client)
}

/// The name of [`EtcdRowTxn`]'s figure.
const ROW_SHAPED_MULTI: &str = "raw MULTI of update_row's shape (MGET, 4 writes)";
const ROW_SHAPED_TXN: &str = "raw Txn of update_row's shape (3 compares, 3 puts)";

/// The in-process reference: a locked map insert.
struct MapInsert(std::sync::Mutex<HashMap<usize, String>>, String);

#[async_trait]
impl Op for MapInsert {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.0.lock().expect("map").insert(i, self.1.clone());
        Ok(started.elapsed())
    }
}

/// Per-client membership tables, each with the client's own row.
struct Tables {
    tables: Vec<Arc<dyn MembershipTable>>,
}

impl Tables {
    async fn new(store: &Arc<dyn SystemStore>, clients: usize, run: &str) -> anyhow::Result<Tables> {
        let mut tables = Vec::new();
        for i in 0..clients {
            let t = store.membership_table(&format!("{run}-c{i}"), ProtocolMode::Extended)?;
            t.init(true).await?;
            let v = t.read_all().await?.version;
            anyhow::ensure!(t.insert_row(&own(i), &v.next()).await?, "setup insert");
            tables.push(t);
        }
        Ok(Tables { tables })
    }
}

fn own(i: usize) -> MembershipEntry {
    full_entry(i as u32)
}

struct InsertRow(Tables, Vec<Mutex<u64>>);

#[async_trait]
impl Op for InsertRow {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let t = &self.0.tables[i];
        let mut n = self.1[i].lock().await;
        *n += 1;
        let entry = MembershipEntry {
            silo: silo(i as u32, 1_000 + *n),
            ..own(i)
        };
        let v = t.read_row(&own(i).silo).await?.version;
        let (ok, d) = timed(t.insert_row(&entry, &v.next())).await?;
        anyhow::ensure!(ok, "insert_row conflicted with no other writer");
        Ok(d)
    }
}

struct UpdateRow(Tables);

#[async_trait]
impl Op for UpdateRow {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let t = &self.0.tables[i];
        let s = own(i).silo;
        let snap = t.read_row(&s).await?;
        let (row, etag) = snap
            .row(&s)
            .cloned()
            .map(MembershipRow::into_parts)
            .context("own row")?;
        let row = MembershipEntry {
            update_zone: row.update_zone.wrapping_add(1),
            ..row
        };
        let (ok, d) = timed(t.update_row(&row, &etag, &snap.version.next())).await?;
        anyhow::ensure!(ok, "update_row conflicted with no other writer");
        Ok(d)
    }
}

struct ReadRow(Tables);

#[async_trait]
impl Op for ReadRow {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        Ok(timed(self.0.tables[i].read_row(&own(i).silo)).await?.1)
    }
}

struct IAmAlive(Tables);

#[async_trait]
impl Op for IAmAlive {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        Ok(
            timed(self.0.tables[i].update_i_am_alive(&own(i).silo, Timestamp::now()))
                .await?
                .1,
        )
    }
}

/// `read_all` of one shared table of `rows` rows.
struct ReadAll(Arc<dyn MembershipTable>);

impl ReadAll {
    async fn new(store: &Arc<dyn SystemStore>, rows: u32, run: &str) -> anyhow::Result<ReadAll> {
        let t = store.membership_table(&format!("{run}-all{rows}"), ProtocolMode::Extended)?;
        t.init(true).await?;
        for n in 0..rows {
            // The version alone (a read_all per insert would make setup quadratic).
            let v = t.read_row(&full_entry(0).silo).await?.version;
            anyhow::ensure!(t.insert_row(&full_entry(n), &v.next()).await?, "setup insert");
        }
        Ok(ReadAll(t))
    }
}

#[async_trait]
impl Op for ReadAll {
    async fn once(&self, _: usize) -> anyhow::Result<Duration> {
        let (snap, d) = timed(self.0.read_all()).await?;
        anyhow::ensure!(!snap.is_empty(), "empty read_all");
        Ok(d)
    }
}

/// The reference of `read_all` on Redis: see [`RAW_READ_SCRIPT`].
struct RawReadScript(rollcall::redis::RedisStore, String);

#[async_trait]
impl Op for RawReadScript {
    async fn once(&self, _: usize) -> anyhow::Result<Duration> {
        let (rows, d) = timed(self.0.read_all_reply_rows(&self.1)).await?;
        anyhow::ensure!(rows == 1000, "raw read script saw {rows} rows");
        Ok(d)
    }
}

const RAW_READ_SCRIPT: &str = "raw read script (1,000 rows, not decoded)";

struct ReminderUpsert(Arc<dyn ReminderTable>, Vec<Mutex<u64>>);

#[async_trait]
impl Op for ReminderUpsert {
    async fn once(&self, i: usize) -> anyhow::Result<Duration> {
        let mut n = self.1[i].lock().await;
        *n += 1;
        let e = ReminderEntry::new(
            self.0.service_id(),
            format!("actor-{i}-{}", *n % 1000),
            "tick",
            Timestamp::now(),
            Some(Duration::from_secs(60)),
        );
        Ok(timed(self.0.upsert_row(&e)).await?.1)
    }
}

/// A ring range of 1/16 of the hash space over 1,000 reminders (~60 rows).
struct ReminderRange(Arc<dyn ReminderTable>);

#[async_trait]
impl Op for ReminderRange {
    async fn once(&self, _: usize) -> anyhow::Result<Duration> {
        let begin: u32 = rand::random();
        let end = begin.wrapping_add(u32::MAX / 16);
        Ok(timed(self.0.read_rows_in_range(begin, end)).await?.1)
    }
}

/// The ops of one provider at one client count, references first.
async fn ops_for(
    provider: &str,
    store: &Arc<dyn SystemStore>,
    endpoint: &str,
    url: &str,
    clients: usize,
) -> anyhow::Result<Vec<(&'static str, Arc<dyn Op>)>> {
    let run = rollcall_tests::unique_id(&format!("bench-{provider}-{clients}"));
    let value = payload();
    let mut ops: Vec<(&'static str, Arc<dyn Op>)> = Vec::new();
    match provider {
        "memory" => ops.push((
            "raw write (locked map insert)",
            Arc::new(MapInsert(Default::default(), value)),
        )),
        "redis" | "redis-cluster" | "redis-replicated" => {
            let url = if provider != "redis-cluster" {
                endpoint.to_owned()
            } else {
                // The raw reference runs on the first node of the cluster (its own keys).
                let first = endpoint
                    .trim_start_matches("redis+cluster://")
                    .split(',')
                    .next()
                    .unwrap_or_default();
                format!("redis://{first}")
            };
            let client = redis::Client::open(url.as_str())?;
            let mut shared = client.get_multiplexed_async_connection().await?;
            // On a cluster, the reference's keys carry a hash tag of a slot that the
            // node it talks to serves (else every command is a MOVED).
            let prefix = if provider != "redis-cluster" {
                "bench".to_owned()
            } else {
                format!("{{{}}}", local_hash_tag(&mut shared).await?)
            };
            ops.push((
                "raw write (SET)",
                Arc::new(RedisSet(shared, value.clone(), prefix.clone())),
            ));
            let mut own = Vec::new();
            for _ in 0..clients {
                own.push(Mutex::new(client.get_multiplexed_async_connection().await?));
            }
            ops.push((
                "raw conditional write (WATCH/GET/MULTI/EXEC)",
                Arc::new(RedisCas(own, value.clone(), format!("{prefix}:{run}"))),
            ));
            let mut shaped = Vec::new();
            for _ in 0..clients {
                shaped.push(Mutex::new((client.get_multiplexed_async_connection().await?, 0)));
            }
            ops.push((
                ROW_SHAPED_MULTI,
                Arc::new(RedisRowMulti(shaped, value, format!("{prefix}:{run}"))),
            ));
        }
        "etcd" => {
            let eps: Vec<String> = endpoint.split(',').map(|e| format!("http://{e}")).collect();
            let kv = etcd_client::Client::connect(eps, None).await?.kv_client();
            ops.push(("raw write (put)", Arc::new(EtcdPut(kv.clone(), value.clone()))));
            let revs = (0..clients).map(|_| Mutex::new(0)).collect();
            ops.push((
                "raw conditional write (Txn on mod_revision)",
                Arc::new(EtcdTxn(kv.clone(), revs, value.clone(), run.clone())),
            ));
            ops.push((
                ROW_SHAPED_TXN,
                Arc::new(EtcdRowTxn::new(kv, clients, value, run.clone()).await?),
            ));
        }
        "dynamodb" => {
            let client = dynamo_client(endpoint).await?;
            ops.push((
                "raw write (PutItem)",
                Arc::new(DynamoPut(client.clone(), value.clone(), run.clone())),
            ));
            let etags = (0..clients).map(|_| Mutex::new(0)).collect();
            ops.push((
                "raw conditional write (PutItem on ETag)",
                Arc::new(DynamoCas(client, etags, value, run.clone())),
            ));
        }
        other => anyhow::bail!("unknown provider `{other}`"),
    }
    let counters = || (0..clients).map(|_| Mutex::new(0)).collect::<Vec<_>>();
    ops.push((
        "insert_row",
        Arc::new(InsertRow(
            Tables::new(store, clients, &format!("{run}-ins")).await?,
            counters(),
        )),
    ));
    ops.push((
        "update_row",
        Arc::new(UpdateRow(
            Tables::new(store, clients, &format!("{run}-upd")).await?,
        )),
    ));
    if provider == "etcd" || provider == "redis" {
        // The same write without the membership-history event (the trim, a range
        // delete that finds nothing, stays): what the history event costs, and
        // what `update_row` costs next to the raw conditional writes above.
        let url = if provider == "etcd" {
            format!("etcd://{endpoint}?history=0")
        } else {
            format!("{endpoint}?history=0")
        };
        let plain = rollcall::connect(&url).await?;
        ops.push((
            "update_row (history=0)",
            Arc::new(UpdateRow(
                Tables::new(&plain, clients, &format!("{run}-updh0")).await?,
            )),
        ));
    }
    ops.push((
        "read_row",
        Arc::new(ReadRow(Tables::new(store, clients, &format!("{run}-rr")).await?)),
    ));
    for rows in [10, 100, 1000] {
        let name: &'static str = match rows {
            10 => "read_all (10 rows)",
            100 => "read_all (100 rows)",
            _ => "read_all (1,000 rows)",
        };
        ops.push((name, Arc::new(ReadAll::new(store, rows, &run).await?)));
    }
    if provider.starts_with("redis") {
        // The same script on the same 1,000 rows, its reply parsed by the client
        // library but not decoded into rows: the reference for read_all's decoding.
        let raw = rollcall::redis::RedisStore::open(endpoint).await?;
        ops.push((
            RAW_READ_SCRIPT,
            Arc::new(RawReadScript(raw, format!("{run}-all1000"))),
        ));
    }
    ops.push((
        "update_i_am_alive",
        Arc::new(IAmAlive(Tables::new(store, clients, &format!("{run}-hb")).await?)),
    ));
    let reminders = store.reminder_table(&format!("{run}-rem"))?;
    reminders.init().await?;
    ops.push((
        "reminder upsert_row",
        Arc::new(ReminderUpsert(reminders, counters())),
    ));
    let ranged = store.reminder_table(&format!("{run}-range"))?;
    for n in 0..1000 {
        let e = ReminderEntry::new(ranged.service_id(), format!("a{n}"), "r", Timestamp::now(), None);
        ranged.upsert_row(&e).await?;
    }
    ops.push((
        "reminder range read (1/16 of 1,000)",
        Arc::new(ReminderRange(ranged)),
    ));
    if provider == "redis-replicated" {
        // The same conditional writes acknowledged only once the replica has them
        // (`WAIT 1`), interleaved with those above on the same servers.
        let waited = rollcall::connect(&format!("{url}?wait_replicas=1")).await?;
        ops.push((
            WAITED_OPS[0].1,
            Arc::new(InsertRow(
                Tables::new(&waited, clients, &format!("{run}-insw")).await?,
                counters(),
            )),
        ));
        ops.push((
            WAITED_OPS[1].1,
            Arc::new(UpdateRow(
                Tables::new(&waited, clients, &format!("{run}-updw")).await?,
            )),
        ));
        let reminders = waited.reminder_table(&format!("{run}-remw"))?;
        reminders.init().await?;
        ops.push((WAITED_OPS[2].1, Arc::new(ReminderUpsert(reminders, counters()))));
    }
    Ok(ops)
}

/// Runs `op` on `clients` concurrent clients for `for_time` (each client at
/// least once), recording into `hist`.
async fn measure(
    op: Arc<dyn Op>,
    clients: usize,
    for_time: Duration,
    hist: &mut Histogram<u64>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + for_time;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let op = op.clone();
        tasks.spawn(async move {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            // At least one op per client: on a loaded machine a client task can
            // first run after the deadline, and a cell with no sample is no
            // figure (the bench smoke saw a rate of 1e15 ops/s from 0 samples).
            loop {
                let d = op.once(i).await?;
                h.record(d.as_micros().max(1) as u64).ok();
                if Instant::now() >= deadline {
                    break;
                }
            }
            anyhow::Ok(h)
        });
    }
    while let Some(r) = tasks.join_next().await {
        hist.add(r??).ok();
    }
    Ok(())
}

/// One figure of the report.
#[derive(Serialize, Clone, Debug)]
struct Cell {
    provider: String,
    op: String,
    clients: usize,
    samples: u64,
    p50_us: u64,
    p99_us: u64,
    /// `clients / mean latency` of the measured part.
    ops_per_s: f64,
    /// `ops_per_s` over the raw write's, same provider, clients and run.
    vs_raw_write: f64,
    /// `ops_per_s` over the raw conditional write's (absent for memory).
    vs_raw_conditional: Option<f64>,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let for_time = Duration::from_secs_f64(args.seconds);
    let mut cells = Vec::new();
    for provider in &args.providers {
        let (store, endpoint, url, _guard) = open(provider).await?;
        for &clients in &args.clients {
            if provider == "dynamodb" && clients > 1 {
                // moto serves one request at a time (scripts/moto_serialized.py), and
                // backs a table up before every transaction: more clients measure its
                // lock and its copies, not a DynamoDB.
                eprintln!("T1 dynamodb at {clients} clients: skipped (the local server is serialized)");
                continue;
            }
            eprintln!("T1 {provider} at {clients} client(s)...");
            let ops = ops_for(provider, &store, &endpoint, &url, clients).await?;
            let mut hists: Vec<Histogram<u64>> = ops
                .iter()
                .map(|_| Histogram::new(3).expect("histogram"))
                .collect();
            for _ in 0..args.rounds {
                for ((_, op), hist) in ops.iter().zip(hists.iter_mut()) {
                    measure(op.clone(), clients, for_time, hist).await?;
                }
            }
            let rate = |h: &Histogram<u64>| clients as f64 * 1e6 / h.mean().max(1e-9);
            let raw = rate(&hists[0]);
            let conditional = (provider != "memory").then(|| rate(&hists[1]));
            for ((name, _), h) in ops.iter().zip(&hists) {
                cells.push(Cell {
                    provider: provider.clone(),
                    op: (*name).to_owned(),
                    clients,
                    samples: h.len(),
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                    ops_per_s: rate(h),
                    vs_raw_write: rate(h) / raw,
                    vs_raw_conditional: conditional.map(|c| rate(h) / c),
                });
            }
        }
    }
    let out = args.out.unwrap_or_else(|| crate::workspace_file("BENCHMARKS.md"));
    let json = args
        .json
        .unwrap_or_else(|| crate::workspace_file("benchmarks.json"));
    // The header (provenance) and the T1 section are replaced; the sections other
    // benchmarks wrote stay.
    let md = report(&cells, &args.clients, args.rounds, args.seconds);
    let (header, section) = md.split_at(md.find("\n## T1").map_or(0, |i| i + 1));
    crate::set_header(&out, header)?;
    crate::set_section(&out, "## T1", &format!("{}\n", section.trim_end()))?;
    crate::set_json_key(
        &json,
        "provenance",
        serde_json::to_value(crate::provenance().into_iter().collect::<BTreeMap<_, _>>())?,
    )?;
    crate::set_json_key(&json, "t1", serde_json::to_value(&cells)?)?;
    eprintln!("wrote {} and {}", out.display(), json.display());
    Ok(())
}

/// The store URL of `provider` on the backend at `endpoint` (as [`open`] returns it).
pub(crate) fn store_url(provider: &str, endpoint: &str) -> String {
    match provider {
        "memory" => "memory://bench".to_owned(),
        "etcd" => format!("etcd://{endpoint}"),
        "dynamodb" => fixtures::dynamodb_url(endpoint),
        _ => endpoint.to_owned(),
    }
}

/// What a benchmark keeps alive while it measures a provider (its servers).
pub(crate) type Guard = Option<Box<dyn std::any::Any + Send>>;

/// Opens a provider's store on a backend found or started like the tests do:
/// the store, the backend's endpoint (for `redis-replicated`, the primary's
/// `redis://` URL, where the raw references run), the store URL, and what keeps
/// the backend alive.
///
/// `redis-replicated` is a primary with one replica behind three sentinels
/// (the failover tests' set-up), opened by its `redis+sentinel://` URL.
pub(crate) async fn open(provider: &str) -> anyhow::Result<(Arc<dyn SystemStore>, String, String, Guard)> {
    if provider == "redis-replicated" {
        let s = rollcall_tests::replicated::Sentinels::start()
            .await
            .map_err(|e| anyhow::anyhow!("a Redis Sentinel set-up: {e}"))?;
        let primary = s.ports[s.primary().await.map_err(|e| anyhow::anyhow!(e))?];
        let url = s.url("");
        let store = rollcall::connect(&url)
            .await
            .with_context(|| format!("connect {url}"))?;
        return Ok((
            store,
            format!("redis://127.0.0.1:{primary}"),
            url,
            Some(Box::new(s)),
        ));
    }
    let backend = match provider {
        "memory" => None,
        "redis" => fixtures::redis().await,
        "redis-cluster" => fixtures::redis_cluster().await,
        "etcd" => fixtures::etcd().await,
        "dynamodb" => fixtures::dynamodb().await,
        other => anyhow::bail!(
            "unknown provider `{other}` (memory, redis, redis-cluster, redis-replicated, etcd, dynamodb)"
        ),
    };
    let endpoint = match (provider, &backend) {
        ("memory", _) => String::new(),
        (_, None) => anyhow::bail!("no {provider} backend"),
        (_, Some(b)) => b.endpoint.clone(),
    };
    let url = store_url(provider, &endpoint);
    let store = rollcall::connect(&url)
        .await
        .with_context(|| format!("connect {url}"))?;
    Ok((
        store,
        endpoint,
        url,
        backend.map(|b| Box::new(b) as Box<dyn std::any::Any + Send>),
    ))
}

/// The ops measured on `redis-replicated` with and without `wait_replicas=1`.
pub(crate) const WAITED_OPS: [(&str, &str); 3] = [
    ("insert_row", "insert_row (wait_replicas=1)"),
    ("update_row", "update_row (wait_replicas=1)"),
    ("reminder upsert_row", "reminder upsert_row (wait_replicas=1)"),
];

fn report(cells: &[Cell], clients: &[usize], rounds: u32, seconds: f64) -> String {
    use std::fmt::Write as _;
    let mut md = String::from("# rollcall benchmarks\n\n");
    md.push_str("Written by `cargo run --release -p rollcall-bench -- all`; do not edit by hand.\n\n");
    for (k, v) in crate::provenance() {
        let _ = writeln!(md, "- {k}: {v}");
    }
    let _ = writeln!(
        md,
        "\n## T1: table operations next to the backend's raw writes\n\n\
         Method: each client works on a cluster of its own (no version-row contention; that is T2). \
         Every op runs {seconds} s per round, {rounds} rounds, interleaved with the references, so \
         noise hits both. p50/p99 are of the measured part: `insert_row` and `update_row` first \
         read (unmeasured) the version and etag they need. ops/s = clients / mean latency. \
         The ratio columns divide by the raw single-key write (Redis `SET`, etcd `put`, a locked \
         map insert) and by the raw conditional write (Redis `WATCH`+`GET`, `MULTI`/`SET`/`EXEC`; \
         etcd `Txn` on `mod_revision`) measured in the same run through the same client library; \
         etcd also gets the bare Txn `update_row` sends (its compares, puts and else-reads), the \
         floor under any conditional row write on etcd, and `update_row` on a store opened with \
         `history=0` (no history event in its Txn; the trim, an empty range delete, stays). \
         DynamoDB runs on the tests' local server (moto behind one lock), not AWS, at 1 client \
         only: its ratios compare rollcall's requests with a bare PutItem and a bare conditional \
         PutItem conditioned on an ETag on that server, and its absolute figures say nothing about AWS. \
         Read the ratios: absolute numbers move 20-30% between runs on shared machines.\n"
    );
    let providers: Vec<&str> = {
        let mut p: Vec<&str> = cells.iter().map(|c| c.provider.as_str()).collect();
        p.dedup();
        p
    };
    for p in &providers {
        let _ = writeln!(md, "### {p}\n");
        md.push_str("| op | clients | p50 µs | p99 µs | ops/s | / raw write | / raw conditional write |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
        for c in cells.iter().filter(|c| c.provider == *p) {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.0} | {:.2} | {} |",
                c.op,
                c.clients,
                c.p50_us,
                c.p99_us,
                c.ops_per_s,
                c.vs_raw_write,
                c.vs_raw_conditional.map_or("-".into(), |r| format!("{r:.2}"))
            );
        }
        md.push('\n');
    }
    if cells.iter().any(|c| c.op == WAITED_OPS[0].1) {
        md.push_str(
            "### redis-replicated: `wait_replicas=1` next to the same writes without it\n\n\
             The same servers and rounds: each conditional write followed by `WAIT 1 1000` on \
             its connection (the replica's acknowledgement), next to the write alone.\n\n\
             | op | clients | p50 µs without / with | ops/s without | ops/s with | with ÷ without |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for &n in clients {
            for (plain, waited) in WAITED_OPS {
                let find = |op: &str| {
                    cells
                        .iter()
                        .find(|c| c.provider == "redis-replicated" && c.op == op && c.clients == n)
                };
                if let (Some(a), Some(b)) = (find(plain), find(waited)) {
                    let _ = writeln!(
                        md,
                        "| {plain} | {n} | {} / {} | {:.0} | {:.0} | {:.2} |",
                        a.p50_us,
                        b.p50_us,
                        a.ops_per_s,
                        b.ops_per_s,
                        b.ops_per_s / a.ops_per_s.max(1e-9)
                    );
                }
            }
        }
        md.push('\n');
    }
    md.push_str(
        "### Goals (reported, not asserted)\n\n\
         The ceiling is the same-run ratio of the cheapest raw write of the shape the \
         provider has to send (Redis: the `WATCH`/`GET`s and `MULTI` of `update_row`'s \
         commands; etcd: the Txn of `update_row`'s compares and puts) to the raw single-key \
         write: a goal above its ceiling cannot be met by any client of that backend with \
         this data layout.\n\n\
         | goal | clients | measured | ceiling | met |\n|---|---:|---:|---:|---|\n",
    );
    let goals = [
        (
            "redis",
            "update_row",
            ROW_SHAPED_MULTI,
            1.0 / 3.0,
            "Redis `update_row` >= 1/3 of raw `SET`",
        ),
        (
            "etcd",
            "update_row",
            ROW_SHAPED_TXN,
            0.8,
            "etcd `update_row` >= 0.8 of raw `put`",
        ),
    ];
    let cell = |provider: &str, op: &str, n: usize| {
        cells
            .iter()
            .find(|c| c.provider == provider && c.op == op && c.clients == n)
    };
    // Time per read_all over time per raw read script: what decoding adds.
    for &n in clients {
        if let (Some(decoded), Some(raw)) = (
            cell("redis", "read_all (1,000 rows)", n),
            cell("redis", RAW_READ_SCRIPT, n),
        ) {
            let slower = raw.ops_per_s / decoded.ops_per_s.max(1e-9);
            let _ = writeln!(
                md,
                "| Redis `read_all` (1,000 rows) <= 1.3 x the raw read script (time) | {n} | {slower:.2} | - | {} |",
                if slower <= 1.3 { "yes" } else { "**no**" }
            );
        }
    }
    for (provider, op, floor, want, what) in goals {
        for &n in clients {
            if let Some(c) = cell(provider, op, n) {
                let ceiling =
                    cell(provider, floor, n).map_or("-".into(), |f| format!("{:.2}", f.vs_raw_write));
                let _ = writeln!(
                    md,
                    "| {what} | {n} | {:.2} | {ceiling} | {} |",
                    c.vs_raw_write,
                    if c.vs_raw_write >= want { "yes" } else { "**no**" }
                );
            }
        }
    }
    md
}

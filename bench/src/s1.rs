//! S1: actor state. Writes and reads of 1 KiB, 64 KiB, 1 MiB and 16 MiB states
//! through `StateStorage` (the envelope, chunking, etags: the path every
//! `PersistentState` call takes) next to the backend's raw conditional write and
//! plain read of the same bytes through the same client library, interleaved
//! round by round; and the heap a loaded `PersistentState` holds beyond its value.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hdrhistogram::Histogram;
use rollcall::state::{Codec, Expected, PersistentState, StateKey, StateStorage};
use rollcall_core::{Etag, SystemStore};
use serde::Serialize;
use tokio::sync::Mutex;

/// Options of `s1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers: redis, etcd, dynamodb, redis-replicated (a primary and a replica
    /// behind Sentinel, measured with and without `wait_replicas=1`); memory has
    /// no backend to compare with.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis,etcd,dynamodb,redis-replicated"
    )]
    providers: Vec<String>,
    /// State sizes, bytes (a size over a provider's largest state is skipped,
    /// and said so).
    #[arg(long, value_delimiter = ',', default_value = "1024,65536,1048576,16777216")]
    sizes: Vec<usize>,
    /// Rounds; each runs every side for `--seconds`, alternating which goes first.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Seconds per side per round (at least 3 write/read pairs each).
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// The reports to add the S1 section and the `s1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One side of a comparison: a conditional write and a read of one value.
#[async_trait]
trait Side: Send + Sync {
    /// Writes the value over the previous one, conditionally on what it wrote last.
    async fn write(&self) -> anyhow::Result<()>;
    /// Reads the value back; its length.
    async fn read(&self) -> anyhow::Result<usize>;
}

/// rollcall's path: `StateStorage::write` with the etag of the last write, and
/// `StateStorage::read`.
struct Ours {
    storage: StateStorage,
    key: StateKey,
    data: Vec<u8>,
    etag: Mutex<Option<Etag>>,
}

#[async_trait]
impl Side for Ours {
    async fn write(&self) -> anyhow::Result<()> {
        let mut etag = self.etag.lock().await;
        let e = self
            .storage
            .write(
                &self.key,
                Expected::from_etag(etag.as_ref()),
                Codec::Raw,
                &self.data,
                None,
            )
            .await?;
        *etag = Some(e);
        Ok(())
    }

    async fn read(&self) -> anyhow::Result<usize> {
        Ok(self.storage.read(&self.key).await?.data.len())
    }
}

/// Redis: a compare-and-set script (one round trip, the cheapest conditional
/// write Redis has: compare a stored etag, write value and etag) and `HGET`.
struct RedisRaw {
    con: redis::aio::MultiplexedConnection,
    key: String,
    data: Vec<u8>,
    etag: Mutex<u64>,
}

static REDIS_CAS: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local cur = redis.call('HGET', KEYS[1], 'e')
if (cur or '') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'e', ARGV[2], 'd', ARGV[3])
return 1
",
    )
});

#[async_trait]
impl Side for RedisRaw {
    async fn write(&self) -> anyhow::Result<()> {
        let mut etag = self.etag.lock().await;
        let expected = if *etag == 0 {
            String::new()
        } else {
            etag.to_string()
        };
        let mut con = self.con.clone();
        let ok: i64 = REDIS_CAS
            .key(&self.key)
            .arg(expected)
            .arg(*etag + 1)
            .arg(self.data.as_slice())
            .invoke_async(&mut con)
            .await?;
        anyhow::ensure!(ok == 1, "raw Redis CAS conflicted");
        *etag += 1;
        Ok(())
    }

    async fn read(&self) -> anyhow::Result<usize> {
        let mut con = self.con.clone();
        let v: Vec<u8> = redis::cmd("HGET")
            .arg(&self.key)
            .arg("d")
            .query_async(&mut con)
            .await?;
        Ok(v.len())
    }
}

/// etcd: a Txn comparing the key's mod_revision, then a put; a get.
struct EtcdRaw {
    kv: etcd_client::KvClient,
    key: String,
    data: Vec<u8>,
    rev: Mutex<i64>,
}

#[async_trait]
impl Side for EtcdRaw {
    async fn write(&self) -> anyhow::Result<()> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let mut rev = self.rev.lock().await;
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                self.key.clone(),
                CompareOp::Equal,
                *rev,
            )])
            .and_then(vec![TxnOp::put(self.key.clone(), self.data.clone(), None)]);
        let resp = self.kv.clone().txn(txn).await?;
        anyhow::ensure!(resp.succeeded(), "raw etcd Txn conflicted");
        *rev = resp.header().map_or(0, |h| h.revision());
        Ok(())
    }

    async fn read(&self) -> anyhow::Result<usize> {
        let resp = self.kv.clone().get(self.key.clone(), None).await?;
        Ok(resp.kvs().first().map_or(0, |kv| kv.value().len()))
    }
}

/// DynamoDB: the bytes as items of at most `item` bytes (DynamoDB's 400 KB item
/// limit), the first a `PutItem` conditioned on an `ETag` attribute, the rest
/// plain `PutItem`s; read back with `GetItem`s.
struct DynamoRaw {
    client: aws_sdk_dynamodb::Client,
    run: String,
    data: Vec<u8>,
    item: usize,
    etag: Mutex<u64>,
}

#[async_trait]
impl Side for DynamoRaw {
    async fn write(&self) -> anyhow::Result<()> {
        use aws_sdk_dynamodb::primitives::Blob;
        use aws_sdk_dynamodb::types::AttributeValue as V;
        let mut n = self.etag.lock().await;
        for (i, part) in self.data.chunks(self.item).enumerate() {
            let mut put = self
                .client
                .put_item()
                .table_name("rollcall-bench-raw")
                .item("ClusterId", V::S(self.run.clone()))
                .item("SiloIdentity", V::S(format!("{i:08}")))
                .item("Value", V::B(Blob::new(part.to_vec())));
            if i == 0 {
                put = put
                    .item("ETag", V::N((*n + 1).to_string()))
                    .condition_expression("attribute_not_exists(ETag) OR ETag = :e")
                    .expression_attribute_values(":e", V::N(n.to_string()));
            }
            put.send().await?;
        }
        *n += 1;
        Ok(())
    }

    async fn read(&self) -> anyhow::Result<usize> {
        use aws_sdk_dynamodb::types::AttributeValue as V;
        let mut len = 0;
        for i in 0..self.data.len().div_ceil(self.item) {
            let out = self
                .client
                .get_item()
                .table_name("rollcall-bench-raw")
                .key("ClusterId", V::S(self.run.clone()))
                .key("SiloIdentity", V::S(format!("{i:08}")))
                .consistent_read(true)
                .send()
                .await?;
            if let Some(V::B(b)) = out.item.as_ref().and_then(|i| i.get("Value")) {
                len += b.as_ref().len();
            }
        }
        Ok(len)
    }
}

/// What one side did over every round.
struct Tally {
    write: Histogram<u64>,
    read: Histogram<u64>,
    /// Write-then-read pairs and the time they took.
    pairs: u64,
    busy: Duration,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            write: Histogram::new(3).expect("histogram"),
            read: Histogram::new(3).expect("histogram"),
            pairs: 0,
            busy: Duration::ZERO,
        }
    }

    /// Bytes per second through write-then-read pairs of `size` bytes.
    fn round_trip_bytes_per_s(&self, size: usize) -> f64 {
        self.pairs as f64 * size as f64 / self.busy.as_secs_f64().max(1e-9)
    }
}

async fn run_side(side: &dyn Side, size: usize, for_time: Duration, t: &mut Tally) -> anyhow::Result<()> {
    let deadline = Instant::now() + for_time;
    let mut n = 0;
    while n < 3 || Instant::now() < deadline {
        let started = Instant::now();
        side.write().await?;
        let wrote = started.elapsed();
        let len = side.read().await?;
        let both = started.elapsed();
        anyhow::ensure!(len == size, "read back {len} bytes of {size}");
        t.write.record(wrote.as_micros().max(1) as u64).ok();
        t.read.record((both - wrote).as_micros().max(1) as u64).ok();
        t.pairs += 1;
        t.busy += both;
        n += 1;
    }
    Ok(())
}

/// One S1 figure: one provider, one size.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    provider: String,
    bytes: usize,
    samples: u64,
    write_p50_us: u64,
    write_p99_us: u64,
    raw_write_p50_us: u64,
    raw_write_p99_us: u64,
    /// Our write p50 over the raw conditional write's p50 (lower is better).
    write_p50_ratio: f64,
    write_p99_ratio: f64,
    read_p50_us: u64,
    raw_read_p50_us: u64,
    /// Bytes per second through write-then-read pairs.
    round_trip_bytes_per_s: f64,
    raw_round_trip_bytes_per_s: f64,
    /// Ours over raw (higher is better).
    round_trip_ratio: f64,
}

/// The raw side of `provider` for `data`.
async fn raw_side(provider: &str, endpoint: &str, data: Vec<u8>, run: &str) -> anyhow::Result<Arc<dyn Side>> {
    Ok(match provider {
        "redis" | "redis-replicated" => {
            let con = redis::Client::open(endpoint)?
                .get_multiplexed_async_connection()
                .await?;
            Arc::new(RedisRaw {
                con,
                key: format!("bench:s1:{run}"),
                data,
                etag: Mutex::new(0),
            })
        }
        "etcd" => {
            let eps: Vec<String> = endpoint.split(',').map(|e| format!("http://{e}")).collect();
            let kv = etcd_client::Client::connect(eps, None).await?.kv_client();
            Arc::new(EtcdRaw {
                kv,
                key: format!("bench/s1/{run}"),
                data,
                rev: Mutex::new(0),
            })
        }
        "dynamodb" => Arc::new(DynamoRaw {
            client: crate::t1::dynamo_client(endpoint).await?,
            run: run.to_owned(),
            data,
            item: rollcall::dynamodb::DYNAMODB_STATE_LIMITS.chunk_bytes,
            etag: Mutex::new(0),
        }),
        other => anyhow::bail!("S1 compares redis, etcd and dynamodb, not {other}"),
    })
}

/// Heap bytes a loaded `PersistentState<String>` holds beyond its value's own
/// heap block: the mean over `n` states loaded from a memory store.
fn persistent_state_overhead(n: usize, value_len: usize) -> anyhow::Result<(f64, f64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let store = rollcall::memory::MemoryStore::new();
        let storage = StateStorage::new(store.state_table("s1")?);
        let value = serde_json::to_vec(&"x".repeat(value_len))?;
        let keys: Vec<StateKey> = (0..n)
            .map(|i| StateKey::new(format!("cart/{i}"), "cart"))
            .collect::<Result<_, _>>()?;
        for k in &keys {
            storage
                .write(k, Expected::Absent, Codec::Json, &value, None)
                .await?;
        }
        let mut held = Vec::with_capacity(n);
        let before = crate::heap_live();
        for k in &keys {
            held.push(PersistentState::<String>::new(storage.clone(), k.clone()));
        }
        for s in &held {
            s.load().await?;
        }
        // Everything the loaded states hold: the state itself, its shared part,
        // its copy of the key, the etag, the value.
        let total = (crate::heap_live() - before) as f64 / n as f64
            + std::mem::size_of::<PersistentState<String>>() as f64;
        // The value as a `String` of its own would hold: its block and its
        // 24-byte handle.
        let value_block = crate::block(value_len) as f64 + 24.0;
        // The key as the caller already holds it (two strings).
        let key_blocks = (crate::block("cart/0".len() + 2) + crate::block("cart".len())) as f64;
        anyhow::ensure!(held.iter().all(|s| s.read(String::len) == value_len));
        Ok((total - value_block, total - value_block - key_blocks))
    })
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let rows = rt.block_on(measure(&args))?;
    drop(rt);
    let (overhead, overhead_without_key) = persistent_state_overhead(10_000, 1000)?;
    let mut md = String::from("## S1: actor state next to the backend's raw conditional write\n");
    let _ = writeln!(
        md,
        "\nMethod: one state per provider and size, rewritten over its own etag \
         (`StateStorage::write` with `Expected::Etag`, `Codec::Raw`) then read back \
         (`StateStorage::read`), next to the backend's raw conditional write of the same \
         bytes through the same client library (Redis: a one-round-trip compare-and-set \
         script on a hash; etcd: a `Txn` on `mod_revision` with one put; DynamoDB: a `PutItem` \
         conditioned on an `ETag`, plus plain `PutItem`s of 350 KiB items past the first) \
         and its plain read (`HGET`, `get`, `GetItem`s). {} rounds of {} s per side, the \
         order alternating. Round trip = bytes / (write + read time). A state over a \
         provider's largest state is not measured (etcd stores 1 MiB).\n",
        args.rounds, args.seconds
    );
    md.push_str("| provider | size | samples | write p50 / p99 µs | raw p50 / p99 µs | write ÷ raw p50 / p99 | read p50 µs | raw read p50 µs | round trip MB/s | raw MB/s | round trip ÷ raw |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} / {} | {} / {} | {:.2} / {:.2} | {} | {} | {:.1} | {:.1} | {:.2} |",
            r.provider,
            human(r.bytes),
            r.samples,
            r.write_p50_us,
            r.write_p99_us,
            r.raw_write_p50_us,
            r.raw_write_p99_us,
            r.write_p50_ratio,
            r.write_p99_ratio,
            r.read_p50_us,
            r.raw_read_p50_us,
            r.round_trip_bytes_per_s / 1e6,
            r.raw_round_trip_bytes_per_s / 1e6,
            r.round_trip_ratio,
        );
    }
    let _ = writeln!(
        md,
        "\nA loaded `PersistentState<String>` of a 1,000-byte value holds {overhead:.0} bytes \
         (its handle, its shared part, its key, its etag) beyond what the value would hold as a \
         `String` of its own ({overhead_without_key:.0} without its key's two strings, which a \
         caller holds anyway), the mean over 10,000 states (the counting allocator, glibc block \
         sizes).\n"
    );
    let _ = writeln!(md, "### Goals (reported, not asserted)\n");
    for r in rows.iter().filter(|r| r.bytes == 1024) {
        let _ = writeln!(
            md,
            "- {} 1 KiB write: p50 {:.2}x raw (goal <= 1.15x), p99 {:.2}x (goal <= 1.3x): {}",
            r.provider,
            r.write_p50_ratio,
            r.write_p99_ratio,
            if r.write_p50_ratio <= 1.15 && r.write_p99_ratio <= 1.3 {
                "met"
            } else {
                "missed"
            }
        );
    }
    for r in rows.iter().filter(|r| r.bytes == 16 << 20) {
        let _ = writeln!(
            md,
            "- {} 16 MiB round trip: {:.2}x raw (goal >= 0.5x): {}",
            r.provider,
            r.round_trip_ratio,
            if r.round_trip_ratio >= 0.5 {
                "met"
            } else {
                "missed"
            }
        );
    }
    for r in rows.iter().filter(|r| r.provider.ends_with("wait_replicas=1")) {
        let plain = r.provider.trim_end_matches(" wait_replicas=1");
        if let Some(p) = rows.iter().find(|p| p.provider == plain && p.bytes == r.bytes) {
            let _ = writeln!(
                md,
                "- {plain} {} write with `wait_replicas=1`: p50 {:.2}x the same write without it \
                 ({} / {} µs), round trip {:.2}x (reported: what the replica's acknowledgement costs)",
                human(r.bytes),
                r.write_p50_us as f64 / p.write_p50_us.max(1) as f64,
                r.write_p50_us,
                p.write_p50_us,
                r.round_trip_bytes_per_s / p.round_trip_bytes_per_s.max(1e-9),
            );
        }
    }
    let _ = writeln!(
        md,
        "- `PersistentState` overhead: {overhead:.0} B beyond the value (goal <= 64 B): {}",
        if overhead <= 64.0 { "met" } else { "missed" }
    );
    let json = serde_json::json!({
        "rows": rows,
        "persistent_state_overhead_bytes": overhead,
        "persistent_state_overhead_without_key_bytes": overhead_without_key,
    });
    args.reports.add(("## S1", &md), ("s1", json))
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

async fn measure(args: &Args) -> anyhow::Result<Vec<Row>> {
    let for_time = Duration::from_secs_f64(args.seconds);
    let mut rows = Vec::new();
    for provider in &args.providers {
        let (store, endpoint, url, _guard) = crate::t1::open(provider).await?;
        let store: Arc<dyn SystemStore> = store;
        // On `redis-replicated`, the same sizes again on a store that waits for
        // the replica (`wait_replicas=1`), on the same servers.
        let mut stores = vec![(provider.clone(), store)];
        if provider == "redis-replicated" {
            stores.push((
                format!("{provider} wait_replicas=1"),
                rollcall::connect(&format!("{url}?wait_replicas=1")).await?,
            ));
        }
        for (name, store) in stores {
            let storage = StateStorage::new(store.state_table(&rollcall_tests::unique_id("s1"))?);
            let max = storage.table().limits().max_state_bytes as usize;
            for &size in &args.sizes {
                if size > max {
                    eprintln!(
                        "S1 {provider} {}: over its largest state ({max} bytes), skipped",
                        human(size)
                    );
                    continue;
                }
                eprintln!("S1 {name} {}...", human(size));
                let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                let run = rollcall_tests::unique_id("s1");
                let ours: Arc<dyn Side> = Arc::new(Ours {
                    storage: storage.clone(),
                    key: StateKey::new(format!("bench/{run}"), "state")?,
                    data: data.clone(),
                    etag: Mutex::new(None),
                });
                let raw = raw_side(provider, &endpoint, data, &run).await?;
                let (mut t_ours, mut t_raw) = (Tally::new(), Tally::new());
                for round in 0..args.rounds {
                    let sides: [(&Arc<dyn Side>, &mut Tally); 2] = if round % 2 == 0 {
                        [(&ours, &mut t_ours), (&raw, &mut t_raw)]
                    } else {
                        [(&raw, &mut t_raw), (&ours, &mut t_ours)]
                    };
                    for (side, tally) in sides {
                        run_side(side.as_ref(), size, for_time, tally).await?;
                    }
                }
                let ratio = |a: u64, b: u64| a as f64 / b.max(1) as f64;
                rows.push(Row {
                    provider: name.clone(),
                    bytes: size,
                    samples: t_ours.pairs,
                    write_p50_us: t_ours.write.value_at_quantile(0.5),
                    write_p99_us: t_ours.write.value_at_quantile(0.99),
                    raw_write_p50_us: t_raw.write.value_at_quantile(0.5),
                    raw_write_p99_us: t_raw.write.value_at_quantile(0.99),
                    write_p50_ratio: ratio(
                        t_ours.write.value_at_quantile(0.5),
                        t_raw.write.value_at_quantile(0.5),
                    ),
                    write_p99_ratio: ratio(
                        t_ours.write.value_at_quantile(0.99),
                        t_raw.write.value_at_quantile(0.99),
                    ),
                    read_p50_us: t_ours.read.value_at_quantile(0.5),
                    raw_read_p50_us: t_raw.read.value_at_quantile(0.5),
                    round_trip_bytes_per_s: t_ours.round_trip_bytes_per_s(size),
                    raw_round_trip_bytes_per_s: t_raw.round_trip_bytes_per_s(size),
                    round_trip_ratio: t_ours.round_trip_bytes_per_s(size)
                        / t_raw.round_trip_bytes_per_s(size).max(1e-9),
                });
            }
        }
    }
    Ok(rows)
}

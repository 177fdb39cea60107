//! R4: what one membership change costs the reminder service. `silos` silos on
//! real TCP share one reminder table of `count` reminders, of which `probes` tick
//! every second (the rest every 10 minutes); then one silo joins, one leaves
//! gracefully and one is killed, each after the cluster settled from the one
//! before. Per change: the store calls made until every reminder is held again
//! (lease reads and compare-and-sets, reminder row reads and the rows they
//! returned, membership calls), less what the same span costs a quiet cluster;
//! and the pause of the probe reminders that changed silo: the longest gap
//! between two of their delivered ticks around the change, less the period (p50
//! and p99 over them).
//!
//! Up to `--processes 1` (and on the memory store) the silos share one process and
//! one event loop (fast membership profile). With more, on a networked store, the
//! silos are spread over that many child processes (`rollcall-bench r4-silos`),
//! each with its own event loop, store client and store-call counters, driven over
//! stdin/stdout; their ticks carry wall-clock milliseconds, so pauses compare
//! across processes. A hundred silos with their store clients saturate one event
//! loop on this machine's two cores; spread over processes they do not.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall_core::{
    ClusterMembershipOptions, OnDeclaredDead, ReminderEntry, ReminderOptions, Silo, SiloAddress, SiloHandle,
    SystemStore, Timestamp,
};
use rollcall_tests::counting::CountingStore;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::r5::Process;

/// Options of `r4`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers: memory, redis.
    #[arg(long, value_delimiter = ',', default_value = "memory,redis")]
    providers: Vec<String>,
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    silos: Vec<usize>,
    /// Shard counts S of the reminder service (the choice of the default).
    #[arg(long, value_delimiter = ',', default_value = "1024")]
    shards: Vec<u32>,
    /// Reminders in the cluster.
    #[arg(long, default_value_t = 100_000)]
    count: usize,
    /// Of them, reminders ticking every second (their ticks measure the pause).
    #[arg(long, default_value_t = 2_000)]
    probes: usize,
    /// Silo processes for clusters of `--process-from` silos or more on a
    /// networked store (smaller clusters and the memory store run in this
    /// process); 1 keeps every cluster in this process.
    #[arg(long, default_value_t = 10)]
    processes: usize,
    /// The smallest cluster that runs in `--processes` child processes.
    #[arg(long, default_value_t = 100)]
    process_from: usize,
    /// Checkpoint intervals to run with, in seconds (`lease_checkpoint_interval`;
    /// 0: off): each runs the whole schedule, and its quiet span gives the
    /// steady-state lease writes the checkpoints cost.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    checkpoint_intervals: Vec<u64>,
    /// The child processes' silos use the fast membership profile (by default
    /// Orleans' timings: the fast profile's probes at 100 silos saturate two cores).
    #[arg(long)]
    fast_processes: bool,
    /// The reports to add the R4 section and the `r4` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One membership change.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    provider: String,
    silos: usize,
    /// The service's shard count S.
    shards: u32,
    /// Processes the silos ran in (1: one process, fast membership profile;
    /// more: child processes, default membership options unless
    /// `--fast-processes`).
    processes: usize,
    /// `start` (the cluster's first start: every silo joins and loads; store calls
    /// not net of a quiet span), `join`, `leave` or `crash`.
    kind: String,
    /// Seconds from the change until every reminder was held again (loaded by
    /// its new silo; after a crash deliveries resume at the fence).
    settle_s: f64,
    /// Store calls in that span less a quiet span of the same length:
    /// lease reads, lease compare-and-sets, reminder row reads, rows read,
    /// membership calls.
    lease_reads: i64,
    lease_writes: i64,
    row_reads: i64,
    rows_read: i64,
    membership_calls: i64,
    /// Probe reminders delivered by another silo after the change.
    moved: usize,
    /// Their pause (longest gap between two delivered ticks less the period), ms.
    pause_p50_ms: u64,
    pause_p99_ms: u64,
    /// Once settled: the most reminders one silo holds over the mean (1.0 is even).
    spread: f64,
    /// The holders' `lease_checkpoint_interval`, s (0: off).
    checkpoint_s: u64,
    /// In the quiet span after the start (at least two checkpoint
    /// intervals): lease compare-and-sets per second per silo (what the
    /// checkpoints cost), and lease reads per second per silo.
    steady_lease_cas_per_silo_s: f64,
    steady_lease_reads_per_silo_s: f64,
}

/// A delivered probe tick: (actor, scheduled ms, delivering silo, delivered at
/// in wall-clock ms).
type Tick = (String, u64, String, u64);

/// The probes' ticks of one process.
type Log = Arc<Mutex<Vec<Tick>>>;

fn wall_ms() -> u64 {
    Timestamp::now().as_millis()
}

/// Records the probes' ticks with the silo that delivered them.
struct Sink(Log, String);

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Sink {
    type Result = ();

    fn handle(&mut self, t: ReminderTick, _: &mut Context<Self>) {
        if t.actor.kind() == "probe" {
            let mut log = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            log.push((
                t.actor.to_string(),
                t.scheduled.as_millis(),
                self.1.clone(),
                wall_ms(),
            ));
        }
    }
}

struct Member {
    silo: SiloHandle,
    reminders: Reminders,
}

async fn member(
    store: &Arc<dyn SystemStore>,
    id: &str,
    shards: u32,
    membership: ClusterMembershipOptions,
    checkpoint: Duration,
    log: &Log,
) -> anyhow::Result<Member> {
    let silo = Silo::builder(store.clone(), id.to_owned())
        .options(membership)
        .on_declared_dead(OnDeclaredDead::StopSilo)
        .start()
        .await?;
    let sink = Sink(log.clone(), silo.address().to_string()).start().recipient();
    let options = ReminderOptions {
        startup_jitter: Duration::ZERO,
        allow_period_below_minimum: true,
        table_operation_timeout: Duration::from_secs(60),
        initialization_timeout: Duration::from_secs(300),
        lease_checkpoint_interval: checkpoint,
        ..ReminderOptions::default()
    };
    let reminders = Reminders::builder(&silo, store.clone())
        .service_id(id.to_owned())
        .shards(shards)
        .target(move |_: &ActorId| Some(sink.clone()))
        .options(options)
        .start()
        .await?;
    Ok(Member { silo, reminders })
}

/// Store calls so far: lease reads, lease compare-and-sets, reminder row reads,
/// rows read, membership calls.
type Calls = [u64; 5];

fn calls(store: &CountingStore) -> Calls {
    let r = store.reminder_counts.snapshot();
    [r[0], r[1], r[2], r[3], store.counts.snapshot().calls()]
}

/// The silos of one process, with their store's counters and their probes' ticks.
struct Local {
    store: Arc<CountingStore>,
    members: VecDeque<Member>,
    log: Log,
    id: String,
    shards: u32,
    membership: ClusterMembershipOptions,
    checkpoint: Duration,
}

impl Local {
    async fn add(&mut self) -> anyhow::Result<()> {
        let store: Arc<dyn SystemStore> = self.store.clone();
        let m = member(
            &store,
            &self.id,
            self.shards,
            self.membership.clone(),
            self.checkpoint,
            &self.log,
        )
        .await?;
        self.members.push_back(m);
        Ok(())
    }

    /// Removes the oldest silo: a graceful shutdown, or a kill.
    async fn remove(&mut self, graceful: bool) -> anyhow::Result<()> {
        let m = self
            .members
            .pop_front()
            .ok_or_else(|| anyhow::anyhow!("no silo left"))?;
        if graceful {
            m.silo.shutdown().await?;
        } else {
            m.silo.kill();
        }
        Ok(())
    }

    fn held(&self) -> Vec<u64> {
        self.members
            .iter()
            .map(|m| m.reminders.stats().scheduled)
            .collect()
    }

    /// The probe ticks delivered at or after `since_ms`; older ones are dropped
    /// (each query asks from later on), so the log holds only the ticks since the
    /// last query.
    fn ticks_since(&self, since_ms: u64) -> Vec<Tick> {
        let mut log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        log.retain(|t| t.3 >= since_ms);
        log.clone()
    }

    fn kill_all(&mut self) {
        for m in self.members.drain(..) {
            m.silo.kill();
        }
    }
}

/// One process of R4's process mode (`rollcall-bench r4-silos`): starts with no
/// silo, prints `ready`, then reads one command a line from stdin and answers each
/// with one line (`ticks` with several):
/// - `start K`: starts K silos one after another; `started N` (silos now here).
/// - `join`: starts one more; `joined`.
/// - `leave` / `crash`: the oldest silo here shuts down gracefully / is killed;
///   `left` / `crashed`.
/// - `stats`: `stats LEASE_READS LEASE_CAS ROW_READS ROWS_READ MEMBERSHIP_CALLS`,
///   then each silo's held reminders, oldest first.
/// - `ticks SINCE_MS`: one `tick ACTOR SCHEDULED_MS SILO AT_MS` line per probe
///   tick delivered here at or after SINCE_MS (wall clock), then `end`.
/// - `quit`: kills every silo and exits.
///
/// Silos use the default membership options, or with `fast` the fast profile,
/// and checkpoint their shards every `checkpoint`.
pub fn silos(
    store: &str,
    cluster: &str,
    shards: u32,
    fast: bool,
    checkpoint: Duration,
) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    actix::System::new().block_on(async {
        let mut local = Local {
            store: Arc::new(CountingStore::new(rollcall::connect(store).await?)),
            members: VecDeque::new(),
            log: Arc::default(),
            id: cluster.to_owned(),
            shards,
            membership: if fast {
                ClusterMembershipOptions::fast()
            } else {
                ClusterMembershipOptions::default()
            },
            checkpoint,
        };
        println!("ready");
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["start", k] => {
                    for _ in 0..k.parse::<usize>()? {
                        local.add().await?;
                    }
                    println!("started {}", local.members.len());
                }
                ["join"] => {
                    local.add().await?;
                    println!("joined");
                }
                [change @ ("leave" | "crash")] => {
                    local.remove(*change == "leave").await?;
                    println!("{}", answer(change)?);
                }
                ["stats"] => {
                    let c = calls(&local.store);
                    let held: Vec<String> = local.held().iter().map(u64::to_string).collect();
                    println!(
                        "stats {} {} {} {} {} {}",
                        c[0],
                        c[1],
                        c[2],
                        c[3],
                        c[4],
                        held.join(" ")
                    );
                }
                ["ticks", since] => {
                    for (actor, scheduled, silo, at) in local.ticks_since(since.parse()?) {
                        println!("tick {actor} {scheduled} {silo} {at}");
                    }
                    println!("end");
                }
                ["quit"] => break,
                other => anyhow::bail!("r4-silos: unknown command {other:?}"),
            }
        }
        local.kill_all();
        Ok(())
    })
}

/// The word a child answers a change with; an unknown change is an error.
fn answer(change: &str) -> anyhow::Result<&'static str> {
    Ok(match change {
        "join" => "joined",
        "leave" => "left",
        "crash" => "crashed",
        other => anyhow::bail!("no such change: {other:?}"),
    })
}

/// A cluster under measurement: its silos in this process, or in child processes.
enum Cluster {
    Here(Box<Local>),
    Processes {
        procs: Vec<Process>,
        /// The process of each silo, oldest first.
        order: VecDeque<usize>,
    },
}

impl Cluster {
    /// Starts `silos` silos; returns once each has started (they load on their own).
    async fn start(&mut self, silos: usize) -> anyhow::Result<()> {
        match self {
            Cluster::Here(local) => {
                for _ in 0..silos {
                    local.add().await?;
                }
            }
            Cluster::Processes { procs, order } => {
                let n = procs.len();
                // Spread evenly, the processes starting theirs at once.
                let shares: Vec<usize> = (0..n).map(|k| (k + 1) * silos / n - k * silos / n).collect();
                for (p, share) in procs.iter_mut().zip(&shares) {
                    p.send(&format!("start {share}")).await?;
                }
                for p in procs.iter_mut() {
                    p.expect("started").await?;
                }
                // Silo ages by round: every process's first, then every second...
                for round in 0..silos.div_ceil(n) {
                    order.extend((0..n).filter(|&k| round < shares[k]));
                }
            }
        }
        Ok(())
    }

    /// One change: `join` (a new silo), `leave` or `crash` (the oldest silo).
    async fn change(&mut self, kind: &str) -> anyhow::Result<()> {
        match self {
            Cluster::Here(local) => match kind {
                "join" => local.add().await,
                "leave" | "crash" => local.remove(kind == "leave").await,
                other => anyhow::bail!("no such change: {other:?}"),
            },
            Cluster::Processes { procs, order } => {
                let word = answer(kind)?;
                let k = if kind == "join" {
                    // The process with the fewest silos.
                    let k = (0..procs.len())
                        .min_by_key(|k| order.iter().filter(|o| *o == k).count())
                        .unwrap_or(0);
                    order.push_back(k);
                    k
                } else {
                    order.pop_front().ok_or_else(|| anyhow::anyhow!("no silo left"))?
                };
                procs[k].send(kind).await?;
                procs[k].expect(word).await?;
                Ok(())
            }
        }
    }

    /// Store calls so far, and each silo's held reminders.
    async fn stats(&mut self) -> anyhow::Result<(Calls, Vec<u64>)> {
        match self {
            Cluster::Here(local) => Ok((calls(&local.store), local.held())),
            Cluster::Processes { procs, .. } => {
                let (mut total, mut held) = ([0u64; 5], Vec::new());
                for p in procs.iter_mut() {
                    p.send("stats").await?;
                    let s = p.expect("stats").await?;
                    anyhow::ensure!(s.len() >= 5, "r4-silos stats: {s:?}");
                    for (t, v) in total.iter_mut().zip(&s[..5]) {
                        *t += v;
                    }
                    held.extend_from_slice(&s[5..]);
                }
                Ok((total, held))
            }
        }
    }

    /// Every probe tick delivered at or after `since_ms` (wall clock).
    async fn ticks_since(&mut self, since_ms: u64) -> anyhow::Result<Vec<Tick>> {
        match self {
            Cluster::Here(local) => Ok(local.ticks_since(since_ms)),
            Cluster::Processes { procs, .. } => {
                let mut out = Vec::new();
                for p in procs.iter_mut() {
                    p.send(&format!("ticks {since_ms}")).await?;
                    loop {
                        let line = p.line().await?;
                        let w: Vec<&str> = line.split_whitespace().collect();
                        match w.as_slice() {
                            ["end"] => break,
                            ["tick", actor, scheduled, silo, at] => {
                                out.push((
                                    (*actor).to_owned(),
                                    scheduled.parse()?,
                                    (*silo).to_owned(),
                                    at.parse()?,
                                ));
                            }
                            _ => anyhow::bail!("r4-silos said `{line}` among its ticks"),
                        }
                    }
                }
                Ok(out)
            }
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        match self {
            Cluster::Here(mut local) => local.kill_all(),
            Cluster::Processes { procs, .. } => {
                for p in procs {
                    p.quit().await?;
                }
            }
        }
        Ok(())
    }
}

/// The most reminders one silo holds over the mean.
fn spread(held: &[u64]) -> f64 {
    let most = held.iter().copied().max().unwrap_or(0);
    most as f64 * held.len().max(1) as f64 / held.iter().sum::<u64>().max(1) as f64
}

/// Waits until every reminder is held once and what each silo holds did not
/// change for 1 s (a handoff in flight holds some twice or not at all); the
/// time from `since` to the last change. (Lease writes are no sign: with
/// checkpoints a quiet cluster writes leases too.)
async fn settle(cluster: &mut Cluster, n: u64, since: Instant) -> anyhow::Result<Duration> {
    // The change itself (a join's start, a leave's shutdown) ran until now.
    let (mut last_change, mut last_held) = (Instant::now(), cluster.stats().await?.1);
    loop {
        let held = cluster.stats().await?.1;
        let total: u64 = held.iter().sum();
        if since.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("not settled within 300 s: {total} of {n} held");
        }
        if total != n || held != last_held {
            (last_change, last_held) = (Instant::now(), held);
        } else if last_change.elapsed() >= Duration::from_secs(1) {
            return Ok(last_change.duration_since(since));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Per probe that another silo delivers at the end: the longest gap between
/// two consecutive delivered ticks within `at - 2 s ..= until` (wall-clock ms),
/// less the period.
fn pauses(ticks: &[Tick], at: u64, until: u64) -> Vec<u64> {
    let mut by_probe: BTreeMap<&str, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for (actor, scheduled, silo, t) in ticks {
        by_probe.entry(actor).or_default().push((*scheduled, silo, *t));
    }
    let from = at.saturating_sub(2_000);
    let mut out = Vec::new();
    for ticks in by_probe.values_mut() {
        ticks.sort_by_key(|t| t.0);
        let before = ticks.iter().rev().find(|t| t.2 < at).map(|t| t.1);
        let after = ticks.last().filter(|t| t.2 > at).map(|t| t.1);
        if before.is_none() || after.is_none() || before == after {
            continue;
        }
        let window: Vec<_> = ticks.iter().filter(|t| t.2 >= from && t.2 <= until).collect();
        let gap = window
            .windows(2)
            .map(|w| w[1].2.saturating_sub(w[0].2))
            .max()
            .unwrap_or(0);
        out.push(gap.saturating_sub(1_000));
    }
    out.sort_unstable();
    out
}

/// The store's URL for child processes (networked providers only).
async fn store_url(provider: &str) -> anyhow::Result<(String, rollcall_tests::fixtures::Backend)> {
    match provider {
        "redis" => {
            let b = rollcall_tests::fixtures::redis()
                .await
                .ok_or_else(|| anyhow::anyhow!("no redis-server"))?;
            let sep = if b.endpoint.contains('?') { '&' } else { '?' };
            Ok((format!("{}{sep}timeout_ms=60000", b.endpoint), b))
        }
        other => anyhow::bail!("R4 runs silo processes on redis, not {other}"),
    }
}

async fn once(
    provider: &str,
    silos: usize,
    shards: u32,
    checkpoint_s: u64,
    args: &Args,
) -> anyhow::Result<Vec<Change>> {
    let checkpoint = Duration::from_secs(checkpoint_s);
    let processes = if silos >= args.process_from && provider != "memory" {
        args.processes.max(1)
    } else {
        1
    };
    let id = rollcall_tests::unique_id("r4");
    // The store this process writes the rows with (and, in one process, the silos
    // use, counted); the backend lives until the end.
    let (store, mut cluster, _backend): (Arc<dyn SystemStore>, Cluster, _) = if processes > 1 {
        let (url, backend) = store_url(provider).await?;
        let store = rollcall::connect(&url).await?;
        let mut procs = Vec::new();
        for _ in 0..processes {
            let shards = shards.to_string();
            let checkpoint_ms = checkpoint.as_millis().to_string();
            let mut argv = vec![
                "r4-silos",
                "--store",
                &url,
                "--cluster",
                &id,
                "--shards",
                &shards,
                "--checkpoint-ms",
                &checkpoint_ms,
            ];
            if args.fast_processes {
                argv.push("--fast");
            }
            procs.push(Process::spawn(&argv).await?);
        }
        let cluster = Cluster::Processes {
            procs,
            order: VecDeque::new(),
        };
        (store, cluster, Some(backend))
    } else {
        let (inner, backend) = crate::r1::store_for(provider).await?;
        let counting = Arc::new(CountingStore::new(inner));
        let local = Local {
            store: counting.clone(),
            members: VecDeque::new(),
            log: Arc::default(),
            id: id.clone(),
            shards,
            membership: ClusterMembershipOptions::fast(),
            checkpoint,
        };
        (counting, Cluster::Here(Box::new(local)), backend)
    };
    // The shard count first: it places the rows the table writes (Redis).
    rollcall_core::lease::ShardLeases::open(store.lease_table(&id)?, shards).await?;
    let table = store.reminder_table(&id)?;
    table.init().await?;
    let now = Timestamp::now();
    let (t, svc, probes) = (table.clone(), id.clone(), args.probes);
    crate::r1::concurrently(0..args.count, 64, move |i| {
        let t = t.clone();
        let (kind, period) = if i < probes {
            ("probe", Duration::from_secs(1))
        } else {
            ("cart", Duration::from_secs(600))
        };
        let first = now.saturating_add(Duration::from_millis(
            (i as u64 * 7919) % period.as_millis() as u64,
        ));
        let e = ReminderEntry::new(&svc, format!("{kind}/{i}"), "tick", first, Some(period));
        async move {
            t.upsert_row(&e).await?;
            Ok(())
        }
    })
    .await?;
    let n = args.count as u64;
    let row = |kind: &str, took: Duration, calls: [i64; 5], p: &[u64], held: &[u64]| Change {
        provider: provider.to_owned(),
        silos,
        shards,
        processes,
        kind: kind.to_owned(),
        settle_s: took.as_secs_f64(),
        lease_reads: calls[0],
        lease_writes: calls[1],
        row_reads: calls[2],
        rows_read: calls[3],
        membership_calls: calls[4],
        moved: p.len(),
        pause_p50_ms: percentile(p, 0.5),
        pause_p99_ms: percentile(p, 0.99),
        spread: spread(held),
        checkpoint_s,
        steady_lease_cas_per_silo_s: 0.0,
        steady_lease_reads_per_silo_s: 0.0,
    };
    let diff = |a: Calls, b: Calls| -> [i64; 5] { std::array::from_fn(|i| b[i] as i64 - a[i] as i64) };
    let (before, at) = (cluster.stats().await?.0, Instant::now());
    cluster.start(silos).await?;
    let took = settle(&mut cluster, n, at).await?;
    let (after, held) = cluster.stats().await?;
    let mut start = row("start", took, diff(before, after), &[], &held);

    // What a quiet cluster costs per second (self-confirmations, polls,
    // probes, checkpoints: at least two checkpoint intervals).
    let quiet = Duration::from_secs(5).max(checkpoint * 2);
    let (q0, quiet_from) = (cluster.stats().await?.0, Instant::now());
    tokio::time::sleep(quiet).await;
    let q1 = cluster.stats().await?.0;
    let quiet_s = quiet_from.elapsed().as_secs_f64();
    let rate: Vec<f64> = (0..5).map(|i| (q1[i] - q0[i]) as f64 / quiet_s).collect();
    start.steady_lease_reads_per_silo_s = rate[0] / silos as f64;
    start.steady_lease_cas_per_silo_s = rate[1] / silos as f64;
    eprintln!("{start:?}");
    let mut out = vec![start];

    for kind in ["join", "leave", "crash"] {
        let before = cluster.stats().await?.0;
        let (at, at_ms) = (Instant::now(), wall_ms());
        cluster.change(kind).await?;
        let took = settle(&mut cluster, n, at).await?;
        let span = at.elapsed();
        let (after, held) = cluster.stats().await?;
        // The moved probes tick on their new silos (after a crash, once the
        // takeover's fence passed).
        tokio::time::sleep(Duration::from_secs(4)).await;
        let d = diff(before, after);
        let net: [i64; 5] = std::array::from_fn(|i| d[i] - (rate[i] * span.as_secs_f64()).round() as i64);
        let ticks = cluster.ticks_since(at_ms.saturating_sub(2_000)).await?;
        let p = pauses(&ticks, at_ms, wall_ms());
        let change = row(kind, took, net, &p, &held);
        eprintln!("{change:?}");
        out.push(change);
    }
    cluster.stop().await?;
    Ok(out)
}

/// Runs R4 (each cluster in its own actix `System` on its own thread) and adds
/// its section to the Markdown report and its key to the JSON report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for provider in &args.providers {
        for &silos in &args.silos {
            for &shards in &args.shards {
                for &every in &args.checkpoint_intervals {
                    let (p, a) = (provider.clone(), args.clone());
                    let name = format!("R4 {provider} {silos} {shards} {every}");
                    let changes = crate::on_own_thread(name, move || {
                        actix::System::new().block_on(async move { once(&p, silos, shards, every, &a).await })
                    })?;
                    rows.extend(changes);
                }
            }
        }
    }
    let body = section(&rows, &args);
    args.reports
        .add(("## R4", &body), ("r4", serde_json::to_value(&rows)?))
}

/// The busiest silo's share of shards over the mean, on the real ring and shard
/// ranges of `silos` silos (default ring points), averaged over 20 clusters of
/// other addresses: how evenly S shards can spread, without running them.
fn ring_spread(silos: usize, shards: u32) -> f64 {
    let points = ReminderOptions::default().ring_points_per_silo;
    let clusters = 20u64;
    let total: f64 = (0..clusters)
        .map(|c| {
            let addrs = (0..silos).map(|i| {
                SiloAddress::new(
                    ([10, (i / 250) as u8, (i % 250) as u8, 1], 11111).into(),
                    1_000 + c,
                )
            });
            let ring = rollcall::reminders::ring::Ring::new(addrs, points);
            let mut held: BTreeMap<SiloAddress, u32> = BTreeMap::new();
            for k in 0..shards {
                let start = rollcall::reminders::shards::shard_range(k, shards)
                    .begin
                    .wrapping_add(1);
                *held.entry(ring.owner_of(start).expect("silos")).or_default() += 1;
            }
            f64::from(held.values().copied().max().unwrap_or(0)) * silos as f64 / f64::from(shards)
        })
        .sum();
    total / clusters as f64
}

fn section(rows: &[Change], args: &Args) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## R4: what a join, a graceful leave and a crash cost the reminders\n\n\
         `silos` silos on real TCP share one reminder table of {} \
         reminders (S shards, default reminder options otherwise), {} of which tick every second (the \
         probes) and the rest every 10 minutes. With `processes` 1 the silos share this process and \
         use the fast membership profile; with more (100 silos on a networked store) they are spread \
         over that many child processes (`rollcall-bench r4-silos`), each with its own event loop, \
         store client and counters, and use the default membership options (Orleans' timings: the \
         fast profile's 4,000 probes a second at 100 silos saturate this machine's two cores, and \
         live silos were declared dead), so a crash's detection takes longer there. Then one silo joins, the oldest leaves gracefully \
         (`shutdown`), and the next oldest is killed, each once the cluster settled (every \
         reminder held once and no lease written for 1 s; settled s is the time to the last \
         change). Store calls: from the change until it settled, less what \
         a quiet span of the same length costs (self-confirmations, lease polls, probes), \
         counted by a wrapper around the real store. Pause: for each probe another silo \
         delivers after the change, the longest gap between two of its delivered ticks around \
         the change, less its 1-s period. A crash's pause includes detection and the lease \
         period; with checkpoints the ticks due meanwhile are delivered late (the gap is \
         measured between delivery times), without them the missed-tick policy (`Skip`) \
         drops them. The `start` row \
         is the cluster's first start (every silo joins and loads its shards; its store calls \
         are not net of a quiet span). Spread: once settled, the most reminders one silo holds \
         over the mean.\n",
        args.count, args.probes
    );
    let _ = writeln!(
        md,
        "| provider | silos | processes | S | change | settled s | lease reads | lease CAS | row reads | rows read | membership calls | probes moved | pause p50 / p99 ms | spread |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} / {} | {:.2} |",
            r.provider,
            r.silos,
            r.processes,
            r.shards,
            r.kind,
            r.settle_s,
            r.lease_reads,
            r.lease_writes,
            r.row_reads,
            r.rows_read,
            r.membership_calls,
            r.moved,
            r.pause_p50_ms,
            r.pause_p99_ms,
            r.spread
        );
    }
    let _ = writeln!(
        md,
        "\nSteady state: in the quiet span after each start (5 s, or two checkpoint intervals \
         when longer), lease calls per second per silo, by the holders' \
         `lease_checkpoint_interval` (0: off). Every shard holds probes, so every held shard's \
         progress moves in every interval: each silo writes about its held shards over the \
         interval.\n\n| provider | silos | S | checkpoint s | lease CAS/s per silo | lease reads/s per silo |\n|---|---|---|---|---|---|"
    );
    for r in rows.iter().filter(|r| r.kind == "start") {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:.1} |",
            r.provider,
            r.silos,
            r.shards,
            r.checkpoint_s,
            r.steady_lease_cas_per_silo_s,
            r.steady_lease_reads_per_silo_s
        );
    }
    let sizes = [10, 100, 300];
    let _ = writeln!(
        md,
        "\nThe busiest silo's shards over the mean, from the real ring and shard ranges of \
         N silos (average of 20 clusters; a silo's share of reminders follows its share \
         of shards):\n\n| S | {} |\n|---|{}",
        sizes.map(|n| format!("N = {n}")).join(" | "),
        "---|".repeat(sizes.len())
    );
    for &shards in &args.shards {
        let cells = sizes.map(|n| format!("{:.2}", ring_spread(n, shards)));
        let _ = writeln!(md, "| {shards} | {} |", cells.join(" | "));
    }
    md
}

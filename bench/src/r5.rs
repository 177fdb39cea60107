//! R5: cluster-wide reminder throughput in the spirit of Dapr's published
//! figures (dapr/proposals 44: 4,000 reminder creations/s, about 4,582
//! triggers/s on 3 scheduler replicas). `silos` silo **processes** (this binary,
//! `r5-silo`) on one Redis, then on a 3-master Redis Cluster (`--providers`):
//! 1. creations/s: each process registers a third of `count` periodic
//!    reminders through `Reminders::register` (`concurrency` tasks each); next to
//!    the backend's raw write rate (plain `SET`s of a row's size, the same total
//!    concurrency, the same run; on the cluster, to every master at once, each
//!    its share of the tasks, keys tagged with a slot it serves);
//! 2. ticks/s sustained: the periods are `count / rate` seconds, so the cluster
//!    owes `rate` ticks/s; ticks delivered per second over `seconds`, and the
//!    lateness (`now - scheduled` at the actor) p50 / p99 / max;
//! 3. a mass due time: `burst` one-shot reminders due at the same instant, in a
//!    fresh service (fresh processes): the time from that instant until the last
//!    is delivered, and their lateness. Deliveries in flight per silo are capped
//!    (`max_deliveries`), so the burst is queued, not run at once.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use hdrhistogram::Histogram;
use rollcall::reminders::{ActorId, ReminderSpec, ReminderTick, Reminders};
use rollcall_core::{Clock, ReminderOptions, Silo, SystemClock, Timestamp};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Options of `r5`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Silo processes.
    #[arg(long, default_value_t = 3)]
    silos: usize,
    /// Periodic reminders created (phase 1) and ticking (phase 2).
    #[arg(long, default_value_t = 60_000)]
    count: usize,
    /// Ticks per second the periodic reminders owe the cluster.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Concurrent registrations per process.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds of ticks measured in phase 2.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// One-shot reminders due at the same instant (phase 3).
    #[arg(long, default_value_t = 50_000)]
    burst: usize,
    /// Seconds from the burst's first registration to its due instant (its
    /// creation must end before).
    #[arg(long, default_value_t = 20.0)]
    burst_lead: f64,
    /// Backends, comma-separated: `redis` (one server), `redis-cluster` (3
    /// masters).
    #[arg(long, default_value = "redis,redis-cluster", value_delimiter = ',')]
    providers: Vec<String>,
    /// Records each reminder's run history keeps in the silo processes
    /// (`run_history`; 0: none): one append per delivered tick.
    #[arg(long, default_value_t = 20)]
    run_history: usize,
    /// The reports to add the R5 section and the `r5` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// R5's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    provider: String,
    silos: usize,
    count: usize,
    creations_per_s: f64,
    raw_sets_per_s: f64,
    scheduled_ticks_per_s: u64,
    ticks_per_s: f64,
    lateness_p50_ms: f64,
    lateness_p99_ms: f64,
    lateness_max_ms: f64,
    burst: usize,
    burst_created_per_s: f64,
    /// From the common due instant until the last of the burst was delivered.
    burst_drain_s: f64,
    burst_ticks_per_s: f64,
    burst_lateness_p50_ms: f64,
    burst_lateness_p99_ms: f64,
    burst_lateness_max_ms: f64,
}

/// Records each tick's lateness in microseconds, over all ticks and per actor
/// kind.
struct Sink(
    Arc<Mutex<Histogram<u64>>>,
    Arc<Mutex<HashMap<String, Histogram<u64>>>>,
);

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Sink {
    type Result = ();

    fn handle(&mut self, t: ReminderTick, _: &mut Context<Self>) {
        let late = SystemClock.now().saturating_duration_since(t.scheduled);
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        let mut h = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = h.record(us);
        let mut kinds = self.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(k) = kinds.get_mut(t.actor.kind()) {
            let _ = k.record(us);
        } else if let Ok(mut k) = Histogram::<u64>::new(3) {
            let _ = k.record(us);
            kinds.insert(t.actor.kind().to_owned(), k);
        }
    }
}

/// One silo process: reads commands from stdin, one per line, and answers each
/// on stdout with one line.
/// - `create FROM TO DUE_MS PERIOD_MS [KIND]`: registers `KIND/FROM..TO`
///   (`bench` by default; `tick`),
///   first tick `DUE_MS` from now (spread over one period), every `PERIOD_MS`;
///   with `PERIOD_MS` 0, one-shots all due at the instant `DUE_MS` (UTC ms);
///   answers `created N MS`.
/// - `reset`: forgets the ticks recorded; answers `reset`.
/// - `stats [KIND]`: answers `stats TICKS P50_US P99_US MAX_US` since the last
///   reset (of the ticks of actor kind `KIND` if given), then the service's
///   `SCHEDULED LOADS NOTICES` counters.
/// - `quit`: leaves the cluster gracefully and exits.
pub fn silo(store: &str, cluster: &str, run_history: usize, per_kind_cap: usize) -> anyhow::Result<()> {
    // `RUST_LOG` reaches the silo processes' stderr.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    actix::System::new().block_on(async {
        let store = rollcall::connect(store).await?;
        let silo = Silo::builder(store.clone(), cluster.to_owned()).start().await?;
        let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
        let kinds: Arc<Mutex<HashMap<String, Histogram<u64>>>> = Arc::default();
        let sink = Sink(hist.clone(), kinds.clone()).start().recipient();
        let reminders = Reminders::builder(&silo, store)
            .service_id(cluster.to_owned())
            .target(move |_: &ActorId| Some(sink.clone()))
            .options(ReminderOptions {
                allow_period_below_minimum: true,
                startup_jitter: Duration::ZERO,
                table_operation_timeout: Duration::from_secs(60),
                run_history,
                max_deliveries_per_kind: (per_kind_cap > 0).then_some(per_kind_cap),
                ..ReminderOptions::default()
            })
            .start()
            .await?;
        println!("ready");
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["create", from, to, due, period, rest @ ..] => {
                    let kind = rest.first().copied().unwrap_or("bench").to_owned();
                    let (from, to): (usize, usize) = (from.parse()?, to.parse()?);
                    let (due, period): (u64, u64) = (due.parse()?, period.parse()?);
                    let started = Instant::now();
                    let r = reminders.clone();
                    crate::r1::concurrently(from..to, 64, move |i| {
                        let (r, kind) = (r.clone(), kind.clone());
                        let spec = if period == 0 {
                            // `due` is the common instant (UTC ms).
                            let now = SystemClock.now().as_millis();
                            ReminderSpec::once(Duration::from_millis(due.saturating_sub(now)))
                        } else {
                            let spread = (i as u64 * 7919) % period;
                            ReminderSpec::every(
                                Duration::from_millis(due + spread),
                                Duration::from_millis(period),
                            )
                        };
                        async move {
                            r.register(&ActorId::new(kind, i.to_string())?, "tick", spec)
                                .await?;
                            Ok(())
                        }
                    })
                    .await?;
                    println!("created {} {}", to - from, started.elapsed().as_millis());
                }
                ["reset"] => {
                    hist.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .reset();
                    kinds
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clear();
                    println!("reset");
                }
                ["stats", kind] => {
                    let kinds = kinds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let empty = Histogram::<u64>::new(3)?;
                    print_stats(kinds.get(*kind).unwrap_or(&empty), &reminders.stats());
                }
                ["stats"] => {
                    let h = hist.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    print_stats(&h, &reminders.stats());
                }
                ["quit"] => break,
                other => anyhow::bail!("r5-silo: unknown command {other:?}"),
            }
        }
        silo.shutdown().await?;
        Ok(())
    })
}

/// The `--run-history` of the silo processes this run starts.
static RUN_HISTORY: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(20);
/// The `--per-kind-cap` of the silo processes this run starts (0: none).
static PER_KIND_CAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Answers `stats`: `stats TICKS P50_US P99_US MAX_US SCHEDULED LOADS NOTICES`.
fn print_stats(h: &Histogram<u64>, st: &rollcall::reminders::ReminderStats) {
    println!(
        "stats {} {} {} {} {} {} {}",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        st.scheduled,
        st.loads,
        st.notices
    );
}

/// A bench child process (`rollcall-bench r5-silo`, `r4-silos`): commands on its
/// stdin, one answer line each on its stdout; killed when dropped.
pub(crate) struct Process {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Process {
    async fn start(url: &str, cluster: &str) -> anyhow::Result<Process> {
        let history = RUN_HISTORY.load(std::sync::atomic::Ordering::Relaxed).to_string();
        let cap = PER_KIND_CAP
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_string();
        Process::spawn(&[
            "r5-silo",
            "--store",
            url,
            "--cluster",
            cluster,
            "--run-history",
            &history,
            "--per-kind-cap",
            &cap,
        ])
        .await
    }

    /// Starts `rollcall-bench ARGS` and waits (at most 600 s) for its `ready`.
    pub(crate) async fn spawn(args: &[&str]) -> anyhow::Result<Process> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).lines();
        let mut p = Process { child, stdin, stdout };
        p.expect("ready").await?;
        Ok(p)
    }

    /// Sends one command line.
    pub(crate) async fn send(&mut self, line: &str) -> anyhow::Result<()> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// The next line (at most 600 s).
    pub(crate) async fn line(&mut self) -> anyhow::Result<String> {
        tokio::time::timeout(Duration::from_secs(600), self.stdout.next_line())
            .await
            .map_err(|_| anyhow::anyhow!("a bench child did not answer within 600 s"))??
            .ok_or_else(|| anyhow::anyhow!("a bench child exited"))
    }

    /// The next line, which must start with `word`: its other words that are numbers.
    pub(crate) async fn expect(&mut self, word: &str) -> anyhow::Result<Vec<u64>> {
        let line = self
            .line()
            .await
            .map_err(|e| anyhow::anyhow!("waiting for `{word}`: {e}"))?;
        let mut words = line.split_whitespace();
        anyhow::ensure!(
            words.next() == Some(word),
            "a bench child said `{line}`, not `{word}`"
        );
        Ok(words.filter_map(|w| w.parse().ok()).collect())
    }

    /// Sends `quit` and waits (at most 60 s) for the exit.
    pub(crate) async fn quit(mut self) -> anyhow::Result<()> {
        self.send("quit").await?;
        tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await??;
        Ok(())
    }
}

/// Starts `n` processes of one cluster (also the service id).
async fn cluster(url: &str, n: usize) -> anyhow::Result<(String, Vec<Process>)> {
    let id = rollcall_tests::unique_id("r5");
    let mut ps = Vec::new();
    for _ in 0..n {
        ps.push(Process::start(url, &id).await?);
    }
    Ok((id, ps))
}

/// Each process registers its share of `0..count`; the creations per second
/// over the slowest process.
async fn create(ps: &mut [Process], count: usize, due_ms: u64, period_ms: u64) -> anyhow::Result<f64> {
    create_kind(ps, count, due_ms, period_ms, "bench").await
}

/// As [`create`], for actors of kind `kind`.
async fn create_kind(
    ps: &mut [Process],
    count: usize,
    due_ms: u64,
    period_ms: u64,
    kind: &str,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let n = ps.len();
    for (k, p) in ps.iter_mut().enumerate() {
        p.send(&format!(
            "create {} {} {due_ms} {period_ms} {kind}",
            k * count / n,
            (k + 1) * count / n
        ))
        .await?;
    }
    for p in ps.iter_mut() {
        p.expect("created").await?;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// (ticks, p50, p99, max in µs) summed and maxed over the processes.
async fn stats(ps: &mut [Process]) -> anyhow::Result<(u64, u64, u64, u64)> {
    stats_of(ps, "stats").await
}

/// As [`stats`], with `command` (`stats KIND`: one actor kind's ticks).
async fn stats_of(ps: &mut [Process], command: &str) -> anyhow::Result<(u64, u64, u64, u64)> {
    let mut out = (0, 0, 0, 0);
    for p in ps.iter_mut() {
        p.send(command).await?;
        let s = p.expect("stats").await?;
        anyhow::ensure!(s.len() == 7, "stats: {s:?}");
        eprintln!(
            "r5-silo stats: ticks {} scheduled {} loads {} notices {}",
            s[0], s[4], s[5], s[6]
        );
        out = (out.0 + s[0], out.1.max(s[1]), out.2.max(s[2]), out.3.max(s[3]));
    }
    Ok(out)
}

async fn reset(ps: &mut [Process]) -> anyhow::Result<()> {
    for p in ps.iter_mut() {
        p.send("reset").await?;
        p.expect("reset").await?;
    }
    Ok(())
}

/// Plain `SET`s of `value` with `tasks` concurrent connections' worth of tasks
/// for about `seconds`: the backend's raw write rate.
/// On a Redis Cluster (`redis+cluster://a,b,c`) the `SET`s go to every master at
/// once, `tasks` split among them, each master's keys tagged with a slot it
/// serves (so none is redirected): the sum of their rates.
async fn raw_sets(url: &str, tasks: usize, value: String, seconds: f64) -> anyhow::Result<f64> {
    let base = url.split('?').next().unwrap_or(url);
    let Some(nodes) = base.strip_prefix("redis+cluster://") else {
        return raw_sets_on(base.to_owned(), None, tasks, value, seconds).await;
    };
    let nodes: Vec<String> = nodes.split(',').map(|n| format!("redis://{n}")).collect();
    let mut runs = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let mut conn = redis::Client::open(node.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let tag = crate::t1::local_hash_tag(&mut conn).await?;
        let share = tasks * (i + 1) / nodes.len() - tasks * i / nodes.len();
        runs.push(tokio::spawn(raw_sets_on(
            node.clone(),
            Some(tag),
            share.max(1),
            value.clone(),
            seconds,
        )));
    }
    let mut total = 0.0;
    for run in runs {
        total += run.await??;
    }
    Ok(total)
}

/// [`raw_sets`] on one server, keys tagged `{tag}` when given.
async fn raw_sets_on(
    url: String,
    tag: Option<String>,
    tasks: usize,
    value: String,
    seconds: f64,
) -> anyhow::Result<f64> {
    let client = redis::Client::open(url.as_str())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let prefix = match tag {
        Some(tag) => format!("{{{tag}}}{}", rollcall_tests::unique_id("r5-raw")),
        None => rollcall_tests::unique_id("r5-raw"),
    };
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (mut conn, done, value, prefix) = (conn.clone(), done.clone(), value.clone(), prefix.clone());
        handles.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < until {
                let _: () = redis::cmd("SET")
                    .arg(format!("{prefix}:{t}:{i}"))
                    .arg(&value)
                    .query_async(&mut conn)
                    .await?;
                i += 1;
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, redis::RedisError>(())
        }));
    }
    let started = Instant::now();
    for h in handles {
        h.await??;
    }
    Ok(done.load(std::sync::atomic::Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Runs R5 and adds its section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    RUN_HISTORY.store(args.run_history, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut report = Vec::new();
    for provider in &args.providers {
        report.push(rt.block_on(measure(&args, provider))?);
    }
    let section = render(&args, &report);
    print!("{section}");
    args.reports
        .add(("## R5", &section), ("r5", serde_json::to_value(&report)?))
}

async fn measure(args: &Args, provider: &str) -> anyhow::Result<Report> {
    let backend = match provider {
        "redis" => rollcall_tests::fixtures::redis().await,
        "redis-cluster" => rollcall_tests::fixtures::redis_cluster().await,
        other => anyhow::bail!("unknown provider `{other}` (redis, redis-cluster)"),
    }
    .ok_or_else(|| anyhow::anyhow!("no {provider} server"))?;
    let sep = if backend.endpoint.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}timeout_ms=60000", backend.endpoint);
    let ms = |us: u64| us as f64 / 1000.0;
    // 1 and 2: periodic reminders.
    let period_ms = (args.count as u64 * 1000 / args.rate.max(1)).max(1);
    let (_, mut ps) = cluster(&url, args.silos).await?;
    let creations_per_s = create(&mut ps, args.count, 2_000, period_ms).await?;
    // A row's size on Redis, as the reference's value.
    let row = rollcall::ReminderEntry::new(
        "r5-xxxxxxxxxxxxxxxx",
        "bench/12345",
        "tick",
        Timestamp::now(),
        Some(Duration::from_millis(period_ms)),
    );
    let value = serde_json::to_string(&row)?;
    let raw_sets_per_s = raw_sets(&url, args.silos * args.concurrency, value, 3.0).await?;
    // Every reminder is scheduled once its first period has passed.
    tokio::time::sleep(Duration::from_millis(2_000 + 2 * period_ms)).await;
    reset(&mut ps).await?;
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    let (ticks, p50, p99, max) = stats(&mut ps).await?;
    let ticks_per_s = ticks as f64 / window.elapsed().as_secs_f64();
    for p in ps {
        p.quit().await?;
    }
    // 3: a burst due at one instant, in a fresh service.
    let (burst_id, mut ps) = cluster(&url, args.silos).await?;
    let at = SystemClock
        .now()
        .saturating_add(Duration::from_secs_f64(args.burst_lead));
    let burst_created_per_s = create(&mut ps, args.burst, at.as_millis(), 0).await?;
    anyhow::ensure!(
        SystemClock.now() < at,
        "the burst was not created before its due instant"
    );
    reset(&mut ps).await?;
    let until = Instant::now() + Duration::from_secs(600);
    let (mut last, mut last_change) = (0, Instant::now());
    let (b_ticks, b50, b99, bmax) = loop {
        let s = stats(&mut ps).await?;
        if s.0 as usize >= args.burst || Instant::now() > until {
            break s;
        }
        if s.0 != last {
            (last, last_change) = (s.0, Instant::now());
        }
        if last > 0 && last_change.elapsed() > Duration::from_secs(60) {
            let store = rollcall::connect(&url).await?;
            let left = store.reminder_table(&burst_id)?.read_rows_in_range(0, 0).await?;
            for row in &left {
                eprintln!("undelivered: {row:?}");
            }
            anyhow::bail!("the burst stalled at {last} of {} ticks", args.burst);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let drained = SystemClock.now().saturating_duration_since(at);
    for p in ps {
        p.quit().await?;
    }
    anyhow::ensure!(
        b_ticks as usize >= args.burst,
        "only {b_ticks} of {} burst ticks",
        args.burst
    );
    Ok(Report {
        provider: provider.to_owned(),
        silos: args.silos,
        count: args.count,
        creations_per_s,
        raw_sets_per_s,
        scheduled_ticks_per_s: args.count as u64 * 1000 / period_ms,
        ticks_per_s,
        lateness_p50_ms: ms(p50),
        lateness_p99_ms: ms(p99),
        lateness_max_ms: ms(max),
        burst: args.burst,
        burst_created_per_s,
        burst_drain_s: drained.as_secs_f64(),
        burst_ticks_per_s: args.burst as f64 / drained.as_secs_f64().max(0.001),
        burst_lateness_p50_ms: ms(b50),
        burst_lateness_p99_ms: ms(b99),
        burst_lateness_max_ms: ms(bmax),
    })
}

fn render(args: &Args, reports: &[Report]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## R5: cluster throughput against Dapr's published figures\n");
    let scheduled = reports.first().map_or(0, |r| r.scheduled_ticks_per_s);
    let _ = writeln!(
        s,
        "{} silo processes (`rollcall-bench r5-silo`, default options, 1,024 shards) on one Redis, then on a 3-master Redis Cluster, all on this machine (2 cores, shared by everything). Creations: each process registers a third of {} periodic reminders through `Reminders::register`, {} tasks each; the reference is plain `SET`s of a row-sized value from {} tasks in the same run (on the cluster: to every master at once, keys tagged with a slot each serves). Ticks: the periods make the cluster owe {} ticks/s; lateness is `now - scheduled` at the actor, over {} s (p50 and p99 are the worst process's). Burst: {} one-shot reminders due at one instant, in fresh processes. Run histories keep {} records (one append per delivered periodic tick). Dapr's figures (dapr/proposals 44): 4,000 creations/s, about 4,582 triggers/s on 3 scheduler replicas.\n",
        args.silos,
        args.count,
        args.concurrency,
        args.silos * args.concurrency,
        scheduled,
        args.seconds,
        args.burst,
        args.run_history
    );
    let _ = writeln!(
        s,
        "| backend | creations/s | raw SETs/s | ÷ raw | ticks/s (owed) | lateness p50 / p99 / max ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} ({}) | {:.1} / {:.1} / {:.1} |",
            r.provider,
            r.creations_per_s,
            r.raw_sets_per_s,
            r.creations_per_s / r.raw_sets_per_s.max(1.0),
            r.ticks_per_s,
            r.scheduled_ticks_per_s,
            r.lateness_p50_ms,
            r.lateness_p99_ms,
            r.lateness_max_ms
        );
    }
    let _ = writeln!(
        s,
        "\n| backend | burst | created/s | drained in s | ticks/s while draining | lateness p50 / p99 / max ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in reports {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.2} | {:.0} | {:.0} / {:.0} / {:.0} |",
            r.provider,
            r.burst,
            r.burst_created_per_s,
            r.burst_drain_s,
            r.burst_ticks_per_s,
            r.burst_lateness_p50_ms,
            r.burst_lateness_p99_ms,
            r.burst_lateness_max_ms
        );
    }
    let _ = writeln!(
        s,
        "\nGoals (issue): at least 10,000 creations/s and 20,000 ticks/s sustained with p99 lateness under 50 ms on 3 processes and one Redis."
    );
    s
}

/// Options of `r5-fairness`.
#[derive(clap::Args, Clone, Debug)]
pub struct FairArgs {
    /// Silo processes.
    #[arg(long, default_value_t = 3)]
    silos: usize,
    /// Ticks per second of the steady kind (`steady`, 10-s periods).
    #[arg(long, default_value_t = 5_000)]
    steady_rate: u64,
    /// One-shots of the bursting kind (`burst`), all due at one instant.
    #[arg(long, default_value_t = 100_000)]
    burst: usize,
    /// Seconds from the burst's creation to its instant.
    #[arg(long, default_value_t = 20.0)]
    burst_lead: f64,
    /// `max_deliveries_per_kind` of each run (0: none), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,64")]
    caps: Vec<usize>,
    /// The reports to add the section and the `r5_fairness` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One run of `r5-fairness`.
#[derive(Clone, Debug, Serialize)]
pub struct FairRow {
    cap: usize,
    steady_ticks: u64,
    steady_p50_ms: f64,
    steady_p99_ms: f64,
    steady_max_ms: f64,
    burst_ticks: u64,
    /// From the burst's instant until its last tick was delivered.
    burst_drain_s: f64,
    burst_p99_ms: f64,
}

/// Issue 58 item 4: a burst of one-shots of one kind due at one instant
/// beside steady ticks of another, on 3 processes and one Redis, with and
/// without `max_deliveries_per_kind`; the steady kind's lateness from 2 s
/// before the instant until the burst is delivered. Adds its section to the
/// reports.
pub fn fairness(args: FairArgs) -> anyhow::Result<()> {
    RUN_HISTORY.store(20, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut rows = Vec::new();
    for &cap in &args.caps {
        PER_KIND_CAP.store(cap, std::sync::atomic::Ordering::Relaxed);
        let row = rt.block_on(fair_run(&args, cap))?;
        eprintln!("{row:?}");
        rows.push(row);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## R5 fairness: a burst of one kind beside steady ticks of another\n\n\
         {} silo processes (`rollcall-bench r5-fairness`, default options but \
         `max_deliveries_per_kind`) on one Redis, on this machine. Kind `steady`: {} ticks/s \
         (10-s periods, created first). Kind `burst`: {} one-shots due at one instant, created \
         {} s before it. Lateness of the steady kind's ticks from 2 s before the instant until \
         the burst is delivered (p50 and p99 are the worst process's); the cap is per silo.\n",
        args.silos, args.steady_rate, args.burst, args.burst_lead
    );
    let _ = writeln!(
        s,
        "| max_deliveries_per_kind | steady ticks | steady lateness p50 / p99 / max ms | burst delivered | burst drained in s | burst p99 ms |\n|---|---|---|---|---|---|"
    );
    for r in &rows {
        let cap = if r.cap == 0 {
            "none".to_owned()
        } else {
            r.cap.to_string()
        };
        let _ = writeln!(
            s,
            "| {cap} | {} | {:.1} / {:.1} / {:.1} | {} | {:.2} | {:.0} |",
            r.steady_ticks,
            r.steady_p50_ms,
            r.steady_p99_ms,
            r.steady_max_ms,
            r.burst_ticks,
            r.burst_drain_s,
            r.burst_p99_ms
        );
    }
    let _ = writeln!(
        s,
        "\nGoal (issue 58): with the cap, the steady kind's p99 under 100 ms."
    );
    print!("{s}");
    args.reports.add(
        ("## R5 fairness", &s),
        ("r5_fairness", serde_json::to_value(&rows)?),
    )
}

async fn fair_run(args: &FairArgs, cap: usize) -> anyhow::Result<FairRow> {
    let backend = rollcall_tests::fixtures::redis()
        .await
        .ok_or_else(|| anyhow::anyhow!("no redis server"))?;
    let url = format!("{}?timeout_ms=60000", backend.endpoint);
    let ms = |us: u64| us as f64 / 1000.0;
    let period_ms = 10_000;
    let steady = (args.steady_rate * period_ms / 1000) as usize;
    let (_, mut ps) = cluster(&url, args.silos).await?;
    create_kind(&mut ps, steady, 2_000, period_ms, "steady").await?;
    // Every steady reminder ticks once its first period passed.
    tokio::time::sleep(Duration::from_millis(2_000 + period_ms)).await;
    let at = SystemClock
        .now()
        .saturating_add(Duration::from_secs_f64(args.burst_lead));
    create_kind(&mut ps, args.burst, at.as_millis(), 0, "burst").await?;
    let before = at.saturating_sub(Duration::from_secs(2));
    anyhow::ensure!(
        SystemClock.now() < before,
        "the burst was not created 2 s before its instant"
    );
    tokio::time::sleep(Duration::from_millis(
        before.as_millis() - SystemClock.now().as_millis(),
    ))
    .await;
    reset(&mut ps).await?;
    let until = Instant::now() + Duration::from_secs(300);
    let (mut last, mut last_change) = (0, SystemClock.now());
    let burst = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let b = stats_of(&mut ps, "stats burst").await?;
        if b.0 != last {
            (last, last_change) = (b.0, SystemClock.now());
        }
        if b.0 as usize >= args.burst || Instant::now() > until {
            break b;
        }
    };
    // A second of steady ticks after the burst, then the figures.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = stats_of(&mut ps, "stats steady").await?;
    for p in ps {
        p.quit().await?;
    }
    Ok(FairRow {
        cap,
        steady_ticks: s.0,
        steady_p50_ms: ms(s.1),
        steady_p99_ms: ms(s.2),
        steady_max_ms: ms(s.3),
        burst_ticks: burst.0,
        burst_drain_s: last_change.saturating_duration_since(at).as_secs_f64(),
        burst_p99_ms: ms(burst.2),
    })
}

/// Issue 71's soak: R5's periodic workload on silo processes on etcd whose
/// answers come late (on a healthy connection) a third of the time, longer
/// than the provider's timeout: a third of the calls time out. Run by hand;
/// it prints its figures and fails on a process exit, a silo Dead or a
/// GOAWAY of the client's own (the silos' warnings, on this process's
/// stderr, name it; `RUST_LOG=warn`).
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// Silo processes.
    #[arg(long, default_value_t = 3)]
    silos: usize,
    /// Periodic reminders.
    #[arg(long, default_value_t = 3_000)]
    count: usize,
    /// Ticks per second the reminders owe the cluster.
    #[arg(long, default_value_t = 300)]
    rate: u64,
    /// Minutes of ticks under the fault.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// The provider's `timeout_ms`.
    #[arg(long, default_value_t = 1_000)]
    timeout_ms: u64,
    /// How late etcd's answers come while late, ms (above the timeout).
    #[arg(long, default_value_t = 1_500)]
    late_ms: u64,
    /// Seconds of one cycle: answers late its first third, on time the rest.
    #[arg(long, default_value_t = 6.0)]
    cycle_s: f64,
}

/// Runs the soak (see [`SoakArgs`]).
pub fn soak(args: SoakArgs) -> anyhow::Result<()> {
    RUN_HISTORY.store(0, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(soak_run(&args))
}

async fn soak_run(args: &SoakArgs) -> anyhow::Result<()> {
    use rollcall_tests::delay::{DelayProxy, Delayed};
    let backend = rollcall_tests::fixtures::etcd()
        .await
        .ok_or_else(|| anyhow::anyhow!("no etcd server"))?;
    let upstream = tokio::net::lookup_host(backend.endpoint.as_str())
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("etcd has no address"))?;
    let proxy = Arc::new(DelayProxy::start_with(upstream, Delayed::Http2Answers).await);
    let url = format!("etcd://{}?timeout_ms={}", proxy.addr(), args.timeout_ms);
    let period_ms = (args.count as u64 * 1000 / args.rate.max(1)).max(1);
    let (cluster_id, mut ps) = cluster(&url, args.silos).await?;
    create(&mut ps, args.count, 2_000, period_ms).await?;
    tokio::time::sleep(Duration::from_millis(2_000 + 2 * period_ms)).await;
    reset(&mut ps).await?;
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(args.minutes * 60.0);
    let cycle = Duration::from_secs_f64(args.cycle_s);
    let late = Duration::from_millis(args.late_ms);
    // A client of its own through the same proxy, one read started every
    // 100 ms whether or not the last answered (as timers do): the share of
    // calls that time out under the fault.
    let probe = {
        let store = rollcall::connect(&url).await?;
        let table =
            store.membership_table(&format!("{cluster_id}-probe"), rollcall::ProtocolMode::Extended)?;
        for _ in 0..4 {
            table.read_all().await?;
        }
        tokio::spawn(async move {
            let mut reads = tokio::task::JoinSet::new();
            while Instant::now() < end {
                let table = table.clone();
                reads.spawn(async move { table.read_all().await.is_err() });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (mut calls, mut failed) = (0u64, 0u64);
            while let Some(r) = reads.join_next().await {
                calls += 1;
                failed += u64::from(r?);
            }
            anyhow::Ok((calls, failed, store.connection()))
        })
    };
    let connections_before = proxy.connections();
    let faults = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            while Instant::now() < end {
                proxy.set_delay(late);
                tokio::time::sleep(cycle / 3).await;
                proxy.set_delay(Duration::ZERO);
                tokio::time::sleep(cycle * 2 / 3).await;
            }
        })
    };
    let mut exits = 0;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(30).min(end.saturating_duration_since(Instant::now()))).await;
        for p in ps.iter_mut() {
            if p.child.try_wait()?.is_some() {
                exits += 1;
            }
        }
        anyhow::ensure!(exits == 0, "a silo process exited under the fault");
        let (ticks, p50, p99, max) = stats(&mut ps).await?;
        eprintln!(
            "soak {:>4.0} s: {ticks} ticks, lateness p50 {} p99 {} max {} ms",
            started.elapsed().as_secs_f64(),
            p50 / 1000,
            p99 / 1000,
            max / 1000
        );
    }
    faults.await?;
    let (calls, failed, seen) = probe.await??;
    proxy.set_delay(Duration::ZERO);
    println!(
        "probe client: {failed} of {calls} reads timed out ({:.0}%); its connection: {}",
        100.0 * failed as f64 / calls.max(1) as f64,
        seen.map_or_else(|| "-".to_owned(), |c| c.to_string())
    );
    println!(
        "connections to etcd through the proxy: {} when the fault began, {} at its end",
        connections_before,
        proxy.connections()
    );
    let (ticks, p50, p99, max) = stats(&mut ps).await?;
    let direct = rollcall::connect(&format!("etcd://{}", backend.endpoint)).await?;
    let table = direct.membership_table(&cluster_id, rollcall::ProtocolMode::Extended)?;
    let snap = table.read_all().await?;
    let dead = snap
        .rows()
        .filter(|e| e.status == rollcall::SiloStatus::Dead)
        .count();
    let owed = args.count as f64 * started.elapsed().as_secs_f64() * 1000.0 / period_ms as f64;
    println!(
        "etcd soak: {} silos, {} reminders at {} ticks/s, {:.1} min with answers {} ms late a third \
         of the time (timeout {} ms): {ticks} ticks ({:.1}% of those owed), lateness p50 {} p99 {} \
         max {} ms; {exits} process exits, {dead} silos Dead",
        args.silos,
        args.count,
        args.count as u64 * 1000 / period_ms,
        args.minutes,
        args.late_ms,
        args.timeout_ms,
        100.0 * ticks as f64 / owed,
        p50 / 1000,
        p99 / 1000,
        max / 1000
    );
    for p in ps {
        p.quit().await?;
    }
    anyhow::ensure!(dead == 0, "{dead} silos declared Dead");
    Ok(())
}

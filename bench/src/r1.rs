//! R1: the reminder service at scale on one silo: registrations/s through the
//! `Reminders` handle next to bare `upsert_row`s of the same provider and
//! concurrency, ticks/s and tick lateness next to bare tokio timers firing at the
//! same rate on the same runtime, and resident bytes per scheduled reminder.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use hdrhistogram::Histogram;
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall_core::{
    Clock, ClusterMembershipOptions, OnDeclaredDead, ReminderEntry, ReminderOptions, Silo, SystemClock,
    SystemStore, Timestamp,
};
use serde::Serialize;

/// Options of `r1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers: memory, redis.
    #[arg(long, value_delimiter = ',', default_value = "memory,redis")]
    providers: Vec<String>,
    /// Reminders on the silo.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    counts: Vec<usize>,
    /// Ticks per second to schedule (the period is `count / rate` seconds).
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Concurrent registrations.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds of ticks measured.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Records each reminder's run history keeps (`run_history`; 0: none).
    /// Each delivered tick appends one: its write cost is this row against
    /// a run with 0.
    #[arg(long, default_value_t = 20)]
    run_history: usize,
    /// The reports to add the R1 section and the `r1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One R1 measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    provider: String,
    reminders: usize,
    /// Registrations per second through `Reminders::register_or_update`.
    registrations_per_s: f64,
    /// Bare `upsert_row`s per second, same provider and concurrency, interleaved.
    raw_upserts_per_s: f64,
    /// Ticks delivered per second in the measured window.
    ticks_per_s: f64,
    /// Ticks scheduled per second (the target rate).
    scheduled_per_s: f64,
    lateness_p50_ms: f64,
    lateness_p99_ms: f64,
    /// Bare tokio timers at the same rate on the same runtime, measured after.
    timer_lateness_p50_ms: f64,
    timer_lateness_p99_ms: f64,
    /// Heap bytes the reminder service holds per scheduled reminder: the growth of
    /// the process's live heap blocks from before the service started to every
    /// reminder scheduled (for memory, minus the table's own copy of the rows,
    /// measured as what clearing the reference rows frees).
    heap_bytes_per_reminder: f64,
    /// Growth of the process's resident set over the same span, per reminder
    /// (includes freed pages the allocator keeps and transient peaks).
    rss_bytes_per_reminder: f64,
    /// Seconds from the service start to every reminder loaded.
    load_seconds: f64,
    /// Records each reminder's run history kept (`run_history`).
    run_history: usize,
    /// Run-history records dropped (`ReminderStats::runs_dropped`).
    runs_dropped: u64,
    /// Records in `cart/0`'s history at the end.
    history_sample: usize,
}

struct Counter {
    lateness: Arc<Mutex<Histogram<u64>>>,
    window: Arc<Mutex<(Timestamp, Timestamp, u64)>>,
}

impl Actor for Counter {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Counter {
    type Result = ();

    fn handle(&mut self, tick: ReminderTick, _: &mut Context<Self>) {
        let w = *self.window.lock().expect("window");
        if tick.now >= w.0 && tick.now < w.1 {
            let late = tick.now.saturating_duration_since(tick.scheduled).as_micros() as u64;
            let _ = self.lateness.lock().expect("hist").record(late.max(1));
            self.window.lock().expect("window").2 += 1;
        }
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

pub(crate) async fn store_for(
    provider: &str,
) -> anyhow::Result<(Arc<dyn SystemStore>, Option<rollcall_tests::fixtures::Backend>)> {
    Ok(match provider {
        "memory" => (Arc::new(rollcall::memory::MemoryStore::new()), None),
        "redis" => {
            let b = rollcall_tests::fixtures::redis()
                .await
                .ok_or_else(|| anyhow::anyhow!("no redis-server"))?;
            // Clearing a million reference rows is one script that takes longer
            // than the default 5-s response timeout on this kind of machine.
            let sep = if b.endpoint.contains('?') { '&' } else { '?' };
            let url = format!("{}{sep}timeout_ms=60000", b.endpoint);
            (rollcall::connect(&url).await?, Some(b))
        }
        other => anyhow::bail!("R1 measures memory and redis, not {other}"),
    })
}

/// Runs `n` calls of `f(i)` with `concurrency` tasks; returns the calls per second.
pub(crate) async fn concurrently<F, Fut>(
    range: std::ops::Range<usize>,
    concurrency: usize,
    f: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + 'static,
{
    let started = Instant::now();
    let n = range.len();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(range.start));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (f, next, end) = (f.clone(), next.clone(), range.end);
        tasks.push(actix::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(());
                }
                f(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

async fn measure(provider: &str, n: usize, args: &Args) -> anyhow::Result<Row> {
    let (store, _backend) = store_for(provider).await?;
    let id = rollcall_tests::unique_id("r1");
    let membership = ClusterMembershipOptions {
        probe_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let silo = Silo::builder(store.clone(), id.clone())
        .options(membership)
        .on_declared_dead(OnDeclaredDead::StopSilo)
        .start()
        .await?;
    let period = Duration::from_secs_f64((n as f64 / args.rate as f64).max(1.0));
    let options = ReminderOptions {
        allow_period_below_minimum: true,
        minimum_period: Duration::from_secs(1),
        refresh_reminder_list_period: Duration::from_secs(3600),
        loading_window: Duration::from_secs(3600),
        startup_jitter: Duration::ZERO,
        table_operation_timeout: Duration::from_secs(60),
        run_history: args.run_history,
        ..ReminderOptions::default()
    };
    let lateness = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let window = Arc::new(Mutex::new((
        Timestamp::from_millis(u64::MAX),
        Timestamp::from_millis(u64::MAX),
        0,
    )));
    let counter = Counter {
        lateness: lateness.clone(),
        window: window.clone(),
    }
    .start()
    .recipient();

    // Registrations interleaved with bare upserts into a scratch service.
    let scratch = store.reminder_table(&format!("{id}-raw"))?;
    scratch.init().await?;
    // Warm-up: every pooled connection opened and its buffers grown, so that the
    // heap growth measured below is the service's, not the client's.
    let (table, svc_id) = (scratch.clone(), format!("{id}-raw"));
    concurrently(0..args.concurrency * 16, args.concurrency, move |i| {
        let table = table.clone();
        let e = ReminderEntry::new(&svc_id, format!("warm/{i}"), "tick", Timestamp::now(), None);
        async move {
            table.upsert_row(&e).await?;
            table.read_rows_in_range(0, 0).await?;
            Ok(())
        }
    })
    .await?;
    scratch.clear().await?;
    let (heap_before, rss_before) = (crate::heap_live(), rss_bytes());
    let service = Reminders::builder(&silo, store.clone())
        .service_id(id.clone())
        .target(move |_: &ActorId| Some(counter.clone()))
        .options(options)
        .start()
        .await?;
    let spread = period.as_millis() as u64;
    let (mut reg_rate, mut raw_rate) = (Vec::new(), Vec::new());
    let rounds = 4;
    for r in 0..rounds {
        let range = (n * r / rounds)..(n * (r + 1) / rounds);
        let table = scratch.clone();
        let svc_id = format!("{id}-raw");
        raw_rate.push(
            concurrently(range.clone(), args.concurrency, move |i| {
                let table = table.clone();
                let e = ReminderEntry::new(
                    &svc_id,
                    format!("cart/{i}"),
                    "tick",
                    Timestamp::now(),
                    Some(period),
                );
                async move {
                    table.upsert_row(&e).await?;
                    Ok(())
                }
            })
            .await?,
        );
        let svc = service.clone();
        reg_rate.push(
            concurrently(range, args.concurrency, move |i| {
                let svc = svc.clone();
                async move {
                    let actor = ActorId::new("cart", i.to_string())?;
                    let due = Duration::from_millis((i as u64).wrapping_mul(7919) % spread);
                    svc.register_or_update(&actor, "tick", due, period).await?;
                    Ok(())
                }
            })
            .await?,
        );
    }
    let registrations_per_s = reg_rate.iter().sum::<f64>() / rounds as f64;
    let raw_upserts_per_s = raw_rate.iter().sum::<f64>() / rounds as f64;

    // Every reminder materialised (registration notices, or a load).
    let loading = Instant::now();
    while (service.stats().scheduled as usize) < n && loading.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let load_seconds = loading.elapsed().as_secs_f64();
    let rss_per_reminder = rss_bytes().saturating_sub(rss_before) as f64 / n as f64;
    // The memory table holds the reference rows and the service's rows, which
    // cost the same: what clearing the reference rows frees is subtracted once.
    let heap_loaded = crate::heap_live();
    scratch.clear().await?;
    let heap_cleared = crate::heap_live();
    let table_rows = if provider == "memory" {
        heap_loaded - heap_cleared
    } else {
        0
    };
    let heap_per_reminder = (heap_cleared - heap_before - table_rows) as f64 / n as f64;

    // Ticks: a window after one period of settling (or at once for long periods).
    let settle = period.min(Duration::from_secs(5));
    tokio::time::sleep(settle).await;
    let from = SystemClock.now();
    let to = from.saturating_add(Duration::from_secs_f64(args.seconds));
    *window.lock().expect("window") = (from, to, 0);
    tokio::time::sleep(Duration::from_secs_f64(args.seconds) + Duration::from_millis(500)).await;
    let delivered = window.lock().expect("window").2;
    let h = lateness.lock().expect("hist").clone();
    // The appends landed: records dropped, and one reminder's history.
    let runs_dropped = service.stats().runs_dropped;
    let sample = ActorId::new("cart", "0")?;
    let history_sample = service.history(&sample, "tick").await.map_or(0, |r| r.len());
    silo.kill();

    // Reference: bare tokio timers at the same rate on the same runtime.
    let timers = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let count = (args.rate as f64 * args.seconds) as u64;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let step = Duration::from_secs_f64(1.0 / args.rate as f64);
    let mut handles = Vec::with_capacity(count as usize);
    for k in 0..count {
        let at = start + step * k as u32;
        let timers = timers.clone();
        handles.push(actix::spawn(async move {
            tokio::time::sleep_until(at).await;
            let late = tokio::time::Instant::now()
                .saturating_duration_since(at)
                .as_micros() as u64;
            let _ = timers.lock().expect("timers").record(late.max(1));
        }));
    }
    for hd in handles {
        let _ = hd.await;
    }
    let t = timers.lock().expect("timers").clone();
    Ok(Row {
        provider: provider.to_owned(),
        reminders: n,
        registrations_per_s,
        raw_upserts_per_s,
        ticks_per_s: delivered as f64 / args.seconds,
        scheduled_per_s: n as f64 / period.as_secs_f64(),
        lateness_p50_ms: ms(h.value_at_quantile(0.5)),
        lateness_p99_ms: ms(h.value_at_quantile(0.99)),
        timer_lateness_p50_ms: ms(t.value_at_quantile(0.5)),
        timer_lateness_p99_ms: ms(t.value_at_quantile(0.99)),
        heap_bytes_per_reminder: heap_per_reminder,
        rss_bytes_per_reminder: rss_per_reminder,
        load_seconds,
        run_history: args.run_history,
        runs_dropped,
        history_sample,
    })
}

/// Runs R1 (each measurement in its own actix `System` on its own thread) and adds
/// its section to the Markdown report and its key to the JSON report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for provider in &args.providers {
        for &n in &args.counts {
            let (p, a) = (provider.clone(), args.clone());
            let row = crate::on_own_thread(format!("R1 {provider} {n}"), move || {
                actix::System::new().block_on(async move { measure(&p, n, &a).await })
            })?;
            eprintln!("{row:?}");
            rows.push(row);
        }
    }
    let body = section(&rows, &args);
    args.reports
        .add(("## R1", &body), ("r1", serde_json::to_value(&rows)?))
}

fn section(rows: &[Row], args: &Args) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## R1: reminders at scale on one silo\n\n\
         One silo; `count` reminders registered through `Reminders::register_or_update` by {} \
         concurrent tasks, in 4 rounds interleaved with bare `upsert_row`s of the same provider \
         (the reference). Periods are `count / {}` s, first ticks spread over one period, so the \
         silo delivers {} ticks/s; lateness (`now - scheduled` in each tick) is measured over \
         {} s, then bare tokio timers fire at the same rate on the same runtime (the reference). \
         Bytes per reminder: the growth of the process's live heap blocks (a counting global \
         allocator, each block at glibc's size for it) from before the service started to every \
         reminder scheduled, over the count (memory: minus the table's own copy of the rows, \
         which is what clearing the reference rows frees); RSS growth over the same span is shown \
         too (it keeps freed pages and transient peaks). Run histories keep {} records (one \
         append per delivered tick).\n",
        args.concurrency, args.rate, args.rate, args.seconds, args.run_history
    );
    let _ = writeln!(
        md,
        "| provider | reminders | registrations/s | ÷ raw upserts/s | ticks/s (scheduled) | lateness p50 / p99 ms | timers p50 / p99 ms | heap (RSS) bytes/reminder | load s |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} | {:.0} ({:.0}) | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} ({:.0}) | {:.1} |",
            r.provider,
            r.reminders,
            r.registrations_per_s,
            r.registrations_per_s / r.raw_upserts_per_s,
            r.ticks_per_s,
            r.scheduled_per_s,
            r.lateness_p50_ms,
            r.lateness_p99_ms,
            r.timer_lateness_p50_ms,
            r.timer_lateness_p99_ms,
            r.heap_bytes_per_reminder,
            r.rss_bytes_per_reminder,
            r.load_seconds
        );
    }
    let _ = writeln!(
        md,
        "\nGoals (issue): ≥ 4,000 registrations/s on one Redis; lateness p99 < 20 ms at 10k ticks/s; \
         < 256 bytes per reminder."
    );
    md
}

//! R2: reminder failover. Three silos on real TCP share a reminder table; one is
//! killed (a crash: nothing written). Measured from the kill: when a survivor
//! first reads it Dead (detection: the cluster declared it dead) and when the
//! survivors hold every reminder again
//! (failover: all of the victim's reminders loaded and scheduled on a survivor).
//! The figure is failover ÷ detection in the same run: what the reminder service
//! adds to the membership protocol's own detection time.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall_core::{
    ClusterMembershipOptions, OnDeclaredDead, ReminderEntry, ReminderOptions, Silo, SiloHandle, SiloStatus,
    Timestamp,
};
use serde::Serialize;

/// Options of `r2`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers: memory, redis.
    #[arg(long, value_delimiter = ',', default_value = "memory,redis")]
    providers: Vec<String>,
    /// Reminders in the cluster (the victim owns about a third).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    counts: Vec<usize>,
    /// Kills measured per provider and count (each in a fresh cluster).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The reports to add the R2 section and the `r2` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One kill.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    provider: String,
    reminders: usize,
    /// Reminders the victim held when it was killed.
    orphaned: u64,
    /// Seconds from the kill until a survivor first reads the victim Dead.
    detection_s: f64,
    /// Seconds from the kill until the survivors hold every reminder (loaded
    /// and scheduled).
    loaded_s: f64,
    /// Seconds from the kill until the survivors may deliver every reminder:
    /// the later of `loaded_s` and each survivor's first sight of the victim
    /// Dead plus the lease period (a takeover delivers nothing before it).
    failover_s: f64,
}

/// Ticks go nowhere: R2 measures ownership, not delivery.
struct Sink;

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Sink {
    type Result = ();

    fn handle(&mut self, _: ReminderTick, _: &mut Context<Self>) {}
}

/// Polls `cond` every 2 ms for at most `limit`; the time it took.
pub(crate) async fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while !cond() {
        if started.elapsed() > limit {
            anyhow::bail!("not reached within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(started.elapsed())
}

async fn once(provider: &str, n: usize) -> anyhow::Result<Run> {
    let (store, _backend) = crate::r1::store_for(provider).await?;
    let id = rollcall_tests::unique_id("r2");
    // The rows first, written straight to the table (R1 measures registrations).
    let table = store.reminder_table(&id)?;
    table.init().await?;
    let period = Duration::from_secs(600);
    let now = Timestamp::now();
    let (t, svc) = (table.clone(), id.clone());
    crate::r1::concurrently(0..n, 64, move |i| {
        let t = t.clone();
        let e = ReminderEntry::new(
            &svc,
            format!("cart/{i}"),
            "tick",
            now.saturating_add(Duration::from_millis((i as u64 * 7919) % 600_000)),
            Some(period),
        );
        async move {
            t.upsert_row(&e).await?;
            Ok(())
        }
    })
    .await?;
    let mut silos: Vec<SiloHandle> = Vec::new();
    for _ in 0..3 {
        silos.push(
            Silo::builder(store.clone(), id.clone())
                .options(ClusterMembershipOptions::fast())
                .on_declared_dead(OnDeclaredDead::StopSilo)
                .start()
                .await?,
        );
    }
    until(Duration::from_secs(30), || {
        silos.iter().all(|s| {
            s.snapshot()
                .rows()
                .filter(|e| e.status == SiloStatus::Active)
                .count()
                == 3
        })
    })
    .await?;
    let options = ReminderOptions {
        loading_window: Duration::from_secs(3600),
        startup_jitter: Duration::ZERO,
        table_operation_timeout: Duration::from_secs(60),
        initialization_timeout: Duration::from_secs(120),
        ..ReminderOptions::default()
    };
    let sink = Sink.start().recipient();
    let mut services = Vec::new();
    for silo in &silos {
        let sink = sink.clone();
        services.push(
            Reminders::builder(silo, store.clone())
                .service_id(id.clone())
                .target(move |_: &ActorId| Some(sink.clone()))
                .options(options.clone())
                .start()
                .await?,
        );
    }
    let held = |services: &[Reminders]| services.iter().map(|s| s.stats().scheduled).sum::<u64>();
    until(Duration::from_secs(300), || held(&services) == n as u64).await?;

    let victim = silos[0].address();
    let orphaned = services[0].stats().scheduled;
    let killed = Instant::now();
    silos[0].kill();
    let survivors = &services[1..];
    let mut seen: Vec<Option<Duration>> = vec![None; silos.len() - 1];
    let mut loaded = None;
    while seen.iter().any(Option::is_none) || loaded.is_none() {
        if killed.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("no failover within 120 s (seen Dead: {seen:?})");
        }
        for (s, at) in silos[1..].iter().zip(seen.iter_mut()) {
            if at.is_none() && s.snapshot().status_of(&victim) == Some(SiloStatus::Dead) {
                *at = Some(killed.elapsed());
            }
        }
        if loaded.is_none() && held(survivors) == n as u64 {
            loaded = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let detection = seen.iter().flatten().min().copied();
    let fence = if options.lease_fencing {
        options.lease_period
    } else {
        Duration::ZERO
    };
    let failover = seen.iter().flatten().max().map(|t| *t + fence).max(loaded);
    for s in &silos[1..] {
        s.kill();
    }
    Ok(Run {
        provider: provider.to_owned(),
        reminders: n,
        orphaned,
        detection_s: detection.map_or(0.0, |d| d.as_secs_f64()),
        loaded_s: loaded.map_or(0.0, |d| d.as_secs_f64()),
        failover_s: failover.map_or(0.0, |d| d.as_secs_f64()),
    })
}

/// Runs R2 (each kill in its own actix `System` on its own thread) and adds its
/// section to the Markdown report and its key to the JSON report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for provider in &args.providers {
        for &n in &args.counts {
            for _ in 0..args.runs {
                let p = provider.clone();
                let run = crate::on_own_thread(format!("R2 {provider} {n}"), move || {
                    actix::System::new().block_on(once(&p, n))
                })?;
                eprintln!("{run:?}");
                runs.push(run);
            }
        }
    }
    let body = section(&runs, &args);
    args.reports
        .add(("## R2", &body), ("r2", serde_json::to_value(&runs)?))
}

fn section(runs: &[Run], args: &Args) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## R2: reminder failover relative to detection\n\n\
         Three silos on real TCP (fast profile: 500 ms probes) share one reminder table holding \
         `count` reminders (10-minute periods; 1,024 shards; default reminder options: lease \
         period 2 s, fencing on); one silo is killed, {} times per row, each in a fresh cluster. \
         Detection: kill → the first survivor reads the victim Dead (it was declared dead). \
         Loaded: kill → the survivors hold every reminder (the victim's shards acquired, loaded \
         and scheduled; sampled every millisecond). Failover: kill → the survivors may deliver \
         them: the later of loaded and the last survivor's first sight of the victim Dead plus \
         the lease period (a takeover loads during its fence and delivers nothing before it). \
         The figure is failover ÷ detection of the same kill.\n",
        args.runs
    );
    let _ = writeln!(
        md,
        "| provider | reminders | orphaned (mean) | detection s (median) | loaded s (median) | failover s (median) | failover ÷ detection (median, max) |\n|---|---|---|---|---|---|---|"
    );
    let mut groups: Vec<(String, usize)> = runs.iter().map(|r| (r.provider.clone(), r.reminders)).collect();
    groups.dedup();
    for (provider, n) in groups {
        let rs: Vec<&Run> = runs
            .iter()
            .filter(|r| r.provider == provider && r.reminders == n)
            .collect();
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let ratios: Vec<f64> = rs.iter().map(|r| r.failover_s / r.detection_s).collect();
        let max = ratios.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            md,
            "| {provider} | {n} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2}, {:.2} |",
            rs.iter().map(|r| r.orphaned as f64).sum::<f64>() / rs.len() as f64,
            median(rs.iter().map(|r| r.detection_s).collect()),
            median(rs.iter().map(|r| r.loaded_s).collect()),
            median(rs.iter().map(|r| r.failover_s).collect()),
            median(ratios),
            max
        );
    }
    md
}

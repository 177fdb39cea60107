//! D1: crash detection in virtual time. A cluster of N silos (default options)
//! forms by a join storm on the simulated network and the memory table (1 ms per
//! call); then silos are killed (a crash: nothing written, the port closed) one at
//! a time, and, in clusters of 100 silos or more, 10% at once. Detection of a
//! victim = the kill until every surviving silo's view has it Dead. Reported as
//! p50/p99 over the kills, relative to the protocol's detection bound
//! `L x T + T/2` (`num_missed_probes_limit x probe_timeout + probe_timeout / 2`),
//! with the silos declared Dead that were not killed (false deaths).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollcall_core::{ClusterMembershipOptions, SiloAddress, SiloHandle, SiloStatus};
use serde::Serialize;

/// Options of `d1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "5,50,1000")]
    sizes: Vec<usize>,
    /// Single kills per size (clusters smaller than 3 x runs get a fresh cluster
    /// per kill, seeded differently).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Seed of the first cluster.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Kills on real TCP with the fast profile (5 silos, `probe_timeout` 500 ms, as
    /// `rollcall demo --fast`); 0 skips them.
    #[arg(long, default_value_t = 20)]
    tcp_runs: usize,
    /// The reports to add the D1 section and the `d1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// The figures of one size and kind of crash.
#[derive(Clone, Debug, Serialize)]
pub struct Detection {
    silos: usize,
    /// "one at a time" or "10% at once".
    crash: String,
    /// Victims measured.
    kills: usize,
    /// Seconds (virtual), median over the victims.
    p50_s: f64,
    /// Seconds (virtual), 99th percentile over the victims.
    p99_s: f64,
    /// The detection bound `L x T + T/2`, seconds.
    bound_s: f64,
    /// Silos the table has Dead that were never killed.
    false_deaths: usize,
    /// Victims no survivor-wide Dead was seen for within the limit.
    undetected: usize,
}

/// The bound of the protocol's docs: a crashed silo is voted against at most
/// `L x T + T/2` after the crash.
fn bound(o: &ClusterMembershipOptions) -> Duration {
    o.probe_timeout * o.num_missed_probes_limit + o.probe_period()
}

/// A random time within one probe period.
fn phase(rng: &mut StdRng, o: &ClusterMembershipOptions) -> Duration {
    o.probe_period().mul_f64(rng.random::<f64>())
}

fn all_see_dead(survivors: &[&SiloHandle], victim: &SiloAddress) -> bool {
    survivors
        .iter()
        .all(|s| s.shared_snapshot().status_of(victim) == Some(SiloStatus::Dead))
}

/// Kills `victims` (indexes into `silos`) at once; the detection time of each (or
/// `None` if not all survivors saw it Dead within `limit`).
async fn kill(
    silos: &[SiloHandle],
    victims: &[usize],
    limit: Duration,
    phase: Duration,
) -> Vec<Option<Duration>> {
    // Crashes happen at any phase of the probe period: wait a random part of it.
    tokio::time::sleep(phase).await;
    let addrs: Vec<SiloAddress> = victims.iter().map(|&i| silos[i].address()).collect();
    for &i in victims {
        silos[i].kill();
    }
    let survivors: Vec<&SiloHandle> = silos.iter().filter(|s| !s.is_stopped()).collect();
    let started = tokio::time::Instant::now();
    let mut seen: Vec<Option<Duration>> = vec![None; victims.len()];
    while started.elapsed() <= limit && seen.iter().any(Option::is_none) {
        for (k, v) in addrs.iter().enumerate() {
            if seen[k].is_none() && all_see_dead(&survivors, v) {
                seen[k] = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

/// Silos Dead in the table (as `observer` sees it) that are not in `killed`.
fn false_deaths(observer: &SiloHandle, killed: &[SiloAddress]) -> usize {
    observer
        .shared_snapshot()
        .rows()
        .filter(|e| e.status == SiloStatus::Dead && !killed.contains(&e.silo))
        .count()
}

async fn cluster(n: usize, seed: u64, options: &ClusterMembershipOptions) -> anyhow::Result<Vec<SiloHandle>> {
    let store = Arc::new(rollcall::memory::MemoryStore::new());
    Ok(
        crate::j1::storm(store, Duration::from_millis(1), n, options, seed)
            .await?
            .silos,
    )
}

async fn measure(n: usize, runs: usize, seed: u64) -> anyhow::Result<Vec<Detection>> {
    let options = ClusterMembershipOptions::default();
    let limit = bound(&options) * 4;
    let mut out = Vec::new();
    let mut times: Vec<Option<Duration>> = Vec::new();
    let mut false_dead = 0;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xd1);
    if n < 3 * runs {
        // Small clusters: a fresh cluster per kill.
        for run in 0..runs {
            let silos = cluster(n, seed.wrapping_add(run as u64), &options).await?;
            let victim = run % n;
            times.extend(kill(&silos, &[victim], limit, phase(&mut rng, &options)).await);
            let observer = &silos[(victim + 1) % n];
            false_dead += false_deaths(observer, &[silos[victim].address()]);
            for s in &silos {
                s.kill();
            }
        }
    } else {
        let silos = cluster(n, seed, &options).await?;
        let mut killed = Vec::new();
        for run in 0..runs {
            // Spread over the cluster; silo 0 stays as the observer.
            let victim = 1 + run * (n - 1) / runs;
            killed.push(silos[victim].address());
            times.extend(kill(&silos, &[victim], limit, phase(&mut rng, &options)).await);
        }
        false_dead = false_deaths(&silos[0], &killed);
        out.push(summary(n, "one at a time", &times, &options, false_dead));
        if n >= 100 {
            // 10% at once, among those still alive.
            let alive: Vec<usize> = (1..n).filter(|&i| !silos[i].is_stopped()).collect();
            let step = alive.len() / (n / 10);
            let victims: Vec<usize> = alive.iter().step_by(step.max(1)).take(n / 10).copied().collect();
            killed.extend(victims.iter().map(|&i| silos[i].address()));
            let t = kill(&silos, &victims, limit, phase(&mut rng, &options)).await;
            let fd = false_deaths(&silos[0], &killed);
            out.push(summary(n, "10% at once", &t, &options, fd));
        }
        for s in &silos {
            s.kill();
        }
        return Ok(out);
    }
    out.push(summary(n, "one at a time", &times, &options, false_dead));
    Ok(out)
}

fn summary(
    n: usize,
    crash: &str,
    times: &[Option<Duration>],
    options: &ClusterMembershipOptions,
    false_deaths: usize,
) -> Detection {
    let mut seen: Vec<f64> = times.iter().flatten().map(Duration::as_secs_f64).collect();
    seen.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if seen.is_empty() {
            f64::NAN
        } else {
            seen[((seen.len() as f64 * p).ceil() as usize).clamp(1, seen.len()) - 1]
        }
    };
    Detection {
        silos: n,
        crash: crash.to_owned(),
        kills: times.len(),
        p50_s: pct(0.5),
        p99_s: pct(0.99),
        bound_s: bound(options).as_secs_f64(),
        false_deaths,
        undetected: times.iter().filter(|t| t.is_none()).count(),
    }
}

/// D1 on real TCP and real time: 5 silos with the fast profile on loopback and the
/// memory table; `runs` times one is killed (its port closes) and the detection
/// time is taken (every survivor's view has it Dead, polled every 2 ms); a fresh
/// silo replaces it before the next kill.
async fn measure_tcp(runs: usize, seed: u64) -> anyhow::Result<Detection> {
    use rollcall_core::{OnDeclaredDead, Silo};
    let options = ClusterMembershipOptions::fast();
    let store: Arc<dyn rollcall_core::SystemStore> = Arc::new(rollcall::memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("d1-tcp");
    let start = || {
        Silo::builder(store.clone(), cluster.clone())
            .options(options.clone())
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
    };
    let mut silos = Vec::new();
    for _ in 0..5 {
        silos.push(start().await?);
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7c9);
    let limit = bound(&options) * 4;
    let (mut times, mut killed) = (Vec::new(), Vec::new());
    for run in 0..runs {
        // Every view holds 5 Active silos before the kill.
        let settle = std::time::Instant::now();
        while !silos
            .iter()
            .all(|s: &SiloHandle| s.shared_snapshot().active().count() == 5)
        {
            anyhow::ensure!(
                settle.elapsed() < limit,
                "the cluster did not settle before kill {run}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(phase(&mut rng, &options)).await;
        let victim = silos.remove(run % silos.len());
        killed.push(victim.address());
        victim.kill();
        let started = std::time::Instant::now();
        let mut seen = None;
        while started.elapsed() <= limit {
            if silos
                .iter()
                .all(|s| s.shared_snapshot().status_of(&victim.address()) == Some(SiloStatus::Dead))
            {
                seen = Some(started.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        times.push(seen);
        silos.push(start().await?);
    }
    let fd = false_deaths(&silos[0], &killed);
    for s in &silos {
        s.kill();
    }
    Ok(summary(
        5,
        "one at a time, real TCP, fast profile",
        &times,
        &options,
        fd,
    ))
}

/// Runs D1 (each size in its own actix `System`, virtual time; then the real-TCP
/// runs) and adds its section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for &n in &args.sizes {
        anyhow::ensure!(n >= 3, "D1 needs clusters of at least 3 silos");
        let (runs, seed) = (args.runs, args.seed);
        let rows = crate::on_own_thread(format!("D1 {n}"), move || {
            rollcall_tests::sim::run_virtual(|| measure(n, runs, seed))
        })?;
        for r in &rows {
            eprintln!("{r:?}");
        }
        all.extend(rows);
    }
    if args.tcp_runs > 0 {
        let (runs, seed) = (args.tcp_runs, args.seed);
        let row = crate::on_own_thread("D1 on TCP".to_owned(), move || {
            actix::System::new().block_on(measure_tcp(runs, seed))
        })?;
        eprintln!("{row:?}");
        all.push(row);
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## D1: crash detection in virtual time\n\n\
         Default options (probe_timeout T = 5 s, num_missed_probes_limit L = 3); the cluster \
         forms by a join storm on the simulated network and the memory table (1 ms per call). \
         Silos are killed one at a time ({} kills per size; clusters under {} silos are \
         rebuilt for every kill), and in clusters of 100 or more 10% are then killed at once. \
         Detection of a victim: the kill until every surviving view has it Dead (sampled \
         every 50 ms). The bound is `L x T + T/2` = {:.1} s. The last row is real time on \
         real TCP (loopback): 5 silos with the fast profile of `rollcall demo --fast` \
         (T = 500 ms, bound 1.75 s) and the in-process memory table, one killed per run \
         and replaced, detection polled every 2 ms. Goals: p99 ≤ 1.2 × bound, 0 false \
         deaths.\n",
        args.runs,
        3 * args.runs,
        bound(&ClusterMembershipOptions::default()).as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| silos | crash | kills | p50 s | p99 s | p99 ÷ bound | false deaths | undetected |\n|---|---|---|---|---|---|---|---|"
    );
    for d in &all {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
            d.silos,
            d.crash,
            d.kills,
            d.p50_s,
            d.p99_s,
            d.p99_s / d.bound_s,
            d.false_deaths,
            d.undetected
        );
    }
    args.reports
        .add(("## D1", &md), ("d1", serde_json::to_value(&all)?))
}

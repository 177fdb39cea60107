//! J1: join storms. `N` real silos (the actix agents and the sans-io protocol
//! machine, as users run them) start at the same instant on the simulated network
//! (every message through the wire codec) and one membership table:
//!
//! - **virtual**: the memory table behind a fixed store latency (1 ms per call by
//!   default), on a paused tokio clock: minutes of protocol in seconds of CPU, the
//!   same run for the same seed;
//! - **redis**: a real redis-server, in real time.
//!
//! Measured: time until every silo's join returned (all Active), until every silo's
//! view holds the final table version (converged), the table calls per join (full
//! reads, delta reads, row writes), conflicts per committed write, and the table
//! calls per silo per minute once the cluster is quiet. Each is reported relative
//! to the 10-silo storm of the same run and store.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_core::transport::sim::SimNetwork;
use rollcall_core::{
    Clock, ClusterMembershipOptions, OnDeclaredDead, Silo, SiloHandle, SiloStatus, SystemStore, Timestamp,
    TokioClock,
};
use rollcall_tests::counting::{CountingStore, Counts, CountsSnapshot};
use serde::Serialize;

/// Longest a storm of `n` silos may take in wall-clock time: 180 s, plus 150 ms
/// per silo (a 10,000-silo storm simulates 10^8 row updates of views: it took
/// 15 minutes of one core here, storm and quiet minute together).
fn wall_limit(n: usize) -> Duration {
    Duration::from_secs(180) + Duration::from_millis(150).saturating_mul(n as u32)
}

/// Where the clock of a virtual-time storm starts: 2026-01-01T00:00:00Z.
const VIRTUAL_EPOCH: Timestamp = Timestamp::from_millis(1_767_225_600_000);

/// Options of `j1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Storm sizes on the memory table in virtual time (10 is the reference and is
    /// always run first).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    silos: Vec<usize>,
    /// Storm sizes on a real redis-server in real time.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    redis_silos: Vec<usize>,
    /// Skip the Redis storms.
    #[arg(long)]
    no_redis: bool,
    /// The memory table's latency per call, in milliseconds (virtual time).
    #[arg(long, default_value_t = 1.0)]
    latency_ms: f64,
    /// Seed of the network and of every silo's protocol RNG.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The reports to add the J1 section and the `j1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// The silos of one storm and what they cost.
pub(crate) struct Cluster {
    pub(crate) silos: Vec<SiloHandle>,
    pub(crate) counts: Arc<Counts>,
    /// The network (to inject loss, stalls and partitions).
    #[allow(dead_code)] // used by D1/D2
    pub(crate) net: SimNetwork,
    /// From the launch until the last join returned.
    pub(crate) all_active: Duration,
    /// From the launch until every silo's view held the table's version.
    pub(crate) converged: Duration,
    /// The calls the storm made (launch to convergence).
    pub(crate) storm: CountsSnapshot,
}

/// The endpoint of silo `i` (0-based): `10.a.b.c:11111`, so 16 million silos fit.
pub(crate) fn endpoint(i: usize) -> SocketAddr {
    let i = (i + 1) as u32;
    SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 11111))
}

/// Polls `cond` every 50 ms (tokio time: virtual under a paused clock) for at
/// most `limit`; the time it took.
pub(crate) async fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let started = tokio::time::Instant::now();
    while !cond() {
        if started.elapsed() > limit {
            anyhow::bail!("not reached within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(started.elapsed())
}

/// Returns once `limit` of wall-clock time has passed since `since`, looking every
/// 100 ms of tokio time (virtual or real).
async fn wall_clock_deadline(since: Instant, limit: Duration) {
    while since.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts `n` silos at once on a new simulated network over `store` (wrapped to
/// count its calls) and waits until all are Active and every view holds the
/// table's version.
///
/// # Errors
/// A join that failed, or no convergence within 10 minutes (tokio time).
pub(crate) async fn storm(
    store: Arc<dyn SystemStore>,
    latency: Duration,
    n: usize,
    options: &ClusterMembershipOptions,
    seed: u64,
) -> anyhow::Result<Cluster> {
    let store = CountingStore::new(store).with_latency(latency);
    let counts = store.counts.clone();
    let store: Arc<dyn SystemStore> = Arc::new(store);
    let cluster_id = rollcall_tests::unique_id("j1");
    let table = store.membership_table(&cluster_id, options.protocol_mode())?;
    table.init(true).await?;
    let net = SimNetwork::new(seed);
    // In virtual time the clock starts at a fixed instant: silo generations (and so
    // ring positions, probe targets and every decision after them) then depend on
    // the seed alone, and a run repeats exactly. Real-time storms use the real time.
    let start = if latency.is_zero() {
        Timestamp::now()
    } else {
        VIRTUAL_EPOCH
    };
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(start));
    let before = counts.snapshot();
    let launched = tokio::time::Instant::now();
    let mut joins = Vec::with_capacity(n);
    for i in 0..n {
        let addr = endpoint(i);
        let start = Silo::builder(store.clone(), cluster_id.clone())
            .listen(addr)
            .transport(Arc::new(net.transport(addr)))
            // The paused tokio clock is this thread's: the silo stays on it.
            .own_thread(false)
            .options(options.clone())
            .clock(clock.clone())
            .seed(seed.wrapping_mul(1_000_003).wrapping_add(i as u64))
            .host_name(format!("host-{i}"))
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start();
        joins.push(actix::spawn(start));
    }
    let mut silos = Vec::with_capacity(n);
    for (i, join) in joins.into_iter().enumerate() {
        let silo = join
            .await
            .map_err(|e| anyhow::anyhow!("silo {i}'s join task: {e}"))?
            .map_err(|e| anyhow::anyhow!("silo {i} failed to join: {e}"))?;
        silos.push(silo);
    }
    let all_active = launched.elapsed();
    let version = table.read_all().await?.version.version;
    until(Duration::from_secs(600), || {
        silos
            .iter()
            .all(|s| s.shared_snapshot().version.version >= version)
    })
    .await?;
    let converged = launched.elapsed();
    let storm = counts.snapshot().since(&before);
    Ok(Cluster {
        silos,
        counts,
        net,
        all_active,
        converged,
        storm,
    })
}

/// One storm's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Storm {
    store: String,
    silos: usize,
    /// Seconds (tokio time) from the launch until every join returned.
    all_active_s: f64,
    /// Seconds (tokio time) from the launch until every view held the final version.
    converged_s: f64,
    /// Wall-clock seconds the storm took to simulate or run.
    wall_s: f64,
    /// Per join (launch to convergence): `read_all` calls.
    full_reads_per_join: f64,
    /// Per join: `read_delta` calls.
    delta_reads_per_join: f64,
    /// Per join: row writes (inserts and updates, committed or not).
    writes_per_join: f64,
    /// Per join: every table call.
    calls_per_join: f64,
    /// Conflicting writes per committed write.
    conflicts_per_commit: f64,
    /// Table calls per silo per minute over the quiet minute after convergence.
    quiet_calls_per_silo_min: f64,
    /// The share of one core the storm's thread (every silo, the codec and the
    /// store client: one event loop) was on CPU for, launch to convergence. Near
    /// 1 means the host, not the store, set the pace (real-time storms only).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cpu_share: Option<f64>,
    /// Every silo Active in the table and in every view at the end.
    all_agree: bool,
    /// Why the storm did not finish (then the other figures are zero).
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<String>,
}

impl Storm {
    fn failed(store: &str, silos: usize, wall_s: f64, why: String) -> Self {
        Storm {
            store: store.to_owned(),
            silos,
            all_active_s: 0.0,
            converged_s: 0.0,
            wall_s,
            full_reads_per_join: 0.0,
            delta_reads_per_join: 0.0,
            writes_per_join: 0.0,
            calls_per_join: 0.0,
            conflicts_per_commit: 0.0,
            quiet_calls_per_silo_min: 0.0,
            client_cpu_share: None,
            all_agree: false,
            failed: Some(why),
        }
    }
}

/// CPU time the calling thread has run (`/proc/thread-self/schedstat`), if the
/// kernel tells.
fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

async fn measure(
    store_name: &str,
    store: Arc<dyn SystemStore>,
    latency: Duration,
    n: usize,
    seed: u64,
    quiet: Duration,
) -> anyhow::Result<Storm> {
    let real_time = latency.is_zero();
    let wall = Instant::now();
    let cpu_before = thread_cpu();
    let options = ClusterMembershipOptions::default();
    // The storm is bounded in wall-clock time too (a tokio timeout would count
    // virtual seconds on the memory table): a host that cannot carry N silos fails
    // the row instead of running for ever.
    let outcome = tokio::select! {
        r = storm(store, latency, n, &options, seed) => Ok(r),
        () = wall_clock_deadline(wall, wall_limit(n)) => Err(()),
    };
    let c = match outcome {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Ok(Storm::failed(
                store_name,
                n,
                wall.elapsed().as_secs_f64(),
                e.to_string(),
            ))
        }
        Err(_) => {
            let why = format!("not all Active within {:?} of wall-clock time", wall_limit(n));
            return Ok(Storm::failed(store_name, n, wall.elapsed().as_secs_f64(), why));
        }
    };
    let wall_s = wall.elapsed().as_secs_f64();
    let client_cpu_share = match (cpu_before, thread_cpu()) {
        (Some(a), Some(b)) if real_time && wall_s > 0.0 => Some(b.saturating_sub(a).as_secs_f64() / wall_s),
        _ => None,
    };
    let before = c.counts.snapshot();
    tokio::time::sleep(quiet).await;
    let after = c.counts.snapshot().since(&before);
    let all_agree = c.silos.iter().all(|s| {
        s.status() == SiloStatus::Active
            && s.shared_snapshot()
                .rows()
                .filter(|e| e.status == SiloStatus::Active)
                .count()
                == n
    });
    for s in &c.silos {
        s.kill();
    }
    let per = |x: u64| x as f64 / n as f64;
    let s = c.storm;
    Ok(Storm {
        store: store_name.to_owned(),
        silos: n,
        all_active_s: c.all_active.as_secs_f64(),
        converged_s: c.converged.as_secs_f64(),
        wall_s,
        full_reads_per_join: per(s.read_all),
        delta_reads_per_join: per(s.read_delta),
        writes_per_join: per(s.writes),
        calls_per_join: per(s.calls()),
        conflicts_per_commit: s.conflicts as f64 / s.commits().max(1) as f64,
        quiet_calls_per_silo_min: per(after.calls()) * 60.0 / quiet.as_secs_f64(),
        client_cpu_share,
        all_agree,
        failed: None,
    })
}

/// Runs J1 (each storm in its own actix `System` on its own thread) and adds its
/// section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut storms = Vec::new();
    let latency = Duration::from_secs_f64(args.latency_ms / 1000.0);
    for &n in &with_reference(&args.silos) {
        let seed = args.seed;
        let storm = crate::on_own_thread(format!("J1 memory {n}"), move || {
            rollcall_tests::sim::run_virtual(|| async move {
                let store = Arc::new(rollcall::memory::MemoryStore::new());
                measure("memory", store, latency, n, seed, Duration::from_secs(60)).await
            })
        })?;
        eprintln!("{storm:?}");
        storms.push(storm);
    }
    if !args.no_redis {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let backend = rt
            .block_on(rollcall_tests::fixtures::redis())
            .ok_or_else(|| anyhow::anyhow!("no redis-server"))?;
        for &n in &with_reference(&args.redis_silos) {
            let (url, seed) = (backend.endpoint.clone(), args.seed);
            let storm = crate::on_own_thread(format!("J1 redis {n}"), move || {
                actix::System::new().block_on(async move {
                    let store = rollcall::connect(&url).await?;
                    measure("redis", store, Duration::ZERO, n, seed, Duration::from_secs(10)).await
                })
            })?;
            eprintln!("{storm:?}");
            storms.push(storm);
        }
        drop(backend);
    }
    let body = section(&storms, &args);
    args.reports
        .add(("## J1", &body), ("j1", serde_json::to_value(&storms)?))
}

/// `sizes` with 10 first (the reference every ratio divides by).
fn with_reference(sizes: &[usize]) -> Vec<usize> {
    let mut v = vec![10];
    v.extend(sizes.iter().copied().filter(|&n| n != 10));
    v
}

fn section(storms: &[Storm], args: &Args) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## J1: join storms\n\n\
         N silos (default options) start at the same instant on the simulated network (every \
         message through the wire codec) and one membership table: the memory table with \
         {} ms per call in virtual time, or a real redis-server in real time. *Active*: every \
         join returned; *converged*: every view holds the final table version. Calls per join \
         count every table call from the launch to convergence (full reads, delta reads, row \
         writes, IAmAlive), divided by N; *quiet*: table calls per silo per minute after \
         convergence (a minute of virtual time; 10 s on Redis). Ratios (×) are against the \
         10-silo storm on the same store in the same run; log2 N ÷ log2 10 is given for the \
         \"at most ~log N\" goal. *Client CPU* (real time only): the share of one core the \
         storm's thread ran, launch to convergence; every silo, the wire codec and the store \
         client share that one event loop, so near 100% the host sets the pace: writes wait \
         longer between their read and their commit, and more of them conflict.\n",
        args.latency_ms
    );
    let _ = writeln!(
        md,
        "| store | silos | all Active s (× 10) | converged s | wall s | full reads/join | delta reads/join | writes/join | calls/join (× 10; log ×) | conflicts/commit | quiet calls/silo/min | client CPU | all agree |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for s in storms {
        if let Some(why) = &s.failed {
            let _ = writeln!(
                md,
                "| {} | {} | **failed** after {:.0} s wall: {why} | | | | | | | | | | no |",
                s.store, s.silos, s.wall_s
            );
            continue;
        }
        let reference = storms
            .iter()
            .find(|r| r.store == s.store && r.silos == 10)
            .unwrap_or(s);
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} ({:.1}) | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} | {:.1} ({:.2}; {:.2}) | {:.3} | {:.1} | {} | {} |",
            s.store,
            s.silos,
            s.all_active_s,
            s.all_active_s / reference.all_active_s,
            s.converged_s,
            s.wall_s,
            s.full_reads_per_join,
            s.delta_reads_per_join,
            s.writes_per_join,
            s.calls_per_join,
            s.calls_per_join / reference.calls_per_join,
            (s.silos as f64).log2() / 10f64.log2(),
            s.conflicts_per_commit,
            s.quiet_calls_per_silo_min,
            s.client_cpu_share
                .map_or_else(|| "-".to_owned(), |c| format!("{:.0}%", c * 100.0)),
            if s.all_agree { "yes" } else { "**no**" },
        );
    }
    let goal = storms
        .iter()
        .find(|s| s.store == "redis" && s.silos == 1000)
        .map_or_else(
            || "not run".to_owned(),
            |s| {
                if s.failed.is_some() {
                    "**missed** (the storm did not finish)".to_owned()
                } else {
                    format!(
                        "{:.1} s ({})",
                        s.all_active_s,
                        if s.all_active_s < 60.0 {
                            "met"
                        } else {
                            "**missed**"
                        }
                    )
                }
            },
        );
    let _ = writeln!(
        md,
        "\nGoal: 1,000 silos all Active in < 60 s on one real Redis: {goal}."
    );
    // Calls per join of the largest storm of each store against log N.
    let mut growth = Vec::new();
    for store in ["memory", "redis"] {
        let done = |s: &&Storm| s.store == store && s.failed.is_none();
        let (Some(reference), Some(largest)) = (
            storms.iter().filter(done).find(|s| s.silos == 10),
            storms.iter().filter(done).max_by_key(|s| s.silos),
        ) else {
            continue;
        };
        if largest.silos <= 10 {
            continue;
        }
        let ratio = largest.calls_per_join / reference.calls_per_join.max(1e-9);
        let log = (largest.silos as f64).log2() / 10f64.log2();
        growth.push(format!(
            "{store} at {} silos {ratio:.2}x the 10-silo storm (log2 N / log2 10 = {log:.2}; {:.2} of it)",
            largest.silos,
            ratio / log
        ));
    }
    if !growth.is_empty() {
        let _ = writeln!(
            md,
            "Goal: table calls per join growing at most ~log N: {}.",
            growth.join("; ")
        );
    }
    if storms.iter().any(|s| s.silos >= 10_000) {
        let _ = writeln!(
            md,
            "\nStorms of 10,000 silos are not part of `all` (about 12 minutes of one core and \
             12 GB for the simulated silos): `rollcall-bench j1 --silos 10,100,1000,10000`."
        );
    }
    md
}

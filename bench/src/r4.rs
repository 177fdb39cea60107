//! R4: what one membership change costs the reminder service. `silos` silos on
//! real TCP (fast profile) share one reminder table of `count` reminders, of
//! which `probes` tick every second (the rest every 10 minutes); then one silo
//! joins, one leaves gracefully and one is killed, each after the cluster
//! settled from the one before. Per change: the store calls made until every
//! reminder is held again (lease reads and compare-and-sets, reminder row reads
//! and the rows they returned, membership calls), less what the same span costs
//! a quiet cluster; and the pause of the probe reminders that changed silo:
//! the longest gap between two of their delivered ticks around the change, less
//! the period (p50 and p99 over them).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall_membership_core::{
    ClusterMembershipOptions, OnDeclaredDead, ReminderEntry, ReminderOptions, Silo, SiloAddress, SiloHandle,
    SystemStore, Timestamp,
};
use rollcall_tests::counting::CountingStore;
use serde::Serialize;

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
}

/// (actor, scheduled ms, delivering silo, delivered at).
type Log = Arc<Mutex<Vec<(String, u64, SiloAddress, Instant)>>>;

/// Records the probes' ticks with the silo that delivered them.
struct Sink(Log, SiloAddress);

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
                self.1,
                Instant::now(),
            ));
        }
    }
}

struct Member {
    silo: SiloHandle,
    reminders: Reminders,
}

async fn member(store: &Arc<dyn SystemStore>, id: &str, shards: u32, log: &Log) -> anyhow::Result<Member> {
    let silo = Silo::builder(store.clone(), id.to_owned())
        .options(ClusterMembershipOptions::fast())
        .on_declared_dead(OnDeclaredDead::StopSilo)
        .start()
        .await?;
    let sink = Sink(log.clone(), silo.address()).start().recipient();
    let options = ReminderOptions {
        startup_jitter: Duration::ZERO,
        allow_period_below_minimum: true,
        table_operation_timeout: Duration::from_secs(60),
        initialization_timeout: Duration::from_secs(300),
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

fn held(members: &[Member]) -> u64 {
    members.iter().map(|m| m.reminders.stats().scheduled).sum()
}

/// The most reminders one silo holds over the mean.
fn spread(members: &[Member]) -> f64 {
    let most = members
        .iter()
        .map(|m| m.reminders.stats().scheduled)
        .max()
        .unwrap_or(0);
    most as f64 * members.len().max(1) as f64 / held(members).max(1) as f64
}

/// Waits until every reminder is held once and no lease was written for 1 s
/// (a handoff in flight holds some twice or not at all); the time from `since`
/// to the last change.
async fn settle(
    members: &[Member],
    n: u64,
    since: Instant,
    counts: &rollcall_tests::counting::ReminderCounts,
) -> anyhow::Result<Duration> {
    // The change itself (a join's start, a leave's shutdown) ran until now.
    let (mut last_change, mut last_writes) = (Instant::now(), counts.snapshot()[1]);
    loop {
        if since.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("not settled within 300 s: {} of {n} held", held(members));
        }
        let writes = counts.snapshot()[1];
        if held(members) != n || writes != last_writes {
            (last_change, last_writes) = (Instant::now(), writes);
        } else if last_change.elapsed() >= Duration::from_secs(1) {
            return Ok(last_change.duration_since(since));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Per probe that another silo delivers at the end: the longest gap between
/// two consecutive delivered ticks within `at - 2 s ..= until`, less the period.
fn pauses(log: &Log, at: Instant, until: Instant) -> Vec<u64> {
    let log = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut by_probe: BTreeMap<&str, Vec<(u64, SiloAddress, Instant)>> = BTreeMap::new();
    for (actor, scheduled, silo, t) in log.iter() {
        by_probe.entry(actor).or_default().push((*scheduled, *silo, *t));
    }
    let from = at.checked_sub(Duration::from_secs(2)).unwrap_or(at);
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
            .map(|w| w[1].2.duration_since(w[0].2))
            .max()
            .unwrap_or_default();
        out.push(gap.saturating_sub(Duration::from_secs(1)).as_millis() as u64);
    }
    out.sort_unstable();
    out
}

async fn once(provider: &str, silos: usize, shards: u32, args: &Args) -> anyhow::Result<Vec<Change>> {
    let (inner, _backend) = crate::r1::store_for(provider).await?;
    let counting = CountingStore::new(inner);
    let (counts, membership) = (counting.reminder_counts.clone(), counting.counts.clone());
    let store: Arc<dyn SystemStore> = Arc::new(counting);
    let id = rollcall_tests::unique_id("r4");
    // The shard count first: it places the rows the table writes (Redis).
    rollcall_membership_core::lease::ShardLeases::open(store.lease_table(&id)?, shards).await?;
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
    let log: Log = Arc::default();
    let snap = |c: &rollcall_tests::counting::ReminderCounts, m: &rollcall_tests::counting::Counts| {
        let r = c.snapshot();
        [r[0], r[1], r[2], r[3], m.snapshot().calls()]
    };
    let row = |kind: &str, took: Duration, calls: [i64; 5], p: &[u64], members: &[Member]| Change {
        provider: provider.to_owned(),
        silos,
        shards,
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
        spread: spread(members),
    };
    let (before, at) = (snap(&counts, &membership), Instant::now());
    let mut members = Vec::new();
    for _ in 0..silos {
        members.push(member(&store, &id, shards, &log).await?);
    }
    let took = settle(&members, n, at, &counts).await?;
    let after = snap(&counts, &membership);
    let start = row(
        "start",
        took,
        std::array::from_fn(|i| (after[i] - before[i]) as i64),
        &[],
        &members,
    );
    eprintln!("{start:?}");
    let mut out = vec![start];

    // What a quiet cluster costs per second (self-confirmations, polls, probes).
    let (q0, quiet_from) = (snap(&counts, &membership), Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let q1 = snap(&counts, &membership);
    let quiet_s = quiet_from.elapsed().as_secs_f64();
    let rate: Vec<f64> = (0..5).map(|i| (q1[i] - q0[i]) as f64 / quiet_s).collect();

    for kind in ["join", "leave", "crash"] {
        let before = snap(&counts, &membership);
        let at = Instant::now();
        match kind {
            "join" => members.push(member(&store, &id, shards, &log).await?),
            "leave" => {
                let m = members.remove(0);
                m.silo.shutdown().await?;
            }
            _ => {
                let m = members.remove(0);
                m.silo.kill();
            }
        }
        let took = settle(&members, n, at, &counts).await?;
        let span = at.elapsed();
        let after = snap(&counts, &membership);
        // The moved probes tick on their new silos (after a crash, once the
        // takeover's fence passed).
        tokio::time::sleep(Duration::from_secs(4)).await;
        let net = |i: usize| (after[i] - before[i]) as i64 - (rate[i] * span.as_secs_f64()).round() as i64;
        let p = pauses(&log, at, Instant::now());
        let change = row(kind, took, std::array::from_fn(net), &p, &members);
        eprintln!("{change:?}");
        out.push(change);
    }
    for m in &members {
        m.silo.kill();
    }
    Ok(out)
}

/// Runs R4 (each cluster in its own actix `System` on its own thread) and adds
/// its section to the Markdown report and its key to the JSON report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for provider in &args.providers {
        for &silos in &args.silos {
            for &shards in &args.shards {
                let (p, a) = (provider.clone(), args.clone());
                let changes = crate::on_own_thread(format!("R4 {provider} {silos} {shards}"), move || {
                    actix::System::new().block_on(async move { once(&p, silos, shards, &a).await })
                })?;
                rows.extend(changes);
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
         `silos` silos on real TCP (fast profile) in one process share one reminder table of {} \
         reminders (S shards, default reminder options otherwise), {} of which tick every second (the \
         probes) and the rest every 10 minutes. Then one silo joins, the oldest leaves gracefully \
         (`shutdown`), and the next oldest is killed, each once the cluster settled (every \
         reminder held once and no lease written for 1 s; settled s is the time to the last \
         change). Store calls: from the change until it settled, less what \
         a quiet span of the same length costs (self-confirmations, lease polls, probes), \
         counted by a wrapper around the real store. Pause: for each probe another silo \
         delivers after the change, the longest gap between two of its delivered ticks around \
         the change, less its 1-s period. A crash's pause includes detection and the lease \
         period; the missed-tick policy (`Skip`) drops what fell due meanwhile. The `start` row \
         is the cluster's first start (every silo joins and loads its shards; its store calls \
         are not net of a quiet span). Spread: once settled, the most reminders one silo holds \
         over the mean.\n",
        args.count, args.probes
    );
    let _ = writeln!(
        md,
        "| provider | silos | S | change | settled s | lease reads | lease CAS | row reads | rows read | membership calls | probes moved | pause p50 / p99 ms | spread |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} / {} | {:.2} |",
            r.provider,
            r.silos,
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

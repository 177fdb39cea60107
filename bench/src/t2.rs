//! T2: version-row contention. W writers each update their own row of one
//! membership table in a loop (`read_row` for the row's etag and the version,
//! then `update_row` at the next version); every commit bumps the one version row,
//! so the writers conflict on it although their rows are distinct. Reported per
//! provider and writer count: committed writes per second and conflicts per
//! commit, relative to 1 writer measured in the same run.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_core::protocol::backoff_delay;
use rollcall_core::protocol::machine::{BACKOFF_BASE, BACKOFF_CAP};
use rollcall_core::{MembershipRow, MembershipTable, ProtocolMode};
use serde::Serialize;

const BARE: &str = "bare loop";
const BACKOFF: &str = "silo backoff";
const JOINS: &str = "silo joins";

/// Options of `t2`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers (memory, redis, etcd).
    #[arg(long, value_delimiter = ',', default_value = "memory,redis,etcd")]
    providers: Vec<String>,
    /// Writer counts (1 is the reference and is always run first).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    writers: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// The reports to add the T2 section and the `t2` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One provider at one writer count.
#[derive(Clone, Debug, Serialize)]
pub struct Contention {
    provider: String,
    /// "bare loop"; "silo backoff": after a conflict a writer waits as a silo's
    /// write job does (`protocol::backoff_delay` with the machine's `BACKOFF_BASE`
    /// and `BACKOFF_CAP`, full jitter), and starts again at attempt 0 after a
    /// commit; or "silo joins": W real silos join at once, so the writes go
    /// through the silos' own write jobs (two commits per join).
    mode: String,
    writers: usize,
    commits_per_s: f64,
    conflicts_per_commit: f64,
    /// `commits_per_s` over the 1-writer figure of the same provider and run.
    vs_one_writer: f64,
}

/// Starts `writers` real silos at once on the simulated network over the store
/// at `url` (each in the same new cluster) and counts the writes their joins made
/// through the silos' own write jobs: every join commits its Joining row and its
/// Active row, retrying conflicts after the machine's backoff. Returns commits per
/// second (launch until the last join returned) and conflicts per commit.
fn measure_joins(url: String, writers: usize, seed: u64) -> anyhow::Result<(f64, f64)> {
    crate::on_own_thread(format!("T2 joins of {writers}"), move || {
        actix::System::new().block_on(async move {
            let store = rollcall::connect(&url).await?;
            let options = rollcall_core::ClusterMembershipOptions::default();
            let c = crate::j1::storm(store, Duration::ZERO, writers, &options, seed).await?;
            for s in &c.silos {
                s.kill();
            }
            let commits = c.storm.commits() as f64;
            Ok((
                commits / c.all_active.as_secs_f64().max(1e-9),
                c.storm.conflicts as f64 / commits.max(1.0),
            ))
        })
    })
}

async fn measure(
    table: Arc<dyn MembershipTable>,
    writers: usize,
    seconds: f64,
    backoff: bool,
) -> anyhow::Result<(f64, f64)> {
    let (commits, conflicts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut entries = Vec::new();
    for w in 0..writers {
        let e = rollcall_tests::membership_table::full_entry(w as u32);
        let v = table.read_row(&e.silo).await?.version;
        anyhow::ensure!(table.insert_row(&e, &v.next()).await?, "setup insert");
        entries.push(e);
    }
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut e in entries {
        let (table, commits, conflicts) = (table.clone(), commits.clone(), conflicts.clone());
        tasks.push(tokio::spawn(async move {
            let mut attempt = 0u32;
            while Instant::now() < until {
                let snap = table.read_row(&e.silo).await?;
                let Some((_, etag)) = snap.row(&e.silo).cloned().map(MembershipRow::into_parts) else {
                    anyhow::bail!("row gone");
                };
                e.proxy_port = e.proxy_port.wrapping_add(1);
                if table.update_row(&e, &etag, &snap.version.next()).await? {
                    commits.fetch_add(1, Ordering::Relaxed);
                    attempt = 0;
                } else {
                    conflicts.fetch_add(1, Ordering::Relaxed);
                    if backoff {
                        attempt += 1;
                        let delay = backoff_delay(attempt, BACKOFF_BASE, BACKOFF_CAP, rand::random());
                        tokio::time::sleep(delay.min(until.saturating_duration_since(Instant::now()))).await;
                    }
                }
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    let (c, x) = (
        commits.load(Ordering::Relaxed) as f64,
        conflicts.load(Ordering::Relaxed) as f64,
    );
    Ok((c / wall, x / c.max(1.0)))
}

/// Runs T2 and adds its section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let rows = rt.block_on(async {
        let mut rows = Vec::new();
        for provider in &args.providers {
            let (store, endpoint, _url, _guard) = crate::t1::open(provider).await?;
            let mut writers: Vec<usize> = vec![1];
            writers.extend(args.writers.iter().copied().filter(|&w| w > 1));
            for mode in [BARE, BACKOFF, JOINS] {
                let mut one = None;
                for &w in &writers {
                    let (rate, conflicts) = if mode == JOINS {
                        let url = crate::t1::store_url(provider, &endpoint);
                        let seed = 7 + w as u64;
                        tokio::task::spawn_blocking(move || measure_joins(url, w, seed)).await??
                    } else {
                        let id = rollcall_tests::unique_id(&format!("t2-{provider}-{w}"));
                        let table = store.membership_table(&id, ProtocolMode::Extended)?;
                        table.init(true).await?;
                        measure(table, w, args.seconds, mode == BACKOFF).await?
                    };
                    let base = *one.get_or_insert(rate);
                    let row = Contention {
                        provider: provider.clone(),
                        mode: mode.to_owned(),
                        writers: w,
                        commits_per_s: rate,
                        conflicts_per_commit: conflicts,
                        vs_one_writer: rate / base,
                    };
                    eprintln!("{row:?}");
                    rows.push(row);
                }
            }
        }
        anyhow::Ok(rows)
    })?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## T2: version-row contention\n\n\
         W writers each update their own row of one table in a loop (`read_row`, then \
         `update_row` at the next version), {s} s per measurement; every commit bumps the \
         shared version row, so distinct rows still conflict. *Bare loop*: no pause; \
         *silo backoff*: after a conflict the writer waits as a silo's write job does \
         (`protocol::backoff_delay`, full jitter from 10 ms doubling to 2 s), the policy \
         with the real function and constants; *silo joins*: W real silos (actix agents, \
         the protocol machine, its write jobs and their backoff, on the simulated network \
         in real time) start at once on one cluster of the provider, and each join commits \
         its Joining and its Active row; commits/s runs from the launch until the last \
         join returned: a one-shot burst whose rate is set by its tail (the last joiner's \
         backoff and connectivity check), not a sustained rate like the loops'. Ratios are against \
         1 writer on the same provider and mode in the same run. Goal (for the silo's \
         path): ≥ 0.5 × 1 writer at 64 writers.\n\n\
         | provider | mode | writers | commits/s | × 1 writer | conflicts/commit |\n|---|---|---|---|---|---|",
        s = args.seconds
    );
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} |",
            r.provider, r.mode, r.writers, r.commits_per_s, r.vs_one_writer, r.conflicts_per_commit
        );
    }
    args.reports
        .add(("## T2", &md), ("t2", serde_json::to_value(&rows)?))
}

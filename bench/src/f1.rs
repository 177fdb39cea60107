//! F1: the footprint of an idle silo. N silos (default options, real TCP, a real
//! redis-server) run as N processes of this binary; once all are Active, each is
//! watched for a while: resident memory, CPU time, and the table commands the
//! cluster sends to Redis per silo per second. The reference, in the same run, is a
//! process of the same binary with the same runtime and an open store but no silo:
//! what the silo itself costs is the difference.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rollcall_core::{OnDeclaredDead, ProtocolMode, Silo, SiloStatus};
use serde::Serialize;

/// Options of `f1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Silos in the cluster.
    #[arg(long, default_value_t = 5)]
    silos: usize,
    /// Seconds each process is watched once every silo is Active.
    /// (60 s covers one periodic full read, `table_refresh_timeout`, and two
    /// IAmAlive writes of each silo.)
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// The reports to add the F1 section and the `f1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// The figures of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Footprint {
    silos: usize,
    seconds: f64,
    /// Resident memory of a silo process, MiB (mean over the silos).
    silo_rss_mib: f64,
    /// Resident memory of the reference process (runtime and store, no silo), MiB.
    reference_rss_mib: f64,
    /// CPU time of a silo process over wall time, percent of one core (mean).
    silo_cpu_percent: f64,
    /// The same for the reference process.
    reference_cpu_percent: f64,
    /// Redis commands per second per silo while idle (every command the server
    /// processed, those run inside Lua scripts included, divided by the silos).
    table_commands_per_s_per_silo: f64,
    /// Table operations per second per silo while idle: the scripts (reads,
    /// IAmAlive) and transactions (writes) Redis ran, divided by the silos.
    table_operations_per_s_per_silo: f64,
}

/// The child processes: `footprint-silo` runs one silo, `footprint-reference` only
/// opens the store; both print `ready` and run until killed.
pub fn child(role: &str, store: &str, cluster: &str) -> anyhow::Result<()> {
    actix::System::new().block_on(async {
        let store = rollcall::connect(store).await?;
        let _silo = if role == "silo" {
            Some(
                Silo::builder(store.clone(), cluster)
                    .on_declared_dead(OnDeclaredDead::StopSilo)
                    .start()
                    .await?,
            )
        } else {
            None
        };
        println!("ready");
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// Kills the children when dropped (also on an error path).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(role: &str, store: &str, cluster: &str) -> anyhow::Result<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "footprint-child",
            "--role",
            role,
            "--store",
            store,
            "--cluster",
            cluster,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let out = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    anyhow::ensure!(line.trim() == "ready", "footprint child ({role}) did not start");
    Ok(child)
}

/// User + system CPU time of `pid`, seconds (from `/proc/<pid>/stat`, in clock
/// ticks of 1/100 s, Linux's `USER_HZ`).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("bad /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ")".
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Resident memory of `pid`, MiB (`VmRSS` of `/proc/<pid>/status`).
fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))?
        .parse()?;
    Ok(kib / 1024.0)
}

/// (Every command Redis processed, the table operations among them: `EVALSHA`,
/// `EVAL` and `EXEC` calls.)
async fn commands_processed(con: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(f64, f64)> {
    let info: String = redis::cmd("INFO").arg("all").query_async(con).await?;
    let total = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .ok_or_else(|| anyhow::anyhow!("no total_commands_processed"))?
        .trim()
        .parse()?;
    // `cmdstat_evalsha:calls=7,usec=...`
    let calls = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    Ok((total, calls("evalsha") + calls("eval") + calls("exec")))
}

async fn measure(args: &Args) -> anyhow::Result<Footprint> {
    let backend = rollcall_tests::fixtures::redis()
        .await
        .ok_or_else(|| anyhow::anyhow!("no redis-server"))?;
    let url = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("f1");
    let mut children = Children(Vec::new());
    children.0.push(spawn("reference", &url, &cluster)?);
    for _ in 0..args.silos {
        children.0.push(spawn("silo", &url, &cluster)?);
    }
    let store = rollcall::connect(&url).await?;
    let table = store.membership_table(&cluster, ProtocolMode::Extended)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let snap = table.read_all().await?;
        if snap.active().count() == args.silos {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the silos did not all become Active"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the joins' gossip and first refreshes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut con = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<anyhow::Result<_>>()?;
    let (cmds0, ops0) = commands_processed(&mut con).await?;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    let (cmds1, ops1) = commands_processed(&mut con).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu1: Vec<f64> = pids
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<anyhow::Result<_>>()?;
    let rss: Vec<f64> = pids.iter().map(|&p| rss_mib(p)).collect::<anyhow::Result<_>>()?;
    let snap = table.read_all().await?;
    anyhow::ensure!(
        snap.rows().all(|e| e.status == SiloStatus::Active),
        "a silo left while idle"
    );
    let cpu_pct = |i: usize| (cpu1[i] - cpu0[i]) / wall * 100.0;
    let n = args.silos as f64;
    Ok(Footprint {
        silos: args.silos,
        seconds: wall,
        silo_rss_mib: rss[1..].iter().sum::<f64>() / n,
        reference_rss_mib: rss[0],
        silo_cpu_percent: (1..pids.len()).map(cpu_pct).sum::<f64>() / n,
        reference_cpu_percent: cpu_pct(0),
        // One INFO of ours is inside the window.
        table_commands_per_s_per_silo: (cmds1 - cmds0 - 1.0).max(0.0) / wall / n,
        table_operations_per_s_per_silo: (ops1 - ops0) / wall / n,
    })
}

/// Runs F1 and adds its section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let f = rt.block_on(measure(&args))?;
    eprintln!("{f:?}");
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## F1: footprint of an idle silo\n\n\
         {n} silos with default options, each its own process of the bench binary, on real \
         TCP and one redis-server; watched for {s:.0} s once all are Active. The reference is \
         a process of the same binary with the same runtime and an open store but no silo, \
         measured in the same run. RSS from `/proc/<pid>/status`, CPU from `/proc/<pid>/stat`; \
         per silo: the table operations (scripts and transactions Redis ran) and every \
         command Redis processed, those inside scripts included.\n\n\
         | | RSS MiB | CPU % of a core | table operations/s | Redis commands/s |\n|---|---|---|---|---|\n\
         | idle silo (mean of {n}) | {sr:.1} | {sc:.2} | {to:.3} | {tc:.3} |\n\
         | reference (no silo) | {rr:.1} | {rc:.2} | - | - |\n\
         | silo - reference | {dr:.1} | {dc:.2} | | |\n",
        n = f.silos,
        s = f.seconds,
        sr = f.silo_rss_mib,
        sc = f.silo_cpu_percent,
        tc = f.table_commands_per_s_per_silo,
        to = f.table_operations_per_s_per_silo,
        rr = f.reference_rss_mib,
        rc = f.reference_cpu_percent,
        dr = f.silo_rss_mib - f.reference_rss_mib,
        dc = f.silo_cpu_percent - f.reference_cpu_percent,
    );
    args.reports
        .add(("## F1", &md), ("f1", serde_json::to_value(&f)?))
}

//! The process harness of the tests that run `backlog-silo` processes on
//! one real store (`handoff_load.rs`, `liveness_load.rs`): starting them,
//! signals, their tick logs, bursts of one-shots written ahead.

#![allow(dead_code)] // each test binary uses its own part of it

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rollcall_core::lease::ShardLeases;
use rollcall_tests::fixtures::free_port;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The shard count of the test services (`BACKLOG_SHARDS`).
pub const SHARDS: u32 = 8;

/// One `backlog-silo` process, its tick log and what it printed after `ready`.
pub struct Proc {
    pub child: Child,
    pub address: String,
    pub log: PathBuf,
    pub stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// What a burst registers (one-shots of shard 0's actors), how the handlers
/// run, and when the holder leaves.
pub struct Burst {
    pub count: usize,
    pub id_bytes: usize,
    pub due: Duration,
    pub spread: Duration,
    /// How long a handler takes, ms.
    pub handler_ms: u64,
    /// Ticks delivered at once per silo (`None`: the default).
    pub max_deliveries: Option<usize>,
    /// The holder stops itself (gracefully, as on SIGTERM) once it has logged
    /// this many ticks.
    pub stop_after: usize,
    /// Periodic reminders of this period instead of one-shots (only their
    /// first occurrence, about the same for all, is checked).
    pub period: Option<Duration>,
    /// The one-shots are written to the reminder table before any silo starts
    /// (as reminders registered long before their common due time), instead
    /// of registered by the second silo through its service.
    pub written_before: bool,
    /// The silos reach the store through a proxy that adds this much
    /// latency each way once both are up (`None`: directly).
    pub store_latency: Option<Duration>,
}

/// A [`DelayProxy`](rollcall_tests::delay::DelayProxy) in front of the
/// store at `store` (`redis://host:port` or `etcd://host:port`) and the URL
/// that reaches the store through it.
pub async fn delayed(store: &str) -> (rollcall_tests::delay::DelayProxy, String) {
    let (scheme, rest) = store.split_once("://").expect("scheme://host:port");
    let upstream: std::net::SocketAddr = rest.trim_end_matches('/').parse().expect("host:port");
    let proxy = rollcall_tests::delay::DelayProxy::start(upstream).await;
    let url = format!("{scheme}://{}", proxy.addr());
    (proxy, url)
}

/// Writes `burst`'s one-shots (`once` of each of shard 0's actors) to the
/// reminder table of service `cluster`, due `burst.due` from now, spread over
/// `burst.spread`, 64 writes at a time; the shard count recorded first.
pub async fn write_burst(store: &str, cluster: &str, burst: &Burst) {
    use futures_util::StreamExt;
    let conn = rollcall::connect(store).await.expect("connect");
    ShardLeases::open(conn.lease_table(cluster).expect("lease table"), SHARDS)
        .await
        .expect("the shard count recorded");
    let table = conn.reminder_table(cluster).expect("reminder table");
    let base = rollcall::Timestamp::now().as_millis() + burst.due.as_millis() as u64;
    let spread = burst.spread.as_millis() as u64;
    let actors = rollcall_tests::silo_process::shard_zero_actors(burst.count, burst.id_bytes, SHARDS);
    let count = actors.len() as u64;
    let written = futures_util::stream::iter(actors.into_iter().enumerate())
        .map(|(i, actor)| {
            let table = table.clone();
            let at = rollcall::Timestamp::from_millis(base + i as u64 * spread / count.max(1));
            async move {
                let entry = rollcall_core::ReminderEntry::new(cluster, actor, "once", at, None);
                table.upsert_row(&entry).await
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    for w in written {
        w.expect("a burst row written");
    }
}

/// Starts a `backlog-silo` with `env` and waits (at most 180 s, plus the
/// burst's due time: it registers the burst first) until it prints `ready`.
pub async fn start(
    cluster: &str,
    store: &str,
    dir: &Path,
    name: &str,
    env: &[(&str, String)],
    burst: Option<&Burst>,
) -> Proc {
    let listen = format!("127.0.0.1:{}", free_port().expect("free port"));
    let log = dir.join(format!("ticks-{name}.log"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_backlog-silo"));
    cmd.arg(cluster)
        .arg(store)
        .arg(&listen)
        .arg(&log)
        .env("BACKLOG_SHARDS", SHARDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(b) = burst {
        cmd.arg(b.count.to_string())
            .arg(b.id_bytes.to_string())
            .arg(b.due.as_millis().to_string())
            .arg(b.spread.as_millis().to_string());
    }
    let mut child = cmd.spawn().expect("spawn backlog-silo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    // Registering a burst takes a while under load (20,000 one-shots beside a
    // loaded container pass took over 75 s, once over 195 s, before the
    // mass-due test wrote its rows itself); it is due after that.
    let ready_within = Duration::from_secs(180) + burst.map_or(Duration::ZERO, |b| b.due);
    let address = tokio::time::timeout(ready_within, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(a) = line.strip_prefix("ready ") {
                return Some(a.to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("backlog-silo {name} did not get ready"));
    let stdout = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = stdout.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            keep.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(line);
        }
    });
    Proc {
        child,
        address,
        log,
        stdout,
    }
}

pub fn sigterm(p: &Proc) {
    signal(p, "-TERM");
}

pub fn signal(p: &Proc, which: &str) {
    let pid = p.child.id().expect("running");
    let status = std::process::Command::new("kill")
        .arg(which)
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("kill {which}: {e}"));
    assert!(status.success());
}

pub async fn exits(p: &mut Proc, within: Duration) {
    let status = tokio::time::timeout(within, p.child.wait())
        .await
        .unwrap_or_else(|_| panic!("{} did not exit within {within:?} of its stop", p.address))
        .expect("wait");
    assert!(status.success(), "{} exited with {status}", p.address);
}

/// SIGTERM to every process, then each must exit 0 within 30 s.
pub async fn stop_all(procs: &mut [Proc]) {
    for p in procs.iter() {
        sigterm(p);
    }
    for p in procs.iter_mut() {
        exits(p, Duration::from_secs(30)).await;
    }
}

/// Every tick line of the logs: (actor, name, scheduled) to the silos that ran it.
pub fn ticks(logs: &[&Path]) -> BTreeMap<(String, String, u64), Vec<String>> {
    let mut out: BTreeMap<_, Vec<String>> = BTreeMap::new();
    for log in logs {
        for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
            let f: Vec<&str> = line.split(' ').collect();
            // A line being written as we read has fewer fields: the next read has it.
            if f.len() == 5 {
                if let Ok(s) = f[2].parse() {
                    out.entry((f[0].to_owned(), f[1].to_owned(), s))
                        .or_default()
                        .push(f[4].to_owned());
                }
            }
        }
    }
    out
}

pub fn lines(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |t| t.lines().count())
}

/// Waits (polling every 50 ms, at most `within`) until `f` holds.
pub async fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! Reminders under churn across silo processes: 4 `churn-silo` processes on one
//! real store with 1-s reminders (half by period, half by a cron expression that
//! ticks every second, in a zone); the oldest process is stopped (SIGTERM: graceful
//! shutdown; or SIGKILL) and a fresh one started, round after round. Every tick the
//! processes delivered is logged; an occurrence is (actor, reminder, scheduled
//! time). Graceful churn must neither repeat nor lose an occurrence; crashes must
//! repeat none and lose only occurrences inside the failover window after a kill.
//!
//! CI runs a short version (4 rounds 6 s apart, 100 reminders);
//! `ROLLCALL_CHURN_FULL=1` runs the full one (8 rounds 15 s apart, 200 reminders),
//! whose figures are BENCHMARKS.md's R3. `ROLLCALL_CHURN_SILOS=n` runs `n`
//! processes instead of 4; `ROLLCALL_CHURN_ROLLING=1` is a rolling deploy: every
//! second a new process starts and, once it is ready, the oldest gets SIGTERM
//! without waiting for its exit (so handoffs overlap), until every process was
//! replaced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rollcall_membership_core::{Clock, SystemClock, Timestamp};
use rollcall_tests::fixtures::free_port;
use rollcall_tests::reminders::{churn_report, ChurnReport, Occurrence};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const PERIOD: Duration = Duration::from_secs(1);

/// The churn's shape.
struct Plan {
    silos: usize,
    rounds: usize,
    every: Duration,
    reminders: usize,
    /// Start the next process before the oldest has finished leaving.
    rolling: bool,
}

fn plan() -> Plan {
    let env = |k: &str| std::env::var(k).ok();
    let silos = env("ROLLCALL_CHURN_SILOS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let full = env("ROLLCALL_CHURN_FULL").is_some_and(|v| v == "1");
    let rolling = env("ROLLCALL_CHURN_ROLLING").is_some_and(|v| v == "1");
    let (rounds, every, reminders) = match (rolling, full) {
        (true, _) => (silos, Duration::from_secs(1), 200),
        (false, true) => (8, Duration::from_secs(15), 200),
        (false, false) => (4, Duration::from_secs(6), 100),
    };
    Plan {
        silos,
        rounds,
        every,
        reminders,
        rolling,
    }
}

/// How long after a kill its reminders may go undelivered with the fast profile:
/// detection (3 missed probes of 500 ms, two table writes and a gossip round: the
/// CLI tests' bound), the lease period a successor waits after it saw the
/// victim Dead, a lease poll, a load and one period.
fn failover_window() -> Duration {
    Duration::from_millis(3 * 500)
        + Duration::from_secs(3)
        + Duration::from_secs(1)
        + rollcall_reminders::ReminderOptions::default().lease_period
        + rollcall_reminders::ReminderOptions::default().lease_poll
        + PERIOD
        + Duration::from_secs(1)
}

/// Starts a `churn-silo` and waits (at most 60 s) until it prints `ready`.
async fn start(cluster: &str, store: &str, dir: &Path, n: usize, register: Option<usize>) -> Child {
    let listen = format!("127.0.0.1:{}", free_port().expect("free port"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_churn-silo"));
    cmd.arg(cluster)
        .arg(store)
        .arg(&listen)
        .arg(dir.join(format!("ticks-{n}.log")))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(count) = register {
        cmd.arg(count.to_string()).arg(dir.join("starts.txt"));
    }
    let mut child = cmd.spawn().expect("spawn churn-silo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("ready") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(ready, Ok(true)), "churn-silo {n} did not get ready");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

/// Stops a silo process: SIGTERM and wait for its exit (graceful), or SIGKILL.
async fn stop(child: &mut Child, graceful: bool) {
    if graceful {
        let pid = child.id().expect("running") as i32;
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let exited = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("a graceful shutdown ends within 60 s")
            .expect("wait");
        assert!(exited.success(), "churn-silo exited with {exited}");
    } else {
        child.start_kill().expect("SIGKILL");
        let _ = child.wait().await;
    }
}

fn read_lines(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect()
}

fn ms(s: &str) -> Timestamp {
    Timestamp::from_millis(s.parse().expect("ms"))
}

/// Runs the churn on `store` and reports it, with the kill (or stop) times.
async fn churn(store: &str, graceful: bool) -> (ChurnReport, Vec<Timestamp>) {
    let plan = plan();
    // Unique per run, not per process: `cargo test` runs the Redis and etcd churns
    // as threads of one process, and a name from the process id alone made them
    // share (and remove) one log directory.
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let cluster = format!(
        "churn-{}-{}-{}-{}",
        if graceful { "term" } else { "kill" },
        store.split(':').next().unwrap_or("store"),
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let dir: PathBuf = std::env::temp_dir().join(&cluster);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let clock = SystemClock;
    let mut running = std::collections::VecDeque::new();
    for n in 0..plan.silos {
        let register = (n + 1 == plan.silos).then_some(plan.reminders);
        running.push_back(start(&cluster, store, &dir, n, register).await);
    }
    let starts: BTreeMap<(String, String), Timestamp> = read_lines(&dir.join("starts.txt"))
        .into_iter()
        .map(|l| ((l[0].clone(), l[1].clone()), ms(&l[2])))
        .collect();
    assert_eq!(starts.len(), plan.reminders);
    let from = starts.values().max().copied().expect("starts");
    let mut stops = Vec::new();
    let mut leaving = Vec::new();
    for round in 0..plan.rounds {
        tokio::time::sleep(plan.every).await;
        if plan.rolling {
            // The new process first; the old one leaves while the next starts.
            running.push_back(start(&cluster, store, &dir, plan.silos + round, None).await);
            let mut oldest = running.pop_front().expect("a running silo");
            stops.push(clock.now());
            leaving.push(tokio::spawn(async move { stop(&mut oldest, graceful).await }));
        } else {
            let mut oldest = running.pop_front().expect("a running silo");
            stops.push(clock.now());
            stop(&mut oldest, graceful).await;
            running.push_back(start(&cluster, store, &dir, plan.silos + round, None).await);
        }
    }
    for l in leaving {
        l.await.expect("a leave");
    }
    tokio::time::sleep(plan.every.max(Duration::from_secs(6))).await;
    let to = clock.now().saturating_sub(Duration::from_secs(2));
    for mut child in running {
        stop(&mut child, true).await;
    }
    let mut ticks = Vec::new();
    for n in 0..plan.silos + plan.rounds {
        for l in read_lines(&dir.join(format!("ticks-{n}.log"))) {
            ticks.push(Occurrence {
                reminder: (l[0].clone(), l[1].clone()),
                scheduled: ms(&l[2]),
                at: ms(&l[3]),
            });
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    (churn_report(&starts, PERIOD, from, to, &ticks), stops)
}

async fn graceful_churn_repeats_and_loses_nothing(store: &str) {
    let (report, _) = churn(store, true).await;
    println!("graceful churn on {store}: {report}");
    assert!(report.occurrences > 0);
    report.assert_none_repeated_or_lost();
}

async fn crashes_repeat_nothing_and_lose_only_in_the_failover_window(store: &str) {
    let (report, kills) = churn(store, false).await;
    println!("crash churn on {store}: {report}");
    report.assert_no_duplicates();
    // The window opens one period before the kill: the victim's last occurrence
    // may have been due and not yet handled when it died.
    let window = failover_window();
    for (key, t) in &report.missed {
        assert!(
            kills
                .iter()
                .any(|k| { *t >= k.saturating_sub(PERIOD) && t.saturating_duration_since(*k) <= window }),
            "{key:?} missed {t}, outside every failover window of {window:?} ({report})"
        );
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    async fn store() -> Option<(rollcall_tests::fixtures::Backend, String)> {
        let backend = rollcall_tests::fixtures::redis().await?;
        let url = backend.endpoint.clone();
        Some((backend, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn graceful_churn_on_redis_repeats_and_loses_no_tick() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        graceful_churn_repeats_and_loses_nothing(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_churn_on_redis_repeats_no_tick_and_loses_only_in_failover_windows() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        crashes_repeat_nothing_and_lose_only_in_the_failover_window(&url).await;
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;

    async fn store() -> Option<(rollcall_tests::fixtures::Backend, String)> {
        let backend = rollcall_tests::fixtures::etcd().await?;
        let url = format!("etcd://{}", backend.endpoint);
        Some((backend, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn graceful_churn_on_etcd_repeats_and_loses_no_tick() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        graceful_churn_repeats_and_loses_nothing(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_churn_on_etcd_repeats_no_tick_and_loses_only_in_failover_windows() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        crashes_repeat_nothing_and_lose_only_in_the_failover_window(&url).await;
    }
}

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

#![cfg(any(feature = "redis", feature = "etcd"))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rollcall_core::{Clock, SystemClock, Timestamp};
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
    let (child, mut lines) = spawn_silo(cluster, store, dir, n, register).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// Starts a `churn-silo` (stdin piped, for its commands) and waits (at most
/// 60 s) until it prints `ready`; the rest of its stdout.
async fn spawn_silo(
    cluster: &str,
    store: &str,
    dir: &Path,
    n: usize,
    register: Option<usize>,
) -> (Child, Lines) {
    let listen = format!("127.0.0.1:{}", free_port().expect("free port"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_churn-silo"));
    cmd.arg(cluster)
        .arg(store)
        .arg(&listen)
        .arg(dir.join(format!("ticks-{n}.log")))
        .stdin(Stdio::piped())
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
    (child, lines)
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
    let (report, stops, ()) = churn_with(store, graceful, plan(), |_| async {}).await;
    report.map(|r| (r, stops)).unwrap_or_else(|why| panic!("{why}"))
}

/// Runs the churn of `plan` on `store` while `during` (given the cluster id) runs
/// beside the rounds; reports it once both are over, with the stop times and
/// what `during` returned. A process that exits before it is stopped, or (in a
/// graceful churn) a silo row Dead with suspect votes at the end (declared Dead
/// by its peers), is an `Err` report.
async fn churn_with<T, F, Fut>(
    store: &str,
    graceful: bool,
    plan: Plan,
    during: F,
) -> (Result<ChurnReport, String>, Vec<Timestamp>, T)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = T>,
{
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
    let mut exited = Vec::new();
    let during = during(cluster.clone());
    let rounds = async {
        for round in 0..plan.rounds {
            tokio::time::sleep(plan.every).await;
            if plan.rolling {
                // The new process first; the old one leaves while the next starts.
                running.push_back(start(&cluster, store, &dir, plan.silos + round, None).await);
                let mut oldest = running.pop_front().expect("a running silo");
                if let Ok(Some(status)) = oldest.try_wait() {
                    exited.push(format!("a silo exited ({status}) before it was stopped"));
                }
                stops.push(clock.now());
                leaving.push(tokio::spawn(async move { stop(&mut oldest, graceful).await }));
            } else {
                let mut oldest = running.pop_front().expect("a running silo");
                if let Ok(Some(status)) = oldest.try_wait() {
                    exited.push(format!("a silo exited ({status}) before it was stopped"));
                }
                stops.push(clock.now());
                stop(&mut oldest, graceful).await;
                running.push_back(start(&cluster, store, &dir, plan.silos + round, None).await);
            }
        }
    };
    let ((), during) = tokio::join!(rounds, during);
    for l in leaving {
        l.await.expect("a leave");
    }
    tokio::time::sleep(plan.every.max(Duration::from_secs(6))).await;
    let to = clock.now().saturating_sub(Duration::from_secs(2));
    for mut child in running {
        if let Ok(Some(status)) = child.try_wait() {
            exited.push(format!("a silo exited ({status}) before it was stopped"));
        }
        stop(&mut child, true).await;
    }
    // A crash churn's victims are declared Dead by their peers, as they must be.
    let declared_dead = if graceful {
        declared_dead(store, &cluster).await
    } else {
        Vec::new()
    };
    let mut ticks = Vec::new();
    let mut by_silo = Vec::new();
    for n in 0..plan.silos + plan.rounds {
        for l in read_lines(&dir.join(format!("ticks-{n}.log"))) {
            ticks.push(Occurrence {
                reminder: (l[0].clone(), l[1].clone()),
                scheduled: ms(&l[2]),
                at: ms(&l[3]),
            });
            by_silo.push(n);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let report = churn_report(&starts, PERIOD, from, to, &ticks);
    // What a failure needs to be read: who delivered the first repeats, when,
    // and when each silo was stopped (silo `n` is stopped at `stops[n]`).
    for (key, at) in report.duplicates.iter().take(10) {
        let who: Vec<(usize, Timestamp)> = ticks
            .iter()
            .zip(&by_silo)
            .filter(|(t, _)| &t.reminder == key && t.scheduled == *at)
            .map(|(t, n)| (*n, t.at))
            .collect();
        eprintln!("repeated {key:?} due {at}: delivered by (silo, at) {who:?}; stops {stops:?}");
    }
    let verdict = if !exited.is_empty() {
        Err(format!("{}: {report}", exited.join("; ")))
    } else if !declared_dead.is_empty() {
        Err(format!(
            "silos declared Dead by their peers: {declared_dead:?}: {report}"
        ))
    } else {
        Ok(report)
    };
    (verdict, stops, during)
}

/// The silos of `cluster` whose rows are Dead with suspect votes: declared Dead
/// by their peers (a silo that leaves writes itself Dead without votes).
async fn declared_dead(store: &str, cluster: &str) -> Vec<String> {
    let store = rollcall::connect(store).await.expect("connect");
    let table = store
        .membership_table(cluster, rollcall_core::ProtocolMode::Extended)
        .expect("membership table");
    let snapshot = table.read_all().await.expect("read the membership table");
    snapshot
        .rows()
        .filter(|e| e.status == rollcall_core::SiloStatus::Dead && !e.suspect_votes.is_empty())
        .map(|e| e.silo.to_string())
        .collect()
}

async fn graceful_churn_repeats_and_loses_nothing(store: &str) {
    let (report, _) = churn(store, true).await;
    println!("graceful churn on {store}: {report}");
    assert!(report.occurrences > 0);
    report.assert_none_repeated_or_lost();
}

/// Crash churn with checkpoints (the default): nothing is lost, and the only
/// repeats are occurrences the victim delivered after its last checkpoint
/// (issue 70, item 2; before checkpoints nothing repeated and what fell due
/// in each failover window was skipped).
async fn crashes_lose_nothing_and_repeat_only_since_the_last_checkpoint(store: &str) {
    let (report, kills) = churn(store, false).await;
    println!("crash churn on {store}: {report}");
    report.assert_repeats_only_since_checkpoints(&kills, failover_window() + Duration::from_secs(2));
    assert!(
        report.missed.is_empty(),
        "{report}: {:?}",
        &report.missed[..report.missed.len().min(10)]
    );
}

/// A `churn-silo` that takes commands (`pause`, `resume`, `trigger`).
struct Controlled {
    child: Child,
    stdin: tokio::process::ChildStdin,
    lines: Lines,
}

impl Controlled {
    async fn start(cluster: &str, store: &str, dir: &Path, n: usize, register: Option<usize>) -> Controlled {
        let (mut child, lines) = spawn_silo(cluster, store, dir, n, register).await;
        let stdin = child.stdin.take().expect("stdin");
        Controlled { child, stdin, lines }
    }

    /// Sends `verb actor name` and returns the etag of its `ok` answer.
    async fn command(&mut self, verb: &str, actor: &str, name: &str) -> String {
        use tokio::io::AsyncWriteExt;
        let line = format!("{verb} {actor} {name}\n");
        self.stdin.write_all(line.as_bytes()).await.expect("command sent");
        let answer = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(l)) = self.lines.next_line().await {
                if l.starts_with("ok ") || l.starts_with("err ") {
                    return l;
                }
            }
            String::from("(stdout closed)")
        })
        .await
        .expect("a command answers within 20 s");
        let words: Vec<&str> = answer.split(' ').collect();
        assert_eq!(
            words[..4.min(words.len())],
            ["ok", verb, actor, name],
            "`{}` answered `{answer}`",
            line.trim()
        );
        words[4].to_owned()
    }
}

/// Every tick logged in `dir` by silos `0..n`: `(actor, scheduled, sent, etag)`.
fn logged_ticks(dir: &Path, n: usize) -> Vec<(String, Timestamp, Timestamp, String)> {
    (0..n)
        .flat_map(|i| read_lines(&dir.join(format!("ticks-{i}.log"))))
        .filter(|l| l.len() >= 6)
        .map(|l| (l[0].clone(), ms(&l[2]), ms(&l[3]), l[5].clone()))
        .collect()
}

/// Issue 58 item 1 across silo processes on a real store: 40 one-second
/// reminders on 3 silos; the even ones paused; 20 triggers sent while a silo
/// leaves gracefully (SIGTERM), a silo joins, 10 triggers sent just before a
/// silo is killed (SIGKILL), then the paused ones resumed. A paused reminder
/// delivers nothing on any silo (1 s of slack after its pause answered, for
/// the notice); each trigger sent around the graceful leave is delivered
/// exactly once, each sent before the kill at least once; every resumed
/// reminder ticks again; no periodic occurrence is delivered twice but what
/// the victim delivered after its last checkpoint. Last, a
/// bulk delete from outside the cluster (`tell_shard_holders`, as the CLI):
/// the deleted reminders stop within 1 s.
async fn pause_resume_and_trigger_through_a_leave_and_a_crash(store: &str) {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let cluster = format!(
        "pause-{}-{}-{}",
        store.split(':').next().unwrap_or("store"),
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let dir: PathBuf = std::env::temp_dir().join(&cluster);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let clock = SystemClock;
    let mut silos = Vec::new();
    for n in 0..3 {
        silos.push(Controlled::start(&cluster, store, &dir, n, (n == 2).then_some(40)).await);
    }
    let actors: Vec<String> = (0..40).map(|i| format!("cart/{i}")).collect();
    let all_ticked = |since: Timestamp, which: &[String]| {
        let ticks = logged_ticks(&dir, 4);
        which
            .iter()
            .all(|a| ticks.iter().any(|t| &t.0 == a && t.2 > since))
    };
    let waited =
        rollcall_tests::sim::wait_for(Duration::from_secs(20), || all_ticked(Timestamp::EPOCH, &actors));
    assert!(waited.await.is_some(), "every reminder ticks");

    let even: Vec<String> = actors.iter().step_by(2).cloned().collect();
    let mut paused_ok = BTreeMap::new();
    // Half through a silo's `Reminders::pause`, half as the CLI does it from
    // outside the cluster: the column written in the store, then the
    // holder told over its probe port (`tell_holder`).
    let outside = rollcall::connect(store).await.expect("connect");
    let table = outside.reminder_table(&cluster).expect("table");
    let transport = rollcall::transport::tcp::TcpTransport::new();
    for (i, a) in even.iter().enumerate() {
        if i % 2 == 0 {
            silos[2].command("pause", a, "tick").await;
        } else {
            let row = table.read_row(a, "tick").await.expect("read").expect("row");
            assert!(table
                .update_paused(a, "tick", &row.etag, Some(clock.now()))
                .await
                .expect("pause"));
            let told = rollcall_reminders::tell_holder(
                &*outside,
                &transport,
                &cluster,
                &cluster,
                a,
                "tick",
                Duration::from_secs(5),
            )
            .await
            .expect("told");
            assert!(
                matches!(told, rollcall_reminders::Told::Taken(_)),
                "{a}: {told:?}"
            );
        }
        paused_ok.insert(a.clone(), clock.now());
    }
    // Triggers beside a graceful leave.
    let (mut leaving, mut sender) = (silos.remove(0), silos.remove(0));
    let triggers = async {
        let mut etags = Vec::new();
        for a in &actors[..20] {
            etags.push(sender.command("trigger", a, "tick").await);
        }
        etags
    };
    let ((), graceful_triggers) = tokio::join!(stop(&mut leaving.child, true), triggers);
    silos.insert(0, sender);
    silos.push(Controlled::start(&cluster, store, &dir, 3, None).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Triggers just before a kill.
    let mut crash_triggers = Vec::new();
    for a in &actors[20..30] {
        crash_triggers.push(silos[2].command("trigger", a, "tick").await);
    }
    let mut victim = silos.remove(0);
    let killed_at = clock.now();
    stop(&mut victim.child, false).await;
    tokio::time::sleep(failover_window()).await;
    let mut resume_sent = BTreeMap::new();
    for a in &even {
        resume_sent.insert(a.clone(), clock.now());
        silos[1].command("resume", a, "tick").await;
    }
    let resumed_at = clock.now();
    // A trigger the victim held is delivered by its successor as a catch-up,
    // spread over `startup_jitter` (10 s) after the takeover's load.
    let every_trigger_delivered = || {
        let ticks = logged_ticks(&dir, 4);
        graceful_triggers
            .iter()
            .chain(&crash_triggers)
            .all(|e| ticks.iter().any(|t| &t.3 == e))
    };
    let waited = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        all_ticked(resumed_at, &even) && every_trigger_delivered()
    });
    let every_resumed_ticks = waited.await.is_some() || all_ticked(resumed_at, &even);
    // A bulk delete from outside the cluster (the CLI's way): `cart/3` and
    // `cart/30..39` removed, then the holders of their shards told.
    let deleted_at = clock.now();
    let mut hashes = std::collections::BTreeSet::new();
    let removed =
        rollcall::paging::remove_prefix(&*table, "cart/3", 100, 8, Duration::from_secs(5), &mut |r| {
            hashes.insert(r.hash);
        })
        .await
        .expect("bulk delete");
    let told = rollcall_reminders::tell_shard_holders(
        &*outside,
        &transport,
        &cluster,
        &cluster,
        hashes,
        Duration::from_secs(5),
    )
    .await
    .expect("told");
    // Three periods in which the deleted reminders must not tick.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mut s in silos {
        stop(&mut s.child, true).await;
    }
    let ticks = logged_ticks(&dir, 4);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(every_resumed_ticks, "every resumed reminder ticks again");
    assert!(removed.removed >= 11, "{removed:?}");
    assert!(told.taken >= 1 && told.failed == 0, "{told:?}");
    let after_delete: Vec<_> = ticks
        .iter()
        .filter(|t| t.0.starts_with("cart/3") && t.2 > deleted_at.saturating_add(Duration::from_secs(1)))
        .collect();
    assert!(
        after_delete.is_empty(),
        "deleted reminders ticked: {after_delete:?}"
    );

    let mut per_trigger: BTreeMap<&str, usize> = BTreeMap::new();
    let triggered: std::collections::BTreeSet<&str> = graceful_triggers
        .iter()
        .chain(&crash_triggers)
        .map(String::as_str)
        .collect();
    let mut periodic: BTreeMap<(&str, Timestamp), usize> = BTreeMap::new();
    for (actor, scheduled, sent, etag) in &ticks {
        if triggered.contains(etag.as_str()) {
            *per_trigger.entry(etag).or_default() += 1;
            continue;
        }
        *periodic.entry((actor, *scheduled)).or_default() += 1;
        if let (Some(p), Some(r)) = (paused_ok.get(actor), resume_sent.get(actor)) {
            assert!(
                *sent <= p.saturating_add(Duration::from_secs(1)) || sent >= r,
                "{actor} paused at {p} ticked at {sent} (resumed at {r})"
            );
        }
    }
    for e in &graceful_triggers {
        assert_eq!(per_trigger.get(e.as_str()), Some(&1), "trigger {e}: exactly once");
    }
    for e in &crash_triggers {
        assert!(
            per_trigger.get(e.as_str()).is_some_and(|n| *n >= 1),
            "trigger {e}: at least once"
        );
    }
    // The kill repeats only what the victim delivered after its last
    // checkpoint (issue 70, item 2).
    let twice: Vec<_> = periodic
        .iter()
        .filter(|((_, t), n)| **n > 1 && !rollcall_tests::reminders::checkpoint_repeat(killed_at, *t))
        .collect();
    assert!(
        twice.is_empty(),
        "periodic occurrences delivered twice outside the kill's checkpoint window: {twice:?}"
    );
    println!(
        "pause/resume/trigger on {store}: {} ticks, {} triggers delivered",
        ticks.len(),
        per_trigger.values().sum::<usize>()
    );
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
    async fn crash_churn_on_redis_loses_no_tick_and_repeats_only_since_checkpoints() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        crashes_lose_nothing_and_repeat_only_since_the_last_checkpoint(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pause_resume_and_trigger_on_redis_hold_through_a_leave_and_a_crash() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        pause_resume_and_trigger_through_a_leave_and_a_crash(&url).await;
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
    async fn crash_churn_on_etcd_loses_no_tick_and_repeats_only_since_checkpoints() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        crashes_lose_nothing_and_repeat_only_since_the_last_checkpoint(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pause_resume_and_trigger_on_etcd_hold_through_a_leave_and_a_crash() {
        let Some((_backend, url)) = store().await else {
            return;
        };
        pause_resume_and_trigger_through_a_leave_and_a_crash(&url).await;
    }
}

/// Replicated Redis failing over under a running cluster: 3 silo processes in
/// graceful churn (a round every 9 s), reminders ticking every second, and 32
/// writers incrementing 8 actor states with `update()`, while a primary is killed
/// twice (about 12 s and 36 s in) and its replica promoted, in a run of 63 s.
/// No silo may be declared Dead or exit; no tick may be delivered twice but
/// within one checkpoint interval before a silo stopped while no write could
/// be acknowledged (its releases could not land: `check`); ticks resume within [`failover::TICK_RESUME`] of each promotion; with
/// `wait_replicas=1` no acknowledged increment is lost (without it the losses
/// are printed: asynchronous replication may lose some).
#[cfg(feature = "redis")]
mod failover {
    use std::time::Instant;

    use rollcall_tests::replicated::{count_through, CounterReport, ReplicatedCluster, Sentinels};

    use super::*;

    /// How long after a promotion the ticks may still be paused: the holders'
    /// lease reads fail through the outage (a silo delivers only while it
    /// confirmed its row within `lease_period`), and resume at the next lease
    /// read that reaches the new primary (every `lease_period / 3`), a lease
    /// poll, and one period; plus 2 s for a slow machine.
    pub(super) const TICK_RESUME: Duration = Duration::from_secs(6);

    fn plan() -> Plan {
        // 6 rounds 9 s apart and the 9 s after them: 63 s from the first tick.
        Plan {
            silos: 3,
            rounds: 6,
            every: Duration::from_secs(9),
            reminders: 100,
            rolling: false,
        }
    }

    /// A kill: when the primary died, how long until its replica served, and how
    /// long until a replica was in sync again (the old primary back as one).
    type Kill = (Timestamp, Duration, Duration);

    /// The pauses the kills cause, from a kill until its replica is back plus
    /// [`TICK_RESUME`], merged where one starts before the last ended: each
    /// run's length.
    fn paused_runs(kills: &[Kill]) -> Vec<Duration> {
        let mut windows: Vec<(u64, u64)> = kills
            .iter()
            .map(|(at, _, back)| {
                let start = at.as_millis();
                (start, start + (*back + TICK_RESUME).as_millis() as u64)
            })
            .collect();
        windows.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (start, end) in windows {
            match runs.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => runs.push((start, end)),
            }
        }
        runs.into_iter()
            .map(|(start, end)| Duration::from_millis(end - start))
            .collect()
    }

    #[test]
    fn pauses_of_kills_that_follow_each_other_add_up() {
        let kill = |at_s: u64, back_s: u64| {
            (
                Timestamp::from_millis(at_s * 1000),
                Duration::ZERO,
                Duration::from_secs(back_s),
            )
        };
        let resume = TICK_RESUME.as_secs();
        // Apart: two runs of their own length.
        assert_eq!(
            paused_runs(&[kill(0, 10), kill(100, 12)]),
            [Duration::from_secs(10 + resume), Duration::from_secs(12 + resume)]
        );
        // The second before the first's pause ended (the failed run: back
        // after 20.4 s, the next kill at 24.2 s): one run to the second's end.
        assert_eq!(
            paused_runs(&[kill(24, 20), kill(0, 20)]),
            [Duration::from_secs(24 + 20 + resume)]
        );
    }

    /// With `wait_replicas`, asserts the run's promises; without it, prints what
    /// the failovers cost (asynchronous replication may lose acknowledged writes:
    /// a lost lease or membership write can repeat a tick or declare a silo Dead).
    ///
    /// A silo stopped (SIGTERM) while no write can be acknowledged (from a
    /// kill until its replica is back) cannot land its releases within its
    /// `shutdown_timeout`: its successors take its shards over from their
    /// last checkpoints, the one written at the stop where it landed (issue
    /// 70, item 2: "a release that did not land costs at most one
    /// checkpoint interval"). So an occurrence may repeat only when it fell
    /// due within one checkpoint interval before such a stop (and up to 2 s
    /// after it: the leave starts once the process handles the signal).
    /// Before checkpoints those occurrences were skipped instead, which the
    /// missed-tick check below still allows inside the failover windows.
    fn check(
        what: &str,
        report: Result<ChurnReport, String>,
        kills: &[Kill],
        stops: &[Timestamp],
        counters: &CounterReport,
        waits: bool,
    ) {
        assert_eq!(kills.len(), 2, "two failovers");
        if !waits {
            match &report {
                Ok(r) => println!("{what} without wait_replicas: {r}; kills {kills:?}; counters: {counters}"),
                Err(why) => {
                    println!("{what} without wait_replicas: {why}; kills {kills:?}; counters: {counters}")
                }
            }
            return;
        }
        let report = report.unwrap_or_else(|why| panic!("{what}: {why}"));
        println!("{what} with wait_replicas=1: {report}; kills {kills:?}; counters: {counters}");
        assert!(report.occurrences > 0);
        let interval = rollcall_core::ReminderOptions::default().lease_checkpoint_interval;
        let unlanded: Vec<Timestamp> = stops
            .iter()
            .copied()
            .filter(|s| {
                kills
                    .iter()
                    .any(|(k, _, back)| *s >= *k && *s <= k.saturating_add(*back))
            })
            .collect();
        let unexplained: Vec<_> = report
            .duplicates
            .iter()
            .filter(|(_, due)| {
                !unlanded.iter().any(|s| {
                    *due > s.saturating_sub(interval + Duration::from_secs(1))
                        && *due <= s.saturating_add(Duration::from_secs(2))
                })
            })
            .collect();
        assert!(
            unexplained.is_empty(),
            "{what}: {} repeats outside one checkpoint interval before a stop during a \
             failover (stops then: {unlanded:?}), e.g. {:?}",
            unexplained.len(),
            &unexplained[..unexplained.len().min(10)]
        );
        // With wait_replicas=1 no write is acknowledged while no replica is in
        // sync: the pause lasts until one is back, not only the failover. A
        // kill that comes before the ticks resumed from the one before (a
        // replica back after 20 s on a loaded machine, the next kill 24 s
        // after the first) pauses them on: the bound is the longest run of
        // such pauses, each its replica's return plus the resume.
        let longest = paused_runs(kills).into_iter().max().unwrap_or_default();
        let late = report.lateness[2];
        assert!(
            late <= longest,
            "{what}: a tick {late:?} late, over the longest pause ({longest:?}: a replica's \
             return + {TICK_RESUME:?}, over kills that follow each other; kills {kills:?})"
        );
        for (key, t) in &report.missed {
            assert!(
                kills.iter().any(|(k, _, back)| *t >= k.saturating_sub(PERIOD)
                    && t.saturating_duration_since(*k) <= *back + TICK_RESUME),
                "{what}: {key:?} missed {t}, outside every failover"
            );
        }
        counters.assert_none_lost();
    }

    /// Runs the churn on `url` while `kills` kills twice; the counters run until
    /// the kills are over and 3 s more.
    async fn run<K, KFut>(what: &str, url: String, waits: bool, kills: K)
    where
        K: FnOnce() -> KFut,
        KFut: std::future::Future<Output = (Vec<Kill>, Box<dyn std::any::Any + Send>)>,
    {
        let counter_url = url.clone();
        // The servers live until the churn's last silo has left (`_servers`).
        let (report, stops, (kills, _servers, counters)) = churn_with(&url, true, plan(), |_| async move {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let counters = tokio::spawn(async move {
                count_through(&counter_url, 32, 8, async {
                    let _ = stop_rx.await;
                })
                .await
            });
            let (kills, servers) = kills().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = stop_tx.send(());
            (kills, servers, counters.await.expect("the counters"))
        })
        .await;
        check(what, report, &kills, &stops, &counters, waits);
    }

    async fn cluster_run(waits: bool) {
        let mut cluster = ReplicatedCluster::start()
            .await
            .expect("a replicated Redis Cluster");
        let url = cluster.url(if waits { "?wait_replicas=1&wait_ms=500" } else { "" });
        let started = Instant::now();
        run("cluster", url, waits, || async move {
            let mut kills = Vec::new();
            for at in [Duration::from_secs(12), Duration::from_secs(36)] {
                tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
                // The master of the first shard: its replica, promoted, the second time.
                let slot = 0u16;
                let victim = cluster.master_of(slot).await.expect("a master");
                let now = SystemClock.now();
                cluster.kill(victim).await;
                let failover = cluster.failed_over(slot, victim).await.expect("failed over");
                // Back as the replica of its shard: `wait_replicas=1` needs one.
                cluster.restart(victim).await.expect("a replica again");
                kills.push((now, failover, SystemClock.now().saturating_duration_since(now)));
            }
            (kills, Box::new(cluster) as Box<dyn std::any::Any + Send>)
        })
        .await;
    }

    async fn sentinel_run(waits: bool) {
        let mut sentinels = Sentinels::start().await.expect("a Redis Sentinel set-up");
        let url = sentinels.url(if waits { "?wait_replicas=1&wait_ms=500" } else { "" });
        let started = Instant::now();
        run("sentinel", url, waits, || async move {
            let mut kills = Vec::new();
            for at in [Duration::from_secs(12), Duration::from_secs(36)] {
                tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
                let primary = sentinels.primary().await.expect("primary");
                let now = SystemClock.now();
                sentinels.kill(primary).await;
                let failover = sentinels.failed_over(primary).await.expect("failed over");
                // The next kill needs a replica to promote; the sentinels demote
                // the old primary, restarted empty, to one.
                sentinels
                    .restart_as_replica(primary)
                    .await
                    .expect("a replica again");
                kills.push((now, failover, SystemClock.now().saturating_duration_since(now)));
            }
            (kills, Box::new(sentinels) as Box<dyn std::any::Any + Send>)
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_failovers_with_wait_replicas_lose_nothing_acknowledged() {
        cluster_run(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sentinel_failovers_with_wait_replicas_lose_nothing_acknowledged() {
        sentinel_run(true).await;
    }

    /// Reports only: run by hand (`--ignored`), its figures in the guide.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a report, not a check: run with --ignored"]
    async fn cluster_failovers_without_wait_replicas_report_their_losses() {
        cluster_run(false).await;
    }

    /// Reports only: run by hand (`--ignored`), its figures in the guide.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a report, not a check: run with --ignored"]
    async fn sentinel_failovers_without_wait_replicas_report_their_losses() {
        sentinel_run(false).await;
    }
}

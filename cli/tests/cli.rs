//! The `rollcall` binary, run as a user runs it.

use std::process::Command;

fn rollcall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rollcall"))
}

#[test]
fn demo_converges_and_shows_the_dead_silo_with_its_voters() {
    let out = rollcall()
        .args(["demo", "--fast", "--silos", "4"])
        .output()
        .expect("run rollcall demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all 4 silos are Active"), "{stdout}");
    assert!(stdout.contains("declared Dead by"), "{stdout}");
    assert!(stdout.contains("every survivor sees"), "{stdout}");
    assert!(stdout.contains("reminders registered (1-s period)"), "{stdout}");
    assert!(
        stdout.contains("reminders of the killed silo tick on survivors"),
        "{stdout}"
    );
    // The final table: 3 Active, 1 Dead with two voters.
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("cluster "))
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(
        table.iter().filter(|l| l.contains(" Active ")).count(),
        3,
        "{stdout}"
    );
    let dead: Vec<&&str> = table.iter().filter(|l| l.contains(" Dead ")).collect();
    assert_eq!(dead.len(), 1, "{stdout}");
    assert_eq!(
        dead[0].matches("s ago)").count(),
        2,
        "two voters with vote ages: {stdout}"
    );
    // Then its history: join, Active, and the declaration with both votes.
    let history: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("why was "))
        .filter(|l| l.starts_with('v'))
        .collect();
    assert_eq!(history.len(), 3, "{stdout}");
    assert!(history[0].ends_with("joined as Joining (by itself)"), "{stdout}");
    assert!(history[2].contains("declared Dead by "), "{stdout}");
    assert_eq!(history[2].matches(" at 20").count(), 2, "{stdout}");
    assert!(
        stdout.contains("To inspect a cluster from another process"),
        "{stdout}"
    );
}

#[test]
fn status_of_an_empty_cluster() {
    let out = rollcall()
        .args(["status", "--store", "memory://", "--cluster", "nobody"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("cluster nobody: table version 0 (0 silos, 0 active)"),
        "{stdout}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = rollcall()
        .args(["status", "--store", "mysql://x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store_url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = rollcall()
        .args([
            "silo",
            "--store",
            "memory://",
            "--options",
            r#"{"num_votes_for_death_declaration":99}"#,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("num_votes_for_death_declaration"), "{stderr}");
}

/// Child processes killed when the test ends, however it ends.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
struct Procs(Vec<std::process::Child>);

#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `rollcall status` output: (table version, lines of silos).
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn status(store: &str, cluster: &str) -> (u64, Vec<String>) {
    let out = rollcall()
        .args(["status", "--store", store, "--cluster", cluster])
        .output()
        .expect("run rollcall status");
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text
        .split("table version ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no version in {text}"));
    (version, text.lines().skip(2).map(str::to_owned).collect())
}

/// Where silo `port` of `cluster` logs (its stderr) in the multi-process tests.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn log_path(cluster: &str, port: u16) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{cluster}-{port}.log"))
}

/// Starts `n` `rollcall silo --fast` processes of `cluster` on `store` (stderr to
/// [`log_path`]) and waits until `rollcall status` shows them all Active; returns
/// them, their ports and the table version then.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn start_silos(store: &str, cluster: &str, n: usize) -> (Procs, Vec<u16>, u64) {
    start_silos_with(store, cluster, n, &[])
}

/// [`start_silos`] with extra `rollcall silo` arguments.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn start_silos_with(store: &str, cluster: &str, n: usize, extra: &[&str]) -> (Procs, Vec<u16>, u64) {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    start_silos_each(store, cluster, n, |_| extra.clone())
}

/// As [`start_silos_with`], with the extra arguments of silo `i` from `extra(i)`.
fn start_silos_each(
    store: &str,
    cluster: &str,
    n: usize,
    extra: impl Fn(usize) -> Vec<String>,
) -> (Procs, Vec<u16>, u64) {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let ports: Vec<u16> = (0..n)
        .map(|_| rollcall_tests::fixtures::free_port().unwrap())
        .collect();
    let mut procs = Procs(Vec::new());
    for (i, p) in ports.iter().enumerate() {
        let log = std::fs::File::create(log_path(cluster, *p)).expect("create silo log");
        let child = rollcall()
            .args([
                "silo",
                "--store",
                store,
                "--cluster",
                cluster,
                "--listen",
                &format!("127.0.0.1:{p}"),
                "--fast",
            ])
            .args(extra(i))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rollcall silo");
        procs.0.push(child);
    }
    let started = Instant::now();
    let (mut last_version, mut lines) = status(store, cluster);
    while active(&lines) < n {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{n} silos never became Active: {lines:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        let (v, l) = status(store, cluster);
        assert!(
            v >= last_version,
            "table version went back from {last_version} to {v}"
        );
        (last_version, lines) = (v, l);
    }
    (procs, ports, last_version)
}

/// The redis-server of the fixtures (kept alive with the runtime that found it), or
/// `None` when the fixtures skip it (never when `CI` is set: then they fail).
#[cfg(feature = "redis")]
fn redis_fixture() -> Option<(tokio::runtime::Runtime, rollcall_tests::fixtures::Backend)> {
    backend_fixture(rollcall_tests::fixtures::redis())
}

/// A backend the fixtures find, with the runtime that found it (kept alive with it).
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn backend_fixture(
    find: impl std::future::Future<Output = Option<rollcall_tests::fixtures::Backend>>,
) -> Option<(tokio::runtime::Runtime, rollcall_tests::fixtures::Backend)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = rt.block_on(find)?;
    Some((rt, backend))
}

#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn active(lines: &[String]) -> usize {
    lines.iter().filter(|l| l.contains(" Active ")).count()
}

/// Issue 8's stall rule with real processes: a silo frozen (SIGSTOP) for 1.2 s, less
/// than the `--fast` tolerance of 3 x 500 ms, is not declared Dead (it was in every
/// run before the stall-tolerant probe cycle); and SIGTERM makes a silo leave
/// gracefully (exit 0, its row Dead with no votes).
#[cfg(all(feature = "redis", unix))]
#[test]
fn redis_multi_process_short_stall_is_survived_and_sigterm_leaves_gracefully() {
    use std::time::{Duration, Instant};

    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("stall");
    let (mut procs, ports, _) = start_silos(&store, &cluster, 3);
    std::thread::sleep(Duration::from_secs(2)); // let the probes settle
    let signal = |pid: u32, sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    for _ in 0..3 {
        let pid = procs.0[1].id();
        signal(pid, "-STOP");
        std::thread::sleep(Duration::from_millis(1200));
        signal(pid, "-CONT");
        std::thread::sleep(Duration::from_secs(4));
        let (_, lines) = status(&store, &cluster);
        assert_eq!(active(&lines), 3, "a 1.2 s stall must kill nobody: {lines:#?}");
    }

    let leaving = format!("127.0.0.1:{} ", ports[0]);
    signal(procs.0[0].id(), "-TERM");
    let started = Instant::now();
    let code = loop {
        if let Some(code) = procs.0[0].try_wait().expect("wait") {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "SIGTERM did not stop the silo"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code.code(), Some(0), "SIGTERM is a graceful leave, exit 0");
    let (_, lines) = status(&store, &cluster);
    let row = lines
        .iter()
        .find(|l| l.starts_with(&leaving))
        .cloned()
        .expect("leaving row");
    assert!(row.contains(" Dead "), "{row}");
    assert!(!row.contains("s ago)"), "left on its own, nobody voted: {row}");
    assert_eq!(active(&lines), 2, "{lines:#?}");
}

/// Three `rollcall silo` processes on a real redis-server; one SIGKILLed; the other
/// two declare it Dead within the bound, as `rollcall status` shows.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_cluster_declares_a_killed_silo_dead() {
    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    killed_silo_is_declared_dead_within_the_bound(&backend.endpoint);
}

/// The same three processes on a real etcd (issue 10).
#[cfg(feature = "etcd")]
#[test]
fn etcd_multi_process_cluster_declares_a_killed_silo_dead() {
    let Some((_rt, backend)) = backend_fixture(rollcall_tests::fixtures::etcd()) else {
        return;
    };
    killed_silo_is_declared_dead_within_the_bound(&format!("etcd://{}", backend.endpoint));
}

/// The same three processes on a DynamoDB-compatible server (issue 11).
#[cfg(feature = "dynamodb")]
#[test]
fn dynamodb_multi_process_cluster_declares_a_killed_silo_dead() {
    let Some((_rt, backend)) = backend_fixture(rollcall_tests::fixtures::dynamodb()) else {
        return;
    };
    let url = rollcall_tests::fixtures::dynamodb_url(&backend.endpoint);
    // The table exists before `rollcall status` first reads it (the silos create
    // it too, but the first status poll may come first).
    _rt.block_on(async {
        let store = rollcall::connect(&url).await.expect("connect");
        let table = store
            .membership_table("warm-up", rollcall::ProtocolMode::Extended)
            .expect("table");
        table.init(true).await.expect("create the table");
    });
    killed_silo_is_declared_dead_within_the_bound(&url);
}

/// Starts three `rollcall silo --fast` processes on `store`, SIGKILLs one, and
/// checks through `rollcall status` that the two others declare it Dead (with
/// their votes shown) within the probe bound plus allowances, the table version
/// never going back.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn killed_silo_is_declared_dead_within_the_bound(store: &str) {
    use std::time::{Duration, Instant};

    let cluster = rollcall_tests::unique_id("procs");
    let (mut procs, ports, mut last_version) = start_silos_with(
        store,
        &cluster,
        3,
        &["--metrics-period", "300ms", "--statistics-period", "300ms"],
    );
    std::thread::sleep(Duration::from_secs(2)); // let the probes settle

    let victim_port = ports[2];
    procs.0[2].kill().expect("SIGKILL the silo process");
    let killed = Instant::now();
    // --fast: 3 missed probes x 500 ms, plus two table writes and a gossip round
    // (1 s each of allowance on a busy 2-core machine), plus `status` polling.
    let bound = Duration::from_millis(3 * 500) + Duration::from_secs(3) + Duration::from_secs(1);
    let victim = format!("127.0.0.1:{victim_port} ");
    loop {
        let (v, l) = status(store, &cluster);
        assert!(
            v >= last_version,
            "table version went back from {last_version} to {v}"
        );
        last_version = v;
        let row = l
            .iter()
            .find(|line| line.starts_with(&victim))
            .cloned()
            .expect("victim row");
        if row.contains(" Dead ") {
            assert!(row.contains("s ago)"), "the Dead row shows its voters: {row}");
            assert_eq!(active(&l), 2, "the two others stay Active: {l:#?}");
            break;
        }
        assert!(
            killed.elapsed() <= bound,
            "not declared Dead within {bound:?}: {l:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        killed.elapsed() <= bound,
        "declared Dead only after {:?} (bound {bound:?})",
        killed.elapsed()
    );
    why_was_it_declared_dead(store, &cluster, victim_port, &ports[..2]);
    survivors_metrics_show_the_vote(store, &cluster, &victim);
    statistics_show_the_vote_in_rollups(store, &cluster, &victim);
}

/// `rollcall statistics` shows the survivors' `votes_written` in 1-minute buckets
/// (count, mean, min, max) and as raw points, and `--silo` narrows it to one silo;
/// on etcd, which keeps no statistics, it fails saying why.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn statistics_show_the_vote_in_rollups(store: &str, cluster: &str, victim: &str) {
    use std::time::{Duration, Instant};

    let statistics = |extra: &[&str]| {
        rollcall()
            .args([
                "statistics",
                "--store",
                store,
                "--cluster",
                cluster,
                "--last",
                "10m",
            ])
            .args(extra)
            .output()
            .expect("run rollcall statistics")
    };
    if store.starts_with("etcd") {
        let out = statistics(&[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("append-heavy"),
            "{stderr}"
        );
        return;
    }
    let start = Instant::now();
    loop {
        let out = statistics(&["--level", "1m", "--name", "votes_written"]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "statistics failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // bucket(2 words) silo name count mean min max
        let rows: Vec<Vec<&str>> = stdout
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .filter(|r: &Vec<&str>| r.len() == 8)
            .collect();
        assert!(rows.iter().all(|r| r[3] == "votes_written"), "{stdout}");
        let voted = rows
            .iter()
            .find(|r| !r[2].starts_with(victim.trim()) && r[7].parse::<f64>().unwrap_or(0.0) >= 1.0);
        if let Some(row) = voted {
            assert!(row[4].parse::<u64>().unwrap_or(0) >= 1, "{stdout}");
            let silo = row[2];
            let raw = statistics(&["--level", "raw", "--silo", silo]);
            let raw = String::from_utf8_lossy(&raw.stdout).into_owned();
            let points: Vec<&str> = raw.lines().skip(2).collect();
            assert!(!points.is_empty(), "{raw}");
            assert!(
                points.iter().all(|l| l.split_whitespace().nth(2) == Some(silo)),
                "{raw}"
            );
            assert!(points.iter().any(|l| l.contains(" cpu_percent ")), "{raw}");
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no survivor's statistics showed the vote: {stdout}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `rollcall metrics` lists the three silos' rows; once the survivors published
/// after the declaration, their rows count at least one suspicion and one vote
/// written, and every row shows table reads and writes and some resident memory.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn survivors_metrics_show_the_vote(store: &str, cluster: &str, victim: &str) {
    use std::time::{Duration, Instant};

    let start = Instant::now();
    loop {
        let out = rollcall()
            .args(["metrics", "--store", store, "--cluster", cluster])
            .output()
            .expect("run rollcall metrics");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "metrics failed: {stdout}");
        let rows: Vec<Vec<&str>> = stdout
            .lines()
            .filter(|l| l.starts_with("silo "))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 3, "{stdout}");
        let col = |r: &Vec<&str>, i: usize| r[i].parse::<f64>().unwrap_or_else(|_| panic!("{stdout}"));
        // role id published(2 words) cpu rss p50 p99 suspicions votes reads writes ...
        assert!(
            rows.iter()
                .all(|r| col(r, 5) > 0.5 && col(r, 10) >= 1.0 && col(r, 11) >= 2.0),
            "{stdout}"
        );
        let survivors: Vec<_> = rows.iter().filter(|r| !r[1].starts_with(victim.trim())).collect();
        let votes: f64 = survivors.iter().map(|r| col(r, 9)).sum();
        let suspicions: f64 = survivors.iter().map(|r| col(r, 8)).sum();
        if votes >= 1.0 && suspicions >= 1.0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the survivors' rows never showed the vote: {stdout}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `rollcall history` answers "why was the silo on `victim_port` declared dead":
/// its join and activation written by itself, then a declaration by one of the
/// `survivors` carrying both survivors' votes, in increasing table versions; and
/// `--silo` narrows the timeline to it.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn why_was_it_declared_dead(store: &str, cluster: &str, victim_port: u16, survivors: &[u16]) {
    let history = |extra: &[&str]| {
        let out = rollcall()
            .args(["history", "--store", store, "--cluster", cluster])
            .args(extra)
            .output()
            .expect("run rollcall history");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "history failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let all = history(&[]);
    let victim = format!("127.0.0.1:{victim_port}@");
    let lines: Vec<&str> = all.lines().filter(|l| l.contains(&victim)).collect();
    let about = |l: &str| l.split_whitespace().nth(3).expect("silo column").to_owned();
    let lines: Vec<&str> = lines
        .into_iter()
        .filter(|l| about(l).starts_with(&victim))
        .collect();
    assert!(lines.len() >= 3, "join, Active and the declaration: {all}");
    assert!(lines[0].ends_with("joined as Joining (by itself)"), "{all}");
    assert!(lines.iter().any(|l| l.ends_with("Active (by itself)")), "{all}");
    let declared = lines.last().expect("last event");
    assert!(declared.contains("declared Dead by 127.0.0.1:"), "{all}");
    for port in survivors {
        assert!(
            declared.contains(&format!("127.0.0.1:{port}@")),
            "the declaration names survivor {port} as writer or voter: {declared}"
        );
    }
    assert_eq!(
        declared.matches(" at 20").count(),
        2,
        "two votes with their times: {declared}"
    );
    let versions: Vec<u64> = all
        .lines()
        .skip(1)
        .map(|l| {
            l[1..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .expect("version")
        })
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "version order: {all}");
    let only = history(&["--silo", &about(lines[0])]);
    assert_eq!(
        only.lines().count(),
        lines.len() + 1,
        "--silo keeps exactly its events: {only}"
    );
    assert!(
        only.lines().skip(1).all(|l| about(l).starts_with(&victim)),
        "{only}"
    );
}

/// Waits (polling `rollcall status`, at most `limit`) until `n` silos of `cluster`
/// are Active, failing at once if one of `procs` exits meanwhile.
#[cfg(feature = "redis")]
fn await_active(store: &str, cluster: &str, n: usize, procs: &mut Procs, limit: std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        let (_, lines) = status(store, cluster);
        if active(&lines) == n {
            return;
        }
        for c in &mut procs.0 {
            assert!(c.try_wait().expect("wait").is_none(), "a silo exited: {lines:#?}");
        }
        assert!(
            started.elapsed() < limit,
            "{n} silos never became Active: {lines:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Runs one Redis command against the fixture's server.
#[cfg(feature = "redis")]
fn redis_cmd(rt: &tokio::runtime::Runtime, endpoint: &str, cmd: &mut rollcall_tests::redis::Cmd) {
    use rollcall_tests::redis;
    rt.block_on(async {
        let mut con = redis::Client::open(endpoint)
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis");
        cmd.query_async::<redis::Value>(&mut con)
            .await
            .expect("redis command");
    });
}

/// SIGKILLs silo `i` and waits (bounded) until `rollcall status` shows it Dead while
/// `survivors` others stay Active.
#[cfg(feature = "redis")]
fn kill_and_await_dead(procs: &mut Procs, i: usize, port: u16, store: &str, cluster: &str, survivors: usize) {
    use std::time::{Duration, Instant};
    procs.0[i].kill().expect("SIGKILL the silo");
    let victim = format!("127.0.0.1:{port} ");
    let killed = Instant::now();
    loop {
        let (_, lines) = status(store, cluster);
        let row = lines.iter().find(|l| l.starts_with(&victim)).cloned();
        if row.as_deref().is_some_and(|r| r.contains(" Dead ")) {
            assert_eq!(active(&lines), survivors, "{lines:#?}");
            return;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "the killed silo was not declared Dead: {lines:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 8, defect 2, as found: one non-JSON row in Redis used to fail every
/// `read_all`, so a silo killed meanwhile was never declared Dead. Now the corrupt
/// row is skipped (and shown by `rollcall status`), the kill is detected, and each
/// survivor logs the bad key once, not once per read.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_corrupt_row_does_not_blind_the_cluster() {
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("corrupt");
    let (mut procs, ports, _) = start_silos(&store, &cluster, 3);
    let base = format!("rollcall:{{m:{cluster}}}");
    let bad_id = "10.9.9.9:11111@1";
    redis_cmd(
        &rt,
        &store,
        rollcall_tests::redis::cmd("SADD")
            .arg(format!("{base}:silos"))
            .arg(bad_id),
    );
    redis_cmd(
        &rt,
        &store,
        rollcall_tests::redis::cmd("SET")
            .arg(format!("{base}:silo:{bad_id}"))
            .arg("{not json"),
    );
    let (_, lines) = status(&store, &cluster);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("CORRUPT ") && l.contains(bad_id)),
        "status shows the corrupt row: {lines:#?}"
    );
    kill_and_await_dead(&mut procs, 2, ports[2], &store, &cluster, 2);
    for p in &ports[..2] {
        let log = std::fs::read_to_string(log_path(&cluster, *p)).unwrap_or_default();
        let mentions = log
            .lines()
            .filter(|l| l.contains("corrupt membership row"))
            .count();
        assert_eq!(mentions, 1, "logged once per change, not per read:\n{log}");
    }
}

/// Issue 8, defect 3, as found: the table loses its data (here: every key of the
/// cluster deleted, as a Redis restarted empty). The silos used to keep their old
/// view, miss a crash, and all exit 70 once the version passed their view. Now each
/// writes its row again, keeps running, and a later crash is detected.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_lost_table_is_survived() {
    use std::time::Duration;
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("lost");
    let (mut procs, ports, _) = start_silos(&store, &cluster, 3);
    let pattern = format!("rollcall:{{m:{cluster}}}*");
    redis_cmd(
        &rt,
        &store,
        rollcall_tests::redis::cmd("EVAL")
            .arg("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0")
            .arg(0)
            .arg(&pattern),
    );
    assert_eq!(status(&store, &cluster).0, 0, "the table is empty");
    // --fast reads the table every 10 s at least; no silo may exit meanwhile.
    await_active(&store, &cluster, 3, &mut procs, Duration::from_secs(30));
    kill_and_await_dead(&mut procs, 2, ports[2], &store, &cluster, 2);
    let log = std::fs::read_to_string(log_path(&cluster, ports[0])).unwrap_or_default();
    assert!(
        log.contains("re-registering"),
        "the loss is logged as an error:\n{log}"
    );
}

/// Issue 8, defect 8, as found: a silo started before its store used to exit at
/// once. Now it waits (up to max_join_attempt_time) and joins when the store comes
/// up; with no store at all it fails after that time, naming the store.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_silo_waits_for_a_late_store() {
    use rollcall_tests::fixtures::{free_port, start_local_on, Kind};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let Some((rt, _backend)) = redis_fixture() else {
        return;
    };
    // No store at all: a clear failure after max_join_attempt_time.
    let nowhere = format!("redis://127.0.0.1:{}", free_port().unwrap());
    let started = Instant::now();
    let out = rollcall()
        .args(["silo", "--store", &nowhere, "--cluster", "late", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port().unwrap()))
        .args([
            "--options",
            r#"{"max_join_attempt_time":"2s","probe_timeout":"500ms"}"#,
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run rollcall silo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up before max_join_attempt_time"
    );
    assert!(stderr.contains(&nowhere), "the error names the store: {stderr}");
    assert!(
        stderr.matches("retrying").count() >= 2,
        "each failure is logged: {stderr}"
    );

    // The store comes up 2 s after the silo: the silo joins.
    let port = free_port().unwrap();
    let store = format!("redis://127.0.0.1:{port}");
    let cluster = rollcall_tests::unique_id("late");
    let listen = free_port().unwrap();
    let child = rollcall()
        .args([
            "silo",
            "--store",
            &store,
            "--cluster",
            &cluster,
            "--fast",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{listen}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rollcall silo");
    let mut procs = Procs(vec![child]);
    std::thread::sleep(Duration::from_secs(2)); // the store is down meanwhile
    assert!(
        procs.0[0].try_wait().unwrap().is_none(),
        "the silo waits for its store"
    );
    let _late = rt
        .block_on(start_local_on(Kind::Redis, Some(port)))
        .expect("start the late redis-server");
    await_active(&store, &cluster, 1, &mut procs, Duration::from_secs(20));
}

/// Issue 8, defect 4, as found: a silo at a low open-file limit (here 128) and
/// hundreds of idle connections to its probe port. Its accept loop used to fail
/// with EMFILE forever, logging on every try, and a new silo could not join. Now
/// unverified connections are capped and timed out, the new silo joins, and the
/// log stays short.
#[cfg(all(feature = "redis", unix))]
#[test]
fn redis_multi_process_idle_connections_do_not_exhaust_the_probe_port() {
    use std::process::Stdio;
    use std::time::Duration;
    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("flood");
    let port = rollcall_tests::fixtures::free_port().unwrap();
    let log = log_path(&cluster, port);
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 128 && exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_rollcall"))
        .args([
            "silo",
            "--store",
            &store,
            "--cluster",
            &cluster,
            "--fast",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn rollcall silo");
    let mut procs = Procs(vec![child]);
    await_active(&store, &cluster, 1, &mut procs, Duration::from_secs(20));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let idle: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok())
        .collect();
    assert!(idle.len() >= 200, "opened {} idle connections", idle.len());
    let (mut more, _, _) = start_silos(&store, &cluster, 1);
    procs.0.append(&mut more.0);
    await_active(&store, &cluster, 2, &mut procs, Duration::from_secs(20));
    assert!(
        procs.0[0].try_wait().unwrap().is_none(),
        "the flooded silo runs on"
    );
    drop(idle);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.lines().count() < 20,
        "the flood controls the log volume:\n{text}"
    );
}

/// Issue 8, defect 5: `--shared-secret-file`. Silos with the same secret form a
/// cluster; a silo with another secret gets no answer from them and cannot join.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_shared_secret_keeps_strangers_out() {
    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("secret");
    let dir = std::env::temp_dir();
    let (good, bad) = (
        dir.join(format!("{cluster}.good")),
        dir.join(format!("{cluster}.bad")),
    );
    std::fs::write(&good, "correct horse battery staple\n").unwrap();
    std::fs::write(&bad, "a different secret, also long\n").unwrap();
    let good_arg = good.to_string_lossy().into_owned();
    let (_procs, _, _) = start_silos_with(&store, &cluster, 2, &["--shared-secret-file", &good_arg]);
    let out = rollcall()
        .args(["silo", "--store", &store, "--cluster", &cluster, "--listen"])
        .arg(format!(
            "127.0.0.1:{}",
            rollcall_tests::fixtures::free_port().unwrap()
        ))
        .args([
            "--options",
            // Shorter than the others' detection (3 x 500 ms + a write), so the
            // stranger gives up before it could be voted Dead.
            r#"{"max_join_attempt_time":"1s","probe_timeout":"500ms"}"#,
        ])
        .arg("--shared-secret-file")
        .arg(&bad)
        .output()
        .expect("run rollcall silo");
    assert!(!out.status.success(), "a silo with another secret must not join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("could not reach"), "{stderr}");
    let (_, lines) = status(&store, &cluster);
    assert_eq!(active(&lines), 2, "{lines:#?}");
    let short = dir.join(format!("{cluster}.short"));
    std::fs::write(&short, "short").unwrap();
    let out = rollcall()
        .args(["silo", "--store", "memory://", "--shared-secret-file"])
        .arg(&short)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("shared_secret"));
}

/// `rollcall reminders` lists a service's reminders with their owner in the
/// cluster's membership, next tick, period and policy.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_lists_rows_with_their_owner() {
    use rollcall::{MembershipEntry, MissedTickPolicy, ProtocolMode, ReminderEntry, SiloStatus, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-rem");
    let silo: rollcall::SiloAddress = "127.0.0.1:4100@7".parse().unwrap();
    rt.block_on(async {
        let store = rollcall::connect(&backend.endpoint).await.unwrap();
        let table = store.membership_table(&service, ProtocolMode::Extended).unwrap();
        table.init(true).await.unwrap();
        let v = table.read_all().await.unwrap().version.next();
        let row = MembershipEntry::new(silo, SiloStatus::Active, Timestamp::now());
        assert!(table.insert_row(&row, &v).await.unwrap());
        let reminders = store.reminder_table(&service).unwrap();
        let start = Timestamp::now();
        let mut periodic = ReminderEntry::new(
            &service,
            "cart/1",
            "expire",
            start,
            Some(std::time::Duration::from_secs(90)),
        );
        periodic.missed_tick_policy = MissedTickPolicy::FireOnce;
        reminders.upsert_row(&periodic).await.unwrap();
        let once = ReminderEntry::new(&service, "cart/2", "ping", start, None);
        reminders.upsert_row(&once).await.unwrap();
    });
    let out = rollcall()
        .args(["reminders", "--store", &backend.endpoint, "--service", &service])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("service {service}: 2 reminders, 1 owning silos")),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines.iter().all(|l| l.contains("127.0.0.1:4100@7")),
        "owner column: {stdout}"
    );
    let periodic = lines.iter().find(|l| l.starts_with("cart/1")).expect("cart/1");
    assert!(
        periodic.contains("1m 30s") && periodic.contains("FireOnce"),
        "{periodic}"
    );
    let once = lines.iter().find(|l| l.starts_with("cart/2")).expect("cart/2");
    assert!(once.contains("once") && once.contains("(due)"), "{once}");
}

/// The Prometheus exposition served by `rollcall silo --metrics-listen` at `port`
/// (one plain HTTP/1.0 GET).
#[cfg(feature = "redis")]
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send the request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    assert!(reply.starts_with("HTTP/1."), "{reply}");
    assert!(reply.contains(" 200 "), "{reply}");
    reply
}

/// The value of the sample of `name` whose labels include every `labels` pair,
/// summed over the series that match.
#[cfg(feature = "redis")]
fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))) {
            let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Three `rollcall silo --metrics-listen` processes on Redis: the scrape names the
/// documented series with their units; when one silo is SIGKILLed, a survivor's
/// `rollcall_silos{status="Dead"}` goes from 0 to 1, its table version gauge moves
/// up, and the survivors' `rollcall_suspicions_total` counts the votes.
#[cfg(feature = "redis")]
#[test]
fn prometheus_scrape_names_the_series_and_moves_when_a_silo_dies() {
    use std::time::{Duration, Instant};

    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.as_str();
    let cluster = rollcall_tests::unique_id("prom");
    let metrics_ports: Vec<u16> = (0..3)
        .map(|_| rollcall_tests::fixtures::free_port().unwrap())
        .collect();
    let (mut procs, _ports, _) = start_silos_each(store, &cluster, 3, |i| {
        vec![
            "--metrics-listen".into(),
            format!("127.0.0.1:{}", metrics_ports[i]),
        ]
    });
    // The first silo has probed, recorded a round trip and sees all three Active
    // (the third may still be Joining in its view right after the first probe).
    let cl = ("cluster", cluster.as_str());
    let start = Instant::now();
    let before = loop {
        let text = scrape(metrics_ports[0]);
        if sample(&text, "rollcall_probe_rtt_seconds_count", &[]).unwrap_or(0.0) >= 1.0
            && sample(&text, "rollcall_silos", &[cl, ("status", "Active")]) == Some(3.0)
        {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no probe recorded or not all three Active: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "# TYPE rollcall_membership_table_version gauge",
        "# TYPE rollcall_silos gauge",
        "# TYPE rollcall_probe_rtt_seconds histogram",
        "# TYPE rollcall_probes_total counter",
        "# TYPE rollcall_table_operations_total counter",
        "# TYPE rollcall_table_operation_seconds histogram",
    ] {
        assert!(before.contains(name), "missing `{name}`: {before}");
    }
    assert_eq!(
        sample(&before, "rollcall_silos", &[cl, ("status", "Dead")]),
        Some(0.0),
        "{before}"
    );
    assert!(
        sample(
            &before,
            "rollcall_table_operations_total",
            &[("op", "insert_row"), ("outcome", "ok")]
        ) >= Some(1.0),
        "{before}"
    );
    let version_before = sample(&before, "rollcall_membership_table_version", &[cl]).expect("version");

    procs.0[2].kill().expect("SIGKILL the silo process");
    let killed = Instant::now();
    loop {
        let text = scrape(metrics_ports[0]);
        if sample(&text, "rollcall_silos", &[cl, ("status", "Dead")]) == Some(1.0) {
            assert_eq!(
                sample(&text, "rollcall_silos", &[cl, ("status", "Active")]),
                Some(2.0),
                "{text}"
            );
            let version = sample(&text, "rollcall_membership_table_version", &[cl]).expect("version");
            assert!(version > version_before, "{version} <= {version_before}");
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "never saw the death: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let votes: f64 = metrics_ports[..2]
        .iter()
        .map(|p| sample(&scrape(*p), "rollcall_suspicions_total", &[cl]).unwrap_or(0.0))
        .sum();
    assert!(votes >= 1.0, "the survivors counted no vote");
}

/// `rollcall status --watch` into a pipe prints the table again only when its
/// version changes, as plain lines (no escape codes): it shows 2 Active silos, then,
/// after one is SIGKILLed, the Dead row, without being restarted. On a terminal
/// (`script` gives it one) it redraws the screen with cursor-home and clear.
#[cfg(feature = "redis")]
#[test]
fn status_watch_redraws_on_new_versions_and_degrades_to_plain_lines() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.as_str();
    let cluster = rollcall_tests::unique_id("watch");
    let (mut procs, ports, _) = start_silos_with(store, &cluster, 2, &[]);
    let mut watcher = rollcall()
        .args([
            "status",
            "--watch",
            "--interval",
            "100ms",
            "--store",
            store,
            "--cluster",
            &cluster,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn status --watch");
    let stdout = watcher.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Blocks: "--- <time>", then the table's header line, then rows.
    let mut lines = Vec::new();
    let mut wait_for = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        let start = Instant::now();
        while !done(&lines) {
            let left = Duration::from_secs(15).saturating_sub(start.elapsed());
            match rx.recv_timeout(left) {
                Ok(l) => lines.push(l),
                Err(_) => panic!("never saw {what}: {lines:#?}"),
            }
        }
    };
    let last_block = |lines: &[String]| -> Vec<String> {
        let start = lines.iter().rposition(|l| l.starts_with("--- ")).unwrap_or(0);
        lines[start..].to_vec()
    };
    wait_for("2 active", &|l| {
        last_block(l).iter().any(|x| x.contains("(2 silos, 2 active)"))
    });
    procs.0[1].kill().expect("SIGKILL");
    let victim = format!("127.0.0.1:{} ", ports[1]);
    wait_for("the Dead row", &|l| {
        last_block(l)
            .iter()
            .any(|x| x.starts_with(&victim) && x.contains(" Dead "))
    });
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "escape codes in a pipe: {lines:#?}"
    );
    let versions: Vec<&String> = lines.iter().filter(|l| l.starts_with("cluster ")).collect();
    let mut distinct = versions.clone();
    distinct.dedup();
    assert_eq!(
        versions.len(),
        distinct.len(),
        "a version printed twice in a row: {versions:#?}"
    );

    // On a terminal: the screen is redrawn (cursor home + clear) every interval.
    let bin = env!("CARGO_BIN_EXE_rollcall");
    let command = format!("{bin} status --watch --interval 100ms --store {store} --cluster {cluster}");
    let mut tty = std::process::Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn script");
    let mut out = tty.stdout.take().expect("stdout");
    let (ttx, trx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || ttx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut screen = Vec::new();
    let start = Instant::now();
    while String::from_utf8_lossy(&screen)
        .matches("\u{1b}[H\u{1b}[2J")
        .count()
        < 3
    {
        let left = Duration::from_secs(15).saturating_sub(start.elapsed());
        match trx.recv_timeout(left) {
            Ok(b) => screen.extend(b),
            Err(_) => panic!("no redraws on a terminal: {}", String::from_utf8_lossy(&screen)),
        }
    }
    let _ = tty.kill();
    let _ = tty.wait();
    let text = String::from_utf8_lossy(&screen);
    assert!(text.contains("(Ctrl-C to quit)"), "{text}");
}

/// Waits until something accepts TCP connections on 127.0.0.1:`port`.
#[cfg(feature = "redis")]
fn wait_for_port(port: u16, what: &str) {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what} never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Chromium and ChromeDriver from Debian's packages (`chromium`, `chromium-driver`;
/// paths overridable with `ROLLCALL_CHROMIUM` and `ROLLCALL_CHROMEDRIVER`), or `None`
/// when they are missing and the run may skip (never when `CI` is set).
#[cfg(feature = "redis")]
fn browser_paths() -> Option<(String, String)> {
    let chromium = std::env::var("ROLLCALL_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver = std::env::var("ROLLCALL_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    if std::path::Path::new(&chromium).exists() && std::path::Path::new(&driver).exists() {
        return Some((chromium, driver));
    }
    let why =
        format!("no browser: {chromium} or {driver} is missing (apt-get install chromium chromium-driver)");
    if std::env::var_os("CI").is_some() || std::env::var_os("ROLLCALL_SKIP_MISSING_BACKENDS").is_none() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// The dashboard in a real browser: headless Chromium (through ChromeDriver and the
/// WebDriver protocol) loads `rollcall dashboard` against three `rollcall silo`
/// processes on Redis and sees 3 Active rows; one silo is SIGKILLed and the page,
/// never reloaded, shows it Dead with the survivors' votes, the history timeline
/// shows the declaration, and the statistics charts are drawn. The screenshot goes
/// to `$CARGO_TARGET_TMPDIR/dashboard.png` (and to `ROLLCALL_SCREENSHOT` when set:
/// the README's picture).
#[cfg(feature = "redis")]
#[test]
fn dashboard_in_a_real_browser_shows_a_killed_silo_dead_without_a_reload() {
    use fantoccini::{ClientBuilder, Locator};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let Some((chromium, driver)) = browser_paths() else {
        return;
    };
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("dash");
    let (mut procs, ports, _) = start_silos_with(
        &store,
        &cluster,
        3,
        &["--metrics-period", "300ms", "--statistics-period", "300ms"],
    );
    let web_port = rollcall_tests::fixtures::free_port().unwrap();
    procs.0.push(
        rollcall()
            .args([
                "dashboard",
                "--store",
                &store,
                "--cluster",
                &cluster,
                "--interval",
                "200ms",
            ])
            .args(["--listen", &format!("127.0.0.1:{web_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rollcall dashboard"),
    );
    let driver_port = rollcall_tests::fixtures::free_port().unwrap();
    procs.0.push(
        std::process::Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver"),
    );
    wait_for_port(web_port, "rollcall dashboard");
    wait_for_port(driver_port, "chromedriver");
    let profile = tempfile::tempdir().expect("profile dir");
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");

    // fantoccini's HTTP client is built with rustls, which wants a crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::rustls()
            .expect("webdriver client")
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
            .expect("start a headless Chromium session");
        client
            .goto(&format!("http://127.0.0.1:{web_port}/"))
            .await
            .expect("load the dashboard");
        // A marker that a reload would wipe.
        client
            .execute("window.rollcallMarker = 42; return 1;", vec![])
            .await
            .expect("set the marker");
        let rows = |status: &'static str| {
            let client = client.clone();
            async move {
                client
                    .find_all(Locator::Css(&format!("#silos tbody tr[data-status='{status}']")))
                    .await
                    .map(|r| r.len())
                    .unwrap_or(0)
            }
        };
        let start = Instant::now();
        while rows("Active").await != 3 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the page never showed 3 Active rows"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        procs.0[2].kill().expect("SIGKILL a silo");
        let killed = Instant::now();
        while rows("Dead").await != 1 {
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "the page never showed the Dead row"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(rows("Active").await, 2);
        let marker = client
            .execute("return window.rollcallMarker === 42;", vec![])
            .await
            .expect("read the marker");
        assert_eq!(marker, serde_json::Value::Bool(true), "the page was reloaded");
        // The row is read in one script (the live updates replace rows, so an
        // element found first can be stale by the time its text is read), until it
        // shows what is asserted below or 10 s pass.
        let read_start = Instant::now();
        let dead_text = loop {
            let text = client
                .execute(
                    "const r = document.querySelector(\"#silos tbody tr[data-status='Dead']\"); return r ? r.innerText : '';",
                    vec![],
                )
                .await
                .expect("read the Dead row")
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let done = text.contains(&format!("127.0.0.1:{}", ports[2])) && text.contains("ago)");
            if done || read_start.elapsed() > Duration::from_secs(10) {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            dead_text.contains(&format!("127.0.0.1:{}", ports[2])),
            "{dead_text}"
        );
        assert!(
            dead_text.contains("ago)"),
            "the Dead row shows its votes with ages: {dead_text}"
        );
        let start = Instant::now();
        loop {
            let history = client.find(Locator::Css("#history")).await.expect("timeline");
            let text = history.text().await.unwrap_or_default();
            let charts = client
                .find_all(Locator::Css("#charts .chart svg polyline"))
                .await
                .map(|c| c.len())
                .unwrap_or(0);
            if text.contains(&format!("127.0.0.1:{}", ports[2])) && text.contains("Dead") && charts >= 4 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no declaration in the timeline or no charts ({charts} series): {text}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let png = client.screenshot().await.expect("screenshot");
        std::fs::write(&screenshot, &png).expect("write the screenshot");
        if let Some(path) = std::env::var_os("ROLLCALL_SCREENSHOT") {
            std::fs::write(path, &png).expect("write ROLLCALL_SCREENSHOT");
        }
        client.close().await.expect("close the browser");
    });
    assert!(std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0) > 10_000);
}

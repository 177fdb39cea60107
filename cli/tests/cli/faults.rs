//! Silo processes under faults: stalls, kills (on every provider), a corrupt row, a lost table, a late store, idle connections, strangers without the shared secret.

use super::*;

/// The stall rule with real processes: a silo frozen (SIGSTOP) for 1.2 s, less
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
    wait_until_every_view_shows(&cluster, &ports, 3);
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
    wait_until_every_view_shows(&cluster, &ports, 3);
    // The victim's metrics row is checked after it died: wait until all three
    // silos published one.
    let started = Instant::now();
    loop {
        let stdout = metrics_output(store, &cluster);
        if stdout.lines().filter(|l| l.starts_with("silo ")).count() == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "three metrics rows never showed: {stdout}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

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
        let stdout = metrics_output(store, cluster);
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

/// What `rollcall metrics` prints for `cluster` (it must succeed).
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn metrics_output(store: &str, cluster: &str) -> String {
    let out = rollcall()
        .args(["metrics", "--store", store, "--cluster", cluster])
        .output()
        .expect("run rollcall metrics");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "metrics failed: {stdout}");
    stdout
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

/// One non-JSON row in Redis used to fail every
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
    // Each survivor has read the table since the row went bad once it printed
    // its view without the killed silo (the store shows the death sooner).
    wait_until_every_view_shows(&cluster, &ports[..2], 2);
    for p in &ports[..2] {
        let log = std::fs::read_to_string(log_path(&cluster, *p)).unwrap_or_default();
        let mentions = log
            .lines()
            .filter(|l| l.contains("corrupt membership row"))
            .count();
        assert_eq!(mentions, 1, "logged once per change, not per read:\n{log}");
    }
}

/// The table loses its data (here: every key of the
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
    // (No "the table is empty" check here: a silo may write its row back at once;
    // the log checked below says the loss was seen.)
    // --fast reads the table every 10 s at least; no silo may exit meanwhile.
    await_active(&store, &cluster, 3, &mut procs, Duration::from_secs(30));
    kill_and_await_dead(&mut procs, 2, ports[2], &store, &cluster, 2);
    let log = std::fs::read_to_string(log_path(&cluster, ports[0])).unwrap_or_default();
    assert!(
        log.contains("re-registering"),
        "the loss is logged as an error:\n{log}"
    );
}

/// A silo started before its store used to exit at
/// once. Now it waits (up to max_join_attempt_time) and joins when the store comes
/// up; with no store at all it fails after that time, naming the store.
#[cfg(feature = "redis")]
#[test]
fn redis_multi_process_silo_waits_for_a_late_store() {
    use rollcall_tests::fixtures::{free_port, start_own_on, Kind};
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
        .block_on(start_own_on(Kind::Redis, Some(port)))
        .expect("start the late redis-server");
    await_active(&store, &cluster, 1, &mut procs, Duration::from_secs(20));
}

/// A silo at a low open-file limit (here 128) and
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

/// `--shared-secret-file`: Silos with the same secret form a
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

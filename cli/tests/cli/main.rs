//! The `rollcall` binary, run as a user runs it: one test binary, a module per
//! topic, the helpers they share here.

mod basics;
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
mod faults;
#[cfg(feature = "redis")]
mod observability;
#[cfg(all(feature = "redis", target_os = "linux"))]
mod partitions;
#[cfg(feature = "redis")]
mod reminders;

use std::process::Command;

fn rollcall() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rollcall"))
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
#[cfg(feature = "redis")]
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
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
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
            .stdout(log.try_clone().expect("share the silo log"))
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

/// Waits (at most 20 s) until the newest view every silo of `ports` printed
/// (`table version N: K active` on its stdout, in its [`log_path`]) shows `n`
/// Active silos: from then on each of them probes the others.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn wait_until_every_view_shows(cluster: &str, ports: &[u16], n: usize) {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let wanted = format!(": {n} active");
    loop {
        let behind: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|p| {
                let log = std::fs::read_to_string(log_path(cluster, *p)).unwrap_or_default();
                !log.lines()
                    .rev()
                    .find(|l| l.starts_with("table version "))
                    .is_some_and(|l| l.ends_with(&wanted))
            })
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the views of the silos on {behind:?} never showed {n} Active"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

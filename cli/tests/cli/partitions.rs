//! Network partitions with real processes: five `rollcall silo` processes, each in
//! its own network namespace on one bridge, all reaching one Redis server on the
//! bridge; peers are cut off from each other with blackhole routes (silent drops)
//! while every silo still reaches the store, as an operator's firewall or a broken
//! switch would do it.
//!
//! Needs root and `ip` (iproute2); the store is the local `redis-server`, or the
//! Redis image in a container on the host's network when it is not installed
//! (`OwnServer`: Docker alone is enough). Without root or `ip` the tests skip, and
//! fail when `CI` is set. Only traffic between the namespaces the test makes (and
//! its bridge) is touched.

use super::*;

use rollcall_tests::fixtures::{OwnServer, Server};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One test's network: a bridge `10.<net>.<sub>.1/24` with a Redis server on it, and
/// one namespace per silo at `.11`, `.12`, ...
struct Net {
    id: u32,
    n: usize,
    redis: Option<OwnServer>,
    port: u16,
    /// Starts and stops the Redis server (a process or a container).
    rt: tokio::runtime::Runtime,
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this machine can make namespaces (root, `ip`); when it cannot, the test
/// skips, or fails under `CI`.
fn capable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if root && ip {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the partition tests need root and ip (root: {root}, ip: {ip})"
    );
    eprintln!("skipped: the partition tests need root and ip");
    false
}

impl Net {
    fn new(n: usize) -> Net {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Unique per process and test, so that runs in parallel never share names.
        let id = (std::process::id() % 2000) * 8 + NEXT.fetch_add(1, Ordering::Relaxed) % 8;
        let net = Net {
            id,
            n,
            redis: None,
            port: 6379,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the store's server"),
        };
        let br = net.bridge();
        sh(&["ip", "link", "add", &br, "type", "bridge"]);
        sh(&["ip", "addr", "add", &format!("{}/24", net.host()), "dev", &br]);
        sh(&["ip", "link", "set", &br, "up"]);
        for i in 0..n {
            let (ns, veth) = (net.ns(i), net.veth(i));
            sh(&["ip", "netns", "add", &ns]);
            sh(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            sh(&["ip", "link", "set", &veth, "master", &br]);
            sh(&["ip", "link", "set", &veth, "up"]);
            net.ip_in(i, &["addr", "add", &format!("{}/24", net.ip(i)), "dev", "eth0"]);
            net.ip_in(i, &["link", "set", "eth0", "up"]);
            net.ip_in(i, &["link", "set", "lo", "up"]);
        }
        net
    }

    /// Runs `ip ARGS` in silo `i`'s namespace (`ip -n`).
    fn ip_in(&self, i: usize, args: &[&str]) {
        let ns = self.ns(i);
        sh(&[&["ip", "-n", ns.as_str()], args].concat());
    }

    fn bridge(&self) -> String {
        format!("rcb{}", self.id)
    }

    fn veth(&self, i: usize) -> String {
        format!("rcv{}x{i}", self.id)
    }

    fn ns(&self, i: usize) -> String {
        format!("rollcall-{}-{i}", self.id)
    }

    fn subnet(&self) -> String {
        format!("10.{}.{}", 100 + self.id / 256, self.id % 256)
    }

    /// The bridge's address (the store listens there).
    fn host(&self) -> String {
        format!("{}.1", self.subnet())
    }

    fn ip(&self, i: usize) -> String {
        format!("{}.{}", self.subnet(), 11 + i)
    }

    fn store(&self) -> String {
        format!("redis://{}:{}", self.host(), self.port)
    }

    /// Starts a Redis server on the bridge (a local process, or a container on the
    /// host's network) and waits until it answers.
    fn start_redis(&mut self) {
        self.port = rollcall_tests::fixtures::free_port().expect("a free port");
        let args: Vec<String> = [
            "--bind",
            &self.host(),
            "--port",
            &self.port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            // Clients come from the namespaces' addresses, not loopback.
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let log = std::env::temp_dir().join(format!("rollcall-partition-redis-{}.log", self.id));
        let server = self
            .rt
            .block_on(OwnServer::spawn(Server::Redis, &args, &[], &log))
            .unwrap_or_else(|e| panic!("a Redis server for the partition tests: {e}"));
        eprintln!("partition store: {} Redis on {}", server.source(), self.store());
        self.redis = Some(server);
        let started = Instant::now();
        while std::net::TcpStream::connect((self.host().as_str(), self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the Redis server did not start (log: {})",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts silo `i` in its namespace.
    fn silo(&self, i: usize, cluster: &str, fast: bool) -> Child {
        let log = std::fs::File::create(log_path(cluster, 11 + i as u16)).expect("create silo log");
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.ns(i),
            env!("CARGO_BIN_EXE_rollcall"),
            "silo",
        ])
        .args(["--store", &self.store(), "--cluster", cluster])
        .args(["--listen", &format!("{}:11111", self.ip(i))])
        .args(["--metrics-period", "0s"]);
        if fast {
            cmd.arg("--fast");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rollcall silo in its namespace")
    }

    /// Drops everything between silos `i` and `j`, both ways.
    fn cut(&self, i: usize, j: usize) {
        for (a, b) in [(i, j), (j, i)] {
            self.ip_in(a, &["route", "add", "blackhole", &format!("{}/32", self.ip(b))]);
        }
    }

    /// Splits the silos: silo `k` goes to side `sides[k]`; silos on different sides
    /// drop each other's packets.
    fn split(&self, sides: &[u8]) {
        for i in 0..self.n {
            for j in i + 1..self.n {
                if sides[i] != sides[j] {
                    self.cut(i, j);
                }
            }
        }
    }

    /// Cuts silo `i` off from the store only.
    fn cut_store(&self, i: usize) {
        self.ip_in(i, &["route", "add", "blackhole", &format!("{}/32", self.host())]);
    }

    /// Removes every blackhole route.
    fn heal(&self) {
        for i in 0..self.n {
            self.ip_in(i, &["route", "flush", "type", "blackhole"]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(mut r) = self.redis.take() {
            self.rt.block_on(r.kill());
        }
        for i in 0..self.n {
            let _ = Command::new("ip").args(["netns", "del", &self.ns(i)]).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge()]).status();
    }
}

/// The status of silo `i` in `rollcall status` lines (Active, Dead, ...), if listed.
fn status_of(net: &Net, lines: &[String], i: usize) -> Option<String> {
    let prefix = format!("{}:11111", net.ip(i));
    let line = lines.iter().find(|l| l.starts_with(&prefix))?;
    ["Active", "Dead", "ShuttingDown", "Joining", "Created", "Stopping"]
        .iter()
        .find(|s| line.contains(&format!(" {s} ")))
        .map(|s| s.to_string())
}

/// A cluster of `n` silo processes in namespaces, all Active.
struct Cluster {
    // Dropped in order: the processes, then the network.
    procs: Procs,
    net: Net,
    name: String,
}

impl Cluster {
    fn start(n: usize, fast: bool) -> Cluster {
        let mut net = Net::new(n);
        net.start_redis();
        let name = rollcall_tests::unique_id("split");
        let procs = Procs((0..n).map(|i| net.silo(i, &name, fast)).collect());
        let c = Cluster { procs, net, name };
        c.await_all_active(Duration::from_secs(60));
        c
    }

    fn status(&self) -> Vec<String> {
        status(&self.net.store(), &self.name).1
    }

    fn of(&self, lines: &[String], i: usize) -> Option<String> {
        status_of(&self.net, lines, i)
    }

    fn running(&mut self, i: usize) -> bool {
        self.procs.0[i].try_wait().expect("wait").is_none()
    }

    /// Waits until every silo is Active.
    fn await_all_active(&self, limit: Duration) {
        let started = Instant::now();
        loop {
            let lines = self.status();
            if (0..self.net.n).all(|i| self.of(&lines, i).as_deref() == Some("Active")) {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "not all Active within {limit:?}: {lines:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every silo is Dead in the table or exited ("fallen"), or running
    /// and Active; returns the fallen ones.
    fn await_settled(&mut self, limit: Duration) -> Vec<usize> {
        let started = Instant::now();
        loop {
            let lines = self.status();
            let fell = self.fallen_in(&lines);
            if (0..self.net.n).all(|i| fell.contains(&i) || self.of(&lines, i).as_deref() == Some("Active")) {
                return fell;
            }
            assert!(
                started.elapsed() < limit,
                "not settled within {limit:?}: {lines:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Watches for `length`: every silo in `protected` stays Active and running.
    fn hold(&mut self, length: Duration, protected: &[usize], what: &str) {
        let started = Instant::now();
        while started.elapsed() < length {
            let lines = self.status();
            for &i in protected {
                let s = self.of(&lines, i);
                assert!(
                    s.as_deref() == Some("Active") && self.running(i),
                    "{what}: silo {i} is {s:?} (running: {}): {lines:#?}",
                    self.running(i)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The silos that are Dead in the table or have exited.
    fn fallen(&mut self) -> Vec<usize> {
        let lines = self.status();
        self.fallen_in(&lines)
    }

    /// [`fallen`](Self::fallen) by `lines` of `rollcall status`.
    fn fallen_in(&mut self, lines: &[String]) -> Vec<usize> {
        (0..self.net.n)
            .filter(|i| self.of(lines, *i).as_deref() == Some("Dead") || !self.running(*i))
            .collect()
    }
}

const SPLIT: Duration = Duration::from_secs(10);

/// Runs a 10-s split with `sides` in the fast and the default profile; `protected`
/// silos must never fall; after healing, those still running are all Active again,
/// and only silos outside `protected` may have fallen.
fn split_scenario(sides: &[u8], protected: &[usize], what: &str) {
    if !capable() {
        return;
    }
    for fast in [true, false] {
        let what = format!("{what} ({})", if fast { "fast" } else { "default" });
        let mut c = Cluster::start(sides.len(), fast);
        c.net.split(sides);
        c.hold(SPLIT, protected, &what);
        c.net.heal();
        // A declaration may still land after the heal: wait until every silo has
        // either fallen or is running and Active, then look at who fell.
        let fell = c.await_settled(Duration::from_secs(60));
        assert!(
            fell.iter().all(|i| !protected.contains(i)),
            "{what}: {fell:?} fell"
        );
        eprintln!("{what}: fallen {fell:?}");
    }
}

/// 2|3 for 10 s: the 3 never die; the 2 are declared Dead (and stop) or survive.
#[test]
fn partition_2_3_never_takes_down_the_majority() {
    split_scenario(&[1, 1, 0, 0, 0], &[2, 3, 4], "split 2|3");
}

/// 2|2|1 for 10 s: no side holds a majority, nobody dies, and after healing all
/// five are Active in one view.
#[test]
fn partition_2_2_1_without_a_majority_kills_nobody() {
    split_scenario(&[0, 0, 1, 1, 2], &[0, 1, 2, 3, 4], "split 2|2|1");
}

/// 1|4 for 10 s: only the isolated silo may die.
#[test]
fn partition_1_4_only_the_isolated_silo_may_die() {
    split_scenario(&[1, 0, 0, 0, 0], &[1, 2, 3, 4], "isolation 1|4");
}

/// 3 of 5 SIGKILLed at once: the 2 survivors hold no majority, so they wait for the
/// table's witness (the 3 stop heartbeating; `--fast`: stale after 3 x 2 s, from
/// the newest heartbeat) and then declare them Dead after one suspicion window of
/// doubled timeouts: 13.25 s at most in virtual time, 20 s allowed here; the 2 keep
/// running.
#[test]
fn partition_mass_crash_of_3_of_5_is_declared_through_stale_heartbeats() {
    if !capable() {
        return;
    }
    let mut c = Cluster::start(5, true);
    for i in 2..5 {
        c.procs.0[i].kill().expect("SIGKILL");
    }
    let killed = Instant::now();
    loop {
        let lines = c.status();
        if (2..5).all(|i| c.of(&lines, i).as_deref() == Some("Dead")) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the 3 killed silos were not declared Dead within 20 s: {lines:#?}"
        );
        for i in 0..2 {
            assert!(c.running(i), "survivor {i} exited: {lines:#?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("mass crash: declared in {:?}", killed.elapsed());
    c.hold(Duration::from_secs(3), &[0, 1], "after a mass crash");
}

/// Ten flaps of 1.0 s isolating one silo (below the 1.5-s `--fast` tolerance), then
/// one silo cut off from the store (not its peers) for 30 s: nobody dies.
#[test]
fn partition_flaps_and_a_store_outage_kill_nobody() {
    if !capable() {
        return;
    }
    let mut c = Cluster::start(5, true);
    let all = [0, 1, 2, 3, 4];
    for _ in 0..10 {
        c.net.split(&[1, 0, 0, 0, 0]);
        std::thread::sleep(Duration::from_millis(1_000));
        c.net.heal();
        c.hold(Duration::from_millis(1_000), &all, "flapping");
    }
    c.net.cut_store(0);
    c.hold(Duration::from_secs(30), &[1, 2, 3, 4], "silo 0 without the store");
    c.net.heal();
    c.await_all_active(Duration::from_secs(30));
    assert!(c.fallen().is_empty(), "{:?}", c.status());
}

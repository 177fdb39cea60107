//! The `carts` example (examples/carts.rs) as a cluster of processes on a real
//! store (issue 59): 1,000 HTTP counters driven at a steady rate through a
//! rolling deploy of 5 silo processes and then 3 SIGKILLs. Each increment
//! has a request id and is retried (on any silo) until acknowledged; at the
//! end every cart's stored count must equal its acknowledged increments: none
//! lost, none applied twice.
//!
//! It also measures how long two activations of one cart coexisted (from
//! each process's `activated` / `deactivated` lines; a killed process's end at
//! its kill), and prints it.

#![cfg(any(feature = "redis", feature = "etcd"))]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollcall_core::{StateKey, StateStorage, Timestamp};
use rollcall_tests::fixtures::free_port;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const CARTS: usize = 1_000;
const CLIENTS: usize = 32;
/// Each client's pause between two increments (at most 32 / 0.05 s = 640/s;
/// the round trips make it less).
const PAUSE: Duration = Duration::from_millis(50);

/// An activation line: (process, actor, epoch, ms, activated).
type Events = Arc<Mutex<Vec<(usize, String, u64, u64, bool)>>>;

/// The times (UTC ms) of the `fenced` lines: writes the store refused.
static FENCED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

struct Process {
    child: Child,
    http: String,
    index: usize,
    /// The silo's address, as its `ready` line names it.
    silo: String,
}

async fn start(index: usize, url: &str, cluster: &str, events: &Events) -> Process {
    start_with(index, url, cluster, events, &[]).await
}

/// [`start`] with more environment variables for the process.
async fn start_with(
    index: usize,
    url: &str,
    cluster: &str,
    events: &Events,
    env: &[(&str, String)],
) -> Process {
    let silo = format!("127.0.0.1:{}", free_port().expect("port"));
    let http = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_carts"))
        .args([url, cluster, &silo, &http])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn carts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(a) = line.strip_prefix("ready ") {
                return Some(a.to_owned());
            }
        }
        None
    })
    .await;
    let Ok(Some(silo)) = ready else {
        panic!("carts process {index} did not get ready");
    };
    let events = events.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let w: Vec<&str> = line.split_whitespace().collect();
            if let ([kind, actor, epoch, ms, ..], true) = (&w[..], w.len() >= 4) {
                let (Ok(epoch), Ok(ms)) = (epoch.parse(), ms.parse()) else {
                    continue;
                };
                let on = match *kind {
                    "activated" => true,
                    "deactivated" => false,
                    "fenced" => {
                        FENCED.lock().unwrap().push(ms);
                        continue;
                    }
                    _ => continue,
                };
                events
                    .lock()
                    .unwrap()
                    .push((index, actor.to_string(), epoch, ms, on));
            }
        }
    });
    Process {
        child,
        http,
        index,
        silo,
    }
}

fn signal(p: &Process, sig: &str) {
    let pid = p.child.id().expect("running");
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{sig}");
}

/// The load: `CLIENTS` clients, each owning the carts `i % CLIENTS == c`,
/// adding one to its next cart, retrying it on the live silos until it is
/// acknowledged (at most 120 s), until `stop`. The acknowledged count per
/// cart.
struct Load {
    silos: Rc<RefCell<Vec<String>>>,
    acked: Rc<RefCell<Vec<u64>>>,
    stop: Rc<std::cell::Cell<bool>>,
    failed: Rc<RefCell<Vec<String>>>,
    /// Per cart: when it was last acknowledged, and the longest time
    /// between two of its acknowledgements (or from [`Load::gaps_from`] to
    /// the first after it).
    gaps: Rc<RefCell<Vec<(tokio::time::Instant, Duration)>>>,
}

impl Load {
    fn start(silos: Vec<String>) -> (Load, Vec<tokio::task::JoinHandle<()>>) {
        let load = Load {
            silos: Rc::new(RefCell::new(silos)),
            acked: Rc::new(RefCell::new(vec![0; CARTS])),
            stop: Rc::default(),
            failed: Rc::default(),
            gaps: Rc::new(RefCell::new(vec![
                (tokio::time::Instant::now(), Duration::ZERO);
                CARTS
            ])),
        };
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let (silos, acked, stop, failed, gaps) = (
                load.silos.clone(),
                load.acked.clone(),
                load.stop.clone(),
                load.failed.clone(),
                load.gaps.clone(),
            );
            tasks.push(actix::spawn(async move {
                let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
                let mine: Vec<usize> = (c..CARTS).step_by(CLIENTS).collect();
                let mut turn = 0usize;
                let mut attempt = 0usize;
                while !stop.get() {
                    let cart = mine[turn % mine.len()];
                    let request = acked.borrow()[cart] + 1;
                    let started = tokio::time::Instant::now();
                    loop {
                        let target = {
                            let s = silos.borrow();
                            s[attempt % s.len()].clone()
                        };
                        attempt += 1;
                        let url = format!("http://{target}/cart/{cart}/add/{request}");
                        match client.post(url).send().await {
                            Ok(mut r) if r.status().is_success() => {
                                let body = r.body().await.unwrap_or_default();
                                let n: u64 = std::str::from_utf8(&body)
                                    .ok()
                                    .and_then(|b| b.parse().ok())
                                    .unwrap_or(0);
                                if n != request {
                                    failed
                                        .borrow_mut()
                                        .push(format!("cart {cart}: request {request} answered count {n}"));
                                }
                                acked.borrow_mut()[cart] = request;
                                let now = tokio::time::Instant::now();
                                let (last, longest) = &mut gaps.borrow_mut()[cart];
                                *longest = (*longest).max(now - *last);
                                *last = now;
                                break;
                            }
                            _ => {
                                if started.elapsed() > Duration::from_secs(120) {
                                    failed
                                        .borrow_mut()
                                        .push(format!("cart {cart}: request {request} never acknowledged"));
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                    turn += 1;
                    tokio::time::sleep(PAUSE).await;
                }
            }));
        }
        (load, tasks)
    }

    /// Measures the gaps from now on only (the clients' start, the carts'
    /// first activations, are not a fault's doing).
    fn gaps_from_now(&self) {
        let now = tokio::time::Instant::now();
        for g in self.gaps.borrow_mut().iter_mut() {
            *g = (now, Duration::ZERO);
        }
    }

    /// The longest gap between two acknowledgements of one cart, and the cart.
    fn longest_gap(&self) -> (Duration, usize) {
        let gaps = self.gaps.borrow();
        let (cart, (_, gap)) = gaps
            .iter()
            .enumerate()
            .max_by_key(|(_, (_, g))| *g)
            .expect("carts");
        (*gap, cart)
    }
}

/// The carts whose stored count is not their acknowledged increments
/// (`acked[cart]`): (cart, stored, acknowledged).
async fn wrong_counts(states: &StateStorage, acked: &[u64]) -> Vec<(usize, u64, u64)> {
    let mut wrong = Vec::new();
    for (cart, want) in acked.iter().enumerate() {
        let read = states
            .read(&StateKey::new(format!("cart/{cart}"), "cart").expect("key"))
            .await
            .expect("read");
        let count = if read.record_exists {
            serde_json::from_slice::<serde_json::Value>(&read.data).expect("a cart")["count"]
                .as_u64()
                .expect("count")
        } else {
            0
        };
        if count != *want {
            wrong.push((cart, count, *want));
        }
    }
    wrong
}

/// The longest time two activations of one actor on different processes
/// overlapped, ms, and how many actors had any overlap. An activation ends at
/// its `deactivated` line, or at `ends[process]`.
fn coexistence(events: &[(usize, String, u64, u64, bool)], ends: &BTreeMap<usize, u64>) -> (u64, usize) {
    let mut open: BTreeMap<(usize, String, u64), u64> = BTreeMap::new();
    let mut spans: BTreeMap<String, Vec<(usize, u64, u64)>> = BTreeMap::new();
    for (p, actor, epoch, ms, on) in events {
        let key = (*p, actor.clone(), *epoch);
        if *on {
            open.insert(key, *ms);
        } else if let Some(from) = open.remove(&key) {
            spans.entry(actor.clone()).or_default().push((*p, from, *ms));
        }
    }
    for ((p, actor, _), from) in open {
        let to = ends.get(&p).copied().unwrap_or(from);
        spans.entry(actor).or_default().push((p, from, to));
    }
    let (mut longest, mut actors) = (0, 0);
    for s in spans.values() {
        let mut any = false;
        for (i, a) in s.iter().enumerate() {
            for b in &s[i + 1..] {
                if a.0 != b.0 {
                    let overlap = a.2.min(b.2).saturating_sub(a.1.max(b.1));
                    if overlap > 0 {
                        any = true;
                        longest = longest.max(overlap);
                    }
                }
            }
        }
        actors += usize::from(any);
    }
    (longest, actors)
}

async fn counters_survive_a_rolling_deploy_and_kills(url: &str) {
    let cluster = rollcall_tests::unique_id("carts");
    let events: Events = Arc::default();
    let mut ends = BTreeMap::new();
    let mut procs = Vec::new();
    for i in 0..5 {
        procs.push(start(i, url, &cluster, &events).await);
    }
    let (load, tasks) = Load::start(procs.iter().map(|p| p.http.clone()).collect());
    let live = |procs: &[Process]| procs.iter().map(|p| p.http.clone()).collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_secs(2)).await; // load before the first change
    let mut next = procs.len();
    let rolling_from = Timestamp::now().as_millis();
    // A rolling deploy: a new process, then the oldest leaves gracefully.
    for _ in 0..5 {
        procs.push(start(next, url, &cluster, &events).await);
        next += 1;
        *load.silos.borrow_mut() = live(&procs);
        let mut old = procs.remove(0);
        *load.silos.borrow_mut() = live(&procs);
        signal(&old, "TERM");
        let status = tokio::time::timeout(Duration::from_secs(60), old.child.wait())
            .await
            .expect("a graceful leave within 60 s")
            .expect("wait");
        assert!(status.success(), "carts {} exited with {status}", old.index);
        ends.insert(old.index, Timestamp::now().as_millis());
    }
    let rolling_to = Timestamp::now().as_millis();
    // Three crashes, each replaced 3 s later (pacing, not a condition: the
    // survivors take over meanwhile or after; the counts checked at the end
    // hold either way).
    for _ in 0..3 {
        let mut victim = procs.remove(0);
        *load.silos.borrow_mut() = live(&procs);
        victim.child.start_kill().expect("SIGKILL");
        let _ = victim.child.wait().await;
        ends.insert(victim.index, Timestamp::now().as_millis());
        tokio::time::sleep(Duration::from_secs(3)).await;
        procs.push(start(next, url, &cluster, &events).await);
        next += 1;
        *load.silos.borrow_mut() = live(&procs);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    load.stop.set(true);
    for t in tasks {
        t.await.expect("a client");
    }
    let failed = load.failed.borrow().clone();
    assert!(failed.is_empty(), "{failed:?}");
    let acked = load.acked.borrow().clone();
    let total: u64 = acked.iter().sum();
    let end = Timestamp::now().as_millis();
    for p in &procs {
        ends.insert(p.index, end);
    }

    // Every cart's stored count is its acknowledged increments.
    let store = rollcall::connect(url).await.expect("connect");
    let states = StateStorage::new(store.state_table(&cluster).expect("state table"));
    let wrong = wrong_counts(&states, &acked).await;
    let (longest, actors) = coexistence(&events.lock().unwrap(), &ends);
    let fenced = FENCED.lock().unwrap().clone();
    let in_rolling = fenced
        .iter()
        .filter(|t| (rolling_from..=rolling_to).contains(*t))
        .count();
    eprintln!(
        "carts: {total} increments acknowledged over {CARTS} carts through 5 graceful replacements and \
         3 kills; {} carts wrong; two activations of one cart coexisted on {actors} carts, at most {longest} ms; \
         {} writes fenced, {in_rolling} of them during the rolling deploy",
        wrong.len(),
        fenced.len()
    );
    let untouched = acked.iter().filter(|n| **n == 0).count();
    assert_eq!(untouched, 0, "every cart was incremented ({total} in all)");
    assert!(wrong.is_empty(), "(cart, stored, acknowledged): {wrong:?}");
}

/// Issue 72, item 6: a carts process listens before its membership row
/// advertises its HTTP port (a connection made the moment a row names the
/// port is accepted; peers forward there as soon as they read it), and one
/// frozen (SIGSTOP) until its peers declare it Dead exits 70 when it wakes
/// and reads itself Dead (`OnDeclaredDead`'s code, not 1).
async fn a_carts_silo_listens_before_it_advertises_and_exits_70_when_dead(url: &str) {
    use rollcall_core::{ProtocolMode, SiloStatus};
    let cluster = rollcall_tests::unique_id("carts-life");
    let events: Events = Arc::default();
    let store = rollcall::connect(url).await.expect("connect");
    let table = store
        .membership_table(&cluster, ProtocolMode::Extended)
        .expect("membership table");
    let first = start(0, url, &cluster, &events).await;
    let known = first.http.rsplit(':').next().expect("port").to_owned();
    // The second process's row, caught as soon as it is written, and its
    // port connected to at once.
    let watch = {
        let table = table.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no second row within 60 s"
                );
                if let Ok(snapshot) = table.read_all().await {
                    let advertised = snapshot
                        .rows()
                        .map(|e| e.proxy_port)
                        .find(|p| *p != 0 && p.to_string() != known);
                    if let Some(port) = advertised {
                        let connected = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
                        return (port, connected.map(|_| ()).map_err(|e| e.to_string()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let second = start(1, url, &cluster, &events).await;
    let (port, connected) = watch.await.expect("the watch");
    assert_eq!(
        second.http.rsplit(':').next(),
        Some(port.to_string().as_str()),
        "the row caught is the second process's"
    );
    assert!(
        connected.is_ok(),
        "the advertised port {port} refused a connection the moment it was advertised: {connected:?}"
    );
    // Frozen until declared Dead, then woken.
    let mut frozen = first;
    signal(&frozen, "STOP");
    let declared = tokio::time::Instant::now();
    loop {
        let snapshot = table.read_all().await.expect("read the table");
        if snapshot
            .rows()
            .any(|e| e.silo.to_string() == frozen.silo && e.status == SiloStatus::Dead)
        {
            break;
        }
        assert!(
            declared.elapsed() < Duration::from_secs(60),
            "the frozen silo was not declared Dead within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal(&frozen, "CONT");
    let status = tokio::time::timeout(Duration::from_secs(30), frozen.child.wait())
        .await
        .expect("the woken silo exits within 30 s")
        .expect("wait");
    assert_eq!(
        status.code(),
        Some(70),
        "the woken silo read itself Dead: {status}"
    );
    let mut second = second;
    signal(&second, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), second.child.wait())
        .await
        .expect("a graceful leave within 30 s")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "a graceful leave: {status}");
}

/// Where Debian's libfaketime puts its multi-threaded build.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The holder of each of the service's 1,024 shards (`None`: released,
/// vacant, or its read failed this time), read at once.
async fn holders(leases: &rollcall_core::lease::ShardLeases) -> Vec<Option<String>> {
    let all: Vec<u32> = (0..rollcall_core::DEFAULT_SHARDS).collect();
    holders_of(leases, &all).await
}

/// The holder of each of `shards`, as [`holders`].
async fn holders_of(leases: &rollcall_core::lease::ShardLeases, shards: &[u32]) -> Vec<Option<String>> {
    use rollcall_core::lease::LeaseStatus;
    let reads = shards.iter().map(|k| leases.read_head(*k));
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .map(|r| {
            r.ok()
                .filter(|l| l.status == LeaseStatus::Owned)
                .and_then(|l| l.owner.map(|o| o.to_string()))
        })
        .collect()
}

/// The lease row of each of `shards` (a failed read: `None`).
async fn lease_heads(
    leases: &rollcall_core::lease::ShardLeases,
    shards: &[u32],
) -> Vec<Option<rollcall_core::lease::ShardLease>> {
    let reads = shards.iter().map(|k| leases.read_head(*k));
    futures_util::future::join_all(reads)
        .await
        .into_iter()
        .map(Result::ok)
        .collect()
}

/// When a silo's shards left it, as the store shows it: times since the fault.
struct MoveTimeline {
    /// When its membership row first said its clock is beyond the bound.
    flagged: Option<Duration>,
    /// Per shard: first seen not Owned by the silo (released or taken).
    left: Vec<Option<Duration>>,
    /// Per shard: first seen Owned by another silo.
    taken: Vec<Option<Duration>>,
}

impl MoveTimeline {
    fn new(shards: usize) -> Self {
        Self {
            flagged: None,
            left: vec![None; shards],
            taken: vec![None; shards],
        }
    }

    fn saw(&mut self, now: Duration, heads: &[Option<rollcall_core::lease::ShardLease>], silo: &str) {
        use rollcall_core::lease::LeaseStatus;
        for (i, head) in heads.iter().enumerate() {
            let Some(l) = head else { continue };
            let owner = l.owner.map(|o| o.to_string());
            let owned = l.status == LeaseStatus::Owned;
            if self.left[i].is_none() && !(owned && owner.as_deref() == Some(silo)) {
                self.left[i] = Some(now);
            }
            if self.taken[i].is_none() && owned && owner.as_deref().is_some_and(|o| o != silo) {
                self.taken[i] = Some(now);
            }
        }
    }

    fn all_moved(&self) -> bool {
        self.taken.iter().all(Option::is_some)
    }

    fn not_moved(&self) -> usize {
        self.taken.iter().filter(|t| t.is_none()).count()
    }
}

impl std::fmt::Display for MoveTimeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn span(times: &[Option<Duration>]) -> String {
            let mut seen: Vec<Duration> = times.iter().flatten().copied().collect();
            seen.sort();
            match (seen.first(), seen.get(seen.len() / 2), seen.last()) {
                (Some(a), Some(m), Some(z)) => {
                    format!(
                        "{} of {}: first {a:.1?}, median {m:.1?}, last {z:.1?}",
                        seen.len(),
                        times.len()
                    )
                }
                _ => format!("0 of {}", times.len()),
            }
        }
        write!(
            f,
            "row says beyond the bound at {:.1?}; left the silo {}; Owned by another {}",
            self.flagged,
            span(&self.left),
            span(&self.taken)
        )
    }
}

/// Issue 70's (c), on the carts example itself: four carts processes under
/// the clients' load, each one's wall clock under libfaketime's control
/// (`LD_PRELOAD`, monotonic time left alone): the one holding the most
/// shards has its clock run 3 s ahead while it still answers probes and
/// serves HTTP. Every shard is Owned by another silo within the lease
/// period plus `lease_poll` plus the time to measure the step and spread the
/// row (5 s), plus the 1 s libfaketime takes to read its file; none goes back
/// to it while its clock is off; once right, it holds shards again. The
/// carts are served throughout: every increment is acknowledged (retried on
/// any silo), the longest time between two acknowledgements of one cart
/// stays under 15 s (a takeover, plus a client's turn through its other
/// carts), and every stored count is its acknowledged increments. The fault
/// lasts 8 s in CI; `ROLLCALL_CLOCK_FAULT_S=90` runs the 90 s.
async fn a_carts_silo_whose_clock_runs_ahead_leaves_the_ring(url: &str) {
    if !std::path::Path::new(FAKETIME).exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{FAKETIME} is missing (scripts/backends.sh installs libfaketime)"
        );
        eprintln!("skipped: {FAKETIME} is missing");
        return;
    }
    let fault_for = Duration::from_secs(
        std::env::var("ROLLCALL_CLOCK_FAULT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    );
    let cluster = rollcall_tests::unique_id("carts-clock");
    let dir = std::env::temp_dir().join(&cluster);
    std::fs::create_dir_all(&dir).expect("dir");
    let events: Events = Arc::default();
    let mut procs = Vec::new();
    let mut clocks = Vec::new();
    for i in 0..4 {
        let spec = dir.join(format!("clock-{i}"));
        std::fs::write(&spec, "+0\n").expect("clock spec");
        let env = [
            ("LD_PRELOAD", FAKETIME.to_owned()),
            ("FAKETIME_TIMESTAMP_FILE", spec.display().to_string()),
            ("FAKETIME_CACHE_DURATION", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ];
        procs.push(start_with(i, url, &cluster, &events, &env).await);
        clocks.push(spec);
    }
    let (load, tasks) = Load::start(procs.iter().map(|p| p.http.clone()).collect());
    let all_served = rollcall_tests::sim::wait_for(Duration::from_secs(60), || {
        load.acked.borrow().iter().all(|n| *n > 0)
    })
    .await;
    assert!(all_served.is_some(), "every cart is served within 60 s");
    load.gaps_from_now();

    let conn = rollcall::connect(url).await.expect("connect");
    let leases = rollcall_core::lease::ShardLeases::open(
        conn.lease_table(&cluster).expect("lease table"),
        rollcall_core::DEFAULT_SHARDS,
    )
    .await
    .expect("leases");
    let before = holders(&leases).await;
    let victim = (0..procs.len())
        .max_by_key(|i| {
            before
                .iter()
                .filter(|h| h.as_deref() == Some(procs[*i].silo.as_str()))
                .count()
        })
        .expect("four");
    let victim_silo = procs[victim].silo.clone();
    let held_before = before
        .iter()
        .filter(|h| h.as_deref() == Some(victim_silo.as_str()))
        .count();
    assert!(held_before > 0, "the faulted silo holds shards");

    // The move is timed on the victim's shards alone: a read of all 1,024
    // leases takes long enough on a loaded machine to blur the bound.
    let victims: Vec<u32> = (0..rollcall_core::DEFAULT_SHARDS)
        .filter(|k| before[*k as usize].as_deref() == Some(victim_silo.as_str()))
        .collect();
    let members = conn
        .membership_table(&cluster, rollcall_core::ProtocolMode::Extended)
        .expect("membership table");
    std::fs::write(&clocks[victim], "+3\n").expect("clock spec");
    let faulted_at = tokio::time::Instant::now();
    // Where the time goes, as the store shows it (read every 100 ms): when the
    // silo's row first says its clock is beyond the bound, and when each of
    // its shards was first seen not Owned by it, then Owned by another.
    let mut timeline = MoveTimeline::new(victims.len());
    let moved_in = loop {
        let h = lease_heads(&leases, &victims).await;
        let now = faulted_at.elapsed();
        timeline.saw(now, &h, &victim_silo);
        if timeline.flagged.is_none() {
            let flagged = members.read_all().await.ok().is_some_and(|snap| {
                snap.entries
                    .iter()
                    .any(|r| r.entry.silo.to_string() == victim_silo && r.entry.clock_beyond_bound)
            });
            if flagged {
                timeline.flagged = Some(faulted_at.elapsed());
            }
        }
        if timeline.all_moved() {
            break now;
        }
        assert!(
            now < Duration::from_secs(30),
            "30 s after its clock ran 3 s ahead, {} shards are not held by another silo ({})",
            timeline.not_moved(),
            timeline
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // And every shard of the service is Owned by another silo.
    let all_elsewhere = tokio::time::Instant::now();
    loop {
        let h = holders(&leases).await;
        if h.iter().all(|o| o.as_ref().is_some_and(|o| *o != victim_silo)) {
            break;
        }
        assert!(
            all_elsewhere.elapsed() < Duration::from_secs(10),
            "{} of 1,024 shards are not Owned by another silo",
            h.iter()
                .filter(|o| o.as_ref().is_none_or(|o| *o == victim_silo))
                .count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held_off = tokio::time::Instant::now();
    while held_off.elapsed() < fault_for {
        let h = holders(&leases).await;
        let back = h
            .iter()
            .filter(|o| o.as_deref() == Some(victim_silo.as_str()))
            .count();
        assert_eq!(back, 0, "shards went back to the silo while its clock was off");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    std::fs::write(&clocks[victim], "+0\n").expect("clock spec");
    let right_at = tokio::time::Instant::now();
    loop {
        let h = holders(&leases).await;
        if h.iter().any(|o| o.as_deref() == Some(victim_silo.as_str())) {
            break;
        }
        assert!(
            right_at.elapsed() < Duration::from_secs(30),
            "30 s after its clock is right the silo holds no shard"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back_in = right_at.elapsed();
    // A few more turns of every client after the handoffs back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop.set(true);
    for t in tasks {
        t.await.expect("a client");
    }
    let failed = load.failed.borrow().clone();
    assert!(failed.is_empty(), "{failed:?}");
    let (gap, gap_cart) = load.longest_gap();
    let acked = load.acked.borrow().clone();
    let states = StateStorage::new(conn.state_table(&cluster).expect("state table"));
    let wrong = wrong_counts(&states, &acked).await;
    let running = procs.iter_mut().all(|p| matches!(p.child.try_wait(), Ok(None)));
    eprintln!(
        "carts clock: {held_before} shards left the silo 3 s ahead in {moved_in:?}, none back for \
         {fault_for:?}, shards back {back_in:?} after its clock was right; {} increments \
         acknowledged; longest gap between two of one cart's {gap:?} (cart {gap_cart}); {} fenced writes",
        acked.iter().sum::<u64>(),
        FENCED.lock().unwrap().len()
    );
    assert!(running, "every carts process still runs");
    eprintln!("carts clock: {timeline}");
    assert!(
        moved_in <= Duration::from_secs(2 + 1 + 2 + 1),
        "the shards left the silo 3 s ahead in {moved_in:?} ({timeline})"
    );
    assert!(
        gap < Duration::from_secs(15),
        "cart {gap_cart} went {gap:?} between two acknowledged increments"
    );
    assert!(wrong.is_empty(), "(cart, stored, acknowledged): {wrong:?}");
    for p in &procs {
        signal(p, "TERM");
    }
}

#[cfg(feature = "redis")]
#[actix::test]
async fn a_carts_silo_on_redis_whose_clock_runs_ahead_leaves_the_ring() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    a_carts_silo_whose_clock_runs_ahead_leaves_the_ring(&b.endpoint).await;
}

/// Fails under CI's load: in the Docker-alone pass (three tests at once on
/// two cores, etcd in a container) the faulted silo's 301 shards left it
/// in 6.14 s (bound 6 s) and one cart went 18.5 s between two acknowledged
/// increments (bound 15 s) while the silos' membership shared its one
/// thread with the deliveries and the carts' handlers. With membership,
/// reminders and the store's connections on threads of their own (issue
/// 73, item 1) it still failed there: 291 shards left in 8.4 s, a cart
/// went 16.4 s unserved. Passes on an idle machine (53 s). Not yet known:
/// how much of the 8.4 s is the 300 lease writes on a loaded etcd and how
/// much the beyond-the-bound row reaching every silo.
#[cfg(feature = "etcd")]
#[actix::test]
#[ignore = "misses its 6-s and 15-s bounds under CI's load on etcd (issue 73): run with --ignored"]
async fn a_carts_silo_on_etcd_whose_clock_runs_ahead_leaves_the_ring() {
    let Some(b) = rollcall_tests::fixtures::etcd().await else {
        return;
    };
    a_carts_silo_whose_clock_runs_ahead_leaves_the_ring(&format!("etcd://{}", b.endpoint)).await;
}

#[cfg(feature = "redis")]
#[actix::test]
async fn a_carts_silo_on_redis_listens_before_it_advertises_and_exits_70_when_dead() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    a_carts_silo_listens_before_it_advertises_and_exits_70_when_dead(&b.endpoint).await;
}

#[cfg(feature = "redis")]
#[actix::test]
async fn carts_on_redis_count_exactly_through_a_rolling_deploy_and_kills() {
    let Some(b) = rollcall_tests::fixtures::redis().await else {
        return;
    };
    counters_survive_a_rolling_deploy_and_kills(&b.endpoint).await;
}

#[cfg(feature = "etcd")]
#[actix::test]
async fn carts_on_etcd_count_exactly_through_a_rolling_deploy_and_kills() {
    let Some(b) = rollcall_tests::fixtures::etcd().await else {
        return;
    };
    counters_survive_a_rolling_deploy_and_kills(&format!("etcd://{}", b.endpoint)).await;
}

//! State writes fenced by the shard leases, across silo processes on a real
//! store (issue 59): a silo hosting 100 actors (each one's state written under
//! the fence of the shard lease it holds) is frozen (SIGSTOP), or cut from its
//! peers while the store stays reachable, until the others declared it Dead
//! and took every one of those shards over; then it writes every actor's
//! state again under its old fences. The store must refuse all 100
//! (`Error::Fenced`), and no state may change.

#![cfg(any(feature = "redis", feature = "etcd"))]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rollcall_core::lease::{LeaseStatus, ShardLeases};
use rollcall_core::{ProtocolMode, SiloStatus, StateKey, StateStorage, SystemStore, DEFAULT_SHARDS};
use rollcall_tests::fixtures::free_port;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

const ACTORS: usize = 100;

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// A `fenced-silo` process: its stdin, its stdout lines and its address.
struct Silo {
    child: Child,
    stdin: ChildStdin,
    lines: Lines,
    address: String,
}

impl Silo {
    /// Starts one and waits (at most 60 s) for `ready ADDRESS`.
    async fn start(cluster: &str, url: &str) -> Silo {
        let listen = format!("127.0.0.1:{}", free_port().expect("free port"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_fenced-silo"))
            .arg(cluster)
            .arg(url)
            .arg(&listen)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn fenced-silo");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let address = tokio::time::timeout(Duration::from_secs(60), async {
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
        .expect("fenced-silo did not get ready within 60 s");
        Silo {
            child,
            stdin,
            lines,
            address,
        }
    }

    /// Sends `command` and waits (at most 60 s) for its answer line, starting
    /// with `ok VERB` or `err VERB`.
    async fn ask(&mut self, command: &str) -> String {
        let verb = command.split_whitespace().next().expect("a verb");
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("send a command");
        self.stdin.flush().await.expect("flush");
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                if line.starts_with(&format!("ok {verb}")) || line.starts_with(&format!("err {verb}")) {
                    return Some(line);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no answer to `{command}` within 60 s"))
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal}");
    }
}

/// Waits (at most 60 s, reading every 200 ms) until `victim` is Dead in the
/// membership table and every shard of `hosted` is held by another silo at a
/// later epoch; the time it took.
async fn wait_taken_over(
    store: &Arc<dyn SystemStore>,
    cluster: &str,
    victim: &str,
    hosted: &BTreeMap<u32, u64>,
) -> Duration {
    let table = store
        .membership_table(cluster, ProtocolMode::Extended)
        .expect("membership table");
    let leases = ShardLeases::open(store.lease_table(cluster).expect("lease table"), DEFAULT_SHARDS)
        .await
        .expect("leases");
    let started = std::time::Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(60) {
        let snapshot = table.read_all().await.expect("read the table");
        let dead = snapshot
            .rows()
            .any(|e| e.silo.to_string() == victim && e.status == SiloStatus::Dead);
        let mut moved = 0;
        for (shard, epoch) in hosted {
            let lease = leases.read(*shard).await.expect("read a lease");
            if lease.status == LeaseStatus::Owned
                && lease.epoch > *epoch
                && lease.owner.is_some_and(|o| o.to_string() != victim)
            {
                moved += 1;
            }
        }
        if dead && moved == hosted.len() {
            return started.elapsed();
        }
        last = format!("dead: {dead}, shards taken over: {moved} of {}", hosted.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("not taken over within 60 s ({last})");
}

/// How the victim is separated from its peers.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// SIGSTOP: a process paused (a GC pause, a VM frozen); SIGCONT before
    /// its writes.
    Frozen,
    /// Its probes cut from every peer both ways, the store reachable.
    Partitioned,
}

async fn stale_owner_writes_nothing(url: &str, fault: Fault) {
    let cluster = rollcall_tests::unique_id("fenced");
    let mut victim = Silo::start(&cluster, url).await;
    let mut b = Silo::start(&cluster, url).await;
    let mut c = Silo::start(&cluster, url).await;
    let answer = victim.ask(&format!("host {ACTORS}")).await;
    let mut actors = Vec::new();
    let fences: Vec<(u32, u64)> = answer
        .strip_prefix(&format!("ok host {ACTORS} "))
        .unwrap_or_else(|| panic!("host: {answer}"))
        .split(' ')
        .map(|f| {
            let mut parts = f.split('@');
            let (a, s, e) = (parts.next(), parts.next(), parts.next());
            actors.push(a.expect("ACTOR@SHARD@EPOCH").to_owned());
            (
                s.and_then(|s| s.parse().ok()).expect("shard"),
                e.and_then(|e| e.parse().ok()).expect("epoch"),
            )
        })
        .collect();
    let holds = format!("holds {}", actors.join(" "));
    assert_eq!(fences.len(), ACTORS);
    let hosted: BTreeMap<u32, u64> = fences.iter().copied().collect();

    let store = rollcall::connect(url).await.expect("connect");
    let states = StateStorage::new(store.state_table(&cluster).expect("state table"));
    match fault {
        Fault::Frozen => victim.signal("STOP"),
        Fault::Partitioned => {
            let a = victim.ask("cut 120000").await;
            assert_eq!(a, "ok cut");
        }
    }
    let took = wait_taken_over(&store, &cluster, &victim.address, &hosted).await;
    eprintln!(
        "{fault:?}: declared Dead and {} shards taken over {took:?} after the fault",
        hosted.len()
    );
    // The states as the new holders have them now.
    let mut before = Vec::new();
    let mut i = 0;
    while before.len() < ACTORS {
        let key = StateKey::new(format!("cart/{i}"), "cart").expect("key");
        let read = states.read(&key).await.expect("read");
        if read.record_exists {
            before.push((key, read));
        }
        i += 1;
        assert!(i < 100_000, "only {} hosted states found", before.len());
    }
    if let Fault::Frozen = fault {
        victim.signal("CONT");
    }
    // Whether the stale silo and a successor both act as holders of one
    // hosted actor's shard (`Reminders::fence` answers on both: two
    // activations could coexist), sampled every 20 ms or so until the stale
    // silo holds none and the successors hold them all.
    let since = std::time::Instant::now();
    let (mut both_since, mut coexisted, mut dropped) = (None, Duration::ZERO, None);
    loop {
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "within 60 s the stale silo holds none and the successors hold all"
        );
        let listed =
            |a: &str| -> BTreeSet<String> { a.split_whitespace().skip(3).map(str::to_owned).collect() };
        let stale = listed(&victim.ask(&holds).await);
        let mut successors = listed(&b.ask(&holds).await);
        successors.extend(listed(&c.ask(&holds).await));
        if dropped.is_none() && stale.is_empty() {
            dropped = Some(since.elapsed());
        }
        let shared = stale.intersection(&successors).count();
        match (shared > 0, both_since) {
            (true, None) => both_since = Some(std::time::Instant::now()),
            (false, Some(t)) => {
                coexisted = coexisted.max(t.elapsed());
                both_since = None;
            }
            _ => {}
        }
        if stale.is_empty() && successors.len() == ACTORS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{fault:?}: from {}, the stale silo held none after {:?}; the successors held all after {:?}; \
         one actor's shard held by both for at most {coexisted:?} (sampled every ~20 ms)",
        match fault {
            Fault::Frozen => "its resumption",
            Fault::Partitioned => "the takeover's observation",
        },
        dropped.unwrap_or_default(),
        since.elapsed(),
    );
    assert_eq!(
        coexisted,
        Duration::ZERO,
        "the stale silo and a successor both held one actor's shard"
    );
    let answer = victim.ask("write").await;
    assert_eq!(
        answer,
        format!("ok write landed=0 fenced={ACTORS} other=0"),
        "every write of the stale owner is refused by the store"
    );
    for (key, read) in before {
        let now = states.read(&key).await.expect("read");
        assert_eq!((now.data, now.etag), (read.data, read.etag), "{key} changed");
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    async fn url() -> Option<(rollcall_tests::fixtures::Backend, String)> {
        let backend = rollcall_tests::fixtures::redis().await?;
        let url = backend.endpoint.clone();
        Some((backend, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_owner_on_redis_writes_no_state_after_its_takeover() {
        let Some((_b, url)) = url().await else { return };
        stale_owner_writes_nothing(&url, Fault::Frozen).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitioned_owner_on_redis_writes_no_state_after_its_takeover() {
        let Some((_b, url)) = url().await else { return };
        stale_owner_writes_nothing(&url, Fault::Partitioned).await;
    }
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;

    async fn url() -> Option<(rollcall_tests::fixtures::Backend, String)> {
        let backend = rollcall_tests::fixtures::etcd().await?;
        let url = format!("etcd://{}", backend.endpoint);
        Some((backend, url))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_owner_on_etcd_writes_no_state_after_its_takeover() {
        let Some((_b, url)) = url().await else { return };
        stale_owner_writes_nothing(&url, Fault::Frozen).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitioned_owner_on_etcd_writes_no_state_after_its_takeover() {
        let Some((_b, url)) = url().await else { return };
        stale_owner_writes_nothing(&url, Fault::Partitioned).await;
    }
}

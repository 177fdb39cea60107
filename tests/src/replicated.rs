//! Replicated Redis for failover tests: a Redis Cluster of 3 masters with a replica
//! each ([`ReplicatedCluster`]), and a primary with a replica behind three
//! sentinels ([`Sentinels`]). Every server is an [`OwnServer`]: the local
//! `redis-server`, or the Redis image in a container on the host's network when
//! it is not installed (or `ROLLCALL_BACKEND_SOURCE=docker`), so Docker alone is
//! enough. The cluster is formed with `CLUSTER MEET`, `CLUSTER ADDSLOTSRANGE` and
//! `CLUSTER REPLICATE` sent by the redis crate (no `redis-cli` needed).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::fixtures::{free_cluster_port, free_port, wait_for_port, OwnServer, Server};

/// How long a Redis Cluster node may be unreachable before it is failed over
/// (`cluster-node-timeout`), and how long a sentinel waits before it calls the
/// primary down (`down-after-milliseconds`).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(2000);

/// A directory removed on drop; world-writable, so that a server in a container
/// (user `redis`) can write its files there.
#[derive(Debug)]
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Result<Dir, String> {
        let dir = std::env::temp_dir().join(crate::unique_id(what));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        open_up(&dir)?;
        Ok(Dir(dir))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open_up(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o777 } else { 0o666 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())
}

async fn con(port: u16) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map_err(|e| format!("connect to {port}: {e}"))
}

async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    let mut c = con(port).await?;
    cmd.query_async(&mut c).await.map_err(|e| format!("{port}: {e}"))
}

/// Polls `check` every 100 ms until it answers true, for at most `within`.
async fn until<F, Fut>(what: &str, within: Duration, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Waits (at most `within`) until the server on `port` is a replica in sync
/// with its master.
async fn in_sync(port: u16, within: Duration) -> Result<(), String> {
    until("a replica in sync", within, || async move {
        query::<String>(port, redis::cmd("INFO").arg("replication"))
            .await
            .is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
    })
    .await
}

/// Waits (at most 30 s) until the cluster node on `port` reports
/// `cluster_state:ok`.
async fn cluster_ok(port: u16) -> Result<(), String> {
    until("cluster_state:ok", Duration::from_secs(30), || async move {
        query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
            .await
            .is_ok_and(|i| i.contains("cluster_state:ok"))
    })
    .await
}

/// The base flags of every server: loopback, no persistence, files in a
/// directory of its own under `dir`.
fn base_args(port: u16, dir: &Path) -> Result<Vec<String>, String> {
    let dir = own_dir(dir, port)?;
    Ok([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec())
}

/// A directory of its own for the server on `port` (its `dump.rdb`: a replica
/// writes the snapshot of a full sync there), world-writable like `dir`.
fn own_dir(dir: &Path, port: u16) -> Result<PathBuf, String> {
    let own = dir.join(format!("s{port}"));
    std::fs::create_dir_all(&own).map_err(|e| e.to_string())?;
    open_up(&own)?;
    Ok(own)
}

async fn spawn(args: Vec<String>, dir: &Path, port: u16) -> Result<OwnServer, String> {
    let log = dir.join(format!("server-{port}.log"));
    let server = OwnServer::spawn(Server::Redis, &args, &[dir], &log).await?;
    wait_for_port(([127, 0, 0, 1], port).into(), Duration::from_secs(30)).await?;
    Ok(server)
}

/// A Redis Cluster of 3 masters (nodes 0, 1, 2) with a replica each (node
/// `3 + i` replicates node `i`), `cluster-node-timeout` [`NODE_TIMEOUT`].
#[derive(Debug)]
pub struct ReplicatedCluster {
    /// The nodes' ports, in the order above.
    pub ports: Vec<u16>,
    servers: Vec<Option<OwnServer>>,
    args: Vec<Vec<String>>,
    dir: Dir,
}

impl ReplicatedCluster {
    /// Starts and forms the cluster, and waits until every node reports
    /// `cluster_state:ok` and every replica is in sync with its master.
    ///
    /// # Errors
    /// When a server cannot be started or the cluster does not form within 60 s.
    pub async fn start() -> Result<ReplicatedCluster, String> {
        let dir = Dir::new("redis-replicated")?;
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        let mut node_args = Vec::new();
        for _ in 0..6 {
            let port = free_cluster_port().map_err(|e| e.to_string())?;
            let mut args = base_args(port, &dir.0)?;
            args.extend([
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-node-timeout".to_owned(),
                NODE_TIMEOUT.as_millis().to_string(),
                "--cluster-config-file".to_owned(),
                dir.0.join(format!("nodes-{port}.conf")).display().to_string(),
            ]);
            servers.push(Some(spawn(args.clone(), &dir.0, port).await?));
            ports.push(port);
            node_args.push(args);
        }
        let c = ReplicatedCluster {
            ports,
            servers,
            args: node_args,
            dir,
        };
        c.form().await?;
        Ok(c)
    }

    async fn form(&self) -> Result<(), String> {
        let p = &self.ports;
        for &other in &p[1..] {
            let () = query(
                p[0],
                redis::cmd("CLUSTER").arg("MEET").arg("127.0.0.1").arg(other),
            )
            .await?;
        }
        for (i, (lo, hi)) in [(0, 5460), (5461, 10922), (10923, 16383)].into_iter().enumerate() {
            let () = query(p[i], redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(lo).arg(hi)).await?;
        }
        for &port in p {
            until(
                "every node knows the others",
                Duration::from_secs(30),
                || async move {
                    query::<String>(port, redis::cmd("CLUSTER").arg("NODES"))
                        .await
                        .is_ok_and(|n| n.lines().count() == 6)
                },
            )
            .await?;
        }
        for i in 0..3 {
            let id: String = query(p[i], redis::cmd("CLUSTER").arg("MYID")).await?;
            let () = query(p[3 + i], redis::cmd("CLUSTER").arg("REPLICATE").arg(&id)).await?;
        }
        for &port in p {
            cluster_ok(port).await?;
        }
        for &port in &p[3..] {
            in_sync(port, Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    /// The `redis+cluster://` URL naming the three masters as seeds, with `query`
    /// (e.g. `?wait_replicas=1`) appended.
    pub fn url(&self, query: &str) -> String {
        let seeds: Vec<String> = self.ports[..3].iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}{query}", seeds.join(","))
    }

    /// The index of the node that serves `slot` as master now, asked of any
    /// live node.
    ///
    /// # Errors
    /// When no live node answers `CLUSTER SLOTS`.
    pub async fn master_of(&self, slot: u16) -> Result<usize, String> {
        for (i, port) in self.ports.iter().enumerate() {
            if self.servers[i].is_none() {
                continue;
            }
            let Ok(v) = query::<redis::Value>(*port, redis::cmd("CLUSTER").arg("SLOTS")).await else {
                continue;
            };
            let redis::Value::Array(ranges) = v else { continue };
            for r in ranges {
                let redis::Value::Array(parts) = r else { continue };
                let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi)), Some(redis::Value::Array(m))) =
                    (parts.first(), parts.get(1), parts.get(2))
                else {
                    continue;
                };
                if (*lo..=*hi).contains(&i64::from(slot)) {
                    if let Some(redis::Value::Int(p)) = m.get(1) {
                        return self
                            .ports
                            .iter()
                            .position(|q| i64::from(*q) == *p)
                            .ok_or_else(|| format!("unknown port {p}"));
                    }
                }
            }
        }
        Err("no live node answers CLUSTER SLOTS".into())
    }

    /// Kills node `i` at once (as a crash).
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.servers[i].take() {
            s.kill().await;
        }
    }

    /// Starts node `i` again (killed before), with its `nodes.conf`: it rejoins
    /// the cluster as a replica of the master that took its slots over. Waits
    /// until it is in sync.
    ///
    /// # Errors
    /// When it cannot be started or is not in sync within 60 s.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        let port = self.ports[i];
        self.servers[i] = Some(spawn(self.args[i].clone(), &self.dir.0, port).await?);
        in_sync(port, Duration::from_secs(60)).await
    }

    /// Waits until `slot` is served by a live master other than `dead` and every
    /// live node reports `cluster_state:ok`: the failover is over. Returns how
    /// long it took.
    ///
    /// # Errors
    /// When it is not within 30 s.
    pub async fn failed_over(&self, slot: u16, dead: usize) -> Result<Duration, String> {
        let start = Instant::now();
        until("the replica promoted", Duration::from_secs(30), || async move {
            self.master_of(slot)
                .await
                .is_ok_and(|m| m != dead && self.servers[m].is_some())
        })
        .await?;
        for (i, &port) in self.ports.iter().enumerate() {
            if self.servers[i].is_none() {
                continue;
            }
            cluster_ok(port).await?;
        }
        Ok(start.elapsed())
    }
}

/// The name the sentinels monitor.
pub const MASTER_NAME: &str = "rollcall-primary";

/// A primary and a replica behind three sentinels (quorum 2,
/// `down-after-milliseconds` [`NODE_TIMEOUT`], `failover-timeout` 4 s, or 120 s
/// with a replication proxy).
#[derive(Debug)]
pub struct Sentinels {
    /// The two data servers' ports (server 0 starts as the primary).
    pub ports: [u16; 2],
    /// The sentinels' ports.
    pub sentinel_ports: [u16; 3],
    servers: [Option<OwnServer>; 2],
    _sentinels: Vec<OwnServer>,
    /// The proxy the replica reaches the primary through, when started so.
    replication: Option<crate::delay::DelayProxy>,
    dir: Dir,
}

/// How long a paused replication holds what the primary sends: longer than
/// any test runs.
const PAUSED: Duration = Duration::from_secs(3600);

impl Sentinels {
    /// Starts the primary, its replica (in sync) and three sentinels that agree
    /// on both.
    ///
    /// # Errors
    /// When a server cannot be started or the set-up is not ready within 60 s.
    pub async fn start() -> Result<Sentinels, String> {
        Sentinels::start_with(false).await
    }

    /// As [`start`](Sentinels::start), but the replica reaches the primary
    /// through a [`DelayProxy`](crate::delay::DelayProxy), so that
    /// [`pause_replication`](Sentinels::pause_replication) can stop what the
    /// primary acknowledges from reaching it (an asynchronous replica that
    /// lags, as Redis replication allows). The sentinels' `failover-timeout`
    /// is 120 s: a sentinel rewrites a replica that follows another address
    /// than the primary's once that long has passed (`+fix-slave-config`),
    /// so the proxy holds for the first 120 s.
    ///
    /// # Errors
    /// As [`start`](Sentinels::start).
    pub async fn start_with_replication_proxy() -> Result<Sentinels, String> {
        Sentinels::start_with(true).await
    }

    /// From now on, nothing the primary sends reaches the replica (held by
    /// the proxy for an hour) while the replication link stays up: the
    /// replica is still the one the sentinels promote. A no-op unless
    /// started with [`start_with_replication_proxy`](Sentinels::start_with_replication_proxy).
    pub fn pause_replication(&self) {
        if let Some(p) = &self.replication {
            p.set_delay(PAUSED);
        }
    }

    /// Waits (at most `within`) until the replica has applied everything
    /// the primary has written (`WAIT 1` answered by the primary).
    ///
    /// # Errors
    /// When the primary does not answer or the replica does not catch up.
    pub async fn replicated(&self, within: Duration) -> Result<(), String> {
        let primary = self.ports[self.primary().await?];
        let ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        let acked: u64 = query(primary, redis::cmd("WAIT").arg(1).arg(ms)).await?;
        if acked >= 1 {
            Ok(())
        } else {
            Err(format!("the replica did not catch up within {within:?}"))
        }
    }

    async fn start_with(proxied: bool) -> Result<Sentinels, String> {
        let dir = Dir::new("redis-sentinel")?;
        let ports = [
            free_port().map_err(|e| e.to_string())?,
            free_port().map_err(|e| e.to_string())?,
        ];
        let primary = spawn(base_args(ports[0], &dir.0)?, &dir.0, ports[0]).await?;
        let replication = if proxied {
            Some(crate::delay::DelayProxy::start(([127, 0, 0, 1], ports[0]).into()).await)
        } else {
            None
        };
        let follows = replication.as_ref().map_or(ports[0], |p| p.addr().port());
        let mut replica_args = base_args(ports[1], &dir.0)?;
        replica_args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            follows.to_string(),
        ]);
        let replica = spawn(replica_args, &dir.0, ports[1]).await?;
        in_sync(ports[1], Duration::from_secs(30)).await?;
        let mut sentinels = Vec::new();
        let mut sentinel_ports = [0; 3];
        for port in &mut sentinel_ports {
            *port = free_port().map_err(|e| e.to_string())?;
            let conf = dir.0.join(format!("sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                 sentinel failover-timeout {MASTER_NAME} {failover}\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.0.display(),
                primary = ports[0],
                down = NODE_TIMEOUT.as_millis(),
                failover = if proxied { 120_000 } else { 4_000 },
            );
            std::fs::write(&conf, text).map_err(|e| e.to_string())?;
            open_up(&conf)?;
            let args = vec![conf.display().to_string(), "--sentinel".to_owned()];
            sentinels.push(spawn(args, &dir.0, *port).await?);
        }
        let s = Sentinels {
            ports,
            sentinel_ports,
            servers: [Some(primary), Some(replica)],
            _sentinels: sentinels,
            replication,
            dir,
        };
        for &sp in &s.sentinel_ports {
            until(
                "the sentinel sees the replica and its peers",
                Duration::from_secs(30),
                || async move {
                    let master: Result<Vec<String>, String> =
                        query(sp, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME)).await;
                    let Ok(fields) = master else { return false };
                    let field = |name: &str| {
                        fields
                            .iter()
                            .position(|f| f == name)
                            .and_then(|i| fields.get(i + 1))
                            .and_then(|v| v.parse::<u32>().ok())
                    };
                    field("num-slaves") == Some(1) && field("num-other-sentinels") == Some(2)
                },
            )
            .await?;
        }
        Ok(s)
    }

    /// The `redis+sentinel://` URL, with `query` appended.
    pub fn url(&self, query: &str) -> String {
        let s: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}{query}", s.join(","))
    }

    /// The index (0 or 1) of the server the sentinels name as primary now.
    ///
    /// # Errors
    /// When no sentinel answers.
    pub async fn primary(&self) -> Result<usize, String> {
        for &sp in &self.sentinel_ports {
            let addr: Result<Vec<String>, String> = query(
                sp,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME),
            )
            .await;
            if let Ok(addr) = addr {
                if let Some(port) = addr.get(1).and_then(|p| p.parse::<u16>().ok()) {
                    return self
                        .ports
                        .iter()
                        .position(|p| *p == port)
                        .ok_or_else(|| format!("unknown primary port {port}"));
                }
            }
        }
        Err("no sentinel answers".into())
    }

    /// Kills server `i` at once (as a crash).
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.servers[i].take() {
            s.kill().await;
        }
    }

    /// Starts server `i` again, empty, on its port; the sentinels make it a
    /// replica of the current primary. Waits until it is in sync.
    ///
    /// # Errors
    /// When it cannot be started or is not in sync within 60 s.
    pub async fn restart_as_replica(&mut self, i: usize) -> Result<(), String> {
        let port = self.ports[i];
        self.servers[i] = Some(spawn(base_args(port, &self.dir.0)?, &self.dir.0, port).await?);
        in_sync(port, Duration::from_secs(60)).await
    }

    /// Waits until the sentinels name a live server other than `dead` as primary
    /// and it answers as one. Returns how long it took.
    ///
    /// # Errors
    /// When it does not within 30 s.
    pub async fn failed_over(&self, dead: usize) -> Result<Duration, String> {
        let start = Instant::now();
        until("the replica promoted", Duration::from_secs(30), || async move {
            match self.primary().await {
                Ok(p) if p != dead => query::<String>(self.ports[p], redis::cmd("INFO").arg("replication"))
                    .await
                    .is_ok_and(|i| i.contains("role:master")),
                _ => false,
            }
        })
        .await?;
        Ok(start.elapsed())
    }
}

impl ReplicatedCluster {
    /// The slot of `key`, asked of a live node (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    /// When no live node answers.
    pub async fn slot_of(&self, key: &str) -> Result<u16, String> {
        for (i, port) in self.ports.iter().enumerate() {
            if self.servers[i].is_some() {
                if let Ok(slot) = query::<u16>(*port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await {
                    return Ok(slot);
                }
            }
        }
        Err("no live node answers CLUSTER KEYSLOT".into())
    }

    /// Whether node `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.servers[i].is_some()
    }
}

/// What a counter workload ([`count_through`]) saw, per state.
#[derive(Debug, Default)]
pub struct CounterReport {
    /// Increments `update()` acknowledged.
    pub acked: Vec<u64>,
    /// Increments whose `update()` failed other than by a conflict: applied or
    /// not (an [`OutcomeUnknown`](rollcall_core::Error::OutcomeUnknown)
    /// or a transient error).
    pub ambiguous: Vec<u64>,
    /// The value read back at the end.
    pub finals: Vec<u64>,
}

impl CounterReport {
    /// Acknowledged increments missing from the final values, summed over the
    /// states: what a failover lost.
    pub fn lost(&self) -> u64 {
        self.acked
            .iter()
            .zip(&self.finals)
            .map(|(a, f)| a.saturating_sub(*f))
            .sum()
    }

    /// Panics unless every state's final value is at least its acknowledged
    /// increments and at most those plus its ambiguous ones.
    pub fn assert_none_lost(&self) {
        for (i, ((a, m), f)) in self
            .acked
            .iter()
            .zip(&self.ambiguous)
            .zip(&self.finals)
            .enumerate()
        {
            assert!(
                *f >= *a && *f <= a + m,
                "state {i}: final {f}, acknowledged {a}, ambiguous {m}: {self}"
            );
        }
    }
}

impl std::fmt::Display for CounterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sum = |v: &[u64]| v.iter().sum::<u64>();
        write!(
            f,
            "{} increments acknowledged, {} ambiguous, final sum {}, {} acknowledged lost",
            sum(&self.acked),
            sum(&self.ambiguous),
            sum(&self.finals),
            self.lost()
        )
    }
}

/// A counter workload on actor state: `writers` tasks, each with its own
/// `PersistentState<u64>` handle on state `w % states` of a fresh service,
/// increment it with `update()` until `stop` resolves; then every state is read
/// back (retried for up to 60 s while the store recovers).
///
/// # Panics
/// When the store cannot be opened, or a final value cannot be read in 60 s.
pub async fn count_through(
    url: &str,
    writers: usize,
    states: usize,
    stop: impl std::future::Future<Output = ()>,
) -> CounterReport {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use rollcall::state::{PersistentState, StateKey, StateStorage};

    let store = rollcall::connect(url).await.expect("connect");
    let storage = StateStorage::new(
        store
            .state_table(&crate::unique_id("counters"))
            .expect("state table"),
    );
    let actor = crate::unique_id("counter");
    let keys: Vec<StateKey> = (0..states)
        .map(|i| StateKey::new(format!("counter/{actor}-{i}"), "n").expect("key"))
        .collect();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..states).map(|_| AtomicU64::new(0)).collect());
    let ambiguous: Arc<Vec<AtomicU64>> = Arc::new((0..states).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let i = w % states;
        let state: PersistentState<u64> = PersistentState::new(storage.clone(), keys[i].clone());
        let (acked, ambiguous, done) = (acked.clone(), ambiguous.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                match state.update(|v| *v += 1).await {
                    Ok(()) => {
                        acked[i].fetch_add(1, Ordering::Relaxed);
                    }
                    Err(rollcall_core::Error::InconsistentState { .. }) => {}
                    Err(_) => {
                        ambiguous[i].fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    stop.await;
    done.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a writer");
    }
    let mut finals = Vec::new();
    for key in &keys {
        let deadline = Instant::now() + Duration::from_secs(60);
        let value = loop {
            match storage.read(key).await {
                Ok(r) if r.data.is_empty() => break 0,
                Ok(r) => break serde_json::from_slice::<u64>(&r.data).expect("a counter"),
                Err(e) if Instant::now() > deadline => panic!("read {key} back: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        finals.push(value);
    }
    let load = |v: &[AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    CounterReport {
        acked: load(&acked),
        ambiguous: load(&ambiguous),
        finals,
    }
}

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

/// The base flags of every server: loopback, no persistence, files in `dir`.
fn base_args(port: u16, dir: &Path) -> Vec<String> {
    [
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
    .to_vec()
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
    _dir: Dir,
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
        for _ in 0..6 {
            let port = free_cluster_port().map_err(|e| e.to_string())?;
            let mut args = base_args(port, &dir.0);
            args.extend(
                [
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-node-timeout".to_owned(),
                    NODE_TIMEOUT.as_millis().to_string(),
                    "--cluster-config-file".to_owned(),
                    dir.0.join(format!("nodes-{port}.conf")).display().to_string(),
                ]
                .into_iter(),
            );
            servers.push(Some(spawn(args, &dir.0, port).await?));
            ports.push(port);
        }
        let c = ReplicatedCluster {
            ports,
            servers,
            _dir: dir,
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
            until("cluster_state:ok", Duration::from_secs(30), || async move {
                query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            })
            .await?;
        }
        for &port in &p[3..] {
            until("the replica in sync", Duration::from_secs(30), || async move {
                query::<String>(port, redis::cmd("INFO").arg("replication"))
                    .await
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            })
            .await?;
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
            until(
                "cluster_state:ok after the failover",
                Duration::from_secs(30),
                || async move {
                    query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))
                        .await
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                },
            )
            .await?;
        }
        Ok(start.elapsed())
    }
}

/// The name the sentinels monitor.
pub const MASTER_NAME: &str = "rollcall-primary";

/// A primary and a replica behind three sentinels (quorum 2,
/// `down-after-milliseconds` [`NODE_TIMEOUT`], `failover-timeout` 4 s).
#[derive(Debug)]
pub struct Sentinels {
    /// The two data servers' ports (server 0 starts as the primary).
    pub ports: [u16; 2],
    /// The sentinels' ports.
    pub sentinel_ports: [u16; 3],
    servers: [Option<OwnServer>; 2],
    _sentinels: Vec<OwnServer>,
    dir: Dir,
}

impl Sentinels {
    /// Starts the primary, its replica (in sync) and three sentinels that agree
    /// on both.
    ///
    /// # Errors
    /// When a server cannot be started or the set-up is not ready within 60 s.
    pub async fn start() -> Result<Sentinels, String> {
        let dir = Dir::new("redis-sentinel")?;
        let ports = [
            free_port().map_err(|e| e.to_string())?,
            free_port().map_err(|e| e.to_string())?,
        ];
        let primary = spawn(base_args(ports[0], &dir.0), &dir.0, ports[0]).await?;
        let mut replica_args = base_args(ports[1], &dir.0);
        replica_args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            ports[0].to_string(),
        ]);
        let replica = spawn(replica_args, &dir.0, ports[1]).await?;
        until("the replica in sync", Duration::from_secs(30), || async move {
            query::<String>(ports[1], redis::cmd("INFO").arg("replication"))
                .await
                .is_ok_and(|i| i.contains("master_link_status:up"))
        })
        .await?;
        let mut sentinels = Vec::new();
        let mut sentinel_ports = [0; 3];
        for port in &mut sentinel_ports {
            *port = free_port().map_err(|e| e.to_string())?;
            let conf = dir.0.join(format!("sentinel-{port}.conf"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.0.display(),
                primary = ports[0],
                down = NODE_TIMEOUT.as_millis(),
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
        self.servers[i] = Some(spawn(base_args(port, &self.dir.0), &self.dir.0, port).await?);
        until(
            "the restarted server in sync as a replica",
            Duration::from_secs(60),
            || async move {
                query::<String>(port, redis::cmd("INFO").arg("replication"))
                    .await
                    .is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
            },
        )
        .await
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

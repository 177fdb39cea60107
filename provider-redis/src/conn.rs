//! Connections: per node, a pool of dedicated connections for WATCH transactions
//! (deadpool, with a manager of our own: a checkout costs no round trip) and one
//! auto-reconnecting multiplexed connection for plain reads and heartbeats. In Redis
//! Cluster mode, the node that owns a hash tag's slot is found with `CLUSTER SLOTS`
//! and refreshed on a `MOVED` redirection. An `ASK` redirection (the slot is being
//! migrated and the keys already moved) is followed once, on connections that send
//! `ASKING` before every command, without touching the slot map.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use rollcall_membership_core::{redact_password, Error, Result};
use tokio::sync::{OnceCell, RwLock};

use crate::config::RedisConfig;
use crate::keys::slot;

/// A Redis client error as a rollcall error.
pub(crate) fn backend(what: &str, e: RedisError) -> Error {
    Error::backend_with(format!("redis: {what}"), e)
}

/// A cluster redirection in a rollcall error.
#[derive(Debug, PartialEq, Eq)]
enum Redirect {
    /// The slot moved for good: refresh the slot map.
    Moved,
    /// The slot is migrating and the keys are on this node (`host:port`): ask it
    /// once, with `ASKING`.
    Ask(String),
}

fn redirect(e: &Error) -> Option<Redirect> {
    let Error::Backend { source: Some(s), .. } = e else {
        return None;
    };
    let re = s.downcast_ref::<RedisError>()?;
    match re.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => Some(Redirect::Moved),
        ErrorKind::Server(ServerErrorKind::Ask) => {
            ask_address(re).map(Redirect::Ask).or(Some(Redirect::Moved))
        }
        _ => None,
    }
}

/// The `host:port` of an `ASK` reply: of the error itself, or of the first `ASK`
/// among a pipeline's failures (each of its commands is redirected alike).
fn ask_address(re: &RedisError) -> Option<String> {
    if let Some((addr, _)) = re.redirect_node() {
        return Some(addr.to_owned());
    }
    let failures = re.clone().into_server_errors()?;
    let (_, ask) = failures
        .iter()
        .find(|(_, e)| e.kind() == Some(ServerErrorKind::Ask))?;
    // The details are "<slot> <host:port>".
    ask.details()?.split_ascii_whitespace().nth(1).map(str::to_owned)
}

/// A connection that sends `ASKING` right before each command or pipeline it
/// carries (in the same write, so that no other request of a multiplexed
/// connection comes between), or a plain one. `ASKING` lets the importing node of a
/// migrating slot serve the next command; before `MULTI` it holds for the whole
/// transaction (Redis keeps the flag while a transaction is queued).
#[derive(Clone)]
pub(crate) struct Conn<C> {
    inner: C,
    asking: bool,
}

impl<C: Link + Send> redis::aio::ConnectionLike for Conn<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        if !self.asking {
            return self.inner.link().req_packed_command(cmd);
        }
        Box::pin(async move {
            let mut p = redis::pipe();
            p.cmd("ASKING").add_command(cmd.clone());
            let mut replies = self.inner.link().req_packed_commands(&p, 1, 1).await?;
            replies
                .pop()
                .ok_or_else(|| RedisError::from((ErrorKind::Client, "no reply after ASKING")))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        if !self.asking {
            return self.inner.link().req_packed_commands(pipeline, offset, count);
        }
        Box::pin(async move {
            let mut p = redis::pipe();
            if pipeline.is_transaction() {
                // ASKING, then the transaction spelled out (MULTI ... EXEC as plain
                // commands): the flag holds while MULTI queues, so one is enough; the
                // replies asked for are one further on.
                p.cmd("ASKING").cmd("MULTI");
                for c in pipeline.cmd_iter() {
                    p.add_command(c.clone());
                }
                p.cmd("EXEC");
                return self.inner.link().req_packed_commands(&p, offset + 1, count).await;
            }
            // Outside a transaction the flag lasts one command: ASKING before each,
            // and the replies asked for are every second one.
            for c in pipeline.cmd_iter() {
                p.cmd("ASKING").add_command(c.clone());
            }
            let replies = self
                .inner
                .link()
                .req_packed_commands(&p, 0, 2 * pipeline.len())
                .await?;
            Ok(replies
                .into_iter()
                .skip(1)
                .step_by(2)
                .skip(offset)
                .take(count)
                .collect())
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.link_ref().get_db()
    }
}

/// The shared multiplexed connection of a node.
pub(crate) type Shared = Conn<ConnectionManager>;

/// What a [`Conn`] wraps: a connection, or a pool's handle on one.
pub(crate) trait Link {
    fn link(&mut self) -> &mut (dyn redis::aio::ConnectionLike + Send);
    fn link_ref(&self) -> &(dyn redis::aio::ConnectionLike + Send);
}

impl Link for ConnectionManager {
    fn link(&mut self) -> &mut (dyn redis::aio::ConnectionLike + Send) {
        self
    }
    fn link_ref(&self) -> &(dyn redis::aio::ConnectionLike + Send) {
        self
    }
}

/// One Redis server.
pub(crate) struct Node {
    pub(crate) url: String,
    client: redis::Client,
    pool: deadpool::managed::Pool<WatchConnections>,
    shared: OnceCell<ConnectionManager>,
    timeout: std::time::Duration,
    /// Reached by an `ASK` redirection: every command goes after `ASKING`.
    asking: bool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("url", &redact_password(&self.url))
            .finish()
    }
}

/// A pooled connection held for one transaction.
pub(crate) type Dedicated = Conn<deadpool::managed::Object<WatchConnections>>;

impl Link for deadpool::managed::Object<WatchConnections> {
    fn link(&mut self) -> &mut (dyn redis::aio::ConnectionLike + Send) {
        &mut **self
    }
    fn link_ref(&self) -> &(dyn redis::aio::ConnectionLike + Send) {
        &**self
    }
}

/// Connections checked out with [`Dedicated`] must be handed back with no WATCH
/// pending (the write path ends every transaction with `EXEC` or `UNWATCH`) and are
/// dropped, not returned, after any error ([`discard`]). So a checkout needs no
/// `UNWATCH` + `PING` round trip (deadpool-redis' recycle); only a connection idle for
/// longer than [`IDLE_CHECK`] is pinged first, so one that died while idle (a server
/// restart) is replaced instead of failing an operation.
#[derive(Debug)]
pub(crate) struct WatchConnections {
    client: redis::Client,
    timeout: std::time::Duration,
}

/// Idle time after which a pooled connection is checked with `PING` on checkout.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

impl deadpool::managed::Manager for WatchConnections {
    type Type = redis::aio::MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> std::result::Result<Self::Type, Self::Error> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
    }

    async fn recycle(
        &self,
        conn: &mut Self::Type,
        metrics: &deadpool::managed::Metrics,
    ) -> deadpool::managed::RecycleResult<Self::Error> {
        if metrics.last_used() >= IDLE_CHECK {
            redis::cmd("PING").query_async::<()>(conn).await?;
        }
        Ok(())
    }
}

/// Drops a dedicated connection instead of returning it to the pool (its WATCH
/// state is unknown after an error).
pub(crate) fn discard(con: Dedicated) {
    drop(deadpool::managed::Object::take(con.inner));
}

impl Node {
    fn new(url: &str, cfg: &RedisConfig) -> Result<Node> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::invalid_config("store_url", format!("{}: {e}", redact_password(url))))?;
        let timeouts = deadpool::managed::Timeouts {
            wait: Some(cfg.timeout),
            create: Some(cfg.timeout),
            recycle: Some(cfg.timeout),
        };
        let pool = deadpool::managed::Pool::builder(WatchConnections {
            client: client.clone(),
            timeout: cfg.timeout,
        })
        .max_size(cfg.pool_size)
        .timeouts(timeouts)
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| Error::invalid_config("store_url", format!("{}: {e}", redact_password(url))))?;
        Ok(Node {
            url: url.to_owned(),
            client,
            pool,
            shared: OnceCell::new(),
            timeout: cfg.timeout,
            asking: false,
        })
    }

    /// The shared multiplexed connection (reconnects by itself after failures).
    pub(crate) async fn shared(&self) -> Result<Shared> {
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let inner = self
            .shared
            .get_or_try_init(|| async { self.client.get_connection_manager_with_config(cfg).await })
            .await
            .cloned()
            .map_err(|e| backend(&format!("connect to {}", redact_password(&self.url)), e))?;
        Ok(Conn {
            inner,
            asking: self.asking,
        })
    }

    /// A dedicated pooled connection (for WATCH ... EXEC).
    pub(crate) async fn dedicated(&self) -> Result<Dedicated> {
        let inner = self.pool.get().await.map_err(|e| {
            Error::backend_with(
                format!("redis: pooled connection to {}", redact_password(&self.url)),
                e,
            )
        })?;
        Ok(Conn {
            inner,
            asking: self.asking,
        })
    }

    /// Bounds an operation by the configured timeout.
    pub(crate) async fn timed<T>(&self, what: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.timeout, fut).await.unwrap_or_else(|_| {
            Err(Error::backend(format!(
                "redis: {what} timed out after {:?}",
                self.timeout
            )))
        })
    }
}

/// Finds the node for a hash tag.
#[derive(Debug)]
pub(crate) enum Router {
    Standalone(Arc<Node>),
    Cluster(Box<ClusterRouter>),
}

#[derive(Debug)]
pub(crate) struct ClusterRouter {
    cfg: RedisConfig,
    /// (first slot, last slot, node URL), from CLUSTER SLOTS.
    slots: RwLock<Vec<(u16, u16, String)>>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Nodes reached by `ASK` redirections (see [`ClusterRouter::asking_node`]).
    asking_nodes: Mutex<HashMap<String, Arc<Node>>>,
    scheme_and_auth: String,
    /// `/#insecure` or `/` for TLS nodes, empty otherwise.
    suffix: String,
}

impl Router {
    pub(crate) fn new(cfg: &RedisConfig) -> Result<Router> {
        if !cfg.cluster {
            let url = cfg
                .nodes
                .first()
                .ok_or_else(|| Error::invalid_config("store_url", "no node"))?;
            return Ok(Router::Standalone(Arc::new(Node::new(url, cfg)?)));
        }
        let seed = cfg
            .nodes
            .first()
            .ok_or_else(|| Error::invalid_config("store_url", "no seed node"))?;
        let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
        let auth = rest
            .rsplit_once('@')
            .map(|(a, _)| format!("{a}@"))
            .unwrap_or_default();
        let suffix = if seed.ends_with("#insecure") {
            "/#insecure"
        } else if cfg.tls {
            "/"
        } else {
            ""
        };
        Ok(Router::Cluster(Box::new(ClusterRouter {
            cfg: cfg.clone(),
            slots: RwLock::new(Vec::new()),
            nodes: Mutex::new(HashMap::new()),
            asking_nodes: Mutex::new(HashMap::new()),
            scheme_and_auth: format!("{scheme}://{auth}"),
            suffix: suffix.to_owned(),
        })))
    }

    /// The node owning `tag`'s slot.
    pub(crate) async fn node(&self, tag: &str) -> Result<Arc<Node>> {
        match self {
            Router::Standalone(n) => Ok(n.clone()),
            Router::Cluster(c) => c.node_for(slot(tag), false).await,
        }
    }

    /// Runs `op` on the node of `tag`. After a `MOVED` redirection (resharding),
    /// refreshes the slot map and runs it once more; after an `ASK` (a slot half
    /// migrated), runs it once on the node named, each command after `ASKING`, and
    /// leaves the slot map as it is. A multi-key command whose keys are split
    /// between the two nodes meanwhile gets `TRYAGAIN`: a transient
    /// [`Error::Backend`] the caller retries.
    /// Runs `script` with `keys` and `args` on the shared connection of the node
    /// that serves `tag`'s slot, bounded by the node's timeout (see [`Node::timed`]).
    pub(crate) async fn invoke<T: redis::FromRedisValue + Send, A: redis::ToRedisArgs + Sync>(
        &self,
        tag: &str,
        what: &'static str,
        script: &'static redis::Script,
        keys: &[String],
        args: &[A],
    ) -> Result<T> {
        self.run(tag, |node: Arc<Node>| async move {
            node.timed(what, async {
                let mut con = node.shared().await?;
                let mut invocation = script.prepare_invoke();
                for k in keys {
                    invocation.key(k);
                }
                for a in args {
                    invocation.arg(a);
                }
                invocation
                    .invoke_async(&mut con)
                    .await
                    .map_err(|e| backend(what, e))
            })
            .await
        })
        .await
    }

    /// Runs `cmd` on the shared connection of the node that serves `tag`'s slot,
    /// bounded by the node's timeout.
    pub(crate) async fn query<T: redis::FromRedisValue + Send>(
        &self,
        tag: &str,
        what: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        self.run(tag, |node: Arc<Node>| async move {
            node.timed(what, async {
                let mut con = node.shared().await?;
                cmd.query_async(&mut con).await.map_err(|e| backend(what, e))
            })
            .await
        })
        .await
    }

    /// Runs `pipe` on the shared connection of the node that serves `tag`'s
    /// slot, bounded by the node's timeout.
    pub(crate) async fn pipeline<T: redis::FromRedisValue + Send>(
        &self,
        tag: &str,
        what: &'static str,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        self.run(tag, |node: Arc<Node>| async move {
            node.timed(what, async {
                let mut con = node.shared().await?;
                pipe.query_async(&mut con).await.map_err(|e| backend(what, e))
            })
            .await
        })
        .await
    }

    /// Runs one command per tag (`cmds`: tag and command), pipelined per node,
    /// and answers in the order of `cmds`. A node's pipeline that fails (a
    /// redirection while slots move) is run again command by command through
    /// [`run`](Self::run), which follows redirections.
    pub(crate) async fn query_each<T: redis::FromRedisValue + Send>(
        &self,
        what: &'static str,
        cmds: &[(String, redis::Cmd)],
    ) -> Result<Vec<T>> {
        let mut groups: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
        for (i, (tag, _)) in cmds.iter().enumerate() {
            let node = self.node(tag).await?;
            match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                Some((_, ix)) => ix.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        let mut out: Vec<Option<T>> = (0..cmds.len()).map(|_| None).collect();
        for (node, ix) in groups {
            let mut pipe = redis::pipe();
            for &i in &ix {
                pipe.add_command(cmds[i].1.clone());
            }
            let pipe = &pipe;
            let sent: Result<Vec<T>> = node
                .timed(what, async {
                    let mut con = node.shared().await?;
                    pipe.query_async(&mut con).await.map_err(|e| backend(what, e))
                })
                .await;
            match sent {
                Ok(values) if values.len() == ix.len() => {
                    for (i, v) in ix.into_iter().zip(values) {
                        out[i] = Some(v);
                    }
                }
                _ => {
                    for i in ix {
                        out[i] = Some(self.query(&cmds[i].0, what, &cmds[i].1).await?);
                    }
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    pub(crate) async fn run<T, F, Fut>(&self, tag: &str, op: F) -> Result<T>
    where
        F: Fn(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let node = self.node(tag).await?;
        match op(node).await {
            Err(e) => match (self, redirect(&e)) {
                (Router::Cluster(c), Some(Redirect::Moved)) => op(c.node_for(slot(tag), true).await?).await,
                (Router::Cluster(c), Some(Redirect::Ask(addr))) => op(c.asking_node(&addr)?).await,
                _ => Err(e),
            },
            ok => ok,
        }
    }
}

impl ClusterRouter {
    /// The node at `addr` (`host:port` from an `ASK` reply) with connections that
    /// send `ASKING` first; kept apart from the slot owners' nodes, one per address.
    fn asking_node(&self, addr: &str) -> Result<Arc<Node>> {
        let url = format!("{}{addr}{}", self.scheme_and_auth, self.suffix);
        let mut nodes = self.asking_nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = nodes.get(&url) {
            return Ok(n.clone());
        }
        let mut node = Node::new(&url, &self.cfg)?;
        node.asking = true;
        let node = Arc::new(node);
        nodes.insert(url, node.clone());
        Ok(node)
    }

    async fn node_for(&self, slot: u16, refresh: bool) -> Result<Arc<Node>> {
        if refresh || self.slots.read().await.is_empty() {
            self.refresh().await?;
        }
        let url = self
            .slots
            .read()
            .await
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, u)| u.clone())
            .ok_or_else(|| Error::backend(format!("redis cluster: no node serves slot {slot}")))?;
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = nodes.get(&url) {
            return Ok(n.clone());
        }
        let node = Arc::new(Node::new(&url, &self.cfg)?);
        nodes.insert(url, node.clone());
        Ok(node)
    }

    /// Reads CLUSTER SLOTS from the first seed that answers.
    async fn refresh(&self) -> Result<()> {
        let mut last = None;
        for seed in &self.cfg.nodes {
            let fetch = async {
                let client = redis::Client::open(seed.as_str()).map_err(|e| backend("open seed", e))?;
                let mut con = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| backend(&format!("connect to seed {}", redact_password(seed)), e))?;
                let v: redis::Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut con)
                    .await
                    .map_err(|e| backend("CLUSTER SLOTS", e))?;
                parse_slots(&v, &self.scheme_and_auth, &self.suffix)
            };
            match tokio::time::timeout(self.cfg.timeout, fetch).await {
                Ok(Ok(map)) if !map.is_empty() => {
                    *self.slots.write().await = map;
                    return Ok(());
                }
                Ok(Ok(_)) => last = Some(Error::backend("redis cluster: CLUSTER SLOTS is empty")),
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(Error::backend(format!(
                        "redis cluster: seed {} timed out",
                        redact_password(seed)
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::backend("redis cluster: no seed node")))
    }
}

/// Parses a CLUSTER SLOTS reply: `[[start, end, [ip, port, id, ...], replicas...], ...]`.
fn parse_slots(v: &redis::Value, scheme_and_auth: &str, suffix: &str) -> Result<Vec<(u16, u16, String)>> {
    use redis::Value;
    let bad = |why: &str| Error::corrupt("CLUSTER SLOTS", why);
    let Value::Array(ranges) = v else {
        return Err(bad("not an array"));
    };
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(parts) = r else {
            return Err(bad("range is not an array"));
        };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad("range without start, end and master"));
        };
        let ip = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad("master without ip")),
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad("master without port"));
        };
        let (lo, hi) = (
            u16::try_from(*lo).map_err(|_| bad("slot"))?,
            u16::try_from(*hi).map_err(|_| bad("slot"))?,
        );
        let host = if ip.contains(':') { format!("[{ip}]") } else { ip };
        out.push((lo, hi, format!("{scheme_and_auth}{host}:{port}{suffix}")));
    }
    Ok(out)
}

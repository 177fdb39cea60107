//! Connections: per node, a pool of dedicated connections for WATCH transactions
//! (deadpool, with a manager of our own: a checkout costs no round trip) and one
//! auto-reconnecting multiplexed connection for plain reads and heartbeats.
//!
//! Finding the node ([`Router`]):
//! - **Standalone**: the one server of the URL.
//! - **Redis Cluster**: the master that owns a hash tag's slot, from `CLUSTER
//!   SLOTS`. The slot map is read again after a `MOVED` redirection and after any
//!   call fails in a way that says its node is gone or no longer a master (a
//!   refused, reset or lost connection, a timeout, `CLUSTERDOWN`, `READONLY`,
//!   `MASTERDOWN`, `LOADING`, `EXECABORT`), from the seeds and every node the last
//!   map named (masters and replicas), so a promoted replica is found although the
//!   seed that died was the only one in the URL. An `ASK` redirection (the slot
//!   is being migrated and the keys already moved) is followed once, on
//!   connections that send `ASKING` before every command, without touching the
//!   slot map.
//! - **Sentinel**: the primary the sentinels name (the redis crate's `sentinel`
//!   module), found again after the same failures.
//!
//! A topology refresh is shared: concurrent callers that failed on the same map
//! wait for one refresh, and refreshes after failures run at most once per
//! [`REFRESH_GAP`]. A call whose failure says it was not applied (a refused
//! connection, `READONLY`, `MOVED`...) runs once more on the node the refresh
//! found, when it is another one; a call that may have been applied (a timeout,
//! a connection lost mid-call) is not repeated: its error goes to the caller,
//! whose next call reaches the new node.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use rollcall_core::{redact_password, Error, Result};
use tokio::sync::{OnceCell, RwLock};

use crate::config::RedisConfig;
use crate::keys::slot;

/// A Redis client error as a rollcall error.
pub(crate) fn backend(what: &str, e: RedisError) -> Error {
    Error::backend_with(format!("redis: {what}"), e)
}

/// The least time between two topology refreshes caused by failed calls (a
/// `MOVED` refreshes at once): at most 4 `CLUSTER SLOTS` (or sentinel queries)
/// a second per store handle while a failover is under way.
pub(crate) const REFRESH_GAP: Duration = Duration::from_millis(250);

/// What a failed call says about where its node is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The slot moved for good: refresh the slot map.
    Moved,
    /// The slot is migrating and the keys are on this node (`host:port`): ask it
    /// once, with `ASKING`.
    Ask(String),
    /// The node did not serve the call, and nothing was applied: it refused the
    /// connection, is a replica now (`READONLY`), or says the cluster or its
    /// master is down (`CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `EXECABORT`), or no
    /// connection could be had in time. Refresh, and run it again if the node
    /// changed.
    NotServed,
    /// The call may have been applied (a timeout, a connection lost mid-call):
    /// refresh, but leave the outcome to the caller.
    Lost,
}

/// The client error inside a rollcall error, if any; `Err(())` for a pool that
/// could not hand out a connection in time.
fn redis_error(e: &Error) -> Option<std::result::Result<&RedisError, ()>> {
    let Error::Backend { source: Some(s), .. } = e else {
        return None;
    };
    if let Some(re) = s.downcast_ref::<RedisError>() {
        return Some(Ok(re));
    }
    match s.downcast_ref::<deadpool::managed::PoolError<RedisError>>()? {
        deadpool::managed::PoolError::Backend(re) => Some(Ok(re)),
        deadpool::managed::PoolError::Timeout(_) => Some(Err(())),
        _ => None,
    }
}

/// A conditional write applied on the primary that fewer replicas acknowledged
/// than `wait_replicas` asks for, within `wait_ms`: it may or may not survive a
/// failover.
#[derive(Debug)]
pub(crate) struct Unreplicated {
    acked: i64,
    replicas: u32,
    within: Duration,
}

impl std::fmt::Display for Unreplicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} replicas acknowledged the write within {:?}; it is applied on the \
             primary but may be lost in a failover",
            self.acked, self.replicas, self.within
        )
    }
}

impl std::error::Error for Unreplicated {}

/// Whether `e` says a write was applied but not known to survive a failover:
/// a `WAIT` that fell short, or (`Fault::Lost`) a call that may have been
/// applied and never reached its `WAIT`.
pub(crate) fn maybe_unreplicated(e: &Error) -> bool {
    let Error::Backend { source: Some(s), .. } = e else {
        return false;
    };
    s.downcast_ref::<Unreplicated>().is_some() || fault(e) == Some(Fault::Lost)
}

/// What `e` says about the topology, if anything.
pub(crate) fn fault(e: &Error) -> Option<Fault> {
    let re = match redis_error(e)? {
        Ok(re) => re,
        Err(()) => return Some(Fault::NotServed),
    };
    let kinds: Vec<ServerErrorKind> = match re.kind() {
        ErrorKind::Server(k) => vec![k],
        _ => re
            .clone()
            .into_server_errors()
            .map(|errs| errs.iter().filter_map(|(_, e)| e.kind()).collect())
            .unwrap_or_default(),
    };
    if kinds.contains(&ServerErrorKind::Moved) {
        return Some(Fault::Moved);
    }
    if kinds.contains(&ServerErrorKind::Ask) {
        return Some(ask_address(re).map_or(Fault::Moved, Fault::Ask));
    }
    let not_served = [
        ServerErrorKind::ReadOnly,
        ServerErrorKind::ClusterDown,
        ServerErrorKind::MasterDown,
        ServerErrorKind::BusyLoading,
        ServerErrorKind::ExecAbort,
    ];
    if kinds.iter().any(|k| not_served.contains(k)) || re.is_connection_refusal() {
        return Some(Fault::NotServed);
    }
    if re.is_io_error() || re.is_timeout() || re.is_connection_dropped() {
        return Some(Fault::Lost);
    }
    None
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
    /// `WAIT` after conditional writes: replicas, and how long.
    wait: Option<(u32, std::time::Duration)>,
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
        // On the rollcall-io thread, as the shared connection.
        let client = self.client.clone();
        rollcall_core::io::on_io(
            async move { client.get_multiplexed_async_connection_with_config(&cfg).await },
        )
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
            wait: (cfg.wait_replicas > 0).then_some((cfg.wait_replicas, cfg.wait_timeout)),
        })
    }

    /// Whether conditional writes wait for replicas (`wait_replicas` > 0).
    pub(crate) fn waits(&self) -> bool {
        self.wait.is_some()
    }

    /// After a conditional write committed on `con`: `WAIT` for the configured
    /// replicas (nothing when none are configured). Fewer acknowledgements within
    /// `wait_ms` is an [`Error::Backend`] that says the write may or may not
    /// survive a failover: the caller must treat it as an ambiguous outcome.
    pub(crate) async fn wait_for_replicas(&self, con: &mut Dedicated) -> Result<()> {
        let Some((replicas, within)) = self.wait else {
            return Ok(());
        };
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(within.as_millis() as u64)
            .query_async(con)
            .await
            .map_err(|e| backend("WAIT", e))?;
        if acked < i64::from(replicas) {
            return Err(Error::backend_with(
                "redis: WAIT",
                Unreplicated {
                    acked,
                    replicas,
                    within,
                },
            ));
        }
        Ok(())
    }

    /// The shared multiplexed connection (reconnects by itself after failures).
    pub(crate) async fn shared(&self) -> Result<Shared> {
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let inner = self
            .shared
            .get_or_try_init(|| {
                // Opened on the rollcall-io thread: its driver lives there,
                // not on a caller's arbiter that the application may keep
                // busy (`rollcall_core::io`).
                let client = self.client.clone();
                rollcall_core::io::on_io(async move { client.get_connection_manager_with_config(cfg).await })
            })
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
    /// A timeout is an [`Error::Backend`] whose source is an I/O timeout, so that
    /// [`fault`] reads it as [`Fault::Lost`].
    pub(crate) async fn timed<T>(&self, what: &str, fut: impl Future<Output = Result<T>>) -> Result<T> {
        // The WAIT of a conditional write comes on top of its own round trips.
        let limit = self.timeout + self.wait.map_or(std::time::Duration::ZERO, |(_, w)| w);
        tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
            let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply in time");
            Err(Error::backend_with(
                format!("redis: {what} timed out after {limit:?}"),
                RedisError::from(io),
            ))
        })
    }
}

/// `script` with `keys` and `args`, ready to send.
fn invocation<'a, A: redis::ToRedisArgs>(
    script: &'a redis::Script,
    keys: &[String],
    args: &[A],
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    for a in args {
        invocation.arg(a);
    }
    invocation
}

/// Finds the node for a hash tag.
#[derive(Debug)]
pub(crate) enum Router {
    Standalone(Arc<Node>),
    Cluster(Box<ClusterRouter>),
    Sentinel(Box<SentinelRouter>),
}

/// One topology refresh at a time, at most one per [`REFRESH_GAP`] after failures.
#[derive(Debug, Default)]
struct RefreshGate {
    /// Bumped by every refresh: a caller that failed on generation `g` skips the
    /// refresh when it is past `g` (another caller refreshed meanwhile).
    generation: AtomicU64,
    /// When the last refresh ended.
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl RefreshGate {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Runs `refresh` unless another caller refreshed since `seen`, or (unless
    /// `now`) the last refresh ended less than [`REFRESH_GAP`] ago.
    async fn refresh<F, Fut>(&self, seen: u64, now: bool, refresh: F) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let mut last = self.last.lock().await;
        if self.generation() != seen {
            return Ok(());
        }
        if !now && last.is_some_and(|t| t.elapsed() < REFRESH_GAP) {
            return Ok(());
        }
        let r = refresh().await;
        *last = Some(Instant::now());
        self.generation.fetch_add(1, Ordering::AcqRel);
        r
    }
}

#[derive(Debug)]
pub(crate) struct ClusterRouter {
    cfg: RedisConfig,
    /// (first slot, last slot, master URL), from CLUSTER SLOTS.
    slots: RwLock<Vec<(u16, u16, String)>>,
    /// Every node the last CLUSTER SLOTS named (masters and replicas): where a
    /// refresh asks when the seeds do not answer.
    known: Mutex<Vec<String>>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Nodes reached by `ASK` redirections (see [`ClusterRouter::asking_node`]).
    asking_nodes: Mutex<HashMap<String, Arc<Node>>>,
    scheme_and_auth: String,
    /// `/#insecure` or `/` for TLS nodes, empty otherwise.
    suffix: String,
    gate: RefreshGate,
}

/// How often a store on Redis Sentinel asks the sentinels which server is the
/// primary, besides after every failed call.
pub(crate) const SENTINEL_CHECK: Duration = Duration::from_secs(1);

/// The primary behind Redis Sentinel.
pub(crate) struct SentinelRouter {
    cfg: RedisConfig,
    master: String,
    sentinel: tokio::sync::Mutex<redis::sentinel::Sentinel>,
    info: redis::sentinel::SentinelNodeConnectionInfo,
    /// `redis://user:pass@` or `rediss://...`: the primary's URL is this, its
    /// `host:port`, then [`suffix`](Self::suffix).
    scheme_and_auth: String,
    /// `/<db>`, with `#insecure` for TLS without verification.
    suffix: String,
    /// The primary found last.
    primary: RwLock<Option<Arc<Node>>>,
    gate: RefreshGate,
}

impl std::fmt::Debug for SentinelRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelRouter")
            .field("master", &self.master)
            .field("sentinels", &self.cfg.nodes)
            .finish()
    }
}

impl SentinelRouter {
    fn new(cfg: &RedisConfig) -> Result<SentinelRouter> {
        let target = cfg
            .sentinel
            .as_ref()
            .ok_or_else(|| Error::invalid_config("store_url", "no sentinel master"))?;
        let sentinel = redis::sentinel::Sentinel::build(cfg.nodes.clone())
            .map_err(|e| Error::invalid_config("store_url", format!("sentinels: {e}")))?;
        let insecure = cfg.nodes.iter().any(|n| n.ends_with("#insecure"));
        let mut redis_info = redis::RedisConnectionInfo::default().set_db(i64::from(target.db));
        if let Some((user, pass)) = split_auth(&target.auth) {
            if !user.is_empty() {
                redis_info = redis_info.set_username(user);
            }
            if let Some(pass) = pass {
                redis_info = redis_info.set_password(pass);
            }
        }
        let mut info =
            redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(redis_info);
        if cfg.tls {
            info = info.set_tls_mode(if insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            });
        }
        let scheme = if cfg.tls { "rediss" } else { "redis" };
        Ok(SentinelRouter {
            cfg: cfg.clone(),
            master: target.master.clone(),
            sentinel: tokio::sync::Mutex::new(sentinel),
            info,
            scheme_and_auth: format!("{scheme}://{}", target.auth),
            suffix: format!("/{}{}", target.db, if insecure { "#insecure" } else { "" }),
            primary: RwLock::new(None),
            gate: RefreshGate::default(),
        })
    }

    async fn node(&self) -> Result<Arc<Node>> {
        if let Some(n) = self.primary.read().await.clone() {
            return Ok(n);
        }
        // None known: at the first call, or since a call failed on the last one.
        // Ask the sentinels (at most once per REFRESH_GAP after a failure); no
        // call goes to the old address until they name it again (an old primary
        // restarted empty answers as a master until the sentinels demote it).
        let seen = self.gate.generation();
        let first = seen == 0;
        self.gate.refresh(seen, first, || self.discover()).await?;
        self.primary.read().await.clone().ok_or_else(|| {
            Error::backend(format!(
                "redis sentinel: the primary of `{}` is not known (a failover under way?); \
                 asking the sentinels again",
                self.master
            ))
        })
    }

    /// Forgets `node` as the primary (after a call on it failed), so that the next
    /// call asks the sentinels.
    async fn forget(&self, node: &Arc<Node>) {
        let mut primary = self.primary.write().await;
        if primary.as_ref().is_some_and(|p| Arc::ptr_eq(p, node)) {
            *primary = None;
        }
    }

    /// Checks the primary with the sentinels every [`SENTINEL_CHECK`], while the
    /// router lives: a switch-over that fails no call (the old primary demoted to
    /// a replica still answers reads) is followed within that period.
    pub(crate) fn watch(router: &Arc<Router>) {
        let Router::Sentinel(_) = &**router else {
            return;
        };
        let weak = Arc::downgrade(router);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SENTINEL_CHECK).await;
                let Some(router) = weak.upgrade() else {
                    return;
                };
                let Router::Sentinel(s) = &*router else {
                    return;
                };
                let seen = s.gate.generation();
                if let Err(e) = s.gate.refresh(seen, false, || s.discover()).await {
                    tracing::debug!(error = %e, "redis sentinel: the periodic check failed");
                }
            }
        });
    }

    /// Asks the sentinels for the primary (the redis crate checks that it answers
    /// `ROLE` as a master), bounded by the timeout; keeps the node (and its
    /// connections) when it is the one already known.
    async fn discover(&self) -> Result<()> {
        let ask = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel.async_master_for(&self.master, Some(&self.info)).await
        };
        let client = tokio::time::timeout(self.cfg.timeout, ask)
            .await
            .map_err(|_| {
                Error::backend(format!(
                    "redis sentinel: no answer for `{}` within {:?}",
                    self.master, self.cfg.timeout
                ))
            })?
            .map_err(|e| backend(&format!("sentinel: find the primary of `{}`", self.master), e))?;
        let (host, port) = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(h, p) | redis::ConnectionAddr::TcpTls { host: h, port: p, .. } => {
                (h.clone(), *p)
            }
            other => {
                return Err(Error::backend(format!(
                    "redis sentinel: unexpected address {other:?}"
                )))
            }
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let url = format!("{}{host}:{port}{}", self.scheme_and_auth, self.suffix);
        let mut primary = self.primary.write().await;
        if primary.as_ref().is_some_and(|n| n.url == url) {
            return Ok(());
        }
        if let Some(old) = primary.as_ref() {
            tracing::info!(from = %redact_password(&old.url), to = %redact_password(&url), "redis sentinel: the primary moved");
        }
        *primary = Some(Arc::new(Node::new(&url, &self.cfg)?));
        Ok(())
    }
}

/// `user:pass@` as (user, password).
fn split_auth(auth: &str) -> Option<(&str, Option<&str>)> {
    let auth = auth.strip_suffix('@')?;
    Some(match auth.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (auth, None),
    })
}

impl Router {
    pub(crate) fn new(cfg: &RedisConfig) -> Result<Router> {
        if cfg.sentinel.is_some() {
            return Ok(Router::Sentinel(Box::new(SentinelRouter::new(cfg)?)));
        }
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
            known: Mutex::new(Vec::new()),
            nodes: Mutex::new(HashMap::new()),
            asking_nodes: Mutex::new(HashMap::new()),
            scheme_and_auth: format!("{scheme}://{auth}"),
            suffix: suffix.to_owned(),
            gate: RefreshGate::default(),
        })))
    }

    /// The node owning `tag`'s slot.
    pub(crate) async fn node(&self, tag: &str) -> Result<Arc<Node>> {
        match self {
            Router::Standalone(n) => Ok(n.clone()),
            Router::Cluster(c) => c.node_for(slot(tag)).await,
            Router::Sentinel(s) => s.node().await,
        }
    }

    /// Whether conditional writes wait for replicas (`wait_replicas` > 0).
    pub(crate) fn waits(&self) -> bool {
        let cfg = match self {
            Router::Standalone(n) => return n.waits(),
            Router::Cluster(c) => &c.cfg,
            Router::Sentinel(s) => &s.cfg,
        };
        cfg.wait_replicas > 0
    }

    /// The refresh generation (see [`RefreshGate`]); 0 for one server.
    fn generation(&self) -> u64 {
        match self {
            Router::Standalone(_) => 0,
            Router::Cluster(c) => c.gate.generation(),
            Router::Sentinel(s) => s.gate.generation(),
        }
    }

    /// Reads the topology again (the slot map, or the primary from the
    /// sentinels), unless another caller did since `seen`; unless `now`, at most
    /// once per [`REFRESH_GAP`].
    async fn refresh(&self, seen: u64, now: bool) -> Result<()> {
        match self {
            Router::Standalone(_) => Ok(()),
            Router::Cluster(c) => c.gate.refresh(seen, now, || c.refresh()).await,
            Router::Sentinel(s) => s.gate.refresh(seen, now, || s.discover()).await,
        }
    }

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
                invocation(script, keys, args)
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

    /// Runs `pipe`, a write, as [`pipeline`](Self::pipeline) does; when the store
    /// waits for replicas (`wait_replicas`), on a dedicated connection followed by
    /// `WAIT` (see [`Node::wait_for_replicas`]).
    pub(crate) async fn pipeline_write<T: redis::FromRedisValue + Send>(
        &self,
        tag: &str,
        what: &'static str,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        if !self.waits() {
            return self.pipeline(tag, what, pipe).await;
        }
        self.run(tag, |node: Arc<Node>| async move {
            node.timed(what, async {
                let mut con = node.dedicated().await?;
                let r = async {
                    let reply = pipe.query_async(&mut con).await.map_err(|e| backend(what, e))?;
                    node.wait_for_replicas(&mut con).await?;
                    Ok(reply)
                }
                .await;
                if r.is_err() {
                    discard(con);
                }
                r
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

    /// Runs `op` on the node of `tag`, following the topology (see the module
    /// docs): after a `MOVED` the slot map is read again and `op` runs once more;
    /// after an `ASK` it runs once on the node named, each command after
    /// `ASKING`; after a failure that was not applied ([`Fault::NotServed`]) the
    /// topology is read again and `op` runs once more if its node changed; after
    /// one that may have been applied ([`Fault::Lost`]) the topology is read
    /// again and the error returned. A multi-key command whose keys are split
    /// between the two nodes of a migrating slot gets `TRYAGAIN`: a transient
    /// [`Error::Backend`] the caller retries.
    pub(crate) async fn run<T, F, Fut>(&self, tag: &str, op: F) -> Result<T>
    where
        F: Fn(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let seen = self.generation();
        let node = self.node(tag).await?;
        let e = match op(node.clone()).await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match (fault(&e), self) {
            (None, _) | (Some(_), Router::Standalone(_)) => Err(e),
            (Some(Fault::Ask(addr)), Router::Cluster(c)) => op(c.asking_node(&addr)?).await,
            (Some(Fault::Moved), _) => {
                self.refresh(seen, true).await?;
                op(self.node(tag).await?).await
            }
            (Some(fault), _) => {
                // Not applied, or maybe applied: read the topology again either way.
                if let Router::Sentinel(s) = self {
                    s.forget(&node).await;
                }
                if let Err(r) = self.refresh(seen, false).await {
                    tracing::debug!(error = %r, "redis: topology refresh failed");
                }
                if fault == Fault::Lost {
                    return Err(e);
                }
                match self.node(tag).await {
                    Ok(next) if !Arc::ptr_eq(&next, &node) => op(next).await,
                    _ => Err(e),
                }
            }
        }
    }

    /// Runs a conditional-write script as [`invoke`](Self::invoke) does, and
    /// then, when the store waits for replicas (`wait_replicas`), `WAIT`s on the
    /// same (dedicated) connection: an answer is only returned once the replicas
    /// acknowledged it (else an ambiguous [`Error::Backend`], see
    /// [`Node::wait_for_replicas`]). `applied` tells from the reply whether the
    /// script wrote anything (no `WAIT` when it did not).
    pub(crate) async fn invoke_write<T: redis::FromRedisValue + Send, A: redis::ToRedisArgs + Sync>(
        &self,
        tag: &str,
        what: &'static str,
        script: &'static redis::Script,
        keys: &[String],
        args: &[A],
        applied: impl Fn(&T) -> bool,
    ) -> Result<T> {
        if !self.waits() {
            return self.invoke(tag, what, script, keys, args).await;
        }
        let applied = &applied;
        self.run(tag, |node: Arc<Node>| async move {
            node.timed(what, async {
                let mut con = node.dedicated().await?;
                let r = async {
                    let reply: T = invocation(script, keys, args)
                        .invoke_async(&mut con)
                        .await
                        .map_err(|e| backend(what, e))?;
                    if applied(&reply) {
                        node.wait_for_replicas(&mut con).await?;
                    }
                    Ok(reply)
                }
                .await;
                if r.is_err() {
                    discard(con);
                }
                r
            })
            .await
        })
        .await
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

    async fn node_for(&self, slot: u16) -> Result<Arc<Node>> {
        if self.slots.read().await.is_empty() {
            let seen = self.gate.generation();
            self.gate.refresh(seen, true, || self.refresh()).await?;
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

    /// Reads CLUSTER SLOTS from the first node that answers: the seeds, then
    /// every node the last map named, starting one further each refresh (so a
    /// node that hangs is not always asked first). The whole refresh takes at
    /// most the timeout; each node gets an equal share of what is left, at least
    /// [`REFRESH_GAP`]. Nodes that no longer own a slot are dropped (their
    /// connections close once no call holds them).
    async fn refresh(&self) -> Result<()> {
        let mut candidates = self.cfg.nodes.clone();
        for n in self.known.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if !candidates.contains(n) {
                candidates.push(n.clone());
            }
        }
        let first = (self.gate.generation() as usize) % candidates.len().max(1);
        candidates.rotate_left(first);
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut last = None;
        for (i, seed) in candidates.iter().enumerate() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let share = (left / (candidates.len() - i) as u32).max(REFRESH_GAP).min(left);
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
            match tokio::time::timeout(share, fetch).await {
                Ok(Ok((map, all))) if !map.is_empty() => {
                    {
                        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
                        nodes.retain(|url, _| map.iter().any(|(_, _, u)| u == url));
                    }
                    *self.known.lock().unwrap_or_else(|p| p.into_inner()) = all;
                    *self.slots.write().await = map;
                    return Ok(());
                }
                Ok(Ok(_)) => last = Some(Error::backend("redis cluster: CLUSTER SLOTS is empty")),
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(Error::backend(format!(
                        "redis cluster: seed {} gave no slot map within {share:?}",
                        redact_password(seed)
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::backend("redis cluster: no seed node")))
    }
}

/// The master of each slot range, and every node named (masters and replicas).
type SlotMap = (Vec<(u16, u16, String)>, Vec<String>);

/// Parses a CLUSTER SLOTS reply: `[[start, end, [ip, port, id, ...], replicas...], ...]`.
fn parse_slots(v: &redis::Value, scheme_and_auth: &str, suffix: &str) -> Result<SlotMap> {
    use redis::Value;
    let bad = |why: &str| Error::corrupt("CLUSTER SLOTS", why);
    let node_url = |node: &Value| -> Result<String> {
        let Value::Array(node) = node else {
            return Err(bad("node is not an array"));
        };
        let ip = match node.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad("node without ip")),
        };
        let Some(Value::Int(port)) = node.get(1) else {
            return Err(bad("node without port"));
        };
        let host = if ip.contains(':') { format!("[{ip}]") } else { ip };
        Ok(format!("{scheme_and_auth}{host}:{port}{suffix}"))
    };
    let Value::Array(ranges) = v else {
        return Err(bad("not an array"));
    };
    let mut out = Vec::new();
    let mut all = Vec::new();
    for r in ranges {
        let Value::Array(parts) = r else {
            return Err(bad("range is not an array"));
        };
        let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(master)) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad("range without start, end and master"));
        };
        let (lo, hi) = (
            u16::try_from(*lo).map_err(|_| bad("slot"))?,
            u16::try_from(*hi).map_err(|_| bad("slot"))?,
        );
        let master = node_url(master)?;
        for replica in &parts[3..] {
            // A replica without an address (a failed one) is left out.
            if let Ok(u) = node_url(replica) {
                if !all.contains(&u) {
                    all.push(u);
                }
            }
        }
        if !all.contains(&master) {
            all.push(master.clone());
        }
        out.push((lo, hi, master));
    }
    Ok((out, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: RedisError) -> Error {
        backend("test", e)
    }

    #[test]
    fn faults_say_whether_a_call_was_applied() {
        let io = |k| err(RedisError::from(std::io::Error::new(k, "x")));
        assert_eq!(
            fault(&io(std::io::ErrorKind::ConnectionRefused)),
            Some(Fault::NotServed)
        );
        assert_eq!(fault(&io(std::io::ErrorKind::ConnectionReset)), Some(Fault::Lost));
        assert_eq!(fault(&io(std::io::ErrorKind::TimedOut)), Some(Fault::Lost));
        let server = |k| err(RedisError::from((ErrorKind::Server(k), "reply")));
        for k in [
            ServerErrorKind::ReadOnly,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::MasterDown,
            ServerErrorKind::BusyLoading,
            ServerErrorKind::ExecAbort,
        ] {
            assert_eq!(fault(&server(k)), Some(Fault::NotServed), "{k:?}");
        }
        assert_eq!(fault(&server(ServerErrorKind::Moved)), Some(Fault::Moved));
        assert_eq!(fault(&server(ServerErrorKind::ResponseError)), None);
        assert_eq!(fault(&Error::backend("no source")), None);
        assert_eq!(
            fault(&Error::backend_with(
                "w",
                Unreplicated {
                    acked: 0,
                    replicas: 1,
                    within: Duration::from_millis(1)
                }
            )),
            None
        );
        assert!(maybe_unreplicated(&Error::backend_with(
            "w",
            Unreplicated {
                acked: 0,
                replicas: 1,
                within: Duration::from_millis(1)
            }
        )));
        assert!(maybe_unreplicated(&io(std::io::ErrorKind::TimedOut)));
        assert!(!maybe_unreplicated(&io(std::io::ErrorKind::ConnectionRefused)));
    }

    /// Seeds that accept a connection and never answer (a partition that drops
    /// replies): a refresh gives up within the timeout, not the timeout per seed.
    #[tokio::test]
    async fn a_refresh_over_hung_seeds_ends_within_the_timeout() {
        let mut listeners = Vec::new();
        let mut seeds = Vec::new();
        for _ in 0..4 {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            seeds.push(l.local_addr().unwrap().to_string());
            listeners.push(l);
        }
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            loop {
                for l in &listeners {
                    if let Ok(Ok((c, _))) = tokio::time::timeout(Duration::from_millis(5), l.accept()).await {
                        open.push(c);
                    }
                }
            }
        });
        let cfg =
            RedisConfig::from_url(&format!("redis+cluster://{}?timeout_ms=600", seeds.join(","))).unwrap();
        let Router::Cluster(c) = Router::new(&cfg).unwrap() else {
            panic!("a cluster router");
        };
        let started = Instant::now();
        let r = c.refresh().await;
        let took = started.elapsed();
        held.abort();
        assert!(r.is_err(), "no slot map from hung seeds");
        assert!(
            took < Duration::from_millis(600) + REFRESH_GAP,
            "the refresh took {took:?}, over its timeout"
        );
    }

    #[test]
    fn slot_maps_name_masters_and_replicas_and_skip_replicas_without_address() {
        use redis::Value;
        let node = |ip: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(ip.into()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("::1", 7001),
                Value::Array(vec![Value::BulkString(b"?".to_vec())]),
            ]),
        ]);
        let (map, all) = parse_slots(&reply, "redis://", "").unwrap();
        assert_eq!(
            map,
            vec![
                (0, 5460, "redis://127.0.0.1:7000".to_owned()),
                (5461, 16383, "redis://[::1]:7001".to_owned())
            ]
        );
        assert_eq!(
            all,
            vec![
                "redis://127.0.0.1:7003",
                "redis://127.0.0.1:7000",
                "redis://[::1]:7001"
            ]
        );
        assert!(parse_slots(&Value::Int(1), "redis://", "").is_err());
    }
}

//! Real backends for provider tests.
//!
//! [`redis()`], [`redis_cluster()`], [`etcd()`], [`etcd_cluster()`] and [`dynamodb()`] each find a server, in this order:
//!
//! 1. an endpoint from the environment: `ROLLCALL_REDIS_URL` (`redis://127.0.0.1:6379`),
//!    `ROLLCALL_ETCD_ENDPOINTS` (`127.0.0.1:2379[,...]`), `ROLLCALL_ETCD_CLUSTER_ENDPOINTS`
//!    (3 members), `ROLLCALL_REDIS_CLUSTER_URL`, `ROLLCALL_DYNAMODB_ENDPOINT`
//!    (`http://127.0.0.1:5000`, a moto or DynamoDB Local server);
//! 2. containers started with testcontainers when the crate is built with the
//!    `docker` feature and a Docker daemon answers (clusters too: one container
//!    per member on the host's network; DynamoDB Local when its image is here,
//!    else moto; `scripts/docker.sh` builds the images without a registry);
//! 3. a local server process (`redis-server`, `etcd`, `moto_server`) started on a free
//!    loopback port, found on `PATH` or in the workspace's `.venv/bin`;
//! 4. otherwise the test **fails**: a missing backend never passes silently. Only
//!    an explicit opt-out, `ROLLCALL_SKIP_MISSING_BACKENDS=1`, turns that into a
//!    loud skip, and never when `CI` is set.
//!
//! `ROLLCALL_BACKEND_SOURCE=docker` allows containers only (a failure to start
//! one fails the test), `=local` skips containers.
//!
//! The returned [`Backend`] owns whatever was started and stops it on drop. Tests
//! sharing one server use their own cluster / service ids.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// Which backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Redis (`redis-server`).
    Redis,
    /// etcd (`etcd`).
    Etcd,
    /// DynamoDB API (`moto_server`).
    DynamoDb,
    /// A 3-master Redis Cluster (`redis-server --cluster-enabled yes` x3 + `redis-cli --cluster create`).
    RedisCluster,
    /// A 3-member etcd cluster on loopback (`etcd` x3).
    EtcdCluster,
}

impl Kind {
    fn env_var(self) -> &'static str {
        match self {
            Kind::Redis => "ROLLCALL_REDIS_URL",
            Kind::Etcd => "ROLLCALL_ETCD_ENDPOINTS",
            Kind::DynamoDb => "ROLLCALL_DYNAMODB_ENDPOINT",
            Kind::RedisCluster => "ROLLCALL_REDIS_CLUSTER_URL",
            Kind::EtcdCluster => "ROLLCALL_ETCD_CLUSTER_ENDPOINTS",
        }
    }

    fn binary(self) -> &'static str {
        match self {
            Kind::Redis => "redis-server",
            Kind::Etcd => "etcd",
            Kind::DynamoDb => "moto_server",
            Kind::RedisCluster => "redis-server",
            Kind::EtcdCluster => "etcd",
        }
    }
}

/// A running backend: where to reach it, and what to stop when dropped.
#[derive(Debug)]
pub struct Backend {
    /// The backend kind.
    pub kind: Kind,
    /// How to reach it: a `redis://` URL, comma-separated etcd `host:port`s, or an
    /// `http://` DynamoDB endpoint.
    pub endpoint: String,
    /// How it was obtained (`env`, `docker`, `local`), for messages.
    pub source: &'static str,
    _guard: Guard,
}

/// Drops `value` (containers) inside a small Tokio runtime of its own; if none can
/// be built, the containers outlive the test rather than panic.
#[cfg(feature = "docker")]
fn drop_in_a_runtime<T: Send + 'static>(value: T) {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(async move { drop(value) }),
        Err(_) => std::mem::forget(value),
    }
}

/// Containers are removed by testcontainers' drop, which needs a Tokio runtime:
/// a backend dropped outside one (a synchronous test that used a runtime of its
/// own) gets a small one for that.
#[cfg(feature = "docker")]
impl Drop for Backend {
    fn drop(&mut self) {
        if matches!(self._guard, Guard::Container(_)) && tokio::runtime::Handle::try_current().is_err() {
            drop_in_a_runtime(std::mem::replace(&mut self._guard, Guard::None));
        }
    }
}

#[allow(dead_code)] // fields are held only to be dropped
enum Guard {
    None,
    Process {
        child: Child,
        dir: TempDir,
    },
    Processes {
        children: Vec<Child>,
        dir: TempDir,
    },
    #[cfg(feature = "docker")]
    Container(Box<dyn std::any::Any + Send + Sync>),
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Guard::None => f.write_str("None"),
            Guard::Process { child, .. } => write!(f, "Process({:?})", child.id()),
            Guard::Processes { children, .. } => write!(f, "Processes({})", children.len()),
            #[cfg(feature = "docker")]
            Guard::Container(_) => f.write_str("Container"),
        }
    }
}

/// A directory removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when a missing backend must fail the run: always, unless
/// `ROLLCALL_SKIP_MISSING_BACKENDS=1` opts out, and even then when `CI` is set.
pub fn backends_required() -> bool {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false");
    let opted_out = std::env::var("ROLLCALL_SKIP_MISSING_BACKENDS").is_ok_and(|v| v == "1" || v == "true");
    ci || !opted_out
}

/// A Redis server, or `None` (skip) when there is none and backends are not required.
pub async fn redis() -> Option<Backend> {
    find(Kind::Redis).await
}

/// A 3-master Redis Cluster (`redis+cluster://` URL), or `None` (skip) when there is
/// none and backends are not required.
pub async fn redis_cluster() -> Option<Backend> {
    find(Kind::RedisCluster).await
}

/// A 3-member etcd cluster (comma-separated `host:port`s), or `None` (skip) when
/// there is none and backends are not required.
pub async fn etcd_cluster() -> Option<Backend> {
    find(Kind::EtcdCluster).await
}

/// An etcd server, or `None` (skip) when there is none and backends are not required.
pub async fn etcd() -> Option<Backend> {
    find(Kind::Etcd).await
}

/// A DynamoDB-compatible server, or `None` (skip) when there is none and backends are
/// not required. Local servers accept any credentials, but the AWS credential chain
/// must find some: when the environment has none, this sets
/// `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` to placeholders first (the test
/// command exports them too, before any thread starts).
pub async fn dynamodb() -> Option<Backend> {
    static CREDENTIALS: std::sync::Once = std::sync::Once::new();
    CREDENTIALS.call_once(|| {
        for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
            if std::env::var_os(var).is_none() {
                std::env::set_var(var, "rollcall-local");
            }
        }
    });
    find(Kind::DynamoDb).await
}

/// The store URL of the DynamoDB tests on the local server at `endpoint`: table
/// `rollcall-test` (created if missing), region `us-east-1`, 4 reminder
/// partitions per service (a full-ring read is 4 Queries instead of 16: moto
/// answers one request at a time; the DynamoDB tests check the default of 16).
pub fn dynamodb_url(endpoint: &str) -> String {
    format!(
        "dynamodb://rollcall-test?endpoint={endpoint}&region={}&create_if_missing=true&reminder_shards=4",
        dynamodb_region()
    )
}

/// A raw SDK client for the DynamoDB-compatible server at `endpoint` (to look at
/// and tamper with items, or to measure raw writes), on the workspace's HTTP stack.
#[cfg(feature = "dynamodb")]
pub async fn dynamodb_client(endpoint: &str, region: &str) -> aws_sdk_dynamodb::Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_owned()))
        .endpoint_url(endpoint)
        .http_client(http)
        .load()
        .await;
    aws_sdk_dynamodb::Client::new(&config)
}

/// A region picked at random for one test process. moto keeps one set of tables
/// per region and copies all of them on every transaction (to roll back), so
/// tests spread over regions keep each transaction's copy small.
pub fn dynamodb_region() -> &'static str {
    const REGIONS: [&str; 16] = [
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eu-central-1",
        "eu-north-1",
        "ap-south-1",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ca-central-1",
        "sa-east-1",
    ];
    static PICKED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    PICKED.get_or_init(|| REGIONS[rand::random_range(0..REGIONS.len())])
}

/// Where [`find`] may take a backend from: `ROLLCALL_BACKEND_SOURCE` = `docker`
/// (containers only: no endpoint from the environment, no local process) or
/// `local` (no containers); unset: anywhere, in the order of the module docs.
fn required_source() -> Option<String> {
    std::env::var("ROLLCALL_BACKEND_SOURCE")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

async fn find(kind: Kind) -> Option<Backend> {
    let only = required_source();
    if only.as_deref() == Some("docker") {
        #[cfg(feature = "docker")]
        let why = match docker::start(kind).await {
            Ok(b) => return Some(b),
            Err(why) => why,
        };
        #[cfg(not(feature = "docker"))]
        let why = "the `docker` feature of rollcall-tests is off".to_owned();
        panic!("no {kind:?} container (ROLLCALL_BACKEND_SOURCE=docker): {why}");
    }
    if let Ok(endpoint) = std::env::var(kind.env_var()) {
        if !endpoint.trim().is_empty() {
            return Some(Backend {
                kind,
                endpoint: endpoint.trim().to_owned(),
                source: "env",
                _guard: Guard::None,
            });
        }
    }
    let mut tried = Vec::new();
    #[cfg(feature = "docker")]
    if only.as_deref() != Some("local") {
        match docker::start(kind).await {
            Ok(b) => return Some(b),
            Err(why) => tried.push(format!("docker: {why}")),
        }
    }
    #[cfg(not(feature = "docker"))]
    tried.push("docker: the `docker` feature of rollcall-tests is off".to_owned());
    match start_local(kind).await {
        Ok(b) => return Some(b),
        Err(why) => tried.push(format!("local {}: {why}", kind.binary())),
    }
    let msg = format!(
        "no {kind:?} backend: set {} or run scripts/test.sh (tried: {})",
        kind.env_var(),
        tried.join("; ")
    );
    if backends_required() {
        panic!(
            "{msg} -- a missing backend fails the run (set ROLLCALL_SKIP_MISSING_BACKENDS=1 \
             to skip instead, outside CI)"
        );
    }
    eprintln!("\n!!!!! SKIPPING: {msg}\n");
    None
}

/// A backend of `kind` in containers, whatever the environment says (for tests of
/// what only containers make easy, e.g. `docker pause`), or `None` (skip) when
/// none can be started and backends are not required.
///
/// # Panics
/// When none can be started and backends are required (always under `CI`).
#[cfg(feature = "docker")]
pub async fn container(kind: Kind) -> Option<Backend> {
    match docker::start(kind).await {
        Ok(b) => Some(b),
        Err(why) if backends_required() => panic!(
            "no {kind:?} container: {why} (scripts/docker.sh starts a Docker engine and builds the images)"
        ),
        Err(why) => {
            eprintln!("\n!!!!! SKIPPING: no {kind:?} container: {why}\n");
            None
        }
    }
}

/// The ports [`free_port`] and [`free_cluster_port`] pick from: below Linux's
/// ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default), so
/// that no outgoing connection takes a picked port before its server binds it
/// (seen in CI: an etcd member in a container exited with "address already in
/// use" on a port picked as free a few seconds before). Two tests may still pick
/// the same port at the same moment: the fixtures that pick ports start again on
/// fresh ones when a server exits at start.
pub const PICKED_PORTS: std::ops::Range<u16> = 10_000..30_000;

/// A random port of [`PICKED_PORTS`] for which `free` holds.
fn pick_port(free: impl Fn(u16) -> bool) -> std::io::Result<u16> {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..1000 {
        let p = rng.random_range(PICKED_PORTS);
        if free(p) {
            return Ok(p);
        }
    }
    Err(std::io::Error::other(format!(
        "no free port in {}..{}",
        PICKED_PORTS.start, PICKED_PORTS.end
    )))
}

fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A TCP port on 127.0.0.1 that was free a moment ago, in 10000..30000 (below the
/// kernel's ephemeral ports, see [`PICKED_PORTS`]).
pub fn free_port() -> std::io::Result<u16> {
    pick_port(bindable)
}

/// moto's server on 127.0.0.1:`port` behind `scripts/moto_serialized.py`, which
/// handles one request at a time (moto's own server lets two transactions on two
/// threads both pass their conditions; DynamoDB never does), with the Python of
/// the workspace's `.venv` (where the test command installs moto).
///
/// # Errors
/// When moto's Python is not found.
pub fn moto_command(port: u16) -> Result<Command, String> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let moto = find_binary("moto_server").ok_or("moto_server not found on PATH or in .venv/bin")?;
    // The Python next to moto_server is the one moto is installed in.
    let python = moto
        .parent()
        .map(|d| d.join("python3"))
        .filter(|p| p.exists())
        .or_else(|| find_binary("python3"))
        .ok_or("python3 not found")?;
    let mut cmd = Command::new(python);
    cmd.arg(workspace.join("scripts/moto_serialized.py"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()]);
    Ok(cmd)
}

/// The path of `name`: the workspace's `.venv/bin` and `.backends/bin` first, then `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let extra = [workspace.join(".venv/bin"), workspace.join(".backends/bin")];
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `redis-server` (found like the other backends) bound to 127.0.0.1, without
/// persistence, working in `dir`; callers add the ports (and TLS or cluster flags).
///
/// # Errors
/// When `redis-server` is not found.
pub fn redis_server_command(dir: &std::path::Path) -> Result<Command, String> {
    let bin = find_binary("redis-server").ok_or("redis-server not found on PATH")?;
    let mut cmd = Command::new(bin);
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    Ok(cmd)
}

/// A free port in 10000..20000 whose Redis Cluster bus port (`port + 10000`) is
/// free too (both below the kernel's ephemeral ports, see [`PICKED_PORTS`]).
pub fn free_cluster_port() -> std::io::Result<u16> {
    const BUS: u16 = 10_000;
    pick_port(|p| p < PICKED_PORTS.end - BUS && bindable(p) && bindable(p + BUS))
}

/// How many times a fixture that picks ports starts its servers before it gives
/// up, while a server exits at start (its port taken since it was picked).
const START_ATTEMPTS: usize = 3;

/// Why one attempt to start servers on picked ports failed.
#[derive(Debug)]
enum StartError {
    /// A server exited while starting: worth another attempt on fresh ports.
    Exited(String),
    /// Anything else (not installed, not ready in time): final.
    Other(String),
}

impl From<String> for StartError {
    fn from(why: String) -> Self {
        StartError::Other(why)
    }
}

/// Runs `attempt` (which picks its own ports) up to [`START_ATTEMPTS`] times while
/// a server exits at start.
async fn on_fresh_ports<F, Fut>(mut attempt: F) -> Result<Backend, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Backend, StartError>>,
{
    let mut exits = Vec::new();
    for _ in 0..START_ATTEMPTS {
        match attempt().await {
            Ok(b) => return Ok(b),
            Err(StartError::Other(why)) => return Err(why),
            Err(StartError::Exited(why)) => {
                eprintln!("a server exited at start; starting again on fresh ports: {why}");
                exits.push(why);
            }
        }
    }
    Err(format!(
        "a server exited at start {START_ATTEMPTS} times: {}",
        exits.join(" | ")
    ))
}

/// `ready`, unless `exited` (which resolves with why a server stopped) resolves
/// first.
async fn unless_exited<T>(
    ready: impl std::future::Future<Output = Result<T, String>>,
    exited: impl std::future::Future<Output = String>,
) -> Result<T, StartError> {
    tokio::select! {
        r = ready => r.map_err(StartError::Other),
        why = exited => Err(StartError::Exited(why)),
    }
}

/// Resolves when one of the local `children` has exited: which, its status and
/// the end of its log (`logs[i]`).
async fn local_exit(children: &mut [Child], logs: &[PathBuf]) -> String {
    loop {
        for (i, c) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                let log = logs
                    .get(i)
                    .and_then(|l| std::fs::read_to_string(l).ok())
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return format!("server {i} exited ({status}), last lines: {tail:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `addr` accepts TCP connections.
pub async fn wait_for_port(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing listens on {addr} after {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A backend of `kind` that the calling test owns alone (to stop it or kill its
/// members), on `port` (a free one if `None`; Redis and etcd only, one member): a
/// local server, or containers when `ROLLCALL_BACKEND_SOURCE=docker` or the server
/// is not installed (Docker alone is enough for every test).
///
/// # Errors
/// When neither can be started.
pub async fn start_own_on(kind: Kind, port: Option<u16>) -> Result<Backend, String> {
    let docker_only = required_source().as_deref() == Some("docker");
    if !docker_only && find_binary(kind.binary()).is_some() {
        return start_local_on(kind, port).await;
    }
    #[cfg(feature = "docker")]
    return match port {
        Some(port) => docker::start_on(kind, port).await,
        None => docker::start(kind).await,
    };
    #[cfg(not(feature = "docker"))]
    Err(format!(
        "{} not found on PATH, and the `docker` feature of rollcall-tests is off",
        kind.binary()
    ))
}

/// [`start_own_on`] a free port.
///
/// # Errors
/// When neither a local server nor containers can be started.
pub async fn start_own(kind: Kind) -> Result<Backend, String> {
    start_own_on(kind, None).await
}

/// Starts a local server of `kind` on `port` (a free one if `None`), owned by the
/// returned [`Backend`]: dropping it, or [`Backend::stop`], kills the process.
pub async fn start_local_on(kind: Kind, port: Option<u16>) -> Result<Backend, String> {
    match kind {
        Kind::RedisCluster => start_local_redis_cluster().await,
        Kind::EtcdCluster => start_local_etcd_cluster(3).await,
        _ if port.is_some() => start_local_inner(kind, port).await.map_err(|e| match e {
            StartError::Exited(why) | StartError::Other(why) => why,
        }),
        _ => on_fresh_ports(|| start_local_inner(kind, None)).await,
    }
}

impl Backend {
    /// Kills a server this test started (a local process or containers) at once,
    /// as a crash, and waits until it is gone.
    pub async fn stop(&mut self) {
        #[cfg(feature = "docker")]
        if docker::stop_all(&mut self._guard).await {
            return;
        }
        match &mut self._guard {
            Guard::Process { child, .. } => {
                let _ = child.kill().await;
            }
            Guard::Processes { children, .. } => {
                for c in children {
                    let _ = c.kill().await;
                }
            }
            _ => {}
        }
    }
}

impl Backend {
    /// Kills member `i` (in endpoint order) of a locally started multi-process
    /// backend at once (as a crash) and waits for it to exit.
    ///
    /// # Panics
    /// When the backend is not a multi-process or multi-container one, or has no
    /// member `i`.
    pub async fn kill_member(&mut self, i: usize) {
        #[cfg(feature = "docker")]
        if docker::kill_member(&mut self._guard, i).await {
            return;
        }
        match &mut self._guard {
            Guard::Processes { children, .. } => {
                let _ = children[i].kill().await;
            }
            other => panic!("kill_member on {other:?}"),
        }
    }
}

/// The flags of etcd member `name` of `initial_cluster`
/// (`name=http://127.0.0.1:PEER,...`), serving clients on `client_url` and peers on
/// `peer_port`, data in `data_dir`, with short raft timers (heartbeat 50 ms,
/// election 500 ms) so that tests fail over quickly.
pub fn etcd_args(
    name: &str,
    data_dir: &std::path::Path,
    client_url: &str,
    peer_port: u16,
    initial_cluster: &str,
) -> Vec<String> {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    [
        "--name",
        name,
        "--data-dir",
        &data_dir.display().to_string(),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        &peer_url,
        "--initial-advertise-peer-urls",
        &peer_url,
        "--initial-cluster",
        initial_cluster,
        "--initial-cluster-state",
        "new",
        "--heartbeat-interval",
        "50",
        "--election-timeout",
        "500",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// An `etcd` member command (found like the other backends) with [`etcd_args`].
///
/// # Errors
/// When `etcd` is not found.
pub fn etcd_command(
    name: &str,
    data_dir: &std::path::Path,
    client_url: &str,
    peer_port: u16,
    initial_cluster: &str,
) -> Result<Command, String> {
    let bin = find_binary("etcd").ok_or("etcd not found on PATH")?;
    let mut cmd = Command::new(bin);
    cmd.args(etcd_args(name, data_dir, client_url, peer_port, initial_cluster))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    Ok(cmd)
}

/// A server a test runs as a process of its own ([`OwnServer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// `etcd` (image `quay.io/coreos/etcd`).
    Etcd,
    /// `redis-server` (image `redis`).
    Redis,
    /// moto behind `scripts/moto_serialized.py` (image `rollcall/moto-serialized`);
    /// its arguments are the wrapper's (`-H 127.0.0.1 -p PORT`).
    Moto,
}

/// A server that a test starts, kills and starts again itself, with flags of its
/// own (an outage, TLS, authentication): the local binary, or the server's image in
/// a container on the host's network when `ROLLCALL_BACKEND_SOURCE=docker` or the
/// binary is not installed (Docker alone is enough for every test). Dropping it
/// kills it.
#[derive(Debug)]
pub struct OwnServer {
    local: Option<Child>,
    #[cfg(feature = "docker")]
    container: Option<docker::Member>,
}

/// As for [`Backend`]: a container dropped outside a Tokio runtime gets one.
#[cfg(feature = "docker")]
impl Drop for OwnServer {
    fn drop(&mut self) {
        if self.container.is_some() && tokio::runtime::Handle::try_current().is_err() {
            drop_in_a_runtime(self.container.take());
        }
    }
}

impl OwnServer {
    /// Starts `server` with `args`, its output appended to `log` (a local
    /// process); `dirs` are the host directories its flags name (data,
    /// certificates), mounted at the same paths in a container. The caller waits
    /// for its port.
    ///
    /// # Errors
    /// When neither a local process nor a container can be started.
    pub async fn spawn(
        server: Server,
        args: &[String],
        dirs: &[&std::path::Path],
        log: &std::path::Path,
    ) -> Result<OwnServer, String> {
        let docker_only = required_source().as_deref() == Some("docker");
        let local = match server {
            Server::Etcd => find_binary("etcd").map(Command::new),
            Server::Redis => find_binary("redis-server").map(Command::new),
            Server::Moto => moto_command(0).ok().map(|c| {
                // The wrapper script, without moto_command's own host and port.
                let c = c.as_std();
                let mut cmd = Command::new(c.get_program());
                cmd.args(c.get_args().take(1));
                cmd
            }),
        };
        if let (false, Some(mut cmd)) = (docker_only, local) {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| e.to_string())?;
            let child = cmd
                .args(args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| e.to_string())?;
            return Ok(OwnServer {
                local: Some(child),
                #[cfg(feature = "docker")]
                container: None,
            });
        }
        #[cfg(feature = "docker")]
        {
            let member = docker::member(server, args, dirs).await?;
            Ok(OwnServer {
                local: None,
                container: Some(member),
            })
        }
        #[cfg(not(feature = "docker"))]
        {
            let _ = dirs;
            Err(format!(
                "{server:?} is not installed, and the `docker` feature of rollcall-tests is off"
            ))
        }
    }

    /// `local` or `docker`.
    pub fn source(&self) -> &'static str {
        if self.local.is_some() {
            "local"
        } else {
            "docker"
        }
    }

    /// Kills it at once (as a crash) and waits until it is gone.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.local.take() {
            let _ = c.kill().await;
        }
        #[cfg(feature = "docker")]
        if let Some(c) = self.container.take() {
            c.kill().await;
        }
    }
}

/// Waits until the etcd member serving plain HTTP on `port` reports itself healthy
/// (`GET /health`: `"health":"true"` once the cluster has a leader).
///
/// # Errors
/// When it does not within `timeout`.
pub async fn wait_for_etcd_health(port: u16, timeout: Duration) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + timeout;
    loop {
        let mut answer = String::new();
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let req = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            if s.write_all(req).await.is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut answer)).await;
            }
        }
        if answer.contains("\"health\":\"true\"") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "etcd on port {port} not healthy after {timeout:?}: {answer:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Free loopback (client, peer) ports for the `n` members `m0..` of an etcd
/// cluster, and its `--initial-cluster` (`m0=http://127.0.0.1:PEER,...`).
fn etcd_cluster_ports(n: usize) -> Result<(Vec<(u16, u16)>, String), String> {
    let ports = (0..n)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<std::io::Result<Vec<(u16, u16)>>>()
        .map_err(|e| e.to_string())?;
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    Ok((ports, initial))
}

/// Starts an `n`-member etcd cluster on loopback; the endpoint lists the members'
/// `host:port`s in order (see [`Backend::kill_member`]).
async fn start_local_etcd_cluster(n: usize) -> Result<Backend, String> {
    on_fresh_ports(|| try_local_etcd_cluster(n)).await
}

async fn try_local_etcd_cluster(n: usize) -> Result<Backend, StartError> {
    let dir = std::env::temp_dir().join(crate::unique_id("etcd-cluster"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let dir = TempDir(dir);
    let (ports, initial) = etcd_cluster_ports(n)?;
    let mut children = Vec::new();
    let logs: Vec<PathBuf> = (0..n).map(|i| dir.0.join(format!("m{i}.log"))).collect();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let log = std::fs::File::create(&logs[i]).map_err(|e| e.to_string())?;
        let child = etcd_command(
            &format!("m{i}"),
            &dir.0.join(format!("m{i}")),
            &format!("http://127.0.0.1:{client}"),
            *peer,
            &initial,
        )?
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawn etcd: {e}"))?;
        children.push(child);
    }
    let ready = async {
        for (client, _) in &ports {
            wait_for_etcd_health(*client, Duration::from_secs(30)).await?;
        }
        Ok(())
    };
    unless_exited(ready, local_exit(&mut children, &logs)).await?;
    let endpoints: Vec<String> = ports.iter().map(|(c, _)| format!("127.0.0.1:{c}")).collect();
    Ok(Backend {
        kind: Kind::EtcdCluster,
        endpoint: endpoints.join(","),
        source: "local",
        _guard: Guard::Processes { children, dir },
    })
}

async fn start_local(kind: Kind) -> Result<Backend, String> {
    start_local_on(kind, None).await
}

async fn start_local_redis_cluster() -> Result<Backend, String> {
    on_fresh_ports(try_local_redis_cluster).await
}

async fn try_local_redis_cluster() -> Result<Backend, StartError> {
    let cli = find_binary("redis-cli").ok_or("redis-cli not found".to_owned())?;
    let dir = std::env::temp_dir().join(crate::unique_id("redis-cluster"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let dir = TempDir(dir);
    let mut children = Vec::new();
    let mut ports = Vec::new();
    let logs: Vec<PathBuf> = (0..3).map(|i| dir.0.join(format!("n{i}/server.log"))).collect();
    for (i, log) in logs.iter().enumerate() {
        let port = free_cluster_port().map_err(|e| e.to_string())?;
        let node_dir = dir.0.join(format!("n{i}"));
        std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(log).map_err(|e| e.to_string())?;
        let child = redis_server_command(&node_dir)?
            .args(["--port", &port.to_string()])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"])
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        children.push(child);
        ports.push(port);
    }
    let ready = async {
        for p in &ports {
            wait_for_port(([127, 0, 0, 1], *p).into(), Duration::from_secs(30)).await?;
        }
        form_redis_cluster(&ports, |args| {
            let cli = cli.clone();
            async move {
                let out = Command::new(&cli)
                    .args(&args)
                    .output()
                    .await
                    .map_err(|e| format!("redis-cli {}: {e}", args.join(" ")))?;
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            }
        })
        .await
    };
    let endpoint = unless_exited(ready, local_exit(&mut children, &logs)).await?;
    Ok(Backend {
        kind: Kind::RedisCluster,
        endpoint,
        source: "local",
        _guard: Guard::Processes { children, dir },
    })
}

/// Joins the cluster-enabled redis-servers on `ports` (loopback) into one
/// cluster with `redis-cli --cluster create`, run by `cli` (its arguments in, its
/// standard output back: a local redis-cli, or one in a container), and waits
/// until every node reports `cluster_state:ok`. Returns the `redis+cluster://`
/// URL.
async fn form_redis_cluster<F, Fut>(ports: &[u16], cli: F) -> Result<String, String>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
    create.extend(nodes.iter().cloned());
    create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
    let out = cli(create).await?;
    if !out.contains("[OK]") {
        return Err(format!("redis-cli --cluster create failed: {out}"));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in ports {
        while !cli(vec!["-p".into(), p.to_string(), "cluster".into(), "info".into()])
            .await?
            .contains("cluster_state:ok")
        {
            if Instant::now() > deadline {
                return Err(format!("node {p} never reached cluster_state:ok"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(format!("redis+cluster://{}", nodes.join(",")))
}

async fn start_local_inner(kind: Kind, port: Option<u16>) -> Result<Backend, StartError> {
    let bin = find_binary(kind.binary()).ok_or_else(|| "not found on PATH or in .venv/bin".to_owned())?;
    let port = match port {
        Some(p) => p,
        None => free_port().map_err(|e| e.to_string())?,
    };
    let dir = std::env::temp_dir().join(format!("{}-{}", crate::unique_id(kind.binary()), port));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let dir = TempDir(dir);
    let mut cmd: Command;
    let endpoint = match kind {
        Kind::Redis => {
            cmd = redis_server_command(&dir.0)?;
            cmd.args(["--port", &port.to_string()]);
            format!("redis://127.0.0.1:{port}")
        }
        Kind::Etcd => {
            let peer = free_port().map_err(|e| e.to_string())?;
            let initial = format!("default=http://127.0.0.1:{peer}");
            let client_url = format!("http://127.0.0.1:{port}");
            cmd = etcd_command("default", &dir.0.join("data"), &client_url, peer, &initial)?;
            format!("127.0.0.1:{port}")
        }
        Kind::DynamoDb => {
            cmd = moto_command(port)?;
            format!("http://127.0.0.1:{port}")
        }
        Kind::RedisCluster | Kind::EtcdCluster => return Err(StartError::Other("use start_local_on".into())),
    };
    let log_path = dir.0.join("server.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let ready = async {
        wait_for_port(addr, Duration::from_secs(30)).await?;
        if kind == Kind::Etcd {
            wait_for_etcd_health(port, Duration::from_secs(30)).await?;
        }
        Ok(())
    };
    let exited = local_exit(std::slice::from_mut(&mut child), std::slice::from_ref(&log_path));
    if let Err(e) = unless_exited(ready, exited).await {
        let _ = child.start_kill();
        return Err(match e {
            StartError::Exited(why) => StartError::Exited(why),
            StartError::Other(why) => {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                StartError::Other(format!("{why}; server log:\n{log}"))
            }
        });
    }
    Ok(Backend {
        kind,
        endpoint,
        source: "local",
        _guard: Guard::Process { child, dir },
    })
}

#[cfg(feature = "docker")]
mod docker {
    use std::time::Duration;

    use testcontainers::core::{ContainerPort, ExecCommand, Mount, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage, ImageExt};

    use super::{
        etcd_cluster_ports, free_cluster_port, on_fresh_ports, unless_exited, wait_for_etcd_health,
        wait_for_port, Backend, Guard, Kind, StartError,
    };

    fn daemon_answers() -> bool {
        std::process::Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn have_image(name: &str) -> bool {
        std::process::Command::new("docker")
            .args(["image", "inspect", name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    const REDIS: (&str, &str) = ("redis", "7-alpine");
    const ETCD: (&str, &str) = ("quay.io/coreos/etcd", "v3.5.17");
    const MOTO: (&str, &str) = ("rollcall/moto-serialized", "5.2.1");

    /// A server of a test's own in a container (see [`super::OwnServer`]).
    #[derive(Debug)]
    pub(super) struct Member(ContainerAsync<GenericImage>);

    impl Member {
        /// Kills the container at once and removes it.
        pub(super) async fn kill(self) {
            let _ = self.0.stop_with_timeout(Some(0)).await;
            let _ = self.0.rm().await;
        }
    }

    /// `server args...` in a container on the host's network, `dirs` mounted at
    /// the same paths; the caller waits for its port.
    pub(super) async fn member(
        server: super::Server,
        args: &[String],
        dirs: &[&std::path::Path],
    ) -> Result<Member, String> {
        if !daemon_answers() {
            return Err(format!(
                "{server:?} is not installed, and no Docker daemon answers"
            ));
        }
        let (image, mut cmd) = match server {
            super::Server::Etcd => (ETCD, vec!["etcd".to_owned()]),
            super::Server::Redis => (REDIS, vec!["redis-server".to_owned()]),
            // The image's entry point is the wrapper: its arguments only.
            super::Server::Moto => (MOTO, vec![]),
        };
        cmd.extend(args.iter().cloned());
        let mut request = GenericImage::new(image.0, image.1)
            .with_wait_for(WaitFor::Nothing)
            .with_network("host")
            .with_cmd(cmd);
        for dir in dirs {
            let dir = dir.display().to_string();
            request = request.with_mount(Mount::bind_mount(dir.clone(), dir));
        }
        let c = request
            .start()
            .await
            .map_err(|e| format!("an etcd container: {e}"))?;
        Ok(Member(c))
    }

    /// The containers of a container backend.
    fn containers(guard: &mut Guard) -> Option<&mut Vec<ContainerAsync<GenericImage>>> {
        match guard {
            Guard::Container(any) => any.downcast_mut(),
            _ => None,
        }
    }

    /// Kills every container of a container backend at once; false for others.
    pub(super) async fn stop_all(guard: &mut Guard) -> bool {
        let Some(containers) = containers(guard) else {
            return false;
        };
        for c in containers.iter() {
            let _ = c.stop_with_timeout(Some(0)).await;
        }
        true
    }

    /// A Redis server in a container on the host's network, on `port` (a test that
    /// stops and starts its own server on the same port).
    pub(super) async fn start_on(kind: Kind, port: u16) -> Result<Backend, String> {
        if kind != Kind::Redis {
            return Err(format!("no {kind:?} container on a given port"));
        }
        if !daemon_answers() {
            return Err("redis-server not found on PATH, and no Docker daemon answers".into());
        }
        let c = GenericImage::new(REDIS.0, REDIS.1)
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_network("host")
            .with_cmd(
                [
                    "redis-server",
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--protected-mode",
                    "no",
                ]
                .map(str::to_owned),
            )
            .start()
            .await
            .map_err(|e| format!("a redis container on port {port}: {e}"))?;
        Ok(backend(kind, format!("redis://127.0.0.1:{port}"), vec![c]))
    }

    /// Kills container `i` of a container backend at once (stops it, no grace).
    pub(super) async fn kill_member(guard: &mut Guard, i: usize) -> bool {
        let Some(containers) = containers(guard) else {
            return false;
        };
        let _ = containers[i].stop_with_timeout(Some(0)).await;
        true
    }

    fn backend(kind: Kind, endpoint: String, containers: Vec<ContainerAsync<GenericImage>>) -> Backend {
        Backend {
            kind,
            endpoint,
            source: "docker",
            _guard: Guard::Container(Box::new(containers)),
        }
    }

    pub(super) async fn start(kind: Kind) -> Result<Backend, String> {
        if !daemon_answers() {
            return Err("no Docker daemon answers".into());
        }
        match kind {
            Kind::Redis => {
                let c = GenericImage::new(REDIS.0, REDIS.1)
                    .with_exposed_port(ContainerPort::Tcp(6379))
                    .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
                    .with_cmd(["redis-server", "--protected-mode", "no"])
                    .start()
                    .await
                    .map_err(|e| e.to_string())?;
                let port = c.get_host_port_ipv4(6379).await.map_err(|e| e.to_string())?;
                Ok(backend(kind, format!("redis://127.0.0.1:{port}"), vec![c]))
            }
            Kind::Etcd => {
                let c = GenericImage::new(ETCD.0, ETCD.1)
                    .with_exposed_port(ContainerPort::Tcp(2379))
                    .with_wait_for(WaitFor::message_on_stderr("ready to serve client requests"))
                    .with_cmd([
                        "etcd",
                        "--listen-client-urls=http://0.0.0.0:2379",
                        "--advertise-client-urls=http://127.0.0.1:2379",
                    ])
                    .start()
                    .await
                    .map_err(|e| e.to_string())?;
                let port = c.get_host_port_ipv4(2379).await.map_err(|e| e.to_string())?;
                Ok(backend(kind, format!("127.0.0.1:{port}"), vec![c]))
            }
            Kind::DynamoDb => {
                // Amazon's own DynamoDB Local (Java) when its image is here, else moto.
                let local = have_image("amazon/dynamodb-local:2.5.4");
                let (c, inner) = if local {
                    let c = GenericImage::new("amazon/dynamodb-local", "2.5.4")
                        .with_exposed_port(ContainerPort::Tcp(8000))
                        .with_wait_for(WaitFor::message_on_stdout("CorsParams"))
                        .with_cmd(["-jar", "DynamoDBLocal.jar", "-inMemory", "-sharedDb"]);
                    (c, 8000)
                } else {
                    // moto behind the serializing wrapper the local fixture runs
                    // (scripts/docker.sh builds it).
                    let c = GenericImage::new(MOTO.0, MOTO.1)
                        .with_exposed_port(ContainerPort::Tcp(5000))
                        .with_wait_for(WaitFor::message_on_stderr("Running on"))
                        .with_cmd(["-p", "5000"]);
                    (c, 5000)
                };
                let c = c.start().await.map_err(|e| e.to_string())?;
                let port = c.get_host_port_ipv4(inner).await.map_err(|e| e.to_string())?;
                wait_for_port(([127, 0, 0, 1], port).into(), Duration::from_secs(30)).await?;
                Ok(backend(kind, format!("http://127.0.0.1:{port}"), vec![c]))
            }
            Kind::RedisCluster => on_fresh_ports(redis_cluster).await,
            Kind::EtcdCluster => on_fresh_ports(|| etcd_cluster(3)).await,
        }
    }

    /// Three cluster-enabled redis-servers in containers on the host's network
    /// (each on a free loopback port, so the addresses the nodes announce are
    /// the ones clients reach), joined by `redis-cli --cluster create` run in
    /// the first container.
    async fn redis_cluster() -> Result<Backend, StartError> {
        let mut containers = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..3 {
            let port = free_cluster_port().map_err(|e| e.to_string())?;
            let c = GenericImage::new(REDIS.0, REDIS.1)
                .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
                .with_network("host")
                .with_cmd([
                    "redis-server".to_owned(),
                    "--port".to_owned(),
                    port.to_string(),
                    "--bind".to_owned(),
                    "127.0.0.1".to_owned(),
                    "--protected-mode".to_owned(),
                    "no".to_owned(),
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-node-timeout".to_owned(),
                    "5000".to_owned(),
                ])
                .start()
                .await
                .map_err(|e| e.to_string())?;
            containers.push(c);
            ports.push(port);
        }
        let first = &containers[0];
        let ready = async {
            for p in &ports {
                wait_for_port(([127, 0, 0, 1], *p).into(), Duration::from_secs(30)).await?;
            }
            super::form_redis_cluster(&ports, |args| async move {
                let mut cmd = vec!["redis-cli".to_owned()];
                cmd.extend(args);
                let mut out = first
                    .exec(ExecCommand::new(cmd))
                    .await
                    .map_err(|e| format!("redis-cli in a container: {e}"))?;
                let bytes = out.stdout_to_vec().await.map_err(|e| e.to_string())?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            })
            .await
        };
        let endpoint = containers_ready(ready, &containers).await?;
        Ok(backend(Kind::RedisCluster, endpoint, containers))
    }

    /// An `n`-member etcd cluster, one container per member on the host's
    /// network (free loopback ports), with the short raft timers of the local
    /// fixture.
    async fn etcd_cluster(n: usize) -> Result<Backend, StartError> {
        let (ports, initial) = etcd_cluster_ports(n)?;
        let mut containers = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            // No member is ready before a quorum is up: start them all, then
            // wait for their health.
            let c = GenericImage::new(ETCD.0, ETCD.1)
                .with_wait_for(WaitFor::Nothing)
                .with_network("host")
                .with_cmd([
                    "etcd".to_owned(),
                    format!("--name=m{i}"),
                    format!("--data-dir=/tmp/m{i}"),
                    format!("--listen-client-urls={client_url}"),
                    format!("--advertise-client-urls={client_url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--initial-advertise-peer-urls={peer_url}"),
                    format!("--initial-cluster={initial}"),
                    "--initial-cluster-state=new".to_owned(),
                    "--heartbeat-interval=50".to_owned(),
                    "--election-timeout=500".to_owned(),
                ])
                .start()
                .await
                .map_err(|e| e.to_string())?;
            containers.push(c);
        }
        let ready = async {
            for (client, _) in &ports {
                wait_for_etcd_health(*client, Duration::from_secs(30)).await?;
            }
            Ok(())
        };
        containers_ready(ready, &containers).await?;
        let endpoints: Vec<String> = ports.iter().map(|(c, _)| format!("127.0.0.1:{c}")).collect();
        Ok(backend(Kind::EtcdCluster, endpoints.join(","), containers))
    }

    /// `ready`, unless one of `containers` stops first; a failure of `ready`
    /// (a timeout) carries the containers' [`last_words`].
    async fn containers_ready<T>(
        ready: impl std::future::Future<Output = Result<T, String>>,
        containers: &[ContainerAsync<GenericImage>],
    ) -> Result<T, StartError> {
        match unless_exited(ready, container_exit(containers)).await {
            Err(StartError::Other(why)) => Err(StartError::Other(format!(
                "{why}; {}",
                last_words(containers).await
            ))),
            other => other,
        }
    }

    /// Whether each container still runs, and the last lines it wrote to
    /// stderr: what a fixture that timed out reports.
    async fn last_words(containers: &[ContainerAsync<GenericImage>]) -> String {
        let mut said = Vec::new();
        for (i, c) in containers.iter().enumerate() {
            let running = c
                .is_running()
                .await
                .map_or_else(|e| e.to_string(), |r| r.to_string());
            let stderr = c.stderr_to_vec().await.unwrap_or_default();
            let stderr = String::from_utf8_lossy(&stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            said.push(format!("container {i} running={running}, last stderr: {tail:?}"));
        }
        said.join("; ")
    }

    /// Resolves when one of `containers` has stopped, with their
    /// [`last_words`].
    async fn container_exit(containers: &[ContainerAsync<GenericImage>]) -> String {
        loop {
            for c in containers {
                if matches!(c.is_running().await, Ok(false)) {
                    return last_words(containers).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Pauses (`docker pause`) or unpauses every container of `b`.
    pub(super) async fn set_paused(b: &Backend, paused: bool) -> Result<(), String> {
        let Guard::Container(any) = &b._guard else {
            return Err(format!("{:?} does not run in a container", b.kind));
        };
        let Some(containers) = any.downcast_ref::<Vec<ContainerAsync<GenericImage>>>() else {
            return Err("not a container of these fixtures".into());
        };
        for c in containers {
            if paused {
                c.pause().await.map_err(|e| e.to_string())?;
            } else {
                c.unpause().await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

impl Backend {
    /// Pauses (`docker pause`: the server's processes are frozen, its sockets stay
    /// open) or unpauses a backend started in containers.
    ///
    /// # Errors
    /// When the backend does not run in containers or Docker fails.
    #[cfg(feature = "docker")]
    pub async fn set_paused(&self, paused: bool) -> Result<(), String> {
        docker::set_paused(self, paused).await
    }
}

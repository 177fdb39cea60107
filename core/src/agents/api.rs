//! The public silo API: [`Silo::builder`], [`SiloBuilder`], [`SiloHandle`].
//!
//! ```no_run
//! # async fn run() -> Result<(), rollcall_core::SiloError> {
//! use std::sync::Arc;
//! use rollcall_core::{Silo, SystemStore};
//! # let store: Arc<dyn SystemStore> = unimplemented!();
//! let silo = Silo::builder(store, "orders")
//!     .listen("0.0.0.0:11111".parse().unwrap())
//!     .advertise("10.0.0.7:11111".parse().unwrap())
//!     .start()
//!     .await?; // returns once this silo is Active
//! let mut changes = silo.subscribe();
//! while changes.changed().await.is_ok() {
//!     let snapshot = changes.borrow().clone();
//!     println!("version {}: {} active", snapshot.version.version, snapshot.active().count());
//! }
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::{Addr, Message, Recipient};
use tokio::sync::{oneshot, watch};

use crate::transport::Transport;
use crate::{
    Clock, ClusterMembershipOptions, MembershipSnapshot, SiloAddress, SiloError, SiloStatus, SystemClock,
    SystemStore,
};

use super::executor::{MeasureClock, MembershipAgent, RefreshCall, ShutdownCall};

/// What a silo does when it reads its own row as Dead (Orleans: the silo kills
/// itself; the "perfect failure detector" property).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDeclaredDead {
    /// Stop the silo's agents, log why, and stop the actix `System` with this exit
    /// code. The default (code 70, `EX_SOFTWARE`).
    StopSystem {
        /// The process exit code `System::run` returns.
        exit_code: i32,
    },
    /// Stop only this silo's agents (its status becomes Dead); the application keeps
    /// running and learns it from [`SiloHandle::subscribe_status`].
    StopSilo,
}

impl Default for OnDeclaredDead {
    fn default() -> Self {
        OnDeclaredDead::StopSystem { exit_code: 70 }
    }
}

/// A new membership snapshot (a new table version), sent to actix subscribers.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct MembershipChanged(pub Arc<MembershipSnapshot>);

/// Entry point: `Silo::builder(store, cluster_id)`.
#[derive(Debug)]
pub struct Silo;

impl Silo {
    /// A builder for a silo of `cluster_id` whose membership table lives in `store`.
    /// The silo opens the table itself, in the [`ProtocolMode`](crate::ProtocolMode)
    /// its options select (`use_version_row`), so the cluster and the mode are each
    /// configured exactly once.
    pub fn builder(store: Arc<dyn SystemStore>, cluster_id: impl Into<String>) -> SiloBuilder {
        SiloBuilder {
            cluster_id: cluster_id.into(),
            store,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            generation: None,
            transport: None,
            options: ClusterMembershipOptions::default(),
            clock: Arc::new(SystemClock),
            host_name: None,
            silo_name: None,
            role_name: String::new(),
            proxy_port: 0,
            update_zone: 0,
            fault_zone: 0,
            on_declared_dead: OnDeclaredDead::default(),
            seed: None,
            shared_secret: None,
            own_thread: true,
        }
    }
}

/// Configures and starts one silo. See [`Silo::builder`].
#[derive(Debug)]
pub struct SiloBuilder {
    pub(super) cluster_id: String,
    pub(super) store: Arc<dyn SystemStore>,
    pub(super) listen: SocketAddr,
    pub(super) advertise: Option<SocketAddr>,
    pub(super) generation: Option<u64>,
    pub(super) transport: Option<Arc<dyn Transport>>,
    pub(super) options: ClusterMembershipOptions,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) host_name: Option<String>,
    pub(super) silo_name: Option<String>,
    pub(super) role_name: String,
    pub(super) proxy_port: u16,
    pub(super) update_zone: u32,
    pub(super) fault_zone: u32,
    pub(super) on_declared_dead: OnDeclaredDead,
    pub(super) seed: Option<u64>,
    pub(super) shared_secret: Option<crate::transport::SharedSecret>,
    pub(super) own_thread: bool,
}

impl SiloBuilder {
    /// The probe endpoint to serve. Default `127.0.0.1:0` (any free port).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The endpoint other silos use to reach this one (default: the bound address;
    /// required when listening on `0.0.0.0`).
    pub fn advertise(mut self, addr: SocketAddr) -> Self {
        self.advertise = Some(addr);
        self
    }

    /// The generation (default: the clock's current time in ms since the epoch).
    pub fn generation(mut self, generation: u64) -> Self {
        self.generation = Some(generation);
        self
    }

    /// The probe transport (default: a [`TcpTransport`](crate::transport::tcp::TcpTransport)
    /// whose `frame_timeout` is the options' `probe_timeout`, with the
    /// [`shared_secret`](Self::shared_secret) if one is set).
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// The cluster's shared secret for the probe port (off by default): frames are
    /// sealed with an HMAC-SHA256 tag and frames without a valid one are dropped
    /// unanswered (see [`SharedSecret`](crate::transport::SharedSecret)). Every silo of
    /// the cluster needs the same secret. Applies to the default TCP transport; with
    /// a custom [`transport`](Self::transport), configure it there instead
    /// ([`start`](Self::start) rejects both).
    pub fn shared_secret(mut self, secret: crate::transport::SharedSecret) -> Self {
        self.shared_secret = Some(secret);
        self
    }

    /// Protocol options (validated by [`start`](Self::start)); they also select the
    /// table's protocol mode.
    pub fn options(mut self, options: ClusterMembershipOptions) -> Self {
        self.options = options;
        self
    }

    /// The wall clock (default [`SystemClock`]; tests use [`TokioClock`](crate::TokioClock)).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether the membership agent and the probe endpoint run on a thread of
    /// the silo's own (an actix `Arbiter` it starts, and stops when the silo
    /// stops). Default `true`: probes, probe answers, votes and IAmAlive then
    /// never wait for the caller's arbiter, however busy the application's
    /// actors or the reminder deliveries keep it (a silo whose own thread runs
    /// late is declared Dead by peers that are fine: Kafka's KIP-62, Akka's
    /// internal dispatcher, Orleans answering pings before scheduling).
    /// `false` runs them on the caller's arbiter: needed under tokio's paused
    /// clock (simulated networks), where a thread of its own would run on real
    /// time.
    pub fn own_thread(mut self, own: bool) -> Self {
        self.own_thread = own;
        self
    }

    /// Seeds the protocol's random choices (backoff jitter, indirect-probe
    /// intermediaries). Default: from the OS. Simulations set it to be reproducible.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Host name column (default: the machine's host name, from the OS).
    pub fn host_name(mut self, name: impl Into<String>) -> Self {
        self.host_name = Some(name.into());
        self
    }

    /// Silo name column (default: the silo address).
    pub fn silo_name(mut self, name: impl Into<String>) -> Self {
        self.silo_name = Some(name.into());
        self
    }

    /// Role name column.
    pub fn role_name(mut self, name: impl Into<String>) -> Self {
        self.role_name = name.into();
        self
    }

    /// Gateway (client) port; 0 = not a gateway.
    pub fn proxy_port(mut self, port: u16) -> Self {
        self.proxy_port = port;
        self
    }

    /// Update and fault zones.
    pub fn zones(mut self, update_zone: u32, fault_zone: u32) -> Self {
        self.update_zone = update_zone;
        self.fault_zone = fault_zone;
        self
    }

    /// What to do when declared dead (default [`OnDeclaredDead::StopSystem`]).
    pub fn on_declared_dead(mut self, policy: OnDeclaredDead) -> Self {
        self.on_declared_dead = policy;
        self
    }
}

/// A running silo. Cheap to clone.
///
/// Bounds: [`snapshot`](Self::snapshot), [`latest_snapshot`](Self::latest_snapshot),
/// [`status`](Self::status) never wait; [`refresh`](Self::refresh) answers within
/// `2 x table_operation_timeout`; [`shutdown`](Self::shutdown) and
/// [`stop`](Self::stop) within `shutdown_timeout + table_operation_timeout`, whatever
/// the table does.
#[derive(Clone, Debug)]
pub struct SiloHandle {
    pub(super) cluster_id: String,
    pub(super) address: SiloAddress,
    pub(super) agent: Addr<MembershipAgent>,
    pub(super) options: Arc<ClusterMembershipOptions>,
    pub(super) snapshot: watch::Receiver<Arc<MembershipSnapshot>>,
    pub(super) latest: watch::Receiver<Arc<MembershipSnapshot>>,
    pub(super) status: watch::Receiver<SiloStatus>,
    pub(super) clock: watch::Receiver<crate::protocol::ClockReport>,
    pub(super) stop: Arc<watch::Sender<bool>>,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) notices: Arc<super::NoticeSinks>,
    pub(super) counters: Arc<crate::metrics_table::CounterCells>,
    pub(super) health: Arc<super::executor::SharedHealth>,
    pub(super) leave_hooks: Arc<LeaveHooks>,
    /// Names claimed on this silo ([`SiloHandle::claim`]).
    pub(super) claims: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// The silo's own thread, when it has one ([`SiloBuilder::own_thread`]):
    /// where the membership agent runs, and where a leave runs whoever asks
    /// for it.
    pub(super) arbiter: Option<actix::ArbiterHandle>,
}

/// What a hook given to [`SiloHandle::on_leave`] returns: the work to finish before
/// the silo's ShuttingDown row is written.
pub type LeaveWork = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

type LeaveHook = Arc<dyn Fn() -> LeaveWork + Send + Sync>;

/// The hooks of one silo, by id.
#[derive(Default)]
pub(super) struct LeaveHooks {
    next: std::sync::atomic::AtomicU64,
    hooks: std::sync::Mutex<Vec<(u64, LeaveHook)>>,
}

impl std::fmt::Debug for LeaveHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaveHooks").finish_non_exhaustive()
    }
}

impl LeaveHooks {
    fn list(&self) -> Vec<LeaveHook> {
        let hooks = self
            .hooks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hooks.iter().map(|(_, h)| h.clone()).collect()
    }
}

/// A name claimed on one silo ([`SiloHandle::claim`]), given back when
/// dropped.
#[must_use = "the name is given back when this guard is dropped"]
pub struct SiloClaim {
    name: String,
    claims: std::sync::Weak<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl std::fmt::Debug for SiloClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SiloClaim").field("name", &self.name).finish()
    }
}

impl Drop for SiloClaim {
    fn drop(&mut self) {
        if let Some(claims) = self.claims.upgrade() {
            claims
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&self.name);
        }
    }
}

/// Keeps a hook given to [`SiloHandle::on_leave`] registered until dropped.
#[must_use = "the hook is removed when this guard is dropped"]
pub struct LeaveHookGuard {
    id: u64,
    hooks: std::sync::Weak<LeaveHooks>,
}

impl std::fmt::Debug for LeaveHookGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaveHookGuard").field("id", &self.id).finish()
    }
}

impl Drop for LeaveHookGuard {
    fn drop(&mut self) {
        if let Some(hooks) = self.hooks.upgrade() {
            let mut list = hooks
                .hooks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            list.retain(|(id, _)| *id != self.id);
        }
    }
}

/// Delivers [`MembershipChanged`] to an actor until dropped. See
/// [`SiloHandle::subscribe_recipient`].
#[derive(Debug)]
#[must_use = "the subscription ends when this guard is dropped"]
pub struct Subscription {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SiloHandle {
    /// This silo's identity (`ip:port@generation`).
    pub fn address(&self) -> SiloAddress {
        self.address
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// What this silo has counted since it started: table reads, writes and
    /// conflicts, suspicions and votes, probes and their round-trip percentiles
    /// (what its metrics row publishes). Never waits.
    pub fn counters(&self) -> crate::MembershipCounters {
        self.counters.read()
    }

    /// This silo's local health score, 0 (healthy) ..= 8, as its last health check
    /// computed it (Orleans' `LocalSiloHealthMonitor`). Never waits.
    pub fn health_score(&self) -> u8 {
        self.health.score.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This silo's own status as it knows it (Joining, Active, ..., Dead). Never waits.
    pub fn status(&self) -> SiloStatus {
        *self.status.borrow()
    }

    /// The latest membership snapshot (newest table version seen), copied. Never
    /// waits. Costs a copy of every row (about 150 ns per row); see
    /// [`shared_snapshot`](Self::shared_snapshot) for the same view without it.
    pub fn snapshot(&self) -> MembershipSnapshot {
        (**self.snapshot.borrow()).clone()
    }

    /// The latest membership snapshot, shared with the silo: no copy, whatever the
    /// cluster's size. Never waits.
    pub fn shared_snapshot(&self) -> Arc<MembershipSnapshot> {
        self.snapshot.borrow().clone()
    }

    /// A `tokio::sync::watch` of membership snapshots; it changes on every new table
    /// version, so versions seen by one receiver strictly increase. Snapshots are
    /// shared (`Arc`): the silo publishes a view without copying its rows.
    pub fn subscribe(&self) -> watch::Receiver<Arc<MembershipSnapshot>> {
        self.snapshot.clone()
    }

    /// How far this silo's wall clock is from its peers' and whether that is
    /// within the options' `max_clock_offset` (see
    /// [`clock`](crate::protocol::clock): measured from the probes, updated
    /// after every probe, and at once when the local clock steps). Never waits.
    pub fn clock(&self) -> crate::protocol::ClockReport {
        *self.clock.borrow()
    }

    /// The clock report computed now rather than after the last probe: a
    /// step of the local wall clock since then is in it. It is published to
    /// [`subscribe_clock`](Self::subscribe_clock) too.
    ///
    /// # Errors
    /// [`SiloError::Stopped`]; [`SiloError::Timeout`] when the silo does not
    /// answer within 1 s (it is overloaded: the report it will publish still
    /// comes through the watch).
    pub async fn measure_clock(&self) -> Result<crate::protocol::ClockReport, SiloError> {
        let bound = Duration::from_secs(1);
        tokio::time::timeout(bound, self.agent.send(MeasureClock))
            .await
            .map_err(|_| SiloError::Timeout(bound))?
            .map_err(|_| SiloError::Stopped)
    }

    /// A watch of [`clock`](Self::clock): it changes when the report does.
    pub fn subscribe_clock(&self) -> watch::Receiver<crate::protocol::ClockReport> {
        self.clock.clone()
    }

    /// Whether this silo's membership runs on a thread of its own
    /// ([`SiloBuilder::own_thread`]); its services (the reminder service)
    /// follow the same choice.
    pub fn own_thread(&self) -> bool {
        self.arbiter.is_some()
    }

    /// A watch of this silo's own status; it ends at Dead.
    pub fn subscribe_status(&self) -> watch::Receiver<SiloStatus> {
        self.status.clone()
    }

    /// Sends [`MembershipChanged`] to an actix actor: the current snapshot at once,
    /// then every new table version, until the returned guard is dropped or the actor
    /// stops. A forwarding task reads the [`subscribe`](Self::subscribe) watch and
    /// awaits room in the actor's mailbox, so a busy actor is never sent a stale
    /// snapshot last: versions it has not taken yet coalesce into the newest.
    /// Must run inside an actix `System` (or a tokio `LocalSet`).
    pub fn subscribe_recipient(&self, recipient: Recipient<MembershipChanged>) -> Subscription {
        let mut rx = self.snapshot.clone();
        let task = actix::spawn(async move {
            loop {
                let snapshot = rx.borrow_and_update().clone();
                if recipient.send(MembershipChanged(snapshot)).await.is_err() {
                    return; // the actor stopped
                }
                if rx.changed().await.is_err() {
                    return; // the silo stopped and its last snapshot was delivered
                }
            }
        });
        Subscription { task }
    }

    /// Reads the table now and returns the newest snapshot (the read starts after
    /// this call, so it sees every write committed before it).
    ///
    /// # Errors
    /// [`SiloError::Table`] if the read fails; [`SiloError::Timeout`] after
    /// `2 x table_operation_timeout`; [`SiloError::Stopped`].
    pub async fn refresh(&self) -> Result<MembershipSnapshot, SiloError> {
        let bound = self.options.table_operation_timeout.saturating_mul(2);
        let (tx, rx) = oneshot::channel();
        let call = async {
            self.agent
                .send(RefreshCall(tx))
                .await
                .map_err(|_| SiloError::Stopped)?;
            rx.await.map_err(|_| SiloError::Stopped)?
        };
        tokio::time::timeout(bound, call)
            .await
            .unwrap_or(Err(SiloError::Timeout(bound)))
    }

    /// The newest snapshot this silo has read, including IAmAlive changes that do
    /// not bump the version. Never waits on the table.
    ///
    /// # Errors
    /// None today; kept fallible for API stability.
    pub async fn latest_snapshot(&self) -> Result<MembershipSnapshot, SiloError> {
        Ok((**self.latest.borrow()).clone())
    }

    /// The leave, run on the silo's own thread when it has one: the leave
    /// hooks and the row writes then never wait for the caller's arbiter (a
    /// saturated application arbiter polled them seconds late), only its
    /// answer does.
    async fn leave(&self, graceful: bool) -> Result<(), SiloError> {
        let Some(arbiter) = &self.arbiter else {
            return self.leave_here(graceful).await;
        };
        let (tx, rx) = oneshot::channel();
        let me = self.clone();
        if !arbiter.spawn(async move {
            let _ = tx.send(me.leave_here(graceful).await);
        }) {
            return Err(SiloError::Stopped);
        }
        match rx.await {
            Ok(r) => r,
            // The silo's thread ended before the leave's answer was sent
            // (the agent stops it once it stops): its own status tells
            // whether the leave got through.
            Err(_) if *self.status.borrow() == SiloStatus::Dead && graceful => Ok(()),
            Err(_) => Err(SiloError::Stopped),
        }
    }

    /// Waits on the silo's own thread (or the current arbiter without one)
    /// for SIGTERM or SIGINT, then shuts the silo down gracefully
    /// ([`shutdown`](Self::shutdown)). Neither the signal nor the leave waits
    /// for the application's arbiter, however busy its actors keep it (a
    /// SIGTERM task on a saturated arbiter was polled 15 s late). Returns,
    /// once the handlers are installed, a receiver of the shutdown's result,
    /// answered when the leave is over (within
    /// [`shutdown_bound`](Self::shutdown_bound) of the signal): the
    /// application stops its `System` then. The receiver fails (closed with
    /// no value) when the silo's thread ends with no signal: the silo
    /// stopped otherwise (declared Dead, killed, shut down by a call). Call
    /// it once per silo.
    ///
    /// # Errors
    /// The OS error if a signal handler cannot be installed;
    /// [`std::io::ErrorKind::NotConnected`] if the silo's thread is gone.
    #[cfg(unix)]
    pub async fn shutdown_on_signals(&self) -> std::io::Result<oneshot::Receiver<Result<(), SiloError>>> {
        use tokio::signal::unix::{signal, SignalKind};
        let (installed_tx, installed_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let me = self.clone();
        let watch = async move {
            let signals =
                signal(SignalKind::terminate()).and_then(|t| Ok((t, signal(SignalKind::interrupt())?)));
            let (mut term, mut int) = match signals {
                Ok(s) => {
                    let _ = installed_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = installed_tx.send(Err(e));
                    return;
                }
            };
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(silo = %me.address, signal = which, "shutting down on a signal");
            let _ = done_tx.send(me.leave_here(true).await);
        };
        let spawned = match &self.arbiter {
            Some(arbiter) => arbiter.spawn(watch),
            None => {
                actix::spawn(watch);
                true
            }
        };
        let gone = || std::io::Error::new(std::io::ErrorKind::NotConnected, "the silo's thread is gone");
        if !spawned {
            return Err(gone());
        }
        installed_rx.await.map_err(|_| gone())??;
        Ok(done_rx)
    }

    /// The leave, on the current arbiter.
    async fn leave_here(&self, graceful: bool) -> Result<(), SiloError> {
        let bound = self.shutdown_bound();
        if graceful && !self.is_stopped() {
            // The subsystems hand their work over while this silo is still Active
            // in every view (reminder ranges, for one); each is bounded.
            let work: Vec<_> = self
                .leave_hooks
                .list()
                .into_iter()
                .map(|hook| tokio::spawn(hook()))
                .collect();
            let all = async {
                for w in work {
                    let _ = w.await;
                }
            };
            if tokio::time::timeout(self.options.shutdown_timeout, all)
                .await
                .is_err()
            {
                tracing::warn!(silo = %self.address, timeout = ?self.options.shutdown_timeout,
                    "leave hooks did not finish in shutdown_timeout; leaving anyway");
            }
        }
        let (tx, rx) = oneshot::channel();
        let call = async {
            self.agent
                .send(ShutdownCall { graceful, reply: tx })
                .await
                .map_err(|_| SiloError::Stopped)?;
            rx.await.map_err(|_| SiloError::Stopped)?
        };
        let bound = bound - self.options.shutdown_timeout;
        let r = tokio::time::timeout(bound, call)
            .await
            .unwrap_or(Err(SiloError::Timeout(bound)));
        self.stop.send_replace(true);
        r
    }

    /// The options this silo runs with.
    pub fn options(&self) -> &ClusterMembershipOptions {
        &self.options
    }

    /// The bound of [`shutdown`](Self::shutdown) and [`stop`](Self::stop):
    /// `shutdown_timeout` for the [leave hooks](Self::on_leave) (graceful shutdown
    /// only), then `shutdown_timeout + table_operation_timeout` (a write already sent
    /// finishes first) plus one second of slack.
    pub fn shutdown_bound(&self) -> Duration {
        2 * self.options.shutdown_timeout + self.options.table_operation_timeout + Duration::from_secs(1)
    }

    /// Claims `name` on this silo (every clone of its handle shares the
    /// claims) until the returned guard is dropped; `None` while another
    /// guard holds it. A service that must run once per silo (the reminder
    /// service, per service id) claims its name when it starts.
    pub fn claim(&self, name: &str) -> Option<SiloClaim> {
        let mut claims = self
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        claims.insert(name.to_owned()).then(|| SiloClaim {
            name: name.to_owned(),
            claims: Arc::downgrade(&self.claims),
        })
    }

    /// Registers work to finish before a graceful [`shutdown`](Self::shutdown)
    /// writes this silo's ShuttingDown row: `hook()` is called once per shutdown,
    /// and its future runs (with the other hooks, at once) while the silo is still
    /// Active in every view, for at most `shutdown_timeout` (past it the silo
    /// leaves anyway). The reminder service hands its ranges over this way. Not run
    /// by [`stop`](Self::stop) or [`kill`](Self::kill). The hook stays registered
    /// until the guard is dropped.
    pub fn on_leave(&self, hook: impl Fn() -> LeaveWork + Send + Sync + 'static) -> LeaveHookGuard {
        let id = self
            .leave_hooks
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.leave_hooks
            .hooks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((id, Arc::new(hook)));
        LeaveHookGuard {
            id,
            hooks: Arc::downgrade(&self.leave_hooks),
        }
    }

    /// Graceful shutdown: runs the [leave hooks](Self::on_leave), writes
    /// ShuttingDown then Dead, gossips, stops every agent.
    /// Returns within [`shutdown_bound`](Self::shutdown_bound) whatever the table does.
    ///
    /// # Errors
    /// [`SiloError::Table`] or [`SiloError::Timeout`] if the writes failed or did not
    /// finish in `shutdown_timeout` (the agents stop anyway); [`SiloError::Stopped`]
    /// if already stopped.
    pub async fn shutdown(&self) -> Result<(), SiloError> {
        self.leave(true).await
    }

    /// Ungraceful stop: writes Stopping then Dead (so nobody has to detect the
    /// departure), gossips and stops every agent, without waiting for anything else
    /// of the application. Same bound as [`shutdown`](Self::shutdown).
    ///
    /// # Errors
    /// As [`shutdown`](Self::shutdown).
    pub async fn stop(&self) -> Result<(), SiloError> {
        self.leave(false).await
    }

    /// Abrupt stop, as a crash: every agent and the probe listener stop at once and
    /// nothing is written to the table.
    pub fn kill(&self) {
        self.stop.send_replace(true);
    }

    /// True once the silo's agents were told to stop (shutdown, kill, declared dead).
    pub fn is_stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Waits until the silo stops.
    pub async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Receives the [`Notice`](super::Notice)s other silos (or this one) send to
    /// `topic` on this silo's probe endpoint, with room for `capacity` of them
    /// (at least 1): a notice that finds the queue full is dropped, and the receiver
    /// is told how many were (`NoticesDropped`) so that it can reconcile; notices are
    /// hints, like gossip. Replaces an earlier receiver of the same topic.
    pub fn subscribe_notices(&self, topic: &str, capacity: usize) -> super::NoticeReceiver {
        self.notices.subscribe(topic, capacity)
    }

    /// Sends a notice to the receiver of `topic` on silo `to` (this silo included)
    /// over the probe transport. Answers within the options' `probe_timeout`.
    ///
    /// Returns whether a receiver took it (`Ok(false)`: nobody subscribed to the topic
    /// there, or its queue was full).
    ///
    /// # Errors
    /// [`SiloError::Table`] with [`InvalidInput`](crate::Error::InvalidInput) for a
    /// topic over [`MAX_NOTICE_TOPIC`](crate::transport::MAX_NOTICE_TOPIC) or a body
    /// over [`MAX_NOTICE_BODY`](crate::transport::MAX_NOTICE_BODY) bytes;
    /// [`SiloError::Transport`] if `to` did not answer in time or refused;
    /// [`SiloError::Stopped`] if this silo stopped.
    pub async fn send_notice(&self, to: SiloAddress, topic: &str, body: Vec<u8>) -> Result<bool, SiloError> {
        use crate::transport::{ProbeRequest, ProbeResponse, MAX_NOTICE_BODY, MAX_NOTICE_TOPIC};
        if topic.len() > MAX_NOTICE_TOPIC {
            return Err(crate::Error::invalid_input(
                "topic",
                format!("longer than {MAX_NOTICE_TOPIC} bytes"),
            )
            .into());
        }
        if body.len() > MAX_NOTICE_BODY {
            return Err(
                crate::Error::invalid_input("body", format!("longer than {MAX_NOTICE_BODY} bytes")).into(),
            );
        }
        if self.is_stopped() {
            return Err(SiloError::Stopped);
        }
        let request = ProbeRequest::Notice {
            from: self.address,
            topic: topic.to_owned(),
            body,
        };
        if to == self.address {
            return Ok(self.notices.offer(request));
        }
        match self
            .transport
            .request(
                to.endpoint(),
                &self.cluster_id,
                request,
                self.options.probe_timeout,
            )
            .await
        {
            Ok(ProbeResponse::NoticeAck { accepted }) => Ok(accepted),
            Ok(other) => Err(SiloError::Transport(crate::transport::TransportError::Codec(
                format!("{to} answered a notice with {other:?}"),
            ))),
            Err(e) => Err(SiloError::Transport(e)),
        }
    }

    /// Active silos in the latest snapshot, other than this one.
    pub fn active_peers(&self) -> Vec<SiloAddress> {
        self.snapshot
            .borrow()
            .rows()
            .filter(|e| e.silo != self.address && e.status == SiloStatus::Active)
            .map(|e| e.silo)
            .collect()
    }
}

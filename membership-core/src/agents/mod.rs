//! The membership agents (actix actors) and the public silo API.
//!
//! A silo is a handful of thin actors around the [`protocol`](crate::protocol) core:
//! the **membership oracle** (all table reads and writes, snapshots, subscriptions,
//! gossip, IAmAlive, defunct cleanup, stopping when declared dead), one **probe
//! agent** per monitored silo, the **cluster health monitor** (targets, votes), the
//! **local health monitor**, and the **probe server** behind a [`Transport`].
//! Several silos can run in one process (tests and the demo run many).
//!
//! ```no_run
//! # async fn run() -> Result<(), rollcall_membership_core::SiloError> {
//! use std::sync::Arc;
//! use rollcall_membership_core::{Silo, ProtocolMode, SystemStore};
//! # let store: Arc<dyn SystemStore> = unimplemented!();
//! let table = store.membership_table("orders", ProtocolMode::Extended)?;
//! let silo = Silo::builder("orders", table)
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

mod health;
mod monitor;
mod oracle;
mod probe;
mod server;
mod writer;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::{Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Message, Recipient};
use tokio::sync::watch;
use tracing::Instrument;

use crate::transport::tcp::TcpTransport;
use crate::transport::{Transport, TransportError};
use crate::{
    Clock, ClusterMembershipOptions, Error, MembershipEntry, MembershipSnapshot, MembershipTable,
    SiloAddress, SiloStatus, SystemClock,
};

use health::{LocalHealthMonitor, SharedHealth};
use monitor::ClusterHealthMonitor;
use oracle::{GetSnapshot, JoinTable, MembershipOracle, Refresh, SetOwnStatus, Shutdown, Subscribe};
use probe::{direct_probe, Direct};
use server::ProbeServer;

/// Errors of a silo's lifecycle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SiloError {
    /// The membership table failed (after retries), or an option is invalid.
    #[error(transparent)]
    Table(#[from] Error),
    /// The probe endpoint could not be served.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Some Active silos stayed unreachable for `max_join_attempt_time`; this silo
    /// wrote itself Dead and stopped.
    #[error("could not reach {unreachable:?} within max_join_attempt_time ({waited:?})")]
    JoinTimeout {
        /// The silos that never answered.
        unreachable: Vec<SiloAddress>,
        /// How long the silo tried.
        waited: Duration,
    },
    /// A newer generation of this endpoint is in the table: this process is stale.
    #[error("superseded by the newer generation {by}")]
    Superseded {
        /// The newer silo.
        by: SiloAddress,
    },
    /// The cluster declared this silo Dead.
    #[error("this silo was declared Dead")]
    DeclaredDead,
    /// The silo's agents have stopped.
    #[error("the silo is stopped")]
    Stopped,
}

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

/// What every agent of one silo shares.
#[derive(Clone)]
pub(crate) struct SiloShared {
    pub(crate) cluster: Arc<str>,
    pub(crate) me: SiloAddress,
    pub(crate) options: Arc<ClusterMembershipOptions>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) health: Arc<SharedHealth>,
    /// Every snapshot the oracle reads (IAmAlive changes included).
    pub(crate) latest: watch::Receiver<MembershipSnapshot>,
    pub(crate) status: watch::Receiver<SiloStatus>,
}

/// A new membership snapshot (a new table version), sent to actix subscribers.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct MembershipChanged(pub Arc<MembershipSnapshot>);

/// Stops the actor when the silo's stop signal is raised.
pub(crate) fn stop_on_signal<A>(mut stop: watch::Receiver<bool>, ctx: &mut Context<A>)
where
    A: Actor<Context = Context<A>>,
{
    let wait = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    ctx.spawn(actix::fut::wrap_future::<_, A>(wait).map(|_, _, ctx: &mut Context<A>| ctx.stop()));
}

/// Entry point: `Silo::builder(cluster_id, table)`.
#[derive(Debug)]
pub struct Silo;

impl Silo {
    /// A builder for a silo of `cluster_id` on `table` (which must belong to that
    /// cluster).
    pub fn builder(cluster_id: impl Into<String>, table: Arc<dyn MembershipTable>) -> SiloBuilder {
        SiloBuilder {
            cluster_id: cluster_id.into(),
            table,
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
        }
    }
}

/// Configures and starts one silo. See [`Silo::builder`].
#[derive(Debug)]
pub struct SiloBuilder {
    cluster_id: String,
    table: Arc<dyn MembershipTable>,
    listen: SocketAddr,
    advertise: Option<SocketAddr>,
    generation: Option<u64>,
    transport: Option<Arc<dyn Transport>>,
    options: ClusterMembershipOptions,
    clock: Arc<dyn Clock>,
    host_name: Option<String>,
    silo_name: Option<String>,
    role_name: String,
    proxy_port: u16,
    update_zone: u32,
    fault_zone: u32,
    on_declared_dead: OnDeclaredDead,
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

    /// The probe transport (default: [`TcpTransport`]).
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Protocol options (validated by [`start`](Self::start)).
    pub fn options(mut self, options: ClusterMembershipOptions) -> Self {
        self.options = options;
        self
    }

    /// The wall clock (default [`SystemClock`]; tests use [`TokioClock`](crate::TokioClock)).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Host name column (default: `$HOSTNAME` or empty).
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

    /// Starts the silo and runs its join: serve the probe endpoint, insert our row
    /// (Joining), declare older generations of our endpoint Dead, ping every Active
    /// silo until all answer (retrying until `max_join_attempt_time`), then become
    /// Active and start probing. Must run inside an actix `System`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] (as [`SiloError::Table`]) for invalid options;
    /// [`SiloError::Transport`] if the endpoint cannot be served;
    /// [`SiloError::Superseded`], [`SiloError::JoinTimeout`]; table errors after retries.
    pub async fn start(self) -> Result<SiloHandle, SiloError> {
        self.options.validate()?;
        crate::validate_id("cluster_id", &self.cluster_id)?;
        if self.table.cluster_id() != self.cluster_id {
            return Err(Error::invalid_config(
                "table",
                format!(
                    "table of cluster `{}` given to a silo of `{}`",
                    self.table.cluster_id(),
                    self.cluster_id
                ),
            )
            .into());
        }
        let options = Arc::new(self.options);
        let transport = self.transport.unwrap_or_else(|| Arc::new(TcpTransport::new()));
        let health = Arc::new(SharedHealth::default());
        let me_cell = Arc::new(OnceLock::new());

        let oracle_ctx: Context<MembershipOracle> = Context::new();
        let oracle_addr = oracle_ctx.address();
        let server = ProbeServer {
            me: me_cell.clone(),
            health: health.clone(),
            transport: transport.clone(),
            oracle: oracle_addr.clone(),
            max_indirect_timeout: options.effective_max_probe_timeout(),
        };
        let listener = transport.serve(self.listen, Arc::new(server)).await?;
        let endpoint = match self.advertise {
            Some(a) => a,
            None if listener.local_addr.ip().is_unspecified() => {
                return Err(Error::invalid_config(
                    "advertise",
                    "listening on an unspecified address needs advertise()",
                )
                .into())
            }
            None => listener.local_addr,
        };
        let generation = self.generation.unwrap_or_else(|| self.clock.now().as_millis());
        let me = SiloAddress::new(endpoint, generation);
        let _ = me_cell.set(me);
        let span = tracing::info_span!("silo", cluster = %self.cluster_id, silo = %me);

        self.table.init(true).await?;
        let now = self.clock.now();
        let mut own_row = MembershipEntry::new(me, SiloStatus::Created, now);
        own_row.host_name = self
            .host_name
            .unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_default());
        own_row.silo_name = self.silo_name.unwrap_or_else(|| me.to_string());
        own_row.role_name = self.role_name;
        own_row.proxy_port = self.proxy_port;
        own_row.update_zone = self.update_zone;
        own_row.fault_zone = self.fault_zone;

        let (latest_tx, latest_rx) = watch::channel(MembershipSnapshot::default());
        let (snapshot_tx, snapshot_rx) = watch::channel(MembershipSnapshot::default());
        let (status_tx, status_rx) = watch::channel(SiloStatus::Created);
        let stop_tx = Arc::new(watch::channel(false).0);
        let oracle = MembershipOracle {
            cluster_id: self.cluster_id.clone(),
            me,
            own_row,
            table: self.table.clone(),
            transport: transport.clone(),
            options: options.clone(),
            clock: self.clock.clone(),
            current: MembershipSnapshot::default(),
            latest_tx,
            snapshot_tx,
            status_tx,
            stop_tx: stop_tx.clone(),
            subscribers: Vec::new(),
            listener: Some(listener),
            on_declared_dead: self.on_declared_dead,
            refresh_retry: false,
        };
        let oracle = oracle_ctx.run(oracle);
        let handle = SiloHandle {
            cluster_id: self.cluster_id.clone(),
            address: me,
            oracle: oracle.clone(),
            snapshot: snapshot_rx,
            latest: latest_rx.clone(),
            status: status_rx.clone(),
            stop: stop_tx.clone(),
        };
        let join = async {
            tracing::info!("joining");
            ask(&oracle, JoinTable).await??;
            validate_connectivity(&handle, &transport, &options).await?;
            ask(&oracle, SetOwnStatus(SiloStatus::Active)).await??;
            tracing::info!("active");
            Ok::<(), SiloError>(())
        }
        .instrument(span);
        if let Err(e) = join.await {
            tracing::error!(cluster = %self.cluster_id, silo = %me, error = %e, "join failed");
            if !matches!(e, SiloError::Superseded { .. } | SiloError::DeclaredDead) {
                let _ = ask(&oracle, SetOwnStatus(SiloStatus::Dead)).await;
            }
            stop_tx.send_replace(true);
            return Err(e);
        }
        let shared = SiloShared {
            cluster: Arc::from(self.cluster_id.as_str()),
            me,
            options,
            clock: self.clock,
            transport,
            health,
            latest: latest_rx,
            status: status_rx,
        };
        LocalHealthMonitor {
            shared: shared.clone(),
            stop: stop_tx.subscribe(),
            last_tick: tokio::time::Instant::now(),
        }
        .start();
        ClusterHealthMonitor {
            shared,
            oracle,
            stop: stop_tx.subscribe(),
            agents: BTreeMap::new(),
        }
        .start();
        Ok(handle)
    }
}

async fn ask<M>(oracle: &Addr<MembershipOracle>, msg: M) -> Result<M::Result, SiloError>
where
    M: Message + Send + 'static,
    M::Result: Send,
    MembershipOracle: actix::Handler<M>,
{
    oracle.send(msg).await.map_err(|_| SiloError::Stopped)
}

/// Joining: ping every Active silo until all answer or `max_join_attempt_time`
/// passes (Orleans: "validate initial connectivity").
async fn validate_connectivity(
    handle: &SiloHandle,
    transport: &Arc<dyn Transport>,
    options: &ClusterMembershipOptions,
) -> Result<(), SiloError> {
    let started = tokio::time::Instant::now();
    loop {
        let snap = handle.latest.borrow().clone();
        let peers: Vec<SiloAddress> = snap
            .active()
            .map(|e| e.silo)
            .filter(|s| *s != handle.address)
            .collect();
        let probes = peers
            .iter()
            .map(|p| direct_probe(transport, handle.address, *p, options.probe_timeout));
        let results = futures_util::future::join_all(probes).await;
        let unreachable: Vec<SiloAddress> = peers
            .iter()
            .zip(results)
            .filter(|(_, r)| !matches!(r, Direct::Answered(_)))
            .map(|(p, _)| *p)
            .collect();
        if unreachable.is_empty() {
            return Ok(());
        }
        let waited = started.elapsed();
        if waited >= options.max_join_attempt_time {
            return Err(SiloError::JoinTimeout { unreachable, waited });
        }
        tracing::warn!(
            ?unreachable,
            "joining: some Active silos do not answer yet; retrying"
        );
        tokio::time::sleep(options.probe_timeout).await;
        // Unreachable silos may have been declared dead meanwhile.
        ask(&handle.oracle, Refresh).await??;
    }
}

/// A running silo. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SiloHandle {
    cluster_id: String,
    address: SiloAddress,
    oracle: Addr<MembershipOracle>,
    snapshot: watch::Receiver<MembershipSnapshot>,
    latest: watch::Receiver<MembershipSnapshot>,
    status: watch::Receiver<SiloStatus>,
    stop: Arc<watch::Sender<bool>>,
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

    /// This silo's own status as it knows it (Joining, Active, ..., Dead).
    pub fn status(&self) -> SiloStatus {
        *self.status.borrow()
    }

    /// The latest membership snapshot (newest table version seen).
    pub fn snapshot(&self) -> MembershipSnapshot {
        self.snapshot.borrow().clone()
    }

    /// A `tokio::sync::watch` of membership snapshots; it changes on every new table
    /// version, so versions seen by one receiver strictly increase.
    pub fn subscribe(&self) -> watch::Receiver<MembershipSnapshot> {
        self.snapshot.clone()
    }

    /// A watch of this silo's own status; it ends at Dead.
    pub fn subscribe_status(&self) -> watch::Receiver<SiloStatus> {
        self.status.clone()
    }

    /// Sends [`MembershipChanged`] to an actix actor on every new table version
    /// (and the current snapshot at once).
    pub fn subscribe_recipient(&self, recipient: Recipient<MembershipChanged>) {
        self.oracle.do_send(Subscribe(recipient));
    }

    /// Reads the table now and returns the oracle's newest snapshot.
    ///
    /// # Errors
    /// [`SiloError::Table`] if the read fails; [`SiloError::Stopped`].
    pub async fn refresh(&self) -> Result<MembershipSnapshot, SiloError> {
        ask(&self.oracle, Refresh).await?
    }

    /// The oracle's newest snapshot, including IAmAlive changes that do not bump the
    /// version.
    ///
    /// # Errors
    /// [`SiloError::Stopped`].
    pub async fn latest_snapshot(&self) -> Result<MembershipSnapshot, SiloError> {
        ask(&self.oracle, GetSnapshot).await
    }

    /// Graceful shutdown: writes ShuttingDown then Dead, gossips, stops every agent.
    ///
    /// # Errors
    /// [`SiloError::Table`] if the writes fail (the agents stop anyway);
    /// [`SiloError::Stopped`] if already stopped.
    pub async fn shutdown(&self) -> Result<(), SiloError> {
        let r = ask(&self.oracle, Shutdown { graceful: true }).await;
        self.stop.send_replace(true);
        r?
    }

    /// Ungraceful stop: writes Stopping then Dead (so nobody has to detect the
    /// departure), gossips and stops every agent at once, without waiting for
    /// anything else of the application.
    ///
    /// # Errors
    /// As [`shutdown`](Self::shutdown).
    pub async fn stop(&self) -> Result<(), SiloError> {
        let r = ask(&self.oracle, Shutdown { graceful: false }).await;
        self.stop.send_replace(true);
        r?
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

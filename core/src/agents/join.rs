//! The join driver behind [`SiloBuilder::start`]: opens the table, serves the probe
//! endpoint, starts the membership agent and waits for the machine's verdict on the
//! join (Active, or why not). The join itself (older generations Dead, own row
//! Joining, connectivity validation, Active) is decided by the
//! [`SiloMachine`](crate::protocol::SiloMachine).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use actix::{AsyncContext, Context};
use rand::Rng;
use tokio::sync::{oneshot, watch};

use crate::protocol::SiloMachine;
use crate::transport::tcp::{TcpConfig, TcpTransport};
use crate::{Error, MembershipEntry, MembershipSnapshot, SiloAddress, SiloError, SiloStatus};

use super::api::{SiloBuilder, SiloHandle};
use super::executor::{MembershipAgent, Outputs, SharedHealth};
use super::server::ProbeServer;

/// `table.init`, each attempt bounded by `table_operation_timeout`, retried while the
/// store fails transiently until `max_join_attempt_time` ([`crate::retry_transient`]).
async fn init_table(
    table: &dyn crate::MembershipTable,
    options: &crate::ClusterMembershipOptions,
    cluster: &str,
) -> Result<(), Error> {
    let what = format!("membership table of cluster {cluster}");
    crate::retry_transient(&what, options.max_join_attempt_time, || async {
        crate::bounded(options.table_operation_timeout, table.init(true), |t| {
            Error::backend(format!("init did not answer within {t:?}"))
        })
        .await
    })
    .await
}

impl SiloBuilder {
    /// Starts the silo and runs its join: open the cluster's membership table (in the
    /// mode the options select; a store that fails transiently is retried with
    /// backoff, each failure logged, for up to `max_join_attempt_time`), serve the
    /// probe endpoint, insert our row (Joining),
    /// declare older generations of our endpoint Dead, ping every Active silo until
    /// all answer (retrying until `max_join_attempt_time`), then become Active and
    /// start probing. Must run inside an actix `System`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] (as [`SiloError::Table`]) for invalid options or
    /// cluster id, or a shared secret given with a custom transport; [`SiloError::Transport`] if the endpoint cannot be served;
    /// [`SiloError::Superseded`], [`SiloError::DeclaredDead`],
    /// [`SiloError::JoinTimeout`]; table errors after the machine's retries.
    pub async fn start(self) -> Result<SiloHandle, SiloError> {
        self.options.validate()?;
        crate::validate_id("cluster_id", &self.cluster_id)?;
        if !self.own_thread {
            return self.start_on(None).await;
        }
        // The silo's own thread: everything the join starts (the probe
        // endpoint's tasks, the agent and what it spawns) lives there.
        let arbiter = actix::Arbiter::new();
        let handle = arbiter.handle();
        let (tx, rx) = oneshot::channel();
        let spawned = arbiter.spawn_fn(move || {
            actix::spawn(async move {
                let _ = tx.send(self.start_on(Some(handle)).await);
            });
        });
        let started = if spawned {
            rx.await.unwrap_or(Err(SiloError::Stopped))
        } else {
            Err(SiloError::Stopped)
        };
        if started.is_err() {
            arbiter.stop();
        }
        started
    }

    /// The join, run on the current arbiter; `arbiter` (when the silo runs on
    /// a thread of its own) is stopped when the membership agent stops.
    async fn start_on(self, arbiter: Option<actix::ArbiterHandle>) -> Result<SiloHandle, SiloError> {
        let table = self
            .store
            .membership_table(&self.cluster_id, self.options.protocol_mode())?;
        let options = Arc::new(self.options);
        let cluster: Arc<str> = Arc::from(self.cluster_id.as_str());
        let transport: Arc<dyn crate::transport::Transport> = match (self.transport, self.shared_secret) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid_config(
                    "shared_secret",
                    "set the secret on the custom transport, not on the builder",
                )
                .into())
            }
            (Some(t), None) => t,
            (None, shared_secret) => Arc::new(TcpTransport::with_config(TcpConfig {
                shared_secret,
                frame_timeout: options.probe_timeout,
                ..TcpConfig::default()
            })),
        };
        let health = Arc::new(SharedHealth::default());
        let me_cell = Arc::new(OnceLock::new());
        let agent_cell = Arc::new(OnceLock::new());
        let notices = Arc::new(super::NoticeSinks::default());
        let server = ProbeServer {
            notices: notices.clone(),
            me: me_cell.clone(),
            cluster: cluster.clone(),
            health: health.clone(),
            transport: transport.clone(),
            agent: agent_cell.clone(),
            max_indirect_timeout: options.effective_max_probe_timeout(),
            clock: self.clock.clone(),
        };
        let listener = transport
            .serve(self.listen, &self.cluster_id, Arc::new(server))
            .await?;
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

        init_table(&*table, &options, &self.cluster_id).await?;
        let now = self.clock.now();
        let mut own_row = MembershipEntry::new(me, SiloStatus::Created, now);
        own_row.host_name = self
            .host_name
            .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
        own_row.silo_name = self.silo_name.unwrap_or_else(|| me.to_string());
        own_row.role_name = self.role_name;
        // The names are options here: a bad one is a configuration error.
        own_row.validate().map_err(|e| match e {
            Error::InvalidInput { what, why } => Error::invalid_config(what, why),
            other => other,
        })?;
        own_row.proxy_port = self.proxy_port;
        own_row.update_zone = self.update_zone;
        own_row.fault_zone = self.fault_zone;

        let seed = self.seed.unwrap_or_else(|| rand::rng().random());
        let machine = SiloMachine::new(self.cluster_id.clone(), me, own_row, (*options).clone(), seed);
        let (latest_tx, latest_rx) = watch::channel(Arc::new(MembershipSnapshot::default()));
        let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(MembershipSnapshot::default()));
        let (status_tx, status_rx) = watch::channel(SiloStatus::Created);
        let (clock_tx, clock_rx) =
            watch::channel(crate::protocol::ClockReport::unmeasured(options.max_clock_offset));
        let stop_tx = Arc::new(watch::channel(false).0);
        let (joined_tx, joined_rx) = oneshot::channel();
        let ctx: Context<MembershipAgent> = Context::new();
        let _ = agent_cell.set(ctx.address());
        let counters = Arc::new(crate::metrics_table::CounterCells::default());
        let agent = MembershipAgent {
            machine,
            cluster,
            me,
            table,
            transport: transport.clone(),
            clock: self.clock,
            table_timeout: options.table_operation_timeout,
            gossip_timeout: options.probe_timeout,
            health: health.clone(),
            outputs: Outputs {
                latest: latest_tx,
                snapshot: snapshot_tx,
                status: status_tx,
                stop: stop_tx.clone(),
                clock: clock_tx,
            },
            clock_offsets: crate::protocol::ClockOffsets::new(options.max_clock_offset),
            monotonic_origin: tokio::time::Instant::now(),
            joined: Some(joined_tx),
            calls: HashMap::new(),
            next_call: 0,
            listener: Some(listener),
            on_declared_dead: self.on_declared_dead,
            counters: counters.clone(),
            vote_write: None,
            labels: crate::telemetry::SiloLabels::new(&self.cluster_id, &me),
            arbiter: arbiter.clone(),
        };
        let agent = ctx.run(agent);
        let handle = SiloHandle {
            cluster_id: self.cluster_id,
            address: me,
            agent,
            options,
            snapshot: snapshot_rx,
            latest: latest_rx,
            status: status_rx,
            clock: clock_rx,
            stop: stop_tx.clone(),
            transport,
            notices,
            counters,
            health,
            leave_hooks: Arc::default(),
            claims: Arc::default(),
            arbiter,
        };
        // The machine bounds the join: every write job gives up after a bounded number
        // of attempts and connectivity validation after max_join_attempt_time.
        match joined_rx.await {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(e)) => {
                stop_tx.send_replace(true);
                Err(e)
            }
            Err(_) => Err(SiloError::Stopped),
        }
    }
}

//! [`RemindersBuilder`]: configures and starts a silo's reminder service.

use super::*;

/// Configures and starts a silo's reminder service. See [`Reminders::builder`].
pub struct RemindersBuilder {
    pub(super) silo: SiloHandle,
    pub(super) store: Arc<dyn SystemStore>,
    pub(super) service_id: Option<String>,
    pub(super) target: Option<Arc<dyn ReminderTarget>>,
    pub(super) options: ReminderOptions,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) seed: Option<u64>,
    pub(super) shards: u32,
}

impl std::fmt::Debug for RemindersBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemindersBuilder")
            .field("silo", &self.silo.address())
            .field("service_id", &self.service_id)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RemindersBuilder {
    /// The reminder service id (partition of the reminder table). Default: the
    /// silo's cluster id.
    pub fn service_id(mut self, id: impl Into<String>) -> Self {
        self.service_id = Some(id.into());
        self
    }

    /// Where ticks go. Required to deliver anything: without a target every
    /// delivery fails (and is retried).
    pub fn target(mut self, target: impl ReminderTarget) -> Self {
        self.target = Some(Arc::new(target));
        self
    }

    /// Options (validated by [`start`](Self::start)).
    pub fn options(mut self, options: ReminderOptions) -> Self {
        self.options = options;
        self
    }

    /// The wall clock (default [`SystemClock`]; simulations use the silo's
    /// [`TokioClock`](rollcall_core::TokioClock)).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The service's shard count S (default
    /// [`DEFAULT_SHARDS`](rollcall_core::DEFAULT_SHARDS), 1,024): the
    /// first silo to start the service records it in the store, and a silo that
    /// starts it with another count is refused (see [`start`](Self::start)). An
    /// actor's reminders and its state are placed by
    /// [`actor_shard`](rollcall_core::actor_shard)`(actor, S)`.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// Seeds the start-up jitter. Default: from the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Starts the service on the silo: opens the reminder table (a store that fails
    /// transiently is retried), subscribes to the silo's membership and notices,
    /// and waits until the shards this silo acquires are loaded, at most the options'
    /// `initialization_timeout` (past it, a warning is logged, loading goes on in
    /// the background and the service starts anyway, like Orleans). Must run
    /// inside the silo's actix `System`.
    ///
    /// # Errors
    /// [`ReminderError::Table`] for invalid options (a `deactivate_drain` not
    /// shorter than the silo's `shutdown_timeout` among them) or service id, a shard count
    /// other than the one the service was first started with
    /// ([`Error::InvalidConfig`](rollcall_core::Error::InvalidConfig)
    /// naming both), or a table that stays unreachable for
    /// `initialization_timeout`; [`ReminderError::Stopped`] if the silo stopped;
    /// [`ReminderError::AlreadyRunning`] if a service of this id runs on this
    /// silo already (one per id per silo, for the silo's life).
    pub async fn start(self) -> Result<Reminders, ReminderError> {
        self.options.validate()?;
        let shutdown_timeout = self.silo.options().shutdown_timeout;
        if self.options.deactivate_drain >= shutdown_timeout {
            return Err(rollcall_core::Error::invalid_config(
                "deactivate_drain",
                format!(
                    "{:?} is not shorter than the silo's shutdown_timeout ({shutdown_timeout:?}), which bounds a graceful leave's releases",
                    self.options.deactivate_drain
                ),
            )
            .into());
        }
        let service_id = self
            .service_id
            .unwrap_or_else(|| self.silo.cluster_id().to_owned());
        rollcall_core::validate_id("service_id", &service_id)?;
        // One service per id per silo, claimed until its agent stops (or
        // this start fails).
        let claim = self
            .silo
            .claim(&rollcall_core::ownership::placement::lease_driver_claim(
                &service_id,
            ))
            .ok_or_else(|| ReminderError::AlreadyRunning {
                service: service_id.clone(),
                silo: self.silo.address().to_string(),
            })?;
        let table = self.store.reminder_table(&service_id)?;
        let parked_id = rollcall_core::parked_service_id(&service_id);
        let parked = rollcall_core::validate_id("service_id", &parked_id)
            .and_then(|()| self.store.reminder_table(&parked_id))
            .ok();
        let options = Arc::new(self.options);
        let op_timeout = options.table_operation_timeout;
        let what = format!("reminder table of service {service_id}");
        // The shard count first: recorded by the first silo, checked by every
        // other; a table that places rows by shard (Redis) reads it on init.
        let lease_table = self.store.lease_table(&service_id)?;
        let shards = self.shards;
        let leases = rollcall_core::retry_transient(&what, options.initialization_timeout, || {
            let lease_table = lease_table.clone();
            async move {
                bounded(op_timeout, ShardLeases::open(lease_table, shards))
                    .await
                    .map_err(|e| match e {
                        ReminderError::Table(e) => e,
                        other => rollcall_core::Error::backend(other.to_string()),
                    })
            }
        })
        .await?;
        let membership = self
            .store
            .membership_table(self.silo.cluster_id(), rollcall_core::ProtocolMode::default())?;

        for t in std::iter::once(&table).chain(parked.as_ref()) {
            rollcall_core::retry_transient(&what, options.initialization_timeout, || async {
                bounded(op_timeout, t.init()).await.map_err(|e| match e {
                    ReminderError::Table(e) => e,
                    other => rollcall_core::Error::backend(other.to_string()),
                })
            })
            .await?;
        }
        if self.silo.is_stopped() {
            return Err(ReminderError::Stopped);
        }
        let target = self.target.unwrap_or_else(|| {
            tracing::warn!("reminder service started without a target: ticks cannot be delivered");
            Arc::new(|_: &ActorId| None)
        });
        let notices = self.silo.subscribe_notices(&topic(&service_id), NOTICE_QUEUE);
        let releases = self
            .silo
            .subscribe_notices(&release_topic(&service_id), NOTICE_QUEUE);
        let rng = match self.seed {
            Some(s) => rand::rngs::StdRng::seed_from_u64(s),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        let machine = ReminderMachine::new(self.silo.address(), &service_id, options.clone(), shards, rng);
        let counters = machine.counters();
        let (held_tx, held) = tokio::sync::watch::channel(crate::Held::default());
        let agent = ReminderAgent {
            claim: Some(claim),
            held: held_tx,
            silo: self.silo.clone(),
            table: table.clone(),
            parked,
            leases: leases.clone(),
            membership,
            target,
            options: options.clone(),
            clock: self.clock.clone(),
            machine,
            notices: Some(notices),
            releases: Some(releases),
            timers: Default::default(),
            first_load_waiters: Vec::new(),
            leave_replies: Vec::new(),
            step: rollcall_core::protocol::StepWatch::new(),
            monotonic_origin: tokio::time::Instant::now(),
            views: None,
            arbiter: None,
        };
        // On a thread of its own when the silo's membership has one: lease
        // confirmations, lease writes and deliveries' bookkeeping then never
        // wait for the application's arbiter (its handlers get the ticks by
        // message), and the membership thread never waits for a mass due
        // time's deliveries.
        let silo = self.silo.clone();
        let start = move |mut agent: ReminderAgent, ctx: &mut actix::Context<ReminderAgent>| {
            agent.views = Some(silo.subscribe_recipient(actix::AsyncContext::address(ctx).recipient()));
            agent
        };
        let agent = if self.silo.own_thread() {
            let arbiter = actix::Arbiter::new();
            let mut agent = agent;
            agent.arbiter = Some(arbiter.handle());
            ReminderAgent::start_in_arbiter(&arbiter.handle(), move |ctx| start(agent, ctx))
        } else {
            ReminderAgent::create(move |ctx| start(agent, ctx))
        };
        // A graceful shutdown of the silo first releases this service's shards,
        // then waits for the notices of its last registrations.
        let notices_sending = Arc::new(tokio::sync::RwLock::new(()));
        let (leaving, sending) = (agent.clone(), notices_sending.clone());
        let silo = self.silo.clone();
        let leave_hook = self.silo.on_leave(move || {
            let (agent, silo, sending) = (leaving.clone(), silo.clone(), sending.clone());
            Box::pin(async move {
                // The newest view first (bounded by 2 x table_operation_timeout):
                // the release hints go to the silos that have the shards now.
                let view = silo.refresh().await.ok().map(Arc::new);
                let (tx, rx) = oneshot::channel();
                if agent.send(Leave(tx, view)).await.is_ok() {
                    let _ = rx.await;
                }
                let _ = tokio::time::timeout(NOTICE_DRAIN, sending.write()).await;
            })
        });
        let (tx, rx) = oneshot::channel();
        agent
            .send(WhenLoaded(tx))
            .await
            .map_err(|_| ReminderError::Stopped)?;
        match tokio::time::timeout(options.initialization_timeout, rx).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ReminderError::Stopped),
            Err(_) => tracing::warn!(
                silo = %self.silo.address(),
                timeout = ?options.initialization_timeout,
                "reminder shards not loaded within initialization_timeout; loading continues in the background"
            ),
        }
        Ok(Reminders {
            inner: Arc::new(Inner {
                ownership: {
                    let agent = agent.clone();
                    rollcall_core::ownership::ShardOwnership::new(
                        &service_id,
                        shards,
                        self.clock.clone(),
                        held.clone(),
                        move |feed| agent.do_send(crate::agent::Feed(crate::machine::Event::from(feed))),
                    )
                },
                view: self.silo.subscribe(),
                ring: std::sync::Mutex::default(),
                silo: self.silo,
                table,
                leases,
                notices_sending,
                options,
                clock: self.clock,
                counters,
                service_id,
                shards,
                owners: std::sync::Mutex::default(),
                held,

                _agent: agent,
                _leave_hook: leave_hook,
            }),
        })
    }
}

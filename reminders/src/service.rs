//! [`Reminders`]: the handle applications use, and the builder that starts a silo's
//! reminder service.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use rand::SeedableRng;
use std::collections::HashMap;

use rollcall_core::lease::LeaseStatus;
use rollcall_core::{
    actor_shard, Clock, Fence, PageToken, ReminderEntry, ReminderOptions, ReminderTable, Removed, RunRecord,
    ShardLeases, SiloAddress, SiloHandle, SystemClock, SystemStore, Timestamp, MAX_REMINDER_PAYLOAD,
};
use tokio::sync::oneshot;

use crate::agent::bounded;
use crate::agent::{Leave, ReminderAgent, WhenLoaded};
use crate::api::{
    Counters, Owner, ReminderError, ReminderHandle, ReminderList, ReminderSpec, ReminderStats,
    ReminderTarget, MAX_NAME, MAX_REPEAT,
};
use crate::machine::{
    notice_target, release_topic, topic, NoticeRetry, ReminderMachine, ShardNotice, NOTICE_QUEUE,
};
use crate::schedule::{Calendar, Timing};
use crate::ActorId;
use rollcall_core::ownership::ring::Ring;

/// Configures and starts a silo's reminder service. See [`Reminders::builder`].
pub struct RemindersBuilder {
    silo: SiloHandle,
    store: Arc<dyn SystemStore>,
    service_id: Option<String>,
    target: Option<Arc<dyn ReminderTarget>>,
    options: ReminderOptions,
    clock: Arc<dyn Clock>,
    seed: Option<u64>,
    shards: u32,
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
            .claim(&format!("reminders/{service_id}"))
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

/// An actor host's registration with the service
/// ([`Reminders::register_host`]); dropping it unregisters.
pub(crate) struct HostGuard {
    reminders: Reminders,
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        self.reminders
            .inner
            ._agent
            .do_send(crate::agent::Feed(crate::machine::Event::Hosts(-1)));
    }
}

/// How long a graceful leave waits for the notices of its last registrations
/// (six sends 500 ms apart, a lease read before each): 5 s.
pub const NOTICE_DRAIN: Duration = Duration::from_secs(5);

struct Inner {
    silo: SiloHandle,
    /// The silo's membership view, and the ring of its Active silos.
    view: tokio::sync::watch::Receiver<std::sync::Arc<rollcall_core::MembershipSnapshot>>,
    ring: std::sync::Mutex<Ring>,
    table: Arc<dyn ReminderTable>,
    /// Where notices go: the holder a shard's lease names.
    leases: ShardLeases,
    /// Held (read) by every notice being sent; a graceful leave takes it
    /// (write) to wait for them.
    notices_sending: Arc<tokio::sync::RwLock<()>>,
    options: Arc<ReminderOptions>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    service_id: String,
    shards: u32,
    /// The owner each shard's lease row named when last read, and when
    /// (at most one entry per shard).
    owners: std::sync::Mutex<HashMap<u32, (Option<Owner>, Timestamp)>>,
    /// The shards this silo holds and keeps (the agent publishes them).
    held: tokio::sync::watch::Receiver<crate::Held>,

    _agent: Addr<ReminderAgent>,
    _leave_hook: rollcall_core::LeaveHookGuard,
}

/// A silo's reminder service: registers, lists and removes durable reminders, and
/// delivers the ticks of the reminders this silo owns to actix actors. Cheap to
/// clone. Start it with [`Reminders::builder`].
///
/// Every call answers within the options' `table_operation_timeout` (one table
/// call); the notice to the owning silo is sent in the background.
///
/// ```no_run
/// # async fn run(silo: rollcall_core::SiloHandle,
/// #     store: std::sync::Arc<dyn rollcall_core::SystemStore>,
/// #     cart: actix::Recipient<rollcall_reminders::ReminderTick>) -> Result<(), rollcall_reminders::ReminderError> {
/// use std::time::Duration;
/// use rollcall_reminders::{ActorId, Reminders};
///
/// let reminders = Reminders::builder(&silo, store)
///     .target(move |_: &ActorId| Some(cart.clone()))
///     .start()
///     .await?;
/// let actor = ActorId::new("cart", "42")?;
/// let handle = reminders
///     .register_or_update(&actor, "expire", Duration::from_secs(60), Duration::from_secs(3600))
///     .await?;
/// reminders.unregister(&handle).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reminders {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reminders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reminders")
            .field("silo", &self.inner.silo.address())
            .field("service_id", &self.inner.service_id)
            .finish_non_exhaustive()
    }
}

/// The time of the last occurrence of `entry` that a repeat count `repeat` and
/// an end time `until` allow (`None`: no end).
fn end_of(
    entry: &ReminderEntry,
    repeat: Option<u32>,
    until: Option<Timestamp>,
) -> Result<Option<Timestamp>, ReminderError> {
    let timing = Timing::of(entry).map_err(|e| ReminderError::InvalidSchedule(e.to_string()))?;
    let mut end = until;
    if let Some(n) = repeat {
        if n == 0 || n > MAX_REPEAT {
            return Err(ReminderError::InvalidSchedule(format!(
                "repeat count {n} is outside 1..={MAX_REPEAT}"
            )));
        }
        let mut last = timing.start_at;
        for _ in 1..n {
            match timing.after(last) {
                Some(next) => last = next,
                None => break,
            }
        }
        end = Some(end.map_or(last, |u| u.min(last)));
    }
    if end.is_some_and(|e| e < timing.start_at) {
        return Err(ReminderError::InvalidSchedule(
            "the end comes before the first tick".into(),
        ));
    }
    Ok(end)
}

impl Reminders {
    /// A builder for the reminder service of `silo`, with its reminder table in
    /// `store` (usually the store of the silo's membership table).
    pub fn builder(silo: &SiloHandle, store: Arc<dyn SystemStore>) -> RemindersBuilder {
        RemindersBuilder {
            silo: silo.clone(),
            store,
            service_id: None,
            target: None,
            options: ReminderOptions::default(),
            clock: Arc::new(SystemClock),
            seed: None,
            shards: rollcall_core::DEFAULT_SHARDS,
        }
    }

    /// The service id.
    pub fn service_id(&self) -> &str {
        &self.inner.service_id
    }

    /// Registers (or replaces) a periodic reminder: first tick `due` from now, then
    /// every `period`, with the options' default missed-tick policy.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_or_update(
        &self,
        actor: &ActorId,
        name: &str,
        due: Duration,
        period: Duration,
    ) -> Result<ReminderHandle, ReminderError> {
        let spec = ReminderSpec::every(due, period).with_policy(self.inner.options.missed_tick_policy);
        self.register(actor, name, spec).await
    }

    /// Registers (or replaces) a one-shot reminder: one tick `due` from now, then
    /// its row is removed.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_once(
        &self,
        actor: &ActorId,
        name: &str,
        due: Duration,
    ) -> Result<ReminderHandle, ReminderError> {
        let spec = ReminderSpec::once(due);
        self.register(actor, name, spec).await
    }

    /// Registers (or replaces) a reminder as `spec` says: writes its row (a new
    /// etag, so earlier handles become stale), then tells the owning silo to read
    /// it (best effort: if the notice is lost the owner's next refresh picks the
    /// row up). A replaced reminder's schedule restarts from the new start and
    /// period.
    ///
    /// # Errors
    /// [`ReminderError::InvalidName`] for an empty name or one over [`MAX_NAME`]
    /// bytes; [`ReminderError::PeriodTooShort`] for a zero period or one below
    /// `minimum_period` (unless `allow_period_below_minimum`, which logs a
    /// warning instead); [`ReminderError::Table`] with
    /// [`Error::InvalidInput`](rollcall_core::Error::InvalidInput) for an actor id
    /// and name longer than the provider stores
    /// ([`SystemStore::key_limits`](rollcall_core::SystemStore::key_limits)),
    /// nothing written; [`ReminderError::Table`] or [`ReminderError::Timeout`]
    /// (after `table_operation_timeout`) if the write failed, in which case the
    /// previous registration, if any, may or may not have been replaced.
    pub async fn register(
        &self,
        actor: &ActorId,
        name: &str,
        spec: ReminderSpec,
    ) -> Result<ReminderHandle, ReminderError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(ReminderError::InvalidName(format!(
                "`{name}` must be 1..={MAX_NAME} bytes"
            )));
        }
        let o = &self.inner.options;
        let period = if spec.cron.is_some() { None } else { spec.period };
        if let Some(period) = period {
            if period.is_zero() || (period < o.minimum_period && !o.allow_period_below_minimum) {
                return Err(ReminderError::PeriodTooShort {
                    period,
                    minimum: o.minimum_period,
                });
            }
            if period < o.minimum_period {
                tracing::warn!(%actor, name, ?period, minimum = ?o.minimum_period, "reminder period below minimum_period");
            }
        }
        if let Some(p) = &spec.payload {
            if p.len() > MAX_REMINDER_PAYLOAD {
                return Err(ReminderError::PayloadTooLarge {
                    len: p.len(),
                    max: MAX_REMINDER_PAYLOAD,
                });
            }
        }
        let now = self.inner.clock.now();
        let mut entry = ReminderEntry::new(
            &self.inner.service_id,
            actor.to_string(),
            name,
            now.saturating_add(spec.due),
            period,
        );
        entry.missed_tick_policy = spec.missed_tick_policy;
        entry.payload = spec.payload;
        if let Some(retry) = spec.retry {
            retry
                .validate()
                .map_err(|e| ReminderError::InvalidSchedule(e.to_string()))?;
            entry.retry = Some(retry);
        }
        if let Some(expr) = &spec.cron {
            let calendar = Calendar::parse(expr, spec.zone.as_deref())
                .map_err(|e| ReminderError::InvalidSchedule(e.to_string()))?;
            entry.start_at = calendar
                .first_at_or_after(entry.start_at)
                .ok_or_else(|| ReminderError::InvalidSchedule(format!("`{expr}` has no occurrence")))?;
            entry.cron = Some(expr.clone());
            entry.zone = spec.zone;
        }
        entry.end_at = end_of(&entry, spec.repeat, spec.until)?;
        let etag = bounded(o.table_operation_timeout, self.inner.table.upsert_row(&entry)).await?;
        entry.etag = etag;
        self.notify_owner(&entry.actor_id, name);
        ReminderHandle::from_entry(entry)
    }

    /// Removes the registration `handle` names.
    ///
    /// # Errors
    /// [`ReminderError::StaleHandle`] if the reminder was re-registered since (the
    /// newer registration stays); [`ReminderError::Table`] or
    /// [`ReminderError::Timeout`]. A reminder already gone is `Ok`.
    pub async fn unregister(&self, handle: &ReminderHandle) -> Result<(), ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        let actor = handle.actor.to_string();
        let removed = bounded(
            t,
            self.inner
                .table
                .remove_row(&actor, &handle.name, &handle.etag, None),
        )
        .await?;
        if removed {
            self.notify_owner(&actor, &handle.name);
            bounded(t, self.inner.table.remove_runs(&actor, &handle.name)).await?;
            return Ok(());
        }
        match bounded(t, self.inner.table.read_row(&actor, &handle.name)).await? {
            None => Ok(()),
            Some(_) => Err(ReminderError::StaleHandle {
                actor: handle.actor.clone(),
                name: handle.name.clone(),
            }),
        }
    }

    /// The run history of the reminder `name` of `actor`, newest first: one
    /// record per occurrence (delivered, failed, given up, parked, or skipped
    /// by an overrunning handler) and per trigger, with when, where and how
    /// many attempts, the newest `run_history` (option, default 20) of them.
    /// Kept for scheduled (periodic and calendar) reminders and triggers,
    /// not for plain one-shots; written in the background by the silo that
    /// handled the occurrence, so the newest may be missing for a moment (or
    /// for good, if that silo crashed first, or `runs_dropped` counted it).
    /// Survives the silos and re-registration; removed by `unregister` and
    /// the bulk deletes.
    ///
    /// # Errors
    /// [`ReminderError::Table`] or [`ReminderError::Timeout`].
    pub async fn history(&self, actor: &ActorId, name: &str) -> Result<Vec<RunRecord>, ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        bounded(t, self.inner.table.read_runs(&actor.to_string(), name)).await
    }

    /// Pauses the reminder `name` of `actor`: no silo delivers its ticks (a
    /// tick already being delivered finishes) until [`resume`](Self::resume),
    /// and it keeps its schedule. Stored in its row
    /// ([`ReminderTable::update_paused`]) under its etag, which stays: the
    /// registration, its handles and its ticks' occurrence ids are unchanged.
    /// The holder of its shard is told at once (as after a registration), and
    /// every other silo, and the next holder after a handoff or a crash,
    /// reads the column with the row. Pausing a paused reminder changes
    /// nothing.
    ///
    /// Answers within 2 x `table_operation_timeout` per attempt, 3 attempts
    /// at most (a registration racing the pause costs one).
    ///
    /// # Errors
    /// [`ReminderError::NotFound`]; [`ReminderError::StaleHandle`] if it was
    /// re-registered during each of 3 attempts; [`ReminderError::Table`] or
    /// [`ReminderError::Timeout`] (a timed-out write is read back first: if it
    /// landed, the pause answers `Ok`).
    pub async fn pause(&self, actor: &ActorId, name: &str) -> Result<ReminderHandle, ReminderError> {
        let now = self.inner.clock.now();
        self.set_paused(actor, name, Some(now)).await
    }

    /// Resumes a paused reminder: its holder plans it again from now under
    /// its missed-tick policy (`Skip`: the next occurrence after now;
    /// `FireOnce`: one tick now if any occurrence fell in the pause; a
    /// one-shot whose time passed: now). Resuming a ticking reminder changes
    /// nothing. A parked occurrence ([`RetryPolicy::park`](rollcall_core::RetryPolicy::park)) is a paused
    /// one-shot of the `<service>.parked` service and resumes the same way.
    ///
    /// # Errors
    /// As [`pause`](Self::pause).
    pub async fn resume(&self, actor: &ActorId, name: &str) -> Result<ReminderHandle, ReminderError> {
        self.set_paused(actor, name, None).await
    }

    async fn set_paused(
        &self,
        actor: &ActorId,
        name: &str,
        paused: Option<Timestamp>,
    ) -> Result<ReminderHandle, ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        let (row, changed) = set_paused(&*self.inner.table, actor, name, paused, t).await?;
        if changed {
            self.notify_owner(&row.actor_id, name);
        }
        ReminderHandle::from_entry(row)
    }

    /// Triggers the reminder `name` of `actor` now: one extra tick, at once,
    /// besides its schedule (which is unchanged), paused or not. Written as a
    /// one-shot row named `<name>#trigger-<ms>-<random>` that carries the
    /// reminder's payload and retry policy and whose tick carries `name` (see
    /// [`ReminderEntry::trigger_of`]); its own etag gives the tick its own
    /// occurrence id. So it has a one-shot's guarantees: delivered exactly
    /// once through graceful handoffs, at least once through a crash. Returns
    /// the trigger row's handle (unregister it to cancel the trigger before
    /// it is delivered).
    ///
    /// # Errors
    /// [`ReminderError::NotFound`]; [`ReminderError::InvalidName`] when `name`
    /// with the suffix is over [`MAX_NAME`] bytes; [`ReminderError::Table`] or
    /// [`ReminderError::Timeout`] (within 2 x `table_operation_timeout`).
    pub async fn trigger(&self, actor: &ActorId, name: &str) -> Result<ReminderHandle, ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        let actor_id = actor.to_string();
        let Some(of) = bounded(t, self.inner.table.read_row(&actor_id, name)).await? else {
            return Err(ReminderError::NotFound {
                actor: actor.clone(),
                name: name.to_owned(),
            });
        };
        let mut entry = trigger_row(&of, self.inner.clock.now(), rand::random())?;
        entry.etag = bounded(t, self.inner.table.upsert_row(&entry)).await?;
        self.notify_owner(&actor_id, &entry.name);
        ReminderHandle::from_entry(entry)
    }

    /// The reminder `name` of `actor`, or `None`.
    ///
    /// # Errors
    /// [`ReminderError::Table`] or [`ReminderError::Timeout`].
    pub async fn get(&self, actor: &ActorId, name: &str) -> Result<Option<ReminderHandle>, ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        bounded(t, self.inner.table.read_row(&actor.to_string(), name))
            .await?
            .map(ReminderHandle::from_entry)
            .transpose()
    }

    /// Every reminder of `actor`.
    ///
    /// # Errors
    /// [`ReminderError::Table`] or [`ReminderError::Timeout`].
    pub async fn list(&self, actor: &ActorId) -> Result<Vec<ReminderHandle>, ReminderError> {
        let t = self.inner.options.table_operation_timeout;
        bounded(t, self.inner.table.read_rows_for(&actor.to_string()))
            .await?
            .into_iter()
            .map(ReminderHandle::from_entry)
            .collect()
    }

    /// The silo `actor`'s shard is assigned to in this silo's current
    /// membership view (the ring of Active silos); `None` if no silo is
    /// Active. A guess from the local view: the assigned silo may not hold the
    /// shard yet (it acquires it) or any more. Use [`owner`](Self::owner) for
    /// the holder the store names.
    pub fn owner_of(&self, actor: &ActorId) -> Option<SiloAddress> {
        owner_in(&self.inner, &actor.to_string())
    }

    /// The fence of `actor`'s shard when this silo holds it now (acquired, not
    /// being released): the service, the shard and the epoch it holds it at.
    /// State writes made under it ([`StateStorage::fenced`](rollcall_core::StateStorage::fenced))
    /// are refused by the store once another silo took the shard over. `None`
    /// when another silo holds it, or nobody. Never waits.
    pub fn fence(&self, actor: &ActorId) -> Option<Fence> {
        let shard = actor_shard(&actor.to_string(), self.inner.shards);
        let clock = &self.inner.clock;
        let epoch = self
            .inner
            .held
            .borrow()
            .epoch_at(shard, clock.now(), clock.monotonic())?;
        Some(Fence {
            service: self.inner.service_id.clone(),
            shards: self.inner.shards,
            shard,
            epoch,
        })
    }

    /// The shards this silo holds and keeps, each with the epoch it acquired
    /// it at (shard -> epoch), and until when it may act as their holder
    /// (lease fencing: its last confirmation of its own row Active plus the
    /// lease period), as a watch: it changes when a shard is acquired (a new
    /// entry, or a new epoch), when one is being released or was lost (its
    /// entry goes, before the release is written), on each confirmation, and
    /// when the service stops (nothing held). For
    /// applications that host actors their own way ([`ActorHost`](crate::ActorHost)
    /// watches it). The shard of an actor is
    /// [`actor_shard`](rollcall_core::actor_shard)`(actor, shards)` with the
    /// service's [`shards`](Self::shards).
    pub fn held_shards(&self) -> tokio::sync::watch::Receiver<crate::Held> {
        self.inner.held.clone()
    }

    /// Registers an actor host: while its guard lives, a release of a shard
    /// waits (at most the options' `deactivate_drain`) for
    /// [`host_drained`](Self::host_drained) of the
    /// shard before it is written, so the next holder activates the shard's
    /// actors only after this silo's activations ended.
    pub(crate) fn register_host(&self) -> HostGuard {
        self.inner
            ._agent
            .do_send(crate::agent::Feed(crate::machine::Event::Hosts(1)));
        HostGuard {
            reminders: self.clone(),
        }
    }

    /// The actor hosts ended every activation of `shard` held at `epoch`
    /// (see [`register_host`](Self::register_host)). Never waits.
    pub(crate) fn host_drained(&self, shard: u32, epoch: u64) {
        self.inner
            ._agent
            .do_send(crate::agent::Feed(crate::machine::Event::HostDrained {
                shard,
                epoch,
            }));
    }

    /// A store refused a write under `fence` (`Error::Fenced`): the shard's
    /// lease row is read again at once (shards rule 10), so a lease whose
    /// acquire a store failover lost heals now, not at its next
    /// verification.
    pub(crate) fn lease_fenced(&self, fence: &rollcall_core::Fence) {
        if fence.service == self.inner.service_id {
            self.inner
                ._agent
                .do_send(crate::agent::Feed(crate::machine::Event::Shard(
                    crate::shards::ShardEvent::Fenced {
                        shard: fence.shard,
                        epoch: fence.epoch,
                    },
                )));
        }
    }

    /// The service's shard count (recorded in the store).
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The silo holding `actor`'s shard, as its lease row in the store names
    /// it (never a guess from the ring): its address, the lease's epoch and
    /// its advertised endpoint (the silo's IP and the proxy port of its
    /// membership row, when it set one: `SiloBuilder::proxy_port`). `None`
    /// when nobody holds the shard, or its holder is not Active in this silo's
    /// view (a crash being taken over): ask again.
    ///
    /// Answered from this silo's own leases when it holds the shard, else
    /// from the row read at most `lease_poll` ago, else by one read of the
    /// row: within `table_operation_timeout`.
    ///
    /// # Errors
    /// [`ReminderError::Table`] when the read fails or the row is malformed;
    /// [`ReminderError::Timeout`].
    pub async fn owner(&self, actor: &ActorId) -> Result<Option<Owner>, ReminderError> {
        let inner = &self.inner;
        let endpoint = |silo: &SiloAddress| {
            inner
                .view
                .borrow()
                .entry(silo)
                .filter(|e| e.status == rollcall_core::SiloStatus::Active)
                .map(|e| {
                    (e.proxy_port != 0).then(|| std::net::SocketAddr::new(silo.endpoint().ip(), e.proxy_port))
                })
        };
        if let Some(f) = self.fence(actor) {
            let me = inner.silo.address();
            return Ok(Some(Owner {
                endpoint: endpoint(&me).flatten(),
                silo: me,
                epoch: f.epoch,
            }));
        }
        let shard = actor_shard(&actor.to_string(), inner.shards);
        let now = inner.clock.now();
        let cached = inner
            .owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&shard)
            .filter(|(_, at)| now < at.saturating_add(inner.options.lease_poll))
            .map(|(o, _)| o.clone());
        let owner = match cached {
            Some(o) => o,
            None => {
                let lease = bounded(
                    inner.options.table_operation_timeout,
                    inner.leases.read_head(shard),
                )
                .await?;
                let owner = match (lease.status, lease.owner) {
                    (LeaseStatus::Owned, Some(silo)) => Some(Owner {
                        silo,
                        epoch: lease.epoch,
                        endpoint: None,
                    }),
                    _ => None,
                };
                inner
                    .owners
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(shard, (owner.clone(), now));
                owner
            }
        };
        // The holder must be Active in the view now; its endpoint is read here.
        Ok(owner.and_then(|o| {
            let ep = endpoint(&o.silo)?;
            Some(Owner { endpoint: ep, ..o })
        }))
    }

    /// This silo's counters. Never waits.
    pub fn stats(&self) -> ReminderStats {
        self.inner.counters.read()
    }

    /// The lateness (p50, p99, max) of the ticks this silo delivered since the
    /// previous call, and a new window; `None` when it delivered none. Meant
    /// for one periodic reader (the metrics publisher appends it to the
    /// statistics store as `tick_lateness_p50_ms` and `tick_lateness_p99_ms`):
    /// two readers would each see part of the ticks. Never waits.
    pub fn take_lateness(&self) -> Option<crate::Lateness> {
        self.inner.counters.take_lateness()
    }

    /// One page of the reminders of actor kind `kind` (`"cart"`), in ring
    /// order, after `after` (`None`: the first page), at most `size`
    /// (1..=10,000). The next page's token is in the answer; only an answer
    /// without one is the last. A page reads the table in a few pieces (at
    /// most 50,000 rows, matching or not, so a page of a rare kind may be
    /// short), every rule in [`rollcall_core::paging`].
    ///
    /// Answers within 4 x `table_operation_timeout`.
    ///
    /// # Errors
    /// [`ReminderError::InvalidActor`] for an empty kind or one with `/` or
    /// control characters; [`ReminderError::Table`] with
    /// [`Error::InvalidInput`](rollcall_core::Error::InvalidInput) for a size
    /// outside 1..=10,000; [`ReminderError::Table`] or
    /// [`ReminderError::Timeout`].
    pub async fn list_kind(
        &self,
        kind: &str,
        after: Option<&PageToken>,
        size: usize,
    ) -> Result<ReminderList, ReminderError> {
        self.list_prefix(&ActorId::kind_prefix(kind)?, after, size).await
    }

    /// As [`list_kind`](Self::list_kind), for the reminders whose actor id
    /// (`kind/key`) starts with `prefix` (`"cart/eu-"`; `""`: all of them).
    ///
    /// # Errors
    /// As [`list_kind`](Self::list_kind), without the kind check.
    pub async fn list_prefix(
        &self,
        prefix: &str,
        after: Option<&PageToken>,
        size: usize,
    ) -> Result<ReminderList, ReminderError> {
        let t = self.inner.options.table_operation_timeout.saturating_mul(4);
        let page = bounded(t, self.inner.table.read_page(prefix, after, size)).await?;
        Ok(ReminderList {
            reminders: page
                .rows
                .into_iter()
                .map(ReminderHandle::from_entry)
                .collect::<Result<_, _>>()?,
            next: page.next,
        })
    }

    /// Removes every reminder of actor kind `kind`. See
    /// [`delete_prefix`](Self::delete_prefix).
    ///
    /// # Errors
    /// [`ReminderError::InvalidActor`] for a kind as [`list_kind`](Self::list_kind)
    /// refuses; otherwise as [`delete_prefix`](Self::delete_prefix).
    pub async fn delete_kind(&self, kind: &str) -> Result<Removed, ReminderError> {
        self.delete_prefix(&ActorId::kind_prefix(kind)?).await
    }

    /// Removes every reminder whose actor id starts with `prefix`, page by page
    /// (1,000 rows), one conditional remove per row on the etag its page read,
    /// 32 at a time ([`rollcall_core::paging::remove_prefix`]): no transaction
    /// spans two rows, so it is safe to run again after a crash or an error, and
    /// a reminder re-registered meanwhile stays (counted in
    /// [`Removed::changed`]). Then tells the holder of each shard it changed to
    /// read the shard again (in the background, as a registration's notice), so
    /// the removed reminders stop ticking without waiting for a refresh.
    ///
    /// Takes about one store round trip per 32 rows; each store call is
    /// bounded by `table_operation_timeout`, the whole delete is not.
    ///
    /// # Errors
    /// [`ReminderError::Table`] for the first failed store call (a timed-out
    /// one included; it may have been applied): the rows removed so far stay
    /// removed and their holders are told; running it again finishes the work.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<Removed, ReminderError> {
        let shards = self.inner.shards;
        let mut changed = std::collections::BTreeSet::new();
        let result = rollcall_core::paging::remove_prefix(
            &*self.inner.table,
            prefix,
            BULK_PAGE,
            BULK_CONCURRENCY,
            self.inner.options.table_operation_timeout,
            &mut |row| {
                changed.insert(rollcall_core::hash_shard(row.hash, shards));
            },
        )
        .await;
        for shard in changed {
            let body = serde_json::to_vec(&ShardNotice {
                service: self.inner.service_id.clone(),
                shard,
            });
            if let Ok(body) = body {
                send_to_holder(&self.inner, shard, body);
            }
        }
        Ok(result?)
    }

    /// Sends "re-read this reminder" in the background where
    /// [`notice_target`] says, by the rule of [`NoticeRetry`] (the lease read
    /// again before each send). A graceful leave waits for it ([`NOTICE_DRAIN`]).
    fn notify_owner(&self, actor_id: &str, name: &str) {
        let retry = NoticeRetry::new(&self.inner.service_id, actor_id, name);
        let Ok(body) = serde_json::to_vec(retry.notice()) else {
            return;
        };
        let shard = rollcall_core::actor_shard(actor_id, self.inner.shards);
        send_to_holder(&self.inner, shard, body);
    }
}

/// The one-shot row that triggers reminder `of` at `now`: named
/// `<name>#trigger-<ms>-<salt>`, with its payload and retry policy, and
/// [`trigger_of`](ReminderEntry::trigger_of) set to its name.
///
/// # Errors
/// [`ReminderError::InvalidName`] when that name is over [`MAX_NAME`] bytes.
pub fn trigger_row(of: &ReminderEntry, now: Timestamp, salt: u16) -> Result<ReminderEntry, ReminderError> {
    let name = format!("{}#trigger-{}-{salt:04x}", of.name, now.as_millis());
    if name.len() > MAX_NAME {
        return Err(ReminderError::InvalidName(format!(
            "`{}` is too long to trigger: `{name}` is over {MAX_NAME} bytes",
            of.name
        )));
    }
    let mut entry = ReminderEntry::new(&of.service_id, &of.actor_id, name, now, None);
    entry.payload.clone_from(&of.payload);
    entry.retry = of.retry;
    entry.trigger_of = Some(of.name.clone());
    Ok(entry)
}

/// Sets the paused column of the reminder `name` of `actor` in `table` to
/// `paused` under its etag ([`ReminderTable::update_paused`]), each call
/// bounded by `timeout`, 3 attempts at most (a registration racing it costs
/// one); a write that timed out is read back before it errs. Returns the row
/// as written and whether it changed (pausing a paused reminder does not).
/// The rule of [`Reminders::pause`] and `resume`, for callers outside a silo
/// too (the CLI); they then tell the holder ([`tell_holder`]).
///
/// # Errors
/// [`ReminderError::NotFound`]; [`ReminderError::StaleHandle`] if it was
/// re-registered during each attempt; [`ReminderError::Table`] or
/// [`ReminderError::Timeout`].
pub async fn set_paused(
    table: &dyn ReminderTable,
    actor: &ActorId,
    name: &str,
    paused: Option<Timestamp>,
    timeout: Duration,
) -> Result<(ReminderEntry, bool), ReminderError> {
    let actor_id = actor.to_string();
    for _ in 0..3 {
        let Some(mut row) = bounded(timeout, table.read_row(&actor_id, name)).await? else {
            return Err(ReminderError::NotFound {
                actor: actor.clone(),
                name: name.to_owned(),
            });
        };
        if row.paused.is_some() == paused.is_some() {
            return Ok((row, false));
        }
        let written = match bounded(timeout, table.update_paused(&actor_id, name, &row.etag, paused)).await {
            Ok(written) => written,
            // It may have landed: read to learn.
            Err(e) => match bounded(timeout, table.read_row(&actor_id, name)).await {
                Ok(Some(now)) if now.etag == row.etag && now.paused.is_some() == paused.is_some() => true,
                _ => return Err(e),
            },
        };
        if written {
            row.paused = paused;
            return Ok((row, true));
        }
    }
    Err(ReminderError::StaleHandle {
        actor: actor.clone(),
        name: name.to_owned(),
    })
}

/// What [`tell_holder`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// The holder took the notice: it reads the row now.
    Taken(SiloAddress),
    /// The holder was reached and did not take it (its shard is moving, or
    /// its notice queue is full): its next load or refresh reads the row.
    NotTaken(SiloAddress),
    /// Nobody holds the shard: its next acquire loads the row.
    NoHolder,
}

/// Tells the holder of `actor_id`'s shard of reminder service `service_id`
/// to read reminder `name` again, from a process that is not a silo of the
/// cluster (the `rollcall` CLI after it paused, resumed or triggered a
/// reminder in the store): the shard's lease is read from `store`, and the
/// notice sent once over `transport` as a probe-port request of cluster
/// `cluster` (with the cluster's shared secret when its silos use one: give
/// `transport` the same). Without it the holder learns at its next refresh
/// (`refresh_reminder_list_period`). Reading the shard count records the
/// default (1,024) for a service that has none yet.
///
/// Answers within 2 x `timeout` (the lease read, the send).
///
/// # Errors
/// [`ReminderError::Table`] (the lease table), [`ReminderError::Timeout`]; a
/// holder that cannot be reached is [`ReminderError::Table`] with
/// [`Error::Backend`](rollcall_core::Error::Backend).
pub async fn tell_holder(
    store: &dyn SystemStore,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    actor_id: &str,
    name: &str,
    timeout: Duration,
) -> Result<Told, ReminderError> {
    let leases = open_leases(store, service_id, timeout).await?;
    let shard = rollcall_core::actor_shard(actor_id, leases.shards());
    let body = serde_json::to_vec(NoticeRetry::new(service_id, actor_id, name).notice())
        .map_err(|e| rollcall_core::Error::backend(format!("encode notice: {e}")))?;
    send_from_outside(&leases, transport, cluster, service_id, shard, body, timeout).await
}

/// What [`tell_shard_holders`] did, shard by shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToldShards {
    /// Shards whose holder took the notice.
    pub taken: usize,
    /// Shards whose holder did not take it (its next load or refresh reads
    /// the shard).
    pub not_taken: usize,
    /// Shards nobody holds (the next acquire loads them).
    pub no_holder: usize,
    /// Shards whose lease could not be read or whose holder could not be
    /// reached (its next refresh reads the shard).
    pub failed: usize,
}

/// After a bulk change made from outside the cluster (the CLI's `reminders
/// delete`): tells the holder of every shard of `service_id` that one of
/// `hashes` (rows' [`actor_hash`](rollcall_core::actor_hash)es) falls in to
/// read the shard again ([`ShardNotice`]), one notice per shard, as
/// [`Reminders::delete_prefix`] does from a silo. The rest as
/// [`tell_holder`].
///
/// Answers within `timeout` plus 2 x `timeout` per shard.
///
/// # Errors
/// [`ReminderError::Table`] or [`ReminderError::Timeout`] when the shard
/// count cannot be read; a shard that fails counts in [`ToldShards::failed`].
pub async fn tell_shard_holders(
    store: &dyn SystemStore,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    hashes: impl IntoIterator<Item = u32>,
    timeout: Duration,
) -> Result<ToldShards, ReminderError> {
    let leases = open_leases(store, service_id, timeout).await?;
    let shards: std::collections::BTreeSet<u32> = hashes
        .into_iter()
        .map(|h| rollcall_core::hash_shard(h, leases.shards()))
        .collect();
    let mut told = ToldShards::default();
    for shard in shards {
        let body = serde_json::to_vec(&ShardNotice {
            service: service_id.to_owned(),
            shard,
        })
        .map_err(|e| rollcall_core::Error::backend(format!("encode notice: {e}")))?;
        match send_from_outside(&leases, transport, cluster, service_id, shard, body, timeout).await {
            Ok(Told::Taken(_)) => told.taken += 1,
            Ok(Told::NotTaken(_)) => told.not_taken += 1,
            Ok(Told::NoHolder) => told.no_holder += 1,
            Err(_) => told.failed += 1,
        }
    }
    Ok(told)
}

/// The shard leases of `service_id` with its recorded shard count.
async fn open_leases(
    store: &dyn SystemStore,
    service_id: &str,
    timeout: Duration,
) -> Result<ShardLeases, ReminderError> {
    let table = store.lease_table(service_id)?;
    bounded(timeout, async {
        let shards = table.shard_count(rollcall_core::DEFAULT_SHARDS).await?;
        ShardLeases::open(table, shards).await
    })
    .await
}

/// Sends `body` on the notice topic of `service_id`, from outside the
/// cluster, to the holder of `shard` (once, no retry).
async fn send_from_outside(
    leases: &ShardLeases,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    shard: u32,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Told, ReminderError> {
    let lease = bounded(timeout, leases.read_head(shard)).await?;
    let Some(holder) = notice_target(&lease) else {
        return Ok(Told::NoHolder);
    };
    let request = rollcall_core::transport::ProbeRequest::Notice {
        // Not a silo: an address no silo has (the holder only logs it).
        from: SiloAddress::new(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), 0),
        topic: topic(service_id),
        body,
    };
    match transport
        .request(holder.endpoint(), cluster, request, timeout)
        .await
    {
        Ok(rollcall_core::transport::ProbeResponse::NoticeAck { accepted: true }) => Ok(Told::Taken(holder)),
        Ok(_) => Ok(Told::NotTaken(holder)),
        Err(e) => Err(rollcall_core::Error::backend(format!("notice to {holder}: {e}")).into()),
    }
}

/// Rows a bulk delete reads per page.
const BULK_PAGE: usize = 1000;
/// Removes a bulk delete has in flight.
const BULK_CONCURRENCY: usize = 32;

/// Sends `body` on the notice topic in the background to the holder the lease
/// of `shard` names, by the rule of [`NoticeRetry`] (the lease read again
/// before each send, [`NOTICE_ATTEMPTS`](crate::machine::NOTICE_ATTEMPTS)
/// sends at most). A graceful leave waits for it ([`NOTICE_DRAIN`]).
fn send_to_holder(inner: &Arc<Inner>, shard: u32, body: Vec<u8>) {
    let inner = inner.clone();
    let mut retry = NoticeRetry::new(&inner.service_id, "", "");
    let sending = inner.notices_sending.clone().try_read_owned().ok();
    tokio::spawn(async move {
        let _sending = sending;
        let topic = topic(&inner.service_id);
        loop {
            let taken = match bounded(
                inner.options.table_operation_timeout,
                inner.leases.read_head(shard),
            )
            .await
            {
                Ok(lease) => match notice_target(&lease) {
                    Some(holder) => match inner.silo.send_notice(holder, &topic, body.clone()).await {
                        Ok(taken) => taken,
                        Err(e) => {
                            tracing::debug!(%holder, error = %e, "reminder notice not sent");
                            false
                        }
                    },
                    // Nobody holds the shard: its next acquire loads the rows.
                    None => {
                        tracing::debug!(shard, lease = ?lease, "no holder for a notice");
                        return;
                    }
                },
                Err(e) => {
                    tracing::debug!(shard, error = %e, "reading a shard's lease for a notice failed");
                    false
                }
            };
            if !taken {
                tracing::debug!(shard, "reminder notice not taken");
            }
            match retry.after_send(taken) {
                Some(wait) => tokio::time::sleep(wait).await,
                None if taken => return,
                None => {
                    tracing::debug!("reminder notice never taken; the holder's refresh covers it");
                    return;
                }
            }
        }
    });
}

/// The owner of `actor_id` in the silo's current view. The ring is rebuilt only
/// when the Active silos change, not on every registration.
fn owner_in(inner: &Inner, actor_id: &str) -> Option<SiloAddress> {
    let mut ring = inner
        .ring
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *ring = std::mem::take(&mut *ring).follow(&inner.view.borrow(), inner.options.ring_points_per_silo);
    crate::shards::shard_owner(&ring, actor_id, inner.shards)
}

//! [`Placement`]: the shard leases of one service driven for placement
//! alone, with no reminder service. Its agent runs the lease rules
//! ([`ShardMachine`]) and is their tenant in the simplest way: a shard it
//! acquires has nothing to load, and a shard it releases waits only for the
//! actor hosts' deactivations ([`ActorHost`](super::ActorHost)). What the
//! lease row holds for other tenants (a reminder service's watermark and
//! exceptions) is written back as it was read.
//!
//! The agent decides nothing: the rules are the machine's and the
//! [`HeldBook`]'s; it carries out their actions (each store call bounded by
//! `table_operation_timeout`) and feeds back the answers, the membership
//! views, the clock report and the hosts' events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture};
use tokio::sync::{oneshot, watch};

use super::calls::{read_status, write_lease};
use super::machine::{ShardAction, ShardEvent, ShardMachine, ShardOptions};
use super::ring::Ring;
use super::{
    ActorId, Held, HeldBook, LeaseStatus, MonotonicDeadlines, OwnershipFeed, ShardLease, ShardLeases,
    ShardOwnership,
};
use crate::{
    Clock, Error, Fence, MembershipChanged, MembershipSnapshot, MembershipTable, ReminderOptions,
    SiloAddress, SiloClaim, SiloHandle, SystemClock, SystemStore, Timestamp,
};

/// The options of a [`Placement`] service: the lease fields of
/// [`ReminderOptions`], with the same defaults and meanings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementOptions {
    /// `L`: how long a silo acts for its shards after it last confirmed its
    /// own membership row Active, and how long a successor waits after it
    /// saw a holder Dead (default 2 s).
    pub lease_period: Duration,
    /// How often a shard held by a live silo is read again (default 1 s).
    pub lease_poll: Duration,
    /// Points per silo on the ring (default 30).
    pub ring_points_per_silo: u32,
    /// The bound of each store call (default 5 s).
    pub table_operation_timeout: Duration,
    /// How long `start` retries a store that is not up yet.
    pub initialization_timeout: Duration,
    /// How long a release waits for the actor hosts' deactivations (default
    /// 7.5 s; keep it below the silo's `shutdown_timeout`).
    pub deactivate_drain: Duration,
}

impl Default for PlacementOptions {
    fn default() -> Self {
        PlacementOptions::from(&ReminderOptions::default())
    }
}

impl From<&ReminderOptions> for PlacementOptions {
    fn from(o: &ReminderOptions) -> Self {
        PlacementOptions {
            lease_period: o.lease_period,
            lease_poll: o.lease_poll,
            ring_points_per_silo: o.ring_points_per_silo,
            table_operation_timeout: o.table_operation_timeout,
            initialization_timeout: o.initialization_timeout,
            deactivate_drain: o.deactivate_drain,
        }
    }
}

/// The name one silo's driver of a service's shard leases claims
/// ([`SiloHandle::claim`]): a reminder service and a placement service of
/// one id exclude each other on a silo, since both would drive its leases.
pub fn lease_driver_claim(service_id: &str) -> String {
    format!("reminders/{service_id}")
}

/// The notice topic a placement service's release hints go to.
fn hint_topic(service_id: &str) -> String {
    format!("placement/{service_id}/release")
}

/// Configures and starts a [`Placement`] service (see [`Placement::builder`]).
pub struct PlacementBuilder {
    silo: SiloHandle,
    store: Arc<dyn SystemStore>,
    service_id: Option<String>,
    shards: u32,
    options: PlacementOptions,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for PlacementBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementBuilder")
            .field("service_id", &self.service_id)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl PlacementBuilder {
    /// The service id (default: the silo's cluster id). The lease table is
    /// the service's: a reminder service of the same id shares its leases.
    pub fn service_id(mut self, id: impl Into<String>) -> Self {
        self.service_id = Some(id.into());
        self
    }

    /// The shard count (default [`DEFAULT_SHARDS`](super::DEFAULT_SHARDS));
    /// the first silo records it, every other must ask for the same.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// The options.
    pub fn options(mut self, options: PlacementOptions) -> Self {
        self.options = options;
        self
    }

    /// The clock (default the system's): the fences and the lease rules
    /// read it.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Starts the service on the silo (on the silo's own thread when it has
    /// one) and registers its leave: a graceful shutdown of the silo
    /// releases its shards first. Answers once the shards were first
    /// settled, or after `initialization_timeout` (they settle on in the
    /// background).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an unusable service id, a shard count
    /// other than the one recorded, or a reminder or placement service of
    /// this id already running on the silo; [`Error::Unsupported`] when the
    /// store has no lease table; the store's error if it stays unreachable
    /// for `initialization_timeout`.
    pub async fn start(self) -> Result<Placement, Error> {
        let service_id = self
            .service_id
            .unwrap_or_else(|| self.silo.cluster_id().to_owned());
        crate::validate_id("service_id", &service_id)?;
        let claim = self.silo.claim(&lease_driver_claim(&service_id)).ok_or_else(|| {
            Error::invalid_config(
                "service_id",
                format!(
                    "a reminder or placement service of `{service_id}` already runs on silo {}",
                    self.silo.address()
                ),
            )
        })?;
        let options = self.options;
        let timeout = options.table_operation_timeout;
        let lease_table = self.store.lease_table(&service_id)?;
        let what = format!("lease table of service {service_id}");
        let leases =
            crate::retry_transient(&what, options.initialization_timeout, || {
                let table = lease_table.clone();
                let shards = self.shards;
                async move {
                    crate::bounded(timeout, ShardLeases::open(table, shards), super::calls::timed_out).await
                }
            })
            .await?;
        let membership = self
            .store
            .membership_table(self.silo.cluster_id(), crate::ProtocolMode::default())?;
        let shards = leases.shards();
        let machine = ShardMachine::new(
            self.silo.address(),
            ShardOptions {
                shards,
                ring_points_per_silo: options.ring_points_per_silo,
                lease_period: options.lease_period,
                fencing: true,
                poll: options.lease_poll,
                // Nothing to checkpoint: placement owes no occurrences.
                checkpoint: Duration::ZERO,
            },
        );
        let (held_tx, held) = watch::channel(Held::default());
        let agent = PlacementAgent {
            claim: Some(claim),
            silo: self.silo.clone(),
            service_id: service_id.clone(),
            leases: leases.clone(),
            membership,
            options: options.clone(),
            clock: self.clock.clone(),
            machine,
            book: HeldBook::new(),
            acquired: BTreeMap::new(),
            drains: BTreeMap::new(),
            timer: None,
            drain_timer: None,
            leave_replies: Vec::new(),
            settled_waiters: Vec::new(),
            held: held_tx,
            views: None,
            arbiter: None,
        };
        let silo = self.silo.clone();
        let start = move |mut agent: PlacementAgent, ctx: &mut Context<PlacementAgent>| {
            agent.views = Some(silo.subscribe_recipient(ctx.address().recipient()));
            agent
        };
        let agent = if self.silo.own_thread() {
            let arbiter = actix::Arbiter::new();
            let mut agent = agent;
            agent.arbiter = Some(arbiter.handle());
            PlacementAgent::start_in_arbiter(&arbiter.handle(), move |ctx| start(agent, ctx))
        } else {
            PlacementAgent::create(move |ctx| start(agent, ctx))
        };
        let leaving = agent.clone();
        let leave_hook = self.silo.on_leave(move || {
            let agent = leaving.clone();
            Box::pin(async move {
                let (tx, rx) = oneshot::channel();
                if agent.send(Leave(tx)).await.is_ok() {
                    let _ = rx.await;
                }
            })
        });
        let (tx, rx) = oneshot::channel();
        agent.send(WhenSettled(tx)).await.map_err(|_| stopped())?;
        match tokio::time::timeout(options.initialization_timeout, rx).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(stopped()),
            Err(_) => tracing::warn!(
                silo = %self.silo.address(),
                "placement: shards not settled within initialization_timeout; settling in the background"
            ),
        }
        let feed = agent.clone();
        let ownership = ShardOwnership::new(&service_id, shards, self.clock, held, move |f| {
            feed.do_send(Feed(f));
        });
        Ok(Placement {
            inner: Arc::new(Inner {
                view: self.silo.subscribe(),
                ring: std::sync::Mutex::default(),
                silo: self.silo,
                ownership,
                leases,
                options,
                _agent: agent,
                _leave_hook: leave_hook,
            }),
        })
    }
}

fn stopped() -> Error {
    Error::backend("the silo stopped while the placement service started")
}

struct Inner {
    silo: SiloHandle,
    view: watch::Receiver<Arc<MembershipSnapshot>>,
    ring: std::sync::Mutex<Ring>,
    ownership: ShardOwnership,
    leases: ShardLeases,
    options: PlacementOptions,
    _agent: Addr<PlacementAgent>,
    _leave_hook: crate::LeaveHookGuard,
}

/// Placement without reminders: the shard leases of one service on this
/// silo, for [`ActorHost`](super::ActorHost) (`ActorHost::new(&placement,
/// ...)`) and fenced state ([`fence`](Self::fence)). Cheap to clone; the
/// service stops with its silo.
#[derive(Clone)]
pub struct Placement {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("service_id", &self.inner.ownership.service_id())
            .finish_non_exhaustive()
    }
}

impl Placement {
    /// A builder of the placement service of `silo` on `store`.
    pub fn builder(silo: &SiloHandle, store: Arc<dyn SystemStore>) -> PlacementBuilder {
        PlacementBuilder {
            silo: silo.clone(),
            store,
            service_id: None,
            shards: super::DEFAULT_SHARDS,
            options: PlacementOptions::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The handle [`ActorHost`](super::ActorHost) takes.
    pub fn ownership(&self) -> ShardOwnership {
        self.inner.ownership.clone()
    }

    /// The service id.
    pub fn service_id(&self) -> &str {
        self.inner.ownership.service_id()
    }

    /// The shard count.
    pub fn shards(&self) -> u32 {
        self.inner.ownership.shards()
    }

    /// The fence of `actor`'s shard when this silo holds it now
    /// ([`ShardOwnership::fence`]). Never waits.
    pub fn fence(&self, actor: &ActorId) -> Option<Fence> {
        self.inner.ownership.fence(actor)
    }

    /// The shards this silo holds, as a watch ([`Held`]).
    pub fn held_shards(&self) -> watch::Receiver<Held> {
        self.inner.ownership.held_shards()
    }

    /// The silo `actor`'s shard is assigned to in this silo's membership
    /// view (the ring of Active silos): a guess, which may not hold it yet
    /// or any more. [`holder`](Self::holder) reads the store.
    pub fn owner_of(&self, actor: &ActorId) -> Option<SiloAddress> {
        let mut ring = self
            .inner
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *ring = std::mem::take(&mut *ring)
            .follow(&self.inner.view.borrow(), self.inner.options.ring_points_per_silo);
        super::shard_owner(&ring, &actor.to_string(), self.shards())
    }

    /// The silo holding `actor`'s shard and the epoch, as its lease row
    /// names it, when that silo is Active in this silo's view; `None` when
    /// nobody holds it (a takeover: ask again). One read, within
    /// `table_operation_timeout`.
    ///
    /// # Errors
    /// The store's error, or [`Error::Backend`] when it gave no answer in
    /// time.
    pub async fn holder(&self, actor: &ActorId) -> Result<Option<(SiloAddress, u64)>, Error> {
        let shard = super::actor_shard(&actor.to_string(), self.shards());
        let timeout = self.inner.options.table_operation_timeout;
        let lease = crate::bounded(
            timeout,
            self.inner.leases.read_head(shard),
            super::calls::timed_out,
        )
        .await?;
        let Some(owner) = lease.owner.filter(|_| lease.status == LeaseStatus::Owned) else {
            return Ok(None);
        };
        let active = self
            .inner
            .silo
            .snapshot()
            .entry(&owner)
            .is_some_and(|e| e.status == crate::SiloStatus::Active);
        Ok(active.then_some((owner, lease.epoch)))
    }
}

impl From<&Placement> for ShardOwnership {
    fn from(p: &Placement) -> Self {
        p.ownership()
    }
}

/// The actor that carries out the lease rules' actions for placement.
struct PlacementAgent {
    claim: Option<SiloClaim>,
    silo: SiloHandle,
    service_id: String,
    leases: ShardLeases,
    membership: Arc<dyn MembershipTable>,
    options: PlacementOptions,
    clock: Arc<dyn Clock>,
    machine: ShardMachine,
    book: HeldBook,
    /// Each held shard's lease as acquired: its release writes back what
    /// other tenants keep in the row.
    acquired: BTreeMap<u32, ShardLease>,
    /// Stopping shards waiting for the hosts' deactivations, until when.
    drains: BTreeMap<u32, Timestamp>,
    timer: Option<SpawnHandle>,
    drain_timer: Option<SpawnHandle>,
    leave_replies: Vec<oneshot::Sender<()>>,
    settled_waiters: Vec<oneshot::Sender<()>>,
    held: watch::Sender<Held>,
    views: Option<crate::Subscription>,
    arbiter: Option<actix::ArbiterHandle>,
}

impl Actor for PlacementAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let silo = self.silo.clone();
        ctx.spawn(
            async move { silo.stopped().await }
                .into_actor(self)
                .map(|(), act, ctx| {
                    act.settled_waiters.clear();
                    actix::ActorContext::stop(ctx);
                }),
        );
        // The clock report: beyond the bound, the shards go (rule 9).
        let me = ctx.address();
        let report = super::calls::follow_clock_bound(&self.silo, move |report| {
            let me = me.clone();
            async move {
                let event = ShardEvent::Clock {
                    within_bound: report.within_bound,
                    max_offset: report.max_offset,
                };
                me.send(Answer(event)).await.is_ok()
            }
        });
        self.run(
            ShardEvent::Clock {
                within_bound: report.within_bound,
                max_offset: report.max_offset,
            },
            ctx,
        );
        // Release hints from other silos: a shard waited for is read at once.
        let mut hints = self.silo.subscribe_notices(&hint_topic(&self.service_id), 256);
        let me = ctx.address();
        actix::spawn(async move {
            while let Some(notice) = hints.recv().await {
                let Ok(notice) = notice else { continue };
                // Garbage is dropped: a hint only spares a poll.
                let shard = std::str::from_utf8(&notice.body)
                    .ok()
                    .and_then(|s| s.parse().ok());
                if let Some(shard) = shard {
                    if me.send(Answer(ShardEvent::Hint { shard })).await.is_err() {
                        return;
                    }
                }
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.held.send_replace(Held::default());
        self.claim = None;
        self.views = None;
        if let Some(arbiter) = self.arbiter.take() {
            arbiter.stop();
        }
    }
}

impl PlacementAgent {
    /// Feeds the machine `event` and carries out what it asks.
    fn run(&mut self, event: ShardEvent, ctx: &mut Context<Self>) {
        let actions = self.machine.handle(self.clock.now(), event);
        self.carry_out(actions, ctx);
    }

    /// Carries out `actions` and what the machine answers to them at once,
    /// then publishes what changed.
    fn carry_out(&mut self, mut actions: Vec<ShardAction>, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                next.extend(self.execute(action, now, ctx));
            }
            actions = next;
        }
        if let Some(mut held) = self.book.publish(self.machine.confirmed_until()) {
            let (now, monotonic) = (self.clock.now(), self.clock.monotonic());
            held.monotonic = Some(MonotonicDeadlines::of(&held, now, monotonic));
            self.held.send_replace(held);
        }
        if self.machine.settled() {
            for w in self.settled_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// Carries out `action`; what the machine answers at once comes back.
    fn execute(&mut self, action: ShardAction, now: Timestamp, ctx: &mut Context<Self>) -> Vec<ShardAction> {
        let timeout = self.options.table_operation_timeout;
        match action {
            ShardAction::Read(shard) | ShardAction::ReadHead(shard) => {
                let leases = self.leases.clone();
                let head = matches!(action, ShardAction::ReadHead(_));
                let call = async move {
                    let read = async {
                        if head {
                            leases.read_head(shard).await
                        } else {
                            leases.read(shard).await
                        }
                    };
                    crate::bounded(timeout, read, super::calls::timed_out)
                        .await
                        .map_err(|e| e.to_string())
                };
                self.answer(ctx, call, move |result| ShardEvent::Read { shard, result });
            }
            ShardAction::Write(lease) => {
                let (leases, shard) = (self.leases.clone(), lease.shard);
                let call = async move { write_lease(&leases, &lease, timeout).await };
                self.answer(ctx, call, move |result| ShardEvent::Written { shard, result });
            }
            ShardAction::ReadSilo(silo) => {
                let call = read_status(self.membership.clone(), silo, timeout);
                self.answer(ctx, call, move |result| ShardEvent::SiloRead { silo, result });
            }
            ShardAction::ConfirmSelf => {
                let call = read_status(self.membership.clone(), self.silo.address(), timeout);
                self.answer(ctx, call, move |result| ShardEvent::SelfRead { at: now, result });
            }
            ShardAction::Load { lease, takeover } => {
                // Nothing to load: the hosts activate on the first message.
                let shard = lease.shard;
                self.book.set(shard, Some(lease.epoch));
                if let Some(t) = takeover {
                    self.book.not_before(shard, t);
                }
                self.acquired.insert(shard, lease);
                return self.machine.handle(
                    now,
                    ShardEvent::Loaded {
                        shard,
                        read_from: now,
                    },
                );
            }
            ShardAction::Stop(shard) => {
                self.book.set(shard, None);
                let epoch = self.acquired.get(&shard).map(|l| l.epoch);
                let hosts = epoch.map_or(0, |e| self.book.wait_for_hosts(shard, e));
                if hosts == 0 {
                    return self.stopped(shard, now);
                }
                self.drains
                    .insert(shard, now.saturating_add(self.options.deactivate_drain));
                self.arm_drain(now, ctx);
            }
            ShardAction::Checkpoint(_) => {
                return self.machine.handle(now, ShardEvent::Progress(Vec::new()));
            }
            ShardAction::Drop(shard) => {
                self.book.set(shard, None);
                self.book.end_wait(shard);
                self.acquired.remove(&shard);
                self.drains.remove(&shard);
            }
            ShardAction::Hint { shard, to } => {
                let (silo, topic) = (self.silo.clone(), hint_topic(&self.service_id));
                actix::spawn(async move {
                    if let Err(e) = silo.send_notice(to, &topic, shard.to_string().into_bytes()).await {
                        tracing::debug!(%to, error = %e, "placement: release hint not sent; its receiver polls");
                    }
                });
            }
            ShardAction::SetTimer(at) => {
                if let Some(h) = self.timer.take() {
                    ctx.cancel_future(h);
                }
                let wait = at.saturating_duration_since(self.clock.now());
                self.timer = Some(ctx.run_later(wait, |act, ctx| {
                    act.timer = None;
                    act.run(ShardEvent::Tick, ctx);
                }));
            }
            ShardAction::Left => {
                for r in self.leave_replies.drain(..) {
                    let _ = r.send(());
                }
            }
        }
        Vec::new()
    }

    /// The release of `shard` may be written: delivery (activations) ended.
    /// The row keeps what other tenants wrote in it.
    fn stopped(&mut self, shard: u32, now: Timestamp) -> Vec<ShardAction> {
        self.drains.remove(&shard);
        let lease = self.acquired.remove(&shard);
        let (exceptions, listed_from) = lease.map_or((Vec::new(), None), |l| (l.exceptions, l.listed_from));
        self.machine.handle(
            now,
            ShardEvent::Stopped {
                shard,
                started_through: None,
                exceptions,
                listed_from,
            },
        )
    }

    /// Arms the timer of the earliest drain's end.
    fn arm_drain(&mut self, now: Timestamp, ctx: &mut Context<Self>) {
        if let Some(h) = self.drain_timer.take() {
            ctx.cancel_future(h);
        }
        let Some(first) = self.drains.values().min().copied() else {
            return;
        };
        self.drain_timer = Some(ctx.run_later(first.saturating_duration_since(now), |act, ctx| {
            act.drain_timer = None;
            let now = act.clock.now();
            let over: Vec<u32> = act
                .drains
                .iter()
                .filter(|(_, t)| **t <= now)
                .map(|(k, _)| *k)
                .collect();
            for shard in over {
                tracing::warn!(
                    shard,
                    "placement: activations still running when the drain ended; the release goes on"
                );
                act.book.end_wait(shard);
                let actions = act.stopped(shard, now);
                act.carry_out(actions, ctx);
            }
            act.arm_drain(now, ctx);
        }));
    }

    /// Runs `call` on the agent's context; its result is fed back.
    fn answer<F, T>(
        &mut self,
        ctx: &mut Context<Self>,
        call: F,
        event: impl FnOnce(T) -> ShardEvent + 'static,
    ) where
        F: std::future::Future<Output = T> + 'static,
    {
        ctx.spawn(
            call.into_actor(self)
                .map(move |result, act, ctx| act.run(event(result), ctx)),
        );
    }
}

/// A result or an outside event for the machine.
#[derive(Message)]
#[rtype(result = "()")]
struct Answer(ShardEvent);

impl Handler<Answer> for PlacementAgent {
    type Result = ();

    fn handle(&mut self, Answer(event): Answer, ctx: &mut Context<Self>) {
        self.run(event, ctx);
    }
}

impl Handler<MembershipChanged> for PlacementAgent {
    type Result = ();

    fn handle(&mut self, msg: MembershipChanged, ctx: &mut Context<Self>) {
        self.run(ShardEvent::View(msg.0), ctx);
    }
}

/// What an actor host tells the service.
#[derive(Message)]
#[rtype(result = "()")]
struct Feed(OwnershipFeed);

impl Handler<Feed> for PlacementAgent {
    type Result = ();

    fn handle(&mut self, Feed(feed): Feed, ctx: &mut Context<Self>) {
        match feed {
            OwnershipFeed::Hosts(delta) => self.book.hosts_changed(delta),
            OwnershipFeed::HostDrained { shard, epoch } => {
                if self.book.host_drained(shard, epoch) && self.drains.contains_key(&shard) {
                    let now = self.clock.now();
                    let actions = self.stopped(shard, now);
                    self.carry_out(actions, ctx);
                }
            }
            OwnershipFeed::Fenced { shard, epoch } => self.run(ShardEvent::Fenced { shard, epoch }, ctx),
        }
    }
}

/// The silo leaves: release every shard, then answer.
#[derive(Message)]
#[rtype(result = "()")]
struct Leave(oneshot::Sender<()>);

impl Handler<Leave> for PlacementAgent {
    type Result = ();

    fn handle(&mut self, Leave(reply): Leave, ctx: &mut Context<Self>) {
        self.leave_replies.push(reply);
        self.run(ShardEvent::Leave, ctx);
    }
}

/// Answers once the shards were first settled.
#[derive(Message)]
#[rtype(result = "()")]
struct WhenSettled(oneshot::Sender<()>);

impl Handler<WhenSettled> for PlacementAgent {
    type Result = ();

    fn handle(&mut self, WhenSettled(reply): WhenSettled, ctx: &mut Context<Self>) {
        self.settled_waiters.push(reply);
        self.run(ShardEvent::Tick, ctx);
    }
}

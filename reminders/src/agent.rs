//! The reminder agent: one actix actor per silo and service that carries out what
//! its [`ReminderMachine`] decides, feeding it views, notices, release hints,
//! timers and the results of table, lease and membership calls and deliveries
//! (each a future bounded by a timeout).
//! The agent decides nothing and never waits on anything.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture,
};
use rollcall_core::{
    Clock, MembershipChanged, MembershipTable, Notice, NoticeReceiver, NoticesDropped, ReminderTable,
    ShardLeases, SiloAddress, SiloHandle, SiloStatus,
};
use tokio::sync::oneshot;

use crate::api::{ReminderError, ReminderTarget};
use crate::machine::{apply_write, release_topic, ReleaseHint, NOTICE_BATCH};
use crate::machine::{Action, Event, Inbound, ReminderMachine, Timer, NOTICE_QUEUE};
use crate::shards::ShardEvent;

pub(crate) struct ReminderAgent {
    /// This service's id claimed on its silo, given back when it stops.
    pub claim: Option<rollcall_core::SiloClaim>,
    pub silo: SiloHandle,
    pub table: Arc<dyn ReminderTable>,
    /// The service's parked table (`None` when its id is too long for one).
    pub parked: Option<Arc<dyn ReminderTable>>,
    pub leases: ShardLeases,
    pub membership: Arc<dyn MembershipTable>,
    pub target: Arc<dyn ReminderTarget>,
    pub options: Arc<rollcall_core::ReminderOptions>,
    pub clock: Arc<dyn Clock>,
    pub machine: ReminderMachine,
    pub notices: Option<NoticeReceiver>,
    pub releases: Option<NoticeReceiver>,
    pub timers: HashMap<Timer, SpawnHandle>,
    pub first_load_waiters: Vec<oneshot::Sender<()>>,
    pub leave_replies: Vec<oneshot::Sender<()>>,
    /// Reads `clock` before each event: a step of it is a clock beyond the
    /// bound until the silo measures again (`StepWatch`'s docs).
    pub step: rollcall_core::protocol::StepWatch,
    /// The monotonic origin `step` reads against.
    pub monotonic_origin: tokio::time::Instant,
    /// Where [`Action::Held`] goes (`Reminders::held_shards`).
    pub held: tokio::sync::watch::Sender<crate::Held>,
    /// The silo's membership views, forwarded to this agent by a task on its
    /// own arbiter (set when it starts there).
    pub views: Option<rollcall_core::Subscription>,
    /// The service's own thread, when it runs on one: stopped with the agent.
    pub arbiter: Option<actix::ArbiterHandle>,
}

impl Actor for ReminderAgent {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        // A stopped service holds nothing (its silo stopped: left, or read
        // itself Dead).
        self.held.send_replace(crate::Held::default());
        // Another service of this id may start on this silo now.
        self.claim = None;
        self.views = None;
        if let Some(arbiter) = self.arbiter.take() {
            arbiter.stop();
        }
    }

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(NOTICE_QUEUE);
        // Stop with the silo.
        let silo = self.silo.clone();
        ctx.spawn(
            async move { silo.stopped().await }
                .into_actor(self)
                .map(|(), act, ctx| {
                    tracing::debug!(silo = %act.machine.me(), "silo stopped: reminder agent stops");
                    act.first_load_waiters.clear();
                    ctx.stop();
                }),
        );
        // Notices and release hints: handed on in batches; the bounded queues behind
        // them drop what the agent cannot take.
        if let Some(rx) = self.notices.take() {
            in_batches(rx, ctx.address(), |b| NoticesReceived(b, false));
        }
        if let Some(rx) = self.releases.take() {
            in_batches(rx, ctx.address(), |b| NoticesReceived(b, true));
        }
        // The clock report: beyond the bound, the shards go (rule 9).
        let me = ctx.address();
        let report = rollcall_core::ownership::calls::follow_clock_bound(&self.silo, move |report| {
            let me = me.clone();
            async move { me.send(ClockChanged(report)).await.is_ok() }
        });
        self.run(
            Event::Clock {
                within_bound: report.within_bound,
                max_offset: report.max_offset,
            },
            ctx,
        );
        self.run(Event::Start, ctx);
    }
}

/// The silo's clock report changed.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ClockChanged(pub rollcall_core::protocol::ClockReport);

impl Handler<ClockChanged> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: ClockChanged, ctx: &mut Context<Self>) {
        let report = msg.0;
        if report.within_bound {
            tracing::warn!(silo = %self.machine.me(), clock = %report, "reminder service: the clock is back within max_clock_offset; taking shards again");
        } else {
            tracing::warn!(
                silo = %self.machine.me(), clock = %report,
                "reminder service: this silo's clock is beyond max_clock_offset; \
                 its shards are released and none is taken until it is back"
            );
        }
        self.run(
            Event::Clock {
                within_bound: report.within_bound,
                max_offset: report.max_offset,
            },
            ctx,
        );
    }
}

/// Up to [`NOTICE_BATCH`](crate::NOTICE_BATCH) notices from the silo's notice queue; `Err` where some
/// were dropped because the queue was full. `true`: from the release topic.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoticesReceived(pub Vec<Result<Notice, NoticesDropped>>, pub bool);

/// The silo is leaving gracefully: release every shard (by the view given, the
/// newest), deliver nothing more, and answer once every lease is released (see
/// [`crate::shards`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Leave(
    pub oneshot::Sender<()>,
    pub Option<Arc<rollcall_core::MembershipSnapshot>>,
);

/// Answered once the first load of the agent's ranges finished.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WhenLoaded(pub oneshot::Sender<()>);

impl Handler<MembershipChanged> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: MembershipChanged, ctx: &mut Context<Self>) {
        self.run(Event::View(msg.0), ctx);
    }
}

/// An event from the service handle for the machine (the actor hosts').
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Feed(pub Event);

impl Handler<Feed> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, Feed(event): Feed, ctx: &mut Context<Self>) {
        self.run(event, ctx);
    }
}

impl Handler<Leave> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: Leave, ctx: &mut Context<Self>) {
        self.leave_replies.push(msg.0);
        if let Some(view) = msg.1 {
            self.run(Event::View(view), ctx);
        }
        self.run(Event::Leave, ctx);
    }
}

impl Handler<WhenLoaded> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: WhenLoaded, _: &mut Context<Self>) {
        if self.machine.loaded_once() {
            let _ = msg.0.send(());
        } else {
            self.first_load_waiters.push(msg.0);
        }
    }
}

impl Handler<NoticesReceived> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: NoticesReceived, ctx: &mut Context<Self>) {
        let batch = msg
            .0
            .into_iter()
            .map(|n| match n {
                Ok(n) => Inbound::Message {
                    from: n.from,
                    body: n.body,
                },
                Err(NoticesDropped(k)) => Inbound::Dropped(k),
            })
            .collect();
        let event = if msg.1 {
            Event::Releases(batch)
        } else {
            Event::Notices(batch)
        };
        self.run(event, ctx);
    }
}

impl ReminderAgent {
    /// Hands `event` to the machine and carries out its actions.
    fn run(&mut self, event: Event, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        // A step of the wall clock (a VM resumed, an NTP step) is a clock
        // beyond the bound from this event on, before the machine sees the
        // stepped time (a clock stepped ahead would deliver early what a
        // successor delivers again), until a report computed after the step
        // says otherwise.
        let max_offset = self.silo.clock().max_offset;
        if let Some(step) = self
            .step
            .observe(now, self.monotonic_origin.elapsed(), max_offset / 2)
        {
            tracing::warn!(
                silo = %self.machine.me(), step_ms = step,
                "reminder service: the wall clock stepped; delivering nothing until the silo \
                 measures its clock again"
            );
            let actions = self.machine.handle(
                now,
                Event::Clock {
                    within_bound: false,
                    max_offset,
                },
            );
            for action in actions {
                self.execute(action, ctx);
            }
            self.measure_clock(ctx);
        }
        let actions = self.machine.handle(now, event);
        for action in actions {
            self.execute(action, ctx);
        }
    }

    /// Asks the silo for a clock report computed now and hands it to the
    /// machine; asks again a second later while the silo does not answer.
    fn measure_clock(&mut self, ctx: &mut Context<Self>) {
        let silo = self.silo.clone();
        ctx.spawn(
            async move { silo.measure_clock().await }
                .into_actor(self)
                .map(|report, act, ctx| match report {
                    Ok(report) => act.run(
                        Event::Clock {
                            within_bound: report.within_bound,
                            max_offset: report.max_offset,
                        },
                        ctx,
                    ),
                    Err(rollcall_core::SiloError::Stopped) => {}
                    Err(_) => {
                        ctx.run_later(Duration::from_secs(1), |act, ctx| act.measure_clock(ctx));
                    }
                }),
        );
    }

    /// Runs `call` and hands the machine the event its answer makes.
    fn answer<F: std::future::Future + 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        call: F,
        event: impl FnOnce(F::Output) -> Event + 'static,
    ) {
        ctx.spawn(
            call.into_actor(self)
                .map(move |out, act, ctx| act.run(event(out), ctx)),
        );
    }

    fn execute(&mut self, action: Action, ctx: &mut Context<Self>) {
        let timeout = self.options.table_operation_timeout;
        let (table, leases) = (self.table.clone(), self.leases.clone());
        let text = |e: crate::ReminderError| e.to_string();
        match action {
            Action::ReadRow { lease_epoch, key } => {
                let k = key.clone();
                let call = async move { bounded(timeout, table.read_row(k.actor(), k.name())).await };
                self.answer(ctx, call, move |result| Event::RowRead {
                    lease_epoch,
                    key,
                    result,
                });
            }
            Action::ReadPiece { load, piece, width } => {
                let call = async move {
                    // Let other tasks run between pieces even when the table answers
                    // without waiting (the memory table): a load never holds the thread.
                    tokio::task::yield_now().await;
                    let began = std::time::Instant::now();
                    let read = bounded(timeout, table.read_rows_in_range(piece.begin, piece.end)).await;
                    tracing::debug!(
                        rows = read.as_ref().map_or(0, Vec::len),
                        ms = began.elapsed().as_millis() as u64,
                        ok = read.is_ok(),
                        "load piece read"
                    );
                    read
                };
                self.answer(ctx, call, move |result| Event::PieceRead {
                    load,
                    piece,
                    width,
                    result,
                });
            }
            Action::Deliver {
                key,
                etag,
                scheduled,
                tick,
            } => {
                let recipient = tick.as_ref().ok().and_then(|t| self.target.resolve(&t.actor));
                let timeout = self.options.delivery_timeout;
                let call = async move {
                    let tick = tick?;
                    let r = recipient.ok_or_else(|| format!("no recipient for {}", tick.actor))?;
                    match tokio::time::timeout(timeout, r.send(tick)).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(format!("mailbox: {e}")),
                        Err(_) => Err(format!("handler did not finish within {timeout:?}")),
                    }
                };
                self.answer(ctx, call, move |result| Event::Delivered {
                    key,
                    etag,
                    scheduled,
                    result,
                });
            }
            Action::Write(write, fence) => {
                let w = write.clone();
                let parked = self.parked.clone();
                let call = async move {
                    bounded(
                        timeout,
                        apply_write(&*table, parked.as_deref(), &w, fence.as_ref()),
                    )
                    .await
                };
                self.answer(ctx, call, move |result| Event::Written { write, result });
            }
            Action::AppendRun(w) => {
                let keep = self.options.run_history;
                let call = async move {
                    bounded(
                        timeout,
                        table.append_run(&w.actor, &w.name, &w.record, keep, w.fence.as_ref()),
                    )
                    .await
                };
                self.answer(ctx, call, move |result: Result<(), ReminderError>| {
                    if let Err(e) = &result {
                        tracing::debug!(error = %e, "a run-history record was not appended");
                    }
                    Event::RunAppended { ok: result.is_ok() }
                });
            }
            Action::ReadLease(shard) => {
                let call = async move { bounded(timeout, leases.read(shard)).await.map_err(text) };
                self.answer(ctx, call, move |result| {
                    Event::Shard(ShardEvent::Read { shard, result })
                });
            }
            Action::ReadLeaseHead(shard) => {
                let call = async move { bounded(timeout, leases.read_head(shard)).await.map_err(text) };
                self.answer(ctx, call, move |result| {
                    Event::Shard(ShardEvent::Read { shard, result })
                });
            }
            Action::WriteLease(lease) => {
                let shard = lease.shard;
                // Each store call bounded on its own; the whole answers within
                // `table_operation_timeout` per call (`calls::write_lease`).
                let call = async move {
                    rollcall_core::ownership::calls::write_lease(&leases, &lease, timeout).await
                };
                self.answer(ctx, call, move |result| {
                    Event::Shard(ShardEvent::Written { shard, result })
                });
            }
            Action::ReadSilo(silo) => {
                let call = self.read_status(silo);
                self.answer(ctx, call, move |result| {
                    Event::Shard(ShardEvent::SiloRead { silo, result })
                });
            }
            Action::ConfirmSelf => {
                let at = self.clock.now();
                let call = self.read_status(self.machine.me());
                self.answer(ctx, call, move |result| {
                    Event::Shard(ShardEvent::SelfRead { at, result })
                });
            }
            Action::SendHints(hints) => send_hints(&self.silo, self.table.service_id(), hints),
            Action::FinishLeave => self.leave_replies.drain(..).for_each(|r| {
                let _ = r.send(());
            }),
            Action::LeaveDone => {
                if let Some(r) = self.leave_replies.pop() {
                    let _ = r.send(());
                }
            }
            Action::SetTimer(timer, at) => {
                if let Some(h) = self.timers.remove(&timer) {
                    ctx.cancel_future(h);
                }
                let wait = at.saturating_duration_since(self.clock.now());
                let h = ctx.run_later(wait, move |act, ctx| {
                    act.timers.remove(&timer);
                    let event = match timer {
                        Timer::Due => Event::Due {
                            active: act.silo.status() == SiloStatus::Active,
                        },
                        other => Event::Timer(other),
                    };
                    act.run(event, ctx);
                });
                self.timers.insert(timer, h);
            }
            Action::CancelTimer(timer) => {
                if let Some(h) = self.timers.remove(&timer) {
                    ctx.cancel_future(h);
                }
            }
            Action::Loaded => self.first_load_waiters.drain(..).for_each(|w| {
                let _ = w.send(());
            }),
            Action::TickDelivered { lateness } => {
                let (service, silo) = self.metric_labels();
                metrics::counter!(crate::api::TICKS_METRIC, "service" => service.clone(), "silo" => silo.clone())
                    .increment(1);
                metrics::histogram!(crate::api::TICK_LATENESS_METRIC, "service" => service, "silo" => silo)
                    .record(lateness.as_secs_f64());
            }
            Action::TickDropped => {
                let (service, silo) = self.metric_labels();
                metrics::counter!(crate::api::TICKS_DROPPED_METRIC, "service" => service, "silo" => silo)
                    .increment(1);
            }
            Action::TicksSkipped(n) => {
                let (service, silo) = self.metric_labels();
                metrics::counter!(crate::api::TAKEOVER_SKIPPED_METRIC, "service" => service, "silo" => silo)
                    .increment(n);
            }
            Action::TickParked => {
                let (service, silo) = self.metric_labels();
                metrics::counter!(crate::api::TICKS_PARKED_METRIC, "service" => service, "silo" => silo)
                    .increment(1);
            }
            Action::Held(mut held) => {
                // The deadlines onto the monotonic clock, from one reading of
                // both clocks: a later step of the wall clock (which the step
                // watch sees only at the next event) cannot stretch them.
                let (now, monotonic) = (self.clock.now(), self.clock.monotonic());
                held.monotonic = Some(crate::MonotonicDeadlines::of(&held, now, monotonic));
                self.held.send_replace(held);
            }
            Action::Owned(n) => {
                let (service, silo) = self.metric_labels();
                metrics::gauge!(crate::api::OWNED_METRIC, "service" => service, "silo" => silo).set(n as f64);
            }
        }
    }

    /// Reads `silo`'s membership row: its status, `None` without a row.
    fn read_status(
        &self,
        silo: rollcall_core::SiloAddress,
    ) -> impl std::future::Future<Output = Result<Option<SiloStatus>, String>> + 'static {
        rollcall_core::ownership::calls::read_status(
            self.membership.clone(),
            silo,
            self.options.table_operation_timeout,
        )
    }

    /// The `service` and `silo` labels of this agent's `metrics` series.
    fn metric_labels(&self) -> (String, String) {
        (self.table.service_id().to_owned(), self.machine.me().to_string())
    }
}

/// Runs `call` bounded by `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = rollcall_core::Result<T>>,
) -> Result<T, ReminderError> {
    rollcall_core::bounded(
        timeout,
        async { call.await.map_err(ReminderError::from) },
        ReminderError::Timeout,
    )
    .await
}

/// Sends release hints in a background task (each bounded by the silo's
/// `probe_timeout`). Best effort: a lost hint costs its receiver a lease poll.
pub(crate) fn send_hints(silo: &SiloHandle, service_id: &str, hints: Vec<(SiloAddress, ReleaseHint)>) {
    if hints.is_empty() {
        return;
    }
    let (silo, topic) = (silo.clone(), release_topic(service_id));
    tokio::spawn(async move {
        for (to, hint) in hints {
            let Ok(body) = serde_json::to_vec(&hint) else {
                continue;
            };
            if let Err(e) = silo.send_notice(to, &topic, body).await {
                tracing::debug!(%to, error = %e, "release hint not sent; its receiver polls the lease");
            }
        }
    });
}

/// Hands what `rx` receives to the agent in batches of up to [`NOTICE_BATCH`].
pub(crate) fn in_batches(
    mut rx: NoticeReceiver,
    addr: actix::Addr<ReminderAgent>,
    wrap: fn(Vec<Result<Notice, NoticesDropped>>) -> NoticesReceived,
) {
    actix::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < NOTICE_BATCH {
                match rx.try_recv() {
                    Some(n) => batch.push(n),
                    None => break,
                }
            }
            if addr.send(wrap(batch)).await.is_err() {
                return;
            }
        }
    });
}

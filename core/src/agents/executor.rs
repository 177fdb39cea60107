//! The membership agent: the one actor per silo that runs the silo's
//! [`SiloMachine`] and carries out its actions. It decides nothing.
//!
//! What it owns: the machine, the table handle, the transport, the watch channels
//! the handle reads, and the probe listener. What may block it: nothing. Every
//! table call and probe runs as a future spawned on the actor's context (the actor
//! keeps handling messages meanwhile), each bounded by a timeout
//! (`table_operation_timeout` for the table, the ping's own timeout for probes), and
//! its result comes back as an [`Event`]. How much runs at once is bounded by the
//! machine: at most two table reads, one row write, one IAmAlive write, one cleanup,
//! [`MAX_OUTSTANDING`](crate::protocol::probe::MAX_OUTSTANDING) pings per target,
//! and one gossip per live silo per committed write. Its mailbox takes the calls of
//! the [`SiloHandle`](super::SiloHandle) (awaited with a bound) and gossip from the
//! probe server (`try_send`: dropped when full; the periodic refresh covers it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, MessageResult, WrapFuture,
};
use tokio::sync::{oneshot, watch};

use crate::metrics_table::CounterCells;
use crate::protocol::{
    Action, ClockOffsets, ClockReport, ClockSample, Event, PingOutcome, SiloMachine, StopReason, Timer,
};
use crate::telemetry::{outcome, Outcome, SiloLabels};
use crate::transport::{Listener, ProbeRequest, ProbeResponse, Transport};
use crate::{Clock, Error, MembershipSnapshot, MembershipTable, SiloAddress, SiloError, SiloStatus};

use super::OnDeclaredDead;

/// What the agent shares with the probe server (lock-free).
#[derive(Debug, Default)]
pub(crate) struct SharedHealth {
    /// The local health score, 0 (healthy) ..= 8.
    pub(crate) score: AtomicU8,
    /// Pings received since the last health check.
    pub(crate) probes_received: AtomicU32,
    /// The table version of the silo's view, as last published: what the probe
    /// server's pongs carry and what incoming pings are compared with.
    pub(crate) view_version: std::sync::atomic::AtomicU64,
}

/// The watch channels the agent publishes on.
pub(crate) struct Outputs {
    /// Every snapshot read (IAmAlive changes included).
    pub(crate) latest: watch::Sender<Arc<MembershipSnapshot>>,
    /// Snapshots with a new table version (or, in basic mode, new content).
    pub(crate) snapshot: watch::Sender<Arc<MembershipSnapshot>>,
    pub(crate) status: watch::Sender<SiloStatus>,
    pub(crate) stop: Arc<watch::Sender<bool>>,
    /// The clock offset from the peers, after every ping.
    pub(crate) clock: watch::Sender<ClockReport>,
}

pub(crate) struct MembershipAgent {
    pub(crate) machine: SiloMachine,
    pub(crate) cluster: Arc<str>,
    pub(crate) me: SiloAddress,
    pub(crate) table: Arc<dyn MembershipTable>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) table_timeout: Duration,
    /// How long a gossip message may wait for its ack (`probe_timeout`).
    pub(crate) gossip_timeout: Duration,
    pub(crate) health: Arc<SharedHealth>,
    pub(crate) outputs: Outputs,
    pub(crate) joined: Option<oneshot::Sender<Result<(), SiloError>>>,
    pub(crate) calls: HashMap<u64, Call>,
    pub(crate) next_call: u64,
    pub(crate) listener: Option<Listener>,
    pub(crate) on_declared_dead: OnDeclaredDead,
    /// What the silo counts (read by the handle and the metrics publisher).
    pub(crate) counters: Arc<CounterCells>,
    /// The id of the row write in flight if it writes a vote (the machine runs one
    /// row write at a time).
    pub(crate) vote_write: Option<u64>,
    /// The labels of this silo's `metrics` series.
    pub(crate) labels: SiloLabels,
    /// The clock offsets measured from the pings' timestamps.
    pub(crate) clock_offsets: ClockOffsets,
    /// The origin of the monotonic times given to `clock_offsets`.
    pub(crate) monotonic_origin: tokio::time::Instant,
    /// The silo's own thread, when it runs on one
    /// ([`SiloBuilder::own_thread`](crate::SiloBuilder::own_thread)): stopped
    /// with the agent.
    pub(crate) arbiter: Option<actix::ArbiterHandle>,
}

/// A handle call waiting for the machine's answer.
pub(crate) enum Call {
    Refresh(oneshot::Sender<Result<MembershipSnapshot, SiloError>>),
    Shutdown(oneshot::Sender<Result<(), SiloError>>),
}

/// Bounds a table call by `timeout` and records it (count, outcome and duration)
/// under `labels`.
async fn bounded<T: Outcome>(
    labels: &SiloLabels,
    timeout: Duration,
    what: &'static str,
    call: impl std::future::Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    let started = tokio::time::Instant::now();
    let result = crate::bounded(timeout, call, |t| {
        Error::backend(format!("{what} did not answer within {t:?}"))
    })
    .await;
    labels.table_operation(what, outcome(&result), started.elapsed());
    result
}

impl MembershipAgent {
    fn feed(&mut self, event: Event, ctx: &mut Context<Self>) {
        self.count(&event);
        let actions = self.machine.handle(self.clock.now(), event);
        for action in actions {
            self.execute(action, ctx);
        }
    }

    /// Counts what `event` reports (table operations, votes, probes).
    fn count(&mut self, event: &Event) {
        let c = &*self.counters;
        match event {
            Event::TableRead { result: Ok(_), .. } | Event::DeltaRead { result: Ok(_), .. } => {
                CounterCells::add(&c.table_reads, 1);
            }
            Event::RowWritten { id, result: Ok(true) } => {
                CounterCells::add(&c.table_writes, 1);
                if self.vote_write == Some(*id) {
                    CounterCells::add(&c.votes_written, 1);
                }
            }
            Event::RowWritten {
                result: Ok(false), ..
            } => CounterCells::add(&c.table_conflicts, 1),
            Event::PingResult { outcome, .. } => match outcome {
                PingOutcome::Answered { rtt } => {
                    CounterCells::add(&c.probes_answered, 1);
                    c.record_rtt(*rtt);
                    self.labels.probe(Some(*rtt));
                }
                _ => {
                    CounterCells::add(&c.probes_failed, 1);
                    self.labels.probe(None);
                }
            },
            _ => {}
        }
    }

    /// Runs `fut` on the actor's context and feeds its result back as an event.
    fn spawn_event(
        &mut self,
        ctx: &mut Context<Self>,
        fut: impl std::future::Future<Output = Event> + 'static,
    ) {
        ctx.spawn(fut.into_actor(self).map(|event, act, ctx| act.feed(event, ctx)));
    }

    fn execute(&mut self, action: Action, ctx: &mut Context<Self>) {
        let (table, timeout, labels) = (self.table.clone(), self.table_timeout, self.labels.clone());
        match action {
            Action::ReadTable { id } => self.spawn_event(ctx, async move {
                let result = bounded(&labels, timeout, "read_all", table.read_all()).await;
                Event::TableRead { id, result }
            }),
            Action::ReadDelta { id, since } => self.spawn_event(ctx, async move {
                let result = bounded(&labels, timeout, "read_delta", table.read_delta(&since)).await;
                Event::DeltaRead { id, result }
            }),
            Action::WriteRow {
                id,
                write,
                next_version,
                origin,
                vote,
            } => {
                self.vote_write = vote.then_some(id);
                if vote {
                    CounterCells::add(&self.counters.suspicions_sent, 1);
                    self.labels.suspicion();
                }
                self.spawn_event(ctx, async move {
                    let result = bounded(
                        &labels,
                        timeout,
                        write.method(),
                        table.write_row(write.entry(), write.mode(), &next_version, &origin),
                    )
                    .await;
                    Event::RowWritten { id, result }
                })
            }
            Action::WriteIAmAlive { time } => {
                let me = self.me;
                self.spawn_event(ctx, async move {
                    Event::IAmAliveWritten(
                        bounded(
                            &labels,
                            timeout,
                            "update_i_am_alive",
                            table.update_i_am_alive(&me, time),
                        )
                        .await,
                    )
                })
            }
            Action::CleanupDefunct { before } => self.spawn_event(ctx, async move {
                Event::CleanupDone(
                    bounded(&labels, timeout, "cleanup_defunct", table.cleanup_defunct(before)).await,
                )
            }),
            Action::Ping { target, seq, timeout } => {
                let (transport, cluster, me) = (self.transport.clone(), self.cluster.clone(), self.me);
                let (clock, origin) = (self.clock.clone(), self.monotonic_origin);
                let version = self.machine.view_version();
                let ping = async move {
                    let started = tokio::time::Instant::now();
                    let sent = (clock.now(), origin.elapsed());
                    let request = ProbeRequest::Ping {
                        from: me,
                        target,
                        version,
                        sent_ms: sent.0.as_millis(),
                    };
                    let response = transport
                        .request(target.endpoint(), &cluster, request, timeout)
                        .await;
                    let outcome = ProbeResponse::ping_outcome(&target, &response, started.elapsed());
                    let sample = ProbeResponse::clock_sample(
                        &target,
                        &response,
                        sent,
                        (clock.now(), origin.elapsed()),
                    );
                    let event = Event::PingResult {
                        target,
                        seq,
                        outcome,
                        peer_version: ProbeResponse::peer_version(&response),
                    };
                    (event, sample)
                };
                ctx.spawn(ping.into_actor(self).map(|(event, sample), act, ctx| {
                    act.clock_sample(sample, ctx);
                    act.feed(event, ctx);
                }));
            }
            Action::IndirectPing {
                via,
                target,
                seq,
                timeout,
                intermediary_timeout,
            } => {
                let (transport, cluster, me) = (self.transport.clone(), self.cluster.clone(), self.me);
                self.spawn_event(ctx, async move {
                    let timeout_ms = u32::try_from(intermediary_timeout.as_millis()).unwrap_or(u32::MAX);
                    let request = ProbeRequest::IndirectPing {
                        from: me,
                        target,
                        timeout_ms,
                    };
                    let response = transport
                        .request(via.endpoint(), &cluster, request, timeout)
                        .await;
                    let outcome = ProbeResponse::indirect_outcome(&response);
                    Event::IndirectResult { target, seq, outcome }
                })
            }
            Action::Gossip { to, version } => {
                for silo in to {
                    let (transport, cluster, me) = (self.transport.clone(), self.cluster.clone(), self.me);
                    let timeout = self.gossip_timeout;
                    // Detached: a leaving silo's last gossip must outlive its agent.
                    // Each is bounded by `probe_timeout`.
                    actix::spawn(async move {
                        let request = ProbeRequest::Gossip { from: me, version };
                        let _ = transport
                            .request(silo.endpoint(), &cluster, request, timeout)
                            .await;
                    });
                }
            }
            Action::Publish {
                snapshot,
                new_version,
            } => {
                if new_version {
                    self.health
                        .view_version
                        .store(snapshot.version.version, Ordering::Relaxed);
                    self.outputs.snapshot.send_replace(snapshot.clone());
                }
                self.labels.view(&snapshot);
                self.clock_offsets
                    .retain(|p| snapshot.status_of(p).is_some_and(|s| !s.is_terminating()));
                self.outputs.latest.send_replace(snapshot);
            }
            Action::SetStatus(status) => {
                self.outputs.status.send_replace(status);
            }
            Action::SetHealthScore(score) => self.health.score.store(score, Ordering::Relaxed),
            Action::Schedule { timer, after } => {
                ctx.run_later(after, move |act, ctx| {
                    let event = match timer {
                        Timer::HealthCheck => Event::HealthCheck {
                            probes_received: act.health.probes_received.swap(0, Ordering::Relaxed),
                        },
                        timer => Event::Timer(timer),
                    };
                    act.feed(event, ctx);
                });
            }
            Action::JoinFinished(result) => {
                if let Some(tx) = self.joined.take() {
                    let _ = tx.send(result);
                }
            }
            Action::AnswerRefresh { request, result } => {
                if let Some(Call::Refresh(tx)) = self.calls.remove(&request) {
                    let _ = tx.send(result);
                }
            }
            Action::AnswerShutdown { request, result } => {
                if let Some(Call::Shutdown(tx)) = self.calls.remove(&request) {
                    let _ = tx.send(result);
                }
            }
            Action::Stop(reason) => {
                self.listener = None;
                self.outputs.stop.send_replace(true);
                if let (StopReason::DeclaredDead, OnDeclaredDead::StopSystem { exit_code }) =
                    (reason, self.on_declared_dead)
                {
                    actix::System::current().stop_with_code(exit_code);
                }
                ctx.stop();
            }
        }
    }

    /// Records a ping's clock sample (if it got a pong) and publishes the
    /// report, which also moves with a step of the local clock, sample or not.
    /// A change across the bound is logged.
    fn clock_sample(&mut self, sample: Option<ClockSample>, ctx: &mut Context<Self>) {
        if let Some(s) = &sample {
            self.clock_offsets.sample(s);
        }
        let report = self
            .clock_offsets
            .report(self.clock.now(), self.monotonic_origin.elapsed());
        let was = *self.outputs.clock.borrow();
        if was.within_bound && !report.within_bound {
            tracing::error!(
                cluster = %self.cluster, silo = %self.me, offset = %report,
                "this silo's clock is beyond max_clock_offset from its peers': its row says so, \
                 the shard ring leaves it out, and services that need the bound (reminders, \
                 placement) release their shards here until it is back"
            );
        } else if !was.within_bound && report.within_bound {
            tracing::warn!(cluster = %self.cluster, silo = %self.me, offset = %report, "this silo's clock is back within max_clock_offset");
        }
        self.labels.clock(&report);
        if report != was {
            self.outputs.clock.send_replace(report);
        }
        if was.within_bound != report.within_bound {
            // Said in our row, so every silo's shard ring leaves us out meanwhile.
            self.feed(
                Event::ClockBound {
                    beyond: !report.within_bound,
                },
                ctx,
            );
        }
    }

    fn call(&mut self, call: Call, event: impl FnOnce(u64) -> Event, ctx: &mut Context<Self>) {
        self.next_call += 1;
        let request = self.next_call;
        self.calls.insert(request, call);
        self.feed(event(request), ctx);
    }
}

impl Actor for MembershipAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        super::stop_on_signal(self.outputs.stop.subscribe(), ctx);
        self.feed(Event::Start, ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.listener = None;
        self.outputs.stop.send_replace(true);
        tracing::debug!(cluster = %self.cluster, silo = %self.me, "membership agent stopped");
        // The silo's own thread ends with it (its probe connections too).
        if let Some(arbiter) = self.arbiter.take() {
            arbiter.stop();
        }
    }
}

/// Re-read the table now (answered by the machine).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RefreshCall(pub(crate) oneshot::Sender<Result<MembershipSnapshot, SiloError>>);

impl Handler<RefreshCall> for MembershipAgent {
    type Result = ();

    fn handle(&mut self, msg: RefreshCall, ctx: &mut Context<Self>) {
        self.call(Call::Refresh(msg.0), |request| Event::Refresh { request }, ctx);
    }
}

/// Compute the clock report now (a step of the local clock since the last
/// probe is in it), publish it, and answer it.
#[derive(Message)]
#[rtype(result = "ClockReport")]
pub(crate) struct MeasureClock;

impl Handler<MeasureClock> for MembershipAgent {
    type Result = MessageResult<MeasureClock>;

    fn handle(&mut self, _: MeasureClock, ctx: &mut Context<Self>) -> Self::Result {
        self.clock_sample(None, ctx);
        MessageResult(*self.outputs.clock.borrow())
    }
}

/// Leave the cluster.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ShutdownCall {
    pub(crate) graceful: bool,
    pub(crate) reply: oneshot::Sender<Result<(), SiloError>>,
}

impl Handler<ShutdownCall> for MembershipAgent {
    type Result = ();

    fn handle(&mut self, msg: ShutdownCall, ctx: &mut Context<Self>) {
        let graceful = msg.graceful;
        self.call(
            Call::Shutdown(msg.reply),
            |request| Event::Shutdown { request, graceful },
            ctx,
        );
    }
}

/// Gossip from a peer: the table is at `version` now.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct GossipReceived {
    pub(crate) version: u64,
}

impl Handler<GossipReceived> for MembershipAgent {
    type Result = ();

    fn handle(&mut self, msg: GossipReceived, ctx: &mut Context<Self>) {
        self.feed(Event::GossipReceived { version: msg.version }, ctx);
    }
}

//! The reminder agent: one actix actor per silo and service. It keeps the ring of
//! the silo's membership view, loads the ranges it owns, keeps the reminders due
//! within the loading window in a [`Queue`], delivers ticks, and records
//! `last_fired` and one-shot removals. Every table call and delivery runs as a
//! future on the actor's context, bounded by a timeout; its result comes back to
//! the actor, which never waits on anything.
//!
//! Bounded work (under any fault):
//!
//! | work | bound |
//! |---|---|
//! | range loads | 1 running + 1 pending (coalesced); each reads its ranges in pieces of about [`LOAD_PIECE_ROWS`] rows, one piece in flight, each handled in its own actor turn |
//! | deliveries in flight | [`MAX_DELIVERIES`] (the rest wait in the queue) |
//! | notice reads in flight | [`MAX_NOTICE_READS`] (beyond: one coalesced load) |
//! | queued notices | [`NOTICE_QUEUE`] (beyond: dropped; a load covers them), taken [`NOTICE_BATCH`] per actor turn; while a load is pending, a registration notice needs no read of its own |
//! | pending `last_fired` writes and one-shot removals | one per reminder, [`MAX_WRITES`] in flight |
//! | retries | backoff timers, never a loop |

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture,
};
use rand::rngs::StdRng;
use rand::Rng;
use rollcall_membership_core::{
    actor_hash, Clock, Etag, MembershipChanged, MissedTickPolicy, Notice, ReminderEntry, ReminderOptions,
    ReminderTable, SiloAddress, SiloHandle, SiloStatus, Timestamp,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::api::{ActorId, Counters, ReminderError, ReminderTarget, ReminderTick};
use crate::queue::{key_of, Key, Queue};
use crate::ring::{Ring, RingRange};
use crate::schedule::{after_delivery, occurrence_after, plan, Learned, Planned, Timing};

/// The first occurrence of `entry` at or after `t`; `None` for a one-shot whose
/// time is before `t`.
fn occurrence_at_or_after(entry: Timing, t: Timestamp) -> Option<Timestamp> {
    occurrence_after(
        entry.start_at,
        entry.period,
        Timestamp::from_millis(t.as_millis().saturating_sub(1)),
    )
}

/// Deliveries running at once per silo.
pub const MAX_DELIVERIES: usize = 1024;
/// Notice-triggered row reads running at once.
pub const MAX_NOTICE_READS: usize = 64;
/// Notices queued for the agent.
pub const NOTICE_QUEUE: usize = 1024;
/// Notices handed to the agent per message (per actor turn).
pub const NOTICE_BATCH: usize = 256;
/// About how many rows a load reads with one `read_rows_in_range` and handles in
/// one actor turn, so that ticks keep flowing while a million rows load: the width
/// of the next piece of the ring follows the density of the rows read so far.
pub const LOAD_PIECE_ROWS: u64 = 2048;
/// The width of the first piece a silo's first load reads (1/64 of the ring).
const FIRST_PIECE_WIDTH: u32 = 1 << 26;
/// The narrowest piece (1/65,536 of the ring).
const MIN_PIECE_WIDTH: u32 = 1 << 16;
/// Reminders handed to their new owners with a notice per ring change (the rest
/// are found by the new owner's loads).
pub const MAX_HANDOFFS: usize = 1024;
/// How long an overdue tick found by a load waits before delivery, so that the
/// previous owner's handoff (which says what it already delivered) arrives first.
pub const HANDOFF_GRACE: Duration = Duration::from_secs(1);
/// `last_fired` writes and one-shot removals running at once.
pub const MAX_WRITES: usize = 16;
/// Longest wait between retries of deliveries and writes.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait between retries of a failed load (a ring change waits for it).
const MAX_LOAD_BACKOFF: Duration = Duration::from_secs(5);

/// The notice a registering silo sends to the owner: "re-read this reminder".
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub(crate) struct ChangedNotice {
    pub service: String,
    pub actor: String,
    pub name: String,
    /// Times it was forwarded: a silo that gets a notice for a range it does not own
    /// in its view forwards it once to the owner of its view (the sender's view may
    /// be older).
    #[serde(default)]
    pub hops: u8,
    /// Sent by the previous owner of a reminder it dropped on a ring change: the
    /// new owner schedules it as a loaded row (no late first tick: the previous
    /// owner delivered what was due).
    #[serde(default)]
    pub handoff: bool,
    /// With `handoff`: the registration's etag and the first occurrence (UTC ms) the
    /// previous owner had not delivered; the new owner delivers nothing earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// The notice topic of a service's reminder agents.
pub(crate) fn topic(service_id: &str) -> String {
    format!(
        "rollcall.reminders/{:08x}",
        xxhash_rust::xxh32::xxh32(service_id.as_bytes(), 0)
    )
}

/// Sends `notices` to their silos one after another in a background task (each
/// bounded by the silo's `probe_timeout`). Best effort: a notice not taken is
/// covered by the owner's loads, so failures are only logged.
pub(crate) fn send_notices(silo: &SiloHandle, service_id: &str, notices: Vec<(SiloAddress, ChangedNotice)>) {
    if notices.is_empty() {
        return;
    }
    let (silo, topic) = (silo.clone(), topic(service_id));
    tokio::spawn(async move {
        for (owner, notice) in notices {
            let Ok(body) = serde_json::to_vec(&notice) else {
                continue;
            };
            match silo.send_notice(owner, &topic, body).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(%owner, "reminder notice not taken; the owner's loads cover it"),
                Err(e) => {
                    tracing::debug!(%owner, error = %e, "reminder notice lost; the owner's loads cover it")
                }
            }
        }
    });
}

/// `base x 2^(attempt-1)`, capped at [`MAX_BACKOFF`].
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1)
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}

/// Runs `call` bounded by `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = rollcall_membership_core::Result<T>>,
) -> Result<T, ReminderError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(ReminderError::from),
        Err(_) => Err(ReminderError::Timeout(timeout)),
    }
}

pub(crate) struct ReminderAgent {
    pub me: SiloAddress,
    pub silo: SiloHandle,
    pub table: Arc<dyn ReminderTable>,
    pub target: Arc<dyn ReminderTarget>,
    pub options: Arc<ReminderOptions>,
    pub clock: Arc<dyn Clock>,
    pub counters: Arc<Counters>,
    pub rng: StdRng,
    pub notices: Option<rollcall_membership_core::NoticeReceiver>,
    pub state: State,
}

#[derive(Default)]
pub(crate) struct State {
    ring: Ring,
    ranges: Vec<RingRange>,
    ring_gen: u64,
    queue: Queue,
    /// Bumped on every change from a notice; loads started before a change do not
    /// undo it.
    changes: u64,
    /// The load running, if any.
    load: Option<LoadRun>,
    /// Epoch of the last load started.
    load_epoch: u32,
    /// Width of the next piece a load reads (follows the table's density).
    load_width: u32,
    load_pending: bool,
    load_failures: u32,
    load_retry: Option<SpawnHandle>,
    loaded_once: bool,
    first_load_waiters: Vec<oneshot::Sender<()>>,
    timer: Option<(Timestamp, SpawnHandle)>,
    deliveries: usize,
    notice_reads: usize,
    /// Pending `last_fired` writes: key -> (etag, time).
    persist: HashMap<Key, (Etag, Timestamp)>,
    /// Pending one-shot removals: key -> etag.
    removals: HashMap<Key, Etag>,
    writes: usize,
    write_retry: Option<SpawnHandle>,
    write_failures: u32,
}

impl Actor for ReminderAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(NOTICE_QUEUE);
        // Stop with the silo.
        let silo = self.silo.clone();
        ctx.spawn(
            async move { silo.stopped().await }
                .into_actor(self)
                .map(|(), act, ctx| {
                    tracing::debug!(silo = %act.me, "silo stopped: reminder agent stops");
                    for w in act.state.first_load_waiters.drain(..) {
                        drop(w);
                    }
                    ctx.stop();
                }),
        );
        // Notices: forwarded one at a time; the bounded queue behind them drops
        // what the agent cannot take.
        if let Some(mut rx) = self.notices.take() {
            let addr = ctx.address();
            actix::spawn(async move {
                while let Some(first) = rx.recv().await {
                    let mut batch = vec![first];
                    while batch.len() < NOTICE_BATCH {
                        match rx.try_recv() {
                            Some(n) => batch.push(n),
                            None => break,
                        }
                    }
                    if addr.send(NoticesReceived(batch)).await.is_err() {
                        return;
                    }
                }
            });
        }
        // Periodic reconciliation with the table.
        ctx.run_interval(self.options.refresh_reminder_list_period, |act, ctx| {
            act.request_load(ctx)
        });
    }
}

/// A load in progress: the pieces of the owned ranges still to read.
pub(crate) struct LoadRun {
    /// The ring generation it reads for (a ring change abandons it).
    gen: u64,
    /// `State::changes` when it started: slots touched after that are newer than
    /// what it reads.
    since: u64,
    /// Its epoch, written into `Slot::seen` of every row it reads.
    epoch: u32,
    /// What is left to read of the owned ranges.
    left: VecDeque<RingRange>,
    /// Rows read so far.
    owned: u64,
}

/// Up to [`NOTICE_BATCH`] notices from the silo's notice queue; `Err` where some
/// were dropped because the queue was full.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoticesReceived(pub Vec<Result<Notice, rollcall_membership_core::NoticesDropped>>);

/// Answered once the first load of the agent's ranges finished.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WhenLoaded(pub oneshot::Sender<()>);

impl Handler<MembershipChanged> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: MembershipChanged, ctx: &mut Context<Self>) {
        let ring = Ring::of_active(&msg.0, self.options.ring_points_per_silo);
        if ring == self.state.ring && self.state.ring_gen > 0 {
            return;
        }
        let s = &mut self.state;
        s.ring_gen += 1;
        s.ranges = ring.ranges_of(&self.me);
        s.ring = ring;
        let (ring, me) = (&s.ring, self.me);
        // Hand the reminders we drop to their new owners: a row written just
        // before the change may have been missed by the new owner's load.
        let mut handoffs: Vec<(SiloAddress, ChangedNotice)> = Vec::new();
        let service = self.table.service_id();
        s.queue.retain(|slot| {
            let owner = ring.owner_of(slot.hash);
            if owner == Some(me) {
                return true;
            }
            if let Some(owner) = owner.filter(|_| handoffs.len() < MAX_HANDOFFS) {
                handoffs.push((
                    owner,
                    ChangedNotice {
                        service: service.to_owned(),
                        actor: slot.key.actor().to_owned(),
                        name: slot.key.name().to_owned(),
                        hops: 1,
                        handoff: true,
                        etag: Some(slot.etag.to_string()),
                        // A delivery in progress covers its occurrence.
                        next: Some(slot.next.scheduled.as_millis() + u64::from(slot.delivering)),
                    },
                ));
            }
            false
        });
        send_notices(&self.silo, self.table.service_id(), handoffs);
        tracing::debug!(silo = %me, ranges = s.ranges.len(), silos = s.ring.silos().len(), "reminder ring changed");
        self.request_load(ctx);
        self.arm_timer(ctx);
    }
}

impl Handler<WhenLoaded> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: WhenLoaded, _: &mut Context<Self>) {
        if self.state.loaded_once {
            let _ = msg.0.send(());
        } else {
            self.state.first_load_waiters.push(msg.0);
        }
    }
}

impl Handler<NoticesReceived> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: NoticesReceived, ctx: &mut Context<Self>) {
        for notice in msg.0 {
            match notice {
                Ok(notice) => self.notice(notice, ctx),
                Err(dropped) => {
                    tracing::debug!(silo = %self.me, dropped = dropped.0, "reminder notices were dropped (queue full); reloading the ranges");
                    self.request_load(ctx);
                }
            }
        }
    }
}

impl ReminderAgent {
    /// Handles one notice: re-reads the reminder it names (bounded), or leaves it
    /// to a pending load, or forwards it to the owner.
    fn notice(&mut self, notice: Notice, ctx: &mut Context<Self>) {
        let Ok(n) = serde_json::from_slice::<ChangedNotice>(&notice.body) else {
            tracing::debug!(from = %notice.from, "undecodable reminder notice dropped");
            return;
        };
        if n.service != self.table.service_id() {
            return;
        }
        Counters::bump(&self.counters.notices);
        let hash = actor_hash(&n.actor);
        if !self.state.ring.owns(&self.me, hash) {
            // Not ours in our view: forward once to the owner we see (the sender's
            // view may be older); past that, the owner's own loads cover it.
            if let (0, Some(owner)) = (n.hops, self.state.ring.owner_of(hash)) {
                send_notices(
                    &self.silo,
                    self.table.service_id(),
                    vec![(owner, ChangedNotice { hops: 1, ..n })],
                );
            }
            return;
        }
        let key = Key::new(&n.actor, &n.name);
        let floor = n.next.map(Timestamp::from_millis);
        if let (Some(etag), Some(floor)) = (&n.etag, floor) {
            // A handoff for a registration we already hold: deliver nothing the
            // previous owner delivered.
            if let Some(slot) = self.state.queue.get(&key) {
                if slot.etag == etag.as_str() {
                    if !slot.delivering && slot.next.scheduled < floor {
                        let next = occurrence_at_or_after(slot.timing(), floor);
                        match next {
                            Some(at) => self.state.queue.requeue(
                                &key,
                                Planned {
                                    scheduled: at,
                                    due: at,
                                },
                            ),
                            None => {
                                self.state.queue.remove(&key);
                            }
                        }
                        self.arm_timer(ctx);
                    }
                    return;
                }
            }
        }
        if !n.handoff && self.state.load_pending {
            // The pending load starts after this notice arrived, so it reads the
            // registration the notice is about.
            return;
        }
        if self.state.notice_reads >= MAX_NOTICE_READS {
            self.request_load(ctx);
            return;
        }
        self.state.notice_reads += 1;
        let gen = self.state.ring_gen;
        let table = self.table.clone();
        let timeout = self.options.table_operation_timeout;
        let learned = if n.handoff { Learned::Load } else { Learned::Notice };
        let (actor, name) = (n.actor, n.name);
        ctx.spawn(
            async move { bounded(timeout, table.read_row(&actor, &name)).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    act.state.notice_reads -= 1;
                    if gen != act.state.ring_gen {
                        return; // the load of the new ring reads it
                    }
                    match res {
                        Ok(None) => {
                            act.state.changes += 1;
                            act.state.queue.remove(&key);
                        }
                        Ok(Some(row)) => {
                            if act.state.queue.get(&key).is_some_and(|s| s.etag == row.etag.as_str()) {
                                return;
                            }
                            act.state.changes += 1;
                            let now = act.clock.now();
                            act.schedule_row(row, now, learned, false, floor);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading a notified reminder failed; reloading the ranges");
                            act.request_load(ctx);
                        }
                    }
                    act.publish_gauges();
                    act.arm_timer(ctx);
                }),
        );
    }

    /// Materialises `row` if its next tick is within the loading window (else drops
    /// any slot it had). `jitter` spreads an overdue tick over `startup_jitter`.
    fn schedule_row(
        &mut self,
        mut row: ReminderEntry,
        now: Timestamp,
        learned: Learned,
        jitter: bool,
        floor: Option<Timestamp>,
    ) {
        let key = key_of(&row);
        if let Some((etag, at)) = self.state.persist.get(&key) {
            if *etag == row.etag {
                row.last_fired = row.last_fired.max(Some(*at));
            }
        }
        let Some(mut next) = plan(&row, now, learned) else {
            self.state.queue.remove(&key);
            return;
        };
        if let Some(floor) = floor.filter(|f| next.scheduled < *f) {
            match occurrence_at_or_after(Timing::from(&row), floor) {
                Some(at) => {
                    next = Planned {
                        scheduled: at,
                        due: at,
                    }
                }
                None => {
                    self.state.queue.remove(&key);
                    return;
                }
            }
        }
        if next.due > now.saturating_add(self.options.loading_window) {
            self.state.queue.remove(&key);
            return;
        }
        if learned == Learned::Load && next.is_overdue(now) {
            // A late or catch-up tick found by a load: give the previous owner's
            // handoff time to arrive, and at start-up spread these ticks over the
            // jitter window (restart storms).
            let spread = if jitter && !self.options.startup_jitter.is_zero() {
                self.rng
                    .random_range(0..=self.options.startup_jitter.as_millis() as u64)
            } else {
                0
            };
            next.due = now.saturating_add(HANDOFF_GRACE + Duration::from_millis(spread));
        }
        let changes = self.state.changes;
        self.state.queue.set(&row, next, changes);
    }

    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering;
        self.counters
            .scheduled
            .store(self.state.queue.len() as u64, Ordering::Relaxed);
    }

    /// Starts a load of every owned range, or marks one pending if one runs.
    pub(crate) fn request_load(&mut self, ctx: &mut Context<Self>) {
        let s = &mut self.state;
        if s.load.is_some() || s.load_retry.is_some() {
            // One load at a time; while backing off after a failure, the retry
            // timer runs the next one.
            s.load_pending = true;
            return;
        }
        s.load_pending = false;
        s.load_epoch = s.load_epoch.wrapping_add(1).max(1);
        s.load = Some(LoadRun {
            gen: s.ring_gen,
            since: s.changes,
            epoch: s.load_epoch,
            left: s.ranges.iter().copied().collect(),
            owned: 0,
        });
        self.load_next_piece(ctx);
    }

    /// Reads the next piece of the running load, or ends it.
    fn load_next_piece(&mut self, ctx: &mut Context<Self>) {
        let width = match self.state.load_width {
            0 => FIRST_PIECE_WIDTH,
            w => w,
        };
        let Some(run) = self.state.load.as_mut() else {
            return;
        };
        let Some(range) = run.left.pop_front() else {
            self.load_finished(ctx);
            return;
        };
        let (piece, rest) = range.cut(width);
        if let Some(rest) = rest {
            run.left.push_front(rest);
        }
        let epoch = run.epoch;
        let table = self.table.clone();
        let timeout = self.options.table_operation_timeout;
        ctx.spawn(
            async move {
                // Let other tasks run between pieces even when the table answers
                // without waiting (the memory table): a load never holds the thread.
                tokio::task::yield_now().await;
                bounded(timeout, table.read_rows_in_range(piece.begin, piece.end)).await
            }
            .into_actor(self)
            .map(move |res, act, ctx| act.piece_loaded(epoch, (piece, width), res, ctx)),
        );
    }

    fn piece_loaded(
        &mut self,
        epoch: u32,
        (piece, width): (RingRange, u32),
        res: Result<Vec<ReminderEntry>, ReminderError>,
        ctx: &mut Context<Self>,
    ) {
        let Some(run) = self.state.load.as_ref().filter(|r| r.epoch == epoch) else {
            return;
        };
        let (gen, since) = (run.gen, run.since);
        if gen != self.state.ring_gen {
            // Read under an older ring: discarded; the new ring's load follows.
            self.state.load = None;
            self.request_load(ctx);
            return;
        }
        let rows = match res {
            Ok(rows) => rows,
            Err(e) => {
                self.state.load = None;
                Counters::bump(&self.counters.load_failures);
                self.state.load_failures += 1;
                let wait = backoff(self.state.load_failures)
                    .min(MAX_LOAD_BACKOFF)
                    .min(self.options.refresh_reminder_list_period);
                tracing::warn!(silo = %self.me, error = %e, retry_in = ?wait, "loading reminders failed; the schedule in memory keeps ticking");
                self.state.load_retry = Some(ctx.run_later(wait, |act, ctx| {
                    act.state.load_retry = None;
                    act.request_load(ctx);
                }));
                self.arm_timer(ctx);
                return;
            }
        };
        let now = self.clock.now();
        let first = !self.state.loaded_once;
        if let Some(run) = self.state.load.as_mut() {
            run.owned += rows.len() as u64;
        }
        // The next piece: about LOAD_PIECE_ROWS rows at the density just read,
        // at most 8x wider or narrower than this one's width.
        let width = u64::from(width);
        let next = match rows.len() as u64 {
            0 => width * 8,
            n => (piece.size() * LOAD_PIECE_ROWS / n).clamp(width / 8, width * 8),
        };
        self.state.load_width = next.clamp(u64::from(MIN_PIECE_WIDTH), u64::from(u32::MAX)) as u32;
        for row in rows {
            let key = key_of(&row);
            if self.state.removals.get(&key) == Some(&row.etag) {
                continue; // a delivered one-shot whose removal is pending
            }
            match self.state.queue.get_mut(&key) {
                Some(slot) if slot.etag == row.etag.as_str() || slot.touched > since => slot.seen = epoch,
                _ => {
                    self.schedule_row(row, now, Learned::Load, first, None);
                    if let Some(slot) = self.state.queue.get_mut(&key) {
                        slot.seen = epoch;
                    }
                }
            }
        }
        self.publish_gauges();
        self.arm_timer(ctx);
        self.load_next_piece(ctx);
    }

    /// The `service` and `silo` labels of this agent's `metrics` series.
    fn metric_labels(&self) -> (String, String) {
        (self.table.service_id().to_owned(), self.me.to_string())
    }

    /// Ends the running load: drops the slots it did not read (deleted rows, or
    /// ranges no longer owned) unless a notice touched them meanwhile.
    fn load_finished(&mut self, ctx: &mut Context<Self>) {
        let Some(run) = self.state.load.take() else { return };
        Counters::bump(&self.counters.loads);
        self.state.load_failures = 0;
        self.counters
            .owned
            .store(run.owned, std::sync::atomic::Ordering::Relaxed);
        let (service, silo) = self.metric_labels();
        metrics::gauge!(crate::api::OWNED_METRIC, "service" => service, "silo" => silo).set(run.owned as f64);
        self.state
            .queue
            .retain(|slot| slot.seen == run.epoch || slot.touched > run.since);
        if !self.state.loaded_once {
            self.state.loaded_once = true;
            for w in self.state.first_load_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        self.publish_gauges();
        if self.state.load_pending {
            self.request_load(ctx);
        }
        self.arm_timer(ctx);
    }

    /// Keeps one timer at the earliest due time.
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let Some(next) = self.state.queue.next_due() else {
            if let Some((_, h)) = self.state.timer.take() {
                ctx.cancel_future(h);
            }
            return;
        };
        if let Some((at, h)) = self.state.timer {
            if at <= next {
                return;
            }
            ctx.cancel_future(h);
        }
        let wait = next.saturating_duration_since(self.clock.now());
        let h = ctx.run_later(wait, |act, ctx| {
            act.state.timer = None;
            act.deliver_due(ctx);
            act.arm_timer(ctx);
        });
        self.state.timer = Some((next, h));
    }

    fn deliver_due(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        if self.silo.status() != SiloStatus::Active {
            // Not Active (yet, or any more): nothing is delivered; look again soon.
            let h = ctx.run_later(Duration::from_secs(1), |act, ctx| {
                act.state.timer = None;
                act.deliver_due(ctx);
                act.arm_timer(ctx);
            });
            self.state.timer = Some((now.saturating_add(Duration::from_secs(1)), h));
            return;
        }
        let room = MAX_DELIVERIES.saturating_sub(self.state.deliveries);
        for key in self.state.queue.take_due(now, room) {
            let slot = self.state.queue.get(&key).expect("taken slot exists");
            let (etag, scheduled) = (slot.etag.clone(), slot.next.scheduled);
            let actor = ActorId::parse(key.actor());
            let recipient = actor.as_ref().ok().and_then(|a| self.target.resolve(a));
            let tick = actor.map(|actor| ReminderTick {
                actor,
                name: key.name().to_owned(),
                first_tick: slot.start_at,
                period: slot.period(),
                scheduled,
                now,
            });
            let timeout = self.options.delivery_timeout;
            self.state.deliveries += 1;
            ctx.spawn(
                async move {
                    let tick = tick.map_err(|e| e.to_string())?;
                    let r = recipient.ok_or_else(|| format!("no recipient for {}", tick.actor))?;
                    match tokio::time::timeout(timeout, r.send(tick)).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(format!("mailbox: {e}")),
                        Err(_) => Err(format!("handler did not finish within {timeout:?}")),
                    }
                }
                .into_actor(self)
                .map(move |res, act, ctx| act.delivered(key, etag, scheduled, res, ctx)),
            );
        }
    }

    fn delivered(
        &mut self,
        key: Key,
        etag: smol_str::SmolStr,
        scheduled: Timestamp,
        res: Result<(), String>,
        ctx: &mut Context<Self>,
    ) {
        self.state.deliveries -= 1;
        let now = self.clock.now();
        let current = self
            .state
            .queue
            .get(&key)
            .is_some_and(|s| s.delivering && s.etag == etag && s.next.scheduled == scheduled);
        match res {
            Ok(()) => {
                Counters::bump(&self.counters.ticks_delivered);
                let lateness = now.saturating_duration_since(scheduled);
                if lateness > crate::api::LATE_TICK {
                    Counters::bump(&self.counters.ticks_late);
                }
                let (service, silo) = self.metric_labels();
                metrics::counter!(crate::api::TICKS_METRIC, "service" => service.clone(), "silo" => silo.clone())
                    .increment(1);
                metrics::histogram!(crate::api::TICK_LATENESS_METRIC, "service" => service, "silo" => silo)
                    .record(lateness.as_secs_f64());
                if current {
                    let slot = self.state.queue.get_mut(&key).expect("current");
                    slot.attempts = 0;
                    let etag = || Etag::new(etag.as_str());
                    if slot.policy == MissedTickPolicy::FireOnce {
                        slot.last_fired = now;
                        self.state.persist.insert(key.clone(), (etag(), now));
                    }
                    match after_delivery(slot.timing(), scheduled, now) {
                        None => {
                            self.state.queue.remove(&key);
                            self.state.persist.remove(&key);
                            self.state.removals.insert(key, etag());
                        }
                        Some(next) if next.due > now.saturating_add(self.options.loading_window) => {
                            self.state.queue.remove(&key);
                        }
                        Some(next) => self.state.queue.requeue(&key, next),
                    }
                    self.pump_writes(ctx);
                }
            }
            Err(why) => {
                Counters::bump(&self.counters.delivery_failures);
                if current {
                    let slot = self.state.queue.get_mut(&key).expect("current");
                    slot.attempts = slot.attempts.saturating_add(1);
                    let retry = now.saturating_add(backoff(u32::from(slot.attempts)));
                    match after_delivery(slot.timing(), scheduled, now) {
                        Some(next) if next.due <= retry => {
                            Counters::bump(&self.counters.ticks_given_up);
                            tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempts = slot.attempts,
                                "reminder tick not delivered before the next one was due; moving on");
                            slot.attempts = 0;
                            self.state.queue.requeue(&key, next);
                        }
                        _ => {
                            tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempt = slot.attempts,
                                "reminder tick delivery failed; retrying");
                            self.state.queue.requeue(
                                &key,
                                Planned {
                                    scheduled,
                                    due: retry,
                                },
                            );
                        }
                    }
                }
            }
        }
        self.publish_gauges();
        // Room for deliveries that waited on the bound.
        if self.state.queue.next_due().is_some_and(|d| d <= now) {
            self.deliver_due(ctx);
        }
        self.arm_timer(ctx);
    }

    /// Runs pending `last_fired` writes and one-shot removals, at most
    /// [`MAX_WRITES`] at once; failures are retried after a backoff.
    fn pump_writes(&mut self, ctx: &mut Context<Self>) {
        if self.state.write_retry.is_some() {
            return; // backing off after a failure: the timer pumps
        }
        while self.state.writes < MAX_WRITES {
            let timeout = self.options.table_operation_timeout;
            let table = self.table.clone();
            if let Some(key) = self.state.removals.keys().next().cloned() {
                let etag = self.state.removals.remove(&key).expect("present");
                self.state.writes += 1;
                let (k, e) = (key.clone(), etag.clone());
                ctx.spawn(
                    async move { bounded(timeout, table.remove_row(k.actor(), k.name(), &e)).await }
                        .into_actor(self)
                        .map(move |res, act, ctx| {
                            act.state.writes -= 1;
                            match res {
                                Ok(_) => act.write_succeeded(ctx),
                                Err(err) => {
                                    act.state.removals.entry(key).or_insert(etag);
                                    act.write_failed(ctx, &err);
                                }
                            }
                        }),
                );
            } else if let Some(key) = self.state.persist.keys().next().cloned() {
                let (etag, at) = self.state.persist.remove(&key).expect("present");
                self.state.writes += 1;
                let (k, e) = (key.clone(), etag.clone());
                ctx.spawn(
                    async move { bounded(timeout, table.update_last_fired(k.actor(), k.name(), &e, at)).await }
                        .into_actor(self)
                        .map(move |res, act, ctx| {
                            act.state.writes -= 1;
                            match res {
                                Ok(_) => act.write_succeeded(ctx),
                                Err(err) => {
                                    // A newer time queued meanwhile wins.
                                    act.state.persist.entry(key).or_insert((etag, at));
                                    act.write_failed(ctx, &err);
                                }
                            }
                        }),
                );
            } else {
                return;
            }
        }
    }

    fn write_succeeded(&mut self, ctx: &mut Context<Self>) {
        self.state.write_failures = 0;
        self.pump_writes(ctx);
    }

    fn write_failed(&mut self, ctx: &mut Context<Self>, err: &ReminderError) {
        Counters::bump(&self.counters.write_failures);
        self.state.write_failures += 1;
        if self.state.write_retry.is_none() {
            let wait = backoff(self.state.write_failures);
            tracing::warn!(error = %err, retry_in = ?wait, "recording a reminder tick failed; retrying");
            self.state.write_retry = Some(ctx.run_later(wait, |act, ctx| {
                act.state.write_retry = None;
                act.pump_writes(ctx);
            }));
        }
    }
}

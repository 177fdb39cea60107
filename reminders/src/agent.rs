//! The reminder agent: one actix actor per silo and service. It keeps the ring of
//! the silo's membership view, loads the ranges it owns, keeps the reminders due
//! within the loading window in a [`Queue`], delivers ticks, and records
//! `last_fired` and one-shot removals. Ranges change hands by releases and holds
//! ([`crate::handoff`]). Every table call and delivery runs as a
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
//! | releases ([`crate::handoff`]) | one per new owner per ring change, one per silo of the ring on a graceful leave, each sent in a background task with 3 attempts; 64 sent, 64 received and 64 early ones kept |
//! | holds | at most [`HANDOFF_TIMEOUT`](crate::handoff::HANDOFF_TIMEOUT); one request round every [`REQUEST_AFTER`] while one waits |
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
    actor_hash, Clock, Etag, MembershipChanged, MembershipSnapshot, MissedTickPolicy, Notice, ReminderEntry,
    ReminderOptions, ReminderTable, SiloAddress, SiloHandle, SiloStatus, Timestamp,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::api::{ActorId, Counters, ReminderError, ReminderTarget, ReminderTick};
use crate::handoff::{
    Custody, Floor, HandoffMessage, Holds, Release, ReleaseRequest, ReleasedPiece, Start, REQUEST_AFTER,
};
use crate::queue::{key_of, Key, Queue};
use crate::ring::{Ring, RingRange};
use crate::schedule::{after_attempt, occurrence_after, plan, AfterAttempt, Learned, Planned, Timing};

/// The first occurrence of `entry` at or after `t`; `None` for a one-shot whose
/// time is before `t`.
fn occurrence_at_or_after(entry: Timing, t: Timestamp) -> Option<Timestamp> {
    occurrence_after(
        entry.start_at,
        entry.period,
        Timestamp::from_millis(t.as_millis().saturating_sub(1)),
    )
}

/// The next tick of a reminder learned at `now`, its schedule starting as the holds
/// say: `Held` plans as usual (the slot waits out of the due index), `From(floor)`
/// takes the first occurrence at or after the floor (at once if it has passed).
fn planned(timing: Timing, now: Timestamp, learned: Learned, start: Start) -> Option<Planned> {
    match start {
        Start::Free | Start::Held => plan(timing, now, learned),
        Start::From(floor) => {
            let at = occurrence_at_or_after(timing, floor)?;
            Some(Planned {
                scheduled: at,
                due: at.max(now),
            })
        }
    }
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
/// How long an overdue tick found by a load outside a handoff waits before
/// delivery (a registration rewritten meanwhile is read first).
const LOAD_GRACE: Duration = Duration::from_secs(1);
/// Releases received before the ring that needs them, kept to apply later.
const EARLY_RELEASES: usize = 64;
/// How often waiting holds are looked at (expiry, requests).
const HOLD_CHECK: Duration = Duration::from_millis(100);
/// Attempts at sending one release.
const RELEASE_ATTEMPTS: u32 = 3;
/// How long a graceful leave waits for the deliveries in flight before it releases
/// its ranges (a delivery still running then counts as delivered).
const LEAVE_DRAIN: Duration = Duration::from_secs(2);
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
}

/// The notice topic of a service's reminder agents.
pub(crate) fn topic(service_id: &str) -> String {
    format!(
        "rollcall.reminders/{:08x}",
        xxhash_rust::xxh32::xxh32(service_id.as_bytes(), 0)
    )
}

/// The topic of a service's range releases ([`crate::handoff`]).
pub(crate) fn release_topic(service_id: &str) -> String {
    format!("{}/release", topic(service_id))
}

/// Sends `releases` to their silos at once, each retried up to
/// [`RELEASE_ATTEMPTS`] times (each bounded by the silo's `probe_timeout`);
/// finishes when every one was taken or given up.
pub(crate) async fn send_releases(silo: SiloHandle, releases: Vec<(SiloAddress, HandoffMessage)>) {
    let topic = match releases.first() {
        Some((_, HandoffMessage::Release(r))) => release_topic(&r.service),
        Some((_, HandoffMessage::Request(r))) => release_topic(&r.service),
        None => return,
    };
    let sends = releases.into_iter().map(|(to, message)| {
        let (silo, topic) = (silo.clone(), topic.clone());
        tokio::spawn(async move {
            let Ok(body) = serde_json::to_vec(&message) else { return };
            for attempt in 1..=RELEASE_ATTEMPTS {
                match silo.send_notice(to, &topic, body.clone()).await {
                    Ok(true) => return,
                    Ok(false) => tracing::debug!(%to, attempt, "reminder release not taken"),
                    Err(e) => tracing::debug!(%to, attempt, error = %e, "reminder release not sent"),
                }
                tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
            }
            tracing::warn!(%to, "reminder release never taken; its receiver takes the range over after its hold timeout");
        })
    });
    let sends: Vec<_> = sends.collect();
    for s in sends {
        let _ = s.await;
    }
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

/// The wait before retry number `attempt` (1 for the first): exponential backoff
/// with full jitter from 1 s, capped at [`MAX_BACKOFF`]
/// ([`backoff_delay`](rollcall_membership_core::protocol::backoff_delay), as the
/// membership machine's retries), so silos that failed together do not retry
/// together.
pub(crate) fn backoff(attempt: u32, rng: &mut StdRng) -> Duration {
    rollcall_membership_core::protocol::backoff_delay(
        attempt.saturating_sub(1),
        Duration::from_secs(1),
        MAX_BACKOFF,
        rng.random(),
    )
}

/// Runs `call` bounded by `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = rollcall_membership_core::Result<T>>,
) -> Result<T, ReminderError> {
    rollcall_membership_core::bounded(
        timeout,
        async { call.await.map_err(ReminderError::from) },
        ReminderError::Timeout,
    )
    .await
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
    pub releases: Option<rollcall_membership_core::NoticeReceiver>,
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
    /// Ranges gained and not yet released by their previous owners.
    holds: Holds,
    /// The membership view the ring was built from.
    view: Option<Arc<MembershipSnapshot>>,
    /// Timer of the next hold expiry.
    hold_timer: Option<SpawnHandle>,
    /// Releases that freed no hold yet (they may arrive before the ring change).
    early: VecDeque<(Timestamp, Release)>,
    /// The silo is leaving: nothing more is delivered, and once the deliveries in
    /// flight finished every range is released.
    leaving: bool,
    /// The leave hook's answer, until the releases are sent.
    leave_reply: Option<oneshot::Sender<()>>,
    /// The ring before `ring`.
    prev_ring: Ring,
    /// The releases received last (from other silos), to pass on on request.
    received: VecDeque<Release>,
    /// The releases sent last, to send again on request, less what this silo
    /// owns again.
    sent: VecDeque<Release>,
    /// When the holds last asked for releases (or stopped waiting).
    asked: Timestamp,
    /// When each silo a hold waits for was first seen Dead or absent.
    gone_at: HashMap<SiloAddress, Timestamp>,
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
        // Notices and releases: forwarded in batches; the bounded queues behind
        // them drop what the agent cannot take.
        if let Some(rx) = self.notices.take() {
            forward(rx, ctx.address(), |b| NoticesReceived(b, false));
        }
        if let Some(rx) = self.releases.take() {
            forward(rx, ctx.address(), |b| NoticesReceived(b, true));
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
/// were dropped because the queue was full. `true`: from the release topic.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoticesReceived(
    pub Vec<Result<Notice, rollcall_membership_core::NoticesDropped>>,
    pub bool,
);

/// Forwards what `rx` receives to the agent in batches of up to [`NOTICE_BATCH`].
fn forward(
    mut rx: rollcall_membership_core::NoticeReceiver,
    addr: actix::Addr<ReminderAgent>,
    wrap: fn(Vec<Result<Notice, rollcall_membership_core::NoticesDropped>>) -> NoticesReceived,
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

/// The silo is leaving gracefully: release every range, deliver nothing more, and
/// answer once the releases were taken (see [`crate::handoff`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Leave(pub oneshot::Sender<()>);

/// Answered once the first load of the agent's ranges finished.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WhenLoaded(pub oneshot::Sender<()>);

impl Handler<MembershipChanged> for ReminderAgent {
    type Result = ();

    fn handle(&mut self, msg: MembershipChanged, ctx: &mut Context<Self>) {
        let ring = Ring::of_active(&msg.0, self.options.ring_points_per_silo);
        self.state.view = Some(msg.0);
        if self.state.leaving {
            return;
        }
        if ring == self.state.ring && self.state.ring_gen > 0 {
            self.expire_holds(ctx);
            return;
        }
        let now = self.clock.now();
        let me = self.me;
        let s = &mut self.state;
        s.ring_gen += 1;
        let old = std::mem::take(&mut s.ring);
        let lost = s.holds.ring_changed(&old, &ring, me, now, s.load_epoch);
        let releases = self.releases_of(&lost, now);
        let s = &mut self.state;
        s.holds.keep_owned(&ring, me);
        s.ranges = ring.ranges_of(&me);
        // What this silo owns again, it no longer has released.
        let sent = std::mem::take(&mut s.sent);
        s.sent = sent.into_iter().filter_map(|r| r.without(&s.ranges)).collect();
        s.ring = ring;
        s.prev_ring = old;
        let ring = &s.ring;
        s.queue.retain(|slot| ring.owns(&me, slot.hash));
        // Releases that came before this ring may free what it holds.
        // (Kept for a hold timeout at most: older ones can free nothing.)
        let early: Vec<(Timestamp, Release)> = s
            .early
            .drain(..)
            .filter(|(t, _)| now.saturating_duration_since(*t) < crate::handoff::HANDOFF_TIMEOUT)
            .collect();
        for (at, r) in early {
            self.release_received(r, at);
        }
        self.hold_slots();
        tracing::debug!(silo = %me, ranges = self.state.ranges.len(), silos = self.state.ring.silos().len(),
            waiting_for = ?self.state.holds.waiting_for(), "reminder ring changed");
        self.send(releases);
        self.request_load(ctx);
        self.expire_holds(ctx);
        self.arm_timer(ctx);
    }
}

impl Handler<Leave> for ReminderAgent {
    type Result = ();

    /// Stops delivering, lets the deliveries in flight finish (at most
    /// [`LEAVE_DRAIN`]: a tick whose handler completed is delivered, one that
    /// failed goes to the new owner), then releases every range.
    fn handle(&mut self, msg: Leave, ctx: &mut Context<Self>) {
        if self.state.leaving {
            let _ = msg.0.send(());
            return;
        }
        let s = &mut self.state;
        s.leaving = true;
        s.leave_reply = Some(msg.0);
        if let Some((_, h)) = s.timer.take() {
            ctx.cancel_future(h);
        }
        if s.deliveries == 0 {
            self.finish_leave(ctx);
        } else {
            ctx.run_later(LEAVE_DRAIN, |act, ctx| act.finish_leave(ctx));
        }
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
        if msg.1 {
            let mut freed = false;
            for notice in msg.0.into_iter().flatten() {
                match serde_json::from_slice::<HandoffMessage>(&notice.body) {
                    Ok(HandoffMessage::Release(r)) if r.service == self.table.service_id() => {
                        freed |= self.release_received(r, self.clock.now())
                    }
                    Ok(HandoffMessage::Request(r)) if r.service == self.table.service_id() => {
                        self.answer_request(r)
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(from = %notice.from, error = %e, "undecodable reminder release dropped")
                    }
                }
            }
            if freed {
                self.free_held();
                self.publish_gauges();
                self.arm_timer(ctx);
            }
            return;
        }
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
        if self.state.load_pending {
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
                            act.schedule_row(row, now, Learned::Notice, false);
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
    fn schedule_row(&mut self, mut row: ReminderEntry, now: Timestamp, learned: Learned, jitter: bool) {
        let key = key_of(&row);
        if let Some((etag, at)) = self.state.persist.get(&key) {
            if *etag == row.etag {
                row.last_fired = row.last_fired.max(Some(*at));
            }
        }
        let start = self
            .state
            .holds
            .start_of(row.hash, &row.actor_id, &row.name, row.etag.as_str());
        let Some(mut next) = planned(Timing::from(&row), now, learned, start) else {
            self.state.queue.remove(&key);
            return;
        };
        if next.due > now.saturating_add(self.options.loading_window) {
            self.state.queue.remove(&key);
            return;
        }
        if start == Start::Free && learned == Learned::Load && next.is_overdue(now) {
            // A late or catch-up tick found by a load outside a handoff: wait the
            // load grace, and at start-up spread these ticks over the jitter
            // window (restart storms).
            let spread = if jitter && !self.options.startup_jitter.is_zero() {
                self.rng
                    .random_range(0..=self.options.startup_jitter.as_millis() as u64)
            } else {
                0
            };
            next.due = now.saturating_add(LOAD_GRACE + Duration::from_millis(spread));
        }
        let changes = self.state.changes;
        self.state.queue.set(&row, next, changes);
        match start {
            Start::Held => self.state.queue.hold(&key),
            Start::From(_) if next.scheduled < now => {
                if let Some(slot) = self.state.queue.get_mut(&key) {
                    slot.catch_up_to = now;
                }
            }
            _ => {}
        }
    }

    /// The releases of the pieces `lost` (with their new owners) at `now`: per new
    /// owner, the pieces this silo delivered in (or inherited a floor for), and the
    /// first undelivered occurrence of every reminder whose floor is not the
    /// piece's. A piece this silo still holds names the silo it waits for (rule 4
    /// of [`crate::handoff`]).
    fn releases_of(&self, lost: &[(RingRange, SiloAddress)], now: Timestamp) -> Vec<(SiloAddress, Release)> {
        let s = &self.state;
        let mut by_owner: HashMap<SiloAddress, Release> = HashMap::new();
        let after = now.as_millis() + 1;
        let mut inherited: Vec<RingRange> = Vec::new();
        for (range, to) in lost {
            let r = by_owner.entry(*to).or_insert_with(|| Release {
                service: self.table.service_id().to_owned(),
                from: self.me,
                at: now.as_millis(),
                pieces: Vec::new(),
                floors: Vec::new(),
                hops: 0,
                last: false,
                to: Some(*to),
            });
            for (piece, custody) in s.holds.custody(*range) {
                let (floor, waiting_for) = match custody {
                    Custody::Held(from) => (None, Some(from)),
                    Custody::Free => (Some(after), None),
                    Custody::Inherited(f) => {
                        inherited.push(piece);
                        (f.map(Timestamp::as_millis), None)
                    }
                };
                r.pieces.push(ReleasedPiece {
                    range: piece,
                    floor,
                    waiting_for,
                });
            }
        }
        for slot in s.queue.iter() {
            let Some((_, to)) = lost.iter().find(|(r, _)| r.contains(slot.hash)) else {
                continue;
            };
            if slot.held {
                continue;
            }
            // The first occurrence not delivered: a running delivery covers its own.
            let next = if slot.delivering {
                slot.next.scheduled.as_millis() + 1
            } else {
                slot.next.scheduled.as_millis()
            };
            let listed = inherited.iter().any(|p| p.contains(slot.hash));
            if next < after || listed {
                if let Some(r) = by_owner.get_mut(to) {
                    r.floors.push(Floor {
                        actor: slot.key.actor().to_owned(),
                        name: slot.key.name().to_owned(),
                        etag: slot.etag.to_string(),
                        next,
                    });
                }
            }
        }
        by_owner
            .into_iter()
            .filter(|(_, r)| !r.pieces.is_empty())
            .collect()
    }

    /// Applies a release to the holds; keeps it for a later ring if it freed
    /// nothing, and forwards the pieces owned by a third silo in this silo's view.
    /// Returns whether a hold was freed.
    fn release_received(&mut self, r: Release, received: Timestamp) -> bool {
        let me = self.me;
        tracing::trace!(silo = %me, from = %r.from, at = r.at, pieces = r.pieces.len(), floors = ?r.floors.iter().map(|f| (&f.actor, f.next)).collect::<Vec<_>>(), "release received");
        if r.from != me && !self.state.received.contains(&r) {
            crate::handoff::remember(&mut self.state.received, r.clone(), EARLY_RELEASES);
        }
        let freed = self.state.holds.released(&r, me);
        let forward: Vec<(SiloAddress, HandoffMessage)> = crate::handoff::forwards(&r, &self.state.ring, me)
            .into_iter()
            .map(|(to, r)| (to, HandoffMessage::Release(r)))
            .collect();
        if !forward.is_empty() {
            tracing::debug!(silo = %me, from = %r.from, to = ?forward.iter().map(|(to, _)| to).collect::<Vec<_>>(), "forwarding a reminder release");
            tokio::spawn(send_releases(self.silo.clone(), forward));
        }
        if !freed {
            if self.state.early.len() == EARLY_RELEASES {
                self.state.early.pop_front();
            }
            self.state.early.push_back((received, r));
        }
        freed
    }

    /// Answers a [`ReleaseRequest`] with what [`crate::handoff::answer`] says.
    fn answer_request(&mut self, r: ReleaseRequest) {
        let s = &self.state;
        let again = crate::handoff::answer(
            &r,
            self.me,
            self.clock.now(),
            &s.ring,
            &s.prev_ring,
            &s.sent,
            &s.received,
        );
        if again.is_empty() {
            return;
        }
        tracing::debug!(silo = %self.me, to = %r.from, releases = again.len(), "answering a request for reminder releases");
        let again = again
            .into_iter()
            .map(|rel| (r.from, HandoffMessage::Release(rel)))
            .collect();
        tokio::spawn(send_releases(self.silo.clone(), again));
    }

    /// The last step of a graceful leave: one release of every range, to every silo
    /// of the ring (a new owner in this silo's view may leave too before it sees
    /// this silo go; the silo that gets a range in the end has the release all the
    /// same); answers the leave hook once they were taken.
    fn finish_leave(&mut self, ctx: &mut Context<Self>) {
        let Some(reply) = self.state.leave_reply.take() else {
            return;
        };
        let now = self.clock.now();
        let me = self.me;
        let remaining = self.state.ring.without(&me);
        let lost: Vec<(RingRange, SiloAddress)> = crate::handoff::transfers(&self.state.ring, &remaining)
            .into_iter()
            .filter_map(|(range, was, is)| (was == Some(me)).then_some(range).zip(is))
            .collect();
        let mut all: Option<Release> = None;
        for (_, r) in self.releases_of(&lost, now) {
            match &mut all {
                None => all = Some(r),
                Some(a) => {
                    a.pieces.extend(r.pieces);
                    a.floors.extend(r.floors);
                }
            }
        }
        let releases: Vec<(SiloAddress, HandoffMessage)> = match all.map(|a| Release {
            last: true,
            to: None,
            ..a
        }) {
            None => Vec::new(),
            Some(all) => remaining
                .silos()
                .into_iter()
                .map(|to| (to, HandoffMessage::Release(all.clone())))
                .collect(),
        };
        self.state.queue.retain(|_| false);
        tracing::debug!(silo = %me, releases = releases.len(), "leaving: reminder ranges released");
        let silo = self.silo.clone();
        ctx.spawn(
            async move { send_releases(silo, releases).await }
                .into_actor(self)
                .map(move |(), _, _| {
                    let _ = reply.send(());
                }),
        );
    }

    /// Sends `releases` in the background, keeping them to send again on request.
    fn send(&mut self, releases: Vec<(SiloAddress, Release)>) {
        if releases.is_empty() {
            return;
        }
        for (_, r) in &releases {
            crate::handoff::remember(&mut self.state.sent, r.clone(), EARLY_RELEASES);
        }
        let messages = releases
            .into_iter()
            .map(|(to, r)| (to, HandoffMessage::Release(r)))
            .collect();
        tokio::spawn(send_releases(self.silo.clone(), messages));
    }

    /// Takes the slots of held ranges out of the due index.
    fn hold_slots(&mut self) {
        let s = &mut self.state;
        let held: Vec<Key> = s
            .queue
            .iter()
            .filter(|slot| {
                !slot.held
                    && s.holds
                        .start_of(slot.hash, slot.key.actor(), slot.key.name(), &slot.etag)
                        == Start::Held
            })
            .map(|slot| slot.key.clone())
            .collect();
        for k in held {
            s.queue.hold(&k);
        }
    }

    /// Schedules the held slots the holds no longer hold.
    fn free_held(&mut self) {
        let now = self.clock.now();
        let s = &mut self.state;
        let freed: Vec<(Key, Option<Planned>, bool)> = s
            .queue
            .iter()
            .filter(|slot| slot.held)
            .filter_map(|slot| {
                let start = s
                    .holds
                    .start_of(slot.hash, slot.key.actor(), slot.key.name(), &slot.etag);
                (start != Start::Held).then(|| {
                    let next = planned(slot.timing(), now, Learned::Load, start);
                    (slot.key.clone(), next, matches!(start, Start::From(_)))
                })
            })
            .collect();
        for (key, next, catch_up) in freed {
            match next {
                Some(next) => {
                    s.queue.requeue(&key, next);
                    if let (true, Some(slot)) = (catch_up && next.scheduled < now, s.queue.get_mut(&key)) {
                        slot.catch_up_to = now;
                    }
                }
                None => {
                    s.queue.remove(&key);
                }
            }
        }
    }

    /// Frees the holds whose previous owner is gone or silent too long, and keeps
    /// a timer for the next expiry while some hold waits.
    fn expire_holds(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        let view = self.state.view.clone();
        let gone = |silo: &SiloAddress| {
            view.as_ref()
                .and_then(|v| v.status_of(silo))
                .is_none_or(|st| st == SiloStatus::Dead)
        };
        // When each silo waited for was first seen gone: the grace counts from then.
        let waiting = self.state.holds.waiting_for();
        let gone_at = &mut self.state.gone_at;
        gone_at.retain(|s, _| waiting.contains(s));
        let mut newly_gone = false;
        for s in waiting.iter().filter(|s| gone(s)) {
            gone_at.entry(*s).or_insert_with(|| {
                newly_gone = true;
                now
            });
        }
        let gone_at = gone_at.clone();
        // Ask the previous owners still in the view that were silent for a while,
        // and, once one waited for is gone, every Active silo (one of them may have
        // its release).
        if !waiting.is_empty()
            && (newly_gone || now.saturating_duration_since(self.state.asked) >= REQUEST_AFTER)
        {
            self.state.asked = now;
            let mut to: Vec<SiloAddress> = waiting.iter().copied().filter(|s| !gone(s)).collect();
            if !gone_at.is_empty() {
                to.extend(self.state.ring.silos());
            }
            to.sort_unstable();
            to.dedup();
            let request = ReleaseRequest {
                service: self.table.service_id().to_owned(),
                from: self.me,
                waiting: self.state.holds.waiting_pieces(),
                gone: gone_at.keys().copied().collect(),
            };
            let ask: Vec<_> = to
                .into_iter()
                .filter(|s| *s != self.me)
                .map(|silo| (silo, HandoffMessage::Request(request.clone())))
                .collect();
            tokio::spawn(send_releases(self.silo.clone(), ask));
        } else if waiting.is_empty() {
            self.state.asked = now;
        }
        // A gone silo's last release settles what it did not own at the end.
        let mut settled = false;
        for silo in gone_at.keys() {
            let last = self
                .state
                .received
                .iter()
                .rev()
                .find(|r| r.from == *silo && r.last)
                .cloned();
            if let Some(last) = last {
                let others: Vec<Release> = self.state.received.iter().cloned().collect();
                settled |= self.state.holds.settle_with_last(&last, &others, self.me);
            }
        }
        let (changed, silent) = self.state.holds.expire(now, |s| gone_at.get(s).copied());
        let changed = changed || settled;
        for silo in silent {
            tracing::warn!(silo = %self.me, previous_owner = %silo, timeout = ?crate::handoff::HANDOFF_TIMEOUT,
                "no release of reminder ranges from their previous owner; taking them over");
        }
        if changed {
            self.free_held();
            self.publish_gauges();
            self.arm_timer(ctx);
        }
        if let Some(h) = self.state.hold_timer.take() {
            ctx.cancel_future(h);
        }
        if self.state.holds.waiting() {
            // Re-checked every HOLD_CHECK while waiting: a previous owner's
            // status changes with the view, and requests go out every
            // REQUEST_AFTER.
            self.state.hold_timer = Some(ctx.run_later(HOLD_CHECK, |act, ctx| {
                act.state.hold_timer = None;
                act.expire_holds(ctx);
            }));
        }
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
                let wait = backoff(self.state.load_failures, &mut self.rng)
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
                    self.schedule_row(row, now, Learned::Load, first);
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
        self.state.holds.load_finished(run.epoch);
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
        if self.state.leaving {
            return;
        }
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
                    let window = self.options.loading_window;
                    match after_attempt(slot.timing(), scheduled, now, true, slot.catch_up_to, window, now) {
                        AfterAttempt::Remove => {
                            self.state.queue.remove(&key);
                            self.state.persist.remove(&key);
                            self.state.removals.insert(key, etag());
                        }
                        AfterAttempt::Next(next) => self.state.queue.requeue(&key, next),
                        _ => {
                            self.state.queue.remove(&key);
                        }
                    }
                    self.pump_writes(ctx);
                }
            }
            Err(why) => {
                Counters::bump(&self.counters.delivery_failures);
                if current {
                    let slot = self.state.queue.get_mut(&key).expect("current");
                    slot.attempts = slot.attempts.saturating_add(1);
                    let retry = now.saturating_add(backoff(u32::from(slot.attempts), &mut self.rng));
                    let window = self.options.loading_window;
                    match after_attempt(
                        slot.timing(),
                        scheduled,
                        now,
                        false,
                        slot.catch_up_to,
                        window,
                        retry,
                    ) {
                        AfterAttempt::GiveUp(next) => {
                            Counters::bump(&self.counters.ticks_given_up);
                            tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempts = slot.attempts,
                                "reminder tick not delivered before the next one was due; moving on");
                            slot.attempts = 0;
                            self.state.queue.requeue(&key, next);
                        }
                        plan => {
                            tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempt = slot.attempts,
                                "reminder tick delivery failed; retrying");
                            if let AfterAttempt::Retry(retry) = plan {
                                self.state.queue.requeue(&key, retry);
                            }
                        }
                    }
                }
            }
        }
        self.publish_gauges();
        if self.state.leaving {
            if self.state.deliveries == 0 {
                self.finish_leave(ctx);
            }
            return;
        }
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
            let wait = backoff(self.state.write_failures, &mut self.rng);
            tracing::warn!(error = %err, retry_in = ?wait, "recording a reminder tick failed; retrying");
            self.state.write_retry = Some(ctx.run_later(wait, |act, ctx| {
                act.state.write_retry = None;
                act.pump_writes(ctx);
            }));
        }
    }
}

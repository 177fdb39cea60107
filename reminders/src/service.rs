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

mod builder;
mod outside;
mod placement;

pub use builder::RemindersBuilder;
use outside::{send_to_holder, BULK_CONCURRENCY, BULK_PAGE};
pub use outside::{set_paused, tell_holder, tell_shard_holders, trigger_row, Told, ToldShards};

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
    /// The handle placement and fenced state use (`Reminders::ownership`).
    ownership: rollcall_core::ownership::ShardOwnership,

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

//! The types applications see: actor ids, ticks, the target resolver, handles,
//! errors and counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "runtime")]
use actix::Recipient;
use rollcall_core::ownership::ActorId;
use rollcall_core::{Error, Etag, MissedTickPolicy, ReminderEntry, RetryPolicy, Timestamp};

/// Longest reminder name accepted, in bytes; a provider may store less, as for
/// [`MAX_ACTOR_ID`](rollcall_core::ownership::MAX_ACTOR_ID).
pub const MAX_NAME: usize = 1024;

/// One page of reminders ([`Reminders::list_kind`](crate::Reminders::list_kind)):
/// at most the size asked for, in ring order, and the token of the next page.
#[derive(Clone, Debug)]
pub struct ReminderList {
    /// The reminders of this page.
    pub reminders: Vec<ReminderHandle>,
    /// The next page's token (pass it back as `after`); `None`: this was the
    /// last page.
    pub next: Option<rollcall_core::PageToken>,
}

/// One tick of a reminder, sent to the actor's recipient (an actix message
/// with the `runtime` feature). The handler's
/// completion is the delivery: the service waits for it (up to the options'
/// `delivery_timeout`) before it schedules the next tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReminderTick {
    /// The actor.
    pub actor: ActorId,
    /// The reminder's name.
    pub name: String,
    /// The reminder's first tick time (its `start_at`, UTC ms).
    pub first_tick: Timestamp,
    /// The period; `None` for a one-shot or calendar (cron) reminder.
    pub period: Option<Duration>,
    /// The occurrence this tick stands for: `first_tick + k x period`, or an
    /// occurrence of the reminder's calendar.
    pub scheduled: Timestamp,
    /// When the service sent it (UTC ms); `now - scheduled` is the lateness.
    pub now: Timestamp,
    /// The etag of the registration that scheduled this tick.
    pub etag: Etag,
    /// The bytes the registration carries
    /// ([`ReminderSpec::with_payload`]), shared by every tick.
    pub payload: Option<Arc<[u8]>>,
    /// The lease this tick was delivered under: the service, the actor's shard
    /// and the epoch the delivering silo holds it at. A handler fences its own
    /// writes with it (`StateStorage::fenced(tick.fence.clone())`): the store
    /// refuses them once another silo took the shard over
    /// ([`rollcall_core::Error::Fenced`]).
    pub fence: rollcall_core::Fence,
}

/// The holder of an actor's shard, as its lease row names it
/// (`Reminders::owner`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The silo holding the shard.
    pub silo: rollcall_core::SiloAddress,
    /// The lease's epoch (its fence token).
    pub epoch: u64,
    /// Where the silo serves applications: its IP and the proxy port of its
    /// membership row (Orleans' gateway port), `None` when it set none.
    pub endpoint: Option<std::net::SocketAddr>,
}

#[cfg(feature = "runtime")]
impl actix::Message for ReminderTick {
    type Result = ();
}

impl ReminderTick {
    /// A stable id of the occurrence this tick stands for: the same for every
    /// delivery attempt of it (a retry, a redelivery after a crash), different
    /// for any other occurrence or registration. The key for a handler that
    /// must be idempotent (store it with the effect, skip an id already seen).
    ///
    /// Shape: `<actor length>:<actor><name>@<etag>@<scheduled ms>`, which no
    /// two (actor, name) pairs share.
    pub fn occurrence_id(&self) -> String {
        let actor = self.actor.to_string();
        format!(
            "{}:{actor}{}@{}@{}",
            actor.len(),
            self.name,
            self.etag.as_str(),
            self.scheduled.as_millis()
        )
    }
}

/// Finds the actix recipient of an actor's ticks. `None` means the actor cannot
/// take ticks now: the delivery counts as failed and is retried.
///
/// Closures `Fn(&ActorId) -> Option<Recipient<ReminderTick>>` implement it.
#[cfg(feature = "runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "runtime")))]
pub trait ReminderTarget: Send + Sync + 'static {
    /// The recipient for `actor`'s ticks.
    fn resolve(&self, actor: &ActorId) -> Option<Recipient<ReminderTick>>;
}

#[cfg(feature = "runtime")]
impl<F> ReminderTarget for F
where
    F: Fn(&ActorId) -> Option<Recipient<ReminderTick>> + Send + Sync + 'static,
{
    fn resolve(&self, actor: &ActorId) -> Option<Recipient<ReminderTick>> {
        self(actor)
    }
}

/// The longest repeat count accepted ([`ReminderSpec::repeat`]): 100,000.
pub const MAX_REPEAT: u32 = 100_000;

/// What to register: when it ticks (first tick after `due`, then every `period`, or
/// on a cron calendar in a time zone), what to do with ticks missed while no silo
/// delivered them, when it ends, and the bytes its ticks carry.
///
/// Build one with [`every`](Self::every), [`once`](Self::once) or
/// [`cron`](Self::cron), then the `with_*` methods:
///
/// ```
/// use std::time::Duration;
/// use rollcall_reminders::ReminderSpec;
/// // 09:00 on weekdays in Stockholm, ten times, each tick carrying a report id.
/// let spec = ReminderSpec::cron("0 9 * * MON-FRI")
///     .in_zone("Europe/Stockholm")
///     .repeat(10)
///     .with_payload(b"report-7".to_vec());
/// assert_eq!(spec.zone.as_deref(), Some("Europe/Stockholm"));
/// // `@every` is a period, first tick one period from now.
/// let every = ReminderSpec::cron("@every 1h30m");
/// assert_eq!(every.period, Some(Duration::from_secs(5400)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReminderSpec {
    /// Delay from now to the first tick (for a cron schedule: to the earliest
    /// time its first occurrence may have).
    pub due: Duration,
    /// Period; `None` for a one-shot reminder (removed after its tick is
    /// delivered). Ignored when `cron` is set.
    pub period: Option<Duration>,
    /// Missed-tick policy of this reminder.
    pub missed_tick_policy: MissedTickPolicy,
    /// A cron expression (see [`Calendar`](crate::Calendar) for the syntax); its
    /// first occurrence at or after `due` is the first tick.
    pub cron: Option<String>,
    /// The IANA time zone `cron` is evaluated in (`"America/New_York"`); `None`
    /// is UTC.
    pub zone: Option<String>,
    /// Deliver at most this many ticks (1..=[`MAX_REPEAT`]), then remove the row.
    pub repeat: Option<u32>,
    /// Deliver no occurrence after this time (UTC), then remove the row.
    pub until: Option<Timestamp>,
    /// Bytes every tick carries ([`ReminderTick::payload`]), at most
    /// [`MAX_REMINDER_PAYLOAD`](rollcall_core::MAX_REMINDER_PAYLOAD).
    pub payload: Option<Vec<u8>>,
    /// How a failed tick is retried, then dropped; `None`: retried with backoff
    /// until the next occurrence is due.
    pub retry: Option<RetryPolicy>,
}

impl ReminderSpec {
    /// Ticks `due` from now, then every `period`; missed ticks skipped.
    pub fn every(due: Duration, period: Duration) -> ReminderSpec {
        ReminderSpec {
            due,
            period: Some(period),
            missed_tick_policy: MissedTickPolicy::Skip,
            cron: None,
            zone: None,
            repeat: None,
            until: None,
            payload: None,
            retry: None,
        }
    }

    /// Ticks once, `due` from now; its row is removed once the tick is delivered.
    pub fn once(due: Duration) -> ReminderSpec {
        ReminderSpec {
            period: None,
            ..ReminderSpec::every(due, Duration::ZERO)
        }
    }

    /// Ticks at the occurrences of the cron expression `expr` (in UTC unless
    /// [`in_zone`](Self::in_zone)); `@every <duration>` (`@every 1h30m`, humantime
    /// syntax) is a period instead, first tick one period from now. The
    /// expression is checked by [`Reminders::register`](crate::Reminders::register).
    pub fn cron(expr: &str) -> ReminderSpec {
        if let Some(every) = expr.trim().strip_prefix("@every ") {
            if let Ok(period) = humantime::parse_duration(every.trim()) {
                return ReminderSpec::every(period, period);
            }
        }
        ReminderSpec {
            cron: Some(expr.to_owned()),
            ..ReminderSpec::once(Duration::ZERO)
        }
    }

    /// Evaluates the cron expression in the IANA zone `zone`.
    #[must_use]
    pub fn in_zone(mut self, zone: &str) -> ReminderSpec {
        self.zone = Some(zone.to_owned());
        self
    }

    /// The missed-tick policy.
    #[must_use]
    pub fn with_policy(mut self, policy: MissedTickPolicy) -> ReminderSpec {
        self.missed_tick_policy = policy;
        self
    }

    /// At most `n` ticks.
    #[must_use]
    pub fn repeat(mut self, n: u32) -> ReminderSpec {
        self.repeat = Some(n);
        self
    }

    /// No occurrence after `t`.
    #[must_use]
    pub fn until(mut self, t: Timestamp) -> ReminderSpec {
        self.until = Some(t);
        self
    }

    /// Failed ticks are retried as `policy` says, then dropped
    /// ([`RetryPolicy::DROP`]: at once).
    #[must_use]
    pub fn with_retry(mut self, policy: RetryPolicy) -> ReminderSpec {
        self.retry = Some(policy);
        self
    }

    /// Every tick carries `payload`.
    #[must_use]
    pub fn with_payload(mut self, payload: impl Into<Vec<u8>>) -> ReminderSpec {
        self.payload = Some(payload.into());
        self
    }
}

/// A registered reminder as the table holds it. The etag identifies this
/// registration: [`Reminders::unregister`](crate::Reminders::unregister) refuses a
/// handle from before a re-registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReminderHandle {
    /// The actor.
    pub actor: ActorId,
    /// The name.
    pub name: String,
    /// First tick time (UTC ms).
    pub start_at: Timestamp,
    /// Period; `None` for a one-shot reminder.
    pub period: Option<Duration>,
    /// Missed-tick policy.
    pub missed_tick_policy: MissedTickPolicy,
    /// The cron expression, for a calendar reminder.
    pub cron: Option<String>,
    /// The IANA zone of `cron`; `None` is UTC.
    pub zone: Option<String>,
    /// No occurrence after this time; the row is removed after the last.
    pub end_at: Option<Timestamp>,
    /// The bytes its ticks carry.
    pub payload: Option<Vec<u8>>,
    /// Its retry policy; `None`: the service's default.
    pub retry: Option<RetryPolicy>,
    /// When a tick was last delivered, if recorded (`FireOnce` reminders only).
    pub last_fired: Option<Timestamp>,
    /// Since when it is paused ([`Reminders::pause`](crate::Reminders::pause));
    /// `None`: it ticks.
    pub paused: Option<Timestamp>,
    /// For the one-shot a [`Reminders::trigger`](crate::Reminders::trigger)
    /// wrote: the name of the reminder it triggered (its tick carries that
    /// name). `None` for every other reminder.
    pub trigger_of: Option<String>,
    /// The registration's etag.
    pub etag: Etag,
}

impl ReminderHandle {
    /// The handle of a stored row.
    ///
    /// # Errors
    /// [`ReminderError::InvalidActor`] if the row's actor id is not `kind/key`.
    pub fn from_entry(e: ReminderEntry) -> Result<ReminderHandle, ReminderError> {
        Ok(ReminderHandle {
            actor: ActorId::parse(&e.actor_id)?,
            name: e.name,
            start_at: e.start_at,
            period: e.period,
            missed_tick_policy: e.missed_tick_policy,
            cron: e.cron,
            zone: e.zone,
            end_at: e.end_at,
            payload: e.payload,
            retry: e.retry,
            last_fired: e.last_fired,
            paused: e.paused,
            trigger_of: e.trigger_of,
            etag: e.etag,
        })
    }
}

/// Why a reminder call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReminderError {
    /// The reminder table failed (a backend error, a corrupt row, an invalid id).
    #[error(transparent)]
    Table(#[from] Error),
    /// The table did not answer within the options' `table_operation_timeout`.
    #[error("the reminder table did not answer within {0:?}")]
    Timeout(Duration),
    /// The handle is from an earlier registration: the reminder was re-registered
    /// since (its etag changed), so this handle may not remove it.
    #[error("stale handle: reminder `{name}` of {actor} was re-registered since")]
    StaleHandle {
        /// The actor.
        actor: ActorId,
        /// The name.
        name: String,
    },
    /// A period below the options' `minimum_period` without
    /// `allow_period_below_minimum`.
    #[error(
        "period {period:?} is below minimum_period {minimum:?} (set allow_period_below_minimum to accept it)"
    )]
    PeriodTooShort {
        /// The period asked for.
        period: Duration,
        /// The minimum.
        minimum: Duration,
    },
    /// An actor id that is not `kind/key` or is too long: the id, and why
    /// ([`InvalidActorId`](rollcall_core::ownership::InvalidActorId)).
    #[error("invalid actor id `{0}`: {1}")]
    InvalidActor(String, String),
    /// An empty or too long reminder name.
    #[error("invalid reminder name: {0}")]
    InvalidName(String),
    /// A schedule that cannot be used: a cron expression or time zone that
    /// cannot be read, a calendar with no occurrence, a repeat count outside
    /// `1..=MAX_REPEAT`, an end before the first tick.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// A payload over
    /// [`MAX_REMINDER_PAYLOAD`](rollcall_core::MAX_REMINDER_PAYLOAD)
    /// bytes.
    #[error("reminder payload of {len} bytes is over the {max}-byte limit")]
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No reminder of that name: it was never registered, or it was removed.
    #[error("no reminder `{name}` of {actor}")]
    NotFound {
        /// The actor.
        actor: ActorId,
        /// The name.
        name: String,
    },
    /// The reminder service (or its silo) stopped.
    #[error("the reminder service stopped")]
    Stopped,
    /// A reminder service of this id already runs on this silo: two would
    /// both deliver the shards they hold and both answer `fence()`. Start
    /// one per service id per silo and share its
    /// [`Reminders`](crate::Reminders) handle (a cheap clone). A service runs
    /// until its silo stops, whether or not a handle is kept; a new silo (a
    /// new generation, after a restart) starts its own.
    #[error("reminder service `{service}` already runs on silo {silo}")]
    AlreadyRunning {
        /// The service id.
        service: String,
        /// The silo (`ip:port@generation`).
        silo: String,
    },
}

/// How late a delivered tick may complete after its occurrence before it counts in
/// [`ReminderStats::ticks_late`] (1 s).
pub const LATE_TICK: Duration = Duration::from_secs(1);

/// `metrics` counter (labels `service`, `silo`): ticks delivered to actors.
#[cfg(feature = "runtime")]
pub const TICKS_METRIC: &str = "rollcall_reminder_ticks_total";
/// `metrics` histogram (labels `service`, `silo`): seconds from a tick's occurrence
/// to the end of its delivery.
#[cfg(feature = "runtime")]
pub const TICK_LATENESS_METRIC: &str = "rollcall_reminder_tick_lateness_seconds";
/// `metrics` counter (labels `service`, `silo`): ticks dropped once their
/// reminder's [`RetryPolicy`] was spent.
pub const TICKS_DROPPED_METRIC: &str = "rollcall_reminder_ticks_dropped_total";
/// `metrics` counter (labels `service`, `silo`): ticks parked once their
/// reminder's [`RetryPolicy`] was spent (see [`RetryPolicy::park`]).
#[cfg(feature = "runtime")]
pub const TICKS_PARKED_METRIC: &str = "rollcall_reminder_ticks_parked_total";
/// `metrics` counter (labels `service`, `silo`): occurrences a takeover's
/// missed-tick policy skipped (see [`ReminderStats::takeover_skipped`]).
#[cfg(feature = "runtime")]
pub const TAKEOVER_SKIPPED_METRIC: &str = "rollcall_reminder_takeover_skipped_total";
/// `metrics` gauge (labels `service`, `silo`): reminders in the ranges this silo
/// owns, as of its last load.
#[cfg(feature = "runtime")]
pub const OWNED_METRIC: &str = "rollcall_reminders_owned";

/// Counters of one silo's reminder service (monotonic unless noted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReminderStats {
    /// Reminders in the shards this silo holds, as last loaded (a gauge).
    pub owned: u64,
    /// Reminders held in memory: every reminder of the held shards (a gauge).
    pub scheduled: u64,
    /// Ticks delivered (the handler completed).
    pub ticks_delivered: u64,
    /// Ticks delivered more than [`LATE_TICK`] after their occurrence.
    pub ticks_late: u64,
    /// Delivery attempts that failed (no recipient, mailbox closed, timeout); each
    /// is retried with backoff within the period.
    pub delivery_failures: u64,
    /// Occurrences given up after retrying until the next one was due (each logged
    /// as an error).
    pub ticks_given_up: u64,
    /// Occurrences dropped once their reminder's [`RetryPolicy`] was spent.
    pub ticks_dropped: u64,
    /// Occurrences parked once their reminder's [`RetryPolicy`] was spent
    /// (written to the parked table; see [`RetryPolicy::park`]).
    pub ticks_parked: u64,
    /// Load rounds: the first load of the shards assigned at start, then one per
    /// reconciliation of every held shard (`refresh_reminder_list_period`, or
    /// after notices were dropped). The reads of one shard (after its acquire,
    /// before its release, or for a notice the silo could not read at once)
    /// are not counted.
    pub loads: u64,
    /// Rounds of shard reads that failed together (retried with backoff).
    pub load_failures: u64,
    /// Registration notices received.
    pub notices: u64,
    /// Writes of `last_fired` or one-shot removals that failed and were retried.
    pub write_failures: u64,
    /// Run-history records dropped: the append failed, or the queue of
    /// waiting records was full.
    pub runs_dropped: u64,
    /// Occurrences a takeover's missed-tick policy skipped: those of a
    /// `Skip` reminder (all but `FireOnce`'s catch-up) due after the cluster
    /// saw the Dead holder Dead and before the takeover time, at most
    /// [`MAX_SKIPPED_RECORDS`](crate::machine::MAX_SKIPPED_RECORDS) per reminder
    /// and takeover; each is also in the reminder's run history as
    /// `skipped`. Every occurrence at or after the takeover time is
    /// delivered: this is what a crash cost.
    pub takeover_skipped: u64,
}

/// The largest lateness the window tells apart (a day, ms); later ticks count
/// as this late.
const LATENESS_MAX_MS: u64 = 86_400_000;

/// The lateness of the ticks a silo delivered in a window of time
/// ([`Reminders::take_lateness`](crate::Reminders::take_lateness)): delivery
/// time less the occurrence's scheduled time, ms (1 ms resolution below
/// 100 ms, 2 significant figures above; at least 1, at most a day).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Lateness {
    /// Ticks delivered in the window.
    pub ticks: u64,
    /// Median lateness, ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// The latest, ms.
    pub max_ms: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub owned: AtomicU64,
    pub scheduled: AtomicU64,
    pub ticks_delivered: AtomicU64,
    pub ticks_late: AtomicU64,
    pub delivery_failures: AtomicU64,
    pub ticks_given_up: AtomicU64,
    pub ticks_dropped: AtomicU64,
    pub ticks_parked: AtomicU64,
    pub loads: AtomicU64,
    pub load_failures: AtomicU64,
    pub notices: AtomicU64,
    pub write_failures: AtomicU64,
    pub runs_dropped: AtomicU64,
    pub takeover_skipped: AtomicU64,
    /// Lateness of the ticks delivered since the last
    /// [`take_lateness`](Counters::take_lateness), ms.
    pub lateness: std::sync::Mutex<Option<hdrhistogram::Histogram<u64>>>,
}

impl From<rollcall_core::ownership::InvalidActorId> for ReminderError {
    fn from(e: rollcall_core::ownership::InvalidActorId) -> Self {
        ReminderError::InvalidActor(e.0, e.1)
    }
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one tick's lateness.
    pub(crate) fn record_lateness(&self, lateness: std::time::Duration) {
        let ms = u64::try_from(lateness.as_millis()).unwrap_or(u64::MAX);
        let mut window = self
            .lateness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // 1 ms to 1 day at 2 significant figures: about 10 KiB.
        if window.is_none() {
            *window = hdrhistogram::Histogram::new_with_bounds(1, LATENESS_MAX_MS, 2).ok();
        }
        if let Some(h) = window.as_mut() {
            h.saturating_record(ms.clamp(1, LATENESS_MAX_MS));
        }
    }

    /// The lateness of the ticks delivered since the last call, and a new window
    /// (read by the runtime's `Reminders::take_lateness`).
    #[cfg_attr(not(feature = "runtime"), allow(dead_code))]
    pub(crate) fn take_lateness(&self) -> Option<Lateness> {
        let mut window = self
            .lateness
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = window.as_mut()?;
        if h.is_empty() {
            return None;
        }
        let out = Lateness {
            ticks: h.len(),
            p50_ms: h.value_at_quantile(0.5),
            p99_ms: h.value_at_quantile(0.99),
            max_ms: h.max(),
        };
        h.reset();
        Some(out)
    }

    pub(crate) fn read(self: &Arc<Self>) -> ReminderStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReminderStats {
            owned: g(&self.owned),
            scheduled: g(&self.scheduled),
            ticks_delivered: g(&self.ticks_delivered),
            ticks_late: g(&self.ticks_late),
            delivery_failures: g(&self.delivery_failures),
            ticks_given_up: g(&self.ticks_given_up),
            ticks_dropped: g(&self.ticks_dropped),
            ticks_parked: g(&self.ticks_parked),
            loads: g(&self.loads),
            load_failures: g(&self.load_failures),
            notices: g(&self.notices),
            write_failures: g(&self.write_failures),
            runs_dropped: g(&self.runs_dropped),
            takeover_skipped: g(&self.takeover_skipped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lateness_window_gives_percentiles_and_starts_again() {
        let c = Counters::default();
        assert_eq!(c.take_lateness(), None);
        for ms in 1..=100 {
            c.record_lateness(std::time::Duration::from_millis(ms));
        }
        let l = c.take_lateness().expect("a window");
        assert_eq!((l.ticks, l.p50_ms, l.p99_ms, l.max_ms), (100, 50, 99, 100));
        assert_eq!(c.take_lateness(), None, "taken: a new window");
        // Past a day counts as a day; zero as 1 ms.
        c.record_lateness(std::time::Duration::from_secs(10 * 86_400));
        c.record_lateness(std::time::Duration::ZERO);
        let l = c.take_lateness().expect("a window");
        assert_eq!(l.ticks, 2);
        assert!(l.max_ms >= 86_000_000 && l.max_ms <= 87_000_000, "{l:?}");
    }
}

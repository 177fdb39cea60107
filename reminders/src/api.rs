//! The types applications see: actor ids, ticks, the target resolver, handles,
//! errors and counters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Message, Recipient};
use rollcall_membership_core::{Error, Etag, MissedTickPolicy, ReminderEntry, Timestamp};

/// Longest actor id (`kind/key`) accepted, in bytes.
pub const MAX_ACTOR_ID: usize = 1024;
/// Longest reminder name accepted, in bytes.
pub const MAX_NAME: usize = 1024;

/// The actor a reminder belongs to: an actor kind (its type, e.g. `"cart"`) and a
/// key within the kind (e.g. `"42"`). Stored in the reminder table as `kind/key`,
/// which is also the text the ring hash ([`actor_hash`](rollcall_membership_core::actor_hash))
/// is computed over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId {
    kind: String,
    key: String,
}

impl ActorId {
    /// An actor id.
    ///
    /// # Errors
    /// [`ReminderError::InvalidActor`] for an empty kind or key, a kind containing
    /// `/` or control characters, or an id over [`MAX_ACTOR_ID`] bytes.
    pub fn new(kind: impl Into<String>, key: impl Into<String>) -> Result<ActorId, ReminderError> {
        let (kind, key) = (kind.into(), key.into());
        let bad = |why: &str| {
            Err(ReminderError::InvalidActor(
                format!("{kind}/{key}"),
                why.to_owned(),
            ))
        };
        if kind.is_empty() || key.is_empty() {
            return bad("kind and key must not be empty");
        }
        if kind.contains('/') || kind.chars().any(char::is_control) {
            return bad("the kind must not contain `/` or control characters");
        }
        if kind.len() + 1 + key.len() > MAX_ACTOR_ID {
            return bad("longer than 1024 bytes");
        }
        Ok(ActorId { kind, key })
    }

    /// Parses the stored form `kind/key` (split at the first `/`).
    ///
    /// # Errors
    /// [`ReminderError::InvalidActor`] if there is no `/` or a part is invalid.
    pub fn parse(s: &str) -> Result<ActorId, ReminderError> {
        match s.split_once('/') {
            Some((kind, key)) => ActorId::new(kind, key),
            None => Err(ReminderError::InvalidActor(
                s.to_owned(),
                "expected `kind/key`".into(),
            )),
        }
    }

    /// The actor kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The key within the kind.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.key)
    }
}

/// One tick of a reminder, sent to the actor's [`Recipient`]. The handler's
/// completion is the delivery: the service waits for it (up to the options'
/// `delivery_timeout`) before it schedules the next tick.
#[derive(Message, Clone, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct ReminderTick {
    /// The actor.
    pub actor: ActorId,
    /// The reminder's name.
    pub name: String,
    /// The reminder's first tick time (its `start_at`, UTC ms).
    pub first_tick: Timestamp,
    /// The period; `None` for a one-shot reminder.
    pub period: Option<Duration>,
    /// The occurrence this tick stands for: `first_tick + k x period`.
    pub scheduled: Timestamp,
    /// When the service sent it (UTC ms); `now - scheduled` is the lateness.
    pub now: Timestamp,
}

/// Finds the actix recipient of an actor's ticks. `None` means the actor cannot
/// take ticks now: the delivery counts as failed and is retried.
///
/// Closures `Fn(&ActorId) -> Option<Recipient<ReminderTick>>` implement it.
pub trait ReminderTarget: Send + Sync + 'static {
    /// The recipient for `actor`'s ticks.
    fn resolve(&self, actor: &ActorId) -> Option<Recipient<ReminderTick>>;
}

impl<F> ReminderTarget for F
where
    F: Fn(&ActorId) -> Option<Recipient<ReminderTick>> + Send + Sync + 'static,
{
    fn resolve(&self, actor: &ActorId) -> Option<Recipient<ReminderTick>> {
        self(actor)
    }
}

/// What to register: first tick after `due`, then every `period` (none: one-shot),
/// and what to do with ticks missed while no silo delivered them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReminderSpec {
    /// Delay from now to the first tick.
    pub due: Duration,
    /// Period; `None` for a one-shot reminder (removed after its tick is delivered).
    pub period: Option<Duration>,
    /// Missed-tick policy of this reminder.
    pub missed_tick_policy: MissedTickPolicy,
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
    /// When a tick was last delivered, if recorded (`FireOnce` reminders only).
    pub last_fired: Option<Timestamp>,
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
            last_fired: e.last_fired,
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
    /// An actor id that is not `kind/key` or is too long.
    #[error("invalid actor id `{0}`: {1}")]
    InvalidActor(String, String),
    /// An empty or too long reminder name.
    #[error("invalid reminder name: {0}")]
    InvalidName(String),
    /// The reminder service (or its silo) stopped.
    #[error("the reminder service stopped")]
    Stopped,
}

/// How late a delivered tick may complete after its occurrence before it counts in
/// [`ReminderStats::ticks_late`] (1 s).
pub const LATE_TICK: Duration = Duration::from_secs(1);

/// `metrics` counter (labels `service`, `silo`): ticks delivered to actors.
pub const TICKS_METRIC: &str = "rollcall_reminder_ticks_total";
/// `metrics` histogram (labels `service`, `silo`): seconds from a tick's occurrence
/// to the end of its delivery.
pub const TICK_LATENESS_METRIC: &str = "rollcall_reminder_tick_lateness_seconds";
/// `metrics` gauge (labels `service`, `silo`): reminders in the ranges this silo
/// owns, as of its last load.
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
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub owned: AtomicU64,
    pub scheduled: AtomicU64,
    pub ticks_delivered: AtomicU64,
    pub ticks_late: AtomicU64,
    pub delivery_failures: AtomicU64,
    pub ticks_given_up: AtomicU64,
    pub loads: AtomicU64,
    pub load_failures: AtomicU64,
    pub notices: AtomicU64,
    pub write_failures: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
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
            loads: g(&self.loads),
            load_failures: g(&self.load_failures),
            notices: g(&self.notices),
            write_failures: g(&self.write_failures),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_ids_round_trip_and_bad_ones_are_typed_errors() {
        let a = ActorId::new("cart", "user/42").unwrap();
        assert_eq!(a.to_string(), "cart/user/42");
        assert_eq!(ActorId::parse("cart/user/42").unwrap(), a);
        for bad in ["", "cart", "/x", "cart/"] {
            assert!(
                matches!(ActorId::parse(bad), Err(ReminderError::InvalidActor(..))),
                "{bad:?}"
            );
        }
        assert!(ActorId::new("a\nb", "k").is_err());
        assert!(ActorId::new("k", "x".repeat(MAX_ACTOR_ID)).is_err());
    }
}

//! When a reminder ticks next: pure functions of its row, the time, and how the
//! service learned of it.
//!
//! Rules (Orleans' reminder semantics plus what its users asked for):
//! - A periodic reminder ticks at `start_at + k x period`, `k >= 0`.
//! - Learned **before** `start_at`: the first tick is at `start_at`.
//! - Learned **after** `start_at` from a registration notice, within the first
//!   period and never fired: the late first tick is delivered at once.
//! - Otherwise learned after `start_at` (a load at start-up or on a ring change):
//!   `Skip` waits for the first occurrence after now; `FireOnce` delivers one
//!   catch-up tick at once if the last occurrence at or before now is later than the
//!   persisted `last_fired` (or nothing was persisted), then continues on schedule.
//! - A one-shot reminder (no period) whose row still exists has not been delivered:
//!   it ticks at `start_at`, or at once if that has passed.
//! - After a delivery that finished at `done`, the next tick is the first
//!   occurrence after `max(done, scheduled)`: a handler that runs long skips the
//!   occurrences it overran instead of firing them back to back.

use std::time::Duration;

use rollcall_membership_core::{duration_millis, MissedTickPolicy, ReminderEntry, Timestamp};

/// How the service came to (re)schedule a reminder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// From a registration notice: the row was just written.
    Notice,
    /// From a range load (start-up, ring change, periodic refresh).
    Load,
}

/// What the scheduling rules read of a reminder's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// First tick time.
    pub start_at: Timestamp,
    /// Period (ms precision); `None` or zero for a one-shot reminder.
    pub period: Option<Duration>,
    /// The last tick delivered, as persisted for `FireOnce`.
    pub last_fired: Option<Timestamp>,
    /// What to do with ticks missed while no silo delivered them.
    pub missed_tick_policy: MissedTickPolicy,
}

impl From<&ReminderEntry> for Timing {
    fn from(entry: &ReminderEntry) -> Timing {
        Timing {
            start_at: entry.start_at,
            period: entry.period,
            last_fired: entry.last_fired,
            missed_tick_policy: entry.missed_tick_policy,
        }
    }
}

/// The next tick of a reminder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// The occurrence the tick stands for (`ReminderTick::scheduled`).
    pub scheduled: Timestamp,
    /// When to deliver it: `scheduled`, or now for a late or catch-up tick.
    pub due: Timestamp,
}

impl Planned {
    /// Whether the tick is already due at `now` (late or catch-up).
    pub fn is_overdue(&self, now: Timestamp) -> bool {
        self.due <= now
    }
}

/// The first occurrence strictly after `t`, or `start_at` if that is after `t`.
/// `None` for a one-shot reminder whose time has passed.
pub fn occurrence_after(start_at: Timestamp, period: Option<Duration>, t: Timestamp) -> Option<Timestamp> {
    if t < start_at {
        return Some(start_at);
    }
    let p = period.map(duration_millis).filter(|p| *p > 0)?;
    let k = (t.as_millis() - start_at.as_millis()) / p + 1;
    Some(Timestamp::from_millis(
        start_at.as_millis().saturating_add(k.saturating_mul(p)),
    ))
}

/// The last occurrence at or before `t`; `None` before `start_at`.
pub fn occurrence_at_or_before(
    start_at: Timestamp,
    period: Option<Duration>,
    t: Timestamp,
) -> Option<Timestamp> {
    if t < start_at {
        return None;
    }
    match period.map(duration_millis).filter(|p| *p > 0) {
        None => Some(start_at),
        Some(p) => {
            let k = (t.as_millis() - start_at.as_millis()) / p;
            Some(Timestamp::from_millis(start_at.as_millis() + k * p))
        }
    }
}

/// The next tick of `entry` (a `&ReminderEntry` or its [`Timing`]) when the
/// service learns of it at `now` (rules in the module docs).
pub fn plan(entry: impl Into<Timing>, now: Timestamp, learned: Learned) -> Option<Planned> {
    let entry = entry.into();
    if now <= entry.start_at {
        return Some(Planned {
            scheduled: entry.start_at,
            due: entry.start_at,
        });
    }
    let Some(period) = entry.period.filter(|p| !p.is_zero()) else {
        // One-shot: the row exists, so it was not delivered yet.
        return Some(Planned {
            scheduled: entry.start_at,
            due: now,
        });
    };
    let last = occurrence_at_or_before(entry.start_at, Some(period), now)?;
    let late_first = learned == Learned::Notice && entry.last_fired.is_none() && last == entry.start_at;
    let missed =
        entry.missed_tick_policy == MissedTickPolicy::FireOnce && entry.last_fired.is_none_or(|f| f < last);
    if late_first || missed {
        return Some(Planned {
            scheduled: last,
            due: now,
        });
    }
    let next = occurrence_after(entry.start_at, Some(period), now)?;
    Some(Planned {
        scheduled: next,
        due: next,
    })
}

/// The tick after one for `scheduled` whose delivery finished at `done`; `None`
/// for a one-shot reminder.
pub fn after_delivery(entry: impl Into<Timing>, scheduled: Timestamp, done: Timestamp) -> Option<Planned> {
    let entry = entry.into();
    entry.period.filter(|p| !p.is_zero())?;
    let next = occurrence_after(entry.start_at, entry.period, done.max(scheduled))?;
    Some(Planned {
        scheduled: next,
        due: next,
    })
}

/// What becomes of a reminder's slot after one delivery attempt (the agent carries
/// it out; see [`after_attempt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterAttempt {
    /// A one-shot reminder was delivered: remove its row.
    Remove,
    /// Delivered; the next tick.
    Next(Planned),
    /// Failed; try the same occurrence again at `due`.
    Retry(Planned),
    /// Failed, and the retry would come after the next occurrence: this occurrence
    /// is given up (logged and counted), the next one is planned.
    GiveUp(Planned),
}

/// The rule after a delivery attempt of the occurrence `scheduled`, finished at
/// `now`:
/// - delivered: the next occurrence after `now`, or after `scheduled` itself while
///   it is below `catch_up_to` (a handoff's catch-up delivers every occurrence owed
///   in turn, where a handler that overran skips them); a one-shot is removed;
/// - failed: retried at `retry_at` (the caller's jittered backoff), unless the
///   occurrence right after `scheduled` is due by then, which gives this one up (no
///   burst of stale ticks, and one failure costs at most the failed occurrence and
///   the one its attempts overran); the tick planned then is the first occurrence
///   after `now`, or in a catch-up the one right after `scheduled`, owed like the
///   rest.
pub fn after_attempt(
    entry: impl Into<Timing>,
    scheduled: Timestamp,
    now: Timestamp,
    delivered: bool,
    catch_up_to: Timestamp,
    retry_at: Timestamp,
) -> AfterAttempt {
    let timing = entry.into();
    let done = if scheduled < catch_up_to { scheduled } else { now };
    if !delivered {
        // (Found by a seed: a handler failed on the first tick of a handoff's
        // catch-up, and the owed ticks after it were skipped with it.)
        // The retry must come before the occurrence right after the failed one
        // falls due; given up, the next tick is the first after `done` (the
        // attempts overran the ones between). (Found by a seed: a retry of an
        // occurrence was planned after the next one had passed, succeeded after
        // the one after that too, and two occurrences went with one failure.)
        return match after_delivery(timing, scheduled, scheduled) {
            Some(following) if following.due <= retry_at => {
                AfterAttempt::GiveUp(after_delivery(timing, scheduled, done).unwrap_or(following))
            }
            _ => AfterAttempt::Retry(Planned {
                scheduled,
                due: retry_at,
            }),
        };
    }
    match after_delivery(timing, scheduled, done) {
        None => AfterAttempt::Remove,
        Some(next) => AfterAttempt::Next(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn after_an_attempt() {
        let e = entry(0, Some(MIN), MissedTickPolicy::Skip);
        let none = t(0);
        // Delivered on time: the next occurrence.
        let next = after_attempt(&e, t(60), t(61), true, none, t(0));
        assert_eq!(
            next,
            AfterAttempt::Next(Planned {
                scheduled: t(120),
                due: t(120)
            })
        );
        // A catch-up delivers the occurrence right after, however late it is.
        let next = after_attempt(&e, t(60), t(300), true, t(240), t(0));
        assert_eq!(
            next,
            AfterAttempt::Next(Planned {
                scheduled: t(120),
                due: t(120)
            })
        );
        // A one-shot is removed once delivered, retried while failing.
        let once = entry(100, None, MissedTickPolicy::Skip);
        assert_eq!(
            after_attempt(&once, t(100), t(101), true, none, t(0)),
            AfterAttempt::Remove
        );
        assert_eq!(
            after_attempt(&once, t(100), t(101), false, none, t(900)),
            AfterAttempt::Retry(Planned {
                scheduled: t(100),
                due: t(900)
            })
        );
        // A failure retried before the next occurrence, or given up for it.
        assert_eq!(
            after_attempt(&e, t(60), t(61), false, none, t(62)),
            AfterAttempt::Retry(Planned {
                scheduled: t(60),
                due: t(62)
            })
        );
        assert_eq!(
            after_attempt(&e, t(60), t(61), false, none, t(120)),
            AfterAttempt::GiveUp(Planned {
                scheduled: t(120),
                due: t(120)
            })
        );
        // A retry that failed after the next occurrence fell due (the attempt
        // overran it) is given up for the first one after now, not retried up
        // to the one after that: one failure costs at most two occurrences.
        assert_eq!(
            after_attempt(&e, t(60), t(121), false, none, t(170)),
            AfterAttempt::GiveUp(Planned {
                scheduled: t(180),
                due: t(180)
            })
        );
        // A failure in a catch-up gives way to the occurrence right after it,
        // owed like the rest, not to the first one after now.
        assert_eq!(
            after_attempt(&e, t(60), t(300), false, t(240), t(301)),
            AfterAttempt::GiveUp(Planned {
                scheduled: t(120),
                due: t(120)
            })
        );
    }

    fn t(s: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + s * 1000)
    }

    fn entry(start: u64, period: Option<Duration>, policy: MissedTickPolicy) -> ReminderEntry {
        let mut e = ReminderEntry::new("svc", "a/1", "r", t(start), period);
        e.missed_tick_policy = policy;
        e
    }

    #[test]
    fn occurrences() {
        assert_eq!(occurrence_after(t(10), Some(MIN), t(0)), Some(t(10)));
        assert_eq!(occurrence_after(t(10), Some(MIN), t(10)), Some(t(70)));
        assert_eq!(occurrence_after(t(10), Some(MIN), t(69)), Some(t(70)));
        assert_eq!(occurrence_after(t(10), None, t(11)), None);
        assert_eq!(occurrence_at_or_before(t(10), Some(MIN), t(9)), None);
        assert_eq!(occurrence_at_or_before(t(10), Some(MIN), t(10)), Some(t(10)));
        assert_eq!(occurrence_at_or_before(t(10), Some(MIN), t(129)), Some(t(70)));
    }

    #[test]
    fn before_start_ticks_at_start() {
        for learned in [Learned::Notice, Learned::Load] {
            let p = plan(&entry(100, Some(MIN), MissedTickPolicy::Skip), t(50), learned).unwrap();
            assert_eq!((p.scheduled, p.due), (t(100), t(100)));
        }
    }

    #[test]
    fn late_first_tick_from_a_notice_is_delivered_at_once() {
        let e = entry(100, Some(MIN), MissedTickPolicy::Skip);
        let p = plan(&e, t(101), Learned::Notice).unwrap();
        assert_eq!((p.scheduled, p.due), (t(100), t(101)));
        // A load may follow another owner's delivery: Skip waits.
        let p = plan(&e, t(101), Learned::Load).unwrap();
        assert_eq!((p.scheduled, p.due), (t(160), t(160)));
        // Past the first period even a notice waits.
        let p = plan(&e, t(161), Learned::Notice).unwrap();
        assert_eq!(p.scheduled, t(220));
    }

    #[test]
    fn fire_once_catches_up_once_and_only_when_an_occurrence_was_missed() {
        let mut e = entry(0, Some(MIN), MissedTickPolicy::FireOnce);
        // Never fired, 10 minutes in: one catch-up for the occurrence at 600 s.
        let p = plan(&e, t(630), Learned::Load).unwrap();
        assert_eq!((p.scheduled, p.due), (t(600), t(630)));
        // Fired at 600 s (persisted): nothing missed.
        e.last_fired = Some(t(600));
        let p = plan(&e, t(630), Learned::Load).unwrap();
        assert_eq!((p.scheduled, p.due), (t(660), t(660)));
        // Fired last at 540 s: 600 s was missed.
        e.last_fired = Some(t(541));
        assert_eq!(plan(&e, t(630), Learned::Load).unwrap().scheduled, t(600));
        // Skip never catches up.
        let s = entry(0, Some(MIN), MissedTickPolicy::Skip);
        assert_eq!(plan(&s, t(630), Learned::Load).unwrap().due, t(660));
    }

    #[test]
    fn one_shot_ticks_once_even_late() {
        let e = entry(100, None, MissedTickPolicy::Skip);
        assert_eq!(plan(&e, t(50), Learned::Load).unwrap().due, t(100));
        let p = plan(&e, t(500), Learned::Load).unwrap();
        assert_eq!((p.scheduled, p.due), (t(100), t(500)));
        assert_eq!(after_delivery(&e, t(100), t(500)), None);
    }

    #[test]
    fn a_long_handler_skips_overrun_occurrences() {
        let e = entry(0, Some(MIN), MissedTickPolicy::Skip);
        // Delivered on time: next occurrence.
        assert_eq!(after_delivery(&e, t(60), t(61)).unwrap().scheduled, t(120));
        // The handler ran 2.5 periods: 120 and 180 are skipped, no burst.
        assert_eq!(after_delivery(&e, t(60), t(210)).unwrap().scheduled, t(240));
        // Finished exactly on the next occurrence: that one is skipped too (it would
        // be delivered late).
        assert_eq!(after_delivery(&e, t(60), t(120)).unwrap().scheduled, t(180));
    }
}

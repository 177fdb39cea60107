//! When a reminder ticks next: pure functions of its row, the time, and how the
//! service learned of it.
//!
//! Rules (Orleans' reminder semantics plus what its users asked for):
//! - A periodic reminder ticks at `start_at + k x period`, `k >= 0`; a calendar
//!   reminder at the occurrences of its cron expression in its time zone, the
//!   first of which is `start_at` (registration stores it so).
//! - Learned **before** `start_at`: the first tick is at `start_at`.
//! - Learned **after** `start_at` from a registration notice, within the first
//!   period and never fired: the late first tick is delivered at once.
//! - Otherwise learned after `start_at` (a load at start-up or on a ring change):
//!   `Skip` waits for the first occurrence after now; `FireOnce` delivers one
//!   catch-up tick at once if the last occurrence at or before now is later than the
//!   persisted `last_fired` (or nothing was persisted), then continues on schedule.
//! - A one-shot reminder (no period, no calendar) whose row still exists has not
//!   been delivered: it ticks at `start_at`, or at once if that has passed.
//! - No occurrence after `end_at` ticks; once the last one is delivered (or, under
//!   `Skip`, has passed) the row is removed, like a one-shot's.
//! - After a delivery that finished at `done`, the next tick is the first
//!   occurrence after `max(done, scheduled)`: a handler that runs long skips the
//!   occurrences it overran instead of firing them back to back.
//!
//! Daylight-saving time, as croner documents it (the Open Cron Pattern
//! Specification and Vixie cron): a fixed local time that a spring-forward gap
//! skips fires once, at the first valid time after the gap; one that a
//! fall-back repeats fires once, at its first pass. Wildcard and step fields
//! (`*/15`) follow the wall clock: none in the gap, each pass of a repeated hour.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollcall_core::{duration_millis, MissedTickPolicy, ReminderEntry, Timestamp};

/// A cron expression in a time zone, parsed: the calendar of a reminder.
///
/// Expressions have 5 fields (minute, hour, day of month, month, day of week), or 6
/// with seconds first (an optional 7th is the year); `@hourly`, `@daily`,
/// `@weekly`, `@monthly`, `@yearly` stand for their usual patterns. Parsed by the
/// [croner](https://docs.rs/croner) crate, zones looked up in the IANA database
/// by [jiff](https://docs.rs/jiff) (the system's, else a bundled copy).
#[derive(Clone, Debug)]
pub struct Calendar {
    expr: String,
    zone_name: Option<String>,
    cron: croner::Cron,
    zone: jiff::tz::TimeZone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.expr == other.expr && self.zone_name == other.zone_name
    }
}

impl Eq for Calendar {}

/// Why a schedule was refused: the message names the expression or zone and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(pub String);

impl Calendar {
    /// Parses `expr` for the IANA zone `zone` (`None`: UTC).
    ///
    /// # Errors
    /// [`ScheduleError`] for an expression croner refuses or a zone the time-zone
    /// database does not know.
    pub fn parse(expr: &str, zone: Option<&str>) -> Result<Calendar, ScheduleError> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expr.trim())
            .map_err(|e| ScheduleError(format!("cron expression `{expr}`: {e}")))?;
        let tz = match zone {
            None => jiff::tz::TimeZone::UTC,
            Some(name) => jiff::tz::TimeZone::get(name)
                .map_err(|e| ScheduleError(format!("time zone `{name}`: {e}")))?,
        };
        Ok(Calendar {
            expr: expr.to_owned(),
            zone_name: zone.map(str::to_owned),
            cron,
            zone: tz,
        })
    }

    /// The calendar of (`expr`, `zone`), shared: rows with the same schedule
    /// share one parsed copy (a process-wide cache of at most 4,096 schedules).
    ///
    /// # Errors
    /// As [`parse`](Self::parse).
    pub fn shared(expr: &str, zone: Option<&str>) -> Result<Arc<Calendar>, ScheduleError> {
        type Cache = Mutex<HashMap<(String, Option<String>), Arc<Calendar>>>;
        static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
        let cache = CACHE.get_or_init(Cache::default);
        let key = (expr.to_owned(), zone.map(str::to_owned));
        if let Some(c) = cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
        {
            return Ok(c.clone());
        }
        let c = Arc::new(Calendar::parse(expr, zone)?);
        let mut map = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= 4096 {
            map.clear();
        }
        map.insert(key, c.clone());
        Ok(c)
    }

    /// The expression, as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The zone's name; `None` for UTC.
    pub fn zone(&self) -> Option<&str> {
        self.zone_name.as_deref()
    }

    fn zoned(&self, t: Timestamp) -> Option<jiff::Zoned> {
        let ms = i64::try_from(t.as_millis()).ok()?;
        Some(
            jiff::Timestamp::from_millisecond(ms)
                .ok()?
                .to_zoned(self.zone.clone()),
        )
    }

    fn instant(z: &jiff::Zoned) -> Option<Timestamp> {
        u64::try_from(z.timestamp().as_millisecond())
            .ok()
            .map(Timestamp::from_millis)
    }

    /// The first occurrence strictly after `t`; `None` if there is none before
    /// the year 5000.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let z = self.zoned(t)?;
        let next = self.cron.find_next_occurrence(&z, false).ok()?;
        Self::instant(&next).filter(|n| *n > t)
    }

    /// The first occurrence at or after `t`.
    pub fn first_at_or_after(&self, t: Timestamp) -> Option<Timestamp> {
        // Occurrences are whole seconds and `t` may not be: the first after the
        // millisecond before `t` (at the epoch itself, a search from it).
        match t.as_millis().checked_sub(1) {
            Some(before) => self.next_after(Timestamp::from_millis(before)),
            None => Self::instant(&self.cron.find_next_occurrence(&self.zoned(t)?, true).ok()?),
        }
    }

    /// The last occurrence at or before `t`.
    pub fn at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        let z = self.zoned(t)?;
        let prev = self.cron.find_previous_occurrence(&z, true).ok()?;
        Self::instant(&prev).filter(|p| *p <= t)
    }
}

/// How the service came to (re)schedule a reminder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// From a registration notice: the row was just written.
    Notice,
    /// From a range load (start-up, ring change, periodic refresh).
    Load,
}

/// What the scheduling rules read of a reminder's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// First tick time.
    pub start_at: Timestamp,
    /// Period (ms precision); `None` or zero for a one-shot reminder.
    pub period: Option<Duration>,
    /// The calendar, in place of `period`.
    pub calendar: Option<Arc<Calendar>>,
    /// No occurrence after this time.
    pub end_at: Option<Timestamp>,
    /// The last tick delivered, as persisted for `FireOnce`.
    pub last_fired: Option<Timestamp>,
    /// What to do with ticks missed while no silo delivered them.
    pub missed_tick_policy: MissedTickPolicy,
}

impl Timing {
    /// The timing of a stored row.
    ///
    /// # Errors
    /// [`ScheduleError`] if its cron expression or zone cannot be read.
    pub fn of(entry: &ReminderEntry) -> Result<Timing, ScheduleError> {
        let calendar = match &entry.cron {
            Some(expr) => Some(Calendar::shared(expr, entry.zone.as_deref())?),
            None => None,
        };
        Ok(Timing {
            start_at: entry.start_at,
            period: entry.period,
            calendar,
            end_at: entry.end_at,
            last_fired: entry.last_fired,
            missed_tick_policy: entry.missed_tick_policy,
        })
    }

    fn period_ms(&self) -> Option<u64> {
        self.period.map(duration_millis).filter(|p| *p > 0)
    }

    /// Whether it ticks once (no period, no calendar).
    pub fn is_one_shot(&self) -> bool {
        self.calendar.is_none() && self.period_ms().is_none()
    }

    fn within_end(&self, t: Timestamp) -> Option<Timestamp> {
        self.end_at.is_none_or(|end| t <= end).then_some(t)
    }

    /// The first occurrence strictly after `t`, or `start_at` if that is after
    /// `t`; `None` for a one-shot reminder whose time has passed, or past the end.
    pub fn after(&self, t: Timestamp) -> Option<Timestamp> {
        let next = if t < self.start_at {
            self.start_at
        } else if let Some(c) = &self.calendar {
            c.next_after(t)?
        } else {
            let p = self.period_ms()?;
            let k = (t.as_millis() - self.start_at.as_millis()) / p + 1;
            Timestamp::from_millis(self.start_at.as_millis().saturating_add(k.saturating_mul(p)))
        };
        self.within_end(next)
    }

    /// The last occurrence at or before `t` (and at or before the end); `None`
    /// before `start_at`.
    pub fn at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        let t = self.end_at.map_or(t, |end| t.min(end));
        if t < self.start_at {
            return None;
        }
        if let Some(c) = &self.calendar {
            return Some(c.at_or_before(t).map_or(self.start_at, |p| p.max(self.start_at)));
        }
        match self.period_ms() {
            None => Some(self.start_at),
            Some(p) => {
                let k = (t.as_millis() - self.start_at.as_millis()) / p;
                Some(Timestamp::from_millis(self.start_at.as_millis() + k * p))
            }
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

/// The next tick of a reminder of timing `entry` when the service learns of it
/// at `now` (rules in the module docs); `None` when none is left (past its end).
pub fn plan(entry: &Timing, now: Timestamp, learned: Learned) -> Option<Planned> {
    if now <= entry.start_at {
        let first = entry.within_end(entry.start_at)?;
        return Some(Planned {
            scheduled: first,
            due: first,
        });
    }
    if entry.is_one_shot() {
        // One-shot: the row exists, so it was not delivered yet.
        return Some(Planned {
            scheduled: entry.start_at,
            due: now,
        });
    }
    let last = entry.at_or_before(now)?;
    let late_first = learned == Learned::Notice && entry.last_fired.is_none() && last == entry.start_at;
    let missed =
        entry.missed_tick_policy == MissedTickPolicy::FireOnce && entry.last_fired.is_none_or(|f| f < last);
    if late_first || missed {
        return Some(Planned {
            scheduled: last,
            due: now,
        });
    }
    let next = entry.after(now)?;
    Some(Planned {
        scheduled: next,
        due: next,
    })
}

/// The tick after one for `scheduled` whose delivery finished at `done`; `None`
/// for a one-shot reminder, or when `scheduled` was the last before the end.
pub fn after_delivery(entry: &Timing, scheduled: Timestamp, done: Timestamp) -> Option<Planned> {
    if entry.is_one_shot() {
        return None;
    }
    let next = entry.after(done.max(scheduled))?;
    Some(Planned {
        scheduled: next,
        due: next,
    })
}

/// What becomes of a reminder's slot after one delivery attempt (the agent carries
/// it out; see [`after_attempt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterAttempt {
    /// A one-shot reminder, or the last occurrence before the end, was
    /// delivered: remove its row.
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
    timing: &Timing,
    scheduled: Timestamp,
    now: Timestamp,
    delivered: bool,
    catch_up_to: Timestamp,
    retry_at: Timestamp,
) -> AfterAttempt {
    let done = if scheduled < catch_up_to { scheduled } else { now };
    if !delivered {
        // A failed tick of a catch-up does not skip the owed ticks after it.
        // The retry must come before the occurrence right after the failed one
        // falls due; given up, the next tick is the first after `done` (the
        // attempts overran the ones between).
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

    /// Regressions, each found by a random seed of the machine's property test:
    /// a handler that failed on the first tick of a catch-up took the owed
    /// ticks after it with it; and a retry planned after the next occurrence
    /// had passed succeeded after the one after that too, so one failure cost
    /// two occurrences.
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

    fn entry(start: u64, period: Option<Duration>, policy: MissedTickPolicy) -> Timing {
        let mut e = ReminderEntry::new("svc", "a/1", "r", t(start), period);
        e.missed_tick_policy = policy;
        Timing::of(&e).unwrap()
    }

    #[test]
    fn occurrences() {
        let e = entry(10, Some(MIN), MissedTickPolicy::Skip);
        assert_eq!(e.after(t(0)), Some(t(10)));
        assert_eq!(e.after(t(10)), Some(t(70)));
        assert_eq!(e.after(t(69)), Some(t(70)));
        assert_eq!(entry(10, None, MissedTickPolicy::Skip).after(t(11)), None);
        assert_eq!(e.at_or_before(t(9)), None);
        assert_eq!(e.at_or_before(t(10)), Some(t(10)));
        assert_eq!(e.at_or_before(t(129)), Some(t(70)));
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

    /// A UTC instant from an RFC 3339 text.
    fn at(text: &str) -> Timestamp {
        let ts: jiff::Timestamp = text.parse().unwrap();
        Timestamp::from_millis(u64::try_from(ts.as_millisecond()).unwrap())
    }

    fn cron(expr: &str, zone: Option<&str>, start: Timestamp) -> Timing {
        let mut e = ReminderEntry::new("svc", "a/1", "r", start, None);
        e.cron = Some(expr.into());
        e.zone = zone.map(str::to_owned);
        Timing::of(&e).unwrap()
    }

    #[test]
    fn a_cron_schedule_ticks_on_its_calendar_in_its_zone() {
        // 09:00 on weekdays in Stockholm (UTC+1 in January): 08:00 UTC.
        let c = cron(
            "0 9 * * MON-FRI",
            Some("Europe/Stockholm"),
            at("2026-01-05T08:00:00Z"),
        );
        assert_eq!(
            c.after(at("2026-01-05T08:00:00Z")),
            Some(at("2026-01-06T08:00:00Z"))
        );
        // Friday's is followed by Monday's.
        assert_eq!(
            c.after(at("2026-01-09T08:00:00Z")),
            Some(at("2026-01-12T08:00:00Z"))
        );
        assert_eq!(
            c.at_or_before(at("2026-01-11T00:00:00Z")),
            Some(at("2026-01-09T08:00:00Z"))
        );
        // Before the first occurrence there is none, and the first is start_at.
        assert_eq!(c.at_or_before(at("2026-01-05T07:59:59Z")), None);
        assert_eq!(
            c.after(at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-05T08:00:00Z"))
        );
        // Sub-second times: the next occurrence is strictly later, the last at
        // or before is not later, the first at or after is not earlier.
        let c2 = Calendar::parse("* * * * * *", None).unwrap();
        let t0 = Timestamp::from_millis(at("2026-01-05T08:00:10Z").as_millis() + 437);
        assert_eq!(c2.first_at_or_after(t0), Some(at("2026-01-05T08:00:11Z")));
        assert_eq!(
            c2.first_at_or_after(at("2026-01-05T08:00:10Z")),
            Some(at("2026-01-05T08:00:10Z"))
        );
        let every_second = cron("* * * * * *", None, at("2026-01-05T08:00:00Z"));
        let t = Timestamp::from_millis(at("2026-01-05T08:00:10Z").as_millis() + 500);
        assert_eq!(every_second.after(t), Some(at("2026-01-05T08:00:11Z")));
        assert_eq!(every_second.at_or_before(t), Some(at("2026-01-05T08:00:10Z")));
        // Aliases, and a 6-field expression with seconds.
        assert_eq!(
            cron("@daily", None, at("2026-01-05T00:00:00Z")).after(at("2026-01-05T00:00:00Z")),
            Some(at("2026-01-06T00:00:00Z"))
        );
        assert_eq!(
            cron("30 */5 * * * *", None, at("2026-01-05T00:00:30Z")).after(at("2026-01-05T00:00:30Z")),
            Some(at("2026-01-05T00:05:30Z"))
        );
    }

    #[test]
    fn daylight_saving_changes_fire_a_local_time_once() {
        // Europe/Stockholm springs forward on 2026-03-29 at 02:00 (to 03:00) and
        // falls back on 2026-10-25 at 03:00 (to 02:00).
        let c = cron("30 2 * * *", Some("Europe/Stockholm"), at("2026-03-28T01:30:00Z"));
        // 02:30 does not exist on the 29th: it fires once, at the first valid
        // time after the gap (03:00 CEST = 01:00 UTC), then on the 30th as usual.
        let gap = c.after(at("2026-03-28T01:30:00Z")).unwrap();
        assert_eq!(gap, at("2026-03-29T01:00:00Z"));
        assert_eq!(c.after(gap), Some(at("2026-03-30T00:30:00Z")));
        // 02:30 happens twice on 2026-10-25 (00:30 and 01:30 UTC): it fires once.
        let before = at("2026-10-24T12:00:00Z");
        let first = c.after(before).unwrap();
        assert_eq!(first, at("2026-10-25T00:30:00Z"));
        assert_eq!(c.after(first), Some(at("2026-10-26T01:30:00Z")));
        // A step pattern follows the wall clock through the repeated hour: each
        // half hour of both passes.
        let steps = cron(
            "0,30 * * * *",
            Some("Europe/Stockholm"),
            at("2026-10-25T00:00:00Z"),
        );
        let mut t = at("2026-10-25T00:00:00Z");
        let mut seen = Vec::new();
        while t < at("2026-10-25T02:00:00Z") {
            t = steps.after(t).unwrap();
            seen.push(t);
        }
        assert_eq!(
            seen,
            [
                at("2026-10-25T00:30:00Z"),
                at("2026-10-25T01:00:00Z"),
                at("2026-10-25T01:30:00Z"),
                at("2026-10-25T02:00:00Z")
            ]
        );
    }

    #[test]
    fn an_end_stops_the_schedule_and_removes_the_row_after_the_last_tick() {
        let mut e = entry(0, Some(MIN), MissedTickPolicy::Skip);
        e.end_at = Some(t(120));
        assert_eq!(e.after(t(60)), Some(t(120)));
        assert_eq!(e.after(t(120)), None);
        assert_eq!(e.at_or_before(t(1000)), Some(t(120)));
        assert_eq!(
            after_attempt(&e, t(60), t(61), true, t(0), t(0)),
            AfterAttempt::Next(Planned {
                scheduled: t(120),
                due: t(120)
            })
        );
        assert_eq!(
            after_attempt(&e, t(120), t(121), true, t(0), t(0)),
            AfterAttempt::Remove
        );
        // Learned after the end: Skip has nothing left, FireOnce one catch-up.
        assert_eq!(plan(&e, t(200), Learned::Load), None);
        e.missed_tick_policy = MissedTickPolicy::FireOnce;
        assert_eq!(
            plan(&e, t(200), Learned::Load),
            Some(Planned {
                scheduled: t(120),
                due: t(200)
            })
        );
        e.last_fired = Some(t(120));
        assert_eq!(plan(&e, t(200), Learned::Load), None);
        // An end before the start: nothing ever ticks.
        let mut never = entry(100, Some(MIN), MissedTickPolicy::Skip);
        never.end_at = Some(t(50));
        assert_eq!(plan(&never, t(0), Learned::Notice), None);
    }

    #[test]
    fn bad_expressions_and_zones_are_typed_errors() {
        assert!(Calendar::parse("61 * * * *", None).is_err());
        assert!(Calendar::parse("not cron", None).is_err());
        let e = Calendar::parse("0 9 * * *", Some("Mars/Olympus")).unwrap_err();
        assert!(e.0.contains("Mars/Olympus"), "{e}");
        let mut row = ReminderEntry::new("svc", "a/1", "r", t(0), None);
        row.cron = Some("* * *".into());
        assert!(Timing::of(&row).is_err());
    }
}

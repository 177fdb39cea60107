//! Reminder rows ([`ReminderEntry`]) and hash ranges.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{actor_hash, Error, Etag, MissedTickPolicy, Result, Timestamp};

/// Whether `hash` lies in the ring range `(begin, end]`.
///
/// When `begin < end` that is `begin < hash <= end`; when `begin >= end` the range
/// wraps around: `hash > begin || hash <= end`, so `(x, x)` is the whole ring.
/// This is the `read_rows_in_range` contract of every reminder table.
pub fn hash_in_range(hash: u32, begin: u32, end: u32) -> bool {
    if begin < end {
        begin < hash && hash <= end
    } else {
        hash > begin || hash <= end
    }
}

/// One durable reminder: a row of the reminder table (Orleans runtime table
/// "Reminders": service id, grain reference, reminder name, start time, period,
/// grain hash), keyed by (service id, actor id, name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReminderEntry {
    /// The service (application) the reminder belongs to; reminder tables are
    /// partitioned by it.
    pub service_id: String,
    /// The actor the ticks are delivered to; any UTF-8 text.
    pub actor_id: String,
    /// The reminder's name, unique per actor; any UTF-8 text.
    pub name: String,
    /// First tick time (UTC, ms precision).
    pub start_at: Timestamp,
    /// Tick period; `None` for a one-shot reminder. Serialised as a human-readable
    /// duration (`"1m"`, `"500ms"`).
    #[serde(with = "humantime_serde", default)]
    pub period: Option<Duration>,
    /// [`actor_hash`] of `actor_id`: the reminder's position on the ring.
    pub hash: u32,
    /// Etag as last read or written; ignored by `upsert_row`, which returns the new one.
    #[serde(default)]
    pub etag: Etag,
    /// When the reminder service last delivered a tick of this reminder (UTC, ms),
    /// recorded only for the `FireOnce` missed-tick policy, by
    /// [`ReminderTable::update_last_fired`](crate::ReminderTable::update_last_fired),
    /// which leaves the etag unchanged. `None` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired: Option<Timestamp>,
    /// Since when the reminder is paused (UTC, ms): no silo delivers its ticks
    /// and its schedule stays; `None` (not written): it ticks. Set and cleared
    /// by [`ReminderTable::update_paused`](crate::ReminderTable::update_paused),
    /// which leaves the etag unchanged, so a pause is not a new registration:
    /// handles and occurrence ids stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Timestamp>,
    /// Set on the one-shot row an operator's "trigger now" writes
    /// (`Reminders::trigger`): the name of the reminder it triggered, which its
    /// tick carries as its name (the row's own name, unique, keeps triggers
    /// apart). `None` (not written) for every other row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_of: Option<String>,
    /// What the service does with ticks missed while no silo delivered them.
    /// Default [`MissedTickPolicy::Skip`] (Orleans), not written when it is the default.
    #[serde(default, skip_serializing_if = "is_skip")]
    pub missed_tick_policy: MissedTickPolicy,
    /// A calendar schedule in place of `period`: a cron expression (5 fields, or 6
    /// with seconds first; `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`)
    /// evaluated in [`zone`](Self::zone). `start_at` is then its first occurrence.
    /// Parsed by the reminder service, which skips (and logs) a row whose
    /// expression it cannot read. Not written when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone (`"Europe/Stockholm"`) `cron` is evaluated in; `None`
    /// is UTC. Not written when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// No occurrence after this time (UTC, ms) is delivered, and once the last one
    /// is, the row is removed (a repeat count is stored as the time of its last
    /// occurrence). `None`: no end. Not written when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Timestamp>,
    /// Bytes every tick carries, at most [`MAX_REMINDER_PAYLOAD`]; base64 in the
    /// JSON rows. Not written when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "payload_base64")]
    pub payload: Option<Vec<u8>>,
    /// What the service does when a tick of this reminder cannot be delivered
    /// (the handler failed or timed out, the actor could not be resolved); `None`:
    /// retry with backoff (1 s doubling, 60 s cap) until the next occurrence is
    /// due. Not written when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
}

/// One occurrence of a reminder in its run history
/// ([`ReminderTable::append_run`](crate::ReminderTable::append_run)): what
/// became of it, where and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The occurrence (`ReminderTick::scheduled`, UTC ms).
    pub scheduled: Timestamp,
    /// When it ended (UTC ms): delivered, given up, dropped or parked; for
    /// [`RunOutcome::Skipped`], when the service moved past it.
    pub at: Timestamp,
    /// Delivery attempts made (0 for a skipped occurrence).
    pub attempts: u32,
    /// What became of it.
    pub outcome: RunOutcome,
    /// The silo that handled it (`ip:port@generation`).
    pub silo: String,
    /// The triggered reminder's tick ([`ReminderEntry::trigger_of`]): an
    /// extra occurrence, not one of the schedule. Not written when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub triggered: bool,
}

/// What became of one occurrence ([`RunRecord::outcome`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// Delivered: the handler completed.
    Ok,
    /// Its retry policy was spent and it was dropped.
    Failed,
    /// Retried until the next occurrence was due, then left (no retry policy).
    GivenUp,
    /// Its retry policy was spent and it was parked ([`RetryPolicy::park`]).
    Parked,
    /// Not delivered by the missed-tick policy: a handler overran it.
    Skipped,
}

impl RunOutcome {
    /// The outcome's name as stored and printed (`ok`, `failed`, `given_up`,
    /// `parked`, `skipped`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Failed => "failed",
            RunOutcome::GivenUp => "given_up",
            RunOutcome::Parked => "parked",
            RunOutcome::Skipped => "skipped",
        }
    }
}

/// The most records a reminder's run history keeps
/// ([`ReminderTable::append_run`](crate::ReminderTable::append_run)'s `keep`):
/// 1,000.
pub const MAX_RUN_HISTORY: usize = 1000;

/// Checks the `keep` of [`ReminderTable::append_run`](crate::ReminderTable::append_run).
///
/// # Errors
/// [`Error::InvalidInput`] (`keep`) outside 1..=[`MAX_RUN_HISTORY`].
pub fn check_run_keep(keep: usize) -> Result<()> {
    if keep == 0 || keep > MAX_RUN_HISTORY {
        return Err(Error::invalid_input(
            "keep",
            format!("{keep} is outside 1..={MAX_RUN_HISTORY}"),
        ));
    }
    Ok(())
}

/// Prepends `run` to the history `runs` (newest first) and keeps the newest
/// `keep`, unless `run` is its newest record already (an append retried after
/// it landed): the rule every provider's
/// [`ReminderTable::append_run`](crate::ReminderTable::append_run) follows.
/// Returns whether `runs` changed.
pub fn prepend_run(runs: &mut Vec<RunRecord>, run: &RunRecord, keep: usize) -> bool {
    if runs.first() == Some(run) {
        return false;
    }
    runs.insert(0, run.clone());
    runs.truncate(keep);
    true
}

/// How a reminder's failed tick is retried: up to `max_retries` more attempts
/// after the first, the `k`-th (from 1) after
/// `min(first_delay x 2^(k-1), max_delay)` less up to 20% jitter; then the
/// occurrence is dropped (counted in `ticks_dropped` and the
/// `rollcall_reminder_ticks_dropped_total` series, logged), or parked when
/// `park` is set, and the reminder goes on with its next occurrence (a
/// one-shot, or the last occurrence before its end, is removed). A retry never
/// runs past the next occurrence: that one comes first, as without a policy.
/// Stored in the reminder's row.
///
/// Parked: the occurrence is written, as a one-shot row named
/// `<name>@<scheduled ms>` with the reminder's actor and payload, to the
/// reminder table of service [`parked_service_id`]`(service)`, which no silo
/// delivers unless an application starts a reminder service of that id (a
/// dead-letter queue: list it with `rollcall reminders --service <id>.parked`;
/// a reminder service started with that id delivers each parked row once).
/// Counted in `ticks_parked` and
/// `rollcall_reminder_ticks_parked_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts after the first; 0 drops a failed tick at once.
    pub max_retries: u32,
    /// Delay before the first retry (ms precision).
    #[serde(with = "humantime_serde")]
    pub first_delay: Duration,
    /// Largest delay between two attempts.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Park the occurrence once the retries are spent instead of dropping it.
    /// Not written when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub park: bool,
}

/// The service id of the parked occurrences of `service_id` (see
/// [`RetryPolicy::park`]): `<service_id>.parked`.
pub fn parked_service_id(service_id: &str) -> String {
    format!("{service_id}.parked")
}

impl RetryPolicy {
    /// Drop a failed tick at once, without a retry.
    pub const DROP: RetryPolicy = RetryPolicy {
        max_retries: 0,
        first_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        park: false,
    };

    /// Park a failed tick at once, without a retry.
    pub const PARK: RetryPolicy = RetryPolicy {
        park: true,
        ..RetryPolicy::DROP
    };

    /// This policy, parking the occurrence once its retries are spent.
    #[must_use]
    pub const fn then_park(self) -> RetryPolicy {
        RetryPolicy { park: true, ..self }
    }

    /// The delay before retry `k` (1-based) for a jitter draw `unit` in `[0, 1]`;
    /// `None` past `max_retries`.
    pub fn delay(&self, k: u32, unit: f64) -> Option<Duration> {
        if k == 0 || k > self.max_retries {
            return None;
        }
        let full = self
            .first_delay
            .saturating_mul(1u32 << (k - 1).min(20))
            .min(self.max_delay.max(self.first_delay));
        Some(full.mul_f64(1.0 - 0.2 * unit.clamp(0.0, 1.0)))
    }

    /// Checks the policy.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (`retry`) for retries with a zero first delay or
    /// a `max_delay` below `first_delay`.
    pub fn validate(&self) -> Result<()> {
        if self.max_retries > 0 && self.first_delay.is_zero() {
            return Err(Error::invalid_input(
                "retry",
                "retries need a first_delay above 0",
            ));
        }
        if self.max_retries > 0 && self.max_delay < self.first_delay {
            return Err(Error::invalid_input("retry", "max_delay is below first_delay"));
        }
        Ok(())
    }
}

/// The largest reminder payload, in bytes: 64 KiB, so that a row (its payload
/// base64-encoded in the JSON rows of Redis and etcd, raw in DynamoDB's binary
/// attribute) stays far below the smallest row limit of the providers
/// (DynamoDB's 400 KB item).
pub const MAX_REMINDER_PAYLOAD: usize = 64 * 1024;

mod payload_base64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)] // serde's `with` passes `&Option<T>`
    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) => s.serialize_str(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => STANDARD
                .decode(text.as_bytes())
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

fn is_skip(p: &MissedTickPolicy) -> bool {
    *p == MissedTickPolicy::Skip
}

impl ReminderEntry {
    /// A reminder with `hash = actor_hash(actor_id)` and an empty etag.
    pub fn new(
        service_id: impl Into<String>,
        actor_id: impl Into<String>,
        name: impl Into<String>,
        start_at: Timestamp,
        period: Option<Duration>,
    ) -> Self {
        let actor_id = actor_id.into();
        ReminderEntry {
            service_id: service_id.into(),
            hash: actor_hash(&actor_id),
            actor_id,
            name: name.into(),
            start_at,
            period,
            etag: Etag::default(),
            last_fired: None,
            paused: None,
            trigger_of: None,
            missed_tick_policy: MissedTickPolicy::Skip,
            cron: None,
            zone: None,
            end_at: None,
            payload: None,
            retry: None,
        }
    }

    /// Checks that this entry may be written to the reminder table of `service_id`
    /// on a provider that stores keys up to `limits`: same service, an actor id
    /// and name within `limits` ([`KeyLimits::check_key`](crate::KeyLimits::check_key)),
    /// a payload within [`MAX_REMINDER_PAYLOAD`], a valid retry policy and
    /// `hash == actor_hash(actor_id)`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the offending field (`service_id`,
    /// `actor_id`, `name`, `actor_id+name`, `payload`, `retry` or `hash`).
    pub fn validate_for(&self, service_id: &str, limits: &crate::KeyLimits) -> Result<()> {
        if self.service_id != service_id {
            return Err(Error::invalid_input(
                "service_id",
                format!(
                    "entry of service `{}` written to the table of `{service_id}`",
                    self.service_id
                ),
            ));
        }
        limits.check_key(&self.actor_id, &self.name)?;
        if self
            .payload
            .as_ref()
            .is_some_and(|p| p.len() > MAX_REMINDER_PAYLOAD)
        {
            return Err(Error::invalid_input(
                "payload",
                format!("longer than {MAX_REMINDER_PAYLOAD} bytes"),
            ));
        }
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        let expected = actor_hash(&self.actor_id);
        if self.hash != expected {
            return Err(Error::invalid_input(
                "hash",
                format!(
                    "{:#010x} is not actor_hash(actor_id) = {expected:#010x}",
                    self.hash
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_test_vectors() {
        // XXH32, seed 0: published reference values.
        assert_eq!(actor_hash(""), 0x02CC_5D05);
        assert_eq!(actor_hash("abc"), 0x32D1_53FF);
        // Pinned: rollcall's own vectors (must never change between releases).
        assert_eq!(actor_hash("a"), 0x550D_7456);
        assert_eq!(actor_hash("user/42"), actor_hash("user/42"));
        assert_ne!(actor_hash("user/42"), actor_hash("user/43"));
    }

    #[test]
    fn range_semantics() {
        assert!(hash_in_range(5, 4, 5));
        assert!(!hash_in_range(4, 4, 5));
        assert!(!hash_in_range(6, 4, 5));
        // wrapping
        assert!(hash_in_range(u32::MAX, 10, 2));
        assert!(hash_in_range(0, 10, 2));
        assert!(hash_in_range(2, 10, 2));
        assert!(!hash_in_range(3, 10, 2));
        assert!(!hash_in_range(10, 10, 2));
        // (x, x) is everything
        for h in [0, 1, 7, u32::MAX] {
            assert!(hash_in_range(h, 0, 0));
            assert!(hash_in_range(h, 7, 7));
        }
        // (0, MAX] misses only 0
        assert!(!hash_in_range(0, 0, u32::MAX));
    }

    #[test]
    fn entry_json_round_trip_with_and_without_period() {
        for period in [Some(Duration::from_millis(90_500)), None] {
            let e = ReminderEntry::new("svc", "actör/1", "n", Timestamp::from_millis(7), period);
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<ReminderEntry>(&json).unwrap(), e);
        }
    }

    #[test]
    fn retry_delays_double_up_to_the_cap_and_stop_after_the_count() {
        let p = RetryPolicy {
            max_retries: 4,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(3),
            park: false,
        };
        let no_jitter: Vec<_> = (0..=5).map(|k| p.delay(k, 0.0)).collect();
        let s = Duration::from_secs;
        assert_eq!(
            no_jitter,
            [None, Some(s(1)), Some(s(2)), Some(s(3)), Some(s(3)), None]
        );
        assert_eq!(p.delay(1, 1.0), Some(Duration::from_millis(800)));
        assert_eq!(RetryPolicy::DROP.delay(1, 0.5), None);
        assert!(RetryPolicy::DROP.validate().is_ok());
        assert_eq!(p.then_park().delay(2, 0.0), Some(s(2)));
        let parked = serde_json::to_string(&RetryPolicy::PARK).unwrap();
        assert!(parked.contains(r#""park":true"#), "{parked}");
        let plain = serde_json::to_string(&p).unwrap();
        assert!(!plain.contains("park"), "{plain}");
        assert_eq!(serde_json::from_str::<RetryPolicy>(&plain).unwrap(), p);
        assert!(RetryPolicy {
            first_delay: Duration::ZERO,
            ..p
        }
        .validate()
        .is_err());
        assert!(RetryPolicy {
            max_delay: Duration::from_millis(1),
            ..p
        }
        .validate()
        .is_err());
    }
}

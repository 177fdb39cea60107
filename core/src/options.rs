//! Tunables of the membership protocol ([`ClusterMembershipOptions`]) and of the
//! reminder service ([`ReminderOptions`]), with Orleans' production defaults.
//!
//! Both deserialise from any serde format with human-readable durations
//! (`probe_timeout = "5s"`), fill missing fields with the defaults, reject unknown
//! fields, and have a `validate()` that names the offending field.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Options of the membership protocol. Defaults are Orleans' production-tuned
/// `ClusterMembershipOptions` (*Cluster Management in Orleans*, "Configuration").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterMembershipOptions {
    /// The probe timeout `T`: how long one probe waits for its answer (at least; see
    /// `min_probe_timeout`). Probes of one target are sent every `T / 2`. A target is
    /// voted against only once its probes have gone unanswered for
    /// `num_missed_probes_limit x T`, so with the defaults a silo unresponsive for less
    /// than that (a GC pause, a stall) is never declared Dead. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Lower bound of the adaptive probe timeout. Default `probe_timeout`: the
    /// adaptive timeout only lengthens. A smaller value is an opt-in for faster
    /// detection on a low-latency network; it lowers the tolerated stall to
    /// `num_missed_probes_limit x min_probe_timeout`.
    #[serde(with = "humantime_serde")]
    pub min_probe_timeout: Option<Duration>,
    /// Upper bound of the adaptive probe timeout. Default `probe_timeout * 4`.
    #[serde(with = "humantime_serde")]
    pub max_probe_timeout: Option<Duration>,
    /// Missed probes after which a silo votes against its target; the indirect probe
    /// is tried after `limit - 1`. Default 3.
    pub num_missed_probes_limit: u32,
    /// How many silos each silo probes. Default 10.
    pub num_probed_silos: u32,
    /// Fresh votes needed to declare a silo Dead (capped at half the active silos,
    /// rounded up). Default 2.
    pub num_votes_for_death_declaration: u32,
    /// Age after which a vote no longer counts, measured against the newest vote.
    /// Default 2 min.
    #[serde(with = "humantime_serde")]
    pub death_vote_expiration: Duration,
    /// Period of the full table re-read. Default 60 s.
    #[serde(with = "humantime_serde")]
    pub table_refresh_timeout: Duration,
    /// Period of the IAmAlive heartbeat write. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub i_am_alive_publish_period: Duration,
    /// IAmAlive periods a silo may miss before it counts as stale (and is probed by
    /// everyone). Default 3.
    pub num_missed_table_i_am_alive_limit: u32,
    /// How long a silo may stay Joining (validating connectivity) before it gives up,
    /// and others suspect it. Default 5 min.
    #[serde(with = "humantime_serde")]
    pub max_join_attempt_time: Duration,
    /// Gossip "re-read the table" after each successful write. Default true.
    pub use_liveness_gossip: bool,
    /// How many silos one write's gossip goes to, at most. Default `None`:
    /// `3 + ceil(log2 N)` of the N other monitored silos, chosen at random (Orleans
    /// gossips to every silo, which costs N² messages and table reads per round of
    /// writes in a large cluster). The others learn the new version from the
    /// versions that pings and pongs carry, within a few probe periods.
    pub max_gossip_fan_out: Option<u32>,
    /// How many Active silos a joining silo pings to validate its connectivity,
    /// at most. Default `None`: `3 + ceil(log2 N)` of the N Active silos, chosen at
    /// random each round; a silo that did not answer stays in the next round's
    /// sample. Orleans pings every Active silo (`Some(u32::MAX)` does that), which
    /// makes a join storm of N silos cost N² pings.
    pub max_join_validation_probes: Option<u32>,
    /// Try an indirect probe through another silo before voting. Default true.
    pub enable_indirect_probes: bool,
    /// Vote on probe evidence ("it does not answer") only while this silo reaches a
    /// strict majority of the active, non-stale silos (see
    /// [`protocol::reach`](crate::protocol::reach)): in a network partition only a
    /// minority side may die, and a split without a majority kills nobody; a crash
    /// that leaves no majority (1 of 2, 3 of 5) is declared once the victims'
    /// IAmAlive is stale (`i_am_alive_publish_period x
    /// num_missed_table_i_am_alive_limit` later). Default true. `false` is Orleans'
    /// rule (votes alone), which detects such crashes within the probe bound but
    /// lets a minority declare the majority Dead.
    pub vote_needs_majority: bool,
    /// Lengthen the probe timeout while the local silo itself is degraded.
    /// Default true.
    pub extend_probe_timeout_during_degradation: bool,
    /// Period of the local health self-check. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub local_health_monitoring_period: Duration,
    /// Age after which Dead rows are deleted by the defunct-row cleanup. Default 7 days.
    #[serde(with = "humantime_serde")]
    pub defunct_silo_expiration: Duration,
    /// Period of the defunct-row cleanup. Default 1 h.
    #[serde(with = "humantime_serde")]
    pub defunct_silo_cleanup_period: Duration,
    /// Dead rows kept at most, newest first, before older ones are deleted early
    /// (but never a row alive within [`lost_row_grace`](crate::protocol::lost_row_grace):
    /// half of `defunct_silo_expiration`, at most `max(10 × table_refresh_timeout, 1 h)`).
    /// Default 25.
    pub max_defunct_silo_entries: u32,
    /// Use the version row (extended protocol). Default true. The silo opens its
    /// membership table in the [`ProtocolMode`](crate::ProtocolMode) this selects.
    pub use_version_row: bool,
    /// Longest a single membership-table operation may take before the silo treats it
    /// as failed (and retries it later). Bounds [`SiloHandle::refresh`](crate::SiloHandle::refresh).
    /// Default 5 s.
    #[serde(with = "humantime_serde")]
    pub table_operation_timeout: Duration,
    /// Longest a graceful [`shutdown`](crate::SiloHandle::shutdown) or
    /// [`stop`](crate::SiloHandle::stop) tries to write the leaving and Dead statuses
    /// before the silo stops anyway (logging it). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// The largest difference between two silos' wall clocks that the cluster
    /// tolerates (CockroachDB's `max-offset`, 500 ms there too). Each silo
    /// measures its offset from its peers from the probes' timestamps (see
    /// [`clock`](crate::protocol::clock)) and reports it
    /// ([`SiloHandle::clock`](crate::SiloHandle::clock), the
    /// `rollcall_clock_offset_seconds` gauge, `rollcall status`); a silo more
    /// than half of it away from the median of its peers is beyond the bound,
    /// and the reminder service stops delivering there until it is back. The
    /// reminder fence waits this much longer before a takeover. Default 500 ms.
    #[serde(with = "humantime_serde")]
    pub max_clock_offset: Duration,
}

impl Default for ClusterMembershipOptions {
    fn default() -> Self {
        ClusterMembershipOptions {
            probe_timeout: Duration::from_secs(5),
            min_probe_timeout: None,
            max_probe_timeout: None,
            num_missed_probes_limit: 3,
            num_probed_silos: 10,
            num_votes_for_death_declaration: 2,
            death_vote_expiration: Duration::from_secs(120),
            table_refresh_timeout: Duration::from_secs(60),
            i_am_alive_publish_period: Duration::from_secs(30),
            num_missed_table_i_am_alive_limit: 3,
            max_join_attempt_time: Duration::from_secs(300),
            use_liveness_gossip: true,
            max_gossip_fan_out: None,
            max_join_validation_probes: None,
            enable_indirect_probes: true,
            vote_needs_majority: true,
            extend_probe_timeout_during_degradation: true,
            local_health_monitoring_period: Duration::from_secs(10),
            defunct_silo_expiration: Duration::from_secs(7 * 24 * 3600),
            defunct_silo_cleanup_period: Duration::from_secs(3600),
            max_defunct_silo_entries: 25,
            use_version_row: true,
            table_operation_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(10),
            max_clock_offset: Duration::from_millis(500),
        }
    }
}

fn require_positive(field: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::invalid_config(field, "must be greater than zero"));
    }
    Ok(())
}

fn require_at_least_one(field: &str, n: u32) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid_config(field, "must be at least 1"));
    }
    Ok(())
}

impl ClusterMembershipOptions {
    /// The fast profile of `rollcall demo --fast` and `rollcall silo --fast`, for a
    /// local cluster: `probe_timeout` 500 ms (a crash is detected within
    /// `L x T + T/2` = 1.75 s), full reads every 10 s, IAmAlive every 2 s, local
    /// health every 1 s, joins bounded by 30 s; the rest as [`Default`].
    pub fn fast() -> Self {
        ClusterMembershipOptions {
            probe_timeout: Duration::from_millis(500),
            table_refresh_timeout: Duration::from_secs(10),
            i_am_alive_publish_period: Duration::from_secs(2),
            local_health_monitoring_period: Duration::from_secs(1),
            max_join_attempt_time: Duration::from_secs(30),
            ..Default::default()
        }
    }

    /// The lower bound of the adaptive probe timeout (`min_probe_timeout`, or
    /// `probe_timeout`).
    pub fn effective_min_probe_timeout(&self) -> Duration {
        self.min_probe_timeout.unwrap_or(self.probe_timeout)
    }

    /// How often each target is probed: `probe_timeout / 2`, so that a probe is
    /// always outstanding while a target is silent.
    pub fn probe_period(&self) -> Duration {
        self.probe_timeout / 2
    }

    /// The upper bound of the adaptive probe timeout (`max_probe_timeout`, or
    /// `probe_timeout * 4`).
    pub fn effective_max_probe_timeout(&self) -> Duration {
        self.max_probe_timeout
            .unwrap_or_else(|| self.probe_timeout.saturating_mul(4))
    }

    /// The [`ProtocolMode`](crate::ProtocolMode) selected by `use_version_row`.
    pub fn protocol_mode(&self) -> crate::ProtocolMode {
        if self.use_version_row {
            crate::ProtocolMode::Extended
        } else {
            crate::ProtocolMode::Basic
        }
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first offending field: a zero period or
    /// count; `min_probe_timeout > probe_timeout` or `probe_timeout >
    /// max_probe_timeout`; `num_votes_for_death_declaration > num_probed_silos` (the
    /// votes could never be cast: the rule of Orleans' options validator);
    /// `death_vote_expiration` shorter than the time needed to collect the votes
    /// (`num_missed_probes_limit * probe_timeout`).
    pub fn validate(&self) -> Result<()> {
        require_positive("probe_timeout", self.probe_timeout)?;
        if self.max_join_validation_probes == Some(0) {
            return Err(Error::invalid_config(
                "max_join_validation_probes",
                "must be at least 1",
            ));
        }
        if self.max_gossip_fan_out == Some(0) {
            return Err(Error::invalid_config(
                "max_gossip_fan_out",
                "must be at least 1 (set use_liveness_gossip = false to turn gossip off)",
            ));
        }
        let (min, max) = (
            self.effective_min_probe_timeout(),
            self.effective_max_probe_timeout(),
        );
        require_positive("min_probe_timeout", min)?;
        if min > self.probe_timeout {
            return Err(Error::invalid_config(
                "min_probe_timeout",
                format!("{min:?} is greater than probe_timeout {:?}", self.probe_timeout),
            ));
        }
        if max < self.probe_timeout {
            return Err(Error::invalid_config(
                "max_probe_timeout",
                format!("{max:?} is less than probe_timeout {:?}", self.probe_timeout),
            ));
        }
        require_at_least_one("num_missed_probes_limit", self.num_missed_probes_limit)?;
        require_at_least_one("num_probed_silos", self.num_probed_silos)?;
        require_at_least_one(
            "num_votes_for_death_declaration",
            self.num_votes_for_death_declaration,
        )?;
        if self.num_votes_for_death_declaration > self.num_probed_silos {
            return Err(Error::invalid_config(
                "num_votes_for_death_declaration",
                format!(
                    "{} is greater than num_probed_silos {}: not enough probers to ever cast that many votes",
                    self.num_votes_for_death_declaration, self.num_probed_silos
                ),
            ));
        }
        require_positive("death_vote_expiration", self.death_vote_expiration)?;
        let collect = self.probe_timeout.saturating_mul(self.num_missed_probes_limit);
        if self.death_vote_expiration < collect {
            return Err(Error::invalid_config(
                "death_vote_expiration",
                format!(
                    "{:?} expires votes before a second prober can miss {} probes ({collect:?})",
                    self.death_vote_expiration, self.num_missed_probes_limit
                ),
            ));
        }
        require_positive("table_refresh_timeout", self.table_refresh_timeout)?;
        require_positive("i_am_alive_publish_period", self.i_am_alive_publish_period)?;
        require_at_least_one(
            "num_missed_table_i_am_alive_limit",
            self.num_missed_table_i_am_alive_limit,
        )?;
        require_positive("max_join_attempt_time", self.max_join_attempt_time)?;
        require_positive(
            "local_health_monitoring_period",
            self.local_health_monitoring_period,
        )?;
        require_positive("defunct_silo_expiration", self.defunct_silo_expiration)?;
        require_positive("defunct_silo_cleanup_period", self.defunct_silo_cleanup_period)?;
        require_positive("table_operation_timeout", self.table_operation_timeout)?;
        require_positive("shutdown_timeout", self.shutdown_timeout)?;
        require_positive("max_clock_offset", self.max_clock_offset)?;
        if self.max_clock_offset > Duration::from_secs(60) {
            return Err(Error::invalid_config(
                "max_clock_offset",
                format!(
                    "{:?} is over a minute: fix the clocks (NTP) instead",
                    self.max_clock_offset
                ),
            ));
        }
        Ok(())
    }
}

/// What the reminder service does with ticks missed while no silo delivered them
/// (an outage, a restart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MissedTickPolicy {
    /// Skip missed occurrences; deliver the next one on schedule (Orleans).
    #[default]
    Skip,
    /// Deliver one tick at once on recovery, then continue on schedule.
    FireOnce,
}

/// Options of the reminder service. Defaults follow Orleans' `ReminderOptions`
/// where it has them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReminderOptions {
    /// Smallest period accepted without a warning. Default 1 min (Orleans).
    #[serde(with = "humantime_serde")]
    pub minimum_period: Duration,
    /// Period of the reconciliation with the table. Default 5 min (Orleans
    /// `RefreshReminderListPeriod`).
    #[serde(with = "humantime_serde")]
    pub refresh_reminder_list_period: Duration,
    /// How long the service may take to load its ranges at start-up. Default 5 min.
    #[serde(with = "humantime_serde")]
    pub initialization_timeout: Duration,
    /// Not used by the reminder service any more (every reminder of a held
    /// shard is kept in memory: its release reads what it owes from them); kept
    /// so that existing configurations still parse. Default 1 h; must be at
    /// least `refresh_reminder_list_period`.
    #[serde(with = "humantime_serde")]
    pub loading_window: Duration,
    /// Points each silo takes on the consistent-hash ring. Default 30.
    pub ring_points_per_silo: u32,
    /// Missed-tick behaviour. Default [`MissedTickPolicy::Skip`].
    pub missed_tick_policy: MissedTickPolicy,
    /// Ticks due at start-up are spread uniformly over this window. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub startup_jitter: Duration,
    /// Accept periods below `minimum_period` (logged as a warning) instead of
    /// refusing them. Default false. Tests and demos use short periods.
    pub allow_period_below_minimum: bool,
    /// How long one tick's handler may take before the delivery counts as failed
    /// and is retried. Default 30 s.
    #[serde(with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// Bound of every reminder-table call the service and the handle make.
    /// Default 5 s.
    #[serde(with = "humantime_serde")]
    pub table_operation_timeout: Duration,
    /// `L` of the shard leases: a silo delivers only while it confirmed its own
    /// membership row Active within this period (it reads it every `L / 3`:
    /// 1.5 reads/s per silo at the default), and a silo that takes over a Dead
    /// holder's shards delivers there only from `L` after it saw it Dead (it
    /// loads them meanwhile), so that a silo declared Dead while it still runs
    /// stops delivering before its successor starts. A crash failover takes
    /// at least `L` after detection; a store read slower than about `2L / 3`
    /// pauses delivery (the ticks due meanwhile are delivered on resume, none
    /// lost). Default 2 s.
    #[serde(with = "humantime_serde")]
    pub lease_period: Duration,
    /// Whether the fencing of [`lease_period`](Self::lease_period) is on. Off,
    /// a silo falsely declared Dead may deliver a tick its successor delivers
    /// too, and the failover is `lease_period` faster. Default true.
    pub lease_fencing: bool,
    /// How often a silo reads again the lease of a shard it was assigned that a
    /// live silo still holds (the release's hint usually comes first), and
    /// the pace at which it reads again, in turn, the lease of a shard it holds
    /// (one a poll: a lease a store failover lost heals).
    /// Default 1 s.
    #[serde(with = "humantime_serde")]
    pub lease_poll: Duration,
    /// How often the holder of a shard writes its progress into the shard's
    /// lease row (its watermark and up to 64 reminders it owes: a
    /// checkpoint, fencing token unchanged), for the shards whose progress
    /// moved since the last one. A silo that takes a shard over from a Dead
    /// holder owes every occurrence after the last checkpoint (less
    /// `max_clock_offset`), under every missed-tick policy: a crash loses
    /// nothing from then on, and repeats at most what the holder delivered
    /// after it (about this interval). The cost: about one lease write per
    /// held, active shard per interval (R4 in `BENCHMARKS.md`). Zero turns
    /// checkpoints off (a takeover then owes from its takeover time on, and
    /// the missed-tick policy decides what fell due before it). Default 10 s.
    #[serde(with = "humantime_serde")]
    pub lease_checkpoint_interval: Duration,
    /// Ticks one silo delivers at once, at most (handlers running or awaited).
    /// The rest wait in the due queue, in due order, and are delivered as
    /// running ones end: a mass due time (every reminder at 00:00) costs the
    /// queue's memory (one slot per reminder, held anyway), not a task per
    /// tick, and its lateness grows with the backlog over the handlers' rate.
    /// Durable Jobs in Orleans 10 caps its concurrency per silo the same way.
    /// Default 1,024; must be in 1..=65,536.
    pub max_deliveries: usize,
    /// Records each scheduled reminder's run history keeps (the newest; one
    /// per occurrence and per trigger: `Reminders::history`); 0 keeps none.
    /// Appended in the background, best effort, one store write per
    /// occurrence. Default 20; at most 1,000.
    pub run_history: usize,
    /// Ticks of one actor kind one silo delivers at once, at most: with it, a
    /// burst of one kind (a million carts due at midnight) takes at most this
    /// many of the `max_deliveries`, and the other kinds' due ticks are
    /// delivered beside it instead of after it (Temporal's fairness keys,
    /// Restate's per-key queues). `None` (the default): one queue in due order.
    /// Must be in 1..=65,536. Costs a due index per kind (one more B-tree
    /// entry per reminder).
    pub max_deliveries_per_kind: Option<usize>,
    /// How long the release of a shard waits for actor hosts' activations of
    /// it to handle `Deactivate` (a write-behind actor's flush) before it is
    /// written anyway: the next holder activates an actor only after its old
    /// activation ended or this passed. Longer than the deliveries' drain
    /// (5 s) so a slow flush lands under its own fence; what a flush still
    /// running after it writes is refused (`Error::Fenced`) and lost. Must be
    /// shorter than the silo's `shutdown_timeout`, which bounds a graceful
    /// leave's releases (the rest is for the release's own read and write):
    /// checked when the service starts. Default 7.5 s, three quarters of the
    /// default `shutdown_timeout`.
    #[serde(with = "humantime_serde")]
    pub deactivate_drain: Duration,
}

impl Default for ReminderOptions {
    fn default() -> Self {
        ReminderOptions {
            minimum_period: Duration::from_secs(60),
            refresh_reminder_list_period: Duration::from_secs(300),
            initialization_timeout: Duration::from_secs(300),
            loading_window: Duration::from_secs(3600),
            ring_points_per_silo: 30,
            missed_tick_policy: MissedTickPolicy::Skip,
            startup_jitter: Duration::from_secs(10),
            allow_period_below_minimum: false,
            delivery_timeout: Duration::from_secs(30),
            table_operation_timeout: Duration::from_secs(5),
            lease_period: Duration::from_secs(2),
            lease_fencing: true,
            lease_poll: Duration::from_secs(1),
            lease_checkpoint_interval: Duration::from_secs(10),
            max_deliveries: 1024,
            run_history: 20,
            max_deliveries_per_kind: None,
            deactivate_drain: Duration::from_millis(7_500),
        }
    }
}

impl ReminderOptions {
    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first offending field: a zero period,
    /// `ring_points_per_silo` outside 1..=1024, `max_deliveries` outside
    /// 1..=65,536, or a `loading_window` shorter than
    /// `refresh_reminder_list_period` (reminders due between two refreshes would be
    /// missed).
    pub fn validate(&self) -> Result<()> {
        require_positive("minimum_period", self.minimum_period)?;
        require_positive("refresh_reminder_list_period", self.refresh_reminder_list_period)?;
        require_positive("initialization_timeout", self.initialization_timeout)?;
        require_positive("delivery_timeout", self.delivery_timeout)?;
        require_positive("table_operation_timeout", self.table_operation_timeout)?;
        require_positive("lease_period", self.lease_period)?;
        require_positive("deactivate_drain", self.deactivate_drain)?;
        require_positive("lease_poll", self.lease_poll)?;
        if !(1..=1024).contains(&self.ring_points_per_silo) {
            return Err(Error::invalid_config(
                "ring_points_per_silo",
                "must be in 1..=1024",
            ));
        }
        if !(1..=65_536).contains(&self.max_deliveries) {
            return Err(Error::invalid_config("max_deliveries", "must be in 1..=65536"));
        }
        if self
            .max_deliveries_per_kind
            .is_some_and(|c| !(1..=65_536).contains(&c))
        {
            return Err(Error::invalid_config(
                "max_deliveries_per_kind",
                "must be in 1..=65536",
            ));
        }
        if self.run_history > crate::MAX_RUN_HISTORY {
            return Err(Error::invalid_config("run_history", "must be in 0..=1000"));
        }
        if self.loading_window < self.refresh_reminder_list_period {
            return Err(Error::invalid_config(
                "loading_window",
                format!(
                    "{:?} is shorter than refresh_reminder_list_period {:?}",
                    self.loading_window, self.refresh_reminder_list_period
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_orleans_and_valid() {
        let o = ClusterMembershipOptions::default();
        o.validate().unwrap();
        assert_eq!(o.probe_timeout, Duration::from_secs(5));
        assert_eq!(o.effective_min_probe_timeout(), Duration::from_secs(5));
        assert_eq!(o.probe_period(), Duration::from_millis(2500));
        assert_eq!(o.effective_max_probe_timeout(), Duration::from_secs(20));
        assert_eq!(o.num_votes_for_death_declaration, 2);
        ReminderOptions::default().validate().unwrap();
    }

    #[test]
    fn deserialises_human_durations_and_fills_defaults() {
        let o: ClusterMembershipOptions = serde_json::from_str(
            r#"{"probe_timeout":"1s","death_vote_expiration":"90s","min_probe_timeout":"200ms"}"#,
        )
        .unwrap();
        assert_eq!(o.probe_timeout, Duration::from_secs(1));
        assert_eq!(o.death_vote_expiration, Duration::from_secs(90));
        assert_eq!(o.effective_min_probe_timeout(), Duration::from_millis(200));
        assert_eq!(o.num_probed_silos, 10);
        o.validate().unwrap();
    }

    #[test]
    fn unknown_fields_and_bad_durations_are_rejected() {
        assert!(serde_json::from_str::<ClusterMembershipOptions>(r#"{"probe_timout":"1s"}"#).is_err());
        assert!(serde_json::from_str::<ClusterMembershipOptions>(r#"{"probe_timeout":"soon"}"#).is_err());
        assert!(serde_json::from_str::<ReminderOptions>(r#"{"missed_tick_policy":"Sometimes"}"#).is_err());
    }

    #[test]
    fn validate_names_the_offending_field() {
        let base = ClusterMembershipOptions::default;
        let o = ClusterMembershipOptions {
            num_votes_for_death_declaration: 11,
            ..base()
        };
        assert_eq!(field_of(o.validate()), "num_votes_for_death_declaration");
        let o = ClusterMembershipOptions {
            min_probe_timeout: Some(Duration::from_secs(6)),
            ..base()
        };
        assert_eq!(field_of(o.validate()), "min_probe_timeout");
        let o = ClusterMembershipOptions {
            max_probe_timeout: Some(Duration::from_secs(1)),
            ..base()
        };
        assert_eq!(field_of(o.validate()), "max_probe_timeout");
        let o = ClusterMembershipOptions {
            probe_timeout: Duration::ZERO,
            ..base()
        };
        assert_eq!(field_of(o.validate()), "probe_timeout");
        let o = ClusterMembershipOptions {
            num_missed_probes_limit: 0,
            ..base()
        };
        assert_eq!(field_of(o.validate()), "num_missed_probes_limit");
        let o = ClusterMembershipOptions {
            death_vote_expiration: Duration::from_secs(1),
            ..base()
        };
        assert_eq!(field_of(o.validate()), "death_vote_expiration");
        let o = ClusterMembershipOptions {
            table_refresh_timeout: Duration::ZERO,
            ..base()
        };
        assert_eq!(field_of(o.validate()), "table_refresh_timeout");

        let r = ReminderOptions {
            loading_window: Duration::from_secs(1),
            ..ReminderOptions::default()
        };
        assert_eq!(field_of(r.validate()), "loading_window");
        let r = ReminderOptions {
            ring_points_per_silo: 0,
            ..ReminderOptions::default()
        };
        assert_eq!(field_of(r.validate()), "ring_points_per_silo");
        let r = ReminderOptions {
            max_deliveries: 0,
            ..ReminderOptions::default()
        };
        assert_eq!(field_of(r.validate()), "max_deliveries");
    }
}

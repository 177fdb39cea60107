//! The silo's membership state machine: the whole protocol of one silo, sans-io.
//!
//! [`SiloMachine::handle`] takes one [`Event`] (a timer, a table result, a probe
//! result, gossip, a call from the application) with the current time and returns
//! the [`Action`]s to carry out (read the table, write a row, send a ping, publish a
//! snapshot, schedule a timer, stop). Randomness (backoff jitter, the choice of an
//! indirect-probe intermediary) comes from an RNG seeded at construction, so a run is
//! a function of its seed and its inputs. The actix agents only execute the actions
//! and feed the results back (pattern: `foca`'s `Foca::handle_*` + `Runtime`).
//!
//! What it holds and bounds:
//! - the **view** (newest snapshot read; a read older than the view is ignored), its
//!   publication, and the self-Dead check (a silo that reads itself Dead stops);
//! - **refreshes**, coalesced by [`Refresher`] (one read in flight, one pending);
//! - **writes**, one job at a time ([`MAX_QUEUED_JOBS`] queued at most): the join,
//!   own-status changes, and votes, **one job per suspect** (repeated suspicions
//!   merge). A job reads, plans, writes conditionally, and on a conflict or error
//!   retries after a jittered backoff **timer**: nothing ever waits in a loop;
//! - the **join**: older generations Dead, own row inserted, connectivity validated
//!   against every Active silo until `max_join_attempt_time`, then Active;
//! - **probing**: one [`ProbeCycle`] per target chosen by [`TargetSelector`];
//! - **local health**, IAmAlive, defunct cleanup, gossip after each write;
//! - **leaving**: ShuttingDown (or Stopping) then Dead, bounded by `shutdown_timeout`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::{
    ClusterMembershipOptions, CorruptRow, Error, Etag, MembershipDelta, MembershipEntry, MembershipRows,
    MembershipSnapshot, ProtocolMode, RowChange, SiloAddress, SiloError, SiloStatus, SuspectVote,
    TableVersion, Timestamp, WriteMode, WriteOrigin,
};

use super::cleanup::{defunct_cutoff, lost_row_grace};
use super::health::{local_health_score, HealthInputs};
use super::join::{plan_join, JoinPlan};
use super::probe::{IndirectOutcome, PingOutcome, ProbeCycle, SuspectReason, Verdict};
use super::reach::{is_majority, Reach};
use super::refresh::Refresher;
use super::targets::{is_monitored, TargetSelector};
use super::votes::{active_non_stale_silos, decide_vote, fresh_votes, VoteDecision};
use super::{backoff_delay, is_stuck_joining};

/// Write jobs queued at most (besides the one running); a vote beyond that is dropped
/// with a warning (the next probe window suspects again).
pub const MAX_QUEUED_JOBS: usize = 256;
/// Attempts of one write job before it gives up.
pub const MAX_WRITE_ATTEMPTS: u32 = 30;
/// A retried join or own-status job reads the whole table on every this-many-th
/// attempt (other attempts read a delta): a conflict means another writer committed,
/// which a delta shows; only a row removed by the defunct cleanup needs a full read.
const FULL_READ_EVERY: u32 = 8;
/// Base of the backoff between conflicting write attempts: attempt `n` waits a
/// random time in `[0, min(BACKOFF_CAP, BACKOFF_BASE x 2^n)]` (see
/// [`backoff_delay`]).
pub const BACKOFF_BASE: Duration = Duration::from_millis(10);
/// Cap of the backoff between conflicting write attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// A timer the machine asked for with [`Action::Schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// Probe period: send the next pings.
    ProbeTick,
    /// `table_refresh_timeout`: the periodic full read.
    Refresh,
    /// A failed refresh is retried.
    RefreshRetry,
    /// `i_am_alive_publish_period`.
    IAmAlive,
    /// `defunct_silo_cleanup_period`.
    Cleanup,
    /// `local_health_monitoring_period`; the executor answers it with
    /// [`Event::HealthCheck`].
    HealthCheck,
    /// The backoff of write attempt `n` is over.
    WriteRetry(u64),
    /// Next round of join connectivity validation.
    JoinRetry,
    /// `shutdown_timeout` is over.
    ShutdownDeadline,
    /// The gossip-triggered read that waited for [`gossip_refresh_interval`] starts.
    GossipRefresh,
}

/// How many of `n` other silos one write's gossip goes to:
/// `max_gossip_fan_out`, or by default `3 + ceil(log2 n)` (all of them up to 5).
/// The same default bounds a joiner's connectivity validation sample
/// (`max_join_validation_probes`).
pub fn gossip_fan_out(options: &ClusterMembershipOptions, n: usize) -> usize {
    options
        .max_gossip_fan_out
        .map_or_else(|| log_fan_out(n), |k| k as usize)
}

/// `3 + ceil(log2 n)`: the default size of gossip fan-outs and validation samples.
fn log_fan_out(n: usize) -> usize {
    3 + n.max(1).next_power_of_two().trailing_zeros() as usize
}

/// The shortest time between two table reads triggered by gossip (or by a probe
/// that carried a newer version) while changes matter (deaths, votes, leaving
/// silos) and after a quiet period: `probe_timeout / 20` (250 ms by default).
/// Gossip arriving sooner is served by the next read, so a flood of gossip frames,
/// forged or real, costs at most one read per interval (plus the coalesced
/// in-flight one), while a real change still reaches this silo well within one
/// probe period. While reads show nothing but joins the interval grows, up to
/// [`gossip_refresh_interval_cap`].
pub fn gossip_refresh_interval(options: &ClusterMembershipOptions) -> Duration {
    options.probe_timeout / 20
}

/// The longest time between two gossip-triggered reads: one probe period
/// (`probe_timeout / 2`, 2.5 s by default). Reached during a long join storm,
/// whose changes (rows inserted Joining, joiners turning Active) nothing waits on:
/// a silo's view of the joiners then lags by at most this. The interval is half of
/// how long reads have shown nothing but joins, between
/// [`gossip_refresh_interval`] and this cap: a storm of well under a second is read
/// as before, and over a storm of `T` a silo reads about `2 + 2 ln(T / 0.5 s)`
/// times in its first 5 s, then once per cap. At the base interval every silo
/// would read 4 times a second for the whole storm, and a storm of N joins lasts
/// O(N) (its 2N commits are serialized at the version row): measured, 19 of the 45
/// table calls per join of a 1,000-silo storm. The first read that shows a death,
/// a vote or a silo leaving goes back to [`gossip_refresh_interval`].
pub fn gossip_refresh_interval_cap(options: &ClusterMembershipOptions) -> Duration {
    options.probe_period()
}

/// What a new view changed, for the gossip-refresh interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Churn {
    /// Nothing the protocol waits on: rows inserted, joiners moving to Active.
    Joins,
    /// A change worth reading soon: a death, a vote, a silo leaving, or a row
    /// removed while not Dead (the defunct cleanup removes Dead rows only).
    Urgent,
}

/// Classifies the changes from `old` to `new` (the rows' diff skips the subtrees both share,
/// so a delta merged onto the view costs its changed rows). This silo's own row is
/// no exception: a vote against it or its death is urgent by the same rule, and
/// its IAmAlive time changing is not.
fn churn(old: &MembershipRows, new: &MembershipRows) -> Churn {
    let calm = |e: &MembershipEntry| {
        e.suspect_votes.is_empty()
            && matches!(
                e.status,
                SiloStatus::Created | SiloStatus::Joining | SiloStatus::Active
            )
    };
    for change in old.changes(new) {
        let ok = match change {
            RowChange::Added(row) | RowChange::Updated { new: row, .. } => calm(&row.entry),
            RowChange::Removed(row) => row.entry.status == SiloStatus::Dead,
        };
        if !ok {
            return Churn::Urgent;
        }
    }
    Churn::Joins
}

/// An input of the machine.
#[derive(Debug)]
pub enum Event {
    /// Begin the join.
    Start,
    /// A scheduled timer fired.
    Timer(Timer),
    /// A table read asked for with [`Action::ReadTable`] finished.
    TableRead {
        /// The read's id.
        id: u64,
        /// The snapshot, or why the read failed (or timed out).
        result: Result<MembershipSnapshot, Error>,
    },
    /// A delta read asked for with [`Action::ReadDelta`] finished.
    DeltaRead {
        /// The read's id.
        id: u64,
        /// The rows written after the version asked for, or why not.
        result: Result<MembershipDelta, Error>,
    },
    /// A row write asked for with [`Action::WriteRow`] finished.
    RowWritten {
        /// The write's id.
        id: u64,
        /// `Ok(true)` committed, `Ok(false)` conflict, `Err` failed or timed out.
        result: Result<bool, Error>,
    },
    /// The IAmAlive write finished.
    IAmAliveWritten(Result<(), Error>),
    /// The defunct cleanup finished (rows removed).
    CleanupDone(Result<usize, Error>),
    /// A ping asked for with [`Action::Ping`] finished.
    PingResult {
        /// The pinged silo.
        target: SiloAddress,
        /// The ping's sequence number.
        seq: u64,
        /// What happened.
        outcome: PingOutcome,
        /// The table version the target's answer carried, if it answered.
        peer_version: Option<u64>,
    },
    /// An indirect probe asked for with [`Action::IndirectPing`] finished.
    IndirectResult {
        /// The suspect.
        target: SiloAddress,
        /// The probe's sequence number.
        seq: u64,
        /// What the intermediary said.
        outcome: IndirectOutcome,
    },
    /// A peer gossiped "the table is at `version` now".
    GossipReceived {
        /// The peer's table version.
        version: u64,
    },
    /// The health timer fired; pings this silo received since the last check.
    HealthCheck {
        /// Pings received from other silos.
        probes_received: u32,
    },
    /// The application asked for a fresh read ([`Action::AnswerRefresh`] answers).
    Refresh {
        /// The caller's request id.
        request: u64,
    },
    /// This silo's clock crossed the cluster's bound (see
    /// [`ClockReport`](super::ClockReport)): `beyond` true when it is now beyond
    /// half of `max_clock_offset` from the median of its peers' clocks, false when
    /// back within. The machine says so in its own row
    /// ([`MembershipEntry::clock_beyond_bound`]) with a conditional write, so
    /// every silo's ring leaves it out (or takes it back) at the next view; the
    /// newest crossing wins when several arrive before the write commits.
    ClockBound {
        /// Beyond the bound now.
        beyond: bool,
    },
    /// The application asked the silo to leave ([`Action::AnswerShutdown`] answers).
    Shutdown {
        /// The caller's request id.
        request: u64,
        /// ShuttingDown (true) or Stopping (false) before Dead.
        graceful: bool,
    },
}

/// One conditional row write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowWrite {
    /// `insert_row`.
    Insert(MembershipEntry),
    /// `update_row` conditioned on the etag.
    Update(MembershipEntry, Etag),
}

impl RowWrite {
    /// The row to write.
    pub fn entry(&self) -> &MembershipEntry {
        match self {
            RowWrite::Insert(e) | RowWrite::Update(e, _) => e,
        }
    }

    /// The precondition, as [`MembershipTable::write_row`](crate::MembershipTable::write_row) takes it.
    pub fn mode(&self) -> WriteMode<'_> {
        match self {
            RowWrite::Insert(_) => WriteMode::Insert,
            RowWrite::Update(_, etag) => WriteMode::Update(etag),
        }
    }

    /// The table method this write calls (`"insert_row"` or `"update_row"`).
    pub fn method(&self) -> &'static str {
        self.mode().method()
    }
}

/// Why the silo stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The cluster declared this silo Dead (or removed its row).
    DeclaredDead,
    /// It left on request ([`Event::Shutdown`]).
    Left,
    /// Its join failed.
    JoinFailed,
}

/// An output of the machine, for the executor to carry out.
#[derive(Debug)]
pub enum Action {
    /// `read_all()`; answer with [`Event::TableRead`].
    ReadTable {
        /// The read's id.
        id: u64,
    },
    /// `read_delta(since)`; answer with [`Event::DeltaRead`]. Used for refreshes
    /// that gossip, writes and calls trigger, and for the reads of the join and
    /// own-status write jobs; the periodic refresh, votes and retried jobs read the
    /// whole table.
    ReadDelta {
        /// Read id, echoed in the event.
        id: u64,
        /// The version row of the view the delta applies to.
        since: TableVersion,
    },
    /// A conditional write with the version row set to `next_version`; answer with
    /// [`Event::RowWritten`].
    WriteRow {
        /// The write's id.
        id: u64,
        /// The row.
        write: RowWrite,
        /// The version row to write with it.
        next_version: TableVersion,
        /// This silo and its clock's time when it planned the write (for the history).
        origin: WriteOrigin,
        /// True when the write is a suspicion (a vote or a declaration of death in
        /// another silo's row), for the counters and the vote-latency metric.
        vote: bool,
    },
    /// `update_i_am_alive(me, time)`; answer with [`Event::IAmAliveWritten`].
    WriteIAmAlive {
        /// The IAmAlive time.
        time: Timestamp,
    },
    /// `cleanup_defunct(before)`; answer with [`Event::CleanupDone`].
    CleanupDefunct {
        /// The cutoff.
        before: Timestamp,
    },
    /// Ping `target` within `timeout`; answer with [`Event::PingResult`].
    Ping {
        /// The silo to ping.
        target: SiloAddress,
        /// Sequence number to echo.
        seq: u64,
        /// How long to wait.
        timeout: Duration,
    },
    /// Ask `via` to ping `target`; answer with [`Event::IndirectResult`].
    IndirectPing {
        /// The intermediary.
        via: SiloAddress,
        /// The suspect.
        target: SiloAddress,
        /// Sequence number to echo.
        seq: u64,
        /// How long to wait for the intermediary.
        timeout: Duration,
        /// How long the intermediary may try the suspect
        /// ([`intermediary_timeout`](super::probe::intermediary_timeout) of `timeout`).
        intermediary_timeout: Duration,
    },
    /// Send "re-read the table, now at `version`" to these silos (fire and forget).
    Gossip {
        /// Recipients.
        to: Vec<SiloAddress>,
        /// The version after our write.
        version: u64,
    },
    /// A snapshot was read; `new_version` when subscribers must hear of it (a new
    /// table version, or in basic mode new content).
    Publish {
        /// The newest view (shared: publishing a view costs no copy of its rows).
        snapshot: Arc<MembershipSnapshot>,
        /// Whether it is a new version.
        new_version: bool,
    },
    /// This silo's own status changed.
    SetStatus(SiloStatus),
    /// This silo's local health score changed (0..=8).
    SetHealthScore(u8),
    /// Deliver `timer` after `after`.
    Schedule {
        /// Which timer.
        timer: Timer,
        /// When, from now.
        after: Duration,
    },
    /// The join ended: Active (`Ok`) or failed.
    JoinFinished(Result<(), SiloError>),
    /// Answer to [`Event::Refresh`]: the newest view after a read that started after
    /// the request, or why it failed.
    AnswerRefresh {
        /// The request id.
        request: u64,
        /// The result.
        result: Result<MembershipSnapshot, SiloError>,
    },
    /// Answer to [`Event::Shutdown`].
    AnswerShutdown {
        /// The request id.
        request: u64,
        /// `Err` when the leaving writes failed or did not finish in time (the silo
        /// stops anyway).
        result: Result<(), SiloError>,
    },
    /// Stop every agent and the probe endpoint. The last action.
    Stop(StopReason),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Job {
    Join,
    OwnStatus(SiloStatus),
    /// Write `own_row.clock_beyond_bound` (as it is when the job plans) into our row.
    OwnClock,
    Vote {
        suspect: SiloAddress,
        intermediary: Option<SiloAddress>,
        reason: SuspectReason,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobPhase {
    Reading(u64),
    Writing { id: u64, completes: bool, version: u64 },
    Backoff(u64),
}

#[derive(Debug)]
struct Running {
    job: Job,
    attempt: u32,
    phase: JobPhase,
}

#[derive(Debug)]
enum Plan {
    /// Write this; `true` when the job is done once it commits.
    Write(RowWrite, bool),
    Done,
    /// A vote on probe evidence, but this silo reaches no majority of the active
    /// silos of the fresh read ([`super::reach`]): no write.
    NoMajority {
        suspect: SiloAddress,
        reached: usize,
        active: usize,
    },
    Abort(SiloError),
}

#[derive(Debug, Default)]
struct Validation {
    started: Option<Timestamp>,
    outstanding: BTreeMap<u64, SiloAddress>,
    unreachable: Vec<SiloAddress>,
    awaiting_refresh: bool,
}

#[derive(Debug)]
enum Lifecycle {
    Created,
    /// Job::Join runs: older generations Dead, own row inserted.
    JoiningTable,
    Validating(Validation),
    /// OwnStatus(Active) runs.
    Activating,
    Active,
    /// Leaving: the leaving status, then Dead, then one final read.
    Leaving {
        requests: Vec<u64>,
        leaving: SiloStatus,
        error: Option<SiloError>,
        final_read: bool,
    },
    /// The join failed: writing our row Dead before reporting `error`.
    FailingJoin(Option<SiloError>),
    Stopped,
}

/// The state machine of one silo. See the [module docs](self).
#[derive(Debug)]
pub struct SiloMachine {
    cluster: String,
    me: SiloAddress,
    options: ClusterMembershipOptions,
    own_row: MembershipEntry,
    rng: StdRng,
    next_id: u64,
    status: SiloStatus,
    lifecycle: Lifecycle,
    view: Arc<MembershipSnapshot>,
    has_view: bool,
    refresher: Refresher,
    refresh_retry_scheduled: bool,
    queue: VecDeque<Job>,
    running: Option<Running>,
    probes: BTreeMap<SiloAddress, ProbeCycle>,
    /// Probe target selection, with its ring positions and picks cached.
    targets: TargetSelector,
    health: u8,
    probes_sent: u32,
    probes_answered: u32,
    last_health_check: Option<Timestamp>,
    /// Whom this silo reaches, and the reach round in progress ([`super::reach`]).
    reach: Reach,
    /// The last reach round found no majority: this silo is probably the one cut
    /// off (raises the local health score until a majority is seen again).
    cut_off: bool,
    alive_in_flight: bool,
    /// The newest sign of life our own row carried when we last read it (non-Dead).
    /// An IAmAlive write is no proof: it is a no-op on a missing row.
    own_alive_mark: Option<Timestamp>,
    /// The highest table version known (read, or committed by us).
    known_version: u64,
    /// Per read in flight: `known_version` when it was issued. A linearizable table
    /// never answers such a read with a lower version, unless it lost data.
    read_floors: BTreeMap<u64, u64>,
    /// The next refresh reads the whole table (periodic refresh, a failed read, no
    /// view yet): IAmAlive ages and removed rows are not in deltas.
    full_read_due: bool,
    /// The corrupt rows of the last read, logged once per change.
    corrupt_logged: Vec<CorruptRow>,
    cleanup_in_flight: bool,
    /// When the last gossip-triggered read was asked for.
    gossip_read_at: Option<Timestamp>,
    /// A [`Timer::GossipRefresh`] is scheduled.
    gossip_read_scheduled: bool,
    /// Since when reads have shown joins only, with no pause longer than
    /// [`gossip_refresh_interval_cap`] (`None`: the last change was urgent, or there
    /// was such a pause); see [`SiloMachine::gossip_interval`].
    joins_since: Option<Timestamp>,
    /// When a read last showed a new version.
    last_change_at: Option<Timestamp>,
    /// The time of the event being handled.
    now: Timestamp,
    out: Vec<Action>,
}

impl SiloMachine {
    /// A machine for silo `me` of `cluster`; `own_row` holds the columns of its row
    /// (names, zones, start time); `seed` seeds its RNG.
    pub fn new(
        cluster: impl Into<String>,
        me: SiloAddress,
        own_row: MembershipEntry,
        options: ClusterMembershipOptions,
        seed: u64,
    ) -> Self {
        SiloMachine {
            cluster: cluster.into(),
            me,
            options,
            own_row,
            rng: StdRng::seed_from_u64(seed),
            next_id: 1,
            status: SiloStatus::Created,
            lifecycle: Lifecycle::Created,
            view: Arc::default(),
            has_view: false,
            refresher: Refresher::default(),
            refresh_retry_scheduled: false,
            queue: VecDeque::new(),
            running: None,
            probes: BTreeMap::new(),
            targets: TargetSelector::default(),
            health: 0,
            probes_sent: 0,
            probes_answered: 0,
            last_health_check: None,
            reach: Reach::default(),
            cut_off: false,
            alive_in_flight: false,
            own_alive_mark: None,
            known_version: 0,
            read_floors: BTreeMap::new(),
            corrupt_logged: Vec::new(),
            full_read_due: true,
            cleanup_in_flight: false,
            gossip_read_at: None,
            gossip_read_scheduled: false,
            joins_since: None,
            last_change_at: None,
            now: Timestamp::EPOCH,
            out: Vec::new(),
        }
    }

    /// The table version of this silo's view (0 before the first read): what its
    /// pings and pongs carry.
    pub fn view_version(&self) -> u64 {
        self.view.version.version
    }

    /// This silo's own status.
    pub fn status(&self) -> SiloStatus {
        self.status
    }

    /// Write jobs queued or running (bounded by [`MAX_QUEUED_JOBS`] + 1).
    pub fn pending_writes(&self) -> usize {
        self.queue.len() + usize::from(self.running.is_some())
    }

    /// True once the machine has emitted [`Action::Stop`].
    pub fn is_stopped(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Stopped)
    }

    fn mode(&self) -> ProtocolMode {
        self.options.protocol_mode()
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn schedule(&mut self, timer: Timer, after: Duration) {
        self.out.push(Action::Schedule { timer, after });
    }

    fn set_status(&mut self, status: SiloStatus) {
        if self.status != status {
            self.status = status;
            self.out.push(Action::SetStatus(status));
        }
    }

    /// Feeds one event at `now`; returns what to do.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Vec<Action> {
        self.now = now;
        if self.is_stopped() {
            match event {
                Event::Refresh { request } => self.out.push(Action::AnswerRefresh {
                    request,
                    result: Err(SiloError::Stopped),
                }),
                Event::Shutdown { request, .. } => self.out.push(Action::AnswerShutdown {
                    request,
                    result: Ok(()),
                }),
                _ => {}
            }
            return std::mem::take(&mut self.out);
        }
        match event {
            Event::Start => self.start(),
            Event::Timer(timer) => self.on_timer(now, timer),
            Event::TableRead { id, result } => self.on_read(now, id, result),
            Event::DeltaRead { id, result } => {
                let result = result.map(|d| d.merged_onto(&self.view));
                self.on_read(now, id, result)
            }
            Event::RowWritten { id, result } => self.on_written(id, result),
            Event::IAmAliveWritten(result) => {
                self.alive_in_flight = false;
                if let Err(e) = result {
                    tracing::warn!(cluster = %self.cluster, silo = %self.me, error = %e, "IAmAlive write failed");
                }
            }
            Event::CleanupDone(result) => {
                self.cleanup_in_flight = false;
                match result {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(cluster = %self.cluster, silo = %self.me, removed = n, "defunct silo rows removed")
                    }
                    Err(e) => {
                        tracing::warn!(cluster = %self.cluster, silo = %self.me, error = %e, "defunct cleanup failed")
                    }
                }
            }
            Event::PingResult {
                target,
                seq,
                outcome,
                peer_version,
            } => {
                // The version spreads with the probes: a peer that has read a newer
                // table than ours makes us refresh (coalesced like gossip).
                if let Some(v) = peer_version {
                    if self.mode() == ProtocolMode::Extended && self.has_view && v > self.view.version.version
                    {
                        self.gossip_refresh(now);
                    }
                }
                self.reach
                    .record(target, now, matches!(outcome, PingOutcome::Answered { .. }));
                if self.reach.on_round_result(seq, &target) {
                    self.reach_round_progress(now)
                } else {
                    self.on_ping(now, target, seq, outcome)
                }
            }
            Event::IndirectResult { target, seq, outcome } => {
                if let Some(cycle) = self.probes.get_mut(&target) {
                    cycle.on_indirect(seq, outcome);
                }
            }
            Event::GossipReceived { version } => {
                if self.mode() == ProtocolMode::Basic || version > self.view.version.version {
                    self.gossip_refresh(now);
                }
            }
            Event::HealthCheck { probes_received } => self.on_health_check(now, probes_received),
            Event::Refresh { request } => self.refresh(Some(request)),
            Event::Shutdown { request, graceful } => self.shutdown(request, graceful),
            Event::ClockBound { beyond } => self.clock_bound(beyond),
        }
        std::mem::take(&mut self.out)
    }

    // ---- lifecycle -------------------------------------------------------------

    fn start(&mut self) {
        if !matches!(self.lifecycle, Lifecycle::Created) {
            return;
        }
        tracing::info!(cluster = %self.cluster, silo = %self.me, "joining");
        self.set_status(SiloStatus::Joining);
        self.lifecycle = Lifecycle::JoiningTable;
        let o = &self.options;
        let timers = [
            (Timer::Refresh, o.table_refresh_timeout),
            (Timer::IAmAlive, o.i_am_alive_publish_period),
            (Timer::Cleanup, o.defunct_silo_cleanup_period),
            (Timer::HealthCheck, o.local_health_monitoring_period),
        ];
        for (timer, after) in timers {
            self.schedule(timer, after);
        }
        self.enqueue(Job::Join);
    }

    fn joining(&self) -> bool {
        matches!(
            self.lifecycle,
            Lifecycle::JoiningTable | Lifecycle::Validating(_) | Lifecycle::Activating
        )
    }

    fn stop(&mut self, reason: StopReason) {
        self.lifecycle = Lifecycle::Stopped;
        self.probes.clear();
        self.queue.clear();
        self.running = None;
        self.out.push(Action::Stop(reason));
    }

    fn join_failed(&mut self, error: SiloError) {
        tracing::error!(cluster = %self.cluster, silo = %self.me, error = %error, "join failed");
        if matches!(error, SiloError::Superseded { .. } | SiloError::DeclaredDead) {
            self.set_status(SiloStatus::Dead);
            self.out.push(Action::JoinFinished(Err(error)));
            self.stop(StopReason::JoinFailed);
        } else {
            self.lifecycle = Lifecycle::FailingJoin(Some(error));
            self.enqueue(Job::OwnStatus(SiloStatus::Dead));
        }
    }

    fn declared_dead(&mut self) {
        let voters: Vec<String> = self
            .view
            .entry(&self.me)
            .map(|e| e.suspect_votes.iter().map(|v| v.silo.to_string()).collect())
            .unwrap_or_default();
        tracing::error!(
            cluster = %self.cluster, silo = %self.me, ?voters, version = self.view.version.version,
            "this silo was declared Dead by the cluster; stopping"
        );
        if self.joining() {
            self.out.push(Action::JoinFinished(Err(SiloError::DeclaredDead)));
        }
        self.set_status(SiloStatus::Dead);
        self.stop(StopReason::DeclaredDead);
    }

    fn shutdown(&mut self, request: u64, graceful: bool) {
        if let Lifecycle::Leaving { requests, .. } = &mut self.lifecycle {
            requests.push(request);
            return;
        }
        if self.joining() || matches!(self.lifecycle, Lifecycle::FailingJoin(_)) {
            let error = match &mut self.lifecycle {
                Lifecycle::FailingJoin(e) => e.take(),
                _ => None,
            };
            self.out
                .push(Action::JoinFinished(Err(error.unwrap_or(SiloError::Stopped))));
        }
        let leaving = if graceful {
            SiloStatus::ShuttingDown
        } else {
            SiloStatus::Stopping
        };
        tracing::info!(cluster = %self.cluster, silo = %self.me, to = %leaving, "leaving");
        self.set_status(leaving);
        self.probes.clear();
        // Votes and join steps are moot now; a write already sent must finish first.
        self.queue.clear();
        if self
            .running
            .as_ref()
            .is_some_and(|r| !matches!(r.phase, JobPhase::Writing { .. }))
        {
            self.running = None;
        }
        self.lifecycle = Lifecycle::Leaving {
            requests: vec![request],
            leaving,
            error: None,
            final_read: false,
        };
        self.schedule(Timer::ShutdownDeadline, self.options.shutdown_timeout);
        self.enqueue(Job::OwnStatus(leaving));
    }

    fn finish_leaving(&mut self, timed_out: bool) {
        let Lifecycle::Leaving { requests, error, .. } =
            std::mem::replace(&mut self.lifecycle, Lifecycle::Stopped)
        else {
            return;
        };
        let mut error = error;
        if timed_out {
            tracing::warn!(cluster = %self.cluster, silo = %self.me, timeout = ?self.options.shutdown_timeout,
                "leaving: the table did not take our last writes in time; stopping anyway");
            error.get_or_insert(SiloError::Timeout(self.options.shutdown_timeout));
        }
        self.set_status(SiloStatus::Dead);
        let n = requests.len();
        for (i, request) in requests.into_iter().enumerate() {
            let result = match &error {
                None => Ok(()),
                Some(e) if i + 1 < n => Err(SiloError::Table(Error::backend(e.to_string()))),
                Some(_) => Err(error.take().unwrap_or(SiloError::Stopped)),
            };
            self.out.push(Action::AnswerShutdown { request, result });
        }
        self.stop(StopReason::Left);
    }

    // ---- timers ------------------------------------------------------------------

    fn on_timer(&mut self, now: Timestamp, timer: Timer) {
        let o = &self.options;
        match timer {
            Timer::Refresh => {
                let p = o.table_refresh_timeout;
                self.schedule(Timer::Refresh, p);
                self.full_read_due = true;
                self.refresh(None);
            }
            Timer::RefreshRetry => {
                self.refresh_retry_scheduled = false;
                self.full_read_due = true;
                self.refresh(None);
            }
            Timer::IAmAlive => {
                let p = o.i_am_alive_publish_period;
                self.schedule(Timer::IAmAlive, p);
                if matches!(self.status, SiloStatus::Joining | SiloStatus::Active) && !self.alive_in_flight {
                    self.alive_in_flight = true;
                    self.out.push(Action::WriteIAmAlive { time: now });
                }
            }
            Timer::Cleanup => {
                let p = o.defunct_silo_cleanup_period;
                self.schedule(Timer::Cleanup, p);
                if self.status == SiloStatus::Active && !self.cleanup_in_flight {
                    if let Some(before) = defunct_cutoff(&self.me, &self.view, now, &self.options) {
                        self.cleanup_in_flight = true;
                        self.out.push(Action::CleanupDefunct { before });
                    }
                }
            }
            Timer::HealthCheck => {} // the executor answers with Event::HealthCheck
            Timer::ProbeTick => self.probe_tick(now),
            Timer::WriteRetry(n) => {
                if self
                    .running
                    .as_ref()
                    .is_some_and(|r| r.phase == JobPhase::Backoff(n))
                {
                    self.read_for_job();
                }
            }
            Timer::JoinRetry => {
                if let Lifecycle::Validating(v) = &mut self.lifecycle {
                    v.awaiting_refresh = true;
                    self.refresh(None);
                }
            }
            Timer::GossipRefresh => {
                self.gossip_read_scheduled = false;
                self.gossip_read_at = Some(now);
                self.refresh(None);
            }
            Timer::ShutdownDeadline => {
                if matches!(self.lifecycle, Lifecycle::Leaving { .. }) {
                    self.finish_leaving(true);
                }
            }
        }
    }

    fn on_health_check(&mut self, now: Timestamp, probes_received: u32) {
        let period = self.options.local_health_monitoring_period;
        self.schedule(Timer::HealthCheck, period);
        // Forget the reach of silos that left the view (restarts add generations).
        let view = Arc::clone(&self.view);
        self.reach.retain(|s| view.entries.contains(s));
        let lateness = match self.last_health_check {
            Some(last) => now.saturating_duration_since(last.saturating_add(period)),
            None => Duration::ZERO,
        };
        self.last_health_check = Some(now);
        let suspected = self
            .view
            .entry(&self.me)
            .is_some_and(|e| !fresh_votes(e, now, &self.options).is_empty());
        let inputs = HealthInputs {
            probes_sent: std::mem::take(&mut self.probes_sent),
            probes_answered: std::mem::take(&mut self.probes_answered),
            probes_received,
            expecting_probes: self.status == SiloStatus::Active
                && self.view.active().any(|e| e.silo != self.me),
            suspected,
            cut_off: self.cut_off,
            event_loop_delay: lateness.min(Duration::from_secs(3600)),
        };
        let score = local_health_score(&inputs);
        if score != self.health {
            tracing::info!(cluster = %self.cluster, silo = %self.me, score, ?inputs, "local health score changed");
            self.health = score;
            self.out.push(Action::SetHealthScore(score));
        }
    }

    // ---- the view ------------------------------------------------------------------

    /// The shortest time between gossip-triggered reads now: half of how long
    /// reads have shown nothing but joins, within [`gossip_refresh_interval`] ..=
    /// [`gossip_refresh_interval_cap`]. A short storm (tens of silos, well under a
    /// second) is read at the base interval; a long one ever more sparsely, up to
    /// the cap: over a storm of `T` a silo reads about `2 + 2 ln(T / 0.5 s)` times
    /// until the cap (2.5 s by default, reached 5 s in), then once per cap.
    fn gossip_interval(&self, now: Timestamp) -> Duration {
        let base = gossip_refresh_interval(&self.options);
        match self.joins_since {
            None => base,
            Some(t) => (now.saturating_duration_since(t) / 2)
                .clamp(base, gossip_refresh_interval_cap(&self.options).max(base)),
        }
    }

    /// A read because gossip said the table changed, at most one per
    /// [`SiloMachine::gossip_interval`].
    fn gossip_refresh(&mut self, now: Timestamp) {
        if self.gossip_read_scheduled {
            return; // the scheduled read will serve this gossip too
        }
        let interval = self.gossip_interval(now);
        let since = self.gossip_read_at.map(|t| now.saturating_duration_since(t));
        match since {
            Some(since) if since < interval => {
                self.gossip_read_scheduled = true;
                self.schedule(Timer::GossipRefresh, interval - since);
            }
            _ => {
                self.gossip_read_at = Some(now);
                self.refresh(None);
            }
        }
    }

    fn refresh(&mut self, waiter: Option<u64>) {
        let id = self.id();
        if let Some(id) = self.refresher.request(waiter, id) {
            self.read_table(id, false);
        }
    }

    /// Starts table read `id` (whole table if `full`, or if a full read is due;
    /// else a delta from the view's version), remembering the version it must not
    /// fall below.
    fn read_table(&mut self, id: u64, full: bool) {
        // At most one refresh and one job read are in flight; stale entries (a result
        // that never came) are dropped rather than kept forever.
        while self.read_floors.len() >= 8 {
            self.read_floors.pop_first();
        }
        self.read_floors.insert(id, self.known_version);
        let delta = !full && !self.full_read_due && self.has_view && self.mode() == ProtocolMode::Extended;
        if delta {
            let since = self.view.version.clone();
            self.out.push(Action::ReadDelta { id, since });
        } else {
            self.full_read_due = false;
            self.out.push(Action::ReadTable { id });
        }
    }

    fn mark_alive(&mut self, t: Timestamp) {
        self.own_alive_mark = Some(self.own_alive_mark.map_or(t, |m| m.max(t)));
    }

    /// Takes a snapshot read from the table: keeps the newest, publishes it, and
    /// checks whether we have been declared dead. `floor` is the version known when
    /// the read was issued.
    fn apply(&mut self, now: Timestamp, snap: MembershipSnapshot, floor: u64) {
        let extended = self.mode() == ProtocolMode::Extended;
        self.log_corrupt(&snap);
        if extended && self.has_view && snap.version.version < self.view.version.version {
            if snap.version.version >= floor {
                return; // an older read that raced a newer one
            }
            // Issued after we knew `floor`, answered with less: the table went
            // backwards (restored from an old backup, restarted empty, deleted).
            tracing::error!(
                cluster = %self.cluster, silo = %self.me, read = snap.version.version, known = floor,
                "the membership table went backwards: it lost committed writes; taking its view and \
                 re-registering this silo if its row is gone"
            );
            self.known_version = snap.version.version;
            Arc::make_mut(&mut self.view).version.version = 0; // so the view below counts as new
        }
        if extended {
            self.known_version = self.known_version.max(snap.version.version);
        }
        if let Some(own) = snap.entry(&self.me) {
            if own.status != SiloStatus::Dead {
                self.mark_alive(own.last_alive());
            }
        }
        let new_version = !self.has_view
            || if extended {
                snap.version.version > self.view.version.version
            } else {
                content_changed(&self.view, &snap)
            };
        if self.has_view && new_version {
            match churn(&self.view.entries, &snap.entries) {
                Churn::Urgent => self.joins_since = None,
                Churn::Joins => {
                    let paused = self.last_change_at.is_none_or(|t| {
                        now.saturating_duration_since(t) > gossip_refresh_interval_cap(&self.options)
                    });
                    if paused || self.joins_since.is_none() {
                        self.joins_since = Some(now);
                    }
                }
            }
            self.last_change_at = Some(now);
        }
        self.view = Arc::new(snap);
        self.has_view = true;
        self.out.push(Action::Publish {
            snapshot: self.view.clone(),
            new_version,
        });
        if self.check_self() && new_version {
            self.update_targets(now, false);
        }
    }

    /// Logs the corrupt rows of a read, once per change of the set (not per read).
    fn log_corrupt(&mut self, snap: &MembershipSnapshot) {
        if snap.corrupt == self.corrupt_logged {
            return;
        }
        for row in snap.corrupt.iter().filter(|r| !self.corrupt_logged.contains(r)) {
            tracing::error!(cluster = %self.cluster, silo = %self.me, key = %row.key, reason = %row.reason,
                "corrupt membership row ignored (the rest of the table is used)");
        }
        if snap.corrupt.is_empty() {
            tracing::info!(cluster = %self.cluster, silo = %self.me, "no corrupt membership rows any more");
        }
        self.corrupt_logged = snap.corrupt.clone();
    }

    /// Whether our own row, missing from the table, was lost by the table rather than
    /// deleted by the defunct cleanup: we read it alive less than
    /// [`lost_row_grace`] ago, and the cleanup never deletes such a row.
    fn own_row_was_lost(&self, now: Timestamp) -> bool {
        self.own_alive_mark
            .is_some_and(|m| now.saturating_duration_since(m) < lost_row_grace(&self.options))
    }

    /// Perfect failure detection: a silo that reads itself Dead stops. A missing own
    /// row means the same, unless the table lost it (see `own_row_was_lost`): then the
    /// silo writes its row again. False once stopped.
    fn check_self(&mut self) -> bool {
        if !matches!(self.status, SiloStatus::Joining | SiloStatus::Active) {
            return true;
        }
        let declared = match self.view.entry(&self.me) {
            Some(e) => e.status == SiloStatus::Dead,
            None if self.status != SiloStatus::Active => false,
            None if self.own_row_was_lost(self.now) => {
                self.reregister();
                false
            }
            None => true,
        };
        if declared {
            self.declared_dead();
            return false;
        }
        true
    }

    fn on_read(&mut self, now: Timestamp, id: u64, result: Result<MembershipSnapshot, Error>) {
        let floor = self.read_floors.remove(&id).unwrap_or(0);
        if let Some(waiters) = self.refresher.finished(id) {
            match result {
                Ok(snap) => {
                    self.apply(now, snap, floor);
                    for request in waiters {
                        self.out.push(Action::AnswerRefresh {
                            request,
                            result: if self.is_stopped() {
                                Err(SiloError::DeclaredDead)
                            } else {
                                Ok((*self.view).clone())
                            },
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!(cluster = %self.cluster, silo = %self.me, error = %e, "membership table read failed");
                    // Do not wait a whole table_refresh_timeout on a stale view.
                    if !self.refresh_retry_scheduled {
                        self.refresh_retry_scheduled = true;
                        self.schedule(Timer::RefreshRetry, self.options.probe_timeout);
                    }
                    let n = waiters.len();
                    let mut e = Some(e);
                    for (i, request) in waiters.into_iter().enumerate() {
                        let err = if i + 1 < n {
                            Error::backend(e.as_ref().map(ToString::to_string).unwrap_or_default())
                        } else {
                            e.take().unwrap_or_else(|| Error::backend("read failed"))
                        };
                        self.out.push(Action::AnswerRefresh {
                            request,
                            result: Err(SiloError::Table(err)),
                        });
                    }
                }
            }
            if self.refresher.has_pending() {
                let id = self.id();
                self.refresher.start_pending(id);
                self.read_table(id, false);
            }
            self.after_refresh(now);
            return;
        }
        if self
            .running
            .as_ref()
            .is_some_and(|r| r.phase == JobPhase::Reading(id))
        {
            self.job_read(now, result, floor);
        }
    }

    /// Steps that waited for a refresh: the next join round; the final read of a
    /// leaving silo.
    fn after_refresh(&mut self, now: Timestamp) {
        match &mut self.lifecycle {
            Lifecycle::Validating(v) if v.awaiting_refresh => {
                v.awaiting_refresh = false;
                self.validation_round(now);
            }
            Lifecycle::Leaving { final_read: true, .. } => self.finish_leaving(false),
            _ => {}
        }
    }

    fn gossip(&mut self, version: u64) {
        if !self.options.use_liveness_gossip {
            return;
        }
        let all: Vec<SiloAddress> = self
            .view
            .rows()
            .filter(|e| e.silo != self.me && is_monitored(e.status))
            .map(|e| e.silo)
            .collect();
        let fan_out = gossip_fan_out(&self.options, all.len());
        let to: Vec<SiloAddress> = if all.len() <= fan_out {
            all
        } else {
            all.choose_multiple(&mut self.rng, fan_out).copied().collect()
        };
        if !to.is_empty() {
            self.out.push(Action::Gossip { to, version });
        }
    }

    /// Queues the write of our own row (status Active) after the table lost it,
    /// unless such a write is already queued or running.
    fn reregister(&mut self) {
        let job = Job::OwnStatus(SiloStatus::Active);
        let queued = self.running.as_ref().is_some_and(|r| r.job == job) || self.queue.contains(&job);
        if !queued && matches!(self.lifecycle, Lifecycle::Active) {
            tracing::error!(cluster = %self.cluster, silo = %self.me, version = self.view.version.version,
                "this silo's row is missing from the membership table, which lost data: re-registering");
            self.enqueue(job);
        }
    }

    /// Records whether our clock is beyond the bound and, once our row exists,
    /// queues its write unless one is queued (a job plans from the newest value,
    /// so flips before it runs merge).
    fn clock_bound(&mut self, beyond: bool) {
        if self.own_row.clock_beyond_bound == beyond {
            return;
        }
        self.own_row.clock_beyond_bound = beyond;
        tracing::warn!(cluster = %self.cluster, silo = %self.me, beyond,
            "this silo's clock crossed the bound: saying so in its row (the shard ring leaves out a silo beyond it)");
        self.queue_own_clock();
    }

    /// Not merged with a running write: it may have planned with the old value.
    fn queue_own_clock(&mut self) {
        let job = Job::OwnClock;
        if !self.queue.contains(&job)
            && matches!(
                self.lifecycle,
                Lifecycle::Validating(_) | Lifecycle::Activating | Lifecycle::Active
            )
        {
            self.enqueue(job);
        }
    }

    // ---- writes ----------------------------------------------------------------------

    fn enqueue(&mut self, job: Job) {
        if let Job::Vote {
            suspect,
            intermediary,
            ..
        } = &job
        {
            let running = self.running.as_mut().map(|r| &mut r.job);
            for queued in running.into_iter().chain(self.queue.iter_mut()) {
                if let Job::Vote {
                    suspect: s,
                    intermediary: i,
                    ..
                } = queued
                {
                    if s == suspect {
                        if i.is_none() {
                            *i = *intermediary;
                        }
                        return; // merged: one vote job per suspect
                    }
                }
            }
            if self.queue.len() >= MAX_QUEUED_JOBS {
                tracing::warn!(cluster = %self.cluster, silo = %self.me, %suspect, "write queue full; vote dropped");
                return;
            }
            self.queue.push_back(job);
        } else {
            self.queue.push_front(job);
        }
        self.pump();
    }

    fn pump(&mut self) {
        if self.running.is_some() {
            return;
        }
        if let Some(job) = self.queue.pop_front() {
            self.running = Some(Running {
                job,
                attempt: 0,
                phase: JobPhase::Reading(0),
            });
            self.read_for_job();
        }
    }

    /// The running job (re)reads the table: every attempt plans from a fresh read.
    ///
    /// The join and own-status jobs read a delta (rows written since the view's
    /// version, merged onto the view): they need only the version row and rows a
    /// writer changed, so a join costs the store O(changes), not O(silos). A vote
    /// reads the whole table, as in Orleans: its quorum counts the Active silos
    /// whose IAmAlive is fresh, which only a full read brings. Some retries read the
    /// whole table too (a row removed by the defunct
    /// cleanup is invisible to a delta): every [`FULL_READ_EVERY`]th attempt.
    fn read_for_job(&mut self) {
        let id = self.id();
        if let Some(r) = self.running.as_mut() {
            r.phase = JobPhase::Reading(id);
            let full =
                matches!(r.job, Job::Vote { .. }) || (r.attempt > 0 && r.attempt % FULL_READ_EVERY == 0);
            self.read_table(id, full);
        }
    }

    fn job_read(&mut self, now: Timestamp, result: Result<MembershipSnapshot, Error>, floor: u64) {
        let snap = match result {
            Ok(s) => s,
            Err(e) => return self.job_retry(Some(e)),
        };
        let Some(job) = self.running.as_ref().map(|r| r.job.clone()) else {
            return;
        };
        let plan = self.plan(&job, &snap, now);
        let next_version = snap.version.next();
        self.apply(now, snap, floor);
        if self.running.is_none() {
            return; // the read showed us Dead: stopped
        }
        match plan {
            Plan::Done => self.job_finished(Ok(())),
            Plan::NoMajority {
                suspect,
                reached,
                active,
            } => {
                self.no_majority(suspect, reached, active);
                self.job_finished(Ok(()))
            }
            Plan::Abort(e) => self.job_finished(Err(e)),
            Plan::Write(write, completes) => {
                let id = self.id();
                if let Some(r) = self.running.as_mut() {
                    r.phase = JobPhase::Writing {
                        id,
                        completes,
                        version: next_version.version,
                    };
                }
                self.out.push(Action::WriteRow {
                    id,
                    write,
                    next_version,
                    origin: WriteOrigin::silo(self.me, now),
                    vote: matches!(job, Job::Vote { .. }),
                });
            }
        }
    }

    fn on_written(&mut self, id: u64, result: Result<bool, Error>) {
        let Some(JobPhase::Writing {
            id: wid,
            completes,
            version,
        }) = self.running.as_ref().map(|r| r.phase)
        else {
            return;
        };
        if wid != id {
            return;
        }
        match result {
            Ok(true) => {
                self.known_version = self.known_version.max(version);
                self.gossip(version);
                if completes {
                    self.job_finished(Ok(()));
                } else {
                    // A multi-row job (the join): read again for the next row.
                    self.read_for_job();
                }
                self.refresh(None);
            }
            Ok(false) => self.job_retry(None),
            Err(e) => self.job_retry(Some(e)),
        }
    }

    fn job_retry(&mut self, error: Option<Error>) {
        let Some(r) = self.running.as_mut() else {
            return;
        };
        r.attempt += 1;
        let attempt = r.attempt;
        let joining = matches!(r.job, Job::Join | Job::OwnStatus(SiloStatus::Active))
            && matches!(self.lifecycle, Lifecycle::JoiningTable | Lifecycle::Activating);
        let fatal = error.as_ref().is_some_and(|e| !e.is_transient());
        // A conflict means another silo committed: in a join storm the table makes
        // progress while we lose. The join's own writes give up on conflicts only at
        // `max_join_attempt_time` from the silo's start (a storm of N joins needs
        // O(N) commits, so a fixed count of attempts fails silos in large storms);
        // other jobs, and errors, give up after MAX_WRITE_ATTEMPTS.
        let out_of_attempts = if joining && error.is_none() {
            self.now.saturating_duration_since(self.own_row.start_time) >= self.options.max_join_attempt_time
        } else {
            attempt >= MAX_WRITE_ATTEMPTS
        };
        if out_of_attempts || fatal {
            let e = error.unwrap_or_else(|| {
                Error::backend(format!(
                    "membership write gave up after {attempt} conflicting attempts"
                ))
            });
            return self.job_finished(Err(SiloError::Table(e)));
        }
        if let Some(e) = &error {
            tracing::debug!(cluster = %self.cluster, silo = %self.me, error = %e, attempt, "membership write failed; retrying");
        }
        let n = self.id();
        let unit: f64 = self.rng.random();
        if let Some(r) = self.running.as_mut() {
            r.phase = JobPhase::Backoff(n);
        }
        self.schedule(
            Timer::WriteRetry(n),
            backoff_delay(attempt, BACKOFF_BASE, BACKOFF_CAP, unit),
        );
    }

    fn job_finished(&mut self, result: Result<(), SiloError>) {
        let Some(done) = self.running.take() else {
            return;
        };
        match done.job {
            Job::Join => match (&self.lifecycle, result) {
                (Lifecycle::JoiningTable, Ok(())) => {
                    self.lifecycle = Lifecycle::Validating(Validation::default());
                    self.validation_round(self.now);
                }
                (Lifecycle::JoiningTable, Err(e)) => self.join_failed(e),
                _ => {}
            },
            Job::OwnStatus(target) => self.own_status_written(target, result),
            Job::OwnClock => {
                if let Err(e) = result {
                    tracing::warn!(cluster = %self.cluster, silo = %self.me, error = %e,
                        "the clock flag was not written to this silo's row");
                }
            }
            Job::Vote { suspect, .. } => {
                if let Err(e) = result {
                    tracing::warn!(cluster = %self.cluster, silo = %self.me, %suspect, error = %e, "vote not written");
                }
            }
        }
        if !self.is_stopped() {
            self.pump();
        }
    }

    fn own_status_written(&mut self, target: SiloStatus, result: Result<(), SiloError>) {
        match &mut self.lifecycle {
            Lifecycle::Activating if target == SiloStatus::Active => match result {
                Ok(()) => {
                    tracing::info!(cluster = %self.cluster, silo = %self.me, "active");
                    self.lifecycle = Lifecycle::Active;
                    self.set_status(SiloStatus::Active);
                    self.out.push(Action::JoinFinished(Ok(())));
                    let period = self.options.probe_period();
                    self.schedule(Timer::ProbeTick, period);
                    self.refresh(None);
                }
                Err(e) => self.join_failed(e),
            },
            Lifecycle::Leaving {
                leaving,
                error,
                final_read,
                ..
            } => {
                if let Err(e) = result {
                    tracing::warn!(cluster = %self.cluster, silo = %self.me, to = %target, error = %e, "leaving: status write failed");
                    error.get_or_insert(e);
                }
                if target == *leaving {
                    self.enqueue(Job::OwnStatus(SiloStatus::Dead));
                } else {
                    // Dead is written: one last read so subscribers see it, then stop.
                    *final_read = true;
                    self.refresh(None);
                }
            }
            Lifecycle::FailingJoin(error) => {
                let error = error.take().unwrap_or(SiloError::Stopped);
                self.set_status(SiloStatus::Dead);
                self.out.push(Action::JoinFinished(Err(error)));
                self.stop(StopReason::JoinFailed);
            }
            _ => {}
        }
    }

    fn plan(&self, job: &Job, snap: &MembershipSnapshot, now: Timestamp) -> Plan {
        let me = self.me;
        match job {
            Job::Join => match plan_join(&me, snap) {
                JoinPlan::Superseded { by } => Plan::Abort(SiloError::Superseded { by }),
                JoinPlan::AlreadyInserted {
                    status: SiloStatus::Dead,
                } => Plan::Abort(SiloError::DeclaredDead),
                JoinPlan::AlreadyInserted { .. } => Plan::Done,
                JoinPlan::Proceed { declare_dead } => match declare_dead.into_iter().next() {
                    Some((mut old, etag)) => {
                        tracing::info!(cluster = %self.cluster, silo = %me, old = %old.silo, "declaring older generation Dead");
                        old.suspect_votes.push(SuspectVote { silo: me, time: now });
                        Plan::Write(RowWrite::Update(old, etag), false)
                    }
                    None => {
                        let mut row = self.own_row.clone();
                        row.status = SiloStatus::Joining;
                        row.i_am_alive_time = now;
                        Plan::Write(RowWrite::Insert(row), true)
                    }
                },
            },
            Job::OwnStatus(target) => {
                let leaving = matches!(
                    target,
                    SiloStatus::ShuttingDown | SiloStatus::Stopping | SiloStatus::Dead
                );
                let Some((row, etag)) = snap.get(&me) else {
                    return if leaving {
                        Plan::Done
                    } else if self.own_row_was_lost(now) {
                        // The table lost our row (see `own_row_was_lost`): write it again.
                        let mut row = self.own_row.clone();
                        row.status = *target;
                        row.i_am_alive_time = now;
                        Plan::Write(RowWrite::Insert(row), true)
                    } else {
                        Plan::Abort(SiloError::DeclaredDead)
                    };
                };
                if row.status == *target {
                    return Plan::Done;
                }
                if row.status == SiloStatus::Dead || !row.status.can_transition_to(*target) {
                    return if leaving {
                        Plan::Done
                    } else {
                        Plan::Abort(SiloError::DeclaredDead)
                    };
                }
                tracing::info!(cluster = %self.cluster, silo = %me, from = %row.status, to = %target, "status change");
                let mut r = row.clone();
                r.status = *target;
                r.i_am_alive_time = now;
                Plan::Write(RowWrite::Update(r, etag.clone()), true)
            }
            Job::OwnClock => {
                let beyond = self.own_row.clock_beyond_bound;
                match snap.get(&me) {
                    // A lost row is written again, flag and all, by `reregister`.
                    Some((row, etag))
                        if matches!(row.status, SiloStatus::Joining | SiloStatus::Active)
                            && row.clock_beyond_bound != beyond =>
                    {
                        let mut r = row.clone();
                        r.clock_beyond_bound = beyond;
                        r.i_am_alive_time = now;
                        Plan::Write(RowWrite::Update(r, etag.clone()), true)
                    }
                    _ => Plan::Done,
                }
            }
            Job::Vote {
                suspect,
                intermediary,
                reason,
            } => self.plan_vote(*suspect, *intermediary, *reason, snap, now),
        }
    }

    fn plan_vote(
        &self,
        suspect: SiloAddress,
        intermediary: Option<SiloAddress>,
        reason: SuspectReason,
        snap: &MembershipSnapshot,
        now: Timestamp,
    ) -> Plan {
        let (me, options) = (self.me, &self.options);
        if self.status != SiloStatus::Active || suspect == me {
            return Plan::Done;
        }
        let Some((row, etag)) = snap.get(&suspect) else {
            return Plan::Done;
        };
        // The suspicion was formed on an older view: check it still holds.
        if reason == SuspectReason::StuckJoining && !is_stuck_joining(row, now, options) {
            return Plan::Done;
        }
        // A vote on probe evidence needs a majority of the silos that are active and
        // not stale in this fresh read (stale ones are the table's witness of a crash).
        let active_silos = active_non_stale_silos(snap, now, options);
        let active = active_silos.len();
        if reason == SuspectReason::MissedProbes && options.vote_needs_majority {
            let reached = self.reach.count(&me, &active_silos, now, options);
            if !is_majority(reached, active) {
                return Plan::NoMajority {
                    suspect,
                    reached,
                    active,
                };
            }
        }
        // Our own vote from less than a probe timeout ago already says this.
        let voted_recently = row
            .suspect_votes
            .iter()
            .any(|v| v.silo == me && now.saturating_duration_since(v.time) < options.probe_timeout);
        match decide_vote(row, &me, intermediary.as_ref(), now, active, options) {
            VoteDecision::AlreadyDead => Plan::Done,
            VoteDecision::Vote(_) if voted_recently && intermediary.is_none() => Plan::Done,
            VoteDecision::Vote(r) => {
                tracing::info!(cluster = %self.cluster, silo = %me, %suspect, votes = r.suspect_votes.len(),
                    ?intermediary, ?reason, "voting: suspect");
                Plan::Write(RowWrite::Update(r, etag.clone()), true)
            }
            VoteDecision::DeclareDead(r) => {
                tracing::warn!(cluster = %self.cluster, silo = %me, %suspect, votes = r.suspect_votes.len(),
                    ?reason, "voting: declaring Dead");
                Plan::Write(RowWrite::Update(r, etag.clone()), true)
            }
        }
    }

    // ---- join validation ------------------------------------------------------------

    /// Pings every Active silo (Orleans: "validate initial connectivity").
    fn validation_round(&mut self, now: Timestamp) {
        let active: Vec<SiloAddress> = self
            .view
            .active()
            .map(|e| e.silo)
            .filter(|s| *s != self.me)
            .collect();
        let k = self
            .options
            .max_join_validation_probes
            .map_or_else(|| log_fan_out(active.len()), |k| k as usize);
        // A bounded sample: last round's silent silos (if still Active) first, then
        // others at random.
        let sticky: Vec<SiloAddress> = match &self.lifecycle {
            Lifecycle::Validating(v) => v
                .unreachable
                .iter()
                .filter(|s| active.contains(s))
                .copied()
                .collect(),
            _ => Vec::new(),
        };
        let mut peers: Vec<SiloAddress> = sticky.iter().take(k).copied().collect();
        let rest: Vec<SiloAddress> = active.iter().filter(|s| !peers.contains(s)).copied().collect();
        let fill = k.saturating_sub(peers.len());
        peers.extend(rest.choose_multiple(&mut self.rng, fill).copied());
        let timeout = self.options.probe_timeout;
        let mut pings = Vec::new();
        for peer in &peers {
            pings.push((self.id(), *peer));
        }
        let Lifecycle::Validating(v) = &mut self.lifecycle else {
            return;
        };
        v.started.get_or_insert(now);
        v.unreachable.clear();
        if peers.is_empty() {
            self.activate();
            return;
        }
        for (seq, peer) in pings {
            v.outstanding.insert(seq, peer);
            self.out.push(Action::Ping {
                target: peer,
                seq,
                timeout,
            });
        }
    }

    fn activate(&mut self) {
        self.lifecycle = Lifecycle::Activating;
        self.enqueue(Job::OwnStatus(SiloStatus::Active));
    }

    fn on_validation_ping(&mut self, now: Timestamp, seq: u64, target: SiloAddress, outcome: PingOutcome) {
        let max = self.options.max_join_attempt_time;
        let retry = self.options.probe_timeout;
        let Lifecycle::Validating(v) = &mut self.lifecycle else {
            return;
        };
        if v.outstanding.remove(&seq).is_none() {
            return; // a ping of an earlier round
        }
        if !matches!(outcome, PingOutcome::Answered { .. }) {
            v.unreachable.push(target);
        }
        if !v.outstanding.is_empty() {
            return;
        }
        if v.unreachable.is_empty() {
            return self.activate();
        }
        let waited = now.saturating_duration_since(v.started.unwrap_or(now));
        if waited >= max {
            let mut unreachable = std::mem::take(&mut v.unreachable);
            unreachable.sort();
            return self.join_failed(SiloError::JoinTimeout { unreachable, waited });
        }
        tracing::warn!(cluster = %self.cluster, silo = %self.me, unreachable = ?v.unreachable,
            "joining: some Active silos do not answer yet; retrying");
        self.schedule(Timer::JoinRetry, retry);
    }

    // ---- probing ----------------------------------------------------------------------

    /// Re-selects the probe targets: looking at every row (`scan_all`, each probe
    /// period) or only at the rows that changed since (after a table read).
    fn update_targets(&mut self, now: Timestamp, scan_all: bool) {
        if self.status != SiloStatus::Active {
            self.probes.clear();
            return;
        }
        let targets = if scan_all {
            self.targets.select(&self.me, &self.view, now, &self.options)
        } else {
            self.targets
                .select_changed(&self.me, &self.view, now, &self.options)
        };
        self.probes.retain(|t, _| targets.contains(t));
        for t in targets {
            if !self.probes.contains_key(&t) {
                tracing::debug!(cluster = %self.cluster, silo = %self.me, target = %t, "start probing");
                self.probes.insert(t, ProbeCycle::new(t, &self.options));
            }
        }
    }

    fn probe_tick(&mut self, now: Timestamp) {
        if self.status != SiloStatus::Active {
            return;
        }
        self.schedule(Timer::ProbeTick, self.options.probe_period());
        self.update_targets(now, true);
        // Kept by the selector with the other time-driven flags (no scan of the view).
        let stuck: Vec<SiloAddress> = self.targets.stuck().to_vec();
        for suspect in stuck {
            self.enqueue(Job::Vote {
                suspect,
                intermediary: None,
                reason: SuspectReason::StuckJoining,
            });
        }
        let targets: Vec<SiloAddress> = self.probes.keys().copied().collect();
        for target in targets {
            let seq = self.id();
            let (health, options) = (self.health, &self.options);
            let Some(cycle) = self.probes.get_mut(&target) else {
                continue;
            };
            if let Some(timeout) = cycle.tick(seq, now, health, options) {
                self.probes_sent += 1;
                self.out.push(Action::Ping { target, seq, timeout });
            }
        }
    }

    fn on_ping(&mut self, now: Timestamp, target: SiloAddress, seq: u64, outcome: PingOutcome) {
        if matches!(self.lifecycle, Lifecycle::Validating(_)) {
            return self.on_validation_ping(now, seq, target, outcome);
        }
        let (health, options) = (self.health, &self.options);
        let Some(cycle) = self.probes.get_mut(&target) else {
            return; // no longer a target
        };
        let timeout = cycle.current_timeout(health, options);
        let verdict = cycle.on_ping(seq, outcome, now, health, options);
        if matches!(outcome, PingOutcome::Answered { .. } | PingOutcome::WrongSilo) {
            self.probes_answered += 1;
        }
        match verdict {
            Verdict::Nothing => {}
            Verdict::AskIntermediary => {
                let candidates: Vec<SiloAddress> = self
                    .view
                    .active()
                    .map(|e| e.silo)
                    .filter(|s| *s != self.me && *s != target)
                    .collect();
                let via = candidates.choose(&mut self.rng).copied();
                let seq = self.id();
                if let Some(cycle) = self.probes.get_mut(&target) {
                    cycle.indirect_sent(via.map(|v| (seq, v)));
                }
                if let Some(via) = via {
                    self.out.push(Action::IndirectPing {
                        via,
                        target,
                        seq,
                        timeout,
                        intermediary_timeout: super::probe::intermediary_timeout(timeout),
                    });
                }
            }
            Verdict::Suspect { reason, intermediary } => {
                tracing::debug!(cluster = %self.cluster, silo = %self.me, %target, ?reason, ?intermediary, "suspect");
                if reason == SuspectReason::MissedProbes && self.options.vote_needs_majority {
                    return self.suspect_on_probes(now, target, intermediary);
                }
                self.enqueue(Job::Vote {
                    suspect: target,
                    intermediary,
                    reason,
                });
            }
        }
    }

    // ---- partitions: a vote on probe evidence needs a majority ([`super::reach`]) ---

    /// A suspicion from unanswered probes: vote if this silo reaches a majority of
    /// the active silos; otherwise find out with a reach round first.
    fn suspect_on_probes(&mut self, now: Timestamp, suspect: SiloAddress, intermediary: Option<SiloAddress>) {
        let active = active_non_stale_silos(&self.view, now, &self.options);
        if self.reach.sees_majority(&self.me, &active, now, &self.options) {
            self.cut_off = false;
            return self.enqueue(Job::Vote {
                suspect,
                intermediary,
                reason: SuspectReason::MissedProbes,
            });
        }
        if self.reach.round_running() {
            return self.reach.wait_for_round((suspect, intermediary));
        }
        let unknown = self.reach.unknown(&self.me, &active, now, &self.options);
        let pings: Vec<(u64, SiloAddress)> = unknown.into_iter().map(|s| (self.id(), s)).collect();
        if pings.is_empty() {
            // Nobody left to ask: the vote job decides on its fresh read, where
            // crashed silos may have gone stale since this view.
            return self.enqueue(Job::Vote {
                suspect,
                intermediary,
                reason: SuspectReason::MissedProbes,
            });
        }
        tracing::debug!(cluster = %self.cluster, silo = %self.me, %suspect, asking = pings.len(),
            "no majority in recent answers: checking whom this silo reaches before voting");
        self.reach.start_round(&pings, (suspect, intermediary));
        let timeout = self.options.probe_timeout;
        for (seq, target) in pings {
            self.out.push(Action::Ping { target, seq, timeout });
        }
    }

    fn reach_round_progress(&mut self, now: Timestamp) {
        let active = active_non_stale_silos(&self.view, now, &self.options);
        let Some(verdict) = self.reach.finish_round(&self.me, &active, now, &self.options) else {
            return;
        };
        if verdict.majority {
            self.cut_off = false;
        }
        // Each vote job checks the majority again on its fresh read (crashed silos
        // may have gone stale since this view).
        for (suspect, intermediary) in verdict.pending {
            self.enqueue(Job::Vote {
                suspect,
                intermediary,
                reason: SuspectReason::MissedProbes,
            });
        }
    }

    fn no_majority(&mut self, suspect: SiloAddress, reached: usize, active: usize) {
        if !self.cut_off {
            tracing::warn!(cluster = %self.cluster, silo = %self.me, %suspect, reached, active,
                "this silo reaches no majority of the active silos: not voting on probe evidence \
                 (it is probably the one cut off; a crashed silo is declared once its IAmAlive is stale)");
        }
        self.cut_off = true;
    }
}

/// Basic mode has no version to compare: the view changed if a row appeared,
/// disappeared, or changed status or votes.
fn content_changed(old: &MembershipSnapshot, new: &MembershipSnapshot) -> bool {
    old.entries.len() != new.entries.len()
        || old.entries.iter().zip(new.entries.iter()).any(|(ra, rb)| {
            let (ea, eb) = (&ra.entry, &rb.entry);
            ea.silo != eb.silo || ea.status != eb.status || ea.suspect_votes != eb.suspect_votes
        })
}

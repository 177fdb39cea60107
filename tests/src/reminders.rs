//! A harness for reminder service scenarios: a [`SimCluster`] whose silos each run
//! a reminder service delivering to one recording actor per silo.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler};
use rollcall_core::{ReminderOptions, SiloAddress, SiloError, SiloHandle, SystemStore, Timestamp};
use rollcall_reminders::{ActorId, ReminderTick, Reminders};

use crate::sim::SimCluster;

/// One tick as a recorder saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The silo whose service delivered it.
    pub silo: SiloAddress,
    /// The tick.
    pub tick: ReminderTick,
}

/// Every tick delivered in a scenario, in delivery order.
pub type Log = Arc<Mutex<Vec<Delivered>>>;

/// An actor that records every tick it gets, tagged with its silo.
pub struct Recorder {
    silo: SiloAddress,
    log: Log,
}

impl Recorder {
    /// A recorder for `silo` writing into `log`.
    pub fn new(silo: SiloAddress, log: &Log) -> Self {
        Recorder {
            silo,
            log: log.clone(),
        }
    }
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Recorder {
    type Result = ();

    fn handle(&mut self, tick: ReminderTick, _: &mut Context<Self>) {
        self.log.lock().expect("log").push(Delivered {
            silo: self.silo,
            tick,
        });
    }
}

/// Starts the reminder service of `silo` on `store` with a [`Recorder`] behind every
/// actor id.
///
/// # Errors
/// As [`RemindersBuilder::start`](rollcall_reminders::RemindersBuilder::start).
pub async fn start_service(
    silo: &SiloHandle,
    store: Arc<dyn SystemStore>,
    options: ReminderOptions,
    clock: Arc<dyn rollcall_core::Clock>,
    log: &Log,
) -> Result<Reminders, rollcall_reminders::ReminderError> {
    let recorder = Recorder {
        silo: silo.address(),
        log: log.clone(),
    }
    .start()
    .recipient();
    Reminders::builder(silo, store)
        .service_id("svc")
        .target(move |_: &ActorId| Some(recorder.clone()))
        .options(options)
        .clock(clock)
        .seed(silo.address().generation())
        .start()
        .await
}

/// A simulated cluster whose silos run reminder services.
pub struct ReminderCluster {
    /// The membership side.
    pub sim: SimCluster,
    /// Reminder options every service gets.
    pub options: ReminderOptions,
    /// Services, in start order (index = index in `sim.silos`).
    pub services: Vec<Reminders>,
    /// Every tick delivered.
    pub log: Log,
}

impl ReminderCluster {
    /// A cluster with membership defaults (seed 7) and these reminder options.
    pub fn new(options: ReminderOptions) -> Self {
        ReminderCluster {
            sim: SimCluster::new(rollcall_core::ClusterMembershipOptions::default()),
            options,
            services: Vec::new(),
            log: Log::default(),
        }
    }

    /// Starts silo `n` (generation `generation`) and its reminder service.
    ///
    /// # Errors
    /// If the silo cannot join.
    ///
    /// # Panics
    /// If the reminder service does not start.
    pub async fn start(&mut self, n: u8, generation: u64) -> Result<Reminders, SiloError> {
        let silo = self.sim.start(n, generation).await?;
        let service = start_service(
            &silo,
            Arc::new(self.sim.store.clone()),
            self.options.clone(),
            self.sim.clock.clone(),
            &self.log,
        )
        .await
        .expect("reminder service starts");
        self.services.push(service.clone());
        Ok(service)
    }

    /// Starts silos 1..=n and waits (at most a virtual minute) until every one of
    /// them sees all n Active.
    ///
    /// # Panics
    /// If they do not agree within the minute.
    pub async fn start_many(&mut self, n: u8) {
        for i in 1..=n {
            self.start(i, 1).await.expect("silo joins");
        }
        self.settle().await;
    }

    /// Waits (at most a virtual minute) until every running silo sees the same
    /// Active silos.
    ///
    /// # Panics
    /// If they do not agree within the minute.
    pub async fn settle(&self) {
        let running: Vec<SiloHandle> = self
            .sim
            .silos
            .iter()
            .filter(|s| !s.is_stopped())
            .cloned()
            .collect();
        let agreed = crate::sim::wait_for(std::time::Duration::from_secs(60), || {
            let views: BTreeSet<Vec<SiloAddress>> = running
                .iter()
                .map(|s| {
                    s.snapshot()
                        .rows()
                        .filter(|e| e.status == rollcall_core::SiloStatus::Active)
                        .map(|e| e.silo)
                        .collect()
                })
                .collect();
            views.len() == 1
        })
        .await;
        assert!(agreed.is_some(), "silos never agreed on the Active set");
    }

    /// The service of the first running silo.
    pub fn any_service(&self) -> &Reminders {
        let i = self
            .sim
            .silos
            .iter()
            .position(|s| !s.is_stopped())
            .expect("a running silo");
        &self.services[i]
    }

    /// Now, on the virtual wall clock.
    pub fn now(&self) -> Timestamp {
        self.sim.now()
    }

    /// A copy of the log.
    pub fn ticks(&self) -> Vec<Delivered> {
        self.log.lock().expect("log").clone()
    }

    /// Ticks per (actor, name): the scheduled times in delivery order.
    pub fn scheduled_by_reminder(&self) -> BTreeMap<(String, String), Vec<Timestamp>> {
        let mut m: BTreeMap<(String, String), Vec<Timestamp>> = BTreeMap::new();
        for d in self.ticks() {
            m.entry((d.tick.actor.to_string(), d.tick.name.clone()))
                .or_default()
                .push(d.tick.scheduled);
        }
        m
    }

    /// Reminders that got the same scheduled time twice, with that time.
    pub fn duplicates(&self) -> Vec<((String, String), Timestamp)> {
        let mut out = Vec::new();
        for (k, times) in self.scheduled_by_reminder() {
            let mut seen = BTreeSet::new();
            for t in times {
                if !seen.insert(t) {
                    out.push((k.clone(), t));
                }
            }
        }
        out
    }
}

/// Whether occurrence `t` may be repeated after a silo was killed at `kill`,
/// with the default reminder options (checkpoints every
/// `lease_checkpoint_interval`): the successor owes from the victim's last
/// checkpoint less `max_clock_offset`, and that checkpoint is at most an
/// interval old plus 2 s (its write, a poll, a tick's handling); the victim
/// delivered nothing due more than `max_clock_offset` after its death.
pub fn checkpoint_repeat(kill: Timestamp, t: Timestamp) -> bool {
    checkpoint_windows(&[kill], Duration::ZERO)
        .iter()
        .any(|(from, to)| *from <= t && t <= *to)
}

/// The spans of occurrences the kills at `kills` may repeat, one per kill:
/// [`checkpoint_repeat`]'s, widened for a chain of kills: a silo killed
/// within `chain` of an earlier kill (the failover: detection, the lease
/// period and clock bound, a poll and a checkpoint write) may still hold a
/// shard it took over from the earlier victim without a checkpoint of its
/// own yet, so its successor owes from the earlier victim's checkpoint.
pub fn checkpoint_windows(kills: &[Timestamp], chain: Duration) -> Vec<(Timestamp, Timestamp)> {
    let mut sorted = kills.to_vec();
    sorted.sort();
    let offset = rollcall_core::ClusterMembershipOptions::default().max_clock_offset;
    let mut out: Vec<(Timestamp, Timestamp)> = Vec::new();
    for (i, k) in sorted.iter().enumerate() {
        let mut from = Timestamp::from_millis(k.as_millis().saturating_sub(repeat_span().as_millis() as u64));
        for (j, earlier) in sorted[..i].iter().enumerate().rev() {
            if k.saturating_duration_since(*earlier) <= chain {
                from = from.min(out[j].0);
            }
        }
        out.push((from, k.saturating_add(offset)));
    }
    out
}

/// How far before a kill a repeat may reach with the default options: the
/// checkpoint interval, the clock bound, and 2 s (its write, a poll, a
/// tick's handling).
fn repeat_span() -> Duration {
    ReminderOptions::default().lease_checkpoint_interval
        + rollcall_core::ClusterMembershipOptions::default().max_clock_offset
        + Duration::from_secs(2)
}

/// Actor `cart/<i>`.
pub fn actor(i: usize) -> ActorId {
    ActorId::new("cart", i.to_string()).expect("actor id")
}

/// One delivered tick as a churn analysis reads it (from a [`Log`] or from the log
/// files of silo processes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occurrence {
    /// (actor id, reminder name).
    pub reminder: (String, String),
    /// The occurrence it stands for.
    pub scheduled: Timestamp,
    /// When it was sent.
    pub at: Timestamp,
}

impl From<&Delivered> for Occurrence {
    fn from(d: &Delivered) -> Occurrence {
        Occurrence {
            reminder: (d.tick.actor.to_string(), d.tick.name.clone()),
            scheduled: d.tick.scheduled,
            at: d.tick.now,
        }
    }
}

/// What a churn run delivered against what it should have: every occurrence of
/// every reminder in `[from, to]` exactly once.
#[derive(Clone, Debug, Default)]
pub struct ChurnReport {
    /// Occurrences due in the window.
    pub occurrences: usize,
    /// Occurrences delivered twice or more (each extra delivery once).
    pub duplicates: Vec<((String, String), Timestamp)>,
    /// Occurrences in the window never delivered.
    pub missed: Vec<((String, String), Timestamp)>,
    /// Longest time between two consecutive delivered occurrences of one reminder.
    pub worst_gap: Duration,
    /// Lateness (sent - scheduled) of the deliveries in the window: p50, p99, max.
    pub lateness: [Duration; 3],
}

impl ChurnReport {
    /// Panics, naming the first ones, if an occurrence was delivered twice.
    pub fn assert_no_duplicates(&self) {
        assert!(
            self.duplicates.is_empty(),
            "{self}: {:?}",
            &self.duplicates[..self.duplicates.len().min(10)]
        );
    }

    /// Panics, naming the first ones, if an occurrence was delivered twice
    /// outside the repeat window of every kill in `kills`
    /// ([`checkpoint_repeat`]).
    /// `chain` as [`checkpoint_windows`] takes it.
    pub fn assert_repeats_only_since_checkpoints(&self, kills: &[Timestamp], chain: Duration) {
        let outside = self.repeats_outside(kills, chain);
        assert!(
            outside.is_empty(),
            "{self}: {} repeats outside every kill's checkpoint window, e.g. {:?}",
            outside.len(),
            &outside[..outside.len().min(10)]
        );
    }

    /// The repeats outside every window of [`checkpoint_windows`]`(kills, chain)`.
    pub fn repeats_outside(
        &self,
        kills: &[Timestamp],
        chain: Duration,
    ) -> Vec<&((String, String), Timestamp)> {
        let windows = checkpoint_windows(kills, chain);
        self.duplicates
            .iter()
            .filter(|(_, t)| !windows.iter().any(|(from, to)| from <= t && t <= to))
            .collect()
    }

    /// Panics, naming the first ones, if an occurrence was delivered twice or never.
    pub fn assert_none_repeated_or_lost(&self) {
        self.assert_no_duplicates();
        assert!(
            self.missed.is_empty(),
            "{self}: {:?}",
            &self.missed[..self.missed.len().min(10)]
        );
    }
}

impl std::fmt::Display for ChurnReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} occurrences, {} duplicates, {} missed, worst gap {:?}, lateness p50 {:?} p99 {:?} max {:?}",
            self.occurrences,
            self.duplicates.len(),
            self.missed.len(),
            self.worst_gap,
            self.lateness[0],
            self.lateness[1],
            self.lateness[2]
        )
    }
}

/// Compares `ticks` with the occurrences of reminders starting at `starts` (every
/// `period`) that fall in `[from, to]`.
pub fn churn_report(
    starts: &BTreeMap<(String, String), Timestamp>,
    period: Duration,
    from: Timestamp,
    to: Timestamp,
    ticks: &[Occurrence],
) -> ChurnReport {
    let mut got: BTreeMap<&(String, String), Vec<&Occurrence>> = BTreeMap::new();
    for t in ticks {
        got.entry(&t.reminder).or_default().push(t);
    }
    let mut report = ChurnReport::default();
    let mut lateness = Vec::new();
    let p = period.as_millis() as u64;
    for (key, start) in starts {
        let mut delivered: BTreeMap<Timestamp, usize> = BTreeMap::new();
        for t in got.get(key).into_iter().flatten() {
            *delivered.entry(t.scheduled).or_default() += 1;
            if t.scheduled >= from && t.scheduled <= to {
                lateness.push(t.at.saturating_duration_since(t.scheduled));
            }
        }
        for (at, n) in &delivered {
            for _ in 1..*n {
                report.duplicates.push((key.clone(), *at));
            }
        }
        let times: Vec<Timestamp> = delivered
            .keys()
            .copied()
            .filter(|t| *t >= from && *t <= to)
            .collect();
        for w in times.windows(2) {
            report.worst_gap = report.worst_gap.max(w[1].saturating_duration_since(w[0]));
        }
        let mut k = from.as_millis().saturating_sub(start.as_millis()).div_ceil(p);
        loop {
            let t = Timestamp::from_millis(start.as_millis() + k * p);
            if t > to {
                break;
            }
            if t >= from {
                report.occurrences += 1;
                if !delivered.contains_key(&t) {
                    report.missed.push((key.clone(), t));
                }
            }
            k += 1;
        }
    }
    lateness.sort();
    let pick = |q: f64| {
        lateness
            .get(((lateness.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    report.lateness = [
        pick(0.5),
        pick(0.99),
        lateness.last().copied().unwrap_or_default(),
    ];
    report
}

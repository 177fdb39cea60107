//! A deterministic world of [`ReminderMachine`]s in virtual time (feature `sim`):
//! silos that join, leave gracefully or crash, a scripted membership whose views
//! reach each silo after its own delay, the real in-memory reminder table (with
//! outages), messages with latency, and handlers that can fail. Built on the
//! membership's `Scheduler` (`rollcall_core::sim`); every
//! random choice comes from the seed, so a failing schedule replays exactly.
//!
//! The world executes the machines' actions as the agent does (table calls on the
//! table, deliveries to a recorder, notices and releases to the other machines,
//! timers on the scheduler) and keeps what the checks need: every delivered
//! tick, each reminder's lifetime, the crashes and outages with their times, and
//! the largest number of deliveries, writes and notice reads in flight.
//!
//! It stands in for what the membership protocol does (the silos' views), not for
//! anything of the reminder service: registrations write the real table and send
//! the notice the service sends, to the owner in the registering silo's view.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollcall_core::sim::{now_or_fail, Scheduler};
use rollcall_core::{
    Etag, MembershipEntry, MembershipSnapshot, ReminderEntry, ReminderOptions, ReminderTable, SiloAddress,
    SiloStatus, SystemStore, TableVersion, Timestamp,
};

use crate::machine::{Action, Event, Inbound, NoticeRetry, ReminderMachine, Timer};
use crate::shards::{shard_owner, ShardEvent};
use crate::ReminderError;
use rollcall_core::ownership::ring::Ring;
use rollcall_core::ShardLeases;

/// The service id of the world's reminders.
pub const SERVICE: &str = "sim";

/// Events handled at one virtual instant beyond which [`World::run_for`] calls it
/// a livelock.
pub const LIVELOCK: u32 = 100_000;

/// How a world behaves (latencies, delays, failures). All times in ms.
#[derive(Clone, Debug)]
pub struct Config {
    /// The options of every machine.
    pub options: ReminderOptions,
    /// Extra latency of a message between silos: 1 to `1 + message_jitter` ms.
    pub message_jitter: u64,
    /// Latency of a table call: 1 to `1 + table_jitter` ms.
    pub table_jitter: u64,
    /// How late a silo sees a membership change: 0 to `view_spread` ms (the
    /// joiner and the leaver see their own change at once).
    pub view_spread: u64,
    /// How long the membership takes to declare a crashed silo Dead: a time in
    /// this range, ms.
    pub detection: (u64, u64),
    /// How long a handler runs: 0 to `handler` ms.
    pub handler: u64,
    /// Probability that a delivery fails (the handler returns an error).
    pub delivery_failure: f64,
    /// Probability that a message between two live silos is lost (the sender
    /// of a notice sees it not taken, as with the real transport).
    pub message_loss: f64,
    /// The service's shard count.
    pub shards: u32,
    /// The cluster's `max_clock_offset`, ms: each silo's clock is off the
    /// world's by a random amount within half of it (so any two differ by at
    /// most it), and the machines are told the bound (their takeover fence).
    pub max_clock_offset: u64,
    /// The bound the machines are told, when not `max_clock_offset` (a test
    /// tells them less, to show that the fence needs it).
    pub clock_bound_told: Option<u64>,
    /// Extra latency of each page call of a paged lease write: 0 to
    /// `page_call` ms more than a table call's. A page call that takes longer
    /// than `table_operation_timeout` answers a timeout then and is not
    /// applied (a page call that was applied but not answered is the same for
    /// the write: its blind puts are sent again).
    pub page_call: u64,
}

impl Default for Config {
    /// Options as deployed except `refresh_reminder_list_period` 30 s,
    /// `table_operation_timeout` 2 s and `startup_jitter` 2 s; messages 1-31 ms,
    /// table calls 1-21 ms, views up to 1.5 s late, crashes declared after 3-10 s,
    /// handlers up to 20 ms, no delivery failure, 64 shards, every clock the
    /// world's.
    fn default() -> Self {
        let options = ReminderOptions {
            refresh_reminder_list_period: Duration::from_secs(30),
            loading_window: Duration::from_secs(600),
            table_operation_timeout: Duration::from_secs(2),
            startup_jitter: Duration::from_secs(2),
            // Off, so that the property sweeps replay the schedules they did
            // before histories existed (the world answers appends anyway).
            run_history: 0,
            ..ReminderOptions::default()
        };
        Config {
            options,
            message_jitter: 30,
            table_jitter: 20,
            view_spread: 1500,
            detection: (3_000, 10_000),
            handler: 20,
            delivery_failure: 0.0,
            message_loss: 0.0,
            shards: 64,
            max_clock_offset: 0,
            clock_bound_told: None,
            page_call: 0,
        }
    }
}

/// A delivered tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    /// (actor id, name).
    pub reminder: (String, String),
    /// The occurrence.
    pub scheduled: Timestamp,
    /// When the handler finished (virtual ms): a handler that a crash cut
    /// short is no tick.
    pub at: u64,
    /// The silo (index) that delivered it.
    pub silo: usize,
    /// The etag of the registration it was planned from.
    pub etag: Etag,
}

/// A reminder's life in the world.
#[derive(Clone, Debug)]
pub struct Lifetime {
    /// First occurrence.
    pub start_at: Timestamp,
    /// Period.
    pub period: Duration,
    /// When it was registered (virtual ms).
    pub registered: u64,
    /// When it was removed (virtual ms), if it was.
    pub removed: Option<u64>,
    /// Its etag.
    pub etag: Etag,
    /// The silo it was registered through (which sends its notice).
    pub via: usize,
    /// Its schedule (a calendar, an end), as registered.
    pub timing: crate::schedule::Timing,
}

/// A crash: the victim, when it crashed and when it was declared Dead (virtual
/// ms), and the reminders it owned at the crash (in the true ring or its view).
#[derive(Clone, Debug)]
pub struct Crash {
    /// The silo (index).
    pub silo: usize,
    /// When it crashed.
    pub at: u64,
    /// When the membership declared it Dead.
    pub declared: Option<u64>,
    /// The reminders it owned at the crash in the true ring or in its own view,
    /// or in a true ring of a membership change before it was declared Dead
    /// (joiners since the crash left out: what they gain from the victim waits
    /// for the failover as well).
    pub owned: std::collections::BTreeSet<(String, String)>,
    /// The silos of the membership at the crash, less those still holding
    /// ranges then (they may wait for the victim's release).
    pub members: std::collections::BTreeSet<SiloAddress>,
    /// The shards whose lease it held at the crash.
    pub shards: std::collections::BTreeSet<u32>,
    /// Of those, the checkpoint each lease row held at the crash
    /// ([`ShardLease::owed_from`](rollcall_core::lease::ShardLease::owed_from)).
    pub checkpoints: BTreeMap<u32, Timestamp>,
}

/// The state of a silo of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    /// Active in the membership.
    Active,
    /// Leaving gracefully (its ranges are being released).
    Leaving,
    /// Left: Dead in the membership, stopped.
    Left,
    /// Crashed (Dead once declared).
    Crashed,
    /// Declared Dead while it still runs: cut off from the store and from the
    /// other silos, it believes itself Active until it stops.
    Zombie,
}

struct Node {
    addr: SiloAddress,
    machine: Option<ReminderMachine>,
    life: Life,
    view: Arc<MembershipSnapshot>,
    timers: HashMap<Timer, u64>,
    /// Cut off from the store and every other silo until this time (virtual ms).
    cut_until: u64,
    /// How far its clock is ahead of the world's, ms (negative: behind).
    offset: i64,
    /// Added to the latency of each of its reminder-row reads (a row, a
    /// piece of a load), ms: a slow store as this silo sees it.
    read_delay: u64,
}

enum Ev {
    Machine(Box<Event>),
    Timer(Timer, u64),
    View(Arc<MembershipSnapshot>),
    Left,
    Declared,
    /// A zombie stops (it read itself Dead at last).
    Stop,
    /// A registering silo sends its notice again (the owner did not take it).
    Notify(NoticeRetry),
    /// A handler finished: its tick counts (if it succeeded) and the machine
    /// hears of it, unless the silo crashed meanwhile.
    Handled(Option<Tick>, Box<Event>),
}

/// The world (see the module docs).
pub struct World {
    sched: Scheduler<Ev>,
    cfg: Config,
    nodes: Vec<Node>,
    members: BTreeMap<SiloAddress, (SiloStatus, Timestamp)>,
    /// Silos whose rows say their clock is beyond the bound.
    clock_beyond: std::collections::BTreeSet<SiloAddress>,
    version: u64,
    latest: Arc<MembershipSnapshot>,
    tokens: u64,
    _store: Arc<dyn SystemStore>,
    table: Arc<dyn ReminderTable>,
    /// The service's parked table (occurrences parked by a retry policy).
    pub parked: Arc<dyn ReminderTable>,
    leases: ShardLeases,
    outage_until: u64,
    /// Pairs of silos that cannot reach each other, until a time (virtual ms).
    partitions: Vec<(SiloAddress, SiloAddress, u64)>,
    /// Partitions between silos: (from, to), virtual ms.
    pub partitioned: Vec<(u64, u64)>,
    /// Every delivered tick, in order.
    pub ticks: Vec<Tick>,
    /// Every reminder registered, by (actor, name): its latest registration.
    pub reminders: BTreeMap<(String, String), Lifetime>,
    /// Registrations a later one of the same (actor, name) replaced, in order.
    pub replaced: Vec<((String, String), Lifetime)>,
    /// Crashes, in order.
    pub crashes: Vec<Crash>,
    /// Table outages: (from, to), virtual ms.
    pub outages: Vec<(u64, u64)>,
    /// Graceful leaves: (silo, started, left), virtual ms.
    pub leaves: Vec<(usize, u64, Option<u64>)>,
    /// Joins: (silo, when), virtual ms.
    pub joins: Vec<(usize, u64)>,
    /// Occurrences whose delivery failed at least once (the handler's error).
    pub failed: std::collections::BTreeSet<((String, String), Timestamp)>,
    /// Largest number of deliveries, writes and notice reads in flight on one silo.
    pub max_in_flight: (usize, usize, usize),
    /// Each shard's lease row as it was before its last write (what a store
    /// failover that loses that write goes back to).
    lease_before: HashMap<u32, rollcall_core::lease::ShardLease>,
    /// Takeovers, as the silos published them: (silo, shard, takeover time
    /// on that silo's clock). From then on the Dead holder delivers nothing
    /// of the shard, so every occurrence at or after it is owed.
    pub takeovers: std::collections::BTreeSet<(usize, u32, Timestamp)>,
    /// Messages the transport refused for their size (over
    /// `MAX_NOTICE_BODY` bytes): lost, as on a real silo.
    pub oversized: usize,
    /// Debugging: print (to stderr) every event and action whose text contains
    /// this string, with the virtual time and the silo (from the environment
    /// variable `ROLLCALL_SIM_WATCH` when set).
    pub watch: Option<String>,
}

impl World {
    /// An empty world seeded with `seed`, on the tables of `store`.
    ///
    /// `store` must answer without waiting (the in-memory store,
    /// `rollcall_provider_memory::MemoryStore`): the world runs every table
    /// call to completion at once ([`now_or_fail`]).
    ///
    /// # Panics
    /// When the store does not answer at once, or its tables cannot be opened.
    pub fn new(cfg: Config, seed: u64, store: Arc<dyn SystemStore>) -> World {
        let table = store.reminder_table(SERVICE).expect("the service id is valid");
        now_or_fail(table.init()).expect("the memory table initialises");
        let parked = store
            .reminder_table(&rollcall_core::parked_service_id(SERVICE))
            .expect("the parked service id is valid");
        let leases = store.lease_table(SERVICE).expect("the memory store has leases");
        let leases = now_or_fail(ShardLeases::open(leases, cfg.shards)).expect("a valid shard count");
        World {
            sched: Scheduler::new(seed, 0),
            cfg,
            nodes: Vec::new(),
            members: BTreeMap::new(),
            clock_beyond: std::collections::BTreeSet::new(),
            version: 0,
            latest: Arc::default(),
            tokens: 0,
            _store: store,
            table,
            parked,
            leases,
            outage_until: 0,
            partitions: Vec::new(),
            partitioned: Vec::new(),
            ticks: Vec::new(),
            reminders: BTreeMap::new(),
            replaced: Vec::new(),
            crashes: Vec::new(),
            outages: Vec::new(),
            leaves: Vec::new(),
            joins: Vec::new(),
            failed: Default::default(),
            max_in_flight: (0, 0, 0),
            takeovers: Default::default(),
            lease_before: HashMap::new(),
            oversized: 0,
            watch: std::env::var("ROLLCALL_SIM_WATCH").ok(),
        }
    }

    /// Virtual time now, ms.
    pub fn now(&self) -> u64 {
        self.sched.now_ms()
    }

    /// The wall-clock time of virtual time `ms`.
    pub fn time_at(ms: u64) -> Timestamp {
        Scheduler::<()>::time_at(ms)
    }

    /// The state of silo `i`.
    pub fn life(&self, i: usize) -> Life {
        self.nodes[i].life
    }

    /// Silos that are Active (not leaving, left or crashed).
    pub fn active(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].life == Life::Active)
            .collect()
    }

    /// The machine of silo `i`, while it runs.
    pub fn machine(&self, i: usize) -> Option<&ReminderMachine> {
        self.nodes[i].machine.as_ref()
    }

    /// Whether the table is out now.
    fn out(&self) -> bool {
        self.now() < self.outage_until
    }

    fn rand(&mut self, max: u64) -> u64 {
        self.sched.rng().random_range(0..=max)
    }

    /// A new silo joins (Active at once, as a silo whose reminder service starts);
    /// returns its index.
    pub fn join(&mut self) -> usize {
        let i = self.nodes.len();
        let addr: SiloAddress = format!("10.0.{}.{}:11111@1", i / 250, i % 250 + 1)
            .parse()
            .expect("a valid silo address");
        let rng = StdRng::seed_from_u64(self.sched.rng().random());
        let machine = ReminderMachine::new(
            addr,
            SERVICE,
            Arc::new(self.cfg.options.clone()),
            self.cfg.shards,
            rng,
        );
        let half = i64::try_from(self.cfg.max_clock_offset / 2).unwrap_or(i64::MAX);
        let offset = if half > 0 {
            self.sched.rng().random_range(-half..=half)
        } else {
            0
        };
        self.nodes.push(Node {
            addr,
            machine: Some(machine),
            life: Life::Active,
            view: Arc::default(),
            timers: HashMap::new(),
            cut_until: 0,
            offset,
            read_delay: 0,
        });
        let now = self.sched.time();
        self.members.insert(addr, (SiloStatus::Active, now));
        self.joins.push((i, self.sched.now_ms()));
        let clock = Event::Clock {
            within_bound: true,
            max_offset: Duration::from_millis(self.cfg.clock_bound_told.unwrap_or(self.cfg.max_clock_offset)),
        };
        self.sched.push(0, i, Ev::Machine(Box::new(clock)));
        self.sched.push(0, i, Ev::Machine(Box::new(Event::Start)));
        self.publish(Some(i));
        i
    }

    /// Silo `i` leaves gracefully: it releases its ranges, then is Dead.
    pub fn leave(&mut self, i: usize) {
        if self.nodes[i].life != Life::Active {
            return;
        }
        self.nodes[i].life = Life::Leaving;
        self.leaves.push((i, self.now(), None));
        // The leave hook reads the table first: the leaver sees the newest view.
        let view = self.latest.clone();
        self.sched.push(0, i, Ev::View(view));
        self.sched.push(0, i, Ev::Machine(Box::new(Event::Leave)));
    }

    /// Silo `i` crashes: it stops at once; the membership declares it Dead after
    /// the configured detection time.
    pub fn crash(&mut self, i: usize) {
        self.fail(i, false);
    }

    /// Silo `i` is declared Dead while it still runs: from now on it reaches
    /// neither the store nor another silo, the membership declares it Dead
    /// after the detection time, and it runs on, believing itself Active, for
    /// up to the longest detection time more before it stops. Its lost ticks
    /// are explained as a crash's.
    pub fn false_death(&mut self, i: usize) {
        self.fail(i, true);
    }

    /// Silo `i` measures its clock beyond the cluster's bound (`beyond`) or
    /// back within it: its machine hears so at once, and its membership row
    /// says so in a new view, which every silo reads after its own delay (the
    /// membership agent's conditional write of the flag, then gossip).
    pub fn clock_beyond(&mut self, i: usize, beyond: bool) {
        let addr = self.nodes[i].addr;
        let clock = Event::Clock {
            within_bound: !beyond,
            max_offset: Duration::from_millis(self.cfg.clock_bound_told.unwrap_or(self.cfg.max_clock_offset)),
        };
        self.sched.push(0, i, Ev::Machine(Box::new(clock)));
        if beyond {
            self.clock_beyond.insert(addr);
        } else {
            self.clock_beyond.remove(&addr);
        }
        self.publish(Some(i));
    }

    /// Silos `a` and `b` cannot reach each other for `ms` (both still reach
    /// the store).
    pub fn partition(&mut self, a: usize, b: usize, ms: u64) {
        let until = self.now() + ms;
        self.partitioned.push((self.now(), until));
        let (a, b) = (self.nodes[a].addr, self.nodes[b].addr);
        self.partitions.push((a, b, until));
    }

    fn fail(&mut self, i: usize, zombie: bool) {
        if !matches!(self.nodes[i].life, Life::Active | Life::Leaving) {
            return;
        }
        let own_view = Ring::of_active(&self.nodes[i].view, self.cfg.options.ring_points_per_silo);
        let me = self.nodes[i].addr;
        let members: std::collections::BTreeSet<SiloAddress> = self.members.keys().copied().collect();
        let ring = ring_among(
            &self.members,
            &self.clock_beyond,
            &members,
            self.cfg.options.ring_points_per_silo,
        );
        let leased = self.leased_by(me);
        let shards = self.cfg.shards;
        let owned = self
            .reminders
            .keys()
            .filter(|(actor, _)| {
                shard_owner(&own_view, actor, shards) == Some(me)
                    || shard_owner(&ring, actor, shards) == Some(me)
                    || leased.contains(&rollcall_core::actor_shard(actor, shards))
            })
            .cloned()
            .collect();
        let shards = leased;
        let checkpoints = shards
            .iter()
            .filter_map(|k| Some((*k, now_or_fail(self.leases.read(*k)).ok()?.owed_from?)))
            .collect();
        if zombie {
            self.nodes[i].life = Life::Zombie;
            self.nodes[i].cut_until = u64::MAX;
        } else {
            self.nodes[i].life = Life::Crashed;
            self.nodes[i].machine = None;
        }
        let (lo, hi) = self.cfg.detection;
        let after = self.sched.rng().random_range(lo..=hi);
        self.crashes.push(Crash {
            silo: i,
            at: self.now(),
            declared: None,
            owned,
            members: members.clone(),
            shards,
            checkpoints,
        });
        self.sched.push(after, i, Ev::Declared);
    }

    /// The shards whose lease `silo` holds now.
    fn leased_by(&self, silo: SiloAddress) -> std::collections::BTreeSet<u32> {
        (0..self.cfg.shards)
            .filter(|k| {
                now_or_fail(self.leases.read(*k))
                    .is_ok_and(|l| l.owner == Some(silo) && l.status == rollcall_core::LeaseStatus::Owned)
            })
            .collect()
    }

    /// The lease row of `shard` as the store holds it now.
    pub fn lease_row(&self, shard: u32) -> Option<rollcall_core::lease::ShardLease> {
        now_or_fail(self.leases.read(shard)).ok()
    }

    /// The silo (index) whose lease of `shard` is Owned now, if any.
    pub fn holder_of(&self, shard: u32) -> Option<usize> {
        let lease = now_or_fail(self.leases.read(shard)).ok()?;
        let owner = lease
            .owner
            .filter(|_| lease.status == rollcall_core::LeaseStatus::Owned)?;
        self.index_of(owner)
    }

    /// The table is unreachable for `ms`: every call fails after
    /// `table_operation_timeout`.
    pub fn outage(&mut self, ms: u64) {
        let (from, to) = (self.now(), self.now() + ms);
        self.outage_until = self.outage_until.max(to);
        self.outages.push((from, to));
    }

    /// Registers reminder `name` of `actor` (first tick at `start_at`, every
    /// `period`), through a random Active silo as the service does: writes the row,
    /// then notifies the owner in that silo's view. `false` (nothing registered) if
    /// the table is out or no silo is Active.
    pub fn register(&mut self, actor: &str, name: &str, start_at: Timestamp, period: Duration) -> bool {
        self.register_row(ReminderEntry::new(SERVICE, actor, name, start_at, Some(period)))
    }

    /// Registers `entry` (any kind: a one-shot, a calendar in a zone, an end, a
    /// payload, a policy) as [`register`](Self::register) does.
    ///
    /// # Panics
    /// If `entry`'s schedule cannot be read (a test's mistake).
    pub fn register_row(&mut self, entry: ReminderEntry) -> bool {
        let active = self.active();
        if self.out() || active.is_empty() {
            return false;
        }
        let (actor, name) = (entry.actor_id.clone(), entry.name.clone());
        let (actor, name) = (actor.as_str(), name.as_str());
        let timing = crate::schedule::Timing::of(&entry).expect("a readable schedule");
        let via = active[self.sched.rng().random_range(0..active.len())];
        let Ok(etag) = now_or_fail(self.table.upsert_row(&entry)) else {
            return false;
        };
        let replaced = self.reminders.insert(
            (actor.to_owned(), name.to_owned()),
            Lifetime {
                start_at: entry.start_at,
                period: entry.period.unwrap_or_default(),
                registered: self.now(),
                removed: None,
                etag,
                via,
                timing,
            },
        );
        if let Some(old) = replaced {
            self.replaced.push(((actor.to_owned(), name.to_owned()), old));
        }
        // Registered while a crashed silo that owns it is not yet declared Dead,
        // or while the registering silo's view still shows it Active (its notice
        // goes to the crashed silo): it waits for the failover too.
        let points = self.cfg.options.ring_points_per_silo;
        let view_ring = Ring::of_active(&self.nodes[via].view, points);
        let shards = self.cfg.shards;
        let shard = rollcall_core::actor_shard(actor, shards);
        let lease = now_or_fail(self.leases.read(shard)).ok();
        let holder = lease
            .as_ref()
            .filter(|l| l.status == rollcall_core::LeaseStatus::Owned)
            .and_then(|l| l.owner);
        // Taken over from the victim, its takeover time still to come: the
        // first ticks before it are the crash's.
        let fenced = lease
            .as_ref()
            .and_then(|l| l.watermark)
            .is_some_and(|w| w >= World::time_at(self.now()));
        for c in self.crashes.iter_mut() {
            let victim = self.nodes[c.silo].addr;
            if holder == Some(victim) || (fenced && c.shards.contains(&shard)) {
                c.owned.insert((actor.to_owned(), name.to_owned()));
            }
            if c.declared.is_none() {
                let ring = ring_among(&self.members, &self.clock_beyond, &c.members, points);
                if shard_owner(&ring, actor, shards) == Some(victim) {
                    c.owned.insert((actor.to_owned(), name.to_owned()));
                }
            }
            if shard_owner(&view_ring, actor, shards) == Some(victim) {
                c.owned.insert((actor.to_owned(), name.to_owned()));
            }
        }
        self.notify(via, NoticeRetry::new(SERVICE, actor, name));
        true
    }

    /// Removes reminder `name` of `actor` through a random Active silo (row, then
    /// notice). `false` if the table is out, no silo is Active, or it is not
    /// registered.
    pub fn unregister(&mut self, actor: &str, name: &str) -> bool {
        let active = self.active();
        let key = (actor.to_owned(), name.to_owned());
        let Some(life) = self.reminders.get(&key).filter(|l| l.removed.is_none()).cloned() else {
            return false;
        };
        if self.out() || active.is_empty() {
            return false;
        }
        let via = active[self.sched.rng().random_range(0..active.len())];
        if !now_or_fail(self.table.remove_row(actor, name, &life.etag, None)).unwrap_or(false) {
            return false;
        }
        let now = self.now();
        if let Some(l) = self.reminders.get_mut(&key) {
            l.removed = Some(now);
        }
        self.notify(via, NoticeRetry::new(SERVICE, actor, name));
        true
    }

    /// The notice the service sends after a registration change: to the holder
    /// the shard's lease names (read now), again by the rule of [`NoticeRetry`]
    /// while that silo does not take it; none when nobody holds the shard. A
    /// silo that left gracefully finished its sends first (its leave waits for
    /// them); a crashed one sends no more.
    fn notify(&mut self, via: usize, mut retry: NoticeRetry) {
        if self.nodes[via].machine.is_none() && self.nodes[via].life != Life::Left {
            return;
        }
        let shard = rollcall_core::actor_shard(&retry.notice().actor, self.cfg.shards);
        let lease = if self.out() {
            None
        } else {
            now_or_fail(self.leases.read(shard)).ok()
        };
        let taken = match lease.as_ref().map(crate::machine::notice_target) {
            Some(Some(holder)) => {
                let body = serde_json::to_vec(retry.notice()).unwrap_or_default();
                let from = self.nodes[via].addr;
                self.message(from, holder, body, false)
            }
            Some(None) => return,
            None => false,
        };
        if let Some(wait) = retry.after_send(taken) {
            self.sched.push(
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                via,
                Ev::Notify(retry),
            );
        }
    }

    /// A message from `from` to `to` on the notice (or release) topic, lost if `to`
    /// does not run; returns its latency.
    fn message(&mut self, from: SiloAddress, to: SiloAddress, body: Vec<u8>, release: bool) -> bool {
        let lat = 1 + self.rand(self.cfg.message_jitter);
        // The transport refuses a body over its limit, as the real one does.
        if body.len() > rollcall_core::protocol::MAX_NOTICE_BODY {
            self.oversized += 1;
            return false;
        }
        let now = self.now();
        let cut = |w: &World, a: SiloAddress| w.index_of(a).is_some_and(|k| now < w.nodes[k].cut_until);
        let parted = self
            .partitions
            .iter()
            .any(|(a, b, until)| now < *until && ((*a, *b) == (from, to) || (*b, *a) == (from, to)));
        let lost = self.cfg.message_loss > 0.0 && self.sched.rng().random_bool(self.cfg.message_loss);
        if cut(self, from) || cut(self, to) || parted || lost {
            return false;
        }
        if let Some(j) = self.index_of(to).filter(|j| self.nodes[*j].machine.is_some()) {
            let batch = vec![Inbound::Message { from, body }];
            let event = if release {
                Event::Releases(batch)
            } else {
                Event::Notices(batch)
            };
            self.sched.push(lat, j, Ev::Machine(Box::new(event)));
            return true;
        }
        false
    }

    /// A membership row of `addr`, its clock flag as the world says.
    fn entry(&self, addr: SiloAddress, status: SiloStatus, since: Timestamp) -> MembershipEntry {
        let mut e = MembershipEntry::new(addr, status, since);
        e.clock_beyond_bound = self.clock_beyond.contains(&addr);
        e
    }

    fn index_of(&self, addr: SiloAddress) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr == addr)
    }

    /// Writes a new membership version and sends it to every running silo, each
    /// after its own delay (`at_once` sees it at once).
    fn publish(&mut self, at_once: Option<usize>) {
        self.version += 1;
        let mut view = MembershipSnapshot {
            version: TableVersion {
                version: self.version,
                etag: Etag::new(self.version.to_string()),
            },
            ..MembershipSnapshot::default()
        };
        for (addr, (status, since)) in &self.members {
            view.insert(self.entry(*addr, *status, *since), Etag::new("1"));
        }
        // A crashed silo not yet declared Dead owns what the new ring gives it:
        // those reminders wait for the failover too.
        let points = self.cfg.options.ring_points_per_silo;
        for c in self.crashes.iter_mut().filter(|c| c.declared.is_none()) {
            let victim = self.nodes[c.silo].addr;
            let ring = ring_among(&self.members, &self.clock_beyond, &c.members, points);
            for key in self.reminders.keys() {
                if shard_owner(&ring, &key.0, self.cfg.shards) == Some(victim) {
                    c.owned.insert(key.clone());
                }
            }
        }
        let view = Arc::new(view);
        self.latest = view.clone();
        let now = self.now();
        for i in 0..self.nodes.len() {
            // A silo cut off from the store reads no view.
            if self.nodes[i].machine.is_none() || now < self.nodes[i].cut_until {
                continue;
            }
            let after = if at_once == Some(i) {
                0
            } else {
                self.rand(self.cfg.view_spread)
            };
            self.sched.push(after, i, Ev::View(view.clone()));
        }
    }

    /// Runs the world for `ms` of virtual time.
    ///
    /// # Panics
    /// If the machines handle [`LIVELOCK`] events without the clock moving (a
    /// machine that keeps re-arming a timer at the present, say).
    pub fn run_for(&mut self, ms: u64) {
        let until = self.now() + ms;
        let (mut at, mut same) = (self.now(), 0u32);
        while let Some((i, ev)) = self.sched.next_until(until) {
            if self.now() == at {
                same += 1;
                assert!(
                    same < LIVELOCK,
                    "livelock at {at} ms: silo {i} handles {same} events without the clock moving"
                );
            } else {
                (at, same) = (self.now(), 0);
            }
            self.step(i, ev);
        }
    }

    fn step(&mut self, i: usize, ev: Ev) {
        let event = match ev {
            Ev::Machine(e) => *e,
            Ev::Timer(t, token) => {
                if self.nodes[i].timers.get(&t) != Some(&token) {
                    return;
                }
                self.nodes[i].timers.remove(&t);
                match t {
                    Timer::Due => Event::Due {
                        active: matches!(self.nodes[i].life, Life::Active | Life::Leaving | Life::Zombie),
                    },
                    t => Event::Timer(t),
                }
            }
            Ev::View(view) => {
                if view.version.version <= self.nodes[i].view.version.version {
                    return;
                }
                self.nodes[i].view = view.clone();
                Event::View(view)
            }
            Ev::Left => {
                let now = self.now();
                if let Some(l) = self.leaves.iter_mut().rev().find(|l| l.0 == i) {
                    l.2 = Some(now);
                }
                self.nodes[i].life = Life::Left;
                self.nodes[i].machine = None;
                self.mark_dead(i);
                return;
            }
            Ev::Notify(retry) => {
                self.notify(i, retry);
                return;
            }
            Ev::Handled(tick, event) => {
                if self.nodes[i].machine.is_none() {
                    return; // crashed while the handler ran
                }
                if let Some(mut tick) = tick {
                    tick.at = self.now();
                    self.ticks.push(tick);
                }
                *event
            }
            Ev::Declared => {
                let now = self.now();
                if let Some(c) = self.crashes.iter_mut().rev().find(|c| c.silo == i) {
                    c.declared = Some(now);
                }
                self.mark_dead(i);
                if self.nodes[i].life == Life::Zombie {
                    let more = self.rand(self.cfg.detection.1);
                    self.sched.push(more, i, Ev::Stop);
                }
                return;
            }
            Ev::Stop => {
                self.nodes[i].life = Life::Crashed;
                self.nodes[i].machine = None;
                return;
            }
        };
        self.feed(i, event);
    }

    fn mark_dead(&mut self, i: usize) {
        let now = self.sched.time();
        self.members.insert(self.nodes[i].addr, (SiloStatus::Dead, now));
        self.publish(None);
    }

    /// Sets silo `i`'s clock to run `ms` ahead of the world's (behind when
    /// negative), as a test that needs a given skew does.
    pub fn set_clock_offset(&mut self, i: usize, ms: i64) {
        self.nodes[i].offset = ms;
    }

    /// A store failover loses the last write of `shard`'s lease row (Redis'
    /// asynchronous replication): the row goes back to what it was before
    /// it. `false` if the shard's row was never written.
    pub fn lose_last_lease_write(&mut self, shard: u32) -> bool {
        let Some(before) = self.lease_before.remove(&shard) else {
            return false;
        };
        let Ok(now) = now_or_fail(self.leases.read(shard)) else {
            return false;
        };
        let back = rollcall_core::lease::ShardLease {
            etag: now.etag,
            ..before
        };
        now_or_fail(self.leases.write(&back)).is_ok_and(|r| r.is_ok())
    }

    /// Every reminder-row read of silo `i` (a notice's row, a load's piece)
    /// from now on answers `ms` later than it would: a store slow for it.
    /// The rows are read when asked; the answer arrives late.
    pub fn slow_reads(&mut self, i: usize, ms: u64) {
        self.nodes[i].read_delay = ms;
    }

    /// Silo `i`'s clock now.
    fn clock_of(&self, i: usize) -> Timestamp {
        let t = self.sched.time().as_millis();
        Timestamp::from_millis(t.saturating_add_signed(self.nodes[i].offset))
    }

    fn feed(&mut self, i: usize, event: Event) {
        let now = self.clock_of(i);
        let Some(machine) = self.nodes[i].machine.as_mut() else {
            return;
        };
        let shown = self.watch.as_ref().map(|w| (w.clone(), describe(&event)));
        let actions = machine.handle(now, event);
        if let Some((w, event)) = shown {
            let actions = format!("{actions:?}");
            if w.split('|').any(|w| event.contains(w) || actions.contains(w)) {
                eprintln!(
                    "{:>7} ms silo {i}: {event}\n          -> {actions}",
                    self.sched.now_ms()
                );
            }
        }
        let m = &mut self.max_in_flight;
        m.0 = m.0.max(machine.deliveries());
        m.1 = m.1.max(machine.writes_in_flight());
        m.2 = m.2.max(machine.notice_reads());
        for a in actions {
            self.execute(i, a);
        }
    }

    /// A table call: its latency and its result (during an outage it times out
    /// after the operation timeout and `call` does not run).
    fn table_call<T>(
        &mut self,
        i: usize,
        call: impl std::future::Future<Output = rollcall_core::Result<T>>,
    ) -> (u64, Result<T, ReminderError>) {
        let timeout = self.cfg.options.table_operation_timeout;
        if self.out() || self.now() < self.nodes[i].cut_until {
            (timeout.as_millis() as u64, Err(ReminderError::Timeout(timeout)))
        } else {
            let lat = 1 + self.rand(self.cfg.table_jitter);
            (lat, now_or_fail(call).map_err(ReminderError::from))
        }
    }

    /// A lease write as the agent carries it out: its pages in calls of at
    /// most `PAGE_CALL_BYTES`, each a table call of its own that may take up
    /// to [`Config::page_call`] longer (and then time out, not applied, the
    /// attempt failing: the machine's retry resumes from the pages that
    /// landed), then the row by compare-and-set, then the cleanup of the
    /// pages no row names. Its latency is the sum of its calls'. A write
    /// without pages is one table call, as before pages existed.
    fn write_lease(
        &mut self,
        i: usize,
        lease: &rollcall_core::lease::ShardLease,
    ) -> (
        u64,
        Result<std::result::Result<rollcall_core::Etag, Option<rollcall_core::Etag>>, ReminderError>,
    ) {
        let leases = self.leases.clone();
        let mut write = match leases.prepare(lease) {
            Ok(w) => w,
            Err(e) => return (1, Err(e.into())),
        };
        if write.page_set().is_none() {
            return self.table_call(i, leases.write(lease));
        }
        let timeout = self.cfg.options.table_operation_timeout;
        let timeout_ms = timeout.as_millis() as u64;
        let mut total = 0;
        while write.pages_left() > 0 {
            let extra = if self.cfg.page_call > 0 {
                self.rand(self.cfg.page_call)
            } else {
                0
            };
            let jitter = 1 + self.rand(self.cfg.table_jitter);
            if self.out() || self.now() + total < self.nodes[i].cut_until || jitter + extra > timeout_ms {
                return (total + timeout_ms, Err(ReminderError::Timeout(timeout)));
            }
            total += jitter + extra;
            if let Err(e) = now_or_fail(leases.send_pages(&mut write)) {
                return (total, Err(e.into()));
            }
        }
        let (lat, result) = self.table_call(i, leases.commit(&write));
        total += lat;
        if matches!(result, Ok(Ok(_))) {
            now_or_fail(async {
                leases.cleanup(&write).await;
                Ok::<(), rollcall_core::Error>(())
            })
            .ok();
        }
        (total, result)
    }

    fn execute(&mut self, i: usize, action: Action) {
        let me = self.nodes[i].addr;
        match action {
            Action::ReadRow { lease_epoch, key } => {
                let table = self.table.clone();
                let (lat, result) = self.table_call(i, table.read_row(key.actor(), key.name()));
                let lat = lat + self.nodes[i].read_delay;
                self.sched.push(
                    lat,
                    i,
                    Ev::Machine(Box::new(Event::RowRead {
                        lease_epoch,
                        key,
                        result,
                    })),
                );
            }
            Action::ReadPiece { load, piece, width } => {
                let table = self.table.clone();
                let (lat, result) = self.table_call(i, table.read_rows_in_range(piece.begin, piece.end));
                let lat = lat + self.nodes[i].read_delay;
                let event = Event::PieceRead {
                    load,
                    piece,
                    width,
                    result,
                };
                self.sched.push(lat, i, Ev::Machine(Box::new(event)));
            }
            Action::Deliver {
                key,
                etag,
                scheduled,
                tick,
            } => {
                let lat = 1 + self.rand(self.cfg.handler);
                let fails = self.cfg.delivery_failure > 0.0
                    && self.sched.rng().random_bool(self.cfg.delivery_failure);
                let result = match tick {
                    Err(e) => Err(e),
                    Ok(tick) if fails => {
                        self.failed
                            .insert(((tick.actor.to_string(), tick.name), scheduled));
                        Err("the handler failed".to_owned())
                    }
                    Ok(tick) => Ok(Tick {
                        reminder: (tick.actor.to_string(), tick.name),
                        scheduled,
                        at: 0,
                        silo: i,
                        etag: tick.etag,
                    }),
                };
                let (tick, result) = match result {
                    Ok(tick) => (Some(tick), Ok(())),
                    Err(e) => (None, Err(e)),
                };
                let event = Event::Delivered {
                    key,
                    etag,
                    scheduled,
                    result,
                };
                self.sched.push(lat, i, Ev::Handled(tick, Box::new(event)));
            }
            Action::Write(write, fence) => {
                let table = self.table.clone();
                let parked = self.parked.clone();
                let (lat, result) = self.table_call(
                    i,
                    crate::machine::apply_write(&*table, Some(&*parked), &write, fence.as_ref()),
                );
                self.sched
                    .push(lat, i, Ev::Machine(Box::new(Event::Written { write, result })));
            }
            // The world does not model run histories (they change no delivery):
            // every append succeeds at once, with no table call, so the schedules
            // of the seeds stay those of the world before histories.
            Action::AppendRun(_) => {
                self.sched
                    .push(0, i, Ev::Machine(Box::new(Event::RunAppended { ok: true })))
            }
            Action::SendHints(hints) => {
                for (to, h) in hints {
                    self.message(me, to, serde_json::to_vec(&h).unwrap_or_default(), true);
                }
            }
            Action::FinishLeave => self.sched.push(1, i, Ev::Left),
            Action::ReadLease(shard) | Action::ReadLeaseHead(shard) => {
                let whole = matches!(action, Action::ReadLease(_));
                let leases = self.leases.clone();
                let (lat, result) = if whole {
                    self.table_call(i, leases.read(shard))
                } else {
                    self.table_call(i, leases.read_head(shard))
                };
                let result = result.map_err(|e| e.to_string());
                self.sched.push(
                    lat,
                    i,
                    Ev::Machine(Box::new(Event::Shard(ShardEvent::Read { shard, result }))),
                );
            }
            Action::WriteLease(lease) => {
                let leases = self.leases.clone();
                let shard = lease.shard;
                let before = now_or_fail(leases.read(shard)).ok();
                let (lat, result) = self.write_lease(i, &lease);
                if let (Ok(Ok(_)), Some(before)) = (&result, before) {
                    self.lease_before.insert(shard, before);
                }
                let result = result.map_err(|e| crate::shards::write_failed(&e));
                self.sched.push(
                    lat,
                    i,
                    Ev::Machine(Box::new(Event::Shard(ShardEvent::Written { shard, result }))),
                );
            }
            Action::ReadSilo(silo) => {
                let (lat, result) = self.status_read(i, silo);
                self.sched.push(
                    lat,
                    i,
                    Ev::Machine(Box::new(Event::Shard(ShardEvent::SiloRead { silo, result }))),
                );
            }
            Action::ConfirmSelf => {
                let at = self.sched.time();
                let (lat, result) = self.status_read(i, me);
                self.sched.push(
                    lat,
                    i,
                    Ev::Machine(Box::new(Event::Shard(ShardEvent::SelfRead { at, result }))),
                );
            }
            Action::SetTimer(timer, at) => {
                self.tokens += 1;
                let token = self.tokens;
                self.nodes[i].timers.insert(timer, token);
                // `at` is on the silo's clock.
                let at_ms = at
                    .as_millis()
                    .saturating_add_signed(-self.nodes[i].offset)
                    .saturating_sub(rollcall_core::sim::T0_MS);
                self.sched.push_at(at_ms, i, Ev::Timer(timer, token));
            }
            Action::CancelTimer(timer) => {
                self.nodes[i].timers.remove(&timer);
            }
            Action::Held(held) => {
                self.takeovers
                    .extend(held.not_before.into_iter().map(|(k, t)| (i, k, t)));
            }
            Action::LeaveDone
            | Action::Loaded
            | Action::TickDelivered { .. }
            | Action::Owned(_)
            | Action::TickDropped
            | Action::TickParked
            | Action::TicksSkipped(_) => {}
        }
    }

    /// A membership row read: its latency and the silo's status.
    fn status_read(&mut self, i: usize, silo: SiloAddress) -> (u64, Result<Option<SiloStatus>, String>) {
        let status = self.members.get(&silo).map(|(s, _)| *s);
        let (lat, result) = self.table_call(i, async { Ok(status) });
        (lat, result.map_err(|e| e.to_string()))
    }

    /// Which Active silo owns `actor`'s reminders in the true membership now.
    pub fn owner_now(&self, actor: &str) -> Option<usize> {
        let mut view = MembershipSnapshot::default();
        for (addr, (status, since)) in &self.members {
            view.insert(self.entry(*addr, *status, *since), Etag::new("1"));
        }
        let ring = Ring::of_active(&view, self.cfg.options.ring_points_per_silo);
        shard_owner(&ring, actor, self.cfg.shards).and_then(|a| self.index_of(a))
    }

    /// The registration of `reminder` whose etag is `etag`: the latest one or
    /// one a later registration replaced.
    pub fn registration(&self, reminder: &(String, String), etag: &Etag) -> Option<&Lifetime> {
        self.reminders
            .get(reminder)
            .filter(|l| &l.etag == etag)
            .or_else(|| {
                self.replaced
                    .iter()
                    .find(|(r, l)| r == reminder && &l.etag == etag)
                    .map(|(_, l)| l)
            })
    }

    /// Whether occurrence `at` of `reminder`, delivered twice, is a repeat
    /// the crash semantics with checkpoints allow: its shard's lease was
    /// held by a silo that crashed (or was declared Dead) with a checkpoint
    /// in the row, `at` is at or after that checkpoint less the clock bound
    /// (the successor owes from there), and before the takeover time's
    /// bound (declared Dead, plus the lease period and the clock bound:
    /// the Dead holder delivered nothing after it).
    pub fn checkpoint_repeat(&self, reminder: &(String, String), at: Timestamp) -> bool {
        let k = rollcall_core::actor_shard(&reminder.0, self.cfg.shards);
        let bound = self.cfg.options.lease_period.as_millis() as u64 + self.cfg.max_clock_offset;
        self.crashes.iter().any(|c| {
            c.checkpoints.get(&k).is_some_and(|cp| {
                let from = cp.as_millis().saturating_sub(self.cfg.max_clock_offset);
                let until = c.declared.unwrap_or(u64::MAX).saturating_add(bound);
                at.as_millis() >= from && at <= World::time_at(until)
            })
        })
    }

    /// Occurrences delivered more than once: ((actor, name), occurrence).
    /// An occurrence is one of a registration (its etag), as
    /// `ReminderTick::occurrence_id` says: a reminder registered again whose
    /// first tick falls on the old registration's next one delivers both.
    pub fn duplicates(&self) -> Vec<((String, String), Timestamp)> {
        let mut seen: BTreeMap<(&(String, String), &Etag, Timestamp), usize> = BTreeMap::new();
        for t in &self.ticks {
            *seen.entry((&t.reminder, &t.etag, t.scheduled)).or_default() += 1;
        }
        seen.into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|((r, _, s), _)| (r.clone(), s))
            .collect()
    }

    /// Ticks their own registration does not explain: a time that is not one
    /// of its occurrences, or an occurrence due more than `slack` ms after a
    /// later registration of the same reminder replaced it (the holder kept
    /// the old schedule). ((actor, name), occurrence).
    pub fn foreign_ticks(&self, slack: u64) -> Vec<((String, String), Timestamp)> {
        let mut foreign = Vec::new();
        for t in &self.ticks {
            let Some(life) = self.registration(&t.reminder, &t.etag) else {
                foreign.push((t.reminder.clone(), t.scheduled));
                continue;
            };
            let timing = &life.timing;
            let in_schedule =
                t.scheduled >= timing.start_at && timing.at_or_before(t.scheduled) == Some(t.scheduled);
            let replaced_at = self
                .replaced
                .iter()
                .filter(|(r, _)| r == &t.reminder)
                .map(|(_, l)| l)
                .chain(self.reminders.get(&t.reminder))
                .filter(|l| l.registered > life.registered)
                .map(|l| l.registered)
                .min();
            let stale = replaced_at.is_some_and(|at| t.scheduled > World::time_at(at + slack));
            if !in_schedule || stale {
                foreign.push((t.reminder.clone(), t.scheduled));
            }
        }
        foreign
    }

    /// Occurrences never delivered: for each reminder, every occurrence of its
    /// schedule (a period, a calendar, one for a one-shot, none past its end)
    /// from its first one up to `until` (virtual ms) and, if it was removed, up to `slack`
    /// ms before its removal (a tick due just before its removal may still be on
    /// its way when the owner reads the removal).
    pub fn missed(&self, until: u64, slack: u64) -> Vec<((String, String), Timestamp)> {
        let delivered: std::collections::BTreeSet<(&(String, String), Timestamp)> =
            self.ticks.iter().map(|t| (&t.reminder, t.scheduled)).collect();
        let mut missed = Vec::new();
        for (key, life) in &self.reminders {
            let end = life
                .removed
                .map_or(u64::MAX, |r| r.saturating_sub(slack))
                .min(until);
            let end = World::time_at(end);
            let mut next = Some(life.start_at).filter(|t| life.timing.end_at.is_none_or(|e| *t <= e));
            while let Some(t) = next.filter(|t| *t < end) {
                if !delivered.contains(&(key, t)) {
                    missed.push((key.clone(), t));
                }
                next = life.timing.after(t);
            }
        }
        missed
    }
}

/// An event as text, message bodies decoded (for [`World::watch`]).
fn describe(event: &Event) -> String {
    let batch = |b: &[Inbound]| {
        b.iter()
            .map(|m| match m {
                Inbound::Message { from, body } => format!("{from}: {}", String::from_utf8_lossy(body)),
                Inbound::Dropped(n) => format!("{n} dropped"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    match event {
        Event::Notices(b) => format!("Notices({})", batch(b)),
        Event::Releases(b) => format!("Hints({})", batch(b)),
        Event::View(v) => format!(
            "View(v{}: {:?})",
            v.version.version,
            v.entries
                .iter()
                .map(|r| (r.entry.silo.to_string(), r.entry.status))
                .collect::<Vec<_>>()
        ),
        e => format!("{e:?}"),
    }
}

/// The ring of the Active silos of `members` that are also in `among`.
fn ring_among(
    members: &BTreeMap<SiloAddress, (SiloStatus, Timestamp)>,
    clock_beyond: &std::collections::BTreeSet<SiloAddress>,
    among: &std::collections::BTreeSet<SiloAddress>,
    points: u32,
) -> Ring {
    let mut view = MembershipSnapshot::default();
    for (addr, (status, since)) in members.iter().filter(|(a, _)| among.contains(a)) {
        let mut e = MembershipEntry::new(*addr, *status, *since);
        e.clock_beyond_bound = clock_beyond.contains(addr);
        view.insert(e, Etag::new("1"));
    }
    Ring::of_active(&view, points)
}

//! The membership protocol as state machines only: no actix, no tokio, no sockets.
//!
//! A small deterministic driver (on the shared virtual-time
//! [`Scheduler`](rollcall_core::sim::Scheduler)) feeds [`SiloMachine`]s their events in time order,
//! executes their table actions on the real in-memory provider (whose futures
//! complete at once) and delivers every result after a latency drawn from a seeded
//! RNG; pings are answered by the target's liveness. Property tests vary the
//! latencies (so the order of events), the cluster size, message loss and the time
//! of a crash.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use rand::Rng;
use rollcall_core::protocol::{Action, Event, IndirectOutcome, PingOutcome, SiloMachine, Timer};
use rollcall_core::sim::{now_or_fail, Scheduler};
use rollcall_core::{
    ClusterMembershipOptions, MembershipEntry, MembershipSnapshot, MembershipTable, SiloAddress, SiloStatus,
    SystemStore, Timestamp,
};
use rollcall_provider_memory::MemoryStore;

struct World {
    sched: Scheduler<Event>,
    machines: Vec<SiloMachine>,
    addrs: Vec<SiloAddress>,
    crashed: Vec<bool>,
    stopped: Vec<bool>,
    /// A stalled silo handles nothing before this time (ms); what reaches it waits.
    stalled_until: Vec<u64>,
    store: MemoryStore,
    table: Arc<dyn MembershipTable>,
    options: ClusterMembershipOptions,
    loss: f64,
    published: Vec<Vec<u64>>,
    joined: Vec<Option<Result<(), String>>>,
    max_pending_writes: usize,
    full_reads: u64,
    delta_reads: u64,
    max_gossip_fan_out: usize,
    /// Added to the latency of every table call (ms).
    table_delay: u64,
    /// Per silo: when (ms) it asked for each delta read.
    delta_reads_at: Vec<Vec<u64>>,
    /// Per silo: its side of a network partition. Silos on different sides drop
    /// each other's messages silently (pings time out); every silo still reaches
    /// the table.
    side: Vec<u8>,
}

impl World {
    fn new(options: ClusterMembershipOptions, seed: u64, jitter_ms: u64, loss: f64) -> Self {
        let store = MemoryStore::new();
        let table = store.membership_table("m", options.protocol_mode()).unwrap();
        now_or_fail(table.init(true)).unwrap();
        World {
            sched: Scheduler::new(seed, jitter_ms),
            machines: Vec::new(),
            addrs: Vec::new(),
            crashed: Vec::new(),
            stopped: Vec::new(),
            stalled_until: Vec::new(),
            store,
            table,
            options,
            loss,
            published: Vec::new(),
            joined: Vec::new(),
            max_pending_writes: 0,
            full_reads: 0,
            delta_reads: 0,
            max_gossip_fan_out: 0,
            table_delay: 0,
            delta_reads_at: Vec::new(),
            side: Vec::new(),
        }
    }

    fn time(&self) -> Timestamp {
        self.sched.time()
    }

    fn now(&self) -> u64 {
        self.sched.now_ms()
    }

    fn push(&mut self, after: u64, silo: usize, event: Event) {
        self.sched.push(after, silo, event);
    }

    fn latency(&mut self) -> u64 {
        self.sched.latency()
    }

    fn lost(&mut self) -> bool {
        self.loss > 0.0 && self.sched.rng().random_bool(self.loss)
    }

    fn add_silo(&mut self, n: u8) -> usize {
        let me: SiloAddress = format!("10.0.0.{n}:11111@1").parse().unwrap();
        let row = MembershipEntry::new(me, SiloStatus::Created, self.time());
        let seed = self.sched.rng().random();
        self.machines
            .push(SiloMachine::new("m", me, row, self.options.clone(), seed));
        self.addrs.push(me);
        self.crashed.push(false);
        self.stopped.push(false);
        self.stalled_until.push(0);
        self.published.push(Vec::new());
        self.joined.push(None);
        self.delta_reads_at.push(Vec::new());
        self.side.push(0);
        let i = self.machines.len() - 1;
        self.push(0, i, Event::Start);
        i
    }

    fn alive(&self, i: usize) -> bool {
        !self.crashed[i] && !self.stopped[i]
    }

    /// Whether `i` and `j` are on the same side of the partition (if any).
    fn linked(&self, i: usize, j: usize) -> bool {
        self.side[i] == self.side[j]
    }

    /// Splits the network: silo `k` goes to side `sides[k]`.
    fn partition(&mut self, sides: &[u8]) {
        self.side = sides.to_vec();
    }

    fn heal(&mut self) {
        self.side.iter_mut().for_each(|s| *s = 0);
    }

    fn feed(&mut self, i: usize, event: Event) {
        if !self.alive(i) {
            return;
        }
        let now = self.time();
        let actions = self.machines[i].handle(now, event);
        self.max_pending_writes = self.max_pending_writes.max(self.machines[i].pending_writes());
        for a in actions {
            self.execute(i, a);
        }
    }

    fn execute(&mut self, i: usize, action: Action) {
        let lat = self.latency();
        let table = self.table.clone();
        let table_lat = lat + self.table_delay;
        match action {
            Action::ReadTable { id } => {
                self.full_reads += 1;
                let result = now_or_fail(table.read_all());
                self.push(table_lat, i, Event::TableRead { id, result });
            }
            Action::ReadDelta { id, since } => {
                self.delta_reads += 1;
                let now = self.now();
                self.delta_reads_at[i].push(now);
                let result = now_or_fail(table.read_delta(&since));
                self.push(table_lat, i, Event::DeltaRead { id, result });
            }
            Action::WriteRow {
                id,
                write,
                next_version,
                origin,
                ..
            } => {
                let result =
                    now_or_fail(table.write_row(write.entry(), write.mode(), &next_version, &origin));
                self.push(table_lat, i, Event::RowWritten { id, result });
            }
            Action::WriteIAmAlive { time } => {
                let me = self.addrs[i];
                let r = now_or_fail(table.update_i_am_alive(&me, time));
                self.push(lat, i, Event::IAmAliveWritten(r));
            }
            Action::CleanupDefunct { before } => {
                let r = now_or_fail(table.cleanup_defunct(before));
                self.push(lat, i, Event::CleanupDone(r));
            }
            Action::Ping { target, seq, timeout } => {
                let j = self.addrs.iter().position(|a| *a == target);
                let timeout_ms = timeout.as_millis() as u64;
                let (after, outcome) = match j {
                    Some(j) if self.alive(j) && self.linked(i, j) && !self.lost() => {
                        // A stalled target answers when it resumes.
                        let rtt = 2 * lat + self.stalled_until[j].saturating_sub(self.now());
                        if rtt < timeout_ms {
                            (
                                rtt,
                                PingOutcome::Answered {
                                    rtt: Duration::from_millis(rtt),
                                },
                            )
                        } else {
                            (timeout_ms, PingOutcome::Failed)
                        }
                    }
                    // A crashed silo's port is closed: refused at once.
                    Some(j) if self.crashed[j] && self.linked(i, j) => (lat, PingOutcome::Failed),
                    _ => (timeout_ms, PingOutcome::Failed),
                };
                // The target answers with its view's version (the version spreads
                // with the probes).
                let peer_version = match (&outcome, j) {
                    (PingOutcome::Answered { .. }, Some(j)) => {
                        // ... and learns the prober's, as the probe server does.
                        let mine = self.machines[i].view_version();
                        if mine > self.machines[j].view_version() {
                            self.push(lat, j, Event::GossipReceived { version: mine });
                        }
                        Some(self.machines[j].view_version())
                    }
                    _ => None,
                };
                self.push(
                    after,
                    i,
                    Event::PingResult {
                        target,
                        seq,
                        outcome,
                        peer_version,
                    },
                );
            }
            Action::IndirectPing {
                via,
                target,
                seq,
                timeout,
                intermediary_timeout,
            } => {
                let v = self.addrs.iter().position(|a| *a == via);
                let t = self.addrs.iter().position(|a| *a == target);
                let outcome = match (v, t) {
                    (Some(v), Some(t)) if self.alive(v) && self.linked(i, v) && !self.lost() => {
                        let reachable = self.alive(t)
                            && self.linked(v, t)
                            && self.stalled_until[t] <= self.now() + intermediary_timeout.as_millis() as u64;
                        if reachable && !self.lost() {
                            IndirectOutcome::Answered
                        } else {
                            IndirectOutcome::Failed {
                                intermediary_health: 0,
                            }
                        }
                    }
                    _ => IndirectOutcome::Unknown,
                };
                let after = if outcome == IndirectOutcome::Unknown {
                    timeout.as_millis() as u64
                } else {
                    4 * lat
                };
                self.push(after, i, Event::IndirectResult { target, seq, outcome });
            }
            Action::Gossip { to, version } => {
                self.max_gossip_fan_out = self.max_gossip_fan_out.max(to.len());
                for silo in to {
                    if let Some(j) = self.addrs.iter().position(|a| *a == silo) {
                        if self.linked(i, j) && !self.lost() {
                            let lat = self.latency();
                            self.push(lat, j, Event::GossipReceived { version });
                        }
                    }
                }
            }
            Action::Publish {
                snapshot,
                new_version,
            } => {
                if new_version {
                    self.published[i].push(snapshot.version.version);
                }
            }
            Action::Schedule { timer, after } => {
                let event = match timer {
                    Timer::HealthCheck => Event::HealthCheck { probes_received: 1 },
                    t => Event::Timer(t),
                };
                self.push(after.as_millis() as u64, i, event);
            }
            Action::JoinFinished(r) => self.joined[i] = Some(r.map_err(|e| e.to_string())),
            Action::Stop(_) => self.stopped[i] = true,
            Action::SetStatus(_)
            | Action::SetHealthScore(_)
            | Action::AnswerRefresh { .. }
            | Action::AnswerShutdown { .. } => {}
        }
    }

    fn run_for(&mut self, ms: u64) {
        let until = self.now() + ms;
        while let Some((i, event)) = self.sched.next_until(until) {
            let at = self.now();
            if self.stalled_until[i] > at {
                let wait = self.stalled_until[i] - at;
                self.push(wait, i, event);
                continue;
            }
            self.feed(i, event);
        }
    }

    fn table(&self) -> MembershipSnapshot {
        now_or_fail(self.table.read_all()).unwrap()
    }

    fn dead(&self) -> Vec<SiloAddress> {
        self.table()
            .rows()
            .filter(|e| e.status == SiloStatus::Dead)
            .map(|e| e.silo)
            .collect()
    }

    /// Runs in steps of `step` ms until `cond` holds (returns the time it took) or
    /// `limit` ms pass.
    fn run_until(&mut self, limit: u64, mut cond: impl FnMut(&World) -> bool) -> Option<u64> {
        let start = self.now();
        while self.now() - start <= limit {
            if cond(self) {
                return Some(self.now() - start);
            }
            self.run_for(10);
        }
        None
    }
}

fn cluster(n: u8, seed: u64, jitter_ms: u64, loss: f64) -> World {
    cluster_with(ClusterMembershipOptions::default(), n, seed, jitter_ms, loss)
}

fn cluster_with(options: ClusterMembershipOptions, n: u8, seed: u64, jitter_ms: u64, loss: f64) -> World {
    let mut w = World::new(options, seed, jitter_ms, loss);
    for k in 1..=n {
        w.add_silo(k);
        w.run_until(60_000, |w| w.joined.last().is_some_and(Option::is_some))
            .expect("join finishes");
        assert_eq!(w.joined.last().cloned().flatten(), Some(Ok(())), "silo {k} joins");
    }
    w
}

#[test]
fn joins_detect_a_crash_within_the_bound_and_nobody_else_dies() {
    let mut w = cluster(5, 1, 5, 0.0);
    w.run_for(60_000);
    assert!(w.machines.iter().all(|m| m.status() == SiloStatus::Active));
    assert_eq!(w.table().active().count(), 5);
    w.crashed[4] = true;
    let victim = w.addrs[4];
    let o = ClusterMembershipOptions::default();
    // limit x T of silence, at most one probe period to notice, plus writes.
    let bound = o.probe_timeout.as_millis() as u64 * 3 + o.probe_period().as_millis() as u64 + 500;
    let took = w
        .run_until(120_000, |w| w.dead().contains(&victim))
        .expect("declared Dead");
    assert!(took <= bound, "detection took {took} ms, bound {bound} ms");
    w.run_for(600_000);
    assert_eq!(w.dead(), vec![victim]);
    for (i, versions) in w.published.iter().enumerate() {
        assert!(
            versions.windows(2).all(|p| p[0] < p[1]),
            "silo {i} published {versions:?}"
        );
    }
}

/// Issue 7, defect 1 at the machine level: during a 20-minute outage with a crashed
/// silo, a survivor holds at most one write job (its vote against the one suspect),
/// however many probe windows fail.
#[test]
fn a_table_outage_never_piles_up_writes() {
    let mut w = cluster(3, 2, 5, 0.0);
    w.run_for(30_000);
    let before = w.max_pending_writes;
    w.store.set_unavailable(true);
    w.crashed[2] = true;
    w.run_for(20 * 60_000);
    assert!(
        w.max_pending_writes <= before.max(1),
        "pending writes reached {}",
        w.max_pending_writes
    );
    assert!(w.machines[..2].iter().all(|m| m.status() == SiloStatus::Active));
    w.store.set_unavailable(false);
    let victim = w.addrs[2];
    let took = w.run_until(120_000, |w| w.dead().contains(&victim));
    assert!(
        took.is_some(),
        "the crashed silo is declared Dead once the table is back"
    );
    assert_eq!(w.dead(), vec![victim]);
}

/// A silo stalled for less than `num_missed_probes_limit x probe_timeout` is never
/// declared Dead (issue 8's rule; the stall tolerance the README states).
#[test]
fn a_stall_shorter_than_the_limit_kills_nobody() {
    let o = ClusterMembershipOptions::default();
    let tolerated = o.probe_timeout.as_millis() as u64 * 3;
    let mut w = cluster(5, 3, 2, 0.0);
    w.run_for(60_000);
    for phase in [0u64, 700, 1300, 2100] {
        w.run_for(phase);
        // Stalled: it handles nothing (and answers nothing) until it resumes.
        w.stalled_until[2] = w.now() + tolerated - 100;
        w.run_for(60_000);
        assert!(
            w.dead().is_empty(),
            "a {} ms stall killed: {:?}",
            tolerated - 100,
            w.dead()
        );
    }
    // ... while a stall well beyond it is detected, and the silo stops when it wakes.
    w.stalled_until[2] = w.now() + 3 * tolerated;
    w.run_for(3 * tolerated + 60_000);
    assert_eq!(w.dead(), vec![w.addrs[2]]);
    assert!(w.stopped[2], "the stalled silo reads itself Dead and stops");
}

/// Issue 8, defect 3: the table loses its data (a Redis restarted empty) and other
/// writers push its version past the survivors' views before they read it again.
/// Every survivor logs the regression, writes its row again and keeps running;
/// detection works afterwards. Before, they kept their old view and, once the
/// version passed it, read their rows missing and all stopped "declared Dead".
#[test]
fn a_table_that_loses_its_data_is_survived() {
    for push_past in [false, true] {
        let mut w = cluster(4, 5, 5, 0.0);
        w.run_for(30_000);
        let old_version = w.table().version.version;
        now_or_fail(w.table.delete_all()).unwrap();
        now_or_fail(w.table.init(true)).unwrap();
        if push_past {
            // Someone else writes more versions than the survivors have seen.
            for k in 0..old_version + 5 {
                let ghost: SiloAddress = format!("10.9.0.{}:1@1", k + 1).parse().unwrap();
                let mut row = MembershipEntry::new(ghost, SiloStatus::Dead, w.time());
                row.i_am_alive_time = w.time();
                let v = w.table().version.next();
                assert!(now_or_fail(w.table.insert_row(&row, &v)).unwrap());
            }
            assert!(w.table().version.version > old_version);
        }
        let o = ClusterMembershipOptions::default();
        let limit = (o.table_refresh_timeout * 2).as_millis() as u64;
        let took = w.run_until(limit, |w| w.table().active().count() == 4);
        assert!(
            took.is_some(),
            "push_past={push_past}: survivors re-register: {:?}",
            w.table()
        );
        assert!(
            !w.stopped.iter().any(|s| *s),
            "push_past={push_past}: a survivor stopped"
        );
        w.crashed[3] = true;
        let victim = w.addrs[3];
        let took = w.run_until(60_000, |w| w.dead().contains(&victim));
        assert!(
            took.is_some(),
            "push_past={push_past}: a crash is detected after the loss"
        );
        assert!(w.machines[..3].iter().all(|m| m.status() == SiloStatus::Active));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the latencies (hence the order of events), the loss and the moment of
    /// the crash: only the crashed silo is ever Dead, it is Dead in the end, each
    /// silo's published versions strictly increase, and write jobs stay bounded by
    /// the cluster size.
    #[test]
    fn random_event_orders_keep_the_protocol_safe_and_live(
        seed in any::<u64>(),
        n in 3u8..=6,
        jitter in 0u64..300,
        loss in prop_oneof![Just(0.0), Just(0.02), Just(0.05)],
        crash_at in 0u64..20_000,
    ) {
        let mut w = cluster(n, seed, jitter, loss);
        w.run_for(crash_at);
        let victim = usize::from(n) - 1;
        w.crashed[victim] = true;
        w.run_for(5 * 60_000);
        let dead = w.dead();
        prop_assert_eq!(dead, vec![w.addrs[victim]]);
        for (i, versions) in w.published.iter().enumerate() {
            prop_assert!(versions.windows(2).all(|p| p[0] < p[1]), "silo {} published {:?}", i, versions);
        }
        prop_assert!(w.max_pending_writes <= usize::from(n), "pending writes {}", w.max_pending_writes);
        for i in 0..victim {
            prop_assert_eq!(w.machines[i].status(), SiloStatus::Active);
        }
    }
}

/// Issue 9: refreshes that gossip and writes trigger are delta reads; full reads
/// are the periodic refresh (one per `table_refresh_timeout`) and write jobs.
#[test]
fn gossip_triggered_refreshes_are_delta_reads() {
    let mut w = cluster(8, 9, 5, 0.0);
    let (full_at_join, delta_at_join) = (w.full_reads, w.delta_reads);
    assert!(
        delta_at_join > full_at_join,
        "joins: {delta_at_join} delta reads, {full_at_join} full reads"
    );
    // A join reads the whole table once (its first read); its own-status write
    // reads a delta (it used to read the whole table: two full reads per join).
    eprintln!("joins: {full_at_join} full reads, {delta_at_join} delta reads");
    assert!(
        full_at_join < 2 * 8,
        "joins: {full_at_join} full reads for 8 silos"
    );
    let o = ClusterMembershipOptions::default();
    let minutes = 10;
    w.run_for(minutes * 60_000);
    let full = w.full_reads - full_at_join;
    let periodic = 8 * (minutes * 60_000 / o.table_refresh_timeout.as_millis() as u64);
    assert!(
        full <= periodic + 8,
        "quiet cluster: {full} full reads, {periodic} periodic"
    );
    // A crash: the declaration's gossip is served by deltas.
    let before = (w.full_reads, w.delta_reads);
    w.crashed[7] = true;
    let victim = w.addrs[7];
    w.run_until(60_000, |w| w.dead().contains(&victim))
        .expect("declared Dead");
    w.run_for(2_000);
    assert!(
        w.delta_reads - before.1 >= 6,
        "survivors refreshed by delta after the declaration"
    );
    let table = w.table();
    for (i, m) in w.machines.iter().enumerate().take(7) {
        assert_eq!(m.status(), SiloStatus::Active, "silo {i}");
    }
    assert_eq!(table.status_of(&victim), Some(SiloStatus::Dead));
}

/// Writes `entry` to the table at its next version, as a silo outside the test's
/// machines would; returns the version written.
fn write_row(w: &World, entry: &MembershipEntry) -> u64 {
    let snap = w.table();
    let next = snap.version.next();
    let committed = match snap.entries.get(&entry.silo) {
        Some(row) => now_or_fail(w.table.update_row(entry, &row.etag, &next)),
        None => now_or_fail(w.table.insert_row(entry, &next)),
    };
    assert_eq!(committed.ok(), Some(true), "the test's own write commits");
    next.version
}

/// Issue 9: while reads show only joins (a join storm: rows inserted Joining, then
/// turned Active), gossip-triggered reads thin out, one per half of the time the
/// storm has lasted and at least one per probe period; the first read that shows a
/// death goes back to the base interval. At the base interval a 12-s storm with a
/// change every 50 ms costs a silo 48 reads, and per silo storm reads grow with
/// the storm, so with N.
#[test]
fn gossip_reads_thin_out_during_a_join_storm_and_not_for_a_death() {
    use rollcall_core::protocol::{gossip_refresh_interval, gossip_refresh_interval_cap};
    let mut w = cluster(3, 21, 5, 0.0);
    w.run_for(30_000);
    let o = ClusterMembershipOptions::default();
    let (base, cap) = (
        gossip_refresh_interval(&o).as_millis() as u64,
        gossip_refresh_interval_cap(&o).as_millis() as u64,
    );
    // 12 s of joins, a change every 50 ms, each gossiped to silo 0: rows inserted
    // Joining and rewritten. No silo answers for them, so the cluster's probes
    // start voting against them about 16 s after their insert: the storm and the
    // checks after it end before that (a vote is not a join).
    let storm_start = w.now();
    let mut joiners = Vec::new();
    for k in 0..240u32 {
        let silo: SiloAddress = format!("10.1.{}.{}:11111@1", k / 200, k % 200).parse().unwrap();
        let mut row = MembershipEntry::new(silo, SiloStatus::Joining, w.time());
        if k % 2 == 1 {
            row = joiners.pop().expect("a joiner");
            row.i_am_alive_time = w.time();
        }
        let version = write_row(&w, &row);
        joiners.push(row);
        w.push(1, 0, Event::GossipReceived { version });
        w.run_for(50);
    }
    let reads: Vec<u64> = w.delta_reads_at[0]
        .iter()
        .copied()
        .filter(|t| *t >= storm_start)
        .collect();
    let gaps: Vec<u64> = reads.windows(2).map(|p| p[1] - p[0]).collect();
    assert!(
        reads.len() <= 16,
        "silo 0 read {} times during a 12-s join storm (48 at the base interval): at {reads:?}",
        reads.len()
    );
    let widest = gaps.iter().copied().max().unwrap_or(0);
    assert!(
        widest <= cap + 100,
        "a {widest} ms gap between reads during the storm (cap {cap} ms): at {reads:?}"
    );
    assert!(
        gaps.iter().any(|g| *g >= cap - 100),
        "the reads never thinned out to the cap: gaps {gaps:?}"
    );
    // A death, then another change 300 ms later: the first is read within the cap,
    // the second within the base interval (the death reset it).
    let mut dead = joiners.pop().expect("a joiner");
    dead.status = SiloStatus::Dead;
    let t_dead = w.now();
    let v = write_row(&w, &dead);
    w.push(1, 0, Event::GossipReceived { version: v });
    w.run_until(cap + 200, |w| w.machines[0].view_version() >= v)
        .expect("the death is read within the cap");
    assert!(w.now() - t_dead <= cap + 100);
    w.run_for(300);
    let mut other = joiners.pop().expect("a joiner");
    other.status = SiloStatus::Active;
    let t_next = w.now();
    let v = write_row(&w, &other);
    w.push(1, 0, Event::GossipReceived { version: v });
    let took = w
        .run_until(cap, |w| w.machines[0].view_version() >= v)
        .expect("the next change is read");
    assert!(
        took <= base + 50,
        "after a death the next change took {took} ms to read (base interval {base} ms); since {t_next}"
    );
}

/// Issue 9: the table version spreads with the probes. With gossip off, the
/// silos learn of a new member within a few probe periods (its pings and pongs
/// carry its version), not only at the next periodic refresh
/// (`table_refresh_timeout`, 60 s).
#[test]
fn the_version_spreads_with_the_probes_without_gossip() {
    let options = ClusterMembershipOptions {
        use_liveness_gossip: false,
        ..Default::default()
    };
    let mut w = World::new(options.clone(), 11, 5, 0.0);
    for k in 1..=8 {
        w.add_silo(k);
        w.run_until(120_000, |w| w.joined.last().is_some_and(Option::is_some))
            .expect("join finishes");
        w.run_for(70_000); // every silo has refreshed since
    }
    w.add_silo(9);
    w.run_until(120_000, |w| w.joined.last().is_some_and(Option::is_some))
        .expect("join finishes");
    let joined_at = w.table().version.version;
    let took = w
        .run_until(60_000, |w| {
            (0..8).all(|i| w.machines[i].view_version() >= joined_at)
        })
        .expect("every silo learns the new member");
    let bound = 4 * options.probe_period().as_millis() as u64;
    assert!(
        took <= bound,
        "silos learned the new member after {took} ms without gossip (bound {bound} ms)"
    );
}

/// Issue 9: one write's gossip goes to `3 + ceil(log2 N)` silos, not all N; the
/// others learn the version from the probes, so a 40-silo cluster still converges
/// on a join within a few probe periods.
#[test]
fn gossip_goes_to_a_bounded_fan_out_and_the_cluster_still_converges() {
    use rollcall_core::protocol::gossip_fan_out;
    let o = ClusterMembershipOptions::default();
    assert_eq!(gossip_fan_out(&o, 1), 3);
    assert_eq!(gossip_fan_out(&o, 39), 9);
    assert_eq!(gossip_fan_out(&o, 1000), 13);
    let capped = ClusterMembershipOptions {
        max_gossip_fan_out: Some(2),
        ..o.clone()
    };
    assert_eq!(gossip_fan_out(&capped, 1000), 2);
    assert!(ClusterMembershipOptions {
        max_gossip_fan_out: Some(0),
        ..o.clone()
    }
    .validate()
    .is_err());

    let mut w = World::new(o.clone(), 13, 5, 0.0);
    for k in 1..=40 {
        w.add_silo(k);
    }
    w.run_until(300_000, |w| w.joined.iter().all(Option::is_some))
        .expect("40 joins finish");
    assert!(w.joined.iter().all(|j| j == &Some(Ok(()))), "{:?}", w.joined);
    assert!(
        w.max_gossip_fan_out <= 3 + 6,
        "gossip went to {} silos",
        w.max_gossip_fan_out
    );
    let version = w.table().version.version;
    let took = w
        .run_until(60_000, |w| w.machines.iter().all(|m| m.view_version() >= version))
        .expect("every silo converges");
    let bound = 4 * o.probe_period().as_millis() as u64;
    assert!(took <= bound, "converged after {took} ms (bound {bound} ms)");
    assert!(w.dead().is_empty(), "no false deaths: {:?}", w.dead());
}

/// Issue 9: a joiner validates its connectivity on a bounded sample of the Active
/// silos (`3 + ceil(log2 N)`), not on all of them as Orleans does.
#[test]
fn join_validation_pings_a_bounded_sample() {
    use rollcall_core::protocol::{Action, Event};
    let mut w = cluster(30, 17, 5, 0.0);
    w.run_for(30_000);
    let me: SiloAddress = "10.0.1.1:11111@1".parse().unwrap();
    let row = MembershipEntry::new(me, SiloStatus::Created, w.time());
    let mut m = SiloMachine::new("m", me, row, ClusterMembershipOptions::default(), 1);
    let t = w.time();
    let mut actions = m.handle(t, Event::Start);
    let mut pings = 0;
    // Drive the join's table steps by hand until validation pings go out.
    for _ in 0..20 {
        let mut next = Vec::new();
        for a in actions {
            match a {
                Action::ReadTable { id } => next.push(Event::TableRead {
                    id,
                    result: now_or_fail(w.table.read_all()),
                }),
                Action::WriteRow {
                    id,
                    write,
                    next_version,
                    origin,
                    ..
                } => {
                    let result =
                        now_or_fail(
                            w.table
                                .write_row(write.entry(), write.mode(), &next_version, &origin),
                        );
                    next.push(Event::RowWritten { id, result });
                }
                Action::Ping { .. } => pings += 1,
                _ => {}
            }
        }
        if pings > 0 || next.is_empty() {
            break;
        }
        actions = next.into_iter().flat_map(|e| m.handle(t, e)).collect();
    }
    // 30 Active silos: 3 + ceil(log2 30) = 8 pings.
    assert_eq!(pings, 8, "validation pings");
}

/// Issue 9: a join storm converges. 250 silos start at the same instant on a
/// table 100-110 ms away (a store under load): every join commits twice under the one version row, so
/// most writes conflict and some silos lose far more than 30 times in a row (the
/// count at which any other write job gives up). A join's conflicts are bounded by
/// `max_join_attempt_time` instead: every silo joins.
#[test]
fn a_join_storm_converges_without_failed_joins() {
    let mut w = World::new(ClusterMembershipOptions::default(), 11, 10, 0.0);
    w.sched.set_jitter_ms(10);
    for k in 1..=250u8 {
        w.add_silo(k);
    }
    w.table_delay = 100;
    let took = w
        .run_until(300_000, |w| w.joined.iter().all(Option::is_some))
        .expect("every join finishes");
    let failed: Vec<_> = w
        .joined
        .iter()
        .enumerate()
        .filter(|(_, j)| !matches!(j, Some(Ok(()))))
        .collect();
    assert!(failed.is_empty(), "joins failed after {took} ms: {failed:?}");
    let table = w.table();
    assert_eq!(
        table.rows().filter(|e| e.status == SiloStatus::Active).count(),
        250
    );
}

// ---- network partitions (every silo still reaches the table) -----------------------

/// How long a silo cut off from everyone is voted against at most: the suspicion
/// window, the probe period, the indirect probe and a reach round, plus the writes.
fn probe_detection_bound(o: &ClusterMembershipOptions) -> u64 {
    let t = o.probe_timeout.as_millis() as u64;
    t * u64::from(o.num_missed_probes_limit) + o.probe_period().as_millis() as u64 + 2 * t + 1_000
}

/// How long a crashed silo is declared Dead at most when the survivors hold no
/// majority: its IAmAlive goes stale (`i_am_alive_publish_period x
/// num_missed_table_i_am_alive_limit` after its last one, measured from the newest
/// one in the table, at most one period old), then a suspicion window of probes
/// whose timeouts doubled (the survivors found no majority before, which raised
/// their local health score by 1), plus the probe period and the writes.
fn stale_detection_bound(o: &ClusterMembershipOptions) -> u64 {
    let period = o.i_am_alive_publish_period.as_millis() as u64;
    let t = o.probe_timeout.as_millis() as u64;
    period * u64::from(o.num_missed_table_i_am_alive_limit + 1)
        + 2 * t * u64::from(o.num_missed_probes_limit)
        + o.probe_period().as_millis() as u64
        + 2 * t
        + 1_000
}

/// The default and fast profiles, and the fast one probing 2 targets only, so that
/// a silo's fresh answers never show a majority by themselves and every vote goes
/// through a reach round.
fn profiles() -> [(&'static str, ClusterMembershipOptions); 3] {
    [
        ("default", ClusterMembershipOptions::default()),
        ("fast", ClusterMembershipOptions::fast()),
        (
            "fast, 2 targets",
            ClusterMembershipOptions {
                num_probed_silos: 2,
                ..ClusterMembershipOptions::fast()
            },
        ),
    ]
}

/// Silos that are Dead in the table or stopped.
fn fallen(w: &World) -> Vec<usize> {
    let dead = w.dead();
    (0..w.addrs.len())
        .filter(|i| w.stopped[*i] || dead.contains(&w.addrs[*i]))
        .collect()
}

/// After healing: every silo still running is Active, in one view.
fn assert_one_view(w: &mut World, what: &str) {
    let settle = 4 * probe_detection_bound(&w.options);
    let ok = w.run_until(settle.max(60_000), |w| {
        let running: Vec<usize> = (0..w.addrs.len()).filter(|i| w.alive(*i)).collect();
        let versions: Vec<u64> = running.iter().map(|i| w.machines[*i].view_version()).collect();
        running
            .iter()
            .all(|i| w.machines[*i].status() == SiloStatus::Active)
            && versions.windows(2).all(|p| p[0] == p[1])
    });
    assert!(
        ok.is_some(),
        "{what}: after healing, the running silos are not all Active in one view"
    );
}

/// 2|3 for long enough to detect anything: the 3 never die, the 2 are declared Dead.
#[test]
fn a_2_3_split_takes_down_only_the_minority() {
    for (name, o) in profiles() {
        let mut w = cluster_with(o.clone(), 5, 11, 5, 0.0);
        w.run_for(60_000);
        w.partition(&[1, 1, 0, 0, 0]);
        w.run_for(3 * probe_detection_bound(&o));
        let fell = fallen(&w);
        assert!(fell.iter().all(|i| *i < 2), "{name}: the majority lost {fell:?}");
        assert_eq!(
            w.dead(),
            vec![w.addrs[0], w.addrs[1]],
            "{name}: the minority is declared Dead"
        );
        w.heal();
        assert_one_view(&mut w, name);
        assert!((2..5).all(|i| w.alive(i)), "{name}");
    }
}

/// 2|2|1: no side holds a majority, so nobody declares anybody, however long.
#[test]
fn a_split_without_a_majority_kills_nobody() {
    for (name, o) in profiles() {
        let mut w = cluster_with(o.clone(), 5, 12, 5, 0.0);
        w.run_for(60_000);
        w.partition(&[0, 0, 1, 1, 2]);
        w.run_for(3 * stale_detection_bound(&o));
        assert!(w.dead().is_empty(), "{name}: {:?} died", w.dead());
        assert!((0..5).all(|i| w.alive(i)), "{name}");
        w.heal();
        assert_one_view(&mut w, name);
        assert!(w.dead().is_empty(), "{name}: {:?} died after healing", w.dead());
    }
}

/// 1|4: only the isolated silo may die (and does).
#[test]
fn an_isolated_silo_is_the_only_one_to_die() {
    for (name, o) in profiles() {
        let mut w = cluster_with(o.clone(), 5, 13, 5, 0.0);
        w.run_for(60_000);
        w.partition(&[0, 0, 1, 0, 0]);
        w.run_for(3 * probe_detection_bound(&o));
        assert_eq!(fallen(&w), vec![2], "{name}");
        w.heal();
        assert_one_view(&mut w, name);
    }
}

/// 3 of 5 crash at once: the 2 survivors hold no majority of the 5, but the table
/// witnesses the crash (the 3 stop heartbeating): they are declared Dead within
/// the stale-detection bound, and the 2 keep running.
#[test]
fn a_mass_crash_is_detected_through_stale_heartbeats() {
    for (name, o) in profiles() {
        let mut w = cluster_with(o.clone(), 5, 14, 5, 0.0);
        w.run_for(60_000);
        for i in 2..5 {
            w.crashed[i] = true;
        }
        let victims: Vec<SiloAddress> = w.addrs[2..].to_vec();
        let bound = stale_detection_bound(&o);
        let took = w
            .run_until(2 * bound, |w| victims.iter().all(|v| w.dead().contains(v)))
            .unwrap_or_else(|| panic!("{name}: {:?} of {victims:?} declared Dead", w.dead()));
        assert!(took <= bound, "{name}: took {took} ms, bound {bound} ms");
        assert!(w.alive(0) && w.alive(1), "{name}");
        assert_eq!(w.dead().len(), 3, "{name}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random partitions of 3 to 9 silos into 1 to 4 sides, lasting less or more
    /// than the detection bound: a silo on a side that holds a strict majority
    /// never dies; with no such side nobody dies; after healing the silos still
    /// running are all Active in one view.
    #[test]
    fn random_partitions_never_take_down_a_majority(
        seed in any::<u64>(),
        n in 3u8..=9,
        sides in proptest::collection::vec(0u8..4, 9),
        profile in 0usize..3,
        length_pct in 20u64..400,
    ) {
        let o = profiles()[profile].1.clone();
        let mut w = cluster_with(o.clone(), n, seed, 20, 0.0);
        w.run_for(60_000);
        let sides = &sides[..usize::from(n)];
        let mut sizes = [0usize; 4];
        for s in sides {
            sizes[usize::from(*s)] += 1;
        }
        let majority = (0..4u8).find(|s| sizes[usize::from(*s)] * 2 > usize::from(n));
        w.partition(sides);
        w.run_for(probe_detection_bound(&o) * length_pct / 100);
        let fell = fallen(&w);
        match majority {
            Some(m) => prop_assert!(
                fell.iter().all(|i| sides[*i] != m),
                "sides {:?}: the majority side {} lost {:?}", sides, m, fell
            ),
            None => prop_assert!(fell.is_empty(), "sides {:?} (no majority): {:?} fell", sides, fell),
        }
        w.heal();
        assert_one_view(&mut w, "random partition");
    }
}

/// Issue 70, item 4: a silo whose clock crosses the bound says so in its own
/// row with a conditional write (the version row moves, so every view orders
/// it), quick flips merge into the newest value, and it says so again when the
/// clock is back; nobody is suspected for it.
#[test]
fn a_clock_beyond_the_bound_is_written_into_the_silo_s_own_row() {
    let mut w = cluster(3, 5, 5, 0.0);
    w.run_for(10_000);
    let flag = |w: &World, i: usize| {
        w.table()
            .get(&w.addrs[i])
            .map(|(e, _)| e.clock_beyond_bound)
            .expect("row")
    };
    assert!(!flag(&w, 2));
    let before = w.table().version.version;
    w.feed(2, Event::ClockBound { beyond: true });
    w.run_until(10_000, |w| flag(w, 2)).expect("the flag is written");
    assert!(
        w.table().version.version > before,
        "the version row moved with it"
    );
    // Three flips before any write can land: the row ends as the last said.
    for beyond in [false, true, false] {
        w.feed(2, Event::ClockBound { beyond });
    }
    w.run_until(10_000, |w| !flag(w, 2)).expect("back within");
    w.run_for(30_000);
    assert!(!flag(&w, 2), "the last crossing said within");
    assert!(w.dead().is_empty());
    assert!(w.machines.iter().all(|m| m.status() == SiloStatus::Active));
}

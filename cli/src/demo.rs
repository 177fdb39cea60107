//! `rollcall demo`: a local cluster, one crash, and its detection, narrated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, WrapFuture};
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall::state::{PersistentState, StateKey, StateStorage};
use rollcall::transport::tcp::TcpTransport;
use rollcall::{
    ClusterMembershipOptions, MembershipSnapshot, OnDeclaredDead, Silo, SiloHandle, SiloStatus, Timestamp,
};

use crate::view;

/// Arguments of `rollcall demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Number of silos (at least 2).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=200))]
    silos: u16,
    /// Store URL; the default is an embedded in-memory table.
    #[arg(long, default_value = "memory://demo")]
    store: String,
    /// Cluster id (default: `demo-<start time>`).
    #[arg(long)]
    cluster: Option<String>,
    /// Short probe timeouts (500 ms) so the demo finishes in seconds; otherwise
    /// Orleans' production defaults (5 s probes).
    #[arg(long)]
    fast: bool,
}

struct Timeline {
    start: Instant,
}

/// Reminders the demo registers (1-s periods).
const DEMO_REMINDERS: usize = 12;

/// Which silo delivered each reminder's last tick, and when.
type Deliveries = Arc<Mutex<HashMap<String, (String, Instant)>>>;

/// Each cart's tick count as last written to its persistent state.
type Counts = Arc<Mutex<HashMap<String, u64>>>;

/// A cart's persistent state: the ticks it has seen, on whichever silo.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct CartState {
    ticks_seen: u64,
}

/// One per silo: takes the ticks of every demo actor, counts them in each cart's
/// persistent state (loaded on this silo at its first tick here), and narrates a
/// reminder moving to another silo.
struct TickNarrator {
    silo: String,
    deliveries: Deliveries,
    tl: Arc<Timeline>,
    storage: StateStorage,
    carts: HashMap<String, PersistentState<CartState>>,
    counts: Counts,
}

impl Actor for TickNarrator {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for TickNarrator {
    type Result = ();

    fn handle(&mut self, tick: ReminderTick, ctx: &mut Context<Self>) {
        let actor = tick.actor.to_string();
        let first_here = !self.carts.contains_key(&actor);
        if first_here {
            match StateKey::new(actor.clone(), "cart") {
                Ok(key) => {
                    self.carts
                        .insert(actor.clone(), PersistentState::new(self.storage.clone(), key));
                }
                Err(e) => {
                    self.tl.say(None, format!("{actor}: no state ({e})"));
                    return;
                }
            }
        }
        let cart = self.carts[&actor].clone();
        let (tl, silo, counts) = (self.tl.clone(), self.silo.clone(), self.counts.clone());
        let moved_from = self
            .deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&actor)
            .map(|(was, _)| was.clone())
            .filter(|was| *was != self.silo);
        ctx.spawn(
            async move {
                if first_here {
                    if let Err(e) = cart.load().await {
                        tl.say(None, format!("{actor}: loading its state on {silo} failed: {e}"));
                        return;
                    }
                }
                let before = cart.read(|c| c.ticks_seen);
                // Two activations can overlap around a crash: on a conflict,
                // `update` reads again and counts again.
                if let Err(e) = cart.update(|c| c.ticks_seen += 1).await {
                    tl.say(None, format!("{actor}: writing its state failed: {e}"));
                    return;
                }
                let now = cart.read(|c| c.ticks_seen);
                counts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(actor.clone(), now);
                if first_here && moved_from.is_some() {
                    tl.say(
                        None,
                        format!(
                            "{actor}'s state loaded on {silo}: {before} ticks seen before the move, {now} now (it continues, not restarts)"
                        ),
                    );
                }
            }
            .into_actor(self),
        );
        let mut d = self
            .deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = d.insert(tick.actor.to_string(), (self.silo.clone(), Instant::now()));
        if let Some((was, _)) = previous.filter(|(was, _)| *was != self.silo) {
            self.tl.say(
                None,
                format!(
                    "reminder {} `{}` ticks on {} now (was {was}); tick of {} delivered {} ms late",
                    tick.actor,
                    tick.name,
                    self.silo,
                    tick.scheduled,
                    tick.now.saturating_duration_since(tick.scheduled).as_millis()
                ),
            );
        }
    }
}

impl Timeline {
    fn say(&self, version: Option<u64>, what: impl std::fmt::Display) {
        let v = version
            .map(|v| format!("v{v:<4}"))
            .unwrap_or_else(|| "     ".into());
        println!("{:>8.3}s  {v} {what}", self.start.elapsed().as_secs_f64());
    }
}

/// Runs the demo; `Ok(true)` when the cluster converged on the crash.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    let options = if args.fast {
        ClusterMembershipOptions::fast()
    } else {
        ClusterMembershipOptions::default()
    };
    let cluster = args
        .cluster
        .unwrap_or_else(|| format!("demo-{}", Timestamp::now().as_millis()));
    let store = rollcall::connect(&args.store).await?;
    let table = store.membership_table(&cluster, options.protocol_mode())?;
    table.init(true).await?;
    let tl = Arc::new(Timeline {
        start: Instant::now(),
    });
    println!(
        "rollcall demo: {} silos, cluster `{cluster}` on {} ({} provider); probe timeout {:?}, \
         a silo votes after {} missed probes, {} votes declare death",
        args.silos,
        args.store,
        store.provider(),
        options.probe_timeout,
        options.num_missed_probes_limit,
        options.num_votes_for_death_declaration
    );

    // Narrate every change of the table, as seen by polling it.
    let watcher = {
        let (table, tl, opts) = (table.clone(), tl.clone(), options.clone());
        actix::spawn(async move {
            let mut last = MembershipSnapshot::default();
            loop {
                if let Ok(snap) = table.read_all().await {
                    if snap.version.version != last.version.version {
                        let now = Timestamp::now();
                        let active = rollcall::protocol::votes::active_non_stale(&snap, now, &opts);
                        let required = rollcall::protocol::votes::required_votes(active, &opts);
                        for line in view::changes(&last, &snap, required) {
                            tl.say(Some(snap.version.version), line);
                        }
                        last = snap;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;

    let transport = Arc::new(TcpTransport::new());
    let deliveries = Deliveries::default();
    let counts = Counts::default();
    let storage = StateStorage::new(store.state_table(&cluster)?);
    let reminder_options = rollcall::ReminderOptions {
        allow_period_below_minimum: true,
        startup_jitter: Duration::ZERO,
        refresh_reminder_list_period: Duration::from_secs(30),
        ..rollcall::ReminderOptions::default()
    };
    let mut silos: Vec<SiloHandle> = Vec::new();
    let mut services: Vec<Reminders> = Vec::new();
    for i in 0..args.silos {
        let silo = Silo::builder(store.clone(), cluster.clone())
            .listen("127.0.0.1:0".parse()?)
            .transport(transport.clone())
            .options(options.clone())
            .host_name("localhost")
            .silo_name(format!("silo-{i}"))
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await?;
        let narrator = TickNarrator {
            silo: format!("silo-{i}"),
            deliveries: deliveries.clone(),
            tl: tl.clone(),
            storage: storage.clone(),
            carts: HashMap::new(),
            counts: counts.clone(),
        }
        .start()
        .recipient();
        let service = Reminders::builder(&silo, store.clone())
            .target(move |_: &ActorId| Some(narrator.clone()))
            .options(reminder_options.clone())
            .start()
            .await?;
        silos.push(silo);
        services.push(service);
        // Pace the joins a little so the timeline shows each one.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let all_active = |silos: &[SiloHandle]| {
        silos
            .iter()
            .all(|s| s.status() == SiloStatus::Active && s.snapshot().active().count() == silos.len())
    };
    while !all_active(&silos) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tl.say(
        None,
        format!("all {} silos are Active in every silo's view", silos.len()),
    );
    let mut actors = Vec::new();
    for i in 0..DEMO_REMINDERS {
        let actor = ActorId::new("cart", i.to_string())?;
        services[i % services.len()]
            .register_or_update(&actor, "tick", Duration::from_millis(100), Duration::from_secs(1))
            .await?;
        actors.push(actor);
    }
    let doomed = silos.last().map(SiloHandle::address);
    let victims: Vec<&ActorId> = actors
        .iter()
        .filter(|a| services[0].owner_of(a) == doomed)
        .collect();
    tl.say(
        None,
        format!(
            "{DEMO_REMINDERS} reminders registered (1-s period); silo-{} owns {} of them: {}",
            silos.len() - 1,
            victims.len(),
            victims
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    // Let the probes run a while so the adaptive timeouts have their minimum of
    // round-trip samples: the crash is then detected at steady state.
    tokio::time::sleep(options.probe_timeout * 6).await;

    let victim = silos.pop().ok_or_else(|| anyhow::anyhow!("no silo"))?;
    tl.say(
        None,
        format!(
            "killing {} abruptly: its probe port closes, nothing is written",
            victim.address()
        ),
    );
    let killed_at = Instant::now();
    victim.kill();
    let count_of = |a: &ActorId| {
        counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&a.to_string())
            .copied()
            .unwrap_or(0)
    };
    let counts_at_kill: Vec<u64> = victims.iter().map(|a| count_of(a)).collect();
    let limit = options.probe_timeout * (options.num_missed_probes_limit + 4) + Duration::from_secs(10);
    let mut converged = false;
    while killed_at.elapsed() < limit {
        if silos
            .iter()
            .all(|s| s.snapshot().status_of(&victim.address()) == Some(SiloStatus::Dead))
        {
            converged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = killed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(50)).await; // let the narrator catch up
    if converged {
        tl.say(
            None,
            format!(
                "every survivor sees {} Dead: detection took {:.2}s (stalls under {} x probe timeout \
                 = {:.2}s are tolerated; bound {:.2}s)",
                victim.address(),
                took.as_secs_f64(),
                options.num_missed_probes_limit,
                (options.probe_timeout * options.num_missed_probes_limit).as_secs_f64(),
                (options.probe_timeout * options.num_missed_probes_limit + options.probe_period())
                    .as_secs_f64()
            ),
        );
    } else {
        tl.say(
            None,
            format!(
                "NOT CONVERGED: {} is not Dead everywhere after {took:?}",
                victim.address()
            ),
        );
    }
    // The killed silo's reminders resume on survivors.
    let on_survivor = |a: &&ActorId| {
        deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&a.to_string())
            .is_some_and(|(silo, at)| *at > killed_at && *silo != format!("silo-{}", silos.len()))
    };
    let resume_limit = reminder_options.lease_period + reminder_options.lease_poll + Duration::from_secs(5);
    let detected_at = Instant::now();
    while !victims.iter().all(on_survivor) && detected_at.elapsed() < resume_limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resumed = victims.iter().all(on_survivor);
    // Their carts' states continue from where the killed silo left them (a tick or
    // two of the crash window aside), not from zero: each survivor's first tick of
    // a cart loads and writes its state after the tick is delivered, so wait
    // (bounded) for those writes.
    let continued = || -> Vec<(String, u64, u64)> {
        victims
            .iter()
            .zip(&counts_at_kill)
            .map(|(a, before)| (a.to_string(), *before, count_of(a)))
            .collect()
    };
    let counted_on = Instant::now();
    while !continued().iter().all(|(_, before, now)| now > before) && counted_on.elapsed() < resume_limit {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let continued = continued();
    let kept = continued.iter().all(|(_, before, now)| now > before);
    tl.say(
        None,
        format!(
            "{} the killed silo's carts: {}",
            if kept {
                "state survived for"
            } else {
                "STATE LOST for some of"
            },
            continued
                .iter()
                .map(|(a, before, now)| format!("{a} {before} -> {now} ticks"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let resumed = resumed && kept;
    if resumed {
        tl.say(
            None,
            format!(
                "all {} reminders of the killed silo tick on survivors, {:.2}s after the crash",
                victims.len(),
                killed_at.elapsed().as_secs_f64()
            ),
        );
    } else {
        tl.say(
            None,
            "NOT RESUMED: some reminders of the killed silo did not tick on a survivor",
        );
    }
    let snap = table.read_all().await?;
    println!();
    print!("{}", view::table(&cluster, &snap, Timestamp::now()));
    // Why was it declared dead? The membership history, written in the same
    // transactions as the table, answers with the votes and the declarer.
    let victim_events = table
        .read_history(&rollcall::HistoryQuery {
            silo: Some(victim.address()),
            ..Default::default()
        })
        .await;
    println!(
        "\nwhy was {} declared Dead? its membership history:",
        victim.address()
    );
    match victim_events {
        Ok(events) => print!("{}", view::history(&cluster, &events, Some(&victim.address()))),
        Err(e) => println!("(no history: {e})"),
    }
    watcher.abort();
    for s in &silos {
        let _ = s.shutdown().await;
    }
    println!("\nsurvivors shut down gracefully.");
    if args.store.starts_with("memory://") {
        println!(
            "The in-memory table ends with this process. To inspect a cluster from another process, \
             run the demo on a shared store (e.g. `--store redis://127.0.0.1:6379`), then \
             `rollcall status` and `rollcall history` with the same --store and --cluster."
        );
    } else {
        println!(
            "Inspect it again: `rollcall status --store {store} --cluster {cluster}` (the table), \
             `rollcall history --store {store} --cluster {cluster} --silo {victim}` (why it died)",
            store = args.store,
            victim = victim.address()
        );
    }
    Ok(converged && resumed && silos.iter().all(|s| s.status() == SiloStatus::Dead))
}

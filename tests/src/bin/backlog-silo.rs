//! A silo process for the handoff-under-load tests (`tests/tests/handoff_load.rs`):
//! a silo with the fast membership profile and a reminder service of few shards,
//! whose handlers take a while, and which appends every tick to a log file when
//! its handler has run (not when the delivery was decided), one line per tick:
//! `actor name scheduled_ms done_ms silo`.
//!
//! ```text
//! backlog-silo CLUSTER STORE_URL LISTEN_ADDR LOG_FILE [COUNT ID_BYTES DUE_MS SPREAD_MS]
//! ```
//!
//! `CLUSTER` is the cluster id and the reminder service id. With `COUNT`, it
//! registers `COUNT` one-shots (reminder `once`) of actors that all map to
//! shard 0, each actor id `ID_BYTES` long (`cart/<i>-xxx...`), due `DUE_MS`
//! after registering began, spread over `SPREAD_MS`, 64 registrations at a
//! time (one registered after its due time is due at once). It prints `ready`
//! once registered. SIGTERM shuts the silo down gracefully and exits 0.
//!
//! Environment: `BACKLOG_SHARDS` (the service's shard count, default 8; the
//! same in every process), `BACKLOG_HANDLER_MS` (how long a handler takes,
//! default 0), `BACKLOG_MAX_DELIVERIES` (ticks delivered at once, default the
//! options' default), `BACKLOG_PERIOD_MS` (register periodic reminders named
//! `every` with this period instead of one-shots), `BACKLOG_ANY_SHARD` (set:
//! the actors spread over every shard, `cart/<i>`, instead of shard 0's),
//! `BACKLOG_FAULT_CLOCK_MS` and `BACKLOG_FAULT_CUT_MS` (on SIGUSR1 the
//! silo's clock jumps this far ahead and its probes are cut from every peer
//! for this long; the store stays reachable; on SIGUSR2 its clock is right
//! again), `BACKLOG_STOP_AFTER` and
//! `BACKLOG_STOP_FILE` (the first process of a test to log this many ticks
//! creates the file, writes `<unix ms> <silo address>` to it and shuts down
//! gracefully, as on SIGTERM, printing `stopping <unix ms>` when the shutdown
//! begins; the others, finding the file, go on). It prints
//! `clock OFFSET_MS within|beyond` whenever its clock report changes.
//! `BACKLOG_STATE` (set: each handler first writes its actor's state `ticks`,
//! the tick's scheduled time, fenced by the tick's fence, and logs the tick
//! only when that write landed; a write the store refuses as fenced prints
//! `fenced ACTOR EPOCH`, any other failure goes to stderr).
//! `BACKLOG_RUN_HISTORY`: the run history kept per reminder (default 20).
//! `BACKLOG_SPIN_MS`: each handler first spins this much CPU on the
//! application's arbiter (a CPU-heavy actor). `BACKLOG_PROBE_REPORT` (set):
//! a thread of its own prints `probes P99_MS FAILED SUSPICIONS VOTES` (the
//! silo's membership counters) every 250 ms. Every silo prints
//! `leaving <unix ms>` when its leave begins (a leave hook).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler, ResponseFuture};
use futures_util::StreamExt;
use rollcall::{Codec, Error, Expected, ReminderOptions, StateKey, StateStorage, SystemClock};
use rollcall_core::Clock;
use rollcall_reminders::{ActorId, ReminderSpec, ReminderTick, Reminders};

struct Logger {
    silo: String,
    /// CPU spun in the handler itself, before its future (`BACKLOG_SPIN_MS`).
    spin: Duration,
    handler: Duration,
    out: Arc<Mutex<std::fs::File>>,
    stop: Option<Arc<StopAfter>>,
    /// `BACKLOG_STATE`: where each tick's fenced state write goes.
    states: Option<StateStorage>,
}

/// The self-stop of `BACKLOG_STOP_AFTER`: ticks logged so far, and the
/// shutdown to start once `after` are.
struct StopAfter {
    after: usize,
    file: std::path::PathBuf,
    logged: std::sync::atomic::AtomicUsize,
    now: tokio::sync::Notify,
}

impl StopAfter {
    /// One more tick logged by `silo`: at the `after`-th, the file is taken
    /// (created, not opened: one process of the test wins) and the shutdown
    /// starts.
    fn logged(&self, silo: &str) {
        let n = self.logged.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n != self.after {
            return;
        }
        let taken = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.file)
            .and_then(|mut f| writeln!(f, "{} {silo}", SystemClock.now().as_millis()));
        if taken.is_ok() {
            self.now.notify_one();
        }
    }
}

impl Actor for Logger {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Logger {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, t: ReminderTick, _: &mut Context<Self>) -> Self::Result {
        if !self.spin.is_zero() {
            let until = std::time::Instant::now() + self.spin;
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        let (silo, out, handler) = (self.silo.clone(), self.out.clone(), self.handler);
        let (stop, states) = (self.stop.clone(), self.states.clone());
        Box::pin(async move {
            if !handler.is_zero() {
                tokio::time::sleep(handler).await;
            }
            if let Some(states) = states {
                let scheduled = t.scheduled.as_millis().to_string();
                let written = match StateKey::new(t.actor.to_string(), "ticks") {
                    Ok(key) => {
                        states
                            .fenced(t.fence.clone())
                            .write(&key, Expected::Any, Codec::Raw, scheduled.as_bytes(), None)
                            .await
                    }
                    Err(e) => Err(e),
                };
                match written {
                    Ok(_) => {}
                    Err(Error::Fenced { .. }) => {
                        println!("fenced {} {}", t.actor, t.fence.epoch);
                        return;
                    }
                    Err(e) => {
                        eprintln!("backlog-silo: the state write of {}: {e}", t.actor);
                        return;
                    }
                }
            }
            let line = format!(
                "{} {} {} {} {}\n",
                t.actor,
                t.name,
                t.scheduled.as_millis(),
                SystemClock.now().as_millis(),
                silo
            );
            let mut out = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = out.write_all(line.as_bytes()) {
                eprintln!("tick log: {e}");
            }
            drop(out);
            if let Some(stop) = stop {
                stop.logged(&silo);
            }
        })
    }
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    rollcall_tests::silo_process::log_warnings();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 && args.len() != 8 {
        eprintln!(
            "usage: backlog-silo CLUSTER STORE_URL LISTEN_ADDR LOG_FILE [COUNT ID_BYTES DUE_MS SPREAD_MS]"
        );
        std::process::exit(2);
    }
    if let Err(e) = run(&args) {
        eprintln!("backlog-silo: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = args[0].clone();
    let listen: std::net::SocketAddr = args[2].parse()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args[3])?;
    let out = Arc::new(Mutex::new(log));
    let shards: u32 = env_or("BACKLOG_SHARDS", 8);
    let handler = Duration::from_millis(env_or("BACKLOG_HANDLER_MS", 0));
    let period = Duration::from_millis(env_or("BACKLOG_PERIOD_MS", 0));
    let max_deliveries = env_or(
        "BACKLOG_MAX_DELIVERIES",
        ReminderOptions::default().max_deliveries,
    );
    let stop = std::env::var_os("BACKLOG_STOP_FILE").map(|file| {
        Arc::new(StopAfter {
            after: env_or("BACKLOG_STOP_AFTER", usize::MAX),
            file: file.into(),
            logged: Default::default(),
            now: tokio::sync::Notify::new(),
        })
    });
    let system = actix::System::new();
    let started = system.block_on(async {
        let faults = rollcall_tests::silo_process::Faults::default();
        let term = rollcall_tests::silo_process::catch_sigterm()?;
        let (store, silo) =
            rollcall_tests::silo_process::start_silo(&args[1], &cluster, listen, Some(&faults)).await?;
        let (jump, cut) = (
            env_or("BACKLOG_FAULT_CLOCK_MS", 0u64),
            env_or("BACKLOG_FAULT_CUT_MS", 0u64),
        );
        // Every crossing of the clock bound, on stdout.
        let mut clock = silo.subscribe_clock();
        actix::spawn(async move {
            let mut within = true;
            while clock.changed().await.is_ok() {
                let report = *clock.borrow_and_update();
                if report.within_bound != within {
                    within = report.within_bound;
                    let word = if within { "within" } else { "beyond" };
                    println!("clock {} {word}", report.offset_ms.unwrap_or(0));
                }
            }
        });
        if jump > 0 || cut > 0 {
            let fixed = faults.clone();
            let faults = faults.clone();
            actix::spawn(async move {
                let Ok(mut usr1) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
                else {
                    return;
                };
                while usr1.recv().await.is_some() {
                    faults.clock.set_ahead(Duration::from_millis(jump));
                    faults.transport.cut_for(Duration::from_millis(cut));
                    println!("faulted clock +{jump} ms, cut {cut} ms");
                }
            });
            actix::spawn(async move {
                let faults = fixed;
                let Ok(mut usr2) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
                else {
                    return;
                };
                while usr2.recv().await.is_some() {
                    faults.clock.set_ahead(Duration::ZERO);
                    println!("clock fault over");
                }
            });
        }
        let states = match std::env::var_os("BACKLOG_STATE") {
            Some(_) => Some(StateStorage::new(store.state_table(&cluster)?)),
            None => None,
        };
        // `leaving <unix ms>` when the leave's hooks start (where the leave
        // runs: the silo's own thread).
        let leaving = silo.on_leave(|| {
            Box::pin(async {
                println!("leaving {}", SystemClock.now().as_millis());
            })
        });
        if std::env::var_os("BACKLOG_PROBE_REPORT").is_some() {
            let silo = silo.clone();
            std::thread::spawn(move || loop {
                let c = silo.counters();
                println!(
                    "probes {} {} {} {}",
                    c.probe_rtt_p99_ms, c.probes_failed, c.suspicions_sent, c.votes_written
                );
                std::thread::sleep(Duration::from_millis(250));
            });
        }
        let logger = Logger {
            silo: silo.address().to_string(),
            spin: Duration::from_millis(env_or("BACKLOG_SPIN_MS", 0)),
            handler,
            out,
            stop: stop.clone(),
            states,
        }
        .start()
        .recipient();
        let reminders = Reminders::builder(&silo, store)
            .clock(Arc::new(faults.clock.clone()))
            .service_id(cluster.clone())
            .shards(shards)
            .options(ReminderOptions {
                minimum_period: Duration::from_secs(1),
                max_deliveries,
                run_history: env_or("BACKLOG_RUN_HISTORY", ReminderOptions::default().run_history),
                ..ReminderOptions::default()
            })
            .target(move |_: &ActorId| Some(logger.clone()))
            .start()
            .await?;
        if args.len() == 8 {
            let count: usize = args[4].parse()?;
            let id_bytes: usize = args[5].parse()?;
            let due: u64 = args[6].parse()?;
            let spread: u64 = args[7].parse()?;
            let actors = if std::env::var_os("BACKLOG_ANY_SHARD").is_some() {
                (0..count).map(|i| format!("cart/{i}")).collect()
            } else {
                rollcall_tests::silo_process::shard_zero_actors(count, id_bytes, shards)
            };
            // Due times from when registering began, so a slow registration
            // does not stretch the burst.
            let base = SystemClock.now().as_millis();
            let registered = futures_util::stream::iter(actors.into_iter().enumerate())
                .map(|(i, id)| {
                    let reminders = &reminders;
                    async move {
                        let actor = ActorId::parse(&id)?;
                        let at = base + due + i as u64 * spread / count.max(1) as u64;
                        let wait = at.saturating_sub(SystemClock.now().as_millis());
                        let due = Duration::from_millis(wait);
                        if period.is_zero() {
                            reminders
                                .register(&actor, "once", ReminderSpec::once(due))
                                .await?;
                        } else {
                            reminders
                                .register(&actor, "every", ReminderSpec::every(due, period))
                                .await?;
                        }
                        Ok::<_, Box<dyn std::error::Error>>(())
                    }
                })
                .buffer_unordered(64)
                .collect::<Vec<_>>()
                .await;
            for r in registered {
                r?;
            }
        }
        println!("ready {}", silo.address());
        Ok::<_, Box<dyn std::error::Error>>((term, silo, (reminders, leaving)))
    })?;
    let (term, silo, reminders) = started;
    // Printed when the shutdown begins: a process whose one thread is
    // saturated by its deliveries sees its stop (or a SIGTERM) late.
    let stopped = async move {
        match stop {
            Some(stop) => stop.now.notified().await,
            None => std::future::pending().await,
        }
        println!("stopping {}", SystemClock.now().as_millis());
    };
    rollcall_tests::silo_process::run_until_sigterm_or(system, term, stopped, silo, Box::new(reminders))?;
    Ok(())
}

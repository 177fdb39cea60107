//! A silo process for the reminder churn tests (`tests/tests/churn.rs`): a silo with
//! the fast membership profile and a reminder service on one store, which appends
//! every tick it delivers to a log file, one line per tick:
//! `actor name scheduled_ms sent_ms silo etag`.
//!
//! ```text
//! churn-silo CLUSTER STORE_URL LISTEN_ADDR LOG_FILE [REGISTER_COUNT STARTS_FILE]
//! ```
//!
//! `CLUSTER` is the cluster id and the reminder service id.
//!
//! With `REGISTER_COUNT`, it registers `cart/0..REGISTER_COUNT` (reminder `tick`,
//! first ticks 2-3 s from now, spread; odd actors every 1 s by period, even
//! ones by the cron expression `* * * * * *` in the zone Asia/Kolkata, which
//! ticks on every whole second) and writes `actor name start_ms` lines to
//! `STARTS_FILE`. It prints `ready` once its reminder service
//! has loaded its ranges. SIGTERM shuts the silo down gracefully (the reminder
//! service hands its ranges over first) and exits 0.
//!
//! It takes commands on stdin, one per line, carried out by its reminder
//! service, each answered on stdout: `pause ACTOR NAME`, `resume ACTOR NAME`
//! and `trigger ACTOR NAME`, answered `ok VERB ACTOR NAME ETAG` (the trigger
//! row's etag for a trigger) or `err VERB ACTOR NAME WHY`.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler};
use rollcall::ReminderOptions;
use rollcall_reminders::{ActorId, ReminderSpec, ReminderTick, Reminders};

struct Logger {
    silo: String,
    out: Arc<Mutex<std::fs::File>>,
}

impl Actor for Logger {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Logger {
    type Result = ();

    fn handle(&mut self, t: ReminderTick, _: &mut Context<Self>) {
        let line = format!(
            "{} {} {} {} {} {}\n",
            t.actor,
            t.name,
            t.scheduled.as_millis(),
            t.now.as_millis(),
            self.silo,
            t.etag.as_str()
        );
        let mut out = self.out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = out.write_all(line.as_bytes()) {
            eprintln!("tick log: {e}");
        }
    }
}

fn main() {
    rollcall_tests::silo_process::log_warnings();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 && args.len() != 6 {
        eprintln!("usage: churn-silo CLUSTER STORE_URL LISTEN_ADDR LOG_FILE [REGISTER_COUNT STARTS_FILE]");
        std::process::exit(2);
    }
    if let Err(e) = run(&args) {
        eprintln!("churn-silo: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = args[0].clone();
    let args = &args[1..];
    let listen: std::net::SocketAddr = args[1].parse()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args[2])?;
    let out = Arc::new(Mutex::new(log));
    let system = actix::System::new();
    let silo = system.block_on(async {
        let term = rollcall_tests::silo_process::catch_sigterm()?;
        let (store, silo) =
            rollcall_tests::silo_process::start_silo(&args[0], &cluster, listen, None).await?;
        let logger = Logger {
            silo: silo.address().to_string(),
            out,
        }
        .start()
        .recipient();
        let reminders = Reminders::builder(&silo, store)
            .service_id(cluster.clone())
            .options(ReminderOptions {
                minimum_period: Duration::from_secs(1),
                ..ReminderOptions::default()
            })
            .target(move |_: &ActorId| Some(logger.clone()))
            .start()
            .await?;
        if args.len() == 5 {
            let n: usize = args[3].parse()?;
            let mut starts = String::new();
            for i in 0..n {
                let actor = ActorId::new("cart", i.to_string())?;
                let due = Duration::from_millis(2_000 + (i * 1_000 / n.max(1)) as u64);
                let spec = if i % 2 == 0 {
                    let mut cron = ReminderSpec::cron("* * * * * *").in_zone("Asia/Kolkata");
                    cron.due = due;
                    cron
                } else {
                    ReminderSpec::every(due, Duration::from_secs(1))
                };
                let h = reminders.register(&actor, "tick", spec).await?;
                starts.push_str(&format!("{} {} {}\n", h.actor, h.name, h.start_at.as_millis()));
            }
            std::fs::write(&args[4], starts)?;
        }
        control(reminders.clone());
        println!("ready {}", silo.address());
        Ok::<_, Box<dyn std::error::Error>>((term, silo, reminders))
    })?;
    let (term, silo, reminders) = silo;
    rollcall_tests::silo_process::run_until_sigterm(system, term, silo, Box::new(reminders))?;
    Ok(())
}

/// Carries out the commands read from stdin (see the module docs).
fn control(reminders: Reminders) {
    let mut rx = rollcall_tests::silo_process::stdin_lines();
    actix::spawn(async move {
        while let Some(line) = rx.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [verb, actor, name] = words[..] else {
                println!("err {line} expected VERB ACTOR NAME");
                continue;
            };
            let answer = match ActorId::parse(actor) {
                Err(e) => Err(e.into()),
                Ok(a) => match verb {
                    "pause" => reminders.pause(&a, name).await,
                    "resume" => reminders.resume(&a, name).await,
                    "trigger" => reminders.trigger(&a, name).await,
                    other => {
                        println!("err {other} {actor} {name} unknown verb");
                        continue;
                    }
                },
            };
            match answer {
                Ok(h) => println!("ok {verb} {actor} {name} {}", h.etag.as_str()),
                Err(e) => println!("err {verb} {actor} {name} {e}"),
            }
        }
    });
}

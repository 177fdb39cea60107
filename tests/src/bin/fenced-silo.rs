//! A silo process for the fencing tests (`tests/tests/fencing.rs`): a silo
//! with the fast membership profile and a reminder service (service id =
//! cluster id) on one store, whose actors' states it writes fenced by the
//! shard leases it holds.
//!
//! ```text
//! fenced-silo CLUSTER STORE_URL LISTEN_ADDR
//! ```
//!
//! It prints `ready ADDRESS` once its reminder service has loaded its shards,
//! then takes commands on stdin, one per line, each answered on stdout:
//!
//! - `host N`: hosts the first `N` actors `cart/<i>` whose shard this silo
//!   holds: takes each one's fence (`Reminders::fence`) and writes its state
//!   `cart` under it. Answers `ok host N SHARD@EPOCH...` (one per actor, in
//!   order, as `ACTOR@SHARD@EPOCH`) once every write landed, or `err host WHY` (within 30 s).
//! - `write`: writes every hosted actor's state again under the fence it
//!   was hosted with. Answers `ok write landed=L fenced=F other=O`, the
//!   first other error on stderr.
//! - `held`: answers `ok held N`, how many hosted actors' shards this silo
//!   still holds (`Reminders::fence` is some).
//! - `holds ACTOR...`: answers `ok holds N ACTOR...`: those of these actors
//!   whose shards this silo holds now.
//! - `cut MS`: cuts its probes from every peer for `MS` ms, both ways (the
//!   store stays reachable). Answers `ok cut`.
//!
//! A silo that reads itself Dead stops (`OnDeclaredDead::StopSilo`); the
//! process goes on taking commands. SIGTERM shuts the silo down gracefully
//! and exits 0.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rollcall::{Codec, Error, Expected, Fence, StateKey, StateStorage};
use rollcall_reminders::{ActorId, Reminders};

fn main() {
    rollcall_tests::silo_process::log_warnings();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 {
        eprintln!("usage: fenced-silo CLUSTER STORE_URL LISTEN_ADDR");
        std::process::exit(2);
    }
    if let Err(e) = run(&args) {
        eprintln!("fenced-silo: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = args[0].clone();
    let listen: std::net::SocketAddr = args[2].parse()?;
    let system = actix::System::new();
    let started = system.block_on(async {
        let term = rollcall_tests::silo_process::catch_sigterm()?;
        let faults = rollcall_tests::silo_process::Faults::default();
        // A silo that reads itself Dead stops, and the process goes on (as an
        // application whose other tasks still write would).
        let (store, silo) = rollcall_tests::silo_process::start_silo_with(
            &args[1],
            &cluster,
            listen,
            Some(&faults),
            rollcall::OnDeclaredDead::StopSilo,
        )
        .await?;
        let reminders = Reminders::builder(&silo, store.clone())
            .service_id(cluster.clone())
            .start()
            .await?;
        let states = StateStorage::new(store.state_table(&cluster)?);
        control(reminders.clone(), states, faults);
        println!("ready {}", silo.address());
        Ok::<_, Box<dyn std::error::Error>>((term, silo, reminders))
    })?;
    let (term, silo, reminders) = started;
    rollcall_tests::silo_process::run_until_sigterm(system, term, silo, Box::new(reminders))?;
    Ok(())
}

/// The hosted actors: each one's key and the fence it was hosted under.
type Hosted = Arc<Mutex<Vec<(StateKey, Fence)>>>;

/// Carries out the commands read from stdin (see the module docs).
fn control(reminders: Reminders, states: StateStorage, faults: rollcall_tests::silo_process::Faults) {
    let mut rx = rollcall_tests::silo_process::stdin_lines();
    let hosted: Hosted = Arc::default();
    actix::spawn(async move {
        while let Some(line) = rx.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                ["host", n] => match n.parse::<usize>() {
                    Ok(n) => match host(&reminders, &states, n).await {
                        Ok(h) => {
                            let fences: Vec<String> = h
                                .iter()
                                .map(|(k, f)| format!("{}@{}@{}", k.actor_id(), f.shard, f.epoch))
                                .collect();
                            *hosted.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = h;
                            println!("ok host {n} {}", fences.join(" "));
                        }
                        Err(e) => println!("err host {e}"),
                    },
                    Err(e) => println!("err host {e}"),
                },
                ["write"] => {
                    let h = hosted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    let (mut landed, mut fenced, mut other) = (0, 0, 0);
                    for (key, fence) in h {
                        match states
                            .fenced(fence)
                            .write(&key, Expected::Any, Codec::Raw, b"stale", None)
                            .await
                        {
                            Ok(_) => landed += 1,
                            Err(Error::Fenced { .. }) => fenced += 1,
                            Err(e) => {
                                if other == 0 {
                                    eprintln!("fenced-silo: write {key}: {e}");
                                }
                                other += 1;
                            }
                        }
                    }
                    println!("ok write landed={landed} fenced={fenced} other={other}");
                }
                ["held"] => {
                    let h = hosted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    let n = h
                        .iter()
                        .filter(|(k, _)| {
                            ActorId::parse(k.actor_id()).is_ok_and(|a| reminders.fence(&a).is_some())
                        })
                        .count();
                    println!("ok held {n}");
                }
                ["holds", ..] => {
                    let held: Vec<&str> = words[1..]
                        .iter()
                        .copied()
                        .filter(|a| ActorId::parse(a).is_ok_and(|a| reminders.fence(&a).is_some()))
                        .collect();
                    println!("ok holds {} {}", held.len(), held.join(" "));
                }
                ["cut", ms] => match ms.parse::<u64>() {
                    Ok(ms) => {
                        faults.transport.cut_for(Duration::from_millis(ms));
                        println!("ok cut");
                    }
                    Err(e) => println!("err cut {e}"),
                },
                _ => println!("err {line}: unknown command"),
            }
        }
    });
}

/// Hosts the first `n` actors whose shard this silo holds (see the module
/// docs), within 30 s.
async fn host(
    reminders: &Reminders,
    states: &StateStorage,
    n: usize,
) -> Result<Vec<(StateKey, Fence)>, Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut out = Vec::with_capacity(n);
        for i in 0..100_000 {
            let actor = ActorId::new("cart", i.to_string())?;
            if let Some(f) = reminders.fence(&actor) {
                out.push((StateKey::new(actor.to_string(), "cart")?, f));
                if out.len() == n {
                    break;
                }
            }
        }
        if out.len() == n {
            let mut all = true;
            for (key, fence) in &out {
                let w = states
                    .fenced(fence.clone())
                    .write(key, Expected::Any, Codec::Raw, b"hosted", None)
                    .await;
                if let Err(e) = w {
                    eprintln!("fenced-silo: host {key}: {e}");
                    all = false;
                    break;
                }
            }
            if all {
                return Ok(out);
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{} actors of held shards, {n} wanted", out.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

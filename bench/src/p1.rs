//! P1: placement and fenced state. Three figures, each next to a reference
//! measured in the same run:
//!
//! - a 1 KiB state write fenced by its shard lease (the store compares the
//!   lease's fence token in the same transaction) next to the same write
//!   unfenced, interleaved round by round, on every provider;
//! - `Reminders::owner` lookups per second and their latency (the actor's
//!   shard held by this silo, or by another one, answered from the lease row
//!   read at most `lease_poll` ago) next to a plain read of the lease row;
//! - after a crash (`SiloHandle::kill`: nothing written) of a silo hosting
//!   100 actors, the time until every one of them answers on a survivor (the
//!   survivor holds its shard and a fenced write of its state lands) next to
//!   the time the first survivor read the victim Dead.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rollcall::lease::{LeaseStatus, ShardLease, ShardLeases};
use rollcall::reminders::{ActorId, Reminders};
use rollcall::state::{Codec, Expected, StateKey, StateStorage};
use rollcall_core::{
    actor_shard, ClusterMembershipOptions, Fence, OnDeclaredDead, Silo, SiloAddress, SiloHandle, SiloStatus,
    SystemStore, DEFAULT_SHARDS,
};
use serde::Serialize;

/// Options of `p1`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Providers of the fenced write: memory, redis, etcd, dynamodb.
    #[arg(long, value_delimiter = ',', default_value = "memory,redis,etcd,dynamodb")]
    providers: Vec<String>,
    /// Providers of the lookups and the crash: memory, redis.
    #[arg(long, value_delimiter = ',', default_value = "memory,redis")]
    cluster_providers: Vec<String>,
    /// Rounds of the fenced write; each runs both sides for `--seconds`.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Seconds per side per round (fenced write), per kind (lookups).
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// Crashes measured per provider (each in a fresh cluster).
    #[arg(long, default_value_t = 3)]
    crashes: usize,
    /// The reports to add the P1 section and the `p1` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// One provider's fenced write next to its unfenced one.
#[derive(Clone, Debug, Serialize)]
pub struct WriteRow {
    provider: String,
    samples: u64,
    fenced_p50_us: f64,
    fenced_p99_us: f64,
    unfenced_p50_us: f64,
    unfenced_p99_us: f64,
    /// Fenced p50 over unfenced p50 (goal <= 1.1).
    p50_ratio: f64,
    p99_ratio: f64,
}

/// One kind of lookup.
#[derive(Clone, Debug, Serialize)]
pub struct LookupRow {
    provider: String,
    kind: String,
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
    /// Lookups per second over the lease-row reads per second.
    ratio: f64,
}

/// One crash.
#[derive(Clone, Debug, Serialize)]
pub struct CrashRow {
    provider: String,
    actors: usize,
    /// Seconds from the kill until the first survivor read the victim Dead.
    detection_s: f64,
    /// Seconds from the kill until every hosted actor answered on a survivor.
    answering_s: f64,
    ratio: f64,
}

/// Recorded in ns (the memory provider's calls take about a µs).
fn nanos(d: Duration) -> u64 {
    d.as_nanos().clamp(1, u128::from(u64::MAX)) as u64
}

/// A ns quantile in µs.
fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("histogram")
}

/// The fenced write next to the unfenced one on `provider`.
async fn fenced_write(provider: &str, rounds: u32, for_time: Duration) -> anyhow::Result<WriteRow> {
    let (store, _endpoint, _url, _guard) = crate::t1::open(provider).await?;
    let service = rollcall_tests::unique_id("p1");
    let leases = ShardLeases::open(store.lease_table(&service)?, DEFAULT_SHARDS).await?;
    let storage = StateStorage::new(store.state_table(&service)?);
    let key = StateKey::new("cart/p1", "state")?;
    let shard = actor_shard(key.actor_id(), DEFAULT_SHARDS);
    let lease = leases.read(shard).await?;
    let held = ShardLease {
        epoch: lease.epoch + 1,
        owner: Some(SiloAddress::new(([127, 0, 0, 1], 1).into(), 1)),
        status: LeaseStatus::Owned,
        ..lease
    };
    leases
        .write(&held)
        .await?
        .map_err(|_| anyhow::anyhow!("the lease was taken"))?;
    let fenced = storage.fenced(Fence {
        service: service.clone(),
        shards: DEFAULT_SHARDS,
        shard,
        epoch: held.epoch,
    });
    let data = vec![7u8; 1024];
    let mut etag = None;
    let (mut h_fenced, mut h_plain) = (histogram(), histogram());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for with_fence in order {
            let (s, h) = if with_fence {
                (&fenced, &mut h_fenced)
            } else {
                (&storage, &mut h_plain)
            };
            let deadline = Instant::now() + for_time;
            let mut n = 0;
            while n < 3 || Instant::now() < deadline {
                let started = Instant::now();
                let e = s
                    .write(&key, Expected::from_etag(etag.as_ref()), Codec::Raw, &data, None)
                    .await?;
                h.record(nanos(started.elapsed())).ok();
                etag = Some(e);
                n += 1;
            }
        }
    }
    Ok(WriteRow {
        provider: provider.to_owned(),
        samples: h_fenced.len(),
        fenced_p50_us: us(&h_fenced, 0.5),
        fenced_p99_us: us(&h_fenced, 0.99),
        unfenced_p50_us: us(&h_plain, 0.5),
        unfenced_p99_us: us(&h_plain, 0.99),
        p50_ratio: us(&h_fenced, 0.5) / us(&h_plain, 0.5).max(1e-3),
        p99_ratio: us(&h_fenced, 0.99) / us(&h_plain, 0.99).max(1e-3),
    })
}

/// Three silos with reminder services on `store`, every shard held.
async fn cluster(
    store: &Arc<dyn SystemStore>,
    id: &str,
) -> anyhow::Result<(Vec<SiloHandle>, Vec<Reminders>)> {
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for _ in 0..3 {
        let silo = Silo::builder(store.clone(), id)
            .options(ClusterMembershipOptions::fast())
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await?;
        services.push(
            Reminders::builder(&silo, store.clone())
                .service_id(id)
                .start()
                .await?,
        );
        silos.push(silo);
    }
    let actors: Vec<ActorId> = (0..300)
        .map(|i| ActorId::new("cart", i.to_string()))
        .collect::<Result<_, _>>()?;
    // Settled: each actor held by exactly the silo the ring assigns it to,
    // in every silo's view (not a moment of the joiners' takeovers, when one
    // silo may still hold them all and `lookups` finds none held here).
    crate::r2::until(Duration::from_secs(60), || {
        silos.iter().all(|s| s.snapshot().active().count() == 3) && actors.iter().all(|a| {
            let holders: Vec<usize> = (0..services.len())
                .filter(|i| services[*i].fence(a).is_some())
                .collect();
            matches!(holders[..], [i] if services.iter().all(|s| s.owner_of(a) == Some(silos[i].address())))
        })
    })
    .await?;
    Ok((silos, services))
}

/// `owner()` lookups (held here, held elsewhere) next to lease-row reads.
async fn lookups(
    provider: &str,
    store: &Arc<dyn SystemStore>,
    id: &str,
    services: &[Reminders],
    for_time: Duration,
) -> anyhow::Result<Vec<LookupRow>> {
    let me = &services[1];
    let actors: Vec<ActorId> = (0..300)
        .map(|i| ActorId::new("cart", i.to_string()))
        .collect::<Result<_, _>>()?;
    let (here, elsewhere): (Vec<_>, Vec<_>) = actors.into_iter().partition(|a| me.fence(a).is_some());
    let leases = ShardLeases::open(store.lease_table(id)?, DEFAULT_SHARDS).await?;
    let mut rows = Vec::new();
    let mut reference = 0.0;
    for kind in [
        "lease row read (reference)",
        "owner(), held here",
        "owner(), held elsewhere",
    ] {
        let mut h = histogram();
        let started = Instant::now();
        let mut i = 0usize;
        while i < 3 || started.elapsed() < for_time {
            let t = Instant::now();
            match kind {
                "owner(), held here" => {
                    me.owner(&here[i % here.len()])
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("no owner"))?;
                }
                "owner(), held elsewhere" => {
                    me.owner(&elsewhere[i % elsewhere.len()])
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("no owner"))?;
                }
                _ => {
                    let a = &elsewhere[i % elsewhere.len()];
                    leases.read(actor_shard(&a.to_string(), DEFAULT_SHARDS)).await?;
                }
            }
            h.record(nanos(t.elapsed())).ok();
            i += 1;
        }
        let per_s = i as f64 / started.elapsed().as_secs_f64();
        if reference == 0.0 {
            reference = per_s;
        }
        rows.push(LookupRow {
            provider: provider.to_owned(),
            kind: kind.to_owned(),
            per_s,
            p50_us: us(&h, 0.5),
            p99_us: us(&h, 0.99),
            ratio: per_s / reference,
        });
    }
    Ok(rows)
}

/// One crash of a silo hosting 100 actors.
async fn crash(provider: &str, store: &Arc<dyn SystemStore>, id: &str) -> anyhow::Result<CrashRow> {
    let (silos, services) = cluster(store, id).await?;
    let states = StateStorage::new(store.state_table(id)?);
    let mut hosted = Vec::new();
    for i in 0.. {
        let a = ActorId::new("cart", i.to_string())?;
        if let Some(f) = services[0].fence(&a) {
            let key = StateKey::new(a.to_string(), "state")?;
            states
                .fenced(f)
                .write(&key, Expected::Any, Codec::Raw, b"0", None)
                .await?;
            hosted.push((a, key));
            if hosted.len() == 100 {
                break;
            }
        }
    }
    let victim = silos[0].address();
    let killed = Instant::now();
    silos[0].kill();
    let mut detection = None;
    let mut answered = vec![false; hosted.len()];
    while answered.iter().any(|a| !a) {
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(120),
            "no failover in 120 s"
        );
        if detection.is_none()
            && silos[1..]
                .iter()
                .any(|s| s.snapshot().status_of(&victim) == Some(SiloStatus::Dead))
        {
            detection = Some(killed.elapsed());
        }
        for ((a, key), done) in hosted.iter().zip(answered.iter_mut()) {
            if *done {
                continue;
            }
            if let Some(f) = services[1..].iter().find_map(|s| s.fence(a)) {
                *done = states
                    .fenced(f)
                    .write(key, Expected::Any, Codec::Raw, b"1", None)
                    .await
                    .is_ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let answering = killed.elapsed();
    for s in &silos[1..] {
        s.kill();
    }
    let detection = detection.unwrap_or(answering);
    Ok(CrashRow {
        provider: provider.to_owned(),
        actors: hosted.len(),
        detection_s: detection.as_secs_f64(),
        answering_s: answering.as_secs_f64(),
        ratio: answering.as_secs_f64() / detection.as_secs_f64().max(1e-9),
    })
}

/// Runs P1 (the cluster parts in their own actix `System`s) and adds its
/// section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let for_time = Duration::from_secs_f64(args.seconds);
    let mut writes = Vec::new();
    for p in &args.providers {
        let (p, rounds) = (p.clone(), args.rounds);
        eprintln!("P1 fenced write {p}...");
        writes.push(crate::on_own_thread(format!("P1 {p}"), move || {
            actix::System::new().block_on(fenced_write(&p, rounds, for_time))
        })?);
    }
    let mut looked = Vec::new();
    let mut crashes = Vec::new();
    for p in &args.cluster_providers {
        let (p, n) = (p.clone(), args.crashes);
        eprintln!("P1 lookups and crashes {p}...");
        let (l, c) = crate::on_own_thread(format!("P1 {p}"), move || {
            actix::System::new().block_on(async move {
                let (store, _backend) = crate::r1::store_for(&p).await?;
                let id = rollcall_tests::unique_id("p1");
                let (silos, services) = cluster(&store, &id).await?;
                let l = lookups(&p, &store, &id, &services, for_time).await?;
                for s in &silos {
                    s.kill();
                }
                let mut c = Vec::new();
                for _ in 0..n {
                    c.push(crash(&p, &store, &rollcall_tests::unique_id("p1")).await?);
                }
                Ok::<_, anyhow::Error>((l, c))
            })
        })?;
        looked.extend(l);
        crashes.extend(c);
    }
    let mut md = String::from("## P1: placement and fenced state\n");
    let _ = writeln!(
        md,
        "\nMethod: (1) one 1 KiB state rewritten over its own etag through `StateStorage`, \
         fenced by its shard's lease (`StateStorage::fenced`: the store compares the lease's \
         fence token in the write's own transaction) and unfenced, {} rounds of {} s per side, \
         the order alternating. (2) Three silos (fast membership profile) with reminder \
         services of 1,024 shards; from one of them, `Reminders::owner` of actors whose shard \
         it holds and of actors another silo holds, one call at a time for {} s each, next to \
         a plain read of the lease row (`ShardLeases::read`). (3) In a fresh 3-silo cluster, \
         one silo hosting 100 actors (their states written fenced) is killed (nothing \
         written); answering = every actor's shard held by a survivor and a fenced write of \
         its state landed there; detection = the first survivor reads the victim Dead. {} \
         crashes per provider.\n",
        args.rounds, args.seconds, args.seconds, args.crashes
    );
    md.push_str("### Fenced state write (1 KiB)\n\n");
    md.push_str("| provider | samples | fenced p50 / p99 µs | unfenced p50 / p99 µs | fenced ÷ unfenced p50 / p99 |\n|---|---|---|---|---|\n");
    for r in &writes {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} / {:.2} |",
            r.provider,
            r.samples,
            r.fenced_p50_us,
            r.fenced_p99_us,
            r.unfenced_p50_us,
            r.unfenced_p99_us,
            r.p50_ratio,
            r.p99_ratio
        );
    }
    md.push_str("\n### `owner()` lookups\n\n");
    md.push_str(
        "| provider | lookup | per second | p50 / p99 µs | ÷ lease row reads |\n|---|---|---|---|---|\n",
    );
    for r in &looked {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.1} / {:.1} | {:.1} |",
            r.provider, r.kind, r.per_s, r.p50_us, r.p99_us, r.ratio
        );
    }
    md.push_str("\n### From a crash to the actors answering on a survivor\n\n");
    md.push_str(
        "| provider | actors | detection s | answering s | answering ÷ detection |\n|---|---|---|---|---|\n",
    );
    for r in &crashes {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} |",
            r.provider, r.actors, r.detection_s, r.answering_s, r.ratio
        );
    }
    let _ = writeln!(md, "\n### Goals (reported, not asserted)\n");
    for r in &writes {
        let _ = writeln!(
            md,
            "- {} fenced write p50 {:.2}x the unfenced one (goal <= 1.1x): {}",
            r.provider,
            r.p50_ratio,
            if r.p50_ratio <= 1.1 { "met" } else { "missed" }
        );
    }
    let _ = writeln!(
        md,
        "\nDynamoDB's fenced write is a `TransactWriteItems` (the lease's `ConditionCheck` and the \
         header's conditional `Put`) where the unfenced one is one conditional `PutItem`: no \
         single-item write can check another item. Answering waits for the takeover time (the \
         lease period plus the cluster's `max_clock_offset` after the survivor saw the victim \
         Dead), as the reminders' failover does (R2): before it the dead silo may still act, and \
         `Reminders::fence` does not answer on two silos at once."
    );
    let json = serde_json::json!({
        "fenced_writes": writes,
        "lookups": looked,
        "crashes": crashes,
    });
    args.reports.add(("## P1", &md), ("p1", json))
}

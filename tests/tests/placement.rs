//! Placement without reminders (issue 72): the ownership layer's own
//! service (`rollcall_core::ownership::Placement`) drives a service's shard
//! leases, and `ActorHost` hosts actors on each shard's holder, with no
//! reminder service on any silo.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, ActorContext, ActorFutureExt, Context, Handler, Message, WrapFuture};
use rollcall_core::ownership::{ActorHost, ActorId, Deactivate, Placement};
use rollcall_core::{ClusterMembershipOptions, OnDeclaredDead, Silo, SiloHandle, Timestamp};

/// (silo, actor, "on" or "off", UTC ms).
type Log = Arc<Mutex<Vec<(usize, String, &'static str, u64)>>>;

/// An activation that logs its start and its end; its `Deactivate` takes
/// 300 ms (a flush) before it stops.
struct Probe {
    silo: usize,
    actor: String,
    log: Log,
}

impl Actor for Probe {
    type Context = Context<Self>;
    fn started(&mut self, _: &mut Context<Self>) {
        let t = Timestamp::now().as_millis();
        self.log
            .lock()
            .unwrap()
            .push((self.silo, self.actor.clone(), "on", t));
    }
}

#[derive(Message)]
#[rtype(result = "usize")]
struct Ping;

impl Handler<Ping> for Probe {
    type Result = usize;
    fn handle(&mut self, _: Ping, _: &mut Context<Self>) -> usize {
        self.silo
    }
}

impl Handler<Deactivate> for Probe {
    type Result = actix::ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Deactivate, _: &mut Context<Self>) -> Self::Result {
        Box::pin(
            tokio::time::sleep(Duration::from_millis(300))
                .into_actor(self)
                .map(|_, this, ctx| {
                    let t = Timestamp::now().as_millis();
                    this.log
                        .lock()
                        .unwrap()
                        .push((this.silo, this.actor.clone(), "off", t));
                    ctx.stop();
                }),
        )
    }
}

async fn placed_silos(
    store: &rollcall_tests::Store,
    cluster: &str,
    n: usize,
) -> (Vec<SiloHandle>, Vec<Placement>) {
    let mut silos = Vec::new();
    let mut services = Vec::new();
    for _ in 0..n {
        let silo = Silo::builder(store.clone(), cluster)
            .listen("127.0.0.1:0".parse().unwrap())
            .options(ClusterMembershipOptions::fast())
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await
            .expect("silo joins");
        let placement = Placement::builder(&silo, store.clone())
            .service_id(cluster)
            .start()
            .await
            .expect("placement starts");
        silos.push(silo);
        services.push(placement);
    }
    (silos, services)
}

/// Two silos run placement alone (no reminder service anywhere; one of
/// that id is refused beside it): every actor's shard is held by exactly
/// one of them, the one the ring assigns it to, and `holder` from either
/// silo names it at the epoch of its fence. Each actor is activated there
/// on its first message. When the first silo leaves, every actor moves to
/// the second at a later epoch, and each of the first silo's activations
/// handled `Deactivate` before its successor started.
#[actix::test]
async fn placement_hosts_actors_with_no_reminder_service() {
    let store: rollcall_tests::Store = Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("place");
    let (silos, services) = placed_silos(&store, &cluster, 2).await;
    let refused = rollcall_reminders::Reminders::builder(&silos[0], store.clone())
        .service_id(&cluster)
        .start()
        .await;
    assert!(
        matches!(
            refused,
            Err(rollcall_reminders::ReminderError::AlreadyRunning { .. })
        ),
        "a reminder service beside placement of one id: {refused:?}"
    );
    let log: Log = Arc::default();
    let hosts: Vec<ActorHost<Probe>> = services
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let log = log.clone();
            ActorHost::new(p, move |actor, _| Probe {
                silo: i,
                actor: actor.to_string(),
                log: log.clone(),
            })
        })
        .collect();
    let actors: Vec<ActorId> = (0..50)
        .map(|i| ActorId::new("probe", i.to_string()).unwrap())
        .collect();
    let settled = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        silos.iter().all(|s| s.snapshot().active().count() == 2) && actors.iter().all(|a| {
            let holders: Vec<usize> = (0..2).filter(|i| services[*i].fence(a).is_some()).collect();
            matches!(holders[..], [i] if services.iter().all(|p| p.owner_of(a) == Some(silos[i].address())))
        })
    })
    .await;
    assert!(
        settled.is_some(),
        "every actor's shard held by the silo it is assigned to"
    );
    let mut on_first = Vec::new();
    for a in &actors {
        let i = usize::from(services[1].fence(a).is_some());
        let epoch = services[i].fence(a).expect("held").epoch;
        for p in &services {
            assert_eq!(
                p.holder(a).await.expect("read"),
                Some((silos[i].address(), epoch)),
                "{a}"
            );
        }
        assert_eq!(hosts[i].send(a, Ping).await.expect("hosted where held"), i);
        assert!(
            hosts[1 - i].send(a, Ping).await.is_err(),
            "{a} refused where not held"
        );
        if i == 0 {
            on_first.push((a.clone(), epoch));
        }
    }
    assert!(!on_first.is_empty(), "the first silo hosts some actors");
    assert_eq!(
        hosts[0].active() + hosts[1].active(),
        actors.len(),
        "one activation per actor"
    );

    // The leave runs while the survivor is asked for the moved actors.
    let leaving = silos[0].clone();
    let leave = actix::spawn(async move { leaving.shutdown().await });
    for (a, old) in &on_first {
        let moved =
            rollcall_tests::sim::wait_for(Duration::from_secs(30), || services[1].fence(a).is_some()).await;
        assert!(moved.is_some(), "{a} moved to the second silo");
        assert!(services[1].fence(a).unwrap().epoch > *old, "{a}: a later epoch");
        assert_eq!(hosts[1].send(a, Ping).await.expect("hosted on the survivor"), 1);
    }
    leave.await.expect("the leave's task").expect("leave");
    let log = log.lock().unwrap().clone();
    for (a, _) in &on_first {
        let at = |silo: usize, what: &str| {
            log.iter()
                .find(|(s, x, w, _)| *s == silo && *x == a.to_string() && *w == what)
                .map(|e| e.3)
        };
        let (Some(off), Some(on)) = (at(0, "off"), at(1, "on")) else {
            panic!("{a}: not deactivated on the first silo, or not activated on the second: {log:?}");
        };
        assert!(
            off <= on,
            "{a}: activated on the successor at {on}, before its old activation ended at {off}"
        );
    }
}

/// A crash with placement alone: the first silo is killed (nothing
/// written); the second declares it Dead and, after the takeover time,
/// holds every shard at a later epoch and hosts the actors, while the
/// killed silo answers no fence from its kill on.
#[actix::test]
async fn placement_takes_a_crashed_silos_actors_over() {
    let store: rollcall_tests::Store = Arc::new(rollcall_provider_memory::MemoryStore::new());
    let cluster = rollcall_tests::unique_id("place-crash");
    let (silos, services) = placed_silos(&store, &cluster, 2).await;
    let log: Log = Arc::default();
    let survivor = {
        let log = log.clone();
        ActorHost::new(&services[1], move |actor, _| Probe {
            silo: 1,
            actor: actor.to_string(),
            log: log.clone(),
        })
    };
    let actors: Vec<ActorId> = (0..50)
        .map(|i| ActorId::new("probe", i.to_string()).unwrap())
        .collect();
    let settled = rollcall_tests::sim::wait_for(Duration::from_secs(30), || {
        silos.iter().all(|s| s.snapshot().active().count() == 2)
            && actors
                .iter()
                .all(|a| (services[0].fence(a).is_some()) != (services[1].fence(a).is_some()))
    })
    .await;
    assert!(settled.is_some(), "every actor's shard held by one silo");
    let on_first: Vec<(ActorId, u64)> = actors
        .iter()
        .filter_map(|a| services[0].fence(a).map(|f| (a.clone(), f.epoch)))
        .collect();
    assert!(!on_first.is_empty(), "the first silo holds some actors");
    silos[0].kill();
    let none = rollcall_tests::sim::wait_for(Duration::from_secs(5), || {
        on_first.iter().all(|(a, _)| services[0].fence(a).is_none())
    })
    .await;
    assert!(none.is_some(), "a killed silo answers no fence");
    for (a, old) in &on_first {
        let moved =
            rollcall_tests::sim::wait_for(Duration::from_secs(30), || services[1].fence(a).is_some()).await;
        assert!(moved.is_some(), "{a} taken over by the survivor");
        assert!(services[1].fence(a).unwrap().epoch > *old, "{a}: a later epoch");
        assert_eq!(survivor.send(a, Ping).await.expect("hosted on the survivor"), 1);
    }
}

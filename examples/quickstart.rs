use std::time::Duration;

use actix::{Actor, Context, Handler, ResponseFuture};
use rollcall::reminders::{ActorId, ReminderSpec, ReminderTick, Reminders};
use rollcall::state::{PersistentState, StateKey, StateStorage};
use rollcall::{ReminderOptions, Silo};

/// A cart that counts its reminder's ticks in a state that survives its silo.
struct Cart {
    ticks: PersistentState<u64>,
}

impl Actor for Cart {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Cart {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, tick: ReminderTick, _: &mut Context<Self>) -> Self::Result {
        let ticks = self.ticks.clone();
        Box::pin(async move {
            let n = ticks
                .update(|n| {
                    *n += 1;
                    *n
                })
                .await; // conditional on the etag
            println!("tick {n:?}, occurrence {}", tick.occurrence_id());
        })
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = rollcall::connect("memory://").await?; // or redis://, etcd://, dynamodb://
    let silo = Silo::builder(store.clone(), "shop").start().await?; // returns once Active

    let storage = StateStorage::new(store.state_table("shop")?);
    let ticks = PersistentState::new(storage, StateKey::new("cart/42", "ticks")?);
    ticks.load().await?; // 0 when nothing is stored yet
    let cart = Cart { ticks: ticks.clone() }.start().recipient();

    let reminders = Reminders::builder(&silo, store)
        .target(move |actor: &ActorId| (actor.kind() == "cart").then(|| cart.clone()))
        .options(ReminderOptions {
            allow_period_below_minimum: true,
            ..Default::default()
        })
        .start()
        .await?;
    let actor = ActorId::new("cart", "42")?;
    // Cron in a time zone: every second here; "0 9 * * MON-FRI" would be 09:00 on
    // weekdays in Paris. Or ReminderSpec::every(due, period), ReminderSpec::once(due).
    let spec = ReminderSpec::cron("* * * * * *")
        .in_zone("Europe/Paris")
        .repeat(100);
    let handle = reminders.register(&actor, "expire", spec).await?;

    while ticks.read(|n| *n) < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    reminders.unregister(&handle).await?; // no more ticks, on any silo
    silo.shutdown().await?; // hands its reminders over, then leaves the cluster
    Ok(())
}

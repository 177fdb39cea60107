use std::time::Duration;

use actix::{Actor, Context, Handler};
use rollcall::reminders::{ActorId, ReminderTick, Reminders};
use rollcall::{ReminderOptions, Silo};
use tokio::sync::mpsc;

/// An actor that gets the ticks of its reminders.
struct Cart {
    ticks: mpsc::UnboundedSender<ReminderTick>,
}

impl Actor for Cart {
    type Context = Context<Self>;
}

impl Handler<ReminderTick> for Cart {
    type Result = ();

    fn handle(&mut self, tick: ReminderTick, _: &mut Context<Self>) {
        println!(
            "{} `{}`: tick scheduled at {}",
            tick.actor, tick.name, tick.scheduled
        );
        let _ = self.ticks.send(tick);
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = rollcall::connect("memory://").await?; // or redis://, etcd://
    let silo = Silo::builder(store.clone(), "shop").start().await?;

    let (tx, mut ticks) = mpsc::unbounded_channel();
    let cart = Cart { ticks: tx }.start();
    let reminders = Reminders::builder(&silo, store)
        // Which actor gets the ticks of an actor id (here: every "cart/..." goes to one).
        .target(move |actor: &ActorId| (actor.kind() == "cart").then(|| cart.clone().recipient()))
        .options(ReminderOptions {
            allow_period_below_minimum: true, // 1-s periods for the example; the minimum is 1 min
            ..ReminderOptions::default()
        })
        .start()
        .await?;

    let actor = ActorId::new("cart", "42")?;
    let handle = reminders
        .register_or_update(
            &actor,
            "expire",
            Duration::from_millis(100),
            Duration::from_secs(1),
        )
        .await?;
    for _ in 0..3 {
        ticks.recv().await.ok_or("the service stopped")?;
    }
    reminders.unregister(&handle).await?; // the row is gone: no more ticks, on any silo
    silo.shutdown().await?;
    Ok(())
}

//! An actix actor whose state survives it: loaded in `started` (the actor
//! handles no message before the load finished), written after each change, and
//! found again by the next activation.

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Handler, Message, ResponseActFuture,
    WrapFuture,
};
use rollcall::state::{PersistentState, StateKey, StateStorage};
use serde::{Deserialize, Serialize};

#[derive(Default, Serialize, Deserialize)]
struct CartState {
    items: Vec<String>,
    /// Added after the first records were written: old records read as 0.
    #[serde(default)]
    ticks_seen: u64,
}

struct Cart {
    state: PersistentState<CartState>,
}

impl Actor for Cart {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let state = self.state.clone();
        // `wait`: no message is handled until the state is loaded.
        ctx.wait(
            async move { state.load().await }
                .into_actor(self)
                .map(|r, _, ctx| {
                    if let Err(e) = r {
                        eprintln!("loading the cart failed: {e}");
                        ctx.stop();
                    }
                }),
        );
    }
}

#[derive(Message)]
#[rtype(result = "rollcall::Result<usize>")]
struct Add(String);

impl Handler<Add> for Cart {
    type Result = ResponseActFuture<Self, rollcall::Result<usize>>;

    fn handle(&mut self, Add(item): Add, _: &mut Context<Self>) -> Self::Result {
        let state = self.state.clone();
        // Read, apply, write; on a conflict read again and apply again.
        Box::pin(
            async move {
                state
                    .update(move |s| {
                        s.items.push(item.clone());
                        s.items.len()
                    })
                    .await
            }
            .into_actor(self),
        )
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = rollcall::connect("memory://").await?; // or redis://
    let storage = StateStorage::new(store.state_table("shop")?);
    let key = StateKey::new("cart/42", "cart")?;

    let first = Cart {
        state: PersistentState::new(storage.clone(), key.clone()),
    }
    .start();
    first.send(Add("apple".into())).await??;
    let n = first.send(Add("pear".into())).await??;
    println!("first activation: {n} items");

    // Another activation (another silo, after a crash) finds the items again.
    let second = Cart {
        state: PersistentState::new(storage, key),
    }
    .start();
    let n = second.send(Add("plum".into())).await??;
    println!("second activation: {n} items");
    assert_eq!(n, 3);
    Ok(())
}

//! The membership agents (actix) and the public silo API.
//!
//! The protocol lives in [`protocol`](crate::protocol); this module only runs it:
//! - [`api`]: [`Silo`], [`SiloBuilder`], [`SiloHandle`], subscriptions;
//! - `join`: the join driver behind [`SiloBuilder::start`] (serve the probe
//!   endpoint, start the agent, wait for the machine's verdict on the join);
//! - `executor`: the membership agent, the one actor per silo that feeds the
//!   [`SiloMachine`](crate::protocol::SiloMachine) and carries out its actions;
//! - `server`: the probe server behind the [`Transport`](crate::transport::Transport).
//!
//! Several silos can run in one process (tests and the demo run many).

pub mod api;
mod executor;
mod join;
mod notices;
mod server;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context};
use tokio::sync::watch;

pub use api::{
    LeaveHookGuard, LeaveWork, MembershipChanged, OnDeclaredDead, Silo, SiloBuilder, SiloClaim, SiloHandle,
    Subscription,
};
pub(crate) use notices::NoticeSinks;
pub use notices::{Notice, NoticeReceiver, NoticesDropped};

/// Stops the actor when the silo's stop signal is raised.
pub(crate) fn stop_on_signal<A>(mut stop: watch::Receiver<bool>, ctx: &mut Context<A>)
where
    A: Actor<Context = Context<A>>,
{
    let wait = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    ctx.spawn(actix::fut::wrap_future::<_, A>(wait).map(|_, _, ctx: &mut Context<A>| ctx.stop()));
}

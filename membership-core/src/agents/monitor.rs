//! The cluster health monitor: keeps one probe agent per target chosen by
//! [`select_probe_targets`], turns their failures into votes, and votes against
//! silos stuck in Joining.

use std::collections::BTreeMap;

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message};
use tokio::sync::watch;

use crate::protocol::is_stuck_joining;
use crate::protocol::targets::select_probe_targets;
use crate::{SiloAddress, SiloStatus};

use super::oracle::{MembershipOracle, Suspect, SuspectReason};
use super::probe::{ProbeAgent, ProbeFailed, StopProbing};

pub(crate) struct ClusterHealthMonitor {
    pub(crate) shared: super::SiloShared,
    pub(crate) oracle: Addr<MembershipOracle>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) agents: BTreeMap<SiloAddress, Addr<ProbeAgent>>,
}

impl ClusterHealthMonitor {
    /// Updates the probe agents to the current targets; on the periodic tick
    /// (`vote_stuck`) also votes against silos stuck in Joining (at most once per
    /// probe period, so votes cannot feed back into more votes).
    fn reevaluate(&mut self, ctx: &mut Context<Self>, vote_stuck: bool) {
        let sh = &self.shared;
        let active = *sh.status.borrow() == SiloStatus::Active;
        let (targets, stuck) = if active {
            let snap = sh.latest.borrow();
            let now = sh.clock.now();
            let targets = select_probe_targets(&sh.me, &snap, now, &sh.options);
            let stuck: Vec<SiloAddress> = snap
                .rows()
                .filter(|e| e.silo != sh.me && is_stuck_joining(e, now, &sh.options))
                .map(|e| e.silo)
                .collect();
            (targets, stuck)
        } else {
            (Vec::new(), Vec::new())
        };
        self.agents.retain(|silo, agent| {
            let keep = targets.contains(silo);
            if !keep {
                agent.do_send(StopProbing);
            }
            keep
        });
        for t in targets {
            if !self.agents.contains_key(&t) {
                tracing::debug!(cluster = %self.shared.cluster, silo = %self.shared.me, target = %t, "start probing");
                let agent = ProbeAgent::new(self.shared.clone(), t, ctx.address().recipient()).start();
                self.agents.insert(t, agent);
            }
        }
        for s in stuck.into_iter().filter(|_| vote_stuck) {
            self.oracle.do_send(Suspect {
                suspect: s,
                intermediary: None,
                reason: SuspectReason::StuckJoining,
            });
        }
    }
}

impl Actor for ClusterHealthMonitor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        super::stop_on_signal(self.stop.clone(), ctx);
        ctx.run_interval(self.shared.options.probe_timeout, |act, ctx| {
            act.reevaluate(ctx, true)
        });
        // React at once to every new snapshot and status.
        let (mut latest, mut status, addr) = (
            self.shared.latest.clone(),
            self.shared.status.clone(),
            ctx.address(),
        );
        actix::spawn(async move {
            loop {
                tokio::select! {
                    r = latest.changed() => if r.is_err() { break },
                    r = status.changed() => if r.is_err() { break },
                }
                if addr.try_send(Reevaluate).is_err() && !addr.connected() {
                    break;
                }
            }
        });
        self.reevaluate(ctx, false);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        for agent in self.agents.values() {
            agent.do_send(StopProbing);
        }
        self.agents.clear();
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Reevaluate;

impl Handler<Reevaluate> for ClusterHealthMonitor {
    type Result = ();

    fn handle(&mut self, _: Reevaluate, ctx: &mut Context<Self>) {
        self.reevaluate(ctx, false);
    }
}

impl Handler<ProbeFailed> for ClusterHealthMonitor {
    type Result = ();

    fn handle(&mut self, msg: ProbeFailed, _: &mut Context<Self>) {
        if !self.agents.contains_key(&msg.target) || *self.shared.status.borrow() != SiloStatus::Active {
            return;
        }
        self.oracle.do_send(Suspect {
            suspect: msg.target,
            intermediary: msg.intermediary,
            reason: msg.reason,
        });
    }
}

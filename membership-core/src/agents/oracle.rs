//! The membership oracle: the one actor per silo that reads and writes the
//! membership table, publishes snapshots, gossips, heartbeats, cleans up defunct rows
//! and stops the silo when it reads itself Dead.

use std::sync::Arc;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, AtomicResponse, Context, Handler, Message, Recipient,
    ResponseActFuture, WrapFuture,
};
use tokio::sync::watch;

use crate::protocol::join::{plan_join, JoinPlan};
use crate::protocol::targets::is_monitored;
use crate::protocol::votes::{active_non_stale, decide_vote, VoteDecision};
use crate::transport::{Listener, ProbeRequest, Transport};
use crate::{
    Clock, ClusterMembershipOptions, MembershipEntry, MembershipSnapshot, MembershipTable, ProtocolMode,
    SiloAddress, SiloStatus, Timestamp,
};

use super::writer::{self, Outcome, Plan, Planned};
use super::{MembershipChanged, OnDeclaredDead, SiloError};

pub(crate) struct MembershipOracle {
    pub(crate) cluster_id: String,
    pub(crate) me: SiloAddress,
    /// The columns of our own row (names, zones, start time).
    pub(crate) own_row: MembershipEntry,
    pub(crate) table: Arc<dyn MembershipTable>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) options: Arc<ClusterMembershipOptions>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) current: MembershipSnapshot,
    /// Every snapshot read (IAmAlive changes included), for this silo's agents.
    pub(crate) latest_tx: watch::Sender<MembershipSnapshot>,
    /// Snapshots with a new table version (or, in basic mode, new content).
    pub(crate) snapshot_tx: watch::Sender<MembershipSnapshot>,
    pub(crate) status_tx: watch::Sender<SiloStatus>,
    pub(crate) stop_tx: Arc<watch::Sender<bool>>,
    pub(crate) subscribers: Vec<Recipient<MembershipChanged>>,
    pub(crate) listener: Option<Listener>,
    pub(crate) on_declared_dead: OnDeclaredDead,
    /// A retry of a failed refresh is scheduled.
    pub(crate) refresh_retry: bool,
}

impl MembershipOracle {
    fn status(&self) -> SiloStatus {
        *self.status_tx.borrow()
    }

    /// Takes a snapshot read from the table: keeps the newest, publishes new
    /// versions, and checks whether we have been declared dead.
    fn apply(&mut self, snap: MembershipSnapshot) {
        let extended = self.options.protocol_mode() == ProtocolMode::Extended;
        if extended && snap.version.version < self.current.version.version {
            return; // an older read that raced a newer one
        }
        let changed =
            if extended {
                snap.version.version > self.current.version.version || self.current.entries.is_empty()
            } else {
                snap.entries.len() != self.current.entries.len()
                    || snap.entries.iter().zip(self.current.entries.iter()).any(
                        |((a, (ea, _)), (b, (eb, _)))| {
                            a != b || ea.status != eb.status || ea.suspect_votes != eb.suspect_votes
                        },
                    )
            };
        self.current = snap;
        self.latest_tx.send_replace(self.current.clone());
        if changed {
            self.snapshot_tx.send_replace(self.current.clone());
            let shared = Arc::new(self.current.clone());
            self.subscribers
                .retain(|r| r.try_send(MembershipChanged(shared.clone())).is_ok() || r.connected());
        }
        self.check_self();
    }

    /// Perfect failure detection: a silo that reads itself Dead (or finds its row
    /// gone once it has joined) stops.
    fn check_self(&mut self) {
        let status = self.status();
        if matches!(status, SiloStatus::Created | SiloStatus::Dead) || *self.stop_tx.borrow() {
            return;
        }
        if matches!(status, SiloStatus::ShuttingDown | SiloStatus::Stopping) {
            return; // leaving on our own: our Dead row is our doing
        }
        let own = self.current.entry(&self.me);
        let declared = match own {
            Some(e) => e.status == SiloStatus::Dead,
            None => status == SiloStatus::Active,
        };
        if !declared {
            return;
        }
        let voters: Vec<String> = own
            .map(|e| e.suspect_votes.iter().map(|v| v.silo.to_string()).collect())
            .unwrap_or_default();
        tracing::error!(
            cluster = %self.cluster_id, silo = %self.me, ?voters, version = self.current.version.version,
            "this silo was declared Dead by the cluster; stopping"
        );
        self.status_tx.send_replace(SiloStatus::Dead);
        self.stop_tx.send_replace(true);
        if let OnDeclaredDead::StopSystem { exit_code } = self.on_declared_dead {
            actix::System::current().stop_with_code(exit_code);
        }
    }

    /// "Re-read the table" to every live silo but us.
    fn gossip(&self, version: u64) {
        if !self.options.use_liveness_gossip {
            return;
        }
        for e in self.current.rows() {
            if e.silo == self.me || !is_monitored(e.status) {
                continue;
            }
            let transport = self.transport.clone();
            let req = ProbeRequest::Gossip {
                from: self.me,
                version,
            };
            let to = e.silo.endpoint();
            let timeout = self.options.probe_timeout;
            actix::spawn(async move {
                let _ = transport.request(to, req, timeout).await;
            });
        }
    }

    /// Runs a table write procedure as an atomic (serialised) handler: applies the
    /// snapshot it ends with and gossips after a committed write.
    fn run_write<A: 'static>(
        &mut self,
        plan: impl FnMut(&MembershipSnapshot, Timestamp) -> Plan<A> + 'static,
    ) -> ResponseActFuture<Self, Result<Outcome<A>, SiloError>> {
        let (table, clock) = (self.table.clone(), self.clock.clone());
        let fut = async move { writer::write(&table, &clock, plan).await };
        Box::pin(fut.into_actor(self).map(|result, act, _| match result {
            Ok(outcome) => {
                let (snap, wrote) = match &outcome {
                    Outcome::Written(s) => (s.clone(), true),
                    Outcome::Unchanged(s) | Outcome::Aborted(_, s) => (s.clone(), false),
                };
                let version = snap.version.version;
                act.apply(snap);
                if wrote {
                    act.gossip(version);
                }
                Ok(outcome)
            }
            Err(e) => Err(SiloError::Table(e)),
        }))
    }

    fn refresh(&mut self, ctx: &mut Context<Self>) {
        let table = self.table.clone();
        let cluster = self.cluster_id.clone();
        ctx.spawn(async move { table.read_all().await }.into_actor(self).map(move |r, act, ctx| match r {
            Ok(snap) => act.apply(snap),
            Err(e) => {
                tracing::warn!(%cluster, silo = %act.me, error = %e, "membership table refresh failed");
                // Do not wait a whole table_refresh_timeout on a stale view.
                if !act.refresh_retry {
                    act.refresh_retry = true;
                    ctx.run_later(act.options.probe_timeout, |act, ctx| {
                        act.refresh_retry = false;
                        act.refresh(ctx);
                    });
                }
            }
        }));
    }

    fn publish_i_am_alive(&mut self, ctx: &mut Context<Self>) {
        if !matches!(self.status(), SiloStatus::Joining | SiloStatus::Active) {
            return;
        }
        let (table, me, now) = (self.table.clone(), self.me, self.clock.now());
        let cluster = self.cluster_id.clone();
        ctx.spawn(
            async move { table.update_i_am_alive(&me, now).await }
                .into_actor(self)
                .map(move |r, _, _| {
                    if let Err(e) = r {
                        tracing::warn!(%cluster, silo = %me, error = %e, "IAmAlive write failed");
                    }
                }),
        );
    }

    /// Defunct-row cleanup, run only by the first Active silo by address.
    fn cleanup_defunct(&mut self, ctx: &mut Context<Self>) {
        let first_active = self.current.active().map(|e| e.silo).next();
        if first_active != Some(self.me) {
            return;
        }
        let now = self.clock.now();
        let mut cutoff = now.saturating_sub(self.options.defunct_silo_expiration);
        let mut dead: Vec<Timestamp> = self
            .current
            .rows()
            .filter(|e| e.status == SiloStatus::Dead)
            .map(|e| e.last_alive())
            .collect();
        dead.sort_unstable_by(|a, b| b.cmp(a)); // newest first
        if let Some(oldest_kept) =
            dead.get((self.options.max_defunct_silo_entries as usize).saturating_sub(1))
        {
            if dead.len() > self.options.max_defunct_silo_entries as usize {
                cutoff = cutoff.max(*oldest_kept);
            }
        }
        let table = self.table.clone();
        let cluster = self.cluster_id.clone();
        ctx.spawn(
            async move { table.cleanup_defunct(cutoff).await }
                .into_actor(self)
                .map(move |r, act, _| match r {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(%cluster, silo = %act.me, removed = n, "defunct silo rows removed")
                    }
                    Err(e) => tracing::warn!(%cluster, silo = %act.me, error = %e, "defunct cleanup failed"),
                }),
        );
    }
}

impl Actor for MembershipOracle {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        super::stop_on_signal(self.stop_tx.subscribe(), ctx);
        ctx.run_interval(self.options.table_refresh_timeout, |act, ctx| act.refresh(ctx));
        ctx.run_interval(self.options.i_am_alive_publish_period, |act, ctx| {
            act.publish_i_am_alive(ctx)
        });
        ctx.run_interval(self.options.defunct_silo_cleanup_period, |act, ctx| {
            act.cleanup_defunct(ctx)
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.listener = None;
        self.stop_tx.send_replace(true);
        tracing::debug!(cluster = %self.cluster_id, silo = %self.me, "membership oracle stopped");
    }
}

/// Re-read the table now.
#[derive(Message)]
#[rtype(result = "Result<MembershipSnapshot, SiloError>")]
pub(crate) struct Refresh;

impl Handler<Refresh> for MembershipOracle {
    type Result = AtomicResponse<Self, Result<MembershipSnapshot, SiloError>>;

    fn handle(&mut self, _: Refresh, _: &mut Context<Self>) -> Self::Result {
        let table = self.table.clone();
        AtomicResponse::new(Box::pin(
            async move { table.read_all().await }
                .into_actor(self)
                .map(|r, act, _| match r {
                    Ok(snap) => {
                        act.apply(snap);
                        Ok(act.current.clone())
                    }
                    Err(e) => Err(SiloError::Table(e)),
                }),
        ))
    }
}

/// Gossip from a peer: the table is at `version` now.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct GossipReceived {
    pub(crate) version: u64,
}

impl Handler<GossipReceived> for MembershipOracle {
    type Result = ();

    fn handle(&mut self, msg: GossipReceived, ctx: &mut Context<Self>) {
        let basic = self.options.protocol_mode() == ProtocolMode::Basic;
        if basic || msg.version > self.current.version.version {
            self.refresh(ctx);
        }
    }
}

/// Why a silo is suspected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SuspectReason {
    /// Probes (and the indirect probe) went unanswered.
    MissedProbes,
    /// Another generation answers on its endpoint.
    WrongSilo,
    /// It has been Joining longer than `max_join_attempt_time`.
    StuckJoining,
}

/// Vote against `suspect` (with `intermediary`'s vote after a failed indirect probe).
#[derive(Message)]
#[rtype(result = "Result<(), SiloError>")]
pub(crate) struct Suspect {
    pub(crate) suspect: SiloAddress,
    pub(crate) intermediary: Option<SiloAddress>,
    pub(crate) reason: SuspectReason,
}

impl Handler<Suspect> for MembershipOracle {
    type Result = AtomicResponse<Self, Result<(), SiloError>>;

    fn handle(&mut self, msg: Suspect, _: &mut Context<Self>) -> Self::Result {
        let (me, options) = (self.me, self.options.clone());
        let cluster = self.cluster_id.clone();
        let voting = self.status() == SiloStatus::Active && msg.suspect != me;
        let plan = move |snap: &MembershipSnapshot, now: Timestamp| -> Plan<()> {
            if !voting {
                return Plan::Done;
            }
            let Some((row, etag)) = snap.get(&msg.suspect) else {
                return Plan::Done;
            };
            // The suspicion was formed on an older view: check it still holds.
            if msg.reason == SuspectReason::StuckJoining
                && !crate::protocol::is_stuck_joining(row, now, &options)
            {
                return Plan::Done;
            }
            let active = active_non_stale(snap, now, &options);
            // Our own vote from less than a probe period ago already says this.
            let voted_recently = row
                .suspect_votes
                .iter()
                .any(|v| v.silo == me && now.saturating_duration_since(v.time) < options.probe_timeout);
            match decide_vote(row, &me, msg.intermediary.as_ref(), now, active, &options) {
                VoteDecision::AlreadyDead => Plan::Done,
                VoteDecision::Vote(_) if voted_recently && msg.intermediary.is_none() => Plan::Done,
                VoteDecision::Vote(r) => {
                    tracing::info!(%cluster, silo = %me, suspect = %msg.suspect, votes = r.suspect_votes.len(),
                        intermediary = ?msg.intermediary, reason = ?msg.reason, "voting: suspect");
                    Plan::Write(Planned::Update(r, etag.clone()))
                }
                VoteDecision::DeclareDead(r) => {
                    tracing::warn!(%cluster, silo = %me, suspect = %msg.suspect, votes = r.suspect_votes.len(),
                        reason = ?msg.reason, "voting: declaring Dead");
                    Plan::Write(Planned::Update(r, etag.clone()))
                }
            }
        };
        AtomicResponse::new(Box::pin(self.run_write(plan).map(|r, _, _| r.map(|_| ()))))
    }
}

/// Join: declare older generations of our endpoint Dead, then insert our row as
/// Joining.
#[derive(Message)]
#[rtype(result = "Result<(), SiloError>")]
pub(crate) struct JoinTable;

impl Handler<JoinTable> for MembershipOracle {
    type Result = AtomicResponse<Self, Result<(), SiloError>>;

    fn handle(&mut self, _: JoinTable, _: &mut Context<Self>) -> Self::Result {
        self.status_tx.send_replace(SiloStatus::Joining);
        let (me, mut own) = (self.me, self.own_row.clone());
        own.status = SiloStatus::Joining;
        let cluster = self.cluster_id.clone();
        let (table, clock) = (self.table.clone(), self.clock.clone());
        let fut = async move {
            // One conditional write per row: older generations first, then us.
            for _ in 0..64 {
                let own = own.clone();
                let cluster = cluster.clone();
                let outcome = writer::write(&table, &clock, move |snap, now| match plan_join(&me, snap) {
                    JoinPlan::Superseded { by } => Plan::Abort(SiloError::Superseded { by }),
                    JoinPlan::AlreadyInserted { status: SiloStatus::Dead } => {
                        Plan::Abort(SiloError::DeclaredDead)
                    }
                    JoinPlan::AlreadyInserted { .. } => Plan::Done,
                    JoinPlan::Proceed { declare_dead } => match declare_dead.into_iter().next() {
                        Some((mut old, etag)) => {
                            tracing::info!(%cluster, silo = %me, old = %old.silo, "declaring older generation Dead");
                            old.suspect_votes.push(crate::SuspectVote { silo: me, time: now });
                            Plan::Write(Planned::Update(old, etag))
                        }
                        None => {
                            let mut row = own.clone();
                            row.i_am_alive_time = now;
                            Plan::Write(Planned::Insert(row))
                        }
                    },
                })
                .await
                .map_err(SiloError::Table)?;
                match outcome {
                    Outcome::Written(s) => {
                        if s.entry(&me).is_some() {
                            return Ok(s);
                        }
                    }
                    Outcome::Unchanged(s) => return Ok(s),
                    Outcome::Aborted(e, _) => return Err(e),
                }
            }
            Err(SiloError::Table(crate::Error::backend(
                "join did not converge after 64 writes",
            )))
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(|r, act, _| match r {
            Ok(snap) => {
                let v = snap.version.version;
                act.apply(snap);
                act.gossip(v);
                Ok(())
            }
            Err(e) => Err(e),
        })))
    }
}

/// Move our own row to `status` (only forward).
#[derive(Message)]
#[rtype(result = "Result<(), SiloError>")]
pub(crate) struct SetOwnStatus(pub(crate) SiloStatus);

impl Handler<SetOwnStatus> for MembershipOracle {
    type Result = AtomicResponse<Self, Result<(), SiloError>>;

    fn handle(&mut self, msg: SetOwnStatus, _: &mut Context<Self>) -> Self::Result {
        let (me, target) = (self.me, msg.0);
        let cluster = self.cluster_id.clone();
        let plan = move |snap: &MembershipSnapshot, now: Timestamp| -> Plan<SiloError> {
            let Some((row, etag)) = snap.get(&me) else {
                return Plan::Abort(SiloError::DeclaredDead);
            };
            if row.status == target {
                return Plan::Done;
            }
            if row.status == SiloStatus::Dead || !row.status.can_transition_to(target) {
                return Plan::Abort(SiloError::DeclaredDead);
            }
            tracing::info!(%cluster, silo = %me, from = %row.status, to = %target, "status change");
            let mut r = row.clone();
            r.status = target;
            r.i_am_alive_time = now;
            Plan::Write(Planned::Update(r, etag.clone()))
        };
        AtomicResponse::new(Box::pin(self.run_write(plan).map(move |r, act, _| match r {
            Ok(Outcome::Aborted(e, _)) => Err(e),
            Ok(_) => {
                if act.status() != SiloStatus::Dead {
                    act.status_tx.send_replace(target);
                }
                Ok(())
            }
            Err(e) => Err(e),
        })))
    }
}

/// The newest snapshot this oracle has.
#[derive(Message)]
#[rtype(result = "MembershipSnapshot")]
pub(crate) struct GetSnapshot;

impl Handler<GetSnapshot> for MembershipOracle {
    type Result = actix::MessageResult<GetSnapshot>;

    fn handle(&mut self, _: GetSnapshot, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.current.clone())
    }
}

/// Add a subscriber; it is sent the current snapshot at once.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Subscribe(pub(crate) Recipient<MembershipChanged>);

impl Handler<Subscribe> for MembershipOracle {
    type Result = ();

    fn handle(&mut self, msg: Subscribe, _: &mut Context<Self>) {
        let _ = msg.0.try_send(MembershipChanged(Arc::new(self.current.clone())));
        self.subscribers.push(msg.0);
    }
}

/// Leaving: ShuttingDown (graceful) or Stopping (ungraceful), then Dead, then stop.
#[derive(Message)]
#[rtype(result = "Result<(), SiloError>")]
pub(crate) struct Shutdown {
    pub(crate) graceful: bool,
}

impl Handler<Shutdown> for MembershipOracle {
    type Result = AtomicResponse<Self, Result<(), SiloError>>;

    fn handle(&mut self, msg: Shutdown, _: &mut Context<Self>) -> Self::Result {
        let (table, clock, me) = (self.table.clone(), self.clock.clone(), self.me);
        let cluster = self.cluster_id.clone();
        let was = self.status();
        let leaving = if msg.graceful {
            SiloStatus::ShuttingDown
        } else {
            SiloStatus::Stopping
        };
        if was != SiloStatus::Dead {
            self.status_tx.send_replace(leaving);
        }
        let fut = async move {
            let mut last = None;
            for target in [leaving, SiloStatus::Dead] {
                if was == SiloStatus::Dead {
                    break;
                }
                let cluster = cluster.clone();
                let outcome = writer::write(&table, &clock, move |snap, now| {
                    let Some((row, etag)) = snap.get(&me) else {
                        return Plan::<()>::Done;
                    };
                    if row.status == SiloStatus::Dead || row.status == target {
                        return Plan::Done;
                    }
                    tracing::info!(%cluster, silo = %me, to = %target, "graceful shutdown");
                    let mut r = row.clone();
                    r.status = target;
                    r.i_am_alive_time = now;
                    Plan::Write(Planned::Update(r, etag.clone()))
                })
                .await
                .map_err(SiloError::Table)?;
                last = Some(outcome);
            }
            Ok(last)
        };
        AtomicResponse::new(Box::pin(fut.into_actor(self).map(|r, act, ctx| {
            if let Ok(Some(Outcome::Written(s) | Outcome::Unchanged(s))) = &r {
                let v = s.version.version;
                act.current = s.clone();
                act.latest_tx.send_replace(s.clone());
                act.snapshot_tx.send_replace(s.clone());
                act.gossip(v);
            }
            act.status_tx.send_replace(SiloStatus::Dead);
            act.stop_tx.send_replace(true);
            ctx.stop();
            r.map(|_| ())
        })))
    }
}

//! Hosting actors where their shard is held (placement, a tenant of the
//! shard leases): one activation per actor, on the silo that holds the
//! actor's shard lease, under that lease's [`Fence`].
//!
//! The rules are [`HostTable`]'s (sans-io: what a message, a change of the
//! held shards or a fenced write does to the activations); [`ActorHost`]
//! carries them out for actix actors.
//!
//! - **Activate** an actor on its first message while this silo holds its
//!   shard ([`ShardOwnership::fence`](super::ShardOwnership::fence)), with that fence: its
//!   state storage is fenced by it, so the store refuses its writes once
//!   another silo acquired the shard.
//! - **Deactivate** it when its shard is no longer held at its fence's epoch
//!   (being released: before the release is written; lost; taken again at
//!   another epoch), or when a write under its fence was refused
//!   ([`Error::Fenced`](crate::Error::Fenced)): the older fence gives
//!   way. Messages already in its mailbox are handled first; later ones are
//!   refused ([`HostError::NotHere`]) and go to the owner
//!   (the service's `owner`: the lease row's holder).
//! - **Duplicates.** Two silos can host one actor for a moment only while
//!   the older holder has not yet learnt that it lost the shard (a partition,
//!   a paused process). Orleans' directory finds such duplicates after the
//!   fact (and never deactivated them, seed 003: "currently not implemented");
//!   here the store orders them: every write of the older activation is
//!   refused, and the first refusal deactivates it. Its reads are not
//!   answered either: [`ActorHost::send`] checks the fence again when the
//!   answer comes and withholds one whose fence lapsed meanwhile
//!   ([`HostError::Lapsed`]).

use std::collections::HashMap;

use super::{actor_shard, ActorId, HeldMap};
use crate::Fence;

/// Why an activation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deactivation {
    /// Its shard is no longer held at its fence's epoch (released, being
    /// released, lost, or held again at another epoch).
    ShardGone,
    /// A write under its fence was refused by the store.
    Fenced,
    /// Its actor stopped by itself.
    Stopped,
}

/// What to do with a message for an actor ([`HostTable::route`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<H> {
    /// Deliver it to this activation.
    Here(H),
    /// Activate the actor under this fence, then deliver it.
    Activate(Fence),
    /// This silo does not hold the actor's shard: refuse it.
    NotHere,
}

/// The activations of one silo and the rules that start and end them
/// (sans-io: the caller passes what the reminder service says and carries
/// out the answers). `H` is whatever reaches an activation (an actix `Addr`).
#[derive(Debug)]
pub struct HostTable<H> {
    shards: u32,
    active: HashMap<ActorId, (Fence, H)>,
    /// The releases this table reported (shard -> epoch), while the service
    /// still waits for them.
    reported: HeldMap,
}

/// An activation that ends: the actor, its fence, its handle.
pub type Ending<H> = (ActorId, Fence, H);

/// What a change of the held shards ends ([`HostTable::held`]).
#[derive(Debug, PartialEq, Eq)]
pub struct HeldChange<H> {
    /// Each shard no longer held (and the epoch it was held at), with its
    /// activations that end: report it drained once they ended.
    pub released: Vec<(u32, u64, Vec<Ending<H>>)>,
    /// Activations that end for another reason (the silo may no longer act
    /// as the holder): no release waits for them.
    pub ended: Vec<Ending<H>>,
}

impl<H: Clone> HostTable<H> {
    /// An empty table for a service of `shards` shards.
    pub fn new(shards: u32) -> HostTable<H> {
        HostTable {
            shards: shards.max(1),
            active: HashMap::new(),
            reported: HeldMap::new(),
        }
    }

    /// Where a message for `actor` goes, given the fence this silo may act
    /// under for its shard now (`None`: not held, or held but not confirmed
    /// now) and whether an activation is still running (`alive`). An
    /// activation under another epoch, or one that stopped, is removed first
    /// (returned, with why). With no fence now, an activation stays, paused:
    /// the message is refused, and the activation serves again once the
    /// fence is back at its epoch (a lapse of the silo's confirmation, a
    /// store read slower than two thirds of the lease period, is a pause,
    /// never a second activation at one epoch); it ends when its shard goes
    /// ([`held`](Self::held)).
    pub fn route(
        &mut self,
        actor: &ActorId,
        now: Option<Fence>,
        alive: impl Fn(&H) -> bool,
    ) -> (Route<H>, Option<(Fence, H, Deactivation)>) {
        let mut ended = None;
        if now.is_none() && self.active.contains_key(actor) {
            return (Route::NotHere, None);
        }
        if let Some((fence, handle)) = self.active.get(actor) {
            let same = now.as_ref().is_some_and(|f| f.epoch == fence.epoch);
            if same && alive(handle) {
                return (Route::Here(handle.clone()), None);
            }
            let why = if same {
                Deactivation::Stopped
            } else {
                Deactivation::ShardGone
            };
            ended = self.active.remove(actor).map(|(f, h)| (f, h, why));
        }
        match now {
            Some(f) => (Route::Activate(f), ended),
            None => (Route::NotHere, ended),
        }
    }

    /// Records the activation of `actor` under `fence`.
    pub fn activated(&mut self, actor: ActorId, fence: Fence, handle: H) {
        self.active.insert(actor, (fence, handle));
    }

    /// The held shards changed: `raw` as the reminder service holds them
    /// (confirmed now or not), and the releases that wait for hosts
    /// (`releasing`, [`Held::releasing`](super::Held::releasing)). Every
    /// activation whose shard is not in `raw` at its fence's epoch ends; one
    /// whose shard is held but may not be acted on now (its confirmation
    /// lapsed, [`Held::epoch_at`](super::Held::epoch_at)) stays, paused
    /// ([`route`](Self::route) refuses its messages). Each release in
    /// `releasing` not reported yet is `released`, once, with its ending
    /// activations (none, if they ended earlier or never were): the service
    /// waits for `ShardOwnership::host_drained` once they ended. Being a level,
    /// `releasing` shows a release however the watch coalesced the changes
    /// (a release that came and went between two reads of the watch was
    /// missed before, and its shard waited out the whole drain). The other
    /// ending activations are `ended`.
    pub fn held(&mut self, raw: &HeldMap, releasing: &HeldMap) -> HeldChange<H> {
        let gone: Vec<ActorId> = self
            .active
            .iter()
            .filter(|(_, (f, _))| raw.get(&f.shard) != Some(&f.epoch))
            .map(|(a, _)| a.clone())
            .collect();
        let mut ended: Vec<Ending<H>> = gone
            .into_iter()
            .filter_map(|a| self.active.remove(&a).map(|(f, h)| (a, f, h)))
            .collect();
        let mut released = Vec::new();
        self.reported.retain(|k, e| releasing.get(k) == Some(e));
        for (&shard, &epoch) in releasing {
            if self.reported.insert(shard, epoch) == Some(epoch) {
                continue;
            }
            let (theirs, rest) = ended
                .into_iter()
                .partition(|(_, f, _)| f.shard == shard && f.epoch == epoch);
            ended = rest;
            released.push((shard, epoch, theirs));
        }
        HeldChange { released, ended }
    }

    /// A write of `actor` under `epoch` was refused: its activation under
    /// that epoch ends (returned).
    pub fn fenced(&mut self, actor: &ActorId, epoch: u64) -> Option<(Fence, H)> {
        match self.active.get(actor) {
            Some((f, _)) if f.epoch == epoch => self.active.remove(actor),
            _ => None,
        }
    }

    /// How many actors are active.
    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// Whether no actor is active.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// The shard of `actor` in this service.
    pub fn shard_of(&self, actor: &ActorId) -> u32 {
        actor_shard(&actor.to_string(), self.shards)
    }
}

/// Why [`ActorHost::send`] did not deliver.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// This silo does not hold the actor's shard (any more): ask
    /// the service's `owner` where it lives.
    #[error("actor `{0}` is not hosted here")]
    NotHere(String),
    /// The activation stopped before it answered (it was deactivated, or its
    /// handler stopped it): the message may or may not have been handled.
    #[error("actor `{0}` stopped before it answered")]
    Stopped(String),
    /// The activation answered, but by then this silo no longer held the
    /// actor's shard at the fence the message was routed under (the shard
    /// was released or lost, or the silo's confirmation lapsed: a process
    /// frozen or cut off while its handler was parked at an `.await`). The
    /// answer is withheld, since another activation may have accepted writes
    /// meanwhile and it could be stale. The message was handled: its fenced
    /// writes landed or were refused. Retry on the owner, idempotently (issue
    /// 72, item 2).
    #[error("actor `{0}`'s fence lapsed before its answer: retry on the owner")]
    Lapsed(String),
}

#[cfg(feature = "runtime")]
pub use runtime::{ActorHost, Deactivate, HostEvent, DEACTIVATE_TIMEOUT};

#[cfg(feature = "runtime")]
mod runtime {
    use std::sync::{Arc, Mutex};

    use actix::{Actor, Addr, Context, Handler, Message};

    use super::{Deactivation, HostError, HostTable, Route};
    use crate::ownership::{ActorId, HostRegistration, ShardOwnership};
    use crate::Fence;

    /// An activation starting or ending, for logs and measurements.
    #[derive(Clone, Debug)]
    pub enum HostEvent {
        /// `actor` was activated under `fence`.
        Activated {
            /// The actor.
            actor: ActorId,
            /// Its fence.
            fence: Fence,
        },
        /// `actor`'s activation under `fence` ended.
        Deactivated {
            /// The actor.
            actor: ActorId,
            /// Its fence.
            fence: Fence,
            /// Why.
            why: Deactivation,
        },
    }

    type Activate<A> = dyn Fn(ActorId, Fence) -> A + Send + Sync;

    /// How long a deactivation waits for an activation to handle
    /// [`Deactivate`] (after what its mailbox holds): 10 s. The release it
    /// holds back waits at most the service's drain anyway.
    pub const DEACTIVATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

    /// Sent to an activation whose shard goes, after every message already in
    /// its mailbox: flush what it holds and stop (`ctx.stop()`). The release
    /// of the shard waits for the answer (at most the drain), so the next
    /// holder activates the actor only after this activation ended.
    #[derive(Message, Clone, Copy, Debug)]
    #[rtype(result = "()")]
    pub struct Deactivate;
    type OnEvent = dyn Fn(HostEvent) + Send + Sync;

    struct Inner<A: Actor<Context = Context<A>>> {
        _registered: HostRegistration,
        ownership: ShardOwnership,
        activate: Box<Activate<A>>,
        table: Mutex<HostTable<Addr<A>>>,
        on_event: Option<Box<OnEvent>>,
    }

    /// Hosts actix actors of one service on the silo holding each
    /// one's shard ([module docs](super)): `send` activates an actor on its
    /// first message here (`activate(actor, fence)` builds it; fence its state
    /// storage with the fence, `StateStorage::fenced`), and the host ends the
    /// activation when the shard goes (an activation's last address is
    /// dropped: it handles what its mailbox holds, then stops). Cheap to
    /// clone; call it inside an actix `System`.
    pub struct ActorHost<A: Actor<Context = Context<A>>> {
        inner: Arc<Inner<A>>,
    }

    impl<A: Actor<Context = Context<A>>> Clone for ActorHost<A> {
        fn clone(&self) -> Self {
            ActorHost {
                inner: self.inner.clone(),
            }
        }
    }

    impl<A: Actor<Context = Context<A>> + Handler<Deactivate>> ActorHost<A> {
        /// A host of the actors of `ownership`'s service (a
        /// [`ShardOwnership`], or what converts into one: `&Reminders`,
        /// `&Placement`), built by `activate`. Starts watching the held
        /// shards ([`ShardOwnership::held_shards`]).
        pub fn new(
            ownership: impl Into<ShardOwnership>,
            activate: impl Fn(ActorId, Fence) -> A + Send + Sync + 'static,
        ) -> Self {
            Self::with_events(ownership, activate, None)
        }

        /// [`new`](Self::new), calling `on_event` on every activation and
        /// deactivation (from the thread that caused it: keep it short).
        pub fn with_events(
            ownership: impl Into<ShardOwnership>,
            activate: impl Fn(ActorId, Fence) -> A + Send + Sync + 'static,
            on_event: Option<Box<dyn Fn(HostEvent) + Send + Sync>>,
        ) -> Self {
            let ownership = ownership.into();
            let host = ActorHost {
                inner: Arc::new(Inner {
                    _registered: ownership.register_host(),
                    activate: Box::new(activate),
                    table: Mutex::new(HostTable::new(ownership.shards())),
                    on_event,
                    ownership,
                }),
            };
            let mut held = host.inner.ownership.held_shards();
            let weak = Arc::downgrade(&host.inner);
            actix::spawn(async move {
                while held.changed().await.is_ok() {
                    let Some(inner) = weak.upgrade() else { return };
                    let (raw, releasing) = {
                        let h = held.borrow_and_update();
                        (h.shards.clone(), h.releasing.clone())
                    };
                    let change = inner.lock().held(&raw, &releasing);
                    for (shard, epoch, theirs) in change.released {
                        let inner = inner.clone();
                        actix::spawn(async move {
                            inner.deactivate(theirs).await;
                            inner.ownership.host_drained(shard, epoch);
                        });
                    }
                    if !change.ended.is_empty() {
                        let inner = inner.clone();
                        actix::spawn(async move { inner.deactivate(change.ended).await });
                    }
                }
            });
            host
        }

        /// The activation of `actor` here, activating it if this silo holds
        /// its shard.
        ///
        /// # Errors
        /// [`HostError::NotHere`] when this silo does not hold its shard.
        pub fn get(&self, actor: &ActorId) -> Result<Addr<A>, HostError> {
            self.route(actor).map(|(addr, _)| addr)
        }

        /// [`get`](Self::get), with the fence the activation runs under.
        fn route(&self, actor: &ActorId) -> Result<(Addr<A>, Fence), HostError> {
            let now = self.inner.ownership.fence(actor);
            let fence_now = now.clone();
            let mut table = self.inner.lock();
            let (route, ended) = table.route(actor, now, Addr::connected);
            let mut events = Vec::new();
            if let Some((fence, addr, why)) = ended {
                drop(addr);
                events.push(HostEvent::Deactivated {
                    actor: actor.clone(),
                    fence,
                    why,
                });
            }
            let out = match (route, fence_now) {
                (Route::Here(addr), Some(fence)) => Ok((addr, fence)),
                (Route::Here(_) | Route::NotHere, _) => Err(HostError::NotHere(actor.to_string())),
                (Route::Activate(fence), _) => {
                    let addr = (self.inner.activate)(actor.clone(), fence.clone()).start();
                    table.activated(actor.clone(), fence.clone(), addr.clone());
                    events.push(HostEvent::Activated {
                        actor: actor.clone(),
                        fence: fence.clone(),
                    });
                    Ok((addr, fence))
                }
            };
            drop(table);
            for e in events {
                self.inner.emit(e);
            }
            out
        }

        /// Delivers `msg` to `actor`'s activation here (activating it first
        /// if needed) and waits for its answer. The fence is checked twice:
        /// when the message is routed and when the answer comes. Ownership of
        /// a shard at one epoch is one unbroken stretch of time, so an answer
        /// that passes both checks was computed while this activation was
        /// the actor's only one; an answer that fails the second is withheld
        /// ([`HostError::Lapsed`]): a handler parked at an `.await` across a
        /// freeze, or a message queued behind one, never answers from memory
        /// after a successor accepted writes.
        ///
        /// # Errors
        /// [`HostError::NotHere`] when this silo does not hold its shard;
        /// [`HostError::Stopped`] when the activation stopped first;
        /// [`HostError::Lapsed`] when the shard's fence lapsed before the
        /// answer (the message was handled).
        pub async fn send<M>(&self, actor: &ActorId, msg: M) -> Result<M::Result, HostError>
        where
            A: Handler<M>,
            M: Message + Send + 'static,
            M::Result: Send,
        {
            let (addr, fence) = self.route(actor)?;
            let answer = addr
                .send(msg)
                .await
                .map_err(|_| HostError::Stopped(actor.to_string()))?;
            match self.inner.ownership.fence(actor) {
                Some(now) if now.epoch == fence.epoch => Ok(answer),
                _ => Err(HostError::Lapsed(actor.to_string())),
            }
        }

        /// A write of `actor` under `fence` was refused by the store
        /// ([`Error::Fenced`](crate::Error::Fenced)): its activation
        /// under that fence ends, and the service driving the leases reads
        /// the shard's lease row again at once (a lease a store failover lost heals).
        /// Call it from the handler that saw the error.
        pub fn fenced(&self, actor: &ActorId, fence: &Fence) {
            self.inner.ownership.lease_fenced(fence);
            let ended = self.inner.lock().fenced(actor, fence.epoch);
            if let Some((fence, addr)) = ended {
                drop(addr);
                self.inner.emit(HostEvent::Deactivated {
                    actor: actor.clone(),
                    fence,
                    why: Deactivation::Fenced,
                });
            }
        }

        /// How many actors are active here.
        pub fn active(&self) -> usize {
            self.inner.lock().len()
        }
    }

    impl<A: Actor<Context = Context<A>> + Handler<Deactivate>> Inner<A> {
        fn lock(&self) -> std::sync::MutexGuard<'_, HostTable<Addr<A>>> {
            self.table
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Ends `activations`: each handles a [`Deactivate`] after what its
        /// mailbox holds (at most [`DEACTIVATE_TIMEOUT`]), then its address
        /// is dropped.
        async fn deactivate(&self, activations: Vec<(ActorId, Fence, Addr<A>)>) {
            let mut sent = tokio::task::JoinSet::new();
            for (actor, fence, addr) in activations {
                // Sent at once, answered in parallel, each within the bound.
                sent.spawn_local(async move {
                    let _ = tokio::time::timeout(DEACTIVATE_TIMEOUT, addr.send(Deactivate)).await;
                    (actor, fence)
                });
            }
            while let Some(done) = sent.join_next().await {
                if let Ok((actor, fence)) = done {
                    self.emit(HostEvent::Deactivated {
                        actor,
                        fence,
                        why: Deactivation::ShardGone,
                    });
                }
            }
        }

        fn emit(&self, e: HostEvent) {
            if let Some(f) = &self.on_event {
                f(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(shard: u32, epoch: u64) -> Fence {
        Fence {
            service: "s".into(),
            shards: 16,
            shard,
            epoch,
        }
    }

    #[test]
    fn an_actor_is_activated_once_per_epoch_and_ends_with_its_shard() {
        let mut t: HostTable<u32> = HostTable::new(16);
        let a = ActorId::new("cart", "1").unwrap();
        let k = t.shard_of(&a);
        // Not held: refused.
        assert_eq!(t.route(&a, None, |_| true), (Route::NotHere, None));
        // Held: activated once, then delivered.
        let (r, _) = t.route(&a, Some(fence(k, 3)), |_| true);
        assert_eq!(r, Route::Activate(fence(k, 3)));
        t.activated(a.clone(), fence(k, 3), 7);
        assert_eq!(t.route(&a, Some(fence(k, 3)), |_| true), (Route::Here(7), None));
        // Held again at a later epoch (released and acquired back): the old
        // activation ends, a new one starts.
        let (r, ended) = t.route(&a, Some(fence(k, 4)), |_| true);
        assert_eq!(
            (r, ended),
            (
                Route::Activate(fence(k, 4)),
                Some((fence(k, 3), 7, Deactivation::ShardGone))
            )
        );
        t.activated(a.clone(), fence(k, 4), 8);
        // A stopped activation is replaced.
        let (r, ended) = t.route(&a, Some(fence(k, 4)), |h| *h != 8);
        assert_eq!(
            (r, ended),
            (
                Route::Activate(fence(k, 4)),
                Some((fence(k, 4), 8, Deactivation::Stopped))
            )
        );
        t.activated(a.clone(), fence(k, 4), 9);
        // A fence of another epoch does not end it; its own does.
        assert_eq!(t.fenced(&a, 3), None);
        assert_eq!(t.fenced(&a, 4), Some((fence(k, 4), 9)));
        assert!(t.is_empty());
        // The shard goes: every activation of it ends, others stay.
        t.activated(a.clone(), fence(k, 5), 10);
        let b = (0..100)
            .map(|i| ActorId::new("cart", i.to_string()).unwrap())
            .find(|b| t.shard_of(b) != k)
            .unwrap();
        let kb = t.shard_of(&b);
        t.activated(b.clone(), fence(kb, 1), 11);
        let both = HeldMap::from([(kb, 1), (k, 5)]);
        let none = HeldMap::new();
        let change = t.held(&both, &none);
        assert!(change.released.is_empty() && change.ended.is_empty());
        // Shard k goes from the service (released at epoch 5, the release
        // waiting for hosts); shard kb stays held (whether or not its
        // confirmation lapsed meanwhile).
        let releasing_k = HeldMap::from([(k, 5)]);
        let change = t.held(&HeldMap::from([(kb, 1)]), &releasing_k);
        assert_eq!(change.released, vec![(k, 5, vec![(a, fence(k, 5), 10)])]);
        assert!(change.ended.is_empty());
        assert_eq!(t.len(), 1);
        // Reported once, however often the watch shows the same release.
        let change = t.held(&HeldMap::from([(kb, 1)]), &releasing_k);
        assert!(change.released.is_empty() && change.ended.is_empty());
        // Shard kb goes too.
        let change = t.held(&none, &HeldMap::from([(kb, 1)]));
        assert_eq!(
            change.released,
            vec![(kb, 1, vec![(b.clone(), fence(kb, 1), 11)])]
        );
        assert!(t.is_empty());
        // A shard that left without its release waiting for hosts: its
        // activations end, nothing is reported.
        t.activated(b.clone(), fence(kb, 2), 12);
        let change = t.held(&HeldMap::from([(kb, 2)]), &none);
        assert!(change.released.is_empty());
        let change = t.held(&none, &none);
        assert_eq!(change.ended, vec![(b, fence(kb, 2), 12)]);
        assert!(change.released.is_empty());
    }

    /// Issue 72, item 6: a release that waits for hosts is reported even
    /// when the watch coalesced the acquire and the release, so the table
    /// never saw the shard held (before, a release was found only as a
    /// shard leaving the held set since the last read, and one that came
    /// and went between two reads was never reported: its shard waited out
    /// the whole drain).
    #[test]
    fn a_release_the_watch_coalesced_is_still_reported() {
        let mut t: HostTable<u32> = HostTable::new(16);
        let change = t.held(&HeldMap::new(), &HeldMap::from([(3, 7)]));
        assert_eq!(change.released, vec![(3, 7, Vec::new())]);
        // Acquired again at a later epoch and released again: a new report.
        let change = t.held(&HeldMap::new(), &HeldMap::from([(3, 9)]));
        assert_eq!(change.released, vec![(3, 9, Vec::new())]);
    }

    /// Issue 72, item 2: a lapse of the silo's confirmation (the fence is
    /// `None` for a while, the shard still held at the same epoch) pauses an
    /// activation: its messages are refused meanwhile, and it serves again
    /// afterwards. Before, the `None` dropped it without a `Deactivate` and
    /// the next `Some` activated a second one at the same epoch.
    #[test]
    fn a_lapse_pauses_an_activation_and_never_activates_a_second() {
        let mut t: HostTable<u32> = HostTable::new(16);
        let a = ActorId::new("cart", "1").unwrap();
        let k = t.shard_of(&a);
        let (r, _) = t.route(&a, Some(fence(k, 2)), |_| true);
        assert_eq!(r, Route::Activate(fence(k, 2)));
        t.activated(a.clone(), fence(k, 2), 1);
        assert_eq!(t.route(&a, None, |_| true), (Route::NotHere, None));
        assert_eq!(t.len(), 1, "paused, not dropped");
        assert_eq!(t.route(&a, Some(fence(k, 2)), |_| true), (Route::Here(1), None));
        // A change of the held shards during the lapse (the shard still
        // held) ends nothing either.
        let change = t.held(&HeldMap::from([(k, 2)]), &HeldMap::new());
        assert!(change.released.is_empty() && change.ended.is_empty());
        assert_eq!(t.route(&a, Some(fence(k, 2)), |_| true), (Route::Here(1), None));
    }
}

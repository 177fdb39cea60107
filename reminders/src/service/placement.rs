//! What placement and the store's fences ask of the reminder service today:
//! which silo an actor's shard is assigned to and held by, the fence this
//! silo holds it at, the held-shards watch and the actor hosts' drains. The
//! shards' rules are the ownership layer's (`rollcall_core::ownership`); the
//! service drives them and answers here.

use super::*;

impl Reminders {
    /// The silo `actor`'s shard is assigned to in this silo's current
    /// membership view (the ring of Active silos); `None` if no silo is
    /// Active. A guess from the local view: the assigned silo may not hold the
    /// shard yet (it acquires it) or any more. Use [`owner`](Self::owner) for
    /// the holder the store names.
    pub fn owner_of(&self, actor: &ActorId) -> Option<SiloAddress> {
        owner_in(&self.inner, &actor.to_string())
    }

    /// The fence of `actor`'s shard when this silo holds it now (acquired, not
    /// being released): the service, the shard and the epoch it holds it at.
    /// State writes made under it ([`StateStorage::fenced`](rollcall_core::StateStorage::fenced))
    /// are refused by the store once another silo took the shard over. `None`
    /// when another silo holds it, or nobody. Never waits.
    pub fn fence(&self, actor: &ActorId) -> Option<Fence> {
        self.inner.ownership.fence(actor)
    }

    /// The shards this silo holds and keeps, each with the epoch it acquired
    /// it at (shard -> epoch), and until when it may act as their holder
    /// (lease fencing: its last confirmation of its own row Active plus the
    /// lease period), as a watch: it changes when a shard is acquired (a new
    /// entry, or a new epoch), when one is being released or was lost (its
    /// entry goes, before the release is written), on each confirmation, and
    /// when the service stops (nothing held). For
    /// applications that host actors their own way ([`ActorHost`](crate::ActorHost)
    /// watches it). The shard of an actor is
    /// [`actor_shard`](rollcall_core::actor_shard)`(actor, shards)` with the
    /// service's [`shards`](Self::shards).
    pub fn held_shards(&self) -> tokio::sync::watch::Receiver<crate::Held> {
        self.inner.held.clone()
    }

    /// The handle placement uses ([`ActorHost::new`](crate::ActorHost::new)
    /// takes it, or `&Reminders`): the fences, the held-shards watch, and
    /// the hosts' registrations, drains and fenced writes, which go to this
    /// service's agent.
    pub fn ownership(&self) -> rollcall_core::ownership::ShardOwnership {
        self.inner.ownership.clone()
    }

    /// The service's shard count (recorded in the store).
    pub fn shards(&self) -> u32 {
        self.inner.shards
    }

    /// The silo holding `actor`'s shard, as its lease row in the store names
    /// it (never a guess from the ring): its address, the lease's epoch and
    /// its advertised endpoint (the silo's IP and the proxy port of its
    /// membership row, when it set one: `SiloBuilder::proxy_port`). `None`
    /// when nobody holds the shard, or its holder is not Active in this silo's
    /// view (a crash being taken over): ask again.
    ///
    /// Answered from this silo's own leases when it holds the shard, else
    /// from the row read at most `lease_poll` ago, else by one read of the
    /// row: within `table_operation_timeout`.
    ///
    /// # Errors
    /// [`ReminderError::Table`] when the read fails or the row is malformed;
    /// [`ReminderError::Timeout`].
    pub async fn owner(&self, actor: &ActorId) -> Result<Option<Owner>, ReminderError> {
        let inner = &self.inner;
        let endpoint = |silo: &SiloAddress| {
            inner
                .view
                .borrow()
                .entry(silo)
                .filter(|e| e.status == rollcall_core::SiloStatus::Active)
                .map(|e| {
                    (e.proxy_port != 0).then(|| std::net::SocketAddr::new(silo.endpoint().ip(), e.proxy_port))
                })
        };
        if let Some(f) = self.fence(actor) {
            let me = inner.silo.address();
            return Ok(Some(Owner {
                endpoint: endpoint(&me).flatten(),
                silo: me,
                epoch: f.epoch,
            }));
        }
        let shard = actor_shard(&actor.to_string(), inner.shards);
        let now = inner.clock.now();
        let cached = inner
            .owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&shard)
            .filter(|(_, at)| now < at.saturating_add(inner.options.lease_poll))
            .map(|(o, _)| o.clone());
        let owner = match cached {
            Some(o) => o,
            None => {
                let lease = bounded(
                    inner.options.table_operation_timeout,
                    inner.leases.read_head(shard),
                )
                .await?;
                let owner = match (lease.status, lease.owner) {
                    (LeaseStatus::Owned, Some(silo)) => Some(Owner {
                        silo,
                        epoch: lease.epoch,
                        endpoint: None,
                    }),
                    _ => None,
                };
                inner
                    .owners
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(shard, (owner.clone(), now));
                owner
            }
        };
        // The holder must be Active in the view now; its endpoint is read here.
        Ok(owner.and_then(|o| {
            let ep = endpoint(&o.silo)?;
            Some(Owner { endpoint: ep, ..o })
        }))
    }
}

/// The owner of `actor_id` in the silo's current view. The ring is rebuilt only
/// when the Active silos change, not on every registration.
pub(super) fn owner_in(inner: &Inner, actor_id: &str) -> Option<SiloAddress> {
    let mut ring = inner
        .ring
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *ring = std::mem::take(&mut *ring).follow(&inner.view.borrow(), inner.options.ring_points_per_silo);
    crate::shards::shard_owner(&ring, actor_id, inner.shards)
}

impl From<&Reminders> for rollcall_core::ownership::ShardOwnership {
    fn from(r: &Reminders) -> Self {
        r.ownership()
    }
}

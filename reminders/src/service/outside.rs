//! Calls made from outside a running service (the command line, other
//! processes): trigger rows, pausing a reminder in its row, and telling the
//! holder of a shard.

use super::*;

/// The one-shot row that triggers reminder `of` at `now`: named
/// `<name>#trigger-<ms>-<salt>`, with its payload and retry policy, and
/// [`trigger_of`](ReminderEntry::trigger_of) set to its name.
///
/// # Errors
/// [`ReminderError::InvalidName`] when that name is over [`MAX_NAME`] bytes.
pub fn trigger_row(of: &ReminderEntry, now: Timestamp, salt: u16) -> Result<ReminderEntry, ReminderError> {
    let name = format!("{}#trigger-{}-{salt:04x}", of.name, now.as_millis());
    if name.len() > MAX_NAME {
        return Err(ReminderError::InvalidName(format!(
            "`{}` is too long to trigger: `{name}` is over {MAX_NAME} bytes",
            of.name
        )));
    }
    let mut entry = ReminderEntry::new(&of.service_id, &of.actor_id, name, now, None);
    entry.payload.clone_from(&of.payload);
    entry.retry = of.retry;
    entry.trigger_of = Some(of.name.clone());
    Ok(entry)
}

/// Sets the paused column of the reminder `name` of `actor` in `table` to
/// `paused` under its etag ([`ReminderTable::update_paused`]), each call
/// bounded by `timeout`, 3 attempts at most (a registration racing it costs
/// one); a write that timed out is read back before it errs. Returns the row
/// as written and whether it changed (pausing a paused reminder does not).
/// The rule of [`Reminders::pause`] and `resume`, for callers outside a silo
/// too (the CLI); they then tell the holder ([`tell_holder`]).
///
/// # Errors
/// [`ReminderError::NotFound`]; [`ReminderError::StaleHandle`] if it was
/// re-registered during each attempt; [`ReminderError::Table`] or
/// [`ReminderError::Timeout`].
pub async fn set_paused(
    table: &dyn ReminderTable,
    actor: &ActorId,
    name: &str,
    paused: Option<Timestamp>,
    timeout: Duration,
) -> Result<(ReminderEntry, bool), ReminderError> {
    let actor_id = actor.to_string();
    for _ in 0..3 {
        let Some(mut row) = bounded(timeout, table.read_row(&actor_id, name)).await? else {
            return Err(ReminderError::NotFound {
                actor: actor.clone(),
                name: name.to_owned(),
            });
        };
        if row.paused.is_some() == paused.is_some() {
            return Ok((row, false));
        }
        let written = match bounded(timeout, table.update_paused(&actor_id, name, &row.etag, paused)).await {
            Ok(written) => written,
            // It may have landed: read to learn.
            Err(e) => match bounded(timeout, table.read_row(&actor_id, name)).await {
                Ok(Some(now)) if now.etag == row.etag && now.paused.is_some() == paused.is_some() => true,
                _ => return Err(e),
            },
        };
        if written {
            row.paused = paused;
            return Ok((row, true));
        }
    }
    Err(ReminderError::StaleHandle {
        actor: actor.clone(),
        name: name.to_owned(),
    })
}

/// What [`tell_holder`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// The holder took the notice: it reads the row now.
    Taken(SiloAddress),
    /// The holder was reached and did not take it (its shard is moving, or
    /// its notice queue is full): its next load or refresh reads the row.
    NotTaken(SiloAddress),
    /// Nobody holds the shard: its next acquire loads the row.
    NoHolder,
}

/// Tells the holder of `actor_id`'s shard of reminder service `service_id`
/// to read reminder `name` again, from a process that is not a silo of the
/// cluster (the `rollcall` CLI after it paused, resumed or triggered a
/// reminder in the store): the shard's lease is read from `store`, and the
/// notice sent once over `transport` as a probe-port request of cluster
/// `cluster` (with the cluster's shared secret when its silos use one: give
/// `transport` the same). Without it the holder learns at its next refresh
/// (`refresh_reminder_list_period`). Reading the shard count records the
/// default (1,024) for a service that has none yet.
///
/// Answers within 2 x `timeout` (the lease read, the send).
///
/// # Errors
/// [`ReminderError::Table`] (the lease table), [`ReminderError::Timeout`]; a
/// holder that cannot be reached is [`ReminderError::Table`] with
/// [`Error::Backend`](rollcall_core::Error::Backend).
pub async fn tell_holder(
    store: &dyn SystemStore,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    actor_id: &str,
    name: &str,
    timeout: Duration,
) -> Result<Told, ReminderError> {
    let leases = open_leases(store, service_id, timeout).await?;
    let shard = rollcall_core::actor_shard(actor_id, leases.shards());
    let body = serde_json::to_vec(NoticeRetry::new(service_id, actor_id, name).notice())
        .map_err(|e| rollcall_core::Error::backend(format!("encode notice: {e}")))?;
    send_from_outside(&leases, transport, cluster, service_id, shard, body, timeout).await
}

/// What [`tell_shard_holders`] did, shard by shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToldShards {
    /// Shards whose holder took the notice.
    pub taken: usize,
    /// Shards whose holder did not take it (its next load or refresh reads
    /// the shard).
    pub not_taken: usize,
    /// Shards nobody holds (the next acquire loads them).
    pub no_holder: usize,
    /// Shards whose lease could not be read or whose holder could not be
    /// reached (its next refresh reads the shard).
    pub failed: usize,
}

/// After a bulk change made from outside the cluster (the CLI's `reminders
/// delete`): tells the holder of every shard of `service_id` that one of
/// `hashes` (rows' [`actor_hash`](rollcall_core::actor_hash)es) falls in to
/// read the shard again ([`ShardNotice`]), one notice per shard, as
/// [`Reminders::delete_prefix`] does from a silo. The rest as
/// [`tell_holder`].
///
/// Answers within `timeout` plus 2 x `timeout` per shard.
///
/// # Errors
/// [`ReminderError::Table`] or [`ReminderError::Timeout`] when the shard
/// count cannot be read; a shard that fails counts in [`ToldShards::failed`].
pub async fn tell_shard_holders(
    store: &dyn SystemStore,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    hashes: impl IntoIterator<Item = u32>,
    timeout: Duration,
) -> Result<ToldShards, ReminderError> {
    let leases = open_leases(store, service_id, timeout).await?;
    let shards: std::collections::BTreeSet<u32> = hashes
        .into_iter()
        .map(|h| rollcall_core::hash_shard(h, leases.shards()))
        .collect();
    let mut told = ToldShards::default();
    for shard in shards {
        let body = serde_json::to_vec(&ShardNotice {
            service: service_id.to_owned(),
            shard,
        })
        .map_err(|e| rollcall_core::Error::backend(format!("encode notice: {e}")))?;
        match send_from_outside(&leases, transport, cluster, service_id, shard, body, timeout).await {
            Ok(Told::Taken(_)) => told.taken += 1,
            Ok(Told::NotTaken(_)) => told.not_taken += 1,
            Ok(Told::NoHolder) => told.no_holder += 1,
            Err(_) => told.failed += 1,
        }
    }
    Ok(told)
}

/// The shard leases of `service_id` with its recorded shard count.
async fn open_leases(
    store: &dyn SystemStore,
    service_id: &str,
    timeout: Duration,
) -> Result<ShardLeases, ReminderError> {
    let table = store.lease_table(service_id)?;
    bounded(timeout, async {
        let shards = table.shard_count(rollcall_core::DEFAULT_SHARDS).await?;
        ShardLeases::open(table, shards).await
    })
    .await
}

/// Sends `body` on the notice topic of `service_id`, from outside the
/// cluster, to the holder of `shard` (once, no retry).
async fn send_from_outside(
    leases: &ShardLeases,
    transport: &dyn rollcall_core::transport::Transport,
    cluster: &str,
    service_id: &str,
    shard: u32,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Told, ReminderError> {
    let lease = bounded(timeout, leases.read_head(shard)).await?;
    let Some(holder) = notice_target(&lease) else {
        return Ok(Told::NoHolder);
    };
    let request = rollcall_core::transport::ProbeRequest::Notice {
        // Not a silo: an address no silo has (the holder only logs it).
        from: SiloAddress::new(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), 0),
        topic: topic(service_id),
        body,
    };
    match transport
        .request(holder.endpoint(), cluster, request, timeout)
        .await
    {
        Ok(rollcall_core::transport::ProbeResponse::NoticeAck { accepted: true }) => Ok(Told::Taken(holder)),
        Ok(_) => Ok(Told::NotTaken(holder)),
        Err(e) => Err(rollcall_core::Error::backend(format!("notice to {holder}: {e}")).into()),
    }
}

/// Rows a bulk delete reads per page.
pub(super) const BULK_PAGE: usize = 1000;
/// Removes a bulk delete has in flight.
pub(super) const BULK_CONCURRENCY: usize = 32;

/// Sends `body` on the notice topic in the background to the holder the lease
/// of `shard` names, by the rule of [`NoticeRetry`] (the lease read again
/// before each send, [`NOTICE_ATTEMPTS`](crate::machine::NOTICE_ATTEMPTS)
/// sends at most). A graceful leave waits for it ([`NOTICE_DRAIN`]).
pub(super) fn send_to_holder(inner: &Arc<Inner>, shard: u32, body: Vec<u8>) {
    let inner = inner.clone();
    let mut retry = NoticeRetry::new(&inner.service_id, "", "");
    let sending = inner.notices_sending.clone().try_read_owned().ok();
    tokio::spawn(async move {
        let _sending = sending;
        let topic = topic(&inner.service_id);
        loop {
            let taken = match bounded(
                inner.options.table_operation_timeout,
                inner.leases.read_head(shard),
            )
            .await
            {
                Ok(lease) => match notice_target(&lease) {
                    Some(holder) => match inner.silo.send_notice(holder, &topic, body.clone()).await {
                        Ok(taken) => taken,
                        Err(e) => {
                            tracing::debug!(%holder, error = %e, "reminder notice not sent");
                            false
                        }
                    },
                    // Nobody holds the shard: its next acquire loads the rows.
                    None => {
                        tracing::debug!(shard, lease = ?lease, "no holder for a notice");
                        return;
                    }
                },
                Err(e) => {
                    tracing::debug!(shard, error = %e, "reading a shard's lease for a notice failed");
                    false
                }
            };
            if !taken {
                tracing::debug!(shard, "reminder notice not taken");
            }
            match retry.after_send(taken) {
                Some(wait) => tokio::time::sleep(wait).await,
                None if taken => return,
                None => {
                    tracing::debug!("reminder notice never taken; the holder's refresh covers it");
                    return;
                }
            }
        }
    });
}

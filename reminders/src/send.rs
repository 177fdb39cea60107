//! Carrying the machine's messages and table calls: bounded table calls, notices
//! and release hints sent to other silos in the background.

use std::time::Duration;

use rollcall_core::{ReminderTable, SiloAddress, SiloHandle};

use rollcall_core::{Notice, NoticeReceiver, NoticesDropped};

use crate::agent::{NoticesReceived, ReminderAgent};
use crate::api::ReminderError;
use crate::machine::{release_topic, ReleaseHint, Write, NOTICE_BATCH};

/// Runs `call` bounded by `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = rollcall_core::Result<T>>,
) -> Result<T, ReminderError> {
    rollcall_core::bounded(
        timeout,
        async { call.await.map_err(ReminderError::from) },
        ReminderError::Timeout,
    )
    .await
}

/// Carries out `write` on `table` (`remove_row` or `update_last_fired`).
pub(crate) async fn apply_write(
    table: &dyn ReminderTable,
    parked: Option<&dyn ReminderTable>,
    write: &Write,
) -> rollcall_core::Result<()> {
    match write {
        Write::Park { row } => match parked {
            Some(parked) => parked.upsert_row(row).await.map(drop),
            None => {
                // A service id too long for the parked one (over 249 bytes).
                tracing::error!(actor = %row.actor_id, name = %row.name,
                    "reminder tick dropped: this service has no parked table (its id is too long)");
                Ok(())
            }
        },
        Write::Remove { key, etag } => table.remove_row(key.actor(), key.name(), etag).await.map(drop),
        Write::LastFired { key, etag, at } => table
            .update_last_fired(key.actor(), key.name(), etag, *at)
            .await
            .map(drop),
    }
}

/// Sends release hints in a background task (each bounded by the silo's
/// `probe_timeout`). Best effort: a lost hint costs its receiver a lease poll.
pub(crate) fn send_hints(silo: &SiloHandle, service_id: &str, hints: Vec<(SiloAddress, ReleaseHint)>) {
    if hints.is_empty() {
        return;
    }
    let (silo, topic) = (silo.clone(), release_topic(service_id));
    tokio::spawn(async move {
        for (to, hint) in hints {
            let Ok(body) = serde_json::to_vec(&hint) else {
                continue;
            };
            if let Err(e) = silo.send_notice(to, &topic, body).await {
                tracing::debug!(%to, error = %e, "release hint not sent; its receiver polls the lease");
            }
        }
    });
}

/// Forwards what `rx` receives to the agent in batches of up to [`NOTICE_BATCH`].
pub(crate) fn forward(
    mut rx: NoticeReceiver,
    addr: actix::Addr<ReminderAgent>,
    wrap: fn(Vec<Result<Notice, NoticesDropped>>) -> NoticesReceived,
) {
    actix::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < NOTICE_BATCH {
                match rx.try_recv() {
                    Some(n) => batch.push(n),
                    None => break,
                }
            }
            if addr.send(wrap(batch)).await.is_err() {
                return;
            }
        }
    });
}

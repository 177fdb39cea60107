//! Carrying the machine's messages and table calls: bounded table calls, notices
//! and release hints sent to other silos in the background.

use std::time::Duration;

use rollcall_membership_core::{ReminderTable, SiloAddress, SiloHandle};

use rollcall_membership_core::{Notice, NoticeReceiver, NoticesDropped};

use crate::agent::{NoticesReceived, ReminderAgent};
use crate::api::ReminderError;
use crate::machine::{
    release_topic, topic, ChangedNotice, ReleaseHint, Write, NOTICE_ATTEMPTS, NOTICE_BATCH, NOTICE_RETRY,
};

/// Runs `call` bounded by `timeout`.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = rollcall_membership_core::Result<T>>,
) -> Result<T, ReminderError> {
    rollcall_membership_core::bounded(
        timeout,
        async { call.await.map_err(ReminderError::from) },
        ReminderError::Timeout,
    )
    .await
}

/// Carries out `write` on `table` (`remove_row` or `update_last_fired`).
pub(crate) async fn apply_write(
    table: &dyn ReminderTable,
    write: &Write,
) -> rollcall_membership_core::Result<()> {
    match write {
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

/// Sends `notices` to their silos in a background task, each again every
/// [`NOTICE_RETRY`] while not taken, [`NOTICE_ATTEMPTS`] sends in all (each
/// bounded by the silo's `probe_timeout`); past that the owner's refresh
/// covers it.
pub(crate) fn send_notices(silo: &SiloHandle, service_id: &str, notices: Vec<(SiloAddress, ChangedNotice)>) {
    if notices.is_empty() {
        return;
    }
    let (silo, topic) = (silo.clone(), topic(service_id));
    tokio::spawn(async move {
        for (owner, notice) in notices {
            let Ok(body) = serde_json::to_vec(&notice) else {
                continue;
            };
            for attempt in 1..=NOTICE_ATTEMPTS {
                match silo.send_notice(owner, &topic, body.clone()).await {
                    Ok(true) => break,
                    Ok(false) => tracing::debug!(%owner, attempt, "reminder notice not taken"),
                    Err(e) => tracing::debug!(%owner, attempt, error = %e, "reminder notice not sent"),
                }
                if attempt < NOTICE_ATTEMPTS {
                    tokio::time::sleep(NOTICE_RETRY).await;
                }
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

//! Carrying the machine's messages and table calls: bounded table calls, notices
//! and releases sent to other silos in the background.

use std::time::Duration;

use rollcall_membership_core::{ReminderTable, SiloAddress, SiloHandle};

use rollcall_membership_core::{Notice, NoticeReceiver, NoticesDropped};

use crate::agent::{NoticesReceived, ReminderAgent};
use crate::api::ReminderError;
use crate::handoff::HandoffMessage;
use crate::machine::{release_topic, topic, ChangedNotice, Write, NOTICE_BATCH};

/// Attempts at sending one release.
const RELEASE_ATTEMPTS: u32 = 3;

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

/// Sends `releases` to their silos at once, each retried up to
/// [`RELEASE_ATTEMPTS`] times (each bounded by the silo's `probe_timeout`);
/// finishes when every one was taken or given up.
pub(crate) async fn send_releases(silo: SiloHandle, releases: Vec<(SiloAddress, HandoffMessage)>) {
    let topic = match releases.first() {
        Some((_, HandoffMessage::Release(r))) => release_topic(&r.service),
        Some((_, HandoffMessage::Request(r))) => release_topic(&r.service),
        None => return,
    };
    let sends: Vec<_> = releases
        .into_iter()
        .map(|(to, message)| {
            let (silo, topic) = (silo.clone(), topic.clone());
            tokio::spawn(async move {
                let Ok(body) = serde_json::to_vec(&message) else { return };
                for attempt in 1..=RELEASE_ATTEMPTS {
                    match silo.send_notice(to, &topic, body.clone()).await {
                        Ok(true) => return,
                        Ok(false) => tracing::debug!(%to, attempt, "reminder release not taken"),
                        Err(e) => tracing::debug!(%to, attempt, error = %e, "reminder release not sent"),
                    }
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
                tracing::warn!(%to, "reminder release never taken; its receiver takes the range over after its hold timeout");
            })
        })
        .collect();
    for s in sends {
        let _ = s.await;
    }
}

/// Sends `notices` to their silos one after another in a background task (each
/// bounded by the silo's `probe_timeout`). Best effort: a notice not taken is
/// covered by the owner's loads, so failures are only logged.
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
            match silo.send_notice(owner, &topic, body).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(%owner, "reminder notice not taken; the owner's loads cover it"),
                Err(e) => {
                    tracing::debug!(%owner, error = %e, "reminder notice lost; the owner's loads cover it")
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

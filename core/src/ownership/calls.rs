//! The store calls a driver of the lease rules makes, each bounded: a lease
//! write in its steps (pages, then the row), and a silo's membership status.
//! Shared by every driver (the reminder service's agent, the placement
//! service's), so that the rules' I/O is written once.

use std::sync::Arc;
use std::time::Duration;

use super::lease::{ShardLease, ShardLeases};
use super::machine::WriteFailed;
use crate::{bounded, Error, Etag, MembershipTable, SiloAddress, SiloStatus};

/// A call that gave no answer within `timeout`: transient, its outcome
/// unknown.
pub(crate) fn timed_out(timeout: Duration) -> Error {
    Error::backend(format!("no answer within {timeout:?}"))
}

/// Writes `lease` by compare-and-set: its pages first, each store call of
/// them bounded by `timeout` on its own, then the row (bounded the same), so
/// a release that owes tens of thousands lands however slow the store, and
/// a retry resumes the pages an attempt cut short had sent. Once the row
/// landed, the page sets it replaced are deleted (best effort, within
/// `timeout`) before the answer: the shard's next write must not race a
/// delete of the pages it names.
///
/// Answers `Ok(Ok(etag))` written, `Ok(Err(current))` another write came
/// first ([`ShardEvent::Written`](super::ShardEvent::Written)), or the
/// failure, read as the lease rules read it ([`WriteFailed::of`]).
pub async fn write_lease(
    leases: &ShardLeases,
    lease: &ShardLease,
    timeout: Duration,
) -> Result<Result<Etag, Option<Etag>>, WriteFailed> {
    let began = std::time::Instant::now();
    let mut write = leases.prepare(lease).map_err(|e| WriteFailed::of(&e))?;
    let pages = write.pages_left();
    while bounded(timeout, leases.send_pages(&mut write), timed_out)
        .await
        .map_err(|e| WriteFailed::of(&e))?
    {}
    let paged = began.elapsed();
    let result = bounded(timeout, leases.commit(&write), timed_out)
        .await
        .map_err(|e| WriteFailed::of(&e))?;
    tracing::debug!(
        shard = lease.shard,
        status = ?lease.status,
        exceptions = lease.exceptions.len(),
        pages,
        pages_ms = paged.as_millis() as u64,
        row_ms = (began.elapsed() - paged).as_millis() as u64,
        landed = result.is_ok(),
        "lease written"
    );
    if result.is_ok() {
        let cleanup = async {
            leases.cleanup(&write).await;
            Ok::<(), ()>(())
        };
        let _ = bounded(timeout, cleanup, |_| ()).await;
    }
    Ok(result)
}

/// Reads `silo`'s membership row within `timeout`: its status (`None`: no
/// row), or the error's text (the lease rules ask again after a poll).
pub async fn read_status(
    membership: Arc<dyn MembershipTable>,
    silo: SiloAddress,
    timeout: Duration,
) -> Result<Option<SiloStatus>, String> {
    bounded(timeout, membership.read_row(&silo), timed_out)
        .await
        .map(|snapshot| snapshot.entry(&silo).map(|e| e.status))
        .map_err(|e| e.to_string())
}

/// Follows `silo`'s clock report for a driver of the lease rules (rule 9:
/// beyond the bound, the shards go): answers the report now, and calls
/// `crossed` (on a task of the current arbiter) with each later report that
/// crosses the bound one way or the other, until `crossed` answers `false`
/// (the driver stopped) or the silo stops.
pub fn follow_clock_bound<F, Fut>(silo: &crate::SiloHandle, crossed: F) -> crate::protocol::ClockReport
where
    F: Fn(crate::protocol::ClockReport) -> Fut + 'static,
    Fut: std::future::Future<Output = bool>,
{
    let mut clock = silo.subscribe_clock();
    let report = *clock.borrow_and_update();
    actix::spawn(async move {
        let mut within = report.within_bound;
        while clock.changed().await.is_ok() {
            let report = *clock.borrow_and_update();
            if report.within_bound != within {
                within = report.within_bound;
                if !crossed(report).await {
                    return;
                }
            }
        }
    });
    report
}

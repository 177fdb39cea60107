//! Conditional table writes with read / decide / write retries.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::protocol::backoff_delay;
use crate::{Clock, Error, Etag, MembershipEntry, MembershipSnapshot, MembershipTable, Timestamp};

/// Conflicts (and transient errors) tolerated before a write gives up.
pub(crate) const MAX_ATTEMPTS: u32 = 30;
const BACKOFF_BASE: Duration = Duration::from_millis(10);
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// One row write planned from a snapshot.
#[derive(Debug, Clone)]
pub(crate) enum Planned {
    Insert(MembershipEntry),
    Update(MembershipEntry, Etag),
}

/// What the planner decides after reading the table.
#[derive(Debug)]
pub(crate) enum Plan<A> {
    /// Write this (one conditional write).
    Write(Planned),
    /// Nothing (more) to write.
    Done,
    /// Stop with this reason.
    Abort(A),
}

/// Outcome of [`write`].
#[derive(Debug)]
pub(crate) enum Outcome<A> {
    /// The write committed; the snapshot read right after it (or, if that read
    /// failed, the one the write was planned from).
    Written(MembershipSnapshot),
    /// The planner had nothing to write; the snapshot it saw.
    Unchanged(MembershipSnapshot),
    /// The planner aborted.
    Aborted(A, MembershipSnapshot),
}

/// Reads the table, asks `plan` what to write, writes it conditionally on the etags
/// and version just read, and on a conflict re-reads and re-plans (exponential backoff
/// with full jitter). One committed write ends the call; multi-row procedures (a join)
/// call it once per row.
///
/// # Errors
/// The last [`Error`] when the table fails or conflicts persist for
/// [`MAX_ATTEMPTS`] attempts.
pub(crate) async fn write<A>(
    table: &Arc<dyn MembershipTable>,
    clock: &Arc<dyn Clock>,
    mut plan: impl FnMut(&MembershipSnapshot, Timestamp) -> Plan<A>,
) -> Result<Outcome<A>, Error> {
    let mut attempt = 0u32;
    loop {
        let snap = match table.read_all().await {
            Ok(s) => s,
            Err(e) => {
                attempt += 1;
                if attempt >= MAX_ATTEMPTS || !e.is_transient() {
                    return Err(e);
                }
                pause(attempt).await;
                continue;
            }
        };
        let planned = match plan(&snap, clock.now()) {
            Plan::Done => return Ok(Outcome::Unchanged(snap)),
            Plan::Abort(a) => return Ok(Outcome::Aborted(a, snap)),
            Plan::Write(p) => p,
        };
        let next = snap.version.next();
        let result = match &planned {
            Planned::Insert(e) => table.insert_row(e, &next).await,
            Planned::Update(e, etag) => table.update_row(e, etag, &next).await,
        };
        match result {
            Ok(true) => {
                let after = table.read_all().await.unwrap_or(snap);
                return Ok(Outcome::Written(after));
            }
            Ok(false) => {
                attempt += 1;
                if attempt >= MAX_ATTEMPTS {
                    return Err(Error::backend(format!(
                        "membership write gave up after {MAX_ATTEMPTS} conflicting attempts"
                    )));
                }
                pause(attempt).await;
            }
            Err(e) => {
                attempt += 1;
                if attempt >= MAX_ATTEMPTS || !e.is_transient() {
                    return Err(e);
                }
                pause(attempt).await;
            }
        }
    }
}

async fn pause(attempt: u32) {
    let unit: f64 = rand::rng().random();
    tokio::time::sleep(backoff_delay(attempt, BACKOFF_BASE, BACKOFF_CAP, unit)).await;
}

//! Reading a reminder table page by page, filtered by an actor-id prefix (an
//! actor kind `cart/`, or an id prefix `cart/eu-`).
//!
//! Rows are kept in ring order (by [`actor_hash`](crate::actor_hash)), not by
//! actor id, so a page walks the ring in pieces with
//! [`ReminderTable::read_rows_in_range`] and keeps the rows whose actor id
//! starts with the prefix, in `(hash, actor id, name)` order. A token names the
//! last row a page returned; the next page starts right after it, so a page
//! never repeats or skips a row that stayed in the table, whatever was written
//! meanwhile. Rows written or removed while the pages are read may or may not
//! show (as in any paged scan: DynamoDB's `Scan`, Redis' `SCAN`).
//!
//! Cost: the walk reads every row of the table once over all pages, the ones
//! that do not match included (no provider keeps an index by kind, as Orleans'
//! reminder table keeps none). One page reads at most [`PAGE_SCAN_ROWS`] rows,
//! so a page of a rare kind may come back short, or empty, with a token: only a
//! page without a token is the last.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::{Error, ReminderEntry, ReminderTable, Result};

/// The largest page: 10,000 rows.
pub const MAX_PAGE_SIZE: usize = 10_000;

/// The most rows one page reads from the table (matching or not) before it
/// returns what it has, with a token: 50,000.
pub const PAGE_SCAN_ROWS: usize = 50_000;

/// The ring width of the first piece a page reads: 1/1,024 of the ring (a
/// default shard); the next ones follow the density read so far.
const FIRST_WIDTH: u64 = 1 << 22;

/// Where the next page starts: at ring position `hash`, after the row
/// `(hash, actor, name)` when a page stopped within that hash. Opaque to
/// callers: [`encode`](Self::encode) and [`parse`](Self::parse) carry it
/// through a URL or a command line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageToken {
    #[serde(rename = "h")]
    hash: u32,
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    after: Option<(String, String)>,
}

impl PageToken {
    /// The token as URL-safe text (base64 of a small JSON object).
    pub fn encode(&self) -> String {
        // A number and two strings always serialize.
        let json = serde_json::to_vec(self).unwrap_or_default();
        URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a token [`encode`](Self::encode) wrote.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (`page token`) for text no page returned.
    pub fn parse(text: &str) -> Result<PageToken> {
        let bad = |why: String| Error::invalid_input("page token", why);
        let json = URL_SAFE_NO_PAD
            .decode(text.trim().as_bytes())
            .map_err(|e| bad(format!("not base64: {e}")))?;
        serde_json::from_slice(&json).map_err(|e| bad(format!("not a page token: {e}")))
    }

    /// Whether a page starting here returns `row`.
    fn admits(&self, row: &ReminderEntry) -> bool {
        row.hash > self.hash
            || (row.hash == self.hash
                && self.after.as_ref().is_none_or(|(a, n)| {
                    (a.as_str(), n.as_str()) < (row.actor_id.as_str(), row.name.as_str())
                }))
    }
}

impl std::fmt::Display for PageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

/// One page of rows: at most the size asked for, in ring order, and the token of
/// the next page (`None`: this was the last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReminderPage {
    /// The rows whose actor id starts with the prefix.
    pub rows: Vec<ReminderEntry>,
    /// Where the next page starts; `None` once the whole ring was read.
    pub next: Option<PageToken>,
}

/// One page of the rows of `table` whose actor id starts with `prefix` (`""`:
/// every row), after `after` (`None`: from the start), at most `size` rows
/// (1..=[`MAX_PAGE_SIZE`]). Reads the ring in pieces, at most
/// [`PAGE_SCAN_ROWS`] rows in all, so it makes a few store calls, each bounded
/// as the table's calls are.
///
/// # Errors
/// [`Error::InvalidInput`] (`page size`) for a size outside 1..=10,000; the
/// table's errors (nothing is written).
pub async fn read_page<T: ReminderTable + ?Sized>(
    table: &T,
    prefix: &str,
    after: Option<&PageToken>,
    size: usize,
) -> Result<ReminderPage> {
    if size == 0 || size > MAX_PAGE_SIZE {
        return Err(Error::invalid_input(
            "page size",
            format!("{size} is outside 1..={MAX_PAGE_SIZE}"),
        ));
    }
    // The first hash not read yet (2^32 once the ring is done).
    let mut lo: u64 = after.map_or(0, |t| u64::from(t.hash));
    let mut width = FIRST_WIDTH;
    let mut rows: Vec<ReminderEntry> = Vec::new();
    let mut scanned = 0usize;
    while lo <= u64::from(u32::MAX) {
        let hi = (lo + width - 1).min(u64::from(u32::MAX));
        let (lo32, hi32) = (lo as u32, hi as u32);
        // `(begin, end]`: hash 0 only through the wrapping range `(MAX, hi]`.
        let begin = if lo32 == 0 { u32::MAX } else { lo32 - 1 };
        let mut piece = table.read_rows_in_range(begin, hi32).await?;
        scanned += piece.len();
        piece.retain(|r| r.actor_id.starts_with(prefix) && after.is_none_or(|t| t.admits(r)));
        piece.sort_by(|a, b| (a.hash, &a.actor_id, &a.name).cmp(&(b.hash, &b.actor_id, &b.name)));
        let room = size - rows.len();
        if piece.len() > room {
            piece.truncate(room);
            rows.extend(piece);
            let next = rows.last().map(|r| PageToken {
                hash: r.hash,
                after: Some((r.actor_id.clone(), r.name.clone())),
            });
            return Ok(ReminderPage { rows, next });
        }
        rows.extend(piece);
        lo = hi + 1;
        if rows.len() == size || scanned >= PAGE_SCAN_ROWS {
            break;
        }
        // Aim the next piece at about `size` rows of the table, read so far.
        let read = (scanned as u64).max(1);
        let done = (lo - after.map_or(0, |t| u64::from(t.hash))).max(1);
        width = (done.saturating_mul(size as u64) / read).clamp(1 << 12, 1 << 32);
    }
    // Every hash below `lo` was read: the next page starts at `lo`.
    let next = u32::try_from(lo).ok().map(|hash| PageToken { hash, after: None });
    Ok(ReminderPage { rows, next })
}

/// What [`remove_prefix`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Rows removed.
    pub removed: u64,
    /// Rows listed but not removed: re-registered (a new etag) or removed by
    /// someone else between the page read and the remove. A re-registered row
    /// stays, as [`ReminderTable::remove_row`] keeps a newer registration.
    pub changed: u64,
    /// Pages read.
    pub pages: u64,
}

/// Removes every row of `table` whose actor id starts with `prefix`, page by
/// page ([`read_page`], `page_size` rows), each row with its own conditional
/// [`ReminderTable::remove_row`] on the etag its page read (then its run
/// history, [`ReminderTable::remove_runs`]), at most
/// `concurrency` (1..) at a time; each store call bounded by `call_timeout`.
/// No transaction spans more than one row, so a delete of any size holds no
/// large lock and a crash leaves only rows that a second run removes: it is
/// safe to run again, and it removes nothing it did not list. `on_removed`
/// sees every removed row (to tell its shard's holder, say).
///
/// # Errors
/// [`Error::InvalidInput`] (`page size`); the first failed or timed-out store
/// call ([`Error::Backend`], transient), after which the rows removed so far
/// stay removed (a timed-out remove may have been applied: a second run reads
/// the table again and so learns it).
#[cfg(feature = "runtime")]
pub async fn remove_prefix(
    table: &dyn ReminderTable,
    prefix: &str,
    page_size: usize,
    concurrency: usize,
    call_timeout: std::time::Duration,
    on_removed: &mut (dyn FnMut(&ReminderEntry) + Send),
) -> Result<Removed> {
    use futures_util::StreamExt as _;
    let timed_out = |what: &'static str| {
        move |t: std::time::Duration| Error::backend(format!("{what}: no answer within {t:?}"))
    };
    let mut done = Removed::default();
    let mut after: Option<PageToken> = None;
    loop {
        let page = crate::bounded(
            call_timeout.saturating_mul(4),
            table.read_page(prefix, after.as_ref(), page_size),
            timed_out("reading a page"),
        )
        .await?;
        done.pages += 1;
        let mut results = futures_util::stream::iter(page.rows.iter())
            .map(|row| async move {
                let removed = crate::bounded(
                    call_timeout,
                    table.remove_row(&row.actor_id, &row.name, &row.etag, None),
                    timed_out("removing a row"),
                )
                .await;
                // Its run history goes with it (a re-run removes it again).
                let removed = match removed {
                    Ok(true) => crate::bounded(
                        call_timeout,
                        table.remove_runs(&row.actor_id, &row.name),
                        timed_out("removing a run history"),
                    )
                    .await
                    .map(|()| true),
                    other => other,
                };
                (row, removed)
            })
            .buffer_unordered(concurrency.max(1));
        let mut failed = None;
        while let Some((row, removed)) = results.next().await {
            match removed {
                Ok(true) => {
                    done.removed += 1;
                    on_removed(row);
                }
                Ok(false) => done.changed += 1,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(done),
        }
    }
}

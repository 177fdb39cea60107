//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, named after
//! Prometheus' conventions (base units, `_total` counters). rollcall records them
//! whether or not an exporter is installed (without one, recording costs a few
//! atomic loads); install any `metrics` recorder to collect them, e.g. the
//! `prometheus` feature of the `rollcall` crate (`rollcall::prometheus::serve`).
//!
//! Every series carries the labels `cluster` and `silo` (`ip:port@generation`), so
//! several silos in one process stay apart.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | [`TABLE_VERSION`] | gauge | | the table version of the silo's view |
//! | [`SILOS`] | gauge | `status` | silos of each status in the silo's view (every status, 0 included) |
//! | [`PROBE_RTT`] | histogram | | round trip of answered direct probes, seconds |
//! | [`PROBES`] | counter | `outcome` (`answered`, `failed`) | direct probes sent |
//! | [`SUSPICIONS`] | counter | | votes this silo wrote into another silo's row (a suspicion or a declaration) |
//! | [`TABLE_OPERATIONS`] | counter | `op`, `outcome` (`ok`, `conflict`, `error`) | membership table calls; `conflict` is a conditional write that lost |
//! | [`TABLE_OPERATION_SECONDS`] | histogram | `op` | their duration, seconds (bounded by `table_operation_timeout`) |
//! | [`CLOCK_OFFSET`] | gauge | | how far this silo's clock is ahead of the median of its peers' (negative: behind), seconds |
//! | [`CLOCK_WITHIN_BOUND`] | gauge | | 1 while that is within half of `max_clock_offset`, else 0 |
//!
//! Actor state (labels `service`, the state table's service id) adds:
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | [`STATE_WRITES`] | counter | `outcome` (`ok`, `conflict`, `error`) | `PersistentState` writes and clears |
//! | [`STATE_WRITTEN_BYTES`] | counter | | bytes of states written |
//! | [`STATE_CORRUPT_RECORDS`] | counter | | loads that found a record that does not check out |
//! | [`STATE_SWEPT`] | counter | `what` (`orphan_generation`, `expired`, `tombstone`) | what the state sweep deleted |
//!
//! The etcd provider adds `rollcall_store_calls_total` (labels `provider` and
//! `outcome`: `resent`, `goaway`, `own_goaway`, `connection_lost`,
//! `left_running`, `cancelled`; no `cluster` or `silo`: one store client
//! serves every silo of a process), the same figures as
//! [`SystemStore::connection`](crate::SystemStore::connection).
//!
//! The reminder service adds `rollcall_reminder_ticks_total`,
//! `rollcall_reminder_tick_lateness_seconds` and `rollcall_reminders_owned` (see
//! `rollcall_reminders`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{MembershipRows, MembershipSnapshot, RowChange, SiloAddress, SiloStatus};

/// Gauge: the table version of the silo's view.
pub const TABLE_VERSION: &str = "rollcall_membership_table_version";
/// Gauge by `status`: silos of each status in the silo's view.
pub const SILOS: &str = "rollcall_silos";
/// Histogram: round trip of answered direct probes, in seconds.
pub const PROBE_RTT: &str = "rollcall_probe_rtt_seconds";
/// Counter by `outcome`: direct probes sent.
pub const PROBES: &str = "rollcall_probes_total";
/// Counter: votes written into other silos' rows.
pub const SUSPICIONS: &str = "rollcall_suspicions_total";
/// Counter by `op` and `outcome`: membership table calls.
pub const TABLE_OPERATIONS: &str = "rollcall_table_operations_total";
/// Histogram by `op`: membership table call durations, in seconds.
pub const TABLE_OPERATION_SECONDS: &str = "rollcall_table_operation_seconds";

/// Gauge: this silo's clock ahead of the median of its peers', in seconds.
pub const CLOCK_OFFSET: &str = "rollcall_clock_offset_seconds";
/// Gauge: 1 while the clock offset is within the bound, else 0.
pub const CLOCK_WITHIN_BOUND: &str = "rollcall_clock_within_bound";

/// Counter by `outcome`: `PersistentState` writes and clears.
pub const STATE_WRITES: &str = "rollcall_state_writes_total";
/// Counter: bytes of states written.
pub const STATE_WRITTEN_BYTES: &str = "rollcall_state_written_bytes_total";
/// Counter: loads that found a corrupt record.
pub const STATE_CORRUPT_RECORDS: &str = "rollcall_state_corrupt_records_total";
/// Counter by `what`: what the state sweep deleted.
pub const STATE_SWEPT: &str = "rollcall_state_swept_total";

/// A state write or clear of `service` ended with `outcome` (`ok`,
/// `conflict`, `error`), `bytes` written when ok.
pub fn state_write(service: &str, outcome: &'static str, bytes: usize) {
    metrics::counter!(STATE_WRITES, "service" => service.to_owned(), "outcome" => outcome).increment(1);
    if outcome == "ok" && bytes > 0 {
        metrics::counter!(STATE_WRITTEN_BYTES, "service" => service.to_owned()).increment(bytes as u64);
    }
}

/// A load of a state of `service` found a corrupt record.
pub fn state_corrupt(service: &str) {
    metrics::counter!(STATE_CORRUPT_RECORDS, "service" => service.to_owned()).increment(1);
}

/// The state sweep of `service` deleted one `what` (a [`crate::state::sweep::Swept`] label).
pub fn state_swept(service: &str, what: &'static str) {
    metrics::counter!(STATE_SWEPT, "service" => service.to_owned(), "what" => what).increment(1);
}

/// The labels of one silo's series.
#[derive(Clone, Debug)]
pub struct SiloLabels {
    cluster: Arc<str>,
    silo: Arc<str>,
    /// The status counts of the last view (shared by the clones).
    counts: Arc<Mutex<StatusCounts>>,
}

/// Silos of each status in a view, kept up to date from the rows that changed
/// since the previous view ([`MembershipRows::changes`] skips the subtrees both views
/// share): a view that changed k of N rows costs O(k log N), not a scan of the
/// table, which in a join storm every silo would pay for every read.
#[derive(Debug, Default)]
struct StatusCounts {
    seen: Option<MembershipRows>,
    /// Indexed like [`SiloStatus::ALL`].
    counts: [i64; SiloStatus::ALL.len()],
}

fn status_index(status: SiloStatus) -> usize {
    SiloStatus::ALL
        .iter()
        .position(|s| *s == status)
        .unwrap_or_default()
}

impl StatusCounts {
    fn update(&mut self, rows: &MembershipRows) -> [i64; SiloStatus::ALL.len()] {
        match &self.seen {
            Some(seen) if seen.shares_all(rows) => {}
            Some(seen) => {
                for change in seen.changes(rows) {
                    match change {
                        RowChange::Added(row) => self.counts[status_index(row.entry.status)] += 1,
                        RowChange::Removed(row) => self.counts[status_index(row.entry.status)] -= 1,
                        RowChange::Updated { old, new } => {
                            self.counts[status_index(old.entry.status)] -= 1;
                            self.counts[status_index(new.entry.status)] += 1;
                        }
                    }
                }
            }
            None => {
                self.counts = Default::default();
                for row in rows.iter() {
                    self.counts[status_index(row.entry.status)] += 1;
                }
            }
        }
        self.seen = Some(rows.clone());
        self.counts
    }
}

impl SiloLabels {
    /// The labels of `silo` in `cluster`.
    pub fn new(cluster: &str, silo: &SiloAddress) -> Self {
        SiloLabels {
            cluster: cluster.into(),
            silo: silo.to_string().into(),
            counts: Arc::default(),
        }
    }

    /// The `cluster` and `silo` label values.
    fn base(&self) -> (String, String) {
        (self.cluster.to_string(), self.silo.to_string())
    }

    /// A table call `op` ended with `outcome` (`ok`, `conflict`, `error`) after
    /// `elapsed`.
    pub fn table_operation(&self, op: &'static str, outcome: &'static str, elapsed: Duration) {
        let (c, s) = self.base();
        metrics::counter!(TABLE_OPERATIONS, "cluster" => c.clone(), "silo" => s.clone(), "op" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!(TABLE_OPERATION_SECONDS, "cluster" => c, "silo" => s, "op" => op)
            .record(elapsed.as_secs_f64());
    }

    /// A direct probe was answered after `rtt` (`Some`) or failed (`None`).
    pub fn probe(&self, rtt: Option<Duration>) {
        let (c, s) = self.base();
        let outcome = if rtt.is_some() { "answered" } else { "failed" };
        metrics::counter!(PROBES, "cluster" => c.clone(), "silo" => s.clone(), "outcome" => outcome)
            .increment(1);
        if let Some(rtt) = rtt {
            metrics::histogram!(PROBE_RTT, "cluster" => c, "silo" => s).record(rtt.as_secs_f64());
        }
    }

    /// The clock offset is now `report` (see [`crate::protocol::clock`]).
    pub fn clock(&self, report: &crate::protocol::ClockReport) {
        let (c, s) = self.base();
        if let Some(ms) = report.offset_ms {
            metrics::gauge!(CLOCK_OFFSET, "cluster" => c.clone(), "silo" => s.clone())
                .set(ms as f64 / 1000.0);
        }
        metrics::gauge!(CLOCK_WITHIN_BOUND, "cluster" => c, "silo" => s).set(if report.within_bound {
            1.0
        } else {
            0.0
        });
    }

    /// The silo wrote a vote into another silo's row.
    pub fn suspicion(&self) {
        let (c, s) = self.base();
        metrics::counter!(SUSPICIONS, "cluster" => c, "silo" => s).increment(1);
    }

    /// The silo's view is now `snapshot`.
    pub fn view(&self, snapshot: &MembershipSnapshot) {
        let (c, s) = self.base();
        metrics::gauge!(TABLE_VERSION, "cluster" => c.clone(), "silo" => s.clone())
            .set(snapshot.version.version as f64);
        let counts = match self.counts.lock() {
            Ok(mut counts) => counts.update(&snapshot.entries),
            Err(poisoned) => poisoned.into_inner().update(&snapshot.entries),
        };
        for (status, n) in SiloStatus::ALL.into_iter().zip(counts) {
            metrics::gauge!(SILOS, "cluster" => c.clone(), "silo" => s.clone(), "status" => status.as_str())
                .set(n as f64);
        }
    }
}

/// The outcome label of a table call's result: a conditional write that returned
/// `false` is a `conflict`.
pub(crate) trait Outcome {
    fn outcome(&self) -> &'static str {
        "ok"
    }
}

impl Outcome for bool {
    fn outcome(&self) -> &'static str {
        if *self {
            "ok"
        } else {
            "conflict"
        }
    }
}

impl Outcome for () {}
impl Outcome for usize {}
impl Outcome for MembershipSnapshot {}
impl Outcome for crate::MembershipDelta {}

/// The outcome label of `result`.
pub(crate) fn outcome<T: Outcome>(result: &crate::Result<T>) -> &'static str {
    match result {
        Ok(v) => v.outcome(),
        Err(_) => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Etag, MembershipEntry, Timestamp};

    fn brute_force(snapshot: &MembershipSnapshot) -> [i64; SiloStatus::ALL.len()] {
        SiloStatus::ALL.map(|status| snapshot.rows().filter(|e| e.status == status).count() as i64)
    }

    /// The counts kept from diffs equal a count of every row, through inserts,
    /// status changes, removals and a view that shares nothing with the last.
    #[test]
    fn status_counts_follow_the_views() {
        let mut counts = StatusCounts::default();
        let mut snapshot = MembershipSnapshot::default();
        let silo = |i: u32| -> SiloAddress { format!("10.0.0.{}:11111@1", i + 1).parse().unwrap() };
        let mut state = 12345u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for step in 0..500 {
            let s = silo(next() % 40);
            match next() % 4 {
                0 => {
                    snapshot.entries.remove(&s);
                }
                _ => {
                    let status = SiloStatus::ALL[(next() % 6) as usize];
                    let entry = MembershipEntry::new(s, status, Timestamp::from_millis(1));
                    snapshot.insert(entry, Etag::new("e"));
                }
            }
            if step % 97 == 0 {
                // A view rebuilt from scratch (as after a full read).
                snapshot.entries = snapshot.entries.iter().map(|v| Arc::new((**v).clone())).collect();
            }
            assert_eq!(
                counts.update(&snapshot.entries),
                brute_force(&snapshot),
                "step {step}"
            );
        }
    }
}

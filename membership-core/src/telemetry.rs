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
//!
//! The reminder service adds `rollcall_reminder_ticks_total`,
//! `rollcall_reminder_tick_lateness_seconds` and `rollcall_reminders_owned` (see
//! `rollcall_reminders`).

use std::sync::Arc;
use std::time::Duration;

use crate::{MembershipSnapshot, SiloAddress, SiloStatus};

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

/// The labels of one silo's series.
#[derive(Clone, Debug)]
pub struct SiloLabels {
    cluster: Arc<str>,
    silo: Arc<str>,
}

impl SiloLabels {
    /// The labels of `silo` in `cluster`.
    pub fn new(cluster: &str, silo: &SiloAddress) -> Self {
        SiloLabels {
            cluster: cluster.into(),
            silo: silo.to_string().into(),
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
        for status in SiloStatus::ALL {
            let n = snapshot.rows().filter(|e| e.status == status).count();
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

//! The silo and client metrics tables (the Orleans runtime tables `OrleansSiloMetrics`
//! and `OrleansClientMetrics`, after `SiloMetricsData`, adapted to rollcall): one row
//! per process of a cluster, replaced in place every publish period, so that an
//! operator can read every silo's load and membership work in one read.
//!
//! [`MembershipCounters`] are what a running silo has counted itself (table
//! operations, suspicions, votes, probe round trips); the publisher in the `rollcall`
//! crate adds CPU, memory and reminder figures and writes a [`MetricsRow`].

#[cfg(feature = "runtime")]
use std::collections::VecDeque;
#[cfg(feature = "runtime")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "runtime")]
use std::sync::Mutex;
#[cfg(feature = "runtime")]
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Result, Timestamp};

/// Which kind of process a metrics row describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsRole {
    /// A silo (a member of the membership table).
    Silo,
    /// A client: a process that reads the membership (e.g. to find gateways)
    /// without being a silo.
    Client,
}

impl MetricsRole {
    /// `"silo"` or `"client"`: the role's part of storage keys.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsRole::Silo => "silo",
            MetricsRole::Client => "client",
        }
    }
}

/// One row of the metrics table: a silo's or a client's figures at `time`.
///
/// Counters (`*_total` in meaning) count from the process start; rates are the
/// reader's business (two rows a period apart). Fields a client does not have stay 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// Silo or client.
    pub role: MetricsRole,
    /// The row key within the role: a silo's address (`ip:port@generation`), a
    /// client's id. Non-empty, at most 256 bytes.
    pub id: String,
    /// The endpoint the process is reachable at (`ip:port`), empty if none.
    #[serde(default)]
    pub address: String,
    /// Silo or client name given by the host.
    #[serde(default)]
    pub name: String,
    /// Host name of the machine.
    #[serde(default)]
    pub host_name: String,
    /// When the row was published (ms since the Unix epoch).
    pub time: Timestamp,
    /// Process CPU use over the last publish period, in % of one core (may exceed
    /// 100 on several cores).
    #[serde(default)]
    pub cpu_percent: f32,
    /// Resident memory of the process, in bytes.
    #[serde(default)]
    pub memory_bytes: u64,
    /// Median probe round trip over the recent window, in ms (0 without samples).
    #[serde(default)]
    pub probe_rtt_p50_ms: f64,
    /// 99th-percentile probe round trip over the recent window, in ms.
    #[serde(default)]
    pub probe_rtt_p99_ms: f64,
    /// Times this silo started suspecting a peer (a vote job).
    #[serde(default)]
    pub suspicions_sent: u64,
    /// Votes this silo wrote into the table (declarations included).
    #[serde(default)]
    pub votes_written: u64,
    /// Membership table reads (full and delta).
    #[serde(default)]
    pub table_reads: u64,
    /// Committed membership table writes.
    #[serde(default)]
    pub table_writes: u64,
    /// Membership table writes that lost their precondition.
    #[serde(default)]
    pub table_conflicts: u64,
    /// Reminders this silo owns now.
    #[serde(default)]
    pub reminders_owned: u64,
    /// Reminder ticks delivered.
    #[serde(default)]
    pub ticks_delivered: u64,
    /// Reminder ticks delivered later than the service's lateness threshold.
    #[serde(default)]
    pub ticks_late: u64,
    /// Median lateness of the reminder ticks delivered since the previous
    /// row, ms; `None` when none was delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_lateness_p50_ms: Option<f64>,
    /// 99th percentile of the same, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_lateness_p99_ms: Option<f64>,
    /// Messages waiting in the silo's actor mailboxes, where measurable.
    #[serde(default)]
    pub mailbox_backlog: Option<u64>,
    /// Whether the process is shedding load (its local health score is above 0).
    #[serde(default)]
    pub load_shedding: bool,
    /// How far the silo's wall clock is ahead of the median of its peers'
    /// (negative: behind), in ms, as it measured it from its probes; `None`
    /// before it measured any, and for clients.
    #[serde(default)]
    pub clock_offset_ms: Option<i64>,
    /// Whether that offset is within the cluster's bound (half of
    /// `max_clock_offset`); `None` for clients and older silos.
    #[serde(default)]
    pub clock_within_bound: Option<bool>,
    /// Gateways (silo addresses) a client is connected to; empty for silos.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// What the process's store client saw of its connections, for a provider
    /// that keeps such figures ([`SystemStore::connection`](crate::SystemStore::connection));
    /// `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_connection: Option<crate::StoreConnection>,
}

impl MetricsRow {
    /// A row of `role` and `id` at `time` with every figure 0.
    pub fn new(role: MetricsRole, id: impl Into<String>, time: Timestamp) -> Self {
        MetricsRow {
            role,
            id: id.into(),
            address: String::new(),
            name: String::new(),
            host_name: String::new(),
            time,
            cpu_percent: 0.0,
            memory_bytes: 0,
            probe_rtt_p50_ms: 0.0,
            probe_rtt_p99_ms: 0.0,
            suspicions_sent: 0,
            votes_written: 0,
            table_reads: 0,
            table_writes: 0,
            table_conflicts: 0,
            reminders_owned: 0,
            ticks_delivered: 0,
            ticks_late: 0,
            tick_lateness_p50_ms: None,
            tick_lateness_p99_ms: None,
            mailbox_backlog: None,
            load_shedding: false,
            clock_offset_ms: None,
            clock_within_bound: None,
            gateways: Vec::new(),
            store_connection: None,
        }
    }

    /// Checks the key: a non-empty id of at most 256 bytes
    /// ([`KeyLimits::label`](crate::KeyLimits::label)) without control characters.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) naming `metrics.id`.
    pub fn validate(&self) -> Result<()> {
        crate::KeyLimits::CORE.check_label("metrics.id", &self.id)
    }
}

/// A read of a cluster's metrics table: the rows that decode, ordered by (role, id),
/// and the stored rows that do not (key and reason), which never fail the read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsReport {
    /// Decoded rows, silos first, each role ordered by id.
    pub rows: Vec<MetricsRow>,
    /// Rows that did not decode.
    pub corrupt: Vec<crate::CorruptRow>,
}

impl MetricsReport {
    /// Sorts the rows by (role, id) and the corrupt rows by key: the order every
    /// provider returns.
    pub fn sorted(mut self) -> Self {
        self.rows.sort_by(|a, b| (a.role, &a.id).cmp(&(b.role, &b.id)));
        self.corrupt.sort();
        self
    }
}

/// The metrics table of **one cluster** (Orleans' silo- and client-metrics tables).
///
/// # Contract
/// - Key = (role, id); [`upsert`](Self::upsert) replaces the row in place (last
///   writer wins; rows are owned by the process they describe).
/// - [`read_all`](Self::read_all) returns every row of the cluster; a stored row
///   that does not decode is listed in [`MetricsReport::corrupt`] and never fails
///   the read.
/// - Tables of different clusters never see each other's rows, and the metrics
///   never touch the membership rows, version or history.
#[async_trait]
pub trait MetricsTable: Send + Sync + std::fmt::Debug {
    /// The cluster this table belongs to.
    fn cluster_id(&self) -> &str;

    /// Prepares the backend (creates the table where the backend needs one and the
    /// store may create it). Idempotent; the default does nothing.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the backend is unreachable.
    async fn init(&self) -> Result<()> {
        Ok(())
    }

    /// Writes `row`, replacing the row with the same (role, id).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an invalid id;
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails.
    async fn upsert(&self, row: &MetricsRow) -> Result<()>;

    /// Every row of the cluster.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails.
    async fn read_all(&self) -> Result<MetricsReport>;

    /// Deletes the row (role, id); `Ok(false)` if there was none.
    async fn remove(&self, role: MetricsRole, id: &str) -> Result<bool>;

    /// Deletes every metrics row of this cluster.
    async fn clear(&self) -> Result<()>;
}

/// Probe round trips kept for the percentiles of [`MembershipCounters`].
pub const RTT_WINDOW: usize = 1024;

/// What a silo counts about its own membership work, shared between its agent
/// (which counts) and its handle (which reads). Cheap: atomics and one small lock
/// per probe answer.
#[cfg(feature = "runtime")]
#[derive(Debug, Default)]
pub struct CounterCells {
    pub(crate) table_reads: AtomicU64,
    pub(crate) table_writes: AtomicU64,
    pub(crate) table_conflicts: AtomicU64,
    pub(crate) suspicions_sent: AtomicU64,
    pub(crate) votes_written: AtomicU64,
    pub(crate) probes_answered: AtomicU64,
    pub(crate) probes_failed: AtomicU64,
    rtt_us: Mutex<VecDeque<u32>>,
}

#[cfg(feature = "runtime")]
impl CounterCells {
    pub(crate) fn add(cell: &AtomicU64, n: u64) {
        cell.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn record_rtt(&self, rtt: Duration) {
        let us = u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX);
        let mut window = self.rtt_us.lock().unwrap_or_else(|p| p.into_inner());
        if window.len() == RTT_WINDOW {
            window.pop_front();
        }
        window.push_back(us);
    }

    /// The counters now.
    pub fn read(&self) -> MembershipCounters {
        let mut rtts: Vec<u32> = self
            .rtt_us
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        rtts.sort_unstable();
        let pct = |q: f64| -> f64 {
            if rtts.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest sample with at least q of them at or below it.
            let rank = ((q * rtts.len() as f64).ceil() as usize).clamp(1, rtts.len());
            f64::from(rtts[rank - 1]) / 1000.0
        };
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MembershipCounters {
            table_reads: get(&self.table_reads),
            table_writes: get(&self.table_writes),
            table_conflicts: get(&self.table_conflicts),
            suspicions_sent: get(&self.suspicions_sent),
            votes_written: get(&self.votes_written),
            probes_answered: get(&self.probes_answered),
            probes_failed: get(&self.probes_failed),
            probe_rtt_p50_ms: pct(0.50),
            probe_rtt_p99_ms: pct(0.99),
        }
    }
}

/// A silo's membership counters since it started
/// ([`SiloHandle::counters`](crate::SiloHandle::counters)).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MembershipCounters {
    /// Membership table reads (full and delta) that answered.
    pub table_reads: u64,
    /// Committed row writes.
    pub table_writes: u64,
    /// Row writes that lost their precondition (`Ok(false)`).
    pub table_conflicts: u64,
    /// Times this silo started suspecting a peer.
    pub suspicions_sent: u64,
    /// Committed writes that added this silo's vote (declarations included).
    pub votes_written: u64,
    /// Direct probes answered.
    pub probes_answered: u64,
    /// Direct probes unanswered or refused.
    pub probes_failed: u64,
    /// Median probe round trip over the last [`RTT_WINDOW`] answers, in ms.
    pub probe_rtt_p50_ms: f64,
    /// 99th-percentile probe round trip over the same window, in ms.
    pub probe_rtt_p99_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank_over_a_bounded_window() {
        let c = CounterCells::default();
        assert_eq!(c.read().probe_rtt_p50_ms, 0.0);
        for ms in 1..=100u64 {
            c.record_rtt(Duration::from_millis(ms));
        }
        let r = c.read();
        assert_eq!((r.probe_rtt_p50_ms, r.probe_rtt_p99_ms), (50.0, 99.0));
        for _ in 0..RTT_WINDOW {
            c.record_rtt(Duration::from_micros(250));
        }
        let r = c.read();
        assert_eq!(
            (r.probe_rtt_p50_ms, r.probe_rtt_p99_ms),
            (0.25, 0.25),
            "old samples left the window"
        );
    }
}

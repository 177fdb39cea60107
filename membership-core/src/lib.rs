//! # rollcall-membership-core
//!
//! The data model, storage contracts and options shared by every part of rollcall:
//!
//! - **Model**: [`SiloAddress`] (`ip:port@generation`), [`SiloStatus`],
//!   [`MembershipEntry`] (the Orleans silo-instance columns), [`TableVersion`],
//!   [`Etag`], [`MembershipSnapshot`], [`ReminderEntry`] and its ring hash
//!   [`actor_hash`], wall-clock [`Timestamp`]s and the [`Clock`] abstraction.
//! - **Contracts**: [`MembershipTable`], [`ReminderTable`] and [`SystemStore`], which
//!   every provider implements and the shared conformance suite checks; the
//!   membership [`history`] ([`MembershipEvent`]) each write appends in its own
//!   transaction.
//! - **Options**: [`ClusterMembershipOptions`] and [`ReminderOptions`] with Orleans'
//!   defaults and `validate()`.
//!
//! Reference semantics: the Orleans cluster membership protocol ("Cluster Management
//! in Orleans") and the Orleans runtime tables.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
pub mod agents;
mod error;
pub mod history;
pub mod lease;
mod membership;
pub mod metrics_table;
mod options;
pub mod protocol;
mod reminder;
mod silo;
#[cfg(feature = "sim")]
pub mod sim;
pub mod state;
pub mod state_sweep;
pub mod statistics;
mod table;
#[cfg(feature = "runtime")]
pub mod telemetry;
mod time;
#[cfg(feature = "runtime")]
pub mod transport;

#[cfg(feature = "runtime")]
pub use agents::{
    LeaveHookGuard, LeaveWork, MembershipChanged, Notice, NoticeReceiver, NoticesDropped, OnDeclaredDead,
    Silo, SiloBuilder, SiloHandle, Subscription,
};
#[cfg(feature = "runtime")]
pub use error::{bounded, retry_transient};
pub use error::{redact_password, BoxError, Error, Result, SiloError, TransportError};
pub use history::{HistoryQuery, MembershipEvent, WriteKind, WriteOrigin, DEFAULT_HISTORY_CAPACITY};
pub use lease::{LeaseStatus, LeaseTable, ShardLease, ShardLeases};
pub use membership::{
    CorruptRow, Etag, IntoRows, MembershipDelta, MembershipEntry, MembershipRow, MembershipRows,
    MembershipSnapshot, RowChange, SuspectVote, TableVersion,
};
pub use metrics_table::{MembershipCounters, MetricsReport, MetricsRole, MetricsRow, MetricsTable};
pub use options::{ClusterMembershipOptions, MissedTickPolicy, ReminderOptions};
pub use reminder::{
    actor_hash, actor_shard, hash_in_range, hash_shard, parked_service_id, ReminderEntry, RetryPolicy,
    DEFAULT_SHARDS, MAX_REMINDER_PAYLOAD,
};
pub use silo::{SiloAddress, SiloStatus};
pub use state::{ClearMode, Codec, Expected, StateKey, StateRead, StateStorage, StateTable};
pub use statistics::{AggLevel, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore};
pub use table::{validate_id, MembershipTable, ProtocolMode, ReminderTable, SystemStore, WriteMode};
#[cfg(feature = "runtime")]
pub use time::TokioClock;
pub use time::{duration_millis, Clock, ManualClock, SystemClock, Timestamp};

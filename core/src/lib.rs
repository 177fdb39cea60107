//! # rollcall-core
//!
//! The data model, the storage contracts, the options and the sans-io protocol
//! shared by every part of rollcall. Every contract below is a trait a provider
//! implements once; the shared conformance suite (`rollcall-tests`) checks each
//! against a real server.
//!
//! | contract | trait | module |
//! |---|---|---|
//! | membership table (silo rows, version row, etags) | [`MembershipTable`] | `table.rs`, `membership.rs` |
//! | membership history (one event per write, same transaction) | [`MembershipTable::read_history`] | [`history`] |
//! | reminder table | [`ReminderTable`] | `table.rs`, `reminder.rs` |
//! | reminder shard leases (fenced owners of reminder shards) | [`LeaseTable`] | [`lease`] |
//! | actor state (Orleans' grain-state table) | [`StateTable`] | [`state`] |
//! | silo and client metrics tables | [`MetricsTable`] | [`metrics_table`] |
//! | statistics (points, rollups, retention) | [`StatisticsStore`] | [`statistics`] |
//! | a store holding all of them | [`SystemStore`] | `table.rs` |
//!
//! And beside the contracts:
//! - **Model**: [`SiloAddress`] (`ip:port@generation`), [`SiloStatus`],
//!   [`MembershipEntry`] (the Orleans silo-instance columns), [`TableVersion`],
//!   [`Etag`], [`MembershipSnapshot`], [`ReminderEntry`] and its shard
//!   [`actor_shard`], wall-clock [`Timestamp`]s and the [`Clock`] abstraction.
//! - **The protocol** ([`protocol`]): one silo's membership rules as a sans-io
//!   state machine, [`protocol::SiloMachine`] (events and the time in, actions out).
//! - **Options**: [`ClusterMembershipOptions`] and [`ReminderOptions`] with Orleans'
//!   defaults and `validate()`.
//! - With the default `runtime` feature: the actix agents that carry the
//!   protocol out (`Silo`), the probe transport, telemetry and `TokioClock`.
//!   Without it the crate builds with no async runtime, no actix and no sockets.
//!
//! Reference semantics: the Orleans cluster membership protocol ("Cluster Management
//! in Orleans") and the Orleans runtime tables.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
pub mod agents;
mod error;
pub mod history;
#[cfg(feature = "io")]
pub mod io;
pub mod key_escape;
pub use ownership::lease;
mod limits;
mod membership;
pub mod metrics_table;
mod options;
pub mod ownership;
pub mod paging;
pub mod protocol;
mod reminder;
mod silo;
#[cfg(feature = "sim")]
pub mod sim;
pub mod state;
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
    Silo, SiloBuilder, SiloClaim, SiloHandle, Subscription,
};
#[cfg(feature = "runtime")]
pub use error::{bounded, retry_transient};
pub use error::{redact_password, BoxError, Error, Result, SiloError, TransportError};
pub use history::{HistoryQuery, MembershipEvent, WriteKind, WriteOrigin, DEFAULT_HISTORY_CAPACITY};
pub use limits::KeyLimits;
pub use membership::{
    CorruptRow, Etag, IntoRows, MembershipDelta, MembershipEntry, MembershipRow, MembershipRows,
    MembershipSnapshot, RowChange, SuspectVote, TableVersion,
};
pub use metrics_table::{MembershipCounters, MetricsReport, MetricsRole, MetricsRow, MetricsTable};
pub use options::{ClusterMembershipOptions, MissedTickPolicy, ReminderOptions};
pub use ownership::{actor_hash, actor_shard, hash_shard, ActorId, DEFAULT_SHARDS};
pub use ownership::{Fence, LeaseStatus, LeaseTable, ShardLease, ShardLeases};
pub use paging::{PageToken, ReminderPage, Removed};
pub use reminder::{
    check_run_keep, hash_in_range, parked_service_id, prepend_run, ReminderEntry, RetryPolicy, RunOutcome,
    RunRecord, MAX_REMINDER_PAYLOAD, MAX_RUN_HISTORY,
};
pub use silo::{SiloAddress, SiloStatus};
pub use state::{ClearMode, Codec, Expected, StateKey, StateRead, StateStorage, StateTable};
pub use statistics::{AggLevel, StatFilter, StatPoint, StatRecord, StatisticsOptions, StatisticsStore};
pub use table::{
    validate_id, MembershipTable, ProtocolMode, ReminderTable, StoreConnection, SystemStore, WriteMode,
};
#[cfg(feature = "runtime")]
pub use time::TokioClock;
pub use time::{boot_time, duration_millis, Clock, ManualClock, SystemClock, Timestamp};

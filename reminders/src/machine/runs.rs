//! The run history the machine records ([`RunRecord`]): one record per
//! occurrence of a scheduled (periodic or calendar) reminder, or per trigger,
//! appended to the table in the background. Best effort and bounded: at most
//! [`RUN_QUEUE`] records wait (beyond, the oldest waiting is dropped) and
//! [`MAX_RUN_WRITES`] appends run; a failed append is dropped, not retried
//! (the table's append is idempotent, but a history is not worth a queue
//! that grows during an outage). Both are counted in `runs_dropped`.

use std::collections::VecDeque;

use rollcall_core::{RunOutcome, RunRecord, Timestamp};
use smol_str::SmolStr;

use super::{Action, ReminderMachine};
use crate::api::Counters;
use crate::queue::Key;

/// Records waiting for an append, at most: 4,096.
pub const RUN_QUEUE: usize = 4096;
/// Appends in flight, at most: 16.
pub const MAX_RUN_WRITES: usize = 16;

/// One record to append to the history of `(actor, name)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunWrite {
    /// The actor id (`kind/key`).
    pub actor: SmolStr,
    /// The reminder's name (the triggered one's, for a trigger).
    pub name: SmolStr,
    /// The record.
    pub record: RunRecord,
    /// The fence of the reminder's shard as this silo holds it when the
    /// append is sent: the store refuses the append once another silo
    /// acquired the shard.
    pub fence: Option<rollcall_core::Fence>,
}

/// The records waiting and the appends running.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    waiting: VecDeque<RunWrite>,
    in_flight: usize,
}

impl ReminderMachine {
    /// Records what became of occurrence `scheduled` of the slot `key`, if
    /// its reminder keeps a history (a scheduled one, or a trigger) and the
    /// options keep one (`run_history` above 0).
    pub(super) fn record_run(&mut self, key: &Key, scheduled: Timestamp, attempts: u32, outcome: RunOutcome) {
        if self.options.run_history == 0 {
            return;
        }
        let Some(slot) = self.queue.get(key) else {
            return;
        };
        let triggered = slot.tick_name() != key.name();
        if !triggered && slot.period_ms == 0 && slot.timing().calendar.is_none() {
            return; // a one-shot: its row goes once delivered, and so would its history
        }
        let write = RunWrite {
            actor: SmolStr::new(key.actor()),
            name: SmolStr::new(slot.tick_name()),
            record: RunRecord {
                scheduled,
                at: self.now,
                attempts,
                outcome,
                silo: self.me.to_string(),
                triggered,
            },
            fence: None,
        };
        if self.runs.waiting.len() >= RUN_QUEUE {
            self.runs.waiting.pop_front();
            Counters::bump(&self.counters.runs_dropped);
        }
        self.runs.waiting.push_back(write);
        self.pump_runs();
    }

    /// Starts the appends there is room for.
    pub(super) fn pump_runs(&mut self) {
        while self.runs.in_flight < MAX_RUN_WRITES {
            let Some(mut write) = self.runs.waiting.pop_front() else {
                return;
            };
            // A shard no longer held here: its new holder keeps the history.
            let Some(fence) = self.fence_of(&write.actor) else {
                Counters::bump(&self.counters.runs_dropped);
                continue;
            };
            write.fence = Some(fence);
            self.runs.in_flight += 1;
            self.out.push(Action::AppendRun(write));
        }
    }

    /// The end of an [`Action::AppendRun`].
    pub(super) fn run_appended(&mut self, ok: bool) {
        self.runs.in_flight = self.runs.in_flight.saturating_sub(1);
        if !ok {
            Counters::bump(&self.counters.runs_dropped);
        }
        self.pump_runs();
    }
}

//! Rule 10 of the shard leases, healing: a store that fails over may lose
//! its last writes (Redis' asynchronous replication), so a lease row may go
//! back to what it was. A held shard's row is read again (its head alone)
//! when the store answers after a failure, on a fenced write, and one held
//! shard a poll in turn; a lost acquire is written again, a row naming
//! another holder drops the shard, and a row naming this silo for a shard
//! it neither holds nor wants (a lost release, found by the silo waiting for
//! it) is released. The rules are in the parent module's docs.

use crate::lease::{LeaseStatus, ShardLease};
use crate::{Etag, SiloAddress, Timestamp};

use super::{after, ShardAction, ShardEvent, ShardMachine, Slot, WriteFailed};

/// After a failed store call, every held lease is read again once the
/// store answers (a failover may have lost the last writes), at most once
/// every this many lease polls (rule 10): 10, so 10 s with the default
/// `lease_poll`. Besides, one held lease is read every poll, in turn, and a
/// fenced write's at once.
pub const REVERIFY_POLLS: u32 = 10;

/// A silo waiting this many polls for a live holder that the ring does not
/// name tells it to read the row (rule 10): 3.
pub const HINT_AFTER_POLLS: u32 = 3;

/// What rule 10 keeps of one silo's store calls and held leases.
#[derive(Debug, Default)]
pub(super) struct Healing {
    /// When the next held shard's row is read again, and the last one read
    /// (they are read in turn).
    next: Option<Timestamp>,
    cursor: u32,
    /// Held shards to read again at once (a fenced write, the store back
    /// after a failure).
    now: std::collections::BTreeSet<u32>,
    /// A store call failed since every held lease was last read again, and
    /// when that was.
    store_failed: bool,
    reverified: Option<Timestamp>,
    /// Polls each shard has waited for a live holder the ring does not name.
    waits: std::collections::BTreeMap<u32, u32>,
}

impl Healing {
    /// The next verification's time, for the machine's timer.
    pub(super) fn next(&self) -> Option<Timestamp> {
        self.next
    }

    /// A shard is acquired: it no longer waits for a holder.
    pub(super) fn acquiring(&mut self, k: u32) {
        self.waits.remove(&k);
    }
}

impl ShardMachine {
    /// Notes whether `event` is a store call's answer, and which: once the
    /// store answers after a failure, every held lease is read again (at most
    /// every [`REVERIFY_POLLS`] polls). A refused write is no failure of the
    /// store.
    pub(super) fn note_store_answer(&mut self, now: Timestamp, event: &ShardEvent) {
        let answered = match event {
            ShardEvent::Read { result, .. } => result.is_ok(),
            ShardEvent::Written { result, .. } => !matches!(result, Err(WriteFailed::Unknown(_))),
            ShardEvent::SelfRead { result, .. } => result.is_ok(),
            ShardEvent::SiloRead { result, .. } => result.is_ok(),
            _ => return,
        };
        let h = &mut self.healing;
        if !answered {
            h.store_failed = true;
            return;
        }
        let pause = self.options.poll * REVERIFY_POLLS;
        if h.store_failed && h.reverified.is_none_or(|t| now >= after(t, pause)) {
            h.store_failed = false;
            h.reverified = Some(now);
            let held = self
                .slots
                .iter()
                .filter(|(_, s)| matches!(s, Slot::Owned { .. }))
                .map(|(k, _)| *k);
            h.now.extend(held);
        }
    }

    /// A shard starts being held at `now`: verifications start if none runs.
    pub(super) fn start_verifying(&mut self, now: Timestamp) {
        if self.healing.next.is_none() {
            self.healing.next = Some(after(now, self.options.poll));
        }
    }

    /// A write under `shard` at `epoch` was refused as fenced: its row is
    /// read again at once if this silo holds it at that epoch.
    pub(super) fn fenced(&mut self, shard: u32, epoch: u64) {
        if matches!(self.slots.get(&shard), Some(Slot::Owned { lease } | Slot::Checkpointing { lease, .. }) if lease.epoch == epoch)
        {
            self.healing.now.insert(shard);
        }
    }

    /// Another silo hinted at `shard`, which this silo neither holds nor
    /// wants: its release may have been lost. Reads the row.
    pub(super) fn hinted_orphan(&mut self, shard: u32, out: &mut Vec<ShardAction>) {
        self.slots.insert(shard, Slot::Orphan);
        out.push(ShardAction::Read(shard));
    }

    /// Shard `k` waited another poll for `holder`, live but not named by the
    /// ring: past [`HINT_AFTER_POLLS`] the holder is hinted (it may not know
    /// it is named: a lost release).
    pub(super) fn waited(&mut self, k: u32, holder: SiloAddress, out: &mut Vec<ShardAction>) {
        let waited = self.healing.waits.entry(k).or_default();
        *waited += 1;
        if *waited >= HINT_AFTER_POLLS {
            out.push(ShardAction::Hint { shard: k, to: holder });
        }
    }

    /// The verifications due at `now`: the shards to read at once, then the
    /// next held shard after the last one read, one a poll.
    pub(super) fn verify_due(&mut self, now: Timestamp, out: &mut Vec<ShardAction>) {
        for k in std::mem::take(&mut self.healing.now) {
            if matches!(self.slots.get(&k), Some(Slot::Checkpointing { .. })) {
                // Read once its checkpoint's answer is in.
                self.healing.now.insert(k);
            } else {
                self.verify(k, out);
            }
        }
        if self.healing.next.is_some_and(|t| t <= now) {
            // A shard whose checkpoint was just asked for is read next time
            // (rule 11's answer wants it held, not being read).
            let checkpoints = &self.checkpoints;
            let owned = |(k, s): (&u32, &Slot)| {
                (matches!(s, Slot::Owned { .. }) && !checkpoints.asked(*k, now)).then_some(*k)
            };
            let next = self
                .slots
                .range(self.healing.cursor.saturating_add(1)..)
                .find_map(owned)
                .or_else(|| self.slots.iter().find_map(owned));
            if let Some(k) = next {
                self.verify(k, out);
                self.healing.cursor = k;
            }
            let held = self.slots.values().any(|s| {
                matches!(
                    s,
                    Slot::Owned { .. } | Slot::Verifying { .. } | Slot::Reasserting { .. }
                )
            });
            self.healing.next = held.then(|| after(now, self.options.poll));
        }
        // Forget the waits of shards no longer waited for.
        let slots = &self.slots;
        self.healing
            .waits
            .retain(|k, _| matches!(slots.get(k), Some(Slot::Waiting { .. } | Slot::Reading)));
    }

    /// Reads held shard `k`'s row head again, if it is held and delivering.
    fn verify(&mut self, k: u32, out: &mut Vec<ShardAction>) {
        if let Some(Slot::Owned { lease }) = self.slots.get(&k).cloned() {
            self.slots.insert(k, Slot::Verifying { lease });
            out.push(ShardAction::ReadHead(k));
        }
    }

    /// The answer to a read of held shard `k` (held as `ours`), verified or
    /// reasserted: held at its epoch; a lost acquire (the row at a lower
    /// epoch, whoever it names: every acquire raises the epoch, so nothing
    /// lower is newer) written again, delivering nothing until it lands; any
    /// other row, another holder's: dropped (rule 5). A failed read holds on
    /// (a verification: read again in turn) or asks again after a poll (a
    /// reassertion).
    pub(super) fn verified(
        &mut self,
        now: Timestamp,
        k: u32,
        ours: ShardLease,
        row: Result<ShardLease, String>,
        out: &mut Vec<ShardAction>,
    ) {
        let reasserting = matches!(self.slots.get(&k), Some(Slot::Reasserting { .. }));
        let row = match row {
            Ok(row) => row,
            Err(_) if reasserting => {
                self.retry_at.insert(k, after(now, self.options.poll));
                return;
            }
            Err(_) => return self.hold(k, ours, out),
        };
        let mine = row.owner == Some(self.me) && row.status == LeaseStatus::Owned;
        if mine && row.epoch == ours.epoch {
            self.hold(
                k,
                ShardLease {
                    etag: row.etag,
                    ..ours
                },
                out,
            );
        } else if row.epoch < ours.epoch {
            tracing::warn!(
                shard = k,
                epoch = ours.epoch,
                found = row.epoch,
                "a held shard's lease row lost its acquire: writing it again"
            );
            let again = ShardLease {
                etag: row.etag,
                ..ours
            };
            out.push(ShardAction::Write(again.clone()));
            self.slots.insert(k, Slot::Reasserting { lease: again });
        } else {
            tracing::warn!(shard = k, epoch = ours.epoch, found = row.epoch, owner = ?row.owner,
                "a held shard's lease row names another holder: dropping it");
            self.drop_held(k, out);
        }
    }

    /// The answer to the write of a lost acquire again (`ours`): held once it
    /// landed; read again when another write came first or the outcome is
    /// unknown (rule 6); dropped when the store refuses it.
    pub(super) fn reasserted(
        &mut self,
        k: u32,
        mut ours: ShardLease,
        result: Result<Result<Etag, Option<Etag>>, WriteFailed>,
        out: &mut Vec<ShardAction>,
    ) {
        match result {
            Ok(Ok(etag)) => {
                ours.etag = etag;
                self.hold(k, ours, out);
            }
            Ok(Err(_)) | Err(WriteFailed::Unknown(_)) => {
                self.slots.insert(k, Slot::Reasserting { lease: ours });
                out.push(ShardAction::Read(k));
            }
            Err(WriteFailed::Refused(why)) => {
                tracing::error!(shard = k, error = %why, "writing a lost acquire again was refused; dropping the shard");
                self.drop_held(k, out);
            }
        }
    }

    /// The answer to the read of a shard another silo hinted at (`Orphan`):
    /// wanted since, rule 2; a row naming this silo, which does not hold it
    /// (its release or give-back was lost), released as it stands (the next
    /// holder starts from its watermark and exceptions: what this silo
    /// delivered since may come again; nothing is lost); otherwise nothing.
    pub(super) fn orphan_read(
        &mut self,
        now: Timestamp,
        k: u32,
        row: Result<ShardLease, String>,
        out: &mut Vec<ShardAction>,
    ) {
        self.slots.remove(&k);
        let Ok(row) = row else {
            self.want_more(out);
            return self.check_left(out);
        };
        if self.wanted(k) {
            self.consider(now, k, row, out);
        } else if row.owner == Some(self.me) && row.status == LeaseStatus::Owned {
            tracing::warn!(
                shard = k,
                epoch = row.epoch,
                "a lease row names this silo, which does not hold the shard: releasing it"
            );
            let release = ShardLease {
                status: LeaseStatus::Released,
                ..row
            };
            out.push(ShardAction::Write(release.clone()));
            self.slots.insert(k, Slot::Releasing { lease: release });
        } else {
            self.check_left(out);
        }
    }

    /// Held shard `k` (as `lease`) after a verification or reassertion:
    /// delivering on, or stopped when no longer wanted (rule 4).
    pub(super) fn hold(&mut self, k: u32, lease: ShardLease, out: &mut Vec<ShardAction>) {
        if self.wanted(k) {
            self.slots.insert(k, Slot::Owned { lease });
        } else {
            self.stop(k, lease, out);
        }
    }

    /// Forgets held shard `k` at once: another holder has it (rule 5).
    fn drop_held(&mut self, k: u32, out: &mut Vec<ShardAction>) {
        self.slots.remove(&k);
        out.push(ShardAction::Drop(k));
        self.want_more(out);
        self.check_left(out);
    }
}

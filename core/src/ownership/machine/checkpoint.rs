//! Rule 11 of the shard leases, checkpoints: every checkpoint interval the
//! holder of a loaded shard tells its progress (the latest occurrence it
//! started, and what it owes at or before it), and when that moved since the
//! row's, writes it into the lease row by compare-and-set at the same epoch.
//! A successor that takes the shard over from a Dead holder owes from there
//! (`handoff`, rule 1). The rules are in the parent module's docs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::lease::{LeaseException, PagesFrom, ShardLease};
use crate::{Etag, Timestamp};

use super::{after, Progress, ShardAction, ShardMachine, Slot, Stopped, WriteFailed};

/// The most reminders a checkpoint names as owed: 64, so that a checkpoint
/// fits in the lease row itself (64 exceptions of the longest keys are about
/// 140 KB of the row's 256 KiB) and is one store call. A holder owing more
/// lowers the checkpoint's watermark to just before the 65th earliest owed
/// occurrence instead: a successor then owes everything from there on, and a
/// crash may repeat more, never lose more.
pub const CHECKPOINT_EXCEPTIONS: usize = 64;

/// What a checkpoint says of `owed` (occurrence, exception), the holder's
/// debts at or before `through`, the latest occurrence it started: the
/// checkpoint's watermark and at most [`CHECKPOINT_EXCEPTIONS`] exceptions,
/// the earliest first. With more, the watermark is lowered to just before
/// the first one left out.
pub fn checkpoint_of(
    through: Option<Timestamp>,
    mut owed: Vec<LeaseException>,
) -> (Option<Timestamp>, Vec<LeaseException>) {
    owed.sort_by(|a, b| (a.next, &a.actor_id, &a.name).cmp(&(b.next, &b.actor_id, &b.name)));
    if owed.len() <= CHECKPOINT_EXCEPTIONS {
        return (through, owed);
    }
    let first_left_out = owed[CHECKPOINT_EXCEPTIONS].next;
    owed.truncate(CHECKPOINT_EXCEPTIONS);
    let lowered = Timestamp::from_millis(first_left_out.as_millis().saturating_sub(1));
    (Some(through.map_or(lowered, |t| t.min(lowered))), owed)
}

/// Rule 11's times: when each held shard's next checkpoint is due, and
/// when the held shards are looked at next.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    due: BTreeMap<u32, Timestamp>,
    /// The shards asked at the last look, and when that was.
    asked: (Timestamp, BTreeSet<u32>),
    /// The next look: not before a poll after the last one, nor before the
    /// earliest due time.
    next: Option<Timestamp>,
}

impl Checkpoints {
    /// Whether shard `k`'s progress was asked for at `now`.
    pub(super) fn asked(&self, k: u32, now: Timestamp) -> bool {
        self.asked.0 == now && self.asked.1.contains(&k)
    }
}

impl ShardMachine {
    /// Rule 11: the first checkpoint of held shard `k`, loaded at `now`
    /// from `lease`, comes a poll after the load, or after the takeover
    /// time (nothing moves before it): the row's checkpoint is the
    /// release's or the Dead holder's, with the backlog they owed, which
    /// this silo now delivers; a crash an interval later would repeat all
    /// of it. (Found by the virtual-time churn, seed 25: a silo killed
    /// 10.1 s after its acquire repeated a backlog 40 s old.)
    pub(super) fn first_checkpoint(&mut self, now: Timestamp, k: u32, lease: &ShardLease, takeover: bool) {
        let start = match lease.watermark.filter(|_| takeover) {
            Some(w) => after(w, Duration::from_millis(1)).max(now),
            None => now,
        };
        let due = after(start, self.options.poll);
        let c = &mut self.checkpoints;
        c.due.insert(k, due);
        c.next = Some(c.next.map_or(due, |n| n.min(due)));
    }

    /// Rule 11: the held shards whose checkpoint is due at `now` are asked
    /// for their progress, in one action; the next look's time, for the
    /// timer.
    ///
    /// The held shards are looked at together, at most once a poll: a silo
    /// holding a thousand shards wakes once a poll for them, not once for
    /// each (their intervals start at their loads, spread out).
    pub(super) fn checkpoint_due(&mut self, now: Timestamp, out: &mut Vec<ShardAction>) -> Option<Timestamp> {
        let every = self.options.checkpoint;
        let slots = &self.slots;
        let c = &mut self.checkpoints;
        if every.is_zero() {
            c.due.clear();
            return None;
        }
        if c.next.is_none_or(|at| now < at) {
            return c.next;
        }
        c.due.retain(|k, _| {
            matches!(
                slots.get(k),
                Some(
                    Slot::Owned { .. }
                        | Slot::Verifying { .. }
                        | Slot::Checkpointing { .. }
                        | Slot::Stopping { stopped: None, .. }
                )
            )
        });
        let mut asked = BTreeSet::new();
        for (k, due) in c.due.iter_mut() {
            // A shard busy now (being read, a checkpoint in flight) is
            // asked at the next look; a stopping one, until its release
            // is written (its final load may take long).
            let idle = matches!(
                slots.get(k),
                Some(
                    Slot::Owned { .. }
                        | Slot::Stopping {
                            checkpoint: None,
                            stopped: None,
                            ..
                        }
                )
            );
            if *due <= now && idle {
                *due = after(now, every);
                asked.insert(*k);
            }
        }
        if !asked.is_empty() {
            out.push(ShardAction::Checkpoint(asked.iter().copied().collect()));
        }
        c.asked = (now, asked);
        let poll = after(now, self.options.poll);
        c.next = c.due.values().min().map(|d| (*d).max(poll));
        c.next
    }

    /// Rule 11: shard `k`'s progress; written as a checkpoint when it moved
    /// since the row's (same epoch, same owner: the token is unchanged).
    ///
    /// A stopping shard (rule 4) is checkpointed too, at its stop and then
    /// as when held, until its release is written: the stop's checkpoint
    /// is what a successor owes from if the release never lands (the silo
    /// dies, or leaves while the store is away), so it costs the repeats
    /// of the deliveries in flight at the stop, not of a whole interval.
    pub(super) fn progress(&mut self, p: Progress, out: &mut Vec<ShardAction>) {
        let Progress {
            shard: k,
            owed_from,
            exceptions,
        } = p;
        let (Some(Slot::Owned { lease })
        | Some(Slot::Stopping {
            lease,
            checkpoint: None,
            stopped: None,
        })) = self.slots.get(&k)
        else {
            return;
        };
        if self.options.checkpoint.is_zero()
            || (lease.owed_from == owed_from && lease.exceptions == exceptions)
        {
            return;
        }
        let next = Box::new(ShardLease {
            owed_from,
            exceptions,
            pages_from: PagesFrom::default(),
            ..lease.clone()
        });
        out.push(ShardAction::Write((*next).clone()));
        match self.slots.remove(&k) {
            Some(Slot::Stopping { lease, stopped, .. }) => {
                let checkpoint = Some(next);
                self.slots.insert(
                    k,
                    Slot::Stopping {
                        lease,
                        checkpoint,
                        stopped,
                    },
                );
            }
            Some(Slot::Owned { lease }) => {
                self.slots.insert(k, Slot::Checkpointing { lease, next });
            }
            _ => {}
        }
    }

    /// Rule 11 for a stopping shard: the answer to the checkpoint `next`
    /// of shard `k`, held as `lease`. Landed, `next` is held. Otherwise the
    /// shard is held as before: an unknown outcome is written again after a
    /// poll (a conflict then means it had landed: the release reads the row,
    /// rule 6), another write first waits for the release to read the row.
    /// Then the release is written when the stop's answer is in.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stop_checkpointed(
        &mut self,
        now: Timestamp,
        k: u32,
        mut lease: ShardLease,
        next: Box<ShardLease>,
        stopped: Option<Box<Stopped>>,
        result: Result<Result<Etag, Option<Etag>>, WriteFailed>,
        out: &mut Vec<ShardAction>,
    ) {
        let again = match result {
            Ok(Ok(etag)) => {
                lease = ShardLease { etag, ..*next };
                self.options.checkpoint
            }
            Err(WriteFailed::Unknown(_)) => self.options.poll,
            Ok(Err(_)) => self.options.checkpoint,
            Err(WriteFailed::Refused(why)) => {
                tracing::error!(shard = k, error = %why, "a shard checkpoint was refused; trying again at the next one");
                self.options.checkpoint
            }
        };
        match stopped {
            Some(stopped) => self.release(k, &lease, *stopped, out),
            None => {
                self.slots.insert(
                    k,
                    Slot::Stopping {
                        lease,
                        checkpoint: None,
                        stopped: None,
                    },
                );
                let at = after(now, again);
                let c = &mut self.checkpoints;
                c.due.insert(k, at);
                c.next = Some(c.next.map_or(at, |n| n.min(at)));
            }
        }
    }

    /// Rule 11: the answer to the checkpoint `next` of shard `k`, held as
    /// `lease`. Landed, `next` is held; another write came first or the
    /// outcome is unknown: the row is read again (rule 10, which drops the
    /// shard if another epoch holds it); refused: held as before, an error
    /// logged (the next checkpoint tries again).
    pub(super) fn checkpointed(
        &mut self,
        k: u32,
        lease: ShardLease,
        mut next: Box<ShardLease>,
        result: Result<Result<Etag, Option<Etag>>, WriteFailed>,
        out: &mut Vec<ShardAction>,
    ) {
        match result {
            Ok(Ok(etag)) => {
                next.etag = etag;
                self.hold(k, *next, out);
            }
            Ok(Err(_)) | Err(WriteFailed::Unknown(_)) => {
                // What landed is not known: held as before (a checkpoint that
                // did land is written again, the same, at the next one).
                self.slots.insert(k, Slot::Verifying { lease });
                out.push(ShardAction::ReadHead(k));
            }
            Err(WriteFailed::Refused(why)) => {
                tracing::error!(shard = k, error = %why, "a shard checkpoint was refused; trying again at the next one");
                self.hold(k, lease, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(actor: &str, at: u64) -> LeaseException {
        LeaseException {
            actor_id: actor.to_owned(),
            name: "r".to_owned(),
            next: Timestamp::from_millis(at),
            etag: None,
            done: false,
        }
    }

    #[test]
    fn a_checkpoint_names_what_is_owed_in_due_order() {
        let through = Some(Timestamp::from_millis(10_000));
        let (w, e) = checkpoint_of(through, vec![owed("b", 9_000), owed("a", 5_000)]);
        assert_eq!(w, through);
        assert_eq!(
            e.iter().map(|e| e.actor_id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    /// More than [`CHECKPOINT_EXCEPTIONS`] owed: the earliest are named and
    /// the watermark goes to just before the first left out, so a successor
    /// owes it and everything after it (more repeats, nothing lost).
    #[test]
    fn a_checkpoint_owing_more_than_fits_lowers_its_watermark() {
        let owed_list = (0..100).map(|i| owed(&format!("a{i:03}"), 1_000 + i)).collect();
        let (w, e) = checkpoint_of(Some(Timestamp::from_millis(10_000)), owed_list);
        assert_eq!(e.len(), CHECKPOINT_EXCEPTIONS);
        assert_eq!(
            w,
            Some(Timestamp::from_millis(1_000 + CHECKPOINT_EXCEPTIONS as u64 - 1))
        );
        assert!(e
            .iter()
            .all(|x| x.next.as_millis() < 1_000 + CHECKPOINT_EXCEPTIONS as u64));
        // All due at one time (a mass due time): just before it.
        let same = (0..100).map(|i| owed(&format!("a{i:03}"), 7_000)).collect();
        let (w, e) = checkpoint_of(Some(Timestamp::from_millis(10_000)), same);
        assert_eq!(
            (w, e.len()),
            (Some(Timestamp::from_millis(6_999)), CHECKPOINT_EXCEPTIONS)
        );
    }
}

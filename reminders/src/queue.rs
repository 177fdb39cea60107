//! The materialised schedule of one silo: the reminders it owns that are due within
//! the loading window, ordered by due time. Pure: the agent feeds it times.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use rollcall_membership_core::{ReminderEntry, Timestamp};

use crate::schedule::Planned;

/// (actor id, name): a reminder's key within its service.
pub(crate) type Key = Arc<(String, String)>;

pub(crate) fn key_of(entry: &ReminderEntry) -> Key {
    Arc::new((entry.actor_id.clone(), entry.name.clone()))
}

/// One scheduled reminder.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The row as last read (its etag identifies the registration).
    pub entry: ReminderEntry,
    /// Its next tick.
    pub next: Planned,
    /// The agent's change counter when the slot was last set from a notice or a
    /// load (a load started before that must not undo it).
    pub touched: u64,
    /// Failed attempts at delivering `next`.
    pub attempts: u32,
    /// A delivery of `next` is running.
    pub delivering: bool,
}

/// Slots by key plus a due-time index.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    slots: HashMap<Key, Slot>,
    due: BTreeSet<(Timestamp, Key)>,
}

impl Queue {
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&Slot> {
        self.slots.get(key)
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut Slot> {
        self.slots.get_mut(key)
    }

    /// Sets (or replaces) the slot of `entry`, due at `next.due`.
    pub(crate) fn set(&mut self, entry: ReminderEntry, next: Planned, touched: u64) {
        let key = key_of(&entry);
        self.remove(&key);
        self.due.insert((next.due, key.clone()));
        self.slots.insert(
            key,
            Slot {
                entry,
                next,
                touched,
                attempts: 0,
                delivering: false,
            },
        );
    }

    /// Drops a slot; its running delivery (if any) finds it gone.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Slot> {
        let slot = self.slots.remove(key)?;
        if !slot.delivering {
            self.due.remove(&(slot.next.due, key.clone()));
        }
        Some(slot)
    }

    /// Keeps the slots for which `keep` holds.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Key, &Slot) -> bool) {
        let gone: Vec<Key> = self
            .slots
            .iter()
            .filter(|(k, s)| !keep(k, s))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The earliest due time of a slot not being delivered.
    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.due.first().map(|(t, _)| *t)
    }

    /// Takes up to `max` slots due at or before `now` (earliest first) and marks them
    /// as delivering.
    pub(crate) fn take_due(&mut self, now: Timestamp, max: usize) -> Vec<Key> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some((t, _)) = self.due.first() else { break };
            if *t > now {
                break;
            }
            let (_, key) = self.due.pop_first().expect("non-empty");
            if let Some(slot) = self.slots.get_mut(&key) {
                slot.delivering = true;
                out.push(key);
            }
        }
        out
    }

    /// Puts a slot back in the due index at `due` (after a delivery, or to retry).
    pub(crate) fn requeue(&mut self, key: &Key, next: Planned) {
        if let Some(slot) = self.slots.get_mut(key) {
            if !slot.delivering {
                self.due.remove(&(slot.next.due, key.clone()));
            }
            slot.next = next;
            slot.delivering = false;
            self.due.insert((next.due, key.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str) -> ReminderEntry {
        ReminderEntry::new("s", "a", name, Timestamp::from_millis(0), None)
    }

    fn at(ms: u64) -> Planned {
        Planned {
            scheduled: Timestamp::from_millis(ms),
            due: Timestamp::from_millis(ms),
        }
    }

    #[test]
    fn due_order_take_requeue_and_remove() {
        let mut q = Queue::default();
        q.set(e("b"), at(20), 0);
        q.set(e("a"), at(10), 0);
        q.set(e("c"), at(30), 0);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(10)));
        let taken = q.take_due(Timestamp::from_millis(25), 10);
        assert_eq!(taken.iter().map(|k| k.1.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(q.get(&taken[0]).unwrap().delivering);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(30)));
        q.requeue(&taken[0], at(40));
        assert!(!q.get(&taken[0]).unwrap().delivering);
        // Replacing a slot drops its old due time.
        q.set(e("c"), at(50), 1);
        assert_eq!(
            q.take_due(Timestamp::from_millis(45), 10).len(),
            1,
            "only a at 40"
        );
        // Removing a delivering slot leaves nothing behind.
        q.remove(&taken[1]);
        q.requeue(&taken[1], at(1));
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(50)));
        q.retain(|k, _| k.1 != "c");
        assert_eq!(q.next_due(), None);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn take_due_respects_its_bound() {
        let mut q = Queue::default();
        for i in 0..10 {
            q.set(e(&i.to_string()), at(i), 0);
        }
        assert_eq!(q.take_due(Timestamp::from_millis(100), 3).len(), 3);
        assert_eq!(q.take_due(Timestamp::from_millis(100), 100).len(), 7);
    }
}

//! The materialised schedule of one silo: the reminders of the shards it holds,
//! ordered by due time. Pure: the agent feeds it times.
//!
//! Laid out for a million reminders per silo (R1 measures the bytes per reminder):
//! slots live in a [`Slab`] and hold only what scheduling and delivery need (no
//! service id, the period in ms, the etag and the key inline when short); a hash
//! index maps keys to slab positions and a B-tree of `(due, position)` orders them.

use std::collections::{BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use rollcall_core::{duration_millis, MissedTickPolicy, ReminderEntry, RetryPolicy, Timestamp};
use slab::Slab;
use smol_str::SmolStr;

use crate::schedule::{Calendar, Planned, Timing};

/// (actor id, name): a reminder's key within its service. Stored as one string,
/// `"<actor length>:<actor><name>"` (unambiguous for any UTF-8 text), inline when
/// it is at most 23 bytes long; cloning it never copies a long one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(SmolStr);

impl Key {
    /// The key of reminder `name` of actor `actor` (the actor id as stored).
    pub fn new(actor: &str, name: &str) -> Key {
        Key(smol_str::format_smolstr!("{}:{actor}{name}", actor.len()))
    }

    fn split(&self) -> (&str, &str) {
        let text = self.0.as_str();
        let colon = text.find(':').unwrap_or(0);
        let len: usize = text[..colon].parse().unwrap_or(0);
        let rest = &text[colon + 1..];
        rest.split_at(len.min(rest.len()))
    }

    /// The actor id.
    pub fn actor(&self) -> &str {
        self.split().0
    }

    /// The reminder name.
    pub fn name(&self) -> &str {
        self.split().1
    }
}

pub(crate) fn key_of(entry: &ReminderEntry) -> Key {
    Key::new(&entry.actor_id, &entry.name)
}

/// One scheduled reminder: its row, reduced to what the schedule needs.
#[derive(Debug)]
pub(crate) struct Slot {
    pub key: Key,
    /// The row's etag as last read (it identifies the registration).
    pub etag: SmolStr,
    pub start_at: Timestamp,
    /// Period in ms; 0 for a one-shot reminder.
    pub period_ms: u64,
    /// `last_fired`; [`Timestamp::EPOCH`] when never.
    pub last_fired: Timestamp,
    /// Its next tick.
    pub next: Planned,
    /// The agent's change counter when the slot was last set from a notice or a
    /// load (a load started before that must not undo it).
    pub touched: u64,
    /// The row's ring position.
    pub hash: u32,
    /// The last load (by its epoch) that read this reminder's row; a load drops,
    /// when it ends, the slots it did not read (unless touched since it started).
    pub seen: u32,
    /// Failed attempts at delivering `next`.
    pub attempts: u16,
    pub policy: MissedTickPolicy,
    /// A delivery of `next` is running (the slot is out of the due index).
    pub delivering: bool,
    /// Its shard is loading or stopping: out of the due index until
    /// [`Queue::requeue`]d.
    pub held: bool,
    /// Acquired (or resumed after a pause) at this time with occurrences already
    /// due: each of them up to this time is delivered in turn (none is skipped
    /// for lateness; [`crate::handoff`]).
    pub catch_up_to: Timestamp,
    /// What few reminders have (a calendar, an end, a payload): one pointer in
    /// the slot, `None` for the rest.
    pub extra: Option<Box<Extra>>,
}

/// The rarer parts of a slot.
#[derive(Debug, Default)]
pub(crate) struct Extra {
    pub calendar: Option<Arc<Calendar>>,
    pub end_at: Option<Timestamp>,
    pub payload: Option<Arc<[u8]>>,
    pub retry: Option<RetryPolicy>,
    /// The reminder a trigger row stands for: its ticks carry this name.
    pub trigger_of: Option<SmolStr>,
}

impl Slot {
    /// The period; `None` for a one-shot reminder.
    pub(crate) fn period(&self) -> Option<Duration> {
        (self.period_ms > 0).then(|| Duration::from_millis(self.period_ms))
    }

    /// The reminder's retry policy.
    pub(crate) fn retry(&self) -> Option<RetryPolicy> {
        self.extra.as_ref().and_then(|x| x.retry)
    }

    /// The name its ticks carry: the triggered reminder's for a trigger row,
    /// else the row's.
    pub(crate) fn tick_name(&self) -> &str {
        self.extra
            .as_ref()
            .and_then(|x| x.trigger_of.as_deref())
            .unwrap_or(self.key.name())
    }

    /// The tick payload.
    pub(crate) fn payload(&self) -> Option<Arc<[u8]>> {
        self.extra.as_ref().and_then(|x| x.payload.clone())
    }

    /// What the scheduling rules read.
    pub(crate) fn timing(&self) -> Timing {
        Timing {
            start_at: self.start_at,
            period: self.period(),
            calendar: self.extra.as_ref().and_then(|x| x.calendar.clone()),
            end_at: self.extra.as_ref().and_then(|x| x.end_at),
            last_fired: (self.last_fired != Timestamp::EPOCH).then_some(self.last_fired),
            missed_tick_policy: self.policy,
        }
    }
}

/// Slots by key plus a due-time index and a ring-position index (a shard's
/// slots are one run of hashes), and, when a per-kind cap is set
/// ([`Queue::per_kind`]), a due-time index per actor kind: with it the queue
/// finds the earliest due slot of a kind below its cap behind any number of
/// due slots of a capped one.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    slots: Slab<Slot>,
    index: HashMap<Key, u32>,
    due: BTreeSet<(Timestamp, u32)>,
    by_hash: BTreeSet<(u32, u32)>,
    by_kind: Option<HashMap<SmolStr, BTreeSet<(Timestamp, u32)>>>,
}

/// The actor kind of a key (its actor id up to the first `/`).
pub(crate) fn kind_of(key: &Key) -> &str {
    let actor = key.actor();
    actor.split_once('/').map_or(actor, |(kind, _)| kind)
}

impl Queue {
    /// An empty queue that keeps a due index per actor kind (for
    /// [`take_due_per_kind`](Self::take_due_per_kind)).
    pub(crate) fn per_kind() -> Queue {
        Queue {
            by_kind: Some(HashMap::new()),
            ..Queue::default()
        }
    }

    fn due_insert(&mut self, t: Timestamp, i: u32) {
        self.due.insert((t, i));
        if let Some(kinds) = &mut self.by_kind {
            let kind = SmolStr::new(kind_of(&self.slots[i as usize].key));
            kinds.entry(kind).or_default().insert((t, i));
        }
    }

    fn due_remove(&mut self, t: Timestamp, i: u32, key: &Key) {
        self.due.remove(&(t, i));
        if let Some(kinds) = &mut self.by_kind {
            let kind = kind_of(key);
            if let Some(set) = kinds.get_mut(kind) {
                set.remove(&(t, i));
                if set.is_empty() {
                    kinds.remove(kind);
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&Slot> {
        self.index.get(key).map(|&i| &self.slots[i as usize])
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut Slot> {
        self.index.get(key).map(|&i| &mut self.slots[i as usize])
    }

    /// Sets (or replaces) the slot of `entry` (whose calendar, if any, is
    /// `timing`'s), due at `next.due`.
    pub(crate) fn set(&mut self, entry: &ReminderEntry, timing: &Timing, next: Planned, touched: u64) {
        let key = key_of(entry);
        self.remove(&key);
        let rare = timing.calendar.is_some()
            || entry.end_at.is_some()
            || entry.payload.is_some()
            || entry.retry.is_some()
            || entry.trigger_of.is_some();
        let extra = rare.then(|| {
            Box::new(Extra {
                calendar: timing.calendar.clone(),
                end_at: entry.end_at,
                payload: entry.payload.as_deref().map(Arc::from),
                retry: entry.retry,
                trigger_of: entry.trigger_of.as_deref().map(SmolStr::new),
            })
        });
        let slot = Slot {
            key: key.clone(),
            etag: SmolStr::new(entry.etag.as_str()),
            start_at: entry.start_at,
            period_ms: entry.period.map_or(0, duration_millis),
            last_fired: entry.last_fired.unwrap_or(Timestamp::EPOCH),
            next,
            touched,
            hash: entry.hash,
            seen: 0,
            attempts: 0,
            policy: entry.missed_tick_policy,
            delivering: false,
            held: false,
            catch_up_to: Timestamp::EPOCH,
            extra,
        };
        let i = u32::try_from(self.slots.insert(slot)).expect("fewer than 2^32 reminders per silo");
        self.index.insert(key, i);
        self.due_insert(next.due, i);
        self.by_hash.insert((entry.hash, i));
    }

    /// Drops a slot; its running delivery (if any) finds it gone.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Slot> {
        let i = self.index.remove(key)?;
        let slot = self.slots.remove(i as usize);
        self.by_hash.remove(&(slot.hash, i));
        if !slot.delivering && !slot.held {
            self.due_remove(slot.next.due, i, &slot.key);
        }
        Some(slot)
    }

    /// Of the slots whose hash lies in `hashes`, keeps those for which `keep`
    /// holds (a shard's slots, without a pass over the others).
    pub(crate) fn retain_hashes(&mut self, hashes: RangeInclusive<u32>, mut keep: impl FnMut(&Slot) -> bool) {
        let (first, last) = hashes.into_inner();
        let gone: Vec<Key> = self
            .by_hash
            .range((first, 0)..=(last, u32::MAX))
            .map(|(_, i)| &self.slots[*i as usize])
            .filter(|s| !keep(s))
            .map(|s| s.key.clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The slots whose hash lies in `hashes` (a shard's), in hash order.
    pub(crate) fn in_hashes(&self, hashes: RangeInclusive<u32>) -> impl Iterator<Item = &Slot> {
        let (first, last) = hashes.into_inner();
        self.by_hash
            .range((first, 0)..=(last, u32::MAX))
            .map(|(_, i)| &self.slots[*i as usize])
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
            let (t, i) = *self.due.first().expect("non-empty");
            let key = self.slots[i as usize].key.clone();
            self.due_remove(t, i, &key);
            self.slots[i as usize].delivering = true;
            out.push(key);
        }
        out
    }

    /// As [`take_due`](Self::take_due), but a kind with `cap` deliveries
    /// running (`running`, plus those taken here) is passed over: of the
    /// kinds below their cap, the earliest due slot first. The same as
    /// `take_due` on a queue without per-kind indexes. Costs the number of
    /// kinds with due slots per slot taken.
    pub(crate) fn take_due_per_kind(
        &mut self,
        now: Timestamp,
        max: usize,
        cap: usize,
        running: &HashMap<SmolStr, usize>,
    ) -> Vec<Key> {
        if self.by_kind.is_none() {
            return self.take_due(now, max);
        }
        let mut taken: HashMap<SmolStr, usize> = HashMap::new();
        let mut out = Vec::new();
        while out.len() < max {
            let Some(kinds) = &self.by_kind else { break };
            let best = kinds
                .iter()
                .filter(|(kind, _)| {
                    running.get(*kind).copied().unwrap_or(0) + taken.get(*kind).copied().unwrap_or(0) < cap
                })
                .filter_map(|(kind, set)| set.first().filter(|(t, _)| *t <= now).map(|head| (*head, kind)))
                .min();
            let Some(((t, i), kind)) = best else { break };
            let kind = kind.clone();
            let key = self.slots[i as usize].key.clone();
            self.due_remove(t, i, &key);
            self.slots[i as usize].delivering = true;
            *taken.entry(kind).or_default() += 1;
            out.push(key);
        }
        out
    }

    /// The earliest due time of a slot not being delivered whose kind has
    /// fewer than `cap` deliveries `running` (the time to wake up for; a capped
    /// kind is woken by the end of one of its deliveries).
    pub(crate) fn next_due_per_kind(
        &self,
        cap: usize,
        running: &HashMap<SmolStr, usize>,
    ) -> Option<Timestamp> {
        let Some(kinds) = &self.by_kind else {
            return self.next_due();
        };
        kinds
            .iter()
            .filter(|(kind, _)| running.get(*kind).copied().unwrap_or(0) < cap)
            .filter_map(|(_, set)| set.first().map(|(t, _)| *t))
            .min()
    }

    /// Puts a slot back in the due index at `next.due` (after a delivery, or to
    /// retry).
    pub(crate) fn requeue(&mut self, key: &Key, next: Planned) {
        let Some(&i) = self.index.get(key) else { return };
        let slot = &mut self.slots[i as usize];
        let queued = !slot.delivering && !slot.held;
        let old = slot.next.due;
        slot.next = next;
        slot.delivering = false;
        slot.held = false;
        if queued {
            self.due_remove(old, i, key);
        }
        self.due_insert(next.due, i);
    }

    /// Takes a slot out of the due index until [`requeue`](Self::requeue)d (a
    /// running delivery finishes first).
    pub(crate) fn hold(&mut self, key: &Key) {
        let Some(&i) = self.index.get(key) else { return };
        let slot = &mut self.slots[i as usize];
        let (queued, due) = (!slot.delivering && !slot.held, slot.next.due);
        slot.held = true;
        if queued {
            self.due_remove(due, i, key);
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
    fn keys_split_back_into_actor_and_name() {
        for (actor, name) in [
            ("cart/1", "tick"),
            ("", ""),
            ("a:b", ":c"),
            ("12:x", "y"),
            (
                "user/550e8400-e29b-41d4-a716-446655440000",
                "a much longer reminder name",
            ),
            ("ü/ß", "名前"),
        ] {
            let k = Key::new(actor, name);
            assert_eq!((k.actor(), k.name()), (actor, name));
        }
        // The length prefix keeps pairs with the same concatenation apart.
        assert_ne!(Key::new("ab", "c"), Key::new("a", "bc"));
    }

    #[test]
    fn due_order_take_requeue_and_remove() {
        let mut q = Queue::default();
        q.set(&e("b"), &Timing::of(&e("b")).unwrap(), at(20), 0);
        q.set(&e("a"), &Timing::of(&e("a")).unwrap(), at(10), 0);
        q.set(&e("c"), &Timing::of(&e("c")).unwrap(), at(30), 0);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(10)));
        let taken = q.take_due(Timestamp::from_millis(25), 10);
        assert_eq!(taken.iter().map(Key::name).collect::<Vec<_>>(), ["a", "b"]);
        assert!(q.get(&taken[0]).unwrap().delivering);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(30)));
        q.requeue(&taken[0], at(40));
        assert!(!q.get(&taken[0]).unwrap().delivering);
        // Replacing a slot drops its old due time.
        q.set(&e("c"), &Timing::of(&e("c")).unwrap(), at(50), 1);
        assert_eq!(
            q.take_due(Timestamp::from_millis(45), 10).len(),
            1,
            "only a at 40"
        );
        // Removing a delivering slot leaves nothing behind, and its position,
        // reused by another reminder, is not confused with it.
        q.remove(&taken[1]);
        q.requeue(&taken[1], at(1));
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(50)));
        q.set(&e("d"), &Timing::of(&e("d")).unwrap(), at(60), 1);
        assert!(q.get(&taken[1]).is_none());
        assert_eq!(
            q.get(&Key::new("a", "d")).map(|s| s.next.due),
            Some(Timestamp::from_millis(60))
        );
        q.retain_hashes(0..=u32::MAX, |s| s.key.name() != "c");
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(60)));
        assert_eq!(q.len(), 2);
        // A held slot is out of the due index until requeued; removing it leaves
        // nothing behind.
        let d = Key::new("a", "d");
        q.hold(&d);
        assert!(q.get(&d).unwrap().held);
        assert_eq!(q.next_due(), None, "a is delivering, d held");
        q.requeue(&d, at(5));
        assert_eq!(q.next_due(), Some(Timestamp::from_millis(5)));
        q.hold(&d);
        q.remove(&d);
        assert_eq!((q.next_due(), q.len()), (None, 1));
    }

    #[test]
    fn slots_keep_what_scheduling_reads() {
        let mut entry = ReminderEntry::new(
            "s",
            "a",
            "r",
            Timestamp::from_millis(5),
            Some(Duration::from_millis(1500)),
        );
        entry.last_fired = Some(Timestamp::from_millis(7));
        entry.missed_tick_policy = MissedTickPolicy::FireOnce;
        entry.etag = rollcall_core::Etag::new("42");
        let mut q = Queue::default();
        q.set(&entry, &Timing::of(&entry).unwrap(), at(9), 3);
        let slot = q.get(&key_of(&entry)).unwrap();
        assert_eq!(slot.timing(), Timing::of(&entry).unwrap());
        assert_eq!(
            (slot.etag.as_str(), slot.hash, slot.touched),
            ("42", entry.hash, 3)
        );
        q.set(&e("once"), &Timing::of(&e("once")).unwrap(), at(1), 0);
        assert_eq!(q.get(&Key::new("a", "once")).unwrap().period(), None);
    }

    #[test]
    fn take_due_respects_its_bound() {
        let mut q = Queue::default();
        for i in 0..10 {
            q.set(
                &e(&i.to_string()),
                &Timing::of(&e(&i.to_string())).unwrap(),
                at(i),
                0,
            );
        }
        assert_eq!(q.take_due(Timestamp::from_millis(100), 3).len(), 3);
        assert_eq!(q.take_due(Timestamp::from_millis(100), 100).len(), 7);
    }

    fn of(actor: &str, name: &str) -> ReminderEntry {
        ReminderEntry::new("s", actor, name, Timestamp::from_millis(0), None)
    }

    /// Issue 58 item 4: behind 1,000 due ticks of one kind, the other kind's
    /// due ticks (fewer than the cap) are taken once the first kind reaches
    /// its cap; a capped kind
    /// does not wake the queue; with no cap reached the order is `take_due`'s.
    #[test]
    fn a_capped_kind_does_not_hold_back_the_others() {
        let mut q = Queue::per_kind();
        for i in 0..1000 {
            let e = of(&format!("burst/{i}"), "r");
            q.set(&e, &Timing::of(&e).unwrap(), at(10), 0);
        }
        for i in 0..3u64 {
            let e = of(&format!("steady/{i}"), "r");
            q.set(&e, &Timing::of(&e).unwrap(), at(11 + i), 0);
        }
        let mut running = HashMap::new();
        let taken = q.take_due_per_kind(Timestamp::from_millis(30), 100, 4, &running);
        let kinds = |keys: &[Key]| keys.iter().map(|k| kind_of(k).to_owned()).collect::<Vec<_>>();
        assert_eq!(taken.len(), 7, "4 of the burst, then every steady one");
        assert_eq!(kinds(&taken[..4]), ["burst"; 4], "earliest first");
        assert_eq!(kinds(&taken[4..]), ["steady"; 3]);
        running.insert(SmolStr::new("burst"), 4);
        assert_eq!(
            q.next_due_per_kind(4, &running),
            None,
            "only the capped kind is due"
        );
        assert!(q
            .take_due_per_kind(Timestamp::from_millis(30), 100, 4, &running)
            .is_empty());
        running.insert(SmolStr::new("burst"), 2);
        assert_eq!(q.next_due_per_kind(4, &running), Some(Timestamp::from_millis(10)));
        assert_eq!(
            q.take_due_per_kind(Timestamp::from_millis(30), 100, 4, &running)
                .len(),
            2
        );
        // A kindless actor id is its own kind.
        assert_eq!(kind_of(&Key::new("nokind", "r")), "nokind");
    }

    /// The per-kind indexes follow every change of the due index: random
    /// sets, removes, requeues, holds and takes on a plain queue and a
    /// per-kind one take the same keys in the same order when no cap is
    /// reached.
    #[test]
    fn per_kind_indexes_follow_every_change() {
        use rand::{Rng, SeedableRng};
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut plain, mut fair) = (Queue::default(), Queue::per_kind());
            let none = HashMap::new();
            for step in 0..2000u64 {
                let e = of(
                    &format!("k{}/{}", rng.random_range(0..4), rng.random_range(0..30)),
                    "r",
                );
                let key = key_of(&e);
                let due = at(rng.random_range(0..500));
                match rng.random_range(0..6) {
                    0 | 1 => {
                        plain.set(&e, &Timing::of(&e).unwrap(), due, step);
                        fair.set(&e, &Timing::of(&e).unwrap(), due, step);
                    }
                    2 => {
                        plain.remove(&key);
                        fair.remove(&key);
                    }
                    3 => {
                        plain.requeue(&key, due);
                        fair.requeue(&key, due);
                    }
                    4 => {
                        plain.hold(&key);
                        fair.hold(&key);
                    }
                    _ => {
                        let now = Timestamp::from_millis(rng.random_range(0..500));
                        let n = rng.random_range(0..5);
                        assert_eq!(
                            plain.take_due(now, n),
                            fair.take_due_per_kind(now, n, usize::MAX, &none),
                            "seed {seed} step {step}"
                        );
                    }
                }
                assert_eq!(plain.next_due(), fair.next_due_per_kind(usize::MAX, &none));
            }
            let indexed: usize = fair.by_kind.as_ref().unwrap().values().map(BTreeSet::len).sum();
            assert_eq!(
                indexed,
                fair.due.len(),
                "seed {seed}: the kind indexes hold the due index"
            );
        }
    }
}

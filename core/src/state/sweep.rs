//! The sweep of a grain-state table (sans-io): which generations, expired
//! states and tombstones a silo removes, judged by what the sweeper itself saw
//! and when, on its own clock.
//!
//! Rules, per state key, each time the sweeper looks at it ([`SweepMachine::observe`]):
//! - A generation of chunk rows that the header does not publish is an orphan
//!   (a write that failed, was killed, or was replaced and not cleaned up). It
//!   is deleted once **this sweeper** has seen it unpublished for at least
//!   `grace`: two sightings that far apart on the sweeper's clock. The time in
//!   the generation id is the writer's clock and is not trusted (a writer whose
//!   clock is behind by more than the grace would have its write in progress
//!   swept).
//! - A listed state with no live header (it expired, or its header is gone
//!   and only an index entry is left): its chunks are orphans (swept after the
//!   grace, as above: a first write may be staging); once none is left, the
//!   header is deleted with a delete that only an absent or expired header
//!   passes (`Expected::Absent`), so a state written meanwhile stays, and the
//!   state is no longer listed.
//! - A tombstone (a cleared state) fences writers holding an older etag; it is
//!   deleted once the sweeper has seen it for `tombstone_retention`, after which
//!   only a first write (`Expected::Absent`) can recreate the state.
//! - At most `max_tracked` sightings are remembered; beyond that new ones are
//!   not recorded (they are swept in a later pass), so memory stays bounded.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{generation_time, Expected, StateHeader, StateKey, SWEEP_GRACE};
use crate::{Etag, Timestamp};

/// How long a tombstone is kept by default before a sweep removes it: 1 hour.
pub const TOMBSTONE_RETENTION: Duration = Duration::from_secs(3600);

/// The most sightings a [`SweepMachine`] remembers by default.
pub const MAX_TRACKED: usize = 100_000;

/// What a sweep does to one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SweepAction {
    /// Delete the chunk rows of this generation (an orphan, or the chunks of an
    /// expired state).
    DeleteGeneration(String),
    /// Delete the header if it passes this precondition: `Absent` for an
    /// expired (or missing) one, the etag of a tombstone kept long enough.
    DeleteHeader(Expected),
}

/// What one sweep action was for (the `what` label of
/// `rollcall_state_swept_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swept {
    /// A generation no header publishes.
    Orphan,
    /// An expired state.
    Expired,
    /// A tombstone.
    Tombstone,
}

impl Swept {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Swept::Orphan => "orphan_generation",
            Swept::Expired => "expired",
            Swept::Tombstone => "tombstone",
        }
    }
}

/// The sweep's rules and its memory of sightings (see the [module docs](self)).
#[derive(Debug)]
pub struct SweepMachine {
    grace: Duration,
    tombstone_retention: Duration,
    max_tracked: usize,
    /// (key, what was seen: `g:<generation>` or `t:<etag>`) -> first seen.
    seen: BTreeMap<(StateKey, String), Timestamp>,
}

impl Default for SweepMachine {
    fn default() -> Self {
        SweepMachine::new(SWEEP_GRACE, TOMBSTONE_RETENTION, MAX_TRACKED)
    }
}

impl SweepMachine {
    /// A sweep that deletes orphans seen for `grace` and tombstones seen for
    /// `tombstone_retention`, remembering at most `max_tracked` sightings.
    pub fn new(grace: Duration, tombstone_retention: Duration, max_tracked: usize) -> SweepMachine {
        SweepMachine {
            grace,
            tombstone_retention,
            max_tracked,
            seen: BTreeMap::new(),
        }
    }

    /// How many sightings are remembered.
    pub fn tracked(&self) -> usize {
        self.seen.len()
    }

    /// What to do with `key` (listed by the table) at `now` (the sweeper's
    /// clock), given its live header as read (`None`: none, or expired) and its
    /// generations of chunk rows. Each action comes with what it is for.
    pub fn observe(
        &mut self,
        key: &StateKey,
        now: Timestamp,
        header: Option<(&StateHeader, &Etag)>,
        generations: &[String],
    ) -> Vec<(SweepAction, Swept)> {
        let mut actions = Vec::new();
        let mut candidates: Vec<(String, Duration)> = Vec::new();
        let published = match header {
            Some((h, etag)) if h.cleared && !h.expired(now) => {
                candidates.push((format!("t:{etag}"), self.tombstone_retention));
                Some(h.generation.as_str())
            }
            Some((h, _)) if !h.expired(now) => Some(h.generation.as_str()),
            // Expired, or gone: every generation is unpublished. The header
            // goes once its chunks have (the key stays listed until then).
            _ => {
                if generations.is_empty() {
                    actions.push((SweepAction::DeleteHeader(Expected::Absent), Swept::Expired));
                }
                None
            }
        };
        for g in generations.iter().filter(|g| Some(g.as_str()) != published) {
            candidates.push((format!("g:{g}"), self.grace));
        }
        // Forget what this key no longer has.
        let wanted: Vec<&String> = candidates.iter().map(|(c, _)| c).collect();
        let stale: Vec<(StateKey, String)> = self
            .seen
            .range((key.clone(), String::new())..)
            .take_while(|((k, _), _)| k == key)
            .filter(|((_, c), _)| !wanted.contains(&c))
            .map(|(k, _)| k.clone())
            .collect();
        for s in stale {
            self.seen.remove(&s);
        }
        for (c, age) in candidates {
            let slot = (key.clone(), c);
            match self.seen.get(&slot) {
                Some(first)
                    if now.as_millis().saturating_sub(first.as_millis()) >= age.as_millis() as u64 =>
                {
                    self.seen.remove(&slot);
                    let (what, rest) = slot.1.split_at(2);
                    actions.push(match what {
                        "t:" => (
                            SweepAction::DeleteHeader(Expected::Etag(Etag::new(rest))),
                            Swept::Tombstone,
                        ),
                        _ => (SweepAction::DeleteGeneration(rest.to_owned()), Swept::Orphan),
                    });
                }
                Some(_) => {}
                None if self.seen.len() < self.max_tracked => {
                    self.seen.insert(slot, now);
                }
                None => {}
            }
        }
        actions
    }
}

/// The generations of a key that a sweep removes: not `published`, and made
/// before `now - grace` (a write still staging is younger).
pub fn sweepable(
    generations: &[String],
    published: Option<&str>,
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    let before = now.as_millis().saturating_sub(grace.as_millis() as u64);
    generations
        .iter()
        .filter(|g| Some(g.as_str()) != published)
        .filter(|g| generation_time(g).is_none_or(|t| t < before))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{new_generation, Codec};

    fn key() -> StateKey {
        StateKey::new("cart/1", "s").unwrap()
    }

    fn at(s: u64) -> Timestamp {
        Timestamp::from_millis(s * 1000)
    }

    #[test]
    fn an_orphan_goes_after_the_sweeper_saw_it_for_the_grace() {
        let mut m = SweepMachine::new(Duration::from_secs(60), TOMBSTONE_RETENTION, 10);
        let h = StateHeader::of(b"x", Codec::Raw, "live".into(), 1, None);
        let e = Etag::new("e");
        let gens = vec!["live".to_owned(), "orphan".to_owned()];
        assert!(
            m.observe(&key(), at(1000), Some((&h, &e)), &gens).is_empty(),
            "first sighting"
        );
        assert!(
            m.observe(&key(), at(1059), Some((&h, &e)), &gens).is_empty(),
            "not yet"
        );
        assert_eq!(
            m.observe(&key(), at(1060), Some((&h, &e)), &gens),
            vec![(SweepAction::DeleteGeneration("orphan".into()), Swept::Orphan)]
        );
        assert_eq!(m.tracked(), 0);
    }

    /// The generation id carries the writer's clock; a writer far behind made
    /// an id that looks ancient. The sweeper judges by its own sightings.
    #[test]
    fn a_generation_that_looks_old_by_its_writers_clock_is_not_swept_at_once() {
        let mut m = SweepMachine::new(Duration::from_secs(60), TOMBSTONE_RETENTION, 10);
        let ancient = crate::state::new_generation(Timestamp::from_millis(1));
        let gens = vec![ancient.clone()];
        let other = StateHeader::of(b"y", Codec::Raw, "other".into(), 0, None);
        let e0 = Etag::new("e0");
        assert!(m.observe(&key(), at(5000), Some((&other, &e0)), &gens).is_empty());
        // Published meanwhile: forgotten, never deleted.
        let h = StateHeader::of(b"x", Codec::Raw, ancient.clone(), 1, None);
        let e = Etag::new("e");
        assert!(m.observe(&key(), at(5100), Some((&h, &e)), &gens).is_empty());
        assert_eq!(m.tracked(), 0);
    }

    #[test]
    fn an_expired_state_goes_after_its_chunks() {
        let mut m = SweepMachine::new(Duration::from_secs(60), TOMBSTONE_RETENTION, 10);
        let h = StateHeader::of(b"x", Codec::Raw, "g".into(), 1, Some(at(10)));
        let e = Etag::new("e");
        let gens = ["g".to_owned()];
        assert!(
            m.observe(&key(), at(11), Some((&h, &e)), &gens).is_empty(),
            "its chunks are seen"
        );
        assert_eq!(
            m.observe(&key(), at(71), Some((&h, &e)), &gens),
            vec![(SweepAction::DeleteGeneration("g".into()), Swept::Orphan)]
        );
        assert_eq!(
            m.observe(&key(), at(72), None, &[]),
            vec![(SweepAction::DeleteHeader(Expected::Absent), Swept::Expired)]
        );
    }

    #[test]
    fn a_listed_state_without_a_live_header_is_deleted_if_still_absent() {
        let mut m = SweepMachine::default();
        assert_eq!(
            m.observe(&key(), at(1), None, &[]),
            vec![(SweepAction::DeleteHeader(Expected::Absent), Swept::Expired)]
        );
    }

    #[test]
    fn a_tombstone_is_kept_for_its_retention() {
        let mut m = SweepMachine::new(SWEEP_GRACE, Duration::from_secs(100), 10);
        let t = StateHeader::tombstone("g".into());
        let e = Etag::new("t1");
        assert!(m.observe(&key(), at(0), Some((&t, &e)), &[]).is_empty());
        assert!(m.observe(&key(), at(99), Some((&t, &e)), &[]).is_empty());
        assert_eq!(
            m.observe(&key(), at(100), Some((&t, &e)), &[]),
            vec![(SweepAction::DeleteHeader(Expected::Etag(e)), Swept::Tombstone)]
        );
    }

    #[test]
    fn sightings_are_bounded() {
        let mut m = SweepMachine::new(Duration::ZERO, TOMBSTONE_RETENTION, 2);
        let gens: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
        let h = StateHeader::of(b"y", Codec::Raw, "live".into(), 0, None);
        let e = Etag::new("e");
        m.observe(&key(), at(0), Some((&h, &e)), &gens);
        assert_eq!(m.tracked(), 2);
        assert_eq!(
            m.observe(&key(), at(1), Some((&h, &e)), &gens).len(),
            2,
            "the two remembered go"
        );
    }

    #[test]
    fn sweep_spares_the_published_and_the_young() {
        let now = Timestamp::from_millis(1_000_000);
        let gens = vec![
            new_generation(Timestamp::from_millis(1_000)),
            new_generation(Timestamp::from_millis(2_000)),
            new_generation(Timestamp::from_millis(999_000)),
        ];
        let gone = sweepable(&gens, Some(&gens[1]), now, Duration::from_secs(10));
        assert_eq!(gone, vec![gens[0].clone()]);
    }
}

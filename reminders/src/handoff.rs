//! Handing ring ranges from one owner to the next without repeating or losing a
//! tick. Pure: no I/O, no clock; the agent feeds it rings, releases and the time.
//!
//! Silos see a membership change at different moments, so for a while two silos
//! can both own a range in their views (a joiner before the old owner reads the
//! table), or none (a leaver stopped before the new owner read the table). Without
//! a handoff the first case repeats ticks and the second loses them. The rules:
//!
//! 1. **Release.** A silo that stops owning a range (its ring changed, or it is
//!    leaving) stops delivering there at once and sends the new owner (as its own
//!    ring says) a [`Release`]: the time `at` it stopped, and for every reminder of
//!    the range it had scheduled and not delivered by then, the first occurrence it
//!    did not deliver ([`Floor`]). Every other occurrence up to `at` it delivered
//!    or had started to deliver. A graceful leaver sends one release of all its
//!    ranges to every silo of its ring before its ShuttingDown row is written, and
//!    waits (bounded) until they are taken: the silo that gets a range in the end
//!    has it even if the new owner in the leaver's view leaves as well.
//! 2. **Hold.** A silo that starts owning a range holds it: it loads the range's
//!    rows but delivers nothing there until the range's previous owner (the owner
//!    in its previous ring; for a joiner, the ring without itself) released it. A
//!    held range is freed by
//!    - the previous owner's release covering it: each reminder starts at its
//!      floor, or at its first occurrence after `at`; occurrences between that
//!      floor and now are delivered at once (late, once);
//!    - the previous owner being Dead in the view for [`HANDOFF_GRACE`]
//!      (a crash: its release will never come): failover, the reminders are
//!      planned as after a load (`Skip` waits for the next occurrence, `FireOnce`
//!      catches up once); what fell due since the crash is the failover window;
//!    - [`HANDOFF_TIMEOUT`] without a release (a previous owner alive but silent):
//!      failover, logged as a warning.
//! 3. **Forwarding.** A release for ranges its receiver does not own in its view
//!    goes on to the owner it sees (at most [`MAX_RELEASE_HOPS`] hops), so a release
//!    sent to a silo that has since lost the range to a third one reaches it. The
//!    silo that passes it on vouches for it ([`Release::via`]) when it neither
//!    owned nor held the pieces in its previous ring and released nothing of them
//!    since: a hold waiting for that silo there takes the release as its own.
//! 4. **Chains.** A silo that loses a range it still holds itself delivered nothing
//!    there: its release names the silo it was waiting for, and the receiver waits
//!    for that one instead. For pieces it had freed but not yet loaded in full, its
//!    release passes on the floor it inherited, the per-reminder floors of the
//!    release that freed them ([`Holds::inherited_floors`]), and every reminder it
//!    had scheduled there.
//! 5. **Requests.** A hold that waited [`REQUEST_AFTER`] asks its previous owner
//!    ([`ReleaseRequest`]); the answer is what that silo released of the asked
//!    pieces (less what it owns again), where a release meant for a third silo
//!    only names that silo (it had the pieces next: wait for it), and for pieces it
//!    never owned (its view skipped the ring that gave them to it) the silo that
//!    owned them in its previous ring (none, or the asker itself: nobody delivered
//!    there, the asker takes them over at once; so do two silos that started
//!    together and hold on each other). While a silo waited for is gone, every silo
//!    is asked, and passes on the releases it received from the gone one; a gone
//!    silo's `last` release settles what it did not own at the end with the newest
//!    release of another silo covering it ([`Holds::settle_with_last`]). A part of
//!    a last release (forwarded, or answered for some pieces) speaks only for
//!    its [`Release::scope`]; a release settles nothing where a third silo owned
//!    the pieces in one of the settling silo's rings since it was made (that
//!    silo may have delivered there: the pieces fail over).
//!
//! A chain of holders can come back to a silo it named before (silos that
//! started within milliseconds of each other each waited for another one, and
//! the first passed the pieces to a third): then none of them delivered, and the
//! hold starts from the floor of the silo that passed the pieces on. Pieces that
//! silo had itself released, or passed on from a release it received, to another
//! silo wait for that one instead: it had them since and may have delivered.
//!
//! The machine ([`crate::machine`]) adds: requests are answered only from a view
//! at least as new as the asker's ([`ReleaseRequest::version`]); a ring change
//! applies again the `last` releases of the silos its holds wait for; a leaver reads
//! the table before it releases and keeps its last release to answer requests; a
//! release yields, piece by piece, to a later release of another silo with a
//! floor as late or later; a chain back to the receiver starts at its own release;
//! freed pieces are read again.
//!
//! A silo absent from the view is not gone: it joined in a view this silo has
//! not read yet (another silo named it), and is waited for like a live one.
//!
//! A gone silo's last release settles nothing with a release of another silo
//! older than [`HANDOFF_TIMEOUT`] before it: an owner delivered there since.
//!
//! Floors only move forward: where a chain carried a floor (the fallback of the
//! last silo in it that delivered) and a release frees the piece with an older
//! one, the later floor wins. A release kept for a later ring is kept as it came
//! and read again then, after the ring's own releases are recorded.
//!
//! Known limit: random schedules beyond the ones CI runs (`PROPTEST_RNG_SEED=<n>`
//! with `cargo nextest run -p rollcall-reminders --features sim --test machine`)
//! found every rule above and still find rare cases, so far losses only, never a
//! repeat: of seeds 204..2000 (about 460,000 schedules), three. In the one read,
//! a silo whose view lags far behind names a silo that left before its release
//! was made, and the range fails over (`docs/ARCHITECTURE.md` has the sweep).
//!
//! A hold is dropped once it is freed and a load that started after it finished (so
//! every row of the range was scheduled with the floor).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rollcall_membership_core::{duration_millis, SiloAddress, Timestamp};
use serde::{Deserialize, Serialize};

use crate::ring::{Ring, RingRange};

/// How long a range whose previous owner is Dead in the view stays held,
/// waiting for a release already on its way (a graceful leaver's release can arrive
/// after the row that says it left). 1 s.
pub const HANDOFF_GRACE: Duration = Duration::from_secs(1);
/// Longest hold: after 10 s without a release from a previous owner still Active or
/// ShuttingDown in the view, the range is taken over as after a crash.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a release is forwarded at most.
pub const MAX_RELEASE_HOPS: u8 = 2;

/// The first occurrence of one reminder its previous owner did not deliver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    /// The actor id (`kind/key`).
    pub actor: String,
    /// The reminder name.
    pub name: String,
    /// The registration (etag) the floor belongs to; a newer registration starts
    /// afresh.
    pub etag: String,
    /// The first occurrence not delivered (UTC ms, inclusive).
    pub next: u64,
}

/// A registration a silo learned from its notice while the piece it lies in was
/// held (its first tick not delivered by anyone this silo knows of): passed on
/// with a held piece, so that the failover that frees the piece in the end
/// plans it as learned from the notice (the late first tick at once) rather than
/// as a load does.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Noticed {
    /// The actor id (`kind/key`).
    pub actor: String,
    /// The reminder name.
    pub name: String,
    /// The registration (etag) the notice was for.
    pub etag: String,
}

/// One released piece of the ring and the floor of the reminders of it that
/// [`Release::floors`] does not name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasedPiece {
    /// The piece.
    pub range: RingRange,
    /// First occurrence (UTC ms, inclusive) its new owner may deliver of a reminder
    /// without a floor of its own: `at + 1` normally; `None` where the sender had
    /// itself taken the piece over as after a crash and not loaded it yet (the new
    /// owner plans those reminders as after a load).
    pub floor: Option<u64>,
    /// The sender still held this piece itself, waiting for this silo's release,
    /// or passed it on to this silo: the receiver waits for that silo instead.
    /// `floor` then is the floor of the last silo in the chain that delivered, used
    /// if the chain comes back to a silo it named before (every silo after that
    /// one only held the piece).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<SiloAddress>,
}

/// "I stopped delivering these ranges": sent by a range's previous owner to its new
/// one (rule 1 of the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The reminder service.
    pub service: String,
    /// The silo that released the ranges.
    pub from: SiloAddress,
    /// When it stopped delivering them (UTC ms).
    pub at: u64,
    /// The released pieces.
    pub pieces: Vec<ReleasedPiece>,
    /// Reminders whose first undelivered occurrence is not the piece's floor.
    pub floors: Vec<Floor>,
    /// Times it was forwarded.
    #[serde(default)]
    pub hops: u8,
    /// Sent by a graceful leaver: its last release, of every range it owned at the
    /// end (what it does not name it did not own then).
    #[serde(default)]
    pub last: bool,
    /// The silo it was meant for (the new owner in the sender's view); `None` for a
    /// leaver's last release, meant for every silo. Passed on to another silo, a
    /// release meant for a third one only names that third one (it had the pieces
    /// next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<SiloAddress>,
    /// Set by the silo that passes a received release on (rule 3): it did not
    /// deliver in its pieces after `at`, so a hold waiting for it there may be
    /// freed by this release as by its own. Cleared when kept for later: it holds
    /// at the time it was passed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<SiloAddress>,
    /// For a `last` release cut down from the one its sender made (forwarded to the
    /// owner of some of its pieces, answered for the pieces a request named, or
    /// sent in parts to fit the transport), the hashes it speaks for; `None`:
    /// every hash, as sent. A last release says what its sender did not own at
    /// the end only within its scope (rule 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Vec<RingRange>>,
    /// Registrations of its held pieces its sender learned from their notices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub noticed: Vec<Noticed>,
}

/// "Send me what you know of these pieces' releases": sent by a silo whose holds
/// waited [`REQUEST_AFTER`], to each previous owner it waits for that is still in
/// its view (its release may have been sent before the asker listened, or lost,
/// or to a silo that has since lost the pieces), and, while it waits for a silo
/// that is gone, to every Active silo (one of them may have received the gone
/// silo's release). A silo answers with the releases it sent or received that
/// cover the pieces, and, for pieces the asker waits on it for that it never owned
/// in its last two rings, the silo that owned them in its previous ring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The reminder service.
    pub service: String,
    /// The silo asking.
    pub from: SiloAddress,
    /// The pieces the asker holds, each with the silo whose release it waits for.
    #[serde(default)]
    pub waiting: Vec<(RingRange, SiloAddress)>,
    /// Silos waited for that are Dead in the asker's view: their
    /// releases, whoever received them, answer for them.
    #[serde(default)]
    pub gone: Vec<SiloAddress>,
    /// The version of the asker's membership view. A silo whose view is older
    /// does not answer (the asker asks again): what it released under an older
    /// view says nothing of the ranges a view between the two gives it, and an
    /// answer would send the asker after a silo that no longer has them while
    /// the answerer takes them over.
    #[serde(default)]
    pub version: u64,
}

/// What travels on a service's release topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HandoffMessage {
    /// A release.
    Release(Release),
    /// A request to send releases again.
    Request(ReleaseRequest),
}

impl HandoffMessage {
    /// This message in parts whose JSON is at most `max` bytes each (the
    /// transport's notice body limit): a release cut as [`Release::fit`] cuts
    /// it, a request split by its waiting pieces.
    pub fn fit(self, max: usize) -> Vec<HandoffMessage> {
        match self {
            HandoffMessage::Release(r) => r.fit(max).into_iter().map(HandoffMessage::Release).collect(),
            HandoffMessage::Request(r) => {
                let size =
                    serde_json::to_vec(&HandoffMessage::Request(r.clone())).map_or(usize::MAX, |b| b.len());
                if size <= max || r.waiting.len() < 2 {
                    return vec![HandoffMessage::Request(r)];
                }
                let mut first = r.clone();
                let second = first.waiting.split_off(r.waiting.len() / 2);
                let second = ReleaseRequest { waiting: second, ..r };
                let mut out = HandoffMessage::Request(first).fit(max);
                out.extend(HandoffMessage::Request(second).fit(max));
                out
            }
        }
    }
}

/// Every hash of the ring (`(x, x]` is the whole ring).
const WHOLE_RING: RingRange = RingRange { begin: 0, end: 0 };

/// How long a hold waits before asking its previous owner to send its release
/// again, and between two such requests. 500 ms.
pub const REQUEST_AFTER: Duration = Duration::from_millis(500);

impl Release {
    /// This release cut down to the hashes of `region`; `None` if nothing is left.
    /// Its [`scope`](Release::scope) narrows to `region` too.
    fn cut(&self, region: &[RingRange]) -> Option<Release> {
        let pieces: Vec<ReleasedPiece> = self
            .pieces
            .iter()
            .flat_map(|p| {
                region
                    .iter()
                    .flat_map(move |k| intersect(p.range, *k))
                    .map(move |range| ReleasedPiece { range, ..*p })
            })
            .collect();
        if pieces.is_empty() {
            return None;
        }
        // Only a last release says anything of the hashes it does not name.
        let scope = self.last.then(|| match &self.scope {
            None => region.to_vec(),
            Some(s) => s
                .iter()
                .flat_map(|a| region.iter().flat_map(move |b| intersect(*a, *b)))
                .collect(),
        });
        let inside = |actor: &str| {
            let h = rollcall_membership_core::actor_hash(actor);
            region.iter().any(|k| k.contains(h))
        };
        let floors = self.floors.iter().filter(|f| inside(&f.actor)).cloned().collect();
        let noticed = self
            .noticed
            .iter()
            .filter(|n| inside(&n.actor))
            .cloned()
            .collect();
        Some(Release {
            pieces,
            floors,
            scope,
            noticed,
            ..self.clone()
        })
    }

    /// This release in parts whose JSON is at most `max` bytes each, cut at
    /// piece boundaries, or inside a piece between the hashes of its
    /// per-reminder floors (each part keeps the floors of its hashes and, for a
    /// last release, its [`scope`](Release::scope)). A part that cannot be cut
    /// further (one hash, its floors over `max`) is returned as it is.
    pub fn fit(self, max: usize) -> Vec<Release> {
        let size = serde_json::to_vec(&HandoffMessage::Release(self.clone())).map_or(usize::MAX, |b| b.len());
        if size <= max {
            return vec![self];
        }
        let Some(at) = self.split_point() else {
            return vec![self];
        };
        let start = self.pieces.iter().map(|p| p.range.begin).min().unwrap_or(0);
        let halves = [
            RingRange {
                begin: start,
                end: at,
            },
            RingRange {
                begin: at,
                end: start,
            },
        ];
        let parts: Vec<Release> = halves.iter().filter_map(|h| self.cut(&[*h])).collect();
        if parts.len() < 2 {
            return vec![self];
        }
        parts.into_iter().flat_map(|p| p.fit(max)).collect()
    }

    /// A hash that splits the release in two non-empty halves `(start, at]` and
    /// `(at, start]` (`start` the lowest piece begin): the begin of the middle
    /// piece, or, for a single piece, the middle of its floors' hashes.
    fn split_point(&self) -> Option<u32> {
        let mut begins: Vec<u32> = self.pieces.iter().map(|p| p.range.begin).collect();
        begins.sort_unstable();
        begins.dedup();
        if begins.len() > 1 {
            return Some(begins[begins.len() / 2]);
        }
        let piece = self.pieces.first()?.range;
        let mut hashes: Vec<u32> = self
            .floors
            .iter()
            .map(|f| &f.actor)
            .chain(self.noticed.iter().map(|n| &n.actor))
            .map(|actor| rollcall_membership_core::actor_hash(actor))
            .filter(|h| piece.contains(*h))
            .collect();
        // In ring order from the piece's begin.
        hashes.sort_unstable_by_key(|h| h.wrapping_sub(piece.begin));
        hashes.dedup();
        if hashes.len() < 2 {
            return None;
        }
        Some(hashes[hashes.len() / 2 - 1])
    }

    /// This release without the hashes of `cut`; `None` if nothing is left.
    pub fn without(&self, cut: &[RingRange]) -> Option<Release> {
        self.cut(&subtract(WHOLE_RING, cut))
    }

    /// This release cut down to the hashes of `keep`, as a fresh message (no hops);
    /// `None` if nothing is left.
    pub fn within(&self, keep: RingRange) -> Option<Release> {
        self.cut(&[keep]).map(|r| Release { hops: 0, ..r })
    }

    /// This release as it bears on `viewer`'s holds: meant for a third silo, it is
    /// not the last word on its pieces (that silo had them next), so its pieces
    /// name that silo to wait for, keeping their floor for a chain that comes back
    /// (rule 5 of the module docs), and its per-reminder floors go.
    pub fn seen_by(self, viewer: SiloAddress) -> Release {
        match self.to {
            Some(to) if to != viewer => Release {
                pieces: self
                    .pieces
                    .iter()
                    .map(|p| ReleasedPiece {
                        waiting_for: p.waiting_for.or(Some(to)),
                        ..*p
                    })
                    .collect(),
                floors: Vec::new(),
                ..self
            },
            _ => self,
        }
    }
}

/// Where the pieces of `r` that a third silo owns in `ring` go on to: one release
/// per such silo (not `me`, not the sender), one hop more (rule 3 of the module
/// docs); nothing past [`MAX_RELEASE_HOPS`].
pub fn forwards(r: &Release, ring: &Ring, me: SiloAddress) -> Vec<(SiloAddress, Release)> {
    if r.hops >= MAX_RELEASE_HOPS {
        return Vec::new();
    }
    ring.silos()
        .into_iter()
        .filter(|silo| *silo != me && *silo != r.from)
        .filter_map(|silo| {
            let theirs = ring.ranges_of(&silo);
            let on = r.cut(&theirs)?;
            Some((
                silo,
                Release {
                    hops: r.hops + 1,
                    ..on
                },
            ))
        })
        .collect()
}

/// What `me` answers to a [`ReleaseRequest`] (rule 5 of the module docs), given
/// its ring and previous ring and the releases it sent and received: for each
/// piece the asker waits on `me` for, what `me` released of it (its own holds
/// resolved by releases it received since, then [seen by](Release::seen_by) the
/// asker), and for the rest it owns neither now nor by a release, the owner in its
/// previous ring (none, or the asker: take them at once); for each piece the asker
/// waits on a gone silo for, that silo's releases `me` received.
#[allow(clippy::too_many_arguments)]
pub fn answer(
    r: &ReleaseRequest,
    me: SiloAddress,
    now: Timestamp,
    ring: &Ring,
    prev_ring: &Ring,
    sent: &std::collections::VecDeque<Release>,
    received: &std::collections::VecDeque<Release>,
) -> Vec<Release> {
    let asker = r.from;
    let mut again: Vec<Release> = Vec::new();
    let mut elsewhere = Vec::new();
    let mine_now = ring.ranges_of(&me);
    for (piece, from) in &r.waiting {
        if *from != me {
            // A third silo's releases, passed on only once it is gone (alive, it
            // answers itself and knows best).
            if r.gone.contains(from) {
                again.extend(
                    received
                        .iter()
                        .filter(|rel| rel.from == *from)
                        .filter_map(|rel| rel.within(*piece))
                        .map(|rel| rel.seen_by(asker)),
                );
            }
            continue;
        }
        let mut covered: Vec<RingRange> = mine_now.clone();
        for rel in sent {
            if let Some(c) = rel.within(*piece) {
                covered.extend(c.pieces.iter().map(|p| p.range));
                let (c, moved) = moved_on(c, prev_ring, me, asker);
                elsewhere.extend(moved);
                if let Some(c) = c {
                    again.extend(
                        resolve_chain(c, received, me)
                            .into_iter()
                            .map(|rel| rel.seen_by(asker)),
                    );
                }
            }
        }
        for rest in subtract(*piece, &covered) {
            if prev_ring.is_empty() {
                // One ring so far, which did not give `me` these pieces: it never
                // delivered there and knows nobody who did (two silos that started
                // together both hold on each other).
                elsewhere.push(ReleasedPiece {
                    range: rest,
                    floor: None,
                    waiting_for: None,
                });
                continue;
            }
            for before in prev_ring.silos().into_iter().filter(|b| *b != me) {
                for owned in prev_ring.ranges_of(&before) {
                    for range in intersect(rest, owned) {
                        // The asker itself had them before: its service did not
                        // run then (it started on a silo already Active).
                        elsewhere.push(ReleasedPiece {
                            range,
                            floor: None,
                            waiting_for: (before != asker).then_some(before),
                        });
                    }
                }
            }
        }
    }
    if !elsewhere.is_empty() {
        again.push(Release {
            service: r.service.clone(),
            from: me,
            at: now.as_millis(),
            pieces: elsewhere,
            floors: Vec::new(),
            hops: 0,
            last: false,
            to: Some(asker),
            via: None,
            scope: None,
            noticed: Vec::new(),
        });
    }
    again
}

/// Splits a release `me` sent to one silo by what `me` saw next: pieces that a
/// third silo owns in `me`'s previous ring (not the receiver, not the asker, not
/// `me`) went on from the receiver to that silo in a ring `me` saw later, so the
/// release is not the last word on them. Those are answered as "wait for that
/// silo", with no floor: the receiver and the silos after it delivered there
/// since, so the release's floor is no fallback. (Found by the property tests: an
/// old release answered for a piece whose later owner had crashed, and the
/// asker, settling it as a chain that came back, delivered the occurrences since
/// that old floor a second time.)
fn moved_on(
    rel: Release,
    prev_ring: &Ring,
    me: SiloAddress,
    asker: SiloAddress,
) -> (Option<Release>, Vec<ReleasedPiece>) {
    let Some(to) = rel.to else {
        return (Some(rel), Vec::new());
    };
    if prev_ring.is_empty() {
        return (Some(rel), Vec::new());
    }
    let mut moved = Vec::new();
    let mut cut = Vec::new();
    for p in &rel.pieces {
        for silo in prev_ring.silos() {
            if silo == to || silo == asker || silo == me {
                continue;
            }
            for owned in prev_ring.ranges_of(&silo) {
                for range in intersect(p.range, owned) {
                    cut.push(range);
                    moved.push(ReleasedPiece {
                        range,
                        floor: None,
                        waiting_for: Some(silo),
                    });
                }
            }
        }
    }
    if moved.is_empty() {
        return (Some(rel), moved);
    }
    (rel.without(&cut), moved)
}

/// A release of `me`'s whose pieces name a silo `me` was waiting for when it let
/// them go: where `me` has since received that silo's release of them (meant for
/// `me`), those pieces carry that release's floor instead (`me` delivered nothing
/// there, so the floor it inherited is the one to pass on).
fn resolve_chain(
    rel: Release,
    received: &std::collections::VecDeque<Release>,
    me: SiloAddress,
) -> Vec<Release> {
    if rel.pieces.iter().all(|p| p.waiting_for.is_none()) {
        return vec![rel];
    }
    let mut out = Vec::new();
    let mut left = Vec::new();
    for p in &rel.pieces {
        let Some(w) = p.waiting_for else {
            left.push(*p);
            continue;
        };
        let mut rest = vec![p.range];
        for got in received.iter().filter(|r| r.from == w && r.to == Some(me)) {
            for piece in &got.pieces {
                for r in std::mem::take(&mut rest) {
                    for range in intersect(r, piece.range) {
                        out.push(Release {
                            pieces: vec![ReleasedPiece { range, ..*piece }],
                            floors: got.floors.clone(),
                            ..rel.clone()
                        });
                    }
                    rest.extend(subtract(r, &[piece.range]));
                }
            }
        }
        left.extend(rest.into_iter().map(|range| ReleasedPiece { range, ..*p }));
    }
    if !left.is_empty() {
        out.push(Release { pieces: left, ..rel });
    }
    out
}

/// Keeps `buffer` (releases, oldest first, at most `cap`) true of the latest
/// release of each sender: `newer` replaces what older releases of its sender said
/// about its pieces (a silo that released a piece, took it back and released it
/// again stopped at the later time).
pub fn remember(buffer: &mut std::collections::VecDeque<Release>, newer: Release, cap: usize) {
    let cut: Vec<RingRange> = newer.pieces.iter().map(|p| p.range).collect();
    let old = std::mem::take(buffer);
    buffer.extend(old.into_iter().filter_map(|r| {
        if r.from == newer.from {
            r.without(&cut)
        } else {
            Some(r)
        }
    }));
    while buffer.len() >= cap.max(1) {
        buffer.pop_front();
    }
    buffer.push_back(newer);
}

/// Where a reminder's schedule starts, as the holds say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Not in a held range: plan it as usual.
    Free,
    /// In a range still held: deliver nothing yet.
    Held,
    /// Freed by a release: the first occurrence at or after this time (inclusive).
    From(Timestamp),
}

type Floors = Arc<BTreeMap<(String, String), (String, Timestamp)>>;

#[derive(Clone, Debug)]
enum HoldState {
    Waiting,
    Released { floor: Timestamp, floors: Floors },
    Failover,
}

/// A range this silo gained and may not deliver yet (or has freed but not yet
/// loaded in full).
#[derive(Clone, Debug)]
struct Hold {
    range: RingRange,
    from: SiloAddress,
    since: Timestamp,
    /// The load epoch current when the hold was made: a load with a later epoch
    /// that finishes has read every row of the range.
    epoch: u32,
    loaded: bool,
    state: HoldState,
    /// The silos this hold waited for before `from` (each named the next one).
    visited: Vec<SiloAddress>,
    /// The floor of the release a silo passed on to another silo than this one
    /// (it delivered up to there; the silos after it held the pieces).
    fallback: Option<u64>,
}

/// The holds of one silo's reminder service.
#[derive(Clone, Debug, Default)]
pub struct Holds {
    /// Oldest first; a newer hold over the same hashes wins.
    holds: Vec<Hold>,
}

/// What a piece of a range to release is, under the holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Custody {
    /// Not held: the silo delivered there up to the release.
    Free,
    /// Still held, waiting for this silo's release: the silo delivered nothing
    /// there. The floor (ms) is the one a silo earlier in the chain passed on
    /// while naming another silo to wait for, if any: the receiver uses it when the
    /// chain comes back to it (rule 4).
    Held(SiloAddress, Option<u64>),
    /// Freed with this floor (`None`: as after a crash), not loaded in full since:
    /// the silo delivered only what it had scheduled there.
    Inherited(Option<Timestamp>),
}

/// The pieces where ownership differs between `old` and `new`: `(piece, old owner,
/// new owner)`, adjacent pieces with the same pair merged.
pub fn transfers(old: &Ring, new: &Ring) -> Vec<(RingRange, Option<SiloAddress>, Option<SiloAddress>)> {
    let mut bounds: Vec<u32> = old.points().chain(new.points()).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut out: Vec<(RingRange, Option<SiloAddress>, Option<SiloAddress>)> = Vec::new();
    let n = bounds.len();
    for k in 0..n {
        let end = bounds[k];
        let begin = bounds[(k + n - 1) % n];
        let (a, b) = (old.owner_of(end), new.owner_of(end));
        if a == b {
            continue;
        }
        match out.last_mut() {
            Some((r, oa, ob)) if *oa == a && *ob == b && r.end == begin => r.end = end,
            _ => out.push((RingRange { begin, end }, a, b)),
        }
    }
    // A single bound: the piece (b, b] is the whole ring.
    out
}

/// A range as inclusive intervals of `0..2^32`.
fn linear(r: RingRange) -> Vec<(u64, u64)> {
    let (b, e) = (u64::from(r.begin), u64::from(r.end));
    let max = u64::from(u32::MAX);
    if b < e {
        vec![(b + 1, e)]
    } else if b == e {
        vec![(0, max)]
    } else {
        let mut v = vec![(0, e)];
        if b < max {
            v.push((b + 1, max));
        }
        v
    }
}

fn ring_range(lo: u64, hi: u64) -> RingRange {
    RingRange {
        begin: if lo == 0 { u32::MAX } else { (lo - 1) as u32 },
        end: hi as u32,
    }
}

/// The hashes both ranges hold, as ranges.
pub fn intersect(a: RingRange, b: RingRange) -> Vec<RingRange> {
    let mut out = Vec::new();
    for (alo, ahi) in linear(a) {
        for (blo, bhi) in linear(b) {
            let (lo, hi) = (alo.max(blo), ahi.min(bhi));
            if lo <= hi {
                out.push(ring_range(lo, hi));
            }
        }
    }
    out
}

/// The hashes of `a` that none of `cut` holds, as ranges.
pub fn subtract(a: RingRange, cut: &[RingRange]) -> Vec<RingRange> {
    let mut left = linear(a);
    for c in cut {
        for (clo, chi) in linear(*c) {
            left = left
                .into_iter()
                .flat_map(|(lo, hi)| {
                    if chi < lo || clo > hi {
                        return vec![(lo, hi)];
                    }
                    let mut v = Vec::new();
                    if clo > lo {
                        v.push((lo, clo - 1));
                    }
                    if chi < hi {
                        v.push((chi + 1, hi));
                    }
                    v
                })
                .collect();
        }
    }
    left.into_iter().map(|(lo, hi)| ring_range(lo, hi)).collect()
}

impl Holds {
    /// Whether no range is held or waiting for a load.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }

    /// Whether some range waits for a release.
    pub fn waiting(&self) -> bool {
        self.holds.iter().any(|h| matches!(h.state, HoldState::Waiting))
    }

    /// The held pieces, each with the silo whose release it waits for.
    pub fn waiting_pieces(&self) -> Vec<(RingRange, SiloAddress)> {
        self.holds
            .iter()
            .filter(|h| matches!(h.state, HoldState::Waiting))
            .map(|h| (h.range, h.from))
            .collect()
    }

    /// The silos whose releases some range waits for.
    pub fn waiting_for(&self) -> Vec<SiloAddress> {
        let mut v: Vec<SiloAddress> = self
            .holds
            .iter()
            .filter(|h| matches!(h.state, HoldState::Waiting))
            .map(|h| h.from)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Holds the pieces `me` gains from `old` to `new` (`old` empty: `new` without
    /// `me`, as for a joiner). Returns what `me` loses, with the new owners.
    pub fn ring_changed(
        &mut self,
        old: &Ring,
        new: &Ring,
        me: SiloAddress,
        now: Timestamp,
        epoch: u32,
    ) -> Vec<(RingRange, SiloAddress)> {
        let without_me;
        let old = if old.is_empty() {
            without_me = new.without(&me);
            &without_me
        } else {
            old
        };
        let mut lost = Vec::new();
        for (range, was, is) in transfers(old, new) {
            if is == Some(me) {
                if let Some(from) = was.filter(|w| *w != me) {
                    self.holds.push(Hold {
                        range,
                        from,
                        since: now,
                        epoch,
                        loaded: false,
                        state: HoldState::Waiting,
                        visited: Vec::new(),
                        fallback: None,
                    });
                }
            } else if was == Some(me) {
                if let Some(to) = is {
                    lost.push((range, to));
                }
            }
        }
        lost
    }

    /// Drops the holds over hashes `me` does not own in `ring` any more (call after
    /// the releases of what it lost were built).
    pub fn keep_owned(&mut self, ring: &Ring, me: SiloAddress) {
        let mine = ring.ranges_of(&me);
        let mut kept = Vec::new();
        for h in self.holds.drain(..) {
            for m in &mine {
                for range in intersect(h.range, *m) {
                    kept.push(Hold { range, ..h.clone() });
                }
            }
        }
        self.holds = kept;
    }

    /// Where the schedule of a reminder at `hash` starts.
    pub fn start_of(&self, hash: u32, actor: &str, name: &str, etag: &str) -> Start {
        let Some(h) = self.holds.iter().rev().find(|h| h.range.contains(hash)) else {
            return Start::Free;
        };
        match &h.state {
            HoldState::Waiting => Start::Held,
            HoldState::Failover => Start::Free,
            HoldState::Released { floor, floors } => match floors.get(&(actor.to_owned(), name.to_owned())) {
                Some((e, next)) if e == etag => Start::From(*next),
                _ => Start::From(*floor),
            },
        }
    }

    /// The per-reminder floors inherited over `range` by holds freed by a release
    /// and not loaded yet, for the reminders whose hash lies in `range` (newest
    /// hold wins): a release of such a piece passes them on with the piece's
    /// floor, whether or not this silo scheduled the reminder yet.
    pub fn inherited_floors(&self, range: RingRange) -> Vec<Floor> {
        let mut out: BTreeMap<(String, String), Floor> = BTreeMap::new();
        for h in &self.holds {
            let HoldState::Released { floors, .. } = &h.state else {
                continue;
            };
            if h.loaded || intersect(h.range, range).is_empty() {
                continue;
            }
            for ((actor, name), (etag, next)) in floors.iter() {
                let hash = rollcall_membership_core::actor_hash(actor);
                if h.range.contains(hash) && range.contains(hash) {
                    out.insert(
                        (actor.clone(), name.clone()),
                        Floor {
                            actor: actor.clone(),
                            name: name.clone(),
                            etag: etag.clone(),
                            next: next.as_millis(),
                        },
                    );
                }
            }
        }
        out.into_values().collect()
    }

    /// What each part of `range` is under the holds (newest hold wins).
    ///
    /// (See [`Custody`].)
    pub fn custody(&self, range: RingRange) -> Vec<(RingRange, Custody)> {
        let mut pieces = vec![(range, Custody::Free)];
        for h in &self.holds {
            let state = match &h.state {
                HoldState::Waiting => Custody::Held(h.from, h.fallback),
                HoldState::Released { floor, .. } if !h.loaded => Custody::Inherited(Some(*floor)),
                HoldState::Failover if !h.loaded => Custody::Inherited(None),
                _ => Custody::Free,
            };
            let mut next = Vec::new();
            for (p, c) in pieces {
                for inside in intersect(p, h.range) {
                    next.push((inside, state));
                }
                for outside in subtract(p, &[h.range]) {
                    next.push((outside, c));
                }
            }
            pieces = next;
        }
        pieces
    }

    /// Applies a release received by `me`: frees the parts of the holds waiting for
    /// `r.from` that its pieces cover (a piece the sender still held makes them
    /// wait for the silo it waited for; for `me` itself, a failover). Returns
    /// whether any hold changed.
    pub fn released(&mut self, r: &Release, me: SiloAddress) -> bool {
        let floors: Floors = Arc::new(
            r.floors
                .iter()
                .map(|f| {
                    (
                        (f.actor.clone(), f.name.clone()),
                        (f.etag.clone(), Timestamp::from_millis(f.next)),
                    )
                })
                .collect(),
        );
        let covered: Vec<RingRange> = r.pieces.iter().map(|p| p.range).collect();
        let mut changed = false;
        let mut out = Vec::with_capacity(self.holds.len());
        for h in self.holds.drain(..) {
            if h.from != r.from || !matches!(h.state, HoldState::Waiting) {
                out.push(h);
                continue;
            }
            for p in &r.pieces {
                for range in intersect(h.range, p.range) {
                    changed = true;
                    // Floors only move forward: of the floor this piece carries
                    // and the one the chain carried so far, the later (both were
                    // delivered up to by a silo of the chain). (Found by a seed: a
                    // chain back to this silo took an older release's floor over
                    // the later one of the silo that delivered last: four ticks
                    // repeated.)
                    let fallback = match (p.floor, h.fallback) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    };
                    let released = |floor: u64| HoldState::Released {
                        floor: Timestamp::from_millis(floor),
                        floors: if p.waiting_for.is_none() {
                            floors.clone()
                        } else {
                            Floors::default()
                        },
                    };
                    let (state, from) = match (p.waiting_for, p.floor) {
                        // The chain of silos that held the pieces came back to
                        // one it named before (or to `me`): none of them
                        // delivered; the last silo that did passed on its floor.
                        (Some(w), _) if w == me || w == h.from || h.visited.contains(&w) => match fallback {
                            Some(f) => (released(f), h.from),
                            None => (HoldState::Failover, h.from),
                        },
                        (Some(w), _) => (HoldState::Waiting, w),
                        (None, None) => (HoldState::Failover, h.from),
                        // The chain's fallback is a floor too: a silo it went
                        // through delivered up to it (this floor may come from
                        // an older release, where the chain came back here).
                        (None, Some(floor)) => (released(floor.max(h.fallback.unwrap_or(floor))), h.from),
                    };
                    let mut visited = h.visited.clone();
                    if from != h.from {
                        visited.push(h.from);
                    }
                    out.push(Hold {
                        range,
                        state,
                        from,
                        visited,
                        fallback,
                        ..h.clone()
                    });
                }
            }
            for range in subtract(h.range, &covered) {
                out.push(Hold { range, ..h.clone() });
            }
        }
        self.holds = out;
        changed
    }

    /// The silo of `last` (its last release) is gone: the parts of the holds
    /// waiting for it that `last` does not cover it did not own at the end (its
    /// view skipped the ring that gave them to it), so they take the newest of
    /// `others` (releases of other silos) that covers them, made at most
    /// [`HANDOFF_TIMEOUT`] before `last`: a view catches up well within that, and
    /// an older release was followed by an owner that delivered there (if that
    /// one crashed, its pieces fail over). Returns whether a hold changed.
    pub fn settle_with_last(
        &mut self,
        last: &Release,
        others: &[Release],
        me: SiloAddress,
        owned_by_others_since: impl Fn(&Release, RingRange) -> Vec<RingRange>,
    ) -> bool {
        // Hashes outside its scope it says nothing of (a forwarded or answered
        // part of the last release).
        let mut taken: Vec<RingRange> = last.pieces.iter().map(|p| p.range).collect();
        if let Some(scope) = &last.scope {
            taken.extend(subtract(WHOLE_RING, scope));
        }
        let oldest = last.at.saturating_sub(duration_millis(HANDOFF_TIMEOUT));
        let mut sorted: Vec<&Release> = others
            .iter()
            .filter(|r| r.from != last.from && r.at >= oldest)
            .collect();
        sorted.sort_by_key(|r| std::cmp::Reverse(r.at));
        let mut pieces = Vec::new();
        let mut floors: Vec<Floor> = Vec::new();
        for r in sorted {
            // Where a third silo owned the pieces since `r` (in a ring of
            // `me`'s), it may have delivered there: neither `r` nor an older
            // release settles them.
            let original = r;
            let r = r.clone().seen_by(me);
            let mut used = false;
            for p in &r.pieces {
                for range in subtract(p.range, &taken) {
                    let blocked = owned_by_others_since(original, range);
                    for part in subtract(range, &blocked) {
                        pieces.push(ReleasedPiece { range: part, ..*p });
                        used = true;
                    }
                    taken.push(range);
                }
            }
            if used {
                floors.extend(r.floors);
            }
        }
        if pieces.is_empty() {
            return false;
        }
        let settled = Release {
            pieces,
            floors,
            ..last.clone()
        };
        self.released(&settled, me)
    }

    /// Frees, as a failover, the holds waiting for a silo that `gone_since` says
    /// has been Dead since at least [`HANDOFF_GRACE`] ago, and every hold
    /// older than [`HANDOFF_TIMEOUT`]. Returns whether a hold was freed, and the
    /// silos given up on after the timeout while not gone (to log).
    pub fn expire(
        &mut self,
        now: Timestamp,
        gone_since: impl Fn(&SiloAddress) -> Option<Timestamp>,
    ) -> (bool, Vec<SiloAddress>) {
        let mut changed = false;
        let mut timed_out = Vec::new();
        for h in &mut self.holds {
            if !matches!(h.state, HoldState::Waiting) {
                continue;
            }
            let age = now.saturating_duration_since(h.since);
            let dead = gone_since(&h.from).is_some_and(|t| now.saturating_duration_since(t) >= HANDOFF_GRACE);
            if dead || age >= HANDOFF_TIMEOUT {
                if !dead {
                    timed_out.push(h.from);
                }
                h.state = HoldState::Failover;
                changed = true;
            }
        }
        timed_out.sort_unstable();
        timed_out.dedup();
        (changed, timed_out)
    }

    /// A load of epoch `epoch` finished: the holds made before it started are
    /// loaded; freed and loaded holds are dropped.
    pub fn load_finished(&mut self, epoch: u32) {
        for h in &mut self.holds {
            if epoch.wrapping_sub(h.epoch) as i32 > 0 {
                h.loaded = true;
            }
        }
        self.holds
            .retain(|h| !h.loaded || matches!(h.state, HoldState::Waiting));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn silo(n: u8) -> SiloAddress {
        format!("10.0.0.{n}:11111@1").parse().unwrap()
    }

    fn r(begin: u32, end: u32) -> RingRange {
        RingRange { begin, end }
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn contains_any(rs: &[RingRange], h: u32) -> bool {
        rs.iter().any(|x| x.contains(h))
    }

    proptest! {
        #[test]
        fn intersect_and_subtract_agree_with_contains(a in any::<(u32, u32)>(), b in any::<(u32, u32)>(), hs in proptest::collection::vec(any::<u32>(), 64)) {
            let (a, b) = (r(a.0, a.1), r(b.0, b.1));
            let both = intersect(a, b);
            let left = subtract(a, &[b]);
            for h in hs.into_iter().chain([a.begin, a.end, b.begin, b.end, 0, u32::MAX]) {
                prop_assert_eq!(contains_any(&both, h), a.contains(h) && b.contains(h), "{}", h);
                prop_assert_eq!(contains_any(&left, h), a.contains(h) && !b.contains(h), "{}", h);
            }
        }

        #[test]
        fn transfers_name_every_hash_whose_owner_changed(old in proptest::collection::btree_set(1u8..8, 0..5), new in proptest::collection::btree_set(1u8..8, 0..5), hs in proptest::collection::vec(any::<u32>(), 128)) {
            let old = Ring::new(old.into_iter().map(silo), 4);
            let new = Ring::new(new.into_iter().map(silo), 4);
            let moved = transfers(&old, &new);
            for h in hs {
                let found: Vec<_> = moved.iter().filter(|(r, _, _)| r.contains(h)).collect();
                if old.owner_of(h) == new.owner_of(h) {
                    prop_assert!(found.is_empty());
                } else {
                    prop_assert_eq!(found.len(), 1);
                    prop_assert_eq!((found[0].1, found[0].2), (old.owner_of(h), new.owner_of(h)));
                }
            }
        }
    }

    #[test]
    fn a_joiner_holds_what_it_gains_until_each_previous_owner_releases_it() {
        let (a, b, j) = (silo(1), silo(2), silo(3));
        let new = Ring::new([a, b, j], 8);
        let mut holds = Holds::default();
        // A joiner's first ring: gained from the ring without it.
        let lost = holds.ring_changed(&Ring::default(), &new, j, t(1_000), 1);
        assert!(lost.is_empty());
        let mine = new.ranges_of(&j);
        let h = mine[0].end;
        let prev = new.without(&j).owner_of(h).unwrap();
        assert_eq!(holds.start_of(h, "c/1", "r", "e1"), Start::Held);
        // The old owner's view: it loses exactly those pieces to j.
        let mut old_holds = Holds::default();
        let old_ring = new.without(&j);
        old_holds.ring_changed(&Ring::new([a, b], 8), &old_ring, prev, t(0), 0);
        let lost = old_holds.ring_changed(&old_ring, &new, prev, t(1_200), 1);
        assert!(lost.iter().all(|(_, to)| *to == j));
        assert!(lost.iter().any(|(r, _)| r.contains(h)));
        let release = Release {
            service: "s".into(),
            from: prev,
            at: 1_200,
            pieces: lost
                .iter()
                .map(|(range, _)| ReleasedPiece {
                    range: *range,
                    floor: Some(1_201),
                    waiting_for: None,
                })
                .collect(),
            floors: vec![Floor {
                actor: "c/1".into(),
                name: "r".into(),
                etag: "e1".into(),
                next: 1_100,
            }],
            hops: 0,
            last: false,
            to: Some(j),
            via: None,
            scope: None,
            noticed: Vec::new(),
        };
        assert!(holds.released(&release, j));
        assert_eq!(holds.start_of(h, "c/1", "r", "e1"), Start::From(t(1_100)));
        assert_eq!(holds.start_of(h, "c/1", "r", "e2"), Start::From(t(1_201)));
        assert_eq!(holds.start_of(h, "c/2", "r", "e1"), Start::From(t(1_201)));
        // A load started after the hold finishes: the hold is dropped once every
        // previous owner released.
        holds.load_finished(2);
        assert_eq!(holds.start_of(h, "c/1", "r", "e1"), Start::Free);
    }

    #[test]
    fn a_dead_previous_owner_fails_over_after_the_grace_and_a_silent_one_after_the_timeout() {
        let (a, b) = (silo(1), silo(2));
        let mut holds = Holds::default();
        let two = Ring::new([a, b], 8);
        holds.ring_changed(&two, &Ring::new([b], 8), b, t(0), 1);
        let h = two.ranges_of(&a)[0].end;
        assert_eq!(holds.start_of(h, "c/1", "r", "e"), Start::Held);
        let gone = |s: &SiloAddress| (*s == a).then_some(t(200));
        assert!(!holds.expire(t(1_000), gone).0, "within the grace");
        assert!(holds.expire(t(1_200), gone).0);
        assert_eq!(holds.start_of(h, "c/1", "r", "e"), Start::Free);
        // Alive but silent: the timeout.
        let mut holds = Holds::default();
        holds.ring_changed(&two, &Ring::new([b], 8), b, t(0), 1);
        assert!(!holds.expire(t(9_999), |_| None).0);
        let (changed, silent) = holds.expire(t(10_000), |_| None);
        assert!(changed);
        assert_eq!(silent, vec![a]);
    }

    fn release(from: SiloAddress, to: Option<SiloAddress>, ranges: &[RingRange]) -> Release {
        Release {
            service: "s".into(),
            from,
            at: 100,
            pieces: ranges
                .iter()
                .map(|range| ReleasedPiece {
                    range: *range,
                    floor: Some(101),
                    waiting_for: None,
                })
                .collect(),
            floors: vec![Floor {
                actor: "c/1".into(),
                name: "r".into(),
                etag: "e".into(),
                next: 90,
            }],
            hops: 0,
            last: false,
            to,
            via: None,
            scope: None,
            noticed: Vec::new(),
        }
    }

    #[test]
    fn a_release_meant_for_a_third_silo_names_it_and_keeps_its_floor() {
        let (a, b, c) = (silo(1), silo(2), silo(3));
        let rel = release(a, Some(b), &[r(0, 10)]);
        assert_eq!(rel.clone().seen_by(b), rel, "meant for the viewer: unchanged");
        let seen = rel.seen_by(c);
        assert_eq!(seen.pieces[0].waiting_for, Some(b));
        assert_eq!(seen.pieces[0].floor, Some(101));
        assert!(seen.floors.is_empty());
        // A leaver's last release is meant for everyone.
        let last = Release {
            to: None,
            last: true,
            ..release(a, None, &[r(0, 10)])
        };
        assert_eq!(last.clone().seen_by(c), last);
    }

    #[test]
    fn forwards_go_to_the_owners_of_the_pieces_and_stop_after_the_hops() {
        let (a, b, c) = (silo(1), silo(2), silo(3));
        let ring = Ring::new([a, b, c], 8);
        let whole = release(a, Some(b), &[r(5, 5)]);
        let out = forwards(&whole, &ring, b);
        assert_eq!(out.len(), 1, "neither to b itself nor back to a");
        let (to, fwd) = &out[0];
        assert_eq!(*to, c);
        assert_eq!(fwd.hops, 1);
        for h in [0u32, 1 << 20, 1 << 31, u32::MAX] {
            assert_eq!(
                fwd.pieces.iter().any(|p| p.range.contains(h)),
                ring.owns(&c, h),
                "{h}"
            );
        }
        let tired = Release {
            hops: MAX_RELEASE_HOPS,
            ..whole
        };
        assert!(forwards(&tired, &ring, b).is_empty());
    }

    #[test]
    fn a_cut_release_knows_the_hashes_it_speaks_for() {
        let (a, b, c) = (silo(1), silo(2), silo(3));
        let whole = Release {
            last: true,
            to: None,
            ..release(a, None, &[r(0, 100), r(200, 300)])
        };
        assert_eq!(whole.without(&[]).map(|x| x.pieces), Some(whole.pieces.clone()));
        // Any other release speaks for every hash, cut or not.
        assert_eq!(
            release(a, Some(b), &[r(0, 100)]).within(r(0, 50)).unwrap().scope,
            None
        );
        let part = whole.within(r(50, 250)).unwrap();
        assert_eq!(part.scope, Some(vec![r(50, 250)]));
        let smaller = part.without(&[r(60, 240)]).unwrap();
        let scope = smaller.scope.clone().unwrap();
        for h in [55u32, 245] {
            assert!(scope.iter().any(|k| k.contains(h)), "{h}");
        }
        for h in [10u32, 100, 150, 260] {
            assert!(!scope.iter().any(|k| k.contains(h)), "{h}");
        }
        // Forwarded: the part the next owner has in the forwarder's ring.
        let ring = Ring::new([a, b, c], 8);
        let all = Release {
            last: true,
            to: None,
            ..release(a, None, &[r(5, 5)])
        };
        for (to, fwd) in forwards(&all, &ring, b) {
            for h in [0u32, 1 << 20, 1 << 31, u32::MAX] {
                assert_eq!(
                    fwd.scope.as_ref().unwrap().iter().any(|k| k.contains(h)),
                    ring.owns(&to, h)
                );
            }
        }
    }

    #[test]
    fn a_release_too_large_for_the_transport_goes_in_parts_that_fit() {
        let (a, b) = (silo(1), silo(2));
        let pieces: Vec<RingRange> = (0..40u32)
            .map(|i| r(i * 100_000_000, i * 100_000_000 + 50_000_000))
            .collect();
        let floors: Vec<Floor> = (0..120)
            .map(|i| {
                let actor = format!("cart/{i}");
                Floor {
                    actor,
                    name: "tick".into(),
                    etag: "7".into(),
                    next: 1_000 + i,
                }
            })
            .collect();
        // Only floors inside the pieces travel; keep those.
        let big = Release {
            last: true,
            to: None,
            floors: floors
                .into_iter()
                .filter(|f| {
                    pieces
                        .iter()
                        .any(|p| p.contains(rollcall_membership_core::actor_hash(&f.actor)))
                })
                .collect(),
            ..release(a, None, &pieces)
        };
        assert!(
            serde_json::to_vec(&HandoffMessage::Release(big.clone()))
                .unwrap()
                .len()
                > 1_000
        );
        let parts = HandoffMessage::Release(big.clone()).fit(1_000);
        assert!(parts.len() > 1);
        let mut hashes_seen = 0;
        let mut floors_seen = Vec::new();
        for part in &parts {
            assert!(serde_json::to_vec(part).unwrap().len() <= 1_000);
            let HandoffMessage::Release(p) = part else {
                panic!("a release")
            };
            assert!(p.scope.is_some(), "a part of a last release is not the whole");
            for f in &p.floors {
                let h = rollcall_membership_core::actor_hash(&f.actor);
                assert!(
                    p.pieces.iter().any(|q| q.range.contains(h)),
                    "a floor travels with its piece"
                );
                floors_seen.push(f.actor.clone());
            }
            hashes_seen += p.pieces.iter().map(|q| q.range.size()).sum::<u64>();
        }
        assert_eq!(
            hashes_seen,
            big.pieces.iter().map(|q| q.range.size()).sum::<u64>()
        );
        floors_seen.sort();
        let mut want: Vec<String> = big.floors.iter().map(|f| f.actor.clone()).collect();
        want.sort();
        assert_eq!(floors_seen, want, "every floor once");
        // A request goes in parts of its waiting pieces.
        let request = ReleaseRequest {
            service: "s".into(),
            from: b,
            waiting: pieces.iter().map(|p| (*p, a)).collect(),
            gone: vec![a],
            version: 3,
        };
        let parts = HandoffMessage::Request(request).fit(600);
        assert!(parts.len() > 1);
        let mut waiting = 0;
        for part in &parts {
            assert!(serde_json::to_vec(part).unwrap().len() <= 600);
            let HandoffMessage::Request(q) = part else {
                panic!("a request")
            };
            waiting += q.waiting.len();
        }
        assert_eq!(waiting, pieces.len());
    }

    #[test]
    fn a_last_release_settles_only_the_hashes_it_speaks_for() {
        let (g, o, me) = (silo(1), silo(2), silo(3));
        let waiting = |holds: &mut Holds| holds.holds.push(waiting_hold(r(0, 100), g));
        // Another silo's release of the range, made shortly before the gone
        // silo's last one (which does not name the range).
        let other = release(o, None, &[r(0, 100)]);
        let last = Release {
            last: true,
            at: 200,
            ..release(g, None, &[r(500, 600)])
        };
        // The whole last release: the gone silo did not own the range at the end.
        let mut holds = Holds::default();
        waiting(&mut holds);
        assert!(holds.settle_with_last(&last, std::slice::from_ref(&other), me, |_, _| Vec::new()));
        assert_eq!(
            holds.start_of(50, "c/1", "r", "x"),
            Start::From(Timestamp::from_millis(101))
        );
        // Only a part of it, forwarded for other hashes: it says nothing here.
        let part = last.within(r(400, 700)).unwrap();
        let mut holds = Holds::default();
        waiting(&mut holds);
        assert!(!holds.settle_with_last(&part, std::slice::from_ref(&other), me, |_, _| Vec::new()));
        assert_eq!(holds.start_of(50, "c/1", "r", "x"), Start::Held);
    }

    /// A hold of `range` waiting for `from` since time 0.
    fn waiting_hold(range: RingRange, from: SiloAddress) -> Hold {
        Hold {
            range,
            from,
            since: t(0),
            epoch: 0,
            loaded: false,
            state: HoldState::Waiting,
            visited: Vec::new(),
            fallback: None,
        }
    }

    #[test]
    fn custody_splits_a_range_by_the_holds_over_it() {
        let (a, b) = (silo(1), silo(2));
        let mut holds = Holds::default();
        holds.holds.push(waiting_hold(r(100, 200), a));
        holds.holds.push(Hold {
            range: r(150, 300),
            from: b,
            since: t(0),
            epoch: 0,
            loaded: false,
            state: HoldState::Released {
                floor: t(7),
                floors: Floors::default(),
            },
            visited: Vec::new(),
            fallback: None,
        });
        let mut got = holds.custody(r(50, 400));
        got.sort_by_key(|(r, _)| r.end);
        assert_eq!(
            got,
            vec![
                (r(50, 100), Custody::Free),
                (r(100, 150), Custody::Held(a, None)),
                (r(150, 200), Custody::Inherited(Some(t(7)))),
                (r(200, 300), Custody::Inherited(Some(t(7)))),
                (r(300, 400), Custody::Free),
            ]
        );
    }
}

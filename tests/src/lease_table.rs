//! Shard lease conformance scenarios: the contract of `LeaseTable`
//! (core `lease.rs`), one scenario per rule.

use std::sync::Arc;

use rollcall_core::lease::{LeaseException, LeaseStatus, LeaseTable, LeaseWrite, ShardLease, ShardLeases};
use rollcall_core::{Error, Etag, Expected, SiloAddress, Timestamp};
use tokio::sync::Barrier;

use crate::{unique_id, Store};

/// Leases of a fresh service with `shards` shards.
pub async fn fresh_leases(store: &Store, shards: u32) -> ShardLeases {
    let table = store.lease_table(&unique_id("leases")).expect("open lease table");
    ShardLeases::open(table, shards).await.expect("open leases")
}

fn silo(port: u16, generation: u64) -> SiloAddress {
    SiloAddress::new(([127, 0, 0, 1], port).into(), generation)
}

/// `lease` acquired by `owner`: the next epoch, owned.
fn acquired(lease: &ShardLease, owner: SiloAddress) -> ShardLease {
    ShardLease {
        epoch: lease.epoch + 1,
        owner: Some(owner),
        status: LeaseStatus::Owned,
        ..lease.clone()
    }
}

/// A shard without a row reads as vacant (epoch 0, released, empty etag);
/// a row written reads back with every field, odd names included.
pub async fn lease_absent_rows_are_vacant_and_rows_round_trip(store: Store) {
    let leases = fresh_leases(&store, 16).await;
    let vacant = leases.read(3).await.unwrap();
    assert_eq!(vacant, ShardLease::vacant(3));
    assert!(vacant.etag.is_empty());

    let mut lease = acquired(&vacant, silo(11111, 1_795_000_000_000));
    lease.watermark = Some(Timestamp::from_millis(1_795_000_000_123));
    lease.read_from = Some(Timestamp::from_millis(1_795_000_000_100));
    lease.listed_from = Some(Timestamp::from_millis(1_795_000_000_000));
    lease.owed_from = Some(Timestamp::from_millis(1_795_000_000_077));
    lease.exceptions = vec![
        LeaseException {
            actor_id: "cart/ä:{x}/\"y\"".into(),
            name: "n\\%/z".into(),
            next: Timestamp::from_millis(1_795_000_000_050),
            etag: Some(Etag::new("e-1")),
            done: false,
        },
        LeaseException {
            actor_id: "cart/1".into(),
            name: "once".into(),
            next: Timestamp::from_millis(1_795_000_000_010),
            etag: Some(Etag::new("e-2")),
            done: true,
        },
    ];
    let etag = leases.write(&lease).await.unwrap().expect("first write");
    assert!(!etag.is_empty());
    let back = leases.read(3).await.unwrap();
    assert_eq!(
        back,
        ShardLease {
            etag: etag.clone(),
            ..lease
        }
    );
    assert_eq!(back.etag, etag);
    assert_eq!(
        leases.read(4).await.unwrap(),
        ShardLease::vacant(4),
        "other shards untouched"
    );
}

/// Every write gives the row an etag it never had; a write with a stale etag
/// or `Absent` over a row is a conflict naming the current etag, and writes
/// nothing.
pub async fn lease_writes_are_compare_and_set(store: Store) {
    let leases = fresh_leases(&store, 8).await;
    let table = leases.table().clone();
    let a = acquired(&ShardLease::vacant(0), silo(1, 1));
    let e1 = leases.write(&a).await.unwrap().unwrap();
    let e2 = leases
        .write(&ShardLease {
            etag: e1.clone(),
            ..acquired(&a, silo(2, 1))
        })
        .await
        .unwrap()
        .unwrap();
    assert_ne!(e1, e2);
    // Stale etag: refused, the current one named.
    let stale = leases
        .write(&ShardLease {
            etag: e1.clone(),
            status: LeaseStatus::Released,
            ..a.clone()
        })
        .await
        .unwrap();
    assert_eq!(stale, Err(Some(e2.clone())));
    // Absent over a row: refused.
    assert_eq!(
        table.write_lease(0, &Expected::Absent, b"{}").await.unwrap(),
        LeaseWrite::Conflict(Some(e2.clone()))
    );
    // An etag on a missing row: refused, no row named.
    assert_eq!(
        table
            .write_lease(1, &Expected::Etag(e2.clone()), b"{}")
            .await
            .unwrap(),
        LeaseWrite::Conflict(None)
    );
    assert_eq!(leases.read(1).await.unwrap(), ShardLease::vacant(1));
    let now = leases.read(0).await.unwrap();
    assert_eq!((now.epoch, now.owner, now.etag), (2, Some(silo(2, 1)), e2));
}

/// Of concurrent acquirers of one shard with one etag (absent, then a row),
/// exactly one wins; the others get a conflict naming the winner's etag.
pub async fn lease_concurrent_acquirers_of_one_etag_have_one_winner(store: Store) {
    const N: usize = 8;
    let leases = fresh_leases(&store, 4).await;
    for round in 0..2 {
        let base = leases.read(2).await.unwrap();
        assert_eq!(base.etag.is_empty(), round == 0);
        let barrier = Arc::new(Barrier::new(N));
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let (leases, base, barrier) = (leases.clone(), base.clone(), barrier.clone());
                tokio::spawn(async move {
                    let mine = acquired(&base, silo(1000 + i as u16, 7));
                    barrier.wait().await;
                    leases.write(&mine).await.unwrap()
                })
            })
            .collect();
        let mut won = Vec::new();
        let mut lost = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(e) => won.push(e),
                Err(current) => lost.push(current),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: exactly one acquirer wins: {won:?}");
        assert!(
            lost.iter().all(|c| c.as_ref() == Some(&won[0])),
            "round {round}: every loser is told the winner's etag: {lost:?}"
        );
        let now = leases.read(2).await.unwrap();
        assert_eq!(now.epoch, base.epoch + 1, "one acquire, one epoch");
        assert_eq!(now.etag, won[0]);
    }
}

/// A row held by an owner (Dead, as the reminder service judges) is taken
/// over by a compare-and-set on the etag it was read with; the old owner's
/// release, written with the etag it acquired with (its stale epoch), fails.
pub async fn lease_release_by_a_stale_epoch_fails(store: Store) {
    let leases = fresh_leases(&store, 4).await;
    let old = silo(1, 1);
    let mut held = acquired(&ShardLease::vacant(1), old);
    held.etag = leases.write(&held).await.unwrap().unwrap();
    // A successor reads the row (owned by a silo it sees Dead) and takes it.
    let seen = leases.read(1).await.unwrap();
    let mut taken = acquired(&seen, silo(2, 1));
    taken.watermark = Some(Timestamp::from_millis(5));
    taken.etag = leases.write(&taken).await.unwrap().unwrap();
    assert_eq!(taken.epoch, 2);
    // The old owner, back from a pause, releases with its stale etag.
    let release = ShardLease {
        status: LeaseStatus::Released,
        watermark: Some(Timestamp::from_millis(9)),
        ..held.clone()
    };
    assert_eq!(
        leases.write(&release).await.unwrap(),
        Err(Some(taken.etag.clone()))
    );
    let now = leases.read(1).await.unwrap();
    assert_eq!(now, taken, "the stale release wrote nothing");
}

/// The shard count is recorded by the first opener; another count is a typed
/// error naming both; concurrent first openers agree on one count; 0 and
/// counts over the maximum are refused before anything is recorded.
pub async fn lease_shard_count_is_recorded_once(store: Store) {
    let service = unique_id("shards");
    let table = store.lease_table(&service).unwrap();
    for bad in [0, rollcall_core::lease::MAX_SHARDS + 1] {
        assert!(matches!(
            ShardLeases::open(table.clone(), bad).await,
            Err(Error::InvalidConfig { .. })
        ));
    }
    let leases = ShardLeases::open(table.clone(), 64).await.unwrap();
    assert_eq!(leases.shards(), 64);
    let other = store.lease_table(&service).unwrap();
    match ShardLeases::open(other.clone(), 128).await {
        Err(e @ Error::InvalidConfig { .. }) => {
            let m = e.to_string();
            assert!(m.contains("64") && m.contains("128"), "names both counts: {m}");
        }
        other => panic!("another shard count must be refused: {other:?}"),
    }
    ShardLeases::open(other, 64).await.expect("the same count opens");
    assert!(matches!(leases.read(64).await, Err(Error::InvalidInput { .. })));

    // Concurrent first openers with different counts: all but the recorded one fail.
    let service = unique_id("shards");
    let barrier = Arc::new(Barrier::new(6));
    let tasks: Vec<_> = (0..6u32)
        .map(|i| {
            let table = store.lease_table(&service).unwrap();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (
                    16 << (i % 3),
                    ShardLeases::open(table, 16 << (i % 3)).await.is_ok(),
                )
            })
        })
        .collect();
    let mut opened = std::collections::BTreeSet::new();
    for t in tasks {
        let (n, ok) = t.await.unwrap();
        if ok {
            opened.insert(n);
        }
    }
    assert_eq!(opened.len(), 1, "one recorded count: {opened:?}");
}

/// Services never see each other's rows or shard counts, and a clear removes
/// one service's leases only.
pub async fn lease_services_are_isolated(store: Store) {
    let a = fresh_leases(&store, 8).await;
    let b = fresh_leases(&store, 16).await;
    let lease = acquired(&ShardLease::vacant(5), silo(1, 1));
    let etag = a.write(&lease).await.unwrap().unwrap();
    assert_eq!(b.read(5).await.unwrap(), ShardLease::vacant(5));
    b.write(&acquired(&ShardLease::vacant(5), silo(2, 2)))
        .await
        .unwrap()
        .unwrap();
    b.table().clear().await.unwrap();
    assert_eq!(b.read(5).await.unwrap(), ShardLease::vacant(5));
    assert_eq!(a.read(5).await.unwrap(), ShardLease { etag, ..lease });
}

/// A row that is not a lease (garbage written by something else, or another
/// shard's row) is a typed corrupt-row error naming the shard, and the row can
/// be replaced by a compare-and-set on its etag.
pub async fn lease_a_garbage_row_is_a_typed_error(store: Store) {
    let leases = fresh_leases(&store, 8).await;
    let table: Arc<dyn LeaseTable> = leases.table().clone();
    let LeaseWrite::Written(garbage) = table
        .write_lease(6, &Expected::Absent, b"\xff not json")
        .await
        .unwrap()
    else {
        panic!("first write of a row");
    };
    match leases.read(6).await {
        Err(e @ Error::Corrupt { .. }) => assert!(e.to_string().contains("/6"), "names the shard: {e}"),
        other => panic!("a garbage row must be Corrupt: {other:?}"),
    }
    let other = ShardLease::vacant(7).encode().unwrap();
    let LeaseWrite::Written(wrong) = table
        .write_lease(6, &Expected::Etag(garbage), &other)
        .await
        .unwrap()
    else {
        panic!("overwrite with its etag");
    };
    assert!(matches!(leases.read(6).await, Err(Error::Corrupt { .. })));
    let fixed = ShardLease {
        etag: wrong,
        ..acquired(&ShardLease::vacant(6), silo(3, 3))
    };
    let e = leases.write(&fixed).await.unwrap().unwrap();
    assert_eq!(leases.read(6).await.unwrap(), ShardLease { etag: e, ..fixed });
}

/// `n` exceptions of about `id_bytes`-byte actor ids, due one ms apart.
/// The ids' tails are pseudo-random letters and digits, as hashed ids are,
/// so compressed pages stay near three quarters of their size (repeated
/// bytes would shrink every page set to one call).
fn many_exceptions(n: usize, id_bytes: usize) -> Vec<LeaseException> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    (0..n)
        .map(|i| {
            let head = format!("cart/é{i}-");
            let tail: String = (0..id_bytes.saturating_sub(head.len()))
                .map(|_| {
                    // xorshift64: deterministic, so every run writes the same pages.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ALPHABET[(state % 64) as usize] as char
                })
                .collect();
            LeaseException {
                actor_id: format!("{head}{tail}"),
                name: format!("n{i}"),
                next: Timestamp::from_millis(1_795_000_000_000 + i as u64),
                etag: (i % 2 == 0).then(|| Etag::new(format!("e{i}"))),
                done: i % 3 == 0,
            }
        })
        .collect()
}

/// A lease that owes more exceptions than one row holds is written whole (its
/// exceptions in pages) and reads back whole; the next write, paged or not,
/// leaves only the pages its row names; a paged row whose pages are gone is
/// Corrupt, not a lease without exceptions; the page calls keep their
/// contract (a missing page is `None`, an oversized one `InvalidInput`).
pub async fn lease_exceptions_past_one_row_go_to_pages(store: Store) {
    let leases = fresh_leases(&store, 8).await;
    let table: Arc<dyn LeaseTable> = leases.table().clone();
    let owner = silo(11111, 1_795_000_000_000);

    // 3,000 exceptions of 300-byte ids: over 900 KB, several pages.
    let mut lease = acquired(&ShardLease::vacant(2), owner);
    lease.exceptions = many_exceptions(3_000, 300);
    let etag = leases.write(&lease).await.unwrap().expect("first write");
    let back = leases.read(2).await.unwrap();
    assert_eq!(back.exceptions.len(), 3_000);
    assert_eq!(
        back,
        ShardLease {
            etag: etag.clone(),
            ..lease.clone()
        }
    );
    let (row, _) = table.read_lease(2).await.unwrap().expect("the row");
    assert!(
        row.len() <= rollcall_core::lease::MAX_LEASE_BYTES,
        "the row itself stays small"
    );
    // A holder's verification reads the row alone: all but the paged
    // exceptions, at the same etag.
    let head = leases.read_head(2).await.unwrap();
    assert_eq!(
        head,
        ShardLease {
            etag: etag.clone(),
            exceptions: Vec::new(),
            ..lease.clone()
        }
    );
    let owned_set = rollcall_core::lease::page_set(lease.epoch, LeaseStatus::Owned);
    let owned_pages = table.read_pages(2, &owned_set, 64).await.unwrap();
    let count = owned_pages.iter().take_while(|p| p.is_some()).count();
    assert!(count >= 3, "{count} pages");

    // The release owes other exceptions: its own page set; the acquire's goes.
    let release = ShardLease {
        status: LeaseStatus::Released,
        exceptions: many_exceptions(2_500, 400),
        watermark: Some(Timestamp::from_millis(1_795_000_009_000)),
        etag,
        ..lease.clone()
    };
    let etag = leases.write(&release).await.unwrap().expect("release");
    assert_eq!(
        leases.read(2).await.unwrap(),
        ShardLease {
            etag: etag.clone(),
            ..release.clone()
        }
    );
    assert!(
        table
            .read_pages(2, &owned_set, count as u32)
            .await
            .unwrap()
            .iter()
            .all(Option::is_none),
        "the pages the row no longer names are deleted"
    );

    // An acquire of the release keeps what it owes: its row names the
    // release's page set instead of copying it (issue 70, item 3), and the
    // set stays while the row names it.
    let read_release = leases.read(2).await.unwrap();
    let keep = ShardLease {
        etag: etag.clone(),
        ..acquired(&read_release, owner)
    };
    let released_set = rollcall_core::lease::page_set(release.epoch, LeaseStatus::Released);
    let prepared = leases.prepare(&keep).unwrap();
    assert_eq!(
        prepared.page_set(),
        Some(released_set.as_str()),
        "the release's set"
    );
    assert_eq!(prepared.pages_left(), 0, "no page is written again");
    let etag = leases.commit(&prepared).await.unwrap().expect("acquire");
    leases.cleanup(&prepared).await;
    let read = leases.read(2).await.unwrap();
    assert_eq!(
        read,
        ShardLease {
            etag: etag.clone(),
            ..keep.clone()
        }
    );
    assert_eq!(read.exceptions, release.exceptions);
    // Its release owes other exceptions, in pages sent one bounded call at a
    // time; an attempt cut after its first call is resumed, not started over.
    let second = ShardLease {
        status: LeaseStatus::Released,
        exceptions: many_exceptions(12_000, 200),
        etag: etag.clone(),
        ..read.clone()
    };
    let mut first_try = leases.prepare(&second).unwrap();
    let total = first_try.pages_left();
    assert!(total >= 8, "{total} pages");
    assert!(
        leases.send_pages(&mut first_try).await.unwrap(),
        "more than one call"
    );
    let sent = total - first_try.pages_left();
    assert!(
        (1..total).contains(&sent),
        "one call sent {sent} of {total} pages"
    );
    drop(first_try); // the caller's deadline passed
    let mut retry = leases.prepare(&second).unwrap();
    assert_eq!(retry.pages_left(), total - sent, "the retry resumes");
    assert!(
        matches!(leases.commit(&retry).await, Err(Error::InvalidInput { .. })),
        "no row before its pages"
    );
    while leases.send_pages(&mut retry).await.unwrap() {}
    let etag = leases.commit(&retry).await.unwrap().expect("release");
    leases.cleanup(&retry).await;
    assert_eq!(
        leases.read(2).await.unwrap(),
        ShardLease {
            etag: etag.clone(),
            ..second.clone()
        }
    );
    assert!(
        table.read_pages(2, &released_set, 1).await.unwrap()[0].is_none(),
        "the first release's set goes once no row names it"
    );
    let release = second;

    // A small row: no pages at all any more.
    let next = ShardLease {
        exceptions: Vec::new(),
        etag,
        ..acquired(&release, silo(22222, 1_795_000_000_000))
    };
    let etag = leases.write(&next).await.unwrap().expect("acquire");
    assert_eq!(leases.read(2).await.unwrap(), ShardLease { etag, ..next });
    let released_set = rollcall_core::lease::page_set(release.epoch, LeaseStatus::Released);
    assert!(table
        .read_pages(2, &released_set, 8)
        .await
        .unwrap()
        .iter()
        .all(Option::is_none));

    // A paged row whose pages vanished is Corrupt (never read as owing nothing).
    let mut other = acquired(&ShardLease::vacant(3), owner);
    other.exceptions = many_exceptions(1_500, 300);
    leases.write(&other).await.unwrap().expect("paged write");
    table.delete_pages(3, None).await.unwrap();
    assert!(matches!(leases.read(3).await, Err(Error::Corrupt { .. })));

    // A page that is not what a writer stores is Corrupt too, never a panic
    // or a lease owing less: gzip's magic then garbage, and a gzip stream
    // that inflates past any page (1 MiB of zeros).
    let mut fifth = acquired(&ShardLease::vacant(5), owner);
    fifth.exceptions = many_exceptions(1_500, 300);
    leases.write(&fifth).await.unwrap().expect("paged write");
    let fifth_set = rollcall_core::lease::page_set(fifth.epoch, LeaseStatus::Owned);
    let bomb = {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![0u8; 1 << 20]).unwrap();
        gz.finish().unwrap()
    };
    for page in [vec![0x1f, 0x8b, 8, 0, 1, 2, 3], bomb] {
        table.write_pages(5, &fifth_set, 0, &[page]).await.unwrap();
        assert!(matches!(leases.read(5).await, Err(Error::Corrupt { .. })));
    }

    // The page calls themselves.
    table
        .write_pages(4, "s1", 0, &[b"a".to_vec(), b"b".to_vec()])
        .await
        .unwrap();
    table.write_pages(4, "s2", 0, &[b"c".to_vec()]).await.unwrap();
    assert_eq!(
        table.read_pages(4, "s1", 3).await.unwrap(),
        vec![Some(b"a".to_vec()), Some(b"b".to_vec()), None]
    );
    // A set written in several calls, from a given page on (a resumed write).
    table
        .write_pages(4, "s1", 2, &[b"d".to_vec(), b"e".to_vec()])
        .await
        .unwrap();
    table.write_pages(4, "s1", 1, &[b"B".to_vec()]).await.unwrap();
    assert_eq!(
        table.read_pages(4, "s1", 5).await.unwrap(),
        vec![
            Some(b"a".to_vec()),
            Some(b"B".to_vec()),
            Some(b"d".to_vec()),
            Some(b"e".to_vec()),
            None
        ]
    );
    table.delete_pages(4, Some("s2")).await.unwrap();
    assert_eq!(table.read_pages(4, "s1", 2).await.unwrap(), vec![None, None]);
    assert_eq!(
        table.read_pages(4, "s2", 1).await.unwrap(),
        vec![Some(b"c".to_vec())]
    );
    assert!(matches!(
        table
            .write_pages(
                4,
                "s3",
                0,
                &[vec![b'x'; rollcall_core::lease::MAX_LEASE_BYTES + 1]]
            )
            .await,
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(
        table.read_pages(4, "s3", 1).await.unwrap(),
        vec![None],
        "nothing written"
    );
    table.clear().await.unwrap();
    assert_eq!(
        table.read_pages(4, "s2", 1).await.unwrap(),
        vec![None],
        "clear removes pages"
    );
}

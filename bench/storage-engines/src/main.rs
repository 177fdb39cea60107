//! Write rate of the statistics store's key layout on redb and on RocksDB.
//!
//! Each point is what `EmbeddedStatistics::append` does per point: one raw key put and,
//! for each of the 1-, 10- and 60-minute levels, a read-modify-write of the bucket key.
//! Points are committed in batches, each commit durable (redb: `Durability::Immediate`,
//! its default; RocksDB: `WriteOptions::set_sync(true)`). Prints one JSON line per
//! engine and round; engines alternate so machine noise hits both.
//!
//! Usage: `storage-engines [points] [batch] [rounds]` (defaults 20000, 64, 3).

use std::time::Instant;

const LEVEL_MS: [u64; 3] = [60_000, 600_000, 3_600_000];

fn key(level: u8, time_ms: u64, name: u32, silo: u32) -> [u8; 22] {
    let mut k = [0u8; 22];
    k[1] = level;
    k[2..6].copy_from_slice(&1u32.to_be_bytes());
    k[6..14].copy_from_slice(&time_ms.to_be_bytes());
    k[14..18].copy_from_slice(&name.to_be_bytes());
    k[18..22].copy_from_slice(&silo.to_be_bytes());
    k
}

/// (count, sum) folded into a 34-byte value like the store's aggregate.
fn fold(old: Option<&[u8]>, v: f64) -> [u8; 34] {
    let (count, sum) = match old {
        Some(o) if o.len() == 34 => (
            u64::from_be_bytes(o[2..10].try_into().unwrap()),
            f64::from_be_bytes(o[10..18].try_into().unwrap()),
        ),
        _ => (0, 0.0),
    };
    let mut out = [0u8; 34];
    out[0] = 1;
    out[2..10].copy_from_slice(&(count + 1).to_be_bytes());
    out[10..18].copy_from_slice(&(sum + v).to_be_bytes());
    out
}

/// The i-th point: 20 names × 10 silos, one point per name and silo every 10 s.
fn point(i: u64) -> (u64, u32, u32, f64) {
    let per_tick = 200;
    (1_800_000_000_000 + (i / per_tick) * 10_000, (i % 20) as u32, ((i / 20) % 10) as u32, i as f64)
}

#[cfg(feature = "redb")]
fn redb_round(dir: &std::path::Path, points: u64, batch: u64) -> f64 {
    use redb::{Database, ReadableTable, TableDefinition};
    const T: TableDefinition<&[u8], &[u8]> = TableDefinition::new("metrics");
    let db = Database::create(dir.join("redb.db")).unwrap();
    let start = Instant::now();
    let mut i = 0;
    while i < points {
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(T).unwrap();
            for j in i..(i + batch).min(points) {
                let (time, name, silo, v) = point(j);
                t.insert(&key(0, time, name, silo)[..], &fold(None, v)[..]).unwrap();
                for (l, ms) in LEVEL_MS.iter().enumerate() {
                    let k = key(l as u8 + 1, time - time % ms, name, silo);
                    let old = t.get(&k[..]).unwrap().map(|g| g.value().to_vec());
                    t.insert(&k[..], &fold(old.as_deref(), v)[..]).unwrap();
                }
            }
        }
        tx.commit().unwrap();
        i += batch;
    }
    points as f64 / start.elapsed().as_secs_f64()
}

#[cfg(feature = "rocksdb")]
fn rocksdb_round(dir: &std::path::Path, points: u64, batch: u64) -> f64 {
    use rocksdb::{Options, WriteBatch, WriteOptions, DB};
    let mut opts = Options::default();
    opts.create_if_missing(true);
    let db = DB::open(&opts, dir.join("rocksdb")).unwrap();
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    let start = Instant::now();
    let mut i = 0;
    while i < points {
        // A batch does not see its own writes: fold repeated buckets in memory first,
        // as a RocksDB store would (or use a transaction DB, which is slower).
        let mut pending: std::collections::BTreeMap<[u8; 22], [u8; 34]> = Default::default();
        let mut wb = WriteBatch::default();
        for j in i..(i + batch).min(points) {
            let (time, name, silo, v) = point(j);
            wb.put(key(0, time, name, silo), fold(None, v));
            for (l, ms) in LEVEL_MS.iter().enumerate() {
                let k = key(l as u8 + 1, time - time % ms, name, silo);
                let old = match pending.get(&k) {
                    Some(p) => Some(p.to_vec()),
                    None => db.get(k).unwrap(),
                };
                pending.insert(k, fold(old.as_deref(), v));
            }
        }
        for (k, v) in &pending {
            wb.put(k, v);
        }
        db.write_opt(wb, &wo).unwrap();
        i += batch;
    }
    points as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let points = args.first().copied().unwrap_or(20_000);
    let batch = args.get(1).copied().unwrap_or(64);
    let rounds = args.get(2).copied().unwrap_or(3);
    for round in 0..rounds {
        #[cfg(feature = "redb")]
        {
            let dir = std::env::temp_dir().join(format!("storage-engines-redb-{}-{round}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let rate = redb_round(&dir, points, batch);
            println!("{{\"engine\":\"redb\",\"round\":{round},\"points\":{points},\"batch\":{batch},\"points_per_s\":{rate:.0}}}");
            let _ = std::fs::remove_dir_all(&dir);
        }
        #[cfg(feature = "rocksdb")]
        {
            let dir = std::env::temp_dir().join(format!("storage-engines-rocksdb-{}-{round}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let rate = rocksdb_round(&dir, points, batch);
            println!("{{\"engine\":\"rocksdb\",\"round\":{round},\"points\":{points},\"batch\":{batch},\"points_per_s\":{rate:.0}}}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

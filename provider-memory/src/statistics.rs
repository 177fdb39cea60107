//! The in-memory statistics store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use rollcall_core::statistics::{
    bucket_expired, bucket_start, AggLevel, Aggregate, StatFilter, StatPoint, StatRecord, StatisticsOptions,
    StatisticsStore,
};
use rollcall_core::{Result, Timestamp};

/// Strings interned to ids, both ways (unbounded: everything is in memory anyway).
#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<String, u32>,
    strings: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(id) = self.ids.get(s) {
            return *id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

#[derive(Debug, Default)]
struct State {
    names: Interner,
    silos: Interner,
    /// (time, name id, silo id) -> (value, is_delta).
    raw: BTreeMap<(u64, u32, u32), (f64, bool)>,
    /// (level code, bucket start, name id, silo id) -> (aggregate, last is_delta).
    buckets: BTreeMap<(u8, u64, u32, u32), (Aggregate, bool)>,
}

/// The statistics of one cluster, in memory (tests, the embedded default). Strings
/// are interned without a cache bound: they are all in memory anyway.
#[derive(Debug)]
pub struct MemoryStatistics {
    cluster_id: String,
    options: StatisticsOptions,
    state: Mutex<State>,
}

impl MemoryStatistics {
    /// An empty store of `cluster_id`.
    pub fn new(cluster_id: &str, options: StatisticsOptions) -> Self {
        MemoryStatistics {
            cluster_id: cluster_id.to_owned(),
            options,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl StatisticsStore for MemoryStatistics {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn append(&self, points: &[StatPoint]) -> Result<usize> {
        for p in points {
            p.validate()?;
        }
        let mut st = self.state();
        let mut new = 0;
        for p in points {
            let (name, silo) = (st.names.id(&p.name), st.silos.id(&p.silo));
            let t = p.time.as_millis();
            if st.raw.contains_key(&(t, name, silo)) {
                continue;
            }
            st.raw.insert((t, name, silo), (p.value, p.is_delta));
            for level in AggLevel::BUCKETS {
                let start = bucket_start(level, p.time).as_millis();
                st.buckets
                    .entry((level.code(), start, name, silo))
                    .and_modify(|(a, d)| {
                        a.add(p.value);
                        *d = p.is_delta;
                    })
                    .or_insert((Aggregate::of(p.value), p.is_delta));
            }
            new += 1;
        }
        Ok(new)
    }

    async fn scan(&self, filter: &StatFilter) -> Result<Vec<StatRecord>> {
        let st = self.state();
        let (from, to) = (filter.from.as_millis(), filter.to.as_millis());
        let record = |time: u64, name: u32, silo: u32, aggregate: Aggregate, is_delta: bool| {
            let (name, silo) = (&st.names.strings[name as usize], &st.silos.strings[silo as usize]);
            let time = Timestamp::from_millis(time);
            filter.matches(time, name, silo).then(|| StatRecord {
                level: filter.level,
                time,
                silo: silo.clone(),
                name: name.clone(),
                aggregate,
                is_delta,
            })
        };
        let mut out: Vec<StatRecord> = if filter.level == AggLevel::Raw {
            st.raw
                .range((from, 0, 0)..(to, 0, 0))
                .filter_map(|(&(t, n, s), &(v, d))| record(t, n, s, Aggregate::of(v), d))
                .collect()
        } else {
            let l = filter.level.code();
            st.buckets
                .range((l, from, 0, 0)..(l, to, 0, 0))
                .filter_map(|(&(_, t, n, s), &(a, d))| record(t, n, s, a, d))
                .collect()
        };
        out.sort_by(|a, b| (a.time, &a.name, &a.silo).cmp(&(b.time, &b.name, &b.silo)));
        Ok(out)
    }

    async fn expire(&self, now: Timestamp) -> Result<usize> {
        let cutoff = now.saturating_sub(self.options.retention());
        let mut st = self.state();
        let before = st.raw.len() + st.buckets.len();
        st.raw = st.raw.split_off(&(cutoff.as_millis(), 0, 0));
        st.buckets.retain(|&(l, start, _, _), _| {
            let level = AggLevel::from_code(l).unwrap_or(AggLevel::Minute60);
            !bucket_expired(level, Timestamp::from_millis(start), cutoff)
        });
        Ok(before - st.raw.len() - st.buckets.len())
    }
}

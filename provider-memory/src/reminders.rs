//! The reminder table of one service.

use std::collections::BTreeMap;

use async_trait::async_trait;
use rollcall_core::KeyLimits;
use rollcall_core::{actor_hash, Etag, Fence, ReminderEntry, ReminderTable, Result, RunRecord, Timestamp};

use crate::MemoryStore;

/// Reminders of one service, keyed by (hash, actor id, name) so that hash-range reads
/// are ordered range scans.
pub(crate) type Service = BTreeMap<(u32, String, String), ReminderEntry>;

/// The reminder table of one service in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryReminderTable {
    pub(crate) store: MemoryStore,
    pub(crate) service_id: String,
}

fn key_of(actor_id: &str, name: &str) -> (u32, String, String) {
    (actor_hash(actor_id), actor_id.to_owned(), name.to_owned())
}

impl MemoryReminderTable {
    /// Under `fence`: the leases' lock, held by the caller across its write
    /// (taken before the services' lock, as a fenced state commit takes it),
    /// once the fence's lease is found at its epoch.
    fn fence_held(
        &self,
        actor_id: &str,
        name: &str,
        fence: Option<&Fence>,
    ) -> Result<Option<std::sync::MutexGuard<'_, std::collections::HashMap<String, crate::lease::Leases>>>>
    {
        let Some(f) = fence else {
            return Ok(None);
        };
        f.check_reminder(&self.service_id, actor_id)?;
        self.store.check_available()?;
        let leases = crate::lock(&self.store.inner.leases);
        let current = leases.get(&f.service).and_then(|l| l.fence(f.shard));
        if current != Some(f.epoch) {
            return Err(f.refused_reminder(actor_id, name, current));
        }
        Ok(Some(leases))
    }
}

#[async_trait]
impl ReminderTable for MemoryReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        self.store.with_service(&self.service_id, |_| ())
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        KeyLimits::CORE.check_actor_id(actor_id)?;
        let h = actor_hash(actor_id);
        self.store.with_service(&self.service_id, |s| {
            s.range((h, String::new(), String::new())..)
                .take_while(|((hash, _, _), _)| *hash == h)
                .filter(|((_, actor, _), _)| actor == actor_id)
                .map(|(_, e)| e.clone())
                .collect()
        })
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        // Rows with hash > b, in hash order.
        fn above(s: &Service, b: u32) -> impl Iterator<Item = &ReminderEntry> {
            let first = b.checked_add(1);
            first
                .into_iter()
                .flat_map(move |f| s.range((f, String::new(), String::new())..).map(|(_, e)| e))
        }
        self.store.with_service(&self.service_id, |s| {
            if begin < end {
                above(s, begin).take_while(|e| e.hash <= end).cloned().collect()
            } else {
                // Wrapping: (begin, MAX] then [0, end].
                let low = s.values().take_while(|e| e.hash <= end);
                above(s, begin).chain(low).cloned().collect()
            }
        })
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        self.store
            .with_service(&self.service_id, |s| s.get(&key_of(actor_id, name)).cloned())
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id, &KeyLimits::CORE)?;
        let etag = self.store.new_etag();
        let mut stored = entry.clone();
        stored.etag = etag.clone();
        self.store.with_service(&self.service_id, |s| {
            s.insert(key_of(&entry.actor_id, &entry.name), stored);
        })?;
        Ok(etag)
    }

    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let _leases = self.fence_held(actor_id, name, fence)?;
        self.store.with_service(&self.service_id, |s| {
            let key = key_of(actor_id, name);
            if s.get(&key).is_some_and(|e| &e.etag == etag) {
                s.remove(&key);
                true
            } else {
                false
            }
        })
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let _leases = self.fence_held(actor_id, name, fence)?;
        self.store
            .with_service(&self.service_id, |s| match s.get_mut(&key_of(actor_id, name)) {
                Some(e) if &e.etag == etag => {
                    e.last_fired = Some(fired_at);
                    true
                }
                _ => false,
            })
    }

    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        self.store
            .with_service(&self.service_id, |s| match s.get_mut(&key_of(actor_id, name)) {
                Some(e) if &e.etag == etag => {
                    e.paused = paused;
                    true
                }
                _ => false,
            })
    }

    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &RunRecord,
        keep: usize,
        fence: Option<&Fence>,
    ) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        rollcall_core::check_run_keep(keep)?;
        let _leases = self.fence_held(actor_id, name, fence)?;
        let key = (self.service_id.clone(), actor_id.to_owned(), name.to_owned());
        self.store.with_runs(|runs| {
            rollcall_core::prepend_run(runs.entry(key).or_default(), run, keep);
        })
    }

    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<RunRecord>> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let key = (self.service_id.clone(), actor_id.to_owned(), name.to_owned());
        self.store
            .with_runs(|runs| runs.get(&key).cloned().unwrap_or_default())
    }

    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let key = (self.service_id.clone(), actor_id.to_owned(), name.to_owned());
        self.store.with_runs(|runs| {
            runs.remove(&key);
        })
    }

    async fn clear(&self) -> Result<()> {
        self.store
            .with_runs(|runs| runs.retain(|(service, _, _), _| *service != self.service_id))?;
        self.store.with_service(&self.service_id, |s| s.clear())
    }
}

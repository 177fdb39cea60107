//! Join planning: what a starting silo must do with the rows of its `ip:port`.
//!
//! A restarted process on the same `ip:port` is a new silo with a larger
//! generation. When it joins, the older generations still in the table are declared
//! Dead (they cannot be alive: the endpoint is ours now). If the table already holds
//! a **newer** generation on our endpoint, we are the stale process and must not join.

use crate::{Etag, MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus};

/// The result of [`plan_join`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinPlan {
    /// Declare these older generations Dead (rows as read, with etags), then insert
    /// our row.
    Proceed {
        /// Older generations on our endpoint that are not Dead yet.
        declare_dead: Vec<(MembershipEntry, Etag)>,
    },
    /// A newer generation of our endpoint exists: this silo is superseded and must
    /// stop.
    Superseded {
        /// The newer silo.
        by: SiloAddress,
    },
    /// Our own row already exists (a retried join).
    AlreadyInserted {
        /// Its status.
        status: SiloStatus,
    },
}

/// Plans the join of `me` from a snapshot of the table.
pub fn plan_join(me: &SiloAddress, snapshot: &MembershipSnapshot) -> JoinPlan {
    if let Some(newer) = snapshot
        .rows()
        .filter(|e| e.silo.same_endpoint(me) && e.silo.generation() > me.generation())
        .map(|e| e.silo)
        .max()
    {
        return JoinPlan::Superseded { by: newer };
    }
    if let Some(own) = snapshot.entry(me) {
        return JoinPlan::AlreadyInserted { status: own.status };
    }
    let declare_dead = snapshot
        .entries
        .iter()
        .map(|row| (&row.entry, &row.etag))
        .filter(|(e, _)| e.silo.same_endpoint(me) && e.silo.generation() < me.generation())
        .filter(|(e, _)| e.status != SiloStatus::Dead)
        .map(|(e, etag)| {
            let mut dead = e.clone();
            dead.status = SiloStatus::Dead;
            (dead, etag.clone())
        })
        .collect();
    JoinPlan::Proceed { declare_dead }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timestamp;

    fn row(s: &str, status: SiloStatus) -> crate::MembershipRow {
        let silo: SiloAddress = s.parse().unwrap();
        let entry = MembershipEntry::new(silo, status, Timestamp::from_millis(1));
        crate::MembershipRow::new(entry, Etag::new("e"))
    }

    #[test]
    fn older_generations_are_declared_dead() {
        let mut snap = MembershipSnapshot::default();
        snap.entries.extend([
            row("127.0.0.1:1@1", SiloStatus::Active),
            row("127.0.0.1:1@2", SiloStatus::Dead),
            row("127.0.0.1:2@1", SiloStatus::Active),
        ]);
        let me: SiloAddress = "127.0.0.1:1@3".parse().unwrap();
        match plan_join(&me, &snap) {
            JoinPlan::Proceed { declare_dead } => {
                assert_eq!(declare_dead.len(), 1);
                assert_eq!(declare_dead[0].0.silo.to_string(), "127.0.0.1:1@1");
                assert_eq!(declare_dead[0].0.status, SiloStatus::Dead);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn newer_generation_supersedes_us() {
        let mut snap = MembershipSnapshot::default();
        snap.entries.extend([row("127.0.0.1:1@5", SiloStatus::Active)]);
        let me: SiloAddress = "127.0.0.1:1@3".parse().unwrap();
        assert!(matches!(plan_join(&me, &snap), JoinPlan::Superseded { .. }));
        let me: SiloAddress = "127.0.0.1:1@5".parse().unwrap();
        assert_eq!(
            plan_join(&me, &snap),
            JoinPlan::AlreadyInserted {
                status: SiloStatus::Active
            }
        );
    }
}

//! Text views of the membership table and of its changes.

use std::fmt::Write;

use rollcall::{MembershipEntry, MembershipSnapshot, SiloStatus, Timestamp};

fn age(now: Timestamp, t: Timestamp) -> String {
    let d = now.saturating_duration_since(t);
    if d.as_secs() >= 120 {
        format!("{}m ago", d.as_secs() / 60)
    } else {
        format!("{:.1}s ago", d.as_secs_f64())
    }
}

/// The table as `rollcall status` prints it.
pub(crate) fn table(cluster: &str, snap: &MembershipSnapshot, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster {cluster}: table version {} ({} silos, {} active)",
        snap.version.version,
        snap.len(),
        snap.active().count()
    );
    let _ = writeln!(
        out,
        "{:<24} {:>15} {:<12} {:<12} {:>12}  votes (voter, age)",
        "silo", "generation", "status", "host", "i_am_alive"
    );
    for e in snap.rows() {
        let votes: Vec<String> = e
            .suspect_votes
            .iter()
            .map(|v| format!("{} ({})", v.silo, age(now, v.time)))
            .collect();
        let _ = writeln!(
            out,
            "{:<24} {:>15} {:<12} {:<12} {:>12}  {}",
            e.silo.endpoint().to_string(),
            e.silo.generation(),
            e.status.as_str(),
            e.host_name,
            age(now, e.i_am_alive_time),
            if votes.is_empty() {
                "-".to_owned()
            } else {
                votes.join(", ")
            }
        );
    }
    out
}

/// What changed between two snapshots, one line per event.
pub(crate) fn changes(
    before: &MembershipSnapshot,
    after: &MembershipSnapshot,
    required_votes: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for e in after.rows() {
        let old: Option<&MembershipEntry> = before.entry(&e.silo);
        match old {
            None => out.push(format!("{} joined the table as {}", e.silo, e.status)),
            Some(o) => {
                for v in &e.suspect_votes {
                    if !o
                        .suspect_votes
                        .iter()
                        .any(|ov| ov.silo == v.silo && ov.time == v.time)
                    {
                        if e.status == SiloStatus::Dead && o.status != SiloStatus::Dead {
                            continue; // reported with the declaration below
                        }
                        out.push(format!(
                            "{} suspects {} (vote {}/{})",
                            v.silo,
                            e.silo,
                            e.suspect_votes.len(),
                            required_votes
                        ));
                    }
                }
                if o.status != e.status {
                    if e.status == SiloStatus::Dead && !e.suspect_votes.is_empty() {
                        let voters: Vec<String> =
                            e.suspect_votes.iter().map(|v| v.silo.to_string()).collect();
                        out.push(format!("{} declared Dead by {}", e.silo, voters.join(" + ")));
                    } else {
                        out.push(format!("{} is now {}", e.silo, e.status));
                    }
                }
            }
        }
    }
    out
}

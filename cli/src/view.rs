//! Text views of the membership table and of its changes.

use std::fmt::Write;

use std::collections::HashMap;

use rollcall::{
    AggLevel, MembershipEntry, MembershipEvent, MembershipSnapshot, SiloAddress, SiloStatus, StatRecord,
    Timestamp, WriteKind,
};

fn age(now: Timestamp, t: Timestamp) -> String {
    let d = now.saturating_duration_since(t);
    if d.as_secs() >= 120 {
        format!("{}m ago", d.as_secs() / 60)
    } else {
        format!("{:.1}s ago", d.as_secs_f64())
    }
}

/// The table as `rollcall status` prints it: a header line, a column header, one
/// line per row (columns as wide as their widest value, so IPv6 endpoints and long
/// host names stay aligned), then the corrupt rows, if any, one per line.
pub(crate) fn table(cluster: &str, snap: &MembershipSnapshot, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster {cluster}: table version {} ({} silos, {} active{})",
        snap.version.version,
        snap.len(),
        snap.active().count(),
        if snap.corrupt.is_empty() {
            String::new()
        } else {
            format!(", {} corrupt", snap.corrupt.len())
        }
    );
    let rows: Vec<[String; 6]> = snap
        .rows()
        .map(|e| {
            let votes: Vec<String> = e
                .suspect_votes
                .iter()
                .map(|v| format!("{} ({})", v.silo, age(now, v.time)))
                .collect();
            [
                e.silo.endpoint().to_string(),
                e.silo.generation().to_string(),
                if e.clock_beyond_bound {
                    // Its clock is off: the shard ring leaves it out.
                    format!("{} (clock beyond bound)", e.status.as_str())
                } else {
                    e.status.as_str().to_owned()
                },
                if e.host_name.is_empty() {
                    "-".to_owned()
                } else {
                    e.host_name.clone()
                },
                age(now, e.i_am_alive_time),
                if votes.is_empty() {
                    "-".to_owned()
                } else {
                    votes.join(", ")
                },
            ]
        })
        .collect();
    let header = [
        "silo",
        "generation",
        "status",
        "host",
        "i_am_alive",
        "votes (voter, age)",
    ];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let w: Vec<usize> = (0..5).map(width).collect();
    let line = |c: [&str; 6]| {
        format!(
            "{:<w0$} {:>w1$} {:<w2$} {:<w3$} {:>w4$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4],
        )
    };
    let _ = writeln!(out, "{}", line(header));
    for r in &rows {
        let _ = writeln!(out, "{}", line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
    }
    for c in &snap.corrupt {
        let _ = writeln!(out, "CORRUPT {c}");
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

/// The reminders of a service as `rollcall reminders` prints them: a header line,
/// a column header, one line per reminder (at most `limit`), in ring order.
/// The owner comes from the ring of `ring`; the next ticks are the next `next`
/// occurrences after `now` (fewer when the schedule ends first).
pub(crate) fn reminders(
    service: &str,
    rows: &[rollcall::ReminderEntry],
    ring: &rollcall::reminders::ring::Ring,
    now: Timestamp,
    limit: usize,
    next: usize,
) -> String {
    use rollcall::reminders::schedule::Timing;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "service {service}: {} reminders, {} owning silos",
        rows.len(),
        ring.silos().len()
    );
    let header = [
        "actor",
        "name",
        "owner",
        "next ticks",
        "schedule",
        "policy",
        "etag",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .take(limit)
        .map(|e| {
            [
                e.actor_id.clone(),
                e.name.clone(),
                ring.owner_of(e.hash)
                    .map_or_else(|| "(no Active silo)".to_owned(), |s| s.to_string()),
                match Timing::of(e) {
                    Ok(timing) => {
                        let ticks: Vec<String> =
                            std::iter::successors(timing.after(now), |t| timing.after(*t))
                                .take(next)
                                .map(|t| t.to_string())
                                .collect();
                        match ticks.is_empty() {
                            false => ticks.join(", "),
                            true if timing.is_one_shot() => format!("{} (due)", e.start_at),
                            true => "(ended)".to_owned(),
                        }
                    }
                    Err(_) => "(unreadable)".to_owned(),
                },
                schedule_of(e),
                match e.retry {
                    None => format!("{:?}", e.missed_tick_policy),
                    Some(r) => {
                        let then = if r.park { "park" } else { "drop" };
                        match r.max_retries {
                            0 => format!("{:?}, {then} on failure", e.missed_tick_policy),
                            n => format!(
                                "{:?}, retry {n}x {}..{} then {then}",
                                e.missed_tick_policy,
                                humantime::format_duration(r.first_delay),
                                humantime::format_duration(r.max_delay)
                            ),
                        }
                    }
                },
                e.etag.to_string(),
            ]
        })
        .collect();
    let w: Vec<usize> = (0..7)
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut line = |c: [&str; 7]| {
        let mut l = String::new();
        for (i, cell) in c.iter().enumerate() {
            let _ = write!(l, "{cell:<width$}  ", width = w[i]);
        }
        let _ = writeln!(out, "{}", l.trim_end());
    };
    line(header);
    for r in &cells {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]]);
    }
    if rows.len() > limit {
        let _ = writeln!(out, "... and {} more (--limit)", rows.len() - limit);
    }
    out
}

/// A reminder's schedule in a few words: `every 1m`, `once`,
/// `cron "0 9 * * *" Europe/Stockholm`, then ` until <time>` when it ends.
fn schedule_of(e: &rollcall::ReminderEntry) -> String {
    let mut text = match (&e.cron, e.period) {
        (Some(expr), _) => format!("cron {expr:?} {}", e.zone.as_deref().unwrap_or("UTC")),
        (None, Some(p)) if !p.is_zero() => format!("every {}", humantime::format_duration(p)),
        (None, _) => "once".to_owned(),
    };
    if let Some(end) = e.end_at {
        let _ = write!(text, " until {end}");
    }
    text
}

/// Wall-clock time of `t` as `YYYY-MM-DD HH:MM:SS.mmm` (UTC).
fn clock(t: Timestamp) -> String {
    let text = humantime::format_rfc3339_millis(t.to_system_time()).to_string();
    text.trim_end_matches('Z').replacen('T', " ", 1)
}

fn voters(event: &MembershipEvent) -> String {
    event
        .votes
        .iter()
        .map(|v| format!("{} at {}", v.silo, clock(v.time)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one event did, told against the previous event of the same silo (when the
/// history still holds it): a join, a vote, a declaration, a status change.
fn describe(event: &MembershipEvent, before: Option<&MembershipEvent>) -> String {
    let by = match event.writer {
        Some(w) if w == event.silo => "by itself".to_owned(),
        Some(w) => format!("by {w}"),
        None => "by an unnamed writer".to_owned(),
    };
    let status = event.status.as_str();
    if event.kind == WriteKind::Insert {
        return format!("joined as {status} ({by})");
    }
    let old_status = before.map(|b| b.status);
    let old_votes = before.map_or(0, |b| b.votes.len());
    let votes = event.votes.len();
    if event.status == SiloStatus::Dead
        && old_status != Some(SiloStatus::Dead)
        && event.writer != Some(event.silo)
    {
        let votes = if votes == 0 {
            String::new()
        } else {
            format!("; votes: {}", voters(event))
        };
        return format!("declared Dead {by}{votes}");
    }
    if event.status == SiloStatus::Dead && event.writer == Some(event.silo) {
        return format!("left: Dead ({by})");
    }
    if old_status.is_some_and(|s| s != event.status) || old_status.is_none() && votes == 0 {
        return format!("{status} ({by})");
    }
    if votes > old_votes || (before.is_none() && votes > 0) {
        return format!("suspected {by}: {votes} vote(s): {}", voters(event));
    }
    if votes < old_votes {
        return format!("votes expired or cleared, now {votes} ({by})");
    }
    if before.is_some_and(|b| b.clock_beyond_bound != event.clock_beyond_bound) {
        return if event.clock_beyond_bound {
            format!("clock beyond the bound: left out of the shard ring, still {status} ({by})")
        } else {
            format!("clock back within the bound: back in the shard ring, {status} ({by})")
        };
    }
    format!("rewritten, still {status} ({by})")
}

/// The membership history as `rollcall history` prints it: a header line, then one
/// line per event in version order: `v<version>  <time UTC>  <silo>  <what happened>`.
pub(crate) fn history(cluster: &str, events: &[MembershipEvent], silo: Option<&SiloAddress>) -> String {
    let mut out = String::new();
    let about = silo.map(|s| format!(" about {s}")).unwrap_or_default();
    match (events.first(), events.last()) {
        (Some(first), Some(last)) => {
            let _ = writeln!(
                out,
                "cluster {cluster}: {} event(s){about}, table versions {}..={}",
                events.len(),
                first.version,
                last.version
            );
        }
        _ => {
            let _ = writeln!(out, "cluster {cluster}: no events{about}");
        }
    }
    let vw = events
        .iter()
        .map(|e| e.version.to_string().len())
        .max()
        .unwrap_or(1);
    let sw = events.iter().map(|e| e.silo.to_string().len()).max().unwrap_or(0);
    let mut last: HashMap<SiloAddress, &MembershipEvent> = HashMap::new();
    for e in events {
        let what = describe(e, last.get(&e.silo).copied());
        let _ = writeln!(
            out,
            "v{:<vw$}  {}  {:<sw$}  {what}",
            e.version,
            clock(e.time),
            e.silo.to_string()
        );
        last.insert(e.silo, e);
    }
    out
}

/// What `rollcall status` adds about clocks: one line per silo of the view,
/// not Dead, whose metrics row says its clock is beyond the cluster's bound
/// (its reminder shards wait until it is back); nothing when none is.
pub(crate) fn clocks(snap: &MembershipSnapshot, report: &rollcall::MetricsReport) -> String {
    let mut out = String::new();
    for m in &report.rows {
        let live =
            m.id.parse::<rollcall::SiloAddress>()
                .ok()
                .and_then(|s| snap.status_of(&s))
                .is_some_and(|s| s != SiloStatus::Dead);
        if live && m.clock_within_bound == Some(false) {
            let offset = m.clock_offset_ms.map_or("?".to_owned(), |ms| format!("{ms:+}"));
            let _ = writeln!(
                out,
                "clock: {} is {offset} ms from its peers' median, beyond max_clock_offset: \
                 it delivers no reminder until its clock is back",
                m.id
            );
        }
    }
    out
}

/// One line per live silo whose metrics row carries its store client's
/// connection figures ([`rollcall::StoreConnection`]): `store: <silo>:
/// <figures>`.
pub(crate) fn connections(snap: &MembershipSnapshot, report: &rollcall::MetricsReport) -> String {
    let mut out = String::new();
    for m in &report.rows {
        let live =
            m.id.parse::<rollcall::SiloAddress>()
                .ok()
                .and_then(|s| snap.status_of(&s))
                .is_some_and(|s| s != SiloStatus::Dead);
        if let (true, Some(c)) = (live, &m.store_connection) {
            let _ = writeln!(out, "store: {}: {c}", m.id);
        }
    }
    out
}

/// The metrics table as `rollcall metrics` prints it: a header line, a column
/// header, one aligned line per row (role, id, age of the row, CPU %, RSS MiB,
/// probe RTT p50/p99 ms, suspicions, votes, table reads/writes/conflicts, reminders
/// owned, ticks delivered/late, load shedding), then the corrupt rows.
pub(crate) fn metrics(cluster: &str, report: &rollcall::MetricsReport, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "cluster {cluster}: {} metrics row(s)", report.rows.len());
    let header = [
        "role",
        "id",
        "published",
        "cpu%",
        "rss_mib",
        "rtt_p50_ms",
        "rtt_p99_ms",
        "suspicions",
        "votes",
        "reads",
        "writes",
        "conflicts",
        "reminders",
        "ticks",
        "late",
        "shedding",
    ];
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|m| {
            vec![
                m.role.as_str().to_owned(),
                m.id.clone(),
                age(now, m.time),
                format!("{:.1}", m.cpu_percent),
                format!("{:.1}", m.memory_bytes as f64 / (1024.0 * 1024.0)),
                format!("{:.2}", m.probe_rtt_p50_ms),
                format!("{:.2}", m.probe_rtt_p99_ms),
                m.suspicions_sent.to_string(),
                m.votes_written.to_string(),
                m.table_reads.to_string(),
                m.table_writes.to_string(),
                m.table_conflicts.to_string(),
                m.reminders_owned.to_string(),
                m.ticks_delivered.to_string(),
                m.ticks_late.to_string(),
                if m.load_shedding { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    out.push_str(&grid(&header, &rows, 2));
    for c in &report.corrupt {
        let _ = writeln!(out, "CORRUPT {}: {}", c.key, c.reason);
    }
    out
}

/// `rollcall status --watch`: reads the table every `interval` until Ctrl-C (or a
/// closed stdout). On a terminal, each read redraws the screen (cursor home, clear)
/// with the table and a footer; otherwise the table is printed, after a line with
/// the time, only when its version changes, with no escape codes. A failed read is
/// shown and retried at the next interval; each read is bounded by 5 s.
pub(crate) async fn watch(
    membership: &dyn rollcall::MembershipTable,
    cluster: &str,
    interval: std::time::Duration,
) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let interval = interval.max(std::time::Duration::from_millis(100));
    let tty = std::io::stdout().is_terminal();
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shown: Option<u64> = None;
    loop {
        ticks.tick().await;
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), membership.read_all()).await;
        let now = Timestamp::now();
        let text = match read {
            Ok(Ok(snap)) => {
                if !tty && shown == Some(snap.version.version) {
                    continue;
                }
                shown = Some(snap.version.version);
                table(cluster, &snap, now)
            }
            Ok(Err(e)) => format!("cluster {cluster}: read failed: {e}\n"),
            Err(_) => format!("cluster {cluster}: read did not answer within 5 s\n"),
        };
        let mut out = std::io::stdout().lock();
        let written = if tty {
            write!(
                out,
                "\x1b[H\x1b[2J{text}\nevery {} at {} (Ctrl-C to quit)\n",
                humantime::format_duration(interval),
                clock(now)
            )
        } else {
            write!(out, "--- {}\n{text}", clock(now))
        };
        if written.and_then(|_| out.flush()).is_err() {
            return Ok(()); // stdout closed (e.g. `| head`)
        }
    }
}

/// `header` and `rows` as aligned columns (each as wide as its widest cell), the
/// first `left` columns left-aligned and the others right-aligned, one line each.
fn grid(header: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < left {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", text.join(" ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A level as the CLI names it (`raw`, `1m`, `10m`, `60m`).
pub(crate) fn level_name(level: AggLevel) -> &'static str {
    match level {
        AggLevel::Raw => "raw",
        AggLevel::Minute1 => "1m",
        AggLevel::Minute10 => "10m",
        AggLevel::Minute60 => "60m",
    }
}

/// Statistics records as `rollcall statistics` prints them: a header line, then one
/// line per record in time order: time (UTC), silo, name, and the value (raw) or
/// the bucket's count, mean, min and max.
pub(crate) fn statistics(cluster: &str, level: AggLevel, records: &[StatRecord], limit: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster {cluster}: {} statistics record(s) at level {}",
        records.len(),
        level_name(level)
    );
    let num = |v: f64| {
        if v.fract() == 0.0 && v.abs() < 1e15 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    };
    let (header, rows): (Vec<&str>, Vec<Vec<String>>) = if level == AggLevel::Raw {
        (
            vec!["time", "silo", "name", "value", "delta"],
            records
                .iter()
                .take(limit)
                .map(|r| {
                    vec![
                        clock(r.time),
                        r.silo.clone(),
                        r.name.clone(),
                        num(r.aggregate.sum),
                        if r.is_delta { "yes" } else { "no" }.to_owned(),
                    ]
                })
                .collect(),
        )
    } else {
        (
            vec!["bucket", "silo", "name", "count", "mean", "min", "max"],
            records
                .iter()
                .take(limit)
                .map(|r| {
                    vec![
                        clock(r.time),
                        r.silo.clone(),
                        r.name.clone(),
                        r.aggregate.count.to_string(),
                        num(r.aggregate.mean()),
                        num(r.aggregate.min),
                        num(r.aggregate.max),
                    ]
                })
                .collect(),
        )
    };
    out.push_str(&grid(&header, &rows, 3));
    if records.len() > limit {
        let _ = writeln!(out, "... and {} more (--limit)", records.len() - limit);
    }
    out
}

/// A reminder's run history as a table, newest first: occurrence, when it
/// ended, how late, attempts, outcome (`+trigger` for a trigger), silo.
pub(crate) fn runs(actor: &str, name: &str, runs: &[rollcall::RunRecord]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "reminder {name} of {actor}: {} runs, newest first",
        runs.len()
    );
    let header = ["scheduled", "ended", "late", "attempts", "outcome", "silo"];
    let cells: Vec<[String; 6]> = runs
        .iter()
        .map(|r| {
            let late = r.at.saturating_duration_since(r.scheduled);
            [
                r.scheduled.to_string(),
                r.at.to_string(),
                humantime::format_duration(std::time::Duration::from_millis(late.as_millis() as u64))
                    .to_string(),
                r.attempts.to_string(),
                format!(
                    "{}{}",
                    r.outcome.as_str(),
                    if r.triggered { " (trigger)" } else { "" }
                ),
                r.silo.clone(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..6)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cols: [&str; 6]| {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            let _ = write!(l, "{c:<w$}  ", w = widths[i]);
        }
        l.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(header));
    for c in &cells {
        let _ = writeln!(out, "{}", line([&c[0], &c[1], &c[2], &c[3], &c[4], &c[5]]));
    }
    out
}

#[cfg(test)]
mod tests {
    use rollcall::{
        CorruptRow, Etag, MembershipEntry, MembershipEvent, MembershipSnapshot, SiloStatus, SuspectVote,
        TableVersion, Timestamp, WriteKind, WriteOrigin,
    };

    #[test]
    fn history_tells_joins_votes_and_declarations_apart() {
        let t = |ms: u64| Timestamp::from_millis(1_795_000_000_000 + ms);
        let (a, b, c) = (
            "10.0.0.1:11111@1".parse().unwrap(),
            "10.0.0.2:11111@1".parse().unwrap(),
            "10.0.0.3:11111@1".parse().unwrap(),
        );
        let mut row = MembershipEntry::new(a, SiloStatus::Joining, t(0));
        let mut events = Vec::new();
        let mut push = |row: &MembershipEntry, kind, writer, ms| {
            let version = TableVersion {
                version: events.len() as u64 + 1,
                etag: Etag::new("e"),
            };
            events.push(MembershipEvent::of(
                row,
                kind,
                &version,
                &WriteOrigin::silo(writer, t(ms)),
            ));
        };
        push(&row, WriteKind::Insert, a, 0);
        row.status = SiloStatus::Active;
        push(&row, WriteKind::Update, a, 100);
        row.clock_beyond_bound = true;
        push(&row, WriteKind::Update, a, 200);
        row.clock_beyond_bound = false;
        push(&row, WriteKind::Update, a, 300);
        row.suspect_votes.push(SuspectVote {
            silo: b,
            time: t(5_000),
        });
        push(&row, WriteKind::Update, b, 5_000);
        row.suspect_votes.push(SuspectVote {
            silo: c,
            time: t(5_400),
        });
        row.status = SiloStatus::Dead;
        push(&row, WriteKind::Update, c, 5_400);
        let text = super::history("demo", &events, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0], "cluster demo: 6 event(s), table versions 1..=6",
            "{text}"
        );
        assert!(
            lines[1]
                .starts_with("v1  2026-11-18 11:06:40.000  10.0.0.1:11111@1  joined as Joining (by itself)"),
            "{text}"
        );
        assert!(lines[2].ends_with("Active (by itself)"), "{text}");
        assert!(
            lines[3]
                .ends_with("clock beyond the bound: left out of the shard ring, still Active (by itself)"),
            "{text}"
        );
        assert!(
            lines[4].ends_with("clock back within the bound: back in the shard ring, Active (by itself)"),
            "{text}"
        );
        assert!(
            lines[5].ends_with(
                "suspected by 10.0.0.2:11111@1: 1 vote(s): 10.0.0.2:11111@1 at 2026-11-18 11:06:45.000"
            ),
            "{text}"
        );
        assert!(
            lines[6].ends_with(
                "declared Dead by 10.0.0.3:11111@1; votes: 10.0.0.2:11111@1 at 2026-11-18 11:06:45.000, \
                 10.0.0.3:11111@1 at 2026-11-18 11:06:45.400"
            ),
            "{text}"
        );
        assert_eq!(
            super::history("demo", &[], Some(&a)),
            "cluster demo: no events about 10.0.0.1:11111@1\n"
        );
    }

    #[test]
    fn columns_stay_aligned_with_ipv6_and_corrupt_rows_are_listed() {
        let now = Timestamp::from_millis(1_795_000_010_000);
        let mut snap = MembershipSnapshot::default();
        for (addr, status, host) in [
            (
                "[2001:db8:85a3::8a2e:370:7334]:11111@1795000000000",
                SiloStatus::Active,
                "a-long-host-name.example",
            ),
            ("10.0.0.1:11111@1795000000001", SiloStatus::ShuttingDown, ""),
        ] {
            let mut e = MembershipEntry::new(
                addr.parse().unwrap(),
                status,
                Timestamp::from_millis(1_795_000_000_000),
            );
            e.host_name = host.into();
            snap.insert(e, Etag::new("e"));
        }
        snap.corrupt.push(CorruptRow {
            key: "rollcall:{m:c}:silo:10.0.0.9:1@1".into(),
            reason: "expected value at line 1 column 1".into(),
        });
        let text = super::table("c", &snap, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("(2 silos, 1 active, 1 corrupt)"), "{text}");
        let status_at = |l: &str, word: &str| l.find(word).unwrap_or_else(|| panic!("{word} in {l}"));
        let line = |word: &str| *lines.iter().find(|l| l.contains(word)).expect(word);
        let col = status_at(lines[1], "status");
        assert_eq!(status_at(line("Active"), "Active"), col, "{text}");
        assert_eq!(status_at(line("ShuttingDown"), "ShuttingDown"), col, "{text}");
        let host = status_at(lines[1], "host");
        assert_eq!(
            status_at(line("a-long-host-name"), "a-long-host-name"),
            host,
            "{text}"
        );
        assert_eq!(
            lines[4],
            "CORRUPT rollcall:{m:c}:silo:10.0.0.9:1@1: expected value at line 1 column 1"
        );
    }

    /// Three silos, `a` and `b` Active, `c` Dead, and the view of them.
    fn two_live_one_dead() -> ([rollcall::SiloAddress; 3], MembershipSnapshot) {
        let silos: [rollcall::SiloAddress; 3] = [
            "10.0.0.1:1@1".parse().unwrap(),
            "10.0.0.2:1@1".parse().unwrap(),
            "10.0.0.3:1@1".parse().unwrap(),
        ];
        let mut snap = MembershipSnapshot::default();
        for (s, status) in silos
            .iter()
            .zip([SiloStatus::Active, SiloStatus::Active, SiloStatus::Dead])
        {
            snap.insert(MembershipEntry::new(*s, status, Timestamp::EPOCH), Etag::new("e"));
        }
        (silos, snap)
    }

    /// `rollcall status` names a live silo whose clock is beyond the bound,
    /// with its offset, and nothing else.
    #[test]
    fn status_names_the_silos_whose_clock_is_beyond_the_bound() {
        let ([a, b, c], snap) = two_live_one_dead();
        let row = |s: rollcall::SiloAddress, offset: i64, within: bool| rollcall::MetricsRow {
            clock_offset_ms: Some(offset),
            clock_within_bound: Some(within),
            ..rollcall::MetricsRow::new(rollcall::MetricsRole::Silo, s.to_string(), Timestamp::EPOCH)
        };
        let report = rollcall::MetricsReport {
            rows: vec![row(a, 3, true), row(b, 2_503, false), row(c, 9_000, false)],
            corrupt: Vec::new(),
        };
        let text = super::clocks(&snap, &report);
        assert_eq!(
            text,
            "clock: 10.0.0.2:1@1 is +2503 ms from its peers' median, beyond max_clock_offset: \
             it delivers no reminder until its clock is back\n",
            "only the live silo beyond the bound"
        );
    }

    /// `rollcall status` prints the store connection figures of each live
    /// silo whose row carries them, and nothing for the others.
    #[test]
    fn status_prints_the_live_silos_store_connections() {
        let ([a, b, c], snap) = two_live_one_dead();
        let seen = rollcall::StoreConnection {
            endpoints: "10.0.0.9:2379".into(),
            channels: 2,
            resent: 3,
            goaways: 1,
            connection_lost: 4,
            left_running: 5,
            ..Default::default()
        };
        let row = |s: rollcall::SiloAddress, c: Option<rollcall::StoreConnection>| rollcall::MetricsRow {
            store_connection: c,
            ..rollcall::MetricsRow::new(rollcall::MetricsRole::Silo, s.to_string(), Timestamp::EPOCH)
        };
        let report = rollcall::MetricsReport {
            rows: vec![row(a, Some(seen.clone())), row(b, None), row(c, Some(seen))],
            corrupt: Vec::new(),
        };
        assert_eq!(
            super::connections(&snap, &report),
            "store: 10.0.0.1:1@1: 10.0.0.9:2379, 2 channels; resent 3, GOAWAY 1, own GOAWAY 0, \
             connection lost 4; timed out: left running 5 (0 still), cancelled 0\n"
        );
    }
}

//! `rollcall reminders export` and `import`: a service's reminder rows as JSON
//! lines, one row per line, in the rows' own serde shape (the shape the Redis and
//! etcd providers store), so that a service's reminders move between stores.

use rollcall::ReminderEntry;

/// Why an import was refused (before anything was written).
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub(crate) struct ImportError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// The rows as JSON lines, in the order given.
pub(crate) fn export(rows: &[ReminderEntry]) -> String {
    let mut out = String::new();
    for row in rows {
        // A row always serializes: every field is plain data.
        if let Ok(line) = serde_json::to_string(row) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Reads JSON lines (blank lines skipped) as rows of `service`: each row is
/// moved to that service, its ring hash recomputed and its etag cleared (the
/// store gives it a new one), and it must pass the table's checks. Every line
/// is read before any is written: one bad line refuses the whole import.
///
/// # Errors
/// [`ImportError`] naming the first bad line: not JSON of a reminder row, a
/// duplicate (actor, name), or a row the table would refuse (an empty actor id
/// or name, keys longer than the store's `limits`, an oversized payload, an
/// invalid retry policy).
pub(crate) fn parse(
    text: &str,
    service: &str,
    limits: &rollcall::KeyLimits,
) -> Result<Vec<ReminderEntry>, ImportError> {
    let mut rows = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| ImportError {
            line: line_no,
            reason,
        };
        let mut row: ReminderEntry = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        row.service_id = service.to_owned();
        row.hash = rollcall::actor_hash(&row.actor_id);
        row.etag = rollcall::Etag::default();
        row.validate_for(service, limits)
            .map_err(|e| bad(e.to_string()))?;
        if !seen.insert((row.actor_id.clone(), row.name.clone())) {
            return Err(bad(format!(
                "reminder `{}` of `{}` appears twice",
                row.name, row.actor_id
            )));
        }
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollcall::{RetryPolicy, Timestamp};
    use std::time::Duration;

    fn row(actor: &str, name: &str) -> ReminderEntry {
        let mut r = ReminderEntry::new(
            "from",
            actor,
            name,
            Timestamp::from_millis(1_795_000_000_000),
            None,
        );
        r.cron = Some("0 9 * * *".into());
        r.zone = Some("Europe/Paris".into());
        r.payload = Some(vec![0, 255, 10]);
        r.retry = Some(RetryPolicy {
            max_retries: 2,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(4),
            park: false,
        });
        r.etag = rollcall::Etag::new("abc");
        r
    }

    #[test]
    fn an_export_imports_into_another_service_whole() {
        let rows = vec![row("cart/1", "a"), row("cart/ü", "b")];
        let text = export(&rows);
        assert_eq!(text.lines().count(), 2);
        let back = parse(&format!("{text}\n\n"), "to", &rollcall::KeyLimits::CORE).expect("parse");
        for (a, b) in rows.iter().zip(&back) {
            let expected = ReminderEntry {
                service_id: "to".into(),
                etag: rollcall::Etag::default(),
                ..a.clone()
            };
            assert_eq!(*b, expected);
        }
    }

    #[test]
    fn a_bad_line_refuses_the_import_and_names_the_line() {
        let good = export(&[row("cart/1", "a")]);
        for (bad, why) in [
            ("{not json", "key must be a string"),
            ("{\"actor_id\":\"x\"}", "missing field"),
            (good.trim(), "appears twice"),
        ] {
            let text = format!("{good}{bad}\n");
            let e = parse(&text, "to", &rollcall::KeyLimits::CORE).expect_err(bad);
            assert_eq!(e.line, 2, "{e}");
            assert!(e.reason.contains(why), "{e}");
        }
        let mut empty = row("cart/1", "a");
        empty.name = String::new();
        let e = parse(&export(&[empty]), "to", &rollcall::KeyLimits::CORE).expect_err("empty name");
        assert!(e.reason.contains("name"), "{e}");
    }
}

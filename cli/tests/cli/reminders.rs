//! `rollcall reminders` against silo processes.

use super::*;

/// `rollcall reminders` lists a service's reminders with their owner in the
/// cluster's membership, next tick, period and policy.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_lists_rows_with_their_owner() {
    use rollcall::{MembershipEntry, MissedTickPolicy, ProtocolMode, ReminderEntry, SiloStatus, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-rem");
    let silo: rollcall::SiloAddress = "127.0.0.1:4100@7".parse().unwrap();
    rt.block_on(async {
        let store = rollcall::connect(&backend.endpoint).await.unwrap();
        let table = store.membership_table(&service, ProtocolMode::Extended).unwrap();
        table.init(true).await.unwrap();
        let v = table.read_all().await.unwrap().version.next();
        let row = MembershipEntry::new(silo, SiloStatus::Active, Timestamp::now());
        assert!(table.insert_row(&row, &v).await.unwrap());
        let reminders = store.reminder_table(&service).unwrap();
        let start = Timestamp::now();
        let mut periodic = ReminderEntry::new(
            &service,
            "cart/1",
            "expire",
            start,
            Some(std::time::Duration::from_secs(90)),
        );
        periodic.missed_tick_policy = MissedTickPolicy::FireOnce;
        reminders.upsert_row(&periodic).await.unwrap();
        let once = ReminderEntry::new(&service, "cart/2", "ping", start, None);
        reminders.upsert_row(&once).await.unwrap();
    });
    let out = rollcall()
        .args(["reminders", "--store", &backend.endpoint, "--service", &service])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("service {service}: 2 reminders, 1 owning silos")),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines.iter().all(|l| l.contains("127.0.0.1:4100@7")),
        "owner column: {stdout}"
    );
    let periodic = lines.iter().find(|l| l.starts_with("cart/1")).expect("cart/1");
    assert!(
        periodic.contains("1m 30s") && periodic.contains("FireOnce"),
        "{periodic}"
    );
    let once = lines.iter().find(|l| l.starts_with("cart/2")).expect("cart/2");
    assert!(once.contains("once") && once.contains("(due)"), "{once}");
}

//! The demo, `status` of an empty cluster, and bad input.

use super::*;

#[test]
fn demo_converges_and_shows_the_dead_silo_with_its_voters() {
    let out = rollcall()
        .args(["demo", "--fast", "--silos", "4"])
        .output()
        .expect("run rollcall demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all 4 silos are Active"), "{stdout}");
    assert!(stdout.contains("declared Dead by"), "{stdout}");
    assert!(stdout.contains("every survivor sees"), "{stdout}");
    assert!(stdout.contains("reminders registered (1-s period)"), "{stdout}");
    assert!(
        stdout.contains("reminders of the killed silo tick on survivors"),
        "{stdout}"
    );
    // The carts' persistent tick counts continue on the survivors.
    assert!(
        stdout.contains("state survived for the killed silo's carts"),
        "{stdout}"
    );
    // The final table: 3 Active, 1 Dead with two voters.
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("cluster "))
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(
        table.iter().filter(|l| l.contains(" Active ")).count(),
        3,
        "{stdout}"
    );
    let dead: Vec<&&str> = table.iter().filter(|l| l.contains(" Dead ")).collect();
    assert_eq!(dead.len(), 1, "{stdout}");
    assert_eq!(
        dead[0].matches("s ago)").count(),
        2,
        "two voters with vote ages: {stdout}"
    );
    // Then its history: join, Active, and the declaration with both votes.
    let history: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("why was "))
        .filter(|l| l.starts_with('v'))
        .collect();
    assert_eq!(history.len(), 3, "{stdout}");
    assert!(history[0].ends_with("joined as Joining (by itself)"), "{stdout}");
    assert!(history[2].contains("declared Dead by "), "{stdout}");
    assert_eq!(history[2].matches(" at 20").count(), 2, "{stdout}");
    assert!(
        stdout.contains("To inspect a cluster from another process"),
        "{stdout}"
    );
}

#[test]
fn status_of_an_empty_cluster() {
    let out = rollcall()
        .args(["status", "--store", "memory://", "--cluster", "nobody"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("cluster nobody: table version 0 (0 silos, 0 active)"),
        "{stdout}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = rollcall()
        .args(["status", "--store", "mysql://x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store_url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = rollcall()
        .args([
            "silo",
            "--store",
            "memory://",
            "--options",
            r#"{"num_votes_for_death_declaration":99}"#,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("num_votes_for_death_declaration"), "{stderr}");
}

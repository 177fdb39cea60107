//! The etcd provider: the whole conformance suite on a real etcd and on a real
//! 3-member cluster, and etcd-specific behaviour: native delta reads, the key
//! layout, corrupt values, an outage and a restart, authentication, TLS, paged
//! range reads, and a leader lost under concurrent conditional updates.
#![cfg(feature = "etcd")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_core::{
    Error, Etag, MembershipEntry, MembershipRow, ProtocolMode, ReminderEntry, SuspectVote, TableVersion,
    Timestamp,
};
use rollcall_tests::fixtures::{self, Backend};
use rollcall_tests::membership_table::{full_entry, insert};
use rollcall_tests::{unique_id, Store};

async fn store_on(endpoints: &str) -> Store {
    let url = format!("etcd://{endpoints}");
    rollcall::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn etcd() -> Option<(Store, Backend)> {
    let b = fixtures::etcd().await?;
    Some((store_on(&b.endpoint).await, b))
}

async fn etcd_cluster() -> Option<(Store, Backend)> {
    let b = fixtures::etcd_cluster().await?;
    Some((store_on(&b.endpoint).await, b))
}

/// The whole suite on one etcd member.
mod single {
    rollcall_tests::provider_conformance_tests!(crate::etcd);
}

/// The whole suite on a 3-member etcd cluster.
mod three_members {
    rollcall_tests::provider_conformance_tests!(crate::etcd_cluster);
}

async fn raw(endpoints: &str) -> etcd_client::Client {
    let eps: Vec<String> = endpoints.split(',').map(|e| format!("http://{e}")).collect();
    etcd_client::Client::connect(eps, None)
        .await
        .expect("raw etcd client")
}

/// One etcd member of its own (for tests that stop, restart or reconfigure it),
/// killed on drop.
struct OwnEtcd {
    member: Option<fixtures::OwnServer>,
    dir: PathBuf,
    /// Host directories its flags name besides `dir` (certificates).
    mounts: Vec<PathBuf>,
    client_port: u16,
    peer_port: u16,
    extra: Vec<String>,
    scheme: &'static str,
}

impl OwnEtcd {
    /// `None` (skip) when etcd is missing and backends are not required.
    async fn start(extra: &[String], mounts: &[PathBuf], scheme: &'static str) -> Option<OwnEtcd> {
        let dir = std::env::temp_dir().join(unique_id("etcd-own"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut own = OwnEtcd {
            member: None,
            dir,
            mounts: mounts.to_vec(),
            client_port: fixtures::free_port().unwrap(),
            peer_port: fixtures::free_port().unwrap(),
            extra: extra.to_vec(),
            scheme,
        };
        match own.spawn().await {
            Ok(()) => Some(own),
            Err(e) if fixtures::backends_required() => panic!("etcd is needed: {e}"),
            Err(e) => {
                eprintln!("SKIPPING: {e}");
                None
            }
        }
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let client_url = format!("{}://127.0.0.1:{}", self.scheme, self.client_port);
        let initial = format!("own=http://127.0.0.1:{}", self.peer_port);
        let mut args = fixtures::etcd_args(
            "own",
            &self.dir.join("data"),
            &client_url,
            self.peer_port,
            &initial,
        );
        args.extend(self.extra.iter().cloned());
        let mut dirs = vec![self.dir.as_path()];
        dirs.extend(self.mounts.iter().map(PathBuf::as_path));
        let member =
            fixtures::OwnServer::spawn(fixtures::Server::Etcd, &args, &dirs, &self.dir.join("etcd.log"))
                .await?;
        eprintln!("etcd member of this test: {}", member.source());
        self.member = Some(member);
        fixtures::wait_for_port(([127, 0, 0, 1], self.client_port).into(), Duration::from_secs(30)).await?;
        if self.scheme == "http" {
            fixtures::wait_for_etcd_health(self.client_port, Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    async fn kill(&mut self) {
        if let Some(mut m) = self.member.take() {
            m.kill().await;
        }
    }
}

impl Drop for OwnEtcd {
    fn drop(&mut self) {
        self.member = None; // kills it
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Delta reads are native: a range over the silo keys with `min_mod_revision`
/// above the caller's version etag, not a complete read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_reads_select_rows_by_revision() {
    let Some((store, _b)) = etcd().await else { return };
    let table = store
        .membership_table(&unique_id("delta"), ProtocolMode::Extended)
        .unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    let seen = table.read_all().await.unwrap().version;
    insert(&*table, &full_entry(2)).await;
    table
        .update_i_am_alive(&full_entry(1).silo, Timestamp::from_millis(1_900_000_000_000))
        .await
        .unwrap();
    let d = table.read_delta(&seen).await.unwrap();
    assert!(!d.complete, "native delta");
    assert_eq!(
        d.changed.silos().copied().collect::<Vec<_>>(),
        vec![full_entry(2).silo]
    );
    assert_eq!(d.version.version, 2);
    // An etag that is no revision of this table's history: a complete read.
    let foreign = TableVersion {
        version: 1,
        etag: Etag::new("not-a-revision"),
    };
    assert!(table.read_delta(&foreign).await.unwrap().complete);
}

/// The documented key layout, with JSON values `etcdctl get --prefix` shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_are_json_under_the_documented_keys() {
    let Some((store, b)) = etcd().await else { return };
    let cluster = unique_id("layout");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    let reminders = store.reminder_table(&cluster).unwrap();
    let r = ReminderEntry::new(&cluster, "user/7", "daily", Timestamp::from_millis(1_000), None);
    let etag = reminders.upsert_row(&r).await.unwrap();
    let mut client = raw(&b.endpoint).await;
    let get = |key: String| {
        let mut c = client.clone();
        async move {
            let resp = c.get(key.clone(), None).await.unwrap();
            let kv = resp
                .kvs()
                .first()
                .unwrap_or_else(|| panic!("no key {key}"))
                .clone();
            (serde_json::from_slice::<serde_json::Value>(kv.value()).ok(), kv)
        }
    };
    let silo = full_entry(1).silo;
    let (version, _) = get(format!("rollcall/{cluster}/version")).await;
    assert_eq!(version.unwrap(), serde_json::json!({"version": 1}));
    let (row, kv) = get(format!("rollcall/{cluster}/silo/{silo}")).await;
    let row = row.unwrap();
    assert_eq!(row["written_at"], 1);
    assert_eq!(row["status"], "Active");
    let snap = table.read_all().await.unwrap();
    assert_eq!(
        *snap.get(&silo).unwrap().1,
        Etag::new(kv.mod_revision().to_string())
    );
    let (_, alive) = get(format!("rollcall/{cluster}/alive/{silo}")).await;
    assert_eq!(
        alive.value_str().unwrap(),
        full_entry(1).i_am_alive_time.to_string()
    );
    let hash = rollcall_core::actor_hash("user/7");
    let (rem, kv) = get(format!("rollcall/{cluster}/reminder/{hash:08x}/user%2F7/daily")).await;
    assert_eq!(rem.unwrap()["name"], "daily");
    assert_eq!(etag, Etag::new(kv.mod_revision().to_string()));
    // The membership table and a reminder service of the same id share a prefix
    // and nothing else: deleting the cluster leaves the reminder.
    table.delete_all().await.unwrap();
    assert!(reminders.read_row("user/7", "daily").await.unwrap().is_some());
    let left = client
        .get(
            format!("rollcall/{cluster}/"),
            Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    assert_eq!(left.kvs().len(), 1, "only the reminder key is left");
}

/// An undecodable value: listed as corrupt by reads, `Err(Corrupt)` for a write or
/// read that needs it, and never overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_values_are_corrupt_and_nothing_is_overwritten() {
    let Some((store, b)) = etcd().await else { return };
    let cluster = unique_id("garbage");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    insert(&*table, &full_entry(2)).await;
    let mut client = raw(&b.endpoint).await;
    let row_key = format!("rollcall/{cluster}/silo/{}", full_entry(1).silo);
    // A writer read the row while it was good; then it went bad.
    let (_, etag_before) = table
        .read_all()
        .await
        .unwrap()
        .row(&full_entry(1).silo)
        .cloned()
        .map(MembershipRow::into_parts)
        .unwrap();
    client.put(row_key.clone(), "{not json", None).await.unwrap();

    let all = table.read_all().await.expect("read_all with a corrupt row");
    assert_eq!(all.corrupt.len(), 1, "{all:?}");
    assert_eq!(all.corrupt[0].key, row_key);
    assert_eq!(all.len(), 1);
    assert_eq!(all.entry(&full_entry(2).silo), Some(&full_entry(2)));
    let write = table
        .update_row(&full_entry(1), &etag_before, &all.version.next())
        .await;
    assert!(
        matches!(write, Err(Error::Corrupt { ref key, .. }) if *key == row_key),
        "{write:?}"
    );
    let still = client.get(row_key.clone(), None).await.unwrap();
    assert_eq!(
        still.kvs()[0].value(),
        b"{not json",
        "the corrupt row was overwritten"
    );

    // A corrupt version row fails reads (no view can be ordered without it) and writes.
    let version_key = format!("rollcall/{cluster}/version");
    client.put(version_key.clone(), "7", None).await.unwrap();
    assert!(matches!(table.read_all().await, Err(Error::Corrupt { ref key, .. }) if *key == version_key));
    let v = TableVersion {
        version: 3,
        etag: Etag::new("1"),
    };
    assert!(matches!(
        table.insert_row(&full_entry(3), &v).await,
        Err(Error::Corrupt { .. })
    ));

    // A corrupt reminder.
    let reminders = store.reminder_table(&cluster).unwrap();
    let r = ReminderEntry::new(&cluster, "a", "n", Timestamp::from_millis(1), None);
    reminders.upsert_row(&r).await.unwrap();
    let rem_key = format!("rollcall/{cluster}/reminder/{:08x}/a/n", r.hash);
    client.put(rem_key.clone(), "[]", None).await.unwrap();
    assert!(
        matches!(reminders.read_row("a", "n").await, Err(Error::Corrupt { ref key, .. }) if *key == rem_key)
    );
    assert!(matches!(
        reminders.read_rows_in_range(0, 0).await,
        Err(Error::Corrupt { .. })
    ));
}

/// etcd down: every call is an `Error::Backend` within the timeout; after a
/// restart the same store works again, with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_a_backend_error_within_the_timeout_and_a_restart_recovers() {
    let Some(mut server) = OwnEtcd::start(&[], &[], "http").await else {
        return;
    };
    let store = rollcall::connect(&format!("etcd://{}?timeout_ms=1000", server.endpoint()))
        .await
        .unwrap();
    let table = store.membership_table("outage", ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    server.kill().await;
    for _ in 0..3 {
        let started = Instant::now();
        let r = table.read_all().await;
        assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "took {:?}",
            started.elapsed()
        );
    }
    let started = Instant::now();
    let w = table
        .update_i_am_alive(&full_entry(1).silo, Timestamp::from_millis(5))
        .await;
    assert!(
        matches!(w, Err(Error::Backend { ref message, .. }) if message.contains(&server.endpoint())),
        "{w:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500));
    server.spawn().await.expect("restart etcd");
    let deadline = Instant::now() + Duration::from_secs(30);
    let snap = loop {
        match table.read_all().await {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no recovery after restart: {e}"),
        }
    };
    assert_eq!(snap.version.version, 1);
    assert_eq!(snap.len(), 1);
}

/// Issue 71, written first: etcd's answers 1.5 s late on a healthy
/// connection (a proxy that delays only the server's stream frames, so
/// keepalive pings are acknowledged at once) and a 50-ms timeout: 1,100
/// reads in a row, each of which times out; then the delay removed and
/// what was late through: the next read answers within 1 s. A call that
/// timed out used to reset its stream; etcd's answer, arriving after h2
/// forgot the reset (1 s, 50 streams at most), counted as an error of the
/// client's own, and at 1,024 of them the client closed its own connection
/// (`GOAWAY(ENHANCE_YOUR_CALM, "too_many_internal_resets")`), failing every
/// call in flight on it; the same client pinged as often as its timeout,
/// and etcd closed the next connection for too many pings. The client keeps
/// its connections throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eleven_hundred_timed_out_calls_leave_the_connection_answering() {
    use rollcall_tests::delay::{DelayProxy, Delayed};
    let Some(backend) = fixtures::etcd().await else {
        return;
    };
    let upstream = tokio::net::lookup_host(backend.endpoint.as_str())
        .await
        .expect("resolve etcd")
        .next()
        .expect("an address of etcd");
    let proxy = DelayProxy::start_with(upstream, Delayed::Http2Answers).await;
    let store = rollcall::connect(&format!("etcd://{}?timeout_ms=50", proxy.addr()))
        .await
        .expect("connect through the proxy");
    let table = store
        .membership_table(&unique_id("resets"), ProtocolMode::Extended)
        .unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    for _ in 0..4 {
        table.read_all().await.expect("a read before the delay");
    }
    let made = proxy.connections();
    assert_eq!(
        made,
        rollcall::etcd::DEFAULT_CHANNELS,
        "one connection per channel"
    );
    proxy.set_delay(Duration::from_millis(1_500));
    for i in 0..1_100 {
        let r = table.read_all().await;
        assert!(
            matches!(r, Err(Error::Backend { .. })),
            "read {i} answered in time: {r:?}"
        );
    }
    let seen = store
        .connection()
        .expect("the etcd provider keeps connection figures");
    assert!(
        seen.left_running >= 1_100 && seen.cancelled == 0 && seen.own_goaways == 0,
        "every read timed out and was left running, none cancelled: {seen}"
    );
    proxy.set_delay(Duration::ZERO);
    let drained = Instant::now() + Duration::from_secs(10);
    while proxy.queued() > 0 {
        assert!(Instant::now() < drained, "{} answers still late", proxy.queued());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let answered = loop {
        match table.read_all().await {
            Ok(snapshot) => break snapshot,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(1),
                "no answer within 1 s of the delay's end: {e}"
            ),
        }
    };
    assert_eq!(answered.len(), 1);
    assert_eq!(
        proxy.connections(),
        made,
        "the client kept its connections to etcd"
    );
}

/// What [`writes_around`] saw: each write's writer, row, when it answered
/// and its error if any.
type Answers = Vec<(usize, usize, Instant, Option<Error>)>;

/// 8 writers upsert 150 reminder rows each through `via` (a proxy's URL);
/// once 200 are acknowledged, `fault` is done and `happened` awaited.
/// Checks that every acknowledged row is in the table (read through
/// `direct`), and that a write answered within 1 s of the fault. Returns
/// the answers.
async fn writes_around(via: &str, direct: &Store, fault: impl Fn(), happened: impl Fn() -> bool) -> Answers {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let via = rollcall::connect(via).await.expect("connect through the proxy");
    let service = unique_id("fault");
    let table = via.reminder_table(&service).unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Answers::new()));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (table, service, acked, seen) = (table.clone(), service.clone(), acked.clone(), seen.clone());
            tokio::spawn(async move {
                for j in 0..150 {
                    let row = ReminderEntry::new(
                        &service,
                        format!("a{w}"),
                        format!("n{j}"),
                        Timestamp::from_millis(1),
                        None,
                    );
                    let r = table.upsert_row(&row).await;
                    if r.is_ok() {
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                    seen.lock().unwrap().push((w, j, Instant::now(), r.err()));
                }
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < 200 {
        assert!(Instant::now() < until, "200 writes acknowledged before the fault");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fault();
    while !happened() {
        assert!(Instant::now() < until, "the proxy made the fault");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let at = Instant::now();
    for w in writers {
        w.await.expect("a writer");
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let again = seen
        .iter()
        .filter(|(_, _, when, e)| e.is_none() && *when > at)
        .map(|(_, _, when, _)| *when - at)
        .min()
        .expect("writes acknowledged after the fault");
    assert!(
        again < Duration::from_secs(1),
        "the first write after the fault took {again:?}"
    );
    let direct_table = direct.reminder_table(&service).unwrap();
    for (w, j, _, e) in &seen {
        if e.is_none() {
            assert!(
                direct_table
                    .read_row(&format!("a{w}"), &format!("n{j}"))
                    .await
                    .unwrap()
                    .is_some(),
                "acknowledged a{w}/n{j} is in the table"
            );
        }
    }
    let failed = seen.iter().filter(|(.., e)| e.is_some()).count();
    eprintln!(
        "{} writes, {failed} failed, the first after the fault in {again:?}",
        seen.len()
    );
    seen
}

async fn etcd_address(backend: &Backend) -> std::net::SocketAddr {
    tokio::net::lookup_host(backend.endpoint.as_str())
        .await
        .expect("resolve etcd")
        .next()
        .expect("an address of etcd")
}

/// Issue 71, item 3: the connection cut mid-load (a proxy drops it with an
/// answer in transit, as a member that dies does) under 8 writers: the
/// provider writes again, on a new connection, within 1 s of the cut; every
/// acknowledged write is in the table; every write that failed is a backend
/// error (its outcome unknown to the caller, as the contract says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_load_is_made_again_within_a_second() {
    let Some((direct, backend)) = etcd().await else {
        return;
    };
    let upstream = etcd_address(&backend).await;
    let proxy = rollcall_tests::cut::CutProxy::start(upstream, rollcall_tests::cut::Wire::Http2).await;
    let url = format!("etcd://{}?timeout_ms=2000", proxy.addr());
    let seen = writes_around(&url, &direct, || proxy.arm(), || proxy.cuts() > 0).await;
    for (w, j, _, e) in &seen {
        if let Some(e) = e {
            assert!(matches!(e, Error::Backend { .. }), "a{w}/n{j} failed with {e:?}");
        }
    }
}

/// Issue 71, item 3: etcd goes away gracefully mid-load (a proxy sends
/// `GOAWAY(NO_ERROR)` naming the last stream etcd was sent, drops the
/// client's later streams, so etcd never sees them, and closes the
/// connection 2 s later) under 8 writers: the provider writes again within
/// 1 s, every acknowledged write is in the table, and no write fails: the
/// ones at or below the last stream were answered, the ones above it were
/// never sent and are sent again on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_goaway_mid_load_fails_no_write() {
    let Some((direct, backend)) = etcd().await else {
        return;
    };
    let upstream = etcd_address(&backend).await;
    let proxy = rollcall_tests::goaway::GoAwayProxy::start(upstream, Duration::from_secs(2)).await;
    let url = format!("etcd://{}?timeout_ms=2000", proxy.addr());
    let seen = writes_around(&url, &direct, || proxy.go_away(), || proxy.connections() > 1).await;
    let failed: Vec<_> = seen.iter().filter(|(.., e)| e.is_some()).collect();
    assert!(
        failed.is_empty(),
        "{} writes failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    eprintln!(
        "{} frames of streams above the GOAWAY's last were dropped",
        proxy.dropped()
    );
}

/// Authentication: a wrong password is a clear, non-transient error naming the
/// user, answered at once; the right one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_error_naming_the_user() {
    let Some(server) = OwnEtcd::start(&[], &[], "http").await else {
        return;
    };
    let mut admin = raw(&server.endpoint()).await;
    admin.user_add("root", "root-pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let started = Instant::now();
    let r = rollcall::connect(&format!(
        "etcd://root:wrong@{}?timeout_ms=3000",
        server.endpoint()
    ))
    .await;
    match r {
        Err(e @ Error::InvalidConfig { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("`root`") && !msg.contains("wrong"), "{msg}");
            assert!(!e.is_transient());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let store = rollcall::connect(&format!("etcd://root:root-pw@{}", server.endpoint()))
        .await
        .expect("the right password");
    rollcall_tests::membership_table::insert_row_bumps_version(store.clone()).await;
    // Without credentials: refused, not hung.
    let anonymous = rollcall::connect(&format!("etcd://{}?timeout_ms=3000", server.endpoint())).await;
    assert!(anonymous.is_err(), "{anonymous:?}");
}

fn openssl(args: &[&str], dir: &Path) -> bool {
    std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A throwaway CA and a server certificate for 127.0.0.1 it signed, in `dir`.
fn make_certificates(dir: &Path) -> bool {
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    let ca_subject = "/CN=rollcall test CA";
    openssl(
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", ca_subject, "-keyout",
            "ca.key", "-out", "ca.pem",
        ],
        dir,
    ) && openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
        dir,
    ) && openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
        dir,
    )
}

/// `etcds://` with the CA file verifies the server; without it the handshake is
/// refused (a backend error, never plaintext).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_urls_verify_the_server_with_the_ca_file() {
    let certs = std::env::temp_dir().join(unique_id("etcd-tls"));
    std::fs::create_dir_all(&certs).unwrap();
    if !make_certificates(&certs) {
        assert!(
            !fixtures::backends_required(),
            "openssl is needed for the TLS test"
        );
        eprintln!("SKIPPING TLS test: no openssl");
        return;
    }
    let path = |f: &str| certs.join(f).display().to_string();
    let extra = vec![
        "--cert-file".to_owned(),
        path("server.pem"),
        "--key-file".to_owned(),
        path("server.key"),
    ];
    let Some(server) = OwnEtcd::start(&extra, std::slice::from_ref(&certs), "https").await else {
        return;
    };
    let url = format!("etcds://{}?ca_file={}", server.endpoint(), path("ca.pem"));
    let store = rollcall::connect(&url).await.expect("TLS connect");
    rollcall_tests::membership_table::insert_row_bumps_version(store.clone()).await;
    rollcall_tests::membership_table::snapshots_are_atomic(store.clone()).await;
    rollcall_tests::reminder_table::remove_row_preconditions(store.clone()).await;
    let unverified = rollcall::connect(&format!(
        "etcds://{}?ca_file={}&timeout_ms=2000",
        server.endpoint(),
        path("server.key")
    ))
    .await;
    assert!(unverified.is_err(), "a key is no CA: {unverified:?}");
    let plain = rollcall::connect(&format!("etcd://{}?timeout_ms=2000", server.endpoint())).await;
    assert!(matches!(plain, Err(Error::Backend { .. })), "{plain:?}");
    let _ = std::fs::remove_dir_all(certs);
}

/// Ring ranges larger than one page (1,000 keys) are read whole, in hash order
/// within each part, wrapping included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_reads_page_through_thousands_of_reminders() {
    let Some((store, _b)) = etcd().await else { return };
    let service = unique_id("paged");
    let table = store.reminder_table(&service).unwrap();
    let entries: Vec<ReminderEntry> = (0..2_500)
        .map(|i| {
            ReminderEntry::new(
                &service,
                format!("actor-{i}"),
                "tick",
                Timestamp::from_millis(1),
                None,
            )
        })
        .collect();
    for chunk in entries.chunks(250) {
        let mut writes = tokio::task::JoinSet::new();
        for e in chunk {
            let (table, e) = (table.clone(), e.clone());
            writes.spawn(async move { table.upsert_row(&e).await });
        }
        while let Some(r) = writes.join_next().await {
            r.unwrap().unwrap();
        }
    }
    let all = table.read_rows_in_range(0, 0).await.unwrap();
    assert_eq!(all.len(), 2_500);
    let (begin, end) = (0x4000_0000u32, 0xC000_0000u32);
    let inside = table.read_rows_in_range(begin, end).await.unwrap();
    let want = entries
        .iter()
        .filter(|e| rollcall_core::hash_in_range(e.hash, begin, end))
        .count();
    assert_eq!(inside.len(), want);
    assert!(inside.windows(2).all(|w| w[0].hash <= w[1].hash), "hash order");
    let wrapped = table.read_rows_in_range(end, begin).await.unwrap();
    assert_eq!(inside.len() + wrapped.len(), 2_500);
}

/// The member of `cluster` that is the raft leader now (index in endpoint order).
async fn leader_of(endpoints: &[String]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (i, ep) in endpoints.iter().enumerate() {
            let Ok(mut c) = etcd_client::Client::connect([format!("http://{ep}")], None).await else {
                continue;
            };
            if let Ok(status) = c.status().await {
                if status.header().is_some_and(|h| h.member_id() == status.leader()) {
                    return i;
                }
            }
        }
        assert!(Instant::now() < deadline, "no leader among {endpoints:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one writer saw: the marks of its writes that answered `true`, `false`
/// and `Err`, and the longest call.
#[derive(Default)]
struct Outcomes {
    committed: Vec<u64>,
    refused: Vec<u64>,
    failed: Vec<u64>,
    slowest: Duration,
}

/// Issue 10: a 3-member cluster loses its leader while 8 writers run conditional
/// updates. Every update that answered `true` is in the final state, none that
/// answered `false` or `Err` is (the provider settles a write that failed in
/// transport from the row's history), the version counts exactly the `true`s, and
/// no call takes longer than its documented bound (2 × timeout for a write).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_under_concurrent_conditional_updates_loses_nothing() {
    const WRITERS: u32 = 8;
    const TIMEOUT: Duration = Duration::from_millis(2000);
    let mut cluster = match fixtures::start_own(fixtures::Kind::EtcdCluster).await {
        Ok(c) => c,
        Err(e) if fixtures::backends_required() => {
            panic!("a 3-member etcd cluster of its own is needed: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPING: {e}");
            return;
        }
    };
    let endpoints: Vec<String> = cluster.endpoint.split(',').map(str::to_owned).collect();
    let store = rollcall::connect(&format!(
        "etcd://{}?timeout_ms={}",
        cluster.endpoint,
        TIMEOUT.as_millis()
    ))
    .await
    .unwrap();
    let table = store
        .membership_table("leader-loss", ProtocolMode::Extended)
        .unwrap();
    table.init(true).await.unwrap();
    for w in 0..WRITERS {
        insert(&*table, &full_entry(w)).await;
    }
    let base = table.read_all().await.unwrap().version.version;
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let after_kill = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (table, killed, after_kill, stop) =
            (table.clone(), killed.clone(), after_kill.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let silo = full_entry(w).silo;
            let mut seen = Outcomes::default();
            let mut mark = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                let snap = table.read_row(&silo).await;
                seen.slowest = seen.slowest.max(started.elapsed());
                let Ok(snap) = snap else { continue };
                let Some((row, etag)) = snap.row(&silo).cloned().map(MembershipRow::into_parts) else {
                    panic!("row of writer {w} missing")
                };
                mark += 1;
                // Each write appends its mark: the final row lists every committed one.
                let mut votes = row.suspect_votes.clone();
                votes.push(SuspectVote {
                    silo,
                    time: Timestamp::from_millis(mark),
                });
                let row = MembershipEntry {
                    suspect_votes: votes,
                    ..row
                };
                let started = Instant::now();
                let r = table.update_row(&row, &etag, &snap.version.next()).await;
                seen.slowest = seen.slowest.max(started.elapsed());
                match r {
                    Ok(true) => {
                        seen.committed.push(mark);
                        if killed.load(std::sync::atomic::Ordering::SeqCst) {
                            after_kill.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    Ok(false) => seen.refused.push(mark),
                    Err(_) => seen.failed.push(mark),
                }
            }
            seen
        }));
    }
    // Let the writers commit a while, then kill the leader (SIGKILL).
    let deadline = Instant::now() + Duration::from_secs(30);
    while table.read_all().await.map_or(0, |s| s.version.version) < base + 24 {
        assert!(Instant::now() < deadline, "no progress before the kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let leader = leader_of(&endpoints).await;
    cluster.kill_member(leader).await;
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    while after_kill.load(std::sync::atomic::Ordering::SeqCst) < 24 {
        assert!(
            Instant::now() < deadline,
            "no progress after the leader was killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for w in writers {
        outcomes.push(w.await.unwrap());
    }
    let fin = table.read_all().await.unwrap();
    let mut trues = 0u64;
    let mut errs = 0;
    for (w, seen) in outcomes.iter().enumerate() {
        let marks: Vec<u64> = fin
            .entry(&full_entry(w as u32).silo)
            .unwrap()
            .suspect_votes
            .iter()
            .map(|v| v.time.as_millis())
            .filter(|m| *m < 1_000_000) // the marks, not full_entry's own votes
            .collect();
        for m in &seen.committed {
            assert!(
                marks.contains(m),
                "writer {w}: write {m} answered true but is not in the table"
            );
        }
        for m in seen.refused.iter().chain(&seen.failed) {
            assert!(
                !marks.contains(m),
                "writer {w}: write {m} answered false/Err but is in the table"
            );
        }
        assert_eq!(
            marks.len(),
            seen.committed.len(),
            "writer {w}: table {marks:?} committed {:?} failed {:?}",
            seen.committed,
            seen.failed
        );
        assert!(
            seen.slowest <= 2 * TIMEOUT + Duration::from_millis(500),
            "writer {w}: a call took {:?}",
            seen.slowest
        );
        trues += seen.committed.len() as u64;
        errs += seen.failed.len();
    }
    assert_eq!(fin.version.version, base + trues, "the version counts the trues");
    eprintln!("{trues} committed, {errs} failed in transport, leader was member {leader}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_newest_events() {
    let Some(b) = fixtures::etcd().await else { return };
    let store = rollcall::connect(&format!("etcd://{}?history=3", b.endpoint))
        .await
        .expect("connect");
    rollcall_tests::membership_table::history_keeps_the_newest_events(store).await;
}

/// The history keys are readable with `etcdctl get --prefix` (one JSON event per
/// zero-padded version), and one that does not decode fails the history read with
/// `Error::Corrupt` naming its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_events_are_json_keys_and_a_corrupt_one_is_named() {
    let Some(b) = fixtures::etcd().await else { return };
    let store = store_on(&b.endpoint).await;
    let cluster = unique_id("cluster");
    let table = store.membership_table(&cluster, ProtocolMode::Extended).unwrap();
    table.init(true).await.unwrap();
    insert(&*table, &full_entry(1)).await;
    let mut client = etcd_client::Client::connect([format!("http://{}", b.endpoint)], None)
        .await
        .unwrap();
    let key = format!("rollcall/{cluster}/history/{:020}", 1);
    let got = client.get(key.as_str(), None).await.unwrap();
    let event: serde_json::Value = serde_json::from_slice(got.kvs()[0].value()).unwrap();
    assert_eq!(event["version"], 1);
    assert_eq!(event["silo"], full_entry(1).silo.to_string());
    client.put(key.as_str(), "{garbage", None).await.unwrap();
    match table.read_history(&rollcall_core::HistoryQuery::default()).await {
        Err(Error::Corrupt { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    insert(&*table, &full_entry(2)).await;
    assert_eq!(table.read_all().await.unwrap().version.version, 2);
}

/// A writer process killed between its chunks and its header leaves the state
/// whole, and the sweep removes the orphaned chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_killed_writer_process_leaves_a_whole_state() {
    let Some(b) = fixtures::etcd().await else {
        return;
    };
    let url = format!("etcd://{}", b.endpoint);
    let store = rollcall::connect(&url).await.expect("connect");
    rollcall_tests::state_table::killed_writer_process_leaves_a_whole_state(
        store,
        &url,
        env!("CARGO_BIN_EXE_state-writer"),
    )
    .await;
}

/// An etcd connection cut after the server answered a state commit's Txn: the
/// write learns it landed.
#[tokio::test]
async fn state_a_commit_cut_after_it_was_sent_lands_once() {
    let Some((direct, b)) = etcd().await else { return };
    let upstream: std::net::SocketAddr = b.endpoint.parse().expect("host:port");
    let proxy = rollcall_tests::cut::CutProxy::start(upstream, rollcall_tests::cut::Wire::Http2).await;
    let via = store_on(&proxy.addr().to_string()).await;
    rollcall_tests::state_table::state_a_commit_cut_after_it_was_sent_lands_once(via, direct, &proxy).await;
}

/// Writes with an expiry leave one live lease per state: each write puts its
/// header and every chunk under one lease, the lease of the state it replaces
/// is revoked, and so is the lease of a write that lost its compare. (Every
/// write and every staging batch granted a lease of its own before, and none
/// was ever revoked: leases piled up for as long as their TTL.)
#[tokio::test]
async fn state_writes_with_an_expiry_leave_one_live_lease_per_state() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage, Timestamp};
    let Some((store, b)) = etcd().await else { return };
    let mut client = raw(&b.endpoint).await;
    let service = unique_id("leases");
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/1", "cart").unwrap();
    let at = || Timestamp::from_millis(Timestamp::now().as_millis() + 3_600_000);
    let max = rollcall::etcd::ETCD_MAX_STATE_BYTES as usize;
    let mut etag = None;
    let mut seen = Vec::new();
    for (i, n) in [10, max, 20, max].into_iter().enumerate() {
        let data = vec![i as u8; n];
        etag = Some(
            s.write(
                &k,
                Expected::from_etag(etag.as_ref()),
                Codec::Raw,
                &data,
                Some(at()),
            )
            .await
            .unwrap(),
        );
        // Every key of the state is under the header's lease.
        let resp = client
            .get(
                format!("rollcall/{service}/state/"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        let leases: std::collections::BTreeSet<i64> = resp.kvs().iter().map(|kv| kv.lease()).collect();
        assert_eq!(
            leases.len(),
            1,
            "write {i}: one lease for the header and its chunks: {leases:?}"
        );
        seen.push(*leases.first().unwrap());
    }
    // A write that loses its compare (its lease is revoked) changes nothing.
    let err = s
        .write(&k, Expected::Absent, Codec::Raw, b"stale", Some(at()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InconsistentState { .. }), "{err}");
    let live = *seen.last().unwrap();
    for id in &seen[..seen.len() - 1] {
        let ttl = client.lease_time_to_live(*id, None).await.unwrap().ttl();
        assert_eq!(ttl, -1, "lease {id} of a replaced state is revoked");
    }
    assert!(client.lease_time_to_live(live, None).await.unwrap().ttl() > 0);
}

/// A page of keys under the state headers' prefix that are not states does not
/// end a listing: it goes on past them.
#[tokio::test]
async fn a_listing_pages_past_keys_that_are_not_states() {
    use rollcall_core::{Codec, Expected, StateKey, StateStorage};
    let Some((store, b)) = etcd().await else { return };
    let service = unique_id("garbage");
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/zzz", "s").unwrap();
    s.write(&k, Expected::Absent, Codec::Raw, b"x", None)
        .await
        .unwrap();
    let mut client = raw(&b.endpoint).await;
    for i in 0..10 {
        // Of the kind's range, before the state, and not `<actor>/<name>`.
        client
            .put(format!("rollcall/{service}/state/h/cart%2Fa{i}"), "x", None)
            .await
            .unwrap();
    }
    assert_eq!(s.list("cart", None, 5).await.unwrap(), [k]);
}

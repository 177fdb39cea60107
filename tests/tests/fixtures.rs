//! The backend fixtures find (or start) a real server that answers its protocol.
//! Under `CI` / `ROLLCALL_REQUIRE_BACKENDS=1` a missing server fails these tests.
//! Each runs with the feature of its backend, so the default features (the memory
//! provider) need no server.

use rollcall_tests::fixtures;

#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
fn host_port(endpoint: &str) -> String {
    let no_scheme = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let first = no_scheme.split(',').next().unwrap_or_default();
    let first = first.rsplit_once('@').map_or(first, |(_, h)| h);
    first.split('/').next().unwrap_or_default().to_owned()
}

/// Sends `request`; reads one chunk, or everything until the server closes when
/// `until_eof`.
#[cfg(any(feature = "redis", feature = "etcd", feature = "dynamodb"))]
async fn exchange(endpoint: &str, request: &[u8], until_eof: bool) -> String {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    let addr = host_port(endpoint);
    let mut s = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(&addr))
        .await
        .expect("connect timeout")
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let read = async {
        if until_eof {
            s.read_to_end(&mut buf).await.map(|_| ())
        } else {
            let mut chunk = [0u8; 512];
            s.read(&mut chunk)
                .await
                .map(|n| buf.extend_from_slice(&chunk[..n]))
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("read timeout")
        .expect("read");
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_fixture_answers_ping() {
    let Some(b) = fixtures::redis().await else { return };
    let reply = exchange(&b.endpoint, b"PING\r\n", false).await;
    assert!(
        reply.starts_with("+PONG"),
        "{} ({}) answered {reply:?}",
        b.endpoint,
        b.source
    );
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_fixture_answers_version() {
    let Some(b) = fixtures::etcd().await else { return };
    let reply = exchange(
        &b.endpoint,
        b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        true,
    )
    .await;
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.contains("etcdserver"),
        "{} ({}) answered {reply:?}",
        b.endpoint,
        b.source
    );
}

#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn dynamodb_fixture_answers_http() {
    let Some(b) = fixtures::dynamodb().await else {
        return;
    };
    let body = r#"{}"#;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\n\
         Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let reply = exchange(&b.endpoint, req.as_bytes(), true).await;
    assert!(
        reply.starts_with("HTTP/1."),
        "{} ({}) answered {reply:?}",
        b.endpoint,
        b.source
    );
    assert!(
        reply.contains("TableNames"),
        "{} ({}) is not a DynamoDB API: {reply:?}",
        b.endpoint,
        b.source
    );
}

/// Where the fixtures take each backend from, printed (`--no-capture` shows it);
/// with `ROLLCALL_BACKEND_SOURCE` set, every backend must come from there (CI's
/// container pass sets `docker`: a fixture that fell back to a local process
/// fails it).
#[cfg(all(feature = "redis", feature = "etcd", feature = "dynamodb"))]
#[tokio::test]
async fn every_backend_reports_its_source() {
    let required = std::env::var("ROLLCALL_BACKEND_SOURCE")
        .ok()
        .filter(|s| !s.is_empty());
    let backends = [
        fixtures::redis().await,
        fixtures::redis_cluster().await,
        fixtures::etcd().await,
        fixtures::etcd_cluster().await,
        fixtures::dynamodb().await,
    ];
    for b in backends.iter().flatten() {
        println!("backend {:?}: {} ({})", b.kind, b.source, b.endpoint);
        if let Some(want) = &required {
            assert_eq!(b.source, want.as_str(), "{:?} came from {}", b.kind, b.source);
        }
    }
}

/// A server whose port was taken after it was picked exits at start; the fixture
/// reports that exit (and the fixtures that pick their own ports start again on
/// fresh ones) instead of waiting 30 s for a port that never answers.
///
/// It needs a local `redis-server`. Without one it skips (Docker alone, `CI` set
/// or not), unless the test command started local servers (`ROLLCALL_REDIS_URL`
/// set, as `scripts/test.sh` does), where a missing binary is an error.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_server_whose_port_is_taken_is_reported_as_exited() {
    if fixtures::find_binary("redis-server").is_none() {
        let local_servers = std::env::var_os("ROLLCALL_REDIS_URL").is_some();
        assert!(
            !(fixtures::backends_required() && local_servers),
            "redis-server is not installed, though local servers were started"
        );
        eprintln!("skipped: no local redis-server (this test needs a local server process)");
        return;
    }
    // Bound, not listening: the server cannot bind the port, and nothing answers
    // on it, as when an outgoing connection holds it.
    let taken = tokio::net::TcpSocket::new_v4().unwrap();
    taken.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let port = taken.local_addr().unwrap().port();
    let why = fixtures::start_local_on(fixtures::Kind::Redis, Some(port))
        .await
        .expect_err("a redis-server on a taken port");
    assert!(why.contains("exited"), "{why}");
}

/// Picked ports lie below the kernel's ephemeral range (32768 and up), where no
/// outgoing connection takes them; a Redis Cluster node's bus port too.
#[test]
fn picked_ports_stay_below_the_ephemeral_range() {
    for _ in 0..100 {
        let p = fixtures::free_port().unwrap();
        assert!((10_000..30_000).contains(&p), "{p}");
        let c = fixtures::free_cluster_port().unwrap();
        assert!((10_000..20_000).contains(&c), "{c}");
    }
}

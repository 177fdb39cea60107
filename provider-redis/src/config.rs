//! Redis store configuration from a URL.

use std::time::Duration;

use rollcall_core::{
    history::parse_history_capacity, redact_password, Error, Result, DEFAULT_HISTORY_CAPACITY,
};

/// Where and how to reach Redis.
///
/// Parsed from a store URL by [`RedisConfig::from_url`]:
///
/// | URL | meaning |
/// |---|---|
/// | `redis://[user:pass@]host:port[/db]` | one server (database `db`, default 0) |
/// | `rediss://...` | the same over TLS |
/// | `redis+cluster://[user:pass@]host:port,host:port` | Redis Cluster, seed nodes (`rediss+cluster://` for TLS) |
/// | `redis+sentinel://[user:pass@]host:port,host:port/<master-name>[/db]` | a primary with replicas behind Redis Sentinel: the sentinels' addresses and the monitored master's name (`rediss+sentinel://` for TLS to the sentinels and the servers) |
///
/// With Sentinel, `user:pass` authenticates to the Redis servers (the primary and
/// its replicas); the sentinels are reached without credentials. The primary is
/// found through the sentinels (the redis crate's `sentinel` module) at the first
/// call, and found again after a call fails in a way that says it is gone or no
/// longer primary (a refused or lost connection, a timeout, `READONLY`,
/// `MASTERDOWN`, `LOADING`).
///
/// TLS verifies the server against the Mozilla root certificates (webpki-roots);
/// `#insecure` at the end of a `rediss` URL skips verification (self-signed test
/// servers only).
///
/// Query parameters (all optional): `prefix` (key prefix, default `rollcall`),
/// `pool_size` (pooled connections per node for transactions, default 16),
/// `timeout_ms` (connect, pool wait and response timeout, default 5000), `history`
/// (membership-history events kept per cluster, default
/// [`DEFAULT_HISTORY_CAPACITY`]; 0 keeps none), `wait_replicas` and `wait_ms`
/// (see [`RedisConfig::wait_replicas`]; default 0: no `WAIT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// Node URLs: the server, or the cluster's seed nodes (`redis://` or `rediss://`).
    pub nodes: Vec<String>,
    /// Redis Cluster mode.
    pub cluster: bool,
    /// First part of every key (`<prefix>:{m:<cluster>}:...`).
    pub key_prefix: String,
    /// Pooled connections per node (WATCH needs a connection of its own).
    pub pool_size: usize,
    /// Connect, pool-wait and response timeout.
    pub timeout: Duration,
    /// TLS (`rediss`).
    pub tls: bool,
    /// Membership-history events kept per cluster (0: none).
    pub history_capacity: u64,
    /// With Sentinel (`redis+sentinel://`): the monitored master and how to reach
    /// the servers; [`nodes`](Self::nodes) are then the sentinels' URLs.
    pub sentinel: Option<SentinelTarget>,
    /// Replicas that must acknowledge every conditional write rollcall reports as
    /// done (`WAIT <n> <wait_ms>` after it, on the same connection): membership
    /// rows with the version row, shard leases, reminder rows and actor-state
    /// commits. 0 (the default) sends no `WAIT`. A write that fewer replicas
    /// acknowledge within [`wait_timeout`](Self::wait_timeout) is reported as an
    /// outcome that may or may not survive a failover (an
    /// [`Error::Backend`] or, for an actor-state commit, an
    /// [`Error::OutcomeUnknown`]), never as a success. Redis' own documentation:
    /// `WAIT` narrows the window in which an acknowledged write is lost in a
    /// failover, but does not make Redis strongly consistent.
    pub wait_replicas: u32,
    /// How long a `WAIT` waits for [`wait_replicas`](Self::wait_replicas)
    /// acknowledgements (`wait_ms`, default 1000 ms; less than `timeout_ms`).
    pub wait_timeout: Duration,
}

/// The master a `redis+sentinel://` URL names, and how to reach the servers the
/// sentinels point at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The master name the sentinels monitor (`sentinel monitor <name> ...`).
    pub master: String,
    /// `user:pass@` for the Redis servers, or empty.
    pub auth: String,
    /// The database on the servers (default 0).
    pub db: u32,
}

impl RedisConfig {
    /// Parses a store URL (see the type's docs).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with field `store_url` naming what is wrong.
    pub fn from_url(url: &str) -> Result<RedisConfig> {
        let bad =
            |why: &str| Error::invalid_config("store_url", format!("`{}`: {why}", redact_password(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected redis://host:port"))?;
        let (tls, cluster, sentinel) = match scheme {
            "redis" => (false, false, false),
            "rediss" => (true, false, false),
            "redis+cluster" => (false, true, false),
            "rediss+cluster" => (true, true, false),
            "redis+sentinel" => (false, false, true),
            "rediss+sentinel" => (true, false, true),
            _ => {
                return Err(bad(
                    "scheme must be redis, rediss, redis+cluster, rediss+cluster, redis+sentinel or rediss+sentinel",
                ))
            }
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((r, "insecure")) if tls => (r, "#insecure"),
            Some((_, f)) => {
                return Err(bad(&format!(
                    "unknown fragment `#{f}` (only `#insecure`, with rediss)"
                )))
            }
            None => (rest, ""),
        };
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut cfg = RedisConfig {
            nodes: Vec::new(),
            cluster,
            key_prefix: "rollcall".into(),
            pool_size: 16,
            timeout: Duration::from_secs(5),
            tls: false,
            history_capacity: DEFAULT_HISTORY_CAPACITY,
            sentinel: None,
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(1000),
        };
        let mut wait_ms_given = false;
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "prefix" => {
                    if v.is_empty() || v.contains(['{', '}']) {
                        return Err(bad("prefix must be non-empty without braces"));
                    }
                    cfg.key_prefix = v.into_owned();
                }
                "pool_size" => {
                    cfg.pool_size = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=1024).contains(n))
                        .ok_or_else(|| bad("pool_size must be 1..=1024"))?;
                }
                "timeout_ms" => {
                    let ms: u64 = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("timeout_ms must be a positive integer"))?;
                    cfg.timeout = Duration::from_millis(ms);
                }
                "history" => cfg.history_capacity = parse_history_capacity(&v).map_err(|e| bad(&e))?,
                "wait_replicas" => {
                    cfg.wait_replicas = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= 64)
                        .ok_or_else(|| bad("wait_replicas must be 0..=64"))?;
                }
                "wait_ms" => {
                    let ms: u64 = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("wait_ms must be a positive integer"))?;
                    cfg.wait_timeout = Duration::from_millis(ms);
                    wait_ms_given = true;
                }
                other => {
                    return Err(bad(&format!(
                        "unknown parameter `{other}` (prefix, pool_size, timeout_ms, history, wait_replicas, wait_ms)"
                    )))
                }
            }
        }
        if wait_ms_given && cfg.wait_replicas == 0 {
            return Err(bad("wait_ms needs wait_replicas"));
        }
        if cfg.wait_replicas > 0 && cfg.wait_timeout >= cfg.timeout {
            return Err(bad("wait_ms must be less than timeout_ms"));
        }
        let node_scheme = if tls { "rediss" } else { "redis" };
        let (auth, hosts) = match main.rsplit_once('@') {
            Some((a, h)) => (format!("{a}@"), h),
            None => (String::new(), main),
        };
        if sentinel {
            // host:port,host:port/<master-name>[/db]
            let (sentinels, path) = hosts
                .split_once('/')
                .ok_or_else(|| bad("expected redis+sentinel://host:port[,host:port]/<master-name>"))?;
            let (name, db) = match path.split_once('/') {
                Some((n, d)) => (n, Some(d)),
                None => (path, None),
            };
            if name.is_empty() {
                return Err(bad(
                    "the master name is missing: redis+sentinel://host:port/<master-name>",
                ));
            }
            if let Some(db) = db {
                db.parse::<u32>()
                    .map_err(|_| bad("the database after the master name must be a number"))?;
            }
            for h in sentinels.split(',').filter(|h| !h.is_empty()) {
                // The sentinels themselves: no credentials, no database.
                cfg.nodes.push(format!("{node_scheme}://{h}/{fragment}"));
            }
            cfg.sentinel = Some(SentinelTarget {
                master: name.to_owned(),
                auth: auth.clone(),
                db: db.map_or(Ok(0), str::parse).map_err(|_| bad("database"))?,
            });
        } else if cluster {
            if hosts.contains('/') {
                return Err(bad("Redis Cluster has no databases: remove the /db part"));
            }
            for h in hosts.split(',').filter(|h| !h.is_empty()) {
                cfg.nodes.push(
                    format!("{node_scheme}://{auth}{h}{}", if tls { "/" } else { "" }).to_owned() + fragment,
                );
            }
        } else {
            let slash = if tls && !hosts.contains('/') { "/" } else { "" };
            cfg.nodes
                .push(format!("{node_scheme}://{auth}{hosts}{slash}{fragment}"));
        }
        cfg.tls = tls;
        if cfg.nodes.is_empty() || hosts.is_empty() {
            return Err(bad("missing host"));
        }
        for n in &cfg.nodes {
            redis::Client::open(n.as_str()).map_err(|e| bad(&e.to_string()))?;
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_standalone_tls_and_cluster_urls() {
        let c =
            RedisConfig::from_url("redis://127.0.0.1:6379/2?prefix=app&pool_size=4&timeout_ms=250&history=7")
                .unwrap();
        assert_eq!(c.nodes, vec!["redis://127.0.0.1:6379/2"]);
        assert!(!c.cluster);
        assert_eq!(
            (c.key_prefix.as_str(), c.pool_size, c.timeout),
            ("app", 4, Duration::from_millis(250))
        );
        assert_eq!(c.history_capacity, 7);
        let c = RedisConfig::from_url("rediss://u:p@h:6380").unwrap();
        assert_eq!(c.nodes, vec!["rediss://u:p@h:6380/"]);
        assert!(c.tls);
        let c = RedisConfig::from_url("rediss://h:6380?timeout_ms=9#insecure").unwrap();
        assert_eq!(c.nodes, vec!["rediss://h:6380/#insecure"]);
        assert!(
            RedisConfig::from_url("redis://h:6380#insecure").is_err(),
            "#insecure only with TLS"
        );
        let c = RedisConfig::from_url("redis+cluster://u:p@a:7000,b:7001").unwrap();
        assert!(c.cluster);
        assert_eq!(c.nodes, vec!["redis://u:p@a:7000", "redis://u:p@b:7001"]);
    }

    #[test]
    fn parses_sentinel_urls_and_wait_options() {
        let c =
            RedisConfig::from_url("redis+sentinel://u:p@a:26379,b:26380/main/2?wait_replicas=1&wait_ms=250")
                .unwrap();
        assert_eq!(
            c.nodes,
            vec!["redis://a:26379/", "redis://b:26380/"],
            "sentinels, no credentials"
        );
        assert_eq!(
            c.sentinel,
            Some(SentinelTarget {
                master: "main".into(),
                auth: "u:p@".into(),
                db: 2
            })
        );
        assert!(!c.cluster);
        assert_eq!((c.wait_replicas, c.wait_timeout), (1, Duration::from_millis(250)));
        let c = RedisConfig::from_url("rediss+sentinel://a:26379/main#insecure").unwrap();
        assert_eq!(c.nodes, vec!["rediss://a:26379/#insecure"]);
        assert!(c.tls);
        assert_eq!(c.sentinel.map(|t| (t.master, t.db)), Some(("main".into(), 0)));
        let c = RedisConfig::from_url("redis://h:1?wait_replicas=2").unwrap();
        assert_eq!(
            (c.wait_replicas, c.wait_timeout),
            (2, Duration::from_millis(1000))
        );
        assert_eq!(RedisConfig::from_url("redis://h:1").unwrap().wait_replicas, 0);
    }

    #[test]
    fn rejects_bad_urls_and_hides_passwords() {
        for u in [
            "redis://",
            "mysql://h:1",
            "redis://h:1?pool_size=0",
            "redis://h:1?nope=1",
            "redis+cluster://a:1/3",
            "redis://h:1?timeout_ms=x",
            "redis://h:1?history=-1",
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:1/m/x",
            "redis://h:1?wait_replicas=x",
            "redis://h:1?wait_ms=10",
            "redis://h:1?wait_replicas=1&wait_ms=5000",
            "redis://h:1?wait_replicas=1&wait_ms=0",
        ] {
            match RedisConfig::from_url(u) {
                Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, "store_url", "{u}"),
                other => panic!("{u}: {other:?}"),
            }
        }
        let e = RedisConfig::from_url("redis://user:secret@h:1?bad=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("user:***"), "{e}");
    }
}

//! Redis store configuration from a URL.

use std::time::Duration;

use rollcall_membership_core::{
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
///
/// TLS verifies the server against the Mozilla root certificates (webpki-roots);
/// `#insecure` at the end of a `rediss` URL skips verification (self-signed test
/// servers only).
///
/// Query parameters (all optional): `prefix` (key prefix, default `rollcall`),
/// `pool_size` (pooled connections per node for transactions, default 16),
/// `timeout_ms` (connect, pool wait and response timeout, default 5000), `history`
/// (membership-history events kept per cluster, default
/// [`DEFAULT_HISTORY_CAPACITY`]; 0 keeps none).
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
        let (tls, cluster) = match scheme {
            "redis" => (false, false),
            "rediss" => (true, false),
            "redis+cluster" => (false, true),
            "rediss+cluster" => (true, true),
            _ => {
                return Err(bad(
                    "scheme must be redis, rediss, redis+cluster or rediss+cluster",
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
        };
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
                other => {
                    return Err(bad(&format!(
                        "unknown parameter `{other}` (prefix, pool_size, timeout_ms, history)"
                    )))
                }
            }
        }
        let node_scheme = if tls { "rediss" } else { "redis" };
        let (auth, hosts) = match main.rsplit_once('@') {
            Some((a, h)) => (format!("{a}@"), h),
            None => (String::new(), main),
        };
        if cluster {
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
    fn rejects_bad_urls_and_hides_passwords() {
        for u in [
            "redis://",
            "mysql://h:1",
            "redis://h:1?pool_size=0",
            "redis://h:1?nope=1",
            "redis+cluster://a:1/3",
            "redis://h:1?timeout_ms=x",
            "redis://h:1?history=-1",
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

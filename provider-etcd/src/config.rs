//! etcd store configuration from a URL.

use std::path::PathBuf;
use std::time::Duration;

use rollcall_core::{
    history::parse_history_capacity, redact_password, Error, Result, DEFAULT_HISTORY_CAPACITY,
};

/// Where and how to reach etcd.
///
/// Parsed from a store URL by [`EtcdConfig::from_url`]:
///
/// | URL | meaning |
/// |---|---|
/// | `etcd://host:port[,host:port...]` | plain gRPC to one or more members (requests are balanced over them) |
/// | `etcds://host:port[,...]` | the same over TLS (rustls) |
/// | `etcd://user:password@host:port` | etcd authentication (user and password percent-encoded) |
///
/// Query parameters (all optional):
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | `rollcall` | first segment(s) of every key (`<prefix>/<cluster>/...`); may contain `/` |
/// | `timeout_ms` | `5000` | connect timeout and per-request timeout, in milliseconds |
/// | `history` | `10000` | membership-history events kept per cluster (0: none) |
/// | `channels` | `2` | HTTP/2 connections per member, 1 to 4; calls go to them in turn, so one connection's end fails only its share of the calls in flight |
/// | `ca_file` | none | PEM file of the CA that signed the servers' certificates (TLS) |
/// | `cert_file`, `key_file` | none | PEM client certificate and key, for etcd's `--client-cert-auth` (TLS) |
/// | `domain` | the endpoint's host | the name the server certificate must carry (TLS) |
///
/// `ca_file`, `cert_file`, `key_file` and `domain` need `etcds://`. Without `ca_file`
/// the server certificate is checked against no roots and the handshake fails, so a
/// TLS URL always names its CA.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member, in the given order.
    pub endpoints: Vec<String>,
    /// First part of every key.
    pub key_prefix: String,
    /// Connect timeout and per-request timeout.
    pub timeout: Duration,
    /// TLS (`etcds://`).
    pub tls: bool,
    /// CA certificate file (PEM), TLS only.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key files (PEM), TLS only.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Server name to verify instead of the endpoint's host, TLS only.
    pub domain: Option<String>,
    /// User name and password for etcd authentication.
    pub user: Option<(String, String)>,
    /// Membership-history events kept per cluster (0: none).
    pub history_capacity: u64,
    /// HTTP/2 connections per member (1 to [`MAX_CHANNELS`]), used in turn.
    pub channels: usize,
}

/// The most HTTP/2 connections per member a URL may ask for (`channels`).
pub const MAX_CHANNELS: usize = 4;

/// HTTP/2 connections per member unless the URL says otherwise.
pub const DEFAULT_CHANNELS: usize = 2;

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("domain", &self.domain)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("history_capacity", &self.history_capacity)
            .field("channels", &self.channels)
            .finish()
    }
}

impl EtcdConfig {
    /// Parses a store URL (see the type's docs).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with field `store_url` naming what is wrong; the
    /// message never contains the password.
    pub fn from_url(url: &str) -> Result<EtcdConfig> {
        let bad =
            |why: &str| Error::invalid_config("store_url", format!("`{}`: {why}", redact_password(url)));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected etcd://host:port"))?;
        let tls = match scheme {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("scheme must be etcd or etcds")),
        };
        let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
        let main = main.trim_end_matches('/');
        if main.contains('/') {
            return Err(bad("etcd URLs have no path: use ?prefix= for the key prefix"));
        }
        let (user, hosts) = match main.rsplit_once('@') {
            Some((creds, hosts)) => {
                let (u, p) = creds
                    .split_once(':')
                    .ok_or_else(|| bad("credentials must be user:password"))?;
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8()
                        .map(|c| c.into_owned())
                        .map_err(|_| bad("credentials are not UTF-8 after percent-decoding"))
                };
                let (u, p) = (decode(u)?, decode(p)?);
                if u.is_empty() {
                    return Err(bad("empty user name"));
                }
                (Some((u, p)), hosts)
            }
            None => (None, main),
        };
        let mut cfg = EtcdConfig {
            endpoints: Vec::new(),
            key_prefix: "rollcall".into(),
            timeout: Duration::from_secs(5),
            tls,
            ca_file: None,
            client_cert: None,
            domain: None,
            user,
            history_capacity: DEFAULT_HISTORY_CAPACITY,
            channels: DEFAULT_CHANNELS,
        };
        for h in hosts.split(',').filter(|h| !h.is_empty()) {
            let port = h
                .rsplit_once(':')
                .and_then(|(host, p)| (!host.is_empty()).then(|| p.parse::<u16>().ok()).flatten());
            if port.is_none() {
                return Err(bad(&format!("endpoint `{h}` is not host:port")));
            }
            cfg.endpoints.push(h.to_owned());
        }
        if cfg.endpoints.is_empty() {
            return Err(bad("missing host:port"));
        }
        let (mut cert, mut key) = (None, None);
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "prefix" => {
                    let p = v.trim_matches('/');
                    if p.is_empty() || p.chars().any(char::is_control) {
                        return Err(bad("prefix must be non-empty, without control characters"));
                    }
                    cfg.key_prefix = p.to_owned();
                }
                "timeout_ms" => {
                    let ms: u64 = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=3_600_000).contains(n))
                        .ok_or_else(|| bad("timeout_ms must be an integer in 1..=3600000"))?;
                    cfg.timeout = Duration::from_millis(ms);
                }
                "ca_file" => cfg.ca_file = Some(PathBuf::from(v.as_ref())),
                "cert_file" => cert = Some(PathBuf::from(v.as_ref())),
                "key_file" => key = Some(PathBuf::from(v.as_ref())),
                "domain" => cfg.domain = Some(v.into_owned()),
                "history" => cfg.history_capacity = parse_history_capacity(&v).map_err(|e| bad(&e))?,
                "channels" => {
                    cfg.channels = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_CHANNELS).contains(n))
                        .ok_or_else(|| bad("channels must be an integer in 1..=4"))?;
                }
                other => {
                    return Err(bad(&format!(
                    "unknown parameter `{other}` (prefix, timeout_ms, ca_file, cert_file, key_file, domain, history, channels)"
                )))
                }
            }
        }
        match (cert, key) {
            (Some(c), Some(k)) => cfg.client_cert = Some((c, k)),
            (None, None) => {}
            _ => return Err(bad("cert_file and key_file go together")),
        }
        if !tls && (cfg.ca_file.is_some() || cfg.client_cert.is_some() || cfg.domain.is_some()) {
            return Err(bad("ca_file, cert_file, key_file and domain need etcds://"));
        }
        Ok(cfg)
    }

    /// The endpoints as URLs for the client (`http://` or `https://`).
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints.iter().map(|h| format!("{scheme}://{h}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints_auth_tls_and_options() {
        let c = EtcdConfig::from_url(
            "etcd://10.0.0.1:2379,10.0.0.2:2379?prefix=/app/rc/&timeout_ms=250&history=0&channels=4",
        )
        .unwrap();
        assert_eq!(c.history_capacity, 0);
        assert_eq!(c.channels, 4);
        assert_eq!(
            EtcdConfig::from_url("etcd://h:1").unwrap().channels,
            DEFAULT_CHANNELS
        );
        assert_eq!(c.endpoints, vec!["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(c.key_prefix, "app/rc");
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert!(!c.tls && c.user.is_none());
        assert_eq!(
            c.endpoint_urls(),
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        let c = EtcdConfig::from_url("etcds://al%40x:p%3Aw+d%26@h:1?ca_file=/tmp/ca.pem&domain=etcd.local")
            .unwrap();
        assert!(c.tls);
        assert_eq!(c.user, Some(("al@x".into(), "p:w+d&".into())));
        assert_eq!(c.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(c.domain.as_deref(), Some("etcd.local"));
        assert_eq!(c.endpoint_urls(), vec!["https://h:1"]);
        let c = EtcdConfig::from_url("etcds://h:1?ca_file=a&cert_file=b&key_file=c").unwrap();
        assert_eq!(c.client_cert, Some((PathBuf::from("b"), PathBuf::from("c"))));
        assert!(!format!("{:?}", EtcdConfig::from_url("etcd://u:secret@h:1").unwrap()).contains("secret"));
    }

    #[test]
    fn rejects_bad_urls_without_showing_passwords() {
        for u in [
            "etcd://",
            "etcd://host",
            "etcd://:2379",
            "http://h:1",
            "etcd://h:1/x",
            "etcd://h:1?timeout_ms=0",
            "etcd://h:1?channels=0",
            "etcd://h:1?channels=5",
            "etcd://h:1?history=x",
            "etcd://h:1?nope=1",
            "etcd://h:1?ca_file=x",
            "etcds://h:1?cert_file=x",
            "etcd://user@h:1",
            "etcd://h:1?prefix=/",
        ] {
            match EtcdConfig::from_url(u) {
                Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, "store_url", "{u}"),
                other => panic!("{u}: {other:?}"),
            }
        }
        let e = EtcdConfig::from_url("etcd://user:secret@h:1?bad=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret") && e.contains("user:***"), "{e}");
    }
}

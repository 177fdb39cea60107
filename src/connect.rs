//! Store selection from a URL.

use std::fmt;
use std::sync::Arc;

use rollcall_core::{redact_password, Error, Result, SystemStore};

/// A parsed store URL: which provider, and where.
///
/// Parsing never needs the provider's feature, so a URL can be checked (and a clear
/// "compiled out" error given) in any build.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory://` or `memory://NAME`: a process-wide in-memory store; every
    /// [`connect`] with the same name (empty by default) returns the same tables.
    Memory {
        /// The store's name within this process.
        name: String,
    },
    /// `redis://...`, `rediss://...`, `redis+cluster://...`, `redis+sentinel://...`
    /// (and `rediss+` of both): the URL is handed to the Redis provider unchanged.
    Redis {
        /// The whole URL.
        url: String,
    },
    /// `etcd://[user:password@]host:port[,host:port...][?prefix=...&timeout_ms=...]`,
    /// or `etcds://...` for TLS (see the etcd provider's `EtcdConfig`).
    Etcd {
        /// `host:port` of each endpoint, in the given order.
        endpoints: Vec<String>,
        /// The whole URL, for the provider.
        url: String,
    },
    /// `dynamodb://TABLE[?endpoint=URL&region=REGION&...]` (see the DynamoDB
    /// provider's `DynamoDbConfig` for every parameter).
    DynamoDb {
        /// The table name.
        table: String,
        /// A custom endpoint (moto, DynamoDB Local), if any.
        endpoint: Option<String>,
        /// The AWS region, if given (otherwise the SDK's default chain decides).
        region: Option<String>,
        /// The whole URL, for the provider.
        url: String,
    },
}

impl StoreUrl {
    /// Parses a store URL.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with field `store_url` for an unknown scheme or a
    /// malformed URL.
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let bad = |why: &str| Error::invalid_config("store_url", format!("`{url}`: {why}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected SCHEME://..., e.g. memory:// or redis://127.0.0.1:6379"))?;
        match scheme.to_ascii_lowercase().as_str() {
            "memory" => {
                let name = rest.trim_end_matches('/');
                if name.contains(['/', '?', '#']) {
                    return Err(bad("memory:// takes only an optional store name"));
                }
                Ok(StoreUrl::Memory {
                    name: name.to_owned(),
                })
            }
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel" => {
                if rest.is_empty() {
                    return Err(bad("missing host"));
                }
                Ok(StoreUrl::Redis { url: url.to_owned() })
            }
            "etcd" | "etcds" => {
                let hosts = rest.split(['/', '?']).next().unwrap_or_default();
                let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
                let endpoints: Vec<String> = hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned)
                    .collect();
                if endpoints.is_empty() {
                    return Err(bad("expected etcd://host:port[,host:port]"));
                }
                for ep in &endpoints {
                    let port = ep.rsplit_once(':').map(|(_, p)| p);
                    if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
                        return Err(bad(&format!("endpoint `{ep}` is not host:port")));
                    }
                }
                Ok(StoreUrl::Etcd {
                    endpoints,
                    url: url.to_owned(),
                })
            }
            "dynamodb" => {
                let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
                let table = parsed.host_str().unwrap_or_default().to_owned();
                if table.is_empty() {
                    return Err(bad("expected dynamodb://TABLE[?endpoint=URL&region=REGION]"));
                }
                let mut endpoint = None;
                let mut region = None;
                // The provider checks every parameter (it knows more than these).
                for (k, v) in parsed.query_pairs() {
                    match k.as_ref() {
                        "endpoint" => endpoint = Some(v.into_owned()),
                        "region" => region = Some(v.into_owned()),
                        _ => {}
                    }
                }
                Ok(StoreUrl::DynamoDb {
                    table,
                    endpoint,
                    region,
                    url: url.to_owned(),
                })
            }
            other => Err(bad(&format!(
                "unknown scheme `{other}` (expected memory, redis, rediss, redis+cluster, redis+sentinel, etcd, etcds or dynamodb)"
            ))),
        }
    }

    /// The provider feature of the `rollcall` crate this URL needs.
    pub fn feature(&self) -> &'static str {
        match self {
            StoreUrl::Memory { .. } => "memory",
            StoreUrl::Redis { .. } => "redis",
            StoreUrl::Etcd { .. } => "etcd",
            StoreUrl::DynamoDb { .. } => "dynamodb",
        }
    }
}

/// Shows the URL with any password replaced by `***`.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory { name } => write!(f, "memory://{name}"),
            StoreUrl::Redis { url } | StoreUrl::DynamoDb { url, .. } | StoreUrl::Etcd { url, .. } => {
                f.write_str(&redact_password(url))
            }
        }
    }
}

#[allow(dead_code)] // used only by the providers compiled in
fn compiled_out(url: &StoreUrl) -> Error {
    Error::Unsupported(format!(
        "store URL `{url}` needs the `{}` feature of the rollcall crate, which this build does not enable \
         (add `features = [\"{}\"]` to the rollcall dependency)",
        url.feature(),
        url.feature()
    ))
}

#[cfg(feature = "memory")]
fn memory_store(name: &str) -> Arc<dyn SystemStore> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use rollcall_provider_memory::MemoryStore;

    static STORES: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    Arc::new(stores.entry(name.to_owned()).or_default().clone())
}

/// Opens the store named by `url` with the provider compiled in for its scheme.
///
/// See [`StoreUrl`] for the URL forms. `memory://` stores live as long as the process
/// and are shared by every `connect` with the same name.
///
/// # Errors
/// - [`Error::InvalidConfig`] (field `store_url`) for a malformed URL;
/// - [`Error::Unsupported`] naming the missing cargo feature when the scheme's
///   provider is compiled out;
/// - the provider's own errors ([`Error::Backend`] when the server cannot be reached).
pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
    let parsed = StoreUrl::parse(url)?;
    match &parsed {
        #[cfg(feature = "memory")]
        StoreUrl::Memory { name } => Ok(memory_store(name)),
        #[cfg(feature = "redis")]
        StoreUrl::Redis { url } => rollcall_provider_redis::RedisStore::connect(url).await,
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd { url, .. } => rollcall_provider_etcd::EtcdStore::connect(url).await,
        #[cfg(feature = "dynamodb")]
        StoreUrl::DynamoDb { url, .. } => rollcall_provider_dynamodb::DynamoDbStore::connect(url).await,
        #[allow(unreachable_patterns)]
        _ => Err(compiled_out(&parsed)),
    }
}

/// [`connect`], retried while the store is unreachable, for at most `within`.
///
/// A cluster and its store often start together (a Kubernetes rollout, a host
/// reboot), so a silo should wait for its store the way Orleans waits up to
/// `max_join_attempt_time` for its table. Transient failures
/// ([`Error::Backend`]) are logged (`tracing` warn, the URL with its password
/// redacted) and retried with exponential backoff from 100 ms up to 5 s; the last
/// attempt starts no later than `within` after the call.
///
/// # Errors
/// - [`Error::InvalidConfig`] / [`Error::Unsupported`] at once, as [`connect`];
/// - [`Error::Backend`] naming the store URL and the last failure once `within`
///   has passed.
pub async fn connect_retrying(url: &str, within: std::time::Duration) -> Result<Arc<dyn SystemStore>> {
    let what = format!("store {}", StoreUrl::parse(url)?);
    rollcall_core::retry_transient(&what, within, || connect(url)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<StoreUrl>) -> String {
        match r {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            StoreUrl::parse("memory://").unwrap(),
            StoreUrl::Memory { name: String::new() }
        );
        assert_eq!(
            StoreUrl::parse("memory://a").unwrap(),
            StoreUrl::Memory { name: "a".into() }
        );
        assert!(matches!(
            StoreUrl::parse("redis://u:p@127.0.0.1:6379/2").unwrap(),
            StoreUrl::Redis { .. }
        ));
        assert!(matches!(
            StoreUrl::parse("rediss://h:6380").unwrap(),
            StoreUrl::Redis { .. }
        ));
        assert!(matches!(
            StoreUrl::parse("redis+cluster://a:1,b:2").unwrap(),
            StoreUrl::Redis { .. }
        ));
        assert_eq!(
            StoreUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                url: "etcd://10.0.0.1:2379,10.0.0.2:2379".into(),
            }
        );
        match StoreUrl::parse("etcds://u:secret@h:1,h:2?ca_file=/ca.pem").unwrap() {
            u @ StoreUrl::Etcd { .. } => {
                assert!(matches!(&u, StoreUrl::Etcd { endpoints, .. } if endpoints == &["h:1", "h:2"]));
                assert!(!u.to_string().contains("secret"), "{u}");
            }
            other => panic!("{other:?}"),
        }
        match StoreUrl::parse("dynamodb://rollcall?endpoint=http://127.0.0.1:5000&region=eu-west-1").unwrap()
        {
            StoreUrl::DynamoDb {
                table,
                endpoint,
                region,
                ..
            } => {
                assert_eq!(table, "rollcall");
                assert_eq!(endpoint.as_deref(), Some("http://127.0.0.1:5000"));
                assert_eq!(region.as_deref(), Some("eu-west-1"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_urls_naming_store_url() {
        for u in [
            "",
            "localhost:6379",
            "mysql://x",
            "etcd://",
            "etcd://host",
            "dynamodb://",
            "memory://a/b",
        ] {
            assert_eq!(field(StoreUrl::parse(u)), "store_url", "{u}");
        }
    }

    #[tokio::test]
    async fn memory_urls_share_a_store_by_name() {
        use rollcall_core::ProtocolMode;
        let a = connect("memory://shared-test").await.unwrap();
        let b = connect("memory://shared-test").await.unwrap();
        let c = connect("memory://other-test").await.unwrap();
        let ta = a.membership_table("c", ProtocolMode::Extended).unwrap();
        let snap = ta.read_all().await.unwrap();
        let row = rollcall_core::MembershipEntry::new(
            "127.0.0.1:1@1".parse().unwrap(),
            rollcall_core::SiloStatus::Active,
            rollcall_core::Timestamp::from_millis(1),
        );
        assert!(ta.insert_row(&row, &snap.version.next()).await.unwrap());
        let tb = b.membership_table("c", ProtocolMode::Extended).unwrap();
        assert_eq!(tb.read_all().await.unwrap().len(), 1);
        let tc = c.membership_table("c", ProtocolMode::Extended).unwrap();
        assert_eq!(tc.read_all().await.unwrap().len(), 0);
    }

    #[cfg(not(feature = "etcd"))]
    #[tokio::test]
    async fn compiled_out_scheme_names_the_feature() {
        match connect("etcd://127.0.0.1:2379").await {
            Err(Error::Unsupported(msg)) => assert!(msg.contains("`etcd` feature"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}

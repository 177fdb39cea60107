//! DynamoDB store configuration from a URL.

use std::time::Duration;

use rollcall_core::{history::parse_history_capacity, Error, Result, DEFAULT_HISTORY_CAPACITY};

/// Where the tables are and how to reach them.
///
/// Parsed from a store URL by [`DynamoDbConfig::from_url`]:
/// `dynamodb://<membership table>?<parameters>`.
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `region` | the AWS chain's (`AWS_REGION`, profile), else `us-east-1` | AWS region |
/// | `endpoint` | AWS's | endpoint override for a local server (`http://127.0.0.1:8000`) |
/// | `reminders_table` | `<table>-reminders` | the reminder table |
/// | `statistics_table` | `<table>-statistics` | the statistics store's table (created on first use when `create_if_missing`) |
/// | `state_table` | `<table>-state` | the grain-state table (created on first use when `create_if_missing`) |
/// | `statistics_shards` | `4` | partitions per cluster, level and hour of the statistics table, picked by a hash of the silo (1–64); fixed for the table's life |
/// | `timeout_ms` | `5000` | bound on each call, SDK retries included, in milliseconds |
/// | `max_attempts` | `3` | SDK attempts per request (standard retry mode: throttling and 5xx) |
/// | `create_if_missing` | `false` | create missing tables (on-demand billing) in `init`; for development |
/// | `reminder_shards` | `16` | partitions per service of the reminder table (a power of two, 1–256); fixed for the table's life |
/// | `history` | `10000` | membership-history events kept per cluster (0: none); lowering it later leaves the older events until `delete_cluster` |
///
/// Credentials come from the standard AWS chain (environment, profile files, web
/// identity, ECS and EC2 instance metadata); they never appear in the URL. A
/// local server accepts any credentials but the chain must still find some (e.g.
/// `AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamoDbConfig {
    /// The membership table.
    pub table: String,
    /// The reminder table.
    pub reminders_table: String,
    /// The statistics store's table.
    pub statistics_table: String,
    /// The grain-state table.
    pub state_table: String,
    /// Partitions per (cluster, level, hour) of the statistics table (1..=64).
    pub statistics_shards: u32,
    /// Region override.
    pub region: Option<String>,
    /// Endpoint override (a local server).
    pub endpoint: Option<String>,
    /// Bound on each call, retries included.
    pub timeout: Duration,
    /// SDK attempts per request.
    pub max_attempts: u32,
    /// Create missing tables in `init`.
    pub create_if_missing: bool,
    /// Partitions per service of the reminder table (power of two, 1..=256).
    pub reminder_shards: u32,
    /// Membership-history events kept per cluster (0: none).
    pub history_capacity: u64,
}

/// DynamoDB table names: 3-255 characters of `[A-Za-z0-9_.-]`.
fn valid_table_name(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl DynamoDbConfig {
    /// Parses a store URL (see the type's docs).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with field `store_url` (or the parameter's name)
    /// saying what is wrong.
    pub fn from_url(url: &str) -> Result<DynamoDbConfig> {
        let bad = |why: &str| Error::invalid_config("store_url", format!("`{url}`: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if parsed.scheme() != "dynamodb" {
            return Err(bad("scheme must be dynamodb"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials do not go in the URL: they come from the AWS chain (environment, profile, instance role)",
            ));
        }
        let table = parsed.host_str().unwrap_or_default().to_owned();
        if !valid_table_name(&table) {
            return Err(bad(
                "expected dynamodb://<table> with a table name of 3-255 characters [A-Za-z0-9_.-]",
            ));
        }
        if !matches!(parsed.path(), "" | "/") || parsed.port().is_some() {
            return Err(bad("a DynamoDB URL names a table: no port and no path"));
        }
        let mut cfg = DynamoDbConfig {
            reminders_table: format!("{table}-reminders"),
            statistics_table: format!("{table}-statistics"),
            state_table: format!("{table}-state"),
            statistics_shards: 4,
            table,
            region: None,
            endpoint: None,
            timeout: Duration::from_secs(5),
            max_attempts: 3,
            create_if_missing: false,
            reminder_shards: 16,
            history_capacity: DEFAULT_HISTORY_CAPACITY,
        };
        for (k, v) in parsed.query_pairs() {
            let invalid = |why: &str| Error::invalid_config(k.to_string(), format!("`{v}`: {why}"));
            match &*k {
                "region" if !v.is_empty() => cfg.region = Some(v.into_owned()),
                "endpoint" => {
                    let e = url::Url::parse(&v).map_err(|e| invalid(&e.to_string()))?;
                    if !matches!(e.scheme(), "http" | "https") {
                        return Err(invalid("must be an http:// or https:// URL"));
                    }
                    cfg.endpoint = Some(v.into_owned());
                }
                "reminders_table" if valid_table_name(&v) => cfg.reminders_table = v.into_owned(),
                "reminders_table" => return Err(invalid("not a DynamoDB table name")),
                "statistics_table" if valid_table_name(&v) => cfg.statistics_table = v.into_owned(),
                "statistics_table" => return Err(invalid("not a DynamoDB table name")),
                "state_table" if valid_table_name(&v) => cfg.state_table = v.into_owned(),
                "state_table" => return Err(invalid("not a DynamoDB table name")),
                "statistics_shards" => {
                    cfg.statistics_shards = v
                        .parse()
                        .ok()
                        .filter(|n: &u32| (1..=64).contains(n))
                        .ok_or_else(|| invalid("must be a number from 1 to 64"))?;
                }
                "timeout_ms" => {
                    let ms: u64 = v.parse().map_err(|_| invalid("not a number of milliseconds"))?;
                    if !(1..=600_000).contains(&ms) {
                        return Err(invalid("must be between 1 and 600000"));
                    }
                    cfg.timeout = Duration::from_millis(ms);
                }
                "max_attempts" => {
                    cfg.max_attempts = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=10).contains(n))
                        .ok_or_else(|| invalid("must be a number from 1 to 10"))?;
                }
                "create_if_missing" => {
                    cfg.create_if_missing = v.parse().map_err(|_| invalid("must be true or false"))?;
                }
                "reminder_shards" => {
                    cfg.reminder_shards = v
                        .parse()
                        .ok()
                        .filter(|n: &u32| n.is_power_of_two() && *n <= 256)
                        .ok_or_else(|| invalid("must be a power of two from 1 to 256"))?;
                }
                "history" => cfg.history_capacity = parse_history_capacity(&v).map_err(|e| invalid(&e))?,
                _ => {
                    return Err(Error::invalid_config(
                        "store_url",
                        format!(
                            "`{url}`: unknown parameter `{k}` (region, endpoint, reminders_table, \
                             statistics_table, state_table, statistics_shards, timeout_ms, max_attempts, \
                             create_if_missing, reminder_shards, history)"
                        ),
                    ))
                }
            }
        }
        if cfg.reminders_table == cfg.table {
            return Err(Error::invalid_config(
                "reminders_table",
                "must differ from the membership table",
            ));
        }
        if cfg.statistics_table == cfg.table || cfg.statistics_table == cfg.reminders_table {
            return Err(Error::invalid_config(
                "statistics_table",
                "must differ from the membership and reminder tables",
            ));
        }
        if [&cfg.table, &cfg.reminders_table, &cfg.statistics_table].contains(&&cfg.state_table) {
            return Err(Error::invalid_config(
                "state_table",
                "must differ from the membership, reminder and statistics tables",
            ));
        }
        Ok(cfg)
    }

    /// Bits of the ring hash that pick a reminder's partition.
    pub(crate) fn shard_bits(&self) -> u32 {
        self.reminder_shards.trailing_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_parameters() {
        let c = DynamoDbConfig::from_url("dynamodb://rollcall").unwrap();
        assert_eq!(c.table, "rollcall");
        assert_eq!(c.reminders_table, "rollcall-reminders");
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(
            (c.max_attempts, c.create_if_missing, c.reminder_shards),
            (3, false, 16)
        );
        assert_eq!(c.shard_bits(), 4);
        let c = DynamoDbConfig::from_url(
            "dynamodb://m.t_1?region=eu-west-1&endpoint=http://127.0.0.1:8000&reminders_table=r-1\
             &timeout_ms=750&max_attempts=1&create_if_missing=true&reminder_shards=1&history=5",
        )
        .unwrap();
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(c.reminders_table, "r-1");
        assert_eq!(c.timeout, Duration::from_millis(750));
        assert_eq!(
            (c.max_attempts, c.create_if_missing, c.shard_bits()),
            (1, true, 0)
        );
        assert_eq!(c.history_capacity, 5);
        assert_eq!(
            (c.statistics_table.as_str(), c.statistics_shards),
            ("m.t_1-statistics", 4)
        );
        let c =
            DynamoDbConfig::from_url("dynamodb://mmm?statistics_table=st-1&statistics_shards=64").unwrap();
        assert_eq!((c.statistics_table.as_str(), c.statistics_shards), ("st-1", 64));
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, field, says) in [
            ("redis://x", "store_url", "scheme"),
            ("dynamodb://ab", "store_url", "table name"),
            ("dynamodb://a%20b", "store_url", "table name"),
            ("dynamodb://key:secret@table", "store_url", "credentials"),
            ("dynamodb://table/path", "store_url", "no path"),
            ("dynamodb://table?endpoint=ftp://x", "endpoint", "http"),
            ("dynamodb://table?timeout_ms=0", "timeout_ms", "between"),
            ("dynamodb://table?timeout_ms=soon", "timeout_ms", "milliseconds"),
            ("dynamodb://table?history=many", "history", "event count"),
            (
                "dynamodb://table?reminder_shards=3",
                "reminder_shards",
                "power of two",
            ),
            (
                "dynamodb://table?reminder_shards=512",
                "reminder_shards",
                "power of two",
            ),
            (
                "dynamodb://table?create_if_missing=yes",
                "create_if_missing",
                "true or false",
            ),
            (
                "dynamodb://table?reminders_table=table",
                "reminders_table",
                "differ",
            ),
            (
                "dynamodb://table?statistics_shards=0",
                "statistics_shards",
                "from 1 to 64",
            ),
            (
                "dynamodb://table?statistics_table=table-reminders",
                "statistics_table",
                "differ",
            ),
            (
                "dynamodb://table?colour=blue",
                "store_url",
                "unknown parameter `colour`",
            ),
        ] {
            match DynamoDbConfig::from_url(url) {
                Err(Error::InvalidConfig { field: f, reason }) => {
                    assert_eq!(f, field, "{url}");
                    assert!(reason.contains(says), "{url}: {reason}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}

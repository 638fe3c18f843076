//! The activity file of `seckillctl activity create --file F` (example:
//! `deploy/local/activity.toml`, reference: `docs/seckillctl.md`).
//!
//! Times are RFC 3339 (`2026-11-22T20:00:00Z`) or relative to now: `now`,
//! `now+90s`, `now+5m`, `now+2h`, `now+1d`.

use anyhow::{bail, Context};
use serde::Deserialize;

use seckill_proto::pb;

/// The whole file. Unknown keys are errors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivityFile {
    /// Shown to buyers.
    pub title: String,
    /// Window start: RFC 3339 or `now[+N{s,m,h,d}]`.
    pub start_at: String,
    /// Window end (exclusive), same forms; after `start_at`.
    pub end_at: String,
    /// Redis shards per item, 1..=1024. Default 8.
    #[serde(default = "default_shards")]
    pub shard_count: u32,
    /// Units per user per item (the largest reserve quantity), 1..=100. Default 1.
    #[serde(default)]
    pub per_user_limit: u32,
    /// Proof-of-work bits per sub-puzzle the gateway asks before a purchase token,
    /// 0..=24; 0 = no challenge. Default 0.
    #[serde(default)]
    pub challenge_bits: u32,
    /// The named Redis Cluster of the activity's stock (a `[redis.clusters.<name>]` of
    /// stockd's config): a hot sale on nodes of its own. Default: the default cluster.
    #[serde(default)]
    pub redis_cluster: String,
    /// At least one item.
    pub items: Vec<ItemFile>,
}

fn default_shards() -> u32 {
    seckill_lua::DEFAULT_SHARDS
}

/// One `[[items]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemFile {
    pub title: String,
    /// List price, cents.
    pub price_cents: i64,
    /// Sale price, cents.
    pub sale_price_cents: i64,
    /// Units on sale, >= 1.
    pub stock: u32,
}

/// Parses a time: RFC 3339 or `now[+N{s,m,h,d}]`, to unix ms.
pub fn parse_time(field: &str, s: &str, now_ms: i64) -> anyhow::Result<i64> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let Some(amount) = rest.strip_prefix('+') else {
            bail!("{field}: `{s}`: expected now+N followed by s, m, h or d");
        };
        let (num, unit) = amount.split_at(amount.len().saturating_sub(1));
        let n: i64 = num
            .parse()
            .with_context(|| format!("{field}: `{s}`: not a number of units"))?;
        let ms = match unit {
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => bail!("{field}: `{s}`: unit must be s, m, h or d"),
        };
        return Ok(now_ms + n.saturating_mul(ms));
    }
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .with_context(|| format!("{field}: `{s}` is neither RFC 3339 nor now+N<unit>"))?;
    Ok(t.timestamp_millis())
}

impl ActivityFile {
    /// Reads and parses `path`; errors name the file and the field.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            anyhow::anyhow!(
                "{}: not valid TOML: {}",
                path.display(),
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })?;
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            anyhow::anyhow!(
                "{}: {}: {}",
                path.display(),
                e.path(),
                e.inner()
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })
    }

    /// The CreateActivity request (the server validates ranges and names fields).
    pub fn to_request(&self, now_ms: i64) -> anyhow::Result<pb::CreateActivityRequest> {
        Ok(pb::CreateActivityRequest {
            title: self.title.clone(),
            start_at_ms: parse_time("start_at", &self.start_at, now_ms)?,
            end_at_ms: parse_time("end_at", &self.end_at, now_ms)?,
            shard_count: self.shard_count,
            per_user_limit: self.per_user_limit,
            challenge_bits: self.challenge_bits,
            redis_cluster: self.redis_cluster.clone(),
            items: self
                .items
                .iter()
                .map(|i| pb::ItemSpec {
                    title: i.title.clone(),
                    price_cents: i.price_cents,
                    sale_price_cents: i.sale_price_cents,
                    stock: i.stock,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_absolute_times_parse() {
        assert_eq!(parse_time("t", "now", 1000).unwrap(), 1000);
        assert_eq!(parse_time("t", "now+2m", 1000).unwrap(), 121_000);
        assert_eq!(parse_time("t", "1970-01-01T00:00:01Z", 0).unwrap(), 1000);
        for bad in ["now-1m", "now+5x", "tomorrow", "now+m"] {
            assert!(parse_time("t", bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_shipped_example_file_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/local/activity.toml");
        let f = ActivityFile::load(std::path::Path::new(path)).unwrap();
        let req = f.to_request(0).unwrap();
        assert!(req.end_at_ms > req.start_at_ms);
        assert!(!req.items.is_empty());
    }
}

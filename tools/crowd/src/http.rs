//! The crowd's HTTP side: "doors" (one client per source address, or one client with an
//! `X-Forwarded-For` per buyer), one call = one [`Answer`], and the edge's activity view.
//!
//! Source addresses: with `--source bind` each door is a client bound to its own loopback
//! address (`127.1.x.y` for buyers, `127.66.0.k` for abusive IPs; Linux routes all of
//! 127/8 to `lo`), so the gateway sees real distinct peers and needs no proxy config.
//! With `--source xff` every request comes from 127.0.0.1 and names a client address in
//! `X-Forwarded-For` (10.1.x.y, abusers 203.0.113.k), which the gateway honours only when
//! 127.0.0.1 is in its trusted-proxy list.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use reqwest::{Client, Method};
use serde_json::Value;

use crate::stats::Kind;

/// How the crowd presents distinct client addresses to the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// Bind each door's sockets to its own 127.x.y.z address.
    Bind,
    /// Send `X-Forwarded-For` from 127.0.0.1 (needs the gateway to trust 127.0.0.1).
    Xff,
    /// Everything from 127.0.0.1, no header (per-IP limits then apply to the whole crowd).
    None,
}

/// One client address of the crowd.
#[derive(Debug, Clone)]
pub struct Door {
    client: Client,
    xff: Option<String>,
}

/// The address of buyer door `i` (`abusive` for the abusive IPs).
pub fn door_addr(source: Source, i: u32, abusive: bool) -> IpAddr {
    let (hi, lo) = ((i / 250) as u8, (1 + i % 250) as u8);
    match (source, abusive) {
        (Source::Bind, false) => IpAddr::V4(Ipv4Addr::new(127, 1, hi, lo)),
        (Source::Bind, true) => IpAddr::V4(Ipv4Addr::new(127, 66, hi, lo)),
        (Source::Xff, false) => IpAddr::V4(Ipv4Addr::new(10, 1, hi, lo)),
        (Source::Xff, true) => IpAddr::V4(Ipv4Addr::new(203, 0, 113, lo)),
        (Source::None, _) => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

fn client(bind: Option<IpAddr>, pool: usize) -> anyhow::Result<Client> {
    let mut b = Client::builder()
        .timeout(Duration::from_secs(15))
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(pool)
        // Many doors each keep idle connections: let them go soon, to bound open files.
        .pool_idle_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if let Some(ip) = bind {
        b = b.local_address(ip);
    }
    b.build().context("building an HTTP client")
}

/// `n` doors for buyers or abusers. Xff/None doors share one client (one pool).
pub fn doors(source: Source, n: u32, abusive: bool, pool: usize) -> anyhow::Result<Vec<Door>> {
    let shared = client(None, pool)?;
    (0..n.max(1))
        .map(|i| {
            let addr = door_addr(source, i, abusive);
            Ok(match source {
                Source::Bind => Door {
                    client: client(Some(addr), 4)?,
                    xff: None,
                },
                Source::Xff => Door {
                    client: shared.clone(),
                    xff: Some(addr.to_string()),
                },
                Source::None => Door {
                    client: shared.clone(),
                    xff: None,
                },
            })
        })
        .collect()
}

/// The soft limit on open files of this process (`/proc/self/limits`), if known.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files(&text)
}

fn parse_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// How many buyer doors fit under the open-files limit next to `concurrency` requests
/// in flight: each door may hold a few idle connections.
pub fn doors_that_fit(wanted: u32, concurrency: usize, limit: Option<u64>) -> u32 {
    match limit {
        Some(l) => {
            let spare = l.saturating_sub(concurrency as u64 + 256) / 2;
            wanted.min(spare.max(1) as u32)
        }
        None => wanted,
    }
}

/// One HTTP answer, already classified.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: Option<u16>,
    pub body: Value,
    /// `Retry-After`, seconds.
    pub retry_after: Option<u64>,
    pub latency: Duration,
    /// The transport error, when there was no status.
    pub error: Option<String>,
}

impl Answer {
    pub fn code(&self) -> Option<&str> {
        self.body.get("error")?.get("code")?.as_str()
    }

    pub fn kind(&self) -> Kind {
        Kind::classify(self.status, self.code())
    }

    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.body.get(name)?.as_str()
    }
}

impl Door {
    /// One request; never fails: transport errors become an answer without status.
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let mut req = self.client.request(method, url);
        if let Some(x) = &self.xff {
            req = req.header("x-forwarded-for", x);
        }
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let t0 = Instant::now();
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok());
                let body = match resp.bytes().await {
                    Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
                Answer {
                    status: Some(status),
                    body,
                    retry_after,
                    latency: t0.elapsed(),
                    error: None,
                }
            }
            Err(e) => Answer {
                status: None,
                body: Value::Null,
                retry_after: None,
                latency: t0.elapsed(),
                error: Some(e.to_string()),
            },
        }
    }
}

/// An item as the edge shows it.
#[derive(Debug, Clone)]
pub struct EdgeItem {
    pub id: u64,
    pub stock: u64,
}

/// The activity the crowd buys from, as the edge shows it.
#[derive(Debug, Clone)]
pub struct EdgeActivity {
    pub id: u64,
    pub title: String,
    pub start_at_ms: i64,
    pub items: Vec<EdgeItem>,
    /// Server clock minus local clock, ms (from `server_time_ms`).
    pub skew_ms: i64,
}

pub fn now_ms() -> i64 {
    seckill_lua::clock::now_ms()
}

fn parse_activity(v: &Value) -> anyhow::Result<EdgeActivity> {
    let items = v["items"]
        .as_array()
        .context("activity without items")?
        .iter()
        .map(|i| {
            Ok(EdgeItem {
                id: i["id"].as_u64().context("item id")?,
                stock: i["stock"].as_u64().unwrap_or(0),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(EdgeActivity {
        id: v["id"].as_u64().context("activity id")?,
        title: v["title"].as_str().unwrap_or("").to_owned(),
        start_at_ms: v["start_at_ms"].as_i64().context("start_at_ms")?,
        items,
        skew_ms: 0,
    })
}

/// Finds the activity to buy from: `id`, or the open one, or the next upcoming one.
pub async fn discover(door: &Door, base: &str, id: Option<u64>) -> anyhow::Result<EdgeActivity> {
    let before = now_ms();
    let a = door
        .call(
            Method::GET,
            &format!("{base}/api/v1/activities"),
            None,
            None,
        )
        .await;
    let after = now_ms();
    if a.status != Some(200) {
        bail!(
            "GET {base}/api/v1/activities answered {:?} {}",
            a.status,
            a.error.as_deref().unwrap_or(&a.body.to_string())
        );
    }
    let server = a.body["server_time_ms"]
        .as_i64()
        .context("no server_time_ms")?;
    let list = a.body["activities"]
        .as_array()
        .context("no activities array")?;
    let mut candidates: Vec<&Value> = list
        .iter()
        .filter(|v| id.is_none_or(|id| v["id"].as_u64() == Some(id)))
        .filter(|v| id.is_some() || v["state"].as_str() != Some("ended"))
        .collect();
    // Open first, then the soonest upcoming.
    candidates.sort_by_key(|v| {
        (
            v["state"].as_str() != Some("open"),
            v["start_at_ms"].as_i64().unwrap_or(i64::MAX),
        )
    });
    let Some(v) = candidates.first() else {
        match id {
            Some(id) => bail!("activity {id} is not among the edge's current activities"),
            None => bail!("the edge has no open or upcoming activity"),
        }
    };
    let mut act = parse_activity(v)?;
    act.skew_ms = server - (before + after) / 2;
    Ok(act)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn door_addresses_are_distinct_and_never_the_gateways_own() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..5_000 {
            let a = door_addr(Source::Bind, i, false);
            assert!(a.is_loopback());
            assert_ne!(a, IpAddr::V4(Ipv4Addr::LOCALHOST));
            assert!(seen.insert(a), "{a} twice");
        }
        assert!(!seen.contains(&door_addr(Source::Bind, 0, true)));
        assert_eq!(door_addr(Source::Xff, 0, true).to_string(), "203.0.113.1");
    }

    #[test]
    fn the_number_of_doors_stays_under_the_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(doors_that_fit(1_000, 256, Some(1024)), 256);
        assert_eq!(doors_that_fit(1_000, 256, Some(1_000_000)), 1_000);
        assert_eq!(doors_that_fit(1_000, 256, None), 1_000);
        assert_eq!(doors_that_fit(1_000, 4_000, Some(1024)), 1);
    }

    #[test]
    fn the_open_activity_is_parsed_with_its_items() {
        let v: Value = serde_json::json!({"id": 3, "title": "T", "start_at_ms": 10, "end_at_ms": 20,
            "state": "open", "items": [{"id": 7, "title": "Phone", "price_cents": 1,
            "sale_price_cents": 1, "stock": 300, "sold_out": false}]});
        let a = parse_activity(&v).unwrap();
        assert_eq!(a.id, 3);
        assert_eq!(a.items[0].id, 7);
        assert_eq!(a.items[0].stock, 300);
    }
}

//! The catalog: windows and sold-out flags, all in memory (state of the `sold_out` and
//! `window` filters).
//!
//! [`Catalog`] holds every published activity read from `sk:{a}:meta` (window, items,
//! shard count) and, per item, an [`ItemLive`]: the sold-out flag and the units left.
//! Three feeds keep them current ([`crate::redis`]): `keys::SOLD_OUT_CHANNEL`, a
//! periodic pipelined read of every shard stock key, and `SOLD_OUT` answers from
//! stockd. A `reserve` of a sold-out item is answered 410 before authentication
//! ([`SoldOutEarly`]: the flag is public, so the cheapest answer for the crowd costs
//! no JWT check either); [`Window`] then checks the window for token and reserve.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

/// Live state of one item, shared across catalog refreshes.
#[derive(Debug)]
pub struct ItemLive {
    pub id: u64,
    pub title: String,
    pub sale_price_cents: i64,
    pub total: u32,
    pub sold_out: AtomicBool,
    /// Units left over every shard, -1 until first read.
    pub remaining: AtomicI64,
    /// Reservations in flight to stockd (the admission cap).
    pub in_flight: AtomicU32,
}

/// One published activity.
#[derive(Debug)]
pub struct Activity {
    pub id: u64,
    pub title: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub shards: u32,
    pub version: u64,
    pub items: Vec<Arc<ItemLive>>,
}

impl Activity {
    pub fn item(&self, s: u64) -> Option<&Arc<ItemLive>> {
        self.items.iter().find(|i| i.id == s)
    }

    pub fn state(&self, now_unix_ms: i64) -> &'static str {
        if now_unix_ms < self.start_ms {
            "upcoming"
        } else if now_unix_ms < self.end_ms {
            "open"
        } else {
            "ended"
        }
    }

    /// The `Activity` object of the HTTP API.
    pub fn to_json(&self, now_unix_ms: i64) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "title": self.title,
            "start_at_ms": self.start_ms,
            "end_at_ms": self.end_ms,
            "state": self.state(now_unix_ms),
            "items": self.items.iter().map(|i| serde_json::json!({
                "id": i.id,
                "title": i.title,
                // The meta hash carries the sale price only.
                "price_cents": i.sale_price_cents,
                "sale_price_cents": i.sale_price_cents,
                "stock": i.total,
                "sold_out": i.sold_out.load(Ordering::Relaxed),
            })).collect::<Vec<_>>(),
        })
    }
}

/// What a `sk:{a}:meta` hash says, before it becomes an [`Activity`].
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub id: u64,
    pub title: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub shards: u32,
    pub version: u64,
    /// (item id, title, sale price, total units)
    pub items: Vec<(u64, String, i64, u32)>,
}

impl Meta {
    /// Parses the fields of `seckill_lua::keys::meta`. `None` when incomplete.
    pub fn parse(id: u64, fields: &HashMap<String, String>) -> Option<Self> {
        use seckill_lua::keys::meta as f;
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<i64>().ok());
        let items = fields
            .get(f::ITEMS)?
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let sid: u64 = s.trim().parse().ok()?;
                Some((
                    sid,
                    fields
                        .get(&format!("{}{sid}", f::ITEM_TITLE))
                        .cloned()
                        .unwrap_or_default(),
                    num(&format!("{}{sid}", f::ITEM_PRICE)).unwrap_or(0),
                    num(&format!("{}{sid}", f::ITEM_STOCK)).unwrap_or(0).max(0) as u32,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            id,
            title: fields.get(f::TITLE).cloned().unwrap_or_default(),
            start_ms: num(f::START_MS)?,
            end_ms: num(f::END_MS)?,
            shards: num(f::SHARDS).filter(|n| *n >= 1).unwrap_or(8) as u32,
            version: num(f::VERSION).unwrap_or(0).max(0) as u64,
            items,
        })
    }
}

/// Every activity the edge knows, swapped whole on refresh.
#[derive(Default)]
pub struct Catalog {
    current: RwLock<Arc<HashMap<u64, Arc<Activity>>>>,
    loaded: AtomicBool,
}

impl Catalog {
    pub fn get(&self, a: u64) -> Option<Arc<Activity>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&a)
            .cloned()
    }

    pub fn all(&self) -> Arc<HashMap<u64, Arc<Activity>>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True once a first full read from Redis succeeded.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Replaces the catalog, keeping the live state of items that stay.
    pub fn replace(&self, metas: Vec<Meta>) {
        let old = self.all();
        let mut next = HashMap::with_capacity(metas.len());
        for m in metas {
            let prev = old.get(&m.id);
            let items = m
                .items
                .iter()
                .map(
                    |(sid, title, price, total)| match prev.and_then(|p| p.item(*sid)) {
                        Some(live) if live.total == *total && live.title == *title => live.clone(),
                        Some(live) => Arc::new(ItemLive {
                            id: *sid,
                            title: title.clone(),
                            sale_price_cents: *price,
                            total: *total,
                            sold_out: AtomicBool::new(live.sold_out.load(Ordering::Relaxed)),
                            remaining: AtomicI64::new(live.remaining.load(Ordering::Relaxed)),
                            in_flight: AtomicU32::new(0),
                        }),
                        None => Arc::new(ItemLive {
                            id: *sid,
                            title: title.clone(),
                            sale_price_cents: *price,
                            total: *total,
                            sold_out: AtomicBool::new(false),
                            remaining: AtomicI64::new(-1),
                            in_flight: AtomicU32::new(0),
                        }),
                    },
                )
                .collect();
            next.insert(
                m.id,
                Arc::new(Activity {
                    id: m.id,
                    title: m.title,
                    start_ms: m.start_ms,
                    end_ms: m.end_ms,
                    shards: m.shards,
                    version: m.version,
                    items,
                }),
            );
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        self.loaded.store(true, Ordering::Release);
    }

    /// Sets one item's flag (pub/sub, stockd answers).
    pub fn set_sold_out(&self, a: u64, s: u64, sold_out: bool) {
        if let Some(item) = self.get(a).and_then(|act| act.item(s).cloned()) {
            item.sold_out.store(sold_out, Ordering::Relaxed);
            if sold_out {
                item.remaining.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Records a read of every shard of an item: the flag follows the sum.
    pub fn set_remaining(&self, a: u64, s: u64, remaining: i64) {
        if let Some(item) = self.get(a).and_then(|act| act.item(s).cloned()) {
            item.remaining.store(remaining.max(0), Ordering::Relaxed);
            item.sold_out.store(remaining <= 0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: u64, items: &[(u64, u32)]) -> Meta {
        Meta {
            id,
            title: "t".into(),
            start_ms: 0,
            end_ms: 10,
            shards: 8,
            version: 1,
            items: items
                .iter()
                .map(|(s, n)| (*s, format!("i{s}"), 100, *n))
                .collect(),
        }
    }

    #[test]
    fn meta_hashes_parse_and_incomplete_ones_are_skipped() {
        let mut f: HashMap<String, String> = [
            ("title", "Launch"),
            ("start_ms", "100"),
            ("end_ms", "200"),
            ("shards", "4"),
            ("items", "7,8"),
            ("version", "3"),
            ("stock:7", "300"),
            ("title:7", "Phone"),
            ("price:7", "19900"),
            ("stock:8", "5"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = Meta::parse(1, &f).unwrap();
        assert_eq!(m.shards, 4);
        assert_eq!(m.items[0], (7, "Phone".into(), 19900, 300));
        assert_eq!(m.items[1].3, 5);
        f.remove("start_ms");
        assert!(Meta::parse(1, &f).is_none());
    }

    #[test]
    fn flags_follow_the_feeds_and_survive_a_refresh() {
        let c = Catalog::default();
        assert!(!c.is_loaded());
        c.replace(vec![meta(1, &[(7, 10), (8, 5)])]);
        assert!(c.is_loaded());
        c.set_sold_out(1, 7, true);
        c.replace(vec![meta(1, &[(7, 10), (8, 5)])]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        assert!(item.sold_out.load(Ordering::Relaxed));
        c.set_remaining(1, 7, 3);
        assert!(!item.sold_out.load(Ordering::Relaxed));
        assert_eq!(item.remaining.load(Ordering::Relaxed), 3);
        c.set_remaining(1, 7, 0);
        assert!(item.sold_out.load(Ordering::Relaxed));
        // Unknown ids are ignored.
        c.set_sold_out(9, 9, true);
        c.replace(vec![]);
        assert!(c.get(1).is_none());
    }
}

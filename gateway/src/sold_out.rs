//! The catalog: windows and sold-out flags, all in memory (state of the `sold_out` and
//! `window` filters).
//!
//! [`Catalog`] holds every published activity read from `sk:{a}:meta` (window, items,
//! list and sale prices, shard count) and, per item, an [`ItemLive`]: the sold-out
//! flag, the users who hold a unit of the sold-out item, and the units left.
//!
//! The feeds ([`crate::redis`]): a periodic pipelined read of every shard stock key
//! and, for every item whose shards are all empty, of every shard's buyers hash
//! (`keys::buyers`, HKEYS); `keys::SOLD_OUT_CHANNEL`; and `SOLD_OUT` answers from
//! stockd. The flag is set only together with the holders read after the stock
//! ([`Catalog::set_holders`]); the channel and stockd's answers only ask for that read
//! at once ([`Catalog::report_sold_out`], [`Catalog::report_sold_out_answer`]). So
//! every edge of a fleet turns an item sold out with the same holders, read from the
//! same hashes, refreshed on every poll.
//!
//! Those keys live on the activity's Redis Cluster ([`Activity::cluster`]): the
//! default one or a named one. Each cluster has its own read, asked for through its
//! own [`Notify`] ([`Catalog::stock_reads`]), so a report about an activity wakes the
//! read of the cluster that holds its stock, and no other.
//!
//! A `reserve` of a sold-out item is answered 410 before authentication
//! (`filters::SoldOutEarly`, and the fast lane), unless the bearer token's unverified
//! `sub` holds a unit: that request goes on to be authenticated and to stockd, which
//! gives the holder their reservation back (the resend contract) or `duplicate`.
//! `filters::Window` then checks the window, and the holder again with the verified
//! user, for token and reserve.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

/// Users holding a unit of a sold-out item (the fields of its buyers hashes).
pub type Holders = HashSet<Box<str>>;

/// Live state of one item, shared across catalog refreshes.
#[derive(Debug)]
pub struct ItemLive {
    pub id: u64,
    pub title: String,
    /// List price, cents.
    pub price_cents: i64,
    /// Sale price, cents.
    pub sale_price_cents: i64,
    pub total: u32,
    /// The edge answers 410 for this item (but to [`Self::held_by`] users). Set only
    /// with the holders ([`Catalog::set_holders`]).
    pub sold_out: AtomicBool,
    /// Units left over every shard, -1 until first read.
    pub remaining: AtomicI64,
    /// Reservations in flight to stockd (the admission cap).
    pub in_flight: AtomicU32,
    /// With `limits.fleet`: the in-flight slots this gateway holds for the item (its
    /// lease from the fleet-wide cap, `crate::fleet`), which replaces the local cap; -1
    /// when not leased (fleet sharing off).
    pub fleet_cap: AtomicI64,
    /// Reservations refused `busy` since the last lease (demand for more slots).
    pub busy: AtomicU32,
    /// Who holds a unit, while [`Self::sold_out`]; empty otherwise. At most the item's
    /// stock in size (one unit per user).
    holders: RwLock<Arc<Holders>>,
    /// Sold-out messages about it so far: a stock read applies only when none came while
    /// it ran ([`Catalog::news`]), so a read that began before a message cannot undo it.
    news: AtomicU64,
    /// Unix ms of the last reserve for it here or sold-out message about it (0: none):
    /// within [`HOT_MS`] the stock feed reads it on every poll, else in turn with the
    /// other idle items (`redis.stock_poll_idle_keys`).
    touched_ms: AtomicI64,
}

/// How long after its last request (or sold-out message) an item is read on every
/// stock poll.
pub const HOT_MS: i64 = 10_000;

impl ItemLive {
    /// An item on sale, its shards not read yet.
    pub fn new(
        id: u64,
        title: String,
        price_cents: i64,
        sale_price_cents: i64,
        total: u32,
    ) -> Self {
        Self {
            id,
            title,
            price_cents,
            sale_price_cents,
            total,
            sold_out: AtomicBool::new(false),
            remaining: AtomicI64::new(-1),
            in_flight: AtomicU32::new(0),
            fleet_cap: AtomicI64::new(-1),
            busy: AtomicU32::new(0),
            holders: RwLock::default(),
            news: AtomicU64::new(0),
            touched_ms: AtomicI64::new(0),
        }
    }

    /// Marks a request (or a sold-out message) at `now_ms`; true when the item was idle
    /// (not read on every poll): the caller then asks its cluster's feed for a read now.
    pub fn touch(&self, now_ms: i64) -> bool {
        // A load on most requests: the mark is written at most once a second.
        let before = self.touched_ms.load(Ordering::Relaxed);
        if now_ms - before < 1_000 {
            return false;
        }
        self.touched_ms.store(now_ms, Ordering::Relaxed);
        now_ms - before >= HOT_MS
    }

    /// Read on every stock poll: asked about within [`HOT_MS`], or never read.
    pub fn is_hot(&self, now_ms: i64) -> bool {
        now_ms - self.touched_ms.load(Ordering::Relaxed) < HOT_MS
            || self.remaining.load(Ordering::Relaxed) < 0
    }

    /// True when `user` held a unit at the last read of the sold-out item's buyers.
    pub fn held_by(&self, user: &str) -> bool {
        self.holders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(user)
    }

    /// True when the edge answers `user` (`None`: anonymous) 410 for this item: it is
    /// sold out and they hold no unit of it.
    pub fn sold_out_for(&self, user: Option<&str>) -> bool {
        self.sold_out.load(Ordering::Acquire) && !user.is_some_and(|u| self.held_by(u))
    }

    fn holders(&self) -> Arc<Holders> {
        self.holders
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_holders(&self, holders: Arc<Holders>) {
        *self.holders.write().unwrap_or_else(|p| p.into_inner()) = holders;
    }

    /// Back on sale: no flag, no holders.
    fn clear(&self) {
        self.sold_out.store(false, Ordering::Release);
        self.set_holders(Arc::default());
    }

    /// A copy with another meta (title, prices, total) and the same live state.
    fn remade(&self, m: &ItemMeta) -> Self {
        let next = Self::new(
            m.id,
            m.title.clone(),
            m.price_cents,
            m.sale_price_cents,
            m.total,
        );
        next.set_holders(self.holders());
        next.sold_out
            .store(self.sold_out.load(Ordering::Acquire), Ordering::Release);
        next.remaining
            .store(self.remaining.load(Ordering::Relaxed), Ordering::Relaxed);
        next.touched_ms
            .store(self.touched_ms.load(Ordering::Relaxed), Ordering::Relaxed);
        next.news
            .store(self.news.load(Ordering::SeqCst), Ordering::SeqCst);
        next
    }
}

/// One published activity.
#[derive(Debug)]
pub struct Activity {
    pub id: u64,
    pub title: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub shards: u32,
    /// Units one user may hold of one item (the largest reserve quantity).
    pub per_user_limit: u32,
    pub version: u64,
    pub items: Vec<Arc<ItemLive>>,
    /// Proof-of-work bits per sub-puzzle (`keys::meta::CHALLENGE_BITS`; 0 = off,
    /// `None` = the meta predates the field: `challenge.default_bits`).
    pub challenge_bits: Option<u32>,
    /// The named Redis Cluster holding its stock, buyers and sold-out flags
    /// (`keys::meta::CLUSTER`); `None`: the default cluster.
    pub cluster: Option<String>,
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
            "per_user_limit": self.per_user_limit,
            "items": self.items.iter().map(|i| serde_json::json!({
                "id": i.id,
                "title": i.title,
                "price_cents": i.price_cents,
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
    /// `per_user_limit` (1 when the hash predates the field).
    pub per_user_limit: u32,
    pub version: u64,
    pub items: Vec<ItemMeta>,
    /// See [`Activity::challenge_bits`].
    pub challenge_bits: Option<u32>,
    /// See [`Activity::cluster`] (absent, `""` and `"default"`: `None`).
    pub cluster: Option<String>,
}

/// One item of a [`Meta`].
#[derive(Debug, Clone, PartialEq)]
pub struct ItemMeta {
    pub id: u64,
    pub title: String,
    /// List price, cents (`list_price:<s>`; the sale price when a meta hash written
    /// before that field existed lacks it).
    pub price_cents: i64,
    /// Sale price, cents (`price:<s>`).
    pub sale_price_cents: i64,
    /// Units put on sale.
    pub total: u32,
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
                let sale = num(&format!("{}{sid}", f::ITEM_PRICE)).unwrap_or(0);
                Some(ItemMeta {
                    id: sid,
                    title: fields
                        .get(&format!("{}{sid}", f::ITEM_TITLE))
                        .cloned()
                        .unwrap_or_default(),
                    price_cents: num(&format!("{}{sid}", f::ITEM_LIST_PRICE)).unwrap_or(sale),
                    sale_price_cents: sale,
                    total: num(&format!("{}{sid}", f::ITEM_STOCK)).unwrap_or(0).max(0) as u32,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            id,
            title: fields.get(f::TITLE).cloned().unwrap_or_default(),
            start_ms: num(f::START_MS)?,
            end_ms: num(f::END_MS)?,
            shards: num(f::SHARDS).filter(|n| *n >= 1).unwrap_or(8) as u32,
            per_user_limit: num(f::PER_USER_LIMIT)
                .filter(|n| (1..=i64::from(u32::MAX)).contains(n))
                .unwrap_or(1) as u32,
            version: num(f::VERSION).unwrap_or(0).max(0) as u64,
            items,
            challenge_bits: num(f::CHALLENGE_BITS).map(|b| b.clamp(0, 32) as u32),
            cluster: fields
                .get(f::CLUSTER)
                .and_then(|c| seckill_daemon::config::named_cluster(c.trim()))
                .map(str::to_owned),
        })
    }
}

/// Every activity the edge knows, swapped whole on refresh.
#[derive(Default)]
pub struct Catalog {
    current: RwLock<Arc<HashMap<u64, Arc<Activity>>>>,
    loaded: AtomicBool,
    /// Per cluster (`None`: the default one), woken when a feed reports an item of an
    /// activity placed there sold out: that cluster's stock and holders are read now
    /// rather than at the next poll. Made by [`Self::stock_reads`].
    read_now: RwLock<HashMap<Option<String>, Arc<Notify>>>,
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
            // Moved to another cluster: what was read on the old one says nothing.
            let prev = old.get(&m.id).filter(|p| p.cluster == m.cluster);
            let items = m
                .items
                .iter()
                .map(|im| match prev.and_then(|p| p.item(im.id)) {
                    Some(live)
                        if live.total == im.total
                            && live.title == im.title
                            && live.price_cents == im.price_cents
                            && live.sale_price_cents == im.sale_price_cents =>
                    {
                        live.clone()
                    }
                    Some(live) => Arc::new(live.remade(im)),
                    None => Arc::new(ItemLive::new(
                        im.id,
                        im.title.clone(),
                        im.price_cents,
                        im.sale_price_cents,
                        im.total,
                    )),
                })
                .collect();
            next.insert(
                m.id,
                Arc::new(Activity {
                    id: m.id,
                    title: m.title,
                    start_ms: m.start_ms,
                    end_ms: m.end_ms,
                    shards: m.shards,
                    per_user_limit: m.per_user_limit,
                    version: m.version,
                    items,
                    challenge_bits: m.challenge_bits,
                    cluster: m.cluster,
                }),
            );
        }
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        self.loaded.store(true, Ordering::Release);
    }

    fn live(&self, a: u64, s: u64) -> Option<Arc<ItemLive>> {
        self.get(a).and_then(|act| act.item(s).cloned())
    }

    /// stockd's sold-out channel says the item sold out or is on sale again. Sold out:
    /// no units left for the admission cap, and the feeds read the stock and holders now
    /// ([`Self::read_wanted`]); the flag waits for the holders ([`Self::set_holders`]),
    /// so that a holder's resend is never refused meanwhile. On sale: the flag and the
    /// holders are dropped at once. Either way a read running now is stale
    /// ([`Self::news`]).
    pub fn report_sold_out(&self, a: u64, s: u64, sold_out: bool) {
        self.report(a, s, sold_out, true);
    }

    /// stockd answered a reserve `SOLD_OUT`: as [`Self::report_sold_out`] says sold out,
    /// but one request's view rather than an announcement, so it leaves running reads
    /// alone. (Counted, the answers that keep coming during a sell-out would make every
    /// read stale and hold the flag back; and this is the reserve's hot path.)
    pub fn report_sold_out_answer(&self, a: u64, s: u64) {
        self.report(a, s, true, false);
    }

    fn report(&self, a: u64, s: u64, sold_out: bool, news: bool) {
        let Some(act) = self.get(a) else { return };
        if let Some(item) = act.item(s) {
            if news {
                // Before the change: a read running now sees it and stands down.
                item.news.fetch_add(1, Ordering::SeqCst);
            }
            // Read on every poll for a while, so the read asked below includes it.
            item.touch(seckill_lua::clock::unix_ms() as i64);
            if sold_out {
                item.remaining.store(0, Ordering::Relaxed);
                self.want_read(act.cluster.as_deref());
            } else {
                item.clear();
            }
        }
    }

    /// What asks `cluster`'s feed (`None`: the default cluster's) for an immediate read
    /// of stock and holders: it waits on `notified()`. Made on first call; a report
    /// about an activity on a cluster nobody called this for (one the gateway is not
    /// configured with) asks nothing.
    pub fn stock_reads(&self, cluster: Option<&str>) -> Arc<Notify> {
        let key = cluster.map(str::to_owned);
        if let Some(n) = self.read_notify(&key) {
            return n;
        }
        self.read_now
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default()
            .clone()
    }

    /// Asks `cluster`'s feed for a read now (a permit is kept when it is busy).
    pub(crate) fn want_read(&self, cluster: Option<&str>) {
        if let Some(n) = self.read_notify(&cluster.map(str::to_owned)) {
            n.notify_one();
        }
    }

    /// The wake-up of the feed of cluster `key`, when one was made.
    fn read_notify(&self, key: &Option<String>) -> Option<Arc<Notify>> {
        self.read_now
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Asks every cluster's feed for a read now (after a catalog refresh).
    pub fn want_all_reads(&self) {
        for n in self
            .read_now
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            n.notify_one();
        }
    }

    /// The sold-out messages about item `s` of activity `a` so far (0 for an unknown
    /// item): taken before a stock read and handed back with its result.
    pub fn news(&self, a: u64, s: u64) -> u64 {
        self.live(a, s)
            .map_or(0, |item| item.news.load(Ordering::SeqCst))
    }

    /// Records a read of every shard of an item with units left: on sale. `seen`: the
    /// item's [`Self::news`] before the read; a message since makes the read stale (the
    /// message stands, and the next read decides).
    pub fn set_remaining(&self, a: u64, s: u64, remaining: i64, seen: u64) {
        if let Some(item) = self.live(a, s) {
            if item.news.load(Ordering::SeqCst) != seen {
                return;
            }
            item.remaining.store(remaining.max(0), Ordering::Relaxed);
            if remaining > 0 {
                item.clear();
            }
        }
    }

    /// Records a read of an item whose shards are all empty, and the users its buyers
    /// hashes held right after: sold out, but to them. `seen` as for
    /// [`Self::set_remaining`]: a read that began before an on-sale message (units came
    /// back) would otherwise refuse every buyer until the next read.
    pub fn set_holders(&self, a: u64, s: u64, holders: Holders, seen: u64) {
        if let Some(item) = self.live(a, s) {
            if item.news.load(Ordering::SeqCst) != seen {
                return;
            }
            item.remaining.store(0, Ordering::Relaxed);
            item.set_holders(Arc::new(holders));
            item.sold_out.store(true, Ordering::SeqCst);
            // A message between the check and the flag: it stands (a sold-out one asked
            // for a read of its own).
            if item.news.load(Ordering::SeqCst) != seen {
                item.clear();
            }
        }
    }
}

/// The tests' catalog of one: activity 1, open for good, with item 7 of `total` units.
#[cfg(test)]
pub(crate) fn one_item_activity(total: u32, challenge_bits: Option<u32>) -> Meta {
    Meta {
        id: 1,
        title: "t".into(),
        start_ms: 0,
        end_ms: i64::MAX,
        shards: 2,
        per_user_limit: 1,
        version: 1,
        items: vec![ItemMeta {
            id: 7,
            title: "i".into(),
            price_cents: 200,
            sale_price_cents: 100,
            total,
        }],
        challenge_bits,
        cluster: None,
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
            per_user_limit: 1,
            version: 1,
            items: items
                .iter()
                .map(|(s, n)| ItemMeta {
                    id: *s,
                    title: format!("i{s}"),
                    price_cents: 300,
                    sale_price_cents: 100,
                    total: *n,
                })
                .collect(),
            challenge_bits: None,
            cluster: None,
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
            ("list_price:7", "99900"),
            ("stock:8", "5"),
            ("price:8", "500"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = Meta::parse(1, &f).unwrap();
        assert_eq!(m.shards, 4);
        assert_eq!(m.per_user_limit, 1, "a hash without the field: one unit");
        f.insert("per_user_limit".into(), "5".into());
        assert_eq!(Meta::parse(1, &f).unwrap().per_user_limit, 5);
        f.remove("per_user_limit");
        assert_eq!(
            m.items[0],
            ItemMeta {
                id: 7,
                title: "Phone".into(),
                price_cents: 99900,
                sale_price_cents: 19900,
                total: 300
            }
        );
        assert_eq!(m.items[1].total, 5);
        // A hash written before `list_price:` existed: the sale price stands in.
        assert_eq!(m.items[1].price_cents, 500);
        assert_eq!(m.challenge_bits, None);
        f.insert("challenge_bits".into(), "14".into());
        assert_eq!(Meta::parse(1, &f).unwrap().challenge_bits, Some(14));
        assert_eq!(m.cluster, None, "no field: the default cluster");
        for (v, want) in [("", None), ("default", None), ("hot", Some("hot"))] {
            f.insert("cluster".into(), v.into());
            assert_eq!(
                Meta::parse(1, &f).unwrap().cluster.as_deref(),
                want,
                "{v:?}"
            );
        }
        f.remove("start_ms");
        assert!(Meta::parse(1, &f).is_none());
    }

    fn holders(users: &[&str]) -> Holders {
        users.iter().map(|u| Box::from(*u)).collect()
    }

    #[test]
    fn flags_follow_the_feeds_and_survive_a_refresh() {
        let c = Catalog::default();
        assert!(!c.is_loaded());
        c.replace(vec![meta(1, &[(7, 10), (8, 5)])]);
        assert!(c.is_loaded());
        c.set_holders(1, 7, holders(&["alice"]), c.news(1, 7));
        c.replace(vec![meta(1, &[(7, 10), (8, 5)])]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        assert!(item.sold_out.load(Ordering::Relaxed));
        assert!(item.held_by("alice"));
        c.set_remaining(1, 7, 3, c.news(1, 7));
        assert!(!item.sold_out.load(Ordering::Relaxed));
        assert!(!item.held_by("alice"));
        assert_eq!(item.remaining.load(Ordering::Relaxed), 3);
        // An empty read alone does not set the flag: the holders come with it.
        c.set_remaining(1, 7, 0, c.news(1, 7));
        assert!(!item.sold_out.load(Ordering::Relaxed));
        assert_eq!(item.remaining.load(Ordering::Relaxed), 0);
        // Unknown ids are ignored.
        c.report_sold_out(9, 9, true);
        c.set_holders(9, 9, holders(&["x"]), c.news(9, 9));
        c.replace(vec![]);
        assert!(c.get(1).is_none());
    }

    #[test]
    fn a_sold_out_item_refuses_everyone_but_its_holders() {
        let c = Catalog::default();
        c.replace(vec![meta(1, &[(7, 2)])]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        assert!(!item.sold_out_for(None));
        c.set_holders(1, 7, holders(&["alice", "bob"]), c.news(1, 7));
        assert!(!item.sold_out_for(Some("alice")));
        assert!(!item.sold_out_for(Some("bob")));
        assert!(item.sold_out_for(Some("carol")));
        assert!(item.sold_out_for(None));
        // A meta change keeps the live state; back on sale drops both.
        let mut changed = meta(1, &[(7, 2)]);
        changed.items[0].price_cents = 999;
        c.replace(vec![changed]);
        let remade = c.get(1).unwrap().item(7).cloned().unwrap();
        assert_eq!(remade.price_cents, 999);
        assert!(remade.sold_out_for(Some("carol")) && !remade.sold_out_for(Some("alice")));
        c.report_sold_out(1, 7, false);
        assert!(!remade.sold_out_for(Some("carol")));
        assert!(!remade.held_by("alice"));
    }

    /// A stock read that began before a message is stale when it lands: units came
    /// back (on-sale message) after the read found every shard empty, and applying it
    /// would refuse every buyer until the next read.
    #[test]
    fn a_read_that_began_before_a_message_does_not_undo_it() {
        let c = Catalog::default();
        c.replace(vec![meta(1, &[(7, 2)])]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        let seen = c.news(1, 7);
        c.report_sold_out(1, 7, false);
        c.set_remaining(1, 7, 0, seen);
        c.set_holders(1, 7, holders(&["alice"]), seen);
        assert!(!item.sold_out_for(None), "the on-sale message stands");
        assert_eq!(
            item.remaining.load(Ordering::Relaxed),
            -1,
            "the read was dropped"
        );
        // The next read, begun after the message, applies.
        let seen = c.news(1, 7);
        c.set_holders(1, 7, holders(&["alice"]), seen);
        assert!(item.sold_out_for(None) && !item.sold_out_for(Some("alice")));
        // And one begun before a sold-out message stands down too: that message asked
        // for a read of its own.
        let seen = c.news(1, 7);
        c.report_sold_out(1, 7, true);
        c.set_remaining(1, 7, 5, seen);
        assert!(
            item.sold_out_for(None),
            "a stale on-sale read does not clear the flag"
        );
        // stockd's SOLD_OUT answers are not news: a read running meanwhile applies.
        let seen = c.news(1, 7);
        c.report_sold_out_answer(1, 7);
        c.set_holders(1, 7, holders(&[]), seen);
        assert!(item.sold_out_for(Some("alice")), "the read applied");
        // A refresh of the catalog keeps the count.
        let seen = c.news(1, 7);
        c.replace(vec![meta(1, &[(7, 2)])]);
        assert_eq!(c.news(1, 7), seen);
    }

    #[test]
    fn a_reported_sell_out_waits_for_the_holders_and_asks_for_a_read() {
        let c = Catalog::default();
        let reads = c.stock_reads(None);
        c.replace(vec![meta(1, &[(7, 2)])]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        c.report_sold_out(1, 7, true);
        assert!(!item.sold_out.load(Ordering::Relaxed));
        assert_eq!(item.remaining.load(Ordering::Relaxed), 0);
        // The permit is stored: the feeds' next wait returns at once.
        use futures::FutureExt as _;
        assert!(
            reads.notified().now_or_never().is_some(),
            "a read was asked for"
        );
        assert!(
            reads.notified().now_or_never().is_none(),
            "one read per report"
        );
    }

    #[test]
    fn a_report_asks_the_read_of_the_cluster_holding_the_activity_and_no_other() {
        use futures::FutureExt as _;
        let c = Catalog::default();
        let (default, hot) = (c.stock_reads(None), c.stock_reads(Some("hot")));
        let mut on_hot = meta(2, &[(8, 2)]);
        on_hot.cluster = Some("hot".into());
        let mut nowhere = meta(3, &[(9, 2)]);
        nowhere.cluster = Some("cold".into());
        c.replace(vec![meta(1, &[(7, 2)]), on_hot, nowhere]);
        c.report_sold_out(2, 8, true);
        assert!(hot.notified().now_or_never().is_some());
        assert!(default.notified().now_or_never().is_none());
        c.report_sold_out(1, 7, true);
        assert!(default.notified().now_or_never().is_some());
        assert!(hot.notified().now_or_never().is_none());
        // A cluster the gateway does not know: nobody reads it, nobody is woken.
        c.report_sold_out(3, 9, true);
        assert!(default.notified().now_or_never().is_none());
        assert!(hot.notified().now_or_never().is_none());
        c.want_all_reads();
        assert!(default.notified().now_or_never().is_some());
        assert!(hot.notified().now_or_never().is_some());
    }

    #[test]
    fn an_activity_moved_to_another_cluster_forgets_what_the_old_one_said() {
        let c = Catalog::default();
        c.replace(vec![meta(1, &[(7, 2)])]);
        c.set_holders(1, 7, holders(&["alice"]), c.news(1, 7));
        let mut moved = meta(1, &[(7, 2)]);
        moved.cluster = Some("hot".into());
        c.replace(vec![moved.clone()]);
        let item = c.get(1).unwrap().item(7).cloned().unwrap();
        assert!(!item.sold_out_for(None));
        assert_eq!(item.remaining.load(Ordering::Relaxed), -1);
        c.set_holders(1, 7, holders(&[]), c.news(1, 7));
        c.replace(vec![moved]);
        assert!(c.get(1).unwrap().item(7).unwrap().sold_out_for(None));
    }
}

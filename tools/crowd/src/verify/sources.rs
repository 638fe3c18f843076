//! Where the facts come from, and the steps after the crowd that need I/O: the drain
//! wait, paying a share of the orders through the edge, and reading MySQL and
//! `AdminService.Reconcile` into [`Facts`] ([`gather`]). The judging is pure, in
//! `verify/mod.rs`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http::Method;
use indicatif::ProgressBar;
use seckill_proto::auth::AttachToken;
use seckill_proto::pb::admin_service_client::AdminServiceClient;
use seckill_proto::pb::ReconcileRequest;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, Row as _};

use super::{Facts, ItemFacts, Reconciled};
use crate::driver::Holder;
use crate::http::Door;

/// Connections to the record (MySQL) and to stockd's admin API.
pub struct Sources {
    pub pool: MySqlPool,
    pub stockd: String,
    pub token: String,
    pub activity: u64,
}

impl Sources {
    pub async fn connect(
        mysql: &str,
        stockd: &str,
        token: &str,
        activity: u64,
    ) -> anyhow::Result<Self> {
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(mysql)
            .await
            .with_context(|| format!("connecting to MySQL at {}", redact(mysql)))?;
        Ok(Self {
            pool,
            stockd: stockd.to_owned(),
            token: token.to_owned(),
            activity,
        })
    }

    /// Reconcile every item of the activity (read-only: `repair = false`).
    pub async fn reconcile(&self) -> anyhow::Result<BTreeMap<u64, Reconciled>> {
        let channel = tonic::transport::Endpoint::from_shared(self.stockd.clone())
            .context("stockd address")?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .with_context(|| format!("connecting to stockd at {}", self.stockd))?;
        let token =
            AttachToken::new(&self.token).map_err(|s| anyhow::anyhow!("{}", s.message()))?;
        let mut client = AdminServiceClient::with_interceptor(channel, token);
        let resp = client
            .reconcile(ReconcileRequest {
                activity_id: self.activity,
                item_id: 0,
                repair: false,
            })
            .await
            .map_err(|s| anyhow::anyhow!("Reconcile: {:?}: {}", s.code(), s.message()))?
            .into_inner();
        Ok(resp
            .items
            .into_iter()
            .map(|i| {
                (
                    i.item_id,
                    Reconciled {
                        redis_remaining: i.redis_remaining,
                        in_flight: i.in_flight,
                        active_orders: i.active_orders,
                        mysql_stock: i.mysql_stock,
                        difference: i.difference,
                        consistent: i.consistent,
                        message: i.message,
                    },
                )
            })
            .collect())
    }

    pub async fn order_ids(&self) -> anyhow::Result<HashSet<String>> {
        let rows = sqlx::query("SELECT id FROM orders WHERE activity_id = ?")
            .bind(self.activity)
            .fetch_all(&self.pool)
            .await
            .context("reading order ids")?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).context("order id"))
            .collect()
    }

    /// (order id, user id) of every order of the activity.
    pub async fn owners(&self) -> anyhow::Result<Vec<(String, String)>> {
        sqlx::query_as("SELECT id, user_id FROM orders WHERE activity_id = ?")
            .bind(self.activity)
            .fetch_all(&self.pool)
            .await
            .context("reading order owners")
    }

    pub async fn dead_lettered(&self) -> anyhow::Result<HashSet<String>> {
        let rows =
            sqlx::query("SELECT reservation_id FROM dead_letters WHERE reservation_id IS NOT NULL")
                .fetch_all(&self.pool)
                .await
                .context("reading dead letters")?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).context("dead letter id"))
            .collect()
    }

    /// Items with their order counts by status.
    pub async fn items(&self) -> anyhow::Result<Vec<ItemFacts>> {
        let rows = sqlx::query(
            "SELECT id, title, total_stock, stock FROM activity_items WHERE activity_id = ? ORDER BY id",
        )
        .bind(self.activity)
        .fetch_all(&self.pool)
        .await
        .context("reading activity_items")?;
        let mut items = Vec::with_capacity(rows.len());
        for r in rows {
            items.push(ItemFacts {
                item_id: r.try_get::<u64, _>(0)?,
                title: r.try_get::<String, _>(1)?,
                stock: r.try_get::<u32, _>(2)? as u64,
                mysql_stock: r.try_get::<u32, _>(3)? as i64,
                orders_by_state: BTreeMap::new(),
                reconcile: None,
            });
        }
        let rows = sqlx::query(
            "SELECT item_id, status, COUNT(*) FROM orders WHERE activity_id = ? GROUP BY item_id, status",
        )
        .bind(self.activity)
        .fetch_all(&self.pool)
        .await
        .context("counting orders")?;
        for r in rows {
            let (item, status, n) = (
                r.try_get::<u64, _>(0)?,
                r.try_get::<String, _>(1)?,
                r.try_get::<i64, _>(2)?,
            );
            if let Some(i) = items.iter_mut().find(|i| i.item_id == item) {
                i.orders_by_state.insert(status, n as u64);
            }
        }
        Ok(items)
    }

    pub async fn mysql_duplicates(&self) -> anyhow::Result<BTreeSet<(String, u64)>> {
        let rows = sqlx::query(
            "SELECT user_id, item_id FROM orders WHERE activity_id = ? AND status IN ('PENDING', 'PAID') \
             GROUP BY user_id, item_id HAVING COUNT(*) > 1",
        )
        .bind(self.activity)
        .fetch_all(&self.pool)
        .await
        .context("looking for duplicate orders")?;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<u64, _>(1)?)))
            .collect()
    }

    async fn pending(&self) -> anyhow::Result<HashSet<String>> {
        let rows =
            sqlx::query("SELECT id FROM orders WHERE activity_id = ? AND status = 'PENDING'")
                .bind(self.activity)
                .fetch_all(&self.pool)
                .await
                .context("reading pending orders")?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).context("order id"))
            .collect()
    }
}

/// Hides a password in a URL for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Waits until every reservation is an order (or dead-lettered) and Reconcile shows
/// nothing in flight, at most `timeout`. Returns how long it took and whether it drained.
pub async fn drain(
    src: &Sources,
    reserved: &BTreeSet<String>,
    timeout: Duration,
    pb: &ProgressBar,
) -> (Duration, bool) {
    let t0 = Instant::now();
    loop {
        let ids = src.order_ids().await.unwrap_or_default();
        let dead = src.dead_lettered().await.unwrap_or_default();
        let waiting = reserved
            .iter()
            .filter(|id| !ids.contains(*id) && !dead.contains(*id))
            .count();
        let in_flight: i64 = match src.reconcile().await {
            Ok(m) => m.values().map(|r| r.in_flight.max(0)).sum(),
            Err(_) => 0,
        };
        pb.set_message(format!(
            "draining: {waiting} reservations not yet orders, {in_flight} in flight"
        ));
        if waiting == 0 && in_flight == 0 {
            return (t0.elapsed(), true);
        }
        if t0.elapsed() >= timeout {
            return (t0.elapsed(), false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Pays roughly `fraction` of the PENDING orders through `POST /orders/{id}/pay`, as
/// their holders. Which ones is a stable function of the id. Returns the number applied
/// and the refusals by cause (status and code; e.g. a bot's order from a banned IP).
pub async fn pay_some(
    src: &Sources,
    gateway: &str,
    reserved: &BTreeMap<String, Holder>,
    fraction: f64,
) -> (u64, BTreeMap<String, u64>) {
    if fraction <= 0.0 {
        return (0, BTreeMap::new());
    }
    let pending = src.pending().await.unwrap_or_default();
    let picked: Vec<(&String, &Holder)> = reserved
        .iter()
        .filter(|(id, _)| pending.contains(*id) && pick(id, fraction))
        .collect();
    let mut tasks = Vec::new();
    for chunk in picked.chunks(picked.len().div_ceil(16).max(1)) {
        let jobs: Vec<(String, Holder)> = chunk
            .iter()
            .map(|(i, h)| ((*i).clone(), (*h).clone()))
            .collect();
        let gateway = gateway.to_owned();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0u64, BTreeMap::<String, u64>::new());
            for (id, h) in jobs {
                let url = format!("{gateway}/api/v1/orders/{id}/pay");
                let a = h.door.call(Method::POST, &url, Some(&h.jwt), None).await;
                if a.status == Some(200) {
                    ok += 1;
                } else {
                    let cause = match a.status {
                        Some(s) => format!("HTTP {s} {}", a.code().unwrap_or("")),
                        None => format!("transport: {}", a.error.unwrap_or_default()),
                    };
                    *refused.entry(cause).or_insert(0) += 1;
                }
            }
            (ok, refused)
        }));
    }
    let (mut applied, mut refused) = (0, BTreeMap::new());
    for t in tasks {
        if let Ok((a, r)) = t.await {
            applied += a;
            for (k, n) in r {
                *refused.entry(k).or_insert(0) += n;
            }
        }
    }
    (applied, refused)
}

/// For orders that no 202 named, asks their buyers' `GET /api/v1/orders` (as an app's
/// "my orders" page would) and counts those found there. `who(user)` gives the buyer's
/// JWT and address; orders of users the crowd does not know are not looked up.
pub async fn find_unacknowledged(
    src: &Sources,
    gateway: &str,
    reserved: &BTreeSet<String>,
    who: impl Fn(&str) -> Option<(String, Door)>,
) -> u64 {
    let owners = src.owners().await.unwrap_or_default();
    let mut tasks = Vec::new();
    for (id, user) in owners.into_iter().filter(|(id, _)| !reserved.contains(id)) {
        let Some((jwt, door)) = who(&user) else {
            continue;
        };
        let url = format!("{gateway}/api/v1/orders");
        tasks.push(tokio::spawn(async move {
            let a = door.call(Method::GET, &url, Some(&jwt), None).await;
            a.body["orders"]
                .as_array()
                .is_some_and(|l| l.iter().any(|o| o["id"] == id.as_str()))
        }));
    }
    let mut found = 0;
    for t in tasks {
        if matches!(t.await, Ok(true)) {
            found += 1;
        }
    }
    found
}

/// A stable pseudo-random choice of `fraction` of the ids (FNV-1a of the id).
pub fn pick(id: &str, fraction: f64) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % 10_000) as f64 / 10_000.0 < fraction
}

/// Gathers the facts after the drain.
pub async fn gather(src: &Sources, facts: &mut Facts) -> anyhow::Result<()> {
    facts.items = src.items().await?;
    facts.order_ids = src.order_ids().await?;
    facts.dead_lettered = src.dead_lettered().await?;
    facts.mysql_duplicates = src.mysql_duplicates().await?;
    match src.reconcile().await {
        Ok(mut m) => {
            for i in &mut facts.items {
                i.reconcile = m.remove(&i.item_id);
            }
        }
        Err(e) => facts.reconcile_error = Some(format!("{e:#}")),
    }
    Ok(())
}

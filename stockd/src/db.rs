//! The MySQL side: activities and items (the record), active orders and stock, read
//! for publication, recompute and reconciliation. Plain `sqlx::query` (no
//! compile-time checked macros). Times are `DATETIME(3)` holding UTC.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::Row;

use crate::config::MysqlConfig;
use crate::domain::NewActivity;
use crate::error::Result;
use seckill_proto::pb;

/// Status strings of `activities.status`.
pub const DRAFT: &str = "DRAFT";
pub const SCHEDULED: &str = "SCHEDULED";
pub const PUBLISHED: &str = "PUBLISHED";

/// A lazily connecting pool: stockd starts even while MySQL is down.
pub fn pool(cfg: &MysqlConfig) -> anyhow::Result<MySqlPool> {
    Ok(MySqlPoolOptions::new()
        .max_connections(cfg.max_connections)
        .acquire_timeout(Duration::from_millis(cfg.acquire_timeout_ms))
        .connect_lazy(&cfg.url)?)
}

fn to_dt(ms: i64) -> NaiveDateTime {
    DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .naive_utc()
}

fn to_ms(dt: NaiveDateTime) -> i64 {
    dt.and_utc().timestamp_millis()
}

fn status_of(s: &str) -> pb::ActivityStatus {
    match s {
        DRAFT => pb::ActivityStatus::Draft,
        SCHEDULED => pb::ActivityStatus::Scheduled,
        PUBLISHED => pb::ActivityStatus::Published,
        _ => pb::ActivityStatus::Unspecified,
    }
}

/// Stores a validated activity and its items in one transaction.
pub async fn create_activity(pool: &MySqlPool, a: &NewActivity) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let id = sqlx::query(
        "INSERT INTO activities \
         (title, start_at, end_at, shard_count, per_user_limit, status, challenge_bits, \
          redis_cluster) \
         VALUES (?, ?, ?, ?, ?, 'DRAFT', ?, ?)",
    )
    .bind(&a.title)
    .bind(to_dt(a.start_at_ms))
    .bind(to_dt(a.end_at_ms))
    .bind(a.shard_count)
    .bind(a.per_user_limit)
    .bind(a.challenge_bits)
    .bind(&a.redis_cluster)
    .execute(&mut *tx)
    .await?
    .last_insert_id();
    for it in &a.items {
        sqlx::query(
            "INSERT INTO activity_items \
             (activity_id, title, price_cents, sale_price_cents, total_stock, stock) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(&it.title)
        .bind(it.price_cents)
        .bind(it.sale_price_cents)
        .bind(it.stock)
        .bind(it.stock)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(id)
}

const ACTIVITY_COLUMNS: &str = "id, title, start_at, end_at, shard_count, per_user_limit, \
     status, publish_at, version, challenge_bits, redis_cluster";

fn activity_from_row(r: &sqlx::mysql::MySqlRow) -> Result<pb::Activity> {
    let publish_at: Option<NaiveDateTime> = r.try_get("publish_at")?;
    Ok(pb::Activity {
        id: r.try_get("id")?,
        title: r.try_get("title")?,
        start_at_ms: to_ms(r.try_get("start_at")?),
        end_at_ms: to_ms(r.try_get("end_at")?),
        shard_count: r.try_get("shard_count")?,
        per_user_limit: r.try_get("per_user_limit")?,
        status: status_of(r.try_get::<String, _>("status")?.as_str()) as i32,
        publish_at_ms: publish_at.map(to_ms).unwrap_or(0),
        items: Vec::new(),
        version: r.try_get("version")?,
        challenge_bits: r.try_get("challenge_bits")?,
        redis_cluster: r.try_get("redis_cluster")?,
    })
}

/// Items of the given activities, grouped by activity.
async fn items_of(pool: &MySqlPool, ids: &[u64]) -> Result<HashMap<u64, Vec<pb::Item>>> {
    let mut out: HashMap<u64, Vec<pb::Item>> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    // Chunks: the catalog load asks for every published activity at once.
    for ids in ids.chunks(1000) {
        let marks = vec!["?"; ids.len()].join(",");
        let sql = format!(
            "SELECT id, activity_id, title, price_cents, sale_price_cents, total_stock \
             FROM activity_items WHERE activity_id IN ({marks}) ORDER BY id"
        );
        let mut q = sqlx::query(&sql);
        for id in ids {
            q = q.bind(id);
        }
        for r in q.fetch_all(pool).await? {
            let item = pb::Item {
                id: r.try_get("id")?,
                activity_id: r.try_get("activity_id")?,
                title: r.try_get("title")?,
                price_cents: r.try_get("price_cents")?,
                sale_price_cents: r.try_get("sale_price_cents")?,
                stock: r.try_get("total_stock")?,
            };
            out.entry(item.activity_id).or_default().push(item);
        }
    }
    Ok(out)
}

async fn with_items(pool: &MySqlPool, mut acts: Vec<pb::Activity>) -> Result<Vec<pb::Activity>> {
    let ids: Vec<u64> = acts.iter().map(|a| a.id).collect();
    let mut items = items_of(pool, &ids).await?;
    for a in &mut acts {
        a.items = items.remove(&a.id).unwrap_or_default();
    }
    Ok(acts)
}

/// One activity with its items.
pub async fn get_activity(pool: &MySqlPool, id: u64) -> Result<Option<pb::Activity>> {
    let sql = format!("SELECT {ACTIVITY_COLUMNS} FROM activities WHERE id = ?");
    let Some(row) = sqlx::query(&sql).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    let a = activity_from_row(&row)?;
    Ok(with_items(pool, vec![a]).await?.pop())
}

/// Activities, newest first; `current_only` keeps those whose window has not ended.
/// `status` filters on the status column when given.
pub async fn list_activities(
    pool: &MySqlPool,
    current_only: bool,
    status: Option<&str>,
    now_ms: i64,
) -> Result<Vec<pb::Activity>> {
    let mut sql = format!("SELECT {ACTIVITY_COLUMNS} FROM activities WHERE 1 = 1");
    if current_only {
        sql.push_str(" AND end_at > ?");
    }
    if status.is_some() {
        sql.push_str(" AND status = ?");
    }
    sql.push_str(" ORDER BY id DESC LIMIT 1000");
    let mut q = sqlx::query(&sql);
    if current_only {
        q = q.bind(to_dt(now_ms));
    }
    if let Some(s) = status {
        q = q.bind(s);
    }
    let acts = q
        .fetch_all(pool)
        .await?
        .iter()
        .map(activity_from_row)
        .collect::<Result<Vec<_>>>()?;
    with_items(pool, acts).await
}

/// Every published activity with its items, for the catalog: no row limit (the
/// API's list stops at 1000, and a catalog missing an open activity would answer
/// UNAVAILABLE for it forever).
pub async fn published_activities(pool: &MySqlPool) -> Result<Vec<pb::Activity>> {
    let sql = format!("SELECT {ACTIVITY_COLUMNS} FROM activities WHERE status = ? ORDER BY id");
    let acts = sqlx::query(&sql)
        .bind(PUBLISHED)
        .fetch_all(pool)
        .await?
        .iter()
        .map(activity_from_row)
        .collect::<Result<Vec<_>>>()?;
    with_items(pool, acts).await
}

/// What changes when an activity becomes published or stops being, or a published
/// one is written: how many there are, the sums of their ids and versions, and the
/// newest `updated_at` among them. One row, so the catalog poll reads the activities
/// themselves only when it moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMark {
    pub count: i64,
    pub id_sum: u64,
    pub version_sum: u64,
    pub newest: Option<NaiveDateTime>,
}

/// The [`PublishedMark`] now.
pub async fn published_mark(pool: &MySqlPool) -> Result<PublishedMark> {
    let r = sqlx::query(
        "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(id), 0) AS UNSIGNED) AS ids, \
         CAST(COALESCE(SUM(version), 0) AS UNSIGNED) AS versions, MAX(updated_at) AS newest \
         FROM activities WHERE status = ?",
    )
    .bind(PUBLISHED)
    .fetch_one(pool)
    .await?;
    Ok(PublishedMark {
        count: r.try_get("n")?,
        id_sum: r.try_get("ids")?,
        version_sum: r.try_get("versions")?,
        newest: r.try_get("newest")?,
    })
}

/// Marks an activity published (warmed).
pub async fn set_published(pool: &MySqlPool, id: u64, now_ms: i64) -> Result<()> {
    sqlx::query(
        "UPDATE activities SET status = 'PUBLISHED', published_at = ?, \
         version = version + IF(status = 'PUBLISHED', 0, 1) WHERE id = ?",
    )
    .bind(to_dt(now_ms))
    .bind(id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Claims the first warm-up of a not yet published activity for `hold`: true for the
/// one call that set `warm_claim_until` (MySQL's clock plus `hold`) while it was unset
/// (`AdminService` publish, `App::warm_claim`).
pub async fn claim_warm(pool: &MySqlPool, id: u64, hold: Duration) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE activities SET warm_claim_until = NOW(3) + INTERVAL ? MICROSECOND \
         WHERE id = ? AND status <> 'PUBLISHED' AND warm_claim_until IS NULL",
    )
    .bind(hold.as_micros() as u64)
    .bind(id)
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Claims anew, for `hold`, a warm-up whose claim has run out by MySQL's clock: true for
/// the one call that did.
pub async fn take_over_warm(pool: &MySqlPool, id: u64, hold: Duration) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE activities SET warm_claim_until = NOW(3) + INTERVAL ? MICROSECOND \
         WHERE id = ? AND status <> 'PUBLISHED' AND warm_claim_until < NOW(3)",
    )
    .bind(hold.as_micros() as u64)
    .bind(id)
    .execute(pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Shortens a failed warm-up's claim to `gap` from now (never lengthens one): a publish
/// retried after it takes over then, leaving a `WARM` that timed out its time to land
/// or not.
pub async fn abandon_warm(pool: &MySqlPool, id: u64, gap: Duration) -> Result<()> {
    sqlx::query(
        "UPDATE activities \
         SET warm_claim_until = LEAST(warm_claim_until, NOW(3) + INTERVAL ? MICROSECOND) \
         WHERE id = ? AND status <> 'PUBLISHED' AND warm_claim_until IS NOT NULL",
    )
    .bind(gap.as_micros() as u64)
    .bind(id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Schedules the warm-up of a not yet published activity at `at_ms`.
pub async fn set_scheduled(pool: &MySqlPool, id: u64, at_ms: i64) -> Result<()> {
    sqlx::query(
        "UPDATE activities SET status = 'SCHEDULED', publish_at = ?, version = version + 1 \
         WHERE id = ? AND status <> 'PUBLISHED'",
    )
    .bind(to_dt(at_ms))
    .bind(id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Scheduled activities whose publish time has come.
pub async fn due_scheduled(pool: &MySqlPool, now_ms: i64) -> Result<Vec<u64>> {
    let rows = sqlx::query(
        "SELECT id FROM activities WHERE status = 'SCHEDULED' AND publish_at <= ? ORDER BY id",
    )
    .bind(to_dt(now_ms))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok(r.try_get::<u64, _>("id")?))
        .collect()
}

/// MySQL's view of one item, read inside one snapshot.
#[derive(Debug, Clone, Default)]
pub struct ItemRecord {
    pub item_id: u64,
    pub total_stock: u32,
    /// Units not yet taken by an order.
    pub stock: u32,
    /// Active (PENDING or PAID) orders: (reservation id, user id, request id, units).
    pub active: Vec<(String, String, String, u32)>,
}

/// Items of an activity with their active orders, and which of `rids` exist as
/// orders in any status; all read in one consistent snapshot.
pub async fn snapshot(
    pool: &MySqlPool,
    activity: u64,
    rids: &[String],
) -> Result<(Vec<ItemRecord>, HashSet<String>)> {
    let mut tx = pool.begin().await?;
    let mut items: Vec<ItemRecord> = Vec::new();
    for r in sqlx::query(
        "SELECT id, total_stock, stock FROM activity_items WHERE activity_id = ? ORDER BY id",
    )
    .bind(activity)
    .fetch_all(&mut *tx)
    .await?
    {
        items.push(ItemRecord {
            item_id: r.try_get("id")?,
            total_stock: r.try_get("total_stock")?,
            stock: r.try_get("stock")?,
            active: Vec::new(),
        });
    }
    for r in sqlx::query(
        "SELECT id, item_id, user_id, request_id, quantity FROM orders \
         WHERE activity_id = ? AND status IN ('PENDING', 'PAID')",
    )
    .bind(activity)
    .fetch_all(&mut *tx)
    .await?
    {
        let item: u64 = r.try_get("item_id")?;
        if let Some(rec) = items.iter_mut().find(|i| i.item_id == item) {
            rec.active.push((
                r.try_get("id")?,
                r.try_get("user_id")?,
                r.try_get("request_id")?,
                r.try_get("quantity")?,
            ));
        }
    }
    let mut known = HashSet::new();
    for chunk in rids.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(",");
        let sql = format!("SELECT id FROM orders WHERE id IN ({marks})");
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(id);
        }
        for r in q.fetch_all(&mut *tx).await? {
            known.insert(r.try_get::<String, _>("id")?);
        }
    }
    tx.commit().await?;
    Ok((items, known))
}

/// Units of the active orders of one item, and its MySQL stock.
pub async fn item_counts(pool: &MySqlPool, item: u64) -> Result<Option<(i64, i64)>> {
    let Some(row) = sqlx::query("SELECT stock FROM activity_items WHERE id = ?")
        .bind(item)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let stock: u32 = row.try_get("stock")?;
    let active: i64 = sqlx::query(
        "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) AS n FROM orders \
         WHERE item_id = ? AND status IN ('PENDING', 'PAID')",
    )
    .bind(item)
    .fetch_one(pool)
    .await?
    .try_get("n")?;
    Ok(Some((i64::from(stock), active)))
}

/// Reservation ids of shard `shard` of activity `a` handed out under `epoch` that MySQL
/// knows: orders of any status and dead letters. What a rebuild compares with the
/// shard's sequence to find reservations Redis lost before orderd read them.
pub async fn known_under(pool: &MySqlPool, a: u64, shard: u32, epoch: &str) -> Result<Vec<String>> {
    // `%` stands for the item id; the exact shard and epoch are checked by the caller
    // after parsing (a `%` may also swallow digits of the shard).
    let pattern = format!("{a}-%-{shard}-{epoch}-%");
    let rows = sqlx::query(
        "SELECT id FROM orders WHERE activity_id = ? AND shard = ? AND id LIKE ? \
         UNION ALL SELECT reservation_id FROM dead_letters WHERE reservation_id LIKE ?",
    )
    .bind(a)
    .bind(shard)
    .bind(&pattern)
    .bind(&pattern)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.try_get::<Option<String>, _>(0).ok().flatten())
        .collect())
}

/// The reservation id of the newest order of shard `shard` of activity `a`, if any:
/// the epoch a shard ran under when neither Redis nor this process remembers it.
pub async fn newest_order(pool: &MySqlPool, a: u64, shard: u32) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM orders WHERE activity_id = ? AND shard = ? \
         ORDER BY reserved_at DESC LIMIT 1",
    )
    .bind(a)
    .bind(shard)
    .fetch_optional(pool)
    .await?)
}

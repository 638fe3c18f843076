//! orderd's MySQL side: every statement orderd runs, each transition in one
//! transaction.
//!
//! - [`Db::write_batch`]: a batch of stream entries → orders, stock under the
//!   `stock >= k` guard, stock log, outbox rows for failed orders.
//! - [`Db::pay`], [`Db::cancel`], [`Db::payment_callback`]: conditional updates from
//!   `PENDING`, the row locked (`FOR UPDATE`) so pay and cancel serialize and the loser
//!   sees the winner's state.
//! - [`Db::expire_due`]: the timeout sweep (`FOR UPDATE SKIP LOCKED`, so two orderd
//!   processes never cancel the same order twice).
//! - the stock-return outbox and the dead letters.
//!
//! Times are UTC `DATETIME(3)` values computed here, never the server's `NOW()`.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{MySql, QueryBuilder, Row};

use crate::config::MysqlConfig;
use crate::error::{Error, Result};
use crate::model::{now, Change, OrderRow, Reservation, ReturnReason, Status, ORDER_COLUMNS};

/// `failure_reason` of an order MySQL had no unit for.
pub const SOLD_OUT_AFTER_ALL: &str = "sold out after all: no unit left in MySQL stock";
/// `failure_reason` of an order whose user already holds an active order of the item.
pub const ALREADY_HOLDS: &str = "the user already holds an active order for this item";

/// What became of one stream entry in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// A new `PENDING` order holding a unit.
    Pending,
    /// A new `FAILED` order (the reason is its `failure_reason`).
    Failed(&'static str),
    /// The order already existed (a redelivery); nothing changed.
    Already,
    /// The entry cannot become an order as things stand (unknown item); retried
    /// until it is dead-lettered.
    Poison(String),
}

/// A row of `stock_return_outbox`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: u64,
    pub order_id: String,
    pub activity_id: u64,
    pub item_id: u64,
    pub user_id: String,
    pub reason: String,
}

/// A row of `dead_letters`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeadLetterRow {
    pub id: u64,
    pub stream: String,
    pub entry_id: String,
    pub reservation_id: Option<String>,
    pub payload: String,
    pub deliveries: u32,
    pub last_error: String,
    pub created_at: NaiveDateTime,
    pub replayed_at: Option<NaiveDateTime>,
}

/// The pool; cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: MySqlPool,
}

#[derive(Debug)]
struct ItemRow {
    activity_id: u64,
    sale_price_cents: i64,
    stock: u32,
}

impl Db {
    /// A lazy pool: start-up does not wait for MySQL; the first query connects, and
    /// a MySQL that is down shows up as failed batches (backed off), not a crash.
    pub fn connect_lazy(cfg: &MysqlConfig) -> Result<Self> {
        let opts = MySqlConnectOptions::from_str(&cfg.url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(cfg.max_connections)
            .acquire_timeout(Duration::from_millis(cfg.acquire_timeout_ms))
            .connect_lazy_with(opts);
        Ok(Self { pool })
    }

    /// Wraps an existing pool (tests, benchmark).
    pub fn from_pool(pool: MySqlPool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// `(activity id, shard count)` of every published activity.
    pub async fn published_activities(&self) -> Result<Vec<(u64, u32)>> {
        let rows = sqlx::query_as::<_, (u64, u32)>(
            "SELECT id, shard_count FROM activities WHERE status = 'PUBLISHED'",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// Writes a batch of reservations in ONE transaction and says what became of
    /// each (same order as `batch`). Safe to call again with the same entries: an
    /// existing order id is [`Written::Already`].
    ///
    /// Units are taken per item under the `stock >= k` guard, in stream order: when
    /// MySQL has fewer units than the batch wants, the first ones get them and the
    /// rest become `FAILED` (sold out after all) with an outbox row that drops their
    /// Redis buyer record without returning a unit.
    ///
    /// Two tries: first optimistic (the hot item row is locked only by the closing
    /// guarded `UPDATE`, so batches of one item overlap their inserts and hold the row
    /// lock only until commit); when MySQL turns out to lack units for the whole batch,
    /// that transaction rolls back and the batch is redone with the item rows locked
    /// first, deciding exactly which entries get a unit.
    pub async fn write_batch(
        &self,
        batch: &[Reservation],
        pay_timeout: Duration,
    ) -> Result<Vec<Written>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(done) = self.try_write(batch, pay_timeout, false).await? {
            return Ok(done);
        }
        match self.try_write(batch, pay_timeout, true).await? {
            Some(done) => Ok(done),
            None => Err(Error::Internal(
                "the locked batch path did not decide".into(),
            )),
        }
    }

    /// One try of [`Self::write_batch`]; `None` when optimistic and a guard failed
    /// (rolled back).
    async fn try_write(
        &self,
        batch: &[Reservation],
        pay_timeout: Duration,
        lock_first: bool,
    ) -> Result<Option<Vec<Written>>> {
        let mut out: Vec<Option<Written>> = vec![None; batch.len()];
        let created = now();
        let deadline = created + chrono::Duration::milliseconds(pay_timeout.as_millis() as i64);
        let mut tx = self.pool.begin().await?;

        // 1. The items (locked on the second try: consumers of one item serialize).
        let mut item_ids: Vec<u64> = batch.iter().map(|r| r.rid.item).collect();
        item_ids.sort_unstable();
        item_ids.dedup();
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, activity_id, sale_price_cents, stock FROM activity_items WHERE id IN (",
        );
        let mut sep = q.separated(", ");
        for id in &item_ids {
            sep.push_bind(*id);
        }
        q.push(if lock_first {
            ") ORDER BY id FOR UPDATE"
        } else {
            ") ORDER BY id"
        });
        let items: HashMap<u64, ItemRow> = q
            .build()
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|r| {
                (
                    r.get::<u64, _>(0),
                    ItemRow {
                        activity_id: r.get(1),
                        sale_price_cents: r.get(2),
                        stock: r.get(3),
                    },
                )
            })
            .collect();

        // 2. Orders that already exist: redeliveries.
        let mut q = QueryBuilder::<MySql>::new("SELECT id FROM orders WHERE id IN (");
        let mut sep = q.separated(", ");
        for r in batch {
            sep.push_bind(r.rid.to_string());
        }
        q.push(")");
        let existing: HashSet<String> = q
            .build()
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|r| r.get::<String, _>(0))
            .collect();

        // 3. Users who already hold an active order of these items. Point lookups
        //    in the unique (user, activity, item, active) index: the item's index
        //    would scan every order of a hot item, per batch.
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT user_id, item_id FROM orders FORCE INDEX (uq_orders_active_buyer) \
             WHERE user_id IN (",
        );
        let mut sep = q.separated(", ");
        for r in batch {
            sep.push_bind(r.user.clone());
        }
        q.push(") AND item_id IN (");
        let mut sep = q.separated(", ");
        for id in &item_ids {
            sep.push_bind(*id);
        }
        q.push(") AND active = 1");
        let mut holders: HashSet<(String, u64)> = q
            .build()
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|r| (r.get::<String, _>(0), r.get::<u64, _>(1)))
            .collect();

        // 4. Classify in stream order; count the units each item is asked for.
        let mut seen: HashSet<String> = HashSet::new();
        let mut wanted: HashMap<u64, Vec<usize>> = HashMap::new();
        for (k, r) in batch.iter().enumerate() {
            let id = r.rid.to_string();
            if existing.contains(&id) || !seen.insert(id) {
                out[k] = Some(Written::Already);
                continue;
            }
            match items.get(&r.rid.item) {
                None => {
                    out[k] = Some(Written::Poison(format!(
                        "item {} does not exist in MySQL",
                        r.rid.item
                    )))
                }
                Some(item) if item.activity_id != r.rid.activity => {
                    out[k] = Some(Written::Poison(format!(
                        "item {} does not belong to activity {}",
                        r.rid.item, r.rid.activity
                    )))
                }
                Some(_) => {
                    if !holders.insert((r.user.clone(), r.rid.item)) {
                        out[k] = Some(Written::Failed(ALREADY_HOLDS));
                    } else {
                        wanted.entry(r.rid.item).or_default().push(k);
                    }
                }
            }
        }

        // 5. Units per item: locked, exactly what MySQL has (the rest fail);
        //    optimistic, all of them or (guard fails later) a retry locked.
        let mut takes: Vec<(u64, u32)> = Vec::new();
        for (item_id, ks) in &wanted {
            let stock = items[item_id].stock as usize;
            if !lock_first && stock < ks.len() {
                return Ok(None);
            }
            let take = stock.min(ks.len());
            if take > 0 {
                takes.push((*item_id, take as u32));
            }
            for (n, k) in ks.iter().enumerate() {
                out[*k] = Some(if n < take {
                    Written::Pending
                } else {
                    Written::Failed(SOLD_OUT_AFTER_ALL)
                });
            }
        }

        takes.sort_unstable();
        if lock_first && !Self::take_units(&mut tx, &takes).await? {
            return Err(Error::Internal(
                "a stock guard failed under its row lock".into(),
            ));
        }

        // 6. Order rows, stock log, outbox.
        let new: Vec<(usize, &Reservation)> = batch
            .iter()
            .enumerate()
            .filter(|(k, _)| matches!(out[*k], Some(Written::Pending | Written::Failed(_))))
            .collect();
        for chunk in new.chunks(1000) {
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO orders (id, activity_id, item_id, user_id, request_id, shard, \
                 amount_cents, status, pay_deadline, failure_reason, reserved_at, created_at) ",
            );
            q.push_values(chunk, |mut b, (k, r)| {
                let (status, deadline, reason) = match &out[*k] {
                    Some(Written::Failed(why)) => (Status::Failed, None, Some(*why)),
                    _ => (Status::Pending, Some(deadline), None),
                };
                b.push_bind(r.rid.to_string())
                    .push_bind(r.rid.activity)
                    .push_bind(r.rid.item)
                    .push_bind(r.user.clone())
                    .push_bind(r.request.clone())
                    .push_bind(r.rid.shard)
                    .push_bind(items[&r.rid.item].sale_price_cents)
                    .push_bind(status.as_str())
                    .push_bind(deadline)
                    .push_bind(reason)
                    .push_bind(crate::model::from_ms(r.ts_ms))
                    .push_bind(created);
            });
            q.build().execute(&mut *tx).await?;
        }
        let pending: Vec<&Reservation> = new
            .iter()
            .filter(|(k, _)| out[*k] == Some(Written::Pending))
            .map(|(_, r)| *r)
            .collect();
        for chunk in pending.chunks(1000) {
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO stock_log (item_id, order_id, delta, reason, created_at) ",
            );
            q.push_values(chunk, |mut b, r| {
                b.push_bind(r.rid.item)
                    .push_bind(r.rid.to_string())
                    .push_bind(-1i32)
                    .push_bind("ORDER")
                    .push_bind(created);
            });
            q.build().execute(&mut *tx).await?;
        }
        let sold_out: Vec<&Reservation> = new
            .iter()
            .filter(|(k, _)| out[*k] == Some(Written::Failed(SOLD_OUT_AFTER_ALL)))
            .map(|(_, r)| *r)
            .collect();
        for chunk in sold_out.chunks(1000) {
            let mut q = QueryBuilder::<MySql>::new(
                "INSERT INTO stock_return_outbox (order_id, activity_id, item_id, user_id, reason, created_at) ",
            );
            q.push_values(chunk, |mut b, r| {
                b.push_bind(r.rid.to_string())
                    .push_bind(r.rid.activity)
                    .push_bind(r.rid.item)
                    .push_bind(r.user.clone())
                    .push_bind(ReturnReason::Failed.as_str())
                    .push_bind(created);
            });
            q.build().execute(&mut *tx).await?;
        }
        // Optimistic: the row lock of each item is taken here, held until commit.
        if !lock_first && !Self::take_units(&mut tx, &takes).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(
            out.into_iter()
                .map(|w| w.unwrap_or(Written::Already))
                .collect(),
        ))
    }

    /// `stock -= k` under the `stock >= k` guard for each `(item, k)` (in item order);
    /// false when a guard failed.
    async fn take_units(
        tx: &mut sqlx::Transaction<'_, MySql>,
        takes: &[(u64, u32)],
    ) -> Result<bool> {
        for (item, k) in takes {
            let done = sqlx::query(
                "UPDATE activity_items SET stock = stock - ?, version = version + 1 \
                 WHERE id = ? AND stock >= ?",
            )
            .bind(*k)
            .bind(*item)
            .bind(*k)
            .execute(&mut **tx)
            .await?;
            if done.rows_affected() != 1 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One order.
    pub async fn order(&self, id: &str) -> Result<Option<OrderRow>> {
        let row = sqlx::query_as::<_, OrderRow>(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    /// A user's orders, newest first, `limit` from `offset`.
    pub async fn orders_of(&self, user: &str, limit: u32, offset: u64) -> Result<Vec<OrderRow>> {
        let rows = sqlx::query_as::<_, OrderRow>(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE user_id = ? \
             ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
        ))
        .bind(user)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// `PENDING -> PAID` on a row the transaction holds locked; the status guard keeps
    /// it a no-op for any other state.
    async fn mark_paid(
        tx: &mut sqlx::Transaction<'_, MySql>,
        id: &str,
        provider_ref: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE orders SET status = 'PAID', paid_at = ?, provider_ref = ? \
             WHERE id = ? AND status = 'PENDING'",
        )
        .bind(now())
        .bind(provider_ref)
        .bind(id)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn lock_order(
        tx: &mut sqlx::Transaction<'_, MySql>,
        id: &str,
    ) -> Result<Option<OrderRow>> {
        Ok(sqlx::query_as::<_, OrderRow>(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE id = ? FOR UPDATE"
        ))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?)
    }

    fn owner_check(row: &OrderRow, user: Option<&str>) -> Result<()> {
        match user {
            Some(u) if u != row.user_id => Err(Error::PermissionDenied),
            _ => Ok(()),
        }
    }

    /// `PENDING → PAID` (the dev path, or a verified provider callback with its
    /// reference). `user` is the caller to check ownership against (None: internal).
    pub async fn pay(
        &self,
        id: &str,
        user: Option<&str>,
        provider_ref: Option<&str>,
    ) -> Result<(Change, OrderRow)> {
        let mut tx = self.pool.begin().await?;
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        Self::owner_check(&row, user)?;
        let change = match row.status() {
            Status::Pending => {
                Self::mark_paid(&mut tx, id, provider_ref).await?;
                Change::Applied
            }
            Status::Paid => Change::Already,
            Status::Cancelled | Status::Failed => Change::Conflict,
        };
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        tx.commit().await?;
        Ok((change, row))
    }

    /// `PENDING → CANCELLED` by its owner; the unit goes back to MySQL stock in the
    /// same transaction and to Redis through the outbox.
    pub async fn cancel(&self, id: &str, user: Option<&str>) -> Result<(Change, OrderRow)> {
        let mut tx = self.pool.begin().await?;
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        Self::owner_check(&row, user)?;
        let change = match row.status() {
            Status::Pending => {
                let at = now();
                sqlx::query(
                    "UPDATE orders SET status = 'CANCELLED', cancelled_at = ? \
                     WHERE id = ? AND status = 'PENDING'",
                )
                .bind(at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                Self::return_units(
                    &mut tx,
                    std::slice::from_ref(&row),
                    ReturnReason::Cancel,
                    at,
                )
                .await?;
                Change::Applied
            }
            Status::Cancelled => Change::Already,
            Status::Paid | Status::Failed => Change::Conflict,
        };
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        tx.commit().await?;
        Ok((change, row))
    }

    /// MySQL stock +1 per order, a stock log row and an outbox row each.
    async fn return_units(
        tx: &mut sqlx::Transaction<'_, MySql>,
        rows: &[OrderRow],
        reason: ReturnReason,
        at: NaiveDateTime,
    ) -> Result<()> {
        let mut per_item: HashMap<u64, u32> = HashMap::new();
        for r in rows {
            *per_item.entry(r.item_id).or_default() += 1;
        }
        let mut items: Vec<_> = per_item.into_iter().collect();
        items.sort_unstable();
        for (item, n) in items {
            sqlx::query(
                "UPDATE activity_items SET stock = stock + ?, version = version + 1 WHERE id = ?",
            )
            .bind(n)
            .bind(item)
            .execute(&mut **tx)
            .await?;
        }
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO stock_log (item_id, order_id, delta, reason, created_at) ",
        );
        q.push_values(rows, |mut b, r| {
            b.push_bind(r.item_id)
                .push_bind(r.id.clone())
                .push_bind(1i32)
                .push_bind(reason.as_str())
                .push_bind(at);
        });
        q.build().execute(&mut **tx).await?;
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO stock_return_outbox (order_id, activity_id, item_id, user_id, reason, created_at) ",
        );
        q.push_values(rows, |mut b, r| {
            b.push_bind(r.id.clone())
                .push_bind(r.activity_id)
                .push_bind(r.item_id)
                .push_bind(r.user_id.clone())
                .push_bind(reason.as_str())
                .push_bind(at);
        });
        q.build().execute(&mut **tx).await?;
        Ok(())
    }

    /// Cancels up to `limit` pending orders whose deadline is past, in one
    /// transaction; returns them.
    pub async fn expire_due(&self, limit: u32) -> Result<Vec<OrderRow>> {
        let at = now();
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query_as::<_, OrderRow>(&format!(
            "SELECT {ORDER_COLUMNS} FROM orders WHERE status = 'PENDING' AND pay_deadline <= ? \
             ORDER BY pay_deadline LIMIT ? FOR UPDATE SKIP LOCKED"
        ))
        .bind(at)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let mut q =
            QueryBuilder::<MySql>::new("UPDATE orders SET status = 'CANCELLED', cancelled_at = ");
        q.push_bind(at);
        q.push(", failure_reason = 'payment deadline passed' WHERE status = 'PENDING' AND id IN (");
        let mut sep = q.separated(", ");
        for r in &rows {
            sep.push_bind(r.id.clone());
        }
        q.push(")");
        let done = q.build().execute(&mut *tx).await?;
        if done.rows_affected() != rows.len() as u64 {
            return Err(Error::Internal("locked pending orders changed".into()));
        }
        Self::return_units(&mut tx, &rows, ReturnReason::Timeout, at).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// A verified provider callback: replay protection by `provider_ref`, the amount
    /// checked, then `PENDING → PAID`.
    pub async fn payment_callback(
        &self,
        id: &str,
        amount_cents: i64,
        provider_ref: &str,
        timestamp_ms: i64,
    ) -> Result<(Change, OrderRow)> {
        let mut tx = self.pool.begin().await?;
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        let seen: Option<(String,)> = sqlx::query_as(
            "SELECT order_id FROM payment_callbacks WHERE provider_ref = ? FOR UPDATE",
        )
        .bind(provider_ref)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((seen_for,)) = seen {
            if seen_for != id {
                return Err(Error::ReplayedCallback);
            }
            // The same callback again (providers retry): answer, change nothing.
            let change = if row.status() == Status::Paid
                && row.provider_ref.as_deref() == Some(provider_ref)
            {
                Change::Already
            } else {
                Change::Conflict
            };
            tx.commit().await?;
            return Ok((change, row));
        }
        if amount_cents != row.amount_cents {
            return Err(Error::invalid(
                "amount_cents",
                "does not match the order's amount",
            ));
        }
        sqlx::query(
            "INSERT INTO payment_callbacks (provider_ref, order_id, amount_cents, timestamp_ms, received_at) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(provider_ref)
        .bind(id)
        .bind(amount_cents)
        .bind(timestamp_ms)
        .bind(now())
        .execute(&mut *tx)
        .await?;
        let change = match row.status() {
            Status::Pending => {
                Self::mark_paid(&mut tx, id, Some(provider_ref)).await?;
                Change::Applied
            }
            // Paid already (another reference) or cancelled/failed: the payment lost
            // the race and must be refunded by the provider flow.
            _ => Change::Conflict,
        };
        let row = Self::lock_order(&mut tx, id)
            .await?
            .ok_or(Error::NotFound("order"))?;
        tx.commit().await?;
        Ok((change, row))
    }

    /// Outbox rows not yet relayed, oldest first.
    pub async fn pending_returns(&self, limit: u32) -> Result<Vec<OutboxRow>> {
        Ok(sqlx::query_as::<_, OutboxRow>(
            "SELECT id, order_id, activity_id, item_id, user_id, reason FROM stock_return_outbox \
             WHERE done_at IS NULL ORDER BY id LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn mark_returned(&self, id: u64) -> Result<()> {
        sqlx::query(
            "UPDATE stock_return_outbox SET done_at = ?, attempts = attempts + 1 WHERE id = ?",
        )
        .bind(now())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn mark_return_failed(&self, id: u64, error: &str) -> Result<()> {
        sqlx::query(
            "UPDATE stock_return_outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
        )
        .bind(error)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a dead letter (idempotent by stream and entry id).
    pub async fn insert_dead_letter(
        &self,
        stream: &str,
        entry_id: &str,
        rid: Option<&str>,
        payload: &str,
        deliveries: u64,
        last_error: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO dead_letters (stream, entry_id, reservation_id, payload, deliveries, last_error, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE deliveries = VALUES(deliveries), last_error = VALUES(last_error)",
        )
        .bind(stream)
        .bind(entry_id)
        .bind(rid)
        .bind(payload)
        .bind(deliveries as u32)
        .bind(last_error)
        .bind(now())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn dead_letters(
        &self,
        limit: u32,
        include_replayed: bool,
    ) -> Result<Vec<DeadLetterRow>> {
        let filter = if include_replayed {
            ""
        } else {
            "WHERE replayed_at IS NULL"
        };
        Ok(sqlx::query_as::<_, DeadLetterRow>(&format!(
            "SELECT id, stream, entry_id, reservation_id, payload, deliveries, last_error, created_at, replayed_at \
             FROM dead_letters {filter} ORDER BY id LIMIT ?"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn dead_letters_by_id(&self, ids: &[u64]) -> Result<Vec<DeadLetterRow>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<MySql>::new(
            "SELECT id, stream, entry_id, reservation_id, payload, deliveries, last_error, created_at, replayed_at \
             FROM dead_letters WHERE id IN (",
        );
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(*id);
        }
        q.push(") ORDER BY id");
        Ok(q.build_query_as().fetch_all(&self.pool).await?)
    }

    pub async fn unreplayed_dead_letters(&self) -> Result<u64> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM dead_letters WHERE replayed_at IS NULL")
                .fetch_one(&self.pool)
                .await?;
        Ok(n as u64)
    }

    pub async fn mark_replayed(&self, id: u64) -> Result<()> {
        sqlx::query("UPDATE dead_letters SET replayed_at = ? WHERE id = ?")
            .bind(now())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn mark_replay_failed(&self, id: u64, error: &str) -> Result<()> {
        sqlx::query("UPDATE dead_letters SET last_error = ? WHERE id = ?")
            .bind(error)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Orders by state, for the gauge.
    pub async fn count_by_state(&self) -> Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT status, COUNT(*) FROM orders GROUP BY status")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}

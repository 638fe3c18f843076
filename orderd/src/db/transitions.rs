//! Transitions of an order after intake, each one transaction on a locked row:
//! pay, cancel, the timeout sweep and the signed payment callback. Every change from
//! `PENDING` is a conditional update (the status guard), with the row locked
//! (`FOR UPDATE`) so pay and cancel serialize and the loser sees the winner's state;
//! a cancel or timeout returns the unit to MySQL stock in the same transaction and
//! queues its Redis return in the outbox.

use std::collections::HashMap;

use chrono::NaiveDateTime;
use sqlx::{MySql, QueryBuilder};

use super::Db;
use crate::error::{Error, Result};
use crate::model::{now, Change, OrderRow, ReturnReason, Status, ORDER_COLUMNS};

/// How many times a buyer's transition is run again after MySQL picked it as a
/// deadlock's victim (the timeout sweep locks many rows, a pay or a cancel one: they
/// can cross), before the caller is told UNAVAILABLE (retry).
const DEADLOCK_RETRIES: u32 = 3;

/// Runs `tx` (one whole transaction) again while it ends as a deadlock's victim, up to
/// [`DEADLOCK_RETRIES`] times: InnoDB rolled the victim back entirely, so nothing of a
/// failed attempt stays.
async fn retry_deadlocks<T, F, Fut>(mut tx: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match tx().await {
            Err(e) if e.is_deadlock() && attempt < DEADLOCK_RETRIES => {
                attempt += 1;
                tracing::info!(
                    attempt,
                    "transaction chosen as a deadlock victim; run again"
                );
            }
            r => return r,
        }
    }
}

impl Db {
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
        retry_deadlocks(|| self.pay_once(id, user, provider_ref)).await
    }

    async fn pay_once(
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
        retry_deadlocks(|| self.cancel_once(id, user)).await
    }

    async fn cancel_once(&self, id: &str, user: Option<&str>) -> Result<(Change, OrderRow)> {
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

    /// MySQL stock + the order's quantity per order, a stock log row and an outbox row
    /// each (the relay's RELEASE gives Redis the k units the buyer record holds).
    async fn return_units(
        tx: &mut sqlx::Transaction<'_, MySql>,
        rows: &[OrderRow],
        reason: ReturnReason,
        at: NaiveDateTime,
    ) -> Result<()> {
        let mut per_item: HashMap<u64, u32> = HashMap::new();
        for r in rows {
            *per_item.entry(r.item_id).or_default() += r.quantity;
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
                .push_bind(i64::from(r.quantity))
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
        retry_deadlocks(|| self.payment_callback_once(id, amount_cents, provider_ref, timestamp_ms))
            .await
    }

    async fn payment_callback_once(
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
}

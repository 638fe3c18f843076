//! The stock-return outbox: rows written with a cancel, a timeout or a failed order
//! in the same transaction, read and marked by the relay that calls RELEASE in Redis,
//! so a crash between MySQL and Redis can neither lose nor double a return.

use super::Db;
use crate::error::Result;
use crate::model::now;

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

impl Db {
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
}

//! The stock-return outbox: rows written with a cancel, a timeout or a failed order
//! in the same transaction, read and marked by the relay that calls RELEASE in Redis,
//! so a crash between MySQL and Redis can neither lose nor double a return.

use chrono::NaiveDateTime;

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
    /// 1 when the activity's sale is over (or MySQL does not know the activity):
    /// nothing can sell a returned unit any more. See [`OutboxRow::ended`].
    pub sale_over: i64,
}

impl OutboxRow {
    /// The activity's sale is over (or MySQL does not know the activity).
    pub fn ended(&self) -> bool {
        self.sale_over != 0
    }
}

/// Whose outbox rows one relay loop takes: those of the activities placed on one Redis
/// cluster (by `activities.redis_cluster`), so a cluster that is down holds up only its
/// own returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnCluster {
    /// The default cluster: `redis_cluster` `''` or `'default'`, and rows whose activity
    /// MySQL does not know.
    Default,
    /// The named cluster `[redis.clusters.<name>]`.
    Named(String),
}

impl Db {
    /// Outbox rows not yet relayed of the activities on `cluster`, those tried fewest
    /// times first, then oldest first (a row that keeps failing, e.g. on a shard closed
    /// for a long rebuild, does not hold up the rows behind it). Rows of
    /// an activity on a cluster this orderd is not configured with are nobody's: they
    /// wait (discovery warns about the activity).
    pub async fn pending_returns(&self, cluster: &OnCluster, limit: u32) -> Result<Vec<OutboxRow>> {
        let rows = match cluster {
            OnCluster::Default => {
                sqlx::query_as::<_, OutboxRow>(
                    "SELECT o.id, o.order_id, o.activity_id, o.item_id, o.user_id, o.reason, \
                     CAST(COALESCE(a.end_at <= ?, TRUE) AS SIGNED) AS sale_over \
                     FROM stock_return_outbox o LEFT JOIN activities a ON a.id = o.activity_id \
                     WHERE o.done_at IS NULL AND COALESCE(a.redis_cluster, '') IN ('', 'default') \
                     ORDER BY o.attempts, o.id LIMIT ?",
                )
                .bind(now())
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
            OnCluster::Named(name) => {
                sqlx::query_as::<_, OutboxRow>(
                    "SELECT o.id, o.order_id, o.activity_id, o.item_id, o.user_id, o.reason, \
                     CAST(a.end_at <= ? AS SIGNED) AS sale_over \
                     FROM stock_return_outbox o JOIN activities a ON a.id = o.activity_id \
                     WHERE o.done_at IS NULL AND a.redis_cluster = ? \
                     ORDER BY o.attempts, o.id LIMIT ?",
                )
                .bind(now())
                .bind(name)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
        };
        Ok(rows)
    }

    /// Outbox rows not yet relayed, of every cluster, and the time the oldest was
    /// written (`None` when there is none).
    pub async fn pending_return_stats(&self) -> Result<(u64, Option<NaiveDateTime>)> {
        let (n, oldest): (i64, Option<NaiveDateTime>) = sqlx::query_as(
            "SELECT COUNT(*), MIN(created_at) FROM stock_return_outbox WHERE done_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((n.max(0) as u64, oldest))
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

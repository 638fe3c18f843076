//! orderd's MySQL side: every statement orderd runs, each transition in one
//! transaction. One [`Db`] (the pool), its methods by concern:
//!
//! - [`intake`]: [`Db::write_batch`]: a batch of stream entries → orders, stock under
//!   the `stock >= k` guard, stock log, outbox rows for failed orders, in named steps.
//! - [`transitions`]: [`Db::pay`], [`Db::cancel`], [`Db::payment_callback`]:
//!   conditional updates from `PENDING`, the row locked (`FOR UPDATE`) so pay and
//!   cancel serialize and the loser sees the winner's state; [`Db::expire_due`]: the
//!   timeout sweep (`FOR UPDATE SKIP LOCKED`, so two orderd processes never cancel the
//!   same order twice).
//! - [`outbox`]: the stock-return outbox the relays drain (one per Redis cluster).
//! - [`dead_letters`]: entries that kept failing.
//! - here: the pool, and the reads (published activities and their Redis cluster, one
//!   order, a user's orders, counts by state).
//!
//! Times are UTC `DATETIME(3)` values computed here, never the server's `NOW()`.

mod dead_letters;
mod intake;
mod outbox;
mod transitions;

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

use crate::config::MysqlConfig;
use crate::error::Result;
use crate::model::{OrderRow, ORDER_COLUMNS};

pub use dead_letters::DeadLetterRow;
pub use intake::{ALREADY_HOLDS, SOLD_OUT_AFTER_ALL};
pub use outbox::{OnCluster, OutboxRow};

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

/// A published activity as discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PublishedActivity {
    pub id: u64,
    #[sqlx(rename = "shard_count")]
    pub shards: u32,
    /// The Redis cluster its stock lives on: `""` or `"default"` for the default one
    /// (`seckill_daemon::config::named_cluster`), else a `[redis.clusters.<name>]`.
    pub redis_cluster: String,
}

/// The pool; cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: MySqlPool,
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

    /// Every published activity: id, shard count and the Redis cluster it is placed on.
    pub async fn published_activities(&self) -> Result<Vec<PublishedActivity>> {
        let rows = sqlx::query_as::<_, PublishedActivity>(
            "SELECT id, shard_count, redis_cluster FROM activities WHERE status = 'PUBLISHED'",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The `redis_cluster` of activity `a` (any status); `None` when MySQL has no such
    /// activity.
    pub async fn activity_cluster(&self, a: u64) -> Result<Option<String>> {
        let row: Option<(String,)> =
            sqlx::query_as("SELECT redis_cluster FROM activities WHERE id = ?")
                .bind(a)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(c,)| c))
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

    /// Orders by state, for the gauge.
    pub async fn count_by_state(&self) -> Result<Vec<(String, i64)>> {
        Ok(
            sqlx::query_as("SELECT status, COUNT(*) FROM orders GROUP BY status")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}

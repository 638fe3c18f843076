//! Dead letters: stream entries that kept failing, kept with their payload and last
//! error until an operator replays them (`seckillctl dlq`).

use sqlx::{MySql, QueryBuilder};

use super::Db;
use crate::error::Result;
use crate::model::now;

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
    pub created_at: chrono::NaiveDateTime,
    pub replayed_at: Option<chrono::NaiveDateTime>,
}

impl Db {
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
}

//! The rebuild lease: at most one stockd rebuilds an activity at a time, so any number
//! of stockd can run against one Redis Cluster and one MySQL.
//!
//! The lease is a MySQL named lock, `seckill.rebuild.<activity>`, held on a connection
//! of its own for the whole rebuild. MySQL releases it when that connection ends, so a
//! holder that dies (kill -9, a cut network) releases it by itself; no expiry to tune.
//! Each holder raises the activity's row in `rebuild_leases` and gets the new value as
//! its fencing token: the rebuild script (`lua/scripts/rebuild.lua`) refuses a token
//! older than one that already touched the shard, so a holder whose connection died
//! while it still wrote to Redis cannot undo a newer holder's rebuild.

use sqlx::pool::PoolConnection;
use sqlx::MySql;

use crate::app::App;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// A held lease; release it with [`Lease::release`]. Dropped without release (an
/// error path), its connection closes, which releases the lock too.
pub struct Lease {
    conn: PoolConnection<MySql>,
    name: String,
    /// The fencing token of this holding.
    pub token: u64,
    metrics: Metrics,
}

impl App {
    /// Takes activity `a`'s rebuild lease, waiting while another stockd holds it.
    pub(crate) async fn take_lease(&self, a: u64) -> Result<Lease> {
        let name = format!("seckill.rebuild.{a}");
        let mut waited = false;
        loop {
            let mut conn = self.db.acquire().await?;
            // Never back into the pool: a connection that held the lock closes, so an
            // error between here and the release cannot leave the lock held.
            conn.close_on_drop();
            let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 1)")
                .bind(&name)
                .fetch_one(&mut *conn)
                .await?;
            if got == Some(1) {
                sqlx::query(
                    "INSERT INTO rebuild_leases (activity_id, token, holder) VALUES (?, 1, ?) \
                     ON DUPLICATE KEY UPDATE token = token + 1, holder = VALUES(holder), \
                     taken_at = CURRENT_TIMESTAMP(3)",
                )
                .bind(a)
                .bind(holder())
                .execute(&mut *conn)
                .await?;
                let token: u64 =
                    sqlx::query_scalar("SELECT token FROM rebuild_leases WHERE activity_id = ?")
                        .bind(a)
                        .fetch_one(&mut *conn)
                        .await?;
                self.metrics.rebuild_leases_held.inc();
                tracing::info!(activity = a, token, "rebuild lease taken");
                return Ok(Lease {
                    conn,
                    name,
                    token,
                    metrics: self.metrics.clone(),
                });
            }
            if !waited {
                waited = true;
                self.metrics.rebuild_lease_waits.inc();
                tracing::info!(
                    activity = a,
                    "another stockd is rebuilding; waiting for its lease"
                );
            }
            if self.shutdown.is_fired() {
                return Err(Error::Unavailable("shutting down".into()));
            }
        }
    }
}

impl Lease {
    /// Releases the lock (the connection then closes).
    pub async fn release(mut self) {
        let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&self.name)
            .execute(&mut *self.conn)
            .await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.metrics.rebuild_leases_held.dec();
    }
}

/// Who holds a lease, for the `rebuild_leases` row.
fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("stockd-{}@{host}", std::process::id())
}

//! [`App`]: the state every handler and background loop shares (config, Redis,
//! MySQL, metrics, catalog). Its methods live by concern in [`crate::stock`],
//! [`crate::recompute`] and [`crate::admin`].

use std::sync::Arc;

use sqlx::MySqlPool;

use crate::catalog::Catalog;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::redis::Redis;
use seckill_daemon::shutdown::Shutdown;

/// Shared state of one stockd process.
pub struct App {
    pub config: Config,
    pub redis: Redis,
    pub db: MySqlPool,
    pub metrics: Metrics,
    pub catalog: Catalog,
    pub shutdown: Shutdown,
    /// Rebuilds running at once: each holds a MySQL connection for its lease and
    /// needs another for its snapshot, so at most half the pool.
    pub rebuilds: tokio::sync::Semaphore,
}

impl App {
    pub fn new(
        config: Config,
        redis: Redis,
        db: MySqlPool,
        metrics: Metrics,
        shutdown: Shutdown,
    ) -> Arc<Self> {
        let rebuilds =
            tokio::sync::Semaphore::new((config.mysql.max_connections as usize / 2).max(1));
        Arc::new(Self {
            rebuilds,
            config,
            redis,
            db,
            metrics,
            catalog: Catalog::default(),
            shutdown,
        })
    }
}

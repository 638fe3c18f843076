//! [`App`]: the state every handler and background loop shares (config, Redis,
//! MySQL, metrics, catalog). Its methods live by concern in [`crate::stock`],
//! [`crate::recompute`] and [`crate::admin`].

use std::sync::Arc;

use sqlx::MySqlPool;

use crate::catalog::ActivityEntry;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::redis::{Clusters, Redis};
use seckill_daemon::shutdown::Shutdown;

/// Shared state of one stockd process.
pub struct App {
    pub config: Config,
    /// Every configured Redis Cluster; [`Self::redis`] is the default one, and
    /// [`Self::redis_of`] the one an activity's stock lives on.
    pub clusters: Clusters,
    pub db: MySqlPool,
    pub metrics: Metrics,
    pub catalog: Catalog,
    pub shutdown: Shutdown,
    /// Rebuilds running at once: each holds a MySQL connection for its lease and
    /// needs another for its snapshot, so at most half the pool.
    pub rebuilds: tokio::sync::Semaphore,
    /// Published activities on a cluster this process is not configured with (logged
    /// once each, left out of the catalog).
    pub unplaced: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Items whose sold-out clear no replica acknowledged, being sent again
    /// (`crate::clear`): one task per item.
    pub clears: crate::clear::Pending,
}

impl App {
    pub fn new(
        config: Config,
        clusters: Clusters,
        db: MySqlPool,
        metrics: Metrics,
        shutdown: Shutdown,
    ) -> Arc<Self> {
        let rebuilds =
            tokio::sync::Semaphore::new((config.mysql.max_connections as usize / 2).max(1));
        Arc::new(Self {
            rebuilds,
            config,
            clusters,
            db,
            metrics,
            catalog: Catalog::default(),
            unplaced: Default::default(),
            clears: Default::default(),
            shutdown,
        })
    }
}

impl App {
    /// The default cluster: the published-activity catalog (`sk:activities` and its
    /// channel), the meta hashes and the bans, whatever cluster an activity is on.
    pub fn redis(&self) -> &Redis {
        self.clusters.default_cluster()
    }

    /// The cluster holding `activity`'s shards, streams and sold-out flags.
    /// UNAVAILABLE when the activity names a cluster this stockd is not configured with
    /// (created by a peer with another config): answered, never guessed.
    pub fn redis_of(&self, activity: &ActivityEntry) -> Result<&Redis> {
        self.redis_named(&activity.activity.redis_cluster)
    }

    /// The cluster holding activity `a`'s shards: from the catalog, else from MySQL (an
    /// activity being published, or one this process has not loaded yet; its cluster is
    /// fixed at creation), else the default cluster (no such activity: its keys, if
    /// any, can only be there).
    pub async fn redis_at(&self, a: u64) -> Result<&Redis> {
        if let Some(entry) = self.catalog.get(a) {
            return self.redis_of(&entry);
        }
        match crate::db::get_activity(&self.db, a).await? {
            Some(activity) => self.redis_named(&activity.redis_cluster),
            None => Ok(self.redis()),
        }
    }

    /// The cluster an activity's `redis_cluster` names (see [`Self::redis_of`]).
    pub fn redis_named(&self, redis_cluster: &str) -> Result<&Redis> {
        self.clusters.get(redis_cluster).ok_or_else(|| {
            Error::Unavailable(format!(
                "the activity's redis_cluster `{redis_cluster}` is not configured on this \
                 stockd ([redis.clusters.{redis_cluster}])"
            ))
        })
    }
}

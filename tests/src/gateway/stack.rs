//! [`Stack`]: the whole back end an edge test stands in front of (a Redis Cluster, a
//! fresh database, stockd and orderd in this process), and its gateway.

use super::{spawn_gateway, spawn_gateway_unready, EdgeDeps, GatewayHandle};
use crate::Deps;
use std::time::Duration;

use crate::RedisCluster;

/// The whole back end an edge test stands in front of: a Redis Cluster, a fresh
/// database, and stockd and orderd in this process.
#[cfg(all(feature = "stockd", feature = "orderd"))]
pub struct Stack {
    pub redis: RedisCluster,
    pub db: crate::TestDb,
    pub stockd: crate::stockd::StockdHandle,
    pub orderd: crate::orderd::OrderdHandle,
}

#[cfg(all(feature = "stockd", feature = "orderd"))]
impl Stack {
    pub async fn start() -> Self {
        crate::init_tracing();
        let redis = RedisCluster::start();
        let db = crate::TestDb::create().await;
        let stockd = crate::stockd::spawn_stockd(&Deps::new(&redis, &db), |_| {}).await;
        let orderd = crate::orderd::spawn_orderd(&Deps::new(&redis, &db), |_| {}).await;
        Self {
            redis,
            db,
            stockd,
            orderd,
        }
    }

    /// A gateway (the built binary) in front of this stack, its config adjusted by `tweak`.
    pub async fn gateway(&self, tweak: impl FnOnce(&mut gateway::toml::Table)) -> GatewayHandle {
        self.edge(true, tweak).await
    }

    /// [`Self::gateway`] that waits only for `/healthz` (the demo suites, which wait for
    /// their activities themselves).
    pub async fn gateway_unready(
        &self,
        tweak: impl FnOnce(&mut gateway::toml::Table),
    ) -> GatewayHandle {
        self.edge(false, tweak).await
    }

    async fn edge(
        &self,
        ready: bool,
        tweak: impl FnOnce(&mut gateway::toml::Table),
    ) -> GatewayHandle {
        let orderd = self.orderd.addr_str();
        let deps = EdgeDeps {
            redis: &self.redis,
            stockd: &self.stockd.addr,
            orderd: &orderd,
        };
        if ready {
            spawn_gateway(&deps, tweak).await
        } else {
            spawn_gateway_unready(&deps, tweak).await
        }
    }

    /// An open activity (started now, an hour long) over 2 shards with these
    /// `(units, price in cents)` items.
    pub async fn open_activity(&self, items: &[(u32, i64)]) -> seckill_proto::pb::Activity {
        crate::stockd::create_published_activity(
            &self.stockd,
            items,
            2,
            Duration::ZERO,
            Duration::from_secs(3600),
        )
        .await
    }

    /// Reserve calls stockd has answered, whatever the outcome.
    pub fn reservations_seen_by_stockd(&self) -> u64 {
        self.stockd
            .metrics
            .registry
            .gather()
            .iter()
            .filter(|f| f.name() == "stockd_reservations_total")
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_counter().get_value() as u64)
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

//! Hot-item isolation (issue 15): one Redis client per configured cluster, and which
//! cluster each activity lives on.
//!
//! The `[redis]` section's own `nodes` are the *default* cluster; each
//! `[redis.clusters.<name>]` is a named one with the same timeouts. An activity's
//! `redis_cluster` (MySQL; `""` or `"default"` for the default one) places all of its
//! `sk:{a:i}:*` keys (stock, buyers, the `sk:{a:i}:orders` streams), its sold-out flags
//! and their `sk:soldout` messages on that cluster. The dead letters (`sk:dlq`) stay on
//! the default one.
//!
//! Parts:
//! - [`Cluster`]: one cluster's client ([`Redis`]) and its consumers' wake-ups
//!   ([`Wakes`]: one key-event listener and one clean-stream sweep per cluster).
//! - [`Clusters::start`]: every client built at once, each connecting in the background
//!   ([`Redis::start`]), so a cluster that is down at start neither stops orderd nor
//!   delays the others; [`report_connection`] logs when each one connects.
//! - [`Clusters::resolve`]: a `redis_cluster` value → the cluster, `None` when this
//!   orderd is not configured with it.
//! - [`Clusters::for_activity`]: the cluster of one activity id, from the placement map
//!   discovery keeps ([`Clusters::place`]), or MySQL on a miss.
//! - [`UnknownClusters`]: which activities name a cluster orderd lacks, so discovery
//!   warns once per activity, not once per pass.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use seckill_daemon::config::{named_cluster, DEFAULT_CLUSTER};
use seckill_daemon::shutdown::Shutdown;
use seckill_lua::ActivityId;

use crate::config::RedisConfig;
use crate::db::{Db, OnCluster};
use crate::error::{Error, Result};
use crate::redis::Redis;
use crate::wake::Wakes;

/// One Redis Cluster orderd talks to; cheap to clone.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// `default`, or the name of its `[redis.clusters.<name>]` section.
    pub name: String,
    pub redis: Redis,
    /// Wake-ups of the consumers of this cluster's streams.
    pub wakes: Wakes,
}

impl Cluster {
    /// The outbox rows this cluster's relay takes.
    pub fn outbox(&self) -> OnCluster {
        match named_cluster(&self.name) {
            None => OnCluster::Default,
            Some(name) => OnCluster::Named(name.to_string()),
        }
    }
}

/// Every configured cluster and the activity → cluster placement; cheap to clone.
#[derive(Clone, Debug)]
pub struct Clusters {
    default: Cluster,
    named: Arc<BTreeMap<String, Cluster>>,
    /// Activity id → its `redis_cluster`, as discovery (or a MySQL read) last saw it.
    placement: Arc<RwLock<HashMap<ActivityId, String>>>,
}

impl Clusters {
    /// A client for the default cluster (`cfg.nodes`) and one per named cluster, all
    /// connecting in the background. Fails only on a client that cannot be built.
    pub fn start(cfg: &RedisConfig) -> Result<Self> {
        let cluster = |name: &str, nodes: &[String]| -> Result<Cluster> {
            Ok(Cluster {
                name: name.to_string(),
                redis: Redis::start(nodes, cfg)?,
                wakes: Wakes::for_cluster(name),
            })
        };
        let default = cluster(DEFAULT_CLUSTER, &cfg.nodes)?;
        let mut named = BTreeMap::new();
        for (name, c) in &cfg.clusters {
            named.insert(name.clone(), cluster(name, &c.nodes)?);
        }
        Ok(Self {
            default,
            named: Arc::new(named),
            placement: Arc::default(),
        })
    }

    /// The default cluster (`[redis] nodes`): dead letters, and every activity that
    /// names no other.
    pub fn default_cluster(&self) -> &Cluster {
        &self.default
    }

    /// Every cluster, the default first, then the named ones by name.
    pub fn all(&self) -> impl Iterator<Item = &Cluster> {
        std::iter::once(&self.default).chain(self.named.values())
    }

    /// The cluster an activity's `redis_cluster` names; `None` when this orderd has no
    /// `[redis.clusters.<name>]` of that name.
    pub fn resolve(&self, redis_cluster: &str) -> Option<&Cluster> {
        match named_cluster(redis_cluster) {
            None => Some(&self.default),
            Some(name) => self.named.get(name),
        }
    }

    /// Records that activity `a` is placed on `redis_cluster`.
    pub fn place(&self, a: ActivityId, redis_cluster: &str) {
        let mut map = self.placement.write().unwrap_or_else(|p| p.into_inner());
        if map.get(&a).map(String::as_str) != Some(redis_cluster) {
            map.insert(a, redis_cluster.to_string());
        }
    }

    /// The cluster of activity `a`: from the placement map, else from MySQL (then
    /// remembered). An activity MySQL does not know is taken to be on the default
    /// cluster (its keys, if any, were written there). [`Error::UnknownCluster`] when
    /// it names a cluster this orderd is not configured with.
    pub async fn for_activity(&self, db: &Db, a: ActivityId) -> Result<Cluster> {
        let known = self
            .placement
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&a)
            .cloned();
        let name = match known {
            Some(name) => name,
            None => {
                let name = db.activity_cluster(a).await?.unwrap_or_default();
                self.place(a, &name);
                name
            }
        };
        self.resolve(&name).cloned().ok_or(Error::UnknownCluster {
            activity: a,
            cluster: name,
        })
    }

    /// Closes every client, all at once (a dead cluster's `QUIT` times out alone).
    pub async fn quit(&self) {
        futures::future::join_all(self.all().map(|c| c.redis.quit())).await;
    }
}

/// Logs when `cluster` first connects, and warns (once) while it cannot: the client
/// keeps trying in the background ([`Redis::start`]). Returns when connected or on
/// shutdown.
pub async fn report_connection(cluster: Cluster, wait: Duration, shutdown: Shutdown) {
    let client = cluster.redis.client().clone();
    let mut warned = false;
    loop {
        tokio::select! {
            r = client.wait_for_connect() => match r {
                Ok(()) => {
                    tracing::info!(cluster = %cluster.name, "connected to Redis cluster");
                    return;
                }
                Err(e) => {
                    if !warned {
                        warned = true;
                        tracing::warn!(cluster = %cluster.name, error = %e,
                            "Redis cluster unreachable; still connecting in the background");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.clone().wait() => return,
                    }
                }
            },
            _ = tokio::time::sleep(wait) => {
                if !warned {
                    warned = true;
                    tracing::warn!(cluster = %cluster.name,
                        "Redis cluster not reachable yet; still connecting in the background");
                }
            }
            _ = shutdown.clone().wait() => return,
        }
    }
}

/// Published activities placed on a cluster orderd is not configured with, as of the
/// last discovery pass.
#[derive(Debug, Default)]
pub struct UnknownClusters {
    seen: HashMap<ActivityId, String>,
}

impl UnknownClusters {
    /// Takes one pass's unknown placements (activity → the cluster it names) and returns
    /// those to warn about: new since the last pass, or now naming another cluster,
    /// by activity id. An activity that left the set (its cluster configured, or no
    /// longer published) is forgotten, so it is warned about again if it comes back.
    pub fn pass(&mut self, now: HashMap<ActivityId, String>) -> Vec<(ActivityId, String)> {
        let mut fresh: Vec<(ActivityId, String)> = now
            .iter()
            .filter(|(a, c)| self.seen.get(a) != Some(c))
            .map(|(a, c)| (*a, c.clone()))
            .collect();
        fresh.sort();
        self.seen = now;
        fresh
    }

    /// How many activities the last pass found on unknown clusters.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when the last pass found none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_daemon::config::NamedCluster;

    fn config(named: &[&str]) -> RedisConfig {
        let mut c =
            crate::Config::for_test(vec!["127.0.0.1:1".into()], "mysql://x@h/db", "t").redis;
        for n in named {
            c.clusters.insert(
                n.to_string(),
                NamedCluster {
                    nodes: vec!["127.0.0.1:2".into()],
                },
            );
        }
        c
    }

    #[tokio::test]
    async fn an_activity_resolves_to_the_default_its_named_cluster_or_none() {
        // Nothing listens on these ports: the clients connect in the background.
        let clusters = Clusters::start(&config(&["hot", "warm"])).unwrap();
        assert_eq!(clusters.resolve("").unwrap().name, "default");
        assert_eq!(clusters.resolve("default").unwrap().name, "default");
        assert_eq!(clusters.resolve("hot").unwrap().name, "hot");
        assert_eq!(
            clusters.resolve("warm").unwrap().outbox(),
            OnCluster::Named("warm".into())
        );
        assert_eq!(clusters.resolve("").unwrap().outbox(), OnCluster::Default);
        assert!(clusters.resolve("cold").is_none());
        let names: Vec<&str> = clusters.all().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["default", "hot", "warm"]);
        clusters.quit().await;
    }

    #[tokio::test]
    async fn a_placed_activity_is_found_without_mysql_and_an_unknown_cluster_is_an_error() {
        let clusters = Clusters::start(&config(&["hot"])).unwrap();
        // A lazy pool to nowhere: a lookup that reached MySQL would fail with Db.
        let db = Db::connect_lazy(&crate::config::MysqlConfig {
            url: "mysql://x@127.0.0.1:1/db".into(),
            max_connections: 1,
            acquire_timeout_ms: 50,
        })
        .unwrap();
        clusters.place(7, "hot");
        clusters.place(8, "");
        clusters.place(9, "cold");
        assert_eq!(clusters.for_activity(&db, 7).await.unwrap().name, "hot");
        assert_eq!(clusters.for_activity(&db, 8).await.unwrap().name, "default");
        match clusters.for_activity(&db, 9).await {
            Err(Error::UnknownCluster { activity, cluster }) => {
                assert_eq!((activity, cluster.as_str()), (9, "cold"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            clusters.for_activity(&db, 10).await,
            Err(Error::Db(_))
        ));
        // Discovery moves an activity: the map follows.
        clusters.place(7, "default");
        assert_eq!(clusters.for_activity(&db, 7).await.unwrap().name, "default");
        clusters.quit().await;
    }

    #[test]
    fn an_unknown_cluster_is_warned_about_once_per_activity_until_it_changes() {
        let mut u = UnknownClusters::default();
        let pass = |list: &[(u64, &str)]| -> HashMap<u64, String> {
            list.iter().map(|(a, c)| (*a, c.to_string())).collect()
        };
        assert_eq!(
            u.pass(pass(&[(2, "cold"), (1, "cold")])),
            [(1, "cold".to_string()), (2, "cold".to_string())]
        );
        assert_eq!(u.len(), 2);
        assert!(u.pass(pass(&[(1, "cold"), (2, "cold")])).is_empty());
        // Activity 2 moved to another unknown cluster; 1 was configured or ended.
        assert_eq!(u.pass(pass(&[(2, "ice")])), [(2, "ice".to_string())]);
        assert_eq!(u.len(), 1);
        assert!(u.pass(HashMap::new()).is_empty());
        assert!(u.is_empty());
        // Back again: warned again.
        assert_eq!(u.pass(pass(&[(1, "cold")])), [(1, "cold".to_string())]);
    }
}

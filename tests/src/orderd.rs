//! orderd for tests: in-process on port 0 ([`spawn_orderd`], [`spawn_orderd`]) or
//! as a child process ([`spawn_orderd_process`], for kill -9), plus seeding helpers
//! that need no stockd: an activity and its items in MySQL, warmed into Redis with
//! the real WARM script ([`seed_activity`]; on a named cluster, [`seed_activity_on`]),
//! and reservations made with the real
//! RESERVE script ([`reserve_direct`]).

use std::net::SocketAddr;
use std::time::Duration;

use fred::prelude::*;
use fred::types::Value;
use orderd::Config;
use seckill_daemon::shutdown::{Shutdown, Trigger};
use seckill_lua::calls::{ReserveCall, WarmCall};
use seckill_lua::{keys, ActivityId, ItemId};
use seckill_proto::auth::AttachToken;
use seckill_proto::pb::order_service_client::OrderServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::process::{free_port, workspace_bin, ChildGuard};
use crate::{Deps, TestDb, SERVICE_TOKEN};

/// An OrderService client that sends the harness's service token.
pub type OrderClient = OrderServiceClient<InterceptedService<Channel, AttachToken>>;

/// The callback secret of [`test_config`].
pub const CALLBACK_SECRET: &str = "test-callback-secret-0123456789";

/// orderd's test config for this cluster and database ([`Config::for_test`]).
pub fn test_config(deps: &Deps<'_>) -> Config {
    let mut c = Config::for_test(deps.redis.nodes(), &deps.db.url(), SERVICE_TOKEN);
    c.payment.callback_secret = CALLBACK_SECRET.into();
    c
}

/// An orderd running inside the test process; stops when dropped.
#[derive(Debug)]
pub struct OrderdHandle {
    /// gRPC address.
    pub addr: SocketAddr,
    /// The config it runs with.
    pub config: Config,
    /// Its metrics.
    pub metrics: orderd::Metrics,
    trigger: Option<Trigger>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl OrderdHandle {
    /// `host:port`.
    pub fn addr_str(&self) -> String {
        self.addr.to_string()
    }

    /// A client with the service token.
    pub async fn order_client(&self) -> OrderClient {
        order_client(&self.addr_str()).await
    }

    /// `OrderService.Pay` of `order_id` by `user`.
    pub async fn pay(
        &self,
        order_id: &str,
        user: &str,
    ) -> Result<seckill_proto::pb::OrderChange, tonic::Status> {
        let request = seckill_proto::pb::PayRequest {
            order_id: order_id.into(),
            user_id: user.into(),
        };
        Ok(self.order_client().await.pay(request).await?.into_inner())
    }

    /// `OrderService.Cancel` of `order_id` by `user`.
    pub async fn cancel(
        &self,
        order_id: &str,
        user: &str,
    ) -> Result<seckill_proto::pb::OrderChange, tonic::Status> {
        let request = seckill_proto::pb::CancelRequest {
            order_id: order_id.into(),
            user_id: user.into(),
        };
        Ok(self
            .order_client()
            .await
            .cancel(request)
            .await?
            .into_inner())
    }

    /// Graceful stop: fires shutdown and waits for `run` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(t) = self.trigger.take() {
            t.fire();
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for OrderdHandle {
    fn drop(&mut self) {
        if let Some(t) = self.trigger.take() {
            t.fire();
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A client for an orderd at `addr`, with the service token.
pub async fn order_client(addr: &str) -> OrderClient {
    let channel = crate::grpc::channel(addr).await;
    OrderServiceClient::with_interceptor(channel, AttachToken::new(SERVICE_TOKEN).unwrap())
}

/// orderd in-process with [`test_config`] + `tweak` (short timeouts, batch sizes, ...),
/// ready (health SERVING) when it returns. Its listen address is ignored: port 0.
pub async fn spawn_orderd(deps: &Deps<'_>, tweak: impl FnOnce(&mut Config)) -> OrderdHandle {
    let mut config = test_config(deps);
    tweak(&mut config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let (trigger, shutdown) = Shutdown::new();
    let metrics = orderd::Metrics::new();
    let task = tokio::spawn(orderd::run_with_metrics(
        config.clone(),
        listener,
        None,
        shutdown,
        metrics.clone(),
    ));
    wait_serving(&addr.to_string()).await;
    OrderdHandle {
        addr,
        config,
        metrics,
        trigger: Some(trigger),
        task: Some(task),
    }
}

async fn wait_serving(addr: &str) {
    use tonic_health::pb::health_check_response::ServingStatus;
    crate::process::wait_until_async("orderd SERVING", Duration::from_secs(30), || async {
        crate::grpc::health(addr, "seckill.v1.OrderService").await == ServingStatus::Serving
    })
    .await;
}

/// Until a child orderd listens on `port`.
async fn wait_listening(port: u16) {
    crate::process::wait_until_async("orderd listening", Duration::from_secs(30), || async move {
        crate::process::port_open(port)
    })
    .await;
}

/// orderd as a child process (the binary `orderd`, built first with
/// `cargo build -p orderd --bins`); SIGKILLed when dropped.
#[derive(Debug)]
pub struct OrderdProcess {
    pub addr: String,
    pub child: ChildGuard,
    pub config: Config,
    dir: tempfile::TempDir,
}

impl OrderdProcess {
    /// The log file of the process (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where the log is written.
    pub fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("orderd.log")
    }

    /// The config file the process was started with (rewrite it and send SIGHUP to
    /// reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self.dir.path().join("orderd.toml")
    }
}

/// Starts the `orderd` binary with [`test_config`] + `tweak` on a free port and waits
/// until it serves (with `[grpc.tls]`: until it listens; the test checks health with
/// its own TLS client).
pub async fn spawn_orderd_process(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut Config),
) -> OrderdProcess {
    let mut config = test_config(deps);
    // The process's own name: <hostname>-<pid>, so a restart is a new consumer.
    config.consumer.name = None;
    tweak(&mut config);
    let port = free_port(None);
    config.grpc.listen = format!("127.0.0.1:{port}");
    let dir = tempfile::Builder::new()
        .prefix("seckill-orderd-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().join("orderd.toml");
    std::fs::write(&path, config.to_toml()).expect("write config");
    let mut cmd = std::process::Command::new(workspace_bin("orderd"));
    cmd.arg("-c").arg(&path);
    if std::env::var("RUST_LOG").is_err() {
        cmd.env("RUST_LOG", "info");
    }
    let child =
        ChildGuard::spawn("orderd", cmd, &dir.path().join("orderd.log")).expect("spawn orderd");
    let addr = format!("127.0.0.1:{port}");
    if config.grpc.tls.is_some() {
        // The harness' plaintext client cannot check health on a TLS port.
        wait_listening(port).await;
    } else {
        wait_serving(&addr).await;
    }
    OrderdProcess {
        addr,
        child,
        config,
        dir,
    }
}

/// An activity seeded without stockd.
#[derive(Debug, Clone)]
pub struct Seeded {
    pub activity: ActivityId,
    pub items: Vec<ItemId>,
    pub shards: u32,
}

/// Inserts a PUBLISHED activity (window: an hour ago to an hour ahead) with one item
/// per `(stock, sale price cents)` into MySQL, and warms every shard in Redis with
/// the real WARM script (stock split with `split_stock`), the meta hash and the
/// activity set, as stockd's publish does.
pub async fn seed_activity(
    redis: &Client,
    db: &TestDb,
    shards: u32,
    items: &[(u32, i64)],
) -> Seeded {
    seed_activity_on(redis, redis, "", db, shards, items).await
}

/// [`seed_activity`] for an activity placed on the Redis cluster `redis_cluster`
/// (`activities.redis_cluster`, and the meta field `cluster` when not the default):
/// the shards are warmed on `stock` (that cluster), the meta hash and the activity set
/// written on `default` (the default cluster), as the contract places them.
pub async fn seed_activity_on(
    default: &Client,
    stock: &Client,
    redis_cluster: &str,
    db: &TestDb,
    shards: u32,
    items: &[(u32, i64)],
) -> Seeded {
    let pool = db.pool();
    let now = chrono_now_ms();
    let activity: u64 = sqlx::query(
        "INSERT INTO activities (title, start_at, end_at, shard_count, status, published_at, redis_cluster) \
         VALUES ('test sale', FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?, 'PUBLISHED', NOW(3), ?)",
    )
    .bind(now - 3_600_000)
    .bind(now + 3_600_000)
    .bind(shards)
    .bind(redis_cluster)
    .execute(pool)
    .await
    .expect("insert activity")
    .last_insert_id();
    let mut ids = Vec::new();
    for (k, (stock, price)) in items.iter().enumerate() {
        let id = sqlx::query(
            "INSERT INTO activity_items (activity_id, title, price_cents, sale_price_cents, total_stock, stock) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(activity)
        .bind(format!("item {k}"))
        .bind(price * 2)
        .bind(*price)
        .bind(*stock)
        .bind(*stock)
        .execute(pool)
        .await
        .expect("insert item")
        .last_insert_id();
        ids.push(id);
    }
    let epoch = seckill_lua::ids::epoch_from_millis(now as u64);
    let splits: Vec<Vec<u64>> = items
        .iter()
        .map(|(stock, _)| seckill_lua::split_stock(u64::from(*stock), shards))
        .collect();
    for i in 0..shards {
        let mut warm = WarmCall::new(activity, i, &epoch, false);
        for (n, id) in ids.iter().enumerate() {
            warm.push(*id, splits[n][i as usize]);
        }
        crate::redis::call(stock, warm).await;
    }
    let mut meta: Vec<(String, String)> = vec![
        (keys::meta::TITLE.into(), "test sale".into()),
        (keys::meta::START_MS.into(), (now - 3_600_000).to_string()),
        (keys::meta::END_MS.into(), (now + 3_600_000).to_string()),
        (keys::meta::SHARDS.into(), shards.to_string()),
        (
            keys::meta::ITEMS.into(),
            ids.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        ),
        (keys::meta::VERSION.into(), "1".into()),
    ];
    for (n, id) in ids.iter().enumerate() {
        meta.push((
            format!("{}{id}", keys::meta::ITEM_STOCK),
            items[n].0.to_string(),
        ));
        meta.push((
            format!("{}{id}", keys::meta::ITEM_PRICE),
            items[n].1.to_string(),
        ));
        meta.push((
            format!("{}{id}", keys::meta::ITEM_TITLE),
            format!("item {n}"),
        ));
    }
    if !redis_cluster.is_empty() {
        meta.push((keys::meta::CLUSTER.into(), redis_cluster.into()));
    }
    let _: Value = default
        .hset(keys::meta(activity), meta)
        .await
        .expect("meta");
    let _: Value = default
        .sadd(keys::ACTIVITIES, activity.to_string())
        .await
        .expect("activities set");
    Seeded {
        activity,
        items: ids,
        shards,
    }
}

/// What the RESERVE script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// RESERVED, RETRY, DUPLICATE, SOLD_OUT or LOST.
    pub outcome: String,
    pub rid: String,
    pub left: i64,
}

/// Calls the real RESERVE script on `user`'s home shard, as stockd's Reserve does.
pub async fn reserve_direct(
    redis: &Client,
    a: ActivityId,
    s: ItemId,
    shards: u32,
    user: &str,
    req: &str,
) -> Reserved {
    let h = seckill_lua::home_shard(user, shards);
    let mut call = ReserveCall::new(a, h, chrono_now_ms(), "", 0, 1);
    call.push(
        s,
        crate::redis::user_id(user),
        crate::redis::request_id(req),
    );
    let reply = crate::redis::call(redis, call).await;
    let parts = reply.into_array();
    Reserved {
        outcome: parts
            .first()
            .and_then(|v| v.as_string())
            .unwrap_or_default(),
        rid: parts.get(1).and_then(|v| v.as_string()).unwrap_or_default(),
        left: parts.get(2).and_then(|v| v.as_i64()).unwrap_or(-1),
    }
}

/// Units left in Redis for item `s` over every shard.
pub async fn redis_stock(redis: &Client, a: ActivityId, s: ItemId, shards: u32) -> i64 {
    let mut total = 0;
    for i in 0..shards {
        let n: Option<i64> = redis.get(keys::stock(a, i, s)).await.expect("get stock");
        total += n.unwrap_or(0);
    }
    total
}

/// Orders in MySQL by status.
pub async fn count_orders(db: &TestDb, status: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders WHERE status = ?")
        .bind(status)
        .fetch_one(db.pool())
        .await
        .expect("count orders");
    n
}

/// Every order in MySQL.
pub async fn count_all_orders(db: &TestDb) -> i64 {
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders")
        .fetch_one(db.pool())
        .await
        .expect("count orders");
    n
}

/// MySQL stock of an item.
pub async fn mysql_stock(db: &TestDb, item: ItemId) -> i64 {
    let (n,): (u32,) = sqlx::query_as("SELECT stock FROM activity_items WHERE id = ?")
        .bind(item)
        .fetch_one(db.pool())
        .await
        .expect("item stock");
    i64::from(n)
}

/// Waits until MySQL holds `n` orders (any state).
pub async fn wait_orders(db: &TestDb, n: i64, timeout: Duration) {
    crate::process::wait_until_async(&format!("{n} orders in MySQL"), timeout, || async {
        count_all_orders(db).await >= n
    })
    .await;
}

/// Unix ms now (the contract's clock).
pub fn chrono_now_ms() -> i64 {
    seckill_lua::clock::now_ms()
}

/// GetOrder for `user`.
pub async fn get_order(
    client: &mut OrderClient,
    id: &str,
    user: &str,
) -> Result<seckill_proto::pb::Order, tonic::Status> {
    client
        .get_order(seckill_proto::pb::GetOrderRequest {
            order_id: id.into(),
            user_id: user.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Sets activity `a`'s status in MySQL (orderd's discovery reads published ones).
pub async fn set_status(db: &TestDb, a: u64, status: &str) {
    sqlx::query("UPDATE activities SET status = ? WHERE id = ?")
        .bind(status)
        .bind(a)
        .execute(db.pool())
        .await
        .expect("set activity status");
}

/// Entries in activity `a`'s streams on `redis`, plus those read by group `orderd` and
/// not acknowledged.
pub async fn backlog(redis: &fred::clients::Client, a: u64, shards: u32) -> u64 {
    use fred::interfaces::StreamsInterface;
    let mut n = 0;
    for i in 0..shards {
        let len: u64 = redis
            .xlen(seckill_lua::keys::orders_stream(a, i))
            .await
            .expect("XLEN");
        let pending: fred::types::Value = redis
            .xpending(seckill_lua::keys::orders_stream(a, i), "orderd", ())
            .await
            .expect("XPENDING");
        n += len
            + pending
                .into_array()
                .first()
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
    }
    n
}

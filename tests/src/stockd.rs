//! stockd for tests, in the harness's one style: `spawn_*(&deps, |config| ..)` with a
//! tweak of the typed [`stockd::Config`]. [`spawn_stockd`] runs it in-process on port 0
//! against the test's Redis Cluster and database; [`spawn_stockd_process`] runs the built
//! binary as a child process (for kill tests). [`create_published_activity`] creates and
//! publishes an activity in one call, for every team's tests.

use std::time::Duration;

use seckill_daemon::shutdown::{Shutdown, Trigger};
use seckill_proto::auth::AttachToken;
use seckill_proto::pb;
use seckill_proto::pb::admin_service_client::AdminServiceClient;
use seckill_proto::pb::stock_service_client::StockServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::process::{free_port, workspace_bin, ChildGuard};
use crate::{Deps, SERVICE_TOKEN};

/// A StockService client that sends the harness' service token.
pub type StockClient = StockServiceClient<InterceptedService<Channel, AttachToken>>;
/// An AdminService client that sends the harness' service token.
pub type AdminClient = AdminServiceClient<InterceptedService<Channel, AttachToken>>;

/// A StockService client for a stockd at `addr`, with the service token.
pub async fn stock_client(addr: &str) -> StockClient {
    let token = AttachToken::new(SERVICE_TOKEN).expect("token");
    StockServiceClient::with_interceptor(crate::grpc::channel(addr).await, token)
}

/// An AdminService client for a stockd at `addr`, with the service token.
pub async fn admin_client(addr: &str) -> AdminClient {
    let token = AttachToken::new(SERVICE_TOKEN).expect("token");
    AdminServiceClient::with_interceptor(crate::grpc::channel(addr).await, token)
}

/// The config [`spawn_stockd`] starts from, before the tweak.
pub fn stockd_config(deps: &Deps<'_>) -> stockd::Config {
    stockd::Config::for_test(deps.redis.nodes(), deps.db.url(), SERVICE_TOKEN)
}

/// stockd running in this process. Stops (shutdown signal) when dropped.
pub struct StockdHandle {
    /// `127.0.0.1:port` of the gRPC server.
    pub addr: String,
    /// `127.0.0.1:port` of `/metrics`.
    pub admin_addr: String,
    /// The daemon's metrics.
    pub metrics: stockd::Metrics,
    trigger: Trigger,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl std::fmt::Debug for StockdHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockdHandle")
            .field("addr", &self.addr)
            .finish()
    }
}

impl StockdHandle {
    /// A StockService client with the service token attached.
    pub async fn stock_client(&self) -> StockClient {
        stock_client(&self.addr).await
    }

    /// An AdminService client with the service token attached.
    pub async fn admin_client(&self) -> AdminClient {
        admin_client(&self.addr).await
    }

    /// Fires the shutdown signal and waits for `run` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.trigger.fire();
        match self.task.take() {
            Some(t) => t.await?,
            None => Ok(()),
        }
    }
}

impl Drop for StockdHandle {
    fn drop(&mut self) {
        self.trigger.fire();
    }
}

/// stockd in-process on port 0 with [`stockd_config`] + `tweak`; returns once it is
/// ready (health SERVING: activities loaded).
pub async fn spawn_stockd(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut stockd::Config),
) -> StockdHandle {
    let mut config = stockd_config(deps);
    tweak(&mut config);
    start_in_process(config, true).await
}

/// [`spawn_stockd`] that returns at once, ready or not: for a test of what a stockd
/// answers while it starts (its start-up check still running).
pub async fn spawn_stockd_starting(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut stockd::Config),
) -> StockdHandle {
    let mut config = stockd_config(deps);
    tweak(&mut config);
    start_in_process(config, false).await
}

async fn start_in_process(config: stockd::Config, wait_ready: bool) -> StockdHandle {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind grpc");
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind admin");
    let addr = grpc.local_addr().expect("addr").to_string();
    let admin_addr = admin.local_addr().expect("addr").to_string();
    let (trigger, shutdown) = Shutdown::new();
    let metrics = stockd::Metrics::new();
    let task = tokio::spawn(stockd::run_with_metrics(
        config,
        grpc,
        Some(admin),
        shutdown,
        metrics.clone(),
    ));
    if wait_ready {
        wait_serving(&addr).await;
    }
    StockdHandle {
        addr,
        admin_addr,
        metrics,
        trigger,
        task: Some(task),
    }
}

async fn wait_serving(addr: &str) {
    use tonic_health::pb::health_check_response::ServingStatus;
    crate::process::wait_until_async("stockd SERVING", Duration::from_secs(20), || async {
        crate::grpc::health(addr, "seckill.v1.StockService").await == ServingStatus::Serving
    })
    .await;
}

/// Until a child process listens on `port` (`what` names it if it never does).
pub(crate) async fn wait_listening(what: &str, port: u16) {
    crate::process::wait_until_async(
        &format!("{what} listening on {port}"),
        Duration::from_secs(20),
        || async move { crate::process::port_open(port) },
    )
    .await;
}

/// Creates an activity with `items` as (stock, sale price in cents) over `shards`
/// shards (0 = default 8), its window starting `start_in` from now (zero: already
/// open, started a second ago) and lasting `length`, and publishes it now.
pub async fn create_published_activity(
    h: &StockdHandle,
    items: &[(u32, i64)],
    shards: u32,
    start_in: Duration,
    length: Duration,
) -> pb::Activity {
    let mut admin = h.admin_client().await;
    create_published_activity_with(&mut admin, items, shards, start_in, length).await
}

/// [`create_published_activity`] through any admin client (for example one to a
/// child-process stockd).
pub async fn create_published_activity_with(
    admin: &mut AdminClient,
    items: &[(u32, i64)],
    shards: u32,
    start_in: Duration,
    length: Duration,
) -> pb::Activity {
    create_published_activity_limited(admin, items, shards, start_in, length, 1).await
}

/// `n` live activities (open now, for `length`), each one item of `stock` units over
/// `shards` shards, created 8 at a time: `(activity, item)` ids, in no particular order.
pub async fn create_live_activities(
    admin: &AdminClient,
    n: usize,
    stock: u32,
    shards: u32,
    length: Duration,
) -> Vec<(u64, u64)> {
    use futures::StreamExt;
    futures::stream::iter(0..n)
        .map(|_| {
            let mut admin = admin.clone();
            async move {
                let a = create_published_activity_with(
                    &mut admin,
                    &[(stock, 100)],
                    shards,
                    Duration::ZERO,
                    length,
                )
                .await;
                (a.id, a.items[0].id)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// [`create_published_activity_with`] where one user may hold up to `per_user_limit`
/// units of an item (multi-unit reservations).
pub async fn create_published_activity_limited(
    admin: &mut AdminClient,
    items: &[(u32, i64)],
    shards: u32,
    start_in: Duration,
    length: Duration,
    per_user_limit: u32,
) -> pb::Activity {
    let req = sale_request(items, shards, start_in, length, per_user_limit);
    create_and_publish(admin, req).await
}

/// The CreateActivity request of the `create_published_activity*` helpers: `items` as
/// (stock, sale price in cents) over `shards` shards (0 = default 8), its window
/// starting `start_in` from now (zero: already open, started a second ago) and lasting
/// `length`; on the default Redis Cluster, with no challenge.
pub fn sale_request(
    items: &[(u32, i64)],
    shards: u32,
    start_in: Duration,
    length: Duration,
    per_user_limit: u32,
) -> pb::CreateActivityRequest {
    let now = seckill_lua::clock::now_ms();
    let start = if start_in.is_zero() {
        now - 1000
    } else {
        now + start_in.as_millis() as i64
    };
    pb::CreateActivityRequest {
        title: "test sale".into(),
        start_at_ms: start,
        end_at_ms: start + length.as_millis().max(1) as i64,
        shard_count: if shards == 0 {
            seckill_lua::DEFAULT_SHARDS
        } else {
            shards
        },
        per_user_limit,
        challenge_bits: 0,
        redis_cluster: String::new(),
        items: items
            .iter()
            .enumerate()
            .map(|(k, (stock, price))| pb::ItemSpec {
                title: format!("item {k}"),
                price_cents: price * 2,
                sale_price_cents: *price,
                stock: *stock,
            })
            .collect(),
    }
}

/// Creates the activity `req` describes and publishes it now.
pub async fn create_and_publish(
    admin: &mut AdminClient,
    req: pb::CreateActivityRequest,
) -> pb::Activity {
    let created = admin
        .create_activity(req)
        .await
        .expect("create activity")
        .into_inner();
    admin
        .publish_activity(pb::PublishActivityRequest {
            activity_id: created.id,
            publish_at_ms: 0,
        })
        .await
        .expect("publish activity")
        .into_inner()
        .activity
        .expect("activity")
}

/// stockd as a child process (the built `stockd` binary), for kill tests.
#[derive(Debug)]
pub struct StockdProcess {
    /// `127.0.0.1:port` of the gRPC server.
    pub addr: String,
    pub admin_addr: String,
    pub child: ChildGuard,
    /// Config file and log (`stockd.log`) live here.
    pub dir: tempfile::TempDir,
}

impl StockdProcess {
    pub async fn stock_client(&self) -> StockClient {
        stock_client(&self.addr).await
    }

    pub async fn admin_client(&self) -> AdminClient {
        admin_client(&self.addr).await
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Kills the process (if it runs) and starts it again with the same config file, on
    /// the same ports, as a service manager would; waits until it serves.
    pub async fn restart(&mut self) {
        self.child.kill();
        let mut cmd = std::process::Command::new(workspace_bin("stockd"));
        cmd.arg("-c").arg(self.dir.path().join("stockd.toml"));
        self.child = ChildGuard::spawn("stockd", cmd, &self.dir.path().join("stockd.log"))
            .expect("respawn stockd");
        wait_serving(&self.addr).await;
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stockd.log")).unwrap_or_default()
    }
}

/// Runs `stockd -c <generated config>` on free ports with `tweak` applied to the
/// process's config, and waits until it is ready. Needs `cargo build -p stockd --bins`.
///
/// With `[grpc.tls]` in the tweak it waits only until the port listens (the harness'
/// plaintext client cannot check health there): the test waits with its own TLS client.
///
/// The process's config is the shipped defaults (not [`stockd_config`]'s fast test
/// timeouts) with fast background loops: a child process is a production-like stockd.
pub async fn spawn_stockd_process(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut stockd::Config),
) -> StockdProcess {
    start_process(deps, tweak, true).await
}

/// [`spawn_stockd_process`] that returns once the process listens, ready or not: for a
/// test of what the rest of the fleet does with a stockd whose health is still
/// NOT_SERVING (its activities not all available yet).
pub async fn spawn_stockd_process_listening(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut stockd::Config),
) -> StockdProcess {
    start_process(deps, tweak, false).await
}

async fn start_process(
    deps: &Deps<'_>,
    tweak: impl FnOnce(&mut stockd::Config),
    wait_ready: bool,
) -> StockdProcess {
    let dir = tempfile::Builder::new()
        .prefix("seckill-stockd-")
        .tempdir()
        .expect("tempdir");
    let (grpc_port, admin_port) = (free_port(None), free_port(None));
    let nodes = deps
        .redis
        .nodes()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let base = format!(
        "[grpc]\nlisten = \"127.0.0.1:{grpc_port}\"\nservice_token = \"{SERVICE_TOKEN}\"\n\
         drain_ms = 2000\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\
         [redis]\nnodes = [{nodes}]\nreplica_acks = 0\n[mysql]\nurl = \"{}\"\n\
         [stock]\nfence_check_ms = 200\nschedule_poll_ms = 200\n",
        deps.db.url()
    );
    let mut config = stockd::Config::load_str(&base, "stockd.toml", []).expect("base config");
    tweak(&mut config);
    config.grpc.listen = format!("127.0.0.1:{grpc_port}");
    config.admin.listen = Some(format!("127.0.0.1:{admin_port}"));
    let tls = config.grpc.tls.is_some();
    let config = config.to_toml();
    let path = dir.path().join("stockd.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = std::process::Command::new(workspace_bin("stockd"));
    cmd.arg("-c").arg(&path);
    let child =
        ChildGuard::spawn("stockd", cmd, &dir.path().join("stockd.log")).expect("spawn stockd");
    let addr = format!("127.0.0.1:{grpc_port}");
    if tls || !wait_ready {
        wait_listening("stockd", grpc_port).await;
    } else {
        wait_serving(&addr).await;
    }
    StockdProcess {
        addr,
        admin_addr: format!("127.0.0.1:{admin_port}"),
        child,
        dir,
    }
}

/// `config` with `toml` (TOML lines of `section`, e.g. `"worker_threads = 1"` for
/// `"grpc"`) merged in, as the file would have it: for knobs given as text (the bench's
/// `BENCH_STOCKD_GRPC`). Panics on lines that do not make a valid config.
pub fn merge_toml(config: &mut stockd::Config, section: &str, toml: &str) {
    let mut table: toml::Table = config.to_toml().parse().expect("config as TOML");
    let extra: toml::Table = format!("[{section}]\n{toml}\n")
        .parse()
        .unwrap_or_else(|e| panic!("[{section}] {toml:?}: {e}"));
    for (name, value) in extra {
        match (table.get_mut(&name), value) {
            (Some(toml::Value::Table(dst)), toml::Value::Table(src)) => dst.extend(src),
            (_, value) => {
                table.insert(name, value);
            }
        }
    }
    *config = stockd::Config::load_str(&table.to_string(), "merged.toml", [])
        .unwrap_or_else(|e| panic!("{e}"));
}

/// One Reserve call.
pub async fn reserve(
    c: &mut StockClient,
    activity: u64,
    item: u64,
    user: &str,
    request: &str,
) -> Result<pb::ReserveResponse, tonic::Status> {
    c.reserve(pb::ReserveRequest {
        activity_id: activity,
        item_id: item,
        user_id: user.into(),
        request_id: request.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// [`reserve`] as a client follows the contract: ABORTED ("could not gather the units
/// under contention; retry with the same request id", docs/stockd.md) is sent again
/// with the same request id, up to 5 times with a growing pause; any other answer is
/// returned. For tests where more buyers than units arrive at once.
pub async fn reserve_retrying_busy(
    c: &mut StockClient,
    activity: u64,
    item: u64,
    user: &str,
    request: &str,
) -> Result<pb::ReserveResponse, tonic::Status> {
    let mut tries = 0;
    loop {
        match reserve(c, activity, item, user, request).await {
            Err(e) if e.code() == tonic::Code::Aborted && tries < 5 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20 * tries)).await;
            }
            r => return r,
        }
    }
}

/// [`reserve`] across a failover: UNAVAILABLE (a shard being rebuilt, a master that
/// has no replica again yet) is sent again with the same request id every 100 ms, for up
/// to 20 s; any other answer is returned, and the last UNAVAILABLE after that.
pub async fn reserve_after_failover(
    c: &mut StockClient,
    activity: u64,
    item: u64,
    user: &str,
    request: &str,
) -> Result<pb::ReserveResponse, tonic::Status> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match reserve(c, activity, item, user, request).await {
            Err(e) if e.code() == tonic::Code::Unavailable && std::time::Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            r => return r,
        }
    }
}

/// The failover tests' stockd settings: every write waits for one replica, which is
/// given up on after 100 ms (a stalled replica shows at once), within a 1 s deadline.
pub fn replica_acked(c: &mut stockd::Config) {
    c.redis.replica_acks = 1;
    c.redis.replica_ack_timeout_ms = 100;
    c.redis.timeout_ms = 1000;
}

/// One entry of a `ReserveBatch` or `ReserveStream` message (no trace, no tag, no
/// timeout; `quantity` 0 means 1).
pub fn batch_entry(
    activity: u64,
    item: u64,
    user: &str,
    request: &str,
    quantity: u32,
) -> pb::ReserveBatchEntry {
    pb::ReserveBatchEntry {
        request: Some(pb::ReserveRequest {
            activity_id: activity,
            item_id: item,
            user_id: user.into(),
            request_id: request.into(),
            quantity,
        }),
        ..Default::default()
    }
}

/// `users` buyers (`user-0`...), each clicking twice: `(user, request id)` under the
/// request ids `<user>-a` in group `u % groups` and `<user>-b` in the next one, as a
/// double click that lands on two edges (or in two calls) does.
pub fn double_clicks(users: usize, groups: usize) -> Vec<Vec<(String, String)>> {
    let mut out = vec![Vec::new(); groups];
    for u in 0..users {
        let user = format!("user-{u}");
        out[u % groups].push((user.clone(), format!("{user}-a")));
        out[(u + 1) % groups].push((user.clone(), format!("{user}-b")));
    }
    out
}

/// An entry's response; when stockd answered the entry ABORTED (contention at the
/// sell-out: a buyer out of rebalancing attempts while units remain, "retry with the
/// same request id"), the answer of the same request sent again, as the edge's 429 busy
/// asks its client to. Any other failure fails the test.
pub async fn entry_response(
    c: &StockClient,
    activity: u64,
    item: u64,
    (user, request): (&str, &str),
    r: pb::ReserveResult,
) -> pb::ReserveResponse {
    if r.code == tonic::Code::Aborted as i32 {
        let mut c = c.clone();
        return reserve_retrying_busy(&mut c, activity, item, user, request)
            .await
            .expect("the retry is answered");
    }
    entry_outcome(&r);
    r.response.expect("a response with code 0")
}

/// The outcome of an entry's result, which must have succeeded (code 0).
pub fn entry_outcome(r: &pb::ReserveResult) -> pb::ReserveOutcome {
    assert_eq!(r.code, 0, "entry failed: {} {}", r.code, r.message);
    r.response
        .as_ref()
        .expect("a response with code 0")
        .outcome()
}

/// Units per shard of an item, read straight from Redis (a missing key is 0).
pub async fn shard_stock(
    redis: &fred::clients::Client,
    activity: u64,
    item: u64,
    shards: u32,
) -> Vec<i64> {
    use fred::interfaces::KeysInterface;
    let mut out = Vec::new();
    for i in 0..shards {
        let n: Option<i64> = redis
            .get(seckill_lua::keys::stock(activity, i, item))
            .await
            .expect("GET stock");
        out.push(n.unwrap_or(0));
    }
    out
}

/// Sets every shard's stock of `item` straight in Redis, shard `i` to `units[i]` (the
/// state a test starts from, e.g. the end of a sale).
pub async fn set_shard_stock(
    redis: &fred::clients::Client,
    activity: u64,
    item: u64,
    units: &[i64],
) {
    use fred::interfaces::KeysInterface;
    for (i, n) in (0u32..).zip(units) {
        let _: () = redis
            .set(
                seckill_lua::keys::stock(activity, i, item),
                *n,
                None,
                None,
                false,
            )
            .await
            .expect("SET stock");
    }
}

/// Sets an item's sold-out flag (`sk:{a}:soldout:<s>`) as a sell-out would, without its
/// message.
pub async fn set_sold_out_flag(redis: &fred::clients::Client, activity: u64, item: u64) {
    use fred::interfaces::KeysInterface;
    let _: () = redis
        .set(
            seckill_lua::keys::sold_out(activity, item),
            "1",
            None,
            None,
            false,
        )
        .await
        .expect("SET sold-out flag");
}

/// A rebalancing take as stockd makes it, checked against `epoch` and `seq`, under a
/// fresh move id with a minute's life in transit.
pub fn take_call(
    (activity, donor, item): (u64, u32, u64),
    units: u32,
    epoch: &str,
    seq: u64,
) -> seckill_lua::calls::TakeCall {
    let id = format!("t{:x}", rand::random::<u32>());
    let at = seckill_lua::calls::TakeAt {
        epoch,
        seq,
        id: &id,
        lifetime_ms: 60_000,
    };
    seckill_lua::calls::TakeCall::new(activity, donor, item, units, at)
}

/// A rebalancing take of `units` of item `item` from shard `donor` under move `id`, as
/// another stockd runs it (`take.lua`, no epoch check): the units are on no shard, in
/// transit for `lifetime_ms`, until [`settle_by_hand`]. Answers the units taken.
pub async fn take_in_transit(
    redis: &fred::clients::Client,
    (activity, donor, item): (u64, u32, u64),
    units: u32,
    id: &str,
    lifetime_ms: u64,
) -> i64 {
    use seckill_lua::calls::{TakeAt, TakeCall};
    let at = TakeAt {
        epoch: "",
        seq: 0,
        id,
        lifetime_ms,
    };
    let took = crate::redis::call(redis, TakeCall::new(activity, donor, item, units, at))
        .await
        .into_array();
    took[0].as_i64().expect("take answers a count")
}

/// Settles move `id`'s `units` in transit as its mover does after the give: the change
/// count of the item first, then the record on the donor shard.
pub async fn settle_by_hand(
    redis: &fred::clients::Client,
    (activity, donor, item): (u64, u32, u64),
    id: &str,
    units: i64,
) {
    use fred::interfaces::{KeysInterface, SortedSetsInterface};
    let _: i64 = redis
        .incr(seckill_lua::keys::changes(activity, item))
        .await
        .expect("INCR changes");
    let _: i64 = redis
        .zrem(
            seckill_lua::keys::transit(activity, donor, item),
            seckill_lua::calls::transit_record(id, units),
        )
        .await
        .expect("ZREM transit");
}

/// Rebalancing takes (`TAKE` Lua calls) stockd `h` has made.
pub fn takes(h: &StockdHandle) -> u64 {
    h.metrics
        .lua_seconds
        .with_label_values(&["take"])
        .get_sample_count()
}

/// Shard `i`'s look at item `s` (`look.lua`): (units, live records of units in transit,
/// their units).
pub async fn look_at(redis: &fred::clients::Client, a: u64, i: u32, s: u64) -> (i64, i64, i64) {
    let reply = crate::redis::call(redis, seckill_lua::calls::LookCall::new(a, i, s))
        .await
        .into_array();
    let n = |k: usize| reply[k].as_i64().unwrap();
    (n(0), n(1), n(2))
}

/// Whether the sold-out flag of `(activity, item)` is set.
pub async fn sold_out_flagged(redis: &fred::clients::Client, activity: u64, item: u64) -> bool {
    use fred::interfaces::KeysInterface;
    let n: i64 = redis
        .exists(seckill_lua::keys::sold_out(activity, item))
        .await
        .expect("EXISTS sold-out flag");
    n == 1
}

/// Entries in an activity's shard streams (reservations not yet taken by orderd), all
/// `shards` together, read straight from Redis.
pub async fn stream_len(redis: &fred::clients::Client, activity: u64, shards: u32) -> i64 {
    use fred::interfaces::StreamsInterface;
    let mut n = 0;
    for i in 0..shards {
        n += redis
            .xlen::<i64, _>(seckill_lua::keys::orders_stream(activity, i))
            .await
            .expect("XLEN");
    }
    n
}

/// What orderd does with a reservation, by hand: an order row and MySQL stock − 1.
pub async fn make_order(db: &crate::TestDb, a: u64, s: u64, user: &str, req: &str, rid: &str) {
    let shard = rid.parse::<seckill_lua::ReservationId>().unwrap().shard;
    sqlx::query(
        "INSERT INTO orders (id, activity_id, item_id, user_id, request_id, shard, amount_cents, \
         status, reserved_at) VALUES (?, ?, ?, ?, ?, ?, 100, 'PENDING', NOW(3))",
    )
    .bind(rid)
    .bind(a)
    .bind(s)
    .bind(user)
    .bind(req)
    .bind(shard)
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE activity_items SET stock = stock - 1 WHERE id = ? AND stock >= 1")
        .bind(s)
        .execute(db.pool())
        .await
        .unwrap();
}

/// GetStock, `None` when it fails.
/// Waits up to `within` until GetStock says item `s` of activity `a` is available.
pub async fn until_available(c: &StockClient, a: u64, s: u64, within: Duration) {
    crate::process::wait_until_async("the activity available", within, || {
        let mut c = c.clone();
        async move {
            stock_status(&mut c, a, s)
                .await
                .is_some_and(|st| st.available)
        }
    })
    .await;
}

pub async fn stock_status(c: &mut StockClient, a: u64, s: u64) -> Option<pb::GetStockResponse> {
    c.get_stock(pb::GetStockRequest {
        activity_id: a,
        item_id: s,
    })
    .await
    .ok()
    .map(|r| r.into_inner())
}

/// Every call at once; answers that are not UNAVAILABLE or ABORTED (retry), by user.
pub async fn crowd(
    c: &StockClient,
    a: u64,
    s: u64,
    calls: Vec<(String, String)>,
) -> Vec<(String, pb::ReserveResponse)> {
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|(user, req)| {
            let mut c = c.clone();
            tokio::spawn(async move { (user.clone(), reserve(&mut c, a, s, &user, &req).await) })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let (user, r) = t.await.unwrap();
        match r {
            Ok(r) => out.push((user, r)),
            Err(e) => assert!(
                matches!(e.code(), tonic::Code::Unavailable | tonic::Code::Aborted),
                "{e:?}"
            ),
        }
    }
    out
}

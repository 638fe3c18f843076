//! The crowd's HTTP side: "doors" (one client per source address, or one client with an
//! `X-Forwarded-For` per buyer), one call = one [`Answer`], and the edge's activity view.
//!
//! Source addresses: with `--source bind` each door is a client bound to its own loopback
//! address (`127.1.x.y` for buyers, `127.66.0.k` for abusive IPs; Linux routes all of
//! 127/8 to `lo`), so the gateway sees real distinct peers and needs no proxy config.
//! With `--source xff` every request comes from 127.0.0.1 and names a client address in
//! `X-Forwarded-For` (10.1.x.y, abusers 203.0.113.k), which the gateway honours only when
//! 127.0.0.1 is in its trusted-proxy list.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpSocket;

use crate::stats::Kind;

/// Longest wait for a connection to the edge.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one answer, the connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// An idle connection is closed after this long: buyers who come back later (the opening
/// after the logins) come on new connections, as a browser's would.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the crowd presents distinct client addresses to the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// Bind each door's sockets to its own 127.x.y.z address.
    Bind,
    /// Send `X-Forwarded-For` from 127.0.0.1 (needs the gateway to trust 127.0.0.1).
    Xff,
    /// Everything from 127.0.0.1, no header (per-IP limits then apply to the whole crowd).
    None,
}

/// One client address of the crowd: a pool of keep-alive connections to the edge (its
/// own with `--source bind`, one shared by every door otherwise) and, with
/// `--source xff`, the address it names.
#[derive(Debug, Clone)]
pub struct Door {
    pool: Arc<Pool>,
    xff: Option<HeaderValue>,
}

/// The keep-alive HTTP/1.1 connections of one client address to the edge, on hyper's
/// connection API: a request takes an idle connection or opens one, and gives it back
/// when its answer is read. Why not reqwest (the crowd's client until 2026-11-29): at the
/// opening the crowd held about 40 % of the two cores, and reqwest's per-request work
/// (URL parsing with IDNA, the tower stack, the keyed pool) was a good part of it; the
/// requests on the wire (less reqwest's default `accept: */*`), their connections and
/// their reuse are the same.
struct Pool {
    edge: SocketAddr,
    host: HeaderValue,
    bind: Option<IpAddr>,
    max_idle: usize,
    idle_timeout: Duration,
    idle: Mutex<Vec<(Instant, SendRequest<Full<Bytes>>)>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("edge", &self.edge)
            .field("bind", &self.bind)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// An idle connection that is still open, else a new one.
    async fn checkout(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        loop {
            let candidate = {
                let mut idle = self.idle.lock().expect("pool lock");
                self.prune(&mut idle);
                idle.pop()
            };
            let Some((_, mut s)) = candidate else {
                return self.connect().await;
            };
            if s.ready().await.is_ok() {
                return Ok(s);
            }
        }
    }

    fn checkin(&self, s: SendRequest<Full<Bytes>>) {
        if s.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("pool lock");
        if idle.len() < self.max_idle {
            idle.push((Instant::now(), s));
        }
    }

    /// Closes the connections idle past the idle timeout.
    fn sweep(&self) {
        self.prune(&mut self.idle.lock().expect("pool lock"));
    }

    /// Drops the idle connections that are closed or idle past the idle timeout.
    fn prune(&self, idle: &mut Vec<(Instant, SendRequest<Full<Bytes>>)>) {
        let now = Instant::now();
        idle.retain(|(since, s)| now.duration_since(*since) < self.idle_timeout && !s.is_closed());
    }

    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let socket = match self.edge {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .context("socket")?;
        if let Some(ip) = self.bind {
            socket
                .bind(SocketAddr::new(ip, 0))
                .with_context(|| format!("binding {ip}"))?;
        }
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(self.edge))
            .await
            .context("connect timed out")?
            .with_context(|| format!("connecting to {}", self.edge))?;
        tcp.set_nodelay(true).context("TCP_NODELAY")?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }
}

/// Closes every pool's expired idle connections once a second while a pool lives (what
/// reqwest's pool did with its idle timeout): bounds the crowd's open files.
fn sweep_forever(pools: Vec<Weak<Pool>>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut alive = false;
            for p in pools.iter().filter_map(Weak::upgrade) {
                alive = true;
                p.sweep();
            }
            if !alive {
                return;
            }
        }
    });
}

/// The address of buyer door `i` (`abusive` for the abusive IPs).
pub fn door_addr(source: Source, i: u32, abusive: bool) -> IpAddr {
    let (hi, lo) = ((i / 250) as u8, (1 + i % 250) as u8);
    match (source, abusive) {
        (Source::Bind, false) => IpAddr::V4(Ipv4Addr::new(127, 1, hi, lo)),
        (Source::Bind, true) => IpAddr::V4(Ipv4Addr::new(127, 66, hi, lo)),
        (Source::Xff, false) => IpAddr::V4(Ipv4Addr::new(10, 1, hi, lo)),
        (Source::Xff, true) => IpAddr::V4(Ipv4Addr::new(203, 0, 113, lo)),
        (Source::None, _) => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

/// The edge's address and `Host` header from its base URL (`http://host:port`).
fn edge_of(gateway: &str) -> anyhow::Result<(SocketAddr, HeaderValue)> {
    let uri: Uri = gateway
        .parse()
        .with_context(|| format!("--gateway {gateway:?}: not a URL"))?;
    if uri.scheme_str() != Some("http") {
        bail!("--gateway {gateway:?}: only http:// is supported");
    }
    let authority = uri
        .authority()
        .with_context(|| format!("--gateway {gateway:?}: no host"))?;
    let port = authority.port_u16().unwrap_or(80);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let edge = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .with_context(|| format!("--gateway {gateway:?}: cannot resolve {host}"))?
        .next()
        .with_context(|| format!("--gateway {gateway:?}: {host} has no address"))?;
    let host = HeaderValue::from_str(authority.as_str()).context("--gateway: host")?;
    Ok((edge, host))
}

/// `n` doors for buyers or abusers of the edge at `gateway`. Xff/None doors share one
/// pool of `pool` idle connections; a bound door keeps up to 4 of its own.
pub fn doors(
    gateway: &str,
    source: Source,
    n: u32,
    abusive: bool,
    pool: usize,
) -> anyhow::Result<Vec<Door>> {
    doors_idle(gateway, source, n, abusive, pool, IDLE_TIMEOUT)
}

fn doors_idle(
    gateway: &str,
    source: Source,
    n: u32,
    abusive: bool,
    pool: usize,
    idle_timeout: Duration,
) -> anyhow::Result<Vec<Door>> {
    let (edge, host) = edge_of(gateway)?;
    let new_pool = |bind: Option<IpAddr>, max_idle: usize| {
        Arc::new(Pool {
            edge,
            host: host.clone(),
            bind,
            max_idle,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        })
    };
    let shared = new_pool(None, pool);
    let doors: Vec<Door> = (0..n.max(1))
        .map(|i| {
            let addr = door_addr(source, i, abusive);
            match source {
                Source::Bind => Door {
                    pool: new_pool(Some(addr), 4),
                    xff: None,
                },
                Source::Xff => Door {
                    pool: shared.clone(),
                    xff: Some(
                        HeaderValue::from_str(&addr.to_string()).expect("an IP is a header value"),
                    ),
                },
                Source::None => Door {
                    pool: shared.clone(),
                    xff: None,
                },
            }
        })
        .collect();
    let mut pools: Vec<Weak<Pool>> = doors.iter().map(|d| Arc::downgrade(&d.pool)).collect();
    pools.dedup_by(|a, b| a.ptr_eq(b));
    sweep_forever(pools);
    Ok(doors)
}

/// The soft limit on open files of this process (`/proc/self/limits`), if known.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files(&text)
}

fn parse_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// How many buyer doors fit under the open-files limit next to `concurrency` requests
/// in flight: each door may hold a few idle connections.
pub fn doors_that_fit(wanted: u32, concurrency: usize, limit: Option<u64>) -> u32 {
    match limit {
        Some(l) => {
            let spare = l.saturating_sub(concurrency as u64 + 256) / 2;
            wanted.min(spare.max(1) as u32)
        }
        None => wanted,
    }
}

/// One HTTP answer, already classified.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: Option<u16>,
    pub body: Value,
    /// `Retry-After`, seconds.
    pub retry_after: Option<u64>,
    pub latency: Duration,
    /// The transport error, when there was no status.
    pub error: Option<String>,
}

impl Answer {
    pub fn code(&self) -> Option<&str> {
        self.body.get("error")?.get("code")?.as_str()
    }

    pub fn kind(&self) -> Kind {
        Kind::classify(self.status, self.code())
    }

    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.body.get(name)?.as_str()
    }
}

impl Door {
    /// One request; never fails: transport errors become an answer without status.
    /// `url` is the edge's base URL followed by the path (only the path and query are
    /// used: every door talks to the edge its pool was made for).
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let t0 = Instant::now();
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, self.send(method, url, bearer, body))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}")));
        match sent {
            Ok((status, retry_after, body)) => Answer {
                status: Some(status),
                body,
                retry_after,
                latency: t0.elapsed(),
                error: None,
            },
            Err(e) => Answer {
                status: None,
                body: Value::Null,
                retry_after: None,
                latency: t0.elapsed(),
                error: Some(format!("{e:#}")),
            },
        }
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        bearer: Option<&str>,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Option<u64>, Value)> {
        let uri: Uri = url.parse().with_context(|| format!("{url:?}: not a URL"))?;
        let path = uri
            .path_and_query()
            .cloned()
            .map_or_else(|| Uri::from_static("/"), Uri::from);
        let body = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).context("request body")?),
            None => Bytes::new(),
        };
        let bearer = bearer
            .map(|t| HeaderValue::from_str(&format!("Bearer {t}")))
            .transpose()
            .context("bearer token")?;
        let request = || {
            let mut r = Request::builder()
                .method(method.clone())
                .uri(path.clone())
                .header(HOST, self.pool.host.clone());
            if let Some(x) = &self.xff {
                r = r.header("x-forwarded-for", x.clone());
            }
            if let Some(b) = &bearer {
                r = r.header(AUTHORIZATION, b.clone());
            }
            if !body.is_empty() {
                r = r.header(CONTENT_TYPE, "application/json");
            }
            r.body(Full::new(body.clone()))
                .context("building the request")
        };
        // A pooled connection the edge closed just as the request went out fails the
        // request before any of it was written: send it again on a new connection
        // (hyper-util's pool does the same).
        let mut s = self.pool.checkout().await?;
        let resp = match s.send_request(request()?).await {
            Err(e) if e.is_canceled() => {
                s = self.pool.connect().await?;
                s.send_request(request()?).await?
            }
            r => r?,
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        // An answer whose body breaks off keeps its status (and its connection is gone).
        let body = match resp.into_body().collect().await {
            Ok(b) => {
                self.pool.checkin(s);
                serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null)
            }
            Err(_) => Value::Null,
        };
        Ok((status, retry_after, body))
    }
}

/// An item as the edge shows it.
#[derive(Debug, Clone)]
pub struct EdgeItem {
    pub id: u64,
    pub stock: u64,
}

/// The activity the crowd buys from, as the edge shows it.
#[derive(Debug, Clone)]
pub struct EdgeActivity {
    pub id: u64,
    pub title: String,
    pub start_at_ms: i64,
    pub items: Vec<EdgeItem>,
    /// Server clock minus local clock, ms (from `server_time_ms`).
    pub skew_ms: i64,
}

pub fn now_ms() -> i64 {
    seckill_lua::clock::now_ms()
}

fn parse_activity(v: &Value) -> anyhow::Result<EdgeActivity> {
    let items = v["items"]
        .as_array()
        .context("activity without items")?
        .iter()
        .map(|i| {
            Ok(EdgeItem {
                id: i["id"].as_u64().context("item id")?,
                stock: i["stock"].as_u64().unwrap_or(0),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(EdgeActivity {
        id: v["id"].as_u64().context("activity id")?,
        title: v["title"].as_str().unwrap_or("").to_owned(),
        start_at_ms: v["start_at_ms"].as_i64().context("start_at_ms")?,
        items,
        skew_ms: 0,
    })
}

/// Finds the activity to buy from: `id`, or the open one, or the next upcoming one.
pub async fn discover(door: &Door, base: &str, id: Option<u64>) -> anyhow::Result<EdgeActivity> {
    let before = now_ms();
    let a = door
        .call(
            Method::GET,
            &format!("{base}/api/v1/activities"),
            None,
            None,
        )
        .await;
    let after = now_ms();
    if a.status != Some(200) {
        bail!(
            "GET {base}/api/v1/activities answered {:?} {}",
            a.status,
            a.error.as_deref().unwrap_or(&a.body.to_string())
        );
    }
    let server = a.body["server_time_ms"]
        .as_i64()
        .context("no server_time_ms")?;
    let list = a.body["activities"]
        .as_array()
        .context("no activities array")?;
    let mut candidates: Vec<&Value> = list
        .iter()
        .filter(|v| id.is_none_or(|id| v["id"].as_u64() == Some(id)))
        .filter(|v| id.is_some() || v["state"].as_str() != Some("ended"))
        .collect();
    // Open first, then the soonest upcoming.
    candidates.sort_by_key(|v| {
        (
            v["state"].as_str() != Some("open"),
            v["start_at_ms"].as_i64().unwrap_or(i64::MAX),
        )
    });
    let Some(v) = candidates.first() else {
        match id {
            Some(id) => bail!("activity {id} is not among the edge's current activities"),
            None => bail!("the edge has no open or upcoming activity"),
        }
    };
    let mut act = parse_activity(v)?;
    act.skew_ms = server - (before + after) / 2;
    Ok(act)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn door_addresses_are_distinct_and_never_the_gateways_own() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..5_000 {
            let a = door_addr(Source::Bind, i, false);
            assert!(a.is_loopback());
            assert_ne!(a, IpAddr::V4(Ipv4Addr::LOCALHOST));
            assert!(seen.insert(a), "{a} twice");
        }
        assert!(!seen.contains(&door_addr(Source::Bind, 0, true)));
        assert_eq!(door_addr(Source::Xff, 0, true).to_string(), "203.0.113.1");
    }

    #[test]
    fn the_number_of_doors_stays_under_the_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_open_files(limits), Some(1024));
        assert_eq!(doors_that_fit(1_000, 256, Some(1024)), 256);
        assert_eq!(doors_that_fit(1_000, 256, Some(1_000_000)), 1_000);
        assert_eq!(doors_that_fit(1_000, 256, None), 1_000);
        assert_eq!(doors_that_fit(1_000, 4_000, Some(1024)), 1);
    }

    #[test]
    fn the_open_activity_is_parsed_with_its_items() {
        let v: Value = serde_json::json!({"id": 3, "title": "T", "start_at_ms": 10, "end_at_ms": 20,
            "state": "open", "items": [{"id": 7, "title": "Phone", "price_cents": 1,
            "sale_price_cents": 1, "stock": 300, "sold_out": false}]});
        let a = parse_activity(&v).unwrap();
        assert_eq!(a.id, 3);
        assert_eq!(a.items[0].id, 7);
        assert_eq!(a.items[0].stock, 300);
    }

    /// A real HTTP/1.1 server on a free port: answers every request with a JSON of what
    /// it saw (peer, headers, body, the request's number on its connection); `close_after`
    /// drops a connection that long after each answer without saying so (an edge's idle
    /// timeout); `/slow` answers 429 with `Retry-After: 7`.
    async fn server(close_after: Option<Duration>) -> SocketAddr {
        use hyper::service::service_fn;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let n = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        async move {
                            let h = |k: &str| {
                                req.headers().get(k).map(|v| v.to_str().unwrap().to_owned())
                            };
                            let (slow, path) = (req.uri().path() == "/slow", req.uri().to_string());
                            let (auth, xff, host) =
                                (h("authorization"), h("x-forwarded-for"), h("host"));
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let v = serde_json::json!({
                                "peer": peer.to_string(), "n": n, "path": path, "auth": auth,
                                "xff": xff, "host": host,
                                "body": String::from_utf8_lossy(&body),
                            });
                            let mut r =
                                hyper::Response::builder().status(if slow { 429 } else { 200 });
                            if slow {
                                r = r.header("retry-after", "7");
                            }
                            Ok::<_, std::convert::Infallible>(
                                r.body(Full::new(Bytes::from(v.to_string()))).unwrap(),
                            )
                        }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc);
                    match close_after {
                        None => {
                            let _ = conn.await;
                        }
                        Some(d) => {
                            let _ = tokio::time::timeout(d, conn).await;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_door_keeps_its_connection_and_its_address_and_sends_what_it_is_given() {
        let addr = server(None).await;
        let base = format!("http://{addr}");
        let door = doors(&base, Source::Bind, 8, false, 4).unwrap().remove(7);
        let body = serde_json::json!({"request_id": "r-1"});
        let a = door
            .call(
                Method::POST,
                &format!("{base}/api/x?y=1"),
                Some("jwt"),
                Some(&body),
            )
            .await;
        assert_eq!(a.status, Some(200), "{a:?}");
        let b = door
            .call(Method::GET, &format!("{base}/api/x"), None, None)
            .await;
        assert_eq!(b.status, Some(200), "{b:?}");
        assert!(a.latency > Duration::ZERO);
        let peer = a.str_field("peer").unwrap();
        assert!(
            peer.starts_with("127.1.0.8:"),
            "bound to its own address: {peer}"
        );
        assert_eq!(
            b.str_field("peer"),
            Some(peer),
            "the second request reuses the connection"
        );
        assert_eq!(b.body["n"], 2);
        assert_eq!(a.str_field("path"), Some("/api/x?y=1"));
        assert_eq!(a.str_field("auth"), Some("Bearer jwt"));
        assert_eq!(a.str_field("host"), Some(addr.to_string().as_str()));
        assert_eq!(a.str_field("xff"), None);
        assert_eq!(a.str_field("body"), Some(r#"{"request_id":"r-1"}"#));
        assert_eq!(b.str_field("auth"), None);
        assert_eq!(b.str_field("body"), Some(""));
    }

    #[tokio::test]
    async fn xff_doors_share_a_pool_and_name_their_address() {
        let addr = server(None).await;
        let base = format!("http://{addr}");
        let d = doors(&base, Source::Xff, 3, false, 16).unwrap();
        let a = d[2]
            .call(Method::GET, &format!("{base}/a"), None, None)
            .await;
        let b = d[0]
            .call(Method::GET, &format!("{base}/b"), None, None)
            .await;
        assert_eq!(a.str_field("xff"), Some("10.1.0.3"));
        assert_eq!(b.str_field("xff"), Some("10.1.0.1"));
        assert!(a.str_field("peer").unwrap().starts_with("127.0.0.1:"));
        assert_eq!(
            a.str_field("peer"),
            b.str_field("peer"),
            "one pool for every xff door"
        );
    }

    #[tokio::test]
    async fn retry_after_is_read_and_a_refused_connection_is_an_answer_without_status() {
        let addr = server(None).await;
        let base = format!("http://{addr}");
        let door = doors(&base, Source::None, 1, false, 4).unwrap().remove(0);
        let a = door
            .call(Method::POST, &format!("{base}/slow"), None, None)
            .await;
        assert_eq!((a.status, a.retry_after), (Some(429), Some(7)));
        // A port nobody listens on.
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let base = format!("http://{free}");
        let door = doors(&base, Source::None, 1, false, 4).unwrap().remove(0);
        let a = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        assert_eq!(a.status, None);
        assert!(a.error.as_deref().unwrap().contains("connecting"), "{a:?}");
        assert_eq!(a.kind(), Kind::classify(None, None));
    }

    #[tokio::test]
    async fn a_connection_the_edge_dropped_or_one_idle_too_long_is_replaced() {
        // The edge drops each connection 100 ms after its answer.
        let addr = server(Some(Duration::from_millis(100))).await;
        let base = format!("http://{addr}");
        let door = doors(&base, Source::None, 1, false, 4).unwrap().remove(0);
        let a = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let b = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        assert_eq!((a.status, b.status), (Some(200), Some(200)), "{b:?}");
        assert_ne!(a.str_field("peer"), b.str_field("peer"), "a new connection");
        assert_eq!(b.body["n"], 1);
        // The crowd's own idle timeout: a connection idle longer is not used again.
        let addr = server(None).await;
        let base = format!("http://{addr}");
        let door = doors_idle(&base, Source::None, 1, false, 4, Duration::from_millis(50))
            .unwrap()
            .remove(0);
        let a = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        let b = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        assert_eq!(
            a.str_field("peer"),
            b.str_field("peer"),
            "reused while fresh"
        );
        tokio::time::sleep(Duration::from_millis(120)).await;
        door.pool.sweep();
        assert!(door.pool.idle.lock().unwrap().is_empty(), "swept");
        let c = door
            .call(Method::GET, &format!("{base}/x"), None, None)
            .await;
        assert_ne!(
            a.str_field("peer"),
            c.str_field("peer"),
            "not reused once idle too long"
        );
    }

    #[test]
    fn the_edge_url_is_checked() {
        assert!(edge_of("http://127.0.0.1:8080").is_ok());
        assert_eq!(edge_of("http://127.0.0.1").unwrap().0.port(), 80);
        for bad in [
            "https://127.0.0.1:8080",
            "127.0.0.1:8080",
            "http://",
            "not a url",
        ] {
            assert!(edge_of(bad).is_err(), "{bad}");
        }
    }
}

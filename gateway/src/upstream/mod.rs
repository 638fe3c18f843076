//! A fleet behind the edge: every stockd and orderd endpoint of `[upstreams]`, its
//! health mark, and the choice of endpoint for each call with failover inside the
//! request's deadline.
//!
//! Parts: [`Fleet`] (one service's endpoints, their marks and the round-robin counter),
//! [`Attempts`] (the order one call tries them in), [`Fleet::call`] (one unary call with
//! failover), [`health`] (the loop per endpoint that sets the marks).
//!
//! Choice: round-robin over the endpoints marked healthy. A call takes the next value of
//! one atomic counter and walks the endpoints from there, skipping those marked down;
//! when every mark is down it tries them all anyway (marks may be stale: a check in
//! flight, an endpoint just restarted). No lock, no allocation: the endpoints a call has
//! tried are bits of a `u64`, hence at most [`MAX_ENDPOINTS`] per service.
//!
//! Failover: a call that fails with a transport error or `UNAVAILABLE` is tried on the
//! next endpoint while the deadline has time left; each endpoint at most once per call.
//! Any other code is the service's answer and goes back to the client as it is. Only a
//! transport failure (or a reservation stream that broke, [`crate::batch`]) marks the
//! endpoint down at once ([`marks_down`]); an `UNAVAILABLE` the server sent is about the
//! request, and whether a live server is well is the health loop's call.
//!
//! Why a second try is safe: a failed call may have been carried out before the
//! connection broke (stockd ran the Lua script, then was killed before answering).
//! - `Reserve` is idempotent by request id: the buyer record in the user's home shard
//!   keeps the request id beside the reservation id, so the same request on any stockd
//!   answers the reservation already made (`RETRY` in `reserve.lua`, RESERVED on the
//!   wire), never a second unit and never a `DUPLICATE` for the same request.
//! - `Pay`, `Cancel` and the payment callback are conditional updates in MySQL
//!   (`WHERE status = 'PENDING'`): a second try of an applied change answers `already`.
//! - `GetOrder`, `ListOrders` and opening `WatchOrder` only read.
//!
//! stockd also answers `UNAVAILABLE` while its Redis is down or a shard is being rebuilt;
//! then every peer answers the same, the call runs out of endpoints or time, and the
//! client gets 503 with `Retry-After` as with a single endpoint. Those answers mark no
//! endpoint down: they did, and one activity's rebuild (or its Redis cluster down, with
//! the activity on a cluster of its own) then marked every stockd down in turn and took
//! the edge out of `/readyz` for every other activity.

pub mod health;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntGauge};
use tonic::Code;

use crate::config::{Upstreams, MAX_ENDPOINTS};
use crate::metrics::Metrics;

pub use health::Health;

/// The tonic endpoint for `url`: plaintext for `http://`, TLS with `[upstreams.tls]`
/// (its roots, the gateway's client certificate when set, `domain`) for `https://`.
/// The calls ([`crate::forward`]) and the health checks ([`health`]) both dial through
/// it, so a check proves the same handshake the calls make.
pub fn dial(url: &str, u: &Upstreams) -> anyhow::Result<tonic::transport::Endpoint> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?;
    if !url.starts_with("https://") {
        return Ok(endpoint);
    }
    // Validation refuses an https:// URL without [upstreams.tls] or with files that
    // do not load; they are read again here (a file changed since is an error).
    let tls = u
        .tls
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{url}: https:// needs [upstreams.tls] ca_path"))?
        .load("upstreams.tls")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(endpoint.tls_config(tls)?)
}

/// One endpoint of a fleet.
pub struct Endpoint {
    /// The URL as configured (also the `endpoint` label of its metrics).
    pub url: String,
    healthy: AtomicBool,
    gauge: IntGauge,
}

/// The endpoints of one service, their health marks and the round-robin counter.
pub struct Fleet {
    service: &'static str,
    endpoints: Box<[Endpoint]>,
    next: AtomicUsize,
    failovers: IntCounter,
    /// Whole-call latency as the edge sees it (queueing in the channel included).
    latency: Histogram,
}

/// stockd's and orderd's fleets, shared by the clients of every runtime, the health
/// loops and `/readyz`.
pub struct Fleets {
    pub stockd: Arc<Fleet>,
    pub orderd: Arc<Fleet>,
}

impl Fleets {
    pub fn new(u: &Upstreams, metrics: &Metrics) -> Self {
        Self {
            stockd: Arc::new(Fleet::new("stockd", &u.stockd, metrics)),
            orderd: Arc::new(Fleet::new("orderd", &u.orderd, metrics)),
        }
    }
}

impl Fleet {
    /// Every endpoint starts marked down (not yet checked); calls try them anyway.
    /// `urls` has 1..=[`MAX_ENDPOINTS`] entries (the config's validation).
    pub fn new(service: &'static str, urls: &[String], metrics: &Metrics) -> Self {
        debug_assert!(!urls.is_empty() && urls.len() <= MAX_ENDPOINTS);
        let endpoints = urls
            .iter()
            .take(MAX_ENDPOINTS)
            .map(|url| {
                let gauge = metrics.upstream_healthy(service, url);
                gauge.set(0);
                Endpoint {
                    url: url.clone(),
                    healthy: AtomicBool::new(false),
                    gauge,
                }
            })
            .collect();
        Self {
            service,
            endpoints,
            next: AtomicUsize::new(0),
            failovers: metrics.upstream_failovers(service),
            latency: metrics.upstream_seconds(service),
        }
    }

    /// `stockd` or `orderd`.
    pub fn service(&self) -> &'static str {
        self.service
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    pub fn is_healthy(&self, i: usize) -> bool {
        self.endpoints[i].healthy.load(Ordering::Relaxed)
    }

    /// True when at least one endpoint is marked healthy (`/readyz`).
    pub fn any_healthy(&self) -> bool {
        (0..self.endpoints.len()).any(|i| self.is_healthy(i))
    }

    /// Sets endpoint `i`'s mark (and its gauge), logging the changes.
    pub fn mark(&self, i: usize, healthy: bool) {
        let e = &self.endpoints[i];
        if e.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            e.gauge.set(i64::from(healthy));
            if healthy {
                tracing::info!(service = self.service, endpoint = %e.url, "upstream healthy");
            } else {
                tracing::warn!(service = self.service, endpoint = %e.url, "upstream marked down");
            }
        }
    }

    /// The order one call tries the endpoints in. The first is the `c mod h`-th of the
    /// `h` endpoints marked healthy (`c` the counter), so a dead endpoint's share is
    /// spread over all the others rather than landing on its neighbour.
    pub fn attempts(&self) -> Attempts<'_> {
        let n = self.endpoints.len();
        let start = if n == 1 {
            0
        } else {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            let healthy = (0..n).filter(|&i| self.is_healthy(i)).count();
            if healthy == 0 {
                c % n
            } else {
                let k = c % healthy;
                (0..n)
                    .filter(|&i| self.is_healthy(i))
                    .nth(k)
                    .unwrap_or(c % n)
            }
        };
        Attempts {
            fleet: self,
            start,
            tried: 0,
        }
    }

    /// One unary call with failover: `call(client, time left)` on the endpoints in
    /// [`Self::attempts`] order (`clients[i]` is endpoint `i`'s), the whole under
    /// `deadline`. A transport error or `UNAVAILABLE` marks the endpoint down and moves
    /// on while time is left; other answers return at once. Past the deadline:
    /// `DEADLINE_EXCEEDED`; out of endpoints: the last failure.
    pub async fn call<C, T, F, Fut>(
        &self,
        clients: &[C],
        deadline: Duration,
        mut call: F,
    ) -> Result<T, tonic::Status>
    where
        C: Clone,
        F: FnMut(C, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let _observe = ObserveOnDrop(&self.latency, started);
        let end = started + deadline;
        let mut last = None;
        for i in self.attempts() {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            if last.is_some() {
                self.failovers.inc();
            }
            match tokio::time::timeout(left, call(clients[i].clone(), left)).await {
                Err(_) => return Err(tonic::Status::deadline_exceeded("upstream deadline")),
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) if fails_over(&s) => {
                    tracing::debug!(
                        service = self.service,
                        endpoint = %self.endpoints[i].url,
                        code = ?s.code(),
                        error = %s.message(),
                        "upstream call failed; trying the next endpoint"
                    );
                    if marks_down(&s) {
                        self.mark(i, false);
                    }
                    last = Some(s);
                }
                Ok(Err(s)) => return Err(s),
            }
        }
        Err(last.unwrap_or_else(|| tonic::Status::deadline_exceeded("upstream deadline")))
    }
}

/// Observes the time since its start when dropped: every way out of a call (answer,
/// failure, deadline, the caller going away) is counted.
struct ObserveOnDrop<'a>(&'a Histogram, tokio::time::Instant);

impl Drop for ObserveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.observe(self.1.elapsed().as_secs_f64());
    }
}

/// True for the failures another endpoint may not have: `UNAVAILABLE`, and any status
/// made on this side from a transport error (tonic keeps the error as the status's
/// source; a status the server sent has none): refused connects, resets, a connection
/// closed mid-call.
pub fn fails_over(s: &tonic::Status) -> bool {
    s.code() == Code::Unavailable || marks_down(s)
}

/// True for the failures that say the endpoint itself is unwell, which mark it down at
/// once: a status made on this side from a transport error (tonic keeps the error as
/// its source; [`crate::batch`] gives its broken streams one too). A status the server
/// sent has none: it is about the request (one activity rebuilding, its Redis cluster
/// down), and every peer would answer the same.
pub fn marks_down(s: &tonic::Status) -> bool {
    s.code() != Code::DeadlineExceeded && std::error::Error::source(s).is_some()
}

/// The endpoints one call tries, in order: from the round-robin start, the healthy
/// ones first, then the others; each once.
pub struct Attempts<'a> {
    fleet: &'a Fleet,
    start: usize,
    tried: u64,
}

impl Iterator for Attempts<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let n = self.fleet.endpoints.len();
        let untried = |i: usize| self.tried & (1 << i) == 0;
        let pick = (0..n)
            .map(|k| (self.start + k) % n)
            .find(|&i| untried(i) && self.fleet.is_healthy(i))
            .or_else(|| (0..n).map(|k| (self.start + k) % n).find(|&i| untried(i)))?;
        self.tried |= 1 << pick;
        Some(pick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(n: usize) -> (Fleet, Metrics) {
        let m = Metrics::new();
        let urls: Vec<String> = (0..n).map(|i| format!("http://10.0.0.{i}:1")).collect();
        (Fleet::new("stockd", &urls, &m), m)
    }

    fn order(f: &Fleet) -> Vec<usize> {
        f.attempts().collect()
    }

    #[test]
    fn calls_go_round_robin_over_the_healthy_endpoints_and_then_the_others() {
        let (f, _m) = fleet(3);
        for i in 0..3 {
            f.mark(i, true);
        }
        assert_eq!(order(&f), [0, 1, 2]);
        assert_eq!(order(&f), [1, 2, 0]);
        f.mark(0, false);
        // The dead endpoint's share goes to both others, each then tried last.
        assert_eq!(order(&f), [1, 2, 0]);
        assert_eq!(order(&f), [2, 1, 0]);
        assert_eq!(order(&f), [1, 2, 0]);
        assert_eq!(order(&f), [2, 1, 0]);
    }

    #[test]
    fn with_every_endpoint_marked_down_each_is_still_tried_once() {
        let (f, _m) = fleet(3);
        assert!(!f.any_healthy());
        let mut seen = order(&f);
        seen.sort();
        assert_eq!(seen, [0, 1, 2]);
    }

    #[test]
    fn marks_set_the_gauge() {
        let (f, m) = fleet(2);
        f.mark(1, true);
        assert!(f.any_healthy());
        let text = m.text().unwrap();
        assert!(
            text.contains(
                r#"gateway_upstream_healthy{endpoint="http://10.0.0.1:1",service="stockd"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"gateway_upstream_healthy{endpoint="http://10.0.0.0:1",service="stockd"} 0"#
        ));
    }

    /// What a transport failure looks like to [`Fleet::call`]: a status with a source.
    fn transport_failure() -> tonic::Status {
        let mut s = tonic::Status::unavailable("connection refused");
        s.set_source(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        s
    }

    #[tokio::test]
    async fn unavailable_fails_over_and_only_a_transport_failure_marks_down() {
        let (f, m) = fleet(2);
        f.mark(0, true);
        f.mark(1, true);
        let clients = [0usize, 1];
        // stockd's own UNAVAILABLE (one activity rebuilding): tried on the next endpoint,
        // and the one that sent it stays healthy.
        let r = f
            .call(&clients, Duration::from_secs(1), |c, _| async move {
                if c == 0 {
                    Err(tonic::Status::unavailable("activity 3 is being rebuilt"))
                } else {
                    Ok(tonic::Response::new(c))
                }
            })
            .await;
        assert_eq!(r.unwrap(), 1);
        assert!(f.is_healthy(0) && f.is_healthy(1));
        // Refused connects: failed over, and each endpoint marked down.
        let r: Result<usize, _> = f
            .call(&clients, Duration::from_secs(1), |_, _| async {
                Err(transport_failure())
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::Unavailable);
        assert!(!f.is_healthy(0) && !f.is_healthy(1));
        assert!(m
            .text()
            .unwrap()
            .contains(r#"gateway_upstream_failovers_total{service="stockd"} 2"#));
        f.mark(1, true);

        let calls = AtomicUsize::new(0);
        let r: Result<(), _> = f
            .call(&clients, Duration::from_secs(1), |_, _| {
                calls.fetch_add(1, Ordering::Relaxed);
                async { Err(tonic::Status::invalid_argument("bad")) }
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert!(f.is_healthy(1));
        // The calls, failed over or refused, are timed once each.
        assert!(m
            .text()
            .unwrap()
            .contains(r#"gateway_upstream_call_seconds_count{service="stockd"} 3"#));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_endpoint_costs_the_deadline_and_no_more() {
        let (f, m) = fleet(2);
        let r: Result<(), _> = f
            .call(&[0, 1], Duration::from_millis(300), |_, _| {
                std::future::pending::<Result<tonic::Response<()>, tonic::Status>>()
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::DeadlineExceeded);
        // A call cut by the deadline is timed too, at the deadline.
        let text = m.text().unwrap();
        assert!(
            text.contains(r#"gateway_upstream_call_seconds_count{service="stockd"} 1"#)
                && text.contains(r#"gateway_upstream_call_seconds_sum{service="stockd"} 0.3"#),
            "{text}"
        );
    }
}

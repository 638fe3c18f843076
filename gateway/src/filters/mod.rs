//! The request pipeline: [`Filter`]s run in order over a per-request context
//! ([`Cx`]); each says "go on" ([`Flow::Go`]) or "answered, stop" ([`Flow::Stop`]).
//! The order is written once, in three lists, by name:
//!
//! - [`EDGE`], before authentication, for every request: [`IpBan`] (`ip_ban`),
//!   [`IpLimit`] (`ip_limit`: per IP and per route), [`SoldOutEarly`] (`sold_out`).
//!   The fast lane walks this same list (`crate::fast_lane`), with [`Filter::peek`].
//! - [`AUTHENTICATED`], once the header is read: [`Authenticate`] (`authenticate`),
//!   [`UserLimit`] (`user_limit`), [`Window`] (`window`).
//! - [`AFTER_BODY`], for a reserve once its JSON body is read: [`PurchaseToken`]
//!   (`purchase_token`), [`Admission`] (`admission`).
//!
//! The filters read state from `crate::shared` (bans, buckets, catalog, keys); the
//! state modules import nothing of the pipeline. `crate::proxy` sequences the lists
//! and the route handlers (`crate::handlers`).

mod admission;
mod authenticate;
mod ip_ban;
mod ip_limit;
mod purchase_token;
mod sold_out;
mod user_limit;
mod window;

use std::net::IpAddr;
use std::sync::Arc;

pub use admission::Admission;
pub use authenticate::Authenticate;
pub use ip_ban::{ConnectionBan, IpBan};
pub use ip_limit::IpLimit;
pub use purchase_token::PurchaseToken;
pub use sold_out::SoldOutEarly;
pub use user_limit::UserLimit;
pub use window::Window;

use crate::admission::Admitted;
use crate::answer::Refusal;
use crate::auth::TokenMemo;
use crate::routes::Route;
use crate::shared::{Compiled, Shared};
use crate::sold_out::ItemLive;

/// What a filter sees.
pub struct Cx<'a> {
    pub shared: &'a Shared,
    pub policy: &'a Compiled,
    pub route: &'a Route,
    pub client_ip: IpAddr,
    pub now_ms: u64,
    pub now_unix_ms: u64,
    pub bearer: Option<&'a str>,
    pub purchase_token: Option<&'a str>,
    pub user: Option<String>,
    pub item: Option<Arc<ItemLive>>,
    pub admitted: Option<Admitted>,
    /// The connection's last verified bearer token, where the connection keeps one
    /// (the fast lane's; `crate::auth::TokenMemo`).
    pub memo: Option<&'a mut TokenMemo>,
}

impl<'a> Cx<'a> {
    /// The context of a request from `client_ip` to `route` arriving now, with the
    /// `bearer` token it carries, before any filter ran.
    pub fn new(
        shared: &'a Shared,
        policy: &'a Compiled,
        route: &'a Route,
        client_ip: IpAddr,
        bearer: Option<&'a str>,
    ) -> Self {
        Self {
            shared,
            policy,
            route,
            client_ip,
            now_ms: shared.now_ms(),
            now_unix_ms: seckill_lua::clock::unix_ms(),
            bearer,
            purchase_token: None,
            user: None,
            item: None,
            admitted: None,
            memo: None,
        }
    }
}

/// A filter's verdict.
#[derive(Debug)]
pub enum Flow {
    Go,
    Stop(Refusal),
}

/// One step of the pipeline.
pub trait Filter: Sync {
    /// Its name in logs, docs and tests.
    fn name(&self) -> &'static str;

    /// The verdict, taking what the step takes (a bucket's token, an in-flight slot).
    fn check(&self, cx: &mut Cx<'_>) -> Flow;

    /// The verdict [`Self::check`] would give, taking nothing: the fast lane decides
    /// with peeks and replays [`Self::check`] only when it answers. The default is
    /// `check` itself, for the steps that take nothing ([`Self::takes`] false).
    fn peek(&self, cx: &mut Cx<'_>) -> Flow {
        self.check(cx)
    }

    /// True when [`Self::check`] takes something that [`Self::peek`] leaves.
    fn takes(&self) -> bool {
        false
    }
}

/// Before authentication, for every request (and the fast lane).
pub static EDGE: [&dyn Filter; 3] = [&IpBan, &IpLimit, &SoldOutEarly];
/// After [`EDGE`], needing only the request header.
pub static AUTHENTICATED: [&dyn Filter; 3] = [&Authenticate, &UserLimit, &Window];
/// A reserve, once its body is read.
pub static AFTER_BODY: [&dyn Filter; 2] = [&PurchaseToken, &Admission];

/// Runs `filters` in order until one stops.
pub fn run(filters: &[&dyn Filter], cx: &mut Cx<'_>) -> Flow {
    for f in filters {
        if let Flow::Stop(r) = f.check(cx) {
            return Flow::Stop(r);
        }
    }
    Flow::Go
}

/// Where a walk of `filters` with [`Filter::peek`] ends: the refusal and the position
/// of the filter that gave it, or `None` when every filter would go on.
pub fn peek(filters: &[&dyn Filter], cx: &mut Cx<'_>) -> Option<(usize, Refusal)> {
    filters
        .iter()
        .enumerate()
        .find_map(|(i, f)| match f.peek(cx) {
            Flow::Go => None,
            Flow::Stop(r) => Some((i, r)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn shared() -> Shared {
        crate::shared::for_test(
            "[limits]\nper_ip = { rate = 0.001, burst = 2.0 }\n[bans]\ndeny = [\"203.0.113.0/24\"]\n",
        )
    }

    fn cx<'a>(shared: &'a Shared, policy: &'a Compiled, route: &'a Route, ip: [u8; 4]) -> Cx<'a> {
        Cx {
            shared,
            policy,
            route,
            client_ip: IpAddr::from(Ipv4Addr::from(ip)),
            now_ms: shared.now_ms(),
            now_unix_ms: seckill_lua::clock::unix_ms(),
            bearer: None,
            purchase_token: None,
            user: None,
            item: None,
            admitted: None,
            memo: None,
        }
    }

    fn names(list: &[&dyn Filter]) -> Vec<&'static str> {
        list.iter().map(|f| f.name()).collect()
    }

    #[test]
    fn the_lists_hold_the_documented_steps_in_order() {
        assert_eq!(names(&EDGE), ["ip_ban", "ip_limit", "sold_out"]);
        assert_eq!(
            names(&AUTHENTICATED),
            ["authenticate", "user_limit", "window"]
        );
        assert_eq!(names(&AFTER_BODY), ["purchase_token", "admission"]);
        // Only the bucket step takes something a peek leaves.
        let takers: Vec<_> = EDGE
            .iter()
            .filter(|f| f.takes())
            .map(|f| f.name())
            .collect();
        assert_eq!(takers, ["ip_limit"]);
    }

    /// A step that counts its calls and answers as told.
    struct Probe(&'static str, Option<Refusal>, AtomicUsize);

    impl Filter for Probe {
        fn name(&self) -> &'static str {
            self.0
        }
        fn check(&self, _: &mut Cx<'_>) -> Flow {
            self.2.fetch_add(1, Ordering::Relaxed);
            match &self.1 {
                Some(_) => Flow::Stop(Refusal::Banned),
                None => Flow::Go,
            }
        }
    }

    #[test]
    fn a_step_that_answers_ends_the_walk() {
        let shared = shared();
        let policy = shared.policy();
        let route = Route::Index;
        let (a, b, c) = (
            Probe("a", None, AtomicUsize::new(0)),
            Probe("b", Some(Refusal::Banned), AtomicUsize::new(0)),
            Probe("c", None, AtomicUsize::new(0)),
        );
        let list: [&dyn Filter; 3] = [&a, &b, &c];
        let mut cx = cx(&shared, &policy, &route, [127, 0, 0, 1]);
        assert!(matches!(run(&list, &mut cx), Flow::Stop(Refusal::Banned)));
        let calls = |p: &Probe| p.2.load(Ordering::Relaxed);
        assert_eq!((calls(&a), calls(&b), calls(&c)), (1, 1, 0));
        assert!(matches!(peek(&list, &mut cx), Some((1, Refusal::Banned))));
        assert_eq!(calls(&c), 0);
    }

    #[test]
    fn the_edge_refuses_a_denied_ip_and_a_peek_takes_no_token() {
        let shared = shared();
        let policy = shared.policy();
        let route = Route::ListActivities;
        let mut denied = cx(&shared, &policy, &route, [203, 0, 113, 9]);
        assert!(matches!(
            peek(&EDGE, &mut denied),
            Some((0, Refusal::Banned))
        ));
        // A burst of 2: any number of peeks, then two takes, then the bucket refuses.
        let mut ok = cx(&shared, &policy, &route, [198, 51, 100, 7]);
        for _ in 0..5 {
            assert!(peek(&EDGE, &mut ok).is_none());
        }
        assert!(matches!(run(&EDGE, &mut ok), Flow::Go));
        assert!(matches!(run(&EDGE, &mut ok), Flow::Go));
        assert!(matches!(
            run(&EDGE, &mut ok),
            Flow::Stop(Refusal::RateLimited(_))
        ));
        assert!(matches!(
            peek(&EDGE, &mut ok),
            Some((1, Refusal::RateLimited(_)))
        ));
    }
}

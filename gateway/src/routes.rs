//! The edge's routes (`docs/http-api.md`), parsed from method and path without
//! allocating. Ids are parsed into numbers at the door; an order id stays a borrowed
//! string checked against the reservation id grammar later.

use http::Method;

/// A matched route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Index,
    OpenApi,
    ListActivities,
    GetActivity(u64),
    Token(u64, u64),
    /// `POST .../items/{s}/challenge`: a proof-of-work puzzle (`fair::challenge`).
    Challenge(u64, u64),
    Reserve(u64, u64),
    ListOrders,
    GetOrder(String),
    OrderEvents(String),
    Pay(String),
    Cancel(String),
    PaymentCallback,
    DevToken,
    /// `GET /api/v1/activities/{a}/room`: the waiting room's status.
    RoomStatus(u64),
    /// `POST .../room/join`.
    RoomJoin(u64),
    /// `POST .../room/heartbeat`.
    RoomBeat(u64),
    /// `GET .../room/events` (SSE).
    RoomEvents(u64),
    /// A known path with the wrong method.
    WrongMethod,
    NotFound,
}

/// Route groups, for the per-route buckets (`limits.routes.<name>`) and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RouteClass {
    Static = 0,
    Activities = 1,
    Token = 2,
    Reserve = 3,
    Orders = 4,
    Payments = 5,
    Dev = 6,
    Other = 7,
    /// The waiting room (`limits.routes.room`).
    Room = 8,
}

impl RouteClass {
    pub const ALL: [RouteClass; 9] = [
        Self::Static,
        Self::Activities,
        Self::Token,
        Self::Reserve,
        Self::Orders,
        Self::Payments,
        Self::Dev,
        Self::Other,
        Self::Room,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Activities => "activities",
            Self::Token => "token",
            Self::Reserve => "reserve",
            Self::Orders => "orders",
            Self::Payments => "payments",
            Self::Dev => "dev",
            Self::Other => "other",
            Self::Room => "room",
        }
    }

    /// The route names allowed under `limits.routes`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == name && !matches!(c, Self::Static | Self::Other))
    }
}

impl Route {
    pub fn class(&self) -> RouteClass {
        match self {
            Route::Index | Route::OpenApi => RouteClass::Static,
            Route::ListActivities | Route::GetActivity(_) => RouteClass::Activities,
            // A challenge is the first half of a token: the same bucket.
            Route::Token(..) | Route::Challenge(..) => RouteClass::Token,
            Route::Reserve(..) => RouteClass::Reserve,
            Route::ListOrders
            | Route::GetOrder(_)
            | Route::OrderEvents(_)
            | Route::Pay(_)
            | Route::Cancel(_) => RouteClass::Orders,
            Route::PaymentCallback => RouteClass::Payments,
            Route::DevToken => RouteClass::Dev,
            Route::RoomStatus(_)
            | Route::RoomJoin(_)
            | Route::RoomBeat(_)
            | Route::RoomEvents(_) => RouteClass::Room,
            Route::WrongMethod | Route::NotFound => RouteClass::Other,
        }
    }

    /// True for routes that need a bearer JWT.
    pub fn needs_user(&self) -> bool {
        matches!(
            self,
            Route::Token(..)
                | Route::Challenge(..)
                | Route::Reserve(..)
                | Route::ListOrders
                | Route::GetOrder(_)
                | Route::OrderEvents(_)
                | Route::Pay(_)
                | Route::Cancel(_)
                | Route::RoomJoin(_)
                | Route::RoomBeat(_)
                | Route::RoomEvents(_)
        )
    }

    /// True for routes that carry a JSON body.
    pub fn has_body(&self) -> bool {
        matches!(
            self,
            Route::Reserve(..) | Route::PaymentCallback | Route::DevToken
        )
    }
}

fn id(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Matches `method path` (path without the query).
pub fn route(method: &Method, path: &str) -> Route {
    let get = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let want = |ok: bool, r: Route| if ok { r } else { Route::WrongMethod };
    match path {
        "/" | "/index.html" => return want(get, Route::Index),
        "/api/openapi.json" => return want(get, Route::OpenApi),
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/api/v1/") else {
        return Route::NotFound;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut it = rest.split('/');
    let parts: [Option<&str>; 6] = [
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
        it.next(),
    ];
    if it.next().is_some() {
        return Route::NotFound;
    }
    match parts {
        [Some("activities"), None, ..] => want(get, Route::ListActivities),
        [Some("activities"), Some(a), None, ..] => match id(a) {
            Some(a) => want(get, Route::GetActivity(a)),
            None => Route::NotFound,
        },
        [Some("activities"), Some(a), Some("room"), None, ..] => match id(a) {
            Some(a) => want(get, Route::RoomStatus(a)),
            None => Route::NotFound,
        },
        [Some("activities"), Some(a), Some("room"), Some(action), None, ..] => {
            match (id(a), action) {
                (Some(a), "join") => want(post, Route::RoomJoin(a)),
                (Some(a), "heartbeat") => want(post, Route::RoomBeat(a)),
                (Some(a), "events") => want(get, Route::RoomEvents(a)),
                _ => Route::NotFound,
            }
        }
        [Some("activities"), Some(a), Some("items"), Some(s), Some(action), None] => {
            match (id(a), id(s), action) {
                (Some(a), Some(s), "token") => want(post, Route::Token(a, s)),
                (Some(a), Some(s), "challenge") => want(post, Route::Challenge(a, s)),
                (Some(a), Some(s), "reserve") => want(post, Route::Reserve(a, s)),
                _ => Route::NotFound,
            }
        }
        [Some("orders"), None, ..] => want(get, Route::ListOrders),
        [Some("orders"), Some(o), None, ..] if !o.is_empty() => {
            want(get, Route::GetOrder(o.to_string()))
        }
        [Some("orders"), Some(o), Some(action), None, ..] if !o.is_empty() => match action {
            "events" => want(get, Route::OrderEvents(o.to_string())),
            "pay" => want(post, Route::Pay(o.to_string())),
            "cancel" => want(post, Route::Cancel(o.to_string())),
            _ => Route::NotFound,
        },
        [Some("payments"), Some("callback"), None, ..] => want(post, Route::PaymentCallback),
        [Some("dev"), Some("token"), None, ..] => want(post, Route::DevToken),
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_route_matches() {
        let g = Method::GET;
        let p = Method::POST;
        assert_eq!(route(&g, "/"), Route::Index);
        assert_eq!(route(&g, "/api/openapi.json"), Route::OpenApi);
        assert_eq!(route(&g, "/api/v1/activities"), Route::ListActivities);
        assert_eq!(route(&g, "/api/v1/activities/12"), Route::GetActivity(12));
        assert_eq!(
            route(&p, "/api/v1/activities/1/items/7/token"),
            Route::Token(1, 7)
        );
        assert_eq!(
            route(&p, "/api/v1/activities/1/items/7/reserve"),
            Route::Reserve(1, 7)
        );
        assert_eq!(
            route(&p, "/api/v1/activities/1/items/7/challenge"),
            Route::Challenge(1, 7)
        );
        assert_eq!(route(&g, "/api/v1/orders"), Route::ListOrders);
        assert_eq!(
            route(&g, "/api/v1/orders/1-7-0-a-1"),
            Route::GetOrder("1-7-0-a-1".into())
        );
        assert_eq!(
            route(&g, "/api/v1/orders/1-7-0-a-1/events"),
            Route::OrderEvents("1-7-0-a-1".into())
        );
        assert_eq!(route(&p, "/api/v1/orders/x/pay"), Route::Pay("x".into()));
        assert_eq!(
            route(&p, "/api/v1/orders/x/cancel"),
            Route::Cancel("x".into())
        );
        assert_eq!(
            route(&p, "/api/v1/payments/callback"),
            Route::PaymentCallback
        );
        assert_eq!(route(&p, "/api/v1/dev/token"), Route::DevToken);
        assert_eq!(route(&g, "/api/v1/activities/3/room"), Route::RoomStatus(3));
        assert_eq!(
            route(&p, "/api/v1/activities/3/room/join"),
            Route::RoomJoin(3)
        );
        assert_eq!(
            route(&p, "/api/v1/activities/3/room/heartbeat"),
            Route::RoomBeat(3)
        );
        assert_eq!(
            route(&g, "/api/v1/activities/3/room/events"),
            Route::RoomEvents(3)
        );
        assert_eq!(
            route(&g, "/api/v1/activities/3/room/join"),
            Route::WrongMethod
        );
        assert_eq!(route(&g, "/api/v1/activities/3/room/nope"), Route::NotFound);
    }

    #[test]
    fn wrong_methods_and_unknown_paths_are_told_apart() {
        let g = Method::GET;
        assert_eq!(
            route(&g, "/api/v1/activities/1/items/7/reserve"),
            Route::WrongMethod
        );
        assert_eq!(
            route(&Method::DELETE, "/api/v1/activities"),
            Route::WrongMethod
        );
        for bad in [
            "/nope",
            "/api/v1/",
            "/api/v1/activities/x",
            "/api/v1/activities/1/items/x/reserve",
            "/api/v1/activities/1/items/7/reserve/more",
            "/api/v1/activities/99999999999999999999999/items/7/reserve",
            "/api/v1/orders/x/refund",
        ] {
            assert_eq!(route(&g, bad), Route::NotFound, "{bad}");
        }
    }
}

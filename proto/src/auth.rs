//! Who may call which internal RPC.
//!
//! Every internal RPC carries `authorization: Bearer <token>`. A daemon knows a list
//! of callers ([`CallerConfig`]: a name, a token, scopes), and every RPC needs one
//! [`Scope`] ([`method_scope`], a table over the whole `seckill.v1` contract; a method
//! missing from it needs `admin`). [`Callers::guard`] wraps a generated server: an
//! unknown or missing token is refused with `UNAUTHENTICATED`, a known caller without
//! the method's scope with `PERMISSION_DENIED` naming the scope. Health and reflection
//! are added unguarded, so probes and ghz's reflection lookup need no token.
//! [`AttachToken`] is the client-side interceptor that adds the header to every call.
//!
//! Tokens are compared in constant time (SHA-256 digests, so that not even a token's
//! length shows in the time taken), every configured token on every call, and never
//! logged: [`CallerConfig`]'s `Debug` hides it.
//!
//! The old single `service_token` is one caller named `service` with every scope (the
//! dev shortcut, see [`Callers::new`]).

use std::convert::Infallible;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::server::NamedService;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Metadata key carrying the token.
pub const HEADER: &str = "authorization";

/// Metadata key set on a refusal of the caller's own credentials (unknown token, or a
/// scope it lacks), so that a caller tells "our own credentials are wrong" (an
/// operator's problem: 503 at the edge) from a daemon's UNAUTHENTICATED or
/// PERMISSION_DENIED about the request itself (a payment callback's bad signature, an
/// order of another user: the caller's 4xx) by [`is_service_token_refusal`], not by
/// reading the message.
pub const REFUSAL_HEADER: &str = "seckill-refusal";
const REFUSAL_SERVICE_TOKEN: &str = "service-token";
const REFUSAL_SCOPE: &str = "scope";

/// True when `status` refuses the caller's credentials (token or scope), not the
/// request.
pub fn is_service_token_refusal(status: &Status) -> bool {
    status.metadata().get(REFUSAL_HEADER).is_some_and(|v| {
        v.as_bytes() == REFUSAL_SERVICE_TOKEN.as_bytes() || v.as_bytes() == REFUSAL_SCOPE.as_bytes()
    })
}

/// True when `status` refuses a scope the caller's token lacks (the token itself is
/// known). A daemon older than an RPC classifies it `admin` (see [`method_scope`]), so
/// this is also how such a daemon answers an RPC it does not know yet.
pub fn is_scope_refusal(status: &Status) -> bool {
    status
        .metadata()
        .get(REFUSAL_HEADER)
        .is_some_and(|v| v.as_bytes() == REFUSAL_SCOPE.as_bytes())
}

/// The PERMISSION_DENIED a daemon answers a caller that lacks the scope a call needs,
/// marked so that [`is_scope_refusal`] knows it.
pub fn scope_refusal(message: String) -> Status {
    marked(Status::permission_denied(message), REFUSAL_SCOPE)
}

fn marked(mut status: Status, mark: &'static str) -> Status {
    status
        .metadata_mut()
        .insert(REFUSAL_HEADER, MetadataValue::from_static(mark));
    status
}

/// What a caller may do. One scope per RPC (see [`method_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Take and give back a unit: `StockService.Reserve`, `StockService.Release`.
    Reserve,
    /// Read without changing anything: `StockService.GetStock`,
    /// `OrderService.GetOrder`, `WatchOrder`, `ListOrders`.
    Read,
    /// Move an order: `OrderService.Pay`, `Cancel`, `PaymentCallback`.
    Pay,
    /// Operate the platform: every `AdminService` RPC (activities, publish, reconcile,
    /// bans) and `OrderService.ListDeadLetters`, `ReplayDeadLetters`.
    Admin,
}

impl Scope {
    /// Every scope, in order.
    pub const ALL: [Scope; 4] = [Scope::Reserve, Scope::Read, Scope::Pay, Scope::Admin];

    /// Its name in config files and refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Reserve => "reserve",
            Scope::Read => "read",
            Scope::Pay => "pay",
            Scope::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scope an RPC needs, by its gRPC path (`/seckill.v1.StockService/Reserve`).
/// A path not in the table (a new RPC nobody classified, or garbage) needs `admin`:
/// an oversight closes, it does not open.
pub fn method_scope(path: &str) -> Scope {
    let Some((service, method)) = path
        .strip_prefix("/seckill.v1.")
        .and_then(|p| p.split_once('/'))
    else {
        return Scope::Admin;
    };
    match (service, method) {
        ("StockService", "Reserve" | "ReserveBatch" | "ReserveStream" | "Release") => {
            Scope::Reserve
        }
        ("StockService", "GetStock") => Scope::Read,
        ("OrderService", "GetOrder" | "WatchOrder" | "ListOrders") => Scope::Read,
        ("OrderService", "Pay" | "Cancel" | "PaymentCallback") => Scope::Pay,
        _ => Scope::Admin,
    }
}

/// One caller of a daemon: an entry of `[[grpc.callers]]`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CallerConfig {
    /// Who this is (`gateway`, `seckillctl`, `billing`): named in logs and refusals.
    /// Unique in the list; letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// Its bearer token: printable ASCII without spaces, at least 16 bytes, unique in
    /// the list. Never logged.
    pub token: String,
    /// What it may do: `reserve`, `read`, `pay`, `admin`. At least one.
    pub scopes: Vec<Scope>,
}

impl std::fmt::Debug for CallerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerConfig")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("scopes", &self.scopes)
            .finish()
    }
}

/// Shortest token accepted in `callers`, bytes.
pub const MIN_CALLER_TOKEN_BYTES: usize = 16;

/// Checks a daemon's `grpc.service_token` and `grpc.callers` together: at least one
/// of them, each token well-formed, names and tokens unique. The error names the
/// field (`grpc.callers[1].token`) and what is wrong; the daemons turn it into their
/// config error.
pub fn check_callers(
    service_token: &str,
    callers: &[CallerConfig],
) -> Result<(), (String, &'static str)> {
    let printable = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic());
    if service_token.is_empty() && callers.is_empty() {
        return Err((
            "grpc.callers".into(),
            "give at least one caller (or grpc.service_token, the dev shortcut)",
        ));
    }
    if !service_token.is_empty() && !printable(service_token) {
        return Err((
            "grpc.service_token".into(),
            "must be printable ASCII without spaces",
        ));
    }
    for (i, c) in callers.iter().enumerate() {
        let field = |f: &str| format!("grpc.callers[{i}].{f}");
        let name_ok = !c.name.is_empty()
            && c.name.len() <= 64
            && c.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err((
                field("name"),
                "must be 1 to 64 letters, digits, '-', '_' or '.'",
            ));
        }
        if callers[..i].iter().any(|o| o.name == c.name) {
            return Err((field("name"), "names another caller already"));
        }
        if !printable(&c.token) {
            return Err((field("token"), "must be printable ASCII without spaces"));
        }
        if c.token.len() < MIN_CALLER_TOKEN_BYTES {
            return Err((field("token"), "must be at least 16 bytes"));
        }
        if callers[..i].iter().any(|o| o.token == c.token) || c.token == service_token {
            return Err((
                field("token"),
                "is another caller's token already (each caller needs its own)",
            ));
        }
        if c.scopes.is_empty() {
            return Err((
                field("scopes"),
                "give at least one of reserve, read, pay, admin",
            ));
        }
    }
    Ok(())
}

/// The caller an RPC was authenticated as, in the request's extensions (service
/// impls may log it).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The caller's configured name (`service` for the single `service_token`).
    pub name: Arc<str>,
}

struct Entry {
    name: Arc<str>,
    digest: [u8; 32],
    scopes: u8,
}

/// The callers a daemon knows, ready to check tokens.
#[derive(Clone)]
pub struct Callers {
    entries: Arc<[Entry]>,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| &*e.name).collect();
        f.debug_struct("Callers").field("names", &names).finish()
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Callers {
    /// `service_token` (when non-empty) is the caller `service` with every scope;
    /// `callers` follow. [`check_callers`] has passed.
    pub fn new(service_token: &str, callers: &[CallerConfig]) -> Self {
        let all = Scope::ALL.iter().fold(0, |m, s| m | s.bit());
        let shortcut = (!service_token.is_empty()).then(|| Entry {
            name: "service".into(),
            digest: digest(service_token.as_bytes()),
            scopes: all,
        });
        let entries = shortcut
            .into_iter()
            .chain(callers.iter().map(|c| Entry {
                name: c.name.as_str().into(),
                digest: digest(c.token.as_bytes()),
                scopes: c.scopes.iter().fold(0, |m, s| m | s.bit()),
            }))
            .collect();
        Self { entries }
    }

    /// The caller holding the presented token. Every entry is compared, whatever
    /// matched, so the time taken says nothing about which (or whether one) did.
    fn identify(&self, presented: Option<&[u8]>) -> Result<&Entry, Status> {
        let Some(raw) = presented else {
            return Err(marked(
                Status::unauthenticated("missing service token"),
                REFUSAL_SERVICE_TOKEN,
            ));
        };
        let token = raw.strip_prefix(b"Bearer ").unwrap_or(raw);
        let d = digest(token);
        let mut found = u32::MAX;
        for (i, e) in self.entries.iter().enumerate() {
            found.conditional_assign(&(i as u32), e.digest.ct_eq(&d));
        }
        self.entries.get(found as usize).ok_or_else(|| {
            marked(
                Status::unauthenticated("invalid service token"),
                REFUSAL_SERVICE_TOKEN,
            )
        })
    }

    /// Checks one call: the caller's name, or the refusal.
    fn authorize(&self, presented: Option<&[u8]>, path: &str) -> Result<Arc<str>, Status> {
        let e = self.identify(presented)?;
        let need = method_scope(path);
        if e.scopes & need.bit() == 0 {
            return Err(scope_refusal(format!(
                "caller {:?} lacks the {:?} scope that {path} needs",
                &*e.name,
                need.as_str()
            )));
        }
        Ok(e.name.clone())
    }

    /// `inner` (a generated `…Server`) behind the token and scope check.
    pub fn guard<S>(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            callers: self.clone(),
        }
    }
}

/// A gRPC server behind [`Callers`]: see [`Callers::guard`].
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    callers: Callers,
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let presented = req.headers().get(HEADER).map(|v| v.as_bytes());
        match self.callers.authorize(presented, req.uri().path()) {
            Ok(name) => {
                req.extensions_mut().insert(Caller { name });
                Box::pin(self.inner.call(req))
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

/// Client-side interceptor adding the service token to every call.
#[derive(Clone)]
pub struct AttachToken {
    value: MetadataValue<Ascii>,
}

impl std::fmt::Debug for AttachToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttachToken(..)")
    }
}

impl AttachToken {
    /// Fails when the token holds characters that cannot go in a header.
    pub fn new(token: &str) -> Result<Self, Status> {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| Status::invalid_argument("service token is not a valid header value"))?;
        Ok(Self { value })
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(HEADER, self.value.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn caller(name: &str, token: &str, scopes: &[Scope]) -> CallerConfig {
        CallerConfig {
            name: name.into(),
            token: token.into(),
            scopes: scopes.to_vec(),
        }
    }

    fn callers() -> Callers {
        Callers::new(
            "dev-shortcut",
            &[
                caller(
                    "gateway",
                    "gateway-token-0123456",
                    &[Scope::Reserve, Scope::Read, Scope::Pay],
                ),
                caller("ctl", "ctl-token-0123456789", &[Scope::Admin]),
            ],
        )
    }

    const RESERVE: &str = "/seckill.v1.StockService/Reserve";
    const PUBLISH: &str = "/seckill.v1.AdminService/PublishActivity";

    #[test]
    fn the_right_token_passes_with_or_without_the_bearer_prefix() {
        let c = callers();
        assert_eq!(
            &*c.authorize(Some(b"Bearer gateway-token-0123456"), RESERVE)
                .unwrap(),
            "gateway"
        );
        assert!(c.authorize(Some(b"gateway-token-0123456"), RESERVE).is_ok());
        assert_eq!(
            &*c.authorize(Some(b"dev-shortcut"), PUBLISH).unwrap(),
            "service"
        );
    }

    #[test]
    fn a_missing_or_unknown_token_is_unauthenticated_and_marked() {
        let c = callers();
        for value in [
            None,
            Some(&b"Bearer nope"[..]),
            Some(b"Bearer gateway-token-01234567"),
            Some(b""),
        ] {
            let err = c.authorize(value, RESERVE).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}");
            assert!(is_service_token_refusal(&err), "{value:?}");
        }
    }

    #[test]
    fn a_caller_without_the_scope_is_denied_and_told_which() {
        let c = callers();
        let err = c
            .authorize(Some(b"Bearer gateway-token-0123456"), PUBLISH)
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("\"admin\""), "{}", err.message());
        assert!(err.message().contains("gateway"), "{}", err.message());
        assert!(is_service_token_refusal(&err));
        let err = c
            .authorize(Some(b"Bearer ctl-token-0123456789"), RESERVE)
            .unwrap_err();
        assert!(err.message().contains("\"reserve\""), "{}", err.message());
    }

    #[test]
    fn another_unauthenticated_is_not_a_service_token_refusal() {
        assert!(!is_service_token_refusal(&Status::unauthenticated(
            "bad service token signature"
        )));
        assert!(!is_service_token_refusal(&Status::permission_denied(
            "not your order"
        )));
    }

    #[test]
    fn every_rpc_of_the_contract_has_its_scope_and_an_unknown_path_needs_admin() {
        let fds = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).unwrap();
        let mut seen = Vec::new();
        for f in &fds.file {
            for s in &f.service {
                for m in &s.method {
                    let path = format!("/{}.{}/{}", f.package(), s.name(), m.name());
                    seen.push((path.clone(), method_scope(&path)));
                }
            }
        }
        // The whole table, so that a new RPC shows here and gets a deliberate scope.
        let want = [
            ("/seckill.v1.StockService/Reserve", Scope::Reserve),
            ("/seckill.v1.StockService/ReserveBatch", Scope::Reserve),
            ("/seckill.v1.StockService/ReserveStream", Scope::Reserve),
            ("/seckill.v1.StockService/Release", Scope::Reserve),
            ("/seckill.v1.StockService/GetStock", Scope::Read),
            ("/seckill.v1.OrderService/GetOrder", Scope::Read),
            ("/seckill.v1.OrderService/WatchOrder", Scope::Read),
            ("/seckill.v1.OrderService/ListOrders", Scope::Read),
            ("/seckill.v1.OrderService/Pay", Scope::Pay),
            ("/seckill.v1.OrderService/Cancel", Scope::Pay),
            ("/seckill.v1.OrderService/PaymentCallback", Scope::Pay),
        ];
        for (path, scope) in &seen {
            let expected = want
                .iter()
                .find(|(p, _)| p == path)
                .map_or(Scope::Admin, |(_, s)| *s);
            assert_eq!(*scope, expected, "{path}");
        }
        assert_eq!(
            seen.iter().filter(|(_, s)| *s != Scope::Admin).count(),
            want.len()
        );
        assert!(seen
            .iter()
            .any(|(p, s)| p.contains("AdminService") && *s == Scope::Admin));
        assert_eq!(method_scope("/x.Y/Z"), Scope::Admin);
        assert_eq!(method_scope(""), Scope::Admin);
    }

    #[test]
    fn caller_lists_are_checked_naming_the_field() {
        let ok = caller("gw", "a-token-of-16-bytes", &[Scope::Read]);
        assert!(check_callers("", std::slice::from_ref(&ok)).is_ok());
        assert!(check_callers("dev", &[]).is_ok());
        assert_eq!(check_callers("", &[]).unwrap_err().0, "grpc.callers");
        assert_eq!(
            check_callers("has space", &[]).unwrap_err().0,
            "grpc.service_token"
        );
        let bad = |c: CallerConfig| check_callers("", &[ok.clone(), c]).unwrap_err().0;
        assert_eq!(
            bad(caller("gw", "another-token-16b", &[Scope::Read])),
            "grpc.callers[1].name"
        );
        assert_eq!(
            bad(caller("b c", "another-token-16b", &[Scope::Read])),
            "grpc.callers[1].name"
        );
        assert_eq!(
            bad(caller("x", "short", &[Scope::Read])),
            "grpc.callers[1].token"
        );
        assert_eq!(
            bad(caller("x", "a-token-of-16-bytes", &[Scope::Read])),
            "grpc.callers[1].token"
        );
        assert_eq!(
            bad(caller("x", "another-token-16b", &[])),
            "grpc.callers[1].scopes"
        );
    }

    #[test]
    fn a_caller_config_never_shows_its_token() {
        let c = caller("gw", "a-token-of-16-bytes", &[Scope::Read]);
        assert!(!format!("{c:?}").contains("a-token"));
        assert!(!format!("{:?}", Callers::new("", &[c])).contains("a-token"));
    }

    #[test]
    fn the_client_interceptor_attaches_what_the_server_expects() {
        let mut attach = AttachToken::new("gateway-token-0123456").unwrap();
        let req = attach.call(Request::new(())).unwrap();
        let v = req.metadata().get(HEADER).map(|v| v.as_bytes());
        assert!(callers().authorize(v, RESERVE).is_ok());
    }
}

//! Service tokens for internal RPCs.
//!
//! Every internal RPC carries `authorization: Bearer <token>` (the token comes from
//! config). [`ServiceToken`] is the server-side interceptor: it refuses a missing or
//! wrong token with `UNAUTHENTICATED`. Health and reflection are added without it, so
//! probes and ghz's reflection lookup work without a token. [`AttachToken`] is the
//! client-side twin that adds the header to every call.

use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Metadata key carrying the token.
pub const HEADER: &str = "authorization";

/// Metadata key set on the refusal of a missing or wrong service token, so a caller
/// tells "our own credentials are wrong" (an operator's problem: 503 at the edge)
/// from a daemon's UNAUTHENTICATED about the request itself (e.g. a payment
/// callback's bad signature: the caller's 4xx) by [`is_service_token_refusal`], not
/// by reading the message.
pub const REFUSAL_HEADER: &str = "seckill-refusal";
const REFUSAL_SERVICE_TOKEN: &str = "service-token";

/// True when `status` is [`ServiceToken`]'s refusal.
pub fn is_service_token_refusal(status: &Status) -> bool {
    status
        .metadata()
        .get(REFUSAL_HEADER)
        .is_some_and(|v| v.as_bytes() == REFUSAL_SERVICE_TOKEN.as_bytes())
}

fn refused(message: &'static str) -> Status {
    let mut status = Status::unauthenticated(message);
    status.metadata_mut().insert(
        REFUSAL_HEADER,
        MetadataValue::from_static(REFUSAL_SERVICE_TOKEN),
    );
    status
}

/// Server-side check of the service token.
#[derive(Clone)]
pub struct ServiceToken {
    expected: std::sync::Arc<[u8]>,
}

impl std::fmt::Debug for ServiceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceToken(..)")
    }
}

impl ServiceToken {
    /// `token` must be non-empty; config validation enforces that.
    pub fn new(token: &str) -> Self {
        Self {
            expected: token.as_bytes().into(),
        }
    }

    fn check(&self, presented: Option<&MetadataValue<Ascii>>) -> Result<(), Status> {
        let Some(value) = presented else {
            return Err(refused("missing service token"));
        };
        let raw = value.as_bytes();
        let token = raw.strip_prefix(b"Bearer ").unwrap_or(raw);
        if token.ct_eq(&self.expected).into() {
            Ok(())
        } else {
            Err(refused("invalid service token"))
        }
    }
}

impl Interceptor for ServiceToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(req.metadata().get(HEADER))?;
        Ok(req)
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

    fn request_with(value: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        if let Some(v) = value {
            req.metadata_mut().insert(HEADER, v.parse().unwrap());
        }
        req
    }

    #[test]
    fn the_right_token_passes_with_or_without_the_bearer_prefix() {
        let mut check = ServiceToken::new("s3cret");
        assert!(check.call(request_with(Some("Bearer s3cret"))).is_ok());
        assert!(check.call(request_with(Some("s3cret"))).is_ok());
    }

    #[test]
    fn a_missing_or_wrong_token_is_unauthenticated() {
        let mut check = ServiceToken::new("s3cret");
        for value in [None, Some("Bearer nope"), Some("Bearer s3cret2"), Some("")] {
            let err = check.call(request_with(value)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}");
            assert!(is_service_token_refusal(&err), "{value:?}");
        }
    }

    #[test]
    fn another_unauthenticated_is_not_a_service_token_refusal() {
        assert!(!is_service_token_refusal(&Status::unauthenticated(
            "bad service token signature"
        )));
    }

    #[test]
    fn the_client_interceptor_attaches_what_the_server_expects() {
        let mut attach = AttachToken::new("s3cret").unwrap();
        let req = attach.call(Request::new(())).unwrap();
        assert!(ServiceToken::new("s3cret").call(req).is_ok());
    }
}

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
            return Err(Status::unauthenticated("missing service token"));
        };
        let raw = value.as_bytes();
        let token = raw.strip_prefix(b"Bearer ").unwrap_or(raw);
        if token.ct_eq(&self.expected).into() {
            Ok(())
        } else {
            Err(Status::unauthenticated("invalid service token"))
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
        }
    }

    #[test]
    fn the_client_interceptor_attaches_what_the_server_expects() {
        let mut attach = AttachToken::new("s3cret").unwrap();
        let req = attach.call(Request::new(())).unwrap();
        assert!(ServiceToken::new("s3cret").call(req).is_ok());
    }
}

//! stockd's one error type and its one mapping to gRPC statuses. Business outcomes
//! (sold out, duplicate, not started, ...) are not errors: they are enums in
//! [`crate::stock`]. Internals (Redis and MySQL messages) stay in the logs.

use tonic::Status;

/// Everything that can stop a stockd call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed input; `field` names the request field.
    #[error("{field}: {problem}")]
    InvalidArgument { field: String, problem: String },
    /// No such activity (or item).
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the state forbids it (publishing an ended window).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Redis state is being rebuilt, or not loaded yet.
    #[error("{0}")]
    Unavailable(String),
    /// Concurrent buyers took the units this call gathered, and it ran out of attempts
    /// while units remain: retry with the same request id. `ABORTED`, not
    /// `UNAVAILABLE`: this stockd is healthy, and a caller that marks an endpoint down
    /// on `UNAVAILABLE` (the gateway's fleet) must not do so for contention.
    #[error("{0}")]
    Contended(String),
    /// A Redis command failed or ran out of time.
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    /// A Redis command ran past `redis.timeout_ms`.
    #[error("redis call timed out after {0} ms")]
    RedisTimeout(u64),
    /// MySQL failed.
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    /// A script answered something outside its contract.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// The same failure for another caller of a shared Redis call (one call answers
    /// several reservations). MySQL errors do not occur there and become UNAVAILABLE.
    pub fn replicate(&self) -> Error {
        match self {
            Error::InvalidArgument { field, problem } => Error::InvalidArgument {
                field: field.clone(),
                problem: problem.clone(),
            },
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(m.clone()),
            Error::Unavailable(m) => Error::Unavailable(m.clone()),
            Error::Contended(m) => Error::Contended(m.clone()),
            Error::Redis(e) => Error::Redis(e.clone()),
            Error::RedisTimeout(ms) => Error::RedisTimeout(*ms),
            Error::Db(e) => Error::Unavailable(format!("mysql: {e}")),
            Error::Internal(m) => Error::Internal(m.clone()),
        }
    }
}

/// Shorthand for [`Error::InvalidArgument`].
pub fn invalid(field: &str, problem: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: field.to_string(),
        problem: problem.into(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        match e {
            Error::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
            Error::NotFound(m) => Status::not_found(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::Contended(m) => Status::aborted(m),
            Error::Redis(err) => {
                tracing::warn!(error = %err, "redis error");
                Status::unavailable("stock store (redis) unavailable")
            }
            Error::RedisTimeout(ms) => {
                Status::unavailable(format!("stock store (redis) did not answer within {ms} ms"))
            }
            Error::Db(err) => {
                tracing::warn!(error = %err, "mysql error");
                Status::unavailable("database (mysql) unavailable")
            }
            Error::Internal(m) => {
                tracing::error!(problem = %m, "internal error");
                Status::internal("internal error")
            }
        }
    }
}

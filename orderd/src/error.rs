//! orderd's one error type and its one mapping to gRPC status codes.
//!
//! Business outcomes (applied, already, conflict; sold out after all) are enums in
//! [`crate::model`], not errors. Messages of infrastructure failures stay in the logs:
//! the status says only "unavailable" or "internal".

/// Everything that can fail in a request or a background loop.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input: the field and what is wrong with it.
    #[error("{field}: {problem}")]
    InvalidArgument {
        field: &'static str,
        problem: String,
    },
    /// No such order (or dead letter).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The order belongs to another user.
    #[error("the order belongs to another user")]
    PermissionDenied,
    /// A payment callback whose signature does not match.
    #[error("signature: does not match")]
    BadSignature,
    /// A provider reference already used for another order.
    #[error("provider_ref: already used for another order")]
    ReplayedCallback,
    /// A request the current configuration refuses (dev payment disabled).
    #[error("{0}")]
    FailedPrecondition(&'static str),
    /// MySQL failed (down, timed out, refused).
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] fred::error::Error),
    /// The activity is placed on a Redis cluster this orderd has no
    /// `[redis.clusters.<name>]` for.
    #[error("activity {activity} is on Redis cluster `{cluster}`, which is not configured here")]
    UnknownCluster { activity: u64, cluster: String },
    /// A stock return met its shard closed for a rebuild (no fence); tried again later.
    #[error("the shard of {0} is closed for a rebuild; the return waits for the reopen")]
    ShardClosed(String),
    /// A stock return the master made but fewer than `redis.replica_acks` replicas
    /// acknowledged in time; released again later (idempotent).
    #[error("the return of {0} is not yet held by a replica; it is released again next pass")]
    Unreplicated(String),
    /// A bug or an impossible state.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// MySQL chose this transaction as a deadlock's victim (SQLSTATE 40001, error
    /// 1213) and rolled all of it back: running it again from the start is safe.
    pub fn is_deadlock(&self) -> bool {
        match self {
            Error::Db(e) => e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "40001"),
            _ => false,
        }
    }

    /// Redis answered `NOGROUP`: the stream or its consumer group is gone, as after
    /// Redis lost its data (a restart without it, a flush); the reserve script's
    /// `XADD` recreates the stream without the group.
    pub fn is_no_group(&self) -> bool {
        matches!(self, Error::Redis(e) if e.details().contains("NOGROUP"))
    }

    pub fn invalid(field: &'static str, problem: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            problem: problem.into(),
        }
    }
}

/// Result of orderd operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument { .. } => tonic::Status::invalid_argument(e.to_string()),
            Error::NotFound(_) => tonic::Status::not_found(e.to_string()),
            Error::PermissionDenied => tonic::Status::permission_denied(e.to_string()),
            Error::BadSignature => tonic::Status::unauthenticated(e.to_string()),
            Error::ReplayedCallback => tonic::Status::already_exists(e.to_string()),
            Error::FailedPrecondition(_) => tonic::Status::failed_precondition(e.to_string()),
            Error::Db(err) => {
                tracing::warn!(error = %err, "mysql error answered as UNAVAILABLE");
                tonic::Status::unavailable("the order database is unavailable; retry")
            }
            Error::Redis(err) => {
                tracing::warn!(error = %err, "redis error answered as UNAVAILABLE");
                tonic::Status::unavailable("redis is unavailable; retry")
            }
            Error::ShardClosed(_) | Error::Unreplicated(_) => {
                tonic::Status::unavailable(e.to_string())
            }
            Error::UnknownCluster { .. } => {
                tracing::warn!(error = %e, "answered as UNAVAILABLE");
                tonic::Status::unavailable("the activity's stock is not reachable from here; retry")
            }
            Error::Internal(msg) => {
                tracing::error!(%msg, "internal error");
                tonic::Status::internal("internal error")
            }
        }
    }
}

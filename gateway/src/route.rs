//! The routing core's own terms: the request it serves ([`RouteRequest`]) and why it
//! could not ([`RouteError`]), knowing nothing of HTTP or of any API dialect. The edge
//! parses each dialect into a `RouteRequest` and maps each `RouteError` to the status
//! and body its dialect speaks (`crate::api::error`); the core decides on the variant (a
//! busy request waits for a turn: `dispatch/drive.rs`), never on a string.

use std::time::Duration;

use sharemesh_protocol::{NanoUsd, Prompt, Sampling, Tier};

/// One request as the routing core serves it, whichever API dialect it came in: the
/// edge (`openai`, `anthropic`, `responses`) parses its body into this.
#[derive(Clone, Debug)]
pub struct RouteRequest {
    /// A catalog name or a model id.
    pub model: String,
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub routing: RoutingOptions,
}

/// Per-request routing options: the `sharemesh` body object or `x-sharemesh-*` headers.
#[derive(Clone, Debug, Default)]
pub struct RoutingOptions {
    pub max_price_per_token: Option<NanoUsd>,
    pub tier: Option<Tier>,
    pub region: Option<String>,
    pub min_vram_bytes: Option<u64>,
    pub interruptible: bool,
    /// Gold only: start on the two best providers and keep the first to answer.
    pub hedge: Option<bool>,
}

/// Why the routing core could not serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The request itself is wrong (a size, a range, a prompt longer than the model's
    /// context, a format the vocabulary cannot follow); `param` names the field.
    #[error("{message}")]
    Invalid { param: String, message: String },
    /// Nobody offers the model now, or the name is not a catalog name or model id.
    #[error("the model `{model}` is not offered on the network now: use a catalog name or a model id (see GET /v1/models)")]
    ModelNotFound { model: String },
    /// No provider can serve the request within its constraints, or every one asked
    /// declined or failed before accepting it.
    #[error("{0}")]
    NoProvider(String),
    /// Every provider that could serve it is at capacity (or held on credit) now; worth
    /// retrying after `retry_after`.
    #[error("{message}")]
    Busy {
        message: String,
        retry_after: Duration,
    },
    /// The worst case of the request does not fit a budget.
    #[error("{0}")]
    OverBudget(String),
    /// A provider accepted the request and the stream then failed with no provider
    /// left to continue it.
    #[error("{0}")]
    Upstream(String),
    /// This gateway's own state failed (its ledger could not be read, a lock was
    /// poisoned): nothing the client or a provider did.
    #[error("{0}")]
    Internal(String),
}

/// How long a client is told to wait before retrying a busy request (the SDKs honour
/// `Retry-After`).
pub const BUSY_RETRY_AFTER: Duration = Duration::from_secs(5);

impl RouteError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            param: param.to_owned(),
            message: message.into(),
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::ModelNotFound {
            model: model.to_owned(),
        }
    }

    pub fn busy(message: impl Into<String>) -> Self {
        Self::Busy {
            message: message.into(),
            retry_after: BUSY_RETRY_AFTER,
        }
    }

    /// A request the protocol would refuse (sizes, ranges), answered before any
    /// provider is asked.
    pub fn from_validation(err: sharemesh_protocol::ValidationError) -> Self {
        match &err {
            sharemesh_protocol::ValidationError::Field { field, .. } => {
                Self::invalid(field, err.to_string())
            }
            _ => Self::invalid("request", err.to_string()),
        }
    }

    /// The same error with `more` added to its message (a busy request that waited in
    /// vain says why it stopped waiting).
    pub fn with_detail(self, more: impl std::fmt::Display) -> Self {
        let add = |message: String| format!("{message}; {more}");
        match self {
            Self::Invalid { param, message } => Self::Invalid {
                param,
                message: add(message),
            },
            Self::ModelNotFound { model } => Self::ModelNotFound { model },
            Self::NoProvider(m) => Self::NoProvider(add(m)),
            Self::Busy {
                message,
                retry_after,
            } => Self::Busy {
                message: add(message),
                retry_after,
            },
            Self::OverBudget(m) => Self::OverBudget(add(m)),
            Self::Upstream(m) => Self::Upstream(add(m)),
            Self::Internal(m) => Self::Internal(add(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_error_keeps_its_kind_when_it_says_more() {
        let err = RouteError::busy("all 2 providers at capacity").with_detail("waited 30 s");
        assert_eq!(
            err,
            RouteError::Busy {
                message: "all 2 providers at capacity; waited 30 s".into(),
                retry_after: BUSY_RETRY_AFTER,
            }
        );
        assert_eq!(err.to_string(), "all 2 providers at capacity; waited 30 s");
    }

    #[test]
    fn validation_errors_name_their_field() {
        let err = RouteError::from_validation(sharemesh_protocol::ValidationError::Field {
            field: "max_tokens",
            reason: "must be at least 1".into(),
        });
        assert!(matches!(err, RouteError::Invalid { ref param, .. } if param == "max_tokens"));
    }
}

//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
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

    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_owned()),
            code: None,
        }
    }

    pub fn bad_json(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{model}` is not offered on the network now: use a catalog name or a model id (see GET /v1/models)"
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    pub fn no_provider(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("no_provider_available"),
        }
    }

    /// Every provider that could serve the request is at capacity now (it waits for a
    /// turn first: `waiting.rs`).
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some(BUSY),
        }
    }

    /// Whether the request failed only because providers were at capacity.
    pub fn is_busy(&self) -> bool {
        self.code == Some(BUSY)
    }

    /// A route this node does not serve in its role (a provider's view on a node that
    /// provides nothing, an account view on a node without a ledger).
    pub fn not_here(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn upstream(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("provider_failed"),
        }
    }

    pub fn insufficient_balance(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYMENT_REQUIRED,
            message: message.into(),
            kind: "insufficient_quota",
            param: None,
            code: Some("insufficient_balance"),
        }
    }

    pub fn unauthorized(code: &'static str, message: &str) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: "permission_error",
            param: None,
            code: Some(code),
        }
    }

    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

const BUSY: &str = "providers_busy";

/// Seconds a client is told to wait before retrying a 503 (the SDKs honour it).
pub const RETRY_AFTER_SECS: u64 = 5;

/// `response` with `Retry-After` when it is a 503: capacity may free, providers may
/// come back, so the client should try again later, not give up.
pub fn with_retry_after(mut response: Response) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(RETRY_AFTER_SECS),
        );
    }
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        with_retry_after((self.status, Json(self.body())).into_response())
    }
}

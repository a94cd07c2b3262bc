//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::route::RouteError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// How long a client should wait before retrying, where the routing core said
    /// (a busy request); other 503s get [`crate::route::BUSY_RETRY_AFTER`].
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        RouteError::invalid(param, message).into()
    }

    pub fn bad_json(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        RouteError::model_not_found(model).into()
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
            retry_after: None,
        }
    }

    pub fn upstream(message: impl Into<String>) -> Self {
        RouteError::Upstream(message.into()).into()
    }

    pub fn unauthorized(code: &'static str, message: &str) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
            retry_after: None,
        }
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: "permission_error",
            param: None,
            code: Some(code),
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
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

/// Seconds a client is told to wait before retrying a 503 (the SDKs honour it).
pub const RETRY_AFTER_SECS: u64 = crate::route::BUSY_RETRY_AFTER.as_secs();

/// `response` with `Retry-After` when it is a 503 (`retry_after`, else
/// [`RETRY_AFTER_SECS`]): capacity may free, providers may come back, so the client
/// should try again later, not give up.
pub fn with_retry_after(
    mut response: Response,
    retry_after: Option<std::time::Duration>,
) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        let seconds = retry_after.map_or(RETRY_AFTER_SECS, |wait| wait.as_secs().max(1));
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from(seconds),
        );
    }
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = self.retry_after;
        with_retry_after(
            (self.status, Json(self.body())).into_response(),
            retry_after,
        )
    }
}

impl From<RouteError> for ApiError {
    /// The routing core's outcome in OpenAI's error shape (the Anthropic and Responses
    /// edges re-shape this one).
    fn from(err: RouteError) -> Self {
        let message = err.to_string();
        let retry_after = match &err {
            RouteError::Busy { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        let (status, kind, param, code) = match err {
            RouteError::Invalid { param, .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some(param),
                None,
            ),
            RouteError::ModelNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model".to_owned()),
                Some("model_not_found"),
            ),
            RouteError::NoProvider(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("no_provider_available"),
            ),
            RouteError::Busy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("providers_busy"),
            ),
            RouteError::OverBudget(_) => (
                StatusCode::PAYMENT_REQUIRED,
                "insufficient_quota",
                None,
                Some("insufficient_balance"),
            ),
            RouteError::Upstream(_) => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                None,
                Some("provider_failed"),
            ),
            RouteError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                Some("internal_error"),
            ),
        };
        Self {
            status,
            message,
            kind,
            param,
            code,
            retry_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_error_has_its_status_and_code() {
        let cases = [
            (RouteError::invalid("stop", "bad"), 400, None),
            (
                RouteError::model_not_found("m"),
                404,
                Some("model_not_found"),
            ),
            (
                RouteError::NoProvider("none".into()),
                503,
                Some("no_provider_available"),
            ),
            (RouteError::busy("full"), 503, Some("providers_busy")),
            (
                RouteError::OverBudget("spent".into()),
                402,
                Some("insufficient_balance"),
            ),
            (
                RouteError::Upstream("gone".into()),
                502,
                Some("provider_failed"),
            ),
            (
                RouteError::Internal("ledger".into()),
                500,
                Some("internal_error"),
            ),
        ];
        for (err, status, code) in cases {
            let message = err.to_string();
            let answered = ApiError::from(err);
            assert_eq!(answered.status.as_u16(), status, "{message}");
            assert_eq!(answered.code, code, "{message}");
            assert_eq!(answered.message, message);
        }
        let invalid = ApiError::from(RouteError::invalid("stop", "bad"));
        assert_eq!(invalid.param.as_deref(), Some("stop"));
        let busy = ApiError::from(RouteError::busy("full")).into_response();
        assert_eq!(busy.headers()["retry-after"], "5");
        // The wait the core names is the one the client is told.
        let later = RouteError::Busy {
            message: "full".into(),
            retry_after: std::time::Duration::from_secs(12),
        };
        let later = ApiError::from(later).into_response();
        assert_eq!(later.headers()["retry-after"], "12");
    }
}

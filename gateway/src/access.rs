//! Who may call the node's HTTP API. One guard in front of every route:
//!
//! - On a loopback listener, a request whose `Host` is not a loopback name is refused
//!   (a DNS-rebinding page reaches 127.0.0.1 under its own host name), and so is one
//!   whose `Origin` is another site (a page the buyer visits cannot spend its money).
//!   Clients that send no `Origin` (SDKs, curl) are not browsers' cross-site requests.
//! - When keys are required (always off loopback), every route but `/health` needs a
//!   valid key — the OpenAI routes, the account and network views alike — and the
//!   routes that change the node need an admin key.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::error::ApiError;
use crate::keys::KeyCheck;

/// Routes that change the node (an admin key when keys are required).
pub const ADMIN_PATHS: &[&str] = &["/v1/network/block", "/v1/network/unblock"];

/// Routes anyone who can reach the listener may call.
pub const OPEN_PATHS: &[&str] = &["/health", "/", "/console"];

#[derive(Clone, Debug, Default)]
pub struct Access {
    pub keys: KeyCheck,
    /// The listener is bound to loopback: check `Host` and `Origin`.
    pub loopback: bool,
}

/// The middleware: see the module's text.
pub async fn guard(State(access): State<Access>, mut request: Request, next: Next) -> Response {
    // Anthropic's routes answer in Anthropic's error shape.
    let anthropic = request.uri().path().starts_with("/v1/messages");
    let refuse = |err: ApiError| {
        if anthropic {
            crate::api::anthropic::error_response(&err)
        } else {
            err.into_response()
        }
    };
    if access.loopback {
        if let Err(refused) = check_local(request.headers()) {
            return refuse(refused);
        }
    }
    let path = request.uri().path();
    if OPEN_PATHS.contains(&path) || !access.keys.is_required() {
        return next.run(request).await;
    }
    let admin_route = ADMIN_PATHS.contains(&path);
    let record = match presented_key(request.headers()) {
        None => {
            return refuse(ApiError::unauthorized(
                "missing_api_key",
                "an API key is required (Authorization: Bearer sk-sm-… or x-api-key: sk-sm-…)",
            ))
        }
        Some(key) => match access.keys.identify(key) {
            Some(record) => record,
            None => {
                return refuse(ApiError::unauthorized(
                    "invalid_api_key",
                    "the API key is not valid or was revoked",
                ))
            }
        },
    };
    if admin_route && !record.admin {
        return refuse(ApiError::forbidden(
            "admin_key_required",
            format!(
                "{path} changes the node: it needs an admin key (`sharemesh keys create --admin`)"
            ),
        ));
    }
    request.extensions_mut().insert(record);
    next.run(request).await
}

/// The key in `Authorization: Bearer …` (OpenAI's SDKs), else in `x-api-key`
/// (Anthropic's).
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let key = bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))?
        .trim();
    (!key.is_empty()).then_some(key)
}

/// `Host` must name this machine; `Origin`, when sent, must be a page of this machine.
fn check_local(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(host) = headers.get("host") {
        let host = host.to_str().unwrap_or_default();
        if !is_loopback_host(host) {
            return Err(ApiError::forbidden(
                "forbidden_host",
                format!("Host `{host}` is not this machine: the API on loopback answers only localhost names (DNS rebinding)"),
            ));
        }
    }
    if let Some(origin) = headers.get("origin") {
        let origin = origin.to_str().unwrap_or_default();
        let local = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(is_loopback_host);
        if !local {
            return Err(ApiError::forbidden(
                "forbidden_origin",
                format!("requests from pages of `{origin}` are refused: only pages served from this machine may call its API"),
            ));
        }
    }
    Ok(())
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, port)) if port.is_empty() || port.starts_with(':') => inside,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap_or_else(|e| panic!("{e}")));
        }
        map
    }

    #[test]
    fn loopback_names_only() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "127.9.9.9",
            "[::1]:80",
            "[::1]",
            "LOCALHOST:1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:80",
            "[::2]:1",
            "127.0.0.1:80:1",
            "[::1]x",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn rebinding_and_cross_site_requests_are_refused() {
        assert!(check_local(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(
            check_local(&headers(&[])).is_ok(),
            "no Host (HTTP/1.0): not a browser"
        );
        assert!(check_local(&headers(&[
            ("host", "localhost:8080"),
            ("origin", "http://localhost:3000")
        ]))
        .is_ok());
        let rebinding = check_local(&headers(&[("host", "attacker.example:8080")])).unwrap_err();
        assert_eq!(rebinding.code, Some("forbidden_host"));
        for origin in [
            "https://attacker.example",
            "null",
            "http://127.0.0.1.attacker.example",
        ] {
            let cross = check_local(&headers(&[("host", "127.0.0.1:8080"), ("origin", origin)]))
                .unwrap_err();
            assert_eq!(cross.code, Some("forbidden_origin"), "{origin}");
        }
    }

    #[test]
    fn keys_come_from_the_bearer_header() {
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer sk-sm-1")])),
            Some("sk-sm-1")
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "Bearer ")])),
            None
        );
        assert_eq!(
            presented_key(&headers(&[("authorization", "Basic x")])),
            None
        );
        assert_eq!(presented_key(&headers(&[])), None);
        assert_eq!(
            presented_key(&headers(&[("x-api-key", "sk-sm-2")])),
            Some("sk-sm-2")
        );
    }
}

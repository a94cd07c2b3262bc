#![allow(clippy::unwrap_used)]
//! Who may call the node's HTTP API, tried with curl against the node's real router on
//! loopback, over a lab mesh (scripted engine: this is about access, not inference):
//! keys on every route but `/health`, admin keys for the routes that change the node,
//! keys that take effect without a restart, and the Host/Origin check that stops DNS
//! rebinding and cross-site pages.

use std::net::SocketAddr;
use std::process::Command;

use sharemesh_gateway::keys::{KeyCheck, KeyStore};
use sharemesh_gateway::GatewayState;
use sharemesh_lab::{GatewaySpec, Lab, ProviderSpec};
use sharemesh_node::http::{self, AppState};

/// `curl` a route; returns (status, body).
fn curl(address: SocketAddr, method: &str, path: &str, headers: &[String]) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method]);
    for header in headers {
        command.args(["-H", header]);
    }
    if method == "POST" {
        command.args([
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"peers": []}"#,
        ]);
    }
    let out = command
        .arg(format!("http://{address}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

fn bearer(key: &str) -> Vec<String> {
    vec![format!("Authorization: Bearer {key}")]
}

async fn serve(lab: &Lab, keys: KeyCheck) -> SocketAddr {
    let state = AppState::new(lab.gateway_mesh.clone(), None);
    let gateway = GatewayState {
        dispatcher: lab.gateway.clone(),
    };
    http::serve("127.0.0.1:0".parse().unwrap(), state, Some(gateway), keys)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_key_and_changes_need_an_admin_key() {
    let lab = Lab::start(vec![ProviderSpec::default()], GatewaySpec::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut store = KeyStore::open(dir.path()).unwrap();
    let (_, user) = store.create("user").unwrap();
    let (_, admin) = store.create_admin("ops").unwrap();
    let address = serve(&lab, KeyCheck::open(dir.path()).unwrap()).await;
    let routes = [
        ("GET", "/v1/models"),
        ("GET", "/v1/network/providers"),
        ("GET", "/v1/network/peers"),
        ("GET", "/v1/account/spend"),
        ("GET", "/v1/account/earnings"),
        ("GET", "/v1/account/keys"),
        ("GET", "/v1/account/budgets"),
        ("GET", "/v1/network/adverts"),
        ("GET", "/v1/provider/policy"),
        ("POST", "/v1/network/block"),
        ("GET", "/metrics"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/trust"),
    ];
    for (method, path) in routes {
        let (status, body) = tokio::task::spawn_blocking(move || curl(address, method, path, &[]))
            .await
            .unwrap();
        assert_eq!(status, 401, "{method} {path} without a key: {body}");
        assert!(body.contains("missing_api_key"), "{body}");
    }
    let (status, _) = curl(address, "GET", "/health", &[]);
    assert_eq!(status, 200, "health stays open");
    // The console page holds no data (its API calls need the key).
    let (status, page) = curl(address, "GET", "/", &[]);
    assert_eq!(status, 200);
    assert!(page.contains("sharemesh console"));
    let (status, body) = curl(address, "GET", "/v1/network/providers", &bearer(&user));
    assert_eq!(status, 200, "{body}");
    let (status, body) = curl(
        address,
        "GET",
        "/v1/network/providers",
        &bearer("sk-sm-guess"),
    );
    assert_eq!(
        (status, body.contains("invalid_api_key")),
        (401, true),
        "{body}"
    );
    let (status, body) = curl(address, "POST", "/v1/network/block", &bearer(&user));
    assert_eq!(
        (status, body.contains("admin_key_required")),
        (403, true),
        "{body}"
    );
    let (status, body) = curl(address, "POST", "/v1/network/block", &bearer(&admin));
    assert_eq!(status, 200, "{body}");

    // Keys change on a running node: a revoked key stops at once, a new one works.
    store.revoke("user").unwrap();
    let (status, _) = curl(address, "GET", "/v1/models", &bearer(&user));
    assert_eq!(status, 401, "a revoked key still worked");
    let (_, later) = store.create("later").unwrap();
    let (status, body) = curl(address, "GET", "/v1/models", &bearer(&later));
    assert_eq!(status, 200, "a key created after start: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_api_refuses_rebinding_and_cross_site_requests() {
    let lab = Lab::start(vec![ProviderSpec::default()], GatewaySpec::default())
        .await
        .unwrap();
    let address = serve(&lab, KeyCheck::default()).await;
    let (status, body) = curl(address, "GET", "/v1/models", &[]);
    assert_eq!(status, 200, "no key needed on loopback: {body}");
    let (status, body) = curl(
        address,
        "GET",
        "/v1/models",
        &["Host: localhost:8080".into()],
    );
    assert_eq!(status, 200, "{body}");
    // A page on attacker.example whose name now resolves to 127.0.0.1.
    let rebinding = ["Host: attacker.example:8080".to_owned()];
    for (method, path) in [("GET", "/v1/account/spend"), ("POST", "/v1/network/block")] {
        let (status, body) = curl(address, method, path, &rebinding);
        assert_eq!(
            (status, body.contains("forbidden_host")),
            (403, true),
            "{path}: {body}"
        );
    }
    // A page on another site posting to the buyer's own gateway.
    let cross_site = ["Origin: https://attacker.example".to_owned()];
    let (status, body) = curl(address, "POST", "/v1/network/block", &cross_site);
    assert_eq!(
        (status, body.contains("forbidden_origin")),
        (403, true),
        "{body}"
    );
    let local_page = [format!("Origin: http://{address}")];
    let (status, body) = curl(address, "GET", "/v1/models", &local_page);
    assert_eq!(status, 200, "{body}");
}

//! The researchers' tooling: the process testnet launcher (child nodes run the
//! `sharemesh` binary; a running testnet is described by `testnet.json`), network
//! namespaces with NAT routers, bounded scenarios, the in-process mesh simulation
//! (many real swarms on the memory transport), the market simulation, and the
//! `sharemesh testnet` command line. It links the mesh but not the engine.

pub mod cli;
pub mod launcher;
mod link_args;
pub mod market_sim;
pub mod netns;
pub mod progress;
pub mod scenario;
pub mod sim;
pub mod sse;
pub mod trust_sim;

pub use link_args::LinkArgs;

/// The catalog's default model, by name (the engine's catalog holds the same name; a
/// node test checks they agree). The testnet only names it: providers resolve it.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

use serde::{Deserialize, Serialize};

/// What a node of a local testnet does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    Provider,
    Gateway,
}

/// One node of a running testnet, as written to `DIR/testnet.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub role: NodeRole,
    pub pid: u32,
    pub peer_id: String,
    pub listen: Vec<String>,
    pub http: Option<String>,
    pub data_dir: String,
    /// The adversary mode of this node, if it plays one.
    pub adversary: Option<String>,
    /// The network namespace it runs in (`--netns` testnets only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// The namespace of the NAT router it sits behind (`--nat`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nat_router: Option<String>,
    /// A node whose API listens off loopback requires an API key: the (admin) key the
    /// launcher made for it (`--netns` testnets only; a local test network's key, kept
    /// in its folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

/// `DIR/testnet.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestnetFile {
    pub nodes: Vec<NodeRecord>,
    /// The namespaces and bridge of a `--netns` testnet, removed by `down`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<netns::Hosts>,
}

/// Adds `key` (if any) as the request's bearer token.
pub(crate) fn authorized(
    request: reqwest::RequestBuilder,
    key: Option<&str>,
) -> reqwest::RequestBuilder {
    match key {
        Some(key) => request.bearer_auth(key),
        None => request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testnet_file_has_the_documented_shape() {
        let file = TestnetFile {
            nodes: vec![NodeRecord {
                role: NodeRole::Provider,
                pid: 42,
                peer_id: "12D3KooW".into(),
                listen: vec!["/ip4/127.0.0.1/tcp/4001".into()],
                http: Some("127.0.0.1:8080".into()),
                data_dir: "/tmp/x".into(),
                adversary: None,
                netns: None,
                nat_router: None,
                api_key: None,
            }],
            hosts: None,
        };
        let json = serde_json::to_value(&file).unwrap_or_default();
        assert_eq!(json["nodes"][0]["role"], "provider");
        assert_eq!(json["nodes"][0]["adversary"], serde_json::Value::Null);
        assert_eq!(json["nodes"][0]["http"], "127.0.0.1:8080");
    }
}

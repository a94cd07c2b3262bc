//! Local testnet launcher and scenarios for sharemesh (used by `sharemesh testnet` and
//! integration tests). The launcher starts child nodes by running the `sharemesh`
//! binary; its description of a running testnet is `testnet.json`.

pub mod launcher;
pub mod market_sim;
pub mod netns;

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
    /// A gateway off loopback requires an API key: the one the launcher made for it
    /// (`--netns` testnets only; a local test network's key, kept in its folder).
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

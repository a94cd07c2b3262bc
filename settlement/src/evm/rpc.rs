//! A small Ethereum JSON-RPC client over the workspace's reqwest: the few methods the
//! escrow needs, each answer bounded and parsed into a type.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alloy_primitives::{Address, Bytes, B256, U256};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// Largest JSON-RPC answer read (a receipt with the escrow's few logs is a few KiB).
const MAX_RESPONSE_BYTES: usize = 4 << 20;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("chain RPC {method}: {source}")]
    Transport {
        method: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("chain RPC {method}: answer over {MAX_RESPONSE_BYTES} bytes")]
    TooLarge { method: &'static str },
    #[error("chain RPC {method}: error {code}: {message}")]
    Node {
        method: &'static str,
        code: i64,
        message: String,
        /// Revert data, where the node returned some.
        data: Option<Bytes>,
    },
    #[error("chain RPC {method}: unreadable answer: {detail}")]
    Malformed {
        method: &'static str,
        detail: String,
    },
}

impl RpcError {
    /// The revert data of a call or estimate that reverted.
    pub fn revert_data(&self) -> Option<&Bytes> {
        match self {
            RpcError::Node { data, .. } => data.as_ref(),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i64,
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<ErrorObject>,
}

/// A mined transaction's outcome, as the escrow reads it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TxReceipt {
    pub transaction_hash: B256,
    pub status: Option<U256>,
    #[serde(default)]
    pub contract_address: Option<Address>,
    #[serde(default)]
    pub logs: Vec<Log>,
}

impl TxReceipt {
    pub fn succeeded(&self) -> bool {
        self.status == Some(U256::from(1u8))
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Log {
    pub address: Address,
    pub topics: Vec<B256>,
    pub data: Bytes,
}

pub struct Rpc {
    http: reqwest::Client,
    url: reqwest::Url,
    next_id: AtomicU64,
}

impl Rpc {
    pub fn new(url: reqwest::Url) -> Result<Self, RpcError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|source| RpcError::Transport {
                method: "connect",
                source,
            })?;
        Ok(Rpc {
            http,
            url,
            next_id: AtomicU64::new(1),
        })
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    pub async fn request<T: DeserializeOwned>(
        &self,
        method: &'static str,
        params: Value,
    ) -> Result<T, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let transport = |source| RpcError::Transport { method, source };
        let mut response = self
            .http
            .post(self.url.clone())
            .json(&body)
            .send()
            .await
            .map_err(transport)?;
        let mut text = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if text.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(RpcError::TooLarge { method });
            }
            text.extend_from_slice(&chunk);
        }
        let malformed = |detail: String| RpcError::Malformed { method, detail };
        let envelope: Envelope =
            serde_json::from_slice(&text).map_err(|e| malformed(e.to_string()))?;
        if let Some(error) = envelope.error {
            let data = error
                .data
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|hex| hex.parse::<Bytes>().ok());
            return Err(RpcError::Node {
                method,
                code: error.code,
                message: error.message,
                data,
            });
        }
        let result = envelope.result.unwrap_or(Value::Null);
        serde_json::from_value(result).map_err(|e| malformed(e.to_string()))
    }

    pub async fn chain_id(&self) -> Result<u64, RpcError> {
        let id: U256 = self.request("eth_chainId", json!([])).await?;
        u64::try_from(id).map_err(|_| RpcError::Malformed {
            method: "eth_chainId",
            detail: format!("chain id {id} is over 64 bits"),
        })
    }

    pub async fn code(&self, address: Address) -> Result<Bytes, RpcError> {
        self.request("eth_getCode", json!([address, "latest"]))
            .await
    }

    pub async fn nonce(&self, address: Address) -> Result<u64, RpcError> {
        let nonce: U256 = self
            .request("eth_getTransactionCount", json!([address, "pending"]))
            .await?;
        u64::try_from(nonce).map_err(|_| RpcError::Malformed {
            method: "eth_getTransactionCount",
            detail: format!("nonce {nonce} is over 64 bits"),
        })
    }

    /// Reverts come back as [`RpcError::Node`] with the revert data.
    pub async fn estimate_gas(
        &self,
        from: Address,
        to: Option<Address>,
        input: &Bytes,
    ) -> Result<u64, RpcError> {
        let gas: U256 = self
            .request(
                "eth_estimateGas",
                // `input` and `data` both: older nodes read only `data`.
                json!([{"from": from, "to": to, "input": input, "data": input}]),
            )
            .await?;
        u64::try_from(gas).map_err(|_| RpcError::Malformed {
            method: "eth_estimateGas",
            detail: format!("gas {gas} is over 64 bits"),
        })
    }

    pub async fn call(&self, to: Address, input: &Bytes) -> Result<Bytes, RpcError> {
        self.request(
            "eth_call",
            json!([{"to": to, "input": input, "data": input}, "latest"]),
        )
        .await
    }

    /// The next block's base fee (from the latest block) and a priority fee.
    pub async fn fees(&self) -> Result<(u128, u128), RpcError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Block {
            base_fee_per_gas: Option<U256>,
        }
        let block: Block = self
            .request("eth_getBlockByNumber", json!(["latest", false]))
            .await?;
        let priority: U256 = self.request("eth_maxPriorityFeePerGas", json!([])).await?;
        let fee = |value: U256, method| {
            u128::try_from(value).map_err(|_| RpcError::Malformed {
                method,
                detail: format!("fee {value} is over 128 bits"),
            })
        };
        Ok((
            fee(
                block.base_fee_per_gas.unwrap_or_default(),
                "eth_getBlockByNumber",
            )?,
            fee(priority, "eth_maxPriorityFeePerGas")?,
        ))
    }

    pub async fn send_raw(&self, raw: Bytes) -> Result<B256, RpcError> {
        self.request("eth_sendRawTransaction", json!([raw])).await
    }

    pub async fn receipt(&self, hash: B256) -> Result<Option<TxReceipt>, RpcError> {
        self.request("eth_getTransactionReceipt", json!([hash]))
            .await
    }
}

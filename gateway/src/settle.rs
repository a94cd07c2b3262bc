//! The buyer side of `/sharemesh/settle/2` (SPEC §13): before its first job with a
//! provider in a run, the gateway offers its settlement binding and learns the
//! provider's account from the answer; as receipts pass the dispute window, it offers
//! each provider a new authorisation for exactly that channel's final receipts. No job
//! stream waits on a chain: the offer is signed offline and sent once per provider.

use std::sync::Arc;
use std::time::Duration;

use futures::AsyncReadExt;
use futures::AsyncWriteExt;
use prometheus_client::metrics::gauge::Gauge;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::framing::{read_frame, write_frame};
use sharemesh_mesh::{MeshHandle, SETTLE_PROTOCOL};
use sharemesh_protocol::NodeId;
use sharemesh_settlement::payer::PayerError;
use sharemesh_settlement::{Payer, TokenUnits};

/// How long an offer's round trip may take.
const OFFER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error("provider {0}: {1}")]
    Unreachable(NodeId, String),
    #[error("provider {0}: sending the offer: {1}")]
    Send(NodeId, String),
    #[error(transparent)]
    Payer(#[from] PayerError),
}

/// What a provider made of an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// It settles on this chain and escrow: its account is known now.
    OnChain,
    /// It does not (no settle protocol, or no answer for this chain and escrow).
    NotOnChain,
}

/// Offers this buyer's binding (and newest authorisation, if one is due) to `provider`;
/// `owed`: the channel's final receipts when the caller has read them (else read here).
pub async fn offer_to(
    mesh: &MeshHandle,
    payer: &Payer,
    provider: NodeId,
    owed: Option<TokenUnits>,
) -> Result<Settled, SettleError> {
    let peer = provider
        .peer_id()
        .map_err(|e| SettleError::Unreachable(provider, e.to_string()))?;
    let offer = match owed {
        Some(owed) => payer.offer_owing(&provider, Some(owed), now_ms())?,
        None => payer.offer(&provider, now_ms())?,
    };
    let mut control = mesh.control.clone();
    let stream =
        match tokio::time::timeout(OFFER_TIMEOUT, control.open_stream(peer, SETTLE_PROTOCOL)).await
        {
            Err(_) => return Err(SettleError::Unreachable(provider, "timed out".into())),
            Ok(Err(sharemesh_mesh::OpenStreamError::UnsupportedProtocol(_))) => {
                payer.answered(&provider, &offer, None, now_ms())?;
                return Ok(Settled::NotOnChain);
            }
            Ok(Err(err)) => return Err(SettleError::Unreachable(provider, err.to_string())),
            Ok(Ok(stream)) => stream,
        };
    let (mut reader, mut writer) = stream.split();
    for frame in &offer.frames {
        write_frame(&mut writer, frame)
            .await
            .map_err(|e| SettleError::Send(provider, e.to_string()))?;
    }
    // Closing our side tells the provider the offer is complete.
    let _ = writer.close().await;
    let answer = read_frame(&mut reader, OFFER_TIMEOUT).await.ok();
    payer.answered(&provider, &offer, answer.as_ref(), now_ms())?;
    Ok(if answer.is_some() {
        Settled::OnChain
    } else {
        Settled::NotOnChain
    })
}

/// The buyer's settlement gauges (`sharemesh_gateway_settlement_*`, token units).
struct PayerGauges {
    deposit: Gauge,
    authorised: Gauge,
}

impl PayerGauges {
    fn register(mesh: &MeshHandle) -> Option<Self> {
        let mut registry = mesh.metrics.as_ref()?.lock().ok()?;
        let r = registry.sub_registry_with_prefix("sharemesh_gateway_settlement");
        let gauges = PayerGauges {
            deposit: Gauge::default(),
            authorised: Gauge::default(),
        };
        r.register(
            "deposit_units",
            "This buyer's escrow deposit at the last round, in the settlement token's units",
            gauges.deposit.clone(),
        );
        r.register(
            "authorised_units",
            "What this buyer authorised its providers to redeem in all, in token units",
            gauges.authorised.clone(),
        );
        Some(gauges)
    }

    async fn show(&self, payer: &Payer) {
        let gauge = |value: u128| i64::try_from(value).unwrap_or(i64::MAX);
        if let Ok(state) = payer.escrow().account_state(payer.account()).await {
            self.deposit.set(gauge(state.balance.0));
        }
        self.authorised.set(gauge(payer.totals().authorised_units));
    }
}

/// Every `every`, offers a new authorisation to each provider whose channel's final
/// receipts grew past what was signed. Runs until the process ends.
pub async fn run_authorisations(mesh: MeshHandle, payer: Arc<Payer>, every: Duration) {
    let gauges = PayerGauges::register(&mesh);
    loop {
        if let Some(gauges) = &gauges {
            gauges.show(&payer).await;
        }
        tokio::time::sleep(every).await;
        let due = {
            let payer = payer.clone();
            tokio::task::spawn_blocking(move || payer.due(now_ms())).await
        };
        let due = match due {
            Ok(Ok(due)) => due,
            Ok(Err(err)) => {
                tracing::warn!(%err, "could not read what is owed");
                continue;
            }
            Err(_) => continue,
        };
        for (provider, owed) in due {
            match offer_to(&mesh, &payer, provider, Some(owed)).await {
                Ok(_) => tracing::info!(%provider, "sent a spending authorisation"),
                Err(err) => tracing::warn!(%err, "could not send a spending authorisation"),
            }
        }
    }
}

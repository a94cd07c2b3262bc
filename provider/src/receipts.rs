//! The provider's half of metering: reading and booking the buyer's receipts.

use std::sync::Arc;
use std::time::Duration;

use sharemesh_protocol::{JobRequest, MessageKind, NanoUsd, NodeId, Receipt, ReplayGuard};
use tokio::sync::watch;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::clock::now_ms;
use sharemesh_mesh::framing::read_frame;

use crate::stream::SentHeads;

/// Buyers that have paid this provider (a receipt booked), bounded: past the bound the
/// set starts over (the cost is one smaller window for a returning buyer).
#[derive(Clone, Default)]
pub(crate) struct PayingBuyers(Arc<std::sync::Mutex<std::collections::HashSet<NodeId>>>);

const MAX_PAYING_BUYERS: usize = 100_000;

impl PayingBuyers {
    pub(crate) fn contains(&self, buyer: &NodeId) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(buyer))
    }

    fn insert(&self, buyer: NodeId) {
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= MAX_PAYING_BUYERS && !set.contains(&buyer) {
                set.clear();
            }
            set.insert(buyer);
        }
    }
}

/// What a receipt for this job must say.
pub(super) struct Terms {
    pub provider: NodeId,
    pub price: NanoUsd,
    pub prompt_tokens: u64,
    /// The commitment heads sent: a receipt acknowledges one of them, at its count.
    pub heads: SentHeads,
    /// Where a buyer that paid is remembered.
    pub paying: PayingBuyers,
    /// Where earnings are counted.
    pub metrics: Option<Arc<crate::metrics::ProviderMetrics>>,
}

/// Reads the buyer's receipts, keeping the highest valid cumulative count.
pub(super) async fn read_receipts(
    mut reader: futures::io::ReadHalf<libp2p::Stream>,
    request: JobRequest,
    terms: Terms,
    acked: watch::Sender<u64>,
    ledger: Option<Arc<Ledger>>,
) {
    let mut replay = ReplayGuard::new(16);
    // Receipts are cumulative: what each adds over the last is earned.
    let mut earned = 0u64;
    loop {
        let envelope = match read_frame(&mut reader, Duration::from_secs(3600)).await {
            Ok(envelope) => envelope,
            Err(_) => return,
        };
        let now = now_ms();
        let Ok(opened) = envelope.open::<Receipt>(now) else {
            tracing::warn!("ignoring an invalid receipt");
            continue;
        };
        let receipt = &opened.body;
        let acknowledged = (receipt.completion_tokens, receipt.commitment);
        let consistent = receipt.job_id == request.job_id
            && receipt.buyer == request.buyer
            && receipt.provider == terms.provider
            && receipt.price_per_token == terms.price
            && receipt.prompt_tokens == terms.prompt_tokens
            && terms
                .heads
                .lock()
                .is_ok_and(|heads| heads.contains(&acknowledged));
        if !consistent
            || replay
                .admit(
                    &opened,
                    MessageKind::Receipt,
                    *request.job_id.as_bytes(),
                    now,
                )
                .is_err()
        {
            tracing::warn!("ignoring an inconsistent or replayed receipt");
            continue;
        }
        // Booked (and flushed) before it counts as acknowledged.
        if let Some(ledger) = &ledger {
            // sled flushes to disk: off the async runtime's threads.
            let (ledger, booked) = (ledger.clone(), envelope.clone());
            let recorded =
                tokio::task::spawn_blocking(move || ledger.record_receipt(&booked, None))
                    .await
                    .map_err(|err| err.to_string())
                    .and_then(|r| r.map_err(|err| err.to_string()));
            if let Err(err) = recorded {
                tracing::warn!(%err, "could not book a receipt; not counting it");
                continue;
            }
        }
        terms.paying.insert(receipt.buyer);
        if let Some(metrics) = &terms.metrics {
            metrics
                .earned_nano_usd
                .inc_by(receipt.amount.0.saturating_sub(earned));
        }
        earned = earned.max(receipt.amount.0);
        acked.send_modify(|a| *a = (*a).max(receipt.completion_tokens));
    }
}

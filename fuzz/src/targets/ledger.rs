//! Receipts offered to a real sled ledger (the bytes a provider or buyer would book).
//! Invariant: every running total equals the sum its receipts give when scanned.

use std::collections::HashMap;

use sharemesh_ledger::{month_start, Ledger, Period, SpendScope};
use sharemesh_protocol::SignedEnvelope;

use super::samples;
use crate::Target;

fn seeds() -> Vec<Vec<u8>> {
    let (buyer, other_buyer, provider) = (samples::key(1), samples::key(3), samples::key(2));
    let mut seeds = Vec::new();
    for (job, tokens, seq) in [(1u8, 4u64, 1u64), (1, 9, 2), (2, 0, 1), (3, 30, 5)] {
        for who in [&buyer, &other_buyer] {
            let receipt = samples::receipt(who, &provider, job, tokens);
            let at = samples::NOW + u64::from(job) * 86_400_000;
            if let Ok(bytes) = who
                .seal(&receipt, seq, at, 60_000)
                .and_then(|e| e.to_bytes())
            {
                seeds.push(bytes);
            }
        }
    }
    seeds
}

pub fn target() -> Target {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a folder for the ledger: {e}"));
    let mut ledger = None;
    let mut runs = 0u32;
    Target {
        name: "ledger",
        seeds,
        run: Box::new(move |input: &[u8]| {
            // A fresh ledger now and then, so histories stay short and checks cheap.
            if runs.is_multiple_of(256) {
                ledger = None;
                let path = dir.path().join(format!("ledger-{runs}"));
                ledger = Some(Ledger::open(&path).unwrap_or_else(|e| panic!("{e}")));
            }
            runs += 1;
            let Some(ledger) = &ledger else { return };
            let Ok(envelope) = SignedEnvelope::from_bytes(input) else {
                return;
            };
            let _ = ledger.record_receipt(&envelope, Some("fuzz-key"));
            let mut scanned: HashMap<(sharemesh_protocol::NodeId, u64), u64> = HashMap::new();
            for (receipt, issued) in ledger.receipts().unwrap_or_else(|e| panic!("{e}")) {
                *scanned
                    .entry((receipt.buyer, month_start(issued)))
                    .or_default() += receipt.amount.0;
            }
            for ((buyer, month), amount) in scanned {
                let total = ledger
                    .spent(SpendScope::Buyer(&buyer), Period::Month(month))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(total, amount, "running total differs from the receipts");
            }
        }),
    }
}

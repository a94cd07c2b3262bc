//! The contracts' interfaces (as `sol!` types) and their compiled code, embedded from
//! `settlement/contracts/out/` (written by `settlement/evm-tools/compile.mjs`; a test
//! recompiles and compares, so the two never drift).

use alloy_primitives::Bytes;
use alloy_sol_types::sol;
use serde::Deserialize;

// From the compiled ABIs, so the Rust side cannot drift from the contracts.
sol!(
    #[derive(Debug, PartialEq, Eq)]
    SharemeshEscrow,
    "contracts/out/SharemeshEscrow.json"
);
sol!(
    /// The devnet's stablecoin; a buyer uses its ERC-20 `approve`.
    #[derive(Debug, PartialEq, Eq)]
    TestToken,
    "contracts/out/TestToken.json"
);

pub use SharemeshEscrow::SharemeshEscrowErrors as EscrowRevert;

#[derive(Deserialize)]
struct Compiled {
    bytecode: Bytes,
}

fn bytecode(json: &str) -> Bytes {
    // The files are checked by the crate's tests (they parse and deploy); a broken one
    // is a build defect, not an input.
    let compiled: Compiled = serde_json::from_str(json).expect("embedded contract JSON parses");
    compiled.bytecode
}

pub fn escrow_bytecode() -> Bytes {
    bytecode(include_str!("../../contracts/out/SharemeshEscrow.json"))
}

pub fn test_token_bytecode() -> Bytes {
    bytecode(include_str!("../../contracts/out/TestToken.json"))
}

/// The escrow's refusal, in words.
pub fn describe(revert: &EscrowRevert) -> String {
    match revert {
        EscrowRevert::ZeroAmount(_) => "amount is zero".into(),
        EscrowRevert::TokenTransferFailed(_) => "the token refused the transfer".into(),
        EscrowRevert::NothingToWithdraw(_) => {
            "no withdrawal was requested, or nothing is left".into()
        }
        EscrowRevert::NoticeRunning(e) => {
            format!(
                "the withdrawal notice runs until unix time {}",
                e.withdrawableAt
            )
        }
        EscrowRevert::BadSignature(_) => {
            "the authorisation is not signed by the buyer for this channel, chain and escrow".into()
        }
        EscrowRevert::AlreadyRedeemed(e) => {
            format!(
                "the channel has already paid {} (an older or equal authorisation)",
                e.redeemed
            )
        }
        EscrowRevert::DepositEmpty(_) => "the buyer's deposit is empty".into(),
    }
}

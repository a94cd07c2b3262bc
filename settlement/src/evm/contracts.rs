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
    #[serde(rename = "deployedBytecode")]
    deployed_bytecode: Bytes,
    /// (offset, length) of each immutable in the deployed code.
    immutables: Vec<(usize, usize)>,
}

const ESCROW_JSON: &str = include_str!("../../contracts/out/SharemeshEscrow.json");
const TEST_TOKEN_JSON: &str = include_str!("../../contracts/out/TestToken.json");

fn compiled(json: &str) -> Compiled {
    // The files are checked by the crate's tests (they parse and deploy); a broken one
    // is a build defect, not an input.
    serde_json::from_str(json).expect("embedded contract JSON parses")
}

pub fn escrow_bytecode() -> Bytes {
    compiled(ESCROW_JSON).bytecode
}

pub fn test_token_bytecode() -> Bytes {
    compiled(TEST_TOKEN_JSON).bytecode
}

/// Whether `code` (an address's deployed code) is this escrow's, whatever token and
/// notice it was deployed with (those immutables are skipped): a look-alike contract at
/// a mistyped or phished address is refused before any money goes in.
pub fn is_escrow_code(code: &[u8]) -> bool {
    let expected = compiled(ESCROW_JSON);
    if code.len() != expected.deployed_bytecode.len() {
        return false;
    }
    let mut masked = code.to_vec();
    for (start, length) in expected.immutables {
        if let Some(slot) = masked.get_mut(start..start + length) {
            slot.copy_from_slice(&expected.deployed_bytecode[start..start + length]);
        }
    }
    masked == expected.deployed_bytecode.as_ref()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escrow_code_is_recognised_whatever_its_immutables_and_nothing_else_is() {
        let expected = compiled(ESCROW_JSON);
        assert!(!expected.immutables.is_empty());
        let mut deployed = expected.deployed_bytecode.to_vec();
        assert!(is_escrow_code(&deployed));
        // Another token and notice: only the immutables' bytes change.
        for &(start, length) in &expected.immutables {
            deployed[start..start + length].fill(0xab);
        }
        assert!(is_escrow_code(&deployed));
        // One byte of code changed, or one more byte: not the escrow.
        let mut altered = deployed.clone();
        altered[0] ^= 1;
        assert!(!is_escrow_code(&altered));
        deployed.push(0);
        assert!(!is_escrow_code(&deployed));
        assert!(!is_escrow_code(
            &compiled(TEST_TOKEN_JSON).deployed_bytecode
        ));
    }
}

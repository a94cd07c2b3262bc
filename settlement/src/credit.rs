//! Whether a provider extends credit to a buyer: pure, from the provider's own ledger and
//! its last reading of the buyer's deposit (time and readings are arguments). Nothing in
//! the token stream waits for the chain; a stale reading only makes this stricter, since
//! redemptions by other providers can only have lowered the balance.

use crate::units::TokenUnits;

/// What the provider knows about one buyer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuyerPosition {
    /// Every receipt from this buyer not voided (pending and final), in token units.
    pub owed: TokenUnits,
    /// Of that, final for longer than the authorisation grace: what the buyer must have
    /// authorised by now.
    pub owed_final: TokenUnits,
    /// The newest authorisation the buyer sent (cumulative).
    pub authorised: TokenUnits,
    /// What this channel has already paid out on chain.
    pub redeemed: TokenUnits,
    /// The deposit's balance at the last reading.
    pub deposit_balance: TokenUnits,
    /// A withdrawal the buyer has asked for (the balance will drop by this much).
    pub withdrawal_pending: TokenUnits,
}

/// What the provider is willing to risk on one buyer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditLimits {
    /// What a buyer owes and has not authorised yet — receipts inside the dispute window,
    /// and final ones its next authorisation has not reached — a buyer could walk away
    /// from (withdraw after the notice and never sign): this bounds that exposure, per
    /// buyer.
    pub max_pending: TokenUnits,
}

/// Why credit stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CreditRefused {
    #[error("the buyer's unredeemed balance ({unredeemed}) and this job ({job}) exceed what its deposit covers ({covered})")]
    DepositExhausted {
        unredeemed: TokenUnits,
        job: TokenUnits,
        covered: TokenUnits,
    },
    #[error("what the buyer owes unauthorised ({pending}) and this job ({job}) exceed the provider's limit ({limit})")]
    PendingLimit {
        pending: TokenUnits,
        job: TokenUnits,
        limit: TokenUnits,
    },
    #[error("the buyer has authorised {authorised} of {owed_final} owed past the dispute window")]
    Unauthorised {
        authorised: TokenUnits,
        owed_final: TokenUnits,
    },
}

/// The unit of rounding slack: an authorisation rounds nano-USD down to whole units.
const ROUNDING_SLACK: TokenUnits = TokenUnits(1);

/// Whether a job that may cost up to `job_max` can start on credit.
pub fn may_extend(
    position: &BuyerPosition,
    limits: &CreditLimits,
    job_max: TokenUnits,
) -> Result<(), CreditRefused> {
    if position.authorised.0.saturating_add(ROUNDING_SLACK.0) < position.owed_final.0 {
        return Err(CreditRefused::Unauthorised {
            authorised: position.authorised,
            owed_final: position.owed_final,
        });
    }
    let pending = position.owed.saturating_sub(position.authorised);
    if pending.0.saturating_add(job_max.0) > limits.max_pending.0 {
        return Err(CreditRefused::PendingLimit {
            pending,
            job: job_max,
            limit: limits.max_pending,
        });
    }
    // A pending withdrawal counts as gone: the provider may not redeem before it lands.
    let covered = position
        .deposit_balance
        .saturating_sub(position.withdrawal_pending);
    let unredeemed = position.owed.saturating_sub(position.redeemed);
    if unredeemed.0.saturating_add(job_max.0) > covered.0 {
        return Err(CreditRefused::DepositExhausted {
            unredeemed,
            job: job_max,
            covered,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const LIMITS: CreditLimits = CreditLimits {
        max_pending: TokenUnits(10_000),
    };

    fn position() -> BuyerPosition {
        BuyerPosition {
            owed: TokenUnits(300),
            owed_final: TokenUnits(200),
            authorised: TokenUnits(200),
            redeemed: TokenUnits(100),
            deposit_balance: TokenUnits(1_000),
            withdrawal_pending: TokenUnits(0),
        }
    }

    #[test]
    fn credit_runs_while_the_deposit_covers_unredeemed_work_and_the_next_job() {
        let p = position();
        may_extend(&p, &LIMITS, TokenUnits(800)).unwrap();
        assert_eq!(
            may_extend(&p, &LIMITS, TokenUnits(801)),
            Err(CreditRefused::DepositExhausted {
                unredeemed: TokenUnits(200),
                job: TokenUnits(801),
                covered: TokenUnits(1_000)
            })
        );
    }

    #[test]
    fn a_pending_withdrawal_is_not_credit() {
        let p = BuyerPosition {
            withdrawal_pending: TokenUnits(900),
            ..position()
        };
        assert!(matches!(
            may_extend(&p, &LIMITS, TokenUnits(1)),
            Err(CreditRefused::DepositExhausted {
                covered: TokenUnits(100),
                ..
            })
        ));
    }

    #[test]
    fn a_buyer_that_stops_authorising_final_receipts_gets_no_more_credit() {
        let p = BuyerPosition {
            authorised: TokenUnits(150),
            ..position()
        };
        assert_eq!(
            may_extend(&p, &LIMITS, TokenUnits(1)),
            Err(CreditRefused::Unauthorised {
                authorised: TokenUnits(150),
                owed_final: TokenUnits(200)
            })
        );
        // One unit short is rounding, not refusal.
        let p = BuyerPosition {
            authorised: TokenUnits(199),
            ..position()
        };
        may_extend(&p, &LIMITS, TokenUnits(1)).unwrap();
    }

    #[test]
    fn unauthorised_work_is_bounded_per_buyer() {
        // 100 owed beyond the authorisation; a limit of 150 allows a job of 50, not 51.
        let limits = CreditLimits {
            max_pending: TokenUnits(150),
        };
        let p = position();
        may_extend(&p, &limits, TokenUnits(50)).unwrap();
        assert_eq!(
            may_extend(&p, &limits, TokenUnits(51)),
            Err(CreditRefused::PendingLimit {
                pending: TokenUnits(100),
                job: TokenUnits(51),
                limit: TokenUnits(150)
            })
        );
        // Final receipts inside the grace, not authorised yet, count as well.
        let p = BuyerPosition {
            authorised: TokenUnits(150),
            owed_final: TokenUnits(150),
            ..position()
        };
        assert!(matches!(
            may_extend(&p, &limits, TokenUnits(1)),
            Err(CreditRefused::PendingLimit {
                pending: TokenUnits(150),
                ..
            })
        ));
    }

    #[test]
    fn huge_claims_saturate_instead_of_wrapping() {
        let p = BuyerPosition {
            owed: TokenUnits(u128::MAX),
            ..position()
        };
        assert!(may_extend(&p, &LIMITS, TokenUnits(u128::MAX)).is_err());
    }
}

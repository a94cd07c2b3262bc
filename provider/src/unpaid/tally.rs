//! What jobs took and what their receipts paid for, as a provider counts them itself:
//! per job ([`Tally`]) and per key over the last hour ([`KeyTotals`]), against what
//! the key's payments earned.

use super::FREE_PREFILL_PER_PAID_TOKEN;

/// What one job of a buyer's took and paid for, as the provider counted it (nothing
/// here is the buyer's word: the provider sent, prefilled and read the receipts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Completion tokens sent (resumed ones not included).
    pub sent: u64,
    /// Of those, the ones its receipts cover.
    pub paid: u64,
    /// Positions the engine prefilled: prompt and resumed tokens, less a prefix reused
    /// from its cache (all of them when the job ended before the engine said).
    pub prefilled: u64,
    /// Prompt tokens its receipts bill: all of a fresh job's prompt, none of a resume's.
    pub billed_prompt: u64,
}

impl Tally {
    /// Tokens sent and not paid for, less a job's first token: that one is the
    /// provider's bid (a gateway's standby warm-up is one unbilled token, SPEC §10), and
    /// counting it would have a provider refuse the gateways it stands by for.
    pub(super) fn unpaid(&self) -> u64 {
        self.sent.saturating_sub(self.paid.max(1))
    }

    /// Prefill no receipt pays for: all of it before the first receipt (which pays the
    /// billed prompt), then what the receipts do not bill (a resume's prefill).
    pub(super) fn unpaid_prefill(&self) -> u64 {
        if self.paid == 0 {
            self.prefilled
        } else {
            self.prefilled.saturating_sub(self.billed_prompt)
        }
    }

    /// Tokens its receipts paid for, prompt included.
    pub(super) fn paid_tokens(&self) -> u64 {
        if self.paid == 0 {
            0
        } else {
            self.paid.saturating_add(self.billed_prompt)
        }
    }
}

/// What one key took and paid for in the last hour.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KeyTotals {
    /// Completion tokens sent and not paid for ([`Tally::unpaid`]).
    pub(super) unpaid: u64,
    /// Completion tokens paid for.
    pub(super) paid: u64,
    /// Prefill no receipt paid for.
    pub(super) prefill: u64,
    /// Tokens paid for, prompts included.
    pub(super) paid_tokens: u64,
}

impl KeyTotals {
    pub(super) fn add(self, job: &Tally) -> Self {
        Self {
            unpaid: self.unpaid.saturating_add(job.unpaid()),
            paid: self.paid.saturating_add(job.paid),
            prefill: self.prefill.saturating_add(job.unpaid_prefill()),
            paid_tokens: self.paid_tokens.saturating_add(job.paid_tokens()),
        }
    }

    /// Unpaid prefill its payments earned ([`FREE_PREFILL_PER_PAID_TOKEN`] per token).
    pub(super) fn earned_prefill(self) -> u64 {
        self.paid_tokens.saturating_mul(FREE_PREFILL_PER_PAID_TOKEN)
    }

    /// Unpaid tokens beyond the eighth of its paid ones it may leave.
    pub(super) fn excess_tokens(self) -> u64 {
        self.unpaid.saturating_sub(self.paid / 8)
    }

    /// Unpaid prefill beyond what its payments earned.
    pub(super) fn excess_prefill(self) -> u64 {
        self.prefill.saturating_sub(self.earned_prefill())
    }

    /// Unpaid tokens its payments earned (an eighth of them) and it has not left.
    pub(super) fn token_headroom(self) -> u64 {
        (self.paid / 8).saturating_sub(self.unpaid)
    }

    /// Unpaid prefill its payments earned and it has not taken.
    pub(super) fn prefill_headroom(self) -> u64 {
        self.earned_prefill().saturating_sub(self.prefill)
    }
}

/// What the keys of one origin took beyond what their payments earned.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Excess {
    pub(super) tokens: u64,
    pub(super) prefill: u64,
}

//! Verification: what a gateway checks of the work it buys and what it concludes. The
//! auditor draws jobs and replays them (`audit`, `examine`), buys checks from other
//! providers when it cannot replay (`outsource`), escalates to ground truth by fetching
//! a model (`escalate`), weighs attestations and reports (`attest`, `standing`), bounds
//! fraud proofs (`proof_limits`) and tells profiles apart (`profiles`); `trust` ties them
//! together for the dispatcher.

pub mod attest;
pub mod audit;
pub mod escalate;
pub mod examine;
pub mod outsource;
pub mod profiles;
pub mod proof_limits;
pub mod standing;
pub mod transcript;
pub mod trust;

//! Which buyers a provider serves, and how much of it one buyer may take: an allow and
//! a deny list, and per-buyer limits on concurrent jobs and jobs per minute.
//!
//! The limits are off by default: a gateway is one buyer for all of its clients, so a
//! default cap would throttle a team's gateway on a provider it alone uses. A provider
//! that sells to many buyers sets them (`provide --max-jobs-per-buyer`,
//! `--buyer-jobs-per-minute`), and then no single buyer can hold every slot.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use sharemesh_protocol::{NodeId, RejectReason};

#[derive(Clone, Debug, Default)]
pub struct BuyerPolicy {
    /// Serve only these buyers (empty: anyone not denied).
    pub allow: HashSet<NodeId>,
    pub deny: HashSet<NodeId>,
    /// Jobs one buyer may run at once (`None`: up to the provider's slots).
    pub max_jobs_per_buyer: Option<u32>,
    /// Jobs one buyer may start per minute (`None`: no limit).
    pub jobs_per_minute: Option<u32>,
}

/// Buyers remembered for their limits: the table is bounded, forgetting idle buyers
/// (an idle buyer's record holds nothing a fresh one would not, once its minute is over).
const MAX_TRACKED_BUYERS: usize = 10_000;

#[derive(Debug, Default)]
struct Usage {
    active: u32,
    /// Start times (ms) of this buyer's jobs in the last minute.
    starts: VecDeque<u64>,
}

/// The per-buyer state behind [`BuyerPolicy`].
#[derive(Debug, Default)]
pub struct BuyerLimits {
    policy: BuyerPolicy,
    usage: Arc<Mutex<HashMap<NodeId, Usage>>>,
}

/// A job's hold on its buyer's concurrency: released when dropped.
#[derive(Debug)]
pub struct BuyerSlot {
    buyer: NodeId,
    usage: Arc<Mutex<HashMap<NodeId, Usage>>>,
}

impl Drop for BuyerSlot {
    fn drop(&mut self) {
        if let Ok(mut usage) = self.usage.lock() {
            if let Some(entry) = usage.get_mut(&self.buyer) {
                entry.active = entry.active.saturating_sub(1);
            }
        }
    }
}

impl BuyerLimits {
    pub fn new(policy: BuyerPolicy) -> Self {
        Self {
            policy,
            usage: Arc::default(),
        }
    }

    /// Admits one job of `buyer` at `now_ms`, or says why not.
    pub fn admit(&self, buyer: NodeId, now_ms: u64) -> Result<BuyerSlot, (RejectReason, String)> {
        self.allowed(&buyer)?;
        let mut usage = self
            .usage
            .lock()
            .map_err(|_| (RejectReason::Internal, "buyer table lock poisoned".into()))?;
        if usage.len() >= MAX_TRACKED_BUYERS && !usage.contains_key(&buyer) {
            usage.retain(|_, u| {
                u.active > 0 || u.starts.back().is_some_and(|&t| t + 60_000 > now_ms)
            });
        }
        let entry = usage.entry(buyer).or_default();
        while entry.starts.front().is_some_and(|&t| t + 60_000 <= now_ms) {
            entry.starts.pop_front();
        }
        self.within_limits(entry)?;
        entry.active += 1;
        entry.starts.push_back(now_ms);
        Ok(BuyerSlot {
            buyer,
            usage: self.usage.clone(),
        })
    }

    /// What [`Self::admit`] would say now, without taking a slot (for quotes).
    pub fn check(&self, buyer: &NodeId, now_ms: u64) -> Result<(), (RejectReason, String)> {
        self.allowed(buyer)?;
        let usage = self
            .usage
            .lock()
            .map_err(|_| (RejectReason::Internal, "buyer table lock poisoned".into()))?;
        match usage.get(buyer) {
            Some(entry) => self.within_limits(&Usage {
                active: entry.active,
                starts: entry
                    .starts
                    .iter()
                    .copied()
                    .filter(|&t| t + 60_000 > now_ms)
                    .collect(),
            }),
            None => Ok(()),
        }
    }

    fn allowed(&self, buyer: &NodeId) -> Result<(), (RejectReason, String)> {
        if self.policy.deny.contains(buyer)
            || (!self.policy.allow.is_empty() && !self.policy.allow.contains(buyer))
        {
            return Err((
                RejectReason::NotAllowed,
                "this provider does not serve this buyer".into(),
            ));
        }
        Ok(())
    }

    fn within_limits(&self, usage: &Usage) -> Result<(), (RejectReason, String)> {
        if let Some(limit) = self.policy.max_jobs_per_buyer {
            if usage.active >= limit {
                return Err((
                    RejectReason::BuyerLimit,
                    format!("this buyer already runs {limit} job(s) here, its limit"),
                ));
            }
        }
        if let Some(limit) = self.policy.jobs_per_minute {
            if usage.starts.len() >= limit as usize {
                return Err((
                    RejectReason::BuyerLimit,
                    format!("this buyer started {limit} job(s) here in the last minute, its limit"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> NodeId {
        NodeId::from_bytes([n; 32])
    }

    #[test]
    fn allow_and_deny_lists() {
        let open = BuyerLimits::new(BuyerPolicy {
            deny: [id(2)].into(),
            ..BuyerPolicy::default()
        });
        assert!(open.admit(id(1), 0).is_ok());
        assert_eq!(
            open.admit(id(2), 0).unwrap_err().0,
            RejectReason::NotAllowed
        );
        let closed = BuyerLimits::new(BuyerPolicy {
            allow: [id(1)].into(),
            ..BuyerPolicy::default()
        });
        assert!(closed.admit(id(1), 0).is_ok());
        assert_eq!(
            closed.admit(id(3), 0).unwrap_err().0,
            RejectReason::NotAllowed
        );
    }

    #[test]
    fn one_buyer_cannot_take_every_slot_or_start_without_end() {
        let limits = BuyerLimits::new(BuyerPolicy {
            max_jobs_per_buyer: Some(2),
            jobs_per_minute: Some(3),
            ..BuyerPolicy::default()
        });
        let first = limits.admit(id(1), 0).unwrap_or_else(|e| panic!("{e:?}"));
        let _second = limits.admit(id(1), 1).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            limits.admit(id(1), 2).unwrap_err().0,
            RejectReason::BuyerLimit
        );
        assert!(
            limits.admit(id(2), 2).is_ok(),
            "another buyer is not held back"
        );
        drop(first);
        let _third = limits.admit(id(1), 3).unwrap_or_else(|e| panic!("{e:?}"));
        // Three starts in this minute: the fourth waits for the minute to pass.
        drop(_third);
        let err = limits.admit(id(1), 4).unwrap_err();
        assert_eq!(err.0, RejectReason::BuyerLimit);
        assert!(
            err.1.contains("per minute") || err.1.contains("last minute"),
            "{}",
            err.1
        );
        assert!(
            limits.check(&id(1), 59_999).is_err(),
            "a check says what admit would"
        );
        assert!(limits.check(&id(1), 60_001).is_ok());
        assert!(limits.admit(id(1), 60_001).is_ok());
    }
}

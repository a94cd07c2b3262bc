//! Spend as running totals: per buyer and per API key, per UTC day and month, kept in
//! the `totals` tree and changed in the same transaction as the receipt that changes
//! them. A budget check reads two or four numbers, whatever the history's length.
//!
//! A (job, provider)'s newest receipt counts on the day and month it was issued: when
//! a later receipt supersedes one, its amount moves from the old receipt's buckets to
//! the new one's. Which API key a job's money counts against is fixed by its first
//! receipt.

use sharemesh_protocol::NodeId;

use crate::report::{day_start, month_start};

/// Whose spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpendScope<'a> {
    Buyer(&'a NodeId),
    ApiKey(&'a str),
}

/// Which period, named by any instant inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    Day(u64),
    Month(u64),
}

/// Marks a `totals` tree that is complete (built from every receipt).
pub(crate) const BUILT_MARKER: &[u8] = b"\xffbuilt-v1";

/// The `totals` key of one scope and period.
pub(crate) fn total_key(scope: SpendScope<'_>, period: Period) -> Vec<u8> {
    let mut key = Vec::with_capacity(48);
    match scope {
        SpendScope::Buyer(buyer) => {
            key.push(b'b');
            key.extend_from_slice(buyer.as_bytes());
        }
        SpendScope::ApiKey(id) => {
            key.push(b'k');
            key.extend_from_slice(&(id.len() as u16).to_be_bytes());
            key.extend_from_slice(id.as_bytes());
        }
    }
    let (tag, start) = match period {
        Period::Day(at) => (b'd', day_start(at)),
        Period::Month(at) => (b'm', month_start(at)),
    };
    key.push(tag);
    key.extend_from_slice(&start.to_be_bytes());
    key
}

/// The keys one receipt's amount counts under: its buyer's and (if any) its API key's
/// day and month.
pub(crate) fn buckets(buyer: &NodeId, api_key: Option<&str>, issued_at_ms: u64) -> Vec<Vec<u8>> {
    let periods = [Period::Day(issued_at_ms), Period::Month(issued_at_ms)];
    let mut keys: Vec<Vec<u8>> = periods
        .iter()
        .map(|p| total_key(SpendScope::Buyer(buyer), *p))
        .collect();
    if let Some(id) = api_key {
        keys.extend(
            periods
                .iter()
                .map(|p| total_key(SpendScope::ApiKey(id), *p)),
        );
    }
    keys
}

pub(crate) fn read_amount(value: Option<&[u8]>) -> u64 {
    value
        .and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map_or(0, u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_scopes_and_periods() {
        let a = NodeId::from_bytes([1; 32]);
        let noon = crate::parse_day("2026-12-01").unwrap_or(0) + 12 * 3_600_000;
        let evening = noon + 6 * 3_600_000;
        let tomorrow = noon + 24 * 3_600_000;
        let day = |at| total_key(SpendScope::Buyer(&a), Period::Day(at));
        let month = |at| total_key(SpendScope::Buyer(&a), Period::Month(at));
        assert_eq!(day(noon), day(evening));
        assert_ne!(day(noon), day(tomorrow));
        assert_eq!(month(noon), month(tomorrow));
        assert_ne!(day(noon), month(noon));
        assert_ne!(
            total_key(SpendScope::ApiKey("ab"), Period::Day(noon)),
            total_key(SpendScope::ApiKey("a"), Period::Day(noon)),
        );
        assert_eq!(buckets(&a, Some("k"), noon).len(), 4);
        assert_eq!(buckets(&a, None, noon).len(), 2);
    }
}

//! The one place the node reads the wall clock; the pure crates take time as an argument.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Envelope sequence numbers: `max(last + 1, now in µs)`, so they keep increasing
/// across restarts without persisted state (SPEC.md §5).
#[derive(Debug, Default)]
pub struct SeqCounter {
    last: std::sync::atomic::AtomicU64,
}

impl SeqCounter {
    pub fn next(&self) -> u64 {
        use std::sync::atomic::Ordering;
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut last = self.last.load(Ordering::SeqCst);
        loop {
            let next = now_us.max(last + 1);
            match self
                .last
                .compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return next,
                Err(actual) => last = actual,
            }
        }
    }
}

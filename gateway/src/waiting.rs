//! Bursts wait, they do not fail: a request that every provider declined for lack of
//! capacity (`OverCapacity`, `BuyerLimit`) or could not be reached yet (a provider
//! behind NAT before its relay) waits its turn here until capacity frees or its wait
//! runs out, and only then is answered 503 with `Retry-After`.
//!
//! The queue is bounded and fair across API keys: waiters of one key are served in
//! arrival order, and keys take turns (round robin), so one buyer's burst of 100 cannot
//! hold back another buyer's single request. A turn is handed out when a job of this
//! gateway ends (its slot on some provider freed) and, for capacity freed elsewhere (a
//! provider's other buyers), once per pump interval while anyone waits. A turn is a
//! chance to plan again, not a slot: a waiter that finds every provider still full
//! waits again at the head of its key's line.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Why a request stopped waiting without a turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error("{limit} requests are already waiting for capacity at this gateway")]
    Full { limit: usize },
    #[error("no provider had capacity within {0:?}")]
    TimedOut(Duration),
}

/// How long and how many may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Longest a request waits for capacity, from its first refusal (0: never waits).
    pub max_wait: Duration,
    /// Most requests waiting at once; one more is answered 503 at once.
    pub limit: usize,
    /// How often a turn is handed out while anyone waits, for capacity freed by jobs
    /// this gateway does not see end.
    pub pump_every: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_secs(30),
            limit: 256,
            pump_every: Duration::from_millis(500),
        }
    }
}

#[derive(Default)]
struct Lines {
    /// Keys with someone waiting, in the order they get their next turn.
    turns: VecDeque<String>,
    /// Each key's waiters, first in line first.
    by_key: HashMap<String, VecDeque<Waiter>>,
    waiting: usize,
    next_id: u64,
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

impl Lines {
    fn join(&mut self, key: &str, waiter: Waiter, at_front: bool) {
        let line = self.by_key.entry(key.to_owned()).or_default();
        if line.is_empty() {
            self.turns.push_back(key.to_owned());
        }
        if at_front {
            line.push_front(waiter);
        } else {
            line.push_back(waiter);
        }
        self.waiting += 1;
    }

    /// Removes waiter `id` of `key` if it is still in line.
    fn leave(&mut self, key: &str, id: u64) {
        let Some(line) = self.by_key.get_mut(key) else {
            return;
        };
        let before = line.len();
        line.retain(|waiter| waiter.id != id);
        self.waiting -= before - line.len();
        if line.is_empty() {
            self.by_key.remove(key);
            self.turns.retain(|k| k != key);
        }
    }

    /// The next waiter by round robin over keys, out of line.
    fn next(&mut self) -> Option<Waiter> {
        let key = self.turns.pop_front()?;
        let line = self.by_key.get_mut(&key)?;
        let waiter = line.pop_front();
        if line.is_empty() {
            self.by_key.remove(&key);
        } else {
            self.turns.push_back(key);
        }
        if waiter.is_some() {
            self.waiting -= 1;
        }
        waiter
    }
}

/// The gateway's queue of requests waiting for capacity.
pub struct WaitingRoom {
    lines: Mutex<Lines>,
    policy: WaitPolicy,
    pump_started: AtomicBool,
}

/// Takes a waiter out of line when its wait ends any way (turn, timeout, the client
/// going away).
struct InLine<'a> {
    room: &'a WaitingRoom,
    key: &'a str,
    id: u64,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if let Ok(mut lines) = self.room.lines.lock() {
            lines.leave(self.key, self.id);
        }
    }
}

impl WaitingRoom {
    pub fn new(policy: WaitPolicy) -> Arc<Self> {
        Arc::new(Self {
            lines: Mutex::new(Lines::default()),
            policy,
            pump_started: AtomicBool::new(false),
        })
    }

    /// The pump hands out a turn every `pump_every` while the room lives; started by
    /// the first wait (on that wait's runtime).
    fn start_pump(self: &Arc<Self>) {
        if self.pump_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Self> = Arc::downgrade(self);
        let every = self.policy.pump_every.max(Duration::from_millis(10));
        tokio::spawn(async move {
            // The first turn one interval from now, not at once.
            let mut pump = tokio::time::interval_at(Instant::now() + every, every);
            pump.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                pump.tick().await;
                let Some(room) = weak.upgrade() else { return };
                room.hand_out_turn();
            }
        });
    }

    pub fn policy(&self) -> WaitPolicy {
        self.policy
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.lines.lock().map_or(0, |lines| lines.waiting)
    }

    /// Waits for a turn on behalf of `key` (an API key's id; "" without keys). `since`:
    /// when the request was first refused (its wait is measured from there); `again`:
    /// it had a turn and found no capacity, so it waits at the head of its key's line
    /// (and is never refused for a full room).
    pub async fn wait(
        self: &Arc<Self>,
        key: &str,
        since: Instant,
        again: bool,
    ) -> Result<(), WaitError> {
        self.start_pump();
        let deadline = since + self.policy.max_wait;
        if Instant::now() >= deadline {
            return Err(WaitError::TimedOut(self.policy.max_wait));
        }
        let (wake, woken) = oneshot::channel();
        let id = {
            let mut lines = self
                .lines
                .lock()
                .map_err(|_| WaitError::Full { limit: 0 })?;
            if !again && lines.waiting >= self.policy.limit {
                return Err(WaitError::Full {
                    limit: self.policy.limit,
                });
            }
            lines.next_id += 1;
            let id = lines.next_id;
            lines.join(key, Waiter { id, wake }, again);
            id
        };
        let _in_line = InLine {
            room: self.as_ref(),
            key,
            id,
        };
        match tokio::time::timeout_at(deadline, woken).await {
            Ok(Ok(())) => Ok(()),
            // The sender is only dropped once out of line, so this is a lost turn.
            Ok(Err(_)) | Err(_) => Err(WaitError::TimedOut(self.policy.max_wait)),
        }
    }

    /// Gives the next waiter (round robin over keys) its turn; a waiter that already
    /// left (its client went away) passes the turn on.
    pub fn hand_out_turn(&self) {
        let Ok(mut lines) = self.lines.lock() else {
            return;
        };
        while let Some(waiter) = lines.next() {
            if waiter.wake.send(()).is_ok() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(limit: usize, max_wait_ms: u64) -> WaitPolicy {
        WaitPolicy {
            max_wait: Duration::from_millis(max_wait_ms),
            limit,
            // The tests hand out turns themselves.
            pump_every: Duration::from_secs(3600),
        }
    }

    /// Starts `key`'s wait and returns its outcome channel.
    fn waiter(
        room: &Arc<WaitingRoom>,
        key: &'static str,
        again: bool,
    ) -> tokio::task::JoinHandle<Result<(), WaitError>> {
        let room = room.clone();
        tokio::spawn(async move { room.wait(key, Instant::now(), again).await })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn keys_take_turns_and_each_key_keeps_its_order() {
        let room = WaitingRoom::new(policy(16, 10_000));
        let mut order = Vec::new();
        // A burst of three from `a`, then one from `b`, then one more from `a`.
        for key in ["a", "a", "a", "b", "c"] {
            order.push((key, waiter(&room, key, false)));
            settle().await;
        }
        assert_eq!(room.waiting(), 5);
        let mut served = Vec::new();
        for _ in 0..5 {
            room.hand_out_turn();
            settle().await;
            let done: Vec<usize> = order
                .iter()
                .enumerate()
                .filter(|(i, (_, handle))| handle.is_finished() && !served.contains(i))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(done.len(), 1, "one turn wakes one waiter");
            served.push(done[0]);
        }
        // a#1, b, c, a#2, a#3: `b` and `c` do not wait behind `a`'s whole burst.
        assert_eq!(served, vec![0, 3, 4, 1, 2]);
        for (_, handle) in order {
            assert_eq!(handle.await.expect("join"), Ok(()));
        }
        assert_eq!(room.waiting(), 0);
    }

    #[tokio::test]
    async fn a_full_room_refuses_newcomers_but_not_those_waiting_again() {
        let room = WaitingRoom::new(policy(2, 10_000));
        let first = waiter(&room, "a", false);
        let second = waiter(&room, "b", false);
        settle().await;
        let third = room.wait("c", Instant::now(), false).await;
        assert_eq!(third, Err(WaitError::Full { limit: 2 }));
        // One that had its turn and found no capacity goes back to the head of its
        // line even in a full room.
        let again = waiter(&room, "a", true);
        settle().await;
        assert_eq!(room.waiting(), 3);
        room.hand_out_turn();
        settle().await;
        assert!(
            again.is_finished(),
            "the returning waiter is first in its line"
        );
        assert!(!first.is_finished());
        first.abort();
        second.abort();
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_deadline_and_leaves_the_line() {
        let room = WaitingRoom::new(policy(4, 200));
        let since = Instant::now();
        let handle = {
            let room = room.clone();
            tokio::spawn(async move { room.wait("a", since, false).await })
        };
        settle().await;
        assert_eq!(room.waiting(), 1);
        assert_eq!(
            handle.await.expect("join"),
            Err(WaitError::TimedOut(Duration::from_millis(200)))
        );
        assert!(since.elapsed() >= Duration::from_millis(200));
        assert_eq!(room.waiting(), 0);
        // Past its deadline a request does not wait again at all.
        assert_eq!(
            room.wait("a", since, true).await,
            Err(WaitError::TimedOut(Duration::from_millis(200)))
        );
    }

    #[tokio::test]
    async fn a_waiter_whose_client_left_passes_its_turn_on() {
        let room = WaitingRoom::new(policy(4, 10_000));
        let gone = waiter(&room, "a", false);
        settle().await;
        let stays = waiter(&room, "b", false);
        settle().await;
        gone.abort();
        settle().await;
        assert_eq!(room.waiting(), 1, "the aborted wait left the line");
        room.hand_out_turn();
        settle().await;
        assert!(stays.is_finished());
        assert_eq!(stays.await.expect("join"), Ok(()));
    }
}

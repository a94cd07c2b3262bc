//! The engine's waiting room: jobs wait in one queue per party they are for and are
//! taken round-robin across parties, oldest first within each. One buyer's burst of 30
//! jobs then delays another buyer's single job by at most one job per batch place, not
//! by the whole burst.

use std::collections::{HashMap, VecDeque};

/// Whom a job is for: a provider's jobs carry the buyer's id here (the job's prefix
/// salt); verification replays share one key of their own.
pub type PartyKey = [u8; 32];

/// Waiting items, taken round-robin across parties.
#[derive(Debug)]
pub struct FairQueue<T> {
    queues: HashMap<PartyKey, VecDeque<T>>,
    /// Parties with waiting items, in turn order.
    turns: VecDeque<PartyKey>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            queues: HashMap::new(),
            turns: VecDeque::new(),
        }
    }
}

impl<T> FairQueue<T> {
    /// `item` waits behind `party`'s earlier items; a party with nothing waiting joins
    /// the end of the turn order.
    pub fn push(&mut self, party: PartyKey, item: T) {
        let queue = self.queues.entry(party).or_default();
        if queue.is_empty() {
            self.turns.push_back(party);
        }
        queue.push_back(item);
    }

    /// The oldest item of the party whose turn it is; that party then goes to the end
    /// of the turn order if it has more.
    pub fn pop(&mut self) -> Option<T> {
        let party = self.turns.pop_front()?;
        let queue = self.queues.get_mut(&party)?;
        let item = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&party);
        } else {
            self.turns.push_back(party);
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(queue: &mut FairQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| queue.pop()).collect()
    }

    #[test]
    fn parties_take_turns_and_each_keeps_its_order() {
        let (a, b, c) = ([1; 32], [2; 32], [3; 32]);
        let mut queue = FairQueue::default();
        for item in ["a1", "a2", "a3", "a4"] {
            queue.push(a, item);
        }
        queue.push(b, "b1");
        queue.push(c, "c1");
        queue.push(b, "b2");
        assert_eq!(
            drain(&mut queue),
            ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]
        );
        assert_eq!(queue.pop(), None);
    }

    #[test]
    fn a_party_that_returns_waits_for_its_turn() {
        let (a, b) = ([1; 32], [2; 32]);
        let mut queue = FairQueue::default();
        queue.push(a, "a1");
        queue.push(a, "a2");
        assert_eq!(queue.pop(), Some("a1"));
        queue.push(b, "b1");
        // a still has its turn first (it was waiting), then b, then a's newcomer.
        queue.push(a, "a3");
        assert_eq!(drain(&mut queue), ["a2", "b1", "a3"]);
        // An emptied party's next item joins at the end.
        queue.push(b, "b2");
        queue.push(a, "a4");
        assert_eq!(drain(&mut queue), ["b2", "a4"]);
    }
}

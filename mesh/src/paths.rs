//! Which path a connection to a peer takes while a hole punch may replace a relayed
//! one: the gateway waits a moment for the punch ([`PUNCH_GRACE`]) and holds the path of
//! each job stream ([`PathHold`]) so the relayed connection it may run on stays open.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use libp2p::PeerId;
use tokio::sync::mpsc;

use crate::Command;

/// Peers reached only through a relay, whose hole punch has not ended yet, with when
/// the relayed connection opened.
pub(crate) type Punching = Arc<RwLock<HashMap<PeerId, std::time::Instant>>>;

/// How long a job stream waits for a hole punch on a fresh relayed connection: DCUtR
/// takes a few round trips (9 ms on the netns lab's links), and a stream opened on the
/// relayed connection just before it is replaced would be cut (README: NAT traversal).
pub const PUNCH_GRACE: Duration = Duration::from_secs(1);

/// Job streams open per peer ([`crate::MeshHandle::hold_path`]): while any is, a hole punch
/// does not close the peer's relayed connections (a stream may run on one).
pub(crate) type HeldPaths = Arc<std::sync::Mutex<HashMap<PeerId, usize>>>;

/// Keeps `peer`'s current connections open while it lives (see
/// [`crate::MeshHandle::hold_path`]).
pub struct PathHold {
    pub(crate) peer: PeerId,
    pub(crate) held: HeldPaths,
    pub(crate) commands: mpsc::Sender<Command>,
}

impl Drop for PathHold {
    fn drop(&mut self) {
        let released = self.held.lock().is_ok_and(|mut held| {
            let count = held.entry(self.peer).or_insert(1);
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.peer);
                true
            } else {
                false
            }
        });
        if released {
            // A full queue only delays the close to the next hole punch or idle timeout.
            let _ = self.commands.try_send(Command::PathReleased(self.peer));
        }
    }
}

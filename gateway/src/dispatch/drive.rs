//! One request from start to end: plan, budget, serve — and, when every provider is at
//! capacity, a wait for a turn in the gateway's waiting room before planning again
//! (bursts wait, they do not fail; `crate::waiting`).

use std::sync::Arc;

use sharemesh_mesh::clock::now_ms;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{DispatchEvent, Dispatcher};
use crate::keys::KeyRecord;
use crate::route::{RouteError, RouteRequest};

impl Dispatcher {
    pub(super) async fn drive(
        self: &Arc<Self>,
        request: RouteRequest,
        key: Option<KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<(), RouteError> {
        // Fairness is per API key; without keys every request is the operator's.
        let who = key.as_ref().map_or_else(String::new, |k| k.id.clone());
        let mut refused_since: Option<Instant> = None;
        loop {
            let attempt = self.attempt(&request, key.as_ref(), events).await;
            let err = match attempt {
                Err(err @ RouteError::Busy { .. }) => err,
                done => {
                    // A job of this gateway ended: its slot may be free for a waiter.
                    self.waiting.hand_out_turn();
                    return done;
                }
            };
            let again = refused_since.is_some();
            let since = *refused_since.get_or_insert_with(Instant::now);
            self.count(|m| m.waits.inc());
            tracing::debug!(error = %err, again, "providers at capacity or not reachable yet: waiting for a turn");
            tokio::select! {
                waited = self.waiting.wait(&who, since, again) => {
                    if let Err(why) = waited {
                        return Err(err.with_detail(why));
                    }
                }
                // The client went away while waiting.
                () = events.closed() => return Ok(()),
            }
        }
    }

    /// Plans and serves the request once.
    async fn attempt(
        self: &Arc<Self>,
        request: &RouteRequest,
        key: Option<&KeyRecord>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> Result<(), RouteError> {
        let plan = self.plan(request).await?;
        let reservation = self.budgets.reserve(
            self.ledger.as_deref(),
            &self.node_id(),
            plan.worst_case,
            key,
            now_ms(),
        )?;
        let job_id = plan.job_id;
        self.jobs.start(self.job_record(&plan, request, key));
        let served = self.serve(plan, request, key.cloned(), events).await;
        drop(reservation);
        self.show_budgets(key);
        // A completed request was logged before the client heard it was done.
        match &served {
            Ok(true) => {}
            Ok(false) => self
                .jobs
                .finish(&job_id, now_ms(), Err("the client went away".into())),
            Err(err) => self.jobs.finish(&job_id, now_ms(), Err(err.to_string())),
        }
        served.map(|_| ())
    }
}

//! A provider's serving tasks, started and owned together: job streams, quotes, model
//! headers and adverts. [`crate::ProviderNode`] starts them with
//! [`Provider::start_serving`], so none is started by hand and none ends unnoticed:
//! [`Serving::stopped`] says which task ended and why (none ends while the provider
//! serves), and dropping the handle stops them all.

use std::sync::Arc;

use tokio::task::{JoinError, JoinSet};

use crate::Provider;

/// The tasks of a serving provider; dropping it aborts them.
pub struct Serving {
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
}

/// Why a provider stopped serving (one of its tasks ended).
#[derive(Debug, thiserror::Error)]
pub enum ServingStopped {
    #[error("the provider stopped serving {what}: {source:#}")]
    Failed {
        what: &'static str,
        source: anyhow::Error,
    },
    #[error("the provider stopped serving {what}: the mesh closed")]
    Closed { what: &'static str },
    #[error("a provider task failed: {0}")]
    Panicked(#[from] JoinError),
}

impl Provider {
    /// Starts serving: job streams, quotes, model headers and adverts (and, settling on
    /// chain, settlement offers and rounds).
    pub(crate) fn start_serving(self: &Arc<Self>) -> Serving {
        let mut tasks = JoinSet::new();
        tasks.spawn(named("job streams", self.clone().serve()));
        tasks.spawn(named("quotes", self.clone().serve_quotes()));
        tasks.spawn(named("model headers", self.clone().serve_headers()));
        if self.payee().is_some() {
            tasks.spawn(named("settlement offers", self.clone().serve_settlement()));
            tasks.spawn(named("settlement rounds", self.clone().run_settlement()));
        }
        let advertising = self.clone();
        tasks.spawn(named("adverts", async move {
            advertising.advertise().await;
            Ok(())
        }));
        Serving { tasks }
    }
}

impl Serving {
    /// Runs one more task beside the serving ones, owned and reported as they are.
    pub(crate) fn spawn(
        &mut self,
        what: &'static str,
        task: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        self.tasks.spawn(named(what, task));
    }

    /// Waits until one of the tasks ends, which none does while the provider serves:
    /// the caller stops the provider with why, rather than run on without answering
    /// that part of the protocol.
    pub async fn stopped(&mut self) -> ServingStopped {
        match self.tasks.join_next().await {
            Some(Ok((what, Err(source)))) => ServingStopped::Failed { what, source },
            Some(Ok((what, Ok(())))) => ServingStopped::Closed { what },
            Some(Err(err)) => ServingStopped::Panicked(err),
            // No task left (all were joined before): nothing serves.
            None => ServingStopped::Closed { what: "anything" },
        }
    }
}

/// A task, with what it serves for the outcome that ends it.
async fn named(
    what: &'static str,
    task: impl std::future::Future<Output = anyhow::Result<()>>,
) -> (&'static str, anyhow::Result<()>) {
    (what, task.await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_task_to_end_is_named_with_its_reason() {
        let mut serving = Serving {
            tasks: JoinSet::new(),
        };
        serving.tasks.spawn(named("quotes", async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Err(anyhow::anyhow!("stream protocol taken"))
        }));
        serving.tasks.spawn(named(
            "adverts",
            std::future::pending::<anyhow::Result<()>>(),
        ));
        let stopped = serving.stopped().await;
        assert_eq!(
            stopped.to_string(),
            "the provider stopped serving quotes: stream protocol taken"
        );
        serving
            .tasks
            .spawn(named("model headers", async { Ok(()) }));
        assert!(matches!(
            serving.stopped().await,
            ServingStopped::Closed {
                what: "model headers"
            }
        ));
    }
}

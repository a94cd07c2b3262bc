//! Tasks that run as long as a gateway does (settlement rounds, reputation reports,
//! gossiped proofs, penalties for signed faults). None ends while the gateway serves, so
//! one that ends — a panic, or a loop that gave up — is surfaced rather than lost with
//! the task: [`Background::stopped`] says which and why, and the node stops with it
//! (as a provider does when one of its protocol tasks ends). Dropping the set stops
//! every task.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Which background task ended, and how.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskEnded {
    #[error("the gateway's {task} stopped")]
    Returned { task: &'static str },
    #[error("the gateway's {task} panicked: {message}")]
    Panicked { task: &'static str, message: String },
}

/// A gateway's long-running tasks.
pub struct Background {
    tasks: Mutex<JoinSet<()>>,
    ended: watch::Sender<Option<TaskEnded>>,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            tasks: Mutex::new(JoinSet::new()),
            ended: watch::channel(None).0,
        }
    }
}

impl Background {
    /// Runs `task` (named `task` in the report of its end) until it ends or the set is
    /// dropped.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let ended = self.ended.clone();
        let watched = async move {
            let end = match AssertUnwindSafe(task).catch_unwind().await {
                Ok(()) => TaskEnded::Returned { task: name },
                Err(panic) => TaskEnded::Panicked {
                    task: name,
                    message: panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(no message)".to_owned()),
                },
            };
            tracing::error!(%end, "a gateway task ended");
            // The first end is the one reported.
            ended.send_if_modified(|first| {
                if first.is_some() {
                    return false;
                }
                *first = Some(end);
                true
            });
        };
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .spawn(watched);
    }

    /// Waits until one of the tasks ends (none does while the gateway serves).
    pub async fn stopped(&self) -> TaskEnded {
        let mut ended = self.ended.subscribe();
        let end = match ended.wait_for(Option::is_some).await {
            Ok(end) => end.clone(),
            // The sender lives as long as `self`.
            Err(_) => None,
        };
        end.unwrap_or(TaskEnded::Returned { task: "tasks" })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            tasks.abort_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_first_task_to_end_is_named_with_how_it_ended() {
        let background = Background::default();
        background.spawn("quiet loop", std::future::pending());
        background.spawn("settlement rounds", async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            panic!("the chain client broke");
        });
        background.spawn("reports", async {
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let end = tokio::time::timeout(Duration::from_secs(5), background.stopped())
            .await
            .expect("a task ended");
        assert_eq!(
            end,
            TaskEnded::Panicked {
                task: "settlement rounds",
                message: "the chain client broke".into()
            }
        );
        assert_eq!(
            end.to_string(),
            "the gateway's settlement rounds panicked: the chain client broke"
        );
        // Asked again later, the first end is still the answer.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(background.stopped().await, end);
    }

    #[tokio::test]
    async fn dropping_the_set_stops_its_tasks() {
        let background = Background::default();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        background.spawn("holder", async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(background);
        let closed = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(closed, Ok(None), "the task's sender was dropped with it");
    }
}

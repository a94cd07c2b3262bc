//! A provider node, built one way by whoever runs one — the CLI, the lab and the
//! tests alike: [`ProviderNode::builder`] takes what a provider needs (its key, the
//! engine it serves on, its mesh), what it may have (a policy, its hardware, a ledger,
//! on-chain settlement), and [`ProviderNodeBuilder::spawn`] starts every task a
//! provider runs. The node owns them: [`ProviderNode::stopped`] says which one ended
//! and why (none ends while it serves), and dropping the node stops them all.

use std::sync::Arc;
use std::time::Duration;

use sharemesh_engine::TokenEngine;
use sharemesh_ledger::Ledger;
use sharemesh_mesh::MeshHandle;
use sharemesh_protocol::{Keypair, NodeId};
use sharemesh_settlement::Payee;

use crate::hardware::Hardware;
use crate::serving::{Serving, ServingStopped};
use crate::{Provider, ProviderPolicy};

/// How often a node with a ledger records that its serving session is alive (the
/// earnings report's uptime).
pub const DEFAULT_UPTIME_EVERY: Duration = Duration::from_secs(30);

/// A provider and the tasks it serves with.
pub struct ProviderNode {
    provider: Arc<Provider>,
    serving: Serving,
}

/// What a [`ProviderNode`] is built from; see [`ProviderNode::builder`].
#[must_use = "a builder does nothing until spawned"]
pub struct ProviderNodeBuilder {
    key: Keypair,
    engine: Arc<dyn TokenEngine>,
    mesh: MeshHandle,
    policy: ProviderPolicy,
    hardware: Option<Hardware>,
    ledger: Option<Arc<Ledger>>,
    uptime_every: Duration,
    settlement: Option<(Arc<Payee>, Duration)>,
}

impl ProviderNode {
    /// A provider signing with `key`, serving jobs on `engine` over `mesh`; by default
    /// with [`ProviderPolicy::default`], this machine's CPU as its hardware, no ledger
    /// (earnings are not booked) and no settlement on a chain.
    pub fn builder(
        key: Keypair,
        engine: Arc<dyn TokenEngine>,
        mesh: MeshHandle,
    ) -> ProviderNodeBuilder {
        ProviderNodeBuilder {
            key,
            engine,
            mesh,
            policy: ProviderPolicy::default(),
            hardware: None,
            ledger: None,
            uptime_every: DEFAULT_UPTIME_EVERY,
            settlement: None,
        }
    }

    pub fn provider(&self) -> &Arc<Provider> {
        &self.provider
    }

    pub fn node_id(&self) -> NodeId {
        self.provider.node_id()
    }

    /// Waits until one of the node's tasks ends, which none does while it serves: the
    /// caller stops the node with why, rather than run on without answering that part
    /// of the protocol.
    pub async fn stopped(&mut self) -> ServingStopped {
        self.serving.stopped().await
    }
}

impl ProviderNodeBuilder {
    pub fn policy(mut self, policy: ProviderPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The hardware it attests and advertises (default: [`Hardware::cpu_only`]; the
    /// CLI passes what [`crate::hardware::detect`] found).
    pub fn hardware(mut self, hardware: Hardware) -> Self {
        self.hardware = Some(hardware);
        self
    }

    /// Books jobs, earnings and receipts in `ledger`, and records the serving
    /// session's uptime there every [`DEFAULT_UPTIME_EVERY`].
    pub fn ledger(mut self, ledger: Arc<Ledger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// How often the uptime heartbeat is written (with a ledger only).
    pub fn uptime_every(mut self, every: Duration) -> Self {
        self.uptime_every = every.max(Duration::from_millis(1));
        self
    }

    /// Settles on chain through `payee` (SPEC §13): buyers must have offered a binding
    /// and be covered by their deposit to be served, and a settlement round runs every
    /// `every`.
    pub fn settle_on_chain(mut self, payee: Arc<Payee>, every: Duration) -> Self {
        self.settlement = Some((payee, every));
        self
    }

    /// Starts serving (job streams, quotes, model headers, adverts; settlement offers
    /// and rounds when settling on chain; the uptime heartbeat with a ledger). Call it
    /// on a Tokio runtime.
    pub fn spawn(self) -> ProviderNode {
        let hardware = self.hardware.unwrap_or_else(Hardware::cpu_only);
        let provider = Provider::new(
            self.key,
            self.engine,
            self.mesh,
            self.policy,
            hardware,
            self.ledger.clone(),
            self.settlement,
        );
        let mut serving = provider.start_serving();
        if let Some(ledger) = self.ledger {
            serving.spawn("uptime", record_uptime(ledger, self.uptime_every));
        }
        ProviderNode { provider, serving }
    }
}

/// Records, every `every` from now on, that this serving session is alive; a failed
/// write is logged and retried at the next beat (uptime is a report, not money).
async fn record_uptime(ledger: Arc<Ledger>, every: Duration) -> anyhow::Result<()> {
    let started = sharemesh_mesh::clock::now_ms();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let ledger = ledger.clone();
        let now = sharemesh_mesh::clock::now_ms();
        // sled flushes to disk: off the async runtime's threads.
        match tokio::task::spawn_blocking(move || ledger.heartbeat(started, now)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "could not record uptime"),
            Err(join) => anyhow::bail!("recording uptime panicked: {join}"),
        }
    }
}

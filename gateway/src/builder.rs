//! One way to assemble a gateway. `sharemesh gateway` and the in-process lab both build
//! theirs here, so the lab tests the wiring production runs. Verification is the
//! default: a gateway buys windows of providers' work from other providers unless it is
//! told otherwise by name ([`GatewayBuilder::without_verification`]), besides whatever
//! it replays itself.

use std::sync::Arc;
use std::time::Duration;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::MeshHandle;
use sharemesh_protocol::Keypair;
use sharemesh_settlement::Payer;

use crate::budget::Budget;
use crate::dispatch::Dispatcher;
use crate::plan::RoutingDefaults;
use crate::verify::audit::Replayer;
use crate::verify::escalate::ModelSource;
use crate::verify::outsource::OutsourcePolicy;

/// Whether and how a gateway buys checks of providers' work from other providers.
#[derive(Clone, Debug)]
enum BoughtChecks {
    /// With this policy; `None`: the default, priced at most the routing ceiling.
    Buy(Option<OutsourcePolicy>),
    /// None bought (replay here only, where the gateway holds the model).
    NotBought,
    /// Verification off altogether (`--no-verify`): nothing bought, nothing replayed.
    Off,
}

/// Assembles a [`Dispatcher`]: its mesh, key, routing defaults, ledger and budgets, and
/// how it verifies.
pub struct GatewayBuilder {
    mesh: MeshHandle,
    key: Keypair,
    defaults: RoutingDefaults,
    ledger: Option<Arc<Ledger>>,
    budget: Budget,
    bought: BoughtChecks,
    replayer: Option<Arc<dyn Replayer>>,
    model_source: Option<Arc<dyn ModelSource>>,
    report_interval: Option<Duration>,
    settlement: Option<(Arc<Payer>, Duration)>,
}

impl GatewayBuilder {
    /// A gateway on `mesh` signing with `key`: default routing, no ledger (nothing
    /// persisted), no budget, checks bought from providers.
    pub fn new(mesh: MeshHandle, key: Keypair) -> Self {
        Self {
            mesh,
            key,
            defaults: RoutingDefaults::default(),
            ledger: None,
            budget: Budget::default(),
            bought: BoughtChecks::Buy(None),
            replayer: None,
            model_source: None,
            report_interval: None,
            settlement: None,
        }
    }

    pub fn routing(mut self, defaults: RoutingDefaults) -> Self {
        self.defaults = defaults;
        self
    }

    /// Where receipts, spend and fraud proofs are kept.
    pub fn ledger(mut self, ledger: Arc<Ledger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// Buys checks with `policy` (window, plants, price ceiling) instead of the default.
    pub fn buy_checks(mut self, policy: OutsourcePolicy) -> Self {
        self.bought = BoughtChecks::Buy(Some(policy));
        self
    }

    /// Buys no checks: verifies only by replaying here (a replayer, or models fetched
    /// from a source), where it can.
    pub fn no_bought_checks(mut self) -> Self {
        self.bought = BoughtChecks::NotBought;
        self
    }

    /// Verifies nothing: no checks bought, nothing replayed. Logged as a warning when
    /// built, since a provider serving a substitute under the model's name is then paid
    /// in full.
    pub fn without_verification(mut self) -> Self {
        self.bought = BoughtChecks::Off;
        self
    }

    /// Replays providers' work on `replayer` (a model this node holds).
    pub fn replay_with(mut self, replayer: Arc<dyn Replayer>) -> Self {
        self.replayer = Some(replayer);
        self
    }

    /// Fetches a model from `source` for ground truth when its jobs cannot be settled
    /// by bought checks alone (`verify::escalate`).
    pub fn fetch_models_from(mut self, source: Arc<dyn ModelSource>) -> Self {
        self.model_source = Some(source);
        self
    }

    /// How often signed reports of verified work are gossiped (tests shorten it).
    pub fn report_interval(mut self, interval: Duration) -> Self {
        self.report_interval = Some(interval);
        self
    }

    /// Pays providers on chain through `payer` (SPEC §13): its binding offered before
    /// the first job with each, and every `every` a signed authorisation of what each
    /// channel's final receipts owe. The rounds run as long as the gateway does.
    pub fn settle_with(mut self, payer: Arc<Payer>, every: Duration) -> Self {
        self.settlement = Some((payer, every));
        self
    }

    pub fn build(self) -> Arc<Dispatcher> {
        let ceiling = self.defaults.max_price_per_token;
        let dispatcher =
            Dispatcher::new(self.mesh, self.key, self.defaults, self.ledger, self.budget);
        if let Some((payer, every)) = self.settlement {
            dispatcher.settle_with(payer, every);
        }
        let trust = dispatcher.trust();
        if let Some(interval) = self.report_interval {
            trust.set_report_interval(interval);
        }
        if let BoughtChecks::Off = self.bought {
            tracing::warn!(
                "verification is off: providers' work is not checked, and a provider serving a substitute under the model's name is paid in full"
            );
            return dispatcher;
        }
        if let Some(replayer) = self.replayer {
            trust.auditor.set_replayer(replayer);
        }
        if let Some(source) = self.model_source {
            trust.escalate_with(source);
        }
        match self.bought {
            BoughtChecks::Buy(policy) => {
                dispatcher.outsource_verification(policy.unwrap_or(OutsourcePolicy {
                    max_price_per_token: ceiling,
                    ..OutsourcePolicy::default()
                }))
            }
            BoughtChecks::NotBought | BoughtChecks::Off => {}
        }
        dispatcher
    }
}

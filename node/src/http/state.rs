//! What every route of the node's API reads: the mesh, the ledger, the provider (if the
//! node runs one) and the keys the listener checks.

use std::sync::Arc;

use sharemesh_gateway::api::error::ApiError;
use sharemesh_gateway::keys::KeyCheck;
use sharemesh_mesh::MeshHandle;

#[derive(Clone)]
pub struct AppState {
    pub(super) mesh: MeshHandle,
    pub(super) ledger: Option<Arc<sharemesh_ledger::Ledger>>,
    /// The provider this node runs, if it does (its policy view).
    #[cfg(feature = "provider")]
    pub(super) provider: Option<Arc<sharemesh_provider::Provider>>,
    /// The keys the listener checks (set by [`router`] from its [`Access`]).
    pub(super) keys: KeyCheck,
    /// The gateway's on-chain settlement, if it settles on a chain (set by [`router`]).
    pub(super) payer: Option<Arc<sharemesh_settlement::Payer>>,
}

impl AppState {
    pub fn new(mesh: MeshHandle, ledger: Option<Arc<sharemesh_ledger::Ledger>>) -> Self {
        Self {
            mesh,
            ledger,
            #[cfg(feature = "provider")]
            provider: None,
            keys: KeyCheck::default(),
            payer: None,
        }
    }

    #[cfg(feature = "provider")]
    pub fn with_provider(mut self, provider: Arc<sharemesh_provider::Provider>) -> Self {
        self.provider = Some(provider);
        self
    }

    pub(super) fn ledger(&self) -> Result<&sharemesh_ledger::Ledger, ApiError> {
        self.ledger
            .as_deref()
            .ok_or_else(|| ApiError::not_here("no_ledger", "this node keeps no ledger"))
    }
}

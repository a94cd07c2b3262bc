//! The adversary kit's provider side, behind the `adversary` cargo feature: a shipped
//! build has no kit ([`honest`] stands in, every hook a no-op and every mode refused),
//! while the lab, the tests and a testnet built with `--features adversary` get
//! [`kit`]. The provider calls the same hooks either way; only the kit's decide to lie.

#[cfg(feature = "adversary")]
mod kit;
#[cfg(feature = "adversary")]
pub use kit::*;

#[cfg(not(feature = "adversary"))]
mod honest;
#[cfg(not(feature = "adversary"))]
pub use honest::*;

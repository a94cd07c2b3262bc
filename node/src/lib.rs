//! The `sharemesh` binary's library: a thin command line over the crates that do the
//! work (`sharemesh-provider`, `sharemesh-gateway`, `sharemesh-engine`,
//! `sharemesh-mesh`, `sharemesh-testnet`). Each subcommand has its own module; the
//! only glue of its own is the in-process route from this node's gateway to its
//! provider ([`local_route`]) and the node's HTTP status API ([`http`]).

#[cfg(feature = "provider")]
pub mod attack;
pub mod chat;
pub mod cli;
pub mod commands;
pub mod config;
#[cfg(feature = "provider")]
pub mod demo;
#[cfg(feature = "provider")]
pub mod demo_settle;
pub mod gateway;
pub mod http;
pub mod identity;
#[cfg(feature = "provider")]
pub mod local_engine;
#[cfg(feature = "provider")]
pub mod local_route;
pub mod logging;
#[cfg(feature = "provider")]
pub mod models;
pub mod nat_args;
#[cfg(feature = "provider")]
pub mod provide;
#[cfg(feature = "provider")]
pub mod replay;
pub mod serve;
pub mod settle_args;
pub mod status;
#[cfg(feature = "provider")]
pub mod verify_models;
pub mod wallet;

#[cfg(all(test, feature = "provider"))]
mod tests {
    #[test]
    fn the_testnet_names_the_catalogs_default_model() {
        assert_eq!(
            sharemesh_testnet::DEFAULT_MODEL,
            sharemesh_engine::catalog::DEFAULT_MODEL
        );
    }
}

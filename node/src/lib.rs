//! The `sharemesh` binary's library: a thin command line over the crates that do the
//! work (`sharemesh-provider`, `sharemesh-gateway`, `sharemesh-engine`,
//! `sharemesh-mesh`, `sharemesh-testnet`). Each subcommand has its own module; the
//! only glue of its own is the in-process route from this node's gateway to its
//! provider ([`local_route`]) and the node's HTTP status API ([`http`]).

pub mod chat;
pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub mod gateway;
pub mod http;
pub mod identity;
pub mod lab;
pub mod local_engine;
pub mod local_route;
pub mod logging;
pub mod nat_args;
pub mod provide;
pub mod replay;
pub mod serve;
pub mod status;
pub mod verify_models;

#[cfg(test)]
mod tests {
    #[test]
    fn the_testnet_names_the_catalogs_default_model() {
        assert_eq!(
            sharemesh_testnet::DEFAULT_MODEL,
            sharemesh_engine::catalog::DEFAULT_MODEL
        );
    }
}

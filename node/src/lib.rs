//! sharemesh node: the engine that makes tokens, the model catalog, and the command
//! line. Usable as a library (see `examples/`).

pub mod buyer;
pub mod catalog;
pub mod chat;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod config;
pub mod demo;
pub mod engine;
pub mod gateway;
pub mod hardware;
pub mod http;
pub mod identity;
pub mod keys;
pub mod ledger;
pub mod logging;
pub mod mesh;
pub mod policy;
pub mod provider;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod sse;
pub mod testnet_cli;

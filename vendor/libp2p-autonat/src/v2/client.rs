mod behaviour;
mod handler;

pub use behaviour::{Behaviour, Config, Event};

mod behaviour;
mod handler;

pub use behaviour::{Behaviour, Event};

//! The API edge: each dialect (OpenAI's chat and text completions, Anthropic's Messages,
//! OpenAI's Responses) parsed into the routing core's `RouteRequest` and its answer
//! shaped back, with errors in each dialect's shape (`error`).

pub mod anthropic;
mod anthropic_tools;
mod encode;
pub mod error;
mod fields;
pub mod openai;
pub(crate) mod respond;
pub(crate) mod responses;
pub mod tools;

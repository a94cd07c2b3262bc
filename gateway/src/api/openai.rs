//! Parsing and validating OpenAI-style request bodies. Fields are read from JSON by
//! name so every error names the field at fault; unknown fields are ignored as
//! OpenAI's API does.

use serde_json::{Map, Value};
use sharemesh_protocol::{ChatMessage, NanoUsd, OutputFormat, Prompt, Role, Sampling, Tier};

use super::error::ApiError;
use crate::api::fields::{boolean, integer, kind, number, object, string, text_content};
use crate::route::{RouteRequest, RoutingOptions};

#[derive(Clone, Debug)]
pub struct CompletionRequest {
    /// What the routing core serves: the model, the prompt, sampling and routing.
    pub route: RouteRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub chat: bool,
    /// Choices asked for (OpenAI's `n`, 1..=`MAX_CHOICES`): the gateway runs that many
    /// separate jobs (seeds `seed`, `seed + 1`, …); the dispatcher runs one.
    pub n: u32,
    /// Tools the model may call (the answer's format is already in `sampling.format`;
    /// the gateway reads the answer back into calls with these).
    pub tools: Option<std::sync::Arc<crate::api::tools::Tools>>,
}

/// The most choices one request may ask for (each is a job, paid for).
pub const MAX_CHOICES: u64 = 8;

fn stop(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match obj.get("stop") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_owned).ok_or_else(|| {
                    ApiError::invalid("stop", "`stop` must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "`stop` must be a string or a list of strings, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if list.len() > 4 {
        return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    Ok(list)
}

/// The `messages` array: required, and not empty.
pub(crate) fn message_list(obj: &Map<String, Value>) -> Result<&Vec<Value>, ApiError> {
    match obj.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => Ok(list),
        Some(Value::Array(_)) => Err(ApiError::invalid(
            "messages",
            "`messages` must not be empty",
        )),
        None | Some(Value::Null) => Err(ApiError::invalid("messages", "`messages` is required")),
        Some(other) => Err(ApiError::invalid(
            "messages",
            format!("`messages` must be an array, got {}", kind(other)),
        )),
    }
}

fn messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = message_list(obj)?;
    let mut tool_names = std::collections::HashMap::new();
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            if let Some(written) = crate::api::tools::message(m, i, &mut tool_names)? {
                return Ok(written);
            }
            let role = match m.get("role").and_then(Value::as_str) {
                Some("system") | Some("developer") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                other => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        format!(
                            "`messages[{i}].role` must be system, user, assistant or tool, got {other:?}"
                        ),
                    ))
                }
            };
            Ok(ChatMessage {
                role,
                content: text_content(
                    m.get("content").unwrap_or(&Value::Null),
                    &format!("messages[{i}].content"),
                    &["text"],
                )?,
            })
        })
        .collect()
}

/// `top_p` in (0, 1], 1 when absent.
pub(crate) fn top_p(obj: &Map<String, Value>) -> Result<f32, ApiError> {
    match number(obj, "top_p", 0.0, 1.0)? {
        Some(p) if p <= 0.0 => Err(ApiError::invalid("top_p", "`top_p` must be greater than 0")),
        Some(p) => Ok(p as f32),
        None => Ok(1.0),
    }
}

pub(crate) fn routing(
    obj: &Map<String, Value>,
    headers: &axum::http::HeaderMap,
) -> Result<RoutingOptions, ApiError> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let empty = Map::new();
    let options = match obj.get("sharemesh") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ApiError::invalid(
                "sharemesh",
                format!("`sharemesh` must be an object, got {}", kind(other)),
            ))
        }
    };
    let mut routing = RoutingOptions::default();
    let price = match number(options, "max_price_per_mtok", 0.0, 1e9)? {
        Some(p) => Some(p),
        None => header("x-sharemesh-max-price-per-mtok")
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| p.is_finite() && (0.0..=1e9).contains(p))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "x-sharemesh-max-price-per-mtok",
                            "must be a number from 0 to 1e9 (USD per million tokens)",
                        )
                    })
            })
            .transpose()?,
    };
    // A ceiling the caller named is never silently replaced by the default one.
    routing.max_price_per_token = match price {
        None => None,
        Some(p) => Some(NanoUsd::per_token_from_usd_per_mtok(p).ok_or_else(|| {
            ApiError::invalid("sharemesh.max_price_per_mtok", "is not a usable price")
        })?),
    };
    let tier = string(options, "tier")?
        .map(str::to_owned)
        .or_else(|| header("x-sharemesh-tier"));
    routing.tier = tier
        .map(|t| {
            t.parse::<Tier>()
                .map_err(|e| ApiError::invalid("sharemesh.tier", e))
        })
        .transpose()?;
    routing.region = string(options, "region")?
        .map(str::to_owned)
        .or_else(|| header("x-sharemesh-region"));
    let vram = match number(options, "min_vram_gb", 0.0, 1e6)? {
        Some(v) => Some(v),
        None => header("x-sharemesh-min-vram-gb")
            .map(|v| {
                v.parse::<f64>()
                    .map_err(|_| ApiError::invalid("x-sharemesh-min-vram-gb", "must be a number"))
            })
            .transpose()?,
    };
    routing.min_vram_bytes = vram.map(|gb| (gb * 1e9) as u64);
    routing.interruptible = boolean(options, "interruptible")?.unwrap_or(false)
        || header("x-sharemesh-interruptible").is_some_and(|v| v == "true" || v == "1");
    routing.hedge = match boolean(options, "hedge")? {
        Some(hedge) => Some(hedge),
        None => header("x-sharemesh-hedge")
            .map(|v| match v.as_str() {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(ApiError::invalid(
                    "x-sharemesh-hedge",
                    "must be true or false",
                )),
            })
            .transpose()?,
    };
    Ok(routing)
}

/// OpenAI fields sharemesh cannot honour yet, refused with a 400 naming the field when
/// set to anything but their neutral value (silently ignoring them would return an
/// answer the client did not ask for). Fields with no effect on the answer (`user`,
/// `metadata`, `store`, `service_tier`, …) are accepted.
fn refuse_unserved(obj: &Map<String, Value>, chat: bool) -> Result<(), ApiError> {
    if !chat {
        for field in ["tools", "tool_choice", "response_format"] {
            if obj.get(field).is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` is a chat field: use /v1/chat/completions"),
                ));
            }
        }
    }
    let neutral = |value: &Value| match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        // `function_call: "none"`/`"auto"` asks for nothing (tools are parsed elsewhere).
        Value::String(s) => s == "none" || s == "auto",
    };
    for (field, why) in [
        ("functions", "function calling is not supported"),
        ("function_call", "function calling is not supported"),
        ("suffix", "insertion (a suffix) is not supported"),
        ("echo", "echoing the prompt is not supported"),
        ("best_of", "`best_of` is not supported"),
        ("audio", "audio output is not supported"),
        ("modalities", "only text output is supported"),
        ("prediction", "predicted outputs are not supported"),
        ("web_search_options", "web search is not supported"),
    ] {
        if let Some(value) = obj.get(field) {
            let served = field == "modalities"
                && value
                    .as_array()
                    .is_some_and(|m| m.iter().all(|v| v == "text"));
            if !neutral(value) && !served {
                return Err(ApiError::invalid(field, format!("`{field}`: {why}")));
            }
        }
    }
    Ok(())
}

/// Chat: `logprobs: true` with `top_logprobs` (0..=20) alternatives; completions:
/// `logprobs: N` (0..=5) alternatives. `None`: no log-probabilities.
fn logprobs(obj: &Map<String, Value>, chat: bool) -> Result<Option<u8>, ApiError> {
    if !chat {
        return Ok(integer(obj, "logprobs", 0, 5)?.map(|n| n as u8));
    }
    let top = integer(obj, "top_logprobs", 0, 20)?;
    match boolean(obj, "logprobs")? {
        Some(true) => Ok(Some(top.unwrap_or(0) as u8)),
        _ if top.is_some_and(|n| n > 0) => Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        _ => Ok(None),
    }
}

/// `logit_bias`: `{"<token id>": bias}` with biases in -100..=100, at most 300 tokens;
/// sorted by id as the wire wants it.
fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match obj.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(ApiError::invalid(
                "logit_bias",
                format!(
                    "`logit_bias` must be an object of token ids, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if map.len() > sharemesh_protocol::MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "{} tokens, limit {}",
                map.len(),
                sharemesh_protocol::MAX_LOGIT_BIAS
            ),
        ));
    }
    let mut bias = Vec::with_capacity(map.len());
    for (token, value) in map {
        let id: u32 = token.parse().map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` keys must be token ids, got `{token}`"),
            )
        })?;
        let add = value
            .as_f64()
            .filter(|v| (-100.0..=100.0).contains(v))
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("the bias of token {id} must be a number within -100..=100"),
                )
            })?;
        bias.push((id, add as f32));
    }
    bias.sort_by_key(|&(id, _)| id);
    if bias.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(ApiError::invalid(
            "logit_bias",
            "a token id is listed twice (as `7` and `07`?)",
        ));
    }
    Ok(bias)
}

/// `response_format` or `tools` (not both): the format the provider must hold the
/// answer to, and for tools the note that presents them.
fn shaped_output(
    obj: &Map<String, Value>,
    prompt: Prompt,
    mut sampling: Sampling,
) -> Result<
    (
        Prompt,
        Sampling,
        Option<std::sync::Arc<crate::api::tools::Tools>>,
    ),
    ApiError,
> {
    sampling.format = crate::api::tools::response_format(obj)?;
    let Some(tools) = crate::api::tools::parse(obj)? else {
        return Ok((prompt, sampling, None));
    };
    if !sampling.format.is_free() {
        return Err(ApiError::invalid(
            "response_format",
            "`response_format` and `tools` cannot be combined: a tool call has its own format",
        ));
    }
    let Prompt::Chat(messages) = prompt else {
        return Err(ApiError::invalid("tools", "`tools` needs chat messages"));
    };
    sampling.format = tools.format();
    let prompt = Prompt::Chat(crate::api::tools::with_instructions(messages, &tools));
    Ok((prompt, sampling, Some(std::sync::Arc::new(tools))))
}

/// Parses `/v1/chat/completions` (chat = true) or `/v1/completions` bodies.
pub fn parse(
    body: &[u8],
    chat: bool,
    headers: &axum::http::HeaderMap,
) -> Result<CompletionRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    let obj = object(&value)?;
    let model = string(obj, "model")?
        .ok_or_else(|| ApiError::invalid("model", "`model` is required"))?
        .to_owned();
    let prompt = if chat {
        Prompt::Chat(messages(obj)?)
    } else {
        match obj.get("prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                Prompt::Text(items[0].as_str().unwrap_or_default().to_owned())
            }
            Some(Value::Array(items)) if !items.is_empty() && items.iter().all(|v| v.is_u64()) => {
                Prompt::Tokens(
                    items
                        .iter()
                        .filter_map(Value::as_u64)
                        .map(|v| v as u32)
                        .collect(),
                )
            }
            None | Some(Value::Null) => {
                return Err(ApiError::invalid("prompt", "`prompt` is required"))
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string (batches of prompts are not supported)",
                ))
            }
        }
    };
    let n = integer(obj, "n", 1, MAX_CHOICES)?.unwrap_or(1) as u32;
    let max_tokens = match integer(obj, "max_completion_tokens", 1, 131_072)? {
        Some(v) => Some(v),
        None => integer(obj, "max_tokens", 1, 131_072)?,
    };
    let sampling = Sampling {
        temperature: number(obj, "temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32,
        top_p: top_p(obj)?,
        top_k: integer(obj, "top_k", 0, 100_000)?.unwrap_or(0) as u32,
        repetition_penalty: number(obj, "repetition_penalty", 0.5, 2.0)?.unwrap_or(1.0) as f32,
        seed: match obj.get("seed") {
            Some(Value::Number(n)) => n
                .as_u64()
                .or_else(|| n.as_i64().map(|v| v as u64))
                .ok_or_else(|| ApiError::invalid("seed", "`seed` must be an integer"))?,
            None | Some(Value::Null) => 0,
            Some(other) => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("`seed` must be an integer, got {}", kind(other)),
                ))
            }
        },
        max_tokens: max_tokens.unwrap_or(256) as u32,
        stop: stop(obj)?,
        format: OutputFormat::Free,
        presence_penalty: number(obj, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: number(obj, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        logit_bias: logit_bias(obj)?,
        logprobs: logprobs(obj, chat)?,
    };
    let stream = boolean(obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        Some(Value::Object(o)) => boolean(o, "include_usage")?.unwrap_or(false),
        None | Some(Value::Null) => false,
        Some(other) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("`stream_options` must be an object, got {}", kind(other)),
            ))
        }
    };
    string(obj, "user")?;
    refuse_unserved(obj, chat)?;
    let (prompt, sampling, tools) = shaped_output(obj, prompt, sampling)?;
    Ok(CompletionRequest {
        route: RouteRequest {
            model,
            prompt,
            sampling,
            routing: routing(obj, headers)?,
        },
        tools,
        stream,
        include_usage,
        chat,
        n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_chat(json: &str) -> Result<CompletionRequest, ApiError> {
        parse(json.as_bytes(), true, &axum::http::HeaderMap::new())
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(parse_chat("{").unwrap_err().param, None);
        assert_eq!(
            parse_chat(r#"{"messages": []}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("model")
        );
        assert_eq!(
            parse_chat(r#"{"model": "m"}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("messages")
        );
        let base = r#""model": "m", "messages": [{"role": "user", "content": "hi"}]"#;
        for (extra, field) in [
            (r#""temperature": 3"#, "temperature"),
            (r#""temperature": "hot""#, "temperature"),
            (r#""top_p": 0"#, "top_p"),
            (r#""max_tokens": 0"#, "max_tokens"),
            (r#""n": 9"#, "n"),
            (r#""n": 0"#, "n"),
            (r#""stop": 5"#, "stop"),
            (r#""stream": "yes""#, "stream"),
            (r#""sharemesh": {"tier": "platinum"}"#, "sharemesh.tier"),
            (r#""frequency_penalty": 2.5"#, "frequency_penalty"),
            (r#""presence_penalty": "lots""#, "presence_penalty"),
            (r#""logit_bias": {"50256": -101}"#, "logit_bias"),
            (r#""logit_bias": {"fifty": 1}"#, "logit_bias"),
            (r#""logprobs": 3"#, "logprobs"),
            (r#""top_logprobs": 2"#, "top_logprobs"),
            (r#""logprobs": true, "top_logprobs": 21"#, "top_logprobs"),
            (r#""tools": [{"type": "function"}]"#, "tools[0].function"),
            (
                r#""response_format": {"type": "xml"}"#,
                "response_format.type",
            ),
        ] {
            let err = parse_chat(&format!("{{{base}, {extra}}}")).unwrap_err();
            assert_eq!(
                err.param.as_deref(),
                Some(field),
                "{extra}: {}",
                err.message
            );
        }
        let err = parse_chat(r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#)
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn accepts_openai_shapes_and_ignores_unknown_fields() {
        let req = parse_chat(
            r#"{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "max_completion_tokens": 5, "stop": "x", "stream": true, "stream_options": {"include_usage": true},
                "seed": 3, "user": "u", "logit_bias": {}, "frequency_penalty": 0, "logprobs": false,
                "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "modalities": ["text"],
                "sharemesh": {"max_price_per_mtok": 0.2, "tier": "bronze", "region": "eu", "min_vram_gb": 8, "hedge": true}}"#,
        )
        .unwrap();
        assert_eq!(req.route.sampling.max_tokens, 5);
        assert_eq!(req.route.sampling.stop, vec!["x"]);
        assert!(req.stream && req.include_usage);
        assert_eq!(req.route.routing.tier, Some(Tier::Interruptible));
        assert_eq!(req.route.routing.max_price_per_token, Some(NanoUsd(200)));
        assert_eq!(req.route.routing.min_vram_bytes, Some(8_000_000_000));
        assert_eq!(req.route.routing.hedge, Some(true));
        let Prompt::Chat(messages) = req.route.prompt else {
            panic!()
        };
        assert_eq!(messages[1].content, "hi");
    }

    #[test]
    fn the_hedge_header_must_be_a_boolean() {
        let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-sharemesh-hedge", "0".parse().unwrap());
        assert_eq!(
            parse(body, true, &headers).unwrap().route.routing.hedge,
            Some(false)
        );
        headers.insert("x-sharemesh-hedge", "maybe".parse().unwrap());
        let err = parse(body, true, &headers).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-sharemesh-hedge"));
        let absent = parse(body, true, &axum::http::HeaderMap::new()).unwrap();
        assert_eq!(absent.route.routing.hedge, None);
    }

    /// A price ceiling that is not a usable price is an error naming it, never the
    /// gateway's default ceiling in its place.
    #[test]
    fn a_price_header_that_is_no_price_is_refused() {
        let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-sharemesh-max-price-per-mtok", "0.2".parse().unwrap());
        assert_eq!(
            parse(body, true, &headers)
                .unwrap()
                .route
                .routing
                .max_price_per_token,
            Some(NanoUsd(200))
        );
        for bad in ["NaN", "-1", "inf", "1e12", "cheap", ""] {
            headers.insert("x-sharemesh-max-price-per-mtok", bad.parse().unwrap());
            let err = parse(body, true, &headers).unwrap_err();
            assert_eq!(
                err.param.as_deref(),
                Some("x-sharemesh-max-price-per-mtok"),
                "{bad}"
            );
        }
    }
}

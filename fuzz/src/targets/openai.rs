//! OpenAI request bodies as the gateway parses them: `[0: completions, 1: chat] ‖ JSON`.

use axum::http::HeaderMap;

use crate::Target;

const BODIES: &[&str] = &[
    r##"{"model": "smollm2-135m-instruct", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "stop": ["\n", "--"], "stream": true, "seed": 7, "sharemesh": {"tier": "gold", "max_price_per_mtok": 1.5, "region": "eu", "min_vram_gb": 8, "hedge": true}}"##,
    r##"{"model": "56e91e8d496e43a1f0d001a01e27c9f2b2aa26afc2ed61f68f5efa2cfca7aa11", "messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}], "max_completion_tokens": 3}"##,
    r##"{"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stop": "\n"}"##,
    r##"{"model": "m", "prompt": ["a", "b"], "n": 1, "logprobs": null, "stream_options": {"include_usage": true}}"##,
];

pub fn target() -> Target {
    Target {
        name: "openai",
        seeds: || {
            BODIES
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    let mut input = vec![u8::from(i < 2)];
                    input.extend_from_slice(body.as_bytes());
                    input
                })
                .collect()
        },
        run: Box::new(|input: &[u8]| {
            let Some((&chat, body)) = input.split_first() else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.insert(
                "x-sharemesh-tier",
                axum::http::HeaderValue::from_static("bronze"),
            );
            let _ = sharemesh_gateway::api::openai::parse(body, chat & 1 == 1, &headers);
        }),
    }
}

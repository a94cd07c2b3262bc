#!/usr/bin/env python3
"""A buyer using the official OpenAI Python SDK against a sharemesh gateway.

    sharemesh gateway --bootstrap /ip4/…/tcp/4001 --http 127.0.0.1:8080   # or: sharemesh testnet up
    python3 examples/openai_buyer.py [http://127.0.0.1:8080/v1]

Nothing here is sharemesh-specific except the optional `sharemesh` routing object.
"""
import sys

from openai import OpenAI

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = OpenAI(base_url=base_url, api_key="unused-on-loopback")

print("models on the network:", [m.id for m in client.models.list().data])

stream = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "Write a short poem about the sea."}],
    temperature=0,
    max_tokens=64,
    stream=True,
    stream_options={"include_usage": True},
    # Routing: at most $0.50 per million tokens, on-demand tier, any region.
    extra_body={"sharemesh": {"max_price_per_mtok": 0.5, "tier": "on_demand"}},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n\n{chunk.usage.completion_tokens} completion tokens")

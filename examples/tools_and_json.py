#!/usr/bin/env python3
"""Tool calling and structured output through a sharemesh gateway, with the official
OpenAI Python SDK, exactly as against any OpenAI-compatible server.

    sharemesh gateway --bootstrap /ip4/…/tcp/4001 --http 127.0.0.1:8080   # or: sharemesh testnet up
    python3 examples/tools_and_json.py [http://127.0.0.1:8080/v1]

The provider enforces the formats by constrained decoding, so even the 135M catalog
model answers in the shape asked for (what it says inside that shape is up to it).
"""
import json
import sys

import pydantic
from openai import OpenAI

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
client = OpenAI(base_url=base_url, api_key="unused-on-loopback")
MODEL = "smollm2-135m-instruct"


# Structured output: a pydantic model in, a parsed object out.
class City(pydantic.BaseModel):
    name: str
    country: str
    population: int = pydantic.Field(ge=0, le=50_000_000)  # bounded: small models ramble digits


city = client.chat.completions.parse(model=MODEL, temperature=0, max_tokens=80,
                                     messages=[{"role": "user", "content": "Describe Paris."}],
                                     response_format=City).choices[0].message.parsed
print("structured:", city)


# A tool loop: the model asks for a call, we run it, it answers with the result.
def get_weather(city: str) -> str:
    return f"18 degrees and sunny in {city}"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=60).choices[0]
messages.append(reply.message.model_dump(exclude_none=True))
for call in reply.message.tool_calls or []:
    arguments = json.loads(call.function.arguments)
    print(f"tool call: {call.function.name}({arguments})")
    messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**arguments)})
final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                       max_tokens=80).choices[0]
print("answer:", final.message.content or final.message.tool_calls)

# Log-probabilities of each token, with the runners-up.
lp = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2,
                                    messages=[{"role": "user", "content": "What is 2 + 2?"}])
for entry in lp.choices[0].logprobs.content:
    print(f"{entry.token!r:>12} {entry.logprob:7.3f}  next best: {[t.token for t in entry.top_logprobs[1:]]}")

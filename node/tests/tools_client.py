"""Structured output and tool calling through a running gateway, with the official OpenAI
Python SDK as a buyer's code calls them: `response_format` json_schema (also through the
SDK's pydantic `parse` helper) and json_object, `tools` with `tool_choice` required /
named / auto, a tool result sent back, streamed `tool_calls` deltas, and errors that
name the field.

Usage: python3 tools_client.py BASE_URL MODEL
Prints one JSON object of findings; exits non-zero on the first failed check.
"""
import json
import sys

import openai
import pydantic
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key="unused-on-loopback", max_retries=0, timeout=180)
results = {}


def check(condition, message):
    if not condition:
        print(json.dumps({"failed": message, "results": results}, default=str))
        sys.exit(1)


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Tell me about a French woman named Alice who is 31."}]

# A JSON schema: the answer parses and holds to it.
reply = client.chat.completions.create(
    model=model, messages=ASK, temperature=0, max_tokens=80,
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
content = reply.choices[0].message.content
person = json.loads(content)
check(set(person) == {"name", "age", "city"}, f"schema keys: {content}")
check(isinstance(person["age"], int) and person["city"] in ("Paris", "Lyon", "Nice"), f"schema types: {content}")
check(reply.choices[0].finish_reason == "stop", "finish after the object")
results["json_schema"] = person
# Streamed, the same schema-valid answer arrives in deltas.
chunks = list(client.chat.completions.create(
    model=model, messages=ASK, temperature=0, max_tokens=80, stream=True,
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == content and len(chunks) > 5, f"streamed json_schema {streamed!r} in {len(chunks)} chunks")


# The SDK's own structured-output helper (pydantic model to strict schema, parsed back).
class City(pydantic.BaseModel):
    name: str
    country: str
    # Bounded: left unbounded, a 135M model writes digits until max_tokens.
    population: int = pydantic.Field(ge=0, le=100_000_000)


parsed = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Describe Paris."}],
                                       temperature=0, max_tokens=80, response_format=City)
city = parsed.choices[0].message.parsed
check(isinstance(city, City) and isinstance(city.population, int), f"parsed: {parsed.choices[0].message}")
results["parse"] = city.model_dump()

# The Responses API's structured output (text.format), through the SDK's parse helper.
response = client.responses.parse(model=model, input="Describe Paris.", temperature=0, max_output_tokens=80,
                                  text_format=City)
check(isinstance(response.output_parsed, City), f"responses.parse: {response.output_text}")
results["responses_parse"] = response.output_parsed.model_dump()

# Any JSON object.
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "List three colours."}],
                                       temperature=0, max_tokens=60, response_format={"type": "json_object"})
check(isinstance(json.loads(reply.choices[0].message.content), dict), "json_object")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

# tool_choice required: a call, shaped as OpenAI shapes it.
reply = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=60)
choice = reply.choices[0]
check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
check(choice.message.content is None and choice.message.tool_calls, f"message {choice.message}")
call = choice.message.tool_calls[0]
check(call.type == "function" and call.function.name in ("get_weather", "get_time"), f"call {call}")
arguments = json.loads(call.function.arguments)
check(isinstance(arguments.get("city"), str), f"arguments {call.function.arguments}")
check(call.id.startswith("call_"), f"call id {call.id}")
results["required"] = {"name": call.function.name, "arguments": arguments}

# The tool's result goes back; with auto the model answers (in text or with another call).
follow = QUESTION + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
reply = client.chat.completions.create(model=model, messages=follow, tools=[WEATHER, TIME], temperature=0,
                                       max_tokens=80)
answer = reply.choices[0]
check(answer.finish_reason in ("stop", "tool_calls"), f"finish after a result: {answer.finish_reason}")
check(bool(answer.message.content) or bool(answer.message.tool_calls), f"an answer after the result: {answer.message}")
results["after_result"] = answer.message.content or "(another call)"

# With tools offered (auto), a text answer streams as it is written, not at the end.
if answer.message.content:
    chunks = list(client.chat.completions.create(model=model, messages=follow, tools=[WEATHER, TIME],
                                                 temperature=0, max_tokens=80, stream=True))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    check(len(deltas) > 3, f"streamed in {len(deltas)} deltas")
    check("".join(deltas) == answer.message.content, f"streamed {''.join(deltas)!r}")
    check([c.choices[0].finish_reason for c in chunks if c.choices][-1] == answer.finish_reason, "finish")

# A named tool, streamed: the call arrives as OpenAI's tool_calls deltas.
stream = client.chat.completions.create(
    model=model, messages=QUESTION, tools=[WEATHER, TIME], temperature=0, max_tokens=60, stream=True,
    tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
calls, finishes = {}, []
for chunk in stream:
    for c in chunk.choices:
        finishes.append(c.finish_reason)
        for delta in c.delta.tool_calls or []:
            slot = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            slot["id"] = delta.id or slot["id"]
            if delta.function:
                slot["name"] = delta.function.name or slot["name"]
                slot["arguments"] += delta.function.arguments or ""
check(finishes[-1] == "tool_calls", f"streamed finish {finishes}")
check(len(calls) == 1 and calls[0]["name"] == "get_time" and calls[0]["id"], f"streamed calls {calls}")
check(isinstance(json.loads(calls[0]["arguments"]).get("city"), str), f"streamed arguments {calls}")
results["streamed"] = calls[0]

# Penalties and biases are served (and change the answer).
plain = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24)
steered = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24,
                                         frequency_penalty=1.5, presence_penalty=0.5, logit_bias={"504": -100})
check(steered.choices[0].message.content != plain.choices[0].message.content,
      f"penalties changed nothing: {steered.choices[0].message.content!r}")
results["penalised"] = steered.choices[0].message.content

# Log-probabilities: one entry per token, the alternatives best first; greedy draws the
# best, so each token is its own first alternative. Streamed, each chunk carries its own.
lp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                    temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
entries = lp.choices[0].logprobs.content
check(len(entries) == lp.usage.completion_tokens, f"{len(entries)} entries, {lp.usage.completion_tokens} tokens")
for entry in entries:
    check(entry.logprob <= 0 and len(entry.top_logprobs) == 3, f"entry {entry}")
    check(entry.top_logprobs[0].token == entry.token, f"greedy picks the best: {entry}")
    check(abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-6, f"same value: {entry}")
    ranked = [t.logprob for t in entry.top_logprobs]
    check(ranked == sorted(ranked, reverse=True), f"best first: {ranked}")
check("".join(e.token for e in entries) == lp.choices[0].message.content, "the tokens spell the answer")
streamed = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                          temperature=0, max_tokens=12, logprobs=True, stream=True)
streamed_entries = [e for c in streamed for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
check([e.logprob for e in streamed_entries] == [e.logprob for e in entries], "streamed log-probabilities")
completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                       temperature=0, logprobs=2)
check(len(completion.choices[0].logprobs.tokens) == 4 and len(completion.choices[0].logprobs.top_logprobs[0]) == 2,
      f"completions logprobs {completion.choices[0].logprobs}")
results["logprobs"] = [(e.token, round(e.logprob, 4)) for e in entries[:4]]

# Errors name the field.
for kwargs, field in [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ({"logit_bias": {"504": 250}}, "logit_bias"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    # A schema llguidance cannot compile: refused by the gateway before any provider works.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     "response_format"),
]:
    try:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, **kwargs)
        check(False, f"{kwargs} was accepted")
    except openai.BadRequestError as err:
        check(err.body.get("param") == field, f"{kwargs}: {err.body}")

print(json.dumps({"ok": True, "results": results}))

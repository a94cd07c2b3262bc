"""Drives a running gateway with the official Anthropic Python SDK, as a buyer would.

Usage: python3 anthropic_client.py BASE_URL MODEL [KEYED_BASE_URL API_KEY]
BASE_URL without /v1 (the SDK adds /v1/messages). Prints one JSON object of findings;
exits non-zero on the first failed check.
"""
import json
import sys

import anthropic
from anthropic import Anthropic

base, model = sys.argv[1], sys.argv[2]
client = Anthropic(base_url=base, api_key="unused-on-loopback", max_retries=0, timeout=120)
results = {}
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
ANSWER = "The answer is 4."
# The SDK no longer takes `temperature` as an argument; the API still does.
GREEDY = {"temperature": 0}


def check(condition, message):
    if not condition:
        print(json.dumps({"failed": message, "results": results}))
        sys.exit(1)


# A whole message: text, end of turn, usage, the job and provider headers.
raw = client.messages.with_raw_response.create(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
message = raw.parse()
check(message.type == "message" and message.role == "assistant", f"shape {message}")
check(message.id.startswith("msg_"), f"id {message.id}")
check(message.content[0].type == "text" and message.content[0].text == ANSWER, f"text {message.content}")
check(message.stop_reason == "end_turn" and message.stop_sequence is None, f"stop {message.stop_reason}")
check(message.usage.output_tokens == 6 and message.usage.input_tokens > 0, f"usage {message.usage}")
check(raw.headers.get("x-sharemesh-provider", "").startswith("12D3KooW"), "provider header")
results["message"] = message.content[0].text

# Counting a prompt gives what the message was billed for.
counted = client.messages.count_tokens(model=model, messages=QUESTION)
check(counted.input_tokens == message.usage.input_tokens, f"count_tokens {counted} vs {message.usage}")
results["input_tokens"] = counted.input_tokens

# Cut by max_tokens, and by a stop sequence (named in the answer).
short = client.messages.create(model=model, max_tokens=3, messages=QUESTION, extra_body=GREEDY)
check(short.stop_reason == "max_tokens" and short.usage.output_tokens == 3, f"max_tokens {short}")
stopped = client.messages.create(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY,
                                 stop_sequences=[" 4"])
check(stopped.content[0].text == "The answer is", f"stopped text {stopped.content}")
check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " 4", f"stop {stopped}")

# A system prompt and several turns.
turns = client.messages.create(
    model=model, max_tokens=8, extra_body=GREEDY, system="You are a terse assistant.",
    messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": [{"type": "text", "text": "What is 2 + 2?"}]}])
check(turns.content[0].text.strip() != "", f"turns {turns}")

# Streaming, through the SDK's helper and as raw events.
with client.messages.stream(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
check(text == ANSWER, f"streamed text {text!r}")
check(final.stop_reason == "end_turn" and final.usage.output_tokens == 6, f"final {final}")
events = [e.type for e in client.messages.create(model=model, max_tokens=16, messages=QUESTION,
                                                 extra_body=GREEDY, stream=True)]
check(events[:2] == ["message_start", "content_block_start"], f"events {events}")
check(events[-3:] == ["content_block_stop", "message_delta", "message_stop"], f"events {events}")
check("content_block_delta" in events, f"events {events}")
results["stream_events"] = len(events)


# Errors, each in Anthropic's shape.
def expect(error_type, status, error_kind, **kwargs):
    try:
        client.messages.create(**kwargs)
    except error_type as err:
        check(err.status_code == status, f"{error_type.__name__}: status {err.status_code}")
        body = err.body or {}
        check(body.get("type") == "error" and body["error"]["type"] == error_kind, f"body {body}")
        return body["error"]["message"]
    check(False, f"expected {error_type.__name__}")


# Tool use: a tool_use block with its input, stop_reason tool_use; the result goes back
# as a tool_result block; streamed, the input arrives as an input_json_delta.
tools = [{"name": "get_weather", "description": "The current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
used = client.messages.create(model=model, max_tokens=60, messages=WEATHER, tools=tools,
                              tool_choice={"type": "any"}, extra_body=GREEDY)
check(used.stop_reason == "tool_use", f"stop_reason {used.stop_reason}")
use = [b for b in used.content if b.type == "tool_use"]
check(use and use[0].name == "get_weather" and isinstance(use[0].input.get("city"), str), f"tool_use {used.content}")
check(use[0].id.startswith("toolu_"), f"tool_use id {use[0].id}")
results["tool_use"] = use[0].input
after = client.messages.create(model=model, max_tokens=60, tools=tools, extra_body=GREEDY, messages=WEATHER + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in used.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "18 degrees"}]}])
check(after.stop_reason in ("end_turn", "tool_use", "max_tokens") and after.content, f"after the result {after}")
if after.content[0].type == "text":
    # With tools offered (auto), a text answer streams as it is written.
    with client.messages.stream(model=model, max_tokens=60, tools=tools, extra_body=GREEDY, messages=WEATHER + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in used.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "18 degrees"}]}]) as s:
        deltas = [e.delta.text for e in s if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    check(len(deltas) > 1 and "".join(deltas) == after.content[0].text, f"streamed text {deltas}")
with client.messages.stream(model=model, max_tokens=60, messages=WEATHER, tools=tools, extra_body=GREEDY,
                            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
    kinds = [e.type for e in stream]
    final = stream.get_final_message()
check("content_block_start" in kinds and kinds[-1] == "message_stop", f"streamed events {kinds}")
check(final.stop_reason == "tool_use" and final.content[0].type == "tool_use", f"streamed {final}")
check(isinstance(final.content[0].input.get("city"), str), f"streamed input {final.content[0]}")
# Structured output: output_config.format with a JSON schema.
shaped = client.messages.create(model=model, max_tokens=60, messages=[{"role": "user", "content": "Name a colour."}],
                                extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema", "schema": {
                                    "type": "object", "properties": {"colour": {"type": "string"}},
                                    "required": ["colour"], "additionalProperties": False}}}})
check(isinstance(json.loads(shaped.content[0].text).get("colour"), str), f"output_config.format {shaped.content}")
why = expect(anthropic.BadRequestError, 400, "invalid_request_error", model=model, max_tokens=8, messages=QUESTION,
             tools=tools, tool_choice={"type": "tool", "name": "nope"})
check("tool_choice" in why, f"names the field: {why}")
expect(anthropic.BadRequestError, 400, "invalid_request_error",
       model=model, max_tokens=8, messages=QUESTION + [{"role": "assistant", "content": "The"}])
expect(anthropic.NotFoundError, 404, "not_found_error", model="no-such-model", max_tokens=8, messages=QUESTION)

# API keys in x-api-key on a gateway that requires them.
if len(sys.argv) > 4:
    keyed, key = sys.argv[3], sys.argv[4]
    try:
        Anthropic(base_url=keyed, api_key="sk-sm-wrong", max_retries=0).messages.create(
            model=model, max_tokens=4, messages=QUESTION)
        check(False, "expected 401")
    except anthropic.AuthenticationError as err:
        check(err.status_code == 401 and err.body["error"]["type"] == "authentication_error", f"{err.body}")
    ok = Anthropic(base_url=keyed, api_key=key, max_retries=0).messages.create(
        model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    check(ok.content[0].text == ANSWER, f"keyed {ok}")
    results["api_keys"] = "ok"

print(json.dumps({"ok": True, "results": results}))

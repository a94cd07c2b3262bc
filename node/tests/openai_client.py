"""Drives a running gateway with the official OpenAI Python SDK, as a buyer would.

Usage: python3 openai_client.py BASE_URL MODEL [KEYED_BASE_URL API_KEY]
Prints one JSON object of findings; exits non-zero on the first failed check.
"""
import asyncio
import json
import sys
import time
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key="unused-on-loopback", max_retries=0, timeout=120)
results = {}


def check(condition, message):
    if not condition:
        print(json.dumps({"failed": message, "results": results}))
        sys.exit(1)


# Non-streaming chat, with the provider and job headers.
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], temperature=0, max_tokens=16)
chat = raw.parse()
check(chat.choices[0].message.content == "The answer is 4.", f"chat answer: {chat.choices[0].message.content!r}")
check(chat.choices[0].finish_reason == "stop", "chat finish_reason")
check(chat.usage.completion_tokens == 6 and chat.usage.prompt_tokens > 0, f"usage {chat.usage}")
check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, "total tokens")
check(raw.headers.get("x-sharemesh-provider", "").startswith("12D3KooW"), "x-sharemesh-provider header")
check(len(raw.headers.get("x-sharemesh-job", "")) == 32, "x-sharemesh-job header")
results["chat"] = chat.choices[0].message.content

# Streaming chat: role first, content deltas, finish_reason last, usage when asked.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], temperature=0, max_tokens=16,
    stream=True, stream_options={"include_usage": True})
chunks = list(stream)
check(chunks[0].choices[0].delta.role == "assistant", "role in the first delta")
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text == "The answer is 4.", f"streamed text {text!r}")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
check(finishes[-1] == "stop" and all(f is None for f in finishes[:-1]), f"finish reasons {finishes}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6, "usage chunk")
results["stream_chunks"] = len(chunks)

# `n` choices: separate jobs with seeds seed, seed + 1, …; the same request gives the
# same choices (same seeds, same execution profile), streamed or not.
ask = dict(model=model, messages=[{"role": "user", "content": "Name a colour."}], temperature=0.9,
           seed=7, max_tokens=8, n=3)
many = client.chat.completions.create(**ask)
check(sorted(c.index for c in many.choices) == [0, 1, 2], f"choices {many.choices}")
texts = [c.message.content for c in sorted(many.choices, key=lambda c: c.index)]
check(all(texts), f"texts {texts}")
check(0 < many.usage.completion_tokens <= 24, f"usage {many.usage}")
again = client.chat.completions.create(**ask)
check([c.message.content for c in sorted(again.choices, key=lambda c: c.index)] == texts, "seeded choices repeat")
parts = {0: "", 1: "", 2: ""}
finished = {}
streamed_usage = None
for c in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
    for choice in c.choices:
        parts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
    if c.usage:
        streamed_usage = c.usage
check([parts[i] for i in range(3)] == texts, f"streamed choices {parts} vs {texts}")
check(sorted(finished) == [0, 1, 2], f"finish reasons {finished}")
check(streamed_usage is not None and streamed_usage.completion_tokens == many.usage.completion_tokens,
      f"streamed usage {streamed_usage}")
results["choices"] = texts

# The Responses API (stateless): a whole response, a cut one, and a stream.
ANSWER = "The answer is 4."
resp = client.responses.create(model=model, input="What is 2 + 2?", temperature=0, max_output_tokens=16)
check(resp.status == "completed" and resp.output_text == ANSWER, f"response {resp}")
check(resp.usage.output_tokens == 6 and resp.usage.input_tokens > 0, f"response usage {resp.usage}")
cut = client.responses.create(model=model, input="What is 2 + 2?", temperature=0, max_output_tokens=3)
check(cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", f"cut {cut}")
with client.responses.stream(model=model, input=[{"role": "user", "content": "What is 2 + 2?"}],
                             temperature=0, max_output_tokens=16) as stream:
    kinds = []
    deltas = ""
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas += event.delta
    final = stream.get_final_response()
check(deltas == ANSWER and final.output_text == ANSWER, f"streamed response {deltas!r} / {final.output_text!r}")
check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"events {kinds}")
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_x")
    check(False, "expected a 400 for previous_response_id")
except openai.BadRequestError as err:
    check((err.body or {}).get("param") == "previous_response_id", f"{err.body}")
results["responses"] = resp.output_text

# Text completions, plain and streamed.
completion = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=3)
check(completion.choices[0].text.startswith(" Paris"), f"completion {completion.choices[0].text!r}")
check(completion.usage.completion_tokens == 3 and completion.choices[0].finish_reason == "length", "completion usage")
streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="The capital of France is", temperature=0, max_tokens=3, stream=True) if c.choices)
check(streamed == completion.choices[0].text, f"streamed completion {streamed!r}")

# Models.
models = client.models.list()
ids = [m.id for m in models.data]
check(model in ids, f"models {ids}")
check(client.models.retrieve(model).id == model, "retrieve model")

# Errors, each in OpenAI's shape.
def expect(error_type, status, code=None, param=None, **kwargs):
    try:
        client.chat.completions.create(**kwargs)
    except error_type as err:
        check(err.status_code == status, f"{error_type.__name__}: status {err.status_code}")
        body = err.body or {}
        if code:
            check(body.get("code") == code, f"code {body}")
        if param:
            check(body.get("param") == param, f"param {body}")
        if status == 503:
            # A 503 tells the client when to come back (the SDKs' retries honour it).
            retry_after = err.response.headers.get("retry-after")
            check(retry_after == "5", f"503 without Retry-After: {dict(err.response.headers)}")
        return
    check(False, f"expected {error_type.__name__}")

msgs = [{"role": "user", "content": "hi"}]
expect(openai.BadRequestError, 400, param="temperature", model=model, messages=msgs, temperature=5)
expect(openai.BadRequestError, 400, param="n", model=model, messages=msgs, n=9)
expect(openai.BadRequestError, 400, param="messages", model=model, messages=[])
expect(openai.NotFoundError, 404, code="model_not_found", model="no-such-model", messages=msgs)
expect(openai.InternalServerError, 503, code="no_provider_available", model=model, messages=msgs,
       extra_body={"sharemesh": {"max_price_per_mtok": 0.001}})

# A burst of 32 concurrent requests against one provider that takes 4 at a time all
# complete with correct usage (no SDK retries: the gateway queues what does not fit).
async def concurrent():
    aclient = AsyncOpenAI(base_url=base, api_key="x", max_retries=0, timeout=300)
    jobs = [aclient.completions.create(model=model, prompt=f"Count: {i}", temperature=0, max_tokens=3)
            for i in range(32)]
    return await asyncio.gather(*jobs, return_exceptions=True)

started = time.time()
answers = asyncio.run(concurrent())
failed = [repr(a) for a in answers if isinstance(a, Exception)]
check(not failed, f"{len(failed)} of 32 concurrent requests failed: {failed[:3]}")
check(len(answers) == 32, "32 answers")
check(all(a.usage.completion_tokens == 3 for a in answers), f"usage {[a.usage for a in answers]}")
results["concurrent_seconds"] = round(time.time() - started, 1)

# A client that disconnects mid-stream.
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Write a long story about a dragon."}],
    temperature=0, max_tokens=400, stream=True)
seen = 0
for chunk in stream:
    seen += 1
    if seen >= 4:
        break
stream.close()
results["disconnected_after_chunks"] = seen

# API keys on a gateway that requires them.
if len(sys.argv) > 4:
    keyed, key = sys.argv[3], sys.argv[4]
    for bad_key, code in [("", "missing_api_key"), ("sk-sm-wrong", "invalid_api_key")]:
        try:
            OpenAI(base_url=keyed, api_key=bad_key or "placeholder", max_retries=0,
                   default_headers={"Authorization": ""} if not bad_key else None).models.list()
            check(False, f"expected 401 for {code}")
        except openai.AuthenticationError as err:
            check(err.status_code == 401 and (err.body or {}).get("code") == code, f"{code}: {err.body}")
    ok = OpenAI(base_url=keyed, api_key=key, max_retries=0).models.list()
    check(any(m.id == model for m in ok.data), "a valid key works")
    results["api_keys"] = "ok"

print(json.dumps({"ok": True, "results": results}))

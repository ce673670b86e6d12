"""The official `openai` Python SDK through the router to a pool of
another provider.

Run by `tests/tests/data_plane/anthropic.rs`
(`the_official_openai_python_sdk_against_an_anthropic_pool`) and
`tests/tests/data_plane/egress.rs` (against a Gemini pool and an Azure
OpenAI pool) against a router whose route for MODEL leads to a mock pool
answering as `router_mock::Behavior::Anthropic`, `Gemini` or `Chat` does:
`echo: TEXT`, a call of the first tool with `{"text": TEXT}`, `tool
said: RESULT` after the tool's result (a Gemini pool refuses the next
turn unless the call's thought signature comes back with it).

    python3 openai_sdk.py BASE_URL MODEL

Prints `ok STEP` for each step that passed; any failure raises.
"""

import json
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(
    base_url=base_url + "/v1", api_key="sk-openai-test", max_retries=0, timeout=30.0
)


def ok(step):
    print(f"ok {step}", flush=True)


# chat.completions.create (Anthropic requires max_tokens: the client gives it)
c = client.chat.completions.create(
    model=model,
    max_tokens=64,
    messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ],
)
assert c.choices[0].message.content == "echo: hello", c
assert c.choices[0].finish_reason == "stop", c
assert c.usage.completion_tokens == 2 and c.usage.prompt_tokens > 0, c.usage
ok("chat.completions.create")

# A stream, with the usage chunk asked for.
chunks = list(
    client.chat.completions.create(
        model=model,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "streamed"}],
    )
)
text = "".join(
    ch.choices[0].delta.content or "" for ch in chunks if ch.choices
)
assert text == "echo: streamed", text
finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
assert finishes == ["stop"], finishes
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2, chunks[-1]
ok("stream")

# A tool call.
c = client.chat.completions.create(
    model=model,
    max_tokens=64,
    tools=[
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                },
            },
        }
    ],
    messages=[{"role": "user", "content": "Paris"}],
)
call = c.choices[0].message.tool_calls[0]
assert call.function.name == "get_weather", call
assert json.loads(call.function.arguments) == {"text": "Paris"}, call
assert c.choices[0].finish_reason == "tool_calls", c
ok("tool call")

# The tool's result, sent back with the call as the SDK gave it.
answered = client.chat.completions.create(
    model=model,
    max_tokens=64,
    tools=[
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                },
            },
        }
    ],
    messages=[
        {"role": "user", "content": "Paris"},
        c.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ],
)
assert answered.choices[0].message.content == "tool said: sunny", answered
ok("tool round trip")

"""The official `anthropic` Python SDK through the router.

Run by `tests/tests/data_plane/anthropic.rs`
(`the_official_anthropic_python_sdk_through_the_router`) against a router
whose route for MODEL leads to an OpenAI-compatible mock pool answering
as `router_mock::Behavior::Chat` does: `echo: TEXT`, a call of the first
tool with `{"text": TEXT}`, `tool said: RESULT` after a tool's result.

    python3 anthropic_sdk.py BASE_URL MODEL

Prints `ok STEP` for each step that passed; any failure raises (non-zero
exit, the traceback on stderr).
"""

import sys

import anthropic

base_url, model = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(
    base_url=base_url, api_key="sk-ant-test", max_retries=0, timeout=30.0
)


def ok(step):
    print(f"ok {step}", flush=True)


# messages.create
m = client.messages.create(
    model=model, max_tokens=64, messages=[{"role": "user", "content": "hello"}]
)
assert m.type == "message" and m.role == "assistant", m
assert [(b.type, b.text) for b in m.content] == [("text", "echo: hello")], m.content
assert m.stop_reason == "end_turn", m.stop_reason
assert m.usage.input_tokens > 0 and m.usage.output_tokens == 2, m.usage
ok("messages.create")

# messages.stream(...) with get_final_message()
with client.messages.stream(
    model=model, max_tokens=64, messages=[{"role": "user", "content": "streamed"}]
) as stream:
    texts = list(stream.text_stream)
    final = stream.get_final_message()
assert "".join(texts) == "echo: streamed", texts
assert [(b.type, b.text) for b in final.content] == [("text", "echo: streamed")]
assert final.stop_reason == "end_turn", final.stop_reason
assert final.usage.output_tokens == 2, final.usage
ok("messages.stream")

# A tool-use round trip, streamed then not.
tools = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    }
]
question = [{"role": "user", "content": "Paris"}]
with client.messages.stream(
    model=model, max_tokens=64, tools=tools, messages=question
) as stream:
    asked = stream.get_final_message()
assert asked.stop_reason == "tool_use", asked
calls = [b for b in asked.content if b.type == "tool_use"]
assert len(calls) == 1 and calls[0].name == "get_weather", asked.content
assert calls[0].input == {"text": "Paris"}, calls[0].input
plain = client.messages.create(model=model, max_tokens=64, tools=tools, messages=question)
assert plain.stop_reason == "tool_use" and plain.content[0].input == {"text": "Paris"}
answered = client.messages.create(
    model=model,
    max_tokens=64,
    tools=tools,
    messages=question
    + [
        {"role": "assistant", "content": asked.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"}
            ],
        },
    ],
)
assert answered.content[0].text == "tool said: sunny", answered
ok("tool_use round trip")

# count_tokens
count = client.messages.count_tokens(
    model=model, messages=[{"role": "user", "content": "hello"}]
)
assert count.input_tokens > 0, count
ok("count_tokens")

# models.list
ids = [info.id for info in client.models.list()]
assert ids == [model], ids
ok("models.list")

# A model no route serves: the router sheds it as 529 overloaded_error,
# which the SDK raises as a status error (and would retry with backoff).
try:
    client.messages.create(
        model="no-such-model",
        max_tokens=8,
        messages=[{"role": "user", "content": "x"}],
    )
    raise AssertionError("a model no route serves was answered")
except anthropic.APIStatusError as e:
    assert e.status_code == 529, e
    assert e.body["error"]["type"] == "overloaded_error", e.body
ok("overloaded")

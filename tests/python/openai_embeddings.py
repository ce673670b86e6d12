"""The official `openai` Python SDK's `embeddings.create` through the
router, to an OpenAI-compatible mock pool (`router_mock::Behavior::Chat`
answers `/v1/embeddings`: one unit vector per input, the same for the
same text, `dimensions` long, default 8).

Run by `tests/tests/data_plane/embeddings.rs`.

    python3 openai_embeddings.py BASE_URL MODEL API_KEY

Prints `ok STEP` for each step that passed; any failure raises.
"""

import math
import sys

import openai

base_url, model, api_key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(
    base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=30.0
)


def ok(step):
    print(f"ok {step}", flush=True)


# One input.
r = client.embeddings.create(model=model, input="the router routes")
assert len(r.data) == 1, r
v = r.data[0].embedding
assert len(v) == 8, v
assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-6, v
assert r.usage.prompt_tokens == 5, r.usage
ok("embeddings.create")

# A batch, with dimensions: one vector per input, in order; the same text
# gives the same vector.
r = client.embeddings.create(
    model=model,
    input=["the router routes", "a second text", "the router routes"],
    dimensions=16,
)
assert [d.index for d in r.data] == [0, 1, 2], r
assert all(len(d.embedding) == 16 for d in r.data), r
assert r.data[0].embedding == r.data[2].embedding
assert r.data[0].embedding != r.data[1].embedding
ok("embeddings batch")

"""The official `openai` Python SDK through a router that serves TLS: the
client trusts the router's certificate (`CA_FILE`) through its HTTP
client's SSL context, as a user of a private CA does.

Run by `tests/tests/listener/protocols.rs`.

    python3 openai_tls.py BASE_URL MODEL CA_FILE

Prints `ok STEP` for each step that passed; any failure raises.
"""

import ssl
import sys

import openai

base_url, model, ca_file = sys.argv[1], sys.argv[2], sys.argv[3]
context = ssl.create_default_context(cafile=ca_file)
client = openai.OpenAI(
    base_url=base_url + "/v1",
    api_key="sk-unused",
    max_retries=0,
    timeout=30.0,
    http_client=openai.DefaultHttpxClient(verify=context),
)


def ok(step):
    print(f"ok {step}", flush=True)


r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hi"}]
)
assert r.choices[0].message.content, r
ok("chat.completions.create")

chunks = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hi"}], stream=True
)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text, "empty stream"
ok("stream")

# Without the router's certificate trusted, the SDK refuses it.
untrusting = openai.OpenAI(
    base_url=base_url + "/v1", api_key="sk-unused", max_retries=0, timeout=30.0
)
try:
    untrusting.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
except openai.APIConnectionError:
    ok("untrusted refused")

#!/usr/bin/env python3
"""openai_client.py — the official `openai` Python client against `zeroserve serve` over HTTPS,
verifying the server against the test CA of this folder (ca.pem) through an httpx client (an
ssl.SSLContext that trusts only that CA). Not run by `make test`; needs `pip install openai` (its
HTTP client, httpx or httpx2, comes with it).

  ./zeroserve serve --model ../shared/models/stories260K --port 8443 \\
      --tls-cert tests/tls/server.pem --tls-key tests/tls/server-key.pem &
  python3 tests/tls/openai_client.py [URL] [--ca FILE] [--key KEY]

URL defaults to https://127.0.0.1:8443/v1, --ca to ca.pem beside this file, --key to $ZS_API_KEY
(or "none": a server without keys ignores it). Checks: the models are listed; a chat completion
and a streamed one come back; a client that does not trust the CA gets a connection error (the
certificate is refused), not an answer. Prints one "ok - ..." or "not ok - ..." line per check;
exit 1 when one failed.
"""
import os
import ssl
import sys

import openai

try:  # the openai package's HTTP client: httpx2 in its 3.x releases, httpx before
    import httpx2 as httpx
except ImportError:
    import httpx

here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
url, ca, key = "https://127.0.0.1:8443/v1", os.path.join(here, "ca.pem"), os.environ.get("ZS_API_KEY") or "none"
while args:
    a = args.pop(0)
    if a == "--ca" and args:
        ca = args.pop(0)
    elif a == "--key" and args:
        key = args.pop(0)
    elif not a.startswith("-"):
        url = a
    else:
        sys.exit(f"usage: {sys.argv[0]} [URL] [--ca FILE] [--key KEY]")

failed = 0


def check(name, cond, detail=""):
    global failed
    print(("ok - " if cond else "not ok - ") + name + ("" if cond or not detail else f" ({detail})"))
    failed += not cond


print(f"# openai {openai.__version__}, {httpx.__name__} {httpx.__version__}, {url}, CA {ca}")
client = openai.OpenAI(base_url=url, api_key=key, max_retries=0,
                       http_client=httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=60))
models = [m.id for m in client.models.list().data]
check(f"models listed over HTTPS ({', '.join(models)})", len(models) > 0)
model = models[0] if models else "x"
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Once upon a time"}],
                                   max_tokens=16, temperature=0)
text = r.choices[0].message.content
check(f"chat completion over HTTPS: {text!r} ({r.usage.completion_tokens} tokens, finish {r.choices[0].finish_reason})",
      isinstance(text, str) and r.usage.completion_tokens > 0)
parts = []
with client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Once upon a time"}],
                                    max_tokens=16, temperature=0, stream=True) as stream:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
check(f"streamed chat completion over HTTPS, the same text ({len(parts)} chunks)", "".join(parts) == text,
      f"{''.join(parts)!r} vs {text!r}")

untrusting = openai.OpenAI(base_url=url, api_key=key, http_client=httpx.Client(timeout=30), max_retries=0)
try:
    untrusting.models.list()
    check("a client without the test CA is refused", False, "it got an answer")
except openai.APIConnectionError as e:
    cause = repr(e.__cause__ or e)
    check("a client without the test CA is refused (certificate verify failed)", "CERTIFICATE_VERIFY_FAILED" in cause
          or "certificate" in cause.lower(), cause[:200])
sys.exit(1 if failed else 0)

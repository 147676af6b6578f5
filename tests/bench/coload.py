#!/usr/bin/env python3
"""coload.py — a fixed offered load of N streaming clients (tests/bench/coserve.sh; issue 31).

N client threads, each streaming POST /v1/completions (stream: true, max_tokens 32, temperature 0,
ignore_eos true, varied short prompts) back to back, one keep-alive connection per client, for D
seconds: a request is begun only before the deadline and is read to its end. Per request: the time
to first token (request sent -> first SSE chunk with text) and every inter-token gap (arrival of
one text chunk -> the next). Prints one JSON object:
  clients, duration_s (wall time, the last request's end included), requests, errors, tokens,
  tokens_per_s, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms (nearest rank; null without samples)
Standard library only.

  python3 tests/bench/coload.py --url http://127.0.0.1:8080 --clients 4 --duration 30 [--model M]
"""
import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "Once upon a time",
    "The old lighthouse keeper",
    "In a small village by the sea",
    "The recipe for bread begins with",
    "Tom found a map in the attic",
    "The train left the station at",
    "A list of things to pack for a trip:",
    "The best way to learn to swim is",
    "Lily and her dog went to the park",
    "The king of the mountain said",
    "Write a short note to a friend about",
    "The robot opened its eyes and",
    "Every morning the baker",
    "Three reasons to plant a tree:",
    "The storm came in from the west",
    "Once there was a tiny dragon who",
]


def pct(values, p):
    """nearest-rank percentile of a list (None when empty)"""
    if not values:
        return None
    v = sorted(values)
    i = max(0, min(len(v) - 1, int(len(v) * p + 0.999999) - 1))
    return v[i]


def client(idx, a, deadline, out, lock):
    u = urllib.parse.urlsplit(a.url)
    conn = None
    ttft, itl = [], []
    done = errors = tokens = 0
    k = idx
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if a.api_key:
        headers["Authorization"] = "Bearer " + a.api_key
    while time.monotonic() < deadline:
        body = {"prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": a.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        if a.model:
            body["model"] = a.model
        k += a.clients
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=a.timeout)
            t0 = time.monotonic()
            conn.request("POST", "/v1/completions", json.dumps(body), headers)
            r = conn.getresponse()
            if r.status != 200:
                r.read()
                errors += 1
                time.sleep(0.05)
                continue
            last = None
            n = 0
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.monotonic()
                try:
                    ch = json.loads(data)
                except ValueError:
                    continue
                cs = ch.get("choices") or []
                if not cs or cs[0].get("text") in (None, ""):
                    continue  # a usage or finish-only chunk
                if last is None:
                    ttft.append(now - t0)
                else:
                    itl.append(now - last)
                last = now
                n += 1
            r.read()  # the rest of the chunked body (its last chunk)
            if r.will_close:
                conn.close()
                conn = None
            if n == 0:
                errors += 1
            else:
                done += 1
                tokens += n
        except (OSError, http.client.HTTPException):
            errors += 1
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)
    if conn is not None:
        conn.close()
    with lock:
        out["ttft"] += ttft
        out["itl"] += itl
        out["requests"] += done
        out["errors"] += errors
        out["tokens"] += tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    out = {"ttft": [], "itl": [], "requests": 0, "errors": 0, "tokens": 0}
    lock = threading.Lock()
    t0 = time.monotonic()
    deadline = t0 + a.duration
    th = [threading.Thread(target=client, args=(i, a, deadline, out, lock), daemon=True) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0

    def ms(v):
        return None if v is None else round(v * 1000, 3)

    res = {
        "clients": a.clients,
        "duration_s": round(wall, 3),
        "requests": out["requests"],
        "errors": out["errors"],
        "tokens": out["tokens"],
        "tokens_per_s": round(out["tokens"] / wall, 3) if wall > 0 else None,
        "ttft_p50_ms": ms(pct(out["ttft"], 0.50)),
        "ttft_p99_ms": ms(pct(out["ttft"], 0.99)),
        "itl_p50_ms": ms(pct(out["itl"], 0.50)),
        "itl_p99_ms": ms(pct(out["itl"], 0.99)),
    }
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")
    return 0 if out["requests"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

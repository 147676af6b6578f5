#!/usr/bin/env python3
"""structured_client.py — the official `openai` client against `zeroserve serve`, for
tests/e2e-structured.sh and tests/e2e-tools.sh (run only when `import openai, jsonschema` works):

  structured_client.py structured URL MODEL [--small]
      response_format json_schema (the fixed schemas below; --small: only the bounded one, for
      stories260K) and json_object through client.chat.completions.create at temperature 0 and 1
      with several seeds and n=2, streamed too, and completions (extra_body); every output parses
      and validates with jsonschema, its whitespace outside strings within the grammar's bound
      (jsonschema.h; a tool call's arguments too); an unsupported schema is a BadRequestError
      naming the keyword.
  structured_client.py tools URL MODEL
      tools with tool_choice required / named / none / auto, the follow-up with the tool's result
      in a role "tool" message, and streaming (the client's ChatCompletionChunk /
      ChoiceDeltaToolCall deltas accumulated into one call whose arguments validate).

Prints one "ok - ..." or "not ok - ..." line per check (the shell scripts count them); exit 1
when a check failed. Never needed by `make test` itself (the scripts skip it without the packages).
"""
import json
import sys

import jsonschema
import openai

SMALL = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer"},
        "x": {"type": "null"},
        "id": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        "p": {"$ref": "#/$defs/pt"},
        "v": {"type": "array", "items": {"type": "number"}, "maxItems": 2},
    },
    "required": ["ok", "color", "n", "x", "id", "p", "v"],
    "additionalProperties": False,
    "$defs": {"pt": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                     "additionalProperties": False}},
}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "height": {"type": "number"},
        "student": {"type": "boolean"},
        "pet": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
    },
    "required": ["name", "age", "height", "student", "pet", "color", "tags", "address"],
    "additionalProperties": False,
    "$defs": {"address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                          "required": ["city", "zip"], "additionalProperties": False}},
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

failed = 0
count = 0


def check(cond, what):
    global failed, count
    count += 1
    if cond:
        print(f"ok - {what}")
    else:
        failed += 1
        print(f"not ok - {what}")
    sys.stdout.flush()
    return cond


MAX_INDENT = 8  # jsonschema.h's ZS_JSCHEMA_MAX_INDENT


def ws_bounded(text):
    """Whitespace outside strings as the grammar bounds it (jsonschema.h): none before or after the
    value, each run between tokens one space or a newline and at most MAX_INDENT spaces/tabs."""
    in_str = esc = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in " \t\r\n":
            j = i
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            run = text[i:j]
            if i == 0 or j == len(text) or not (run == " " or (run[0] == "\n" and len(run) <= 1 + MAX_INDENT and not run[1:].strip(" \t"))):
                return False
            i = j
            continue
        i += 1
    return True


def valid(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
    except Exception as e:  # noqa: BLE001 - the reason is printed
        return False, f"{type(e).__name__}: {str(e)[:200]} in {text[:200]!r}"
    if not ws_bounded(text):
        return False, f"whitespace beyond the grammar's bound in {text[:200]!r}"
    return True, ""


cut = [0, 0]  # sampled answers cut by max_tokens, sampled answers


def judge(text, finish, schema, temp, what):
    """A complete answer must validate. At temperature 1 a string may run on until max_tokens (the
    grammar has no maxLength): such an answer is allowed, but counted (at most half may be)."""
    if temp:
        cut[1] += 1
    if finish == "length" and temp:
        cut[0] += 1
        check(True, f"{what}: cut by max_tokens (allowed at temperature 1)")
        return
    ok, why = valid(text, schema)
    check(ok and finish == "stop", f"{what}: validates ({finish}) {why}")


def structured(c, model, small):
    schemas = [("small", SMALL)] if small else [("small", SMALL), ("person", PERSON)]
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    for name, schema in schemas:
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        for temp, seeds in ((0, [1]), (1, [1, 2, 3])):
            for seed in seeds:
                r = c.chat.completions.create(model=model, messages=msgs, response_format=rf, temperature=temp,
                                              seed=seed, n=2, max_tokens=450)
                for ch in r.choices:
                    judge(ch.message.content, ch.finish_reason, schema, temp,
                          f"chat {name} t={temp} seed={seed} choice {ch.index}")
        # streaming: the deltas' content joins into a valid value
        text, finish = "", None
        for chunk in c.chat.completions.create(model=model, messages=msgs, response_format=rf, temperature=1, seed=7,
                                               max_tokens=450, stream=True):
            for ch in chunk.choices:
                text += ch.delta.content or ""
                finish = ch.finish_reason or finish
        judge(text, finish, schema, 1, f"chat {name} streamed: the joined deltas")
        # completions (response_format passed through extra_body)
        r = c.completions.create(model=model, prompt="Once upon a time", max_tokens=450, temperature=1, seed=5, n=2,
                                 extra_body={"response_format": rf})
        for ch in r.choices:
            judge(ch.text, ch.finish_reason, schema, 1, f"completions {name} choice {ch.index}")
    check(cut[0] * 2 <= cut[1], f"at most half of the sampled answers were cut by max_tokens ({cut[0]} of {cut[1]})")
    if not small:
        r = c.chat.completions.create(model=model, messages=msgs, response_format={"type": "json_object"},
                                      temperature=0, max_tokens=300)
        ok, why = valid(r.choices[0].message.content, {"type": "object"})
        check(ok, f"chat json_object: a JSON object {why}")
    try:
        c.chat.completions.create(model=model, messages=msgs, max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {
                "type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$"}}, "required": ["s"],
                "additionalProperties": False}}})
        check(False, "an unsupported schema is refused")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", body)
        check(e.status_code == 400 and err.get("param") == "response_format.json_schema.schema"
              and "pattern" in err.get("message", ""),
              f"an unsupported schema: BadRequestError naming 'pattern' ({err.get('message')})")


def call_ok(tc, want_name=None):
    if tc.type != "function" or not tc.id:
        return False, f"type {tc.type} id {tc.id}"
    if want_name and tc.function.name != want_name:
        return False, f"name {tc.function.name}"
    if tc.function.name not in PARAMS:
        return False, f"unknown name {tc.function.name}"
    return valid(tc.function.arguments, PARAMS[tc.function.name])


def tools(c, model):
    msgs = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    for temp, seed in ((0, 1), (1, 2), (1, 3)):
        r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="required",
                                      temperature=temp, seed=seed, max_tokens=200)
        ch = r.choices[0]
        tcs = ch.message.tool_calls or []
        ok, why = call_ok(tcs[0]) if tcs else (False, "no tool_calls")
        check(ok and ch.finish_reason == "tool_calls" and ch.message.content is None,
              f"required t={temp} seed={seed}: a valid call {tcs[0].function.name if tcs else ''} "
              f"({ch.finish_reason}) {why}")
    r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=200, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "add"}})
    ch = r.choices[0]
    tcs = ch.message.tool_calls or []
    ok, why = call_ok(tcs[0], "add") if tcs else (False, "no tool_calls")
    check(ok and ch.finish_reason == "tool_calls", f"named 'add': a valid call of add {why}")
    # the follow-up: the assistant's call and the tool's result in the history
    r0 = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="required", temperature=0,
                                   max_tokens=200)
    m0 = r0.choices[0].message
    hist = msgs + [m0] + [{"role": "tool", "tool_call_id": m0.tool_calls[0].id,
                           "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    r = c.chat.completions.create(model=model, messages=hist, tools=TOOLS, tool_choice="none", temperature=0,
                                  max_tokens=40)
    ch = r.choices[0]
    check(isinstance(ch.message.content, str) and ch.message.content and not ch.message.tool_calls,
          f"follow-up with the tool result: a text answer ({ch.message.content!r:.80})")
    # none: never a call
    r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="none", temperature=0,
                                  max_tokens=40)
    check(not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls", "none: no tool_calls")
    # auto: text or a valid call
    for seed in (1, 2):
        r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="auto", temperature=1,
                                      seed=seed, max_tokens=60)
        ch = r.choices[0]
        if ch.message.tool_calls:
            ok, why = call_ok(ch.message.tool_calls[0])
            check(ok and ch.finish_reason == "tool_calls", f"auto seed={seed}: a valid call {why}")
        else:
            check(isinstance(ch.message.content, str) and "<tool_call>" not in ch.message.content,
                  f"auto seed={seed}: a text answer ({ch.finish_reason})")
    # streaming: accumulate the deltas the way OpenAI's docs do
    for choice, label in (("required", "required"), ({"type": "function", "function": {"name": "get_weather"}}, "named")):
        calls, content, finish, n_chunks = {}, "", None, 0
        for chunk in c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice=choice,
                                               temperature=0, max_tokens=200, stream=True):
            n_chunks += 1
            for ch in chunk.choices:
                content += ch.delta.content or ""
                for d in ch.delta.tool_calls or []:
                    acc = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    if d.id:
                        acc["id"] = d.id
                    if d.function and d.function.name:
                        acc["name"] += d.function.name
                    if d.function and d.function.arguments:
                        acc["arguments"] += d.function.arguments
                finish = ch.finish_reason or finish
        ok, why = (valid(calls[0]["arguments"], PARAMS.get(calls[0]["name"], {"type": "object"}))
                   if 0 in calls else (False, "no tool-call deltas"))
        check(ok and finish == "tool_calls" and content == "" and calls[0]["id"]
              and (label != "named" or calls[0]["name"] == "get_weather"),
              f"streamed {label}: {n_chunks} chunks accumulate into a valid call "
              f"{calls.get(0, {}).get('name')}({calls.get(0, {}).get('arguments')}) ({finish}, content {content!r}) {why}")
    # auto, streamed: no call text leaks as content
    content, calls, finish = "", 0, None
    for chunk in c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="auto",
                                           temperature=1, seed=4, max_tokens=60, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            calls += len(ch.delta.tool_calls or [])
            finish = ch.finish_reason or finish
    check("<tool_call>" not in content, f"streamed auto: no call text in the content ({calls} call deltas, {finish})")


def main():
    mode, url, model = sys.argv[1], sys.argv[2], sys.argv[3]
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    try:
        if mode == "structured":
            structured(c, model, "--small" in sys.argv)
        else:
            tools(c, model)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        check(False, f"the client raised {type(e).__name__}: {str(e)[:300]}")
    print(f"# {count - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

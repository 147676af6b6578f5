#!/bin/sh
# shellcheck shell=bash disable=SC2016,SC2015,SC2001  # jq programs are single-quoted; ok/nok always succeed
# e2e-tools.sh — tool calls through /v1/chat/completions of `zeroserve serve` on
# SmolLM2-135M-Instruct (chatml, so the hermes format: <tool_call>{"name", "arguments"}</tool_call>),
# with curl and jq: tool_choice "required" and a named function give tool_calls whose arguments
# parse and follow the function's parameters, finish_reason "tool_calls", content null (at
# temperature 0 and 1, n=2); a follow-up with the assistant's call and a role "tool" result in the
# history answers; streaming sends OpenAI's tool-call deltas (id, type and name first, then the
# arguments in pieces) that join into a valid call and no content; "none" gives no tool_calls;
# "auto" gives text or a valid call and never call text as content (streamed too); and the 400s
# (an unknown function in tool_choice, bad tool names, role tool without tool_call_id, a parameters
# schema the grammar cannot take, the messages with the rendered tools over the context, ...).
# With `import openai, jsonschema` working in python3, tests/structured_client.py tools (the
# official client, its ChoiceDeltaToolCall accumulation, jsonschema validation) too.
#
# Env: ZS_BIN (default ./zeroserve), ZS_SMOLLM2 (the GGUF; else server/fetch-smollm2.sh fetches it).
# Exit: 0 all passed, 1 something failed, 77 skipped (no curl/jq/bash, or SmolLM2 cannot be had).
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup e2e-tools curl jq
zs_smollm2
NAME=$(basename "$SMOL" .gguf)
# expect_400 BODY PARAM WHAT [TEXT]: a 400 of chat completions (zs_expect_400)
expect_400() { zs_expect_400 /v1/chat/completions "$@"; }

zs_start_server "$T/srv.log" --model "$SMOL" --device cpu || zs_abort "server starts"
ok "SmolLM2 server starts"

TOOLS='[{"type":"function","function":{"name":"get_weather","description":"Get the current weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city","unit"],"additionalProperties":false}}},{"type":"function","function":{"name":"add","description":"Add two integers","parameters":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}}}]'
MSG='[{"role":"user","content":"What is the weather like in Paris today?"}]'
# a call {name, arguments (a JSON string)} follows its function's parameters
JQ_CALL='def int: type == "number" and . == floor;
  def args_ok($n): if $n == "get_weather" then type == "object" and keys == ["city","unit"] and (.city | type) == "string" and (.unit | IN("celsius","fahrenheit"))
    elif $n == "add" then type == "object" and keys == ["a","b"] and (.a | int) and (.b | int) else false end;
  .name as $n | (.arguments | fromjson) | args_ok($n)'
# several tools: the grammar does not tie "name" to its "arguments" (toolcall.h); since the name
# now comes first (the schema's key order), a sampled call may pair one tool's name with the
# other's arguments: each must still be valid for some tool
JQ_CALL_UNTIED="${JQ_CALL%%.name as*}"'.name as $n | (.arguments | fromjson) as $a | ($n | IN("get_weather","add")) and ($a | args_ok("get_weather") or args_ok("add"))'
# calls_ok RESPONSE [NAME]: every choice has one valid call (of NAME), finish tool_calls, content null; prints what failed
calls_ok() {
    echo "$1" | jq -c '.choices[]' | while read -r ch; do
        echo "$ch" | jq -e --arg want "${2:-}" "(.finish_reason == \"tool_calls\") and (.message.content == null) and
            (.message.tool_calls | length) >= 1 and (.message.tool_calls[0] | .type == \"function\" and (.id | startswith(\"call_\")) and
            (\$want == \"\" or .function.name == \$want)) and (.message.tool_calls[0].function | ${CALL_JQ:-$JQ_CALL})" >/dev/null 2>&1 ||
            echo "bad: $(echo "$ch" | head -c 300)"
    done
    [ "$(echo "$1" | jq '.choices | length' 2>/dev/null)" -ge 1 ] 2>/dev/null || echo "no choices: $(echo "$1" | head -c 300)"
}

# --- required / named
for ts in "0 1 1" "1 1 2" "1 5 2"; do
    # shellcheck disable=SC2086  # three numbers
    set -- $ts
    r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"required\",\"temperature\":$1,\"seed\":$2,\"n\":$3,\"max_tokens\":200}")
    if [ "$1" = 0 ]; then bad=$(calls_ok "$r"); else bad=$(CALL_JQ=$JQ_CALL_UNTIED calls_ok "$r"); fi
    [ -z "$bad" ] && ok "required t=$1 seed=$2 n=$3: valid calls, finish tool_calls ($(echo "$r" | jq -c '[.choices[].message.tool_calls[0].function | .name + .arguments]'))" || nok "required t=$1 seed=$2: $bad"
done
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"}},\"temperature\":0,\"max_tokens\":200}")
bad=$(calls_ok "$r" add)
[ -z "$bad" ] && ok "named add: a valid call of add ($(echo "$r" | jq -r '.choices[0].message.tool_calls[0].function.arguments'))" || nok "named add: $bad"
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"temperature\":1,\"seed\":3,\"n\":2,\"max_tokens\":200}")
bad=$(calls_ok "$r" get_weather)
[ -z "$bad" ] && ok "named get_weather t=1 n=2: valid calls" || nok "named get_weather: $bad"
r0=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"required\",\"temperature\":0,\"max_tokens\":200}")

# --- the follow-up: the assistant's call and the tool's result in the history
asst=$(echo "$r0" | jq -c '.choices[0].message')
cid=$(echo "$asst" | jq -r '.tool_calls[0].id')
HIST=$(jq -nc --argjson m "$MSG" --argjson a "$asst" --arg id "$cid" '$m + [$a, {role: "tool", tool_call_id: $id, content: "{\"temperature\": 21, \"sky\": \"sunny\"}"}]')
r=$(zs_post /v1/chat/completions "{\"messages\":$HIST,\"tools\":$TOOLS,\"temperature\":0,\"max_tokens\":40}")
echo "$r" | jq -e '.choices[0].message.role == "assistant" and (.usage.prompt_tokens > 100)' >/dev/null &&
    ok "follow-up with a role tool message: answered ($(echo "$r" | jq -c '.choices[0].message.content // .choices[0].message.tool_calls' | head -c 100))" || nok "follow-up: $(echo "$r" | head -c 300)"
HIST2=$(jq -nc --argjson m "$MSG" --argjson a "$asst" --arg id "$cid" '$m + [$a, {role: "tool", tool_call_id: $id, content: [{type: "text", text: "21 C, sunny"}]}]')
r=$(zs_post /v1/chat/completions "{\"messages\":$HIST2,\"tools\":$TOOLS,\"tool_choice\":\"none\",\"temperature\":0,\"max_tokens\":20}")
echo "$r" | jq -e '.choices[0].message.content | type == "string"' >/dev/null && ok "a tool result as text parts, tool_choice none: a text answer" || nok "tool parts: $(echo "$r" | head -c 300)"
# the tools change the prompt (rendered into it), "none" included
n_plain=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"max_tokens\":1}" | jq .usage.prompt_tokens)
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"none\",\"temperature\":0,\"max_tokens\":60}")
n_tools=$(echo "$r" | jq .usage.prompt_tokens)
[ "${n_tools:-0}" -gt $((${n_plain:-0} + 50)) ] && ok "the tools are rendered into the prompt ($n_plain -> $n_tools tokens)" || nok "tools not rendered: $n_plain vs $n_tools"
echo "$r" | jq -e '(.choices[0].message.tool_calls // []) == [] and .choices[0].finish_reason != "tool_calls" and (.choices[0].message.content | type) == "string"' >/dev/null &&
    ok "none: a text answer, no tool_calls" || nok "none: $(echo "$r" | head -c 300)"

# --- auto: text or a valid call
for seed in 1 2 3; do
    r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"temperature\":1,\"seed\":$seed,\"max_tokens\":60}")
    if echo "$r" | jq -e '.choices[0].message.tool_calls' >/dev/null 2>&1; then
        bad=$(calls_ok "$r")
        [ -z "$bad" ] && ok "auto seed=$seed: a valid call" || nok "auto seed=$seed: $bad"
    else
        echo "$r" | jq -e '(.choices[0].message.content | type == "string" and (contains("<tool_call>") | not)) and .choices[0].finish_reason != "tool_calls"' >/dev/null &&
            ok "auto seed=$seed: a text answer without call text" || nok "auto seed=$seed: $(echo "$r" | head -c 300)"
    fi
done

# auto with a prompt that makes the model open a call: after the trigger the call is constrained
# (120 tokens: text before the trigger may take most of 60)
T1='[{"type":"function","function":{"name":"get_weather","description":"Get the current weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
n_call=0 bad=""
for seed in 1 2 3 4 5 6; do
    B=$(jq -nc --argjson t "$T1" --argjson s $seed '{messages: [{role: "user", content: "<tool_call>"}], tools: $t, tool_choice: "auto", max_tokens: 120, temperature: 1, seed: $s}')
    r=$(zs_post /v1/chat/completions "$B")
    if echo "$r" | jq -e '.choices[0].message.tool_calls' >/dev/null 2>&1; then
        n_call=$((n_call + 1))
        echo "$r" | jq -e '.choices[0] | .finish_reason == "tool_calls" and .message.tool_calls[0].function.name == "get_weather"
            and (.message.tool_calls[0].function.arguments | fromjson | keys == ["city"] and (.city | type) == "string")' >/dev/null || bad="$bad [$seed] $(echo "$r" | head -c 200)"
        zs_post /v1/chat/completions "$(echo "$B" | jq -c '.stream = true')" >"$T/sse"
        sargs=$(sed -n 's/^data: //p' "$T/sse" | grep -v '^\[DONE\]' | jq -j '.choices[0].delta.tool_calls[0].function.arguments // empty')
        scont=$(sed -n 's/^data: //p' "$T/sse" | grep -v '^\[DONE\]' | jq -j '.choices[0].delta.content // empty')
        [ "$(echo "$sargs" | jq -c . 2>/dev/null)" = "$(echo "$r" | jq -c '.choices[0].message.tool_calls[0].function.arguments | fromjson')" ] &&
            [[ "$scont" != *"<tool_call"* ]] || bad="$bad [$seed streamed] args '$sargs' content '$scont'"
    else
        echo "$r" | jq -e '.choices[0] | .finish_reason == "length" or (.message.content | contains("<tool_call>") | not)' >/dev/null || bad="$bad [$seed] $(echo "$r" | head -c 200)"
    fi
done
[ -z "$bad" ] && [ $n_call -ge 1 ] && ok "auto, a model that opens a call ($n_call of 6 seeds): the trigger, then a valid call of get_weather, streamed alike without call text as content" ||
    nok "auto opening a call: $n_call calls; $bad"

# --- streaming
# sse_calls FILE: {content, finish, calls: [{id, type, name, arguments}], first: the first tool delta, n_args: argument chunks}
sse_calls() {
    sed -n 's/^data: //p' "$1" | grep -v '^\[DONE\]' | jq -s '
        [.[] | .choices[0] | select(. != null)] as $c
        | {content: ([$c[].delta.content // empty] | join("")),
           finish: ([$c[].finish_reason // empty] | last),
           first: ([$c[].delta.tool_calls // empty | .[]] | first),
           n_args: ([$c[].delta.tool_calls // empty | .[] | select(.function.arguments != null and .function.arguments != "")] | length),
           calls: ([$c[].delta.tool_calls // empty | .[]] | group_by(.index)
                   | map({id: (map(.id // empty) | first), type: (map(.type // empty) | first),
                          name: (map(.function.name // empty) | join("")), arguments: (map(.function.arguments // "") | join(""))}))}'
}
for choice in '"required"' '{"type":"function","function":{"name":"get_weather"}}'; do
    zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":$choice,\"temperature\":0,\"max_tokens\":200,\"stream\":true}" >"$T/sse"
    s=$(sse_calls "$T/sse")
    echo "$s" | jq -e "(.finish == \"tool_calls\") and .content == \"\" and (.calls | length) == 1 and (.first | .index == 0 and (.id | startswith(\"call_\")) and .type == \"function\" and .function.arguments == \"\" and (.function.name | length) > 0)
        and .n_args >= 2 and (.calls[0] | $JQ_CALL)" >/dev/null 2>&1 &&
        ok "streamed $choice: an opening delta (index, id, type, name, arguments \"\"), $(echo "$s" | jq .n_args) argument chunks joining into a valid call, no content, finish tool_calls" ||
        nok "streamed $choice: $(echo "$s" | jq -c . | head -c 400)"
done
# the streamed call is the same call as the answer in one body (temperature 0)
s=$(sse_calls "$T/sse")
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"temperature\":0,\"max_tokens\":200}")
[ "$(echo "$s" | jq -c '.calls[0].arguments | fromjson')" = "$(echo "$r" | jq -c '.choices[0].message.tool_calls[0].function.arguments | fromjson')" ] &&
    ok "the streamed arguments equal the unstreamed ones" || nok "streamed vs not: $(echo "$s" | jq -c .calls) / $(echo "$r" | jq -c .choices[0].message.tool_calls)"
for seed in 1 2 3 4; do
    zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"temperature\":1,\"seed\":$seed,\"max_tokens\":60,\"stream\":true}" >"$T/sse"
    s=$(sse_calls "$T/sse")
    echo "$s" | jq -e "(.content | contains(\"<tool_call>\") | not) and ((.calls | length) == 0 or (.finish == \"tool_calls\" and (.calls[0] | $JQ_CALL)))" >/dev/null 2>&1 &&
        ok "streamed auto seed=$seed: $(echo "$s" | jq -r 'if (.calls | length) > 0 then "a valid call" else "text" end'), no call text as content" || nok "streamed auto seed=$seed: $(echo "$s" | jq -c . | head -c 400)"
done
# the prefix of a trigger is held back, not lost: the joined content equals the unstreamed answer
zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"temperature\":0,\"max_tokens\":60,\"stream\":true}" >"$T/sse"
s=$(sse_calls "$T/sse")
r=$(zs_post /v1/chat/completions "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"auto\",\"temperature\":0,\"max_tokens\":60}")
if echo "$r" | jq -e '.choices[0].message.tool_calls' >/dev/null 2>&1; then
    [ "$(echo "$s" | jq -c '.calls[0].arguments | fromjson')" = "$(echo "$r" | jq -c '.choices[0].message.tool_calls[0].function.arguments | fromjson')" ] && ok "auto t=0: the same call streamed and not" || nok "auto t=0 call: $s / $r"
else
    [ "$(echo "$s" | jq -r .content)" = "$(echo "$r" | jq -r .choices[0].message.content)" ] && ok "auto t=0 streamed: every content byte arrives (held back, then sent)" || nok "auto t=0 content: $(echo "$s" | jq -c .content) vs $(echo "$r" | jq -c .choices[0].message.content)"
fi

# --- the 400s
expect_400 "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}" tool_choice "tool_choice naming an unknown function" nope
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]}" 'tools[0].function.name' "a tool name with a space" "bad name"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"$(printf 'x%.0s' $(seq 65))\"}}]}" 'tools[0].function.name' "a tool name of 65 characters"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}" 'tools[1].function.name' "two tools of the same name"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{}}]}" 'tools[0].function.name' "a tool without a name"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"retrieval\"}]}" 'tools[0].type' "a tool type other than function"
expect_400 "{\"messages\":$MSG,\"tools\":{\"a\":1}}" tools "tools not an array"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[1]}}]}" 'tools[0].function.parameters' "parameters not an object"
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"e\"]}}}],\"tool_choice\":\"required\"}" 'tools*' "a parameters schema the grammar cannot take" format
expect_400 "{\"messages\":$MSG,\"tool_choice\":\"required\"}" tool_choice "tool_choice required without tools"
expect_400 "{\"messages\":$MSG,\"tools\":$TOOLS,\"tool_choice\":\"always\"}" tool_choice "an unknown tool_choice" always
expect_400 "{\"messages\":$MSG,\"tools\":$TOOLS,\"parallel_tool_calls\":\"yes\"}" parallel_tool_calls "parallel_tool_calls not a boolean"
expect_400 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"tool\",\"content\":\"21 C\"}],\"tools\":$TOOLS}" 'messages[1].tool_call_id' "role tool without tool_call_id"
expect_400 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"not json\"}}]}],\"tools\":$TOOLS}" 'messages[1].tool_calls[0].function.arguments' "call arguments that are not JSON"
expect_400 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"{}\"}}]}]}" 'messages[1].tool_calls[0].id' "a call without an id"
expect_400 "{\"messages\":$MSG,\"tools\":$TOOLS,\"response_format\":{\"type\":\"json_object\"}}" response_format "a JSON response_format with tools (auto)"
expect_400 "{\"messages\":$MSG,\"tools\":[$(seq -s, 129 | sed 's/[0-9][0-9]*/{"type":"function","function":{"name":"f&"}}/g')]}" tools "129 tools" 128
BIG=$(head -c 60000 /dev/zero | tr '\0' 'a' | sed 's/a\{9\}/word word /g')
expect_400 "{\"messages\":$MSG,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"$BIG\"}}],\"max_tokens\":5}" tools "the messages with the rendered tools over the context" "more"
[ "$(jq -r .error.code "$T/body")" = context_length_exceeded ] && ok "... code context_length_exceeded ($(jq -r .error.message "$T/body" | head -c 160))" || nok "over the context: $(head -c 300 "$T/body")"

# --- the openai client
if python3 -c "import openai, jsonschema" 2>/dev/null; then
    out=$(python3 tests/structured_client.py tools "$ZS_URL" "$NAME" 2>&1)
    echo "$out" | sed 's/^/#   /'
    np=$(echo "$out" | grep -c '^ok - '); nf=$(echo "$out" | grep -c '^not ok - ')
    [ "$nf" = 0 ] && [ "$np" -gt 0 ] && ok "openai client (tools): $np checks passed" || nok "openai client (tools): $nf of $((np + nf)) checks failed"
else
    echo "# skip: python3 cannot import openai and jsonschema (the openai-client checks)"
fi
zs_done

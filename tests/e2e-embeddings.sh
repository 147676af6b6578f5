#!/bin/sh
# shellcheck shell=bash
# e2e-embeddings.sh — POST /tokenize, POST /detokenize and POST /v1/embeddings of `zeroserve
# serve` on stories260K, with curl and jq: tokenize with and without pieces and with messages
# (the chat template), the detokenize round trip, embeddings of one string, of strings, of token
# arrays, base64 (little-endian f32, the same numbers as the float list), pooling "last",
# normalize false, --pooling last as the server default, every vector bitwise the same alone, in
# a batch and under concurrent completions, the prompt tokens in /metrics, and the 400s naming
# their parameter. With the `openai` Python package importable by python3 (else that part is
# skipped), client.embeddings.create too.
#
# Env: ZS_SHARED (fixtures, default ../shared), ZS_BIN (default ./zeroserve).
# Exit: 0 all passed, 1 something failed, 77 skipped (no curl/jq/bash or no fixture).
# shellcheck disable=SC2016,SC2015  # jq programs are single-quoted; ok/nok always succeed
# shellcheck source=tests/lib/e2e.sh
. "$(dirname "$0")/lib/e2e.sh"
zs_bash "$@"
set -u
zs_setup e2e-emb curl jq
zs_model stories260K
ZS_HTTP_TIMEOUT=60

zs_start_server "$T/srv.log" --model "$MODEL" --device cpu --chat-template chatml || zs_abort "server starts"
ok "server starts"

# --- /tokenize, /detokenize
r=$(zs_post /tokenize '{"prompt":"Hello world"}')
[ "$(echo "$r" | jq -c '[.tokens, .count, .max_model_len]')" = '[[1,346,306,414,263,304,341],7,512]' ] && ok "tokenize: ids with BOS, count, max_model_len" || nok "tokenize: $r"
r=$(zs_post /tokenize '{"prompt":"Hello world","add_special_tokens":false}')
[ "$(echo "$r" | jq -c .tokens)" = '[346,306,414,263,304,341]' ] && ok "tokenize: add_special_tokens false" || nok "tokenize no special: $r"
r=$(zs_post /tokenize '{"prompt":"Hello world","with_pieces":true}')
[ "$(echo "$r" | jq -c '[.tokens[1].id, .tokens[1].piece, ([.tokens[1:][].piece]|add)]')" = '[346," He"," Hello world"]' ] &&
    ok "tokenize with_pieces: {id, piece}, the pieces spell the text" || nok "with_pieces: $r"
r=$(zs_post /tokenize '{"prompt":"é","with_pieces":true,"add_special_tokens":false}')
echo "$r" | jq -e '[.tokens[].piece] | map(type) | any(. == "array") or all(. == "string")' >/dev/null &&
    ok "tokenize with_pieces of a non-ASCII text: pieces are strings or byte lists ($(echo "$r" | jq -c '[.tokens[].piece]'))" || nok "non-ascii pieces: $r"
r=$(zs_post /tokenize '{"messages":[{"role":"user","content":"Hi"}]}')
r2=$(zs_post /tokenize '{"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false}')
n1=$(echo "$r" | jq .count); n2=$(echo "$r2" | jq .count)
[ "${n1:-0}" -gt "${n2:-0}" ] && [ "${n2:-0}" -gt 2 ] && ok "tokenize messages: the chat template applied ($n1 tokens; $n2 without the generation prompt)" || nok "messages: $r / $r2"
ids=$(zs_post /tokenize '{"prompt":"Once upon a time","add_special_tokens":false}' | jq -c .tokens)
r=$(zs_post /detokenize "{\"tokens\":$ids}")
[ "$(echo "$r" | jq -c '[.prompt, .content]')" = '["Once upon a time","Once upon a time"]' ] && ok "detokenize round trip (prompt and content)" || nok "detokenize: $r"
zs_expect_400 /detokenize '{"tokens":[1,999999]}' tokens "detokenize an id out of range"
zs_expect_400 /detokenize '{"tokens":"abc"}' tokens "detokenize tokens not an array"
zs_expect_400 /detokenize '{}' tokens "detokenize without tokens"
zs_expect_400 /tokenize '{}' prompt "tokenize without prompt"
zs_expect_400 /tokenize '{"prompt":5}' prompt "tokenize prompt not a string"
zs_expect_400 /tokenize '{"prompt":"a","with_pieces":"yes"}' with_pieces "tokenize with_pieces not a boolean"
zs_expect_400 /tokenize '{"prompt":"a","bogus":1}' bogus "tokenize unknown field"
zs_expect_400 /tokenize '{"messages":[{"role":"robot","content":"x"}]}' 'messages[0].role' "tokenize a bad role"
# llama.cpp's requests: /tokenize {"content", "add_special" (default false), "parse_special",
# "with_pieces"} answering "tokens"; /detokenize {"tokens"} answering "content"
r=$(zs_post /tokenize '{"content":"Hello world"}')
[ "$(echo "$r" | jq -c .tokens)" = '[346,306,414,263,304,341]' ] && ok "tokenize llama.cpp's {content}: no BOS by default, as llama.cpp" || nok "content: $r"
r=$(zs_post /tokenize '{"content":"Hello world","add_special":true,"parse_special":true}')
[ "$(echo "$r" | jq -c .tokens)" = '[1,346,306,414,263,304,341]' ] && ok "tokenize {content, add_special: true, parse_special: true}: with BOS" || nok "content add_special: $r"
r=$(zs_post /tokenize '{"content":"Hello world","prompt":"Hello world","add_special":false,"add_special_tokens":false}')
[ "$(echo "$r" | jq -c .tokens)" = '[346,306,414,263,304,341]' ] && ok "tokenize with both names and the same values: taken" || nok "both same: $r"
zs_expect_400 /tokenize '{"content":"a","prompt":"b"}' content "tokenize content and prompt that differ" "prompt"
zs_expect_400 /tokenize '{"content":"a","add_special":true,"add_special_tokens":false}' add_special "tokenize add_special and add_special_tokens that differ" "add_special_tokens"
zs_expect_400 /tokenize '{"content":5}' content "tokenize content not a string"
zs_expect_400 /tokenize '{"content":"a","add_special":"yes"}' add_special "tokenize add_special not a boolean"
zs_expect_400 /tokenize '{"content":"a","parse_special":false}' parse_special "tokenize parse_special false (unsupported)"
zs_expect_400 /tokenize '{"content":"a","messages":[{"role":"user","content":"x"}]}' messages "tokenize content and messages"
ids=$(zs_post /tokenize '{"content":"Once upon a time","with_pieces":false}' | jq -c .tokens)
r=$(zs_post /detokenize "{\"tokens\":$ids}")
[ "$(echo "$r" | jq -r .content)" = "Once upon a time" ] && ok "llama.cpp's round trip: /tokenize {content}, /detokenize {tokens} -> content" || nok "llama.cpp round trip: $r"

# --- /v1/embeddings
A='Once upon a time there was a little girl.'; B='The cat sat on the mat'
one=$(zs_post /v1/embeddings "{\"model\":\"stories260K\",\"input\":\"$A\"}")
echo "$one" | jq -e '.object == "list" and .data[0].object == "embedding" and .data[0].index == 0 and (.data[0].embedding|length) == 64 and .model == "stories260K" and .usage.prompt_tokens == 13 and .usage.total_tokens == 13' >/dev/null &&
    ok "one string: OpenAI's shape, 64 dims, usage 13 tokens" || nok "one string: $(echo "$one" | head -c 300)"
echo "$one" | jq -e '([.data[0].embedding[] | . * .] | add | sqrt - 1 | fabs) < 1e-5' >/dev/null && ok "L2-normalised" || nok "not normalised"
# reference (transformers, tests/ref/embed-ref.json): mean pooling, normalised
if [ -f tests/ref/embed-ref.json ]; then
    err=$(jq -n --argjson a "$(echo "$one" | jq -c .data[0].embedding)" --slurpfile r tests/ref/embed-ref.json \
        '[range(0; 64) as $i | ($a[$i] - $r[0].cases[0].mean_normalized[$i]) | fabs] | max')
    jq -en "$err < 1e-5" >/dev/null && ok "matches transformers' mean-pooled embedding (max error $err)" || nok "vs transformers: max error $err"
fi
two=$(zs_post /v1/embeddings "{\"input\":[\"$A\",\"$B\"]}")
[ "$(echo "$two" | jq -c '[.data[].index]')" = '[0,1]' ] && [ "$(echo "$two" | jq -c .data[0].embedding)" = "$(echo "$one" | jq -c .data[0].embedding)" ] &&
    ok "two strings: in input order, the first bitwise the same as alone" || nok "batched strings"
bon=$(zs_post /v1/embeddings "{\"input\":\"$B\"}")
[ "$(echo "$two" | jq -c .data[1].embedding)" = "$(echo "$bon" | jq -c .data[0].embedding)" ] && ok "the second bitwise the same as alone" || nok "second vs alone"
tids=$(zs_post /tokenize "{\"prompt\":\"$A\"}" | jq -c .tokens)
r=$(zs_post /v1/embeddings "{\"input\":$tids}")
[ "$(echo "$r" | jq -c .data[0].embedding)" = "$(echo "$one" | jq -c .data[0].embedding)" ] && ok "token ids: the same vector as the string" || nok "token ids: $(echo "$r" | head -c 200)"
r=$(zs_post /v1/embeddings "{\"input\":[$tids,[1,291,280]]}")
[ "$(echo "$r" | jq '.data|length')" = 2 ] && [ "$(echo "$r" | jq -c .data[0].embedding)" = "$(echo "$one" | jq -c .data[0].embedding)" ] && ok "arrays of token ids" || nok "[[ids]]: $(echo "$r" | head -c 200)"
r=$(zs_post /v1/embeddings "{\"input\":\"$A\",\"encoding_format\":\"base64\"}")
dec=$(echo "$r" | jq -r .data[0].embedding | base64 -d | od -An -tf4 -v -w256 | tr -s ' ' '\n' | grep -v '^$')
flt=$(echo "$one" | jq -r '.data[0].embedding[]')
# od prints about 7 significant digits: equal within 1e-6 relative, and 64 of them
bad=$(paste <(echo "$dec") <(echo "$flt") | awk 'BEGIN{n=0;b=0} {n++; d=$1-$2; if (d<0) d=-d; m=$2<0?-$2:$2; if (d>1e-6*(m>1?m:1)) b++} END{print (n==64 ? b : "n=" n)}')
[ "$bad" = 0 ] && ok "base64: little-endian f32 of the same numbers" || nok "base64 differs ($bad)"
last=$(zs_post /v1/embeddings "{\"input\":\"$A\",\"pooling\":\"last\"}")
if [ -f tests/ref/embed-ref.json ]; then
    err=$(jq -n --argjson a "$(echo "$last" | jq -c .data[0].embedding)" --slurpfile r tests/ref/embed-ref.json \
        '[range(0; 64) as $i | ($a[$i] - $r[0].cases[0].last_normalized[$i]) | fabs] | max')
    jq -en "$err < 1e-5" >/dev/null && ok "pooling last: transformers' last-token embedding (max error $err)" || nok "pooling last: max error $err"
fi
r=$(zs_post /v1/embeddings "{\"input\":\"$A\",\"normalize\":false}")
echo "$r" | jq -e '([.data[0].embedding[] | . * .] | add | sqrt) > 1.01' >/dev/null && ok "normalize false: the raw mean" || nok "normalize false"
r=$(zs_post /v1/embeddings "{\"input\":\"$A\",\"dimensions\":64,\"user\":\"u\"}")
[ "$(echo "$r" | jq -c .data[0].embedding)" = "$(echo "$one" | jq -c .data[0].embedding)" ] && ok "dimensions equal to the model's, user accepted" || nok "dimensions 64"
# under concurrent completions
# (curl itself in the background: a backgrounded shell function would run the EXIT trap)
PIDS=""
for k in 1 2 3; do
    curl -s --max-time 60 "$ZS_URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":200,"ignore_eos":true}' >"$T/c$k" & PIDS="$PIDS $!"
done
sleep 0.2
for k in 1 2 3 4; do
    curl -s --max-time 60 "$ZS_URL/v1/embeddings" -H 'Content-Type: application/json' \
        -d "{\"input\":[\"$B\",\"$A\"]}" >"$T/e$k" & PIDS="$PIDS $!"
done
# shellcheck disable=SC2086
wait $PIDS
same=1
for k in 1 2 3 4; do [ "$(jq -c .data[1].embedding "$T/e$k")" = "$(echo "$one" | jq -c .data[0].embedding)" ] || same=0; done
done_c=$(cat "$T/c1" "$T/c2" "$T/c3" | jq -s '[.[].usage.completion_tokens] == [200,200,200]')
[ $same = 1 ] && [ "$done_c" = true ] && ok "bitwise the same under concurrent completions (which finish)" || nok "under load: same=$same completions=$done_c"
m=$(curl -s "$ZS_URL/metrics" | awk '/^zeroserve_prompt_tokens_total/ {print $2}')
[ -n "$m" ] && [ "${m%.*}" -gt 100 ] && ok "/metrics counts their prompt tokens ($m)" || nok "metrics prompt tokens: '$m'"

zs_expect_400 /v1/embeddings '{"input":""}' input "an empty string"
zs_expect_400 /v1/embeddings '{"input":[]}' input "an empty array"
zs_expect_400 /v1/embeddings '{"input":["a",""]}' 'input[1]' "an empty string in a list"
zs_expect_400 /v1/embeddings '{"input":[[]]}' 'input[0]' "an empty token list"
zs_expect_400 /v1/embeddings "{\"input\":[$(seq -s, 1 600 | sed 's/[0-9]*/5/g')]}" input "a token list over the context"
zs_expect_400 /v1/embeddings '{"input":[1,999999]}' input "an id out of range"
zs_expect_400 /v1/embeddings '{"input":"a","dimensions":32}' dimensions "dimensions other than the model's"
zs_expect_400 /v1/embeddings '{"input":"a","encoding_format":"int8"}' encoding_format "an unknown encoding_format"
zs_expect_400 /v1/embeddings '{"input":"a","pooling":"max"}' pooling "an unknown pooling"
zs_expect_400 /v1/embeddings '{"input":5}' input "input a number"
zs_expect_400 /v1/embeddings '{}' input "no input"
zs_expect_400 /v1/embeddings '{"input":"a","foo":1}' foo "an unknown field"
c=$(zs_code /v1/embeddings '{"input":"a","model":"nope"}')
[ "$c" = 404 ] && ok "an unknown model: 404" || nok "unknown model: $c"

# the openai client (skipped where the package is missing)
if python3 -c "import openai" 2>/dev/null; then
    out=$(ZS_URL=$ZS_URL python3 - <<EOF 2>&1
import os, openai
c = openai.OpenAI(base_url=os.environ["ZS_URL"] + "/v1", api_key="none")
r = c.embeddings.create(model="stories260K", input=["$A", "$B"])
print(len(r.data), len(r.data[0].embedding), r.usage.prompt_tokens, repr(r.data[0].embedding[0]))
EOF
)
    want="2 64 23 $(echo "$one" | jq '.data[0].embedding[0]')"
    [ "$(echo "$out" | awk '{print $1, $2, $3}')" = "2 64 23" ] && ok "openai client embeddings.create: $out" || nok "openai client: $out (want $want)"
else
    echo "# skip: python3 has no openai package"
fi
zs_stop_server

# --pooling last as the server's default
zs_start_server "$T/srv2.log" --model "$MODEL" --device cpu --pooling last || nok "server with --pooling last starts"
if [ -n "$SPID" ]; then
    r=$(zs_post /v1/embeddings "{\"input\":\"$A\"}")
    [ "$(echo "$r" | jq -c .data[0].embedding)" = "$(echo "$last" | jq -c .data[0].embedding)" ] && ok "--pooling last: the default pooling" || nok "--pooling last"
    r=$(zs_post /v1/embeddings "{\"input\":\"$A\",\"pooling\":\"mean\"}")
    [ "$(echo "$r" | jq -c .data[0].embedding)" = "$(echo "$one" | jq -c .data[0].embedding)" ] && ok "a request's pooling overrides it" || nok "pooling override"
fi
"$BIN" serve --model "$MODEL" --pooling max --port 0 >"$T/bad.log" 2>&1 && nok "--pooling max accepted" || { grep -q -- "--pooling" "$T/bad.log" && ok "--pooling max refused naming the flag" || nok "--pooling max: $(cat "$T/bad.log")"; }
zs_done

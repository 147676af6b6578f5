/* test-api.c — in-process test of the OpenAI-compatible server (server/api-openai.c, serve.c,
 * metrics.c) on the stories260K fixture: health, models, greedy completions against
 * reference.json, streaming (SSE) equal to the plain answer, chat, n > 1, logprobs, every
 * error status, client disconnects, /metrics, and LoRA adapters (an adapter saved here for the
 * fixture, loaded and unloaded over HTTP while requests use it: under ASan this checks that an
 * unload never frees what a request still reads and frees it after the last). The test is its
 * own raw-socket HTTP client. */
#define _GNU_SOURCE
#include "api.h"

#include "common.h"
#include "lora.h"
#include "testutil.h"

#include <pthread.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#define KEY_HDR "Authorization: Bearer sk-test\r\n"
#define JSON_HDR "Authorization: Bearer sk-test\r\nContent-Type: application/json\r\n"

/* ------------------------------------------------------------------ client helpers */

#define TU_HTTP_TIMEOUT_S 20
#include "http-client.h"

static const char *jstr(json_t *j, const char *path) {
    /* dotted path with numeric array indices: "choices.0.text" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return json_is_string(cur) ? json_string_value(cur) : NULL;
}

static json_t *jget(json_t *j, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = j;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
    return cur;
}

static long long jint(json_t *j, const char *path) {
    json_t *v = jget(j, path);
    return json_is_integer(v) ? json_integer_value(v) : -999;
}

static int streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

/* Expects an OpenAI error with this status, param (NULL: JSON null) and code (NULL: any). */
static void expect_error(int port, const char *method, const char *path, const char *hdrs, const char *body,
                         int status, const char *param, const char *code, const char *what) {
    resp_t r;
    request(port, method, path, hdrs, body, &r);
    json_t *j = body_json(&r);
    CHECK(r.status == status, "%s: status %d, want %d (%s)", what, r.status, status, r.body ? r.body : "");
    json_t *err = json_object_get(j, "error");
    CHECK(json_is_object(err) && json_is_string(json_object_get(err, "message")) &&
              json_is_string(json_object_get(err, "type")),
          "%s: error shape %s", what, r.body ? r.body : "");
    if (param) CHECK(streq(jstr(j, "error.param"), param), "%s: param %s, want %s", what, jstr(j, "error.param"), param);
    else CHECK(json_is_null(jget(j, "error.param")), "%s: param should be null: %s", what, r.body);
    if (code) CHECK(streq(jstr(j, "error.code"), code), "%s: code %s, want %s", what, jstr(j, "error.code"), code);
    json_decref(j);
    resp_free(&r);
}

/* Splits an SSE body into its data payloads; returns the count (at most max). */
static int sse_events(char *body, char **ev, int max) {
    int n = 0;
    for (char *p = body; p && *p && n < max;) {
        char *end = strstr(p, "\n\n");
        if (!end) break;
        *end = '\0';
        if (!strncmp(p, "data: ", 6)) ev[n++] = p + 6;
        p = end + 2;
    }
    return n;
}

/* ------------------------------------------------------------------ tests */

static char g_ref_text[4096];

static void test_basic(int port) {
    resp_t r;
    request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "\"ok\""), "health %d %s", r.status, r.body);
    resp_free(&r);

    request(port, "GET", "/v1/models", KEY_HDR, NULL, &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 200 && streq(jstr(j, "object"), "list") && streq(jstr(j, "data.0.id"), "stories260K") &&
              streq(jstr(j, "data.0.object"), "model"),
          "models %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);
    request(port, "GET", "/v1/models/stories260K", KEY_HDR, NULL, &r);
    CHECK(r.status == 200, "model by id %d", r.status);
    resp_free(&r);

    request(port, "GET", "/", NULL, NULL, &r);
    CHECK(r.status == 200 && hdr(&r, "Content-Type") && strstr(hdr(&r, "Content-Type"), "text/html") &&
              r.blen > 0 && strcasestr(r.body, "<html"),
          "playground %d", r.status);
    resp_free(&r);
}

static char *completion_text(int port, const char *body, json_t **out) {
    resp_t r;
    request(port, "POST", "/v1/completions", JSON_HDR, body, &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 200, "completion %d %s", r.status, r.body);
    const char *t = jstr(j, "choices.0.text");
    char *s = t ? strdup(t) : NULL;
    if (out) *out = j;
    else json_decref(j);
    resp_free(&r);
    return s;
}

static void test_completion(int port) {
    json_t *j = NULL;
    char *text = completion_text(
        port, "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0}", &j);
    CHECK(text && *text && !strncmp(g_ref_text, text, strlen(text)), "greedy text [%s] is not a prefix of [%.80s]",
          text ? text : "(null)", g_ref_text);
    CHECK(streq(jstr(j, "object"), "text_completion") && jstr(j, "id") && !strncmp(jstr(j, "id"), "cmpl-", 5) &&
              streq(jstr(j, "model"), "stories260K") && json_is_integer(jget(j, "created")),
          "completion shape");
    CHECK(jint(j, "choices.0.index") == 0 && json_is_null(jget(j, "choices.0.logprobs")) &&
              streq(jstr(j, "choices.0.finish_reason"), "length"),
          "choice shape");
    CHECK(jint(j, "usage.prompt_tokens") == 5 && jint(j, "usage.completion_tokens") == 16 &&
              jint(j, "usage.total_tokens") == 21,
          "usage %lld %lld", jint(j, "usage.prompt_tokens"), jint(j, "usage.completion_tokens"));
    json_decref(j);

    /* the same prompt as token ids (BOS included) gives the same text */
    char *t2 = completion_text(port, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":16,\"temperature\":0}", NULL);
    CHECK(text && t2 && !strcmp(text, t2), "token-id prompt [%s] vs [%s]", t2 ? t2 : "", text ? text : "");
    free(t2);

    /* streamed: chunks concatenate to the same text, then usage, then [DONE] */
    resp_t r;
    request(port, "POST", "/v1/completions", JSON_HDR,
            "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true}}",
            &r);
    CHECK(r.status == 200 && r.chunked && r.complete, "stream status %d", r.status);
    CHECK(hdr(&r, "Content-Type") && strstr(hdr(&r, "Content-Type"), "text/event-stream"), "sse content type");
    CHECK(r.blen >= 14 && !strcmp(r.body + r.blen - 14, "data: [DONE]\n\n"), "ends with [DONE]");
    char *ev[256];
    int n = sse_events(r.body, ev, 256);
    char joined[4096] = "";
    int finish_seen = 0, usage_seen = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i], "[DONE]")) {
            CHECK(i == n - 1, "[DONE] last");
            continue;
        }
        json_t *c = json_loads(ev[i], 0, NULL);
        if (!c) {
            bad++;
            continue;
        }
        if (!streq(jstr(c, "object"), "text_completion")) bad++;
        json_t *ch = json_object_get(c, "choices");
        if (json_array_size(ch) == 0) {
            usage_seen = jint(c, "usage.completion_tokens") == 16;
        } else {
            const char *t = jstr(c, "choices.0.text");
            if (t) strncat(joined, t, sizeof joined - strlen(joined) - 1);
            if (jstr(c, "choices.0.finish_reason")) finish_seen = streq(jstr(c, "choices.0.finish_reason"), "length");
        }
        json_decref(c);
    }
    CHECK(!bad, "%d bad chunks", bad);
    CHECK(text && !strcmp(joined, text), "stream text [%s] vs [%s]", joined, text ? text : "");
    CHECK(finish_seen && usage_seen, "finish %d usage %d", finish_seen, usage_seen);
    resp_free(&r);
    free(text);

    /* stop string: the text ends before it */
    char *t3 = completion_text(port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,"
                                     "\"stop\":[\"girl\"]}", &j);
    CHECK(t3 && !strstr(t3, "girl") && !strncmp(g_ref_text, t3, strlen(t3)) &&
              streq(jstr(j, "choices.0.finish_reason"), "stop"),
          "stop [%s] %s", t3 ? t3 : "", jstr(j, "choices.0.finish_reason"));
    free(t3);
    json_decref(j);

    /* n = 2 over two prompts: 4 choices, indices in order */
    free(completion_text(port, "{\"prompt\":[\"Once\",\"The dog\"],\"n\":2,\"max_tokens\":4,\"temperature\":0.9,\"seed\":7}", &j));
    json_t *ch = json_object_get(j, "choices");
    CHECK(json_array_size(ch) == 4, "4 choices");
    for (size_t i = 0; i < json_array_size(ch); i++)
        CHECK(jint(json_array_get(ch, i), "index") == (long long)i, "choice %zu index", i);
    CHECK(jint(j, "usage.completion_tokens") <= 16 && jint(j, "usage.completion_tokens") > 0, "usage n=2");
    json_decref(j);
    /* the same seed gives the same text */
    char *s1 = completion_text(port, "{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":1,\"seed\":11}", NULL);
    char *s2 = completion_text(port, "{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":1,\"seed\":11}", NULL);
    CHECK(s1 && s2 && !strcmp(s1, s2), "seeded [%s] vs [%s]", s1 ? s1 : "", s2 ? s2 : "");
    free(s1);
    free(s2);

    /* logprobs (completions shape) */
    char *t4 = completion_text(port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0,\"logprobs\":2}", &j);
    json_t *lp = jget(j, "choices.0.logprobs");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 4 &&
              json_array_size(json_object_get(lp, "token_logprobs")) == 4 &&
              json_array_size(json_object_get(lp, "top_logprobs")) == 4 &&
              json_array_size(json_object_get(lp, "text_offset")) == 4,
          "logprobs shape");
    json_t *tl0 = json_array_get(json_object_get(lp, "token_logprobs"), 0);
    CHECK(json_is_number(tl0) && json_number_value(tl0) <= 0, "token logprob <= 0");
    /* the tokens spell the text */
    char spelled[512] = "";
    for (size_t i = 0; i < json_array_size(json_object_get(lp, "tokens")); i++) {
        const char *t = json_string_value(json_array_get(json_object_get(lp, "tokens"), i));
        if (t) strncat(spelled, t, sizeof spelled - strlen(spelled) - 1);
    }
    CHECK(t4 && !strcmp(spelled, t4), "tokens spell [%s] vs [%s]", spelled, t4 ? t4 : "");
    free(t4);
    json_decref(j);
}

static void test_chat(int port) {
    resp_t r;
    request(port, "POST", "/v1/chat/completions", JSON_HDR,
            "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
            "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Once upon\"},{\"type\":\"text\",\"text\":\"a time\"}]}],"
            "\"max_completion_tokens\":8,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}",
            &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 200 && streq(jstr(j, "object"), "chat.completion") && !strncmp(jstr(j, "id") ? jstr(j, "id") : "", "chatcmpl-", 9),
          "chat %d %s", r.status, r.body);
    CHECK(streq(jstr(j, "choices.0.message.role"), "assistant") && jstr(j, "choices.0.message.content"), "message");
    CHECK(jint(j, "usage.completion_tokens") >= 1 && jint(j, "usage.completion_tokens") <= 8, "chat usage");
    json_t *content = jget(j, "choices.0.logprobs.content");
    CHECK(json_array_size(content) == (size_t)jint(j, "usage.completion_tokens"), "chat logprobs entries");
    CHECK(jstr(content, "0.token") && json_is_array(jget(content, "0.bytes")) &&
              json_is_number(jget(content, "0.logprob")) && json_is_array(jget(content, "0.top_logprobs")),
          "chat logprob entry shape");
    char *plain = jstr(j, "choices.0.message.content") ? strdup(jstr(j, "choices.0.message.content")) : NULL;
    json_decref(j);
    resp_free(&r);

    /* streamed chat: role first, content pieces, empty delta with finish_reason, [DONE] */
    request(port, "POST", "/v1/chat/completions", JSON_HDR,
            "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell a story.\"},"
            "{\"role\":\"user\",\"content\":\"Once upon\\na time\"}],\"max_tokens\":8,\"temperature\":0,\"stream\":true}",
            &r);
    CHECK(r.status == 200, "chat stream %d", r.status);
    char *ev[128];
    int n = sse_events(r.body ? r.body : "", ev, 128);
    CHECK(n >= 3 && !strcmp(ev[n - 1], "[DONE]"), "chat stream events %d", n);
    char joined[2048] = "";
    for (int i = 0; i + 1 < n; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        CHECK(c && streq(jstr(c, "object"), "chat.completion.chunk"), "chunk %d", i);
        if (i == 0) CHECK(streq(jstr(c, "choices.0.delta.role"), "assistant") && streq(jstr(c, "choices.0.delta.content"), ""), "first chunk");
        const char *t = jstr(c, "choices.0.delta.content");
        if (t && i) strncat(joined, t, sizeof joined - strlen(joined) - 1);
        if (i == n - 2) CHECK(json_object_size(jget(c, "choices.0.delta")) == 0 && jstr(c, "choices.0.finish_reason"), "last chunk");
        json_decref(c);
    }
    CHECK(plain && !strcmp(plain, joined), "chat stream [%s] vs [%s]", joined, plain ? plain : "");
    free(plain);
    resp_free(&r);

    /* n = 3 streamed: every index appears and finishes */
    request(port, "POST", "/v1/chat/completions", JSON_HDR,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"n\":3,\"stream\":true,\"seed\":1}", &r);
    n = sse_events(r.body ? r.body : "", ev, 128);
    int finished[3] = {0};
    for (int i = 0; i < n; i++) {
        json_t *c = json_loads(ev[i], 0, NULL);
        long long idx = jint(c, "choices.0.index");
        if (idx >= 0 && idx < 3 && jstr(c, "choices.0.finish_reason")) finished[idx]++;
        json_decref(c);
    }
    CHECK(finished[0] == 1 && finished[1] == 1 && finished[2] == 1, "n=3 finishes %d %d %d", finished[0], finished[1],
          finished[2]);
    resp_free(&r);
}

static void test_errors(int port) {
    const char *C = "/v1/completions", *CH = "/v1/chat/completions";
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\": \"x\",", 400, NULL, NULL, "malformed JSON");
    expect_error(port, "POST", C, JSON_HDR, "[1,2]", 400, NULL, NULL, "not an object");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature",
                 "invalid_type", "wrong type");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature", NULL,
                 "temperature range");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", NULL,
                 "max_tokens range");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"n\":17}", 400, "n", NULL, "n range");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"top_p\":1.5}", 400, "top_p", NULL, "top_p range");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs", NULL, "logprobs");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"stop\":[1]}", 400, "stop", NULL, "stop type");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"bogus\":1}", 400, "bogus", NULL, "unknown field");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"presence_penalty\":0.5}", 400, "presence_penalty",
                 "unsupported_parameter", "penalty");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo", NULL, "echo");
    expect_error(port, "POST", C, JSON_HDR, "{\"max_tokens\":3}", 400, "prompt", NULL, "missing prompt");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":[1,99999]}", 400, "prompt", NULL, "token id range");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
                 "stream_options", NULL, "stream_options without stream");
    expect_error(port, "POST", C, JSON_HDR, "{\"model\":\"gpt-4\",\"prompt\":\"x\"}", 404, "model", "model_not_found",
                 "unknown model");
    expect_error(port, "POST", C, JSON_HDR, "{\"prompt\":\"Once upon a time\",\"max_tokens\":1000}", 400, "max_tokens",
                 "context_length_exceeded", "context");
    expect_error(port, "POST", CH, JSON_HDR,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"y\"}]}", 400,
                 "messages[1].tool_call_id", NULL, "tool message without its tool_call_id");
    expect_error(port, "POST", CH, JSON_HDR,
                 "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
                 "messages[0].content[0].type", NULL, "image part");
    expect_error(port, "POST", CH, JSON_HDR, "{\"messages\":[]}", 400, "messages", NULL, "empty messages");
    expect_error(port, "POST", CH, JSON_HDR, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
                 400, "top_logprobs", NULL, "top_logprobs without logprobs");
    expect_error(port, "POST", CH, JSON_HDR,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":100000}", 400,
                 "max_completion_tokens", "context_length_exceeded", "chat context");
    /* a prompt longer than the context by itself */
    size_t big = 20000;
    char *body = malloc(big + 64);
    int off = sprintf(body, "{\"prompt\":\"");
    for (size_t i = 0; i < 3000; i++) off += sprintf(body + off, "once ");
    sprintf(body + off, "\"}");
    expect_error(port, "POST", C, JSON_HDR, body, 400, "prompt", "context_length_exceeded", "long prompt");
    free(body);

    /* 413, 404, 405, 401 */
    resp_t r;
    const char *huge = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                       "Content-Length: 100000000\r\n\r\n{";
    raw_request(port, huge, strlen(huge), &r);
    CHECK(r.status == 413, "413 got %d", r.status);
    resp_free(&r);
    expect_error(port, "GET", "/v1/nothing", KEY_HDR, NULL, 404, NULL, NULL, "unknown route");
    expect_error(port, "GET", C, KEY_HDR, NULL, 405, NULL, NULL, "wrong method");
    expect_error(port, "POST", C, NULL, "{\"prompt\":\"x\"}", 401, NULL, "invalid_api_key", "missing key");
    expect_error(port, "POST", C, "Authorization: Bearer sk-wrong\r\n", "{\"prompt\":\"x\"}", 401, NULL,
                 "invalid_api_key", "wrong key");
    expect_error(port, "GET", "/metrics", NULL, NULL, 401, NULL, NULL, "metrics needs the key");
}

/* Clients that leave mid-stream or mid-request: the server cancels and keeps serving. */
static void test_disconnect(int port) {
    const char *bodies[2] = {
        "{\"prompt\":\"Once\",\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true,\"n\":4}",
        "{\"prompt\":\"Once\",\"max_tokens\":400,\"ignore_eos\":true,\"n\":4}",
    };
    for (int k = 0; k < 2; k++) {
        for (int rep = 0; rep < 3; rep++) {
            int fd = connect_to(port);
            char *req = NULL;
            int n = asprintf(&req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" JSON_HDR "Content-Length: %zu\r\n\r\n%s",
                             strlen(bodies[k]), bodies[k]);
            send_all(fd, req, (size_t)n);
            free(req);
            if (k == 0) {
                char buf[256];
                recv(fd, buf, sizeof buf, 0); /* the first bytes of the stream */
            } else {
                msleep(5 * rep);
            }
            close(fd);
        }
    }
    msleep(200);
    resp_t r;
    request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "alive after disconnects");
    resp_free(&r);
    char *t = completion_text(port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}", NULL);
    CHECK(t && !strncmp(g_ref_text, t, strlen(t)), "still correct after disconnects");
    free(t);
}

static void test_metrics(int port) {
    resp_t r;
    request(port, "GET", "/metrics", KEY_HDR, NULL, &r);
    CHECK(r.status == 200 && hdr(&r, "Content-Type") && strstr(hdr(&r, "Content-Type"), "text/plain; version=0.0.4"),
          "metrics %d", r.status);
    const char *names[] = {
        "# TYPE zeroserve_requests_total counter",
        "zeroserve_requests_total{route=\"/v1/completions\",method=\"POST\",status=\"200\"}",
        "zeroserve_requests_total{route=\"/v1/completions\",method=\"POST\",status=\"400\"}",
        "zeroserve_prompt_tokens_total ",
        "zeroserve_generation_tokens_total ",
        "# TYPE zeroserve_time_to_first_token_seconds histogram",
        "zeroserve_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
        "zeroserve_time_to_first_token_seconds_sum ",
        "zeroserve_time_to_first_token_seconds_count ",
        "zeroserve_inter_token_latency_seconds_bucket{le=\"+Inf\"}",
        "zeroserve_queue_length ",
        "zeroserve_running_sequences ",
        "zeroserve_kv_blocks_used ",
        "zeroserve_kv_blocks_total ",
        "zeroserve_bytes_streamed_total{tier=\"nvme\"}",
        "zeroserve_bytes_streamed_total{tier=\"host\"}",
        "zeroserve_bytes_streamed_total{tier=\"gathered\"}",
        "zeroserve_gather_stall_seconds_total ",
        "zeroserve_engine_steps_total ",
        "zeroserve_requests_finished_total{reason=\"stop\"}",
        "zeroserve_requests_finished_total{reason=\"cancelled\"}",
        "# HELP zeroserve_queue_length ",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(r.body && strstr(r.body, names[i]), "metrics lack %s", names[i]);
    const char *gen = r.body ? strstr(r.body, "\nzeroserve_generation_tokens_total ") : NULL;
    CHECK(gen && atol(gen + 35) > 0, "generated tokens counted");
    resp_free(&r);
}

/* ------------------------------------------------------------------ LoRA adapters */

typedef struct {
    int port;
    const char *body;
    int status;
    int unloaded; /* the answer says the adapter was unloaded (404 or an SSE error event) */
    int done;     /* a complete answer: 200 (plain), or [DONE] (stream) */
} bg_req;

static void *bg_main(void *arg) {
    bg_req *b = arg;
    resp_t r;
    request(b->port, "POST", "/v1/completions", JSON_HDR, b->body, &r);
    b->status = r.status;
    b->unloaded = r.body && strstr(r.body, "was unloaded") != NULL;
    b->done = r.body && (strstr(r.body, "[DONE]") || (r.status == 200 && strstr(r.body, "\"choices\"")));
    resp_free(&r);
    return NULL;
}

/* The first token's logprob of a greedy completion of model (NULL: the base). */
static double first_logprob(int port, const char *model) {
    char body[256];
    snprintf(body, sizeof body, "{%s%s%s\"prompt\":\"Once upon a time\",\"max_tokens\":1,\"temperature\":0,\"logprobs\":0}",
             model ? "\"model\":\"" : "", model ? model : "", model ? "\"," : "");
    resp_t r;
    request(port, "POST", "/v1/completions", JSON_HDR, body, &r);
    json_t *j = body_json(&r);
    json_t *v = jget(j, "choices.0.logprobs.token_logprobs.0");
    double x = json_is_number(v) ? json_number_value(v) : 1e9;
    if (r.status != 200) fprintf(stderr, "first_logprob(%s): %d %s\n", model ? model : "base", r.status, r.body ? r.body : "");
    json_decref(j);
    resp_free(&r);
    return x;
}

/* tmp: the server's --lora-dir (removed at the end) */
static void test_lora(int port, const char *model_dir, const char *tmp) {
    /* an adapter for the fixture: PEFT's init (A random, B zero) and then B random, saved in PEFT's format */
    char adir[600];
    snprintf(adir, sizeof adir, "%s/ad", tmp);
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.model_dir = model_dir;
    zs_engine *e = NULL;
    int rc = zs_engine_open(&eo, &e);
    CHECK(rc == 0, "open the fixture for the adapter: %s", zs_errmsg());
    if (rc) return;
    zs_lora_params lp = {4, 8.0f, 0, 0.0f, ZS_LORA_ALL};
    zs_lora *l = NULL;
    rc = zs_lora_new(zs_engine_model(e), &lp, &l);
    CHECK(rc == 0, "zs_lora_new: %s", zs_errmsg());
    if (rc == 0) {
        zs_lora_init(l, 7);
        for (int layer = 0; layer < zs_lora_n_layers(l); layer++)
            for (int t = 0; t < ZS_LORA_NT; t++) {
                int in, out;
                zs_lora_dims(l, t, &in, &out);
                float *B = zs_lora_B(l, layer, t);
                for (int i = 0; i < out * lp.r; i++) B[i] = 0.05f * (float)((i * 7919 + layer * 31 + t * 17) % 200 - 100) / 100.0f;
            }
        rc = zs_lora_save(l, adir, "stories260K");
        CHECK(rc == 0, "zs_lora_save: %s", zs_errmsg());
    }
    zs_lora_free(l);
    zs_engine_free(e);
    if (rc) return;

    char body[1024];
    resp_t r;
    snprintf(body, sizeof body, "{\"lora_name\":\"ad\",\"lora_path\":\"%s\"}", adir);
    request(port, "POST", "/v1/load_lora_adapter", JSON_HDR, body, &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 200 && streq(jstr(j, "object"), "lora_adapter") && streq(jstr(j, "id"), "ad") &&
              streq(jstr(j, "parent"), "stories260K") && jint(j, "r") == 4 && json_array_size(jget(j, "target_modules")) == 7,
          "load: %d %s", r.status, r.body ? r.body : "");
    json_decref(j);
    resp_free(&r);
    request(port, "POST", "/v1/load_lora_adapter", KEY_HDR, body, &r); /* without the key's JSON header it still parses */
    CHECK(r.status == 400, "load twice: %d", r.status);
    resp_free(&r);
    request(port, "POST", "/v1/load_lora_adapter", "", body, &r);
    CHECK(r.status == 401, "load without the API key: %d", r.status);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"lora_name\":\"ad2\",\"lora_path\":\"%s/nope\"}", tmp);
    expect_error(port, "POST", "/v1/load_lora_adapter", JSON_HDR, body, 400, "lora_path", "invalid_lora_path", "load a missing dir");
    expect_error(port, "POST", "/v1/load_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad2\",\"lora_path\":\"/etc\"}", 400,
                 "lora_path", "invalid_lora_path", "load from outside the --lora-dir");
    request(port, "POST", "/v1/load_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad3\",\"lora_path\":\"ad\"}", &r);
    CHECK(r.status == 200, "load by a path relative to the --lora-dir: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    request(port, "POST", "/v1/unload_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad3\"}", &r);
    CHECK(r.status == 200, "unload ad3: %d", r.status);
    resp_free(&r);
    expect_error(port, "POST", "/v1/load_lora_adapter", JSON_HDR, "{\"lora_path\":\"x\"}", 400, "lora_name",
                 "missing_required_parameter", "load without a name");

    request(port, "GET", "/v1/models", KEY_HDR, NULL, &r);
    j = body_json(&r);
    CHECK(streq(jstr(j, "data.1.id"), "ad") && streq(jstr(j, "data.1.parent"), "stories260K") && streq(jstr(j, "data.1.root"), adir),
          "models list the adapter: %s", r.body ? r.body : "");
    json_decref(j);
    resp_free(&r);
    double lb = first_logprob(port, NULL), la = first_logprob(port, "ad");
    CHECK(lb < 0 && la < 0 && fabs(lb - la) > 1e-4, "the adapter changes the logprob (%g vs %g)", la, lb);
    CHECK(first_logprob(port, "ad") == la, "the adapter's answer is deterministic");

    /* unload while requests use it (waiting 0 s): every request ends, failed ones say so */
    enum { NB = 6 };
    bg_req b[NB];
    pthread_t th[NB];
    const char *plain = "{\"model\":\"ad\",\"prompt\":\"Once\",\"max_tokens\":300,\"ignore_eos\":true,\"n\":4}";
    const char *stream = "{\"model\":\"ad\",\"prompt\":\"Once\",\"max_tokens\":300,\"ignore_eos\":true,\"n\":4,\"stream\":true}";
    for (int i = 0; i < NB; i++) {
        b[i] = (bg_req){port, i % 2 ? stream : plain, 0, 0, 0};
        pthread_create(&th[i], NULL, bg_main, &b[i]);
    }
    msleep(30);
    request(port, "POST", "/v1/unload_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad\",\"wait_s\":0}", &r);
    j = body_json(&r);
    CHECK(r.status == 200 && json_is_true(jget(j, "deleted")), "unload: %d %s", r.status, r.body ? r.body : "");
    fprintf(stderr, "test-api: the unload failed %lld running request(s)\n", jint(j, "failed_requests"));
    json_decref(j);
    resp_free(&r);
    int ended = 0;
    for (int i = 0; i < NB; i++) {
        pthread_join(th[i], NULL);
        ended += (b[i].status == 200 && (b[i].done || b[i].unloaded)) || (b[i].status == 404 && b[i].unloaded);
    }
    CHECK(ended == NB, "every request using the unloaded adapter ended completely or with the unload error (%d of %d)", ended, NB);
    expect_error(port, "POST", "/v1/completions", JSON_HDR, "{\"model\":\"ad\",\"prompt\":\"Once\"}", 404, "model",
                 "model_not_found", "a request naming the unloaded adapter");
    expect_error(port, "POST", "/v1/unload_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad\"}", 404, "lora_name", NULL,
                 "unload twice");
    CHECK(fabs(first_logprob(port, NULL) - lb) == 0, "the base is unchanged after the unload");

    /* loaded again, a client that goes away, then an unload that waits (nothing left to fail) */
    snprintf(body, sizeof body, "{\"lora_name\":\"ad\",\"lora_path\":\"%s\"}", adir);
    request(port, "POST", "/v1/load_lora_adapter", JSON_HDR, body, &r);
    CHECK(r.status == 200, "load again: %d", r.status);
    resp_free(&r);
    CHECK(first_logprob(port, "ad") == la, "the reloaded adapter answers as before");
    int fd = connect_to(port);
    char *req = NULL;
    int n = asprintf(&req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" JSON_HDR "Content-Length: %zu\r\n\r\n%s",
                     strlen(stream), stream);
    send_all(fd, req, (size_t)n);
    free(req);
    char buf[256];
    recv(fd, buf, sizeof buf, 0);
    close(fd);
    request(port, "POST", "/v1/unload_lora_adapter", JSON_HDR, "{\"lora_name\":\"ad\"}", &r);
    CHECK(r.status == 200, "unload after a disconnect: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0, "rm %s", tmp);
}

int main(void) {
    char dir[512];
    tu_model_dir(dir, sizeof dir, "stories260K");
    json_t *ref = tu_load_reference(dir);
    if (!ref) return 1;
    const char *nt = jstr(ref, "cases.0.new_text");
    CHECK(nt && streq(jstr(ref, "cases.0.prompt"), "Once upon a time"), "reference case");
    snprintf(g_ref_text, sizeof g_ref_text, "%s", nt ? nt : "");
    json_decref(ref);

    double t0 = zs_now();
    zs_server_opts o;
    memset(&o, 0, sizeof o);
    o.http.port = 0;
    o.http.threads = 4;
    o.http.api_key = "sk-test";
    zs_engine_opts_default(&o.engine);
    o.engine.model_dir = dir;
    o.engine.max_seqs = 8;
    o.sched.max_seqs = 8;
    o.sched.max_batch_tokens = 256;
    o.sched.max_queue = 64;
    o.chat_template = -1;
    o.quiet = 1;
    char lora_tmp[] = "/tmp/zs-test-api-lora.XXXXXX";
    CHECK(mkdtemp(lora_tmp) != NULL, "mkdtemp");
    const char *lora_dirs[] = {lora_tmp};
    o.lora_dirs = lora_dirs;
    o.n_lora_dirs = 1;
    zs_server *s = NULL;
    int rc = zs_server_start(&o, NULL, NULL, &s);
    CHECK(rc == 0, "server start: %s", zs_errmsg());
    if (rc) return tu_finish("test-api");
    int port = zs_server_port(s);
    rc = zs_server_wait_loaded(s, 60);
    CHECK(rc == 0, "load: %s", zs_errmsg());
    if (rc == 0) {
        test_basic(port);
        test_completion(port);
        test_chat(port);
        test_errors(port);
        test_disconnect(port);
        test_metrics(port);
        test_lora(port, dir, lora_tmp);
    }
    zs_server_stop(s, 5);
    /* a --lora-dir that does not exist (test_lora removed it) fails the start, naming it */
    rc = zs_server_start(&o, NULL, NULL, &s);
    CHECK(rc < 0 && strstr(zs_errmsg(), "--lora-dir") && strstr(zs_errmsg(), lora_tmp), "start with a missing --lora-dir: %d %s",
          rc, zs_errmsg());
    if (rc == 0) zs_server_stop(s, 1);
    o.lora_dirs = NULL;
    o.n_lora_dirs = 0;
    fprintf(stderr, "test-api: %.1f s\n", zs_now() - t0);

    /* a model directory that does not load: the server starts, /health stays 503, the load fails */
    o.engine.model_dir = "/nonexistent/model";
    rc = zs_server_start(&o, NULL, NULL, &s);
    CHECK(rc == 0, "start with a bad model: %s", zs_errmsg());
    if (rc == 0) {
        resp_t r;
        CHECK(zs_server_wait_loaded(s, 30) < 0, "bad model loads");
        request(zs_server_port(s), "GET", "/health", NULL, NULL, &r);
        CHECK(r.status == 503 && r.body && strstr(r.body, "loading"), "health while not loaded %d", r.status);
        resp_free(&r);
        request(zs_server_port(s), "POST", "/v1/completions", JSON_HDR, "{\"prompt\":\"x\"}", &r);
        CHECK(r.status == 503, "completion while not loaded %d", r.status);
        resp_free(&r);
        zs_server_stop(s, 1);
    }
    return tu_finish("test-api");
}

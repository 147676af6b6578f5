/* test-openapi.c — the OpenAPI document (server/openapi.json, served at GET /openapi.json) cannot
 * drift from the server: a server started as `serve` starts it (stories260K, a data directory,
 * so every route is registered) lists its routes (zs_http_routes), and each must be in the
 * document with its method and its role (x-zeroserve-role; security [] exactly for role none),
 * with nothing extra; the document is OpenAPI 3.x JSON whose every $ref resolves, every
 * operation answers 200 and the error statuses through the shared error responses, and GET
 * /openapi.json serves it byte for byte with no key while the server requires one. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "common.h"
#include "testutil.h"

#pragma GCC diagnostic ignored "-Wunused-function" /* the client's helpers this test does not use */
#include "http-client.h"

typedef struct {
    json_t *doc;
    json_t *seen; /* "get /path" of every route registered */
    int n_routes, n_missing;
} walk_t;

static const char *const k_ops[] = {"get", "put", "post", "delete", "options", "head", "patch", "trace", NULL};

static void on_route(void *ud, const char *method, const char *pattern, zs_role role) {
    walk_t *w = ud;
    char m[16];
    size_t i = 0;
    for (; method[i] && i + 1 < sizeof m; i++) m[i] = (char)tolower((unsigned char)method[i]);
    m[i] = '\0';
    w->n_routes++;
    char key[512];
    snprintf(key, sizeof key, "%s %s", m, pattern);
    json_object_set_new(w->seen, key, json_true());
    json_t *op = json_object_get(json_object_get(json_object_get(w->doc, "paths"), pattern), m);
    CHECK(json_is_object(op), "route %s %s is in the document", method, pattern);
    if (!op) {
        w->n_missing++;
        return;
    }
    const char *want = zs_role_name(role);
    const char *got = json_string_value(json_object_get(op, "x-zeroserve-role"));
    CHECK(got && !strcmp(got, want), "%s %s: x-zeroserve-role %s, the server's role %s", method, pattern, got ? got : "(none)",
          want);
    json_t *sec = json_object_get(op, "security");
    CHECK(json_is_array(sec) && (json_array_size(sec) == 0) == (role == ZS_ROLE_NONE),
          "%s %s: security [] exactly when no key is needed", method, pattern);
    json_t *resp = json_object_get(op, "responses");
    CHECK(json_object_get(resp, "200") != NULL, "%s %s: a 200 answer", method, pattern);
    static const char *const errs[] = {"404", "405", "413", "500", NULL};
    for (int k = 0; errs[k]; k++) CHECK(json_object_get(resp, errs[k]) != NULL, "%s %s: answers %s", method, pattern, errs[k]);
    if (role != ZS_ROLE_NONE)
        CHECK(json_object_get(resp, "401") && json_object_get(resp, "403"), "%s %s: answers 401 and 403", method, pattern);
    if (json_object_get(op, "requestBody"))
        CHECK(json_object_get(resp, "400") != NULL, "%s %s: a body, so 400", method, pattern);
}

/* Every {"$ref": "#/..."} under j resolves in doc; returns the number of refs seen. */
static int check_refs(json_t *doc, json_t *j) {
    int n = 0;
    if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) n += check_refs(doc, v);
        return n;
    }
    if (!json_is_object(j)) return 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (!strcmp(k, "$ref") && json_is_string(v)) {
            const char *r = json_string_value(v);
            json_t *at = doc;
            CHECK(!strncmp(r, "#/", 2), "$ref %s is local", r);
            char *copy = strdup(r + 2), *save = NULL;
            for (char *seg = strtok_r(copy, "/", &save); seg && at; seg = strtok_r(NULL, "/", &save)) at = json_object_get(at, seg);
            free(copy);
            CHECK(at != NULL, "$ref %s resolves", r);
            n++;
        } else {
            n += check_refs(doc, v);
        }
    }
    return n;
}

int main(void) {
    size_t len = 0;
    const char *text = zs_api_openapi_json(&len);
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    CHECK(json_is_object(doc), "the embedded document is JSON: %s (line %d)", je.text, je.line);
    if (!doc) return tu_finish("test-openapi");
    const char *ver = json_string_value(json_object_get(doc, "openapi"));
    CHECK(ver && !strncmp(ver, "3.", 2), "openapi 3.x (%s)", ver ? ver : "none");
    json_t *err = json_object_get(json_object_get(json_object_get(doc, "components"), "schemas"), "Error");
    json_t *inner = json_object_get(json_object_get(err, "properties"), "error");
    CHECK(json_array_size(json_object_get(inner, "required")) == 4, "the error shape: message, type, param, code");
    CHECK(json_is_object(json_object_get(json_object_get(json_object_get(doc, "components"), "securitySchemes"), "bearer")),
          "bearer security scheme");
    int refs = check_refs(doc, doc);
    CHECK(refs > 50, "%d $refs checked", refs);

    char dir[512], data[] = "/tmp/zs-test-openapi.XXXXXX";
    tu_model_dir(dir, sizeof dir, "stories260K");
    CHECK(mkdtemp(data) != NULL, "mkdtemp");
    zs_server_opts o;
    memset(&o, 0, sizeof o);
    o.http.port = 0;
    o.http.threads = 2;
    o.http.api_key = "sk-openapi";
    zs_engine_opts_default(&o.engine);
    o.engine.model_dir = dir;
    o.sched.max_seqs = 2;
    o.sched.max_batch_tokens = 64;
    o.sched.max_queue = 8;
    o.chat_template = -1;
    o.quiet = 1;
    o.data_dir = data; /* the fine-tuning routes too */
    zs_server *s = NULL;
    int rc = zs_server_start(&o, NULL, NULL, &s);
    CHECK(rc == 0, "server start: %s", zs_errmsg());
    if (rc == 0) {
        walk_t w = {doc, json_object(), 0, 0};
        zs_http_routes(zs_server_http(s), on_route, &w);
        int n_ops = 0;
        const char *p;
        json_t *item;
        json_object_foreach(json_object_get(doc, "paths"), p, item) {
            for (int k = 0; k_ops[k]; k++) {
                if (!json_object_get(item, k_ops[k])) continue;
                char key[512];
                snprintf(key, sizeof key, "%s %s", k_ops[k], p);
                CHECK(json_object_get(w.seen, key) != NULL, "the document's %s is a route of the server", key);
                n_ops++;
            }
        }
        json_decref(w.seen);
        CHECK(w.n_routes >= 20 && w.n_missing == 0, "%d routes registered, %d missing from the document", w.n_routes,
              w.n_missing);
        CHECK(n_ops == w.n_routes, "the document has %d operations, the server %d routes (nothing extra)", n_ops, w.n_routes);
        resp_t r;
        request(zs_server_port(s), "GET", "/openapi.json", "", NULL, &r);
        CHECK(r.status == 200 && r.blen == len && r.body && !memcmp(r.body, text, len),
              "GET /openapi.json without the key: 200, the document byte for byte (%d, %zu bytes)", r.status, r.blen);
        const char *ct = hdr(&r, "Content-Type");
        CHECK(ct && !strncmp(ct, "application/json", 16), "Content-Type application/json (%s)", ct ? ct : "none");
        resp_free(&r);
        request(zs_server_port(s), "GET", "/v1/models", "", NULL, &r);
        CHECK(r.status == 401, "GET /v1/models without the key: 401 (%d)", r.status);
        resp_free(&r);
        zs_server_stop(s, 2);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", data);
    CHECK(system(cmd) == 0, "rm %s", data);
    json_decref(doc);
    return tu_finish("test-openapi");
}

/* test-http.c — tests of the HTTP layer (server/http.c): routing, 404/405, auth, body limits,
 * delayed responses, SSE streams, client disconnects, concurrency, graceful stop and counters.
 * The test is its own client, speaking raw HTTP/1.1 over sockets. */
#define _GNU_SOURCE
#include "http.h"

#include "common.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

/* ------------------------------------------------------------------ client helpers */

#include "http-client.h"

static const char *err_field(json_t *j, const char *k) {
    json_t *v = json_object_get(json_object_get(j, "error"), k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* ------------------------------------------------------------------ server side */

static atomic_int g_threads;     /* helper threads still running */
static atomic_int g_closed;      /* on_close calls */
static atomic_int g_after_close; /* write results after a close: ZS_ECANCELLED expected */
static atomic_int g_end_rc;
static double g_close_time;
/* the checks on server and helper threads: TCHECK (testutil.h) */

typedef struct {
    zs_http_req *req;
    zs_http_stream *s;
    int mode;
    atomic_int closed;
} job;

static void on_close_cb(void *ud) {
    job *j = ud;
    atomic_store(&j->closed, 1);
    g_close_time = zs_now();
    atomic_fetch_add(&g_closed, 1);
}

static void h_echo(void *ud, zs_http_req *r) {
    (void)ud;
    size_t n;
    const char *b = zs_http_req_body(r, &n);
    const char *q = zs_http_req_query(r, "x");
    const char *t = zs_http_req_header(r, "x-test");
    json_t *j = json_pack("{s:s,s:s,s:s%,s:s?,s:s?}", "method", zs_http_req_method(r), "path",
                          zs_http_req_path(r), "body", b, n, "q", q, "hdr", t);
    zs_http_respond_json(r, 200, j);
}

static void h_health(void *ud, zs_http_req *r) {
    (void)ud;
    zs_http_respond(r, 200, "text/plain", "ok\n", 3);
}

static void h_busy(void *ud, zs_http_req *r) {
    (void)ud;
    zs_http_add_header(r, "Retry-After", "7");
    TCHECK(zs_http_add_header(r, "X-Bad", "a\r\nInjected: 1") == ZS_EINVAL, "crlf accepted");
    zs_http_respond_error(r, 429, "rate_limit_error", NULL, "busy", "queue full (%d waiting)", 3);
}

static void h_job(void *ud, zs_http_req *r) {
    (void)ud;
    json_t *j = json_pack("{s:s}", "id", zs_http_req_param(r));
    zs_http_respond_json(r, 200, j);
}

static void *delayed_main(void *arg) {
    job *j = arg;
    msleep(50);
    int rc = zs_http_respond(j->req, 200, "application/json", "{\"delayed\":true}", 16);
    TCHECK(rc == 0, "delayed respond rc %d (%s)", rc, zs_errmsg());
    free(j);
    atomic_fetch_sub(&g_threads, 1);
    return NULL;
}

static void spawn(void *(*fn)(void *), job *j) {
    pthread_t t;
    atomic_fetch_add(&g_threads, 1);
    if (pthread_create(&t, NULL, fn, j) != 0) abort();
    pthread_detach(t);
}

static void h_delayed(void *ud, zs_http_req *r) {
    (void)ud;
    job *j = calloc(1, sizeof *j);
    j->req = r;
    spawn(delayed_main, j);
}

/* A delayed request whose answer only comes after the client left (or 3 s). */
static void *hang_main(void *arg) {
    job *j = arg;
    for (int i = 0; i < 300 && !atomic_load(&j->closed); i++) msleep(10);
    int rc = zs_http_respond(j->req, 200, "text/plain", "late", 4);
    atomic_store(&g_after_close, rc);
    free(j);
    atomic_fetch_sub(&g_threads, 1);
    return NULL;
}

static void h_hang(void *ud, zs_http_req *r) {
    (void)ud;
    job *j = calloc(1, sizeof *j);
    j->req = r;
    zs_http_on_close(r, on_close_cb, j);
    spawn(hang_main, j);
}

/* mode 0: 20 chunks then [DONE]; 1: one chunk then wait for the close, then write;
 * 2: a chunk every 20 ms until writes fail. */
static void *sse_main(void *arg) {
    job *j = arg;
    char buf[64];
    if (j->mode == 0) {
        for (int i = 0; i < 20; i++) {
            int n = snprintf(buf, sizeof buf, "data: {\"i\":%d}\n\n", i);
            TCHECK(zs_http_stream_write(j->s, buf, (size_t)n) == 0, "write %d", i);
            msleep(2);
        }
        zs_http_stream_write(j->s, "data: [DONE]\n\n", 14);
        TCHECK(zs_http_stream_end(j->s) == 0, "stream end");
    } else if (j->mode == 1) {
        zs_http_stream_write(j->s, "data: first\n\n", 13);
        for (int i = 0; i < 300 && !atomic_load(&j->closed); i++) msleep(10);
        atomic_store(&g_after_close, zs_http_stream_write(j->s, "data: x\n\n", 9));
        atomic_store(&g_end_rc, zs_http_stream_end(j->s));
    } else {
        int rc = 0;
        for (int i = 0; i < 1000 && rc == 0; i++) {
            int n = snprintf(buf, sizeof buf, "data: %d\n\n", i);
            rc = zs_http_stream_write(j->s, buf, (size_t)n);
            msleep(20);
        }
        atomic_store(&g_after_close, rc);
        atomic_store(&g_end_rc, zs_http_stream_end(j->s));
    }
    free(j);
    atomic_fetch_sub(&g_threads, 1);
    return NULL;
}

static void h_sse(void *ud, zs_http_req *r) {
    job *j = calloc(1, sizeof *j);
    j->mode = (int)(intptr_t)ud;
    zs_http_add_header(r, "X-Stream", "yes");
    int rc = zs_http_stream_start(r, 200, "text/event-stream", &j->s);
    TCHECK(rc == 0, "stream_start %d", rc);
    zs_http_on_close(r, on_close_cb, j);
    spawn(sse_main, j);
}

typedef struct {
    int entries;
    long health200, u404, e405, e401, e413, sse200, hang499;
} counts_t;

static void count_cb(void *ud, const char *route, const char *method, int status, long n) {
    counts_t *c = ud;
    c->entries++;
    if (!strcmp(route, "/health") && !strcmp(method, "GET") && status == 200) c->health200 += n;
    if (!strcmp(route, "unmatched") && status == 404) c->u404 += n;
    if (!strcmp(route, "/echo") && !strcmp(method, "DELETE") && status == 405) c->e405 += n;
    if (!strcmp(route, "/echo") && status == 401) c->e401 += n;
    if (!strcmp(route, "/echo") && status == 413) c->e413 += n;
    if (!strcmp(route, "/sse") && status == 200) c->sse200 += n;
    if (!strcmp(route, "/hang") && status == 499) c->hang499 += n;
}

static zs_http *start_server(void) {
    zs_http_opts o = {.port = 0, .threads = 4, .max_body_bytes = 65536, .api_key = "sk-test"};
    zs_http *h = NULL;
    int rc = zs_http_start(&o, &h);
    CHECK(rc == 0, "start: %s", zs_errmsg());
    if (rc) return NULL;
    CHECK(zs_http_route(h, "POST", "/echo", 1, h_echo, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/health", 0, h_health, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/busy", 0, h_busy, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/jobs/{id}/cancel", 0, h_job, NULL) == 0, "route");
    CHECK(zs_http_route(h, "POST", "/jobs/{id}/cancel", 0, h_job, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/delayed", 0, h_delayed, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/hang", 0, h_hang, NULL) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/sse", 0, h_sse, (void *)0) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/sse-wait", 0, h_sse, (void *)1) == 0, "route");
    CHECK(zs_http_route(h, "GET", "/sse-forever", 0, h_sse, (void *)2) == 0, "route");
    CHECK_ERR(zs_http_route(h, "GET", "/a/{x}/{y}", 0, h_job, NULL), "more than one");
    return h;
}

static void wait_threads(void) {
    for (int i = 0; i < 500 && atomic_load(&g_threads) > 0; i++) msleep(10);
    CHECK(atomic_load(&g_threads) == 0, "%d helper threads still running", atomic_load(&g_threads));
}

/* ------------------------------------------------------------------ tests */

static void test_basic(int port) {
    resp_t r;
    request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200 && strcmp(r.body, "ok\n") == 0, "health %d", r.status);
    CHECK(hdr(&r, "Content-Type") && !strcmp(hdr(&r, "Content-Type"), "text/plain"), "ctype");
    resp_free(&r);

    request(port, "POST", "/echo?x=1%202", "Authorization: Bearer sk-test\r\nX-Test: hi\r\n",
            "{\"a\":1}", &r);
    CHECK(r.status == 200, "echo %d", r.status);
    CHECK(hdr(&r, "Content-Type") && !strcmp(hdr(&r, "Content-Type"), "application/json"), "ct");
    json_t *j = body_json(&r);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "body")), "{\"a\":1}"), "echo body");
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "q")), "1 2"), "echo query");
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "hdr")), "hi"), "echo header");
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "path")), "/echo"), "echo path");
    json_decref(j);
    resp_free(&r);

    request(port, "GET", "/busy", NULL, NULL, &r);
    CHECK(r.status == 429, "busy %d", r.status);
    CHECK(hdr(&r, "Retry-After") && !strcmp(hdr(&r, "Retry-After"), "7"), "Retry-After");
    CHECK(!hdr(&r, "Injected"), "header injection");
    j = body_json(&r);
    CHECK(j && !strcmp(err_field(j, "type"), "rate_limit_error") &&
              !strcmp(err_field(j, "code"), "busy") &&
              !strcmp(err_field(j, "message"), "queue full (3 waiting)") &&
              json_is_null(json_object_get(json_object_get(j, "error"), "param")),
          "busy body %s", r.body);
    json_decref(j);
    resp_free(&r);

    request(port, "POST", "/jobs/ftjob-42/cancel", NULL, NULL, &r);
    j = body_json(&r);
    CHECK(r.status == 200 && j && !strcmp(json_string_value(json_object_get(j, "id")), "ftjob-42"),
          "param route %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);
    request(port, "GET", "/jobs//cancel", NULL, NULL, &r);
    CHECK(r.status == 404, "empty param %d", r.status);
    resp_free(&r);

    /* 404 / 405 */
    request(port, "GET", "/nope", NULL, NULL, &r);
    j = body_json(&r);
    CHECK(r.status == 404 && j && !strcmp(err_field(j, "code"), "not_found") &&
              !strcmp(err_field(j, "type"), "invalid_request_error") &&
              !strcmp(err_field(j, "message"), "Unknown route: GET /nope"),
          "404 %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);
    request(port, "DELETE", "/echo", NULL, NULL, &r);
    j = body_json(&r);
    CHECK(r.status == 405 && hdr(&r, "Allow") && !strcmp(hdr(&r, "Allow"), "POST"), "405 %d",
          r.status);
    CHECK(j && !strcmp(err_field(j, "code"), "method_not_allowed"), "405 body %s", r.body);
    json_decref(j);
    resp_free(&r);
    request(port, "DELETE", "/jobs/x/cancel", NULL, NULL, &r);
    CHECK(r.status == 405 && hdr(&r, "Allow") && !strcmp(hdr(&r, "Allow"), "GET, POST"),
          "405 allow %s", hdr(&r, "Allow"));
    resp_free(&r);

    /* auth */
    request(port, "POST", "/echo", NULL, "{}", &r);
    j = body_json(&r);
    CHECK(r.status == 401 && j && !strcmp(err_field(j, "code"), "invalid_api_key") &&
              !strcmp(err_field(j, "type"), "invalid_request_error"),
          "401 missing %d %s", r.status, r.body);
    json_decref(j);
    resp_free(&r);
    request(port, "POST", "/echo", "Authorization: Bearer sk-tesT\r\n", "{}", &r);
    j = body_json(&r);
    CHECK(r.status == 401 && j && strstr(err_field(j, "message"), "Incorrect API key"),
          "401 wrong %d", r.status);
    json_decref(j);
    resp_free(&r);
    request(port, "POST", "/echo", "Authorization: Bearer sk-test-longer\r\n", "{}", &r);
    CHECK(r.status == 401, "401 longer key %d", r.status);
    resp_free(&r);

    /* invalid UTF-8 in the path still gives valid JSON */
    request(port, "GET", "/%ff%fe%00x", NULL, NULL, &r);
    j = body_json(&r);
    CHECK(r.status == 404 && j, "404 bad utf8 %d %s", r.status, r.body ? r.body : "");
    json_decref(j);
    resp_free(&r);

    /* keep-alive: two pipelined requests on one connection */
    const char *two = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /jobs/7/cancel HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    raw_request(port, two, strlen(two), &r);
    CHECK(r.raw && strstr(r.raw, "ok\n") && strstr(r.raw, "{\"id\":\"7\"}"), "pipelined: %s",
          r.raw ? r.raw : "");
    resp_free(&r);
}

static void test_limits(int port) {
    resp_t r;
    /* big Content-Length: 413 without sending the body */
    const char *big = "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                      "Content-Length: 100000000\r\n\r\nabc";
    raw_request(port, big, strlen(big), &r);
    json_t *j = body_json(&r);
    CHECK(r.status == 413 && j && !strcmp(err_field(j, "code"), "request_too_large"), "413 %d",
          r.status);
    json_decref(j);
    resp_free(&r);

    /* chunked body over the limit (64 KiB): 100 KiB in 4 KiB chunks */
    size_t cap = 200000, n = 0;
    char *req = malloc(cap);
    n += (size_t)sprintf(req, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                              "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    for (int i = 0; i < 25; i++) {
        n += (size_t)sprintf(req + n, "1000\r\n");
        memset(req + n, 'a', 4096);
        n += 4096;
        n += (size_t)sprintf(req + n, "\r\n");
    }
    n += (size_t)sprintf(req + n, "0\r\n\r\n");
    raw_request(port, req, n, &r);
    CHECK(r.status == 413, "chunked 413 got %d", r.status);
    resp_free(&r);

    /* chunked body within the limit */
    n = (size_t)sprintf(req, "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                             "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    raw_request(port, req, n, &r);
    j = body_json(&r);
    CHECK(r.status == 200 && j && !strcmp(json_string_value(json_object_get(j, "body")), "abcde"),
          "chunked ok %d", r.status);
    json_decref(j);
    resp_free(&r);

    /* chunked far over the limit: the server may just close; it must survive */
    int fd = connect_to(port);
    const char *h2 = "POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n";
    send_all(fd, h2, strlen(h2));
    char chunk[4096 + 16];
    int cn = sprintf(chunk, "1000\r\n");
    memset(chunk + cn, 'b', 4096);
    memcpy(chunk + cn + 4096, "\r\n", 2);
    for (int i = 0; i < 200; i++)
        if (send_all(fd, chunk, (size_t)cn + 4098) != 0) break;
    close(fd);
    free(req);

    /* malformed requests */
    const char *bad[] = {"GARBAGE\r\n\r\n", "GET\r\n\r\n", "GET / HTTP/9.9\r\n\r\n",
                         "GET /health HTTP/1.1\r\nHost x\r\n\r\n",
                         "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                         "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "zz\r\n\r\n",
                         "\x01\x02\x03\xff\r\n\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        raw_request(port, bad[i], strlen(bad[i]), &r);
        CHECK(r.status == 0 || r.status >= 400, "malformed %zu -> %d", i, r.status);
        resp_free(&r);
    }
    /* huge header */
    char *hh = malloc(200000);
    int hn = sprintf(hh, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(hh + hn, 'h', 150000);
    hn += 150000;
    hn += sprintf(hh + hn, "\r\n\r\n");
    raw_request(port, hh, (size_t)hn, &r);
    CHECK(r.status == 0 || r.status >= 400, "huge header -> %d", r.status);
    resp_free(&r);
    free(hh);
    /* client that connects and leaves */
    fd = connect_to(port);
    send_all(fd, "GET /hea", 8);
    close(fd);

    request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200, "still alive %d", r.status);
    resp_free(&r);
}

static void test_delayed_and_sse(int port) {
    resp_t r;
    double t0 = zs_now();
    request(port, "GET", "/delayed", NULL, NULL, &r);
    double dt = zs_now() - t0;
    CHECK(r.status == 200 && !strcmp(r.body, "{\"delayed\":true}"), "delayed %d", r.status);
    CHECK(dt >= 0.045 && dt < 2.0, "delayed took %.3f s", dt);
    resp_free(&r);

    request(port, "GET", "/sse", NULL, NULL, &r);
    CHECK(r.status == 200, "sse %d", r.status);
    CHECK(hdr(&r, "Content-Type") && !strcmp(hdr(&r, "Content-Type"), "text/event-stream"),
          "sse ctype");
    CHECK(hdr(&r, "X-Stream") && !strcmp(hdr(&r, "X-Stream"), "yes"), "sse extra header");
    CHECK(r.chunked && r.complete, "sse chunked %d complete %d", r.chunked, r.complete);
    int events = 0;
    for (const char *p = r.body; (p = strstr(p, "data: {\"i\":")); p++) events++;
    CHECK(events == 20, "sse events %d", events);
    CHECK(r.body && strstr(r.body, "data: {\"i\":19}\n\ndata: [DONE]\n\n"), "sse order/done");
    resp_free(&r);
    wait_threads();
}

/* Client leaves while the stream is suspended: the watcher notices, on_close fires within
 * 1 s, later writes return ZS_ECANCELLED. */
static void test_disconnect(int port) {
    atomic_store(&g_closed, 0);
    atomic_store(&g_after_close, 1);
    atomic_store(&g_end_rc, 1);
    int fd = connect_to(port);
    const char *q = "GET /sse-wait HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, q, strlen(q));
    char buf[1024];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    CHECK(n > 0, "got first bytes");
    msleep(100); /* the stream is now suspended (no data) */
    /* an idle stream costs no CPU (no busy waiting) */
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    msleep(300);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    CHECK(cpu < 0.05, "idle stream used %.3f s CPU in 0.3 s", cpu);
    double t0 = zs_now();
    close(fd);
    for (int i = 0; i < 100 && !atomic_load(&g_closed); i++) msleep(10);
    CHECK(atomic_load(&g_closed) == 1, "on_close not called");
    CHECK(g_close_time - t0 < 1.0, "on_close after %.3f s", g_close_time - t0);
    wait_threads();
    CHECK(atomic_load(&g_after_close) == ZS_ECANCELLED, "write after close %d",
          atomic_load(&g_after_close));
    CHECK(atomic_load(&g_end_rc) == ZS_ECANCELLED, "end after close %d", atomic_load(&g_end_rc));

    /* client leaves while data is flowing */
    atomic_store(&g_closed, 0);
    fd = connect_to(port);
    q = "GET /sse-forever HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, q, strlen(q));
    n = recv(fd, buf, sizeof buf - 1, 0);
    CHECK(n > 0, "got first bytes");
    msleep(60);
    close(fd);
    for (int i = 0; i < 100 && !atomic_load(&g_closed); i++) msleep(10);
    CHECK(atomic_load(&g_closed) == 1, "on_close (flowing) not called");
    wait_threads();
    CHECK(atomic_load(&g_after_close) == ZS_ECANCELLED, "write after close %d",
          atomic_load(&g_after_close));

    /* client leaves while a delayed response is pending */
    atomic_store(&g_closed, 0);
    atomic_store(&g_after_close, 1);
    fd = connect_to(port);
    q = "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, q, strlen(q));
    msleep(100);
    t0 = zs_now();
    close(fd);
    for (int i = 0; i < 100 && !atomic_load(&g_closed); i++) msleep(10);
    CHECK(atomic_load(&g_closed) == 1, "on_close (delayed) not called");
    CHECK(g_close_time - t0 < 1.0, "on_close (delayed) after %.3f s", g_close_time - t0);
    wait_threads();
    CHECK(atomic_load(&g_after_close) == ZS_ECANCELLED, "respond after close %d",
          atomic_load(&g_after_close));
}

static int g_port;
static atomic_int g_ok;

static void *client_main(void *arg) {
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < 13; i++) {
        resp_t r;
        const char *path = (i + id) % 3 == 0 ? "/delayed" : (i % 3 == 1 ? "/health" : "/sse");
        request(g_port, "GET", path, NULL, NULL, &r);
        if (r.status == 200 && r.complete) atomic_fetch_add(&g_ok, 1);
        resp_free(&r);
    }
    return NULL;
}

static void test_concurrency(int port) {
    g_port = port;
    atomic_store(&g_ok, 0);
    pthread_t t[16];
    for (int i = 0; i < 16; i++) pthread_create(&t[i], NULL, client_main, (void *)(intptr_t)i);
    for (int i = 0; i < 16; i++) pthread_join(t[i], NULL);
    CHECK(atomic_load(&g_ok) == 16 * 13, "concurrent ok %d of %d", atomic_load(&g_ok), 16 * 13);
    wait_threads();
}

static resp_t g_stop_resp, g_hang_resp;
static void *stop_client(void *arg) {
    (void)arg;
    const char *q = "GET /sse-forever HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_request(g_port, q, strlen(q), &g_stop_resp);
    return NULL;
}

/* --allowed-origins and --tls-cert/--tls-key through the layer (the e2e tests take curl to them) */
static void test_cors_tls(void) {
    zs_http *x = NULL;
    zs_http_opts bo = {.port = 0, .allowed_origins = "https://a.example/"};
    CHECK_ERR(zs_http_start(&bo, &x), "'https://a.example/' is not an origin");
    bo.allowed_origins = "*, http://b.example";
    CHECK_ERR(zs_http_start(&bo, &x), "stands alone");
    bo.allowed_origins = "http://b.example,";
    CHECK_ERR(zs_http_start(&bo, &x), "an empty entry");
    zs_http_opts to = {.port = 0, .tls_cert = "tests/tls/server.pem"};
    CHECK_ERR(zs_http_start(&to, &x), "--tls-cert and --tls-key go together");
    to.tls_key = "tests/test-http.c";
    CHECK_ERR(zs_http_start(&to, &x), "--tls-key tests/test-http.c: not a PEM private key");
    to.tls_key = "tests/tls/ca-key.pem";
    CHECK_ERR(zs_http_start(&to, &x), "--tls-key tests/tls/ca-key.pem is not the key of the certificate");
    to.tls_cert = "tests/tls/nope.pem";
    CHECK_ERR(zs_http_start(&to, &x), "--tls-cert tests/tls/nope.pem: no such file");
    CHECK(x == NULL, "out set on failure");

    zs_http_opts co = {.port = 0, .api_key = "sk-test", .allowed_origins = " http://a.example:3000 , https://b.example"};
    int rc = zs_http_start(&co, &x);
    CHECK(rc == 0, "start with origins: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_http_tls(x) == 0, "plain HTTP");
        zs_http_route(x, "POST", "/echo", ZS_ROLE_INFERENCE, h_echo, NULL);
        zs_http_route(x, "GET", "/echo", ZS_ROLE_INFERENCE, h_echo, NULL);
        int port = zs_http_port(x);
        resp_t r;
        request(port, "OPTIONS", "/echo", "Origin: http://a.example:3000\r\nAccess-Control-Request-Method: POST\r\n"
                "Access-Control-Request-Headers: x-a, x-b\r\n", NULL, &r);
        CHECK(r.status == 204, "preflight %d", r.status);
        CHECK(hdr(&r, "Access-Control-Allow-Origin") && !strcmp(hdr(&r, "Access-Control-Allow-Origin"), "http://a.example:3000"),
              "preflight origin");
        CHECK(hdr(&r, "Access-Control-Allow-Methods") && !strcmp(hdr(&r, "Access-Control-Allow-Methods"), "POST, GET"),
              "preflight methods %s", hdr(&r, "Access-Control-Allow-Methods"));
        CHECK(hdr(&r, "Access-Control-Allow-Headers") &&
                  !strcmp(hdr(&r, "Access-Control-Allow-Headers"), "Authorization, Content-Type, x-a, x-b"),
              "preflight headers %s", hdr(&r, "Access-Control-Allow-Headers"));
        resp_free(&r);
        request(port, "OPTIONS", "/echo", "Origin: https://b.example\r\nAccess-Control-Request-Method: POST\r\n"
                "Access-Control-Request-Headers: x-a, (bad)\r\n", NULL, &r);
        CHECK(r.status == 204 && !strcmp(hdr(&r, "Access-Control-Allow-Headers"), "Authorization, Content-Type"),
              "preflight with an odd header list %d", r.status);
        resp_free(&r);
        request(port, "OPTIONS", "/echo", "Origin: http://c.example\r\nAccess-Control-Request-Method: POST\r\n", NULL, &r);
        CHECK(r.status == 403 && !hdr(&r, "Access-Control-Allow-Origin") && strstr(r.body, "origin_not_allowed"),
              "preflight from another origin %d", r.status);
        resp_free(&r);
        request(port, "POST", "/echo", "Origin: https://b.example\r\nAuthorization: Bearer sk-test\r\n", "{}", &r);
        CHECK(r.status == 200 && hdr(&r, "Access-Control-Allow-Origin") && hdr(&r, "Access-Control-Expose-Headers") &&
                  hdr(&r, "Vary"), "allowed origin %d", r.status);
        resp_free(&r);
        request(port, "POST", "/echo", "Origin: https://c.example\r\nAuthorization: Bearer sk-test\r\n", "{}", &r);
        CHECK(r.status == 200 && !hdr(&r, "Access-Control-Allow-Origin"), "another origin %d", r.status);
        resp_free(&r);
        zs_http_stop(x, 0);
        x = NULL;
    }

    zs_http_opts so = {.port = 0, .tls_cert = "tests/tls/server.pem", .tls_key = "tests/tls/server-key.pem"};
    rc = zs_http_start(&so, &x);
    CHECK(rc == 0, "start with TLS: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_http_tls(x) == 1, "HTTPS");
        zs_http_route(x, "GET", "/health", ZS_ROLE_NONE, h_health, NULL);
        resp_t r;
        double t0 = zs_now();
        request(zs_http_port(x), "GET", "/health", NULL, NULL, &r); /* plain HTTP: closed, no answer */
        CHECK(r.status == 0 && zs_now() - t0 < 2, "plain HTTP to HTTPS: status %d after %.2f s", r.status, zs_now() - t0);
        resp_free(&r);
        zs_http_stop(x, 0);
    }
}

int main(void) {
    zs_log_set_level(getenv("ZS_LOG") ? ZS_LOG_DEBUG : ZS_LOG_WARN);
    zs_http *h = start_server();
    if (!h) return tu_finish("test-http");
    int port = zs_http_port(h);
    CHECK(port > 0, "port %d", port);

    /* start errors */
    zs_http *h2 = NULL;
    zs_http_opts o2 = {.port = port};
    CHECK_ERR(zs_http_start(&o2, &h2), "cannot listen on 127.0.0.1:", "Address already in use");
    CHECK(h2 == NULL, "out set on failure");
    zs_http_opts o3 = {.host = "not-an-ip"};
    CHECK_ERR(zs_http_start(&o3, &h2), "invalid listen address");

    test_basic(port);
    test_limits(port);
    test_delayed_and_sse(port);
    test_disconnect(port);
    test_concurrency(port);
    test_cors_tls();

    for (int i = 0; i < 100 && zs_http_inflight(h) > 0; i++) msleep(10);
    CHECK(zs_http_inflight(h) == 0, "inflight %zu", zs_http_inflight(h));

    counts_t c = {0};
    zs_http_counts(h, count_cb, &c);
    CHECK(c.entries > 5, "count entries %d", c.entries);
    CHECK(c.health200 >= 3 + 16, "health 200 count %ld", c.health200);
    CHECK(c.u404 >= 2, "404 count %ld", c.u404);
    CHECK(c.e405 == 1, "405 count %ld", c.e405);
    CHECK(c.e401 >= 3, "401 count %ld", c.e401);
    CHECK(c.e413 == 2, "413 count %ld", c.e413);
    CHECK(c.sse200 >= 1, "sse count %ld", c.sse200);
    CHECK(c.hang499 == 1, "hang 499 count %ld", c.hang499);

    /* stop with an open stream and a pending delayed request: both end within the bound */
    atomic_store(&g_closed, 0);
    atomic_store(&g_after_close, 1);
    pthread_t sc;
    pthread_create(&sc, NULL, stop_client, NULL);
    msleep(150);
    int fd = connect_to(port);
    const char *q = "GET /hang HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(fd, q, strlen(q));
    msleep(100);
    CHECK(zs_http_inflight(h) == 2, "inflight before stop %zu", zs_http_inflight(h));
    double t0 = zs_now();
    zs_http_stop(h, 1.0);
    double dt = zs_now() - t0;
    CHECK(dt >= 0.7 && dt < 1.3, "stop took %.3f s", dt);
    read_all(fd, &g_hang_resp);
    close(fd);
    parse(&g_hang_resp);
    CHECK(g_hang_resp.status == 503, "pending request at stop got %d", g_hang_resp.status);
    pthread_join(sc, NULL);
    parse(&g_stop_resp);
    CHECK(g_stop_resp.status == 200 && g_stop_resp.chunked && g_stop_resp.complete,
          "stream at stop: %d chunked %d complete %d", g_stop_resp.status, g_stop_resp.chunked,
          g_stop_resp.complete);
    CHECK(g_stop_resp.body && strstr(g_stop_resp.body, "data: 3\n\n"), "stream data at stop");
    CHECK(atomic_load(&g_closed) == 2, "on_close at stop %d", atomic_load(&g_closed));
    wait_threads(); /* the producers see ZS_ECANCELLED after the stop and release their handles */
    CHECK(atomic_load(&g_end_rc) == ZS_ECANCELLED, "end after stop %d", atomic_load(&g_end_rc));
    resp_free(&g_stop_resp);
    resp_free(&g_hang_resp);
    zs_http_stop(NULL, 0);

    /* quick start/stop with nothing in flight returns at once */
    zs_http_opts o4 = {.port = 0, .host = "::"};
    zs_http *h4 = NULL;
    int rc = zs_http_start(&o4, &h4);
    CHECK(rc == 0, "start on :: (%s)", zs_errmsg());
    if (rc == 0) {
        resp_t r;
        request(zs_http_port(h4), "GET", "/x", NULL, NULL, &r);
        CHECK(r.status == 404, "v4 via dual stack %d", r.status);
        resp_free(&r);
        t0 = zs_now();
        zs_http_stop(h4, 5.0);
        CHECK(zs_now() - t0 < 0.5, "idle stop took %.3f", zs_now() - t0);
    }
    return tu_finish("test-http");
}

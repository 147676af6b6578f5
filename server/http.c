/* http.c — the HTTP layer on libmicrohttpd (MHD 0.9.75): daemon start/stop, routing, limits,
 * auth, OpenAI-shaped errors, counters, delayed responses and streams.
 *
 * Suspend/resume design (no thread per waiting request or idle stream, no busy loop):
 * - A delayed response: the handler returns without responding; the access callback then
 *   suspends the connection (MHD_suspend_connection from the access handler). respond() from
 *   any thread builds the response, queues it (allowed on a suspended connection) and resumes.
 * - A stream: the response is MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, ...). The
 *   content reader copies buffered data; when the buffer is empty it suspends the connection
 *   from inside the reader and returns 0 (the MHD-documented pattern: 0 only together with a
 *   suspend). stream_write appends and resumes; stream_end sets a flag and resumes, the reader
 *   then returns END_OF_STREAM.
 * - One mutex (h->mu) guards all request state; r->suspended records whether we suspended the
 *   connection, so suspend and resume always alternate (MHD forbids resuming a connection that
 *   is not suspended). Lock order: MHD response mutex -> h->mu -> MHD internal mutexes; no
 *   response is destroyed while h->mu is held.
 * - MHD does not watch a suspended socket, so a small watcher thread keeps the sockets of
 *   suspended connections in its own epoll set (EPOLLRDHUP). When a client goes away it marks
 *   the request gone and resumes it; MHD then calls the reader (-> END_WITH_ERROR) or the access
 *   handler (-> MHD_NO), closes the connection and reports completion, which fires on_close.
 * - Lifetimes: a request is reference-counted by the MHD side (until NOTIFY_COMPLETED), the
 *   application (from the handler call until respond / stream_end) and a stream response
 *   (until MHD frees it). The server object is reference-counted by zs_http_stop's caller and
 *   every live request, so late calls from the engine after a stop touch no freed memory. */
#define _GNU_SOURCE
#include "http.h"

#include "audit.h"
#include "common.h"
#include "quota.h"
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define STREAM_MAX_PENDING ((size_t)64 << 20)
#define UNMATCHED_ROUTE "unmatched"
/* CORS: the headers a page may read besides the safelisted ones, and how long a browser may keep
 * a preflight's answer (Chromium caps it at 7200 s) */
#define CORS_EXPOSE "Retry-After, X-Engine-Time-Ms, WWW-Authenticate, Allow"
#define CORS_MAX_AGE "600"
#define CORS_ALLOW_HEADERS "Authorization, Content-Type"

typedef struct {
    char *method, *pattern;
    char **segs; /* pattern split at '/', without the leading one */
    int nsegs, param_seg; /* param_seg: index of the {param} segment or -1 */
    zs_role role; /* the least role that may call it (ZS_ROLE_NONE: anyone, no key) */
    zs_http_handler fn;
    void *ud;
} route;

typedef struct {
    int route, method, status;
    long n;
} count_ent;

typedef struct {
    char *k, *v;
} kv;

typedef struct {
    kv *a;
    int n, cap;
} kvlist;

static const char *const k_methods[] = {"GET",   "POST",    "PUT",  "DELETE", "PATCH",
                                        "HEAD",  "OPTIONS", "OTHER"};
#define N_METHODS ((int)(sizeof k_methods / sizeof k_methods[0]))

enum {
    R_RECEIVING,  /* receiving the body */
    R_IN_HANDLER, /* the route handler is running */
    R_WAITING,    /* handler returned without a response; connection suspended */
    R_QUEUED,     /* a response (or stream) was queued / handed to MHD */
    R_EARLY,      /* answered by this layer (404, 401, 413, ...) */
};

struct zs_http_stream {
    zs_http_req *r;
};

struct zs_http_req {
    zs_http *h;
    struct MHD_Connection *conn; /* NULL once MHD completed the request */
    uint64_t serial;
    int refs;
    zs_http_req *prev, *next;
    int state, route_idx, method_idx, fd;
    char *method, *path, *param;
    kvlist hdrs, query, extra;
    zs_key_id who;               /* the caller, when keys are configured and the route needs one */
    int authed, limited;         /* limited: holds one of the tenant's streams (zs_quota_done) */
    int status;                  /* the status counted (the audit log's) */
    char code[48];               /* the error code answered, if any (the audit log's result) */
    char *object;                /* the id the action made (zs_http_req_set_object) */
    char remote[64];             /* the client's address */
    char *body;
    size_t blen, bcap, discarded;
    int too_large;
    struct MHD_Response *pending, *hold;
    int pending_status;
    int counted, app_ref, app_failed, mhd_done, gone, suspended, watched;
    /* stream */
    int streaming, ended;
    char *sbuf;
    size_t soff, slen, scap;
    zs_http_stream stream;
    /* on_close */
    void (*on_close)(void *);
    void *on_close_ud;
    int close_fired, in_close_cb;
    pthread_t close_thr;
};

struct zs_http {
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *host;
    zs_keys *keys;               /* NULL: no auth; replaced under mu (zs_http_reload_keys) */
    zs_quota *limits;            /* the tenants' limits (keys.h), with keys */
    zs_audit *audit;             /* admin and fine-tuning actions (audit.h), or NULL */
    char *key_file;
    size_t max_body;
    int port;
    route *routes;
    int nroutes, caproutes;
    count_ent *counts;
    int ncounts, capcounts;
    zs_http_req *reqs;
    size_t inflight, mhd_live, resuming;
    int refs, starting, stopping, forced;
    uint64_t next_serial;
    int epfd, evfd, watcher_started;
    pthread_t watcher;
    char start_err[256];
    zs_tls_pem tls;              /* HTTPS when tls.cert is set */
    char *tls_cert_path, *tls_key_path;
    char **origins;              /* CORS: the allowed origins (norigins), or any_origin for "*" */
    int norigins, any_origin;
};

/* ------------------------------------------------------------------ small helpers */

static void L(zs_http *h) { pthread_mutex_lock(&h->mu); }
static void U(zs_http *h) { pthread_mutex_unlock(&h->mu); }

static int method_index(const char *m) {
    for (int i = 0; i < N_METHODS - 1; i++)
        if (strcmp(m, k_methods[i]) == 0) return i;
    return N_METHODS - 1;
}

static int kv_add(kvlist *l, const char *k, const char *v) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 16;
        kv *na = realloc(l->a, (size_t)nc * sizeof *na);
        if (!na) return ZS_ENOMEM;
        l->a = na;
        l->cap = nc;
    }
    char *kk = strdup(k), *vv = strdup(v ? v : "");
    if (!kk || !vv) {
        free(kk);
        free(vv);
        return ZS_ENOMEM;
    }
    l->a[l->n].k = kk;
    l->a[l->n].v = vv;
    l->n++;
    return 0;
}

static void kv_free(kvlist *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->a[i].k);
        free(l->a[i].v);
    }
    free(l->a);
    memset(l, 0, sizeof *l);
}

static const char *kv_get(const kvlist *l, const char *k, int nocase) {
    for (int i = 0; i < l->n; i++)
        if (nocase ? strcasecmp(l->a[i].k, k) == 0 : strcmp(l->a[i].k, k) == 0) return l->a[i].v;
    return NULL;
}

static int has_crlf(const char *s) { return strpbrk(s, "\r\n") != NULL; }

/* Counts a request once (h->mu held). */
static void count_locked(zs_http *h, zs_http_req *r, int status) {
    if (r->counted) return;
    r->counted = 1;
    r->status = status;
    for (int i = 0; i < h->ncounts; i++) {
        count_ent *c = &h->counts[i];
        if (c->route == r->route_idx && c->method == r->method_idx && c->status == status) {
            c->n++;
            return;
        }
    }
    if (h->ncounts == h->capcounts) {
        int nc = h->capcounts ? h->capcounts * 2 : 32;
        count_ent *na = realloc(h->counts, (size_t)nc * sizeof *na);
        if (!na) return; /* counters are best effort */
        h->counts = na;
        h->capcounts = nc;
    }
    h->counts[h->ncounts++] = (count_ent){r->route_idx, r->method_idx, status, 1};
}

/* Error body {"error":{...}}; malloc'd string or NULL. The message is made valid UTF-8. */
static char *error_body(const char *type, const char *param, const char *code, const char *msg) {
    json_t *m = json_string(msg);
    if (!m) { /* invalid UTF-8 from a client: keep printable ASCII only */
        char *s = strdup(msg);
        if (!s) return NULL;
        for (char *p = s; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
        m = json_string(s);
        free(s);
        if (!m) return NULL;
    }
    json_t *j = json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", m, "type",
                          type ? type : "server_error", "param",
                          param ? json_string(param) : json_null(), "code",
                          code ? json_string(code) : json_null());
    if (!j) return NULL;
    char *out = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return out;
}

/* Builds a buffer response with Content-Type and the request's extra headers (h->mu held). */
static struct MHD_Response *build_response(zs_http_req *r, const char *ctype, const char *body,
                                           size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!resp) return NULL;
    int ok = 1;
    if (ctype) ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype) == MHD_YES;
    for (int i = 0; i < r->extra.n; i++)
        ok &= MHD_add_response_header(resp, r->extra.a[i].k, r->extra.a[i].v) == MHD_YES;
    if (!ok) {
        MHD_destroy_response(resp);
        return NULL;
    }
    return resp;
}

/* ------------------------------------------------------------------ suspend / resume / watch */

static void watch_add_locked(zs_http *h, zs_http_req *r) {
    if (h->epfd < 0 || r->fd < 0 || r->watched) return;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = r->serial};
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, r->fd, &ev) == 0) r->watched = 1;
}

static void watch_del_locked(zs_http *h, zs_http_req *r) {
    if (!r->watched) return;
    epoll_ctl(h->epfd, EPOLL_CTL_DEL, r->fd, NULL);
    r->watched = 0;
}

/* Only from MHD callbacks (access handler or content reader) of this connection. */
static void suspend_locked(zs_http_req *r) {
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    watch_add_locked(r->h, r);
}

static void resume_locked(zs_http_req *r) {
    if (!r->suspended || !r->conn) return;
    watch_del_locked(r->h, r);
    r->suspended = 0;
    MHD_resume_connection(r->conn);
}

/* For queuing a response to a suspended connection outside h->mu: takes over the resume (so
 * nobody else resumes it) and tells zs_http_stop to wait for finish_resume. */
static struct MHD_Connection *claim_resume_locked(zs_http_req *r) {
    watch_del_locked(r->h, r);
    r->suspended = 0;
    r->h->resuming++;
    return r->conn;
}

/* The connection is still suspended here, so MHD does not touch it until the resume. The
 * caller still holds a reference to r. status > 0: count it. */
static void finish_resume(zs_http_req *r, struct MHD_Connection *conn, int status) {
    zs_http *h = r->h;
    L(h);
    if (status > 0) count_locked(h, r, status);
    U(h);
    MHD_resume_connection(conn);
    L(h);
    h->resuming--;
    pthread_cond_broadcast(&h->cv);
    U(h);
}

static void *watcher_main(void *arg) {
    zs_http *h = arg;
    struct epoll_event ev[32];
    for (;;) {
        int n = epoll_wait(h->epfd, ev, 32, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            zs_log_error("http: epoll_wait: %s", strerror(errno));
            return NULL;
        }
        int quit = 0;
        L(h);
        for (int i = 0; i < n; i++) {
            uint64_t serial = ev[i].data.u64;
            if (serial == 0) {
                quit = 1;
                continue;
            }
            for (zs_http_req *r = h->reqs; r; r = r->next) {
                if (r->serial != serial) continue;
                if (r->suspended && r->watched && !r->mhd_done) {
                    zs_log_debug("http: client of %s %s went away while waiting", r->method,
                                 r->path);
                    r->gone = 1;
                    resume_locked(r);
                }
                break;
            }
        }
        U(h);
        if (quit) return NULL;
    }
}

/* ------------------------------------------------------------------ object lifetimes */

static void http_free(zs_http *h) {
    for (int i = 0; i < h->nroutes; i++) {
        route *rt = &h->routes[i];
        for (int k = 0; k < rt->nsegs; k++) free(rt->segs[k]);
        free(rt->segs);
        free(rt->method);
        free(rt->pattern);
    }
    free(h->routes);
    free(h->counts);
    free(h->host);
    free(h->key_file);
    zs_tls_free(&h->tls);
    free(h->tls_cert_path);
    free(h->tls_key_path);
    for (int i = 0; i < h->norigins; i++) free(h->origins[i]);
    free(h->origins);
    if (h->keys) {
        zs_keys_free(h->keys);
    }
    zs_quota_free(h->limits);
    zs_audit_close(h->audit);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Admin and fine-tuning actions, and requests refused such a route (401, 403), go to the audit
 * log; reads (GET, HEAD) that were let in do not. */
static void audit_req(zs_http *h, zs_http_req *r) {
    zs_role need = h->routes[r->route_idx].role;
    int read = r->method_idx == method_index("GET") || r->method_idx == method_index("HEAD") ||
               r->method_idx == method_index("OPTIONS"); /* a CORS preflight acts on nothing */
    if (need < ZS_ROLE_FINETUNE || (read && r->status != 401 && r->status != 403)) return;
    zs_audit_rec rec = {r->authed ? r->who.tenant : NULL, r->authed ? zs_role_name(r->who.role) : NULL,
                        r->remote[0] ? r->remote : NULL, r->method, r->path, r->status,
                        r->code[0] ? r->code : NULL, r->object};
    zs_audit_write(h->audit, &rec);
}

/* The request's stream of its tenant is free again: before its client can have the whole answer
 * (and send the next request), so a client that waits for each answer never meets its own. */
static void limits_done(zs_http_req *r) {
    L(r->h);
    int was = r->limited;
    r->limited = 0;
    U(r->h);
    if (was) zs_quota_done(r->h->limits, r->who.tenant);
}

static void req_release(zs_http_req *r) {
    zs_http *h = r->h;
    L(h);
    if (--r->refs > 0) {
        U(h);
        return;
    }
    if (r->prev) r->prev->next = r->next;
    else h->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    h->inflight--;
    int last = --h->refs == 0;
    pthread_cond_broadcast(&h->cv);
    U(h);
    limits_done(r);
    if (h->audit && r->route_idx >= 0) audit_req(h, r);
    if (r->pending) MHD_destroy_response(r->pending);
    if (r->hold) MHD_destroy_response(r->hold);
    free(r->method);
    free(r->path);
    free(r->param);
    kv_free(&r->hdrs);
    kv_free(&r->query);
    kv_free(&r->extra);
    free(r->body);
    free(r->sbuf);
    free(r->object);
    free(r);
    if (last) http_free(h);
}

/* Marks the application side finished (h->mu held): waits for a running on_close callback on
 * another thread, so none runs after respond / stream_end returns. */
static void app_finish_locked(zs_http_req *r) {
    r->app_ref = 0;
    while (r->in_close_cb && !pthread_equal(r->close_thr, pthread_self()))
        pthread_cond_wait(&r->h->cv, &r->h->mu);
}

static enum MHD_Result collect_kv(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value) {
    (void)kind;
    return kv_add(cls, key ? key : "", value) == 0 ? MHD_YES : MHD_NO;
}

static zs_http_req *req_new(zs_http *h, struct MHD_Connection *c, const char *url,
                            const char *method) {
    zs_http_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->h = h;
    r->conn = c;
    r->refs = 1; /* MHD side */
    r->route_idx = -1;
    r->method_idx = method_index(method);
    r->stream.r = r;
    r->fd = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) r->fd = ci->connect_fd;
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, r->remote, sizeof r->remote);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, r->remote, sizeof r->remote);
    }
    r->method = strdup(method);
    r->path = strdup(url);
    if (!r->method || !r->path ||
        MHD_get_connection_values(c, MHD_HEADER_KIND, collect_kv, &r->hdrs) < 0 ||
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_kv, &r->query) < 0)
        goto fail;
    /* the iterators stop early on allocation failure: detect it by recounting */
    if (MHD_get_connection_values(c, MHD_HEADER_KIND, NULL, NULL) != r->hdrs.n ||
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, NULL, NULL) != r->query.n)
        goto fail;
    L(h);
    r->serial = ++h->next_serial;
    r->next = h->reqs;
    if (h->reqs) h->reqs->prev = r;
    h->reqs = r;
    h->inflight++;
    h->mhd_live++;
    h->refs++;
    U(h);
    return r;
fail:
    free(r->method);
    free(r->path);
    kv_free(&r->hdrs);
    kv_free(&r->query);
    free(r);
    return NULL;
}

/* ------------------------------------------------------------------ routing */

static int route_match(const route *rt, const char *path, const char **pstart, size_t *plen) {
    const char *p = path;
    for (int i = 0; i < rt->nsegs; i++) {
        if (*p != '/') return 0;
        p++;
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (i == rt->param_seg) {
            if (n == 0) return 0;
            *pstart = p;
            *plen = n;
        } else if (n != strlen(rt->segs[i]) || memcmp(p, rt->segs[i], n) != 0) {
            return 0;
        }
        p += n;
    }
    return *p == '\0';
}

void zs_http_routes(const zs_http *h, zs_http_route_fn fn, void *ud) {
    for (int i = 0; h && fn && i < h->nroutes; i++) fn(ud, h->routes[i].method, h->routes[i].pattern, h->routes[i].role);
}

int zs_http_route(zs_http *h, const char *method, const char *pattern, zs_role role,
                  zs_http_handler fn, void *ud) {
    if (!h || !method || !*method || !pattern || pattern[0] != '/' || !fn)
        return zs_err(ZS_EINVAL, "http route: bad arguments");
    if (h->nroutes == h->caproutes) {
        int nc = h->caproutes ? h->caproutes * 2 : 16;
        route *na = realloc(h->routes, (size_t)nc * sizeof *na);
        if (!na) return zs_err(ZS_ENOMEM, "http route: out of memory");
        h->routes = na;
        h->caproutes = nc;
    }
    route rt = {0};
    int rc;
    rt.param_seg = -1;
    rt.role = role;
    rt.fn = fn;
    rt.ud = ud;
    rt.method = strdup(method);
    rt.pattern = strdup(pattern);
    if (!rt.method || !rt.pattern) goto nomem;
    const char *p = pattern + 1;
    for (;;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        char **ns = realloc(rt.segs, (size_t)(rt.nsegs + 1) * sizeof *ns);
        if (!ns) goto nomem;
        rt.segs = ns;
        if (!(rt.segs[rt.nsegs] = strndup(p, n))) goto nomem;
        rt.nsegs++;
        if (n >= 2 && p[0] == '{' && p[n - 1] == '}') {
            if (rt.param_seg >= 0) {
                rc = zs_err(ZS_EINVAL, "http route %s: more than one {param}", pattern);
                goto fail;
            }
            rt.param_seg = rt.nsegs - 1;
        }
        if (!q) break;
        p = q + 1;
    }
    h->routes[h->nroutes++] = rt;
    return 0;
nomem:
    rc = zs_err(ZS_ENOMEM, "http route: out of memory");
fail:
    for (int k = 0; k < rt.nsegs; k++) free(rt.segs[k]);
    free(rt.segs);
    free(rt.method);
    free(rt.pattern);
    return rc;
}

/* ------------------------------------------------------------------ MHD callbacks */

/* Answers from this layer (in the access handler; no application involved). */
static enum MHD_Result early_error(zs_http_req *r, int status, const char *type, const char *code,
                                   const char *hname, const char *hval, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static enum MHD_Result early_error(zs_http_req *r, int status, const char *type, const char *code,
                                   const char *hname, const char *hval, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *body = error_body(type, NULL, code, msg);
    if (!body) return MHD_NO;
    snprintf(r->code, sizeof r->code, "%s", code ? code : "");
    zs_http *h = r->h;
    L(h);
    struct MHD_Response *resp = build_response(r, "application/json", body, strlen(body));
    r->state = R_EARLY;
    U(h);
    free(body);
    if (resp && hname) MHD_add_response_header(resp, hname, hval);
    /* in the access handler of this connection: nothing else touches it now */
    enum MHD_Result ok = resp ? MHD_queue_response(r->conn, (unsigned)status, resp) : MHD_NO;
    L(h);
    if (ok == MHD_YES) count_locked(h, r, status);
    U(h);
    if (resp) MHD_destroy_response(resp);
    return ok;
}

/* ------------------------------------------------------------------ CORS */

static int cors_on(const zs_http *h) { return h->any_origin || h->norigins > 0; }

/* allowed_origins into h: "*" alone, or comma-separated scheme://host[:port] (blanks around the
 * commas allowed). "" or NULL: none. */
static int origins_parse(zs_http *h, const char *list) {
    if (!list) return 0;
    const char *p = list;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (n == 0)
            return zs_err(ZS_EINVAL, "--allowed-origins '%.300s': an empty entry (want '*' or origins like "
                          "https://app.example.com, separated by commas)", list);
        if (n == 1 && *p == '*') {
            h->any_origin = 1;
        } else {
            size_t sch = !strncasecmp(p, "http://", 7) ? 7 : !strncasecmp(p, "https://", 8) ? 8 : 0;
            int bad = sch == 0 || n == sch || n > 255;
            for (size_t i = sch; !bad && i < n; i++) {
                unsigned char c = (unsigned char)p[i];
                bad = c <= ' ' || c >= 0x7f || strchr("/?#@\\*,", c) != NULL;
            }
            if (bad)
                return zs_err(ZS_EINVAL, "--allowed-origins: '%.*s' is not an origin (want scheme://host[:port] with "
                              "scheme http or https and no path, e.g. https://app.example.com or http://localhost:3000; "
                              "or '*' alone for any)", (int)ZS_MIN(n, 300), p);
            char **no = realloc(h->origins, (size_t)(h->norigins + 1) * sizeof *no);
            if (!no) return zs_err(ZS_ENOMEM, "http: out of memory");
            h->origins = no;
            if (!(h->origins[h->norigins] = strndup(p, n))) return zs_err(ZS_ENOMEM, "http: out of memory");
            h->norigins++;
        }
        if (!e) break;
        p = e + 1;
    }
    if (h->any_origin && h->norigins)
        return zs_err(ZS_EINVAL, "--allowed-origins '%.300s': '*' (any origin) stands alone, not beside other origins",
                      list);
    return 0;
}

/* The Access-Control-Allow-Origin value for r: "*", the request's own Origin when it is one of
 * the allowed, or NULL (no Origin, or not allowed, or no CORS). */
static const char *cors_match(const zs_http *h, const zs_http_req *r) {
    if (!cors_on(h)) return NULL;
    const char *o = kv_get(&r->hdrs, "Origin", 1);
    if (!o || !*o) return NULL;
    if (h->any_origin) return "*";
    for (int i = 0; i < h->norigins; i++)
        if (!strcasecmp(o, h->origins[i])) return o;
    return NULL;
}

/* The CORS headers every response to r carries (in r->extra); MHD_NO when out of memory. */
static enum MHD_Result cors_headers(zs_http *h, zs_http_req *r, const char *allow_origin) {
    int rc = 0;
    L(h);
    if (cors_on(h) && !h->any_origin) rc |= kv_add(&r->extra, "Vary", "Origin");
    if (allow_origin) {
        rc |= kv_add(&r->extra, "Access-Control-Allow-Origin", allow_origin);
        rc |= kv_add(&r->extra, "Access-Control-Expose-Headers", CORS_EXPOSE);
    }
    U(h);
    return rc ? MHD_NO : MHD_YES;
}

/* Access-Control-Request-Headers when it is a plain list of header names (echoed), else NULL */
static const char *cors_req_headers(const zs_http_req *r) {
    const char *v = kv_get(&r->hdrs, "Access-Control-Request-Headers", 1);
    if (!v || !*v || strlen(v) > 1024) return NULL;
    for (const char *p = v; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (!(c == ',' || c == ' ' || (c > ' ' && c < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", c)))) return NULL;
    }
    return v;
}

/* A preflight (OPTIONS with Origin and Access-Control-Request-Method) on a known path: 204 with
 * the route's methods when the origin is allowed (no key needed), else 403 without CORS headers. */
static enum MHD_Result preflight(zs_http *h, zs_http_req *r, const char *allow_origin, const char *methods) {
    if (!allow_origin)
        return early_error(r, 403, "permission_error", "origin_not_allowed", NULL, NULL,
                           "Origin %.200s is not allowed to call this server (--allowed-origins)",
                           kv_get(&r->hdrs, "Origin", 1));
    const char *rh = cors_req_headers(r);
    char hdrs[1100];
    snprintf(hdrs, sizeof hdrs, "%s%s%s", CORS_ALLOW_HEADERS, rh ? ", " : "", rh ? rh : "");
    L(h);
    struct MHD_Response *resp = build_response(r, NULL, "", 0);
    r->state = R_EARLY;
    U(h);
    if (!resp) return MHD_NO;
    int ok = MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods) == MHD_YES &&
             MHD_add_response_header(resp, "Access-Control-Allow-Headers", hdrs) == MHD_YES &&
             MHD_add_response_header(resp, "Access-Control-Max-Age", CORS_MAX_AGE) == MHD_YES;
    enum MHD_Result q = ok ? MHD_queue_response(r->conn, 204, resp) : MHD_NO;
    L(h);
    if (q == MHD_YES) count_locked(h, r, 204);
    U(h);
    MHD_destroy_response(resp);
    return q;
}

/* 1 when the request's key is one of the keys (its caller in r->who); missing: no header at all */
static int auth_ok(zs_http *h, zs_http_req *r, int *missing) {
    *missing = 0;
    L(h);
    int on = h->keys != NULL;
    U(h);
    if (!on) return 1;
    const char *a = kv_get(&r->hdrs, "Authorization", 1);
    if (!a || !*a) {
        *missing = 1;
        return 0;
    }
    if (strncasecmp(a, "Bearer ", 7) != 0) return 0;
    a += 7;
    while (*a == ' ') a++;
    L(h);
    int ok = zs_keys_check(h->keys, a, strlen(a), &r->who);
    U(h);
    r->authed = ok;
    return ok;
}

/* First call: route, auth and Content-Length checks. */
static enum MHD_Result req_begin(zs_http *h, zs_http_req *r) {
    const char *allow_origin = cors_match(h, r);
    if (cors_headers(h, r, allow_origin) != MHD_YES) return MHD_NO;
    L(h);
    int stopping = h->stopping;
    U(h);
    if (stopping)
        return early_error(r, 503, "server_error", "server_shutting_down", "Connection", "close",
                           "The server is shutting down");
    const char *ps = NULL;
    size_t pl = 0;
    int path_known = 0;
    char allow[128] = "";
    for (int i = 0; i < h->nroutes; i++) {
        const char *s = NULL;
        size_t n = 0;
        if (!route_match(&h->routes[i], r->path, &s, &n)) continue;
        path_known = 1;
        if (strcmp(h->routes[i].method, r->method) == 0) {
            r->route_idx = i;
            ps = s;
            pl = n;
            break;
        }
        if (!strstr(allow, h->routes[i].method) &&
            strlen(allow) + strlen(h->routes[i].method) + 3 < sizeof allow) {
            if (*allow) strcat(allow, ", ");
            strcat(allow, h->routes[i].method);
        }
    }
    if (r->route_idx < 0) {
        if (path_known) {
            /* count under the route so /metrics shows which route got wrong methods */
            for (int i = 0; i < h->nroutes; i++)
                if (route_match(&h->routes[i], r->path, &ps, &pl)) {
                    r->route_idx = i;
                    break;
                }
            if (cors_on(h) && !strcmp(r->method, "OPTIONS") && kv_get(&r->hdrs, "Origin", 1) &&
                kv_get(&r->hdrs, "Access-Control-Request-Method", 1))
                return preflight(h, r, allow_origin, allow);
            return early_error(r, 405, "invalid_request_error", "method_not_allowed", "Allow", allow,
                               "Method %.16s not allowed for %.200s (allowed: %s)", r->method,
                               r->path, allow);
        }
        return early_error(r, 404, "invalid_request_error", "not_found", NULL, NULL,
                           "Unknown route: %.16s %.200s", r->method, r->path);
    }
    if (ps && !(r->param = strndup(ps, pl))) return MHD_NO;
    const route *rt = &h->routes[r->route_idx];
    int missing;
    if (rt->role != ZS_ROLE_NONE && !auth_ok(h, r, &missing)) {
        if (missing)
            return early_error(r, 401, "invalid_request_error", "invalid_api_key",
                               "WWW-Authenticate", "Bearer",
                               "You didn't provide an API key. You need to provide your API key "
                               "in an Authorization header using Bearer auth (i.e. "
                               "Authorization: Bearer YOUR_KEY).");
        return early_error(r, 401, "invalid_request_error", "invalid_api_key", "WWW-Authenticate",
                           "Bearer", "Incorrect API key provided.");
    }
    if (r->authed && r->who.role < rt->role)
        return early_error(r, 403, "permission_error", "insufficient_role", NULL, NULL,
                           "This key's role (%s) may not call %.16s %.200s: it needs %s", zs_role_name(r->who.role),
                           r->method, r->path, zs_role_name(rt->role));
    if (r->authed) {
        zs_quota_refusal why;
        int ok = zs_quota_admit(h->limits, r->who.tenant, &r->who.limits, zs_now(), &why);
        if (ok < 0) return MHD_NO;
        if (!ok) {
            char ra[24], code[32];
            snprintf(ra, sizeof ra, "%ld", why.retry_s);
            snprintf(code, sizeof code, "%s_limit", why.limit);
            return early_error(r, 429, "rate_limit_error", code, "Retry-After", ra,
                               "Tenant '%s' is at its %s limit (%s=%ld in the key file); retry in %ld s", r->who.tenant,
                               why.what, why.limit, why.value, why.retry_s);
        }
        r->limited = 1;
    }
    const char *cl = kv_get(&r->hdrs, "Content-Length", 1);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && end != cl && n > h->max_body)
            return early_error(r, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                               "Request body of %llu bytes exceeds the limit of %zu bytes", n,
                               h->max_body);
    }
    r->state = R_RECEIVING;
    return MHD_YES;
}

static enum MHD_Result body_append(zs_http *h, zs_http_req *r, const char *data, size_t n) {
    if (r->too_large || r->blen + n > h->max_body) {
        r->too_large = 1;
        r->discarded += n;
        /* chunked bodies: discard up to another limit's worth so the client gets its 413,
         * then give up on the connection */
        return r->discarded > h->max_body ? MHD_NO : MHD_YES;
    }
    if (r->blen + n + 1 > r->bcap) {
        size_t nc = r->bcap ? r->bcap : 4096;
        while (nc < r->blen + n + 1) nc *= 2;
        if (nc > h->max_body + 1) nc = h->max_body + 1;
        char *nb = realloc(r->body, nc);
        if (!nb) return MHD_NO;
        r->body = nb;
        r->bcap = nc;
    }
    memcpy(r->body + r->blen, data, n);
    r->blen += n;
    r->body[r->blen] = '\0';
    return MHD_YES;
}

static enum MHD_Result run_handler(zs_http *h, zs_http_req *r) {
    const route *rt = &h->routes[r->route_idx];
    L(h);
    r->state = R_IN_HANDLER;
    r->app_ref = 1;
    r->refs++;
    U(h);
    rt->fn(rt->ud, r);
    /* Responses are queued outside h->mu (MHD_queue_response takes the response's mutex, which
     * MHD holds around the stream reader, which takes h->mu). We are in this connection's
     * access handler, so MHD does nothing else with it meanwhile. */
    L(h);
    enum MHD_Result ok = MHD_YES;
    struct MHD_Response *resp = NULL;
    int status = 0;
    if (r->pending) {
        resp = r->pending;
        status = r->pending_status;
        r->pending = NULL;
        r->state = R_QUEUED;
    } else if (r->app_failed) {
        r->state = R_QUEUED;
        ok = MHD_NO;
    } else if (h->forced) { /* stop() is past its drain time: do not wait */
        r->state = R_QUEUED;
        const char *b = "{\"error\":{\"message\":\"The server is shutting down\",\"type\":"
                        "\"server_error\",\"param\":null,\"code\":\"server_shutting_down\"}}";
        resp = build_response(r, "application/json", b, strlen(b));
        status = 503;
        if (!resp) ok = MHD_NO;
    } else {
        r->state = R_WAITING;
        suspend_locked(r);
    }
    U(h);
    if (resp) {
        ok = MHD_queue_response(r->conn, (unsigned)status, resp);
        L(h);
        if (ok == MHD_YES) count_locked(h, r, status);
        U(h);
        MHD_destroy_response(resp);
    }
    return ok;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    zs_http *h = cls;
    zs_http_req *r = *con_cls;
    if (!r) {
        if (!(r = req_new(h, c, url, method))) return MHD_NO;
        *con_cls = r;
        return req_begin(h, r);
    }
    if (r->state == R_RECEIVING) {
        if (*upload_size) {
            size_t n = *upload_size;
            *upload_size = 0;
            return body_append(h, r, upload, n);
        }
        if (r->too_large)
            return early_error(r, 413, "invalid_request_error", "request_too_large", NULL, NULL,
                               "Request body exceeds the limit of %zu bytes", h->max_body);
        return run_handler(h, r);
    }
    /* Called again without a queued response: the client went away while we waited (or
     * something failed); close the connection. */
    *upload_size = 0;
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    zs_http *h = cls;
    zs_http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    L(h);
    watch_del_locked(h, r);
    r->mhd_done = 1;
    r->suspended = 0;
    r->conn = NULL;
    h->mhd_live--;
    if (!r->counted) count_locked(h, r, 499);
    int fire = r->app_ref && r->on_close && !r->close_fired;
    if (fire) {
        r->close_fired = 1;
        r->in_close_cb = 1;
        r->close_thr = pthread_self();
    }
    pthread_cond_broadcast(&h->cv);
    U(h);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        zs_log_debug("http: %s %s ended early (code %d)", r->method, r->path, (int)toe);
    if (fire) {
        r->on_close(r->on_close_ud);
        L(h);
        r->in_close_cb = 0;
        pthread_cond_broadcast(&h->cv);
        U(h);
    }
    req_release(r);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    zs_http_req *r = cls;
    zs_http *h = r->h;
    ssize_t ret;
    L(h);
    if (r->gone) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (r->slen) {
        size_t n = ZS_MIN(max, r->slen);
        memcpy(buf, r->sbuf + r->soff, n);
        r->soff += n;
        r->slen -= n;
        if (!r->slen) r->soff = 0;
        ret = (ssize_t)n;
    } else if (r->ended || h->forced) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        suspend_locked(r); /* resumed by write / end / stop / the watcher */
        ret = 0;
    }
    U(h);
    return ret;
}

static void stream_reader_free(void *cls) { req_release(cls); }

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    zs_http *h = cls;
    char buf[256];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
    L(h);
    if (h->starting) snprintf(h->start_err, sizeof h->start_err, "%s", buf);
    U(h);
    zs_log_debug("http (mhd): %s", buf);
}

/* ------------------------------------------------------------------ start / stop */

int zs_http_start(const zs_http_opts *o, zs_http **out) {
    zs_http_opts d = {0};
    if (o) d = *o;
    const char *host = d.host && *d.host ? d.host : "127.0.0.1";
    int threads = d.threads > 0 ? d.threads : 4;
    int tmo = d.conn_timeout_s > 0 ? d.conn_timeout_s : 60;
    if (!out) return zs_err(ZS_EINVAL, "http start: out is NULL");
    if (d.port < 0 || d.port > 65535) return zs_err(ZS_EINVAL, "http: invalid port %d", d.port);
    if (threads > 1024) return zs_err(ZS_EINVAL, "http: invalid thread count %d", threads);

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)d.port);
    } else if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)d.port);
        flags |= IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    } else {
        return zs_err(ZS_EINVAL, "http: invalid listen address \"%s\" (want a numeric IPv4/IPv6 "
                                 "address)", host);
    }

    zs_http *h = calloc(1, sizeof *h);
    if (!h) return zs_err(ZS_ENOMEM, "http: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->refs = 1;
    h->epfd = h->evfd = -1;
    h->max_body = d.max_body_bytes ? ZS_MIN(d.max_body_bytes, SIZE_MAX / 4) : (size_t)8 << 20;
    h->host = strdup(host);
    int rc;
    if (!h->host) {
        rc = zs_err(ZS_ENOMEM, "http: out of memory");
        goto fail;
    }
    if (d.key_file && *d.key_file) {
        if (!(h->key_file = strdup(d.key_file))) {
            rc = zs_err(ZS_ENOMEM, "http: out of memory");
            goto fail;
        }
        if ((rc = zs_keys_load(h->key_file, &h->keys)) < 0) goto fail;
    } else if (d.api_key && *d.api_key && (rc = zs_keys_single(d.api_key, &h->keys)) < 0) {
        goto fail;
    }
    if ((rc = zs_quota_new(&h->limits)) < 0) goto fail;
    if (d.audit_path && *d.audit_path && (rc = zs_audit_open(d.audit_path, &h->audit)) < 0) goto fail;
    if ((d.tls_cert && *d.tls_cert) || (d.tls_key && *d.tls_key)) {
        if (!zs_tls_supported()) {
            rc = zs_err(ZS_EUNSUPPORTED, "--tls-cert/--tls-key: this libmicrohttpd was built without TLS (GnuTLS) "
                        "support; install one with HTTPS (Debian's libmicrohttpd12 has it) or put a TLS proxy in front");
            goto fail;
        }
        if ((rc = zs_tls_load(d.tls_cert, d.tls_key, &h->tls)) < 0) goto fail;
        if (!(h->tls_cert_path = strdup(d.tls_cert)) || !(h->tls_key_path = strdup(d.tls_key))) {
            rc = zs_err(ZS_ENOMEM, "http: out of memory");
            goto fail;
        }
        flags |= MHD_USE_TLS;
    }
    if ((rc = origins_parse(h, d.allowed_origins)) < 0) goto fail;
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    h->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    if (h->epfd < 0 || h->evfd < 0 || epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->evfd, &ev) != 0) {
        rc = zs_err(ZS_EIO, "http: cannot set up the disconnect watcher: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&h->watcher, NULL, watcher_main, h) != 0) {
        rc = zs_err(ZS_EIO, "http: cannot start the disconnect watcher thread");
        goto fail;
    }
    h->watcher_started = 1;
    h->starting = 1;
    /* MHD keeps the pointers and reads them while starting; they live as long as h */
    struct MHD_OptionItem tls_opts[] = {
        {h->tls.cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, h->tls.cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls.key},
        {MHD_OPTION_END, 0, NULL},
    };
    errno = 0;
    h->d = MHD_start_daemon(flags, (uint16_t)d.port, NULL, NULL, on_access, h,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* must come first */
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)tmo,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                            MHD_OPTION_ARRAY, tls_opts,
                            MHD_OPTION_END);
    int e = errno;
    L(h);
    h->starting = 0;
    U(h);
    if (!h->d) {
        const char *why = (e == EADDRINUSE || e == EACCES || e == EADDRNOTAVAIL) ? strerror(e)
                          : h->start_err[0]                                      ? h->start_err
                          : e                                                    ? strerror(e)
                                  : "cannot start the HTTP daemon";
        if (h->tls.cert && !(e == EADDRINUSE || e == EACCES || e == EADDRNOTAVAIL))
            rc = zs_err(ZS_EIO, "cannot serve HTTPS on %s:%d with --tls-cert %s and --tls-key %s: %s", host, d.port,
                        h->tls_cert_path, h->tls_key_path, why);
        else
            rc = zs_err(ZS_EIO, "cannot listen on %s:%d: %s", host, d.port, why);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di && di->port ? di->port : d.port;
    *out = h;
    return 0;
fail:
    if (h->watcher_started) {
        uint64_t one = 1;
        if (write(h->evfd, &one, sizeof one) < 0) zs_log_warn("http: eventfd write failed");
        pthread_join(h->watcher, NULL);
    }
    if (h->epfd >= 0) close(h->epfd);
    if (h->evfd >= 0) close(h->evfd);
    http_free(h);
    return rc;
}

int zs_http_port(const zs_http *h) { return h ? h->port : 0; }
int zs_http_tls(const zs_http *h) { return h && h->tls.cert ? 1 : 0; }

static void abs_deadline(struct timespec *ts, double s) {
    clock_gettime(CLOCK_REALTIME, ts);
    if (s < 0) s = 0;
    time_t whole = (time_t)s;
    long ns = ts->tv_nsec + (long)((s - (double)whole) * 1e9);
    ts->tv_sec += whole + ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

void zs_http_stop(zs_http *h, double drain_s) {
    if (!h) return;
    if (drain_s < 0) drain_s = 0;
    L(h);
    h->stopping = 1;
    U(h);
    /* No MHD_quiesce_daemon: with a thread pool and epoll, 0.9.75 can abort in it ("Failed to
     * remove listen FD from epoll set") when a worker has just taken the listen socket out of
     * its epoll set. New requests are answered 503 instead (see `stopping`), and the listen
     * socket closes with MHD_stop_daemon below. */

    /* 1. drain: wait for in-flight requests and streams to finish on their own */
    double grace = ZS_MIN(0.5, drain_s * 0.25);
    struct timespec ts;
    abs_deadline(&ts, drain_s - grace);
    L(h);
    while (h->inflight > 0 && pthread_cond_timedwait(&h->cv, &h->mu, &ts) != ETIMEDOUT) {}

    /* 2. force: end streams, answer waiting requests with 503, never suspend again */
    h->forced = 1;
    for (zs_http_req *r = h->reqs; r; r = r->next) {
        if (r->mhd_done) continue;
        if (r->state == R_WAITING && r->suspended && !r->gone) {
            const char *b = "{\"error\":{\"message\":\"The server is shutting down\",\"type\":"
                            "\"server_error\",\"param\":null,\"code\":\"server_shutting_down\"}}";
            struct MHD_Response *resp = build_response(r, "application/json", b, strlen(b));
            if (resp && MHD_queue_response(r->conn, 503, resp) == MHD_YES) count_locked(h, r, 503);
            r->state = R_QUEUED;
            r->hold = resp; /* our reference; dropped (outside the lock) when r is freed */
        }
        resume_locked(r);
    }
    U(h);

    /* 3. short grace for those answers / stream ends to be flushed */
    abs_deadline(&ts, grace);
    L(h);
    while (h->mhd_live > 0 && pthread_cond_timedwait(&h->cv, &h->mu, &ts) != ETIMEDOUT) {}
    /* a respond / stream_start on another thread may be between its queue and its resume */
    while (h->resuming > 0) pthread_cond_wait(&h->cv, &h->mu);
    U(h);

    /* 4. close everything */
    uint64_t one = 1;
    if (write(h->evfd, &one, sizeof one) < 0) zs_log_warn("http: eventfd write failed");
    pthread_join(h->watcher, NULL);
    MHD_stop_daemon(h->d);
    L(h);
    close(h->epfd);
    close(h->evfd);
    h->epfd = h->evfd = -1;
    h->d = NULL;
    int last = --h->refs == 0;
    U(h);
    if (last) http_free(h);
}

/* ------------------------------------------------------------------ request accessors */

const char *zs_http_req_method(const zs_http_req *r) { return r->method; }
const char *zs_http_req_path(const zs_http_req *r) { return r->path; }
const char *zs_http_req_param(const zs_http_req *r) { return r->param; }
const char *zs_http_req_header(const zs_http_req *r, const char *name) {
    return kv_get(&r->hdrs, name, 1);
}
const char *zs_http_req_query(const zs_http_req *r, const char *name) {
    return kv_get(&r->query, name, 0);
}
const char *zs_http_req_body(const zs_http_req *r, size_t *len) {
    if (len) *len = r->blen;
    return r->body ? r->body : "";
}

/* ------------------------------------------------------------------ responses */

/* Hands a finished response to MHD (or keeps it for the access handler) and releases the
 * application's reference. resp may be NULL (allocation failed: the connection is closed). */
static int finish_app(zs_http_req *r, struct MHD_Response *resp, int status) {
    zs_http *h = r->h;
    struct MHD_Response *destroy = resp;
    struct MHD_Connection *conn = NULL;
    int rc = 0;
    limits_done(r);
    L(h);
    if (!r->app_ref) {
        U(h);
        if (resp) MHD_destroy_response(resp);
        return zs_err(ZS_EINVAL, "http: request already answered");
    }
    if (r->state == R_IN_HANDLER) {
        if (resp) {
            r->pending = resp;
            r->pending_status = status;
            destroy = NULL;
        } else {
            r->app_failed = 1;
            rc = zs_err(ZS_ENOMEM, "http: cannot build the response");
        }
    } else if (r->state == R_WAITING && r->suspended && !r->gone && !r->mhd_done) {
        r->state = R_QUEUED;
        conn = claim_resume_locked(r);
    } else {
        rc = zs_err(ZS_ECANCELLED, "http: client of %s %s has gone", r->method, r->path);
    }
    app_finish_locked(r);
    U(h);
    if (conn) { /* without a response, the access handler closes the connection */
        int ok = resp && MHD_queue_response(conn, (unsigned)status, resp) == MHD_YES;
        if (!ok) rc = zs_err(ZS_ENOMEM, "http: cannot queue the response");
        finish_resume(r, conn, ok ? status : 0);
    }
    if (destroy) MHD_destroy_response(destroy);
    req_release(r);
    return rc;
}

int zs_http_respond(zs_http_req *r, int status, const char *content_type, const char *body,
                    size_t len) {
    if (!r) return zs_err(ZS_EINVAL, "http respond: NULL request");
    int bad = status < 100 || status > 999;
    if (bad) { /* still answer (500) so the client is not left hanging */
        zs_log_error("http respond: bad status %d for %s %s", status, r->method, r->path);
        status = 500;
    }
    L(r->h);
    struct MHD_Response *resp = build_response(r, content_type, body, body ? len : 0);
    U(r->h);
    int rc = finish_app(r, resp, status);
    return bad ? zs_err(ZS_EINVAL, "http respond: bad status (sent 500)") : rc;
}

int zs_http_respond_json(zs_http_req *r, int status, void *json) {
    if (!json) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
        return zs_err(ZS_ENOMEM, "http respond_json: NULL json");
    }
    char *s = json_dumps(json, JSON_COMPACT);
    json_decref(json);
    if (!s) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "cannot serialize response");
        return zs_err(ZS_ENOMEM, "http respond_json: cannot serialize");
    }
    int rc = zs_http_respond(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

int zs_http_respond_error(zs_http_req *r, int status, const char *type, const char *param,
                          const char *code, const char *fmt, ...) {
    if (!r) return zs_err(ZS_EINVAL, "http respond: NULL request");
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    va_end(ap);
    char *body = error_body(type, param, code, msg ? msg : "error");
    snprintf(r->code, sizeof r->code, "%s", code ? code : "");
    free(msg);
    int rc;
    if (!body) return finish_app(r, NULL, status); /* closes the connection */
    rc = zs_http_respond(r, status, "application/json", body, strlen(body));
    free(body);
    return rc;
}

int zs_http_add_header(zs_http_req *r, const char *name, const char *value) {
    if (!r || !name || !*name || !value || has_crlf(name) || has_crlf(value) || strchr(name, ':'))
        return zs_err(ZS_EINVAL, "http add_header: bad header");
    L(r->h);
    int rc = kv_add(&r->extra, name, value);
    U(r->h);
    return rc < 0 ? zs_err(rc, "http add_header: out of memory") : 0;
}

void zs_http_on_close(zs_http_req *r, void (*cb)(void *ud), void *ud) {
    if (!r) return;
    zs_http *h = r->h;
    L(h);
    r->on_close = cb;
    r->on_close_ud = ud;
    int fire = cb && r->app_ref && (r->mhd_done || r->gone) && !r->close_fired;
    if (fire) {
        r->close_fired = 1;
        r->in_close_cb = 1;
        r->close_thr = pthread_self();
    }
    U(h);
    if (fire) {
        cb(ud);
        L(h);
        r->in_close_cb = 0;
        pthread_cond_broadcast(&h->cv);
        U(h);
    }
}

/* ------------------------------------------------------------------ streams */

int zs_http_stream_start(zs_http_req *r, int status, const char *content_type,
                         zs_http_stream **out) {
    if (!r || !out) return zs_err(ZS_EINVAL, "http stream_start: bad arguments");
    if (status < 100 || status > 999) return zs_err(ZS_EINVAL, "http stream: bad status %d", status);
    zs_http *h = r->h;
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 4096, stream_reader, r, stream_reader_free);
    if (!resp) return zs_err(ZS_ENOMEM, "http stream_start: cannot create the response");
    L(h);
    r->refs++; /* owned by resp, released by stream_reader_free when MHD frees it */
    if (!r->app_ref || r->streaming) {
        U(h);
        MHD_destroy_response(resp);
        return zs_err(ZS_EINVAL, "http stream_start: request already answered");
    }
    int ok = 1;
    if (content_type)
        ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type) == MHD_YES;
    ok &= MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache") == MHD_YES;
    ok &= MHD_add_response_header(resp, "X-Accel-Buffering", "no") == MHD_YES;
    for (int i = 0; i < r->extra.n; i++)
        ok &= MHD_add_response_header(resp, r->extra.a[i].k, r->extra.a[i].v) == MHD_YES;
    if (!ok) {
        U(h);
        MHD_destroy_response(resp);
        return zs_err(ZS_ENOMEM, "http stream_start: cannot add headers");
    }
    struct MHD_Response *destroy = resp;
    struct MHD_Connection *conn = NULL;
    int rc = 0;
    if (r->state == R_IN_HANDLER) {
        r->pending = resp;
        r->pending_status = status;
        destroy = NULL;
    } else if (r->state == R_WAITING && r->suspended && !r->gone && !r->mhd_done) {
        r->state = R_QUEUED;
        conn = claim_resume_locked(r);
    } else {
        rc = zs_err(ZS_ECANCELLED, "http: client of %s %s has gone", r->method, r->path);
    }
    if (rc == 0) {
        r->streaming = 1;
        *out = &r->stream;
    } else {
        app_finish_locked(r);
    }
    U(h);
    if (conn) {
        /* A failure here (not expected on a suspended connection) resumes without a response:
         * the connection is closed, on_close fires and writes return ZS_ECANCELLED. */
        int queued = MHD_queue_response(conn, (unsigned)status, resp) == MHD_YES;
        if (!queued) zs_log_warn("http: cannot queue the stream response for %s", r->path);
        finish_resume(r, conn, queued ? status : 0);
    }
    if (destroy) MHD_destroy_response(destroy);
    if (rc < 0) req_release(r);
    return rc;
}

zs_http_req *zs_http_stream_req(zs_http_stream *s) { return s ? s->r : NULL; }

int zs_http_stream_write(zs_http_stream *s, const char *data, size_t len) {
    if (!s) return zs_err(ZS_EINVAL, "http stream_write: NULL stream");
    zs_http_req *r = s->r;
    zs_http *h = r->h;
    L(h);
    int rc = 0;
    if (r->gone || r->mhd_done || h->forced) {
        rc = zs_err(ZS_ECANCELLED, "http: client of %s %s has gone", r->method, r->path);
    } else if (r->ended) {
        rc = zs_err(ZS_EINVAL, "http stream_write: stream already ended");
    } else if (len) {
        if (r->slen + len > STREAM_MAX_PENDING) {
            rc = zs_err(ZS_ENOSPC, "http stream: client is not reading (%zu bytes pending)",
                        r->slen);
        } else {
            if (r->soff + r->slen + len > r->scap && r->soff) {
                memmove(r->sbuf, r->sbuf + r->soff, r->slen);
                r->soff = 0;
            }
            if (r->slen + len > r->scap) {
                size_t nc = r->scap ? r->scap : 4096;
                while (nc < r->slen + len) nc *= 2;
                char *nb = realloc(r->sbuf, nc);
                if (!nb) rc = zs_err(ZS_ENOMEM, "http stream: out of memory");
                else {
                    r->sbuf = nb;
                    r->scap = nc;
                }
            }
            if (rc == 0) {
                memcpy(r->sbuf + r->soff + r->slen, data, len);
                r->slen += len;
                resume_locked(r);
            }
        }
    }
    U(h);
    return rc;
}

int zs_http_stream_end(zs_http_stream *s) {
    if (!s) return zs_err(ZS_EINVAL, "http stream_end: NULL stream");
    zs_http_req *r = s->r;
    zs_http *h = r->h;
    limits_done(r);
    L(h);
    int rc = 0;
    if (r->gone || r->mhd_done)
        rc = zs_err(ZS_ECANCELLED, "http: client of %s %s has gone", r->method, r->path);
    r->ended = 1;
    resume_locked(r);
    app_finish_locked(r);
    U(h);
    req_release(r);
    return rc;
}

/* ------------------------------------------------------------------ counters */

void zs_http_counts(zs_http *h, zs_http_count_fn fn, void *ud) {
    if (!h || !fn) return;
    L(h);
    int n = h->ncounts;
    count_ent *copy = n ? malloc((size_t)n * sizeof *copy) : NULL;
    if (copy) memcpy(copy, h->counts, (size_t)n * sizeof *copy);
    U(h);
    if (!copy) return;
    for (int i = 0; i < n; i++)
        fn(ud, copy[i].route >= 0 ? h->routes[copy[i].route].pattern : UNMATCHED_ROUTE,
           k_methods[copy[i].method], copy[i].status, copy[i].n);
    free(copy);
}

size_t zs_http_inflight(zs_http *h) {
    if (!h) return 0;
    L(h);
    size_t n = h->inflight;
    U(h);
    return n;
}

int zs_http_reload_keys(zs_http *h) {
    if (!h->key_file) return zs_err(ZS_EINVAL, "no --api-key-file to reload");
    zs_keys *k = NULL;
    int rc = zs_keys_load(h->key_file, &k);
    zs_audit_rec rec = {NULL, NULL, NULL, "SIGHUP", h->key_file, rc < 0 ? 400 : 200, rc < 0 ? "bad_key_file" : "keys_reloaded", NULL};
    zs_audit_write(h->audit, &rec);
    if (rc < 0) return rc;
    int n = zs_keys_count(k);
    L(h);
    zs_keys *old = h->keys;
    h->keys = k;
    U(h);
    zs_keys_free(old);
    return n;
}

const zs_key_id *zs_http_req_who(const zs_http_req *r) { return r->authed ? &r->who : NULL; }

int zs_http_req_set_object(zs_http_req *r, const char *id) {
    if (!r || !id) return ZS_EINVAL;
    char *c = strdup(id);
    if (!c) return zs_err(ZS_ENOMEM, "out of memory");
    free(r->object);
    r->object = c;
    return 0;
}

void zs_http_req_charge(zs_http_req *r, long tokens) {
    if (r && r->authed) zs_quota_charge(r->h->limits, r->who.tenant, &r->who.limits, tokens, zs_now());
}

/* http.h — the model-independent HTTP layer of the server, built on libmicrohttpd: routing
 * (exact paths and one-{param} patterns), body limits, Bearer API-key auth, OpenAI-shaped
 * errors, per-route request counters, delayed responses and streaming responses (SSE or any
 * chunked body) fed from other threads.
 *
 * Threads and ownership
 * - A zs_http is driven by an internal pool of MHD threads. Register routes before
 *   zs_http_start()'s daemon handles traffic (zs_http_route is not thread-safe).
 * - A handler runs on an MHD thread and must, exactly once, either respond
 *   (zs_http_respond*) or start a stream (zs_http_stream_start). It may do so before it
 *   returns or later from any thread; meanwhile the connection is suspended (no thread is
 *   held). zs_http_req is valid until its response is queued (respond returns) or, for a
 *   stream, until zs_http_stream_end returns — even if the client has gone or the server was
 *   stopped in between (calls then return ZS_ECANCELLED).
 * - Every respond/stream call and zs_http_on_close/zs_http_add_header is thread-safe with
 *   respect to MHD; one request must not be used by two application threads at once.
 * - Strings returned by the request accessors are owned by the request.
 * - zs_http_stop() may be called while the application still holds requests or streams; they
 *   stay valid (calls return ZS_ECANCELLED) and the last memory is freed when the application
 *   finishes the last of them. */
#ifndef ZS_HTTP_H
#define ZS_HTTP_H

#include <stddef.h>

#include "keys.h"

typedef struct zs_http zs_http;
typedef struct zs_http_req zs_http_req;
typedef struct zs_http_stream zs_http_stream;

typedef struct {
    const char *host;      /* default "127.0.0.1"; "0.0.0.0" / "::" allowed */
    int port;              /* 0 = pick a free port (read it back with zs_http_port) */
    int threads;           /* internal MHD thread pool size (default 4) */
    size_t max_body_bytes; /* larger bodies -> 413 (default 8 MiB) */
    const char *api_key;   /* NULL/"" = no auth; else one admin key, "Authorization: Bearer <key>" on
                              routes that need a role (zs_http_set_keys replaces it with a key file's) */
    int conn_timeout_s;    /* idle connection timeout (default 60) */
    const char *key_file;  /* keys with tenants and roles (keys.h), loaded at start (its errors fail
                              it) and again by zs_http_reload_keys; instead of api_key */
    const char *audit_path; /* NULL/"": none; else the audit log (audit.h) of actions on routes of the
                               finetune and admin roles (all but the reads let in) and of key reloads */
    const char *tls_cert;  /* HTTPS: the PEM certificate (chain) file; with tls_key, both or neither. */
    const char *tls_key;   /* its PEM private key (unencrypted). Both are read and checked at start
                              (missing, unreadable, not PEM, key not the certificate's: errors that
                              name the file); plain HTTP to an HTTPS port is closed at the handshake */
    const char *allowed_origins; /* CORS: "*" or comma-separated origins (scheme://host[:port]);
                              NULL/"" = none: no CORS headers, OPTIONS gets 405 as any unrouted
                              method. With origins: a matching Origin gets Access-Control-Allow-Origin
                              (and -Expose-Headers) on every response, errors and streams included;
                              a preflight (OPTIONS with Origin and Access-Control-Request-Method) on
                              a known path gets 204 with the route's methods, needing no key, or 403
                              (no CORS headers) from an origin not allowed */
} zs_http_opts;

/* Must eventually respond exactly once (now, or later from another thread), or start a
 * stream. */
typedef void (*zs_http_handler)(void *ud, zs_http_req *req);

/* Starts listening. The options' strings are copied. On failure *out is untouched and the
 * message says e.g. "cannot listen on 127.0.0.1:8080: Address already in use". */
int zs_http_start(const zs_http_opts *o, zs_http **out);
/* The bound port (useful with port 0). */
int zs_http_port(const zs_http *h);
/* 1 when the server speaks HTTPS (tls_cert and tls_key), else 0. */
int zs_http_tls(const zs_http *h);

/* Routes: exact paths or patterns with one {param} segment
 * ("/v1/fine_tuning/jobs/{id}/cancel"). Unknown path -> 404, known path with another method
 * -> 405 with an Allow header; both in the OpenAI error shape. role: when keys are configured,
 * a route of any role but ZS_ROLE_NONE needs a key (401 without a known one) whose role is at
 * least role (403 otherwise). Not thread-safe: register all routes before traffic. */
int zs_http_route(zs_http *h, const char *method, const char *pattern, zs_role role,
                  zs_http_handler fn, void *ud);
/* Calls fn for every registered route, in registration order (the OpenAPI document's test
 * compares them with it). Not thread-safe with zs_http_route: call once routes are registered. */
typedef void (*zs_http_route_fn)(void *ud, const char *method, const char *pattern, zs_role role);
void zs_http_routes(const zs_http *h, zs_http_route_fn fn, void *ud);
/* Loads the key file again (SIGHUP) and puts its keys in force; on an error the keys in force
 * stay (the message names the file and line). Requests authenticated before keep their caller.
 * Returns the number of keys. ZS_EINVAL without a key file. Thread-safe. */
int  zs_http_reload_keys(zs_http *h);
/* The caller of an authenticated request (tenant, role, limits), or NULL without keys. */
const zs_key_id *zs_http_req_who(const zs_http_req *r);
/* Per-tenant limits (quota.h): every authenticated request is admitted against its tenant's rpm
 * and streams (requests at once, held until the request is released) and its tpm bucket, else
 * answered 429 here with Retry-After and the code rpm_limit, tpm_limit or streams_limit. A handler
 * charges the tokens a request used (prompt and generated) with this, before it responds;
 * no-op without keys or a tpm limit. */
void zs_http_req_charge(zs_http_req *r, long tokens);
/* Names the id a request's action made (a file, a job) for the audit log; call before responding.
 * Copies id. */
int  zs_http_req_set_object(zs_http_req *r, const char *id);

/* Graceful stop: stop accepting, wait up to drain_s seconds for in-flight requests and streams
 * to finish, then end open streams (clean end of the chunked body), answer delayed requests
 * with 503, close every connection and free. Requests still held by the application stay valid
 * (see above). h is invalid afterwards. NULL is a no-op. */
void zs_http_stop(zs_http *h, double drain_s);

/* Request accessors (strings owned by the request). */
const char *zs_http_req_method(const zs_http_req *r);
const char *zs_http_req_path(const zs_http_req *r);
const char *zs_http_req_param(const zs_http_req *r); /* the {param} value, or NULL */
const char *zs_http_req_header(const zs_http_req *r, const char *name); /* case-insensitive */
const char *zs_http_req_query(const zs_http_req *r, const char *name);
const char *zs_http_req_body(const zs_http_req *r, size_t *len); /* NUL-terminated; "" if none */

/* Responses. The request is released in every case (do not use it afterwards). Return 0,
 * ZS_ECANCELLED when the client has gone / the server stopped, ZS_EINVAL for a status outside
 * 100..999 (a 500 is sent instead), ZS_ENOMEM if no response could be built (the connection is
 * closed). The body is copied. content_type NULL = no Content-Type header. */
int zs_http_respond(zs_http_req *r, int status, const char *content_type, const char *body,
                    size_t len);
/* json is a json_t* whose reference is stolen (NULL -> 500 error response, ZS_ENOMEM). */
int zs_http_respond_json(zs_http_req *r, int status, void *json);
/* {"error":{"message","type","param","code"}}; param/code NULL -> JSON null. */
int zs_http_respond_error(zs_http_req *r, int status, const char *type, const char *param,
                          const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Adds a header to the response this request will get (e.g. Retry-After). Call before
 * responding / starting the stream. CR/LF in name or value -> ZS_EINVAL. */
int zs_http_add_header(zs_http_req *r, const char *name, const char *value);

/* Streaming (SSE or any chunked body). Adds Cache-Control: no-cache and X-Accel-Buffering: no.
 * On success the request is represented by *out (its accessors stay usable until stream_end).
 * ZS_ECANCELLED: the client had gone, the request is released. Other errors (ZS_EINVAL,
 * ZS_ENOMEM): the caller still owns the request and must respond to it. */
int zs_http_stream_start(zs_http_req *r, int status, const char *content_type,
                         zs_http_stream **out);
/* Thread-safe; copies data into the stream's buffer and wakes the connection. Returns
 * ZS_ECANCELLED once the client has gone (or the server stopped), ZS_ENOSPC if more than
 * 64 MiB is waiting for a client that does not read. */
int zs_http_stream_write(zs_http_stream *s, const char *data, size_t len);
/* Ends the stream (the buffered data is still sent) and releases it; 0, or ZS_ECANCELLED if
 * the client had gone. The handle is invalid afterwards. */
int zs_http_stream_end(zs_http_stream *s);
/* The request behind a stream (for the accessors). */
zs_http_req *zs_http_stream_req(zs_http_stream *s);

/* cb(ud) is called once when the client disconnects (or the server stops) before the stream
 * ended / the delayed response was sent, so the application can cancel work. Normally from an
 * MHD thread; if the client is already gone when this is called, cb runs right here. Once
 * respond / stream_end has returned, cb is not running and will not be called. Set it right
 * after starting the stream (or in the handler for a delayed response). */
void zs_http_on_close(zs_http_req *r, void (*cb)(void *ud), void *ud);

/* Counters for /metrics: requests by route pattern ("unmatched" for 404s), method (one of the
 * standard methods or "OTHER") and status. A client that left before any response counts as
 * status 499. fn is called without internal locks held. */
typedef void (*zs_http_count_fn)(void *ud, const char *route, const char *method, int status,
                                 long count);
void zs_http_counts(zs_http *h, zs_http_count_fn fn, void *ud);
/* Requests received and not yet finished (delayed responses and open streams included). */
size_t zs_http_inflight(zs_http *h);

#endif

/* http-client.h — a small raw-socket HTTP/1.1 client for the server tests: send a request, read
 * the whole response, parse the status, headers and (de-chunked) body. Header-only, static. */
#ifndef ZS_HTTP_CLIENT_H
#define ZS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifndef TU_HTTP_TIMEOUT_S
#define TU_HTTP_TIMEOUT_S 5 /* receive timeout of a request */
#endif

typedef struct {
    int status;
    char *raw;    /* everything received */
    size_t rawlen;
    char head[8192];
    char *body;   /* de-chunked, NUL-terminated */
    size_t blen;
    int chunked, complete;
} resp_t;

static void resp_free(resp_t *r) {
    free(r->raw);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {TU_HTTP_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads until EOF / timeout / error; appends to r->raw. */
static void read_all(int fd, resp_t *r) {
    size_t cap = r->rawlen + 65536;
    r->raw = realloc(r->raw, cap + 1);
    for (;;) {
        if (cap - r->rawlen < 4096) {
            cap *= 2;
            r->raw = realloc(r->raw, cap + 1);
        }
        ssize_t n = recv(fd, r->raw + r->rawlen, cap - r->rawlen, 0);
        if (n <= 0) break;
        r->rawlen += (size_t)n;
    }
    r->raw[r->rawlen] = '\0';
}

static const char *hdr(const resp_t *r, const char *name) {
    static __thread char val[512];
    char pat[128];
    snprintf(pat, sizeof pat, "\r\n%s:", name);
    const char *p = strcasestr(r->head, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    size_t n = strcspn(p, "\r\n");
    if (n >= sizeof val) n = sizeof val - 1;
    memcpy(val, p, n);
    val[n] = '\0';
    return val;
}

/* Parses the first response in r->raw (status, head, body). */
static void parse(resp_t *r) {
    r->status = 0;
    free(r->body);
    r->body = NULL;
    r->blen = 0;
    r->chunked = r->complete = 0;
    if (!r->raw) return;
    const char *e = strstr(r->raw, "\r\n\r\n");
    if (!e || strncmp(r->raw, "HTTP/1.", 7) != 0) return;
    r->status = atoi(r->raw + 9);
    size_t hl = (size_t)(e - r->raw) + 2;
    if (hl >= sizeof r->head) hl = sizeof r->head - 1;
    memcpy(r->head, r->raw, hl);
    r->head[hl] = '\0';
    const char *b = e + 4;
    size_t avail = r->rawlen - (size_t)(b - r->raw);
    r->body = malloc(avail + 1);
    const char *te = hdr(r, "Transfer-Encoding");
    if (te && strcasestr(te, "chunked")) {
        r->chunked = 1;
        const char *p = b, *end = b + avail;
        while (p < end) {
            char *q;
            unsigned long n = strtoul(p, &q, 16);
            const char *nl = strstr(q, "\r\n");
            if (!nl || nl >= end) break;
            p = nl + 2;
            if (n == 0) {
                r->complete = 1;
                break;
            }
            if ((size_t)(end - p) < n + 2) break;
            memcpy(r->body + r->blen, p, n);
            r->blen += n;
            p += n + 2;
        }
    } else {
        const char *cl = hdr(r, "Content-Length");
        size_t n = cl ? (size_t)atol(cl) : avail;
        if (n > avail) n = avail;
        else r->complete = 1;
        memcpy(r->body, b, n);
        r->blen = n;
    }
    r->body[r->blen] = '\0';
}

/* Sends a raw request and reads the response until the server closes. */
static int raw_request(int port, const char *req, size_t len, resp_t *r) {
    memset(r, 0, sizeof *r);
    int fd = connect_to(port);
    if (fd < 0) return -1;
    int rc = send_all(fd, req, len);
    read_all(fd, r);
    close(fd);
    parse(r);
    return rc;
}

/* Convenience: method, path, extra header lines ("" or "X: y\r\n..."), body. */
static int request(int port, const char *method, const char *path, const char *hdrs,
                   const char *body, resp_t *r) {
    char *req = NULL;
    size_t bl = body ? strlen(body) : 0;
    int n = asprintf(&req,
                     "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, hdrs ? hdrs : "", bl, body ? body : "");
    if (n < 0) return -1;
    int rc = raw_request(port, req, (size_t)n, r);
    free(req);
    return rc;
}

static json_t *body_json(const resp_t *r) {
    return r->body ? json_loadb(r->body, r->blen, 0, NULL) : NULL;
}

#endif

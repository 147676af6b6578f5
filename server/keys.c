/* keys.c — the key file's parser and the lookup of a presented key (keys.h): SHA-256 digests from
 * GnuTLS, compared against every entry without an early exit. */
#include "keys.h"

#include <ctype.h>
#include <errno.h>
#include <gnutls/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

#define DIGEST 32
#define MAX_FILE (16u << 20) /* a key file larger than this is a mistake */

typedef struct {
    unsigned char digest[DIGEST];
    zs_key_id id;
    int line;
} entry;

struct zs_keys {
    int n;
    entry *e;
};

const char *zs_role_name(zs_role r) {
    switch (r) {
    case ZS_ROLE_INFERENCE: return "inference";
    case ZS_ROLE_FINETUNE: return "finetune";
    case ZS_ROLE_ADMIN: return "admin";
    default: return "none";
    }
}

zs_role zs_role_parse(const char *s) {
    if (!strcmp(s, "inference")) return ZS_ROLE_INFERENCE;
    if (!strcmp(s, "finetune")) return ZS_ROLE_FINETUNE;
    if (!strcmp(s, "admin")) return ZS_ROLE_ADMIN;
    return ZS_ROLE_NONE;
}

static int sha256(const void *p, size_t n, unsigned char *out) {
    return gnutls_hash_fast(GNUTLS_DIG_SHA256, p, n, out) == 0 ? 0 : zs_err(ZS_EIO, "keys: SHA-256 failed");
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int tenant_ok(const char *t) {
    size_t n = strlen(t);
    if (n == 0 || n >= ZS_TENANT_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)t[i]) && t[i] != '_' && t[i] != '-' && t[i] != '.') return 0;
    return 1;
}

/* LIMIT=N into l; 0 or an error naming it */
static int parse_limit(const char *f, zs_key_limits *l, const char *name, int line) {
    static const char *const names[] = {"rpm", "tpm", "streams", "jobs"};
    long *dst[] = {&l->rpm, &l->tpm, &l->streams, &l->jobs};
    const char *eq = strchr(f, '=');
    for (int i = 0; eq && i < 4; i++) {
        if ((size_t)(eq - f) != strlen(names[i]) || strncmp(f, names[i], (size_t)(eq - f)) != 0) continue;
        char *end;
        errno = 0;
        long v = strtol(eq + 1, &end, 10);
        if (errno || end == eq + 1 || *end || v < 0)
            return zs_err(ZS_EFORMAT, "%s:%d: limit %s: '%s' is not a whole number >= 0", name, line, names[i], eq + 1);
        *dst[i] = v;
        return 0;
    }
    return zs_err(ZS_EFORMAT, "%s:%d: '%.64s' is not a limit (rpm=N, tpm=N, streams=N or jobs=N)", name, line, f);
}

static int same_limits(const zs_key_limits *a, const zs_key_limits *b) {
    return a->rpm == b->rpm && a->tpm == b->tpm && a->streams == b->streams && a->jobs == b->jobs;
}

/* one line's fields (NUL-terminated in place) into e; 1: an entry, 0: blank or comment */
static int parse_line(char *s, entry *e, int *has_limits, const char *name, int line) {
    char *hash = strchr(s, '#');
    if (hash) *hash = 0;
    char *f[16];
    int nf = 0;
    for (char *t = strtok(s, " \t\r"); t; t = strtok(NULL, " \t\r")) {
        if (nf == 16) return zs_err(ZS_EFORMAT, "%s:%d: too many fields (KEY TENANT ROLE and at most 4 limits)", name, line);
        f[nf++] = t;
    }
    if (nf == 0) return 0;
    if (nf < 3)
        return zs_err(ZS_EFORMAT, "%s:%d: %d field%s; a key line is KEY TENANT ROLE [LIMIT=N ...]", name, line, nf,
                      nf == 1 ? "" : "s");
    memset(e, 0, sizeof *e);
    e->line = line;
    if (!strncmp(f[0], "sha256:", 7)) {
        const char *h = f[0] + 7;
        if (strlen(h) != 2 * DIGEST)
            return zs_err(ZS_EFORMAT, "%s:%d: sha256: takes 64 hex digits (%zu given)", name, line, strlen(h));
        for (int i = 0; i < DIGEST; i++) {
            int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
            if (a < 0 || b < 0) return zs_err(ZS_EFORMAT, "%s:%d: sha256: '%c%c' is not hex", name, line, h[2 * i], h[2 * i + 1]);
            e->digest[i] = (unsigned char)(a << 4 | b);
        }
    } else {
        ZS_CHECK(sha256(f[0], strlen(f[0]), e->digest));
        memset(f[0], 0, strlen(f[0])); /* the key itself is not kept, not even in the buffer */
    }
    if (!tenant_ok(f[1]))
        return zs_err(ZS_EFORMAT, "%s:%d: tenant '%.80s': 1 to %d letters, digits, '_', '-' or '.'", name, line, f[1],
                      ZS_TENANT_MAX - 1);
    snprintf(e->id.tenant, sizeof e->id.tenant, "%s", f[1]);
    if ((e->id.role = zs_role_parse(f[2])) == ZS_ROLE_NONE)
        return zs_err(ZS_EFORMAT, "%s:%d: role '%.40s' is not inference, finetune or admin", name, line, f[2]);
    for (int i = 3; i < nf; i++) ZS_CHECK(parse_limit(f[i], &e->id.limits, name, line));
    *has_limits = nf > 3;
    return 1;
}

int zs_keys_parse(const char *text, size_t len, const char *name, zs_keys **out) {
    *out = NULL;
    zs_keys *k = calloc(1, sizeof *k);
    char *buf = malloc(len + 1);
    unsigned char *lim = NULL; /* per entry: its line gave limits */
    int cap = 0, rc = 0, line = 0;
    if (!k || !buf) {
        free(k);
        free(buf);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    memcpy(buf, text, len);
    buf[len] = 0;
    if (memchr(text, 0, len)) rc = zs_err(ZS_EFORMAT, "%s: a NUL byte in the file", name);
    for (char *p = buf; rc == 0 && p < buf + len;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        line++;
        if (k->n == cap) {
            int nc = cap ? 2 * cap : 16;
            entry *ne = realloc(k->e, (size_t)nc * sizeof *ne);
            unsigned char *nlim = ne ? realloc(lim, (size_t)nc) : NULL;
            if (ne) k->e = ne;
            if (nlim) lim = nlim;
            if (!ne || !nlim) {
                rc = zs_err(ZS_ENOMEM, "out of memory");
                break;
            }
            cap = nc;
        }
        int has = 0;
        rc = parse_line(p, &k->e[k->n], &has, name, line);
        if (rc == 1) {
            entry *e = &k->e[k->n];
            lim[k->n] = (unsigned char)has;
            rc = 0;
            for (int i = 0; rc == 0 && i < k->n; i++) {
                if (!memcmp(k->e[i].digest, e->digest, DIGEST))
                    rc = zs_err(ZS_EFORMAT, "%s:%d: the same key as line %d", name, line, k->e[i].line);
                else if (!strcmp(k->e[i].id.tenant, e->id.tenant) && lim[i] && has &&
                         !same_limits(&k->e[i].id.limits, &e->id.limits))
                    rc = zs_err(ZS_EFORMAT, "%s:%d: tenant %s's limits differ from line %d's", name, line, e->id.tenant,
                                k->e[i].line);
            }
            k->n++;
        }
        p = nl ? nl + 1 : buf + len;
    }
    /* a tenant's limits hold for all its keys: those given on one of its lines */
    for (int i = 0; rc == 0 && i < k->n; i++)
        for (int j = 0; !lim[i] && j < k->n; j++)
            if (lim[j] && !strcmp(k->e[i].id.tenant, k->e[j].id.tenant)) k->e[i].id.limits = k->e[j].id.limits;
    if (rc == 0 && k->n == 0) rc = zs_err(ZS_EFORMAT, "%s: no keys (a line is KEY TENANT ROLE)", name);
    memset(buf, 0, len);
    free(buf);
    free(lim);
    if (rc < 0) {
        zs_keys_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

int zs_keys_load(const char *path, zs_keys **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return zs_err(ZS_ENOTFOUND, "--api-key-file %s: no such file", path);
        return zs_err(ZS_EPERM, "--api-key-file %s: cannot open it (%s)", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return zs_err(ZS_EFORMAT, "--api-key-file %s: not a regular file", path);
    }
    if ((size_t)sb.st_size > MAX_FILE) {
        fclose(f);
        return zs_err(ZS_EFORMAT, "--api-key-file %s: %lld bytes, more than a key file has (%u MiB at most)", path,
                      (long long)sb.st_size, MAX_FILE >> 20);
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO))
        zs_log_warn("--api-key-file %s: others may read it (mode %03o); chmod 600 keeps its keys to this user", path,
                    (unsigned)(sb.st_mode & 0777));
    char *text = malloc((size_t)sb.st_size + 1);
    size_t n = text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
    int err = ferror(f);
    fclose(f);
    if (!text) return zs_err(ZS_ENOMEM, "out of memory");
    if (err) {
        free(text);
        return zs_err(ZS_EIO, "--api-key-file %s: read error", path);
    }
    int rc = zs_keys_parse(text, n, path, out);
    memset(text, 0, n);
    free(text);
    return rc;
}

int zs_keys_single(const char *key, zs_keys **out) {
    *out = NULL;
    if (!key || !*key) return zs_err(ZS_EINVAL, "--api-key: empty");
    zs_keys *k = calloc(1, sizeof *k);
    if (!k || !(k->e = calloc(1, sizeof *k->e))) {
        free(k);
        return zs_err(ZS_ENOMEM, "out of memory");
    }
    k->n = 1;
    snprintf(k->e[0].id.tenant, sizeof k->e[0].id.tenant, "admin");
    k->e[0].id.role = ZS_ROLE_ADMIN;
    int rc = sha256(key, strlen(key), k->e[0].digest);
    if (rc < 0) {
        zs_keys_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void zs_keys_free(zs_keys *k) {
    if (!k) return;
    if (k->e) memset(k->e, 0, (size_t)k->n * sizeof *k->e);
    free(k->e);
    free(k);
}

int zs_keys_count(const zs_keys *k) { return k ? k->n : 0; }

int zs_keys_check(const zs_keys *k, const char *key, size_t n, zs_key_id *id) {
    unsigned char d[DIGEST];
    if (!k || !key || sha256(key, n, d) < 0) return 0;
    int found = -1;
    for (int i = 0; i < k->n; i++) {
        volatile unsigned diff = 0;
        for (int b = 0; b < DIGEST; b++) diff |= (unsigned)(k->e[i].digest[b] ^ d[b]);
        /* every entry is compared to its last byte; only the index is kept */
        int hit = diff == 0;
        found = hit ? i : found;
    }
    if (found < 0) return 0;
    *id = k->e[found].id;
    return 1;
}

int zs_key_sees(const zs_key_id *who, const char *owner) {
    return !who || who->role == ZS_ROLE_ADMIN || !owner || !*owner || !strcmp(owner, who->tenant);
}

const char *zs_key_owner(const zs_key_id *who) { return who ? who->tenant : ""; }

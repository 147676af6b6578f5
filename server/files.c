/* files.c — uploaded training files (OpenAI /v1/files, purpose "fine-tune"): a multipart/form-
 * data upload is parsed, its JSONL validated (zs_data_validate_buf: errors name the line), and
 * stored under data_dir/files as <id>.jsonl plus <id>.json (the file object), both written
 * atomically; the records are loaded again at start-up. With keys, a file belongs to the tenant
 * that uploaded it ("owner" in <id>.json, shown to admins only): other tenants get the answers of
 * a file that does not exist (keys.h, zs_key_sees). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common.h"
#include "data.h"
#include "finetune-api.h"

struct zs_files {
    char *dir; /* data_dir/files */
    size_t max_bytes;
    pthread_mutex_t mu;
    json_t *list; /* file objects, oldest first */
};

static int sees(const zs_key_id *who, json_t *v) {
    return zs_key_sees(who, json_string_value(json_object_get(v, "owner")));
}

/* The file object id that who sees, or NULL (mu held). */
static json_t *find_locked(zs_files *f, const char *id, const zs_key_id *who) {
    size_t i;
    json_t *v;
    json_array_foreach(f->list, i, v) {
        if (!strcmp(json_string_value(json_object_get(v, "id")), id)) return sees(who, v) ? v : NULL;
    }
    return NULL;
}

/* A file object as who gets it: the owner for admins only (a new reference; mu held). */
static json_t *view(json_t *v, const zs_key_id *who) {
    json_t *c = json_deep_copy(v);
    if (c && !(who && who->role == ZS_ROLE_ADMIN)) json_object_del(c, "owner");
    return c;
}

int zs_files_path(zs_files *f, const char *id, const zs_key_id *who, char *path, size_t cap) {
    pthread_mutex_lock(&f->mu);
    int ok = id && find_locked(f, id, who) != NULL;
    pthread_mutex_unlock(&f->mu);
    if (!ok) return zs_err(ZS_ENOTFOUND, "no such file: '%s'", id ? id : "");
    snprintf(path, cap, "%s/%s.jsonl", f->dir, id);
    return 0;
}

/* ------------------------------------------------------------------ multipart/form-data */

typedef struct {
    const char *name, *filename; /* NUL-terminated copies in the part's buffer */
    const char *data;
    size_t len;
} part;

/* The value of param (e.g. boundary, name) in a header value "a; k=v; k2=\"v2\"". */
static int header_param(const char *h, size_t hlen, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 1 <= hlen; i++) {
        if ((i == 0 || h[i - 1] == ';' || h[i - 1] == ' ' || h[i - 1] == '\t') && !strncasecmp(h + i, key, kl) &&
            h[i + kl] == '=') {
            size_t j = i + kl + 1, n = 0;
            int q = j < hlen && h[j] == '"';
            if (q) j++;
            while (j < hlen && (q ? h[j] != '"' : (h[j] != ';' && h[j] != ' ' && h[j] != '\r' && h[j] != '\n'))) {
                if (n + 1 < cap) out[n++] = h[j];
                j++;
            }
            out[n] = '\0';
            return 1;
        }
    }
    return 0;
}

/* Splits body into up to max parts; names live in names[] (2 x 256 bytes per part). Returns the
 * number of parts, or -1 with msg set when the body is not well-formed multipart. */
static int multipart_parse(const char *body, size_t len, const char *boundary, part *parts, int max,
                           char (*names)[2][256], char *msg, size_t msgcap) {
    char delim[256];
    int dl = snprintf(delim, sizeof delim, "--%s", boundary);
    if (dl <= 2 || dl >= (int)sizeof delim) return snprintf(msg, msgcap, "bad multipart boundary"), -1;
    const char *end = body + len;
    const char *p = memmem(body, len, delim, (size_t)dl);
    if (!p) return snprintf(msg, msgcap, "the multipart body has no boundary line"), -1;
    int n = 0;
    for (;;) {
        p += dl;
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return n; /* closing delimiter */
        while (p < end && (*p == ' ' || *p == '\t')) p++;
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') break;
        p += 2;
        const char *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) break;
        const char *data = hend + 4;
        char nd[260];
        int ndl = snprintf(nd, sizeof nd, "\r\n%s", delim);
        const char *next = memmem(data, (size_t)(end - data), nd, (size_t)ndl);
        if (!next) break;
        if (n < max) {
            names[n][0][0] = names[n][1][0] = '\0';
            int has_fn = 0;
            for (const char *h = p; h < hend;) {
                const char *le = memmem(h, (size_t)(hend - h), "\r\n", 2);
                if (!le) le = hend;
                if ((size_t)(le - h) > 20 && !strncasecmp(h, "Content-Disposition:", 20)) {
                    header_param(h + 20, (size_t)(le - h - 20), "name", names[n][0], 256);
                    has_fn = header_param(h + 20, (size_t)(le - h - 20), "filename", names[n][1], 256);
                }
                h = le + 2;
            }
            parts[n].name = names[n][0];
            parts[n].filename = has_fn ? names[n][1] : NULL;
            parts[n].data = data;
            parts[n].len = (size_t)(next - data);
            n++;
        }
        p = next + 2;
    }
    snprintf(msg, msgcap, "the multipart body is truncated or malformed");
    return -1;
}

/* ------------------------------------------------------------------ routes */

static void h_upload(void *ud, zs_http_req *r) {
    zs_files *f = ud;
    const char *ct = zs_http_req_header(r, "Content-Type");
    char boundary[200];
    if (!ct || strncasecmp(ct, "multipart/form-data", 19) || !header_param(ct, strlen(ct), "boundary", boundary, sizeof boundary) ||
        !boundary[0]) {
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, "invalid_content_type",
                              "Uploads must be multipart/form-data with the fields 'purpose' and 'file'.");
        return;
    }
    size_t len;
    const char *body = zs_http_req_body(r, &len);
    part parts[16];
    char names[16][2][256];
    char msg[256];
    int n = multipart_parse(body, len, boundary, parts, 16, names, msg, sizeof msg);
    if (n < 0) {
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, NULL, "Cannot parse the upload: %s.", msg);
        return;
    }
    const part *file = NULL, *purpose = NULL;
    for (int i = 0; i < n; i++) {
        if (!strcmp(parts[i].name, "file")) file = &parts[i];
        else if (!strcmp(parts[i].name, "purpose")) purpose = &parts[i];
    }
    if (!purpose) {
        zs_http_respond_error(r, 400, "invalid_request_error", "purpose", "missing_required_parameter",
                              "Missing required parameter: 'purpose'.");
        return;
    }
    if (purpose->len != 9 || memcmp(purpose->data, "fine-tune", 9)) {
        zs_http_respond_error(r, 400, "invalid_request_error", "purpose", "invalid_value",
                              "Invalid 'purpose': '%.*s'; this server accepts 'fine-tune'.",
                              (int)ZS_MIN(purpose->len, (size_t)64), purpose->data);
        return;
    }
    if (!file) {
        zs_http_respond_error(r, 400, "invalid_request_error", "file", "missing_required_parameter",
                              "Missing required parameter: 'file'.");
        return;
    }
    if (file->len > f->max_bytes) {
        zs_http_respond_error(r, 413, "invalid_request_error", "file", "file_too_large",
                              "The file has %zu bytes; the limit is %zu bytes.", file->len, f->max_bytes);
        return;
    }
    int n_examples = 0;
    int rc = zs_data_validate_buf(file->data, file->len, f->max_bytes, &n_examples);
    if (rc < 0) {
        int st = rc == ZS_ERANGE ? 413 : 400;
        zs_http_respond_error(r, st, "invalid_request_error", "file", st == 413 ? "file_too_large" : "invalid_file",
                              "Invalid training file: %s", zs_errmsg());
        return;
    }
    char id[64], path[4096];
    zs_persist_new_id("file-", id, sizeof id);
    const char *fname = file->filename && *file->filename ? file->filename : "file.jsonl";
    json_t *obj = json_pack("{s:s,s:s,s:I,s:I,s:s,s:s,s:s,s:n}", "id", id, "object", "file", "bytes",
                            (json_int_t)file->len, "created_at", (json_int_t)time(NULL), "filename", fname,
                            "purpose", "fine-tune", "status", "processed", "status_details");
    const zs_key_id *who = zs_http_req_who(r);
    if (obj && who) json_object_set_new(obj, "owner", json_string(who->tenant));
    snprintf(path, sizeof path, "%s/%s.jsonl", f->dir, id);
    rc = obj ? zs_persist_mkdirs(f->dir) : zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) rc = zs_persist_write(path, file->data, file->len);
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/%s.json", f->dir, id);
        rc = zs_persist_write_json(path, obj);
    }
    if (rc < 0) {
        json_decref(obj);
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "Cannot store the file: %s", zs_errmsg());
        return;
    }
    pthread_mutex_lock(&f->mu);
    json_array_append(f->list, obj);
    json_t *c = view(obj, who);
    pthread_mutex_unlock(&f->mu);
    zs_http_req_set_object(r, json_string_value(json_object_get(obj, "id")));
    json_decref(obj);
    zs_http_respond_json(r, 200, c);
}

static void h_list(void *ud, zs_http_req *r) {
    zs_files *f = ud;
    const zs_key_id *who = zs_http_req_who(r);
    json_t *data = json_array();
    size_t i;
    json_t *v;
    pthread_mutex_lock(&f->mu);
    json_array_foreach(f->list, i, v) if (sees(who, v)) json_array_append_new(data, view(v, who));
    pthread_mutex_unlock(&f->mu);
    zs_http_respond_json(r, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", 0));
}

static void h_get(void *ud, zs_http_req *r) {
    zs_files *f = ud;
    const char *id = zs_http_req_param(r);
    pthread_mutex_lock(&f->mu);
    const zs_key_id *who = zs_http_req_who(r);
    json_t *v = id ? find_locked(f, id, who) : NULL;
    json_t *c = v ? view(v, who) : NULL;
    pthread_mutex_unlock(&f->mu);
    if (!c) {
        zs_http_respond_error(r, 404, "invalid_request_error", "id", "file_not_found", "No such File object: %s",
                              id ? id : "");
        return;
    }
    zs_http_respond_json(r, 200, c);
}

/* ------------------------------------------------------------------ lifecycle */

static int by_created(const void *a, const void *b) {
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_int_t cx = json_integer_value(json_object_get(x, "created_at"));
    json_int_t cy = json_integer_value(json_object_get(y, "created_at"));
    if (cx != cy) return cx < cy ? -1 : 1;
    return strcmp(json_string_value(json_object_get(x, "id")), json_string_value(json_object_get(y, "id")));
}

static int load_records(zs_files *f) {
    DIR *d = opendir(f->dir);
    if (!d) return 0; /* nothing uploaded yet */
    json_t *items[4096];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json") || strncmp(de->d_name, "file-", 5)) continue;
        char path[4096], data[4200];
        snprintf(path, sizeof path, "%s/%s", f->dir, de->d_name);
        snprintf(data, sizeof data, "%sl", path);
        json_t *o = json_load_file(path, 0, NULL);
        FILE *df = fopen(data, "rb");
        if (df) fclose(df);
        if (o && df && json_is_string(json_object_get(o, "id"))) items[n++] = o;
        else json_decref(o);
    }
    closedir(d);
    qsort(items, n, sizeof *items, by_created);
    for (size_t i = 0; i < n; i++) json_array_append_new(f->list, items[i]);
    return 0;
}

int zs_files_open(zs_http *h, const char *data_dir, size_t max_bytes, zs_files **out) {
    zs_files *f = calloc(1, sizeof *f);
    if (!f) return zs_err(ZS_ENOMEM, "out of memory");
    pthread_mutex_init(&f->mu, NULL);
    f->max_bytes = max_bytes ? max_bytes : ZS_DATA_DEFAULT_MAX_BYTES;
    f->list = json_array();
    int rc = asprintf(&f->dir, "%s/files", data_dir) < 0 ? zs_err(ZS_ENOMEM, "out of memory") : 0;
    if (rc < 0) f->dir = NULL;
    if (!rc) rc = load_records(f); /* the directory is created by the first upload */
    if (!rc) rc = zs_http_route(h, "POST", "/v1/files", ZS_ROLE_FINETUNE, h_upload, f);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/files", ZS_ROLE_FINETUNE, h_list, f);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/files/{id}", ZS_ROLE_FINETUNE, h_get, f);
    if (rc < 0) {
        zs_files_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void zs_files_free(zs_files *f) {
    if (!f) return;
    json_decref(f->list);
    free(f->dir);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

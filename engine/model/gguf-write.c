/* gguf-write.c — the GGUF v3 writer: metadata and tensor infos serialized in memory as they are
 * added, tensor data streamed to <path>.tmp behind them, published by rename. See gguf-write.h. */
#include "gguf-write.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "fileio.h"
#include "strbuf.h"

#define GW_MAX_NAME 64 /* ggml's GGML_MAX_NAME: a name must be shorter */

typedef struct {
    char *name;
    zs_ggml_type type;
    int n_dims;
    int64_t ne[4];
    uint64_t offset, nbytes;
} gw_tensor;

struct zs_gguf_writer {
    char *path, *tmp;
    FILE *f;
    char *iobuf;
    sbuf kv;            /* serialized key/values */
    char **keys;        /* for the duplicate check */
    size_t n_kv, cap_kv;
    gw_tensor *t;
    size_t nt, cap_t;
    uint64_t data_bytes; /* declared, with padding */
    uint32_t alignment;
    int header_done, failed;
    size_t cur;          /* tensor being written */
    uint64_t cur_done;   /* bytes of it written */
};

/* ENOSPC, EDQUOT and EFBIG (a file size limit) are "no room"; the rest as fileio.h maps them. */
static int gw_code(int e) {
    if (e == ENOSPC || e == EDQUOT || e == EFBIG) return ZS_ENOSPC;
    return zs_errno_code(e);
}

static int gw_fail(zs_gguf_writer *w, int code) {
    w->failed = 1;
    return code;
}

static void gw_free(zs_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w->iobuf);
    for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->nt; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv.p);
    free(w->path);
    free(w->tmp);
    free(w);
}

int zs_gguf_writer_open(const char *path, zs_gguf_writer **out) {
    if (!path || !*path || !out) return zs_err(ZS_EINVAL, "zs_gguf_writer_open: NULL or empty path");
    zs_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    w->path = strdup(path);
    w->tmp = zs_str_printf("%s.tmp", path);
    w->iobuf = malloc(1 << 20);
    w->alignment = ZS_GGUF_DEFAULT_ALIGNMENT;
    if (!w->path || !w->tmp || !w->iobuf) {
        gw_free(w);
        return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    }
    int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(w->tmp);
        }
        int rc = zs_err(gw_code(e), "%s: cannot create the output file (as %s): %s", path, w->tmp, strerror(e));
        gw_free(w);
        return rc;
    }
    setvbuf(w->f, w->iobuf, _IOFBF, 1 << 20);
    *out = w;
    return 0;
}

const char *zs_gguf_writer_tmp_path(const zs_gguf_writer *w) { return w ? w->tmp : NULL; }

/* ---------------------------------------------------------------- metadata */

static void put_le(sbuf *b, uint64_t v, int n) {
    char t[8];
    for (int i = 0; i < n; i++) t[i] = (char)(v >> (8 * i));
    sb_addn(b, t, (size_t)n);
}

static void put_str(sbuf *b, const char *s, size_t n) {
    put_le(b, n, 8);
    if (n) sb_addn(b, s, n);
}

/* Checks the writer and the key, records the key, writes it and the value type. */
static int kv_begin(zs_gguf_writer *w, const char *key, int vtype) {
    if (!w) return zs_err(ZS_EINVAL, "gguf writer: NULL writer");
    if (w->failed) return zs_err(ZS_EINVAL, "%s: the GGUF writer failed earlier", w->path);
    if (w->header_done)
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: key '%s' added after tensor data was written", w->path,
                                 key ? key : "(null)"));
    if (!key || !*key) return gw_fail(w, zs_err(ZS_EINVAL, "%s: empty metadata key", w->path));
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return gw_fail(w, zs_err(ZS_EINVAL, "%s: metadata key '%s' added twice", w->path, key));
    if (w->n_kv == w->cap_kv) {
        size_t nc = w->cap_kv ? w->cap_kv * 2 : 32;
        char **nk = realloc(w->keys, nc * sizeof *nk);
        if (!nk) return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory", w->path));
        w->keys = nk;
        w->cap_kv = nc;
    }
    if (!(w->keys[w->n_kv] = strdup(key))) return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory", w->path));
    w->n_kv++;
    put_str(&w->kv, key, strlen(key));
    put_le(&w->kv, (uint32_t)vtype, 4);
    return 0;
}

static int kv_end(zs_gguf_writer *w) {
    if (w->kv.oom) return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory for the metadata", w->path));
    return 0;
}

int zs_gguf_writer_kv_strn(zs_gguf_writer *w, const char *key, const char *s, size_t len) {
    ZS_CHECK(kv_begin(w, key, ZS_GGUF_STR));
    put_str(&w->kv, s ? s : "", s ? len : 0);
    return kv_end(w);
}

int zs_gguf_writer_kv_str(zs_gguf_writer *w, const char *key, const char *s) {
    return zs_gguf_writer_kv_strn(w, key, s, s ? strlen(s) : 0);
}

static int kv_scalar(zs_gguf_writer *w, const char *key, int vtype, uint64_t bits, int n) {
    ZS_CHECK(kv_begin(w, key, vtype));
    put_le(&w->kv, bits, n);
    return kv_end(w);
}

int zs_gguf_writer_kv_u32(zs_gguf_writer *w, const char *key, uint32_t v) {
    if (w && key && !strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1)))
            return gw_fail(w, zs_err(ZS_EINVAL, "%s: general.alignment %u is not a power of two", w->path, v));
        if (w->nt)
            return gw_fail(w, zs_err(ZS_EINVAL, "%s: general.alignment set after tensors were declared", w->path));
        ZS_CHECK(kv_scalar(w, key, ZS_GGUF_U32, v, 4));
        w->alignment = v;
        return 0;
    }
    return kv_scalar(w, key, ZS_GGUF_U32, v, 4);
}

int zs_gguf_writer_kv_i32(zs_gguf_writer *w, const char *key, int32_t v) {
    return kv_scalar(w, key, ZS_GGUF_I32, (uint32_t)v, 4);
}

int zs_gguf_writer_kv_u64(zs_gguf_writer *w, const char *key, uint64_t v) {
    return kv_scalar(w, key, ZS_GGUF_U64, v, 8);
}

int zs_gguf_writer_kv_f32(zs_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return kv_scalar(w, key, ZS_GGUF_F32, u, 4);
}

int zs_gguf_writer_kv_bool(zs_gguf_writer *w, const char *key, bool v) {
    return kv_scalar(w, key, ZS_GGUF_BOOL, v ? 1 : 0, 1);
}

/* Bytes of one element of a numeric value type; 0 for STR, ARR and unknown ids. */
static int vtype_size(int t) {
    switch (t) {
    case ZS_GGUF_U8: case ZS_GGUF_I8: case ZS_GGUF_BOOL: return 1;
    case ZS_GGUF_U16: case ZS_GGUF_I16: return 2;
    case ZS_GGUF_U32: case ZS_GGUF_I32: case ZS_GGUF_F32: return 4;
    case ZS_GGUF_U64: case ZS_GGUF_I64: case ZS_GGUF_F64: return 8;
    default: return 0;
    }
}

int zs_gguf_writer_kv_arr(zs_gguf_writer *w, const char *key, int elem, const void *data, size_t n) {
    int es = vtype_size(elem);
    if (w && !w->failed && (!es || (n && !data)))
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: key '%s': %s", w->path, key ? key : "(null)",
                                 !es ? "array element type must be a number or bool" : "NULL array data"));
    ZS_CHECK(kv_begin(w, key, ZS_GGUF_ARR));
    put_le(&w->kv, (uint32_t)elem, 4);
    put_le(&w->kv, n, 8);
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { /* the host may not be little-endian: go through the value */
        uint64_t v = 0;
        if (es == 1) v = elem == ZS_GGUF_BOOL ? p[i] != 0 : p[i];
        else if (es == 2) { uint16_t x; memcpy(&x, p + 2 * i, 2); v = x; }
        else if (es == 4) { uint32_t x; memcpy(&x, p + 4 * i, 4); v = x; }
        else memcpy(&v, p + 8 * i, 8);
        put_le(&w->kv, v, es);
    }
    return kv_end(w);
}

int zs_gguf_writer_kv_arr_str(zs_gguf_writer *w, const char *key, const char *const *s,
                              const size_t *len, size_t n) {
    if (w && !w->failed && n && !s)
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: key '%s': NULL string array", w->path, key ? key : "(null)"));
    ZS_CHECK(kv_begin(w, key, ZS_GGUF_ARR));
    put_le(&w->kv, ZS_GGUF_STR, 4);
    put_le(&w->kv, n, 8);
    for (size_t i = 0; i < n; i++) {
        const char *e = s[i] ? s[i] : "";
        put_str(&w->kv, e, s[i] ? (len ? len[i] : strlen(e)) : 0);
    }
    return kv_end(w);
}

/* ---------------------------------------------------------------- tensors */

int zs_gguf_writer_add_tensor(zs_gguf_writer *w, const char *name, zs_ggml_type type, int n_dims,
                              const int64_t *ne) {
    if (!w) return zs_err(ZS_EINVAL, "gguf writer: NULL writer");
    if (w->failed) return zs_err(ZS_EINVAL, "%s: the GGUF writer failed earlier", w->path);
    const char *nm = name ? name : "(null)";
    if (w->header_done)
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: tensor '%s' declared after tensor data was written", w->path, nm));
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl >= GW_MAX_NAME)
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: tensor name '%s' is %zu bytes (1 to %d allowed)", w->path, nm, nl,
                                 GW_MAX_NAME - 1));
    if (n_dims < 1 || n_dims > ZS_GGUF_MAX_DIMS || !ne)
        return gw_fail(w, zs_err(ZS_EINVAL, "%s: tensor '%s' has %d dimensions (1 to %d allowed)", w->path, nm,
                                 n_dims, ZS_GGUF_MAX_DIMS));
    for (size_t i = 0; i < w->nt; i++)
        if (!strcmp(w->t[i].name, name))
            return gw_fail(w, zs_err(ZS_EINVAL, "%s: tensor '%s' declared twice", w->path, nm));
    size_t nbytes;
    int rc = zs_gguf_tensor_nbytes((int)type, n_dims, ne, &nbytes);
    if (rc < 0) return gw_fail(w, zs_err_prefix(ZS_EINVAL, "%s: tensor '%s'", w->path, nm));
    if (w->nt == w->cap_t) {
        size_t nc = w->cap_t ? w->cap_t * 2 : 64;
        gw_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt) return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory", w->path));
        w->t = nt;
        w->cap_t = nc;
    }
    gw_tensor *t = &w->t[w->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory", w->path));
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->offset = w->data_bytes;
    t->nbytes = nbytes;
    uint64_t padded = ZS_ALIGN_UP((uint64_t)nbytes, (uint64_t)w->alignment);
    if (padded < nbytes || w->data_bytes + padded < w->data_bytes) {
        free(t->name);
        return gw_fail(w, zs_err(ZS_ERANGE, "%s: tensor data size overflows", w->path));
    }
    w->data_bytes += padded;
    w->nt++;
    return 0;
}

size_t zs_gguf_writer_tensor_count(const zs_gguf_writer *w) { return w ? w->nt : 0; }
uint64_t zs_gguf_writer_data_bytes(const zs_gguf_writer *w) { return w ? w->data_bytes : 0; }

/* ---------------------------------------------------------------- data */

static int file_write(zs_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n) {
        int e = errno;
        return gw_fail(w, zs_err(gw_code(e), "%s: cannot write the output file (as %s): %s", w->path, w->tmp,
                                 strerror(e)));
    }
    return 0;
}

static int write_zeros(zs_gguf_writer *w, size_t n) {
    static const char z[64];
    while (n) {
        size_t k = ZS_MIN(n, sizeof z);
        ZS_CHECK(file_write(w, z, k));
        n -= k;
    }
    return 0;
}

/* Header, metadata, tensor infos, padding to the data section. */
static int write_header(zs_gguf_writer *w) {
    sbuf h = {0};
    sb_addn(&h, "GGUF", 4);
    put_le(&h, 3, 4);
    put_le(&h, w->nt, 8);
    put_le(&h, w->n_kv, 8);
    sb_addn(&h, w->kv.p, w->kv.len);
    for (size_t i = 0; i < w->nt; i++) {
        const gw_tensor *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_le(&h, (uint32_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims; d++) put_le(&h, (uint64_t)t->ne[d], 8);
        put_le(&h, (uint32_t)t->type, 4);
        put_le(&h, t->offset, 8);
    }
    if (h.oom) {
        free(h.p);
        return gw_fail(w, zs_err(ZS_ENOMEM, "%s: out of memory for the header", w->path));
    }
    size_t len = h.len;
    int rc = file_write(w, h.p, len);
    free(h.p);
    if (rc == 0) rc = write_zeros(w, ZS_ALIGN_UP(len, (size_t)w->alignment) - len);
    w->header_done = 1;
    free(w->kv.p); /* serialized: no longer needed */
    memset(&w->kv, 0, sizeof w->kv);
    return rc;
}

/* Pads the finished tensor cur and moves on to the next one. */
static int next_tensor(zs_gguf_writer *w) {
    const gw_tensor *t = &w->t[w->cur];
    ZS_CHECK(write_zeros(w, (size_t)(ZS_ALIGN_UP(t->nbytes, (uint64_t)w->alignment) - t->nbytes)));
    w->cur++;
    w->cur_done = 0;
    return 0;
}

int zs_gguf_writer_write(zs_gguf_writer *w, const void *data, size_t n) {
    if (!w) return zs_err(ZS_EINVAL, "gguf writer: NULL writer");
    if (w->failed) return zs_err(ZS_EINVAL, "%s: the GGUF writer failed earlier", w->path);
    if (!w->header_done) ZS_CHECK(write_header(w));
    if (n && !data) return gw_fail(w, zs_err(ZS_EINVAL, "%s: NULL tensor data", w->path));
    const char *p = data;
    while (n) {
        if (w->cur >= w->nt)
            return gw_fail(w, zs_err(ZS_EINVAL, "%s: %zu bytes of tensor data past the declared tensors", w->path, n));
        const gw_tensor *t = &w->t[w->cur];
        size_t k = (size_t)ZS_MIN((uint64_t)n, t->nbytes - w->cur_done);
        ZS_CHECK(file_write(w, p, k));
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) ZS_CHECK(next_tensor(w));
    }
    return 0;
}

void zs_gguf_writer_abort(zs_gguf_writer *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
    }
    unlink(w->tmp);
    gw_free(w);
}

int zs_gguf_writer_close(zs_gguf_writer *w) {
    if (!w) return zs_err(ZS_EINVAL, "gguf writer: NULL writer");
    int rc = 0;
    if (w->failed) rc = zs_err(ZS_EINVAL, "%s: the GGUF writer failed earlier; no file written", w->path);
    if (rc == 0 && !w->header_done) rc = write_header(w);
    if (rc == 0 && w->cur < w->nt)
        rc = zs_err(ZS_EINVAL, "%s: tensor '%s' got %" PRIu64 " of its %" PRIu64 " bytes; no file written", w->path,
                    w->t[w->cur].name, w->cur_done, w->t[w->cur].nbytes);
    if (rc == 0 && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)) {
        int e = errno;
        rc = zs_err(gw_code(e), "%s: cannot write the output file (as %s): %s", w->path, w->tmp, strerror(e));
    }
    if (rc == 0) {
        FILE *f = w->f;
        w->f = NULL;
        if (fclose(f) != 0) {
            int e = errno;
            rc = zs_err(gw_code(e), "%s: cannot write the output file (as %s): %s", w->path, w->tmp, strerror(e));
        } else if (rename(w->tmp, w->path) != 0) {
            int e = errno;
            rc = zs_err(gw_code(e), "%s: cannot rename %s into place: %s", w->path, w->tmp, strerror(e));
        }
    }
    if (rc < 0) {
        zs_gguf_writer_abort(w);
        return rc;
    }
    char *dir = strdup(w->path);
    if (dir) {
        char *sl = strrchr(dir, '/');
        const char *dp = sl ? (sl == dir ? "/" : (*sl = 0, dir)) : ".";
        (void)zs_fsync_dir(dp); /* the file is in place; a directory that cannot be synced is tolerated */
        free(dir);
    }
    zs_err_clear();
    gw_free(w);
    return 0;
}

/* export.c — the consolidated Hugging Face save of a training run, in any element dtype, streamed
 * bucket by bucket: a plan of the output tensors (names, shapes, first and last contributing
 * bucket) from the model's slot sources, the safetensors header in completion order, then each
 * bucket's fp32 data turned into the tensors it completes. See export.h. */
#include "export.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cluster.h"
#include "common.h"
#include "safetensors.h"

#define EX_CHUNK_DEFAULT 16384

static _Thread_local size_t ex_chunk_set;        /* 0: EX_CHUNK_DEFAULT */
static _Thread_local size_t ex_held, ex_peak;    /* bytes of weight data, now and at the peak */
static _Thread_local int ex_buffered;            /* test hook: every tensor through an fp32 buffer */

static size_t ex_chunk(void) { return ex_chunk_set ? ex_chunk_set : EX_CHUNK_DEFAULT; }
void zs_train_export_set_chunk(size_t elems) { ex_chunk_set = elems; }
void zs_train_export_set_buffered(int on) { ex_buffered = on; }
size_t zs_train_export_scratch_bytes(void) { return ex_chunk() * (sizeof(float) + 2); }
size_t zs_train_export_peak_bytes(void) { return ex_peak; }

static void hold(size_t bytes) {
    ex_held += bytes;
    if (ex_held > ex_peak) ex_peak = ex_held;
}
static void unhold(size_t bytes) { ex_held -= ZS_MIN(bytes, ex_held); }

/* torch's name of an element dtype (config.json's torch_dtype) */
static const char *torch_name(zs_dtype d) {
    return d == ZS_F16 ? "float16" : d == ZS_BF16 ? "bfloat16" : "float32";
}

/* ---- the plan ---- */

typedef struct {
    const char *name;     /* owned by the model */
    int ndim;
    int64_t shape[2];     /* [rows, cols]; cols 1 for a vector */
    size_t n;             /* elements */
    int first, last;      /* contributing buckets */
    size_t cover;         /* elements its slots cover (a sanity check) */
    float *buf;           /* a tensor spanning buckets: fp32, from its first bucket to its last */
} ex_tensor;

typedef struct {
    int t;                /* its tensor */
    int kind, resident;
    int64_t col0, out, in;
    size_t off;           /* f32 elements into the bucket's full data (sharded) or rmaster[b] (resident) */
    size_t n;             /* elements of the slot that go to the tensor */
} ex_part;

typedef struct {
    ex_tensor *t;
    ex_part *p;
    int nt, np;
    int *pstart;          /* [n_buckets + 1]: bucket b's parts are p[pstart[b] .. pstart[b+1]) */
    int *ord;             /* tensors in declaration (= write) order */
    int *cstart;          /* [n_buckets + 1]: the tensors completed by bucket b are ord[cstart[b] ..] */
    int *hash;            /* open addressing over tensor names: tensor index + 1, 0 empty */
    size_t hcap;
} ex_plan;

static void plan_free(ex_plan *P) {
    for (int i = 0; P->t && i < P->nt; i++) free(P->t[i].buf);
    free(P->t);
    free(P->p);
    free(P->pstart);
    free(P->ord);
    free(P->cstart);
    free(P->hash);
    memset(P, 0, sizeof *P);
}

static size_t name_hash(const char *s) {
    size_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The tensor named src->name (made on first sight); its index, or a negative error. */
static int plan_tensor(ex_plan *P, const zs_slot_source *src, int b) {
    size_t h = name_hash(src->name) & (P->hcap - 1);
    while (P->hash[h]) {
        ex_tensor *x = &P->t[P->hash[h] - 1];
        if (!strcmp(x->name, src->name)) {
            if (x->ndim != src->ndim || x->shape[0] != src->shape[0] || x->shape[1] != src->shape[1])
                return zs_err(ZS_EFORMAT, "export: tensor '%s' has two shapes in the model's slot sources", src->name);
            return P->hash[h] - 1;
        }
        h = (h + 1) & (P->hcap - 1);
    }
    if (src->ndim < 0 || src->ndim > 2 || src->shape[0] < 1 || src->shape[1] < 1)
        return zs_err(ZS_EFORMAT, "export: tensor '%s' has an unexpected shape (%d dimensions, [%lld, %lld])",
                      src->name, src->ndim, (long long)src->shape[0], (long long)src->shape[1]);
    ex_tensor *x = &P->t[P->nt];
    memset(x, 0, sizeof *x);
    x->name = src->name;
    x->ndim = src->ndim;
    x->shape[0] = src->shape[0];
    x->shape[1] = src->shape[1];
    x->n = (size_t)src->shape[0] * (size_t)src->shape[1];
    x->first = b;
    P->hash[h] = ++P->nt;
    return P->nt - 1;
}

/* Does the slot (out x in, cut as src says) fit inside its tensor? */
static int part_fits(const ex_part *p, const ex_tensor *x) {
    int64_t rows = x->shape[0], cols = x->shape[1], n = (int64_t)x->n;
    if (p->col0 < 0 || p->out < 1 || p->in < 1) return 0;
    switch (p->kind) {
    case ZS_SRC_COPY: return p->out * p->in == n;
    case ZS_SRC_VEC_SLICE: return p->col0 + p->out <= n;
    case ZS_SRC_ROW_SLICE: return cols == p->in && p->col0 + p->out <= rows;
    case ZS_SRC_TRANSPOSE_COLS: return x->ndim == 2 && rows == p->in && p->col0 + p->out <= cols;
    default: return 0;
    }
}

static int plan_build(const zs_export_src *s, ex_plan *P) {
    const zs_model *m = s->m;
    int nb = s->n_buckets;
    size_t maxt = (size_t)nb * ZS_MAX_ROLES;
    P->hcap = 64;
    while (P->hcap < 2 * maxt) P->hcap *= 2;
    P->t = calloc(maxt, sizeof *P->t);
    P->p = calloc(maxt, sizeof *P->p);
    P->pstart = calloc((size_t)nb + 1, sizeof(int));
    P->ord = calloc(maxt, sizeof(int));
    P->cstart = calloc((size_t)nb + 2, sizeof(int));
    P->hash = calloc(P->hcap, sizeof(int));
    if (!P->t || !P->p || !P->pstart || !P->ord || !P->cstart || !P->hash) return zs_err(ZS_ENOMEM, "export: out of memory");
    for (int b = 0; b < nb; b++) {
        P->pstart[b] = P->np;
        const zs_bucket_layout *L = zs_model_layout(m, b), *G = zs_model_grad_layout(m, b);
        for (int r = 0; r < L->n_roles; r++) {
            const zs_slot *a = &L->slot[r];
            zs_slot_source src;
            if (!a->present) continue;
            int rc = zs_model_slot_source(m, b, r, &src);
            if (rc == ZS_ENOTFOUND) continue; /* a slot with no checkpoint tensor */
            if (rc < 0) return rc;
            int ti = plan_tensor(P, &src, b);
            if (ti < 0) return ti;
            ex_tensor *x = &P->t[ti];
            ex_part *p = &P->p[P->np++];
            p->t = ti;
            p->kind = src.kind;
            p->resident = a->resident;
            p->col0 = src.col0;
            p->out = a->shape[0];
            p->in = a->ndim > 1 ? a->shape[1] : 1;
            p->n = (size_t)(p->kind == ZS_SRC_VEC_SLICE ? p->out : p->out * p->in);
            if (!part_fits(p, x))
                return zs_err(ZS_EFORMAT, "export: bucket %d role %d ([%lld, %lld], kind %d from %lld) does not fit "
                              "its tensor '%s' [%lld, %lld]", b, r, (long long)p->out, (long long)p->in, p->kind,
                              (long long)p->col0, x->name, (long long)x->shape[0], (long long)x->shape[1]);
            if (a->resident) {
                p->off = G->slot[r].offset / sizeof(float);
                if (p->off + p->n > G->resident_bytes / sizeof(float))
                    return zs_err(ZS_EFORMAT, "export: bucket %d role %d lies outside the resident area", b, r);
                if (s->writer && (!s->rmaster || !s->rmaster[b]))
                    return zs_err(ZS_EINVAL, "export: bucket %d has resident tensors but no resident masters", b);
            } else {
                if (zs_dtype_size(a->dtype) != s->dsize || a->offset % s->dsize)
                    return zs_err(ZS_EINVAL, "export: bucket %d role %d is stored in %s, not in %zu-byte elements",
                                  b, r, zs_dtype_name(a->dtype), s->dsize);
                p->off = a->offset / s->dsize;
                if (p->off + p->n > s->max_full)
                    return zs_err(ZS_EINVAL, "export: bucket %d role %d lies beyond max_full (%zu floats)", b, r,
                                  s->max_full);
            }
            x->last = b;
            x->cover += p->n;
        }
    }
    P->pstart[nb] = P->np;
    for (int i = 0; i < P->nt; i++)
        if (P->t[i].cover < P->t[i].n)
            return zs_err(ZS_EFORMAT, "export: the model's slots cover %zu of the %zu elements of tensor '%s'",
                          P->t[i].cover, P->t[i].n, P->t[i].name);
    /* declaration order: by last bucket, then first appearance (a counting sort keeps that order) */
    for (int i = 0; i < P->nt; i++) P->cstart[P->t[i].last + 1]++;
    for (int b = 0; b < nb; b++) P->cstart[b + 1] += P->cstart[b];
    int *fill = calloc((size_t)nb + 1, sizeof(int));
    if (!fill) return zs_err(ZS_ENOMEM, "export: out of memory");
    for (int i = 0; i < P->nt; i++) P->ord[P->cstart[P->t[i].last] + fill[P->t[i].last]++] = i;
    free(fill);
    return 0;
}

/* ---- copying slots into tensors ---- */

/* Writes the elements [j0, j1) of tensor x that part p covers into dst[j - j0]; w is the slot's
 * fp32 data ([out, in] rows). */
static void scatter(const ex_part *p, const ex_tensor *x, const float *w, float *dst, size_t j0, size_t j1) {
    size_t out = (size_t)p->out, in = (size_t)p->in, col0 = (size_t)p->col0;
    if (p->kind == ZS_SRC_TRANSPOSE_COLS) {
        /* our [out, in] rows are columns col0.. of an [in, cols] tensor: (i, col0 + o) = w[o * in + i] */
        size_t cols = (size_t)x->shape[1];
        size_t i1 = ZS_MIN(in, (j1 + cols - 1) / cols);
        for (size_t i = j0 / cols; i < i1; i++) {
            size_t rb = i * cols, a = ZS_MAX(rb + col0, j0), e = ZS_MIN(rb + col0 + out, j1);
            for (size_t j = a; j < e; j++) dst[j - j0] = w[(j - rb - col0) * in + i];
        }
        return;
    }
    /* copy, vector slice, row slice: one contiguous run from base */
    size_t base = p->kind == ZS_SRC_COPY ? 0 : p->kind == ZS_SRC_VEC_SLICE ? col0 : col0 * in;
    size_t a = ZS_MAX(base, j0), e = ZS_MIN(base + p->n, j1);
    if (a < e) memcpy(dst + (a - j0), w + (a - base), (e - a) * sizeof(float));
}

typedef struct {
    const zs_export_src *s;
    ex_plan *P;
    zs_dtype dt;
    zs_st_writer *wr;
    float *full;
    float *chunk;         /* ex_chunk() floats */
    uint16_t *half;       /* ex_chunk() 16-bit elements */
} ex_run;

static const float *part_data(const ex_run *X, int b, const ex_part *p) {
    return p->resident ? X->s->rmaster[b] + p->off : X->full + p->off;
}

/* n fp32 elements to the file in the output dtype */
static int emit(ex_run *X, const float *src, size_t n) {
    if (X->dt == ZS_F32) return zs_st_writer_write(X->wr, src, n * sizeof(float));
    size_t c = ex_chunk();
    for (size_t k = 0; k < n; k += c) {
        size_t len = ZS_MIN(c, n - k);
        zs_convert(X->half, X->dt, src + k, ZS_F32, len);
        ZS_CHECK(zs_st_writer_write(X->wr, X->half, len * 2));
    }
    return 0;
}

/* A tensor within bucket b alone, from the bucket's data. */
static int write_streamed(ex_run *X, int b, int ti) {
    ex_plan *P = X->P;
    const ex_tensor *x = &P->t[ti];
    const ex_part *only = NULL;
    int parts = 0;
    for (int k = P->pstart[b]; k < P->pstart[b + 1]; k++)
        if (P->p[k].t == ti) { only = &P->p[k]; parts++; }
    if (parts == 1 && only->kind != ZS_SRC_TRANSPOSE_COLS && only->n == x->n) /* the slot is the tensor */
        return emit(X, part_data(X, b, only), x->n);
    size_t c = ex_chunk();
    for (size_t j0 = 0; j0 < x->n; j0 += c) {
        size_t j1 = ZS_MIN(x->n, j0 + c);
        memset(X->chunk, 0, (j1 - j0) * sizeof(float));
        for (int k = P->pstart[b]; k < P->pstart[b + 1]; k++)
            if (P->p[k].t == ti) scatter(&P->p[k], x, part_data(X, b, &P->p[k]), X->chunk, j0, j1);
        ZS_CHECK(emit(X, X->chunk, j1 - j0));
    }
    return 0;
}

/* Bucket b's data is in X->full: its share of the spanning tensors, then every tensor it completes. */
static int write_bucket(ex_run *X, int b) {
    ex_plan *P = X->P;
    for (int k = P->pstart[b]; k < P->pstart[b + 1]; k++) {
        ex_part *p = &P->p[k];
        ex_tensor *x = &P->t[p->t];
        if (x->first == x->last && !ex_buffered) continue;
        if (!x->buf) {
            x->buf = calloc(x->n, sizeof(float));
            if (!x->buf) return zs_err(ZS_ENOMEM, "export: out of memory for tensor '%s'", x->name);
            hold(x->n * sizeof(float));
        }
        scatter(p, x, part_data(X, b, p), x->buf, 0, x->n);
    }
    for (int i = P->cstart[b]; i < P->cstart[b + 1]; i++) {
        ex_tensor *x = &P->t[P->ord[i]];
        if (x->first == x->last && !ex_buffered) {
            ZS_CHECK(write_streamed(X, b, P->ord[i]));
            continue;
        }
        ZS_CHECK(emit(X, x->buf, x->n));
        free(x->buf);
        x->buf = NULL;
        unhold(x->n * sizeof(float));
    }
    return 0;
}

/* ---- files ---- */

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, int required) {
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/%s", src_dir, name);
    snprintf(b, sizeof b, "%s/%s", dst_dir, name);
    FILE *in = fopen(a, "rb");
    if (!in) return required ? zs_err(ZS_ENOTFOUND, "export: cannot read %s", a) : 0;
    FILE *out = fopen(b, "wb");
    if (!out) {
        fclose(in);
        return zs_err(ZS_EIO, "export: cannot write %s: %s", b, strerror(errno));
    }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    if (ferror(in) && rc == 0) rc = zs_err(ZS_EIO, "export: cannot read %s", a);
    fclose(in);
    if (fclose(out) != 0 && rc == 0) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    return rc;
}

/* config.json: copied as it is when its dtype keys name dt (or, absent, dt is f32, what a missing
 * torch_dtype means); otherwise rewritten with "torch_dtype" (and "dtype" where present) set. */
static int write_config(const char *src_dir, const char *dst_dir, zs_dtype dt) {
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/config.json", src_dir);
    snprintf(b, sizeof b, "%s/config.json", dst_dir);
    json_error_t je;
    json_t *root = json_load_file(a, 0, &je);
    if (!root) return zs_err(ZS_EFORMAT, "export: cannot read %s: %s (line %d)", a, je.text, je.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return zs_err(ZS_EFORMAT, "export: %s is not a JSON object", a);
    }
    const char *want = torch_name(dt);
    json_t *td = json_object_get(root, "torch_dtype"), *d = json_object_get(root, "dtype");
    int differs = (td && (!json_is_string(td) || strcmp(json_string_value(td), want))) ||
                  (d && (!json_is_string(d) || strcmp(json_string_value(d), want))) || (!td && !d && dt != ZS_F32);
    if (!differs) {
        json_decref(root);
        return copy_file(src_dir, dst_dir, "config.json", 1);
    }
    int rc = 0;
    if ((td || !d) && json_object_set_new(root, "torch_dtype", json_string(want)) < 0) rc = ZS_ENOMEM;
    if (d && json_object_set_new(root, "dtype", json_string(want)) < 0) rc = ZS_ENOMEM;
    char *text = rc == 0 ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) return zs_err(ZS_ENOMEM, "export: out of memory writing %s", b);
    FILE *f = fopen(b, "wb");
    if (!f) {
        free(text);
        return zs_err(ZS_EIO, "export: cannot write %s: %s", b, strerror(errno));
    }
    size_t n = strlen(text);
    if (fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    if (fclose(f) != 0 && rc == 0) rc = zs_err(ZS_EIO, "export: cannot write %s", b);
    free(text);
    return rc;
}

static void remove_tree(const char *path) {
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) zs_log_warn("export: could not remove %s", path);
}

/* mkdir -p of path, which must not exist yet */
static int make_dirs(const char *path) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path);
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            return zs_err(e == EACCES || e == EROFS || e == EPERM ? ZS_EPERM : ZS_EIO, "export: cannot create %s: %s", p,
                          strerror(e));
        }
        *q = '/';
    }
    if (mkdir(p, 0777) != 0) {
        int e = errno;
        return zs_err(e == EACCES || e == EROFS || e == EPERM ? ZS_EPERM : ZS_EIO, "export: cannot create %s: %s", p,
                      strerror(e));
    }
    return 0;
}

/* out_dir.tmp -> out_dir; the old out_dir is moved aside first and put back if the move fails */
static int publish(const char *tmp, const char *out_dir) {
    char old[4200];
    snprintf(old, sizeof old, "%s.tmp-old", out_dir);
    struct stat sb;
    int had = lstat(out_dir, &sb) == 0;
    if (had) {
        remove_tree(old);
        if (rename(out_dir, old) != 0)
            return zs_err(ZS_EIO, "export: cannot move the old %s aside: %s", out_dir, strerror(errno));
    }
    if (rename(tmp, out_dir) != 0) {
        int e = errno;
        if (had && rename(old, out_dir) != 0) zs_log_warn("export: the old %s is left at %s", out_dir, old);
        return zs_err(ZS_EIO, "export: cannot move %s to %s: %s", tmp, out_dir, strerror(e));
    }
    if (had) remove_tree(old);
    return 0;
}

int zs_train_export_base_dtype(const char *dir, zs_dtype *out) {
    zs_st_set *st = NULL;
    ZS_CHECK(zs_st_open_dir(dir, &st));
    uint64_t mat[ZS_DTYPE_ELEM_COUNT] = {0}, all[ZS_DTYPE_ELEM_COUNT] = {0};
    for (size_t i = 0; i < zs_st_count(st); i++) {
        const zs_st_tensor *t = zs_st_at(st, i);
        if ((unsigned)t->dtype >= ZS_DTYPE_ELEM_COUNT) continue; /* the reader accepts only these */
        all[t->dtype] += t->nbytes;
        if (t->ndim >= 2) mat[t->dtype] += t->nbytes;
    }
    zs_st_close(st);
    const uint64_t *by = mat[ZS_F32] + mat[ZS_F16] + mat[ZS_BF16] > 0 ? mat : all;
    static const zs_dtype pref[] = {ZS_F32, ZS_BF16, ZS_F16}; /* ties: the wider type */
    zs_dtype best = ZS_F32;
    for (int k = 1; k < 3; k++)
        if (by[pref[k]] > by[best]) best = pref[k];
    *out = best;
    return 0;
}

/* ---- the export ---- */

int zs_train_export_write(const zs_export_src *s, const char *out_dir, zs_dtype dtype) {
    ex_held = ex_peak = 0;
    if (!s || !s->m || !s->get || !out_dir || !*out_dir || s->n_buckets != zs_model_n_buckets(s->m) ||
        (s->dsize != 2 && s->dsize != 4))
        return zs_err(ZS_EINVAL, "export: invalid arguments (model, callback, directory, buckets or element size)");
    if (dtype != ZS_F32 && dtype != ZS_F16 && dtype != ZS_BF16 && dtype != ZS_DTYPE_COUNT)
        return zs_err(ZS_EINVAL, "export: cannot write %s weights (F32, F16 or BF16)", zs_dtype_name(dtype));
    if (strchr(out_dir, '\'') || strlen(out_dir) > 4000)
        return zs_err(ZS_EINVAL, "export: the directory name %s is too long or has a single quote", out_dir);
    const zs_model *m = s->m;
    char tmp[4200], path[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_dir);
    ex_plan P = {0};
    ex_run X = {s, &P, dtype, NULL, NULL, NULL, NULL};
    int rc = 0, made = 0;
    zs_st_decl *d = NULL;
    /* set-up: every failure here is agreed on before the first get() */
    X.full = zs_aligned_alloc(64, (s->max_full + 16) * sizeof(float));
    if (!X.full) rc = zs_err(ZS_ENOMEM, "export: out of memory for a bucket of %zu floats", s->max_full);
    else hold(s->max_full * sizeof(float));
    if (rc == 0 && s->writer) {
        const char *dir = zs_model_dir(m);
        rc = plan_build(s, &P);
        if (rc == 0 && dtype == ZS_DTYPE_COUNT) rc = zs_train_export_base_dtype(dir, &X.dt);
        if (rc == 0) {
            X.chunk = malloc(ex_chunk() * sizeof(float));
            X.half = malloc(ex_chunk() * 2);
            d = calloc((size_t)P.nt + 1, sizeof *d);
            if (!X.chunk || !X.half || !d) rc = zs_err(ZS_ENOMEM, "export: out of memory");
            else hold(zs_train_export_scratch_bytes());
        }
        if (rc == 0) {
            remove_tree(tmp);
            if ((rc = make_dirs(tmp)) == 0) made = 1;
        }
        for (int i = 0; rc == 0 && i < P.nt; i++) {
            const ex_tensor *x = &P.t[P.ord[i]];
            d[i].name = x->name;
            d[i].dtype = X.dt;
            d[i].ndim = x->ndim;
            for (int k = 0; k < x->ndim; k++) d[i].shape[k] = x->shape[k];
        }
        char meta[160];
        snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"zeroserve\":\"fine-tuned\",\"dtype\":\"%s\"}", torch_name(X.dt));
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if (rc == 0) rc = zs_st_writer_open(path, d, (size_t)P.nt, meta, &X.wr);
        if (rc == 0) rc = write_config(dir, tmp, X.dt);
        if (rc == 0) rc = copy_file(dir, tmp, "tokenizer.json", 1);
        if (rc == 0) rc = copy_file(dir, tmp, "tokenizer_config.json", 0);
        if (rc == 0) rc = copy_file(dir, tmp, "generation_config.json", 0);
        if (rc == 0) rc = copy_file(dir, tmp, "special_tokens_map.json", 0);
    }
    if (s->collective) {
        int all = rc, crc = zs_cluster_min_int(rc, &all);
        if (rc == 0 && crc < 0) rc = crc;
        else if (rc == 0 && all < 0) rc = zs_err(all, "export: another process failed before the gathers (see its log)");
        if (crc < 0 || all < 0) goto done; /* nobody gathers */
    }
    /* the buckets in order; a failed writer of a collective export still takes part in every gather */
    for (int b = 0; b < s->n_buckets; b++) {
        if (rc < 0 && !s->collective) break;
        int g = s->get(s->ud, b, X.full);
        if (g < 0) {
            if (rc == 0) rc = g;
            break;
        }
        if (s->writer && rc == 0) rc = write_bucket(&X, b);
    }
    if (s->writer && rc == 0) {
        rc = zs_st_writer_close(X.wr);
        X.wr = NULL;
        if (rc == 0) rc = publish(tmp, out_dir);
    }
done:
    if (X.wr) zs_st_writer_abort(X.wr);
    if (rc < 0 && made) remove_tree(tmp);
    plan_free(&P);
    free(d);
    free(X.full);
    free(X.chunk);
    free(X.half);
    ex_held = 0;
    return rc;
}

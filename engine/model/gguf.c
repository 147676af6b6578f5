/* gguf.c — GGUF v2/v3 reader: mmaps the file, parses and validates the header, metadata
 * key/values (every value type, nested arrays) and tensor infos with overflow-checked
 * arithmetic, checking every length against the bytes left before allocating for it, and
 * serves keys and tensors through hash tables. See gguf.h for ownership and thread-safety. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* ---------- type tables ---------- */

static const char *const vtype_names[ZS_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
/* size in bytes of a scalar value type (0 for string and array) */
static const uint8_t vtype_size[ZS_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *zs_gguf_vtype_name(int t) {
    return t >= 0 && t < ZS_GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

typedef struct {
    const char *name;
    uint32_t blck, bytes;
} gg_type_info;

/* Block sizes from ggml's type traits (QK_K = 256). Gaps are ids ggml removed. */
static const gg_type_info type_info[ZS_GGML_TYPE_COUNT] = {
    [ZS_GGML_F32] = {"F32", 1, 4},          [ZS_GGML_F16] = {"F16", 1, 2},
    [ZS_GGML_Q4_0] = {"Q4_0", 32, 18},      [ZS_GGML_Q4_1] = {"Q4_1", 32, 20},
    [ZS_GGML_Q5_0] = {"Q5_0", 32, 22},      [ZS_GGML_Q5_1] = {"Q5_1", 32, 24},
    [ZS_GGML_Q8_0] = {"Q8_0", 32, 34},      [ZS_GGML_Q8_1] = {"Q8_1", 32, 40},
    [ZS_GGML_Q2_K] = {"Q2_K", 256, 84},     [ZS_GGML_Q3_K] = {"Q3_K", 256, 110},
    [ZS_GGML_Q4_K] = {"Q4_K", 256, 144},    [ZS_GGML_Q5_K] = {"Q5_K", 256, 176},
    [ZS_GGML_Q6_K] = {"Q6_K", 256, 210},    [ZS_GGML_Q8_K] = {"Q8_K", 256, 292},
    [ZS_GGML_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [ZS_GGML_IQ2_XS] = {"IQ2_XS", 256, 74},
    [ZS_GGML_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [ZS_GGML_IQ1_S] = {"IQ1_S", 256, 50},
    [ZS_GGML_IQ4_NL] = {"IQ4_NL", 32, 18},  [ZS_GGML_IQ3_S] = {"IQ3_S", 256, 110},
    [ZS_GGML_IQ2_S] = {"IQ2_S", 256, 82},   [ZS_GGML_IQ4_XS] = {"IQ4_XS", 256, 136},
    [ZS_GGML_I8] = {"I8", 1, 1},            [ZS_GGML_I16] = {"I16", 1, 2},
    [ZS_GGML_I32] = {"I32", 1, 4},          [ZS_GGML_I64] = {"I64", 1, 8},
    [ZS_GGML_F64] = {"F64", 1, 8},          [ZS_GGML_IQ1_M] = {"IQ1_M", 256, 56},
    [ZS_GGML_BF16] = {"BF16", 1, 2},        [ZS_GGML_TQ1_0] = {"TQ1_0", 256, 54},
    [ZS_GGML_TQ2_0] = {"TQ2_0", 256, 66},   [ZS_GGML_MXFP4] = {"MXFP4", 32, 17},
    [ZS_GGML_NVFP4] = {"NVFP4", 64, 36},    [ZS_GGML_Q1_0] = {"Q1_0", 128, 18},
};

const char *zs_gguf_type_name(int type) {
    return type >= 0 && type < ZS_GGML_TYPE_COUNT ? type_info[type].name : NULL;
}

int zs_gguf_type_block(int type, uint32_t *block_elems, uint32_t *block_bytes) {
    if (!zs_gguf_type_name(type))
        return zs_err(ZS_EUNSUPPORTED, "unknown ggml type id %d", type);
    if (block_elems) *block_elems = type_info[type].blck;
    if (block_bytes) *block_bytes = type_info[type].bytes;
    return 0;
}

int zs_gguf_tensor_nbytes(int type, int n_dims, const int64_t *ne, size_t *out) {
    uint32_t blck = 1, bb = 0;
    ZS_CHECK(zs_gguf_type_block(type, &blck, &bb));
    if (n_dims < 0 || n_dims > ZS_GGUF_MAX_DIMS)
        return zs_err(ZS_EINVAL, "%d dimensions (at most %d)", n_dims, ZS_GGUF_MAX_DIMS);
    int64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1) return zs_err(ZS_EINVAL, "dimension %d is %" PRId64 " (must be >= 1)", d, ne[d]);
        if (__builtin_mul_overflow(nel, ne[d], &nel))
            return zs_err(ZS_ERANGE, "the number of elements overflows (dims too large)");
    }
    int64_t ne0 = n_dims > 0 ? ne[0] : 1;
    if (ne0 % blck != 0)
        return zs_err(ZS_EINVAL, "row length %" PRId64 " is not a multiple of the %s block size %u",
                      ne0, type_info[type].name, blck);
    size_t bytes = (size_t)(ne0 / blck);
    if (zs_mul_size(bytes, bb, &bytes) != 0)
        return zs_err(ZS_ERANGE, "the byte size overflows (dims too large)");
    for (int d = 1; d < n_dims; d++)
        if (zs_mul_size(bytes, (size_t)ne[d], &bytes) != 0)
            return zs_err(ZS_ERANGE, "the byte size overflows (dims too large)");
    *out = bytes;
    return 0;
}

/* ---------- the parsed file ---------- */

typedef struct {
    uint32_t type;      /* zs_gguf_vtype */
    uint32_t elem_type; /* arrays: element type */
    uint64_t n;         /* string: length; array: element count */
    uint64_t u;         /* scalar: raw little-endian bits; string: arena offset; numeric array:
                           file offset of element 0; string array: index into strs; array of
                           arrays: index into nodes */
} gg_val;

typedef struct {
    uint64_t key_off; /* arena offset */
    size_t key_len;
    gg_val v;
} gg_kv;

typedef struct {
    uint64_t off, len; /* arena offset and length */
} gg_str;

struct zs_gguf {
    char *path;
    const uint8_t *map;
    size_t size;
    int mapped; /* 1: map is our mmap */
    uint32_t version;
    size_t alignment, data_off;
    char *arena; /* every string, NUL-terminated */
    size_t arena_len, arena_cap;
    gg_kv *kv;
    size_t nkv, kv_cap;
    gg_str *strs;
    size_t nstrs, strs_cap;
    gg_val *nodes;
    size_t nnodes, nodes_cap;
    zs_gguf_tensor *t;
    uint64_t *t_name_off;
    size_t nt, t_cap;
    uint32_t *kv_slots, *t_slots; /* open addressing: index + 1, 0 = empty */
    size_t kv_mask, t_mask;
};

/* growable arrays: *cap grows by doubling; 0 or ZS_ENOMEM (message set) */
static int gg_grow(void **p, size_t *cap, size_t need, size_t elem, const char *path) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
        nc *= 2;
    }
    size_t bytes;
    if (zs_mul_size(nc, elem, &bytes) != 0) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    void *q = realloc(*p, bytes);
    if (!q) return zs_err(ZS_ENOMEM, "%s: out of memory (%zu bytes)", path, bytes);
    *p = q;
    *cap = nc;
    return 0;
}

/* A printable copy of a name from the file, for messages (at most 80 chars). */
static const char *gg_safe(char buf[100], const char *s, size_t len) {
    size_t k = 0;
    for (size_t i = 0; i < len && k < 80; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (len > 80) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = 0;
    return buf;
}

/* ---------- the cursor ---------- */

typedef struct {
    const uint8_t *p;
    size_t size, off;
    const char *path;
} gg_rd;

static int rd_need(gg_rd *r, size_t n, const char *what) {
    if (r->size - r->off < n)
        return zs_err(ZS_EFORMAT, "%s: truncated: %s at byte %zu needs %zu bytes, only %zu left",
                      r->path, what, r->off, n, r->size - r->off);
    return 0;
}

static uint64_t le_bits(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}

static int rd_uint(gg_rd *r, size_t n, const char *what, uint64_t *out) {
    ZS_CHECK(rd_need(r, n, what));
    *out = le_bits(r->p + r->off, n);
    r->off += n;
    return 0;
}

static int rd_u32(gg_rd *r, const char *what, uint32_t *out) {
    uint64_t v;
    ZS_CHECK(rd_uint(r, 4, what, &v));
    *out = (uint32_t)v;
    return 0;
}

/* Reads a GGUF string (u64 length + bytes) into the arena; off and len describe it. */
static int rd_str(zs_gguf *g, gg_rd *r, const char *what, uint64_t *off, uint64_t *len) {
    uint64_t n;
    char lw[160];
    snprintf(lw, sizeof lw, "the length of %s", what);
    ZS_CHECK(rd_uint(r, 8, lw, &n));
    if (n > r->size - r->off)
        return zs_err(ZS_EFORMAT,
                      "%s: truncated or corrupt: %s at byte %zu has length %" PRIu64
                      ", more than the %zu bytes that remain in the file",
                      r->path, what, r->off - 8, n, r->size - r->off);
    ZS_CHECK(gg_grow((void **)&g->arena, &g->arena_cap, g->arena_len + (size_t)n + 1, 1, r->path));
    memcpy(g->arena + g->arena_len, r->p + r->off, (size_t)n);
    g->arena[g->arena_len + n] = 0;
    *off = g->arena_len;
    *len = n;
    g->arena_len += (size_t)n + 1;
    r->off += (size_t)n;
    return 0;
}

/* Parses one value of type `type` (for an array, its element type and count follow). */
static int rd_value(zs_gguf *g, gg_rd *r, uint32_t type, int depth, const char *key, gg_val *out) {
    char what[200];
    memset(out, 0, sizeof *out);
    out->type = type;
    if (type >= ZS_GGUF_VTYPE_COUNT)
        return zs_err(ZS_EFORMAT, "%s: key '%s' has unknown value type %u (at byte %zu)", r->path,
                      key, type, r->off);
    if (type == ZS_GGUF_STR) {
        snprintf(what, sizeof what, "a string value of key '%s'", key);
        return rd_str(g, r, what, &out->u, &out->n);
    }
    if (type != ZS_GGUF_ARR) {
        snprintf(what, sizeof what, "the %s value of key '%s'", vtype_names[type], key);
        ZS_CHECK(rd_uint(r, vtype_size[type], what, &out->u));
        if (type == ZS_GGUF_BOOL && out->u > 1)
            return zs_err(ZS_EFORMAT, "%s: bool value of key '%s' at byte %zu is %u, not 0 or 1",
                          r->path, key, r->off - 1, (unsigned)out->u);
        return 0;
    }
    if (depth >= ZS_GGUF_MAX_NESTING)
        return zs_err(ZS_EFORMAT, "%s: arrays of key '%s' are nested more than %d deep", r->path,
                      key, ZS_GGUF_MAX_NESTING);
    snprintf(what, sizeof what, "the array header of key '%s'", key);
    uint32_t et;
    uint64_t n;
    ZS_CHECK(rd_u32(r, what, &et));
    ZS_CHECK(rd_uint(r, 8, what, &n));
    if (et >= ZS_GGUF_VTYPE_COUNT)
        return zs_err(ZS_EFORMAT, "%s: array of key '%s' has unknown element type %u", r->path,
                      key, et);
    out->elem_type = et;
    out->n = n;
    size_t left = r->size - r->off;
    /* minimum bytes per element: its size, 8 for a string's length, 12 for an array header */
    size_t min = et == ZS_GGUF_STR ? 8 : et == ZS_GGUF_ARR ? 12 : vtype_size[et];
    if (n > left / min)
        return zs_err(ZS_EFORMAT,
                      "%s: truncated or corrupt: array of key '%s' at byte %zu has %" PRIu64
                      " %s elements (at least %zu bytes each), more than the %zu bytes that "
                      "remain in the file",
                      r->path, key, r->off - 12, n, vtype_names[et], min, left);
    if (et != ZS_GGUF_STR && et != ZS_GGUF_ARR) {
        out->u = r->off;
        if (et == ZS_GGUF_BOOL)
            for (size_t i = 0; i < n; i++)
                if (r->p[r->off + i] > 1)
                    return zs_err(ZS_EFORMAT, "%s: bool element %zu of key '%s' is %u, not 0 or 1",
                                  r->path, i, key, r->p[r->off + i]);
        r->off += (size_t)n * min;
        return 0;
    }
    if (et == ZS_GGUF_STR) {
        out->u = g->nstrs;
        for (uint64_t i = 0; i < n; i++) {
            ZS_CHECK(gg_grow((void **)&g->strs, &g->strs_cap, g->nstrs + 1, sizeof(gg_str), r->path));
            snprintf(what, sizeof what, "string element %" PRIu64 " of key '%s'", i, key);
            gg_str *s = &g->strs[g->nstrs];
            ZS_CHECK(rd_str(g, r, what, &s->off, &s->len));
            g->nstrs++;
        }
        return 0;
    }
    /* array of arrays: parse the inner arrays into a local list, then append it contiguously */
    gg_val *loc = NULL;
    size_t nloc = 0, cap = 0;
    int rc = 0;
    for (uint64_t i = 0; i < n && rc == 0; i++) {
        rc = gg_grow((void **)&loc, &cap, nloc + 1, sizeof(gg_val), r->path);
        if (rc == 0) rc = rd_value(g, r, ZS_GGUF_ARR, depth + 1, key, &loc[nloc]);
        if (rc == 0) nloc++;
    }
    if (rc == 0) rc = gg_grow((void **)&g->nodes, &g->nodes_cap, g->nnodes + nloc, sizeof(gg_val), r->path);
    if (rc == 0) {
        out->u = g->nnodes;
        if (nloc) memcpy(g->nodes + g->nnodes, loc, nloc * sizeof(gg_val));
        g->nnodes += nloc;
    }
    free(loc);
    return rc;
}

/* ---------- hash tables ---------- */

static uint64_t gg_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int gg_table_alloc(uint32_t **slots, size_t *mask, size_t n, const char *path) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    *slots = calloc(cap, sizeof(uint32_t));
    if (!*slots) return zs_err(ZS_ENOMEM, "%s: out of memory", path);
    *mask = cap - 1;
    return 0;
}

static const char *kv_key(const zs_gguf *g, size_t i) { return g->arena + g->kv[i].key_off; }

static const gg_kv *kv_find(const zs_gguf *g, const char *key) {
    if (!g || !key || !g->kv_slots) return NULL;
    size_t n = strlen(key);
    for (size_t h = gg_hash(key, n) & g->kv_mask;; h = (h + 1) & g->kv_mask) {
        uint32_t s = g->kv_slots[h];
        if (!s) return NULL;
        const gg_kv *kv = &g->kv[s - 1];
        if (kv->key_len == n && memcmp(kv_key(g, s - 1), key, n) == 0) return kv;
    }
}

/* ---------- open ---------- */

static int gg_cmp_off(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static int gg_parse(zs_gguf *g) {
    gg_rd r = {g->map, g->size, 0, g->path};
    char nb[100], what[200];
    if (g->size < 4)
        return zs_err(ZS_EFORMAT, "%s: truncated: %zu bytes is too short for the GGUF magic",
                      g->path, g->size);
    if (memcmp(g->map, "GGUF", 4) != 0)
        return zs_err(ZS_EFORMAT,
                      "%s: not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                      g->path, g->map[0], g->map[1], g->map[2], g->map[3]);
    r.off = 4;
    uint32_t ver;
    ZS_CHECK(rd_u32(&r, "the version", &ver));
    if ((ver & 0xffff) == 0 && ver != 0)
        return zs_err(ZS_EUNSUPPORTED,
                      "%s: big-endian GGUF (version %u byte-swapped) is not supported", g->path,
                      (unsigned)__builtin_bswap32(ver));
    if (ver != 2 && ver != 3)
        return zs_err(ZS_EUNSUPPORTED, "%s: GGUF version %u is not supported (only 2 and 3)",
                      g->path, ver);
    g->version = ver;
    uint64_t nt, nkv;
    ZS_CHECK(rd_uint(&r, 8, "the tensor count", &nt));
    ZS_CHECK(rd_uint(&r, 8, "the key/value count", &nkv));
    /* a key/value takes at least 13 bytes (8 length + 1 key byte + 4 type), a tensor info 25 */
    if (nkv > (r.size - r.off) / 13)
        return zs_err(ZS_EFORMAT,
                      "%s: truncated or corrupt: the header claims %" PRIu64
                      " key/values, more than the %zu bytes that remain in the file could hold",
                      g->path, nkv, r.size - r.off);
    if (nt > (r.size - r.off) / 25)
        return zs_err(ZS_EFORMAT,
                      "%s: truncated or corrupt: the header claims %" PRIu64
                      " tensors, more than the %zu bytes that remain in the file could hold",
                      g->path, nt, r.size - r.off);

    if (nkv >= UINT32_MAX || nt >= UINT32_MAX)
        return zs_err(ZS_EFORMAT, "%s: corrupt: %" PRIu64 " tensors / %" PRIu64
                      " key/values are too many", g->path, nt, nkv);

    /* key/values */
    for (uint64_t i = 0; i < nkv; i++) {
        ZS_CHECK(gg_grow((void **)&g->kv, &g->kv_cap, g->nkv + 1, sizeof(gg_kv), g->path));
        gg_kv *kv = &g->kv[g->nkv];
        uint64_t koff, klen;
        snprintf(what, sizeof what, "the key of key/value %" PRIu64, i);
        ZS_CHECK(rd_str(g, &r, what, &koff, &klen));
        kv->key_off = koff;
        kv->key_len = (size_t)klen;
        const char *k = g->arena + koff;
        if (klen == 0)
            return zs_err(ZS_EFORMAT, "%s: key/value %" PRIu64 " has an empty key", g->path, i);
        if (memchr(k, 0, (size_t)klen))
            return zs_err(ZS_EFORMAT, "%s: key '%s' (key/value %" PRIu64 ") contains a NUL byte",
                          g->path, gg_safe(nb, k, (size_t)klen), i);
        gg_safe(nb, k, (size_t)klen);
        uint32_t type;
        snprintf(what, sizeof what, "the value type of key '%s'", nb);
        ZS_CHECK(rd_u32(&r, what, &type));
        gg_val v;
        ZS_CHECK(rd_value(g, &r, type, 0, nb, &v));
        g->kv[g->nkv].v = v;
        g->nkv++;
    }
    ZS_CHECK(gg_table_alloc(&g->kv_slots, &g->kv_mask, g->nkv, g->path));
    for (size_t i = 0; i < g->nkv; i++) {
        const char *k = kv_key(g, i);
        size_t n = g->kv[i].key_len;
        size_t h = gg_hash(k, n) & g->kv_mask;
        for (; g->kv_slots[h]; h = (h + 1) & g->kv_mask) {
            const gg_kv *o = &g->kv[g->kv_slots[h] - 1];
            if (o->key_len == n && memcmp(kv_key(g, g->kv_slots[h] - 1), k, n) == 0)
                return zs_err(ZS_EFORMAT, "%s: duplicate key '%s'", g->path, gg_safe(nb, k, n));
        }
        g->kv_slots[h] = (uint32_t)(i + 1);
    }

    /* general.alignment */
    g->alignment = ZS_GGUF_DEFAULT_ALIGNMENT;
    const gg_kv *al = kv_find(g, "general.alignment");
    if (al) {
        if (al->v.type != ZS_GGUF_U32)
            return zs_err(ZS_EFORMAT, "%s: general.alignment is %s, expected u32", g->path,
                          vtype_names[al->v.type]);
        uint32_t a = (uint32_t)al->v.u;
        if (a == 0 || (a & (a - 1)) != 0)
            return zs_err(ZS_EFORMAT, "%s: general.alignment %u is not a power of two", g->path, a);
        g->alignment = a;
    }

    /* tensor infos */
    for (uint64_t i = 0; i < nt; i++) {
        size_t cap = g->t_cap;
        ZS_CHECK(gg_grow((void **)&g->t, &g->t_cap, g->nt + 1, sizeof(zs_gguf_tensor), g->path));
        ZS_CHECK(gg_grow((void **)&g->t_name_off, &cap, g->nt + 1, sizeof(uint64_t), g->path));
        zs_gguf_tensor *t = &g->t[g->nt];
        memset(t, 0, sizeof *t);
        uint64_t noff, nlen;
        snprintf(what, sizeof what, "the name of tensor %" PRIu64, i);
        ZS_CHECK(rd_str(g, &r, what, &noff, &nlen));
        const char *name = g->arena + noff;
        if (nlen == 0)
            return zs_err(ZS_EFORMAT, "%s: tensor %" PRIu64 " has an empty name", g->path, i);
        gg_safe(nb, name, (size_t)nlen);
        if (memchr(name, 0, (size_t)nlen))
            return zs_err(ZS_EFORMAT, "%s: tensor name '%s' contains a NUL byte", g->path, nb);
        g->t_name_off[g->nt] = noff;
        uint32_t nd;
        snprintf(what, sizeof what, "the info of tensor '%s'", nb);
        ZS_CHECK(rd_u32(&r, what, &nd));
        if (nd > ZS_GGUF_MAX_DIMS)
            return zs_err(ZS_EFORMAT, "%s: tensor '%s' has %u dimensions (at most %d)", g->path,
                          nb, nd, ZS_GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            ZS_CHECK(rd_uint(&r, 8, what, &v));
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return zs_err(ZS_EFORMAT,
                              "%s: tensor '%s' dimension %u is %" PRIu64
                              " (must be between 1 and 2^63-1)", g->path, nb, d, v);
            t->ne[d] = (int64_t)v;
        }
        uint32_t type;
        uint64_t off;
        ZS_CHECK(rd_u32(&r, what, &type));
        ZS_CHECK(rd_uint(&r, 8, what, &off));
        if (!zs_gguf_type_name((int)type))
            return zs_err(ZS_EUNSUPPORTED, "%s: tensor '%s' has unknown ggml type id %u", g->path,
                          nb, type);
        t->type = (zs_ggml_type)type;
        t->offset = off;
        int rc = zs_gguf_tensor_nbytes((int)type, t->n_dims, t->ne, &t->nbytes);
        if (rc < 0)
            return zs_err_prefix(ZS_EFORMAT, "%s: tensor '%s' [%" PRId64 ", %" PRId64 ", %" PRId64
                                 ", %" PRId64 "] %s", g->path, nb, t->ne[0], t->ne[1], t->ne[2],
                                 t->ne[3], type_info[type].name);
        if (off % g->alignment != 0)
            return zs_err(ZS_EFORMAT,
                          "%s: tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %zu",
                          g->path, nb, off, g->alignment);
        g->nt++;
    }

    /* data section */
    size_t hdr_end = r.off;
    size_t dstart;
    if (zs_add_size(hdr_end, g->alignment - 1, &dstart) != 0)
        return zs_err(ZS_EFORMAT, "%s: data section offset overflows", g->path);
    dstart = dstart / g->alignment * g->alignment;
    g->data_off = dstart;
    if (g->nt > 0 && dstart > g->size)
        return zs_err(ZS_EFORMAT,
                      "%s: truncated: the data section would start at byte %zu, past the end of "
                      "the file (%zu bytes)", g->path, dstart, g->size);
    size_t room = g->nt > 0 ? g->size - dstart : 0;

    for (size_t i = 0; i < g->nt; i++) g->t[i].name = g->arena + g->t_name_off[i];
    for (size_t i = 0; i < g->nt; i++) {
        zs_gguf_tensor *t = &g->t[i];
        if (t->offset > room || t->nbytes > room - t->offset)
            return zs_err(ZS_EFORMAT,
                          "%s: truncated or corrupt: tensor '%s' data [%" PRIu64 ", +%zu) of the "
                          "data section (at byte %zu) lies outside the file (%zu bytes)", g->path,
                          gg_safe(nb, t->name, strlen(t->name)), t->offset, t->nbytes, dstart,
                          g->size);
        t->data = g->map + dstart + t->offset;
    }

    /* duplicate names */
    ZS_CHECK(gg_table_alloc(&g->t_slots, &g->t_mask, g->nt, g->path));
    for (size_t i = 0; i < g->nt; i++) {
        const char *nm = g->t[i].name;
        size_t h = gg_hash(nm, strlen(nm)) & g->t_mask;
        for (; g->t_slots[h]; h = (h + 1) & g->t_mask)
            if (strcmp(g->t[g->t_slots[h] - 1].name, nm) == 0)
                return zs_err(ZS_EFORMAT, "%s: duplicate tensor name '%s'", g->path,
                              gg_safe(nb, nm, strlen(nm)));
        g->t_slots[h] = (uint32_t)(i + 1);
    }

    /* overlaps: sort (offset, index) pairs by offset, then compare neighbours */
    if (g->nt > 1) {
        uint64_t(*ord)[2] = malloc(g->nt * sizeof *ord);
        if (!ord) return zs_err(ZS_ENOMEM, "%s: out of memory", g->path);
        for (size_t i = 0; i < g->nt; i++) {
            ord[i][0] = g->t[i].offset;
            ord[i][1] = i;
        }
        qsort(ord, g->nt, sizeof *ord, gg_cmp_off);
        for (size_t i = 1; i < g->nt; i++) {
            const zs_gguf_tensor *a = &g->t[ord[i - 1][1]], *b = &g->t[ord[i][1]];
            if (a->offset + a->nbytes > b->offset) {
                char nb2[100];
                int rc = zs_err(ZS_EFORMAT,
                                "%s: tensors '%s' [%" PRIu64 ", +%zu) and '%s' [%" PRIu64
                                ", +%zu) overlap", g->path, gg_safe(nb, a->name, strlen(a->name)),
                                a->offset, a->nbytes, gg_safe(nb2, b->name, strlen(b->name)),
                                b->offset, b->nbytes);
                free(ord);
                return rc;
            }
        }
        free(ord);
    }
    return 0;
}

void zs_gguf_close(zs_gguf *g) {
    if (!g) return;
    if (g->mapped && g->map) munmap((void *)g->map, g->size);
    free(g->path);
    free(g->arena);
    free(g->kv);
    free(g->strs);
    free(g->nodes);
    free(g->t);
    free(g->t_name_off);
    free(g->kv_slots);
    free(g->t_slots);
    free(g);
}

static int gg_new(const char *name, zs_gguf **out) {
    zs_gguf *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "%s: out of memory", name);
    g->path = strdup(name);
    if (!g->path) {
        free(g);
        return zs_err(ZS_ENOMEM, "%s: out of memory", name);
    }
    *out = g;
    return 0;
}

static int gg_finish(zs_gguf *g, zs_gguf **out) {
    int rc = gg_parse(g);
    if (rc < 0) {
        zs_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int zs_gguf_open_mem(const void *data, size_t size, const char *name, zs_gguf **out) {
    if (!name) name = "<memory>";
    if (!out || (!data && size)) return zs_err(ZS_EINVAL, "%s: bad arguments", name);
    zs_gguf *g;
    ZS_CHECK(gg_new(name, &g));
    g->map = data;
    g->size = size;
    return gg_finish(g, out);
}

int zs_gguf_open(const char *path, zs_gguf **out) {
    if (!path || !out) return zs_err(ZS_EINVAL, "zs_gguf_open: bad arguments");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err(e == ENOENT ? ZS_ENOTFOUND : e == EACCES ? ZS_EPERM : ZS_EIO,
                      "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return zs_err(ZS_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zs_err(ZS_EFORMAT, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return zs_err(ZS_ERANGE, "%s: file too large to map", path);
    }
    zs_gguf *g;
    int rc = gg_new(path, &g);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    g->size = (size_t)st.st_size;
    if (g->size > 0) {
        void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        if (m == MAP_FAILED) {
            close(fd);
            zs_gguf_close(g);
            return zs_err(e == ENOMEM ? ZS_ENOMEM : ZS_EIO, "%s: cannot mmap: %s", path,
                          strerror(e));
        }
        g->map = m;
        g->mapped = 1;
    }
    close(fd);
    return gg_finish(g, out);
}

/* ---------- accessors ---------- */

uint32_t zs_gguf_version(const zs_gguf *g) { return g ? g->version : 0; }
size_t zs_gguf_alignment(const zs_gguf *g) { return g ? g->alignment : 0; }
size_t zs_gguf_data_offset(const zs_gguf *g) { return g ? g->data_off : 0; }
const char *zs_gguf_path(const zs_gguf *g) { return g ? g->path : NULL; }
size_t zs_gguf_kv_count(const zs_gguf *g) { return g ? g->nkv : 0; }

const char *zs_gguf_kv_key(const zs_gguf *g, size_t i) {
    return g && i < g->nkv ? kv_key(g, i) : NULL;
}

int zs_gguf_kv_type(const zs_gguf *g, size_t i) {
    return g && i < g->nkv ? (int)g->kv[i].v.type : -1;
}

long zs_gguf_find_key(const zs_gguf *g, const char *key) {
    const gg_kv *kv = kv_find(g, key);
    return kv ? (long)(kv - g->kv) : -1;
}

size_t zs_gguf_tensor_count(const zs_gguf *g) { return g ? g->nt : 0; }

const zs_gguf_tensor *zs_gguf_tensor_at(const zs_gguf *g, size_t i) {
    return g && i < g->nt ? &g->t[i] : NULL;
}

const zs_gguf_tensor *zs_gguf_find_tensor(const zs_gguf *g, const char *name) {
    if (!g || !name || !g->t_slots) return NULL;
    for (size_t h = gg_hash(name, strlen(name)) & g->t_mask;; h = (h + 1) & g->t_mask) {
        uint32_t s = g->t_slots[h];
        if (!s) return NULL;
        if (strcmp(g->t[s - 1].name, name) == 0) return &g->t[s - 1];
    }
}

/* ---------- typed getters ---------- */

static int get_kv(const zs_gguf *g, const char *key, const gg_kv **out) {
    if (!g || !key) return zs_err(ZS_EINVAL, "zs_gguf: bad arguments");
    const gg_kv *kv = kv_find(g, key);
    if (!kv) return zs_err(ZS_ENOTFOUND, "%s: key '%s' not found", g->path, key);
    *out = kv;
    return 0;
}

enum { WANT_U32, WANT_I32, WANT_U64, WANT_I64, WANT_F32, WANT_F64 };
static const char *const want_names[] = {"u32", "i32", "u64", "i64", "f32", "f64"};

/* Converts a scalar of type `type` with raw bits to the wanted type (see gguf.h). elem is the
 * array index for messages, or -1 for a scalar. */
static int gg_conv(const zs_gguf *g, const char *key, long long elem, uint32_t type, uint64_t bits,
                   int want, void *out) {
    char ctx[48] = "";
    if (elem >= 0) snprintf(ctx, sizeof ctx, " element %lld", elem);
    int is_uint = type == ZS_GGUF_U8 || type == ZS_GGUF_U16 || type == ZS_GGUF_U32 || type == ZS_GGUF_U64;
    int is_sint = type == ZS_GGUF_I8 || type == ZS_GGUF_I16 || type == ZS_GGUF_I32 || type == ZS_GGUF_I64;
    int64_t s = 0;
    if (type == ZS_GGUF_I8) s = (int8_t)bits;
    if (type == ZS_GGUF_I16) s = (int16_t)bits;
    if (type == ZS_GGUF_I32) s = (int32_t)bits;
    if (type == ZS_GGUF_I64) s = (int64_t)bits;
    int small = type <= ZS_GGUF_I16; /* u8, i8, u16, i16 */
    int upto32 = small || type == ZS_GGUF_U32 || type == ZS_GGUF_I32;
    if (want <= WANT_I64) {
        if (!is_uint && !is_sint) goto wrong;
        int fits;
        switch (want) {
        case WANT_U32: fits = is_uint ? bits <= UINT32_MAX : (s >= 0 && s <= (int64_t)UINT32_MAX); break;
        case WANT_I32: fits = is_uint ? bits <= INT32_MAX : (s >= INT32_MIN && s <= INT32_MAX); break;
        case WANT_U64: fits = is_uint || s >= 0; break;
        default: fits = !is_uint || bits <= (uint64_t)INT64_MAX; break;
        }
        if (!fits) {
            if (is_uint)
                return zs_err(ZS_ERANGE, "%s: key '%s'%s = %" PRIu64 " (%s) does not fit in %s",
                              g->path, key, ctx, bits, vtype_names[type], want_names[want]);
            return zs_err(ZS_ERANGE, "%s: key '%s'%s = %" PRId64 " (%s) does not fit in %s",
                          g->path, key, ctx, s, vtype_names[type], want_names[want]);
        }
        switch (want) {
        case WANT_U32: *(uint32_t *)out = (uint32_t)(is_uint ? bits : (uint64_t)s); break;
        case WANT_I32: *(int32_t *)out = (int32_t)(is_uint ? (int64_t)bits : s); break;
        case WANT_U64: *(uint64_t *)out = is_uint ? bits : (uint64_t)s; break;
        default: *(int64_t *)out = is_uint ? (int64_t)bits : s; break;
        }
        return 0;
    }
    if (type == ZS_GGUF_F32 || type == ZS_GGUF_F64) {
        if (type == ZS_GGUF_F64 && want == WANT_F32) goto wrong;
        double d;
        if (type == ZS_GGUF_F32) {
            uint32_t b = (uint32_t)bits;
            float f;
            memcpy(&f, &b, 4);
            d = f;
        } else {
            memcpy(&d, &bits, 8);
        }
        if (want == WANT_F32) *(float *)out = (float)d;
        else *(double *)out = d;
        return 0;
    }
    if ((want == WANT_F32 && small) || (want == WANT_F64 && upto32)) {
        double d = is_uint ? (double)bits : (double)s;
        if (want == WANT_F32) *(float *)out = (float)d;
        else *(double *)out = d;
        return 0;
    }
wrong:
    return zs_err(ZS_EINVAL, "%s: key '%s'%s is %s, not %s", g->path, key, ctx,
                  vtype_names[type], want_names[want]);
}

static int get_scalar(const zs_gguf *g, const char *key, int want, void *out) {
    const gg_kv *kv = NULL;
    ZS_CHECK(get_kv(g, key, &kv));
    return gg_conv(g, key, -1, kv->v.type, kv->v.u, want, out);
}

int zs_gguf_get_u32(const zs_gguf *g, const char *key, uint32_t *out) { return get_scalar(g, key, WANT_U32, out); }
int zs_gguf_get_i32(const zs_gguf *g, const char *key, int32_t *out) { return get_scalar(g, key, WANT_I32, out); }
int zs_gguf_get_u64(const zs_gguf *g, const char *key, uint64_t *out) { return get_scalar(g, key, WANT_U64, out); }
int zs_gguf_get_i64(const zs_gguf *g, const char *key, int64_t *out) { return get_scalar(g, key, WANT_I64, out); }
int zs_gguf_get_f32(const zs_gguf *g, const char *key, float *out) { return get_scalar(g, key, WANT_F32, out); }
int zs_gguf_get_f64(const zs_gguf *g, const char *key, double *out) { return get_scalar(g, key, WANT_F64, out); }

int zs_gguf_get_bool(const zs_gguf *g, const char *key, bool *out) {
    const gg_kv *kv = NULL;
    ZS_CHECK(get_kv(g, key, &kv));
    if (kv->v.type != ZS_GGUF_BOOL)
        return zs_err(ZS_EINVAL, "%s: key '%s' is %s, not bool", g->path, key, vtype_names[kv->v.type]);
    *out = kv->v.u != 0;
    return 0;
}

int zs_gguf_get_str(const zs_gguf *g, const char *key, const char **s, size_t *len) {
    const gg_kv *kv = NULL;
    ZS_CHECK(get_kv(g, key, &kv));
    if (kv->v.type != ZS_GGUF_STR)
        return zs_err(ZS_EINVAL, "%s: key '%s' is %s, not string", g->path, key, vtype_names[kv->v.type]);
    *s = g->arena + kv->v.u;
    if (len) *len = (size_t)kv->v.n;
    return 0;
}

int zs_gguf_get_arr(const zs_gguf *g, const char *key, int *elem_type, size_t *n) {
    const gg_kv *kv = NULL;
    ZS_CHECK(get_kv(g, key, &kv));
    if (kv->v.type != ZS_GGUF_ARR)
        return zs_err(ZS_EINVAL, "%s: key '%s' is %s, not array", g->path, key, vtype_names[kv->v.type]);
    if (elem_type) *elem_type = (int)kv->v.elem_type;
    if (n) *n = (size_t)kv->v.n;
    return 0;
}

/* The array value of key with element i in range. */
static int get_elem(const zs_gguf *g, const char *key, size_t i, const gg_val **out) {
    const gg_kv *kv = NULL;
    ZS_CHECK(zs_gguf_get_arr(g, key, NULL, NULL));
    ZS_CHECK(get_kv(g, key, &kv));
    if (i >= kv->v.n)
        return zs_err(ZS_ERANGE, "%s: index %zu out of range for key '%s' (%" PRIu64 " elements)",
                      g->path, i, key, kv->v.n);
    *out = &kv->v;
    return 0;
}

static int arr_num(const zs_gguf *g, const char *key, size_t i, int want, void *out) {
    const gg_val *v = NULL;
    ZS_CHECK(get_elem(g, key, i, &v));
    uint32_t et = v->elem_type;
    if (et == ZS_GGUF_STR || et == ZS_GGUF_ARR)
        return zs_err(ZS_EINVAL, "%s: key '%s' element %zu is %s, not %s", g->path, key, i,
                      vtype_names[et], want_names[want]);
    size_t es = vtype_size[et];
    uint64_t bits = le_bits(g->map + v->u + i * es, es);
    return gg_conv(g, key, (long long)i, et, bits, want, out);
}

int zs_gguf_arr_u32(const zs_gguf *g, const char *key, size_t i, uint32_t *out) { return arr_num(g, key, i, WANT_U32, out); }
int zs_gguf_arr_i32(const zs_gguf *g, const char *key, size_t i, int32_t *out) { return arr_num(g, key, i, WANT_I32, out); }
int zs_gguf_arr_i64(const zs_gguf *g, const char *key, size_t i, int64_t *out) { return arr_num(g, key, i, WANT_I64, out); }
int zs_gguf_arr_f32(const zs_gguf *g, const char *key, size_t i, float *out) { return arr_num(g, key, i, WANT_F32, out); }
int zs_gguf_arr_f64(const zs_gguf *g, const char *key, size_t i, double *out) { return arr_num(g, key, i, WANT_F64, out); }

int zs_gguf_arr_str(const zs_gguf *g, const char *key, size_t i, const char **s, size_t *len) {
    const gg_val *v = NULL;
    ZS_CHECK(get_elem(g, key, i, &v));
    if (v->elem_type != ZS_GGUF_STR)
        return zs_err(ZS_EINVAL, "%s: key '%s' element %zu is %s, not string", g->path, key, i,
                      vtype_names[v->elem_type]);
    const gg_str *st = &g->strs[v->u + i];
    *s = g->arena + st->off;
    if (len) *len = (size_t)st->len;
    return 0;
}

int zs_gguf_arr_arr(const zs_gguf *g, const char *key, size_t i, int *elem_type, size_t *n) {
    const gg_val *v = NULL;
    ZS_CHECK(get_elem(g, key, i, &v));
    if (v->elem_type != ZS_GGUF_ARR)
        return zs_err(ZS_EINVAL, "%s: key '%s' element %zu is %s, not array", g->path, key, i,
                      vtype_names[v->elem_type]);
    const gg_val *inner = &g->nodes[v->u + i];
    if (elem_type) *elem_type = (int)inner->elem_type;
    if (n) *n = (size_t)inner->n;
    return 0;
}

static int arr_copy(const zs_gguf *g, const char *key, int want, void *dst, size_t esz, size_t n) {
    size_t have;
    ZS_CHECK(zs_gguf_get_arr(g, key, NULL, &have));
    if (have != n)
        return zs_err(ZS_ESHAPE, "%s: key '%s' has %zu elements, expected %zu", g->path, key, have, n);
    for (size_t i = 0; i < n; i++) ZS_CHECK(arr_num(g, key, i, want, (char *)dst + i * esz));
    return 0;
}

int zs_gguf_arr_copy_f32(const zs_gguf *g, const char *key, float *dst, size_t n) {
    return arr_copy(g, key, WANT_F32, dst, sizeof *dst, n);
}

int zs_gguf_arr_copy_i32(const zs_gguf *g, const char *key, int32_t *dst, size_t n) {
    return arr_copy(g, key, WANT_I32, dst, sizeof *dst, n);
}

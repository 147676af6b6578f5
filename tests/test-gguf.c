/* test-gguf.c — tests of the GGUF reader (engine/model/gguf.h): the stories260K.gguf fixture
 * (metadata, tokenizer arrays, tensor infos, data bit-equal to the safetensors conversion), a
 * small in-test GGUF writer whose files are read back (every value type, nested arrays, F32/F16
 * /Q8_0 tensors, v2 and v3, default and explicit alignment), and every validation error:
 * truncation at every byte, bad magic/version, huge counts and lengths, bad dims, types,
 * offsets, overlaps, duplicates and alignments. Run from the repo root. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "gguf.h"
#include "safetensors.h"
#include "testutil.h"

static char tmp[4096];

/* ---------- a tiny GGUF writer ---------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void b_le(buf *b, uint64_t v, int n) {
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, (size_t)n);
}
static void b_u32(buf *b, uint32_t v) { b_le(b, v, 4); }
static void b_u64(buf *b, uint64_t v) { b_le(b, v, 8); }
static void b_strn(buf *b, const char *s, size_t n) {
    b_u64(b, n);
    b_put(b, s, n);
}
static void b_str(buf *b, const char *s) { b_strn(b, s, strlen(s)); }
static void b_f32(buf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    b_u32(b, u);
}
static void b_pad(buf *b, size_t align) {
    while (b->n % align) b_le(b, 0, 1);
}
/* key + value type; returns the offset of the key's length field */
static size_t b_key(buf *b, const char *k, uint32_t type) {
    size_t at = b->n;
    b_str(b, k);
    b_u32(b, type);
    return at;
}

/* Where the interesting fields of a synthetic file are, for corrupting them. */
typedef struct {
    size_t nt, nkv;           /* the counts */
    size_t key_i8;            /* the key length field of "t.i8" */
    size_t type_u16;          /* the value type field of "t.u16" */
    size_t val_bool;          /* the bool value of "t.bool" */
    size_t arr_str_count;     /* the element count of "t.arr_str" */
    size_t arr_f32_count;     /* the element count of "t.arr_f32" */
    size_t align_val;         /* the u32 value of general.alignment (0: none) */
    size_t tname[3], ndims[3], dims[3], ttype[3], toff[3]; /* per tensor */
    size_t data_off;          /* start of the data section */
    uint64_t tofs[3];         /* tensor offsets relative to the data section */
    size_t nbytes[3];
} layout;

#define NT 3
static const char *const tnames[NT] = {"w.f32", "w.f16", "w.q8"};
static const uint32_t ttypes[NT] = {ZS_GGML_F32, ZS_GGML_F16, ZS_GGML_Q8_0};
static const int tndims[NT] = {2, 1, 2};
static const uint64_t tdims[NT][2] = {{4, 3}, {8, 1}, {64, 2}};
static const size_t tbytes[NT] = {48, 16, 136};

/* Builds the synthetic file: version 2 or 3; align 0 = no general.alignment (default 32). */
static buf make_gguf(uint32_t version, uint32_t align, layout *L) {
    buf b = {0};
    memset(L, 0, sizeof *L);
    b_put(&b, "GGUF", 4);
    b_u32(&b, version);
    L->nt = b.n;
    b_u64(&b, NT);
    L->nkv = b.n;
    size_t nkv_at = b.n;
    b_u64(&b, 0); /* patched below */
    uint64_t nkv = 0;
    b_key(&b, "general.architecture", ZS_GGUF_STR), b_str(&b, "test"), nkv++;
    if (align) {
        b_key(&b, "general.alignment", ZS_GGUF_U32);
        L->align_val = b.n;
        b_u32(&b, align), nkv++;
    }
    b_key(&b, "t.u8", ZS_GGUF_U8), b_le(&b, 200, 1), nkv++;
    L->key_i8 = b_key(&b, "t.i8", ZS_GGUF_I8), b_le(&b, (uint8_t)-5, 1), nkv++;
    L->type_u16 = b_key(&b, "t.u16", ZS_GGUF_U16) + 8 + 5;
    b_le(&b, 60000, 2), nkv++;
    b_key(&b, "t.i16", ZS_GGUF_I16), b_le(&b, (uint16_t)-30000, 2), nkv++;
    b_key(&b, "t.u32", ZS_GGUF_U32), b_u32(&b, 4000000000u), nkv++;
    b_key(&b, "t.i32", ZS_GGUF_I32), b_u32(&b, (uint32_t)-2000000000), nkv++;
    b_key(&b, "t.f32", ZS_GGUF_F32), b_f32(&b, 1.5f), nkv++;
    b_key(&b, "t.bool", ZS_GGUF_BOOL);
    L->val_bool = b.n;
    b_le(&b, 1, 1), nkv++;
    b_key(&b, "t.str", ZS_GGUF_STR), b_strn(&b, "hello\0world", 11), nkv++;
    b_key(&b, "t.u64", ZS_GGUF_U64), b_u64(&b, 1ULL << 40), nkv++;
    b_key(&b, "t.i64", ZS_GGUF_I64), b_u64(&b, (uint64_t)-(1LL << 40)), nkv++;
    double d = 3.25;
    uint64_t du;
    memcpy(&du, &d, 8);
    b_key(&b, "t.f64", ZS_GGUF_F64), b_u64(&b, du), nkv++;
    b_key(&b, "t.arr_f32", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_F32);
    L->arr_f32_count = b.n;
    b_u64(&b, 3), b_f32(&b, 0.5f), b_f32(&b, -1.25f), b_f32(&b, 2.0f), nkv++;
    b_key(&b, "t.arr_i32", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_I32), b_u64(&b, 3);
    b_u32(&b, 1), b_u32(&b, (uint32_t)-2), b_u32(&b, 3), nkv++;
    b_key(&b, "t.arr_u8", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_U8), b_u64(&b, 3);
    b_le(&b, 1, 1), b_le(&b, 2, 1), b_le(&b, 255, 1), nkv++;
    b_key(&b, "t.arr_bool", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_BOOL), b_u64(&b, 2);
    b_le(&b, 1, 1), b_le(&b, 0, 1), nkv++;
    b_key(&b, "t.arr_str", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_STR);
    L->arr_str_count = b.n;
    b_u64(&b, 3), b_str(&b, "a"), b_str(&b, "bc"), b_str(&b, ""), nkv++;
    /* [[1, 2] (i32), ["x"] (string), [] (u8), [[7] (u16)] (array)] */
    b_key(&b, "t.nested", ZS_GGUF_ARR), b_u32(&b, ZS_GGUF_ARR), b_u64(&b, 4);
    b_u32(&b, ZS_GGUF_I32), b_u64(&b, 2), b_u32(&b, 1), b_u32(&b, 2);
    b_u32(&b, ZS_GGUF_STR), b_u64(&b, 1), b_str(&b, "x");
    b_u32(&b, ZS_GGUF_U8), b_u64(&b, 0);
    b_u32(&b, ZS_GGUF_ARR), b_u64(&b, 1), b_u32(&b, ZS_GGUF_U16), b_u64(&b, 1), b_le(&b, 7, 2);
    nkv++;
    for (int i = 0; i < 8; i++) b.p[nkv_at + i] = (uint8_t)(nkv >> (8 * i));

    size_t al = align ? align : 32;
    uint64_t off = 0;
    for (int t = 0; t < NT; t++) {
        L->tname[t] = b.n;
        b_str(&b, tnames[t]);
        L->ndims[t] = b.n;
        b_u32(&b, (uint32_t)tndims[t]);
        L->dims[t] = b.n;
        for (int k = 0; k < tndims[t]; k++) b_u64(&b, tdims[t][k]);
        L->ttype[t] = b.n;
        b_u32(&b, ttypes[t]);
        L->toff[t] = b.n;
        b_u64(&b, off);
        L->tofs[t] = off;
        L->nbytes[t] = tbytes[t];
        off = ZS_ALIGN_UP(off + tbytes[t], al);
    }
    b_pad(&b, al);
    L->data_off = b.n;
    for (int t = 0; t < NT; t++) {
        while (b.n < L->data_off + L->tofs[t]) b_le(&b, 0xee, 1); /* padding */
        for (size_t k = 0; k < tbytes[t]; k++) b_le(&b, (uint8_t)(t * 64 + k * 7), 1);
    }
    return b;
}

static void set_le(buf *b, size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b->p[at + i] = (uint8_t)(v >> (8 * i));
}

/* Opens a copy of the bytes from memory; expects an error with every needle in its message. */
#define EXPECT_FAIL(b, ...)                                                                 \
    do {                                                                                    \
        zs_gguf *g_ = NULL;                                                                 \
        int rc_ = zs_gguf_open_mem((b).p, (b).n, "synthetic.gguf", &g_);                    \
        CHECK_ERR(rc_, "synthetic.gguf", __VA_ARGS__);                                      \
        CHECK(g_ == NULL, "out set on failure");                                            \
        if (rc_ == 0) zs_gguf_close(g_);                                                    \
    } while (0)

static buf dup_buf(const buf *b) {
    buf c = {malloc(b->n ? b->n : 1), b->n, b->n};
    memcpy(c.p, b->p, b->n);
    return c;
}

/* ---------- synthetic files: reading back ---------- */

static void check_synthetic(zs_gguf *g, uint32_t version, uint32_t align, const layout *L,
                            const buf *b) {
    CHECK(zs_gguf_version(g) == version, "version %u", zs_gguf_version(g));
    CHECK(zs_gguf_alignment(g) == (align ? align : 32), "alignment %zu", zs_gguf_alignment(g));
    CHECK(zs_gguf_data_offset(g) == L->data_off, "data offset %zu vs %zu", zs_gguf_data_offset(g),
          L->data_off);
    size_t nkv = zs_gguf_kv_count(g);
    CHECK(nkv == (align ? 20u : 19u), "kv count %zu", nkv);
    CHECK(strcmp(zs_gguf_kv_key(g, 0), "general.architecture") == 0, "first key");
    CHECK(zs_gguf_kv_type(g, 0) == ZS_GGUF_STR, "first key type");
    CHECK(zs_gguf_kv_key(g, nkv) == NULL && zs_gguf_kv_type(g, nkv) == -1, "past the end");
    for (size_t i = 0; i < nkv; i++)
        CHECK(zs_gguf_find_key(g, zs_gguf_kv_key(g, i)) == (long)i, "find key %zu", i);
    CHECK(zs_gguf_find_key(g, "nope") == -1, "absent key");

    const char *s;
    size_t len;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool bo;
    CHECK(zs_gguf_get_str(g, "general.architecture", &s, &len) == 0 && strcmp(s, "test") == 0 &&
          len == 4, "architecture");
    CHECK(zs_gguf_get_str(g, "t.str", &s, &len) == 0 && len == 11 && memcmp(s, "hello\0world", 12) == 0,
          "string with NUL");
    CHECK(zs_gguf_get_u32(g, "t.u8", &u32) == 0 && u32 == 200, "u8 as u32");
    CHECK(zs_gguf_get_i64(g, "t.i8", &i64) == 0 && i64 == -5, "i8 as i64");
    CHECK(zs_gguf_get_i32(g, "t.u16", &i32) == 0 && i32 == 60000, "u16 as i32");
    CHECK(zs_gguf_get_i32(g, "t.i16", &i32) == 0 && i32 == -30000, "i16");
    CHECK(zs_gguf_get_u32(g, "t.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    CHECK(zs_gguf_get_i64(g, "t.u32", &i64) == 0 && i64 == 4000000000LL, "u32 as i64");
    CHECK(zs_gguf_get_i32(g, "t.i32", &i32) == 0 && i32 == -2000000000, "i32");
    CHECK(zs_gguf_get_f32(g, "t.f32", &f) == 0 && f == 1.5f, "f32");
    CHECK(zs_gguf_get_f64(g, "t.f32", &d) == 0 && d == 1.5, "f32 as f64");
    CHECK(zs_gguf_get_f32(g, "t.i16", &f) == 0 && f == -30000.0f, "i16 as f32");
    CHECK(zs_gguf_get_f64(g, "t.u32", &d) == 0 && d == 4000000000.0, "u32 as f64");
    CHECK(zs_gguf_get_bool(g, "t.bool", &bo) == 0 && bo, "bool");
    CHECK(zs_gguf_get_u64(g, "t.u64", &u64) == 0 && u64 == (1ULL << 40), "u64");
    CHECK(zs_gguf_get_i64(g, "t.i64", &i64) == 0 && i64 == -(1LL << 40), "i64");
    CHECK(zs_gguf_get_f64(g, "t.f64", &d) == 0 && d == 3.25, "f64");

    /* wrong types and ranges: errors naming the key and both types; out unchanged */
    u32 = 12345;
    CHECK_ERR(zs_gguf_get_u32(g, "t.str", &u32), "t.str", "string", "u32");
    CHECK(u32 == 12345, "out untouched on error");
    CHECK_ERR(zs_gguf_get_f32(g, "t.u32", &f), "t.u32", "u32", "f32");
    CHECK_ERR(zs_gguf_get_f32(g, "t.f64", &f), "t.f64", "f64", "f32");
    CHECK_ERR(zs_gguf_get_i32(g, "t.f32", &i32), "t.f32", "f32", "i32");
    CHECK_ERR(zs_gguf_get_str(g, "t.u8", &s, NULL), "t.u8", "u8", "string");
    CHECK_ERR(zs_gguf_get_bool(g, "t.u8", &bo), "t.u8", "u8", "bool");
    CHECK_ERR(zs_gguf_get_u32(g, "t.arr_u8", &u32), "t.arr_u8", "array", "u32");
    CHECK_ERR(zs_gguf_get_arr(g, "t.u8", NULL, NULL), "t.u8", "u8", "array");
    int rc = zs_gguf_get_i32(g, "t.u32", &i32);
    CHECK(rc == ZS_ERANGE, "rc %d", rc);
    CHECK_ERR(rc, "t.u32", "4000000000", "does not fit", "i32");
    CHECK_ERR(zs_gguf_get_u32(g, "t.i8", &u32), "t.i8", "-5", "does not fit");
    CHECK_ERR(zs_gguf_get_u64(g, "t.i64", &u64), "t.i64", "does not fit");
    CHECK_ERR(zs_gguf_get_u32(g, "t.u64", &u32), "t.u64", "does not fit");
    rc = zs_gguf_get_u32(g, "no.such.key", &u32);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "no.such.key", "not found");

    /* arrays */
    int et;
    size_t n;
    CHECK(zs_gguf_get_arr(g, "t.arr_f32", &et, &n) == 0 && et == ZS_GGUF_F32 && n == 3, "arr_f32");
    float fv[3];
    CHECK(zs_gguf_arr_copy_f32(g, "t.arr_f32", fv, 3) == 0 && fv[0] == 0.5f && fv[1] == -1.25f &&
          fv[2] == 2.0f, "arr f32 values");
    CHECK_ERR(zs_gguf_arr_copy_f32(g, "t.arr_f32", fv, 2), "t.arr_f32", "3 elements");
    CHECK(zs_gguf_arr_f64(g, "t.arr_f32", 1, &d) == 0 && d == -1.25, "arr f32 as f64");
    int32_t iv[3];
    CHECK(zs_gguf_arr_copy_i32(g, "t.arr_i32", iv, 3) == 0 && iv[0] == 1 && iv[1] == -2 && iv[2] == 3,
          "arr i32");
    CHECK(zs_gguf_arr_copy_i32(g, "t.arr_u8", iv, 3) == 0 && iv[2] == 255, "arr u8 as i32");
    CHECK(zs_gguf_arr_copy_f32(g, "t.arr_u8", fv, 3) == 0 && fv[2] == 255.0f, "arr u8 as f32");
    CHECK_ERR(zs_gguf_arr_u32(g, "t.arr_i32", 1, &u32), "t.arr_i32", "element 1", "does not fit");
    CHECK(zs_gguf_arr_u32(g, "t.arr_i32", 2, &u32) == 0 && u32 == 3, "arr i32 as u32");
    CHECK(zs_gguf_arr_i64(g, "t.arr_bool", 0, &i64) < 0, "bool is not an integer");
    CHECK(zs_gguf_get_arr(g, "t.arr_bool", &et, &n) == 0 && et == ZS_GGUF_BOOL && n == 2, "arr bool");
    CHECK_ERR(zs_gguf_arr_f32(g, "t.arr_f32", 3, &f), "t.arr_f32", "out of range");
    CHECK(zs_gguf_get_arr(g, "t.arr_str", &et, &n) == 0 && et == ZS_GGUF_STR && n == 3, "arr_str");
    CHECK(zs_gguf_arr_str(g, "t.arr_str", 0, &s, &len) == 0 && strcmp(s, "a") == 0 && len == 1, "s0");
    CHECK(zs_gguf_arr_str(g, "t.arr_str", 1, &s, &len) == 0 && strcmp(s, "bc") == 0 && len == 2, "s1");
    CHECK(zs_gguf_arr_str(g, "t.arr_str", 2, &s, &len) == 0 && strcmp(s, "") == 0 && len == 0, "s2");
    CHECK_ERR(zs_gguf_arr_str(g, "t.arr_i32", 0, &s, &len), "t.arr_i32", "i32", "string");
    CHECK_ERR(zs_gguf_arr_f32(g, "t.arr_str", 0, &f), "t.arr_str", "string", "f32");
    CHECK(zs_gguf_get_arr(g, "t.nested", &et, &n) == 0 && et == ZS_GGUF_ARR && n == 4, "nested");
    CHECK(zs_gguf_arr_arr(g, "t.nested", 0, &et, &n) == 0 && et == ZS_GGUF_I32 && n == 2, "n0");
    CHECK(zs_gguf_arr_arr(g, "t.nested", 1, &et, &n) == 0 && et == ZS_GGUF_STR && n == 1, "n1");
    CHECK(zs_gguf_arr_arr(g, "t.nested", 2, &et, &n) == 0 && et == ZS_GGUF_U8 && n == 0, "n2");
    CHECK(zs_gguf_arr_arr(g, "t.nested", 3, &et, &n) == 0 && et == ZS_GGUF_ARR && n == 1, "n3");
    CHECK_ERR(zs_gguf_arr_arr(g, "t.nested", 4, &et, &n), "out of range");
    CHECK_ERR(zs_gguf_arr_arr(g, "t.arr_str", 0, &et, &n), "not array");
    CHECK_ERR(zs_gguf_arr_i32(g, "t.nested", 0, &i32), "array", "i32");

    /* tensors */
    CHECK(zs_gguf_tensor_count(g) == NT, "tensor count %zu", zs_gguf_tensor_count(g));
    CHECK(zs_gguf_tensor_at(g, NT) == NULL, "past the end");
    CHECK(zs_gguf_find_tensor(g, "nope") == NULL, "absent tensor");
    for (int t = 0; t < NT; t++) {
        const zs_gguf_tensor *ti = zs_gguf_tensor_at(g, (size_t)t);
        CHECK(ti && zs_gguf_find_tensor(g, tnames[t]) == ti, "find %s", tnames[t]);
        if (!ti) continue;
        CHECK(strcmp(ti->name, tnames[t]) == 0, "name %s", ti->name);
        CHECK(ti->type == (zs_ggml_type)ttypes[t], "type %d", ti->type);
        CHECK(ti->n_dims == tndims[t], "n_dims %d", ti->n_dims);
        CHECK(ti->ne[0] == (int64_t)tdims[t][0] && ti->ne[1] == (int64_t)tdims[t][1] &&
              ti->ne[2] == 1 && ti->ne[3] == 1, "dims of %s", ti->name);
        CHECK(ti->nbytes == tbytes[t], "nbytes %zu", ti->nbytes);
        CHECK(ti->offset == L->tofs[t], "offset %llu", (unsigned long long)ti->offset);
        CHECK(ti->data == (const void *)(b->p + L->data_off + L->tofs[t]) ||
              memcmp(ti->data, b->p + L->data_off + L->tofs[t], ti->nbytes) == 0, "data of %s",
              ti->name);
        CHECK(memcmp(ti->data, b->p + L->data_off + L->tofs[t], ti->nbytes) == 0, "bytes of %s",
              ti->name);
    }
}

static void test_synthetic(void) {
    const uint32_t versions[] = {3, 2};
    const uint32_t aligns[] = {0, 64, 32, 1};
    for (int vi = 0; vi < 2; vi++)
        for (int ai = 0; ai < 4; ai++) {
            layout L;
            buf b = make_gguf(versions[vi], aligns[ai], &L);
            zs_gguf *g = NULL;
            int rc = zs_gguf_open_mem(b.p, b.n, "synthetic.gguf", &g);
            CHECK(rc == 0, "v%u align %u: %s", versions[vi], aligns[ai], zs_errmsg());
            if (rc == 0) check_synthetic(g, versions[vi], aligns[ai], &L, &b);
            zs_gguf_close(g);
            /* the same through a file (mmap) */
            char path[4200];
            snprintf(path, sizeof path, "%s/s-%u-%u.gguf", tmp, versions[vi], aligns[ai]);
            CHECK(tu_write_file(path, b.p, b.n) == 0, "write %s", path);
            g = NULL;
            rc = zs_gguf_open(path, &g);
            CHECK(rc == 0, "open %s: %s", path, zs_errmsg());
            if (rc == 0) {
                check_synthetic(g, versions[vi], aligns[ai], &L, &b);
                CHECK(strcmp(zs_gguf_path(g), path) == 0, "path");
                for (size_t t = 0; t < zs_gguf_tensor_count(g); t++)
                    CHECK((uintptr_t)zs_gguf_tensor_at(g, t)->data % zs_gguf_alignment(g) == 0,
                          "mapped data aligned");
            }
            zs_gguf_close(g);
            /* ZS_GGUF_SEED_DIR=dir keeps the files (seeds for tests/fuzz/fuzz-gguf.c) */
            const char *seeds = getenv("ZS_GGUF_SEED_DIR");
            if (seeds && *seeds) {
                snprintf(path, sizeof path, "%s/synthetic-v%u-a%u.gguf", seeds, versions[vi],
                         aligns[ai]);
                CHECK(tu_write_file(path, b.p, b.n) == 0, "write %s", path);
            }
            free(b.p);
        }
}

/* ---------- synthetic files: every corruption ---------- */

static void test_truncation(void) {
    layout L;
    buf b = make_gguf(3, 0, &L);
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        zs_gguf *g = NULL;
        int rc = zs_gguf_open_mem(b.p, n, "cut.gguf", &g);
        if (rc == 0) zs_gguf_close(g);
        if (rc >= 0 || !strstr(zs_errmsg(), "truncated") || !strstr(zs_errmsg(), "cut.gguf")) {
            if (bad++ < 5)
                fprintf(stderr, "truncated at %zu: rc %d, message \"%s\"\n", n, rc, zs_errmsg());
        }
    }
    CHECK(bad == 0, "%d truncations not reported as truncated", bad);
    /* a few through real files too, incl. the empty file */
    const size_t cuts[] = {0, 3, 4, 23, 24, L.arr_str_count + 9, L.data_off, b.n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/cut-%zu.gguf", tmp, cuts[i]);
        CHECK(tu_write_file(path, b.p, cuts[i]) == 0, "write");
        zs_gguf *g = NULL;
        CHECK_ERR(zs_gguf_open(path, &g), path, "truncated");
        CHECK(g == NULL, "no handle");
    }
    /* the untruncated file opens */
    zs_gguf *g = NULL;
    CHECK(zs_gguf_open_mem(b.p, b.n, "full.gguf", &g) == 0, "%s", zs_errmsg());
    zs_gguf_close(g);
    free(b.p);
}

static void test_corruptions(void) {
    layout L;
    buf good = make_gguf(3, 64, &L);
    buf c;

#define MUTATE(stmt, ...)                                                                   \
    do {                                                                                    \
        c = dup_buf(&good);                                                                 \
        stmt;                                                                               \
        EXPECT_FAIL(c, __VA_ARGS__);                                                        \
        free(c.p);                                                                          \
    } while (0)

    /* magic and version */
    MUTATE(c.p[0] = 'X', "magic");
    MUTATE(c.p[3] = 'f', "not a GGUF file");
    MUTATE(set_le(&c, 4, 1, 4), "version 1", "not supported");
    MUTATE(set_le(&c, 4, 4, 4), "version 4", "not supported");
    MUTATE(set_le(&c, 4, 0x03000000u, 4), "big-endian");
    /* huge counts and lengths: must fail fast, without allocating */
    MUTATE(set_le(&c, L.nkv, 1ULL << 62, 8), "key/values", "remain");
    MUTATE(set_le(&c, L.nt, 1ULL << 62, 8), "tensors", "remain");
    MUTATE(set_le(&c, L.nkv, 1000, 8), "truncated");
    MUTATE(set_le(&c, L.arr_str_count, 1ULL << 62, 8), "t.arr_str", "elements", "remain");
    MUTATE(set_le(&c, L.arr_f32_count, 1ULL << 62, 8), "t.arr_f32", "elements", "remain");
    MUTATE(set_le(&c, L.arr_f32_count, UINT64_MAX, 8), "t.arr_f32", "remain");
    MUTATE(set_le(&c, L.arr_str_count, 4, 8), "key/value");
    MUTATE(set_le(&c, L.key_i8, 1ULL << 62, 8), "length", "remain");
    MUTATE(set_le(&c, L.key_i8, UINT64_MAX, 8), "length", "remain");
    MUTATE(set_le(&c, L.tname[1], 1ULL << 40, 8), "name of tensor 1", "remain");
    /* value types */
    MUTATE(set_le(&c, L.type_u16, 13, 4), "t.u16", "unknown value type 13");
    MUTATE(set_le(&c, L.type_u16, 0xffffffffu, 4), "t.u16", "unknown value type");
    MUTATE(c.p[L.val_bool] = 2, "t.bool", "not 0 or 1");
    /* duplicates: "t.i8" -> "t.u8", "w.f16" -> "w.f32" */
    MUTATE(c.p[L.key_i8 + 8 + 2] = 'u', "duplicate key 't.u8'");
    MUTATE((c.p[L.tname[1] + 8 + 3] = '3', c.p[L.tname[1] + 8 + 4] = '2'),
           "duplicate tensor name 'w.f32'");
    /* empty / NUL names */
    MUTATE(c.p[L.key_i8 + 8 + 1] = 0, "NUL");
    MUTATE(c.p[L.tname[2] + 8 + 1] = 0, "NUL");
    /* dims */
    MUTATE(set_le(&c, L.ndims[0], 5, 4), "w.f32", "5 dimensions", "at most 4");
    MUTATE(set_le(&c, L.ndims[0], 0xffffffffu, 4), "w.f32", "dimensions");
    MUTATE(set_le(&c, L.dims[0], 0, 8), "w.f32", "dimension 0 is 0");
    MUTATE(set_le(&c, L.dims[0] + 8, 1ULL << 63, 8), "w.f32", "dimension 1");
    MUTATE((set_le(&c, L.dims[0], 1ULL << 40, 8), set_le(&c, L.dims[0] + 8, 1ULL << 40, 8)),
           "w.f32", "overflow");
    MUTATE((set_le(&c, L.dims[2], 1ULL << 40, 8), set_le(&c, L.dims[2] + 8, 1ULL << 10, 8)),
           "w.q8", "outside");
    MUTATE(set_le(&c, L.dims[2], 48, 8), "w.q8", "48", "not a multiple of the Q8_0 block size 32");
    /* types */
    MUTATE(set_le(&c, L.ttype[1], 99, 4), "w.f16", "unknown ggml type id 99");
    MUTATE(set_le(&c, L.ttype[1], 4, 4), "w.f16", "unknown ggml type id 4");
    MUTATE(set_le(&c, L.ttype[1], 0x80000000u, 4), "w.f16", "unknown ggml type id");
    /* offsets */
    MUTATE(set_le(&c, L.toff[1], L.tofs[1] + 4, 8), "w.f16", "not a multiple of the alignment 64");
    MUTATE(set_le(&c, L.toff[2], L.tofs[1], 8), "w.f16", "w.q8", "overlap");
    MUTATE(set_le(&c, L.toff[0], L.tofs[2], 8), "overlap");
    MUTATE(set_le(&c, L.toff[2], 1ULL << 60, 8), "w.q8", "outside");
    MUTATE(set_le(&c, L.toff[2], UINT64_MAX - 63, 8), "w.q8", "outside");
    MUTATE(set_le(&c, L.toff[2], L.tofs[2] + 64, 8), "w.q8", "outside");
    /* alignment */
    MUTATE(set_le(&c, L.align_val, 48, 4), "general.alignment 48", "power of two");
    MUTATE(set_le(&c, L.align_val, 0, 4), "general.alignment 0", "power of two");
    MUTATE(set_le(&c, L.align_val, 0x80000000u, 4), "w.f16", "alignment 2147483648");
    MUTATE(set_le(&c, L.align_val, 128, 4), "not a multiple of the alignment 128");
    free(good.p);

    /* general.alignment of the wrong type */
    buf b = {0};
    b_put(&b, "GGUF", 4), b_u32(&b, 3), b_u64(&b, 0), b_u64(&b, 1);
    b_key(&b, "general.alignment", ZS_GGUF_U64), b_u64(&b, 32);
    EXPECT_FAIL(b, "general.alignment is u64", "u32");
    free(b.p);

    /* nesting deeper than the limit; then exactly at the limit it opens */
    for (int depth = ZS_GGUF_MAX_NESTING; depth <= ZS_GGUF_MAX_NESTING + 1; depth++) {
        buf nb = {0};
        b_put(&nb, "GGUF", 4), b_u32(&nb, 3), b_u64(&nb, 0), b_u64(&nb, 1);
        b_key(&nb, "deep", ZS_GGUF_ARR);
        for (int i = 1; i < depth; i++) b_u32(&nb, ZS_GGUF_ARR), b_u64(&nb, 1);
        b_u32(&nb, ZS_GGUF_U8), b_u64(&nb, 1), b_le(&nb, 9, 1);
        zs_gguf *g = NULL;
        int rc = zs_gguf_open_mem(nb.p, nb.n, "deep.gguf", &g);
        if (depth <= ZS_GGUF_MAX_NESTING) {
            CHECK(rc == 0, "depth %d: %s", depth, zs_errmsg());
        } else {
            CHECK_ERR(rc, "deep.gguf", "nested");
        }
        zs_gguf_close(g);
        free(nb.p);
    }

    /* an empty key; a file with only a header (no tensors, no kvs) is fine */
    buf e = {0};
    b_put(&e, "GGUF", 4), b_u32(&e, 3), b_u64(&e, 0), b_u64(&e, 1);
    b_key(&e, "", ZS_GGUF_U8), b_le(&e, 1, 1);
    EXPECT_FAIL(e, "empty key");
    e.n = 24;
    set_le(&e, 16, 0, 8);
    zs_gguf *g = NULL;
    CHECK(zs_gguf_open_mem(e.p, e.n, "header-only", &g) == 0, "%s", zs_errmsg());
    CHECK(g && zs_gguf_kv_count(g) == 0 && zs_gguf_tensor_count(g) == 0, "empty");
    zs_gguf_close(g);
    free(e.p);

    /* missing file, directory */
    g = NULL;
    int rc = zs_gguf_open("/nonexistent/x.gguf", &g);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "/nonexistent/x.gguf", "cannot open");
    CHECK_ERR(zs_gguf_open(tmp, &g), "not a regular file");
    CHECK(g == NULL, "no handle");
}

static void test_type_table(void) {
    uint32_t be, bb;
    struct {
        int id;
        const char *name;
        uint32_t be, bb;
    } want[] = {
        {ZS_GGML_F32, "F32", 1, 4},       {ZS_GGML_F16, "F16", 1, 2},
        {ZS_GGML_BF16, "BF16", 1, 2},     {ZS_GGML_Q4_0, "Q4_0", 32, 18},
        {ZS_GGML_Q4_1, "Q4_1", 32, 20},   {ZS_GGML_Q5_0, "Q5_0", 32, 22},
        {ZS_GGML_Q5_1, "Q5_1", 32, 24},   {ZS_GGML_Q8_0, "Q8_0", 32, 34},
        {ZS_GGML_Q8_1, "Q8_1", 32, 40},   {ZS_GGML_Q2_K, "Q2_K", 256, 84},
        {ZS_GGML_Q3_K, "Q3_K", 256, 110}, {ZS_GGML_Q4_K, "Q4_K", 256, 144},
        {ZS_GGML_Q5_K, "Q5_K", 256, 176}, {ZS_GGML_Q6_K, "Q6_K", 256, 210},
        {ZS_GGML_Q8_K, "Q8_K", 256, 292}, {ZS_GGML_IQ2_XXS, "IQ2_XXS", 256, 66},
        {ZS_GGML_IQ4_NL, "IQ4_NL", 32, 18}, {ZS_GGML_IQ4_XS, "IQ4_XS", 256, 136},
        {ZS_GGML_TQ1_0, "TQ1_0", 256, 54}, {ZS_GGML_TQ2_0, "TQ2_0", 256, 66},
        {ZS_GGML_IQ1_M, "IQ1_M", 256, 56},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *nm = zs_gguf_type_name(want[i].id);
        CHECK(nm && strcmp(nm, want[i].name) == 0, "name of %d", want[i].id);
        CHECK(zs_gguf_type_block(want[i].id, &be, &bb) == 0 && be == want[i].be && bb == want[i].bb,
              "block of %s", want[i].name);
    }
    const int gaps[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, ZS_GGML_TYPE_COUNT, 1000};
    for (size_t i = 0; i < sizeof gaps / sizeof *gaps; i++) {
        CHECK(zs_gguf_type_name(gaps[i]) == NULL, "gap %d", gaps[i]);
        CHECK(zs_gguf_type_block(gaps[i], &be, &bb) == ZS_EUNSUPPORTED, "gap %d", gaps[i]);
    }
    int named = 0;
    for (int t = 0; t < ZS_GGML_TYPE_COUNT; t++) named += zs_gguf_type_name(t) != NULL;
    CHECK(named == 34, "%d named types", named);
    size_t nb;
    int64_t ne[4] = {512, 3, 2, 1};
    CHECK(zs_gguf_tensor_nbytes(ZS_GGML_Q4_K, 3, ne, &nb) == 0 && nb == 2 * 144 * 6, "q4_k bytes");
    CHECK(zs_gguf_tensor_nbytes(ZS_GGML_F16, 0, ne, &nb) == 0 && nb == 2, "scalar");
    CHECK_ERR(zs_gguf_tensor_nbytes(ZS_GGML_Q6_K, 1, (int64_t[]){100}, &nb), "multiple", "Q6_K", "256");
    CHECK_ERR(zs_gguf_tensor_nbytes(ZS_GGML_F32, 2, (int64_t[]){4, -1}, &nb), "dimension 1");
    CHECK_ERR(zs_gguf_tensor_nbytes(ZS_GGML_F32, 5, ne, &nb), "dimensions");
    CHECK_ERR(zs_gguf_tensor_nbytes(ZS_GGML_F32, 2, (int64_t[]){INT64_MAX / 2, 4}, &nb), "overflow");
    CHECK_ERR(zs_gguf_tensor_nbytes(ZS_GGML_F64, 1, (int64_t[]){INT64_MAX / 2}, &nb), "overflow");
    CHECK_ERR(zs_gguf_tensor_nbytes(77, 1, ne, &nb), "unknown ggml type id 77");
    CHECK(strcmp(zs_gguf_vtype_name(ZS_GGUF_STR), "string") == 0 &&
          strcmp(zs_gguf_vtype_name(99), "unknown") == 0, "vtype names");
}

/* ---------- the real fixture ---------- */

static void same_bytes(const zs_gguf *g, const zs_st_set *s, const char *gname, const char *sname,
                       int64_t ne0, int64_t ne1) {
    const zs_gguf_tensor *t = zs_gguf_find_tensor(g, gname);
    const zs_st_tensor *st = zs_st_find(s, sname);
    CHECK(t && st, "%s / %s present", gname, sname);
    if (!t || !st) return;
    CHECK(t->type == ZS_GGML_F32 && st->dtype == ZS_F32, "%s F32", gname);
    CHECK(t->ne[0] == ne0 && t->ne[1] == ne1, "%s dims [%lld, %lld]", gname, (long long)t->ne[0],
          (long long)t->ne[1]);
    /* GGUF [ne0, ne1] is row-major [ne1][ne0], the safetensors shape reversed */
    if (ne1 > 1)
        CHECK(st->ndim == 2 && st->shape[0] == ne1 && st->shape[1] == ne0, "%s shape", sname);
    else
        CHECK(st->ndim == 1 && st->shape[0] == ne0, "%s shape", sname);
    CHECK(t->nbytes == st->nbytes && memcmp(t->data, st->data, t->nbytes) == 0,
          "%s equals %s bit for bit", gname, sname);
}

static void test_stories(void) {
    char dir[4096], path[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir);
    zs_gguf *g = NULL;
    int rc = zs_gguf_open(path, &g);
    CHECK(rc == 0, "open %s: %s", path, zs_errmsg());
    if (rc) return;
    CHECK(zs_gguf_version(g) == 3, "version");
    CHECK(zs_gguf_alignment(g) == 32, "alignment");
    CHECK(zs_gguf_data_offset(g) == 14176, "data offset %zu", zs_gguf_data_offset(g));
    CHECK(zs_gguf_kv_count(g) == 19, "kv count %zu", zs_gguf_kv_count(g));
    const char *s;
    size_t len;
    CHECK(zs_gguf_get_str(g, "general.architecture", &s, &len) == 0 && strcmp(s, "llama") == 0 &&
          len == 5, "architecture");
    CHECK(zs_gguf_get_str(g, "tokenizer.ggml.model", &s, NULL) == 0 && strcmp(s, "llama") == 0,
          "tokenizer model");
    struct {
        const char *key;
        uint32_t v;
    } hp[] = {
        {"llama.context_length", 2048},   {"llama.embedding_length", 64},
        {"llama.block_count", 5},         {"llama.attention.head_count", 8},
        {"llama.attention.head_count_kv", 4}, {"llama.feed_forward_length", 172},
        {"llama.rope.dimension_count", 8}, {"tokenizer.ggml.bos_token_id", 1},
        {"tokenizer.ggml.eos_token_id", 2}, {"tokenizer.ggml.unknown_token_id", 0},
    };
    for (size_t i = 0; i < sizeof hp / sizeof *hp; i++) {
        uint32_t v = 0;
        CHECK(zs_gguf_get_u32(g, hp[i].key, &v) == 0 && v == hp[i].v, "%s = %u (%s)", hp[i].key, v,
              zs_errmsg());
    }
    int64_t i64;
    CHECK(zs_gguf_get_i64(g, "llama.context_length", &i64) == 0 && i64 == 2048, "as i64");
    int32_t i32;
    CHECK_ERR(zs_gguf_get_i32(g, "tokenizer.ggml.padding_token_id", &i32), "4294967295",
              "does not fit");
    float eps;
    CHECK(zs_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps) == 0 && eps == 1e-5f,
          "rms eps %g", eps);
    /* this conversion carries no rope.freq_base: the default (10000) applies; absence is
     * ENOTFOUND, not a crash */
    float fb;
    CHECK(zs_gguf_get_f32(g, "llama.rope.freq_base", &fb) == ZS_ENOTFOUND, "no rope.freq_base");

    /* tokenizer arrays */
    int et;
    size_t n;
    CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) == 0 && et == ZS_GGUF_STR && n == 512,
          "tokens");
    CHECK(zs_gguf_arr_str(g, "tokenizer.ggml.tokens", 0, &s, &len) == 0 && strcmp(s, "<unk>") == 0,
          "token 0");
    CHECK(zs_gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s, NULL) == 0 && strcmp(s, "<s>") == 0,
          "token 1");
    CHECK(zs_gguf_arr_str(g, "tokenizer.ggml.tokens", 3, &s, NULL) == 0 && strcmp(s, "<0x00>") == 0,
          "token 3");
    size_t total = 0;
    for (size_t i = 0; i < 512; i++) {
        if (zs_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len) == 0) total += len > 0;
    }
    CHECK(total == 512, "non-empty tokens %zu", total);
    CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n) == 0 && et == ZS_GGUF_F32 && n == 512,
          "scores");
    CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n) == 0 && et == ZS_GGUF_I32 &&
          n == 512, "token types");
    float *scores = malloc(512 * sizeof *scores);
    int32_t *types = malloc(512 * sizeof *types);
    CHECK(zs_gguf_arr_copy_f32(g, "tokenizer.ggml.scores", scores, 512) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_arr_copy_i32(g, "tokenizer.ggml.token_type", types, 512) == 0, "%s", zs_errmsg());
    CHECK(types[0] == 2 && types[1] == 3 && types[2] == 3 && types[3] == 6, "types %d %d %d %d",
          types[0], types[1], types[2], types[3]);
    int normal = 0, finite = 1;
    for (int i = 0; i < 512; i++) {
        normal += types[i] == 1;
        finite &= isfinite(scores[i]);
    }
    CHECK(normal == 512 - 3 - 256, "normal tokens %d", normal);
    CHECK(finite && scores[0] == 0.0f && scores[300] < 0.0f, "scores");
    free(scores);
    free(types);
    CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n) == ZS_ENOTFOUND, "no merges (spm)");

    /* tensors: 3 + 9 per layer */
    CHECK(zs_gguf_tensor_count(g) == 48, "tensor count %zu", zs_gguf_tensor_count(g));
    const char *roles[] = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_norm",
                           "ffn_gate", "ffn_down", "ffn_up", "ffn_norm"};
    const int64_t rne[][2] = {{64, 64}, {64, 32}, {64, 32}, {64, 64}, {64, 1},
                              {64, 172}, {172, 64}, {64, 172}, {64, 1}};
    for (int l = 0; l < 5; l++)
        for (int r = 0; r < 9; r++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, roles[r]);
            const zs_gguf_tensor *t = zs_gguf_find_tensor(g, nm);
            CHECK(t != NULL, "%s", nm);
            if (!t) continue;
            CHECK(t->type == ZS_GGML_F32 && t->n_dims == (rne[r][1] == 1 ? 1 : 2) &&
                  t->ne[0] == rne[r][0] && t->ne[1] == rne[r][1], "%s type/dims", nm);
            CHECK(t->nbytes == (size_t)(rne[r][0] * rne[r][1] * 4), "%s nbytes", nm);
        }
    const zs_gguf_tensor *emb = zs_gguf_find_tensor(g, "token_embd.weight");
    const zs_gguf_tensor *out = zs_gguf_find_tensor(g, "output.weight");
    const zs_gguf_tensor *on = zs_gguf_find_tensor(g, "output_norm.weight");
    CHECK(emb && emb->ne[0] == 64 && emb->ne[1] == 512 && emb->offset == 0, "token_embd");
    CHECK(on && on->n_dims == 1 && on->ne[0] == 64, "output_norm");
    CHECK(out && emb && memcmp(out->data, emb->data, emb->nbytes) == 0, "output == token_embd");
    CHECK(strcmp(zs_gguf_tensor_at(g, 0)->name, "token_embd.weight") == 0, "first tensor");
    CHECK(strcmp(zs_gguf_tensor_at(g, 47)->name, "blk.4.ffn_norm.weight") == 0, "last tensor");
    const zs_gguf_tensor *last = zs_gguf_tensor_at(g, 47);
    CHECK(zs_gguf_data_offset(g) + last->offset + last->nbytes == 1185376, "ends at file end");

    /* bit-equal to the safetensors conversion (tensors the conversion does not permute) */
    zs_st_set *st = NULL;
    rc = zs_st_open_dir(dir, &st);
    CHECK(rc == 0, "open safetensors: %s", zs_errmsg());
    if (rc == 0) {
        same_bytes(g, st, "token_embd.weight", "model.embed_tokens.weight", 64, 512);
        same_bytes(g, st, "output_norm.weight", "model.norm.weight", 64, 1);
        for (int l = 0; l < 5; l++) {
            char a[64], b[80];
            snprintf(a, sizeof a, "blk.%d.ffn_down.weight", l);
            snprintf(b, sizeof b, "model.layers.%d.mlp.down_proj.weight", l);
            same_bytes(g, st, a, b, 172, 64);
            snprintf(a, sizeof a, "blk.%d.attn_norm.weight", l);
            snprintf(b, sizeof b, "model.layers.%d.input_layernorm.weight", l);
            same_bytes(g, st, a, b, 64, 1);
            snprintf(a, sizeof a, "blk.%d.attn_v.weight", l);
            snprintf(b, sizeof b, "model.layers.%d.self_attn.v_proj.weight", l);
            same_bytes(g, st, a, b, 64, 32);
        }
        zs_st_close(st);
    }
    zs_gguf_close(g);

    /* a few truncations of the real file, read into memory */
    FILE *f = fopen(path, "rb");
    uint8_t *all = malloc(1185376);
    size_t got = f && all ? fread(all, 1, 1185376, f) : 0;
    if (f) fclose(f);
    CHECK(got == 1185376, "read fixture");
    if (got == 1185376) {
        int bad = 0;
        for (size_t cut = 0; cut < 14176 + 64; cut += (cut < 200 ? 1 : 37)) {
            zs_gguf *h = NULL;
            int r2 = zs_gguf_open_mem(all, cut, "stories-cut", &h);
            if (r2 == 0) zs_gguf_close(h);
            bad += r2 >= 0 || !strstr(zs_errmsg(), "truncated");
        }
        CHECK(bad == 0, "%d fixture truncations not reported", bad);
        zs_gguf *h = NULL;
        CHECK(zs_gguf_open_mem(all, got, "stories-mem", &h) == 0, "%s", zs_errmsg());
        CHECK(h && zs_gguf_tensor_count(h) == 48, "from memory");
        zs_gguf_close(h);
    }
    free(all);
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "gguf") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    test_type_table();
    test_synthetic();
    test_truncation();
    test_corruptions();
    test_stories();
    tu_rmdir(tmp);
    return tu_finish("test-gguf");
}

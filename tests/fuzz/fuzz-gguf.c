/* fuzz-gguf.c — libFuzzer harness for the GGUF reader (engine/model/gguf.c): parses each input
 * from memory with zs_gguf_open_mem and, when it opens, walks every key/value through the
 * typed getters and array element accessors and touches every tensor's first and last byte,
 * so that a validation gap shows up as an ASan/UBSan report.
 *
 * Built by the Makefile against the instrumented library ($(BUILD)/fuzz/fuzz-gguf, `make fuzz-build`)
 * and run by tests/fuzz/run.sh: briefly in `make test` (tests/e2e-fuzz.sh), FUZZ_TIME seconds in
 * `make fuzz`; seeds: the fixture in fuzz-gguf.seeds (more: the synthetic files test-gguf
 * writes, e.g. kept from its scratch directory). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "gguf.h"

static volatile uint64_t sink;

static void walk_value(const zs_gguf *g, const char *key, int type) {
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool b;
    const char *s;
    size_t len;
    if (zs_gguf_get_u32(g, key, &u32) == 0) sink += u32;
    if (zs_gguf_get_i32(g, key, &i32) == 0) sink += (uint64_t)i32;
    if (zs_gguf_get_u64(g, key, &u64) == 0) sink += u64;
    if (zs_gguf_get_i64(g, key, &i64) == 0) sink += (uint64_t)i64;
    if (zs_gguf_get_f32(g, key, &f) == 0) sink += f == f;
    if (zs_gguf_get_f64(g, key, &d) == 0) sink += d == d;
    if (zs_gguf_get_bool(g, key, &b) == 0) sink += b;
    if (zs_gguf_get_str(g, key, &s, &len) == 0) sink += len ? (uint8_t)s[len - 1] + (uint8_t)s[len] : 0;
    if (type != ZS_GGUF_ARR) return;
    int et;
    size_t n;
    if (zs_gguf_get_arr(g, key, &et, &n) != 0) __builtin_trap();
    for (size_t i = 0; i < n && i < 4096; i++) {
        if (zs_gguf_arr_str(g, key, i, &s, &len) == 0) sink += len ? (uint8_t)s[len - 1] : 0;
        if (zs_gguf_arr_u32(g, key, i, &u32) == 0) sink += u32;
        if (zs_gguf_arr_i32(g, key, i, &i32) == 0) sink += (uint64_t)i32;
        if (zs_gguf_arr_i64(g, key, i, &i64) == 0) sink += (uint64_t)i64;
        if (zs_gguf_arr_f32(g, key, i, &f) == 0) sink += f == f;
        if (zs_gguf_arr_f64(g, key, i, &d) == 0) sink += d == d;
        int et2;
        size_t n2;
        if (zs_gguf_arr_arr(g, key, i, &et2, &n2) == 0) sink += n2 + (unsigned)et2;
    }
    if (n <= 4096 && et != ZS_GGUF_STR && et != ZS_GGUF_ARR) {
        float fb[4096];
        int32_t ib[4096];
        sink += zs_gguf_arr_copy_f32(g, key, fb, n) == 0;
        sink += zs_gguf_arr_copy_i32(g, key, ib, n) == 0;
    }
    if (zs_gguf_arr_f32(g, key, n, &f) == 0) __builtin_trap(); /* one past the end must fail */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zs_log_set_level(ZS_LOG_ERROR);
    zs_gguf *g = NULL;
    int rc = zs_gguf_open_mem(data, size, "fuzz", &g);
    if (rc < 0) {
        if (g || zs_errmsg()[0] == 0) __builtin_trap(); /* every failure carries a message */
        return 0;
    }
    size_t nkv = zs_gguf_kv_count(g);
    for (size_t i = 0; i < nkv; i++) {
        const char *key = zs_gguf_kv_key(g, i);
        if (!key || zs_gguf_find_key(g, key) != (long)i) __builtin_trap();
        walk_value(g, key, zs_gguf_kv_type(g, i));
    }
    size_t nt = zs_gguf_tensor_count(g);
    for (size_t i = 0; i < nt; i++) {
        const zs_gguf_tensor *t = zs_gguf_tensor_at(g, i);
        if (zs_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size || t->nbytes == 0) __builtin_trap();
        sink += p[0] + p[t->nbytes - 1];
        size_t nb;
        if (zs_gguf_tensor_nbytes(t->type, t->n_dims, t->ne, &nb) != 0 || nb != t->nbytes)
            __builtin_trap();
    }
    zs_gguf_close(g);
    return 0;
}

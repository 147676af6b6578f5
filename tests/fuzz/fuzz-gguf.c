/* fuzz-gguf.c — libFuzzer harness for the GGUF reader (engine/model/gguf.c): parses each input
 * from memory with zs_gguf_open_mem and, when it opens, walks every key/value through the
 * typed getters and array element accessors and touches every tensor's first and last byte,
 * so that a validation gap shows up as an ASan/UBSan report. Then what serving the file does:
 * the model configuration from its metadata (zs_config_from_gguf), and from the same bytes as a
 * file in a per-process directory under /dev/shm, the model loader's check of every tensor
 * (zs_model_open), the vocabulary as a tokenizer (zs_model_tokenizer_load; encoded and decoded
 * as fuzz-tokenizer does) and the chat template's family (zs_model_chat_template_detect).
 *
 * Built by the Makefile against the instrumented library ($(BUILD)/fuzz/fuzz-gguf, `make fuzz-build`)
 * and run by tests/fuzz/run.sh: briefly in `make test` (tests/e2e-fuzz.sh), FUZZ_TIME seconds in
 * `make fuzz`; seeds: the fixture in fuzz-gguf.seeds (more: the synthetic files test-gguf
 * writes, e.g. kept from its scratch directory). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "common.h"
#include "config.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"
#include "fuzz-checks.h"
#include "fuzz-util.h"

static volatile uint64_t sink;
static char fz_dir[64], fz_path[128];

static void fz_cleanup(void) { fz_remove(fz_dir); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    zs_log_set_level(ZS_LOG_ERROR);
    fz_scratch_make(fz_dir, sizeof fz_dir, "gguf");
    snprintf(fz_path, sizeof fz_path, "%s/model.gguf", fz_dir);
    atexit(fz_cleanup);
    return 0;
}

/* What a server does with a GGUF file that opened: its model configuration (in memory), then,
 * from the same bytes as a file (these readers take a path), every tensor the architecture needs
 * checked by the model loader, the vocabulary as a tokenizer and the chat template's family. */
static void fz_as_model(const zs_gguf *g, const uint8_t *data, size_t size) {
    zs_model_config *c = malloc(sizeof *c);
    if (!c) return;
    int cfg_ok = zs_config_from_gguf(g, c) == 0;
    if (cfg_ok) fz_check_config(c);
    else if (zs_errmsg()[0] == 0) __builtin_trap();
    free(c);
    fz_write(fz_dir, "model.gguf", data, size);
    zs_model *m = NULL;
    if (zs_model_open(fz_path, NULL, &m) == 0) {
        if (!cfg_ok) __builtin_trap(); /* the loader reads the same configuration */
        zs_model_free(m);
    } else if (m || zs_errmsg()[0] == 0) {
        __builtin_trap();
    }
    zs_tokenizer *t = NULL;
    if (zs_model_tokenizer_load(fz_path, &t) == 0) {
        fz_check_tokenizer(t, NULL, 0);
        zs_tokenizer_free(t);
    } else if (t || zs_errmsg()[0] == 0) {
        __builtin_trap();
    }
    int fam = zs_model_chat_template_detect(fz_path);
    if (fam < 0 || fam >= ZS_CHAT_NFAMILIES) __builtin_trap();
    fz_write(fz_dir, "model.gguf", NULL, 0);
}

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
    fz_as_model(g, data, size);
    zs_gguf_close(g);
    return 0;
}

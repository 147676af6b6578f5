/* test-gguf-write.c — tests of the GGUF writer (engine/model/gguf-write.h), the Hugging Face ->
 * GGUF conversion (gguf-convert.h, runtime/convert.h) and the tokenizer export
 * (tokenizer-export.h):
 *   - every key/value type and array (empty ones too), an explicit and the default alignment,
 *     tensors streamed in odd splits, all read back by the GGUF reader;
 *   - every refused call (duplicates, long names, bad dims, late keys, too many or too few
 *     bytes), a missing directory, and a write failure (a file size limit): the error names
 *     the path, neither the file nor its temporary is left, an older file stays as it was;
 *   - stories260K converted at f32 equals the llama.cpp-made stories260K.gguf tensor for tensor,
 *     byte for byte (its output.weight is our tied token_embd), with the same hyperparameters
 *     (context length aside: config.json says 512), tokens, token types and, for every merged
 *     piece, the same score; at q8_0 every Q8_0 tensor is the quantization of the reference
 *     file's F32 rows (permutation included) and ffn_down (rows of 172) is F16;
 *   - GPT-2: token_embd, position_embd, the fused attn_qkv (c_attn transposed);
 *   - tokenizer exports: stories260K (llama), GPT-2's 50257-token BPE (gpt2, "gpt-2", 50000
 *     merges; the tokenizer built back encodes the reference strings to the reference ids),
 *     gpt2-bytes (no merges), padding to a larger vocab, and a tokenizer.json that cannot be a
 *     llama.cpp vocabulary. Run from the repo root. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "common.h"
#include "convert.h"
#include "gguf-convert.h"
#include "gguf-write.h"
#include "gguf.h"
#include "safetensors.h"
#include "tensor.h"
#include "testutil.h"
#include "tokenizer-export.h"

static char tmp[4096];

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* tmp/name in a rotating buffer: copy it to keep it past the next few calls */
static char *path_in(const char *name) {
    static char buf[4][4200];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmp, name);
    return b;
}

/* ---------------------------------------------------------------- the writer */

static void test_roundtrip(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path_in("rt.gguf"));
    zs_gguf_writer *w;
    CHECK(zs_gguf_writer_open(p, &w) == 0, "%s", zs_errmsg());
    CHECK(exists(path_in("rt.gguf.tmp")) && !exists(p), "the temporary exists from the start, the file not yet");
    const char *strs[3] = {"a", "", "h\xc3\xa9llo"};
    const uint8_t u8[3] = {1, 2, 255};
    const int32_t i32[2] = {-7, 2147483647};
    const float f32[2] = {1.5f, -0.25f};
    const bool bl[2] = {true, false};
    CHECK(zs_gguf_writer_kv_u32(w, "general.alignment", 64) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_str(w, "s", "text") == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_strn(w, "s0", "a\0b", 3) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_u32(w, "u32", 4000000000u) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_i32(w, "i32", -5) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_u64(w, "u64", 1ull << 40) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_f32(w, "f32", 1e-5f) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_bool(w, "b", true) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr(w, "a.u8", ZS_GGUF_U8, u8, 3) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr(w, "a.i32", ZS_GGUF_I32, i32, 2) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr(w, "a.f32", ZS_GGUF_F32, f32, 2) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr(w, "a.bool", ZS_GGUF_BOOL, bl, 2) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr_str(w, "a.str", strs, NULL, 3) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_kv_arr_str(w, "a.empty", NULL, NULL, 0) == 0, "%s", zs_errmsg());
    int64_t ne_a[1] = {5}, ne_b[2] = {64, 2}, ne_c[3] = {3, 2, 1};
    CHECK(zs_gguf_writer_add_tensor(w, "a", ZS_GGML_F32, 1, ne_a) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_add_tensor(w, "b", ZS_GGML_Q8_0, 2, ne_b) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_add_tensor(w, "c", ZS_GGML_F16, 3, ne_c) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_tensor_count(w) == 3, "count");
    float av[5] = {1, 2, 3, 4, 5};
    float bv[128];
    for (int i = 0; i < 128; i++) bv[i] = (float)sin(i * 0.37) * 3;
    uint8_t bq[4 * ZS_Q8_0_BYTES];
    zs_quantize_q8_0(bq, bv, 128);
    uint16_t cv[6];
    for (int i = 0; i < 6; i++) cv[i] = zs_f32_to_f16((float)i - 2.5f);
    /* a and the start of b in one call, the rest of b byte by byte, c in two */
    uint8_t first[20 + 7];
    memcpy(first, av, 20);
    memcpy(first + 20, bq, 7);
    CHECK(zs_gguf_writer_write(w, first, sizeof first) == 0, "%s", zs_errmsg());
    int ok = 1;
    for (size_t i = 7; i < sizeof bq; i++) ok &= zs_gguf_writer_write(w, bq + i, 1) == 0;
    CHECK(ok, "byte-wise write");
    CHECK(zs_gguf_writer_kv_u32(w, "late", 1) < 0, "a key after data is refused");
    CHECK(strstr(zs_errmsg(), "late") != NULL, "%s", zs_errmsg());
    /* the writer is failed now: the rest is refused and close removes everything */
    CHECK(zs_gguf_writer_write(w, cv, 4) < 0, "writes after a failure are refused");
    CHECK(zs_gguf_writer_close(w) < 0, "close of a failed writer fails");
    CHECK(!exists(p) && !exists(path_in("rt.gguf.tmp")), "a failed writer leaves no file");

    /* again, without the mistake */
    CHECK(zs_gguf_writer_open(p, &w) == 0, "%s", zs_errmsg());
    zs_gguf_writer_kv_u32(w, "general.alignment", 64);
    zs_gguf_writer_kv_str(w, "s", "text");
    zs_gguf_writer_kv_strn(w, "s0", "a\0b", 3);
    zs_gguf_writer_kv_u32(w, "u32", 4000000000u);
    zs_gguf_writer_kv_i32(w, "i32", -5);
    zs_gguf_writer_kv_u64(w, "u64", 1ull << 40);
    zs_gguf_writer_kv_f32(w, "f32", 1e-5f);
    zs_gguf_writer_kv_bool(w, "b", true);
    zs_gguf_writer_kv_arr(w, "a.u8", ZS_GGUF_U8, u8, 3);
    zs_gguf_writer_kv_arr(w, "a.i32", ZS_GGUF_I32, i32, 2);
    zs_gguf_writer_kv_arr(w, "a.f32", ZS_GGUF_F32, f32, 2);
    zs_gguf_writer_kv_arr(w, "a.bool", ZS_GGUF_BOOL, bl, 2);
    zs_gguf_writer_kv_arr_str(w, "a.str", strs, NULL, 3);
    zs_gguf_writer_kv_arr_str(w, "a.empty", NULL, NULL, 0);
    zs_gguf_writer_add_tensor(w, "a", ZS_GGML_F32, 1, ne_a);
    zs_gguf_writer_add_tensor(w, "b", ZS_GGML_Q8_0, 2, ne_b);
    CHECK(zs_gguf_writer_add_tensor(w, "c", ZS_GGML_F16, 3, ne_c) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_data_bytes(w) == 64 + 192 + 64, "padded data bytes %llu",
          (unsigned long long)zs_gguf_writer_data_bytes(w));
    CHECK(zs_gguf_writer_write(w, first, sizeof first) == 0, "%s", zs_errmsg());
    ok = 1;
    for (size_t i = 7; i < sizeof bq; i++) ok &= zs_gguf_writer_write(w, bq + i, 1) == 0;
    ok &= zs_gguf_writer_write(w, cv, 5) == 0 && zs_gguf_writer_write(w, (char *)cv + 5, 7) == 0;
    CHECK(ok, "%s", zs_errmsg());
    CHECK(zs_gguf_writer_close(w) == 0, "%s", zs_errmsg());
    CHECK(exists(p) && !exists(path_in("rt.gguf.tmp")), "the file is in place, its temporary gone");

    zs_gguf *g;
    CHECK(zs_gguf_open(p, &g) == 0, "%s", zs_errmsg());
    if (!g) return;
    CHECK(zs_gguf_version(g) == 3 && zs_gguf_alignment(g) == 64 && zs_gguf_data_offset(g) % 64 == 0, "version/align");
    CHECK(zs_gguf_kv_count(g) == 14 && !strcmp(zs_gguf_kv_key(g, 0), "general.alignment"), "kv order");
    const char *s;
    size_t sl;
    uint32_t u;
    int32_t i;
    uint64_t u64;
    float f;
    bool b;
    CHECK(zs_gguf_get_str(g, "s", &s, NULL) == 0 && !strcmp(s, "text"), "str");
    CHECK(zs_gguf_get_str(g, "s0", &s, &sl) == 0 && sl == 3 && !memcmp(s, "a\0b", 3), "str with NUL");
    CHECK(zs_gguf_get_u32(g, "u32", &u) == 0 && u == 4000000000u, "u32");
    CHECK(zs_gguf_get_i32(g, "i32", &i) == 0 && i == -5, "i32");
    CHECK(zs_gguf_get_u64(g, "u64", &u64) == 0 && u64 == 1ull << 40, "u64");
    CHECK(zs_gguf_get_f32(g, "f32", &f) == 0 && f == 1e-5f, "f32");
    CHECK(zs_gguf_get_bool(g, "b", &b) == 0 && b, "bool");
    int et;
    size_t n;
    CHECK(zs_gguf_get_arr(g, "a.u8", &et, &n) == 0 && et == ZS_GGUF_U8 && n == 3, "u8 array");
    CHECK(zs_gguf_arr_u32(g, "a.u8", 2, &u) == 0 && u == 255, "u8[2]");
    CHECK(zs_gguf_arr_i32(g, "a.i32", 0, &i) == 0 && i == -7 && zs_gguf_arr_i32(g, "a.i32", 1, &i) == 0 &&
          i == 2147483647, "i32 array");
    CHECK(zs_gguf_arr_f32(g, "a.f32", 1, &f) == 0 && f == -0.25f, "f32 array");
    CHECK(zs_gguf_get_arr(g, "a.bool", &et, &n) == 0 && et == ZS_GGUF_BOOL && n == 2, "bool array");
    CHECK(zs_gguf_arr_str(g, "a.str", 2, &s, &sl) == 0 && !strcmp(s, "h\xc3\xa9llo"), "str array");
    CHECK(zs_gguf_arr_str(g, "a.str", 1, &s, &sl) == 0 && sl == 0, "empty string element");
    CHECK(zs_gguf_get_arr(g, "a.empty", &et, &n) == 0 && et == ZS_GGUF_STR && n == 0, "empty array");
    const zs_gguf_tensor *ta = zs_gguf_find_tensor(g, "a"), *tb = zs_gguf_find_tensor(g, "b"),
                         *tc = zs_gguf_find_tensor(g, "c");
    CHECK(ta && tb && tc, "tensors");
    if (ta && tb && tc) {
        CHECK(ta->type == ZS_GGML_F32 && ta->n_dims == 1 && ta->ne[0] == 5 && !memcmp(ta->data, av, 20), "a");
        CHECK(tb->type == ZS_GGML_Q8_0 && tb->n_dims == 2 && tb->ne[1] == 2 && tb->offset == 64 &&
              !memcmp(tb->data, bq, sizeof bq), "b");
        CHECK(tc->type == ZS_GGML_F16 && tc->n_dims == 3 && tc->ne[2] == 1 && tc->offset == 256 &&
              !memcmp(tc->data, cv, 12), "c");
    }
    zs_gguf_close(g);

    /* default alignment, no tensors at all */
    char p2[4200];
    snprintf(p2, sizeof p2, "%s", path_in("empty.gguf"));
    CHECK(zs_gguf_writer_open(p2, &w) == 0 && zs_gguf_writer_kv_str(w, "k", "v") == 0 && zs_gguf_writer_close(w) == 0,
          "%s", zs_errmsg());
    CHECK(zs_gguf_open(p2, &g) == 0 && zs_gguf_alignment(g) == 32 && zs_gguf_tensor_count(g) == 0, "%s", zs_errmsg());
    zs_gguf_close(g);
}

static void test_refusals(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path_in("bad.gguf"));
    zs_gguf_writer *w;
    int64_t ne[2] = {32, 1}, odd[2] = {33, 1}, zero[2] = {0, 1};
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = 0;
    struct {
        const char *what, *needle;
    } cases[] = {
        {"dup key", "twice"},       {"dup tensor", "twice"},      {"long name", "bytes"},
        {"ne0 not a block", "multiple"}, {"0 dims", "dimensions"}, {"dim 0", "dimension"},
        {"alignment 3", "power of two"}, {"alignment late", "after tensors"}, {"too much data", "past"},
        {"too little data", "got"},  {"tensor after data", "after tensor data"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CHECK(zs_gguf_writer_open(p, &w) == 0, "%s", zs_errmsg());
        int rc = 0;
        char data[256] = {0};
        switch (k) {
        case 0: zs_gguf_writer_kv_u32(w, "a", 1); rc = zs_gguf_writer_kv_str(w, "a", "x"); break;
        case 1: zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 2, ne); rc = zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 2, ne); break;
        case 2: rc = zs_gguf_writer_add_tensor(w, longname, ZS_GGML_F32, 2, ne); break;
        case 3: rc = zs_gguf_writer_add_tensor(w, "t", ZS_GGML_Q8_0, 2, odd); break;
        case 4: rc = zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 0, ne); break;
        case 5: rc = zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 2, zero); break;
        case 6: rc = zs_gguf_writer_kv_u32(w, "general.alignment", 3); break;
        case 7: zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 2, ne); rc = zs_gguf_writer_kv_u32(w, "general.alignment", 64); break;
        case 8: zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 1, ne); zs_gguf_writer_write(w, data, 128);
                rc = zs_gguf_writer_write(w, data, 64); break;
        case 9: zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 1, ne); zs_gguf_writer_write(w, data, 60);
                rc = zs_gguf_writer_close(w); w = NULL; break;
        case 10: zs_gguf_writer_add_tensor(w, "t", ZS_GGML_F32, 1, ne); zs_gguf_writer_write(w, data, 8);
                 rc = zs_gguf_writer_add_tensor(w, "u", ZS_GGML_F32, 1, ne); break;
        }
        CHECK(rc < 0, "%s: refused", cases[k].what);
        CHECK(strstr(zs_errmsg(), cases[k].needle) && strstr(zs_errmsg(), "bad.gguf"), "%s: message \"%s\"",
              cases[k].what, zs_errmsg());
        if (w) CHECK(zs_gguf_writer_close(w) < 0, "%s: close after a refusal fails", cases[k].what);
        CHECK(!exists(p) && !exists(path_in("bad.gguf.tmp")), "%s: no file left", cases[k].what);
    }
    /* a missing directory: the error names the path, nothing is created */
    char nd[4200];
    snprintf(nd, sizeof nd, "%s", path_in("no-such-dir/x.gguf"));
    CHECK_ERR(zs_gguf_writer_open(nd, &w), "no-such-dir/x.gguf", "cannot create");
    /* abort removes the temporary */
    CHECK(zs_gguf_writer_open(p, &w) == 0, "%s", zs_errmsg());
    zs_gguf_writer_abort(w);
    CHECK(!exists(path_in("bad.gguf.tmp")), "abort removes the temporary");
}

/* A write that fails (a file size limit: EFBIG, as a full disk gives ENOSPC) is reported with the
 * path; an older file at the path stays as it was; nothing else is left. */
static void test_write_failure(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s", path_in("full.gguf"));
    CHECK(tu_write_file(p, "old", 3) == 0, "old file");
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 256 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) {
        fprintf(stderr, "skip: cannot set a file size limit: %s\n", strerror(errno));
        signal(SIGXFSZ, prev);
        return;
    }
    zs_gguf_writer *w;
    int rc = zs_gguf_writer_open(p, &w);
    CHECK(rc == 0, "%s", zs_errmsg());
    int64_t ne[2] = {1024, 1024};
    rc = zs_gguf_writer_add_tensor(w, "big", ZS_GGML_F32, 2, ne);
    float *row = calloc(1024, sizeof *row);
    for (int r = 0; rc == 0 && r < 1024; r++) rc = zs_gguf_writer_write(w, row, 4096);
    if (rc == 0) rc = zs_gguf_writer_close(w);
    else zs_gguf_writer_abort(w);
    free(row);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK(rc == ZS_ENOSPC, "a failed write is ZS_ENOSPC, got %d (%s)", rc, zs_errmsg());
    CHECK(strstr(zs_errmsg(), "full.gguf") != NULL, "the message names the file: %s", zs_errmsg());
    char buf[8] = {0};
    FILE *f = fopen(p, "rb");
    CHECK(f && fread(buf, 1, 8, f) == 3 && !memcmp(buf, "old", 3), "the older file is untouched");
    if (f) fclose(f);
    CHECK(!exists(path_in("full.gguf.tmp")), "no temporary left");
}

/* ---------------------------------------------------------------- conversion */

/* Converts dir at ftype into path (what `zeroserve convert` runs); keep gets the plan. */
static int convert(const char *dir, zs_llama_ftype ft, const char *path, zs_gguf_conv **keep) {
    zs_convert_opts o = {.model_dir = dir, .out_path = path, .ftype = ft};
    zs_convert_result r;
    int rc = zs_convert_run(&o, &r);
    if (rc == 0 && keep) *keep = r.plan;
    else if (rc == 0) zs_gguf_conv_close(r.plan);
    return rc;
}

static void same_u32(const zs_gguf *a, const zs_gguf *b, const char *key) {
    uint32_t x = 0, y = 1;
    CHECK(zs_gguf_get_u32(a, key, &x) == 0 && zs_gguf_get_u32(b, key, &y) == 0 && x == y, "%s: %u vs %u", key, x, y);
}

static void test_stories(void) {
    char dir[4096], ref[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(ref, sizeof ref, "%s/stories260K.gguf", dir);
    char p[4200];
    snprintf(p, sizeof p, "%s", path_in("s32.gguf"));
    CHECK(convert(dir, ZS_FTYPE_ALL_F32, p, NULL) == 0, "%s", zs_errmsg());
    zs_gguf *a = NULL, *r = NULL;
    CHECK(zs_gguf_open(p, &a) == 0, "%s", zs_errmsg());
    CHECK(zs_gguf_open(ref, &r) == 0, "%s", zs_errmsg());
    if (!a || !r) goto out;
    const char *keys[] = {"llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
                          "llama.attention.head_count_kv", "llama.block_count", "llama.rope.dimension_count",
                          "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) same_u32(a, r, keys[k]);
    uint32_t ctx = 0, ft = 9;
    float e1 = 0, e2 = 1;
    CHECK(zs_gguf_get_u32(a, "llama.context_length", &ctx) == 0 && ctx == 512, "context_length %u (config.json)", ctx);
    CHECK(zs_gguf_get_u32(a, "general.file_type", &ft) == 0 && ft == 0, "file type %u", ft);
    CHECK(zs_gguf_get_f32(a, "llama.attention.layer_norm_rms_epsilon", &e1) == 0 &&
          zs_gguf_get_f32(r, "llama.attention.layer_norm_rms_epsilon", &e2) == 0 && e1 == e2, "eps");
    const char *s1, *s2;
    CHECK(zs_gguf_get_str(a, "general.architecture", &s1, NULL) == 0 && !strcmp(s1, "llama"), "arch");
    CHECK(zs_gguf_get_str(a, "tokenizer.ggml.model", &s1, NULL) == 0 && !strcmp(s1, "llama"), "tokenizer model");
    size_t na = 0, nr = 0;
    zs_gguf_get_arr(a, "tokenizer.ggml.tokens", NULL, &na);
    zs_gguf_get_arr(r, "tokenizer.ggml.tokens", NULL, &nr);
    CHECK(na == 512 && nr == 512, "tokens %zu", na);
    int tok_same = 1, type_same = 1, score_same = 1, n_merged = 0;
    float lowest = 0;
    for (size_t i = 0; i < na; i++) {
        float x;
        zs_gguf_arr_f32(a, "tokenizer.ggml.scores", i, &x);
        if (x < lowest) lowest = x;
    }
    for (size_t i = 0; i < na && i < nr; i++) {
        size_t l1, l2;
        int32_t t1, t2;
        float x, y;
        zs_gguf_arr_str(a, "tokenizer.ggml.tokens", i, &s1, &l1);
        zs_gguf_arr_str(r, "tokenizer.ggml.tokens", i, &s2, &l2);
        tok_same &= l1 == l2 && !memcmp(s1, s2, l1);
        zs_gguf_arr_i32(a, "tokenizer.ggml.token_type", i, &t1);
        zs_gguf_arr_i32(r, "tokenizer.ggml.token_type", i, &t2);
        type_same &= t1 == t2;
        zs_gguf_arr_f32(a, "tokenizer.ggml.scores", i, &x);
        zs_gguf_arr_f32(r, "tokenizer.ggml.scores", i, &y);
        if (x > lowest) score_same &= x == y, n_merged++; /* a merged piece: its score is the original's */
    }
    CHECK(tok_same && type_same, "tokens and token types equal the reference");
    CHECK(score_same && n_merged > 100, "scores of the %d merged pieces equal the reference", n_merged);
    CHECK(zs_gguf_tensor_count(a) == 47 && zs_gguf_tensor_count(r) == 48, "47 tensors (48 in the reference: output)");
    CHECK(!zs_gguf_find_tensor(a, "output.weight"), "a tied model has no output.weight");
    int same = 1;
    for (size_t i = 0; i < zs_gguf_tensor_count(a); i++) {
        const zs_gguf_tensor *t = zs_gguf_tensor_at(a, i), *u = zs_gguf_find_tensor(r, t->name);
        int ok = u && t->type == u->type && t->n_dims == u->n_dims && !memcmp(t->ne, u->ne, sizeof t->ne) &&
                 t->nbytes == u->nbytes && !memcmp(t->data, u->data, t->nbytes);
        if (!ok) fprintf(stderr, "tensor %s differs from the reference\n", t->name);
        same &= ok;
    }
    CHECK(same, "every tensor equals the reference byte for byte");
    const zs_gguf_tensor *te = zs_gguf_find_tensor(a, "token_embd.weight"), *to = zs_gguf_find_tensor(r, "output.weight");
    CHECK(te && to && te->nbytes == to->nbytes && !memcmp(te->data, to->data, te->nbytes), "output = token_embd");
    zs_gguf_close(a);
    a = NULL;

    /* q8_0: every Q8_0 tensor is the reference's F32 rows quantized; ffn_down (rows of 172) F16 */
    snprintf(p, sizeof p, "%s", path_in("s8.gguf"));
    zs_gguf_conv *c = NULL;
    CHECK(convert(dir, ZS_FTYPE_MOSTLY_Q8_0, p, &c) == 0, "%s", zs_errmsg());
    if (c) {
        size_t nf16 = 0;
        for (size_t i = 0; i < zs_gguf_conv_count(c); i++) nf16 += zs_gguf_conv_at(c, i)->type == ZS_GGML_F16;
        CHECK(nf16 == 5, "5 F16 fallbacks, got %zu", nf16);
        zs_gguf_conv_close(c);
    }
    CHECK(zs_gguf_open(p, &a) == 0, "%s", zs_errmsg());
    if (!a) goto out;
    int nq = 0, qsame = 1, f16same = 1;
    for (size_t i = 0; i < zs_gguf_tensor_count(a); i++) {
        const zs_gguf_tensor *t = zs_gguf_tensor_at(a, i), *u = zs_gguf_find_tensor(r, t->name);
        if (!u || u->type != ZS_GGML_F32) continue;
        size_t n = (size_t)(u->ne[0] * u->ne[1]);
        uint8_t *buf = malloc(t->nbytes);
        if (t->type == ZS_GGML_Q8_0) {
            zs_quantize_q8_0(buf, u->data, n);
            qsame &= !memcmp(buf, t->data, t->nbytes);
            nq++;
        } else if (t->type == ZS_GGML_F16) {
            zs_convert(buf, ZS_F16, u->data, ZS_F32, n);
            f16same &= !memcmp(buf, t->data, t->nbytes) && strstr(t->name, "ffn_down");
        } else {
            CHECK(t->type == ZS_GGML_F32 && t->n_dims == 1, "%s: 1-D F32", t->name);
        }
        free(buf);
    }
    CHECK(nq == 31 && qsame, "%d Q8_0 tensors equal the reference quantized", nq);
    CHECK(f16same, "the F16 fallbacks are ffn_down, equal to the reference in F16");
out:
    zs_gguf_close(a);
    zs_gguf_close(r);
}

static void test_gpt2(void) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "gpt2-bytes");
    char p[4200];
    snprintf(p, sizeof p, "%s", path_in("g.gguf"));
    CHECK(convert(dir, ZS_FTYPE_ALL_F32, p, NULL) == 0, "%s", zs_errmsg());
    zs_gguf *a = NULL;
    zs_st_set *st = NULL;
    CHECK(zs_gguf_open(p, &a) == 0, "%s", zs_errmsg());
    CHECK(zs_st_open_dir(dir, &st) == 0, "%s", zs_errmsg());
    if (!a || !st) goto out;
    const char *s;
    CHECK(zs_gguf_get_str(a, "general.architecture", &s, NULL) == 0 && !strcmp(s, "gpt2"), "arch");
    float eps = 0;
    CHECK(zs_gguf_get_f32(a, "gpt2.attention.layer_norm_epsilon", &eps) == 0 && eps == 1e-5f, "eps");
    CHECK(zs_gguf_tensor_count(a) == 52, "52 tensors, got %zu", zs_gguf_tensor_count(a));
    const zs_gguf_tensor *qkv = zs_gguf_find_tensor(a, "blk.1.attn_qkv.weight");
    const zs_st_tensor *ca = zs_st_find(st, "transformer.h.1.attn.c_attn.weight");
    CHECK(qkv && ca && qkv->ne[0] == 64 && qkv->ne[1] == 192 && ca->shape[0] == 64 && ca->shape[1] == 192, "qkv shape");
    if (qkv && ca) {
        const float *x = qkv->data, *y = ca->data;
        int ok = 1;
        for (int r = 0; r < 192; r++)
            for (int i = 0; i < 64; i++) ok &= x[r * 64 + i] == y[i * 192 + r];
        CHECK(ok, "attn_qkv is c_attn transposed");
    }
    const zs_gguf_tensor *pe = zs_gguf_find_tensor(a, "position_embd.weight");
    const zs_st_tensor *wpe = zs_st_find(st, "transformer.wpe.weight");
    CHECK(pe && wpe && pe->type == ZS_GGML_F32 && pe->nbytes == wpe->nbytes && !memcmp(pe->data, wpe->data, pe->nbytes),
          "position_embd");
    CHECK(zs_gguf_find_tensor(a, "output_norm.bias") && !zs_gguf_find_tensor(a, "output.weight"), "head");
out:
    zs_gguf_close(a);
    zs_st_close(st);
    /* q8_0: GPT-2's position table stays F32 (convert_hf_to_gguf.py) */
    zs_gguf_conv *c = NULL;
    CHECK(zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q8_0, &c) == 0, "%s", zs_errmsg());
    for (size_t i = 0; c && i < zs_gguf_conv_count(c); i++) {
        const zs_gguf_conv_tensor *t = zs_gguf_conv_at(c, i);
        if (!strcmp(t->name, "position_embd.weight")) CHECK(t->type == ZS_GGML_F32, "position_embd F32");
        if (!strcmp(t->name, "blk.0.attn_qkv.weight")) CHECK(t->type == ZS_GGML_Q8_0, "attn_qkv Q8_0");
    }
    zs_gguf_conv_close(c);
}

static void test_conv_errors(void) {
    zs_gguf_conv *c = NULL;
    CHECK_ERR(zs_gguf_conv_open(path_in("nothing-here"), ZS_FTYPE_ALL_F32, &c), "nothing-here", "no such");
    char g[4200];
    snprintf(g, sizeof g, "%s/models/stories260K/stories260K.gguf", tu_shared());
    CHECK_ERR(zs_gguf_conv_open(g, ZS_FTYPE_ALL_F32, &c), "not a directory");
    zs_llama_ftype f;
    CHECK_ERR(zs_llama_ftype_parse("q3_k", &f), "q3_k", "q4_k_m");
    CHECK(zs_llama_ftype_parse("Q4_K_M", &f) == 0 && f == ZS_FTYPE_MOSTLY_Q4_K_M, "q4_k_m parses");
    /* q4_k_m on stories260K: rows of 64 fall back as llama-quantize's do */
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    CHECK(zs_gguf_conv_open(dir, ZS_FTYPE_MOSTLY_Q4_K_M, &c) == 0, "%s", zs_errmsg());
    for (size_t i = 0; c && i < zs_gguf_conv_count(c); i++) {
        const zs_gguf_conv_tensor *t = zs_gguf_conv_at(c, i);
        zs_ggml_type want = t->n_dims == 1 ? ZS_GGML_F32
                          : strstr(t->name, "ffn_down") ? ZS_GGML_F16
                          : !strcmp(t->name, "token_embd.weight") ? ZS_GGML_Q8_0
                          : (!strcmp(t->name, "blk.2.attn_v.weight") || !strcmp(t->name, "blk.4.attn_v.weight"))
                              ? ZS_GGML_Q8_0 : ZS_GGML_Q5_0;
        CHECK(t->type == want, "%s: %s, want %s", t->name, zs_gguf_type_name((int)t->type), zs_gguf_type_name((int)want));
    }
    zs_gguf_conv_close(c);
}

/* ---------------------------------------------------------------- tokenizer export */

static void test_export(void) {
    char dir[4096];
    zs_tok_export *e = NULL;
    tu_model_dir(dir, sizeof dir, "stories260K");
    CHECK(zs_tokenizer_export(dir, 0, &e) == 0, "%s", zs_errmsg());
    if (e) {
        CHECK(!strcmp(e->model, "llama") && e->spec.kind == ZS_TOK_SPEC_SPM && e->spec.n_vocab == 512, "stories kind");
        CHECK(e->spec.bos == 1 && e->spec.eos == 2 && e->spec.unk == 0 && e->spec.add_bos == 1 && e->spec.add_eos == 0 &&
              e->spec.add_space_prefix == 1 && e->pad == -1 && !e->chat_template, "stories specials");
        CHECK(e->spec.types[0] == ZS_TOKTYPE_UNKNOWN && e->spec.types[1] == ZS_TOKTYPE_CONTROL &&
              e->spec.types[3] == ZS_TOKTYPE_BYTE && e->spec.types[300] == ZS_TOKTYPE_NORMAL, "stories types");
        zs_tok_export_free(e);
        e = NULL;
    }
    CHECK(zs_tokenizer_export(dir, 520, &e) == 0, "%s", zs_errmsg());
    if (e) {
        CHECK(e->spec.n_vocab == 520 && e->n_unused == 8 && e->spec.types[515] == ZS_TOKTYPE_UNUSED &&
              !strcmp(e->spec.tokens[515], "[PAD515]"), "padding to 520");
        zs_tok_export_free(e);
        e = NULL;
    }
    CHECK_ERR(zs_tokenizer_export(dir, 100, &e), "512 ids", "100");

    tu_model_dir(dir, sizeof dir, "gpt2-tokenizer");
    CHECK(zs_tokenizer_export(dir, 0, &e) == 0, "%s", zs_errmsg());
    if (e) {
        const zs_tokenizer_spec *s = &e->spec;
        CHECK(!strcmp(e->model, "gpt2") && s->pre && !strcmp(s->pre, "gpt-2") && s->n_vocab == 50257 &&
              s->n_merges == 50000 && !s->scores, "gpt2 kind");
        CHECK(s->n_merges && !strcmp(s->merges[0], "\xc4\xa0 t"), "first merge \"%s\"", s->n_merges ? s->merges[0] : "");
        CHECK(s->types[50256] == ZS_TOKTYPE_CONTROL && s->types[0] == ZS_TOKTYPE_NORMAL && s->add_bos == 0, "gpt2 types");
        zs_tokenizer *t = NULL;
        CHECK(zs_tokenizer_from_spec(s, &t) == 0, "%s", zs_errmsg());
        json_t *ref = tu_load_reference(dir);
        json_t *cases = json_object_get(ref, "cases");
        size_t i, good = 0;
        json_t *cs;
        json_array_foreach(cases, i, cs) {
            const char *text = json_string_value(json_object_get(cs, "text"));
            json_t *ids = json_object_get(cs, "ids");
            int32_t *got = NULL;
            size_t n = 0;
            int ok = t && zs_tokenizer_encode(t, text, strlen(text), 0, &got, &n) == 0 && n == json_array_size(ids);
            for (size_t k = 0; ok && k < n; k++) ok = got[k] == json_integer_value(json_array_get(ids, k));
            good += ok;
            free(got);
        }
        CHECK(good == json_array_size(cases) && good > 20, "%zu of %zu reference strings", good, json_array_size(cases));
        json_decref(ref);
        zs_tokenizer_free(t);
        zs_tok_export_free(e);
        e = NULL;
    }
    tu_model_dir(dir, sizeof dir, "gpt2-bytes");
    CHECK(zs_tokenizer_export(dir, 256, &e) == 0, "%s", zs_errmsg());
    if (e) {
        CHECK(e->spec.n_vocab == 256 && e->spec.n_merges == 0 && e->spec.bos == -1 && e->spec.eos == -1, "gpt2-bytes");
        zs_tok_export_free(e);
        e = NULL;
    }

    /* a Llama-3 style byte-level BPE (Split + ByteLevel, ignore_merges) with ids left unused */
    static const char *re =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) { /* GPT-2's byte -> character map */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF), k = 0;
        for (int c = 0; c < b; c++) k += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k;
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "hi", json_integer(256));
    json_object_set_new(vocab, "\xc4\xa0hi", json_integer(257));
    json_t *tj = json_pack("{s:[{s:i,s:s,s:b}], s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s, s:b, s:b}]},"
                           " s:{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:{s:{s:s,s:[i],s:[s]}}},"
                           " s:{s:s}, s:{s:s, s:b, s:b, s:o, s:[s,s]}}",
                           "added_tokens", "id", 300, "content", "<|begin_of_text|>", "special", 1,
                           "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", re,
                           "behavior", "Isolated", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
                           "post_processor", "type", "TemplateProcessing", "single", "SpecialToken", "id",
                           "<|begin_of_text|>", "type_id", 0, "Sequence", "id", "A", "type_id", 0, "special_tokens",
                           "<|begin_of_text|>", "id", "<|begin_of_text|>", "ids", 300, "tokens", "<|begin_of_text|>",
                           "decoder", "type", "ByteLevel",
                           "model", "type", "BPE", "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges",
                           "h i", "\xc4\xa0 hi");
    CHECK(tj != NULL, "json_pack");
    char l3[4200], l3f[4300];
    snprintf(l3, sizeof l3, "%s/llama3tok", tmp);
    mkdir(l3, 0755);
    snprintf(l3f, sizeof l3f, "%s/tokenizer.json", l3);
    if (tj) json_dump_file(tj, l3f, 0);
    json_decref(tj);
    CHECK(zs_tokenizer_export(l3, 320, &e) == 0, "%s", zs_errmsg());
    if (e) {
        const zs_tokenizer_spec *sp = &e->spec;
        CHECK(!strcmp(e->model, "gpt2") && sp->pre && !strcmp(sp->pre, "llama-bpe") && sp->n_vocab == 320 &&
              e->n_unused == 320 - 259 && sp->n_merges == 2 && !strcmp(sp->merges[1], "\xc4\xa0 hi"), "llama-bpe export");
        CHECK(sp->types[300] == ZS_TOKTYPE_CONTROL && sp->types[258] == ZS_TOKTYPE_UNUSED &&
              !strcmp(sp->tokens[258], "[PAD258]") && sp->add_bos == 1 && sp->bos == 300, "llama-bpe types");
        zs_tok_export_free(e);
        e = NULL;
    }

    /* a byte-fallback BPE whose spaces are not U+2581: no llama.cpp vocabulary says that */
    char src[4200], bad[4200];
    snprintf(src, sizeof src, "%s/models/stories260K/tokenizer.json", tu_shared());
    json_t *j = json_load_file(src, 0, NULL);
    CHECK(j != NULL, "load %s", src);
    if (j) {
        json_object_set_new(j, "normalizer", json_null());
        snprintf(bad, sizeof bad, "%s/badtok", tmp);
        mkdir(bad, 0755);
        snprintf(src, sizeof src, "%.4000s/tokenizer.json", bad);
        json_dump_file(j, src, 0);
        json_decref(j);
        CHECK_ERR(zs_tokenizer_export(bad, 0, &e), "badtok/tokenizer.json", "cannot be written");
    }
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "gguf-write") != 0) {
        fprintf(stderr, "cannot make a scratch directory\n");
        return 1;
    }
    test_roundtrip();
    test_refusals();
    test_write_failure();
    test_conv_errors();
    test_stories();
    test_gpt2();
    test_export();
    tu_rmdir(tmp);
    return tu_finish("test-gguf-write");
}

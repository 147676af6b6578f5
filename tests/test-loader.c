/* test-loader.c — tests of the checkpoint layer: safetensors reader (single file, shards +
 * index, every validation error), safetensors writer round trips, fingerprints, and HF
 * config.json parsing/writing for the llama family and GPT-2. Run from the repo root. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#include "common.h"
#include "init-model.h"
#include "config.h"
#include "safetensors.h"
#include "tensor.h"
#include "testutil.h"

static char tmp[4096];

static char *path_in(const char *name) {
    static char buf[8][4200];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* A safetensors file with the given header text and data_len zero bytes of data. */
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header);
    size_t n = 8 + hl + data_len;
    uint8_t *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    CHECK(tu_write_file(path, b, n) == 0, "write %s", path);
    free(b);
}

static void write_text(const char *path, const char *text) {
    CHECK(tu_write_file(path, text, strlen(text)) == 0, "write %s", path);
}

/* ---------- real fixtures ---------- */

static void test_stories(void) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "stories260K");
    zs_st_set *s = NULL;
    int rc = zs_st_open_dir(dir, &s);
    CHECK(rc == 0, "open stories260K: %s", zs_errmsg());
    if (rc) return;
    CHECK(zs_st_count(s) == 47, "count %zu", zs_st_count(s));
    const zs_st_tensor *t = NULL;
    int64_t ks[2] = {32, 64};
    CHECK(zs_st_get(s, "model.layers.0.self_attn.k_proj.weight", 2, ks, &t) == 0, "%s",
          zs_errmsg());
    CHECK(t && t->dtype == ZS_F32 && t->nbytes == 32 * 64 * 4, "k_proj");
    CHECK(t && strstr(t->file, "model.safetensors") != NULL, "file");
    t = zs_st_find(s, "model.embed_tokens.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 512 && t->shape[1] == 64, "embed shape");
    if (t) {
        const float *v = t->data;
        size_t n = t->nbytes / 4;
        double sum2 = 0, mx = 0;
        int finite = 1;
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, v + i, 4);
            if (!isfinite(x)) finite = 0;
            sum2 += (double)x * x;
            if (fabs(x) > mx) mx = fabs(x);
        }
        CHECK(finite && mx > 0.01 && mx < 20 && sum2 > 0, "embed values: max %g", mx);
        zs_st_release(s, t);
        float x0;
        memcpy(&x0, t->data, 4);
        CHECK(isfinite(x0), "data readable after release");
    }
    t = zs_st_find(s, "model.norm.weight");
    CHECK(t && t->ndim == 1 && t->shape[0] == 64, "norm");
    CHECK(zs_st_find(s, "lm_head.weight") == NULL, "tied: no lm_head");
    /* every tensor reachable by name and in order of offset */
    int all = 1;
    for (size_t i = 0; i < zs_st_count(s); i++) {
        const zs_st_tensor *a = zs_st_at(s, i);
        if (zs_st_find(s, a->name) != a) all = 0;
        if (i && (const char *)zs_st_at(s, i - 1)->data >= (const char *)a->data) all = 0;
    }
    CHECK(all, "find(at(i)) == at(i), sorted by offset");
    CHECK(zs_st_at(s, 47) == NULL, "at out of range");

    rc = zs_st_get(s, "model.layers.9.mlp.up_proj.weight", 2, ks, &t);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "stories260K", "model.layers.9.mlp.up_proj.weight", "not found");
    int64_t wrong[2] = {64, 32};
    rc = zs_st_get(s, "model.layers.0.self_attn.k_proj.weight", 2, wrong, &t);
    CHECK(rc == ZS_ESHAPE, "rc %d", rc);
    CHECK_ERR(rc, "model.safetensors", "k_proj", "[32, 64]", "expected [64, 32]");
    zs_st_close(s);

    zs_model_config c;
    rc = zs_config_load(dir, &c);
    CHECK(rc == 0, "config stories260K: %s", zs_errmsg());
    if (rc) return;
    CHECK(c.arch == ZS_ARCH_LLAMA && !strcmp(c.arch_name, "LlamaForCausalLM"), "arch");
    CHECK(c.dim == 64 && c.n_layers == 5 && c.n_heads == 8 && c.n_kv_heads == 4, "dims");
    CHECK(c.head_dim == 8 && c.ffn_dim == 172 && c.vocab_size == 512 && c.max_seq == 512, "dims2");
    CHECK(c.norm_eps == 1e-5f && c.rope_theta == 10000.0f, "eps/theta");
    CHECK(c.tied_embeddings == 1 && !c.qkv_bias && !c.o_bias && !c.mlp_bias, "tied/bias");
    CHECK(c.bos_id == 1 && c.eos_id == 2 && c.dtype == ZS_F32 && c.act == 0, "ids/dtype/act");
}

static void test_gpt2(void) {
    char dir[4096];
    tu_model_dir(dir, sizeof dir, "gpt2-bytes");
    zs_st_set *s = NULL;
    int rc = zs_st_open_dir(dir, &s);
    CHECK(rc == 0, "open gpt2-bytes: %s", zs_errmsg());
    if (rc) return;
    CHECK(zs_st_count(s) == 52, "count %zu", zs_st_count(s));
    const zs_st_tensor *t = NULL;
    int64_t sh[2] = {64, 192};
    CHECK(zs_st_get(s, "transformer.h.0.attn.c_attn.weight", 2, sh, &t) == 0, "%s", zs_errmsg());
    int64_t bs[1] = {192};
    CHECK(zs_st_get(s, "transformer.h.3.attn.c_attn.bias", 1, bs, &t) == 0, "%s", zs_errmsg());
    int64_t wpe[2] = {128, 64};
    CHECK(zs_st_get(s, "transformer.wpe.weight", 2, wpe, &t) == 0, "%s", zs_errmsg());
    t = zs_st_find(s, "transformer.ln_f.weight");
    CHECK(t && t->dtype == ZS_F32 && t->nbytes == 256, "ln_f");
    if (t) {
        float x;
        int ok = 1;
        for (int i = 0; i < 64; i++) {
            memcpy(&x, (const float *)t->data + i, 4);
            if (!isfinite(x) || fabsf(x) > 10) ok = 0;
        }
        CHECK(ok, "ln_f values");
    }
    zs_st_close(s);

    zs_model_config c;
    rc = zs_config_load(dir, &c);
    CHECK(rc == 0, "config gpt2-bytes: %s", zs_errmsg());
    if (rc) return;
    CHECK(c.arch == ZS_ARCH_GPT2 && c.n_layers == 4 && c.n_heads == 4 && c.dim == 64, "dims");
    CHECK(c.ffn_dim == 256 && c.vocab_size == 256 && c.max_seq == 128 && c.act == 1, "dims2");
    CHECK(c.head_dim == 16 && c.n_kv_heads == 4 && c.tied_embeddings, "head_dim/tied");
    CHECK(c.qkv_bias && c.o_bias && c.mlp_bias && c.norm_eps == 1e-5f, "bias/eps");
    CHECK(c.bos_id == -1 && c.eos_id == -1, "ids %d %d", c.bos_id, c.eos_id);
}

/* ---------- writer ---------- */

static void fill(uint8_t *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((i * 131 + seed * 17 + (i >> 3)) & 0xff);
}

static void test_writer(void) {
    zs_st_decl d[4] = {
        {"a.f32", ZS_F32, 2, {3, 5, 0, 0}},
        {"b.f16", ZS_F16, 3, {2, 3, 7, 0}},
        {"c.bf16", ZS_BF16, 1, {9, 0, 0, 0}},
        {"d.scalar", ZS_F32, 0, {0, 0, 0, 0}},
    };
    size_t sz[4] = {60, 84, 18, 4};
    uint8_t *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = malloc(sz[i]);
        fill(buf[i], sz[i], (unsigned)i);
    }
    const char *p = path_in("w.safetensors");
    zs_st_writer *w = NULL;
    int rc = zs_st_writer_open(p, d, 4, "{\"format\":\"pt\",\"note\":\"x\"}", &w);
    CHECK(rc == 0, "writer open: %s", zs_errmsg());
    if (rc) goto out;
    CHECK(zs_st_writer_write(w, buf[0], 10) == 0, "w");
    CHECK(zs_st_writer_write(w, buf[0] + 10, 50) == 0, "w");
    CHECK(zs_st_writer_write(w, buf[1], 84) == 0, "w");
    CHECK(zs_st_writer_write(w, buf[2], 18) == 0, "w");
    CHECK(zs_st_writer_write(w, buf[3], 4) == 0, "w");
    struct stat st;
    CHECK(stat(path_in("w.safetensors.tmp"), &st) == 0, "tmp exists while writing");
    CHECK(stat(p, &st) != 0, "final absent while writing");
    rc = zs_st_writer_close(w);
    CHECK(rc == 0, "writer close: %s", zs_errmsg());
    CHECK(stat(path_in("w.safetensors.tmp"), &st) != 0, "tmp gone");

    size_t len = 0;
    uint8_t *raw = read_all(p, &len);
    CHECK(raw && len >= 8, "read back");
    if (raw) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
        CHECK(hl % 8 == 0 && 8 + hl + 166 == len, "header padded to 8, data contiguous");
        free(raw);
    }
    zs_st_set *s = NULL;
    rc = zs_st_open_file(p, &s);
    CHECK(rc == 0, "reopen: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_st_count(s) == 4, "count");
        for (int i = 0; i < 4; i++) {
            const zs_st_tensor *t = NULL;
            CHECK(zs_st_get(s, d[i].name, d[i].ndim, d[i].shape, &t) == 0, "%s", zs_errmsg());
            if (!t) continue;
            CHECK(t->dtype == d[i].dtype && t->nbytes == sz[i], "%s dtype/size", d[i].name);
            CHECK(memcmp(t->data, buf[i], sz[i]) == 0, "%s bytes", d[i].name);
            CHECK(i == 0 || ((uintptr_t)t->data % 2) == 0, "aligned");
        }
        CHECK(((uintptr_t)zs_st_find(s, "a.f32")->data % 8) == 0, "data section 8-aligned");
        zs_st_close(s);
    }

    /* errors: too many bytes, too few bytes, abort, bad decls, bad metadata */
    rc = zs_st_writer_open(path_in("x.safetensors"), d, 1, NULL, &w);
    CHECK(rc == 0, "%s", zs_errmsg());
    if (rc == 0) {
        rc = zs_st_writer_write(w, buf[1], 61);
        CHECK_ERR(rc, "x.safetensors", "exceed");
        zs_st_writer_abort(w);
        CHECK(stat(path_in("x.safetensors.tmp"), &st) != 0, "abort removes tmp");
        CHECK(stat(path_in("x.safetensors"), &st) != 0, "abort leaves no file");
    }
    rc = zs_st_writer_open(path_in("y.safetensors"), d, 2, NULL, &w);
    CHECK(rc == 0, "%s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_st_writer_write(w, buf[0], 60) == 0, "w");
        CHECK(zs_st_writer_write(w, buf[1], 20) == 0, "w");
        rc = zs_st_writer_close(w);
        CHECK_ERR(rc, "y.safetensors", "b.f16", "incomplete");
        CHECK(stat(path_in("y.safetensors.tmp"), &st) != 0, "failed close removes tmp");
        CHECK(stat(path_in("y.safetensors"), &st) != 0, "failed close leaves no file");
    }
    zs_st_decl dup[2] = {d[0], d[0]};
    rc = zs_st_writer_open(path_in("z.safetensors"), dup, 2, NULL, &w);
    CHECK_ERR(rc, "z.safetensors", "a.f32", "twice");
    zs_st_decl bad = {"neg", ZS_F32, 2, {3, -1, 0, 0}};
    rc = zs_st_writer_open(path_in("z.safetensors"), &bad, 1, NULL, &w);
    CHECK_ERR(rc, "z.safetensors", "neg", "negative");
    rc = zs_st_writer_open(path_in("z.safetensors"), d, 1, "{\"a\": 1}", &w);
    CHECK_ERR(rc, "z.safetensors", "metadata");
    CHECK(stat(path_in("z.safetensors.tmp"), &st) != 0, "no tmp after failed open");
out:
    for (int i = 0; i < 4; i++) free(buf[i]);
}

static void test_shards(void) {
    char sd[4200];
    snprintf(sd, sizeof sd, "%s/sharded", tmp);
    mkdir(sd, 0755);
    float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {-1, -2, -3, -4}, c[2] = {7, 8};
    zs_st_decl d1[2] = {{"layer.0.w", ZS_F32, 2, {2, 3}}, {"layer.0.b", ZS_F32, 1, {4}}};
    zs_st_decl d2[1] = {{"layer.1.w", ZS_F32, 1, {2}}};
    char p1[4400], p2[4400], ip[4400];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", sd);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", sd);
    snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", sd);
    zs_st_writer *w;
    int ok = zs_st_writer_open(p1, d1, 2, NULL, &w) == 0 && zs_st_writer_write(w, a, 24) == 0 &&
             zs_st_writer_write(w, b, 16) == 0 && zs_st_writer_close(w) == 0;
    ok = ok && zs_st_writer_open(p2, d2, 1, NULL, &w) == 0 && zs_st_writer_write(w, c, 8) == 0 &&
         zs_st_writer_close(w) == 0;
    CHECK(ok, "write shards: %s", zs_errmsg());
    write_text(ip, "{\"metadata\": {\"total_size\": 48}, \"weight_map\": {"
                   "\"layer.0.w\": \"model-00001-of-00002.safetensors\","
                   "\"layer.0.b\": \"model-00001-of-00002.safetensors\","
                   "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}");
    zs_st_set *s = NULL;
    int rc = zs_st_open_dir(sd, &s);
    CHECK(rc == 0, "open sharded: %s", zs_errmsg());
    if (rc == 0) {
        CHECK(zs_st_count(s) == 3, "count");
        const zs_st_tensor *t = zs_st_find(s, "layer.1.w");
        CHECK(t && strstr(t->file, "00002-of") && !memcmp(t->data, c, 8), "shard 2 tensor");
        t = zs_st_find(s, "layer.0.b");
        CHECK(t && strstr(t->file, "00001-of") && !memcmp(t->data, b, 16), "shard 1 tensor");
        char f1[32], f2[32];
        CHECK(zs_st_fingerprint(s, f1, sizeof f1) == 0 && strlen(f1) == 16, "fp");
        zs_st_close(s);
        rc = zs_st_open_dir(sd, &s);
        CHECK(rc == 0 && zs_st_fingerprint(s, f2, sizeof f2) == 0 && !strcmp(f1, f2),
              "same dir, same fingerprint");
        zs_st_close(s);
        /* touch shard 2 (new mtime) -> different */
        struct timeval tv[2] = {{1000000000, 0}, {1000000000, 0}};
        utimes(p2, tv);
        rc = zs_st_open_dir(sd, &s);
        CHECK(rc == 0 && zs_st_fingerprint(s, f2, sizeof f2) == 0 && strcmp(f1, f2),
              "touched file, different fingerprint");
        char small[8];
        CHECK_ERR(zs_st_fingerprint(s, small, sizeof small), "17");
        zs_st_close(s);
    }

    /* index: tensor listed but absent from its shard */
    write_text(ip, "{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00002.safetensors\","
                   "\"layer.9.w\": \"model-00002-of-00002.safetensors\"}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "model.safetensors.index.json", "layer.9.w", "absent");
    /* tensor listed for the wrong shard */
    write_text(ip, "{\"weight_map\": {\"layer.0.w\": \"model-00002-of-00002.safetensors\","
                   "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "index.json", "layer.0.w", "absent");
    /* missing shard */
    write_text(ip, "{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00003.safetensors\"}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "index.json", "model-00001-of-00003.safetensors", "missing");
    /* path traversal */
    write_text(ip, "{\"weight_map\": {\"layer.0.w\": \"../x.safetensors\"}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "index.json", "layer.0.w", "file name");
    /* not JSON, no weight_map */
    write_text(ip, "{\"weight_map\": {");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "index.json", "not valid JSON");
    write_text(ip, "{\"metadata\": {}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "index.json", "weight_map", "missing");
    /* duplicate tensor across shards */
    zs_st_writer_open(p2, d1, 1, NULL, &w);
    zs_st_writer_write(w, a, 24);
    CHECK(zs_st_writer_close(w) == 0, "%s", zs_errmsg());
    write_text(ip, "{\"weight_map\": {\"layer.0.w\": \"model-00001-of-00002.safetensors\","
                   "\"layer.0.b\": \"model-00002-of-00002.safetensors\"}}");
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "layer.0.w", "twice");

    /* no index, two files -> ambiguous; one file -> opened */
    remove(ip);
    rc = zs_st_open_dir(sd, &s);
    CHECK_ERR(rc, "sharded", "index");
    remove(p2);
    rc = zs_st_open_dir(sd, &s);
    CHECK(rc == 0 && zs_st_count(s) == 2, "single unnamed file: %s", zs_errmsg());
    if (rc == 0) zs_st_close(s);
}

/* ---------- bad safetensors input ---------- */

#define HDR_OK "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"

static void test_bad_files(void) {
    zs_st_set *s = NULL;
    int rc;
    /* a tiny valid one, to be sure the generator works */
    write_st(path_in("ok.safetensors"), HDR_OK, 16);
    rc = zs_st_open_file(path_in("ok.safetensors"), &s);
    CHECK(rc == 0, "ok: %s", zs_errmsg());
    if (rc == 0) zs_st_close(s);

    /* truncated real file: cut in the middle of the data */
    char dir[4096], src[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    size_t len = 0;
    uint8_t *raw = read_all(src, &len);
    CHECK(raw != NULL, "read %s", src);
    if (raw) {
        CHECK(tu_write_file(path_in("trunc.safetensors"), raw, len / 2) == 0, "write");
        rc = zs_st_open_file(path_in("trunc.safetensors"), &s);
        CHECK(rc == ZS_EFORMAT, "rc %d", rc);
        CHECK_ERR(rc, "trunc.safetensors", "truncated", "out of range");
        /* cut inside the header */
        CHECK(tu_write_file(path_in("trunc2.safetensors"), raw, 1000) == 0, "write");
        rc = zs_st_open_file(path_in("trunc2.safetensors"), &s);
        CHECK_ERR(rc, "trunc2.safetensors", "header length", "larger than the file");
        free(raw);
    }
    /* shorter than 8 bytes, empty */
    write_text(path_in("short.safetensors"), "abc");
    CHECK_ERR(zs_st_open_file(path_in("short.safetensors"), &s), "short.safetensors", "too short");
    write_text(path_in("empty.safetensors"), "");
    CHECK_ERR(zs_st_open_file(path_in("empty.safetensors"), &s), "empty.safetensors", "too short");
    /* header length beyond the file; absurd header length (a sparse 201 MB file, so that it is
     * not "larger than the file") */
    {
        uint8_t h[8] = {0, 0, 0, 0, 1, 0, 0, 0}; /* 2^32 */
        CHECK(tu_write_file(path_in("huge.safetensors"), h, 8) == 0, "write");
        CHECK_ERR(zs_st_open_file(path_in("huge.safetensors"), &s), "huge.safetensors",
                  "header length", "larger than the file");
        uint64_t hl = 200u * 1000 * 1000;
        for (int i = 0; i < 8; i++) h[i] = (uint8_t)(hl >> (8 * i));
        CHECK(tu_write_file(path_in("absurd.safetensors"), h, 8) == 0, "write");
        CHECK(truncate(path_in("absurd.safetensors"), 201 * 1000 * 1000) == 0, "truncate");
        CHECK_ERR(zs_st_open_file(path_in("absurd.safetensors"), &s), "absurd.safetensors",
                  "header length", "absurd");
    }
    /* not JSON / not an object */
    write_st(path_in("notjson.safetensors"), "{\"w\": [1, 2", 0);
    CHECK_ERR(zs_st_open_file(path_in("notjson.safetensors"), &s), "notjson.safetensors",
              "not valid JSON");
    write_st(path_in("arr.safetensors"), "[1, 2, 3]       ", 0);
    CHECK_ERR(zs_st_open_file(path_in("arr.safetensors"), &s), "arr.safetensors",
              "not a JSON object");
    /* missing fields / wrong types */
    write_st(path_in("nodt.safetensors"), "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("nodt.safetensors"), &s), "nodt.safetensors", "'w'",
              "dtype");
    write_st(path_in("noshape.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("noshape.safetensors"), &s), "noshape.safetensors", "shape");
    write_st(path_in("nooff.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("nooff.safetensors"), &s), "nooff.safetensors",
              "data_offsets");
    write_st(path_in("typ.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("typ.safetensors"), &s), "typ.safetensors", "shape",
              "not an array");
    write_st(path_in("typ2.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("typ2.safetensors"), &s), "typ2.safetensors", "integer");
    write_st(path_in("typ3.safetensors"), "{\"w\": 5}", 8);
    CHECK_ERR(zs_st_open_file(path_in("typ3.safetensors"), &s), "typ3.safetensors", "'w'",
              "not a JSON object");
    /* unknown dtype */
    write_st(path_in("i8.safetensors"),
             "{\"ok\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"q\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[8,16]}}", 16);
    rc = zs_st_open_file(path_in("i8.safetensors"), &s);
    CHECK(rc == ZS_EUNSUPPORTED, "rc %d", rc);
    CHECK_ERR(rc, "i8.safetensors", "'q'", "I8", "unsupported dtype");
    write_st(path_in("f64.safetensors"),
             "{\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("f64.safetensors"), &s), "f64.safetensors", "F64");
    /* dims: too many, negative */
    write_st(path_in("dims.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("dims.safetensors"), &s), "dims.safetensors", "'w'",
              "5 dimensions");
    write_st(path_in("negdim.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("negdim.safetensors"), &s), "negdim.safetensors", "negative");
    /* offsets out of range, reversed, negative */
    write_st(path_in("range.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 16);
    rc = zs_st_open_file(path_in("range.safetensors"), &s);
    CHECK_ERR(rc, "range.safetensors", "'w'", "out of range");
    write_st(path_in("rev.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 16);
    CHECK_ERR(zs_st_open_file(path_in("rev.safetensors"), &s), "rev.safetensors", "invalid");
    write_st(path_in("negoff.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 16);
    CHECK_ERR(zs_st_open_file(path_in("negoff.safetensors"), &s), "negoff.safetensors", "invalid");
    /* size mismatch */
    write_st(path_in("size.safetensors"),
             "{\"w\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    CHECK_ERR(zs_st_open_file(path_in("size.safetensors"), &s), "size.safetensors", "'w'",
              "size mismatch", "[2, 2]");
    /* shape overflow */
    write_st(path_in("ovf.safetensors"),
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
             "\"data_offsets\":[0,16]}}", 16);
    CHECK_ERR(zs_st_open_file(path_in("ovf.safetensors"), &s), "ovf.safetensors", "too large");
    /* overlap */
    write_st(path_in("overlap.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16);
    CHECK_ERR(zs_st_open_file(path_in("overlap.safetensors"), &s), "overlap.safetensors", "'a'",
              "'b'", "overlap");
    /* duplicate keys in one header */
    write_st(path_in("dupkey.safetensors"),
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    CHECK_ERR(zs_st_open_file(path_in("dupkey.safetensors"), &s), "dupkey.safetensors", "JSON");
    /* missing file, directory as file */
    rc = zs_st_open_file(path_in("nope.safetensors"), &s);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "nope.safetensors", "cannot open");
    CHECK_ERR(zs_st_open_file(tmp, &s), "not a regular file");

    /* empty directory, missing directory */
    char ed[4200];
    snprintf(ed, sizeof ed, "%s/emptydir", tmp);
    mkdir(ed, 0755);
    rc = zs_st_open_dir(ed, &s);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "emptydir", "no checkpoint");
    snprintf(ed, sizeof ed, "%s/nodir", tmp);
    CHECK_ERR(zs_st_open_dir(ed, &s), "nodir");
    zs_model_config c;
    CHECK_ERR(zs_config_load(ed, &c), "config.json", "cannot open");
}

/* ---------- fingerprint of a rewritten single file ---------- */

static void test_fingerprint(void) {
    char d[4200];
    snprintf(d, sizeof d, "%s/fp", tmp);
    mkdir(d, 0755);
    char p[4400];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_st(p, HDR_OK, 16);
    zs_st_set *s = NULL;
    char a[17], b[17], c[17];
    int rc = zs_st_open_dir(d, &s);
    CHECK(rc == 0 && zs_st_fingerprint(s, a, sizeof a) == 0, "%s", zs_errmsg());
    zs_st_close(s);
    rc = zs_st_open_dir(d, &s);
    CHECK(rc == 0 && zs_st_fingerprint(s, b, sizeof b) == 0 && !strcmp(a, b), "stable");
    zs_st_close(s);
    /* rewrite with different header content but same size */
    char h2[] = HDR_OK;
    char *k = strstr(h2, "\"pt\"");
    k[1] = 'q';
    write_st(p, h2, 16);
    struct timeval tv[2] = {{1000000000, 0}, {1000000000, 0}};
    utimes(p, tv);
    rc = zs_st_open_dir(d, &s);
    CHECK(rc == 0 && zs_st_fingerprint(s, c, sizeof c) == 0 && strcmp(a, c), "rewritten");
    zs_st_close(s);
    /* same content, only mtime changes */
    struct timeval tv2[2] = {{1000000001, 0}, {1000000001, 0}};
    utimes(p, tv2);
    rc = zs_st_open_dir(d, &s);
    CHECK(rc == 0 && zs_st_fingerprint(s, b, sizeof b) == 0 && strcmp(b, c), "touched");
    zs_st_close(s);
}

/* ---------- config ---------- */

#define LLAMA_BASE                                                                         \
    "\"hidden_size\": 64, \"intermediate_size\": 172, \"num_hidden_layers\": 2, "          \
    "\"num_attention_heads\": 8, \"vocab_size\": 100"

static void test_config(void) {
    zs_model_config c;
    int rc;
    const char *o = "x/config.json";
    /* mistral: sliding_window ignored, head_dim null => hidden/heads, kv defaults to heads */
    rc = zs_config_parse("{\"architectures\": [\"MistralForCausalLM\"], " LLAMA_BASE
                         ", \"sliding_window\": 4096, \"head_dim\": null, \"rope_scaling\": null, "
                         "\"eos_token_id\": [7, 8], \"torch_dtype\": \"bfloat16\"}", o, &c);
    CHECK(rc == 0, "mistral: %s", zs_errmsg());
    CHECK(rc || (c.head_dim == 8 && c.n_kv_heads == 8 && c.eos_id == 7 && c.bos_id == -1 &&
                 c.dtype == ZS_BF16 && !c.tied_embeddings && c.norm_eps == 1e-6f &&
                 c.rope_theta == 10000.0f && c.arch == ZS_ARCH_LLAMA), "mistral values");
    /* qwen2: qkv bias, no o bias */
    rc = zs_config_parse("{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
                         LLAMA_BASE ", \"num_key_value_heads\": 2, \"use_sliding_window\": false,"
                         " \"tie_word_embeddings\": true, \"rope_theta\": 1000000.0}", o, &c);
    CHECK(rc == 0, "qwen2: %s", zs_errmsg());
    CHECK(rc || (c.qkv_bias == 1 && c.o_bias == 0 && c.mlp_bias == 0 && c.n_kv_heads == 2 &&
                 c.rope_theta == 1e6f && c.tied_embeddings), "qwen2 values");
    /* llama attention_bias */
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"attention_bias\": true, \"mlp_bias\": true}", o, &c);
    CHECK(rc == 0 && c.qkv_bias && c.o_bias && c.mlp_bias && c.dtype == ZS_F32, "llama bias");

    /* errors */
    rc = zs_config_parse("{\"architectures\": [\"BertModel\"], " LLAMA_BASE "}", o, &c);
    CHECK(rc == ZS_EUNSUPPORTED, "rc %d", rc);
    CHECK_ERR(rc, "x/config.json", "BertModel", "LlamaForCausalLM", "GPT2LMHeadModel");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\", "
                         "\"intermediate_size\": 172, \"num_hidden_layers\": 2, "
                         "\"num_attention_heads\": 8, \"vocab_size\": 100}", o, &c);
    CHECK(rc == ZS_EINVAL, "rc %d", rc);
    CHECK_ERR(rc, "config.json", "hidden_size", "integer");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64.0, "
                         "\"intermediate_size\": 172, \"num_hidden_layers\": 2, "
                         "\"num_attention_heads\": 8, \"vocab_size\": 100}", o, &c);
    CHECK(rc == ZS_EINVAL, "rc %d", rc);
    CHECK_ERR(rc, "config.json", "hidden_size", "float");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                         "\"intermediate_size\": 172, \"num_hidden_layers\": -2, "
                         "\"num_attention_heads\": 8, \"vocab_size\": 100}", o, &c);
    CHECK(rc == ZS_EINVAL, "rc %d", rc);
    CHECK_ERR(rc, "config.json", "num_hidden_layers", "-2");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                         "\"intermediate_size\": 172, \"num_hidden_layers\": 0, "
                         "\"num_attention_heads\": 8, \"vocab_size\": 100}", o, &c);
    CHECK_ERR(rc, "config.json", "num_hidden_layers", "positive");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                         "\"intermediate_size\": 172, \"num_hidden_layers\": 2, "
                         "\"num_attention_heads\": 7, \"vocab_size\": 100}", o, &c);
    CHECK_ERR(rc, "config.json", "num_attention_heads", "divide");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"num_key_value_heads\": 3}", o, &c);
    CHECK_ERR(rc, "config.json", "num_key_value_heads", "multiple");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                         "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
                         "\"vocab_size\": 100}", o, &c);
    CHECK(rc == ZS_ENOTFOUND, "rc %d", rc);
    CHECK_ERR(rc, "config.json", "intermediate_size", "missing");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"rope_scaling\": {\"type\": \"mrope\", \"factor\": 2.0}}", o, &c);
    CHECK(rc == ZS_EUNSUPPORTED, "rc %d", rc);
    CHECK_ERR(rc, "config.json", "rope_scaling", "mrope");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"rms_norm_eps\": \"1e-5\"}", o, &c);
    CHECK_ERR(rc, "config.json", "rms_norm_eps", "number");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"tie_word_embeddings\": 1}", o, &c);
    CHECK_ERR(rc, "config.json", "tie_word_embeddings");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"torch_dtype\": \"float64\"}", o, &c);
    CHECK_ERR(rc, "config.json", "torch_dtype", "float64");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE
                         ", \"hidden_act\": \"relu\"}", o, &c);
    CHECK_ERR(rc, "config.json", "hidden_act", "relu");
    rc = zs_config_parse("{\"architectures\": \"LlamaForCausalLM\", " LLAMA_BASE "}", o, &c);
    CHECK_ERR(rc, "config.json", "architectures");
    rc = zs_config_parse("{" LLAMA_BASE "}", o, &c);
    CHECK_ERR(rc, "config.json", "architectures", "missing");
    rc = zs_config_parse("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, "
                         "\"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 10, "
                         "\"activation_function\": \"relu\"}", o, &c);
    CHECK_ERR(rc, "config.json", "activation_function", "relu");
    rc = zs_config_parse("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, "
                         "\"n_layer\": 2, \"n_head\": 4, \"vocab_size\": 10, "
                         "\"activation_function\": \"gelu_pytorch_tanh\", \"n_inner\": 100}", o, &c);
    CHECK(rc == 0 && c.ffn_dim == 100 && c.max_seq == 1024 && c.tied_embeddings, "gpt2 defaults");
    rc = zs_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], ", o, &c);
    CHECK(rc == ZS_EFORMAT, "rc %d", rc);
    CHECK_ERR(rc, "x/config.json", "not valid JSON");
    rc = zs_config_parse("[1]", o, &c);
    CHECK_ERR(rc, "x/config.json", "not a JSON object");

    /* config.json files on disk */
    char d[4200], p[4400];
    snprintf(d, sizeof d, "%s/cfg", tmp);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/config.json", d);
    write_text(p, "{not json");
    CHECK_ERR(zs_config_load(d, &c), "cfg/config.json", "not valid JSON");
    write_text(p, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                  "\"intermediate_size\": 172, \"num_hidden_layers\": 2.5, "
                  "\"num_attention_heads\": 8, \"vocab_size\": 100}");
    CHECK_ERR(zs_config_load(d, &c), "cfg/config.json", "num_hidden_layers");

    /* write -> load round trips: both fixtures and the parsed variants */
    const char *models[2] = {"stories260K", "gpt2-bytes"};
    for (int i = 0; i < 2; i++) {
        char md[4096];
        zs_model_config a, b;
        tu_model_dir(md, sizeof md, models[i]);
        if (zs_config_load(md, &a) != 0) continue;
        rc = zs_config_write(&a, p);
        CHECK(rc == 0, "write %s: %s", models[i], zs_errmsg());
        rc = zs_config_load(d, &b);
        CHECK(rc == 0 && !memcmp(&a, &b, sizeof a), "round trip %s: %s", models[i], zs_errmsg());
    }
    const char *variants[] = {
        "{\"architectures\": [\"MistralForCausalLM\"], " LLAMA_BASE ", \"eos_token_id\": 3, "
        "\"torch_dtype\": \"float16\", \"rms_norm_eps\": 1e-06, \"rope_theta\": 500000.0}",
        "{\"architectures\": [\"Qwen2ForCausalLM\"], " LLAMA_BASE ", \"num_key_value_heads\": 4,"
        " \"head_dim\": 16, \"torch_dtype\": \"bfloat16\", \"rms_norm_eps\": 3.3e-7}",
        "{\"architectures\": [\"LlamaForCausalLM\"], " LLAMA_BASE ", \"attention_bias\": true}",
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        zs_model_config a, b;
        rc = zs_config_parse(variants[i], o, &a);
        CHECK(rc == 0, "variant %zu: %s", i, zs_errmsg());
        if (rc) continue;
        rc = zs_config_write(&a, p);
        CHECK(rc == 0, "write variant %zu: %s", i, zs_errmsg());
        rc = zs_config_load(d, &b);
        CHECK(rc == 0 && !memcmp(&a, &b, sizeof a), "round trip variant %zu", i);
    }
    /* unrepresentable: qwen2 without qkv bias; llama with qkv bias but no o bias */
    zs_model_config bad;
    zs_config_parse(variants[1], o, &bad);
    bad.qkv_bias = 0;
    CHECK_ERR(zs_config_write(&bad, p), "qkv_bias");
    zs_config_parse(variants[2], o, &bad);
    bad.o_bias = 0;
    CHECK_ERR(zs_config_write(&bad, p), "o_bias");
    bad.o_bias = 1;
    bad.n_layers = -1;
    CHECK_ERR(zs_config_write(&bad, p), "num_hidden_layers");
    snprintf(bad.arch_name, sizeof bad.arch_name, "Nope");
    CHECK_ERR(zs_config_write(&bad, p), "Nope");
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json.tmp", d);
    CHECK(stat(p, &st) != 0, "no tmp left");
}

/* The newer families' config.json: what each key turns into, the defaults of transformers' config
 * classes, and the combinations that are refused with the key named. */
#define FAM(arch, extra) "{\"architectures\": [\"" arch "\"], " LLAMA_BASE extra "}"
static void test_config_families(void) {
    zs_model_config c;
    const char *o = "x/config.json";
    /* Llama 3.1 rope_scaling, the newer key name and the older 'type' */
    CHECK(zs_config_parse(FAM("LlamaForCausalLM", ", \"max_position_embeddings\": 131072, \"rope_theta\": 500000.0, "
                              "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                              "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"), o, &c) == 0,
          "llama3: %s", zs_errmsg());
    CHECK(c.rope.type == ZS_ROPE_LLAMA3 && c.rope.factor == 8 && c.rope.orig_max_pos == 8192 && c.max_seq == 131072 &&
          c.rope_theta == 500000.0f, "llama3 fields");
    CHECK(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}, "
                              "\"max_position_embeddings\": 4096"), o, &c) == 0, "dynamic: %s", zs_errmsg());
    CHECK(c.rope.type == ZS_ROPE_DYNAMIC && c.rope.orig_max_pos == 4096 && c.max_seq == 8192,
          "dynamic: the base grows past 4096, the context is 8192 (%d)", c.max_seq);
    CHECK(zs_config_parse(FAM("Qwen2ForCausalLM", ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                              "\"original_max_position_embeddings\": 32768}"), o, &c) == 0, "qwen2 yarn: %s", zs_errmsg());
    CHECK(c.rope.type == ZS_ROPE_YARN && c.rope.truncate == 1 && c.qkv_bias && !c.o_bias, "qwen2 yarn");
    CHECK(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0, "
                              "\"rope_theta\": 20000.0}"), o, &c) == 0 && c.rope.type == ZS_ROPE_LINEAR &&
          c.rope_theta == 20000.0f, "rope_parameters: %s", zs_errmsg());
    /* Qwen3: head_dim of its own (128 when absent), q/k norms */
    CHECK(zs_config_parse(FAM("Qwen3ForCausalLM", ""), o, &c) == 0, "qwen3: %s", zs_errmsg());
    CHECK(c.family == ZS_FAM_QWEN3 && c.qk_norm && c.head_dim == 128 && !c.qkv_bias && !c.sliding_window, "qwen3 fields");
    /* Gemma 2: every piece, the alternating layers; nulls turn the soft-caps off */
    CHECK(zs_config_parse(FAM("Gemma2ForCausalLM", ", \"max_position_embeddings\": 8192, \"head_dim\": 16"), o, &c) == 0,
          "gemma2: %s", zs_errmsg());
    CHECK(c.norm_offset == 1 && c.post_norms && c.act == 1 && c.tied_embeddings && c.attn_softcap == 50 &&
          c.final_softcap == 30 && c.query_pre_attn_scalar == 256 && c.sliding_window == 4096 &&
          c.embed_scale == 8.0f && c.layer_sliding[0] == 1 && c.layer_sliding[1] == 0, "gemma2 fields");
    CHECK(zs_config_parse(FAM("Gemma2ForCausalLM", ", \"head_dim\": 16, \"attn_logit_softcapping\": null, "
                              "\"final_logit_softcapping\": null, \"sliding_window\": 32"), o, &c) == 0 &&
          c.attn_softcap == 0 && c.final_softcap == 0 && c.sliding_window == 32, "gemma2 nulls");
    CHECK_ERR(zs_config_parse(FAM("Gemma2ForCausalLM", ", \"hidden_activation\": \"relu\""), o, &c), "hidden_activation", "relu");
    /* Gemma 3: the 5:1 pattern over 2 layers, local RoPE base, q/k norms */
    CHECK(zs_config_parse(FAM("Gemma3ForCausalLM", ", \"head_dim\": 16, \"sliding_window\": 64"), o, &c) == 0,
          "gemma3: %s", zs_errmsg());
    CHECK(c.qk_norm && c.rope_local_theta == 10000.0f && c.rope_theta == 1000000.0f && c.attn_softcap == 0 &&
          c.layer_sliding[0] && c.layer_sliding[1], "gemma3 fields (layers 0 and 1 of a 6-pattern are local)");
    CHECK(zs_config_parse(FAM("Gemma3ForCausalLM", ", \"head_dim\": 16, \"sliding_window\": 64, \"layer_types\": "
                              "[\"sliding_attention\", \"full_attention\"]"), o, &c) == 0 && c.layer_sliding[0] &&
          !c.layer_sliding[1], "gemma3 layer_types");
    CHECK_ERR(zs_config_parse(FAM("Gemma3ForCausalLM", ", \"layer_types\": [\"full_attention\"]"), o, &c), "layer_types", "2");
    CHECK_ERR(zs_config_parse(FAM("Gemma3ForCausalLM", ", \"layer_types\": [\"sliding_attention\", \"local\"]"), o, &c),
              "layer_types[1]");
    CHECK_ERR(zs_config_parse(FAM("Gemma3ForCausalLM", ", \"use_bidirectional_attention\": true"), o, &c),
              "use_bidirectional_attention");
    /* Phi-3: longrope with its top-level original length, partial rotary refused */
    char phi[2048];
    snprintf(phi, sizeof phi, FAM("Phi3ForCausalLM", ", \"max_position_embeddings\": 131072, "
             "\"original_max_position_embeddings\": 4096, \"rope_scaling\": {\"type\": \"longrope\", "
             "\"short_factor\": [1, 1, 1, 1], \"long_factor\": [1, 2, 3, 4]}, \"sliding_window\": 2047"));
    CHECK(zs_config_parse(phi, o, &c) == 0, "phi3: %s", zs_errmsg());
    CHECK(c.rope.type == ZS_ROPE_LONGROPE && c.rope.orig_max_pos == 4096 && c.rope.n_factors == 4 &&
          c.rope.long_factor[3] == 4 && c.sliding_window == 2047 && c.layer_sliding[1], "phi3 fields");
    CHECK_ERR(zs_config_parse(FAM("Phi3ForCausalLM", ", \"partial_rotary_factor\": 0.5"), o, &c), "partial_rotary_factor");
    CHECK(zs_config_parse(FAM("Phi3ForCausalLM", ", \"max_position_embeddings\": 131072, \"sliding_window\": 262144"), o,
                          &c) == 0 && c.sliding_window == 0, "Phi-3 128k's window longer than the context: none");
    CHECK_ERR(zs_config_parse(FAM("Phi3ForCausalLM", ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1], "
                                  "\"long_factor\": [1, 2]}"), o, &c), "short_factor", "head_dim 8 needs 4");
    CHECK_ERR(zs_config_parse(FAM("Phi3ForCausalLM", ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1, 1, 1], "
                                  "\"long_factor\": [1, 2, 0, 4]}"), o, &c), "long_factor[2]");
    /* Mistral: transformers' default window; null turns it off */
    CHECK(zs_config_parse(FAM("MistralForCausalLM", ", \"max_position_embeddings\": 32768"), o, &c) == 0 &&
          c.sliding_window == 4096, "mistral default window");
    CHECK(zs_config_parse(FAM("MistralForCausalLM", ", \"sliding_window\": null"), o, &c) == 0 && c.sliding_window == 0,
          "mistral null window");
    /* wrong combinations, each naming its key */
    CHECK_ERR(zs_config_parse(FAM("MistralForCausalLM", ", \"max_position_embeddings\": 1024, \"sliding_window\": 4096"), o, &c),
              "sliding_window", "larger than the context", "max_position_embeddings");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 0}"), o, &c),
              "rope_scaling.factor");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": -2.0}"), o, &c),
              "rope_scaling.factor");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"type\": \"linear\"}"), o, &c),
              "rope_scaling.factor", "missing");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                                  "\"low_freq_factor\": 1.0, \"high_freq_factor\": 1.0, "
                                  "\"original_max_position_embeddings\": 8192}"), o, &c), "high_freq_factor");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"factor\": 2.0}"), o, &c), "rope_type");
    CHECK_ERR(zs_config_parse(FAM("LlamaForCausalLM", ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0, "
                                  "\"beta_fast\": \"fast\"}"), o, &c), "rope_scaling.beta_fast");
    CHECK_ERR(zs_config_parse(FAM("Qwen2ForCausalLM", ", \"use_sliding_window\": true, \"sliding_window\": 0"), o, &c),
              "sliding_window");
    /* a config written for each family reads back equal */
    static const char *fams[] = {"mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        zs_init_opts io;
        char p[4200];
        snprintf(p, sizeof p, "%s/fam-%s.json", tmp, fams[i]);
        CHECK(zs_init_opts_default(fams[i], &io) == 0, "%s defaults: %s", fams[i], zs_errmsg());
        CHECK(zs_config_write(&io.cfg, p) == 0, "%s writes: %s", fams[i], zs_errmsg());
    }
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "loader") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    test_stories();
    test_gpt2();
    test_writer();
    test_shards();
    test_bad_files();
    test_fingerprint();
    test_config();
    test_config_families();
    tu_rmdir(tmp);
    return tu_finish("test-loader");
}

/* test-gguf-model.c — models and tokenizers loaded from GGUF files (model.c's GGUF path,
 * config.c's zs_config_from_gguf, the tokenizer built from tokenizer.ggml.* arrays):
 * stories260K.gguf gives bit for bit the same packed weights (after undoing the per-head Q/K
 * RoPE permutation), the same logits, the same greedy ids and text as the safetensors directory
 * converted from it, and the same tokenization as its tokenizer.json (spaces, newlines,
 * non-ASCII, literal <s>, every piece of the vocab); small synthetic GGUFs load (llama with an
 * F16 tensor, qwen2 with biases, a byte-level BPE tokenizer with a pre-tokenizer and a control
 * token, a chat template) and fail with messages naming the problem (unknown architecture,
 * missing tensor, wrong shape, quantized tensor, missing hyperparameter, RoPE scaling llama.cpp does
 * not have); and random checkpoints of the newer families (Llama 3 RoPE, Mistral with YaRN, Qwen2, Qwen3,
 * Gemma 2, Gemma 3 tied and untied, Phi-3 with LongRoPE and tied), converted by zeroserve convert and
 * loaded back, have the checkpoint's configuration and give its greedy ids and logits. */
#include "chat.h"
#include "common.h"
#include "convert.h"
#include "device.h"
#include "engine.h"
#include "gguf.h"
#include "init-model.h"
#include "model.h"
#include "testutil.h"

static char g_tmp[4096];

/* ---------- a small GGUF writer (little-endian, version 3, alignment 32) ---------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static void gput(gbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gle(gbuf *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        gput(b, &c, 1);
    }
}
static void gstr(gbuf *b, const char *s) {
    gle(b, strlen(s), 8);
    gput(b, s, strlen(s));
}
static void gf32(gbuf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    gle(b, u, 4);
}

typedef struct {
    gbuf kv;
    uint64_t nkv;
    const char *tname[64];
    int ttype[64], nd[64];
    int64_t ne[64][2];
    int nt;
} gwriter;

static void kv_str(gwriter *w, const char *k, const char *v) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_STR, 4), gstr(&w->kv, v), w->nkv++;
}
static void kv_u32(gwriter *w, const char *k, uint32_t v) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_U32, 4), gle(&w->kv, v, 4), w->nkv++;
}
static void kv_f32(gwriter *w, const char *k, float v) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_F32, 4), gf32(&w->kv, v), w->nkv++;
}
static void kv_bool(gwriter *w, const char *k, int v) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_BOOL, 4), gle(&w->kv, (uint64_t)v, 1), w->nkv++;
}
static void kv_strs(gwriter *w, const char *k, const char *const *v, int n) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_ARR, 4), gle(&w->kv, ZS_GGUF_STR, 4), gle(&w->kv, (uint64_t)n, 8);
    for (int i = 0; i < n; i++) gstr(&w->kv, v[i]);
    w->nkv++;
}
static void kv_i32s(gwriter *w, const char *k, const int32_t *v, int n) {
    gstr(&w->kv, k), gle(&w->kv, ZS_GGUF_ARR, 4), gle(&w->kv, ZS_GGUF_I32, 4), gle(&w->kv, (uint64_t)n, 8);
    for (int i = 0; i < n; i++) gle(&w->kv, (uint32_t)v[i], 4);
    w->nkv++;
}
/* A tensor of ne0 x ne1 (ne1 = 1 and nd = 1 for a vector); data is filled in by gw_write. */
static void tensor(gwriter *w, const char *name, int type, int nd, int64_t ne0, int64_t ne1) {
    w->tname[w->nt] = name;
    w->ttype[w->nt] = type;
    w->nd[w->nt] = nd;
    w->ne[w->nt][0] = ne0;
    w->ne[w->nt][1] = ne1;
    w->nt++;
}

/* Writes the file: header, tensor infos, data (small deterministic values); 0 on success. */
static int gw_write(gwriter *w, const char *path) {
    gbuf b = {0};
    gput(&b, "GGUF", 4);
    gle(&b, 3, 4);
    gle(&b, (uint64_t)w->nt, 8);
    gle(&b, w->nkv, 8);
    gput(&b, w->kv.p, w->kv.n);
    size_t sz[64], off = 0, offs[64];
    for (int t = 0; t < w->nt; t++) {
        int64_t ne[4] = {w->ne[t][0], w->ne[t][1], 1, 1};
        if (zs_gguf_tensor_nbytes(w->ttype[t], w->nd[t], ne, &sz[t]) < 0) return -1;
        gstr(&b, w->tname[t]);
        gle(&b, (uint64_t)w->nd[t], 4);
        for (int k = 0; k < w->nd[t]; k++) gle(&b, (uint64_t)w->ne[t][k], 8);
        gle(&b, (uint64_t)w->ttype[t], 4);
        gle(&b, off, 8);
        offs[t] = off;
        off = ZS_ALIGN_UP(off + sz[t], 32);
    }
    while (b.n % 32) gle(&b, 0, 1);
    size_t base = b.n;
    for (int t = 0; t < w->nt; t++) {
        while (b.n < base + offs[t]) gle(&b, 0, 1);
        for (size_t k = 0; k < sz[t]; k++) {
            uint8_t v = w->ttype[t] == ZS_GGML_F32 && k % 4 == 3 ? 0x3c : (uint8_t)(k * 13 + t);
            if (w->ttype[t] == ZS_GGML_F16 && k % 2 == 1) v = 0x3a;
            gput(&b, &v, 1);
        }
    }
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b.p, 1, b.n, f) == b.n;
    if (f) fclose(f);
    free(b.p);
    free(w->kv.p);
    return ok ? 0 : -1;
}

/* ---------- synthetic models ---------- */

enum { BAD_NONE, BAD_ARCH, BAD_MISSING, BAD_SHAPE, BAD_QUANT, BAD_NO_EPS, BAD_ROPE };

#define SD 32 /* dim */
#define SF 64 /* ffn */
#define SV 6  /* vocab */

static const char *const bpe_tokens[SV] = {"a", "b", "ab", "\xc4\xa0", "\xc4\xa0" "a", "<|endoftext|>"};

/* A one-layer model (llama or qwen2: 4 heads of 8, 2 kv heads) with a tiny byte-level BPE vocab. */
static int write_synthetic(const char *path, const char *arch, int bad, const char *chat) {
    gwriter w;
    memset(&w, 0, sizeof w);
    char k[128];
    kv_str(&w, "general.architecture", bad == BAD_ARCH ? "mamba" : arch);
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    kv_u32(&w, AK("context_length"), 64);
    kv_u32(&w, AK("embedding_length"), SD);
    kv_u32(&w, AK("block_count"), 1);
    kv_u32(&w, AK("feed_forward_length"), SF);
    kv_u32(&w, AK("attention.head_count"), 4);
    kv_u32(&w, AK("attention.head_count_kv"), 2);
    if (bad != BAD_NO_EPS) kv_f32(&w, AK("attention.layer_norm_rms_epsilon"), 1e-6f);
    kv_f32(&w, AK("rope.freq_base"), 1000000.0f);
    if (bad == BAD_ROPE) kv_str(&w, AK("rope.scaling.type"), "dynamic");
#undef AK
    static const char *const merges[2] = {"a b", "\xc4\xa0 a"};
    static const int32_t types[SV] = {1, 1, 1, 1, 1, 3};
    kv_str(&w, "tokenizer.ggml.model", "gpt2");
    kv_str(&w, "tokenizer.ggml.pre", "qwen2");
    kv_strs(&w, "tokenizer.ggml.tokens", bpe_tokens, SV);
    kv_i32s(&w, "tokenizer.ggml.token_type", types, SV);
    kv_strs(&w, "tokenizer.ggml.merges", merges, 2);
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 5);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", 0);
    if (chat) kv_str(&w, "tokenizer.chat_template", chat);
    int qwen = !strcmp(arch, "qwen2");
    tensor(&w, "token_embd.weight", ZS_GGML_F32, 2, SD, SV);
    tensor(&w, "blk.0.attn_norm.weight", ZS_GGML_F32, 1, SD, 1);
    tensor(&w, "blk.0.attn_q.weight", ZS_GGML_F32, 2, SD, 32);
    tensor(&w, "blk.0.attn_k.weight", ZS_GGML_F32, 2, SD, bad == BAD_SHAPE ? 32 : 16);
    tensor(&w, "blk.0.attn_v.weight", ZS_GGML_F16, 2, SD, 16);
    if (qwen) {
        tensor(&w, "blk.0.attn_q.bias", ZS_GGML_F32, 1, 32, 1);
        tensor(&w, "blk.0.attn_k.bias", ZS_GGML_F32, 1, 16, 1);
        tensor(&w, "blk.0.attn_v.bias", ZS_GGML_F32, 1, 16, 1);
    }
    tensor(&w, "blk.0.attn_output.weight", ZS_GGML_BF16, 2, 32, SD);
    tensor(&w, "blk.0.ffn_norm.weight", ZS_GGML_F32, 1, SD, 1);
    if (bad != BAD_MISSING) tensor(&w, "blk.0.ffn_gate.weight", ZS_GGML_F32, 2, SD, SF);
    tensor(&w, "blk.0.ffn_up.weight", bad == BAD_QUANT ? ZS_GGML_Q8_1 : ZS_GGML_F32, 2, SD, SF);
    tensor(&w, "blk.0.ffn_down.weight", ZS_GGML_F32, 2, SF, SD);
    tensor(&w, "output_norm.weight", ZS_GGML_F32, 1, SD, 1);
    return gw_write(&w, path);
}

static void test_synthetic(void) {
    char p[4200];
    snprintf(p, sizeof p, "%s/m.gguf", g_tmp);
    zs_model *m = NULL;
    const char *archs[2] = {"llama", "qwen2"};
    for (int a = 0; a < 2; a++) {
        CHECK(write_synthetic(p, archs[a], BAD_NONE, NULL) == 0, "write");
        int rc = zs_model_open(p, NULL, &m);
        CHECK(rc == 0, "%s: open: %s", archs[a], zs_errmsg());
        if (rc == 0) {
            const zs_model_config *c = zs_model_config_get(m);
            CHECK(c->dim == SD && c->n_layers == 1 && c->n_heads == 4 && c->n_kv_heads == 2 && c->head_dim == 8 &&
                      c->ffn_dim == SF && c->vocab_size == SV && c->max_seq == 64 && c->tied_embeddings &&
                      c->norm_eps == 1e-6f && c->rope_theta == 1000000.0f && c->eos_id == 5 && c->bos_id == -1,
                  "%s: config", archs[a]);
            CHECK(c->qkv_bias == (a == 1) && !c->o_bias && !c->mlp_bias, "%s: biases", archs[a]);
            CHECK(zs_model_load_resident(m) == 0, "%s: pack: %s", archs[a], zs_errmsg());
            CHECK(!strncmp(zs_model_fingerprint(m), "gguf-", 5), "fingerprint %s", zs_model_fingerprint(m));
            zs_slot_source ss;
            CHECK(zs_model_slot_source(m, 1, ZS_R_WQ, &ss) < 0, "no HF export of GGUF tensors");
            zs_model_free(m);
            m = NULL;
        }
    }
    /* the tokenizer: byte-level BPE with the qwen2 pre-tokenizer and a control token */
    zs_tokenizer *t = NULL;
    int rc = zs_model_tokenizer_load(p, &t);
    CHECK(rc == 0, "tokenizer: %s", zs_errmsg());
    if (rc == 0) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *s = "ab a<|endoftext|>b";
        rc = zs_tokenizer_encode(t, s, strlen(s), 1, &ids, &n);
        CHECK(rc == 0 && n == 4 && ids[0] == 2 && ids[1] == 4 && ids[2] == 5 && ids[3] == 1,
              "bpe encode (rc %d, n %zu)", rc, n);
        CHECK(zs_tokenizer_is_special(t, 5) && zs_tokenizer_is_eos(t, 5) && zs_tokenizer_bos(t) == -1,
              "control token special, eos");
        char *d = NULL;
        if (rc == 0 && zs_tokenizer_decode(t, ids, n, 0, &d) == 0) CHECK(!strcmp(d, s), "decode '%s'", d);
        free(d);
        free(ids);
        zs_tokenizer_free(t);
    }
    CHECK(zs_model_chat_template_detect(p) == ZS_CHAT_PLAIN, "no template -> plain");
    CHECK(write_synthetic(p, "qwen2", BAD_NONE, "{% for m in messages %}<|im_start|>{{ m.role }}") == 0, "write");
    CHECK(zs_model_chat_template_detect(p) == ZS_CHAT_CHATML, "chatml from tokenizer.chat_template");

    CHECK(write_synthetic(p, "llama", BAD_ARCH, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "general.architecture", "mamba", "not supported");
    CHECK(write_synthetic(p, "llama", BAD_MISSING, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "blk.0.ffn_gate.weight", "not found");
    CHECK(write_synthetic(p, "llama", BAD_SHAPE, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "blk.0.attn_k.weight", "ne [32, 32]", "expected [32, 16]");
    CHECK(write_synthetic(p, "llama", BAD_QUANT, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "blk.0.ffn_up.weight", "Q8_1",
              "quantized GGUF tensors are not supported yet");
    CHECK(write_synthetic(p, "qwen2", BAD_NO_EPS, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "qwen2.attention.layer_norm_rms_epsilon", "missing");
    CHECK(write_synthetic(p, "llama", BAD_ROPE, NULL) == 0, "write");
    CHECK_ERR(zs_model_open(p, NULL, &m), "m.gguf", "llama.rope.scaling.type", "dynamic", "supported: none, linear, yarn");
    CHECK_ERR(zs_model_open("/nonexistent/x.gguf", NULL, &m), "/nonexistent/x.gguf");
    /* not a GGUF file at all */
    snprintf(p, sizeof p, "%s/junk.gguf", g_tmp);
    FILE *f = fopen(p, "wb");
    if (f) fputs("not a gguf file, just text", f), fclose(f);
    CHECK_ERR(zs_model_open(p, NULL, &m), "junk.gguf");
    CHECK_ERR(zs_model_tokenizer_load(p, &t), "junk.gguf");
}

/* ---------- stories260K: the GGUF against the directory converted from it ---------- */

static int open_engine(const char *path, int ranks, int tier, const char *nvme, zs_engine **e) {
    zs_engine_opts o;
    zs_engine_opts_default(&o);
    o.model_dir = path;
    o.model.embed_lookup = 1;
    o.max_seqs = 2;
    o.max_batch_tokens = 64;
    o.ranks = ranks;
    o.gather.tier = tier;
    o.nvme_path = nvme;
    o.device = ZS_DEVICE_CPU;
    return zs_engine_open(&o, e);
}

static void same_packing(const char *dir, const char *gguf) {
    zs_model *a = NULL, *b = NULL;
    int rc = zs_model_open(dir, NULL, &a);
    if (rc == 0) rc = zs_model_open(gguf, NULL, &b);
    CHECK(rc == 0, "open: %s", zs_errmsg());
    if (rc == 0) {
        const zs_model_config *ca = zs_model_config_get(a), *cb = zs_model_config_get(b);
        CHECK(ca->arch == cb->arch && ca->n_layers == cb->n_layers && ca->dim == cb->dim &&
                  ca->n_heads == cb->n_heads && ca->n_kv_heads == cb->n_kv_heads && ca->head_dim == cb->head_dim &&
                  ca->ffn_dim == cb->ffn_dim && ca->vocab_size == cb->vocab_size &&
                  ca->norm_eps == cb->norm_eps && ca->rope_theta == cb->rope_theta &&
                  ca->tied_embeddings == cb->tied_embeddings && ca->bos_id == cb->bos_id &&
                  ca->eos_id == cb->eos_id && ca->dtype == cb->dtype && ca->qkv_bias == cb->qkv_bias,
              "same configuration");
        /* the one difference: llama.context_length is 2048, the converted config.json says 512 */
        CHECK(ca->max_seq == 512 && cb->max_seq == 2048, "max_seq %d / %d", ca->max_seq, cb->max_seq);
        CHECK(zs_model_n_buckets(a) == zs_model_n_buckets(b), "buckets");
        CHECK(strcmp(zs_model_fingerprint(a), zs_model_fingerprint(b)) != 0, "fingerprints differ");
        for (int k = 0; k < zs_model_n_buckets(a) && k < zs_model_n_buckets(b); k++) {
            const zs_bucket_layout *la = zs_model_layout(a, k), *lb = zs_model_layout(b, k);
            CHECK(la->data_bytes == lb->data_bytes && la->resident_bytes == lb->resident_bytes, "layout %d", k);
            if (la->data_bytes != lb->data_bytes || la->resident_bytes != lb->resident_bytes) continue;
            void *da = malloc(la->data_bytes + 1), *db = malloc(la->data_bytes + 1);
            void *ra = malloc(la->resident_bytes + 1), *rb = malloc(la->resident_bytes + 1);
            CHECK(zs_model_pack_bucket(a, k, da, ra) == 0 && zs_model_pack_bucket(b, k, db, rb) == 0, "pack %d", k);
            CHECK(!memcmp(da, db, la->data_bytes) && !memcmp(ra, rb, la->resident_bytes),
                  "bucket %d packs bit for bit the same", k);
            free(da), free(db), free(ra), free(rb);
        }
    }
    zs_model_free(a);
    zs_model_free(b);
}

static const char *const strings[] = {
    "Once upon a time",
    "Tom and his dog",
    "",
    " ",
    "  two  spaces   and trailing ",
    "line one\nline two\n\n",
    "<s>Once</s> upon <unk> a time",
    "a<s>b",
    "caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80!",
    "The little girl said, \"Let's play!\" 123 4567.",
    "\ttab\r\nCRLF",
    "\xe2\x96\x81literal metaspace",
};

static void same_tokens(const zs_tokenizer *a, const zs_tokenizer *b, const char *s, size_t len, int add) {
    int32_t *ia = NULL, *ib = NULL;
    size_t na = 0, nb = 0;
    int ra = zs_tokenizer_encode(a, s, len, add, &ia, &na), rb = zs_tokenizer_encode(b, s, len, add, &ib, &nb);
    CHECK(ra == rb && na == nb && (!na || !memcmp(ia, ib, na * sizeof *ia)), "encode \"%.*s\" (add %d): %zu vs %zu ids",
          (int)len, s, add, na, nb);
    if (ra == 0 && rb == 0) {
        char *da = NULL, *db = NULL;
        CHECK(zs_tokenizer_decode(a, ia, na, 1, &da) == 0 && zs_tokenizer_decode(b, ia, na, 1, &db) == 0 &&
                  !strcmp(da, db), "decode \"%.*s\"", (int)len, s);
        free(da), free(db);
    }
    free(ia), free(ib);
}

static void test_tokenizer(const char *dir, const char *gguf) {
    zs_tokenizer *a = NULL, *b = NULL;
    int rc = zs_tokenizer_load(dir, &a);
    if (rc == 0) rc = zs_model_tokenizer_load(gguf, &b);
    CHECK(rc == 0, "tokenizers: %s", zs_errmsg());
    if (rc == 0) {
        int n = zs_tokenizer_vocab_size(a);
        CHECK(n == zs_tokenizer_vocab_size(b) && n == 512, "vocab %d", zs_tokenizer_vocab_size(b));
        CHECK(zs_tokenizer_bos(a) == zs_tokenizer_bos(b) && zs_tokenizer_eos(a) == zs_tokenizer_eos(b), "bos/eos");
        int diff = 0;
        for (int id = 0; id < n; id++) {
            const char *pa = zs_tokenizer_piece(a, id), *pb = zs_tokenizer_piece(b, id);
            if (zs_tokenizer_is_special(a, id) != zs_tokenizer_is_special(b, id) || zs_tokenizer_is_eos(a, id) !=
                zs_tokenizer_is_eos(b, id) || !pa || !pb || strcmp(pa, pb))
                diff++;
        }
        CHECK(diff == 0, "%d ids differ in piece or special/eos flags", diff);
        for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
            for (int add = 0; add < 2; add++) same_tokens(a, b, strings[i], strlen(strings[i]), add);
        /* every piece as text (with its spaces), and pairs of pieces */
        char buf[256];
        for (int id = 3; id < n; id++) {
            const char *p = zs_tokenizer_piece(a, id);
            size_t k = 0;
            for (size_t j = 0; p[j] && k < 200; j++) {
                if (!strncmp(p + j, "\xe2\x96\x81", 3)) buf[k++] = ' ', j += 2;
                else buf[k++] = p[j];
            }
            const char *q = zs_tokenizer_piece(a, 3 + (id * 37) % (n - 3));
            int m = snprintf(buf + k, sizeof buf - k, "%s x%s", id > 258 ? q : "", id % 3 ? "\n" : "");
            same_tokens(a, b, buf, k + (size_t)m, 1);
        }
        int32_t *ids = NULL;
        size_t nids = 0;
        rc = zs_tokenizer_encode(b, "Once upon a time", 16, 1, &ids, &nids);
        CHECK(rc == 0 && nids == 5 && ids[0] == 1 && ids[1] == 403 && ids[2] == 407 && ids[3] == 261 && ids[4] == 378,
              "README example");
        free(ids);
    }
    zs_tokenizer_free(a);
    zs_tokenizer_free(b);
    CHECK(zs_model_chat_template_detect(gguf) == ZS_CHAT_PLAIN, "stories260K.gguf has no chat template");
}

static int gen(zs_engine *e, const int32_t *prompt, int np, int n, int32_t *out, float *logits0) {
    zs_gen_params gp;
    memset(&gp, 0, sizeof gp);
    zs_sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.max_tokens = n;
    gp.ignore_eos = 1;
    zs_gen_result res;
    int rc = zs_engine_generate(e, prompt, np, &gp, NULL, NULL, &res);
    if (rc < 0) return rc;
    memcpy(out, res.ids, (size_t)res.n_generated * sizeof *out);
    rc = res.n_generated;
    free(res.ids);
    /* the logits of every prompt position, one forward over a fresh sequence */
    zs_kvcache *kv = zs_engine_kv(e);
    int seq;
    ZS_CHECK(zs_kv_seq_open(kv, &seq));
    ZS_CHECK(zs_kv_seq_reserve(kv, seq, np));
    int32_t pos[64], sq[64], li[64];
    for (int i = 0; i < np; i++) pos[i] = i, sq[i] = seq, li[i] = i;
    zs_batch b = {np, prompt, pos, sq, li, np, NULL, NULL, NULL};
    int frc = zs_engine_forward(e, &b, logits0);
    zs_kv_seq_close(kv, seq);
    return frc < 0 ? frc : rc;
}

static void test_generate(const char *dir, const char *gguf) {
    json_t *ref = tu_load_reference(dir);
    if (!ref) {
        CHECK(0, "no reference.json");
        return;
    }
    char nv[4200];
    snprintf(nv, sizeof nv, "%s/nvme", g_tmp);
    mkdir(nv, 0700);
    json_t *cases = json_object_get(ref, "cases");
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cj = json_array_get(cases, c);
        json_t *pj = json_object_get(cj, "prompt_ids"), *nj = json_object_get(cj, "new_ids");
        int np = (int)json_array_size(pj), nn = (int)json_array_size(nj);
        int32_t prompt[64], want[128], got[3][128];
        for (int i = 0; i < np && i < 64; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pj, i));
        for (int i = 0; i < nn && i < 128; i++) want[i] = (int32_t)json_integer_value(json_array_get(nj, i));
        float *lg[3];
        int ng[3];
        /* 0: directory, 1: GGUF, 2: GGUF over 2 ranks with NVMe shards */
        for (int k = 0; k < 3; k++) {
            zs_engine *e = NULL;
            lg[k] = calloc((size_t)np * 512, sizeof(float));
            int rc = open_engine(k ? gguf : dir, k == 2 ? 2 : 1, k == 2 ? ZS_OFFLOAD_NVME : ZS_OFFLOAD_NONE,
                                 k == 2 ? nv : NULL, &e);
            CHECK(rc == 0, "engine %d: %s", k, zs_errmsg());
            ng[k] = rc == 0 ? gen(e, prompt, np, nn, got[k], lg[k]) : -1;
            CHECK(ng[k] == nn, "engine %d generated %d: %s", k, ng[k], zs_errmsg());
            zs_engine_free(e);
        }
        for (int k = 0; k < 3; k++) {
            CHECK(ng[k] == nn && !memcmp(got[k], want, (size_t)nn * sizeof *want), "case %zu engine %d: reference ids",
                  c, k);
            CHECK(!memcmp(lg[k], lg[0], (size_t)np * 512 * sizeof(float)), "case %zu engine %d: logits bit for bit", c,
                  k);
        }
        for (int k = 0; k < 3; k++) free(lg[k]);
    }
    /* a second open reuses the shard files (same fingerprint) and still agrees */
    zs_engine *e = NULL;
    int rc = open_engine(gguf, 2, ZS_OFFLOAD_NVME, nv, &e);
    CHECK(rc == 0, "reopen: %s", zs_errmsg());
    if (rc == 0) {
        int32_t p[2] = {1, 403}, out[8];
        float lg[2 * 512];
        CHECK(gen(e, p, 2, 8, out, lg) == 8, "reopen generates");
    }
    zs_engine_free(e);
    json_decref(ref);
}

/* ---------- the newer families: a random checkpoint, converted, loaded back ---------- */

/* zeroserve init-model --arch A --random-norms --set JSON, then zeroserve convert (f32): the
 * configuration read back from the GGUF file (what llama.cpp hard-codes included) is the checkpoint's,
 * with Gemma's norm_offset 0 (the + 1 is in the weights) and Llama 3's RoPE as per-frequency factors,
 * and the engine gives the same greedy ids and the same logits (bit for bit; Llama 3's RoPE, computed
 * from the factors, within 1e-5). */
static void test_families(void) {
    static const struct {
        const char *arch, *set;
    } F[] = {
        {"llama", "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                  "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}}"},
        {"mistral", "{\"sliding_window\": 1024, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8, "
                    "\"original_max_position_embeddings\": 32, \"mscale\": 1, \"mscale_all_dim\": 0.5}}"},
        {"qwen2", "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4}}"},
        {"qwen3", "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 64, "
                  "\"attention_factor\": 1.3}}"},
        {"gemma2", "{\"sliding_window\": 16, \"attn_logit_softcapping\": 0.1, \"final_logit_softcapping\": 0.5}"},
        {"gemma3", "{\"sliding_window\": 16, \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8}}"},
        {"gemma3", "{\"sliding_window\": 16, \"tie_word_embeddings\": false}"},
        {"phi3", "{\"max_position_embeddings\": 2048, \"original_max_position_embeddings\": 32, \"sliding_window\": 24, "
                 "\"rope_scaling\": {\"rope_type\": \"longrope\", \"short_factor\": [1.5, 2, 1, 3, 1.25, 2, 1, 1, 1.5, "
                 "2, 1, 3, 1.25, 2, 1, 1, 1.5, 2, 1, 3, 1.25, 2, 1, 1, 1.5, 2, 1, 3, 1.25, 2, 1, 1], \"long_factor\": "
                 "[4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, 16, 4, 8, 2, "
                 "16]}}"},
        {"phi3", "{\"tie_word_embeddings\": true}"},
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++) {
        char dir[4200], gguf[4300];
        snprintf(dir, sizeof dir, "%s/fam%zu-%s", g_tmp, i, F[i].arch);
        snprintf(gguf, sizeof gguf, "%s.gguf", dir);
        zs_init_opts io;
        int rc = zs_init_opts_default(F[i].arch, &io);
        io.random_norms = 1;
        io.seed = 100 + i;
        if (rc == 0) rc = zs_config_override(&io.cfg, F[i].set, F[i].arch);
        if (rc == 0) rc = zs_init_model_write(&io, dir);
        zs_convert_opts co = {.model_dir = dir, .out_path = gguf, .ftype = ZS_FTYPE_ALL_F32, .name = "zs-test"};
        zs_convert_result cr;
        if (rc == 0 && (rc = zs_convert_run(&co, &cr)) == 0) zs_gguf_conv_close(cr.plan);
        CHECK(rc == 0, "%s %s: init-model + convert: %s", F[i].arch, F[i].set, zs_errmsg());
        if (rc) continue;
        zs_model *a = NULL, *b = NULL;
        rc = zs_model_open(dir, NULL, &a);
        if (rc == 0) rc = zs_model_open(gguf, NULL, &b);
        CHECK(rc == 0, "%s: open: %s", F[i].arch, zs_errmsg());
        int llama3 = 0;
        if (rc == 0) {
            const zs_model_config *x = zs_model_config_get(a), *y = zs_model_config_get(b);
            int gemma = x->family == ZS_FAM_GEMMA2 || x->family == ZS_FAM_GEMMA3;
            llama3 = x->rope.type == ZS_ROPE_LLAMA3;
            /* Mistral is llama in GGUF */
            CHECK(y->family == (x->family == ZS_FAM_MISTRAL ? ZS_FAM_LLAMA : x->family), "%s: family %d", F[i].arch,
                  y->family);
            CHECK(x->dim == y->dim && x->n_layers == y->n_layers && x->n_heads == y->n_heads &&
                      x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim && x->ffn_dim == y->ffn_dim &&
                      x->max_seq == y->max_seq && x->norm_eps == y->norm_eps && x->rope_theta == y->rope_theta &&
                      x->tied_embeddings == y->tied_embeddings && x->qkv_bias == y->qkv_bias &&
                      x->o_bias == y->o_bias && x->act == y->act && x->qk_norm == y->qk_norm &&
                      x->post_norms == y->post_norms && x->query_pre_attn_scalar == y->query_pre_attn_scalar &&
                      x->attn_softcap == y->attn_softcap && x->final_softcap == y->final_softcap &&
                      x->rope_local_theta == y->rope_local_theta,
                  "%s: the same configuration", F[i].arch);
            CHECK(y->norm_offset == 0 && x->norm_offset == (gemma ? 1.0f : 0.0f), "%s: norm offset %g / %g", F[i].arch,
                  (double)x->norm_offset, (double)y->norm_offset);
            CHECK(x->embed_scale == y->embed_scale && y->embed_scale == (gemma ? sqrtf((float)y->dim) : 0),
                  "%s: embed scale %g", F[i].arch, (double)y->embed_scale);
            /* Mistral's window is not in a llama GGUF (llama.cpp's llama has none): here it covers the context */
            int win = x->family == ZS_FAM_MISTRAL ? 0 : x->sliding_window;
            CHECK(y->sliding_window == win && (!win || !memcmp(x->layer_sliding, y->layer_sliding, (size_t)x->n_layers)),
                  "%s: sliding window %d / %d", F[i].arch, x->sliding_window, y->sliding_window);
            if (llama3) {
                CHECK(y->rope.type == ZS_ROPE_LONGROPE && y->rope.n_factors == y->head_dim / 2 &&
                          !memcmp(y->rope.short_factor, y->rope.long_factor, sizeof(float) * (size_t)y->rope.n_factors) &&
                          y->rope.attention_factor == 1.0f,
                      "llama3: RoPE as rope_freqs factors");
            } else {
                CHECK(y->rope.type == x->rope.type && y->rope.factor == x->rope.factor, "%s: RoPE type %d / %d",
                      F[i].arch, x->rope.type, y->rope.type);
            }
        }
        zs_model_free(a);
        zs_model_free(b);
        if (rc) continue;
        /* the same ids and logits: 40 prompt positions (past the windows and the original contexts) */
        int32_t prompt[40], got[2][8];
        for (int k = 0; k < 40; k++) prompt[k] = (int32_t)((k * 37 + 11) % 500);
        float *lg[2];
        int ng[2];
        for (int k = 0; k < 2; k++) {
            zs_engine *e = NULL;
            lg[k] = calloc((size_t)40 * 512, sizeof(float));
            rc = open_engine(k ? gguf : dir, 1, ZS_OFFLOAD_NONE, NULL, &e);
            CHECK(rc == 0, "%s: engine %d: %s", F[i].arch, k, zs_errmsg());
            ng[k] = rc == 0 ? gen(e, prompt, 40, 8, got[k], lg[k]) : -1;
            zs_engine_free(e);
        }
        double worst = 0;
        for (size_t k = 0; k < (size_t)40 * 512; k++) worst = fmax(worst, fabs((double)lg[0][k] - lg[1][k]));
        CHECK(ng[0] == 8 && ng[1] == 8 && !memcmp(got[0], got[1], sizeof got[0]), "%s: the same greedy ids", F[i].arch);
        CHECK(llama3 ? worst <= 1e-5 : worst == 0, "%s %s: logits differ by %g from the checkpoint's", F[i].arch,
              F[i].set, worst);
        fprintf(stderr, "%-8s %-60.60s GGUF vs checkpoint: same ids %d, max |dlogit| %g\n", F[i].arch, F[i].set,
                ng[0] == 8 && ng[1] == 8 && !memcmp(got[0], got[1], sizeof got[0]), worst);
        free(lg[0]);
        free(lg[1]);
    }
}

int main(void) {
    if (tu_tmpdir(g_tmp, sizeof g_tmp, "ggufm") != 0) {
        fprintf(stderr, "cannot create a scratch directory\n");
        return 1;
    }
    char dir[4096], gguf[4200];
    tu_model_dir(dir, sizeof dir, "stories260K");
    snprintf(gguf, sizeof gguf, "%s/stories260K.gguf", dir);
    test_synthetic();
    same_packing(dir, gguf);
    test_tokenizer(dir, gguf);
    test_generate(dir, gguf);
    test_families();
    tu_rmdir(g_tmp);
    return tu_finish("test-gguf-model");
}

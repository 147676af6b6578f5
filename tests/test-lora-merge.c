/* test-lora-merge.c — `zeroserve export --merge` (zs_lora_merge_export, engine/model/lora-merge.c):
 * PEFT's adapter tests/ref/lora-peft merged into its base (regenerated with reference.json's
 * init-model flags) loads as a plain model whose logits are PEFT's adapted logits (PEFT's
 * merge_and_unload is the same function) within 1e-4; every adapted tensor is exactly
 * W + scale·B·A (double accumulation, one rounding to f32, then to W's dtype: f32 and bf16 bases),
 * every other tensor and file byte for byte the base's; a sharded base (index + two shards) gives
 * the same tensors and logits bit for bit; a previous export is replaced, a user's directory is
 * not; a GGUF base, a missing adapter and an adapter for another base are refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "lora.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "testutil.h"

#define REF "tests/ref/lora-peft"
#define TOL 1e-4

int zs_cmd_export_merge(int argc, char **argv); /* server/export-cmd.c */

static char tmp[4096];

/* writes the base of reference.json's init-model flags (plus extra flags) to tmp/name */
static const char *make_base(json_t *ref, const char *name, const char *f1, const char *v1) {
    static char out[4200];
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    return tu_ref_lora_base(ref, out, f1, v1) < 0 ? NULL : out;
}

static char *path2(const char *a, const char *b) {
    static char buf[4][4300];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", a, b);
    return buf[k];
}

static long file_bytes(const char *p, char **data) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)n + 1);
    if (fread(*data, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    long n = file_bytes(a, &x), m = file_bytes(b, &y);
    int same = n >= 0 && n == m && !memcmp(x, y, (size_t)n);
    free(x);
    free(y);
    return same;
}

/* max |logit - PEFT's| at reference.json's positions, for the model in dir; logits into out */
static double forward_diff(const char *dir, json_t *ref, float *out) {
    zs_model *m = NULL;
    zs_kvcache *kv = NULL;
    zs_forward *f = NULL;
    double d = 1e30;
    if (zs_model_open(dir, NULL, &m) < 0 || zs_model_load_resident(m) < 0) {
        fprintf(stderr, "%s: %s\n", dir, zs_errmsg());
        zs_model_free(m);
        return d;
    }
    const zs_model_config *c = zs_model_config_get(m);
    json_t *ids = json_object_get(ref, "ids"), *pos = json_object_get(ref, "positions"), *lg = json_object_get(ref, "logits");
    int n = (int)json_array_size(ids), np = (int)json_array_size(pos), seq = 0;
    int32_t tok[64], ps[64], sq[64], li[64];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        ps[i] = i;
        sq[i] = 0;
        li[i] = -1;
    }
    for (int k = 0; k < np; k++) li[json_integer_value(json_array_get(pos, k))] = k;
    if (zs_kv_init(c->n_layers, c->n_kv_heads * c->head_dim, 64, 1, c->max_seq, &kv) == 0 &&
        zs_forward_new(m, 64, &f) == 0 && zs_kv_seq_open(kv, &seq) == 0 && zs_kv_seq_reserve(kv, seq, n) == 0) {
        for (int i = 0; i < n; i++) sq[i] = seq;
        zs_batch b = {n, tok, ps, sq, li, np, NULL, NULL, NULL};
        zs_weight_source src = zs_model_resident_source(m);
        if (zs_forward_run(f, &src, kv, &b, out) == 0) {
            d = 0;
            for (int k = 0; k < np; k++)
                for (int v = 0; v < c->vocab_size; v++) {
                    double e = fabs((double)out[(size_t)k * c->vocab_size + v] -
                                    json_number_value(json_array_get(json_array_get(lg, k), v)));
                    if (e > d) d = e;
                }
        } else {
            fprintf(stderr, "forward: %s\n", zs_errmsg());
        }
    }
    zs_forward_free(f);
    zs_kv_free(kv);
    zs_model_free(m);
    return d;
}

/* Compares merged (dir) with base tensor by tensor: adapted ones W + scale·B·A exactly as the
 * contract computes it, the rest byte for byte. Returns the number of adapted tensors checked. */
static int check_tensors(const char *base, const char *merged, const zs_lora *l, int *bad_other, int *bad_adapted) {
    zs_st_set *a = NULL, *b = NULL;
    int n_adapted = 0;
    *bad_other = *bad_adapted = 0;
    if (zs_st_open_dir(base, &a) < 0 || zs_st_open_dir(merged, &b) < 0) {
        fprintf(stderr, "%s\n", zs_errmsg());
        *bad_other = 1;
        zs_st_close(a);
        return 0;
    }
    if (zs_st_count(a) != zs_st_count(b)) (*bad_other)++;
    double s = zs_lora_scale(l);
    int r = zs_lora_get_params(l)->r;
    for (size_t i = 0; i < zs_st_count(a); i++) {
        const zs_st_tensor *x = zs_st_at(a, i), *y = zs_st_find(b, x->name);
        if (!y || y->dtype != x->dtype || y->nbytes != x->nbytes || y->ndim != x->ndim) {
            (*bad_other)++;
            continue;
        }
        int layer = -1, tg = -1;
        char mod[64];
        if (sscanf(x->name, "model.layers.%d.%*[a-z_].%63[a-z_].weight", &layer, mod) == 2)
            for (int t = 0; t < ZS_LORA_NT; t++)
                if (!strcmp(mod, zs_lora_target_name(t))) tg = t;
        if (tg < 0) {
            *bad_other += memcmp(x->data, y->data, x->nbytes) != 0;
            continue;
        }
        n_adapted++;
        int in, out;
        zs_lora_dims(l, tg, &in, &out);
        size_t n = (size_t)in * out;
        float *w = malloc(n * 4);
        void *want = malloc(x->nbytes);
        zs_to_f32(w, x->data, x->dtype, n);
        const float *A = zs_lora_A_const(l, layer, tg), *B = zs_lora_B_const(l, layer, tg);
        for (int o = 0; o < out; o++)
            for (int c = 0; c < in; c++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += (double)B[o * r + k] * (double)A[k * in + c];
                w[(size_t)o * in + c] = (float)((double)w[(size_t)o * in + c] + s * acc);
            }
        zs_convert(want, x->dtype, w, ZS_F32, n);
        *bad_adapted += memcmp(want, y->data, x->nbytes) != 0;
        *bad_adapted += !memcmp(x->data, y->data, x->nbytes); /* B != 0: the tensor must change */
        free(w);
        free(want);
    }
    zs_st_close(a);
    zs_st_close(b);
    return n_adapted;
}

/* base split into two shards with an index (layer 0 and the embeddings in the first) */
static const char *make_sharded(const char *base) {
    static char dir[4200];
    snprintf(dir, sizeof dir, "%s/sharded", tmp);
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", NULL};
    for (int i = 0; files[i]; i++) {
        char *d = NULL;
        long n = file_bytes(path2(base, files[i]), &d);
        if (n >= 0) tu_write_file(path2(dir, files[i]), d, (size_t)n);
        free(d);
    }
    zs_st_set *st = NULL;
    if (zs_st_open_dir(base, &st) < 0) return NULL;
    size_t nt = zs_st_count(st), k[2] = {0, 0};
    zs_st_decl *d[2] = {calloc(nt, sizeof(zs_st_decl)), calloc(nt, sizeof(zs_st_decl))};
    const zs_st_tensor **ts[2] = {calloc(nt, sizeof(void *)), calloc(nt, sizeof(void *))};
    const char *shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    json_t *wm = json_object();
    size_t total = 0;
    for (size_t i = 0; i < nt; i++) {
        const zs_st_tensor *t = zs_st_at(st, i);
        int w = strstr(t->name, "layers.0.") || strstr(t->name, "embed_tokens") ? 0 : 1;
        d[w][k[w]] = (zs_st_decl){t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1], t->shape[2], t->shape[3]}};
        ts[w][k[w]++] = t;
        json_object_set_new(wm, t->name, json_string(shard[w]));
        total += t->nbytes;
    }
    int ok = 1;
    for (int w = 0; w < 2; w++) {
        zs_st_writer *wr = NULL;
        ok &= zs_st_writer_open(path2(dir, shard[w]), d[w], k[w], "{\"format\":\"pt\"}", &wr) == 0;
        for (size_t i = 0; ok && i < k[w]; i++) ok &= zs_st_writer_write(wr, ts[w][i]->data, ts[w][i]->nbytes) == 0;
        ok &= wr && zs_st_writer_close(wr) == 0;
        free(d[w]);
        free(ts[w]);
    }
    json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
    json_dump_file(idx, path2(dir, "model.safetensors.index.json"), JSON_INDENT(2));
    json_decref(idx);
    zs_st_close(st);
    return ok ? dir : NULL;
}

int main(void) {
    if (tu_tmpdir(tmp, sizeof tmp, "lora-merge") != 0) return 1;
    json_t *ref = json_load_file(REF "/reference.json", 0, NULL);
    CHECK(ref != NULL, "reference.json");
    if (!ref) return tu_finish("test-lora-merge");
    char base[4200], merged[4200];
    const char *bp = make_base(ref, "base", NULL, NULL);
    CHECK(bp != NULL, "base model");
    if (!bp) return tu_finish("test-lora-merge");
    snprintf(base, sizeof base, "%s", bp);
    snprintf(merged, sizeof merged, "%s/merged", tmp);

    zs_model *bm = NULL;
    zs_lora *l = NULL;
    CHECK(zs_model_open(base, NULL, &bm) == 0 && zs_lora_load(REF, bm, &l) == 0, "PEFT's adapter: %s", zs_errmsg());
    if (!l) return tu_finish("test-lora-merge");

    /* merged: PEFT's logits */
    CHECK(zs_lora_merge_export(base, REF, merged) == 0, "merge: %s", zs_errmsg());
    float lg[4 * 300], lg_base[4 * 300], lg_sh[4 * 300];
    double d = forward_diff(merged, ref, lg), d0 = forward_diff(base, ref, lg_base);
    CHECK(d <= TOL, "merged model: logits within %g of PEFT's (max |diff| %.3g)", TOL, d);
    CHECK(d0 > 100 * TOL, "the base alone is far from PEFT's logits (%.3g): the comparison can fail", d0);
    fprintf(stderr, "merged f32: max |logit - PEFT| = %.3g (base alone: %.3g)\n", d, d0);
    int bo, ba, na = check_tensors(base, merged, l, &bo, &ba);
    CHECK(na == 2 * ZS_LORA_NT && ba == 0, "%d adapted tensors, %d not W + scale*B*A (or unchanged)", na, ba);
    CHECK(bo == 0, "every other tensor byte for byte (%d differ)", bo);
    const char *same[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", NULL};
    for (int i = 0; same[i]; i++)
        if (access(path2(base, same[i]), F_OK) == 0)
            CHECK(same_file(path2(base, same[i]), path2(merged, same[i])), "%s copied as it is", same[i]);
    json_t *mk = json_load_file(path2(merged, "zeroserve-merge.json"), 0, NULL);
    CHECK(mk && json_integer_value(json_object_get(mk, "merged_tensors")) == 14 &&
          json_integer_value(json_object_get(mk, "r")) == 4, "the marker records the merge");
    json_decref(mk);
    {   /* the safetensors header (names, order, offsets, metadata) as the base's */
        char *x = NULL, *y = NULL;
        long n = file_bytes(path2(base, "model.safetensors"), &x), m = file_bytes(path2(merged, "model.safetensors"), &y);
        uint64_t h = 0;
        for (int i = 0; n > 8 && i < 8; i++) h |= (uint64_t)(uint8_t)x[i] << (8 * i);
        CHECK(n > 8 && n == m && (long)h + 8 <= n && !memcmp(x, y, h + 8), "same file size and header bytes");
        free(x);
        free(y);
    }

    /* again over the previous export: replaced, nothing left beside it */
    CHECK(zs_lora_merge_export(base, REF, merged) == 0, "re-export over a previous export: %s", zs_errmsg());
    char side[4300];
    snprintf(side, sizeof side, "%s.tmp", merged);
    CHECK(access(side, F_OK) != 0, "no %s left", side);
    snprintf(side, sizeof side, "%s.old", merged);
    CHECK(access(side, F_OK) != 0, "no %s left", side);
    CHECK(access(path2(merged, "model.safetensors"), F_OK) == 0, "the new export in place");
    /* a crashed export's out_dir.tmp (it has the marker) is cleaned up; someone else's is refused */
    snprintf(side, sizeof side, "%s.tmp", merged);
    mkdir(side, 0755);
    tu_write_file(path2(side, "zeroserve-merge.json"), "{}", 2);
    tu_write_file(path2(side, "model.safetensors"), "half", 4);
    CHECK(zs_lora_merge_export(base, REF, merged) == 0 && access(side, F_OK) != 0, "a crashed export's leftovers "
          "replaced: %s", zs_errmsg());
    mkdir(side, 0755);
    tu_write_file(path2(side, "notes.txt"), "mine", 4);
    CHECK_ERR(zs_lora_merge_export(base, REF, merged), "merged.tmp", "not empty");
    CHECK(access(path2(side, "notes.txt"), F_OK) == 0, "someone else's %s kept", side);
    unlink(path2(side, "notes.txt"));
    rmdir(side);

    /* a bf16 base: adapted tensors rounded to nearest even into bf16 */
    const char *b16 = make_base(ref, "base-bf16", "--dtype", "bf16");
    char b16dir[4200], m16[4200];
    snprintf(b16dir, sizeof b16dir, "%s", b16 ? b16 : "");
    snprintf(m16, sizeof m16, "%s/merged-bf16", tmp);
    CHECK(b16 && zs_lora_merge_export(b16dir, REF, m16) == 0, "merge into bf16: %s", zs_errmsg());
    na = check_tensors(b16dir, m16, l, &bo, &ba);
    CHECK(na == 14 && ba == 0 && bo == 0, "bf16: %d adapted (%d wrong), %d others differ", na, ba, bo);
    float lg16[4 * 300];
    double d16 = forward_diff(m16, ref, lg16);
    fprintf(stderr, "merged bf16: max |logit - PEFT(f32)| = %.3g\n", d16);
    CHECK(d16 < 0.02, "bf16 merged model near PEFT's f32 logits (%.3g < 0.02)", d16);

    /* a sharded base: the same tensors and logits bit for bit */
    const char *sh = make_sharded(base);
    char shm[4200];
    snprintf(shm, sizeof shm, "%s/merged-sharded", tmp);
    CHECK(sh && zs_lora_merge_export(sh, REF, shm) == 0, "merge a sharded base: %s", zs_errmsg());
    CHECK(access(path2(shm, "model-00001-of-00002.safetensors"), F_OK) == 0 &&
          access(path2(shm, "model-00002-of-00002.safetensors"), F_OK) == 0 && access(path2(shm, "model.safetensors"), F_OK) != 0,
          "both shards written, no single file");
    CHECK(sh && same_file(path2(sh, "model.safetensors.index.json"), path2(shm, "model.safetensors.index.json")), "index copied");
    na = sh ? check_tensors(sh, shm, l, &bo, &ba) : 0;
    CHECK(na == 14 && ba == 0 && bo == 0, "sharded: %d adapted (%d wrong), %d others differ", na, ba, bo);
    {
        zs_st_set *x = NULL, *y = NULL;
        int eq = zs_st_open_dir(merged, &x) == 0 && zs_st_open_dir(shm, &y) == 0 && zs_st_count(x) == zs_st_count(y);
        for (size_t i = 0; eq && i < zs_st_count(x); i++) {
            const zs_st_tensor *p = zs_st_at(x, i), *q = zs_st_find(y, p->name);
            eq = q && q->nbytes == p->nbytes && !memcmp(p->data, q->data, p->nbytes);
        }
        CHECK(eq, "sharded merge: every tensor as the single-file merge's");
        zs_st_close(x);
        zs_st_close(y);
    }
    forward_diff(shm, ref, lg_sh);
    CHECK(!memcmp(lg, lg_sh, sizeof lg), "sharded merge: the same logits bit for bit");

    /* refusals: a user's directory, a GGUF base, a missing adapter, an adapter for another base */
    char user[4200];
    snprintf(user, sizeof user, "%s/user", tmp);
    mkdir(user, 0755);
    tu_write_file(path2(user, "keep.txt"), "mine", 4);
    CHECK_ERR(zs_lora_merge_export(base, REF, user), user, "not empty", "zeroserve-merge.json");
    char *kept = NULL;
    CHECK(file_bytes(path2(user, "keep.txt"), &kept) == 4 && !memcmp(kept, "mine", 4) &&
          access(path2(user, "model.safetensors"), F_OK) != 0, "the user's directory untouched");
    free(kept);
    snprintf(side, sizeof side, "%s.tmp", user);
    CHECK(access(side, F_OK) != 0, "nothing written beside it");
    CHECK_ERR(zs_lora_merge_export(base, REF, base), "is the base itself");

    char gg[4300], out2[4300];
    snprintf(gg, sizeof gg, "%s/model.gguf", tmp);
    static const char ghdr[24] = "GGUF\3\0\0\0";
    tu_write_file(gg, ghdr, sizeof ghdr);
    snprintf(out2, sizeof out2, "%s/out-gguf", tmp);
    int rc = zs_lora_merge_export(gg, REF, out2);
    CHECK(rc == ZS_EUNSUPPORTED, "GGUF base: ZS_EUNSUPPORTED (rc %d)", rc);
    CHECK_ERR(rc, "model.gguf", "GGUF", "Hugging Face");
    CHECK(access(out2, F_OK) != 0, "nothing written for the GGUF base");

    snprintf(out2, sizeof out2, "%s/out-none", tmp);
    CHECK_ERR(zs_lora_merge_export(base, path2(tmp, "no-adapter"), out2), "no-adapter/adapter_config.json");
    CHECK(access(out2, F_OK) != 0, "nothing written for a missing adapter");

    const char *wide = make_base(ref, "base-128", "--dim", "128");
    snprintf(out2, sizeof out2, "%s/out-wide", tmp);
    CHECK(wide != NULL, "a base of dim 128");
    if (wide) {
        char wd[4200];
        snprintf(wd, sizeof wd, "%s", wide);
        CHECK_ERR(zs_lora_merge_export(wd, REF, out2), "lora_A.weight", "expected");
        CHECK(access(out2, F_OK) != 0, "nothing written for a mismatched adapter");
    }

    /* the command line */
    char *ok_argv[] = {"--merge", "--model", base, "--lora", REF, "--out", merged};
    CHECK(zs_cmd_export_merge(7, ok_argv) == 0, "zeroserve export --merge: %s", zs_errmsg());
    CHECK(access(path2(merged, "model.safetensors"), F_OK) == 0, "the command's output in place");
    char *no_lora[] = {"--merge", "--model", base, "--out", merged};
    CHECK_ERR(zs_cmd_export_merge(5, no_lora), "--lora", "required");
    char *unknown[] = {"--merge", "--model", base, "--lora", REF, "--out", merged, "--bogus", "1"};
    CHECK_ERR(zs_cmd_export_merge(9, unknown), "bogus");

    zs_lora_free(l);
    zs_model_free(bm);
    json_decref(ref);
    tu_rmdir(tmp);
    return tu_finish("test-lora-merge");
}

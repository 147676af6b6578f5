/* lora-train.c — LoRA training steps over a frozen, streamed base (lora-train.h): each rank runs its
 * micro-batches forward and backward through its gather coordinator (training pass order) with the
 * trainer in frozen-base mode (backward.h, zs_trainer_set_lora), the per-micro-batch adapter
 * gradients are all-gathered and summed in global micro-batch order (so the sum is the same bits
 * whatever the rank count and process layout), AdamW updates the replicated adapter once per
 * process; adapter-only checkpoints (PEFT files + AdamW moments + state.json, with checksums),
 * written into a temporary directory and renamed. */
#include "lora-train.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backward.h"
#include "cluster.h"
#include "common.h"
#include "fileio.h"
#include "gather.h"
#include "safetensors.h"
#include "store.h"
#include "lora-train-impl.h"

static void set_err(lrank *R, int rc) {
    if (R->rc == 0) {
        R->rc = rc;
        snprintf(R->err, sizeof R->err, "%s", zs_errmsg());
    }
}

/* ---- evaluation: one micro-batch's forward on one rank (steps: lora-slice.c) ---- */

static void eval_job(void *ud, int rank) {
    zs_lora_training *t = ud;
    lrank *R = &t->r[rank];
    zs_model *m = t->m;
    zs_gather *g = zs_world_gather(t->w, rank);
    zs_weight_source src = R->src;
    int L = zs_model_config_get(m)->n_layers, eb = zs_bucket_embed(), hb = zs_bucket_head(m);
    int i = t->micro * t->n + t->first + rank; /* the global micro-batch index */
    const int32_t *tok = t->tokens[i], *tg = t->targets[i];
    const void *d = NULL, *d2 = NULL;
    int rc = 0;
    float loss = 0;
    R->rc = 0;
    R->loss = 0;
    rc = zs_trainer_set_lora(R->tr, t->a, NULL, t->seed, 0);
    if (rc < 0) set_err(R, rc);

    zs_gather_pass_begin(g, ZS_PASS_INFER);
    /* after a failure the pass is still driven through the source without computing (every bucket,
     * and a MoE layer's agreement: zs_trainer_experts_sync), so that the other ranks' gathers
     * complete; an inference model looks its embeddings up in host tables: no leading bucket 0 */
#define FAIL(x)                        \
    do {                               \
        int rc_ = (x);                 \
        if (rc_ < 0 && rc == 0) {      \
            rc = rc_;                  \
            set_err(R, rc_);           \
        }                              \
    } while (0)
    if (!t->lookup) {
        int arc = src.acquire(src.ctx, eb, &d);
        FAIL(arc);
        if (rc == 0) FAIL(zs_train_embed_fwd(R->tr, d, zs_model_bucket_resident(m, eb), tok));
        src.release(src.ctx, eb);
    } else if (rc == 0) {
        FAIL(zs_train_embed_fwd(R->tr, NULL, zs_model_bucket_resident(m, eb), tok));
    }
    for (int l = 0; l < L; l++) {
        int b = zs_bucket_layer(l);
        FAIL(src.acquire(src.ctx, b, &d));
        if (rc == 0) FAIL(zs_train_layer_fwd(R->tr, l, d, zs_model_bucket_resident(m, b)));
        if (rc < 0) FAIL(zs_trainer_experts_sync(R->tr, l, 0));
        src.release(src.ctx, b);
    }
    {
        int hrc = src.acquire(src.ctx, hb, &d);
        int rc2 = t->tied ? src.acquire(src.ctx, eb, &d2) : 0;
        FAIL(hrc);
        FAIL(rc2);
        if (rc == 0)
            FAIL(zs_train_head(R->tr, d, zs_model_bucket_resident(m, hb), t->tied ? d2 : NULL,
                               t->tied ? zs_model_bucket_resident(m, eb) : NULL, tg, &loss, NULL, NULL, NULL, NULL));
        src.release(src.ctx, hb);
        if (t->tied) src.release(src.ctx, eb);
    }
#undef FAIL
    zs_gather_pass_end(g); /* releases what is still held */
    if (rc < 0) {
        set_err(R, rc);
        loss = 0;
    }
    R->loss = (double)loss * (double)zs_train_count_targets(tg, (size_t)t->o.micro_batch * (size_t)t->o.seq_len);
    zs_lora_share_status(t, R, rank);
}

/* ---- set-up ---- */

static float *falloc(size_t n) {
    float *p = zs_aligned_alloc(64, (n + 16) * sizeof(float));
    if (p) memset(p, 0, (n + 16) * sizeof(float));
    return p;
}

int zs_lora_training_begin(zs_world *w, zs_lora *adapter, const zs_train_opts *o, uint64_t seed,
                           zs_lora_training **out) {
    if (!w || !adapter || !o || !out) return zs_err(ZS_EINVAL, "LoRA training: world, adapter and options are required");
    if (zs_world_is_cuda(w)) return zs_err(ZS_EUNSUPPORTED, "LoRA training runs on the CPU device for now (use --device cpu)");
    if (zs_world_led(w))
        return zs_err(ZS_EUNSUPPORTED, "LoRA training: a multi-process world led by process 0 cannot train; every "
                                       "process must run the training (zeroserve train under mpirun)");
    if (o->micro_batch < 1 || o->seq_len < 2 || o->grad_accum < 1)
        return zs_err(ZS_EINVAL, "LoRA training: batch size, sequence length (>= 2) and gradient accumulation must be positive");
    zs_model *m = zs_world_model(w);
    const zs_model_config *c = zs_model_config_get(m);
    if (o->seq_len > c->max_seq)
        return zs_err(ZS_ERANGE, "LoRA training: sequence length %d exceeds the model's context %d", o->seq_len, c->max_seq);
    int repl = zs_world_replicated(w);
    if (o->stage && (o->stage < 1 || o->stage > 3 || (o->stage < 3) != repl))
        return zs_err(ZS_EINVAL, "LoRA training: ZeRO stage %d does not fit this engine (parameters %s)", o->stage,
                      repl ? "replicated: stage 1 or 2" : "sharded: stage 3");
    if (zs_lora_n_layers(adapter) != c->n_layers)
        return zs_err(ZS_EINVAL, "LoRA training: the adapter has %d layers, the model %d", zs_lora_n_layers(adapter),
                      c->n_layers);
    if (zs_model_embed_lookup(m) && !zs_model_embed_table(m, ZS_R_TOK_EMB))
        return zs_err(ZS_EINVAL, "LoRA training: the model's embedding lookup tables are not loaded");
    zs_lora_training *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->w = w;
    t->m = m;
    t->a = adapter;
    t->o = *o;
    t->seed = seed;
    t->n = zs_world_size(w);
    t->nl = zs_world_ranks(w);
    t->first = zs_world_first_rank(w);
    t->tied = c->tied_embeddings;
    t->lookup = zs_model_embed_lookup(m);
    zs_lora_data(adapter, &t->np);
    t->chunk = ZS_MAX((size_t)1024, GCHUNK / (size_t)t->n);
    t->chunk = ZS_MIN(t->chunk, ZS_MAX(t->np, (size_t)1));
    t->r = calloc((size_t)t->nl, sizeof *t->r);
    int rc = t->r ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) rc = zs_lora_new_like(adapter, &t->gsum);
    if (rc == 0) {
        t->gclip = falloc(t->np);
        t->mom = falloc(t->np);
        t->var = falloc(t->np);
        if (!t->gclip || !t->mom || !t->var) rc = zs_err(ZS_ENOMEM, "LoRA training: out of memory for the optimizer state");
    }
    if (rc == 0) rc = zs_lora_slice_init(t);
    for (int r = 0; r < t->nl && rc == 0; r++) {
        lrank *R = &t->r[r];
        R->t = t;
        if ((rc = zs_trainer_new(m, o->micro_batch, o->seq_len, &R->tr)) < 0) break;
        if ((rc = zs_lora_new_like(adapter, &R->grad)) < 0) break;
        if ((rc = zs_trainer_set_lora(R->tr, adapter, R->grad, seed, 0)) < 0) break;
        /* a MoE layer's experts come from the same source; the base is frozen: no expert gradient */
        R->src = zs_gather_source(zs_world_gather(w, r));
        if ((rc = zs_trainer_set_experts(R->tr, &R->src, NULL, NULL)) < 0) break;
        R->gbuf = falloc(t->chunk * (size_t)t->n);
        R->stat = calloc((size_t)t->n, sizeof(lt_stat));
        if (!R->gbuf || !R->stat) rc = zs_err(ZS_ENOMEM, "LoRA training: out of memory");
    }
    if (rc < 0) {
        zs_lora_training_end(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* An evaluation's micro-batch on every rank: every rank takes part in every collective; a
 * failure anywhere fails the call on every process. */
int zs_lora_training_eval(zs_lora_training *t, const int32_t *const *tokens, const int32_t *const *targets,
                          float *loss) {
    if (t->in_step) return zs_err(ZS_EINVAL, "LoRA training: an evaluation while step %ld runs", t->step);
    size_t bt = (size_t)t->o.micro_batch * (size_t)t->o.seq_len;
    t->tokens = tokens;
    t->targets = targets;
    t->total_count = 0;
    for (int i = 0; i < t->n; i++) t->total_count += zs_train_count_targets(targets[i], bt);
    t->loss_sum = 0;
    t->fail_rc = 0;
    t->fail_err[0] = 0;
    t->micro = 0;
    zs_world_run(t->w, eval_job, t); /* an inference pass: what speculation guesses */
    if (t->fail_rc < 0) return zs_err(t->fail_rc, "%s", t->fail_err);
    *loss = t->total_count > 0 ? (float)(t->loss_sum / (double)t->total_count) : 0.0f;
    return 0;
}

const zs_lora *zs_lora_training_grad(const zs_lora_training *t) { return t->have_grad ? t->gsum : NULL; }

void zs_lora_training_memory(const zs_lora_training *t, zs_lora_train_memory *out) {
    memset(out, 0, sizeof *out);
    size_t pb = t->np * sizeof(float);
    out->adapter = pb;
    out->grads = pb * (size_t)(t->nl + 2) + t->chunk * (size_t)t->n * sizeof(float) * (size_t)t->nl;
    out->optimizer = 2 * pb;
    for (int r = 0; r < t->nl; r++) out->activations += t->r[r].tr ? zs_trainer_bytes(t->r[r].tr) : 0;
}

void zs_lora_training_end(zs_lora_training *t) {
    if (!t) return;
    for (int r = 0; t->r && r < t->nl; r++) {
        zs_trainer_free(t->r[r].tr);
        zs_lora_free(t->r[r].grad);
        free(t->r[r].gbuf);
        free(t->r[r].stat);
    }
    free(t->r);
    free(t->bucket_bytes);
    zs_lora_free(t->gsum);
    free(t->gclip);
    free(t->mom);
    free(t->var);
    free(t);
}

/* ---- checkpoints ---- */

#define LT_FORMAT "zeroserve-lora-checkpoint"

static int rm_rf(const char *dir) {
    if (strchr(dir, '\'')) return zs_err(ZS_EINVAL, "%s: a quote in the path", dir);
    char *cmd = zs_str_printf("rm -rf '%s'", dir);
    int rc = cmd && system(cmd) == 0 ? 0 : zs_err(ZS_EIO, "cannot remove %s", dir);
    free(cmd);
    return rc;
}

/* XXH64 of a whole file as 16 hex digits. */
static int file_sum(const char *path, char hex[17]) {
    FILE *f = fopen(path, "rb");
    if (!f) return zs_err(zs_errno_code(errno), "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    int rc = 0;
    if (!buf) rc = zs_err(ZS_ENOMEM, "out of memory");
    else if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) rc = zs_err(ZS_EIO, "%s: cannot read", path);
    fclose(f);
    if (rc == 0) snprintf(hex, 17, "%016llx", (unsigned long long)zs_checksum64(buf, (size_t)(n > 0 ? n : 0)));
    free(buf);
    return rc;
}

static int write_optimizer(const zs_lora_training *t, const char *path) {
    zs_st_decl d[2];
    memset(d, 0, sizeof d);
    d[0].name = "m";
    d[1].name = "v";
    for (int i = 0; i < 2; i++) {
        d[i].dtype = ZS_F32;
        d[i].ndim = 1;
        d[i].shape[0] = (int64_t)t->np;
    }
    zs_st_writer *w;
    ZS_CHECK(zs_st_writer_open(path, d, 2, "{\"format\":\"" LT_FORMAT "\"}", &w));
    int rc = zs_st_writer_write(w, t->mom, t->np * sizeof(float));
    if (rc == 0) rc = zs_st_writer_write(w, t->var, t->np * sizeof(float));
    if (rc == 0) return zs_st_writer_close(w);
    zs_st_writer_abort(w);
    return rc;
}

static int step_of(const char *name, long *step) {
    char *end;
    if (strncmp(name, "step-", 5) != 0) return 0;
    long s = strtol(name + 5, &end, 10);
    if (end == name + 5 || *end) return 0;
    *step = s;
    return 1;
}

/* Deletes complete step directories beyond the newest keep, and leftover *.tmp ones. */
static void prune(const char *dir, int keep) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    long steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd))) {
        long s;
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp") && !strncmp(e->d_name, "step-", 5)) {
            char *p = zs_str_printf("%s/%s", dir, e->d_name);
            if (p) (void)rm_rf(p);
            free(p);
        } else if (step_of(e->d_name, &s) && n < 4096) {
            steps[n++] = s;
        }
    }
    closedir(dd);
    if (keep <= 0 || n <= keep) return;
    for (int i = 1; i < n; i++) /* newest first */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            long x = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = x;
        }
    for (int i = keep; i < n; i++) {
        char *p = zs_str_printf("%s/step-%06ld", dir, steps[i]);
        if (p) (void)rm_rf(p);
        free(p);
    }
}

static int save_local(zs_lora_training *t, const char *dir, long step, const char *meta_json, int keep,
                      const char *base_name) {
    json_t *meta = NULL;
    if (meta_json) {
        json_error_t je;
        meta = json_loads(meta_json, 0, &je);
        if (!json_is_object(meta)) {
            json_decref(meta);
            return zs_err(ZS_EINVAL, "LoRA checkpoint: the meta JSON is not an object (%s)", je.text);
        }
    }
    int rc = zs_mkdir_p(dir);
    char *fin = zs_str_printf("%s/step-%06ld", dir, step), *tmp = zs_str_printf("%s/step-%06ld.tmp", dir, step);
    char *opt = tmp ? zs_str_printf("%s/optimizer.safetensors", tmp) : NULL;
    char *ad = tmp ? zs_str_printf("%s/adapter_model.safetensors", tmp) : NULL;
    char *st = tmp ? zs_str_printf("%s/state.json", tmp) : NULL;
    char *old = fin ? zs_str_printf("%s.old", fin) : NULL;
    if (rc == 0 && (!fin || !tmp || !opt || !ad || !st || !old)) rc = zs_err(ZS_ENOMEM, "out of memory");
    struct stat sb;
    if (rc == 0 && stat(tmp, &sb) == 0) rc = rm_rf(tmp);
    if (rc == 0) rc = zs_lora_save(t->a, tmp, base_name ? base_name : zs_model_dir(t->m));
    if (rc == 0) rc = write_optimizer(t, opt);
    char sa[17], so[17];
    if (rc == 0) rc = file_sum(ad, sa);
    if (rc == 0) rc = file_sum(opt, so);
    char *text = NULL;
    if (rc == 0) {
        json_t *j = json_pack("{s:s, s:i, s:I, s:I, s:{s:s, s:s}, s:o}", "format", LT_FORMAT, "version", 1, "step",
                              (json_int_t)step, "params", (json_int_t)t->np, "checksums", "adapter_model.safetensors",
                              sa, "optimizer.safetensors", so, "meta", meta ? json_incref(meta) : json_object());
        text = j ? json_dumps(j, JSON_INDENT(1)) : NULL;
        json_decref(j);
        if (!text) rc = zs_err(ZS_ENOMEM, "out of memory");
    }
    if (rc == 0) rc = zs_write_file_atomic(st, text, strlen(text));
    free(text);
    if (rc == 0) rc = zs_fsync_dir(tmp);
    /* a step directory of the same number is replaced: moved aside, then deleted */
    if (rc == 0 && stat(fin, &sb) == 0) {
        if (stat(old, &sb) == 0) rc = rm_rf(old);
        if (rc == 0 && rename(fin, old) != 0) rc = zs_err(zs_errno_code(errno), "cannot move %s aside: %s", fin, strerror(errno));
    }
    if (rc == 0 && rename(tmp, fin) != 0) rc = zs_err(zs_errno_code(errno), "cannot rename %s: %s", tmp, strerror(errno));
    if (rc == 0) rc = zs_fsync_dir(dir);
    if (rc == 0) {
        char *latest = zs_str_printf("%s/latest", dir);
        char line[64];
        int k = snprintf(line, sizeof line, "step-%06ld\n", step);
        rc = latest ? zs_write_file_atomic(latest, line, (size_t)k) : zs_err(ZS_ENOMEM, "out of memory");
        free(latest);
    }
    if (rc == 0) {
        if (stat(old, &sb) == 0) (void)rm_rf(old);
        prune(dir, keep);
    } else if (tmp && stat(tmp, &sb) == 0) {
        int keep_rc = rc;
        (void)rm_rf(tmp);
        rc = keep_rc;
    }
    json_decref(meta);
    free(fin);
    free(tmp);
    free(opt);
    free(ad);
    free(st);
    free(old);
    return rc;
}

int zs_lora_training_save(zs_lora_training *t, const char *dir, long step, const char *meta_json, int keep,
                          const char *base_name) {
    if (step < 0) return zs_err(ZS_EINVAL, "LoRA checkpoint: step %ld < 0", step);
    if (t->n == t->nl) return save_local(t, dir, step, meta_json, keep, base_name);
    /* several processes hold the same adapter: process 0 writes (the directory is shared), and all
     * agree on the outcome */
    int rc = zs_cluster_rank() == 0 ? save_local(t, dir, step, meta_json, keep, base_name) : 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? zs_errmsg() : "");
    int all = rc;
    if (zs_cluster_min_int(rc, &all) < 0) return ZS_ECANCELLED;
    if (rc < 0) return zs_err(rc, "%s", msg);
    if (all < 0) return zs_err(all, "LoRA checkpoint: process 0 could not save %s; see its log", dir);
    return 0;
}

/* The step directory dir names: itself when it holds state.json, else the one in dir/latest. */
static char *resolve(const char *dir) {
    struct stat sb;
    char *p = zs_str_printf("%s/state.json", dir);
    int direct = p && stat(p, &sb) == 0;
    free(p);
    if (direct) return strdup(dir);
    char *latest = zs_str_printf("%s/latest", dir);
    FILE *f = latest ? fopen(latest, "r") : NULL;
    free(latest);
    if (!f) return NULL;
    char line[256] = {0};
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok) return NULL;
    line[strcspn(line, "\r\n")] = 0;
    if (!line[0] || strchr(line, '/')) return NULL;
    return zs_str_printf("%s/%s", dir, line);
}

int zs_lora_training_load(zs_lora_training *t, const char *dir, long *step, char **meta_json) {
    char *sd = resolve(dir);
    if (!sd) return zs_err(ZS_ENOTFOUND, "%s: no LoRA checkpoint (no state.json and no latest)", dir);
    char *stp = zs_str_printf("%s/state.json", sd), *ad = zs_str_printf("%s/adapter_model.safetensors", sd),
         *opt = zs_str_printf("%s/optimizer.safetensors", sd);
    int rc = stp && ad && opt ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    json_t *j = NULL;
    json_error_t je;
    struct stat sb;
    if (rc == 0 && stat(stp, &sb) != 0) rc = zs_err(ZS_ENOTFOUND, "%s: missing (the checkpoint named by %s/latest)", stp, dir);
    if (rc == 0 && !(j = json_load_file(stp, 0, &je))) rc = zs_err(ZS_EFORMAT, "%s: not JSON (%s, line %d)", stp, je.text, je.line);
    json_t *fmt = json_object_get(j, "format"), *sums = json_object_get(j, "checksums");
    if (rc == 0 && (!json_is_string(fmt) || strcmp(json_string_value(fmt), LT_FORMAT) ||
                    json_integer_value(json_object_get(j, "version")) != 1 || !json_is_integer(json_object_get(j, "step")) ||
                    !json_is_object(sums)))
        rc = zs_err(ZS_EFORMAT, "%s: not a LoRA checkpoint state (format \"" LT_FORMAT "\" version 1, step, checksums)", stp);
    if (rc == 0 && (size_t)json_integer_value(json_object_get(j, "params")) != t->np)
        rc = zs_err(ZS_EINVAL, "%s: the checkpoint's adapter has %lld parameters, this training's %zu", stp,
                    (long long)json_integer_value(json_object_get(j, "params")), t->np);
    /* checksums first: a truncated or garbled file is named before anything is read from it */
    const char *names[2] = {"adapter_model.safetensors", "optimizer.safetensors"};
    const char *paths[2] = {ad, opt};
    for (int i = 0; i < 2 && rc == 0; i++) {
        char hex[17];
        const char *want = json_string_value(json_object_get(sums, names[i]));
        if ((rc = file_sum(paths[i], hex)) < 0) break;
        if (!want || strcmp(want, hex))
            rc = zs_err(ZS_ECHECKSUM, "%s: checksum mismatch with %s (one of them is truncated or damaged)", paths[i], stp);
    }
    zs_lora *l = NULL;
    if (rc == 0) rc = zs_lora_load(sd, t->m, &l);
    if (rc == 0) {
        const zs_lora_params *p = zs_lora_get_params(l), *q = zs_lora_get_params(t->a);
        if (p->r != q->r || p->targets != q->targets || p->alpha != q->alpha || p->rslora != q->rslora)
            rc = zs_err(ZS_EINVAL, "%s: the checkpoint's adapter (r %d, alpha %g, targets 0x%x, rslora %d) differs from "
                        "this training's (r %d, alpha %g, targets 0x%x, rslora %d)", sd, p->r, (double)p->alpha,
                        p->targets, p->rslora, q->r, (double)q->alpha, q->targets, q->rslora);
    }
    zs_st_set *s = NULL;
    const zs_st_tensor *tm = NULL, *tv = NULL;
    int64_t shape[1] = {(int64_t)t->np};
    if (rc == 0) rc = zs_st_open_file(opt, &s);
    if (rc == 0) rc = zs_st_get(s, "m", 1, shape, &tm);
    if (rc == 0) rc = zs_st_get(s, "v", 1, shape, &tv);
    if (rc == 0 && (tm->dtype != ZS_F32 || tv->dtype != ZS_F32)) rc = zs_err(ZS_EFORMAT, "%s: moments must be F32", opt);
    if (rc == 0) {
        rc = zs_lora_copy(t->a, l);
        memcpy(t->mom, tm->data, t->np * sizeof(float));
        memcpy(t->var, tv->data, t->np * sizeof(float));
    }
    if (rc == 0) {
        *step = (long)json_integer_value(json_object_get(j, "step"));
        if (meta_json) {
            json_t *meta = json_object_get(j, "meta");
            *meta_json = json_dumps(meta ? meta : json_object(), JSON_COMPACT);
            if (!*meta_json) rc = zs_err(ZS_ENOMEM, "out of memory");
        }
    }
    zs_st_close(s);
    zs_lora_free(l);
    json_decref(j);
    free(sd);
    free(stp);
    free(ad);
    free(opt);
    return rc;
}

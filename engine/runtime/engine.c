/* engine.c — opens model + tokenizer + KV cache + forward executor, and generates one sequence:
 * chunked prefill, then decode with sampling, EOS, stop strings and a streaming text callback.
 * Also the glue from a GGUF file's tokenizer.* keys to the tokenizer (engine/text does not read
 * GGUF: it takes plain arrays, zs_tokenizer_spec). */
#include "engine.h"

#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"
#include "cluster.h"
#include "common.h"
#include "device.h"
#include "gguf.h"
#include "kvprefix.h"
#include "kvstream.h"
#include "plan-auto.h"
#include "kvswap.h"
#include "stop.h"
#include "store.h"

int zs_model_path_is_file(const char *p) {
    struct stat sb;
    return p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int gguf_opt_id(const zs_gguf *g, const char *key, int32_t *out) {
    *out = -1;
    if (zs_gguf_find_key(g, key) < 0) return 0;
    uint32_t v;
    ZS_CHECK(zs_gguf_get_u32(g, key, &v));
    if (v > INT32_MAX) return zs_err(ZS_ERANGE, "%s: '%s' is out of range", zs_gguf_path(g), key);
    *out = (int32_t)v;
    return 0;
}

static int gguf_opt_bool(const zs_gguf *g, const char *key, int def, int *out) {
    *out = def;
    if (zs_gguf_find_key(g, key) < 0) return 0;
    bool b;
    ZS_CHECK(zs_gguf_get_bool(g, key, &b));
    *out = b;
    return 0;
}

/* Reads the string array key (n entries) into ptrs/lens (borrowed from g). */
static int gguf_strs(const zs_gguf *g, const char *key, size_t n, const char ***ptrs, size_t **lens) {
    *ptrs = malloc((n ? n : 1) * sizeof **ptrs);
    *lens = malloc((n ? n : 1) * sizeof **lens);
    if (!*ptrs || !*lens) return zs_err(ZS_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) ZS_CHECK(zs_gguf_arr_str(g, key, i, &(*ptrs)[i], &(*lens)[i]));
    return 0;
}

static int gguf_tokenizer(const zs_gguf *g, zs_tokenizer **out) {
    const char *path = zs_gguf_path(g), *model;
    if (zs_gguf_find_key(g, "tokenizer.ggml.model") < 0)
        return zs_err(ZS_ENOTFOUND, "%s: no tokenizer in the file (key 'tokenizer.ggml.model' is missing)", path);
    ZS_CHECK(zs_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL));
    zs_tokenizer_spec s;
    memset(&s, 0, sizeof s);
    s.origin = path;
    if (!strcmp(model, "llama")) s.kind = ZS_TOK_SPEC_SPM;
    else if (!strcmp(model, "gpt2")) s.kind = ZS_TOK_SPEC_BPE;
    else
        return zs_err(ZS_EUNSUPPORTED, "%s: tokenizer.ggml.model '%.60s' is not supported (supported: llama, gpt2)",
                      path, model);
    size_t n = 0, nm = 0;
    if (zs_gguf_find_key(g, "tokenizer.ggml.tokens") < 0)
        return zs_err(ZS_ENOTFOUND, "%s: key 'tokenizer.ggml.tokens' is missing", path);
    ZS_CHECK(zs_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n));
    if (n < 1 || n > INT32_MAX)
        return zs_err(ZS_EFORMAT, "%s: 'tokenizer.ggml.tokens' has %zu entries", path, n);
    s.n_vocab = (int32_t)n;
    const char **tok = NULL, **mer = NULL;
    size_t *tlen = NULL, *mlen = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    int rc = gguf_strs(g, "tokenizer.ggml.tokens", n, &tok, &tlen);
    if (rc == 0 && zs_gguf_find_key(g, "tokenizer.ggml.scores") >= 0) {
        if (!(scores = malloc(n * sizeof *scores))) rc = zs_err(ZS_ENOMEM, "out of memory");
        else rc = zs_gguf_arr_copy_f32(g, "tokenizer.ggml.scores", scores, n);
    } else if (rc == 0 && s.kind == ZS_TOK_SPEC_SPM) {
        rc = zs_err(ZS_ENOTFOUND, "%s: key 'tokenizer.ggml.scores' is missing (a llama tokenizer needs it)", path);
    }
    if (rc == 0 && zs_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        if (!(types = malloc(n * sizeof *types))) rc = zs_err(ZS_ENOMEM, "out of memory");
        else rc = zs_gguf_arr_copy_i32(g, "tokenizer.ggml.token_type", types, n);
    }
    if (rc == 0 && s.kind == ZS_TOK_SPEC_BPE) {
        if (zs_gguf_find_key(g, "tokenizer.ggml.merges") >= 0) {
            rc = zs_gguf_get_arr(g, "tokenizer.ggml.merges", NULL, &nm);
            if (rc == 0) rc = gguf_strs(g, "tokenizer.ggml.merges", nm, &mer, &mlen);
        }
        if (rc == 0 && zs_gguf_find_key(g, "tokenizer.ggml.pre") >= 0)
            rc = zs_gguf_get_str(g, "tokenizer.ggml.pre", &s.pre, NULL);
    }
    if (rc == 0) rc = gguf_opt_id(g, "tokenizer.ggml.bos_token_id", &s.bos);
    if (rc == 0) rc = gguf_opt_id(g, "tokenizer.ggml.eos_token_id", &s.eos);
    if (rc == 0) rc = gguf_opt_id(g, "tokenizer.ggml.unknown_token_id", &s.unk);
    if (rc == 0) rc = gguf_opt_bool(g, "tokenizer.ggml.add_bos_token", -1, &s.add_bos);
    if (rc == 0) rc = gguf_opt_bool(g, "tokenizer.ggml.add_eos_token", -1, &s.add_eos);
    if (rc == 0) rc = gguf_opt_bool(g, "tokenizer.ggml.add_space_prefix", 1, &s.add_space_prefix);
    if (rc == 0) {
        s.tokens = tok, s.token_len = tlen, s.scores = scores, s.types = types;
        s.merges = mer, s.merge_len = mlen, s.n_merges = nm;
        rc = zs_tokenizer_from_spec(&s, out);
    }
    free(tok);
    free(tlen);
    free(mer);
    free(mlen);
    free(scores);
    free(types);
    return rc;
}

int zs_model_tokenizer_load(const char *model_path, zs_tokenizer **out) {
    if (!zs_model_path_is_file(model_path)) return zs_tokenizer_load(model_path, out);
    zs_gguf *g;
    ZS_CHECK(zs_gguf_open(model_path, &g));
    int rc = gguf_tokenizer(g, out);
    zs_gguf_close(g);
    return rc;
}

int zs_model_chat_template_detect(const char *model_path) {
    if (!zs_model_path_is_file(model_path)) return zs_chat_template_detect(model_path);
    zs_gguf *g;
    if (zs_gguf_open(model_path, &g) < 0) return ZS_CHAT_PLAIN;
    const char *t = NULL;
    int kind = ZS_CHAT_PLAIN;
    if (zs_gguf_find_key(g, "tokenizer.chat_template") >= 0 &&
        zs_gguf_get_str(g, "tokenizer.chat_template", &t, NULL) == 0)
        kind = zs_chat_template_classify(t);
    zs_gguf_close(g);
    return kind;
}

struct zs_engine {
    zs_engine_opts opts;
    zs_model *model;
    zs_tokenizer *tok;
    zs_world *world;
    zs_kvcache *kv;
    zs_kvtier **kvt; /* [ranks of this process] the KV tier below memory (kv_offload), or NULL */
    zs_kvtier **kvpt; /* [ranks] the prefix cache's tier (a file kept across restarts on NVMe) */
    zs_kvprefix **kvp; /* [ranks] the prefix cache's blocks below memory */
    zs_kvstream **kvs; /* [ranks] layer-streamed sequences (kv_offload), or NULL */
    char *plan_json;   /* --offload auto's plan (or the flags' placement); replaced under plan_mu */
    zs_plan_auto *plan; /* --offload auto's plan kept for re-planning, or NULL */
    pthread_mutex_t plan_mu;
    int context;
    int device;
};

void zs_engine_opts_default(zs_engine_opts *o) {
    memset(o, 0, sizeof *o);
    zs_model_opts_default(&o->model);
    o->max_seqs = 8;
    o->max_batch_tokens = 256;
    o->ranks = 1;
    o->gather.tier = ZS_OFFLOAD_NONE;
}

zs_model *zs_engine_model(zs_engine *e) { return e->model; }
zs_tokenizer *zs_engine_tokenizer(zs_engine *e) { return e->tok; }
zs_kvcache *zs_engine_kv(zs_engine *e) { return e->kv; }
zs_kvtier *zs_engine_kv_tier(zs_engine *e, int rank) { return e->kvt ? e->kvt[rank] : NULL; }
zs_kvprefix *zs_engine_kv_prefix(zs_engine *e, int rank) { return e->kvp ? e->kvp[rank] : NULL; }
zs_kvstream *zs_engine_kv_stream(zs_engine *e, int rank) { return e->kvs ? e->kvs[rank] : NULL; }
int zs_engine_kv_stream_on(const zs_engine *e) { return e->opts.kv_stream; }
char *zs_engine_plan_json(zs_engine *e) {
    pthread_mutex_lock(&e->plan_mu);
    char *j = e->plan_json ? strdup(e->plan_json) : NULL;
    pthread_mutex_unlock(&e->plan_mu);
    return j;
}

void zs_engine_plan_observe(zs_engine *e, double rows, double step_s, double stall_s, double nvme_bytes) {
    char *j = NULL;
    if (!e->plan || zs_plan_auto_observe(e->plan, rows, step_s, stall_s, nvme_bytes, &j) <= 0 || !j) return;
    pthread_mutex_lock(&e->plan_mu);
    char *old = e->plan_json;
    e->plan_json = j;
    pthread_mutex_unlock(&e->plan_mu);
    free(old);
}

/* The key of the prefix tier's file: everything that decides the K/V values of a prefix. */
static uint64_t prefix_key(const zs_engine *e) {
    char k[512];
    const zs_model_config *c = zs_model_config_get(e->model);
    snprintf(k, sizeof k, "zeroserve-kv-prefix-1|%s|w%d|m%d|kv%d|dev%d|l%d|h%d|d%d", zs_model_fingerprint(e->model),
             (int)e->opts.model.weight_dtype, (int)e->opts.model.quant_mix, (int)e->opts.kv_dtype, e->device,
             c->n_layers, c->n_kv_heads, c->head_dim);
    uint64_t h = zs_checksum64(k, strlen(k));
    return h ? h : 1;
}

/* Each rank's tiers below memory: one for swapped sequences, one for prefix blocks. */
static int open_kv_tiers(zs_engine *e) {
    const zs_engine_opts *o = &e->opts;
    int n = zs_world_ranks(e->world), rc = 0;
    e->kvt = calloc((size_t)n, sizeof *e->kvt);
    e->kvpt = calloc((size_t)n, sizeof *e->kvpt);
    e->kvp = calloc((size_t)n, sizeof *e->kvp);
    e->kvs = calloc((size_t)n, sizeof *e->kvs);
    if (!e->kvt || !e->kvpt || !e->kvp || !e->kvs) return zs_err(ZS_ENOMEM, "out of memory");
    int kind = o->kv_offload == ZS_OFFLOAD_CPU ? ZS_KVTIER_CPU : ZS_KVTIER_NVME;
    for (int r = 0; r < n && rc == 0; r++) {
        zs_kvcache *kv = zs_world_kv(e->world, r);
        size_t rec = zs_kv_swap_rec_bytes(kv);
        rc = zs_kvtier_open(kind, o->kv_nvme_path, rec, &e->kvt[r]);
        int through = kind == ZS_KVTIER_NVME;
        if (rc == 0 && kind == ZS_KVTIER_NVME) {
            /* one file per model and dtypes (a fine-tuned model served next to its base keeps its own) */
            char name[64];
            snprintf(name, sizeof name, "prefix-%016llx-rank%d.kvt", (unsigned long long)prefix_key(e), r);
            rc = zs_kvtier_open_persistent(o->kv_nvme_path, name, rec, prefix_key(e), &e->kvpt[r]);
            if (rc == ZS_EBUSY) { /* another server on the same directory: this one's blocks die with it */
                zs_log_warn("KV prefix tier: %s; this server keeps its prefix blocks in a file of its own, not across restarts",
                            zs_errmsg());
                through = 0;
                rc = zs_kvtier_open(kind, o->kv_nvme_path, rec, &e->kvpt[r]);
            }
        } else if (rc == 0) {
            rc = zs_kvtier_open(kind, NULL, rec, &e->kvpt[r]);
        }
        /* room for prefix blocks: --kv-prefix-bytes, else 4x the cache in host memory, 16 GiB on NVMe */
        size_t room = o->kv_prefix_bytes ? o->kv_prefix_bytes
                      : kind == ZS_KVTIER_CPU ? 4 * rec * (size_t)zs_kv_total_blocks(kv) : (size_t)16 << 30;
        size_t cap = room / rec;
        if (rc == 0 && cap < 1) rc = zs_err(ZS_EINVAL, "--kv-prefix-bytes %zu: less than one KV block (%zu bytes)", room, rec);
        if (rc == 0) rc = zs_kvprefix_open(kv, e->kvpt[r], cap > (1u << 30) ? 1 << 30 : (int)cap, through, &e->kvp[r]);
        if (rc == 0 && kind == ZS_KVTIER_NVME) {
            zs_kvprefix_stats ps;
            zs_kvprefix_stats_get(e->kvp[r], &ps);
            if (ps.restored) zs_log_info("KV prefix tier: %d blocks back from %s", ps.restored, o->kv_nvme_path);
        }
        if (rc == 0) {
            rc = zs_kvstream_open(kv, kind, o->kv_nvme_path, &e->kvs[r]);
            if (rc == ZS_EUNSUPPORTED) { /* one layer, or a window ring: swapping only */
                zs_log_info("KV offload: %s; sequences beyond memory wait swapped out", zs_errmsg());
                rc = 0;
            }
        }
    }
    return rc;
}
zs_world *zs_engine_world(zs_engine *e) { return e->world; }
int zs_engine_device(const zs_engine *e) { return e->device; }
int zs_engine_context(const zs_engine *e) { return e->context; }
int zs_engine_zero_stage(const zs_engine *e) { return e->opts.zero_stage ? e->opts.zero_stage : 3; }
int zs_engine_max_seqs(const zs_engine *e) { return e->opts.max_seqs; }
int zs_engine_max_batch_tokens(const zs_engine *e) { return e->opts.max_batch_tokens; }

int zs_engine_open(const zs_engine_opts *o, zs_engine **out) {
    zs_engine *e = calloc(1, sizeof *e);
    if (!e) return zs_err(ZS_ENOMEM, "out of memory");
    e->opts = *o;
    pthread_mutex_init(&e->plan_mu, NULL);
    int rc;
    if ((rc = zs_device_resolve(o->device, &e->device)) < 0) goto fail;
    if ((rc = zs_model_open(o->model_dir, &o->model, &e->model)) < 0) goto fail;
    if ((rc = zs_model_tokenizer_load(o->model_dir, &e->tok)) < 0) goto fail;
    const zs_model_config *c = zs_model_config_get(e->model);
    if (zs_tokenizer_vocab_size(e->tok) > c->vocab_size) {
        rc = zs_err(ZS_EFORMAT, "%s: tokenizer has %d tokens but the model's vocab_size is %d",
                    o->model_dir, zs_tokenizer_vocab_size(e->tok), c->vocab_size);
        goto fail;
    }
    if (o->kv_dtype != ZS_F32 && o->kv_dtype != ZS_F16 && o->kv_dtype != ZS_BF16) {
        rc = zs_err(ZS_EINVAL, "KV cache element type %s: f32, f16 or bf16", zs_dtype_name(o->kv_dtype));
        goto fail;
    }
    if (o->offload_auto) {
        /* from here on the options are the planned ones */
        int want = o->offload_auto == 1 || !zs_plan_auto_fits(e->model, o);
        if (want && e->device == ZS_DEVICE_CUDA && o->offload_auto == 1) {
            rc = zs_err(ZS_EUNSUPPORTED, "--offload auto: a CUDA device is not measured yet; give --offload none|cpu|nvme");
            goto fail;
        }
        if (want && e->device != ZS_DEVICE_CUDA && (rc = zs_plan_auto_apply(e->model, &e->opts, o->plan_gave, &e->plan_json, &e->plan)) < 0)
            goto fail;
        o = &e->opts;
    }
    e->context = o->max_context > 0 && o->max_context < c->max_seq ? o->max_context : c->max_seq;
    int kvd = c->n_kv_heads * c->head_dim;
    int per_seq = (e->context + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    int n_blocks = per_seq * o->max_seqs;
    size_t cap = o->kv_bytes ? o->kv_bytes : (size_t)1 << 30;
    int fit = zs_kv_blocks_for_bytes(c->n_layers, kvd, o->kv_dtype, cap);
    if (n_blocks > fit) n_blocks = fit;
    /* with a tier and streaming, one context may be longer than memory: its stage blocks must fit */
    int streams = o->kv_offload != ZS_OFFLOAD_NONE && !o->kv_whole && c->n_layers >= 2;
    if (n_blocks < per_seq && o->kv_bytes && !(streams && (long)fit * (c->n_layers / 2) >= per_seq)) {
        rc = zs_err(ZS_EINVAL, "kv cache of %zu bytes holds less than one full context (%d positions)%s",
                    o->kv_bytes, e->context, streams ? ", even streamed layer by layer" : "");
        goto fail;
    }
    if (n_blocks < 1) n_blocks = 1;
    if (o->kv_offload != ZS_OFFLOAD_NONE && o->kv_offload != ZS_OFFLOAD_CPU && o->kv_offload != ZS_OFFLOAD_NVME) {
        rc = zs_err(ZS_EINVAL, "--kv-offload: %d is not none, cpu or nvme", o->kv_offload);
        goto fail;
    }
    if (o->kv_offload != ZS_OFFLOAD_NONE && e->device == ZS_DEVICE_CUDA) {
        rc = zs_err(ZS_EUNSUPPORTED, "--kv-offload %s: KV blocks on a CUDA device do not move to a lower tier yet (only "
                    "with --device cpu)", o->kv_offload == ZS_OFFLOAD_CPU ? "cpu" : "nvme");
        goto fail;
    }
    if (o->kv_offload == ZS_OFFLOAD_NVME && (!o->kv_nvme_path || !*o->kv_nvme_path)) {
        rc = zs_err(ZS_EINVAL, "--kv-offload nvme needs --kv-nvme-path DIR");
        goto fail;
    }
    zs_log_info("KV cache: %d blocks of %d positions per rank (%.1f MiB of %s)", n_blocks, ZS_KV_BLOCK,
                (double)zs_kv_block_bytes(c->n_layers, kvd, o->kv_dtype) * n_blocks / (1 << 20),
                zs_dtype_name(o->kv_dtype));
    zs_world_opts wo = {o->ranks, o->nvme_path, o->gather, o->max_batch_tokens, n_blocks, o->max_seqs, e->context,
                        e->device, o->spmd, o->kv_dtype, o->local};
    int world_ranks = o->ranks * (o->local ? 1 : zs_cluster_size());
    if (o->zero_stage < 0 || o->zero_stage > 3) {
        rc = zs_err(ZS_EINVAL, "zero_optimization.stage must be 1, 2 or 3 (got %d)", o->zero_stage);
        goto fail;
    }
    wo.gather.replicate = o->zero_stage == 1 || o->zero_stage == 2;
    if (!wo.gather.max_live_bytes && o->max_live_params > 0) {
        /* bytes per parameter as stored (a block format: its block's bytes over its elements) */
        zs_dtype wdt = zs_model_layout(e->model, zs_bucket_layer(0))->slot[ZS_R_WQ].dtype;
        size_t dsize = ZS_MAX(zs_dtype_size(wdt) / (size_t)zs_dtype_block(wdt), (size_t)1);
        size_t largest = 0;
        for (int b = 0; b < zs_model_n_buckets(e->model); b++)
            largest = ZS_MAX(largest, zs_partition_shard_bytes(e->model, b, world_ranks) * (size_t)world_ranks);
        wo.gather.max_live_bytes = (size_t)o->max_live_params * dsize;
        if (wo.gather.max_live_bytes < largest) {
            rc = zs_err(ZS_EINVAL, "zero_optimization.stage3_max_live_parameters: %lld parameters (%zu bytes) "
                        "cannot hold the largest bucket of this model (%zu parameters)",
                        (long long)o->max_live_params, wo.gather.max_live_bytes, largest / dsize);
            goto fail;
        }
    }
    if ((rc = zs_world_open(e->model, &wo, &e->world)) < 0) goto fail;
    e->kv = zs_world_kv(e->world, 0);
    if (o->kv_offload != ZS_OFFLOAD_NONE) {
        if ((rc = open_kv_tiers(e)) < 0) goto fail;
        zs_log_info("KV offload: sequences beyond memory %s %s%s%s", e->kvs[0] && o->kv_stream ? "streamed layer by layer from" : "swapped to",
                    o->kv_offload == ZS_OFFLOAD_CPU ? "host memory" : "NVMe",
                    o->kv_offload == ZS_OFFLOAD_NVME ? " under " : "", o->kv_offload == ZS_OFFLOAD_NVME ? o->kv_nvme_path : "");
    }
    if (!e->plan_json) { /* no plan: the placement the flags gave, for GET /v1/plan */
        static const char *const tiers[] = {"none", "cpu", "nvme"};
        char buf[512];
        snprintf(buf, sizeof buf, "{\"mode\":\"flags\",\"applied\":{\"offload\":\"%s\",\"max_live_bytes\":%zu,"
                 "\"kv_bytes\":%zu,\"kv_offload\":\"%s\"}}", tiers[o->gather.tier % 3], o->gather.max_live_bytes,
                 zs_kv_block_bytes(c->n_layers, kvd, o->kv_dtype) * (size_t)n_blocks, tiers[o->kv_offload % 3]);
        if (!(e->plan_json = strdup(buf))) {
            rc = zs_err(ZS_ENOMEM, "out of memory");
            goto fail;
        }
    }
    *out = e;
    return 0;
fail:
    zs_engine_free(e);
    return rc;
}

void zs_engine_free(zs_engine *e) {
    if (!e) return;
    for (int r = 0; e->world && r < zs_world_ranks(e->world); r++) {
        if (e->kvs) zs_kvstream_free(e->kvs[r]);
        if (e->kvp) zs_kvprefix_free(e->kvp[r]);
        if (e->kvpt) zs_kvtier_free(e->kvpt[r]);
        if (e->kvt) zs_kvtier_free(e->kvt[r]);
    }
    free(e->kvp);
    free(e->kvs);
    free(e->kvpt);
    free(e->plan_json);
    zs_plan_auto_free(e->plan);
    pthread_mutex_destroy(&e->plan_mu);
    free(e->kvt);
    zs_world_free(e->world);
    zs_tokenizer_free(e->tok);
    zs_model_free(e->model);
    free(e);
}

int zs_engine_detok_for(zs_engine *e, const int32_t *prompt, int n_prompt, zs_detok **out) {
    zs_detok *d;
    ZS_CHECK(zs_detok_new(e->tok, 1, &d));
    int last = n_prompt - 1;
    while (last >= 0 && zs_tokenizer_is_special(e->tok, prompt[last])) last--;
    if (last >= 0) {
        char junk[512];
        size_t n;
        if (zs_detok_push(d, prompt[last], junk, sizeof junk, &n) < 0) {
            /* an id the tokenizer cannot decode: start without context */
            zs_detok_free(d);
            ZS_CHECK(zs_detok_new(e->tok, 1, &d));
        }
    }
    *out = d;
    return 0;
}

int zs_engine_follow(zs_engine *e) { return zs_world_follow(e->world); }

int zs_engine_forward(zs_engine *e, const zs_batch *b, float *logits) {
    int n = zs_world_ranks(e->world);
    zs_batch bs[n];
    float *lg[n];
    memset(bs, 0, sizeof bs);
    memset(lg, 0, sizeof lg);
    bs[0] = *b;
    lg[0] = logits;
    return zs_world_step(e->world, bs, lg);
}

/* Runs tokens [0,n) of one sequence starting at position pos0, in chunks; logits of the last
 * token go to logits. */
static int run_tokens(zs_engine *e, int seq, const int32_t *ids, int n, int pos0, float *logits) {
    int chunk = e->opts.max_batch_tokens;
    int32_t *pos = malloc((size_t)chunk * sizeof(int32_t) * 3);
    if (!pos) return zs_err(ZS_ENOMEM, "out of memory");
    int32_t *sq = pos + chunk, *li = sq + chunk;
    int rc = 0;
    for (int s = 0; s < n && rc == 0; s += chunk) {
        int m = ZS_MIN(chunk, n - s);
        for (int i = 0; i < m; i++) {
            pos[i] = pos0 + s + i;
            sq[i] = seq;
            li[i] = -1;
        }
        int last = s + m == n;
        if (last) li[m - 1] = 0;
        zs_batch b = {m, ids + s, pos, sq, li, last ? 1 : 0, NULL, NULL, NULL};
        rc = zs_engine_forward(e, &b, logits);
    }
    free(pos);
    return rc;
}

/* Sends text through the stop filter to the callback; sets *stopped. Returns <0 on error,
 * 1 when the callback asked to cancel. */
static int emit(zs_stop *st, zs_gen_cb cb, void *ud, const char *txt, size_t n, int *stopped) {
    char buf[1024];
    size_t done = 0;
    while (done < n && !*stopped) {
        size_t m = ZS_MIN(n - done, sizeof buf / 2 - 1), out;
        int rc = st ? zs_stop_push(st, txt + done, m, buf, sizeof buf, &out, stopped) : 0;
        if (rc < 0) return rc;
        const char *p = st ? buf : txt + done;
        if (!st) out = m;
        if (out && cb && cb(ud, p, out)) return 1;
        done += m;
    }
    return 0;
}

int zs_engine_generate(zs_engine *e, const int32_t *prompt, int n_prompt, const zs_gen_params *p,
                       zs_gen_cb cb, void *ud, zs_gen_result *res) {
    const zs_model_config *c = zs_model_config_get(e->model);
    memset(res, 0, sizeof *res);
    if (n_prompt <= 0) return zs_err(ZS_EINVAL, "prompt is empty");
    if (p->max_tokens < 0) return zs_err(ZS_EINVAL, "max_tokens must be >= 0");
    if ((long)n_prompt + p->max_tokens > e->context)
        return zs_err(ZS_ERANGE, "prompt (%d tokens) plus max_tokens (%d) exceeds the context length %d",
                      n_prompt, p->max_tokens, e->context);
    ZS_CHECK(zs_sampler_params_check(&p->sampling));
    int rc, seq = -1, vocab = c->vocab_size;
    zs_sampler *smp = NULL;
    zs_stop *st = NULL;
    zs_detok *dt = NULL;
    float *logits = malloc((size_t)vocab * sizeof(float));
    int32_t *ids = malloc(((size_t)p->max_tokens + 1) * sizeof(int32_t));
    if (!logits || !ids) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    if ((rc = zs_sampler_new(&p->sampling, vocab, &smp)) < 0) goto done;
    if (p->n_stop > 0 && (rc = zs_stop_new(p->stop, p->n_stop, &st)) < 0) goto done;
    if ((rc = zs_engine_detok_for(e, prompt, n_prompt, &dt)) < 0) goto done;
    if ((rc = zs_kv_seq_open(e->kv, &seq)) < 0) goto done;
    if ((rc = zs_kv_seq_reserve(e->kv, seq, n_prompt)) < 0) goto done;

    double t0 = zs_now();
    if ((rc = run_tokens(e, seq, prompt, n_prompt, 0, logits)) < 0) goto done;
    res->t_prefill = zs_now() - t0;
    res->n_prompt = n_prompt;
    res->finish = ZS_FINISH_LENGTH;
    int stopped = 0, pos = n_prompt;
    char txt[512];
    t0 = zs_now();
    for (int i = 0; i < p->max_tokens; i++) {
        int tok;
        float lp;
        if (p->on_logits) p->on_logits(p->logits_ud, logits, vocab);
        if ((rc = zs_sampler_sample(smp, logits, &tok, &lp)) < 0) goto done;
        if (!p->ignore_eos && zs_tokenizer_is_eos(e->tok, tok)) {
            res->finish = ZS_FINISH_STOP;
            break;
        }
        ids[res->n_generated++] = tok;
        size_t n;
        if ((rc = zs_detok_push(dt, tok, txt, sizeof txt, &n)) < 0) goto done;
        if ((rc = emit(st, cb, ud, txt, n, &stopped)) != 0) {
            if (rc > 0) rc = zs_err(ZS_ECANCELLED, "generation cancelled");
            goto done;
        }
        if (stopped) {
            res->finish = ZS_FINISH_STOP;
            break;
        }
        if (i + 1 == p->max_tokens) break; /* no forward needed for a token we will not sample */
        if ((rc = zs_kv_seq_reserve(e->kv, seq, pos + 1)) < 0) goto done;
        if ((rc = run_tokens(e, seq, &ids[res->n_generated - 1], 1, pos, logits)) < 0) goto done;
        pos++;
    }
    if (!stopped) {
        size_t n;
        if ((rc = zs_detok_flush(dt, txt, sizeof txt, &n)) < 0) goto done;
        if ((rc = emit(st, cb, ud, txt, n, &stopped)) < 0) goto done;
        if (st && !stopped) {
            char buf[1024];
            if ((rc = zs_stop_flush(st, buf, sizeof buf, &n)) < 0) goto done;
            if (n && cb) cb(ud, buf, n);
        }
        if (stopped) res->finish = ZS_FINISH_STOP;
    }
    res->t_decode = zs_now() - t0;
    rc = 0;
done:
    if (seq >= 0) zs_kv_seq_close(e->kv, seq);
    zs_detok_free(dt);
    zs_stop_free(st);
    zs_sampler_free(smp);
    free(logits);
    if (rc == 0) res->ids = ids;
    else free(ids);
    return rc;
}

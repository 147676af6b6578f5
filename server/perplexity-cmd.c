/* perplexity-cmd.c — `zeroserve perplexity`: the mean negative log-likelihood and perplexity of
 * a model on a text file, through the inference forward pass (the same engine, engine flags and
 * --weight-dtype as generate and bench; not the training engine).
 *
 * Method (llama.cpp's llama-perplexity, tools/perplexity/perplexity.cpp): the text is encoded with
 * the model's tokenizer (BOS first when the tokenizer adds one) and cut into consecutive windows
 * of n_ctx tokens (the tokens after the last whole window are not used); the first token of every
 * window is replaced by BOS (when the tokenizer has one) and each window is evaluated on its own
 * from position 0; only the second half of a window is scored: the logits at positions
 * n_ctx/2 .. n_ctx-2 score the tokens that follow them (n_ctx - 1 - n_ctx/2 per window).
 * With --stride S (llama.cpp's --ppl-stride), windows of n_ctx tokens start every S tokens and
 * each scores its last S tokens; every window that fits is used (llama.cpp leaves out the last
 * one when it ends exactly at the end of the text) and BOS replaces each window's first token as
 * above (llama.cpp's stride code means to, but swaps it in after the window was evaluated).
 * NLL of a token = max + log(sum exp(logit - max)) - logit[token], in double, over the whole
 * vocabulary in index order; sums over tokens in text order: the result is reproducible. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#include "common.h"
#include "device.h"
#include "engine-flags.h"
#include "engine.h"

int zs_cmd_perplexity(int argc, char **argv);

#define PPL_DEFAULT_CONTEXT 2048          /* default window cap (the model's context if smaller) */
#define PPL_MAX_TEXT ((size_t)1 << 30)    /* text files up to 1 GiB */
#define PPL_CHUNK 512                     /* tokens per forward call */

static int read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return zs_err(ZS_ENOTFOUND, "--text %s: cannot open it", path);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    int rc = b ? 0 : zs_err(ZS_ENOMEM, "out of memory");
    while (rc == 0) {
        if (n == cap) {
            if (cap >= PPL_MAX_TEXT) { rc = zs_err(ZS_ERANGE, "--text %s: larger than 1 GiB", path); break; }
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) { rc = zs_err(ZS_ENOMEM, "out of memory"); break; }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) rc = zs_err(ZS_EIO, "--text %s: read failed (is it a directory?)", path);
            break;
        }
    }
    fclose(f);
    if (rc < 0) { free(b); return rc; }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

/* -log p(tok) from one row of logits: double arithmetic, fixed order. */
static double token_nll(const float *row, int vocab, int tok) {
    float mx = row[0];
    for (int i = 1; i < vocab; i++) mx = row[i] > mx ? row[i] : mx;
    double s = 0.0;
    for (int i = 0; i < vocab; i++) s += exp((double)row[i] - (double)mx);
    return (double)mx + log(s) - (double)row[tok];
}

typedef struct {
    int n_ctx, stride, bos;    /* bos: the id put at each window start, -1 none */
    int first, last;           /* scored logits positions of a window: first..last */
    int n_windows;
    long scored;
    double nll, nll2;          /* sums over scored tokens */
    double *window_nll;        /* mean NLL per window */
} ppl_run;

/* Evaluates window w (tokens ids[start .. start+n_ctx)) and adds its scored NLLs. */
static int run_window(zs_engine *e, ppl_run *p, const int32_t *ids, int w, int32_t *tok, int32_t *pos,
                      int32_t *sq, int32_t *li, float *logits, int chunk) {
    const int vocab = zs_model_config_get(zs_engine_model(e))->vocab_size;
    const int start = w * (p->stride ? p->stride : p->n_ctx);
    zs_kvcache *kv = zs_engine_kv(e);
    int seq = -1, rc;
    if ((rc = zs_kv_seq_open(kv, &seq)) < 0) return rc;
    if ((rc = zs_kv_seq_reserve(kv, seq, p->n_ctx)) < 0) { zs_kv_seq_close(kv, seq); return rc; }
    double wsum = 0.0;
    for (int c0 = 0; c0 < p->n_ctx && rc == 0; c0 += chunk) {
        int m = ZS_MIN(chunk, p->n_ctx - c0), nl = 0;
        for (int i = 0; i < m; i++) {
            int k = c0 + i;
            tok[i] = k == 0 && p->bos >= 0 ? p->bos : ids[start + k];
            pos[i] = k;
            sq[i] = seq;
            li[i] = k >= p->first && k <= p->last ? nl++ : -1;
        }
        zs_batch b = {m, tok, pos, sq, li, nl, NULL, NULL, NULL};
        if ((rc = zs_engine_forward(e, &b, logits)) < 0) break;
        for (int i = 0; i < m; i++) {
            if (li[i] < 0) continue;
            int k = c0 + i;
            double v = token_nll(logits + (size_t)li[i] * vocab, vocab, ids[start + k + 1]);
            if (!isfinite(v)) {
                rc = zs_err(ZS_ERANGE, "window %d, position %d: the logits are not finite (NLL %g)", w, k, v);
                break;
            }
            wsum += v;
            p->nll += v;
            p->nll2 += v * v;
            p->scored++;
        }
    }
    zs_kv_seq_close(kv, seq);
    if (rc == 0) p->window_nll[w] = wsum / (p->last - p->first + 1);
    return rc;
}

static int report(const ppl_run *p, const zs_engine_flags *ef, const char *text_path, size_t n_text, int device,
                  double secs, int json) {
    /* the tokens the windows cover */
    size_t n_used = p->stride ? (size_t)(p->n_windows - 1) * (size_t)p->stride + (size_t)p->n_ctx
                              : (size_t)p->n_windows * (size_t)p->n_ctx;
    const char *ws = p->n_windows == 1 ? "" : "s";
    double mean = p->nll / (double)p->scored, ppl = exp(mean);
    double var = p->nll2 / (double)p->scored - mean * mean;
    double se = p->scored > 1 && var > 0 ? sqrt(var / (double)(p->scored - 1)) * ppl : 0.0;
    const char *wd = ef->weight_dtype ? ef->weight_dtype : "auto";
    if (!json) {
        if (p->stride)
            printf("perplexity %.4f +/- %.4f, mean NLL %.6f nats over %ld scored tokens: %d window%s of %d tokens every %d tokens, "
                   "the last %d of each scored%s (llama.cpp --ppl-stride method); %zu of the text's %zu tokens used, weights %s, %s, %.2f s\n",
                   ppl, se, mean, p->scored, p->n_windows, ws, p->n_ctx, p->stride, p->stride,
                   p->bos >= 0 ? ", BOS at each window start" : ", no BOS (the tokenizer adds none)", n_used, n_text, wd,
                   zs_device_name(device), secs);
        else
            printf("perplexity %.4f +/- %.4f, mean NLL %.6f nats over %ld scored tokens: %d window%s of %d tokens, the second "
                   "half of each scored%s (llama.cpp llama-perplexity method); %zu of the text's %zu tokens used, weights %s, %s, %.2f s\n",
                   ppl, se, mean, p->scored, p->n_windows, ws, p->n_ctx,
                   p->bos >= 0 ? ", BOS at each window start" : ", no BOS (the tokenizer adds none)", n_used, n_text, wd,
                   zs_device_name(device), secs);
        return 0;
    }
    json_t *wn = json_array();
    for (int w = 0; w < p->n_windows && wn; w++) json_array_append_new(wn, json_real(p->window_nll[w]));
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:b, s:i, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:o}",
                          "model", ef->model, "text", text_path, "method", p->stride ? "llama.cpp-stride" : "llama.cpp",
                          "weight_dtype", wd, "device", zs_device_name(device), "context", p->n_ctx, "stride", p->stride,
                          "bos", p->bos >= 0, "windows", p->n_windows, "tokens_in_text", (json_int_t)n_text,
                          "tokens_used", (json_int_t)n_used, "scored", (json_int_t)p->scored, "mean_nll", mean,
                          "perplexity", ppl, "ppl_stderr", se, "seconds", secs, "window_nll", wn ? wn : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return zs_err(ZS_ENOMEM, "out of memory");
    puts(s);
    free(s);
    return 0;
}

/* The windows: n_ctx, first/last scored positions and the count, checked against the text. */
static int plan(ppl_run *p, size_t n, int ctx_flag, int ctx_max, int model_ctx) {
    if (ctx_flag > model_ctx)
        return zs_err(ZS_EINVAL, "--context %d is larger than the model's context (%d positions)", ctx_flag, model_ctx);
    if (n < 2)
        return zs_err(ZS_EINVAL, "the text gives %zu token%s to use; perplexity needs at least 2", n,
                      p->bos >= 0 ? " (BOS included)" : "");
    int n_ctx = ctx_flag > 0 ? ctx_flag : (int)ZS_MIN((size_t)ctx_max, n);
    if (p->stride && n_ctx < 2) return zs_err(ZS_EINVAL, "--context %d: a window needs at least 2 tokens", n_ctx);
    if (!p->stride && n_ctx < 3)
        return zs_err(ZS_EINVAL, "a window of %d tokens scores nothing: llama.cpp's method scores the tokens after "
                      "position n_ctx/2 of each window, so a window needs at least 3 (a longer text, --context >= 3, "
                      "or --stride 1)", n_ctx);
    if ((size_t)n_ctx > n)
        return zs_err(ZS_EINVAL, "the text encodes to %zu tokens, fewer than one window of --context %d "
                      "(give a smaller --context or a longer text)", n, n_ctx);
    if (p->stride < 0) return zs_err(ZS_EINVAL, "--stride must be >= 0");
    if (p->stride >= n_ctx)
        return zs_err(ZS_EINVAL, "--stride %d must be smaller than the window (--context %d)", p->stride, n_ctx);
    p->n_ctx = n_ctx;
    p->last = n_ctx - 2;
    if (p->stride) {
        p->first = n_ctx - p->stride - 1;
        p->n_windows = (int)((n - (size_t)n_ctx) / (size_t)p->stride + 1);
    } else {
        p->first = n_ctx / 2;
        p->n_windows = (int)(n / (size_t)n_ctx);
    }
    return 0;
}

int zs_cmd_perplexity(int argc, char **argv) {
    const char *text_path = NULL;
    int stride = 0, json = 0;
    int64_t max_tokens = 0;
    zs_engine_flags ef;
    zs_engine_flags_init(&ef);
    zs_opt opts[4 + ZS_ENGINE_FLAG_COUNT] = {
        {"text", ZS_OPT_STR, &text_path, "UTF-8 text file to score  [required]"},
        {"stride", ZS_OPT_INT, &stride, "0: llama.cpp's method (default); S: windows every S tokens, the last S of each scored (llama.cpp --ppl-stride)"},
        {"max-tokens", ZS_OPT_I64, &max_tokens, "use only the first N tokens of the text, BOS included (default 0: all)"},
        {"json", ZS_OPT_FLAG, &json, "print one JSON object instead of the line"},
    };
    int n_opts = zs_engine_flags_table(&ef, opts, 4);
    for (int k = 0; k < n_opts; k++)
        if (!strcmp(opts[k].name, "context"))
            opts[k].help = "window in tokens (default: the model's context, at most 2048, at most the text); larger than the model's is an error";
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            zs_cli_usage("perplexity",
                         "Mean negative log-likelihood and perplexity = exp(mean NLL) of the model on a text, computed like\n"
                         "llama.cpp's llama-perplexity: the tokens (BOS first when the tokenizer adds one) are cut into\n"
                         "windows of --context tokens, each evaluated on its own with BOS as its first token, and only the\n"
                         "second half of each window is scored (n_ctx - 1 - n_ctx/2 tokens per window); tokens after the\n"
                         "last whole window are not used. Prints one line (or --json), with the number of scored tokens.",
                         opts, n_opts);
            return 0;
        }
    ZS_CHECK(zs_cli_parse(argc, argv, opts, n_opts));
    if (!ef.model) return zs_err(ZS_EINVAL, "--model is required");
    if (!text_path) return zs_err(ZS_EINVAL, "--text is required");
    if (stride < 0) return zs_err(ZS_EINVAL, "--stride must be >= 0");
    if (max_tokens < 0) return zs_err(ZS_EINVAL, "--max-tokens must be >= 0");
    if (ef.context < 0) return zs_err(ZS_EINVAL, "--context must be >= 0");
    char *text = NULL;
    size_t text_len = 0;
    ZS_CHECK(read_text(text_path, &text, &text_len));
    if (text_len == 0) {
        free(text);
        return zs_err(ZS_EINVAL, "--text %s is empty", text_path);
    }
    zs_engine_opts eo;
    zs_engine_opts_default(&eo);
    eo.max_seqs = 1;
    int rc = zs_engine_flags_apply(&ef, &eo);
    if (rc < 0) { free(text); return rc; }
    eo.max_context = ef.context > 0 ? ef.context : PPL_DEFAULT_CONTEXT; /* the engine caps it at the model's */
    eo.max_batch_tokens = PPL_CHUNK;
    eo.model.embed_lookup = 1;
    if (eo.kv_offload != ZS_OFFLOAD_NONE)
        zs_log_warn("--kv-offload: perplexity runs one sequence, which never gives up its room; the tier stays unused");
    eo.kv_whole = 1;
    zs_engine *e;
    if ((rc = zs_engine_open(&eo, &e)) < 0) { free(text); return rc; }
    if (zs_cluster_follower()) {
        free(text);
        rc = zs_engine_follow(e);
        zs_engine_free(e);
        return rc;
    }
    zs_tokenizer *tk = zs_engine_tokenizer(e);
    int32_t *body = NULL, *ids = NULL, *pre = NULL, *scratch = NULL;
    size_t n_body = 0, n_pre = 0, n = 0;
    float *logits = NULL;
    ppl_run p;
    memset(&p, 0, sizeof p);
    p.stride = stride;
    p.bos = -1;
    /* BOS when the tokenizer's post-processing adds one (what an empty text encodes to) */
    rc = zs_tokenizer_encode(tk, "", 0, 1, &pre, &n_pre);
    if (rc == 0 && n_pre > 0 && pre[0] == zs_tokenizer_bos(tk) && zs_tokenizer_bos(tk) >= 0) p.bos = pre[0];
    if (rc == 0) rc = zs_tokenizer_encode(tk, text, text_len, 0, &body, &n_body);
    if (rc == 0 && n_body == 0) rc = zs_err(ZS_EINVAL, "--text %s encodes to no tokens", text_path);
    if (rc == 0 && !(ids = malloc((n_body + 1) * sizeof *ids))) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) {
        if (p.bos >= 0) ids[n++] = p.bos;
        memcpy(ids + n, body, n_body * sizeof *ids);
        n += n_body;
    }
    size_t n_text = n;
    if (rc == 0 && max_tokens > 0 && (size_t)max_tokens < n) n = (size_t)max_tokens;
    const zs_model_config *cfg = zs_model_config_get(zs_engine_model(e));
    if (rc == 0) rc = plan(&p, n, ef.context, zs_engine_context(e), cfg->max_seq);
    int chunk = ZS_MIN(p.n_ctx, zs_engine_max_batch_tokens(e));
    if (rc == 0 && (!(scratch = malloc((size_t)chunk * 4 * sizeof(int32_t))) ||
                    !(logits = malloc((size_t)chunk * (size_t)cfg->vocab_size * sizeof(float))) ||
                    !(p.window_nll = calloc((size_t)p.n_windows, sizeof(double)))))
        rc = zs_err(ZS_ENOMEM, "out of memory (%d tokens of logits)", chunk);
    double t0 = zs_now();
    for (int w = 0; rc == 0 && w < p.n_windows; w++)
        rc = run_window(e, &p, ids, w, scratch, scratch + chunk, scratch + 2 * chunk, scratch + 3 * chunk, logits, chunk);
    if (rc == 0) rc = report(&p, &ef, text_path, n_text, zs_engine_device(e), zs_now() - t0, json);
    free(p.window_nll);
    free(logits);
    free(scratch);
    free(ids);
    free(body);
    free(pre);
    free(text);
    zs_engine_free(e);
    return rc;
}

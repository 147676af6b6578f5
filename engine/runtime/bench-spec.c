/* bench-spec.c — `zeroserve bench --speculative`: greedy decode at batch 1 through the scheduler,
 * plain against prompt lookup (spec-ngram.c) or, with --draft-model, a draft model
 * (spec-draft.c), on a copying prompt (the model's chat template asking it to repeat a paragraph;
 * where there is none, the paragraph and "The same paragraph again:"). Runs interleaved (plain,
 * speculative, speculative, plain, ...), medians. Per mode: decode tokens/s, tokens per weight
 * pass, drafts accepted over drafted, the pass's time against its I/O bound (bytes streamed per
 * pass / the tier's bound measured in the same run: raw io_uring O_DIRECT reads of the same shard
 * files for nvme, host memory bandwidth otherwise), and whether the two modes' tokens are
 * identical (greedy speculation must not change them). */
#include <jansson.h>
#include <pthread.h>
#include <string.h>

#include "bench.h"
#include "chat.h"
#include "common.h"
#include "sched.h"
#include "spec.h"

static const char PARAGRAPH[] =
    "The old lighthouse stood at the edge of the harbor, its white tower weathered by a hundred winters. "
    "Every evening the keeper climbed the spiral stairs, lit the great lamp, and watched the fishing boats "
    "return one by one through the narrow channel between the rocks. When the fog rolled in from the sea, "
    "he wound the brass horn and sounded it every thirty seconds until the last boat was safely home.";

/* One request's outcome. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, finish, err;
    char msg[256];
    double t_first, t_done;
    int32_t *ids;  /* tokens generated, in order */
    int n, cap;
} run_state;

static void on_token(void *ud, int32_t token, const char *text, size_t len, float lp, const int32_t *ti,
                     const float *tl, int nt) {
    (void)text; (void)len; (void)lp; (void)ti; (void)tl; (void)nt;
    run_state *r = ud;
    if (r->n == 0) r->t_first = zs_now();
    if (r->n < r->cap) r->ids[r->n++] = token;
}

static void on_done(void *ud, int finish, const char *text, size_t len, int n_prompt, int n_gen, int err,
                    const char *msg) {
    (void)text; (void)len; (void)n_prompt; (void)n_gen;
    run_state *r = ud;
    pthread_mutex_lock(&r->mu);
    r->t_done = zs_now();
    r->finish = finish;
    r->err = err;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->done = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The figures of one run of one mode. */
typedef struct { double tok_s, per_pass, pass_s, bytes_pass; uint64_t drafted, accepted; int n; } run_fig;

/* The stream's bytes so far: what the tier moves (resident weights: none). */
static uint64_t tier_bytes(const zs_gather_stats *g, int tier) {
    return tier == ZS_OFFLOAD_NVME ? g->bytes_nvme : tier == ZS_OFFLOAD_CPU ? g->bytes_host : 0;
}

/* One greedy generation of the prompt through a fresh scheduler (spec: the proposer or NULL). */
static int one_run(zs_engine *e, zs_spec *spec, int spec_tokens, int tier, const zs_req_params *rp, int32_t *ids,
                   int cap, run_fig *f) {
    zs_sched_opts so;
    memset(&so, 0, sizeof so);
    so.max_seqs = 1;
    so.no_prefix_cache = 1; /* every run prefills the prompt alike */
    so.spec = spec;
    so.spec_tokens = spec_tokens;
    zs_gather_stats g0, g1;
    zs_world_stats(zs_engine_world(e), &g0);
    zs_sched *s;
    ZS_CHECK(zs_sched_new(e, &so, &s));
    run_state r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    r.ids = ids;
    r.cap = cap;
    zs_req_sink sink = {on_token, on_done, &r, NULL};
    zs_request *req;
    int rc = zs_sched_submit(s, rp, &sink, &req);
    if (rc == 0) {
        pthread_mutex_lock(&r.mu);
        while (!r.done) pthread_cond_wait(&r.cv, &r.mu);
        pthread_mutex_unlock(&r.mu);
        if (r.finish == ZS_DONE_ERROR || r.finish == ZS_DONE_CANCELLED)
            rc = zs_err(r.err < 0 ? r.err : ZS_EIO, "bench: the generation failed: %s", r.msg);
    }
    zs_sched_stats st;
    zs_sched_stats_get(s, &st);
    zs_sched_free(s);
    zs_world_stats(zs_engine_world(e), &g1);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    if (rc < 0) return rc;
    if (r.n < 3 || st.passes < 3)
        return zs_err(ZS_ERANGE, "bench: the model ended its answer after %d token(s); no decode to measure", r.n);
    /* the first pass prefilled the prompt and gave the first token; the rest decoded */
    double dt = r.t_done - r.t_first;
    f->n = r.n;
    f->tok_s = (r.n - 1) / dt;
    f->per_pass = (double)(st.pass_tokens - 1) / (double)(st.passes - 1);
    f->pass_s = dt / (double)(st.passes - 1);
    f->bytes_pass = st.steps ? (double)(tier_bytes(&g1, tier) - tier_bytes(&g0, tier)) / (double)st.steps : 0;
    f->drafted = st.spec_drafted;
    f->accepted = st.spec_accepted;
    return 0;
}

/* The copying prompt: through the model's chat template when it has one. */
static int copy_prompt(zs_engine *e, const char *model, zs_req_params *rp, int32_t **ids) {
    zs_tokenizer *t = zs_engine_tokenizer(e);
    int tmpl = zs_model_chat_template_detect(model);
    char *text = NULL;
    int rc, add_special = 1;
    if (tmpl != ZS_CHAT_PLAIN) {
        char user[2048];
        snprintf(user, sizeof user, "Repeat the following paragraph exactly, word for word.\n\n%s", PARAGRAPH);
        zs_chat_msg m = {"user", user};
        int bos = zs_tokenizer_bos(t), eos = zs_tokenizer_eos(t);
        rc = zs_chat_render(tmpl, &m, 1, 1, bos >= 0 ? zs_tokenizer_piece(t, bos) : NULL,
                            eos >= 0 ? zs_tokenizer_piece(t, eos) : NULL, &text);
        if (rc < 0) return rc;
        add_special = !zs_chat_has_bos(tmpl);
    } else {
        size_t n = 3 * sizeof PARAGRAPH;
        if (!(text = malloc(n))) return zs_err(ZS_ENOMEM, "out of memory");
        snprintf(text, n, "%s\n\nThe same paragraph again:\n\n", PARAGRAPH);
    }
    size_t n_ids = 0;
    rc = zs_tokenizer_encode(t, text, strlen(text), add_special, ids, &n_ids);
    free(text);
    if (rc < 0) return rc;
    rp->prompt = *ids;
    rp->n_prompt = (int)n_ids;
    const char *const *ends = zs_chat_stop_strings(tmpl);
    for (int i = 0; ends && ends[i] && rp->n_end_ids < ZS_REQ_MAX_END_IDS; i++) {
        int id = zs_tokenizer_token_id(t, ends[i]);
        if (id >= 0) rp->end_ids[rp->n_end_ids++] = id;
    }
    return 0;
}

int zs_bench_spec(const zs_bench_opts *o) {
    int runs = o->runs > 0 ? o->runs : 5, tier = o->engine.gather.tier, ranks = o->engine.ranks > 0 ? o->engine.ranks : 1;
    zs_engine *e;
    ZS_CHECK(zs_engine_open(&o->engine, &e));
    zs_model *m = zs_engine_model(e);
    const zs_model_config *c = zs_model_config_get(m);
    zs_spec *prop = NULL;
    const char *pname = o->draft_model ? "draft model" : "prompt lookup";
    int32_t *prompt = NULL, *ids[2] = {NULL, NULL};
    double *v = calloc((size_t)runs * 12, sizeof *v);
    run_fig fig[2];
    int rc = 0, same = 1, first_diff = -1, n_same = 0;
    uint64_t drafted = 0, accepted = 0;
    zs_req_params rp;
    memset(&rp, 0, sizeof rp);
    zs_sampler_params_default(&rp.sampling);
    rp.sampling.temperature = 0;
    rp.top_logprobs = -1;
    rp.max_tokens = o->decode_tokens;
    if (!v) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    if (o->draft_model) {
        zs_engine_opts d;
        zs_engine_opts_default(&d);
        d.model_dir = o->draft_model;
        d.model = o->draft;
        d.max_seqs = 1;
        d.max_batch_tokens = zs_engine_max_batch_tokens(e);
        d.kv_dtype = o->engine.kv_dtype;
        rc = zs_spec_draft_new(&d, e, o->engine.model_dir, &prop);
    } else {
        rc = zs_spec_ngram_new(ZS_SPEC_NGRAM_MIN, ZS_SPEC_NGRAM_MAX, &prop);
    }
    if (rc < 0) goto done;
    if ((rc = copy_prompt(e, o->engine.model_dir, &rp, &prompt)) < 0) goto done;
    if (rp.n_prompt + rp.max_tokens > zs_engine_context(e)) { /* a small model's short context */
        rp.max_tokens = zs_engine_context(e) - rp.n_prompt;
        if (rp.max_tokens < 8) {
            rc = zs_err(ZS_EINVAL, "bench: context %d too short for the %d-token prompt and decode tokens",
                        zs_engine_context(e), rp.n_prompt);
            goto done;
        }
    }
    for (int k = 0; k < 2; k++)
        if (!(ids[k] = malloc((size_t)rp.max_tokens * sizeof(int32_t)))) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    /* bytes one pass reads where the weights are resident: the decode pass of bench.c */
    const zs_bucket_layout *E = zs_model_layout(m, zs_bucket_embed());
    double resident_bytes = (double)(zs_model_weight_bytes(m) - E->slot[ZS_R_POS_EMB].nbytes -
                                     (c->tied_embeddings ? 0 : E->slot[ZS_R_TOK_EMB].nbytes));
    zs_gather_stats gs;
    zs_world_stats(zs_engine_world(e), &gs);
    char live[64] = "";
    if (tier != ZS_OFFLOAD_NONE) snprintf(live, sizeof live, " (live budget %.1f MB)", (double)gs.live_limit / 1e6);
    fprintf(stderr, "bench: %s, %.1fM parameters, %s weights, %d rank(s), offload %s%s; a copying prompt of %d tokens, "
            "greedy, batch 1, up to %d tokens; plain against %s%s, %d interleaved runs\n",
            c->arch_name, (double)zs_model_param_count(m) / 1e6, zs_dtype_name(zs_model_layout(m, 1)->slot[ZS_R_WQ].dtype),
            ranks, zs_offload_name(tier), live, rp.n_prompt, rp.max_tokens, pname, o->spec_tokens ? " (fixed drafts)" : "", runs);

    /* run 0 warms both up; then plain and speculative alternate which goes first */
    double *tok[2] = {v, v + runs}, *pp[2] = {v + 2 * runs, v + 3 * runs}, *ps[2] = {v + 4 * runs, v + 5 * runs};
    double *ratio = v + 6 * runs, *bw = v + 7 * runs, *bound = v + 8 * runs, *rel[2] = {v + 9 * runs, v + 10 * runs};
    for (int r = 0; r <= runs; r++) {
        for (int j = 0; j < 2; j++) {
            int k = (r % 2) ? 1 - j : j; /* 0 plain, 1 speculative */
            if ((rc = one_run(e, k ? prop : NULL, o->spec_tokens, tier, &rp, ids[k], rp.max_tokens, &fig[k])) < 0)
                goto done;
        }
        if (fig[0].n != fig[1].n || memcmp(ids[0], ids[1], (size_t)fig[0].n * sizeof(int32_t))) {
            if (same) {
                int i = 0;
                while (i < fig[0].n && i < fig[1].n && ids[0][i] == ids[1][i]) i++;
                first_diff = i;
            }
            same = 0;
        }
        n_same = fig[0].n;
        if (r == 0) continue;
        /* the tier's bound, measured right after the pair: this machine's disk and memory drift */
        double b;
        rc = tier == ZS_OFFLOAD_NVME ? zs_bench_raw_bound(o->engine.nvme_path, ranks, &o->engine.gather, &b)
                                     : zs_bench_mem_bw((size_t)512 << 20, o->threads, 1, &b);
        if (rc < 0) goto done;
        int i = r - 1;
        bw[i] = b;
        double bytes = tier == ZS_OFFLOAD_NONE ? resident_bytes : fig[0].bytes_pass;
        bound[i] = bytes / (b * 1e9);
        for (int k = 0; k < 2; k++) {
            tok[k][i] = fig[k].tok_s;
            pp[k][i] = fig[k].per_pass;
            ps[k][i] = fig[k].pass_s;
            rel[k][i] = fig[k].pass_s / bound[i];
        }
        ratio[i] = fig[1].tok_s / fig[0].tok_s;
        drafted += fig[1].drafted;
        accepted += fig[1].accepted;
    }
    double m_bw = zs_bench_median(bw, runs), m_bound = zs_bench_median(bound, runs), m_ratio = zs_bench_median(ratio, runs);
    double m_tok[2], m_pp[2], m_ps[2], m_rel[2];
    for (int k = 0; k < 2; k++) {
        m_tok[k] = zs_bench_median(tok[k], runs);
        m_pp[k] = zs_bench_median(pp[k], runs);
        m_ps[k] = zs_bench_median(ps[k], runs);
        m_rel[k] = zs_bench_median(rel[k], runs);
    }
    printf("%-40s %8.3f GB/s\n", tier == ZS_OFFLOAD_NVME ? "raw io_uring O_DIRECT read (same files):" : "host memory bandwidth:", m_bw);
    printf("%-40s %8.1f MB  (bound %.2f ms: bytes / %s)\n", tier == ZS_OFFLOAD_NONE ? "weights read per pass:" : "streamed per pass:",
           (tier == ZS_OFFLOAD_NONE ? resident_bytes : fig[0].bytes_pass) / 1e6, m_bound * 1e3,
           tier == ZS_OFFLOAD_NVME ? "raw read" : "memory bandwidth");
    printf("%-40s %12s %14s\n", "", "plain", pname);
    printf("%-40s %12.2f %14.2f   x%.2f (median of the per-run ratios)\n", "decode tokens/s:", m_tok[0], m_tok[1], m_ratio);
    printf("%-40s %12.2f %14.2f\n", "tokens per pass:", m_pp[0], m_pp[1]);
    printf("%-40s %12.1f %14.1f\n", "pass time (ms):", m_ps[0] * 1e3, m_ps[1] * 1e3);
    printf("%-40s %12.2f %14.2f\n", "pass time / bound:", m_rel[0], m_rel[1]);
    printf("%-40s %12s %8llu / %llu (%.2f)\n", "drafts accepted / drafted:", "-", (unsigned long long)accepted,
           (unsigned long long)drafted, drafted ? (double)accepted / (double)drafted : 0.0);
    if (same) printf("greedy outputs: identical (%d tokens, every run)\n", n_same);
    else printf("greedy outputs: DIFFER (first at token %d)\n", first_diff);
    if (o->json_out) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:b, s:i}",
                              "model", c->arch_name, "proposer", o->draft_model ? "draft" : "ngram", "offload", zs_offload_name(tier), "ranks", ranks, "prompt_tokens",
                              rp.n_prompt, "bound_gbps", m_bw, "io_bound_pass_s", m_bound, "plain_tok_s", m_tok[0],
                              "spec_tok_s", m_tok[1], "ratio", m_ratio, "plain_tokens_per_pass", m_pp[0],
                              "spec_tokens_per_pass", m_pp[1], "plain_pass_s", m_ps[0], "spec_pass_s", m_ps[1],
                              "plain_pass_over_bound", m_rel[0], "spec_pass_over_bound", m_rel[1], "drafted",
                              (json_int_t)drafted, "accepted", (json_int_t)accepted, "identical", same, "runs", runs);
        if (!j) rc = zs_err(ZS_ENOMEM, "bench: cannot build the JSON figures");
        else if (json_dump_file(j, o->json_out, JSON_INDENT(2)) != 0) rc = zs_err(ZS_EIO, "bench: cannot write %s", o->json_out);
        json_decref(j);
    }
    if (rc == 0 && !same)
        rc = zs_err(ZS_EINVAL, "bench: greedy speculation changed the output (first difference at token %d)", first_diff);
done:
    free(v);
    free(prompt);
    free(ids[0]);
    free(ids[1]);
    zs_spec_free(prop);
    zs_engine_free(e);
    return rc;
}

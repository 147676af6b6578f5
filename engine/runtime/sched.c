/* sched.c — the request scheduler: a queue, continuous batching of decode tokens and prompt
 * chunks over the ranks, sampling/detokenizing/stop strings per sequence, cancellation, and the
 * counters behind /metrics, each request's LoRA adapter carried into its batch rows, embedding
 * requests (prompt chunks whose final-normed hidden rows, zs_batch.hidden, are pooled as they
 * arrive; nothing sampled; finished with the pooled vector), and the idle
 * jobs of zs_sched_run_idle (run by the engine thread when no request is queued or running). One
 * engine thread owns the engine; see sched.h. */
#include "sched.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"
#include "device.h"
#include "lora.h"
#include "stop.h"

enum { RQ_WAITING = 0, RQ_RUNNING = 1 };

struct zs_request {
    int32_t *prompt;
    int n_prompt, max_tokens, top_logprobs, ignore_eos;
    int32_t end_ids[ZS_REQ_MAX_END_IDS];
    int n_end_ids;
    zs_req_sink sink;
    zs_sampler *smp;
    zs_detok *dt;
    zs_stop *st;
    atomic_int cancelled;
    atomic_int failed;                    /* zs_sched_fail_lora: finish with ZS_DONE_ERROR, fail_msg */
    char fail_msg[256];                   /* written under mu before failed is set */
    const zs_lora *lora;                  /* borrowed (sched.h), or NULL */
    int embed, pooling;                   /* an embedding request (sched.h) and its ZS_POOL_* */
    double *acc;                          /* embed: the pooled sum (mean) or last row, dim values */
    int state, rank, seq, n_done, n_gen, stopped;
    int32_t last_tok;
    double t_submit, t_last;
    struct zs_request *next;              /* inbox / waiting queue */
    struct zs_request *live_prev, *live_next; /* every request not yet finished */
};

/* A zs_sched_run_idle call waiting for (or in) its turn; lives on the caller's stack. */
typedef struct idle_job {
    int (*fn)(void *ud);
    void *ud;
    int state, rc;            /* IDLE_* */
    struct idle_job *next;
} idle_job;
enum { IDLE_PENDING = 0, IDLE_RUNNING = 1, IDLE_DONE = 2 };

typedef struct {
    int32_t *tok, *pos, *seq, *lidx;
    zs_request **row_req;   /* request of each logits row */
    const zs_lora **lora;   /* adapter of each token row (zs_batch.lora when any is set) */
    float *hidden;          /* final-normed rows [max_batch, dim] (zs_batch.hidden when an embedding
                               request has rows in the batch) */
    float *logits;
    zs_request **running;   /* [per-rank slots] */
    int n_running;
} rank_buf;

struct zs_sched {
    zs_engine *e;
    zs_world *w;
    int nranks, vocab, dim, per_rank, max_seqs, max_batch, max_queue, context;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv, cv_idle;
    zs_request *inbox, *inbox_tail;   /* submitted, not yet taken by the engine thread */
    zs_request *live;                 /* all unfinished requests (for cancel) */
    int n_pending;                    /* inbox + waiting */
    int n_live;
    int stop, draining;
    idle_job *idle, *idle_tail;       /* zs_sched_run_idle calls not yet run (under mu) */
    pthread_cond_t cv_job;            /* an idle job finished, or a caller left */
    int n_idle_callers;               /* callers inside zs_sched_run_idle */
    zs_request *waiting, *waiting_tail; /* engine thread only */
    rank_buf *rb;
    zs_sched_stats st;                /* under mu */
    int32_t top_ids[20];
    float top_lps[20];
};

static const double lat_bounds[ZS_SCHED_LAT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                        0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

static void observe(uint64_t *counts, uint64_t *count, double *sum, double v) {
    for (int i = 0; i < ZS_SCHED_LAT_BUCKETS; i++)
        if (v <= lat_bounds[i]) counts[i]++;
    (*count)++;
    *sum += v;
}

static void req_free(zs_request *r) {
    if (!r) return;
    zs_sampler_free(r->smp);
    zs_detok_free(r->dt);
    zs_stop_free(r->st);
    free(r->acc);
    free(r->prompt);
    free(r);
}

/* Finishes a request: flushes held-back text for normal ends, frees its KV blocks, calls
 * on_done, and frees it. Engine thread. */
static void finish(zs_sched *s, zs_request *r, int reason, int err, const char *msg) {
    char held[512], tail[2048];
    size_t n = 0;
    if ((reason == ZS_DONE_STOP || reason == ZS_DONE_LENGTH) && !r->stopped && !r->embed) {
        size_t a = 0;
        int stopped = 0;
        if (zs_detok_flush(r->dt, held, sizeof held, &a) < 0) a = 0;
        if (!r->st) {
            memcpy(tail, held, a);
            n = a;
        } else if (zs_stop_push(r->st, held, a, tail, sizeof tail, &n, &stopped) == 0) {
            size_t c = 0;
            if (stopped) reason = ZS_DONE_STOP;
            else if (zs_stop_flush(r->st, tail + n, sizeof tail - n, &c) == 0) n += c;
        }
    }
    if (r->state == RQ_RUNNING) {
        zs_kv_seq_close(zs_world_kv(s->w, r->rank), r->seq);
        rank_buf *b = &s->rb[r->rank];
        for (int i = 0; i < b->n_running; i++)
            if (b->running[i] == r) {
                memmove(&b->running[i], &b->running[i + 1], (size_t)(b->n_running - i - 1) * sizeof(zs_request *));
                b->n_running--;
                break;
            }
    }
    r->sink.on_done(r->sink.ud, reason, tail, n, r->n_prompt, r->n_gen, err, msg ? msg : "");
    pthread_mutex_lock(&s->mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else s->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    s->n_live--;
    s->st.requests_done[reason]++;
    if (s->n_live == 0) pthread_cond_broadcast(&s->cv_idle);
    pthread_mutex_unlock(&s->mu);
    req_free(r);
}

/* A sampled token: text, stop strings, EOS, length. Engine thread. */
static void on_sample(zs_sched *s, zs_request *r, const float *logits) {
    int tok;
    float lp = 0;
    int rc = zs_sampler_sample(r->smp, logits, &tok, r->top_logprobs >= 0 ? &lp : NULL);
    if (rc < 0) {
        finish(s, r, ZS_DONE_ERROR, rc, zs_errmsg());
        return;
    }
    double now = zs_now();
    pthread_mutex_lock(&s->mu);
    if (r->n_gen == 0) observe(s->st.ttft_counts, &s->st.ttft_count, &s->st.ttft_sum, now - r->t_submit);
    else observe(s->st.itl_counts, &s->st.itl_count, &s->st.itl_sum, now - r->t_last);
    s->st.generated_tokens++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
    int end = zs_tokenizer_is_eos(zs_engine_tokenizer(s->e), tok);
    for (int i = 0; i < r->n_end_ids && !end; i++) end = tok == r->end_ids[i];
    if (!r->ignore_eos && end) {
        finish(s, r, ZS_DONE_STOP, 0, NULL);
        return;
    }
    r->n_gen++;
    char txt[512], out[1024];
    size_t n = 0, m = 0;
    rc = zs_detok_push(r->dt, tok, txt, sizeof txt, &n);
    int stopped = 0;
    if (rc == 0 && r->st) {
        rc = zs_stop_push(r->st, txt, n, out, sizeof out, &m, &stopped);
    } else if (rc == 0) {
        memcpy(out, txt, n);
        m = n;
    }
    if (rc < 0) {
        finish(s, r, ZS_DONE_ERROR, rc, zs_errmsg());
        return;
    }
    int k = r->top_logprobs > 0 ? r->top_logprobs : 0;
    if (k > 0 && zs_sampler_top_logprobs(logits, s->vocab, k, s->top_ids, s->top_lps) < 0) k = 0;
    r->sink.on_token(r->sink.ud, tok, out, m, lp, s->top_ids, s->top_lps, k);
    if (stopped) {
        r->stopped = 1;
        finish(s, r, ZS_DONE_STOP, 0, NULL);
    } else if (r->n_gen >= r->max_tokens) {
        finish(s, r, ZS_DONE_LENGTH, 0, NULL);
    } else {
        r->last_tok = tok;
    }
}

/* One hidden row of an embedding request, in position order (the sum's order does not depend on
 * how the prompt was chunked, so neither do its bits). Engine thread. */
static void embed_row(zs_sched *s, zs_request *r, const float *h) {
    if (r->pooling == ZS_POOL_LAST) {
        if (r->n_done == r->n_prompt - 1)
            for (int t = 0; t < s->dim; t++) r->acc[t] = h[t];
        return;
    }
    for (int t = 0; t < s->dim; t++) r->acc[t] += h[t];
}

/* An embedding request has all its rows: the pooled vector to the sink, then done. Engine thread. */
static void embed_finish(zs_sched *s, zs_request *r) {
    float *v = malloc((size_t)s->dim * sizeof(float));
    if (!v) {
        finish(s, r, ZS_DONE_ERROR, ZS_ENOMEM, "out of memory");
        return;
    }
    double div = r->pooling == ZS_POOL_MEAN ? (double)r->n_prompt : 1.0;
    for (int t = 0; t < s->dim; t++) v[t] = (float)(r->acc[t] / div);
    if (r->sink.on_embedding) r->sink.on_embedding(r->sink.ud, v, s->dim);
    free(v);
    finish(s, r, ZS_DONE_STOP, 0, NULL);
}

/* Admits waiting requests onto ranks (FIFO; stops at the first that does not fit). */
static void admit(zs_sched *s) {
    while (s->waiting) {
        zs_request *r = s->waiting;
        int total = 0, best = -1;
        for (int i = 0; i < s->nranks; i++) {
            total += s->rb[i].n_running;
            if (s->rb[i].n_running < s->per_rank && (best < 0 || s->rb[i].n_running < s->rb[best].n_running)) best = i;
        }
        if (best < 0 || total >= s->max_seqs) return;
        zs_kvcache *kv = zs_world_kv(s->w, best);
        int seq;
        if (zs_kv_seq_open(kv, &seq) < 0) return;
        /* room for the whole request up front: a running sequence never runs out of blocks */
        if (zs_kv_seq_reserve(kv, seq, r->n_prompt + r->max_tokens) < 0) {
            zs_kv_seq_close(kv, seq);
            if (total == 0) { /* cannot fit even alone: fail it rather than wait forever */
                s->waiting = r->next;
                if (!s->waiting) s->waiting_tail = NULL;
                pthread_mutex_lock(&s->mu);
                s->n_pending--;
                pthread_mutex_unlock(&s->mu);
                finish(s, r, ZS_DONE_ERROR, ZS_ENOSPC, "the KV cache is too small for this request");
                continue;
            }
            return;
        }
        s->waiting = r->next;
        if (!s->waiting) s->waiting_tail = NULL;
        pthread_mutex_lock(&s->mu);
        s->n_pending--;
        pthread_mutex_unlock(&s->mu);
        r->state = RQ_RUNNING;
        r->rank = best;
        r->seq = seq;
        s->rb[best].running[s->rb[best].n_running++] = r;
    }
}

/* Builds every rank's batch; returns the total token count. */
static int build_batches(zs_sched *s, zs_batch *bs, float **lg) {
    int total = 0;
    for (int i = 0; i < s->nranks; i++) {
        rank_buf *b = &s->rb[i];
        int n = 0, nl = 0, any_lora = 0, any_embed = 0;
        /* decode tokens first, so running sequences always advance */
        for (int j = 0; j < b->n_running && n < s->max_batch; j++) {
            zs_request *r = b->running[j];
            if (r->n_done < r->n_prompt) continue;
            b->tok[n] = r->last_tok;
            b->pos[n] = r->n_prompt + r->n_gen - 1;
            b->seq[n] = r->seq;
            b->lidx[n] = nl;
            b->lora[n] = r->lora;
            any_lora |= r->lora != NULL;
            b->row_req[nl++] = r;
            n++;
        }
        /* then prompt chunks, oldest first, up to the token budget */
        for (int j = 0; j < b->n_running && n < s->max_batch; j++) {
            zs_request *r = b->running[j];
            if (r->n_done >= r->n_prompt) continue;
            int c = ZS_MIN(r->n_prompt - r->n_done, s->max_batch - n);
            for (int k = 0; k < c; k++) {
                b->tok[n + k] = r->prompt[r->n_done + k];
                b->pos[n + k] = r->n_done + k;
                b->seq[n + k] = r->seq;
                b->lidx[n + k] = -1;
                b->lora[n + k] = r->lora;
            }
            any_lora |= r->lora != NULL;
            any_embed |= r->embed;
            if (r->n_done + c == r->n_prompt && !r->embed) {
                b->lidx[n + c - 1] = nl;
                b->row_req[nl++] = r;
            }
            n += c;
        }
        bs[i] = (zs_batch){n, b->tok, b->pos, b->seq, b->lidx, nl, any_lora ? b->lora : NULL,
                           any_embed ? b->hidden : NULL};
        lg[i] = b->logits;
        total += n;
    }
    return total;
}

/* KV block counts for /metrics, taken on the engine thread (the caches are not shared). */
static void publish_kv(zs_sched *s) {
    int used = 0, total = 0;
    for (int i = 0; i < s->nranks; i++) {
        used += zs_kv_used_blocks(zs_world_kv(s->w, i));
        total += zs_kv_total_blocks(zs_world_kv(s->w, i));
    }
    pthread_mutex_lock(&s->mu);
    s->st.kv_used = used;
    s->st.kv_total = total;
    pthread_mutex_unlock(&s->mu);
}

static void *engine_main(void *arg) {
    zs_sched *s = arg;
    zs_batch *bs = calloc((size_t)s->nranks, sizeof *bs);
    float **lg = calloc((size_t)s->nranks, sizeof *lg);
    ZS_ASSERT(bs && lg);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = 0;
        for (int i = 0; i < s->nranks; i++) busy += s->rb[i].n_running;
        while (!s->stop && !s->inbox && !s->waiting && !busy) {
            /* idle: the jobs of zs_sched_run_idle, one at a time, without mu (requests submitted
             * meanwhile wait in the inbox for the job to return) */
            if (s->idle && !s->draining) {
                idle_job *j = s->idle;
                s->idle = j->next;
                if (!s->idle) s->idle_tail = NULL;
                j->state = IDLE_RUNNING;
                pthread_mutex_unlock(&s->mu);
                int jrc = j->fn(j->ud);
                pthread_mutex_lock(&s->mu);
                j->rc = jrc;
                j->state = IDLE_DONE;
                pthread_cond_broadcast(&s->cv_job);
                continue;
            }
            pthread_cond_wait(&s->cv, &s->mu);
        }
        /* take the inbox */
        if (s->inbox) {
            if (s->waiting_tail) s->waiting_tail->next = s->inbox;
            else s->waiting = s->inbox;
            s->waiting_tail = s->inbox_tail;
            s->inbox = s->inbox_tail = NULL;
        }
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);

        /* cancellations (and everything, when stopping) */
        for (zs_request **pp = &s->waiting; *pp;) {
            zs_request *r = *pp;
            if (stop || atomic_load(&r->cancelled) || atomic_load(&r->failed)) {
                *pp = r->next;
                if (s->waiting_tail == r) s->waiting_tail = NULL;
                pthread_mutex_lock(&s->mu);
                s->n_pending--;
                pthread_mutex_unlock(&s->mu);
                if (!stop && atomic_load(&r->failed)) finish(s, r, ZS_DONE_ERROR, ZS_ECANCELLED, r->fail_msg);
                else finish(s, r, ZS_DONE_CANCELLED, ZS_ECANCELLED, "cancelled");
            } else {
                pp = &r->next;
            }
        }
        if (!s->waiting_tail)
            for (zs_request *r = s->waiting; r; r = r->next) s->waiting_tail = r;
        for (int i = 0; i < s->nranks; i++)
            for (int j = s->rb[i].n_running - 1; j >= 0; j--) {
                zs_request *r = s->rb[i].running[j];
                if (!stop && atomic_load(&r->failed)) finish(s, r, ZS_DONE_ERROR, ZS_ECANCELLED, r->fail_msg);
                else if (stop || atomic_load(&r->cancelled)) finish(s, r, ZS_DONE_CANCELLED, ZS_ECANCELLED, "cancelled");
            }
        if (stop) break;

        admit(s);
        publish_kv(s);
        if (build_batches(s, bs, lg) == 0) continue;
        int rc = zs_world_step(s->w, bs, lg);
        uint64_t prompt_tokens = 0;
        if (rc < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", zs_errmsg());
            zs_log_error("engine step failed: %s", msg);
            /* every sequence that took part in the step fails with it */
            for (int i = 0; i < s->nranks; i++)
                for (int j = s->rb[i].n_running - 1; j >= 0; j--) {
                    zs_request *r = s->rb[i].running[j];
                    int in_step = 0;
                    for (int k = 0; k < bs[i].n; k++) in_step |= bs[i].seq[k] == r->seq;
                    if (in_step) finish(s, r, ZS_DONE_ERROR, rc, msg);
                }
        } else {
            for (int i = 0; i < s->nranks; i++) {
                rank_buf *b = &s->rb[i];
                /* prompt progress */
                for (int k = 0; k < bs[i].n; k++)
                    for (int j = 0; j < b->n_running; j++) {
                        zs_request *r = b->running[j];
                        if (r->seq == bs[i].seq[k] && r->n_done < r->n_prompt && bs[i].pos[k] == r->n_done) {
                            if (r->embed) embed_row(s, r, bs[i].hidden + (size_t)k * s->dim);
                            r->n_done++;
                            prompt_tokens++;
                        }
                    }
                if (prompt_tokens) { /* counted before any callback of the step (a finished embedding's) */
                    pthread_mutex_lock(&s->mu);
                    s->st.prompt_tokens += prompt_tokens;
                    pthread_mutex_unlock(&s->mu);
                    prompt_tokens = 0;
                }
                for (int l = 0; l < bs[i].n_logits; l++)
                    on_sample(s, b->row_req[l], b->logits + (size_t)l * s->vocab);
                /* embedding requests whose last token was in this step end with their vector */
                for (int j = b->n_running - 1; j >= 0; j--) {
                    zs_request *r = b->running[j];
                    if (r->embed && r->n_done == r->n_prompt) embed_finish(s, r);
                }
            }
        }
        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        s->st.prompt_tokens += prompt_tokens;
        pthread_mutex_unlock(&s->mu);
        publish_kv(s);
    }
    free(bs);
    free(lg);
    return NULL;
}

int zs_sched_new(zs_engine *e, const zs_sched_opts *o, zs_sched **out) {
    zs_sched *s = calloc(1, sizeof *s);
    if (!s) return zs_err(ZS_ENOMEM, "out of memory");
    s->e = e;
    s->w = zs_engine_world(e);
    s->nranks = zs_world_ranks(s->w);
    s->vocab = zs_model_config_get(zs_engine_model(e))->vocab_size;
    s->dim = zs_model_config_get(zs_engine_model(e))->dim;
    s->context = zs_engine_context(e);
    s->per_rank = zs_engine_max_seqs(e);
    s->max_seqs = o && o->max_seqs > 0 ? o->max_seqs : 32;
    s->max_seqs = ZS_MIN(s->max_seqs, s->per_rank * s->nranks);
    s->max_batch = ZS_MIN(o && o->max_batch_tokens > 0 ? o->max_batch_tokens : 256, zs_engine_max_batch_tokens(e));
    s->max_queue = o && o->max_queue > 0 ? o->max_queue : 256;
    s->st.kv_total = 0;
    for (int i = 0; i < s->nranks; i++) s->st.kv_total += zs_kv_total_blocks(zs_world_kv(s->w, i));
    if (s->max_batch < s->per_rank) s->per_rank = s->max_batch; /* one decode token each */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->cv_idle, NULL);
    pthread_cond_init(&s->cv_job, NULL);
    memcpy(s->st.lat_bounds, lat_bounds, sizeof lat_bounds);
    s->rb = calloc((size_t)s->nranks, sizeof *s->rb);
    int ok = s->rb != NULL;
    for (int i = 0; ok && i < s->nranks; i++) {
        rank_buf *b = &s->rb[i];
        b->tok = malloc((size_t)s->max_batch * sizeof(int32_t) * 4);
        b->row_req = calloc((size_t)s->max_batch + 1, sizeof(zs_request *));
        b->logits = malloc((size_t)s->per_rank * (size_t)s->vocab * sizeof(float));
        b->running = calloc((size_t)s->per_rank, sizeof(zs_request *));
        b->lora = calloc((size_t)s->max_batch, sizeof(const zs_lora *));
        b->hidden = malloc((size_t)s->max_batch * (size_t)s->dim * sizeof(float));
        ok = b->tok && b->row_req && b->logits && b->running && b->lora && b->hidden;
        if (ok) {
            b->pos = b->tok + s->max_batch;
            b->seq = b->pos + s->max_batch;
            b->lidx = b->seq + s->max_batch;
        }
    }
    if (!ok) {
        zs_sched_free(s);
        return zs_err(ZS_ENOMEM, "scheduler: out of memory");
    }
    if (pthread_create(&s->th, NULL, engine_main, s) != 0) {
        zs_sched_free(s);
        return zs_err(ZS_EIO, "scheduler: cannot start the engine thread");
    }
    s->started = 1;
    *out = s;
    return 0;
}

/* A request's adapter: refused on the CUDA device (not computed there yet) and when it is not of
 * the served model's shape (it would fail the whole step it joined). */
static int check_lora(zs_sched *s, const zs_lora *l) {
    if (zs_engine_device(s->e) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "lora: LoRA adapters are not supported on the CUDA device yet (serve with "
                      "--device cpu to use them)");
    return zs_lora_check_base(l, zs_engine_model(s->e));
}

/* An embedding request: its prompt within the context, the CUDA device refused. */
static int submit_embed_check(zs_sched *s, const zs_req_params *p) {
    if (p->n_prompt < 1) return zs_err(ZS_EINVAL, "input: the input is empty");
    if (p->n_prompt > s->context)
        return zs_err(ZS_ERANGE, "input: %d tokens exceed the context length of %d tokens", p->n_prompt, s->context);
    if (p->pooling != ZS_POOL_MEAN && p->pooling != ZS_POOL_LAST)
        return zs_err(ZS_EINVAL, "pooling: unknown pooling %d", p->pooling);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
            return zs_err(ZS_ERANGE, "input: token id %d is out of range [0, %d)", p->prompt[i], s->vocab);
    if (zs_engine_device(s->e) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "embeddings run on the CPU device for now (serve with --device cpu)");
    if (p->lora) ZS_CHECK(check_lora(s, p->lora));
    return 0;
}

int zs_sched_submit(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out) {
    if (p->embed) ZS_CHECK(submit_embed_check(s, p));
    else if (p->n_prompt < 1) return zs_err(ZS_EINVAL, "prompt: the prompt is empty");
    if (!p->embed && p->max_tokens < 1) return zs_err(ZS_ERANGE, "max_tokens: must be at least 1");
    if (!p->embed && (long)p->n_prompt + p->max_tokens > s->context)
        return zs_err(ZS_ERANGE, "max_tokens: the prompt (%d tokens) plus max_tokens (%d) exceeds the context length of %d tokens",
                      p->n_prompt, p->max_tokens, s->context);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= s->vocab)
            return zs_err(ZS_ERANGE, "prompt: token id %d is out of range [0, %d)", p->prompt[i], s->vocab);
    if (!p->embed && p->top_logprobs > 20) return zs_err(ZS_ERANGE, "top_logprobs: must be at most 20");
    if (!p->embed) ZS_CHECK(zs_sampler_params_check(&p->sampling));
    if (!p->embed && p->lora) ZS_CHECK(check_lora(s, p->lora));
    zs_request *r = calloc(1, sizeof *r);
    if (!r) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = 0;
    r->prompt = malloc((size_t)p->n_prompt * sizeof(int32_t));
    if (!r->prompt) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (rc == 0) {
        memcpy(r->prompt, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
        if (p->embed) {
            r->acc = calloc((size_t)s->dim, sizeof(double));
            if (!r->acc) rc = zs_err(ZS_ENOMEM, "out of memory");
        } else {
            rc = zs_sampler_new(&p->sampling, s->vocab, &r->smp);
        }
    }
    if (rc == 0 && !p->embed) rc = zs_engine_detok_for(s->e, p->prompt, p->n_prompt, &r->dt);
    if (rc == 0 && !p->embed && p->n_stop > 0) rc = zs_stop_new(p->stop, p->n_stop, &r->st);
    if (rc < 0) {
        req_free(r);
        return rc;
    }
    r->n_prompt = p->n_prompt;
    r->max_tokens = p->embed ? 0 : p->max_tokens;
    r->embed = p->embed != 0;
    r->pooling = p->pooling;
    r->top_logprobs = p->top_logprobs;
    r->ignore_eos = p->ignore_eos;
    r->n_end_ids = ZS_MIN(ZS_MAX(p->n_end_ids, 0), ZS_REQ_MAX_END_IDS);
    memcpy(r->end_ids, p->end_ids, (size_t)r->n_end_ids * sizeof(int32_t));
    r->sink = *sink;
    r->lora = p->lora;
    r->t_submit = zs_now();
    pthread_mutex_lock(&s->mu);
    if (s->draining || s->stop) rc = zs_err(ZS_EBUSY, "the server is shutting down");
    else if (s->n_pending >= s->max_queue) rc = zs_err(ZS_EBUSY, "the request queue is full (%d waiting)", s->n_pending);
    if (rc == 0) {
        if (s->inbox_tail) s->inbox_tail->next = r;
        else s->inbox = r;
        s->inbox_tail = r;
        s->n_pending++;
        r->live_next = s->live;
        if (s->live) s->live->live_prev = r;
        s->live = r;
        s->n_live++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) {
        req_free(r);
        return rc;
    }
    if (out) *out = r;
    return 0;
}

void zs_sched_cancel(zs_sched *s, zs_request *r) {
    pthread_mutex_lock(&s->mu);
    for (zs_request *x = s->live; x; x = x->live_next)
        if (x == r) {
            atomic_store(&r->cancelled, 1);
            pthread_cond_signal(&s->cv);
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

static void wait_idle(zs_sched *s, double timeout_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    while (s->n_live > 0)
        if (pthread_cond_timedwait(&s->cv_idle, &s->mu, &ts) != 0) break;
}

void zs_sched_drain(zs_sched *s, double timeout_s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    wait_idle(s, timeout_s);
    for (zs_request *x = s->live; x; x = x->live_next) atomic_store(&x->cancelled, 1);
    pthread_cond_signal(&s->cv);
    wait_idle(s, 5.0);
    pthread_mutex_unlock(&s->mu);
}

void zs_sched_free(zs_sched *s) {
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
        /* zs_sched_run_idle callers see stop within their poll and leave */
        pthread_mutex_lock(&s->mu);
        while (s->n_idle_callers > 0) {
            pthread_cond_broadcast(&s->cv_job);
            pthread_cond_wait(&s->cv_job, &s->mu);
        }
        pthread_mutex_unlock(&s->mu);
    }
    /* requests still in the inbox never reached the engine thread */
    while (s->inbox) {
        zs_request *r = s->inbox;
        s->inbox = r->next;
        r->sink.on_done(r->sink.ud, ZS_DONE_CANCELLED, "", 0, r->n_prompt, 0, ZS_ECANCELLED, "cancelled");
        req_free(r);
    }
    for (int i = 0; s->rb && i < s->nranks; i++) {
        free(s->rb[i].tok);
        free(s->rb[i].row_req);
        free(s->rb[i].logits);
        free(s->rb[i].running);
        free(s->rb[i].lora);
        free(s->rb[i].hidden);
    }
    free(s->rb);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->cv_idle);
    pthread_cond_destroy(&s->cv_job);
    free(s);
}

void zs_sched_stats_get(zs_sched *s, zs_sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->n_pending;
    out->running = s->n_live - s->n_pending;
    pthread_mutex_unlock(&s->mu);
    zs_world_stats(s->w, &out->gather);
}

int zs_sched_fail_lora(zs_sched *s, const zs_lora *l, const char *msg) {
    int n = 0;
    if (!l) return 0;
    pthread_mutex_lock(&s->mu);
    for (zs_request *x = s->live; x; x = x->live_next)
        if (x->lora == l && !atomic_load(&x->failed)) {
            snprintf(x->fail_msg, sizeof x->fail_msg, "%s", msg && *msg ? msg : "the LoRA adapter was unloaded");
            atomic_store(&x->failed, 1);
            n++;
        }
    if (n) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* An absolute CLOCK_REALTIME deadline ms milliseconds from now. */
static struct timespec deadline_ms(int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    return ts;
}

/* Takes j out of the queue of idle jobs (it has not started). Under mu. */
static void idle_unlink(zs_sched *s, idle_job *j) {
    idle_job *prev = NULL;
    for (idle_job *x = s->idle; x; prev = x, x = x->next)
        if (x == j) {
            if (prev) prev->next = j->next;
            else s->idle = j->next;
            if (s->idle_tail == j) s->idle_tail = prev;
            return;
        }
}

int zs_sched_run_idle(zs_sched *s, int (*fn)(void *ud), void *ud, int (*cancelled)(void *ud)) {
    if (!fn) return zs_err(ZS_EINVAL, "zs_sched_run_idle: no function");
    if (s->started && pthread_equal(pthread_self(), s->th))
        return zs_err(ZS_EINVAL, "zs_sched_run_idle: called from the engine thread (it would wait for itself)");
    idle_job j = {fn, ud, IDLE_PENDING, 0, NULL};
    pthread_mutex_lock(&s->mu);
    if (s->stop || s->draining || !s->started) {
        pthread_mutex_unlock(&s->mu);
        return zs_err(ZS_ECANCELLED, "the scheduler is stopping");
    }
    if (s->idle_tail) s->idle_tail->next = &j;
    else s->idle = &j;
    s->idle_tail = &j;
    s->n_idle_callers++;
    pthread_cond_signal(&s->cv);
    int rc = 0;
    for (;;) {
        if (j.state == IDLE_DONE) {
            rc = j.rc;
            break;
        }
        if (j.state == IDLE_PENDING) {
            int gone = s->stop || s->draining;
            if (!gone && cancelled) { /* the caller's predicate runs without mu */
                pthread_mutex_unlock(&s->mu);
                gone = cancelled(ud) != 0;
                pthread_mutex_lock(&s->mu);
            }
            if (gone && j.state == IDLE_PENDING) {
                idle_unlink(s, &j);
                rc = zs_err(ZS_ECANCELLED, s->stop || s->draining ? "the scheduler is stopping" : "cancelled");
                break;
            }
            if (j.state != IDLE_PENDING) continue;
        }
        /* polled every 5 ms while waiting (cancelled, stop, drain); woken at once when a job ends */
        struct timespec ts = deadline_ms(5);
        pthread_cond_timedwait(&s->cv_job, &s->mu, &ts);
    }
    s->n_idle_callers--;
    pthread_cond_broadcast(&s->cv_job);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

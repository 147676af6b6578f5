/* sched.c — the request scheduler's loop (DESIGN.md §4). One engine thread owns the engine. At
 * every step it takes what was submitted, ends what was cancelled or failed, admits waiting
 * requests (FIFO, up to max_seqs running, KV blocks permitting: a request reserves room for its
 * whole prompt and max_tokens at admission, so a running sequence never runs out of blocks; with
 * a KV tier, --kv-offload, it reserves as it grows and the youngest are preempted and resumed
 * first: sched-kv.c),
 * builds each rank's batch of at most max_batch_tokens tokens — one decode token per running
 * sequence first, then prompt chunks of new ones, oldest first — runs it as one step of all
 * ranks, and hands each row back to its request's room: prompt progress and the prefix cache
 * (sched-prefix.c), hidden rows of embedding requests (sched-embed.c), the masks of constrained
 * rows (sched-constrain.c), and every logits row to sampling (sched-sample.c), which ends the
 * request through sched-req.c. A sequence that finishes, is cancelled or fails frees its KV
 * blocks at once. A request's result does not depend on what else is in the batch (the kernels
 * are batch-invariant). Each request's LoRA adapter is carried into its batch rows
 * (zs_batch.lora); rows of different adapters share a batch. Background work (fine-tuning,
 * zs_sched_run_work) runs in slices between steps, or rides them, under its share
 * (sched-train.c). Submit validates and makes a request in sched-submit.c and queues it here. The rooms' shared structs are in sched-impl.h;
 * the API in sched.h. */
#include <string.h>

#include "common.h"
#include "sched-impl.h"

/* Takes r, the head of the waiting queue, out of it. */
static void unqueue_head(zs_sched *s, zs_request *r) {
    s->waiting = r->next;
    if (!s->waiting) s->waiting_tail = NULL;
    pthread_mutex_lock(&s->mu);
    s->n_pending--;
    pthread_mutex_unlock(&s->mu);
}

/* Admits waiting requests onto ranks (FIFO; stops at the first that does not fit). */
static void admit(zs_sched *s) {
    if (zs_sched_kv_resume(s)) return; /* preempted requests first */
    while (s->waiting) {
        zs_request *r = s->waiting;
        /* the prompt's full blocks that may come from the cache: all but the last token are
         * enough, the last must be computed for its logits */
        int n_share = r->bh ? ZS_MIN(r->n_bh, (r->n_prompt - 1) / ZS_KV_BLOCK) : 0;
        int total = 0, best = -1, best_hit = -1;
        for (int i = 0; i < s->nranks; i++) {
            total += s->rb[i].n_running;
            if (s->rb[i].n_running >= s->per_rank) continue;
            /* the rank that holds most of the prefix, then the least loaded */
            int hit = n_share > 0 ? zs_sched_kv_prefix_lookup(s, i, r->bh, n_share) : 0;
            if (best < 0 || hit > best_hit || (hit == best_hit && s->rb[i].n_running < s->rb[best].n_running)) {
                best = i;
                best_hit = hit;
            }
        }
        if (best < 0 || total >= s->max_seqs) return;
        zs_kvcache *kv = zs_world_kv(s->w, best);
        /* with a tier, a request that could not run alone even with the whole cache (in memory,
         * or streamed) is refused at once; otherwise it waits for room */
        if (s->kvt && !zs_sched_kv_fits(s, best, r->n_prompt + r->max_tokens)) {
            unqueue_head(s, r);
            zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, ZS_ENOSPC, "the KV cache is too small for this request");
            continue;
        }
        int seq;
        if (zs_kv_seq_open(kv, &seq) < 0) return;
        int shared = n_share > 0 ? zs_sched_kv_prefix_take(s, best, seq, r->bh, n_share) : 0;
        /* without a tier, room for the whole request up front: a running sequence never runs out
         * of blocks; with one, room for its prompt and first token (sched-kv.c grows it) */
        if (zs_sched_kv_reserve(s, best, seq, r) < 0) {
            zs_kv_seq_close(kv, seq);
            if (total == 0 && !s->kvt) { /* cannot fit even alone: fail it rather than wait forever */
                unqueue_head(s, r);
                zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, ZS_ENOSPC, "the KV cache is too small for this request");
                continue;
            }
            return;
        }
        unqueue_head(s, r);
        r->state = RQ_RUNNING;
        r->admit_no = ++s->admit_seq;
        r->rank = best;
        r->seq = seq;
        r->n_done = shared * ZS_KV_BLOCK;
        r->n_pub = shared;
        if (n_share > 0) {
            pthread_mutex_lock(&s->mu);
            s->st.prefix_lookup_blocks += (uint64_t)n_share;
            s->st.prefix_hit_blocks += (uint64_t)shared;
            s->st.prefix_hit_tokens += (uint64_t)shared * ZS_KV_BLOCK;
            pthread_mutex_unlock(&s->mu);
        }
        s->rb[best].running[s->rb[best].n_running++] = r;
    }
}

/* Builds every rank's batch; returns the total token count. Per rank: each decoding sequence's
 * token, then its drafts (sched-spec.c chooses them in the room the decode tokens and the prompt
 * chunks leave), then prompt chunks, oldest first, up to the token budget. */
static int build_batches(zs_sched *s, zs_batch *bs, float **lg) {
    int total = 0;
    int base[s->nranks], room[s->nranks];
    for (int i = 0; i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        int dec = 0, prompt = 0, finals = 0;
        for (int j = 0; j < b->n_running; j++) {
            zs_request *r = b->running[j];
            if (r->n_done >= r->n_ctx) dec++;
        }
        dec = ZS_MIN(dec, s->max_batch);
        for (int j = 0; j < b->n_running && dec + prompt < s->max_batch; j++) {
            zs_request *r = b->running[j];
            if (r->n_done >= r->n_ctx) continue;
            int c = ZS_MIN(r->n_ctx - r->n_done, s->max_batch - dec - prompt);
            prompt += c;
            finals += r->n_gen == 0 && r->n_done + c == r->n_ctx && !r->embed;
        }
        base[i] = dec + prompt;
        room[i] = ZS_MIN(s->max_batch - base[i], b->logit_rows - dec - finals);
    }
    if (s->spec_on) zs_sched_spec_plan(s, base, room);
    for (int i = 0; i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        int n = 0, nl = 0, any_lora = 0, any_embed = 0, any_tree = 0, nm = 0;
        /* decode tokens first, so running sequences always advance; each with its drafts: a chain
         * (positions p+1, p+2, ..) or a tree (node j in slot p+1+j at position p+1+its depth,
         * attending to its path: zs_batch.tree); and the moves of the last tree's accepted path */
        for (int j = 0; j < b->n_running && n < s->max_batch; j++) {
            zs_request *r = b->running[j];
            if (r->n_done < r->n_ctx) continue;
            int nd = s->spec_on ? r->n_draft : 0, p = r->n_prompt + r->n_gen - 1, root = n, depth[ZS_SPEC_MAX_TOKENS];
            for (int d = 0; d <= nd; d++) {
                int pa = d == 0 ? -1 : r->dpar[d - 1];
                if (d > 0) depth[d - 1] = pa < 0 ? 1 : depth[pa] + 1;
                b->tok[n] = d == 0 ? r->last_tok : r->draft[d - 1];
                b->pos[n] = d == 0 ? p : p + depth[d - 1];
                b->slot[n] = p + d;
                b->parent[n] = d == 0 ? -1 : pa < 0 ? root : root + 1 + pa;
                b->seq[n] = r->seq;
                b->lidx[n] = nl;
                b->lora[n] = r->lora;
                b->row_req[nl++] = r;
                n++;
            }
            any_tree |= nd > 0 && (r->tree || s->chains_as_trees);
            for (int m = 0; m < r->n_moves; m++) b->moves[nm++] = r->moves[m];
            r->n_moves = 0;
            any_lora |= r->lora != NULL;
        }
        /* then prompt chunks, oldest first, up to the token budget */
        for (int j = 0; j < b->n_running && n < s->max_batch; j++) {
            zs_request *r = b->running[j];
            if (r->n_done >= r->n_ctx) continue;
            int c = ZS_MIN(r->n_ctx - r->n_done, s->max_batch - n);
            for (int k = 0; k < c; k++) {
                b->tok[n + k] = r->prompt[r->n_done + k];
                b->pos[n + k] = b->slot[n + k] = r->n_done + k;
                b->parent[n + k] = -1;
                b->seq[n + k] = r->seq;
                b->lidx[n + k] = -1;
                b->lora[n + k] = r->lora;
            }
            any_lora |= r->lora != NULL;
            any_embed |= r->embed;
            if (r->n_gen == 0 && r->n_done + c == r->n_ctx && !r->embed) { /* not a recompute's last row */
                b->lidx[n + c - 1] = nl;
                b->row_req[nl++] = r;
            }
            n += c;
        }
        b->tree = (zs_batch_tree){any_tree ? b->slot : NULL, any_tree ? b->parent : NULL, b->moves, nm};
        bs[i] = (zs_batch){n, b->tok, b->pos, b->seq, b->lidx, nl, any_lora ? b->lora : NULL,
                           any_embed ? b->hidden : NULL, any_tree || nm ? &b->tree : NULL};
        lg[i] = b->logits;
        total += n;
    }
    return total;
}

/* KV block counts for /metrics, taken on the engine thread (the caches are not shared). */
static void publish_kv(zs_sched *s) {
    int used = 0, total = 0, cached = 0;
    uint64_t ev = 0;
    for (int i = 0; i < s->nranks; i++) {
        used += zs_kv_used_blocks(zs_world_kv(s->w, i));
        total += zs_kv_total_blocks(zs_world_kv(s->w, i));
        cached += zs_kv_cached_blocks(zs_world_kv(s->w, i));
        ev += zs_kv_evictions(zs_world_kv(s->w, i));
    }
    pthread_mutex_lock(&s->mu);
    s->st.kv_used = used;
    s->st.kv_total = total;
    s->st.kv_cached = cached;
    s->st.prefix_evictions = ev;
    s->st.kv_preempted_now = zs_sched_kv_preempted(s);
    zs_sched_kv_prefix_stats(s, &s->st);
    zs_sched_kv_stream_stats(s, &s->st);
    pthread_mutex_unlock(&s->mu);
}

/* Ends r, cancelled or (zs_sched_fail_lora) failed; every request is cancelled when stop. */
static void end_cancelled(zs_sched *s, zs_request *r, int stop) {
    if (!stop && atomic_load(&r->failed)) zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, ZS_ECANCELLED, r->fail_msg);
    else zs_sreq_finish(s, r, ZS_DONE_CANCELLED, "", 0, ZS_ECANCELLED, "cancelled");
}

/* Ends the waiting and running requests that were cancelled or failed (all of them when stop). */
static void reap(zs_sched *s, int stop) {
    for (zs_request **pp = &s->waiting; *pp;) {
        zs_request *r = *pp;
        if (stop || atomic_load(&r->cancelled) || atomic_load(&r->failed)) {
            *pp = r->next;
            if (s->waiting_tail == r) s->waiting_tail = NULL;
            pthread_mutex_lock(&s->mu);
            s->n_pending--;
            pthread_mutex_unlock(&s->mu);
            end_cancelled(s, r, stop);
        } else {
            pp = &r->next;
        }
    }
    if (!s->waiting_tail)
        for (zs_request *r = s->waiting; r; r = r->next) s->waiting_tail = r;
    for (int i = 0; i < s->nranks; i++)
        for (int j = s->rb[i].n_running - 1; j >= 0; j--) {
            zs_request *r = s->rb[i].running[j];
            if (stop || atomic_load(&r->failed) || atomic_load(&r->cancelled)) end_cancelled(s, r, stop);
        }
}

/* A step failed: every sequence that took part in it fails with it. */
static void step_failed(zs_sched *s, const zs_batch *bs, int rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zs_errmsg());
    zs_log_error("engine step failed: %s", msg);
    for (int i = 0; i < s->nranks; i++)
        for (int j = s->rb[i].n_running - 1; j >= 0; j--) {
            zs_request *r = s->rb[i].running[j];
            int in_step = 0;
            for (int k = 0; k < bs[i].n; k++) in_step |= bs[i].seq[k] == r->seq;
            if (in_step) zs_sreq_finish(s, r, ZS_DONE_ERROR, "", 0, rc, msg);
        }
}

/* A step's rows of rank i back to their requests: prompt progress (embedding rows pooled), the
 * completed prompt blocks to the prefix cache, the logits rows sampled, finished embeddings. */
static void step_done(zs_sched *s, int i, const zs_batch *bt) {
    zs_sched_rank *b = &s->rb[i];
    uint64_t prompt_tokens = 0;
    for (int k = 0; k < bt->n; k++)
        for (int j = 0; j < b->n_running; j++) {
            zs_request *r = b->running[j];
            if (r->seq == bt->seq[k] && r->n_done < r->n_ctx && bt->pos[k] == r->n_done) {
                if (r->embed) zs_sched_embed_row(s, r, bt->hidden + (size_t)k * s->dim);
                r->n_done++;
                prompt_tokens++;
            }
        }
    zs_sched_prefix_publish(s, i);
    if (prompt_tokens) { /* counted before any callback of the step (a finished embedding's) */
        pthread_mutex_lock(&s->mu);
        s->st.prompt_tokens += prompt_tokens;
        pthread_mutex_unlock(&s->mu);
    }
    zs_sched_con_masks(s->vocab, b->row_req, b->logits, bt->n_logits);
    /* each request's rows: its decode row and its drafts' (verified down the chain or tree), or
     * the last prompt row's */
    for (int l = 0; l < bt->n_logits;) {
        zs_request *r = b->row_req[l];
        int nd = 0;
        while (l + nd + 1 < bt->n_logits && b->row_req[l + nd + 1] == r) nd++;
        if (nd == 0) r->n_draft = 0; /* a prompt's last row, or a decode row without drafts */
        zs_sched_spec_verify(s, r, b->logits + (size_t)l * s->vocab);
        l += nd + 1;
    }
    /* embedding requests whose last token was in this step end with their vector */
    for (int j = b->n_running - 1; j >= 0; j--) {
        zs_request *r = b->running[j];
        if (r->embed && r->n_done == r->n_prompt) zs_sched_embed_finish(s, r);
    }
}

/* Whether a request waits for its first token (waiting, or its prompt not yet computed): background
 * work then waits a step, so that it adds nothing to time to first token (its share is kept over
 * the following steps). */
static int first_tokens(zs_sched *s) {
    if (s->waiting || s->preempted) return 1;
    for (int i = 0; i < s->nranks; i++)
        for (int j = 0; j < s->rb[i].n_running; j++)
            if (s->rb[i].running[j]->n_done < s->rb[i].running[j]->n_ctx) return 1;
    return 0;
}

/* Whether another serving step surely follows this one: a request is waiting, or one running
 * still has prompt to compute or more than one token to go (EOS may still end it sooner). */
static int more_steps(zs_sched *s) {
    if (s->waiting || s->preempted) return 1;
    for (int i = 0; i < s->nranks; i++)
        for (int j = 0; j < s->rb[i].n_running; j++) {
            const zs_request *r = s->rb[i].running[j];
            if (r->embed ? r->n_done + s->max_batch < r->n_prompt : r->n_done < r->n_ctx || r->max_tokens - r->n_gen > 1)
                return 1;
        }
    pthread_mutex_lock(&s->mu);
    int in = s->inbox != NULL;
    pthread_mutex_unlock(&s->mu);
    return in;
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
        while (!s->stop && !s->inbox && !s->waiting && !s->preempted && !busy && !zs_sched_train_pending(s))
            pthread_cond_wait(&s->cv, &s->mu);
        /* take the inbox */
        if (s->inbox) {
            if (s->waiting_tail) s->waiting_tail->next = s->inbox;
            else s->waiting = s->inbox;
            s->waiting_tail = s->inbox_tail;
            s->inbox = s->inbox_tail = NULL;
        }
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);

        reap(s, stop);
        zs_sched_kv_reap(s, stop);
        if (stop) break;

        zs_sched_kv_grow(s);
        admit(s);
        publish_kv(s);
        zs_sched_train_speculation(s);
        int serving = 0;
        for (int i = 0; i < s->nranks; i++) serving += s->rb[i].n_running;
        /* background work alone (without mu: requests submitted meanwhile wait in the inbox for
         * at most one slice) */
        if (!serving && zs_sched_train_turn(s, 0)) {
            zs_sched_train_slice(s, 0);
            continue;
        }
        if (build_batches(s, bs, lg) == 0) continue;
        /* with requests: when it is the work's turn, it rides this step or runs right after it */
        zs_pass_range next;
        int declared = 0, after = 0;
        const zs_world_rider *rider = zs_sched_train_plan(s, &next, &declared, &after, first_tokens(s));
        if (!declared && zs_sched_train_declares(s) && more_steps(s)) {
            next = zs_gather_kind_range(zs_world_gather(s->w, 0), ZS_PASS_INFER); /* serving goes on */
            declared = 1;
        }
        zs_world_step_opts so = {rider, declared ? &next : NULL};
        zs_gather_stats g0, g1;
        zs_world_stats(s->w, &g0);
        uint64_t gen0 = s->st.generated_tokens; /* written by this thread only */
        double t0 = zs_now();
        int rc = zs_world_step_ex(s->w, bs, lg, rider || declared ? &so : NULL);
        double dt = zs_now() - t0;
        zs_world_stats(s->w, &g1);
        double ride_s = zs_sched_train_after_step(s, dt, rc);
        zs_sched_kv_step_done(s, dt);
        if (rc == 0) {
            int rows = 0;
            for (int i = 0; i < s->nranks; i++) rows += bs[i].n;
            zs_engine_plan_observe(s->e, rows, dt - ride_s, g1.stall_s - g0.stall_s, (double)(g1.bytes_nvme - g0.bytes_nvme));
        }
        if (rc < 0) step_failed(s, bs, rc);
        else
            for (int i = 0; i < s->nranks; i++) step_done(s, i, &bs[i]);
        int most = 0;
        for (int i = 0; i < s->nranks; i++) most = ZS_MAX(most, bs[i].n);
        zs_sched_spec_step(s, most, dt - ride_s, g1.stall_s - g0.stall_s,
                           rc < 0 ? 0 : (int)(s->st.generated_tokens - gen0));
        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        pthread_mutex_unlock(&s->mu);
        publish_kv(s);
        if (after) zs_sched_train_slice(s, 1); /* its slice (whose pass the step declared) */
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
    s->prefix = !(o && o->no_prefix_cache);
    if (zs_sched_kv_init(s) < 0) {
        free(s->kvt);
        free(s->kvp);
        free(s->kvs);
        free(s);
        return ZS_ENOMEM;
    }
    zs_sched_train_init(s, o);
    s->tr_fuse = !(o && o->train_no_fuse);
    int src = zs_sched_spec_init(s, o);
    if (src < 0) {
        zs_sched_spec_free(s);
        free(s);
        return src;
    }
    for (int i = 0; s->prefix && i < s->nranks; i++)
        if (zs_kv_prefix_enable(zs_world_kv(s->w, i)) < 0) {
            zs_log_info("prefix cache off: %s", zs_errmsg());
            s->prefix = 0;
        }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->cv_idle, NULL);
    pthread_cond_init(&s->cv_job, NULL);
    zs_sreq_stats_init(&s->st);
    s->rb = calloc((size_t)s->nranks, sizeof *s->rb);
    int ok = s->rb != NULL;
    for (int i = 0; ok && i < s->nranks; i++) {
        zs_sched_rank *b = &s->rb[i];
        b->tok = malloc((size_t)s->max_batch * sizeof(int32_t) * 4);
        b->row_req = calloc((size_t)s->max_batch + 1, sizeof(zs_request *));
        /* a logits row per decode token and per draft: room for 64 drafts a step beyond them */
        b->logit_rows = ZS_MIN(s->max_batch, s->per_rank + 64);
        b->logits = malloc((size_t)b->logit_rows * (size_t)s->vocab * sizeof(float));
        b->running = calloc((size_t)s->per_rank, sizeof(zs_request *));
        b->lora = calloc((size_t)s->max_batch, sizeof(const zs_lora *));
        b->hidden = malloc((size_t)s->max_batch * (size_t)s->dim * sizeof(float));
        b->slot = malloc((size_t)s->max_batch * 2 * sizeof(int32_t));
        b->moves = malloc((size_t)s->per_rank * ZS_SPEC_MAX_TOKENS * sizeof *b->moves);
        ok = b->tok && b->row_req && b->logits && b->running && b->lora && b->hidden && b->slot && b->moves;
        if (ok) b->parent = b->slot + s->max_batch;
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

int zs_sched_submit(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out) {
    zs_request *r = NULL;
    ZS_CHECK(zs_sched_req_new(s, p, sink, &r));
    int rc = 0;
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
        zs_sreq_free(r);
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

/* Waits (under mu) up to timeout_s until no request is left. */
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
        /* zs_sched_run_work callers see stop within their poll and leave */
        pthread_mutex_lock(&s->mu);
        zs_sched_train_wait_callers(s);
        pthread_mutex_unlock(&s->mu);
    }
    /* requests still in the inbox never reached the engine thread */
    while (s->inbox) {
        zs_request *r = s->inbox;
        s->inbox = r->next;
        r->sink.on_done(r->sink.ud, ZS_DONE_CANCELLED, "", 0, r->n_prompt, 0, ZS_ECANCELLED, "cancelled");
        zs_sreq_free(r);
    }
    for (int i = 0; s->rb && i < s->nranks; i++) {
        free(s->rb[i].tok);
        free(s->rb[i].row_req);
        free(s->rb[i].logits);
        free(s->rb[i].running);
        free(s->rb[i].lora);
        free(s->rb[i].hidden);
        free(s->rb[i].slot);
        free(s->rb[i].moves);
    }
    free(s->rb);
    free(s->kvt);
    free(s->kvp);
    free(s->kvs);
    zs_sched_spec_free(s);
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

/* spec-draft.c — the draft model proposer of speculative decoding (spec.h): a small model that
 * shares the target's vocabulary runs beside it, resident on one CPU rank with its own KV cache,
 * on the scheduler's engine thread, and its greedy continuation of each sequence is the drafts.
 *
 * The draft keeps one KV sequence per key (a slot), with the tokens its KV holds. A proposal
 * for a sequence first rolls the slot back to the longest prefix that is still the sequence's
 * (the drafts the target rejected are simply overwritten), then feeds the rest of the
 * sequence's tokens; the logits of its last token give the first draft, and each further
 * decode step feeds the previous draft and gives the next. Every phase is batched across the
 * proposal's sequences: catch-up tokens in chunks of up to max_batch_tokens, decode steps with
 * one row per sequence. Drafts are argmaxes (lowest id among ties): deterministic, as
 * zs_sampler_verify assumes. A sequence with no slot or KV room left, past the draft's
 * context, or holding an id the draft model has no row for, gets no drafts this time. With a
 * sliding-window ring (a model whose every layer is windowed) a rollback that reaches positions
 * the ring has overwritten starts the slot over.
 * Slots of keys not in the current proposal are taken back least recently used first when
 * every slot is held (the scheduler releases keys as their requests end: this only matters for
 * callers that do not). Engine thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "device.h"
#include "spec.h"

typedef struct {
    uintptr_t key;   /* the sequence (0: a free slot) */
    int seq;         /* its KV sequence in the draft's cache */
    int n;           /* KV positions [0, n) hold tok[0..n) */
    int hw;          /* positions written so far reach hw (exclusive): what a window ring has lost */
    int32_t *tok;    /* [context] */
    uint64_t used;   /* the proposal that last used it */
} dslot;

typedef struct {     /* one sequence of the proposal under way */
    zs_spec_req *q;
    dslot *sl;
    int next;        /* the next position to feed in the catch-up */
    int k;           /* drafts to make (<= q->k) */
    int nd;          /* drafts made */
    int pending;     /* tokens of it in the batch being run */
} act_t;

typedef struct {
    zs_spec base;
    zs_engine *e;             /* the draft engine (owned) */
    zs_kvcache *kv;           /* its cache */
    int context;              /* its context: positions < context */
    int max_batch;            /* tokens per forward call */
    int vocab;                /* ids a draft may take: the shared tokenizer's count */
    int lvocab;               /* the draft model's logits row width */
    int window, ring;         /* sliding window and ring blocks of its cache (0: none) */
    int nslots;               /* KV sequences it keeps */
    int rows;                 /* logits rows per call */
    dslot *slots;
    act_t *acts;              /* [nslots] */
    int32_t *tok, *pos, *seq, *lidx;  /* batch arrays [max_batch] */
    int *row_act;             /* the act of each logits row [rows] */
    float *logits;            /* [rows, lvocab] */
    uint64_t clock;           /* proposals so far */
    zs_spec_draft_stats st;
} draft;

/* ---------- the vocabulary check ---------- */

/* bytes for a message: printable ASCII as is, the rest as \xNN, at most 48 characters */
static void show(const char *b, size_t n, char *out, size_t cap) {
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n && o + 8 < cap && o < 48; i++) {
        unsigned char c = (unsigned char)b[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o++] = '"';
    out[o] = 0;
}

static int vocab_check(const zs_tokenizer *d, const char *dpath, const zs_tokenizer *t, const char *tpath) {
    int nd = zs_tokenizer_vocab_size(d), nt = zs_tokenizer_vocab_size(t);
    if (nd != nt)
        return zs_err(ZS_EINVAL, "--draft-model %s: its vocabulary (%d tokens) is not the target %s's (%d tokens); the "
                      "draft must share the target's tokenizer", dpath, nd, tpath, nt);
    for (int id = 0; id < nd; id++) {
        size_t ld = 0, lt = 0;
        const char *bd = zs_tokenizer_token_bytes(d, id, &ld), *bt = zs_tokenizer_token_bytes(t, id, &lt);
        if (ld != lt || (ld && memcmp(bd, bt, ld))) {
            char sd[64], st[64];
            show(bd, ld, sd, sizeof sd);
            show(bt, lt, st, sizeof st);
            return zs_err(ZS_EINVAL, "--draft-model %s: its vocabulary differs from the target %s's at token %d (%s there, "
                          "%s in the target); the draft must share the target's tokenizer", dpath, tpath, id, sd, st);
        }
        if (zs_tokenizer_is_eos(d, id) != zs_tokenizer_is_eos(t, id))
            return zs_err(ZS_EINVAL, "--draft-model %s: token %d ends a sequence in %s but not in the other (the target is "
                          "%s)", dpath, id, zs_tokenizer_is_eos(d, id) ? "the draft" : "the target", tpath);
    }
    if (zs_tokenizer_bos(d) != zs_tokenizer_bos(t))
        return zs_err(ZS_EINVAL, "--draft-model %s: its BOS id is %d but the target %s's is %d", dpath, zs_tokenizer_bos(d),
                      tpath, zs_tokenizer_bos(t));
    if (zs_tokenizer_eos(d) != zs_tokenizer_eos(t))
        return zs_err(ZS_EINVAL, "--draft-model %s: its EOS id is %d but the target %s's is %d", dpath, zs_tokenizer_eos(d),
                      tpath, zs_tokenizer_eos(t));
    return 0;
}

/* ---------- slots ---------- */

static void slot_close(draft *d, dslot *s) {
    zs_kv_seq_close(d->kv, s->seq);
    s->key = 0;
    s->n = s->hw = 0;
}

/* The slot of key, a free one, or the least recently used one not in this proposal; NULL when
 * none can be had. */
static dslot *slot_for(draft *d, uintptr_t key) {
    dslot *free_ = NULL, *lru = NULL;
    for (int i = 0; i < d->nslots; i++) {
        dslot *s = &d->slots[i];
        if (s->key == key) return s;
        if (!s->key) {
            if (!free_) free_ = s;
        } else if (s->used != d->clock && (!lru || s->used < lru->used)) {
            lru = s;
        }
    }
    if (!free_ && lru) {
        slot_close(d, lru);
        free_ = lru;
    }
    if (!free_ || zs_kv_seq_open(d->kv, &free_->seq) < 0) return NULL;
    free_->key = key;
    free_->n = free_->hw = 0;
    return free_;
}

/* With a window ring: 1 when the positions a token at c reads (c - window + 1 .. c - 1) are
 * still in the ring (no later position has overwritten their blocks). */
static int intact(const draft *d, const dslot *s, int c) {
    if (!d->ring || c == 0) return 1;
    int x = c - d->window + 1;
    if (x < 0) x = 0;
    return s->hw <= 0 || (s->hw - 1) / ZS_KV_BLOCK - x / ZS_KV_BLOCK < d->ring;
}

/* ---------- proposing ---------- */

/* argmax of the first vocab logits (lowest id among ties); -1 when one is not finite */
static int argmax(const float *l, int vocab) {
    int best = 0;
    for (int i = 0; i < vocab; i++) {
        if (!(l[i] - l[i] == 0.0f)) return -1; /* NaN or infinite */
        if (l[i] > l[best]) best = i;
    }
    return best;
}

static int run(draft *d, int n, int nl) {
    zs_batch b = {n, d->tok, d->pos, d->seq, d->lidx, nl, NULL, NULL, NULL};
    d->st.passes++;
    d->st.fed += (uint64_t)n;
    return zs_engine_forward(d->e, &b, d->logits);
}

/* Adds token t of act a at position p to the batch (a logits row when row). */
static void put(draft *d, int *n, int *nl, int ai, int32_t t, int p, int row) {
    act_t *a = &d->acts[ai];
    d->tok[*n] = t;
    d->pos[*n] = p;
    d->seq[*n] = a->sl->seq;
    d->lidx[*n] = row ? *nl : -1;
    if (row) d->row_act[(*nl)++] = ai;
    a->sl->tok[p] = t;
    if (p + 1 > a->sl->hw) a->sl->hw = p + 1;
    a->pending++;
    (*n)++;
}

/* The batch ran: its tokens are in the slots' KV; its rows give each act's next draft. */
static void took(draft *d, int na, int nl) {
    for (int i = 0; i < na; i++) {
        act_t *a = &d->acts[i];
        a->sl->n += a->pending;
        a->next += a->pending;
        a->pending = 0;
    }
    for (int r = 0; r < nl; r++) {
        act_t *a = &d->acts[d->row_act[r]];
        int t = argmax(d->logits + (size_t)r * d->lvocab, d->vocab);
        if (t < 0) {
            a->k = a->nd; /* no further drafts for it */
            continue;
        }
        a->q->draft[a->nd++] = t;
    }
}

/* The acts' remaining tokens, chunked; the last of each has the logits of its first draft. */
static int catch_up(draft *d, int na) {
    int i = 0;
    while (i < na) {
        int n = 0, nl = 0;
        while (i < na && n < d->max_batch && nl < d->rows) {
            act_t *a = &d->acts[i];
            int left = a->q->n - a->next, c = ZS_MIN(left, d->max_batch - n);
            for (int j = 0; j < c; j++) {
                int p = a->next + j;
                put(d, &n, &nl, i, a->q->tokens[p], p, j == left - 1);
            }
            if (c < left) break; /* the batch is full: it goes on in the next */
            i++;
        }
        int rc = run(d, n, nl);
        if (rc < 0) return rc;
        took(d, na, nl);
    }
    return 0;
}

/* Decode step j (1..): the acts still drafting feed draft j-1 and get draft j. */
static int decode(draft *d, int na, int j) {
    int i = 0;
    for (;;) {
        int n = 0, nl = 0;
        for (; i < na && n < d->max_batch && nl < d->rows; i++) {
            act_t *a = &d->acts[i];
            if (a->nd != j || a->k <= j) continue;
            put(d, &n, &nl, i, a->q->draft[j - 1], a->q->n - 1 + j, 1);
        }
        if (n == 0) return 0;
        int rc = run(d, n, nl);
        if (rc < 0) return rc;
        took(d, na, nl);
    }
}

static int draft_propose(zs_spec *p, zs_spec_req *reqs, int nreq) {
    draft *d = (draft *)p;
    double t0 = zs_now();
    d->clock++;
    int na = 0, kmax = 0;
    for (int i = 0; i < nreq; i++) {
        zs_spec_req *q = &reqs[i];
        q->n_draft = 0;
        /* the last draft's position, q->n - 2 + k, within the context */
        int k = ZS_MIN(q->k, d->context - q->n + 1);
        if (k <= 0 || q->n < 1 || na >= d->nslots) continue;
        dslot *s = slot_for(d, q->key);
        if (!s) continue;
        s->used = d->clock;
        /* the longest prefix the KV holds that is still the sequence's, short of its last token
         * (whose logits give the first draft) */
        int c = 0, lim = ZS_MIN(s->n, q->n - 1);
        while (c < lim && s->tok[c] == q->tokens[c]) c++;
        if (!intact(d, s, c)) c = 0;
        d->st.rolled += (uint64_t)(s->n - c);
        s->n = c;
        /* an id past the draft's rows (a target with a larger, padded vocabulary): none */
        int bad = 0;
        for (int j = c; j < q->n && !bad; j++) bad = q->tokens[j] < 0 || q->tokens[j] >= d->lvocab;
        if (bad || zs_kv_seq_reserve(d->kv, s->seq, q->n + k - 1) < 0) continue; /* no room: no drafts */
        d->acts[na++] = (act_t){q, s, c, k, 0, 0};
        kmax = ZS_MAX(kmax, k);
    }
    int rc = na ? catch_up(d, na) : 0;
    for (int j = 1; rc == 0 && j < kmax; j++) rc = decode(d, na, j);
    /* a failed call left its slots' n before its tokens (what it wrote is overwritten later) */
    for (int i = 0; i < na; i++) d->acts[i].q->n_draft = rc == 0 ? d->acts[i].nd : 0;
    d->st.seconds += zs_now() - t0;
    return rc;
}

static void draft_release(zs_spec *p, uintptr_t key) {
    draft *d = (draft *)p;
    for (int i = 0; key && i < d->nslots; i++)
        if (d->slots[i].key == key) slot_close(d, &d->slots[i]);
}

static void draft_free(zs_spec *p) {
    draft *d = (draft *)p;
    for (int i = 0; d->slots && i < d->nslots; i++) free(d->slots[i].tok);
    free(d->slots);
    free(d->acts);
    free(d->tok);
    free(d->row_act);
    free(d->logits);
    zs_engine_free(d->e);
    free(d);
}

static const zs_spec_ops draft_ops = {"draft", draft_propose, draft_release, draft_free};

int zs_spec_draft_stats_get(const zs_spec *p, zs_spec_draft_stats *out) {
    if (!p || p->ops != &draft_ops) return zs_err(ZS_EINVAL, "not a draft model proposer");
    const draft *d = (const draft *)p;
    *out = d->st;
    out->seqs = 0;
    for (int i = 0; i < d->nslots; i++) out->seqs += d->slots[i].key != 0;
    out->kv_used = zs_kv_used_blocks(d->kv);
    out->kv_total = zs_kv_total_blocks(d->kv);
    return 0;
}

int zs_spec_draft_new(const zs_engine_opts *o, zs_engine *target, const char *target_path, zs_spec **out) {
    const char *path = o && o->model_dir ? o->model_dir : "";
    if (!o || !o->model_dir || !*o->model_dir || !target)
        return zs_err(ZS_EINVAL, "--draft-model: a model path and the target engine are required");
    const char *tp = target_path && *target_path ? target_path : "model";
    if (zs_engine_device(target) == ZS_DEVICE_CUDA)
        return zs_err(ZS_EUNSUPPORTED, "--draft-model %s: not supported with a target on a CUDA device (the draft model "
                      "runs on the CPU device only); serve with --device cpu, or use --speculative ngram", path);
    if (o->max_seqs < 1 || o->max_batch_tokens < 1)
        return zs_err(ZS_EINVAL, "--draft-model %s: its sequences (%d) and tokens per call (%d) must be >= 1", path,
                      o->max_seqs, o->max_batch_tokens);
    /* the vocabulary first: nothing is loaded for a draft that cannot serve */
    zs_tokenizer *dt = NULL;
    int rc = zs_model_tokenizer_load(path, &dt);
    if (rc < 0) return zs_err_prefix(rc, "--draft-model %s", path);
    rc = vocab_check(dt, path, zs_engine_tokenizer(target), tp);
    int vocab = zs_tokenizer_vocab_size(dt);
    zs_tokenizer_free(dt);
    if (rc < 0) return rc;

    zs_engine_opts eo = *o;
    eo.ranks = 1;
    eo.nvme_path = NULL;
    memset(&eo.gather, 0, sizeof eo.gather);
    eo.gather.tier = ZS_OFFLOAD_NONE;
    eo.zero_stage = 0;
    eo.max_live_params = 0;
    eo.device = ZS_DEVICE_CPU;
    eo.spmd = 0;
    eo.local = 1; /* process 0 alone proposes; the followers only run the target's step plans */
    eo.max_context = zs_engine_context(target);
    draft *d = calloc(1, sizeof *d);
    if (!d) return zs_err(ZS_ENOMEM, "out of memory");
    d->base.ops = &draft_ops;
    rc = zs_engine_open(&eo, &d->e);
    if (rc < 0) {
        free(d);
        return zs_err_prefix(rc, "--draft-model %s", path);
    }
    const zs_model_config *c = zs_model_config_get(zs_engine_model(d->e));
    d->kv = zs_engine_kv(d->e);
    d->context = zs_engine_context(d->e);
    d->max_batch = zs_engine_max_batch_tokens(d->e);
    d->vocab = vocab;
    d->lvocab = c->vocab_size;
    d->ring = zs_kv_ring(d->kv);
    d->window = d->ring ? c->sliding_window : 0;
    d->nslots = zs_kv_max_seqs(d->kv);
    d->rows = ZS_MIN(d->nslots, d->max_batch);
    d->slots = calloc((size_t)d->nslots, sizeof *d->slots);
    d->acts = calloc((size_t)d->nslots, sizeof *d->acts);
    d->tok = malloc((size_t)d->max_batch * 4 * sizeof *d->tok);
    d->row_act = malloc((size_t)d->rows * sizeof *d->row_act);
    d->logits = malloc((size_t)d->rows * (size_t)d->lvocab * sizeof *d->logits);
    int ok = d->slots && d->acts && d->tok && d->row_act && d->logits;
    for (int i = 0; ok && i < d->nslots; i++) ok = (d->slots[i].tok = malloc((size_t)d->context * sizeof(int32_t))) != NULL;
    if (!ok) {
        draft_free(&d->base);
        return zs_err(ZS_ENOMEM, "--draft-model %s: out of memory", path);
    }
    d->pos = d->tok + d->max_batch;
    d->seq = d->pos + d->max_batch;
    d->lidx = d->seq + d->max_batch;
    zs_log_info("draft model %s: %d layers, dim %d, %d sequences of up to %d positions (%d KV blocks)", path, c->n_layers,
                c->dim, d->nslots, d->context, zs_kv_total_blocks(d->kv));
    *out = &d->base;
    return 0;
}

/* spec-ngram.c — prompt lookup decoding: drafts copied from earlier in the sequence. For the
 * longest n (max_ngram down to min_ngram) whose last n tokens occurred before, the most recent
 * earlier occurrence is taken and the up to k tokens that followed it are the drafts. It needs
 * no model and helps where answers copy their input (edits, summaries, code, extraction,
 * structured outputs). Deterministic; keeps no state between calls.
 *
 * Trees (zs_spec_req.parent): the continuations of up to TREE_OCC earlier occurrences, most recent
 * first, of the longest suffixes (an occurrence counts once, at the longest n it matches), merged
 * into a trie under the last token. An occurrence of an n-token suffix weighs 2^(n - min_ngram):
 * the longer the context it agrees on, the more it counts. A node's share is its weight (the
 * occurrences through it) over its parent's; its score the product of DEPTH_W · share along its
 * path (a deeper node needs every node above it accepted: without the discount one continuation
 * would fill the k nodes before any alternative got one); the k best nodes by score (ties: the one
 * inserted first, so a parent before its children and the most recent occurrence's continuation
 * before the others) are the tree. One continuation alone gives the chain above. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "spec.h"

typedef struct {
    zs_spec base;
    int min_n, max_n;
} ngram;

/* The drafts of one sequence: the continuation of the latest earlier match of its last n tokens. */
static int lookup(const ngram *g, const int32_t *t, int n, int k, int32_t *draft) {
    for (int len = ZS_MIN(g->max_n, n - 1); len >= g->min_n; len--) {
        const int32_t *suffix = t + n - len;
        /* an occurrence ending before the last token, so that something follows it */
        for (int end = n - 2; end >= len - 1; end--) {
            if (t[end] != suffix[len - 1] || memcmp(t + end - len + 1, suffix, (size_t)len * sizeof *t)) continue;
            int m = ZS_MIN(k, n - 1 - end);
            memcpy(draft, t + end + 1, (size_t)m * sizeof *t);
            return m;
        }
    }
    return 0;
}

#define TREE_OCC 16                        /* earlier occurrences merged at most */
#define TREE_NODES (4 * ZS_SPEC_MAX_TOKENS) /* trie nodes at most */
#define DEPTH_W 0.7                         /* a level's discount in the ranking */

typedef struct {
    int32_t tok;
    int parent;       /* trie index (0: the root, the last token) */
    int child, next;  /* first child, next sibling (-1: none) */
    double w;         /* weight of the occurrences through it */
    double score;     /* product of DEPTH_W · share on its path */
} tnode;

/* Adds continuation c[0..m) with weight w under the root tr[0] of the trie (n nodes so far, the
 * root included); returns the new node count. A new node goes after its siblings. */
static int trie_add(tnode *tr, int n, const int32_t *c, int m, double w) {
    int at = 0;
    for (int i = 0; i < m; i++) {
        int x = tr[at].child, last = -1;
        while (x >= 0 && tr[x].tok != c[i]) {
            last = x;
            x = tr[x].next;
        }
        if (x < 0) {
            if (n == TREE_NODES + 1) break;
            x = n++;
            tr[x] = (tnode){c[i], at, -1, -1, 0.0, 0.0};
            if (last < 0) tr[at].child = x;
            else tr[last].next = x;
        }
        tr[x].w += w;
        at = x;
    }
    return n;
}

static int lookup_tree(const ngram *g, const int32_t *t, int n, int k, int32_t *draft, int32_t *parent, float *share) {
    tnode tr[TREE_NODES + 1];
    int nn = 1, nocc = 0, used[TREE_OCC];
    tr[0] = (tnode){t[n - 1], -1, -1, -1, 0.0, 1.0};
    for (int len = ZS_MIN(g->max_n, n - 1); len >= g->min_n && nocc < TREE_OCC; len--) {
        const int32_t *suffix = t + n - len;
        double w = ldexp(1.0, len - g->min_n); /* n-grams may be 64 long: no integer shift */
        for (int end = n - 2; end >= len - 1 && nocc < TREE_OCC; end--) {
            if (t[end] != suffix[len - 1] || memcmp(t + end - len + 1, suffix, (size_t)len * sizeof *t)) continue;
            int seen = 0; /* counted already at a longer n */
            for (int i = 0; i < nocc && !seen; i++) seen = used[i] == end;
            if (seen) continue;
            used[nocc++] = end;
            tr[0].w += w;
            nn = trie_add(tr, nn, t + end + 1, ZS_MIN(k, n - 1 - end), w);
        }
    }
    /* shares and scores, in insertion order (a parent before its children) */
    for (int x = 1; x < nn; x++) tr[x].score = tr[tr[x].parent].score * DEPTH_W * tr[x].w / tr[tr[x].parent].w;
    /* the k best by score, ties by insertion, each once its parent is in (a child's score is at
     * most its parent's, so these are the k best, in an order that puts parents first) */
    int pick[TREE_NODES + 1], out[TREE_NODES + 1], m = 0;
    for (int x = 0; x < nn; x++) out[x] = -1;
    while (m < k) {
        int best = -1;
        for (int x = 1; x < nn; x++)
            if (out[x] < 0 && (tr[x].parent == 0 || out[tr[x].parent] >= 0) &&
                (best < 0 || tr[x].score > tr[best].score))
                best = x;
        if (best < 0) break;
        out[best] = m;
        pick[m++] = best;
    }
    for (int j = 0; j < m; j++) {
        const tnode *x = &tr[pick[j]];
        draft[j] = x->tok;
        parent[j] = x->parent == 0 ? -1 : out[x->parent];
        share[j] = (float)(x->w / tr[x->parent].w);
    }
    return m;
}

static int ngram_propose(zs_spec *p, zs_spec_req *reqs, int n) {
    const ngram *g = (const ngram *)p;
    for (int i = 0; i < n; i++) {
        zs_spec_req *q = &reqs[i];
        q->n_draft = q->parent && q->share ? lookup_tree(g, q->tokens, q->n, q->k, q->draft, q->parent, q->share)
                                           : lookup(g, q->tokens, q->n, q->k, q->draft);
    }
    return 0;
}

static void ngram_free(zs_spec *p) { free(p); }

static const zs_spec_ops ngram_ops = {"ngram", ngram_propose, NULL, ngram_free};

int zs_spec_ngram_new(int min_ngram, int max_ngram, zs_spec **out) {
    if (min_ngram < 1 || max_ngram < min_ngram || max_ngram > 64)
        return zs_err(ZS_ERANGE, "prompt lookup: n-grams of %d to %d tokens (1 <= min <= max <= 64)", min_ngram, max_ngram);
    ngram *g = calloc(1, sizeof *g);
    if (!g) return zs_err(ZS_ENOMEM, "out of memory");
    g->base.ops = &ngram_ops;
    g->min_n = min_ngram;
    g->max_n = max_ngram;
    *out = &g->base;
    return 0;
}

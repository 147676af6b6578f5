/* spec-ngram.c — prompt lookup decoding: drafts copied from earlier in the sequence. For the
 * longest n (max_ngram down to min_ngram) whose last n tokens occurred before, the most recent
 * earlier occurrence is taken and the up to k tokens that followed it are the drafts. It needs
 * no model and helps where answers copy their input (edits, summaries, code, extraction,
 * structured outputs). Deterministic; keeps no state between calls. */
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

static int ngram_propose(zs_spec *p, zs_spec_req *reqs, int n) {
    const ngram *g = (const ngram *)p;
    for (int i = 0; i < n; i++) reqs[i].n_draft = lookup(g, reqs[i].tokens, reqs[i].n, reqs[i].k, reqs[i].draft);
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

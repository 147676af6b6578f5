/* spec.h — proposers of draft tokens for speculative decoding: the scheduler asks one for up to k
 * tokens per running sequence before a step, puts them in the step after the sequence's decode
 * token, and verifies them from the step's logits (sched-spec.c, sched-sample.c).
 * Proposers choose their drafts deterministically (the verification rule assumes it:
 * zs_sampler_verify). Two kinds: prompt lookup (spec-ngram.c: n-grams of the prompt and the text
 * so far) and a draft model (spec-draft.c: a small resident model with its own KV cache).
 * Ownership: the scheduler borrows a proposer; its creator frees it after the scheduler.
 * Thread-safety: one thread (the scheduler's engine thread) calls it. */
#ifndef ZS_SPEC_H
#define ZS_SPEC_H

#include <stdint.h>

#include "engine.h"

#define ZS_SPEC_MAX_TOKENS 16   /* drafts per sequence and step at most */

/* One sequence's request for drafts: a chain (draft j follows draft j - 1; the first follows the
 * last of tokens), or, when the caller gives parent, a tree: several continuations at once, which
 * the scheduler verifies in one pass (sched-spec.c, model.h zs_batch.tree). */
typedef struct {
    uintptr_t key;          /* the sequence, stable while it runs (the draft model's KV slot) */
    const int32_t *tokens;  /* its prompt and generated tokens so far, in order */
    int n;                  /* how many (>= 1) */
    int k;                  /* drafts wanted (1..ZS_SPEC_MAX_TOKENS): a chain's tokens, a tree's nodes */
    int32_t *draft;         /* out: the drafts, up to k */
    int n_draft;            /* out: how many (0: none to offer) */
    /* NULL: a chain. Else room for k entries, and out: draft j's parent, -1 (the last of tokens)
     * or an earlier draft's index (< j): a tree in node order, best first, so that every leading
     * part of it is a tree too. zs_spec_propose fills a chain (j - 1) before the proposer runs:
     * a proposer that knows only chains leaves it. */
    int32_t *parent;
    /* with parent, out: draft j's share, the proposer's estimate of the chance that the next
     * token is draft j, given its parent and that it is one of draft j's siblings (siblings sum to
     * at most 1; 1 for a draft without siblings). zs_spec_propose fills 1s before the proposer runs. */
    float *share;
} zs_spec_req;

typedef struct zs_spec zs_spec;
typedef struct {
    const char *name;                                          /* "ngram", "draft" */
    int (*propose)(zs_spec *p, zs_spec_req *reqs, int n);      /* fills draft/n_draft of each */
    void (*release)(zs_spec *p, uintptr_t key);                /* the sequence has ended */
    void (*free)(zs_spec *p);
} zs_spec_ops;
struct zs_spec {
    const zs_spec_ops *ops;
};

/* Drafts for n sequences at once (0, or an error: no drafts, the step runs without them). */
int  zs_spec_propose(zs_spec *p, zs_spec_req *reqs, int n);
void zs_spec_release(zs_spec *p, uintptr_t key);
const char *zs_spec_name(const zs_spec *p);
void zs_spec_free(zs_spec *p);   /* NULL is fine */

#define ZS_SPEC_NGRAM_MIN 2      /* serve --speculative ngram: n-grams of 2 to 4 tokens */
#define ZS_SPEC_NGRAM_MAX 4

/* Prompt lookup: the longest suffix of the tokens (max_ngram down to min_ngram long) that occurred
 * before, most recent occurrence first; the tokens that followed it are the drafts. Asked for a
 * tree (zs_spec_req.parent), it offers the continuations of several earlier occurrences at once
 * (spec-ngram.c). */
int  zs_spec_ngram_new(int min_ngram, int max_ngram, zs_spec **out);

/* A draft model (spec-draft.c): a second, small engine with resident weights on one CPU rank and
 * its own KV cache, whose greedy continuation of each sequence is the drafts. It keeps a KV
 * sequence per key: a proposal first feeds the tokens the target accepted since the draft last
 * saw the sequence (its KV is rolled back to the longest prefix still the sequence's: rejected
 * drafts are overwritten), chunked and batched across sequences, then runs up to k decode steps
 * with one row per sequence; release frees the key's KV blocks. A sequence beyond the draft's
 * KV room or context gets no drafts (not an error).
 * draft: the draft engine's options: model_dir (a Hugging Face directory or a GGUF file), model
 * (weight dtype, quant mix, embed_lookup), max_seqs (the sequences it keeps at once: the
 * scheduler's max_seqs), max_batch_tokens (tokens per draft forward call), kv_dtype, kv_bytes;
 * the rest is set here: one rank, resident weights (no offload), the CPU device, the target's
 * context (or the draft model's, when shorter). The draft's vocabulary must be the target's:
 * the same token count, every token's bytes (zs_tokenizer_token_bytes) and BOS/EOS ids; a
 * mismatch is ZS_EINVAL naming both paths (target_path names the target in messages).
 * Refused (ZS_EUNSUPPORTED): a target on a CUDA device, several processes (mpirun). Load errors
 * are the engine's. The target must outlive the proposer. */
int  zs_spec_draft_new(const zs_engine_opts *draft, zs_engine *target, const char *target_path, zs_spec **out);

/* What a draft model proposer holds and has done (for tests and logs). */
typedef struct {
    int seqs;          /* sequences whose KV it keeps */
    int kv_used;       /* its KV blocks held by them */
    int kv_total;      /* its KV blocks */
    uint64_t passes;   /* draft forward calls */
    uint64_t fed;      /* tokens fed (catch-up and drafts) */
    uint64_t rolled;   /* KV positions rolled back (rejected drafts, or a window's lost history) */
    double seconds;    /* time spent proposing */
} zs_spec_draft_stats;
/* ZS_EINVAL when p is not a draft model proposer. */
int  zs_spec_draft_stats_get(const zs_spec *p, zs_spec_draft_stats *out);

#endif

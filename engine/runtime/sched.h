/* sched.h — the request scheduler (DESIGN.md §4): generation and embedding requests queued and
 * run by continuous batching on one engine thread, with cancellation, idle jobs (fine-tuning
 * steps), speculative decoding and the counters behind /metrics. The how is in the .c files:
 * sched.c (the loop), sched-submit.c, sched-sample.c, sched-constrain.c, sched-embed.c,
 * sched-prefix.c, sched-train.c, sched-spec.c.
 * Ownership: submit copies the prompt and stop strings; lora and the constraint (and all it
 * points to) are borrowed until on_done has returned, and so is the zs_request handle valid.
 * Thread-safety: submit, cancel, drain, fail_lora, run_work and run_idle (not from the engine thread) and
 * stats_get from any thread; sink callbacks run on the engine thread and must not block. */
#ifndef ZS_SCHED_H
#define ZS_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "jsonschema.h"
#include "sampler.h"
#include "spec.h"

enum { ZS_POOL_MEAN = 0, ZS_POOL_LAST = 1 };                 /* zs_req_params.pooling */
enum { ZS_DONE_STOP = 0, ZS_DONE_LENGTH = 1, ZS_DONE_CANCELLED = 2, ZS_DONE_ERROR = 3 };  /* finish */
#define ZS_REQ_MAX_END_IDS 4
#define ZS_SCHED_LAT_BUCKETS 12

typedef struct {
    int max_seqs;          /* running sequences at most (default 32, capped by the engine's KV slots) */
    int max_batch_tokens;  /* tokens per engine step (default 256) */
    int max_queue;         /* waiting requests at most; beyond it submit returns ZS_EBUSY (default 256) */
    int no_prefix_cache;   /* 1: no prefix caching (on by default; sched-prefix.c) */
    zs_spec *spec;         /* a proposer of draft tokens (spec.h), or NULL: no speculation; borrowed */
    int spec_tokens;       /* drafts per sequence and step: 0 chosen from measured costs, N at most N */
    int no_drafts;         /* 1: one token per sequence and step, also for a constraint's forced
                              tokens (plain decoding: what the tests compare speculation with) */
    int spec_tree;         /* 1: drafts may form trees (several continuations verified in one pass;
                              the proposer is asked for its best tree of up to 16 nodes and the
                              plan keeps the nodes worth their rows); 0: chains */
    /* Background work (fine-tuning slices, sched-train.c): its share of the engine's time while
     * serving has work too, 0..1 (0: it runs only when no request is queued or running; the
     * server's default is 0.25), and the bound of one slice in milliseconds (0: 10). An idle
     * engine gives it all of its time. */
    double train_share;
    double train_slice_ms;
    int train_no_fuse;     /* 1: background work never rides serving steps (the baseline of
                              fused passes: every slice streams its own buckets) */
} zs_sched_opts;

/* Constrained decoding (structured outputs, tool calls; sched-constrain.c): a trigger text, then
 * forced prefix tokens, a JSON value under the grammar's token masks, forced suffix tokens. */
typedef struct {
    const zs_jschema *grammar;       /* required */
    const zs_jschema_masks *masks;   /* zs_jschema_mask_new(grammar, the engine's tokenizer) */
    const int32_t *prefix;           /* forced before the value, or NULL */
    int n_prefix;                    /* tokens in prefix */
    const int32_t *suffix;           /* forced after it, or NULL */
    int n_suffix;                    /* tokens in suffix */
    const char *trigger;             /* free text until the output contains it; NULL: constrained at once */
} zs_req_constraint;

typedef struct {
    const int32_t *prompt;      /* prompt token ids (BOS included when the model wants one) */
    int n_prompt;               /* tokens in prompt */
    int max_tokens;             /* >= 1 */
    zs_sampler_params sampling; /* temperature, top_k, top_p, min_p, seed (sampler.h) */
    const char *const *stop;    /* up to 16 stop strings */
    int n_stop;                 /* strings in stop */
    int top_logprobs;           /* -1: none; 0..20: the sampled token's logprob and that many alternatives */
    int ignore_eos;             /* EOS and end_ids do not end the answer */
    int32_t end_ids[ZS_REQ_MAX_END_IDS]; /* more ids that end the answer like EOS (end of turn) */
    int n_end_ids;              /* at most ZS_REQ_MAX_END_IDS */
    const zs_lora *lora;        /* its LoRA adapter (lora.h), or NULL: the base alone */
    int embed;                  /* 1: an embedding request (sched-embed.c); CPU device only */
    int pooling;                /* ZS_POOL_* of an embedding request */
    const zs_req_constraint *constraint;  /* constrained decoding, or NULL; refused with embed */
} zs_req_params;

typedef struct {
    /* a token and the text it completes (len 0 while a partial character or a possible stop
     * string is held back); logprob and top_* only when top_logprobs >= 0 */
    void (*on_token)(void *ud, int32_t token, const char *text, size_t len, float logprob,
                     const int32_t *top_ids, const float *top_logprobs, int n_top);
    /* exactly once, last: finish ZS_DONE_*; text the held-back tail to append (may be empty);
     * err/msg describe ZS_DONE_ERROR */
    void (*on_done)(void *ud, int finish, const char *text, size_t len, int n_prompt,
                    int n_generated, int err, const char *msg);
    void *ud;                   /* the callbacks' first argument */
    /* embedding requests: the pooled, not normalised vector (valid during the call), just
     * before on_done(ZS_DONE_STOP); not for a request that fails or is cancelled */
    void (*on_embedding)(void *ud, const float *vec, int dim);
} zs_req_sink;

typedef struct zs_sched zs_sched;
typedef struct zs_request zs_request;

typedef struct {
    int queued, running;             /* requests waiting for admission, and admitted */
    int kv_used, kv_total;           /* KV blocks of all ranks (used: held by running sequences) */
    int kv_cached;                   /* unreferenced blocks kept by the prefix cache (evictable) */
    /* prefix cache: full prompt blocks looked up at admission, found, and their tokens */
    uint64_t prefix_lookup_blocks, prefix_hit_blocks, prefix_hit_tokens, prefix_evictions;
    /* KV tier (--kv-offload, sched-kv.c): sequences preempted (by swapping out or by recompute),
     * blocks swapped out and back in, and requests preempted now */
    uint64_t kv_preempted, kv_swap_outs, kv_recomputes, kv_swap_out_blocks, kv_swap_in_blocks;
    int kv_preempted_now;
    /* layer-streamed sequences (kvstream.h): moved from memory to streaming, running streamed now;
     * block-layer records read and written, their bytes, failed writes, and the engine thread's
     * seconds waiting for them */
    uint64_t kv_streamed;
    int kv_streamed_now;
    uint64_t kv_stream_settled;
    uint64_t kv_stream_loads, kv_stream_stores, kv_stream_bytes_in, kv_stream_bytes_out, kv_stream_write_errors;
    double kv_stream_wait_s;
    /* the prefix cache's tier (kvprefix.h): blocks taken back from it at admission, written down,
     * held there now, brought back by a persistent file at start, and dropped (failed checksum) */
    uint64_t prefix_tier_hit_blocks, prefix_tier_stored, prefix_tier_dropped;
    int prefix_tier_held, prefix_tier_restored;
    uint64_t constrained_tokens;     /* tokens sampled under a grammar mask */
    uint64_t steps;                  /* engine steps run */
    uint64_t prompt_tokens, generated_tokens;  /* prompt tokens computed (not cached); tokens sampled */
    uint64_t requests_done[4];       /* by ZS_DONE_* */
    /* latency histograms (seconds): cumulative counts per upper bound, plus sum and count */
    double lat_bounds[ZS_SCHED_LAT_BUCKETS];
    uint64_t ttft_counts[ZS_SCHED_LAT_BUCKETS], ttft_count;
    double ttft_sum;
    uint64_t itl_counts[ZS_SCHED_LAT_BUCKETS], itl_count;
    double itl_sum;
    zs_gather_stats gather;          /* bytes per tier, stall, depth, live bytes */
    /* speculative decoding (sched-spec.c): draft tokens put into steps and accepted, forced
     * tokens fed as drafts that held and all of them (jump-forward), verifications by accepted
     * drafts, drafts per sequence chosen for the last step, and tokens generated per step that
     * generated any (EWMA) */
    uint64_t spec_drafted, spec_accepted, spec_forced, spec_forced_drafted;
    uint64_t spec_trees;             /* verifications whose drafts branched (spec_tree) */
    uint64_t spec_side_accepted;     /* accepted drafts that were not their parent's first child */
    uint64_t spec_kv_moves;          /* accepted drafts' K/V entries moved to their positions after a tree */
    uint64_t spec_accept_hist[ZS_SPEC_MAX_TOKENS + 1];
    double spec_k;
    double tokens_per_pass;
    uint64_t passes, pass_tokens;    /* steps that generated tokens, and the tokens they generated */
    /* background work (sched-train.c): the share of the engine's time it had while serving had
     * work too (decayed over about 10 s; 0 before any), the share in force, slices run (its own
     * and fused ones), of those, the serving steps it rode (fused passes), its seconds, and the
     * seconds requests waited on it (a slice that ran while a request was queued or running) */
    double train_share, train_share_target;
    uint64_t train_slices, train_fused;
    double train_s, train_wait_s;
    uint64_t train_tokens;           /* training tokens whose step completed */
    /* weight bytes of the passes it began itself (each bucket's full bytes, once per pass that
     * reads it: what an offloaded base streams for it; a ride begins none, the serving step
     * reads its buckets anyway) */
    uint64_t train_pass_bytes;
} zs_sched_stats;

int  zs_sched_new(zs_engine *e, const zs_sched_opts *o, zs_sched **out);  /* starts the engine thread */
void zs_sched_free(zs_sched *s);                /* cancels everything, stops the thread */
/* Validates (ZS_ERANGE / ZS_EINVAL name the field) and queues; ZS_EBUSY when the queue is full. */
int  zs_sched_submit(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out);
void zs_sched_cancel(zs_sched *s, zs_request *r);  /* on_done(ZS_DONE_CANCELLED) within one step */
/* Admits nothing new, waits up to timeout_s for what runs or waits, then cancels the rest. */
void zs_sched_drain(zs_sched *s, double timeout_s);
/* Fails every request that uses adapter l within one step (ZS_DONE_ERROR, ZS_ECANCELLED, msg);
 * returns how many. */
int  zs_sched_fail_lora(zs_sched *s, const zs_lora *l, const char *msg);
/* Runs fn(ud) on the engine thread as one slice of background work (zs_sched_run_work, under the
 * share), and returns its result; ZS_ECANCELLED without running it on stop, drain or
 * cancelled(ud) != 0. */
int  zs_sched_run_idle(zs_sched *s, int (*fn)(void *ud), void *ud, int (*cancelled)(void *ud));
/* Background work in slices (sched-train.c), run on the engine thread between serving steps
 * under the share: slice(ud, budget_s, then_more) does one piece of at most about budget_s
 * seconds (at least one unit) and returns 1 while more follow, 0 when the work is done, < 0 on
 * failure; then_more = 1 when the next slice of this work comes right after (nothing else
 * waits). Optional (NULL: none):
 *   ride(ud, budget_s)   a rider (world.h) carrying the work's next piece in the coming serving
 *                        step, or NULL when that piece cannot ride; ride_end(ud, step_rc) after
 *                        the step returns the seconds the rider took (charged to the work);
 *   next_pass(ud, budget_s, out)  the pass the next slice will begin with (1; 0: unknown),
 *                        which the scheduler declares to the gathers in the serving step before
 *                        it and then runs that slice right after the step;
 *   pass_bytes(ud)       the weight bytes of the passes it began so far (for /metrics).
 * share > 0 overrides train_share for this work; tokens are counted as trained when it ends. */
typedef struct {
    int (*slice)(void *ud, double budget_s, int then_more);
    const zs_world_rider *(*ride)(void *ud, double budget_s);
    double (*ride_end)(void *ud, int step_rc);
    int (*next_pass)(void *ud, double budget_s, zs_pass_range *out);
    uint64_t (*pass_bytes)(void *ud); /* weight bytes of the passes it began so far (or NULL) */
    double share;
    uint64_t tokens;
    void *ud;
} zs_sched_work;
/* Runs the work to its end (returns 0 or slice's error); ZS_ECANCELLED, without starting it or
 * between slices, on stop, drain or cancelled(cancel_ud) != 0. Not from the engine thread. One
 * work at a time runs; others wait their turn in order. */
int  zs_sched_run_work(zs_sched *s, const zs_sched_work *w, int (*cancelled)(void *ud), void *cancel_ud);
void zs_sched_stats_get(zs_sched *s, zs_sched_stats *out);

#endif

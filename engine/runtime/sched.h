/* sched.h — the request scheduler (DESIGN.md §4): a queue of generation and embedding requests,
 * continuous batching onto the engine, cancellation, and the counters behind /metrics.
 *
 * One engine thread owns the engine. At every step it admits waiting requests (up to max_seqs
 * running, KV blocks permitting), builds one batch of at most max_batch_tokens tokens — one
 * decode token per running sequence plus prompt chunks of new ones — runs it as one step of all
 * ranks, samples, detokenizes, applies stop strings, and calls each request's sink. A sequence
 * that finishes, is cancelled or fails frees its KV blocks at once. A request's result does not
 * depend on what else is in the batch (the kernels are batch-invariant).
 *
 * Ownership: the scheduler copies the prompt and stop strings at submit. A zs_request handle is
 * valid from submit until its on_done callback has returned; after that it must not be used.
 * Thread-safety: submit, cancel, stats and drain may be called from any thread; sink callbacks
 * run on the engine thread and must not block (queue the data and return). */
#ifndef ZS_SCHED_H
#define ZS_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"

typedef struct {
    int max_seqs;          /* running sequences at most (default 32, capped by the engine's KV slots) */
    int max_batch_tokens;  /* tokens per engine step (default 256) */
    int max_queue;         /* waiting requests at most; beyond it submit returns ZS_EBUSY (default 256) */
} zs_sched_opts;

typedef struct {
    const int32_t *prompt;      /* prompt token ids (BOS included when the model wants one) */
    int n_prompt;
    int max_tokens;             /* >= 1 */
    zs_sampler_params sampling;
    const char *const *stop;    /* up to 16 stop strings */
    int n_stop;
    int top_logprobs;           /* -1: no logprobs; 0..20: logprob of the sampled token plus that many alternatives */
    int ignore_eos;
    /* more ids that end the answer like EOS (ignore_eos too): a chat template's end-of-turn tokens
     * (<end_of_turn>, <|end|>, <|im_end|>, <|eot_id|>), so that a model whose generation_config
     * lists only <eos> still stops at the end of its turn; at most ZS_REQ_MAX_END_IDS */
    int32_t end_ids[4];
    int n_end_ids;
    /* the LoRA adapter the request runs with (lora.h), or NULL: the base alone. Borrowed: it must
     * stay valid until on_done has returned (the server's adapter table holds a reference). Rows
     * of different adapters share a batch; each adds its own B·A·x (zs_batch.lora). */
    const zs_lora *lora;
    /* an embedding request (embed 1): the prompt is prefilled in the continuous batch like any
     * prompt (chunked, beside decode tokens), the final-normed hidden state of each of its tokens
     * pooled as it goes (pooling ZS_POOL_MEAN: the mean over the prompt's tokens, summed in
     * position order in double; ZS_POOL_LAST: the last token's row), nothing sampled; it ends with
     * sink.on_embedding(pooled, dim) and then on_done(ZS_DONE_STOP, n_generated 0). max_tokens,
     * sampling, stop and logprobs are ignored. The pooled vector is the same bits alone or
     * batched with anything (the forward is batch-invariant). Refused on the CUDA device. */
    int embed;
    int pooling;
} zs_req_params;
enum { ZS_POOL_MEAN = 0, ZS_POOL_LAST = 1 };
#define ZS_REQ_MAX_END_IDS 4

enum { ZS_DONE_STOP = 0, ZS_DONE_LENGTH = 1, ZS_DONE_CANCELLED = 2, ZS_DONE_ERROR = 3 };

typedef struct {
    /* A sampled token and the text it completes (len may be 0 while a multi-byte character or a
     * possible stop string is held back). logprob/top_* only when top_logprobs >= 0. */
    void (*on_token)(void *ud, int32_t token, const char *text, size_t len, float logprob,
                     const int32_t *top_ids, const float *top_logprobs, int n_top);
    /* Exactly once, last: finish is ZS_DONE_*; text is the held-back tail to append (may be
     * empty); err/msg describe ZS_DONE_ERROR. */
    void (*on_done)(void *ud, int finish, const char *text, size_t len, int n_prompt,
                    int n_generated, int err, const char *msg);
    void *ud;
    /* Embedding requests only: the pooled, not normalised vector (dim floats, valid during the
     * call), just before on_done(ZS_DONE_STOP). Not called for a request that fails or is cancelled. */
    void (*on_embedding)(void *ud, const float *vec, int dim);
} zs_req_sink;

typedef struct zs_sched zs_sched;
typedef struct zs_request zs_request;

int  zs_sched_new(zs_engine *e, const zs_sched_opts *o, zs_sched **out);  /* starts the engine thread */
/* Validates (prompt + max_tokens within the context, sampling parameters, stop strings) and
 * queues. ZS_ERANGE / ZS_EINVAL name the field; ZS_EBUSY when the queue is full. */
int  zs_sched_submit(zs_sched *s, const zs_req_params *p, const zs_req_sink *sink, zs_request **out);
/* Cancels a queued or running request: its on_done(ZS_DONE_CANCELLED) comes within one step. */
void zs_sched_cancel(zs_sched *s, zs_request *r);
/* Stops admitting new requests, waits up to timeout_s for the running and queued ones, then
 * cancels what is left. */
void zs_sched_drain(zs_sched *s, double timeout_s);
void zs_sched_free(zs_sched *s);   /* cancels everything, stops the thread */
/* Fails every queued or running request that uses adapter l, within one step: on_done gets
 * ZS_DONE_ERROR with ZS_ECANCELLED and msg. Returns how many requests it marked. Thread-safe. */
int  zs_sched_fail_lora(zs_sched *s, const zs_lora *l, const char *msg);
/* Runs fn(ud) on the engine thread, between steps, at a moment when no request is queued or
 * running (the idle passes: a LoRA job's training steps over the served base); fn may drive the
 * engine's world (zs_world_run). Blocks the caller until fn has returned and returns fn's result;
 * or ZS_ECANCELLED without running fn when the scheduler stops or drains first, or when
 * cancelled(ud) (polled every few milliseconds while waiting; may be NULL) returns non-zero.
 * Requests submitted while fn runs wait for it (one training step). Thread-safe; not from the
 * engine thread itself. */
int  zs_sched_run_idle(zs_sched *s, int (*fn)(void *ud), void *ud, int (*cancelled)(void *ud));

#define ZS_SCHED_LAT_BUCKETS 12
typedef struct {
    int queued, running;
    int kv_used, kv_total;           /* KV blocks of all ranks */
    uint64_t steps;
    uint64_t prompt_tokens, generated_tokens;
    uint64_t requests_done[4];       /* by ZS_DONE_* */
    /* latency histograms (seconds): cumulative counts per upper bound, plus sum and count */
    double lat_bounds[ZS_SCHED_LAT_BUCKETS];
    uint64_t ttft_counts[ZS_SCHED_LAT_BUCKETS], ttft_count;
    double ttft_sum;
    uint64_t itl_counts[ZS_SCHED_LAT_BUCKETS], itl_count;
    double itl_sum;
    zs_gather_stats gather;          /* bytes per tier, stall, depth, live bytes */
} zs_sched_stats;

void zs_sched_stats_get(zs_sched *s, zs_sched_stats *out);

#endif

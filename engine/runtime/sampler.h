/* sampler.h — token sampling from logits: greedy, temperature, top_k, top_p and min_p, with a
 * deterministic per-sampler random generator, and log-softmax values for OpenAI logprobs.
 *
 * Order of operations in zs_sampler_sample (as Hugging Face / vLLM do):
 *   temperature scaling -> top_k -> min_p -> top_p -> one draw from the kept, renormalised
 *   probabilities. temperature 0 is greedy: exactly the argmax, the lowest id winning ties.
 * Candidates are ordered by (logit descending, id ascending); every truncation keeps a prefix of
 * that order, so ties at a cut-off are resolved in favour of the lower id.
 *
 * Random numbers: xoshiro256** seeded through splitmix64 from params.seed. Every call to
 * zs_sampler_sample consumes exactly one draw (greedy calls included), so the sequence of draws
 * depends only on the seed and the number of sample calls.
 *
 * Ownership and threads: a zs_sampler owns its parameters, generator state and scratch buffers
 * (O(vocab_size)). One sampler belongs to one sequence and must not be used by two threads at
 * once; distinct samplers are fully independent. zs_sampler_params_default/check and
 * zs_sampler_top_logprobs are pure and thread-safe. Logits are never modified. */
#ifndef ZS_SAMPLER_H
#define ZS_SAMPLER_H

#include <stdint.h>

#define ZS_SAMPLER_MAX_TEMPERATURE 100.0f
#define ZS_SAMPLER_MAX_TOP_LOGPROBS 20

typedef struct {
    float temperature; /* 0 => greedy; finite, 0 <= temperature <= 100 */
    float top_p;       /* (0,1]; 1 = off */
    int top_k;         /* 0 = off; >= 0; values >= vocab_size are the same as off */
    uint64_t seed;     /* same seed + same logits sequence => same tokens */
    float min_p;       /* 0 = off; [0,1): drop tokens with p < min_p * p_max (after temperature) */
} zs_sampler_params;

/* temperature 1, top_p 1, top_k 0, seed 0, min_p 0. */
void zs_sampler_params_default(zs_sampler_params *p);

/* 0, or ZS_EINVAL (NULL, NaN/inf) / ZS_ERANGE (out of range) with a message that names the
 * field as the OpenAI API does: "temperature must be between 0 and 100", "top_p must be greater
 * than 0 and at most 1", "top_k must be >= 0", "min_p must be >= 0 and < 1". */
int zs_sampler_params_check(const zs_sampler_params *p);

typedef struct zs_sampler zs_sampler;

/* Checks p (see above) and vocab_size (> 0); copies p. */
int zs_sampler_new(const zs_sampler_params *p, int vocab_size, zs_sampler **out);
void zs_sampler_free(zs_sampler *s); /* NULL is fine */

/* Samples one token from vocab_size logits (f32, not modified). *logprob is the log-softmax of
 * the chosen token under the UNMODIFIED distribution (temperature 1, no truncation), as OpenAI
 * reports logprobs; logprob may be NULL when not wanted. NaN/inf logit -> ZS_EINVAL naming its
 * index. On error nothing is drawn from the generator. */
int zs_sampler_sample(zs_sampler *s, const float *logits, int *token, float *logprob);

/* Speculative decoding's acceptance rule for a draft token that a proposer chose
 * deterministically (prompt lookup, a greedy draft model: q is a point mass on it). With p the
 * distribution zs_sampler_sample draws from, the draft is accepted with probability p(draft);
 * otherwise the token is drawn from p with the draft taken out, renormalised (max(0, p - q)).
 * The token is then distributed exactly as zs_sampler_sample's (Leviathan et al. 2023). Greedy
 * (temperature 0, top_k 1): exactly zs_sampler_sample (the argmax, one draw), accepted when it is
 * the draft. Otherwise one draw when accepted, two when not. *accepted: *token is the draft. */
int zs_sampler_verify(zs_sampler *s, const float *logits, int draft, int *token, int *accepted,
                      float *logprob);

/* The same rule for several deterministic drafts at one place (the children of a node of a draft
 * tree, in order): recursive rejection sampling (SpecInfer, Miao et al. 2023; Chen et al. 2023's
 * multi-draft rule) with point masses. Draft i is accepted with probability p_i(draft i), where
 * p_0 = p and p_{i+1} is p_i with draft i taken out, renormalised; when every draft fails the
 * token is drawn from p without any of them. Then P(token = x) = p(x) for every x, exactly as one
 * draw of zs_sampler_sample: the drafts only decide which draws are made. *which: the index of
 * the accepted draft, or -1 (*token is then none of them). A repeated draft never holds twice
 * (its second turn has no mass). One draw per draft tried, one more when all fail; n = 1 is
 * zs_sampler_verify, draw for draw. Greedy: zs_sampler_sample's argmax and one draw, *which the
 * first draft equal to it. 1 <= n <= ZS_SAMPLER_MAX_DRAFTS. */
#define ZS_SAMPLER_MAX_DRAFTS 16
int zs_sampler_verify_multi(zs_sampler *s, const float *logits, const int *drafts, int n, int *token, int *which,
                            float *logprob);

/* The k most likely tokens with their log-softmax values, descending, ties by lower id.
 * 0 <= k <= min(20, vocab_size); ids and logprobs hold k entries (may be NULL when k == 0). */
int zs_sampler_top_logprobs(const float *logits, int vocab_size, int k, int *ids,
                            float *logprobs);

#endif

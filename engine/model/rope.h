/* rope.h — the rotary-embedding frequencies of a layer at a position, as transformers'
 * modeling_rope_utils.py computes them for each rope_scaling type (default, linear, dynamic NTK,
 * llama3, YaRN, LongRoPE), in float32 in the same order of operations, and the factor its cos and
 * sin are multiplied by (YaRN's and LongRoPE's attention factor; 1 otherwise).
 *
 * Position dependence: "dynamic" recomputes the base for a sequence longer than
 * max_position_embeddings and "longrope" switches to its long factors for a sequence longer than
 * the original context. transformers does so per forward call from the largest position of the
 * call; here a token's frequencies follow from its own position (sequence length pos + 1), which
 * is what transformers computes when tokens are fed one at a time, and keeps every result
 * independent of how a prompt is chunked or batched.
 *
 * The scaling parameters are checked when a configuration is read (zs_config_check_rope, config.c):
 * rope.c uses config.h, never the other way. Every function is pure and thread-safe. */
#ifndef ZS_ROPE_H
#define ZS_ROPE_H

#include "config.h"

/* 1 when the frequencies of layer l depend on the position (dynamic, longrope): zs_rope_freqs per
 * token; 0: the same for every position (compute once per layer kind). */
int zs_rope_pos_dependent(const zs_model_config *c, int layer);
/* A layer whose frequencies depend on the position, or -1 when none does. Every such layer has the
 * same frequencies at a position (only Gemma 3's local layers differ, and they are never
 * position-dependent), so one row per token, from this layer, serves them all. */
int zs_rope_pos_layer(const zs_model_config *c);
/* 1 when layer l uses the local RoPE of Gemma 3's sliding layers (rope_local_theta, no scaling). */
int zs_rope_layer_local(const zs_model_config *c, int layer);
/* inv_freq[head_dim / 2] and the cos/sin factor for a token at position pos of layer l. */
void zs_rope_freqs(const zs_model_config *c, int layer, int pos, float *inv_freq, float *attn_factor);

#endif

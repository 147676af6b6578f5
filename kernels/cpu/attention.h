/* attention.h — causal attention of a batch of query tokens over a paged KV cache on the CPU,
 * batch-invariant and thread-count-invariant (attention.c).
 *
 * The cache is seen through per-sequence tables of block pointers, so this header knows nothing
 * of engine/model's cache object: block b of a sequence holds positions [b*block, (b+1)*block),
 * one row of kv_stride elements per position (kv head h at offset h*head_dim), K and V each. The
 * elements are f32, or f16 / bf16 (kv_dtype): 16-bit elements are read as stored and widened
 * exactly in registers (F16C, or a 16-bit shift for bf16; the generic build converts lane by
 * lane), so a 16-bit cache gives the bits of an f32 cache holding the widened values: the order
 * below is the same for every element type.
 *
 * The fixed order of every output element (query token i, head h, dim e), the same for every
 * batch, tiling and thread count, and in the generic and AVX2+FMA builds:
 *   score_j = dot(q, k_j) · (1/sqrt(head_dim)) for j = 0..pos: the dot product as in
 *             matmul-kern.h — 8 lane accumulators advanced by fused multiply-adds over d in steps
 *             of 8 in order, summed ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the d tail added in
 *             order with fmaf;
 *   p = zs_op_softmax(score_0..pos) (ops.h: max, exp, a sequential sum, one reciprocal);
 *   out_e = fma(p_pos, v_pos,e, ... fma(p_1, v_1,e, fma(p_0, v_0,e, 0)))  (keys in order).
 * Work is split by (sequence, kv head, tile of query tokens); each output row is written by
 * exactly one task. */
#ifndef ZS_ATTENTION_H
#define ZS_ATTENTION_H

/* One sequence's view of the cache for one layer: k[b] / v[b] point at position b*block's row
 * (elements of the call's kv_dtype). */
typedef struct {
    const void *const *k;
    const void *const *v;
} zs_att_seq;

enum { ZS_ATT_AUTO = 0, ZS_ATT_GENERIC = 1, ZS_ATT_AVX2 = 2 };

/* What a model family changes in the scores (NULL or all zero: the plain causal attention above).
 *   scale:   the scores' multiplier instead of 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5);
 *            0: 1/sqrt(head_dim) exactly as above;
 *   softcap: score = softcap · tanhf(score / softcap) after the scaling (Gemma 2); 0: none;
 *   window:  a sliding window: query position p sees keys p-window+1 .. p only (Mistral, Gemma,
 *            Phi-3; transformers' sliding_window_overlay); 0: keys 0 .. p. Blocks wholly before
 *            the window are never read (their table entries may be NULL). */
typedef struct {
    float scale;
    float softcap;
    int window;
} zs_att_params;

/* A token tree (speculative decoding: several continuations of a sequence verified in one call),
 * or NULL: every token causal. Per query token i of the call:
 *   slot[i]   the cache position that holds its key and value (written before the call); pos[i]
 *             stays its position in the text (RoPE's, the window's: for a tree, depth-based);
 *   parent[i] -1: token i is causal, it attends to its sequence's positions 0..pos[i], and slot[i]
 *             must be pos[i] (a chain's token, a prompt's, a tree's root); else the index (< i) of
 *             its parent in the call: a token of the same sequence with pos[parent] = pos[i] - 1
 *             and slot[parent] < slot[i]. Token i then attends to the positions before its root's
 *             slot, then to the slots of its root, ..., its parent and itself, in that order: the
 *             keys of its own path, never those of another branch (a sibling, a cousin). With a
 *             window, a key of the path counts by its token's pos.
 * The fixed order below runs over that list of keys as it runs over 0..pos for a causal token,
 * so a tree token gets the bits that the same token gets as a causal token at pos[i] over a cache
 * that holds its path at positions slot[root]..pos[i] (the accepted path alone, compacted).
 * Causal tokens of a sequence see every position up to theirs, tree slots included: a sequence's
 * tokens in one call are either causal (a chunk, a chain) or one tree under a causal root. */
typedef struct {
    const int *slot;
    const int *parent;
} zs_att_tree;

/* out[T, nh*hd] (written) from q[T, nh*hd]: token i belongs to seqs[seq[i]] and sits at position
 * pos[i]; it attends to that sequence's positions 0..pos[i], which must all be in the cache.
 * Query head h uses kv head h / (nh / nkv). kv_dtype: the cache's elements, ZS_F32, ZS_F16 or
 * ZS_BF16 (tensor.h). path: ZS_ATT_AUTO (AVX2+FMA when the CPU has them, and F16C too for f16),
 * or a forced kernel (tests; ZS_ATT_AVX2 on a CPU without them is an error). Thread-safe (the
 * work runs on the pool, pool.h). Returns 0, or ZS_ENOMEM / ZS_EINVAL / ZS_EUNSUPPORTED with a
 * message. */
int zs_op_attention(float *out, const float *q, int T, const int *seq, const int *pos, const zs_att_seq *seqs,
                    int nh, int nkv, int hd, int kv_stride, int block, int kv_dtype, int path,
                    const zs_att_params *ap);
/* The same with a token tree (NULL: zs_op_attention exactly). ZS_EINVAL when a parent breaks the
 * rules above (an index not before the token, another sequence, a position or slot out of
 * order, a causal token whose slot is not its pos). */
int zs_op_attention_tree(float *out, const float *q, int T, const int *seq, const int *pos, const zs_att_seq *seqs,
                         int nh, int nkv, int hd, int kv_stride, int block, int kv_dtype, int path,
                         const zs_att_params *ap, const zs_att_tree *tree);

#endif

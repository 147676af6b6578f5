/* model.h — a loaded model: its configuration, the layout of its parameter buckets (experts of a
 * mixture of experts each their own), and the forward pass over a batch of tokens from one or more
 * sequences.
 *
 * Parameters are packed into flat buckets (DESIGN.md §3): bucket 0 holds the embeddings,
 * buckets 1..L the transformer blocks, bucket L+1 the final norm and LM head. Tensors with fewer
 * elements than the persistence threshold (norms, biases) are kept apart in a small "resident"
 * area per bucket that every rank holds in full; the rest of a bucket is the part that is
 * sharded, offloaded and gathered. A layer's tensors are found from the two base pointers (bucket
 * data, resident data) and its bucket's layout; layers share one layout unless their matrices are
 * stored in different block formats (a Q4_K_M mix, as stored or made at load).
 *
 * Embedding lookup tables (zs_model_opts.embed_lookup, inference engines): the forward pass reads
 * only the rows of the batch's tokens from the token table, so an inference model keeps the
 * tables it only looks rows up in as host-resident lookup tables instead of sharded data: the
 * token table of an untied model and GPT-2's position table become resident slots of bucket 0
 * (whose sharded part is then empty for an untied model: nothing of it is stored in a tier or
 * gathered). A tied token table is also the LM head, read whole every pass: it stays sharded in
 * bucket 0 for the head, and the model keeps a host copy of it for the lookup (the same storage
 * dtype and conversion as the packed bucket, so the rows are bit for bit the bucket's). Training
 * (embed_lookup 0) keeps every table sharded, with gradients and optimizer state partitioned.
 * The tables are one copy per model object, shared by the rank threads of the process.
 *
 * The forward pass reads bucket data through a zs_weight_source: for a resident model it hands
 * out the buffers it owns; the ZeRO-3 coordinator (gather.c) hands out gathered buffers.
 * Ownership: zs_model owns its config, layout and (when resident) its buffers. A zs_model is
 * read-only after load and may be shared by threads; a forward call uses its own scratch. */
#ifndef ZS_MODEL_H
#define ZS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kvcache.h"
#include "tensor.h"

/* Tensor roles. Per layer: */
enum {
    ZS_R_ATTN_NORM_W, ZS_R_ATTN_NORM_B,
    ZS_R_WQ, ZS_R_WK, ZS_R_WV, ZS_R_BQ, ZS_R_BK, ZS_R_BV,
    ZS_R_WO, ZS_R_BO,
    ZS_R_FFN_NORM_W, ZS_R_FFN_NORM_B,
    ZS_R_W_GATE, ZS_R_B_GATE, ZS_R_W_UP, ZS_R_B_UP, ZS_R_W_DOWN, ZS_R_B_DOWN,
    /* Qwen3 / Gemma 3: RMSNorm weights [head_dim] over each head of q and of k (qk_norm) */
    ZS_R_Q_NORM, ZS_R_K_NORM,
    /* Gemma 2/3 (post_norms): RMSNorm weights [dim] on the attention output and the MLP output
     * before their residual adds (HF post_attention_layernorm / post_feedforward_layernorm; the MLP's
     * input norm, pre_feedforward_layernorm, is ZS_R_FFN_NORM_W) */
    ZS_R_POST_ATTN_NORM, ZS_R_POST_FFN_NORM,
    /* MoE layers (zs_config_layer_moe): the router [n_experts, dim] (HF mlp.gate / block_sparse_moe.gate);
     * Qwen2-MoE's shared expert is ZS_R_W_GATE/UP/DOWN of the layer bucket ([shared_ffn_dim, dim] ...) with
     * its sigmoid gate ZS_R_SHARED_GATE [1, dim]. A MoE layer has no dense MLP; its experts are buckets of
     * their own (below) whose slots are ZS_R_W_GATE, ZS_R_W_UP, ZS_R_W_DOWN ([moe_ffn_dim, dim], [moe_ffn_dim,
     * dim], [dim, moe_ffn_dim]; Mixtral's w1, w3, w2). */
    ZS_R_ROUTER, ZS_R_SHARED_GATE,
    ZS_R_LAYER_COUNT
};
/* Embedding bucket and head bucket: */
enum { ZS_R_TOK_EMB, ZS_R_POS_EMB, ZS_R_EMB_COUNT };
enum { ZS_R_OUT_NORM_W, ZS_R_OUT_NORM_B, ZS_R_LM_HEAD, ZS_R_HEAD_COUNT };

#define ZS_MAX_ROLES ZS_R_LAYER_COUNT

typedef struct {
    int present;          /* this architecture has the tensor */
    int resident;         /* 1: in the resident area, 0: in the sharded bucket data */
    zs_dtype dtype;
    int ndim;
    int64_t shape[2];     /* our layout: linear weights are [out, in] */
    size_t offset;        /* bytes from the start of its area */
    size_t nbytes;
} zs_slot;

typedef struct {
    int n_roles;
    zs_slot slot[ZS_MAX_ROLES];
    size_t data_bytes;     /* sharded part, padded to 4096 */
    size_t resident_bytes; /* resident part */
} zs_bucket_layout;

typedef struct {
    zs_dtype weight_dtype;     /* storage dtype of matrices; ZS_DTYPE_COUNT = as stored in the checkpoint;
                                  ZS_Q8_0 .. ZS_Q2_K quantize at load (matrices whose rows are not a multiple
                                  of the block stay 16-bit; norms and biases are f32 whatever is asked) */
    int quant_mix;             /* ZS_QUANT_MIX_Q4_K_M (quant-mix.h; with weight_dtype ZS_Q4_K): each matrix
                                  gets llama.cpp's Q4_K_M choice, zs_quant_mix_q4_k_m; 0: weight_dtype for all */
    int64_t persist_threshold; /* tensors with fewer elements stay resident (default 0: norms and biases) */
    int embed_lookup;          /* 1: an inference model: embedding lookup tables in host memory (see
                                  above; set by serve, generate and bench); 0 (default): every table
                                  sharded, the layout training needs */
} zs_model_opts;

void zs_model_opts_default(zs_model_opts *o);

typedef struct zs_model zs_model;

/* Bucket ids. Mixtures of experts: each expert of each MoE layer is a bucket of its own (its own
 * shard, tier placement, NVMe offset and checksum), numbered after the head: zs_bucket_expert. The
 * layer bucket of a MoE layer holds its attention, norms, router and (Qwen2-MoE) shared expert. */
static inline int zs_bucket_embed(void) { return 0; }
static inline int zs_bucket_layer(int l) { return 1 + l; }
int zs_model_n_buckets(const zs_model *m);   /* every bucket, experts included */
int zs_bucket_head(const zs_model *m);
/* Expert e of layer l's bucket, or -1 when layer l is dense (or e is out of range). */
int zs_bucket_expert(const zs_model *m, int layer, int e);
/* 1 (and *layer, *e) when bucket b is an expert's; 0 otherwise (layer, e may be NULL). */
int zs_bucket_is_expert(const zs_model *m, int b, int *layer, int *e);
/* Bucket b's name in messages ("embeddings", "head", "layer 3", "layer 3 expert 5") in buf; returns buf. */
const char *zs_bucket_label(const zs_model *m, int b, char *buf, size_t cap);

/* Reads config.json and checks every tensor the architecture needs (names, shapes, dtypes)
 * without copying weight data yet. The checkpoint stays mapped until zs_model_free or
 * zs_model_close_checkpoint. */
int  zs_model_open(const char *dir, const zs_model_opts *o, zs_model **out);
/* Packs every bucket into buffers owned by the model (the resident, single-rank case). */
int  zs_model_load_resident(zs_model *m);
/* Packs bucket b (data part, data_bytes long) into dst and its resident part into rdst
 * (resident_bytes long); either may be NULL to skip it. Reads the mapped checkpoint tensor by
 * tensor, converting dtype and layout; releases the pages of each source tensor after use. */
int  zs_model_pack_bucket(const zs_model *m, int b, void *dst, void *rdst);
void zs_model_close_checkpoint(zs_model *m);
void zs_model_free(zs_model *m);

const zs_model_config *zs_model_config_get(const zs_model *m);
const zs_bucket_layout *zs_model_layout(const zs_model *m, int bucket);
/* The same bucket with every tensor in f32 (same slots, same resident/sharded split, f32
 * offsets): the layout of gradients and fp32 master weights. */
const zs_bucket_layout *zs_model_grad_layout(const zs_model *m, int bucket);
const char *zs_model_dir(const zs_model *m);
/* Fingerprint of the source checkpoint plus the packing options (for reusing shard files). */
const char *zs_model_fingerprint(const zs_model *m);
size_t zs_model_param_count(const zs_model *m);
size_t zs_model_weight_bytes(const zs_model *m);   /* bytes of all buckets (data + resident) */
/* the block format (ZS_Q8_0 .. ZS_Q2_K) some matrix is stored in, or ZS_DTYPE_COUNT when every slot holds
 * an element type; training refuses a quantized model */
zs_dtype zs_model_quant_dtype(const zs_model *m);
/* Resident buffers owned by the model (after zs_model_load_resident; NULL before). */
const void *zs_model_bucket_data(const zs_model *m, int b);
const void *zs_model_bucket_resident(const zs_model *m, int b);
/* The resident part, writable: training updates it in place (between steps only). */
void *zs_model_bucket_resident_mut(zs_model *m, int b);
/* Resident parts can be kept by the model even when data lives elsewhere (with embed_lookup, the
 * host lookup tables too). */
int zs_model_load_resident_parts(zs_model *m);

/* 1 when the model was opened with embed_lookup (an inference model). */
int zs_model_embed_lookup(const zs_model *m);
/* The host table the embedding lookup of role ZS_R_TOK_EMB or ZS_R_POS_EMB reads its rows from
 * (vocab_size or max_seq rows of dim elements in the slot's dtype): a resident slot of bucket 0,
 * or the host copy of a tied token table. NULL when the model has no embed_lookup, the role is
 * absent, or before zs_model_load_resident_parts. Owned by the model. */
const void *zs_model_embed_table(const zs_model *m, int role);
/* Host bytes of those tables (the resident slots plus the tied copy); 0 without embed_lookup. */
size_t zs_model_embed_table_bytes(const zs_model *m);

/* Where the forward pass gets bucket data. acquire returns the full (gathered) data part of a
 * bucket; release says the pass is done with it. Calls come in pass order on one thread (the
 * list zs_model_pass_order gives): without embed_lookup embed, layer 0 .. layer L-1, head, and
 * embed once more when the LM head is tied to the embeddings; with embed_lookup the lookup reads
 * the host tables, so the pass is layer 0 .. layer L-1, head, plus embed (once) for a tied head. */
/*
 * Mixtures of experts: a MoE layer's experts are not in the static order. The pass order has a
 * mark, ZS_PASS_EXPERTS(l), right after layer l's bucket (zs_model_pass_order); there the forward,
 * still holding the layer bucket, routes its tokens and calls experts() with the bitmask of the
 * experts its own tokens selected (n_experts bits, 64 per word, bit e of word e/64; all zero for
 * a rank with no tokens). The source agrees on the union with every other rank (one small
 * collective, so every rank gathers the same experts in the same order) and writes it to agreed.
 * The caller then acquires and releases EVERY expert bucket of agreed, one at a time, in
 * increasing expert order, whether or not its own tokens use it, and only then releases the layer
 * bucket. experts NULL (the resident source, a single process's own buffers): agreed = mask. */
#define ZS_PASS_EXPERTS(l) (-2 - (l))
static inline int zs_pass_is_experts(int entry) { return entry <= -2; }
static inline int zs_pass_experts_layer(int entry) { return -2 - entry; }
#define ZS_MAX_EXPERTS 512
#define ZS_EXPERT_WORDS (ZS_MAX_EXPERTS / 64)
typedef struct {
    int (*acquire)(void *ctx, int bucket, const void **data);
    void (*release)(void *ctx, int bucket);
    void *ctx;
    int (*experts)(void *ctx, int layer, const uint64_t *mask, uint64_t *agreed);
} zs_weight_source;
/* The source that serves the model's own resident buffers. */
zs_weight_source zs_model_resident_source(zs_model *m);
/* Where a slot came from in the Hugging Face checkpoint (for export): the tensor name and shape,
 * and how our [out, in] slot was cut from it. */
enum { ZS_SRC_COPY = 0, ZS_SRC_TRANSPOSE_COLS = 1, ZS_SRC_VEC_SLICE = 2, ZS_SRC_ROW_SLICE = 3 };
typedef struct {
    const char *name;   /* owned by the model */
    int kind;           /* ZS_SRC_*: copy; columns [col0, col0+out) of an [in, cols] tensor, transposed; elements from
                           col0; rows [col0, col0+out) of a [rows, in] tensor (Phi-3's fused qkv_proj, gate_up_proj) */
    int64_t col0;
    int ndim;
    int64_t shape[2];
} zs_slot_source;
int zs_model_slot_source(const zs_model *m, int bucket, int role, zs_slot_source *out);

/* The order in which one forward pass acquires buckets (see zs_weight_source), with a
 * ZS_PASS_EXPERTS(l) mark after each MoE layer l (expert buckets are never in it); returns the
 * count (<= zs_model_pass_order_max). */
int zs_model_pass_order(const zs_model *m, int *order);
int zs_model_pass_order_max(const zs_model *m);
/* MoE: bytes of one expert bucket's data part (the largest, when a quant mix makes them differ);
 * 0 for a dense model. */
size_t zs_model_expert_bytes(const zs_model *m);

/* A batch: n tokens; token i belongs to kv sequence seq[i] at position pos[i]. Tokens of one
 * sequence are consecutive with increasing positions; the cache must already have room
 * (zs_kv_seq_reserve) for them. logits_idx[i] >= 0 asks for the logits row of token i at that
 * row of the output (rows 0..n_logits-1).
 *
 * Token trees (speculative decoding, sched-spec.c; zs_batch.tree): with slot and parent set, a sequence's tokens
 * may form a tree under a causal root: token i's K and V go to position slot[i] of its sequence
 * (instead of pos[i]), and parent[i] is -1 (causal: slot[i] = pos[i], it sees positions
 * 0..pos[i]) or the row of its parent, an earlier row of the same sequence with pos[parent] =
 * pos[i] - 1 (the position is the depth: RoPE and position embeddings use pos) and a lower slot;
 * it then sees the positions before its root's slot and the slots of its path (root .. itself),
 * never another branch's (kernels/cpu/attention.h, zs_att_tree). Rows of a tree are in node order
 * (a parent before its children, slots rising), e.g. slots p, p+1, .. in row order. Each tree
 * row's logits and K/V are the bits the same token gets decoded alone on its path with that path
 * at positions slot[root]..pos[i] (the CPU forward; see docs/gpu.md for CUDA). slot and parent
 * NULL: every token causal, written at pos[i] (the pass is then the plain one, bit for bit).
 *
 * tree->moves (n_moves of them, or NULL): K/V entries copied within their sequences, in order, in every
 * layer before the pass reads or writes the cache: a verified tree's accepted path, moved from
 * its slots to the consecutive positions later tokens read (zs_kv_move; the rows of a later tree
 * may then reuse the slots). Positions must be inside the reserved room. */
typedef struct zs_lora zs_lora; /* lora.h */
typedef struct {
    const int32_t *slot;     /* per token, or NULL (with parent): every token causal at its pos */
    const int32_t *parent;   /* per token: -1, or its parent's row */
    const zs_kv_move *moves; /* n_moves copies before the pass, or NULL */
    int n_moves;
} zs_batch_tree;
typedef struct {
    int n;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;
    const int32_t *logits_idx;
    int n_logits;
    /* LoRA adapters per token (lora.h), or NULL: every token through the base alone. lora[i] NULL:
     * token i through the base; else its adapted projections add lora[i]'s B·A·x (rows of one
     * adapter computed together; the base weights are read once for the whole batch). The adapters
     * must outlive the call. */
    const zs_lora *const *lora;
    /* NULL, or n rows of dim floats: the final-normed hidden state of every token (the input of
     * the LM head; what embeddings pool), written by the CPU forward. NULL leaves the pass as it
     * was, bit for bit; each row's bits do not depend on the other rows or on logits_idx. The CUDA
     * forward refuses it (ZS_EUNSUPPORTED). */
    float *hidden;
    const zs_batch_tree *tree; /* token trees and KV moves (above), or NULL: neither */
} zs_batch;

/* The checks every forward pass makes first (batch.c): positions and slots inside the reserved
 * context and below max_seq, the tree rules above, moves inside their sequences' room. 0, or
 * ZS_ERANGE / ZS_EINVAL with a message. Thread-safe (reads only). */
int  zs_batch_check(const zs_batch *b, const zs_kvcache *kv, int max_seq);

typedef struct zs_forward zs_forward;   /* scratch of one forward executor */

int  zs_forward_new(const zs_model *m, int max_tokens, zs_forward **out);
void zs_forward_free(zs_forward *f);
/* Runs the batch through all buckets; writes n_logits rows of vocab_size floats to logits.
 * Returns 0, or the error of a failed acquire (the caller's sequences are then unchanged apart
 * from their reserved room). */
int  zs_forward_run(zs_forward *f, zs_weight_source *src, zs_kvcache *kv, const zs_batch *b,
                    float *logits);

#endif

/* lora.h — LoRA adapters of a llama-family base in PEFT's format (adapter_config.json +
 * adapter_model.safetensors), both ways: an adapter made by PEFT loads here, one saved here loads
 * in PEFT (and vLLM). Each adapted projection W [out, in] of layer l gets A [r, in] and
 * B [out, r], both f32, and y = W·x + scale·B·(A·x) with scale = alpha / r (alpha / sqrt(r) with
 * use_rslora), as PEFT's LoraLayer computes it.
 *
 * Read but not acted upon: base_model_name_or_path, task_type and inference_mode (the adapter fits
 * a base when its shapes do); lora_dropout is used by training only.
 *
 * What is refused, with a message naming the file and the key: another peft_type, DoRA, bias
 * other than "none", modules_to_save, fan_in_fan_out, layers_to_transform / layers_pattern,
 * rank_pattern / alpha_pattern entries, a regular-expression target_modules, targets the base does
 * not have (Phi-3's fused qkv_proj / gate_up_proj are not supported yet; MLP targets (gate_proj /
 * up_proj / down_proj) on a model with mixture-of-experts layers), r <= 0, tensors
 * missing, extra or of the wrong shape, and anything the safetensors reader refuses (truncated
 * files).
 *
 * Storage: every A and B of an adapter live in one flat f32 block (per target in ZS_LORA_* order: A
 * of every layer, then B of every layer), so that training all-reduces, clips, updates and
 * checkpoints it as one array (zs_lora_data).
 *
 * Ownership: a zs_lora owns its matrices; it is read-only once loaded and may be shared by
 * threads (training updates it between steps only). Reference counting of served adapters is the
 * server's (api-models.c). */
#ifndef ZS_LORA_H
#define ZS_LORA_H

#include "model.h"

/* The projections an adapter may target (PEFT's module names q_proj, k_proj, v_proj, o_proj,
 * gate_proj, up_proj, down_proj). */
enum { ZS_LORA_Q, ZS_LORA_K, ZS_LORA_V, ZS_LORA_O, ZS_LORA_GATE, ZS_LORA_UP, ZS_LORA_DOWN, ZS_LORA_NT };
#define ZS_LORA_ALL ((1u << ZS_LORA_NT) - 1)

typedef struct {
    int r;             /* rank, >= 1 */
    float alpha;       /* lora_alpha */
    int rslora;        /* use_rslora: scale alpha / sqrt(r) */
    float dropout;     /* lora_dropout (training only) */
    unsigned targets;  /* bit t set: ZS_LORA_t is adapted, in every layer; 0 in zs_lora_new: the base's
                          zs_lora_default_targets */
} zs_lora_params;

typedef struct zs_lora zs_lora;

const char *zs_lora_target_name(int t); /* "q_proj", ... */
/* The targets an adapter gets when none are named: all seven, or for a model with mixture-of-
 * experts layers the attention projections (q, k, v, o), whose experts are not adaptable. */
unsigned zs_lora_default_targets(const zs_model_config *c);
/* 0, or ZS_EUNSUPPORTED naming the first target the base cannot take (an MLP target on a model
 * with mixture-of-experts layers). */
int zs_lora_check_targets(const zs_model_config *c, unsigned targets);
int zs_lora_target_role(int t);         /* ZS_R_WQ, ... */
/* A zero adapter for base (B = 0, A = 0: the caller initialises them; PEFT's own init is
 * kaiming-uniform A and zero B). ZS_EINVAL / ZS_EUNSUPPORTED naming the problem. */
int zs_lora_new(const zs_model *base, const zs_lora_params *p, zs_lora **out);
/* Reads a PEFT adapter directory for base. */
int zs_lora_load(const char *dir, const zs_model *base, zs_lora **out);
/* Writes dir/adapter_config.json and dir/adapter_model.safetensors (f32) as PEFT's save_pretrained
 * does (each file atomically; dir is created). base_name goes to base_model_name_or_path. */
int zs_lora_save(const zs_lora *l, const char *dir, const char *base_name);
void zs_lora_free(zs_lora *l);
/* A zeroed adapter of src's shape and parameters (gradients, optimizer moments). */
int zs_lora_new_like(const zs_lora *src, zs_lora **out);
/* dst's parameters = src's (same shape, else ZS_EINVAL). */
int zs_lora_copy(zs_lora *dst, const zs_lora *src);
/* PEFT's initialisation (init_lora_weights=True): every A kaiming-uniform with a = sqrt(5), i.e.
 * U(-1/sqrt(in), 1/sqrt(in)), from a deterministic stream of seed; every B zero (the adapter
 * starts as the identity change). */
void zs_lora_init(zs_lora *l, uint64_t seed);
/* Serving: builds transposed copies of every A and B, which zs_lora_apply(_rows) then read with
 * vector kernels (kernels/cpu/lora-kern.h: each element one fused multiply-add chain,
 * batch-invariant) instead of dot products over the PEFT layout. bf16: the copies in bf16
 * (rounded to nearest even; half the bytes each step reads; the server uses it over a base whose
 * matrices are 16-bit or block formats, keeping f32 over an f32 base). The adapter must not change
 * afterwards (a served adapter is read-only; training never freezes). Idempotent for the same
 * bf16; ZS_ENOMEM. Not thread-safe: call before the adapter is shared. */
int zs_lora_freeze(zs_lora *l, int bf16);
/* An adapter fits base when it has base's layer count and every target's [out, in] is base's
 * projection's (an adapter loaded for another base, or made by zs_lora_new for one); GPT-2 takes
 * none. ZS_EINVAL / ZS_EUNSUPPORTED naming the target and both shapes. */
int zs_lora_check_base(const zs_lora *l, const zs_model *base);
/* The serving copies' element type the server picks for base: 1 (bf16) unless its matrices are f32. */
int zs_lora_serving_bf16(const zs_model *base);
/* Every parameter as one flat array of *n floats (see Storage above). */
float *zs_lora_data(zs_lora *l, size_t *n);
const float *zs_lora_data_const(const zs_lora *l, size_t *n);
int zs_lora_n_layers(const zs_lora *l);

/* `zeroserve export --merge` (lora-merge.c): writes out_dir as a full Hugging Face model directory:
 * base_dir's safetensors with W += scale·B·A on every adapted projection (computed in f32, stored
 * in W's dtype, rounded to nearest even), every other tensor and file (config.json, tokenizer
 * files, generation_config.json) as they are. The base must be a Hugging Face directory (not
 * GGUF). Written into out_dir.tmp and renamed into place. Errors name the file and the problem. */
int zs_lora_merge_export(const char *base_dir, const char *adapter_dir, const char *out_dir);

/* y[n, out] += scale · (x[n, in]·Aᵀ)·Bᵀ for target t of layer `layer` (nothing when t is not a
 * target): u = scale·(x·Aᵀ), then y += u·Bᵀ. Every element is one dot product in a fixed order
 * (8 lanes over k, added pairwise, then the tail), so a row's result depends on that row alone
 * (batch-invariant) and not on the thread count. scratch holds zs_lora_apply_scratch(l, n) floats. */
void zs_lora_apply(const zs_lora *l, int layer, int t, float *y, const float *x, int n, float *scratch);
size_t zs_lora_apply_scratch(const zs_lora *l, int n); /* n * r */
/* The same for several adapters at once, each over its own rows of x [.., in] and y [.., out]
 * (rows[i], or row0 + i when rows is NULL; the groups' rows must not overlap): one pass of the
 * kernel pool per phase for all of them, each adapter's A and B read once. Groups whose adapter
 * lacks target t or whose shape is not in -> out are skipped. u: sum over groups of n * r floats.
 * ZS_ENOMEM only (more than 16 groups need a small allocation). */
typedef struct {
    const zs_lora *l;
    const int *rows;
    int row0, n;
} zs_lora_rows;
int zs_lora_apply_rows(const zs_lora_rows *g, int ng, int layer, int t, float *y, int out, const float *x, int in,
                       float *u);

const zs_lora_params *zs_lora_get_params(const zs_lora *l);
float zs_lora_scale(const zs_lora *l);
/* A [r, in] and B [out, r] of target t in layer l (NULL when t is not a target), with in / out. */
float *zs_lora_A(zs_lora *l, int layer, int t);
float *zs_lora_B(zs_lora *l, int layer, int t);
const float *zs_lora_A_const(const zs_lora *l, int layer, int t);
const float *zs_lora_B_const(const zs_lora *l, int layer, int t);
int zs_lora_dims(const zs_lora *l, int t, int *in, int *out);
/* Parameters of the adapter (sum of r·(in + out) over layers and targets). */
size_t zs_lora_param_count(const zs_lora *l);

#endif

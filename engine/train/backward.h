/* backward.h — the training forward and backward pass over one micro-batch of B sequences of T
 * tokens (full causal attention inside each sequence, no KV cache), organised by BUCKET so that a
 * ZeRO-3 step can gather each bucket, use it and release it: forward in pass order (embed,
 * layer 0 .. L-1, head — which also reads the embedding bucket when the head is tied), then
 * backward in reverse (head already started by zs_train_head, layer L-1 .. 0, embed).
 *
 * Activation checkpointing (DESIGN.md §5): the forward keeps only the input x_l of each layer
 * ([B*T*dim] floats per layer, plus the final one); the backward of layer l recomputes that
 * layer's activations from x_l with the same arithmetic as the inference forward (forward.c) and
 * then backpropagates through it. Memory: (L+1)·B·T·dim checkpoints plus one layer's workspace
 * plus a [rows, vocab] block of logits for the head.
 *
 * Weights: `data` is the bucket's full (gathered) data area and `res` its resident area, laid
 * out by zs_model_layout(m, bucket), in the model's storage dtype (f32, f16 or bf16; norms and
 * biases f32). Gradients: f32, laid out by zs_model_grad_layout(m, bucket), `g_data` the data
 * area (data_bytes) and `g_res` the resident area (resident_bytes). Every backward call
 * ACCUMULATES (+=) into the gradients, so calling a whole pass once per micro-batch on the same
 * gradient buffers sums the micro-batches' gradients (each one the gradient of its own mean
 * loss: divide by the number of micro-batches, or weight them, for a mean over the step); the
 * caller zeroes the gradients at the start of a step.
 *
 * Call order for one micro-batch (anything else is ZS_EINVAL):
 *   zs_train_embed_fwd, zs_train_layer_fwd(0 .. L-1), zs_train_head,
 *   zs_train_layer_bwd(L-1 .. 0), zs_train_embed_bwd.
 * A new zs_train_embed_fwd may start over at any point (the previous pass is abandoned).
 *
 * Ownership and threads: a trainer owns its scratch and copies tokens and targets; the model must
 * outlive it. One trainer is used by one thread at a time; several trainers may share a model.
 * The matrix products use the process's kernel pool (zs_op_matmul) and OpenBLAS threads. */
#ifndef ZS_BACKWARD_H
#define ZS_BACKWARD_H

#include <stdint.h>

#include "model.h"

typedef struct zs_trainer zs_trainer;

/* Scratch for micro-batches of B sequences of T tokens (T <= the model's max_seq). */
int  zs_trainer_new(const zs_model *m, int B, int T, zs_trainer **out);
/* The same on a rank's CUDA device (backward-cuda.c): `dev` is the rank's zs_device (device.h).
 * The weights handed to the calls below (`data`) are then DEVICE pointers (the gathered buckets
 * of a CUDA world); `res` stays the host resident area (uploaded by the trainer); the gradients
 * stay host f32 buffers with the same layout and += contract (each bucket's gradient is computed
 * on the device with fp32 accumulation and added into the host buffer once). Activations stay f32
 * on the device; a 16-bit weight's product takes its input rounded to the weight's dtype (tensor
 * cores), as the CUDA forward does. ZS_EUNSUPPORTED when built without
 * CUDA, or for what the device trainer does not cover (named in the message). */
int  zs_trainer_new_device(const zs_model *m, int B, int T, void *dev, zs_trainer **out);
/* Multiplies the gradient of the loss by s (> 0) from the next pass on (fp16 loss scaling: on a
 * device that computes in 16-bit the scale must be in the backward itself). Default 1. */
int  zs_trainer_set_loss_scale(zs_trainer *t, float s);
void zs_trainer_free(zs_trainer *t);
/* Bytes of scratch the trainer holds. */
size_t zs_trainer_bytes(const zs_trainer *t);

/* Frozen-base LoRA mode (lora.h), for the passes that follow until it is changed: with an adapter,
 * every adapted projection computes y = W·x + scale·B·(A·drop(x)) in the forward and in the
 * backward's recompute (zs_lora_apply's arithmetic; drop: nn.Dropout with p = the adapter's
 * lora_dropout, on the input of lora_A only, the base sees x as it is), and the backward
 * accumulates (+=) only the adapter's gradient into grad (same shape as the adapter; the caller
 * zeroes it), with dx through the base weights as before. No base tensor gets a gradient: the
 * g_* pointers of zs_train_head / zs_train_layer_bwd / zs_train_embed_bwd are ignored (NULL is
 * fine), and the base weights may be of any dtype, block formats included (the dx products
 * dequantize their rows). grad NULL: forward only, without dropout (zs_train_head computes the
 * loss and ends the pass: evaluation). Dropout masks are a fixed function of (seed, key, layer, target, element
 * index in the micro-batch): the same in the recompute, and for the same key whatever rank runs
 * the micro-batch; p = 0 makes no masks. adapter NULL: back to full training (grad must be NULL).
 * The adapter and grad are borrowed (read / accumulated during the passes; they must outlive
 * them) and must fit the model (ZS_EINVAL otherwise); scratch for them is allocated here
 * (counted by zs_trainer_bytes). Abandons a pass in progress.
 *
 * The embedding forward reads an inference model's host lookup tables (zs_model_embed_lookup:
 * zs_model_embed_table) instead of the bucket; data and res may then be NULL. */
int zs_trainer_set_lora(zs_trainer *t, const zs_lora *adapter, zs_lora *grad, uint64_t seed, uint64_t key);

/* Mixtures of experts (model.h): the source each MoE layer takes its experts from, and where their
 * gradients go. zs_train_layer_fwd of a MoE layer routes its tokens, calls src->experts() with the
 * experts they selected and acquires/releases every agreed expert in increasing order (the
 * protocol of model.h); zs_train_layer_bwd of that layer acquires/releases the same agreed experts
 * again, in the same order, without a new agreement (src->experts is not called), and accumulates
 * (+=) expert e's gradient into egrad(gctx, layer, e): its f32 gradient in the layout
 * zs_model_grad_layout of the expert bucket, the data area (data_bytes) immediately followed by the
 * resident area (resident_bytes: an expert has one only when a persist threshold keeps its
 * matrices resident); NULL from egrad, or egrad NULL: no gradient, as in LoRA and evaluation.
 * egrad is called only for the experts this trainer's own tokens selected (an agreed expert
 * without local rows has a zero gradient here), once per layer backward, in increasing order.
 * The router and the shared expert are in the layer bucket and get their gradients with it. The
 * auxiliary load-balancing loss (transformers' load_balancing_loss_func over the sparse layers,
 * times router_aux_loss_coef, when the config has output_router_logits) is added to the loss
 * zs_train_head reports and to the router gradients. src and the callback are borrowed and must
 * outlive the passes; a MoE model without them is ZS_EINVAL at its first MoE layer.
 *
 * Arithmetic (transformers' sparse blocks, f32): logits = xn2·Wrᵀ, softmax over the experts, the
 * top k in descending order (a tie: the lower expert), divided by their sum when norm_topk_prob;
 * each agreed expert computes SwiGLU over its rows (tokens in increasing order) and the block's
 * output adds y·w per token in increasing expert order, then (Qwen2-MoE) sigmoid(xn2·Wsgᵀ)·shared.
 * The router's gradient goes through the renormalisation and the softmax, not through the top-k
 * selection (as torch). The auxiliary loss of a micro-batch: with S its sparse layers, n = S·B·T
 * rows (every token of every sparse layer: our micro-batches are whole rows without an attention
 * mask, so masked targets and padding count, as transformers without attention_mask), f_e = the
 * share of the rows' top-k choices that are e, P_e = the mean probability of e:
 * aux = E·Σ_e f_e·P_e, the loss CE + coef·aux, and d/dp of every row's probability of e is
 * coef·E·f_e/n (f_e is not differentiated). A micro-batch without counted targets reports 0 and
 * contributes no gradient, the auxiliary loss included.
 *
 * Failures: once a MoE layer call has made its agreement, it acquires and releases every agreed
 * expert before it returns, even after a failure. A caller whose pass failed still drives the
 * weight source through the rest of the pass (so that the other ranks' collectives complete):
 * after a failed or skipped zs_train_layer_fwd / zs_train_layer_bwd of a MoE layer, still holding
 * the layer bucket, it calls zs_trainer_experts_sync, which completes that layer's part of the
 * protocol without computing: forward (backward 0): the agreement with an all-zero mask unless the
 * failed call made it, then an acquire/release of every agreed expert the call did not reach;
 * backward: the acquire/release of this pass's agreed experts that the failed call did not reach.
 * Returns experts()'s error (acquire errors are the pass's and ignored here); 0 for a dense layer. */
typedef float *(*zs_expert_grad_fn)(void *gctx, int layer, int e);
int zs_trainer_set_experts(zs_trainer *t, const zs_weight_source *src, zs_expert_grad_fn egrad, void *gctx);
/* The experts layer `layer` agreed on in the current pass (ZS_EXPERT_WORDS words; zeros before its
 * forward): the expert buckets whose gradients the step reduces (every rank the same). */
const uint64_t *zs_trainer_experts_used(const zs_trainer *t, int layer);
int zs_trainer_experts_sync(zs_trainer *t, int layer, int backward);

/* Embeddings of tokens[B*T] (sequence b is tokens[b*T .. b*T+T), positions 0..T-1). Checks the
 * ids (ZS_ERANGE). */
int zs_train_embed_fwd(zs_trainer *t, const void *data, const void *res, const int32_t *tokens);
/* Layer `layer` forward from its stored input; stores the next layer's input. */
int zs_train_layer_fwd(zs_trainer *t, int layer, const void *data, const void *res);
/* Final norm + LM head + cross-entropy against targets[B*T] (target of token i = the token that
 * follows it; negative = masked). *loss = mean over the unmasked targets (0 when there are none;
 * then every gradient contribution is 0). Then starts the backward: accumulates the gradient of
 * the final norm (g_head_res / g_head_data), of the LM head (g_head_data, untied) or of the tied
 * embedding table (g_embed_data / g_embed_res: the grad areas of the EMBEDDING bucket, whichever
 * holds the token-embedding slot; both may be NULL when the head is untied), and keeps the
 * gradient of the last layer's output for zs_train_layer_bwd. head_data/head_res are the head
 * bucket's areas, embed_data/embed_res the embedding bucket's (used only when tied).
 * Evaluation: with all four gradient pointers NULL it computes the loss only and ends the pass
 * (no backward follows; nothing is accumulated). */
int zs_train_head(zs_trainer *t, const void *head_data, const void *head_res, const void *embed_data,
                  const void *embed_res, const int32_t *targets, float *loss, float *g_head_data,
                  float *g_head_res, float *g_embed_data, float *g_embed_res);
/* Recomputes layer `layer` from its stored input and backpropagates through it: accumulates its
 * parameter gradients into g_data / g_res (layout zs_model_grad_layout of the layer's bucket) and
 * turns the kept gradient into that of the layer's input. */
int zs_train_layer_bwd(zs_trainer *t, int layer, const void *data, const void *res, float *g_data,
                       float *g_res);
/* Accumulates the gradient of the token (and, GPT-2, position) embeddings. Ends the pass. It
 * reads no weights: data and res may be NULL (a ZeRO-3 step need not gather the bucket again). */
int zs_train_embed_bwd(zs_trainer *t, const void *data, const void *res, float *g_data, float *g_res);

#endif

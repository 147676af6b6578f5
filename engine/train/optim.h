/* optim.h — the optimizer side of training (DESIGN.md §3 step 6, §5): AdamW on fp32 master
 * shards with fp32 moments (ZeRO-Offload style: each rank updates only its own shard, on the
 * CPU, vectorised and spread over the kernel thread pool), the learning-rate schedules of a
 * DeepSpeed config, and the two halves of global-norm gradient clipping.
 *
 * Determinism: every function here gives bit-identical results whatever the thread count
 * (ZS_THREADS) and whichever SIMD width the CPU has: the update is element-wise with a fixed
 * operation order and no FMA contraction, and zs_sumsq sums fixed chunks (a function of n only)
 * in a fixed order. (Env ZS_OPTIM_SCALAR=1 forces the scalar update loop, for tests. x86-64
 * only is covered by this guarantee: elsewhere the compiler may contract a*b+c into an FMA.)
 *
 * Ownership: callers own every array; nothing is retained after a call returns.
 * Thread safety: all functions are reentrant. Calls from several rank threads at once are fine
 * (the pool runs their jobs in turn); the arrays of concurrent calls must not overlap. They use
 * the kernel pool (zs_pool_run), so they must not be called from inside a pool task. */
#ifndef ZS_OPTIM_H
#define ZS_OPTIM_H

#include <stddef.h>

#include "dsconfig.h"
#include "tensor.h"

/* ---------- AdamW ---------- */

typedef struct {
    float lr;           /* base (peak) LR; the update itself takes this step's LR separately */
    float beta1, beta2; /* each in [0, 1) */
    float eps;          /* > 0 */
    float weight_decay; /* >= 0, decoupled (AdamW) */
} zs_adamw_params;

/* torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01. */
void zs_adamw_params_default(zs_adamw_params *p);
/* The defaults, overridden by whatever optimizer.params the DeepSpeed options set. Always 0. */
int zs_adamw_params_from_opts(const zs_zero_opts *o, zs_adamw_params *p);

/* One AdamW step over n elements, exactly the torch.optim.AdamW (foreach=False) rule in fp32,
 * with the scalar factors computed in double and rounded to float once:
 *     c1 = 1 - beta1^t, c2 = 1 - beta2^t                          (double)
 *     p  = p * (1 - lr*wd)             [only when decay = 1; decoupled weight decay]
 *     m  = beta1*m + (1-beta1)*g
 *     v  = beta2*v + (1-beta2)*(g*g)
 *     p  = p - (lr/c1) * (m / (sqrt(v)/sqrt(c2) + eps))
 * i.e. p -= lr * mhat / (sqrt(vhat) + eps) with mhat = m/c1, vhat = v/c2.
 * master, m, v: fp32, updated in place; grad: fp32, already averaged over micro-batches and
 * clipped; t: the 1-based step number (bias correction); lr: this step's LR (zs_lr_at; p->lr is
 * not used); decay: 1 applies p->weight_decay, 0 skips it (norms and biases: call per region).
 * out (may be NULL): receives the updated master converted to out_dtype (F32/F16/BF16, round to
 * nearest even), n elements, e.g. the storage-dtype shard of the weights.
 * Arrays must not overlap (out may not alias master unless out_dtype is F32 and out == master).
 * Runs in chunks of ZS_ADAMW_CHUNK elements on the pool (n below one chunk: on the calling
 * thread). ZS_EINVAL for t < 1, NULL arrays with n > 0, or bad hyper-parameters. */
#define ZS_ADAMW_CHUNK 32768
int zs_adamw_update(float *master, float *m, float *v, const float *grad, size_t n,
                    const zs_adamw_params *p, float lr, long t, int decay, void *out,
                    zs_dtype out_dtype);

/* ---------- learning-rate schedule ---------- */

/* The LR of optimizer step t (1-based). With k = t - 1 (the number of steps already taken:
 * DeepSpeed's last_batch_iteration when it computes the LR used by step t; Hugging Face's
 * schedules use the same convention), W = warmup_steps, T = total_steps, L = lr,
 * a = warmup_min_ratio, b = min_lr_ratio:
 *   warm-up, for k < W (none when W = 0):
 *       linear: g = k / W
 *       log:    g = ln(k + 1) / ln(max(W, 2))
 *       LR = L * (a + (1 - a) * g)
 *   after the warm-up (k >= W), by type:
 *       ZS_LR_CONSTANT        (WarmupLR, or no scheduler)  LR = L
 *       ZS_LR_WARMUP_LINEAR   (WarmupDecayLR)  g = max(0, (T - k) / max(1, T - W))
 *                                              LR = L * (b + (1 - b) * g)
 *       ZS_LR_WARMUP_COSINE   (WarmupCosineLR) j = min(k - W + 1, T - W)
 *                                              g = (1 + cos(pi * j / (T - W))) / 2
 *                                              LR = L * (b + (1 - b) * g)   (L * b if T <= W)
 * computed in double, returned as float. These are DeepSpeed's formulas, except that: W = 0
 * means no warm-up (DeepSpeed raises W to 2), and the cosine stays at its floor after T
 * (DeepSpeed's climbs back up). For WarmupLR/WarmupDecayLR, DeepSpeed's warmup_min_lr and
 * warmup_max_lr map to a = b = min/max and L = max. A step t < 1 is taken as 1. */
typedef struct {
    int type;               /* zs_lr_sched: what follows the warm-up */
    int warmup_type;        /* zs_warmup_type: ZS_WARMUP_LINEAR or ZS_WARMUP_LOG */
    float lr;               /* peak LR (L) */
    float warmup_min_ratio; /* LR at the start of the warm-up, as a fraction of lr (a) */
    float min_lr_ratio;     /* floor of the decay, as a fraction of lr (b) */
    int warmup_steps;       /* W >= 0 */
    int total_steps;        /* T: end of the decay (used by the decaying types) */
} zs_lr_schedule;

float zs_lr_at(const zs_lr_schedule *s, long step);

/* The schedule a DeepSpeed config asks for, with DeepSpeed's defaults for unset fields:
 *  - no scheduler:   constant at optimizer.params.lr (default 1e-3), no warm-up;
 *  - WarmupLR:       L = warmup_max_lr (0.001), a = warmup_min_lr (0) / L, W = 1000, log;
 *  - WarmupDecayLR:  as WarmupLR, b = a (decays to warmup_min_lr), total_num_steps required;
 *  - WarmupCosineLR: L = optimizer.params.lr (1e-3), a = warmup_min_ratio (0),
 *                    b = cos_min_ratio (1e-4), W = 1000, log, total_num_steps required.
 * ZS_EINVAL (message naming the key) when a required key is missing or T < W. */
int zs_lr_schedule_from_opts(const zs_zero_opts *o, zs_lr_schedule *out);

/* ---------- gradient clipping by global norm ---------- */

/* Sum of squares of n floats, accumulated in double. Deterministic: fixed chunks (a function of
 * n only) are summed with 8 fixed lanes each, and the chunk sums are added in order; run on the
 * pool. The global norm of a partitioned gradient is sqrt of the sum over ranks (all_reduce). */
double zs_sumsq(const float *g, size_t n);
/* g[i] *= s for n elements (on the pool). */
void zs_scale(float *g, size_t n, float s);
/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (sqrt(sumsq) + 1e-6)); 1 when
 * max_norm <= 0 (clipping off). NAN when sumsq is not finite: callers should test
 * isfinite(sumsq) first and skip the step. */
float zs_clip_coef(double sumsq, float max_norm);

#endif

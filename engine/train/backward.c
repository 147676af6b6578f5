/* backward.c — training forward and backward over one micro-batch (backward.h): embeddings,
 * transformer blocks with activation checkpointing (each layer recomputed from its stored input
 * in the backward), final norm + LM head + masked cross-entropy, for Llama-family (with the
 * pieces of Qwen3, Gemma 2/3, Phi-3 and Mistral: q/k norms, sandwich norms, GeGLU, soft-capping,
 * sliding windows, scaled RoPE, scaled embeddings) and GPT-2
 * models on the CPU. The forward arithmetic is that of forward.c; the backward ops are in
 * kernels/cpu/ops-backward.c. With a LoRA adapter set (zs_trainer_set_lora) the base is frozen:
 * every adapted projection adds scale·B·A·drop(x) in the forward and the recompute, the backward
 * accumulates only the adapter's gradient, and the base weights may be of any dtype (block formats
 * dequantized in the dx products) and may belong to an inference model (host embedding tables).
 * Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the sparse block as forward.c computes
 * it (routing, the agreed experts acquired through the expert source in increasing order, the shared
 * expert), recomputed in the backward with the experts acquired again; gradients of the experts
 * (egrad), the router (through the renormalisation and the softmax, plus the auxiliary
 * load-balancing loss) and the shared expert and its gate; OLMoE's whole-projection q/k norms and
 * clip_qkv. A trainer made by zs_trainer_new_device (built with CUDA) only forwards each public call
 * to the device trainer of backward-cuda.c (backward-cuda.h). */
#include "backward.h"
#include "slotptr.h"

#include <math.h>
#include <string.h>

#include "common.h"
#include "lora.h"
#include "ops.h"
#include "rope.h"
#include "train-ops.h"

#ifdef ZS_CUDA
#include "backward-cuda.h"
/* A trainer made by zs_trainer_new_device: every public call goes to the device trainer. */
#define DEV_FORWARD(t, call)          \
    do {                              \
        if ((t)->dev) return (call);  \
    } while (0)
#else
typedef struct zs_trainer_cuda zs_trainer_cuda; /* never made without CUDA: dev stays NULL */
#define DEV_FORWARD(t, call) ((void)0)
#endif

/* pass steps, in order: 0 embed fwd, 1..L layer fwd, L+1 head, L+2..2L+1 layer bwd (L-1..0),
 * 2L+2 embed bwd */
struct zs_trainer {
    zs_trainer_cuda *dev;   /* zs_trainer_new_device: the device trainer (backward-cuda.c) does the
                               work; only m and c are set here. NULL: this CPU trainer */
    const zs_model *m;
    const zs_model_config *c;
    int B, T, N, d, qd, kvd, ff, V, L;
    int next;               /* the next step of the pass; -1 before the first embed fwd */
    float loss_scale;       /* zs_trainer_set_loss_scale: multiplies the loss's gradient (1) */
    size_t bytes;
    int32_t *tokens, *pos;  /* [N] */
    float *xs;              /* [(L+1) * N * d]: input of each layer, then the head's input */
    float *dres;            /* [N*d] gradient of the residual stream at the current point */
    /* one layer's activations (recomputed in backward) */
    float *xn1, *q, *k, *v, *att, *xmid, *xn2, *hg, *hu, *ha, *tmp;
    /* their gradients */
    float *dxn, *dq, *dk, *dv, *datt, *dhg, *dhu, *dha;
    float *scores;          /* [2T] */
    /* the newer families: q and k before their per-head norms (qk_norm), the attention and MLP
     * outputs before their post-norms (post_norms), a gradient buffer for those, the soft-capped
     * logits (final_softcap), RoPE frequencies ([0] global, [1] local layers; position-dependent
     * types: one row per position 0..T-1 in freq_tok, factor in tok_af, made once) */
    float *qraw, *kraw, *dqraw, *dkraw, *ao, *mo, *dtmp, *capped;
    float *freq[2], freq_af[2], *freq_tok, *tok_af;
    float *logits;          /* [chunk * V] */
    int chunk;
    float *wscratch;        /* [ZS_MATMUL_BWD_BLOCK * max(in)] for f16/bf16 weights */
    /* frozen-base LoRA (zs_trainer_set_lora): the adapter, its gradient (NULL: forward only),
     * the dropout stream; per target the scaled u = s·A·drop(x) of the current layer [N*r]; the
     * dropped input [N*max in], B·u [N*max out], d(s·u) [N*r], the gradient of drop(x) [N*max in] */
    const zs_lora *lora;
    zs_lora *lgrad;
    uint64_t lseed, lkey;
    float lp;
    float *lu[ZS_LORA_NT], *lxd, *lv, *ldu, *ldx;
    size_t lbytes;
    /* mixtures of experts (zs_config_layer_moe layers): E experts, top K, expert / shared ffn widths;
     * the expert source and gradient callback (zs_trainer_set_experts); per layer the agreed experts
     * of this pass; of the current layer: router probabilities rp [N*E] (their gradient drp), the K
     * selected experts of each token (sel, descending probability), their probabilities sp and
     * routing weights rw (after the renormalisation), drw the gradient of rw; the rows of each expert
     * (erow: token, eslot: index into sel; expert e's rows are eoff[e] .. eoff[e+1]-1, increasing
     * tokens); the local mask; gathered rows ex and expert outputs ey [N*d], their gradients edy,
     * edx; the shared expert's output shv [N*d] and gate sg [N] (sigmoid); OLMoE's clip_qkv masks.
     * The auxiliary loss: selections acnt and probability sums apsum per expert over the sparse
     * layers of this forward (an of them), and agrad, d(coef * aux)/d p (one value per expert). */
    int E, K, mf, sf;
    const zs_weight_source *xsrc;
    zs_expert_grad_fn egrad;
    void *gctx;
    uint64_t *agreed;       /* [L * ZS_EXPERT_WORDS] */
    uint64_t xmask[ZS_EXPERT_WORDS];
    float *rp, *drp, *sp, *rw, *drw, *ex, *ey, *edy, *edx, *shv, *sg;
    int32_t *sel, *erow, *eslot, *eoff, *ecur;
    unsigned char *clipm;   /* [N * (qd + 2 kvd)]: 1 where q | k | v was inside [-clip, clip] */
    double *acnt, *apsum;
    float *agrad;
    int an;
    /* the expert protocol of the current MoE layer call (zs_trainer_experts_sync): layer, phase
     * (0 forward, 1 backward), the last expert acquired, whether the forward's agreement was made,
     * and whether a sync may continue from there (only after a failed call) */
    int xl, xph, xlast, xagreed, xvalid;
};

static float *talloc(zs_trainer *t, size_t n) {
    size_t b = ZS_ALIGN_UP(ZS_MAX(n, (size_t)1) * sizeof(float), 64);
    float *p = zs_aligned_alloc(64, b);
    if (p) t->bytes += b;
    return p;
}

int zs_trainer_new(const zs_model *m, int B, int T, zs_trainer **out) {
    const zs_model_config *c = zs_model_config_get(m);
    if (B <= 0 || T <= 0) return zs_err(ZS_EINVAL, "trainer: batch %d x %d tokens must be positive", B, T);
    if (T > c->max_seq)
        return zs_err(ZS_ERANGE, "trainer: sequence length %d exceeds the model's context %d", T, c->max_seq);
    if ((size_t)B * (size_t)T > (size_t)1 << 30) return zs_err(ZS_ERANGE, "trainer: batch too large");
    zs_trainer *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->m = m;
    t->c = c;
    t->loss_scale = 1.0f;
    t->B = B;
    t->T = T;
    t->N = B * T;
    t->d = c->dim;
    t->qd = c->n_heads * c->head_dim;
    t->kvd = c->n_kv_heads * c->head_dim;
    t->ff = c->ffn_dim;
    t->V = c->vocab_size;
    t->L = c->n_layers;
    t->next = -1;
    if (c->n_experts > 0) {
        if (c->n_experts > ZS_MAX_EXPERTS || c->n_experts_used < 1 || c->n_experts_used > c->n_experts ||
            c->moe_ffn_dim < 1 || c->shared_ffn_dim < 0) {
            free(t);
            return zs_err(ZS_EINVAL, "trainer: %d experts, top %d, expert width %d: not a mixture of experts it can train",
                          c->n_experts, c->n_experts_used, c->moe_ffn_dim);
        }
        t->E = c->n_experts;
        t->K = c->n_experts_used;
        t->mf = c->moe_ffn_dim;
        t->sf = c->shared_ffn_dim;
    }
    /* the MLP activations are sized for the widest MLP: dense, expert or shared */
    size_t N = (size_t)t->N, d = (size_t)t->d, qd = (size_t)t->qd, kvd = (size_t)t->kvd;
    size_t ff = (size_t)ZS_MAX(t->ff, ZS_MAX(t->mf, t->sf));
    t->chunk = (int)ZS_MIN(N, ZS_MAX((size_t)1, ((size_t)1 << 22) / (size_t)t->V));
    size_t wide = ZS_MAX(d, ZS_MAX(qd, ff));
    t->tokens = calloc(N, sizeof(int32_t));
    t->pos = calloc(N, sizeof(int32_t));
    t->xs = talloc(t, ((size_t)t->L + 1) * N * d);
    t->dres = talloc(t, N * d);
    t->xn1 = talloc(t, N * d);
    t->q = talloc(t, N * qd);
    t->k = talloc(t, N * kvd);
    t->v = talloc(t, N * kvd);
    t->att = talloc(t, N * qd);
    t->xmid = talloc(t, N * d);
    t->xn2 = talloc(t, N * d);
    t->hg = talloc(t, N * ff);
    t->hu = talloc(t, N * ff);
    t->ha = talloc(t, N * ff);
    t->tmp = talloc(t, N * d);
    t->dxn = talloc(t, N * d);
    t->dq = talloc(t, N * qd);
    t->dk = talloc(t, N * kvd);
    t->dv = talloc(t, N * kvd);
    t->datt = talloc(t, N * qd);
    t->dhg = talloc(t, N * ff);
    t->dhu = talloc(t, N * ff);
    t->dha = talloc(t, N * ff);
    t->scores = talloc(t, 2 * (size_t)T);
    t->logits = talloc(t, (size_t)t->chunk * (size_t)t->V);
    t->wscratch = talloc(t, (size_t)ZS_MATMUL_BWD_BLOCK * wide);
    int extra_ok = 1;
    if (c->qk_norm || c->qk_norm_full) {
        extra_ok &= !!(t->qraw = talloc(t, N * qd));
        extra_ok &= !!(t->kraw = talloc(t, N * kvd));
        extra_ok &= !!(t->dqraw = talloc(t, N * qd));
        extra_ok &= !!(t->dkraw = talloc(t, N * kvd));
    }
    if (c->post_norms) {
        extra_ok &= !!(t->ao = talloc(t, N * d));
        extra_ok &= !!(t->mo = talloc(t, N * d));
    }
    extra_ok &= !!(t->dtmp = talloc(t, N * d));
    if (t->E > 0) {
        size_t E = (size_t)t->E, NK = N * (size_t)t->K;
        extra_ok &= !!(t->rp = talloc(t, N * E)) && !!(t->drp = talloc(t, N * E));
        extra_ok &= !!(t->sp = talloc(t, NK)) && !!(t->rw = talloc(t, NK)) && !!(t->drw = talloc(t, NK));
        extra_ok &= !!(t->ex = talloc(t, N * d)) && !!(t->ey = talloc(t, N * d));
        extra_ok &= !!(t->edy = talloc(t, N * d)) && !!(t->edx = talloc(t, N * d));
        extra_ok &= !!(t->shv = talloc(t, N * d)) && !!(t->sg = talloc(t, N));
        extra_ok &= !!(t->agrad = talloc(t, E));
        t->sel = calloc(NK, sizeof(int32_t));
        t->erow = calloc(NK, sizeof(int32_t));
        t->eslot = calloc(NK, sizeof(int32_t));
        t->eoff = calloc(E + 1, sizeof(int32_t));
        t->ecur = calloc(E, sizeof(int32_t));
        t->agreed = calloc((size_t)t->L * ZS_EXPERT_WORDS, sizeof(uint64_t));
        t->acnt = calloc(E, sizeof(double));
        t->apsum = calloc(E, sizeof(double));
        extra_ok &= t->sel && t->erow && t->eslot && t->eoff && t->ecur && t->agreed && t->acnt && t->apsum;
        t->bytes += 3 * NK * sizeof(int32_t) + (2 * E + 1) * sizeof(int32_t) + 2 * E * sizeof(double) +
                    (size_t)t->L * ZS_EXPERT_WORDS * sizeof(uint64_t);
    }
    if (c->clip_qkv > 0) {
        t->clipm = calloc(N * (qd + 2 * kvd), 1);
        extra_ok &= !!t->clipm;
        t->bytes += N * (qd + 2 * kvd);
    }
    if (c->final_softcap > 0) extra_ok &= !!(t->capped = talloc(t, (size_t)t->chunk * (size_t)t->V));
    size_t half = (size_t)ZS_MAX(c->head_dim / 2, 1);
    int pl = zs_rope_pos_layer(c);
    extra_ok &= !!(t->freq[0] = talloc(t, half)) && !!(t->freq[1] = talloc(t, half));
    extra_ok &= !!(t->freq_tok = talloc(t, pl >= 0 ? (size_t)T * half : 1)) && !!(t->tok_af = talloc(t, (size_t)T));
    if (extra_ok && c->arch != ZS_ARCH_GPT2)
        for (int l = c->n_layers - 1; l >= 0; l--) {
            int k = zs_rope_layer_local(c, l);
            zs_rope_freqs(c, l, 0, t->freq[k], &t->freq_af[k]);
        }
    for (int p = 0; extra_ok && pl >= 0 && p < T; p++) /* the positions are 0..T-1 in every sequence */
        zs_rope_freqs(c, pl, p, t->freq_tok + (size_t)p * half, &t->tok_af[p]);
    if (!extra_ok || !t->tokens || !t->pos || !t->xs || !t->dres || !t->xn1 || !t->q || !t->k || !t->v || !t->att ||
        !t->xmid || !t->xn2 || !t->hg || !t->hu || !t->ha || !t->tmp || !t->dxn || !t->dq || !t->dk || !t->dv ||
        !t->datt || !t->dhg || !t->dhu || !t->dha || !t->scores || !t->logits || !t->wscratch) {
        zs_trainer_free(t);
        return zs_err(ZS_ENOMEM, "trainer: cannot allocate scratch for %d x %d tokens", B, T);
    }
    t->bytes += 2 * N * sizeof(int32_t);
    for (int i = 0; i < t->N; i++) t->pos[i] = i % T;
    *out = t;
    return 0;
}

static void lora_bufs_free(zs_trainer *t) {
    for (int k = 0; k < ZS_LORA_NT; k++) {
        free(t->lu[k]);
        t->lu[k] = NULL;
    }
    free(t->lxd); free(t->lv); free(t->ldu); free(t->ldx);
    t->lxd = t->lv = t->ldu = t->ldx = NULL;
    t->bytes -= t->lbytes;
    t->lbytes = 0;
}

int zs_trainer_new_device(const zs_model *m, int B, int T, void *dev, zs_trainer **out) {
#ifdef ZS_CUDA
    if (!dev) return zs_err(ZS_EINVAL, "trainer: zs_trainer_new_device without a device");
    zs_trainer *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->m = m;
    t->c = zs_model_config_get(m);
    t->next = -1;
    t->loss_scale = 1.0f;
    int rc = zs_trainer_cuda_new(m, B, T, dev, &t->dev);
    if (rc < 0) {
        free(t);
        return rc;
    }
    *out = t;
    return 0;
#else
    (void)m; (void)B; (void)T; (void)dev; (void)out;
    return zs_err(ZS_EUNSUPPORTED, "trainer: training on a CUDA device: built without CUDA (CUDA=0)");
#endif
}

void zs_trainer_free(zs_trainer *t) {
    if (!t) return;
#ifdef ZS_CUDA
    if (t->dev) {
        zs_trainer_cuda_free(t->dev);
        free(t);
        return;
    }
#endif
    lora_bufs_free(t);
    float *bufs[] = {t->xs, t->dres, t->xn1, t->q, t->k, t->v, t->att, t->xmid, t->xn2, t->hg, t->hu,
                     t->ha, t->tmp, t->dxn, t->dq, t->dk, t->dv, t->datt, t->dhg, t->dhu, t->dha,
                     t->scores, t->logits, t->wscratch, t->qraw, t->kraw, t->dqraw, t->dkraw, t->ao, t->mo, t->dtmp, t->capped,
                     t->freq[0], t->freq[1], t->freq_tok, t->tok_af, t->rp, t->drp, t->sp, t->rw, t->drw,
                     t->ex, t->ey, t->edy, t->edx, t->shv, t->sg, t->agrad};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(t->sel); free(t->erow); free(t->eslot); free(t->eoff); free(t->ecur); free(t->agreed);
    free(t->acnt); free(t->apsum); free(t->clipm);
    free(t->tokens);
    free(t->pos);
    free(t);
}

size_t zs_trainer_bytes(const zs_trainer *t) {
    DEV_FORWARD(t, zs_trainer_cuda_bytes(t->dev));
    return t->bytes;
}

int zs_trainer_set_loss_scale(zs_trainer *t, float s) {
    DEV_FORWARD(t, zs_trainer_cuda_set_loss_scale(t->dev, s));
    if (!(s > 0) || !isfinite(s)) return zs_err(ZS_EINVAL, "trainer: the loss scale must be a finite number > 0, got %g", (double)s);
    t->loss_scale = s;
    return 0;
}

static int same_shape(const zs_lora *a, const zs_lora *b) {
    const zs_lora_params *p = zs_lora_get_params(a), *q = zs_lora_get_params(b);
    return p->r == q->r && p->targets == q->targets && zs_lora_n_layers(a) == zs_lora_n_layers(b) &&
           zs_lora_param_count(a) == zs_lora_param_count(b);
}

int zs_trainer_set_lora(zs_trainer *t, const zs_lora *adapter, zs_lora *grad, uint64_t seed, uint64_t key) {
    DEV_FORWARD(t, adapter || grad ? zs_err(ZS_EUNSUPPORTED, "trainer: LoRA adapters are not supported by the CUDA "
                                                              "device trainer yet (train them on the CPU device)")
                                   : 0);
    t->next = -1; /* a pass in progress is abandoned */
    if (!adapter) {
        if (grad) return zs_err(ZS_EINVAL, "trainer: a LoRA gradient without an adapter");
        lora_bufs_free(t);
        t->lora = NULL;
        t->lgrad = NULL;
        return 0;
    }
    const zs_lora_params *p = zs_lora_get_params(adapter);
    ZS_CHECK(zs_lora_check_base(adapter, t->m));
    if (grad && !same_shape(adapter, grad)) return zs_err(ZS_EINVAL, "trainer: the LoRA gradient's shape differs from the adapter's");
    if (!(p->dropout >= 0.0f && p->dropout < 1.0f))
        return zs_err(ZS_EINVAL, "trainer: lora dropout %g must be in [0, 1)", (double)p->dropout);
    int mx_in = 1, mx_out = 1;
    for (int k = 0; k < ZS_LORA_NT; k++) {
        if (!(p->targets >> k & 1)) continue;
        int in, out;
        zs_lora_dims(adapter, k, &in, &out);
        mx_in = ZS_MAX(mx_in, in);
        mx_out = ZS_MAX(mx_out, out);
    }
    /* buffers sized for this adapter (again when the adapter changes) */
    if (t->lora != adapter || (grad && !t->ldu)) {
        lora_bufs_free(t);
        size_t N = (size_t)t->N, r = (size_t)p->r, before = t->bytes;
        int ok = 1;
        for (int k = 0; k < ZS_LORA_NT; k++)
            if (p->targets >> k & 1) ok &= !!(t->lu[k] = talloc(t, N * r));
        ok &= !!(t->lxd = talloc(t, N * (size_t)mx_in)) && !!(t->lv = talloc(t, N * (size_t)mx_out));
        ok &= !!(t->ldu = talloc(t, N * r)) && !!(t->ldx = talloc(t, N * (size_t)mx_in));
        t->lbytes = t->bytes - before;
        if (!ok) {
            lora_bufs_free(t);
            t->lora = NULL;
            return zs_err(ZS_ENOMEM, "trainer: out of memory for the LoRA activations");
        }
    }
    t->lora = adapter;
    t->lgrad = grad;
    t->lseed = seed;
    t->lkey = key;
    t->lp = grad ? p->dropout : 0.0f; /* evaluation: no dropout */
    return 0;
}

/* ---- helpers ---- */

static int expect(zs_trainer *t, int step, const char *what) {
    if (t->next != step)
        return zs_err(ZS_EINVAL, "trainer: %s called out of order (expected step %d of the pass, at %d)", what,
                      step, t->next);
    return 0;
}

/* W, WF, G (a role's weight and gradient in a bucket): slotptr.h */

/* ---- LoRA on the adapted projections (frozen base) ---- */

static inline uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Dropout of x [n elements] before lora_A of target tg in layer l: element e is kept when the top
 * 32 bits of mix64(h + e) are >= p·2^32, h a hash of (seed, key, layer, target); kept elements
 * are scaled by 1/(1-p) (nn.Dropout). The same mask again for the same arguments. bwd: dx[e] +=
 * the scaled gradient dxd[e] of the kept elements instead. */
static void lora_drop(const zs_trainer *t, int l, int tg, float *out, const float *x, size_t n, int bwd) {
    uint64_t h = mix64(mix64(mix64(t->lseed) ^ t->lkey) ^ ((uint64_t)l << 8 | (uint64_t)tg));
    uint64_t thr = (uint64_t)((double)t->lp * 4294967296.0);
    float keep = 1.0f / (1.0f - t->lp);
    for (size_t e = 0; e < n; e++) {
        int kept = (mix64(h + e) >> 32) >= thr;
        if (bwd) {
            if (kept) out[e] += x[e] * keep;
        } else {
            out[e] = kept ? x[e] * keep : 0.0f;
        }
    }
}

/* y[n, out] += s·B·A·drop(x) for target tg of layer l (nothing without an adapter or when tg is not
 * a target), keeping s·A·drop(x) in lu[tg]: zs_lora_apply's arithmetic (u = x·Aᵀ, u *= s,
 * y += u·Bᵀ). y NULL: only u (the recompute needs it for dB where it skips the product). */
static void lora_fwd(zs_trainer *t, int l, int tg, float *y, const float *x, int n) {
    const zs_lora *lo = t->lora;
    const float *A = lo ? zs_lora_A_const(lo, l, tg) : NULL;
    if (!A) return;
    int r = zs_lora_get_params(lo)->r, in, out;
    zs_lora_dims(lo, tg, &in, &out);
    float s = zs_lora_scale(lo), *u = t->lu[tg];
    const float *xd = x;
    if (t->lp > 0.0f) {
        lora_drop(t, l, tg, t->lxd, x, (size_t)n * (size_t)in, 0);
        xd = t->lxd;
    }
    zs_op_matmul(u, xd, n, in, A, ZS_F32, r, NULL);
    for (size_t i = 0; i < (size_t)n * (size_t)r; i++) u[i] *= s;
    if (!y) return;
    zs_op_matmul(t->lv, u, n, r, zs_lora_B_const(lo, l, tg), ZS_F32, out, NULL);
    zs_op_add(y, t->lv, (size_t)n * (size_t)out);
}

/* The backward of lora_fwd given dy [n, out] (the gradient of y) and its input x: with v = s·u,
 * dB += dyᵀ·v, dv = dy·B, du = s·dv, dA += duᵀ·drop(x), dx += mask∘(du·A)/(1-p). Needs lu[tg]
 * from the recompute of this layer. */
static void lora_bwd(zs_trainer *t, int l, int tg, float *dx, const float *dy, const float *x, int n) {
    const zs_lora *lo = t->lora;
    const float *A = lo && t->lgrad ? zs_lora_A_const(lo, l, tg) : NULL;
    if (!A) return;
    int r = zs_lora_get_params(lo)->r, in, out;
    zs_lora_dims(lo, tg, &in, &out);
    float s = zs_lora_scale(lo);
    size_t nr = (size_t)n * (size_t)r, ni = (size_t)n * (size_t)in;
    memset(t->ldu, 0, nr * sizeof(float));
    zs_op_matmul_bwd(t->ldu, zs_lora_B(t->lgrad, l, tg), NULL, dy, t->lu[tg], zs_lora_B_const(lo, l, tg), ZS_F32, n,
                     r, out, NULL);
    for (size_t i = 0; i < nr; i++) t->ldu[i] *= s;
    if (t->lp > 0.0f) {
        lora_drop(t, l, tg, t->lxd, x, ni, 0);
        memset(t->ldx, 0, ni * sizeof(float));
        zs_op_matmul_bwd(t->ldx, zs_lora_A(t->lgrad, l, tg), NULL, t->ldu, t->lxd, A, ZS_F32, n, in, r, NULL);
        lora_drop(t, l, tg, dx, t->ldx, ni, 1);
    } else {
        zs_op_matmul_bwd(dx, zs_lora_A(t->lgrad, l, tg), NULL, t->ldu, x, A, ZS_F32, n, in, r, NULL);
    }
}

/* Every present slot of a bucket has its area: a NULL base for a used area is ZS_EINVAL. */
static int check_areas(const zs_bucket_layout *L, const void *data, const void *res, const char *what) {
    for (int r = 0; r < L->n_roles; r++) {
        const zs_slot *s = &L->slot[r];
        if (s->present && !(s->resident ? res : data))
            return zs_err(ZS_EINVAL, "trainer: %s: the %s area is NULL", what, s->resident ? "resident" : "data");
    }
    return 0;
}

static void norm_fwd(const zs_model_config *c, float *y, const float *x, const float *w, const float *b, int n) {
    if (c->arch == ZS_ARCH_GPT2) zs_op_layernorm(y, x, w, b, n, c->dim, c->norm_eps);
    else zs_op_rmsnorm_off(y, x, w, n, c->dim, c->norm_eps, c->norm_offset);
}

static void norm_bwd(const zs_model_config *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                     const float *w, int n) {
    if (c->arch == ZS_ARCH_GPT2) zs_op_layernorm_bwd(dx, dw, db, dy, x, w, n, c->dim, c->norm_eps);
    else zs_op_rmsnorm_off_bwd(dx, dw, dy, x, w, n, c->dim, c->norm_eps, c->norm_offset);
}

/* RoPE of every token of the batch, forward or backward (the same frequencies) */
static void rope_all(zs_trainer *t, int l, float *x, int nh, int ld, int bwd) {
    const zs_model_config *c = t->c;
    int kind = zs_rope_layer_local(c, l), per_tok = zs_rope_pos_dependent(c, l);
    size_t half = (size_t)(c->head_dim / 2);
    for (int i = 0; i < t->N; i++) {
        const float *fr = per_tok ? t->freq_tok + (size_t)t->pos[i] * half : t->freq[kind];
        float af = per_tok ? t->tok_af[t->pos[i]] : t->freq_af[kind];
        if (bwd) zs_op_rope_freq_bwd(x + (size_t)i * ld, nh, c->head_dim, t->pos[i], fr, af);
        else zs_op_rope_freq(x + (size_t)i * ld, nh, c->head_dim, t->pos[i], fr, af);
    }
}

static zs_att_params att_params(const zs_model_config *c, int l) {
    zs_att_params p = {zs_config_att_scale(c), c->attn_softcap, zs_config_layer_window(c, l)};
    return p;
}

/* torch.clamp_(x, -c, c), m[i] = 1 where x[i] was inside [-c, c] (the gradient passes there) */
static void clip_fwd(float *x, unsigned char *m, size_t n, float c) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        m[i] = v >= -c && v <= c;
        x[i] = v < -c ? -c : v > c ? c : v;
    }
}

static void clip_bwd(float *dx, const unsigned char *m, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!m[i]) dx[i] = 0.0f;
}

/* The forward of layer l from x_in, keeping its activations in the workspace; writes the layer's
 * output to x_out unless it is NULL (the backward recompute needs only the activations). A MoE
 * layer stops after its MLP input norm (xn2): the sparse block is moe_route + moe_fwd / moe_bwd. */
static void layer_compute(zs_trainer *t, int l, const void *data, const void *res, const float *x_in,
                          float *x_out) {
    const zs_model_config *c = t->c;
    const zs_bucket_layout *L = zs_model_layout(t->m, zs_bucket_layer(l));
    int n = t->N, d = t->d, qd = t->qd, kvd = t->kvd, ff = t->ff, T = t->T;
    size_t nd = (size_t)n * d;
#define WD(role) (L->slot[role].dtype) /* per matrix: a Q4_K_M mix stores them in different formats */

    norm_fwd(c, t->xn1, x_in, WF(L, ZS_R_ATTN_NORM_W, data, res), WF(L, ZS_R_ATTN_NORM_B, data, res), n);
    zs_op_matmul(t->q, t->xn1, n, d, W(L, ZS_R_WQ, data, res), WD(ZS_R_WQ), qd, WF(L, ZS_R_BQ, data, res));
    zs_op_matmul(t->k, t->xn1, n, d, W(L, ZS_R_WK, data, res), WD(ZS_R_WK), kvd, WF(L, ZS_R_BK, data, res));
    zs_op_matmul(t->v, t->xn1, n, d, W(L, ZS_R_WV, data, res), WD(ZS_R_WV), kvd, WF(L, ZS_R_BV, data, res));
    lora_fwd(t, l, ZS_LORA_Q, t->q, t->xn1, n);
    lora_fwd(t, l, ZS_LORA_K, t->k, t->xn1, n);
    lora_fwd(t, l, ZS_LORA_V, t->v, t->xn1, n);
    if (c->qk_norm || c->qk_norm_full) { /* RMSNorm of q and k per head, or (OLMoE) over the whole
                                             projection (the inputs kept for the backward) */
        int full = !c->qk_norm; /* qk_norm_full alone: OLMoE (forward.c: per head wins when both are set) */
        memcpy(t->qraw, t->q, (size_t)n * qd * sizeof(float));
        memcpy(t->kraw, t->k, (size_t)n * kvd * sizeof(float));
        zs_op_rmsnorm_off(t->q, t->qraw, WF(L, ZS_R_Q_NORM, data, res), full ? n : n * c->n_heads,
                          full ? qd : c->head_dim, c->norm_eps, c->norm_offset);
        zs_op_rmsnorm_off(t->k, t->kraw, WF(L, ZS_R_K_NORM, data, res), full ? n : n * c->n_kv_heads,
                          full ? kvd : c->head_dim, c->norm_eps, c->norm_offset);
    }
    if (c->clip_qkv > 0) { /* OLMoE: q, k, v clamped (torch.clamp_), the mask kept for the backward */
        size_t nq = (size_t)n * qd, nk = (size_t)n * kvd;
        clip_fwd(t->q, t->clipm, nq, c->clip_qkv);
        clip_fwd(t->k, t->clipm + nq, nk, c->clip_qkv);
        clip_fwd(t->v, t->clipm + nq + nk, nk, c->clip_qkv);
    }
    if (c->arch != ZS_ARCH_GPT2) {
        rope_all(t, l, t->q, c->n_heads, qd, 0);
        rope_all(t, l, t->k, c->n_kv_heads, kvd, 0);
    }
    zs_att_params ap = att_params(c, l);
    for (int b = 0; b < t->B; b++) {
        size_t o = (size_t)b * T;
        zs_op_attention_fwd(t->att + o * qd, t->q + o * qd, t->k + o * kvd, t->v + o * kvd, T, c->n_heads,
                            c->n_kv_heads, c->head_dim, t->scores, &ap);
    }
    zs_op_matmul(t->tmp, t->att, n, qd, W(L, ZS_R_WO, data, res), WD(ZS_R_WO), d, WF(L, ZS_R_BO, data, res));
    lora_fwd(t, l, ZS_LORA_O, t->tmp, t->att, n);
    if (c->post_norms) {
        memcpy(t->ao, t->tmp, nd * sizeof(float));
        norm_fwd(c, t->tmp, t->ao, WF(L, ZS_R_POST_ATTN_NORM, data, res), NULL, n);
    }
    memcpy(t->xmid, x_in, nd * sizeof(float));
    zs_op_add(t->xmid, t->tmp, nd);

    norm_fwd(c, t->xn2, t->xmid, WF(L, ZS_R_FFN_NORM_W, data, res), WF(L, ZS_R_FFN_NORM_B, data, res), n);
    if (zs_config_layer_moe(c, l)) return; /* the sparse block: moe_route, moe_fwd / moe_bwd */
    size_t nf = (size_t)n * ff;
    if (c->arch == ZS_ARCH_GPT2) {
        zs_op_matmul(t->hu, t->xn2, n, d, W(L, ZS_R_W_UP, data, res), WD(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res));
        lora_fwd(t, l, ZS_LORA_UP, t->hu, t->xn2, n);
        memcpy(t->ha, t->hu, nf * sizeof(float));
        zs_op_gelu(t->ha, nf);
    } else {
        zs_op_matmul(t->hg, t->xn2, n, d, W(L, ZS_R_W_GATE, data, res), WD(ZS_R_W_GATE), ff, WF(L, ZS_R_B_GATE, data, res));
        zs_op_matmul(t->hu, t->xn2, n, d, W(L, ZS_R_W_UP, data, res), WD(ZS_R_W_UP), ff, WF(L, ZS_R_B_UP, data, res));
        lora_fwd(t, l, ZS_LORA_GATE, t->hg, t->xn2, n);
        lora_fwd(t, l, ZS_LORA_UP, t->hu, t->xn2, n);
        if (c->act) zs_op_geglu(t->ha, t->hg, t->hu, nf);
        else zs_op_swiglu(t->ha, t->hg, t->hu, nf);
    }
    if (x_out || c->post_norms) {
        zs_op_matmul(t->tmp, t->ha, n, ff, W(L, ZS_R_W_DOWN, data, res), WD(ZS_R_W_DOWN), d, WF(L, ZS_R_B_DOWN, data, res));
        lora_fwd(t, l, ZS_LORA_DOWN, t->tmp, t->ha, n);
        if (c->post_norms) {
            memcpy(t->mo, t->tmp, nd * sizeof(float));
            norm_fwd(c, t->tmp, t->mo, WF(L, ZS_R_POST_FFN_NORM, data, res), NULL, n);
        }
    }
    else if (t->lgrad) {
        lora_fwd(t, l, ZS_LORA_DOWN, NULL, t->ha, n); /* the recompute: u for dB only */
    }
    if (x_out) {
        memcpy(x_out, t->xmid, nd * sizeof(float));
        zs_op_add(x_out, t->tmp, nd);
    }
#undef WD
}

/* ---- mixtures of experts: routing, the experts, the shared expert, the router's gradient ---- */

static inline int bit_of(const uint64_t *m, int e) { return (int)(m[e >> 6] >> (e & 63) & 1); }

/* Routing of the current layer's xn2 (transformers' sparse blocks): logits = xn2·Wrᵀ, f32 softmax
 * over the E experts (rp), the K largest probabilities in descending order (a tie: the lower
 * expert first), renormalised to sum 1 when norm_topk_prob (Mixtral always); then each expert's
 * rows (tokens in increasing order) and the local mask. fwd: the forward pass, which adds the
 * layer to the auxiliary loss's sums (the recompute does not). */
static void moe_route(zs_trainer *t, int l, const void *data, const void *res, int fwd) {
    const zs_model_config *c = t->c;
    const zs_bucket_layout *L = zs_model_layout(t->m, zs_bucket_layer(l));
    int n = t->N, E = t->E, K = t->K;
    zs_op_matmul(t->rp, t->xn2, n, t->d, W(L, ZS_R_ROUTER, data, res), L->slot[ZS_R_ROUTER].dtype, E, NULL);
    memset(t->eoff, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        float *p = t->rp + (size_t)i * E;
        zs_op_softmax(p, E);
        int32_t *se = t->sel + (size_t)i * K;
        float *sp = t->sp + (size_t)i * K, *w = t->rw + (size_t)i * K;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < j && !taken; q++) taken = se[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            se[j] = best;
            sp[j] = p[best];
            t->eoff[best + 1]++;
        }
        float sum = 0.0f;
        for (int j = 0; j < K; j++) sum += sp[j];
        for (int j = 0; j < K; j++) w[j] = c->norm_topk_prob ? sp[j] / sum : sp[j];
    }
    for (int e = 0; e < E; e++) t->eoff[e + 1] += t->eoff[e];
    memset(t->xmask, 0, sizeof t->xmask);
    int32_t *fill = t->ecur;
    for (int e = 0; e < E; e++) {
        fill[e] = t->eoff[e];
        if (t->eoff[e + 1] > t->eoff[e]) t->xmask[e >> 6] |= 1ull << (e & 63);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < K; j++) {
            int e = t->sel[(size_t)i * K + j], r = fill[e]++;
            t->erow[r] = i;
            t->eslot[r] = i * K + j;
        }
    if (fwd) {
        for (int e = 0; e < E; e++) {
            double ps = 0.0;
            for (int i = 0; i < n; i++) ps += t->rp[(size_t)i * E + e];
            t->apsum[e] += ps;
            t->acnt[e] += (double)(t->eoff[e + 1] - t->eoff[e]);
        }
        t->an++;
    }
}

/* Expert e's MLP over its R rows (gathered into ex): hg = ex·Wgᵀ, hu = ex·Wuᵀ, ha = act(hg, hu),
 * ey = ha·Wdᵀ. */
static void expert_mlp(zs_trainer *t, const zs_bucket_layout *X, const void *ed, const void *er, int e, int R) {
    int d = t->d, mf = t->mf, r0 = t->eoff[e];
    for (int r = 0; r < R; r++)
        memcpy(t->ex + (size_t)r * d, t->xn2 + (size_t)t->erow[r0 + r] * d, (size_t)d * sizeof(float));
    zs_op_matmul(t->hg, t->ex, R, d, W(X, ZS_R_W_GATE, ed, er), X->slot[ZS_R_W_GATE].dtype, mf, NULL);
    zs_op_matmul(t->hu, t->ex, R, d, W(X, ZS_R_W_UP, ed, er), X->slot[ZS_R_W_UP].dtype, mf, NULL);
    if (t->c->act) zs_op_geglu(t->ha, t->hg, t->hu, (size_t)R * mf);
    else zs_op_swiglu(t->ha, t->hg, t->hu, (size_t)R * mf);
    zs_op_matmul(t->ey, t->ha, R, mf, W(X, ZS_R_W_DOWN, ed, er), X->slot[ZS_R_W_DOWN].dtype, d, NULL);
}

/* Qwen2-MoE's shared expert over every row (layer bucket W_GATE/UP/DOWN, width sf): shv, and its
 * gate sg = sigmoid(xn2·Wsgᵀ). */
static void shared_mlp(zs_trainer *t, const zs_bucket_layout *L, const void *data, const void *res) {
    int n = t->N, d = t->d, sf = t->sf;
    zs_op_matmul(t->hg, t->xn2, n, d, W(L, ZS_R_W_GATE, data, res), L->slot[ZS_R_W_GATE].dtype, sf, NULL);
    zs_op_matmul(t->hu, t->xn2, n, d, W(L, ZS_R_W_UP, data, res), L->slot[ZS_R_W_UP].dtype, sf, NULL);
    if (t->c->act) zs_op_geglu(t->ha, t->hg, t->hu, (size_t)n * sf);
    else zs_op_swiglu(t->ha, t->hg, t->hu, (size_t)n * sf);
    zs_op_matmul(t->shv, t->ha, n, sf, W(L, ZS_R_W_DOWN, data, res), L->slot[ZS_R_W_DOWN].dtype, d, NULL);
    zs_op_matmul(t->sg, t->xn2, n, d, W(L, ZS_R_SHARED_GATE, data, res), L->slot[ZS_R_SHARED_GATE].dtype, 1, NULL);
    for (int i = 0; i < n; i++) t->sg[i] = 1.0f / (1.0f + expf(-t->sg[i]));
}

/* A layer call of the expert protocol begins (its state for zs_trainer_experts_sync). */
static void xbegin(zs_trainer *t, int l, int ph) {
    t->xl = l;
    t->xph = ph;
    t->xlast = -1;
    t->xagreed = 0;
    t->xvalid = 1;
}

static int check_mask(zs_trainer *t, int l, const uint64_t *agreed) {
    for (int w = 0; w < ZS_EXPERT_WORDS; w++)
        if (t->xmask[w] & ~agreed[w]) {
            int e = w * 64 + __builtin_ctzll(t->xmask[w] & ~agreed[w]);
            return zs_err(ZS_EINVAL, "trainer: layer %d: the agreed experts lack expert %d, which this rank's tokens "
                                     "selected", l, e);
        }
    return 0;
}

/* The sparse block's forward (after moe_route, holding the layer bucket): agreement, then every
 * agreed expert acquired and released in increasing order (computed over its rows when it has
 * any), the routed outputs added per token in increasing expert order (out += w·y, as
 * transformers' index_add_), then Qwen2-MoE's shared expert (out += sigmoid·shared). Writes the
 * block's output to tmp. Once the agreement is made, every agreed expert is acquired and
 * released even after a failure (the first error is returned). */
static int moe_fwd(zs_trainer *t, int l, const void *data, const void *res) {
    const zs_weight_source *src = t->xsrc;
    int d = t->d, E = t->E;
    size_t nd = (size_t)t->N * d;
    uint64_t *ag = t->agreed + (size_t)l * ZS_EXPERT_WORDS;
    int rc = src->experts ? src->experts(src->ctx, l, t->xmask, ag) : 0;
    if (!src->experts) memcpy(ag, t->xmask, sizeof t->xmask);
    if (rc < 0) memset(ag, 0, ZS_EXPERT_WORDS * sizeof(uint64_t)); /* the collective failed: nothing to drive */
    t->xagreed = 1;
    if (rc == 0) rc = check_mask(t, l, ag);
    memset(t->tmp, 0, nd * sizeof(float));
    for (int e = 0; e < E; e++) {
        if (!bit_of(ag, e)) continue;
        int b = zs_bucket_expert(t->m, l, e), R = t->eoff[e + 1] - t->eoff[e];
        const void *ed = NULL;
        t->xlast = e;
        int arc = src->acquire(src->ctx, b, &ed);
        if (arc < 0 && rc == 0) rc = arc;
        const void *er = zs_model_bucket_resident(t->m, b);
        const zs_bucket_layout *X = zs_model_layout(t->m, b);
        if (rc == 0 && R > 0 && (rc = check_areas(X, ed, er, "expert forward")) == 0) {
            expert_mlp(t, X, ed, er, e, R);
            for (int r = 0; r < R; r++) {
                int i = t->erow[t->eoff[e] + r];
                float w = t->rw[t->eslot[t->eoff[e] + r]], *o = t->tmp + (size_t)i * d;
                const float *y = t->ey + (size_t)r * d;
                for (int k = 0; k < d; k++) o[k] += y[k] * w;
            }
        }
        src->release(src->ctx, b);
    }
    if (rc == 0 && t->sf > 0) {
        const zs_bucket_layout *L = zs_model_layout(t->m, zs_bucket_layer(l));
        shared_mlp(t, L, data, res);
        for (int i = 0; i < t->N; i++) {
            float g = t->sg[i], *o = t->tmp + (size_t)i * d;
            const float *y = t->shv + (size_t)i * d;
            for (int k = 0; k < d; k++) o[k] += g * y[k];
        }
    }
    t->xvalid = rc < 0;
    return rc;
}

/* The sparse block's backward (after the recompute and moe_route, holding the layer bucket):
 * dres is the gradient of the block's output. Every agreed expert again, in increasing order:
 * recomputed over its rows, the gradients of its routing weights (drw = dres·y), its weight
 * gradients into egrad's area, its input gradient scattered into dxn; the shared expert and its
 * gate; then the router: through the renormalisation and the softmax (top-k selection is not
 * differentiated), with the auxiliary loss's d/dp added to every probability. dxn receives the
 * gradient of xn2 (written: zeroed here first). */
static int moe_bwd(zs_trainer *t, int l, const void *data, const void *res, float *g_data, float *g_res) {
    const zs_model_config *c = t->c;
    const zs_weight_source *src = t->xsrc;
    int n = t->N, d = t->d, E = t->E, K = t->K, mf = t->mf;
    size_t nd = (size_t)n * d;
    float *ws = t->wscratch;
    const zs_bucket_layout *L = zs_model_layout(t->m, zs_bucket_layer(l)), *GL = zs_model_grad_layout(t->m, zs_bucket_layer(l));
    const uint64_t *ag = t->agreed + (size_t)l * ZS_EXPERT_WORDS;
    int rc = check_mask(t, l, ag);
    memset(t->dxn, 0, nd * sizeof(float));
    memset(t->drw, 0, (size_t)n * K * sizeof(float));
    for (int e = 0; e < E; e++) {
        if (!bit_of(ag, e)) continue;
        int b = zs_bucket_expert(t->m, l, e), R = t->eoff[e + 1] - t->eoff[e], r0 = t->eoff[e];
        const void *ed = NULL;
        t->xlast = e;
        int arc = src->acquire(src->ctx, b, &ed);
        if (arc < 0 && rc == 0) rc = arc;
        const void *er = zs_model_bucket_resident(t->m, b);
        const zs_bucket_layout *X = zs_model_layout(t->m, b), *GX = zs_model_grad_layout(t->m, b);
        if (rc == 0 && R > 0 && (rc = check_areas(X, ed, er, "expert backward")) == 0) {
            float *gx = !t->lora && t->egrad ? t->egrad(t->gctx, l, e) : NULL;
            float *gxr = gx ? gx + GX->data_bytes / sizeof(float) : NULL; /* its resident area follows */
            expert_mlp(t, X, ed, er, e, R);
            for (int r = 0; r < R; r++) {
                int i = t->erow[r0 + r], s = t->eslot[r0 + r];
                const float *dy = t->dres + (size_t)i * d, *y = t->ey + (size_t)r * d;
                float w = t->rw[s], *o = t->edy + (size_t)r * d;
                double dot = 0.0;
                for (int k = 0; k < d; k++) {
                    dot += (double)dy[k] * y[k];
                    o[k] = dy[k] * w;
                }
                t->drw[s] = (float)dot;
            }
            size_t rf = (size_t)R * mf;
            memset(t->dha, 0, rf * sizeof(float));
            zs_op_matmul_bwd(t->dha, G(GX, ZS_R_W_DOWN, gx, gxr), NULL, t->edy, t->ha, W(X, ZS_R_W_DOWN, ed, er),
                             X->slot[ZS_R_W_DOWN].dtype, R, mf, d, ws);
            if (c->act) zs_op_geglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, rf);
            else zs_op_swiglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, rf);
            memset(t->edx, 0, (size_t)R * d * sizeof(float));
            zs_op_matmul_bwd(t->edx, G(GX, ZS_R_W_GATE, gx, gxr), NULL, t->dhg, t->ex, W(X, ZS_R_W_GATE, ed, er),
                             X->slot[ZS_R_W_GATE].dtype, R, d, mf, ws);
            zs_op_matmul_bwd(t->edx, G(GX, ZS_R_W_UP, gx, gxr), NULL, t->dhu, t->ex, W(X, ZS_R_W_UP, ed, er),
                             X->slot[ZS_R_W_UP].dtype, R, d, mf, ws);
            for (int r = 0; r < R; r++) zs_op_add(t->dxn + (size_t)t->erow[r0 + r] * d, t->edx + (size_t)r * d, (size_t)d);
        }
        src->release(src->ctx, b);
    }
    if (rc < 0) return rc; /* xvalid stays set: the protocol of this layer is complete anyway */
#define GR(role) G(GL, role, g_data, g_res)
    if (t->sf > 0) { /* out += sg·shv: d shv = sg·dres, d(gate logit) = (dres·shv)·sg·(1 - sg) */
        int sf = t->sf;
        size_t nf = (size_t)n * sf;
        shared_mlp(t, L, data, res);
        float *dgl = t->drp; /* [N] scratch (the router's gradient is made below) */
        for (int i = 0; i < n; i++) {
            const float *dy = t->dres + (size_t)i * d, *y = t->shv + (size_t)i * d;
            float g = t->sg[i], *o = t->edy + (size_t)i * d;
            double dot = 0.0;
            for (int k = 0; k < d; k++) {
                dot += (double)dy[k] * y[k];
                o[k] = dy[k] * g;
            }
            dgl[i] = (float)dot * g * (1.0f - g);
        }
        memset(t->dha, 0, nf * sizeof(float));
        zs_op_matmul_bwd(t->dha, GR(ZS_R_W_DOWN), NULL, t->edy, t->ha, W(L, ZS_R_W_DOWN, data, res),
                         L->slot[ZS_R_W_DOWN].dtype, n, sf, d, ws);
        if (c->act) zs_op_geglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf);
        else zs_op_swiglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf);
        zs_op_matmul_bwd(t->dxn, GR(ZS_R_W_GATE), NULL, t->dhg, t->xn2, W(L, ZS_R_W_GATE, data, res),
                         L->slot[ZS_R_W_GATE].dtype, n, d, sf, ws);
        zs_op_matmul_bwd(t->dxn, GR(ZS_R_W_UP), NULL, t->dhu, t->xn2, W(L, ZS_R_W_UP, data, res),
                         L->slot[ZS_R_W_UP].dtype, n, d, sf, ws);
        zs_op_matmul_bwd(t->dxn, GR(ZS_R_SHARED_GATE), NULL, dgl, t->xn2, W(L, ZS_R_SHARED_GATE, data, res),
                         L->slot[ZS_R_SHARED_GATE].dtype, n, d, 1, ws);
    }
    /* the router: d w -> d (selected p) through w_j = s_j / S (renormalised), then d logits
     * through the softmax, dp also receiving the auxiliary loss's d/dp */
    for (int i = 0; i < n; i++) {
        const float *w = t->rw + (size_t)i * K, *sp = t->sp + (size_t)i * K, *dw = t->drw + (size_t)i * K;
        const int32_t *se = t->sel + (size_t)i * K;
        const float *p = t->rp + (size_t)i * E;
        float *dp = t->drp + (size_t)i * E;
        memcpy(dp, t->agrad, (size_t)E * sizeof(float));
        if (c->norm_topk_prob) {
            float S = 0.0f, wd = 0.0f;
            for (int j = 0; j < K; j++) S += sp[j];
            for (int j = 0; j < K; j++) wd += w[j] * dw[j];
            for (int j = 0; j < K; j++) dp[se[j]] += (dw[j] - wd) / S;
        } else {
            for (int j = 0; j < K; j++) dp[se[j]] += dw[j];
        }
        double pd = 0.0;
        for (int e = 0; e < E; e++) pd += (double)p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - (float)pd);
    }
    zs_op_matmul_bwd(t->dxn, GR(ZS_R_ROUTER), NULL, t->drp, t->xn2, W(L, ZS_R_ROUTER, data, res),
                     L->slot[ZS_R_ROUTER].dtype, n, d, E, ws);
#undef GR
    t->xvalid = 0;
    return 0;
}

int zs_trainer_set_experts(zs_trainer *t, const zs_weight_source *src, zs_expert_grad_fn egrad, void *gctx) {
    t->xsrc = src;
    t->egrad = egrad;
    t->gctx = gctx;
    t->xvalid = 0;
    return 0;
}

const uint64_t *zs_trainer_experts_used(const zs_trainer *t, int layer) {
    static const uint64_t none[ZS_EXPERT_WORDS];
    if (!t->agreed || !zs_config_layer_moe(t->c, layer) || layer >= t->L) return none;
    return t->agreed + (size_t)layer * ZS_EXPERT_WORDS;
}

int zs_trainer_experts_sync(zs_trainer *t, int layer, int backward) {
    if (!t->agreed || !zs_config_layer_moe(t->c, layer) || layer >= t->L || !t->xsrc) return 0;
    const zs_weight_source *src = t->xsrc;
    int cont = t->xvalid && t->xl == layer && t->xph == !!backward;
    int from = cont ? t->xlast + 1 : 0;
    t->xvalid = 0;
    uint64_t *ag = t->agreed + (size_t)layer * ZS_EXPERT_WORDS;
    int rc = 0;
    if (!backward && !(cont && t->xagreed)) {
        static const uint64_t zero[ZS_EXPERT_WORDS];
        rc = src->experts ? src->experts(src->ctx, layer, zero, ag) : 0;
        if (!src->experts || rc < 0) memset(ag, 0, ZS_EXPERT_WORDS * sizeof(uint64_t));
        if (rc < 0) return rc;
    }
    for (int e = from; e < t->E; e++) {
        if (!bit_of(ag, e)) continue;
        int b = zs_bucket_expert(t->m, layer, e);
        const void *ed;
        (void)src->acquire(src->ctx, b, &ed); /* its error is the pass's, already reported */
        src->release(src->ctx, b);
    }
    return rc;
}

/* ---- the pass ---- */

int zs_train_embed_fwd(zs_trainer *t, const void *data, const void *res, const int32_t *tokens) {
    DEV_FORWARD(t, zs_trainer_cuda_embed_fwd(t->dev, data, res, tokens));
    const zs_bucket_layout *E = zs_model_layout(t->m, zs_bucket_embed());
    int lookup = zs_model_embed_lookup(t->m); /* an inference model: rows of the host tables */
    if (!lookup) ZS_CHECK(check_areas(E, data, res, "embedding forward"));
    const void *tok_tab = lookup ? zs_model_embed_table(t->m, ZS_R_TOK_EMB) : W(E, ZS_R_TOK_EMB, data, res);
    const void *pos_tab = !E->slot[ZS_R_POS_EMB].present ? NULL
                          : lookup                        ? zs_model_embed_table(t->m, ZS_R_POS_EMB)
                                                          : W(E, ZS_R_POS_EMB, data, res);
    if (!tok_tab || (E->slot[ZS_R_POS_EMB].present && !pos_tab)) {
        t->next = -1;
        return zs_err(ZS_EINVAL, "trainer: the embedding lookup tables are not loaded");
    }
    for (int i = 0; i < t->N; i++)
        if (tokens[i] < 0 || tokens[i] >= t->V) {
            t->next = -1;
            return zs_err(ZS_ERANGE, "trainer: token id %d at %d is out of range [0, %d)", tokens[i], i, t->V);
        }
    memcpy(t->tokens, tokens, (size_t)t->N * sizeof(int32_t));
    if (t->E > 0) { /* a new pass: no agreement yet, the auxiliary loss's sums from zero */
        memset(t->agreed, 0, (size_t)t->L * ZS_EXPERT_WORDS * sizeof(uint64_t));
        memset(t->acnt, 0, (size_t)t->E * sizeof(double));
        memset(t->apsum, 0, (size_t)t->E * sizeof(double));
        memset(t->agrad, 0, (size_t)t->E * sizeof(float));
        t->an = 0;
    }
    int d = t->d;
    for (int i = 0; i < t->N; i++) {
        float *x = t->xs + (size_t)i * d;
        zs_op_embed(x, tok_tab, E->slot[ZS_R_TOK_EMB].dtype, d, t->tokens[i]);
        if (pos_tab) {
            zs_op_embed(t->tmp, pos_tab, E->slot[ZS_R_POS_EMB].dtype, d, t->pos[i]);
            zs_op_add(x, t->tmp, (size_t)d);
        }
        if (t->c->embed_scale > 0) /* Gemma: times sqrt(hidden), as the inference pass */
            for (int e = 0; e < d; e++) x[e] *= t->c->embed_scale;
    }
    t->next = 1;
    return 0;
}

int zs_train_layer_fwd(zs_trainer *t, int layer, const void *data, const void *res) {
    DEV_FORWARD(t, zs_trainer_cuda_layer_fwd(t->dev, layer, data, res));
    if (layer < 0 || layer >= t->L) return zs_err(ZS_EINVAL, "trainer: layer %d out of range", layer);
    int moe = zs_config_layer_moe(t->c, layer);
    if (moe) xbegin(t, layer, 0);
    ZS_CHECK(expect(t, 1 + layer, "zs_train_layer_fwd"));
    if (moe && !t->xsrc) return zs_err(ZS_EINVAL, "trainer: layer %d is a mixture of experts: no expert source set", layer);
    ZS_CHECK(check_areas(zs_model_layout(t->m, zs_bucket_layer(layer)), data, res, "layer forward"));
    size_t nd = (size_t)t->N * t->d;
    float *x_in = t->xs + (size_t)layer * nd, *x_out = t->xs + (size_t)(layer + 1) * nd;
    if (!moe) {
        layer_compute(t, layer, data, res, x_in, x_out);
    } else {
        layer_compute(t, layer, data, res, x_in, NULL);
        moe_route(t, layer, data, res, 1);
        int rc = moe_fwd(t, layer, data, res);
        if (rc < 0) {
            t->next = -1;
            return rc;
        }
        memcpy(x_out, t->xmid, nd * sizeof(float));
        zs_op_add(x_out, t->tmp, nd);
    }
    t->next++;
    return 0;
}

int zs_train_head(zs_trainer *t, const void *head_data, const void *head_res, const void *embed_data,
                  const void *embed_res, const int32_t *targets, float *loss, float *g_head_data,
                  float *g_head_res, float *g_embed_data, float *g_embed_res) {
    DEV_FORWARD(t, zs_trainer_cuda_head(t->dev, head_data, head_res, embed_data, embed_res, targets, loss, g_head_data,
                                        g_head_res, g_embed_data, g_embed_res));
    const zs_model_config *c = t->c;
    ZS_CHECK(expect(t, t->L + 1, "zs_train_head"));
    int hb = zs_bucket_head(t->m), eb = zs_bucket_embed();
    const zs_bucket_layout *H = zs_model_layout(t->m, hb), *GH = zs_model_grad_layout(t->m, hb);
    const zs_bucket_layout *E = zs_model_layout(t->m, eb), *GE = zs_model_grad_layout(t->m, eb);
    int eval = !g_head_data && !g_head_res && !g_embed_data && !g_embed_res;
    if (t->lora) { /* a frozen base: no base gradient; the backward follows when the adapter has one */
        eval = !t->lgrad;
        g_head_data = g_head_res = g_embed_data = g_embed_res = NULL;
    }
    ZS_CHECK(check_areas(H, head_data, head_res, "head"));
    if (!eval && !t->lora) ZS_CHECK(check_areas(GH, g_head_data, g_head_res, "head gradient"));
    const void *Wh;
    zs_dtype wdt;
    float *gW;
    if (c->tied_embeddings) {
        ZS_CHECK(check_areas(E, embed_data, embed_res, "tied head (embedding bucket)"));
        if (!eval && !t->lora) ZS_CHECK(check_areas(GE, g_embed_data, g_embed_res, "tied head (embedding gradient)"));
        Wh = W(E, ZS_R_TOK_EMB, embed_data, embed_res);
        wdt = E->slot[ZS_R_TOK_EMB].dtype;
        gW = G(GE, ZS_R_TOK_EMB, g_embed_data, g_embed_res);
    } else {
        Wh = W(H, ZS_R_LM_HEAD, head_data, head_res);
        wdt = H->slot[ZS_R_LM_HEAD].dtype;
        gW = G(GH, ZS_R_LM_HEAD, g_head_data, g_head_res);
    }
    int n = t->N, d = t->d, V = t->V;
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (targets[i] >= V)
            return zs_err(ZS_ERANGE, "trainer: target id %d at %d is out of range [0, %d)", targets[i], i, V);
        count += targets[i] >= 0;
    }
    /* the gradient of the mean loss, times the loss scale (fp16: a power of two, so exactly the
     * scaled gradient in f32) */
    float scale = count ? 1.0f / (float)count : 0.0f;
    if (t->loss_scale != 1.0f) scale *= t->loss_scale;
    const float *xL = t->xs + (size_t)t->L * n * d;
    float *xf = t->xn1, *dxf = t->dxn;
    const float *wn = WF(H, ZS_R_OUT_NORM_W, head_data, head_res), *bn = WF(H, ZS_R_OUT_NORM_B, head_data, head_res);
    norm_fwd(c, xf, xL, wn, bn, n);
    memset(dxf, 0, (size_t)n * d * sizeof(float));
    double sum = 0.0;
    for (int r0 = 0; r0 < n; r0 += t->chunk) {
        int R = ZS_MIN(t->chunk, n - r0);
        int any = 0;
        for (int i = r0; i < r0 + R && !any; i++) any = targets[i] >= 0;
        if (!any) continue; /* every target masked: no loss, no gradient */
        const float *x = xf + (size_t)r0 * d;
        zs_op_matmul(t->logits, x, R, d, Wh, wdt, V, NULL);
        size_t rv = (size_t)R * (size_t)V;
        if (c->final_softcap > 0) { /* Gemma 2: the loss sees the capped logits */
            zs_op_softcap(t->logits, rv, c->final_softcap);
            if (!eval) memcpy(t->capped, t->logits, rv * sizeof(float));
        }
        sum += zs_op_cross_entropy(eval ? NULL : t->logits, t->logits, targets + r0, R, V, scale);
        if (!eval && c->final_softcap > 0) zs_op_softcap_bwd(t->logits, t->logits, t->capped, rv, c->final_softcap);
        if (!eval) zs_op_matmul_bwd(dxf + (size_t)r0 * d, gW, NULL, t->logits, x, Wh, wdt, R, d, V, t->wscratch);
    }
    *loss = count ? (float)(sum / count) : 0.0f;
    if (t->E > 0) { /* the auxiliary load-balancing loss (transformers' load_balancing_loss_func) */
        memset(t->agrad, 0, (size_t)t->E * sizeof(float));
        if (count && c->output_router_logits && t->an > 0) {
            double na = (double)t->an * (double)n, aux = 0.0;
            for (int e = 0; e < t->E; e++) aux += (t->acnt[e] / na) * (t->apsum[e] / na);
            aux *= (double)t->E;
            *loss = (float)((double)*loss + (double)c->router_aux_loss_coef * aux);
            for (int e = 0; e < t->E && !eval; e++)
                t->agrad[e] = (float)((double)c->router_aux_loss_coef * (double)t->E * (t->acnt[e] / na) / na *
                                      (double)t->loss_scale);
        }
    }
    if (eval) { /* loss only: the pass ends here */
        t->next = -1;
        return 0;
    }
    memset(t->dres, 0, (size_t)n * d * sizeof(float));
    norm_bwd(c, t->dres, G(GH, ZS_R_OUT_NORM_W, g_head_data, g_head_res),
             G(GH, ZS_R_OUT_NORM_B, g_head_data, g_head_res), dxf, xL, wn, n);
    t->next++;
    return 0;
}

int zs_train_layer_bwd(zs_trainer *t, int layer, const void *data, const void *res, float *g_data,
                       float *g_res) {
    DEV_FORWARD(t, zs_trainer_cuda_layer_bwd(t->dev, layer, data, res, g_data, g_res));
    const zs_model_config *c = t->c;
    if (layer < 0 || layer >= t->L) return zs_err(ZS_EINVAL, "trainer: layer %d out of range", layer);
    ZS_CHECK(expect(t, 2 * t->L + 1 - layer, "zs_train_layer_bwd"));
    int b = zs_bucket_layer(layer), moe = zs_config_layer_moe(c, layer);
    if (moe) xbegin(t, layer, 1);
    const zs_bucket_layout *L = zs_model_layout(t->m, b), *GL = zs_model_grad_layout(t->m, b);
    if (moe && !t->xsrc) return zs_err(ZS_EINVAL, "trainer: layer %d is a mixture of experts: no expert source set", layer);
    ZS_CHECK(check_areas(L, data, res, "layer backward"));
    if (t->lora) g_data = g_res = NULL; /* a frozen base: only the adapter's gradient */
    else ZS_CHECK(check_areas(GL, g_data, g_res, "layer gradient"));
    int n = t->N, d = t->d, qd = t->qd, kvd = t->kvd, ff = t->ff, T = t->T;
    size_t nd = (size_t)n * d, nf = (size_t)n * ff;
#define WD(role) (L->slot[role].dtype)
    float *ws = t->wscratch;
    const float *x_in = t->xs + (size_t)layer * nd;
#define GR(role) G(GL, role, g_data, g_res)

    layer_compute(t, layer, data, res, x_in, NULL);

    if (moe) { /* the sparse block: x_out = xmid + moe(xn2) */
        moe_route(t, layer, data, res, 0);
        int rc = moe_bwd(t, layer, data, res, g_data, g_res);
        if (rc < 0) {
            t->next = -1;
            return rc;
        }
        norm_bwd(c, t->dres, GR(ZS_R_FFN_NORM_W), GR(ZS_R_FFN_NORM_B), t->dxn, t->xmid,
                 WF(L, ZS_R_FFN_NORM_W, data, res), n);
    } else {
        /* MLP: x_out = xmid + [post-norm] down(act(xn2)) */
        const float *dm = t->dres;
        if (c->post_norms) {
            memset(t->dtmp, 0, nd * sizeof(float));
            norm_bwd(c, t->dtmp, GR(ZS_R_POST_FFN_NORM), NULL, t->dres, t->mo, WF(L, ZS_R_POST_FFN_NORM, data, res), n);
            dm = t->dtmp;
        }
        memset(t->dha, 0, nf * sizeof(float));
        zs_op_matmul_bwd(t->dha, GR(ZS_R_W_DOWN), GR(ZS_R_B_DOWN), dm, t->ha, W(L, ZS_R_W_DOWN, data, res),
                         WD(ZS_R_W_DOWN), n, ff, d, ws);
        lora_bwd(t, layer, ZS_LORA_DOWN, t->dha, dm, t->ha, n);
        memset(t->dxn, 0, nd * sizeof(float));
        if (c->arch == ZS_ARCH_GPT2) {
            zs_op_gelu_bwd(t->dhu, t->dha, t->hu, nf);
        } else {
            if (c->act) zs_op_geglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf);
            else zs_op_swiglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf);
            zs_op_matmul_bwd(t->dxn, GR(ZS_R_W_GATE), GR(ZS_R_B_GATE), t->dhg, t->xn2, W(L, ZS_R_W_GATE, data, res),
                             WD(ZS_R_W_GATE), n, d, ff, ws);
            lora_bwd(t, layer, ZS_LORA_GATE, t->dxn, t->dhg, t->xn2, n);
        }
        zs_op_matmul_bwd(t->dxn, GR(ZS_R_W_UP), GR(ZS_R_B_UP), t->dhu, t->xn2, W(L, ZS_R_W_UP, data, res),
                         WD(ZS_R_W_UP), n, d, ff, ws);
        lora_bwd(t, layer, ZS_LORA_UP, t->dxn, t->dhu, t->xn2, n);
        /* the residual passes dres through; the norm adds its branch: dres becomes d xmid */
        norm_bwd(c, t->dres, GR(ZS_R_FFN_NORM_W), GR(ZS_R_FFN_NORM_B), t->dxn, t->xmid,
                 WF(L, ZS_R_FFN_NORM_W, data, res), n);
    }
    /* attention: xmid = x_in + [post-norm] o(attn(rope(qn(q(xn1))), rope(kn(k(xn1))), v(xn1))) */
    const float *dao = t->dres;
    if (c->post_norms) {
        memset(t->dtmp, 0, nd * sizeof(float));
        norm_bwd(c, t->dtmp, GR(ZS_R_POST_ATTN_NORM), NULL, t->dres, t->ao, WF(L, ZS_R_POST_ATTN_NORM, data, res), n);
        dao = t->dtmp;
    }
    memset(t->datt, 0, (size_t)n * qd * sizeof(float));
    zs_op_matmul_bwd(t->datt, GR(ZS_R_WO), GR(ZS_R_BO), dao, t->att, W(L, ZS_R_WO, data, res), WD(ZS_R_WO), n,
                     qd, d, ws);
    lora_bwd(t, layer, ZS_LORA_O, t->datt, dao, t->att, n);
    memset(t->dq, 0, (size_t)n * qd * sizeof(float));
    memset(t->dk, 0, (size_t)n * kvd * sizeof(float));
    memset(t->dv, 0, (size_t)n * kvd * sizeof(float));
    zs_att_params ap = att_params(c, layer);
    for (int s = 0; s < t->B; s++) {
        size_t o = (size_t)s * T;
        zs_op_attention_bwd(t->dq + o * qd, t->dk + o * kvd, t->dv + o * kvd, t->datt + o * qd, t->q + o * qd,
                            t->k + o * kvd, t->v + o * kvd, T, c->n_heads, c->n_kv_heads, c->head_dim, t->scores, &ap);
    }
    if (c->arch != ZS_ARCH_GPT2) {
        rope_all(t, layer, t->dq, c->n_heads, qd, 1);
        rope_all(t, layer, t->dk, c->n_kv_heads, kvd, 1);
    }
    if (c->clip_qkv > 0) { /* through the clamps */
        size_t nq = (size_t)n * qd, nk = (size_t)n * kvd;
        clip_bwd(t->dq, t->clipm, nq);
        clip_bwd(t->dk, t->clipm + nq, nk);
        clip_bwd(t->dv, t->clipm + nq + nk, nk);
    }
    if (c->qk_norm || c->qk_norm_full) { /* through the q / k norms (per head, or whole) */
        int full = !c->qk_norm; /* qk_norm_full alone: OLMoE (forward.c: per head wins when both are set) */
        float *dqr = t->dqraw, *dkr = t->dkraw;
        memset(dqr, 0, (size_t)n * qd * sizeof(float));
        zs_op_rmsnorm_off_bwd(dqr, GR(ZS_R_Q_NORM), t->dq, t->qraw, WF(L, ZS_R_Q_NORM, data, res),
                              full ? n : n * c->n_heads, full ? qd : c->head_dim, c->norm_eps, c->norm_offset);
        memcpy(t->dq, dqr, (size_t)n * qd * sizeof(float));
        memset(dkr, 0, (size_t)n * kvd * sizeof(float));
        zs_op_rmsnorm_off_bwd(dkr, GR(ZS_R_K_NORM), t->dk, t->kraw, WF(L, ZS_R_K_NORM, data, res),
                              full ? n : n * c->n_kv_heads, full ? kvd : c->head_dim, c->norm_eps, c->norm_offset);
        memcpy(t->dk, dkr, (size_t)n * kvd * sizeof(float));
    }
    memset(t->dxn, 0, nd * sizeof(float));
    zs_op_matmul_bwd(t->dxn, GR(ZS_R_WQ), GR(ZS_R_BQ), t->dq, t->xn1, W(L, ZS_R_WQ, data, res), WD(ZS_R_WQ), n, d,
                     qd, ws);
    zs_op_matmul_bwd(t->dxn, GR(ZS_R_WK), GR(ZS_R_BK), t->dk, t->xn1, W(L, ZS_R_WK, data, res), WD(ZS_R_WK), n, d,
                     kvd, ws);
    zs_op_matmul_bwd(t->dxn, GR(ZS_R_WV), GR(ZS_R_BV), t->dv, t->xn1, W(L, ZS_R_WV, data, res), WD(ZS_R_WV), n, d,
                     kvd, ws);
    lora_bwd(t, layer, ZS_LORA_Q, t->dxn, t->dq, t->xn1, n);
    lora_bwd(t, layer, ZS_LORA_K, t->dxn, t->dk, t->xn1, n);
    lora_bwd(t, layer, ZS_LORA_V, t->dxn, t->dv, t->xn1, n);
    norm_bwd(c, t->dres, GR(ZS_R_ATTN_NORM_W), GR(ZS_R_ATTN_NORM_B), t->dxn, x_in,
             WF(L, ZS_R_ATTN_NORM_W, data, res), n);
#undef GR
#undef WD
    t->next++;
    return 0;
}

int zs_train_embed_bwd(zs_trainer *t, const void *data, const void *res, float *g_data, float *g_res) {
    DEV_FORWARD(t, zs_trainer_cuda_embed_bwd(t->dev, data, res, g_data, g_res));
    ZS_CHECK(expect(t, 2 * t->L + 2, "zs_train_embed_bwd"));
    int eb = zs_bucket_embed();
    const zs_bucket_layout *GE = zs_model_grad_layout(t->m, eb);
    (void)data; /* the embedding backward reads no weights */
    (void)res;
    if (t->lora) { /* a frozen base: nothing to accumulate */
        t->next = -1;
        return 0;
    }
    ZS_CHECK(check_areas(GE, g_data, g_res, "embedding gradient"));
    if (t->c->embed_scale > 0) /* the table's rows were scaled: so is their gradient */
        for (size_t i = 0; i < (size_t)t->N * t->d; i++) t->dres[i] *= t->c->embed_scale;
    zs_op_embed_bwd(G(GE, ZS_R_TOK_EMB, g_data, g_res), t->dres, t->tokens, t->N, t->d);
    float *gp = G(GE, ZS_R_POS_EMB, g_data, g_res);
    if (gp) zs_op_embed_bwd(gp, t->dres, t->pos, t->N, t->d);
    t->next = -1;
    return 0;
}

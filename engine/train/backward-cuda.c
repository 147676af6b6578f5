/* backward-cuda.c — the training forward and backward of backward.h on a rank's CUDA device (built
 * only with CUDA; zs_trainer_new_device in backward.c wraps it). It mirrors backward.c's CPU
 * arithmetic step by step for the dense families: embeddings (+ GPT-2's positions, Gemma's scale),
 * per layer norm (RMSNorm with Gemma's weight offset, or GPT-2's LayerNorm) -> q/k/v (+ biases) ->
 * per-head or whole q/k RMSNorm (Qwen3, Gemma 3, OLMoE-style) -> RoPE (the CPU's host-made
 * frequencies: per layer kind, or per token for the position-dependent scalings) -> causal GQA
 * attention per sequence (Gemma's score scale, soft-cap, sliding windows) -> output projection
 * [-> post-norm] -> residual -> norm -> SwiGLU / GeGLU / GELU MLP [-> post-norm] -> residual; the
 * final norm, the LM head (tied or not), Gemma 2's final soft-cap and the masked cross-entropy
 * (loss = mean over the counted targets, its gradient times the loss scale); and the backward of
 * all of it with activation checkpointing (each layer recomputed from its stored input).
 *
 * Where things live: the layer inputs (checkpoints, [(L+1)·N·dim] f32), one layer's activations
 * and their gradients, and the head's block of logits are device memory from the rank's pool. The
 * bucket data areas handed in are device pointers (the gathered buckets); the resident areas (norms,
 * biases, whatever the persist threshold keeps resident) are host memory, uploaded per call into a
 * device scratch. Every op is a kernel of kernels/cuda (the forward ones of forward-cuda.c and the
 * backward ones of backward.cu) or cuBLAS, queued on the device's compute queue (the queue the
 * gather's ready/retire events order), so the weights are read only between the caller's acquire
 * and release. Matrix products: y = x·Wᵀ through zs_dev_gemm with x in W's dtype (an f16/bf16 W
 * takes its input rounded to that dtype, as forward-cuda.c: tensor cores, fp32 accumulation; f32:
 * fp32, no TF32); their backward zs_cuda_matmul_bwd (fp32: dx = dy·W over W rows widened to f32,
 * dW = dyᵀ·x with the f32 activations). Everything else is f32.
 *
 * Gradients: each call computes its bucket's gradient into zeroed device scratch (the grad layout
 * of zs_model_grad_layout), then copies it down through a pinned staging buffer and ADDS it into
 * the caller's host buffers (backward.h's += contract), before it returns. The embedding backward
 * copies the gradient of the residual stream down and scatters it on the host with the CPU's op
 * (a [vocab, dim] table is never zeroed and copied for a few rows). A call returns once its work is
 * done (the loss and the gradients are in host memory), except the forward calls, which only queue.
 *
 * Not covered (ZS_EUNSUPPORTED at zs_trainer_cuda_new, naming it): mixtures of experts, LoRA
 * (backward.c refuses zs_trainer_set_lora), OLMoE's clip_qkv, block-format weights, host embedding
 * lookup tables (inference models), head_dim > 256 or odd, and position-dependent RoPE scalings
 * whose attention factor changes with the position. */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "backward-cuda.h"
#include "common.h"
#include "device-impl.h"
#include "kernels/cuda/kernels.h"
#include "rope.h"
#include "slotptr.h"
#include "train-ops.h"

/* floats of the pinned staging buffer the gradients come down through */
#define STAGE_FLOATS ((size_t)4 << 20)
/* floats of logits per head chunk */
#define LOGIT_FLOATS ((size_t)1 << 25)
/* device buffers a trainer holds at most */
#define MAX_BUFS 64

struct zs_trainer_cuda {
    const zs_model *m;
    const zs_model_config *c;
    zs_dev *dev;
    cudaStream_t s;         /* the device's compute queue */
    int B, T, N, d, qd, kvd, ff, V, L, nblk, chunk, nchunks;
    int next;               /* the pass's next step (backward.c's numbering); -1 before the first embed fwd */
    float loss_scale;
    size_t dev_bytes, host_bytes;
    void *bufs[MAX_BUFS];   /* every device buffer, for zs_trainer_cuda_free */
    int nbufs;
    /* host */
    int32_t *tokens, *pos;  /* [N] the pass's tokens, positions 0..T-1 per sequence */
    float *dres_h;          /* [N*d] the residual's gradient brought down for the embedding backward */
    double *closs_h;        /* [nchunks] the head chunks' loss sums */
    float *stage;           /* pinned, STAGE_FLOATS (or less) */
    size_t stage_n;
    /* device: step inputs */
    int32_t *ids, *tgt, *dpos, *tables, *tab;
    int64_t *off;
    float *freq;            /* [2][head_dim/2]: global, local layer kinds (NULL for GPT-2) */
    float freq_af[2];
    float *freq_tok;        /* [N][head_dim/2] position-dependent rows, or NULL */
    float tok_af;
    /* device: activations */
    float *xs, *dres, *xn1, *q, *k, *v, *att, *xmid, *xn2, *hg, *hu, *ha, *tmp;
    float *dxn, *dq, *dk, *dv, *datt, *dhg, *dhu, *dha, *dtmp;
    float *qraw, *kraw, *dqraw, *dkraw, *ao, *mo;  /* qk norms, post norms (else NULL) */
    float *kvpool;          /* [B*nblk blocks] of 2*16*kvd: K/V of the attention forward (f32) */
    float *logits, *capped; /* [chunk*V]; capped: the soft-capped logits (final_softcap) */
    float *rowloss;         /* [chunk] */
    double *closs;          /* [nchunks] */
    float *nstats, *astats; /* norm statistics [2*N*max(heads,1)], attention [3*T*n_heads] */
    float *wscratch;        /* [ZS_CUDA_MATMUL_BWD_ROWS * widest input] (16-bit weights) */
    void *xc;               /* [N * widest input] a product's input in 16 bits */
    void *res_a, *res_b;    /* uploaded resident areas: the bucket's; the embedding's (tied head) */
    float *ga_data, *ga_res; /* a bucket's gradient (grad layout), the largest bucket's size */
    float *gb_data, *gb_res; /* the head's while the embedding bucket uses ga (tied head) */
};

#define DCHK(call, what)                                                        \
    do {                                                                        \
        if ((call) != 0) return zs_dev_error("CUDA trainer: " what);            \
    } while (0)
#define CUCHK(call, what)                                                       \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            cudaGetLastError();                                                 \
            return zs_err(ZS_EDEVICE, "CUDA trainer on device %d: %s: %s", t->dev->id, what, \
                          cudaGetErrorString(e_));                              \
        }                                                                       \
    } while (0)

/* ---- set-up ---- */

static void *dalloc(zs_trainer_cuda *t, size_t bytes) {
    if (t->nbufs == MAX_BUFS) {
        zs_err(ZS_ENOMEM, "CUDA trainer: more than %d device buffers", MAX_BUFS);
        return NULL;
    }
    void *p = zs_dev_alloc(t->dev, ZS_MAX(bytes, (size_t)4));
    if (p) {
        t->bufs[t->nbufs++] = p;
        t->dev_bytes += ZS_ALIGN_UP(ZS_MAX(bytes, (size_t)4), (size_t)256);
    }
    return p;
}

void zs_trainer_cuda_free(zs_trainer_cuda *t) {
    if (!t) return;
    /* nothing queued may still use the buffers when they go back to the pool */
    if (zs_dev_set_current(t->dev) == 0 && cudaStreamSynchronize(t->s) != cudaSuccess) {
        cudaGetLastError();
        zs_dev_sync(t->dev);
    }
    for (int i = 0; i < t->nbufs; i++) zs_dev_release(t->dev, t->bufs[i]);
    if (t->stage) cudaFreeHost(t->stage);
    free(t->tokens);
    free(t->pos);
    free(t->dres_h);
    free(t->closs_h);
    free(t);
}

size_t zs_trainer_cuda_bytes(const zs_trainer_cuda *t) { return t->dev_bytes + t->host_bytes; }

int zs_trainer_cuda_set_loss_scale(zs_trainer_cuda *t, float s) {
    if (!(s > 0) || !isfinite(s))
        return zs_err(ZS_EINVAL, "trainer: the loss scale must be a finite number > 0, got %g", (double)s);
    t->loss_scale = s;
    return 0;
}

/* What the device trainer does not cover, by name (0 when it covers the model). */
static int check_model(const zs_model *m) {
    const zs_model_config *c = zs_model_config_get(m);
    const char *arch = c->arch_name;
    if (c->n_experts > 0)
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: %s is a mixture of experts, which trains on the CPU device only "
                      "for now (--device cpu)", arch);
    if (c->clip_qkv > 0)
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: clip_qkv (%s) is not supported on the device yet", arch);
    if (zs_model_embed_lookup(m))
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: the model was opened for inference (host embedding lookup "
                      "tables); open it with embed_lookup = 0");
    if (c->head_dim > 256 || c->head_dim % 2 || c->head_dim <= 0)
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: head_dim %d (the attention kernels take an even head_dim of "
                      "at most 256)", c->head_dim);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: %d attention heads over %d kv heads", c->n_heads, c->n_kv_heads);
    if (c->final_softcap < 0 || isinf(c->final_softcap) || c->attn_softcap < 0 || isinf(c->attn_softcap))
        return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: soft-caps %g / %g (finite, >= 0)", (double)c->attn_softcap,
                      (double)c->final_softcap);
    for (int b = 0; b < zs_model_n_buckets(m); b++) {
        const zs_bucket_layout *L = zs_model_layout(m, b);
        for (int r = 0; r < L->n_roles; r++) {
            const zs_slot *s = &L->slot[r];
            if (s->present && s->dtype != ZS_F32 && s->dtype != ZS_F16 && s->dtype != ZS_BF16)
                return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: bucket %d stores a tensor in %s (f32, f16 or bf16 only)",
                              b, zs_dtype_name(s->dtype));
            if (s->present && s->ndim < 2 && s->dtype != ZS_F32) /* the kernels read norms and biases as f32 */
                return zs_err(ZS_EUNSUPPORTED, "CUDA trainer: a %s norm or bias in bucket %d (f32 only)",
                              zs_dtype_name(s->dtype), b);
        }
    }
    return 0;
}

/* RoPE frequencies as backward.c makes them (the CPU's bits): per layer kind the first layer of
 * the kind at position 0; per token (position-dependent scalings) from each token's position, one
 * attention factor for all (else ZS_EUNSUPPORTED). Uploads them. */
static int make_freqs(zs_trainer_cuda *t) {
    const zs_model_config *c = t->c;
    size_t half = (size_t)(c->head_dim / 2);
    float *h = calloc(2 * half, sizeof(float));
    if (!h) return zs_err(ZS_ENOMEM, "out of memory");
    t->freq_af[0] = t->freq_af[1] = 1.0f;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        int k = zs_rope_layer_local(c, l);
        zs_rope_freqs(c, l, 0, h + (size_t)k * half, &t->freq_af[k]);
    }
    int rc = 0;
    if (!(t->freq = dalloc(t, 2 * half * sizeof(float)))) rc = ZS_ENOMEM;
    if (rc == 0 && cudaMemcpyAsync(t->freq, h, 2 * half * sizeof(float), cudaMemcpyHostToDevice, t->s) != cudaSuccess)
        rc = zs_dev_error("CUDA trainer: RoPE frequencies upload");
    if (rc == 0) rc = cudaStreamSynchronize(t->s) == cudaSuccess ? 0 : zs_dev_error("CUDA trainer: RoPE frequencies upload");
    free(h);
    int pl = zs_rope_pos_layer(c);
    if (rc < 0 || pl < 0) return rc;
    float *rows = calloc((size_t)t->N * half, sizeof(float));
    if (!rows) return zs_err(ZS_ENOMEM, "out of memory");
    for (int p = 0; p < t->T; p++) {
        float af;
        zs_rope_freqs(c, pl, p, rows + (size_t)p * half, &af);
        if (p == 0) t->tok_af = af;
        else if (af != t->tok_af) rc = zs_err(ZS_EUNSUPPORTED, "CUDA trainer: the RoPE attention factor differs between "
                                              "positions 0 and %d (one factor per kernel call)", p);
        if (rc < 0) break;
    }
    for (int b = 1; rc == 0 && b < t->B; b++) /* every sequence has positions 0..T-1 */
        memcpy(rows + (size_t)b * t->T * half, rows, (size_t)t->T * half * sizeof(float));
    if (rc == 0 && !(t->freq_tok = dalloc(t, (size_t)t->N * half * sizeof(float)))) rc = ZS_ENOMEM;
    if (rc == 0 &&
        (cudaMemcpyAsync(t->freq_tok, rows, (size_t)t->N * half * sizeof(float), cudaMemcpyHostToDevice, t->s) !=
             cudaSuccess ||
         cudaStreamSynchronize(t->s) != cudaSuccess))
        rc = zs_dev_error("CUDA trainer: per-token RoPE frequencies upload");
    free(rows);
    return rc;
}

/* The attention forward reads K/V from a paged pool (attention.cu): sequence b's positions 0..T-1
 * are blocks b*nblk .. b*nblk+nblk-1 of 16 positions, its tokens' table entries start at b*nblk. */
static int make_step_inputs(zs_trainer_cuda *t) {
    int nb = t->B * t->nblk;
    size_t bytes = (size_t)nb * 4 + (size_t)t->N * (4 + 4 + 8);
    char *h = malloc(bytes);
    if (!h) return zs_err(ZS_ENOMEM, "out of memory");
    int32_t *tables = (int32_t *)(void *)h, *tab = tables + nb, *pos = tab + t->N;
    int64_t *off = (int64_t *)(void *)(pos + t->N);
    for (int i = 0; i < nb; i++) tables[i] = i;
    for (int i = 0; i < t->N; i++) {
        int b = i / t->T, p = i % t->T, blk = b * t->nblk + p / ZS_KV_BLOCK;
        tab[i] = b * t->nblk;
        pos[i] = p;
        off[i] = ((int64_t)blk * 2 * ZS_KV_BLOCK + p % ZS_KV_BLOCK) * (int64_t)t->kvd;
    }
    int rc = 0;
    if (cudaMemcpyAsync(t->tables, tables, (size_t)nb * 4, cudaMemcpyHostToDevice, t->s) != cudaSuccess ||
        cudaMemcpyAsync(t->tab, tab, (size_t)t->N * 4, cudaMemcpyHostToDevice, t->s) != cudaSuccess ||
        cudaMemcpyAsync(t->dpos, pos, (size_t)t->N * 4, cudaMemcpyHostToDevice, t->s) != cudaSuccess ||
        cudaMemcpyAsync(t->off, off, (size_t)t->N * 8, cudaMemcpyHostToDevice, t->s) != cudaSuccess ||
        cudaStreamSynchronize(t->s) != cudaSuccess)
        rc = zs_dev_error("CUDA trainer: step inputs upload");
    free(h);
    return rc;
}

int zs_trainer_cuda_new(const zs_model *m, int B, int T, void *devp, zs_trainer_cuda **out) {
    const zs_model_config *c = zs_model_config_get(m);
    zs_dev *dev = devp;
    if (B <= 0 || T <= 0) return zs_err(ZS_EINVAL, "trainer: batch %d x %d tokens must be positive", B, T);
    if (T > c->max_seq)
        return zs_err(ZS_ERANGE, "trainer: sequence length %d exceeds the model's context %d", T, c->max_seq);
    if ((size_t)B * (size_t)T > (size_t)1 << 30) return zs_err(ZS_ERANGE, "trainer: batch too large");
    ZS_CHECK(check_model(m));
    ZS_CHECK(zs_dev_set_current(dev));
    zs_trainer_cuda *t = calloc(1, sizeof *t);
    if (!t) return zs_err(ZS_ENOMEM, "out of memory");
    t->m = m;
    t->c = c;
    t->dev = dev;
    t->s = dev->q[ZS_Q_COMPUTE];
    t->loss_scale = 1.0f;
    t->next = -1;
    t->B = B;
    t->T = T;
    t->N = B * T;
    t->d = c->dim;
    t->qd = c->n_heads * c->head_dim;
    t->kvd = c->n_kv_heads * c->head_dim;
    t->ff = c->ffn_dim;
    t->V = c->vocab_size;
    t->L = c->n_layers;
    t->nblk = (T + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    size_t N = (size_t)t->N, d = (size_t)t->d, qd = (size_t)t->qd, kvd = (size_t)t->kvd, ff = (size_t)t->ff;
    size_t V = (size_t)t->V, wide = ZS_MAX(d, ZS_MAX(qd, ff));
    t->chunk = (int)ZS_MIN(N, ZS_MAX((size_t)1, LOGIT_FLOATS / V));
    t->nchunks = (t->N + t->chunk - 1) / t->chunk;
    /* the largest bucket gradient (grad layout areas), resident area, and 16-bit matrices */
    size_t gdata = 0, gres = 0, rres = 0;
    int half16 = 0;
    for (int b = 0; b < zs_model_n_buckets(m); b++) {
        const zs_bucket_layout *L = zs_model_layout(m, b), *GL = zs_model_grad_layout(m, b);
        gdata = ZS_MAX(gdata, GL->data_bytes);
        gres = ZS_MAX(gres, GL->resident_bytes);
        rres = ZS_MAX(rres, L->resident_bytes);
        for (int r = 0; r < L->n_roles; r++) half16 |= L->slot[r].present && L->slot[r].dtype != ZS_F32;
    }
    int hb = zs_bucket_head(m), eb = zs_bucket_embed();
    int ok = 1;
#define A(ptr, bytes) ok = ok && ((ptr) = dalloc(t, (bytes))) != NULL
    A(t->ids, N * 4);
    A(t->tgt, N * 4);
    A(t->dpos, N * 4);
    A(t->tab, N * 4);
    A(t->off, N * 8);
    A(t->tables, (size_t)B * t->nblk * 4);
    A(t->xs, ((size_t)t->L + 1) * N * d * 4);
    A(t->dres, N * d * 4);
    A(t->xn1, N * d * 4);
    A(t->q, N * qd * 4);
    A(t->k, N * kvd * 4);
    A(t->v, N * kvd * 4);
    A(t->att, N * qd * 4);
    A(t->xmid, N * d * 4);
    A(t->xn2, N * d * 4);
    A(t->hg, N * ff * 4);
    A(t->hu, N * ff * 4);
    A(t->ha, N * ff * 4);
    A(t->tmp, N * d * 4);
    A(t->dxn, N * d * 4);
    A(t->dq, N * qd * 4);
    A(t->dk, N * kvd * 4);
    A(t->dv, N * kvd * 4);
    A(t->datt, N * qd * 4);
    A(t->dhg, N * ff * 4);
    A(t->dhu, N * ff * 4);
    A(t->dha, N * ff * 4);
    A(t->dtmp, N * d * 4);
    if (c->qk_norm || c->qk_norm_full) {
        A(t->qraw, N * qd * 4);
        A(t->kraw, N * kvd * 4);
        A(t->dqraw, N * qd * 4);
        A(t->dkraw, N * kvd * 4);
    }
    if (c->post_norms) {
        A(t->ao, N * d * 4);
        A(t->mo, N * d * 4);
    }
    A(t->kvpool, (size_t)B * t->nblk * 2 * ZS_KV_BLOCK * kvd * 4);
    A(t->logits, (size_t)t->chunk * V * 4);
    if (c->final_softcap > 0) A(t->capped, (size_t)t->chunk * V * 4);
    A(t->rowloss, (size_t)t->chunk * 4);
    A(t->closs, (size_t)t->nchunks * 8);
    A(t->nstats, 2 * N * (size_t)ZS_MAX(c->n_heads, 1) * 4);
    A(t->astats, 3 * (size_t)T * (size_t)c->n_heads * 4);
    if (half16) {
        A(t->wscratch, (size_t)ZS_CUDA_MATMUL_BWD_ROWS * wide * 4);
        A(t->xc, N * wide * 2);
    }
    if (rres) A(t->res_a, rres);
    if (c->tied_embeddings && zs_model_layout(m, eb)->resident_bytes) A(t->res_b, zs_model_layout(m, eb)->resident_bytes);
    A(t->ga_data, gdata);
    A(t->ga_res, gres);
    if (c->tied_embeddings) {
        A(t->gb_data, zs_model_grad_layout(m, hb)->data_bytes);
        A(t->gb_res, zs_model_grad_layout(m, hb)->resident_bytes);
    }
#undef A
    t->tokens = calloc(N, sizeof(int32_t));
    t->pos = calloc(N, sizeof(int32_t));
    t->dres_h = malloc(N * d * sizeof(float));
    t->closs_h = calloc((size_t)t->nchunks, sizeof(double));
    t->stage_n = ZS_MIN(STAGE_FLOATS, ZS_MAX(N * d, ZS_MAX(gdata, gres) / 4));
    if (cudaMallocHost((void **)&t->stage, t->stage_n * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        t->stage = NULL;
    }
    t->host_bytes = 2 * N * sizeof(int32_t) + N * d * sizeof(float) + (size_t)t->nchunks * sizeof(double) +
                    t->stage_n * sizeof(float);
    if (!ok || !t->tokens || !t->pos || !t->dres_h || !t->closs_h || !t->stage) {
        int rc = zs_err_prefix(ZS_ENOMEM, "CUDA trainer for %d x %d tokens on device %d", B, T, dev->id);
        zs_trainer_cuda_free(t);
        return rc;
    }
    for (int i = 0; i < t->N; i++) t->pos[i] = i % T;
    int rc = make_step_inputs(t);
    if (rc == 0 && c->arch != ZS_ARCH_GPT2) rc = make_freqs(t);
    if (rc < 0) {
        zs_trainer_cuda_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---- helpers ---- */

static int expect(zs_trainer_cuda *t, int step, const char *what) {
    if (t->next != step)
        return zs_err(ZS_EINVAL, "trainer: %s called out of order (expected step %d of the pass, at %d)", what,
                      step, t->next);
    return 0;
}

/* W, WF, G: slotptr.h (device: the gathered data, the uploaded resident area) */

/* Every present slot of a bucket has its area (host res, device data): ZS_EINVAL otherwise. */
static int check_areas(const zs_bucket_layout *L, const void *data, const void *res, const char *what) {
    for (int r = 0; r < L->n_roles; r++) {
        const zs_slot *s = &L->slot[r];
        if (s->present && !(s->resident ? res : data))
            return zs_err(ZS_EINVAL, "trainer: %s: the %s area is NULL", what, s->resident ? "resident" : "data");
    }
    return 0;
}

/* Uploads the host resident area of bucket b into dst (queued on the compute queue, so the
 * previous call's kernels have read the old content); returns dst, or NULL for an empty area. */
static int upload_res(zs_trainer_cuda *t, int b, const void *res, void *dst, const void **out) {
    size_t n = zs_model_layout(t->m, b)->resident_bytes;
    *out = NULL;
    if (!n || !res) return 0;
    if (!dst) return zs_err(ZS_EINVAL, "CUDA trainer: no scratch for the resident area of bucket %d", b);
    CUCHK(cudaMemcpyAsync(dst, res, n, cudaMemcpyHostToDevice, t->s), "resident area upload");
    *out = dst;
    return 0;
}

static int sync(zs_trainer_cuda *t, const char *what) {
    CUCHK(cudaStreamSynchronize(t->s), what);
    return 0;
}

/* host dst[0..n) (+)= device src[0..n), through the pinned staging buffer, after the queued work */
static int down(zs_trainer_cuda *t, float *dst, const float *src, size_t n, int add) {
    for (size_t o = 0; o < n; o += t->stage_n) {
        size_t k = ZS_MIN(t->stage_n, n - o);
        CUCHK(cudaMemcpyAsync(t->stage, src + o, k * sizeof(float), cudaMemcpyDeviceToHost, t->s), "gradient download");
        ZS_CHECK(sync(t, "gradient download"));
        float *d = dst + o;
        if (add)
            for (size_t i = 0; i < k; i++) d[i] += t->stage[i];
        else
            memcpy(d, t->stage, k * sizeof(float));
    }
    return 0;
}

/* Adds the device gradient of bucket b (grad layout, areas dd / dr) into the host areas hd / hr,
 * for the roles in mask. */
static int add_grads(zs_trainer_cuda *t, int b, float *dd, float *dr, float *hd, float *hr, uint64_t mask) {
    const zs_bucket_layout *GL = zs_model_grad_layout(t->m, b);
    for (int r = 0; r < GL->n_roles; r++) {
        const zs_slot *s = &GL->slot[r];
        if (!s->present || !(mask >> r & 1)) continue;
        float *src = G(GL, r, dd, dr), *dst = G(GL, r, hd, hr);
        if (!src || !dst) return zs_err(ZS_EINVAL, "CUDA trainer: bucket %d: no gradient area for role %d", b, r);
        ZS_CHECK(down(t, dst, src, (size_t)(s->shape[0] * s->shape[1]), 1));
    }
    return 0;
}

/* zeroes the device gradient areas of bucket b */
static int zero_grads(zs_trainer_cuda *t, int b, float *dd, float *dr) {
    const zs_bucket_layout *GL = zs_model_grad_layout(t->m, b);
    if (GL->data_bytes) CUCHK(cudaMemsetAsync(dd, 0, GL->data_bytes, t->s), "gradient zeroing");
    if (GL->resident_bytes) CUCHK(cudaMemsetAsync(dr, 0, GL->resident_bytes, t->s), "gradient zeroing");
    return 0;
}

static int dzero(zs_trainer_cuda *t, float *p, size_t n) {
    CUCHK(cudaMemsetAsync(p, 0, n * sizeof(float), t->s), "zeroing");
    return 0;
}

static int dcopy(zs_trainer_cuda *t, float *dst, const float *src, size_t n) {
    CUCHK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, t->s), "device copy");
    return 0;
}

/* y[n, out] = x[n, in]·Wᵀ (+ bias): x f32; an f16/bf16 W takes x rounded to its dtype */
static int lin(zs_trainer_cuda *t, float *y, const float *x, int n, int in, const void *Wt, zs_dtype wdt, int out,
               const float *bias) {
    if (!Wt) return zs_err(ZS_EINVAL, "CUDA trainer: a matrix is missing from the model");
    const void *xin = x;
    if (wdt != ZS_F32) {
        if (!t->xc) return zs_err(ZS_EINVAL, "CUDA trainer: a %s matrix without 16-bit scratch", zs_dtype_name(wdt));
        DCHK(zs_cuda_convert(t->xc, wdt, x, ZS_F32, (size_t)n * (size_t)in, t->s), "matrix input conversion kernel");
        xin = t->xc;
    }
    ZS_CHECK(zs_dev_gemm(t->dev, y, xin, n, in, Wt, wdt, out, 0.0f));
    if (bias) DCHK(zs_cuda_add(y, NULL, bias, n, out, t->s), "bias kernel");
    return 0;
}

/* the backward of lin: dx += dy·W, dW += dyᵀ·x, db += Σ dy (dW, db may be NULL) */
static int lin_bwd(zs_trainer_cuda *t, float *dx, float *dW, float *db, const float *dy, const float *x, const void *Wt,
                   zs_dtype wdt, int n, int in, int out) {
    if (!Wt) return zs_err(ZS_EINVAL, "CUDA trainer: a matrix is missing from the model");
    DCHK(zs_cuda_matmul_bwd(t->dev->blas, dx, dW, db, dy, x, Wt, wdt, n, in, out, t->wscratch, t->s),
         "matrix product backward");
    return 0;
}

/* y = norm(x) over n rows of dim (GPT-2: LayerNorm; else RMSNorm with the weight offset), f32 */
static int norm_f(zs_trainer_cuda *t, float *y, const float *x, const float *w, const float *b, int n) {
    const zs_model_config *c = t->c;
    if (!w) return zs_err(ZS_EINVAL, "CUDA trainer: a norm weight is missing from the model");
    int r = c->arch == ZS_ARCH_GPT2 ? zs_cuda_layernorm(y, ZS_F32, x, w, b, NULL, n, c->dim, c->norm_eps, t->s)
                                    : zs_cuda_rmsnorm_off(y, ZS_F32, x, w, c->norm_offset, NULL, n, c->dim, c->norm_eps, t->s);
    return r == 0 ? 0 : zs_dev_error("CUDA trainer: norm kernel");
}

/* its backward: dx += ∂/∂x, dw += , db += (dw, db may be NULL) */
static int norm_b(zs_trainer_cuda *t, float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                  int n) {
    const zs_model_config *c = t->c;
    if (!w) return zs_err(ZS_EINVAL, "CUDA trainer: a norm weight is missing from the model");
    int r = c->arch == ZS_ARCH_GPT2
                ? zs_cuda_layernorm_bwd(dx, dw, db, dy, x, w, n, c->dim, c->norm_eps, t->nstats, t->s)
                : zs_cuda_rmsnorm_off_bwd(dx, dw, dy, x, w, c->norm_offset, n, c->dim, c->norm_eps, t->nstats, t->s);
    return r == 0 ? 0 : zs_dev_error("CUDA trainer: norm backward kernel");
}

/* RoPE of every token, forward or backward (backward.c's rope_all: the layer kind's table, or the
 * per-token rows) */
static int rope(zs_trainer_cuda *t, int l, float *x, int nh, int ld, int bwd) {
    const zs_model_config *c = t->c;
    int kind = zs_rope_layer_local(c, l), per_tok = zs_rope_pos_dependent(c, l);
    const float *fr = per_tok ? t->freq_tok : t->freq + (size_t)kind * (size_t)(c->head_dim / 2);
    float af = per_tok ? t->tok_af : t->freq_af[kind];
    if (!fr) return zs_err(ZS_EINVAL, "CUDA trainer: no RoPE frequencies");
    int r = bwd ? zs_cuda_rope_freq_bwd(x, t->N, ld, nh, c->head_dim, t->dpos, fr, per_tok, af, t->s)
                : zs_cuda_rope_freq(x, t->N, ld, nh, c->head_dim, t->dpos, fr, per_tok, af, t->s);
    return r == 0 ? 0 : zs_dev_error("CUDA trainer: rope kernel");
}

static zs_cuda_att_params att_params(const zs_model_config *c, int l) {
    zs_cuda_att_params p = {zs_config_att_scale(c), c->attn_softcap, zs_config_layer_window(c, l)};
    return p;
}

/* The forward of layer l from x_in (backward.c's layer_compute), keeping its activations; writes
 * the layer's output to x_out unless it is NULL (the backward's recompute). res: the uploaded
 * resident area. */
static int layer_compute(zs_trainer_cuda *t, int l, const void *data, const void *res, const float *x_in, float *x_out) {
    const zs_model_config *c = t->c;
    const zs_bucket_layout *L = zs_model_layout(t->m, zs_bucket_layer(l));
    int n = t->N, d = t->d, qd = t->qd, kvd = t->kvd, ff = t->ff;
    size_t nd = (size_t)n * d, nf = (size_t)n * ff;
#define MAT(role) W(L, role, data, res), L->slot[role].dtype
#define VEC(role) WF(L, role, data, res)

    ZS_CHECK(norm_f(t, t->xn1, x_in, VEC(ZS_R_ATTN_NORM_W), VEC(ZS_R_ATTN_NORM_B), n));
    ZS_CHECK(lin(t, t->q, t->xn1, n, d, MAT(ZS_R_WQ), qd, VEC(ZS_R_BQ)));
    ZS_CHECK(lin(t, t->k, t->xn1, n, d, MAT(ZS_R_WK), kvd, VEC(ZS_R_BK)));
    ZS_CHECK(lin(t, t->v, t->xn1, n, d, MAT(ZS_R_WV), kvd, VEC(ZS_R_BV)));
    if (c->qk_norm || c->qk_norm_full) { /* per head, or (qk_norm_full alone) over the whole projection */
        int full = !c->qk_norm;
        const float *wq = VEC(ZS_R_Q_NORM), *wk = VEC(ZS_R_K_NORM);
        if (!wq || !wk) return zs_err(ZS_EINVAL, "CUDA trainer: q/k norms without their weights");
        ZS_CHECK(dcopy(t, t->qraw, t->q, (size_t)n * qd));
        ZS_CHECK(dcopy(t, t->kraw, t->k, (size_t)n * kvd));
        DCHK(zs_cuda_rmsnorm_off(t->q, ZS_F32, t->qraw, wq, c->norm_offset, NULL, full ? n : n * c->n_heads,
                                 full ? qd : c->head_dim, c->norm_eps, t->s), "q norm kernel");
        DCHK(zs_cuda_rmsnorm_off(t->k, ZS_F32, t->kraw, wk, c->norm_offset, NULL, full ? n : n * c->n_kv_heads,
                                 full ? kvd : c->head_dim, c->norm_eps, t->s), "k norm kernel");
    }
    if (c->arch != ZS_ARCH_GPT2) {
        ZS_CHECK(rope(t, l, t->q, c->n_heads, qd, 0));
        ZS_CHECK(rope(t, l, t->k, c->n_kv_heads, kvd, 0));
    }
    /* causal attention inside each sequence: K/V through the paged pool of the attention kernels */
    zs_cuda_att_params ap = att_params(c, l);
    DCHK(zs_cuda_kv_store_dt(t->kvpool, ZS_F32, t->k, kvd, t->v, kvd, t->off, n, kvd, t->s), "kv store kernel");
    DCHK(zs_cuda_attention_ex(zs_cuda_attention_mode(), t->att, ZS_F32, t->q, qd, t->kvpool, ZS_F32, t->tables,
                              t->tab, t->dpos, n, c->n_heads, c->n_kv_heads, c->head_dim, &ap, t->s),
         "attention kernel");
    ZS_CHECK(lin(t, t->tmp, t->att, n, qd, MAT(ZS_R_WO), d, VEC(ZS_R_BO)));
    if (c->post_norms) {
        ZS_CHECK(dcopy(t, t->ao, t->tmp, nd));
        ZS_CHECK(norm_f(t, t->tmp, t->ao, VEC(ZS_R_POST_ATTN_NORM), NULL, n));
    }
    ZS_CHECK(dcopy(t, t->xmid, x_in, nd));
    DCHK(zs_cuda_add(t->xmid, t->tmp, NULL, n, d, t->s), "residual kernel");

    ZS_CHECK(norm_f(t, t->xn2, t->xmid, VEC(ZS_R_FFN_NORM_W), VEC(ZS_R_FFN_NORM_B), n));
    if (c->arch == ZS_ARCH_GPT2) {
        ZS_CHECK(lin(t, t->hu, t->xn2, n, d, MAT(ZS_R_W_UP), ff, VEC(ZS_R_B_UP)));
        DCHK(zs_cuda_gelu(t->ha, ZS_F32, t->hu, nf, t->s), "gelu kernel");
    } else {
        ZS_CHECK(lin(t, t->hg, t->xn2, n, d, MAT(ZS_R_W_GATE), ff, VEC(ZS_R_B_GATE)));
        ZS_CHECK(lin(t, t->hu, t->xn2, n, d, MAT(ZS_R_W_UP), ff, VEC(ZS_R_B_UP)));
        if (c->act) DCHK(zs_cuda_geglu(t->ha, ZS_F32, t->hg, t->hu, nf, t->s), "geglu kernel");
        else DCHK(zs_cuda_swiglu(t->ha, ZS_F32, t->hg, t->hu, nf, t->s), "swiglu kernel");
    }
    if (x_out || c->post_norms) {
        ZS_CHECK(lin(t, t->tmp, t->ha, n, ff, MAT(ZS_R_W_DOWN), d, VEC(ZS_R_B_DOWN)));
        if (c->post_norms) {
            ZS_CHECK(dcopy(t, t->mo, t->tmp, nd));
            ZS_CHECK(norm_f(t, t->tmp, t->mo, VEC(ZS_R_POST_FFN_NORM), NULL, n));
        }
    }
    if (x_out) {
        ZS_CHECK(dcopy(t, x_out, t->xmid, nd));
        DCHK(zs_cuda_add(x_out, t->tmp, NULL, n, d, t->s), "residual kernel");
    }
#undef VEC
#undef MAT
    return 0;
}

/* ---- the pass ---- */

int zs_trainer_cuda_embed_fwd(zs_trainer_cuda *t, const void *data, const void *res, const int32_t *tokens) {
    const zs_bucket_layout *E = zs_model_layout(t->m, zs_bucket_embed());
    int eb = zs_bucket_embed();
    ZS_CHECK(check_areas(E, data, res, "embedding forward"));
    for (int i = 0; i < t->N; i++)
        if (tokens[i] < 0 || tokens[i] >= t->V) {
            t->next = -1;
            return zs_err(ZS_ERANGE, "trainer: token id %d at %d is out of range [0, %d)", tokens[i], i, t->V);
        }
    ZS_CHECK(zs_dev_set_current(t->dev));
    t->next = -1; /* a pass in progress is abandoned; this one starts when the call succeeds */
    memcpy(t->tokens, tokens, (size_t)t->N * sizeof(int32_t));
    CUCHK(cudaMemcpyAsync(t->ids, t->tokens, (size_t)t->N * sizeof(int32_t), cudaMemcpyHostToDevice, t->s),
          "tokens upload");
    const void *rd;
    ZS_CHECK(upload_res(t, eb, res, t->res_a, &rd));
    const void *tok = W(E, ZS_R_TOK_EMB, data, rd), *pos = W(E, ZS_R_POS_EMB, data, rd);
    if (!tok) return zs_err(ZS_EINVAL, "CUDA trainer: the model has no token embedding");
    DCHK(zs_cuda_embed(t->xs, tok, E->slot[ZS_R_TOK_EMB].dtype, t->ids, pos, E->slot[ZS_R_POS_EMB].dtype, t->dpos,
                       t->N, t->d, t->s), "embedding kernel");
    if (t->c->embed_scale > 0) /* Gemma: times sqrt(hidden) */
        DCHK(zs_cuda_scale(t->xs, (size_t)t->N * t->d, t->c->embed_scale, t->s), "embedding scale kernel");
    t->next = 1;
    return 0;
}

int zs_trainer_cuda_layer_fwd(zs_trainer_cuda *t, int layer, const void *data, const void *res) {
    if (layer < 0 || layer >= t->L) return zs_err(ZS_EINVAL, "trainer: layer %d out of range", layer);
    ZS_CHECK(expect(t, 1 + layer, "zs_train_layer_fwd"));
    int b = zs_bucket_layer(layer);
    ZS_CHECK(check_areas(zs_model_layout(t->m, b), data, res, "layer forward"));
    ZS_CHECK(zs_dev_set_current(t->dev));
    size_t nd = (size_t)t->N * t->d;
    const void *rd;
    int rc = upload_res(t, b, res, t->res_a, &rd);
    if (rc == 0) rc = layer_compute(t, layer, data, rd, t->xs + (size_t)layer * nd, t->xs + (size_t)(layer + 1) * nd);
    if (rc < 0) {
        t->next = -1;
        return rc;
    }
    t->next++;
    return 0;
}

/* The head of zs_trainer_cuda_head, after the checks: logits, loss and (unless eval) the gradients
 * into the device areas; the chunks' losses queued down into closs_h, which is valid after a sync. */
static int head_compute(zs_trainer_cuda *t, const zs_bucket_layout *H, const void *hd, const void *hr, const void *Wh,
                        zs_dtype wdt, const int32_t *targets, float scale, int eval, float *gW, float *gnw, float *gnb,
                        int *ran) {
    const zs_model_config *c = t->c;
    int n = t->N, d = t->d, V = t->V;
    const float *xL = t->xs + (size_t)t->L * n * d;
    float *xf = t->xn1, *dxf = t->dxn;
    const float *wn = WF(H, ZS_R_OUT_NORM_W, hd, hr), *bn = WF(H, ZS_R_OUT_NORM_B, hd, hr);
    CUCHK(cudaMemcpyAsync(t->tgt, targets, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, t->s), "targets upload");
    ZS_CHECK(norm_f(t, xf, xL, wn, bn, n));
    if (!eval) ZS_CHECK(dzero(t, dxf, (size_t)n * d));
    for (int ci = 0; ci < t->nchunks; ci++) {
        int r0 = ci * t->chunk, R = ZS_MIN(t->chunk, n - r0), any = 0;
        for (int i = r0; i < r0 + R && !any; i++) any = targets[i] >= 0;
        ran[ci] = any;
        if (!any) continue; /* every target masked: no loss, no gradient */
        const float *x = xf + (size_t)r0 * d;
        size_t rv = (size_t)R * (size_t)V;
        ZS_CHECK(lin(t, t->logits, x, R, d, Wh, wdt, V, NULL));
        if (c->final_softcap > 0) { /* Gemma 2: the loss sees the capped logits */
            DCHK(zs_cuda_softcap(t->logits, rv, c->final_softcap, t->s), "logit soft-cap kernel");
            if (!eval) ZS_CHECK(dcopy(t, t->capped, t->logits, rv));
        }
        DCHK(zs_cuda_cross_entropy(eval ? NULL : t->logits, t->rowloss, t->closs + ci, t->logits, t->tgt + r0, R, V,
                                   scale, t->s), "cross-entropy kernel");
        if (eval) continue;
        if (c->final_softcap > 0)
            DCHK(zs_cuda_softcap_bwd(t->logits, t->logits, t->capped, rv, c->final_softcap, t->s), "soft-cap backward kernel");
        ZS_CHECK(lin_bwd(t, dxf + (size_t)r0 * d, gW, NULL, t->logits, x, Wh, wdt, R, d, V));
    }
    CUCHK(cudaMemcpyAsync(t->closs_h, t->closs, (size_t)t->nchunks * sizeof(double), cudaMemcpyDeviceToHost, t->s),
          "loss download");
    if (eval) return 0;
    ZS_CHECK(dzero(t, t->dres, (size_t)n * d));
    return norm_b(t, t->dres, gnw, gnb, dxf, xL, wn, n);
}

int zs_trainer_cuda_head(zs_trainer_cuda *t, const void *head_data, const void *head_res, const void *embed_data,
                         const void *embed_res, const int32_t *targets, float *loss, float *g_head_data,
                         float *g_head_res, float *g_embed_data, float *g_embed_res) {
    const zs_model_config *c = t->c;
    ZS_CHECK(expect(t, t->L + 1, "zs_train_head"));
    int hb = zs_bucket_head(t->m), eb = zs_bucket_embed();
    const zs_bucket_layout *H = zs_model_layout(t->m, hb), *GH = zs_model_grad_layout(t->m, hb);
    const zs_bucket_layout *E = zs_model_layout(t->m, eb), *GE = zs_model_grad_layout(t->m, eb);
    int eval = !g_head_data && !g_head_res && !g_embed_data && !g_embed_res, tied = c->tied_embeddings;
    ZS_CHECK(check_areas(H, head_data, head_res, "head"));
    if (!eval) ZS_CHECK(check_areas(GH, g_head_data, g_head_res, "head gradient"));
    if (tied) {
        ZS_CHECK(check_areas(E, embed_data, embed_res, "tied head (embedding bucket)"));
        if (!eval) ZS_CHECK(check_areas(GE, g_embed_data, g_embed_res, "tied head (embedding gradient)"));
    }
    int n = t->N, count = 0;
    for (int i = 0; i < n; i++) {
        if (targets[i] >= t->V)
            return zs_err(ZS_ERANGE, "trainer: target id %d at %d is out of range [0, %d)", targets[i], i, t->V);
        count += targets[i] >= 0;
    }
    ZS_CHECK(zs_dev_set_current(t->dev));
    /* the gradient of the mean loss, times the loss scale (backward.c's arithmetic) */
    float scale = count ? 1.0f / (float)count : 0.0f;
    if (t->loss_scale != 1.0f) scale *= t->loss_scale;
    /* device areas: the head's gradient in ga, or, with a tied head, the embedding's in ga and the
     * head's in gb */
    float *hgd = tied ? t->gb_data : t->ga_data, *hgr = tied ? t->gb_res : t->ga_res;
    const void *hr, *er = NULL;
    int *ran = calloc((size_t)t->nchunks, sizeof(int));
    if (!ran) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = upload_res(t, hb, head_res, t->res_a, &hr);
    if (rc == 0 && tied) rc = upload_res(t, eb, embed_res, t->res_b, &er);
    if (rc == 0 && !eval) rc = zero_grads(t, hb, hgd, hgr);
    if (rc == 0 && !eval && tied) rc = zero_grads(t, eb, t->ga_data, t->ga_res);
    const void *Wh = tied ? W(E, ZS_R_TOK_EMB, embed_data, er) : W(H, ZS_R_LM_HEAD, head_data, hr);
    zs_dtype wdt = tied ? E->slot[ZS_R_TOK_EMB].dtype : H->slot[ZS_R_LM_HEAD].dtype;
    float *gW = eval ? NULL : tied ? G(GE, ZS_R_TOK_EMB, t->ga_data, t->ga_res) : G(GH, ZS_R_LM_HEAD, hgd, hgr);
    if (rc == 0)
        rc = head_compute(t, H, head_data, hr, Wh, wdt, targets, scale, eval, gW,
                          eval ? NULL : G(GH, ZS_R_OUT_NORM_W, hgd, hgr), eval ? NULL : G(GH, ZS_R_OUT_NORM_B, hgd, hgr),
                          ran);
    if (rc == 0) rc = sync(t, "head");
    double sum = 0.0;
    for (int ci = 0; rc == 0 && ci < t->nchunks; ci++)
        if (ran[ci]) sum += t->closs_h[ci];
    free(ran);
    /* the gradients, added into the caller's buffers */
    if (rc == 0 && !eval) {
        uint64_t hm = 1ull << ZS_R_OUT_NORM_W | 1ull << ZS_R_OUT_NORM_B | (tied ? 0 : 1ull << ZS_R_LM_HEAD);
        rc = add_grads(t, hb, hgd, hgr, g_head_data, g_head_res, hm);
        if (rc == 0 && tied) rc = add_grads(t, eb, t->ga_data, t->ga_res, g_embed_data, g_embed_res, 1ull << ZS_R_TOK_EMB);
    }
    if (rc < 0) {
        t->next = -1;
        return rc;
    }
    *loss = count ? (float)(sum / count) : 0.0f;
    if (eval) { /* loss only: the pass ends here */
        t->next = -1;
        return 0;
    }
    t->next++;
    return 0;
}

/* The backward of layer l after its recompute (backward.c's zs_train_layer_bwd, dense layers):
 * gradients into the device areas gd / gr, dres becomes the gradient of the layer's input. */
static int layer_backward(zs_trainer_cuda *t, int l, const void *data, const void *res, float *gd, float *gr) {
    const zs_model_config *c = t->c;
    int b = zs_bucket_layer(l);
    const zs_bucket_layout *L = zs_model_layout(t->m, b), *GL = zs_model_grad_layout(t->m, b);
    int n = t->N, d = t->d, qd = t->qd, kvd = t->kvd, ff = t->ff, T = t->T;
    size_t nd = (size_t)n * d, nf = (size_t)n * ff;
    const float *x_in = t->xs + (size_t)l * nd;
#define MAT(role) W(L, role, data, res), L->slot[role].dtype
#define VEC(role) WF(L, role, data, res)
#define GR(role) G(GL, role, gd, gr)

    ZS_CHECK(layer_compute(t, l, data, res, x_in, NULL));
    /* MLP: x_out = xmid + [post-norm] down(act(xn2)) */
    const float *dm = t->dres;
    if (c->post_norms) {
        ZS_CHECK(dzero(t, t->dtmp, nd));
        ZS_CHECK(norm_b(t, t->dtmp, GR(ZS_R_POST_FFN_NORM), NULL, t->dres, t->mo, VEC(ZS_R_POST_FFN_NORM), n));
        dm = t->dtmp;
    }
    ZS_CHECK(dzero(t, t->dha, nf));
    ZS_CHECK(lin_bwd(t, t->dha, GR(ZS_R_W_DOWN), GR(ZS_R_B_DOWN), dm, t->ha, MAT(ZS_R_W_DOWN), n, ff, d));
    ZS_CHECK(dzero(t, t->dxn, nd));
    if (c->arch == ZS_ARCH_GPT2) {
        DCHK(zs_cuda_gelu_bwd(t->dhu, t->dha, t->hu, nf, t->s), "gelu backward kernel");
    } else {
        if (c->act) DCHK(zs_cuda_geglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf, t->s), "geglu backward kernel");
        else DCHK(zs_cuda_swiglu_bwd(t->dhg, t->dhu, t->dha, t->hg, t->hu, nf, t->s), "swiglu backward kernel");
        ZS_CHECK(lin_bwd(t, t->dxn, GR(ZS_R_W_GATE), GR(ZS_R_B_GATE), t->dhg, t->xn2, MAT(ZS_R_W_GATE), n, d, ff));
    }
    ZS_CHECK(lin_bwd(t, t->dxn, GR(ZS_R_W_UP), GR(ZS_R_B_UP), t->dhu, t->xn2, MAT(ZS_R_W_UP), n, d, ff));
    /* the residual passes dres through; the norm adds its branch: dres becomes d xmid */
    ZS_CHECK(norm_b(t, t->dres, GR(ZS_R_FFN_NORM_W), GR(ZS_R_FFN_NORM_B), t->dxn, t->xmid, VEC(ZS_R_FFN_NORM_W), n));

    /* attention: xmid = x_in + [post-norm] o(attn(rope(qn(q(xn1))), rope(kn(k(xn1))), v(xn1))) */
    const float *dao = t->dres;
    if (c->post_norms) {
        ZS_CHECK(dzero(t, t->dtmp, nd));
        ZS_CHECK(norm_b(t, t->dtmp, GR(ZS_R_POST_ATTN_NORM), NULL, t->dres, t->ao, VEC(ZS_R_POST_ATTN_NORM), n));
        dao = t->dtmp;
    }
    ZS_CHECK(dzero(t, t->datt, (size_t)n * qd));
    ZS_CHECK(lin_bwd(t, t->datt, GR(ZS_R_WO), GR(ZS_R_BO), dao, t->att, MAT(ZS_R_WO), n, qd, d));
    ZS_CHECK(dzero(t, t->dq, (size_t)n * qd));
    ZS_CHECK(dzero(t, t->dk, (size_t)n * kvd));
    ZS_CHECK(dzero(t, t->dv, (size_t)n * kvd));
    zs_cuda_att_params ap = att_params(c, l);
    for (int s = 0; s < t->B; s++) {
        size_t o = (size_t)s * T;
        DCHK(zs_cuda_attention_bwd_ex(t->dq + o * qd, t->dk + o * kvd, t->dv + o * kvd, t->datt + o * qd,
                                      t->q + o * qd, t->k + o * kvd, t->v + o * kvd, T, c->n_heads, c->n_kv_heads,
                                      c->head_dim, &ap, t->astats, t->s), "attention backward kernel");
    }
    if (c->arch != ZS_ARCH_GPT2) {
        ZS_CHECK(rope(t, l, t->dq, c->n_heads, qd, 1));
        ZS_CHECK(rope(t, l, t->dk, c->n_kv_heads, kvd, 1));
    }
    const float *dqe = t->dq, *dke = t->dk;
    if (c->qk_norm || c->qk_norm_full) { /* through the q / k norms (per head, or whole) */
        int full = !c->qk_norm;
        ZS_CHECK(dzero(t, t->dqraw, (size_t)n * qd));
        DCHK(zs_cuda_rmsnorm_off_bwd(t->dqraw, GR(ZS_R_Q_NORM), t->dq, t->qraw, VEC(ZS_R_Q_NORM), c->norm_offset,
                                     full ? n : n * c->n_heads, full ? qd : c->head_dim, c->norm_eps, t->nstats, t->s),
             "q norm backward kernel");
        ZS_CHECK(dzero(t, t->dkraw, (size_t)n * kvd));
        DCHK(zs_cuda_rmsnorm_off_bwd(t->dkraw, GR(ZS_R_K_NORM), t->dk, t->kraw, VEC(ZS_R_K_NORM), c->norm_offset,
                                     full ? n : n * c->n_kv_heads, full ? kvd : c->head_dim, c->norm_eps, t->nstats,
                                     t->s), "k norm backward kernel");
        dqe = t->dqraw;
        dke = t->dkraw;
    }
    ZS_CHECK(dzero(t, t->dxn, nd));
    ZS_CHECK(lin_bwd(t, t->dxn, GR(ZS_R_WQ), GR(ZS_R_BQ), dqe, t->xn1, MAT(ZS_R_WQ), n, d, qd));
    ZS_CHECK(lin_bwd(t, t->dxn, GR(ZS_R_WK), GR(ZS_R_BK), dke, t->xn1, MAT(ZS_R_WK), n, d, kvd));
    ZS_CHECK(lin_bwd(t, t->dxn, GR(ZS_R_WV), GR(ZS_R_BV), t->dv, t->xn1, MAT(ZS_R_WV), n, d, kvd));
    ZS_CHECK(norm_b(t, t->dres, GR(ZS_R_ATTN_NORM_W), GR(ZS_R_ATTN_NORM_B), t->dxn, x_in, VEC(ZS_R_ATTN_NORM_W), n));
#undef GR
#undef VEC
#undef MAT
    return 0;
}

int zs_trainer_cuda_layer_bwd(zs_trainer_cuda *t, int layer, const void *data, const void *res, float *g_data,
                              float *g_res) {
    if (layer < 0 || layer >= t->L) return zs_err(ZS_EINVAL, "trainer: layer %d out of range", layer);
    ZS_CHECK(expect(t, 2 * t->L + 1 - layer, "zs_train_layer_bwd"));
    int b = zs_bucket_layer(layer);
    ZS_CHECK(check_areas(zs_model_layout(t->m, b), data, res, "layer backward"));
    ZS_CHECK(check_areas(zs_model_grad_layout(t->m, b), g_data, g_res, "layer gradient"));
    ZS_CHECK(zs_dev_set_current(t->dev));
    const void *rd;
    int rc = upload_res(t, b, res, t->res_a, &rd);
    if (rc == 0) rc = zero_grads(t, b, t->ga_data, t->ga_res);
    if (rc == 0) rc = layer_backward(t, layer, data, rd, t->ga_data, t->ga_res);
    if (rc == 0) rc = add_grads(t, b, t->ga_data, t->ga_res, g_data, g_res, ~0ull);
    if (rc < 0) {
        t->next = -1;
        return rc;
    }
    t->next++;
    return 0;
}

int zs_trainer_cuda_embed_bwd(zs_trainer_cuda *t, const void *data, const void *res, float *g_data, float *g_res) {
    ZS_CHECK(expect(t, 2 * t->L + 2, "zs_train_embed_bwd"));
    int eb = zs_bucket_embed();
    const zs_bucket_layout *GE = zs_model_grad_layout(t->m, eb);
    (void)data; /* the embedding backward reads no weights */
    (void)res;
    ZS_CHECK(check_areas(GE, g_data, g_res, "embedding gradient"));
    ZS_CHECK(zs_dev_set_current(t->dev));
    /* the residual's gradient comes down and is scattered by the CPU's op (backward.c's arithmetic
     * from here on) */
    size_t nd = (size_t)t->N * t->d;
    int rc = down(t, t->dres_h, t->dres, nd, 0);
    if (rc < 0) {
        t->next = -1;
        return rc;
    }
    if (t->c->embed_scale > 0) /* the table's rows were scaled: so is their gradient */
        for (size_t i = 0; i < nd; i++) t->dres_h[i] *= t->c->embed_scale;
    zs_op_embed_bwd(G(GE, ZS_R_TOK_EMB, g_data, g_res), t->dres_h, t->tokens, t->N, t->d);
    float *gp = G(GE, ZS_R_POS_EMB, g_data, g_res);
    if (gp) zs_op_embed_bwd(gp, t->dres_h, t->pos, t->N, t->d);
    t->next = -1;
    return 0;
}

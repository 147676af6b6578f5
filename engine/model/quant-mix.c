/* quant-mix.c — llama.cpp's Q4_K_M tensor mix (quant-mix.h): the block format of each matrix
 * from its role, its layer and its row length. */
#include "quant-mix.h"

#include "model.h"

int zs_quant_mix_more_bits(int layer, int n_layers) {
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

int zs_quant_mix_is_70b(int family, int n_layers, int n_heads, int n_kv_heads, int n_experts) {
    if (n_layers != 80) return 0;
    if (family == ZS_FAM_QWEN2) return 1;
    return (family == ZS_FAM_LLAMA || family == ZS_FAM_MISTRAL || family == ZS_FAM_MIXTRAL) && n_experts != 8 &&
           n_heads != n_kv_heads;
}

/* llama-quantize's fallback for rows that are not whole super-blocks: Q4_K -> Q5_0, Q5_K -> Q5_1,
 * Q6_K -> Q8_0, and F16 when the rows are not whole blocks of 32 either */
static zs_dtype fit_rows(zs_dtype dt, int64_t row_len) {
    if (row_len % ZS_QK_K == 0) return dt;
    return row_len % ZS_Q8_0_BLOCK != 0 ? ZS_F16 : dt == ZS_Q6_K ? ZS_Q8_0 : dt == ZS_Q5_K ? ZS_Q5_1 : ZS_Q5_0;
}

/* a Q8_0 choice: F16 when the rows are not whole blocks (llama-quantize refuses the tensor) */
static zs_dtype fit_q8(int64_t row_len) { return row_len % ZS_Q8_0_BLOCK != 0 ? ZS_F16 : ZS_Q8_0; }

/* llama-quantize's rule for the attn_v-like tensors (attn_v, attn_qkv): Q6_K where use_more_bits,
 * else Q4_K (a 70B model: Q5_K), then with 8 experts Q8_0 whatever came before */
static zs_dtype attn_v_type(int layer, int n_layers, int64_t row_len, unsigned flags) {
    if (flags & ZS_QMIX_EXPERTS8) return fit_q8(row_len);
    zs_dtype t = zs_quant_mix_more_bits(layer, n_layers) ? ZS_Q6_K : ZS_Q4_K;
    if ((flags & ZS_QMIX_70B) && t == ZS_Q4_K) t = ZS_Q5_K;
    return fit_rows(t, row_len);
}

zs_dtype zs_quant_mix_q4_k_m(int layer, int role, int n_layers, int64_t row_len, unsigned flags) {
    if (n_layers < 1 || layer < -1 || layer > n_layers || row_len < 1) return ZS_DTYPE_COUNT;
    if (layer == -1) { /* embeddings */
        if (role == ZS_R_POS_EMB) return ZS_F32;
        if (role != ZS_R_TOK_EMB) return ZS_DTYPE_COUNT;
        if (!(flags & ZS_QMIX_TIED)) return fit_rows(ZS_Q4_K, row_len);
        role = ZS_R_LM_HEAD, layer = n_layers; /* a tied table is quantized as the output tensor */
    }
    if (layer == n_layers) { /* head */
        if (role == ZS_R_OUT_NORM_W || role == ZS_R_OUT_NORM_B) return ZS_F32;
        if (role != ZS_R_LM_HEAD) return ZS_DTYPE_COUNT;
        if (row_len % ZS_Q8_0_BLOCK != 0) return ZS_F16;
        return row_len % ZS_QK_K != 0 ? ZS_Q8_0 : ZS_Q6_K;
    }
    int x8 = !!(flags & ZS_QMIX_EXPERTS8), fused = !!(flags & ZS_QMIX_FUSED_QKV);
    switch (role) {
    case ZS_R_WQ:
        return fused ? attn_v_type(layer, n_layers, row_len, flags) : fit_rows(ZS_Q4_K, row_len);
    case ZS_R_WK:
        if (fused) return attn_v_type(layer, n_layers, row_len, flags);
        if (x8) return fit_q8(row_len); /* llama-quantize: 8 experts */
        return fit_rows(ZS_Q4_K, row_len);
    case ZS_R_WV:
        return attn_v_type(layer, n_layers, row_len, flags);
    case ZS_R_W_DOWN: /* also ffn_down_exps (an expert bucket's) and ffn_down_shexp */
        return fit_rows(zs_quant_mix_more_bits(layer, n_layers) ? ZS_Q6_K : ZS_Q4_K, row_len);
    case ZS_R_WO: /* llama-quantize: Q5_K with 8 experts (falling back to Q5_1, then F16) */
        return fit_rows(x8 ? ZS_Q5_K : ZS_Q4_K, row_len);
    case ZS_R_W_GATE:
    case ZS_R_W_UP:
        return fit_rows(ZS_Q4_K, row_len);
    case ZS_R_ATTN_NORM_W: case ZS_R_ATTN_NORM_B: case ZS_R_FFN_NORM_W: case ZS_R_FFN_NORM_B:
    case ZS_R_BQ: case ZS_R_BK: case ZS_R_BV: case ZS_R_BO: case ZS_R_B_GATE: case ZS_R_B_UP: case ZS_R_B_DOWN:
    case ZS_R_Q_NORM: case ZS_R_K_NORM: case ZS_R_POST_ATTN_NORM: case ZS_R_POST_FFN_NORM:
    case ZS_R_ROUTER: case ZS_R_SHARED_GATE: /* llama-quantize: "ffn_gate_inp.weight" never; the shared gate is 1-D */
        return ZS_F32;
    default:
        return ZS_DTYPE_COUNT;
    }
}

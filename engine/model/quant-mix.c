/* quant-mix.c — llama.cpp's Q4_K_M tensor mix (quant-mix.h): the block format of each matrix
 * from its role, its layer and its row length. */
#include "quant-mix.h"

#include "model.h"

int zs_quant_mix_more_bits(int layer, int n_layers) {
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

/* llama-quantize's fallback for rows that are not whole super-blocks */
static zs_dtype fit_rows(zs_dtype dt, int64_t row_len) {
    if (row_len % ZS_QK_K == 0) return dt;
    return row_len % ZS_Q8_0_BLOCK != 0 ? ZS_F16 : dt == ZS_Q6_K ? ZS_Q8_0 : ZS_Q5_0;
}

/* a Q8_0 choice: F16 when the rows are not whole blocks (llama-quantize refuses the tensor) */
static zs_dtype fit_q8(int64_t row_len) { return row_len % ZS_Q8_0_BLOCK != 0 ? ZS_F16 : ZS_Q8_0; }

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
    int x8 = !!(flags & ZS_QMIX_EXPERTS8);
    switch (role) {
    case ZS_R_WQ:
        return fit_rows(flags & ZS_QMIX_FUSED_QKV ? ZS_Q6_K : ZS_Q4_K, row_len);
    case ZS_R_WK:
        if (x8 && !(flags & ZS_QMIX_FUSED_QKV)) return fit_q8(row_len); /* llama-quantize: 8 experts */
        return fit_rows(flags & ZS_QMIX_FUSED_QKV ? ZS_Q6_K : ZS_Q4_K, row_len);
    case ZS_R_WV:
        if (x8 && !(flags & ZS_QMIX_FUSED_QKV)) return fit_q8(row_len);
        return fit_rows((flags & ZS_QMIX_FUSED_QKV) || zs_quant_mix_more_bits(layer, n_layers) ? ZS_Q6_K : ZS_Q4_K,
                        row_len);
    case ZS_R_W_DOWN: /* also ffn_down_exps (an expert bucket's) and ffn_down_shexp */
        return fit_rows(zs_quant_mix_more_bits(layer, n_layers) ? ZS_Q6_K : ZS_Q4_K, row_len);
    case ZS_R_WO:
        if (x8) { /* llama-quantize: Q5_K, falling back to Q5_1; Q5_K is not made here: Q6_K */
            if (row_len % ZS_QK_K == 0) return ZS_Q6_K;
            return row_len % ZS_Q8_0_BLOCK != 0 ? ZS_F16 : ZS_Q5_1;
        }
        return fit_rows(ZS_Q4_K, row_len);
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

/* rope.c — RoPE frequencies per rope_scaling type, following transformers' modeling_rope_utils.py
 * formula by formula in float32 (the python scalars it mixes in are rounded to float where torch
 * rounds them). See rope.h. */
#include "rope.h"

#include <math.h>

#include "common.h"

int zs_rope_layer_local(const zs_model_config *c, int layer) {
    return c->rope_local_theta > 0 && zs_config_layer_sliding(c, layer);
}

int zs_rope_pos_dependent(const zs_model_config *c, int layer) {
    if (zs_rope_layer_local(c, layer)) return 0;
    return c->rope.type == ZS_ROPE_DYNAMIC || c->rope.type == ZS_ROPE_LONGROPE;
}

int zs_rope_pos_layer(const zs_model_config *c) {
    if (c->arch == ZS_ARCH_GPT2) return -1;
    for (int l = 0; l < c->n_layers; l++)
        if (zs_rope_pos_dependent(c, l)) return l;
    return -1;
}

/* 1 / base^(2i/dim) for i < dim/2: _compute_default_rope_parameters */
static void rope_default(float *inv, int dim, float base) {
    for (int i = 0; i < dim / 2; i++) inv[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static double yarn_corr_dim(double rot, int dim, double base, double maxpos) {
    return (dim * log(maxpos / (rot * 2 * M_PI))) / (2 * log(base));
}

void zs_rope_freqs(const zs_model_config *c, int layer, int pos, float *inv, float *af) {
    const zs_rope_scaling *r = &c->rope;
    int dim = c->head_dim, half = dim / 2;
    *af = 1.0f;
    if (zs_rope_layer_local(c, layer)) {
        rope_default(inv, dim, c->rope_local_theta);
        return;
    }
    float base = c->rope_theta;
    switch (r->type) {
    case ZS_ROPE_LINEAR:
        rope_default(inv, dim, base);
        for (int i = 0; i < half; i++) inv[i] /= r->factor;
        return;
    case ZS_ROPE_DYNAMIC: {
        /* the sequence length is pos + 1 (rope.h); no change up to max_position_embeddings */
        int64_t seq = (int64_t)pos + 1, mp = r->orig_max_pos > 0 ? r->orig_max_pos : c->max_seq;
        if (seq <= mp) {
            rope_default(inv, dim, base);
            return;
        }
        float t = r->factor * (float)seq;
        t = t / (float)mp;
        t = t - (float)(r->factor - 1.0);
        t = powf(t, (float)((double)dim / (double)(dim - 2)));
        rope_default(inv, dim, base * t);
        return;
    }
    case ZS_ROPE_LLAMA3: {
        rope_default(inv, dim, base);
        double old = r->orig_max_pos, lw = old / r->low_freq_factor, hw = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            float wl = (float)(2 * M_PI) / inv[i];
            float il = wl > (float)lw ? inv[i] / r->factor : inv[i];
            if (!(wl < (float)hw) && !(wl > (float)lw)) {
                float sm = ((float)old / wl - r->low_freq_factor) / (float)(r->high_freq_factor - r->low_freq_factor);
                il = (1.0f - sm) * il / r->factor + sm * il;
            }
            inv[i] = il;
        }
        return;
    }
    case ZS_ROPE_YARN: {
        double factor = r->factor, maxpos = r->orig_max_pos > 0 ? r->orig_max_pos : c->max_seq;
        double a = r->attention_factor;
        if (!(a > 0)) {
            if (r->mscale > 0 && r->mscale_all_dim > 0)
                a = yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim);
            else a = yarn_mscale(factor, 1.0);
        }
        *af = (float)a;
        double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
        double lo = yarn_corr_dim(bf, dim, base, maxpos), hi = yarn_corr_dim(bs, dim, base, maxpos);
        if (r->truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            float pf = powf(base, (float)(2 * i) / (float)dim);
            float ext = 1.0f / pf, itp = 1.0f / ((float)factor * pf);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0 ? 0.0f : ramp > 1 ? 1.0f : ramp;
            float ef = 1.0f - ramp;
            inv[i] = itp * (1.0f - ef) + ext * ef;
        }
        return;
    }
    case ZS_ROPE_LONGROPE: {
        int orig = r->orig_max_pos > 0 ? r->orig_max_pos : c->max_seq;
        double factor = r->orig_max_pos > 0 ? (double)c->max_seq / r->orig_max_pos : r->factor;
        double a = r->attention_factor;
        if (!(a > 0)) a = factor <= 1.0 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
        *af = (float)a;
        const float *ext = (int64_t)pos + 1 > orig ? r->long_factor : r->short_factor;
        for (int i = 0; i < half; i++) inv[i] = 1.0f / (ext[i] * powf(base, (float)(2 * i) / (float)dim));
        return;
    }
    default:
        rope_default(inv, dim, base);
        return;
    }
}

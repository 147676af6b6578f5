/* lossscale.c — DeepSpeed's static and dynamic fp16 loss scalers (lossscale.h). */
#include "lossscale.h"

#include <math.h>
#include <string.h>

#include "common.h"

int zs_loss_scaler_init(zs_loss_scaler *s, int fp16, const zs_zero_opts *o) {
    memset(s, 0, sizeof *s);
    s->scale = 1.0;
    s->min_scale = 1.0;
    s->window = 1000;
    s->hysteresis = s->cur_hysteresis = 2;
    s->last_overflow = -1;
    if (!fp16) return 0;
    double ls = o && !isnan(o->loss_scale) ? o->loss_scale : 0.0;
    if (ls > 0) { /* static */
        s->scale = ls;
        return 0;
    }
    s->dynamic = 1;
    int p = o && o->initial_scale_power >= 0 ? o->initial_scale_power : 16;
    s->scale = ldexp(1.0, p);
    if (o && o->loss_scale_window > 0) s->window = o->loss_scale_window;
    if (o && o->hysteresis > 0) s->hysteresis = s->cur_hysteresis = o->hysteresis;
    if (o && o->consecutive_hysteresis >= 0) s->consecutive_hysteresis = o->consecutive_hysteresis;
    if (o && !isnan(o->min_loss_scale)) s->min_scale = o->min_loss_scale;
    if (!(s->min_scale > 0) || !isfinite(s->scale))
        return zs_err(ZS_EINVAL, "fp16: min_loss_scale must be > 0 and the initial scale finite");
    return 0;
}

int zs_loss_scaler_update(zs_loss_scaler *s, int overflow) {
    int rc = 0;
    if (!s->dynamic) {
        s->iter++;
        return 0;
    }
    if (overflow) {
        s->skipped++;
        if (s->hysteresis == 1 || s->cur_hysteresis == 1) {
            if (s->scale == s->min_scale)
                rc = zs_err(ZS_ERANGE, "fp16: the gradients overflow at the minimum loss scale %g (fp16.min_loss_scale); "
                                       "the run cannot go on (train in bf16, or lower the learning rate)", s->scale);
            else s->scale = fmax(s->scale / 2.0, s->min_scale);
        } else {
            s->cur_hysteresis--;
        }
        s->last_overflow = s->iter;
    } else {
        if (s->consecutive_hysteresis) s->cur_hysteresis = s->hysteresis;
        long stable = s->iter - s->last_overflow - 1;
        if (stable > 0 && stable % s->window == 0) {
            if (!s->consecutive_hysteresis) s->cur_hysteresis = s->hysteresis;
            s->scale *= 2.0;
        }
    }
    s->iter++;
    return rc;
}

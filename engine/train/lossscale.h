/* lossscale.h — fp16 loss scaling with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py:
 * LossScaler for a static scale, DynamicLossScaler.update_scale for a dynamic one).
 *
 * The training multiplies the loss (in practice: each micro-batch's gradient, before it is cast to
 * fp16 for the wire) by the current scale, every rank checks its gradient partitions for inf/NaN,
 * the ranks agree on the flag (MAX all-reduce), and then:
 *   - overflow: the step is skipped (nothing changes); with hysteresis h the scale is halved only
 *     when h is 1 or the remaining hysteresis has run down to 1, otherwise the remaining hysteresis
 *     drops by one; the scale never goes below min_scale; an overflow at min_scale stops the run
 *     (ZS_ERANGE: DeepSpeed raises "Current loss scale already at minimum");
 *   - no overflow: with consecutive_hysteresis the hysteresis is refilled; after scale_window clean
 *     iterations since the last overflow (stable = iter - last_overflow - 1 > 0 and a multiple of
 *     the window) the scale doubles (and, without consecutive_hysteresis, the hysteresis is refilled);
 *   - every iteration, skipped or not, advances iter.
 * A static scale (or bf16/fp32: scale 1) never changes and never skips.
 *
 * Plain data, no allocation: copy it to save it. Not thread-safe (one per training). */
#ifndef ZS_LOSSSCALE_H
#define ZS_LOSSSCALE_H

#include "dsconfig.h"

typedef struct {
    int dynamic;              /* 0: static scale */
    double scale;             /* the current scale (DeepSpeed's cur_scale) */
    double min_scale;
    int window;               /* scale_window */
    int hysteresis;           /* delayed_shift */
    int cur_hysteresis;
    int consecutive_hysteresis;
    long iter;                /* cur_iter: iterations seen, skipped ones included */
    long last_overflow;       /* last_overflow_iter (-1: none) */
    long skipped;             /* overflows so far (the steps skipped) */
} zs_loss_scaler;

/* fp16 on: from the fp16.* keys of o (unset keys: DeepSpeed's defaults; o may be NULL); off: a
 * static scale of 1. ZS_EINVAL for an impossible combination (min_loss_scale above the initial
 * scale is allowed, as in DeepSpeed: the first halving clamps to it). */
int zs_loss_scaler_init(zs_loss_scaler *s, int fp16, const zs_zero_opts *o);
/* Records one iteration's agreed overflow flag. 0, or ZS_ERANGE (message) when an overflow comes
 * at the minimum scale of a dynamic scaler (the state is updated first: iter, skipped). */
int zs_loss_scaler_update(zs_loss_scaler *s, int overflow);

#endif

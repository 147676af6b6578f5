/* backward-cuda.h — the device trainer (backward-cuda.c, built only with CUDA) behind the public
 * trainer of backward.h: zs_trainer_new_device wraps one of these in a zs_trainer, and every public
 * call of that trainer forwards here (backward.c). Private to backward.c and backward-cuda.c.
 *
 * Same contract as backward.h (call order, layouts, the += gradient contract, the loss), with the
 * bucket data areas (`data`) DEVICE pointers in the storage dtype and everything else host memory:
 * `res` is uploaded per call into a device scratch, tokens and targets are copied, and each call's
 * gradients are computed into device scratch in fp32, downloaded and added into the host buffers.
 * Ownership: it owns its device buffers (from the rank's zs_dev pool), pinned staging and host
 * scratch; the model and the device are borrowed and must outlive it. Thread-safety: one thread at
 * a time (the rank's compute thread); all its device work is on the device's compute queue. */
#ifndef ZS_BACKWARD_CUDA_H
#define ZS_BACKWARD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct zs_trainer_cuda zs_trainer_cuda;

/* dev: the rank's zs_dev (device.h). ZS_EUNSUPPORTED naming what it does not cover. */
int  zs_trainer_cuda_new(const zs_model *m, int B, int T, void *dev, zs_trainer_cuda **out);
void zs_trainer_cuda_free(zs_trainer_cuda *t);
size_t zs_trainer_cuda_bytes(const zs_trainer_cuda *t); /* device + host bytes held */
int  zs_trainer_cuda_set_loss_scale(zs_trainer_cuda *t, float s);
int  zs_trainer_cuda_embed_fwd(zs_trainer_cuda *t, const void *data, const void *res, const int32_t *tokens);
int  zs_trainer_cuda_layer_fwd(zs_trainer_cuda *t, int layer, const void *data, const void *res);
int  zs_trainer_cuda_head(zs_trainer_cuda *t, const void *head_data, const void *head_res, const void *embed_data,
                          const void *embed_res, const int32_t *targets, float *loss, float *g_head_data,
                          float *g_head_res, float *g_embed_data, float *g_embed_res);
int  zs_trainer_cuda_layer_bwd(zs_trainer_cuda *t, int layer, const void *data, const void *res, float *g_data,
                               float *g_res);
int  zs_trainer_cuda_embed_bwd(zs_trainer_cuda *t, const void *data, const void *res, float *g_data, float *g_res);

#endif

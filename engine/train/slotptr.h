/* slotptr.h — where a role's weight and gradient sit in a bucket, given the bucket's two areas
 * (the packed data area and the resident area): shared by the CPU trainer (backward.c) and the
 * device trainer (backward-cuda.c), which address host or device memory the same way. Pure
 * pointer arithmetic over zs_bucket_layout; nothing is read through the pointers. */
#ifndef ZS_SLOTPTR_H
#define ZS_SLOTPTR_H

#include "model.h"

/* A role's weight given the two base pointers; NULL when the role is absent. */
static inline const void *W(const zs_bucket_layout *L, int role, const void *data, const void *res) {
    const zs_slot *s = &L->slot[role];
    if (!s->present) return NULL;
    return (const char *)(s->resident ? res : data) + s->offset;
}
#define WF(L, role, data, res) ((const float *)W(L, role, data, res))

/* A role's gradient (grad layout) given the two gradient base pointers; NULL when absent, or when
 * its area is NULL (a frozen base has no gradients). */
static inline float *G(const zs_bucket_layout *GL, int role, float *g_data, float *g_res) {
    const zs_slot *s = &GL->slot[role];
    char *base = s->resident ? (char *)g_res : (char *)g_data;
    if (!s->present || !base) return NULL;
    return (float *)(void *)(base + s->offset);
}

#endif

/* spec.c — the calls of spec.h, dispatched to a proposer's ops (spec-ngram.c, spec-draft.c). */
#include "spec.h"

#include <stddef.h>

int zs_spec_propose(zs_spec *p, zs_spec_req *reqs, int n) {
    for (int i = 0; i < n; i++) {
        reqs[i].n_draft = 0;
        for (int j = 0; reqs[i].parent && j < reqs[i].k; j++) { /* a chain unless the proposer says otherwise */
            reqs[i].parent[j] = j - 1;
            if (reqs[i].share) reqs[i].share[j] = 1.0f;
        }
    }
    return p && n > 0 ? p->ops->propose(p, reqs, n) : 0;
}

void zs_spec_release(zs_spec *p, uintptr_t key) {
    if (p && p->ops->release) p->ops->release(p, key);
}

const char *zs_spec_name(const zs_spec *p) { return p ? p->ops->name : "none"; }

void zs_spec_free(zs_spec *p) {
    if (p) p->ops->free(p);
}

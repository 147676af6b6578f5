/* batch.c — the checks of a zs_batch that both forward passes (forward.c on the CPU,
 * forward-cuda.c) make before they acquire anything: positions inside the reserved context, a
 * token tree's rows in node order with depth-based positions and rising slots (model.h), and the
 * KV moves inside their sequences' room. */
#include "common.h"
#include "model.h"

int zs_batch_check(const zs_batch *b, const zs_kvcache *kv, int max_seq) {
    static const zs_batch_tree none = {NULL, NULL, NULL, 0};
    const zs_batch_tree *t = b->tree ? b->tree : &none;
    if (!t->slot != !t->parent) return zs_err(ZS_EINVAL, "forward: a token tree needs both slots and parents");
    for (int i = 0; i < b->n; i++) {
        int p = b->pos[i], sl = t->slot ? t->slot[i] : p, len = zs_kv_seq_len(kv, b->seq[i]);
        if (p < 0 || p >= len || p >= max_seq || sl < 0 || sl >= len)
            return zs_err(ZS_ERANGE, "position %d is outside the reserved context", sl > p ? sl : p);
        if (!t->parent) continue;
        int a = t->parent[i];
        if (a == -1 ? sl != p
                    : a < 0 || a >= i || b->seq[a] != b->seq[i] || b->pos[a] != p - 1 || t->slot[a] >= sl)
            return zs_err(ZS_EINVAL, "forward: token tree: row %d (position %d, slot %d) cannot have parent %d", i, p,
                          sl, a);
    }
    if (t->n_moves < 0 || (t->n_moves > 0 && !t->moves)) return zs_err(ZS_EINVAL, "forward: %d KV moves", t->n_moves);
    for (int i = 0; i < t->n_moves; i++) {
        const zs_kv_move *m = &t->moves[i];
        if (m->seq < 0 || m->seq >= zs_kv_max_seqs(kv) || m->from < 0 || m->to < 0 ||
            m->from >= zs_kv_seq_len(kv, m->seq) || m->to >= zs_kv_seq_len(kv, m->seq))
            return zs_err(ZS_ERANGE, "forward: a KV move from %d to %d is outside sequence %d's room", m->from, m->to,
                          m->seq);
    }
    return 0;
}

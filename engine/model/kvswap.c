/* kvswap.c — a KV sequence's blocks to a tier and back (kvswap.h). */
#include "kvswap.h"

#include <stdlib.h>

#include "common.h"

struct zs_kv_swapped {
    int len;     /* the sequence's length (zs_kv_seq_len) */
    int n;       /* records: one per unit (zs_kv_seq_units) */
    int slots[]; /* each unit's record */
};

size_t zs_kv_swap_rec_bytes(const zs_kvcache *kv) { return zs_kv_block_layer_bytes(kv) * (size_t)zs_kv_layers(kv); }

/* the iovecs of block b: its bytes in every layer's pool */
static void block_iov(zs_kvcache *kv, int b, struct iovec *iov) {
    for (int l = 0; l < zs_kv_layers(kv); l++)
        iov[l] = (struct iovec){zs_kv_block_data(kv, l, b), zs_kv_block_layer_bytes(kv)};
}

int zs_kv_swap_out(zs_kvcache *kv, int seq, zs_kvtier *t, zs_kv_swapped **out) {
    if (!zs_kv_block_data(kv, 0, 0)) return zs_err(ZS_EUNSUPPORTED, "kv swap: the cache has no host memory (device KV)");
    if (zs_kvtier_rec_bytes(t) != zs_kv_swap_rec_bytes(kv))
        return zs_err(ZS_EINVAL, "kv swap: the tier's records are %zu bytes, a block is %zu", zs_kvtier_rec_bytes(t),
                      zs_kv_swap_rec_bytes(kv));
    if (zs_kv_seq_streamed(kv, seq))
        return zs_err(ZS_EUNSUPPORTED, "kv swap: sequence %d is streamed (its K/V are in the stream's tier)", seq);
    const int *units;
    int n = zs_kv_seq_units(kv, seq, &units);
    zs_kv_swapped *sw = malloc(sizeof *sw + (size_t)n * sizeof(int));
    struct iovec *iov = malloc((size_t)zs_kv_layers(kv) * sizeof *iov);
    if (!sw || !iov) {
        free(sw);
        free(iov);
        return zs_err(ZS_ENOMEM, "kv swap: out of memory");
    }
    sw->len = zs_kv_seq_len(kv, seq);
    sw->n = n;
    int rc = 0, i = 0;
    for (; i < n && rc == 0; i++) {
        block_iov(kv, units[i], iov);
        rc = zs_kvtier_put(t, iov, zs_kv_layers(kv), 0, &sw->slots[i]);
    }
    free(iov);
    if (rc < 0) {
        for (int j = 0; j < i - 1; j++) zs_kvtier_drop(t, sw->slots[j]);
        free(sw);
        return rc;
    }
    zs_kv_seq_close(kv, seq);
    *out = sw;
    return 0;
}

int zs_kv_swapped_blocks(const zs_kv_swapped *sw) { return sw->n; }

int zs_kv_swap_in(zs_kvcache *kv, zs_kv_swapped *sw, zs_kvtier *t, int *seq) {
    if (zs_kv_avail_blocks(kv) < sw->n)
        return zs_err(ZS_ENOSPC, "kv swap: %d blocks needed, %d free", sw->n, zs_kv_avail_blocks(kv));
    int s;
    ZS_CHECK(zs_kv_seq_open(kv, &s));
    int rc = zs_kv_seq_reserve(kv, s, sw->len);
    const int *units;
    if (rc == 0 && zs_kv_seq_units(kv, s, &units) != sw->n)
        rc = zs_err(ZS_EINVAL, "kv swap: the sequence came back with %d blocks, not %d", zs_kv_seq_units(kv, s, &units), sw->n);
    struct iovec *iov = rc == 0 ? malloc((size_t)zs_kv_layers(kv) * sizeof *iov) : NULL;
    if (rc == 0 && !iov) rc = zs_err(ZS_ENOMEM, "kv swap: out of memory");
    for (int i = 0; i < sw->n && rc == 0; i++) {
        block_iov(kv, units[i], iov);
        rc = zs_kvtier_get(t, sw->slots[i], iov, zs_kv_layers(kv));
    }
    free(iov);
    if (rc < 0) {
        zs_kv_seq_close(kv, s);
        return rc;
    }
    zs_kv_swapped_free(sw, t);
    *seq = s;
    return 0;
}

void zs_kv_swapped_free(zs_kv_swapped *sw, zs_kvtier *t) {
    if (!sw) return;
    for (int i = 0; i < sw->n; i++) zs_kvtier_drop(t, sw->slots[i]);
    free(sw);
}

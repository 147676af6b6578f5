/* kvprefix.c — prefix blocks below memory (kvprefix.h): an open-addressing table from prefix
 * hash to tier slot and an LRU list over the slots. */
#include "kvprefix.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

struct zs_kvprefix {
    zs_kvcache *kv;
    zs_kvtier *t;
    int cap, write_through;
    int tcap;              /* table entries: a power of two >= 2 * cap */
    int *table;            /* slot, -1 empty, -2 deleted */
    uint64_t *hash;        /* [slots] the hash a slot holds */
    int *prev, *next;      /* [slots] LRU links (head: least recently used) */
    int nslots;            /* entries of the arrays above */
    int head, tail, n;
    struct iovec *iov;     /* [layers] */
    int failed_warned;
    zs_kvprefix_stats st;
};

static int find(const zs_kvprefix *p, uint64_t h) {
    int mask = p->tcap - 1;
    for (int i = (int)(h & (uint64_t)mask), k = 0; k < p->tcap; i = (i + 1) & mask, k++) {
        int s = p->table[i];
        if (s == -1) return -1;
        if (s >= 0 && p->hash[s] == h) return s;
    }
    return -1;
}

static void table_put(zs_kvprefix *p, int s) {
    int mask = p->tcap - 1, i = (int)(p->hash[s] & (uint64_t)mask);
    while (p->table[i] >= 0) i = (i + 1) & mask;
    p->table[i] = s;
}

static void table_del(zs_kvprefix *p, int s) {
    int mask = p->tcap - 1;
    for (int i = (int)(p->hash[s] & (uint64_t)mask), k = 0; k < p->tcap; i = (i + 1) & mask, k++) {
        if (p->table[i] == -1) return;
        if (p->table[i] == s) {
            p->table[i] = -2;
            return;
        }
    }
}

static void lru_unlink(zs_kvprefix *p, int s) {
    if (p->prev[s] >= 0) p->next[p->prev[s]] = p->next[s];
    else p->head = p->next[s];
    if (p->next[s] >= 0) p->prev[p->next[s]] = p->prev[s];
    else p->tail = p->prev[s];
    p->n--;
}

static void lru_push(zs_kvprefix *p, int s) {
    p->prev[s] = p->tail;
    p->next[s] = -1;
    if (p->tail >= 0) p->next[p->tail] = s;
    else p->head = s;
    p->tail = s;
    p->n++;
}

static void touch(zs_kvprefix *p, int s) {
    lru_unlink(p, s);
    lru_push(p, s);
}

/* the per-slot arrays sized for slot s */
static int room_for(zs_kvprefix *p, int s) {
    if (s < p->nslots) return 0;
    int n = p->nslots ? p->nslots : 64;
    while (n <= s) n *= 2;
    uint64_t *h = realloc(p->hash, (size_t)n * sizeof *h);
    if (h) p->hash = h;
    int *a = realloc(p->prev, (size_t)n * sizeof *a);
    if (a) p->prev = a;
    int *b = realloc(p->next, (size_t)n * sizeof *b);
    if (b) p->next = b;
    if (!h || !a || !b) return zs_err(ZS_ENOMEM, "kv prefix tier: out of memory");
    p->nslots = n;
    return 0;
}

static void forget(zs_kvprefix *p, int s) {
    table_del(p, s);
    lru_unlink(p, s);
    zs_kvtier_drop(p->t, s);
}

static void block_iov(zs_kvprefix *p, int b) {
    for (int l = 0; l < zs_kv_layers(p->kv); l++)
        p->iov[l] = (struct iovec){zs_kv_block_data(p->kv, l, b), zs_kv_block_layer_bytes(p->kv)};
}

/* block b of the cache written down under h (kept when already there) */
static void store(zs_kvprefix *p, int b, uint64_t h) {
    int s = find(p, h);
    if (s >= 0) {
        touch(p, s);
        return;
    }
    while (p->n >= p->cap) forget(p, p->head);
    block_iov(p, b);
    if (zs_kvtier_put(p->t, p->iov, zs_kv_layers(p->kv), h, &s) < 0) {
        p->st.put_errors++;
        if (!p->failed_warned) {
            zs_log_warn("KV prefix tier: %s; prefix blocks are forgotten when evicted (serving goes on from memory)",
                        zs_errmsg());
            p->failed_warned = 1;
        }
        return;
    }
    if (room_for(p, s) < 0) {
        zs_kvtier_drop(p->t, s);
        return;
    }
    p->hash[s] = h;
    table_put(p, s);
    lru_push(p, s);
    p->st.stored++;
}

static void on_evict(void *ud, int block, uint64_t hash) { store(ud, block, hash); }

int zs_kvprefix_open(zs_kvcache *kv, zs_kvtier *t, int cap, int write_through, zs_kvprefix **out) {
    if (cap < 1) return zs_err(ZS_EINVAL, "kv prefix tier: room for %d blocks", cap);
    if (!zs_kv_block_data(kv, 0, 0)) return zs_err(ZS_EUNSUPPORTED, "kv prefix tier: the cache has no host memory");
    zs_kvprefix *p = calloc(1, sizeof *p);
    if (!p) return zs_err(ZS_ENOMEM, "out of memory");
    p->kv = kv;
    p->t = t;
    p->cap = cap;
    p->write_through = write_through;
    p->head = p->tail = -1;
    p->tcap = 16;
    int slots = zs_kvtier_slots(t);
    while (p->tcap < 2 * ZS_MAX(cap, slots)) p->tcap <<= 1;
    p->table = malloc((size_t)p->tcap * sizeof(int));
    p->iov = malloc((size_t)zs_kv_layers(kv) * sizeof *p->iov);
    int rc = p->table && p->iov ? room_for(p, ZS_MAX(slots - 1, 0)) : zs_err(ZS_ENOMEM, "out of memory");
    if (rc < 0) {
        zs_kvprefix_free(p);
        return rc;
    }
    for (int i = 0; i < p->tcap; i++) p->table[i] = -1;
    /* a persistent file's records: indexed, duplicates and any beyond cap dropped */
    for (int s = 0; s < slots; s++) {
        uint64_t h;
        if (!zs_kvtier_tag(t, s, &h)) continue;
        if (find(p, h) >= 0 || p->n >= cap) {
            zs_kvtier_drop(t, s);
            continue;
        }
        p->hash[s] = h;
        table_put(p, s);
        lru_push(p, s);
        p->st.restored++;
    }
    zs_kv_set_evict_hook(kv, on_evict, p);
    *out = p;
    return 0;
}

void zs_kvprefix_free(zs_kvprefix *p) {
    if (!p) return;
    zs_kv_set_evict_hook(p->kv, NULL, NULL);
    free(p->table);
    free(p->hash);
    free(p->prev);
    free(p->next);
    free(p->iov);
    free(p);
}

int zs_kvprefix_lookup(const zs_kvprefix *p, const uint64_t *hashes, int n) {
    int k = 0;
    while (k < n && find(p, hashes[k]) >= 0) k++;
    return k;
}

int zs_kvprefix_take(zs_kvprefix *p, int seq, const uint64_t *hashes, int n) {
    int k = zs_kv_seq_len(p->kv, seq) / ZS_KV_BLOCK, taken = 0;
    if (k * ZS_KV_BLOCK != zs_kv_seq_len(p->kv, seq) || zs_kv_seq_streamed(p->kv, seq)) return 0;
    for (; k < n; k++) {
        int s = find(p, hashes[k]);
        if (s < 0) break;
        touch(p, s); /* the newest: a put the reserve below causes does not push it out */
        if (zs_kv_seq_reserve(p->kv, seq, (k + 1) * ZS_KV_BLOCK) < 0) break;
        const int *units;
        zs_kv_seq_units(p->kv, seq, &units);
        block_iov(p, units[k]);
        if (zs_kvtier_get(p->t, s, p->iov, zs_kv_layers(p->kv)) < 0) {
            zs_log_warn("KV prefix tier: %s; the block is dropped and prefilled instead", zs_errmsg());
            forget(p, s);
            p->st.dropped++;
            zs_kv_seq_truncate(p->kv, seq, k * ZS_KV_BLOCK);
            break;
        }
        zs_kv_seq_publish(p->kv, seq, k, hashes[k]);
        taken++;
    }
    p->st.taken += (uint64_t)taken;
    return taken;
}

void zs_kvprefix_publish(zs_kvprefix *p, int seq, int j, uint64_t hash) {
    if (!p->write_through) return;
    const int *units;
    if (j >= zs_kv_seq_units(p->kv, seq, &units) || units[j] >= zs_kv_total_blocks(p->kv)) return; /* a stage block */
    store(p, units[j], hash);
}

void zs_kvprefix_stats_get(const zs_kvprefix *p, zs_kvprefix_stats *out) {
    *out = p->st;
    out->held = p->n;
}

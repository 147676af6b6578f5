/* kvcache.c — paged KV cache: a free list of blocks and a block table per sequence; K/V pools of
 * f32, f16 or bf16 elements (values rounded to nearest even on write); reference-counted blocks
 * with a content-addressed prefix cache (an open-addressing table from prefix hash to block, and
 * an LRU list of the cached blocks no sequence holds). */
#include "kvcache.h"

#include <string.h>

#include "common.h"

typedef struct {
    int open;
    int len;
    int n_blocks; /* entries of blocks[] in use: ceil(len / ZS_KV_BLOCK) */
    int *blocks;  /* [max_blocks_per_seq]: the block of each table index */
    int n_phys;   /* blocks the sequence owns (n_blocks, or at most ring with a window) */
    int *phys;    /* [max(ring, 1)] with a window: the owned blocks; index j uses phys[j % ring] */
    int streamed; /* zs_kv_seq_set_streamed: new blocks are stage blocks */
} kv_seq;

struct zs_kvcache {
    int n_layers, kv_dim, n_blocks, max_seqs, max_len, max_bps;
    int window, ring; /* zs_kv_set_window: blocks per sequence (0: no window, a block per index) */
    zs_dtype dtype;
    size_t esize;  /* bytes of one element: 4 or 2 */
    char **pool;   /* [n_layers] -> n_blocks * 2 * ZS_KV_BLOCK * kv_dim elements */
    int *free_list;
    int n_free;
    kv_seq *seqs;
    /* prefix cache (zs_kv_prefix_enable): per block a reference count, its prefix hash (when
     * cached) and LRU links; the table maps hashes to blocks (-1 empty, -2 deleted) */
    int prefix;
    int *ref;
    uint64_t *bhash;
    unsigned char *hashed;
    int *lru_prev, *lru_next;
    int lru_head, lru_tail, n_lru;
    int *table;
    int table_cap; /* power of two, >= 2 * n_blocks */
    uint64_t evictions;
    zs_kv_evict_fn on_evict; /* zs_kv_set_evict_hook */
    void *evict_ud;
    /* stage blocks (zs_kv_stage_enable): ids n_blocks + sb; group g = sb / per lives in the lent
     * memory block lent[g] (-1: not lent), whose layer chunks 2k and 2k + 1 are stage block
     * g * per + k's even- and odd-layer buffers */
    int per, n_groups;
    int *lent, *group_used; /* [n_blocks] */
    int *gfree, n_gfree;    /* group ids not lent */
    int *sfree, n_sfree;    /* stage blocks of lent groups, not in use */
    unsigned char *sused, *sdirty; /* [n_blocks * per] */
    unsigned *sgen;         /* [n_blocks * per] bumped at every take */
    int *dirty, n_dirty;    /* written since zs_kv_stage_dirty_clear */
    int stage_used;
    zs_kv_layer_fn on_layer; /* zs_kv_set_layer_hook */
    void *layer_ud;
};

static int kv_dtype_ok(zs_dtype t) { return t == ZS_F32 || t == ZS_F16 || t == ZS_BF16; }

size_t zs_kv_block_bytes(int n_layers, int kv_dim, zs_dtype dtype) {
    size_t es = kv_dtype_ok(dtype) ? zs_dtype_size(dtype) : 0;
    return (size_t)n_layers * 2 * ZS_KV_BLOCK * (size_t)kv_dim * es;
}

int zs_kv_blocks_for_bytes(int n_layers, int kv_dim, zs_dtype dtype, size_t bytes) {
    size_t b = zs_kv_block_bytes(n_layers, kv_dim, dtype);
    size_t n = b ? bytes / b : 0;
    return n > 1 << 24 ? 1 << 24 : (int)n;
}

int zs_kv_init(int n_layers, int kv_dim, int n_blocks, int max_seqs, int max_len,
               zs_kvcache **out) {
    return zs_kv_init_ex(n_layers, kv_dim, n_blocks, max_seqs, max_len, ZS_F32, 1, out);
}

int zs_kv_init_ex(int n_layers, int kv_dim, int n_blocks, int max_seqs, int max_len, zs_dtype dtype,
                  int host_data, zs_kvcache **out) {
    if (n_layers <= 0 || kv_dim <= 0 || n_blocks <= 0 || max_seqs <= 0 || max_len <= 0)
        return zs_err(ZS_EINVAL, "kv cache: invalid size (layers %d, kv_dim %d, blocks %d, seqs %d, len %d)",
                      n_layers, kv_dim, n_blocks, max_seqs, max_len);
    if (!kv_dtype_ok(dtype))
        return zs_err(ZS_EINVAL, "kv cache: element type %s (f32, f16 or bf16)", zs_dtype_name(dtype));
    zs_kvcache *kv = calloc(1, sizeof *kv);
    if (!kv) return zs_err(ZS_ENOMEM, "kv cache: out of memory");
    kv->n_layers = n_layers;
    kv->kv_dim = kv_dim;
    kv->n_blocks = n_blocks;
    kv->max_seqs = max_seqs;
    kv->max_len = max_len;
    kv->dtype = dtype;
    kv->esize = zs_dtype_size(dtype);
    kv->max_bps = (max_len + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    kv->pool = calloc((size_t)n_layers, sizeof(char *));
    kv->free_list = malloc((size_t)n_blocks * sizeof(int));
    kv->seqs = calloc((size_t)max_seqs, sizeof(kv_seq));
    int ok = kv->pool && kv->free_list && kv->seqs;
    size_t per_layer = (size_t)n_blocks * 2 * ZS_KV_BLOCK * (size_t)kv_dim * kv->esize;
    for (int l = 0; ok && host_data && l < n_layers; l++) {
        kv->pool[l] = zs_aligned_alloc(64, per_layer);
        ok = kv->pool[l] != NULL;
    }
    for (int s = 0; ok && s < max_seqs; s++) {
        kv->seqs[s].blocks = malloc((size_t)kv->max_bps * sizeof(int));
        ok = kv->seqs[s].blocks != NULL;
    }
    if (!ok) {
        zs_kv_free(kv);
        return zs_err(ZS_ENOMEM, "kv cache: cannot allocate %d blocks (%zu MiB of %s)", n_blocks,
                      per_layer * (size_t)n_layers >> 20, zs_dtype_name(dtype));
    }
    for (int i = 0; i < n_blocks; i++) kv->free_list[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    *out = kv;
    return 0;
}

void zs_kv_free(zs_kvcache *kv) {
    if (!kv) return;
    if (kv->pool)
        for (int l = 0; l < kv->n_layers; l++) free(kv->pool[l]);
    if (kv->seqs)
        for (int s = 0; s < kv->max_seqs; s++) {
            free(kv->seqs[s].blocks);
            free(kv->seqs[s].phys);
        }
    free(kv->pool);
    free(kv->free_list);
    free(kv->seqs);
    free(kv->ref);
    free(kv->bhash);
    free(kv->hashed);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv->table);
    free(kv->lent);
    free(kv->group_used);
    free(kv->gfree);
    free(kv->sfree);
    free(kv->sused);
    free(kv->sdirty);
    free(kv->sgen);
    free(kv->dirty);
    free(kv);
}

/* ---------- prefix cache ---------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t zs_kv_prefix_hash(uint64_t parent, uint64_t salt, const int32_t *tok) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL) ^ mix64(salt + 0x632be59bd9b4e019ULL);
    for (int i = 0; i < ZS_KV_BLOCK; i++) h = mix64(h ^ ((uint64_t)(uint32_t)tok[i] + ((uint64_t)i << 32)));
    return h ? h : 1;
}

int zs_kv_prefix_enable(zs_kvcache *kv) {
    if (kv->prefix) return 0;
    if (kv->ring) return zs_err(ZS_EINVAL, "kv cache: no prefix caching with a sliding-window ring");
    int cap = 16;
    while (cap < 2 * kv->n_blocks) cap <<= 1;
    size_t n = (size_t)kv->n_blocks;
    kv->ref = calloc(n, sizeof(int));
    kv->bhash = calloc(n, sizeof(uint64_t));
    kv->hashed = calloc(n, 1);
    kv->lru_prev = malloc(n * sizeof(int));
    kv->lru_next = malloc(n * sizeof(int));
    kv->table = malloc((size_t)cap * sizeof(int));
    if (!kv->ref || !kv->bhash || !kv->hashed || !kv->lru_prev || !kv->lru_next || !kv->table)
        return zs_err(ZS_ENOMEM, "kv cache: out of memory for the prefix cache");
    for (int i = 0; i < cap; i++) kv->table[i] = -1;
    kv->table_cap = cap;
    kv->lru_head = kv->lru_tail = -1;
    /* blocks held by open sequences (none, normally) count as referenced */
    for (int q = 0; q < kv->max_seqs; q++)
        for (int j = 0; kv->seqs[q].open && j < kv->seqs[q].n_blocks; j++)
            if (kv->seqs[q].blocks[j] < kv->n_blocks) kv->ref[kv->seqs[q].blocks[j]]++;
    kv->prefix = 1;
    return 0;
}

static int table_find(const zs_kvcache *kv, uint64_t h) {
    int mask = kv->table_cap - 1;
    for (int i = (int)(h & (uint64_t)mask), probes = 0; probes < kv->table_cap; i = (i + 1) & mask, probes++) {
        int b = kv->table[i];
        if (b == -1) return -1;
        if (b >= 0 && kv->bhash[b] == h) return b;
    }
    return -1;
}

static void table_insert(zs_kvcache *kv, int b) {
    int mask = kv->table_cap - 1;
    int i = (int)(kv->bhash[b] & (uint64_t)mask);
    while (kv->table[i] >= 0) i = (i + 1) & mask;
    kv->table[i] = b;
}

static void table_remove(zs_kvcache *kv, int b) {
    int mask = kv->table_cap - 1;
    for (int i = (int)(kv->bhash[b] & (uint64_t)mask), probes = 0; probes < kv->table_cap; i = (i + 1) & mask, probes++) {
        if (kv->table[i] == -1) return;
        if (kv->table[i] == b) {
            kv->table[i] = -2;
            return;
        }
    }
}

static void lru_unlink(zs_kvcache *kv, int b) {
    int p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->n_lru--;
}

static void lru_push(zs_kvcache *kv, int b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_lru++;
}

/* A block for a sequence: a free one, else the least recently used cached one (forgotten). */
static int block_take(zs_kvcache *kv) {
    int b;
    if (kv->n_free > 0) {
        b = kv->free_list[--kv->n_free];
    } else {
        b = kv->lru_head;
        if (kv->on_evict) kv->on_evict(kv->evict_ud, b, kv->bhash[b]);
        lru_unlink(kv, b);
        table_remove(kv, b);
        kv->hashed[b] = 0;
        kv->evictions++;
    }
    if (kv->prefix) kv->ref[b] = 1;
    return b;
}

static void stage_release(zs_kvcache *kv, int sb);
static int stage_take(zs_kvcache *kv);

/* A sequence lets go of block b: free it, or keep it cached while its content is addressed. */
static void block_release(zs_kvcache *kv, int b) {
    if (b >= kv->n_blocks) {
        stage_release(kv, b - kv->n_blocks);
        return;
    }
    if (kv->prefix) {
        if (--kv->ref[b] > 0) return;
        if (kv->hashed[b]) {
            lru_push(kv, b);
            return;
        }
    }
    kv->free_list[kv->n_free++] = b;
}

int zs_kv_prefix_lookup(const zs_kvcache *kv, const uint64_t *hashes, int n) {
    if (!kv->prefix) return 0;
    int k = 0;
    while (k < n && table_find(kv, hashes[k]) >= 0) k++;
    return k;
}

int zs_kv_seq_share(zs_kvcache *kv, int seq, const uint64_t *hashes, int n) {
    kv_seq *s = &kv->seqs[seq];
    if (!kv->prefix || s->len != 0 || s->n_blocks != 0) return 0;
    n = ZS_MIN(n, kv->max_bps);
    int k = 0;
    for (; k < n; k++) {
        int b = table_find(kv, hashes[k]);
        if (b < 0) break;
        if (kv->ref[b]++ == 0) lru_unlink(kv, b);
        s->blocks[s->n_blocks++] = b;
    }
    s->len = k * ZS_KV_BLOCK;
    return k;
}

void zs_kv_seq_publish(zs_kvcache *kv, int seq, int j, uint64_t hash) {
    kv_seq *s = &kv->seqs[seq];
    if (!kv->prefix || j < 0 || j >= s->n_blocks || (j + 1) * ZS_KV_BLOCK > s->len) return;
    int b = s->blocks[j];
    if (b >= kv->n_blocks || kv->hashed[b] || table_find(kv, hash) >= 0) return;
    kv->bhash[b] = hash;
    kv->hashed[b] = 1;
    table_insert(kv, b);
}

int zs_kv_cached_blocks(const zs_kvcache *kv) { return kv->prefix ? kv->n_lru : 0; }
uint64_t zs_kv_evictions(const zs_kvcache *kv) { return kv->evictions; }

int zs_kv_seq_open(zs_kvcache *kv, int *seq) {
    for (int s = 0; s < kv->max_seqs; s++)
        if (!kv->seqs[s].open) {
            kv->seqs[s].open = 1;
            kv->seqs[s].len = 0;
            kv->seqs[s].n_blocks = 0;
            kv->seqs[s].n_phys = 0;
            kv->seqs[s].streamed = 0;
            *seq = s;
            return 0;
        }
    return zs_err(ZS_EBUSY, "kv cache: all %d sequence slots are in use", kv->max_seqs);
}

void zs_kv_seq_truncate(zs_kvcache *kv, int seq, int len) {
    kv_seq *s = &kv->seqs[seq];
    if (len < 0) len = 0;
    if (len > s->len) return;
    int keep = (len + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    if (kv->ring) { /* ring blocks are shared by table indices: only an empty sequence gives them back */
        if (keep == 0)
            while (s->n_phys > 0) kv->free_list[kv->n_free++] = s->phys[--s->n_phys];
        s->n_blocks = keep;
    } else {
        while (s->n_blocks > keep) block_release(kv, s->blocks[--s->n_blocks]);
    }
    s->len = len;
}

int zs_kv_set_window(zs_kvcache *kv, int window, int max_chunk) {
    if (window <= 0 || max_chunk <= 0)
        return zs_err(ZS_EINVAL, "kv cache: window %d and chunk %d must be positive", window, max_chunk);
    for (int s = 0; s < kv->max_seqs; s++)
        if (kv->seqs[s].open) return zs_err(ZS_EBUSY, "kv cache: the window is set before any sequence opens");
    /* a chunk of max_chunk tokens at p0 reads positions p0 - window + 1 .. p0 + max_chunk - 1: that many
     * consecutive positions touch at most ceil(span / block) + 1 blocks, which must be distinct */
    long span = (long)window + max_chunk - 1, ring = (span + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK + 1;
    if (ring >= kv->max_bps) return 0; /* no saving: every index keeps its own block */
    for (int s = 0; s < kv->max_seqs; s++) {
        int *p = realloc(kv->seqs[s].phys, (size_t)ring * sizeof(int));
        if (!p) return zs_err(ZS_ENOMEM, "kv cache: out of memory");
        kv->seqs[s].phys = p;
    }
    kv->window = window;
    kv->ring = (int)ring;
    return 0;
}

int zs_kv_ring(const zs_kvcache *kv) { return kv->ring; }

int zs_kv_span_ok(const zs_kvcache *kv, int p0, int p1) {
    if (!kv->ring) return 1;
    int a = p0 - kv->window + 1;
    if (a < 0) a = 0;
    return p1 / ZS_KV_BLOCK - a / ZS_KV_BLOCK + 1 <= kv->ring;
}

void zs_kv_seq_close(zs_kvcache *kv, int seq) {
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].open) return;
    zs_kv_seq_truncate(kv, seq, 0);
    kv->seqs[seq].open = 0;
}

int zs_kv_seq_len(const zs_kvcache *kv, int seq) { return kv->seqs[seq].len; }

int zs_kv_seq_reserve(zs_kvcache *kv, int seq, int new_len) {
    kv_seq *s = &kv->seqs[seq];
    if (new_len > kv->max_len)
        return zs_err(ZS_ERANGE, "sequence length %d exceeds the context length %d", new_len,
                      kv->max_len);
    int nb = (new_len + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    if (kv->ring) { /* a window: at most ring blocks, index j in phys[j % ring] */
        int need = ZS_MIN(nb, kv->ring) - s->n_phys;
        if (need > kv->n_free)
            return zs_err(ZS_ENOSPC, "kv cache full: need %d more blocks, %d free", need, kv->n_free);
        for (int i = 0; i < need; i++) s->phys[s->n_phys++] = kv->free_list[--kv->n_free];
        for (; s->n_blocks < nb; s->n_blocks++) s->blocks[s->n_blocks] = s->phys[s->n_blocks % kv->ring];
        if (new_len > s->len) s->len = new_len;
        return 0;
    }
    int need = nb - s->n_blocks;
    /* a streamed sequence grows in memory while there is room (its tail block is written every
     * step; the stream moves it once full), else in stage blocks */
    if (s->streamed && need > kv->n_free + (kv->prefix ? kv->n_lru : 0)) {
        int avail = zs_kv_stage_avail(kv);
        if (need > avail)
            return zs_err(ZS_ENOSPC, "kv cache full: need %d more stage blocks, room for %d", need, avail);
        for (int i = 0; i < need; i++) s->blocks[s->n_blocks++] = kv->n_blocks + stage_take(kv);
        if (new_len > s->len) s->len = new_len;
        return 0;
    }
    int avail = kv->n_free + (kv->prefix ? kv->n_lru : 0);
    if (need > avail)
        return zs_err(ZS_ENOSPC, "kv cache full: need %d more blocks, %d free", need, avail);
    for (int i = 0; i < need; i++) s->blocks[s->n_blocks++] = block_take(kv);
    if (new_len > s->len) s->len = new_len;
    return 0;
}

/* Layer layer's K and V of block blk: a pool's, or a stage block's buffer for layer's parity. */
static inline char *blk_at(zs_kvcache *kv, int layer, int blk) {
    size_t lb = zs_kv_block_layer_bytes(kv);
    if (blk < kv->n_blocks) return kv->pool[layer] + (size_t)blk * lb;
    int sb = blk - kv->n_blocks, k = sb % kv->per;
    return kv->pool[2 * k + (layer & 1)] + (size_t)kv->lent[sb / kv->per] * lb;
}

static inline void *kv_at(zs_kvcache *kv, int layer, int seq, int pos, int which) {
    if (!kv->pool[layer]) return NULL; /* tables only (zs_kv_init_ex, host_data = 0) */
    const kv_seq *s = &kv->seqs[seq];
    int blk = s->blocks[pos / ZS_KV_BLOCK];
    size_t off = ((size_t)which * ZS_KV_BLOCK + (size_t)(pos % ZS_KV_BLOCK)) * (size_t)kv->kv_dim;
    return blk_at(kv, layer, blk) + off * kv->esize;
}

/* a write to a stage block: its buffer goes to the tier after the layer (zs_kv_stage_dirty) */
static inline void mark_dirty(zs_kvcache *kv, int seq, int pos) {
    int blk = kv->seqs[seq].blocks[pos / ZS_KV_BLOCK];
    if (blk < kv->n_blocks) return;
    int sb = blk - kv->n_blocks;
    if (!kv->sdirty[sb]) {
        kv->sdirty[sb] = 1;
        kv->dirty[kv->n_dirty++] = sb;
    }
}

void *zs_kv_k(zs_kvcache *kv, int layer, int seq, int pos) { return kv_at(kv, layer, seq, pos, 0); }
void *zs_kv_v(zs_kvcache *kv, int layer, int seq, int pos) { return kv_at(kv, layer, seq, pos, 1); }

static void kv_store(void *dst, zs_dtype dt, const float *src, int n) {
    if (dt == ZS_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = dst;
    if (dt == ZS_F16)
        for (int i = 0; i < n; i++) d[i] = zs_f32_to_f16(src[i]);
    else
        for (int i = 0; i < n; i++) d[i] = zs_f32_to_bf16(src[i]);
}

void zs_kv_write(zs_kvcache *kv, int layer, int seq, int pos, const float *k, const float *v) {
    if (!kv->pool[layer]) return;
    kv_store(kv_at(kv, layer, seq, pos, 0), kv->dtype, k, kv->kv_dim);
    kv_store(kv_at(kv, layer, seq, pos, 1), kv->dtype, v, kv->kv_dim);
    if (kv->per) mark_dirty(kv, seq, pos);
}

void zs_kv_copy(zs_kvcache *kv, int layer, int seq, int from, int to) {
    if (!kv->pool[layer] || from == to) return;
    size_t n = (size_t)kv->kv_dim * kv->esize;
    memcpy(kv_at(kv, layer, seq, to, 0), kv_at(kv, layer, seq, from, 0), n);
    memcpy(kv_at(kv, layer, seq, to, 1), kv_at(kv, layer, seq, from, 1), n);
    if (kv->per) mark_dirty(kv, seq, to);
}

zs_dtype zs_kv_dtype(const zs_kvcache *kv) { return kv->dtype; }

const int *zs_kv_seq_blocks(const zs_kvcache *kv, int seq) { return kv->seqs[seq].blocks; }
int zs_kv_max_seqs(const zs_kvcache *kv) { return kv->max_seqs; }

int zs_kv_used_blocks(const zs_kvcache *kv) { return kv->n_blocks - kv->n_free - zs_kv_cached_blocks(kv); }
int zs_kv_total_blocks(const zs_kvcache *kv) { return kv->n_blocks; }
int zs_kv_max_len(const zs_kvcache *kv) { return kv->max_len; }

int zs_kv_seq_units(const zs_kvcache *kv, int seq, const int **units) {
    const kv_seq *s = &kv->seqs[seq];
    *units = kv->ring ? s->phys : s->blocks;
    return kv->ring ? s->n_phys : s->n_blocks;
}

void *zs_kv_block_data(zs_kvcache *kv, int layer, int b) {
    if (!kv->pool[layer] || b < 0 || b >= kv->n_blocks) return NULL;
    return kv->pool[layer] + (size_t)b * zs_kv_block_layer_bytes(kv);
}

size_t zs_kv_block_layer_bytes(const zs_kvcache *kv) { return 2 * ZS_KV_BLOCK * (size_t)kv->kv_dim * kv->esize; }
int zs_kv_layers(const zs_kvcache *kv) { return kv->n_layers; }
int zs_kv_avail_blocks(const zs_kvcache *kv) { return kv->n_free + (kv->prefix ? kv->n_lru : 0); }

void zs_kv_set_evict_hook(zs_kvcache *kv, zs_kv_evict_fn fn, void *ud) {
    kv->on_evict = fn;
    kv->evict_ud = ud;
}

/* ---------- stage blocks (layer-streamed sequences, kvstream.h) ---------- */

int zs_kv_stage_enable(zs_kvcache *kv) {
    if (kv->per) return 0;
    if (!kv->pool[0]) return zs_err(ZS_EUNSUPPORTED, "kv cache: no host memory to stage blocks in (device KV)");
    if (kv->ring) return zs_err(ZS_EUNSUPPORTED, "kv cache: no layer streaming with a sliding-window ring");
    if (kv->n_layers < 2) return zs_err(ZS_EUNSUPPORTED, "kv cache: layer streaming needs two layers or more");
    int per = kv->n_layers / 2;
    size_t nb = (size_t)kv->n_blocks, ns = nb * (size_t)per;
    if (ns > (size_t)1 << 28) return zs_err(ZS_EINVAL, "kv cache: too many stage blocks (%zu)", ns);
    kv->lent = malloc(nb * sizeof(int));
    kv->group_used = calloc(nb, sizeof(int));
    kv->gfree = malloc(nb * sizeof(int));
    kv->sfree = malloc(ns * sizeof(int));
    kv->sused = calloc(ns, 1);
    kv->sdirty = calloc(ns, 1);
    kv->dirty = malloc(ns * sizeof(int));
    kv->sgen = calloc(ns, sizeof(unsigned));
    if (!kv->sgen || !kv->lent || !kv->group_used || !kv->gfree || !kv->sfree || !kv->sused || !kv->sdirty || !kv->dirty)
        return zs_err(ZS_ENOMEM, "kv cache: out of memory for stage blocks");
    for (size_t g = 0; g < nb; g++) {
        kv->lent[g] = -1;
        kv->gfree[g] = (int)(nb - 1 - g);
    }
    kv->n_gfree = (int)nb;
    kv->n_groups = (int)nb;
    kv->per = per;
    return 0;
}

int zs_kv_stage_per_block(const zs_kvcache *kv) { return kv->per; }

int zs_kv_stage_avail(const zs_kvcache *kv) {
    if (!kv->per) return 0;
    return kv->n_sfree + zs_kv_avail_blocks(kv) * kv->per;
}

static int stage_take(zs_kvcache *kv) {
    if (kv->n_sfree == 0) { /* lend a memory block: per stage blocks */
        int g = kv->gfree[--kv->n_gfree], b = block_take(kv);
        if (kv->prefix) kv->ref[b] = 1; /* held by the stage */
        kv->lent[g] = b;
        for (int k = kv->per - 1; k >= 0; k--) kv->sfree[kv->n_sfree++] = g * kv->per + k;
    }
    int sb = kv->sfree[--kv->n_sfree];
    kv->sused[sb] = 1;
    kv->sgen[sb]++;
    kv->group_used[sb / kv->per]++;
    kv->stage_used++;
    return sb;
}

static void stage_release(zs_kvcache *kv, int sb) {
    int g = sb / kv->per;
    kv->sused[sb] = 0;
    kv->sfree[kv->n_sfree++] = sb;
    kv->stage_used--;
    if (--kv->group_used[g] > 0) return;
    /* the group is empty: its memory block goes back (its stage blocks leave the free list) */
    int w = 0;
    for (int i = 0; i < kv->n_sfree; i++)
        if (kv->sfree[i] / kv->per != g) kv->sfree[w++] = kv->sfree[i];
    kv->n_sfree = w;
    int b = kv->lent[g];
    kv->lent[g] = -1;
    kv->gfree[kv->n_gfree++] = g;
    block_release(kv, b);
}

int zs_kv_stage_used(const zs_kvcache *kv) { return kv->stage_used; }
int zs_kv_stage_blocks(const zs_kvcache *kv) { return kv->n_groups * kv->per; }
unsigned zs_kv_stage_gen(const zs_kvcache *kv, int sb) { return kv->sgen[sb]; }

void zs_kv_seq_set_streamed(zs_kvcache *kv, int seq) {
    if (kv->per) kv->seqs[seq].streamed = 1;
}

int zs_kv_seq_streamed(const zs_kvcache *kv, int seq) { return kv->seqs[seq].streamed; }

int zs_kv_block_movable(const zs_kvcache *kv, int b) {
    if (b < 0 || b >= kv->n_blocks) return 0;
    return !kv->prefix || (kv->ref[b] <= 1 && !kv->hashed[b]);
}

int zs_kv_seq_to_stage(zs_kvcache *kv, int seq, int j) {
    kv_seq *s = &kv->seqs[seq];
    if (!kv->per || j < 0 || j >= s->n_blocks || !zs_kv_block_movable(kv, s->blocks[j]))
        return zs_err(ZS_EINVAL, "kv cache: block %d of sequence %d cannot move to the stage", j, seq);
    block_release(kv, s->blocks[j]); /* first: it may be the memory the stage block is lent */
    s->blocks[j] = kv->n_blocks + stage_take(kv);
    return s->blocks[j];
}

int zs_kv_seq_stage_keep(zs_kvcache *kv, int seq, int j, int *old) {
    kv_seq *s = &kv->seqs[seq];
    if (!kv->per || j < 0 || j >= s->n_blocks || !zs_kv_block_movable(kv, s->blocks[j]) ||
        (kv->n_sfree == 0 && kv->n_free + (kv->prefix ? kv->n_lru : 0) == 0))
        return -1;
    *old = s->blocks[j];
    s->blocks[j] = kv->n_blocks + stage_take(kv);
    return s->blocks[j];
}

void zs_kv_seq_stage_undo(zs_kvcache *kv, int seq, int j, int old) {
    kv_seq *s = &kv->seqs[seq];
    block_release(kv, s->blocks[j]);
    s->blocks[j] = old;
}

void zs_kv_block_let_go(zs_kvcache *kv, int b) { block_release(kv, b); }

int zs_kv_seq_from_stage(zs_kvcache *kv, int seq, int j, int streamed) {
    kv_seq *s = &kv->seqs[seq];
    block_release(kv, s->blocks[j]); /* gives back a lent memory block when it was the group's last */
    s->blocks[j] = block_take(kv);
    s->streamed = streamed;
    return s->blocks[j];
}

void *zs_kv_stage_data(zs_kvcache *kv, int layer, int sb) {
    if (!kv->per || sb < 0 || sb >= kv->n_groups * kv->per || kv->lent[sb / kv->per] < 0) return NULL;
    return blk_at(kv, layer, kv->n_blocks + sb);
}

int zs_kv_stage_dirty(const zs_kvcache *kv, const int **sb) {
    *sb = kv->dirty;
    return kv->n_dirty;
}

void zs_kv_stage_dirty_clear(zs_kvcache *kv) {
    for (int i = 0; i < kv->n_dirty; i++) kv->sdirty[kv->dirty[i]] = 0;
    kv->n_dirty = 0;
}

void zs_kv_set_layer_hook(zs_kvcache *kv, zs_kv_layer_fn fn, void *ud) {
    kv->on_layer = fn;
    kv->layer_ud = ud;
}

int zs_kv_layer(zs_kvcache *kv, int layer, int end, const int32_t *seqs, int n) {
    if (!kv->on_layer || !kv->stage_used) return 0;
    return kv->on_layer(kv->layer_ud, layer, end, seqs, n);
}

/* kvstream.c — layer-streamed KV sequences (kvstream.h): a record per stage block and layer in
 * one of NT tiers, NT I/O threads that each run the same FIFO of per-layer loads and write-behinds
 * into the cache's stage buffers (thread k the records of tier k: small O_DIRECT reads one at a
 * time reach a fraction of what the disk does with several in flight), and the cache's layer hook
 * that queues them and waits for the loads. */
#include "kvstream.h"

#include <pthread.h>
#include <string.h>
#include <sys/uio.h>

#include "common.h"
#include "kvtier.h"

enum { OP_LOAD, OP_STORE, OP_SAVE };

typedef struct {
    int kind, layer, n;
    const int *sb;   /* stage blocks; OP_SAVE: pairs (sb, the memory block to save every layer of) */
} op;

#define QCAP 8 /* at most: two loads and two stores of a step are ever pending */
#define NT 8   /* tiers and I/O threads */
/* every record of stage block sb is in tier sb % NT, so one thread does all its I/O in order: a
 * load of layer l + 2 never overtakes the write-behind of layer l from the same buffer */

struct zs_kvstream {
    zs_kvcache *kv;
    zs_kvtier *t[NT];
    int L, nsb;
    size_t lb;               /* bytes of a block-layer record */
    int *rec;                /* [nsb * L] the tier slot of (sb, layer), -1: none */
    char *tmp;               /* [L * lb] a block on its way from memory to the stage (convert) */
    int *save, *save_j, *save_seq, n_save; /* settle: (sb, memory block) pairs, and their (seq, j) */
    unsigned *gen;           /* [nsb * L] the stage generation each record belongs to */
    unsigned char *bad;      /* [nsb] a write failed (the sequence holding it is lost) */
    unsigned *bad_gen;       /* [nsb] the stage generation it failed in (a later use is not lost) */
    int *load, n_load;       /* this step's streamed blocks of the batch */
    int *store[2];           /* [nsb] the blocks a layer of each parity wrote */
    unsigned char *seen;     /* [max_seqs] scratch */
    int broken;
    /* the queue: every thread runs every op, its own part of it */
    pthread_t th[NT];
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    op q[QCAP];
    uint64_t queued;         /* tickets: op i is q[(i - 1) % QCAP] */
    uint64_t pos[NT];        /* ops thread k has finished */
    uint64_t load_ticket[2]; /* the ticket of the pending load of each parity */
    int err;                 /* a load failed: its code and message, for the engine thread */
    char errmsg[256];
    zs_kvstream_stats st;
};

typedef struct {
    zs_kvstream *st;
    int k;
} io_arg;

/* a failed write: sb's sequence lost it (or, saving, keeps it in memory) and streaming stops */
static void write_failed(zs_kvstream *st, int sb) {
    pthread_mutex_lock(&st->mu);
    if (!st->broken) zs_log_warn("KV streaming: %s; the sequences that lost a block are recomputed, and no more "
                                 "are streamed (serving goes on from memory)", zs_errmsg());
    st->broken = 1;
    st->bad[sb] = 1;
    st->bad_gen[sb] = zs_kv_stage_gen(st->kv, sb);
    st->st.write_errors++;
    pthread_mutex_unlock(&st->mu);
}

/* src (a block-layer) to a new record of (sb, layer) in tier k, replacing the one there; the
 * caller reports a failure */
static int put_rec(zs_kvstream *st, int k, int sb, int layer, void *src) {
    size_t at = (size_t)sb * (size_t)st->L + (size_t)layer;
    struct iovec iov = {src, st->lb};
    int slot;
    ZS_CHECK(zs_kvtier_put(st->t[k], &iov, 1, (uint64_t)sb + 1, &slot));
    if (st->rec[at] >= 0) zs_kvtier_drop(st->t[k], st->rec[at]);
    st->rec[at] = slot;
    st->gen[at] = zs_kv_stage_gen(st->kv, sb);
    pthread_mutex_lock(&st->mu);
    st->st.stores++;
    st->st.bytes_out += st->lb;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

/* every layer of memory block b to new records of sb, in tier k */
static void save_block(zs_kvstream *st, int sb, int b, int k) {
    for (int l = 0; l < st->L; l++)
        if (put_rec(st, k, sb, l, zs_kv_block_data(st->kv, l, b)) < 0) {
            write_failed(st, sb);
            return;
        }
}

/* thread k's part of o: the blocks sb % NT == k */
static void run_op(zs_kvstream *st, const op *o, int k) {
    if (o->kind == OP_SAVE) {
        for (int i = 0; i < o->n; i++)
            if (o->sb[2 * i] % NT == k) save_block(st, o->sb[2 * i], o->sb[2 * i + 1], k);
        return;
    }
    for (int i = 0; i < o->n; i++) {
        int sb = o->sb[i];
        if (sb % NT != k) continue;
        size_t at = (size_t)sb * (size_t)st->L + (size_t)o->layer;
        int *r = &st->rec[at];
        unsigned g = zs_kv_stage_gen(st->kv, sb);
        struct iovec iov = {zs_kv_stage_data(st->kv, o->layer, sb), st->lb};
        if (o->kind == OP_LOAD) {
            if (*r < 0 || st->gen[at] != g) continue; /* never written in this use of the block */
            int rc = zs_kvtier_get(st->t[k], *r, &iov, 1);
            pthread_mutex_lock(&st->mu);
            if (rc < 0 && !st->err) {
                st->err = rc;
                snprintf(st->errmsg, sizeof st->errmsg, "%s", zs_errmsg());
            }
            if (rc == 0) {
                st->st.loads++;
                st->st.bytes_in += st->lb;
            }
            pthread_mutex_unlock(&st->mu);
            continue;
        }
        if (put_rec(st, k, sb, o->layer, iov.iov_base) < 0) write_failed(st, sb);
    }
}

static void *io_main(void *arg) {
    zs_kvstream *st = ((io_arg *)arg)->st;
    int k = ((io_arg *)arg)->k;
    free(arg);
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!st->stop && st->queued == st->pos[k]) pthread_cond_wait(&st->cv, &st->mu);
        if (st->queued == st->pos[k]) break; /* stop, and nothing left */
        op o = st->q[st->pos[k] % QCAP];
        pthread_mutex_unlock(&st->mu);
        run_op(st, &o, k);
        pthread_mutex_lock(&st->mu);
        st->pos[k]++;
        pthread_cond_broadcast(&st->done_cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static uint64_t done_all(const zs_kvstream *st) {
    uint64_t d = st->pos[0];
    for (int k = 1; k < NT; k++) d = ZS_MIN(d, st->pos[k]);
    return d;
}

static uint64_t enqueue(zs_kvstream *st, int kind, int layer, const int *sb, int n) {
    pthread_mutex_lock(&st->mu);
    ZS_ASSERT(st->queued - done_all(st) < QCAP);
    st->q[st->queued % QCAP] = (op){kind, layer, n, sb};
    uint64_t t = ++st->queued;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    return t;
}

/* Waits until ticket t is done; returns a load's error (once). */
static int wait_for(zs_kvstream *st, uint64_t t) {
    double t0 = zs_now();
    pthread_mutex_lock(&st->mu);
    while (done_all(st) < t) pthread_cond_wait(&st->done_cv, &st->mu);
    int rc = st->err;
    char msg[256];
    if (rc) snprintf(msg, sizeof msg, "%s", st->errmsg);
    st->err = 0;
    st->st.wait_s += zs_now() - t0;
    pthread_mutex_unlock(&st->mu);
    return rc ? zs_err(rc, "KV streaming: %s", msg) : 0;
}

static int drain(zs_kvstream *st) {
    pthread_mutex_lock(&st->mu);
    uint64_t t = st->queued;
    pthread_mutex_unlock(&st->mu);
    return wait_for(st, t);
}

/* The batch's streamed stage blocks, each once. */
static void load_set(zs_kvstream *st, const int32_t *seqs, int n) {
    zs_kvcache *kv = st->kv;
    int nb = zs_kv_total_blocks(kv);
    st->n_load = 0;
    for (int i = 0; i < n; i++) {
        int s = seqs[i];
        if (st->seen[s] || !zs_kv_seq_streamed(kv, s)) continue;
        st->seen[s] = 1;
        const int *b = zs_kv_seq_blocks(kv, s);
        int k = (zs_kv_seq_len(kv, s) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
        for (int j = 0; j < k; j++)
            if (b[j] >= nb) st->load[st->n_load++] = b[j] - nb;
    }
    for (int i = 0; i < n; i++) st->seen[seqs[i]] = 0;
}

static int on_layer(void *ud, int l, int end, const int32_t *seqs, int n) {
    zs_kvstream *st = ud;
    if (!end) {
        if (l == 0) {
            ZS_CHECK(drain(st)); /* a forward that failed half way left ops behind */
            zs_kv_stage_dirty_clear(st->kv);
            load_set(st, seqs, n);
            st->load_ticket[0] = enqueue(st, OP_LOAD, 0, st->load, st->n_load);
            st->load_ticket[1] = enqueue(st, OP_LOAD, 1, st->load, st->n_load);
        }
        return wait_for(st, st->load_ticket[l & 1]);
    }
    const int *d;
    int nd = zs_kv_stage_dirty(st->kv, &d);
    if (nd > 0) {
        memcpy(st->store[l & 1], d, (size_t)nd * sizeof *d);
        enqueue(st, OP_STORE, l, st->store[l & 1], nd);
    }
    zs_kv_stage_dirty_clear(st->kv);
    if (l + 2 < st->L) st->load_ticket[l & 1] = enqueue(st, OP_LOAD, l + 2, st->load, st->n_load);
    if (l == st->L - 1) return drain(st); /* between steps the cache is the engine thread's alone */
    return 0;
}

int zs_kvstream_open(zs_kvcache *kv, int kind, const char *dir, zs_kvstream **out) {
    ZS_CHECK(zs_kv_stage_enable(kv));
    zs_kvstream *st = calloc(1, sizeof *st);
    if (!st) return zs_err(ZS_ENOMEM, "out of memory");
    st->kv = kv;
    st->L = zs_kv_layers(kv);
    st->nsb = zs_kv_stage_blocks(kv);
    st->lb = zs_kv_block_layer_bytes(kv);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    pthread_cond_init(&st->done_cv, NULL);
    size_t ns = (size_t)st->nsb;
    st->rec = malloc(ns * (size_t)st->L * sizeof(int));
    st->gen = calloc(ns * (size_t)st->L, sizeof(unsigned));
    st->bad = calloc(ns, 1);
    st->bad_gen = calloc(ns, sizeof(unsigned));
    st->load = malloc(ns * sizeof(int));
    st->store[0] = malloc(ns * sizeof(int));
    st->store[1] = malloc(ns * sizeof(int));
    st->seen = calloc((size_t)zs_kv_max_seqs(kv), 1);
    st->tmp = malloc((size_t)st->L * st->lb);
    st->save = malloc(ns * 2 * sizeof(int));
    st->save_j = malloc(ns * sizeof(int));
    st->save_seq = malloc(ns * sizeof(int));
    int rc = 0;
    if (!st->bad_gen || !st->save || !st->save_j || !st->save_seq || !st->tmp || !st->rec || !st->gen || !st->bad || !st->load || !st->store[0] || !st->store[1] || !st->seen)
        rc = zs_err(ZS_ENOMEM, "KV streaming: out of memory for %zu stage blocks", ns);
    if (rc == 0) {
        for (size_t i = 0; i < ns * (size_t)st->L; i++) st->rec[i] = -1;
        for (int k = 0; k < NT && rc == 0; k++) rc = zs_kvtier_open(kind, dir, st->lb, &st->t[k]);
    }
    for (int k = 0; k < NT && rc == 0; k++) {
        io_arg *a = malloc(sizeof *a);
        if (a) *a = (io_arg){st, k};
        if (!a || pthread_create(&st->th[k], NULL, io_main, a) != 0) {
            free(a);
            rc = zs_err(ZS_EIO, "KV streaming: cannot start its I/O threads");
        } else {
            st->started++;
        }
    }
    if (rc < 0) {
        zs_kvstream_free(st);
        return rc;
    }
    zs_kv_set_layer_hook(kv, on_layer, st);
    *out = st;
    return 0;
}

void zs_kvstream_free(zs_kvstream *st) {
    if (!st) return;
    if (st->started) {
        pthread_mutex_lock(&st->mu);
        st->stop = 1;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        for (int k = 0; k < st->started; k++) pthread_join(st->th[k], NULL);
        zs_kv_set_layer_hook(st->kv, NULL, NULL);
    }
    for (int k = 0; k < NT; k++) zs_kvtier_free(st->t[k]);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    pthread_cond_destroy(&st->done_cv);
    free(st->rec);
    free(st->gen);
    free(st->bad);
    free(st->bad_gen);
    free(st->load);
    free(st->store[0]);
    free(st->store[1]);
    free(st->seen);
    free(st->tmp);
    free(st->save);
    free(st->save_j);
    free(st->save_seq);
    free(st);
}

int zs_kvstream_ok(const zs_kvstream *st) { return !st->broken; }

int zs_kvstream_convert(zs_kvstream *st, int seq) {
    zs_kvcache *kv = st->kv;
    if (st->broken) return zs_err(ZS_EIO, "KV streaming stopped after a write failed");
    ZS_CHECK(drain(st));
    const int *b = zs_kv_seq_blocks(kv, seq);
    int n = (zs_kv_seq_len(kv, seq) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK, L = st->L;
    int slots[L];
    /* each block: its memory goes (copied out first: the stage block may be lent that very
     * memory), a stage block takes its place, and every layer goes to the stage block's tier. A
     * full tier gives the block its memory back (taken again: the stage block is released first,
     * so the same room is there) and stops, the blocks moved so far streamed, the rest in memory */
    for (int j = 0; j < n; j++) {
        if (!zs_kv_block_movable(kv, b[j])) continue;
        for (int l = 0; l < L; l++) memcpy(st->tmp + (size_t)l * st->lb, zs_kv_block_data(kv, l, b[j]), st->lb);
        int was_streamed = zs_kv_seq_streamed(kv, seq);
        zs_kv_seq_set_streamed(kv, seq); /* before any stage block is in its table */
        int sb = zs_kv_seq_to_stage(kv, seq, j) - zs_kv_total_blocks(kv), rc = 0, l = 0;
        zs_kvtier *t = st->t[sb % NT];
        for (; l < L && rc == 0; l++) {
            struct iovec iov = {st->tmp + (size_t)l * st->lb, st->lb};
            rc = zs_kvtier_put(t, &iov, 1, (uint64_t)sb + 1, &slots[l]);
        }
        if (rc < 0) {
            for (int k = 0; k < l - 1; k++) zs_kvtier_drop(t, slots[k]);
            int mb = zs_kv_seq_from_stage(kv, seq, j, was_streamed);
            for (int k = 0; k < L; k++) memcpy(zs_kv_block_data(kv, k, mb), st->tmp + (size_t)k * st->lb, st->lb);
            return rc;
        }
        unsigned g = zs_kv_stage_gen(kv, sb);
        for (l = 0; l < L; l++) {
            size_t at = (size_t)sb * (size_t)L + (size_t)l;
            if (st->rec[at] >= 0) zs_kvtier_drop(t, st->rec[at]);
            st->rec[at] = slots[l];
            st->gen[at] = g;
        }
        st->bad[sb] = 0;
        st->st.stores += (uint64_t)L;
        st->st.bytes_out += (uint64_t)L * st->lb;
    }
    zs_kv_seq_set_streamed(kv, seq);
    st->st.converted++;
    return 0;
}

int zs_kvstream_settle(zs_kvstream *st, const int *seqs, const int *written, int n) {
    zs_kvcache *kv = st->kv;
    if (st->broken) return 0;
    ZS_CHECK(drain(st));
    /* the full blocks that are still in memory: a stage block each, their memory saved by the
     * I/O threads in parallel, then let go */
    st->n_save = 0;
    int nsb = zs_kv_stage_blocks(kv);
    for (int i = 0; i < n && st->n_save < nsb; i++) {
        int s = seqs[i];
        if (!zs_kv_seq_streamed(kv, s)) continue;
        const int *b = zs_kv_seq_blocks(kv, s);
        int full = ZS_MIN(written[i], zs_kv_seq_len(kv, s)) / ZS_KV_BLOCK;
        for (int j = 0; j < full && st->n_save < nsb; j++) {
            int old;
            if (!zs_kv_block_movable(kv, b[j])) continue;
            int id = zs_kv_seq_stage_keep(kv, s, j, &old);
            if (id < 0) break; /* no stage room: the next step tries again */
            st->save[2 * st->n_save] = id - zs_kv_total_blocks(kv);
            st->save[2 * st->n_save + 1] = old;
            st->save_j[st->n_save] = j;
            st->save_seq[st->n_save++] = s;
        }
    }
    if (st->n_save == 0) return 0;
    enqueue(st, OP_SAVE, 0, st->save, st->n_save);
    ZS_CHECK(drain(st));
    int moved = 0;
    for (int i = 0; i < st->n_save; i++) {
        int sb = st->save[2 * i], old = st->save[2 * i + 1];
        if (st->bad[sb]) { /* not written: the block stays in memory */
            zs_kv_seq_stage_undo(kv, st->save_seq[i], st->save_j[i], old);
            st->bad[sb] = 0;
            continue;
        }
        zs_kv_block_let_go(kv, old);
        moved++;
    }
    st->st.settled += (uint64_t)moved;
    return moved;
}

int zs_kvstream_seq_lost(const zs_kvstream *st, int seq) {
    if (!st->broken || !zs_kv_seq_streamed(st->kv, seq)) return 0;
    int nb = zs_kv_total_blocks(st->kv), n = (zs_kv_seq_len(st->kv, seq) + ZS_KV_BLOCK - 1) / ZS_KV_BLOCK;
    const int *b = zs_kv_seq_blocks(st->kv, seq);
    for (int j = 0; j < n; j++)
        if (b[j] >= nb && st->bad[b[j] - nb] && st->bad_gen[b[j] - nb] == zs_kv_stage_gen(st->kv, b[j] - nb)) return 1;
    return 0;
}

void zs_kvstream_stats_get(const zs_kvstream *st, zs_kvstream_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&st->mu);
    *out = st->st;
    pthread_mutex_unlock((pthread_mutex_t *)&st->mu);
}

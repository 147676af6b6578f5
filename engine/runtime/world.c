/* world.c — rank threads of one process, parameter placement into each rank's tier, and
 * lockstep execution of step plans; across processes (cluster.h), the step-plan broadcast from
 * process 0 and the followers' loop. */
#include "world.h"

#include <pthread.h>
#include <string.h>

#include "backend.h"
#include "cluster.h"
#include "common.h"
#include "device.h"
#include "store.h"

typedef struct {
    struct zs_world *w;
    int rank;
    zs_comm *comm;
    zs_gather *g;
    zs_kvcache *kv;
    zs_forward *fwd;
    zs_dev *dev;            /* CUDA device of the rank (NULL: CPU) */
    zs_gather_dev gops;     /* its gather operations */
    zs_forward_cuda *cfwd;  /* its forward pass */
    zs_comm *gcomm;         /* second group, for gradients (used by the compute threads) */
    pthread_t th;
    int started;
    /* the current step */
    const zs_batch *batch;
    float *logits;
    int rc, remote;
    char err[1024];
} rank_t;

/* step plans process 0 broadcasts to the followers of a led world */
enum { PLAN_STEP = 1, PLAN_QUIT = 2 };

struct zs_world {
    zs_model *m;
    zs_world_opts o;
    int n;         /* ranks of this process */
    int size;      /* ranks of the world */
    int first;     /* world rank of this process's rank 0 */
    int led;       /* several processes, led by process 0 */
    int quit_sent;
    int running;   /* opened completely: the prefetch threads run */
    rank_t *ranks;
    int reused;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long step;     /* generation: bumped to start a step */
    int done;      /* worker ranks finished with the current step */
    int quit;
    void (*job)(void *ud, int rank); /* a zs_world_run job instead of a forward step */
    void *job_ud;
    /* the current step's extras (zs_world_step_ex; in-process worlds) */
    const zs_world_rider *rider;
    const zs_pass_range *next;
};

int zs_world_ranks(const zs_world *w) { return w->n; }
int zs_world_size(const zs_world *w) { return w->size; }
int zs_world_first_rank(const zs_world *w) { return w->first; }
int zs_world_led(const zs_world *w) { return w->led; }
zs_kvcache *zs_world_kv(zs_world *w, int rank) { return w->ranks[rank].kv; }
int zs_world_reused_shards(const zs_world *w) { return w->reused; }

static void run_rank(rank_t *r) {
    const zs_world_rider *rd = r->w->rider;
    zs_gather_pass_begin_range(r->g, zs_gather_kind_range(r->g, ZS_PASS_INFER), r->w->next);
    int rc = 0;
    zs_weight_source src = zs_gather_source(r->g);
    if (rd) src = rd->wrap(rd->ud, r->rank, src);
    if (r->batch && r->batch->n > 0) {
        rc = r->cfwd ? zs_forward_cuda_run(r->cfwd, &src, r->kv, r->batch, r->logits)
                     : zs_forward_run(r->fwd, &src, r->kv, r->batch, r->logits);
        if (rc < 0) snprintf(r->err, sizeof r->err, "%s", zs_errmsg());
    } else if (rd) {
        rd->walk(rd->ud, r->rank, src); /* the passenger's buckets, on a rank without rows */
    }
    if (rd) rd->done(rd->ud, r->rank);
    zs_gather_pass_end(r->g);
    /* a failed gather is what failed the forward (and a rank with no work sees it only here) */
    const char *msg;
    int remote, grc = zs_gather_pass_error(r->g, &remote, &msg);
    r->rc = grc < 0 ? grc : rc;
    r->remote = grc < 0 && remote;
    if (grc < 0) snprintf(r->err, sizeof r->err, "%s", msg);
}

static void *rank_main(void *arg) {
    rank_t *r = arg;
    zs_world *w = r->w;
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->quit && w->step == seen) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) { pthread_mutex_unlock(&w->mu); break; }
        seen = w->step;
        void (*job)(void *, int) = w->job;
        void *job_ud = w->job_ud;
        pthread_mutex_unlock(&w->mu);
        if (job) job(job_ud, r->rank);
        else run_rank(r);
        pthread_mutex_lock(&w->mu);
        w->done++;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

/* Process 0 of a led world: tells the followers what comes next. */
static int send_plan(zs_world *w, int32_t plan) {
    if (!w->led || zs_cluster_follower()) return 0;
    return zs_cluster_bcast(&plan, sizeof plan, 0);
}

static int local_step(zs_world *w, const zs_batch *batches, float **logits);

int zs_world_step(zs_world *w, const zs_batch *batches, float **logits) {
    return zs_world_step_ex(w, batches, logits, NULL);
}

int zs_world_step_ex(zs_world *w, const zs_batch *batches, float **logits, const zs_world_step_opts *o) {
    /* riders and declarations are this process's: a led world's followers could not repeat them */
    if (o && (o->rider || o->next) && w->led) return zs_err(ZS_EUNSUPPORTED, "a step with a rider or a declared next pass in a led multi-process world");
    ZS_CHECK(send_plan(w, PLAN_STEP));
    w->rider = o ? o->rider : NULL;
    w->next = o ? o->next : NULL;
    int rc = local_step(w, batches, logits);
    w->rider = NULL;
    w->next = NULL;
    return rc;
}

int zs_world_follow(zs_world *w) {
    if (!w->led || !zs_cluster_follower()) return zs_err(ZS_EINVAL, "zs_world_follow: not a follower of a led world");
    for (;;) {
        int32_t plan = 0;
        ZS_CHECK(zs_cluster_bcast(&plan, sizeof plan, 0));
        if (plan == PLAN_QUIT) return 0;
        if (plan != PLAN_STEP) return zs_err(ZS_EFORMAT, "follower: unknown step plan %d from process 0", (int)plan);
        /* a failed step is reported by process 0 (its ranks saw the same gather errors) */
        if (local_step(w, NULL, NULL) < 0 && zs_cluster_lost(NULL, 0)) return zs_err(ZS_ECANCELLED, "%s", zs_errmsg());
    }
}

static int local_step(zs_world *w, const zs_batch *batches, float **logits) {
    static const zs_batch empty = {0, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL};
    for (int i = 0; i < w->n; i++) {
        w->ranks[i].batch = batches ? &batches[i] : &empty;
        w->ranks[i].logits = logits ? logits[i] : NULL;
    }
    pthread_mutex_lock(&w->mu);
    w->job = NULL;
    w->done = 0;
    w->step++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    run_rank(&w->ranks[0]);
    pthread_mutex_lock(&w->mu);
    while (w->done < w->n - 1) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    /* report the rank where the failure happened, not the ranks that failed with it */
    int first = -1;
    for (int i = 0; i < w->n; i++)
        if (w->ranks[i].rc < 0) {
            if (first < 0) first = i;
            if (!w->ranks[i].remote) return zs_err(w->ranks[i].rc, "%s", w->ranks[i].err);
        }
    return first < 0 ? 0 : zs_err(w->ranks[first].rc, "%s", w->ranks[first].err);
}

void zs_world_run(zs_world *w, void (*fn)(void *ud, int rank), void *ud) {
    pthread_mutex_lock(&w->mu);
    w->job = fn;
    w->job_ud = ud;
    w->done = 0;
    w->step++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    fn(ud, 0);
    pthread_mutex_lock(&w->mu);
    while (w->done < w->n - 1) pthread_cond_wait(&w->cv, &w->mu);
    w->job = NULL;
    pthread_mutex_unlock(&w->mu);
}

static void spec_off_job(void *ud, int rank) {
    zs_world *w = ud;
    zs_gather_set_speculation(w->ranks[rank].g, 0);
    zs_gather_settle(w->ranks[rank].g); /* the speculated pass's gathers complete before the comms go */
}

zs_model *zs_world_model(zs_world *w) { return w->m; }
zs_gather *zs_world_gather(zs_world *w, int rank) { return w->ranks[rank].g; }
zs_comm *zs_world_grad_comm(zs_world *w, int rank) { return w->ranks[rank].gcomm; }
int zs_world_replicated(const zs_world *w) { return w->o.gather.replicate; }
int zs_world_is_cuda(const zs_world *w) { return w->n > 0 && w->ranks[0].dev != NULL; }
void *zs_world_dev(zs_world *w, int rank) { return rank >= 0 && rank < w->n ? w->ranks[rank].dev : NULL; }

/* ---- placement ---- */

/* Packs bucket b once into a zero-padded full buffer (n shards long). */
static int pack_full(zs_model *m, int b, int n, char **out) {
    size_t shard = zs_partition_shard_bytes(m, b, n), full = shard * (size_t)n;
    size_t data = zs_model_layout(m, b)->data_bytes;
    char *buf = zs_aligned_alloc(4096, ZS_MAX(full, 4096));
    if (!buf) return zs_err(ZS_ENOMEM, "out of memory packing bucket %d (%zu bytes)", b, full);
    int rc = zs_model_pack_bucket(m, b, buf, NULL);
    if (rc < 0) { free(buf); return rc; }
    memset(buf + data, 0, full - data);
    *out = buf;
    return 0;
}

static int o_replicate(const zs_world *w) { return w->o.gather.replicate; }

static int place_memory(zs_world *w) {
    int nb = zs_model_n_buckets(w->m);
    for (int b = 0; b < nb; b++) {
        size_t shard = zs_partition_shard_bytes(w->m, b, w->size);
        if (!shard) continue;
        char *full;
        ZS_CHECK(pack_full(w->m, b, w->size, &full));
        int rc = 0;
        for (int r = 0; r < w->n && rc == 0; r++)
            rc = zs_gather_put_shard(w->ranks[r].g, b,
                                     o_replicate(w) ? full : full + (size_t)(w->first + r) * shard);
        free(full);
        ZS_CHECK(rc);
    }
    return 0;
}

static int place_nvme(zs_world *w) {
    const char *dir = w->o.nvme_path;
    if (!dir || !*dir) return zs_err(ZS_EINVAL, "offload nvme needs an NVMe path (--nvme-path DIR)");
    int nb = zs_model_n_buckets(w->m), rc = 0;
    size_t *sizes = calloc((size_t)nb, sizeof(size_t));
    zs_shard_file **files = calloc((size_t)w->n, sizeof *files);
    int *reused = calloc((size_t)w->n, sizeof(int));
    if (!sizes || !files || !reused) { rc = zs_err(ZS_ENOMEM, "out of memory"); goto done; }
    size_t per_rank = 0;
    for (int b = 0; b < nb; b++) per_rank += sizes[b] = zs_partition_shard_bytes(w->m, b, w->size);
    if ((rc = zs_shard_dir_check(dir, 0)) < 0) goto done;
    char fp[256];
    snprintf(fp, sizeof fp, "%s-ranks%d", zs_model_fingerprint(w->m), w->size);
    int to_write = 0;
    for (int r = 0; r < w->n && rc == 0; r++) {
        rc = zs_shard_file_open(dir, w->first + r, fp, nb, sizes, &reused[r], &files[r]);
        if (rc == 0 && !reused[r]) to_write++;
    }
    if (rc == 0 && to_write > 0) rc = zs_shard_dir_check(dir, per_rank * (size_t)to_write);
    if (rc == 0 && to_write > 0) {
        zs_log_info("writing %d shard file(s) of %.1f MB under %s", to_write, (double)per_rank / 1e6, dir);
        for (int b = 0; b < nb && rc == 0; b++) {
            if (!sizes[b]) continue;
            char *full;
            if ((rc = pack_full(w->m, b, w->size, &full)) < 0) break;
            for (int r = 0; r < w->n && rc == 0; r++)
                if (!reused[r]) rc = zs_shard_file_write(files[r], b, full + (size_t)(w->first + r) * sizes[b]);
            free(full);
        }
        for (int r = 0; r < w->n && rc == 0; r++)
            if (!reused[r]) rc = zs_shard_file_commit(files[r]);
    }
    w->reused = to_write == 0;
    for (int r = 0; r < w->n && rc == 0; r++) {
        char lb[32];
        for (int b = 0; b < nb && rc == 0; b++)
            rc = zs_shard_file_set_label(files[r], b, zs_bucket_label(w->m, b, lb, sizeof lb));
        if (rc == 0) {
            rc = zs_gather_attach_file(w->ranks[r].g, files[r]);
            files[r] = NULL; /* owned by the coordinator now */
        }
    }
done:
    for (int r = 0; files && r < w->n; r++)
        if (files[r]) zs_shard_file_close(files[r]);
    free(files);
    free(sizes);
    free(reused);
    return rc;
}

/* Several processes: every step of the start-up that can fail on one process alone ends in an
 * agreement, so that all of them fail together instead of waiting in a collective. */
static int agree_start(const zs_world *w, int rc, const char *what) {
    if (w->size == w->n) return rc;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? zs_errmsg() : "");
    int all = 0, arc = zs_cluster_min_int(rc, &all);
    if (rc < 0) return zs_err(rc, "%s", msg);
    if (arc < 0) return arc;
    if (all < 0) return zs_err(all, "another process failed while %s (see its log)", what);
    return 0;
}

/* Every process must run the same model with the same ranks, tier and layout (the fingerprint
 * holds the layout options too; the embedding lookup is compared apart for a clearer message). */
static int check_peers(const zs_world *w) {
    struct { int32_t ranks, tier, replicate, spmd, lookup; char fp[96]; } me, *all;
    memset(&me, 0, sizeof me);
    me.ranks = w->n;
    me.tier = (int32_t)w->o.gather.tier;
    me.replicate = w->o.gather.replicate;
    me.spmd = w->o.spmd;
    me.lookup = zs_model_embed_lookup(w->m);
    snprintf(me.fp, sizeof me.fp, "%s", zs_model_fingerprint(w->m));
    int P = zs_cluster_size();
    all = calloc((size_t)P, sizeof *all);
    if (!all) return zs_err(ZS_ENOMEM, "out of memory");
    int rc = zs_cluster_all_gather(&me, all, sizeof me);
    for (int p = 1; p < P && rc == 0; p++) {
        if (all[p].ranks != all[0].ranks)
            rc = zs_err(ZS_EINVAL, "process %d runs --ranks %d but process 0 runs %d: every process needs the same --ranks",
                        p, all[p].ranks, all[0].ranks);
        else if (all[p].lookup != all[0].lookup)
            rc = zs_err(ZS_EINVAL, "process %d opened the model for %s but process 0 for %s (embedding lookup tables): "
                        "every process needs the same command", p, all[p].lookup ? "inference" : "training",
                        all[0].lookup ? "inference" : "training");
        else if (strcmp(all[p].fp, all[0].fp))
            rc = zs_err(ZS_EINVAL, "process %d loaded another model than process 0 (%s vs %s): give every process the same --model",
                        p, all[p].fp, all[0].fp);
        else if (all[p].tier != all[0].tier || all[p].replicate != all[0].replicate || all[p].spmd != all[0].spmd)
            rc = zs_err(ZS_EINVAL, "process %d has another --offload, ZeRO stage or command than process 0", p);
    }
    free(all);
    return rc;
}

int zs_world_open(zs_model *m, const zs_world_opts *o, zs_world **out) {
    if (o->ranks < 1 || o->ranks > 256) return zs_err(ZS_EINVAL, "--ranks must be between 1 and 256 (got %d)", o->ranks);
    zs_world *w = calloc(1, sizeof *w);
    if (!w) return zs_err(ZS_ENOMEM, "out of memory");
    w->m = m;
    w->o = *o;
    w->n = o->ranks;
    int procs = o->local ? 1 : zs_cluster_size();
    w->size = w->n * procs;
    w->first = o->local ? 0 : w->n * zs_cluster_rank();
    w->led = procs > 1 && !o->spmd;
    w->quit_sent = 1; /* nothing to tell the followers until the world runs */
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc;
    zs_comm **comms = calloc((size_t)w->n, sizeof *comms);
    w->ranks = calloc((size_t)w->n, sizeof *w->ranks);
    if (!comms || !w->ranks) { free(comms); zs_world_free(w); return zs_err(ZS_ENOMEM, "out of memory"); }
    if (procs > 1 && (rc = check_peers(w)) < 0) {
        free(comms);
        zs_world_free(w);
        return rc;
    }
    int cuda = o->device == ZS_DEVICE_CUDA, ndev = cuda ? zs_backend_cuda_devices() : 0;
    rc = cuda && ndev <= 0 ? zs_err(ZS_EDEVICE, "device cuda: no CUDA device is visible") : 0;
    if (rc == 0 && cuda) {
        /* pinned pools created from now on (cpu tier, NVMe slots) are registered with CUDA */
        zs_dev_install_pinned_hooks();
        /* several processes on one host take consecutive devices */
        int base = o->local ? 0 : zs_cluster_node_rank() * w->n;
        for (int r = 0; r < w->n && rc == 0; r++) rc = zs_dev_open((base + r) % ndev, &w->ranks[r].dev);
    }
    if ((rc = agree_start(w, rc, "opening its devices")) < 0) {
        free(comms);
        zs_world_free(w);
        return rc;
    }
    /* NCCL when every rank has a device of its own (ZS_COMM=local keeps the in-process
     * communicator); ranks that share a device gather through the local one. Across
     * processes: NCCL bootstrapped over MPI, or MPI itself over host buffers. */
    const char *cm = getenv("ZS_COMM");
    int nccl = cuda && w->size > 1 && zs_cluster_node_size() * w->n <= ndev && !(cm && !strcmp(cm, "local"));
    if (nccl) {
        int devs[256];
        for (int r = 0; r < w->n; r++) devs[r] = ((o->local ? 0 : zs_cluster_node_rank()) * w->n + r) % ndev;
        int nrc = procs > 1 ? zs_comm_nccl_create_cluster(w->n, devs, comms) : zs_comm_nccl_create(w->n, devs, comms);
        if (procs > 1 && (nrc = agree_start(w, nrc, "joining NCCL")) < 0) {
            free(comms);
            zs_world_free(w);
            return nrc;
        }
        if (nrc < 0) {
            zs_log_warn("NCCL unavailable (%s); ranks gather through the local communicator", zs_errmsg());
            nccl = 0;
        }
    }
    if (!nccl && cuda && procs > 1) {
        /* the MPI communicator moves host buffers; device buffers across processes need NCCL */
        free(comms);
        zs_world_free(w);
        return zs_err(ZS_EUNSUPPORTED, "several processes on GPUs need a GPU of its own for every rank (--ranks %d, "
                      "%d visible) and NCCL", o->ranks, ndev);
    }
    if (!nccl) rc = procs > 1 ? zs_comm_mpi_create(w->n, comms) : zs_comm_local_create(w->n, comms);
    for (int r = 0; r < w->n; r++) {
        w->ranks[r].w = w;
        w->ranks[r].rank = r;
        w->ranks[r].comm = rc == 0 ? comms[r] : NULL;
    }
    /* the gradient group: host buffers (the training's gradients come back to host memory, also
     * from a CUDA device: backward.h), in-process or over MPI */
    if (rc == 0) {
        rc = procs > 1 ? zs_comm_mpi_create(w->n, comms) : zs_comm_local_create(w->n, comms);
        for (int r = 0; r < w->n; r++) w->ranks[r].gcomm = rc == 0 ? comms[r] : NULL;
    }
    free(comms);
    if (rc == 0) rc = zs_model_load_resident_parts(m);
    if (rc == 0 && zs_model_embed_lookup(m))
        zs_log_info("embedding lookup: %.1f MB of tables in host memory (one copy for the %d rank(s) of this process)",
                    (double)zs_model_embed_table_bytes(m) / 1e6, w->n);
    const zs_model_config *c = zs_model_config_get(m);
    for (int r = 0; r < w->n && rc == 0; r++) {
        rank_t *R = &w->ranks[r];
        zs_gather_opts go = o->gather;
        go.dev = NULL;
        if (R->dev) {
            zs_dev_gather_ops(R->dev, &R->gops);
            go.dev = &R->gops;
        }
        rc = zs_gather_new(m, w->first + r, w->size, R->comm, &go, &R->g);
        if (rc == 0)
            rc = zs_kv_init_ex(c->n_layers, c->n_kv_heads * c->head_dim, o->kv_blocks, o->max_seqs, o->context,
                               o->kv_dtype, R->dev == NULL, &R->kv);
        if (rc == 0 && c->sliding_window > 0) { /* every layer windowed (Mistral, Phi-3): a ring per sequence */
            int all = 1;
            for (int l = 0; l < c->n_layers && all; l++) all = zs_config_layer_sliding(c, l);
            if (all) rc = zs_kv_set_window(R->kv, c->sliding_window, o->max_tokens);
        }
        if (rc == 0)
            rc = R->dev ? zs_forward_cuda_new(m, o->max_tokens, R->dev, R->kv, &R->cfwd)
                        : zs_forward_new(m, o->max_tokens, &R->fwd);
    }
    if (rc == 0) rc = o->gather.tier == ZS_OFFLOAD_NVME ? place_nvme(w) : place_memory(w);
    /* the NVMe tier keeps the checkpoint mapped to repair damaged shards */
    if (rc == 0 && o->gather.tier != ZS_OFFLOAD_NVME) zs_model_close_checkpoint(m);
    if ((rc = agree_start(w, rc, "placing its parameters")) < 0) goto fail;
    for (int r = 0; r < w->n && rc == 0; r++) rc = zs_gather_start(w->ranks[r].g);
    for (int r = 1; r < w->n && rc == 0; r++) {
        if (pthread_create(&w->ranks[r].th, NULL, rank_main, &w->ranks[r]) != 0)
            rc = zs_err(ZS_EIO, "cannot start rank thread %d", r);
        else w->ranks[r].started = 1;
    }
    if (rc < 0) goto fail;
    w->quit_sent = 0;
    w->running = 1;
    *out = w;
    return 0;
fail:
    zs_world_free(w);
    return rc;
}

void zs_world_free(zs_world *w) {
    if (!w) return;
    /* process 0 of a led world: the followers leave their loop */
    if (w->led && !w->quit_sent && !zs_cluster_follower() && !zs_cluster_lost(NULL, 0)) {
        w->quit_sent = 1;
        if (send_plan(w, PLAN_QUIT) < 0) zs_log_warn("could not tell the followers to stop: %s", zs_errmsg());
    }
    /* several processes: the prefetchers may be inside a speculative gather of the next pass;
     * ending speculation finishes that pass on every process alike, so that no collective is
     * left half done when the handles are aborted below */
    if (w->running && w->size > w->n && !zs_cluster_lost(NULL, 0)) zs_world_run(w, spec_off_job, w);
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    for (int r = 1; w->ranks && r < w->n; r++)
        if (w->ranks[r].started) pthread_join(w->ranks[r].th, NULL);
    /* stop every prefetch thread before any communicator handle goes away */
    for (int r = 0; w->ranks && r < w->n; r++)
        if (w->ranks[r].comm) zs_comm_abort(w->ranks[r].comm);
    for (int r = 0; w->ranks && r < w->n; r++) {
        zs_gather_free(w->ranks[r].g);
        zs_forward_free(w->ranks[r].fwd);
        zs_forward_cuda_free(w->ranks[r].cfwd);
        zs_kv_free(w->ranks[r].kv);
    }
    for (int r = 0; w->ranks && r < w->n; r++) {
        if (w->ranks[r].comm) zs_comm_free(w->ranks[r].comm);
        if (w->ranks[r].gcomm) zs_comm_free(w->ranks[r].gcomm);
    }
    for (int r = 0; w->ranks && r < w->n; r++) zs_dev_free(w->ranks[r].dev);
    free(w->ranks);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

void zs_world_stats(zs_world *w, zs_gather_stats *out) {
    memset(out, 0, sizeof *out);
    for (int r = 0; r < w->n; r++) {
        zs_gather_stats s;
        zs_gather_stats_get(w->ranks[r].g, &s);
        out->bytes_nvme += s.bytes_nvme;
        out->bytes_host += s.bytes_host;
        out->bytes_gathered += s.bytes_gathered;
        out->stall_s += s.stall_s;
        out->items += s.items;
        out->read_errors += s.read_errors;
        out->repairs += s.repairs;
        out->max_depth = ZS_MAX(out->max_depth, s.max_depth);
        out->live_bytes = ZS_MAX(out->live_bytes, s.live_bytes);
        out->max_live_bytes = ZS_MAX(out->max_live_bytes, s.max_live_bytes);
        out->live_limit = s.live_limit;
        /* experts: bytes summed like the rest; the decisions are the same on every rank */
        out->passes = ZS_MAX(out->passes, s.passes); /* every rank begins the same passes */
        out->passes_adopted = ZS_MAX(out->passes_adopted, s.passes_adopted);
        out->passes_wasted = ZS_MAX(out->passes_wasted, s.passes_wasted);
        out->expert_bytes += s.expert_bytes;
        out->expert_block_bytes += s.expert_block_bytes;
        out->expert_layers = ZS_MAX(out->expert_layers, s.expert_layers);
        out->expert_selected = ZS_MAX(out->expert_selected, s.expert_selected);
        out->expert_hits = ZS_MAX(out->expert_hits, s.expert_hits);
        out->expert_misses = ZS_MAX(out->expert_misses, s.expert_misses);
        out->expert_spec = ZS_MAX(out->expert_spec, s.expert_spec);
        out->expert_spec_used = ZS_MAX(out->expert_spec_used, s.expert_spec_used);
        out->expert_cache_used = ZS_MAX(out->expert_cache_used, s.expert_cache_used);
        out->expert_cache_limit = s.expert_cache_limit;
    }
}

void zs_world_reset_peaks(zs_world *w) {
    for (int r = 0; r < w->n; r++) zs_gather_stats_reset_peaks(w->ranks[r].g);
}

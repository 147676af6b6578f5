/* lora-train-impl.h — the insides of a LoRA training, shared by lora-train.c (set-up, evaluation,
 * checkpoints) and lora-slice.c (steps in slices: units of the training order, range passes, the
 * rider that carries a micro-batch's forward in serving steps). Not a public header. Everything
 * here belongs to the thread that drives the world, except what a rank's job writes in its own
 * lrank and what rank 0's job writes in the fields marked "rank 0". */
#ifndef ZS_LORA_TRAIN_IMPL_H
#define ZS_LORA_TRAIN_IMPL_H

#include "gather.h"
#include "lora-train.h"

/* floats of every rank's gradient all-gathered at once (per rank: GCHUNK / ranks) */
#define GCHUNK ((size_t)1 << 21)

typedef struct { double loss; int32_t rc, pad; } lt_stat;

typedef struct zs_lora_training zs_lora_training_t;
typedef struct {
    zs_lora_training_t *t;  /* its training */
    zs_trainer *tr;
    zs_weight_source src; /* the rank's gather source (the trainer reads a MoE layer's experts from it) */
    zs_lora *grad;   /* this rank's micro-batch gradient (the mean over its counted targets) */
    float *gbuf;     /* every rank's chunk of the gradient (all_gather) */
    lt_stat *stat;   /* every rank's {loss·count, status} of the micro-step */
    double loss;     /* this micro-step's loss */
    float floss;     /* the head's loss of the micro-batch in progress */
    int rc;
    char err[512];
    /* riding a serving step (lora-slice.c) */
    zs_weight_source inner; /* the step's gather source */
    int k;                  /* items of the serving pass released so far */
    const void *cur;        /* the data of the bucket acquired last */
    const void *head;       /* a tied head's bucket data (may be NULL: all resident), */
    int holding;            /* ... held until the embeddings come */
    int reached;            /* the first unit not done in this step */
    double ride_s;          /* seconds this rank computed for the rider in this step */
} lrank;

struct zs_lora_training {
    zs_world *w;
    zs_model *m;
    zs_lora *a;            /* the adapter (borrowed) */
    zs_train_opts o;
    uint64_t seed;
    int n, nl, first, tied, lookup;
    size_t np, chunk;      /* adapter parameters; floats per rank and all_gather */
    lrank *r;
    zs_lora *gsum;         /* the step's gradient: the mean over the step's counted targets */
    float *gclip, *mom, *var;
    int have_grad;
    /* the current job */
    const int32_t *const *tokens, *const *targets;
    int micro;
    long step, total_count;
    double loss_sum;
    int fail_rc;
    char fail_err[512];
    /* steps in slices (lora-slice.c) */
    const int *ord;        /* the training order (zs_gather_order: rank 0's; the same on every rank) */
    int n_ord, n_inf;      /* its length and its inference prefix's */
    int eb, hb;            /* the embedding and head buckets */
    int can_ride;          /* dense, CPU: a micro-batch's forward can ride serving steps */
    int in_step;           /* a step begun (zs_lora_training_step_begin) and not finished */
    int accum;             /* its micro-batches */
    int pos;               /* the current micro-batch's next item of the order (n_ord: all done) */
    zs_pass_range cur, nxt; /* the range pass being run and the one declared after it */
    int has_nxt;
    int infer_next;        /* nxt is the caller's inference pass, not a promise of this training */
    zs_pass_range decl;    /* a range promised as the next pass (declared to the gathers) */
    int has_decl;
    double u_fwd, u_bwd;   /* measured seconds per forward / backward unit (0: none yet) */
    double rank0_fwd, rank0_bwd; /* rank 0: this range's seconds in forward / backward units */
    int rank0_nf, rank0_nb;      /* rank 0: units of each */
    zs_world_rider rider;  /* carries units [ride_from, ride_to) in one serving step */
    int ride_from, ride_to;
    int riding;            /* a rider is out (zs_lora_training_rider .. _ride_end) */
    uint64_t *bucket_bytes; /* each bucket's full bytes as partitioned (what a pass reads of it) */
    uint64_t pass_bytes;   /* rank 0: the bytes of the buckets of the range passes run */
    float step_loss;       /* the finished step's loss */
};

/* lora-slice.c (lora-train.c calls it, never the other way): the order and what can ride, at
 * begin; every rank's status and loss·count of a micro-batch (an all_gather on the gradient
 * communicator), summed by rank 0 into loss_sum, the first failure into fail_rc/err. */
void zs_lora_share_status(struct zs_lora_training *t, lrank *R, int rank);
int zs_lora_slice_init(struct zs_lora_training *t);

#endif

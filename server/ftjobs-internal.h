/* ftjobs-internal.h — what the fine-tuning job routes (ftjobs.c) and the job runner (ftrun.c)
 * share: the job table and its records (ftjobs-table.c), a job's "lora" object (ftjobs-lora.c).
 * Not a public interface. Dependencies run one way: ftjobs.c -> ftrun.c -> ftjobs-table.c and
 * ftjobs-lora.c (which ftjobs.c uses too).
 *
 * Locking: zs_ftjobs.mu guards the job table, every job's json object and events, the served
 * fine-tuned models list and the runner's flags. Engine/scheduler/training calls and file
 * writes of the runner are made without it, except the record writes (small, atomic). */
#ifndef ZS_FTJOBS_INTERNAL_H
#define ZS_FTJOBS_INTERNAL_H

#include <pthread.h>

#include "finetune-api.h"

#define FT_BASE_LR 1e-3 /* lr = FT_BASE_LR x learning_rate_multiplier */
/* "lora" absent from a job: LoRA when the base has at least this many parameters or stores
 * quantized weights (which a full fine-tune refuses), a full fine-tune otherwise */
#define FT_LORA_DEFAULT_PARAMS 100000000ull

/* A job's "lora" object {"r", "alpha", "dropout", "target_modules": the names of the targets'
 * bits}, a new reference (ftjobs-lora.c). */
json_t *zs_ftjobs_lora_json(int r, double alpha, double dropout, unsigned targets);
/* The default LoRA of a job ({"r":16,"alpha":32,"dropout":0,"target_modules":[the base's default: all seven, or
 * q, k, v, o on a mixture of experts]}),
 * a new reference (ftjobs-lora.c). */
json_t *zs_ftjobs_lora_default(zs_engine *base); /* base NULL: every target */
/* The "lora" a job gets when the request has none: zs_ftjobs_lora_default() or null, by the base
 * (FT_LORA_DEFAULT_PARAMS); a new reference (ftjobs-lora.c). */
json_t *zs_ftjobs_lora_auto(zs_engine *base);

typedef struct ftjob {
    char id[64];
    /* the tenant that created the job ("" without keys; "_owner" in the record) and whether its
     * model is served to every tenant ("shared" in obj too): both set at creation, immutable */
    char owner[ZS_TENANT_MAX];
    int shared;
    json_t *obj;    /* the OpenAI job object (status, hyperparameters, ...) */
    json_t *events; /* event objects, oldest first */
    long n_events;  /* event ids */
    int cancel;     /* cancel requested (status already "cancelled") */
    struct ftjob *next;
} ftjob;

typedef struct ftmodel { /* a served fine-tuned model */
    zs_engine *engine;
    zs_sched *sched;
    struct ftmodel *next;
} ftmodel;

struct zs_ftjobs {
    char *data_dir, *jobs_dir, *models_dir, *base_name, *base_dir, *nvme_path;
    zs_engine_opts engine;
    zs_sched_opts sched;
    zs_zero_opts train; /* the --config's training keys (zs_zero_opts_init when none) */
    zs_api *api;
    zs_files *files;
    zs_engine *base_engine; /* the served base (zs_ftjobs_start; LoRA jobs train on it) */
    zs_sched *base_sched;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ftjob *jobs; /* newest first */
    ftmodel *models;
    pthread_t runner;
    int runner_started, stopping;
};

/* (mu held) */
ftjob *zs_ftjobs_find_locked(zs_ftjobs *J, const char *id);
/* The owner of the job's fine-tuned model for zs_api_add_model / zs_api_load_adapter: the job's
 * tenant, or NULL (every tenant) for a shared job or one made without keys. */
const char *zs_ftjobs_model_owner(const ftjob *j);
/* Sets status (and finished_at for a final one), appends a status event and writes the record
 * (mu held). */
void zs_ftjobs_set_status_locked(zs_ftjobs *J, ftjob *j, const char *status, const char *msg);
/* Appends an event (data may be NULL; its reference is stolen) and to the events file (mu held). */
void zs_ftjobs_event_locked(zs_ftjobs *J, ftjob *j, const char *level, const char *msg, json_t *data);
/* Writes the job's record (mu held). */
void zs_ftjobs_save_locked(zs_ftjobs *J, ftjob *j);
/* The directory of a fine-tuned model. */
void zs_ftjobs_model_dir(zs_ftjobs *J, const char *name, char *out, size_t cap);
/* The job's checkpoint directory: <jobs dir>/<id>.checkpoints. */
void zs_ftjobs_ckpt_dir(zs_ftjobs *J, const ftjob *j, char *out, size_t cap);
#endif

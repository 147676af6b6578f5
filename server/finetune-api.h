/* finetune-api.h — fine-tuning over HTTP in the OpenAI shape (DESIGN.md §5, §6): uploaded
 * training files (files.c: POST/GET /v1/files), fine-tuning jobs with their events and the job
 * runner that trains a separate copy of the base model (a full fine-tune) or a LoRA adapter over
 * the served base itself and serves the result without a restart (ftjobs.c, ftrun.c), and the
 * small persistence helpers they share (persist.c).
 *
 * Everything persists under a data directory: files/<id>.jsonl + files/<id>.json (metadata),
 * jobs/<id>.json (the job object, written atomically: tmp + fsync + rename) +
 * jobs/<id>.events.jsonl (appended), models/<fine-tuned model, sanitized>/ (exported weights, or
 * a LoRA job's PEFT adapter).
 *
 * Tenants (keys.h): with keys, a file, a job and the job's model belong to the caller's tenant
 * (files/<id>.json "owner", jobs/<id>.json "_owner"); other tenants get what an unknown id gets,
 * admins see all (zs_key_sees), a job's "shared": true serves its model to every tenant, and a
 * key file's jobs=N caps the tenant's queued and running jobs (429 jobs_limit).
 *
 * Ownership: zs_files and zs_ftjobs borrow the zs_http they register routes on and the zs_api
 * they add fine-tuned models to; zs_ftjobs owns the engines and schedulers of those models.
 * Thread-safety: route handlers run on the HTTP threads; zs_files_path is thread-safe; open,
 * start, stop and free are called by the server's lifecycle code only. */
#ifndef ZS_FINETUNE_API_H
#define ZS_FINETUNE_API_H

#include <jansson.h>
#include <stddef.h>

#include "api.h"

/* ------------------------------------------------------------------ persist.c */

/* mkdir -p (mode 0755). */
int zs_persist_mkdirs(const char *path);
/* Writes data to path atomically: path.tmp, fsync, rename, fsync of the directory. */
int zs_persist_write(const char *path, const void *data, size_t len);
int zs_persist_write_json(const char *path, const json_t *j);
/* Reads a whole file (NUL-terminated, malloc'd). */
int zs_persist_read(const char *path, char **out, size_t *len);
/* "file-" / "ftjob-" ... followed by 24 random hex digits. */
void zs_persist_new_id(const char *prefix, char *out, size_t cap);

/* ------------------------------------------------------------------ files.c */

typedef struct zs_files zs_files;

/* Loads the records under data_dir/files and registers POST /v1/files, GET /v1/files and
 * GET /v1/files/{id}. Uploads larger than max_bytes (0 = 100 MiB; the HTTP body limit applies
 * too) get 413. */
int  zs_files_open(zs_http *h, const char *data_dir, size_t max_bytes, zs_files **out);
/* The path of an uploaded file's content; ZS_ENOTFOUND for an unknown id and for a file that who
 * does not see (another tenant's; who NULL: every file, keys.h's zs_key_sees). */
int  zs_files_path(zs_files *f, const char *id, const zs_key_id *who, char *path, size_t cap);
void zs_files_free(zs_files *f); /* after zs_http_stop */

/* ------------------------------------------------------------------ ftjobs.c / ftrun.c */

typedef struct {
    const char *data_dir;
    const char *base_name;        /* the served base model's id */
    const char *base_dir;         /* its directory */
    const zs_engine_opts *engine; /* the server's engine options (copied; model_dir replaced) */
    const zs_sched_opts *sched;   /* for the fine-tuned models' schedulers */
    zs_api *api;
    zs_files *files;
    const zs_zero_opts *train_config; /* copied; NULL: none (see zs_server_opts) */
} zs_ftjobs_opts;

typedef struct zs_ftjobs zs_ftjobs;

/* Loads the job records under data_dir/jobs and registers the /v1/fine_tuning/jobs routes. Jobs
 * are accepted at once; they run after zs_ftjobs_start. */
int  zs_ftjobs_open(zs_http *h, const zs_ftjobs_opts *o, zs_ftjobs **out);
/* The base model is loaded (base_engine, served by base; both borrowed): serves the models and
 * LoRA adapters of succeeded jobs, re-queues the jobs a previous run left running, and starts
 * the runner thread. LoRA jobs train on base_engine itself, their steps run by base's engine
 * thread in slices under the job's share (zs_sched_run_work). */
int  zs_ftjobs_start(zs_ftjobs *j, zs_engine *base_engine, zs_sched *base);
/* Stops the runner (a running job stays "running" on disk and is re-queued at the next start)
 * and drains the fine-tuned models' schedulers for up to drain_s. Before zs_http_stop. */
void zs_ftjobs_stop(zs_ftjobs *j, double drain_s);
/* Frees the fine-tuned models' schedulers and engines; after zs_http_stop and before
 * zs_api_free. */
void zs_ftjobs_free(zs_ftjobs *j);

#endif

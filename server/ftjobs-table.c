/* ftjobs-table.c — the fine-tuning job table's records, shared by the routes (ftjobs.c) and the
 * runner (ftrun.c): lookup, status changes, events (appended to jobs/<id>.events.jsonl) and the
 * job record (jobs/<id>.json, written atomically, with the job's owner), and the directories of a job's checkpoints
 * and of a fine-tuned model. Every call here is made with zs_ftjobs.mu held. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "ftjobs-internal.h"

ftjob *zs_ftjobs_find_locked(zs_ftjobs *J, const char *id) {
    for (ftjob *j = J->jobs; j; j = j->next)
        if (id && !strcmp(j->id, id)) return j;
    return NULL;
}

const char *zs_ftjobs_model_owner(const ftjob *j) { return j->shared || !j->owner[0] ? NULL : j->owner; }

void zs_ftjobs_save_locked(zs_ftjobs *J, ftjob *j) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.json", J->jobs_dir, j->id);
    if (zs_persist_mkdirs(J->jobs_dir) < 0) zs_log_error("fine-tuning: %s", zs_errmsg());
    json_t *rec = json_deep_copy(j->obj);
    json_object_set_new(rec, "_n_events", json_integer(j->n_events));
    if (j->owner[0]) json_object_set_new(rec, "_owner", json_string(j->owner));
    if (zs_persist_write_json(path, rec) < 0) zs_log_error("fine-tuning: cannot save %s: %s", j->id, zs_errmsg());
    json_decref(rec);
}

void zs_ftjobs_event_locked(zs_ftjobs *J, ftjob *j, const char *level, const char *msg, json_t *data) {
    char id[96];
    snprintf(id, sizeof id, "ftevent-%s-%ld", j->id + 6, ++j->n_events);
    json_t *ev = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o,s:s}", "object", "fine_tuning.job.event", "id", id, "created_at",
                           (json_int_t)time(NULL), "level", level, "message", msg, "data",
                           data ? data : json_object(), "type", data ? "metrics" : "message");
    if (!ev) return;
    json_array_append(j->events, ev);
    zs_persist_mkdirs(J->jobs_dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.events.jsonl", J->jobs_dir, j->id);
    FILE *f = fopen(path, "a");
    if (f) {
        char *s = json_dumps(ev, JSON_COMPACT);
        if (s) fprintf(f, "%s\n", s);
        free(s);
        fclose(f);
    }
    json_decref(ev);
}

void zs_ftjobs_set_status_locked(zs_ftjobs *J, ftjob *j, const char *status, const char *msg) {
    json_object_set_new(j->obj, "status", json_string(status));
    if (!strcmp(status, "succeeded") || !strcmp(status, "failed") || !strcmp(status, "cancelled"))
        json_object_set_new(j->obj, "finished_at", json_integer((json_int_t)time(NULL)));
    zs_ftjobs_event_locked(J, j, !strcmp(status, "failed") ? "error" : "info", msg, NULL);
    zs_ftjobs_save_locked(J, j);
    pthread_cond_broadcast(&J->cv);
}

void zs_ftjobs_model_dir(zs_ftjobs *J, const char *name, char *out, size_t cap) {
    char s[256];
    size_t n = 0;
    for (const char *p = name; *p && n + 1 < sizeof s; p++) {
        int ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                 *p == '_' || (*p == '.' && n > 0);
        s[n] = ok ? *p : '_';
        n++;
    }
    s[n] = '\0';
    snprintf(out, cap, "%s/%s", J->models_dir, s);
}

void zs_ftjobs_ckpt_dir(zs_ftjobs *J, const ftjob *j, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s.checkpoints", J->jobs_dir, j->id);
}


/* ftjobs.c — fine-tuning jobs in the OpenAI shape (POST/GET /v1/fine_tuning/jobs, GET
 * /v1/fine_tuning/jobs/{id}, POST .../{id}/cancel, GET .../{id}/events, GET
 * .../{id}/checkpoints): validation of the request, the job table, its persistence
 * (jobs/<id>.json written atomically on every status change, jobs/<id>.events.jsonl appended)
 * and reloading at start-up. The job records (find, status, events, paths) are
 * ftjobs-table.c, a job's "lora" object and its defaults ftjobs-lora.c; the runner that trains
 * is ftrun.c.
 *
 * Hyperparameters: n_epochs (1..10000, "auto" = 3), batch_size (sequences per rank and step,
 * 1..256, "auto" = 2), learning_rate_multiplier (> 0 and <= 100, "auto" = 1): the LR is
 * FT_BASE_LR (1e-3) x the multiplier, constant, AdamW, clip 1.0. They are given in OpenAI's
 * current shape, method: {type: "supervised", supervised: {hyperparameters: {...}}}, or in the
 * older top-level "hyperparameters" (both given with different values: 400; another method type,
 * "dpo" or "reinforcement": 400 naming it). The job records both shapes, resolved.
 *
 * The extension "lora": {r, alpha, dropout, target_modules} trains a LoRA adapter over the served
 * base (defaults r 16, alpha 32, dropout 0, all seven projections; target_modules are PEFT's
 * names, with or without "_proj", or "all-linear"; unknown keys and bad values are 400s naming
 * them); "lora": null is a full fine-tune of a copy of the base; without the key the base decides:
 * LoRA when it has at least 100M parameters or stores quantized weights (which a full fine-tune
 * refuses), full otherwise (decided when the job starts if the base is still loading at creation:
 * "lora": "auto" until then). The job records the choice ("lora": {...} or null).
 *
 * The extensions "priority" ("low" | "normal" | "high", default normal) and "train_share" (a
 * number in (0, 1]) set the job's share of the engine's time while requests are served too;
 * the job records both, "train_share" resolved: explicit, else the server's --train-share F by
 * priority (low F/2, normal F, high min(1, 2F)). Records from before them load as normal, F.
 *
 * Tenants (keys.h): a job belongs to the tenant of the key that created it (the record's "_owner",
 * shown as "owner" to admins only). Another tenant gets what an unknown id gets (404, and its
 * training_file is no uploaded file); admins see every job. Its fine-tuned model is served to its
 * tenant (and admins) only, unless the job was created with the extension "shared": true (a
 * boolean; the job records it). A tenant whose key file limit jobs=N already has N jobs queued or
 * running gets 429 jobs_limit with Retry-After. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cluster.h"
#include "common.h"
#include "engine.h"
#include "ftjobs-internal.h"
#include "ftrun.h"
#include "lora.h"

static const char *status_of(const ftjob *j) { return json_string_value(json_object_get(j->obj, "status")); }

/* ------------------------------------------------------------------ create */

static int hp_value(json_t *hp, const char *prefix, const char *key, double lo, double hi, double dflt, int integer,
                    double *out, zs_http_req *r) {
    json_t *v = hp ? json_object_get(hp, key) : NULL;
    *out = dflt;
    if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), "auto"))) return 0;
    double x = json_is_number(v) ? json_number_value(v) : -1e300;
    if (x < lo || x > hi || (integer && !json_is_integer(v))) {
        char param[96];
        snprintf(param, sizeof param, "%s.%s", prefix, key);
        zs_http_respond_error(r, 400, "invalid_request_error", param, "invalid_value",
                              "Invalid '%s': expected %s between %g and %g, or \"auto\".", param,
                              integer ? "an integer" : "a number", lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int opt_string(json_t *root, const char *key, size_t max, const char **out, zs_http_req *r) {
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || json_string_length(v) > max) {
        zs_http_respond_error(r, 400, "invalid_request_error", key, "invalid_type",
                              "Invalid '%s': expected a string of at most %zu characters.", key, max);
        return -1;
    }
    *out = json_string_value(v);
    return 0;
}

static int bad_param(zs_http_req *r, const char *param, const char *code, const char *msg) {
    zs_http_respond_error(r, 400, "invalid_request_error", param, code, "%s", msg);
    return -1;
}

/* Every key of o is one of known (NULL-terminated); else 400 naming prefix.key (key at the top, prefix ""). */
static int known_keys(json_t *o, const char *prefix, const char *const *known, zs_http_req *r) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
        if (!ok) {
            char param[128], msg[400];
            snprintf(param, sizeof param, "%s%s%s", prefix, *prefix ? "." : "", k);
            int n = snprintf(msg, sizeof msg, "Unrecognized argument '%s' (expected", param);
            for (int i = 0; known[i] && n > 0 && (size_t)n < sizeof msg; i++)
                n += snprintf(msg + n, sizeof msg - (size_t)n, "%s %s", i ? "," : "", known[i]);
            if (n > 0 && (size_t)n < sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, ").");
            return bad_param(r, param, "unknown_parameter", msg);
        }
    }
    return 0;
}

/* The three hyperparameters of hp (an object or NULL) under the name prefix. */
static int hp_all(json_t *hp, const char *prefix, double *ep, double *bs, double *lrm, zs_http_req *r) {
    static const char *const keys[] = {"n_epochs", "batch_size", "learning_rate_multiplier", NULL};
    if (hp && known_keys(hp, prefix, keys, r) < 0) return -1;
    if (hp_value(hp, prefix, "n_epochs", 1, 10000, 3, 1, ep, r) < 0 || hp_value(hp, prefix, "batch_size", 1, 256, 2, 1, bs, r) < 0 ||
        hp_value(hp, prefix, "learning_rate_multiplier", 1e-6, 100, 1, 0, lrm, r) < 0)
        return -1;
    return 0;
}

/* method: {type: "supervised", supervised: {hyperparameters: {...}}}: *mhp = its hyperparameters
 * object (or NULL). */
static int parse_method(json_t *method, json_t **mhp, zs_http_req *r) {
    *mhp = NULL;
    if (!method || json_is_null(method)) return 0;
    if (!json_is_object(method)) return bad_param(r, "method", "invalid_type", "Invalid 'method': expected an object.");
    json_t *type = json_object_get(method, "type");
    if (!type || json_is_null(type))
        return bad_param(r, "method.type", "missing_required_parameter", "Missing required parameter: 'method.type'.");
    if (!json_is_string(type)) return bad_param(r, "method.type", "invalid_type", "Invalid 'method.type': expected a string.");
    if (strcmp(json_string_value(type), "supervised")) {
        char msg[300];
        snprintf(msg, sizeof msg, "The fine-tuning method '%.100s' is not supported by this server; only \"supervised\" is "
                 "(\"dpo\" and \"reinforcement\" are not).", json_string_value(type));
        return bad_param(r, "method.type", "unsupported_parameter", msg);
    }
    static const char *const mk[] = {"type", "supervised", NULL};
    if (known_keys(method, "method", mk, r) < 0) return -1;
    json_t *sup = json_object_get(method, "supervised");
    if (!sup || json_is_null(sup)) return 0;
    if (!json_is_object(sup))
        return bad_param(r, "method.supervised", "invalid_type", "Invalid 'method.supervised': expected an object.");
    static const char *const sk[] = {"hyperparameters", NULL};
    if (known_keys(sup, "method.supervised", sk, r) < 0) return -1;
    json_t *hp = json_object_get(sup, "hyperparameters");
    if (!hp || json_is_null(hp)) return 0;
    if (!json_is_object(hp))
        return bad_param(r, "method.supervised.hyperparameters", "invalid_type",
                         "Invalid 'method.supervised.hyperparameters': expected an object.");
    *mhp = hp; /* its keys are checked by hp_all */
    return 0;
}

/* A target module name: PEFT's (q_proj ...) or without "_proj" (q ...); -1 for another. */
static int target_of(const char *name) {
    for (int t = 0; t < ZS_LORA_NT; t++) {
        const char *full = zs_lora_target_name(t);
        size_t n = strlen(full) - 5; /* without "_proj" */
        if (!strcmp(name, full) || (strlen(name) == n && !strncmp(name, full, n))) return t;
    }
    return -1;
}

/* "lora": {r, alpha, dropout, target_modules} -> *out, the normalized object (new reference); base
 * (NULL while it loads) gives the default targets and refuses those it cannot take. */
static int parse_lora(json_t *lv, json_t **out, zs_http_req *r, zs_engine *base) {
    const zs_model_config *bc = base ? zs_model_config_get(zs_engine_model(base)) : NULL;
    *out = NULL;
    if (!json_is_object(lv))
        return bad_param(r, "lora", "invalid_type",
                         "Invalid 'lora': expected an object {r, alpha, dropout, target_modules} or null (a full fine-tune).");
    static const char *const lk[] = {"r", "alpha", "dropout", "target_modules", NULL};
    if (known_keys(lv, "lora", lk, r) < 0) return -1;
    json_t *v = json_object_get(lv, "r");
    long long rank = 16;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4096)
            return bad_param(r, "lora.r", "invalid_value", "Invalid 'lora.r': expected an integer between 1 and 4096.");
        rank = json_integer_value(v);
    }
    double alpha = 32, dropout = 0;
    v = json_object_get(lv, "alpha");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1e6)
            return bad_param(r, "lora.alpha", "invalid_value", "Invalid 'lora.alpha': expected a number > 0 (at most 1e6).");
        alpha = json_number_value(v);
    }
    v = json_object_get(lv, "dropout");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0) || !(json_number_value(v) < 1))
            return bad_param(r, "lora.dropout", "invalid_value", "Invalid 'lora.dropout': expected a number >= 0 and < 1.");
        dropout = json_number_value(v);
    }
    unsigned targets = bc ? zs_lora_default_targets(bc) : ZS_LORA_ALL;
    v = json_object_get(lv, "target_modules");
    if (v && !json_is_null(v)) {
        if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
            targets = ZS_LORA_ALL;
        } else if (json_is_array(v) && json_array_size(v) > 0) {
            targets = 0;
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                int t = json_is_string(x) ? target_of(json_string_value(x)) : -1;
                if (json_is_string(x) && !strcmp(json_string_value(x), "all-linear")) {
                    targets = ZS_LORA_ALL;
                    continue;
                }
                if (t < 0) {
                    char param[64], msg[400];
                    snprintf(param, sizeof param, "lora.target_modules[%zu]", i);
                    snprintf(msg, sizeof msg, "Invalid '%s'%s%.100s%s: the target modules are q_proj, k_proj, v_proj, "
                             "o_proj, gate_proj, up_proj, down_proj (with or without \"_proj\") or \"all-linear\".",
                             param, json_is_string(x) ? " '" : "", json_is_string(x) ? json_string_value(x) : "",
                             json_is_string(x) ? "'" : " (not a string)");
                    return bad_param(r, param, "invalid_value", msg);
                }
                targets |= 1u << t;
            }
        } else {
            return bad_param(r, "lora.target_modules", "invalid_value",
                             "Invalid 'lora.target_modules': expected a non-empty list of module names or \"all-linear\".");
        }
    }
    if (bc && zs_lora_check_targets(bc, targets) < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "Invalid 'lora.target_modules': %s.", zs_errmsg());
        return bad_param(r, "lora.target_modules", "invalid_value", msg);
    }
    *out = zs_ftjobs_lora_json((int)rank, alpha, dropout, targets);
    return *out ? 0 : bad_param(r, "lora", "invalid_value", "out of memory");
}

/* The share of the engine's time a job trains with while requests are served too: F (the
 * server's --train-share) by priority, low F/2, normal F, high min(1, 2F). */
static double share_of_priority(const zs_ftjobs *J, const char *prio) {
    double f = J->sched.train_share;
    if (!strcmp(prio, "low")) return f / 2;
    if (!strcmp(prio, "high")) return f * 2 < 1 ? f * 2 : 1;
    return f;
}

/* "priority": "low" | "normal" | "high" (default normal) and "train_share": a number in (0, 1]
 * (default: by the priority) -> *prio, *share. */
static int parse_share(const zs_ftjobs *J, json_t *root, const char **prio, double *share, zs_http_req *r) {
    json_t *v = json_object_get(root, "priority");
    *prio = "normal";
    if (v && !json_is_null(v)) {
        const char *p = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(p, "low") && strcmp(p, "normal") && strcmp(p, "high"))
            return bad_param(r, "priority", "invalid_value",
                             "Invalid 'priority': expected \"low\", \"normal\" or \"high\" (the job's share of the "
                             "engine's time while requests are served: half, once or twice the server's --train-share).");
        *prio = p;
    }
    *share = share_of_priority(J, *prio);
    v = json_object_get(root, "train_share");
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !(json_number_value(v) <= 1))
            return bad_param(r, "train_share", "invalid_value",
                             "Invalid 'train_share': expected a number > 0 and at most 1 (the job's share of the "
                             "engine's time while requests are served).");
        *share = json_number_value(v);
    }
    return 0;
}

/* The jobs of tenant queued or running (validating_files counts: it becomes queued at once) (mu
 * held). */
static long active_jobs_locked(zs_ftjobs *J, const char *tenant) {
    long n = 0;
    for (ftjob *j = J->jobs; j; j = j->next) {
        const char *st = status_of(j);
        if (!strcmp(j->owner, tenant) &&
            (!strcmp(st, "queued") || !strcmp(st, "running") || !strcmp(st, "validating_files")))
            n++;
    }
    return n;
}

/* The job object as who gets it: with "owner" for admins only (a new reference; mu held). */
static json_t *view(const ftjob *j, const zs_key_id *who) {
    json_t *c = json_deep_copy(j->obj);
    if (c && who && who->role == ZS_ROLE_ADMIN && j->owner[0]) json_object_set_new(c, "owner", json_string(j->owner));
    return c;
}

/* The job the request's {id} names, when its caller sees it (mu held). */
static ftjob *find_for_locked(zs_ftjobs *J, zs_http_req *r) {
    ftjob *j = zs_ftjobs_find_locked(J, zs_http_req_param(r));
    return j && zs_key_sees(zs_http_req_who(r), j->owner) ? j : NULL;
}

static void h_create(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    if (zs_cluster_size() > 1) {
        /* a job trains its own copy of the model in its own world, which the followers of a
         * multi-process world would have to open with it */
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, "multi_process_world",
                              "Fine-tuning jobs need a single-process server; this one is a world of %d processes "
                              "(mpirun). Train with `mpirun -np %d zeroserve train ...` and serve the result.",
                              zs_cluster_size(), zs_cluster_size());
        return;
    }
    size_t len;
    const char *body = zs_http_req_body(r, &len);
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root) {
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, NULL,
                              "We could not parse the JSON body of your request: %s (line %d, column %d).", je.text,
                              je.line, je.column);
        return;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, NULL, "The body must be a JSON object.");
        return;
    }
    static const char *const known[] = {"model", "training_file", "validation_file", "suffix", "seed", "hyperparameters",
                                        "method", "lora", "shared", "priority", "train_share", NULL};
    if (known_keys(root, "", known, r) < 0) { /* nothing accepted and then ignored */
        json_decref(root);
        return;
    }
    const char *model, *tf, *vf, *suffix;
    double ep, bs, lrm, seed = 0;
    json_t *hp = json_object_get(root, "hyperparameters"), *mhp = NULL, *lora = NULL;
    char tpath[4096];
    if (opt_string(root, "model", 200, &model, r) < 0 || opt_string(root, "training_file", 100, &tf, r) < 0 ||
        opt_string(root, "validation_file", 100, &vf, r) < 0 || opt_string(root, "suffix", 64, &suffix, r) < 0)
        goto out;
    if (!model || !tf) {
        zs_http_respond_error(r, 400, "invalid_request_error", model ? "training_file" : "model",
                              "missing_required_parameter", "Missing required parameter: '%s'.",
                              model ? "training_file" : "model");
        goto out;
    }
    if (strcmp(model, J->base_name)) {
        zs_http_respond_error(r, 404, "invalid_request_error", "model", "model_not_found",
                              "The model '%s' cannot be fine-tuned here; this server fine-tunes '%s'.", model,
                              J->base_name);
        goto out;
    }
    const zs_key_id *who = zs_http_req_who(r);
    if (zs_files_path(J->files, tf, who, tpath, sizeof tpath) < 0) {
        zs_http_respond_error(r, 400, "invalid_request_error", "training_file", "invalid_file_id",
                              "Invalid 'training_file': no uploaded file has the id '%s'.", tf);
        goto out;
    }
    if (vf && zs_files_path(J->files, vf, who, tpath, sizeof tpath) < 0) {
        zs_http_respond_error(r, 400, "invalid_request_error", "validation_file", "invalid_file_id",
                              "Invalid 'validation_file': no uploaded file has the id '%s'.", vf);
        goto out;
    }
    if (hp && !json_is_null(hp) && !json_is_object(hp)) {
        zs_http_respond_error(r, 400, "invalid_request_error", "hyperparameters", "invalid_type",
                              "Invalid 'hyperparameters': expected an object.");
        goto out;
    }
    if (suffix) {
        for (const char *p = suffix; *p; p++)
            if (*p == ':' || *p == '/' || (unsigned char)*p < 0x20) {
                zs_http_respond_error(r, 400, "invalid_request_error", "suffix", "invalid_value",
                                      "Invalid 'suffix': it must not contain ':', '/' or control characters.");
                goto out;
            }
    }
    json_t *sv = json_object_get(root, "seed");
    if (sv && !json_is_null(sv)) {
        if (!json_is_integer(sv) || json_integer_value(sv) < 0 || json_integer_value(sv) > 2147483647) {
            zs_http_respond_error(r, 400, "invalid_request_error", "seed", "invalid_value",
                                  "Invalid 'seed': expected an integer between 0 and 2147483647.");
            goto out;
        }
        seed = (double)json_integer_value(sv);
    }
    json_t *shv = json_object_get(root, "shared");
    if (shv && !json_is_null(shv) && !json_is_boolean(shv)) {
        bad_param(r, "shared", "invalid_type",
                  "Invalid 'shared': expected true or false (true: the job's fine-tuned model is served to every "
                  "tenant, not only to the job's).");
        goto out;
    }
    const char *prio = NULL;
    double share = -1;
    if (parse_share(J, root, &prio, &share, r) < 0) goto out;
    if (parse_method(json_object_get(root, "method"), &mhp, r) < 0) goto out;
    if (hp_all(hp && json_is_object(hp) ? hp : NULL, "hyperparameters", &ep, &bs, &lrm, r) < 0) goto out;
    if (mhp) {
        double e2, b2, l2;
        if (hp_all(mhp, "method.supervised.hyperparameters", &e2, &b2, &l2, r) < 0) goto out;
        if (hp && json_is_object(hp) && (e2 != ep || b2 != bs || l2 != lrm)) {
            bad_param(r, "method.supervised.hyperparameters", "invalid_value",
                      "'hyperparameters' and 'method.supervised.hyperparameters' are both given, with different values; "
                      "give one ('hyperparameters' is the older form).");
            goto out;
        }
        ep = e2, bs = b2, lrm = l2;
    }
    pthread_mutex_lock(&J->mu);
    zs_engine *base = J->base_engine;
    pthread_mutex_unlock(&J->mu);
    json_t *lv = json_object_get(root, "lora");
    if (!lv) {
        lora = base ? zs_ftjobs_lora_auto(base) : json_string("auto"); /* "auto": decided when the job starts */
    } else if (json_is_null(lv)) {
        if (base && zs_model_quant_dtype(zs_engine_model(base)) != ZS_DTYPE_COUNT) {
            bad_param(r, "lora", "invalid_value",
                      "A full fine-tune ('lora': null) needs a base with unquantized weights; this one stores quantized "
                      "weights: train a LoRA adapter (give 'lora' as an object, or leave it out).");
            goto out;
        }
        lora = json_null();
    } else if (parse_lora(lv, &lora, r, base) < 0) {
        goto out;
    }
    ftjob *j = calloc(1, sizeof *j);
    if (!j) {
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    zs_persist_new_id("ftjob-", j->id, sizeof j->id);
    snprintf(j->owner, sizeof j->owner, "%s", zs_key_owner(who));
    j->shared = json_is_true(shv);
    j->events = json_array();
    j->obj = json_pack("{s:s,s:s,s:s,s:I,s:n,s:n,s:s,s:{s:I,s:I,s:f},s:{s:s,s:{s:{s:I,s:I,s:f}}},s:O,s:s,s:o,s:[],"
                       "s:n,s:n,s:I,s:o,s:s,s:n}",
                       "id", j->id, "object", "fine_tuning.job", "model", model, "created_at",
                       (json_int_t)time(NULL), "finished_at", "fine_tuned_model", "organization_id", "org-local",
                       "hyperparameters", "n_epochs", (json_int_t)ep, "batch_size", (json_int_t)bs,
                       "learning_rate_multiplier", lrm, "method", "type", "supervised", "supervised",
                       "hyperparameters", "n_epochs", (json_int_t)ep, "batch_size", (json_int_t)bs,
                       "learning_rate_multiplier", lrm, "lora", lora, "training_file", tf, "validation_file",
                       vf ? json_string(vf) : json_null(), "result_files", "trained_tokens", "error", "seed",
                       (json_int_t)seed, "user_provided_suffix", suffix ? json_string(suffix) : json_null(),
                       "status", "validating_files", "estimated_finish");
    if (j->obj) { /* the share the runner trains with (ftrun.c); a record of what the job asked */
        json_object_set_new(j->obj, "priority", json_string(prio));
        json_object_set_new(j->obj, "train_share", json_real(share));
        json_object_set_new(j->obj, "shared", json_boolean(j->shared));
    }
    if (!j->obj || !j->events) {
        json_decref(j->obj);
        json_decref(j->events);
        free(j);
        zs_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    pthread_mutex_lock(&J->mu);
    long active = who ? active_jobs_locked(J, who->tenant) : 0;
    if (who && who->limits.jobs > 0 && active >= who->limits.jobs) {
        pthread_mutex_unlock(&J->mu);
        json_decref(j->obj);
        json_decref(j->events);
        free(j);
        zs_http_add_header(r, "Retry-After", "30");
        zs_http_respond_error(r, 429, "rate_limit_error", NULL, "jobs_limit",
                              "tenant '%s' has %ld fine-tuning jobs queued or running; its key file limit is jobs=%ld. "
                              "Retry once one of them has finished (or cancel one).",
                              who->tenant, active, who->limits.jobs);
        goto out;
    }
    j->next = J->jobs;
    J->jobs = j;
    char msg[256];
    snprintf(msg, sizeof msg, "Created fine-tuning job: %s", j->id);
    zs_ftjobs_event_locked(J, j, "info", msg, NULL);
    zs_ftjobs_save_locked(J, j);
    json_t *snap = view(j, who);
    /* the files were validated at upload: move on at once */
    zs_ftjobs_event_locked(J, j, "info", "Validating training file", NULL);
    zs_ftjobs_set_status_locked(J, j, "queued", "Files validated, moving job to queued state");
    zs_http_req_set_object(r, j->id);
    pthread_mutex_unlock(&J->mu);
    zs_http_respond_json(r, 200, snap);
out:
    json_decref(lora);
    json_decref(root);
}

/* ------------------------------------------------------------------ read / cancel */

static int limit_of(zs_http_req *r, int dflt, int *out) {
    const char *s = zs_http_req_query(r, "limit");
    *out = dflt;
    if (!s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > 10000) {
        zs_http_respond_error(r, 400, "invalid_request_error", "limit", "invalid_value",
                              "Invalid 'limit': expected an integer between 1 and 10000.");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static void h_list(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    int limit;
    if (limit_of(r, 20, &limit) < 0) return;
    const char *after = zs_http_req_query(r, "after");
    const zs_key_id *who = zs_http_req_who(r);
    json_t *data = json_array();
    int more = 0, skipping = after != NULL;
    pthread_mutex_lock(&J->mu);
    for (ftjob *j = J->jobs; j; j = j->next) { /* newest first */
        if (!zs_key_sees(who, j->owner)) continue; /* another tenant's: as if it did not exist */
        if (skipping) {
            if (!strcmp(j->id, after)) skipping = 0;
            continue;
        }
        if ((int)json_array_size(data) == limit) {
            more = 1;
            break;
        }
        json_array_append_new(data, view(j, who));
    }
    pthread_mutex_unlock(&J->mu);
    zs_http_respond_json(r, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", more));
}

static void not_found(zs_http_req *r, const char *id) {
    zs_http_respond_error(r, 404, "invalid_request_error", "fine_tune_id", "fine_tune_not_found",
                          "No fine-tuning job with the id '%s'.", id ? id : "");
}

static void h_get(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    pthread_mutex_lock(&J->mu);
    ftjob *j = find_for_locked(J, r);
    json_t *c = j ? view(j, zs_http_req_who(r)) : NULL;
    pthread_mutex_unlock(&J->mu);
    if (!c) return not_found(r, zs_http_req_param(r));
    zs_http_respond_json(r, 200, c);
}

static void h_cancel(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    pthread_mutex_lock(&J->mu);
    ftjob *j = find_for_locked(J, r);
    if (!j) {
        pthread_mutex_unlock(&J->mu);
        return not_found(r, zs_http_req_param(r));
    }
    const char *st = status_of(j);
    if (!strcmp(st, "succeeded") || !strcmp(st, "failed") || !strcmp(st, "cancelled")) {
        char s[32];
        snprintf(s, sizeof s, "%s", st);
        pthread_mutex_unlock(&J->mu);
        zs_http_respond_error(r, 400, "invalid_request_error", NULL, "job_not_cancellable",
                              "The job has already finished (status '%s').", s);
        return;
    }
    j->cancel = 1; /* a running job stops before its next step */
    zs_ftjobs_set_status_locked(J, j, "cancelled", "Job cancelled");
    json_t *c = view(j, zs_http_req_who(r));
    pthread_mutex_unlock(&J->mu);
    zs_http_respond_json(r, 200, c);
}

static void h_events(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    int limit;
    if (limit_of(r, 20, &limit) < 0) return;
    const char *after = zs_http_req_query(r, "after");
    pthread_mutex_lock(&J->mu);
    ftjob *j = find_for_locked(J, r);
    if (!j) {
        pthread_mutex_unlock(&J->mu);
        return not_found(r, zs_http_req_param(r));
    }
    json_t *data = json_array();
    int more = 0, skipping = after != NULL;
    for (size_t k = json_array_size(j->events); k-- > 0;) { /* newest first */
        json_t *ev = json_array_get(j->events, k);
        if (skipping) {
            if (!strcmp(json_string_value(json_object_get(ev, "id")), after)) skipping = 0;
            continue;
        }
        if ((int)json_array_size(data) == limit) {
            more = 1;
            break;
        }
        json_array_append_new(data, json_deep_copy(ev));
    }
    pthread_mutex_unlock(&J->mu);
    zs_http_respond_json(r, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", more));
}

/* The job's checkpoints (written every 10 steps and after the last; the two newest are kept),
 * newest first. */
static void h_checkpoints(void *ud, zs_http_req *r) {
    zs_ftjobs *J = ud;
    char dir[4200], ftm[512] = "";
    pthread_mutex_lock(&J->mu);
    ftjob *j = find_for_locked(J, r);
    if (j) {
        zs_ftjobs_ckpt_dir(J, j, dir, sizeof dir);
        const char *m = json_string_value(json_object_get(j->obj, "fine_tuned_model"));
        snprintf(ftm, sizeof ftm, "%s", m ? m : json_string_value(json_object_get(j->obj, "model")));
    }
    char id[128];
    snprintf(id, sizeof id, "%s", j ? j->id : "");
    pthread_mutex_unlock(&J->mu);
    if (!j) return not_found(r, zs_http_req_param(r));
    json_t *data = json_array();
    DIR *d = opendir(dir);
    long steps[64];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 64;) {
        long st;
        char tail;
        if (sscanf(e->d_name, "step-%ld%c", &st, &tail) == 1) steps[n++] = st;
    }
    if (d) closedir(d);
    for (int a = 0; a < n; a++) /* newest first */
        for (int b = a + 1; b < n; b++)
            if (steps[b] > steps[a]) { long x = steps[a]; steps[a] = steps[b]; steps[b] = x; }
    for (int i = 0; i < n; i++) {
        char cid[192], cm[640], p[4300];
        struct stat sb;
        snprintf(p, sizeof p, "%s/step-%06ld", dir, steps[i]);
        snprintf(cid, sizeof cid, "ftckpt-%s-%ld", id + 6, steps[i]);
        snprintf(cm, sizeof cm, "%s:ckpt-step-%ld", ftm, steps[i]);
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:I,s:{},s:s}", "object", "fine_tuning.job.checkpoint",
                                              "id", cid, "created_at", (json_int_t)(stat(p, &sb) == 0 ? sb.st_mtime : 0),
                                              "fine_tuned_model_checkpoint", cm, "step_number", (json_int_t)steps[i],
                                              "metrics", "fine_tuning_job_id", id));
    }
    json_t *first = n ? json_string(json_string_value(json_object_get(json_array_get(data, 0), "id"))) : json_null();
    json_t *last = n ? json_string(json_string_value(json_object_get(json_array_get(data, n - 1), "id"))) : json_null();
    zs_http_respond_json(r, 200, json_pack("{s:s,s:o,s:b,s:o,s:o}", "object", "list", "data", data, "has_more", 0,
                                           "first_id", first, "last_id", last));
}

/* ------------------------------------------------------------------ lifecycle */

static int by_created_desc(const void *a, const void *b) {
    const ftjob *x = *(ftjob *const *)a, *y = *(ftjob *const *)b;
    json_int_t cx = json_integer_value(json_object_get(x->obj, "created_at"));
    json_int_t cy = json_integer_value(json_object_get(y->obj, "created_at"));
    if (cx != cy) return cx > cy ? -1 : 1;
    return -strcmp(x->id, y->id);
}

static void load_events(zs_ftjobs *J, ftjob *j) {
    char path[4096], *buf = NULL;
    snprintf(path, sizeof path, "%s/%s.events.jsonl", J->jobs_dir, j->id);
    if (zs_persist_read(path, &buf, NULL) < 0) return;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *ev = json_loads(line, 0, NULL); /* a line cut by a crash does not parse: skipped */
        if (json_is_object(ev)) json_array_append(j->events, ev);
        json_decref(ev);
    }
    free(buf);
}

static int load_records(zs_ftjobs *J) {
    DIR *d = opendir(J->jobs_dir);
    if (!d) return 0; /* no job yet */
    ftjob *items[4096];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 4096) {
        size_t l = strlen(de->d_name);
        if (l < 7 || strcmp(de->d_name + l - 5, ".json") || strncmp(de->d_name, "ftjob-", 6) || l - 5 >= 64) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", J->jobs_dir, de->d_name);
        json_t *o = json_load_file(path, 0, NULL);
        ftjob *j = o ? calloc(1, sizeof *j) : NULL;
        if (!j || !json_is_string(json_object_get(o, "status"))) {
            json_decref(o);
            free(j);
            continue;
        }
        snprintf(j->id, sizeof j->id, "%.*s", (int)(l - 5), de->d_name);
        j->n_events = (long)json_integer_value(json_object_get(o, "_n_events"));
        json_object_del(o, "_n_events");
        const char *owner = json_string_value(json_object_get(o, "_owner"));
        snprintf(j->owner, sizeof j->owner, "%s", owner ? owner : ""); /* none: made without keys */
        json_object_del(o, "_owner");
        j->shared = json_is_true(json_object_get(o, "shared")); /* a record from before "shared": not shared */
        json_object_set_new(o, "shared", json_boolean(j->shared));
        j->obj = o;
        /* a record from before jobs had a priority: normal, at the server's share */
        if (!json_is_string(json_object_get(o, "priority"))) json_object_set_new(o, "priority", json_string("normal"));
        if (!json_is_number(json_object_get(o, "train_share")))
            json_object_set_new(o, "train_share", json_real(share_of_priority(J, json_string_value(json_object_get(o, "priority")))));
        j->events = json_array();
        load_events(J, j);
        if ((long)json_array_size(j->events) > j->n_events) j->n_events = (long)json_array_size(j->events);
        items[n++] = j;
    }
    closedir(d);
    qsort(items, n, sizeof *items, by_created_desc);
    for (size_t i = n; i-- > 0;) {
        items[i]->next = J->jobs;
        J->jobs = items[i];
    }
    return 0;
}

int zs_ftjobs_open(zs_http *h, const zs_ftjobs_opts *o, zs_ftjobs **out) {
    zs_ftjobs *J = calloc(1, sizeof *J);
    if (!J) return zs_err(ZS_ENOMEM, "out of memory");
    pthread_mutex_init(&J->mu, NULL);
    pthread_cond_init(&J->cv, NULL);
    J->engine = *o->engine;
    J->sched = *o->sched;
    zs_zero_opts_init(&J->train);
    if (o->train_config) J->train = *o->train_config;
    J->api = o->api;
    J->files = o->files;
    int rc = 0;
    if (asprintf(&J->jobs_dir, "%s/jobs", o->data_dir) < 0) J->jobs_dir = NULL;
    if (asprintf(&J->models_dir, "%s/models", o->data_dir) < 0) J->models_dir = NULL;
    J->data_dir = strdup(o->data_dir);
    J->base_name = strdup(o->base_name);
    J->base_dir = strdup(o->base_dir);
    if (!J->jobs_dir || !J->models_dir || !J->data_dir || !J->base_name || !J->base_dir)
        rc = zs_err(ZS_ENOMEM, "out of memory");
    J->engine.model_dir = J->base_dir;
    J->engine.nvme_path = NULL; /* with offload nvme each engine gets a shard directory of its own (ftrun.c) */
    if (o->engine->nvme_path && !(J->nvme_path = strdup(o->engine->nvme_path))) rc = zs_err(ZS_ENOMEM, "out of memory");
    if (!rc) rc = load_records(J); /* the directories are created by the first job */
    if (!rc) rc = zs_http_route(h, "POST", "/v1/fine_tuning/jobs", ZS_ROLE_FINETUNE, h_create, J);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/fine_tuning/jobs", ZS_ROLE_FINETUNE, h_list, J);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/fine_tuning/jobs/{id}", ZS_ROLE_FINETUNE, h_get, J);
    if (!rc) rc = zs_http_route(h, "POST", "/v1/fine_tuning/jobs/{id}/cancel", ZS_ROLE_FINETUNE, h_cancel, J);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/fine_tuning/jobs/{id}/events", ZS_ROLE_FINETUNE, h_events, J);
    if (!rc) rc = zs_http_route(h, "GET", "/v1/fine_tuning/jobs/{id}/checkpoints", ZS_ROLE_FINETUNE, h_checkpoints, J);
    if (rc < 0) {
        zs_ftjobs_free(J);
        return rc;
    }
    *out = J;
    return 0;
}

int zs_ftjobs_start(zs_ftjobs *J, zs_engine *base_engine, zs_sched *base) {
    if (zs_cluster_size() > 1) {
        zs_log_warn("fine-tuning: jobs and fine-tuned models are not served by a multi-process world; "
                    "the jobs under the data directory stay as they are");
        return 0;
    }
    pthread_mutex_lock(&J->mu);
    J->base_engine = base_engine;
    J->base_sched = base;
    ftjob *todo[4096];
    int n = 0;
    for (ftjob *j = J->jobs; j && n < 4096; j = j->next) todo[n++] = j;
    pthread_mutex_unlock(&J->mu);
    for (int i = n; i-- > 0;) { /* oldest first */
        ftjob *j = todo[i];
        pthread_mutex_lock(&J->mu);
        const char *st = status_of(j);
        const char *ftm = json_string_value(json_object_get(j->obj, "fine_tuned_model"));
        char name[256] = "";
        int is_lora = json_is_object(json_object_get(j->obj, "lora"));
        if (!strcmp(st, "succeeded") && ftm) snprintf(name, sizeof name, "%s", ftm);
        if (!strcmp(st, "running") || !strcmp(st, "validating_files"))
            zs_ftjobs_set_status_locked(J, j, "queued",
                                        "The server restarted while the job ran: re-queued; training continues "
                                        "from its latest checkpoint");
        pthread_mutex_unlock(&J->mu);
        if (name[0]) {
            char dir[4096];
            zs_ftjobs_model_dir(J, name, dir, sizeof dir);
            /* a LoRA job's model is its adapter, served over the base */
            const char *owner = zs_ftjobs_model_owner(j);
            if ((is_lora ? zs_api_load_adapter(J->api, name, owner, dir) : zs_ftjobs_serve_model(J, name, owner, dir)) < 0)
                zs_log_error("fine-tuning: cannot serve %s from %s: %s", name, dir, zs_errmsg());
        }
    }
    if (pthread_create(&J->runner, NULL, zs_ftjobs_runner_main, J) != 0)
        return zs_err(ZS_ENOMEM, "fine-tuning: cannot start the job runner");
    J->runner_started = 1;
    return 0;
}

void zs_ftjobs_stop(zs_ftjobs *J, double drain_s) {
    if (!J) return;
    pthread_mutex_lock(&J->mu);
    J->stopping = 1;
    pthread_cond_broadcast(&J->cv);
    pthread_mutex_unlock(&J->mu);
    if (J->runner_started) pthread_join(J->runner, NULL);
    J->runner_started = 0;
    for (ftmodel *m = J->models; m; m = m->next) zs_sched_drain(m->sched, drain_s);
}

void zs_ftjobs_free(zs_ftjobs *J) {
    if (!J) return;
    zs_ftjobs_stop(J, 0);
    for (ftmodel *m = J->models, *next; m; m = next) {
        next = m->next;
        zs_sched_free(m->sched);
        m->sched = NULL;
    }
    /* the engines outlive their schedulers' last callbacks */
    for (ftmodel *m = J->models, *next; m; m = next) {
        next = m->next;
        zs_engine_free(m->engine);
        free(m);
    }
    for (ftjob *j = J->jobs, *next; j; j = next) {
        next = j->next;
        json_decref(j->obj);
        json_decref(j->events);
        free(j);
    }
    free(J->data_dir);
    free(J->jobs_dir);
    free(J->models_dir);
    free(J->base_name);
    free(J->base_dir);
    free(J->nvme_path);
    pthread_mutex_destroy(&J->mu);
    pthread_cond_destroy(&J->cv);
    free(J);
}
